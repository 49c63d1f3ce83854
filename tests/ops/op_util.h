/* Helpers shared by the op tests (dense.c, ctr.c). Define SEED before
 * including: every random tensor is a Philox draw keyed by (SEED, stream). */
#ifndef NB_OP_TEST_UTIL_H
#define NB_OP_TEST_UTIL_H

#include <math.h>
#include <string.h>

#include "core.h"
#include "rng.h"

static float *randn(size_t n, uint64_t stream, float mean, float std) {
    float *p = nb_malloc((n ? n : 1) * sizeof(float), "test tensor");
    nb_rng_fill_normal(p, n, SEED, stream, mean, std);
    return p;
}

static float *zeros(size_t n) { return nb_calloc(n ? n : 1, sizeof(float), "test tensor"); }

static double *to_double(const float *x, size_t n) {
    double *d = nb_malloc((n ? n : 1) * sizeof(double), "test tensor");
    for (size_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}

static int same_bits(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof(float)) == 0; }

/* max |a - ref| / max |ref|: the error relative to the tensor's scale. */
static double max_rel(const float *a, const double *ref, size_t n) {
    double diff = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i])) return INFINITY;
        diff = fmax(diff, fabs(a[i] - ref[i]));
        scale = fmax(scale, fabs(ref[i]));
    }
    return diff / fmax(scale, 1e-30);
}

typedef double (*loss_fn)(const void *ctx);

/* Central differences of the double-precision loss f with respect to x[0..n) against the
 * analytic gradient g: max |fd - g| / max |fd|. Tensors of up to max_all elements are checked
 * element by element, larger ones at nsample fixed pseudo-random elements (Philox stream). */
static double fd_error_sampled(loss_fn f, const void *ctx, double *x, const float *g, size_t n, size_t max_all,
                               size_t nsample, uint64_t stream) {
    size_t nchk = n <= max_all ? n : nsample;
    double diff = 0, scale = 0;
    for (size_t k = 0; k < nchk; k++) {
        size_t i = n <= max_all ? k : nb_philox(SEED, stream, k).v[0] % n;
        double x0 = x[i], h = 1e-5 * fmax(1.0, fabs(x0));
        double xp = x0 + h, xm = x0 - h;
        x[i] = xp;
        double lp = f(ctx);
        x[i] = xm;
        double lm = f(ctx);
        x[i] = x0;
        double fd = (lp - lm) / (xp - xm);
        if (isnan(g[i])) return INFINITY;
        diff = fmax(diff, fabs(fd - g[i]));
        scale = fmax(scale, fabs(fd));
    }
    return diff / fmax(scale, 1e-30);
}

#endif
