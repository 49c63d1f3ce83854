#include "sched/trainer.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core.h"
#include "io/atomic.h"
#include "io/json.h"
#include "io/svg.h"
#include "optim/optim.h"
#include "sched/checkpoint.h"
#include "host.h"

void nb_train_opts_defaults(nb_train_opts *o) {
    memset(o, 0, sizeof *o);
    nb_tf_preset("gpt2-mini", &o->model);
    snprintf(o->data, sizeof o->data, "data/sotu/train.bin");
    snprintf(o->val_data, sizeof o->val_data, "data/sotu/val.bin");
    snprintf(o->device, sizeof o->device, "cpu");
    snprintf(o->schedule, sizeof o->schedule, "plain");
    o->batch = 8;
    o->seq = 0; /* 0: the model's context length */
    o->steps = 400;
    o->warmup = -1; /* -1: 5% of steps */
    o->eval_every = 100;
    o->eval_batches = 16;
    o->ckpt_every = 0;
    o->log_every = 0;
    o->lr = 3e-3f;
    o->min_lr_frac = 0.1f;
    o->weight_decay = 0.1f;
    o->beta1 = 0.9f;
    o->beta2 = 0.95f;
    o->eps = 1e-8f;
    o->grad_clip = 1.0f;
    o->seed = 1337;
}

static int warmup_steps(const nb_train_opts *o) { return o->warmup >= 0 ? o->warmup : o->steps / 20; }

void nb_train_opts_print(const nb_train_opts *o, FILE *f) {
    nb_tf_config_print(&o->model, f);
    fprintf(f, "data        train %s, val %s\n", o->data, o->val_data[0] ? o->val_data : "(none)");
    fprintf(f, "run         device %s, schedule %s, batch %d x seq %d = %d tokens/step, steps %d, seed %llu, threads %d\n",
            o->device, o->schedule, o->batch, o->seq, o->batch * o->seq, o->steps, (unsigned long long)o->seed,
            o->threads);
    fprintf(f, "optimizer   adamw lr %g (warmup %d, cosine to %g), betas (%g, %g), eps %g, weight decay %g, clip %g\n",
            o->lr, warmup_steps(o), o->lr * o->min_lr_frac, o->beta1, o->beta2, o->eps, o->weight_decay, o->grad_clip);
    fprintf(f, "output      %s%s%s\n", o->out[0] ? o->out : "(none: --out DIR keeps metrics and checkpoints)",
            o->resume[0] ? ", resuming from " : "", o->resume);
}

/* ---------------------------------------------------------------- work items */

static nb_trainer *trainer_of(void *arg) { return ((nb_work *)arg)->tr; }
static size_t es_of(const nb_trainer *tr) { return nb_dtype_size(tr->be->act_dtype); }
static void *wptr(nb_trainer *tr, int which) { return nb_tf_global_ptr(&tr->model, which, tr->params, es_of(tr)); }
static void *gptr(nb_trainer *tr, int which) { return nb_tf_global_ptr(&tr->model, which, tr->grads, es_of(tr)); }

void nb_work_embed_fwd(void *arg, const nb_task_ctx *ctx) {
    nb_trainer *tr = trainer_of(arg);
    /* gradients accumulate within a step: they start from zero here, before anything adds */
    memset(tr->grads, 0, tr->model.total * sizeof(float));
    nb_tf_embed_forward(&tr->model, tr->be, ctx, wptr(tr, NB_TF_WTE), wptr(tr, NB_TF_WPE), tr->batch->inputs,
                        &tr->acts);
}

static void layer_views(nb_trainer *tr, int l, nb_tf_layer_view *w, nb_tf_layer_view *dw) {
    const nb_tf_model *m = &tr->model;
    size_t g0 = m->group_offset[1 + l] * es_of(tr);
    nb_tf_bind_layer(m, l, (char *)tr->params + g0, es_of(tr), w);
    if (dw) nb_tf_bind_layer(m, l, (char *)tr->grads + g0, es_of(tr), dw);
}

