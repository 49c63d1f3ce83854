/* --balance's plans (data/balance.c) and the packed samples the ranks exchange: every sample
 * placed exactly once, the counts each kind promises, the length balance it is for, the same
 * plan every time, and a pack / unpack round trip; --cluster-keys' order against a brute-force
 * count of the keys. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core.h"
#include "data/balance.h"
#include "data/ctr_source.h"
#include "data/synth.h"
#include "model/seqctr.h"

enum { BG = 1024, MAX_SHARES = 8 };

static void *scratch(void) { return nb_malloc(nb_balance_scratch_bytes(BG, MAX_SHARES), "test"); }

/* Pareto-like lengths with a few at the cap, from the synthetic generator (a heavy tail) */
static void lengths(int32_t *len, int n, int max_len) {
    nb_synth g;
    char spec[128];
    snprintf(spec, sizeof spec, "synth:max_len=%d,hist_alpha=1.0,hist_scale=32,calib=1024", max_len);
    nb_synth_open(&g, spec);
    nb_synth_fill(&g, 7, n, NULL, NULL, NULL, NULL, len, NULL, NULL);
}

static double max_over_mean_cost(const nb_balance *b, const int32_t *len, const int *share_of, int shares) {
    double load[MAX_SHARES] = {0}, mx = 0, sum = 0;
    for (int i = 0; i < BG; i++) load[share_of[i]] += nb_balance_cost(b, len[i]);
    for (int s = 0; s < shares; s++) mx = fmax(mx, load[s]), sum += load[s];
    return mx / (sum / shares);
}

static void check_plan(const char *spec, const int32_t *len, int shares, int min_count) {
    nb_balance b;
    nb_balance_parse(&b, spec);
    int share_of[BG], count[MAX_SHARES], again[BG], cnt2[MAX_SHARES], seen[MAX_SHARES] = {0};
    void *w = scratch();
    nb_balance_assign(&b, len, BG, shares, min_count, share_of, count, w);
    nb_balance_assign(&b, len, BG, shares, min_count, again, cnt2, w);
    CHECK(!memcmp(share_of, again, sizeof share_of), "%s: the same lengths give the same plan", spec);
    int cap = nb_balance_cap(&b, BG, shares), total = 0;
    for (int i = 0; i < BG; i++) {
        CHECK(share_of[i] >= 0 && share_of[i] < shares, "%s: sample %d placed on share %d", spec, i, share_of[i]);
        seen[share_of[i]]++;
    }
    for (int s = 0; s < shares; s++) {
        CHECK(seen[s] == count[s], "%s: share %d counted %d, holds %d", spec, s, count[s], seen[s]);
        CHECK(count[s] >= min_count && count[s] <= cap, "%s: share %d has %d samples (%d..%d)", spec, s, count[s], min_count, cap);
        if (b.kind != NB_BALANCE_VBS) CHECK(count[s] == BG / shares, "%s: share %d has %d samples", spec, s, count[s]);
        total += count[s];
    }
    CHECK(total == BG, "%s: %d samples placed of %d", spec, total, BG);
    int order[BG], first[MAX_SHARES + 1];
    nb_balance_order(share_of, BG, shares, order, first, w);
    free(w);
    for (int s = 0; s < shares; s++)
        for (int k = first[s]; k < first[s + 1]; k++) {
            CHECK(share_of[order[k]] == s, "%s: position %d of share %d holds a sample of share %d", spec, k, s, share_of[order[k]]);
            if (k > first[s]) CHECK(order[k] > order[k - 1], "%s: share %d is out of data order at %d", spec, s, k);
        }
    if (b.kind == NB_BALANCE_NONE)
        for (int i = 0; i < BG; i++) CHECK(share_of[i] == i / (BG / shares), "none: sample %d on share %d", i, share_of[i]);
}

TEST_CASE(plans_place_every_sample_once) {
    int32_t len[BG];
    lengths(len, BG, 8192);
    const char *specs[] = {"none", "fbs", "vbs", "vbs:2", "vbs:1.2:64"};
    for (int k = 0; k < 5; k++)
        for (int shares = 1; shares <= MAX_SHARES; shares *= 2) check_plan(specs[k], len, shares, specs[k][0] == 'v' ? 4 : 0);
}

