/* nobubble train / nobubble eval: one flag table for both model families. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "args.h"
#include "commands.h"
#include "comm/comm.h"
#include "core.h"
#include "family/family.h"
#include "family/transformer.h"
#include "run/ckpt.h"
#include "run/lock.h"
#include "run/run.h"
#include "run/sc.h"
#include "sched/sched.h"

enum { G_COMMON, G_RANKS, G_TF, G_SC, G_ERASE, G_STREAM };
static const char *const GROUPS[] = {
    "options (both model families)",
    "ranks and micro-batches (mpirun -np N nobubble train ...; --batch stays the global batch)",
    "transformer options (--model gpt2-* / llama-*)",
    "seqctr options (--model seqctr)",
    "detached segments (ERASE: --detach with --schedule plain or erase)",
    "--schedule stream (a transformer's state in host memory)",
    NULL,
};

/* Transformer shape flags: applied on top of the preset (or the checkpoint's shape). */
typedef struct {
    char preset[32];
    int layers, dim, heads, kv_heads, ffn, vocab, seq;
} model_flags;

static void apply_model_flags(const char *cmd, const model_flags *mf, const nb_arg *args, int nargs, nb_tf_config *cfg) {
    if (nb_args_seen(args, nargs, "model") && !nb_tf_preset(mf->preset, cfg))
        nb_usage_error(cmd, "unknown --model '%s'; presets: seqctr, %s", mf->preset, nb_tf_preset_names());
    if (nb_args_seen(args, nargs, "layers")) cfg->layers = mf->layers;
    if (nb_args_seen(args, nargs, "dim")) cfg->dim = mf->dim;
    if (nb_args_seen(args, nargs, "heads")) cfg->heads = mf->heads;
    if (nb_args_seen(args, nargs, "kv-heads")) cfg->kv_heads = mf->kv_heads;
    if (nb_args_seen(args, nargs, "ffn")) cfg->ffn = mf->ffn;
    if (nb_args_seen(args, nargs, "vocab")) cfg->vocab = mf->vocab;
    if (nb_args_seen(args, nargs, "seq")) cfg->seq = mf->seq;
    /* GPT-2 layouts have as many kv heads as heads: follow --heads unless told otherwise */
    if (cfg->arch == NB_ARCH_GPT2 && !nb_args_seen(args, nargs, "kv-heads")) cfg->kv_heads = cfg->heads;
    nb_tf_config_finalize(cfg);
}

static int file_exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0;
}

/* "--name X" / "--name=X" before the real parse (the family and the checkpoint decide the
 * defaults the flags apply on top of). */
static const char *prescan(int argc, char **argv, const char *flag) {
    size_t n = strlen(flag);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], flag) && i + 1 < argc) return argv[i + 1];
        if (!strncmp(argv[i], flag, n) && argv[i][n] == '=') return argv[i] + n + 1;
    }
    return NULL;
}

static const char *TRAIN_SUMMARY =
    "Train a model. With no flags: gpt2-mini on the State of the Union corpus (fetch it with\n"
    "'bash scripts/fetch_data.sh'), on the CPU. --model seqctr trains the CTR / sequence-recommendation\n"
    "model on --data synth[:k=v,...] (synthetic, evaluated on a fixed index range never trained on),\n"
    "criteo:PATH (the first --eval-samples samples held out; no histories) or movielens\n"
    "(data/movielens/clicks_{train,test}.tsv; also prints an item-popularity baseline).\n"
    "--resume DIR continues a run from its checkpoint up to --steps, with the options it was started\n"
    "with (flags given now override them), writing to DIR unless --out says otherwise.\n"
    "Presets: seqctr, gpt2-tiny, gpt2-mini, gpt2-proxy, gpt2, gpt2-medium, gpt2-large, gpt2-xl,\n"
    "llama-tiny, llama-1b, llama-8b, llama-14b. Defaults in [] are the transformer's; see\n"
    "'nobubble train --model seqctr --help' for seqctr's.";

/* The run directory of a resolved checkpoint directory (DIR for DIR/ckpt). */
static void run_dir_of(const char *ckpt_dir, char *out, size_t cap) {
    snprintf(out, cap, "%s", ckpt_dir);
    size_t n = strlen(out);
    if (n >= 5 && !strcmp(out + n - 5, "/ckpt")) out[n - 5] = 0;
}

