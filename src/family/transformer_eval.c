/* The transformer family's forward-only passes (held-out loss, sampling logits), checkpoint
 * tensors and model config (state.json's "model"). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "family/transformer.h"

/* ---------------------------------------------------------------- evaluation, sampling */

static void forward_layers(nb_tf_train *tr, nb_ctx ctx) {
    const nb_tf_model *m = &tr->model;
    for (int l = 0; l < m->cfg.layers; l++) {
        nb_tf_layer_view w;
        nb_tf_forward_weights(tr, ctx, l, &w);
        nb_tf_layer_forward(m, tr->be, ctx, &w, l, &tr->acts);
    }
}

static void work_eval_batch(void *arg, const nb_task_ctx *ctx) {
    nb_tf_train *tr = ((nb_work *)arg)->tr;
    const nb_tf_model *m = &tr->model;
    const int32_t *in, *tg;
    nb_tf_batch_tokens(tr, ctx, &in, &tg);
    nb_tf_embed_forward(m, tr->be, ctx, nb_tf_wptr(tr, NB_TF_WTE), nb_tf_wptr(tr, NB_TF_WPE), in, &tr->acts);
    forward_layers(tr, ctx);
    nb_tf_head(m, tr->be, ctx, nb_tf_wptr(tr, NB_TF_LNF_W), nb_tf_wptr(tr, NB_TF_LNF_B), nb_tf_wptr(tr, nb_tf_head_index(tr)),
               m->cfg.layers, tg, 0, 1.0f, NULL, NULL, NULL, NULL, &tr->acts);
    tr->be->sum_f64(ctx, &tr->d_step->loss_sum, tr->acts.losses, (size_t)tr->acts.B * tr->acts.T);
    tr->be->to_host(ctx, &tr->loss_sum, &tr->d_step->loss_sum, sizeof(double));
}

double nb_tf_eval_shard(nb_run *r, const char *spec, int nbatches, char *covers, size_t cap) {
    nb_tf_train *tr = r->fs;
    nb_loader ld;
    nb_loader_open(&ld, spec, tr->model.cfg.vocab, tr->o.batch, tr->o.seq, 0, 1, NULL);
    size_t per_epoch = nb_loader_batches_per_epoch(&ld);
    if (nbatches <= 0 || (size_t)nbatches > per_epoch) nbatches = (int)per_epoch;
    nb_loader_slot *saved = tr->batch;
    double total = 0;
    size_t counted = 0; /* the targets a loss mask keeps (every one without a mask) */
    for (int i = 0; i < nbatches; i++) {
        nb_tf_stage_batch(tr, nb_loader_take(&ld));
        nb_run_on_compute(r, "eval", work_eval_batch, &tr->whole);
        total += tr->loss_sum;
        counted += tr->batch->counted;
        nb_loader_release(&ld, tr->batch, nb_lane_mark(tr->compute));
    }
    tr->batch = saved;
    if (covers) {
        char what[NB_PATH_MAX], n[32], c[32], kept[96] = "";
        nb_shardset_describe(&ld.shards, what, sizeof what);
        if (ld.masked) snprintf(kept, sizeof kept, " (%s of them targets by the loss mask)", nb_fmt_count(c, sizeof c, counted));
        snprintf(covers, cap, "%d batch%s of %d x %d tokens = %s tokens%s of %s%s", nbatches, nbatches == 1 ? "" : "es",
                 tr->o.batch, tr->o.seq, nb_fmt_count(n, sizeof n, (unsigned long long)nbatches * tr->o.batch * tr->o.seq), kept,
                 (size_t)nbatches == per_epoch ? "all of " : "", what);
    }
    int masked = ld.masked;
    nb_loader_close(&ld);
    /* with a loss mask, the mean over the counted targets (NaN when the batches hold none) */
    if (masked) return counted ? total / (double)counted : NAN;
    return total / ((double)nbatches * tr->o.batch * tr->o.seq);
}

