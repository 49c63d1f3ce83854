/* The step contract: what the run, a model family and a schedule share, and nothing of how any of
 * them works inside. Everything above it points down to it (DESIGN.md "Layers"):
 *
 *   tools -> run (the loop) -> schedules (src/sched) --\
 *                          \-> families (src/family) ---> step (this folder) -> model, ops, lanes
 *
 * A family (src/family) adapts a model (src/model) to a run: it builds the model, plans and binds
 * its memory, and gives its step as work items in one shape (nb_step_items). A schedule
 * (src/sched) decides which lane runs which item and which marks it waits on; it never changes
 * what an item computes, so every schedule gives plain's bits. The run (src/run) owns the loop,
 * the run directory and the checkpoints, and calls both through the tables below.
 *
 * One step, as it flows:
 *   run: fam->begin_step (batch staged, optimizer scalars on the host)
 *     per micro-batch: fam->begin_micro -> items.pre -> sched->step (items.input, fwd[s], bwd[s],
 *                      tail on its lanes) -> items.opt (last micro-batch) -> items.post
 *   run: wait for the step's mark -> fam->end_step (loss, gradient norm) -> metrics, evaluation,
 *        checkpoint
 * Gradient buckets (nb_items_add_bucket) are summed over micro-batches and all-reduced over the
 * ranks as the backward completes them, whichever lane runs the item (nb_items_run). */
#ifndef NB_STEP_H
#define NB_STEP_H

#include <stdint.h>
#include <stdio.h>

#include "io/json.h"
#include "io/tensor_list.h"
#include "lanes/lanes.h"
#include "ops/backend.h"
#include "step/opts.h"
#include "tensor.h"

typedef struct nb_run nb_run;

/* ---------------------------------------------------------------- work items */

/* Host work of an item, run when the item is enqueued (not on a lane): e.g. a collective on the
 * comm lane that waits for `lane` and that `lane` then waits for. */
typedef void (*nb_hook_fn)(nb_run *r, nb_lane *lane, int step, void *arg);

/* One work item of a step: a task and the span it shows as; bucket: the gradient bucket (index
 * into nb_run.buckets) the item completes, or -1; layer: the layer of a layered family's layer
 * forward or backward (nb_layers_i), -1 for every other item; or (hook set) host work at
 * enqueue time. */
typedef struct {
    char name[40];
    nb_span_kind kind;
    nb_task_fn fn;
    void *arg;
    int bucket, layer;
    nb_hook_fn hook;
} nb_item;

typedef struct {
    nb_item *v;
    int n, cap;
} nb_items;

void nb_items_add(nb_items *l, const char *name, nb_span_kind kind, nb_task_fn fn, void *arg);
/* An item after which gradient bucket b holds its final values for this micro-batch. */
void nb_items_add_bucket(nb_items *l, const char *name, nb_span_kind kind, nb_task_fn fn, void *arg, int b);
/* The last item added is layer l's forward or backward (a schedule that binds layers itself,
 * like stream, runs its own version of such items). */
void nb_items_mark_layer(nb_items *l, int layer);
/* An item whose work is host work at enqueue time (outside any graph capture: use it in pre,
 * post). */
void nb_items_add_hook(nb_items *l, const char *name, nb_hook_fn hook, void *arg);
void nb_items_free(nb_items *l);
/* Enqueue every item of l on lane, in order, tagged with step. After an item that completes a
 * gradient bucket: the micro-batch's gradient is added to the step's (micro-batches after the
 * first), and on the last micro-batch the bucket is all-reduced over the ranks on the comm lane,
 * overlapped with the rest of the backward. */
void nb_items_run(nb_run *r, const nb_items *l, nb_lane *lane, int step);

/* A gradient bucket: up to two ranges (elements) of the gradient slab. */
typedef struct {
    size_t off[2], n[2];
    int nr;
} nb_bucket;

