/* The tests' distance between a result and its reference (check.h's tests and test_ops's rows). */
#ifndef NB_TEST_REL_ERR_H
#define NB_TEST_REL_ERR_H

#include <math.h>
#include <stddef.h>

/* Relative error ||a - b|| / max(||b||, tiny) over n elements; infinite where either holds a NaN. */
static inline double rel_err(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * (double)b[i];
        if (isnan(a[i]) || isnan(b[i])) return INFINITY;
    }
    return sqrt(num) / (sqrt(den) > 1e-30 ? sqrt(den) : 1e-30);
}

#endif
