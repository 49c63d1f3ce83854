/* The transformer family in a run: the views it binds, its memory, its data (token shards
 * through the prefetching loader), and its layers capability; its step as work items is in
 * transformer_step.c.
 *
 * Memory: the host keeps the fp32 master weights and AdamW moments for checkpoints; the backend
 * (CPU: the same buffers; CUDA: device memory) holds what the step touches: fp32 master weights,
 * fp32 gradients, fp32 moments, the compute-precision copy of the weights (bf16 on CUDA by
 * default; the master itself in fp32 modes), activations, and the batch's tokens. A schedule that
 * keeps the state itself (stream) plans through nb_layers_i instead: the family then reserves only
 * its host master and moments, its activations and its per-step buffers, and its items read and
 * write the input and output stages where the schedule bound them. Evaluation, sampling,
 * checkpoint tensors and the config are in transformer_eval.c. */
#include "family/transformer.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "core.h"
#include "data/hf_tokenizer.h"
#include "data/shardset.h"
#include "host.h"
#include "model/transformer_hf.h"
#include "ops/ops_cuda.h"

_Static_assert(NB_LOADER_IGNORE == NB_XENT_IGNORE, "the loader's ignored target is the one cross-entropy skips");

nb_tf_train *nb_tf_of(nb_run *r) { return r->fs; }

static nb_tf_train *trainer_of(void *arg) { return ((nb_work *)arg)->tr; }
size_t nb_tf_es(const nb_tf_train *tr) { return nb_dtype_size(tr->be->act_dtype); }
static size_t es_of(const nb_tf_train *tr) { return nb_tf_es(tr); }
static int lowp_weights(const nb_tf_train *tr) { return tr->be->act_dtype != NB_F32; }
int nb_tf_on_device(const nb_tf_train *tr) { return tr->be->device != NB_DEV_CPU; }
int nb_tf_head_index(const nb_tf_train *tr) { return tr->model.cfg.tied ? NB_TF_WTE : NB_TF_LM_HEAD; }
int nb_tf_lora_on(const nb_tf_train *tr) { return tr->model.lora != NULL; }

const nb_param *nb_tf_trained(const nb_tf_train *tr, int *n, size_t *total) {
    const nb_tf_lora *lo = tr->model.lora;
    if (n) *n = lo ? lo->nparams : tr->model.nparams;
    if (total) *total = lo ? lo->total : tr->model.total;
    return lo ? lo->params : tr->model.params;
}
size_t nb_tf_trained_total(const nb_tf_train *tr) {
    size_t t;
    nb_tf_trained(tr, NULL, &t);
    return t;
}

/* Reads the step's loss sum and gradient norm, in order on the lane (a schedule that keeps the
 * state gives the norm itself: nb_sched_i.grad_norm). */
static void work_read_loss(void *arg, const nb_task_ctx *ctx) {
    nb_tf_train *tr = trainer_of(arg);
    double two[2];
    tr->be->to_host(ctx, two, tr->d_step, sizeof two);
    tr->loss_sum = two[0];
    /* the micro-batches' sums in their order: the rank-order sum's bits when they are ranks */
    tr->loss_acc = tr->micro ? tr->loss_acc + two[0] : two[0];
    tr->grad_norm = (float)sqrt(two[1]);
}

/* Host master state -> backend (start, resume), backend -> host (checkpoints). */
static void work_upload_state(void *arg, const nb_task_ctx *ctx) {
    nb_tf_train *tr = trainer_of(arg);
    const nb_backend_i *be = tr->be;
    size_t n = nb_tf_trained_total(tr), bytes = n * sizeof(float);
    if (nb_tf_lora_on(tr)) nb_tf_upload_base(tr, ctx);
    be->to_backend(ctx, tr->d_params, tr->params, bytes);
    if (tr->m) { /* eval plans no moments */
        be->to_backend(ctx, tr->d_m, tr->m, bytes);
        be->to_backend(ctx, tr->d_v, tr->v, bytes);
    }
    if (lowp_weights(tr)) be->cast_params(ctx, tr->d_weights, tr->d_params, n);
}

static void work_download_state(void *arg, const nb_task_ctx *ctx) {
    nb_tf_train *tr = trainer_of(arg);
    size_t bytes = nb_tf_trained_total(tr) * sizeof(float);
    tr->be->to_host(ctx, tr->params, tr->d_params, bytes);
    tr->be->to_host(ctx, tr->m, tr->d_m, bytes);
    tr->be->to_host(ctx, tr->v, tr->d_v, bytes);
}

/* ---------------------------------------------------------------- memory */

static void set_segments(nb_tf_train *tr) {
    const nb_train_opts *o = &tr->o;
    int L = tr->model.cfg.layers;
    tr->nseg = 1;
    tr->seg_first[0] = 0, tr->seg_first[1] = L;
    if (o->detach[0]) tr->nseg = nb_parse_detach(o->detach, L, "layer counts", tr->seg_first, NB_MAX_SEGMENTS);
    NB_CHECK(tr->nseg == 1 || o->aux_weight > 0, "pass --aux-weight > 0 with --detach",
             "detached segments learn from their local heads only: --aux-weight is %g", (double)o->aux_weight);
    tr->layer_seg = nb_malloc((size_t)(L ? L : 1) * sizeof(int), "segments");
    for (int s = 0; s < tr->nseg; s++)
        for (int l = tr->seg_first[s]; l < tr->seg_first[s + 1]; l++) tr->layer_seg[l] = s;
    const nb_tf_model *m = &tr->model;
    int which[3] = {NB_TF_LNF_W, NB_TF_LNF_B, nb_tf_head_index(tr)};
    tr->head_part_stride = 0;
    for (int k = 0; k < 3; k++)
        if (m->global_idx[which[k]] >= 0) tr->head_part_stride += nb_align_up(m->params[m->global_idx[which[k]]].numel, 64);
    for (int s = 0; s < tr->nseg; s++) tr->seg_work[s] = (nb_work){tr, s};
}

