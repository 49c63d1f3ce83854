/* CPU fp32 ops of the seqctr model (CTR / sequence recommendation) that ops.h does not cover:
 * embedding lookups and bags with a deduplicated (unique-row) backward, the low-rank DCNv2 cross,
 * ReLU, the one-output linear, column slices, BCE-with-logits, masked self-attention over jagged
 * histories and target attention. Each op family is a file pair: name.c here, name.cu its CUDA
 * side (ops_ctr_cuda.h).
 *
 * Conventions are those of ops.h: row-major; backward functions ACCUMULATE (+=) into every
 * gradient they write; a NULL gradient pointer means "not wanted"; deterministic (fixed
 * accumulation order, results independent of the OpenMP thread count); OpenMP + cblas_sgemm.
 * Shapes: B batch, L history length (padded), E embedding width, H heads, D cross width, r rank,
 * n number of lookups, U number of unique rows.
 *
 * Embedding tables are addressed by (table, row). These functions take one table's base pointer
 * and rows already mapped (row = id mod rows_t, missing -> 0) by the caller; a caller that keeps
 * all tables in one allocation passes global rows (table offset + row) and the base of that
 * allocation. Rows are int64_t so that a concatenated table or a shard can exceed 2^31 rows. */
#ifndef NB_OPS_CTR_H
#define NB_OPS_CTR_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- embag.c ---- */
typedef enum { NB_EMBAG_SUM = 0, NB_EMBAG_MEAN = 1 } nb_embag_mode;

/* out[n, E] = table[rows[i], :]. Every row must be in [0, nrows) (checked: nb_fail). */
void nb_embag_gather(float *out, const float *table, const int64_t *rows, int n, int64_t nrows, int E);
/* Jagged bags: bag b holds lookups offsets[b] .. offsets[b+1]-1 (offsets[0] = 0, non-decreasing,
 * offsets[B] = n). out[b] = sum (or mean) of table[rows[i]] over the bag, summed in position
 * order; an empty bag gives a zero row. */
void nb_embag_bag_forward(float *out, const float *table, const int64_t *rows, const int32_t *offsets, int B,
                          int64_t nrows, int E, nb_embag_mode mode);
/* Deduplicates rows[n]: writes the U distinct rows in ascending order to uniq[0..U) and
 * inverse[i] = index in uniq of rows[i], so rows[i] == uniq[inverse[i]]. Returns U. Sort-based
 * (stable on position), no hashing: the output depends only on the input. uniq needs room for n. */
int nb_embag_unique(int64_t *uniq, int32_t *inverse, const int64_t *rows, int n);
/* nb_embag_unique plus the lookups grouped by unique row: order[seg[u] .. seg[u+1]) are the
 * positions i with rows[i] == uniq[u], ascending (what nb_ctr_ops_i.emb_grad_unique reads).
 * uniq, order, inverse need room for n, seg for n + 1; scratch for 2n keys (NULL: allocated and
 * freed here; a training step passes its own, so the step allocates nothing). Returns U. */
int nb_embag_unique_groups(int64_t *uniq, int32_t *order, int32_t *seg, int32_t *inverse, const int64_t *rows,
                           int n, uint64_t *scratch);
/* Unique-row gradient of a gather: dunique[inverse[i]] += dout[i] for i = 0..n-1, duplicates
 * summed in original position order (each unique row's sum is the same sequence of float adds
 * whatever the thread count). dunique is [U, E]; this is what the sparse optimizers consume. */
void nb_embag_backward_unique(float *dunique, const float *dout, const int32_t *inverse, int n, int E);
/* Same for bags: dunique[inverse[i]] += s_b * dout[b] for every lookup i of bag b, in position
 * order; s_b = 1 (sum) or 1/len_b (mean). dout is [B, E]. */
void nb_embag_bag_backward_unique(float *dunique, const float *dout, const int32_t *offsets,
                                  const int32_t *inverse, int B, int E, nb_embag_mode mode);

/* ---- ctr_lists.c (CUDA twin: ctr_lists.cu) ---- */
/* One batch's lookup lists for seqctr (model/seqctr.c's top comment), nf = ncat + 1 fields:
 *   [0, nf B)              sample i's field f: row off[f] + id mod rows[f] (f < ncat: cat[i, f],
 *                          f = ncat: target[i]), into x0: dst = src = i D0 + (1 + f) E
 *   [nf B, (nf + 1) B)     sample i's target row again (its gradient through target.wq):
 *                          dst -1 (not gathered), src MB D0 + i E
 *   [(nf + 1) B, + nmv)    multi-valued columns' values after each field's first: nb_ctr_lists_mv
 *                          (nmv = 0 without such columns)
 *   [.. + nmv, + nh)       packed history row r (sample i's item j, r = hoff[i] + j): row
 *                          off[ncat] + hist[r] mod rows[ncat], dst r E, src MB (D0 + E) + r E
 *   [.., + nh_pad - nh)    padding rows r = nh .. nh_pad - 1: row pad_row, dst r E, src 0
 * hist is packed ([nh]); hoff[B] = nh. */
