/* Causal grouped-query attention on the CPU, flash-style: one query row at a time, so memory is
 * O(T) per thread instead of O(T^2).
 *
 * Layout: qkv[B, T, R], R = (NH + 2*NKV) * HS; row (b,t) holds NH q heads, then NKV k heads, then
 * NKV v heads. Query head h reads kv head h / (NH/NKV) (HF's repeat_kv).
 *
 * Forward, per (b, h, t): s_j = (q_t . k_j) * scale for j <= t (two passes over a scratch row:
 * scores, then exp), out_t = sum_j p_j v_j, lse_t = max + log(sum_j exp(s_j - max)).
 * Backward, per row: p_j = exp(s_j - lse_t) recomputed from the same dot products,
 * D_t = dout_t . out_t, ds_j = p_j (dout_t . v_j - D_t), then
 *   dq_t += scale * sum_j ds_j k_j,  dk_j += scale * ds_j q_t,  dv_j += p_j dout_t.
 *
 * Determinism: the forward writes each output row from one thread. The backward is parallel over
 * (b, kv head) units; one unit owns every dq/dk/dv element it touches (the dq rows of its query
 * heads, the dk/dv rows of its kv head) and visits query heads and rows in ascending order, so the
 * accumulation order is fixed and the result is the same for any thread count. The price: at most
 * B*NKV threads work in the backward (16 at B=8, NKV=2; enough for the small CPUs this runs on). */
#include "ops/ops.h"

