/* The one training loop (see run.h): setup, steps, metrics, evaluation, checkpoints, progress,
 * the run directory. Nothing here knows a model family or a schedule by name. */
#include "run/run.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/comm.h"
#include "core.h"
#include "host.h"
#include "io/atomic.h"
#include "io/svg.h"
#include "lanes/kprof.h"
#include "family/family.h"
#include "run/ckpt.h"
#include "run/timeline.h"
#include "sched/sched.h"
#include "step/step_stats.h"

/* ---------------------------------------------------------------- the loop's own state */

typedef struct nb_series {
    double *step, *loss;
    size_t n, cap;
} nb_series; /* one curve of loss.svg: a metric over steps */

/* loss.svg's curves besides the two losses, by their metrics.jsonl key ("" = the throughput,
 * whose key names the family's unit); a panel is drawn only for curves that have points */
enum { H_TRAIN, H_HELD, H_LR, H_GNORM, H_RATE, H_AUC, H_NE, H_COUNT };
static const char *const hist_keys[H_COUNT] = {NULL, NULL, "lr", "grad_norm", "", "eval_auc", "eval_ne"};

/* What only the loop keeps: the captured steps, the run directory's metrics file, the loss
 * curves, the last held-out evaluation. */
struct nb_loop {
    struct {
        int key;
        struct nb_graph *g;
    } *graphs; /* [o.graph_cache]: the captured steps, one per graph key */
    int ngraphs, replays;
    FILE *metrics;
    nb_series hist[H_COUNT];
    nb_eval last_eval;
};

static void series_push(nb_series *s, double x, double y) {
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 256;
        s->step = realloc(s->step, s->cap * sizeof(double));
        s->loss = realloc(s->loss, s->cap * sizeof(double));
        NB_CHECK(s->step && s->loss, NULL, "out of memory for the loss history");
    }
    s->step[s->n] = x;
    s->loss[s->n++] = y;
}

/* ---------------------------------------------------------------- setup */

/* OpenMP's thread count belongs to the calling thread: --threads must be set on the thread that
 * runs the compute lane's ops (the lane's worker on the CPU backend), not only on main. */
static void work_set_threads(void *arg, const nb_task_ctx *ctx) {
    (void)ctx;
    nb_host_set_threads(((nb_run *)arg)->o.threads);
}
/* every lane thread the run starts, a CPU graph's replay threads too */
static void thread_start(void *arg) { nb_host_set_threads(((nb_run *)arg)->o.threads); }

static void *arena_dev_alloc(void *self, size_t bytes, const char *what) {
    return ((const nb_backend_i *)self)->alloc(bytes, what);
}
static void arena_dev_free(void *self, void *p) { ((const nb_backend_i *)self)->free(p); }
static void *arena_pinned_alloc(void *self, size_t bytes, const char *what) {
    return ((const nb_backend_i *)self)->host_alloc(bytes, what);
}
static void arena_pinned_free(void *self, void *p) { ((const nb_backend_i *)self)->host_free(p); }

static void init_arenas(nb_run *r) {
    size_t host_cap = r->o.host_mem_limit ? (size_t)r->o.host_mem_limit : nb_host_mem_available();
    nb_arena_init(&r->host, "host", (nb_device){NB_DEV_CPU, 0}, host_cap, nb_host_allocator);
    nb_allocator_i pa = {arena_pinned_alloc, arena_pinned_free, (void *)r->be};
    nb_arena_init(&r->pinned, "pinned host", (nb_device){NB_DEV_CPU, 0}, host_cap, pa);
    size_t dev_cap = r->o.gpu_mem_limit ? (size_t)r->o.gpu_mem_limit : r->be->mem_available();
    nb_allocator_i da = {arena_dev_alloc, arena_dev_free, (void *)r->be};
    int gpu = r->be->device != NB_DEV_CPU;
    nb_arena_init(&r->dev, gpu ? "GPU" : "backend", (nb_device){r->be->device, r->backend->device}, gpu ? dev_cap : host_cap,
                  da);
}

static void check_schedule(const nb_run *r) {
    const char *why = NULL;
    NB_CHECK(r->sched != NULL, "pass one of the schedules listed (nobubble train --help)", "unknown --schedule '%s' (the schedules: %s)",
             r->o.schedule, nb_sched_names());
    NB_CHECK(!r->sched->applies || r->sched->applies(r->fam, &why), "pick another --schedule (nobubble train --help lists them)",
             "--schedule %s does not run %s models: %s", r->sched->name, r->fam->name, why ? why : "");
    const char *hint = NULL, *refused = nb_sched_refuses(r->sched, &r->o, &hint);
    NB_CHECK(!refused, hint, "--schedule %s: %s", r->sched->name, refused);
    if (r->sched->check) r->sched->check(&r->o);
    for (const nb_sched_i *const *s = nb_sched_all(); *s; s++)
        if (*s != r->sched && (*s)->reject) (*s)->reject(&r->o);
}

