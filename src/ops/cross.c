/* Low-rank DCNv2 cross layer on the CPU: c = x0 * (U (V^T x) + b) + x for each row.
 *
 * With rows as batch entries, V^T x for all rows is x @ Vw ([N, D] @ [D, r]) and U (.) is
 * vx @ Uw^T. vx [N, r] is saved, and u = vx @ Uw^T + b [N, D] where the caller keeps it (the
 * backward then skips the GEMM that would make it again).
 * The GEMMs go to OpenBLAS (fixed per-element dot-product order, see matmul.c); the bias
 * gradient owns channel blocks and sums rows in order, so nothing depends on the thread count. */
#include <cblas.h>
#include <stdlib.h>

#include "core.h"
#include "ops/ops_ctr.h"

#define NB_CROSS_CBLOCK 64

/* u[N, D] = vx @ Uw^T + b */
static void cross_u(float *u, const float *vx, const float *Uw, const float *b, int N, int D, int r) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, D, r, 1.0f, vx, r, Uw, r, 0.0f, u, D);
    if (!b) return;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        for (int d = 0; d < D; d++) u[(size_t)n * D + d] += b[d];
}

void nb_cross_forward(float *c, float *vx, float *u, const float *x0, const float *x, const float *Uw, const float *Vw,
                      const float *b, int N, int D, int r) {
    NB_ASSERT(c && vx && x0 && x && Uw && Vw && N >= 0 && D > 0 && r > 0);
    if (N == 0) return;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, r, D, 1.0f, x, D, Vw, r, 0.0f, vx, r);
    /* without u, c doubles as u's buffer: c = x0 * u + x is elementwise, in place */
    float *uu = u ? u : c;
    cross_u(uu, vx, Uw, b, N, D, r);
    size_t nd = (size_t)N * D;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < nd; i++) c[i] = x0[i] * uu[i] + x[i];
}

static void cross_db(float *db, const float *du, int N, int D) {
    int nblocks = (D + NB_CROSS_CBLOCK - 1) / NB_CROSS_CBLOCK;
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < nblocks; blk++) {
        int d0 = blk * NB_CROSS_CBLOCK, d1 = d0 + NB_CROSS_CBLOCK < D ? d0 + NB_CROSS_CBLOCK : D;
        double acc[NB_CROSS_CBLOCK] = {0};
        for (int n = 0; n < N; n++)
            for (int d = d0; d < d1; d++) acc[d - d0] += du[(size_t)n * D + d];
        for (int d = d0; d < d1; d++) db[d] += (float)acc[d - d0];
    }
}

void nb_cross_backward(float *dx0, float *dx, float *dU, float *dV, float *db, const float *dc, const float *x0,
                       const float *x, const float *Uw, const float *Vw, const float *b, const float *vx,
                       const float *u, int N, int D, int r) {
    NB_ASSERT(dc && N >= 0 && D > 0 && r > 0 && dx != dc);
    if (N == 0) return;
    size_t nd = (size_t)N * D;
    if (dx0) {
        float *made = NULL;
        if (!u) {
            NB_ASSERT(vx && Uw);
            made = nb_malloc(nd * sizeof(float), "cross backward u");
            cross_u(made, vx, Uw, b, N, D, r);
            u = made;
        }
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < nd; i++) dx0[i] += dc[i] * u[i];
        free(made);
    }
    if (dx) { /* written: the residual "+ x" first, the product's share added below */
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < nd; i++) dx[i] = dc[i];
    }
    if (!dU && !dV && !db && !dx) return;
    NB_ASSERT(x0);
    float *du = nb_malloc(nd * sizeof(float), "cross backward du"); /* dL/du = dc * x0 */
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < nd; i++) du[i] = dc[i] * x0[i];
    if (db) cross_db(db, du, N, D);
    if (dU) {
        NB_ASSERT(vx);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, D, r, N, 1.0f, du, D, vx, r, 1.0f, dU, r);
    }
    if (dV || dx) {
        NB_ASSERT(Uw);
        float *dvx = nb_malloc((size_t)N * r * sizeof(float), "cross backward dvx");
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, r, D, 1.0f, du, D, Uw, r, 0.0f, dvx, r);
        if (dV) {
            NB_ASSERT(x);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, D, r, N, 1.0f, x, D, dvx, r, 1.0f, dV, r);
        }
        if (dx) {
            NB_ASSERT(Vw);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, D, r, 1.0f, dvx, r, Vw, r, 1.0f, dx, D);
        }
        free(dvx);
    }
    free(du);
}
