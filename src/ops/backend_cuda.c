/* The CUDA backends: every entry launches the ops of ops_cuda.h on the lane's stream. Two
 * tables: bf16 (activations and compute weights in bf16; fp32 master weights, gradients and
 * AdamW state) and fp32 (TF32 off, for tight parity with the CPU reference). */
#include "ops/backend.h"

#ifdef NB_WITH_CUDA
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "cuda_check.h"
#include "ops/backend_ctr.h"
#include "ops/ops_cuda.h"
#include "rng.h"

#define S(c) ((nb_stream_t)(c)->stream)
#define LT(c) (nb_backend_of(c)->blas) /* the instance's cuBLASLt handle */

/* ---- entries whose element type follows the precision: generated for f32 and bf16 ---- */
#define NB_CUDA_BACKEND_OPS(SUF, T)                                                                        \
    static void matmul_fwd_##SUF(nb_ctx c, void *out, const void *inp, const void *w, const void *bias,       \
                                 int N, int C, int OC) {                                                     \
        nb_cuda_matmul_forward_##SUF((T *)out, (const T *)inp, (const T *)w, (const T *)bias, N, C, OC, LT(c), S(c)); \
    }                                                                                                        \
    static void matmul_bwd_##SUF(nb_ctx c, void *dinp, void *dw, void *dbias, const void *dout,              \
                                 const void *inp, const void *w, int N, int C, int OC) {                     \
        nb_cuda_matmul_backward_##SUF((T *)dinp, (float *)dw, (float *)dbias, (const T *)dout, (const T *)inp, \
                                      (const T *)w, N, C, OC, LT(c), S(c));                                         \
    }                                                                                                        \
    static void layernorm_fwd_##SUF(nb_ctx c, void *out, float *mean, float *rstd, const void *inp,          \
                                    const void *w, const void *b, int N, int C, float eps) {                 \
        nb_cuda_layernorm_forward_##SUF((T *)out, mean, rstd, (const T *)inp, (const T *)w, (const T *)b, N, C, \
                                        eps, S(c));                                                          \
    }                                                                                                        \
    static void layernorm_bwd_##SUF(nb_ctx c, void *dinp, void *dw, void *db, const void *dout,              \
                                    const void *inp, const void *w, const float *mean, const float *rstd,   \
                                    int N, int C) {                                                          \
        nb_cuda_layernorm_backward_##SUF((T *)dinp, (float *)dw, (float *)db, (const T *)dout, (const T *)inp, \
                                         (const T *)w, mean, rstd, N, C, S(c));                              \
    }                                                                                                        \
    static void rmsnorm_fwd_##SUF(nb_ctx c, void *out, float *rstd, const void *inp, const void *w, int N,    \
                                  int C, float eps) {                                                        \
        nb_cuda_rmsnorm_forward_##SUF((T *)out, rstd, (const T *)inp, (const T *)w, N, C, eps, S(c));        \
    }                                                                                                        \
    static void rmsnorm_bwd_##SUF(nb_ctx c, void *dinp, void *dw, const void *dout, const void *inp,         \
                                  const void *w, const float *rstd, int N, int C) {                          \
        nb_cuda_rmsnorm_backward_##SUF((T *)dinp, (float *)dw, (const T *)dout, (const T *)inp, (const T *)w, \
                                       rstd, N, C, S(c));                                                    \
    }                                                                                                        \
    static void matmul_gelu_fwd_##SUF(nb_ctx c, void *out, void *pre, const void *inp, const void *w,        \
                                      const void *bias, int N, int C, int OC) {                              \
        nb_cuda_matmul_gelu_forward_##SUF((T *)out, (T *)pre, (const T *)inp, (const T *)w, (const T *)bias, N, C, \
                                          OC, LT(c), S(c));                                                         \
    }                                                                                                        \
    static void gelu_fwd_##SUF(nb_ctx c, void *out, const void *inp, size_t n) {                             \
        nb_cuda_gelu_forward_##SUF((T *)out, (const T *)inp, n, S(c));                                       \
    }                                                                                                        \
    static void gelu_bwd_##SUF(nb_ctx c, void *dinp, const void *inp, const void *dout, size_t n) {          \
        nb_cuda_gelu_backward_##SUF((T *)dinp, (const T *)inp, (const T *)dout, n, S(c));                    \
    }                                                                                                        \
    static void swiglu_fwd_##SUF(nb_ctx c, void *out, const void *gu, int N, int F) {                        \
        nb_cuda_swiglu_forward_##SUF((T *)out, (const T *)gu, N, F, S(c));                                   \
    }                                                                                                        \
    static void swiglu_bwd_##SUF(nb_ctx c, void *dgu, const void *dout, const void *gu, int N, int F) {      \
        nb_cuda_swiglu_backward_##SUF((T *)dgu, (const T *)dout, (const T *)gu, N, F, S(c));                 \
    }                                                                                                        \
    static void residual_fwd_##SUF(nb_ctx c, void *out, const void *a, const void *b, size_t n) {            \
        nb_cuda_residual_forward_##SUF((T *)out, (const T *)a, (const T *)b, n, S(c));                       \
    }                                                                                                        \
    static void add_inplace_##SUF(nb_ctx c, void *dst, const void *src, size_t n) {                          \
        nb_cuda_add_inplace_##SUF((T *)dst, (const T *)src, n, S(c));                                        \
    }                                                                                                        \
    static void scale_cols_##SUF(nb_ctx c, void *dst, int ld_dst, const void *src, int ld_src, int rows,     \
                                 int cols, float alpha, int acc) {                                           \
        nb_cuda_scale_cols_##SUF((T *)dst, ld_dst, (const T *)src, ld_src, rows, cols, alpha, acc, S(c));   \
    }                                                                                                        \
    static void headnorm_fwd_##SUF(nb_ctx c, void *x, void *x_in, float *rstd, const void *w, int N, int nh,  \
                                   int HS, int stride, float eps) {                                          \
        nb_cuda_headnorm_forward_##SUF((T *)x, (T *)x_in, rstd, (const T *)w, N, nh, HS, stride, eps, S(c));  \
    }                                                                                                        \
    static void headnorm_bwd_##SUF(nb_ctx c, void *dx, void *dw, const void *x_in, const void *w,            \
                                   const float *rstd, int N, int nh, int HS, int stride) {                   \
        nb_cuda_headnorm_backward_##SUF((T *)dx, (float *)dw, (const T *)x_in, (const T *)w, rstd, N, nh, HS, \
                                        stride, S(c));                                                       \
    }                                                                                                        \
    static void rope_fwd_##SUF(nb_ctx c, void *x, int B, int Tt, int nh, int HS,                             \
                               int stride, const nb_rope *r) {                                               \
        nb_cuda_rope_forward_##SUF((T *)x, B, Tt, nh, HS, stride, r, S(c));                                  \
    }                                                                                                        \
    static void rope_bwd_##SUF(nb_ctx c, void *dx, int B, int Tt, int nh, int HS,                            \
                               int stride, const nb_rope *r) {                                               \
        nb_cuda_rope_backward_##SUF((T *)dx, B, Tt, nh, HS, stride, r, S(c));                                \
    }                                                                                                        \
    static void embed_fwd_##SUF(nb_ctx c, void *out, const int32_t *tok, const void *wte, const void *wpe,   \
                                int B, int Tt, int C, int V) {                                               \
        nb_cuda_embed_forward_##SUF((T *)out, tok, (const T *)wte, (const T *)wpe, B, Tt, C, V, S(c));       \
    }                                                                                                        \
    static void embed_bwd_##SUF(nb_ctx c, void *dwte, void *dwpe, const void *dout, const int32_t *tok,      \
                                int B, int Tt, int C, int V) {                                               \
        nb_cuda_embed_backward_##SUF((float *)dwte, (float *)dwpe, (const T *)dout, tok, B, Tt, C, V, S(c)); \
    }                                                                                                        \
    static void xent_##SUF(nb_ctx c, void *dinp, void *dw, float *losses, const void *inp, const void *w,    \
                           const int32_t *targets, int N, int C, int V, int Vp, float grad_scale,            \
                           const float *scale_by) {                                                          \
        nb_cuda_xent_scaled_##SUF((T *)dinp, (float *)dw, losses, (const T *)inp, (const T *)w, targets, N, C, V, \
                                  Vp, grad_scale, scale_by, 0, LT(c), S(c));                                        \
    }