static size_t acts_plan_bytes(const nb_tf_train *tr, int ckpt_interval, int keep) {
    const nb_train_opts *o = &tr->o;
    return ckpt_interval > 0 ? nb_tf_acts_bytes_ckpt(&tr->model, o->batch, o->seq, es_of(tr), ckpt_interval, keep)
                             : nb_tf_acts_bytes(&tr->model, o->batch, o->seq, es_of(tr));
}

static size_t seg_bytes(const nb_tf_train *tr) {
    return (size_t)(tr->nseg - 1) * (nb_tf_seg_scratch_bytes(&tr->model, tr->o.batch, tr->o.seq, es_of(tr)) +
                                     tr->head_part_stride * sizeof(float));
}

static size_t token_bytes(const nb_tf_train *tr) { return 2 * (size_t)tr->o.batch * tr->o.seq * sizeof(int32_t); }
/* every micro-batch of the step, staged at once */
static size_t staged_bytes(const nb_tf_train *tr) { return 2 * (size_t)tr->Bl * tr->o.seq * sizeof(int32_t); }
static size_t work_bytes(const nb_tf_train *tr) { return acts_plan_bytes(tr, tr->ckpt_interval, tr->keep) + seg_bytes(tr); }

#define NB_UNPLANNED SIZE_MAX
static size_t plan_in(nb_arena *a, size_t bytes) { return nb_arena_plan_bytes(a, bytes); }

/* the host master and moments (every plan has them: checkpoints read them; a schedule that keeps
 * some moments on the device reserves fewer, moment_numel each) */
static void reserve_state(nb_run *r, size_t moment_numel) {
    nb_tf_train *tr = r->fs;
    size_t slab = nb_tf_trained_total(tr) * sizeof(float), mom = moment_numel * sizeof(float);
    memset(&tr->plan, 0xff, sizeof tr->plan);
    tr->plan.resident = 0;
    tr->plan.hp = plan_in(&r->host, slab);
    if (r->eval_only) return; /* eval reads no optimizer state */
    tr->plan.hm = plan_in(&r->host, mom), tr->plan.hv = plan_in(&r->host, mom);
}

/* stream's reservation; with LoRA (the schedule keeps the frozen base) the adapters stay resident
 * where the step runs, as under plain, and train with the family's own AdamW item */
static void layers_reserve_state(nb_run *r, size_t moment_numel) {
    nb_tf_train *tr = r->fs;
    size_t slab = nb_tf_trained_total(tr) * sizeof(float);
    reserve_state(r, nb_tf_lora_on(tr) ? nb_tf_trained_total(tr) : moment_numel);
    if (!nb_tf_lora_on(tr)) return;
    nb_tf_plan *p = &tr->plan;
    p->resident = 1;
    nb_tf_lora_log(tr);
    if (!nb_tf_on_device(tr)) {
        if (!r->eval_only) p->hg = plan_in(&r->host, slab);
        return;
    }
    p->dp = plan_in(&r->dev, slab); /* eval: the adapters alone, no gradient or moments */
    if (!r->eval_only) p->dg = plan_in(&r->dev, slab), p->dm = plan_in(&r->dev, slab), p->dv = plan_in(&r->dev, slab);
    if (lowp_weights(tr)) p->dw = plan_in(&r->dev, nb_tf_trained_total(tr) * es_of(tr));
}

/* the activations (and the segments' scratch after them), tokens and step scalars */
static void reserve_work(nb_run *r, int ckpt_interval, int keep) {
    nb_tf_train *tr = r->fs;
    tr->ckpt_interval = ckpt_interval, tr->keep = keep;
    size_t acts = work_bytes(tr);
    if (!nb_tf_on_device(tr)) {
        tr->plan.ha = plan_in(&r->host, acts);
        return;
    }
    tr->plan.dac = plan_in(&r->dev, acts), tr->plan.dt = plan_in(&r->dev, token_bytes(tr));
    tr->plan.ds = plan_in(&r->dev, sizeof(nb_step_scalars));
}

/* The plan term by term (r->mem): the host master and moments for checkpoints, the rest where the
 * step runs. */
static void record_plan(nb_run *r, size_t slab, size_t wl, size_t acts, size_t other, size_t gsum) {
    nb_tf_train *tr = r->fs;
    nb_mem_plan *mp = &r->mem;
    size_t train = r->eval_only ? 0 : slab; /* the gradient and each moment */
    mp->host = (nb_mem_side){.weights = slab, .moments = 2 * train};
    nb_mem_side *w = nb_tf_on_device(tr) ? &mp->dev : &mp->host;
    if (nb_tf_on_device(tr)) w->weights = slab + wl, w->moments = 2 * train;
    w->grads = train + gsum, w->acts = acts, w->other = other;
    mp->saved = "";
}

/* The whole model state resident where the step runs (plain, erase): on the CPU everything in
 * host memory; on a GPU the host keeps the master weights and moments for checkpoints. */
