/* LayerNorm (torch.nn.LayerNorm) and RMSNorm (HF LlamaRMSNorm) on the CPU.
 *
 * Row statistics are accumulated in double: this is the reference the CUDA kernels are checked
 * against. Backward runs in two passes so that it is deterministic: pass 1 computes dinp row by
 * row (rows are independent), pass 2 gives each thread a block of channels and sums dw / db over
 * the rows in row order. No per-thread partials, so the result does not depend on the thread
 * count or on timing. Pass 2 recomputes the normalized value instead of storing it: one extra
 * multiply per element, no N x C scratch. */
#include <math.h>

#include "core.h"
#include "ops/ops.h"

/* Channels per work item in the dw / db reductions: 64 floats = 256 bytes, so two threads never
 * write the same cache line. */
#define NB_NORM_CBLOCK 64

static int norm_nblocks(int C) { return (C + NB_NORM_CBLOCK - 1) / NB_NORM_CBLOCK; }

/* ---- LayerNorm ---- */

void nb_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w,
                          const float *b, int N, int C, float eps) {
    NB_ASSERT(out && mean && rstd && inp && w && b && N >= 0 && C > 0);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float *y = out + (size_t)n * C;
        double sum = 0.0;
        for (int i = 0; i < C; i++) sum += x[i];
        double m = sum / C;
        /* Two-pass variance: no cancellation when |mean| >> std. Biased (divide by C), as torch. */
        double ss = 0.0;
        for (int i = 0; i < C; i++) {
            double d = x[i] - m;
            ss += d * d;
        }
        double s = 1.0 / sqrt(ss / C + (double)eps);
        float mf = (float)m, sf = (float)s;
        for (int i = 0; i < C; i++) y[i] = (x[i] - mf) * sf * w[i] + b[i];
        mean[n] = mf;
        rstd[n] = sf;
    }
}

/* With xhat = (x - mean) * rstd and g = w * dout (the gradient reaching xhat):
 * dx = rstd * (g - mean(g) - xhat * mean(g * xhat)). */
static void layernorm_dinp(float *dinp, const float *dout, const float *inp, const float *w,
                           const float *mean, const float *rstd, int N, int C) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C, *dy = dout + (size_t)n * C;
        float *dx = dinp + (size_t)n * C;
        float m = mean[n], s = rstd[n];
        double sum_g = 0.0, sum_gxhat = 0.0;
        for (int i = 0; i < C; i++) {
            float xhat = (x[i] - m) * s;
            float g = w[i] * dy[i];
            sum_g += g;
            sum_gxhat += (double)g * xhat;
        }
        float mean_g = (float)(sum_g / C), mean_gxhat = (float)(sum_gxhat / C);
        for (int i = 0; i < C; i++) {
            float xhat = (x[i] - m) * s;
            float g = w[i] * dy[i];
            dx[i] += (g - mean_g - xhat * mean_gxhat) * s;
        }
    }
}

/* dw[i] += sum_n dout * xhat, db[i] += sum_n dout; either may be NULL. */
static void layernorm_dparams(float *dw, float *db, const float *dout, const float *inp, const float *mean,
                              const float *rstd, int N, int C) {
    int nblocks = norm_nblocks(C);
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < nblocks; blk++) {
        int c0 = blk * NB_NORM_CBLOCK;
        int c1 = c0 + NB_NORM_CBLOCK < C ? c0 + NB_NORM_CBLOCK : C;
        double acc_w[NB_NORM_CBLOCK] = {0}, acc_b[NB_NORM_CBLOCK] = {0};
        for (int n = 0; n < N; n++) {
            const float *x = inp + (size_t)n * C, *dy = dout + (size_t)n * C;
            float m = mean[n], s = rstd[n];
            for (int i = c0; i < c1; i++) {
                float xhat = (x[i] - m) * s;
                acc_w[i - c0] += (double)dy[i] * xhat;
                acc_b[i - c0] += dy[i];
            }
        }
        for (int i = c0; i < c1; i++) {
            if (dw) dw[i] += (float)acc_w[i - c0];
            if (db) db[i] += (float)acc_b[i - c0];
        }
    }
}

void nb_layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                           const float *w, const float *mean, const float *rstd, int N, int C) {
    NB_ASSERT(dout && inp && w && mean && rstd && N >= 0 && C > 0);
    if (dinp) layernorm_dinp(dinp, dout, inp, w, mean, rstd, N, C);
    if (dw || db) layernorm_dparams(dw, db, dout, inp, mean, rstd, N, C);
}

/* ---- RMSNorm ---- */

/* One row: y = w * (x * r), r = (mean(x^2) + eps)^(-1/2), returned. HF LlamaRMSNorm rounds the
 * normalized value before the weight multiplies it, in that order. */
