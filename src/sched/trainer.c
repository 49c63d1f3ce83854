#include "sched/trainer.h"
#include "sched/step_stats.h"
#include "sched/timeline.h"

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
#include "sched/trainer.h"
#include "host.h"

void nb_train_opts_defaults(nb_train_opts *o) {
    memset(o, 0, sizeof *o);
    nb_tf_preset("gpt2-mini", &o->model);
    snprintf(o->data, sizeof o->data, "data/sotu/train.bin");
    snprintf(o->val_data, sizeof o->val_data, "data/sotu/val.bin");
    snprintf(o->device, sizeof o->device, "cpu");
    snprintf(o->schedule, sizeof o->schedule, "plain");
    snprintf(o->erase_dispatch, sizeof o->erase_dispatch, "blocking");
    o->aux_weight = 1.0f;
    o->side_lanes = 2;
    o->stream_slots = 2;
    o->pinned_slabs = 2;
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
    fprintf(f, "run         device %s%s%s, schedule %s, batch %d x seq %d = %d tokens/step, steps %d, seed %llu, threads %d\n",
            o->device, o->precision[0] ? " " : "", o->precision, o->schedule, o->batch, o->seq, o->batch * o->seq, o->steps, (unsigned long long)o->seed,
            o->threads);
    fprintf(f, "optimizer   adamw lr %g (warmup %d, cosine to %g), betas (%g, %g), eps %g, weight decay %g, clip %g\n",
            o->lr, warmup_steps(o), o->lr * o->min_lr_frac, o->beta1, o->beta2, o->eps, o->weight_decay, o->grad_clip);
    fprintf(f, "output      %s%s%s\n", o->out[0] ? o->out : "(none: --out DIR keeps metrics and checkpoints)",
            o->resume[0] ? ", resuming from " : "", o->resume);
}

/* ---------------------------------------------------------------- work items */

/* Memory: the host keeps the fp32 master weights and AdamW moments for checkpoints; the backend
 * (CPU: the same buffers; CUDA: device memory) holds what the step touches: fp32 master weights,
 * fp32 gradients, fp32 moments, the compute-precision copy of the weights (bf16 on CUDA by
 * default; the master itself in fp32 modes), activations, and the batch's tokens. */

static nb_trainer *trainer_of(void *arg) { return ((nb_work *)arg)->tr; }
static size_t es_of(const nb_trainer *tr) { return nb_dtype_size(tr->be->act_dtype); }
static int lowp_weights(const nb_trainer *tr) { return tr->be->act_dtype != NB_F32; }
static void *wptr(nb_trainer *tr, int which) {
    if (tr->stream) return nb_stream_global_w(tr, which);
    return nb_tf_global_ptr(&tr->model, which, tr->d_weights, es_of(tr));
}
static void *gptr(nb_trainer *tr, int which) {
    if (tr->stream) return nb_stream_global_g(tr, which);
    return nb_tf_global_ptr(&tr->model, which, tr->d_grads, sizeof(float));
}

/* Host side, before a step is enqueued: the batch is ready and, for a device backend, its tokens
 * sit in the pinned staging buffer (a captured graph copies from there on every replay). */
static void stage_batch(nb_trainer *tr, nb_loader_slot *slot) {
    tr->batch = slot;
    if (slot->owner->lane) nb_mark_wait_host(slot->filled);
    if (!tr->h_tokens) return;
    size_t n = (size_t)tr->o.batch * tr->o.seq;
    memcpy(tr->h_tokens, slot->inputs, n * sizeof(int32_t));
    memcpy(tr->h_tokens + n, slot->targets, n * sizeof(int32_t));
}

/* The batch's tokens where the backend reads them: copied in on the lane for a device backend. */
static void batch_tokens(nb_trainer *tr, nb_ctx ctx, const int32_t **in, const int32_t **tg) {
    if (!tr->d_tokens) {
        *in = tr->batch->inputs;
        *tg = tr->batch->targets;
        return;
    }
    size_t n = (size_t)tr->o.batch * tr->o.seq;
    tr->be->to_backend(ctx, tr->d_tokens, tr->h_tokens, 2 * n * sizeof(int32_t));
    *in = tr->d_tokens;
    *tg = tr->d_tokens + n;
}

void nb_work_embed_fwd(void *arg, const nb_task_ctx *ctx) {
    nb_trainer *tr = trainer_of(arg);
    /* gradients accumulate within a step: they start from zero here, before anything adds */
    if (tr->stream)
        nb_stream_zero_global_grads(tr, ctx); /* layer gradients: zeroed in their slot */
    else
        tr->be->zero(ctx, tr->d_grads, tr->model.total * sizeof(float));
    if (tr->nseg > 1)
        tr->be->zero(ctx, tr->d_head_part, (size_t)(tr->nseg - 1) * tr->head_part_stride * sizeof(float));
    batch_tokens(tr, ctx, &tr->tok_in, &tr->tok_tg);
    nb_tf_embed_forward(&tr->model, tr->be, ctx, wptr(tr, NB_TF_WTE), wptr(tr, NB_TF_WPE), tr->tok_in, &tr->acts);
}

static void layer_views(nb_trainer *tr, int l, nb_tf_layer_view *w, nb_tf_layer_view *dw) {
    const nb_tf_model *m = &tr->model;
    size_t g0 = m->group_offset[1 + l];
    nb_tf_bind_layer(m, l, (char *)tr->d_weights + g0 * es_of(tr), es_of(tr), w);
    if (dw) nb_tf_bind_layer(m, l, (char *)tr->d_grads + g0 * sizeof(float), sizeof(float), dw);
}

