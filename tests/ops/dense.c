/* Dense CPU ops (matmul, layernorm, rmsnorm, gelu, swiglu, residual, embedding): forward and
 * backward against double-precision references written out here (the cpu rows of the dense
 * family; tests/ops/dense_cuda.c has the cuda rows).
 *
 * For each op, with the scalar loss L = sum(out * R) (R random, so dL/dout = R):
 * - the float forward matches a double reference of the same formula;
 * - every analytic gradient matches central differences of the double reference (all elements of
 *   small tensors, a fixed sample of large ones), relative to the gradient's scale;
 * - a NULL gradient pointer skips that gradient and leaves the others bit-identical;
 * - backward accumulates: called twice on a non-zero gradient it adds twice;
 * - two runs are bitwise equal, and so are runs with 1 and 3 OpenMP threads (the reductions own
 *   channel blocks; no partials summed in thread order).
 * Sizes are awkward on purpose (7, 13, 11) and a larger case crosses the 64-channel blocks.
 * eval mode: the forward, the saved statistics and the gradient semantics; grad mode: the
 * finite differences. */
#include <omp.h>
#include <stdint.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core.h"
#include "ops/ops.h"
#include "optest.h"
#include "rng.h"

#define SEED 20240607u
#define FWD_TOL 1e-5  /* float forward vs double reference, relative to the output's scale */
#define GRAD_TOL 1e-4 /* analytic float gradient vs double finite differences */
#define FD_ALL 400    /* tensors up to this size are checked element by element */
#define FD_SAMPLE 160 /* else this many fixed pseudo-random elements */

/* ---- helpers ---- */

#include "op_util.h"

static double fd_error(loss_fn f, const void *ctx, double *x, const float *g, size_t n, uint64_t stream) {
    return fd_error_sampled(f, ctx, x, g, n, FD_ALL, FD_SAMPLE, stream);
}

#include "grad_semantics.h"

/* ---- matmul ---- */

typedef struct {
    int N, C, OC;
    const float *inp, *w, *bias, *R;
    double *xi, *xw, *xb; /* double copies read by the reference (finite differences perturb them) */
} matmul_case;

static double matmul_ref(const matmul_case *m, int n, int o) {
    double acc = m->xb ? m->xb[o] : 0.0;
    for (int c = 0; c < m->C; c++) acc += m->xi[(size_t)n * m->C + c] * m->xw[(size_t)o * m->C + c];
    return acc;
}

static double matmul_loss(const void *p) {
    const matmul_case *m = p;
    double L = 0;
    for (int n = 0; n < m->N; n++)
        for (int o = 0; o < m->OC; o++) L += matmul_ref(m, n, o) * m->R[(size_t)n * m->OC + o];
    return L;
}

static void matmul_bwd(const void *p, float *const *g) {
    const matmul_case *m = p;
    nb_matmul_backward(g[0], g[1], g[2], m->R, m->inp, m->w, m->N, m->C, m->OC);
}

static void check_matmul(int N, int C, int OC, int with_bias) {
    size_t ni = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
    matmul_case m = {N, C, OC, randn(ni, 1, 0.0f, 1.0f), randn(nw, 2, 0.0f, 0.5f),
                     with_bias ? randn(OC, 3, 0.0f, 1.0f) : NULL, randn(no, 4, 0.0f, 1.0f), NULL, NULL, NULL};
    m.xi = to_double(m.inp, ni);
    m.xw = to_double(m.w, nw);
    m.xb = with_bias ? to_double(m.bias, OC) : NULL;

    float *out = zeros(no);
    double *want = nb_malloc(no * sizeof(double), "test tensor");
    nb_matmul_forward(out, m.inp, m.w, m.bias, N, C, OC);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) want[(size_t)n * OC + o] = matmul_ref(&m, n, o);
    double fe = max_rel(out, want, no);
    CHECK(fe < FWD_TOL, "matmul forward error %.3g", fe);

    grad_op op = {"matmul", with_bias ? 3 : 2, {ni, nw, OC}, {"dinp", "dw", "dbias"}, matmul_bwd, &m, 0, 3u};
    float *g[MAX_GRADS] = {0};
    check_grad_semantics(&op, g);
    double ge[MAX_GRADS] = {0};
    if (ot_grad()) {
        double fd[MAX_GRADS] = {fd_error(matmul_loss, &m, m.xi, g[0], ni, 11),
                            fd_error(matmul_loss, &m, m.xw, g[1], nw, 12),
                            with_bias ? fd_error(matmul_loss, &m, m.xb, g[2], OC, 13) : 0.0};
        memcpy(ge, fd, sizeof fd);
    }
    for (int k = 0; k < op.ngrads; k++)
        CHECK(ge[k] < GRAD_TOL, "matmul %s vs finite differences: error %.3g", op.gname[k], ge[k]);
    char name[64];
    snprintf(name, sizeof name, "matmul %dx%dx%d%s", N, C, OC, with_bias ? "+b" : "");
    report(name, fe, ge, &op);

    for (int k = 0; k < op.ngrads; k++) free(g[k]);
    free(out), free(want), free(m.xi), free(m.xw), free(m.xb);
    free((void *)m.inp), free((void *)m.w), free((void *)m.bias), free((void *)m.R);
}

