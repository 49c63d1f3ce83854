/* Named fp32 host tensors and the checkpoint files that hold them: what a family lists for a
 * checkpoint (its weights, its optimizer state, its shards) and how such a list is read back.
 * The layout of a checkpoint directory (model.safetensors, optim.safetensors, one
 * shard-RRRRR-of-NNNNN.safetensors per rank) is named here once; run/ckpt.c writes it. */
#ifndef NB_IO_TENSOR_LIST_H
#define NB_IO_TENSOR_LIST_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    char name[96];
    int ndim;
    int64_t shape[2];
    float *data;
} nb_ckpt_tensor;
typedef struct {
    nb_ckpt_tensor *v;
    int n, cap;
} nb_ckpt_list;
void nb_ckpt_list_add(nb_ckpt_list *l, const char *name, int ndim, const int64_t *shape, float *data);
void nb_ckpt_list_free(nb_ckpt_list *l);

/* Read the listed tensors (each must exist with its shape) into their host buffers: from one
 * safetensors file, or a checkpoint directory's model.safetensors and (optim not NULL)
 * optim.safetensors. */
void nb_ckpt_load_file(const char *path, nb_ckpt_list *l);
void nb_ckpt_load_lists(const char *dir, nb_ckpt_list *model, nb_ckpt_list *optim);
/* Write every tensor of l to a safetensors file (with_format: the "format": "pt" metadata that
 * loaders of model files look for). */
void nb_ckpt_write_list(const char *path, const nb_ckpt_list *l, int with_format);
/* A rank's shard file of state held in shards: CKPT/shard-RRRRR-of-NNNNN.safetensors. */
void nb_ckpt_shard_path(char *out, size_t cap, const char *ckpt_dir, int rank, int world);

#endif
