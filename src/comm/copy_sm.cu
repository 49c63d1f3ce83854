/* The SM copy of copy_sm.h. The grid is as small as the caller asks (NCCL runs ~8-32 CTAs per
 * collective), so every CTA walks the buffer grid-stride; each thread keeps COPY_UNROLL 16-byte
 * loads in flight before its first store, which is what lets a few CTAs approach memory
 * bandwidth. Each CTA occupies an SM's threads and registers for the whole copy: that is the
 * compute a GEMM beside it loses. */
#include <stdint.h>

#include "comm/copy_sm.h"

#define COPY_THREADS 512 /* NCCL's usual channel width */
#define COPY_UNROLL 4

/* n vectors, then the tail (< 16 bytes) by block 0 */
static __global__ void __launch_bounds__(COPY_THREADS) copy16_kernel(uint4 *__restrict__ dst,
                                                                     const uint4 *__restrict__ src, size_t n,
                                                                     int tail) {
    const size_t tile = (size_t)COPY_THREADS * COPY_UNROLL, full = n / tile;
    for (size_t t = blockIdx.x; t < full; t += gridDim.x) {
        const uint4 *s = src + t * tile + threadIdx.x;
        uint4 *d = dst + t * tile + threadIdx.x;
        uint4 v[COPY_UNROLL];
#pragma unroll
        for (int u = 0; u < COPY_UNROLL; u++) v[u] = s[u * COPY_THREADS];
#pragma unroll
        for (int u = 0; u < COPY_UNROLL; u++) d[u * COPY_THREADS] = v[u];
    }
    for (size_t i = full * tile + (size_t)blockIdx.x * COPY_THREADS + threadIdx.x; i < n;
         i += (size_t)gridDim.x * COPY_THREADS)
        dst[i] = src[i];
    if (blockIdx.x == 0 && (int)threadIdx.x < tail)
        ((unsigned char *)(dst + n))[threadIdx.x] = ((const unsigned char *)(src + n))[threadIdx.x];
}

/* pointers that cannot both be 16-byte aligned: bytes one at a time (correct, not fast) */
static __global__ void copy1_kernel(unsigned char *__restrict__ dst, const unsigned char *__restrict__ src,
                                    size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = src[i];
}

extern "C" cudaError_t nb_cuda_copy_sm(void *dst, const void *src, size_t bytes, int blocks, cudaStream_t s) {
    if (blocks < 1) return cudaErrorInvalidValue;
    if (bytes == 0) return cudaSuccess;
    if ((((uintptr_t)dst | (uintptr_t)src) & 15) == 0)
        copy16_kernel<<<blocks, COPY_THREADS, 0, s>>>((uint4 *)dst, (const uint4 *)src, bytes / 16,
                                                      (int)(bytes % 16));
    else
        copy1_kernel<<<blocks, COPY_THREADS, 0, s>>>((unsigned char *)dst, (const unsigned char *)src, bytes);
    return cudaGetLastError();
}