static void tf_plan(nb_run *r) {
    nb_tf_train *tr = r->fs;
    nb_tf_plan *p = &tr->plan;
    size_t slab = nb_tf_trained_total(tr) * sizeof(float), wl = lowp_weights(tr) ? nb_tf_trained_total(tr) * es_of(tr) : 0;
    size_t acts = work_bytes(tr), toks = token_bytes(tr);
    /* the step's sum beside a micro-batch's gradient; eval: no gradients or moments at all */
    size_t gsum = tr->o.grad_accum > 1 && !r->eval_only ? slab : 0, train = r->eval_only ? 0 : slab;
    int devb = nb_tf_on_device(tr);
    char b[6][32];
    if (r->eval_only)
        nb_log(1, "memory      %s: params %s%s%s + activations %s (B=%d, T=%d) = %s (evaluation: no gradients or optimizer state)\n",
               devb ? "device" : "host", nb_fmt_bytes(b[0], 32, (double)slab), wl ? " + bf16 weights " : "",
               wl ? nb_fmt_bytes(b[3], 32, (double)wl) : "", nb_fmt_bytes(b[4], 32, (double)acts), tr->o.batch, tr->o.seq,
               nb_fmt_bytes(b[5], 32, slab + wl + acts + toks));
    else
        nb_log(1, "memory      %s: params %s + grads %s + adamw %s%s%s + activations %s (B=%d, T=%d) = %s\n",
               devb ? "device" : "host", nb_fmt_bytes(b[0], 32, (double)slab), nb_fmt_bytes(b[1], 32, (double)slab),
               nb_fmt_bytes(b[2], 32, 2.0 * slab), wl ? " + bf16 weights " : "", wl ? nb_fmt_bytes(b[3], 32, (double)wl) : "",
               nb_fmt_bytes(b[4], 32, (double)acts), tr->o.batch, tr->o.seq, nb_fmt_bytes(b[5], 32, 4.0 * slab + wl + acts + toks));
    reserve_state(r, nb_tf_trained_total(tr));
    record_plan(r, slab, wl, acts, toks + (devb ? sizeof(nb_step_scalars) : 0), gsum);
    nb_tf_lora_plan(r);
    p->resident = 1;
    if (!devb) {
        if (train) p->hg = plan_in(&r->host, train);
        p->ha = plan_in(&r->host, acts);
        if (gsum) p->hs = plan_in(&r->host, gsum);
    } else {
        if (gsum) p->dsum = plan_in(&r->dev, gsum);
        p->dp = plan_in(&r->dev, slab);
        if (train) p->dg = plan_in(&r->dev, train), p->dm = plan_in(&r->dev, train), p->dv = plan_in(&r->dev, train);
        if (wl) p->dw = plan_in(&r->dev, wl);
        p->dac = plan_in(&r->dev, acts), p->dt = plan_in(&r->dev, toks), p->ds = plan_in(&r->dev, sizeof(nb_step_scalars));
    }
    nb_run_alloc_arenas(r, "lower --batch or --seq, pick a smaller --model, or --schedule stream (host memory)");
}

static void *at(nb_arena *a, size_t off) { return off == NB_UNPLANNED ? NULL : (void *)(a->base + off); }

/* The planned buffers' addresses, once the run allocated its arenas. */
static void place(nb_run *r) {
    nb_tf_train *tr = r->fs;
    const nb_tf_plan *p = &tr->plan;
    int devb = nb_tf_on_device(tr);
    tr->params = at(&r->host, p->hp), tr->m = at(&r->host, p->hm), tr->v = at(&r->host, p->hv);
    tr->base = at(&r->host, p->hb);
    tr->d_base = devb ? at(&r->dev, p->db) : (void *)tr->base;
    nb_arena *work = devb ? &r->dev : &r->host;
    tr->d_acts = at(work, devb ? p->dac : p->ha);
    tr->d_segs = tr->nseg > 1 ? (char *)tr->d_acts + (work_bytes(tr) - seg_bytes(tr)) : NULL;
    if (p->resident && !devb) {
        tr->d_params = tr->params, tr->d_m = tr->m, tr->d_v = tr->v;
        tr->d_grads = at(&r->host, p->hg);
        tr->d_weights = tr->params;
    } else if (p->resident) {
        tr->d_params = at(&r->dev, p->dp), tr->d_grads = at(&r->dev, p->dg);
        tr->d_m = at(&r->dev, p->dm), tr->d_v = at(&r->dev, p->dv);
        tr->d_weights = p->dw != NB_UNPLANNED ? at(&r->dev, p->dw) : (void *)tr->d_params;
    }
    float *gsum = at(work, devb ? p->dsum : p->hs);
    tr->d_gsum = gsum ? gsum : tr->d_grads;
    if (!devb) {
        tr->d_step = tr->h_step = &tr->cpu_step;
        return;
    }
    tr->d_tokens = at(&r->dev, p->dt);
    tr->d_step = at(&r->dev, p->ds);
    tr->h_step = tr->be->host_alloc(sizeof(nb_step_scalars), "step scalars");
    tr->h_tokens = tr->be->host_alloc(staged_bytes(tr), "token staging");
}

/* Segment views over the scratch planned after the activations: [scratch 0 .. scratch S-2 |
 * partial gradients]; the last segment uses the activations' own buffers. */
