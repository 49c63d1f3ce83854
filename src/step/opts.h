/* The options of a training run: one table (opts.c) declares each option once: its flag, type,
 * default, range, help, group, whether state.json keeps it and whether it changes what is
 * computed. The train command's parser and --help, the state.json reader and writer, the range
 * checks, the printed configuration and the notes on a resume with changed options all come
 * from that table. A family reads the groups it declares (nb_family_i.option_groups) and
 * overrides some defaults by name (nb_family_i.option_defaults); enum options are parsed once,
 * here, into the enums below. */
#ifndef NB_STEP_OPTS_H
#define NB_STEP_OPTS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "comm/comm.h"
#include "core.h"
#include "io/json.h"
#include "model/seqctr.h"
#include "model/transformer.h"
#include "model/transformer_hf.h"

#define NB_MAX_SEGMENTS 64

typedef enum { NB_PREC_DEFAULT = 0, NB_PREC_BF16, NB_PREC_FP32 } nb_opt_precision;
typedef enum { NB_ERASE_BLOCKING = 0, NB_ERASE_ASYNC } nb_opt_erase_dispatch;
typedef enum { NB_EMB_OPT_ADAGRAD = 0, NB_EMB_OPT_ADAM, NB_EMB_OPT_ADAGRAD_EXACT } nb_opt_emb_optim;
typedef enum { NB_DENSE_OPT_ADAMW = 0, NB_DENSE_OPT_ADAGRAD } nb_opt_dense_optim;
typedef enum { NB_SHARD_AUTO = 0, NB_SHARD_ROW, NB_SHARD_NONE } nb_opt_emb_shard;
typedef enum { NB_PLACE_GPU = 0, NB_PLACE_HOST } nb_opt_emb_place;
typedef enum { NB_LISTS_AUTO = 0, NB_LISTS_HOST, NB_LISTS_DEVICE } nb_opt_index_lists;

