/* The CPU backend: fp32, the reference. Each entry adapts an ops.h function to the table. */
#include <string.h>

#include "ops/backend.h"
#include "ops/ops.h"

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
static void gelu_fwd(nb_ctx c, void *out, const void *inp, size_t n) { nb_gelu_forward(F(out), CF(inp), n); }
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
static void rope_fwd(nb_ctx c, void *x, int B, int T, int nh, int HS, int stride, float theta) {
    nb_rope_forward(F(x), B, T, nh, HS, stride, theta);
}
static void rope_bwd(nb_ctx c, void *dx, int B, int T, int nh, int HS, int stride, float theta) {
    nb_rope_backward(F(dx), B, T, nh, HS, stride, theta);
}
static void attention_fwd(nb_ctx c, void *out, float *lse, const void *qkv, int B, int T, int NH, int NKV, int HS) {
    nb_attention_forward(F(out), lse, CF(qkv), B, T, NH, NKV, HS);
}
static void attention_bwd(nb_ctx c, void *dqkv, const void *dout, const void *qkv, const void *out,
                          const float *lse, int B, int T, int NH, int NKV, int HS) {
    nb_attention_backward(F(dqkv), CF(dout), CF(qkv), CF(out), lse, B, T, NH, NKV, HS);
}
static void embed_fwd(nb_ctx c, void *out, const int32_t *tok, const void *wte, const void *wpe, int B, int T, int C) {
    nb_embed_forward(F(out), tok, CF(wte), CF(wpe), B, T, C);
}
static void embed_bwd(nb_ctx c, void *dwte, void *dwpe, const void *dout, const int32_t *tok, int B, int T, int C) {
    nb_embed_backward(F(dwte), F(dwpe), CF(dout), tok, B, T, C);
}
static void xent_fwd_bwd(nb_ctx c, void *dinp, void *dw, float *losses, const void *inp, const void *w,
                         const int32_t *targets, int N, int C, int V, float grad_scale) {
    nb_xent_forward_backward(F(dinp), F(dw), losses, CF(inp), CF(w), targets, N, C, V, grad_scale, 0);
}
static void zero(nb_ctx c, void *p, size_t bytes) { memset(p, 0, bytes); }

const nb_backend_i nb_backend_cpu = {
    .name = "cpu", .device = NB_DEV_CPU, .act_dtype = NB_F32,
    .matmul_fwd = matmul_fwd, .matmul_bwd = matmul_bwd,
    .layernorm_fwd = layernorm_fwd, .layernorm_bwd = layernorm_bwd,
    .rmsnorm_fwd = rmsnorm_fwd, .rmsnorm_bwd = rmsnorm_bwd,
    .gelu_fwd = gelu_fwd, .gelu_bwd = gelu_bwd,
    .swiglu_fwd = swiglu_fwd, .swiglu_bwd = swiglu_bwd,
    .residual_fwd = residual_fwd, .add_inplace = add_inplace,
    .rope_fwd = rope_fwd, .rope_bwd = rope_bwd,
    .attention_fwd = attention_fwd, .attention_bwd = attention_bwd,
    .embed_fwd = embed_fwd, .embed_bwd = embed_bwd,
    .xent_fwd_bwd = xent_fwd_bwd, .zero = zero,
};
