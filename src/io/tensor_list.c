/* Named tensor lists and the checkpoint files that hold them (see tensor_list.h). */
#include "io/tensor_list.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
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
}

void nb_ckpt_list_free(nb_ckpt_list *l) {
    free(l->v);
    memset(l, 0, sizeof *l);
}

void nb_ckpt_load_file(const char *path, nb_ckpt_list *l) {
    nb_st_file *f = nb_st_open(path);
    for (int i = 0; i < l->n; i++) {
        const nb_ckpt_tensor *t = &l->v[i];
        NB_CHECK(nb_st_find(f, t->name), "the checkpoint belongs to another model shape", "%s has no tensor '%s'", path,
                 t->name);
        nb_st_read_shaped(f, t->name, NB_F32, t->ndim, t->shape, t->data);
    }
    nb_st_close(f);
}

void nb_ckpt_load_lists(const char *dir, nb_ckpt_list *model, nb_ckpt_list *optim) {
    char path[NB_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    nb_ckpt_load_file(path, model);
    if (optim) {
        snprintf(path, sizeof path, "%s/optim.safetensors", dir);
        nb_ckpt_load_file(path, optim);
    }
}

void nb_ckpt_write_list(const char *path, const nb_ckpt_list *l, int with_format) {
    nb_st_writer *w = nb_st_begin(path);
    if (with_format) nb_st_meta(w, "format", "pt");
    nb_st_meta(w, "producer", "nobubble");
    for (int i = 0; i < l->n; i++) nb_st_add(w, l->v[i].name, NB_F32, l->v[i].ndim, l->v[i].shape, l->v[i].data);
    nb_st_end(w);
}

void nb_ckpt_shard_path(char *out, size_t cap, const char *ckpt_dir, int rank, int world) {
    snprintf(out, cap, "%s/shard-%05d-of-%05d.safetensors", ckpt_dir, rank, world);
}
