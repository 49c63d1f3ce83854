/* Attention over jagged user histories on the CPU: masked multi-head self-attention (the history
 * encoder) and target attention (the target item pools the history).
 *
 * Histories are padded to L rows with a length per sample. Padded keys are masked, padded query
 * rows output zeros, and padded rows never receive gradient, so the padding's contents (whatever
 * the previous layer left there) cannot leak into the result.
 *
 * Determinism: the work splits over (sample, head) for self-attention and over samples for
 * target attention; each work item owns every gradient element it writes (its head's columns of
 * its sample), and sums in a fixed order inside. No cross-thread reductions. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "ops/ops_ctr.h"

static void seq_check_lengths(const int32_t *lengths, int B, int L) {
    for (int b = 0; b < B; b++)
        NB_CHECK(lengths[b] >= 0 && lengths[b] <= L, "cap history lengths at max_len when building the batch",
                 "history length %d of sample %d is outside [0, %d]", (int)lengths[b], b, L);
}

static float dotf(const float *a, const float *b, int n) {
    float s = 0.0f;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* ---- masked self-attention ---- */

/* One (sample, head): rows i < len attend to keys j < len. p is scratch of L floats. */
static void seqattn_fwd_head(float *out, float *lse, const float *qkv, int len, int L, int E, int HS, int h,
                             float scale, float *p) {
    size_t ld = (size_t)3 * E;
    for (int i = 0; i < L; i++) {
        float *o = out + (size_t)i * E + (size_t)h * HS;
        memset(o, 0, (size_t)HS * sizeof(float));
        lse[i] = 0.0f;
        if (i >= len) continue;
        const float *q = qkv + i * ld + (size_t)h * HS;
        float mx = -INFINITY;
        for (int j = 0; j < len; j++) {
            p[j] = scale * dotf(q, qkv + j * ld + E + (size_t)h * HS, HS);
            if (p[j] > mx) mx = p[j];
        }
        float sum = 0.0f;
        for (int j = 0; j < len; j++) {
            p[j] = expf(p[j] - mx);
            sum += p[j];
        }
        float inv = 1.0f / sum;
        for (int j = 0; j < len; j++) {
            const float *v = qkv + j * ld + 2 * (size_t)E + (size_t)h * HS;
            float a = p[j] * inv;
            for (int d = 0; d < HS; d++) o[d] += a * v[d];
        }
        lse[i] = mx + logf(sum);
    }
}

void nb_seqattn_forward(float *out, float *lse, const float *qkv, const int32_t *lengths, int B, int L, int H,
                        int E) {
    NB_ASSERT(out && lse && qkv && lengths && B >= 0 && L >= 0 && H > 0 && E > 0 && E % H == 0);
    seq_check_lengths(lengths, B, L);
    int HS = E / H;
    float scale = 1.0f / sqrtf((float)HS);
#pragma omp parallel
    {
        float *p = nb_malloc((size_t)(L ? L : 1) * sizeof(float), "attention scores");
#pragma omp for schedule(static)
        for (int bh = 0; bh < B * H; bh++) {
            int b = bh / H, h = bh % H;
            seqattn_fwd_head(out + (size_t)b * L * E, lse + (size_t)bh * L, qkv + (size_t)b * L * 3 * E, lengths[b],
                             L, E, HS, h, scale, p);
        }
        free(p);
    }
}

/* dS_ij = P_ij (dout_i . v_j - dout_i . out_i), with P recomputed from the saved lse. */
static void seqattn_bwd_head(float *dqkv, const float *dout, const float *qkv, const float *out, const float *lse,
                             int len, int E, int HS, int h, float scale) {
    size_t ld = (size_t)3 * E, hc = (size_t)h * HS;
    for (int i = 0; i < len; i++) {
        const float *q = qkv + i * ld + hc, *dO = dout + (size_t)i * E + hc, *o = out + (size_t)i * E + hc;
        float *dq = dqkv + i * ld + hc;
        float Di = dotf(dO, o, HS);
        for (int j = 0; j < len; j++) {
            const float *k = qkv + j * ld + E + hc, *v = qkv + j * ld + 2 * (size_t)E + hc;
            float *dk = dqkv + j * ld + E + hc, *dv = dqkv + j * ld + 2 * (size_t)E + hc;
            float P = expf(scale * dotf(q, k, HS) - lse[i]);
            float dS = P * (dotf(dO, v, HS) - Di) * scale;
            for (int d = 0; d < HS; d++) {
                dv[d] += P * dO[d];
                dq[d] += dS * k[d];
                dk[d] += dS * q[d];
            }
        }
    }
}

