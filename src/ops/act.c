/* Elementwise activations and residual adds on the CPU. Every element is independent, so any
 * OpenMP split gives the same bits. Backward functions accumulate (dinp += ...), so dinp must
 * not alias dout. */
#include <math.h>

#include "core.h"
#include "vmath.h"
#include "ops/ops.h"

/* ---- GELU, tanh approximation (HF "gelu_new", GPT-2) ----
 * 0.5 (1 + tanh u) = sigmoid(2u), so gelu(x) = x sigmoid(2u) with u = k (x + a x^3): one exp
 * (nb_expf: loops of it vectorize; tanhf is a libm call per element) and no cancellation near
 * u = 0. The loops run over chunks in an OpenMP region; each chunk is a NB_SIMD_CLONES call. */

#define NB_GELU_K 0.7978845608028654f /* sqrt(2 / pi) */
#define NB_GELU_A 0.044715f
#define ACT_CHUNK 4096

/* elements of the chunk at c of an n-element array */
static inline size_t chunk_len(size_t n, size_t c) { return n - c < ACT_CHUNK ? n - c : ACT_CHUNK; }

NB_SIMD_CLONES
static void gelu_forward_span(float *out, const float *inp, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = NB_GELU_K * (x + NB_GELU_A * x * x * x);
        out[i] = x / (1.0f + nb_expf(-2.0f * u));
    }
}

void nb_gelu_forward(float *out, const float *inp, size_t n) {
    NB_ASSERT(out && inp);
#pragma omp parallel for schedule(static)
    for (size_t c = 0; c < n; c += ACT_CHUNK) gelu_forward_span(out + c, inp + c, chunk_len(n, c));
}

/* With s = sigmoid(2u): d/dx [x s] = s + x 2 s (1 - s) du/dx, du/dx = k (1 + 3 a x^2). */
NB_SIMD_CLONES
static void gelu_backward_span(float *dinp, const float *inp, const float *dout, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = NB_GELU_K * (x + NB_GELU_A * x * x * x);
        float s = 1.0f / (1.0f + nb_expf(-2.0f * u));
        float du = NB_GELU_K * (1.0f + 3.0f * NB_GELU_A * x * x);
        float local = s + 2.0f * x * s * (1.0f - s) * du;
        dinp[i] += local * dout[i];
    }
}

void nb_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n) {
    if (!dinp) return;
    NB_ASSERT(inp && dout && dinp != dout);
#pragma omp parallel for schedule(static)
    for (size_t c = 0; c < n; c += ACT_CHUNK) gelu_backward_span(dinp + c, inp + c, dout + c, chunk_len(n, c));
}

/* ---- SwiGLU on a fused [N, 2F] projection: gate = gu[:, :F], up = gu[:, F:] ---- */

/* silu(g) = g * sigmoid(g), written as torch does (g / (1 + exp(-g))). For g < -88 exp
 * overflows to inf and silu is -0, the right limit, not NaN. */
NB_SIMD_CLONES
static void swiglu_forward_row(float *o, const float *g, const float *u, int F) {
    for (int i = 0; i < F; i++) o[i] = g[i] / (1.0f + nb_expf(-g[i])) * u[i];
}

void nb_swiglu_forward(float *out, const float *gu, int N, int F) {
    NB_ASSERT(out && gu && N >= 0 && F >= 0);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *g = gu + (size_t)n * 2 * F;
        swiglu_forward_row(out + (size_t)n * F, g, g + F, F);
    }
}

/* With s = sigmoid(g): d silu/dg = s (1 + g (1 - s)); d out/d up = silu(g). */
NB_SIMD_CLONES
static void swiglu_backward_row(float *dg, float *du, const float *dy, const float *g, const float *u, int F) {
    for (int i = 0; i < F; i++) {
        float e1 = 1.0f + nb_expf(-g[i]);
        float s = 1.0f / e1, silu = g[i] / e1; /* silu exactly as the forward rounds it */
        dg[i] += dy[i] * u[i] * s * (1.0f + g[i] * (1.0f - s));
        du[i] += dy[i] * silu;
    }
}

void nb_swiglu_backward(float *dgu, const float *dout, const float *gu, int N, int F) {
    if (!dgu) return;
    NB_ASSERT(dout && gu && N >= 0 && F >= 0);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *g = gu + (size_t)n * 2 * F;
        float *dg = dgu + (size_t)n * 2 * F;
        swiglu_backward_row(dg, dg + F, dout + (size_t)n * F, g, g + F, F);
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

/* ---- scaled column slices (LoRA: a low-rank branch into a slice of a fused projection) ---- */

void nb_scale_cols(float *dst, int ld_dst, const float *src, int ld_src, int rows, int cols, float alpha, int acc) {
    NB_ASSERT(dst && src && cols <= ld_dst && cols <= ld_src);
#pragma omp parallel for schedule(static)
    for (int i = 0; i < rows; i++) {
        float *d = dst + (size_t)i * ld_dst;
        const float *x = src + (size_t)i * ld_src;
        for (int j = 0; j < cols; j++) d[j] = acc ? d[j] + alpha * x[j] : alpha * x[j];
    }
}
