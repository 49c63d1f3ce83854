/* Row-wise Adagrad and lazy sparse Adam on the unique rows a batch touched (see optim_sparse.h). */
#include <math.h>

#include "core.h"
#include "optim/optim_sparse.h"

/* Strictly increasing rows inside the table: no two work items write one row. */
static void sparse_check_rows(const int64_t *rows, int U, int64_t nrows) {
    for (int u = 0; u < U; u++) {
        NB_CHECK(rows[u] >= 0 && rows[u] < nrows, "deduplicate rows with nb_embag_unique before the update",
                 "sparse update row %lld outside the table's %lld rows", (long long)rows[u], (long long)nrows);
        NB_CHECK(u == 0 || rows[u] > rows[u - 1], "deduplicate rows with nb_embag_unique before the update",
                 "sparse update rows not strictly increasing at %d (%lld after %lld)", u, (long long)rows[u],
                 (long long)rows[u - 1]);
    }
}

void nb_rowwise_adagrad_update(float *table, float *acc, const int64_t *rows, const float *grads, int U, int E,
                               int64_t nrows, nb_rowwise_adagrad_cfg cfg) {
    NB_ASSERT(U >= 0 && E > 0);
    if (U == 0) return;
    NB_ASSERT(table && acc && rows && grads);
    sparse_check_rows(rows, U, nrows);
#pragma omp parallel for schedule(static)
    for (int u = 0; u < U; u++) {
        const float *g = grads + (size_t)u * E;
        float *w = table + (size_t)rows[u] * E;
        double ss = 0;
        for (int e = 0; e < E; e++) ss += (double)g[e] * g[e];
        acc[rows[u]] += (float)(ss / E);
        float mult = cfg.lr / (sqrtf(acc[rows[u]]) + cfg.eps);
        for (int e = 0; e < E; e++) w[e] -= mult * g[e];
    }
}

void nb_exact_adagrad_update(float *table, float *acc, const int64_t *rows, const float *grads, int U, int E,
                             int64_t nrows, nb_rowwise_adagrad_cfg cfg) {
    NB_ASSERT(U >= 0 && E > 0);
    if (U == 0) return;
    NB_ASSERT(table && acc && rows && grads);
    sparse_check_rows(rows, U, nrows);
#pragma omp parallel for schedule(static)
    for (int u = 0; u < U; u++) {
        size_t off = (size_t)rows[u] * E;
        const float *g = grads + (size_t)u * E;
        for (int e = 0; e < E; e++) {
            float a = acc[off + e] + g[e] * g[e];
            acc[off + e] = a;
            table[off + e] -= cfg.lr * g[e] / (sqrtf(a) + cfg.eps);
        }
    }
}

void nb_sparse_adam_update(float *table, float *m, float *v, const int64_t *rows, const float *grads, int U, int E,
                           int64_t nrows, nb_sparse_adam_cfg cfg, int t) {
    NB_ASSERT(U >= 0 && E > 0 && t >= 1);
    if (U == 0) return;
    NB_ASSERT(table && m && v && rows && grads);
    sparse_check_rows(rows, U, nrows);
    /* Scalars formed in double once, as nb_adamw_prepare does for the dense AdamW. */
    float b1 = cfg.beta1, b2 = cfg.beta2, w1 = 1.0f - b1, w2 = 1.0f - b2;
    float step = (float)(cfg.lr / (1.0 - pow(cfg.beta1, t)));
    float bc2_sqrt = (float)sqrt(1.0 - pow(cfg.beta2, t));
#pragma omp parallel for schedule(static)
    for (int u = 0; u < U; u++) {
        size_t off = (size_t)rows[u] * E;
        const float *g = grads + (size_t)u * E;
        for (int e = 0; e < E; e++) {
            float mi = b1 * m[off + e] + w1 * g[e];
            float vi = b2 * v[off + e] + w2 * g[e] * g[e];
            m[off + e] = mi;
            v[off + e] = vi;
            table[off + e] -= step * mi / (sqrtf(vi) / bc2_sqrt + cfg.eps);
        }
    }
}
