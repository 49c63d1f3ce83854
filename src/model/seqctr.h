/* seqctr: the CTR / sequence-recommendation model of issue 4, forward and backward on any backend
 * (CPU fp32; CUDA bf16 or fp32). Histories are packed (no padding) inside the model.
 *
 * Per sample: ndense dense features (already log(1 + max(x, 0)), 0 when missing), ncat
 * categorical ids, a target item id, a history of 0..max_len item ids (most recent last), a 0/1
 * label. ndense and ncat are the data's (its schema, data/ctr_schema.h); Criteo and the synthetic
 * generator have 13 and 26 (NB_SC_STD_NDENSE, NB_SC_STD_NCAT): 26 tables, D0 = 29 E.
 *   bottom  = MLP ndense -> 512 -> 256 -> E (ReLU between, none after)
 *   cat_f   = table f [id mod rows_f]          (missing ids are passed as 0 -> row 0)
 *             a multi-valued column (cfg.pool): the sum (or mean) of table f [id mod rows_f] over
 *             the sample's ids, added in order from the first; no id: a zero vector
 *   t       = item table [target mod item_rows]; h_j = item table [hist_j mod item_rows]
 *   history encoder: hist_layers pre-norm layers over h (padding-masked, `heads` heads):
 *     h += proj(seqattn(qkv(LN1(h))));  h += fc2(relu(fc1(LN2(h))))     (fc1: E -> 4E)
 *   target attention: q = Wq t, k_j = Wk h_j, v_j = Wv h_j, pooled = softmax-weighted sum of v
 *     over the valid j (zero for an empty history); no biases.
 *   x0 = [bottom | cat_0 .. cat_{ncat-1} | t | pooled]   width D0 = (ncat + 3) E
 *   block i = 0..blocks-1 (x_{-1} := x0, written x_prev):
 *     c = x0 * (U_i (V_i^T x_prev) + b_i) + x_prev;  x_i = c + W2_i relu(W1_i c + b1_i) + b2_i
 *     logit_i = w_i . x_i + beta_i
 *   loss = mean BCE(logit_last) + aux_weight * sum_{i < last} mean BCE(logit_i)
 *
 * Dense parameters live in one fp32 slab (nb_sc_model.params, gradients in .grads, same layout);
 * each tensor has a name, used verbatim as the checkpoint (safetensors) tensor name:
 *   bottom.{0,1,2}.weight [out, in] (nn.Linear layout), bottom.{0,1,2}.bias [out]
 *   hist.{l}.ln1.weight/.bias [E], hist.{l}.qkv.weight [3E, E] (q rows, then k, then v; head h =
 *     rows h*E/heads ..), hist.{l}.qkv.bias [3E], hist.{l}.proj.weight [E, E], .proj.bias [E],
 *     hist.{l}.ln2.weight/.bias [E], hist.{l}.fc1.weight [4E, E], .fc1.bias [4E],
 *     hist.{l}.fc2.weight [E, 4E], .fc2.bias [E]
 *   target.wq [E, E], target.wk [E, E], target.wv [E, E]   (q = t @ wq^T, as nn.Linear)
 *   block.{i}.U [D0, r], block.{i}.V [D0, r], block.{i}.b [D0],
 *   block.{i}.w1 [H, D0], block.{i}.b1 [H], block.{i}.w2 [D0, H], block.{i}.b2 [D0],
 *   block.{i}.head.w [1, D0], block.{i}.head.b [1]
 * The step reads the dense tensors through typed views (nb_sc_view: m->w, m->dw), never by name.
 * Embedding tables (sparse, separately, held by the embedding module emb/emb.h: m->emb.table
 * [total_rows, E], or this rank's shard of it); table t (0..ncat-1 categorical, ncat = items) starts at
 * row emb_off[t], so (table, row) is global row emb_off[t] + row. Checkpoint names: emb.cat.{f}
 * [rows_f, E], emb.item [item_rows, E].
 *
 * Files: seqctr.c (the math), seqctr_mem.c (tensors, views, memory, save/load), seqctr_batch.c
 * (a batch's host staging), seqctr_internal.h (what they share). */
#ifndef NB_SEQCTR_H
#define NB_SEQCTR_H

#include <stddef.h>
#include <stdint.h>

#include "emb/emb.h"
#include "lanes/lanes.h"
#include "optim/optim.h"
#include "tensor.h"

