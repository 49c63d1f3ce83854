/* The seqctr model's ops that backend.h does not have, as a second table with backend.h's
 * conventions: the same nb_ctx (lane), element type of activations and compute weights =
 * the backend's act_dtype (fp32 on the CPU; bf16 or fp32 on CUDA), parameter gradients fp32,
 * backward ops ACCUMULATE (+=) into gradients unless the entry says "overwrites", NULL skips
 * a gradient, deterministic (fixed summation order, no float atomics).
 *
 * Histories are PACKED (jagged, no padding): sample b's history rows are rows
 * off[b] .. off[b+1]-1 of a [nh, *] tensor, off[0] = 0, off[B] = nh, most recent last. Index
 * arrays (rows, offsets, order, segments) are int64/int32 in backend memory: the host builds
 * them and copies them in, or (lists, unique_groups) the backend builds them from the batch's
 * ids; they depend only on the ids, so both ways give the same lists.
 *
 * Embedding tables are fp32 in backend memory, all tables in one allocation addressed by
 * global row (table offset + row), as ops_ctr.h. */
#ifndef NB_BACKEND_CTR_H
#define NB_BACKEND_CTR_H

#include <stddef.h>
#include <stdint.h>

#include "ops/backend.h"
#include "ops/ops_ctr.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Lookups per chunk of emb_grad_unique's summation order (below). */
#define NB_EMB_GRAD_CHUNK 128

