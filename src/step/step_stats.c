/* Step-time statistics (see step_stats.h). */
#include "step/step_stats.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int nb_step_warmup(int steps) { return steps >= 20 ? 10 : steps / 2; }

nb_step_times nb_step_times_of(const double *times, int steps) {
    nb_step_times r = {nb_step_warmup(steps), 0, 0, 0};
    r.n = steps - r.warmup;
    if (r.n < 1) {
        r.n = 0;
        return r;
    }
    double *t = nb_malloc((size_t)r.n * sizeof(double), "step times");
    memcpy(t, times + r.warmup, (size_t)r.n * sizeof(double));
    qsort(t, (size_t)r.n, sizeof(double), cmp_double);
    r.p90 = t[(int)ceil(0.9 * r.n) - 1];
    r.median = t[r.n / 2];
    free(t);
    return r;
}