void nb_work_layer_fwd(void *arg, const nb_task_ctx *ctx) {
    nb_work *wk = arg;
    nb_tf_layer_view w;
    layer_views(wk->tr, wk->layer, &w, NULL);
    nb_tf_layer_forward(&wk->tr->model, wk->tr->be, ctx, &w, wk->layer, &wk->tr->acts);
}

static const void *head_weight(nb_trainer *tr, float *slab) {
    int which = tr->model.cfg.tied ? NB_TF_WTE : NB_TF_LM_HEAD;
    return nb_tf_global_ptr(&tr->model, which, slab, es_of(tr));
}

static double sum_losses(const nb_trainer *tr) {
    const float *l = tr->acts.losses;
    size_t n = (size_t)tr->acts.B * tr->acts.T;
    double s = 0;
    for (size_t i = 0; i < n; i++) s += l[i];
    return s;
}

void nb_work_head(void *arg, const nb_task_ctx *ctx) {
    nb_trainer *tr = trainer_of(arg);
    float scale = 1.0f / (float)((size_t)tr->acts.B * tr->acts.T);
    nb_tf_head(&tr->model, tr->be, ctx, wptr(tr, NB_TF_LNF_W), wptr(tr, NB_TF_LNF_B), head_weight(tr, tr->params),
               tr->model.cfg.layers, tr->batch->targets, 1, scale, gptr(tr, NB_TF_LNF_W), gptr(tr, NB_TF_LNF_B),
               (void *)head_weight(tr, tr->grads), &tr->acts);
    tr->loss_sum = sum_losses(tr);
}

void nb_work_layer_bwd(void *arg, const nb_task_ctx *ctx) {
    nb_work *wk = arg;
    nb_tf_layer_view w, dw;
    layer_views(wk->tr, wk->layer, &w, &dw);
    nb_tf_layer_backward(&wk->tr->model, wk->tr->be, ctx, &w, &dw, wk->layer, &wk->tr->acts);
}

void nb_work_embed_bwd(void *arg, const nb_task_ctx *ctx) {
    nb_trainer *tr = trainer_of(arg);
    nb_tf_embed_backward(&tr->model, tr->be, ctx, gptr(tr, NB_TF_WTE), gptr(tr, NB_TF_WPE), tr->batch->inputs,
                         &tr->acts);
}

void nb_work_optim(void *arg, const nb_task_ctx *ctx) {
    nb_trainer *tr = trainer_of(arg);
    const nb_train_opts *o = &tr->o;
    const nb_tf_model *m = &tr->model;
    /* alignment padding between tensors holds zeros, so the whole slab gives the global norm */
    double norm = sqrt(nb_sumsq(tr->grads, m->total));
    float clip = nb_clip_factor(norm, o->grad_clip);
    if (clip < 1.0f) nb_scale_inplace(tr->grads, m->total, clip);
    float lr = nb_lr_cosine(tr->step, warmup_steps(o), o->steps, o->lr, o->lr * o->min_lr_frac);
    for (int i = 0; i < m->nparams; i++) {
        const nb_param *p = &m->params[i];
        nb_adamw_cfg c = {lr, o->beta1, o->beta2, o->eps, p->decay ? o->weight_decay : 0.0f};
        nb_adamw_update(tr->params + p->offset, tr->grads + p->offset, tr->m + p->offset, tr->v + p->offset, p->numel,
                        c, tr->step + 1);
    }
    tr->lr = lr;
    tr->grad_norm = (float)norm;
}

/* ---------------------------------------------------------------- setup */

