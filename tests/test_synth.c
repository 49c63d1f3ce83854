/* Synthetic click data: determinism (per sample, per batch, per thread count), ranges, the Zipf
 * and Pareto shapes against their formulas, the calibrated base rate, a label that depends on
 * the inputs, and option errors (exit 1 with the valid keys, in a forked child). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* fork */
#endif
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "core.h"
#include "data/synth.h"

typedef struct {
    int n, L;
    float *dense, *label;
    uint32_t *cat, *target, *hist;
    int32_t *len;
    uint16_t *miss;
} batch;

/* with_hist = 0 leaves hist NULL (the generator must then skip it) */
static batch make(const nb_synth *g, uint64_t first, int n, int with_hist) {
    batch b = {n, g->o.max_len, 0, 0, 0, 0, 0, 0, 0};
    b.dense = nb_malloc(sizeof(float) * (size_t)n * NB_SYNTH_NDENSE, "dense");
    b.cat = nb_malloc(sizeof(uint32_t) * (size_t)n * NB_SYNTH_NCAT, "cat");
    b.target = nb_malloc(sizeof(uint32_t) * (size_t)n, "target");
    b.hist = with_hist ? nb_malloc(sizeof(uint32_t) * (size_t)n * (size_t)b.L + 4, "hist") : NULL;
    b.len = nb_malloc(sizeof(int32_t) * (size_t)n, "len");
    b.label = nb_malloc(sizeof(float) * (size_t)n, "label");
    b.miss = nb_malloc(sizeof(uint16_t) * (size_t)n, "miss");
    nb_synth_fill(g, first, n, b.dense, b.cat, b.target, b.hist, b.len, b.label, b.miss);
    return b;
}
static void drop(batch *b) {
    free(b->dense), free(b->cat), free(b->target), free(b->hist), free(b->len), free(b->label),
        free(b->miss);
}
/* 1 when rows [i] of a and [j] of b are byte-identical in every output */
static int same_row(const batch *a, int i, const batch *b, int j) {
    size_t L = (size_t)a->L;
    return !memcmp(a->dense + (size_t)i * NB_SYNTH_NDENSE, b->dense + (size_t)j * NB_SYNTH_NDENSE,
                   sizeof(float) * NB_SYNTH_NDENSE) &&
           !memcmp(a->cat + (size_t)i * NB_SYNTH_NCAT, b->cat + (size_t)j * NB_SYNTH_NCAT,
                   sizeof(uint32_t) * NB_SYNTH_NCAT) &&
           a->target[i] == b->target[j] && a->len[i] == b->len[j] && a->label[i] == b->label[j] &&
           a->miss[i] == b->miss[j] &&
           (!a->hist || !b->hist || !memcmp(a->hist + i * L, b->hist + j * L, sizeof(uint32_t) * L));
}

static nb_synth gen_default; /* "synth": built once, shared by the tests that use defaults */

TEST_CASE(determinism) {
    static nb_synth g2;
    nb_synth_open(&g2, "synth");
    CHECK(g2.bias == gen_default.bias, "bias %.17g vs %.17g", g2.bias, gen_default.bias);
    int n = 3000;
    omp_set_num_threads(2);
    batch a = make(&gen_default, 0, n, 1);
    omp_set_num_threads(1);
    batch b = make(&g2, 0, n, 1);
    omp_set_num_threads(2);
    int diff = 0;
    for (int i = 0; i < n; i++) diff += !same_row(&a, i, &b, i);
    CHECK(diff == 0, "%d of %d rows differ between two generators / thread counts", diff, n);
    /* any sample alone equals the same sample in a batch, also far into the stream */
    int idx[] = {0, 1, 17, 1234, n - 1};
    for (size_t k = 0; k < sizeof idx / sizeof idx[0]; k++) {
        batch one = make(&gen_default, (uint64_t)idx[k], 1, 1);
        CHECK(same_row(&one, 0, &a, idx[k]), "sample %d alone differs from the batch", idx[k]);
        drop(&one);
    }
    uint64_t far = (1ull << 40) + 5;
    batch f1 = make(&gen_default, far - 3, 8, 1), f2 = make(&gen_default, far, 1, 1);
    CHECK(same_row(&f2, 0, &f1, 3), "sample 2^40+5 differs alone vs in a batch");
    /* hist = NULL changes nothing else */
    batch nh = make(&gen_default, 0, 200, 0);
    int d2 = 0;
    for (int i = 0; i < 200; i++) d2 += !same_row(&nh, i, &a, i);
    CHECK(d2 == 0, "%d rows differ when hist is NULL", d2);
    /* another seed: another stream */
    static nb_synth g3;
    nb_synth_open(&g3, "synth:seed=2,calib=1000");
    batch c = make(&g3, 0, 200, 1);
    int same = 0;
    for (int i = 0; i < 200; i++) same += same_row(&c, i, &a, i);
    CHECK(same == 0, "seed 2 repeats %d rows of seed 1", same);
    drop(&a), drop(&b), drop(&f1), drop(&f2), drop(&nh), drop(&c);
}