/* Flags of one family given to the other: a usage error, never silently ignored. */
static void reject_foreign(const nb_arg *args, int nargs, int family_group) {
    for (int i = 0; i < nargs; i++) {
        int g = args[i].group;
        if (!args[i].seen || (g != G_TF && g != G_SC) || g == family_group) continue;
        nb_usage_error("train", "--%s applies to %s", args[i].name,
                       g == G_SC ? "--model seqctr" : "transformer models (--model gpt2-* / llama-*)");
    }
}

static int has_flag(int argc, char **argv, const char *flag) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], flag)) return 1;
    return 0;
}

/* The run directory --resume DIR means: DIR, or its parent when DIR is a run's ckpt/ folder. */
static void resume_run_dir(const char *resume, char *out, size_t cap) {
    char probe[NB_PATH_MAX + 32];
    snprintf(probe, sizeof probe, "%s/state.json", resume);
    if (file_exists(probe))
        run_dir_of(resume, out, cap);
    else
        snprintf(out, cap, "%s", resume);
}

/* One writer per run directory (run/lock.h): the one this run writes to is locked before
 * anything in it changes; the checkpoint a crash left half-swapped is recovered only under a
 * lock (ours, or one taken just for that). Returns the resolved checkpoint directory. */
static void lock_and_resolve(const char *resume, const char *out, char *ckpt_dir, size_t cap) {
    static int held = -1;
    /* rank 0 writes the run directory; the others only read the checkpoint */
    if (out && out[0] && nb_comm_rank() == 0) held = nb_dir_lock(out, 1);
    int ours_held = held >= 0;
    if (!resume) return;
    char dir[NB_PATH_MAX];
    resume_run_dir(resume, dir, sizeof dir);
    int ours = ours_held && !strcmp(dir, out), fd = ours || nb_comm_rank() ? -1 : nb_dir_try_lock(dir);
    nb_ckpt_resolve(resume, ckpt_dir, cap, ours || fd >= 0);
    nb_dir_unlock(fd);
    (void)held;
}

/* Flags given with --resume that change what the run computes: the rest of the run is no longer
 * bitwise what the first part's options would have trained (it still runs). */
static void note_changed(const nb_train_opts *was, const nb_train_opts *now) {
#define CHANGED(field, flag, fmt)                                                                                      \
    if (was->field != now->field)                                                                                      \
        fprintf(stderr, "note: --" flag " " fmt " differs from the checkpoint's " fmt ": the resumed run is no longer "  \
                        "bitwise what one straight run would train\n",                                                 \
                now->field, was->field)
    CHANGED(batch, "batch", "%d");
    CHANGED(steps, "steps", "%d");
    CHANGED(warmup, "warmup", "%d");
    CHANGED(lr, "lr", "%g");
    CHANGED(min_lr_frac, "min-lr-frac", "%g");
    CHANGED(weight_decay, "weight-decay", "%g");
    CHANGED(grad_clip, "grad-clip", "%g");
    CHANGED(emb_lr, "emb-lr", "%g");
#undef CHANGED
    const char *s[][3] = {{"data", was->data, now->data}, {"device", was->device, now->device},
                          {"precision", was->precision, now->precision}, {"detach", was->detach, now->detach}};
    for (size_t i = 0; i < sizeof s / sizeof s[0]; i++)
        if (strcmp(s[i][1], s[i][2]))
            fprintf(stderr, "note: --%s '%s' differs from the checkpoint's '%s': the resumed run is no longer bitwise what one "
                            "straight run would train\n", s[i][0], s[i][2], s[i][1]);
}

