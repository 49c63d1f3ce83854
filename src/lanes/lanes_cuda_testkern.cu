/* Kernels for the lanes tests (see lanes_cuda_testkern.h). */
#include <cuda_runtime.h>

#include "cuda_check.h"
#include "lanes/lanes_cuda_testkern.h"

static __device__ uint64_t global_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

static __device__ void spin_ns(uint64_t ns) {
    uint64_t t0 = global_ns();
    while (global_ns() - t0 < ns) {
    }
}

static __global__ void spin_kernel(uint64_t ns) { spin_ns(ns); }

static __global__ void store_kernel(int *dst, int value, uint64_t ns) {
    spin_ns(ns);
    *(volatile int *)dst = value;
}

static __global__ void copy_kernel(int *dst, const int *src) { *dst = *(const volatile int *)src; }

struct dag_deps {
    int d[4];
};

static __global__ void dag_kernel(uint64_t *values, int id, dag_deps deps, int ndeps, uint64_t seed,
                                  uint64_t ns) {
    spin_ns(ns);
    values[id] = nb_lanes_dag_step(values, id, deps.d, ndeps, seed);
}

extern "C" void nb_lanes_testkern_spin(void *stream, uint64_t ns) {
    spin_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(ns);
    CUDA_CHECK_LAUNCH("spin_kernel");
}

extern "C" void nb_lanes_testkern_store(void *stream, int *dst, int value, uint64_t ns) {
    store_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(dst, value, ns);
    CUDA_CHECK_LAUNCH("store_kernel");
}

extern "C" void nb_lanes_testkern_copy(void *stream, int *dst, const int *src) {
    copy_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(dst, src);
    CUDA_CHECK_LAUNCH("copy_kernel");
}

extern "C" void nb_lanes_testkern_dag(void *stream, uint64_t *values, int id, const int deps[4],
                                      int ndeps, uint64_t seed, uint64_t ns) {
    dag_deps d;
    for (int k = 0; k < 4; k++)
        d.d[k] = k < ndeps ? deps[k] : 0;
    dag_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(values, id, d, ndeps, seed, ns);
    CUDA_CHECK_LAUNCH("dag_kernel");
}
