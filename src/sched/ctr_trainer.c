/* seqctr training loop, data sources and evaluation (see ctr_trainer.h). */
#include "sched/ctr_trainer.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core.h"
#include "data/criteo.h"
#include "data/synth.h"
#include "host.h"
#include "io/json.h"
#include "lanes/lanes.h"
#include "sched/step_stats.h"
#include "sched/timeline.h"
#include "optim/optim.h"
#include "optim/optim_sparse.h"

#define EVAL_BASE (1ULL << 40) /* synth: first held-out sample index */
#define POP_SMOOTH 10.0        /* popularity baseline: prior strength, in pseudo-ratings */

void nb_ctr_opts_defaults(nb_ctr_opts *o) {
    memset(o, 0, sizeof *o);
    nb_sc_config_default(&o->model);
    o->model.E = 32;
    o->model.max_len = 32;
    snprintf(o->data, sizeof o->data, "synth");
    snprintf(o->emb_optim, sizeof o->emb_optim, "adagrad");
    snprintf(o->device, sizeof o->device, "cpu");
    snprintf(o->schedule, sizeof o->schedule, "plain");
    snprintf(o->erase_dispatch, sizeof o->erase_dispatch, "blocking");
    o->side_lanes = 4;
    o->steps = 300;
    o->batch = 256;
    o->eval_samples = 16384;
    o->log_every = 50;
    o->lr = 1e-3f;
    o->emb_lr = 0.05f;
    o->table_cap = 100000;
}

/* ---- metrics ---- */

typedef struct {
    float s;
    long i;
} scored;

static int cmp_scored(const void *a, const void *b) {
    const scored *x = a, *y = b;
    if (x->s != y->s) return x->s < y->s ? -1 : 1;
    return (x->i > y->i) - (x->i < y->i);
}

