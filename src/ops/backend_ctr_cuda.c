/* The CUDA tables of backend_ctr.h: every entry launches an op of ops_ctr_cuda.h on the lane's
 * stream. Two tables, matching backend_cuda.c's: bf16 (activations and compute weights in bf16;
 * fp32 tables, parameter gradients and optimizer state) and fp32 (TF32 off, for parity). */
#include "ops/backend_ctr.h"

#ifdef NB_WITH_CUDA
#include "ops/ops_ctr_cuda.h"

#define S(c) ((nb_stream_t)(c)->stream)
#define LT(c) (nb_backend_of(c)->blas) /* the instance's cuBLASLt handle */

/* ---- entries whose element type follows the precision: generated for f32 and bf16 ---- */
#define NB_CUDA_CTR_OPS(SUF, T)                                                                            \
    static void emb_gather_##SUF(nb_ctx c, void *out, const int64_t *dst, const float *table,               \
                                 const int64_t *rows, int n, int E) {                                       \
        nb_cuda_emb_gather_##SUF((T *)out, dst, table, rows, n, E, S(c));                                   \
    }                                                                                                       \
    static void emb_grad_unique_##SUF(nb_ctx c, float *dunique, const void *src, const int64_t *src_off,    \
                                      const int32_t *order, const int32_t *seg, const int32_t *count, int U, \
                                      int n, int E) {                                                       \
        nb_cuda_emb_grad_unique_##SUF(dunique, (const T *)src, src_off, order, seg, count, U, n, E, S(c));  \
    }                                                                                                       \
    static void emb_grad_adagrad_##SUF(nb_ctx c, float *table, float *acc, const int64_t *rows, float *scratch, \
                                       const void *src, const int64_t *src_off, const int32_t *order,       \
                                       const int32_t *seg, const int32_t *count, int U, int n, int E,       \
                                       float lr, float eps) {                                               \
        nb_cuda_emb_grad_adagrad(table, acc, rows, scratch, src, sizeof(T) == 2, src_off, order, seg, count, U, n, \
                                 E, lr, eps, S(c));                                                         \
    }                                                                                                       \
    static void cross_fwd_##SUF(nb_ctx c, void *out, void *vx, void *u, const void *x0, const void *x,      \
                                const void *Uw, const void *Vw, const void *b, int N, int D, int r) {       \
        nb_cuda_cross_forward_##SUF((T *)out, (T *)vx, (T *)u, (const T *)x0, (const T *)x, (const T *)Uw,  \
                                    (const T *)Vw, (const T *)b, N, D, r, LT(c), S(c));                     \
    }                                                                                                       \
    static void cross_bwd_##SUF(nb_ctx c, void *dx0, void *dx, float *dU, float *dV, float *db, const void *dc, \
                                const void *x0, const void *x, const void *Uw, const void *Vw, const void *b, \
                                const void *vx, const void *u, int N, int D, int r) {                       \
        nb_cuda_cross_backward_##SUF((T *)dx0, (T *)dx, dU, dV, db, (const T *)dc, (const T *)x0, (const T *)x, \
                                     (const T *)Uw, (const T *)Vw, (const T *)b, (const T *)vx, (const T *)u, N, D, \
                                     r, LT(c), S(c));                                                       \
    }                                                                                                       \
    static void relu_fwd_##SUF(nb_ctx c, void *out, const void *inp, size_t n) {                            \
        nb_cuda_relu_forward_##SUF((T *)out, (const T *)inp, n, S(c));                                      \
    }                                                                                                       \
    static void relu_bwd_##SUF(nb_ctx c, void *dinp, const void *inp, const void *dout, size_t n) {         \
        nb_cuda_relu_backward_##SUF((T *)dinp, (const T *)inp, (const T *)dout, n, S(c));                   \
    }                                                                                                       \
    static void linear1_fwd_##SUF(nb_ctx c, float *z, const void *x, const void *w, const void *b, int N,   \
                                  int D) {                                                                  \
        nb_cuda_linear1_forward_##SUF(z, (const T *)x, (const T *)w, (const T *)b, N, D, S(c));             \
    }                                                                                                       \
    static void linear1_bwd_##SUF(nb_ctx c, void *dx, float *dw, float *db, const float *dz, const void *x,  \
                                  const void *w, int N, int D) {                                            \
        nb_cuda_linear1_backward_##SUF((T *)dx, dw, db, dz, (const T *)x, (const T *)w, N, D, S(c));        \
    }                                                                                                       \
    static void copy_cols_##SUF(nb_ctx c, void *dst, int ld_dst, const void *src, int ld_src, int rows,     \
                                int cols) {                                                                 \
        nb_cuda_copy_cols_##SUF((T *)dst, ld_dst, (const T *)src, ld_src, rows, cols, S(c));                \
    }                                                                                                       \
    static void add_cols_##SUF(nb_ctx c, void *dst, int ld_dst, const void *src, int ld_src, int rows,      \
                               int cols) {                                                                  \
        nb_cuda_add_cols_##SUF((T *)dst, ld_dst, (const T *)src, ld_src, rows, cols, S(c));                 \
    }                                                                                                       \
    static void mvpool_fwd_##SUF(nb_ctx c, void *out, int ld_out, const float *table, const int64_t *rows,   \
                                 const int32_t *before, const int32_t *off, int os, int B, int E, int mean) { \
        nb_cuda_mvpool_forward_##SUF((T *)out, ld_out, table, rows, before, off, os, B, E, mean, S(c));     \
    }                                                                                                       \
    static void mvpool_bwd_##SUF(nb_ctx c, void *dvals, void *dout, int ld_out, const int32_t *off,          \
                                 int os, int B, int E, int mean) {                                          \
        nb_cuda_mvpool_backward_##SUF((T *)dvals, (T *)dout, ld_out, off, os, B, E, mean, S(c));            \
    }                                                                                                       \
    static void seqattn_fwd_##SUF(nb_ctx c, void *out, float *lse, const void *qkv, const int32_t *off, int B, \
                                  int max_len, int H, int E) {                                              \
        nb_cuda_seqattn_forward_##SUF((T *)out, lse, (const T *)qkv, off, B, max_len, H, E, S(c));          \
    }                                                                                                       \
    static void seqattn_bwd_##SUF(nb_ctx c, void *dqkv, const void *dout, const void *qkv, const void *out,  \
                                  const float *lse, const int32_t *off, int B, int max_len, int H, int E) { \
        nb_cuda_seqattn_backward_##SUF((T *)dqkv, (const T *)dout, (const T *)qkv, (const T *)out, lse, off, B, \
                                       max_len, H, E, S(c));                                                \
    }                                                                                                       \
    static void targetattn_fwd_##SUF(nb_ctx c, void *pooled, float *attn, const void *q, const void *k,     \
                                     const void *v, const int32_t *off, int B, int max_len, int E, int ldkv) { \
        nb_cuda_targetattn_forward_##SUF((T *)pooled, attn, (const T *)q, (const T *)k, (const T *)v, off, B, \
                                         max_len, E, ldkv, S(c));                                           \
    }                                                                                                       \
    static void targetattn_bwd_##SUF(nb_ctx c, void *dq, void *dk, void *dv, const void *dpooled,           \
                                     const void *q, const void *k, const void *v, const float *attn,        \
                                     const int32_t *off, int B, int max_len, int E, int ldkv) {             \
        nb_cuda_targetattn_backward_##SUF((T *)dq, (T *)dk, (T *)dv, (const T *)dpooled, (const T *)q,      \
                                          (const T *)k, (const T *)v, attn, off, B, max_len, E, ldkv, S(c)); \
    }

