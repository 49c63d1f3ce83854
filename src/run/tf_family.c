/* The transformer family in a run: the views it binds, its step as work items, its data (token
 * shards through the prefetching loader), validation loss, checkpoint tensors.
 *
 * Memory: the host keeps the fp32 master weights and AdamW moments for checkpoints; the backend
 * (CPU: the same buffers; CUDA: device memory) holds what the step touches: fp32 master weights,
 * fp32 gradients, fp32 moments, the compute-precision copy of the weights (bf16 on CUDA by
 * default; the master itself in fp32 modes), activations, and the batch's tokens. The stream
 * schedule plans the memory itself (sched/stream_plan.c): the model state then stays on the host. */
#include "run/tf.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "data/shard.h"
#include "host.h"
#include "ops/ops_cuda.h"
#include "sched/sched.h"

nb_tf_train *nb_tf_of(nb_run *r) { return r->fs; }

static nb_tf_train *trainer_of(void *arg) { return ((nb_work *)arg)->tr; }
size_t nb_tf_es(const nb_tf_train *tr) { return nb_dtype_size(tr->be->act_dtype); }
static size_t es_of(const nb_tf_train *tr) { return nb_tf_es(tr); }
static int lowp_weights(const nb_tf_train *tr) { return tr->be->act_dtype != NB_F32; }
int nb_tf_on_device(const nb_tf_train *tr) { return tr->be->device != NB_DEV_CPU; }
static void *wptr(nb_tf_train *tr, int which) {
    if (tr->stream) return nb_stream_global_w(tr, which);
    return nb_tf_global_ptr(&tr->model, which, tr->d_weights, es_of(tr));
}
static void *gptr(nb_tf_train *tr, int which) {
    if (tr->stream) return nb_stream_global_g(tr, which);
    return nb_tf_global_ptr(&tr->model, which, tr->g_cur, sizeof(float));
}
static int head_index(const nb_tf_train *tr) { return tr->model.cfg.tied ? NB_TF_WTE : NB_TF_LM_HEAD; }

/* ---------------------------------------------------------------- work items */

/* Host side, before a step is enqueued: the batch is ready and, for a device backend, its tokens
 * sit in the pinned staging buffer (a captured graph copies from there on every replay). */
static void stage_batch(nb_tf_train *tr, nb_loader_slot *slot) {
    tr->batch = slot;
    tr->stage_n = (size_t)slot->owner->B * tr->o.seq;
    if (slot->owner->lane) nb_mark_wait_host(slot->filled);
    if (!tr->h_tokens) return;
    memcpy(tr->h_tokens, slot->inputs, tr->stage_n * sizeof(int32_t));
    memcpy(tr->h_tokens + tr->stage_n, slot->targets, tr->stage_n * sizeof(int32_t));
}

/* The current micro-batch's tokens where the backend reads them: copied in on the lane for a
 * device backend. */
static void batch_tokens(nb_tf_train *tr, nb_ctx ctx, const int32_t **in, const int32_t **tg) {
    size_t n = (size_t)tr->o.batch * tr->o.seq, at = (size_t)tr->micro * n;
    if (!tr->d_tokens) {
        *in = tr->batch->inputs + at;
        *tg = tr->batch->targets + at;
        return;
    }
    tr->be->to_backend(ctx, tr->d_tokens, tr->h_tokens + at, n * sizeof(int32_t));
    tr->be->to_backend(ctx, tr->d_tokens + n, tr->h_tokens + tr->stage_n + at, n * sizeof(int32_t));
    *in = tr->d_tokens;
    *tg = tr->d_tokens + n;
}

void nb_work_embed_fwd(void *arg, const nb_task_ctx *ctx) {
    nb_tf_train *tr = trainer_of(arg);
    /* gradients accumulate within a step: they start from zero here, before anything adds */
    if (tr->stream)
        nb_stream_zero_global_grads(tr, ctx); /* layer gradients: zeroed in their slot */
    else
        tr->be->zero(ctx, tr->g_cur, tr->model.total * sizeof(float));
    if (tr->nseg > 1)
        tr->be->zero(ctx, tr->d_head_part, (size_t)(tr->nseg - 1) * tr->head_part_stride * sizeof(float));
    batch_tokens(tr, ctx, &tr->tok_in, &tr->tok_tg);
    nb_tf_embed_forward(&tr->model, tr->be, ctx, wptr(tr, NB_TF_WTE), wptr(tr, NB_TF_WPE), tr->tok_in, &tr->acts);
}

static void layer_views(nb_tf_train *tr, int l, nb_tf_layer_view *w, nb_tf_layer_view *dw) {
    const nb_tf_model *m = &tr->model;
    size_t g0 = m->group_offset[1 + l];
    nb_tf_bind_layer(m, l, (char *)tr->d_weights + g0 * es_of(tr), es_of(tr), w);
    if (dw) nb_tf_bind_layer(m, l, (char *)tr->g_cur + g0 * sizeof(float), sizeof(float), dw);
}