static void plan_memory(nb_trainer *tr, nb_arena *arena) {
    const nb_tf_model *m = &tr->model;
    size_t slab = m->total * sizeof(float);
    size_t acts = nb_tf_acts_bytes(m, tr->o.batch, tr->o.seq, es_of(tr));
    char b1[32], b2[32], b3[32], b4[32], b5[32];
    nb_log(1, "memory      params %s + grads %s + adamw %s + activations %s (B=%d, T=%d) = %s host\n",
            nb_fmt_bytes(b1, sizeof b1, (double)slab), nb_fmt_bytes(b2, sizeof b2, (double)slab),
            nb_fmt_bytes(b3, sizeof b3, 2.0 * slab), nb_fmt_bytes(b4, sizeof b4, (double)acts), tr->o.batch,
            tr->o.seq, nb_fmt_bytes(b5, sizeof b5, 4.0 * slab + acts));
    nb_arena_init(arena, "host", (nb_device){NB_DEV_CPU, 0}, nb_host_mem_available(), nb_host_allocator);
    size_t off_p = nb_arena_plan_bytes(arena, slab), off_g = nb_arena_plan_bytes(arena, slab);
    size_t off_m = nb_arena_plan_bytes(arena, slab), off_v = nb_arena_plan_bytes(arena, slab);
    size_t off_a = nb_arena_plan_bytes(arena, acts);
    nb_arena_alloc(arena, "lower --batch or --seq, or pick a smaller --model");
    tr->params = (float *)(arena->base + off_p);
    tr->grads = (float *)(arena->base + off_g);
    tr->m = (float *)(arena->base + off_m);
    tr->v = (float *)(arena->base + off_v);
    tr->acts_buf = arena->base + off_a;
}

static nb_arena host_arena;

void nb_trainer_init(nb_trainer *tr, const nb_train_opts *opts) {
    memset(tr, 0, sizeof *tr);
    tr->o = *opts;
    nb_train_opts *o = &tr->o;
    if (o->seq <= 0) o->seq = o->model.seq;
    NB_CHECK(o->seq <= o->model.seq || o->model.arch == NB_ARCH_LLAMA,
             "lower --seq, or raise the model's context with --model-seq", "--seq %d exceeds the model's context %d",
             o->seq, o->model.seq);
    NB_CHECK(!strcmp(o->device, "cpu"), "use --device cpu (the CUDA trainer is not in this build yet)",
             "device '%s' is not available for training", o->device);
    NB_CHECK(!strcmp(o->schedule, "plain"), "use --schedule plain", "unknown schedule '%s'", o->schedule);
    nb_host_set_threads(o->threads);
    tr->be = &nb_backend_cpu;
    nb_tf_model_init(&tr->model, &o->model);
    plan_memory(tr, &host_arena);
    nb_tf_acts_bind(&tr->model, &tr->acts, tr->acts_buf, o->batch, o->seq, es_of(tr));

    tr->lanes = nb_lanes_create("cpu", o->trace[0] ? 1 << 20 : 1 << 16);
    tr->compute = nb_lane_create(tr->lanes, "compute", NB_LANE_DEVICE);
    tr->data = nb_lane_create(tr->lanes, "data", NB_LANE_HOST);
    tr->work = nb_calloc((size_t)o->model.layers, sizeof(nb_work), "work items");
    for (int l = 0; l < o->model.layers; l++) tr->work[l] = (nb_work){tr, l};
    tr->whole = (nb_work){tr, -1};

    size_t start_pos = 0;
    if (o->resume[0]) {
        nb_ckpt_state st;
        nb_ckpt_load(o->resume, &tr->model, tr->params, tr->m, tr->v, &st);
        tr->step = st.step;
        start_pos = st.data_pos;
        NB_CHECK(st.seed == o->seed, "drop --seed, or pass the seed the checkpoint was trained with",
                 "--seed %llu differs from the checkpoint's seed %llu", (unsigned long long)o->seed,
                 (unsigned long long)st.seed);
    } else {
        nb_tf_init_weights(&tr->model, tr->params, o->seed);
    }
    if (o->data[0]) {
        nb_loader_open(&tr->train, o->data, o->model.vocab, o->batch, o->seq, start_pos, 2, tr->data);
        tr->has_train = 1;
    }
    if (o->val_data[0]) {
        /* validate the shard now rather than at the first eval, minutes into the run */
        nb_shard probe;
        nb_shard_load(&probe, o->val_data, o->model.vocab);
        NB_CHECK(probe.ntok >= (size_t)o->batch * o->seq + 1, "use a larger validation shard or a smaller --batch/--seq",
                 "validation shard '%s' holds %zu tokens, fewer than one batch", o->val_data, probe.ntok);
        nb_shard_free(&probe);
        tr->has_val = 1;
    }
}