void nb_work_layer_fwd(void *arg, const nb_task_ctx *ctx) {
    nb_work *wk = arg;
    nb_tf_layer_view w;
    layer_views(wk->tr, wk->layer, &w, NULL);
    nb_tf_layer_forward(&wk->tr->model, wk->tr->be, ctx, &w, wk->layer, &wk->tr->acts);
}

static int head_index(const nb_trainer *tr) { return tr->model.cfg.tied ? NB_TF_WTE : NB_TF_LM_HEAD; }

void nb_work_head(void *arg, const nb_task_ctx *ctx) {
    nb_trainer *tr = trainer_of(arg);
    size_t N = (size_t)tr->acts.B * tr->acts.T;
    nb_tf_head(&tr->model, tr->be, ctx, wptr(tr, NB_TF_LNF_W), wptr(tr, NB_TF_LNF_B), wptr(tr, head_index(tr)),
               tr->model.cfg.layers, tr->tok_tg, 1, 1.0f / (float)N, gptr(tr, NB_TF_LNF_W), gptr(tr, NB_TF_LNF_B),
               gptr(tr, head_index(tr)), &tr->acts);
    tr->be->sum_f64(ctx, &tr->d_step->loss_sum, tr->acts.losses, N);
}

void nb_work_layer_bwd(void *arg, const nb_task_ctx *ctx) {
    nb_work *wk = arg;
    nb_trainer *tr = wk->tr;
    nb_tf_layer_view w, dw;
    layer_views(tr, wk->layer, &w, &dw);
    nb_tf_layer_backward(&tr->model, tr->be, ctx, &w, &dw, wk->layer, &tr->seg_acts[tr->layer_seg[wk->layer]]);
}

