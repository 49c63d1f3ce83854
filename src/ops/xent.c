/* Fused unembedding + softmax cross-entropy, CPU fp32, chunked over rows.
 *
 * For each chunk of rows: logits = inp_chunk @ w[:V]^T (sgemm), then per row a numerically stable
 * log-sum-exp (max subtracted, exp sum accumulated in double), the loss, and (if a gradient is
 * wanted) dlogits = grad_scale * (softmax - onehot(target)) written over the logits; then
 * dinp_chunk += dlogits @ w[:V] and dw[:V] += dlogits^T @ inp_chunk (two sgemms, beta = 1).
 * Only chunk_rows x V logits exist at a time, never N x V. Rows V..Vp-1 of w (padding) are not
 * part of any GEMM, so they are never read and their gradient rows never written.
 * Deterministic: rows are independent, the loss sum is added in row order, and the GEMMs run in
 * chunk order (OpenBLAS results depend on its thread count, not on timing).
 * losses may be NULL (only the returned sum is wanted). */
#include "ops/ops.h"

#include "core.h"
#include "vmath.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>

/* Default chunk: about 8 MB of fp32 logits. Big enough for efficient GEMMs, small enough to stay
 * out of the way of activations when V is 50k+ (41 rows for GPT-2's vocabulary). */
#define XENT_MIN_CHUNK_ROWS 256
#define XENT_CHUNK_BYTES (8u << 20)

/* The largest of row[0..V): 16 running maxima, so that the loop vectorizes (a NaN is kept: NaN
 * logits make a NaN loss, not a silently finite one). */
#define XENT_LANES 16
static inline __attribute__((always_inline)) float row_max(const float *row, int V) {
    float m[XENT_LANES];
    int j = 0;
    for (int l = 0; l < XENT_LANES; l++) m[l] = row[0];
    for (; j + XENT_LANES <= V; j += XENT_LANES)
        for (int l = 0; l < XENT_LANES; l++) m[l] = row[j + l] > m[l] || row[j + l] != row[j + l] ? row[j + l] : m[l];
    float mx = m[0];
    for (int l = 1; l < XENT_LANES; l++) mx = m[l] > mx || m[l] != m[l] ? m[l] : mx;
    for (; j < V; j++) mx = row[j] > mx || row[j] != row[j] ? row[j] : mx;
    return mx;
}

/* row[j] = exp(row[j] - mx); returns their sum: 16 float lanes per block of 256 values, the
 * blocks' sums added in double in order (a fixed order at every vector width). */
#define XENT_BLOCK 256
static inline __attribute__((always_inline)) double row_exp_sum(float *row, int V, float mx) {
    double sum = 0.0;
    for (int b = 0; b < V; b += XENT_BLOCK) {
        int n = V - b < XENT_BLOCK ? V - b : XENT_BLOCK, j = 0;
        float *r = row + b, acc[XENT_LANES] = {0};
        for (int k = 0; k < n; k++) r[k] = nb_expf(r[k] - mx);
        for (; j + XENT_LANES <= n; j += XENT_LANES)
            for (int l = 0; l < XENT_LANES; l++) acc[l] += r[j + l];
        for (; j < n; j++) acc[0] += r[j];
        float s = 0.0f;
        for (int l = 0; l < XENT_LANES; l++) s += acc[l];
        sum += s;
    }
    return sum;
}

/* In place: row[V] logits -> grad_scale * (softmax - onehot(target)) if want_grad (else the row
 * is left as scratch). Returns the loss -log softmax(row)[target] in double. */
NB_SIMD_CLONES
static double xent_row(float *row, int V, int target, float grad_scale, int want_grad) {
    if (target == NB_XENT_IGNORE) { /* an ignored row: no loss, and a zero row adds nothing to the GEMMs */
        if (want_grad)
            for (int j = 0; j < V; j++) row[j] = 0.0f;
        return 0.0;
    }
    float mx = row_max(row, V), tlogit = row[target];
    double sum = row_exp_sum(row, V, mx);
    double loss = (double)mx + log(sum) - (double)tlogit;
    if (want_grad) {
        float scale = (float)((double)grad_scale / sum);
        for (int j = 0; j < V; j++) row[j] *= scale;
        row[target] -= grad_scale;
    }
    return loss;
}

static void check_targets(const int32_t *targets, int N, int V) {
    for (int i = 0; i < N; i++)
        NB_CHECK((targets[i] >= 0 && targets[i] < V) || targets[i] == NB_XENT_IGNORE,
                 "the token data holds ids outside the model's vocabulary: check the data shard and "
                 "--vocab (or the preset's vocabulary size)",
                 "cross-entropy target %d at row %d is outside [0, %d)", (int)targets[i], i, V);
}

double nb_xent_forward_backward(float *dinp, float *dw, float *losses, const float *inp, const float *w,
                                const int32_t *targets, int N, int C, int V, float grad_scale, int chunk_rows) {
    NB_ASSERT(N >= 0 && C > 0 && V > 0);
    if (N == 0) return 0.0;
    check_targets(targets, N, V);
    if (chunk_rows <= 0) {
        /* at least 256 rows: thinner GEMMs ran 2x slower at V = 50257 (41-row chunks) */
        size_t rows = XENT_CHUNK_BYTES / ((size_t)V * sizeof(float));
        if (rows < XENT_MIN_CHUNK_ROWS) rows = XENT_MIN_CHUNK_ROWS;
        chunk_rows = rows > (size_t)N ? N : (int)rows;
    }
    if (chunk_rows > N) chunk_rows = N;
    int want_grad = dinp != NULL || dw != NULL;
    float *logits = nb_malloc((size_t)chunk_rows * V * sizeof(float), "cross-entropy logits chunk");
    double *row_loss = nb_malloc((size_t)chunk_rows * sizeof(double), "cross-entropy row losses");
    double total = 0.0;
    for (int r0 = 0; r0 < N; r0 += chunk_rows) {
        int rows = N - r0 < chunk_rows ? N - r0 : chunk_rows;
        const float *x = inp + (size_t)r0 * C;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, V, C, 1.0f, x, C, w, C, 0.0f, logits, V);
#pragma omp parallel for schedule(static)
        for (int r = 0; r < rows; r++)
            row_loss[r] = xent_row(logits + (size_t)r * V, V, targets[r0 + r], grad_scale, want_grad);
        for (int r = 0; r < rows; r++) {
            total += row_loss[r];
            if (losses) losses[r0 + r] = (float)row_loss[r];
        }
        if (dinp)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, C, V, 1.0f, logits, V, w, C, 1.0f,
                        dinp + (size_t)r0 * C, C);
        if (dw)
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, V, C, rows, 1.0f, logits, V, x, C, 1.0f, dw, C);
    }
    free(logits);
    free(row_loss);
    return total;
}

void nb_softmax_inplace(float *x, int V, float temperature) {
    NB_CHECK(temperature > 0.0f, "pass a temperature > 0 (e.g. --temperature 1.0)",
             "softmax temperature must be > 0, got %g", (double)temperature);
    NB_ASSERT(V > 0);
    float mx = x[0];
    for (int j = 1; j < V; j++)
        if (x[j] > mx) mx = x[j];
    double sum = 0.0;
    for (int j = 0; j < V; j++) {
        x[j] = expf((x[j] - mx) / temperature);
        sum += x[j];
    }
    float inv = (float)(1.0 / sum);
    for (int j = 0; j < V; j++) x[j] *= inv;
}
