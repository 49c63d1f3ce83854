/* The GPU the cuda rows share (cuda_util.h): started once, before the first cuda row; without a
 * GPU (or built without CUDA) every cuda row is a SKIP. */
#include <stdio.h>

#include "optest.h"

#ifndef NB_WITH_CUDA
int ot_cuda_ready(const char **why) {
    *why = "built without CUDA";
    return 0;
}
#else
#include <cuda_runtime.h>

#include "core.h"
#include "cuda_check.h"
#include "lanes/lanes.h"
#include "ops/backend.h"
#include "ops/ops_cuda.h"

cudaStream_t st;
nb_backend *inst;
nb_blas_t lt;
nb_task_ctx ot_gctx, ot_cctx;

int ot_cuda_ready(const char **why) {
    static int state = -1; /* -1: not tried yet */
    static char reason[128];
    if (state < 0) {
        int ndev = 0;
        cudaError_t e = cudaGetDeviceCount(&ndev);
        if (e != cudaSuccess || ndev == 0) {
            snprintf(reason, sizeof reason, "no GPU: %s", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
            state = 0;
        } else {
            struct cudaDeviceProp prop;
            CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
            printf("device: %s (sm_%d%d), %d SMs\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
            CUDA_CHECK(cudaStreamCreate(&st));
            inst = nb_backend_create("cuda", "");
            lt = inst->blas;
            ot_gctx.stream = st;
            ot_gctx.backend = ot_cctx.backend = inst;
            state = 1;
        }
    }
    *why = reason;
    return state;
}
#endif
