/* The seqctr family: the seqctr model (model/seqctr.h) in a run. It binds the model into the
 * run's arenas, gives its step as work items (the model's phases; with sharded tables the
 * embedding module's exchanges as hooks on the comm lane), feeds it its data, and evaluates and
 * checkpoints it. Its files:
 *
 *   seqctr.c           the family table, its options and plan (ranks, sharding, --balance,
 *                      --emulate-ranks, Frozen-Window Pipelining's parts), the work items, a step's
 *                      host side (begin, micro-batches, end) and its metrics
 *   seqctr_prefetch.c  the parts made ready ahead of the step that trains them: samples, index
 *                      lists, the keys routed to their owners (NestPipe's stages 1 and 3)
 *   seqctr_eval.c      held-out NE and AUC (run/evalmetrics.c), sharded or not
 *   seqctr_ckpt.c      checkpoint tensors, shards, resume, export, the shape in state.json
 *   seqctr_stats.c     straggler statistics, the cost fit's records, the summary lines
 *
 * Metrics: metrics.jsonl, one line per step: step, loss, lr, ms, samples_per_s, bubble_pct,
 * overlap_pct, plus eval_loss, eval_ne, eval_auc on evaluation steps. NE = mean BCE / H(p) with p
 * the evaluation set's positive rate; AUC exact (ties get the average rank). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "core.h"
#include "family/seqctr_family.h"
#include "host.h"
#include "step/step_stats.h"

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
    /* unsharded element-wise Adagrad: applied in the embedding backward as each row's gradient
     * completes (one pass over the gradients instead of a write and a read) */
    t->m.emb_update_in_bwd = !t->sharded && t->optim.emb_exact;
    if (!t->m.emb_update_in_bwd) add_fixed(&it->post, t, NB_SC_OPT_EMB);
    /* pipelined with whole tables: only the next batch's lists go in ahead (the step's lookups
     * read the tables themselves, after the update before them: nothing to re-sync) */
    if (t->pipelined) add_next(&it->next, t, NB_SC_FWD_UPLOAD, "batch upload (next)");
    if (t->pipelined && t->sharded) {
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
    NB_CHECK(o->dense_optim != NB_DENSE_OPT_ADAGRAD || o->grad_clip <= 0, "drop --grad-clip with --dense-optim adagrad",
             "the dense Adagrad step has no global-norm clip (MLPerf's reference clips nothing)");
}

int nb_seqctr_shard_opts(const nb_train_opts *o, int world) {
    return o->emb_shard == NB_SHARD_ROW || (o->emb_shard == NB_SHARD_AUTO && world > 1);
}

/* Frozen-Window Pipelining's parts per window: --micro-batches M (--grad-accum K means the same
 * for this family: the tables update once per step, after the last part). */
static int fwp_parts(const nb_train_opts *o) { return o->micro_batches > 1 ? o->micro_batches : o->grad_accum; }

/* Do the tables go through the sharded exchange? With several ranks, under a prefetching schedule
 * unless --emb-shard none says whole tables (its work buffers are the dual buffers), and when a
 * step's parts (micro-batches, emulated ranks) sum their table gradients at the owners. (Whole
 * tables in host memory need none of it: the device reads and updates them in place.) */
static int uses_exchange(const nb_train_opts *o, int world, const nb_sched_traits *tr) {
    return nb_seqctr_shard_opts(o, world) || (tr->prefetches && o->emb_shard != NB_SHARD_NONE) || nb_train_parts(o) > 1;
}

static int sc_wants_comm(const nb_train_opts *o, const nb_sched_traits *t) { return uses_exchange(o, nb_comm_size(), t); }

