/* The transformer family's step as work items (transformer.c has the rest of the family): where
 * the step's tensors are, the items of the input stage, the layers, the head and loss, the join of
 * segments, the embedding backward and the optimizer, their list (nb_tf_build_items) and the
 * gradient buckets the data-parallel all-reduce walks (nb_tf_set_buckets). */
#include <stdio.h>
#include <string.h>

#include "core.h"
#include "family/transformer.h"
#include "host.h"

static nb_tf_train *trainer_of(void *arg) { return ((nb_work *)arg)->tr; }
static int lowp_weights(const nb_tf_train *tr) { return tr->be->act_dtype != NB_F32; }

/* ---------------------------------------------------------------- where the step's tensors are */

/* A slab offset of the input stage (group 0) or the output stage (group L+1) in the packed
 * binding: the input stage's elements, then the output stage's. */
static size_t packed_offset(const nb_tf_model *m, size_t slab_offset) {
    int gf = m->cfg.layers + 1;
    if (slab_offset < m->group_offset[0] + m->group_numel[0]) return slab_offset - m->group_offset[0];
    NB_ASSERT(slab_offset >= m->group_offset[gf]);
    return m->group_numel[0] + (slab_offset - m->group_offset[gf]);
}

static void *stage_ptr(const nb_tf_model *m, int which, void *slab, void *packed, size_t elem) {
    int i = m->global_idx[which];
    if (i < 0) return NULL; /* the model has no such tensor (RMSNorm: no bias) */
    if (!packed) return nb_tf_global_ptr(m, which, slab, elem);
    return (char *)packed + packed_offset(m, m->params[i].offset) * elem;
}

/* LoRA: the stages are frozen (no gradient) and read from the base */
void *nb_tf_wptr(nb_tf_train *tr, int which) {
    return stage_ptr(&tr->model, which, nb_tf_lora_on(tr) ? tr->d_base : tr->d_weights, tr->res_w, nb_tf_es(tr));
}
float *nb_tf_gptr(nb_tf_train *tr, int which) {
    return nb_tf_lora_on(tr) ? NULL : stage_ptr(&tr->model, which, tr->g_cur, tr->res_g, sizeof(float));
}

/* The gradients the step accumulates into, zeroed at its start: the whole slab, or (a schedule
 * binds the layers itself and zeroes each layer's gradient where it lives) the packed stages. */
static void zero_grads(nb_tf_train *tr, nb_ctx ctx) {
    const nb_tf_model *m = &tr->model;
    if (tr->res_g)
        tr->be->zero(ctx, tr->res_g, (m->group_numel[0] + m->group_numel[m->cfg.layers + 1]) * sizeof(float));
    else
        tr->be->zero(ctx, tr->g_cur, nb_tf_trained_total(tr) * sizeof(float));
}

static void layer_views(nb_tf_train *tr, int l, nb_tf_layer_view *w, nb_tf_layer_view *dw) {
    const nb_tf_model *m = &tr->model;
    size_t g0 = m->group_offset[1 + l];
    if (m->lora) {
        /* the base's weights and no gradient for them; the adapters and theirs */
        nb_tf_bind_layer(m, l, (char *)tr->d_base + g0 * nb_tf_es(tr), nb_tf_es(tr), w);
        nb_tf_lora_bind(m->lora, l, tr->d_weights, nb_tf_es(tr), w);
        if (!dw) return;
        nb_tf_bind_layer(m, l, NULL, sizeof(float), dw);
        nb_tf_lora_bind(m->lora, l, tr->g_cur, sizeof(float), dw);
        return;
    }
    nb_tf_bind_layer(m, l, (char *)tr->d_weights + g0 * nb_tf_es(tr), nb_tf_es(tr), w);
    if (dw) nb_tf_bind_layer(m, l, (char *)tr->g_cur + g0 * sizeof(float), sizeof(float), dw);
}

