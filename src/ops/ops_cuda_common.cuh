/* Shared by the .cu files of src/ops and src/optim (not a public header).
 *
 * Kernels are written once, as templates over the element type T (float or nb_bf16_t): the only
 * code that knows T is nb_ld / nb_st (overloads for float and bf16, converting at the memory
 * boundary); all arithmetic is fp32. The extern "C" launchers of ops_cuda.h are thin wrappers,
 * one per dtype, around one templated launcher (nb_kt turns their element pointers into the
 * kernels' types). Reductions use xor-butterfly warp sums and fixed block trees, so every lane
 * gets the same bits and every run the same result. */
#ifndef NB_OPS_CUDA_COMMON_CUH
#define NB_OPS_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdlib.h>

#include "core.h"
#include "cuda_check.h"
#include "ops/ops_cuda.h"

typedef __nv_bfloat16 nb_bf16_t;

/* ops_cuda.h's element pointers (float, or nb_bf16: bf16 bits) as the kernels' element types. */
static inline float *nb_kt(float *p) { return p; }
static inline const float *nb_kt(const float *p) { return p; }
static inline nb_bf16_t *nb_kt(nb_bf16 *p) { return (nb_bf16_t *)p; }
static inline const nb_bf16_t *nb_kt(const nb_bf16 *p) { return (const nb_bf16_t *)p; }
/* cuBLASLt's name of an element type (the argument only picks the overload). */
static inline cudaDataType_t nb_cuda_dtype(const float *) { return CUDA_R_32F; }
static inline cudaDataType_t nb_cuda_dtype(const nb_bf16_t *) { return CUDA_R_16BF; }

/* A grid-stride loop over [0, n): each index is one thread's, whatever the launch shape. */
#define NB_GRID_STRIDE(i, n)                                                                       \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

static __device__ __forceinline__ float nb_ld(const float *p) { return *p; }
static __device__ __forceinline__ float nb_ld(const nb_bf16_t *p) { return __bfloat162float(*p); }
static __device__ __forceinline__ void nb_st(float *p, float v) { *p = v; }
/* Round to nearest even, as torch's .to(bfloat16). */
static __device__ __forceinline__ void nb_st(nb_bf16_t *p, float v) { *p = __float2bfloat16_rn(v); }

/* Two bf16 in a 32-bit word, to and from fp32 (bf16 -> fp32 is exact, a shift; fp32 -> bf16
 * rounds to nearest even), and eight in a 16-byte vector: the vectorized kernels' loads/stores. */
static __device__ __forceinline__ float nb_bf_lo(unsigned u) { return __uint_as_float(u << 16); }
static __device__ __forceinline__ float nb_bf_hi(unsigned u) { return __uint_as_float(u & 0xffff0000u); }
static __device__ __forceinline__ unsigned nb_bf_pack(float lo, float hi) {
    return (unsigned)__bfloat16_as_ushort(__float2bfloat16_rn(lo)) |
           ((unsigned)__bfloat16_as_ushort(__float2bfloat16_rn(hi)) << 16);
}
static __device__ __forceinline__ void nb_bf16x8_unpack(uint4 a, float *v) {
    v[0] = nb_bf_lo(a.x), v[1] = nb_bf_hi(a.x), v[2] = nb_bf_lo(a.y), v[3] = nb_bf_hi(a.y);
    v[4] = nb_bf_lo(a.z), v[5] = nb_bf_hi(a.z), v[6] = nb_bf_lo(a.w), v[7] = nb_bf_hi(a.w);
}
static __device__ __forceinline__ uint4 nb_bf16x8_pack(const float *v) {
    return make_uint4(nb_bf_pack(v[0], v[1]), nb_bf_pack(v[2], v[3]), nb_bf_pack(v[4], v[5]), nb_bf_pack(v[6], v[7]));
}

/* Bits that hold every value in [0, max] (at least 1): a radix sort's key width. */
static inline int nb_key_bits(int64_t max) {
    int b = 1;
    while (b < 32 && (max >> b) > 0) b++;
    return b;
}