TEST_CASE(ranges) {
    static nb_synth g;
    nb_synth_open(&g, "synth:cap=1000,items=5000,max_len=32,calib=1000");
    for (int f = 0; f < NB_SYNTH_NCAT; f++) {
        uint32_t want = nb_synth_criteo_card[f] < 1000 ? nb_synth_criteo_card[f] : 1000;
        CHECK(g.card[f] == want, "field %d: card %u, want %u", f, g.card[f], want);
    }
    int n = 20000;
    batch b = make(&g, 0, n, 1);
    int bad_cat = 0, bad_item = 0, bad_pad = 0, bad_dense = 0, bad_label = 0, bad_len = 0;
    uint32_t max_c2 = 0;
    int seen8[3] = {0, 0, 0};
    for (int i = 0; i < n; i++) {
        for (int f = 0; f < NB_SYNTH_NCAT; f++) bad_cat += b.cat[i * NB_SYNTH_NCAT + f] >= g.card[f];
        if (b.cat[i * NB_SYNTH_NCAT + 2] > max_c2) max_c2 = b.cat[i * NB_SYNTH_NCAT + 2];
        if (b.cat[i * NB_SYNTH_NCAT + 8] < 3) seen8[b.cat[i * NB_SYNTH_NCAT + 8]] = 1;
        bad_item += b.target[i] >= 5000;
        bad_len += b.len[i] < 0 || b.len[i] > 32;
        for (int j = 0; j < 32; j++) {
            uint32_t h = b.hist[i * 32 + j];
            if (j < b.len[i]) bad_item += h >= 5000;
            else bad_pad += h != 0;
        }
        for (int j = 0; j < NB_SYNTH_NDENSE; j++) {
            float d = b.dense[i * NB_SYNTH_NDENSE + j];
            int m = (b.miss[i] >> j) & 1;
            bad_dense += !isfinite(d) || d < 0 || (m && d != 0);
        }
        bad_dense += b.miss[i] >> NB_SYNTH_NDENSE != 0;
        bad_label += b.label[i] != 0.0f && b.label[i] != 1.0f;
    }
    CHECK(!bad_cat && !bad_item && !bad_pad && !bad_dense && !bad_label && !bad_len,
          "out of range: cat %d item %d pad %d dense %d label %d len %d", bad_cat, bad_item,
          bad_pad, bad_dense, bad_label, bad_len);
    CHECK(max_c2 > 900, "field 2 (capped at 1000) never goes above %u: the scramble is not spread",
          max_c2);
    CHECK(seen8[0] && seen8[1] && seen8[2], "field 8 (3 ids) misses an id");
    drop(&b);
}

