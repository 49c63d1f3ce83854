/* The CPU backend: fp32, the reference. Each entry adapts an ops.h function to the table. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "host.h"
#include "ops/backend.h"
#include "ops/backend_ctr.h"
#include "ops/ops.h"
#include "rng.h"
#include "optim/optim.h"

#define F(p) ((float *)(p))
#define CF(p) ((const float *)(p))

static void matmul_fwd(nb_ctx c, void *out, const void *inp, const void *w, const void *bias, int N, int C, int OC) {
    nb_matmul_forward(F(out), CF(inp), CF(w), CF(bias), N, C, OC);
}
static void matmul_bwd(nb_ctx c, void *dinp, void *dw, void *dbias, const void *dout, const void *inp,
                       const void *w, int N, int C, int OC) {
    nb_matmul_backward(F(dinp), F(dw), F(dbias), CF(dout), CF(inp), CF(w), N, C, OC);
}
static void layernorm_fwd(nb_ctx c, void *out, float *mean, float *rstd, const void *inp, const void *w,
                          const void *b, int N, int C, float eps) {
    nb_layernorm_forward(F(out), mean, rstd, CF(inp), CF(w), CF(b), N, C, eps);
}
static void layernorm_bwd(nb_ctx c, void *dinp, void *dw, void *db, const void *dout, const void *inp,
                          const void *w, const float *mean, const float *rstd, int N, int C) {
    nb_layernorm_backward(F(dinp), F(dw), F(db), CF(dout), CF(inp), CF(w), mean, rstd, N, C);
}
static void rmsnorm_fwd(nb_ctx c, void *out, float *rstd, const void *inp, const void *w, int N, int C, float eps) {
    nb_rmsnorm_forward(F(out), rstd, CF(inp), CF(w), N, C, eps);
}
static void rmsnorm_bwd(nb_ctx c, void *dinp, void *dw, const void *dout, const void *inp, const void *w,
                        const float *rstd, int N, int C) {
    nb_rmsnorm_backward(F(dinp), F(dw), CF(dout), CF(inp), CF(w), rstd, N, C);
}
static void headnorm_fwd(nb_ctx c, void *x, void *x_in, float *rstd, const void *w, int N, int nh, int HS, int stride,
                         float eps) {
    nb_headnorm_forward(F(x), F(x_in), rstd, CF(w), N, nh, HS, stride, eps);
}
static void headnorm_bwd(nb_ctx c, void *dx, void *dw, const void *x_in, const void *w, const float *rstd, int N,
                         int nh, int HS, int stride) {
    nb_headnorm_backward(F(dx), F(dw), CF(x_in), CF(w), rstd, N, nh, HS, stride);
}
static void gelu_fwd(nb_ctx c, void *out, const void *inp, size_t n) { nb_gelu_forward(F(out), CF(inp), n); }
static void matmul_gelu_fwd(nb_ctx c, void *out, void *pre, const void *inp, const void *w, const void *bias, int N,
                            int C, int OC) {
    nb_matmul_forward(F(pre), CF(inp), CF(w), CF(bias), N, C, OC);
    nb_gelu_forward(F(out), CF(pre), (size_t)N * OC);
}
static void gelu_bwd(nb_ctx c, void *dinp, const void *inp, const void *dout, size_t n) {
    nb_gelu_backward(F(dinp), CF(inp), CF(dout), n);
}
static void swiglu_fwd(nb_ctx c, void *out, const void *gu, int N, int F_) { nb_swiglu_forward(F(out), CF(gu), N, F_); }
static void swiglu_bwd(nb_ctx c, void *dgu, const void *dout, const void *gu, int N, int F_) {
    nb_swiglu_backward(F(dgu), CF(dout), CF(gu), N, F_);
}
static void residual_fwd(nb_ctx c, void *out, const void *a, const void *b, size_t n) {
    nb_residual_forward(F(out), CF(a), CF(b), n);
}
static void add_inplace(nb_ctx c, void *dst, const void *src, size_t n) { nb_add_inplace(F(dst), CF(src), n); }
static void add_f32(nb_ctx c, float *dst, const float *src, size_t n) { nb_add_inplace(dst, src, n); }
static void scale_cols(nb_ctx c, void *dst, int ld_dst, const void *src, int ld_src, int rows, int cols, float alpha,
                       int acc) {
    nb_scale_cols(F(dst), ld_dst, CF(src), ld_src, rows, cols, alpha, acc);
}
static void rope_fwd(nb_ctx c, void *x, int B, int T, int nh, int HS, int stride, const nb_rope *r) {
    nb_rope_forward(F(x), B, T, nh, HS, stride, r);
}
static void rope_bwd(nb_ctx c, void *dx, int B, int T, int nh, int HS, int stride, const nb_rope *r) {
    nb_rope_backward(F(dx), B, T, nh, HS, stride, r);
}
static void attention_fwd(nb_ctx c, void *out, float *lse, const void *qkv, int B, int T, int NH, int NKV, int HS) {
    nb_attention_forward(F(out), lse, CF(qkv), B, T, NH, NKV, HS);
}
static void attention_bwd(nb_ctx c, void *dqkv, const void *dout, const void *qkv, const void *out,
                          const float *lse, int B, int T, int NH, int NKV, int HS) {
    nb_attention_backward(F(dqkv), CF(dout), CF(qkv), CF(out), lse, B, T, NH, NKV, HS);
}
static void embed_fwd(nb_ctx c, void *out, const int32_t *tok, const void *wte, const void *wpe, int B, int T, int C,
                      int V) {
    nb_embed_forward(F(out), tok, CF(wte), CF(wpe), B, T, C);
}
static void embed_bwd(nb_ctx c, void *dwte, void *dwpe, const void *dout, const int32_t *tok, int B, int T, int C,
                      int V) {
    nb_embed_backward(F(dwte), F(dwpe), CF(dout), tok, B, T, C);
}
static void xent_fwd_bwd(nb_ctx c, void *dinp, void *dw, float *losses, const void *inp, const void *w,
                         const int32_t *targets, int N, int C, int V, int Vp, float grad_scale, const float *scale_by) {
    float scale = scale_by ? grad_scale * *scale_by : grad_scale; /* one rounding, as the CUDA kernel's __fmul_rn */
    nb_xent_forward_backward(F(dinp), F(dw), losses, CF(inp), CF(w), targets, N, C, V, scale, 0);
}
static void sum_f64(nb_ctx c, double *out, const float *x, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += x[i];
    *out = s;
}
static void sumsq_f64(nb_ctx c, double *out, const float *x, size_t n) { *out = nb_sumsq(x, n); }
static void sumsq_blocks(nb_ctx c, double *part, const float *x, size_t n) { nb_sumsq_blocks(part, x, n); }
static void clip_factor(nb_ctx c, float *clip, const double *sumsq, float max_norm) {
    *clip = nb_clip_factor(sqrt(*sumsq), max_norm);
}
static void adamw(nb_ctx c, float *p, const float *g, float *m, float *v, void *lowp, size_t n,
                  const nb_adamw_scalars *k, const float *clip) {
    nb_adamw_apply(p, g, m, v, n, k, clip ? *clip : 1.0f);
}
static void adamw_spans(nb_ctx c, float *p, const float *g, float *m, float *v, void *lowp, const nb_adamw_span *spans,
                        int nspans, const nb_adamw_scalars *k, const double *sumsq, float max_norm) {
    float clip = sumsq ? nb_clip_factor(sqrt(*sumsq), max_norm) : 1.0f;
    nb_adamw_apply_spans(p, g, m, v, spans, nspans, k, clip);
}
static void cast_params(nb_ctx c, void *lowp, const float *p, size_t n) {}
static void fill_normal(nb_ctx c, float *out, size_t n, uint64_t seed, uint64_t stream, float mean, float std) {
    nb_rng_fill_normal(out, n, seed, stream, mean, std);
}
static void *alloc(size_t bytes, const char *what) { return nb_aligned_alloc(bytes, what); }
static void release(void *p) { free(p); }
static void zero(nb_ctx c, void *p, size_t bytes) { memset(p, 0, bytes); }
static void copy_in(nb_ctx c, void *dst, const void *src, size_t bytes) {
    if (dst != src) memcpy(dst, src, bytes);
}
static size_t mem_available(void) { return nb_host_mem_available(); }