NB_CUDA_CTR_OPS(f32, float)
NB_CUDA_CTR_OPS(bf16, nb_bf16)

/* ---- precision-independent entries (fp32 tables, state and logits) ---- */
static void rowwise_adagrad(nb_ctx c, float *table, float *acc, const int64_t *rows, const float *grads,
                            const int32_t *count, int U, int E, float lr, float eps) {
    nb_cuda_rowwise_adagrad(table, acc, rows, grads, count, U, E, lr, eps, S(c));
}
static void exact_adagrad(nb_ctx c, float *table, float *acc, const int64_t *rows, const float *grads,
                          const int32_t *count, int U, int E, float lr, float eps) {
    nb_cuda_exact_adagrad(table, acc, rows, grads, count, U, E, lr, eps, S(c));
}
static void sparse_adam(nb_ctx c, float *table, float *m, float *v, const int64_t *rows, const float *grads,
                        const int32_t *count, int U, int E, float lr, float beta1, float beta2, float eps, int t) {
    nb_cuda_sparse_adam(table, m, v, rows, grads, count, U, E, lr, beta1, beta2, eps, t, S(c));
}
static void lists(nb_ctx c, const nb_ctr_lists_shape *s, const uint32_t *cat, const uint32_t *target,
                  const uint32_t *hist, const int32_t *hoff, int64_t *rows, int64_t *dst, int64_t *src) {
    (void)hoff; /* one thread per packed history row: the row's sample is not needed */
    nb_cuda_ctr_lists(s, cat, target, hist, rows, dst, src, S(c));
}
static void lists_mv(nb_ctx c, const nb_ctr_lists_shape *s, const uint32_t *mv, const int32_t *moff, int64_t *rows,
                     int64_t *dst, int64_t *src, int32_t *before) {
    nb_cuda_ctr_lists_mv(s, mv, moff, rows, dst, src, before, S(c));
}
static void unique_groups(nb_ctx c, int64_t *uniq, int32_t *order, int32_t *seg, int32_t *count, const int64_t *rows,
                          int n, int64_t maxrow) {
    nb_cuda_emb_unique_groups(uniq, order, seg, count, rows, n, maxrow, S(c));
}
static void adagrad_dense(nb_ctx c, float *p, const float *g, float *acc, void *lowp, size_t n, const nb_adamw_scalars *k) {
    nb_cuda_adagrad_dense(p, g, acc, (nb_bf16 *)lowp, n, k, S(c));
}
static void bce(nb_ctx c, float *dz, double *loss, const float *z, const float *y, int N, float scale) {
    nb_cuda_bce_logits(dz, loss, z, y, N, scale, S(c));
}