static void work_layer_fwd(void *arg, const nb_task_ctx *ctx) {
    nb_work *wk = arg;
    nb_tf_layer_view w;
    layer_views(wk->tr, wk->layer, &w, NULL);
    nb_tf_layer_forward(&wk->tr->model, wk->tr->be, ctx, &w, wk->layer, &wk->tr->acts);
}

/* The loss is the mean over the step's tokens on every rank: each token's gradient is 1 / that
 * count, whichever micro-batch and rank it is in, so the summed gradients are the mean's. */
void nb_work_head(void *arg, const nb_task_ctx *ctx) {
    nb_tf_train *tr = trainer_of(arg);
    size_t N = (size_t)tr->acts.B * tr->acts.T;
    nb_tf_head(&tr->model, tr->be, ctx, wptr(tr, NB_TF_LNF_W), wptr(tr, NB_TF_LNF_B), wptr(tr, head_index(tr)),
               tr->model.cfg.layers, tr->tok_tg, 1, tr->inv_tokens, gptr(tr, NB_TF_LNF_W), gptr(tr, NB_TF_LNF_B),
               gptr(tr, head_index(tr)), &tr->acts);
    tr->be->sum_f64(ctx, &tr->d_step->loss_sum, tr->acts.losses, N);
}

static void work_layer_bwd(void *arg, const nb_task_ctx *ctx) {
    nb_work *wk = arg;
    nb_tf_train *tr = wk->tr;
    nb_tf_layer_view w, dw;
    layer_views(tr, wk->layer, &w, &dw);
    nb_tf_layer_backward(&tr->model, tr->be, ctx, &w, &dw, wk->layer, &tr->seg_acts[tr->layer_seg[wk->layer]]);
}

/* where segment s's partial head gradients start, and each tensor's place in them */
static float *head_part(nb_tf_train *tr, int s, int which) {
    const nb_tf_model *m = &tr->model;
    float *p = tr->d_head_part + (size_t)s * tr->head_part_stride;
    int order[3] = {NB_TF_LNF_W, NB_TF_LNF_B, head_index(tr)};
    for (int k = 0; k < 3; k++) {
        if (m->global_idx[order[k]] < 0) continue;
        if (order[k] == which) return p;
        p += nb_align_up(m->params[m->global_idx[order[k]]].numel, 64);
    }
    return NULL; /* the model has no such tensor (RMSNorm: no bias) */
}

/* ERASE: segment s's local head (final norm + unembedding + loss and their backward), into its
 * own partial gradients */
static void work_seg_head(void *arg, const nb_task_ctx *ctx) {
    nb_work *wk = arg;
    nb_tf_train *tr = wk->tr;
    int s = wk->layer;
    nb_tf_head(&tr->model, tr->be, ctx, wptr(tr, NB_TF_LNF_W), wptr(tr, NB_TF_LNF_B), wptr(tr, head_index(tr)),
               tr->seg_first[s + 1], tr->tok_tg, 1, tr->o.aux_weight * tr->inv_tokens, head_part(tr, s, NB_TF_LNF_W),
               head_part(tr, s, NB_TF_LNF_B), head_part(tr, s, head_index(tr)), &tr->seg_acts[s]);
}

/* the local heads' partials added to the gradients in segment order, after every backward */
static void work_join(void *arg, const nb_task_ctx *ctx) {
    nb_tf_train *tr = trainer_of(arg);
    const nb_tf_model *m = &tr->model;
    int which[3] = {NB_TF_LNF_W, NB_TF_LNF_B, head_index(tr)};
    for (int s = 0; s + 1 < tr->nseg; s++)
        for (int k = 0; k < 3; k++)
            if (m->global_idx[which[k]] >= 0)
                tr->be->add_f32(ctx, gptr(tr, which[k]), head_part(tr, s, which[k]),
                                m->params[m->global_idx[which[k]]].numel);
}

void nb_work_embed_bwd(void *arg, const nb_task_ctx *ctx) {
    nb_tf_train *tr = trainer_of(arg);
    /* the embeddings' gradient is segment 0's input gradient */
    nb_tf_embed_backward(&tr->model, tr->be, ctx, gptr(tr, NB_TF_WTE), gptr(tr, NB_TF_WPE), tr->tok_in, &tr->seg_acts[0]);
}

