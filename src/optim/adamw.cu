/* AdamW and the global-norm helpers on CUDA.
 *
 * nb_cuda_adamw_update runs adamw.c's formula operation by operation, with the host forming the
 * same float scalars (nb_adamw_prepare), and every device operation written as an explicitly rounded
 * intrinsic (__fmul_rn, ...) so nvcc cannot contract a*b+c into an FMA: the GPU result is the
 * CPU result, bit for bit. One thread per element over a contiguous slab, plus the bf16 copy of
 * the new params in the same pass (the weights the next forward reads).
 * The reductions (sum, sum of squares) go in fixed blocks of REDUCE_BLOCK elements, then one
 * block adds the block sums in a fixed tree: the result depends only on n. */
#include "ops/ops_cuda_common.cuh"

#include <math.h>

#define THREADS 256
#define REDUCE_BLOCK 65536
#define REDUCE_THREADS 512

/* One element of AdamW from prepared scalars (nb_adamw_prepare, optim/adamw.c), with the
 * gradient first multiplied by the clip factor when it is below 1, as the CPU does. */
static __device__ __forceinline__ void adamw_element(size_t i, float *params, const float *grads, float *m, float *v,
                                                     nb_bf16_t *lp, const nb_adamw_scalars *k, float clip) {
    float g = grads[i];
    if (clip < 1.0f) g = __fmul_rn(g, clip);
    float p = __fmul_rn(params[i], k->decay);
    float mi = __fadd_rn(m[i], __fmul_rn(k->w1, __fsub_rn(g, m[i])));
    float vi = __fmul_rn(v[i], k->b2);
    vi = __fadd_rn(vi, __fmul_rn(__fmul_rn(k->w2, g), g));
    float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), k->bc2_sqrt), k->eps);
    p = __fadd_rn(p, __fdiv_rn(__fmul_rn(k->neg_step, mi), denom));
    params[i] = p;
    m[i] = mi;
    v[i] = vi;
    if (lp) lp[i] = __float2bfloat16_rn(p);
}

/* Scalars by value (formed on the host for this launch). */
static __global__ void adamw_kernel(float *params, const float *grads, float *m, float *v, nb_bf16_t *lp, size_t n,
                                    nb_adamw_scalars k) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        adamw_element(i, params, grads, m, v, lp, &k, 1.0f);
}

extern "C" void nb_cuda_adamw_update(float *params, const float *grads, float *m, float *v, nb_bf16 *params_bf16,
                                     size_t n, nb_adamw_cfg cfg, int t, nb_stream_t stream) {
    NB_CUDA_SHAPE(params && grads && m && v && t >= 1, "nb_cuda_adamw_update");
    if (n == 0) return;
    /* the scalars exactly as adamw.c forms them: the GPU result is the CPU result, bit for bit */
    nb_adamw_scalars k = nb_adamw_prepare(cfg, t);
    adamw_kernel<<<nb_grid_1d(n, THREADS), THREADS, 0, stream>>>(params, grads, m, v, (nb_bf16_t *)params_bf16, n,
                                                                 k);
    CUDA_CHECK_LAUNCH("adamw update");
}

/* Scalars and clip factor read from device memory, so a captured graph replays correctly as they
 * change (see nb_adamw_scalars in optim.h). */
static __global__ void adamw_dev_kernel(float *params, const float *grads, float *m, float *v, nb_bf16_t *lp,
                                        size_t n, const nb_adamw_scalars *ks, const float *clip_p) {
    const nb_adamw_scalars k = *ks;
    const float clip = clip_p ? *clip_p : 1.0f;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        adamw_element(i, params, grads, m, v, lp, &k, clip);
}