static const nb_backend_i *cuda_backend(const char *precision);

int nb_device_index(const char *device) {
    static const char *hint = "use --device cpu, cuda or cuda:N (N: a GPU index, see 'nobubble info')";
    if (!strcmp(device, "cpu")) return -1;
    if (!strcmp(device, "cuda")) return 0;
    NB_CHECK(!strncmp(device, "cuda:", 5), hint, "unknown device '%s'", device);
    const char *p = device + 5;
    char *end;
    long n = strtol(p, &end, 10);
    NB_CHECK(end != p && !*end && *p >= '0' && *p <= '9' && n < 1024, hint, "'%s' does not name a GPU index", device);
    return (int)n;
}

const nb_backend_i *nb_backend_for(const char *device, const char *precision) {
    if (nb_device_index(device) < 0) {
        NB_CHECK(!precision[0] || !strcmp(precision, "fp32"), "the CPU backend computes in fp32: drop --precision or pass fp32",
                 "precision '%s' is not available on the CPU", precision);
        return &nb_backend_cpu;
    }
    return cuda_backend(precision);
}

nb_backend *nb_backend_create(const char *device, const char *precision) {
    nb_backend *b = nb_calloc(1, sizeof *b, "the backend instance");
    b->ops = nb_backend_for(device, precision);
    b->device = nb_device_index(device);
    if (b->device < 0) {
        snprintf(b->desc, sizeof b->desc, "cpu");
        return b;
    }
#ifdef NB_WITH_CUDA
    nb_cuda_instance_open(b, b->device);
#endif
    return b;
}

