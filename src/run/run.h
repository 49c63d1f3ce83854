/* The run: the one training loop and the state it shares with a model family and a schedule.
 *
 *   tools/cmd_train.c  options -> nb_run_init -> nb_run_train -> nb_run_free
 *   nb_run_init        backend instance, lanes, the family (model, memory plan, work items), the
 *                      schedule (its lanes and state), the weights (seed or checkpoint), the data
 *   nb_run_train       per step: family begin_step (batch, optimizer scalars on the host) ->
 *                      schedule step (work items on lanes; may return before the device is done)
 *                      -> family end_step (loss, gradient norm) -> metrics.jsonl, evaluation,
 *                      checkpoint, progress line; at the end timeline.svg, loss.svg, trace
 *
 * A family (run/tf_family.c, run/sc_family.c) adapts a model of src/model to the run: which
 * views it binds into the run's arenas, its step as a list of work items (nb_step_items), its
 * data, its evaluation, its checkpoint tensors. A schedule (src/sched) decides which lane runs
 * which work item and which marks it waits on; it never changes what an item computes. */
#ifndef NB_RUN_H
#define NB_RUN_H

#include <stdint.h>
#include <stdio.h>

#include "io/json.h"
#include "lanes/lanes.h"
#include "ops/backend.h"
#include "run/opts.h"
#include "tensor.h"

typedef struct nb_run nb_run;

/* Host work of an item, run when the item is enqueued (not on a lane): e.g. a collective on the
 * comm lane that waits for `lane` and that `lane` then waits for. */
typedef void (*nb_hook_fn)(nb_run *r, nb_lane *lane, int step, void *arg);

/* One work item of a step: a task and the span it shows as; bucket: the gradient bucket (index
 * into nb_run.buckets) the item completes, or -1; or (hook set) host work at enqueue time. */
typedef struct {
    char name[40];
    nb_span_kind kind;
    nb_task_fn fn;
    void *arg;
    int bucket;
    nb_hook_fn hook;
} nb_item;

typedef struct {
    nb_item *v;
    int n, cap;
} nb_items;

void nb_items_add(nb_items *l, const char *name, nb_span_kind kind, nb_task_fn fn, void *arg);
/* An item after which gradient bucket b holds its final values for this micro-batch. */
void nb_items_add_bucket(nb_items *l, const char *name, nb_span_kind kind, nb_task_fn fn, void *arg, int b);
/* An item whose work is host work at enqueue time (outside any graph capture: use it in pre,
 * post). */
void nb_items_add_hook(nb_items *l, const char *name, nb_hook_fn hook, void *arg);
void nb_items_free(nb_items *l);
/* Enqueue every item of l on lane, in order, tagged with step. After an item that completes a
 * gradient bucket: the micro-batch's gradient is added to the step's (micro-batches after the
 * first), and on the last micro-batch the bucket is all-reduced over the ranks on the comm lane,
 * overlapped with the rest of the backward. */
struct nb_run;
void nb_items_run(struct nb_run *r, const nb_items *l, nb_lane *lane, int step);

/* A gradient bucket: up to two ranges (elements) of the gradient slab. */
typedef struct {
    size_t off[2], n[2];
    int nr;
} nb_bucket;

/* A step as work items, in the shape every model shares: the input stage, then per segment
 * (detached blocks, ERASE) a forward and a backward (its local or final head first, then its
 * blocks in reverse), then the tail (the join of the segments' shared gradients, the input
 * stage's backward, the optimizer). Segment s's backward depends only on its own forward, so a
 * schedule may run it on any lane once fwd[s] is done, while later segments run forward. Every
 * item writes memory no concurrently runnable item touches: any such placement computes the
 * same bits. opt: the optimizer, once per step after every micro-batch (and the ranks' reduction
 * of the gradients); the schedule runs input .. tail, once per micro-batch. pre, post: items the
 * run enqueues before and after the step, outside any graph capture (work whose sizes change
 * from batch to batch: copies in, the touched embedding rows). */
/* next, resync: a family that can fetch ahead (nb_family_i.fetches_ahead) also gives the pre
 * items of the batch after the step's (for a pipelining schedule to run while the step trains),
 * and the items that bring that batch's fetched inputs up to date after the step's update. */
typedef struct {
    int nseg;
    nb_items pre, input, fwd[NB_MAX_SEGMENTS], bwd[NB_MAX_SEGMENTS], tail, opt, post;
    nb_items next, resync;
} nb_step_items;

/* A held-out evaluation: the mean loss, and for CTR models normalized entropy and AUC. */
typedef struct {
    int done;
    long n;
    double loss, ne, auc, base_rate;
} nb_eval;

/* Named host tensors of a checkpoint file (fp32). */
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