/* A step as work items, in the shape every model shares: the input stage, then per segment
 * (detached blocks, ERASE) a forward and a backward (its local or final head first, then its
 * blocks in reverse), then the tail (the join of the segments' shared gradients, the input
 * stage's backward). Segment s's backward depends only on its own forward, so a schedule may run
 * it on any lane once fwd[s] is done, while later segments run forward. Every item writes memory
 * no concurrently runnable item touches: any such placement computes the same bits. opt: the
 * optimizer, once per step after every micro-batch (and the ranks' reduction of the gradients);
 * the schedule runs input .. tail, once per micro-batch. pre, post: items the run enqueues before
 * and after the step, outside any graph capture (work whose sizes change from batch to batch:
 * copies in, the touched embedding rows).
 * next, resync: a family that can fetch ahead (nb_family_i.fetches_ahead) also gives the pre
 * items of the batch after the step's (for a pipelining schedule to run while the step trains),
 * and the items that bring that batch's fetched inputs up to date after the step's update. */
typedef struct {
    int nseg;
    nb_items pre, input, fwd[NB_MAX_SEGMENTS], bwd[NB_MAX_SEGMENTS], tail, opt, post;
    nb_items next, resync;
} nb_step_items;

/* ---------------------------------------------------------------- what a family sees of the schedule */

/* The traits of the schedule that runs (its table's, copied into the run before the family is
 * built): a family adapts what it prepares to them, never to the schedule's name. */
typedef struct {
    /* 1: the step's returned mark covers every lane's work (the run may sync all lanes after it) */
    int settles;
    /* 1: --graphs can capture its step */
    int graphs;
    /* 1: the schedule keeps the model state (weights, gradients, optimizer state) in its own
     * memory through the family's layers capability (nb_layers_i), runs the optimizer itself and
     * brings the host copies up to date in its drain (the family's opt items, upload and
     * sync_to_host are not used) */
    int keeps_state;
    /* 1: it fetches the next batch's inputs while the step trains (the family's items.next, and
     * items.resync after the step's update): the run enqueues items.pre only for the first step
     * of a process, whose batch nothing fetched ahead; the family prepares two batches ahead */
    int prefetches;
    /* 1: the family may route the next batch's ids (sharded tables) while the step trains; 0: the
     * step routes its own at its start, in line (the synchronous baseline) */
    int ids_ahead;
} nb_sched_traits;

/* ---------------------------------------------------------------- results a family gives */

/* A held-out evaluation: the mean loss, and for CTR models normalized entropy and AUC. covers
 * says what the numbers were computed on ("16 batches of 8 x 128 tokens = 16,384 tokens of
 * data/sotu/val.bin"; "" if the family does not say), for the lines that print them. */
typedef struct {
    int done;
    long n;
    double loss, ne, auc, base_rate;
    char covers[NB_PATH_MAX + 160];
} nb_eval;

/* ---------------------------------------------------------------- the binding interface */

/* A family whose model is a stack of alike layers between an input stage (group 0 of the slab)
 * and an output stage (the last group) offers this capability (nb_family_i.layers). A schedule
 * that keeps the model state itself (stream: host memory, layers streamed through device slots)
 * binds the layers and the two stages to its own memory through it; the family's items then
 * compute exactly what they compute over the family's own slabs.
 *
 * The slab: every fp32 tensor of the model (master weights, gradients and AdamW moments share the
 * layout) at spans[i].offset; layer l is the group [layer_offset[l], + layer_numel); the input
 * stage [in_off, + in_n) and the output stage [out_off, + out_n). Padding between tensors is 0. */
typedef struct {
    int layers;
    size_t total, layer_numel;
    const size_t *layer_offset; /* [layers] */
    size_t in_off, in_n, out_off, out_n;
    const nb_adamw_span *spans; /* [nspans], slab order; scalars: 0 with weight decay, 1 without */
    int nspans;
    float *params, *m, *v;            /* host fp32 master weights and AdamW moments (the family's) */
    const nb_adamw_scalars *k;        /* this step's AdamW scalars [2], host (set by begin_step) */
    size_t elem;                      /* bytes per compute-precision element */
    /* frozen (LoRA): the slab above is the frozen base (no gradient, no optimizer state: params,
     * m, v NULL); what trains is the family's own slab of trained elements (the adapters), which
     * the family keeps resident where the step runs and updates with its own optimizer items;
     * the schedule keeps and streams only the base (bind_base) */
    int frozen;
    size_t trained;
} nb_layer_slab;

