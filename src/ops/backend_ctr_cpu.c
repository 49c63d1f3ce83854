/* The CPU table of backend_ctr.h: the fp32 reference. Packed histories are handed to the padded
 * functions of ops_ctr.h one sample at a time (B = 1, L = its length), so there is one
 * implementation of the attention math, and samples run in parallel. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "ops/backend_ctr.h"
#include "ops/ops_ctr.h"
#include "optim/optim_sparse.h"

#define F(p) ((float *)(p))
#define CF(p) ((const float *)(p))

static void emb_gather(nb_ctx c, void *out, const int64_t *dst, const float *table, const int64_t *rows, int n,
                       int E) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; i++)
        memcpy(F(out) + dst[i], table + (size_t)rows[i] * E, (size_t)E * sizeof(float));
}

/* backend_ctr.h's order: chunk 0 summed into d, every later chunk summed apart and added to d. */
static void emb_grad_unique(nb_ctx c, float *dunique, const void *src, const int64_t *src_off, const int32_t *order,
                            const int32_t *seg, const int32_t *count, int U, int n, int E) {
    if (count) U = *count; /* backend memory is host memory here */
    /* the GPU's scratch follows n: a caller's n below the lookups would only slow it there; here it shows */
    NB_CHECK(U == 0 || seg[U] <= n, "this is a bug in nobubble; please report it",
             "emb_grad_unique: %d lookups, but the caller bounds them by %d", U ? seg[U] : 0, n);
#pragma omp parallel
    {
        float *part = nb_malloc((size_t)(E > 0 ? E : 1) * sizeof(float), "embedding gradient chunk");
#pragma omp for schedule(dynamic, 64)
        for (int u = 0; u < U; u++) {
            float *d = dunique + (size_t)u * E;
            memset(d, 0, (size_t)E * sizeof(float));
            for (int c0 = seg[u]; c0 < seg[u + 1]; c0 += NB_EMB_GRAD_CHUNK) {
                int c1 = seg[u + 1] - c0 < NB_EMB_GRAD_CHUNK ? seg[u + 1] : c0 + NB_EMB_GRAD_CHUNK;
                float *acc = c0 == seg[u] ? d : part;
                if (acc == part) memset(part, 0, (size_t)E * sizeof(float));
                for (int k = c0; k < c1; k++) {
                    const float *s = CF(src) + src_off[order[k]];
                    for (int e = 0; e < E; e++) acc[e] += s[e];
                }
                if (acc == part)
                    for (int e = 0; e < E; e++) d[e] += part[e];
            }
        }
        free(part);
    }
}

/* The sparse optimizers check rows against the table size; the table has no size here,
 * and the rows come from the host's own lookups, so any bound at least the largest row works. */
static int64_t rows_bound(const int64_t *rows, int U) { return U ? rows[U - 1] + 1 : 1; }

static void rowwise_adagrad(nb_ctx c, float *table, float *acc, const int64_t *rows, const float *grads,
                            const int32_t *count, int U, int E, float lr, float eps) {
    if (count) U = *count;
    nb_rowwise_adagrad_update(table, acc, rows, grads, U, E, rows_bound(rows, U), (nb_rowwise_adagrad_cfg){lr, eps});
}

static void exact_adagrad(nb_ctx c, float *table, float *acc, const int64_t *rows, const float *grads,
                          const int32_t *count, int U, int E, float lr, float eps) {
    if (count) U = *count;
    nb_exact_adagrad_update(table, acc, rows, grads, U, E, rows_bound(rows, U), (nb_rowwise_adagrad_cfg){lr, eps});
}

/* The CPU's is the two in turn (one writer per row either way; the fusion is the GPU's bandwidth). */
static void emb_grad_adagrad(nb_ctx c, float *table, float *acc, const int64_t *rows, float *scratch, const void *src,
                             const int64_t *src_off, const int32_t *order, const int32_t *seg, const int32_t *count,
                             int U, int n, int E, float lr, float eps) {
    emb_grad_unique(c, scratch, src, src_off, order, seg, count, U, n, E);
    exact_adagrad(c, table, acc, rows, scratch, count, U, E, lr, eps);
}

static void sparse_adam(nb_ctx c, float *table, float *m, float *v, const int64_t *rows, const float *grads,
                        const int32_t *count, int U, int E, float lr, float beta1, float beta2, float eps, int t) {
    if (count) U = *count;
    nb_sparse_adam_update(table, m, v, rows, grads, U, E, rows_bound(rows, U),
                          (nb_sparse_adam_cfg){lr, beta1, beta2, eps}, t);
}

