/* The transformer family (family/transformer.c, family/transformer_eval.c): a decoder-only
 * transformer of src/model/transformer.h adapted to a run. Its work items (embed, layer l
 * forward/backward, heads, join, optimizer) are the same for every schedule: schedules change when
 * work runs, never what is computed. It offers the layers capability (step.h nb_layers_i), so a
 * schedule that keeps the state itself (stream) binds its layers to the schedule's memory. */
#ifndef NB_FAMILY_TRANSFORMER_H
#define NB_FAMILY_TRANSFORMER_H

#include <stdint.h>

#include "data/loader.h"
#include "model/transformer.h"
#include "optim/optim.h"
#include "step/step.h"

typedef struct nb_tf_train nb_tf_train;

/* What a step reads and writes besides tensors, in backend memory: the host writes the AdamW
 * scalars and the loss scale of the step before it runs (a captured graph copies them in), and
 * reads the loss sum and the gradient norm after it. */
typedef struct {
    double loss_sum, sumsq;
    float clip;
    float loss_scale; /* a masked stream's: 1 / the step's counted targets over every rank (0: none) */
    float pad[6];
    nb_adamw_scalars k[2]; /* [0] with weight decay, [1] without */
} nb_step_scalars;

typedef struct nb_work {
    nb_tf_train *tr;
    int layer; /* or the segment, for the per-segment items */
} nb_work;

/* Arena offsets of the family's memory (planned, then placed once the arenas exist); a field is
 * SIZE_MAX when that buffer was not planned. */
typedef struct {
    size_t hp, hm, hv, hg, ha, hs;              /* host: master, moments, gradients, activations, sum */
    size_t dp, dg, dm, dv, dw, dac, dt, ds, dsum; /* backend memory of a device */
    size_t hb, db; /* LoRA: the frozen base, fp32 on the host and in compute precision on a device */
    int resident;                               /* the model state lives in the family's slabs */
} nb_tf_plan;

struct nb_tf_train {
    nb_run *run;
    nb_train_opts o; /* the run's options (seq resolved; batch: one micro-batch of this rank) */
    nb_tf_model model;
    const nb_backend_i *be;
    nb_lanes *lanes; /* the run's */
    nb_lane *compute, *data;
    /* LoRA (--lora): the model's weights are frozen in base / d_base, and everything below that
     * the optimizer touches (params, m, v, gradients, spans, buckets) is the adapters' slab */
    nb_tf_lora lora;
    float *base;  /* host fp32 base weights (the model's slab) */
    void *d_base; /* the base in compute precision where the step reads it (CPU: base itself) */
    nb_base_sink_fn base_sink; /* stream: the base goes group by group to the schedule instead */
    void *base_sink_self;
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
    /* a loss mask on the training data (data/loader.h): the loss is the mean over the step's
     * counted targets, so its gradient scale is h_step->loss_scale, which travels with the step */
    int masked;
    size_t counted;       /* the current step's counted targets over every rank (masked) */
    double loss_acc;      /* this rank's loss sum over the step's micro-batches */
    nb_bucket *buckets;   /* [1 + layers]: the embeddings and the final group, then layer l */
    void *d_weights;      /* compute-precision weights: bf16 copy, or d_params itself in fp32 */
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
    /* recompute (the binding's): every ckpt_interval-th layer's input kept, the last keep layers
     * kept whole; 0, 0: every activation kept */
    int ckpt_interval, keep;
    nb_tf_plan plan;
    /* bound by a schedule that keeps the state (nb_layers_i.bind): the input and output stages
     * packed (NULL: the family's own slabs), and layer weights for forward-only passes */
    void *res_w;
    float *res_g;
    nb_layer_fetch_fn fetch;
    void *fetch_self;
    size_t *layer_offset; /* [layers]: each layer group's slab offset (the binding's slab) */
    /* bound by a schedule that keeps some moments off the host slabs (nb_layers_i.bind_state);
     * state_io: [2 * nparams] the checkpoint's handles on those (transformer_eval.c) */
    nb_state_map state_map;
    int has_state_map;
    void *state_io;
};

extern const nb_family_i nb_family_transformer;

/* The family state of a run that trains a transformer. */
nb_tf_train *nb_tf_of(nb_run *r);
size_t nb_tf_es(const nb_tf_train *tr); /* bytes per compute-precision element */
int nb_tf_lora_on(const nb_tf_train *tr);
/* What the optimizer trains: the model's parameter table, or (LoRA) the adapters'. */
const nb_param *nb_tf_trained(const nb_tf_train *tr, int *nparams, size_t *total);
size_t nb_tf_trained_total(const nb_tf_train *tr); /* its element count */
int nb_tf_on_device(const nb_tf_train *tr);
/* Who draws the seeded init's normals: on a GPU its backend (same bits, far faster for big
 * models), on the CPU the host (NULL). *f is the filler's storage. */
const nb_tf_filler *nb_tf_filler_of(nb_run *r, nb_tf_filler *f);
/* A tensor of the input or output stage (NB_TF_WTE ..) in the weights / gradients the step uses. */
void *nb_tf_wptr(nb_tf_train *tr, int which);
float *nb_tf_gptr(nb_tf_train *tr, int which);
int nb_tf_head_index(const nb_tf_train *tr);
/* The current micro-batch's tokens where the backend reads them (copied in on ctx for a device). */
void nb_tf_batch_tokens(nb_tf_train *tr, nb_ctx ctx, const int32_t **in, const int32_t **tg);
/* Host side before a step or an evaluation batch: the batch is ready and staged. */
void nb_tf_stage_batch(nb_tf_train *tr, nb_loader_slot *slot);
/* Layer l's weights for a forward-only pass (evaluation, sampling), bound into w. */
void nb_tf_forward_weights(nb_tf_train *tr, nb_ctx ctx, int l, nb_tf_layer_view *w);
/* family/transformer_step.c: the step's work items into r->items, and the gradient buckets */
void nb_tf_build_items(nb_run *r, nb_tf_train *tr);
void nb_tf_set_buckets(nb_run *r, nb_tf_train *tr);

/* family/transformer_lora.c: LoRA's base and adapters */
void nb_tf_lora_plan(nb_run *r);                     /* the base's buffers (no-op without LoRA) */
void nb_tf_lora_log(const nb_tf_train *tr);           /* the 'lora' line at start */
void nb_tf_upload_base(nb_tf_train *tr, nb_ctx ctx); /* host fp32 base -> its compute copy */
void nb_tf_lora_start(nb_run *r, const char *resume_dir);
void nb_tf_lora_check(const nb_train_opts *o); /* refusals: other schedules, dropout, targets */

/* family/transformer_eval.c: held-out loss, sampling, checkpoint tensors and config */
/* Mean loss over the first n batches of a token stream (forward only; 0: all of it); covers
 * (unless NULL) gets what that was: "16 batches of 8 x 128 tokens = 16,384 tokens of FILE". */
double nb_tf_eval_shard(nb_run *r, const char *spec, int nbatches, char *covers, size_t cap);
/* Logits of the last position of tokens[0..T) (batch of one; needs o.batch == 1). */
void nb_tf_logits(nb_run *r, const int32_t *tokens, int T, float *logits);
void nb_tf_evaluate(nb_run *r, nb_eval *ev);
void nb_tf_ckpt_tensors(nb_run *r, nb_ckpt_list *model, nb_ckpt_list *optim);
void nb_tf_load_tensors(nb_run *r, const char *dir);
void nb_tf_write_config(const nb_train_opts *o, nb_json_writer *w);
void nb_tf_read_config(const nb_json *j, nb_train_opts *o);

#endif