void nb_tf_forward_weights(nb_tf_train *tr, nb_ctx ctx, int l, nb_tf_layer_view *w) {
    if (!tr->fetch) {
        layer_views(tr, l, w, NULL);
        return;
    }
    nb_tf_bind_layer(&tr->model, l, (void *)tr->fetch(tr->fetch_self, ctx, l), nb_tf_es(tr), w);
    nb_tf_lora_bind(tr->model.lora, l, tr->d_weights, nb_tf_es(tr), w); /* stream's LoRA: the resident adapters */
}

/* ---------------------------------------------------------------- work items */

/* Host side, before a step is enqueued: the batch is ready and, for a device backend, its tokens
 * sit in the pinned staging buffer (a captured graph copies from there on every replay). */
void nb_tf_stage_batch(nb_tf_train *tr, nb_loader_slot *slot) {
    tr->batch = slot;
    tr->stage_n = (size_t)slot->owner->B * tr->o.seq;
    if (slot->owner->lane) nb_mark_wait_host(slot->filled);
    if (!tr->h_tokens) return;
    memcpy(tr->h_tokens, slot->inputs, tr->stage_n * sizeof(int32_t));
    memcpy(tr->h_tokens + tr->stage_n, slot->targets, tr->stage_n * sizeof(int32_t));
}

/* The current micro-batch's tokens where the backend reads them: copied in on the lane for a
 * device backend. */
void nb_tf_batch_tokens(nb_tf_train *tr, nb_ctx ctx, const int32_t **in, const int32_t **tg) {
    size_t n = (size_t)tr->o.batch * tr->o.seq, at = (size_t)tr->micro * n;
    if (!tr->d_tokens) {
        *in = tr->batch->inputs + at;
        *tg = tr->batch->targets + at;
        return;
    }
    if (tr->stage_n == n) { /* one micro-batch: inputs and targets lie back to back on both sides */
        tr->be->to_backend(ctx, tr->d_tokens, tr->h_tokens, 2 * n * sizeof(int32_t));
    } else {
        tr->be->to_backend(ctx, tr->d_tokens, tr->h_tokens + at, n * sizeof(int32_t));
        tr->be->to_backend(ctx, tr->d_tokens + n, tr->h_tokens + tr->stage_n + at, n * sizeof(int32_t));
    }
    *in = tr->d_tokens;
    *tg = tr->d_tokens + n;
}

static void work_embed_fwd(void *arg, const nb_task_ctx *ctx) {
    nb_tf_train *tr = trainer_of(arg);
    /* gradients accumulate within a step: they start from zero here, before anything adds */
    zero_grads(tr, ctx);
    /* the step's loss scale, in order before its heads read it (the host wrote it in begin_step) */
    if (tr->masked && tr->d_step != tr->h_step)
        tr->be->to_backend(ctx, &tr->d_step->loss_scale, &tr->h_step->loss_scale, sizeof(float));
    if (tr->nseg > 1)
        tr->be->zero(ctx, tr->d_head_part, (size_t)(tr->nseg - 1) * tr->head_part_stride * sizeof(float));
    nb_tf_batch_tokens(tr, ctx, &tr->tok_in, &tr->tok_tg);
    nb_tf_embed_forward(&tr->model, tr->be, ctx, nb_tf_wptr(tr, NB_TF_WTE), nb_tf_wptr(tr, NB_TF_WPE), tr->tok_in, &tr->acts);
}

static void work_layer_fwd(void *arg, const nb_task_ctx *ctx) {
    nb_work *wk = arg;
    nb_tf_layer_view w;
    layer_views(wk->tr, wk->layer, &w, NULL);
    nb_tf_layer_forward(&wk->tr->model, wk->tr->be, ctx, &w, wk->layer, &wk->tr->acts);
}

/* The loss is the mean over the step's tokens on every rank: each token's gradient is 1 / that
 * count, whichever micro-batch and rank it is in, so the summed gradients are the mean's. With a
 * loss mask, the count is of the step's counted targets, read from the step's scalars (it changes
 * every step, and a captured graph must not keep the first step's). */
static float loss_weight(const nb_tf_train *tr, const float **scale_by) {
    *scale_by = tr->masked ? &tr->d_step->loss_scale : NULL;
    return tr->masked ? 1.0f : tr->inv_tokens;
}