/* Zipf: the exact pmf on a 3-id field, and rank 1 vs rank 10 on a large field ~ 10^s. */
static void zipf_check(const nb_synth *g, int n) {
    double s = g->o.zipf;
    batch b = make(g, 0, n, 0);
    uint32_t r1 = nb_synth_rank_to_id(g, 2, 1), r10 = nb_synth_rank_to_id(g, 2, 10);
    long c1 = 0, c10 = 0, c8[3] = {0, 0, 0};
    for (int i = 0; i < n; i++) {
        uint32_t id = b.cat[i * NB_SYNTH_NCAT + 2];
        c1 += id == r1;
        c10 += id == r10;
        for (int k = 1; k <= 3; k++) c8[k - 1] += b.cat[i * NB_SYNTH_NCAT + 8] == nb_synth_rank_to_id(g, 8, (uint64_t)k);
    }
    double ratio = (double)c1 / (double)(c10 ? c10 : 1), want = pow(10.0, s);
    printf("  zipf s=%g: rank1/rank10 = %ld/%ld = %.2f (10^s = %.2f)\n", s, c1, c10, ratio, want);
    CHECK(fabs(ratio / want - 1) < 0.15, "rank1/rank10 %.2f vs %.2f", ratio, want);
    if (!g->o.scramble) {
        /* head table (ranks <= 1024), then three tail bands: the masses by direct sums */
        long cnt[4] = {0, 0, 0, 0};
        for (int i = 0; i < n; i++) {
            uint32_t r = b.cat[i * NB_SYNTH_NCAT + 2] + 1;
            cnt[r <= 1024 ? 0 : r <= 4096 ? 1 : r <= 65536 ? 2 : 3]++;
        }
        double m[4] = {0, 0, 0, 0}, tot = 0;
        for (uint32_t r = 1; r <= g->card[2]; r++) {
            double h = pow(r, -s);
            m[r <= 1024 ? 0 : r <= 4096 ? 1 : r <= 65536 ? 2 : 3] += h;
            tot += h;
        }
        for (int k = 0; k < 4; k++) {
            double p = m[k] / tot, f = (double)cnt[k] / n, sd = sqrt(p * (1 - p) / n);
            printf("  zipf s=%g: rank band %d: freq %.5f, pmf %.5f\n", s, k, f, p);
            CHECK(fabs(f - p) < 5 * sd, "band %d: freq %.5f, pmf %.5f (sd %.5f)", k, f, p, sd);
        }
    }
    double z = 1 + pow(2, -s) + pow(3, -s);
    for (int k = 1; k <= 3; k++) {
        double p = pow(k, -s) / z, f = (double)c8[k - 1] / n, sd = sqrt(p * (1 - p) / n);
        CHECK(fabs(f - p) < 5 * sd, "field 8 rank %d: freq %.5f, pmf %.5f (sd %.5f)", k, f, p, sd);
    }
    drop(&b);
}

TEST_CASE(zipf) {
    zipf_check(&gen_default, 200000);
    static nb_synth g; /* 170 KB */
    nb_synth_open(&g, "synth:scramble=0,calib=1000");
    zipf_check(&g, 200000);
    nb_synth_open(&g, "synth:zipf=1,scramble=0,calib=1000"); /* s = 1: the helpers' limit */
    zipf_check(&g, 100000);
    nb_synth_open(&g, "synth:zipf=1.5,scramble=0,calib=1000");
    CHECK(nb_synth_rank_to_id(&g, 2, 10) == 9, "scramble=0 must map rank 10 to id 9");
    zipf_check(&g, 100000);
}

