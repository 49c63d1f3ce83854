/* Checks for CUDA runtime and cuBLAS(Lt) calls: a failure ends in nb_fail_at with the call's
 * text, the library's own error string, file:line, and a hint. Kernel launches are asynchronous,
 * so a fault inside a kernel surfaces at a later call; CUDA_LAUNCH_BLOCKING=1 pins it down.
 * Include only from code compiled with CUDA (nvcc, or C with -DNB_WITH_CUDA). */
#ifndef NB_CUDA_CHECK_H
#define NB_CUDA_CHECK_H

#include <cublasLt.h>
#include <cublas_api.h>
#include <cuda_runtime.h>

#include "core.h"

#define NB_CUDA_HINT                                                                               \
    "check that a GPU is visible (nvidia-smi) and has free memory; rerun with "                   \
    "CUDA_LAUNCH_BLOCKING=1 to find the kernel that failed"

#define CUDA_CHECK(call)                                                                           \
    do {                                                                                           \
        cudaError_t nb_err_ = (call);                                                              \
        if (nb_err_ != cudaSuccess)                                                                \
            nb_fail_at(__FILE__, __LINE__, NB_CUDA_HINT, "%s failed: %s (%s)", #call,             \
                       cudaGetErrorString(nb_err_), cudaGetErrorName(nb_err_));                    \
    } while (0)

/* After every kernel launch: catches bad launch configurations at once (and, via the sticky
 * error, earlier asynchronous faults). */
#define CUDA_CHECK_LAUNCH(what) CUDA_CHECK_NAMED(cudaGetLastError(), what)
#define CUDA_CHECK_NAMED(call, what)                                                               \
    do {                                                                                           \
        cudaError_t nb_err_ = (call);                                                              \
        if (nb_err_ != cudaSuccess)                                                                \
            nb_fail_at(__FILE__, __LINE__, NB_CUDA_HINT, "%s failed: %s (%s)", (what),            \
                       cudaGetErrorString(nb_err_), cudaGetErrorName(nb_err_));                    \
    } while (0)

#define CUBLAS_CHECK(call)                                                                         \
    do {                                                                                           \
        cublasStatus_t nb_st_ = (call);                                                            \
        if (nb_st_ != CUBLAS_STATUS_SUCCESS)                                                       \
            nb_fail_at(__FILE__, __LINE__,                                                         \
                       "an unsupported shape, dtype or alignment for cuBLASLt, or GPU memory "    \
                       "exhausted; rerun with CUBLASLT_LOG_LEVEL=2 for cuBLASLt's own reason",    \
                       "%s failed: %s (status %d)", #call, cublasLtGetStatusString(nb_st_),       \
                       (int)nb_st_);                                                               \
    } while (0)

#endif
