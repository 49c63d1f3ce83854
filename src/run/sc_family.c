/* The seqctr family in a run: the model (src/model/seqctr.c) bound into the run's arenas, its
 * step as work items (the model's phases), its data (src/data/ctr_source.c), held-out NE and
 * AUC, checkpoint tensors (dense weights and AdamW moments, the tables and their Adagrad sums or
 * sparse-Adam moments).
 *
 * Metrics: metrics.jsonl, one line per step: step, loss, lr, ms, samples_per_s, bubble_pct,
 * overlap_pct, plus eval_loss, eval_ne, eval_auc on evaluation steps. NE = mean BCE / H(p) with p
 * the evaluation set's positive rate; AUC exact (ties get the average rank). */
#include "run/sc.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "core.h"
#include "data/ctr_source.h"
#include "host.h"
#include "model/seqctr.h"
#include "run/run.h"
#include "run/ckpt.h"
#include "run/sc_place.h"
#include "run/step_stats.h"
#include "sched/sched.h"

/* One phase of the step (seqctr.h's nb_sc_phase; seg for the per-segment ones), a span of its
 * own, so the trace gives the step breakdown and the timeline. */
typedef struct {
    struct sc_train *t;
    nb_sc_phase phase;
    int seg;
} sc_work;

/* the cost fit's exponents: a = 1, 1.1, .., 2.5 */
#define FIT_NA 16
static double fit_alpha(int j) { return 1.0 + 0.1 * j; }
/* a fit record: samples, time (-1 until the part ran), sum of L^a per exponent */
#define FIT_REC (FIT_NA + 2)

typedef struct {
    uint64_t pos;
    double fill_s, prep_s, ids_s, coll_s; /* prep_s: the lists, then (sharded) ids_s routing the ids, coll_s the collisions */
    int nh, B, max_len; /* max_len: the part's longest history */
    double sum_pow[FIT_NA]; /* sum over the part's samples of L^a */
} sc_ahead;

typedef struct sc_train {
    nb_run *run;
    nb_sc_model m;
    /* ranks: this rank trains samples first .. first + Bl - 1 of each global batch; sharded: the
     * tables row-wise over the ranks (nb_sc_shard), the host's scratch of the id exchange */
    int sharded, Bl, first;
    /* Frozen-Window Pipelining (--micro-batches M, the run's micro-batches): a rank's slice of the
     * global batch is a window of M parts of Bm samples (read once into `window`, reordered by
     * --cluster-keys), trained one after another on one embedding state */
    int M, Bm;
    nb_ctr_batch window;
    nb_ctr_cluster cluster; /* --cluster-keys: its scratch */
    /* FreeScale: where the global batch's samples train (--balance), and --emulate-ranks N (this
     * process trains N ranks' shares one after another: the window's parts are the shares) */
    nb_sc_placer place;
    int emulate;
    int *win_idx;            /* [window capacity] each window sample's index in its global batch */
    int *part_at;            /* [M + 1] where each part of the window starts */
    FILE *samples_log;       /* NB_SAMPLES_LOG: every trained sample's (step, part, index), for tests */
    /* per part of the step: compute-lane busy seconds (its spans), samples and history rows */
    size_t span_seen;
    int part_k;
    double *part_s, *part_nh, *part_maxlen, *part_n;
    /* straggler statistics over the measured steps: (max - mean) / max of the ranks' compute, the
     * ranks' idle share of the synchronous step, the emulated step time */
    double step_shared_s; /* the step's communication and common phases (busy seconds) */
    double strag_sum, rank_bubble_sum, step_strag, step_rank_bubble, step_emul_s, step_max_s, step_mean_s;
    /* emulated: does the step's slowest share hold its longest history (no placement splits a
     * sample), and over the measured steps how often */
    int step_slow_long, nslow_long, step_slow_n, nslow_alone;
    double *emul_secs;
    double *strag_steps, *bubble_steps; /* per measured step, for the medians */
    double *rank_s;                     /* [max(world, M)]: the step's ranks' compute seconds */
    int nstrag;
    /* the cost fit's records (emulated ranks): per part, samples, time and sum of L^a per exponent */
    double *fit;
    int nfit, fit_cap;
    uint64_t window_pos;       /* the source position of the window being cut into parts */
    long next_u, popped_u;     /* parts prepared, and popped, since the run started (part u = step * M + k) */
    int step_rows, step_resynced; /* the step's parts: distinct rows moved, re-synced */
    int step_ahead;               /* --emb-priority: those moved ahead (the exclusive ones) */
    nb_bucket dense_bucket;       /* the dense gradient: one bucket for the ranks' all-reduce */
    nb_ctr_source src;
    nb_ctr_batch batch;
    nb_sc_optim optim;
    nb_task_ctx ctx;   /* the compute lane's, kept for the model's calls from the host */
    int step;          /* the step whose items run (the sparse optimizer's t = step + 1) */
    /* batches prepared ahead, oldest first (the model's queue): each one's source position (of
     * its global batch's first sample), host times (samples, index lists) and history rows */
    sc_ahead ahead[NB_SC_RING];
    int nahead;
    int pipelined; /* the schedule fetches the next batch while the step trains (two batches ahead) */
    int ids_ahead; /* the next batch's ids are routed while the step trains (else at the step's start) */
    sc_work fixed[NB_SC_NPHASES], fwd[NB_SC_MAX_BLOCKS], bwd[NB_SC_MAX_BLOCKS], next[NB_SC_NPHASES];
    /* the summary's statistics, over the steps after warm-up */
    double phase_s[NB_SC_NPHASES], hist_rows, overlap_sum, t_start;
    /* host seconds: the samples, their prep (lists, then sharded: ids routed ahead, collisions),
     * and the ids routed in the step (the synchronous baseline) */
    struct { double samples, prep, ids, coll, ids_in_step; } host;
    double *step_secs;
    int nsteps;
} sc_train;

static sc_train *T(nb_run *r) { return r->fs; }
static const sc_train *CT(const nb_run *r) { return r->fs; }

/* ---------------------------------------------------------------- metrics */

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

static double bce_prob(double p, float y) {
    p = fmin(fmax(p, 1e-7), 1 - 1e-7);
    return y > 0.5f ? -log(p) : -log1p(-p);
}