void nb_backend_destroy(nb_backend *b) {
    if (!b) return;
#ifdef NB_WITH_CUDA
    if (b->device >= 0) nb_cuda_instance_close(b);
#endif
    free(b);
}

const nb_backend *nb_backend_of(nb_ctx c) {
    const nb_backend *b = c ? (const nb_backend *)c->backend : NULL;
    NB_CHECK(b != NULL, "this is a bug in nobubble; please report it",
             "an op ran on a lane whose runtime has no backend instance (nb_lanes_bind)");
    return b;
}

#ifdef NB_WITH_CUDA
static const nb_backend_i *cuda_backend(const char *precision) {
    if (!precision[0] || !strcmp(precision, "bf16")) return &nb_backend_cuda_bf16;
    NB_CHECK(!strcmp(precision, "fp32"), "use --precision bf16 or --precision fp32", "unknown precision '%s'", precision);
    return &nb_backend_cuda_f32;
}
#else
static const nb_backend_i *cuda_backend(const char *precision) {
    nb_fail("install the CUDA toolkit (nvcc on the PATH) and rebuild, or use --device cpu",
            "this build of nobubble has no CUDA backend");
}
#endif

const nb_backend_i nb_backend_cpu = {
    .name = "cpu", .device = NB_DEV_CPU, .act_dtype = NB_F32,
    .matmul_fwd = matmul_fwd, .matmul_bwd = matmul_bwd,
    .layernorm_fwd = layernorm_fwd, .layernorm_bwd = layernorm_bwd,
    .rmsnorm_fwd = rmsnorm_fwd, .rmsnorm_bwd = rmsnorm_bwd,
    .headnorm_fwd = headnorm_fwd, .headnorm_bwd = headnorm_bwd,
    .matmul_gelu_fwd = matmul_gelu_fwd, .gelu_fwd = gelu_fwd, .gelu_bwd = gelu_bwd,
    .swiglu_fwd = swiglu_fwd, .swiglu_bwd = swiglu_bwd,
    .residual_fwd = residual_fwd, .add_inplace = add_inplace, .add_f32 = add_f32,
    .scale_cols = scale_cols,
    .rope_fwd = rope_fwd, .rope_bwd = rope_bwd,
    .attention_fwd = attention_fwd, .attention_bwd = attention_bwd,
    .embed_fwd = embed_fwd, .embed_bwd = embed_bwd,
    .xent_fwd_bwd = xent_fwd_bwd,
    .sum_f64 = sum_f64, .sumsq_f64 = sumsq_f64, .sumsq_blocks = sumsq_blocks, .clip_factor = clip_factor, .adamw = adamw,
    .adamw_spans = adamw_spans,
    .ctr = &nb_ctr_ops_cpu, .cast_params = cast_params, .fill_normal = fill_normal, .alloc = alloc, .free = release, .zero = zero, .to_backend = copy_in,
    .to_host = copy_in, .to_host_async = copy_in, .host_alloc = alloc, .host_free = release,
    .mem_available = mem_available,
};
