/* Optimizer and schedule helpers on the CPU: AdamW against its formula in double (with and
 * without weight decay, bitwise over thread counts), the global-norm helpers (sumsq exact to
 * 1e-12 and thread-independent, scale, clip factor) and the cosine learning-rate schedule. */
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "optest.h"
#include "optim/optim.h"
#include "uref.h"

/* ---- AdamW, norms, lr ---- */

/* The header's formula in double, from the same float hyperparameters. */
static void adamw_ref(double *p, const float *g, double *m, double *v, size_t n, nb_adamw_cfg c, int t) {
    for (size_t i = 0; i < n; i++) {
        p[i] -= (double)c.lr * c.weight_decay * p[i];
        m[i] = c.beta1 * m[i] + (1.0 - c.beta1) * g[i];
        v[i] = c.beta2 * v[i] + (1.0 - c.beta2) * (double)g[i] * g[i];
        double mh = m[i] / (1.0 - pow(c.beta1, t)), vh = v[i] / (1.0 - pow(c.beta2, t));
        p[i] -= c.lr * mh / (sqrt(vh) + c.eps);
    }
}

static void adamw_case(nb_adamw_cfg cfg) {
    size_t n = 1000;
    float *p = falloc(n), *g = falloc(n), *m = falloc(n), *v = falloc(n);
    double *pd = dalloc(n), *md = dalloc(n), *vd = dalloc(n);
    fill(p, n, -1, 1);
    to_double(pd, p, n);
    for (int t = 1; t <= 6; t++) {
        fill(g, n, -0.1f, 0.1f);
        for (size_t i = 0; i < n; i += 17) g[i] = 0.0f; /* eps dominates there at step 1 */
        nb_adamw_update(p, g, m, v, n, cfg, t);
        adamw_ref(pd, g, md, vd, n, cfg, t);
        double worst = 0;
        for (size_t i = 0; i < n; i++) worst = fmax(worst, fabs(p[i] - pd[i]));
        /* a step moves p by ~lr; float rounding of p ~ 1e-7 per step */
        ot_err(worst, 2e-6);
        CHECK(worst < 2e-6, "step %d wd %g: max |p - ref| = %.3g", t, (double)cfg.weight_decay, worst);
        CHECK(rel_err_d(m, md, n) < 1e-6 && rel_err_d(v, vd, n) < 1e-6, "step %d: moments differ", t);
    }
    free(p), free(g), free(m), free(v), free(pd), free(md), free(vd);
}

TEST_CASE(test_adamw) {
    ur_reset();
    nb_adamw_cfg with_wd = {1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f};
    nb_adamw_cfg no_wd = {3e-3f, 0.9f, 0.999f, 1e-8f, 0.0f};
    adamw_case(with_wd);
    adamw_case(no_wd);
}

TEST_CASE(test_adamw_threads) {
    ur_reset();
    size_t n = 100003;
    nb_adamw_cfg cfg = {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f};
    float *g = falloc(n), *p0 = falloc(n), *p[2], *m[2], *v[2];
    fill(g, n, -1, 1);
    fill(p0, n, -1, 1);
    int saved = omp_get_max_threads();
    for (int r = 0; r < 2; r++) {
        p[r] = falloc(n), m[r] = falloc(n), v[r] = falloc(n);
        memcpy(p[r], p0, n * sizeof(float));
        omp_set_num_threads(r + 1);
        for (int t = 1; t <= 3; t++) nb_adamw_update(p[r], g, m[r], v[r], n, cfg, t);
    }
    omp_set_num_threads(saved);
    CHECK(memcmp(p[0], p[1], n * sizeof(float)) == 0 && memcmp(m[0], m[1], n * sizeof(float)) == 0 &&
              memcmp(v[0], v[1], n * sizeof(float)) == 0,
          "AdamW differs between 1 and 2 threads");
    for (int r = 0; r < 2; r++) free(p[r]), free(m[r]), free(v[r]);
    free(g), free(p0);
}