TEST_CASE(test_matmul) {
    check_matmul(7, 13, 11, 1);
    check_matmul(7, 13, 11, 0);
    check_matmul(1, 1, 1, 1);
    check_matmul(33, 150, 130, 1);
}

/* ---- layernorm ---- */

typedef struct {
    int N, C;
    float eps;
    const float *inp, *w, *b, *R, *mean, *rstd;
    double *xi, *xw, *xb;
} ln_case;

/* torch.nn.LayerNorm: biased variance, eps inside the square root. */
static void ln_ref_row(const ln_case *l, int n, double *y, double *mean, double *rstd) {
    const double *x = l->xi + (size_t)n * l->C;
    double m = 0, v = 0;
    for (int i = 0; i < l->C; i++) m += x[i];
    m /= l->C;
    for (int i = 0; i < l->C; i++) v += (x[i] - m) * (x[i] - m);
    double s = 1.0 / sqrt(v / l->C + l->eps);
    for (int i = 0; i < l->C; i++) y[i] = (x[i] - m) * s * l->xw[i] + l->xb[i];
    if (mean) *mean = m;
    if (rstd) *rstd = s;
}

static double ln_loss(const void *p) {
    const ln_case *l = p;
    double *y = nb_malloc((size_t)l->C * sizeof(double), "row"), L = 0;
    for (int n = 0; n < l->N; n++) {
        ln_ref_row(l, n, y, NULL, NULL);
        for (int i = 0; i < l->C; i++) L += y[i] * l->R[(size_t)n * l->C + i];
    }
    free(y);
    return L;
}

static void ln_bwd(const void *p, float *const *g) {
    const ln_case *l = p;
    nb_layernorm_backward(g[0], g[1], g[2], l->R, l->inp, l->w, l->mean, l->rstd, l->N, l->C);
}

static void check_layernorm(int N, int C) {
    size_t n = (size_t)N * C;
    ln_case l = {N, C, 1e-5f, randn(n, 21, 0.3f, 2.0f), randn(C, 22, 1.0f, 0.5f), randn(C, 23, 0.0f, 0.5f),
                 randn(n, 24, 0.0f, 1.0f), NULL, NULL, NULL, NULL, NULL};
    l.xi = to_double(l.inp, n);
    l.xw = to_double(l.w, C);
    l.xb = to_double(l.b, C);
    float *out = zeros(n), *mean = zeros(N), *rstd = zeros(N);
    nb_layernorm_forward(out, mean, rstd, l.inp, l.w, l.b, N, C, l.eps);
    l.mean = mean, l.rstd = rstd;

    double *want = nb_malloc(n * sizeof(double), "test tensor");
    double *wmean = nb_malloc(N * sizeof(double), "m"), *wrstd = nb_malloc(N * sizeof(double), "r");
    for (int r = 0; r < N; r++) ln_ref_row(&l, r, want + (size_t)r * C, wmean + r, wrstd + r);
    double fe = max_rel(out, want, n);
    CHECK(fe < FWD_TOL, "layernorm forward error %.3g", fe);
    CHECK(max_rel(mean, wmean, N) < FWD_TOL, "layernorm saved mean error %.3g", max_rel(mean, wmean, N));
    CHECK(max_rel(rstd, wrstd, N) < FWD_TOL, "layernorm saved rstd error %.3g", max_rel(rstd, wrstd, N));

    float *out3 = zeros(n), *mean3 = zeros(N), *rstd3 = zeros(N);
    omp_set_num_threads(3);
    nb_layernorm_forward(out3, mean3, rstd3, l.inp, l.w, l.b, N, C, l.eps);
    omp_set_num_threads(ot_threads);
    CHECK(same_bits(out3, out, n) && same_bits(mean3, mean, N) && same_bits(rstd3, rstd, N),
          "layernorm forward changes with the thread count");

    grad_op op = {"layernorm", 3, {n, C, C}, {"dinp", "dw", "db"}, ln_bwd, &l, 0, 0};
    float *g[MAX_GRADS] = {0};
    check_grad_semantics(&op, g);
    double ge[MAX_GRADS] = {0};
    if (ot_grad()) {
        double fd[MAX_GRADS] = {fd_error(ln_loss, &l, l.xi, g[0], n, 25), fd_error(ln_loss, &l, l.xw, g[1], C, 26),
                            fd_error(ln_loss, &l, l.xb, g[2], C, 27)};
        memcpy(ge, fd, sizeof fd);
    }
    for (int k = 0; k < 3; k++)
        CHECK(ge[k] < GRAD_TOL, "layernorm %s vs finite differences: error %.3g", op.gname[k], ge[k]);
    char name[64];
    snprintf(name, sizeof name, "layernorm %dx%d", N, C);
    report(name, fe, ge, &op);

    for (int k = 0; k < 3; k++) free(g[k]);
    free(out), free(mean), free(rstd), free(out3), free(mean3), free(rstd3), free(want), free(wmean), free(wrstd);
    free(l.xi), free(l.xw), free(l.xb);
    free((void *)l.inp), free((void *)l.w), free((void *)l.b), free((void *)l.R);
}

