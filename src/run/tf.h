/* The transformer family's state in a run (run/tf_family.c), and what the stream schedule, which
 * only runs transformers, shares with it. The work items (embed, layer l forward/backward, heads,
 * join, optimizer) are the same for every schedule: schedules change when work runs, never what
 * is computed. */
#ifndef NB_RUN_TF_H
#define NB_RUN_TF_H

#include <stdint.h>

#include "data/loader.h"
#include "model/transformer.h"
#include "optim/optim.h"
#include "run/run.h"

typedef struct nb_tf_train nb_tf_train;

/* What a step reads and writes besides tensors, in backend memory: the host writes the AdamW
 * scalars of the step before it runs (a captured graph copies them in), and reads the loss sum
 * and the gradient norm after it. */
typedef struct {
    double loss_sum, sumsq;
    float clip, pad[7];
    nb_adamw_scalars k[2]; /* [0] with weight decay, [1] without */
} nb_step_scalars;

typedef struct nb_work {
    nb_tf_train *tr;
    int layer; /* or the segment, for the per-segment items */
} nb_work;

typedef struct nb_stream nb_stream; /* sched/stream.c */

struct nb_tf_train {
    nb_run *run;
    nb_train_opts o; /* the run's options (seq resolved) */
    nb_tf_model model;
    const nb_backend_i *be;
    nb_lanes *lanes; /* the run's */
    nb_lane *compute, *data;
    float *params, *m, *v; /* host fp32 master weights and AdamW moments (checkpoints) */
    /* backend memory (the same buffers as the host ones on the CPU): */
    float *d_params, *d_grads, *d_m, *d_v;
    /* micro-batches (--grad-accum, ranks): the step's gradient sum (d_grads itself with one
     * micro-batch) and the slab the current micro-batch's backward writes (d_gsum for the first) */
    float *d_gsum, *g_cur;
    int micro;            /* the micro-batch whose items run (begin_micro) */
    int Bg, Bl;           /* sequences per step over every rank, and on this rank (o.batch: one micro-batch) */
    size_t stage_n;       /* tokens of the staged batch (h_tokens: its inputs, then its targets) */
    float inv_tokens;     /* 1 / tokens per step over every rank: the loss's gradient scale */
    double loss_acc;      /* this rank's loss sum over the step's micro-batches */
    nb_bucket *buckets;   /* [1 + layers]: the embeddings and the final group, then layer l */
    void *d_weights; /* compute-precision weights: bf16 copy, or d_params itself in fp32 */
    void *d_acts;
    void *d_segs;      /* the segments' scratch and partial gradients (ERASE), after the activations */
    int32_t *d_tokens; /* [2, B*T] inputs then targets (device backends only) */
    int32_t *h_tokens; /* the same, staged in pinned host memory by the host before each step */
    nb_step_scalars *d_step, *h_step; /* backend copy and host copy (the same on the CPU) */
    nb_step_scalars cpu_step;
    void *d_logits; /* sampling only */
    const int32_t *tok_in, *tok_tg; /* the step's tokens where the backend reads them */
    nb_tf_acts acts;
    nb_loader train;
    int has_train, has_val;
    nb_loader_slot *batch; /* the batch the enqueued work reads */
    double loss_sum;       /* the last step's, read by its results item */
    float grad_norm;
    nb_work *work;        /* [layers] */
    nb_adamw_span *spans; /* [model.nparams]: AdamW's tensor table */
    nb_work whole;
    /* segments (ERASE): layers seg_first[s] .. seg_first[s+1]-1; one segment when not detached */
    int nseg, seg_first[NB_MAX_SEGMENTS + 1];
    int *layer_seg;          /* [layers] -> segment */
    nb_tf_acts *seg_acts;    /* [nseg] views; the last is acts itself */
    float *d_head_part;      /* [nseg-1] partial gradients of the final norm and head, in backend memory */
    size_t head_part_stride; /* floats per segment in d_head_part */
    nb_work seg_work[NB_MAX_SEGMENTS];
    /* --schedule stream: the state lives on the host (sched/stream.c) */
    nb_stream *stream;
    float *h_grads; /* host gradient slab (stream) */
    int keep;       /* stream: layers whose activations are kept whole (keep_layers resolved) */
    int wslots;     /* stream: device weight slots (stream_slots resolved) */
    int glayers;    /* stream: layers whose state lives on the device (gpu_layers resolved) */
    size_t dev_free0;
};

/* The family state of a run that trains a transformer. */
nb_tf_train *nb_tf_of(nb_run *r);

/* Pieces the stream schedule's memory plan shares with the family's resident plan. */
size_t nb_tf_es(const nb_tf_train *tr); /* bytes per compute-precision element */
int nb_tf_on_device(const nb_tf_train *tr);
/* Activation bytes with `keep` layers kept whole (recompute) or all of them (no recompute). */
size_t nb_tf_acts_plan_bytes(const nb_tf_train *tr, int keep);
/* The segments' scratch and partial head gradients (ERASE), planned with the activations. */
size_t nb_tf_seg_bytes(const nb_tf_train *tr);
/* Logits of the last position of tokens[0..T) (batch of one; needs o.batch == 1). */
void nb_tf_logits(nb_run *r, const int32_t *tokens, int T, float *logits);
/* Mean loss over n batches of a shard (forward only; 0: the whole shard). */
double nb_tf_eval_shard(nb_run *r, const char *path, int nbatches);

/* Work items the stream schedule runs as they are (its own items bind the layers to its slots). */
void nb_work_embed_fwd(void *arg, const nb_task_ctx *ctx);
void nb_work_head(void *arg, const nb_task_ctx *ctx); /* final norm + loss + its backward */
void nb_work_embed_bwd(void *arg, const nb_task_ctx *ctx);

/* stream.c: what the trainer's shared work items call when the state lives on the host */
#define NB_STREAM_MAX_SLOTS 4 /* pinned slabs each way; gradient slots (min(2, weight slots)) */
void *nb_stream_global_w(nb_tf_train *tr, int which);
float *nb_stream_global_g(nb_tf_train *tr, int which);
void nb_stream_upload_globals(nb_tf_train *tr, nb_ctx ctx);
void nb_stream_zero_global_grads(nb_tf_train *tr, nb_ctx ctx);
void nb_stream_bind_sync(nb_tf_train *tr, nb_ctx ctx, int layer, nb_tf_layer_view *w);
double nb_stream_sumsq(const nb_tf_train *tr);
/* Waits until the optimizer has finished (before reading the host master: evaluation, checkpoints). */
void nb_stream_quiesce(nb_tf_train *tr);

#endif