/* The standard shape (Criteo, the synthetic generator, MovieLens, and checkpoints written before
 * the shape was stored): 13 dense, 26 categorical columns. */
#define NB_SC_STD_NDENSE 13
#define NB_SC_STD_NCAT 26
/* The most columns a model reads (the categorical tables' rows live in fixed arrays; a batch's
 * lookup lists hold ncat + 1 fields, ops/ops_ctr.h's NB_CTR_LISTS_MAX_FIELDS). */
#define NB_SC_MAX_DENSE 64
#define NB_SC_MAX_CAT 64
#define NB_SC_BOTTOM1 512
#define NB_SC_BOTTOM2 256
#define NB_SC_MAX_BLOCKS 64
#define NB_SC_MAX_TOP 8 /* hidden layers of the DLRM form's top MLP at most */

typedef struct {
    int E, hist_layers, heads, blocks, cross_rank, block_hidden, max_len;
    int ndense, ncat;                 /* columns: 1..NB_SC_MAX_DENSE, 1..NB_SC_MAX_CAT */
    int64_t cat_rows[NB_SC_MAX_CAT]; /* rows of each categorical table (>= 1), [0, ncat) */
    int64_t item_rows;
    /* categorical column f: NB_SC_POOL_NONE (one id, the default) or a multi-valued column of up
     * to mv_max[f] ids per sample whose rows are summed (NB_SC_POOL_SUM) or averaged (_MEAN) */
    unsigned char pool[NB_SC_MAX_CAT];
    int mv_max[NB_SC_MAX_CAT];
    float aux_weight;
    uint64_t detach; /* bit i: block i reads a detached (stop-gradient) x_{i-1}; bit 0 must be 0 */
    uint64_t seed;   /* weight init */
    /* ntop >= 1: the DLRM-DCNv2 form (below), its top MLP's hidden widths top[0..ntop-1]; 0: seqctr */
    int ntop;
    int top[NB_SC_MAX_TOP];
} nb_sc_config;

/* The DLRM form (cfg.ntop >= 1; --model dlrm-dcnv2, MLPerf's DLRM-DCNv2 with ntop 4 and widths
 * 1024, 1024, 512, 256; needs hist_layers 0 and max_len 0, no --detach, no aux heads):
 *   bottom  = relu(MLP ndense -> 512 -> 256 -> E), a ReLU after every layer (torchrec's DenseArch)
 *   xd      = [bottom | cat_0 .. cat_{ncat-1}]   width Dx = (ncat + 1) E (x0's first Dx columns:
 *             the target and pooled slots stay in x0 but nothing reads them, so the one-row item
 *             table gets a zero gradient and Adagrad leaves it as it is)
 *   cross i = 0..blocks-1: x_i = xd * (U_i (V_i^T x_{i-1}) + b_i) + x_{i-1}, x_{-1} = xd
 *             (torchrec's LowRankCrossNet: W = U, V^T = V_kernel; no MLP, no per-block head)
 *   top     = relu(top.j(..)) for j < ntop, then logit = top.{ntop}(..) (one output, no ReLU)
 *   loss    = mean BCE(logit)
 * Tensors: bottom.* as above; block.{i}.U [Dx, r], block.{i}.V [Dx, r], block.{i}.b [Dx];
 * top.{j}.weight [out, in], top.{j}.bias [out] for j = 0..ntop (the last one's out is 1). */
static inline int nb_sc_dlrm(const nb_sc_config *c) { return c->ntop > 0; }

/* Defaults of the issue: E 64, 1 history layer, 4 heads, 6 blocks, rank 256, hidden 512,
 * max_len 256, the standard 13 dense and 26 categorical columns, tables of 1 row (the caller sets
 * the rows), aux_weight 0. */
void nb_sc_config_default(nb_sc_config *c);
enum { NB_SC_POOL_NONE = 0, NB_SC_POOL_SUM = 1, NB_SC_POOL_MEAN = 2 };
#define NB_SC_MAX_MV 256 /* the most values a multi-valued column keeps per sample */
/* Multi-valued columns: how many, and their values per sample together (a batch's mv_stride). */
static inline int nb_sc_nmv(const nb_sc_config *c) {
    int n = 0;
    for (int f = 0; f < c->ncat; f++) n += c->pool[f] != NB_SC_POOL_NONE;
    return n;
}
static inline int nb_sc_mv_width(const nb_sc_config *c) {
    int n = 0;
    for (int f = 0; f < c->ncat; f++) n += c->pool[f] != NB_SC_POOL_NONE ? c->mv_max[f] : 0;
    return n;
}
/* Whether a multi-valued column is averaged: only those need their values' gradient rows (a sum's
 * values read their slot's gradient: ops_ctr.h, col_sum). */