TEST_CASE(test_layernorm) {
    check_layernorm(7, 13);
    check_layernorm(1, 1); /* one channel: out = b, and dinp is exactly zero */
    check_layernorm(33, 150);
}

/* ---- rmsnorm ---- */

typedef struct {
    int N, C;
    float eps;
    const float *inp, *w, *R, *rstd;
    double *xi, *xw;
} rms_case;

/* HF LlamaRMSNorm: w * (x * rsqrt(mean(x^2) + eps)). */
static void rms_ref_row(const rms_case *r, int n, double *y, double *rstd) {
    const double *x = r->xi + (size_t)n * r->C;
    double ss = 0;
    for (int i = 0; i < r->C; i++) ss += x[i] * x[i];
    double s = 1.0 / sqrt(ss / r->C + r->eps);
    for (int i = 0; i < r->C; i++) y[i] = r->xw[i] * (x[i] * s);
    if (rstd) *rstd = s;
}

static double rms_loss(const void *p) {
    const rms_case *r = p;
    double *y = nb_malloc((size_t)r->C * sizeof(double), "row"), L = 0;
    for (int n = 0; n < r->N; n++) {
        rms_ref_row(r, n, y, NULL);
        for (int i = 0; i < r->C; i++) L += y[i] * r->R[(size_t)n * r->C + i];
    }
    free(y);
    return L;
}

static void rms_bwd(const void *p, float *const *g) {
    const rms_case *r = p;
    nb_rmsnorm_backward(g[0], g[1], r->R, r->inp, r->w, r->rstd, r->N, r->C);
}