NB_CUDA_BACKEND_OPS(f32, float)
NB_CUDA_BACKEND_OPS(bf16, nb_bf16)

/* ---- the optional fused / gradient-writing entries (issue 18): bf16 only; the fp32 table keeps
 * them NULL, so its parity path runs the plain ops in their old order ---- */
static void matmul_residual_fwd_bf16(nb_ctx c, void *out, const void *inp, const void *w, const void *bias,
                                     const void *resid, int N, int C, int OC) {
    nb_cuda_matmul_residual_forward_bf16(out, inp, w, bias, resid, N, C, OC, LT(c), S(c));
}
static void matmul_dgelu_bwd_bf16(nb_ctx c, void *dpre, void *dw, void *dbias, void *dbias_pre, const void *dout,
                                  const void *inp, const void *w, const void *pre, int N, int C, int OC) {
    nb_cuda_matmul_dgelu_backward_bf16(dpre, dw, dbias, dbias_pre, dout, inp, w, pre, N, C, OC, LT(c), S(c));
}
static void matmul_bwd_set_bf16(nb_ctx c, void *dinp, void *dw, void *dbias, const void *dout, const void *inp,
                                const void *w, int N, int C, int OC) {
    nb_cuda_matmul_backward_set_bf16(dinp, dw, dbias, dout, inp, w, N, C, OC, LT(c), S(c));
}
static void swiglu_bwd_set_bf16(nb_ctx c, void *dgu, const void *dout, const void *gu, int N, int F) {
    nb_cuda_swiglu_backward_set_bf16(dgu, dout, gu, N, F, S(c));
}

