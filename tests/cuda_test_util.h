/* The GPU of the stand-alone CUDA test programs (test_smfree_cuda.c; test_ops's rows share theirs
 * through tests/ops/cuda_util.c) and the tensors of tests/cuda_tensors.h. Define SEED before
 * including; include after check.h, bf16_host.h, core.h, cuda_check.h, rng.h and ops/ops_cuda.h. */
#ifndef NB_CUDA_TEST_UTIL_H
#define NB_CUDA_TEST_UTIL_H

#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

#include "ops/backend.h"
#include "ops/ops_cuda.h"

static cudaStream_t st;         /* the stream the ops run on */
static nb_backend *inst;        /* the backend instance of GPU 0: its cuBLASLt handle serves the */
static nb_blas_t lt;            /* GEMM launchers, and task contexts point at it (ctx.backend) */
static uint64_t ot_stream = 1;  /* every random tensor draws from a stream of its own */

#include "cuda_tensors.h"

/* The first GPU and the ops' stream; 77 (skip, said on stdout) when there is no GPU. */
static inline int cuda_test_start(void) {
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        printf("skip: no CUDA device (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return 77;
    }
    struct cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s (sm_%d%d), %d SMs\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
    CUDA_CHECK(cudaStreamCreate(&st));
    inst = nb_backend_create("cuda", "");
    lt = inst->blas;
    return 0;
}

#endif
