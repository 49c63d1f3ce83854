/* Small helpers of the cpu rows written after the first gradient tests (attention.c, optim.c):
 * a splitmix64 generator restarted by every row (ur_reset), so a row draws the same numbers
 * whichever rows run before it, and double references. */
#ifndef NB_OT_UREF_H
#define NB_OT_UREF_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static inline void ur_reset(void) { rng_state = 0x9E3779B97F4A7C15ull; }
static inline double urand(void) { /* splitmix64 -> [0, 1) */
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}
static inline void fill(float *x, size_t n, float lo, float hi) {
    for (size_t i = 0; i < n; i++) x[i] = (float)(lo + (hi - lo) * urand());
}
static inline float *falloc(size_t n) { return calloc(n ? n : 1, sizeof(float)); }
static inline double *dalloc(size_t n) { return calloc(n ? n : 1, sizeof(double)); }

/* ||got - want|| / ||want|| with a double reference. */
static inline double rel_err_d(const float *got, const double *want, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(got[i])) return INFINITY;
        double d = (double)got[i] - want[i];
        num += d * d;
        den += want[i] * want[i];
    }
    return sqrt(num) / (den > 0 ? sqrt(den) : 1e-300);
}

/* Central differences of a scalar function f(x) over every element of x (double). */
typedef double (*scalar_fn)(const double *x, const void *ctx);
static inline void finite_diff(double *grad, double *x, size_t n, scalar_fn f, const void *ctx, double h) {
    for (size_t i = 0; i < n; i++) {
        double x0 = x[i];
        x[i] = x0 + h;
        double fp = f(x, ctx);
        x[i] = x0 - h;
        double fm = f(x, ctx);
        x[i] = x0;
        grad[i] = (fp - fm) / (2 * h);
    }
}

static inline void to_double(double *d, const float *f, size_t n) {
    for (size_t i = 0; i < n; i++) d[i] = f[i];
}

#endif