/* ---- attention: bf16 runs cuDNN's fused attention where the instance's mode asks for it
 * (nb_backend_set_attn, attention_cudnn.c) and our kernels otherwise, or when cuDNN refuses the call. fp32 (the tight-parity table) and
 * the accumulating backward (taken only where the backend lacks the _set ops) always run ours. */
static void attention_fwd_f32(nb_ctx c, void *out, float *lse, const void *qkv, int B, int Tt, int NH, int NKV,
                              int HS) {
    nb_cuda_attention_forward_f32(out, lse, qkv, B, Tt, NH, NKV, HS, S(c));
}
static void attention_bwd_f32(nb_ctx c, void *dqkv, const void *dout, const void *qkv, const void *out,
                              const float *lse, int B, int Tt, int NH, int NKV, int HS) {
    nb_cuda_attention_backward_f32(dqkv, dout, qkv, out, lse, B, Tt, NH, NKV, HS, S(c));
}
static void attention_fwd_bf16(nb_ctx c, void *out, float *lse, const void *qkv, int B, int Tt, int NH, int NKV,
                               int HS) {
    const nb_backend *b = nb_backend_of(c);
    if (nb_attn_mode_for(b->attn, Tt) != NB_ATTN_FA &&
        nb_cudnn_attention_forward_bf16(b, out, lse, qkv, B, Tt, NH, NKV, HS, S(c)) == 0)
        return;
    nb_cuda_attention_forward_bf16(out, lse, qkv, B, Tt, NH, NKV, HS, S(c));
    nb_attn_note(b, 0, NB_ATTN_RAN_OURS);
}
static void attention_bwd_bf16(nb_ctx c, void *dqkv, const void *dout, const void *qkv, const void *out,
                               const float *lse, int B, int Tt, int NH, int NKV, int HS) {
    nb_cuda_attention_backward_bf16(dqkv, dout, qkv, out, lse, B, Tt, NH, NKV, HS, S(c));
    nb_attn_note(nb_backend_of(c), 1, NB_ATTN_RAN_OURS);
}
static void attention_bwd_set_bf16(nb_ctx c, void *dqkv, const void *dout, const void *qkv, const void *out,
                                   const float *lse, int B, int Tt, int NH, int NKV, int HS) {
    const nb_backend *b = nb_backend_of(c);
    nb_attn_mode m = nb_attn_mode_for(b->attn, Tt);
    if ((m == NB_ATTN_CUDNN || m == NB_ATTN_CUDNN_FAST) &&
        nb_cudnn_attention_backward_set_bf16(b, dqkv, dout, qkv, out, lse, B, Tt, NH, NKV, HS, m == NB_ATTN_CUDNN,
                                             S(c)) == 0)
        return;
    nb_cuda_attention_backward_set_bf16(dqkv, dout, qkv, out, lse, B, Tt, NH, NKV, HS, S(c));
    nb_attn_note(b, 1, NB_ATTN_RAN_OURS);
}