/* the point of the plans: the most loaded share is closer to the mean than with slices */
TEST_CASE(plans_balance_the_cost) {
    int32_t len[BG];
    lengths(len, BG, 8192);
    nb_balance none, fbs, vbs;
    nb_balance_parse(&none, "none"), nb_balance_parse(&fbs, "fbs"), nb_balance_parse(&vbs, "vbs:2:0");
    int a[BG], b[BG], c[BG], cnt[MAX_SHARES];
    void *w = scratch();
    nb_balance_assign(&none, len, BG, 8, 0, a, cnt, w);
    nb_balance_assign(&fbs, len, BG, 8, 0, b, cnt, w);
    nb_balance_assign(&vbs, len, BG, 8, 1, c, cnt, w);
    free(w);
    double r_none = max_over_mean_cost(&vbs, len, a, 8), r_fbs = max_over_mean_cost(&vbs, len, b, 8),
           r_vbs = max_over_mean_cost(&vbs, len, c, 8);
    printf("  max/mean of sum L^2 over 8 shares: none %.3f fbs %.3f vbs %.3f\n", r_none, r_fbs, r_vbs);
    CHECK(r_vbs <= r_fbs + 1e-9 && r_vbs < r_none, "vbs %.3f, fbs %.3f, none %.3f", r_vbs, r_fbs, r_none);
    double l_none = 0, l_fbs = 0, sum[2][MAX_SHARES] = {{0}};
    for (int i = 0; i < BG; i++) sum[0][a[i]] += len[i], sum[1][b[i]] += len[i];
    for (int s = 0; s < 8; s++) l_none = fmax(l_none, sum[0][s]), l_fbs = fmax(l_fbs, sum[1][s]);
    CHECK(l_fbs <= l_none, "fbs: the longest share's rows %.0f, none's %.0f", l_fbs, l_none);
}

TEST_CASE(packed_samples_round_trip) {
    nb_synth g;
    nb_synth_open(&g, "synth:max_len=64,calib=1024");
    nb_ctr_batch a, b;
    nb_ctr_batch_alloc(&a, 16, 64, NB_SC_STD_NDENSE, NB_SC_STD_NCAT), nb_ctr_batch_alloc(&b, 16, 64, NB_SC_STD_NDENSE, NB_SC_STD_NCAT);
    nb_synth_fill(&g, 100, 16, a.dense, a.cat, a.target, a.hist, a.len, a.label, NULL);
    uint32_t *buf = nb_malloc(16 * nb_ctr_packed_words(&a, 64) * sizeof(uint32_t), "test");
    size_t at = 0, got = 0;
    for (int i = 0; i < 16; i++) at += nb_ctr_pack(&a, 15 - i, (uint32_t)(1000 + i), buf + at);
    for (int j = 0; j < 16; j++) {
        uint32_t idx;
        got += nb_ctr_unpack(&b, j, buf + got, at - got, &idx);
        int i = 15 - j;
        CHECK(idx == (uint32_t)(1000 + j), "index %u", idx);
        CHECK(b.len[j] == a.len[i] && b.target[j] == a.target[i] && b.label[j] == a.label[i], "sample %d", j);
        CHECK(!memcmp(b.dense + j * 13, a.dense + i * 13, 13 * 4) && !memcmp(b.cat + j * 26, a.cat + i * 26, 26 * 4), "sample %d", j);
        CHECK(!memcmp(b.hist + j * 64, a.hist + i * 64, (size_t)a.len[i] * 4), "history of sample %d", j);
    }
    CHECK(got == at, "read %zu words of %zu", got, at);
    free(buf);
    nb_ctr_batch_free(&a), nb_ctr_batch_free(&b);
}

