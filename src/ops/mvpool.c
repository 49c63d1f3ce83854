/* Pooling of multi-valued categorical columns on the CPU (ops_ctr.h; CUDA twin: mvpool.cu).
 * A sample's first value is gathered into the field's slot itself (as a single-valued column's
 * id is); the pool adds the others' table rows to the slot in value order, read where they are
 * (no gathered copy of them), so the result depends only on the values, not on threads, and a
 * one-value field is exactly a single-valued column. */
#include <string.h>

#include "ops/ops_ctr.h"

/* the bag's rows [*r0, *r1) (row r0 is the slot's own value) and its scale */
static float bag(const int32_t *off, int off_stride, int i, int mean, int32_t *r0, int32_t *r1) {
    *r0 = off[(size_t)i * off_stride];
    *r1 = off[(size_t)i * off_stride + 1];
    int n = *r1 > *r0 ? *r1 - *r0 : 0;
    return mean && n > 0 ? 1.0f / (float)n : 1.0f;
}

void nb_mvpool_forward(float *out, int ld_out, const float *table, const int64_t *rows, const int32_t *before,
                       const int32_t *off, int off_stride, int B, int E, int mean) {
#pragma omp parallel for schedule(static) if (B >= 256)
    for (int i = 0; i < B; i++) {
        int32_t r0, r1;
        float s = bag(off, off_stride, i, mean, &r0, &r1);
        float *o = out + (size_t)i * ld_out;
        if (r1 <= r0) {
            memset(o, 0, (size_t)E * sizeof(float));
            continue;
        }
        const int64_t *vrow = rows + (r0 - before[(size_t)i * off_stride]); /* value r0 + 1's lookup */
        for (int32_t r = r0 + 1; r < r1; r++) {
            const float *v = table + (size_t)vrow[r - r0 - 1] * E;
            for (int e = 0; e < E; e++) o[e] += v[e];
        }
        if (s != 1.0f)
            for (int e = 0; e < E; e++) o[e] *= s;
    }
}

void nb_mvpool_backward(float *dvals, float *dout, int ld_out, const int32_t *off, int off_stride, int B, int E,
                        int mean) {
#pragma omp parallel for schedule(static) if (B >= 256)
    for (int i = 0; i < B; i++) {
        int32_t r0, r1;
        float s = bag(off, off_stride, i, mean, &r0, &r1);
        float *d = dout + (size_t)i * ld_out;
        for (int32_t r = r0 + 1; r < r1 && dvals; r++)
            for (int e = 0; e < E; e++) dvals[(size_t)r * E + e] += s == 1.0f ? d[e] : d[e] * s;
        if (s != 1.0f) /* the slot's gradient becomes its first value's */
            for (int e = 0; e < E; e++) d[e] *= s;
    }
}