static void check_rmsnorm(int N, int C) {
    size_t n = (size_t)N * C;
    rms_case r = {N, C, 1e-6f, randn(n, 31, 0.3f, 2.0f), randn(C, 32, 1.0f, 0.5f), randn(n, 33, 0.0f, 1.0f),
                  NULL, NULL, NULL};
    r.xi = to_double(r.inp, n);
    r.xw = to_double(r.w, C);
    float *out = zeros(n), *rstd = zeros(N);
    nb_rmsnorm_forward(out, rstd, r.inp, r.w, N, C, r.eps);
    r.rstd = rstd;

    double *want = nb_malloc(n * sizeof(double), "test tensor"), *wrstd = nb_malloc(N * sizeof(double), "r");
    for (int i = 0; i < N; i++) rms_ref_row(&r, i, want + (size_t)i * C, wrstd + i);
    double fe = max_rel(out, want, n);
    CHECK(fe < FWD_TOL, "rmsnorm forward error %.3g", fe);
    CHECK(max_rel(rstd, wrstd, N) < FWD_TOL, "rmsnorm saved rstd error %.3g", max_rel(rstd, wrstd, N));

    float *out3 = zeros(n), *rstd3 = zeros(N);
    omp_set_num_threads(3);
    nb_rmsnorm_forward(out3, rstd3, r.inp, r.w, N, C, r.eps);
    omp_set_num_threads(ot_threads);
    CHECK(same_bits(out3, out, n) && same_bits(rstd3, rstd, N), "rmsnorm forward changes with the thread count");

    grad_op op = {"rmsnorm", 2, {n, C}, {"dinp", "dw"}, rms_bwd, &r, 0, 0};
    float *g[MAX_GRADS] = {0};
    check_grad_semantics(&op, g);
    double ge[MAX_GRADS] = {0};
    if (ot_grad()) {
        double fd[MAX_GRADS] = {fd_error(rms_loss, &r, r.xi, g[0], n, 35), fd_error(rms_loss, &r, r.xw, g[1], C, 36)};
        memcpy(ge, fd, sizeof fd);
    }
    for (int k = 0; k < 2; k++)
        CHECK(ge[k] < GRAD_TOL, "rmsnorm %s vs finite differences: error %.3g", op.gname[k], ge[k]);
    char name[64];
    snprintf(name, sizeof name, "rmsnorm %dx%d", N, C);
    report(name, fe, ge, &op);

    for (int k = 0; k < 2; k++) free(g[k]);
    free(out), free(rstd), free(out3), free(rstd3), free(want), free(wrstd), free(r.xi), free(r.xw);
    free((void *)r.inp), free((void *)r.w), free((void *)r.R);
}

TEST_CASE(test_rmsnorm) {
    check_rmsnorm(7, 13);
    /* Not C = 1: there dinp = w dout eps / (x^2 + eps)^1.5 is a cancellation of two O(1) terms
     * that no float rstd can resolve (the saved rstd alone is off by more than eps / x^2). */
    check_rmsnorm(1, 2);
    check_rmsnorm(33, 150);
}

/* ---- gelu ---- */

typedef struct {
    size_t n;
    const float *inp, *R;
    double *xi;
} gelu_case;

static double gelu_ref(double x) {
    return 0.5 * x * (1.0 + tanh(0.79788456080286535588 * (x + 0.044715 * x * x * x)));
}

static double gelu_loss(const void *p) {
    const gelu_case *c = p;
    double L = 0;
    for (size_t i = 0; i < c->n; i++) L += gelu_ref(c->xi[i]) * c->R[i];
    return L;
}

static void gelu_bwd(const void *p, float *const *g) {
    const gelu_case *c = p;
    nb_gelu_backward(g[0], c->inp, c->R, c->n);
}

static void check_gelu(size_t n) {
    float *inp = randn(n, 41, 0.0f, 2.0f);
    const float special[] = {0.0f, -0.0f, 1e-20f, -3.0f, 3.0f, -10.0f, 10.0f, -20.0f, 20.0f, -100.0f, 100.0f};
    for (size_t i = 0; i < sizeof special / sizeof *special && i < n; i++) inp[i] = special[i];
    gelu_case c = {n, inp, randn(n, 42, 0.0f, 1.0f), to_double(inp, n)};

    float *out = zeros(n), *out3 = zeros(n);
    double *want = nb_malloc(n * sizeof(double), "test tensor");
    nb_gelu_forward(out, inp, n);
    for (size_t i = 0; i < n; i++) want[i] = gelu_ref(c.xi[i]);
    double fe = max_rel(out, want, n);
    CHECK(fe < FWD_TOL, "gelu forward error %.3g", fe);
    /* Elementwise too: small outputs (x near -3) must not hide behind the large ones. */
    for (size_t i = 0; i < n; i++)
        CHECK(fabs(out[i] - want[i]) <= 1e-6 * (1.0 + fabs(c.xi[i])), "gelu(%g) = %.9g, want %.9g", c.xi[i],
              out[i], want[i]);
    omp_set_num_threads(3);
    nb_gelu_forward(out3, inp, n);
    omp_set_num_threads(ot_threads);
    CHECK(same_bits(out3, out, n), "gelu forward changes with the thread count");

    grad_op op = {"gelu", 1, {n}, {"dinp"}, gelu_bwd, &c, 0, 0};
    float *g[MAX_GRADS] = {0};
    check_grad_semantics(&op, g);
    double ge[MAX_GRADS] = {0};
    if (ot_grad()) {
        double fd[MAX_GRADS] = {fd_error(gelu_loss, &c, c.xi, g[0], n, 45)};
        memcpy(ge, fd, sizeof fd);
    }
    CHECK(ge[0] < GRAD_TOL, "gelu dinp vs finite differences: error %.3g", ge[0]);
    char name[64];
    snprintf(name, sizeof name, "gelu %zu", n);
    report(name, fe, ge, &op);

    free(g[0]), free(out), free(out3), free(want), free(c.xi), free(inp), free((void *)c.R);
}