typedef struct nb_train_opts {
    char family[16];   /* the family's registry name (from --model, or the checkpoint's) */
    char model_name[32]; /* --model as given: the family, and a transformer's preset */
    nb_tf_config model; /* transformer shape */
    nb_sc_config ctr;   /* seqctr shape (its seed is the run's --seed, set at init) */
    char data[NB_PATH_MAX], val_data[NB_PATH_MAX], out[NB_PATH_MAX], resume[NB_PATH_MAX], trace[NB_PATH_MAX];
    /* a Hugging Face model directory the run starts from (model/transformer_hf.h): its config
     * sets the shape, its weights the start; not kept in state.json (a resume has both) */
    char init_from[NB_PATH_MAX];
    /* what an export needs of an imported model: its origin (state.json's model.hf), HF_DIR
     * (absolute; generation_config.json is copied from it) and the Hugging Face tokenizer folder
     * the run's data was made with (absolute; sample decodes with it, export copies its files) */
    nb_hf_origin hf;
    char init_source[NB_PATH_MAX], tokenizer[NB_PATH_MAX];
    /* LoRA: rank (0: off), alpha (scale alpha / rank), targets ("q,k,v,o"), dropout (0 only) */
    int lora_r;
    float lora_alpha, lora_dropout;
    char lora_targets[64];
    uint64_t lora_base_crc;
    char device[32], schedule[32];
    nb_opt_precision precision;
    nb_attn_mode attn; /* which bf16 attention a CUDA run uses (not kept: a speed choice of this process) */
    uint64_t gpu_mem_limit;  /* bytes; 0: what the device has free */
    uint64_t host_mem_limit; /* bytes; 0: what the host reports available */
    int batch, seq, steps, stop_after, warmup, eval_every, eval_batches, ckpt_every, log_every, threads;
    float lr, min_lr_frac, weight_decay, beta1, beta2, eps, grad_clip;
    uint64_t seed;
    int no_progress;  /* no live progress line on a terminal */
    int quiet;        /* print only errors and the summary */
    int fresh;        /* start over in a run directory that holds a checkpoint (else: resume it) */
    int graphs;       /* capture the training step once (CUDA graph) and replay it */
    int graph_cache;  /* --graphs: at most this many captured steps (one per step shape) */
    int kernel_table; /* cuda: print the N longest kernels per step (CUPTI) after the run; 0: off */
    int no_ckpt;      /* write no checkpoint (benchmarks) */
    int ckpt_weights_only; /* checkpoints leave optim.safetensors out (eval, export; no resume) */
    float ckpt_minutes; /* a checkpoint at least every this many minutes of training (0: none) */
    float time_limit; /* seconds of training in this process, then stop with a checkpoint (0: none) */
    /* ERASE (detached segments): where new segments start, as given ("2,4": transformer layers
     * 0-1, 2-3, 4-..; seqctr blocks 0-1, 2-3, 4-..; "all": every layer / block; "" none); each
     * segment but the last gets a local head whose loss is weighted aux_weight */
    char detach[256];
    float aux_weight;
    int side_lanes;          /* --schedule erase: side lanes for the segments' backward */
    nb_opt_erase_dispatch erase_dispatch; /* the main thread enqueues side work, or a thread per side lane */
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
    int micro_batches; /* seqctr: Frozen-Window Pipelining's parts per step (NestPipe's FWP) */
    nb_comm_kind comm;
    int comm_sm_free;   /* all-to-all and all-gather by copy engines (IPC / host-staged); sums stay on comm */
    float comm_timeout; /* seconds a collective may take before the job fails */
    int world;          /* ranks the run was started with (state.json: a resume needs the same) */
    /* seqctr: the embedding tables' optimizer, their rows, the held-out set, Criteo parsing */
    nb_opt_emb_optim emb_optim; /* row-wise Adagrad or lazy sparse Adam */
    nb_opt_dense_optim dense_optim; /* seqctr's dense slab: AdamW, or Adagrad (dlrm-dcnv2's) */
    char top_mlp[64];               /* dlrm-dcnv2: the top MLP's hidden widths ("" = the preset's) */
    /* where the tables' rows live: row-wise sharded over the ranks (global row g on rank g % N),
     * none (every rank holds every row: one rank only), auto (row with several ranks) */
    nb_opt_emb_shard emb_shard;
    nb_opt_emb_place emb_place;       /* where an owner's shard lives: the device's memory or host DRAM */
    nb_opt_index_lists index_lists;   /* who builds a batch's index lists (nb_sc_plan_opts.lists) */
    int pipe_skip_resync; /* --schedule pipe, debug: leave the rows a step updates stale in the next batch */
    int cluster_keys;     /* seqctr --micro-batches: samples sharing hot keys go to the same micro-batch */
    /* FreeScale: where a global batch's samples train (none, fbs, vbs[:alpha[:c0]]), and ranks
     * emulated on one GPU (0: none) */
    char balance[32];
    int emulate_ranks;
    int emb_priority; /* --schedule pipe: exclusive rows fetched ahead, collision rows after the update */
    float emb_lr;
    int64_t table_cap;
    int eval_samples;
    int strict;
    char schema[NB_PATH_MAX]; /* seqctr csv: the schema file (absolute once a run starts) or a built-in name */
    int unlabeled;            /* not an option: predict's data may lack the label column */
} nb_train_opts;

/* ---------------------------------------------------------------- the options table */

/* --help sections (and which family reads which: nb_family_i.option_groups, a mask of 1 << g) */
typedef enum { NB_OPTG_COMMON, NB_OPTG_RANKS, NB_OPTG_TF, NB_OPTG_SC, NB_OPTG_ERASE, NB_OPTG_STREAM, NB_OPTG_COUNT } nb_opt_group;
typedef struct {
    const char *title;      /* the --help heading */
    const char *applies_to; /* the error for a flag of a group the family does not read */
} nb_opt_group_info;
extern const nb_opt_group_info nb_opt_groups[NB_OPTG_COUNT];