static void lists(nb_ctx c, const nb_ctr_lists_shape *s, const uint32_t *cat, const uint32_t *target,
                  const uint32_t *hist, const int32_t *hoff, int64_t *rows, int64_t *dst, int64_t *src) {
    nb_ctr_lists(s, cat, target, hist, hoff, rows, dst, src);
}

static void lists_mv(nb_ctx c, const nb_ctr_lists_shape *s, const uint32_t *mv, const int32_t *moff, int64_t *rows,
                     int64_t *dst, int64_t *src, int32_t *before) {
    nb_ctr_lists_mv(s, mv, moff, rows, dst, src, before);
}

static void unique_groups(nb_ctx c, int64_t *uniq, int32_t *order, int32_t *seg, int32_t *count, const int64_t *rows,
                          int n, int64_t maxrow) {
    (void)maxrow;
    int32_t *inverse = nb_malloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t), "embedding dedup");
    *count = nb_embag_unique_groups(uniq, order, seg, inverse, rows, n, NULL);
    free(inverse);
}

static void cross_fwd(nb_ctx c, void *out, void *vx, void *u, const void *x0, const void *x, const void *Uw,
                      const void *Vw, const void *b, int N, int D, int r) {
    nb_cross_forward(F(out), F(vx), F(u), CF(x0), CF(x), CF(Uw), CF(Vw), CF(b), N, D, r);
}

static void cross_bwd(nb_ctx c, void *dx0, void *dx, float *dU, float *dV, float *db, const void *dc, const void *x0,
                      const void *x, const void *Uw, const void *Vw, const void *b, const void *vx, const void *u,
                      int N, int D, int r) {
    nb_cross_backward(F(dx0), F(dx), dU, dV, db, CF(dc), CF(x0), CF(x), CF(Uw), CF(Vw), CF(b), CF(vx), CF(u), N, D, r);
}

static void adagrad_dense(nb_ctx c, float *p, const float *g, float *acc, void *lowp, size_t n, const nb_adamw_scalars *k) {
    NB_ASSERT(lowp == NULL); /* the CPU computes in fp32: no compute copy */
    nb_adagrad_dense(p, g, acc, n, k->neg_step, k->eps);
}

static void relu_fwd(nb_ctx c, void *out, const void *inp, size_t n) { nb_relu_forward(F(out), CF(inp), n); }
static void relu_bwd(nb_ctx c, void *dinp, const void *inp, const void *dout, size_t n) {
    nb_relu_backward(F(dinp), CF(inp), CF(dout), n);
}

static void linear1_fwd(nb_ctx c, float *z, const void *x, const void *w, const void *b, int N, int D) {
    nb_linear1_forward(z, CF(x), CF(w), CF(b), N, D);
}
static void linear1_bwd(nb_ctx c, void *dx, float *dw, float *db, const float *dz, const void *x, const void *w,
                        int N, int D) {
    nb_linear1_backward(F(dx), dw, db, dz, CF(x), CF(w), N, D);
}

static void bce(nb_ctx c, float *dz, double *loss, const float *z, const float *y, int N, float scale) {
    double l = nb_bce_logits_forward_backward(dz, NULL, z, y, NULL, N, scale);
    if (loss) *loss += l;
}

static void mvpool_fwd(nb_ctx c, void *out, int ld_out, const float *table, const int64_t *rows, const int32_t *before,
                       const int32_t *off, int off_stride, int B, int E, int mean) {
    nb_mvpool_forward(F(out), ld_out, table, rows, before, off, off_stride, B, E, mean);
}

static void mvpool_bwd(nb_ctx c, void *dvals, void *dout, int ld_out, const int32_t *off, int off_stride, int B,
                       int E, int mean) {
    nb_mvpool_backward(F(dvals), F(dout), ld_out, off, off_stride, B, E, mean);
}

static void copy_cols(nb_ctx c, void *dst, int ld_dst, const void *src, int ld_src, int rows, int cols) {
    nb_copy_cols(F(dst), ld_dst, CF(src), ld_src, rows, cols);
}
static void add_cols(nb_ctx c, void *dst, int ld_dst, const void *src, int ld_src, int rows, int cols) {
    nb_add_cols(F(dst), ld_dst, CF(src), ld_src, rows, cols);
}

static void check_offsets(const int32_t *off, int B, int max_len) {
    NB_CHECK(off[0] == 0, "build history offsets from 0", "history offsets start at %d", (int)off[0]);
    for (int b = 0; b < B; b++) {
        int len = off[b + 1] - off[b];
        NB_CHECK(len >= 0 && len <= max_len, "cap history lengths at max_len when building the batch",
                 "history of sample %d has %d rows (max %d)", b, len, max_len);
    }
}

