/* CUDA versions of the ops in ops.h and optim.h: same shapes, same semantics, device pointers.
 *
 * Conventions, on top of ops.h's (backward ACCUMULATES; a NULL gradient is not computed):
 * - Every launcher enqueues on `stream` and returns without waiting; it checks shapes at entry
 *   (nb_fail on a bad one) and checks each launch.
 * - Two dtype variants of each op: _f32 (everything fp32; GEMMs in true fp32, TF32 off) and _bf16
 *   (activations, weights and activation gradients in bf16; fp32 accumulation inside every
 *   kernel; norm statistics, lse and losses in fp32). In both variants the gradients of
 *   PARAMETERS (dw, dbias, dwte, norm dw/db) are fp32: they accumulate across micro-batches and
 *   feed the fp32 AdamW slab.
 * - Deterministic: no float atomics; every reduction has a fixed order, so two runs on the same
 *   GPU are bitwise identical. Scratch memory comes from the stream-ordered allocator
 *   (cudaMallocAsync on `stream`), so launchers on different streams never share a buffer.
 * - Compiles from C: cudaStream_t is `struct CUstream_st *`, declared here without cuda_runtime.h
 *   when NB_WITH_CUDA is off (the functions then exist only in CUDA builds). */
#ifndef NB_OPS_CUDA_H
#define NB_OPS_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "ops/backend.h"
#ifndef NB_XENT_IGNORE
#define NB_XENT_IGNORE (-1) /* as in ops.h: a masked cross-entropy target */
#endif
#include "optim/optim.h"

#ifdef NB_WITH_CUDA
#include <cuda_runtime.h>
typedef cudaStream_t nb_stream_t;
#else
struct CUstream_st;
typedef struct CUstream_st *nb_stream_t;
#endif
/* A cuBLASLt handle (cublasLtHandle_t) of a backend instance (ops/backend.h: nb_backend.blas):
 * the launchers that run GEMMs take it, so handles belong to the instance, not to the process. */
typedef void *nb_blas_t;

