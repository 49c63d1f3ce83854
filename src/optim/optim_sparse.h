/* Sparse optimizers for embedding tables (CPU fp32 reference): they update only the rows a batch
 * touched, from one gradient row per unique row (nb_embag_unique + nb_embag_*backward_unique).
 *
 * rows[U] are row indices into the table (global rows when tables share one allocation) and
 * must be strictly increasing (as nb_embag_unique returns them): that makes every row's update
 * independent, so they run in parallel without races, and the result does not depend on the
 * thread count. Rows not listed are not read or written: untouched rows keep their values and
 * their optimizer state (lazy updates, as TorchRec/FBGEMM's fused table-batched optimizers). */
#ifndef NB_OPTIM_SPARSE_H
#define NB_OPTIM_SPARSE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    float lr, eps;
} nb_rowwise_adagrad_cfg;

/* TorchRec's ROWWISE_ADAGRAD (FBGEMM EmbOptimType.EXACT_ROWWISE_ADAGRAD, no weight decay):
 * one accumulator per row, for each listed row r with gradient g = grads[u] (E wide):
 *   acc[r] += mean_e(g_e^2)          (summed in double, e order)
 *   table[r] -= lr * g / (sqrt(acc[r]) + eps)
 * acc has one float per table row. */
void nb_rowwise_adagrad_update(float *table, float *acc, const int64_t *rows, const float *grads, int U, int E,
                               int64_t nrows, nb_rowwise_adagrad_cfg cfg);

/* TorchRec's EXACT_ADAGRAD (FBGEMM's; what torch.optim.Adagrad on an EmbeddingBagCollection becomes,
 * as MLPerf's DLRM-DCNv2 reference sets it up): one accumulator per element ([nrows, E]), for each
 * listed row r with gradient g:  acc[r, e] += g_e^2;  table[r, e] -= lr * g_e / (sqrt(acc[r, e]) + eps). */
void nb_exact_adagrad_update(float *table, float *acc, const int64_t *rows, const float *grads, int U, int E,
                             int64_t nrows, nb_rowwise_adagrad_cfg cfg);

typedef struct {
    float lr, beta1, beta2, eps;
} nb_sparse_adam_cfg;

/* Lazy sparse Adam (torch.optim.SparseAdam's and FBGEMM's EmbOptimType.ADAM formula): m and v
 * per element ([nrows, E] each), only the listed rows move. The step t >= 1 is GLOBAL (the
 * optimizer step count, as both SparseAdam and FBGEMM use for bias correction), not per row:
 *   m = b1*m + (1-b1)*g ;  v = b2*v + (1-b2)*g^2
 *   table -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)
 * A row touched for the first time at step t thus gets a smaller first update than dense Adam
 * would give it; that is the TorchRec behaviour we match. */
void nb_sparse_adam_update(float *table, float *m, float *v, const int64_t *rows, const float *grads, int U, int E,
                           int64_t nrows, nb_sparse_adam_cfg cfg, int t);

#ifdef __cplusplus
}
#endif
#endif