static void bind_segments(nb_tf_train *tr) {
    tr->seg_acts = nb_calloc((size_t)tr->nseg, sizeof(nb_tf_acts), "segments");
    size_t sb = nb_tf_seg_scratch_bytes(&tr->model, tr->o.batch, tr->o.seq, es_of(tr));
    for (int s = 0; s + 1 < tr->nseg; s++)
        nb_tf_seg_view(&tr->model, &tr->acts, &tr->seg_acts[s], (char *)tr->d_segs + (size_t)s * sb, es_of(tr));
    tr->seg_acts[tr->nseg - 1] = tr->acts;
    tr->d_head_part = tr->nseg > 1 ? (float *)((char *)tr->d_segs + (size_t)(tr->nseg - 1) * sb) : NULL;
}

/* ---------------------------------------------------------------- the layers capability */

static void layers_slab(nb_run *r, nb_layer_slab *s) {
    nb_tf_train *tr = r->fs;
    const nb_tf_model *m = &tr->model;
    int L = m->cfg.layers;
    *s = (nb_layer_slab){
        .layers = L,
        .total = m->total,
        .layer_numel = L ? m->group_numel[1] : 0,
        .layer_offset = tr->layer_offset,
        .in_off = m->group_offset[0],
        .in_n = m->group_numel[0],
        .out_off = m->group_offset[L + 1],
        .out_n = m->group_numel[L + 1],
        .spans = tr->spans,
        .nspans = m->nparams,
        .params = tr->params,
        .m = tr->m,
        .v = tr->v,
        .k = tr->h_step ? tr->h_step->k : NULL, /* NULL while planning: the scalars are bound later */
        .elem = es_of(tr),
    };
    if (nb_tf_lora_on(tr)) { /* the base is frozen: the schedule keeps it, the adapters train here */
        s->frozen = 1, s->trained = nb_tf_trained_total(tr);
        s->params = s->m = s->v = NULL, s->spans = NULL, s->nspans = 0;
    }
    for (int l = 0; l < L; l++) NB_ASSERT(m->group_numel[1 + l] == s->layer_numel);
}

static size_t layers_acts_bytes(const nb_run *r, int ckpt_interval, int keep) {
    return acts_plan_bytes(r->fs, ckpt_interval, keep);
}
static size_t layers_io_bytes(const nb_run *r) { return token_bytes(r->fs); }

static void layers_bind(nb_run *r, void *w, float *g, nb_layer_fetch_fn fetch, void *self) {
    nb_tf_train *tr = r->fs;
    tr->res_w = w, tr->res_g = g, tr->fetch = fetch, tr->fetch_self = self;
}

static void layers_bind_state(nb_run *r, const nb_state_map *map) {
    nb_tf_train *tr = r->fs;
    tr->state_map = *map;
    tr->has_state_map = 1;
}

/* LoRA: the base at w (dw NULL), the adapters and their gradient in the family's resident slabs */
static void layers_forward(nb_run *r, nb_ctx ctx, int l, const void *w) {
    nb_tf_train *tr = r->fs;
    nb_tf_layer_view v;
    nb_tf_bind_layer(&tr->model, l, (void *)w, es_of(tr), &v);
    nb_tf_lora_bind(tr->model.lora, l, tr->d_weights, es_of(tr), &v);
    nb_tf_layer_forward(&tr->model, tr->be, ctx, &v, l, &tr->acts);
}

static void layers_backward(nb_run *r, nb_ctx ctx, int l, const void *w, float *dw) {
    nb_tf_train *tr = r->fs;
    nb_tf_layer_view v, dv;
    nb_tf_bind_layer(&tr->model, l, (void *)w, es_of(tr), &v);
    nb_tf_lora_bind(tr->model.lora, l, tr->d_weights, es_of(tr), &v);
    nb_tf_bind_layer(&tr->model, l, dw, sizeof(float), &dv);
    nb_tf_lora_bind(tr->model.lora, l, tr->g_cur, sizeof(float), &dv);
    nb_tf_layer_backward(&tr->model, tr->be, ctx, &v, &dv, l, &tr->acts);
}

static void layers_bind_base(nb_run *r, nb_base_sink_fn sink, void *self) {
    nb_tf_train *tr = r->fs;
    tr->base_sink = sink, tr->base_sink_self = self;
}

static const nb_layers_i tf_layers = {
    .slab = layers_slab,
    .acts_bytes = layers_acts_bytes,
    .io_bytes = layers_io_bytes,
    .reserve_state = layers_reserve_state,
    .reserve_work = reserve_work,
    .place = place,
    .bind = layers_bind,
    .bind_state = layers_bind_state,
    .forward = layers_forward,
    .backward = layers_backward,
    .bind_base = layers_bind_base,
};

/* ---------------------------------------------------------------- family entries */

static void tf_check(nb_train_opts *o) {
    if (o->seq <= 0) o->seq = o->model.seq;
    /* seqctr's ways to split a step (a state.json may still carry them; the flags are refused) */
    NB_CHECK(o->micro_batches <= 1 && o->emulate_ranks == 0, "use --grad-accum to split a transformer's step",
             "micro_batches %d / emulate_ranks %d are seqctr's (FWP, emulated ranks): a transformer does not read them",
             o->micro_batches, o->emulate_ranks);
    int parts = o->world * o->grad_accum;
    NB_CHECK(o->batch % parts == 0, "pass a --batch that the ranks times --grad-accum divide",
             "--batch %d cannot be split into %d rank%s x %d micro-batch%s of equal size", o->batch, o->world,
             o->world == 1 ? "" : "s", o->grad_accum, o->grad_accum == 1 ? "" : "es");
    nb_tf_lora_check(o);
    NB_CHECK(o->seq <= o->model.seq, "lower --seq", "--seq %d exceeds the model's context %d", o->seq, o->model.seq);
    NB_CHECK((double)o->batch * o->seq <= 2147483647.0, "lower --batch or --seq",
             "--batch %d x --seq %d = %.0f tokens per step: more than 2^31", o->batch, o->seq, (double)o->batch * o->seq);
}

