/* Checkpoints: DIR/ckpt/ with model.safetensors (fp32 weights by name), optim.safetensors (AdamW
 * moments "<name>.exp_avg" / "<name>.exp_avg_sq") and state.json (format, version, step, data
 * position, RNG seed, the model config and every training option). The directory is built under
 * a temp name and swapped in (io/atomic.h): a crash never leaves a half-written checkpoint. */
#ifndef NB_CHECKPOINT_H
#define NB_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "model/transformer.h"
#include "sched/trainer.h"

#define NB_CKPT_FORMAT "nobubble-checkpoint"
#define NB_CKPT_VERSION 1

typedef struct {
    int step;        /* steps completed */
    size_t data_pos; /* shard position of the next training batch */
    uint64_t seed;
} nb_ckpt_state;

/* The checkpoint directory for a user path: DIR itself if it holds state.json, else DIR/ckpt. */
void nb_ckpt_resolve(const char *dir, char *out, size_t cap);
/* Read state.json: the options the run was trained with (model config included) and the state.
 * opts may be NULL. Validates format and version. */
void nb_ckpt_read_state(const char *dir, nb_train_opts *opts, nb_ckpt_state *st);
/* Load weights (and AdamW moments when m, v are non-NULL) into slabs of the model's layout. */
void nb_ckpt_load(const char *dir, const nb_tf_model *model, float *params, float *m, float *v, nb_ckpt_state *st);
/* Write out_dir/ckpt atomically. */
void nb_ckpt_save(const char *out_dir, const nb_tf_model *model, const nb_train_opts *opts, const float *params,
                  const float *m, const float *v, const nb_ckpt_state *st);

#endif
