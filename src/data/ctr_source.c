/* seqctr data sources (see ctr_source.h). */
#include "data/ctr_source.h"

#include <errno.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "datapath.h"
#include "ops/ops_ctr.h"

#define POP_SMOOTH 10.0 /* popularity baseline: prior strength, in pseudo-ratings */

/* ---- in-memory sample sets (MovieLens, Criteo's held-out head) ---- */


static void ctr_set_push(nb_ctr_set *s, const float *dense, const uint32_t *cat, uint32_t target, const uint32_t *hist,
                     int len, float label) {
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 1024;
        s->dense = realloc(s->dense, (size_t)s->cap * (size_t)s->nd * sizeof(float));
        s->label = realloc(s->label, (size_t)s->cap * sizeof(float));
        s->cat = realloc(s->cat, (size_t)s->cap * (size_t)s->nc * sizeof(uint32_t));
        s->target = realloc(s->target, (size_t)s->cap * sizeof(uint32_t));
        s->hoff = realloc(s->hoff, (size_t)(s->cap + 1) * sizeof(long));
        NB_CHECK(s->dense && s->label && s->cat && s->target && s->hoff, "use a smaller data set",
                 "out of memory holding %ld samples", s->cap);
        s->hoff[0] = 0;
    }
    if (s->nh + len > s->hcap) {
        s->hcap = 2 * (s->nh + len) + 1024;
        s->hids = realloc(s->hids, (size_t)s->hcap * sizeof(uint32_t));
        NB_CHECK(s->hids != NULL, "lower --max-len", "out of memory holding histories");
    }
    memcpy(s->dense + s->n * s->nd, dense, (size_t)s->nd * sizeof(float));
    memcpy(s->cat + s->n * s->nc, cat, (size_t)s->nc * sizeof(uint32_t));
    s->target[s->n] = target;
    s->label[s->n] = label;
    if (len) memcpy(s->hids + s->nh, hist, (size_t)len * sizeof(uint32_t));
    s->nh += len;
    s->hoff[++s->n] = s->nh;
}

/* The multi-valued columns of the sample just pushed (mv [mw], mvlen [nmv]). */
static void ctr_set_push_mv(nb_ctr_set *s, const uint32_t *mv, const int32_t *mvlen) {
    if (!s->nmv) return;
    if (s->mvcap < s->cap) {
        s->mvcap = s->cap;
        s->mv = realloc(s->mv, (size_t)s->mvcap * (size_t)s->mw * sizeof *s->mv);
        s->mvlen = realloc(s->mvlen, (size_t)s->mvcap * (size_t)s->nmv * sizeof *s->mvlen);
        NB_CHECK(s->mv && s->mvlen, "use a smaller data set", "out of memory holding %ld samples", s->cap);
    }
    memcpy(s->mv + (size_t)(s->n - 1) * s->mw, mv, (size_t)s->mw * sizeof *mv);
    memcpy(s->mvlen + (size_t)(s->n - 1) * s->nmv, mvlen, (size_t)s->nmv * sizeof *mvlen);
}

/* The source line (and id) of the sample just pushed. */
static void ctr_set_mark(nb_ctr_set *s, uint64_t line, const char *id) {
    s->line = realloc(s->line, (size_t)s->cap * sizeof *s->line);
    NB_CHECK(s->line != NULL, "use a smaller data set", "out of memory holding %ld samples", s->cap);
    s->line[s->n - 1] = line;
    if (!id) return;
    s->id = realloc(s->id, (size_t)s->cap * sizeof *s->id);
    NB_CHECK(s->id != NULL && (s->id[s->n - 1] = strdup(id)) != NULL, "use a smaller data set",
             "out of memory holding %ld samples", s->cap);
}

static void ctr_set_free(nb_ctr_set *s) {
    if (s->id)
        for (long i = 0; i < s->n; i++) free(s->id[i]);
    free(s->line), free(s->id);
    free(s->dense), free(s->label), free(s->cat), free(s->target), free(s->hoff), free(s->hids);
    free(s->mv), free(s->mvlen);
    int nd = s->nd, nc = s->nc, nmv = s->nmv, mw = s->mw;
    memset(s, 0, sizeof *s);
    s->nd = nd, s->nc = nc, s->nmv = nmv, s->mw = mw;
}


void nb_ctr_batch_alloc(nb_ctr_batch *t, int B, int L, int nd, int nc) {
    NB_ASSERT(nd >= 1 && nc >= 1);
    t->nd = nd, t->nc = nc;
    t->nmv = t->mw = 0, t->mv = NULL, t->mvlen = NULL; /* none unless nb_ctr_batch_alloc_mv */
    t->dense = nb_calloc((size_t)B * (size_t)nd, sizeof(float), "batch");
    t->label = nb_calloc((size_t)B, sizeof(float), "batch");
    t->cat = nb_calloc((size_t)B * (size_t)nc, sizeof(uint32_t), "batch");
    t->target = nb_calloc((size_t)B, sizeof(uint32_t), "batch");
    t->hist = nb_calloc((size_t)B * (L ? L : 1), sizeof(uint32_t), "batch");
    t->len = nb_calloc((size_t)B, sizeof(int32_t), "batch");
    t->b = (nb_sc_batch){.B = B, .hist_stride = L ? L : 1, .dense = t->dense, .cat = t->cat, .target = t->target,
                         .hist = t->hist, .hist_len = t->len, .label = t->label};
}

void nb_ctr_batch_free(nb_ctr_batch *t) {
    free(t->dense), free(t->label), free(t->cat), free(t->target), free(t->hist), free(t->len);
    free(t->mv), free(t->mvlen);
}