/* where segment s's partial head gradients start, and each tensor's place in them */
static float *head_part(nb_trainer *tr, int s, int which) {
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

void nb_work_seg_head(void *arg, const nb_task_ctx *ctx) {
    nb_work *wk = arg;
    nb_trainer *tr = wk->tr;
    int s = wk->layer;
    size_t N = (size_t)tr->acts.B * tr->acts.T;
    nb_tf_head(&tr->model, tr->be, ctx, wptr(tr, NB_TF_LNF_W), wptr(tr, NB_TF_LNF_B), wptr(tr, head_index(tr)),
               tr->seg_first[s + 1], tr->tok_tg, 1, tr->o.aux_weight / (float)N, head_part(tr, s, NB_TF_LNF_W),
               head_part(tr, s, NB_TF_LNF_B), head_part(tr, s, head_index(tr)), &tr->seg_acts[s]);
}

void nb_work_join(void *arg, const nb_task_ctx *ctx) {
    nb_trainer *tr = trainer_of(arg);
    const nb_tf_model *m = &tr->model;
    int which[3] = {NB_TF_LNF_W, NB_TF_LNF_B, head_index(tr)};
    for (int s = 0; s + 1 < tr->nseg; s++)
        for (int k = 0; k < 3; k++)
            if (m->global_idx[which[k]] >= 0)
                tr->be->add_f32(ctx, gptr(tr, which[k]), head_part(tr, s, which[k]),
                                m->params[m->global_idx[which[k]]].numel);
}

void nb_work_embed_bwd(void *arg, const nb_task_ctx *ctx) {
    nb_trainer *tr = trainer_of(arg);
    /* the embeddings' gradient is segment 0's input gradient */
    nb_tf_embed_backward(&tr->model, tr->be, ctx, gptr(tr, NB_TF_WTE), gptr(tr, NB_TF_WPE), tr->tok_in, &tr->seg_acts[0]);
}

void nb_work_optim(void *arg, const nb_task_ctx *ctx) {
    nb_trainer *tr = trainer_of(arg);
    const nb_backend_i *be = tr->be;
    const nb_tf_model *m = &tr->model;
    nb_step_scalars *d = tr->d_step;
    /* alignment padding between tensors holds zeros, so the whole slab gives the global norm;
     * the clip factor is formed from it inside the AdamW pass: nothing here waits for the device */
    be->sumsq_f64(ctx, &d->sumsq, tr->d_grads, m->total);
    be->to_backend(ctx, d->k, tr->h_step->k, sizeof d->k);
    /* every tensor in one pass (one launch on CUDA, instead of one per tensor) */
    be->adamw_spans(ctx, tr->d_params, tr->d_grads, tr->d_m, tr->d_v, lowp_weights(tr) ? tr->d_weights : NULL, tr->spans,
                    m->nparams, d->k, &d->sumsq, tr->o.grad_clip);
}

/* Host side, before the step: the AdamW scalars of step tr->step. */
static void prepare_optim(nb_trainer *tr) {
    const nb_train_opts *o = &tr->o;
    float lr = nb_lr_cosine(tr->step, warmup_steps(o), o->steps, o->lr, o->lr * o->min_lr_frac);
    nb_adamw_cfg decay = {lr, o->beta1, o->beta2, o->eps, o->weight_decay}, none = decay;
    none.weight_decay = 0.0f;
    tr->h_step->k[0] = nb_adamw_prepare(decay, tr->step + 1);
    tr->h_step->k[1] = nb_adamw_prepare(none, tr->step + 1);
    tr->lr = lr;
}

/* Reads the step's loss sum and gradient norm, in order on the lane. */
static void work_read_loss(void *arg, const nb_task_ctx *ctx) {
    nb_trainer *tr = trainer_of(arg);
    double two[2];
    tr->be->to_host(ctx, two, tr->d_step, sizeof two);
    tr->loss_sum = two[0];
    /* stream: the host summed the norm (the step's end waited for it) */
    tr->grad_norm = (float)sqrt(tr->stream ? nb_stream_sumsq(tr) : two[1]);
}

/* Host master state -> backend (start, resume), backend -> host (checkpoints). */
static void work_upload_state(void *arg, const nb_task_ctx *ctx) {
    nb_trainer *tr = trainer_of(arg);
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
    nb_trainer *tr = trainer_of(arg);
    size_t bytes = tr->model.total * sizeof(float);
    tr->be->to_host(ctx, tr->params, tr->d_params, bytes);
    tr->be->to_host(ctx, tr->m, tr->d_m, bytes);
    tr->be->to_host(ctx, tr->v, tr->d_v, bytes);
}

static void run_on_compute(nb_trainer *tr, const char *name, nb_task_fn fn, void *arg) {
    nb_lane_run(tr->compute, name, NB_SPAN_OTHER, -1, fn, arg);
    nb_mark_wait_host(nb_lane_mark(tr->compute));
}

/* OpenMP's thread count belongs to the calling thread: --threads must be set on the thread that
 * runs the compute lane's ops (the lane's worker on the CPU backend), not only on main. */
static void work_set_threads(void *arg, const nb_task_ctx *ctx) {
    nb_host_set_threads(trainer_of(arg)->o.threads);
}

/* ---------------------------------------------------------------- setup */

static int is_device_backend(const nb_trainer *tr) { return tr->be->device != NB_DEV_CPU; }

/* --detach "2,4": cut points 1 .. layers-1, increasing; segments between them. */
static void set_segments(nb_trainer *tr) {
    const nb_train_opts *o = &tr->o;
    int L = tr->model.cfg.layers;
    static const char *hint = "pass --detach as increasing layer counts between 1 and layers-1, like 2,4";
    tr->nseg = 1;
    tr->seg_first[0] = 0;
    for (const char *p = o->detach; *p;) {
        char *end;
        long cut = strtol(p, &end, 10);
        NB_CHECK(end != p && (*end == ',' || !*end), hint, "--detach '%s' is not a list of numbers", o->detach);
        NB_CHECK(cut >= 1 && cut < L, hint, "--detach cut %ld is outside 1..%d", cut, L - 1);
        NB_CHECK(cut > tr->seg_first[tr->nseg - 1], hint, "--detach '%s' is not increasing", o->detach);
        NB_CHECK(tr->nseg < NB_MAX_SEGMENTS, hint, "at most %d segments", NB_MAX_SEGMENTS);
        tr->seg_first[tr->nseg++] = (int)cut;
        p = *end ? end + 1 : end;
    }
    tr->seg_first[tr->nseg] = L;
    NB_CHECK(tr->nseg == 1 || o->aux_weight > 0, "pass --aux-weight > 0 with --detach",
             "detached segments learn from their local heads only: --aux-weight is %g", (double)o->aux_weight);
    tr->layer_seg = nb_malloc((size_t)L * sizeof(int), "segments");
    for (int s = 0; s < tr->nseg; s++)
        for (int l = tr->seg_first[s]; l < tr->seg_first[s + 1]; l++) tr->layer_seg[l] = s;
    const nb_tf_model *m = &tr->model;
    int which[3] = {NB_TF_LNF_W, NB_TF_LNF_B, m->cfg.tied ? NB_TF_WTE : NB_TF_LM_HEAD};
    tr->head_part_stride = 0;
    for (int k = 0; k < 3; k++)
        if (m->global_idx[which[k]] >= 0) tr->head_part_stride += nb_align_up(m->params[m->global_idx[which[k]]].numel, 64);
    for (int s = 0; s < tr->nseg; s++) tr->seg_work[s] = (nb_work){tr, s};
}

/* Segment views over the scratch planned after the activations: [scratch 0 .. scratch S-2 |
 * partial gradients]; the last segment uses the activations' own buffers. */
static void bind_segments(nb_trainer *tr) {
    tr->seg_acts = nb_calloc((size_t)tr->nseg, sizeof(nb_tf_acts), "segments");
    size_t sb = nb_tf_seg_scratch_bytes(&tr->model, tr->o.batch, tr->o.seq, es_of(tr));
    for (int s = 0; s + 1 < tr->nseg; s++)
        nb_tf_seg_view(&tr->model, &tr->acts, &tr->seg_acts[s], (char *)tr->d_segs + (size_t)s * sb, es_of(tr));
    tr->seg_acts[tr->nseg - 1] = tr->acts;
    tr->d_head_part = tr->nseg > 1 ? (float *)((char *)tr->d_segs + (size_t)(tr->nseg - 1) * sb) : NULL;
}

static void create_side_lanes(nb_trainer *tr) {
    tr->nside = tr->o.side_lanes;
    NB_CHECK(tr->nside >= 1 && tr->nside <= NB_MAX_SEGMENTS, "pass --side-lanes between 1 and 64",
             "--side-lanes %d", tr->nside);
    for (int j = 0; j < tr->nside; j++) {
        char name[32];
        snprintf(name, sizeof name, "side %d", j);
        tr->side[j] = nb_lane_create(tr->lanes, name, NB_LANE_DEVICE);
        nb_lane_run(tr->side[j], "set threads", NB_SPAN_OTHER, -1, work_set_threads, &tr->whole);
        if (!strcmp(tr->o.erase_dispatch, "async")) {
            snprintf(name, sizeof name, "dispatch %d", j);
            tr->dispatch[j] = nb_lane_create(tr->lanes, name, NB_LANE_HOST);
        }
    }
    nb_lanes_sync(tr->lanes);
}

/* The stream's device budget for the "-1: as many as fit" options: the GPU's free memory (or
 * --gpu-mem-limit) less a margin for the libraries' workspaces. */
static size_t stream_budget(const nb_trainer *tr) {
    size_t budget = tr->o.gpu_mem_limit ? (size_t)tr->o.gpu_mem_limit : tr->be->mem_available();
    size_t margin = budget / 32 > ((size_t)2 << 30) ? budget / 32 : (size_t)2 << 30;
    return budget > margin ? budget - margin : 0;
}

/* Device bytes of the stream's fixed part (resident part, wslots weight slots, glayers layers on
 * the device, the tokens). */
static size_t stream_fixed(const nb_trainer *tr, int wslots, int glayers) {
    return nb_stream_device_need(&tr->model, wslots, glayers, es_of(tr)) +
           2 * (size_t)tr->o.batch * tr->o.seq * sizeof(int32_t);
}

/* Activation bytes with `keep` layers kept whole (recompute) or all of them (no recompute). */
static size_t acts_bytes(const nb_trainer *tr, int keep) {
    const nb_train_opts *o = &tr->o;
    return o->ckpt_interval > 0 ? nb_tf_acts_bytes_ckpt(&tr->model, o->batch, o->seq, es_of(tr), o->ckpt_interval, keep)
                                : nb_tf_acts_bytes(&tr->model, o->batch, o->seq, es_of(tr));
}

/* Device bytes the stream's budget has left (negative: over) with wslots weight slots, glayers
 * device layers and keep layers' activations kept whole. */
static long long stream_room(const nb_trainer *tr, int wslots, int glayers, int keep) {
    return (long long)stream_budget(tr) - (long long)(stream_fixed(tr, wslots, glayers) + acts_bytes(tr, keep));
}

/* --keep-layers: how many of the last layers keep every activation through the step instead of
 * being recomputed. -1 takes the most that fit beside the rest of the stream's device plan (with
 * two weight slots and no device layers where those are -1: activations come first, they save
 * compute). */
static int resolve_keep(const nb_trainer *tr) {
    const nb_train_opts *o = &tr->o;
    int L = tr->model.cfg.layers, K = o->ckpt_interval;
    if (K <= 0 || strcmp(o->schedule, "stream")) return 0;
    if (o->keep_layers >= 0) return o->keep_layers < L ? o->keep_layers : L;
    if (!is_device_backend(tr)) return L;
    int wslots = o->stream_slots > 0 ? o->stream_slots : 2, glayers = o->gpu_layers > 0 ? o->gpu_layers : 0;
    for (int keep = L; keep > 0; keep--)
        if (stream_room(tr, wslots, glayers, keep) >= 0) return keep;
    return 0;
}

/* Weight slots that fit beside the rest with glayers device layers: the asked number, or with -1
 * two plus one for each further layer whose weights fit (the last layers of the forward then stay
 * on the GPU for their backward instead of crossing PCIe again); at most one per streamed layer. */
static int fit_wslots(const nb_trainer *tr, int glayers) {
    int host_layers = tr->model.cfg.layers - glayers, most = host_layers > 1 ? host_layers : 1;
    if (tr->o.stream_slots > 0) return tr->o.stream_slots < most ? tr->o.stream_slots : most;
    if (!is_device_backend(tr) || most <= 2) return most;
    long long room = stream_room(tr, 2, glayers, tr->keep);
    size_t extra = room > 0 ? (size_t)room / nb_stream_wslot_bytes(&tr->model, es_of(tr)) : 0;
    return extra >= (size_t)(most - 2) ? most : 2 + (int)extra;
}

/* --gpu-layers: N layers (spread over the model, stream.c) keep their fp32 weights, AdamW moments
 * and gradients on the GPU and update there (the host's bandwidth paces the streamed layers'
 * update; the GPU's is ~30x larger). -1 takes the most that fit beside the activations, leaving
 * room for a weight slot per streamed layer when --stream-slots is -1 too. The CPU backend has no
 * device memory to spare: -1 means none there. */
static int resolve_glayers(const nb_trainer *tr) {
    const nb_train_opts *o = &tr->o;
    int L = tr->model.cfg.layers;
    if (strcmp(o->schedule, "stream")) return 0;
    if (o->gpu_layers >= 0) return o->gpu_layers < L ? o->gpu_layers : L;
    if (!is_device_backend(tr)) return 0;
    for (int r = L; r > 0; r--) {
        int streamed = L - r > 1 ? L - r : 1;
        int slots = o->stream_slots > 0 && o->stream_slots < streamed ? o->stream_slots : streamed;
        if (stream_room(tr, slots, r, tr->keep) >= 0) return r;
    }
    return 0;
}

static void plan_memory(nb_trainer *tr, nb_arena *host, nb_arena *dev) {
    const nb_tf_model *m = &tr->model;
    const nb_backend_i *be = tr->be;
    size_t slab = m->total * sizeof(float), wl = lowp_weights(tr) ? m->total * es_of(tr) : 0;
    int K = tr->o.ckpt_interval;
    size_t acts = acts_bytes(tr, tr->keep);
    size_t toks = 2 * (size_t)tr->o.batch * tr->o.seq * sizeof(int32_t);
    size_t segb = (size_t)(tr->nseg - 1) * (nb_tf_seg_scratch_bytes(m, tr->o.batch, tr->o.seq, es_of(tr)) +
                                            tr->head_part_stride * sizeof(float));
    acts += segb; /* printed and planned with the activations */
    char b[6][32];
    int devb = is_device_backend(tr), streaming = !strcmp(tr->o.schedule, "stream");
    if (streaming) {
        char kept[128];
        if (K > 0 && tr->keep >= m->cfg.layers)
            snprintf(kept, sizeof kept, "all kept (--keep-layers %d)", tr->keep);
        else if (K > 0 && tr->keep > 0)
            snprintf(kept, sizeof kept, "%s%d layer%s kept whole, below them inputs kept every %d layer%s, the rest recomputed",
                     tr->o.keep_layers < 0 ? "as many as fit: " : "", tr->keep, tr->keep == 1 ? "" : "s", K, K == 1 ? "" : "s");
        else if (K > 0)
            snprintf(kept, sizeof kept, "layer inputs kept every %d layer%s, the rest recomputed", K, K == 1 ? "" : "s");
        else
            snprintf(kept, sizeof kept, "all kept");
        nb_log(1, "memory      host: params %s + adamw %s + grads %s; %s: activations %s (B=%d, T=%d), %s\n",
               nb_fmt_bytes(b[0], 32, (double)slab), nb_fmt_bytes(b[1], 32, 2.0 * slab), nb_fmt_bytes(b[2], 32, (double)slab),
               devb ? "device" : "host", nb_fmt_bytes(b[3], 32, (double)acts), tr->o.batch, tr->o.seq, kept);
        if (4.0 * slab > 16e9)
            nb_log(1, "setup       allocating %s of host state and initializing the weights (seconds to minutes)\n",
                   nb_fmt_bytes(b[4], 32, 4.0 * slab));
        NB_CHECK(!tr->o.host_mem_limit || 4.0 * slab <= (double)tr->o.host_mem_limit, "pick a smaller --model, or raise --host-mem-limit",
                 "the host state needs %s but --host-mem-limit is %s", nb_fmt_bytes(b[4], 32, 4.0 * slab),
                 nb_fmt_bytes(b[5], 32, (double)tr->o.host_mem_limit));
    } else {
        nb_log(1, "memory      %s: params %s + grads %s + adamw %s%s%s + activations %s (B=%d, T=%d) = %s\n",
               devb ? "device" : "host", nb_fmt_bytes(b[0], 32, (double)slab), nb_fmt_bytes(b[1], 32, (double)slab),
               nb_fmt_bytes(b[2], 32, 2.0 * slab), wl ? " + bf16 weights " : "", wl ? nb_fmt_bytes(b[3], 32, (double)wl) : "",
               nb_fmt_bytes(b[4], 32, (double)acts), tr->o.batch, tr->o.seq,
               nb_fmt_bytes(b[5], 32, 4.0 * slab + wl + acts + toks));
    }
    static const char *hint = "lower --batch or --seq, or pick a smaller --model";
    /* host: the fp32 master and moments (and, on the CPU, everything else) */
    size_t host_cap = tr->o.host_mem_limit ? (size_t)tr->o.host_mem_limit : nb_host_mem_available();
    nb_arena_init(host, "host", (nb_device){NB_DEV_CPU, 0}, host_cap, nb_host_allocator);
    size_t hp = nb_arena_plan_bytes(host, slab), hm = nb_arena_plan_bytes(host, slab), hv = nb_arena_plan_bytes(host, slab);
    size_t hg = devb && !streaming ? 0 : nb_arena_plan_bytes(host, slab), ha = devb ? 0 : nb_arena_plan_bytes(host, acts);
    nb_arena_alloc(host, streaming ? "pick a smaller --model (the stream schedule keeps 16 bytes per parameter in host memory)" : hint);
    tr->params = (float *)(host->base + hp);
    tr->m = (float *)(host->base + hm);
    tr->v = (float *)(host->base + hv);
    if (streaming) /* the arena starts zeroed, so alignment gaps stay zero: the global norm sums them */
        tr->h_grads = (float *)(host->base + hg);
    if (!devb) {
        tr->d_params = tr->params, tr->d_m = tr->m, tr->d_v = tr->v;
        tr->d_grads = (float *)(host->base + hg);
        tr->d_weights = tr->params;
        tr->d_acts = host->base + ha;
        tr->d_segs = tr->nseg > 1 ? host->base + ha + (acts - segb) : NULL;
        tr->d_step = tr->h_step = &tr->cpu_step;
        return;
    }
    size_t budget = tr->o.gpu_mem_limit ? (size_t)tr->o.gpu_mem_limit : be->mem_available();
    nb_allocator_i da = {NULL, NULL, NULL};
    nb_arena_init(dev, "GPU", (nb_device){NB_DEV_CUDA, 0}, budget, da);
    size_t dslab = streaming ? 0 : slab, dwl = streaming ? 0 : wl; /* stream: the model stays on the host */
    size_t dp = nb_arena_plan_bytes(dev, dslab), dg = nb_arena_plan_bytes(dev, dslab), dm = nb_arena_plan_bytes(dev, dslab);
    size_t dv = nb_arena_plan_bytes(dev, dslab), dw = dwl ? nb_arena_plan_bytes(dev, dwl) : 0;
    size_t dac = nb_arena_plan_bytes(dev, acts), dt = nb_arena_plan_bytes(dev, toks);
    size_t ds = nb_arena_plan_bytes(dev, sizeof(nb_step_scalars));
    /* the check happens here, before any allocation; --gpu-mem-limit emulates a smaller GPU */
    if (dev->budget && dev->planned > dev->budget) {
        char need[32], have[32];
        nb_fail("lower --batch or --seq, pick a smaller --model, or raise --gpu-mem-limit",
                "the plan needs %s of GPU memory but %s is available%s", nb_fmt_bytes(need, 32, (double)dev->planned),
                nb_fmt_bytes(have, 32, (double)dev->budget), tr->o.gpu_mem_limit ? " (--gpu-mem-limit)" : "");
    }
    uint8_t *base = be->alloc(dev->planned, "the training state");
    dev->base = base;
    tr->d_params = (float *)(base + dp), tr->d_grads = (float *)(base + dg);
    tr->d_m = (float *)(base + dm), tr->d_v = (float *)(base + dv);
    tr->d_weights = dwl ? (void *)(base + dw) : (void *)tr->d_params;
    if (streaming) tr->d_params = tr->d_grads = tr->d_m = tr->d_v = NULL, tr->d_weights = NULL;
    tr->d_acts = base + dac;
    tr->d_segs = tr->nseg > 1 ? base + dac + (acts - segb) : NULL;
    tr->d_tokens = (int32_t *)(base + dt);
    tr->d_step = (nb_step_scalars *)(base + ds);
    tr->h_step = be->host_alloc(sizeof(nb_step_scalars), "step scalars");
    tr->h_tokens = be->host_alloc(toks, "token staging");
}


void nb_trainer_init(nb_trainer *tr, const nb_train_opts *opts) {
    double t_setup = nb_now();
    memset(tr, 0, sizeof *tr);
    tr->o = *opts;
    nb_train_opts *o = &tr->o;
    if (o->seq <= 0) o->seq = o->model.seq;
    NB_CHECK(o->seq <= o->model.seq, "lower --seq", "--seq %d exceeds the model's context %d", o->seq, o->model.seq);
    NB_CHECK(!strcmp(o->schedule, "plain") || !strcmp(o->schedule, "erase") || !strcmp(o->schedule, "stream"),
             "use --schedule plain, erase or stream", "unknown schedule '%s'", o->schedule);
    int streaming = !strcmp(o->schedule, "stream");
    NB_CHECK(!streaming || !o->detach[0], "drop --detach with --schedule stream", "stream does not split the model yet");
    NB_CHECK(!streaming || !o->graphs, "drop --graphs with --schedule stream",
             "stream replays are not captured as graphs yet");
    NB_CHECK(o->ckpt_interval == 0 || streaming, "use --ckpt-interval with --schedule stream",
             "--ckpt-interval recomputes activations in the stream schedule only");
    NB_CHECK(o->ckpt_interval >= 0 && o->ckpt_interval <= NB_TF_MAX_CKPT_INTERVAL,
             "pass --ckpt-interval between 0 (keep all) and 64", "--ckpt-interval %d", o->ckpt_interval);
    NB_CHECK(o->keep_layers >= -1, "pass --keep-layers N >= 0, or -1 for as many as fit", "--keep-layers %d", o->keep_layers);
    NB_CHECK(o->keep_layers == 0 || (streaming && o->ckpt_interval > 0), "use --keep-layers with --schedule stream --ckpt-interval K",
             "--keep-layers chooses which layers skip recomputation");
    NB_CHECK(o->stream_slots >= 1 || o->stream_slots == -1, "pass --stream-slots N >= 1, or -1 for as many as fit",
             "--stream-slots %d", o->stream_slots);
    NB_CHECK(o->gpu_layers >= -1, "pass --gpu-layers N >= 0, or -1 for as many as fit", "--gpu-layers %d", o->gpu_layers);
    NB_CHECK(o->gpu_layers == 0 || streaming, "use --gpu-layers with --schedule stream",
             "--gpu-layers chooses which streamed layers stay on the GPU");
    NB_CHECK(o->pinned_slabs >= 1 && o->pinned_slabs <= NB_STREAM_MAX_SLOTS, "pass --pinned-slabs between 1 and 4",
             "--pinned-slabs %d", o->pinned_slabs);
    NB_CHECK(!strcmp(o->erase_dispatch, "blocking") || !strcmp(o->erase_dispatch, "async"),
             "use --erase-dispatch blocking or async", "unknown --erase-dispatch '%s'", o->erase_dispatch);
    tr->be = nb_backend_for(o->device, o->precision);
    tr->dev_free0 = is_device_backend(tr) ? tr->be->mem_available() : 0;
    nb_host_set_threads(o->threads);
    nb_tf_model_init(&tr->model, &o->model);
    set_segments(tr);
    tr->keep = resolve_keep(tr);
    tr->glayers = resolve_glayers(tr);
    tr->wslots = !strcmp(o->schedule, "stream") ? fit_wslots(tr, tr->glayers) : 0;
    plan_memory(tr, &tr->host_arena, &tr->dev_arena);
    if (o->ckpt_interval > 0)
        nb_tf_acts_bind_ckpt(&tr->model, &tr->acts, tr->d_acts, o->batch, o->seq, es_of(tr), o->ckpt_interval, tr->keep);
    else
        nb_tf_acts_bind(&tr->model, &tr->acts, tr->d_acts, o->batch, o->seq, es_of(tr));
    bind_segments(tr);

    tr->lanes = nb_lanes_create(is_device_backend(tr) ? "cuda" : "cpu", o->trace[0] ? 1 << 20 : 1 << 16);
    tr->compute = nb_lane_create(tr->lanes, "compute", NB_LANE_DEVICE);
    tr->data = nb_lane_create(tr->lanes, "data", NB_LANE_HOST);
    tr->work = nb_calloc((size_t)o->model.layers, sizeof(nb_work), "work items");
    for (int l = 0; l < o->model.layers; l++) tr->work[l] = (nb_work){tr, l};
    tr->whole = (nb_work){tr, -1};
    /* AdamW's tensor table, built once (the step reads it; a captured graph keeps a copy) */
    tr->spans = nb_malloc((size_t)tr->model.nparams * sizeof *tr->spans, "AdamW tensor table");
    for (int i = 0; i < tr->model.nparams; i++) {
        const nb_param *p = &tr->model.params[i];
        tr->spans[i] = (nb_adamw_span){p->offset, p->numel, p->decay ? 0 : 1};
    }
    run_on_compute(tr, "set threads", work_set_threads, &tr->whole);
    if (!strcmp(o->schedule, "erase")) create_side_lanes(tr);
    if (streaming) nb_stream_init(tr, tr->dev_arena.planned);

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
    run_on_compute(tr, "upload state", work_upload_state, &tr->whole);
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
    /* large models spend a while here (hundreds of GB touched): say so, not silently */
    double setup_s = nb_now() - t_setup;
    if (setup_s > 2.0) nb_log(1, "setup       %.1f s (state allocated, weights %s, uploaded)\n", setup_s, o->resume[0] ? "loaded" : "initialized");
}

void nb_trainer_free(nb_trainer *tr) {
    if (tr->has_train) nb_loader_close(&tr->train);
    if (tr->graph) nb_graph_destroy(tr->graph);
    if (tr->lanes) nb_lanes_sync(tr->lanes);
    nb_stream_free(tr);
    if (tr->lanes) nb_lanes_destroy(tr->lanes);
    if (tr->h_tokens) tr->be->host_free(tr->h_tokens);
    if (tr->h_step && tr->h_step != &tr->cpu_step) tr->be->host_free(tr->h_step);
    nb_tf_acts_unbind(&tr->acts);
    nb_tf_model_free(&tr->model);
    if (tr->dev_arena.base) tr->be->free(tr->dev_arena.base);
    if (tr->d_logits) tr->be->free(tr->d_logits);
    nb_arena_free(&tr->host_arena);
    free(tr->train_hist.step), free(tr->train_hist.loss), free(tr->val_hist.step), free(tr->val_hist.loss);
    free(tr->work);
    free(tr->layer_seg);
    free(tr->seg_acts);
    free(tr->spans);
    if (tr->metrics) fclose(tr->metrics);
    memset(tr, 0, sizeof *tr);
}

void nb_trainer_sync_to_host(nb_trainer *tr) {
    if (tr->stream) { /* the host holds the master state, once the optimizer is done with it */
        nb_stream_quiesce(tr);
        return;
    }
    if (is_device_backend(tr)) run_on_compute(tr, "download state", work_download_state, &tr->whole);
}

/* ---------------------------------------------------------------- eval */

static void work_eval_batch(void *arg, const nb_task_ctx *ctx) {
    nb_trainer *tr = trainer_of(arg);
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

double nb_trainer_eval_shard(nb_trainer *tr, const char *path, int nbatches) {
    nb_stream_quiesce(tr); /* evaluation reads the host master */
    nb_loader ld;
    nb_loader_open(&ld, path, tr->model.cfg.vocab, tr->o.batch, tr->o.seq, 0, 1, NULL);
    size_t per_epoch = nb_loader_batches_per_epoch(&ld);
    if (nbatches <= 0 || (size_t)nbatches > per_epoch) nbatches = (int)per_epoch;
    nb_loader_slot *saved = tr->batch;
    double total = 0;
    for (int i = 0; i < nbatches; i++) {
        stage_batch(tr, nb_loader_take(&ld));
        run_on_compute(tr, "eval", work_eval_batch, &tr->whole);
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
    int T;
    float *logits;
} logits_job;

static void work_logits(void *arg, const nb_task_ctx *ctx) {
    logits_job *job = arg;
    nb_trainer *tr = job->tr;
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
    void *out = is_device_backend(tr) ? tr->d_logits : job->logits;
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

void nb_trainer_logits(nb_trainer *tr, const int32_t *tokens, int T, float *logits) {
    NB_ASSERT(tr->o.batch == 1 && T >= 1 && T <= tr->o.seq);
    if (is_device_backend(tr) && !tr->d_logits)
        tr->d_logits = tr->be->alloc((size_t)tr->model.cfg.vocab * es_of(tr), "sampling logits");
    /* the slab was sized for the full context; a shorter prefix fits in the same bytes */
    nb_tf_acts_unbind(&tr->acts);
    nb_tf_acts_bind(&tr->model, &tr->acts, tr->d_acts, 1, T, es_of(tr));
    logits_job job = {tr, tokens, T, logits};
    run_on_compute(tr, "sample", work_logits, &job);
}

/* ---------------------------------------------------------------- run */

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


static void draw_loss_svg(const nb_trainer *tr) {
    char path[NB_PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/loss.svg", tr->o.out);
    nb_svg_series s[2] = {
        {"train loss", "#1f77b4", (int)tr->train_hist.n, tr->train_hist.step, tr->train_hist.loss},
        {"validation loss", "#d62728", (int)tr->val_hist.n, tr->val_hist.step, tr->val_hist.loss},
    };
    char title[128];
    snprintf(title, sizeof title, "nobubble: %s", tr->model.cfg.preset);
    nb_svg_line_plot(path, title, "step", "loss (nats)", s, tr->val_hist.n ? 2 : 1);
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
                if (!isnan(loss)) series_push(&tr->train_hist, (double)s, loss);
                if (!isnan(val)) series_push(&tr->val_hist, (double)s, val);
            }
            nb_json_free(j);
        }
        fclose(old);
    }
    nb_write_file_atomic(path, kept.data ? kept.data : "", kept.len);
    nb_sbuf_free(&kept);
    tr->metrics = nb_fopen(path, "a", "choose a writable --out directory");
}

/* One step: eagerly, or (--graphs) as the replay of a step captured once. The first step of a
 * run is eager either way: it makes every lazy allocation (cuBLASLt workspaces, pools) before a
 * capture, where allocations are not allowed. */
static void enqueue_step(nb_trainer *tr, int step) {
    if (tr->stream)
        nb_sched_stream_step(tr, step);
    else if (!strcmp(tr->o.schedule, "erase"))
        nb_sched_erase_step(tr, step);
    else
        nb_sched_plain_step(tr, step);
}

static void run_step(nb_trainer *tr, int step, int first) {
    if (!tr->o.graphs || step == first) {
        enqueue_step(tr, step);
        return;
    }
    if (!tr->graph) {
        nb_lanes_capture_begin(tr->lanes, tr->compute);
        enqueue_step(tr, step);
        tr->graph = nb_lanes_capture_end(tr->lanes);
    }
    nb_graph_launch(tr->graph, tr->compute, step);
}

/* Every allocation is made before the first step (the libraries' workspaces during it), so what
 * the device has lost since the trainer started is the run's peak. */
static void report_device_memory(const nb_trainer *tr) {
    size_t now = tr->be->mem_available(), used = tr->dev_free0 > now ? tr->dev_free0 - now : 0;
    char a[32], b[32];
    fprintf(stderr, "gpu memory  %s used by this run (free before it: %s)\n", nb_fmt_bytes(a, 32, (double)used),
            nb_fmt_bytes(b, 32, (double)tr->dev_free0));
}

/* p90 tokens/s: tokens per step over the 90th-percentile step time, after warm-up (step_stats.h) */
static void print_p90(const double *ms, int n, double tokens) {
    nb_step_times st = nb_step_times_of(ms, n);
    if (!st.n || nb_verbosity == 0) return;
    fprintf(stderr, "throughput  p90 %.0f tokens/s (%.2f ms), median %.0f tokens/s (%.2f ms), over %d steps after %d warm-up\n",
            tokens / (st.p90 / 1e3), st.p90, tokens / (st.median / 1e3), st.median, st.n, st.warmup);
}

/* timeline.svg of one step in the run directory: lanes as rows, spans coloured by segment */
static void write_timeline(nb_trainer *tr, int step) {
    char path[NB_PATH_MAX + 32], title[256];
    nb_lanes_sync(tr->lanes);
    snprintf(path, sizeof path, "%s/timeline.svg", tr->o.out);
    snprintf(title, sizeof title, "%s step %d: --schedule %s%s%s, batch %d x %d, %s", tr->model.cfg.preset, step,
             tr->o.schedule, tr->o.detach[0] ? ", --detach " : "", tr->o.detach, tr->o.batch, tr->o.seq, tr->o.device);
    nb_timeline_write(tr->lanes, step, path, title);
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
    double *step_ms = nb_malloc((size_t)(end > first ? end - first : 1) * sizeof(double), "step times");
    if (tr->step >= end) fprintf(stderr, "nothing to do: the checkpoint is at step %d and --steps is %d\n", tr->step, end);
    for (; tr->step < end; tr->step++) {
        int step = tr->step;
        double t0 = nb_now();
        stage_batch(tr, nb_loader_take(&tr->train));
        prepare_optim(tr);
        run_step(tr, step, first);
        nb_lane_run(tr->compute, "read loss", NB_SPAN_OTHER, step, work_read_loss, &tr->whole);
        nb_mark done = nb_lane_mark(tr->compute);
        nb_mark_wait_host(done);
        double t1 = nb_now();
        nb_loader_release(&tr->train, tr->batch, done);
        nb_step_stats st = nb_lanes_step_stats(tr->lanes, step, nb_lane_index(tr->compute), t0, t1);
        double loss = tr->loss_sum / tokens, ms = 1e3 * (t1 - t0);
        NB_CHECK(isfinite(loss), "lower --lr, or check the data", "the loss became %g at step %d", loss, step);
        series_push(&tr->train_hist, step, loss);

        /* --time-limit: this step ends the run like the last one (evaluation, checkpoint) */
        int out_of_time = o->time_limit > 0 && nb_now() - run_t0 >= o->time_limit;
        int is_last = step + 1 == end || out_of_time;
        double val = NAN;
        if (tr->has_val && o->eval_every > 0 && ((step + 1) % o->eval_every == 0 || is_last)) {
            val = nb_trainer_eval_shard(tr, o->val_data, o->eval_batches);
            series_push(&tr->val_hist, step, val);
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
            nb_json_knum(&w, "overlap_pct", st.overlap_pct);
            nb_json_end_obj(&w);
            fprintf(tr->metrics, "%s\n", nb_json_text(&w));
            NB_CHECK(fflush(tr->metrics) == 0, "check free disk space in --out", "cannot write metrics.jsonl: %s",
                     strerror(errno));
            nb_json_writer_free(&w);
        }
        int save = o->out[0] && !o->no_ckpt && ((o->ckpt_every > 0 && (step + 1) % o->ckpt_every == 0) || is_last);
        if (save) {
            nb_ckpt_state cs = {step + 1, nb_loader_position(&tr->train), o->seed};
            nb_trainer_sync_to_host(tr);
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
        step_ms[step - first] = ms;
        if (is_last && o->out[0]) write_timeline(tr, step);
        if (!o->trace[0]) nb_lanes_trace_clear(tr->lanes); /* keep memory flat on long runs */
        if (out_of_time && step + 1 < end) {
            tr->step++;
            end = tr->step;
            fprintf(stderr, "--time-limit %g s reached after step %d: stopped with a checkpoint (resume with --resume)\n",
                    (double)o->time_limit, end);
            break;
        }
    }
    nb_stream_quiesce(tr);
    double wall = nb_now() - run_t0;
    if (end > first)
        fprintf(stderr, "done: %d steps in %.1f s, %.0f tokens/s%s", end - first, wall,
                tokens * (end - first) / wall, isnan(last_val) ? "\n" : "");
    if (end > first && !isnan(last_val)) fprintf(stderr, ", final validation loss %.4f\n", last_val);
    print_p90(step_ms, end - first, tokens);
    if (tr->stream && end > first && nb_verbosity > 0) nb_stream_report(tr);
    if (tr->dev_free0 && end > first && nb_verbosity > 0) report_device_memory(tr);
    free(step_ms);
    if (o->trace[0]) {
        nb_lanes_sync(tr->lanes);
        nb_lanes_write_chrome_trace(tr->lanes, o->trace);
        fprintf(stderr, "trace written to %s (open in https://ui.perfetto.dev or chrome://tracing)\n", o->trace);
    }
    if (o->out[0] && tr->train_hist.n) {
        draw_loss_svg(tr);
        if (nb_verbosity > 0) fprintf(stderr, "run directory %s: metrics.jsonl, loss.svg, ckpt/\n", o->out);
    }
}