/* --balance and --emulate-ranks: the shares, the window and the parts (micro-batches). */
static void plan_placement(nb_run *r, sc_train *t, int max_len, int ncat) {
    const nb_train_opts *o = &r->o;
    nb_balance bal;
    nb_balance_parse(&bal, o->balance);
    t->emulate = o->emulate_ranks > 1 ? o->emulate_ranks : 0;
    NB_CHECK(!t->emulate || r->world == 1, "run --emulate-ranks in one process (no mpirun)",
             "--emulate-ranks %d stands in for ranks on one GPU; this run has %d real ones", o->emulate_ranks, r->world);
    NB_CHECK(!t->emulate || fwp_parts(o) == 1, "drop --micro-batches with --emulate-ranks",
             "the emulated ranks' shares are the step's parts");
    NB_CHECK(!t->emulate || !o->graphs, "drop --graphs with --emulate-ranks",
             "each emulated rank is timed by its phases' spans; a graph replay is one span");
    NB_CHECK(bal.kind != NB_BALANCE_VBS || !o->graphs, "drop --graphs with --balance vbs",
             "vbs changes the per-rank batch size every step: a captured step would not replay");
    int shares = t->emulate ? t->emulate : r->world;
    /* the largest batch a part or the window holds, checked before anything is sized by it (a
     * --batch near INT_MAX would overflow the part arithmetic below) */
    int most = nb_balance_cap(&bal, o->batch, shares);
    nb_sc_check_batch_size(o->batch / r->world > most ? o->batch / r->world : most, max_len, ncat);
    NB_CHECK(o->batch % shares == 0, "pass a --batch divisible by the ranks (emulated ones too)",
             "--batch %d does not split over %d ranks", o->batch, shares);
    NB_CHECK(!o->cluster_keys || (bal.kind == NB_BALANCE_NONE && !t->emulate), "drop --cluster-keys with --balance / --emulate-ranks",
             "both decide where the samples go");
    NB_CHECK(!o->cluster_keys || !nb_sc_nmv(&o->ctr), "drop --cluster-keys with multi-valued columns",
             "--cluster-keys clusters by single-valued keys; the schema has multi-valued columns");
    nb_balance_placer_init(&t->place, &bal, o->batch, r->world, r->rank, t->emulate ? t->emulate : 1, max_len, &o->ctr);
    t->M = nb_train_parts(o);
    int wcap = nb_balance_placer_window_cap(&t->place);
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
static void plan_ranks(nb_run *r, sc_train *t, int max_len, int ncat) {
    const nb_train_opts *o = &r->o;
    t->pipelined = !r->eval_only && r->traits.prefetches;
    t->ids_ahead = r->traits.ids_ahead;
    int parts = nb_train_parts(o);
    t->sharded = !r->eval_only && uses_exchange(o, r->world, &r->traits);
    t->Bl = o->batch, t->first = 0, t->M = 1, t->Bm = o->batch;
    if (r->eval_only) return;
    NB_CHECK(parts == 1 || o->emb_shard != NB_SHARD_NONE, "drop --emb-shard none with --micro-batches / --emulate-ranks",
             "--micro-batches sums the window's table gradients at the owners: the tables go through the sharded exchange");
    NB_CHECK(!o->emb_priority || (t->pipelined && t->sharded), "add --schedule pipe (sharded tables) with --emb-priority",
             "--emb-priority orders the rows the pipe schedule fetches ahead: exclusive rows early, collision rows after the update");
    NB_CHECK(!o->emb_priority || !o->pipe_skip_resync, "drop --pipe-skip-resync with --emb-priority",
             "with --emb-priority the collision rows arrive only through the re-sync");
    NB_CHECK(r->world == 1 || t->sharded, "use --emb-shard row (the default with several ranks)",
             "--emb-shard none with %d ranks: every rank holding every row is not built (the ranks' row updates would have "
             "to be merged)", r->world);
    NB_CHECK(o->batch % r->world == 0, "pass a --batch (the global batch) divisible by the number of ranks",
             "--batch %d does not split evenly over %d ranks", o->batch, r->world);
    t->Bl = o->batch / r->world;
    t->first = r->rank * t->Bl;
    plan_placement(r, t, max_len, ncat);
    if (t->sharded && r->rank == 0)
        nb_log(1, "tables      row-wise sharded over %d rank%s (row g on rank g %% %d), --emb-place %s; %d samples per rank\n",
               r->world, r->world == 1 ? "" : "s", r->world,
               r->be->device == NB_DEV_CPU ? "- (the CPU backend: host memory)" : o->emb_place == NB_PLACE_HOST ? "host" : "gpu",
               t->Bl);
}

/* The plan, and where the tables' rows and optimizer state live (--emb-place). */
static void print_memory(const nb_run *r, const sc_train *t) {
    if (r->rank != 0 || nb_verbosity < 1) return;
    const nb_sc_model *m = &t->m;
    int opt = m->emb.opt;
    double per_row = (double)m->cfg.E * 4 * (opt == NB_SC_ADAM ? 3 : opt == NB_SC_ADAGRAD_EXACT ? 2 : 1) + (opt == NB_SC_ADAGRAD ? 4 : 0);
    char a[32], b[32], c[32], d[32];
    if (r->be->device == NB_DEV_CPU) { /* one memory: the plan's three arenas are all host memory */
        fprintf(stderr, "memory      %s planned in host memory (the CPU backend); table rows and their optimizer state: %s\n",
                nb_fmt_bytes(a, sizeof a, (double)(r->dev.planned + r->pinned.planned + r->host.planned)),
                nb_fmt_bytes(d, sizeof d, per_row * (double)m->emb.rows));
        return;
    }
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
    nb_ctr_source_opts so = {.data = o->data, .val_data = o->val_data, .schema = o->schema, .table_cap = o->table_cap,
                             .eval_samples = o->eval_samples, .strict = o->strict, .eval_only = r->eval_only,
                             .unlabeled = o->unlabeled, .shape_only = r->dry};
    nb_ctr_source_open(&t->src, &so, &mc);
    r->o.ctr.ndense = mc.ndense, r->o.ctr.ncat = mc.ncat; /* the shape state.json keeps */
    memcpy(r->o.ctr.pool, mc.pool, sizeof mc.pool);
    memcpy(r->o.ctr.mv_max, mc.mv_max, sizeof mc.mv_max);
    int emb_opt = o->emb_optim == NB_EMB_OPT_ADAM ? NB_SC_ADAM : o->emb_optim == NB_EMB_OPT_ADAGRAD_EXACT ? NB_SC_ADAGRAD_EXACT : NB_SC_ADAGRAD;
    plan_ranks(r, t, mc.max_len, mc.ncat);
    nb_emb_shard shard = {r->world, r->rank};
    nb_sc_plan_opts po = {.emb = {.opt = emb_opt, .shard = t->sharded ? shard : (nb_emb_shard){0, 0}, .pipelined = t->pipelined,
                                  .host = !r->eval_only && o->emb_place == NB_PLACE_HOST, .parts = t->M,
                                  .priority = o->emb_priority},
                          .lists = o->index_lists == NB_LISTS_HOST     ? NB_SC_LISTS_HOST
                                   : o->index_lists == NB_LISTS_DEVICE ? NB_SC_LISTS_DEVICE
                                                                        : NB_SC_LISTS_AUTO,
                          .full_mv = o->graphs};
    nb_sc_plan(&t->m, &mc, t->Bm, r->be, &po, &r->dev, &r->pinned, &r->host);
    t->m.loss_den = (float)o->batch; /* the loss and its gradient: means over the global batch */
    print_memory(r, t);
    if (r->dry) return; /* nobubble plan: the arenas' sizes are what it asked for */
    nb_run_alloc_arenas(r, "lower --batch, --max-len or --table-cap, or keep the tables in host memory (--emb-place host)");
    nb_run_on_compute(r, "bind lane", work_bind_ctx, t);
    nb_sc_bind(&t->m, &t->ctx);
    nb_ctr_batch_alloc(&t->batch, t->Bm, mc.max_len, mc.ndense, mc.ncat);
    nb_ctr_batch_alloc_mv(&t->batch, t->Bm, &mc);
    nb_seqctr_windows_alloc(t, &mc);
    t->part_s = nb_calloc(4 * (size_t)t->M, sizeof(double), "part times");
    t->part_nh = t->part_s + t->M, t->part_maxlen = t->part_s + 2 * (size_t)t->M, t->part_n = t->part_s + 3 * (size_t)t->M;
    t->emul_secs = nb_calloc((size_t)o->steps, sizeof(double), "step times");
    t->strag_steps = nb_calloc(2 * (size_t)o->steps, sizeof(double), "straggler times");
    t->bubble_steps = t->strag_steps + o->steps;
    t->rank_s = nb_calloc((size_t)(r->world > t->M ? r->world : t->M), sizeof(double), "rank times");
    if (t->emulate) nb_balance_fit_init(&t->fit, o->steps * t->M);
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
                             .emb_eps = 1e-8f, .emb_adam = emb_opt == NB_SC_ADAM, .emb_exact = emb_opt == NB_SC_ADAGRAD_EXACT,
                             .dense_adagrad = o->dense_optim == NB_DENSE_OPT_ADAGRAD};
    t->step_secs = nb_malloc((size_t)o->steps * sizeof(double), "step times");
    build_items(r, t);
    size_t rows = (size_t)nb_sc_total_rows(&t->m);
    if (nb_verbosity > 0 && nb_sc_dlrm(&mc)) {
        char top[16 * NB_SC_MAX_TOP];
        nb_sc_top_string(&mc, top, sizeof top);
        fprintf(stderr, "dlrm-dcnv2  E %d, bottom %d-%d-%d-%d, %d crosses of rank %d on %d, top %s,1; %.2f M dense parameters, "
                        "%.2f M embedding rows (%.1f GB fp32); %.1f MFLOP/sample; %s (%s); index lists on the %s\n",
                mc.E, mc.ndense, NB_SC_BOTTOM1, NB_SC_BOTTOM2, mc.E, mc.blocks, mc.cross_rank, (mc.ncat + 1) * mc.E, top,
                t->m.nparams_used / 1e6, (double)rows / 1e6, (double)rows * mc.E * 4 / 1e9, nb_sc_flops(&t->m, 1, 0) / 1e6,
                r->be->name, r->backend->desc, t->m.dev_lists ? "device" : "host");
    } else if (nb_verbosity > 0)
        fprintf(stderr, "seqctr      E %d, %d hist layers, %d blocks, rank %d, hidden %d, max_len %d; %d dense and %d categorical inputs; %.2f M dense, %.2f M embedding rows; %s (%s); index lists on the %s\n",
                mc.E, mc.hist_layers, mc.blocks, mc.cross_rank, mc.block_hidden, mc.max_len, mc.ndense, mc.ncat, t->m.nparams_used / 1e6,
                (double)rows / 1e6, r->be->name, r->backend->desc, t->m.dev_lists ? "device" : "host");
}