void nb_trainer_free(nb_trainer *tr) {
    if (tr->has_train) nb_loader_close(&tr->train);
    if (tr->lanes) nb_lanes_destroy(tr->lanes);
    nb_tf_acts_unbind(&tr->acts);
    nb_tf_model_free(&tr->model);
    nb_arena_free(&host_arena);
    free(tr->work);
    if (tr->metrics) fclose(tr->metrics);
    memset(tr, 0, sizeof *tr);
}

/* ---------------------------------------------------------------- eval */

static void work_eval_batch(void *arg, const nb_task_ctx *ctx) {
    nb_trainer *tr = trainer_of(arg);
    const nb_tf_model *m = &tr->model;
    nb_tf_embed_forward(m, tr->be, ctx, wptr(tr, NB_TF_WTE), wptr(tr, NB_TF_WPE), tr->batch->inputs, &tr->acts);
    for (int l = 0; l < m->cfg.layers; l++) {
        nb_tf_layer_view w;
        layer_views(tr, l, &w, NULL);
        nb_tf_layer_forward(m, tr->be, ctx, &w, l, &tr->acts);
    }
    nb_tf_head(m, tr->be, ctx, wptr(tr, NB_TF_LNF_W), wptr(tr, NB_TF_LNF_B), head_weight(tr, tr->params),
               m->cfg.layers, tr->batch->targets, 0, 1.0f, NULL, NULL, NULL, &tr->acts);
    tr->loss_sum = sum_losses(tr);
}

double nb_trainer_eval_shard(nb_trainer *tr, const char *path, int nbatches) {
    nb_loader ld;
    nb_loader_open(&ld, path, tr->model.cfg.vocab, tr->o.batch, tr->o.seq, 0, 1, NULL);
    size_t per_epoch = nb_loader_batches_per_epoch(&ld);
    if (nbatches <= 0 || (size_t)nbatches > per_epoch) nbatches = (int)per_epoch;
    nb_loader_slot *saved = tr->batch;
    double total = 0;
    for (int i = 0; i < nbatches; i++) {
        tr->batch = nb_loader_take(&ld);
        nb_lane_run(tr->compute, "eval", NB_SPAN_FWD, -1, work_eval_batch, &tr->whole);
        nb_mark_wait_host(nb_lane_mark(tr->compute));
        total += tr->loss_sum;
        nb_loader_release(&ld, tr->batch, nb_lane_mark(tr->compute));
    }
    tr->batch = saved;
    nb_loader_close(&ld);
    return total / ((double)nbatches * tr->o.batch * tr->o.seq);
}

typedef struct {
    nb_trainer *tr;
    const int32_t *tokens;
    float *logits;
} logits_job;

static void work_logits(void *arg, const nb_task_ctx *ctx) {
    logits_job *job = arg;
    nb_trainer *tr = job->tr;
    const nb_tf_model *m = &tr->model;
    nb_tf_embed_forward(m, tr->be, ctx, wptr(tr, NB_TF_WTE), wptr(tr, NB_TF_WPE), job->tokens, &tr->acts);
    for (int l = 0; l < m->cfg.layers; l++) {
        nb_tf_layer_view w;
        layer_views(tr, l, &w, NULL);
        nb_tf_layer_forward(m, tr->be, ctx, &w, l, &tr->acts);
    }
    nb_tf_logits_last(m, tr->be, ctx, wptr(tr, NB_TF_LNF_W), wptr(tr, NB_TF_LNF_B), head_weight(tr, tr->params),
                      m->cfg.layers, &tr->acts, job->logits);
}

void nb_trainer_logits(nb_trainer *tr, const int32_t *tokens, int T, float *logits) {
    NB_ASSERT(tr->o.batch == 1 && T >= 1 && T <= tr->o.seq);
    /* the slab was sized for the full context; a shorter prefix fits in the same bytes */
    nb_tf_acts_unbind(&tr->acts);
    nb_tf_acts_bind(&tr->model, &tr->acts, tr->acts_buf, 1, T, es_of(tr));
    logits_job job = {tr, tokens, logits};
    nb_lane_run(tr->compute, "sample", NB_SPAN_FWD, -1, work_logits, &job);
    nb_mark_wait_host(nb_lane_mark(tr->compute));
}