static __device__ __forceinline__ float nb_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
static __device__ __forceinline__ double nb_warp_sum_d(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
static __device__ __forceinline__ float nb_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum over the block (blockDim.x a multiple of 32); every thread gets the result. sh: 32 slots.
 * Callable repeatedly with the same sh (the leading barrier protects the previous use). */
static __device__ __forceinline__ float nb_block_sum(float v, float *sh) {
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = nb_warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    return nb_warp_sum(lane < nw ? sh[lane] : 0.0f);
}
static __device__ __forceinline__ double nb_block_sum_d(double v, double *sh) {
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = nb_warp_sum_d(v);
    __syncthreads();
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    return nb_warp_sum_d(lane < nw ? sh[lane] : 0.0);
}
static __device__ __forceinline__ float nb_block_max(float v, float *sh) {
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = nb_warp_max(v);
    __syncthreads();
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    return nb_warp_max(lane < nw ? sh[lane] : -INFINITY);
}

/* Fixed-order second pass of a column reduction: dst[c] += sum over k of part[k*ncols + c], in an
 * order fixed by (nparts, ncols). The first passes (one partial row per block of input rows) live
 * with their op. nb_col_finish2 finishes two reductions of one shape in one launch (either dst may
 * be NULL). */
void nb_col_finish(float *dst, const float *part, int nparts, int ncols, cudaStream_t stream);
void nb_col_finish2(float *dst0, const float *part0, float *dst1, const float *part1, int nparts, int ncols,
                    cudaStream_t stream);

/* Input rows per partial in the column reductions (dbias, norm dw/db). Fixed, so the partials,
 * and the order they are added in, depend only on the shapes. */
#define NB_COL_ROWS 128
static inline int nb_col_parts(int N) { return (N + NB_COL_ROWS - 1) / NB_COL_ROWS; }

/* One cuBLASLt GEMM, column-major: D[m,n] = op(A)[m,k] . op(B)[k,n] + beta * D, then the
 * epilogue (bias of length m, type td; GELU input to aux, [m, n] with leading dimension ldd).
 * Compute type fp32 (TF32 off). lt: the backend instance's (nb_cuda_blas_create), whose
 * workspaces the GEMMs use. nb_lt_run returns 0, running nothing, if no algorithm fits and
 * may_fail; without may_fail that is an nb_fail. (matmul.cu) */
typedef struct {
    int m, n, k;
    int transa, transb;
    const void *A, *B;
    void *D;
    int lda, ldb, ldd;
    cudaDataType_t tab, td; /* A and B share a type; D (and C = D) may differ */
    float beta;
    cublasLtEpilogue_t epi;
    const void *bias; /* the epilogue's bias, of length m */
    void *aux;
    const void *C;    /* the matrix beta scales, layout and type of D; NULL: D itself (in place) */
} nb_lt_gemm;
int nb_lt_run(const nb_lt_gemm *g, nb_blas_t lt, cudaStream_t stream, int may_fail);

/* *out = sum of x[i] (or x[i]^2) in double: fixed blocks of elements, then a fixed-order pass
 * over the block sums, so the result depends only on n. (ops/adamw.cu) */
void nb_cuda_reduce_f64(double *out, const float *x, size_t n, int square, cudaStream_t stream);

/* Stream-ordered scratch (cudaMallocAsync on the launch's stream): freed after the kernels that
 * use it, reused by the pool without a device sync, private to the stream. */
void *nb_cuda_scratch(size_t bytes, cudaStream_t stream);
void nb_cuda_scratch_free(void *p, cudaStream_t stream);

/* Blocks for a grid-stride loop over n elements with `threads` per block. */
static inline unsigned nb_grid_1d(size_t n, int threads) {
    size_t b = (n + (size_t)threads - 1) / (size_t)threads;
    if (b > 65536u * 8) b = 65536u * 8;
    return (unsigned)(b ? b : 1);
}

#define NB_SHAPE_HINT "this is a bug in the caller of this op: pass the shapes ops_cuda.h documents"
#define NB_CUDA_SHAPE(cond, op)                                                                    \
    NB_CHECK(cond, NB_SHAPE_HINT, "%s: invalid arguments: %s is false", op, #cond)

#endif