static void sc_free(nb_run *r) {
    sc_train *t = T(r);
    if (!t) return;
    nb_ctr_batch_free(&t->batch);
    nb_seqctr_windows_free(t); /* first: its loader reads the source and the placer */
    nb_balance_placer_free(&t->place);
    nb_balance_fit_free(&t->fit);
    free(t->part_s), free(t->emul_secs), free(t->strag_steps), free(t->rank_s);
    if (t->samples_log) fclose(t->samples_log);
    nb_sc_free(&t->m);
    nb_ctr_source_close(&t->src);
    free(t->step_secs);
    free(t);
    r->fs = NULL;
}

static double sc_per_step(const nb_run *r) { return (double)r->o.batch; }

static void sc_begin_step(nb_run *r, int step) {
    sc_train *t = T(r);
    const nb_train_opts *o = &r->o;
    if (!t->nsteps) t->t_start = nb_now();
    const nb_span *sp;
    t->span_seen = nb_lanes_spans(r->lanes, &sp);
    t->part_k = 0, t->step_shared_s = 0;
    if (!t->next_u) t->next_u = t->popped_u = (long)step * t->M; /* a resumed run starts at its step */
    t->step_rows = t->step_resynced = t->step_ahead = 0;
    nb_seqctr_pop_part(r, t, step);
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
    t->part_s[k - 1] = nb_seqctr_part_busy(r, t);
    nb_seqctr_count_rows(t);
    t->part_k = k;
    nb_seqctr_pop_part(r, t, t->step);
}