TEST_CASE(test_sumsq) {
    ur_reset();
    size_t n = 3000017; /* several blocks and several groups of blocks, plus a ragged tail */
    float *g = falloc(n);
    fill(g, n, -1, 1);
    long double ref = 0;
    for (size_t i = 0; i < n; i++) ref += (long double)g[i] * g[i];
    int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    double s1 = nb_sumsq(g, n);
    omp_set_num_threads(2);
    double s2 = nb_sumsq(g, n), s3 = nb_sumsq(g, n);
    omp_set_num_threads(saved);
    ot_err(fabs(s1 - (double)ref) / (double)ref, 1e-12);
    CHECK(fabs(s1 - (double)ref) < 1e-12 * (double)ref, "sumsq %.17g vs %.17g", s1, (double)ref);
    CHECK(memcmp(&s1, &s2, sizeof s1) == 0 && memcmp(&s2, &s3, sizeof s2) == 0,
          "sumsq depends on threads: %.17g %.17g %.17g", s1, s2, s3);
    float small[3] = {3, -4, 12};
    CHECK(nb_sumsq(small, 3) == 169.0 && nb_sumsq(small, 0) == 0.0, "sumsq of small vectors wrong");

    nb_scale_inplace(small, 3, 0.5f);
    CHECK(small[0] == 1.5f && small[1] == -2.0f && small[2] == 6.0f, "scale_inplace wrong");
    free(g);
}

TEST_CASE(test_clip_factor) {
    ur_reset();
    CHECK(nb_clip_factor(10.0, 1.0f) == (float)(1.0 / (10.0 + 1e-6)), "clip 10 -> 1");
    CHECK(nb_clip_factor(0.5, 1.0f) == 1.0f, "no clip below max_norm");
    CHECK(nb_clip_factor(1e9, 0.0f) == 1.0f && nb_clip_factor(1e9, -1.0f) == 1.0f, "max_norm <= 0 disables");
    CHECK(isnan(nb_clip_factor(NAN, 1.0f)), "NaN norm must propagate");
    CHECK(nb_clip_factor(INFINITY, 1.0f) == 0.0f, "inf norm gives factor 0 (as torch)");
}

TEST_CASE(test_lr_cosine) {
    ur_reset();
    float mx = 1e-3f, mn = 1e-4f;
    int warm = 10, total = 110;
    CHECK(fabsf(nb_lr_cosine(0, warm, total, mx, mn) - mx / 10) < 1e-10f, "step 0 = max_lr / warmup");
    CHECK(nb_lr_cosine(warm - 1, warm, total, mx, mn) == mx, "last warmup step = max_lr");
    CHECK(nb_lr_cosine(warm, warm, total, mx, mn) == mx, "decay starts at max_lr");
    CHECK(fabsf(nb_lr_cosine(60, warm, total, mx, mn) - (mx + mn) / 2) < 1e-10f, "cosine midpoint");
    CHECK(fabsf(nb_lr_cosine(35, warm, total, mx, mn) - (float)(mn + 0.5 * (1 + cos(M_PI / 4)) * (mx - mn))) <
              1e-10f,
          "cosine quarter point");
    CHECK(nb_lr_cosine(total, warm, total, mx, mn) == mn, "end = min_lr");
    CHECK(nb_lr_cosine(total + 50, warm, total, mx, mn) == mn, "past the end = min_lr");
    CHECK(nb_lr_cosine(0, 0, total, mx, mn) == mx, "no warmup starts at max_lr");
    int mono = 1;
    for (int s = warm; s < total; s++)
        mono &= nb_lr_cosine(s + 1, warm, total, mx, mn) <= nb_lr_cosine(s, warm, total, mx, mn);
    CHECK(mono, "cosine decay is not monotone");
}


static const ot_row rows[] = {
    {"adamw", "cpu", OT_F32, "1000 x 6 steps, wd 0.1 / 0", 2e-6, OT_EVAL, test_adamw, 0, 0},
    {"adamw_threads", "cpu", OT_F32, "100003 x 3 steps", 0, OT_EVAL, test_adamw_threads, 0, 0},
    {"sumsq", "cpu", OT_F32, "3000017, 3", 1e-12, OT_EVAL, test_sumsq, 0, 0},
    {"clip_factor", "cpu", OT_NONE, "scalars", 0, OT_EVAL, test_clip_factor, 0, 0},
    {"lr_cosine", "cpu", OT_NONE, "warmup 10, 110 steps", 0, OT_EVAL, test_lr_cosine, 0, 0},
};
OT_TABLE(ot_optim, rows);