TEST_CASE(test_gelu) {
    check_gelu(7 * 13);
    check_gelu(5003);
}

/* ---- swiglu ---- */

typedef struct {
    int N, F;
    const float *gu, *R;
    double *xgu;
} swiglu_case;

static double swiglu_ref(const swiglu_case *s, int n, int i) {
    double g = s->xgu[(size_t)n * 2 * s->F + i], u = s->xgu[(size_t)n * 2 * s->F + s->F + i];
    return g / (1.0 + exp(-g)) * u;
}

static double swiglu_loss(const void *p) {
    const swiglu_case *s = p;
    double L = 0;
    for (int n = 0; n < s->N; n++)
        for (int i = 0; i < s->F; i++) L += swiglu_ref(s, n, i) * s->R[(size_t)n * s->F + i];
    return L;
}

static void swiglu_bwd(const void *p, float *const *g) {
    const swiglu_case *s = p;
    nb_swiglu_backward(g[0], s->R, s->gu, s->N, s->F);
}

static void check_swiglu(int N, int F) {
    size_t ngu = (size_t)N * 2 * F, no = (size_t)N * F;
    float *gu = randn(ngu, 51, 0.0f, 2.0f);
    /* Saturated gates: exp(-g) overflows float for g < -88; the result must stay finite. */
    const float special[] = {-30.0f, 30.0f, -100.0f, 100.0f, 0.0f};
    for (size_t i = 0; i < sizeof special / sizeof *special && i < (size_t)F; i++) gu[i] = special[i];
    swiglu_case s = {N, F, gu, randn(no, 52, 0.0f, 1.0f), to_double(gu, ngu)};

    float *out = zeros(no), *out3 = zeros(no);
    double *want = nb_malloc(no * sizeof(double), "test tensor");
    nb_swiglu_forward(out, gu, N, F);
    for (int n = 0; n < N; n++)
        for (int i = 0; i < F; i++) want[(size_t)n * F + i] = swiglu_ref(&s, n, i);
    double fe = max_rel(out, want, no);
    CHECK(fe < FWD_TOL, "swiglu forward error %.3g", fe);
    omp_set_num_threads(3);
    nb_swiglu_forward(out3, gu, N, F);
    omp_set_num_threads(ot_threads);
    CHECK(same_bits(out3, out, no), "swiglu forward changes with the thread count");

    grad_op op = {"swiglu", 1, {ngu}, {"dgu"}, swiglu_bwd, &s, 0, 0};
    float *g[MAX_GRADS] = {0};
    check_grad_semantics(&op, g);
    int finite = 1;
    for (size_t i = 0; i < ngu; i++) finite &= isfinite(g[0][i]);
    CHECK(finite, "swiglu gradient is not finite for saturated gates");
    double ge[MAX_GRADS] = {0};
    if (ot_grad()) {
        double fd[MAX_GRADS] = {fd_error(swiglu_loss, &s, s.xgu, g[0], ngu, 55)};
        memcpy(ge, fd, sizeof fd);
    }
    CHECK(ge[0] < GRAD_TOL, "swiglu dgu vs finite differences: error %.3g", ge[0]);
    char name[64];
    snprintf(name, sizeof name, "swiglu %dx%d", N, F);
    report(name, fe, ge, &op);

    free(g[0]), free(out), free(out3), free(want), free(s.xgu), free(gu), free((void *)s.R);
}

TEST_CASE(test_swiglu) {
    check_swiglu(7, 13);
    check_swiglu(33, 150);
}

/* ---- residual ---- */