int nb_cmd_train(int argc, char **argv) {
    nb_train_opts o, was;
    const char *resume = prescan(argc, argv, "--resume"), *model = prescan(argc, argv, "--model");
    const char *out_flag = prescan(argc, argv, "--out");
    char ckpt_dir[NB_PATH_MAX] = "", out_dir[NB_PATH_MAX] = "";
    if (out_flag)
        snprintf(out_dir, sizeof out_dir, "%s", out_flag);
    else if (resume)
        resume_run_dir(resume, out_dir, sizeof out_dir);
    if (!has_flag(argc, argv, "--help") && !has_flag(argc, argv, "-h")) lock_and_resolve(resume, out_dir, ckpt_dir, sizeof ckpt_dir);
    if (resume && ckpt_dir[0]) {
        nb_ckpt_state st;
        nb_ckpt_read_state(ckpt_dir, &o, &st);
        was = o;
        if (model && nb_family_of_model(model) != nb_family_find(o.family))
            nb_usage_error("train", "--model %s: the checkpoint in %s is a %s run", model, ckpt_dir, o.family);
    } else {
        nb_train_opts_defaults(&o, nb_family_of_model(model ? model : "gpt2-mini")->name);
    }
    int seqctr = !strcmp(o.family, "seqctr");
    model_flags mf = {0};
    snprintf(mf.preset, sizeof mf.preset, "%s", seqctr ? "seqctr" : o.model.preset);
    mf.heads = seqctr ? o.ctr.heads : o.model.heads;
    int no_progress = 0, quiet = 0, table_cap = (int)o.table_cap;
    char val[NB_PATH_MAX];
    snprintf(val, sizeof val, "%s", o.val_data);
    nb_sc_config *c = &o.ctr;
    nb_arg args[] = {
        {"model", ARG_STR, mf.preset, sizeof mf.preset, "NAME", "seqctr, or a transformer preset (see above)", 0, 0, G_COMMON},
        {"data", ARG_STR, o.data, sizeof o.data, "SRC", "training data: a token shard; seqctr: synth[:k=v,...], criteo:PATH or movielens", 0, 0, G_COMMON},
        {"device", ARG_STR, o.device, sizeof o.device, "DEV", "cpu, cuda or cuda:N", 0, 0, G_COMMON},
        {"precision", ARG_STR, o.precision, sizeof o.precision, "P", "bf16 (default on cuda) or fp32 (TF32 off)", 0, 0, G_COMMON},
        {"gpu-mem-limit", ARG_U64, &o.gpu_mem_limit, 0, "BYTES", "cap the GPU memory plan (0: what is free)", 0, 0, G_COMMON},
        {"host-mem-limit", ARG_U64, &o.host_mem_limit, 0, "BYTES", "host memory the plan may use (0: what the host reports)", 0, 0, G_COMMON},
        {"schedule", ARG_STR, o.schedule, sizeof o.schedule, "NAME", "plain, erase (detached segments' backward on side lanes) or stream (state in host memory)", 0, 0, G_COMMON},
        {"steps", ARG_INT, &o.steps, 0, "N", "total optimizer steps", 1, 0, G_COMMON},
        {"stop-after", ARG_INT, &o.stop_after, 0, "N", "stop (with a checkpoint) after this step; resume later", 0, 0, G_COMMON},
        {"time-limit", ARG_FLOAT, &o.time_limit, 0, "S", "stop (with a checkpoint) once S seconds of training have passed", 0, 0, G_COMMON},
        {"batch", ARG_INT, &o.batch, 0, "B", "sequences (seqctr: samples) per step", 1, 0, G_COMMON},
        {"lr", ARG_FLOAT, &o.lr, 0, "X", "peak learning rate (seqctr: of the dense parameters)", 0, 0, G_COMMON},
        {"min-lr-frac", ARG_FLOAT, &o.min_lr_frac, 0, "X", "final lr as a fraction of --lr (cosine; 1: constant)", 0, 0, G_COMMON},
        {"warmup", ARG_INT, &o.warmup, 0, "N", "warmup steps (-1: 5% of --steps)", -1, 0, G_COMMON},
        {"weight-decay", ARG_FLOAT, &o.weight_decay, 0, "X", "AdamW decoupled weight decay (2-D weights)", 0, 0, G_COMMON},
        {"grad-clip", ARG_FLOAT, &o.grad_clip, 0, "X", "global gradient-norm clip (0: off; seqctr: the dense part)", 0, 0, G_COMMON},
        {"heads", ARG_INT, &mf.heads, 0, "N", "attention heads (seqctr: of the history encoder)", 1, 0, G_COMMON},
        {"seed", ARG_U64, &o.seed, 0, "N", "seed of the weight init", 0, 0, G_COMMON},
        {"out", ARG_STR, o.out, sizeof o.out, "DIR", "run directory: metrics.jsonl, loss.svg, ckpt/ (with --resume: its directory)", 0, 0, G_COMMON},
        {"resume", ARG_STR, o.resume, sizeof o.resume, "DIR", "continue from a run directory's checkpoint", 0, 0, G_COMMON},
        {"eval-every", ARG_INT, &o.eval_every, 0, "N", "held-out evaluation every N steps (0: only at the end)", 0, 0, G_COMMON},
        {"ckpt-every", ARG_INT, &o.ckpt_every, 0, "N", "checkpoint every N steps (always at the end)", 0, 0, G_COMMON},
        {"trace", ARG_STR, o.trace, sizeof o.trace, "FILE", "write a Chrome trace of every lane", 0, 0, G_COMMON},
        {"kernel-table", ARG_INT, &o.kernel_table, 0, "N", "cuda: after the run, the device's work per step (every kernel, memset and copy of the steps after warm-up, from CUPTI), its N longest kernels and the idle time between launches", 0, 0, G_COMMON},
        {"threads", ARG_INT, &o.threads, 0, "N", "CPU threads (0: all cores)", 0, 0, G_COMMON},
        {"log-every", ARG_INT, &o.log_every, 0, "N", "progress line every N steps when not on a terminal", 0, 0, G_COMMON},
        {"no-ckpt", ARG_BOOL, &o.no_ckpt, 0, NULL, "write no checkpoint (benchmarks; metrics.jsonl still)", 0, 0, G_COMMON},
        {"graphs", ARG_BOOL, &o.graphs, 0, NULL, "capture the step once (CUDA graph) and replay it", 0, 0, G_COMMON},
        {"graph-cache", ARG_INT, &o.graph_cache, 0, "N", "--graphs: keep at most N captured steps, one per step shape (seqctr: history-row bucket, micro-batch, ring slot); steps of later shapes run eagerly, with the same bits; each graph holds its own scratch memory", 1, 0, G_COMMON},
        {"no-progress", ARG_BOOL, &no_progress, 0, NULL, "no live progress line", 0, 0, G_COMMON},
        {"quiet", ARG_BOOL, &quiet, 0, NULL, "print only errors and the summary", 0, 0, G_COMMON},
        {"grad-accum", ARG_INT, &o.grad_accum, 0, "K", "micro-batches per optimizer step on each rank, gradients summed in order", 1, 0, G_RANKS},
        {"comm", ARG_STR, o.comm, sizeof o.comm, "KIND", "auto, mpi (CPU), nccl (a GPU per rank) or host (GPU buffers over MPI)", 0, 0, G_RANKS},
        {"comm-sm-free", ARG_BOOL, &o.comm_sm_free, 0, NULL, "all-to-all and all-gather over copy engines (CUDA IPC peer copies on one node, host-staged across nodes); reductions stay on --comm", 0, 0, G_RANKS},
        {"comm-timeout", ARG_FLOAT, &o.comm_timeout, 0, "S", "a collective taking longer ends the job, naming the rank it waits for", 0, 0, G_RANKS},
        {"layers", ARG_INT, &mf.layers, 0, "N", "override: transformer layers", 1, 0, G_TF},
        {"dim", ARG_INT, &mf.dim, 0, "N", "override: model width", 1, 0, G_TF},
        {"kv-heads", ARG_INT, &mf.kv_heads, 0, "N", "override: key/value heads (llama)", 1, 0, G_TF},
        {"ffn", ARG_INT, &mf.ffn, 0, "N", "override: MLP hidden width", 1, 0, G_TF},
        {"vocab", ARG_INT, &mf.vocab, 0, "N", "override: vocabulary size", 2, 0, G_TF},
        {"seq", ARG_INT, &mf.seq, 0, "N", "override: context length = training sequence length", 1, 0, G_TF},
        {"val-data", ARG_STR, val, sizeof val, "SHARD", "validation shard ('none' to skip)", 0, 0, G_TF},
        {"eval-batches", ARG_INT, &o.eval_batches, 0, "N", "validation batches (0: the whole shard)", 0, 0, G_TF},
        {"emb-dim", ARG_INT, &c->E, 0, "E", "embedding width (a multiple of --heads)", 4, 0, G_SC},
        {"blocks", ARG_INT, &c->blocks, 0, "N", "dense blocks (cross + MLP) in the chain", 1, 0, G_SC},
        {"cross-rank", ARG_INT, &c->cross_rank, 0, "R", "rank of each low-rank cross", 1, 0, G_SC},
        {"block-hidden", ARG_INT, &c->block_hidden, 0, "H", "hidden width of each block's MLP", 1, 0, G_SC},
        {"hist-layers", ARG_INT, &c->hist_layers, 0, "N", "transformer layers over the history", 0, 0, G_SC},
        {"max-len", ARG_INT, &c->max_len, 0, "L", "history cap (synth: unless max_len= is in the spec)", 0, 0, G_SC},
        {"emb-lr", ARG_FLOAT, &o.emb_lr, 0, "X", "embedding learning rate (default 0.05 adagrad, 0.001 adam)", 0, 0, G_SC},
        {"emb-optim", ARG_STR, o.emb_optim, sizeof o.emb_optim, "NAME", "adagrad (row-wise) or adam (lazy sparse)", 0, 0, G_SC},
        {"pipe-skip-resync", ARG_BOOL, &o.pipe_skip_resync, 0, NULL, "debug (--schedule pipe): skip the re-sync of the rows a step updates (results then differ from sync)", 0, 0, G_SC},
        {"micro-batches", ARG_INT, &o.grad_accum, 0, "M", "Frozen-Window Pipelining: each rank's batch in M parts on one frozen embedding state, the tables updated once after the last (the same as --grad-accum)", 1, 0, G_SC},
        {"cluster-keys", ARG_BOOL, &o.cluster_keys, 0, NULL, "with --micro-batches: samples sharing hot keys go to the same part (fewer distinct rows moved)", 0, 0, G_SC},
        {"balance", ARG_STR, o.balance, sizeof o.balance, "HOW", "FreeScale: where each global batch's samples train: none (slices in data order), fbs (equal counts, lengths dealt zig-zag), vbs[:A[:C0]] (counts vary, equal sums of C0 + L^A; default 1.5:16)", 0, 0, G_SC},
        {"emb-priority", ARG_BOOL, &o.emb_priority, 0, NULL, "FreeScale, with --schedule pipe: the next batch's exclusive rows move while the step trains, its collision rows (the ones the step updates) right after the update", 0, 0, G_SC},
        {"emulate-ranks", ARG_INT, &o.emulate_ranks, 0, "N", "train N ranks' shares one after another in one process and time each: the straggler measurement on one GPU", 0, 0, G_SC},
        {"index-lists", ARG_STR, o.index_lists, sizeof o.index_lists, "WHO", "auto, host or device: who builds each batch's embedding lookup lists and their deduplication (auto: the GPU when the tables are not sharded; the same lists either way)", 0, 0, G_SC},
        {"emb-place", ARG_STR, o.emb_place, sizeof o.emb_place, "WHERE", "gpu, or host: the table rows (each owner's shard, when sharded) and their optimizer state in pinned host DRAM, which the GPU reads and updates in place", 0, 0, G_SC},
        {"emb-shard", ARG_STR, o.emb_shard, sizeof o.emb_shard, "HOW", "row: tables sharded by row over the ranks (row g on rank g % N); none; auto: row with several ranks", 0, 0, G_SC},
        {"table-cap", ARG_INT, &table_cap, 0, "N", "rows per embedding table at most (ids mod rows)", 1, 0, G_SC},
        {"eval-samples", ARG_INT, &o.eval_samples, 0, "N", "held-out samples (synth, criteo)", 1, 0, G_SC},
        {"strict", ARG_BOOL, &o.strict, 0, NULL, "criteo: stop at the first bad line (default: skip and count)", 0, 0, G_SC},
        {"detach", ARG_STR, o.detach, sizeof o.detach, "LIST", "where segments start: layer counts / block indices like 2,4, or all (each segment gets a local head)", 0, 0, G_ERASE},
        {"aux-weight", ARG_FLOAT, &o.aux_weight, 0, "X", "weight of the local heads' losses (seqctr: 0, or 1 with --detach)", 0, 0, G_ERASE},
        {"side-lanes", ARG_INT, &o.side_lanes, 0, "K", "erase: side lanes, round robin over the segments", 1, 0, G_ERASE},
        {"erase-dispatch", ARG_STR, o.erase_dispatch, sizeof o.erase_dispatch, "MODE", "erase: blocking or async (a thread per side lane)", 0, 0, G_ERASE},
        {"ckpt-interval", ARG_INT, &o.ckpt_interval, 0, "K", "keep every K-th layer's input and recompute the rest (0: keep all)", 0, 0, G_STREAM},
        {"keep-layers", ARG_INT, &o.keep_layers, 0, "N", "with --ckpt-interval: the last N layers keep all activations, no recompute (-1: as many as fit)", -1, 0, G_STREAM},
        {"stream-slots", ARG_INT, &o.stream_slots, 0, "N", "device weight slots layers stream through (1: no double buffering; -1: as many as fit, up to one per layer)", -1, 0, G_STREAM},
        {"gpu-layers", ARG_INT, &o.gpu_layers, 0, "N", "N layers (spread evenly) keep weights, AdamW state and gradients on the GPU and update there (-1: as many as fit)", -1, 0, G_STREAM},
        {"pinned-slabs", ARG_INT, &o.pinned_slabs, 0, "N", "pinned staging slabs each way, one layer each (1-4)", 0, 0, G_STREAM},
    };
    int nargs = (int)(sizeof args / sizeof args[0]);
    nb_args_set_groups(GROUPS);
    if (nb_args_parse("train", TRAIN_SUMMARY, args, nargs, argc, argv)) return 0;
    reject_foreign(args, nargs, seqctr ? G_SC : G_TF);
    if (seqctr) {
        c->heads = mf.heads;
        o.table_cap = table_cap;
        if (!nb_args_seen(args, nargs, "emb-lr") && !resume && !strcmp(o.emb_optim, "adam")) o.emb_lr = 1e-3f;
        if (o.detach[0] && !nb_args_seen(args, nargs, "aux-weight") && !resume) o.aux_weight = 1.0f;
    } else {
        apply_model_flags("train", &mf, args, nargs, &o.model);
        o.seq = o.model.seq;
        snprintf(o.val_data, sizeof o.val_data, "%s", strcmp(val, "none") ? val : "");
    }
    o.progress = !no_progress;
    if (quiet || nb_comm_rank() > 0) nb_verbosity = 0; /* rank 0 speaks for the job */
    if (resume) {
        snprintf(o.resume, sizeof o.resume, "%s", ckpt_dir);
        /* a resumed run keeps its work where it was: the run directory it came from */
        if (!nb_args_seen(args, nargs, "out")) snprintf(o.out, sizeof o.out, "%s", out_dir);
        note_changed(&was, &o);
    }
    if (!seqctr) {
        static const char *fetch_hint = "run 'bash scripts/fetch_data.sh' to fetch and tokenize the default corpus, or pass --data SHARD";
        /* a file missing on one rank is the same clear error on every rank */
        nb_comm_check_all(file_exists(o.data), fetch_hint, "training data '%s' not found", o.data);
        if (o.val_data[0] && !nb_args_seen(args, nargs, "val-data") && !file_exists(o.val_data)) {
            fprintf(stderr, "note: no validation shard at %s; training without validation\n", o.val_data);
            o.val_data[0] = 0;
        }
        NB_CHECK(!o.val_data[0] || file_exists(o.val_data), "pass an existing --val-data SHARD, or --val-data none",
                 "validation data '%s' not found", o.val_data);
    }
    if (nb_verbosity > 0) nb_train_opts_print(&o, stderr);
    static nb_run r; /* large; the work items point into it */
    nb_run_init(&r, &o, 0);
    if (nb_verbosity > 0 && r.step > 0) fprintf(stderr, "resumed     at step %d\n", r.step);
    nb_run_train(&r);
    int sig = r.stopped_by;
    nb_run_free(&r);
    return sig ? 128 + sig : 0; /* 130 after SIGINT, 143 after SIGTERM: the shell's convention */
}