static void seqattn_fwd(nb_ctx c, void *out, float *lse, const void *qkv, const int32_t *off, int B, int max_len, int H,
                        int E) {
    check_offsets(off, B, max_len);
#pragma omp parallel for schedule(dynamic, 4)
    for (int b = 0; b < B; b++) {
        int32_t len = off[b + 1] - off[b];
        if (!len) continue;
        size_t o = (size_t)off[b];
        nb_seqattn_forward(F(out) + o * E, lse + o * H, CF(qkv) + o * 3 * E, &len, 1, len, H, E);
    }
}

static void seqattn_bwd(nb_ctx c, void *dqkv, const void *dout, const void *qkv, const void *out, const float *lse,
                        const int32_t *off, int B, int max_len, int H, int E) {
    check_offsets(off, B, max_len);
#pragma omp parallel for schedule(dynamic, 4)
    for (int b = 0; b < B; b++) {
        int32_t len = off[b + 1] - off[b];
        if (!len) continue;
        size_t o = (size_t)off[b];
        nb_seqattn_backward(F(dqkv) + o * 3 * E, CF(dout) + o * E, CF(qkv) + o * 3 * E, CF(out) + o * E, lse + o * H,
                            &len, 1, len, H, E);
    }
}

static void targetattn_fwd(nb_ctx c, void *pooled, float *attn, const void *q, const void *k, const void *v,
                           const int32_t *off, int B, int max_len, int E, int ldkv) {
    check_offsets(off, B, max_len);
#pragma omp parallel for schedule(dynamic, 16)
    for (int b = 0; b < B; b++) {
        int32_t len = off[b + 1] - off[b];
        size_t o = (size_t)off[b];
        nb_targetattn_forward(F(pooled) + (size_t)b * E, attn + o, CF(q) + (size_t)b * E, CF(k) + o * ldkv,
                              CF(v) + o * ldkv, &len, 1, len, E, ldkv);
    }
}

static void targetattn_bwd(nb_ctx c, void *dq, void *dk, void *dv, const void *dpooled, const void *q, const void *k,
                           const void *v, const float *attn, const int32_t *off, int B, int max_len, int E, int ldkv) {
    check_offsets(off, B, max_len);
#pragma omp parallel for schedule(dynamic, 16)
    for (int b = 0; b < B; b++) {
        int32_t len = off[b + 1] - off[b];
        size_t o = (size_t)off[b];
        nb_targetattn_backward(dq ? F(dq) + (size_t)b * E : NULL, dk ? F(dk) + o * ldkv : NULL,
                               dv ? F(dv) + o * ldkv : NULL, CF(dpooled) + (size_t)b * E, CF(q) + (size_t)b * E,
                               CF(k) + o * ldkv, CF(v) + o * ldkv, attn + o, &len, 1, len, E, ldkv);
    }
}

const nb_ctr_ops_i nb_ctr_ops_cpu = {
    .name = "cpu",
    .emb_gather = emb_gather,
    .emb_grad_unique = emb_grad_unique,
    .rowwise_adagrad = rowwise_adagrad,
    .sparse_adam = sparse_adam,
    .exact_adagrad = exact_adagrad,
    .emb_grad_adagrad = emb_grad_adagrad,
    .lists = lists,
    .lists_mv = lists_mv,
    .unique_groups = unique_groups,
    .adagrad_dense = adagrad_dense,
    .cross_fwd = cross_fwd,
    .cross_bwd = cross_bwd,
    .relu_fwd = relu_fwd,
    .relu_bwd = relu_bwd,
    .linear1_fwd = linear1_fwd,
    .linear1_bwd = linear1_bwd,
    .bce = bce,
    .copy_cols = copy_cols,
    .add_cols = add_cols,
    .mvpool_fwd = mvpool_fwd,
    .mvpool_bwd = mvpool_bwd,
    .seqattn_fwd = seqattn_fwd,
    .seqattn_bwd = seqattn_bwd,
    .targetattn_fwd = targetattn_fwd,
    .targetattn_bwd = targetattn_bwd,
};

const nb_ctr_ops_i *nb_ctr_ops_for(const nb_backend_i *be) {
    if (!be->ctr) nb_fail("use --device cpu or cuda", "backend %s has no seqctr ops", be->name);
    return be->ctr;
}

const nb_ctr_ops_i *nb_ctr_ops_f32_for(const nb_backend_i *be) {
#ifdef NB_WITH_CUDA
    if (be->ctr == &nb_ctr_ops_cuda_bf16 || be->ctr == &nb_ctr_ops_cuda_f32) return &nb_ctr_ops_cuda_f32;
#endif
    return nb_ctr_ops_for(be);
}
