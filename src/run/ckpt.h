/* Checkpoints: DIR/ckpt/ with model.safetensors (fp32 weights by name), optim.safetensors (the
 * optimizer state by name: AdamW moments "<name>.exp_avg" / "<name>.exp_avg_sq", the tables'
 * Adagrad sums or sparse-Adam moments) and state.json (format, version, family, step, data
 * position, RNG seed, the model config and every training option). The directory is built under
 * a temp name and swapped in (io/atomic.h): a crash never leaves a half-written checkpoint. The
 * tensors are whatever the family lists (nb_family_i.ckpt_tensors), for every family alike. */
#ifndef NB_RUN_CKPT_H
#define NB_RUN_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "step/step.h"

#define NB_CKPT_FORMAT "nobubble-checkpoint"
#define NB_CKPT_VERSION 1

typedef struct {
    int step;        /* steps completed */
    size_t data_pos; /* data position of the next training batch */
    uint64_t seed;
} nb_ckpt_state;

/* The checkpoint directory for a user path: DIR itself if it holds state.json, else DIR/ckpt.
 * recover: bring back a checkpoint that a crash left as ckpt.old (only a writer may: the caller
 * holds the run directory). */
void nb_ckpt_resolve(const char *dir, char *out, size_t cap, int recover);
/* Does the run directory hold a checkpoint (ckpt/, or the ckpt.old a crash left mid-swap)? */
int nb_ckpt_exists(const char *run_dir);
/* Read state.json: the family's defaults, then the model config and every option the run was
 * trained with (opts may be NULL), and the state. Validates format, version and every value. */
void nb_ckpt_read_state(const char *dir, nb_train_opts *opts, nb_ckpt_state *st);
/* Write out_dir/ckpt atomically from the run's family's tensors (host copies current); with a
 * family that has shards, every rank calls it (collective) and writes its own. */
void nb_ckpt_save(nb_run *r, const char *out_dir, const nb_ckpt_state *st);
/* The same from tensor lists (tools and tests that hold a model's slabs without a run). */
void nb_ckpt_write(const char *out_dir, const nb_family_i *fam, const nb_train_opts *o, const nb_ckpt_list *model,
                   const nb_ckpt_list *optim, const nb_ckpt_state *st);

#endif