/* Options of a checkpoint's run, ready for a forward-only run with batch B on device. */
void nb_opts_from_ckpt(const char *dir, int batch, int threads, const char *device, nb_train_opts *o, char *resolved,
                       size_t cap) {
    nb_ckpt_resolve(dir, resolved, cap, 0);
    nb_ckpt_state st;
    nb_ckpt_read_state(resolved, o, &st);
    snprintf(o->resume, sizeof o->resume, "%s", resolved);
    o->out[0] = o->trace[0] = 0;
    if (batch > 0) o->batch = batch;
    o->threads = threads;
    snprintf(o->device, sizeof o->device, "%s", device);
    o->precision[0] = 0;
    o->seq = o->model.seq;
    o->graphs = 0;
    /* forward only: no segments, no side lanes, no streaming */
    o->detach[0] = 0;
    o->ckpt_interval = o->keep_layers = o->gpu_layers = 0;
    snprintf(o->schedule, sizeof o->schedule, "plain");
}

static const char *EVAL_SUMMARY =
    "Held-out evaluation of a checkpoint. Transformers: the mean cross-entropy (nats per token) on a\n"
    "token shard (--data; default: the run's validation shard). seqctr: NE and AUC on the held-out set\n"
    "of --data (default: the run's data source, so the result is the run's own last evaluation).";