#define NB_CTR_LISTS_MAX_FIELDS 65 /* seqctr's NB_SC_MAX_CAT tables + the item table; passed by value to a kernel */
typedef struct {
    int B, ncat, nh, nh_pad, nmv;
    int64_t D0, E, MB, pad_row;
    int64_t off[NB_CTR_LISTS_MAX_FIELDS], rows[NB_CTR_LISTS_MAX_FIELDS]; /* per field; [ncat]: the item table */
    /* multi-valued columns (nb_ctr_lists_mv): ncols of them, column j is field col_field[j]; their
     * nvals values packed; mv_src and zero_src: element offsets of their gradient rows and of a
     * zero row in the gradient region; col_sum[j]: column j is sum-pooled, so each of its values'
     * gradient is its slot's own and the values read the slot's (no per-value copy of it) */
    int ncols, nvals;
    int64_t mv_src, zero_src;
    int32_t col_field[NB_CTR_LISTS_MAX_FIELDS];
    int8_t col_sum[NB_CTR_LISTS_MAX_FIELDS];
} nb_ctr_lists_shape;
/* Lookups the lists hold: (ncat + 2) B + nmv + nh_pad. */
long nb_ctr_lists_count(const nb_ctr_lists_shape *s);
void nb_ctr_lists(const nb_ctr_lists_shape *s, const uint32_t *cat, const uint32_t *target, const uint32_t *hist,
                  const int32_t *hoff, int64_t *rows, int64_t *dst, int64_t *src);
/* The multi-valued columns' part of the lists, after nb_ctr_lists (it reads the target rows and
 * rewrites those fields' slots). Field g = i ncols + j (sample i, column j, field f = col_field[j])
 * has values mv[moff[g] .. moff[g + 1]) (packed in (sample, column, value) order, moff[0] = 0,
 * moff[B ncols] = nvals). Its slot i nf + f takes the first value r0: row off[f] + mv[r0] mod
 * rows[f] (dst and src stay the slot's); without a value the sample's target row with src
 * zero_src (a zero gradient). Every other value r of the field is lookup (nf + 1) B + r - e_g - 1,
 * e_g the fields before g that have a value: row off[f] + mv[r] mod rows[f], dst r E, src
 * mv_src + r E, or for a sum-pooled column (col_sum[j]) the slot's own src i D0 + (1 + f) E (a sum's
 * gradient reaches every value unchanged). So the lookups come in (sample, column, value) order,
 * nmv of them. before[g] = e_g for g < B ncols: the pooling's way from a value to its lookup. */
void nb_ctr_lists_mv(const nb_ctr_lists_shape *s, const uint32_t *mv, const int32_t *moff, int64_t *rows,
                     int64_t *dst, int64_t *src, int32_t *before);

/* ---- mvpool.c (CUDA twin: mvpool.cu): multi-valued categorical columns ---- */
/* Sample i's values are r = off[i * off_stride] .. off[i * off_stride + 1] - 1 (r0 .. r1 - 1;
 * off non-decreasing; off_stride lets one offset array serve several columns: column j of nmv
 * passes off + j and stride nmv, and before + j likewise). Value r0 is not read: the caller
 * gathered that first value into the slot out[i * ld_out ..] itself (as a single-valued column's
 * one id); value r > r0 is the table row rows[r - before[i * off_stride] - 1] (nb_ctr_lists_mv's
 * lookups past the firsts and its before), read from the table directly (no gathered copy). The
 * slot becomes the sum of its values, the first, then the others added in value order, times 1/n
 * for mean (float 1.0f / n); no value: zeros. So a one-value field is its row bit for bit, and so
 * is its gradient. Backward: dvals[r] += the slot's gradient dout[i] (times 1/n for mean) for r =
 * r0 + 1 .. r1 - 1, then (mean) dout[i] *= 1/n in place: the slot's gradient becomes the first
 * value's (dvals NULL: only that). */
void nb_mvpool_forward(float *out, int ld_out, const float *table, const int64_t *rows, const int32_t *before,
                       const int32_t *off, int off_stride, int B, int E, int mean);
void nb_mvpool_backward(float *dvals, float *dout, int ld_out, const int32_t *off, int off_stride, int B, int E,
                        int mean);

/* ---- cross.c ---- */
/* Low-rank DCNv2 cross layer: c = x0 * (U (V^T x) + b) + x, per row.
 * x0, x, c are [N, D]; Uw and Vw are [D, r]; b is [D] (NULL: no bias). vx[N, r] = x @ Vw (i.e.
 * V^T x per row) is saved for backward, and u [N, D] = U vx + b too unless u is NULL (then c holds
 * it first). c must not alias x0, x or u. */