extern "C" void nb_cuda_adamw_apply(float *params, const float *grads, float *m, float *v, nb_bf16 *params_bf16,
                                    size_t n, const nb_adamw_scalars *k_dev, const float *clip_dev,
                                    nb_stream_t stream) {
    NB_CUDA_SHAPE(params && grads && m && v && k_dev, "nb_cuda_adamw_apply");
    if (n == 0) return;
    adamw_dev_kernel<<<nb_grid_1d(n, THREADS), THREADS, 0, stream>>>(params, grads, m, v, (nb_bf16_t *)params_bf16,
                                                                     n, k_dev, clip_dev);
    CUDA_CHECK_LAUNCH("adamw apply");
}

/* nb_clip_factor (optim/adamw.c) on the device, in the same double arithmetic. */
static __global__ void clip_factor_kernel(float *out, const double *sumsq, float max_norm) {
    if (max_norm <= 0.0f) {
        *out = 1.0f;
        return;
    }
    double f = (double)max_norm / (sqrt(*sumsq) + 1e-6);
    *out = isnan(f) ? (float)f : f < 1.0 ? (float)f : 1.0f;
}

extern "C" void nb_cuda_clip_factor(float *out, const double *sumsq, float max_norm, nb_stream_t stream) {
    clip_factor_kernel<<<1, 1, 0, stream>>>(out, sumsq, max_norm);
    CUDA_CHECK_LAUNCH("clip factor");
}

static __global__ void scale_kernel(float *g, size_t n, float s) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        g[i] = __fmul_rn(g[i], s);
}

extern "C" void nb_cuda_scale_inplace(float *g, size_t n, float s, nb_stream_t stream) {
    NB_CUDA_SHAPE(g || n == 0, "nb_cuda_scale_inplace");
    if (n == 0) return;
    scale_kernel<<<nb_grid_1d(n, THREADS), THREADS, 0, stream>>>(g, n, s);
    CUDA_CHECK_LAUNCH("scale in place");
}

/* part[blockIdx.x] = sum over elements [blockIdx.x * REDUCE_BLOCK, +REDUCE_BLOCK). */
static __global__ void reduce_part_kernel(double *part, const float *x, size_t n, int square) {
    __shared__ double sh[32];
    size_t start = (size_t)blockIdx.x * REDUCE_BLOCK;
    size_t end = start + REDUCE_BLOCK < n ? start + REDUCE_BLOCK : n;
    double s = 0.0;
    for (size_t i = start + threadIdx.x; i < end; i += blockDim.x) {
        double v = x[i];
        s += square ? v * v : v;
    }
    s = nb_block_sum_d(s, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

static __global__ void reduce_final_kernel(double *out, const double *part, size_t nparts) {
    __shared__ double sh[32];
    double s = 0.0;
    for (size_t i = threadIdx.x; i < nparts; i += blockDim.x) s += part[i];
    s = nb_block_sum_d(s, sh);
    if (threadIdx.x == 0) *out = s;
}

void nb_cuda_reduce_f64(double *out, const float *x, size_t n, int square, cudaStream_t stream) {
    if (n == 0) {
        CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(double), stream));
        return;
    }
    size_t nparts = (n + REDUCE_BLOCK - 1) / REDUCE_BLOCK;
    NB_CUDA_SHAPE(nparts <= 0x7fffffffu, "nb_cuda_reduce_f64");
    double *part = (double *)nb_cuda_scratch(nparts * sizeof(double), stream);
    reduce_part_kernel<<<(unsigned)nparts, REDUCE_THREADS, 0, stream>>>(part, x, n, square);
    CUDA_CHECK_LAUNCH("reduction (block sums)");
    reduce_final_kernel<<<1, REDUCE_THREADS, 0, stream>>>(out, part, nparts);
    CUDA_CHECK_LAUNCH("reduction (final sum)");
    nb_cuda_scratch_free(part, stream);
}

extern "C" void nb_cuda_sumsq(double *out, const float *g, size_t n, nb_stream_t stream) {
    NB_CUDA_SHAPE(out && (g || n == 0), "nb_cuda_sumsq");
    nb_cuda_reduce_f64(out, g, n, 1, stream);
}