/* ---- precision-independent entries ---- */
static void sum_f64(nb_ctx c, double *out, const float *x, size_t n) { nb_cuda_sum_f64(out, x, n, S(c)); }
static void sumsq_f64(nb_ctx c, double *out, const float *x, size_t n) { nb_cuda_sumsq(out, x, n, S(c)); }
static void sumsq_blocks(nb_ctx c, double *part, const float *x, size_t n) { nb_cuda_sumsq_blocks(part, x, n, S(c)); }
static void clip_factor(nb_ctx c, float *clip, const double *sumsq, float max_norm) {
    nb_cuda_clip_factor(clip, sumsq, max_norm, S(c));
}
static void adamw(nb_ctx c, float *p, const float *g, float *m, float *v, void *lowp, size_t n,
                  const nb_adamw_scalars *k, const float *clip) {
    nb_cuda_adamw_apply(p, g, m, v, (nb_bf16 *)lowp, n, k, clip, S(c));
}
static void adamw_spans(nb_ctx c, float *p, const float *g, float *m, float *v, void *lowp, const nb_adamw_span *spans,
                        int nspans, const nb_adamw_scalars *k, const double *sumsq, float max_norm) {
    nb_cuda_adamw_apply_spans(p, g, m, v, (nb_bf16 *)lowp, spans, nspans, k, sumsq, max_norm, S(c));
}
static void cast_bf16(nb_ctx c, void *lowp, const float *p, size_t n) { nb_cuda_cast_f32_to_bf16(lowp, p, n, S(c)); }
static void cast_none(nb_ctx c, void *lowp, const float *p, size_t n) {}

/* nb_rng_fill_normal's bits drawn on the GPU, a chunk at a time through one device buffer; the
 * elements the kernel lists as near a float rounding boundary (fill.cu says why) are redrawn here
 * with the host's nb_rng_normal_at, and a chunk that lists more than FILL_LIST is redrawn whole. */