/* FNV-1a: a hash of text that every rank computes alike */
static uint64_t hash_text(const char *s, uint64_t h) {
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

static int ranks_agree(uint64_t h) {
    int64_t v = (int64_t)(h >> 1); /* non-negative: min and max compare it whole */
    return nb_comm_agree_min_i64(v) == nb_comm_agree_max_i64(v);
}

/* Every rank must train the same model with the same options: mpirun gives them the same flags,
 * a wrapper or a hand-made launch might not, and ranks that differ would train to the end on
 * mismatched math. The options state.json keeps and the model's config, hashed; where the ranks
 * differ, every rank fails naming the first option that does (or the model). */
static void agree_on_options(nb_run *r) {
    if (r->world == 1) return;
    int n;
    const nb_opt *rows = nb_opts_table(&n);
    char v[NB_PATH_MAX + 8];
    nb_json_writer w;
    nb_json_writer_init(&w, 0);
    nb_json_begin_obj(&w);
    r->fam->write_config(&r->o, &w);
    nb_json_end_obj(&w);
    uint64_t model = hash_text(nb_json_text(&w), 14695981039346656037ULL), all = model;
    nb_json_writer_free(&w);
    for (int i = 0; i < n; i++)
        if (rows[i].state) nb_opt_format(&rows[i], &r->o, v, sizeof v), all = hash_text(v, hash_text(rows[i].name, all));
    if (ranks_agree(all)) return;
    static const char *hint = "start every rank with the same options (mpirun passes one command line to all of them)";
    for (int i = 0; i < n; i++) {
        if (!rows[i].state) continue;
        nb_opt_format(&rows[i], &r->o, v, sizeof v);
        NB_CHECK(ranks_agree(hash_text(v, 14695981039346656037ULL)), hint,
                 "--%s differs between the ranks (this rank, %d: '%s')", rows[i].name, r->rank, v);
    }
    NB_CHECK(ranks_agree(model), hint, "the model's shape differs between the ranks (--model and its shape flags)");
}

/* --device cuda with several ranks: each rank's local rank picks its GPU */
static void pick_device(nb_run *r) {
    if (r->world == 1 || strcmp(r->o.device, "cuda")) return;
    int n = nb_cuda_device_count(NULL, 0);
    if (n > 0) snprintf(r->o.device, sizeof r->o.device, "cuda:%d", nb_comm_pick_device(n));
}

static void create_comm(nb_run *r) {
    nb_comm_kind kind = r->o.comm;
    /* one rank with a named --comm still goes through it: a communicator of one runs the code
     * path of many (its reductions are copies), so one GPU checks the NCCL path */
    int wanted = (r->fam->wants_comm && r->fam->wants_comm(&r->o, &r->traits)) || r->o.comm_sm_free;
    if (r->eval_only || (r->world == 1 && kind == NB_COMM_AUTO && !wanted)) return;
    nb_comm_set_timeout(r->o.comm_timeout);
    nb_comm_opts co = {.kind = kind, .timeout_s = r->o.comm_timeout, .name = "comm", .sm_free = r->o.comm_sm_free};
    r->comm = nb_comm_create(r->lanes, r->be, &co);
    if (r->rank == 0)
        nb_log(1, "ranks       %d (%s), --comm %s: gradients all-reduced in buckets as the backward makes them%s\n", r->world,
               nb_comm_launcher(), nb_comm_kind_name(nb_comm_get_kind(r->comm)),
               r->o.comm_sm_free ? "; all-to-all and all-gather over copy engines (--comm-sm-free)" : "");
}

/* The run's options, family and schedule, checked (no backend yet). */
static void run_begin(nb_run *r, const nb_train_opts *o, int eval_only) {
    memset(r, 0, sizeof *r);
    r->o = *o;
    r->eval_only = eval_only;
    r->rank = eval_only ? 0 : nb_comm_rank();
    r->world = eval_only ? 1 : nb_comm_size();
    /* emulated ranks train their shares one after another, as the step's micro-batches */
    r->nmicro = eval_only ? 1 : nb_train_parts(&r->o);
    pick_device(r);
    r->fam = nb_family_find(o->family);
    NB_ASSERT(r->fam != NULL);
    r->loop = nb_calloc(1, sizeof *r->loop, "the training loop");
    r->sched = nb_sched_find(o->schedule);
    if (o->resume[0] && !eval_only)
        NB_CHECK(r->o.world == r->world, "resume with as many ranks as the run was started with (mpirun -np N)",
                 "the checkpoint in %s was written by %d rank%s; this run has %d (its data and state are not resharded)",
                 o->resume, r->o.world, r->o.world == 1 ? "" : "s", r->world);
    r->ckpt_world = o->resume[0] ? o->world : 0;
    r->o.world = r->world;
    nb_train_opts_check(&r->o, r->fam->option_groups);
    r->fam->check(&r->o);
    check_schedule(r);
    r->traits = r->sched->traits;
}

/* The lanes, arenas and the family: what the memory plan needs. */
static void run_lanes(nb_run *r) {
    nb_host_set_threads(r->o.threads);
    /* the instance's own device: an emulated GPU (nobubble plan) still runs on CPU lanes */
    r->lanes = nb_lanes_create(r->backend->ops->device != NB_DEV_CPU ? "cuda" : "cpu", r->o.trace[0] ? 400000 : 1 << 16);
    nb_lanes_bind(r->lanes, r->backend);
    nb_lanes_set_thread_start(r->lanes, thread_start, r);
    r->compute = nb_lane_create(r->lanes, "compute", NB_LANE_DEVICE);
    nb_run_on_compute(r, "set threads", work_set_threads, r);
}

/* the memory: the schedule's plan when it keeps the state, else the family's own */
static void run_plan(nb_run *r) {
    if (r->sched->plan)
        r->sched->plan(r);
    else if (r->fam->plan)
        r->fam->plan(r);
}

void nb_run_plan_only(nb_run *r, const nb_train_opts *o, size_t gpu_mem) {
    nb_train_opts po = *o;
    snprintf(po.device, sizeof po.device, "cpu");
    if (gpu_mem) po.gpu_mem_limit = gpu_mem;
    po.precision = NB_PREC_DEFAULT; /* the CPU backend's checks; the emulated GPU takes o's below */
    run_begin(r, &po, 0);
    r->dry = 1;
    r->backend = nb_backend_create("cpu", "");
    r->be = r->backend->ops;
    if (gpu_mem) { /* the CPU backend's table planning as the GPU would: its device and precision */
        r->dry_be = *r->be;
        r->dry_be.device = NB_DEV_CUDA;
        r->dry_be.act_dtype = o->precision == NB_PREC_FP32 ? NB_F32 : NB_BF16;
        r->be = &r->dry_be;
        r->dev_free0 = gpu_mem;
    }
    run_lanes(r);
    init_arenas(r);
    r->fam->init(r);
    run_plan(r);
}

/* What the run allocated, in bytes (tests/plan_test.sh compares it with `nobubble plan`). */
static void log_allocated(const nb_run *r) {
    nb_log(1, "allocated   host %zu bytes, device %zu bytes (arenas: host %zu, pinned %zu, %s %zu; the schedule's own: "
              "device %zu, pinned %zu)\n",
           nb_run_host_bytes(r), nb_run_dev_bytes(r), r->host.planned, r->pinned.planned,
           r->be->device == NB_DEV_CPU ? "backend" : "device", r->dev.planned, r->sched_dev_bytes, r->sched_pinned_bytes);
}

void nb_run_init(nb_run *r, const nb_train_opts *o, int eval_only) {
    double t_setup = nb_now();
    run_begin(r, o, eval_only);
    agree_on_options(r);
    nb_ckpt_state st = {0};
    if (o->resume[0]) {
        nb_ckpt_read_state(o->resume, NULL, &st);
        NB_CHECK(st.seed == r->o.seed, "drop --seed, or pass the seed the checkpoint was trained with",
                 "--seed %llu differs from the checkpoint's seed %llu", (unsigned long long)r->o.seed,
                 (unsigned long long)st.seed);
        r->step = st.step;
        r->data_pos0 = st.data_pos;
    }
    r->backend = nb_backend_create(r->o.device, nb_precision_name(r->o.precision));
    r->be = r->backend->ops;
    nb_backend_set_attn(r->backend, r->o.attn);
    r->dev_free0 = r->be->device != NB_DEV_CPU ? r->be->mem_available() : 0;
    run_lanes(r);
    create_comm(r);
    init_arenas(r);
    r->fam->init(r);
    run_plan(r);
    if (r->fam->bind) r->fam->bind(r);
    if (r->sched->init) r->sched->init(r);
    log_allocated(r);
    r->fam->start(r, o->resume[0] ? o->resume : NULL);
    if (r->traits.keeps_state)
        r->sched->upload(r);
    else if (r->fam->upload)
        r->fam->upload(r);
    /* large models spend a while here (hundreds of GB touched): say so, not silently */
    double setup_s = nb_now() - t_setup;
    if (setup_s > 2.0)
        nb_log(1, "setup       %.1f s (state allocated, weights %s, uploaded)\n", setup_s, o->resume[0] ? "loaded" : "initialized");
}

void nb_run_free(nb_run *r) {
    struct nb_loop *lp = r->loop;
    if (r->lanes) nb_lanes_sync(r->lanes);
    for (int i = 0; lp && i < lp->ngraphs; i++) nb_graph_destroy(lp->graphs[i].g);
    if (r->sched && r->sched->free) r->sched->free(r);
    if (r->fam && r->fam->free) r->fam->free(r);
    if (r->comm) nb_comm_destroy(r->comm);
    if (r->lanes) nb_lanes_destroy(r->lanes);
    free(r->bucket_work);
    nb_arena_free(&r->dev), nb_arena_free(&r->pinned), nb_arena_free(&r->host);
    nb_items_free(&r->items.pre), nb_items_free(&r->items.input), nb_items_free(&r->items.tail);
    nb_items_free(&r->items.post), nb_items_free(&r->items.opt);
    nb_items_free(&r->items.next), nb_items_free(&r->items.resync);
    for (int s = 0; s < NB_MAX_SEGMENTS; s++) nb_items_free(&r->items.fwd[s]), nb_items_free(&r->items.bwd[s]);
    nb_backend_destroy(r->backend);
    if (lp) {
        free(lp->graphs);
        for (int k = 0; k < H_COUNT; k++) free(lp->hist[k].step), free(lp->hist[k].loss);
        if (lp->metrics) fclose(lp->metrics);
        free(lp);
    }
    memset(r, 0, sizeof *r);
}

static void drain(nb_run *r) {
    if (r->sched->drain) r->sched->drain(r);
}

/* a schedule that keeps the state brings the host copies up to date in its drain */
void nb_run_sync_to_host(nb_run *r) {
    drain(r);
    if (!r->traits.keeps_state) r->fam->sync_to_host(r);
}

void nb_run_evaluate(nb_run *r, nb_eval *ev) {
    drain(r); /* evaluation reads the weights the schedule may still be updating */
    r->fam->evaluate(r, ev);
}

/* ---------------------------------------------------------------- the run directory */

/* One metrics.jsonl line into the curves (the lines of a resumed run's earlier steps too). */
static void history_add(nb_run *r, const nb_json *line) {
    nb_series *h = r->loop->hist;
    double x = (double)nb_json_get_int(line, "step", -1), v[H_COUNT];
    r->fam->metrics_losses(line, &v[H_TRAIN], &v[H_HELD]);
    char rate[32];
    snprintf(rate, sizeof rate, "%s_per_s", r->fam->unit);
    for (int k = H_LR; k < H_COUNT; k++) v[k] = nb_json_get_num(line, hist_keys[k][0] ? hist_keys[k] : rate, NAN);
    for (int k = 0; k < H_COUNT; k++)
        if (isfinite(v[k]) || (k == H_TRAIN && !isnan(v[k]))) series_push(&h[k], x, v[k]);
}

static nb_svg_series curve(const nb_series *h, const char *name, const char *color) {
    return (nb_svg_series){name, color, (int)h->n, h->step, h->loss};
}

/* loss.svg: the losses (an early spike clipped so the curve stays readable) and, where the run
 * logged them, the learning rate, gradient norm, throughput and held-out AUC / NE */
static void draw_loss_svg(const nb_run *r) {
    const nb_series *h = r->loop->hist;
    char path[NB_PATH_MAX + 16], title[256], ylabel[32], rate[48];
    snprintf(path, sizeof path, "%s/loss.svg", r->o.out);
    const char *out = strrchr(r->o.out, '/');
    snprintf(title, sizeof title, "%.120s: %s, --schedule %s", out && out[1] ? out + 1 : r->o.out,
             r->fam->model_name(&r->o), r->o.schedule);
    snprintf(ylabel, sizeof ylabel, "loss (%s)", r->fam->loss_unit);
    snprintf(rate, sizeof rate, "%s/s", r->fam->unit);
    nb_svg_series s[H_COUNT] = {
        curve(&h[H_TRAIN], "train loss", "#1f77b4"), curve(&h[H_HELD], r->fam->held_out, "#d62728"),
        curve(&h[H_LR], "learning rate", "#59a14f"), curve(&h[H_GNORM], "gradient norm", "#b07aa1"),
        curve(&h[H_RATE], rate, "#f28e2b"),          curve(&h[H_AUC], "held-out AUC", "#9c755f"),
        curve(&h[H_NE], "held-out NE", "#76b7b2"),
    };
    static const char *const ylabels[H_COUNT] = {NULL, NULL, "learning rate", "gradient norm", NULL, "AUC", "NE"};
    nb_svg_panel p[H_COUNT];
    int np = 0;
    p[np++] = (nb_svg_panel){"loss", "step", ylabel, s, h[H_HELD].n ? 2 : 1, 1};
    for (int k = H_LR; k < H_COUNT; k++)
        if (h[k].n) p[np++] = (nb_svg_panel){s[k].name, "step", k == H_RATE ? rate : ylabels[k], &s[k], 1, k == H_GNORM};
    nb_svg_panels(path, title, p, np);
}

/* Keep only the metrics lines of steps up to `step` (a resumed run rewrites what follows). */
static void open_metrics(nb_run *r) {
    char path[NB_PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/metrics.jsonl", r->o.out);
    nb_sbuf kept = {0};
    FILE *old = r->step > 0 && access(path, F_OK) == 0 ? nb_fopen(path, "r", "remove the damaged metrics.jsonl") : NULL;
    if (old) {
        char line[4096];
        while (fgets(line, sizeof line, old)) {
            nb_json *j = nb_json_parse(line, strlen(line), path, NULL, 0);
            if (!j) continue;
            int64_t s = nb_json_get_int(j, "step", -1);
            if (s >= 1 && s <= r->step) {
                nb_sbuf_puts(&kept, line);
                history_add(r, j);
            }
            nb_json_free(j);
        }
        fclose(old);
    }
    nb_write_file_atomic(path, kept.data ? kept.data : "", kept.len);
    nb_sbuf_free(&kept);
    r->loop->metrics = nb_fopen(path, "a", "choose a writable --out directory");
}

/* One line per step; "step" counts steps done (1 = after the first), as the progress line and
 * state.json do. */
static void write_metrics(nb_run *r, int step, double secs, const nb_step_stats *st, const nb_eval *ev) {
    nb_json_writer w;
    nb_json_writer_init(&w, 0);
    nb_json_begin_obj(&w);
    nb_json_kint(&w, "step", step + 1);
    nb_json_knum(&w, "loss", r->loss);
    r->fam->metrics(r, &w, secs, ev);
    nb_json_knum(&w, "ms", 1e3 * secs);
    char key[32];
    snprintf(key, sizeof key, "%s_per_s", r->fam->unit);
    nb_json_knum(&w, key, r->fam->per_step(r) / secs);
    nb_json_knum(&w, "bubble_pct", st->bubble_pct);
    nb_json_knum(&w, "overlap_pct", st->overlap_pct);
    nb_json_knum(&w, "exposed_pct", st->exposed_pct);
    nb_json_end_obj(&w);
    fprintf(r->loop->metrics, "%s\n", nb_json_text(&w));
    NB_CHECK(fflush(r->loop->metrics) == 0, "check free disk space in --out", "cannot write metrics.jsonl: %s", strerror(errno));
    nb_json *j = nb_json_parse(nb_json_text(&w), strlen(nb_json_text(&w)), "metrics line", NULL, 0);
    NB_CHECK(j, "this is a bug in nobubble; please report it", "metrics line of step %d does not parse", step + 1);
    history_add(r, j);
    nb_json_free(j);
    nb_json_writer_free(&w);
}

/* What names the run in timeline.svg and the trace: its directory, model, schedule and device */
static void run_title(const nb_run *r, char *buf, size_t cap) {
    char how[128] = "";
    if (r->sched->describe) r->sched->describe(r, how, sizeof how);
    const char *dir = strrchr(r->o.out, '/');
    dir = r->o.out[0] ? (dir && dir[1] ? dir + 1 : r->o.out) : "";
    snprintf(buf, cap, "%.100s%s%s: --schedule %s%s%s%s, batch %d, %s", dir, dir[0] ? ", " : "",
             r->fam->model_name(&r->o), r->o.schedule, how, r->o.detach[0] ? ", --detach " : "", r->o.detach,
             r->o.batch, r->backend->desc);
}

/* timeline.svg of one step in the run directory: lanes as rows, spans coloured by segment */
static void write_timeline(nb_run *r, int step) {
    char path[NB_PATH_MAX + 32], title[1024], run[900];
    nb_lanes_sync(r->lanes);
    snprintf(path, sizeof path, "%s/timeline.svg", r->o.out);
    run_title(r, run, sizeof run);
    snprintf(title, sizeof title, "%s; step %d", run, step + 1);
    nb_timeline_write(r->lanes, step, path, title);
}

static void fmt_eta(char *buf, size_t cap, double s) {
    if (s < 0 || !isfinite(s)) s = 0;
    int h = (int)(s / 3600), mi = (int)(s / 60) % 60, se = (int)s % 60;
    if (h)
        snprintf(buf, cap, "%dh%02dm", h, mi);
    else
        snprintf(buf, cap, "%dm%02ds", mi, se);
}

/* Every allocation is made before the first step (the libraries' workspaces during it), so what
 * the device has lost since the run started is the run's peak. */
static void report_device_memory(const nb_run *r) {
    size_t now = r->be->mem_available(), used = r->dev_free0 > now ? r->dev_free0 - now : 0;
    char a[32], b[32];
    fprintf(stderr, "gpu memory  %s used by this run (free before it: %s)\n", nb_fmt_bytes(a, 32, (double)used),
            nb_fmt_bytes(b, 32, (double)r->dev_free0));
}

/* p90 rate: units per step over the 90th-percentile step time, after warm-up (step_stats.h) */
static void print_p90(const nb_run *r, const double *ms, int n) {
    nb_step_times st = nb_step_times_of(ms, n);
    if (!st.n || nb_verbosity == 0) return;
    double u = r->fam->per_step(r);
    fprintf(stderr, "throughput  p90 %.0f %s/s (%.2f ms), median %.0f %s/s (%.2f ms), over %d steps after %d warm-up\n",
            u / (st.p90 / 1e3), r->fam->unit, st.p90, u / (st.median / 1e3), r->fam->unit, st.median, st.n, st.warmup);
}

/* ---------------------------------------------------------------- signals */

/* SIGINT / SIGTERM (what schedulers preempt with): the step in flight finishes, a checkpoint is
 * written and the run ends; the handler only records the signal, and the default action is back
 * (SA_RESETHAND), so a second Ctrl-C ends the process at once. */
static volatile sig_atomic_t stop_signal;

static void on_stop_signal(int sig) { stop_signal = sig; }

static void catch_stop_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESTART | SA_RESETHAND; /* reset by the kernel as it delivers: a second signal that
                                                 * reaches another thread at once still kills */
    sigemptyset(&sa.sa_mask);
    NB_CHECK(sigaction(SIGINT, &sa, NULL) == 0 && sigaction(SIGTERM, &sa, NULL) == 0, NULL, "cannot install the signal handlers: %s",
             strerror(errno));
}

/* ---------------------------------------------------------------- steps */

static struct nb_graph *graph_for(nb_run *r, int key) {
    for (int i = 0; i < r->loop->ngraphs; i++)
        if (r->loop->graphs[i].key == key) return r->loop->graphs[i].g;
    return NULL;
}

/* The schedule's pass over the current micro-batch (and the optimizer, when nothing runs between
 * them): eagerly, or (--graphs) as the replay of a pass captured once per graph key (the family's
 * shape, the micro-batch, whether the optimizer is in it). The first step of a run is eager either
 * way: it makes every lazy allocation (cuBLASLt workspaces, pools) before a capture, where
 * allocations are not allowed. */
static void run_pass(nb_run *r, int step, int first, int with_opt) {
    int key = r->o.graphs && step != first ? r->fam->graph_key(r) : -1;
    if (key >= 0) key = (key * r->nmicro + r->micro) * 2 + with_opt;
    struct nb_graph *g = key >= 0 ? graph_for(r, key) : NULL;
    struct nb_loop *lp = r->loop;
    if (key < 0 || (!g && lp->ngraphs == r->o.graph_cache)) { /* eager: the same bits as a replay */
        r->sched->step(r, step);
        if (with_opt && !r->traits.keeps_state) nb_items_run(r, &r->items.opt, r->compute, step);
        return;
    }
    if (!g) {
        if (!lp->graphs) lp->graphs = nb_calloc((size_t)r->o.graph_cache, sizeof *lp->graphs, "the graph cache");
        r->capturing = 1;
        nb_lanes_capture_begin(r->lanes, r->compute);
        r->sched->step(r, step);
        if (with_opt && !r->traits.keeps_state) nb_items_run(r, &r->items.opt, r->compute, step);
        g = nb_lanes_capture_end(r->lanes);
        r->capturing = 0;
        lp->graphs[lp->ngraphs].key = key;
        lp->graphs[lp->ngraphs++].g = g;
    }
    nb_graph_launch(g, r->compute, step);
    lp->replays++;
    if (r->comm && r->micro + 1 == r->nmicro) nb_run_reduce_buckets(r);
}

/* One step: each micro-batch's pass (the host waits for the one before: its items read the
 * family's per-micro-batch state when they run), then the ranks' reduction and the optimizer. */
static void run_step(nb_run *r, int step, int first) {
    r->reduced_set = 0;
    if (r->comm) nb_comm_set_step(r->comm, step);
    for (int k = 0; k < r->nmicro; k++) {
        int last = k + 1 == r->nmicro, opt_inside = last && !r->comm;
        if (k > 0) nb_mark_wait_host(nb_lane_mark(r->compute));
        r->micro = k;
        if (r->fam->begin_micro) r->fam->begin_micro(r, k);
        /* a prefetching schedule fetched this micro-batch's inputs during the one before */
        if (!r->traits.prefetches || (step == first && k == 0)) nb_items_run(r, &r->items.pre, r->compute, step);
        if (r->sched->prologue) r->sched->prologue(r, step);
        run_pass(r, step, first, opt_inside);
        if (last && !opt_inside && !r->traits.keeps_state) {
            if (r->reduced_set) nb_lane_wait(r->compute, r->reduced);
            nb_items_run(r, &r->items.opt, r->compute, step);
        }
        if (r->sched->before_post) r->sched->before_post(r, step);
        nb_items_run(r, &r->items.post, r->compute, step);
        if (r->sched->epilogue) r->sched->epilogue(r, step);
        if (!last && r->fam->enqueue_results) r->fam->enqueue_results(r, step);
        if (!last && r->fam->overlap_micro) r->fam->overlap_micro(r, step);
    }
}

/* The first weight or optimizer value that is not finite, in the host copies (current after
 * nb_run_sync_to_host): its tensor's name into what, or 0 when every value is finite. */
static int find_nonfinite_state(nb_run *r, char *what, size_t cap) {
    nb_ckpt_list model = {0}, optim = {0}, shard = {0};
    r->fam->ckpt_tensors(r, &model, &optim);
    if (nb_run_sharded(r)) r->fam->shard_tensors(r, &shard);
    nb_ckpt_list *lists[3] = {&model, &optim, &shard};
    int found = 0;
    for (int k = 0; k < 3 && !found; k++)
        for (int i = 0; i < lists[k]->n && !found; i++) {
            const nb_ckpt_tensor *t = &lists[k]->v[i];
            size_t n = nb_ckpt_tensor_numel(t);
            /* state a schedule keeps on the device comes down one tensor at a time */
            float *buf = t->data ? NULL : nb_malloc(n ? n * sizeof(float) : 1, "finiteness check");
            const float *d = nb_ckpt_tensor_values(t, buf);
            for (size_t e = 0; e < n; e++)
                if (!isfinite(d[e])) {
                    snprintf(what, cap, "%s %s (element %zu: %g)", k == 0 ? "the weight" : k == 1 ? "the optimizer state" : "the shard tensor", t->name, e,
                             (double)d[e]);
                    found = 1;
                    break;
                }
            free(buf);
        }
    nb_ckpt_list_free(&model), nb_ckpt_list_free(&optim), nb_ckpt_list_free(&shard);
    return found;
}

static const char *NONFINITE_HINT = "lower --lr, or check the data; the last checkpoint written (if any) is intact";

/* A loss or gradient that is not finite ends the run before anything is written: the last good
 * checkpoint stays. The message names the step (1-based, like the progress line) and the first
 * tensor that is not finite: a weight (the update before broke it), else the loss, else a
 * gradient. */
static void check_finite(nb_run *r, int step) {
    if (isfinite(r->loss) && isfinite(r->grad_norm)) return;
    char what[256];
    nb_run_sync_to_host(r);
    if (!find_nonfinite_state(r, what, sizeof what)) {
        /* a schedule that keeps the state reuses its gradient buffers as layers land */
        int grads_kept = !r->traits.keeps_state && r->fam->nonfinite_grad;
        const char *g = isfinite(r->loss) && grads_kept ? r->fam->nonfinite_grad(r) : NULL;
        snprintf(what, sizeof what, "%s", !isfinite(r->loss) ? "the loss" : g ? g : "the gradient norm");
    }
    nb_fail(NONFINITE_HINT, "step %d: %s is not finite (loss %g, gradient norm %g); nothing was saved", step + 1, what,
            r->loss, (double)r->grad_norm);
}

/* Before a checkpoint: every weight and optimizer value must be finite (host copies current). */
static void check_state_finite(nb_run *r, int step) {
    char what[256];
    if (find_nonfinite_state(r, what, sizeof what))
        nb_fail(NONFINITE_HINT, "step %d: %s is not finite; the checkpoint was not written", step + 1, what);
}

/* Replicated weights and optimizer state: rank 0 writes them; a family's shards: every rank
 * its own (nb_ckpt_save is then collective). */
static void save_checkpoint(nb_run *r, int step) {
    if (r->rank != 0 && !nb_run_sharded(r)) return;
    nb_ckpt_state cs = {step + 1, r->fam->data_pos(r), r->o.seed};
    nb_run_sync_to_host(r);
    check_state_finite(r, step);
    nb_ckpt_save(r, r->o.out, &cs);
}

static void progress_line(nb_run *r, int step, int end, int first, double secs, const nb_step_stats *st,
                          const nb_eval *ev, int tty, int log_every, int is_last, double run_t0) {
    double elapsed = nb_now() - run_t0, per_step = elapsed / (step + 1 - first), rate = r->fam->per_step(r) / secs;
    const char *unit = !strcmp(r->fam->unit, "tokens") ? "tok" : "samples";
    char eta[32], held[48] = "";
    fmt_eta(eta, sizeof eta, per_step * (end - step - 1));
    if (nb_verbosity == 0) return; /* --quiet: the summary only */
    if (tty) {
        if (r->loop->last_eval.done) snprintf(held, sizeof held, " | val %.4f", r->loop->last_eval.loss);
        fprintf(stderr, "\rstep %d/%d | loss %.4f%s | %.0f %s/s | %.0f ms | ETA %s   ", step + 1, end, r->loss, held, rate,
                unit, 1e3 * secs, eta);
        if (is_last) fputc('\n', stderr);
    } else if ((step + 1 - first) % log_every == 0 || is_last || ev->done) {
        if (ev->done) snprintf(held, sizeof held, " | val %.4f", ev->loss);
        fprintf(stderr, "step %d/%d | loss %.4f%s | %.0f %s/s | %.0f ms | bubble %.1f%% | ETA %s\n", step + 1, end, r->loss,
                held, rate, unit, 1e3 * secs, st->bubble_pct, eta);
    }
}

/* --kernel-table: CUPTI records from before the first step (a graph captured later is seen only
 * if recording was on when it was made); the table counts the steps after warm-up */
static int kernel_table_open(const nb_run *r, int lead) {
    if (r->o.kernel_table <= 0 || !lead) return 0;
    char why[400];
    if (r->be->device == NB_DEV_CPU) {
        fprintf(stderr, "note: --kernel-table counts GPU kernels; this run is on the CPU\n");
        return 0;
    }
    if (nb_kprof_open(why, sizeof why)) return 1;
    fprintf(stderr, "note: no kernel table: %s\n", why);
    return 0;
}

/* every lane idle, so the step's last kernel has ended when the window's end is read */
static void kernel_table_step_end(nb_run *r) {
    nb_lanes_sync(r->lanes);
    nb_kprof_mark_end();
}

/* With several ranks, every rank decides to stop after the same step: the latest signal or
 * deadline any of them saw counts for all (a rank that stopped alone would leave the others
 * waiting in the next collective). */
static int agree(nb_run *r, int v) { return r->world > 1 ? (int)nb_comm_agree_max_i64(v) : v; }

/* What the training loop keeps from one step to the next. */
typedef struct {
    int first, end;     /* the run's first step and one past its last: the same on every rank */
    int lead;           /* rank 0 prints and writes the run directory */
    int tty, log_every; /* progress: one redrawn line on a terminal, else a line every log_every steps */
    double t0, last_ckpt;
    double *step_ms;  /* each step's time, for the p90 */
    int kt, kt_first; /* --kernel-table: recording, and from which step */
} train_loop;

/* --steps cut by --stop-after; with several ranks, the fewest any rank was told (a rank told
 * fewer never leaves the others waiting), and every rank must resume from the same step. */
static int steps_to_run(const nb_run *r) {
    const nb_train_opts *o = &r->o;
    int end = o->steps;
    if (o->stop_after > 0 && o->stop_after < end) end = o->stop_after;
    if (r->world > 1) {
        int agreed = (int)nb_comm_agree_min_i64(end);
        if (agreed != end) fprintf(stderr, "note: rank %d: running %d steps, as many as every rank was told to run\n", r->rank, agreed);
        end = agreed;
        NB_CHECK(nb_comm_agree_min_i64(r->step) == nb_comm_agree_max_i64(r->step), "resume every rank from the same checkpoint",
                 "rank %d resumes at step %d, another rank elsewhere", r->rank, r->step);
    }
    return end;
}

static void loop_start(nb_run *r, train_loop *L) {
    const nb_train_opts *o = &r->o;
    L->end = steps_to_run(r), L->lead = r->rank == 0, L->first = r->step;
    if (o->out[0] && L->lead) {
        nb_mkdir_p(o->out);
        open_metrics(r);
    }
    L->tty = !o->no_progress && isatty(fileno(stderr));
    L->log_every = o->log_every > 0 ? o->log_every : (L->end - r->step > 20 ? (L->end - r->step) / 20 : 1);
    L->t0 = L->last_ckpt = nb_now();
    L->step_ms = nb_malloc((size_t)(L->end > L->first ? L->end - L->first : 1) * sizeof(double), "step times");
    L->kt_first = L->first + nb_step_warmup(L->end - L->first), L->kt = kernel_table_open(r, L->lead);
    catch_stop_signals();
}

/* No step to run: --init-from with --steps 0 writes the imported model as the step-0 checkpoint. */
static void no_steps(nb_run *r, const train_loop *L) {
    const nb_train_opts *o = &r->o;
    int saved = o->out[0] && !o->no_ckpt;
    if (L->end == 0 && o->init_from[0] && !o->resume[0]) {
        if (saved) save_checkpoint(r, -1);
        if (L->lead && saved)
            fprintf(stderr, "imported %s as the step-0 checkpoint in %s; train it with: nobubble train --resume %s --steps N\n",
                    o->init_from, o->out, o->out);
        else if (L->lead)
            fprintf(stderr, "imported %s (no --out: nothing was saved)\n", o->init_from);
    } else if (r->step >= L->end) {
        fprintf(stderr, "nothing to do: the checkpoint is at step %d and --steps is %d\n", r->step, L->end);
    }
}

/* One optimizer step on the lanes, waited for; its time in *secs and its lanes' statistics. */
static nb_step_stats train_step(nb_run *r, const train_loop *L, int step, double *secs) {
    if (L->kt && step == L->kt_first) nb_kprof_mark_begin();
    double t0 = nb_now();
    r->fam->begin_step(r, step);
    run_step(r, step, L->first);
    if (r->fam->overlap) r->fam->overlap(r, step);
    if (r->fam->enqueue_results) r->fam->enqueue_results(r, step);
    nb_mark done = nb_lane_mark(r->compute);
    nb_mark_wait_host(done);
    double t1 = nb_now();
    /* side lanes' spans enter the trace once synced; a schedule whose step ends with every lane
     * idle costs nothing to sync */
    if (r->traits.settles) nb_lanes_sync(r->lanes);
    if (L->kt && step >= L->kt_first) kernel_table_step_end(r);
    nb_step_stats st = nb_lanes_step_stats(r->lanes, step, nb_lane_index(r->compute), t0, t1);
    r->last_secs = t1 - t0, r->last_stats = st;
    r->fam->end_step(r, step, done);
    if (r->sched->grad_norm) r->grad_norm = r->sched->grad_norm(r);
    if (r->world > 1) {
        double count = r->fam->loss_count ? r->fam->loss_count(r) : r->fam->per_step(r);
        double sum = nb_comm_sum_f64_host(r->loss_sum);
        r->loss = count > 0 ? sum / count : 0.0;
    }
    check_finite(r, step);
    *secs = t1 - t0;
    return st;
}

/* After a step: the held-out evaluation, metrics, a checkpoint when one is due, progress. A
 * signal skips the evaluation (a preempted job has little time left). */
static void after_step(nb_run *r, train_loop *L, int step, double secs, const nb_step_stats *st, int is_last,
                       int signalled) {
    const nb_train_opts *o = &r->o;
    nb_eval ev = {0};
    if (((o->eval_every > 0 && (step + 1) % o->eval_every == 0) || is_last) && !signalled) {
        nb_run_evaluate(r, &ev);
        if (ev.done) {
            r->loop->last_eval = ev;
            if (L->lead) r->fam->print_eval(r, step + 1, &ev);
        }
    }
    if (r->loop->metrics) write_metrics(r, step, secs, st, &ev);
    /* --ckpt-minutes: a checkpoint at least this often, so a killed run loses little whatever
     * its size (the ranks agree on the clock of the slowest) */
    int due = agree(r, o->ckpt_minutes > 0 && nb_now() - L->last_ckpt >= 60.0 * o->ckpt_minutes);
    if (o->out[0] && !o->no_ckpt && ((o->ckpt_every > 0 && (step + 1) % o->ckpt_every == 0) || is_last || due)) {
        save_checkpoint(r, step);
        L->last_ckpt = nb_now();
    }
    if (L->lead) progress_line(r, step, L->end, L->first, secs, st, &ev, L->tty, L->log_every, is_last, L->t0);
    L->step_ms[step - L->first] = 1e3 * secs;
    if (is_last && o->out[0] && L->lead) write_timeline(r, step);
    if (!o->trace[0]) nb_lanes_trace_clear(r->lanes); /* keep memory flat on long runs */
}

/* --time-limit or a signal ended the run after `step`: the run ends there, and says how to go on. */
static void stop_early(nb_run *r, train_loop *L, int signalled) {
    const nb_train_opts *o = &r->o;
    r->step++;
    L->end = r->step;
    if (signalled) {
        r->stopped_by = signalled;
        fprintf(stderr, "%s received: stopped after step %d%s%s%s\n", signalled == SIGINT ? "SIGINT" : "SIGTERM", L->end,
                o->out[0] && !o->no_ckpt ? " with a checkpoint; resume with: nobubble train --resume " : "",
                o->out[0] && !o->no_ckpt ? o->out : "", o->out[0] ? "" : " (no --out: nothing was saved)");
    } else {
        fprintf(stderr, "--time-limit %g s reached after step %d: stopped with a checkpoint (resume with --resume)\n",
                (double)o->time_limit, L->end);
    }
}

static void report_graphs(const nb_run *r, int steps) {
    const nb_train_opts *o = &r->o;
    if (r->nmicro > 1) /* a replay per micro-batch pass */
        fprintf(stderr, "graphs      %d captured (one per pass shape), %d of %d passes replayed (%d micro-batches a step)",
                r->loop->ngraphs, r->loop->replays, steps * r->nmicro, r->nmicro);
    else
        fprintf(stderr, "graphs      %d captured (one per step shape), %d of %d steps replayed", r->loop->ngraphs, r->loop->replays,
                steps);
    /* a full cache is why steps of a shape seen late run eagerly (the same bits, slower) */
    if (r->loop->ngraphs == o->graph_cache) fprintf(stderr, "; the cache of %d filled up (--graph-cache N keeps more)", o->graph_cache);
    fputc('\n', stderr);
}

/* Rank 0, after the last step: the summary lines, the trace, loss.svg. */
static void report_run(nb_run *r, const train_loop *L) {
    const nb_train_opts *o = &r->o;
    int steps = L->end - L->first;
    double wall = nb_now() - L->t0, units = r->fam->per_step(r);
    if (o->stop_after > 0 && o->stop_after < o->steps && L->end == o->stop_after && o->out[0] && !o->no_ckpt)
        fprintf(stderr, "stopped after step %d of %d with a checkpoint; continue with: nobubble train --resume %s\n", L->end,
                o->steps, o->out);
    if (steps > 0) {
        fprintf(stderr, "done: %d steps in %.1f s, %.0f %s/s", steps, wall, units * steps / wall, r->fam->unit);
        const nb_eval *ev = &r->loop->last_eval;
        if (ev->done) fprintf(stderr, ", final %s %.4f%s%s%s", r->fam->held_out, ev->loss, ev->covers[0] ? " (" : "", ev->covers,
                              ev->covers[0] ? ")" : "");
        fputc('\n', stderr);
    }
    print_p90(r, L->step_ms, steps);
    if (L->kt) nb_kprof_report(stderr, r->step - L->kt_first, o->kernel_table);
    if (o->graphs) report_graphs(r, steps);
    if (r->fam->summary) r->fam->summary(r, steps);
    if (r->sched->report && steps > 0 && nb_verbosity > 0) r->sched->report(r);
    if (r->dev_free0 && steps > 0 && nb_verbosity > 0) report_device_memory(r);
    if (o->trace[0]) {
        nb_lanes_sync(r->lanes);
        char title[900];
        run_title(r, title, sizeof title);
        nb_lanes_write_chrome_trace(r->lanes, o->trace, title);
        fprintf(stderr, "trace written to %s (open in https://ui.perfetto.dev or chrome://tracing)\n", o->trace);
    }
    if (o->out[0] && r->loop->hist[H_TRAIN].n) {
        draw_loss_svg(r);
        char path[NB_PATH_MAX + 32];
        snprintf(path, sizeof path, "%s/timeline.svg", o->out);
        if (nb_verbosity > 0)
            fprintf(stderr, "run directory %s: metrics.jsonl, loss.svg%s, ckpt/\n", o->out,
                    access(path, F_OK) == 0 ? ", timeline.svg" : "");
    }
}

void nb_run_train(nb_run *r) {
    const nb_train_opts *o = &r->o;
    train_loop L;
    loop_start(r, &L);
    no_steps(r, &L);
    for (; r->step < L.end; r->step++) {
        int step = r->step;
        double secs;
        nb_step_stats st = train_step(r, &L, step, &secs);
        /* --time-limit: this step ends the run like the last one (evaluation, checkpoint); a
         * signal too, without the evaluation */
        int signalled = agree(r, stop_signal);
        int out_of_time = agree(r, o->time_limit > 0 && nb_now() - L.t0 >= o->time_limit) || signalled;
        int is_last = step + 1 == L.end || out_of_time;
        after_step(r, &L, step, secs, &st, is_last, signalled);
        if (out_of_time && (step + 1 < L.end || signalled)) {
            stop_early(r, &L, signalled);
            break;
        }
    }
    drain(r);
    if (L.lead) report_run(r, &L);
    free(L.step_ms);
}