/* the next part (pipelined: the one after it) is made on the host while this one runs */
static void sc_overlap(nb_run *r, int step) {
    (void)step;
    sc_train *t = T(r);
    nb_seqctr_top_up(t, t->popped_u + nb_seqctr_lookahead(t));
}

static void sc_end_step(nb_run *r, int step, nb_mark done) {
    (void)done;
    sc_train *t = T(r);
    r->loss = nb_sc_loss(&t->m); /* this rank's share of the global batch's mean */
    r->loss_sum = r->loss * r->o.batch;
    double sumsq = 0;
    if (r->o.grad_clip > 0) r->be->to_host(&t->ctx, &sumsq, t->m.d_loss + 1, sizeof sumsq);
    r->grad_norm = (float)sqrt(sumsq);
    t->part_s[t->part_k] = nb_seqctr_part_busy(r, t);
    nb_seqctr_count_rows(t);
    nb_seqctr_rank_times(r, t, step);
    if (t->nsteps < r->o.steps) t->emul_secs[t->nsteps] = t->step_emul_s;
    if (t->nsteps < r->o.steps) t->step_secs[t->nsteps++] = r->last_secs;
    if (step >= nb_step_warmup(r->o.steps)) {
        nb_seqctr_add_breakdown(r->lanes, step, t->phase_s);
        t->overlap_sum += r->last_stats.overlap_pct;
    }
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
    return t->nahead ? t->ahead[0].pos : nb_seqctr_next_position(t);
}

