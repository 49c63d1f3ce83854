/* Named tensor lists and the checkpoint files that hold them (see tensor_list.h). */
#include "io/tensor_list.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core.h"
#include "io/json.h"
#include "io/safetensors.h"

void nb_ckpt_list_add(nb_ckpt_list *l, const char *name, int ndim, const int64_t *shape, float *data) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        l->v = realloc(l->v, (size_t)l->cap * sizeof *l->v);
        NB_CHECK(l->v != NULL, NULL, "out of memory for the checkpoint's tensor list");
    }
    nb_ckpt_tensor *t = &l->v[l->n++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = ndim;
    t->shape[0] = shape[0], t->shape[1] = ndim > 1 ? shape[1] : 1;
    t->data = data;
    t->fill = NULL, t->store = NULL, t->io = NULL;
}

void nb_ckpt_list_add_io(nb_ckpt_list *l, const char *name, int ndim, const int64_t *shape, nb_ckpt_fill_fn fill,
                         nb_ckpt_store_fn store, void *io) {
    nb_ckpt_list_add(l, name, ndim, shape, NULL);
    nb_ckpt_tensor *t = &l->v[l->n - 1];
    t->fill = fill, t->store = store, t->io = io;
}

size_t nb_ckpt_tensor_numel(const nb_ckpt_tensor *t) { return (size_t)t->shape[0] * (size_t)(t->ndim > 1 ? t->shape[1] : 1); }

const float *nb_ckpt_tensor_values(const nb_ckpt_tensor *t, float *buf) {
    if (t->data) return t->data;
    t->fill(t->io, buf, 0, nb_ckpt_tensor_numel(t) * sizeof(float));
    return buf;
}

/* A tensor that lives elsewhere is read through one tensor-sized buffer, then stored. */
static void read_tensor(nb_st_file *f, const nb_ckpt_tensor *t) {
    if (t->data) {
        nb_st_read_shaped(f, t->name, NB_F32, t->ndim, t->shape, t->data);
        return;
    }
    size_t bytes = nb_ckpt_tensor_numel(t) * sizeof(float);
    float *tmp = nb_malloc(bytes ? bytes : 1, "checkpoint tensor");
    nb_st_read_shaped(f, t->name, NB_F32, t->ndim, t->shape, tmp);
    t->store(t->io, tmp, 0, bytes);
    free(tmp);
}

void nb_ckpt_list_free(nb_ckpt_list *l) {
    free(l->v);
    free(l->model_json);
    memset(l, 0, sizeof *l);
}

#define STAMP_KEY "nobubble.fingerprint"
#define MODEL_KEY "nobubble.model"
static const char *mixed_hint = "restore the whole checkpoint directory from one run (its files belong together)";