void nb_seqattn_backward(float *dqkv, const float *dout, const float *qkv, const float *out, const float *lse,
                         const int32_t *lengths, int B, int L, int H, int E) {
    NB_ASSERT(lengths && B >= 0 && L >= 0 && H > 0 && E > 0 && E % H == 0);
    if (!dqkv) return;
    NB_ASSERT(dout && qkv && out && lse);
    seq_check_lengths(lengths, B, L);
    int HS = E / H;
    float scale = 1.0f / sqrtf((float)HS);
#pragma omp parallel for schedule(static)
    for (int bh = 0; bh < B * H; bh++) {
        int b = bh / H, h = bh % H;
        size_t so = (size_t)b * L * E, sq = (size_t)b * L * 3 * E;
        seqattn_bwd_head(dqkv + sq, dout + so, qkv + sq, out + so, lse + (size_t)bh * L, lengths[b], E, HS, h,
                         scale);
    }
}

/* ---- target attention ---- */

void nb_targetattn_forward(float *pooled, float *attn, const float *q, const float *k, const float *v,
                           const int32_t *lengths, int B, int L, int E, int ldkv) {
    NB_ASSERT(pooled && attn && q && k && v && lengths && B >= 0 && L >= 0 && E > 0 && ldkv >= E);
    seq_check_lengths(lengths, B, L);
    float scale = 1.0f / sqrtf((float)E);
#pragma omp parallel for schedule(static)
    for (int b = 0; b < B; b++) {
        int len = lengths[b];
        const float *qb = q + (size_t)b * E;
        const float *kb = k + (size_t)b * L * ldkv, *vb = v + (size_t)b * L * ldkv;
        float *a = attn + (size_t)b * L, *o = pooled + (size_t)b * E;
        memset(a, 0, (size_t)L * sizeof(float));
        memset(o, 0, (size_t)E * sizeof(float));
        if (len == 0) continue;
        float mx = -INFINITY, sum = 0.0f;
        for (int j = 0; j < len; j++) {
            a[j] = scale * dotf(qb, kb + (size_t)j * ldkv, E);
            if (a[j] > mx) mx = a[j];
        }
        for (int j = 0; j < len; j++) {
            a[j] = expf(a[j] - mx);
            sum += a[j];
        }
        float inv = 1.0f / sum;
        for (int j = 0; j < len; j++) {
            a[j] *= inv;
            const float *vj = vb + (size_t)j * ldkv;
            for (int e = 0; e < E; e++) o[e] += a[j] * vj[e];
        }
    }
}

void nb_targetattn_backward(float *dq, float *dk, float *dv, const float *dpooled, const float *q, const float *k,
                            const float *v, const float *attn, const int32_t *lengths, int B, int L, int E,
                            int ldkv) {
    NB_ASSERT(lengths && B >= 0 && L >= 0 && E > 0 && ldkv >= E);
    if (!dq && !dk && !dv) return;
    NB_ASSERT(dpooled && q && k && v && attn);
    seq_check_lengths(lengths, B, L);
    float scale = 1.0f / sqrtf((float)E);
#pragma omp parallel for schedule(static)
    for (int b = 0; b < B; b++) {
        int len = lengths[b];
        const float *qb = q + (size_t)b * E, *dp = dpooled + (size_t)b * E, *a = attn + (size_t)b * L;
        size_t kvo = (size_t)b * L * ldkv;
        /* ds_j = a_j (da_j - sum_i a_i da_i), da_j = dpooled . v_j; then the 1/sqrt(E) of the scores. */
        float ada = 0.0f;
        for (int j = 0; j < len; j++) ada += a[j] * dotf(dp, v + kvo + (size_t)j * ldkv, E);
        for (int j = 0; j < len; j++) {
            const float *vj = v + kvo + (size_t)j * ldkv, *kj = k + kvo + (size_t)j * ldkv;
            float ds = a[j] * (dotf(dp, vj, E) - ada) * scale;
            if (dv) {
                float *g = dv + kvo + (size_t)j * ldkv;
                for (int e = 0; e < E; e++) g[e] += a[j] * dp[e];
            }
            if (dk) {
                float *g = dk + kvo + (size_t)j * ldkv;
                for (int e = 0; e < E; e++) g[e] += ds * qb[e];
            }
            if (dq) {
                float *g = dq + (size_t)b * E;
                for (int e = 0; e < E; e++) g[e] += ds * kj[e];
            }
        }
    }
}
