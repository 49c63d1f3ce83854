/* The per-head RMSNorm of Qwen3's q and k (nb_headnorm_forward / nb_headnorm_backward, norm.c)
 * on the CPU: the cpu rows of the headnorm family (headnorm_cuda.c has the cuda rows).
 *
 * The view is a qkv-like tensor: N rows of `stride` values, nh heads of HS at the row's start and
 * more values after them (the other heads, v) that neither pass may touch. With L = sum(y * R)
 * over the heads:
 * - the forward against a double reference of HF's Qwen3RMSNorm, the kept input exactly the heads'
 *   values, the other values untouched;
 * - forward and backward bitwise equal to nb_rmsnorm_forward / nb_rmsnorm_backward on the heads
 *   gathered into a contiguous [N*nh, HS] tensor (the same math, dw summed in the same order);
 * - dx written in place over dy (not added), dw accumulated, a NULL dw leaving dx's bits;
 * - 1 and 3 OpenMP threads give the same bits;
 * - grad mode: dx and dw against central differences of the double reference. */
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "core.h"
#include "ops/ops.h"
#include "optest.h"
#include "rng.h"

#define SEED 20261206u
#define FWD_TOL 1e-5
#define GRAD_TOL 1e-4

#include "op_util.h"

static float *copy_of_f(const float *x, size_t n) {
    float *p = zeros(n);
    memcpy(p, x, n * sizeof(float));
    return p;
}

typedef struct {
    int N, nh, HS, stride;
    float eps;
    double *xi, *xw; /* the heads [N*nh, HS] and the weight, in double (the finite differences move them) */
    const float *R;  /* dL/dy, [N*nh, HS] */
} hn_case;

static size_t head_off(const hn_case *c, size_t r) { return (r / c->nh) * c->stride + (r % c->nh) * c->HS; }

static double hn_loss(const void *p) {
    const hn_case *c = p;
    double L = 0;
    for (size_t r = 0; r < (size_t)c->N * c->nh; r++) {
        const double *x = c->xi + r * c->HS;
        double ss = 0;
        for (int i = 0; i < c->HS; i++) ss += x[i] * x[i];
        double s = 1.0 / sqrt(ss / c->HS + c->eps);
        for (int i = 0; i < c->HS; i++) L += c->xw[i] * (x[i] * s) * c->R[r * c->HS + i];
    }
    return L;
}

/* the heads of a strided tensor, gathered contiguous */
static float *gather(const hn_case *c, const float *t) {
    size_t R = (size_t)c->N * c->nh;
    float *g = zeros(R * c->HS);
    for (size_t r = 0; r < R; r++) memcpy(g + r * c->HS, t + head_off(c, r), (size_t)c->HS * sizeof(float));
    return g;
}

/* every value outside the heads equal in a and b */
static int others_same(const hn_case *c, const float *a, const float *b) {
    for (int n = 0; n < c->N; n++)
        for (int i = c->nh * c->HS; i < c->stride; i++)
            if (memcmp(a + (size_t)n * c->stride + i, b + (size_t)n * c->stride + i, sizeof(float))) return 0;
    return 1;
}