void nb_ctr_batch_alloc_mv(nb_ctr_batch *t, int B, const nb_sc_config *c) {
    t->nmv = nb_sc_nmv(c), t->mw = nb_sc_mv_width(c);
    if (!t->nmv) return;
    t->mv = nb_calloc((size_t)B * (size_t)t->mw, sizeof *t->mv, "batch");
    t->mvlen = nb_calloc((size_t)B * (size_t)t->nmv, sizeof *t->mvlen, "batch");
    t->b.mv = t->mv, t->b.mv_len = t->mvlen, t->b.mv_stride = t->mw;
}

/* Sample `from` of (mv, mvlen) rows into row `to` of t's. */
static void mv_copy(nb_ctr_batch *t, int to, const uint32_t *mv, const int32_t *mvlen) {
    if (!t->nmv) return;
    memcpy(t->mv + (size_t)to * t->mw, mv, (size_t)t->mw * sizeof *mv);
    memcpy(t->mvlen + (size_t)to * t->nmv, mvlen, (size_t)t->nmv * sizeof *mvlen);
}

/* ---- key-centric clustering (--cluster-keys) ---- */

/* The key of lookup f of sample i of w: its global row (table offset + id mod rows), as the model
 * looks it up; f < ncat: a categorical table, f = ncat: the target item, f > ncat: history item
 * f - ncat - 1. */
static uint64_t key_of(const nb_ctr_batch *w, const nb_sc_model *m, int i, int f) {
    int nc = m->cfg.ncat, t = f < nc ? f : nb_sc_item_table(&m->cfg);
    uint64_t id = f < nc ? w->cat[(size_t)i * (size_t)nc + (size_t)f]
                  : f == nc ? w->target[i]
                            : w->hist[(size_t)i * w->b.hist_stride + (size_t)(f - nc - 1)];
    uint64_t rows = (uint64_t)(m->emb_off[t + 1] - m->emb_off[t]);
    return (uint64_t)m->emb_off[t] + id % rows;
}

static int lookups_of(const nb_ctr_batch *w, int i) { return w->nc + 1 + w->len[i]; }

typedef struct {
    uint64_t key;
    int32_t cnt, i;
} sample_key;

/* hottest shared key first, then the key, then the sample: a total order (deterministic) */
static int cmp_sample_key(const void *a, const void *b) {
    const sample_key *x = a, *y = b;
    if (x->cnt != y->cnt) return x->cnt > y->cnt ? -1 : 1;
    if (x->key != y->key) return x->key < y->key ? -1 : 1;
    return (x->i > y->i) - (x->i < y->i);
}

void nb_ctr_cluster_init(nb_ctr_cluster *c, int B, int max_len, int nd, int nc) {
    memset(c, 0, sizeof *c);
    c->cap_B = B, c->cap_L = max_len;
    c->cap_n = (size_t)B * (size_t)(nc + 1 + max_len);
    c->keys = nb_malloc(c->cap_n * sizeof(int64_t), "key clustering");
    c->uniq = nb_malloc(c->cap_n * sizeof(int64_t), "key clustering");
    c->order = nb_malloc(c->cap_n * sizeof(int32_t), "key clustering");
    c->seg = nb_malloc((c->cap_n + 1) * sizeof(int32_t), "key clustering");
    c->inverse = nb_malloc(c->cap_n * sizeof(int32_t), "key clustering");
    c->first = nb_malloc(((size_t)B + 1) * sizeof(int32_t), "key clustering");
    c->sort = nb_malloc(2 * c->cap_n * sizeof(uint64_t), "key clustering");
    c->samples = nb_malloc((size_t)B * sizeof(sample_key), "key clustering");
    nb_ctr_batch_alloc(&c->tmp, B, max_len, nd, nc);
}

void nb_ctr_cluster_free(nb_ctr_cluster *c) {
    if (!c->keys) return;
    free(c->keys), free(c->uniq), free(c->order), free(c->seg), free(c->inverse), free(c->first), free(c->sort);
    free(c->samples);
    nb_ctr_batch_free(&c->tmp);
    memset(c, 0, sizeof *c);
}

void nb_ctr_cluster_keys(nb_ctr_batch *w, const nb_sc_model *m, int parts, nb_ctr_cluster *c) {
    int B = w->b.B, per_part = B / parts;
    if (parts <= 1 || B <= 1) return;
    NB_CHECK(B <= c->cap_B && w->b.hist_stride <= c->cap_L && w->nc == m->cfg.ncat && w->nc == c->tmp.nc, "this is a bug in nobubble; please report it",
             "key clustering of %d samples (history %d) with scratch for %d (%d)", B, w->b.hist_stride, c->cap_B,
             c->cap_L);
    c->first[0] = 0;
    for (int i = 0; i < B; i++) c->first[i + 1] = c->first[i] + lookups_of(w, i);
    int n = c->first[B];
#pragma omp parallel for schedule(static) if (B >= 256)
    for (int i = 0; i < B; i++)
        for (int f = 0; f < lookups_of(w, i); f++) c->keys[c->first[i] + f] = (int64_t)key_of(w, m, i, f);
    /* every key's count: the size of its group in the (parallel, deterministic) dedup */
    nb_embag_unique_groups(c->uniq, c->order, c->seg, c->inverse, c->keys, n, c->sort);
    /* each sample goes by its most shared key that still fits in one part: gathering that key's
     * samples into one part fetches it once instead of in every part it would land in (a key
     * more samples have than a part holds is fetched by several parts anyway) */
    sample_key *order = c->samples;
#pragma omp parallel for schedule(static) if (B >= 256)
    for (int i = 0; i < B; i++) {
        order[i] = (sample_key){UINT64_MAX, 0, i};
        for (int k = c->first[i]; k < c->first[i + 1]; k++) {
            int u = c->inverse[k];
            int32_t cnt = c->seg[u + 1] - c->seg[u];
            uint64_t key = (uint64_t)c->keys[k];
            if (cnt < 2 || cnt > per_part) continue;
            if (cnt > order[i].cnt || (cnt == order[i].cnt && key < order[i].key)) order[i].key = key, order[i].cnt = cnt;
        }
    }
    qsort(order, (size_t)B, sizeof *order, cmp_sample_key);
    c->tmp.b.hist_stride = w->b.hist_stride;
    for (int r = 0; r < B; r++) nb_ctr_batch_copy(&c->tmp, r, w, order[r].i);
    for (int r = 0; r < B; r++) nb_ctr_batch_copy(w, r, &c->tmp, r);
}