static void work_optim(void *arg, const nb_task_ctx *ctx) {
    nb_tf_train *tr = trainer_of(arg);
    const nb_backend_i *be = tr->be;
    const nb_tf_model *m = &tr->model;
    nb_step_scalars *d = tr->d_step;
    /* alignment padding between tensors holds zeros, so the whole slab gives the global norm;
     * the clip factor is formed from it inside the AdamW pass: nothing here waits for the device */
    be->sumsq_f64(ctx, &d->sumsq, tr->d_gsum, m->total);
    be->to_backend(ctx, d->k, tr->h_step->k, sizeof d->k);
    /* every tensor in one pass (one launch on CUDA, instead of one per tensor) */
    be->adamw_spans(ctx, tr->d_params, tr->d_gsum, tr->d_m, tr->d_v, lowp_weights(tr) ? tr->d_weights : NULL, tr->spans,
                    m->nparams, d->k, &d->sumsq, tr->o.grad_clip);
}

/* Reads the step's loss sum and gradient norm, in order on the lane. */
static void work_read_loss(void *arg, const nb_task_ctx *ctx) {
    nb_tf_train *tr = trainer_of(arg);
    double two[2];
    tr->be->to_host(ctx, two, tr->d_step, sizeof two);
    tr->loss_sum = two[0];
    /* the micro-batches' sums in their order: the rank-order sum's bits when they are ranks */
    tr->loss_acc = tr->micro ? tr->loss_acc + two[0] : two[0];
    /* stream: the host summed the norm (the step's end waited for it) */
    tr->grad_norm = (float)sqrt(tr->stream ? nb_stream_sumsq(tr) : two[1]);
}

/* Host master state -> backend (start, resume), backend -> host (checkpoints). */
static void work_upload_state(void *arg, const nb_task_ctx *ctx) {
    nb_tf_train *tr = trainer_of(arg);
    const nb_backend_i *be = tr->be;
    if (tr->stream) {
        nb_stream_upload_globals(tr, ctx);
        return;
    }
    size_t bytes = tr->model.total * sizeof(float);
    be->to_backend(ctx, tr->d_params, tr->params, bytes);
    be->to_backend(ctx, tr->d_m, tr->m, bytes);
    be->to_backend(ctx, tr->d_v, tr->v, bytes);
    if (lowp_weights(tr)) be->cast_params(ctx, tr->d_weights, tr->d_params, tr->model.total);
}

static void work_download_state(void *arg, const nb_task_ctx *ctx) {
    nb_tf_train *tr = trainer_of(arg);
    size_t bytes = tr->model.total * sizeof(float);
    tr->be->to_host(ctx, tr->params, tr->d_params, bytes);
    tr->be->to_host(ctx, tr->m, tr->d_m, bytes);
    tr->be->to_host(ctx, tr->v, tr->d_v, bytes);
}

/* ---------------------------------------------------------------- the step as items */

static void build_items(nb_run *r, nb_tf_train *tr) {
    nb_step_items *it = &r->items;
    int last = tr->nseg - 1;
    char name[40];
    it->nseg = tr->nseg;
    nb_items_add(&it->input, "embed fwd", NB_SPAN_FWD, nb_work_embed_fwd, &tr->whole);
    for (int s = 0; s <= last; s++) {
        for (int l = tr->seg_first[s]; l < tr->seg_first[s + 1]; l++) {
            snprintf(name, sizeof name, "fwd S%d L%d", s, l);
            nb_items_add(&it->fwd[s], name, NB_SPAN_FWD, work_layer_fwd, &tr->work[l]);
        }
        if (s < last) {
            snprintf(name, sizeof name, "head S%d", s);
            nb_items_add(&it->bwd[s], name, NB_SPAN_LOSS, work_seg_head, &tr->seg_work[s]);
        } else {
            nb_items_add(&it->bwd[s], "head + loss", NB_SPAN_LOSS, nb_work_head, &tr->whole);
        }
        for (int l = tr->seg_first[s + 1] - 1; l >= tr->seg_first[s]; l--) {
            snprintf(name, sizeof name, "bwd S%d L%d", s, l);
            nb_items_add_bucket(&it->bwd[s], name, NB_SPAN_BWD, work_layer_bwd, &tr->work[l], 1 + l);
        }
    }
    if (tr->nseg > 1) nb_items_add(&it->tail, "join", NB_SPAN_BWD, work_join, &tr->whole);
    /* the embeddings' and the final group's gradients are complete after the embedding backward
     * (a tied head adds to the embeddings; the join to the final norm and head) */
    nb_items_add_bucket(&it->tail, "embed bwd", NB_SPAN_BWD, nb_work_embed_bwd, &tr->whole, 0);
    nb_items_add(&it->opt, "adamw", NB_SPAN_OPTIM, work_optim, &tr->whole);
}