/* A model family as the run sees it. */
typedef struct nb_family_i {
    const char *name; /* "transformer", "seqctr" (state.json's "family") */
    const char *unit; /* what a step trains on, per second: "tokens" or "samples" */
    const char *loss_unit, *held_out; /* loss.svg: "nats" / "BCE"; "validation loss" / "held-out loss" */
    const char *(*model_name)(const nb_train_opts *o); /* "gpt2-mini", "seqctr" (titles) */
    /* options of this family (flags or state.json), before anything is built */
    void (*check)(nb_train_opts *o);
    /* model, memory (the schedule's plan, or the family's resident one), work items */
    void (*init)(nb_run *r);
    /* weights from o.seed, or the checkpoint in o.resume; up to the backend; data from o.data */
    void (*start)(nb_run *r, const char *resume_dir);
    void (*free)(nb_run *r);
    double (*per_step)(const nb_run *r); /* units per step */
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
    size_t (*data_pos)(const nb_run *r);
    /* the host copies of weights and optimizer state are current (checkpoints, export) */
    void (*sync_to_host)(nb_run *r);
    void (*ckpt_tensors)(nb_run *r, nb_ckpt_list *model, nb_ckpt_list *optim);
    void (*write_config)(const nb_train_opts *o, nb_json_writer *w);
    void (*read_config)(const nb_json *model, nb_train_opts *o);
    /* end-of-run lines (after the loop's own "done" and throughput lines); may be NULL */
    void (*summary)(nb_run *r, int steps_run);
    /* which captured graph serves this step (graphs of different keys may have different
     * shapes); -1: run this step eagerly */
    int (*graph_key)(nb_run *r);
    /* 1: it fills items.next and items.resync (a pipelining schedule can run it) */
    int fetches_ahead;
    /* the family talks to other ranks even at one rank (NULL: only with several) */
    int (*wants_comm)(const nb_train_opts *o);
    /* state held in shards, one per rank: adds this rank's tensors to shard (when not NULL),
     * written by every rank into the checkpoint beside rank 0's replicated ones
     * (nb_ckpt_shard_path); returns 0 when the run keeps no shards (NULL: never) */
    int (*shard_tensors)(nb_run *r, nb_ckpt_list *shard);
} nb_family_i;

extern const nb_family_i nb_family_transformer, nb_family_seqctr;
/* The family of a --model name ("seqctr", or a transformer preset). */
const nb_family_i *nb_family_of_model(const char *model);
/* The family of a state.json's "family" field ("" for checkpoints older than the field). */
const nb_family_i *nb_family_named(const char *name);

struct nb_sched_i;
typedef struct nb_series {
    double *step, *loss;
    size_t n, cap;
} nb_series; /* a loss curve, for loss.svg */
void nb_series_push(nb_series *s, double x, double y);

struct nb_comm;

struct nb_run {
    nb_train_opts o;
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
    const struct nb_sched_i *sched;
    nb_backend *backend;   /* the instance: device index and library handles */
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
    int step;          /* next step to run (0-based) */
    size_t data_pos0;  /* the data position of that step's batch (a checkpoint's data_pos) */
    int eval_only; /* eval / export / sample: no training data, no optimizer steps */
    /* the last step's results (end_step: the mean loss and this rank's sum of the per-token or
     * per-sample losses) and the learning rate it used (begin_step); its wall time and lane
     * statistics (set by the run before end_step) */
    double loss, loss_sum;
    float lr, grad_norm;
    double last_secs;
    nb_step_stats last_stats;
    struct {
        int key;
        struct nb_graph *g;
    } *graphs; /* [o.graph_cache]: the captured steps, one per graph key */
    int ngraphs, replays;
    FILE *metrics;
    int stopped_by; /* the signal (SIGINT, SIGTERM) that stopped the run, 0 if none */
    nb_series train_hist, val_hist;
    nb_eval last_eval;
};

/* The run's host lane (created at the first call): where host items of a device run go. */
/* Does this run keep state in shards (nb_family_i.shard_tensors)? */
int nb_run_sharded(nb_run *r);
/* The family's gradient buckets (the run keeps the array). */
void nb_run_set_buckets(nb_run *r, nb_bucket *buckets, int n);

/* Build everything for options o (normalized and checked); with eval_only, for evaluation,
 * export or sampling of the checkpoint in o->resume. */
void nb_run_init(nb_run *r, const nb_train_opts *o, int eval_only);
void nb_run_free(nb_run *r);
/* Train from r->step to o.steps (or o.stop_after, --time-limit); writes metrics, checkpoints. */
void nb_run_train(nb_run *r);
/* Evaluate now (waits for the schedule's work in flight first). */
void nb_run_evaluate(nb_run *r, nb_eval *ev);
/* Everything in flight is done and the host copies are current. */
void nb_run_sync_to_host(nb_run *r);
/* Run fn(arg) on the compute lane and wait for it (setup, evaluation, sampling). */
void nb_run_on_compute(nb_run *r, const char *name, nb_task_fn fn, void *arg);
/* Does n floats of backend memory hold a NaN or an infinity? (copied down in pieces) */
int nb_run_nonfinite(nb_run *r, const float *p, size_t n);
/* The run's arenas, allocated after the family and the schedule planned them: the device arena
 * is checked against --gpu-mem-limit (or the free memory) first, with hint naming what to lower. */
void nb_run_alloc_arenas(nb_run *r, const char *hint);

#endif