/* Receives the frozen base group by group (0: the input stage, 1 + l: layer l, layers + 1: the
 * output stage), fp32, [group's elements]; called in group order, synchronously (the buffer is
 * reused after it returns). */
typedef void (*nb_base_sink_fn)(void *self, int group, const float *w);

/* Gives layer l's compute-precision weights where the backend reads them, for a forward-only pass
 * (evaluation): the slot a schedule loaded them into. */
typedef const void *(*nb_layer_fetch_fn)(void *self, nb_ctx ctx, int l);

/* Where a schedule keeps the AdamW moments (which 0: m, 1: v) when not every layer's are in the
 * host slabs (stream --gpu-layers: the device layers' stay on the GPU only): host_off gives slab
 * offset o's place in the host moment slabs (SIZE_MAX: not there); fetch and store copy n
 * elements from slab offset o out of and into their place elsewhere (checkpoints, resume). */
typedef struct {
    void *self;
    size_t (*host_off)(void *self, size_t o);
    void (*fetch)(void *self, int which, size_t o, float *dst, size_t n);
    void (*store)(void *self, int which, size_t o, const float *src, size_t n);
} nb_state_map;

typedef struct nb_layers_i {
    void (*slab)(nb_run *r, nb_layer_slab *s);
    /* Memory when the schedule keeps the state: bytes of the activations with the given recompute
     * setting (every ckpt_interval-th layer's input kept, the last keep layers kept whole; 0, 0:
     * everything kept) and of the other per-step buffers on the backend (tokens, scalars), for the
     * schedule's fitting; then the family's reservations in the run's arenas, in two parts so the
     * schedule may reserve its own host buffers between them (host master and moments; then the
     * activations and per-step buffers), and their addresses once the arenas exist. */
    size_t (*acts_bytes)(const nb_run *r, int ckpt_interval, int keep);
    size_t (*io_bytes)(const nb_run *r);
    /* the host master (every element) and moments (moment_numel elements each: the slab less what
     * the schedule keeps elsewhere, see bind_state) */
    void (*reserve_state)(nb_run *r, size_t moment_numel);
    void (*reserve_work)(nb_run *r, int ckpt_interval, int keep);
    void (*place)(nb_run *r);
    /* The input and output stages live at w (compute precision) and g (fp32 gradients), packed:
     * the input stage's elements, then the output stage's; a forward-only pass reads layer l's
     * weights through fetch. The family's own items then read and write there. */
    void (*bind)(nb_run *r, void *w, float *g, nb_layer_fetch_fn fetch, void *self);
    /* The moments' places when the schedule reserved fewer than the slab (kept by the caller;
     * checkpoints and resume go through it) */
    void (*bind_state)(nb_run *r, const nb_state_map *map);
    /* Layer l's forward, and its backward into dw (fp32, the layer's group, accumulated), with its
     * weights at w: what the family's layer items compute over their own slabs. */
    void (*forward)(nb_run *r, nb_ctx ctx, int l, const void *w);
    void (*backward)(nb_run *r, nb_ctx ctx, int l, const void *w, float *dw);
    /* A frozen slab: the family loads its base one group at a time at start (and resume) and hands
     * each to sink, which keeps it in compute precision where the schedule streams it from. dw
     * above is NULL then: the layer's trained part (the adapters) accumulates its gradient in the
     * family's own resident slab. */
    void (*bind_base)(nb_run *r, nb_base_sink_fn sink, void *self);
} nb_layers_i;

/* ---------------------------------------------------------------- a model family */

