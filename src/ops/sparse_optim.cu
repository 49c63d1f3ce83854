/* Row-wise Adagrad and lazy sparse Adam on CUDA (optim/optim_sparse.h's formulas, optim/sparse.c's
 * order of float operations). Each device operation is an explicitly rounded intrinsic (__fmul_rn, ...)
 * so nvcc cannot contract a*b+c into an FMA, and the host forms the scalars as sparse.c does:
 * the GPU gives the CPU's bits (up to the double sum of squares, whose order differs but which
 * is exact to far below a float's rounding). The rows are strictly increasing (the caller's
 * dedup), so every row has one writer and the updates need no ordering. */
#include <math.h>

#include "ops/ops_ctr_cuda.h"
#include "ops/ops_cuda_common.cuh"

#define THREADS 256
#define WARPS (THREADS / 32)

/* One warp per row: the mean of g^2 in double (lanes over e, then a fixed butterfly), one
 * accumulator update, then the row's step. */
static __global__ void rowwise_adagrad_kernel(float *table, float *acc, const int64_t *rows, const float *grads,
                                              const int32_t *count, int U, int E, float lr, float eps) {
    int u = blockIdx.x * WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (count) U = *count;
    if (u >= U) return;
    const float *g = grads + (size_t)u * E;
    int64_t r = rows[u];
    double ss = 0.0;
    for (int e = lane; e < E; e += 32) ss += (double)g[e] * g[e];
    ss = nb_warp_sum_d(ss);
    float a = __fadd_rn(acc[r], (float)(ss / E));
    __syncwarp(); /* every lane has read acc[r] before lane 0 replaces it */
    if (lane == 0) acc[r] = a;
    float mult = __fdiv_rn(lr, __fadd_rn(__fsqrt_rn(a), eps));
    float *w = table + (size_t)r * E;
    for (int e = lane; e < E; e += 32) w[e] = __fsub_rn(w[e], __fmul_rn(mult, g[e]));
}

/* One thread per element of the listed rows. */
static __global__ void sparse_adam_kernel(float *table, float *m, float *v, const int64_t *rows, const float *grads,
                                          const int32_t *count, int U, int E, float b1, float b2, float w1, float w2, float step,
                                          float bc2_sqrt, float eps) {
    size_t n = (size_t)(count ? *count : U) * E;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t u = i / E, e = i % E, o = (size_t)rows[u] * E + e;
        float g = grads[i];
        float mi = __fadd_rn(__fmul_rn(b1, m[o]), __fmul_rn(w1, g));
        float vi = __fadd_rn(__fmul_rn(b2, v[o]), __fmul_rn(__fmul_rn(w2, g), g));
        m[o] = mi;
        v[o] = vi;
        float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), bc2_sqrt), eps);
        table[o] = __fsub_rn(table[o], __fdiv_rn(__fmul_rn(step, mi), denom));
    }
}

extern "C" void nb_cuda_rowwise_adagrad(float *table, float *acc, const int64_t *rows, const float *grads,
                                        const int32_t *count, int U, int E, float lr, float eps, nb_stream_t stream) {
    NB_CUDA_SHAPE(U >= 0 && E > 0 && (U == 0 || (table && acc && rows && grads)), "nb_cuda_rowwise_adagrad");
    if (U == 0) return;
    rowwise_adagrad_kernel<<<(U + WARPS - 1) / WARPS, THREADS, 0, stream>>>(table, acc, rows, grads, count, U, E, lr,
                                                                            eps);
    CUDA_CHECK_LAUNCH("row-wise adagrad");
}

/* One thread per element of the listed rows (element-wise Adagrad: sparse.c's operations in order). */
static __global__ void exact_adagrad_kernel(float *table, float *acc, const int64_t *rows, const float *grads,
                                            const int32_t *count, int U, int E, float lr, float eps) {
    size_t n = (size_t)(count ? *count : U) * E;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t u = i / E, e = i % E, o = (size_t)rows[u] * E + e;
        float g = grads[i];
        float a = __fadd_rn(acc[o], __fmul_rn(g, g));
        acc[o] = a;
        table[o] = __fsub_rn(table[o], __fdiv_rn(__fmul_rn(lr, g), __fadd_rn(__fsqrt_rn(a), eps)));
    }
}

extern "C" void nb_cuda_exact_adagrad(float *table, float *acc, const int64_t *rows, const float *grads,
                                      const int32_t *count, int U, int E, float lr, float eps, nb_stream_t stream) {
    NB_CUDA_SHAPE(U >= 0 && E > 0 && (U == 0 || (table && acc && rows && grads)), "nb_cuda_exact_adagrad");
    if (U == 0) return;
    size_t n = (size_t)U * E;
    exact_adagrad_kernel<<<nb_grid_1d(n, THREADS), THREADS, 0, stream>>>(table, acc, rows, grads, count, U, E, lr, eps);
    CUDA_CHECK_LAUNCH("exact adagrad");
}

extern "C" void nb_cuda_sparse_adam(float *table, float *m, float *v, const int64_t *rows, const float *grads,
                                    const int32_t *count, int U, int E, float lr, float beta1, float beta2, float eps,
                                    int t, nb_stream_t stream) {
    NB_CUDA_SHAPE(U >= 0 && E > 0 && t >= 1 && (U == 0 || (table && m && v && rows && grads)), "nb_cuda_sparse_adam");
    if (U == 0) return;
    /* the scalars exactly as sparse.c forms them */
    float w1 = 1.0f - beta1, w2 = 1.0f - beta2;
    float step = (float)(lr / (1.0 - pow(beta1, t)));
    float bc2_sqrt = (float)sqrt(1.0 - pow(beta2, t));
    size_t n = (size_t)U * E;
    sparse_adam_kernel<<<nb_grid_1d(n, THREADS), THREADS, 0, stream>>>(table, m, v, rows, grads, count, U, E, beta1,
                                                                       beta2, w1, w2, step, bc2_sqrt, eps);
    CUDA_CHECK_LAUNCH("sparse adam");
}