/* Moves sample `from` of src into row `to` of dst. */
void nb_ctr_batch_copy(nb_ctr_batch *dst, int to, const nb_ctr_batch *src, int from) {
    size_t L = (size_t)src->b.hist_stride, nd = (size_t)src->nd, nc = (size_t)src->nc;
    NB_ASSERT(dst->nd == src->nd && dst->nc == src->nc);
    memcpy(dst->dense + (size_t)to * nd, src->dense + (size_t)from * nd, nd * sizeof(float));
    memcpy(dst->cat + (size_t)to * nc, src->cat + (size_t)from * nc, nc * sizeof(uint32_t));
    memcpy(dst->hist + (size_t)to * L, src->hist + (size_t)from * L, (size_t)src->len[from] * sizeof(uint32_t));
    dst->target[to] = src->target[from], dst->len[to] = src->len[from], dst->label[to] = src->label[from];
    NB_ASSERT(dst->nmv == src->nmv && dst->mw == src->mw);
    if (src->nmv) mv_copy(dst, to, src->mv + (size_t)from * src->mw, src->mvlen + (size_t)from * src->nmv);
}

/* the words of a packed sample before its history: index, length, label, target, dense, cat,
 * then the multi-valued columns' counts and values (padded) */
static size_t pack_head(const nb_ctr_batch *t) { return 4 + (size_t)t->nd + (size_t)t->nc + (size_t)t->nmv + (size_t)t->mw; }

size_t nb_ctr_packed_words(const nb_ctr_batch *t, int32_t len) { return pack_head(t) + (size_t)len; }

size_t nb_ctr_pack(const nb_ctr_batch *t, int i, uint32_t index, uint32_t *out) {
    size_t L = (size_t)t->b.hist_stride, nd = (size_t)t->nd, nc = (size_t)t->nc;
    out[0] = index, out[3] = t->target[i];
    memcpy(out + 1, &t->len[i], 4), memcpy(out + 2, &t->label[i], 4);
    memcpy(out + 4, t->dense + (size_t)i * nd, nd * 4);
    memcpy(out + 4 + nd, t->cat + (size_t)i * nc, nc * 4);
    if (t->nmv) {
        memcpy(out + 4 + nd + nc, t->mvlen + (size_t)i * t->nmv, (size_t)t->nmv * 4);
        memcpy(out + 4 + nd + nc + t->nmv, t->mv + (size_t)i * t->mw, (size_t)t->mw * 4);
    }
    memcpy(out + pack_head(t), t->hist + (size_t)i * L, (size_t)t->len[i] * 4);
    return nb_ctr_packed_words(t, t->len[i]);
}

size_t nb_ctr_unpack(nb_ctr_batch *t, int j, const uint32_t *in, size_t words, uint32_t *index) {
    size_t L = (size_t)t->b.hist_stride, nd = (size_t)t->nd, nc = (size_t)t->nc, head = pack_head(t);
    int32_t len;
    NB_CHECK(words >= head, "this is a bug in nobubble; please report it", "a packed sample of %zu words", words);
    memcpy(&len, in + 1, 4);
    NB_CHECK(len >= 0 && (size_t)len <= L && head + (size_t)len <= words, "this is a bug in nobubble; please report it",
             "a packed sample with a history of %d items (%zu words left, max_len %zu)", len, words, L);
    *index = in[0], t->target[j] = in[3], t->len[j] = len;
    memcpy(&t->label[j], in + 2, 4);
    memcpy(t->dense + (size_t)j * nd, in + 4, nd * 4);
    memcpy(t->cat + (size_t)j * nc, in + 4 + nd, nc * 4);
    mv_copy(t, j, in + 4 + nd + nc + t->nmv, (const int32_t *)(in + 4 + nd + nc));
    memcpy(t->hist + (size_t)j * L, in + head, (size_t)len * 4);
    return head + (size_t)len;
}


/* Sample i of a set into batch row r (the most recent max_len history items). */
static void ctr_set_get(const nb_ctr_set *s, long i, nb_ctr_batch *t, int r, int max_len) {
    NB_ASSERT(t->nd == s->nd && t->nc == s->nc);
    memcpy(t->dense + (size_t)r * (size_t)t->nd, s->dense + i * s->nd, (size_t)s->nd * sizeof(float));
    memcpy(t->cat + (size_t)r * (size_t)t->nc, s->cat + i * s->nc, (size_t)s->nc * sizeof(uint32_t));
    t->target[r] = s->target[i];
    t->label[r] = s->label[i];
    NB_ASSERT(t->nmv == s->nmv && t->mw == s->mw);
    if (s->nmv) mv_copy(t, r, s->mv + (size_t)i * s->mw, s->mvlen + (size_t)i * s->nmv);
    long a = s->hoff[i], len = s->hoff[i + 1] - a;
    if (len > max_len) a += len - max_len, len = max_len;
    t->len[r] = (int32_t)len;
    if (len) memcpy(t->hist + (size_t)r * t->b.hist_stride, s->hids + a, (size_t)len * sizeof(uint32_t));
}

/* ---- data sources ---- */


