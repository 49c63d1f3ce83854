/* The one-output linear of seqctr's logit heads on the CPU: the reference of linear1.cu. */
#include "ops/ops_ctr.h"

void nb_linear1_forward(float *z, const float *x, const float *w, const float *b, int N, int D) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *xi = x + (size_t)i * D;
        float s = 0.0f;
        for (int k = 0; k < D; k++) s += w[k] * xi[k];
        z[i] = s + (b ? b[0] : 0.0f);
    }
}

/* dw is summed over samples in index order per column (columns in parallel): thread-count free. */
void nb_linear1_backward(float *dx, float *dw, float *db, const float *dz, const float *x, const float *w, int N,
                         int D) {
    if (dx) {
#pragma omp parallel for schedule(static)
        for (int i = 0; i < N; i++)
            for (int k = 0; k < D; k++) dx[(size_t)i * D + k] += dz[i] * w[k];
    }
    if (dw) {
#pragma omp parallel for schedule(static)
        for (int k = 0; k < D; k++) {
            float s = 0.0f;
            for (int i = 0; i < N; i++) s += dz[i] * x[(size_t)i * D + k];
            dw[k] += s;
        }
    }
    if (db) {
        float s = 0.0f;
        for (int i = 0; i < N; i++) s += dz[i];
        db[0] += s;
    }
}