static void check_headnorm(int N, int nh, int HS, int extra) {
    hn_case c = {N, nh, HS, nh * HS + extra, 1e-6f, NULL, NULL, NULL};
    size_t R = (size_t)N * nh, nv = R * HS, total = (size_t)N * c.stride;
    float *x = randn(total, 41, 0.2f, 1.5f), *w = randn(HS, 42, 1.0f, 0.3f), *dyc = randn(nv, 43, 0.0f, 1.0f);
    c.R = dyc;
    float *heads = gather(&c, x);
    c.xi = to_double(heads, nv);
    c.xw = to_double(w, HS);

    /* forward */
    float *y = copy_of_f(x, total), *keep = zeros(nv), *rstd = zeros(R);
    nb_headnorm_forward(y, keep, rstd, w, N, nh, HS, c.stride, c.eps);
    CHECK(same_bits(keep, heads, nv), "headnorm: the kept input is not the heads' values");
    CHECK(others_same(&c, y, x), "headnorm forward wrote outside the heads");
    float *ref_y = zeros(nv), *ref_r = zeros(R), *got_y = gather(&c, y);
    nb_rmsnorm_forward(ref_y, ref_r, heads, w, (int)R, HS, c.eps);
    CHECK(same_bits(got_y, ref_y, nv) && same_bits(rstd, ref_r, R), "headnorm forward differs from rmsnorm's bits");
    double *want = nb_malloc(nv * sizeof(double), "reference");
    for (size_t r = 0; r < R; r++) {
        const double *xr = c.xi + r * HS;
        double ss = 0;
        for (int i = 0; i < HS; i++) ss += xr[i] * xr[i];
        double s = 1.0 / sqrt(ss / HS + c.eps);
        for (int i = 0; i < HS; i++) want[r * HS + i] = c.xw[i] * (xr[i] * s);
    }
    double fe = max_rel(got_y, want, nv);
    CHECK(fe < FWD_TOL, "headnorm forward error %.3g", fe);
    if (ot_eval()) ot_err(fe, FWD_TOL);

    /* backward: dy in the strided layout (the values outside the heads are left alone) */
    float *d = copy_of_f(x, total);
    for (size_t r = 0; r < R; r++) memcpy(d + head_off(&c, r), dyc + r * HS, (size_t)HS * sizeof(float));
    float *dw0 = randn(HS, 44, 0.0f, 1.0f), *dw = copy_of_f(dw0, HS);
    float *d1 = copy_of_f(d, total);
    nb_headnorm_backward(d1, dw, keep, w, rstd, N, nh, HS, c.stride);
    CHECK(others_same(&c, d1, x), "headnorm backward wrote outside the heads");
    float *ref_dx = zeros(nv), *ref_dw = copy_of_f(dw0, HS), *got_dx = gather(&c, d1);
    nb_rmsnorm_backward(ref_dx, ref_dw, dyc, heads, w, ref_r, (int)R, HS);
    CHECK(same_bits(got_dx, ref_dx, nv), "headnorm dx differs from rmsnorm's dinp bits (written, not added)");
    CHECK(same_bits(dw, ref_dw, HS), "headnorm dw differs from rmsnorm's bits (accumulated onto its start)");

    float *d2 = copy_of_f(d, total);
    nb_headnorm_backward(d2, NULL, keep, w, rstd, N, nh, HS, c.stride);
    CHECK(same_bits(d2, d1, total), "headnorm dx changes when dw is NULL");
    for (int t = 1; t <= 3; t += 2) {
        omp_set_num_threads(t);
        float *y3 = copy_of_f(x, total), *k3 = zeros(nv), *r3 = zeros(R), *d3 = copy_of_f(d, total);
        float *dw3 = copy_of_f(dw0, HS);
        nb_headnorm_forward(y3, k3, r3, w, N, nh, HS, c.stride, c.eps);
        nb_headnorm_backward(d3, dw3, k3, w, r3, N, nh, HS, c.stride);
        CHECK(same_bits(y3, y, total) && same_bits(r3, rstd, R) && same_bits(d3, d1, total) && same_bits(dw3, dw, HS),
              "headnorm changes with %d threads", t);
        free(y3), free(k3), free(r3), free(d3), free(dw3);
    }
    omp_set_num_threads(ot_threads);

    double ge[2] = {0, 0};
    if (ot_grad()) {
        float *gw = zeros(HS);
        for (int i = 0; i < HS; i++) gw[i] = dw[i] - dw0[i];
        ge[0] = fd_error_sampled(hn_loss, &c, c.xi, got_dx, nv, 400, 160, 45);
        ge[1] = fd_error_sampled(hn_loss, &c, c.xw, gw, HS, 400, 160, 46);
        for (int k = 0; k < 2; k++) {
            ot_err(ge[k], GRAD_TOL);
            CHECK(ge[k] < GRAD_TOL, "headnorm %s vs finite differences: error %.3g", k ? "dw" : "dx", ge[k]);
        }
        free(gw);
    }
    ot_log("  headnorm N %d heads %d HS %d stride %d  fwd %.1e  dx %.1e  dw %.1e\n", N, nh, HS, c.stride, fe, ge[0],
           ge[1]);

    free(x), free(w), free(dyc), free(heads), free(c.xi), free(c.xw), free(y), free(keep), free(rstd), free(ref_y);
    free(ref_r), free(got_y), free(want), free(d), free(dw0), free(dw), free(d1), free(ref_dx), free(ref_dw);
    free(got_dx), free(d2);
}

TEST_CASE(test_headnorm) {
    check_headnorm(7, 3, 10, 2 * 10 + 3); /* q of a GQA row: 3 heads, then k and v values */
    check_headnorm(5, 1, 2, 0);           /* one head of two values, nothing beside it */
    check_headnorm(9, 4, 70, 35);         /* HS across the 64-channel blocks of the dw reduction */
}

static const ot_row rows[] = {
    {"headnorm", "cpu", OT_F32, "7x3x10 s53, 5x1x2, 9x4x70 s315", FWD_TOL, OT_EVAL, test_headnorm, 0, 0},
    {"headnorm", "cpu", OT_F32, "7x3x10 s53, 5x1x2, 9x4x70 s315", GRAD_TOL, OT_GRAD, test_headnorm, 0, 0},
};
OT_TABLE(ot_headnorm, rows);