#ifdef __cplusplus
extern "C" {
#endif

/* bfloat16 bits as stored in memory (the top half of an fp32). */
typedef uint16_t nb_bf16;

/* ---- matmul.cu (cuBLASLt) ---- */
/* A handle for the current device (the backend instance creates one per instance). */
nb_blas_t nb_cuda_blas_create(void);
void nb_cuda_blas_destroy(nb_blas_t lt);
/* out[N,OC] = inp[N,C] @ w[OC,C]^T + bias[OC] (bias may be NULL; fused as a cuBLASLt epilogue). */
void nb_cuda_matmul_forward_f32(float *out, const float *inp, const float *w, const float *bias, int N,
                                int C, int OC, nb_blas_t lt, nb_stream_t stream);
void nb_cuda_matmul_forward_bf16(nb_bf16 *out, const nb_bf16 *inp, const nb_bf16 *w, const nb_bf16 *bias,
                                 int N, int C, int OC, nb_blas_t lt, nb_stream_t stream);
/* pre[N,OC] = inp @ w^T + bias (saved for backward), out = gelu(pre): the GELU of an MLP's first
 * linear. bf16: fused into the GEMM's epilogue when cuBLASLt can (OC % 8 == 0); fp32, or when it
 * cannot: a GEMM then nb_cuda_gelu_forward. Same result as nb_matmul_forward + nb_gelu_forward. */
void nb_cuda_matmul_gelu_forward_f32(float *out, float *pre, const float *inp, const float *w,
                                     const float *bias, int N, int C, int OC, nb_blas_t lt, nb_stream_t stream);
void nb_cuda_matmul_gelu_forward_bf16(nb_bf16 *out, nb_bf16 *pre, const nb_bf16 *inp, const nb_bf16 *w,
                                      const nb_bf16 *bias, int N, int C, int OC, nb_blas_t lt, nb_stream_t stream);
/* dinp[N,C] += dout @ w; dw[OC,C] += dout^T @ inp; dbias[OC] += column sums of dout. */
void nb_cuda_matmul_backward_f32(float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                                 const float *w, int N, int C, int OC, nb_blas_t lt, nb_stream_t stream);
void nb_cuda_matmul_backward_bf16(nb_bf16 *dinp, float *dw, float *dbias, const nb_bf16 *dout,
                                  const nb_bf16 *inp, const nb_bf16 *w, int N, int C, int OC,
                                  nb_blas_t lt, nb_stream_t stream);

/* out[N,OC] = resid + inp @ w^T + bias (out != resid): a projection and the residual add after
 * it, as nb_cuda_matmul_forward then nb_cuda_residual_forward(out, resid, out). bf16: resid is the
 * GEMM's C matrix (one rounding); fp32: those two calls. */
void nb_cuda_matmul_residual_forward_f32(float *out, const float *inp, const float *w, const float *bias,
                                         const float *resid, int N, int C, int OC, nb_blas_t lt, nb_stream_t stream);
void nb_cuda_matmul_residual_forward_bf16(nb_bf16 *out, const nb_bf16 *inp, const nb_bf16 *w, const nb_bf16 *bias,
                                          const nb_bf16 *resid, int N, int C, int OC, nb_blas_t lt,
                                          nb_stream_t stream);
/* As nb_cuda_matmul_backward, but dinp is WRITTEN (=), not accumulated: no memset before it, no
 * read of it. dw, dbias accumulate. */
void nb_cuda_matmul_backward_set_f32(float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                                     const float *w, int N, int C, int OC, nb_blas_t lt, nb_stream_t stream);
void nb_cuda_matmul_backward_set_bf16(nb_bf16 *dinp, float *dw, float *dbias, const nb_bf16 *dout,
                                      const nb_bf16 *inp, const nb_bf16 *w, int N, int C, int OC, nb_blas_t lt,
                                      nb_stream_t stream);
/* The backward of out = gelu(pre) @ w^T + bias with inp = gelu(pre) (an MLP's second linear):
 * dw += dout^T @ inp, dbias += column sums of dout, dpre[N,C] = gelu'(pre) * (dout @ w) WRITTEN
 * (not accumulated: it replaces a zeroed buffer, a GEMM and nb_cuda_gelu_backward), and
 * dbias_pre[C] += column sums of dpre (the first linear's bias gradient; NULL skips). bf16: the
 * GELU derivative in cuBLASLt's DGELU epilogue; fp32: GEMM then nb_cuda_gelu_backward_scale. */
void nb_cuda_matmul_dgelu_backward_f32(float *dpre, float *dw, float *dbias, float *dbias_pre, const float *dout,
                                       const float *inp, const float *w, const float *pre, int N, int C, int OC,
                                       nb_blas_t lt, nb_stream_t stream);
void nb_cuda_matmul_dgelu_backward_bf16(nb_bf16 *dpre, float *dw, float *dbias, float *dbias_pre,
                                        const nb_bf16 *dout, const nb_bf16 *inp, const nb_bf16 *w,
                                        const nb_bf16 *pre, int N, int C, int OC, nb_blas_t lt,
                                        nb_stream_t stream);

/* ---- norm.cu ---- */
void nb_cuda_layernorm_forward_f32(float *out, float *mean, float *rstd, const float *inp, const float *w,
                                   const float *b, int N, int C, float eps, nb_stream_t stream);
void nb_cuda_layernorm_forward_bf16(nb_bf16 *out, float *mean, float *rstd, const nb_bf16 *inp,
                                    const nb_bf16 *w, const nb_bf16 *b, int N, int C, float eps,
                                    nb_stream_t stream);
void nb_cuda_layernorm_backward_f32(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                                    const float *w, const float *mean, const float *rstd, int N, int C,
                                    nb_stream_t stream);
void nb_cuda_layernorm_backward_bf16(nb_bf16 *dinp, float *dw, float *db, const nb_bf16 *dout,
                                     const nb_bf16 *inp, const nb_bf16 *w, const float *mean,
                                     const float *rstd, int N, int C, nb_stream_t stream);
void nb_cuda_rmsnorm_forward_f32(float *out, float *rstd, const float *inp, const float *w, int N, int C,
                                 float eps, nb_stream_t stream);
void nb_cuda_rmsnorm_forward_bf16(nb_bf16 *out, float *rstd, const nb_bf16 *inp, const nb_bf16 *w, int N,
                                  int C, float eps, nb_stream_t stream);
void nb_cuda_rmsnorm_backward_f32(float *dinp, float *dw, const float *dout, const float *inp,
                                  const float *w, const float *rstd, int N, int C, nb_stream_t stream);
void nb_cuda_rmsnorm_backward_bf16(nb_bf16 *dinp, float *dw, const nb_bf16 *dout, const nb_bf16 *inp,
                                   const nb_bf16 *w, const float *rstd, int N, int C, nb_stream_t stream);
/* per-head RMSNorm on a strided view, in place (norm.cu), as nb_headnorm_forward / nb_headnorm_backward */
void nb_cuda_headnorm_forward_f32(float *x, float *x_in, float *rstd, const float *w, int N, int nh, int HS,
                                  int stride, float eps, nb_stream_t stream);
void nb_cuda_headnorm_forward_bf16(nb_bf16 *x, nb_bf16 *x_in, float *rstd, const nb_bf16 *w, int N, int nh, int HS,
                                   int stride, float eps, nb_stream_t stream);
void nb_cuda_headnorm_backward_f32(float *dx, float *dw, const float *x_in, const float *w, const float *rstd, int N,
                                   int nh, int HS, int stride, nb_stream_t stream);
void nb_cuda_headnorm_backward_bf16(nb_bf16 *dx, float *dw, const nb_bf16 *x_in, const nb_bf16 *w, const float *rstd,
                                    int N, int nh, int HS, int stride, nb_stream_t stream);

/* ---- act.cu ---- */
void nb_cuda_gelu_forward_f32(float *out, const float *inp, size_t n, nb_stream_t stream);
void nb_cuda_gelu_forward_bf16(nb_bf16 *out, const nb_bf16 *inp, size_t n, nb_stream_t stream);
void nb_cuda_gelu_backward_f32(float *dinp, const float *inp, const float *dout, size_t n, nb_stream_t stream);
void nb_cuda_gelu_backward_bf16(nb_bf16 *dinp, const nb_bf16 *inp, const nb_bf16 *dout, size_t n,
                                nb_stream_t stream);
/* x[i] = gelu'(pre[i]) * x[i], in place (x != pre). */
void nb_cuda_gelu_backward_scale_f32(float *x, const float *pre, size_t n, nb_stream_t stream);
void nb_cuda_gelu_backward_scale_bf16(nb_bf16 *x, const nb_bf16 *pre, size_t n, nb_stream_t stream);
void nb_cuda_swiglu_forward_f32(float *out, const float *gu, int N, int F, nb_stream_t stream);
void nb_cuda_swiglu_forward_bf16(nb_bf16 *out, const nb_bf16 *gu, int N, int F, nb_stream_t stream);
void nb_cuda_swiglu_backward_f32(float *dgu, const float *dout, const float *gu, int N, int F,
                                 nb_stream_t stream);
void nb_cuda_swiglu_backward_bf16(nb_bf16 *dgu, const nb_bf16 *dout, const nb_bf16 *gu, int N, int F,
                                  nb_stream_t stream);
/* As nb_cuda_swiglu_backward, writing dgu (=) instead of adding to it. */
void nb_cuda_swiglu_backward_set_f32(float *dgu, const float *dout, const float *gu, int N, int F,
                                     nb_stream_t stream);
void nb_cuda_swiglu_backward_set_bf16(nb_bf16 *dgu, const nb_bf16 *dout, const nb_bf16 *gu, int N, int F,
                                      nb_stream_t stream);
void nb_cuda_residual_forward_f32(float *out, const float *a, const float *b, size_t n, nb_stream_t stream);
void nb_cuda_residual_forward_bf16(nb_bf16 *out, const nb_bf16 *a, const nb_bf16 *b, size_t n,
                                   nb_stream_t stream);
void nb_cuda_add_inplace_f32(float *dst, const float *src, size_t n, nb_stream_t stream);
void nb_cuda_add_inplace_bf16(nb_bf16 *dst, const nb_bf16 *src, size_t n, nb_stream_t stream);
/* nb_scale_cols (ops.h) on the device, the arithmetic in fp32. */
void nb_cuda_scale_cols_f32(float *dst, int ld_dst, const float *src, int ld_src, int rows, int cols, float alpha,
                            int acc, nb_stream_t stream);
void nb_cuda_scale_cols_bf16(nb_bf16 *dst, int ld_dst, const nb_bf16 *src, int ld_src, int rows, int cols,
                             float alpha, int acc, nb_stream_t stream);
/* dst = src converted (bf16: round to nearest even). */
/* Elements [first, first + len) of nb_rng_fill_normal's sequence (first even) into device out;
 * the index (from first) of each element whose double lies within margin (relative) of a float
 * rounding boundary is appended to list (cap entries; *count counts them all). fill.cu. */
void nb_cuda_fill_normal(float *out, size_t first, size_t len, uint64_t seed, uint64_t stream, float mean, float std,
                         double margin, uint32_t *list, uint32_t cap, unsigned int *count, nb_stream_t stream_);
/* The relative distance to a rounding boundary under which the host redraws an element: 64 ulps
 * of a double, far beyond the few ulps CUDA's and glibc's log/sin/cos may differ by. */
#define NB_FILL_MARGIN 0x1p-46
/* n elements of nb_rng_fill_normal's sequence into host memory out, drawn on the GPU, listed
 * elements redrawn on the host (backend_cuda.c): the same bits. Returns how many were redrawn.
 * Synchronous. */
size_t nb_cuda_fill_normal_host(float *out, size_t n, uint64_t seed, uint64_t stream, float mean, float std,
                                double margin, nb_stream_t s);
void nb_cuda_cast_f32_to_bf16(nb_bf16 *dst, const float *src, size_t n, nb_stream_t stream);
void nb_cuda_cast_bf16_to_f32(float *dst, const nb_bf16 *src, size_t n, nb_stream_t stream);

/* ---- rope.cu ---- (in place, as nb_rope_forward / nb_rope_backward) */
void nb_cuda_rope_forward_f32(float *x, int B, int T, int nheads, int HS, int row_stride, const nb_rope *r,
                              nb_stream_t stream);
void nb_cuda_rope_forward_bf16(nb_bf16 *x, int B, int T, int nheads, int HS, int row_stride, const nb_rope *r,
                               nb_stream_t stream);
void nb_cuda_rope_backward_f32(float *dx, int B, int T, int nheads, int HS, int row_stride, const nb_rope *r,
                               nb_stream_t stream);
void nb_cuda_rope_backward_bf16(nb_bf16 *dx, int B, int T, int nheads, int HS, int row_stride, const nb_rope *r,
                                nb_stream_t stream);

/* ---- attention.cu ---- (causal, GQA, tiled: never stores T x T; HS even and <= 256) */
void nb_cuda_attention_forward_f32(float *out, float *lse, const float *qkv, int B, int T, int NH, int NKV,
                                   int HS, nb_stream_t stream);
void nb_cuda_attention_forward_bf16(nb_bf16 *out, float *lse, const nb_bf16 *qkv, int B, int T, int NH,
                                    int NKV, int HS, nb_stream_t stream);
void nb_cuda_attention_backward_f32(float *dqkv, const float *dout, const float *qkv, const float *out,
                                    const float *lse, int B, int T, int NH, int NKV, int HS,
                                    nb_stream_t stream);
void nb_cuda_attention_backward_bf16(nb_bf16 *dqkv, const nb_bf16 *dout, const nb_bf16 *qkv,
                                     const nb_bf16 *out, const float *lse, int B, int T, int NH, int NKV,
                                     int HS, nb_stream_t stream);

/* As nb_cuda_attention_backward, writing dqkv (=) instead of adding to it: bf16 through the
 * tensor-core kernels' store-instead-of-add mode; other shapes and fp32: a memset of dqkv, then
 * the accumulating backward. */
void nb_cuda_attention_backward_set_f32(float *dqkv, const float *dout, const float *qkv, const float *out,
                                        const float *lse, int B, int T, int NH, int NKV, int HS,
                                        nb_stream_t stream);
void nb_cuda_attention_backward_set_bf16(nb_bf16 *dqkv, const nb_bf16 *dout, const nb_bf16 *qkv,
                                         const nb_bf16 *out, const float *lse, int B, int T, int NH, int NKV,
                                         int HS, nb_stream_t stream);

/* ---- attention_fa.cu ---- the tensor-core kernels behind the bf16 launchers above: 1 when they
 * took the call, 0 when the shape is not theirs (head sizes other than 64 and 128, tensors not
 * 16-byte aligned). acc 1: dqkv += the gradient (the op's contract); 0: dqkv = the gradient
 * (every element of the q, k and v columns stored once, the old contents never read). */
int nb_cuda_attention_fa_forward_bf16(nb_bf16 *out, float *lse, const nb_bf16 *qkv, int B, int T, int NH, int NKV,
                                      int HS, nb_stream_t stream);
int nb_cuda_attention_fa_backward_bf16(nb_bf16 *dqkv, const nb_bf16 *dout, const nb_bf16 *qkv, const nb_bf16 *out,
                                       const float *lse, int B, int T, int NH, int NKV, int HS, nb_stream_t stream);
int nb_cuda_attention_fa_backward_mode_bf16(nb_bf16 *dqkv, const nb_bf16 *dout, const nb_bf16 *qkv,
                                            const nb_bf16 *out, const float *lse, int B, int T, int NH, int NKV,
                                            int HS, int acc, nb_stream_t stream);

/* ---- attention_cudnn.c ---- cuDNN 9's fused flash attention (SDPA), bf16, the same causal GQA
 * attention and layouts as above, through the backend API of a libcudnn.so.9 opened at run time
 * (nothing links it). The state (handle, plans, the record below) is the backend instance's b
 * (b->attn_state, made with the CUDA instance). Each returns 0 when cuDNN ran the call, nonzero
 * when the caller must run our kernels instead (no cuDNN, a shape or alignment it does not take,
 * a graph it refuses, a shape first seen inside a graph capture); the first refusal is said once
 * on stderr. lse is cuDNN's Stats, the same max + log(sum exp) as ours. The backward WRITES (=)
 * all of dqkv. deterministic: the variant without dQ atomics (bitwise repeatable); 0: cuDNN's
 * faster default, which sums dQ with fp32 atomics (the bits vary run to run). */
typedef struct nb_attn_state nb_attn_state;
int nb_cudnn_attention_forward_bf16(const nb_backend *b, nb_bf16 *out, float *lse, const nb_bf16 *qkv, int B,
                                    int T, int NH, int NKV, int HS, nb_stream_t stream);
int nb_cudnn_attention_backward_set_bf16(const nb_backend *b, nb_bf16 *dqkv, const nb_bf16 *dout,
                                         const nb_bf16 *qkv, const nb_bf16 *out, const float *lse, int B, int T,
                                         int NH, int NKV, int HS, int deterministic, nb_stream_t stream);
/* cuDNN's version (91900 for 9.19.0) when libcudnn.so.9 loads here, else 0 and why. */
int nb_cudnn_available(char *why, size_t cap);
/* Device bytes one call of a built plan takes as scratch (0 if none was built for the shape). */
size_t nb_cudnn_attention_workspace(const nb_backend *b, int B, int T, int NH, int NKV, int HS, int backward,
                                    int deterministic);
/* An instance's state (backend_cuda.c makes it with the instance, and frees it after its lanes). */
nb_attn_state *nb_attn_state_create(const nb_backend *b);
void nb_attn_state_destroy(nb_attn_state *st);

/* The mode a call of T tokens runs (ops/backend.h's nb_attn_mode, the instance's b->attn): auto
 * resolved (bench/RESULTS.md, session 9: at T = 1024 cuDNN's deterministic pair takes gpt2's
 * step from 65.8 to 60.2 ms; at T = 256 the proxy's step is 2% slower with it, a plan's fixed
 * cost against short tiles). */
#define NB_ATTN_AUTO_MIN_T 512
nb_attn_mode nb_attn_mode_for(nb_attn_mode mode, int T);
/* Which implementation ran: per direction the last call and the counts, and the first reason
 * cuDNN refused a call; for the run's summary (nb_attn_report) and the tests. Per instance. */
typedef enum { NB_ATTN_RAN_NONE, NB_ATTN_RAN_OURS, NB_ATTN_RAN_CUDNN, NB_ATTN_RAN_CUDNN_FAST } nb_attn_ran;
#define NB_ATTN_WHY_BYTES 480
typedef struct {
    nb_attn_ran last[2]; /* [0] forward, [1] backward */
    long count[2][4];    /* [direction][nb_attn_ran] */
    char why[NB_ATTN_WHY_BYTES]; /* "" while cuDNN took every call asked of it */
} nb_attn_record;
void nb_attn_note(const nb_backend *b, int backward, nb_attn_ran ran);
nb_attn_record nb_attn_record_get(const nb_backend *b);
const char *nb_attn_ran_name(nb_attn_ran r);
/* One or two summary lines on stderr when the instance's mode asked for cuDNN; nothing
 * otherwise (nor for a CPU instance). */
void nb_attn_report(const nb_backend *b);

/* ---- embed.cu ---- V = rows of wte. A token outside [0, V) makes its output row NaN (forward)
 * and is skipped (backward): device data cannot be checked on the host without a sync. */
void nb_cuda_embed_forward_f32(float *out, const int32_t *tokens, const float *wte, const float *wpe, int B,
                               int T, int C, int V, nb_stream_t stream);
void nb_cuda_embed_forward_bf16(nb_bf16 *out, const int32_t *tokens, const nb_bf16 *wte, const nb_bf16 *wpe,
                                int B, int T, int C, int V, nb_stream_t stream);
/* dwte[token] += dout row in token order (one writer per vocabulary row), dwpe[t] += sum over b. */
void nb_cuda_embed_backward_f32(float *dwte, float *dwpe, const float *dout, const int32_t *tokens, int B,
                                int T, int C, int V, nb_stream_t stream);
void nb_cuda_embed_backward_bf16(float *dwte, float *dwpe, const nb_bf16 *dout, const int32_t *tokens,
                                 int B, int T, int C, int V, nb_stream_t stream);

/* ---- xent.cu ---- As nb_xent_forward_backward, but losses[N] (required) stays on the device:
 * nothing is returned, so nothing waits. A target outside [0, V) gives a NaN loss and no
 * gradient for its row. nb_cuda_sum_f64 turns losses into their sum. The bf16 variant keeps
 * the logits in bf16 (the GEMM's output, as torch autocast) and computes in fp32 from them: its
 * loss and gradient are those of the bf16-rounded logits. */
void nb_cuda_xent_forward_backward_f32(float *dinp, float *dw, float *losses, const float *inp,
                                       const float *w, const int32_t *targets, int N, int C, int V,
                                       float grad_scale, int chunk_rows, nb_blas_t lt, nb_stream_t stream);
void nb_cuda_xent_forward_backward_bf16(nb_bf16 *dinp, float *dw, float *losses, const nb_bf16 *inp,
                                        const nb_bf16 *w, const int32_t *targets, int N, int C, int V,
                                        float grad_scale, int chunk_rows, nb_blas_t lt, nb_stream_t stream);
/* The same, for a w with w_rows >= V rows (a padded vocabulary): the GEMMs then run over V
 * rounded up to 64 columns (aligned, tensor cores) using the padding rows, whose logits are left
 * out of the softmax and get zero gradient (dw's padding rows only get += 0). */
void nb_cuda_xent_padded_f32(float *dinp, float *dw, float *losses, const float *inp, const float *w,
                             const int32_t *targets, int N, int C, int V, int w_rows, float grad_scale,
                             int chunk_rows, nb_blas_t lt, nb_stream_t stream);
void nb_cuda_xent_padded_bf16(nb_bf16 *dinp, float *dw, float *losses, const nb_bf16 *inp, const nb_bf16 *w,
                              const int32_t *targets, int N, int C, int V, int w_rows, float grad_scale,
                              int chunk_rows, nb_blas_t lt, nb_stream_t stream);
/* The same, the gradient scale grad_scale times *scale_by (a device float read by the kernel, so a
 * captured graph replays with the value of the time it runs; NULL: grad_scale alone). */
void nb_cuda_xent_scaled_f32(float *dinp, float *dw, float *losses, const float *inp, const float *w,
                             const int32_t *targets, int N, int C, int V, int w_rows, float grad_scale,
                             const float *scale_by, int chunk_rows, nb_blas_t lt, nb_stream_t stream);
void nb_cuda_xent_scaled_bf16(nb_bf16 *dinp, float *dw, float *losses, const nb_bf16 *inp, const nb_bf16 *w,
                              const int32_t *targets, int N, int C, int V, int w_rows, float grad_scale,
                              const float *scale_by, int chunk_rows, nb_blas_t lt, nb_stream_t stream);
/* *out = sum of x[0..n) in double, fixed order (out is a device pointer). */
void nb_cuda_sum_f64(double *out, const float *x, size_t n, nb_stream_t stream);

/* ---- ops/adamw.cu: optim/optim.h's formulas on the device ---- */
/* nb_adamw_update over n contiguous fp32 elements (a slab of tensors sharing cfg), and, if
 * params_bf16 != NULL, the bf16 copy of the updated params written in the same pass. */
void nb_cuda_adamw_update(float *params, const float *grads, float *m, float *v, nb_bf16 *params_bf16,
                          size_t n, nb_adamw_cfg cfg, int t, nb_stream_t stream);
/* The same update with the step's scalars (nb_adamw_prepare) and the clip factor in device
 * memory (clip_dev may be NULL: no clipping): what a captured CUDA graph replays. */
void nb_cuda_adamw_apply(float *params, const float *grads, float *m, float *v, nb_bf16 *params_bf16, size_t n,
                         const nb_adamw_scalars *k_dev, const float *clip_dev, nb_stream_t stream);
/* nb_adamw_apply_spans in one launch (several past 256 tensors): span i updates elements
 * [offset, offset + numel) of the fp32 slabs (and of params_bf16 when not NULL) with
 * k_dev[spans[i].scalars]. The clip factor nb_clip_factor(sqrt(*sumsq_dev), max_norm) is formed
 * in the kernel (sumsq_dev NULL: no clipping). spans is host memory, read before this returns
 * (a captured graph keeps its values); ascending, disjoint. Bitwise nb_adamw_apply per span. */
void nb_cuda_adamw_apply_spans(float *params, const float *grads, float *m, float *v, nb_bf16 *params_bf16,
                               const nb_adamw_span *spans, int nspans, const nb_adamw_scalars *k_dev,
                               const double *sumsq_dev, float max_norm, nb_stream_t stream);
/* *out = nb_clip_factor(sqrt(*sumsq), max_norm), computed on the device (pointers on the device). */
void nb_cuda_clip_factor(float *out, const double *sumsq, float max_norm, nb_stream_t stream);
/* *out = sum of g^2 in double, fixed order (device pointer): the global-norm clip's input. */
void nb_cuda_sumsq(double *out, const float *g, size_t n, nb_stream_t stream);
/* part[b] = nb_sumsq_block(g + b * NB_SUMSQ_BLOCK, ...) for every block of g[0..n): the host's
 * order and roundings (four double lanes, no fused multiply-add), so the same bits. */
void nb_cuda_sumsq_blocks(double *part, const float *g, size_t n, nb_stream_t stream);
void nb_cuda_scale_inplace(float *g, size_t n, float s, nb_stream_t stream);

#ifdef __cplusplus
}
#endif
#endif
