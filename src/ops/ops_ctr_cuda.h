/* CUDA versions of the seqctr ops (backend_ctr.h's table; CPU references in ops_ctr.h and
 * optim_sparse.h). Same shapes and semantics as the table entries, device pointers, and
 * ops_cuda.h's conventions: every launcher enqueues on `stream` and returns without waiting;
 * _f32 (true fp32, TF32 off) and _bf16 (bf16 activations and compute weights, fp32 accumulation)
 * variants; parameter gradients and embedding tables are fp32; backward ACCUMULATES (+=) unless
 * the entry says it overwrites; a NULL gradient is not computed; no float atomics, so two runs on
 * one GPU give the same bits. Scratch comes from ops_cuda.h's stream-ordered pool.
 *
 * Index arrays (rows, dst/src offsets, order, seg, history offsets) are device memory the host
 * filled (or nb_cuda_ctr_lists / nb_cuda_emb_unique_groups built); the kernels cannot check them
 * without a sync, so a bad one is the caller's bug. A
 * history offset pair with off[b+1] < off[b] is an empty history; a length above max_len only
 * costs speed (max_len sizes shared-memory tiles, it does not bound the loops). */
#ifndef NB_OPS_CTR_CUDA_H
#define NB_OPS_CTR_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "ops/ops_ctr.h"
#include "ops/ops_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- embeddings (embag.cu) ---- */
/* out[dst[i] + e] = table[rows[i] * E + e] for i < n, e < E */
void nb_cuda_emb_gather_f32(float *out, const int64_t *dst, const float *table, const int64_t *rows, int n, int E,
                            nb_stream_t stream);
void nb_cuda_emb_gather_bf16(nb_bf16 *out, const int64_t *dst, const float *table, const int64_t *rows, int n,
                             int E, nb_stream_t stream);
/* dunique[u, e] = sum over k = seg[u] .. seg[u+1]-1 in k order of src[src_off[order[k]] + e]
 * (OVERWRITES dunique [U, E], fp32). count: NULL, or the number of rows in device memory (the
 * device's deduplication wrote it) and U only its upper bound; likewise for the sparse optimizers.
 * n: the lookups (seg[U]) or an upper bound: the chunk sums' scratch holds a slot per
 * NB_EMB_GRAD_CHUNK of them (chunks past it are summed by pass 2 itself: same bits, far slower). */
void nb_cuda_emb_grad_unique_f32(float *dunique, const float *src, const int64_t *src_off, const int32_t *order,
                                 const int32_t *seg, const int32_t *count, int U, int n, int E, nb_stream_t stream);
void nb_cuda_emb_grad_unique_bf16(float *dunique, const nb_bf16 *src, const int64_t *src_off, const int32_t *order,
                                  const int32_t *seg, const int32_t *count, int U, int n, int E, nb_stream_t stream);
/* The same gradient (src bf16 where src_bf16, else fp32) applied to table[rows[u]] by element-wise
 * Adagrad (nb_cuda_exact_adagrad's operations) as each row's sum completes; scratch [U, E] fp32
 * holds the first chunk sums of rows of several chunks. The two launches in turn, the same bits. */
void nb_cuda_emb_grad_adagrad(float *table, float *acc, const int64_t *rows, float *scratch, const void *src,
                              int src_bf16, const int64_t *src_off, const int32_t *order, const int32_t *seg,
                              const int32_t *count, int U, int n, int E, float lr, float eps, nb_stream_t stream);

/* ---- lookup lists and their deduplication on the device (ctr_lists.cu): ops_ctr.h's
 * nb_ctr_lists and nb_embag_unique_groups (without inverse), the same outputs bit for bit. The
 * unique rows' count goes to *count (device memory), nothing waits. rows must be < 2^32. ---- */
void nb_cuda_ctr_lists(const nb_ctr_lists_shape *s, const uint32_t *cat, const uint32_t *target, const uint32_t *hist,
                       int64_t *rows, int64_t *dst, int64_t *src, nb_stream_t stream);
/* after nb_cuda_ctr_lists on the same stream (ops_ctr.h's nb_ctr_lists_mv) */
void nb_cuda_ctr_lists_mv(const nb_ctr_lists_shape *s, const uint32_t *mv, const int32_t *moff, int64_t *rows,
                          int64_t *dst, int64_t *src, int32_t *before, nb_stream_t stream);
void nb_cuda_emb_unique_groups(int64_t *uniq, int32_t *order, int32_t *seg, int32_t *count, const int64_t *rows,
                               int n, int64_t maxrow, nb_stream_t stream);

/* ---- sparse optimizers (ops/sparse_optim.cu): optim/optim_sparse.h's formulas on U strictly increasing
 * rows; the CPU's float operations one by one (no FMA contraction), so results match it. ---- */