/* ---------------------------------------------------------------- run */

typedef struct {
    double *step, *loss;
    size_t n, cap;
} series;

static void series_push(series *s, double x, double y) {
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 256;
        s->step = realloc(s->step, s->cap * sizeof(double));
        s->loss = realloc(s->loss, s->cap * sizeof(double));
        NB_CHECK(s->step && s->loss, NULL, "out of memory for the loss history");
    }
    s->step[s->n] = x;
    s->loss[s->n++] = y;
}

static series train_hist, val_hist;

static void draw_loss_svg(const nb_trainer *tr) {
    char path[NB_PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/loss.svg", tr->o.out);
    nb_svg_series s[2] = {
        {"train loss", "#1f77b4", (int)train_hist.n, train_hist.step, train_hist.loss},
        {"validation loss", "#d62728", (int)val_hist.n, val_hist.step, val_hist.loss},
    };
    char title[128];
    snprintf(title, sizeof title, "nobubble: %s", tr->model.cfg.preset);
    nb_svg_line_plot(path, title, "step", "loss (nats)", s, val_hist.n ? 2 : 1);
}

/* Keep only the metrics lines of steps before `step` (a resumed run rewrites what follows). */
static void open_metrics(nb_trainer *tr) {
    char path[NB_PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/metrics.jsonl", tr->o.out);
    nb_sbuf kept = {0};
    FILE *old = tr->step > 0 ? fopen(path, "r") : NULL;
    if (old) {
        char line[4096];
        while (fgets(line, sizeof line, old)) {
            nb_json *j = nb_json_parse(line, strlen(line), path, NULL, 0);
            if (!j) continue;
            int64_t s = nb_json_get_int(j, "step", -1);
            if (s >= 0 && s < tr->step) {
                nb_sbuf_puts(&kept, line);
                double loss = nb_json_get_num(j, "loss", NAN), val = nb_json_get_num(j, "val_loss", NAN);
                if (!isnan(loss)) series_push(&train_hist, (double)s, loss);
                if (!isnan(val)) series_push(&val_hist, (double)s, val);
            }
            nb_json_free(j);
        }
        fclose(old);
    }
    nb_write_file_atomic(path, kept.data ? kept.data : "", kept.len);
    nb_sbuf_free(&kept);
    tr->metrics = nb_fopen(path, "a", "choose a writable --out directory");
}

static void fmt_eta(char *buf, size_t cap, double s) {
    if (s < 0 || !isfinite(s)) s = 0;
    int h = (int)(s / 3600), mi = (int)(s / 60) % 60, se = (int)s % 60;
    if (h)
        snprintf(buf, cap, "%dh%02dm", h, mi);
    else
        snprintf(buf, cap, "%dm%02ds", mi, se);
}

void nb_trainer_run(nb_trainer *tr) {
    const nb_train_opts *o = &tr->o;
    int end = o->steps;
    if (o->stop_after > 0 && o->stop_after < end) end = o->stop_after;
    if (o->out[0]) {
        nb_mkdir_p(o->out);
        open_metrics(tr);
    }
    int tty = o->progress && isatty(fileno(stderr));
    int log_every = o->log_every > 0 ? o->log_every : (end - tr->step > 20 ? (end - tr->step) / 20 : 1);
    double tokens = (double)o->batch * o->seq, run_t0 = nb_now(), last_val = NAN;
    int first = tr->step;
    if (tr->step >= end) fprintf(stderr, "nothing to do: the checkpoint is at step %d and --steps is %d\n", tr->step, end);
    for (; tr->step < end; tr->step++) {
        int step = tr->step;
        double t0 = nb_now();
        tr->batch = nb_loader_take(&tr->train);
        nb_mark done = nb_sched_plain_step(tr, step);
        nb_mark_wait_host(done);
        double t1 = nb_now();
        nb_loader_release(&tr->train, tr->batch, done);
        nb_step_stats st = nb_lanes_step_stats(tr->lanes, step, nb_lane_index(tr->compute), t0, t1);
        double loss = tr->loss_sum / tokens, ms = 1e3 * (t1 - t0);
        NB_CHECK(isfinite(loss), "lower --lr, or check the data", "the loss became %g at step %d", loss, step);
        series_push(&train_hist, step, loss);

        int is_last = step + 1 == end;
        double val = NAN;
        if (tr->has_val && o->eval_every > 0 && ((step + 1) % o->eval_every == 0 || is_last)) {
            val = nb_trainer_eval_shard(tr, o->val_data, o->eval_batches);
            series_push(&val_hist, step, val);
            last_val = val;
        }
        if (tr->metrics) {
            nb_json_writer w;
            nb_json_writer_init(&w, 0);
            nb_json_begin_obj(&w);
            nb_json_kint(&w, "step", step);
            nb_json_knum(&w, "loss", loss);
            if (!isnan(val)) nb_json_knum(&w, "val_loss", val);
            nb_json_knum(&w, "lr", tr->lr);
            nb_json_knum(&w, "grad_norm", tr->grad_norm);
            nb_json_knum(&w, "ms", ms);
            nb_json_knum(&w, "tokens_per_s", tokens / (t1 - t0));
            nb_json_knum(&w, "bubble_pct", st.bubble_pct);
            nb_json_end_obj(&w);
            fprintf(tr->metrics, "%s\n", nb_json_text(&w));
            NB_CHECK(fflush(tr->metrics) == 0, "check free disk space in --out", "cannot write metrics.jsonl: %s",
                     strerror(errno));
            nb_json_writer_free(&w);
        }
        int save = o->out[0] && ((o->ckpt_every > 0 && (step + 1) % o->ckpt_every == 0) || is_last);
        if (save) {
            nb_ckpt_state cs = {step + 1, nb_loader_position(&tr->train), o->seed};
            nb_ckpt_save(o->out, &tr->model, o, tr->params, tr->m, tr->v, &cs);
        }
        double elapsed = nb_now() - run_t0, per_step = elapsed / (step + 1 - first);
        char eta[32];
        fmt_eta(eta, sizeof eta, per_step * (end - step - 1));
        if (nb_verbosity == 0) {
            /* --quiet: the summary only */
        } else if (tty) {
            fprintf(stderr, "\rstep %d/%d | loss %.4f | val %.4f | %.0f tok/s | %.0f ms | ETA %s   ", step + 1, end, loss,
                    last_val, tokens / (t1 - t0), ms, eta);
            if (is_last) fputc('\n', stderr);
        } else if ((step + 1 - first) % log_every == 0 || is_last || !isnan(val)) {
            fprintf(stderr, "step %d/%d | loss %.4f%s", step + 1, end, loss, isnan(val) ? "" : " | val ");
            if (!isnan(val)) fprintf(stderr, "%.4f", val);
            fprintf(stderr, " | %.0f tok/s | %.0f ms | bubble %.1f%% | ETA %s\n", tokens / (t1 - t0), ms, st.bubble_pct,
                    eta);
        }
        if (!o->trace[0]) nb_lanes_trace_clear(tr->lanes); /* keep memory flat on long runs */
    }
    double wall = nb_now() - run_t0;
    if (end > first)
        fprintf(stderr, "done: %d steps in %.1f s, %.0f tokens/s%s", end - first, wall,
                tokens * (end - first) / wall, isnan(last_val) ? "\n" : "");
    if (end > first && !isnan(last_val)) fprintf(stderr, ", final validation loss %.4f\n", last_val);
    if (o->trace[0]) {
        nb_lanes_sync(tr->lanes);
        nb_lanes_write_chrome_trace(tr->lanes, o->trace);
        fprintf(stderr, "trace written to %s (open in https://ui.perfetto.dev or chrome://tracing)\n", o->trace);
    }
    if (o->out[0] && train_hist.n) {
        draw_loss_svg(tr);
        if (nb_verbosity > 0) fprintf(stderr, "run directory %s: metrics.jsonl, loss.svg, ckpt/\n", o->out);
    }
}