static void work_head(void *arg, const nb_task_ctx *ctx) {
    nb_tf_train *tr = trainer_of(arg);
    size_t N = (size_t)tr->acts.B * tr->acts.T;
    int head = nb_tf_head_index(tr);
    const float *scale_by;
    float w = loss_weight(tr, &scale_by);
    nb_tf_head(&tr->model, tr->be, ctx, nb_tf_wptr(tr, NB_TF_LNF_W), nb_tf_wptr(tr, NB_TF_LNF_B), nb_tf_wptr(tr, head),
               tr->model.cfg.layers, tr->tok_tg, 1, w, scale_by, nb_tf_gptr(tr, NB_TF_LNF_W), nb_tf_gptr(tr, NB_TF_LNF_B),
               nb_tf_gptr(tr, head), &tr->acts);
    tr->be->sum_f64(ctx, &tr->d_step->loss_sum, tr->acts.losses, N);
}

static void work_layer_bwd(void *arg, const nb_task_ctx *ctx) {
    nb_work *wk = arg;
    nb_tf_train *tr = wk->tr;
    nb_tf_layer_view w, dw;
    layer_views(tr, wk->layer, &w, &dw);
    nb_tf_layer_backward(&tr->model, tr->be, ctx, &w, &dw, wk->layer, &tr->seg_acts[tr->layer_seg[wk->layer]]);
}

/* where segment s's partial head gradients start, and each tensor's place in them (LoRA: none,
 * the head is frozen) */
static float *head_part(nb_tf_train *tr, int s, int which) {
    const nb_tf_model *m = &tr->model;
    if (m->lora) return NULL;
    float *p = tr->d_head_part + (size_t)s * tr->head_part_stride;
    int order[3] = {NB_TF_LNF_W, NB_TF_LNF_B, nb_tf_head_index(tr)};
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
    int s = wk->layer, head = nb_tf_head_index(tr);
    const float *scale_by;
    float w = loss_weight(tr, &scale_by);
    nb_tf_head(&tr->model, tr->be, ctx, nb_tf_wptr(tr, NB_TF_LNF_W), nb_tf_wptr(tr, NB_TF_LNF_B), nb_tf_wptr(tr, head),
               tr->seg_first[s + 1], tr->tok_tg, 1, tr->o.aux_weight * w, scale_by, head_part(tr, s, NB_TF_LNF_W),
               head_part(tr, s, NB_TF_LNF_B), head_part(tr, s, head), &tr->seg_acts[s]);
}

/* the local heads' partials added to the gradients in segment order, after every backward */
static void work_join(void *arg, const nb_task_ctx *ctx) {
    nb_tf_train *tr = trainer_of(arg);
    const nb_tf_model *m = &tr->model;
    int which[3] = {NB_TF_LNF_W, NB_TF_LNF_B, nb_tf_head_index(tr)};
    if (m->lora) return;
    for (int s = 0; s + 1 < tr->nseg; s++)
        for (int k = 0; k < 3; k++)
            if (m->global_idx[which[k]] >= 0)
                tr->be->add_f32(ctx, nb_tf_gptr(tr, which[k]), head_part(tr, s, which[k]),
                                m->params[m->global_idx[which[k]]].numel);
}

static void work_embed_bwd(void *arg, const nb_task_ctx *ctx) {
    nb_tf_train *tr = trainer_of(arg);
    if (nb_tf_lora_on(tr)) return; /* frozen */
    /* the embeddings' gradient is segment 0's input gradient */
    nb_tf_embed_backward(&tr->model, tr->be, ctx, nb_tf_gptr(tr, NB_TF_WTE), nb_tf_gptr(tr, NB_TF_WPE), tr->tok_in,
                         &tr->seg_acts[0]);
}