void nb_cuda_rowwise_adagrad(float *table, float *acc, const int64_t *rows, const float *grads, const int32_t *count,
                             int U, int E, float lr, float eps, nb_stream_t stream);
void nb_cuda_exact_adagrad(float *table, float *acc, const int64_t *rows, const float *grads, const int32_t *count,
                           int U, int E, float lr, float eps, nb_stream_t stream);
void nb_cuda_sparse_adam(float *table, float *m, float *v, const int64_t *rows, const float *grads, const int32_t *count,
                         int U, int E, float lr, float beta1, float beta2, float eps, int t, nb_stream_t stream);

/* ---- DCNv2 low-rank cross (cross.cu): c = x0 * (vx @ Uw^T + b) + x, vx = x @ Vw (saved), and
 * u = vx @ Uw^T + b (saved where u is not NULL; the backward makes it again where its u is NULL) ---- */
void nb_cuda_cross_forward_f32(float *c, float *vx, float *u, const float *x0, const float *x, const float *Uw,
                               const float *Vw, const float *b, int N, int D, int r, nb_blas_t lt, nb_stream_t stream);
void nb_cuda_cross_forward_bf16(nb_bf16 *c, nb_bf16 *vx, nb_bf16 *u, const nb_bf16 *x0, const nb_bf16 *x,
                                const nb_bf16 *Uw, const nb_bf16 *Vw, const nb_bf16 *b, int N, int D, int r, nb_blas_t lt,
                                nb_stream_t stream);
/* dx0 (act dtype), dU, dV, db (fp32): +=; dx (act dtype) written; each may be NULL */
void nb_cuda_cross_backward_f32(float *dx0, float *dx, float *dU, float *dV, float *db, const float *dc,
                                const float *x0, const float *x, const float *Uw, const float *Vw, const float *b,
                                const float *vx, const float *u, int N, int D, int r, nb_blas_t lt, nb_stream_t stream);
void nb_cuda_cross_backward_bf16(nb_bf16 *dx0, nb_bf16 *dx, float *dU, float *dV, float *db, const nb_bf16 *dc,
                                 const nb_bf16 *x0, const nb_bf16 *x, const nb_bf16 *Uw, const nb_bf16 *Vw,
                                 const nb_bf16 *b, const nb_bf16 *vx, const nb_bf16 *u, int N, int D, int r, nb_blas_t lt,
                                 nb_stream_t stream);

/* ---- ReLU (relu.cu), one-output linear (linear1.cu), BCE (bce.cu), column slices (cols.cu) ---- */
void nb_cuda_relu_forward_f32(float *out, const float *inp, size_t n, nb_stream_t stream);
void nb_cuda_relu_forward_bf16(nb_bf16 *out, const nb_bf16 *inp, size_t n, nb_stream_t stream);
void nb_cuda_relu_backward_f32(float *dinp, const float *inp, const float *dout, size_t n, nb_stream_t stream);
void nb_cuda_relu_backward_bf16(nb_bf16 *dinp, const nb_bf16 *inp, const nb_bf16 *dout, size_t n,
                                nb_stream_t stream);
/* z[i] = w . x[i] + b[0] (b may be NULL) */
void nb_cuda_linear1_forward_f32(float *z, const float *x, const float *w, const float *b, int N, int D,
                                 nb_stream_t stream);
void nb_cuda_linear1_forward_bf16(float *z, const nb_bf16 *x, const nb_bf16 *w, const nb_bf16 *b, int N, int D,
                                  nb_stream_t stream);
/* dx += dz[i] w; dw += sum_i dz[i] x[i]; db += sum_i dz[i] */
void nb_cuda_linear1_backward_f32(float *dx, float *dw, float *db, const float *dz, const float *x, const float *w,
                                  int N, int D, nb_stream_t stream);
void nb_cuda_linear1_backward_bf16(nb_bf16 *dx, float *dw, float *db, const float *dz, const nb_bf16 *x,
                                   const nb_bf16 *w, int N, int D, nb_stream_t stream);
/* dz[i] += scale * (sigmoid(z[i]) - y[i]); *loss += scale * sum_i l_i (double, fixed order) */
void nb_cuda_bce_logits(float *dz, double *loss, const float *z, const float *y, int N, float scale,
                        nb_stream_t stream);
/* dst[i * ld_dst + j] = (or +=) src[i * ld_src + j] */
void nb_cuda_copy_cols_f32(float *dst, int ld_dst, const float *src, int ld_src, int rows, int cols,
                           nb_stream_t stream);
void nb_cuda_copy_cols_bf16(nb_bf16 *dst, int ld_dst, const nb_bf16 *src, int ld_src, int rows, int cols,
                            nb_stream_t stream);