TEST_CASE(history) {
    int n = 200000;
    const nb_synth *g = &gen_default;
    int32_t *len = nb_malloc(sizeof(int32_t) * (size_t)n, "len");
    nb_synth_fill(g, 0, n, NULL, NULL, NULL, NULL, len, NULL, NULL);
    long empty = 0, ge100 = 0, capped = 0, over = 0;
    double sum = 0;
    for (int i = 0; i < n; i++) {
        empty += len[i] == 0;
        ge100 += len[i] >= 100;
        capped += len[i] == 256;
        over += len[i] > 256;
        sum += len[i];
    }
    /* P(len >= m) = (1 + m / scale)^-alpha for 1 <= m <= max_len */
    double a = g->o.hist_alpha, sc = g->o.hist_scale;
    double p0 = 1 - pow(1 + 1 / sc, -a), p100 = pow(1 + 100 / sc, -a), p256 = pow(1 + 256 / sc, -a);
    printf("  history: mean %.1f, empty %.4f (%.4f), >=100 %.4f (%.4f), =256 %.4f (%.4f)\n",
           sum / n, (double)empty / n, p0, (double)ge100 / n, p100, (double)capped / n, p256);
    CHECK(over == 0, "%ld histories longer than max_len", over);
    CHECK(fabs((double)empty / n - p0) < 5 * sqrt(p0 * (1 - p0) / n), "empty rate");
    CHECK(fabs((double)ge100 / n - p100) < 5 * sqrt(p100 * (1 - p100) / n), "tail >= 100");
    CHECK(fabs((double)capped / n - p256) < 5 * sqrt(p256 * (1 - p256) / n), "capped rate");
    /* heavy tail: an exponential law with the same mean would put e^-(100/mean) at >= 100 */
    CHECK((double)ge100 / n > 3 * exp(-100.0 / (sum / n)), "tail not heavier than exponential");
    free(len);
}

/* AUC of score vs 0/1 labels (ties count half), by sorting. */
static const float *auc_score;
static int by_score(const void *x, const void *y) {
    float a = auc_score[*(const int *)x], b = auc_score[*(const int *)y];
    return (a > b) - (a < b);
}
static double auc(const float *score, const float *label, int n) {
    int *ord = nb_malloc(sizeof(int) * (size_t)n, "order");
    for (int i = 0; i < n; i++) ord[i] = i;
    auc_score = score;
    qsort(ord, (size_t)n, sizeof(int), by_score);
    double pos = 0, neg = 0, rank_sum = 0;
    for (int i = 0; i < n;) {
        int j = i;
        while (j < n && score[ord[j]] == score[ord[i]]) j++;
        double mid = 0.5 * (i + j - 1) + 1; /* average 1-based rank of the tie group */
        for (int k = i; k < j; k++)
            if (label[ord[k]] > 0.5f) rank_sum += mid, pos++;
        i = j;
    }
    neg = n - pos;
    free(ord);
    return (rank_sum - pos * (pos + 1) / 2) / (pos * neg);
}

TEST_CASE(labels) {
    int n = 200000;
    const nb_synth *g = &gen_default;
    float *label = nb_malloc(sizeof(float) * (size_t)n, "label");
    float *logit = nb_malloc(sizeof(float) * (size_t)n, "logit");
    nb_synth_fill(g, 0, n, NULL, NULL, NULL, NULL, NULL, label, NULL);
    nb_synth_teacher_logit(g, 0, n, logit);
    double m = 0, mp = 0;
    for (int i = 0; i < n; i++) m += label[i], mp += 1 / (1 + exp(-(double)logit[i]));
    m /= n, mp /= n;
    double a = auc(logit, label, n);
    printf("  base rate: labels %.5f, teacher mean p %.5f (want 0.25); teacher AUC %.4f, bias %.4f\n",
           m, mp, a, g->bias);
    CHECK(fabs(m - 0.25) < 0.0025, "mean label %.5f not within 1%% of 0.25", m);
    CHECK(fabs(mp - 0.25) < 0.0025, "mean teacher p %.5f not within 1%% of 0.25", mp);
    CHECK(a > 0.7, "teacher AUC %.4f: labels hardly depend on the features", a);
    /* the metric itself: a constant score has AUC 0.5 */
    for (int i = 0; i < 1000; i++) logit[i] = 0;
    CHECK(fabs(auc(logit, label, 1000) - 0.5) < 1e-12, "AUC of a constant score must be 0.5");

    /* another base rate, and the history-target term on its own: with scramble=0 an item's
     * cluster is id mod 32, so the affinity can be recomputed here */
    static nb_synth g2;
    nb_synth_open(&g2, "synth:base_rate=0.05,scramble=0,max_len=64,seed=9");
    int n2 = 100000;
    batch b = make(&g2, 0, n2, 1);
    double m2 = 0, hi_pos = 0, hi_n = 0, lo_pos = 0, lo_n = 0;
    for (int i = 0; i < n2; i++) {
        m2 += b.label[i];
        if (b.len[i] < 8) continue;
        int same = 0;
        for (int j = 0; j < b.len[i]; j++) same += b.hist[i * 64 + j] % 32 == b.target[i] % 32;
        double aff = (double)same / b.len[i];
        if (aff >= 0.4) hi_pos += b.label[i], hi_n++;
        if (aff <= 0.1) lo_pos += b.label[i], lo_n++;
    }
    m2 /= n2;
    printf("  base_rate 0.05: labels %.5f; label rate by affinity: high %.4f (%g), low %.4f (%g)\n",
           m2, hi_pos / hi_n, hi_n, lo_pos / lo_n, lo_n);
    CHECK(fabs(m2 - 0.05) < 4 * sqrt(0.05 * 0.95 / n2), "mean label %.5f vs base_rate 0.05", m2);
    CHECK(fabs(g2.calib_mean - 0.05) < 1e-8, "calibration mean %.9f", g2.calib_mean);
    CHECK(hi_n > 1000 && lo_n > 1000 && hi_pos / hi_n > 2 * (lo_pos / lo_n),
          "history-target affinity does not move the label");
    drop(&b);
    free(label), free(logit);
}