/* the model, its segments and its step's items; memory comes with the plan */
static void tf_init(nb_run *r) {
    nb_tf_train *tr = nb_calloc(1, sizeof *tr, "the transformer family");
    r->fs = tr;
    tr->run = r;
    tr->o = r->o;
    /* the family's own copy counts in micro-batches: the memory plan, activations, eval batches */
    tr->Bg = r->o.batch;
    tr->Bl = r->o.batch / r->world;
    tr->o.batch = tr->Bl / r->nmicro;
    tr->inv_tokens = 1.0f / (float)((size_t)tr->Bg * tr->o.seq);
    tr->be = r->be;
    tr->lanes = r->lanes;
    tr->compute = r->compute;
    nb_tf_model_init(&tr->model, &tr->o.model);
    if (tr->o.lora_r > 0) {
        nb_tf_lora_init(&tr->lora, &tr->o.model, tr->o.lora_r, tr->o.lora_alpha,
                        nb_tf_lora_parse_targets(tr->o.lora_targets, tr->o.model.arch));
        tr->model.lora = &tr->lora;
    }
    set_segments(tr);
    int L = tr->model.cfg.layers;
    tr->layer_offset = nb_malloc((size_t)(L ? L : 1) * sizeof(size_t), "layer offsets");
    for (int l = 0; l < L; l++) tr->layer_offset[l] = tr->model.group_offset[1 + l];
    tr->work = nb_calloc((size_t)(L ? L : 1), sizeof(nb_work), "work items");
    for (int l = 0; l < L; l++) tr->work[l] = (nb_work){tr, l};
    tr->whole = (nb_work){tr, -1};
    /* AdamW's tensor table, built once (the step reads it; a captured graph keeps a copy) */
    int np;
    const nb_param *tp = nb_tf_trained(tr, &np, NULL);
    tr->spans = nb_malloc((size_t)(np ? np : 1) * sizeof *tr->spans, "AdamW tensor table");
    for (int i = 0; i < np; i++) {
        const nb_param *p = &tp[i];
        tr->spans[i] = (nb_adamw_span){p->offset, p->numel, p->decay ? 0 : 1};
    }
    nb_tf_build_items(r, tr);
}

/* after the plan: addresses, activation views, the data lane, the gradient buckets */
static void tf_bind(nb_run *r) {
    nb_tf_train *tr = r->fs;
    const nb_train_opts *o = &tr->o;
    place(r);
    if (tr->ckpt_interval > 0)
        nb_tf_acts_bind_ckpt(&tr->model, &tr->acts, tr->d_acts, o->batch, o->seq, es_of(tr), tr->ckpt_interval, tr->keep);
    else
        nb_tf_acts_bind(&tr->model, &tr->acts, tr->d_acts, o->batch, o->seq, es_of(tr));
    bind_segments(tr);
    tr->data = nb_lane_create(r->lanes, "data", NB_LANE_HOST);
    tr->g_cur = tr->d_gsum;
    nb_tf_set_buckets(r, tr);
}

/* A loss mask on the training data: every mask checked and counted now (not minutes into the
 * run), and said. On a set of its own: the loader's belongs to its data lane, already filling. */
static void start_masked(nb_tf_train *tr) {
    nb_shardset own, *set = &own;
    nb_shardset_open(set, tr->o.data, tr->o.model.vocab, "training data");
    size_t counted = nb_shardset_count_targets(set), total = nb_shardset_ntok(set);
    char what[NB_PATH_MAX];
    nb_shardset_describe_masks(set, what, sizeof what);
    nb_shardset_close(set);
    NB_CHECK(counted > 0, "remake the data with 'nobubble tokenize --chat' (--train-on response, prompt or all), or delete the .mask files",
             "the loss masks of '%s' (%s) mark no token as a target: nothing to train on", tr->o.data, what);
    if (nb_verbosity > 0) {
        char a[32], b[32];
        fprintf(stderr, "data        trains on %s of %s tokens (%.1f%%: %s)\n", nb_fmt_count(a, sizeof a, counted),
                nb_fmt_count(b, sizeof b, total), 100.0 * (double)counted / (double)total, what);
    }
    tr->masked = 1;
}

typedef struct {
    nb_run *r;
    float *out;
    size_t n;
    uint64_t seed, stream;
    float mean, std;
} fill_job;

static void work_fill(void *arg, const nb_task_ctx *ctx) {
    fill_job *j = arg;
    j->r->be->fill_normal(ctx, j->out, j->n, j->seed, j->stream, j->mean, j->std);
}

static void fill_on_backend(void *self, float *out, size_t n, uint64_t seed, uint64_t stream, float mean, float std) {
    fill_job j = {self, out, n, seed, stream, mean, std};
    nb_run_on_compute(self, "seeded init", work_fill, &j);
}

const nb_tf_filler *nb_tf_filler_of(nb_run *r, nb_tf_filler *f) {
    if (!nb_tf_on_device(nb_tf_of(r))) return NULL;
    f->fn = fill_on_backend, f->self = r;
    return f;
}

