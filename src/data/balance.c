/* FreeScale's plans, cost model and its fit (data/balance.h has FreeScale in one place). */
#include "data/balance.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"

static const char *HINT = "pass --balance none, fbs, vbs, vbs:ALPHA or vbs:ALPHA:C0 (ALPHA in 0.5..3, C0 >= 0)";

void nb_balance_parse(nb_balance *b, const char *spec) {
    *b = (nb_balance){NB_BALANCE_NONE, NB_BALANCE_ALPHA, NB_BALANCE_C0};
    if (!strcmp(spec, "none")) return;
    if (!strcmp(spec, "fbs")) {
        b->kind = NB_BALANCE_FBS;
        return;
    }
    NB_CHECK(!strncmp(spec, "vbs", 3) && (spec[3] == 0 || spec[3] == ':'), HINT, "unknown --balance '%s'", spec);
    b->kind = NB_BALANCE_VBS;
    if (!spec[3]) return;
    char *end;
    b->alpha = strtod(spec + 4, &end);
    NB_CHECK(end != spec + 4 && (*end == 0 || *end == ':') && b->alpha >= 0.5 && b->alpha <= 3, HINT,
             "--balance '%s': the exponent must be a number in 0.5..3", spec);
    if (*end == ':') {
        const char *p = end + 1;
        b->c0 = strtod(p, &end);
        NB_CHECK(end != p && *end == 0 && b->c0 >= 0 && b->c0 <= 1e12, HINT, "--balance '%s': C0 must be a number >= 0",
                 spec);
    }
}

void nb_balance_name(const nb_balance *b, char *buf, int cap) {
    if (b->kind == NB_BALANCE_VBS)
        snprintf(buf, (size_t)cap, "vbs:%g:%g", b->alpha, b->c0);
    else
        snprintf(buf, (size_t)cap, "%s", b->kind == NB_BALANCE_FBS ? "fbs" : "none");
}

int nb_balance_cap(const nb_balance *b, int Bg, int shares) {
    if (b->kind != NB_BALANCE_VBS) return Bg / shares;
    long cap = (2L * Bg + shares - 1) / shares;
    return (int)(cap < Bg ? cap : Bg);
}

double nb_balance_cost(const nb_balance *b, int32_t len) {
    return b->c0 + pow((double)(len > 0 ? len : 0), b->alpha);
}

typedef struct {
    double key;
    int i;
} keyed;

/* larger key first, then lower index */
static int cmp_keyed(const void *a, const void *b) {
    const keyed *x = a, *y = b;
    if (x->key != y->key) return x->key > y->key ? -1 : 1;
    return (x->i > y->i) - (x->i < y->i);
}

size_t nb_balance_scratch_bytes(int Bg, int shares) {
    size_t a = (size_t)Bg * sizeof(keyed), b = (size_t)shares * sizeof(double);
    return a + (b > (size_t)shares * sizeof(int) ? b : (size_t)shares * sizeof(int));
}

/* the samples sorted by key into v (the scratch's head) */
static keyed *sorted_by(const nb_balance *b, const int32_t *len, int Bg, keyed *v) {
    for (int i = 0; i < Bg; i++) v[i] = (keyed){b->kind == NB_BALANCE_VBS ? nb_balance_cost(b, len[i]) : (double)len[i], i};
    qsort(v, (size_t)Bg, sizeof *v, cmp_keyed);
    return v;
}

/* Longest-first: each sample to the least loaded share with room; once the samples left are just
 * enough to bring every share to min_count, only shares below it may take them. */
static void assign_vbs(const nb_balance *b, const keyed *v, int Bg, int shares, int min_count, int *share_of,
                       int *count, double *load) {
    int cap = nb_balance_cap(b, Bg, shares);
    for (int s = 0; s < shares; s++) load[s] = 0;
    long deficit = (long)shares * min_count;
    for (int p = 0; p < Bg; p++) {
        int only_short = Bg - p <= deficit, best = -1;
        for (int s = 0; s < shares; s++) {
            if (count[s] >= cap || (only_short && count[s] >= min_count)) continue;
            if (best < 0 || load[s] < load[best]) best = s;
        }
        NB_ASSERT(best >= 0);
        if (count[best] < min_count) deficit--;
        share_of[v[p].i] = best;
        count[best]++;
        load[best] += v[p].key;
    }
}

void nb_balance_assign(const nb_balance *b, const int32_t *len, int Bg, int shares, int min_count, int *share_of,
                       int *count, void *scratch) {
    NB_ASSERT(shares >= 1 && min_count >= 0 && (long)shares * min_count <= Bg);
    for (int s = 0; s < shares; s++) count[s] = 0;
    if (b->kind == NB_BALANCE_NONE) {
        NB_ASSERT(Bg % shares == 0);
        for (int i = 0; i < Bg; i++) share_of[i] = i / (Bg / shares), count[i / (Bg / shares)]++;
        return;
    }
    keyed *v = sorted_by(b, len, Bg, scratch);
    if (b->kind == NB_BALANCE_FBS) {
        NB_ASSERT(Bg % shares == 0);
        for (int p = 0; p < Bg; p++) {
            int round = p / shares, at = p % shares, s = round % 2 == 0 ? at : shares - 1 - at;
            share_of[v[p].i] = s;
            count[s]++;
        }
    } else {
        assign_vbs(b, v, Bg, shares, min_count, share_of, count, (double *)(v + Bg));
    }
}

void nb_balance_order(const int *share_of, int Bg, int shares, int *order, int *first, void *scratch) {
    for (int s = 0; s <= shares; s++) first[s] = 0;
    for (int i = 0; i < Bg; i++) first[share_of[i] + 1]++;
    for (int s = 0; s < shares; s++) first[s + 1] += first[s];
    int *at = (int *)((keyed *)scratch + Bg);
    memcpy(at, first, (size_t)shares * sizeof *at);
    for (int i = 0; i < Bg; i++) order[at[share_of[i]]++] = i;
}