/* One bucket per layer group, one for the embeddings and the final group together. */
static void set_buckets(nb_run *r, nb_tf_train *tr) {
    const nb_tf_model *m = &tr->model;
    int L = m->cfg.layers;
    tr->buckets = nb_calloc((size_t)L + 1, sizeof(nb_bucket), "gradient buckets");
    tr->buckets[0] = (nb_bucket){{m->group_offset[0], m->group_offset[L + 1]}, {m->group_numel[0], m->group_numel[L + 1]}, 2};
    for (int l = 0; l < L; l++) tr->buckets[1 + l] = (nb_bucket){{m->group_offset[1 + l], 0}, {m->group_numel[1 + l], 0}, 1};
    nb_run_set_buckets(r, tr->buckets, L + 1);
    r->grad_sum = tr->d_gsum;
    r->grad_micro = tr->d_grads;
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
    int which[3] = {NB_TF_LNF_W, NB_TF_LNF_B, m->cfg.tied ? NB_TF_WTE : NB_TF_LM_HEAD};
    tr->head_part_stride = 0;
    for (int k = 0; k < 3; k++)
        if (m->global_idx[which[k]] >= 0) tr->head_part_stride += nb_align_up(m->params[m->global_idx[which[k]]].numel, 64);
    for (int s = 0; s < tr->nseg; s++) tr->seg_work[s] = (nb_work){tr, s};
}

size_t nb_tf_acts_plan_bytes(const nb_tf_train *tr, int keep) {
    const nb_train_opts *o = &tr->o;
    return o->ckpt_interval > 0 ? nb_tf_acts_bytes_ckpt(&tr->model, o->batch, o->seq, es_of(tr), o->ckpt_interval, keep)
                                : nb_tf_acts_bytes(&tr->model, o->batch, o->seq, es_of(tr));
}

size_t nb_tf_seg_bytes(const nb_tf_train *tr) {
    return (size_t)(tr->nseg - 1) * (nb_tf_seg_scratch_bytes(&tr->model, tr->o.batch, tr->o.seq, es_of(tr)) +
                                     tr->head_part_stride * sizeof(float));
}

/* The whole model state resident where the step runs (plain, erase): on the CPU everything in
 * host memory; on a GPU the host keeps the master weights and moments for checkpoints. */