void nb_tf_evaluate(nb_run *r, nb_eval *ev) {
    nb_tf_train *tr = r->fs;
    memset(ev, 0, sizeof *ev);
    if (!tr->has_val) return;
    ev->loss = nb_tf_eval_shard(r, tr->o.val_data, tr->o.eval_batches, ev->covers, sizeof ev->covers);
    ev->done = 1;
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
    nb_tf_embed_forward(m, tr->be, ctx, nb_tf_wptr(tr, NB_TF_WTE), nb_tf_wptr(tr, NB_TF_WPE), tokens, &tr->acts);
    forward_layers(tr, ctx);
    void *out = nb_tf_on_device(tr) ? tr->d_logits : job->logits;
    nb_tf_logits_last(m, tr->be, ctx, nb_tf_wptr(tr, NB_TF_LNF_W), nb_tf_wptr(tr, NB_TF_LNF_B),
                      nb_tf_wptr(tr, nb_tf_head_index(tr)), m->cfg.layers, &tr->acts, out);
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
        tr->d_logits = tr->be->alloc((size_t)tr->model.cfg.vocab * nb_tf_es(tr), "sampling logits");
    /* the slab was sized for the full context; a shorter prefix fits in the same bytes */
    nb_tf_acts_unbind(&tr->acts);
    nb_tf_acts_bind(&tr->model, &tr->acts, tr->d_acts, 1, T, nb_tf_es(tr));
    logits_job job = {tr, tokens, T, logits};
    nb_run_on_compute(r, "sample", work_logits, &job);
}

/* ---------------------------------------------------------------- checkpoints */

static void add_slab(nb_ckpt_list *l, const nb_tf_train *tr, float *slab, const char *suffix) {
    int n;
    const nb_param *tp = nb_tf_trained(tr, &n, NULL);
    for (int i = 0; i < n; i++) {
        const nb_param *p = &tp[i];
        char name[96];
        snprintf(name, sizeof name, "%s%s", p->name, suffix);
        nb_ckpt_list_add(l, name, p->ndim, p->shape, slab + p->offset);
    }
}

/* A moment tensor the schedule keeps off the host slabs: which moment, its slab offset. */
typedef struct {
    const nb_state_map *map;
    int which;
    size_t o;
} state_io;

static void state_fill(void *io, void *dst, size_t offset, size_t bytes) {
    const state_io *s = io;
    s->map->fetch(s->map->self, s->which, s->o + offset / sizeof(float), dst, bytes / sizeof(float));
}

static void state_store(void *io, const void *src, size_t offset, size_t bytes) {
    const state_io *s = io;
    s->map->store(s->map->self, s->which, s->o + offset / sizeof(float), src, bytes / sizeof(float));
}

/* One moment's tensors: in the host slab at the map's place, or (not there) through the map. */
static void add_moment(nb_tf_train *tr, nb_ckpt_list *l, float *slab, int which, const char *suffix) {
    const nb_tf_model *m = &tr->model;
    if (!tr->has_state_map) {
        add_slab(l, tr, slab, suffix);
        return;
    }
    if (!tr->state_io) tr->state_io = nb_calloc(2 * (size_t)m->nparams, sizeof(state_io), "checkpoint handles");
    for (int i = 0; i < m->nparams; i++) {
        const nb_param *p = &m->params[i];
        char name[96];
        snprintf(name, sizeof name, "%s%s", p->name, suffix);
        size_t h = tr->state_map.host_off(tr->state_map.self, p->offset);
        if (h != SIZE_MAX) {
            nb_ckpt_list_add(l, name, p->ndim, p->shape, slab + h);
            continue;
        }
        state_io *io = (state_io *)tr->state_io + (size_t)which * m->nparams + i;
        *io = (state_io){&tr->state_map, which, p->offset};
        nb_ckpt_list_add_io(l, name, p->ndim, p->shape, state_fill, state_store, io);
    }
}

/* With LoRA the adapters and their moments only: the base is state.json's reference to it (the
 * init_source folder, or the seeded init) */
void nb_tf_ckpt_tensors(nb_run *r, nb_ckpt_list *model, nb_ckpt_list *optim) {
    nb_tf_train *tr = r->fs;
    add_slab(model, tr, tr->params, "");
    if (optim) {
        add_moment(tr, optim, tr->m, 0, ".exp_avg");
        add_moment(tr, optim, tr->v, 1, ".exp_avg_sq");
    }
}