double nb_ctr_auc(const float *score, const float *label, long n) {
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

double nb_ctr_ne(double mean_bce, double p) {
    if (p <= 0 || p >= 1) return NAN;
    return mean_bce / -(p * log(p) + (1 - p) * log1p(-p));
}

/* ---- in-memory sample sets (MovieLens, Criteo's held-out head) ---- */

typedef struct {
    long n, cap;
    float *dense, *label;
    uint32_t *cat, *target;
    long *hoff; /* [n + 1] into hids */
    uint32_t *hids;
    long nh, hcap;
} ctr_set;

static void set_push(ctr_set *s, const float *dense, const uint32_t *cat, uint32_t target, const uint32_t *hist,
                     int len, float label) {
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 1024;
        s->dense = realloc(s->dense, (size_t)s->cap * NB_SC_NDENSE * sizeof(float));
        s->label = realloc(s->label, (size_t)s->cap * sizeof(float));
        s->cat = realloc(s->cat, (size_t)s->cap * NB_SC_NCAT * sizeof(uint32_t));
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
    memcpy(s->dense + s->n * NB_SC_NDENSE, dense, NB_SC_NDENSE * sizeof(float));
    memcpy(s->cat + s->n * NB_SC_NCAT, cat, NB_SC_NCAT * sizeof(uint32_t));
    s->target[s->n] = target;
    s->label[s->n] = label;
    if (len) memcpy(s->hids + s->nh, hist, (size_t)len * sizeof(uint32_t));
    s->nh += len;
    s->hoff[++s->n] = s->nh;
}

static void set_free(ctr_set *s) {
    free(s->dense), free(s->label), free(s->cat), free(s->target), free(s->hoff), free(s->hids);
    memset(s, 0, sizeof *s);
}

/* The batch the model reads: host buffers of the largest batch. */
typedef struct {
    float *dense, *label;
    uint32_t *cat, *target, *hist;
    int32_t *len;
    nb_sc_batch b;
} ctr_batch;

static void batch_alloc(ctr_batch *t, int B, int L) {
    t->dense = nb_calloc((size_t)B * NB_SC_NDENSE, sizeof(float), "batch");
    t->label = nb_calloc((size_t)B, sizeof(float), "batch");
    t->cat = nb_calloc((size_t)B * NB_SC_NCAT, sizeof(uint32_t), "batch");
    t->target = nb_calloc((size_t)B, sizeof(uint32_t), "batch");
    t->hist = nb_calloc((size_t)B * (L ? L : 1), sizeof(uint32_t), "batch");
    t->len = nb_calloc((size_t)B, sizeof(int32_t), "batch");
    t->b = (nb_sc_batch){.B = B, .hist_stride = L ? L : 1, .dense = t->dense, .cat = t->cat, .target = t->target,
                         .hist = t->hist, .hist_len = t->len, .label = t->label};
}

static void batch_free(ctr_batch *t) {
    free(t->dense), free(t->label), free(t->cat), free(t->target), free(t->hist), free(t->len);
}

/* Sample i of a set into batch row r (the most recent max_len history items). */
static void set_get(const ctr_set *s, long i, ctr_batch *t, int r, int max_len) {
    memcpy(t->dense + (size_t)r * NB_SC_NDENSE, s->dense + i * NB_SC_NDENSE, NB_SC_NDENSE * sizeof(float));
    memcpy(t->cat + (size_t)r * NB_SC_NCAT, s->cat + i * NB_SC_NCAT, NB_SC_NCAT * sizeof(uint32_t));
    t->target[r] = s->target[i];
    t->label[r] = s->label[i];
    long a = s->hoff[i], len = s->hoff[i + 1] - a;
    if (len > max_len) a += len - max_len, len = max_len;
    t->len[r] = (int32_t)len;
    if (len) memcpy(t->hist + (size_t)r * t->b.hist_stride, s->hids + a, (size_t)len * sizeof(uint32_t));
}

/* ---- data sources ---- */

enum { SRC_SYNTH, SRC_CRITEO, SRC_MOVIELENS };

typedef struct {
    int kind, max_len;
    nb_synth *g;
    uint64_t next;
    nb_criteo_reader *cr;
    long skip; /* criteo: held-out samples at the head of every pass */
    ctr_set train, eval;
    long *perm, pos;
    uint64_t epoch;
} ctr_source;

static uint64_t splitmix(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static void shuffle(ctr_source *s) {
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

static int criteo_next(ctr_source *s, nb_ctr_sample *x) {
    if (nb_criteo_next(s->cr, x)) return 1;
    nb_criteo_rewind(s->cr);
    for (long k = 0; k < s->skip; k++) NB_CHECK(nb_criteo_next(s->cr, x), "use a larger file", "file shrank");
    return nb_criteo_next(s->cr, x);
}

static void push_criteo(ctr_set *set, const nb_ctr_sample *x) {
    set_push(set, x->dense, x->cat, 0, NULL, 0, (float)x->label);
}

static void fill_train(ctr_source *s, ctr_batch *t, int B) {
    t->b.B = B;
    if (s->kind == SRC_SYNTH) {
        nb_synth_fill(s->g, s->next, B, t->dense, t->cat, t->target, t->hist, t->len, t->label, NULL);
        s->next += (uint64_t)B;
    } else if (s->kind == SRC_CRITEO) {
        nb_ctr_sample x;
        for (int r = 0; r < B; r++) {
            NB_CHECK(criteo_next(s, &x), "use a file with more samples than --eval-samples",
                     "no training samples after the %ld held-out ones", s->skip);
            memcpy(t->dense + (size_t)r * NB_SC_NDENSE, x.dense, sizeof x.dense);
            memcpy(t->cat + (size_t)r * NB_SC_NCAT, x.cat, sizeof x.cat);
            t->target[r] = 0;
            t->len[r] = 0;
            t->label[r] = (float)x.label;
        }
    } else {
        for (int r = 0; r < B; r++) {
            if (s->pos == s->train.n) shuffle(s);
            set_get(&s->train, s->perm[s->pos++], t, r, s->max_len);
        }
    }
}

/* Evaluation samples first .. first + B - 1. */
static void fill_eval(ctr_source *s, ctr_batch *t, long first, int B) {
    t->b.B = B;
    if (s->kind == SRC_SYNTH) {
        nb_synth_fill(s->g, EVAL_BASE + (uint64_t)first, B, t->dense, t->cat, t->target, t->hist, t->len, t->label,
                      NULL);
    } else {
        for (int r = 0; r < B; r++) set_get(&s->eval, first + r, t, r, s->max_len);
    }
}

static long eval_count(const ctr_source *s, const nb_ctr_opts *o) {
    return s->kind == SRC_SYNTH ? o->eval_samples : s->eval.n;
}

/* ---- MovieLens click files ---- */

static const char *ML_HEADER = "label\tuser\titem\tyear\tgenre\thour\tweekday\ttimestamp\thistory";
static const char *ML_HINT = "regenerate the files with 'bash scripts/fetch_movielens.sh'";

static uint32_t ml_num(const char *path, long line, char **p, char end) {
    errno = 0;
    char *e;
    unsigned long v = strtoul(*p, &e, 10);
    NB_CHECK(e != *p && errno == 0 && v <= UINT32_MAX && (*e == end || (end == ' ' && (*e == '\t' || !*e))), ML_HINT,
             "%s:%ld: malformed field near '%.20s'", path, line, *p);
    *p = e;
    return (uint32_t)v;
}

/* Reads one clicks_*.tsv; tracks the largest id of each of the 6 used tables (5 = items). */
static void ml_read(const char *path, ctr_set *set, uint32_t maxid[6]) {
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
        uint32_t cat[NB_SC_NCAT] = {0};
        cat[0] = v[1], cat[1] = v[2], cat[2] = v[3], cat[3] = v[4], cat[4] = v[5], cat[5] = v[6];
        for (int k = 0; k < 6; k++)
            if (cat[k] > maxid[k]) maxid[k] = cat[k];
        static const float zero_dense[NB_SC_NDENSE];
        set_push(set, zero_dense, cat, v[2], hist, (int)nh, (float)v[0]);
    }
    NB_CHECK(!ferror(f), ML_HINT, "cannot read %s", path);
    NB_CHECK(set->n > 0, ML_HINT, "%s holds no samples", path);
    free(line);
    free(hist);
    fclose(f);
}

static int64_t cap_rows(int64_t rows, int64_t cap) { return rows < cap ? rows : cap; }

/* Opens --data and sets the table sizes (and for synth the history cap) of the model config. */
static void source_open(ctr_source *s, const nb_ctr_opts *o, nb_sc_config *mc) {
    memset(s, 0, sizeof *s);
    const char *d = o->data;
    if (!strcmp(d, "synth") || !strncmp(d, "synth:", 6)) {
        s->kind = SRC_SYNTH;
        char spec[NB_PATH_MAX + 64];
        if (strstr(d, "max_len="))
            snprintf(spec, sizeof spec, "%s", d);
        else
            snprintf(spec, sizeof spec, "%s%smax_len=%d", d, strchr(d, ':') ? "," : ":", mc->max_len);
        s->g = nb_malloc(sizeof *s->g, "synthetic generator");
        nb_synth_open(s->g, spec);
        mc->max_len = s->g->o.max_len;
        for (int f = 0; f < NB_SC_NCAT; f++) mc->cat_rows[f] = cap_rows(s->g->card[f], o->table_cap);
        mc->item_rows = cap_rows(s->g->o.items, o->table_cap);
    } else if (!strncmp(d, "criteo:", 7)) {
        s->kind = SRC_CRITEO;
        s->cr = nb_criteo_open(d + 7, NB_CRITEO_KAGGLE, o->strict);
        nb_ctr_sample x;
        while (s->eval.n < o->eval_samples && nb_criteo_next(s->cr, &x)) push_criteo(&s->eval, &x);
        NB_CHECK(s->eval.n == o->eval_samples, "lower --eval-samples (the held-out head of the file)",
                 "%s has only %ld good samples; %d are held out for evaluation", d + 7, s->eval.n, o->eval_samples);
        s->skip = s->eval.n;
        for (int f = 0; f < NB_SC_NCAT; f++) mc->cat_rows[f] = o->table_cap;
        mc->item_rows = 1;
    } else if (!strcmp(d, "movielens")) {
        s->kind = SRC_MOVIELENS;
        uint32_t maxid[6] = {0};
        ml_read("data/movielens/clicks_train.tsv", &s->train, maxid);
        ml_read("data/movielens/clicks_test.tsv", &s->eval, maxid);
        for (int f = 0; f < NB_SC_NCAT; f++) mc->cat_rows[f] = f < 6 ? cap_rows((int64_t)maxid[f] + 1, o->table_cap) : 1;
        mc->item_rows = mc->cat_rows[1];
        s->perm = nb_malloc((size_t)s->train.n * sizeof(long), "MovieLens order");
        shuffle(s);
    } else {
        nb_fail("pass --data synth[:k=v,...], criteo:PATH or movielens", "unknown --data '%s'", d);
    }
    s->max_len = mc->max_len;
}

static void source_close(ctr_source *s) {
    if (s->cr) nb_criteo_close(s->cr);
    free(s->g);
    free(s->perm);
    set_free(&s->train);
    set_free(&s->eval);
}

/* ---- the run ---- */

typedef struct {
    const nb_ctr_opts *o;
    nb_sc_model m;
    ctr_source src;
    ctr_batch batch;
    nb_sc_optim optim;
    nb_task_ctx ctx; /* the compute lane's, kept for the model's later calls from the host */
    int step;
    double fill_s, prep_s; /* host time of the last next_batch: samples, index lists */
} ctr_run;

/* OpenMP's thread count is per calling thread: the lane's worker needs its own setting. */
static void work_threads(void *arg, const nb_task_ctx *ctx) {
    ctr_run *r = arg;
    r->ctx = *ctx;
    nb_sc_set_ctx(&r->m, &r->ctx);
    nb_host_set_threads(r->o->threads);
}

/* One phase of the step (seqctr.h's nb_sc_phase; seg for the per-segment ones): a span of its
 * own, so the trace gives the step breakdown and the timeline. */
typedef struct {
    ctr_run *r;
    nb_sc_phase phase;
    int seg;
    char name[40];
} ctr_work;

static void work_phase(void *arg, const nb_task_ctx *ctx) {
    ctr_work *w = arg;
    ctr_run *r = w->r;
    if (w->phase == NB_SC_FWD_EMB) nb_sc_zero_grads(&r->m);
    nb_sc_enqueue_phase(&r->m, ctx, w->phase, w->seg, &r->optim, r->step + 1);
}

static nb_span_kind phase_kind(nb_sc_phase p) {
    return p <= NB_SC_FWD_SEG ? NB_SPAN_FWD : p <= NB_SC_BWD_EMB ? NB_SPAN_BWD : NB_SPAN_OPTIM;
}

/* The next training batch: samples, then the model's index lists (host work, timed). */
static void next_batch(ctr_run *r) {
    double t0 = nb_now();
    fill_train(&r->src, &r->batch, r->o->batch);
    double t1 = nb_now();
    nb_sc_prepare(&r->m, &r->batch.b);
    r->fill_s = t1 - t0;
    r->prep_s = nb_now() - t1;
}

/* The lanes of a run and the work items they run (built once; the items are reused every step). */
typedef struct {
    nb_lanes *lanes;
    nb_lane *main, *side[NB_SC_MAX_BLOCKS], *dispatch[NB_SC_MAX_BLOCKS];
    int nside, erase, async;
    ctr_work fixed[NB_SC_NPHASES], fwd[NB_SC_MAX_BLOCKS], bwd[NB_SC_MAX_BLOCKS];
} ctr_sched;

/* async dispatch: a host lane hands one segment's backward to its side lane */
typedef struct {
    nb_lane *side;
    nb_mark after;
    ctr_work *w;
    int step;
} ctr_dispatch;
static ctr_dispatch dispatches[NB_SC_MAX_BLOCKS];

static void work_dispatch(void *arg, const nb_task_ctx *ctx) {
    (void)ctx;
    ctr_dispatch *d = arg;
    nb_lane_wait(d->side, d->after);
    nb_lane_run(d->side, d->w->name, NB_SPAN_BWD, d->step, work_phase, d->w);
}

static void side_threads(void *arg, const nb_task_ctx *ctx) {
    (void)ctx;
    nb_host_set_threads(((ctr_run *)arg)->o->threads);
}

static void run_fixed(ctr_sched *S, nb_sc_phase p, int step) {
    nb_lane_run(S->main, S->fixed[p].name, phase_kind(p), step, work_phase, &S->fixed[p]);
}

/* One step. plain: every phase on the main lane, segments forward then backward. erase: each
 * segment's backward goes to side lane (k mod K) as soon as its forward is enqueued, waiting on a
 * mark, while the main lane goes on with the next segment's forward; the join waits for all. */
static void enqueue_step(ctr_sched *S, ctr_run *r, int step) {
    int nseg = r->m.nseg;
    run_fixed(S, NB_SC_FWD_EMB, step);
    run_fixed(S, NB_SC_FWD_HIST, step);
    nb_mark dispatched[NB_SC_MAX_BLOCKS];
    for (int k = 0; k < nseg; k++) {
        nb_lane_run(S->main, S->fwd[k].name, NB_SPAN_FWD, step, work_phase, &S->fwd[k]);
        if (!S->erase) continue;
        int j = k % S->nside;
        nb_mark done = nb_lane_mark(S->main);
        if (S->async) {
            dispatches[k] = (ctr_dispatch){S->side[j], done, &S->bwd[k], step};
            nb_lane_run(S->dispatch[j], "dispatch", NB_SPAN_OTHER, step, work_dispatch, &dispatches[k]);
            dispatched[j] = nb_lane_mark(S->dispatch[j]);
        } else {
            nb_lane_wait(S->side[j], done);
            nb_lane_run(S->side[j], S->bwd[k].name, NB_SPAN_BWD, step, work_phase, &S->bwd[k]);
        }
    }
    if (S->erase) {
        int used = nseg < S->nside ? nseg : S->nside;
        for (int j = 0; j < used; j++) {
            /* the side lane's mark must be taken after its dispatcher queued the work there */
            if (S->async) nb_mark_wait_host(dispatched[j]);
            nb_lane_wait(S->main, nb_lane_mark(S->side[j]));
        }
    } else {
        for (int k = nseg - 1; k >= 0; k--)
            nb_lane_run(S->main, S->bwd[k].name, NB_SPAN_BWD, step, work_phase, &S->bwd[k]);
    }
    for (int p = NB_SC_BWD_JOIN; p < NB_SC_NPHASES; p++) run_fixed(S, (nb_sc_phase)p, step);
}

static void sched_init(ctr_sched *S, ctr_run *r, const nb_ctr_opts *o) {
    memset(S, 0, sizeof *S);
    S->erase = !strcmp(o->schedule, "erase");
    S->async = !strcmp(o->erase_dispatch, "async");
    S->lanes = nb_lanes_create(r->m.be->device == NB_DEV_CUDA ? "cuda" : "cpu", 1 << 16);
    S->main = nb_lane_create(S->lanes, "main", NB_LANE_DEVICE);
    nb_lane_run(S->main, "set threads", NB_SPAN_OTHER, -1, work_threads, r);
    if (S->erase) {
        S->nside = o->side_lanes;
        for (int j = 0; j < S->nside; j++) {
            char name[32];
            snprintf(name, sizeof name, "side %d", j);
            S->side[j] = nb_lane_create(S->lanes, name, NB_LANE_DEVICE);
            nb_lane_run(S->side[j], "set threads", NB_SPAN_OTHER, -1, side_threads, r);
            if (S->async) {
                snprintf(name, sizeof name, "dispatch %d", j);
                S->dispatch[j] = nb_lane_create(S->lanes, name, NB_LANE_HOST);
            }
        }
    }
    nb_lanes_sync(S->lanes);
    for (int p = 0; p < NB_SC_NPHASES; p++) {
        S->fixed[p] = (ctr_work){r, (nb_sc_phase)p, 0, ""};
        snprintf(S->fixed[p].name, sizeof S->fixed[p].name, "%s", nb_sc_phase_name(p));
    }
    for (int k = 0; k < r->m.nseg; k++) {
        S->fwd[k] = (ctr_work){r, NB_SC_FWD_SEG, k, ""};
        S->bwd[k] = (ctr_work){r, NB_SC_BWD_SEG, k, ""};
        snprintf(S->fwd[k].name, sizeof S->fwd[k].name, "%s %d", nb_sc_phase_name(NB_SC_FWD_SEG), k);
        snprintf(S->bwd[k].name, sizeof S->bwd[k].name, "%s %d", nb_sc_phase_name(NB_SC_BWD_SEG), k);
    }
}

static double bce_prob(double p, float y) {
    p = fmin(fmax(p, 1e-7), 1 - 1e-7);
    return y > 0.5f ? -log(p) : -log1p(-p);
}

static nb_ctr_eval finish_eval(const float *score_logit, const float *label, long n, int logits) {
    nb_ctr_eval e = {.n = n};
    double bce = 0, pos = 0;
    for (long i = 0; i < n; i++) {
        double z = score_logit[i];
        bce += logits ? fmax(z, 0) - z * label[i] + log1p(exp(-fabs(z))) : bce_prob(z, label[i]);
        pos += label[i];
    }
    e.loss = bce / (double)n;
    e.base_rate = pos / (double)n;
    e.ne = nb_ctr_ne(e.loss, e.base_rate);
    e.auc = nb_ctr_auc(score_logit, label, n);
    return e;
}

static nb_ctr_eval evaluate(ctr_run *r) {
    long n = eval_count(&r->src, r->o);
    float *logit = nb_malloc((size_t)n * sizeof(float), "evaluation scores");
    float *label = nb_malloc((size_t)n * sizeof(float), "evaluation labels");
    for (long first = 0; first < n; first += r->o->batch) {
        int B = (int)(n - first < r->o->batch ? n - first : r->o->batch);
        fill_eval(&r->src, &r->batch, first, B);
        nb_sc_batch b = r->batch.b;
        b.label = NULL;
        nb_sc_forward(&r->m, &b, logit + first);
        memcpy(label + first, r->batch.label, (size_t)B * sizeof(float));
    }
    nb_ctr_eval e = finish_eval(logit, label, n, 1);
    free(logit);
    free(label);
    return e;
}

/* MovieLens: score each test rating by its movie's smoothed training positive rate. */
static nb_ctr_eval popularity_baseline(const ctr_source *s) {
    int64_t rows = 0;
    for (long i = 0; i < s->train.n; i++) rows = s->train.target[i] >= rows ? s->train.target[i] + 1 : rows;
    double *pos = nb_calloc((size_t)rows + 1, sizeof(double), "popularity"), *cnt = nb_calloc((size_t)rows + 1, sizeof(double), "popularity");
    double p0 = 0;
    for (long i = 0; i < s->train.n; i++) {
        pos[s->train.target[i]] += s->train.label[i];
        cnt[s->train.target[i]] += 1;
        p0 += s->train.label[i];
    }
    p0 /= (double)s->train.n;
    float *score = nb_malloc((size_t)s->eval.n * sizeof(float), "popularity");
    for (long i = 0; i < s->eval.n; i++) {
        uint32_t t = s->eval.target[i];
        double ps = t < rows ? pos[t] : 0, c = t < rows ? cnt[t] : 0;
        score[i] = (float)((ps + POP_SMOOTH * p0) / (c + POP_SMOOTH));
    }
    nb_ctr_eval e = finish_eval(score, s->eval.label, s->eval.n, 0);
    free(pos), free(cnt), free(score);
    return e;
}

static void print_eval(const char *what, int step, const nb_ctr_eval *e) {
    printf("%s step=%d n=%ld loss=%.5f ne=%.5f auc=%.5f base_rate=%.5f\n", what, step, e->n, e->loss, e->ne, e->auc,
           e->base_rate);
    /* NE and AUC are undefined when the held-out labels are all equal: say so instead of
     * leaving a bare nan for the reader to interpret */
    if (!isfinite(e->ne) || !isfinite(e->auc))
        printf("note: the %ld held-out labels are all %s: NE and AUC are undefined (metrics.jsonl leaves them out)\n",
               e->n, e->base_rate > 0.5 ? "1" : "0");
    fflush(stdout);
}

static FILE *open_metrics(const char *dir) {
    if (!dir[0]) return NULL;
    NB_CHECK(mkdir(dir, 0777) == 0 || errno == EEXIST, "choose a writable --out directory", "cannot create %s: %s",
             dir, strerror(errno));
    char path[NB_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    return nb_fopen(path, "w", "choose a writable --out directory");
}

static void write_metrics(FILE *f, int step, double loss, double sps, double ms, const nb_step_stats *st,
                          const nb_ctr_eval *e) {
    nb_json_writer w;
    nb_json_writer_init(&w, 0);
    nb_json_begin_obj(&w);
    nb_json_kint(&w, "step", step);
    nb_json_knum(&w, "loss", loss);
    nb_json_knum(&w, "samples_per_s", sps);
    nb_json_knum(&w, "ms", ms);
    nb_json_knum(&w, "bubble_pct", st->bubble_pct);
    nb_json_knum(&w, "overlap_pct", st->overlap_pct);
    if (e) {
        nb_json_knum(&w, "eval_loss", e->loss);
        if (isfinite(e->ne)) nb_json_knum(&w, "eval_ne", e->ne);
        if (isfinite(e->auc)) nb_json_knum(&w, "eval_auc", e->auc);
    }
    nb_json_end_obj(&w);
    fprintf(f, "%s\n", nb_json_text(&w));
    NB_CHECK(fflush(f) == 0, "check free disk space in --out", "cannot write metrics.jsonl: %s", strerror(errno));
    nb_json_writer_free(&w);
}

static void run_init(ctr_run *r, const nb_ctr_opts *o) {
    memset(r, 0, sizeof *r);
    r->o = o;
    nb_sc_config mc = o->model;
    source_open(&r->src, o, &mc);
    NB_CHECK(!strcmp(o->emb_optim, "adagrad") || !strcmp(o->emb_optim, "adam"), "pass --emb-optim adagrad or adam",
             "unknown --emb-optim '%s'", o->emb_optim);
    const nb_backend_i *be = nb_backend_for(o->device, o->precision);
    nb_sc_init_on(&r->m, &mc, o->batch, be);
    batch_alloc(&r->batch, o->batch, mc.max_len);
    r->optim = (nb_sc_optim){.lr = o->lr, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                             .weight_decay = o->weight_decay, .emb_lr = o->emb_lr, .emb_eps = 1e-8f,
                             .emb_adam = !strcmp(o->emb_optim, "adam")};
    size_t rows = (size_t)r->m.emb_off[NB_SC_NTABLES];
    if (nb_verbosity > 0)
        fprintf(stderr, "seqctr      E %d, %d hist layers, %d blocks, rank %d, hidden %d, max_len %d; %.2f M dense, %.2f M embedding rows; %s (%s)\n",
                mc.E, mc.hist_layers, mc.blocks, mc.cross_rank, mc.block_hidden, mc.max_len,
                r->m.nparams_used / 1e6, (double)rows / 1e6, be->name, o->device);
}

static void run_free(ctr_run *r) {
    batch_free(&r->batch);
    nb_sc_free(&r->m);
    source_close(&r->src);
}

/* Steps left out of the throughput statistics (step_stats.h). */
static int warmup_steps(int steps) { return nb_step_warmup(steps); }

/* timeline.svg of one step in the run directory */
static void write_timeline(nb_lanes *lanes, const nb_ctr_opts *o, int step) {
    char path[NB_PATH_MAX + 32], title[256];
    snprintf(path, sizeof path, "%s/timeline.svg", o->out);
    snprintf(title, sizeof title, "seqctr step %d: --schedule %s%s, batch %d, %s", step, o->schedule,
             strcmp(o->schedule, "erase") ? "" : (!strcmp(o->erase_dispatch, "async") ? " (async)" : " (blocking)"),
             o->batch, o->device);
    nb_timeline_write(lanes, step, path, title);
}

/* "dense fwd 3" is a span of the phase "dense fwd" */
static int phase_named(const char *span, const char *phase) {
    size_t n = strlen(phase);
    return !strncmp(span, phase, n) && (span[n] == 0 || span[n] == ' ');
}

/* Adds the step's span durations to their phase (spans are named by nb_sc_phase_name). */
static void add_breakdown(nb_lanes *lanes, double *phase_s) {
    const nb_span *sp;
    size_t n = nb_lanes_spans(lanes, &sp);
    for (size_t i = 0; i < n; i++)
        for (int p = 0; p < NB_SC_NPHASES; p++)
            if (phase_named(sp[i].name, nb_sc_phase_name(p))) phase_s[p] += sp[i].t1 - sp[i].t0;
}

static void print_breakdown(const double *phase_s, int steps) {
    if (steps < 1) return;
    double total = 0;
    for (int p = 0; p < NB_SC_NPHASES; p++) total += phase_s[p];
    printf("breakdown ms/step:");
    for (int p = 0; p < NB_SC_NPHASES; p++) printf(" %s=%.3f", nb_sc_phase_name(p), 1e3 * phase_s[p] / steps);
    printf(" total=%.3f\n", 1e3 * total / steps);
}

/* p90 samples/s: the batch over the 90th percentile of the step times after warm-up, i.e. the
 * throughput that 90% of the steps reach (the ERASE paper's p90 QPS, read conservatively). */
static void print_throughput(const double *secs, int steps, int batch) {
    nb_step_times st = nb_step_times_of(secs, steps);
    if (!st.n) return;
    printf("throughput steps=%d warmup=%d p90_samples_per_s=%.0f median_samples_per_s=%.0f p90_step_ms=%.3f\n", st.n,
           st.warmup, batch / st.p90, batch / st.median, 1e3 * st.p90);
}

nb_ctr_eval nb_ctr_train(const nb_ctr_opts *o) {
    nb_host_set_threads(o->threads);
    static ctr_run r; /* large; the work items point into it */
    run_init(&r, o);
    static ctr_sched S;
    sched_init(&S, &r, o);
    nb_lanes *lanes = S.lanes;
    nb_lane *compute = S.main;
    FILE *metrics = open_metrics(o->out);
    nb_lanes_trace_clear(lanes);
    nb_ctr_eval e = {0};
    double *step_secs = nb_malloc((size_t)o->steps * sizeof(double), "step times");
    double phase_s[NB_SC_NPHASES] = {0}, hist_rows = 0, overlap_sum = 0, host_s[2] = {0};
    double t_start = nb_now();
    next_batch(&r);
    for (int step = 0; step < o->steps; step++) {
        double t0 = nb_now();
        r.step = step;
        if (step >= warmup_steps(o->steps)) {
            hist_rows += (double)r.m.stage_nh;
            host_s[0] += r.fill_s;
            host_s[1] += r.prep_s;
        }
        nb_sc_begin_step(&r.m);
        enqueue_step(&S, &r, step);
        /* the next batch is made on the host while this step runs (after an evaluation, which
         * uses the model's batch buffers itself) */
        int is_last = step + 1 == o->steps, do_eval = is_last || (o->eval_every > 0 && (step + 1) % o->eval_every == 0);
        if (!is_last && !do_eval) next_batch(&r);
        nb_mark_wait_host(nb_lane_mark(compute));
        double loss = nb_sc_loss(&r.m);
        double t1 = nb_now();
        step_secs[step] = t1 - t0;
        nb_lanes_sync(lanes); /* side and dispatch lanes too: their spans enter the trace */
        nb_step_stats st = nb_lanes_step_stats(lanes, step, nb_lane_index(compute), t0, t1);
        if (step >= warmup_steps(o->steps)) {
            add_breakdown(lanes, phase_s);
            overlap_sum += st.overlap_pct;
        }
        if (is_last && o->trace[0]) nb_lanes_write_chrome_trace(lanes, o->trace);
        if (is_last && o->out[0]) write_timeline(lanes, o, step);
        nb_lanes_trace_clear(lanes);
        NB_CHECK(isfinite(loss), "lower --lr or --emb-lr", "the loss became %g at step %d", loss, step);
        if (do_eval) {
            e = evaluate(&r);
            print_eval("eval", step + 1, &e);
            if (!is_last) next_batch(&r);
        }
        if (metrics)
            write_metrics(metrics, step, loss, o->batch / (t1 - t0), 1e3 * (t1 - t0), &st, do_eval ? &e : NULL);
        if (nb_verbosity > 0 && o->log_every > 0 && ((step + 1) % o->log_every == 0 || is_last))
            fprintf(stderr, "step %5d | loss %.5f | %.0f samples/s | %.1f ms | bubble %.1f%%\n", step + 1, loss,
                    o->batch / (t1 - t0), 1e3 * (t1 - t0), st.bubble_pct);
    }
    double secs = nb_now() - t_start;
    printf("train steps=%d samples_per_s=%.0f (including evaluation)\n", o->steps,
           (double)o->steps * o->batch / (secs > 0 ? secs : 1e-9));
    print_throughput(step_secs, o->steps, o->batch);
    print_breakdown(phase_s, o->steps - warmup_steps(o->steps));
    if (o->steps > warmup_steps(o->steps))
        printf("host ms/step (overlapped with the step before): samples=%.3f index_lists=%.3f\n",
               1e3 * host_s[0] / (o->steps - warmup_steps(o->steps)), 1e3 * host_s[1] / (o->steps - warmup_steps(o->steps)));
    if (S.erase && o->steps > warmup_steps(o->steps))
        printf("overlap: %.1f%% of the step had two or more lanes busy (mean over the measured steps)\n",
               overlap_sum / (o->steps - warmup_steps(o->steps)));
    if (o->steps > warmup_steps(o->steps)) {
        int n = o->steps - warmup_steps(o->steps);
        double fl = nb_sc_flops(&r.m, o->batch, (long)(hist_rows / n)), busy = 0;
        for (int p = 0; p < NB_SC_NPHASES; p++) busy += phase_s[p];
        printf("flops: %.1f GFLOP/step (matmuls, forward + backward, %.1f history rows per sample); %.1f TFLOP/s over "
               "the phases\n", fl / 1e9, hist_rows / n / o->batch, busy > 0 ? fl * n / busy / 1e12 : 0.0);
    }
    free(step_secs);
    if (r.src.kind == SRC_SYNTH) { /* the best any model can do on this evaluation range */
        long n = o->eval_samples;
        float *tl = nb_malloc((size_t)n * sizeof(float), "teacher logits"), *lab = nb_malloc((size_t)n * sizeof(float), "labels");
        nb_synth_teacher_logit(r.src.g, EVAL_BASE, (int)n, tl);
        nb_synth_fill(r.src.g, EVAL_BASE, (int)n, NULL, NULL, NULL, NULL, NULL, lab, NULL);
        nb_ctr_eval te = finish_eval(tl, lab, n, 1);
        print_eval("teacher", o->steps, &te);
        free(tl), free(lab);
    }
    if (r.src.kind == SRC_MOVIELENS) {
        nb_ctr_eval pb = popularity_baseline(&r.src);
        print_eval("baseline-popularity", o->steps, &pb);
    }
    if (metrics) fclose(metrics);
    if (metrics && !o->no_ckpt) {
        char path[NB_PATH_MAX + 32];
        snprintf(path, sizeof path, "%s/model.safetensors", o->out);
        nb_sc_to_host(&r.m);
        nb_sc_save(&r.m, path);
    }
    nb_lanes_destroy(lanes);
    run_free(&r);
    return e;
}
