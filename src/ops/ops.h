/* CPU fp32 reference ops: forward and backward, llm.c style (raw pointers, shapes spelled out).
 *
 * Conventions (every op, every backend):
 * - Shapes: B batch, T time, C channels, N = B*T rows, OC output channels, NH query heads,
 *   NKV key/value heads, HS head size, V vocabulary (real), Vp vocabulary rows (padded), F ffn.
 * - Row-major. Linear weights use PyTorch nn.Linear's layout [OC, C]: out = inp @ w^T + bias.
 * - Backward functions ACCUMULATE (+=) into every gradient they write (dinp, dweight, dbias), so
 *   tied weights and residual branches just add; the caller zeroes gradients once per step.
 *   A gradient pointer may be NULL: that gradient is not computed (e.g. din = NULL at an ERASE
 *   detachment point, or a frozen weight).
 * - Deterministic: fixed accumulation order, no dependence on thread timing. Results may depend on
 *   the thread count (OpenMP / OpenBLAS), never on scheduling.
 * - Multi-threaded with OpenMP; GEMMs through OpenBLAS cblas_sgemm.
 * The CUDA versions live beside each file (ops/<family>.cu) with the same semantics. */
#ifndef NB_OPS_H
#define NB_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "ops/rope.h"

/* A cross-entropy target that counts for nothing (a token the loss mask leaves out). */
#define NB_XENT_IGNORE (-1)

#ifdef __cplusplus
extern "C" {
#endif

/* ---- matmul.c ---- */
/* out[N,OC] = inp[N,C] @ w[OC,C]^T + bias[OC] (bias may be NULL). */
void nb_matmul_forward(float *out, const float *inp, const float *w, const float *bias, int N, int C, int OC);
/* dinp[N,C] += dout @ w; dw[OC,C] += dout^T @ inp; dbias[OC] += sum_rows dout. Any may be NULL. */
void nb_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                        const float *w, int N, int C, int OC);

/* ---- norm.c ---- */
/* LayerNorm over the last dim. mean[N], rstd[N] are saved for backward. */
void nb_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w,
                          const float *b, int N, int C, float eps);
void nb_layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                           const float *w, const float *mean, const float *rstd, int N, int C);
/* RMSNorm (Llama): out = inp * rstd * w, rstd = 1/sqrt(mean(inp^2) + eps). rstd[N] saved. */
void nb_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int N, int C, float eps);
void nb_rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                         const float *rstd, int N, int C);
/* Per-head RMSNorm (Qwen3's q_norm / k_norm) on a strided view: row n holds nh heads of HS values
 * at x + n*stride + h*HS, each normalized as nb_rmsnorm_forward normalizes a row, with the one
 * weight w[HS]. The forward works in place and keeps the heads' input in x_in [N*nh, HS]
 * (contiguous, head h of row n at row n*nh + h) and rstd [N*nh] for the backward. The backward is
 * in place too: dx holds d(output) on entry and d(input) on return (written, not accumulated: the
 * output's gradient is consumed); dw accumulates (+=, NULL skips), reduced over the rows in order. */
void nb_headnorm_forward(float *x, float *x_in, float *rstd, const float *w, int N, int nh, int HS, int stride,
                         float eps);
void nb_headnorm_backward(float *dx, float *dw, const float *x_in, const float *w, const float *rstd, int N, int nh,
                          int HS, int stride);

/* ---- act.c ---- */
/* GELU, tanh approximation (GPT-2's "gelu_new"). */
void nb_gelu_forward(float *out, const float *inp, size_t n);
void nb_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n);
/* SwiGLU on a fused projection gu[N, 2F]: gate = gu[:, :F], up = gu[:, F:];
 * out[N,F] = silu(gate) * up. Backward writes dgu[N, 2F] (+=). */