static void tf_start(nb_run *r, const char *resume_dir) {
    nb_tf_train *tr = r->fs;
    const nb_train_opts *o = &tr->o;
    /* the data before the weights: a bad shard fails in a second, not after minutes of init */
    if (o->val_data[0]) {
        /* validate the shards now rather than at the first eval, minutes into the run */
        nb_shardset probe;
        nb_shardset_open(&probe, o->val_data, o->model.vocab, "validation data");
        NB_CHECK(nb_shardset_ntok(&probe) >= (size_t)o->batch * o->seq + 1, "use a larger validation shard or a smaller --batch/--seq",
                 "validation shard '%s' holds %zu tokens, fewer than one batch", o->val_data, nb_shardset_ntok(&probe));
        nb_shardset_close(&probe);
        tr->has_val = 1;
    }
    if (!r->eval_only && o->data[0]) {
        /* this rank's sequences of every global batch: micro-batch k of rank r is global
         * micro-batch r * K + k, as one rank with --grad-accum (ranks x K) would read it */
        nb_loader_open_slice(&tr->train, o->data, o->model.vocab, tr->Bl, o->seq, tr->Bg, (size_t)r->rank * tr->Bl,
                             r->data_pos0, 2, tr->data);
        tr->has_train = 1;
        if (nb_verbosity > 0) {
            char what[NB_PATH_MAX], n[32];
            nb_shardset_describe(&tr->train.shards, what, sizeof what);
            fprintf(stderr, "data        %s tokens%s %s\n", nb_fmt_count(n, sizeof n, nb_shardset_ntok(&tr->train.shards)),
                    tr->train.shards.n > 1 ? ", read in this order:" : " in", what);
        }
        if (tr->train.masked) start_masked(tr);
    }
    if (nb_tf_lora_on(tr))
        nb_tf_lora_start(r, resume_dir);
    else if (resume_dir)
        nb_tf_load_tensors(r, resume_dir);
    else if (o->init_from[0])
        nb_hf_import(o->init_from, &tr->model, tr->params);
    else
        nb_tf_init_weights(&tr->model, tr->params, o->seed, nb_tf_filler_of(r, &(nb_tf_filler){0}));
    if (r->eval_only) return;
    if (nb_verbosity > 0) {
        double per_token = nb_tf_flops_per_token(&tr->model, o->seq);
        double rec = nb_tf_recompute_flops_per_token(&tr->model, o->seq, tr->ckpt_interval, tr->keep);
        fprintf(stderr, "parameters  %.2f M (%zu tensors), %.1f MFLOP per token\n", tr->model.n_real / 1e6,
                (size_t)tr->model.nparams, per_token / 1e6);
        if (rec > 0)
            fprintf(stderr, "recompute   +%.3f MFLOP per token (layer forwards run twice): hardware %.3f MFLOP per token\n",
                    rec / 1e6, (per_token + rec) / 1e6);
    }
}

static void tf_upload(nb_run *r) { nb_run_on_compute(r, "upload state", work_upload_state, &nb_tf_of(r)->whole); }

static void tf_free(nb_run *r) {
    nb_tf_train *tr = r->fs;
    if (!tr) return;
    if (tr->has_train) nb_loader_close(&tr->train);
    if (tr->h_tokens) tr->be->host_free(tr->h_tokens);
    if (tr->h_step && tr->h_step != &tr->cpu_step) tr->be->host_free(tr->h_step);
    nb_tf_acts_unbind(&tr->acts);
    nb_tf_model_free(&tr->model);
    nb_tf_lora_free(&tr->lora);
    if (tr->d_logits) tr->be->free(tr->d_logits);
    free(tr->work), free(tr->layer_seg), free(tr->seg_acts), free(tr->spans), free(tr->buckets), free(tr->layer_offset);
    free(tr->state_io);
    free(tr);
    r->fs = NULL;
}

static double tf_per_step(const nb_run *r) { return (double)r->o.batch * r->o.seq; }

/* what the step's loss sum (every rank's) is the mean over: its tokens, or its counted targets */
static double tf_loss_count(const nb_run *r) {
    const nb_tf_train *tr = r->fs;
    return tr->masked ? (double)tr->counted : tf_per_step(r);
}

/* the AdamW scalars of this step (the learning rate from the schedule) */
static void tf_begin_step(nb_run *r, int step) {
    nb_tf_train *tr = r->fs;
    nb_tf_stage_batch(tr, nb_loader_take(&tr->train));
    const nb_train_opts *o = &tr->o;
    float lr = nb_lr_cosine(step, nb_train_warmup_steps(o), o->steps, o->lr, o->lr * o->min_lr_frac);
    nb_adamw_cfg decay = {lr, o->beta1, o->beta2, o->eps, o->weight_decay}, none = decay;
    none.weight_decay = 0.0f;
    tr->h_step->k[0] = nb_adamw_prepare(decay, step + 1);
    tr->h_step->k[1] = nb_adamw_prepare(none, step + 1);
    r->lr = lr;
    if (tr->masked) {
        /* A batch with no counted target (every one masked) has loss 0 and a zero gradient; its
         * optimizer step still runs (moments decay, weight decay applies), as in a run whose
         * gradient happens to vanish, so the ranks and the schedule stay in step. */
        tr->counted = tr->batch->counted;
        tr->h_step->loss_scale = tr->counted ? 1.0f / (float)tr->counted : 0.0f;
    }
}

static void tf_enqueue_results(nb_run *r, int step) {
    nb_tf_train *tr = r->fs;
    nb_lane_run(r->compute, "read loss", NB_SPAN_OTHER, step, work_read_loss, &tr->whole);
}