/* nb_family_i.after_flags: what the options are for */
enum { NB_FLAGS_NEW = 0, NB_FLAGS_RESUME = 1, NB_FLAGS_PLAN = 2 };

typedef struct nb_family_i {
    const char *name; /* "transformer", "seqctr" (state.json's "family") */
    const char *unit; /* what a step trains on, per second: "tokens" or "samples" */
    const char *loss_unit, *held_out; /* loss.svg: "nats" / "BCE"; "validation loss" / "held-out loss" */
    /* does --model name this family's model? (the registry asks each family in turn); the
     * models it has, for --help and errors ("seqctr"; "gpt2-tiny, gpt2-mini, ...") */
    int (*owns_model)(const char *model);
    const char *(*model_names)(void);
    const char *(*model_name)(const nb_train_opts *o); /* "gpt2-mini", "seqctr" (titles) */
    /* its options: the groups of the options table it reads (a mask of 1 << nb_opt_group), its
     * defaults where they differ from the table's ("name=value", NULL-terminated), and the
     * model's shape from o->model_name before flags override it (NULL: nothing to do) */
    unsigned option_groups;
    const char *const *option_defaults;
    void (*defaults)(nb_train_opts *o);
    /* after the flags (seen(ctx, "name"): was --name given?; how: NB_FLAGS_NEW, NB_FLAGS_RESUME (on
     * top of a checkpoint's options) or NB_FLAGS_PLAN (nobubble plan: what is only read by a run,
     * such as token shards, need not exist)): what follows from them, and the checks that need
     * the file system */
    void (*after_flags)(nb_train_opts *o, int (*seen)(const void *ctx, const char *name), const void *ctx, int how);
    /* the model line of the printed configuration */
    void (*print_model)(const nb_train_opts *o, FILE *f);
    /* options of this family (flags or state.json), before anything is built */
    void (*check)(nb_train_opts *o);
    /* the model and its work items; memory comes after: the family's own plan (plan), or the
     * schedule's through the layers capability; then bind, once the memory exists */
    void (*init)(nb_run *r);
    void (*plan)(nb_run *r); /* NULL: init planned and bound everything */
    void (*bind)(nb_run *r); /* NULL: nothing to bind after the plan */
    /* weights from o.seed, or the checkpoint in o.resume, on the host; data from o.data */
    void (*start)(nb_run *r, const char *resume_dir);
    /* the host's weights and optimizer state -> the backend (after start; NULL: start did it) */
    void (*upload)(nb_run *r);
    void (*free)(nb_run *r);
    double (*per_step)(const nb_run *r); /* units per step */
    /* what the step's loss sum over every rank is divided by for its mean (after end_step; NULL:
     * per_step; 0: the loss is 0): a transformer on masked data counts its counted targets */
    double (*loss_count)(const nb_run *r);
    /* host side before the step is enqueued: the batch is staged, the optimizer's scalars of this
     * step are written where the step reads them (r->lr) */
    void (*begin_step)(nb_run *r, int step);
    /* host work that overlaps the enqueued step (the next batch); may be NULL */
    void (*overlap)(nb_run *r, int step);
    /* the same after each micro-batch but the last, before the run waits for it (NULL: none) */
    void (*overlap_micro)(nb_run *r, int step);
    /* host side before micro-batch k's items are enqueued (k > 0 after micro-batch k-1 ended):
     * which slice of the batch and which gradient slab its items use (NULL: one micro-batch) */
    void (*begin_micro)(nb_run *r, int k);
    /* enqueue what reads the micro-batch's results on the compute lane (after the optimizer, for
     * the last one) (NULL: nothing) */
    void (*enqueue_results)(nb_run *r, int step);
    /* once the step's end mark is reached: r->loss, r->grad_norm; the batch goes back */
    void (*end_step)(nb_run *r, int step, nb_mark done);
    /* after a step whose gradient norm is not finite: the first gradient tensor with a
     * non-finite element ("the gradient of h.0.w"), or NULL if it cannot tell */
    const char *(*nonfinite_grad)(nb_run *r);
    /* held-out evaluation of the current weights (prints nothing) */
    void (*evaluate)(nb_run *r, nb_eval *ev);
    /* the family's fields of a metrics.jsonl line (besides step, loss, ms, bubble_pct,
     * overlap_pct), and of its evaluation */
    void (*metrics)(const nb_run *r, nb_json_writer *w, double secs, const nb_eval *ev);
    /* reads back a kept metrics line on resume: its loss and held-out loss (NAN if absent) */
    void (*metrics_losses)(const nb_json *line, double *loss, double *held_out);
    /* one line about an evaluation, on stdout or stderr as the family's users expect */
    void (*print_eval)(const nb_run *r, int step, const nb_eval *ev);
    /* nobubble eval: the option that names the held-out data ("val-data": a shard of its own;
     * "data": the source whose head is held out), the batch it evaluates with (0: the run's), and
     * the line that reports the result */
    const char *held_out_option;
    /* when the run has no held_out_option value (seqctr without --val-data): the option whose
     * data's head is held out, which eval then reads (NULL: none) */
    const char *held_out_default;
    int eval_batch;
    void (*eval_line)(const nb_run *r, const nb_eval *ev, const char *data, const char *ckpt, double secs, FILE *f);
    size_t (*data_pos)(const nb_run *r);
    /* the host copies of weights and optimizer state are current (checkpoints, export) */
    void (*sync_to_host)(nb_run *r);
    void (*ckpt_tensors)(nb_run *r, nb_ckpt_list *model, nb_ckpt_list *optim);
    void (*write_config)(const nb_train_opts *o, nb_json_writer *w);
    /* the model's config from state.json */
    void (*read_config)(const nb_json *model, nb_train_opts *o);
    /* end-of-run lines (after the loop's own "done" and throughput lines); may be NULL */
    void (*summary)(nb_run *r, int steps_run);
    /* which captured graph serves this step (graphs of different keys may have different
     * shapes); -1: run this step eagerly */
    int (*graph_key)(nb_run *r);
    /* 1: it fills items.next and items.resync (a pipelining schedule can run it) */
    int fetches_ahead;
    /* the family talks to other ranks even at one rank (NULL: only with several) */
    int (*wants_comm)(const nb_train_opts *o, const nb_sched_traits *t);
    /* state held in shards, one per rank: adds this rank's tensors to shard (when not NULL),
     * written by every rank into the checkpoint beside rank 0's replicated ones
     * (nb_ckpt_shard_path); returns 0 when the run keeps no shards (NULL: never) */
    int (*shard_tensors)(nb_run *r, nb_ckpt_list *shard);
    /* a stack of alike layers a schedule can bind to its own memory (NULL: not offered) */
    const nb_layers_i *layers;
} nb_family_i;

