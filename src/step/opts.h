/* The options of a training run, one struct for both model families: the CLI fills it
 * (tools/cmd_train.c), state.json stores it (run/ckpt.c), the run, the family and the schedule
 * read it. Each family sets its own defaults before the flags are applied (nb_train_opts_defaults),
 * so a flag left out means the same as before the families shared a parser. */
#ifndef NB_STEP_OPTS_H
#define NB_STEP_OPTS_H

#include <stdint.h>
#include <stdio.h>

#include "core.h"
#include "model/seqctr.h"
#include "model/transformer.h"

#define NB_MAX_SEGMENTS 64

typedef struct nb_train_opts {
    char family[16];   /* "transformer" or "seqctr" (from --model) */
    nb_tf_config model; /* transformer shape */
    nb_sc_config ctr;   /* seqctr shape (its seed is the run's --seed, set at init) */
    char data[NB_PATH_MAX], val_data[NB_PATH_MAX], out[NB_PATH_MAX], resume[NB_PATH_MAX], trace[NB_PATH_MAX];
    char device[32], schedule[32], precision[16];
    uint64_t gpu_mem_limit;  /* bytes; 0: what the device has free */
    uint64_t host_mem_limit; /* bytes; 0: what the host reports available */
    int batch, seq, steps, stop_after, warmup, eval_every, eval_batches, ckpt_every, log_every, threads;
    float lr, min_lr_frac, weight_decay, beta1, beta2, eps, grad_clip;
    uint64_t seed;
    int progress;     /* 1: progress line on a terminal */
    int graphs;       /* capture the training step once (CUDA graph) and replay it */
    int graph_cache;  /* --graphs: at most this many captured steps (one per step shape) */
    int kernel_table; /* cuda: print the N longest kernels per step (CUPTI) after the run; 0: off */
    int no_ckpt;      /* write no checkpoint (benchmarks) */
    float time_limit; /* seconds of training in this process, then stop with a checkpoint (0: none) */
    /* ERASE (detached segments): where new segments start, as given ("2,4": transformer layers
     * 0-1, 2-3, 4-..; seqctr blocks 0-1, 2-3, 4-..; "all": every layer / block; "" none); each
     * segment but the last gets a local head whose loss is weighted aux_weight */
    char detach[256];
    float aux_weight;
    int side_lanes;          /* --schedule erase: side lanes for the segments' backward */
    char erase_dispatch[16]; /* blocking (the main thread enqueues side work) or async */
    int ckpt_interval;       /* stream: keep every K-th layer's input, recompute the rest (0: keep all) */
    int stream_slots;        /* stream: device weight slots layers pass through (2: double buffering; -1: as many as
                                fit, up to one per layer, so the backward finds the forward's weights) */
    int pinned_slabs;        /* stream: pinned staging slabs each way (the bounded pinned pool) */
    int keep_layers;         /* stream with ckpt_interval > 0: the last N layers keep every activation
                              * (not recomputed); -1: as many as fit in GPU memory */
    int gpu_layers;          /* stream: N layers (spread evenly) keep weights, AdamW state and gradients on
                              * the device and update there; -1: as many as fit */
    /* ranks: --grad-accum K micro-batches per optimizer step on each rank (the global --batch is
     * split over ranks x micro-batches), the communicator's kind and deadline */
    int grad_accum;
    char comm[16];      /* auto, mpi, nccl, host */
    int comm_sm_free;   /* all-to-all and all-gather by copy engines (IPC / host-staged); sums stay on comm */
    float comm_timeout; /* seconds a collective may take before the job fails */
    int world;          /* ranks the run was started with (state.json: a resume needs the same) */
    /* seqctr: the embedding tables' optimizer, their rows, the held-out set, Criteo parsing */
    char emb_optim[16]; /* adagrad (row-wise) or adam (lazy sparse) */
    /* where the tables' rows live: "row" (row-wise sharded over the ranks: global row g on rank
     * g % N), "none" (every rank holds every row: one rank only), "auto" (row with several ranks) */
    char emb_shard[8];
    char emb_place[8];    /* where an owner's shard lives: gpu (the device's memory) or host (host DRAM) */
    char index_lists[8];  /* who builds a batch's index lists: auto, host or device (nb_sc_plan_opts.lists) */
    int pipe_skip_resync;
    int cluster_keys; /* seqctr --micro-batches: samples sharing hot keys go to the same micro-batch */ /* --schedule pipe, debug: leave the rows a step updates stale in the next batch */
    /* FreeScale: where a global batch's samples train (none, fbs, vbs[:alpha[:c0]]), and ranks
     * emulated on one GPU (0: none) */
    char balance[32];
    int emulate_ranks;
    int emb_priority; /* --schedule pipe: exclusive rows fetched ahead, collision rows after the update */
    float emb_lr;
    int64_t table_cap;
    int eval_samples;
    int strict;
} nb_train_opts;

/* Defaults of the family ("transformer" or "seqctr"): the shape, the data and the optimizer
 * settings each family trains with when no flag says otherwise. */
void nb_train_opts_defaults(nb_train_opts *o, const char *family);
/* The configuration as the run prints it at start. */
void nb_train_opts_print(const nb_train_opts *o, FILE *f);
/* Warm-up steps the learning-rate schedule uses (--warmup -1: 5% of the steps). */
int nb_train_warmup_steps(const nb_train_opts *o);
/* Passes per optimizer step: the emulated ranks' shares (--emulate-ranks), else --grad-accum. */
int nb_train_parts(const nb_train_opts *o);
/* Options every family shares, checked like flags (also when they come from a state.json):
 * names the option and the accepted range. */
void nb_train_opts_check(const nb_train_opts *o);
/* "--detach": the first layer/block of every segment after the first, increasing, within
 * 1..n-1 ("all": every one); returns the number of segments. unit names the pieces in errors. */
int nb_parse_detach(const char *spec, int n, const char *unit, int *first, int max_segments);

#endif