#include "core.h"
#include "vmath.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Dot product with 8 independent partial sums in a fixed order: lets the compiler use vector
 * registers (a plain float reduction can't be reordered without -ffast-math) and stays
 * deterministic because the order is fixed in the source. */
static inline float dot(const float *a, const float *b, int n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += a[i + j] * b[i + j];
    for (int j = 0; i < n; i++, j++) acc[j] += a[i] * b[i];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

/* y += a * x */
static inline void axpy(float *restrict y, float a, const float *restrict x, int n) {
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}

typedef struct {
    int B, T, NH, NKV, HS, R, group;
    float scale;
} attn_shape;

static attn_shape attn_shape_of(int B, int T, int NH, int NKV, int HS) {
    NB_ASSERT(B > 0 && T > 0 && HS > 0 && NH > 0 && NKV > 0 && NH % NKV == 0);
    attn_shape s = {B, T, NH, NKV, HS, (NH + 2 * NKV) * HS, NH / NKV, 1.0f / sqrtf((float)HS)};
    return s;
}

static inline size_t row_off(const attn_shape *s, int b, int t) { return ((size_t)b * s->T + t) * s->R; }
static inline int k_col(const attn_shape *s, int kvh) { return (s->NH + kvh) * s->HS; }
static inline int v_col(const attn_shape *s, int kvh) { return (s->NH + s->NKV + kvh) * s->HS; }

/* One query row: writes out_row[HS] and returns lse. p is scratch of t+1 floats. */
NB_SIMD_CLONES
static float attn_row_forward(float *out_row, float *p, const float *qkv, const attn_shape *s, int b,
                              int h, int t) {
    int kvh = h / s->group, HS = s->HS;
    const float *q = qkv + row_off(s, b, t) + (size_t)h * HS;
    float mx = -INFINITY;
    for (int j = 0; j <= t; j++) {
        p[j] = dot(q, qkv + row_off(s, b, j) + k_col(s, kvh), HS) * s->scale;
        if (p[j] > mx) mx = p[j];
    }
    for (int j = 0; j <= t; j++) p[j] = nb_expf(p[j] - mx);
    float sum = 0.0f;
    for (int j = 0; j <= t; j++) sum += p[j];
    memset(out_row, 0, (size_t)HS * sizeof(float));
    for (int j = 0; j <= t; j++) axpy(out_row, p[j], qkv + row_off(s, b, j) + v_col(s, kvh), HS);
    float inv = 1.0f / sum;
    for (int i = 0; i < HS; i++) out_row[i] *= inv;
    return mx + logf(sum);
}

void nb_attention_forward(float *out, float *lse, const float *qkv, int B, int T, int NH, int NKV, int HS) {
    attn_shape s = attn_shape_of(B, T, NH, NKV, HS);
#pragma omp parallel
    {
        float *p = nb_malloc((size_t)T * sizeof(float), "attention score row");
        /* Row cost grows with t; cyclic chunks of 1 spread long and short rows evenly. */
#pragma omp for collapse(3) schedule(static, 1)
        for (int b = 0; b < B; b++)
            for (int h = 0; h < NH; h++)
                for (int t = 0; t < T; t++) {
                    float *o = out + ((size_t)b * T + t) * NH * HS + (size_t)h * HS;
                    lse[((size_t)b * NH + h) * T + t] = attn_row_forward(o, p, qkv, &s, b, h, t);
                }
        free(p);
    }
}

typedef struct {
    float *dk, *dv; /* [T, HS] each: this unit's kv-head gradient before it is added to dqkv */
    float *dq;      /* [HS] */
} attn_scratch;

/* Backward of one query row (b, h, t): adds its dq into dqkv, its dk/dv into the unit scratch. */
NB_SIMD_CLONES
static void attn_row_backward(float *dqkv, attn_scratch *w, const float *dout, const float *qkv,
                              const float *out, const float *lse, const attn_shape *s, int b, int h, int t) {
    int kvh = h / s->group, HS = s->HS, NH = s->NH;
    size_t orow = ((size_t)b * s->T + t) * NH * HS + (size_t)h * HS;
    const float *q = qkv + row_off(s, b, t) + (size_t)h * HS;
    const float *dy = dout + orow;
    float l = lse[((size_t)b * NH + h) * s->T + t];
    float D = dot(dy, out + orow, HS);
    memset(w->dq, 0, (size_t)HS * sizeof(float));
    for (int j = 0; j <= t; j++) {
        const float *k = qkv + row_off(s, b, j) + k_col(s, kvh);
        const float *v = qkv + row_off(s, b, j) + v_col(s, kvh);
        /* libm here: one exp per key stays scalar, and glibc's expf beats nb_expf one at a time
         * (the gpt2-proxy backward: 28.8 vs 32.9 ms) */
        float p = expf(dot(q, k, HS) * s->scale - l);
        float ds = p * (dot(dy, v, HS) - D);
        axpy(w->dq, ds, k, HS);
        axpy(w->dk + (size_t)j * HS, ds * s->scale, q, HS);
        axpy(w->dv + (size_t)j * HS, p, dy, HS);
    }
    float *dq = dqkv + row_off(s, b, t) + (size_t)h * HS;
    for (int i = 0; i < HS; i++) dq[i] += s->scale * w->dq[i];
}

void nb_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out,
                           const float *lse, int B, int T, int NH, int NKV, int HS) {
    if (!dqkv) return;
    attn_shape s = attn_shape_of(B, T, NH, NKV, HS);
#pragma omp parallel
    {
        attn_scratch w;
        w.dk = nb_malloc((size_t)T * HS * sizeof(float), "attention dk scratch");
        w.dv = nb_malloc((size_t)T * HS * sizeof(float), "attention dv scratch");
        w.dq = nb_malloc((size_t)HS * sizeof(float), "attention dq scratch");
#pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < B; b++)
            for (int kvh = 0; kvh < NKV; kvh++) {
                memset(w.dk, 0, (size_t)T * HS * sizeof(float));
                memset(w.dv, 0, (size_t)T * HS * sizeof(float));
                for (int h = kvh * s.group; h < (kvh + 1) * s.group; h++)
                    for (int t = 0; t < T; t++) attn_row_backward(dqkv, &w, dout, qkv, out, lse, &s, b, h, t);
                for (int j = 0; j < T; j++) {
                    float *dk = dqkv + row_off(&s, b, j) + k_col(&s, kvh);
                    float *dv = dqkv + row_off(&s, b, j) + v_col(&s, kvh);
                    for (int i = 0; i < HS; i++) {
                        dk[i] += w.dk[(size_t)j * HS + i];
                        dv[i] += w.dv[(size_t)j * HS + i];
                    }
                }
            }
        free(w.dk);
        free(w.dv);
        free(w.dq);
    }
}