typedef enum { NB_OPT_INT, NB_OPT_I64, NB_OPT_U64, NB_OPT_FLOAT, NB_OPT_STR, NB_OPT_BOOL, NB_OPT_ENUM } nb_opt_type;

typedef struct {
    const char *name;         /* the flag (--name); state.json's key is the name with '_' for '-' */
    nb_opt_type type;
    size_t offset, size;      /* the field in nb_train_opts */
    nb_opt_group group;
    const char *dflt;         /* the default, as a flag would spell it (NULL: zero, empty) */
    const char *meta, *help;  /* --help: placeholder and text */
    double lo, hi;            /* numbers: the accepted range, [lo, hi] */
    const char *range;        /* that range in words, for the error ("at least 1") */
    const char *const *names; /* enums: the names of the values 0, 1, ..; NULL-terminated */
    int flag;                 /* 1: a flag of nobubble train; 0: state.json only */
    int state;                /* state.json's train section: 0 no, 1 required, 2 optional (older ones lack it) */
    int math;                 /* it changes what a step computes (a resume that changes it says so) */
} nb_opt;

/* The table, in state.json's order for the options it keeps; n rows. */
const nb_opt *nb_opts_table(int *n);
/* The flag's row for a family that reads the groups in the mask (several rows may share a name:
 * --heads is the transformer's and seqctr's), or NULL. */
const nb_opt *nb_opt_find(const char *name, unsigned groups);
/* A value as a flag gives it, into the row's field of o: 0 when it does not parse or is out
 * of the row's enum names, with why (one line) in err. */
int nb_opt_set(const nb_opt *opt, nb_train_opts *o, const char *value, char *err, size_t cap);
/* The row's value in o, spelled as a flag would give it. */
void nb_opt_format(const nb_opt *opt, const nb_train_opts *o, char *buf, size_t cap);
/* --precision as the backend takes it ("" for the device's default, "bf16", "fp32") */
const char *nb_precision_name(nb_opt_precision p);
/* "a, b or c": an enum row's names, for hints */
const char *nb_opt_names(const nb_opt *opt, char *buf, size_t cap);

struct nb_family_i;
/* Every option's default, then the family's own (nb_family_i.option_defaults, nb_family_i.defaults). */
void nb_train_opts_defaults(nb_train_opts *o, const struct nb_family_i *fam);
/* state.json's "train" section from the table's kept options, and back (path names the file in
 * errors); what it reads is checked like flags (nb_train_opts_check). */
void nb_train_opts_write_json(nb_json_writer *w, const nb_train_opts *o);
void nb_train_opts_read_json(const char *path, const nb_json *train, nb_train_opts *o);
/* The configuration as the run prints it at start: the options of the groups the family reads
 * that are not at the table's default, "--name value" as flags spell them. */
void nb_train_opts_print(const nb_train_opts *o, unsigned groups, FILE *f);
/* A note on stderr for each option that changes what is computed and differs between was (a
 * checkpoint's) and now: the resumed run is no longer bitwise one straight run. */
void nb_train_opts_note_changes(const nb_train_opts *was, const nb_train_opts *now);

/* Warm-up steps the learning-rate schedule uses (--warmup -1: 5% of the steps). */
int nb_train_warmup_steps(const nb_train_opts *o);
/* Passes per optimizer step: the emulated ranks' shares (--emulate-ranks), else --grad-accum. */
int nb_train_parts(const nb_train_opts *o);
/* Every option's range (the table's), and the checks between options every family shares, as
 * flags are checked (also when they come from a state.json): names the option and the range. */
void nb_train_opts_check(const nb_train_opts *o, unsigned groups);
/* "--detach": the first layer/block of every segment after the first, increasing, within
 * 1..n-1 ("all": every one); returns the number of segments. unit names the pieces in errors. */
int nb_parse_detach(const char *spec, int n, const char *unit, int *first, int max_segments);

#endif