static inline int nb_sc_has_mean(const nb_sc_config *c) {
    for (int f = 0; f < c->ncat; f++)
        if (c->pool[f] == NB_SC_POOL_MEAN) return 1;
    return 0;
}
/* The tables: ncat categorical ones, then the item table (its index: nb_sc_item_table). */
static inline int nb_sc_ntables(const nb_sc_config *c) { return c->ncat + 1; }
static inline int nb_sc_item_table(const nb_sc_config *c) { return c->ncat; }

typedef struct {
    char name[48];
    size_t off, n;
    int rows, cols; /* 1-D tensors: rows = n, cols = 1 */
    int decay;      /* 1: AdamW weight decay applies (2-D weights) */
} nb_sc_tensor;

/* Typed views of the dense slab: each tensor as a pointer into a slab with the tensor table's
 * layout, either the compute weights (the backend's act dtype: nb_sc_model.w) or the fp32
 * gradients (nb_sc_model.dw). The step reads its weights only through them; the tensor names
 * above serve checkpoints and export. */
typedef struct {
    void *weight[3], *bias[3]; /* bottom.{i}.weight, bottom.{i}.bias */
} nb_sc_bottom_view;
typedef struct { /* hist.{l}.* */
    void *ln1_w, *ln1_b, *qkv_w, *qkv_b, *proj_w, *proj_b, *ln2_w, *ln2_b, *fc1_w, *fc1_b, *fc2_w, *fc2_b;
} nb_sc_enc_view;
typedef struct {
    void *wq, *wk, *wv; /* target.*: wk and wv adjacent (the fused key/value projection) */
} nb_sc_target_view;
typedef struct { /* block.{i}.*: the cross (U, V, b), the MLP (w1, b1, w2, b2), the logit head */
    void *U, *V, *b, *w1, *b1, *w2, *b2, *head_w, *head_b;
} nb_sc_block_view;
typedef struct {
    nb_sc_bottom_view bottom;
    nb_sc_enc_view *hist; /* [hist_layers] */
    nb_sc_target_view target;
    nb_sc_block_view *block; /* [blocks] */
    void *top_w[NB_SC_MAX_TOP + 1], *top_b[NB_SC_MAX_TOP + 1]; /* the DLRM form's top MLP */
} nb_sc_view;

/* One batch. hist is [B, hist_stride] with hist_len[b] valid items first. Multi-valued columns
 * (cfg.pool): sample i's values of the j-th such column (in column order) are mv[i * mv_stride +
 * k_j ..], mv_len[i * nmv + j] of them, k_j the earlier columns' mv_max summed; their cat[i, f] is
 * not read. */
typedef struct {
    int B, hist_stride;
    const float *dense;     /* [B, ndense] */
    const uint32_t *cat;    /* [B, ncat] ids (0 = missing) */
    const uint32_t *target; /* [B] */
    const uint32_t *hist;   /* [B, hist_stride] */
    const int32_t *hist_len; /* [B] in 0..max_len */
    const float *label;     /* [B] in [0, 1] (may be NULL for forward-only) */
    const uint32_t *mv;     /* [B, mv_stride] (NULL without multi-valued columns) */
    const int32_t *mv_len;  /* [B, nmv] in 0..mv_max */
    int mv_stride;
} nb_sc_batch;

typedef struct nb_sc_acts nb_sc_acts;
typedef struct nb_sc_stage nb_sc_stage;
struct nb_backend_i;
struct nb_ctr_ops_i;
struct nb_task_ctx;

/* The optimizers of a step: AdamW on the dense slab (weight decay on 2-D tensors only; clipped
 * by the dense gradient's global norm when grad_clip > 0), and on the embedding rows the batch
 * touched row-wise Adagrad (accumulators start at 0) or, with emb_adam, lazy sparse Adam with
 * the same betas. */