static uint64_t splitmix(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static void shuffle(nb_ctr_source *s) {
    uint64_t st = 0x5EED + s->epoch++;
    for (long i = 0; i < s->train.n; i++) s->perm[i] = i;
    for (long i = s->train.n - 1; i > 0; i--) {
        long j = (long)(splitmix(&st) % (uint64_t)(i + 1));
        long t = s->perm[i];
        s->perm[i] = s->perm[j];
        s->perm[j] = t;
    }
    s->pos = 0;
}

static int criteo_next(nb_ctr_source *s, nb_ctr_sample *x) {
    s->consumed++;
    if (nb_criteo_next(s->cr, x)) return 1;
    nb_criteo_rewind(s->cr);
    for (long k = 0; k < s->skip; k++) NB_CHECK(nb_criteo_next(s->cr, x), "use a larger file", "file shrank");
    return nb_criteo_next(s->cr, x);
}

static void push_criteo(nb_ctr_set *set, const nb_ctr_sample *x) {
    ctr_set_push(set, x->dense, x->cat, 0, NULL, 0, (float)x->label);
}

/* Sample i of an MLPerf set into row r of t (no target, no history). */
static void mlperf_row(const nb_mlperf_set *m, int64_t i, nb_ctr_batch *t, int r) {
    NB_ASSERT(t->mw == m->width && t->nmv == NB_MLPERF_NCAT);
    nb_mlperf_get(m, i, t->dense + (size_t)r * NB_MLPERF_NDENSE, t->cat + (size_t)r * NB_MLPERF_NCAT, t->mv + (size_t)r * t->mw,
                  t->mvlen + (size_t)r * t->nmv, t->label + r);
    t->target[r] = 0;
    t->len[r] = 0;
}

/* Synthetic samples first .. first + B - 1 into t's first rows (multi-hot: no target, no history). */
static void synth_fill(nb_ctr_source *s, nb_ctr_batch *t, uint64_t first, int B) {
    if (!s->g->o.multi_hot) {
        nb_synth_fill(s->g, first, B, t->dense, t->cat, t->target, t->hist, t->len, t->label, NULL);
        return;
    }
    NB_CHECK(t->mw == NB_SYNTH_MH_WIDTH && t->nmv == NB_SYNTH_NCAT, "this is a bug in nobubble; please report it",
             "multi-hot synthetic samples into a batch of %d multi-valued columns (%d values)", t->nmv, t->mw);
    nb_synth_fill_multi_hot(s->g, first, B, t->dense, t->cat, t->mv, t->mvlen, t->label);
    memset(t->target, 0, (size_t)B * sizeof *t->target);
    memset(t->len, 0, (size_t)B * sizeof *t->len);
}

void nb_ctr_fill_train(nb_ctr_source *s, nb_ctr_batch *t, int B) { nb_ctr_fill_train_slice(s, t, B, 0, B); }

void nb_ctr_fill_train_slice(nb_ctr_source *s, nb_ctr_batch *t, int Bg, int first, int B) {
    NB_ASSERT(first >= 0 && B >= 1 && first + B <= Bg);
    t->b.B = B;
    NB_ASSERT(t->nd == s->ndense && t->nc == s->ncat);
    if (s->kind == NB_CTR_SYNTH) { /* any sample by its index: only the slice is made */
        synth_fill(s, t, s->next + (uint64_t)first, B);
        s->next += (uint64_t)Bg;
    } else if (s->kind == NB_CTR_MLPERF) { /* by index, like synth: only the slice is read */
        int64_t n = nb_mlperf_rows(&s->mp[0]);
        /* rows are independent copies out of the mapped day files: at B 55,296 (50 MB a batch) one
         * thread spent 23 ms a step on them, more than the device's step */
#pragma omp parallel for schedule(static) if (B >= 64)
        for (int r = 0; r < B; r++) mlperf_row(&s->mp[0], (int64_t)((s->next + (uint64_t)first + (uint64_t)r) % (uint64_t)n), t, r);
        s->next += (uint64_t)Bg;
    } else if (s->kind == NB_CTR_CRITEO) { /* a stream: every rank reads through the whole batch */
        nb_ctr_sample x;
        for (int i = 0; i < Bg; i++) {
            NB_CHECK(criteo_next(s, &x), "use a file with more samples than --eval-samples",
                     "no training samples after the %ld held-out ones", s->skip);
            int r = i - first;
            if (r < 0 || r >= B) continue;
            memcpy(t->dense + (size_t)r * (size_t)t->nd, x.dense, sizeof x.dense); /* nd, nc: Criteo's (open) */
            memcpy(t->cat + (size_t)r * (size_t)t->nc, x.cat, sizeof x.cat);
            t->target[r] = 0;
            t->len[r] = 0;
            t->label[r] = (float)x.label;
        }
    } else {
        for (int i = 0; i < Bg; i++) {
            if (s->pos == s->train.n) shuffle(s);
            long at = s->perm[s->pos++];
            if (i >= first && i < first + B) ctr_set_get(&s->train, at, t, i - first, s->max_len);
        }
    }
}

/* Evaluation samples first .. first + B - 1. */
void nb_ctr_fill_eval(nb_ctr_source *s, nb_ctr_batch *t, long first, int B) {
    t->b.B = B;
    NB_ASSERT(t->nd == s->ndense && t->nc == s->ncat);
    if (s->kind == NB_CTR_SYNTH) {
        synth_fill(s, t, NB_CTR_EVAL_BASE + (uint64_t)first, B);
    } else if (s->kind == NB_CTR_MLPERF) {
        for (int r = 0; r < B; r++) mlperf_row(&s->mp[1], first + r, t, r);
    } else {
        for (int r = 0; r < B; r++) ctr_set_get(&s->eval, first + r, t, r, s->max_len);
    }
}

long nb_ctr_eval_count(const nb_ctr_source *s) {
    if (s->kind == NB_CTR_MLPERF) {
        int64_t n = nb_mlperf_rows(&s->mp[1]);
        return n < s->eval_samples ? (long)n : s->eval_samples;
    }
    return s->kind == NB_CTR_SYNTH ? s->eval_samples : s->eval.n;
}

uint64_t nb_ctr_eval_line(const nb_ctr_source *s, long i) { return s->eval.line ? s->eval.line[i] : 0; }
const char *nb_ctr_eval_id(const nb_ctr_source *s, long i) { return s->eval.id ? s->eval.id[i] : NULL; }

/* ---- MovieLens click files ---- */

static const char *ML_HEADER = "label\tuser\titem\tyear\tgenre\thour\tweekday\ttimestamp\thistory";
static const char *ML_HINT = "regenerate the files with 'bash scripts/fetch_movielens.sh'";

/* The largest id a MovieLens field may hold: a table of that many rows (+1) must still be an
 * int32 count (MovieLens' own ids are below 300,000). */
#define ML_MAX_ID ((1ul << 31) - 2)

static uint32_t ml_num(const char *path, long line, char **p, char end) {
    errno = 0;
    char *e;
    unsigned long v = strtoul(*p, &e, 10);
    NB_CHECK(e != *p && errno == 0 && **p != '-' && (*e == end || (end == ' ' && (*e == '\t' || !*e))), ML_HINT,
             "%s:%ld: malformed field near '%.20s'", path, line, *p);
    NB_CHECK(v <= ML_MAX_ID, ML_HINT, "%s:%ld: id %lu is out of range (at most %lu)", path, line, v, ML_MAX_ID);
    *p = e;
    return (uint32_t)v;
}

/* Reads one clicks_*.tsv; tracks the largest id of each of the 6 used tables (5 = items). */
static void ml_read(const char *path, nb_ctr_set *set, uint32_t maxid[6]) {
    FILE *f = nb_fopen(path, "r", ML_HINT);
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    long ln = 0;
    uint32_t *hist = NULL;
    size_t hcap = 0;
    while ((len = getline(&line, &cap, f)) > 0) {
        ln++;
        if (line[len - 1] == '\n') line[--len] = 0;
        if (ln == 1) {
            NB_CHECK(!strcmp(line, ML_HEADER), ML_HINT, "%s: unexpected header (is it a clicks_*.tsv file?)", path);
            continue;
        }
        char *p = line;
        uint32_t v[8];
        for (int k = 0; k < 8; k++) {
            v[k] = ml_num(path, ln, &p, '\t');
            p++;
        }
        NB_CHECK(v[0] <= 1 && v[5] < 24 && v[6] < 7, ML_HINT, "%s:%ld: label/hour/weekday out of range", path, ln);
        size_t nh = 0;
        while (*p) {
            if (nh == hcap) {
                hcap = hcap ? 2 * hcap : 256;
                hist = realloc(hist, hcap * sizeof *hist);
                NB_CHECK(hist != NULL, "free some memory", "out of memory reading %s", path);
            }
            hist[nh] = ml_num(path, ln, &p, ' ');
            if (hist[nh] > maxid[1]) maxid[1] = hist[nh];
            nh++;
            if (*p == ' ') p++;
        }
        uint32_t cat[NB_SC_STD_NCAT] = {0};
        cat[0] = v[1], cat[1] = v[2], cat[2] = v[3], cat[3] = v[4], cat[4] = v[5], cat[5] = v[6];
        for (int k = 0; k < 6; k++)
            if (cat[k] > maxid[k]) maxid[k] = cat[k];
        static const float zero_dense[NB_SC_STD_NDENSE];
        ctr_set_push(set, zero_dense, cat, v[2], hist, (int)nh, (float)v[0]);
    }
    NB_CHECK(!ferror(f), ML_HINT, "cannot read %s", path);
    NB_CHECK(set->n > 0, ML_HINT, "%s holds no samples", path);
    free(line);
    free(hist);
    fclose(f);
}

static int64_t cap_rows(int64_t rows, int64_t cap) { return rows < cap ? rows : cap; }

/* movielens[:DIR]: DIR, or data/movielens wherever data/ paths are found (core/datapath.h: the
 * working directory, $NB_DATA_DIR, the data/ folder of the binary's repository or installation) */
static void ml_dir(const char *spec, char *dir, size_t cap) {
    if (spec[9] == ':') {
        snprintf(dir, cap, "%s", spec + 10);
        return;
    }
    char file[NB_PATH_MAX], looked[NB_DATA_PLACES * (2 * NB_PATH_MAX + 40)];
    if (!nb_data_path("data/movielens/clicks_train.tsv", file, sizeof file, looked, sizeof looked))
        nb_fail("run 'bash scripts/fetch_movielens.sh', or pass --data movielens:DIR (the folder of clicks_train.tsv)",
                "no MovieLens files: looked for %s", looked);
    snprintf(dir, cap, "%s", dirname(file));
}

/* The evaluation set: every good sample of Criteo file(s) */
static void criteo_set(const char *spec, int strict, nb_ctr_set *set) {
    nb_criteo_reader *r = nb_criteo_open(spec, NB_CRITEO_KAGGLE, strict);
    nb_ctr_sample x;
    uint64_t line;
    while (nb_criteo_next(r, &x)) {
        push_criteo(set, &x);
        nb_criteo_where(r, &line);
        ctr_set_mark(set, line, NULL);
    }
    nb_criteo_close(r);
}

/* A CSV file's rows: the first head_n into head, the rest into rest (NULL: all into head) */
static void table_sets(const char *path, const nb_ctr_schema *sc, int need_label, nb_ctr_set *head, long head_n,
                       nb_ctr_set *rest) {
    nb_ctr_table *t = nb_ctr_table_open(path, sc, need_label);
    nb_ctr_row row;
    while (nb_ctr_table_next(t, &row)) {
        nb_ctr_set *to = rest && head->n >= head_n ? rest : head;
        ctr_set_push(to, row.dense, row.cat, row.target, row.hist, row.len, row.label);
        ctr_set_push_mv(to, row.mv, row.mv_len);
        ctr_set_mark(to, row.line, row.id);
    }
    nb_ctr_table_close(t);
    NB_CHECK(head->n > 0 || (rest && rest->n > 0), "check the file: it has a header and no row", "%s holds no rows", path);
}

/* --val-data for a source of kind prefix ("criteo:"): the path without the prefix; another
 * kind's prefix is refused */
static const char *val_path(const char *val, const char *prefix) {
    size_t n = strlen(prefix);
    if (!strncmp(val, prefix, n)) return val + n;
    static const char *kinds[] = {"synth", "criteo:", "csv:", "movielens"};
    for (int k = 0; k < 4; k++)
        NB_CHECK(strncmp(val, kinds[k], strlen(kinds[k])) != 0, "pass --val-data as a file of the --data kind",
                 "--val-data '%s' is another kind of source than --data %s...", val, prefix);
    return val;
}

static void open_criteo(nb_ctr_source *s, const nb_ctr_source_opts *o, const char *val) {
    const char *d = o->data + 7;
    if (val) criteo_set(val_path(val, "criteo:"), o->strict, &s->eval);
    if (val && o->eval_only) return; /* nothing trains: the training files are not read */
    s->cr = nb_criteo_open(d, NB_CRITEO_KAGGLE, o->strict);
    if (!val) {
        nb_ctr_sample x;
        while (s->eval.n < o->eval_samples && nb_criteo_next(s->cr, &x)) push_criteo(&s->eval, &x);
        NB_CHECK(s->eval.n == o->eval_samples, "lower --eval-samples (the held-out head of the file), or pass --val-data FILE",
                 "%s has only %ld good samples; %d are held out for evaluation", d, s->eval.n, o->eval_samples);
        s->skip = s->eval.n;
    }
}

static void open_table(nb_ctr_source *s, const nb_ctr_source_opts *o, const char *val) {
    const nb_ctr_schema *sc = s->schema;
    if (val) table_sets(val_path(val, "csv:"), sc, !o->unlabeled, &s->eval, 0, NULL);
    if (!val || !o->eval_only) {
        table_sets(o->data + 4, sc, 1, val ? &s->train : &s->eval, val ? 0 : o->eval_samples, val ? NULL : &s->train);
        NB_CHECK(val || s->train.n > 0, "lower --eval-samples (the held-out head of the file), or pass --val-data FILE",
                 "%s has only %ld rows; %d are held out for evaluation", o->data + 4, s->eval.n, o->eval_samples);
        s->perm = nb_malloc((size_t)s->train.n * sizeof(long), "the training order");
        shuffle(s);
    }
}

/* The multi-valued columns: a new model takes the schema's, a checkpoint's model must have the
 * same (its rows were trained as sums or means of those columns). */
static void shape_pooling(const nb_ctr_schema *sc, nb_sc_config *mc, int fresh) {
    nb_sc_config want = *mc;
    for (int f = 0; f < NB_SC_MAX_CAT; f++) want.pool[f] = NB_SC_POOL_NONE, want.mv_max[f] = 0;
    for (int i = 0; i < sc->ncols; i++)
        if (sc->col[i].role == NB_COL_CAT && sc->col[i].pool != NB_SC_POOL_NONE)
            want.pool[sc->col[i].slot] = (unsigned char)sc->col[i].pool, want.mv_max[sc->col[i].slot] = sc->col[i].max_values;
    char a[16 * NB_SC_MAX_CAT], b[16 * NB_SC_MAX_CAT];
    nb_sc_mv_string(&want, a, sizeof a);
    nb_sc_mv_string(mc, b, sizeof b);
    NB_CHECK(fresh || !strcmp(a, b), "evaluate or resume with the schema the checkpoint was trained on",
             "%s's multi-valued columns (column:pooling:max_values) are '%s'; the checkpoint's model has '%s'", sc->src, a, b);
    memcpy(mc->pool, want.pool, sizeof mc->pool);
    memcpy(mc->mv_max, want.mv_max, sizeof mc->mv_max);
}

/* The model's shape from the data's columns: the dense and categorical counts as the schema
 * has them (at least 1 each: no column reads as one slot of 0) when mc has none yet (a new
 * model), else a checkpoint's model's, which the data must match (pad: or fit, the rest reading
 * 0: a csv checkpoint from before the shape was kept has 13 and 26); every table's rows. */
static void shape_from_schema(const nb_ctr_schema *sc, nb_sc_config *mc, int pad) {
    int fresh = !mc->ncat;
    int nd = sc->ndense ? sc->ndense : 1, nc = sc->ncat ? sc->ncat : 1;
    if (!mc->ndense) mc->ndense = nd;
    if (!mc->ncat) mc->ncat = nc;
    NB_CHECK(pad ? nd <= mc->ndense && nc <= mc->ncat : nd == mc->ndense && nc == mc->ncat,
             "evaluate or resume with the data (and --schema) the checkpoint was trained on",
             "%s has %d dense and %d categorical columns; the checkpoint's model reads %d and %d", sc->src, sc->ndense,
             sc->ncat, mc->ndense, mc->ncat);
    NB_CHECK(mc->ndense <= NB_SC_MAX_DENSE && mc->ncat <= NB_SC_MAX_CAT, "the checkpoint is damaged: resume from an earlier copy of the run directory",
             "a model of %d dense and %d categorical columns (at most %d and %d)", mc->ndense, mc->ncat, NB_SC_MAX_DENSE,
             NB_SC_MAX_CAT);
    for (int f = 0; f < mc->ncat; f++) mc->cat_rows[f] = 1;
    for (int i = 0; i < sc->ncols; i++)
        if (sc->col[i].role == NB_COL_CAT) mc->cat_rows[sc->col[i].slot] = sc->col[i].rows;
    mc->item_rows = sc->has_seq ? sc->item_rows : 1;
    shape_pooling(sc, mc, fresh);
}

/* MLPerf's days: 13 dense, 26 summed columns of the files' sizes, MLPerf's rows capped; a
 * checkpoint's model must have read the same columns. */
static void shape_mlperf(const nb_mlperf_set *m, nb_sc_config *mc, int64_t cap) {
    int fresh = !mc->ncat;
    nb_sc_config want = *mc;
    for (int f = 0; f < NB_SC_MAX_CAT; f++) want.pool[f] = NB_SC_POOL_NONE, want.mv_max[f] = 0;
    for (int f = 0; f < NB_MLPERF_NCAT; f++) want.pool[f] = NB_SC_POOL_SUM, want.mv_max[f] = m->hot[f];
    char a[16 * NB_SC_MAX_CAT], b[16 * NB_SC_MAX_CAT];
    nb_sc_mv_string(&want, a, sizeof a);
    nb_sc_mv_string(mc, b, sizeof b);
    NB_CHECK(fresh || (mc->ndense == NB_MLPERF_NDENSE && mc->ncat == NB_MLPERF_NCAT && !strcmp(a, b)),
             "evaluate or resume with the data the checkpoint was trained on",
             "the MLPerf days have 13 dense and 26 multi-hot columns (%s); the checkpoint's model reads %d and %d (%s)", a,
             mc->ndense, mc->ncat, b);
    mc->ndense = NB_MLPERF_NDENSE, mc->ncat = NB_MLPERF_NCAT;
    memcpy(mc->pool, want.pool, sizeof mc->pool);
    memcpy(mc->mv_max, want.mv_max, sizeof mc->mv_max);
    for (int f = 0; f < NB_MLPERF_NCAT; f++) mc->cat_rows[f] = cap_rows(nb_synth_mlperf_rows[f], cap);
    mc->item_rows = 1;
}

/* The samples' shape: the model's, in the source, its sets and batches. */
static void set_shape(nb_ctr_source *s, const nb_sc_config *mc) {
    s->ndense = s->train.nd = s->eval.nd = mc->ndense;
    s->ncat = s->train.nc = s->eval.nc = mc->ncat;
    s->nmv = s->train.nmv = s->eval.nmv = nb_sc_nmv(mc);
    s->mw = s->train.mw = s->eval.mw = nb_sc_mv_width(mc);
}

/* Opens --data and sets the table sizes (and for synth the history cap) of the model config. */
void nb_ctr_source_open(nb_ctr_source *s, const nb_ctr_source_opts *o, nb_sc_config *mc) {
    memset(s, 0, sizeof *s);
    const char *d = o->data;
    const char *val = o->val_data && o->val_data[0] && strcmp(o->val_data, "none") ? o->val_data : NULL;
    s->eval_samples = o->eval_samples;
    s->eval_only = o->eval_only;
    if (!strcmp(d, "synth") || !strncmp(d, "synth:", 6)) {
        NB_CHECK(!val, "drop --val-data: synthetic data evaluates on its own held-out range (--eval-samples)",
                 "--val-data with --data synth");
        s->kind = NB_CTR_SYNTH;
        char spec[NB_PATH_MAX + 64];
        if (strstr(d, "max_len="))
            snprintf(spec, sizeof spec, "%s", d);
        else
            snprintf(spec, sizeof spec, "%s%smax_len=%d", d, strchr(d, ':') ? "," : ":", mc->max_len);
        /* the DLRM form: MLPerf's multi-hot columns, and one item (no target to learn) */
        if (nb_sc_dlrm(mc) && !strstr(d, "multi_hot=")) snprintf(spec + strlen(spec), sizeof spec - strlen(spec), ",multi_hot=1");
        if (nb_sc_dlrm(mc) && !strstr(d, "items=")) snprintf(spec + strlen(spec), sizeof spec - strlen(spec), ",items=1");
        if (nb_sc_dlrm(mc) && !strstr(d, "cap=")) /* --table-cap caps the ids too: MLPerf's rows by default */
            snprintf(spec + strlen(spec), sizeof spec - strlen(spec), ",cap=%lld",
                     (long long)(o->table_cap < 4294967295LL ? o->table_cap : 4294967295LL));
        s->g = nb_malloc(sizeof *s->g, "synthetic generator");
        nb_synth_opts so;
        nb_synth_parse(&so, spec);
        if (o->shape_only) so.calib = 1000; /* a plan draws no sample: its label bias does not matter */
        nb_synth_init(s->g, &so);
        mc->max_len = s->g->o.max_len;
        s->schema = nb_malloc(sizeof *s->schema, "the schema");
        nb_ctr_schema_synth(s->schema, s->g, o->table_cap); /* the columns nb_synth_fill fills */
        shape_from_schema(s->schema, mc, 0);
        set_shape(s, mc);
    } else if (!strncmp(d, "mlperf:", 7)) {
        NB_CHECK(!val, "drop --val-data: MLPerf's data evaluate on day 23's first half", "--val-data with --data mlperf");
        s->kind = NB_CTR_MLPERF;
        s->mp = nb_calloc(2, sizeof *s->mp, "the MLPerf days");
        if (!o->eval_only) nb_mlperf_open(&s->mp[0], d + 7, 0);
        nb_mlperf_open(&s->mp[1], d + 7, 1);
        shape_mlperf(&s->mp[1], mc, o->table_cap);
        set_shape(s, mc);
    } else if (!strncmp(d, "criteo:", 7)) {
        s->kind = NB_CTR_CRITEO;
        s->schema = nb_malloc(sizeof *s->schema, "the schema");
        nb_ctr_schema_load(s->schema, "criteo", o->table_cap); /* Criteo's columns, its tables' rows */
        shape_from_schema(s->schema, mc, 0);
        set_shape(s, mc);
        open_criteo(s, o, val);
    } else if (!strncmp(d, "csv:", 4)) {
        s->kind = NB_CTR_TABLE;
        s->schema = nb_malloc(sizeof *s->schema, "the schema");
        nb_ctr_schema_load(s->schema, o->schema ? o->schema : "", o->table_cap);
        shape_from_schema(s->schema, mc, 1);
        set_shape(s, mc);
        open_table(s, o, val);
    } else if (!strcmp(d, "movielens") || !strncmp(d, "movielens:", 10)) {
        NB_CHECK(!val, "drop --val-data: MovieLens evaluates on clicks_test.tsv", "--val-data with --data movielens");
        s->kind = NB_CTR_MOVIELENS;
        uint32_t maxid[6] = {0};
        char dir[NB_PATH_MAX], path[NB_PATH_MAX + 32];
        NB_CHECK((!mc->ndense || mc->ndense == NB_SC_STD_NDENSE) && (!mc->ncat || mc->ncat == NB_SC_STD_NCAT),
                 "evaluate or resume with the data the checkpoint was trained on",
                 "MovieLens has the model's standard %d dense and %d categorical slots; the checkpoint's model reads %d and %d",
                 NB_SC_STD_NDENSE, NB_SC_STD_NCAT, mc->ndense, mc->ncat);
        NB_CHECK(!nb_sc_nmv(mc), "evaluate or resume with the data the checkpoint was trained on",
                 "MovieLens has no multi-valued columns; the checkpoint's model has some");
        mc->ndense = NB_SC_STD_NDENSE, mc->ncat = NB_SC_STD_NCAT; /* the 26-table shape, 6 tables used */
        set_shape(s, mc);
        ml_dir(d, dir, sizeof dir);
        snprintf(path, sizeof path, "%s/clicks_train.tsv", dir);
        ml_read(path, &s->train, maxid);
        snprintf(path, sizeof path, "%s/clicks_test.tsv", dir);
        ml_read(path, &s->eval, maxid);
        for (int f = 0; f < mc->ncat; f++) mc->cat_rows[f] = f < 6 ? cap_rows((int64_t)maxid[f] + 1, o->table_cap) : 1;
        mc->item_rows = mc->cat_rows[1];
        s->perm = nb_malloc((size_t)s->train.n * sizeof(long), "MovieLens order");
        shuffle(s);
    } else {
        nb_fail("pass --data synth[:k=v,...], criteo:PATH[,PATH...], csv:PATH (with --schema), movielens[:DIR] or mlperf:DIR",
                "unknown --data '%s'", d);
    }
    s->max_len = mc->max_len;
}

void nb_ctr_source_close(nb_ctr_source *s) {
    if (s->mp) nb_mlperf_close(&s->mp[0]), nb_mlperf_close(&s->mp[1]);
    free(s->mp);
    if (s->cr) nb_criteo_close(s->cr);
    if (s->schema) nb_ctr_schema_free(s->schema);
    free(s->schema);
    free(s->g);
    free(s->perm);
    ctr_set_free(&s->train);
    ctr_set_free(&s->eval);
}


uint64_t nb_ctr_source_position(const nb_ctr_source *s) {
    switch (s->kind) {
    case NB_CTR_SYNTH:
    case NB_CTR_MLPERF: return s->next;
    case NB_CTR_CRITEO: return s->consumed;
    default: return (s->epoch - 1) * (uint64_t)s->train.n + (uint64_t)s->pos;
    }
}

void nb_ctr_source_seek(nb_ctr_source *s, uint64_t pos) {
    if (s->eval_only && !s->cr && !s->train.n && s->kind != NB_CTR_SYNTH) return; /* no training data read */
    if (s->kind == NB_CTR_SYNTH || s->kind == NB_CTR_MLPERF) {
        s->next = pos;
    } else if (s->kind == NB_CTR_CRITEO) {
        /* a text file has no index: read through to the position (rewinding as training does) */
        nb_ctr_sample x;
        for (uint64_t i = 0; i < pos; i++)
            NB_CHECK(criteo_next(s, &x), "resume with the file the run was trained on",
                     "the Criteo file has no training samples to skip to position %llu", (unsigned long long)pos);
    } else {
        uint64_t n = (uint64_t)s->train.n;
        s->epoch = pos / n;
        shuffle(s); /* the order of that epoch (its seed), and the epoch after it next */
        s->pos = (long)(pos % n);
    }
}

void nb_ctr_popularity_scores(const nb_ctr_source *s, float *score) {
    int64_t rows = 0;
    for (long i = 0; i < s->train.n; i++) rows = s->train.target[i] >= rows ? (int64_t)s->train.target[i] + 1 : rows;
    double *pos = nb_calloc((size_t)rows + 1, sizeof(double), "popularity"), *cnt = nb_calloc((size_t)rows + 1, sizeof(double), "popularity");
    double p0 = 0;
    for (long i = 0; i < s->train.n; i++) {
        pos[s->train.target[i]] += s->train.label[i];
        cnt[s->train.target[i]] += 1;
        p0 += s->train.label[i];
    }
    p0 /= (double)s->train.n;
    for (long i = 0; i < s->eval.n; i++) {
        uint32_t t = s->eval.target[i];
        double ps = t < rows ? pos[t] : 0, c = t < rows ? cnt[t] : 0;
        score[i] = (float)((ps + POP_SMOOTH * p0) / (c + POP_SMOOTH));
    }
    free(pos), free(cnt);
}
