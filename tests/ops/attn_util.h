/* Shared by the attention rows written against bf16 kernels (emu_fa.c, attention_fa_cuda.c,
 * attention_cudnn.c): bf16-rounded random tensors and the comparisons (out, lse, and dq, dk, dv
 * compared separately so an error in one cannot hide in the others). Define TOL before including. */
#ifndef NB_OT_ATTN_UTIL_H
#define NB_OT_ATTN_UTIL_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../bf16_host.h"
#include "core.h"
#include "optest.h"
#include "rng.h"

/* ---- host helpers ---- */

/* Normal values already rounded to bf16, so the CPU sees what the GPU sees. */
static inline float *randn_bf(size_t n, float std) {
    float *p = nb_malloc((n ? n : 1) * sizeof(float), "test tensor");
    nb_rng_fill_normal(p, n, SEED, ot_stream++, 0.0f, std);
    for (size_t i = 0; i < n; i++) p[i] = bf2f(f2bf(p[i]));
    return p;
}

static inline float *zeros(size_t n) { return nb_calloc(n ? n : 1, sizeof(float), "test tensor"); }

static inline float *copy_of(const float *h, size_t n) {
    float *p = nb_malloc((n ? n : 1) * sizeof(float), "test tensor");
    memcpy(p, h, n * sizeof(float));
    return p;
}

static inline double rms(const float *x, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return n ? sqrt(s / n) : 0;
}

/* ---- comparisons ---- */

static inline void expect_close(const char *what, const float *got, const float *ref, size_t n, double tol) {
    double e = rel_err(got, ref, n);
    ot_err(e, tol);
    ot_log("    %-58s rel err %.2e\n", what, e);
    CHECK(e <= tol, "%s: relative error %.3g > %.3g", what, e, tol);
}

static inline void expect_same(const char *what, const float *a, const float *b, size_t n) {
    CHECK(memcmp(a, b, n * sizeof(float)) == 0, "%s: results differ bitwise", what);
}

/* Increments (got - init, ref - init) of the q, k and v columns of dqkv, compared separately. */
static inline void expect_dqkv(const char *tag, const float *got, const float *ref, const float *init, int BT, int NH,
                        int NKV, int HS) {
    int R = (NH + 2 * NKV) * HS, c0[4] = {0, NH * HS, (NH + NKV) * HS, R};
    static const char *name[3] = {"dq", "dk", "dv"};
    for (int part = 0; part < 3; part++) {
        size_t w = (size_t)(c0[part + 1] - c0[part]), n = (size_t)BT * w;
        float *dg = zeros(n), *dr = zeros(n);
        for (size_t r = 0; r < (size_t)BT; r++)
            for (size_t c = 0; c < w; c++) {
                size_t i = r * R + c0[part] + c;
                dg[r * w + c] = got[i] - init[i];
                dr[r * w + c] = ref[i] - init[i];
            }
        char what[256];
        snprintf(what, sizeof what, "%s bwd %s", tag, name[part]);
        expect_close(what, dg, dr, n, TOL);
        free(dg), free(dr);
    }
}

#endif