/* ---- option errors: nb_fail in a forked child ---- */
static int child_status(const char *spec, char *err, size_t cap) {
    char path[] = "/tmp/nb_synth_errXXXXXX";
    int fd = mkstemp(path);
    NB_ASSERT(fd >= 0);
    fflush(stdout), fflush(stderr);
    pid_t pid = fork();
    NB_ASSERT(pid >= 0);
    if (pid == 0) {
        if (dup2(fd, 2) < 0) _exit(99);
        nb_synth_opts o;
        nb_synth_parse(&o, spec);
        _exit(0);
    }
    int st;
    NB_ASSERT(waitpid(pid, &st, 0) == pid);
    FILE *f = fdopen(fd, "r");
    NB_ASSERT(f);
    rewind(f);
    size_t got = fread(err, 1, cap - 1, f);
    err[got] = 0;
    fclose(f);
    unlink(path);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

TEST_CASE(options) {
    struct { const char *spec, *msg; } bad[] = {
        {"synth:foo=1", "unknown option 'foo'"},
        {"synth:cap=abc", "cap=abc"},
        {"synth:cap=0", "cap=0"},
        {"synth:cap=4294967296", "cap=4294967296"},
        {"synth:zipf=0", "zipf=0"},
        {"synth:zipf=x1", "zipf=x1"},
        {"synth:base_rate=1", "base_rate=1"},
        {"synth:max_len=-3", "max_len=-3"},
        {"synth:max_len=70000", "max_len=70000"},
        {"synth:seed=-1", "seed=-1"},
        {"synth:missing=some", "missing=some"},
        {"synth:scramble=2", "scramble=2"},
        {"synth:cap", "has no '=value'"},
        {"synth:cap=5,cap=6", "given twice"},
        {"synth:cap=5,,seed=2", "empty option"},
        {"synth:cap=", "cap="},
    };
    char err[4096];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int st = child_status(bad[i].spec, err, sizeof err);
        int lines = 0;
        for (char *p = err; *p; p++) lines += *p == '\n';
        CHECK(st == 1 && strstr(err, bad[i].msg) && strstr(err, "valid keys") && lines == 1,
              "'%s': status %d, stderr: %s", bad[i].spec, st, err);
    }
    nb_synth_opts o;
    nb_synth_parse(&o, "synth:seed=18446744073709551615,cap=100,missing=0.5,max_len=0,zipf=0.8");
    CHECK(o.seed == UINT64_MAX && o.cap == 100 && o.missing == 0.5 && o.max_len == 0 && o.zipf == 0.8 &&
              o.items == 1000000 && o.base_rate == 0.25,
          "parsed values");
    nb_synth_parse(&o, "items=77,missing=criteo");
    CHECK(o.items == 77 && o.missing < 0 && o.cap == 1000000, "spec without the synth: prefix");
    nb_synth_parse(&o, "synth");
    CHECK(o.seed == 1 && o.max_len == 256 && o.hist_alpha == 1.2, "defaults");
    /* edge configuration: fewer items than clusters, no history at all, every dense missing */
    static nb_synth g;
    nb_synth_open(&g, "synth:items=7,max_len=0,missing=1,calib=1000");
    batch b = make(&g, 0, 500, 1);
    int bad_items = 0, bad_len = 0, not_missing = 0;
    for (int i = 0; i < 500; i++)
        bad_items += b.target[i] >= 7, bad_len += b.len[i] != 0, not_missing += b.miss[i] != 0x1fff;
    CHECK(!bad_items && !bad_len && !not_missing && g.clusters == 7,
          "items=7/max_len=0/missing=1: %d %d %d", bad_items, bad_len, not_missing);
    char desc[512];
    printf("  %s\n", nb_synth_describe(&g, desc, sizeof desc));
    drop(&b);
}

