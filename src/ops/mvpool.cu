/* Pooling of multi-valued categorical columns on CUDA (mvpool.c's): one thread per (sample,
 * column) walks the sample's value rows in order from the slot's own first value, so the sum is
 * the CPU's sequence of fp32 adds (no atomics); bf16 values are read and the slot written
 * through nb_ld / nb_st. The backward thread owns its slot element: it rescales it in place. */
#include "ctr_cuda.cuh"

static __device__ __forceinline__ float bag_scale(const int32_t *off, int os, int i, int mean, int32_t *r0,
                                                  int32_t *r1) {
    *r0 = off[(size_t)i * os];
    *r1 = off[(size_t)i * os + 1];
    int n = *r1 > *r0 ? *r1 - *r0 : 0;
    return mean && n > 0 ? 1.0f / (float)n : 1.0f;
}

/* A table value as the activations hold it: rounded to T, as the embedding gather stores it. */
static __device__ __forceinline__ float as_act(const float *, float v) { return v; }
static __device__ __forceinline__ float as_act(const nb_bf16_t *, float v) {
    return __bfloat162float(__float2bfloat16_rn(v));
}

template <typename T>
static __global__ void mvpool_fwd_kernel(T *out, int ld, const float *table, const int64_t *rows,
                                         const int32_t *before, const int32_t *off, int os, int B, int E, int mean) {
    NB_GRID_STRIDE(g, (size_t)B * E) {
        int i = (int)(g / E), e = (int)(g - (size_t)i * E);
        int32_t r0, r1;
        float s = bag_scale(off, os, i, mean, &r0, &r1);
        T *o = out + (size_t)i * ld + e;
        if (r1 <= r0) {
            nb_st(o, 0.0f);
            continue;
        }
        if (r1 - r0 == 1) continue; /* one value: the slot is it (no rounding) */
        const int64_t *vrow = rows + (r0 - before[(size_t)i * os]); /* value r0 + 1's lookup */
        float acc = nb_ld(o);
        for (int32_t r = r0 + 1; r < r1; r++) acc += as_act(o, table[(size_t)vrow[r - r0 - 1] * E + e]);
        if (s != 1.0f) acc *= s;
        nb_st(o, acc);
    }
}

template <typename T>
static __global__ void mvpool_bwd_kernel(T *dvals, T *dout, int ld, const int32_t *off, int os, int B, int E,
                                         int mean) {
    NB_GRID_STRIDE(g, (size_t)B * E) {
        int i = (int)(g / E), e = (int)(g - (size_t)i * E);
        int32_t r0, r1;
        float s = bag_scale(off, os, i, mean, &r0, &r1);
        T *dp = dout + (size_t)i * ld + e;
        float d = nb_ld(dp);
        for (int32_t r = r0 + 1; r < r1 && dvals; r++) {
            T *p = dvals + (size_t)r * E + e;
            nb_st(p, nb_ld(p) + (s == 1.0f ? d : d * s));
        }
        if (s != 1.0f) nb_st(dp, d * s); /* the slot's gradient becomes its first value's */
    }
}

template <typename T>
static void fwd_launch(T *out, int ld, const float *table, const int64_t *rows, const int32_t *before,
                       const int32_t *off, int os, int B, int E, int mean, cudaStream_t stream, const char *name) {
    NB_CUDA_SHAPE(B >= 0 && E >= 1 && ld >= E && os >= 1 && (B == 0 || (out && off && before)), name);
    if (B == 0) return;
    size_t n = (size_t)B * E;
    mvpool_fwd_kernel<<<nb_grid_1d(n, CTR_THREADS), CTR_THREADS, 0, stream>>>(out, ld, table, rows, before, off, os,
                                                                              B, E, mean);
    CUDA_CHECK_LAUNCH("multi-valued pooling");
}

template <typename T>
static void bwd_launch(T *dvals, T *dout, int ld, const int32_t *off, int os, int B, int E, int mean,
                       cudaStream_t stream, const char *name) {
    NB_CUDA_SHAPE(B >= 0 && E >= 1 && ld >= E && os >= 1 && (B == 0 || (dout && off)), name);
    if (B == 0) return;
    size_t n = (size_t)B * E;
    mvpool_bwd_kernel<<<nb_grid_1d(n, CTR_THREADS), CTR_THREADS, 0, stream>>>(dvals, dout, ld, off, os, B, E, mean);
    CUDA_CHECK_LAUNCH("multi-valued pooling backward");
}

extern "C" void nb_cuda_mvpool_forward_f32(float *out, int ld_out, const float *table, const int64_t *rows,
                                           const int32_t *before, const int32_t *off, int off_stride, int B, int E,
                                           int mean, nb_stream_t stream) {
    fwd_launch(out, ld_out, table, rows, before, off, off_stride, B, E, mean, stream, __func__);
}
extern "C" void nb_cuda_mvpool_forward_bf16(nb_bf16 *out, int ld_out, const float *table, const int64_t *rows,
                                            const int32_t *before, const int32_t *off, int off_stride, int B, int E,
                                            int mean, nb_stream_t stream) {
    fwd_launch(nb_kt(out), ld_out, table, rows, before, off, off_stride, B, E, mean, stream, __func__);
}
extern "C" void nb_cuda_mvpool_backward_f32(float *dvals, float *dout, int ld_out, const int32_t *off,
                                            int off_stride, int B, int E, int mean, nb_stream_t stream) {
    bwd_launch(dvals, dout, ld_out, off, off_stride, B, E, mean, stream, __func__);
}
extern "C" void nb_cuda_mvpool_backward_bf16(nb_bf16 *dvals, nb_bf16 *dout, int ld_out, const int32_t *off,
                                             int off_stride, int B, int E, int mean, nb_stream_t stream) {
    bwd_launch(nb_kt(dvals), nb_kt(dout), ld_out, off, off_stride, B, E, mean, stream, __func__);
}
