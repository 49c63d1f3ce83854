/* The transformer family's LoRA (--lora): where the frozen base lives, how it is loaded and
 * uploaded, and the adapters' start. Everything the optimizer touches (the master, moments,
 * gradients, AdamW spans, buckets, checkpoints) is the adapters' slab (nb_tf_trained); the base
 * has no gradient and no optimizer state: fp32 on the host (the import or the seeded init fills
 * it) and, on a device, one copy in compute precision (bf16: 2 bytes per parameter). Under
 * stream the family holds no base at all: it reads it one group at a time and hands each to the
 * schedule (bind_base), which keeps it in compute precision where it streams it from. */
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "family/transformer.h"
#include "host.h"
#include "io/crc32c.h"
#include "model/transformer_hf.h"

void nb_tf_lora_plan(nb_run *r) {
    nb_tf_train *tr = r->fs;
    const nb_tf_lora *lo = tr->model.lora;
    if (!lo) return;
    size_t n = tr->model.total;
    tr->plan.hb = nb_arena_plan_bytes(&r->host, n * sizeof(float));
    if (nb_tf_on_device(tr)) tr->plan.db = nb_arena_plan_bytes(&r->dev, n * nb_tf_es(tr));
    r->mem.host.weights += n * sizeof(float); /* the plan's terms: the base beside the adapters */
    if (nb_tf_on_device(tr)) r->mem.dev.weights += n * nb_tf_es(tr);
    r->mem.params = n;
    nb_tf_lora_log(tr);
}

void nb_tf_lora_log(const nb_tf_train *tr) {
    const nb_tf_lora *lo = tr->model.lora;
    int streamed = tr->base_sink != NULL || !strcmp(tr->o.schedule, "stream");
    char t[96], a[32], b[32];
    nb_tf_lora_targets_str(lo->sites, tr->model.cfg.arch, t, sizeof t);
    nb_log(1, "lora        rank %d, alpha %g (scale %g), targets %s: %s adapter parameters train, %s frozen (%s per parameter%s)\n",
           lo->r, (double)lo->alpha, (double)lo->scale, t, nb_fmt_count(a, sizeof a, lo->n_real),
           nb_fmt_count(b, sizeof b, tr->model.n_real), nb_tf_on_device(tr) && nb_tf_es(tr) == 2 ? "2 bytes" : "4 bytes",
           streamed ? " where the stream schedule keeps it" : nb_tf_on_device(tr) ? " on the device, an fp32 copy on the host" : "");
}

/* The base into its compute-precision copy: fp32 straight in; bf16 through the activation slab
 * (free before the first step) in chunks, each cast on the device, all in order on ctx. */
void nb_tf_upload_base(nb_tf_train *tr, nb_ctx ctx) {
    const nb_backend_i *be = tr->be;
    size_t n = tr->model.total, es = nb_tf_es(tr);
    if (!nb_tf_on_device(tr) || !tr->base) return; /* d_base is base; stream: the schedule holds the base */
    if (es == sizeof(float)) {
        be->to_backend(ctx, tr->d_base, tr->base, n * sizeof(float));
        return;
    }
    size_t chunk = tr->acts.bytes / sizeof(float) / 4096 * 4096;
    NB_CHECK(chunk > 0, "raise --batch or --seq", "the activation slab (%zu bytes) is too small to stage the base weights",
             tr->acts.bytes);
    for (size_t off = 0; off < n; off += chunk) {
        size_t k = n - off < chunk ? n - off : chunk;
        be->to_backend(ctx, tr->d_acts, tr->base + off, k * sizeof(float));
        be->cast_params(ctx, (char *)tr->d_base + off * es, tr->d_acts, k);
    }
}

/* The base from its reference (the --init-from folder, or the run's seeded init), then the
 * adapters: the checkpoint's, or PEFT's init (the moments start at zero: the arenas are zeroed). */
void nb_tf_lora_start(nb_run *r, const char *resume_dir) {
    nb_tf_train *tr = r->fs;
    const nb_train_opts *o = &tr->o;
    uint64_t crc;
    if (tr->base_sink) { /* stream: the base never sits whole in fp32; the schedule keeps each group */
        crc = nb_tf_base_by_groups(&tr->model, o->init_source, o->seed, nb_tf_filler_of(r, &(nb_tf_filler){0}),
                                   tr->base_sink, tr->base_sink_self);
    } else {
        if (o->init_source[0])
            nb_hf_import(o->init_source, &tr->model, tr->base);
        else
            nb_tf_init_weights(&tr->model, tr->base, o->seed, nb_tf_filler_of(r, &(nb_tf_filler){0}));
        crc = 1 + (uint64_t)nb_crc32c_par(NULL, tr->base, tr->model.total * sizeof(float));
    }
    NB_CHECK(!resume_dir || !o->lora_base_crc || o->lora_base_crc == crc,
             "put back the base the run started from, or start over with --fresh",
             "the LoRA run's base (%s) is not the one it was trained on: its weights changed since",
             o->init_source[0] ? o->init_source : "nobubble's seeded init");
    r->o.lora_base_crc = tr->o.lora_base_crc = crc;
    if (resume_dir)
        nb_tf_load_tensors(r, resume_dir);
    else
        nb_tf_lora_init_weights(&tr->lora, tr->params, o->seed);
}

void nb_tf_lora_check(const nb_train_opts *o) {
    if (o->lora_r <= 0) return;
    NB_CHECK(!strcmp(o->schedule, "plain") || !strcmp(o->schedule, "erase") || !strcmp(o->schedule, "stream"),
             "use --schedule plain, erase or stream with --lora", "--lora with --schedule %s", o->schedule);
    NB_CHECK(o->lora_dropout == 0.0f, "pass --lora-dropout 0: LoRA's dropout is not built yet", "--lora-dropout %g",
             (double)o->lora_dropout);
    (void)nb_tf_lora_parse_targets(o->lora_targets, o->model.arch);
}