typedef struct {
    float lr, beta1, beta2, eps, weight_decay, grad_clip;
    float emb_lr, emb_eps;
    int emb_adam;
    int emb_exact; /* the tables' Adagrad element-wise (FBGEMM's EXACT_ADAGRAD) instead of row-wise */
    /* 1: Adagrad on the dense slab instead of AdamW (accumulators start at 0, in the first moment's
     * buffer; eps as torch.optim.Adagrad: lr * g / (sqrt(acc) + eps); grad_clip and weight_decay
     * unused), as MLPerf's DLRM-DCNv2 reference */
    int dense_adagrad;
} nb_sc_optim;

enum { NB_SC_ADAGRAD = NB_EMB_ADAGRAD, NB_SC_ADAM = NB_EMB_ADAM, NB_SC_ADAGRAD_EXACT = NB_EMB_ADAGRAD_EXACT }; /* the tables' optimizer (nb_emb_opts.opt) */

/* How a model is laid out beyond its shape. */
typedef struct {
    /* the tables (emb/emb.h): their optimizer (-1: state for both), row-wise sharding over ranks
     * (shard.world 0: whole on this rank), pipelined exchange, host placement (--emb-place host),
     * windows of parts (--micro-batches: Frozen-Window Pipelining), --emb-priority */
    nb_emb_opts emb;
    /* who builds a batch's index lists and their deduplication: NB_SC_LISTS_AUTO (the device,
     * when the backend has one and the tables are whole; else the host), _HOST, _DEVICE. The
     * lists are the same bits either way; on the device the host only stages the raw ids. */
    int lists;
    /* every training batch's multi-valued fields hold their max_values values (checked: --graphs
     * needs it, a captured step has the value counts of the batch it was captured with) */
    int full_mv;
} nb_sc_plan_opts;

enum { NB_SC_LISTS_AUTO = 0, NB_SC_LISTS_HOST = 1, NB_SC_LISTS_DEVICE = 2 };

#define NB_SC_RING NB_EMB_RING /* training stages: the step's batch, the next one (fetched), the one after (prepared) */

/* A model lives on one backend (backend.h + backend_ctr.h) and owns no memory: every buffer is
 * a view into three arenas the caller owns (nb_sc_plan / nb_sc_bind; nb_sc_init_on makes its own
 * for tests and tools). On the CPU backend the host arrays below ARE the backend's memory; on
 * CUDA they are host mirrors, filled by nb_sc_to_host and pushed by nb_sc_to_device (checkpoints
 * and tests use them). */
typedef struct {
    nb_sc_config cfg;
    int D0;
    nb_sc_tensor *t; /* [ntensors]: sized to the model (nb_sc_tensor_count) */
    int ntensors;
    nb_sc_view w, dw; /* the compute weights and the gradients, bound to d_w and d_grads */
    size_t nparams;       /* slab length: every tensor starts 64-element aligned (padding is 0) */
    size_t nparams_used;  /* parameters without the padding */
    float *params, *grads; /* [nparams] host */
    int64_t emb_off[NB_SC_MAX_CAT + 2]; /* [nb_sc_ntables + 1]: emb_off[ncat + 1] = total rows */
    /* the tables (global row g = emb_off[table] + row), whole or this rank's shard, their
     * optimizer state and placement, the exchange of a sharded batch's rows, the ring of batches
     * in flight (emb/emb.h) */
    nb_emb emb;
    float loss_den; /* the loss is a sum over samples / loss_den (0: the batch's size; ranks: the global batch) */
    /* sparse gradient of the last backward: nuniq strictly increasing global rows + [nuniq, E]
     * (uniq_rows is built on the host with the batch, or with device lists copied back by
     * nb_sc_to_host; uniq_grads is a mirror on CUDA) */
    int64_t *uniq_rows;
    float *uniq_grads;
    int nuniq;
    /* backend side */
    const struct nb_backend_i *be;
    const struct nb_ctr_ops_i *co;
    const struct nb_task_ctx *ctx; /* the lane ops run on (nb_sc_set_ctx); a default one if NULL */
    float *d_params, *d_grads, *d_uniq_grads;
    void *d_w;                  /* compute weights in the backend's act dtype (d_params when fp32) */
    float *d_am, *d_av;         /* AdamW moments */
    float *am, *av;             /* their host copies (the same memory on the CPU) */
    double *d_loss;             /* [2]: the last forward's loss, the dense gradient's sum of squares */
    void *d_k, *h_k;            /* AdamW scalars (nb_adamw_scalars[2]) in backend / host memory */
    int nseg, seg_first[NB_SC_MAX_BLOCKS + 1]; /* segments: blocks seg_first[k] .. seg_first[k+1]-1 */
    nb_sc_stage *stage;      /* the batch the last forward read (stages[emb.cur]) */
    /* host staging: the model's lists of the ring's batches (emb.batch has their exchange lists);
     * stages[NB_SC_RING] is evaluation's */
    nb_sc_stage *stages[NB_SC_RING + 1];
    int stage_nh;  /* history rows of the prepared batch (before padding) */
    double stage_dedup_s; /* host seconds the lists' dedup (and asks) of the batch prepared last took (0: device lists) */
    int pad_rows; /* device backends: histories padded to a bucket (seqctr_batch.c: bucket_rows) */
    int dev_lists; /* the device builds the index lists (nb_sc_plan_opts.lists) */
    int full_mv;   /* nb_sc_plan_opts.full_mv */
    int ahead;     /* nb_sc_plan_opts.emb.pipelined (sharded or not): the next batch's lists go in
                    * while the step's are read, so each ring slot has its own device lists */
    /* set by the trainer: the embedding backward phase applies element-wise Adagrad to each unique
     * row as its gradient completes (unsharded tables), and the embedding optim phase is not run */
    int emb_update_in_bwd;
    nb_sc_acts *acts;
    int max_batch;
    unsigned char *init_kind; /* [ntensors] */
    nb_adamw_span *spans; /* [ntensors]: AdamW's tensor table */
    struct nb_arena *ar_dev, *ar_pin, *ar_host;
    size_t ar_start[3]; /* where the model's part of each arena starts */
    struct nb_arena *own_arenas;     /* nb_sc_init_on's, freed with the model */
    struct nb_backend *own_backend; /* likewise */
    nb_task_ctx own_ctx;            /* the default lane context (own_backend's) */
} nb_sc_model;