static void work_optim(void *arg, const nb_task_ctx *ctx) {
    nb_tf_train *tr = trainer_of(arg);
    const nb_backend_i *be = tr->be;
    nb_step_scalars *d = tr->d_step;
    int n;
    size_t total;
    nb_tf_trained(tr, &n, &total);
    /* alignment padding between tensors holds zeros, so the whole slab gives the global norm;
     * the clip factor is formed from it inside the AdamW pass: nothing here waits for the device */
    be->sumsq_f64(ctx, &d->sumsq, tr->d_gsum, total);
    be->to_backend(ctx, d->k, tr->h_step->k, sizeof d->k);
    /* every tensor in one pass (one launch on CUDA, instead of one per tensor) */
    be->adamw_spans(ctx, tr->d_params, tr->d_gsum, tr->d_m, tr->d_v, lowp_weights(tr) ? tr->d_weights : NULL, tr->spans,
                    n, d->k, &d->sumsq, tr->o.grad_clip);
}

/* ---------------------------------------------------------------- the step as items */

void nb_tf_build_items(nb_run *r, nb_tf_train *tr) {
    nb_step_items *it = &r->items;
    int last = tr->nseg - 1;
    char name[40];
    it->nseg = tr->nseg;
    nb_items_add(&it->input, "embed fwd", NB_SPAN_FWD, work_embed_fwd, &tr->whole);
    for (int s = 0; s <= last; s++) {
        for (int l = tr->seg_first[s]; l < tr->seg_first[s + 1]; l++) {
            snprintf(name, sizeof name, "fwd S%d L%d", s, l);
            nb_items_add(&it->fwd[s], name, NB_SPAN_FWD, work_layer_fwd, &tr->work[l]);
            nb_items_mark_layer(&it->fwd[s], l);
        }
        if (s < last) {
            snprintf(name, sizeof name, "head S%d", s);
            nb_items_add(&it->bwd[s], name, NB_SPAN_LOSS, work_seg_head, &tr->seg_work[s]);
        } else {
            nb_items_add(&it->bwd[s], "head + loss", NB_SPAN_LOSS, work_head, &tr->whole);
        }
        for (int l = tr->seg_first[s + 1] - 1; l >= tr->seg_first[s]; l--) {
            snprintf(name, sizeof name, "bwd S%d L%d", s, l);
            nb_items_add_bucket(&it->bwd[s], name, NB_SPAN_BWD, work_layer_bwd, &tr->work[l], 1 + l);
            nb_items_mark_layer(&it->bwd[s], l);
        }
    }
    if (tr->nseg > 1) nb_items_add(&it->tail, "join", NB_SPAN_BWD, work_join, &tr->whole);
    /* the embeddings' and the final group's gradients are complete after the embedding backward
     * (a tied head adds to the embeddings; the join to the final norm and head) */
    nb_items_add_bucket(&it->tail, "embed bwd", NB_SPAN_BWD, work_embed_bwd, &tr->whole, 0);
    nb_items_add(&it->opt, "adamw", NB_SPAN_OPTIM, work_optim, &tr->whole);
}

/* One bucket per layer group, one for the embeddings and the final group together. */
void nb_tf_set_buckets(nb_run *r, nb_tf_train *tr) {
    const nb_tf_model *m = &tr->model;
    const nb_tf_lora *lo = m->lora;
    int L = m->cfg.layers;
    tr->buckets = nb_calloc((size_t)L + 1, sizeof(nb_bucket), "gradient buckets");
    if (lo) { /* the adapters' layer groups; bucket 0 (the frozen stages) stays empty */
        for (int l = 0; l < L; l++) tr->buckets[1 + l] = (nb_bucket){{lo->group_offset[1 + l], 0}, {lo->group_numel[1 + l], 0}, 1};
    } else {
        tr->buckets[0] = (nb_bucket){{m->group_offset[0], m->group_offset[L + 1]}, {m->group_numel[0], m->group_numel[L + 1]}, 2};
        for (int l = 0; l < L; l++) tr->buckets[1 + l] = (nb_bucket){{m->group_offset[1 + l], 0}, {m->group_numel[1 + l], 0}, 1};
    }
    nb_run_set_buckets(r, tr->buckets, L + 1);
    r->grad_sum = tr->d_gsum;
    r->grad_micro = tr->d_grads;
}