/* ---- the cost model's fit from measured part times ---- */

#define FIT_REC (NB_BALANCE_FIT_NA + 2) /* a record: samples, time, sum of L^a per exponent */

double nb_balance_fit_alpha(int j) { return 1.0 + 0.1 * j; }

void nb_balance_fit_init(nb_balance_fit *f, int cap) {
    f->n = 0, f->cap = cap;
    f->rec = nb_malloc((size_t)(cap > 0 ? cap : 1) * FIT_REC * sizeof(double), "the cost fit");
}

void nb_balance_fit_free(nb_balance_fit *f) {
    free(f->rec);
    memset(f, 0, sizeof *f);
}

void nb_balance_fit_lengths(double sum_pow[NB_BALANCE_FIT_NA], const int32_t *len, int n) {
    for (int i = 0; i < n; i++)
        for (int j = 0; j < NB_BALANCE_FIT_NA; j++) sum_pow[j] += pow((double)len[i], nb_balance_fit_alpha(j));
}

void nb_balance_fit_add(nb_balance_fit *f, int samples, const double sum_pow[NB_BALANCE_FIT_NA]) {
    if (f->n == f->cap) return;
    double *r = f->rec + (size_t)f->n++ * FIT_REC;
    r[0] = samples, r[1] = -1; /* the time comes when the part has run */
    memcpy(r + 2, sum_pow, NB_BALANCE_FIT_NA * sizeof(double));
}

void nb_balance_fit_times(nb_balance_fit *f, const double *secs, int m) {
    if (f->n < m) return;
    for (int k = 0; k < m; k++) f->rec[(size_t)(f->n - m + k) * FIT_REC + 1] = secs[k];
}

/* Solves the 3 x 3 system a x = y (Cramer's rule); 0 when it is singular. */
static int solve3(const double a[3][3], const double y[3], double x[3]) {
    double det = a[0][0] * (a[1][1] * a[2][2] - a[1][2] * a[2][1]) - a[0][1] * (a[1][0] * a[2][2] - a[1][2] * a[2][0]) +
                 a[0][2] * (a[1][0] * a[2][1] - a[1][1] * a[2][0]);
    if (fabs(det) < 1e-300) return 0;
    for (int c = 0; c < 3; c++) {
        double m[3][3];
        memcpy(m, a, sizeof m);
        for (int r = 0; r < 3; r++) m[r][c] = y[r];
        x[c] = (m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1]) - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0]) +
                m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0])) / det;
    }
    return 1;
}

void nb_balance_fit_print(const nb_balance_fit *fit) {
    int best = -1, equal = 0;
    double best_sse = 0, bk = 0, bx = 0, by = 0, sst = 0, mean = 0, n = 0;
    for (int i = 0; i < fit->n; i++)
        if (fit->rec[(size_t)i * FIT_REC + 1] >= 0) mean += fit->rec[(size_t)i * FIT_REC + 1], n++;
    if (n < 6) return;
    mean /= n;
    for (int j = 0; j < NB_BALANCE_FIT_NA; j++) {
        double A[3][3] = {{0}}, Y[3] = {0}, X[3], sse = 0;
        for (int i = 0; i < fit->n; i++) {
            const double *f = fit->rec + (size_t)i * FIT_REC, v[3] = {1, f[0], f[2 + j]};
            if (f[1] < 0) continue;
            for (int r = 0; r < 3; r++) {
                Y[r] += v[r] * f[1];
                for (int c = 0; c < 3; c++) A[r][c] += v[r] * v[c];
            }
        }
        if (!solve3(A, Y, X)) { /* equal counts: the per-part and per-sample costs are one term, k' = k + x n */
            double det = A[0][0] * A[2][2] - A[0][2] * A[0][2];
            if (fabs(det) < 1e-300 || A[0][0] <= 0) continue;
            X[2] = (A[0][0] * Y[2] - A[0][2] * Y[0]) / det;
            X[1] = (Y[0] - X[2] * A[0][2]) / A[0][1]; /* k' spread over the samples: A[0][1] = sum of n */
            X[0] = 0;
            equal = 1;
        }
        if (X[2] <= 0) continue;
        for (int i = 0; i < fit->n; i++) {
            const double *f = fit->rec + (size_t)i * FIT_REC;
            double e = f[1] - X[0] - X[1] * f[0] - X[2] * f[2 + j];
            if (f[1] >= 0) sse += e * e;
        }
        if (best < 0 || sse < best_sse) best = j, best_sse = sse, bk = X[0], bx = X[1], by = X[2];
    }
    for (int i = 0; i < fit->n; i++) {
        const double *f = fit->rec + (size_t)i * FIT_REC;
        if (f[1] >= 0) sst += (f[1] - mean) * (f[1] - mean);
    }
    if (best < 0) {
        printf("cost fit: no fit of part time = k + x samples + y sum L^a (y > 0) over %.0f parts\n", n);
        return;
    }
    double a = nb_balance_fit_alpha(best);
    printf("cost fit: part time = %.4g ms + %.4g ms/sample + %.4g ms * sum L^%.1f over %.0f parts (R^2 %.3f): --balance "
           "vbs:%.1f:%.0f\n", 1e3 * bk, 1e3 * bx, 1e3 * by, a, n, sst > 0 ? 1 - best_sse / sst : 1.0, a,
           fmin(fmax(bx / by, 0), 1e12));
    if (equal) printf("cost fit: the parts had equal sample counts, so the fixed per-part cost is counted per sample (C0 is an upper bound)\n");
}