void nb_cross_forward(float *c, float *vx, float *u, const float *x0, const float *x, const float *Uw, const float *Vw,
                      const float *b, int N, int D, int r);
/* dx0 [N, D], dU, dV [D, r], db [D] (+=); dx [N, D] written (x's whole gradient: dc through the
 * residual plus the product's share, so the caller need not zero it); any may be NULL. u: the
 * forward's saved U vx + b, or NULL: recomputed from vx (the same GEMM, the same bits). */
void nb_cross_backward(float *dx0, float *dx, float *dU, float *dV, float *db, const float *dc, const float *x0,
                       const float *x, const float *Uw, const float *Vw, const float *b, const float *vx,
                       const float *u, int N, int D, int r);

/* ---- relu.c ---- */
/* out = max(inp, 0) (out may alias inp). */
void nb_relu_forward(float *out, const float *inp, size_t n);
/* dinp += dout where inp > 0. Passing the forward's output as inp gives the same mask. */
void nb_relu_backward(float *dinp, const float *inp, const float *dout, size_t n);

/* ---- linear1.c: the one-output linear of a logit head ---- */
/* z[i] = w . x[i] + b[0] (b may be NULL); x [N, D], w [D]. */
void nb_linear1_forward(float *z, const float *x, const float *w, const float *b, int N, int D);
/* dx += dz[i] w; dw += sum_i dz[i] x[i]; db += sum_i dz[i] (each may be NULL). */
void nb_linear1_backward(float *dx, float *dw, float *db, const float *dz, const float *x, const float *w, int N,
                         int D);

/* ---- cols.c: column slices ---- */
/* dst[i * ld_dst + j] = (nb_add_cols: +=) src[i * ld_src + j], i < rows, j < cols */
void nb_copy_cols(float *dst, int ld_dst, const float *src, int ld_src, int rows, int cols);
void nb_add_cols(float *dst, int ld_dst, const float *src, int ld_src, int rows, int cols);

/* ---- bce.c ---- */
/* BCE with logits, numerically stable: l_i = max(z,0) - z*y + log1p(exp(-|z|)).
 * Loss = scale * sum_i w_i * l_i (w NULL: w_i = 1; scale = 1/N gives the mean).
 * losses[N] (may be NULL) gets the unweighted l_i; dz (may be NULL) += scale * w_i * (sigmoid(z_i) - y_i).
 * Returns the loss, summed in double in index order. Labels may be any value in [0, 1]. */
double nb_bce_logits_forward_backward(float *dz, float *losses, const float *z, const float *y, const float *w,
                                      int N, float scale);

/* ---- seqattn.c ---- */
/* Masked multi-head self-attention (not causal) over jagged histories padded to L rows.
 * qkv[B, L, 3E]: q, then k, then v, each E = H * HS wide (head h = columns h*HS..). Sample b has
 * lengths[b] in [0, L] valid rows; keys j >= lengths[b] are masked out. Scale 1/sqrt(HS).
 * out[B, L, E]: rows i >= lengths[b] are zero (an empty history gives all zeros).
 * lse[B, H, L] = log-sum-exp of each valid row's scaled scores (0 for invalid rows). */
void nb_seqattn_forward(float *out, float *lse, const float *qkv, const int32_t *lengths, int B, int L, int H,
                        int E);
/* dqkv[B, L, 3E] += gradient; dout rows beyond the length are ignored and padded rows receive
 * no gradient. */
void nb_seqattn_backward(float *dqkv, const float *dout, const float *qkv, const float *out, const float *lse,
                         const int32_t *lengths, int B, int L, int H, int E);

/* Target attention: a_j = softmax over j < lengths[b] of (q . k_j / sqrt(E)),
 * pooled[b] = sum_j a_j v_j (zero for an empty history). q [B, E]; k and v are [B, L, *] with row
 * stride ldkv (E for separate tensors, 2E for a fused [k | v] projection: pass v = k + E).
 * attn[B, L] (saved for backward) holds a_j, zero for j >= length. */
void nb_targetattn_forward(float *pooled, float *attn, const float *q, const float *k, const float *v,
                           const int32_t *lengths, int B, int L, int E, int ldkv);
/* dq [B, E], dk, dv (row stride ldkv) += gradient; any may be NULL; padded rows get nothing. */
void nb_targetattn_backward(float *dq, float *dk, float *dv, const float *dpooled, const float *q, const float *k,
                            const float *v, const float *attn, const int32_t *lengths, int B, int L, int E,
                            int ldkv);

/* ---- adagrad.c ---- */
/* Dense Adagrad (torch.optim.Adagrad with lr_decay 0, initial accumulator 0, no weight decay):
 * acc[i] += g[i]^2; p[i] += neg_lr * g[i] / (sqrt(acc[i]) + eps), for i < n. */
void nb_adagrad_dense(float *p, const float *g, float *acc, size_t n, float neg_lr, float eps);

#ifdef __cplusplus
}
#endif
#endif