TEST_CASE(test_residual) {
    size_t n = 1001;
    float *a = randn(n, 61, 0.0f, 1.0f), *b = randn(n, 62, 0.0f, 1.0f), *out = zeros(n);
    float *want = zeros(n), *x = zeros(n);
    for (size_t i = 0; i < n; i++) want[i] = a[i] + b[i];
    nb_residual_forward(out, a, b, n);
    CHECK(same_bits(out, want, n), "residual forward is not a + b");
    memcpy(x, a, n * sizeof(float));
    nb_residual_forward(x, x, b, n); /* out aliases a */
    CHECK(same_bits(x, want, n), "residual forward with out == a");
    memcpy(x, b, n * sizeof(float));
    nb_residual_forward(x, a, x, n); /* out aliases b */
    CHECK(same_bits(x, want, n), "residual forward with out == b");

    memcpy(x, a, n * sizeof(float));
    nb_add_inplace(x, b, n);
    CHECK(same_bits(x, want, n), "add_inplace is not dst + src");
    nb_add_inplace(x, b, n);
    int ok = 1;
    for (size_t i = 0; i < n; i++) ok &= x[i] == want[i] + b[i];
    CHECK(ok, "add_inplace does not accumulate");
    free(a), free(b), free(out), free(want), free(x);
}

/* ---- scaled column slices (LoRA's branch into a slice of a fused projection) ---- */

TEST_CASE(test_scale_cols) {
    int rows = 37, ld_dst = 29, ld_src = 17, cols = 13, off = 9;
    float alpha = 0.5f; /* a power of two: alpha * x is exact, so each sum is one rounding */
    float *dst = randn((size_t)rows * ld_dst, 71, 0.0f, 1.0f), *src = randn((size_t)rows * ld_src, 72, 0.0f, 1.0f);
    float *acc = zeros((size_t)rows * ld_dst), *set = zeros((size_t)rows * ld_dst);
    memcpy(acc, dst, (size_t)rows * ld_dst * sizeof(float));
    memcpy(set, dst, (size_t)rows * ld_dst * sizeof(float));
    nb_scale_cols(acc + off, ld_dst, src, ld_src, rows, cols, alpha, 1);
    nb_scale_cols(set + off, ld_dst, src, ld_src, rows, cols, alpha, 0);
    int ok_acc = 1, ok_set = 1, untouched = 1;
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < ld_dst; j++) {
            size_t e = (size_t)i * ld_dst + j;
            if (j < off || j >= off + cols) {
                untouched &= acc[e] == dst[e] && set[e] == dst[e];
                continue;
            }
            float x = src[(size_t)i * ld_src + (j - off)];
            ok_acc &= acc[e] == (float)((double)dst[e] + (double)alpha * x);
            ok_set &= set[e] == alpha * x;
        }
    CHECK(ok_acc, "scale_cols (acc) is not dst + alpha * src on the slice");
    CHECK(ok_set, "scale_cols (set) is not alpha * src on the slice");
    CHECK(untouched, "scale_cols wrote outside its column slice");
    free(dst), free(src), free(acc), free(set);
}

/* ---- embedding ---- */

typedef struct {
    int B, T, C, V;
    const int32_t *tokens;
    const float *wte, *wpe, *R;
    double *xwte, *xwpe;
} embed_case;

static double embed_loss(const void *p) {
    const embed_case *e = p;
    double L = 0;
    for (int n = 0; n < e->B * e->T; n++)
        for (int i = 0; i < e->C; i++) {
            double y = e->xwte[(size_t)e->tokens[n] * e->C + i] + e->xwpe[(size_t)(n % e->T) * e->C + i];
            L += y * e->R[(size_t)n * e->C + i];
        }
    return L;
}

static void embed_bwd(const void *p, float *const *g) {
    const embed_case *e = p;
    nb_embed_backward(g[0], g[1], e->R, e->tokens, e->B, e->T, e->C);
}