void nb_swiglu_forward(float *out, const float *gu, int N, int F);
void nb_swiglu_backward(float *dgu, const float *dout, const float *gu, int N, int F);
/* out = a + b (out may alias a or b). */
void nb_residual_forward(float *out, const float *a, const float *b, size_t n);
/* dst += src: the backward of a residual add for each branch. */
void nb_add_inplace(float *dst, const float *src, size_t n);
/* dst[i * ld_dst + j] = (acc: dst[i * ld_dst + j] +) alpha * src[i * ld_src + j], i < rows, j < cols:
 * LoRA's scaled low-rank branch added into (or its gradient read out of) a column slice of a
 * fused projection's output (q, k, v of qkv; gate, up of the fused gate/up). */
void nb_scale_cols(float *dst, int ld_dst, const float *src, int ld_src, int rows, int cols, float alpha, int acc);

/* ---- rope.c ---- */
/* Rotary position embedding, HF Llama's rotate_half convention: for head dims i < HS/2,
 * (x[i], x[i+HS/2]) is rotated by angle t * inv_freq[i], t = position in [0, T), inv_freq[i] =
 * theta^(-2i/HS) scaled by r's rope type (nb_rope_inv_freq).
 * x is [B, T, row_stride] and the nheads heads of HS start at column 0 of each row (pass
 * qkv + NH*HS to reach the k heads). In place. Backward rotates dx in place by -angle. */
void nb_rope_forward(float *x, int B, int T, int nheads, int HS, int row_stride, const nb_rope *r);
void nb_rope_backward(float *dx, int B, int T, int nheads, int HS, int row_stride, const nb_rope *r);

/* ---- attention.c ---- */
/* Causal multi-head attention with grouped-query heads, flash-style: never stores T x T.
 * qkv[B, T, (NH + 2*NKV) * HS]: q heads, then k heads, then v heads. Query head h uses kv head
 * h / (NH / NKV) (HF's repeat_kv). Scale 1/sqrt(HS).
 * out[B, T, NH*HS]; lse[B, NH, T] = log-sum-exp of each row's scaled scores, saved for backward. */
void nb_attention_forward(float *out, float *lse, const float *qkv, int B, int T, int NH, int NKV, int HS);
/* dqkv[B, T, (NH+2*NKV)*HS] += gradient; recomputes scores from qkv and lse. */
void nb_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out,
                           const float *lse, int B, int T, int NH, int NKV, int HS);

/* ---- embed.c ---- */
/* out[B,T,C] = wte[tokens[b,t]] + wpe[t] (wpe may be NULL: no learned positions). */
void nb_embed_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe, int B, int T, int C);
/* dwte[token] += dout row, dwpe[t] += dout row; deterministic (rows applied in token order). */
void nb_embed_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens, int B, int T, int C);

/* ---- xent.c ---- */
/* Fused unembedding + softmax cross-entropy (+ its gradient), in chunks of chunk_rows rows so
 * that at most chunk_rows x V logits exist at once. logits = inp[N,C] @ w[:V]^T (rows V..Vp-1
 * of w, the padding, are never read or written). losses[N] = -log softmax(logits)[target].
 * If dinp or dw is non-NULL, the gradient of (grad_scale * sum of losses) is accumulated:
 * dinp[N,C] += dlogits @ w, dw[V,C] += dlogits^T @ inp. Targets must be in [0, V), or
 * NB_XENT_IGNORE: that row's loss is 0 and its gradient row is 0 (PyTorch's ignore_index; the
 * caller divides by the count of the other rows, e.g. through grad_scale).
 * Returns the sum of losses (double accumulation). */
double nb_xent_forward_backward(float *dinp, float *dw, float *losses, const float *inp, const float *w,
                                const int32_t *targets, int N, int C, int V, float grad_scale, int chunk_rows);

/* ---- softmax helper for sampling (xent.c) ---- */
/* logits[V] -> probs[V] in place, with temperature (> 0). */
void nb_softmax_inplace(float *x, int V, float temperature);

#ifdef __cplusplus
}
#endif
#endif