int nb_cmd_eval(int argc, char **argv) {
    char ckpt[NB_PATH_MAX] = "", data[NB_PATH_MAX] = "";
    int batch = 0, batches = 0, threads = 0;
    char device[32] = "cpu";
    nb_arg args[] = {
        {"device", ARG_STR, device, sizeof device, "DEV", "cpu, cuda or cuda:N", 0, 0, 0},
        {"ckpt", ARG_STR, ckpt, sizeof ckpt, "DIR", "run directory (or its ckpt/) to evaluate", 0, 0, 0},
        {"data", ARG_STR, data, sizeof data, "SRC", "token shard, or seqctr's data source (default: the run's)", 0, 0, 0},
        {"batch", ARG_INT, &batch, 0, "B", "sequences (samples) per forward pass (0: 4, seqctr: the run's)", 0, 0, 0},
        {"batches", ARG_INT, &batches, 0, "N", "transformer batches to evaluate (0: the whole shard)", 0, 0, 0},
        {"threads", ARG_INT, &threads, 0, "N", "CPU threads (0: all cores)", 0, 0, 0},
    };
    int nargs = (int)(sizeof args / sizeof args[0]);
    nb_args_set_groups(NULL);
    if (nb_args_parse("eval", EVAL_SUMMARY, args, nargs, argc, argv)) return 0;
    if (!ckpt[0]) nb_usage_error("eval", "--ckpt DIR is required");
    nb_train_opts o;
    char resolved[NB_PATH_MAX];
    nb_opts_from_ckpt(ckpt, batch, threads, device, &o, resolved, sizeof resolved);
    int seqctr = !strcmp(o.family, "seqctr");
    if (!seqctr && batch <= 0) o.batch = 4;
    if (data[0]) snprintf(o.data, sizeof o.data, "%s", data);
    if (!seqctr) {
        if (!data[0]) snprintf(data, sizeof data, "%s", o.val_data);
        if (!data[0]) nb_usage_error("eval", "--data SHARD is required (the run had no validation shard)");
        o.data[0] = o.val_data[0] = 0;
    }
    static nb_run r;
    nb_run_init(&r, &o, 1);
    double t0 = nb_now();
    if (seqctr) {
        nb_eval ev;
        nb_run_evaluate(&r, &ev);
        NB_CHECK(isfinite(ev.loss), "evaluate an earlier checkpoint: training had diverged by this one",
                 "the held-out loss of %s is not finite (%g): its weights do not give finite logits", resolved, ev.loss);
        printf("eval n=%ld loss=%.5f ne=%.5f auc=%.5f base_rate=%.5f data=%s checkpoint=%s step=%d (%.1f s)\n", ev.n,
               ev.loss, ev.ne, ev.auc, ev.base_rate, o.data, resolved, r.step, nb_now() - t0);
    } else {
        double loss = nb_tf_eval_shard(&r, data, batches);
        NB_CHECK(isfinite(loss), "evaluate an earlier checkpoint: training had diverged by this one",
                 "the loss of %s on %s is not finite (%g): its weights do not give finite logits", resolved, data, loss);
        printf("loss %.4f nats/token (perplexity %.2f) on %s, checkpoint %s, %.1f s\n", loss, exp(loss), data, resolved,
               nb_now() - t0);
    }
    nb_run_free(&r);
    return 0;
}
