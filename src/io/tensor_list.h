/* Named fp32 host tensors and the checkpoint files that hold them: what a family lists for a
 * checkpoint (its weights, its optimizer state, its shards) and how such a list is read back.
 * The layout of a checkpoint directory (model.safetensors, optim.safetensors, one
 * shard-RRRRR-of-NNNNN.safetensors per rank) is named here once; run/ckpt.c writes it. */
#ifndef NB_IO_TENSOR_LIST_H
#define NB_IO_TENSOR_LIST_H

#include <stddef.h>
#include <stdint.h>

/* Bytes [offset, offset + bytes) of a tensor that is not in host memory (a schedule keeps it on
 * the device): fill copies them out of their place into dst, store copies src into it. */
typedef void (*nb_ckpt_fill_fn)(void *io, void *dst, size_t offset, size_t bytes);
typedef void (*nb_ckpt_store_fn)(void *io, const void *src, size_t offset, size_t bytes);
typedef struct {
    char name[96];
    int ndim;
    int64_t shape[2];
    float *data; /* NULL: elsewhere, reached through fill and store */
    nb_ckpt_fill_fn fill;
    nb_ckpt_store_fn store;
    void *io;
} nb_ckpt_tensor;
typedef struct {
    nb_ckpt_tensor *v;
    int n, cap;
    /* Writing: the checkpoint's fingerprint (state.json's "fingerprint", the same on every file
     * of one checkpoint) and the model's shape as compact JSON (state.json's "model"), kept in
     * the file's metadata; "" / NULL: none. Reading: filled by nb_ckpt_expect from state.json. */
    char stamp[40];
    char *model_json;
    int partial; /* reading: the file may hold tensors beyond the list (a reader of one part of it) */
} nb_ckpt_list;
void nb_ckpt_list_add(nb_ckpt_list *l, const char *name, int ndim, const int64_t *shape, float *data);
/* A tensor that lives elsewhere (data NULL): written through fill, read back through store. */
void nb_ckpt_list_add_io(nb_ckpt_list *l, const char *name, int ndim, const int64_t *shape, nb_ckpt_fill_fn fill,
                         nb_ckpt_store_fn store, void *io);
void nb_ckpt_list_free(nb_ckpt_list *l);
/* Elements of t (shape[0] * shape[1]); its values into buf when it lives elsewhere, else its data. */
size_t nb_ckpt_tensor_numel(const nb_ckpt_tensor *t);
const float *nb_ckpt_tensor_values(const nb_ckpt_tensor *t, float *buf);

/* What the files of the checkpoint in ckpt_dir must carry, from its state.json: its fingerprint
 * (a file of another run or another checkpoint of this run is refused) and its model shape (an
 * edit of state.json's shape fields is refused, naming the field). Nothing for a checkpoint
 * written before fingerprints. */
void nb_ckpt_expect(nb_ckpt_list *l, const char *ckpt_dir);
/* Read the listed tensors (each must exist with its shape) into their host buffers: from one
 * safetensors file, or a checkpoint directory's model.safetensors and (optim not NULL)
 * optim.safetensors (both checked with nb_ckpt_expect). Unless l->partial, a tensor of the file
 * that the list lacks is refused too (a model of another shape than the file's). */
void nb_ckpt_load_file(const char *path, nb_ckpt_list *l);
void nb_ckpt_load_lists(const char *dir, nb_ckpt_list *model, nb_ckpt_list *optim);
/* Write every tensor of l to a safetensors file (with_format: the "format": "pt" metadata that
 * loaders of model files look for). */
void nb_ckpt_write_list(const char *path, const nb_ckpt_list *l, int with_format);
/* A rank's shard file of state held in shards: CKPT/shard-RRRRR-of-NNNNN.safetensors. */
void nb_ckpt_shard_path(char *out, size_t cap, const char *ckpt_dir, int rank, int world);

#endif