#define NB_CUDA_CTR_TABLE(SUF)                                                                             \
    {                                                                                                      \
        .name = "cuda-" #SUF, .emb_gather = emb_gather_##SUF, .emb_grad_unique = emb_grad_unique_##SUF,    \
        .rowwise_adagrad = rowwise_adagrad, .sparse_adam = sparse_adam, .lists = lists, .lists_mv = lists_mv, \
        .adagrad_dense = adagrad_dense, .exact_adagrad = exact_adagrad,                                    \
        .emb_grad_adagrad = emb_grad_adagrad_##SUF,                                                        \
        .unique_groups = unique_groups, .cross_fwd = cross_fwd_##SUF,                                      \
        .cross_bwd = cross_bwd_##SUF, .relu_fwd = relu_fwd_##SUF, .relu_bwd = relu_bwd_##SUF,              \
        .linear1_fwd = linear1_fwd_##SUF, .linear1_bwd = linear1_bwd_##SUF, .bce = bce,                    \
        .copy_cols = copy_cols_##SUF, .add_cols = add_cols_##SUF, .mvpool_fwd = mvpool_fwd_##SUF,           \
        .mvpool_bwd = mvpool_bwd_##SUF, .seqattn_fwd = seqattn_fwd_##SUF,        \
        .seqattn_bwd = seqattn_bwd_##SUF, .targetattn_fwd = targetattn_fwd_##SUF,                          \
        .targetattn_bwd = targetattn_bwd_##SUF,                                                            \
    }

const nb_ctr_ops_i nb_ctr_ops_cuda_f32 = NB_CUDA_CTR_TABLE(f32);
const nb_ctr_ops_i nb_ctr_ops_cuda_bf16 = NB_CUDA_CTR_TABLE(bf16);
#else
/* ISO C forbids an empty translation unit. */
typedef int nb_backend_ctr_cuda_unused;
#endif