/* Brute force: the number of lookups of key k in the window (keys sorted). */
static int count_of(const uint64_t *sorted, size_t n, uint64_t k) {
    size_t lo = 0, hi = n;
    while (lo < hi) { /* first >= k */
        size_t mid = (lo + hi) / 2;
        if (sorted[mid] < k) lo = mid + 1; else hi = mid;
    }
    size_t e = lo;
    while (e < n && sorted[e] == k) e++;
    return (int)(e - lo);
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

typedef struct {
    uint64_t key;
    int cnt, i;
} chosen;

static int cmp_chosen(const void *a, const void *b) {
    const chosen *x = a, *y = b;
    if (x->cnt != y->cnt) return x->cnt > y->cnt ? -1 : 1;
    if (x->key != y->key) return x->key < y->key ? -1 : 1;
    return (x->i > y->i) - (x->i < y->i);
}

/* Each sample goes by its most shared key with 2..B/parts lookups (ties: the smaller key), the
 * samples sorted by (count desc, key, index): the rule of ctr_source.h, counted here by brute
 * force over a window large enough for the parallel paths. */
TEST_CASE(cluster_keys_follow_the_rule) {
    enum { B = 2048, L = 64, PARTS = 4 };
    nb_synth g;
    nb_synth_open(&g, "synth:cap=3000,items=4000,max_len=64,calib=1024");
    nb_sc_model m;
    memset(&m, 0, sizeof m);
    m.cfg.ncat = NB_SC_STD_NCAT;
    for (int t = 0; t < (NB_SC_STD_NCAT + 1); t++) m.emb_off[t] = (int64_t)t * 3000; /* 26 tables of 3000 rows, 4000 items */
    m.emb_off[NB_SC_STD_NCAT + 1] = m.emb_off[NB_SC_STD_NCAT] + 4000;
    nb_ctr_batch w, orig;
    nb_ctr_batch_alloc(&w, B, L, NB_SC_STD_NDENSE, NB_SC_STD_NCAT), nb_ctr_batch_alloc(&orig, B, L, NB_SC_STD_NDENSE, NB_SC_STD_NCAT);
    nb_synth_fill(&g, 0, B, orig.dense, orig.cat, orig.target, orig.hist, orig.len, orig.label, NULL);
    size_t n = 0;
    for (int i = 0; i < B; i++) n += (size_t)(NB_SC_STD_NCAT + 1 + orig.len[i]);
    uint64_t *keys = nb_malloc(n * sizeof(uint64_t), "test"), *sorted = nb_malloc(n * sizeof(uint64_t), "test");
    size_t at = 0;
    for (int i = 0; i < B; i++)
        for (int f = 0; f < NB_SC_STD_NCAT + 1 + orig.len[i]; f++) {
            int t = f < NB_SC_STD_NCAT ? f : NB_SC_STD_NCAT;
            uint64_t id = f < NB_SC_STD_NCAT ? orig.cat[i * NB_SC_STD_NCAT + f] : f == NB_SC_STD_NCAT ? orig.target[i] : orig.hist[i * L + f - NB_SC_STD_NCAT - 1];
            keys[at++] = (uint64_t)m.emb_off[t] + id % (uint64_t)(m.emb_off[t + 1] - m.emb_off[t]);
        }
    memcpy(sorted, keys, n * sizeof(uint64_t));
    qsort(sorted, n, sizeof(uint64_t), cmp_u64);
    chosen *want = nb_malloc(B * sizeof(chosen), "test");
    at = 0;
    for (int i = 0; i < B; i++) {
        want[i] = (chosen){UINT64_MAX, 0, i};
        for (int f = 0; f < NB_SC_STD_NCAT + 1 + orig.len[i]; f++, at++) {
            int c = count_of(sorted, n, keys[at]);
            if (c < 2 || c > B / PARTS) continue;
            if (c > want[i].cnt || (c == want[i].cnt && keys[at] < want[i].key)) want[i].key = keys[at], want[i].cnt = c;
        }
    }
    qsort(want, B, sizeof(chosen), cmp_chosen);
    nb_ctr_cluster cs;
    nb_ctr_cluster_init(&cs, B, L, NB_SC_STD_NDENSE, NB_SC_STD_NCAT);
    for (int run = 0; run < 2; run++) { /* the scratch reused: the same order again */
        for (int i = 0; i < B; i++) nb_ctr_batch_copy(&w, i, &orig, i);
        nb_ctr_cluster_keys(&w, &m, PARTS, &cs);
        int bad = 0;
        for (int r = 0; r < B && !bad; r++) {
            int i = want[r].i;
            bad = w.len[r] != orig.len[i] || w.target[r] != orig.target[i] || w.label[r] != orig.label[i] ||
                  memcmp(w.cat + r * NB_SC_STD_NCAT, orig.cat + i * NB_SC_STD_NCAT, NB_SC_STD_NCAT * 4) ||
                  memcmp(w.dense + r * 13, orig.dense + i * 13, 13 * 4) || memcmp(w.hist + r * L, orig.hist + i * L, (size_t)orig.len[i] * 4);
            if (bad) printf("  run %d: row %d holds another sample than %d\n", run, r, i);
        }
        CHECK(!bad, "the clustered order differs from the rule's (run %d)", run);
    }
    CHECK(want[0].cnt >= 2, "the window has no shared key to cluster by");
    nb_ctr_cluster_free(&cs);
    free(keys), free(sorted), free(want);
    nb_ctr_batch_free(&w), nb_ctr_batch_free(&orig);
}

int main(void) {
    RUN(plans_place_every_sample_once);
    RUN(plans_balance_the_cost);
    RUN(packed_samples_round_trip);
    RUN(cluster_keys_follow_the_rule);
    return nb_test_failures ? 1 : 0;
}