void nb_tf_load_tensors(nb_run *r, const char *dir) {
    nb_ckpt_list model = {0}, optim = {0};
    nb_tf_ckpt_tensors(r, &model, r->eval_only ? NULL : &optim);
    nb_ckpt_load_lists(dir, &model, r->eval_only ? NULL : &optim);
    nb_ckpt_list_free(&model), nb_ckpt_list_free(&optim);
}

/* "rope_scaling": {...}, written only for a scaled RoPE: a plain model's state.json stays what
 * it was, and a state.json without it (older runs) reads back as no scaling. */
static void write_rope_scaling(const nb_tf_config *c, nb_json_writer *w) {
    if (c->rope_scaling == NB_ROPE_DEFAULT) return;
    nb_json_key(w, "rope_scaling");
    nb_json_begin_obj(w);
    nb_json_kstr(w, "type", nb_rope_type_name(c->rope_scaling));
    nb_json_knum(w, "factor", c->rope_factor);
    if (c->rope_scaling == NB_ROPE_LLAMA3) {
        nb_json_knum(w, "low_freq_factor", c->rope_low_freq_factor);
        nb_json_knum(w, "high_freq_factor", c->rope_high_freq_factor);
        nb_json_kint(w, "original_max_position_embeddings", c->rope_original_ctx);
    }
    nb_json_end_obj(w);
}

static void read_rope_scaling(const nb_json *j, nb_tf_config *c) {
    const nb_json *s = nb_json_get(j, "rope_scaling");
    if (!s) return;
    const char *hint = "the checkpoint is damaged or from a newer nobubble";
    NB_CHECK(s->type == NB_JSON_OBJ, hint, "state.json: model.rope_scaling must be an object");
    const char *type = nb_json_req_str(s, "type");
    if (!strcmp(type, "linear"))
        c->rope_scaling = NB_ROPE_LINEAR;
    else if (!strcmp(type, "llama3"))
        c->rope_scaling = NB_ROPE_LLAMA3;
    else
        nb_fail(hint, "state.json: unknown model.rope_scaling.type '%s'", type);
    c->rope_factor = (float)nb_json_req_num(s, "factor");
    if (c->rope_scaling != NB_ROPE_LLAMA3) return;
    c->rope_low_freq_factor = (float)nb_json_req_num(s, "low_freq_factor");
    c->rope_high_freq_factor = (float)nb_json_req_num(s, "high_freq_factor");
    int64_t ctx = nb_json_req_int(s, "original_max_position_embeddings");
    NB_CHECK(ctx >= 1 && ctx <= INT32_MAX, hint, "state.json: model.rope_scaling.original_max_position_embeddings %lld",
             (long long)ctx);
    c->rope_original_ctx = (int)ctx;
}

void nb_tf_write_config(const nb_train_opts *o, nb_json_writer *w) {
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
    write_rope_scaling(c, w);
    nb_json_kbool(w, "tied", c->tied);
    nb_json_kint(w, "head_dim", c->head_dim);
    nb_json_kbool(w, "qkv_bias", c->qkv_bias);
    nb_json_kbool(w, "qk_norm", c->qk_norm);
    nb_hf_origin_write(w, &o->hf);
    nb_json_end_obj(w);
}

void nb_tf_read_config(const nb_json *j, nb_train_opts *o) {
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
    /* the Qwen variants; older checkpoints have none of them */
    c->head_dim = (int)nb_json_get_int(j, "head_dim", 0);
    c->qkv_bias = nb_json_get_bool(j, "qkv_bias", 0);
    c->qk_norm = nb_json_get_bool(j, "qk_norm", 0);
    nb_hf_origin_read(j, &o->hf);
    read_rope_scaling(j, c);
    NB_CHECK(isfinite(c->norm_eps) && c->norm_eps > 0 && isfinite(c->rope_theta) && c->rope_theta > 0,
             "the checkpoint is damaged: resume from an earlier copy of the run directory",
             "state.json: model norm_eps %g / rope_theta %g must be positive numbers", (double)c->norm_eps,
             (double)c->rope_theta);
    nb_tf_config_finalize(c);
    /* a transformer trains on sequences of its context length: train.seq (read before the model)
     * is redundant with the model's, and a different value is a damaged file, not something to
     * ignore */
    NB_CHECK(o->seq == c->seq, "the checkpoint is damaged: resume from an earlier copy of the run directory",
             "state.json: train.seq %d differs from the model's context %d", o->seq, c->seq);
}
