/* Pooling of multi-valued categorical columns on the CPU (ops_ctr.h; CUDA twin: mvpool.cu).
 * A sample's values are gathered into rows of their own first; the pool writes the field's
 * slot from them in row order, so the result depends only on the values, not on threads. */
#include <string.h>

#include "ops/ops_ctr.h"

/* the bag's rows [*r0, *r1) and its gradient scale */
static float bag(const int32_t *off, int off_stride, int i, int mean, int32_t *r0, int32_t *r1) {
    *r0 = off[(size_t)i * off_stride];
    *r1 = off[(size_t)i * off_stride + 1];
    int n = *r1 > *r0 ? *r1 - *r0 : 0;
    return mean && n > 0 ? 1.0f / (float)n : 1.0f;
}

void nb_mvpool_forward(float *out, int ld_out, const float *vals, const int32_t *off, int off_stride, int B, int E,
                       int mean) {
#pragma omp parallel for schedule(static) if (B >= 256)
    for (int i = 0; i < B; i++) {
        int32_t r0, r1;
        float s = bag(off, off_stride, i, mean, &r0, &r1);
        float *o = out + (size_t)i * ld_out;
        if (r1 <= r0) {
            memset(o, 0, (size_t)E * sizeof(float));
            continue;
        }
        /* the first value is the start: one value pools to itself, bit for bit */
        memcpy(o, vals + (size_t)r0 * E, (size_t)E * sizeof(float));
        for (int32_t r = r0 + 1; r < r1; r++)
            for (int e = 0; e < E; e++) o[e] += vals[(size_t)r * E + e];
        if (s != 1.0f)
            for (int e = 0; e < E; e++) o[e] *= s;
    }
}

void nb_mvpool_backward(float *dvals, const float *dout, int ld_out, const int32_t *off, int off_stride, int B, int E,
                        int mean) {
#pragma omp parallel for schedule(static) if (B >= 256)
    for (int i = 0; i < B; i++) {
        int32_t r0, r1;
        float s = bag(off, off_stride, i, mean, &r0, &r1);
        const float *d = dout + (size_t)i * ld_out;
        for (int32_t r = r0; r < r1; r++)
            for (int e = 0; e < E; e++) dvals[(size_t)r * E + e] += s == 1.0f ? d[e] : d[e] * s;
    }
}
