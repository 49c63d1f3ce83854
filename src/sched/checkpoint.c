#include "sched/checkpoint.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core.h"
#include "io/atomic.h"
#include "io/json.h"
#include "io/safetensors.h"

static int file_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

void nb_ckpt_resolve(const char *dir, char *out, size_t cap) {
    char probe[NB_PATH_MAX + 32];
    snprintf(probe, sizeof probe, "%s/state.json", dir);
    if (file_exists(probe)) {
        snprintf(out, cap, "%s", dir);
        return;
    }
    snprintf(out, cap, "%s/ckpt", dir);
    /* a crash between the renames of a checkpoint swap leaves ckpt.old: bring it back */
    nb_dir_recover(out);
    snprintf(probe, sizeof probe, "%s/state.json", out);
    NB_CHECK(file_exists(probe), "pass a run directory written by 'nobubble train --out DIR' (or its ckpt/ folder)",
             "no checkpoint in '%s' (neither %s/state.json nor %s/ckpt/state.json exists)", dir, dir, dir);
}

/* ---- options <-> JSON: one table, so writing and reading can never disagree ---- */

typedef enum { F_INT, F_FLOAT, F_STR, F_U64 } field_kind;
typedef struct {
    const char *key;
    field_kind kind;
    size_t offset, size;
} field;

#define FI(k, m) {k, F_INT, offsetof(nb_train_opts, m), sizeof(int)}
#define FF(k, m) {k, F_FLOAT, offsetof(nb_train_opts, m), sizeof(float)}
#define FS(k, m) {k, F_STR, offsetof(nb_train_opts, m), sizeof(((nb_train_opts *)0)->m)}
static const field train_fields[] = {
    FS("data", data), FS("val_data", val_data), FS("device", device), FS("schedule", schedule), FS("precision", precision),
    FI("batch", batch), FI("seq", seq), FI("steps", steps), FI("warmup", warmup), FI("eval_every", eval_every),
    FI("eval_batches", eval_batches), FI("ckpt_every", ckpt_every), FI("graphs", graphs), FF("lr", lr), FF("min_lr_frac", min_lr_frac),
    FF("weight_decay", weight_decay), FF("beta1", beta1), FF("beta2", beta2), FF("eps", eps),
    FF("grad_clip", grad_clip), {"seed", F_U64, offsetof(nb_train_opts, seed), sizeof(uint64_t)},
    /* added with ERASE: a checkpoint written before them lacks them (the defaults then apply) */
    FS("detach", detach), FF("aux_weight", aux_weight), FI("side_lanes", side_lanes), FS("erase_dispatch", erase_dispatch),
    FI("ckpt_interval", ckpt_interval), FI("stream_slots", stream_slots), FI("pinned_slabs", pinned_slabs),
    FI("keep_layers", keep_layers), FI("gpu_layers", gpu_layers),
};
#define FIRST_OPTIONAL 21
#define NFIELDS (sizeof train_fields / sizeof train_fields[0])