static void sc_sync_to_host(nb_run *r) { nb_sc_to_host(&T(r)->m); }

/* Device steps are captured per history-row bucket (model/seqctr_batch.c pads the rows); the CPU backend
 * replays a graph by running its tasks, which read each batch's sizes: one graph. */
static int sc_graph_key(nb_run *r) {
    const nb_sc_model *m = &T(r)->m;
    if (r->be->device == NB_DEV_CPU) return 0;
    /* pipelined: each ring slot has its own device lists (and, sharded, work buffer) */
    return m->ahead ? nb_sc_prepared_rows(m) * NB_SC_RING + nb_sc_current_slot(m) : nb_sc_prepared_rows(m);
}

static const char *sc_model_name(const nb_train_opts *o) { return nb_sc_dlrm(&o->ctr) ? "dlrm-dcnv2" : "seqctr"; }

static int sc_owns_model(const char *model) { return !strcmp(model, "seqctr") || !strcmp(model, "dlrm-dcnv2"); }
static const char *sc_model_names(void) { return "seqctr, dlrm-dcnv2"; }
static int is_dlrm_preset(const nb_train_opts *o) { return !strcmp(o->model_name, "dlrm-dcnv2"); }

/* seqctr on synthetic clicks: a constant learning rate after 30 steps of warm-up, Adam's default
 * betas, no weight decay and no clipping; held-out AUC / NE every 50 steps. The warm-up: Adam's
 * first steps move every weight by about the learning rate in the direction that lowers the
 * logit (the labels are 25% positive), and through six cross blocks that overshoots: without it
 * the loss went from 0.72 to 22 at step 2 of every default run (1.14 with it). */
static const char *const sc_defaults[] = {
    "data=synth", "side-lanes=4", "batch=256", "steps=300", "warmup=30", "eval-every=50", "log-every=50", "lr=1e-3",
    "min-lr-frac=1", "beta2=0.999", "seed=1", NULL,
};