/* micro-batch k reads the k-th slice of the staged batch; its backward writes the step's sum
 * (the first) or a slab of its own, added to the sum bucket by bucket (nb_items_run) */
static void tf_begin_micro(nb_run *r, int k) {
    nb_tf_train *tr = r->fs;
    tr->micro = k;
    tr->g_cur = k ? tr->d_grads : tr->d_gsum;
}

static void tf_end_step(nb_run *r, int step, nb_mark done) {
    nb_tf_train *tr = r->fs;
    nb_loader_release(&tr->train, tr->batch, done);
    r->loss_sum = tr->loss_acc;
    double count = tf_loss_count(r);
    r->loss = count > 0 ? tr->loss_acc / count : 0.0;
    r->grad_norm = tr->grad_norm;
    tr->micro = 0;
    tr->g_cur = tr->d_gsum;
}

/* The first gradient tensor with a non-finite element (after a step whose norm was not finite). */
static const char *tf_nonfinite_grad(nb_run *r) {
    static char what[128];
    nb_tf_train *tr = r->fs;
    int n;
    const nb_param *tp = nb_tf_trained(tr, &n, NULL);
    for (int i = 0; i < n; i++) {
        const nb_param *p = &tp[i];
        if (nb_run_nonfinite(r, tr->d_gsum + p->offset, p->numel)) {
            snprintf(what, sizeof what, "the gradient of %s", p->name);
            return what;
        }
    }
    return NULL;
}

static void tf_metrics(const nb_run *r, nb_json_writer *w, double secs, const nb_eval *ev) {
    if (ev && ev->done) nb_json_knum(w, "val_loss", ev->loss);
    nb_json_knum(w, "lr", r->lr);
    nb_json_knum(w, "grad_norm", r->grad_norm);
    (void)secs;
}

static void tf_metrics_losses(const nb_json *line, double *loss, double *held_out) {
    *loss = nb_json_get_num(line, "loss", NAN);
    *held_out = nb_json_get_num(line, "val_loss", NAN);
}

static void tf_print_eval(const nb_run *r, int step, const nb_eval *ev) { (void)r, (void)step, (void)ev; }

static size_t tf_data_pos(const nb_run *r) {
    nb_tf_train *tr = r->fs;
    return tr->has_train ? nb_loader_position(&tr->train) : 0;
}

static void tf_sync_to_host(nb_run *r) {
    nb_tf_train *tr = r->fs;
    if (nb_tf_on_device(tr)) nb_run_on_compute(r, "download state", work_download_state, &tr->whole);
}

/* Which attention ran, when --attn asked for cuDNN's (a refusal falls back to ours silently
 * after one notice, so the summary says how often each ran). */
static void tf_summary(nb_run *r, int steps_run) {
    (void)r, (void)steps_run;
#ifdef NB_WITH_CUDA
    nb_attn_report(r->backend);
#endif
}

static int tf_graph_key(nb_run *r) {
    (void)r;
    return 0; /* one shape for every step */
}

static const char *tf_model_name(const nb_train_opts *o) { return o->model.preset; }

static int tf_owns_model(const char *model) {
    nb_tf_config c;
    return nb_tf_preset(model, &c);
}

static const char *const tf_defaults[] = {
    "data=data/sotu/train.bin", "val-data=data/sotu/val.bin", "aux-weight=1", "side-lanes=2", "batch=8", "steps=400",
    "warmup=-1", "eval-every=100", "eval-batches=16", "lr=3e-3", "min-lr-frac=0.1", "weight-decay=0.1", "beta2=0.95",
    "grad-clip=1", "seed=1337", NULL,
};

/* gpt2-mini on the State of the Union corpus unless --model names another preset */
static void tf_preset(nb_train_opts *o) {
    const char *name = o->model_name[0] ? o->model_name : "gpt2-mini";
    NB_CHECK(nb_tf_preset(name, &o->model), "pass one of the presets nobubble train --help lists", "unknown --model '%s'", name);
}

/* A folder as state.json keeps it: absolute, so sample and export find it from anywhere. */
static void absolute_dir(const char *dir, char *out, size_t cap, const char *flag) {
    char real[PATH_MAX];
    NB_CHECK(realpath(dir, real), "pass an existing folder", "%s %s: %s", flag, dir, strerror(errno));
    NB_CHECK(strlen(real) < cap, "move the folder to a shorter path", "%s %s: path too long", flag, real);
    snprintf(out, cap, "%s", real);
}

/* --init-from HF_DIR: the shape is its config.json's (flags that set one are refused) and its
 * tensors are checked now, before anything is planned; tf_start loads them. */
static void import_shape(nb_train_opts *o, int (*seen)(const void *, const char *), const void *ctx) {
    static const char *const shape_flags[] = {"model", "layers", "dim", "heads", "kv-heads", "ffn", "vocab", NULL};
    int was = nb_fail_set_exit_code(2);
    for (const char *const *f = shape_flags; *f; f++)
        NB_CHECK(!seen(ctx, *f), "drop the flag: with --init-from the model's shape comes from HF_DIR/config.json",
                 "--%s with --init-from %s", *f, o->init_from);
    nb_fail_set_exit_code(was);
    nb_hf_import_config(o->init_from, seen(ctx, "seq") ? o->model.seq : 0, &o->model);
    nb_tf_model m;
    nb_tf_model_init(&m, &o->model);
    nb_hf_import_check(o->init_from, &m);
    nb_hf_origin_import(o->init_from, &m, &o->hf);
    nb_tf_model_free(&m);
    absolute_dir(o->init_from, o->init_source, sizeof o->init_source, "--init-from");
    /* the checkpoint's own tokenizer, unless --tokenizer names another */
    if (!seen(ctx, "tokenizer") && nb_hf_tokenizer_present(o->init_from)) snprintf(o->tokenizer, sizeof o->tokenizer, "%s", o->init_source);
}

