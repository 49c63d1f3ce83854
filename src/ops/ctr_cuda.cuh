/* Shared by the .cu files of the seqctr ops (embag, cross, relu, linear1, bce, cols, seqattn):
 * launch constants, four-element vector access and the column-sum store. Not a public header.
 *
 * Determinism without float atomics, the rule of every file here: each output element has one
 * writer that adds its terms in an order fixed by the shapes (column sums over fixed blocks of
 * NB_COL_ROWS rows finished by nb_col_finish; GEMMs by cuBLASLt, whose split-K is not atomic).
 * Loads and stores convert at the memory boundary (nb_ld / nb_st); all arithmetic is fp32. */
#ifndef NB_CTR_CUDA_CUH
#define NB_CTR_CUDA_CUH

#include <stdint.h>

#include "ops/ops_ctr_cuda.h"
#include "ops_cuda_common.cuh"

#define CTR_THREADS 256
#define CTR_WARPS (CTR_THREADS / 32)

/* ---- four consecutive elements in one access (16 bytes fp32, 8 bytes bf16; p aligned to it) ---- */

static __device__ __forceinline__ float4 ld4(const float *p) { return *(const float4 *)p; }
static __device__ __forceinline__ float4 ld4(const nb_bf16_t *p) {
    uint2 u = *(const uint2 *)p; /* little endian: element 0 is the low half of u.x */
    return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u), __uint_as_float(u.y << 16),
                       __uint_as_float(u.y & 0xffff0000u));
}
static __device__ __forceinline__ void st4(float *p, float4 v) { *(float4 *)p = v; }
static __device__ __forceinline__ uint32_t bf16x2_bits(float lo, float hi) {
    return (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(lo)) |
           ((uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(hi)) << 16);
}
static __device__ __forceinline__ void st4(nb_bf16_t *p, float4 v) {
    *(uint2 *)p = make_uint2(bf16x2_bits(v.x, v.y), bf16x2_bits(v.z, v.w));
}

/* Host side: may a pointer to elements of es bytes take ld4/st4 (NULL: it is not accessed)? */
static inline int al4(const void *p, size_t es) { return p == NULL || (uintptr_t)p % (4 * es) == 0; }

/* Blocks of the elementwise kernels, each thread four elements. */
static inline unsigned ctr_elem_grid(size_t n) { return nb_grid_1d((n + 3) / 4, CTR_THREADS); }

/* Block (32, 8) over 32 columns and rows [blockIdx.y * NB_COL_ROWS, +NB_COL_ROWS): writes the
 * block's column sums of the per-thread values acc to part[blockIdx.y] in a fixed order. */
static __device__ __forceinline__ void col_part_store(float *part, float acc, int c, int D) {
    __shared__ float sh[8][33];
    sh[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < D) {
        float s = 0.0f;
        for (int i = 0; i < 8; i++) s += sh[i][threadIdx.x];
        part[(size_t)blockIdx.y * D + c] = s;
    }
}

#endif
