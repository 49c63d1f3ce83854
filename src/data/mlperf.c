/* MLPerf DLRM-DCNv2's multi-hot day files (see mlperf.h). */
#include "data/mlperf.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core.h"

#define MP_HINT "pass the directory of the reference's day_N_dense.npy, day_N_labels.npy and day_N_sparse_multi_hot.npz"

static void day_path(char *buf, size_t cap, const char *dir, int d, const char *what) {
    snprintf(buf, cap, "%s/day_%d_%s", dir, d, what);
}

static int day_exists(const char *dir, int d) {
    char p[4200];
    day_path(p, sizeof p, dir, d, "dense.npy");
    return access(p, R_OK) == 0;
}

/* Day d's three files, checked against each other (and against the days before: hot). */
static void open_day(nb_mlperf_set *s, nb_mlperf_day *y, const char *dir, int d) {
    char p[4200], what[4300];
    day_path(p, sizeof p, dir, d, "dense.npy");
    nb_npy_map(&y->dense, p);
    nb_npy_parse(&y->dense, 0, y->dense.size, p, &y->d);
    NB_CHECK(!strcmp(y->d.descr, "<f4") && y->d.ndim == 2 && y->d.shape[1] == NB_MLPERF_NDENSE, MP_HINT,
             "%s: dtype %s shape [%lld, %lld]; the dense features are float32 [rows, 13]", p, y->d.descr,
             (long long)y->d.shape[0], (long long)y->d.shape[1]);
    int64_t rows = y->d.shape[0];
    day_path(p, sizeof p, dir, d, "labels.npy");
    nb_npy_map(&y->labels, p);
    nb_npy_parse(&y->labels, 0, y->labels.size, p, &y->l);
    NB_CHECK((!strcmp(y->l.descr, "<i4") || !strcmp(y->l.descr, "<f4")) && y->l.shape[1] == 1 && y->l.shape[0] == rows, MP_HINT,
             "%s: dtype %s shape [%lld, %lld]; the labels are int32 or float32 [%lld, 1], as the dense file's rows", p,
             y->l.descr, (long long)y->l.shape[0], (long long)y->l.shape[1], (long long)rows);
    day_path(p, sizeof p, dir, d, "sparse_multi_hot.npz");
    nb_npy_map(&y->sparse, p);
    for (int f = 0; f < NB_MLPERF_NCAT; f++) {
        char member[16];
        size_t at, len;
        snprintf(member, sizeof member, "%d.npy", f);
        NB_CHECK(nb_npz_member(&y->sparse, member, &at, &len), MP_HINT, "%s: no member %s (features 0.npy .. 25.npy)", p, member);
        snprintf(what, sizeof what, "%s member %s", p, member);
        nb_npy_parse(&y->sparse, at, len, what, &y->s[f]);
        int64_t k = y->s[f].shape[1];
        NB_CHECK(!strcmp(y->s[f].descr, "<i4") && y->s[f].ndim == 2 && y->s[f].shape[0] == rows && k >= 1 && k <= 256, MP_HINT,
                 "%s: dtype %s shape [%lld, %lld]; want int32 [%lld, k] with k in 1..256", what, y->s[f].descr,
                 (long long)y->s[f].shape[0], (long long)k, (long long)rows);
        NB_CHECK(!s->hot[f] || s->hot[f] == k, MP_HINT, "%s: %lld ids per sample; the earlier days have %d", what, (long long)k,
                 s->hot[f]);
        s->hot[f] = (int)k;
    }
}

void nb_mlperf_open(nb_mlperf_set *s, const char *dir, int held_out) {
    memset(s, 0, sizeof *s);
    NB_CHECK(day_exists(dir, held_out ? NB_MLPERF_TRAIN_DAYS : 0), MP_HINT, "%s: no day_%d_dense.npy (%s)", dir,
             held_out ? NB_MLPERF_TRAIN_DAYS : 0, held_out ? "the held-out day, the reference's validation day" : "the first training day");
    if (held_out) {
        open_day(s, &s->day[0], dir, NB_MLPERF_TRAIN_DAYS);
        s->day[0].rows = (s->day[0].d.shape[0] + 1) / 2; /* the reference's "val" half */
        s->ndays = 1;
    } else {
        while (s->ndays < NB_MLPERF_TRAIN_DAYS && day_exists(dir, s->ndays)) {
            nb_mlperf_day *y = &s->day[s->ndays];
            open_day(s, y, dir, s->ndays);
            y->rows = y->d.shape[0];
            s->ndays++;
        }
    }
    for (int d = 0; d < s->ndays; d++) s->start[d + 1] = s->start[d] + s->day[d].rows;
    NB_CHECK(s->start[s->ndays] > 0, MP_HINT, "%s: the %s days hold no samples", dir, held_out ? "held-out" : "training");
    for (int f = 0; f < NB_MLPERF_NCAT; f++) s->width += s->hot[f];
}

void nb_mlperf_close(nb_mlperf_set *s) {
    for (int d = 0; d < s->ndays; d++) {
        nb_npy_unmap(&s->day[d].dense);
        nb_npy_unmap(&s->day[d].labels);
        nb_npy_unmap(&s->day[d].sparse);
    }
    memset(s, 0, sizeof *s);
}

void nb_mlperf_get(const nb_mlperf_set *s, int64_t i, float *dense, uint32_t *cat, uint32_t *mv, int32_t *mv_len, float *label) {
    NB_ASSERT(i >= 0 && i < s->start[s->ndays]);
    int d = 0;
    while (i >= s->start[d + 1]) d++;
    const nb_mlperf_day *y = &s->day[d];
    int64_t r = y->first + i - s->start[d];
    memcpy(dense, (const float *)y->d.data + r * NB_MLPERF_NDENSE, NB_MLPERF_NDENSE * sizeof(float));
    unsigned char lb[4]; /* an .npz member's data need not be aligned: copy, never dereference */
    memcpy(lb, (const unsigned char *)y->l.data + r * 4, 4);
    if (y->l.descr[1] == 'i') {
        int32_t v;
        memcpy(&v, lb, 4);
        *label = (float)v;
    } else {
        memcpy(label, lb, 4);
    }
    for (int f = 0; f < NB_MLPERF_NCAT; f++) {
        int k = s->hot[f];
        memcpy(mv, (const int32_t *)y->s[f].data + r * k, (size_t)k * sizeof(uint32_t));
        cat[f] = mv[0];
        mv_len[f] = k;
        mv += k;
    }
}