static void tf_after_flags(nb_train_opts *o, int (*seen)(const void *, const char *), const void *ctx, int how) {
    int resuming = how == NB_FLAGS_RESUME;
    /* a resume has its shape and weights in the checkpoint (a rerun of the first command
     * resumes the run it started) */
    if (o->init_from[0] && resuming && seen(ctx, "init-from") && o->lora_r > 0)
        nb_log(1, "note: resuming a LoRA checkpoint: its base is read again from %s (the folder it started from)\n",
               o->init_source[0] ? o->init_source : o->init_from);
    else if (o->init_from[0] && resuming && seen(ctx, "init-from"))
        nb_log(1, "note: resuming the checkpoint: --init-from %s is not read again\n", o->init_from);
    else if (o->init_from[0])
        import_shape(o, seen, ctx);
    if (seen(ctx, "tokenizer")) {
        NB_CHECK(nb_hf_tokenizer_present(o->tokenizer), "pass a folder with tokenizer.json (and tokenizer_config.json)",
                 "--tokenizer %s holds no tokenizer.json", o->tokenizer);
        absolute_dir(o->tokenizer, o->tokenizer, sizeof o->tokenizer, "--tokenizer");
    }
    /* GPT-2 layouts have as many kv heads as heads: follow --heads unless told otherwise */
    if (o->model.arch == NB_ARCH_GPT2 && !seen(ctx, "kv-heads")) o->model.kv_heads = o->model.heads;
    nb_tf_config_finalize(&o->model);
    o->seq = o->model.seq;
    if (!strcmp(o->val_data, "none")) o->val_data[0] = 0;
    static const char *fetch_hint = "run 'bash scripts/fetch_data.sh' for the default corpus, set NB_DATA_DIR to a data folder, "
                                    "or pass --data SHARD (a glob in quotes, or a comma-separated list)";
    char why[2048];
    if (how == NB_FLAGS_PLAN) return; /* a plan reads no tokens */
    /* a file missing on one rank is the same clear error on every rank */
    nb_comm_check_all(nb_shardset_check(o->data, why, sizeof why), fetch_hint, "training data: %s", why);
    if (o->val_data[0] && !seen(ctx, "val-data") && !nb_shardset_check(o->val_data, why, sizeof why)) {
        fprintf(stderr, "note: no validation shard (%s); training without validation\n", why);
        o->val_data[0] = 0;
    }
    NB_CHECK(!o->val_data[0] || nb_shardset_check(o->val_data, why, sizeof why),
             "pass an existing --val-data SHARD (a glob in quotes, or a comma-separated list), or --val-data none",
             "validation data: %s", why);
}

static void tf_eval_line(const nb_run *r, const nb_eval *ev, const char *data, const char *ckpt, double secs, FILE *f) {
    (void)r;
    (void)data;
    fprintf(f, "loss %.4f nats/token (perplexity %.2f) on %s, checkpoint %s, %.1f s\n", ev->loss, exp(ev->loss), ev->covers,
            ckpt, secs);
}

static void tf_print_model(const nb_train_opts *o, FILE *f) {
    nb_tf_config_print(&o->model, f);
    fprintf(f, "            %d x %d = %lld tokens/step\n", o->batch, o->seq, (long long)o->batch * o->seq);
}

const nb_family_i nb_family_transformer = {
    .name = "transformer",
    .unit = "tokens",
    .loss_unit = "nats",
    .held_out = "validation loss",
    .owns_model = tf_owns_model,
    .model_names = nb_tf_preset_names,
    .model_name = tf_model_name,
    .option_groups = 1u << NB_OPTG_COMMON | 1u << NB_OPTG_RANKS | 1u << NB_OPTG_TF | 1u << NB_OPTG_ERASE | 1u << NB_OPTG_STREAM,
    .option_defaults = tf_defaults,
    .defaults = tf_preset,
    .after_flags = tf_after_flags,
    .print_model = tf_print_model,
    .held_out_option = "val-data",
    .eval_line = tf_eval_line,
    .check = tf_check,
    .init = tf_init,
    .plan = tf_plan,
    .bind = tf_bind,
    .start = tf_start,
    .upload = tf_upload,
    .free = tf_free,
    .per_step = tf_per_step,
    .loss_count = tf_loss_count,
    .begin_step = tf_begin_step,
    .begin_micro = tf_begin_micro,
    .enqueue_results = tf_enqueue_results,
    .end_step = tf_end_step,
    .nonfinite_grad = tf_nonfinite_grad,
    .evaluate = nb_tf_evaluate,
    .metrics = tf_metrics,
    .metrics_losses = tf_metrics_losses,
    .print_eval = tf_print_eval,
    .data_pos = tf_data_pos,
    .sync_to_host = tf_sync_to_host,
    .ckpt_tensors = nb_tf_ckpt_tensors,
    .write_config = nb_tf_write_config,
    .read_config = nb_tf_read_config,
    .summary = tf_summary,
    .graph_key = tf_graph_key,
    .layers = &tf_layers,
};
