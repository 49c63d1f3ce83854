/* Elementwise activations and residual adds on the CPU. Every element is independent, so any
 * OpenMP split gives the same bits. Backward functions accumulate (dinp += ...), so dinp must
 * not alias dout. */
#include <math.h>

#include "core.h"
#include "ops/ops.h"

/* ---- GELU, tanh approximation (HF "gelu_new", GPT-2) ---- */

#define NB_GELU_K 0.7978845608028654f /* sqrt(2 / pi) */
#define NB_GELU_A 0.044715f

void nb_gelu_forward(float *out, const float *inp, size_t n) {
    NB_ASSERT(out && inp);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = NB_GELU_K * (x + NB_GELU_A * x * x * x);
        out[i] = 0.5f * x * (1.0f + tanhf(u));
    }
}

/* d/dx [0.5 x (1 + tanh u)] = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) du/dx,
 * du/dx = k (1 + 3 a x^2). */
void nb_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n) {
    if (!dinp) return;
    NB_ASSERT(inp && dout && dinp != dout);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = NB_GELU_K * (x + NB_GELU_A * x * x * x);
        float t = tanhf(u);
        float du = NB_GELU_K * (1.0f + 3.0f * NB_GELU_A * x * x);
        float local = 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
        dinp[i] += local * dout[i];
    }
}

/* ---- SwiGLU on a fused [N, 2F] projection: gate = gu[:, :F], up = gu[:, F:] ---- */

/* silu(g) = g * sigmoid(g), written as torch does (g / (1 + exp(-g))). For g < -88 exp
 * overflows to inf and silu is -0, the right limit, not NaN. */
void nb_swiglu_forward(float *out, const float *gu, int N, int F) {
    NB_ASSERT(out && gu && N >= 0 && F >= 0);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *g = gu + (size_t)n * 2 * F, *u = g + F;
        float *o = out + (size_t)n * F;
        for (int i = 0; i < F; i++) o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
}

/* With s = sigmoid(g): d silu/dg = s (1 + g (1 - s)); d out/d up = silu(g). */
void nb_swiglu_backward(float *dgu, const float *dout, const float *gu, int N, int F) {
    if (!dgu) return;
    NB_ASSERT(dout && gu && N >= 0 && F >= 0);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *g = gu + (size_t)n * 2 * F, *u = g + F;
        const float *dy = dout + (size_t)n * F;
        float *dg = dgu + (size_t)n * 2 * F, *du = dg + F;
        for (int i = 0; i < F; i++) {
            float e1 = 1.0f + expf(-g[i]);
            float s = 1.0f / e1, silu = g[i] / e1; /* silu exactly as the forward rounds it */
            dg[i] += dy[i] * u[i] * s * (1.0f + g[i] * (1.0f - s));
            du[i] += dy[i] * silu;
        }
    }
}

/* ---- residual ---- */

void nb_residual_forward(float *out, const float *a, const float *b, size_t n) {
    NB_ASSERT(out && a && b);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void nb_add_inplace(float *dst, const float *src, size_t n) {
    NB_ASSERT(dst && src);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) dst[i] += src[i];
}