/* Rows of every table together (global rows 0 .. nb_sc_total_rows - 1). */
static inline int64_t nb_sc_total_rows(const nb_sc_model *m) { return m->emb_off[nb_sc_ntables(&m->cfg)]; }

/* Fails (nb_fail) unless batches of max_batch samples with ncat categorical columns and histories
 * of up to max_len items fit the model's 32-bit lookup indices: callers check it before sizing anything by the batch. */
void nb_sc_check_batch_size(int max_batch, int max_len, int ncat);
/* The memory plan for batches of up to max_batch samples on backend be: the tensor table, and
 * the bytes of every view in the arenas (device: parameters, gradients, optimizer state,
 * activations, the batch's index lists; pinned: their host staging; host: the weights' and the
 * optimizer state's mirrors on CUDA). Nothing is allocated. po (NULL: whole tables, both tables'
 * optimizers' state): the tables' layout and who builds the index lists. Fails (nb_fail) on an
 * invalid config. */
void nb_sc_plan(nb_sc_model *m, const nb_sc_config *cfg, int max_batch, const struct nb_backend_i *be,
                const nb_sc_plan_opts *po, struct nb_arena *dev, struct nb_arena *pinned, struct nb_arena *host);
/* Phases of the batch after the step's (pipelined: NB_SC_FWD_UPLOAD, NB_SC_EMB_SERVE,
 * NB_SC_RESYNC_SERVE, NB_SC_RESYNC_APPLY), enqueued while the step's batch trains. */
void nb_sc_enqueue_next_phase(nb_sc_model *m, const struct nb_task_ctx *ctx, int phase);
/* A batch of a sharded model's evaluation, prepared into the evaluation stage (its exchange then
 * runs like a training batch's: nb_emb_asked / nb_emb_serve see it as the batch prepared last);
 * nb_sc_begin_aside makes it the current batch; nb_sc_end_aside(m, token) hands the exchange
 * back to the training batches (token: what nb_sc_prepare_aside returned). Training batches
 * prepared ahead stay prepared. */
int nb_sc_prepare_aside(nb_sc_model *m, const nb_sc_batch *b);
void nb_sc_begin_aside(nb_sc_model *m);
void nb_sc_end_aside(nb_sc_model *m, int token);
/* Once the arenas are allocated (and zeroed): binds every view and initialises the weights
 * (deterministic from cfg.seed), copied to the backend on ctx. */
void nb_sc_bind(nb_sc_model *m, const struct nb_task_ctx *ctx);
/* Build, allocate (arenas of its own) and initialise for batches of up to max_batch samples, on
 * the CPU backend. Fails (nb_fail) on an invalid config. */
