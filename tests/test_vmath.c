/* nb_expf (core/vmath.h): accuracy against the double exp, its edges, and the same bits whether a
 * loop of it runs as SIMD code (the widest clone this CPU has) or one element at a time. */
#include <float.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "vmath.h"

/* |got - exact| in units of the float spacing at the exact value */
static double ulp_err(float got, double exact) {
    float e = (float)exact;
    double ulp = (double)nextafterf(e, INFINITY) - (double)e;
    return fabs((double)got - exact) / ulp;
}

/* floats in order <-> int64: -0 and +0 next to each other, negatives below */
static int64_t float_order(float f) {
    int32_t i;
    memcpy(&i, &f, sizeof i);
    return i < 0 ? -(int64_t)(i & 0x7fffffff) - 1 : i;
}
static float float_at(int64_t k) {
    int32_t i = k < 0 ? (int32_t)((-(k + 1)) | (int64_t)0x80000000) : (int32_t)k;
    float f;
    memcpy(&f, &i, sizeof f);
    return f;
}

/* Every 61st float of the normal range (about 37 million), and the edges. */
TEST_CASE(test_expf_accuracy) {
    double worst = 0;
    float at = 0;
    long n = 0;
    for (int64_t k = float_order(NB_EXPF_LO); k <= float_order(NB_EXPF_HI); k += 61, n++) {
        float x = float_at(k);
        double u = ulp_err(nb_expf(x), exp((double)x));
        if (u > worst) worst = u, at = x;
    }
    printf("    %ld values, worst %.3f ulp at %.9g\n", n, worst, (double)at);
    CHECK(worst <= 1.0, "nb_expf is %.3f ulp off at %.9g", worst, (double)at);
    CHECK(nb_expf(0.0f) == 1.0f && nb_expf(-0.0f) == 1.0f, "exp(0) = %g", (double)nb_expf(0.0f));
    CHECK(nb_expf(-88.0f) == 0.0f && nb_expf(-1e30f) == 0.0f && nb_expf(-INFINITY) == 0.0f, "below the normals: 0");
    CHECK(isinf(nb_expf(89.0f)) && isinf(nb_expf(INFINITY)), "above ln(FLT_MAX): inf");
    CHECK(isnan(nb_expf(NAN)), "NaN in, NaN out");
    float top = nb_expf(88.7f); /* n = 128: the last binade before overflow */
    CHECK(isfinite(top) && ulp_err(top, exp((double)88.7f)) <= 1.0, "exp(88.7) = %g", (double)top);
}

NB_SIMD_CLONES
static void exp_simd(float *y, const float *x, int n) {
    for (int i = 0; i < n; i++) y[i] = nb_expf(x[i]);
}

__attribute__((optimize("no-tree-vectorize"))) static void exp_scalar(float *y, const float *x, int n) {
    for (int i = 0; i < n; i++) {
        volatile float v = x[i]; /* one element at a time, whatever the optimizer would like */
        y[i] = nb_expf(v);
    }
}

TEST_CASE(test_expf_same_bits_any_width) {
    enum { N = 1 << 16 };
    float *x = malloc(N * sizeof *x), *a = malloc(N * sizeof *a), *b = malloc(N * sizeof *b);
    CHECK(x && a && b, "out of memory");
    unsigned s = 12345;
    for (int i = 0; i < N; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = ((float)(s >> 8) / 16777216.0f) * 200.0f - 100.0f; /* spans both cut-offs */
    }
    x[0] = NAN, x[1] = INFINITY, x[2] = -INFINITY, x[3] = 88.7f;
    exp_simd(a, x, N);
    exp_scalar(b, x, N);
    CHECK(memcmp(a, b, N * sizeof *a) == 0, "the SIMD loop and the scalar loop differ");
    free(x), free(a), free(b);
}

int main(void) {
    RUN(test_expf_accuracy);
    RUN(test_expf_same_bits_any_width);
    TEST_EXIT();
}