static void write_model_config(nb_json_writer *w, const nb_tf_config *c) {
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

static void read_model_config(const nb_json *j, nb_tf_config *c) {
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
    nb_tf_config_finalize(c);
}

static void write_train_opts(nb_json_writer *w, const nb_train_opts *o) {
    nb_json_key(w, "train");
    nb_json_begin_obj(w);
    for (size_t i = 0; i < NFIELDS; i++) {
        const field *f = &train_fields[i];
        const char *p = (const char *)o + f->offset;
        switch (f->kind) {
        case F_INT: nb_json_kint(w, f->key, *(const int *)p); break;
        case F_FLOAT: nb_json_knum(w, f->key, *(const float *)p); break;
        case F_STR: nb_json_kstr(w, f->key, p); break;
        case F_U64: nb_json_key(w, f->key); nb_json_uint(w, *(const uint64_t *)p); break;
        }
    }
    nb_json_end_obj(w);
}

static void read_train_opts(const nb_json *j, nb_train_opts *o) {
    for (size_t i = 0; i < NFIELDS; i++) {
        const field *f = &train_fields[i];
        char *p = (char *)o + f->offset;
        if (i >= FIRST_OPTIONAL && !nb_json_get(j, f->key)) continue;
        switch (f->kind) {
        case F_INT: *(int *)p = (int)nb_json_req_int(j, f->key); break;
        case F_FLOAT: *(float *)p = (float)nb_json_req_num(j, f->key); break;
        case F_U64: *(uint64_t *)p = nb_json_req_u64(j, f->key); break;
        case F_STR: {
            const char *s = nb_json_req_str(j, f->key);
            NB_CHECK(strlen(s) < f->size, "the checkpoint is damaged", "state.json field '%s' is too long", f->key);
            memcpy(p, s, strlen(s) + 1);
            break;
        }
        }
    }
}

/* ---- state ---- */

void nb_ckpt_read_state(const char *dir, nb_train_opts *opts, nb_ckpt_state *st) {
    char path[NB_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/state.json", dir);
    nb_json *j = nb_json_load_file(path);
    const char *fmt = nb_json_get_str(j, "format", "");
    NB_CHECK(!strcmp(fmt, NB_CKPT_FORMAT), "pass a checkpoint written by nobubble train",
             "%s is not a nobubble checkpoint (format '%s')", path, fmt);
    int64_t ver = nb_json_req_int(j, "version");
    NB_CHECK(ver == NB_CKPT_VERSION, "use the nobubble version that wrote it", "%s has checkpoint version %lld, this build reads %d",
             path, (long long)ver, NB_CKPT_VERSION);
    st->step = (int)nb_json_req_int(j, "step");
    st->data_pos = (size_t)nb_json_req_int(j, "data_pos");
    st->seed = nb_json_req_u64(j, "seed");
    NB_CHECK(st->step >= 0, "the checkpoint is damaged", "%s: negative step", path);
    if (opts) {
        read_model_config(nb_json_req(j, "model", NB_JSON_OBJ), &opts->model);
        read_train_opts(nb_json_req(j, "train", NB_JSON_OBJ), opts);
    }
    nb_json_free(j);
}

static void load_slab(const char *path, const nb_tf_model *model, float *slab, const char *suffix) {
    nb_st_file *f = nb_st_open(path);
    memset(slab, 0, model->total * sizeof(float));
    for (int i = 0; i < model->nparams; i++) {
        const nb_param *p = &model->params[i];
        char name[96];
        snprintf(name, sizeof name, "%s%s", p->name, suffix);
        NB_CHECK(nb_st_find(f, name), "the checkpoint belongs to another model shape", "%s has no tensor '%s'", path, name);
        nb_st_read_shaped(f, name, NB_F32, p->ndim, p->shape, slab + p->offset);
    }
    nb_st_close(f);
}

void nb_ckpt_load(const char *dir, const nb_tf_model *model, float *params, float *m, float *v, nb_ckpt_state *st) {
    char path[NB_PATH_MAX + 32];
    nb_ckpt_read_state(dir, NULL, st);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    load_slab(path, model, params, "");
    if (m && v) {
        snprintf(path, sizeof path, "%s/optim.safetensors", dir);
        load_slab(path, model, m, ".exp_avg");
        load_slab(path, model, v, ".exp_avg_sq");
    }
}

static void add_slab(nb_st_writer *w, const nb_tf_model *model, const float *slab, const char *suffix, char (*names)[96],
                     int *k) {
    for (int i = 0; i < model->nparams; i++) {
        const nb_param *p = &model->params[i];
        snprintf(names[*k], 96, "%s%s", p->name, suffix);
        nb_st_add(w, names[*k], NB_F32, p->ndim, p->shape, slab + p->offset);
        (*k)++;
    }
}

void nb_ckpt_save(const char *out_dir, const nb_tf_model *model, const nb_train_opts *opts, const float *params,
                  const float *m, const float *v, const nb_ckpt_state *st) {
    char final[NB_PATH_MAX + 16], tmp[NB_PATH_MAX + 32], path[NB_PATH_MAX + 64];
    snprintf(final, sizeof final, "%s/ckpt", out_dir);
    nb_dir_tmp_begin(final, tmp, sizeof tmp);
    char(*names)[96] = nb_malloc(sizeof(*names) * (size_t)model->nparams * 3, "checkpoint names");
    int k = 0;

    snprintf(path, sizeof path, "%s/model.safetensors", tmp);
    nb_st_writer *w = nb_st_begin(path);
    nb_st_meta(w, "format", "pt");
    nb_st_meta(w, "producer", "nobubble");
    add_slab(w, model, params, "", names, &k);
    nb_st_end(w);

    snprintf(path, sizeof path, "%s/optim.safetensors", tmp);
    w = nb_st_begin(path);
    nb_st_meta(w, "producer", "nobubble");
    add_slab(w, model, m, ".exp_avg", names, &k);
    add_slab(w, model, v, ".exp_avg_sq", names, &k);
    nb_st_end(w);
    free(names);

    nb_json_writer j;
    nb_json_writer_init(&j, 2);
    nb_json_begin_obj(&j);
    nb_json_kstr(&j, "format", NB_CKPT_FORMAT);
    nb_json_kint(&j, "version", NB_CKPT_VERSION);
    nb_json_kint(&j, "step", st->step);
    nb_json_kint(&j, "data_pos", (int64_t)st->data_pos);
    nb_json_key(&j, "seed");
    nb_json_uint(&j, st->seed);
    nb_json_kstr(&j, "rng", "philox4x32-10 keyed by (seed, tensor name); no other random state");
    write_model_config(&j, &model->cfg);
    write_train_opts(&j, opts);
    nb_json_end_obj(&j);
    snprintf(path, sizeof path, "%s/state.json", tmp);
    nb_write_file_atomic(path, nb_json_text(&j), nb_json_len(&j));
    nb_json_writer_free(&j);

    nb_dir_replace(tmp, final);
}