static void check_embed(int B, int T, int C, int V) {
    int N = B * T;
    size_t nte = (size_t)V * C, npe = (size_t)T * C, no = (size_t)N * C;
    int32_t *tokens = nb_malloc(N * sizeof(int32_t), "tokens");
    /* Token 0 on every third row (many repeats, as a padding or newline token), the rest random,
     * and the last vocabulary row used at least once. */
    for (int n = 0; n < N; n++) tokens[n] = n % 3 == 0 ? 0 : (int32_t)(nb_philox(SEED, 71, n).v[0] % V);
    tokens[N - 1] = V - 1;
    embed_case e = {B, T, C, V, tokens, randn(nte, 72, 0.0f, 1.0f), randn(npe, 73, 0.0f, 1.0f),
                    randn(no, 74, 0.0f, 1.0f), NULL, NULL};
    e.xwte = to_double(e.wte, nte);
    e.xwpe = to_double(e.wpe, npe);

    float *out = zeros(no), *out3 = zeros(no);
    nb_embed_forward(out, tokens, e.wte, e.wpe, B, T, C);
    int exact = 1;
    for (int n = 0; n < N; n++)
        for (int i = 0; i < C; i++)
            exact &= out[(size_t)n * C + i] == e.wte[(size_t)tokens[n] * C + i] + e.wpe[(size_t)(n % T) * C + i];
    CHECK(exact, "embed forward is not wte[token] + wpe[t]");
    omp_set_num_threads(3);
    nb_embed_forward(out3, tokens, e.wte, e.wpe, B, T, C);
    omp_set_num_threads(ot_threads);
    CHECK(same_bits(out3, out, no), "embed forward changes with the thread count");
    nb_embed_forward(out, tokens, e.wte, NULL, B, T, C);
    exact = 1;
    for (int n = 0; n < N; n++) exact &= same_bits(out + (size_t)n * C, e.wte + (size_t)tokens[n] * C, C);
    CHECK(exact, "embed forward without wpe is not wte[token]");

    grad_op op = {"embed", 2, {nte, npe}, {"dwte", "dwpe"}, embed_bwd, &e, 0, 0};
    float *g[MAX_GRADS] = {0};
    check_grad_semantics(&op, g);
    double ge[MAX_GRADS] = {0};
    if (ot_grad()) {
        double fd[MAX_GRADS] = {fd_error(embed_loss, &e, e.xwte, g[0], nte, 75),
                            fd_error(embed_loss, &e, e.xwpe, g[1], npe, 76)};
        memcpy(ge, fd, sizeof fd);
    }
    for (int k = 0; k < 2; k++)
        CHECK(ge[k] < GRAD_TOL, "embed %s vs finite differences: error %.3g", op.gname[k], ge[k]);
    char name[64];
    snprintf(name, sizeof name, "embed %dx%dx%d V%d", B, T, C, V);
    report(name, 0.0, ge, &op);

    for (int k = 0; k < 2; k++) free(g[k]);
    free(out), free(out3), free(e.xwte), free(e.xwpe), free(tokens);
    free((void *)e.wte), free((void *)e.wpe), free((void *)e.R);
}

TEST_CASE(test_embed) {
    check_embed(3, 7, 13, 5);
    check_embed(4, 9, 150, 17);
}

/* A negative token id (corrupt data) ends the program with nb_fail's exit status 1, not a wild
 * read. Run in a child process so that the exit can be observed. */
TEST_CASE(test_embed_rejects_negative_token) {
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0, "fork failed");
    if (pid == 0) {
        if (!freopen("/dev/null", "w", stderr)) _exit(3);
        int32_t tokens[4] = {0, 1, -5, 2};
        float wte[2 * 3] = {0}, out[4 * 3];
        nb_embed_forward(out, tokens, wte, NULL, 2, 2, 3);
        _exit(0);
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid, "waitpid failed");
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 1, "negative token: want exit 1, got status %d", status);
}

#define DENSE(op, shape, fn, flags)                                                                \
    {op, "cpu", OT_F32, shape, FWD_TOL, OT_EVAL, fn, 0, flags}, {op, "cpu", OT_F32, shape, GRAD_TOL, OT_GRAD, fn, 0, flags}
static const ot_row rows[] = {
    DENSE("matmul", "7x13x11 +-bias, 1x1x1, 33x150x130", test_matmul, 0),
    DENSE("layernorm", "7x13, 1x1, 33x150", test_layernorm, 0),
    DENSE("rmsnorm", "7x13, 1x2, 33x150", test_rmsnorm, 0),
    DENSE("gelu", "91, 5003", test_gelu, 0),
    DENSE("swiglu", "7x13, 33x150", test_swiglu, 0),
    {"residual", "cpu", OT_F32, "1001 (aliased)", 0, OT_EVAL, test_residual, 0, 0},
    {"scale_cols", "cpu", OT_F32, "37x13 of ld 29 from ld 17, acc and set", 0, OT_EVAL, test_scale_cols, 0, 0},
    DENSE("embed", "3x7x13 V5, 4x9x150 V17", test_embed, 0),
    {"embed_bad_token", "cpu", OT_NONE, "token -5", 0, OT_EVAL, test_embed_rejects_negative_token, 0, OT_FORK},
};
OT_TABLE(ot_dense, rows);