/* MLPerf's DLRM-DCNv2 (recommendation_v2/torchrec_dlrm: --embedding_dim 128 --dense_arch_layer_sizes
 * 512,256,128 --over_arch_layer_sizes 1024,1024,512,256,1 --interaction_type dcn --dcn_num_layers 3
 * --dcn_low_rank_dim 512): seqctr's DLRM form (model/seqctr.h) without a history. heads 1 and
 * block_hidden 1 are placeholders the form does not read. */
static void dlrm_shape(nb_sc_config *c) {
    static const int top[] = {1024, 1024, 512, 256};
    c->E = 128, c->hist_layers = 0, c->heads = 1, c->max_len = 0;
    c->blocks = 3, c->cross_rank = 512, c->block_hidden = 1;
    c->ntop = 4;
    memcpy(c->top, top, sizeof top);
}

/* The preset's shape; the columns stay (not a flag: the data's schema sets them, a resumed
 * checkpoint keeps its own; 0 on fresh options: nb_ctr_source_open takes the data's). */
static void sc_default_shape(nb_train_opts *o) {
    int nd = o->ctr.ndense, nc = o->ctr.ncat;
    nb_sc_config keep = o->ctr; /* and the multi-valued columns */
    nb_sc_config_default(&o->ctr);
    memcpy(o->ctr.pool, keep.pool, sizeof keep.pool);
    memcpy(o->ctr.mv_max, keep.mv_max, sizeof keep.mv_max);
    o->ctr.E = 32;
    o->ctr.max_len = 32;
    o->ctr.ndense = nd, o->ctr.ncat = nc;
    if (is_dlrm_preset(o)) dlrm_shape(&o->ctr);
}

/* MLPerf's DLRM-DCNv2 recipe (its reference's README run: --adagrad --learning_rate 0.005, no
 * warm-up and no decay (lr_warmup_steps, lr_decay_start, lr_decay_steps 0), Adagrad eps 1e-10,
 * initial accumulator 0, no weight decay): Adagrad on the dense part and the tables at one rate.
 * The tables' Adagrad is element-wise (--emb-optim adagrad-exact): torch.optim.Adagrad applied in
 * backward to the EmbeddingBagCollection becomes FBGEMM's fused EXACT_ADAGRAD, one accumulator per
 * element; the reference hands the fused optimizer only the rate, so FBGEMM's default eps 1e-8
 * applies there (the tables' eps here). --emb-optim adagrad (row-wise) halves the tables' memory. Tables of MLPerf's rows (the
 * reference's counts are capped at 40M already); --table-cap lowers the cap for small runs. */
static void dlrm_recipe(nb_train_opts *o, int (*seen)(const void *, const char *), const void *ctx) {
    if (!seen(ctx, "lr")) o->lr = 0.005f;
    if (!seen(ctx, "emb-lr")) o->emb_lr = o->lr;
    if (!seen(ctx, "warmup")) o->warmup = 0;
    if (!seen(ctx, "min-lr-frac")) o->min_lr_frac = 1.0f;
    if (!seen(ctx, "dense-optim")) o->dense_optim = NB_DENSE_OPT_ADAGRAD;
    if (!seen(ctx, "emb-optim")) o->emb_optim = NB_EMB_OPT_ADAGRAD_EXACT;
    if (!seen(ctx, "table-cap")) o->table_cap = 40000000;
    o->eps = 1e-10f;
}

/* The table's sparse Adam wants a smaller rate than Adagrad's default; the local heads of
 * detached blocks are off (weight 0) unless --detach asks for them. A resumed run keeps its own. */
