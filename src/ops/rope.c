/* Rotary position embedding (HF Llama, rotate_half convention), CPU fp32.
 *
 * The angles are computed the way transformers' LlamaRotaryEmbedding computes them, in float:
 *   inv_freq[i] = 1.0f / powf(theta, (float)(2i) / (float)HS)   (torch: arange(0,HS,2).float()/HS)
 *                 then scaled by the rope type (nb_rope_inv_freq below)
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

const char *nb_rope_type_name(nb_rope_type t) {
    return t == NB_ROPE_DEFAULT ? "default" : t == NB_ROPE_LINEAR ? "linear" : t == NB_ROPE_LLAMA3 ? "llama3" : NULL;
}

/* transformers' _compute_llama3_parameters, one element of its float32 tensors at a time. torch
 * rounds every op to float (no contraction: C11 mode keeps -ffp-contract=off), casts each Python
 * number to float where it meets the tensor, and computes `number / tensor` as
 * tensor.reciprocal() * number; the Python-side quotients (the wavelengths' bounds) are doubles. */
static float llama3_inv_freq(const nb_rope *r, float inv_freq) {
    float low_wavelen = (float)((double)r->original_ctx / (double)r->low_freq_factor);
    float high_wavelen = (float)((double)r->original_ctx / (double)r->high_freq_factor);
    float wavelen = (1.0f / inv_freq) * (float)(2.0 * M_PI);
    if (wavelen > low_wavelen) return inv_freq / r->factor;
    if (wavelen < high_wavelen) return inv_freq;
    float smooth = ((1.0f / wavelen) * (float)r->original_ctx - r->low_freq_factor) /
                   (float)((double)r->high_freq_factor - (double)r->low_freq_factor);
    float a = (1.0f - smooth) * inv_freq, b = smooth * inv_freq;
    return a / r->factor + b;
}

float nb_rope_inv_freq(const nb_rope *r, int i, int HS) {
    float inv_freq = 1.0f / powf(r->theta, (float)(2 * i) / (float)HS);
    if (r->type == NB_ROPE_LINEAR) return inv_freq / r->factor;
    if (r->type == NB_ROPE_LLAMA3) return llama3_inv_freq(r, inv_freq);
    return inv_freq;
}

/* cs[t*h + i] = cos, sn[t*h + i] = sin of position t, frequency i. */
static void rope_table(float *cs, float *sn, int T, int HS, const nb_rope *r) {
    int h = HS / 2;
    float *inv = nb_malloc((size_t)h * sizeof(float), "rope frequencies");
    for (int i = 0; i < h; i++) inv[i] = nb_rope_inv_freq(r, i, HS);
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < h; i++) {
            float angle = (float)t * inv[i];
            cs[(size_t)t * h + i] = (float)cos((double)angle);
            sn[(size_t)t * h + i] = (float)sin((double)angle);
        }
    }
    free(inv);
}

/* Rotates every head of every row by +angle (sign = 1) or -angle (sign = -1). The backward of a
 * rotation is its transpose, i.e. the rotation by -angle, so one routine serves both. */
static void rope_apply(float *x, int B, int T, int nheads, int HS, int row_stride, const nb_rope *r, int sign) {
    NB_ASSERT(HS > 0 && HS % 2 == 0 && nheads >= 0 && row_stride >= nheads * HS);
    if (B <= 0 || T <= 0 || nheads == 0) return;
    int h = HS / 2;
    float *cs = nb_malloc((size_t)T * h * sizeof(float), "rope cos table");
    float *sn = nb_malloc((size_t)T * h * sizeof(float), "rope sin table");
    rope_table(cs, sn, T, HS, r);
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

void nb_rope_forward(float *x, int B, int T, int nheads, int HS, int row_stride, const nb_rope *r) {
    rope_apply(x, B, T, nheads, HS, row_stride, r, 1);
}

void nb_rope_backward(float *dx, int B, int T, int nheads, int HS, int row_stride, const nb_rope *r) {
    if (!dx) return;
    rope_apply(dx, B, T, nheads, HS, row_stride, r, -1);
}