static float rms_row(float *y, const float *x, const float *w, int C, float eps) {
    double ss = 0.0;
    for (int i = 0; i < C; i++) ss += (double)x[i] * x[i];
    float s = (float)(1.0 / sqrt(ss / C + (double)eps));
    for (int i = 0; i < C; i++) {
        float xhat = x[i] * s;
        y[i] = w[i] * xhat;
    }
    return s;
}

void nb_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int N, int C, float eps) {
    NB_ASSERT(out && rstd && inp && w && N >= 0 && C > 0);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) rstd[n] = rms_row(out + (size_t)n * C, inp + (size_t)n * C, w, C, eps);
}

/* y = w * x * r with r = (mean(x^2) + eps)^(-1/2), dr/dx_j = -r^3 x_j / C, so with g = w * dout:
 * dx = r * g - x * r^3 * mean(g * x). Added to dx, or written over it (dx may then alias dy: each
 * element is read before it is written). */
static void rms_row_dinp(float *dx, const float *dy, const float *x, const float *w, float s, int C, int add) {
    double sum_gx = 0.0;
    for (int i = 0; i < C; i++) sum_gx += (double)(w[i] * dy[i]) * x[i];
    float k = (float)(sum_gx / C * (double)s * s * s);
    for (int i = 0; i < C; i++) {
        float d = s * (w[i] * dy[i]) - x[i] * k;
        dx[i] = add ? dx[i] + d : d;
    }
}

static void rmsnorm_dinp(float *dinp, const float *dout, const float *inp, const float *w, const float *rstd,
                         int N, int C) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        rms_row_dinp(dinp + (size_t)n * C, dout + (size_t)n * C, inp + (size_t)n * C, w, rstd[n], C, 1);
}

/* dw += sum over rows r of dout_r * x_r * rstd[r]: x's rows contiguous, dout's row r at
 * (r / nh) * stride + (r % nh) * C (nh = 1, stride = C: a plain [N, C] tensor). */
static void rmsnorm_dw(float *dw, const float *dout, int nh, int stride, const float *inp, const float *rstd, int N,
                       int C) {
    int nblocks = norm_nblocks(C);
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < nblocks; blk++) {
        int c0 = blk * NB_NORM_CBLOCK;
        int c1 = c0 + NB_NORM_CBLOCK < C ? c0 + NB_NORM_CBLOCK : C;
        double acc[NB_NORM_CBLOCK] = {0};
        for (int n = 0; n < N; n++) {
            const float *x = inp + (size_t)n * C, *dy = dout + (size_t)(n / nh) * stride + (size_t)(n % nh) * C;
            float s = rstd[n];
            for (int i = c0; i < c1; i++) acc[i - c0] += (double)dy[i] * (x[i] * s);
        }
        for (int i = c0; i < c1; i++) dw[i] += (float)acc[i - c0];
    }
}

void nb_rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                         const float *rstd, int N, int C) {
    NB_ASSERT(dout && inp && w && rstd && N >= 0 && C > 0);
    if (dinp) rmsnorm_dinp(dinp, dout, inp, w, rstd, N, C);
    if (dw) rmsnorm_dw(dw, dout, 1, C, inp, rstd, N, C);
}

/* ---- per-head RMSNorm on a strided view (Qwen3's q/k norm) ---- */

void nb_headnorm_forward(float *x, float *x_in, float *rstd, const float *w, int N, int nh, int HS, int stride,
                         float eps) {
    NB_ASSERT(x && x_in && rstd && w && N >= 0 && nh >= 0 && HS > 0 && stride >= nh * HS);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        for (int h = 0; h < nh; h++) {
            size_t r = (size_t)n * nh + h;
            float *y = x + (size_t)n * stride + (size_t)h * HS, *keep = x_in + r * HS;
            for (int i = 0; i < HS; i++) keep[i] = y[i];
            rstd[r] = rms_row(y, keep, w, HS, eps);
        }
}

void nb_headnorm_backward(float *dx, float *dw, const float *x_in, const float *w, const float *rstd, int N, int nh,
                          int HS, int stride) {
    NB_ASSERT(dx && x_in && w && rstd && N >= 0 && nh >= 0 && HS > 0 && stride >= nh * HS);
    if (nh == 0) return;
    /* dw first: the pass below overwrites the output gradient it reads */
    if (dw) rmsnorm_dw(dw, dx, nh, stride, x_in, rstd, N * nh, HS);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        for (int h = 0; h < nh; h++) {
            size_t r = (size_t)n * nh + h;
            float *d = dx + (size_t)n * stride + (size_t)h * HS;
            rms_row_dinp(d, d, x_in + r * HS, w, rstd[r], HS, 0);
        }
}