void nb_sc_init(nb_sc_model *m, const nb_sc_config *cfg, int max_batch);
/* The same on any backend (the weights are initialised on the host, then copied). */
void nb_sc_init_on(nb_sc_model *m, const nb_sc_config *cfg, int max_batch, const struct nb_backend_i *be);
void nb_sc_free(nb_sc_model *m);
/* The tensor with this name, or NULL. */
const nb_sc_tensor *nb_sc_find(const nb_sc_model *m, const char *name);
/* Ops of later calls run on this lane (NULL: the backend's default stream / the calling thread). */
void nb_sc_set_ctx(nb_sc_model *m, const struct nb_task_ctx *ctx);

/* Forward: logits[B] of the last head (may be NULL) and, when labels are given, the loss (mean
 * BCE of the last head + aux). Keeps what backward needs. On CUDA it waits for the result. */
double nb_sc_forward(nb_sc_model *m, const nb_sc_batch *b, float *logits);
/* Backward of the last forward (same batch): grads += d loss / d params (the caller zeroes
 * grads), and the embedding gradient into uniq_rows / the backend's uniq gradients (overwritten,
 * duplicates summed in a fixed order). */
void nb_sc_backward(nb_sc_model *m, const nb_sc_batch *b);

/* The same split for a training loop that keeps the device busy:
 *   nb_sc_prepare (host: index lists of the batch and their deduplication, or with device lists
 *   the batch's raw ids staged for the upload phase) ->
 *   nb_sc_forward_enqueue -> nb_sc_backward_enqueue -> nb_sc_optim_enqueue ->
 *   nb_sc_loss (waits). prepare alternates between two host buffers, which the enqueued
 * copies read: the batch after next may be prepared only once the step that read the
 * buffer before it has finished (so: prepare k+1 while step k runs, wait for step k, go on). */
void nb_sc_prepare(nb_sc_model *m, const nb_sc_batch *b);
/* The same for part `part` of a window of nparts batches (sharded: nb_sc_plan_opts.parts). The
 * first part of a window zeroes the loss (and the caller the dense gradient: nb_sc_first_part);
 * the tables' sums and update run after the last part's backward. */
void nb_sc_prepare_part(nb_sc_model *m, const nb_sc_batch *b, int part, int nparts);
/* Is the step's batch the first part of its window? */
int nb_sc_first_part(const nb_sc_model *m);
void nb_sc_forward_enqueue(nb_sc_model *m);
void nb_sc_backward_enqueue(nb_sc_model *m);
/* One optimizer step t >= 1 on the gradients of the last backward. */
void nb_sc_optim_enqueue(nb_sc_model *m, const nb_sc_optim *o, int t);
/* The host side of the phases' optimizer step t: its AdamW scalars into the host buffer the
 * dense optimizer phase copies in (before the phase is enqueued, or replayed). */
void nb_sc_optim_prepare(nb_sc_model *m, const nb_sc_optim *o, int t);
void nb_sc_zero_grads(nb_sc_model *m);
/* The step in phases (a schedule places them on lanes; a trace tells them apart). The blocks
 * form segments: a segment starts at block 0 and at every detached block, and its backward
 * depends only on its own forward, so segments' backward passes may run on side lanes while
 * later segments run forward (ERASE). forward_enqueue / backward_enqueue / optim_enqueue run
 * the phases in order on one lane. seg is read by the SEG phases, o and t by the optimizers. */
typedef enum {
    NB_SC_FWD_UPLOAD, /* copy the prepared batch's index lists in, or its ids and build them there (their sizes change per batch) */
    NB_SC_EMB_SERVE,  /* sharded: the owner looks up the rows the askers want (then: the rows all-to-all) */
    NB_SC_FWD_EMB,    /* bottom MLP, embedding gather into x0 */
    NB_SC_FWD_HIST,   /* history gather, encoder, target attention */
    NB_SC_FWD_SEG,    /* one segment's blocks, heads and losses (seg = 0 .. nseg-1, in order) */
    NB_SC_BWD_SEG,    /* one segment's backward: any order, any lane, once its forward is done */
    NB_SC_BWD_JOIN,   /* x0's gradient from the segments' shares, after every segment's backward */
    NB_SC_BWD_HIST,
    NB_SC_BWD_BOTTOM, /* the bottom MLP */
    NB_SC_OPT_DENSE,  /* AdamW */
    NB_SC_BWD_EMB,    /* the unique rows' embedding gradient (their count changes per batch) */
    NB_SC_EMB_SUM,    /* sharded, after the gradient all-to-all: the owner's sum per row, in rank order */
    NB_SC_RESYNC_SERVE, /* pipelined, after the step's table update: the next batch's collision rows */
    NB_SC_RESYNC_APPLY, /* and after their all-to-all: into the next batch's work buffer */
    NB_SC_OPT_EMB,    /* sparse optimizer on the touched rows */
    NB_SC_FETCH_APPLY, /* --emb-priority: the next batch's exclusive rows, after their all-to-all, into its work buffer */
    NB_SC_NPHASES
} nb_sc_phase;
void nb_sc_enqueue_phase(nb_sc_model *m, const struct nb_task_ctx *ctx, nb_sc_phase p, int seg, const nb_sc_optim *o,
                         int t);
