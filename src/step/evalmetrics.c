/* NE and AUC (see evalmetrics.h). */
#include "step/evalmetrics.h"

#include <math.h>
#include <stdlib.h>

#include "core.h"

typedef struct {
    float s;
    long i;
} scored;

static int cmp_scored(const void *a, const void *b) {
    const scored *x = a, *y = b;
    if (x->s != y->s) return x->s < y->s ? -1 : 1;
    return (x->i > y->i) - (x->i < y->i);
}

double nb_auc(const float *score, const float *label, long n) {
    scored *v = nb_malloc((size_t)(n ? n : 1) * sizeof *v, "AUC ranks");
    for (long i = 0; i < n; i++) v[i] = (scored){score[i], i};
    qsort(v, (size_t)n, sizeof *v, cmp_scored);
    double pos = 0, rank_sum = 0;
    for (long i = 0; i < n;) {
        long j = i;
        while (j < n && v[j].s == v[i].s) j++;
        double avg = 0.5 * (double)(i + 1 + j); /* ranks i+1 .. j */
        for (long k = i; k < j; k++)
            if (label[v[k].i] > 0.5f) pos++, rank_sum += avg;
        i = j;
    }
    free(v);
    double neg = (double)n - pos;
    if (pos == 0 || neg == 0) return NAN;
    return (rank_sum - pos * (pos + 1) / 2) / (pos * neg);
}

double nb_ne(double mean_bce, double p) {
    if (p <= 0 || p >= 1) return NAN;
    return mean_bce / -(p * log(p) + (1 - p) * log1p(-p));
}

static double bce_prob(double p, float y) {
    p = fmin(fmax(p, 1e-7), 1 - 1e-7);
    return y > 0.5f ? -log(p) : -log1p(-p);
}

nb_eval nb_eval_binary(const float *score, const float *label, long n, int logits) {
    nb_eval e = {.done = 1, .n = n};
    double bce = 0, pos = 0;
    for (long i = 0; i < n; i++) {
        double z = score[i];
        bce += logits ? fmax(z, 0) - z * label[i] + log1p(exp(-fabs(z))) : bce_prob(z, label[i]);
        pos += label[i];
    }
    e.loss = bce / (double)n;
    e.base_rate = pos / (double)n;
    e.ne = nb_ne(e.loss, e.base_rate);
    e.auc = nb_auc(score, label, n);
    return e;
}
