/* The training run: options, state, and the work items that schedules place on lanes.
 *
 * A schedule (plain.c, later erase.c, stream.c) decides which lane runs which work item and
 * which marks it waits on; the work items (embed, layer l forward/backward, head, optimizer)
 * are the same for every schedule, so schedules change when work runs, never what is computed. */
#ifndef NB_TRAINER_H
#define NB_TRAINER_H

#include <stdint.h>
#include <stdio.h>

#include "data/loader.h"
#include "lanes/lanes.h"
#include "model/transformer.h"
#include "ops/backend.h"
#include "optim/optim.h"

#define NB_PATH_MAX 1024

typedef struct nb_train_opts {
    nb_tf_config model;
    char data[NB_PATH_MAX], val_data[NB_PATH_MAX], out[NB_PATH_MAX], resume[NB_PATH_MAX], trace[NB_PATH_MAX];
    char device[32], schedule[32], precision[16];
    uint64_t gpu_mem_limit; /* bytes; 0: what the device has free */
    uint64_t host_mem_limit; /* bytes; 0: what the host reports available */
    int batch, seq, steps, stop_after, warmup, eval_every, eval_batches, ckpt_every, log_every, threads;
    float lr, min_lr_frac, weight_decay, beta1, beta2, eps, grad_clip;
    uint64_t seed;
    int progress; /* 1: progress line on a terminal */
    int graphs;   /* capture the training step once (CUDA graph) and replay it */
    int no_ckpt;  /* write no checkpoint (benchmarks) */
    float time_limit; /* seconds of training in this process, then stop with a checkpoint (0: none) */
    /* ERASE (detached segments): cut points after which the residual stream is detached, as
     * given ("2,4": layers 0-1, 2-3, 4-..; "" none); each segment but the last gets a local head
     * (the final norm and the unembedding, shared) whose loss is weighted aux_weight */
    char detach[64];
    float aux_weight;
    int side_lanes;          /* --schedule erase: side lanes for the segments' backward */
    char erase_dispatch[16]; /* blocking (the main thread enqueues side work) or async */
    int ckpt_interval;       /* stream: keep every K-th layer's input, recompute the rest (0: keep all) */
    int stream_slots;        /* stream: device weight slots layers pass through (2: double buffering; -1: as many
                                as fit, up to one per layer, so the backward finds the forward's weights) */
    int pinned_slabs;        /* stream: pinned staging slabs each way (the bounded pinned pool) */
    int keep_layers;         /* stream with ckpt_interval > 0: the last N layers keep every activation
                              * (not recomputed); -1: as many as fit in GPU memory */
    int gpu_layers;          /* stream: N layers (spread evenly) keep weights, AdamW state and gradients on
                              * the device and update there; -1: as many as fit */
} nb_train_opts;

void nb_train_opts_defaults(nb_train_opts *o);
void nb_train_opts_print(const nb_train_opts *o, FILE *f);

typedef struct nb_trainer nb_trainer;

/* What a step reads and writes besides tensors, in backend memory: the host writes the AdamW
 * scalars of the step before it runs (a captured graph copies them in), and reads the loss sum
 * and the gradient norm after it. */
typedef struct {
    double loss_sum, sumsq;
    float clip, pad[7];
    nb_adamw_scalars k[2]; /* [0] with weight decay, [1] without */
} nb_step_scalars;

typedef struct {
    double *step, *loss;
    size_t n, cap;
} nb_series; /* a loss curve, for loss.svg */

typedef struct nb_work {
    nb_trainer *tr;
    int layer; /* or the segment, for the per-segment items */
} nb_work;

#define NB_MAX_SEGMENTS 64

typedef struct nb_stream nb_stream; /* sched/stream.c */

struct nb_trainer {
    nb_train_opts o;
    nb_tf_model model;
    const nb_backend_i *be;
    float *params, *m, *v; /* host fp32 master weights and AdamW moments (checkpoints) */
    /* backend memory (the same buffers as the host ones on the CPU): */
    float *d_params, *d_grads, *d_m, *d_v;
    void *d_weights; /* compute-precision weights: bf16 copy, or d_params itself in fp32 */
    void *d_acts;
    void *d_segs; /* the segments' scratch and partial gradients (ERASE), after the activations */
    int32_t *d_tokens; /* [2, B*T] inputs then targets (device backends only) */
    int32_t *h_tokens; /* the same, staged in pinned host memory by the host before each step */
    nb_step_scalars *d_step, *h_step; /* backend copy and host copy (the same on the CPU) */
    nb_step_scalars cpu_step;
    struct nb_graph *graph; /* --graphs: the captured step */
    void *d_logits; /* sampling only */
    const int32_t *tok_in, *tok_tg; /* the step's tokens where the backend reads them */
    nb_tf_acts acts;
    nb_lanes *lanes;
    nb_lane *compute, *data;
    nb_loader train;
    int has_train, has_val;
    int step; /* next step to run (0-based) */
    nb_loader_slot *batch; /* the batch the enqueued work reads */
    /* per-step results written by the work items */
    double loss_sum;
    float lr, grad_norm;
    nb_work *work; /* [layers] */
    nb_adamw_span *spans; /* [model.nparams]: AdamW's tensor table */
    nb_work whole;
    /* segments (ERASE): layers seg_first[s] .. seg_first[s+1]-1; one segment when not detached */
    int nseg, seg_first[NB_MAX_SEGMENTS + 1];
    int *layer_seg;            /* [layers] -> segment */
    nb_tf_acts *seg_acts;      /* [nseg] views; the last is acts itself */
    float *d_head_part;        /* [nseg-1] partial gradients of the final norm and head, in backend memory */
    size_t head_part_stride;   /* floats per segment in d_head_part */
    nb_work seg_work[NB_MAX_SEGMENTS];
    nb_lane *side[NB_MAX_SEGMENTS], *dispatch[NB_MAX_SEGMENTS];
    int nside;
    /* --schedule stream: the state lives on the host (stream.c) */
    nb_stream *stream;
    float *h_grads; /* host gradient slab (stream) */
    int keep;       /* stream: layers whose activations are kept whole (keep_layers resolved) */
    int wslots;     /* stream: device weight slots (stream_slots resolved) */
    int glayers;    /* stream: layers whose state lives on the device (gpu_layers resolved) */
    size_t dev_free0; /* device backends: free device memory before the trainer allocated any */
    FILE *metrics;
    nb_arena host_arena, dev_arena;
    nb_series train_hist, val_hist;
};