static void plan_resident(nb_run *r) {
    nb_tf_train *tr = r->fs;
    const nb_tf_model *m = &tr->model;
    size_t slab = m->total * sizeof(float), wl = lowp_weights(tr) ? m->total * es_of(tr) : 0;
    size_t segb = nb_tf_seg_bytes(tr), acts = nb_tf_acts_plan_bytes(tr, 0) + segb;
    size_t toks = 2 * (size_t)tr->o.batch * tr->o.seq * sizeof(int32_t);
    size_t staged = 2 * (size_t)tr->Bl * tr->o.seq * sizeof(int32_t); /* every micro-batch of the step */
    size_t gsum = tr->o.grad_accum > 1 ? slab : 0; /* the step's sum beside a micro-batch's gradient */
    int devb = nb_tf_on_device(tr);
    char b[6][32];
    nb_log(1, "memory      %s: params %s + grads %s + adamw %s%s%s + activations %s (B=%d, T=%d) = %s\n",
           devb ? "device" : "host", nb_fmt_bytes(b[0], 32, (double)slab), nb_fmt_bytes(b[1], 32, (double)slab),
           nb_fmt_bytes(b[2], 32, 2.0 * slab), wl ? " + bf16 weights " : "", wl ? nb_fmt_bytes(b[3], 32, (double)wl) : "",
           nb_fmt_bytes(b[4], 32, (double)acts), tr->o.batch, tr->o.seq, nb_fmt_bytes(b[5], 32, 4.0 * slab + wl + acts + toks));
    nb_arena *host = &r->host, *dev = &r->dev;
    size_t hp = nb_arena_plan_bytes(host, slab), hm = nb_arena_plan_bytes(host, slab), hv = nb_arena_plan_bytes(host, slab);
    size_t hg = devb ? 0 : nb_arena_plan_bytes(host, slab), ha = devb ? 0 : nb_arena_plan_bytes(host, acts);
    size_t hs = !devb && gsum ? nb_arena_plan_bytes(host, gsum) : 0;
    size_t dp = 0, dg = 0, dm = 0, dv = 0, dw = 0, dac = 0, dt = 0, ds = 0, dsum = 0;
    if (devb) {
        dsum = gsum ? nb_arena_plan_bytes(dev, gsum) : 0;
        dp = nb_arena_plan_bytes(dev, slab), dg = nb_arena_plan_bytes(dev, slab), dm = nb_arena_plan_bytes(dev, slab);
        dv = nb_arena_plan_bytes(dev, slab), dw = wl ? nb_arena_plan_bytes(dev, wl) : 0;
        dac = nb_arena_plan_bytes(dev, acts), dt = nb_arena_plan_bytes(dev, toks);
        ds = nb_arena_plan_bytes(dev, sizeof(nb_step_scalars));
    }
    nb_run_alloc_arenas(r, "lower --batch or --seq, or pick a smaller --model");
    tr->params = (float *)(host->base + hp);
    tr->m = (float *)(host->base + hm);
    tr->v = (float *)(host->base + hv);
    if (!devb) {
        tr->d_params = tr->params, tr->d_m = tr->m, tr->d_v = tr->v;
        tr->d_grads = (float *)(host->base + hg);
        tr->d_gsum = gsum ? (float *)(host->base + hs) : tr->d_grads;
        tr->d_weights = tr->params;
        tr->d_acts = host->base + ha;
        tr->d_segs = tr->nseg > 1 ? host->base + ha + (acts - segb) : NULL;
        tr->d_step = tr->h_step = &tr->cpu_step;
        return;
    }
    uint8_t *base = dev->base;
    tr->d_params = (float *)(base + dp), tr->d_grads = (float *)(base + dg);
    tr->d_gsum = gsum ? (float *)(base + dsum) : tr->d_grads;
    tr->d_m = (float *)(base + dm), tr->d_v = (float *)(base + dv);
    tr->d_weights = wl ? (void *)(base + dw) : (void *)tr->d_params;
    tr->d_acts = base + dac;
    tr->d_segs = tr->nseg > 1 ? base + dac + (acts - segb) : NULL;
    tr->d_tokens = (int32_t *)(base + dt);
    tr->d_step = (nb_step_scalars *)(base + ds);
    tr->h_step = tr->be->host_alloc(sizeof(nb_step_scalars), "step scalars");
    tr->h_tokens = tr->be->host_alloc(staged, "token staging");
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

/* ---------------------------------------------------------------- family entries */

static void tf_check(nb_train_opts *o) {
    if (o->seq <= 0) o->seq = o->model.seq;
    int parts = o->world * o->grad_accum;
    NB_CHECK(o->batch % parts == 0, "pass a --batch that the ranks times --grad-accum divide",
             "--batch %d cannot be split into %d rank%s x %d micro-batch%s of equal size", o->batch, o->world,
             o->world == 1 ? "" : "s", o->grad_accum, o->grad_accum == 1 ? "" : "es");
    NB_CHECK(o->seq <= o->model.seq, "lower --seq", "--seq %d exceeds the model's context %d", o->seq, o->model.seq);
    NB_CHECK((double)o->batch * o->seq <= 2147483647.0, "lower --batch or --seq",
             "--batch %d x --seq %d = %.0f tokens per step: more than 2^31", o->batch, o->seq, (double)o->batch * o->seq);
}

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
    tr->dev_free0 = r->dev_free0;
    nb_tf_model_init(&tr->model, &tr->o.model);
    set_segments(tr);
    if (r->sched->plan)
        r->sched->plan(r);
    else
        plan_resident(r);
    const nb_train_opts *o = &tr->o;
    if (o->ckpt_interval > 0)
        nb_tf_acts_bind_ckpt(&tr->model, &tr->acts, tr->d_acts, o->batch, o->seq, es_of(tr), o->ckpt_interval, tr->keep);
    else
        nb_tf_acts_bind(&tr->model, &tr->acts, tr->d_acts, o->batch, o->seq, es_of(tr));
    bind_segments(tr);
    tr->data = nb_lane_create(r->lanes, "data", NB_LANE_HOST);
    tr->work = nb_calloc((size_t)(o->model.layers ? o->model.layers : 1), sizeof(nb_work), "work items");
    for (int l = 0; l < o->model.layers; l++) tr->work[l] = (nb_work){tr, l};
    tr->whole = (nb_work){tr, -1};
    /* AdamW's tensor table, built once (the step reads it; a captured graph keeps a copy) */
    tr->spans = nb_malloc((size_t)tr->model.nparams * sizeof *tr->spans, "AdamW tensor table");
    for (int i = 0; i < tr->model.nparams; i++) {
        const nb_param *p = &tr->model.params[i];
        tr->spans[i] = (nb_adamw_span){p->offset, p->numel, p->decay ? 0 : 1};
    }
    build_items(r, tr);
    tr->g_cur = tr->d_gsum;
    if (!tr->stream) set_buckets(r, tr);
}

static void load_tensors(nb_run *r, const char *dir);