#define FILL_CHUNK ((size_t)1 << 24)
#define FILL_LIST 65536u
size_t nb_cuda_fill_normal_host(float *out, size_t n, uint64_t seed, uint64_t stream, float mean, float std,
                                double margin, nb_stream_t s) {
    size_t chunk = n < FILL_CHUNK ? n + (n & 1) : FILL_CHUNK, redrawn = 0;
    if (!n) return 0;
    char *buf = NULL;
    CUDA_CHECK(cudaMallocAsync((void **)&buf, chunk * sizeof(float) + FILL_LIST * sizeof(uint32_t) + 64, s));
    float *d_out = (float *)buf;
    uint32_t *d_list = (uint32_t *)(buf + chunk * sizeof(float));
    unsigned int *d_count = (unsigned int *)(d_list + FILL_LIST);
    uint32_t *list = nb_malloc(FILL_LIST * sizeof(uint32_t), "the redraw list of the GPU's normal init");
    for (size_t first = 0; first < n; first += chunk) {
        size_t len = n - first < chunk ? n - first : chunk;
        unsigned int count = 0;
        CUDA_CHECK(cudaMemsetAsync(d_count, 0, sizeof count, s));
        nb_cuda_fill_normal(d_out, first, len, seed, stream, mean, std, margin, d_list, FILL_LIST, d_count, s);
        CUDA_CHECK(cudaMemcpyAsync(out + first, d_out, len * sizeof(float), cudaMemcpyDeviceToHost, s));
        CUDA_CHECK(cudaMemcpyAsync(&count, d_count, sizeof count, cudaMemcpyDeviceToHost, s));
        CUDA_CHECK(cudaStreamSynchronize(s));
        if (count > FILL_LIST) {
            float *o = out + first;
#pragma omp parallel for schedule(static)
            for (size_t j = 0; j < len; j++) o[j] = mean + std * nb_rng_normal_at(seed, stream, first + j);
            redrawn += len;
            continue;
        }
        if (!count) continue;
        CUDA_CHECK(cudaMemcpyAsync(list, d_list, count * sizeof(uint32_t), cudaMemcpyDeviceToHost, s));
        CUDA_CHECK(cudaStreamSynchronize(s));
        for (unsigned int k = 0; k < count; k++)
            out[first + list[k]] = mean + std * nb_rng_normal_at(seed, stream, first + list[k]);
        redrawn += count;
    }
    free(list);
    CUDA_CHECK(cudaFreeAsync(buf, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
    return redrawn;
}
static void fill_normal(nb_ctx c, float *out, size_t n, uint64_t seed, uint64_t stream, float mean, float std) {
    nb_cuda_fill_normal_host(out, n, seed, stream, mean, std, NB_FILL_MARGIN, S(c));
}

static void *dev_alloc(size_t bytes, const char *what) {
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        char b[32];
        nb_fail("lower --batch or --seq, or pick a smaller --model (the plan printed at start shows the bytes)",
                "out of GPU memory allocating %s for %s (%s)", nb_fmt_bytes(b, sizeof b, (double)bytes), what,
                cudaGetErrorString(e));
    }
    return p;
}
static void dev_free(void *p) {
    if (p) CUDA_CHECK(cudaFree(p));
}
static void dev_zero(nb_ctx c, void *p, size_t bytes) { CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, S(c))); }
static void to_dev(nb_ctx c, void *dst, const void *src, size_t bytes) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, S(c)));
}
static void to_host(nb_ctx c, void *dst, const void *src, size_t bytes) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, S(c)));
    CUDA_CHECK(cudaStreamSynchronize(S(c)));
}
static void to_host_async(nb_ctx c, void *dst, const void *src, size_t bytes) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, S(c)));
}
static void *pinned_alloc(size_t bytes, const char *what) {
    void *p = NULL;
    cudaError_t e = cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault);
    if (e != cudaSuccess) {
        char b[32];
        nb_fail("lower --batch or --seq (with --emb-place host: --table-cap), or free host memory",
                "cannot pin %s of host memory for %s (%s)", nb_fmt_bytes(b, sizeof b, (double)bytes), what,
                cudaGetErrorString(e));
    }
    nb_zero_par(p, bytes); /* tens of GB under stream: every core */
    return p;
}
static void pinned_free(void *p) {
    if (p) CUDA_CHECK(cudaFreeHost(p));
}
static size_t dev_available(void) {
    size_t free_b = 0, total = 0;
    if (cudaMemGetInfo(&free_b, &total) != cudaSuccess) return 0;
    return free_b;
}

#define NB_CUDA_FUSED_NONE
#define NB_CUDA_FUSED_BF16                                                                                 \
    .matmul_residual_fwd = matmul_residual_fwd_bf16, .matmul_dgelu_bwd = matmul_dgelu_bwd_bf16,            \
    .matmul_bwd_set = matmul_bwd_set_bf16, .swiglu_bwd_set = swiglu_bwd_set_bf16,                          \
    .attention_bwd_set = attention_bwd_set_bf16,
#define NB_CUDA_BACKEND_TABLE(SUF, DT, CAST, FUSED)                                                        \
    {                                                                                                      \
        FUSED                                                                                              \
        .name = "cuda-" #SUF, .device = NB_DEV_CUDA, .act_dtype = DT, .ctr = &nb_ctr_ops_cuda_##SUF,       \
        .matmul_fwd = matmul_fwd_##SUF,                                                                    \
        .matmul_bwd = matmul_bwd_##SUF, .layernorm_fwd = layernorm_fwd_##SUF,                              \
        .layernorm_bwd = layernorm_bwd_##SUF, .rmsnorm_fwd = rmsnorm_fwd_##SUF,                            \
        .rmsnorm_bwd = rmsnorm_bwd_##SUF, .matmul_gelu_fwd = matmul_gelu_fwd_##SUF,                        \
        .gelu_fwd = gelu_fwd_##SUF, .gelu_bwd = gelu_bwd_##SUF,                                            \
        .swiglu_fwd = swiglu_fwd_##SUF, .swiglu_bwd = swiglu_bwd_##SUF, .residual_fwd = residual_fwd_##SUF, \
        .add_inplace = add_inplace_##SUF, .add_f32 = add_f32, .scale_cols = scale_cols_##SUF, .rope_fwd = rope_fwd_##SUF,                  \
        .rope_bwd = rope_bwd_##SUF,                                                                        \
        .headnorm_fwd = headnorm_fwd_##SUF, .headnorm_bwd = headnorm_bwd_##SUF,                            \
        .attention_fwd = attention_fwd_##SUF, .attention_bwd = attention_bwd_##SUF,                        \
        .embed_fwd = embed_fwd_##SUF, .embed_bwd = embed_bwd_##SUF, .xent_fwd_bwd = xent_##SUF,            \
        .sum_f64 = sum_f64, .sumsq_f64 = sumsq_f64, .sumsq_blocks = sumsq_blocks, .clip_factor = clip_factor, .adamw = adamw,            \
        .adamw_spans = adamw_spans, .cast_params = CAST, .fill_normal = fill_normal, .alloc = dev_alloc, .free = dev_free,             \
        .zero = dev_zero, .to_backend = to_dev, .to_host = to_host, .host_alloc = pinned_alloc,            \
        .to_host_async = to_host_async, .host_free = pinned_free,                                          \
        .mem_available = dev_available,                                                                    \
    }