void nb_trainer_init(nb_trainer *tr, const nb_train_opts *o);
void nb_trainer_free(nb_trainer *tr);
/* Train from tr->step to o.steps (or o.stop_after); writes metrics, checkpoints, loss.svg. */
void nb_trainer_run(nb_trainer *tr);
/* Mean loss over n batches of a shard (forward only). */
double nb_trainer_eval_shard(nb_trainer *tr, const char *path, int nbatches);

/* Copy the backend's training state (weights, moments) into the host slabs. */
void nb_trainer_sync_to_host(nb_trainer *tr);
/* Logits of the last position of tokens[0..T) (batch of one; needs o.batch == 1). */
void nb_trainer_logits(nb_trainer *tr, const int32_t *tokens, int T, float *logits);

/* Work items (nb_task_fn): the pieces every schedule places on lanes. */
void nb_work_embed_fwd(void *arg, const nb_task_ctx *ctx);
void nb_work_layer_fwd(void *arg, const nb_task_ctx *ctx);
void nb_work_head(void *arg, const nb_task_ctx *ctx); /* final norm + loss + its backward */
void nb_work_layer_bwd(void *arg, const nb_task_ctx *ctx);
void nb_work_embed_bwd(void *arg, const nb_task_ctx *ctx);
void nb_work_optim(void *arg, const nb_task_ctx *ctx); /* clip + AdamW */
/* ERASE: segment s's local head (final norm + unembedding + loss and their backward), into its
 * own partial gradients; and the join that adds those partials to the gradients in segment
 * order (after every segment's backward). arg: &tr->seg_work[s] / &tr->whole. */
void nb_work_seg_head(void *arg, const nb_task_ctx *ctx);
void nb_work_join(void *arg, const nb_task_ctx *ctx);

/* Schedules: enqueue one training step on the trainer's lanes and return the end mark. */
nb_mark nb_sched_plain_step(nb_trainer *tr, int step);
nb_mark nb_sched_erase_step(nb_trainer *tr, int step);
nb_mark nb_sched_stream_step(nb_trainer *tr, int step);

#define NB_STREAM_MAX_SLOTS 4 /* pinned slabs each way; gradient slots (min(2, weight slots)) */
/* stream.c: setup (other_device_bytes: what the trainer already planned on the device), the
 * resident part's pointers, and the pieces the trainer's shared work items call */
void nb_stream_init(nb_trainer *tr, size_t other_device_bytes);
/* Device bytes the stream schedule allocates besides the activations (resident part, slots),
 * with wslots weight slots and glayers layers on the device; nb_stream_wslot_bytes and
 * nb_stream_glayer_bytes: what one more weight slot, one more device layer takes. */
size_t nb_stream_device_need(const nb_tf_model *m, int wslots, int glayers, size_t elem_size);
size_t nb_stream_wslot_bytes(const nb_tf_model *m, size_t elem_size);
size_t nb_stream_glayer_bytes(const nb_tf_model *m, size_t elem_size);
void nb_stream_free(nb_trainer *tr);
void *nb_stream_global_w(nb_trainer *tr, int which);
float *nb_stream_global_g(nb_trainer *tr, int which);
void nb_stream_upload_globals(nb_trainer *tr, nb_ctx ctx);
void nb_stream_zero_global_grads(nb_trainer *tr, nb_ctx ctx);
void nb_stream_bind_sync(nb_trainer *tr, nb_ctx ctx, int layer, nb_tf_layer_view *w);
double nb_stream_sumsq(const nb_trainer *tr);
/* One line: what crossed PCIe in the last step (layer uploads, bytes each way). */
void nb_stream_report(const nb_trainer *tr);
/* Waits until the optimizer has finished (before reading the host master: evaluation, checkpoints). */
void nb_stream_quiesce(nb_trainer *tr);
/* Enqueue segment s's layers' backward (and, for all but the last segment, its local head first)
 * on lane; shared by both schedules so they run the same items. */
void nb_sched_segment_backward(nb_trainer *tr, nb_lane *lane, int s, int step);

#endif