/* With the phases: makes the prepared batch the step's (forward_enqueue does it itself). Call
 * it from the thread that prepares, before the step's first phase is enqueued. */
void nb_sc_begin_step(nb_sc_model *m);
/* The ring slot (0 .. NB_SC_RING-1) of the step's batch: pipelined device steps capture a graph
 * per slot (each slot has its own device lists). */
int nb_sc_current_slot(const nb_sc_model *m);
/* The step's batch: its distinct rows (the rows a sharded batch moves), and (pipelined) how many
 * of them were re-synced after the step before updated them. */
void nb_sc_batch_rows(nb_sc_model *m, int *distinct, int *resynced);
/* The step's batch's unique rows. With device lists the device counts them: this waits for the
 * batch's upload phase (call it after the step's phases, or in tests). */
int nb_sc_unique_rows(nb_sc_model *m);
/* --emb-priority: the step's rows that moved ahead (its exclusive rows); -1 without it. */
int nb_sc_rows_ahead(const nb_sc_model *m);
const char *nb_sc_phase_name(nb_sc_phase p);
/* History rows (with the padding) of the batch the next phases read: the step's graph key. */
int nb_sc_prepared_rows(const nb_sc_model *m);
/* The last forward's loss / last-head logits (wait for the lane). nb_sc_forward prepares its batch
 * in a stage of its own: a training batch prepared ahead (nb_sc_prepare) stays prepared. */
double nb_sc_loss(nb_sc_model *m);
void nb_sc_logits(nb_sc_model *m, float *logits);
/* Mirrors: backend -> host (params, grads, emb, uniq_grads) and host -> backend (params, emb;
 * refreshes the compute weights). No-ops on the CPU backend. */
void nb_sc_to_host(nb_sc_model *m);
void nb_sc_to_device(nb_sc_model *m);

/* Checkpoint: every dense tensor under its name (1-D tensors as [n]) and the tables emb.cat.{f}
 * [rows_f, E], emb.item [item_rows, E], all F32; metadata "seqctr.config" holds the shape
 * ("E=.. hist_layers=.. heads=.. blocks=.. cross_rank=.. block_hidden=.. max_len=..
 * aux_weight=.. ndense=.. ncat=..", then " mv=f:sum:K,.." with multi-valued columns). Written atomically from the host arrays (call nb_sc_to_host first on CUDA). */
void nb_sc_save(const nb_sc_model *m, const char *path);
/* The multi-valued columns as text, "f:sum:K,f:mean:K" (column, pooling, max values), for
 * checkpoints ("mv=" in seqctr.config, "multi_valued" in state.json); returns 0 (and "") when
 * there are none. nb_sc_mv_parse reads it back into c->pool / c->mv_max (0: malformed). */
int nb_sc_mv_string(const nb_sc_config *c, char *buf, size_t cap);
int nb_sc_mv_parse(nb_sc_config *c, const char *s);
/* The DLRM form's top MLP widths as text, "1024,1024,512,256" ("" for seqctr), and back (0:
 * malformed; "" gives ntop 0). */
void nb_sc_top_string(const nb_sc_config *c, char *buf, size_t cap);
int nb_sc_top_parse(nb_sc_config *c, const char *s);
/* Load weights into a model of the same shape (every tensor must exist with its shape), and
 * push them to the backend. */
void nb_sc_load(nb_sc_model *m, const char *path);
/* Dense FLOPs (forward + backward, matmuls only) of one batch with total history rows nh. */
double nb_sc_flops(const nb_sc_model *m, int B, long nh);

#endif