/* ---------------------------------------------------------------- the run's shared state */

struct nb_comm;
struct nb_sched_i;
struct nb_loop; /* the loop's own bookkeeping (run/run.c) */

/* The memory a run's plan holds, term by term, on each side: host (the arena, and for the stream
 * schedule the fp32 master, moments and gradients it keeps there) and the device (on the CPU
 * backend the same RAM); what `nobubble plan` prints, filled by the planner that reserves it. */
typedef struct {
    size_t weights, grads, moments, acts, slots, other;
} nb_mem_side;
typedef struct {
    nb_mem_side host, dev;
    int glayers, wslots, keep; /* the stream schedule's choices (-1 options resolved) */
    size_t params;             /* the model's elements, when the weights terms are not its fp32 master
                                * (LoRA: the frozen base in compute precision beside the adapters); 0 */
    const char *saved;         /* what the options left out of host memory, in words ("" none) */
    char saved_buf[192];
    size_t setup; /* host bytes held only while the run sets up, beside the plan (LoRA under stream:
                   * the base read one layer group at a time), freed before step 1 */
} nb_mem_plan;

struct nb_run {
    nb_train_opts o;
    /* plan only (nobubble plan): the plan is made, nothing allocated; dry_be: an emulated GPU's
     * table (the CPU backend's, device and precision of the GPU) when planning for one */
    int dry;
    nb_backend_i dry_be;
    nb_mem_plan mem;
    /* bytes a schedule allocates outside the arenas (its slots and pinned staging): planned
     * (dry) or allocated */
    size_t sched_dev_bytes, sched_pinned_bytes;
    /* ranks: this one and how many; the communicator (NULL with one rank) */
    int rank, world;
    int ckpt_world; /* ranks that wrote the checkpoint read (o.resume; eval reads any), 0: none */
    struct nb_comm *comm;
    /* micro-batches of the step (--grad-accum), the one whose items are being enqueued */
    int micro, nmicro;
    /* gradient buckets (the family's), the step's gradient sum and a micro-batch's gradient
     * (backend memory; the same slab with one micro-batch) */
    nb_bucket *buckets;
    int nbuckets;
    struct nb_bucket_work *bucket_work;
    float *grad_sum, *grad_micro;
    nb_mark reduced; /* the comm lane's mark after the step's last reduction */
    int reduced_set, capturing;
    const nb_family_i *fam;
    const struct nb_sched_i *sched; /* the run's: families read traits, never the table */
    nb_sched_traits traits;
    nb_backend *backend;    /* the instance: device index and library handles */
    const nb_backend_i *be; /* its op table */
    nb_lanes *lanes;
    nb_lane *compute;
    /* the run's memory: the family and the schedule plan into these arenas, the run allocates
     * them once (dev: device memory, the same kind of RAM as host on the CPU backend) */
    nb_arena host, pinned, dev;
    size_t dev_free0; /* device backends: free device memory before the run allocated any */
    void *fs;         /* the family's state */
    void *ss;         /* the schedule's state */
    nb_step_items items;
    int step;         /* next step to run (0-based) */
    size_t data_pos0; /* the data position of that step's batch (a checkpoint's data_pos) */
    int eval_only;    /* eval / export / sample: no training data, no optimizer steps */
    /* the last step's results (end_step: the mean loss and this rank's sum of the per-token or
     * per-sample losses) and the learning rate it used (begin_step); its wall time and lane
     * statistics (set by the run before end_step) */
    double loss, loss_sum;
    float lr, grad_norm;
    double last_secs;
    nb_step_stats last_stats;
    int stopped_by; /* the signal (SIGINT, SIGTERM) that stopped the run, 0 if none */
    struct nb_loop *loop;
};