static void tf_start(nb_run *r, const char *resume_dir) {
    nb_tf_train *tr = r->fs;
    const nb_train_opts *o = &tr->o;
    if (resume_dir)
        load_tensors(r, resume_dir);
    else
        nb_tf_init_weights(&tr->model, tr->params, o->seed);
    nb_run_on_compute(r, "upload state", work_upload_state, &tr->whole);
    if (r->eval_only) return;
    if (nb_verbosity > 0) {
        double per_token = nb_tf_flops_per_token(&tr->model, o->seq);
        double rec = nb_tf_recompute_flops_per_token(&tr->model, o->seq, o->ckpt_interval, tr->keep);
        fprintf(stderr, "parameters  %.2f M (%zu tensors), %.1f MFLOP per token\n", tr->model.n_real / 1e6,
                (size_t)tr->model.nparams, per_token / 1e6);
        if (rec > 0)
            fprintf(stderr, "recompute   +%.3f MFLOP per token (layer forwards run twice): hardware %.3f MFLOP per token\n",
                    rec / 1e6, (per_token + rec) / 1e6);
    }
    if (o->data[0]) {
        /* this rank's sequences of every global batch: micro-batch k of rank r is global
         * micro-batch r * K + k, as one rank with --grad-accum (ranks x K) would read it */
        nb_loader_open_slice(&tr->train, o->data, o->model.vocab, tr->Bl, o->seq, tr->Bg, (size_t)r->rank * tr->Bl,
                             r->data_pos0, 2, tr->data);
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

static void tf_free(nb_run *r) {
    nb_tf_train *tr = r->fs;
    if (!tr) return;
    if (tr->has_train) nb_loader_close(&tr->train);
    if (tr->h_tokens) tr->be->host_free(tr->h_tokens);
    if (tr->h_step && tr->h_step != &tr->cpu_step) tr->be->host_free(tr->h_step);
    nb_tf_acts_unbind(&tr->acts);
    nb_tf_model_free(&tr->model);
    if (tr->d_logits) tr->be->free(tr->d_logits);
    free(tr->work), free(tr->layer_seg), free(tr->seg_acts), free(tr->spans), free(tr->buckets);
    free(tr);
    r->fs = NULL;
}

static double tf_per_step(const nb_run *r) { return (double)r->o.batch * r->o.seq; }

/* the AdamW scalars of this step (the learning rate from the schedule) */
static void tf_begin_step(nb_run *r, int step) {
    nb_tf_train *tr = r->fs;
    stage_batch(tr, nb_loader_take(&tr->train));
    const nb_train_opts *o = &tr->o;
    float lr = nb_lr_cosine(step, nb_train_warmup_steps(o), o->steps, o->lr, o->lr * o->min_lr_frac);
    nb_adamw_cfg decay = {lr, o->beta1, o->beta2, o->eps, o->weight_decay}, none = decay;
    none.weight_decay = 0.0f;
    tr->h_step->k[0] = nb_adamw_prepare(decay, step + 1);
    tr->h_step->k[1] = nb_adamw_prepare(none, step + 1);
    r->lr = lr;
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
    r->loss = tr->loss_acc / tf_per_step(r);
    r->grad_norm = tr->grad_norm;
    tr->micro = 0;
    tr->g_cur = tr->d_gsum;
}

/* The first gradient tensor with a non-finite element (after a step whose norm was not finite). */
static const char *tf_nonfinite_grad(nb_run *r) {
    static char what[128];
    nb_tf_train *tr = r->fs;
    if (tr->stream) return NULL; /* the host's gradient slab is reused as layers land */
    const nb_tf_model *m = &tr->model;
    for (int i = 0; i < m->nparams; i++) {
        const nb_param *p = &m->params[i];
        if (nb_run_nonfinite(r, tr->d_gsum + p->offset, p->numel)) {
            snprintf(what, sizeof what, "the gradient of %s", p->name);
            return what;
        }
    }
    return NULL;
}

static void tf_evaluate(nb_run *r, nb_eval *ev) {
    nb_tf_train *tr = r->fs;
    memset(ev, 0, sizeof *ev);
    if (!tr->has_val) return;
    ev->loss = nb_tf_eval_shard(r, tr->o.val_data, tr->o.eval_batches);
    ev->done = 1;
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
    if (tr->stream) { /* the host holds the master state, once the optimizer is done with it */
        nb_stream_quiesce(tr);
        return;
    }
    if (nb_tf_on_device(tr)) nb_run_on_compute(r, "download state", work_download_state, &tr->whole);
}

static void add_slab(nb_ckpt_list *l, const nb_tf_model *m, float *slab, const char *suffix) {
    for (int i = 0; i < m->nparams; i++) {
        const nb_param *p = &m->params[i];
        char name[96];
        snprintf(name, sizeof name, "%s%s", p->name, suffix);
        nb_ckpt_list_add(l, name, p->ndim, p->shape, slab + p->offset);
    }
}

static void tf_ckpt_tensors(nb_run *r, nb_ckpt_list *model, nb_ckpt_list *optim) {
    nb_tf_train *tr = r->fs;
    add_slab(model, &tr->model, tr->params, "");
    if (optim) {
        add_slab(optim, &tr->model, tr->m, ".exp_avg");
        add_slab(optim, &tr->model, tr->v, ".exp_avg_sq");
    }
}

void nb_ckpt_load_lists(const char *dir, nb_ckpt_list *model, nb_ckpt_list *optim);

static void load_tensors(nb_run *r, const char *dir) {
    nb_ckpt_list model = {0}, optim = {0};
    tf_ckpt_tensors(r, &model, r->eval_only ? NULL : &optim);
    nb_ckpt_load_lists(dir, &model, r->eval_only ? NULL : &optim);
    nb_ckpt_list_free(&model), nb_ckpt_list_free(&optim);
}

static void tf_write_config(const nb_train_opts *o, nb_json_writer *w) {
    const nb_tf_config *c = &o->model;
    nb_json_key(w, "model");
    nb_json_begin_obj(w);
    nb_json_kstr(w, "preset", c->preset);
    nb_json_kstr(w, "arch", c->arch == NB_ARCH_GPT2 ? "gpt2" : "llama");
    nb_json_kint(w, "layers", c->layers);
    nb_json_kint(w, "dim", c->dim);
    nb_json_kint(w, "heads", c->heads);
    nb_json_kint(w, "kv_heads", c->kv_heads);
    nb_json_kint(w, "ffn", c->ffn);
    nb_json_kint(w, "vocab", c->vocab);
    nb_json_kint(w, "seq", c->seq);
    nb_json_knum(w, "norm_eps", c->norm_eps);
    nb_json_knum(w, "rope_theta", c->rope_theta);
    nb_json_kbool(w, "tied", c->tied);
    nb_json_end_obj(w);
}

static void tf_read_config(const nb_json *j, nb_train_opts *o) {
    nb_tf_config *c = &o->model;
    memset(c, 0, sizeof *c);
    snprintf(c->preset, sizeof c->preset, "%s", nb_json_req_str(j, "preset"));
    const char *arch = nb_json_req_str(j, "arch");
    NB_CHECK(!strcmp(arch, "gpt2") || !strcmp(arch, "llama"), "the checkpoint is damaged or from a newer nobubble",
             "unknown model arch '%s' in state.json", arch);
    c->arch = !strcmp(arch, "gpt2") ? NB_ARCH_GPT2 : NB_ARCH_LLAMA;
    c->layers = (int)nb_json_req_int(j, "layers");
    c->dim = (int)nb_json_req_int(j, "dim");
    c->heads = (int)nb_json_req_int(j, "heads");
    c->kv_heads = (int)nb_json_req_int(j, "kv_heads");
    c->ffn = (int)nb_json_req_int(j, "ffn");
    c->vocab = (int)nb_json_req_int(j, "vocab");
    c->seq = (int)nb_json_req_int(j, "seq");
    c->norm_eps = (float)nb_json_req_num(j, "norm_eps");
    c->rope_theta = (float)nb_json_req_num(j, "rope_theta");
    c->tied = nb_json_get_bool(j, "tied", c->arch == NB_ARCH_GPT2);
    NB_CHECK(isfinite(c->norm_eps) && c->norm_eps > 0 && isfinite(c->rope_theta) && c->rope_theta > 0,
             "the checkpoint is damaged: resume from an earlier copy of the run directory",
             "state.json: model norm_eps %g / rope_theta %g must be positive numbers", (double)c->norm_eps,
             (double)c->rope_theta);
    nb_tf_config_finalize(c);
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

const nb_family_i nb_family_transformer = {
    .name = "transformer",
    .unit = "tokens",
    .loss_unit = "nats",
    .held_out = "validation loss",
    .model_name = tf_model_name,
    .check = tf_check,
    .init = tf_init,
    .start = tf_start,
    .free = tf_free,
    .per_step = tf_per_step,
    .begin_step = tf_begin_step,
    .begin_micro = tf_begin_micro,
    .enqueue_results = tf_enqueue_results,
    .end_step = tf_end_step,
    .nonfinite_grad = tf_nonfinite_grad,
    .evaluate = tf_evaluate,
    .metrics = tf_metrics,
    .metrics_losses = tf_metrics_losses,
    .print_eval = tf_print_eval,
    .data_pos = tf_data_pos,
    .sync_to_host = tf_sync_to_host,
    .ckpt_tensors = tf_ckpt_tensors,
    .write_config = tf_write_config,
    .read_config = tf_read_config,
    .summary = tf_summary,
    .graph_key = tf_graph_key,
};

/* ---------------------------------------------------------------- eval, sampling */

static void work_eval_batch(void *arg, const nb_task_ctx *ctx) {
    nb_tf_train *tr = trainer_of(arg);
    const nb_tf_model *m = &tr->model;
    const int32_t *in, *tg;
    batch_tokens(tr, ctx, &in, &tg);
    nb_tf_embed_forward(m, tr->be, ctx, wptr(tr, NB_TF_WTE), wptr(tr, NB_TF_WPE), in, &tr->acts);
    for (int l = 0; l < m->cfg.layers; l++) {
        nb_tf_layer_view w;
        if (tr->stream)
            nb_stream_bind_sync(tr, ctx, l, &w);
        else
            layer_views(tr, l, &w, NULL);
        nb_tf_layer_forward(m, tr->be, ctx, &w, l, &tr->acts);
    }
    nb_tf_head(m, tr->be, ctx, wptr(tr, NB_TF_LNF_W), wptr(tr, NB_TF_LNF_B), wptr(tr, head_index(tr)), m->cfg.layers,
               tg, 0, 1.0f, NULL, NULL, NULL, &tr->acts);
    tr->be->sum_f64(ctx, &tr->d_step->loss_sum, tr->acts.losses, (size_t)tr->acts.B * tr->acts.T);
    tr->be->to_host(ctx, &tr->loss_sum, &tr->d_step->loss_sum, sizeof(double));
}

double nb_tf_eval_shard(nb_run *r, const char *path, int nbatches) {
    nb_tf_train *tr = r->fs;
    nb_loader ld;
    nb_loader_open(&ld, path, tr->model.cfg.vocab, tr->o.batch, tr->o.seq, 0, 1, NULL);
    size_t per_epoch = nb_loader_batches_per_epoch(&ld);
    if (nbatches <= 0 || (size_t)nbatches > per_epoch) nbatches = (int)per_epoch;
    nb_loader_slot *saved = tr->batch;
    double total = 0;
    for (int i = 0; i < nbatches; i++) {
        stage_batch(tr, nb_loader_take(&ld));
        nb_run_on_compute(r, "eval", work_eval_batch, &tr->whole);
        total += tr->loss_sum;
        nb_loader_release(&ld, tr->batch, nb_lane_mark(tr->compute));
    }
    tr->batch = saved;
    nb_loader_close(&ld);
    return total / ((double)nbatches * tr->o.batch * tr->o.seq);
}

typedef struct {
    nb_tf_train *tr;
    const int32_t *tokens;
    int T;
    float *logits;
} logits_job;

static void work_logits(void *arg, const nb_task_ctx *ctx) {
    logits_job *job = arg;
    nb_tf_train *tr = job->tr;
    const nb_tf_model *m = &tr->model;
    int V = m->cfg.vocab;
    const int32_t *tokens = job->tokens;
    if (tr->d_tokens) {
        tr->be->to_backend(ctx, tr->d_tokens, job->tokens, (size_t)job->T * sizeof(int32_t));
        tokens = tr->d_tokens;
    }
    nb_tf_embed_forward(m, tr->be, ctx, wptr(tr, NB_TF_WTE), wptr(tr, NB_TF_WPE), tokens, &tr->acts);
    for (int l = 0; l < m->cfg.layers; l++) {
        nb_tf_layer_view w;
        layer_views(tr, l, &w, NULL);
        nb_tf_layer_forward(m, tr->be, ctx, &w, l, &tr->acts);
    }
    void *out = nb_tf_on_device(tr) ? tr->d_logits : job->logits;
    nb_tf_logits_last(m, tr->be, ctx, wptr(tr, NB_TF_LNF_W), wptr(tr, NB_TF_LNF_B), wptr(tr, head_index(tr)),
                      m->cfg.layers, &tr->acts, out);
    if (out == job->logits) return;
    if (tr->be->act_dtype == NB_F32) {
        tr->be->to_host(ctx, job->logits, out, (size_t)V * sizeof(float));
        return;
    }
    uint16_t *tmp = nb_malloc((size_t)V * sizeof(uint16_t), "logits");
    tr->be->to_host(ctx, tmp, out, (size_t)V * sizeof(uint16_t));
    for (int i = 0; i < V; i++) {
        uint32_t bits = (uint32_t)tmp[i] << 16;
        memcpy(&job->logits[i], &bits, sizeof(float));
    }
    free(tmp);
}

void nb_tf_logits(nb_run *r, const int32_t *tokens, int T, float *logits) {
    nb_tf_train *tr = r->fs;
    NB_ASSERT(tr->o.batch == 1 && T >= 1 && T <= tr->o.seq);
    if (nb_tf_on_device(tr) && !tr->d_logits)
        tr->d_logits = tr->be->alloc((size_t)tr->model.cfg.vocab * es_of(tr), "sampling logits");
    /* the slab was sized for the full context; a shorter prefix fits in the same bytes */
    nb_tf_acts_unbind(&tr->acts);
    nb_tf_acts_bind(&tr->model, &tr->acts, tr->d_acts, 1, T, es_of(tr));
    logits_job job = {tr, tokens, T, logits};
    nb_run_on_compute(r, "sample", work_logits, &job);
}
