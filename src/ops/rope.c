/* Rotary position embedding (HF Llama, rotate_half convention), CPU fp32.
 *
 * The angles are computed the way transformers' LlamaRotaryEmbedding computes them, in float:
 *   inv_freq[i] = 1.0f / powf(theta, (float)(2i) / (float)HS)   (torch: arange(0,HS,2).float()/HS)
 *   angle       = (float)t * inv_freq[i]                        (torch: position_ids.float() @ inv_freq)
 *   cos, sin    = cos/sin of that float angle, rounded to float
 * so the angle itself is bitwise what torch holds. torch's CPU cos/sin (SLEEF, 1-ulp) may differ
 * from our correctly rounded (float)cos((double)angle) by one ulp in rare cases.
 * Rotation (rotate_half): for i < HS/2, with h = HS/2,
 *   y[i]   = x[i]   * cos - x[i+h] * sin
 *   y[i+h] = x[i+h] * cos + x[i]   * sin
 * each product rounded separately (torch runs q*cos + rotate_half(q)*sin as separate ops). */
#include "ops/ops.h"

#include "core.h"

#include <math.h>
#include <stdlib.h>

/* cs[t*h + i] = cos, sn[t*h + i] = sin of position t, frequency i. */
static void rope_table(float *cs, float *sn, int T, int HS, float theta) {
    int h = HS / 2;
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < h; i++) {
            float inv_freq = 1.0f / powf(theta, (float)(2 * i) / (float)HS);
            float angle = (float)t * inv_freq;
            cs[(size_t)t * h + i] = (float)cos((double)angle);
            sn[(size_t)t * h + i] = (float)sin((double)angle);
        }
    }
}

/* Rotates every head of every row by +angle (sign = 1) or -angle (sign = -1). The backward of a
 * rotation is its transpose, i.e. the rotation by -angle, so one routine serves both. */
static void rope_apply(float *x, int B, int T, int nheads, int HS, int row_stride, float theta, int sign) {
    NB_ASSERT(HS > 0 && HS % 2 == 0 && nheads >= 0 && row_stride >= nheads * HS);
    if (B <= 0 || T <= 0 || nheads == 0) return;
    int h = HS / 2;
    float *cs = nb_malloc((size_t)T * h * sizeof(float), "rope cos table");
    float *sn = nb_malloc((size_t)T * h * sizeof(float), "rope sin table");
    rope_table(cs, sn, T, HS, theta);
#pragma omp parallel for schedule(static)
    for (int bt = 0; bt < B * T; bt++) {
        int t = bt % T;
        const float *c = cs + (size_t)t * h;
        const float *s = sn + (size_t)t * h;
        float *row = x + (size_t)bt * row_stride;
        for (int hd = 0; hd < nheads; hd++) {
            float *x1 = row + (size_t)hd * HS;
            float *x2 = x1 + h;
            for (int i = 0; i < h; i++) {
                float a = x1[i], b = x2[i];
                float si = sign > 0 ? s[i] : -s[i];
                x1[i] = a * c[i] - b * si;
                x2[i] = b * c[i] + a * si;
            }
        }
    }
    free(cs);
    free(sn);
}

void nb_rope_forward(float *x, int B, int T, int nheads, int HS, int row_stride, float theta) {
    rope_apply(x, B, T, nheads, HS, row_stride, theta, 1);
}

void nb_rope_backward(float *dx, int B, int T, int nheads, int HS, int row_stride, float theta) {
    if (!dx) return;
    rope_apply(dx, B, T, nheads, HS, row_stride, theta, -1);
}