/* Options at the ends of their ranges: ids stay in range, lengths stay capped, the bias still
 * calibrates, nothing is NaN. */
TEST_CASE(extremes) {
    const char *specs[] = {
        "synth:zipf=0.01,cap=1,items=1,max_len=5,calib=1000",
        "synth:zipf=10,hist_alpha=0.05,hist_scale=1000000,max_len=7,calib=1000",
        "synth:base_rate=0.001,zipf=0.5,items=100,calib=1000,max_len=16",
        "synth:base_rate=0.999,zipf=2,cap=4294967295,items=4294967295,calib=1000,max_len=16",
    };
    static nb_synth g;
    for (size_t k = 0; k < sizeof specs / sizeof specs[0]; k++) {
        nb_synth_open(&g, specs[k]);
        int n = 5000, L = g.o.max_len, bad = 0, full = 0;
        batch b = make(&g, 123456789, n, 1);
        for (int i = 0; i < n; i++) {
            for (int f = 0; f < NB_SYNTH_NCAT; f++) bad += b.cat[i * NB_SYNTH_NCAT + f] >= g.card[f];
            for (int j = 0; j < NB_SYNTH_NDENSE; j++) bad += !isfinite(b.dense[i * NB_SYNTH_NDENSE + j]);
            bad += b.target[i] >= g.o.items || b.len[i] < 0 || b.len[i] > L;
            for (int j = 0; j < b.len[i]; j++) bad += b.hist[(size_t)i * L + j] >= g.o.items;
            full += b.len[i] == L;
        }
        CHECK(bad == 0 && isfinite(g.bias) && fabs(g.calib_mean / g.o.base_rate - 1) < 1e-6,
              "%s: %d bad values, bias %g, calibrated mean %g", specs[k], bad, g.bias, g.calib_mean);
        if (k == 1) CHECK(full > n / 2, "hist_alpha=0.05: only %d of %d histories reach max_len", full, n);
        drop(&b);
    }
}

TEST_CASE(speed) {
    int n = 100000;
    omp_set_num_threads(2);
    batch b = make(&gen_default, 0, n, 1); /* also touches the pages once */
    double t0 = nb_now();
    nb_synth_fill(&gen_default, (uint64_t)n, n, b.dense, b.cat, b.target, b.hist, b.len, b.label, b.miss);
    double dt = nb_now() - t0;
    double mean = 0;
    for (int i = 0; i < n; i++) mean += b.len[i];
    printf("  speed: %.0f samples/s on %d threads (max_len 256, mean history %.1f)\n", n / dt,
           omp_get_max_threads(), mean / n);
    CHECK(n / dt > 1e4, "generation is far too slow: %.0f samples/s", n / dt);
    drop(&b);
}

int main(void) {
    double t0 = nb_now();
    nb_synth_open(&gen_default, "synth");
    printf("  init (calibration of 262144 samples): %.3f s\n", nb_now() - t0);
    RUN(options);
    RUN(determinism);
    RUN(ranges);
    RUN(zipf);
    RUN(history);
    RUN(labels);
    RUN(extremes);
    RUN(speed);
    TEST_EXIT();
}