static nb_eval finish_eval(const float *score_logit, const float *label, long n, int logits) {
    nb_eval e = {.done = 1, .n = n};
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

static void print_eval_line(const char *what, int step, const nb_eval *e) {
    printf("%s step=%d n=%ld loss=%.5f ne=%.5f auc=%.5f base_rate=%.5f\n", what, step, e->n, e->loss, e->ne, e->auc,
           e->base_rate);
    /* NE and AUC are undefined when the held-out labels are all equal: say so instead of
     * leaving a bare nan for the reader to interpret */
    if (!isfinite(e->ne) || !isfinite(e->auc))
        printf("note: the %ld held-out labels are all %s: NE and AUC are undefined (metrics.jsonl leaves them out)\n",
               e->n, e->base_rate > 0.5 ? "1" : "0");
    fflush(stdout);
}

/* ---------------------------------------------------------------- work items */

static void work_phase(void *arg, const nb_task_ctx *ctx) {
    sc_work *w = arg;
    sc_train *t = w->t;
    if (w->phase == NB_SC_FWD_EMB && nb_sc_first_part(&t->m)) nb_sc_zero_grads(&t->m); /* parts add up */
    nb_sc_enqueue_phase(&t->m, ctx, w->phase, w->seg, &t->optim, t->step + 1);
}

/* A phase of the batch after the step's (pipelined); nothing when there is none (the last step). */
static void work_next(void *arg, const nb_task_ctx *ctx) {
    sc_work *w = arg;
    if (w->t->m.emb.next >= 0) nb_sc_enqueue_next_phase(&w->t->m, ctx, w->phase);
}

static nb_span_kind phase_kind(nb_sc_phase p) {
    if (p <= NB_SC_FWD_SEG) return NB_SPAN_FWD;
    return p == NB_SC_OPT_DENSE || p == NB_SC_OPT_EMB ? NB_SPAN_OPTIM : NB_SPAN_BWD;
}

static void add_fixed(nb_items *l, sc_train *t, nb_sc_phase p) {
    t->fixed[p] = (sc_work){t, p, 0};
    nb_items_add(l, nb_sc_phase_name(p), phase_kind(p), work_phase, &t->fixed[p]);
}

/* Sharded: the owners' rows to the ranks that asked (into the batch's work buffer); the compute
 * lane waits for them. */
static void hook_rows(nb_run *r, nb_lane *lane, int step, void *arg) {
    (void)step;
    sc_train *t = arg;
    nb_emb_all_to_all(&t->m.emb, r->comm, lane, NB_EMB_ROWS, t->m.d_uniq_grads);
}

/* Sharded: each unique row's gradient to its owner. */
static void hook_grads(nb_run *r, nb_lane *lane, int step, void *arg) {
    (void)step;
    sc_train *t = arg;
    nb_emb_all_to_all(&t->m.emb, r->comm, lane, NB_EMB_GRADS, t->m.d_uniq_grads);
}

/* Pipelined: the next batch's rows, fetched while the step trains. */
static void hook_rows_next(nb_run *r, nb_lane *lane, int step, void *arg) {
    (void)step;
    sc_train *t = arg;
    nb_emb_all_to_all(&t->m.emb, r->comm, lane, NB_EMB_ROWS_NEXT, t->m.d_uniq_grads);
}

/* Pipelined, after the step's update: the next batch's rows that the update changed, again. */
static void hook_resync(nb_run *r, nb_lane *lane, int step, void *arg) {
    (void)step;
    sc_train *t = arg;
    nb_emb_all_to_all(&t->m.emb, r->comm, lane, NB_EMB_RESYNC, t->m.d_uniq_grads);
}

static void add_next(nb_items *l, sc_train *t, nb_sc_phase p, const char *name) {
    t->next[p] = (sc_work){t, p, 0};
    /* host tables: the lookups read host memory over the bus, a transfer like the upload */
    int moves = p == NB_SC_FWD_UPLOAD || (t->m.emb.host && (p == NB_SC_EMB_SERVE || p == NB_SC_RESYNC_SERVE));
    nb_items_add(l, name, moves ? NB_SPAN_H2D : NB_SPAN_OTHER, work_next, &t->next[p]);
}

static void build_items(nb_run *r, sc_train *t) {
    nb_step_items *it = &r->items;
    char name[40];
    it->nseg = t->m.nseg;
    add_fixed(&it->pre, t, NB_SC_FWD_UPLOAD);
    if (t->sharded) {
        add_fixed(&it->pre, t, NB_SC_EMB_SERVE);
        nb_items_add_hook(&it->pre, "rows all-to-all", hook_rows, t);
    }
    add_fixed(&it->input, t, NB_SC_FWD_EMB);
    add_fixed(&it->input, t, NB_SC_FWD_HIST);
    for (int k = 0; k < t->m.nseg; k++) {
        t->fwd[k] = (sc_work){t, NB_SC_FWD_SEG, k};
        t->bwd[k] = (sc_work){t, NB_SC_BWD_SEG, k};
        snprintf(name, sizeof name, "%s %d", nb_sc_phase_name(NB_SC_FWD_SEG), k);
        nb_items_add(&it->fwd[k], name, NB_SPAN_FWD, work_phase, &t->fwd[k]);
        snprintf(name, sizeof name, "%s %d", nb_sc_phase_name(NB_SC_BWD_SEG), k);
        nb_items_add(&it->bwd[k], name, NB_SPAN_BWD, work_phase, &t->bwd[k]);
    }
    add_fixed(&it->tail, t, NB_SC_BWD_JOIN);
    add_fixed(&it->tail, t, NB_SC_BWD_HIST);
    /* the dense gradient is complete after the bottom MLP's backward: one bucket, all-reduced
     * over the ranks while the embedding backward runs */
    t->fixed[NB_SC_BWD_BOTTOM] = (sc_work){t, NB_SC_BWD_BOTTOM, 0};
    nb_items_add_bucket(&it->tail, nb_sc_phase_name(NB_SC_BWD_BOTTOM), NB_SPAN_BWD, work_phase, &t->fixed[NB_SC_BWD_BOTTOM], 0);
    add_fixed(&it->opt, t, NB_SC_OPT_DENSE);
    /* the unique rows' gradient and update: their count changes per batch (outside a graph) */
    add_fixed(&it->post, t, NB_SC_BWD_EMB);
    if (t->sharded) {
        nb_items_add_hook(&it->post, "grads all-to-all", hook_grads, t);
        add_fixed(&it->post, t, NB_SC_EMB_SUM);
    }
    add_fixed(&it->post, t, NB_SC_OPT_EMB);
    if (t->pipelined) {
        add_next(&it->next, t, NB_SC_FWD_UPLOAD, "batch upload (next)");
        add_next(&it->next, t, NB_SC_EMB_SERVE, "embedding serve (next)");
        nb_items_add_hook(&it->next, "rows all-to-all (next)", hook_rows_next, t);
        if (t->m.emb.priority) add_next(&it->next, t, NB_SC_FETCH_APPLY, "rows apply (next)");
        add_next(&it->resync, t, NB_SC_RESYNC_SERVE, "resync serve");
        nb_items_add_hook(&it->resync, "resync all-to-all", hook_resync, t);
        add_next(&it->resync, t, NB_SC_RESYNC_APPLY, "resync apply");
    }
    t->dense_bucket = (nb_bucket){{0, 0}, {t->m.nparams, 0}, 1};
    nb_run_set_buckets(r, &t->dense_bucket, 1);
    r->grad_sum = t->m.d_grads;
    r->grad_micro = NULL; /* one micro-batch: nothing to accumulate */
}

/* The compute lane's context, for the model's calls from the host (losses, copies, evaluation);
 * OpenMP's thread count is per calling thread, so the lane's worker needs its own setting. */
static void work_bind_ctx(void *arg, const nb_task_ctx *ctx) {
    sc_train *t = arg;
    t->ctx = *ctx;
    nb_sc_set_ctx(&t->m, &t->ctx);
    nb_host_set_threads(t->run->o.threads);
}

/* ---------------------------------------------------------------- family entries */

static void sc_check(nb_train_opts *o) {
    nb_sc_config *c = &o->ctr;
    static const char *hint = "check the seqctr flags (--emb-dim, --heads, --blocks, --max-len)";
    NB_CHECK(c->E >= 1 && c->heads >= 1 && c->E % c->heads == 0, hint, "--emb-dim %d must be a multiple of the %d heads",
             c->E, c->heads);
    NB_CHECK(c->max_len >= 0 && c->max_len <= 65536, hint, "--max-len must be in 0..65536, got %d", c->max_len);
    NB_CHECK(c->blocks >= 1 && c->blocks <= NB_SC_MAX_BLOCKS, hint, "--blocks must be in 1..%d, got %d", NB_SC_MAX_BLOCKS,
             c->blocks);
    c->detach = 0;
    if (o->detach[0]) {
        int first[NB_MAX_SEGMENTS + 1];
        int nseg = nb_parse_detach(o->detach, c->blocks, "block indices", first, NB_MAX_SEGMENTS);
        for (int s = 1; s < nseg; s++) c->detach |= 1ULL << first[s];
        NB_CHECK(o->aux_weight > 0, "pass --aux-weight > 0 with --detach (each detached block learns from its own head)",
                 "--detach needs --aux-weight > 0");
    }
    c->aux_weight = o->aux_weight;
    c->seed = o->seed;
    o->seq = 0;
}

/* Was the checkpoint's (or this run's) table state sharded? (--emb-shard auto: with several ranks) */
static int shard_opts(const nb_train_opts *o, int world) {
    return !strcmp(o->emb_shard, "row") || (!strcmp(o->emb_shard, "auto") && world > 1);
}

/* Do the tables go through the sharded exchange? With several ranks, under a prefetching schedule
 * (its work buffers are the dual buffers), and when a step's parts (micro-batches, emulated ranks)
 * sum their table gradients at the owners. (Whole tables in host memory need none of it: the
 * device reads and updates them in place.) */
static int uses_exchange(const nb_train_opts *o, int world, const nb_sched_i *sc) {
    return shard_opts(o, world) || (sc && sc->prefetches) || nb_train_parts(o) > 1;
}

static int sc_wants_comm(const nb_train_opts *o) { return uses_exchange(o, nb_comm_size(), nb_sched_find(o->schedule)); }

/* --balance and --emulate-ranks: the shares, the window and the parts (micro-batches). */
static void plan_placement(nb_run *r, sc_train *t, int max_len) {
    const nb_train_opts *o = &r->o;
    nb_balance bal;
    nb_balance_parse(&bal, o->balance);
    t->emulate = o->emulate_ranks > 1 ? o->emulate_ranks : 0;
    NB_CHECK(!t->emulate || r->world == 1, "run --emulate-ranks in one process (no mpirun)",
             "--emulate-ranks %d stands in for ranks on one GPU; this run has %d real ones", o->emulate_ranks, r->world);
    NB_CHECK(!t->emulate || o->grad_accum == 1, "drop --micro-batches with --emulate-ranks",
             "the emulated ranks' shares are the step's parts");
    NB_CHECK(!t->emulate || !o->graphs, "drop --graphs with --emulate-ranks",
             "each emulated rank is timed by its phases' spans; a graph replay is one span");
    NB_CHECK(bal.kind != NB_BALANCE_VBS || !o->graphs, "drop --graphs with --balance vbs",
             "vbs changes the per-rank batch size every step: a captured step would not replay");
    int shares = t->emulate ? t->emulate : r->world;
    NB_CHECK(o->batch % shares == 0, "pass a --batch divisible by the ranks (emulated ones too)",
             "--batch %d does not split over %d ranks", o->batch, shares);
    NB_CHECK(!o->cluster_keys || (bal.kind == NB_BALANCE_NONE && !t->emulate), "drop --cluster-keys with --balance / --emulate-ranks",
             "both decide where the samples go");
    nb_sc_placer_init(&t->place, &bal, o->batch, r->world, r->rank, t->emulate ? t->emulate : 1, max_len);
    t->M = nb_train_parts(o);
    int wcap = nb_sc_placer_window_cap(&t->place);
    if (bal.kind == NB_BALANCE_NONE && !t->emulate)
        NB_CHECK(t->Bl % t->M == 0, "pass a --batch divisible by ranks x --micro-batches",
                 "this rank's %d samples do not split into %d micro-batches", t->Bl, t->M);
    NB_CHECK(t->emulate || t->place.cap >= t->M, "pass a --batch of at least ranks x --micro-batches",
             "a rank's share does not split into %d micro-batches", t->M);
    t->Bm = t->emulate ? t->place.cap : (wcap + t->M - 1) / t->M; /* the largest part */
    NB_CHECK(!o->cluster_keys || t->M > 1, "add --micro-batches M > 1 with --cluster-keys",
             "--cluster-keys groups a batch's samples into micro-batches: there is one");
    if ((bal.kind != NB_BALANCE_NONE || t->emulate) && r->rank == 0) {
        char name[64];
        nb_balance_name(&bal, name, sizeof name);
        nb_log(1, "balance     --balance %s over %d %sranks: at most %d samples per rank (of %d)\n", name, shares,
               t->emulate ? "emulated " : "", t->place.cap, o->batch);
    }
}

/* This rank's slice of the global batch, and whether the tables are sharded. */
static void plan_ranks(nb_run *r, sc_train *t, int max_len) {
    const nb_train_opts *o = &r->o;
    t->pipelined = !r->eval_only && r->sched->prefetches;
    t->ids_ahead = r->sched->ids_ahead;
    int parts = nb_train_parts(o);
    t->sharded = !r->eval_only && uses_exchange(o, r->world, r->sched);
    t->Bl = o->batch, t->first = 0, t->M = 1, t->Bm = o->batch;
    if (r->eval_only) return;
    NB_CHECK(parts == 1 || strcmp(o->emb_shard, "none"), "drop --emb-shard none with --micro-batches / --emulate-ranks",
             "--micro-batches sums the window's table gradients at the owners: the tables go through the sharded exchange");
    NB_CHECK(!o->emb_priority || t->pipelined, "add --schedule pipe with --emb-priority",
             "--emb-priority orders the rows the pipe schedule fetches ahead: exclusive rows early, collision rows after the update");
    NB_CHECK(!o->emb_priority || !o->pipe_skip_resync, "drop --pipe-skip-resync with --emb-priority",
             "with --emb-priority the collision rows arrive only through the re-sync");
    NB_CHECK(!t->pipelined || strcmp(o->emb_shard, "none"), "drop --emb-shard none with --schedule pipe",
             "--schedule pipe fetches the rows through the sharded tables' exchange (its work buffers are the dual buffers)");
    NB_CHECK(r->world == 1 || t->sharded, "use --emb-shard row (the default with several ranks)",
             "--emb-shard none with %d ranks: every rank holding every row is not built (the ranks' row updates would have "
             "to be merged)", r->world);
    NB_CHECK(o->batch % r->world == 0, "pass a --batch (the global batch) divisible by the number of ranks",
             "--batch %d does not split evenly over %d ranks", o->batch, r->world);
    t->Bl = o->batch / r->world;
    t->first = r->rank * t->Bl;
    plan_placement(r, t, max_len);
    if (t->sharded && r->rank == 0)
        nb_log(1, "tables      row-wise sharded over %d rank%s (row g on rank g %% %d), --emb-place %s; %d samples per rank\n",
               r->world, r->world == 1 ? "" : "s", r->world, o->emb_place, t->Bl);
}

/* The plan, and where the tables' rows and optimizer state live (--emb-place). */
static void print_memory(const nb_run *r, const sc_train *t) {
    if (r->rank != 0 || nb_verbosity < 1) return;
    const nb_sc_model *m = &t->m;
    double per_row = (double)m->cfg.E * 4 * (m->emb.opt == NB_SC_ADAM ? 3 : 1) + (m->emb.opt == NB_SC_ADAM ? 0 : 4);
    char a[32], b[32], c[32], d[32];
    fprintf(stderr, "memory      device %s, pinned %s, host %s; this rank's table rows and their optimizer state: %s %s\n",
            nb_fmt_bytes(a, sizeof a, (double)r->dev.planned), nb_fmt_bytes(b, sizeof b, (double)r->pinned.planned),
            nb_fmt_bytes(c, sizeof c, (double)r->host.planned), nb_fmt_bytes(d, sizeof d, per_row * (double)m->emb.rows),
            m->emb.host || r->be->device == NB_DEV_CPU ? "in host memory" : "on the device");
}

static void sc_init(nb_run *r) {
    sc_train *t = nb_calloc(1, sizeof *t, "the seqctr family");
    r->fs = t;
    t->run = r;
    const nb_train_opts *o = &r->o;
    nb_sc_config mc = o->ctr;
    nb_ctr_source_opts so = {o->data, o->table_cap, o->eval_samples, o->strict};
    nb_ctr_source_open(&t->src, &so, &mc);
    int emb_opt = !strcmp(o->emb_optim, "adam") ? NB_SC_ADAM : NB_SC_ADAGRAD;
    plan_ranks(r, t, mc.max_len);
    nb_emb_shard shard = {r->world, r->rank};
    nb_sc_plan_opts po = {.emb = {.opt = emb_opt, .shard = t->sharded ? shard : (nb_emb_shard){0, 0}, .pipelined = t->pipelined,
                                  .host = !r->eval_only && !strcmp(o->emb_place, "host"), .parts = t->M,
                                  .priority = o->emb_priority},
                          .lists = !strcmp(o->index_lists, "host")     ? NB_SC_LISTS_HOST
                                   : !strcmp(o->index_lists, "device") ? NB_SC_LISTS_DEVICE
                                                                        : NB_SC_LISTS_AUTO};
    nb_sc_plan(&t->m, &mc, t->Bm, r->be, &po, &r->dev, &r->pinned, &r->host);
    t->m.loss_den = (float)o->batch; /* the loss and its gradient: means over the global batch */
    print_memory(r, t);
    nb_run_alloc_arenas(r, "lower --batch, --max-len or --table-cap");
    nb_run_on_compute(r, "bind lane", work_bind_ctx, t);
    nb_sc_bind(&t->m, &t->ctx);
    nb_ctr_batch_alloc(&t->batch, t->Bm, mc.max_len);
    int wcap = nb_sc_placer_window_cap(&t->place);
    nb_ctr_batch_alloc(&t->window, wcap, mc.max_len);
    if (o->cluster_keys) nb_ctr_cluster_init(&t->cluster, wcap, mc.max_len);
    t->win_idx = nb_malloc((size_t)wcap * sizeof(int), "the window");
    t->part_at = nb_malloc((size_t)(t->M + 1) * sizeof(int), "the window");
    t->part_s = nb_calloc(4 * (size_t)t->M, sizeof(double), "part times");
    t->part_nh = t->part_s + t->M, t->part_maxlen = t->part_s + 2 * (size_t)t->M, t->part_n = t->part_s + 3 * (size_t)t->M;
    t->emul_secs = nb_calloc((size_t)o->steps, sizeof(double), "step times");
    t->strag_steps = nb_calloc(2 * (size_t)o->steps, sizeof(double), "straggler times");
    t->bubble_steps = t->strag_steps + o->steps;
    t->rank_s = nb_calloc((size_t)(r->world > t->M ? r->world : t->M), sizeof(double), "rank times");
    if (t->emulate) {
        t->fit_cap = o->steps * t->M;
        t->fit = nb_malloc((size_t)t->fit_cap * FIT_REC * sizeof(double), "the cost fit");
    }
    const char *log = getenv("NB_SAMPLES_LOG");
    if (log && log[0]) {
        char path[NB_PATH_MAX + 16];
        snprintf(path, sizeof path, "%s.%d", log, r->rank);
        t->samples_log = fopen(path, "w");
        NB_CHECK(t->samples_log != NULL, "set NB_SAMPLES_LOG to a writable path prefix", "cannot write %s", path);
    }
    t->m.emb.skip_resync = t->pipelined && o->pipe_skip_resync;
    t->optim = (nb_sc_optim){.lr = o->lr, .beta1 = o->beta1, .beta2 = o->beta2, .eps = o->eps,
                             .weight_decay = o->weight_decay, .grad_clip = o->grad_clip, .emb_lr = o->emb_lr,
                             .emb_eps = 1e-8f, .emb_adam = emb_opt == NB_SC_ADAM};
    t->step_secs = nb_malloc((size_t)o->steps * sizeof(double), "step times");
    build_items(r, t);
    size_t rows = (size_t)t->m.emb_off[NB_SC_NTABLES];
    if (nb_verbosity > 0)
        fprintf(stderr, "seqctr      E %d, %d hist layers, %d blocks, rank %d, hidden %d, max_len %d; %.2f M dense, %.2f M embedding rows; %s (%s); index lists on the %s\n",
                mc.E, mc.hist_layers, mc.blocks, mc.cross_rank, mc.block_hidden, mc.max_len, t->m.nparams_used / 1e6,
                (double)rows / 1e6, r->be->name, r->backend->desc, t->m.dev_lists ? "device" : "host");
}

static void sc_ckpt_tensors(nb_run *r, nb_ckpt_list *model, nb_ckpt_list *optim);
static int sc_shard_tensors(nb_run *r, nb_ckpt_list *shard);
static void assemble_shards(nb_run *r, const char *dir);
void nb_ckpt_load_lists(const char *dir, nb_ckpt_list *model, nb_ckpt_list *optim);

static void sc_start(nb_run *r, const char *resume_dir) {
    sc_train *t = T(r);
    if (resume_dir) {
        nb_ckpt_list model = {0}, optim = {0};
        sc_ckpt_tensors(r, &model, r->eval_only ? NULL : &optim);
        nb_ckpt_load_lists(resume_dir, &model, r->eval_only ? NULL : &optim);
        nb_ckpt_list_free(&model), nb_ckpt_list_free(&optim);
        if (t->sharded) { /* this rank's shard, written by this rank (the world size was checked) */
            nb_ckpt_list shard = {0};
            char path[NB_PATH_MAX + 96];
            sc_shard_tensors(r, &shard);
            nb_ckpt_shard_path(path, sizeof path, resume_dir, r->rank, r->world);
            nb_ckpt_load_file(path, &shard);
            nb_ckpt_list_free(&shard);
        } else if (shard_opts(&r->o, r->ckpt_world)) {
            assemble_shards(r, resume_dir);
        }
        nb_sc_to_device(&t->m);
        nb_ctr_source_seek(&t->src, r->data_pos0);
    }
}

static void sc_free(nb_run *r) {
    sc_train *t = T(r);
    if (!t) return;
    nb_ctr_batch_free(&t->batch);
    nb_ctr_batch_free(&t->window);
    nb_ctr_cluster_free(&t->cluster);
    nb_sc_placer_free(&t->place);
    free(t->win_idx), free(t->part_at), free(t->part_s), free(t->emul_secs), free(t->fit), free(t->strag_steps), free(t->rank_s);
    if (t->samples_log) fclose(t->samples_log);
    nb_sc_free(&t->m);
    nb_ctr_source_close(&t->src);
    free(t->step_secs);
    free(t);
    r->fs = NULL;
}

static double sc_per_step(const nb_run *r) { return (double)r->o.batch; }

/* Part k of the window in t->window, as a batch (a view). */
static nb_sc_batch part_of(const sc_train *t, int k) {
    nb_sc_batch b = t->window.b;
    size_t at = (size_t)t->part_at[k];
    b.B = t->part_at[k + 1] - t->part_at[k];
    b.dense += at * NB_SC_NDENSE, b.cat += at * NB_SC_NCAT, b.target += at, b.hist += at * b.hist_stride;
    b.hist_len += at, b.label += at;
    return b;
}

/* This rank's samples of the next global batch (placed by --balance) and the window's parts: the
 * emulated ranks' shares, or the rank's samples cut into M near-equal parts. */
static void fill_window(sc_train *t) {
    int share_first[NB_SC_MAX_EMULATE + 1];
    nb_sc_place(&t->place, &t->src, &t->window, t->win_idx, share_first, t->emulate ? 1 : t->M);
    if (t->emulate) {
        memcpy(t->part_at, share_first, (size_t)(t->M + 1) * sizeof(int));
        return;
    }
    if (t->run->o.cluster_keys && t->M > 1) nb_ctr_cluster_keys(&t->window, &t->m, t->M, &t->cluster);
    int n = t->window.b.B;
    for (int k = 0; k <= t->M; k++) t->part_at[k] = (int)((long)k * n / t->M);
}

static void log_samples(sc_train *t, int k) {
    long step = t->next_u / t->M;
    for (int i = t->part_at[k]; i < t->part_at[k + 1]; i++)
        fprintf(t->samples_log, "%ld %d %d %d\n", step, t->run->rank, k, t->win_idx[i]);
    fflush(t->samples_log);
}

/* The next part (this rank's slice of the global batch, cut into the window's parts): the samples
 * at a window's first part, then the model's index lists and, when sharded, the id exchange (host
 * work, timed). */
static void prefetch(sc_train *t) {
    NB_ASSERT(t->nahead < NB_SC_RING);
    int k = (int)(t->next_u % t->M);
    double t0 = nb_now();
    if (k == 0) {
        t->window_pos = nb_ctr_source_position(&t->src);
        fill_window(t);
    }
    double t1 = nb_now();
    nb_sc_batch b = part_of(t, k);
    if (t->samples_log) log_samples(t, k);
    nb_sc_prepare_part(&t->m, &b, k, t->M);
    double t2 = nb_now();
    if (t->sharded && t->ids_ahead) nb_emb_route_ids(&t->m.emb);
    double t3 = nb_now();
    if (t->pipelined) nb_emb_route_collisions(&t->m.emb);
    double t4 = nb_now();
    sc_ahead *a = &t->ahead[t->nahead++];
    *a = (sc_ahead){t->window_pos, t1 - t0, t4 - t1, t3 - t2, t4 - t3, t->m.stage_nh, b.B, 0, {0}};
    if (t->emulate) /* the shares' statistics: longest history, sums of L^a for the cost fit */
        for (int i = 0; i < b.B; i++) {
            a->max_len = b.hist_len[i] > a->max_len ? b.hist_len[i] : a->max_len;
            for (int j = 0; j < FIT_NA; j++) a->sum_pow[j] += pow((double)b.hist_len[i], fit_alpha(j));
        }
    t->next_u++;
}

/* parts prepared ahead of the one training: one, or two when the schedule fetches the next one
 * while this one trains (the host prepares the one after) */
static int lookahead(const sc_train *t) { return t->pipelined ? 2 : 1; }

/* Prepare parts up to `upto` (exclusive), never past the run's last. */
static void top_up(sc_train *t, long upto) {
    long total = (long)t->run->o.steps * t->M;
    while (t->next_u < upto && t->next_u < total) prefetch(t);
}

static int phase_named(const char *span, const char *phase);

/* Phases that serve the whole step, not one rank's share: the owners' sums and updates, the
 * re-sync after them, the dense optimizer. */
static int common_phase(const char *span) {
    static const nb_sc_phase common[] = {NB_SC_OPT_DENSE, NB_SC_EMB_SUM, NB_SC_RESYNC_SERVE, NB_SC_RESYNC_APPLY,
                                         NB_SC_OPT_EMB};
    for (size_t i = 0; i < sizeof common / sizeof common[0]; i++)
        if (phase_named(span, nb_sc_phase_name(common[i]))) return 1;
    return 0;
}

/* The compute lane's busy seconds in the step's spans recorded since the last call: a rank's (or
 * an emulated rank's) compute time for its share, the common phases left out. */
static double part_busy(nb_run *r, sc_train *t) {
    const nb_span *sp;
    size_t n = nb_lanes_spans(r->lanes, &sp);
    int lane = nb_lane_index(r->compute);
    double busy = 0;
    for (size_t i = t->span_seen; i < n; i++) {
        if (sp[i].step != t->step) continue;
        int comm = sp[i].kind == NB_SPAN_COMM, common = !comm && sp[i].lane == lane && common_phase(sp[i].name);
        if (comm || common)
            t->step_shared_s += sp[i].t1 - sp[i].t0;
        else if (sp[i].lane == lane)
            busy += sp[i].t1 - sp[i].t0;
    }
    t->span_seen = n;
    return busy;
}

static void add_fit_record(sc_train *t, const sc_ahead *a) {
    if (t->nfit == t->fit_cap) return;
    double *f = t->fit + (size_t)t->nfit++ * FIT_REC;
    f[0] = a->B, f[1] = -1; /* the time comes when the part has run */
    memcpy(f + 2, a->sum_pow, sizeof a->sum_pow);
}

/* The step's ranks (emulated: the parts; real: every rank's busy time, all-gathered): the
 * straggler share (max - mean) / max, the ranks' idle share of the synchronous step, and for
 * emulated ranks the step they stand for: the slowest share plus what the step did besides the
 * shares (the communication, the owners' updates, the optimizer). */
static void rank_times(nb_run *r, sc_train *t, int step) {
    int N = t->emulate ? t->M : r->world;
    if (N < 2) return;
    double mine = 0, *all = t->rank_s;
    for (int k = 0; k < t->M; k++) mine += t->part_s[k];
    if (t->emulate)
        memcpy(all, t->part_s, (size_t)N * sizeof(double));
    else
        nb_comm_all_gather_host(&mine, all, sizeof(double), "rank times");
    double mx = 0, sum = 0, longest = 0;
    int slowest = 0;
    for (int k = 0; k < N; k++) {
        if (all[k] > mx) mx = all[k], slowest = k;
        sum += all[k];
        if (t->emulate) longest = fmax(longest, t->part_maxlen[k]);
    }
    t->step_slow_long = t->emulate && t->part_maxlen[slowest] == longest;
    t->step_slow_n = t->emulate ? (int)t->part_n[slowest] : 0;
    /* emulated: the slowest share, then what every rank waits for together (the exchanges, the
     * owners' updates, the optimizer), as their spans measured them */
    double mean = sum / N, sync = t->emulate ? mx + t->step_shared_s : r->last_secs;
    t->step_strag = mx > 0 ? 100 * (mx - mean) / mx : 0;
    t->step_rank_bubble = sync > 0 ? 100 * (mx - mean) / sync : 0;
    t->step_emul_s = sync, t->step_max_s = mx, t->step_mean_s = mean;
    if (t->emulate && step >= nb_step_warmup(r->o.steps) && t->nfit >= t->M)
        for (int k = 0; k < t->M; k++) t->fit[(size_t)(t->nfit - t->M + k) * FIT_REC + 1] = t->part_s[k];
    if (step >= nb_step_warmup(r->o.steps)) {
        t->strag_sum += t->step_strag, t->rank_bubble_sum += t->step_rank_bubble, t->nslow_long += t->step_slow_long;
        t->nslow_alone += t->step_slow_long && t->step_slow_n == 1;
        if (t->nstrag < r->o.steps) t->strag_steps[t->nstrag] = t->step_strag, t->bubble_steps[t->nstrag++] = t->step_rank_bubble;
    }
}

/* The next part becomes the step's: prepared (with the one a pipelining schedule fetches while it
 * trains), its statistics counted, its ids routed now when the schedule does not route ahead. */
static void pop_part(nb_run *r, sc_train *t, int step) {
    top_up(t, t->popped_u + 1 + (t->pipelined ? 1 : 0));
    t->part_nh[t->part_k] = t->ahead[0].nh, t->part_maxlen[t->part_k] = t->ahead[0].max_len, t->part_n[t->part_k] = t->ahead[0].B;
    if (t->emulate && step >= nb_step_warmup(r->o.steps)) add_fit_record(t, &t->ahead[0]);
    if (step >= nb_step_warmup(r->o.steps)) {
        t->hist_rows += (double)t->ahead[0].nh;
        t->host.samples += t->ahead[0].fill_s, t->host.prep += t->ahead[0].prep_s;
        t->host.ids += t->ahead[0].ids_s, t->host.coll += t->ahead[0].coll_s;
    }
    for (int k = 1; k < t->nahead; k++) t->ahead[k - 1] = t->ahead[k];
    t->nahead--;
    t->popped_u++;
    if (t->sharded && !t->ids_ahead) { /* the synchronous baseline: in line */
        double t0 = nb_now();
        nb_emb_route_ids(&t->m.emb);
        if (step >= nb_step_warmup(r->o.steps)) t->host.ids_in_step += nb_now() - t0;
    }
    nb_sc_begin_step(&t->m);
}

/* The rows the part that ran moved (device lists: counted on the device, so after it ran). */
static void count_rows(sc_train *t) {
    int distinct, resynced;
    nb_sc_batch_rows(&t->m, &distinct, &resynced);
    t->step_rows += distinct, t->step_resynced += resynced;
    if (t->m.emb.priority) t->step_ahead += nb_sc_rows_ahead(&t->m);
}

static void sc_begin_step(nb_run *r, int step) {
    sc_train *t = T(r);
    const nb_train_opts *o = &r->o;
    if (!t->nsteps) t->t_start = nb_now();
    const nb_span *sp;
    t->span_seen = nb_lanes_spans(r->lanes, &sp);
    t->part_k = 0, t->step_shared_s = 0;
    if (!t->next_u) t->next_u = t->popped_u = (long)step * t->M; /* a resumed run starts at its step */
    t->step_rows = t->step_resynced = t->step_ahead = 0;
    pop_part(r, t, step);
    t->step = step;
    /* a constant learning rate unless --warmup / --min-lr-frac say otherwise */
    r->lr = nb_lr_cosine(step, nb_train_warmup_steps(o), o->steps, o->lr, o->lr * o->min_lr_frac);
    t->optim.lr = r->lr;
    nb_sc_optim_prepare(&t->m, &t->optim, step + 1);
}

/* Part k > 0 of the step's window (the run waited for part k - 1: its spans are in). */
static void sc_begin_micro(nb_run *r, int k) {
    if (k == 0) return;
    sc_train *t = T(r);
    t->part_s[k - 1] = part_busy(r, t);
    count_rows(t);
    t->part_k = k;
    pop_part(r, t, t->step);
}

/* the next part (pipelined: the one after it) is made on the host while this one runs */
static void sc_overlap(nb_run *r, int step) {
    (void)step;
    sc_train *t = T(r);
    top_up(t, t->popped_u + lookahead(t));
}

/* "dense fwd 3" is a span of the phase "dense fwd" */
static int phase_named(const char *span, const char *phase) {
    size_t n = strlen(phase);
    return !strncmp(span, phase, n) && (span[n] == 0 || span[n] == ' ');
}

/* Adds the step's span durations to their phase (spans are named by nb_sc_phase_name). */
static void add_breakdown(nb_lanes *lanes, int step, double *phase_s) {
    const nb_span *sp;
    size_t n = nb_lanes_spans(lanes, &sp);
    for (size_t i = 0; i < n; i++)
        for (int p = 0; p < NB_SC_NPHASES && sp[i].step == step; p++)
            if (phase_named(sp[i].name, nb_sc_phase_name(p))) phase_s[p] += sp[i].t1 - sp[i].t0;
}

static void sc_end_step(nb_run *r, int step, nb_mark done) {
    (void)done;
    sc_train *t = T(r);
    r->loss = nb_sc_loss(&t->m); /* this rank's share of the global batch's mean */
    r->loss_sum = r->loss * r->o.batch;
    double sumsq = 0;
    if (r->o.grad_clip > 0) r->be->to_host(&t->ctx, &sumsq, t->m.d_loss + 1, sizeof sumsq);
    r->grad_norm = (float)sqrt(sumsq);
    t->part_s[t->part_k] = part_busy(r, t);
    count_rows(t);
    rank_times(r, t, step);
    if (t->nsteps < r->o.steps) t->emul_secs[t->nsteps] = t->step_emul_s;
    if (t->nsteps < r->o.steps) t->step_secs[t->nsteps++] = r->last_secs;
    if (step >= nb_step_warmup(r->o.steps)) {
        add_breakdown(r->lanes, step, t->phase_s);
        t->overlap_sum += r->last_stats.overlap_pct;
    }
}

/* Sharded: a forward of an evaluation batch through the run's lanes (the rows come from their
 * owners, like a training step's); logits[b->B] on the host. */
static void sharded_forward(nb_run *r, sc_train *t, const nb_sc_batch *b, float *logits) {
    int ahead = nb_sc_prepare_aside(&t->m, b);
    nb_emb_route_ids(&t->m.emb);
    nb_sc_begin_aside(&t->m);
    nb_items_run(r, &r->items.pre, r->compute, t->step);
    nb_items_run(r, &r->items.input, r->compute, t->step);
    for (int k = 0; k < t->m.nseg; k++) nb_items_run(r, &r->items.fwd[k], r->compute, t->step);
    nb_mark_wait_host(nb_lane_mark(r->compute));
    nb_sc_logits(&t->m, logits);
    nb_sc_end_aside(&t->m, ahead);
}

/* Sharded: the held-out set in rounds of one global batch, split over the ranks (a rank with no
 * sample left in a round scores a stand-in it drops: every rank takes part in each exchange);
 * the scores are gathered, so every rank computes the same NE and AUC. */
static void sharded_scores(nb_run *r, sc_train *t, long n, float *logit, float *label) {
    int N = r->world;
    long round = (long)t->Bm * N; /* every rank scores at most one part's samples at a time */
    float *mine = nb_malloc((size_t)t->Bm * sizeof(float), "evaluation scores");
    float *all = nb_malloc((size_t)t->Bm * N * sizeof(float), "evaluation scores");
    for (long first = 0; first < n; first += round) {
        long cnt = n - first < round ? n - first : round, per = (cnt + N - 1) / N;
        long from = first + r->rank * per, own = cnt - r->rank * per;
        own = own < 0 ? 0 : own > per ? per : own;
        nb_ctr_fill_eval(&t->src, &t->batch, own ? from : first, own ? (int)own : 1);
        nb_sc_batch b = t->batch.b;
        b.label = NULL;
        sharded_forward(r, t, &b, mine);
        nb_comm_all_gather_host(mine, all, (size_t)per * sizeof(float), "evaluation scores");
        for (int k = 0; k < N; k++) {
            long at = first + k * per, len = cnt - k * per;
            len = len < 0 ? 0 : len > per ? per : len;
            if (len) memcpy(logit + at, all + (size_t)k * per, (size_t)len * sizeof(float));
        }
    }
    for (long first = 0; first < n; first += t->Bm) { /* the labels: the held-out set is the same on every rank */
        int B = (int)(n - first < t->Bm ? n - first : t->Bm);
        nb_ctr_fill_eval(&t->src, &t->batch, first, B);
        memcpy(label + first, t->batch.label, (size_t)B * sizeof(float));
    }
    free(mine), free(all);
}

static void sc_evaluate(nb_run *r, nb_eval *ev) {
    sc_train *t = T(r);
    long n = nb_ctr_eval_count(&t->src);
    float *logit = nb_malloc((size_t)n * sizeof(float), "evaluation scores");
    float *label = nb_malloc((size_t)n * sizeof(float), "evaluation labels");
    if (t->sharded) {
        sharded_scores(r, t, n, logit, label);
    } else {
        for (long first = 0; first < n; first += t->Bl) {
            int B = (int)(n - first < t->Bl ? n - first : t->Bl);
            nb_ctr_fill_eval(&t->src, &t->batch, first, B);
            nb_sc_batch b = t->batch.b;
            b.label = NULL;
            nb_sc_forward(&t->m, &b, logit + first);
            memcpy(label + first, t->batch.label, (size_t)B * sizeof(float));
        }
    }
    *ev = finish_eval(logit, label, n, 1);
    free(logit);
    free(label);
}

static void sc_print_eval(const nb_run *r, int step, const nb_eval *ev) {
    (void)r;
    print_eval_line("eval", step, ev);
}

static void sc_metrics(const nb_run *r, nb_json_writer *w, double secs, const nb_eval *ev) {
    (void)secs;
    const sc_train *t = CT(r);
    nb_json_knum(w, "lr", r->lr);
    if (t->sharded) { /* this rank's step (its parts): the distinct rows it fetched, and those fetched again */
        nb_json_kint(w, "rows_moved", t->step_rows);
        if (t->pipelined) nb_json_kint(w, "rows_resynced", t->step_resynced);
        if (t->m.emb.priority) nb_json_kint(w, "rows_ahead", t->step_ahead);
    } else { /* the step's distinct table rows (their gradients and updates) */
        nb_json_kint(w, "unique_rows", t->step_rows);
    }
    if (r->o.grad_clip > 0) nb_json_knum(w, "grad_norm", r->grad_norm);
    if (t->emulate || r->world > 1) { /* the ranks' compute (busy) times of this step */
        nb_json_knum(w, "straggler_pct", t->step_strag);
        nb_json_knum(w, "rank_bubble_pct", t->step_rank_bubble);
        nb_json_knum(w, "rank_ms_max", 1e3 * t->step_max_s);
        nb_json_knum(w, "rank_ms_mean", 1e3 * t->step_mean_s);
        if (t->emulate) nb_json_knum(w, "emulated_ms", 1e3 * t->step_emul_s);
        if (t->emulate) nb_json_kint(w, "slowest_holds_longest", t->step_slow_long);
        if (t->emulate) nb_json_kint(w, "slowest_samples", t->step_slow_n);
    }
    if (ev && ev->done) {
        nb_json_knum(w, "eval_loss", ev->loss);
        if (isfinite(ev->ne)) nb_json_knum(w, "eval_ne", ev->ne);
        if (isfinite(ev->auc)) nb_json_knum(w, "eval_auc", ev->auc);
    }
}

static void sc_metrics_losses(const nb_json *line, double *loss, double *held_out) {
    *loss = nb_json_get_num(line, "loss", NAN);
    *held_out = nb_json_get_num(line, "eval_loss", NAN);
}

static size_t sc_data_pos(const nb_run *r) {
    const sc_train *t = CT(r);
    return t->nahead ? t->ahead[0].pos : nb_ctr_source_position(&t->src);
}

static void sc_sync_to_host(nb_run *r) { nb_sc_to_host(&T(r)->m); }

static void table_name(char *buf, size_t cap, int t, const char *suffix) {
    if (t == NB_SC_ITEM_TABLE)
        snprintf(buf, cap, "emb.item%s", suffix);
    else
        snprintf(buf, cap, "emb.cat.%d%s", t, suffix);
}

/* seqctr.h's names: the dense tensors, emb.cat.{f} [rows_f, E] and emb.item [item_rows, E]; the
 * optimizer state "<name>.exp_avg" / ".exp_avg_sq" (AdamW; sparse Adam on the tables) or
 * "<table>.adagrad_sum" [rows] (row-wise Adagrad) */
static void sc_ckpt_tensors(nb_run *r, nb_ckpt_list *model, nb_ckpt_list *optim) {
    nb_sc_model *m = &T(r)->m;
    int E = m->cfg.E;
    char name[96];
    for (int i = 0; i < m->ntensors; i++) {
        const nb_sc_tensor *t = &m->t[i];
        int64_t sh[2] = {t->rows, t->cols};
        int nd = t->cols == 1 ? 1 : 2;
        nb_ckpt_list_add(model, t->name, nd, sh, m->params + t->off);
        if (!optim) continue;
        snprintf(name, sizeof name, "%s.exp_avg", t->name);
        nb_ckpt_list_add(optim, name, nd, sh, m->am + t->off);
        snprintf(name, sizeof name, "%s.exp_avg_sq", t->name);
        nb_ckpt_list_add(optim, name, nd, sh, m->av + t->off);
    }
    /* the tables of a sharded run: each rank's shard (sc_shard_tensors; assemble_shards reads them all) */
    if (T(r)->sharded || (r->eval_only && shard_opts(&r->o, r->ckpt_world))) return;
    for (int t = 0; t < NB_SC_NTABLES; t++) {
        int64_t rows = m->emb_off[t + 1] - m->emb_off[t], sh[2] = {rows, E};
        size_t at = (size_t)m->emb_off[t] * (size_t)E;
        table_name(name, sizeof name, t, "");
        nb_ckpt_list_add(model, name, 2, sh, m->emb.table + at);
        if (!optim) continue;
        if (m->emb.acc) {
            table_name(name, sizeof name, t, ".adagrad_sum");
            nb_ckpt_list_add(optim, name, 1, sh, m->emb.acc + m->emb_off[t]);
        }
        if (m->emb.avg) {
            table_name(name, sizeof name, t, ".exp_avg");
            nb_ckpt_list_add(optim, name, 2, sh, m->emb.avg + at);
            table_name(name, sizeof name, t, ".exp_avg_sq");
            nb_ckpt_list_add(optim, name, 2, sh, m->emb.avg_sq + at);
        }
    }
}

/* Sharded: this rank's rows of every table (global row g = i * world + rank at row i, g as
 * seqctr.h's table offset + row) and their optimizer state. */
static int sc_shard_tensors(nb_run *r, nb_ckpt_list *shard) {
    sc_train *t = T(r);
    if (!t || !t->sharded) return 0;
    if (!shard) return 1;
    nb_sc_model *m = &t->m;
    int64_t sh[2] = {m->emb.rows, m->cfg.E};
    nb_ckpt_list_add(shard, "emb.shard", 2, sh, m->emb.table);
    if (m->emb.acc) nb_ckpt_list_add(shard, "emb.shard.adagrad_sum", 1, sh, m->emb.acc);
    if (m->emb.avg) {
        nb_ckpt_list_add(shard, "emb.shard.exp_avg", 2, sh, m->emb.avg);
        nb_ckpt_list_add(shard, "emb.shard.exp_avg_sq", 2, sh, m->emb.avg_sq);
    }
    return 1;
}

/* A sharded checkpoint read by one process (eval, export, sample): every rank's rows into the
 * whole tables. */
static void assemble_shards(nb_run *r, const char *dir) {
    nb_sc_model *m = &T(r)->m;
    int N = r->ckpt_world;
    int64_t total = m->emb_off[NB_SC_NTABLES], E = m->cfg.E;
    char path[NB_PATH_MAX + 96];
    for (int k = 0; k < N; k++) {
        int64_t rows = (total - k + N - 1) / N, sh[2] = {rows, E};
        float *buf = nb_malloc((size_t)(rows ? rows : 1) * (size_t)E * sizeof(float), "a table shard");
        nb_ckpt_list l = {0};
        nb_ckpt_list_add(&l, "emb.shard", 2, sh, buf);
        nb_ckpt_shard_path(path, sizeof path, dir, k, N);
        nb_ckpt_load_file(path, &l);
        for (int64_t i = 0; i < rows; i++)
            memcpy(m->emb.table + (size_t)(i * N + k) * (size_t)E, buf + (size_t)i * (size_t)E, (size_t)E * sizeof(float));
        nb_ckpt_list_free(&l);
        free(buf);
    }
}

static void sc_write_config(const nb_train_opts *o, nb_json_writer *w) {
    const nb_sc_config *c = &o->ctr;
    nb_json_key(w, "model");
    nb_json_begin_obj(w);
    nb_json_kstr(w, "preset", "seqctr");
    nb_json_kint(w, "E", c->E);
    nb_json_kint(w, "hist_layers", c->hist_layers);
    nb_json_kint(w, "heads", c->heads);
    nb_json_kint(w, "blocks", c->blocks);
    nb_json_kint(w, "cross_rank", c->cross_rank);
    nb_json_kint(w, "block_hidden", c->block_hidden);
    nb_json_kint(w, "max_len", c->max_len);
    nb_json_end_obj(w);
}

static int req_int(const nb_json *j, const char *key, int lo, int hi) {
    int64_t v = nb_json_req_int(j, key);
    NB_CHECK(v >= lo && v <= hi, "the checkpoint is damaged: resume from an earlier copy of the run directory",
             "state.json: model field '%s' is %lld, outside %d..%d", key, (long long)v, lo, hi);
    return (int)v;
}

static void sc_read_config(const nb_json *j, nb_train_opts *o) {
    nb_sc_config *c = &o->ctr;
    c->E = req_int(j, "E", 1, 1 << 16);
    c->hist_layers = req_int(j, "hist_layers", 0, 1024);
    c->heads = req_int(j, "heads", 1, 1 << 16);
    c->blocks = req_int(j, "blocks", 1, NB_SC_MAX_BLOCKS);
    c->cross_rank = req_int(j, "cross_rank", 1, 1 << 20);
    c->block_hidden = req_int(j, "block_hidden", 1, 1 << 20);
    c->max_len = req_int(j, "max_len", 0, 65536);
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

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median_of(const double *v, int n) {
    if (n <= 0) return 0;
    double *c = nb_malloc((size_t)n * sizeof *c, "a median");
    memcpy(c, v, (size_t)n * sizeof *c);
    qsort(c, (size_t)n, sizeof *c, cmp_double);
    double m = n % 2 ? c[n / 2] : 0.5 * (c[n / 2 - 1] + c[n / 2]);
    free(c);
    return m;
}

/* Least squares of the parts' times t = k + x n + y sum L^a for each exponent a of the grid (k:
 * what every part costs whatever its samples, launches and fixed-size kernels: no placement moves
 * it). The best fit's a and c0 = x / y (a sample's own cost in units of L^a) are what --balance
 * vbs:a:c0 takes. */
static void print_cost_fit(const sc_train *t) {
    int best = -1, equal = 0;
    double best_sse = 0, bk = 0, bx = 0, by = 0, sst = 0, mean = 0, n = 0;
    for (int i = 0; i < t->nfit; i++)
        if (t->fit[(size_t)i * FIT_REC + 1] >= 0) mean += t->fit[(size_t)i * FIT_REC + 1], n++;
    if (n < 6) return;
    mean /= n;
    for (int j = 0; j < FIT_NA; j++) {
        double A[3][3] = {{0}}, Y[3] = {0}, X[3], sse = 0;
        for (int i = 0; i < t->nfit; i++) {
            const double *f = t->fit + (size_t)i * FIT_REC, v[3] = {1, f[0], f[2 + j]};
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
        for (int i = 0; i < t->nfit; i++) {
            const double *f = t->fit + (size_t)i * FIT_REC;
            double e = f[1] - X[0] - X[1] * f[0] - X[2] * f[2 + j];
            if (f[1] >= 0) sse += e * e;
        }
        if (best < 0 || sse < best_sse) best = j, best_sse = sse, bk = X[0], bx = X[1], by = X[2];
    }
    for (int i = 0; i < t->nfit; i++) {
        const double *f = t->fit + (size_t)i * FIT_REC;
        if (f[1] >= 0) sst += (f[1] - mean) * (f[1] - mean);
    }
    if (best < 0) {
        printf("cost fit: no fit of part time = k + x samples + y sum L^a (y > 0) over %.0f parts\n", n);
        return;
    }
    printf("cost fit: part time = %.4g ms + %.4g ms/sample + %.4g ms * sum L^%.1f over %.0f parts (R^2 %.3f): --balance "
           "vbs:%.1f:%.0f\n", 1e3 * bk, 1e3 * bx, 1e3 * by, fit_alpha(best), n, sst > 0 ? 1 - best_sse / sst : 1.0,
           fit_alpha(best), fmin(fmax(bx / by, 0), 1e12));
    if (equal) printf("cost fit: the parts had equal sample counts, so the fixed per-part cost is counted per sample (C0 is an upper bound)\n");
}

/* The ranks' compute: straggler and idle shares; for emulated ranks the synchronous step they
 * stand for, and the cost fit of their shares' times. */
static void print_rank_times(const nb_run *r, const sc_train *t, int measured) {
    printf("ranks: %d%s, straggler_pct=%.2f rank_bubble_pct=%.2f (mean over %d steps), median_straggler_pct=%.2f "
           "median_rank_bubble_pct=%.2f; straggler = (max - mean) / max of the ranks' compute\n", t->emulate ? t->emulate : r->world,
           t->emulate ? " emulated (one GPU, one after another)" : "", t->strag_sum / measured, t->rank_bubble_sum / measured,
           measured, median_of(t->strag_steps, t->nstrag), median_of(t->bubble_steps, t->nstrag));
    if (!t->emulate) return;
    printf("ranks: the slowest share held the step's longest history in %d of %d steps, and nothing else in %d (no placement "
           "splits a sample: those steps' straggler share is the least any placement leaves)\n", t->nslow_long, measured, t->nslow_alone);
    nb_step_times st = nb_step_times_of(t->emul_secs, t->nsteps);
    if (st.n)
        printf("emulated steps=%d p90_step_ms=%.3f median_step_ms=%.3f p90_samples_per_s=%.0f (the slowest rank's share + "
               "the step's communication and common phases)\n", st.n, 1e3 * st.p90, 1e3 * st.median, r->o.batch / st.p90);
    print_cost_fit(t);
}

/* The summary lines the benchmarks and tests read (stdout), after the run's own. */
static void sc_summary(nb_run *r, int steps_run) {
    sc_train *t = T(r);
    const nb_train_opts *o = &r->o;
    int n = t->nsteps, warm = nb_step_warmup(o->steps), measured = n - warm;
    double secs = nb_now() - t->t_start;
    if (n > 0)
        printf("train steps=%d samples_per_s=%.0f (including evaluation)\n", n, (double)n * o->batch / (secs > 0 ? secs : 1e-9));
    nb_step_times st = nb_step_times_of(t->step_secs, n);
    if (st.n)
        printf("throughput steps=%d warmup=%d p90_samples_per_s=%.0f median_samples_per_s=%.0f p90_step_ms=%.3f\n", st.n,
               st.warmup, o->batch / st.p90, o->batch / st.median, 1e3 * st.p90);
    if (measured > 0) {
        double total = 0, busy = 0;
        for (int p = 0; p < NB_SC_NPHASES; p++) total += t->phase_s[p];
        printf("breakdown ms/step%s:", r->world > 1 ? " (rank 0)" : "");
        for (int p = 0; p < NB_SC_NPHASES; p++) printf(" %s=%.3f", nb_sc_phase_name(p), 1e3 * t->phase_s[p] / measured);
        printf(" total=%.3f\n", 1e3 * total / measured);
        printf("host ms/step (overlapped with the step before): samples=%.3f index_lists=%.3f (lists %.3f, ids routed %.3f, "
               "collisions %.3f); in the step: ids routed %.3f\n", 1e3 * t->host.samples / measured, 1e3 * t->host.prep / measured,
               1e3 * (t->host.prep - t->host.ids - t->host.coll) / measured, 1e3 * t->host.ids / measured,
               1e3 * t->host.coll / measured, 1e3 * t->host.ids_in_step / measured);
        if (t->m.nseg > 1)
            printf("overlap: %.1f%% of the step had two or more lanes busy (mean over the measured steps)\n",
                   t->overlap_sum / measured);
        double fl = nb_sc_flops(&t->m, t->Bl, (long)(t->hist_rows / measured));
        for (int p = 0; p < NB_SC_NPHASES; p++) busy += t->phase_s[p];
        printf("flops: %.1f GFLOP/step%s (matmuls, forward + backward, %.1f history rows per sample); %.1f TFLOP/s over "
               "the phases\n", fl / 1e9, r->world > 1 ? " on rank 0" : "", t->hist_rows / measured / t->Bl,
               busy > 0 ? fl * measured / busy / 1e12 : 0.0);
    }
    (void)steps_run;
    if (measured > 0 && (t->emulate || r->world > 1)) print_rank_times(r, t, measured);
    if (t->src.kind == NB_CTR_SYNTH) { /* the best any model can do on this evaluation range */
        long ne = o->eval_samples;
        float *tl = nb_malloc((size_t)ne * sizeof(float), "teacher logits"), *lab = nb_malloc((size_t)ne * sizeof(float), "labels");
        nb_synth_teacher_logit(t->src.g, NB_CTR_EVAL_BASE, (int)ne, tl);
        nb_synth_fill(t->src.g, NB_CTR_EVAL_BASE, (int)ne, NULL, NULL, NULL, NULL, NULL, lab, NULL);
        nb_eval te = finish_eval(tl, lab, ne, 1);
        print_eval_line("teacher", o->steps, &te);
        free(tl), free(lab);
    }
    if (t->src.kind == NB_CTR_MOVIELENS) {
        long ne = nb_ctr_eval_count(&t->src);
        float *score = nb_malloc((size_t)ne * sizeof(float), "popularity");
        nb_ctr_popularity_scores(&t->src, score);
        nb_eval pb = finish_eval(score, t->src.eval.label, ne, 0);
        print_eval_line("baseline-popularity", o->steps, &pb);
        free(score);
    }
}

int nb_sc_export(nb_run *r, const char *path) {
    sc_train *t = T(r);
    nb_sc_to_host(&t->m);
    nb_sc_save(&t->m, path);
    return t->m.ntensors + NB_SC_NTABLES;
}

/* Device steps are captured per history-row bucket (seqctr.c pads the rows); the CPU backend
 * replays a graph by running its tasks, which read each batch's sizes: one graph. */
static int sc_graph_key(nb_run *r) {
    const nb_sc_model *m = &T(r)->m;
    if (r->be->device == NB_DEV_CPU) return 0;
    /* pipelined: each ring slot has its own device lists and work buffer */
    return m->emb.pipelined ? nb_sc_prepared_rows(m) * NB_SC_RING + nb_sc_current_slot(m) : nb_sc_prepared_rows(m);
}

static const char *sc_model_name(const nb_train_opts *o) {
    (void)o;
    return "seqctr";
}

const nb_family_i nb_family_seqctr = {
    .name = "seqctr",
    .unit = "samples",
    .loss_unit = "BCE",
    .held_out = "held-out loss",
    .model_name = sc_model_name,
    .check = sc_check,
    .init = sc_init,
    .start = sc_start,
    .free = sc_free,
    .per_step = sc_per_step,
    .begin_step = sc_begin_step,
    .overlap = sc_overlap,
    .overlap_micro = sc_overlap,
    .begin_micro = sc_begin_micro,
    .end_step = sc_end_step,
    .evaluate = sc_evaluate,
    .metrics = sc_metrics,
    .metrics_losses = sc_metrics_losses,
    .print_eval = sc_print_eval,
    .data_pos = sc_data_pos,
    .sync_to_host = sc_sync_to_host,
    .ckpt_tensors = sc_ckpt_tensors,
    .write_config = sc_write_config,
    .read_config = sc_read_config,
    .summary = sc_summary,
    .graph_key = sc_graph_key,
    .wants_comm = sc_wants_comm,
    .fetches_ahead = 1,
    .shard_tensors = sc_shard_tensors,
};