typedef struct nb_ctr_ops_i {
    const char *name;

    /* ---- embeddings ---- */
    /* out[dst[i] + e] = table[rows[i] * E + e] (converted to act_dtype) for i < n, e < E;
     * dst[i] are element offsets into out (so one call fills strided slices of x0). */
    void (*emb_gather)(nb_ctx, void *out, const int64_t *dst, const float *table, const int64_t *rows, int n, int E);
    /* Unique-row gradient, OVERWRITES dunique [U, E] (fp32):
     *   dunique[u, e] = sum over k = seg[u] .. seg[u+1]-1 of src[src_off[order[k]] + e]
     * src is act_dtype; src_off[i] element offsets into src (one per lookup i); order lists the
     * lookups grouped by unique row (within a group by position); seg[U] = number of lookups.
     * Order of the fp32 additions (every table): a row's lookups in chunks of NB_EMB_GRAD_CHUNK
     * from its first one, each chunk summed in k order from 0, then the chunk sums added in chunk
     * order (the first chunk's sum is the start); a row of at most NB_EMB_GRAD_CHUNK lookups is
     * the plain k-order sum. (Chunks let the GPU split a hot row over many warps.)
     * count: NULL (U rows), or the number of rows in backend memory (unique_groups wrote it) with
     * U its upper bound: the host need not wait to learn it. n: the lookups (seg[U]) or an upper
     * bound of them (a GPU sizes its chunk sums' scratch by it). */
    void (*emb_grad_unique)(nb_ctx, float *dunique, const void *src, const int64_t *src_off, const int32_t *order,
                            const int32_t *seg, const int32_t *count, int U, int n, int E);
    /* optim_sparse.h's formulas on the U listed rows (strictly increasing global rows); count as above */
    void (*rowwise_adagrad)(nb_ctx, float *table, float *acc, const int64_t *rows, const float *grads,
                            const int32_t *count, int U, int E, float lr, float eps);
    void (*sparse_adam)(nb_ctx, float *table, float *m, float *v, const int64_t *rows, const float *grads,
                        const int32_t *count, int U, int E, float lr, float beta1, float beta2, float eps, int t);
    void (*exact_adagrad)(nb_ctx, float *table, float *acc, const int64_t *rows, const float *grads,
                          const int32_t *count, int U, int E, float lr, float eps);
    /* emb_grad_unique of src, each unique row's gradient applied by exact_adagrad to rows[u] as soon
     * as it is whole: the two in turn, the same bits, without a pass that writes and one that reads a
     * [U, E] gradient. scratch [U, E] fp32 (afterwards unspecified); count and n as above. */
    void (*emb_grad_adagrad)(nb_ctx, float *table, float *acc, const int64_t *rows, float *scratch, const void *src,
                             const int64_t *src_off, const int32_t *order, const int32_t *seg, const int32_t *count,
                             int U, int n, int E, float lr, float eps);
    /* ops_ctr.h's nb_ctr_lists from the batch's ids (backend memory) */
    void (*lists)(nb_ctx, const nb_ctr_lists_shape *s, const uint32_t *cat, const uint32_t *target,
                  const uint32_t *hist, const int32_t *hoff, int64_t *rows, int64_t *dst, int64_t *src);
    /* ops_ctr.h's nb_ctr_lists_mv (after lists): the multi-valued columns' values mv and offsets moff */
    void (*lists_mv)(nb_ctx, const nb_ctr_lists_shape *s, const uint32_t *mv, const int32_t *moff, int64_t *rows,
                     int64_t *dst, int64_t *src, int32_t *before);
    /* nb_embag_unique_groups of rows[n] (every row <= maxrow < 2^32) into uniq, order, seg and the
     * count of unique rows into *count, all in backend memory */
    void (*unique_groups)(nb_ctx, int64_t *uniq, int32_t *order, int32_t *seg, int32_t *count, const int64_t *rows,
                          int n, int64_t maxrow);

    /* ---- dense pieces ---- */
    /* Dense Adagrad over a slab (ops_ctr.h's nb_adagrad_dense), the rate and eps from k in backend
     * memory (neg_step, eps); params_lowp (NULL: none) gets the new weights in act_dtype. */
    void (*adagrad_dense)(nb_ctx, float *params, const float *grads, float *acc, void *params_lowp, size_t n,
                          const nb_adamw_scalars *k);
    /* DCNv2 low-rank cross (ops_ctr.h's nb_cross_forward/backward): c = x0 * (vx @ Uw^T + b) + x,
     * vx = x @ Vw; x0, x, c [N, D], Uw, Vw [D, r], b [D] (act_dtype), vx [N, r] saved (act_dtype),
     * u = vx @ Uw^T + b [N, D] saved where not NULL (the backward then does not make it again).
     * Backward: dx0 (act_dtype, +=), dx (act_dtype, written: x's whole gradient), dU, dV, db
     * (fp32, +=); any may be NULL. */
    void (*cross_fwd)(nb_ctx, void *c, void *vx, void *u, const void *x0, const void *x, const void *Uw,
                      const void *Vw, const void *b, int N, int D, int r);
    void (*cross_bwd)(nb_ctx, void *dx0, void *dx, float *dU, float *dV, float *db, const void *dc, const void *x0,
                      const void *x, const void *Uw, const void *Vw, const void *b, const void *vx, const void *u,
                      int N, int D, int r);
    /* out = max(inp, 0) (out may alias inp); dinp += dout where inp > 0 */
    void (*relu_fwd)(nb_ctx, void *out, const void *inp, size_t n);
    void (*relu_bwd)(nb_ctx, void *dinp, const void *inp, const void *dout, size_t n);
    /* One-output linear (a logit head): z[i] = w . x[i] + b[0], z fp32 [N]; x [N, D], w [D], b [1].
     * Backward: dx += dz[i] * w (act_dtype), dw += sum_i dz[i] x[i], db += sum_i dz[i] (fp32). */
    void (*linear1_fwd)(nb_ctx, float *z, const void *x, const void *w, const void *b, int N, int D);
    void (*linear1_bwd)(nb_ctx, void *dx, float *dw, float *db, const float *dz, const void *x, const void *w, int N,
                        int D);
    /* BCE with logits (nb_bce_logits_forward_backward): dz[i] += scale * (sigmoid(z[i]) - y[i]) and
     * *loss += scale * sum_i l_i, the sum taken in double in index order (dz, loss: backend
     * memory, fp32 z/y/dz, loss a double; dz or loss may be NULL). */
    void (*bce)(nb_ctx, float *dz, double *loss, const float *z, const float *y, int N, float scale);
    /* dst[i * ld_dst + j] = src[i * ld_src + j], i < rows, j < cols (act_dtype; slices of x0) */
    void (*copy_cols)(nb_ctx, void *dst, int ld_dst, const void *src, int ld_src, int rows, int cols);
    /* dst[i * ld_dst + j] += src[i * ld_src + j] */
    void (*add_cols)(nb_ctx, void *dst, int ld_dst, const void *src, int ld_src, int rows, int cols);
    /* Multi-valued columns (ops_ctr.h's nb_mvpool_forward / _backward): the slot out [B, ld_out]
     * holds each sample's first value; it becomes the sum (mean: times 1/n) of it and its other
     * values' rows of the fp32 table (rows and before: lists_mv's), each rounded to act_dtype as a
     * gather would; backward dvals += the slot's gradient (times 1/n) at rows off[i * off_stride]
     * + 1 .. of dvals [*, E], then (mean) the slot's gradient dout is scaled by 1/n in place: the
     * first value's (act_dtype, off int32). */
    void (*mvpool_fwd)(nb_ctx, void *out, int ld_out, const float *table, const int64_t *rows, const int32_t *before,
                       const int32_t *off, int off_stride, int B, int E, int mean);
    void (*mvpool_bwd)(nb_ctx, void *dvals, void *dout, int ld_out, const int32_t *off, int off_stride, int B,
                       int E, int mean);

    /* ---- attention over packed histories ---- */
    /* Self-attention of every sample's history over itself (not causal), H heads of E / H,
     * scale 1/sqrt(E / H): qkv [nh, 3E] (q | k | v, head h = columns h*E/H ..), out [nh, E],
     * lse [nh * H] fp32 (sample b's block starts at off[b] * H, head-major: + h * len_b + i). */
    void (*seqattn_fwd)(nb_ctx, void *out, float *lse, const void *qkv, const int32_t *off, int B, int max_len, int H,
                        int E);
    void (*seqattn_bwd)(nb_ctx, void *dqkv, const void *dout, const void *qkv, const void *out, const float *lse,
                        const int32_t *off, int B, int max_len, int H, int E);
    /* Target attention (nb_targetattn_forward on packed rows): q [B, E]; k, v rows off[b].. of
     * [nh, *] with row stride ldkv; pooled [B, E] (zero for an empty history); attn [nh] fp32
     * (the softmax weights, saved). max_len bounds off[b+1] - off[b]. */
    void (*targetattn_fwd)(nb_ctx, void *pooled, float *attn, const void *q, const void *k, const void *v,
                           const int32_t *off, int B, int max_len, int E, int ldkv);
    void (*targetattn_bwd)(nb_ctx, void *dq, void *dk, void *dv, const void *dpooled, const void *q, const void *k,
                           const void *v, const float *attn, const int32_t *off, int B, int max_len, int E,
                           int ldkv);
} nb_ctr_ops_i;

extern const nb_ctr_ops_i nb_ctr_ops_cpu;
#ifdef NB_WITH_CUDA
extern const nb_ctr_ops_i nb_ctr_ops_cuda_bf16;
extern const nb_ctr_ops_i nb_ctr_ops_cuda_f32;
#endif
/* The table that goes with a backend of backend.h (fails for one without ctr ops). */
const nb_ctr_ops_i *nb_ctr_ops_for(const nb_backend_i *be);
/* The same backend's table with fp32 activations (the tables' own rows and gradients, e.g. the
 * rows sharded tables exchange): the fp32 CUDA table for either CUDA backend, the CPU's on the CPU. */
const nb_ctr_ops_i *nb_ctr_ops_f32_for(const nb_backend_i *be);

#ifdef __cplusplus
}
#endif
#endif
