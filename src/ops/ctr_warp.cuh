/* The warp-level helpers of the seqctr kernels written in plain C (seqattn_tc.cu, embag.cu's
 * unique-row gradient): shuffles, ballots and 8-byte bf16 accesses. tests/ops/emu_tc.c includes
 * those files with CTR_TC_EMU defined and supplies host versions of the primitives (a warp
 * emulator) and of mma.cuh's, so the kernels also run, and are checked, on a CPU. */
#ifndef NB_CTR_WARP_CUH
#define NB_CTR_WARP_CUH

#ifndef CTR_TC_EMU
#include <math.h>
#include <stdint.h>

#include "mma.cuh"
#include "ops/backend_ctr.h"
#include "ops/ops_ctr_cuda.h"
#include "ops_cuda_common.cuh"
#define TC_UNROLL _Pragma("unroll")
#define TC_PRAGMA(x) _Pragma(#x)
#define TC_UNROLL_N(n) TC_PRAGMA(unroll n)
#define TC_SMEM(name) extern __shared__ __align__(16) unsigned char name[]
#endif

#define TC_WARPS 4 /* warps per block (every kernel of these files) */

/* 8 bytes: four bf16 (x: elements 0, 1; y: 2, 3) */
typedef struct {
    unsigned x, y;
} tc_u2;

/* 16 bytes: four floats (CUDA's float4 on the device, for its 16-byte loads and stores) */
#ifndef CTR_TC_EMU
typedef float4 tc_f4;
#else
typedef struct {
    float x, y, z, w;
} tc_f4;
#endif

/* ---- primitives: warp collectives and 8- and 16-byte accesses ---- */
#ifndef CTR_TC_EMU
static __device__ __forceinline__ float tc_shfl_f(float v, int src) { return __shfl_sync(0xffffffffu, v, src); }
static __device__ __forceinline__ int tc_shfl_i(int v, int src) { return __shfl_sync(0xffffffffu, v, src); }
static __device__ __forceinline__ long long tc_shfl_ll(long long v, int src) {
    return __shfl_sync(0xffffffffu, v, src);
}
static __device__ __forceinline__ unsigned tc_ballot(int p) { return __ballot_sync(0xffffffffu, p); }
static __device__ __forceinline__ void tc_syncwarp(void) { __syncwarp(); }
static __device__ __forceinline__ int tc_clz(unsigned x) { return __clz(x); }
static __device__ __forceinline__ tc_u2 tc_ld8(const nb_bf16 *p) {
    uint2 u = *(const uint2 *)p;
    tc_u2 r = {u.x, u.y};
    return r;
}
static __device__ __forceinline__ void tc_st8(nb_bf16 *p, tc_u2 v) { *(uint2 *)p = make_uint2(v.x, v.y); }
static __device__ __forceinline__ tc_f4 tc_ld16f(const float *p) { return *(const float4 *)p; }
static __device__ __forceinline__ void tc_st16f(float *p, tc_f4 v) { *(float4 *)p = v; }
#else
/* the emulator defines these after including the kernel files */
static tc_u2 tc_ld8(const nb_bf16 *p);
static void tc_st8(nb_bf16 *p, tc_u2 v);
static tc_f4 tc_ld16f(const float *p);
static void tc_st16f(float *p, tc_f4 v);
#endif

static __device__ __forceinline__ float tc_lo(unsigned u) { return __uint_as_float(u << 16); }
static __device__ __forceinline__ float tc_hi(unsigned u) { return __uint_as_float(u & 0xffff0000u); }
static __device__ __forceinline__ float tc_bf(nb_bf16 h) { return __uint_as_float((unsigned)h << 16); }

#endif