void nb_ckpt_expect(nb_ckpt_list *l, const char *ckpt_dir) {
    char path[NB_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/state.json", ckpt_dir);
    nb_json *j = nb_json_load_file(path);
    snprintf(l->stamp, sizeof l->stamp, "%s", nb_json_get_str(j, "fingerprint", ""));
    free(l->model_json);
    l->model_json = NULL;
    const nb_json *m = nb_json_get(j, "model");
    if (l->stamp[0] && m && m->type == NB_JSON_OBJ) {
        nb_json_writer w;
        nb_json_writer_init(&w, 0);
        nb_json_begin_obj(&w);
        for (size_t i = 0; i < m->len; i++) {
            const nb_json *v = &m->items[i];
            if (v->type == NB_JSON_STR) nb_json_kstr(&w, m->keys[i], v->str);
            else if (v->type == NB_JSON_NUM && v->is_int) nb_json_kint(&w, m->keys[i], v->i64);
        }
        nb_json_end_obj(&w);
        l->model_json = strdup(nb_json_text(&w));
        NB_CHECK(l->model_json != NULL, "free some host memory", "out of memory reading %s", path);
        nb_json_writer_free(&w);
    }
    nb_json_free(j);
}

/* The first model field state.json gives otherwise than the file was written with, as
 * "state.json's model field 'heads' is 8, the file's 4" into buf; 0 when they agree (or either
 * is missing: a checkpoint from before fingerprints). */
static int model_diff(const nb_st_file *f, const nb_ckpt_list *l, char *buf, size_t cap) {
    const char *meta = nb_st_meta_get(f, MODEL_KEY);
    if (!meta || !l->model_json) return 0;
    nb_json *a = nb_json_parse_or_fail(meta, strlen(meta), nb_st_path(f));
    nb_json *b = nb_json_parse_or_fail(l->model_json, strlen(l->model_json), "state.json");
    int differs = 0;
    for (size_t i = 0; a->type == NB_JSON_OBJ && i < a->len && !differs; i++) {
        const nb_json *x = &a->items[i], *y = nb_json_get(b, a->keys[i]);
        if (x->type != NB_JSON_STR && !(x->type == NB_JSON_NUM && x->is_int)) continue; /* as nb_ckpt_expect keeps */
        char was[64] = "?", now[64] = "(none)";
        if (x->type == NB_JSON_STR) snprintf(was, sizeof was, "%.60s", x->str);
        else snprintf(was, sizeof was, "%lld", (long long)x->i64);
        if (y && y->type == NB_JSON_STR) snprintf(now, sizeof now, "%.60s", y->str);
        else if (y && y->type == NB_JSON_NUM) snprintf(now, sizeof now, "%lld", (long long)y->i64);
        differs = strcmp(was, now) != 0;
        if (differs) snprintf(buf, cap, "state.json's model field '%s' is %s, the file's %s", a->keys[i], now, was);
    }
    nb_json_free(a), nb_json_free(b);
    return differs;
}

void nb_ckpt_load_file(const char *path, nb_ckpt_list *l) {
    static const char *shape_hint = "the checkpoint belongs to another model shape (or its state.json's shape was edited: undo it)";
    nb_st_file *f = nb_st_open(path);
    if (l->stamp[0]) {
        const char *have = nb_st_meta_get(f, STAMP_KEY);
        NB_CHECK(have && !strcmp(have, l->stamp), mixed_hint,
                 "%s belongs to another checkpoint than its state.json (fingerprint %s, state.json's %s): files of "
                 "two runs or two steps were mixed", path, have ? have : "none", l->stamp);
    }
    char why[256] = "";
    int edited = model_diff(f, l, why, sizeof why);
    const char *sep = edited ? "; " : "";
    for (int i = 0; i < l->n; i++) {
        const nb_ckpt_tensor *t = &l->v[i];
        NB_CHECK(nb_st_find(f, t->name), shape_hint, "%s has no tensor '%s'%s%s", path, t->name, sep, why);
        read_tensor(f, t);
    }
    /* every listed name was found and names are unique: more tensors means some are not listed */
    if (!l->partial && nb_st_count(f) != l->n) {
        for (int k = 0; k < nb_st_count(f); k++) {
            const char *name = nb_st_at(f, k)->name;
            int listed = 0;
            for (int i = 0; i < l->n && !listed; i++) listed = !strcmp(l->v[i].name, name);
            NB_CHECK(listed, shape_hint, "%s holds tensor '%s', which the model state.json describes does not have%s%s",
                     path, name, sep, why);
        }
    }
    /* the same tensors under either value (heads splits hist.L.qkv.weight, max_len sizes no tensor) */
    NB_CHECK(!edited, shape_hint, "%s: %s; its tensors (from '%s' on) were trained with the file's", path, why,
             nb_st_count(f) ? nb_st_at(f, 0)->name : "-");
    nb_st_close(f);
}

void nb_ckpt_load_lists(const char *dir, nb_ckpt_list *model, nb_ckpt_list *optim) {
    char path[NB_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    nb_ckpt_expect(model, dir);
    nb_ckpt_load_file(path, model);
    if (optim) {
        snprintf(path, sizeof path, "%s/optim.safetensors", dir);
        NB_CHECK(access(path, F_OK) == 0,
                 "resume from a checkpoint written without --ckpt-weights-only (eval, sample and export read this one)",
                 "%s has no optim.safetensors: the optimizer state was not saved", dir);
        nb_ckpt_expect(optim, dir);
        nb_ckpt_load_file(path, optim);
    }
}

void nb_ckpt_write_list(const char *path, const nb_ckpt_list *l, int with_format) {
    nb_st_writer *w = nb_st_begin(path);
    if (with_format) nb_st_meta(w, "format", "pt");
    nb_st_meta(w, "producer", "nobubble");
    if (l->stamp[0]) nb_st_meta(w, STAMP_KEY, l->stamp);
    if (l->model_json) nb_st_meta(w, MODEL_KEY, l->model_json);
    for (int i = 0; i < l->n; i++) {
        const nb_ckpt_tensor *t = &l->v[i];
        if (t->data)
            nb_st_add(w, t->name, NB_F32, t->ndim, t->shape, t->data);
        else
            nb_st_add_fn(w, t->name, NB_F32, t->ndim, t->shape, t->fill, t->io);
    }
    nb_st_end(w);
}

void nb_ckpt_shard_path(char *out, size_t cap, const char *ckpt_dir, int rank, int world) {
    snprintf(out, cap, "%s/shard-%05d-of-%05d.safetensors", ckpt_dir, rank, world);
}