/* Does this run keep state in shards (nb_family_i.shard_tensors)? */
int nb_run_sharded(nb_run *r);
/* The family's gradient buckets (the run keeps the array). */
void nb_run_set_buckets(nb_run *r, nb_bucket *buckets, int n);
/* Every bucket all-reduced over the ranks after the compute lane's work (a captured step cannot
 * hold the comm lane's host work, so with --graphs the reduction follows the replay instead of
 * overlapping the backward). */
void nb_run_reduce_buckets(nb_run *r);
/* Run fn(arg) on the compute lane and wait for it (setup, evaluation, sampling). */
void nb_run_on_compute(nb_run *r, const char *name, nb_task_fn fn, void *arg);
/* Does n floats of backend memory hold a NaN or an infinity? (copied down in pieces) */
int nb_run_nonfinite(nb_run *r, const float *p, size_t n);
/* The run's arenas, allocated after the family and the schedule planned them: the device arena
 * is checked against --gpu-mem-limit (or the free memory) first, with hint naming what to lower. */
void nb_run_alloc_arenas(nb_run *r, const char *hint);
/* Host bytes a run's plan takes (arenas and a schedule's pinned staging; with the CPU backend
 * its "device" memory too) and device bytes (0 on the CPU backend). nb_run_alloc_arenas refuses
 * a plan whose host bytes exceed --host-mem-limit or what the host reports available, before
 * allocating anything. */
size_t nb_run_host_bytes(const nb_run *r);
size_t nb_run_dev_bytes(const nb_run *r);

#endif