static void sc_after_flags(nb_train_opts *o, int (*seen)(const void *, const char *), const void *ctx, int how) {
    int resuming = how == NB_FLAGS_RESUME; /* a plan reads the data too: its schema sizes the tables */
    nb_seqctr_schema_flags(o, seen, ctx); /* also on resume: --model seqctr resets the shape to the preset's */
    if (o->top_mlp[0]) {
        NB_CHECK(nb_sc_dlrm(&o->ctr), "drop --top-mlp (it is dlrm-dcnv2's)", "--top-mlp with --model seqctr");
        NB_CHECK(nb_sc_top_parse(&o->ctr, o->top_mlp) && o->ctr.ntop >= 1, "pass --top-mlp as 1 to 8 widths like 1024,512",
                 "--top-mlp '%s'", o->top_mlp);
    }
    if (resuming) return;
    if (is_dlrm_preset(o)) dlrm_recipe(o, seen, ctx);
    if (!seen(ctx, "emb-lr") && o->emb_optim == NB_EMB_OPT_ADAM) o->emb_lr = 1e-3f;
    if (o->detach[0] && !seen(ctx, "aux-weight")) o->aux_weight = 1.0f;
}

static void sc_print_model(const nb_train_opts *o, FILE *f) {
    const nb_sc_config *c = &o->ctr;
    if (nb_sc_dlrm(c)) {
        char top[16 * NB_SC_MAX_TOP];
        nb_sc_top_string(c, top, sizeof top);
        fprintf(f, "model       dlrm-dcnv2: E %d, bottom 512-256-%d, %d low-rank crosses (rank %d), top %s,1, tables of up to "
                   "%lld rows\n", c->E, c->E, c->blocks, c->cross_rank, top, (long long)o->table_cap);
        return;
    }
    fprintf(f, "model       seqctr: E %d, %d history layer%s x %d heads, %d blocks (cross rank %d, hidden %d), max_len %d, "
               "tables of up to %lld rows\n",
            c->E, c->hist_layers, c->hist_layers == 1 ? "" : "s", c->heads, c->blocks, c->cross_rank, c->block_hidden,
            c->max_len, (long long)o->table_cap);
}

static void sc_eval_line(const nb_run *r, const nb_eval *ev, const char *data, const char *ckpt, double secs, FILE *f) {
    fprintf(f, "eval n=%ld loss=%.5f ne=%.5f auc=%.5f base_rate=%.5f data=%s checkpoint=%s step=%d (%.1f s)\n", ev->n,
            ev->loss, ev->ne, ev->auc, ev->base_rate, data, ckpt, r->step, secs);
}

const nb_family_i nb_family_seqctr = {
    .name = "seqctr",
    .unit = "samples",
    .loss_unit = "BCE",
    .held_out = "held-out loss",
    .owns_model = sc_owns_model,
    .model_names = sc_model_names,
    .model_name = sc_model_name,
    .option_groups = 1u << NB_OPTG_COMMON | 1u << NB_OPTG_RANKS | 1u << NB_OPTG_SC | 1u << NB_OPTG_ERASE,
    .option_defaults = sc_defaults,
    .defaults = sc_default_shape,
    .after_flags = sc_after_flags,
    .print_model = sc_print_model,
    .held_out_option = "val-data",
    .held_out_default = "data",
    .eval_line = sc_eval_line,
    .check = sc_check,
    .init = sc_init,
    .start = nb_seqctr_start,
    .free = sc_free,
    .per_step = sc_per_step,
    .begin_step = sc_begin_step,
    .overlap = sc_overlap,
    .overlap_micro = sc_overlap,
    .begin_micro = sc_begin_micro,
    .end_step = sc_end_step,
    .evaluate = nb_seqctr_evaluate,
    .metrics = sc_metrics,
    .metrics_losses = sc_metrics_losses,
    .print_eval = nb_seqctr_print_eval,
    .data_pos = sc_data_pos,
    .sync_to_host = sc_sync_to_host,
    .ckpt_tensors = nb_seqctr_ckpt_tensors,
    .write_config = nb_seqctr_write_config,
    .read_config = nb_seqctr_read_config,
    .summary = nb_seqctr_summary,
    .graph_key = sc_graph_key,
    .wants_comm = sc_wants_comm,
    .fetches_ahead = 1,
    .shard_tensors = nb_seqctr_shard_tensors,
};