void nb_cuda_add_cols_f32(float *dst, int ld_dst, const float *src, int ld_src, int rows, int cols,
                          nb_stream_t stream);
void nb_cuda_add_cols_bf16(nb_bf16 *dst, int ld_dst, const nb_bf16 *src, int ld_src, int rows, int cols,
                           nb_stream_t stream);

/* ---- multi-valued pooling (mvpool.cu): nb_mvpool_forward / _backward ---- */
void nb_cuda_mvpool_forward_f32(float *out, int ld_out, const float *table, const int64_t *rows, const int32_t *before,
                                const int32_t *off, int off_stride, int B, int E, int mean, nb_stream_t stream);
void nb_cuda_mvpool_forward_bf16(nb_bf16 *out, int ld_out, const float *table, const int64_t *rows,
                                 const int32_t *before, const int32_t *off, int off_stride, int B, int E, int mean,
                                 nb_stream_t stream);
void nb_cuda_mvpool_backward_f32(float *dvals, float *dout, int ld_out, const int32_t *off, int off_stride,
                                 int B, int E, int mean, nb_stream_t stream);
void nb_cuda_mvpool_backward_bf16(nb_bf16 *dvals, nb_bf16 *dout, int ld_out, const int32_t *off,
                                  int off_stride, int B, int E, int mean, nb_stream_t stream);

/* ---- attention over packed histories (seqattn.cu); E / H <= 64. bf16 self-attention runs on
 * seqattn_tc.cu's tensor cores where they take the shape (head sizes 16, 32, 64, rows 8-byte
 * aligned), the CUDA-core kernels otherwise and for fp32. ---- */
void nb_cuda_seqattn_forward_f32(float *out, float *lse, const float *qkv, const int32_t *off, int B, int max_len,
                                 int H, int E, nb_stream_t stream);
void nb_cuda_seqattn_forward_bf16(nb_bf16 *out, float *lse, const nb_bf16 *qkv, const int32_t *off, int B,
                                  int max_len, int H, int E, nb_stream_t stream);
void nb_cuda_seqattn_backward_f32(float *dqkv, const float *dout, const float *qkv, const float *out,
                                  const float *lse, const int32_t *off, int B, int max_len, int H, int E,
                                  nb_stream_t stream);
void nb_cuda_seqattn_backward_bf16(nb_bf16 *dqkv, const nb_bf16 *dout, const nb_bf16 *qkv, const nb_bf16 *out,
                                   const float *lse, const int32_t *off, int B, int max_len, int H, int E,
                                   nb_stream_t stream);
void nb_cuda_targetattn_forward_f32(float *pooled, float *attn, const float *q, const float *k, const float *v,
                                    const int32_t *off, int B, int max_len, int E, int ldkv, nb_stream_t stream);
void nb_cuda_targetattn_forward_bf16(nb_bf16 *pooled, float *attn, const nb_bf16 *q, const nb_bf16 *k,
                                     const nb_bf16 *v, const int32_t *off, int B, int max_len, int E, int ldkv,
                                     nb_stream_t stream);
void nb_cuda_targetattn_backward_f32(float *dq, float *dk, float *dv, const float *dpooled, const float *q,
                                     const float *k, const float *v, const float *attn, const int32_t *off, int B,
                                     int max_len, int E, int ldkv, nb_stream_t stream);
void nb_cuda_targetattn_backward_bf16(nb_bf16 *dq, nb_bf16 *dk, nb_bf16 *dv, const nb_bf16 *dpooled,
                                      const nb_bf16 *q, const nb_bf16 *k, const nb_bf16 *v, const float *attn,
                                      const int32_t *off, int B, int max_len, int E, int ldkv, nb_stream_t stream);

/* ---- seqattn_tc.cu: the tensor-core self-attention itself: 1 if it took the call, 0 if the
 * shape is not one it has. ---- */
int nb_cuda_seqattn_tc_forward_bf16(nb_bf16 *out, float *lse, const nb_bf16 *qkv, const int32_t *off, int B,
                                    int max_len, int H, int E, nb_stream_t stream);
int nb_cuda_seqattn_tc_backward_bf16(nb_bf16 *dqkv, const nb_bf16 *dout, const nb_bf16 *qkv, const nb_bf16 *out,
                                     const float *lse, const int32_t *off, int B, int max_len, int H, int E,
                                     nb_stream_t stream);

/* ---- dense Adagrad (adagrad.cu): nb_adagrad_dense with neg_lr = k->neg_step, eps = k->eps read
 * from device memory; lowp (NULL: none) gets the new weights in bf16 ---- */
void nb_cuda_adagrad_dense(float *p, const float *g, float *acc, nb_bf16 *lowp, size_t n, const nb_adamw_scalars *k,
                           nb_stream_t stream);

#ifdef __cplusplus
}
#endif
#endif