static void add_f32(nb_ctx c, float *dst, const float *src, size_t n) { nb_cuda_add_inplace_f32(dst, src, n, S(c)); }

const nb_backend_i nb_backend_cuda_f32 = NB_CUDA_BACKEND_TABLE(f32, NB_F32, cast_none, NB_CUDA_FUSED_NONE);
const nb_backend_i nb_backend_cuda_bf16 = NB_CUDA_BACKEND_TABLE(bf16, NB_BF16, cast_bf16, NB_CUDA_FUSED_BF16);

/* "0: NVIDIA H200, 1: ..." */
static void list_gpus(char *buf, size_t cap, int n) {
    size_t len = 0;
    buf[0] = 0;
    for (int i = 0; i < n && len + 1 < cap; i++) {
        struct cudaDeviceProp p;
        const char *name = cudaGetDeviceProperties(&p, i) == cudaSuccess ? p.name : "?";
        len += (size_t)snprintf(buf + len, cap - len, "%s%d: %s", i ? ", " : "", i, name);
    }
}

void nb_cuda_instance_open(nb_backend *b, int index) {
    char gpus[512];
    int n = nb_cuda_device_count(NULL, 0);
    NB_CHECK(n > 0, "check that nvidia-smi lists a GPU and CUDA_VISIBLE_DEVICES allows it, or use --device cpu",
             "--device cuda:%d: no usable GPU on this machine", index);
    list_gpus(gpus, sizeof gpus, n);
    NB_CHECK(index < n, "pick one of the GPUs listed (--device cuda:N), or --device cuda for GPU 0",
             "--device cuda:%d: this machine has %d GPU%s (%s)", index, n, n == 1 ? "" : "s", gpus);
    CUDA_CHECK(cudaSetDevice(index));
    /* The default pool returns memory to the driver at every sync unless told to keep it; then
     * each step's scratch would pay for fresh mappings. */
    cudaMemPool_t pool;
    uint64_t keep = UINT64_MAX;
    CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, index));
    CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    b->blas = nb_cuda_blas_create();
    b->attn_state = nb_attn_state_create(b);
    struct cudaDeviceProp p;
    CUDA_CHECK(cudaGetDeviceProperties(&p, index));
    snprintf(b->desc, sizeof b->desc, "cuda:%d (%s)", index, p.name);
}

void nb_cuda_instance_close(nb_backend *b) {
    nb_attn_state_destroy(b->attn_state);
    b->attn_state = NULL;
    nb_cuda_blas_destroy(b->blas);
    b->blas = NULL;
}

int nb_cuda_device_count(char *name, size_t cap) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n <= 0) {
        cudaGetLastError(); /* clear the sticky "no device" error */
        return 0;
    }
    struct cudaDeviceProp p;
    if (name && cap && cudaGetDeviceProperties(&p, 0) == cudaSuccess) snprintf(name, cap, "%s", p.name);
    return n;
}
#else
int nb_cuda_device_count(char *name, size_t cap) {
    if (name && cap) name[0] = 0;
    return 0;
}
#endif
