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
