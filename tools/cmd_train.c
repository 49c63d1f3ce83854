/* nobubble train / nobubble eval */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "args.h"
#include "commands.h"
#include "core.h"
#include "sched/checkpoint.h"
#include "sched/trainer.h"

/* Model-shape flags shared by the commands that build a model. */
typedef struct {
    char preset[32];
    int layers, dim, heads, kv_heads, ffn, vocab, seq;
} model_flags;

#define MODEL_ARGS(mf)                                                                             \
    {"model", ARG_STR, (mf).preset, sizeof (mf).preset, "NAME", "model preset (see below)", 0, 0}, \
    {"layers", ARG_INT, &(mf).layers, 0, "N", "override: transformer layers", 1, 0},               \
    {"dim", ARG_INT, &(mf).dim, 0, "N", "override: model width", 1, 0},                            \
    {"heads", ARG_INT, &(mf).heads, 0, "N", "override: attention heads", 1, 0},                    \
    {"kv-heads", ARG_INT, &(mf).kv_heads, 0, "N", "override: key/value heads (llama)", 1, 0},      \
    {"ffn", ARG_INT, &(mf).ffn, 0, "N", "override: MLP hidden width", 1, 0},                       \
    {"vocab", ARG_INT, &(mf).vocab, 0, "N", "override: vocabulary size", 2, 0},                    \
    {"seq", ARG_INT, &(mf).seq, 0, "N", "override: context length = training sequence length", 1, 0}

static void apply_model_flags(const char *cmd, const model_flags *mf, const nb_arg *args, int nargs,
                              nb_tf_config *cfg) {
    if (nb_args_seen(args, nargs, "model") && !nb_tf_preset(mf->preset, cfg))
        nb_usage_error(cmd, "unknown --model '%s'; presets: %s", mf->preset, nb_tf_preset_names());
#define OVR(flag, field)                                                                           \
    if (nb_args_seen(args, nargs, flag)) cfg->field = mf->field
    OVR("layers", layers);
    OVR("dim", dim);
    OVR("heads", heads);
    OVR("kv-heads", kv_heads);
    OVR("ffn", ffn);
    OVR("vocab", vocab);
    OVR("seq", seq);
#undef OVR
    /* GPT-2 layouts have as many kv heads as heads: follow --heads unless told otherwise */
    if (cfg->arch == NB_ARCH_GPT2 && !nb_args_seen(args, nargs, "kv-heads")) cfg->kv_heads = cfg->heads;
    nb_tf_config_finalize(cfg);
}

static int file_exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0;
}

/* Find "--resume X" / "--resume=X" before the real parse: a resumed run starts from the
 * checkpoint's options, and the flags given now apply on top of them. */
static const char *prescan_resume(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--resume") && i + 1 < argc) return argv[i + 1];
        if (!strncmp(argv[i], "--resume=", 9)) return argv[i] + 9;
    }
    return NULL;
}

static const char *TRAIN_SUMMARY =
    "Train a transformer. With no flags: gpt2-mini on the State of the Union corpus (fetch it with\n"
    "'bash scripts/fetch_data.sh'), on the CPU. --resume DIR continues a run from its checkpoint up\n"
    "to --steps, with the options it was started with (flags given now override them).\n"
    "Presets: gpt2-tiny, gpt2-mini, gpt2-proxy, gpt2, gpt2-medium, gpt2-large, gpt2-xl, llama-tiny,\n"
    "llama-1b, llama-8b, llama-14b.";

int nb_ctr_train_main(int argc, char **argv); /* tools/cmd_train_ctr.c */

/* --model seqctr has its own flag table and trainer. */
static int wants_seqctr(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc) return !strcmp(argv[i + 1], "seqctr");
        if (!strncmp(argv[i], "--model=", 8)) return !strcmp(argv[i] + 8, "seqctr");
    }
    return 0;
}

int nb_cmd_train(int argc, char **argv) {
    if (wants_seqctr(argc, argv)) return nb_ctr_train_main(argc, argv);
    nb_train_opts o;
    nb_train_opts_defaults(&o);
    const char *resume = prescan_resume(argc, argv);
    char ckpt_dir[NB_PATH_MAX];
    if (resume) {
        nb_ckpt_resolve(resume, ckpt_dir, sizeof ckpt_dir);
        nb_ckpt_state st;
        nb_ckpt_read_state(ckpt_dir, &o, &st);
    }
    model_flags mf = {0};
    snprintf(mf.preset, sizeof mf.preset, "%s", o.model.preset);
    int no_progress = 0, quiet = 0;
    char val[NB_PATH_MAX];
    snprintf(val, sizeof val, "%s", o.val_data);
    nb_arg args[] = {
        MODEL_ARGS(mf),
        {"data", ARG_STR, o.data, sizeof o.data, "SHARD", "training token shard", 0, 0},
        {"val-data", ARG_STR, val, sizeof val, "SHARD", "validation shard ('none' to skip)", 0, 0},
        {"device", ARG_STR, o.device, sizeof o.device, "DEV", "cpu, cuda or cuda:N", 0, 0},
        {"precision", ARG_STR, o.precision, sizeof o.precision, "P", "bf16 (default on cuda) or fp32 (TF32 off)", 0, 0},
        {"gpu-mem-limit", ARG_U64, &o.gpu_mem_limit, 0, "BYTES", "cap the GPU memory plan (0: what is free)", 0, 0},
        {"ckpt-interval", ARG_INT, &o.ckpt_interval, 0, "K", "stream: keep every K-th layer's input and recompute the rest (0: keep all)", 0, 0},
        {"keep-layers", ARG_INT, &o.keep_layers, 0, "N", "stream with --ckpt-interval: the last N layers keep all activations, no recompute (-1: as many as fit)", -1, 0},
        {"stream-slots", ARG_INT, &o.stream_slots, 0, "N", "stream: device weight slots layers stream through (1: no double buffering; -1: as many as fit, up to one per layer)", -1, 0},
        {"gpu-layers", ARG_INT, &o.gpu_layers, 0, "N", "stream: N layers (spread evenly) keep weights, AdamW state and gradients on the GPU and update there (-1: as many as fit)", -1, 0},
        {"pinned-slabs", ARG_INT, &o.pinned_slabs, 0, "N", "stream: pinned staging slabs each way, one layer each (1-4)", 0, 0},
        {"host-mem-limit", ARG_U64, &o.host_mem_limit, 0, "BYTES", "host memory the plan may use (0: what the host reports)", 0, 0},
        {"schedule", ARG_STR, o.schedule, sizeof o.schedule, "NAME", "plain, erase (detached segments' backward on side lanes) or stream (state in host memory)", 0, 0},
        {"detach", ARG_STR, o.detach, sizeof o.detach, "CUTS", "detach the residual stream after these layer counts, like 2,4 (local heads)", 0, 0},
        {"aux-weight", ARG_FLOAT, &o.aux_weight, 0, "X", "weight of the local heads' losses (with --detach)", 0, 0},
        {"side-lanes", ARG_INT, &o.side_lanes, 0, "K", "erase: side lanes, round robin over the segments", 1, 0},
        {"erase-dispatch", ARG_STR, o.erase_dispatch, sizeof o.erase_dispatch, "MODE", "erase: blocking or async (a thread per side lane)", 0, 0},
        {"steps", ARG_INT, &o.steps, 0, "N", "total optimizer steps", 1, 0},
        {"stop-after", ARG_INT, &o.stop_after, 0, "N", "stop (with a checkpoint) after this step; resume later", 0, 0},
        {"time-limit", ARG_FLOAT, &o.time_limit, 0, "S", "stop (with a checkpoint) once S seconds of training have passed", 0, 0},
        {"batch", ARG_INT, &o.batch, 0, "B", "sequences per step", 1, 0},
        {"lr", ARG_FLOAT, &o.lr, 0, "X", "peak learning rate", 0, 0},
        {"min-lr-frac", ARG_FLOAT, &o.min_lr_frac, 0, "X", "final lr as a fraction of --lr", 0, 0},
        {"warmup", ARG_INT, &o.warmup, 0, "N", "warmup steps (-1: 5% of --steps)", -1, 0},
        {"weight-decay", ARG_FLOAT, &o.weight_decay, 0, "X", "AdamW decoupled weight decay (2-D weights)", 0, 0},
        {"grad-clip", ARG_FLOAT, &o.grad_clip, 0, "X", "global gradient-norm clip (0: off)", 0, 0},
        {"seed", ARG_U64, &o.seed, 0, "N", "seed of the weight init", 0, 0},
        {"out", ARG_STR, o.out, sizeof o.out, "DIR", "run directory: metrics.jsonl, loss.svg, ckpt/", 0, 0},
        {"resume", ARG_STR, o.resume, sizeof o.resume, "DIR", "continue from a run directory's checkpoint", 0, 0},
        {"eval-every", ARG_INT, &o.eval_every, 0, "N", "validation loss every N steps (0: only at the end)", 0, 0},
        {"eval-batches", ARG_INT, &o.eval_batches, 0, "N", "validation batches (0: the whole shard)", 0, 0},
        {"ckpt-every", ARG_INT, &o.ckpt_every, 0, "N", "checkpoint every N steps (always at the end)", 0, 0},
        {"trace", ARG_STR, o.trace, sizeof o.trace, "FILE", "write a Chrome trace of every lane", 0, 0},
        {"threads", ARG_INT, &o.threads, 0, "N", "CPU threads (0: all cores)", 0, 0},
        {"log-every", ARG_INT, &o.log_every, 0, "N", "progress line every N steps when not on a terminal", 0, 0},
        {"no-ckpt", ARG_BOOL, &o.no_ckpt, 0, NULL, "write no checkpoint (benchmarks; metrics.jsonl still)", 0, 0},
        {"graphs", ARG_BOOL, &o.graphs, 0, NULL, "capture the step once (CUDA graph) and replay it", 0, 0},
        {"no-progress", ARG_BOOL, &no_progress, 0, NULL, "no live progress line", 0, 0},
        {"quiet", ARG_BOOL, &quiet, 0, NULL, "print only errors and the summary", 0, 0},
    };
    int nargs = (int)(sizeof args / sizeof args[0]);
    if (nb_args_parse("train", TRAIN_SUMMARY, args, nargs, argc, argv)) return 0;
    apply_model_flags("train", &mf, args, nargs, &o.model);
    o.seq = o.model.seq;
    snprintf(o.val_data, sizeof o.val_data, "%s", strcmp(val, "none") ? val : "");
    if (o.eval_every == 0 && !nb_args_seen(args, nargs, "eval-every")) o.eval_every = 0;
    o.progress = !no_progress;
    if (quiet) nb_verbosity = 0;
    if (resume) snprintf(o.resume, sizeof o.resume, "%s", ckpt_dir);

    if (o.graphs && !strcmp(o.schedule, "erase") && !strcmp(o.erase_dispatch, "async"))
        nb_usage_error("train", "--graphs captures the step once, so its dispatch is fixed: use --erase-dispatch blocking with --graphs");
    if (!strcmp(o.schedule, "erase") && !o.detach[0])
        fprintf(stderr, "note: --schedule erase without --detach: one segment, nothing to overlap\n");
    static const char *fetch_hint = "run 'bash scripts/fetch_data.sh' to fetch and tokenize the default corpus, or pass --data SHARD";
    NB_CHECK(file_exists(o.data), fetch_hint, "training data '%s' not found", o.data);
    if (o.val_data[0] && !nb_args_seen(args, nargs, "val-data") && !file_exists(o.val_data)) {
        fprintf(stderr, "note: no validation shard at %s; training without validation\n", o.val_data);
        o.val_data[0] = 0;
    }
    NB_CHECK(!o.val_data[0] || file_exists(o.val_data), "pass an existing --val-data SHARD, or --val-data none",
             "validation data '%s' not found", o.val_data);

    nb_trainer tr;
    if (!quiet) nb_train_opts_print(&o, stderr);
    nb_trainer_init(&tr, &o);
    if (!quiet) {
        fprintf(stderr, "parameters  %.2f M (%zu tensors), %.1f MFLOP per token\n", tr.model.n_real / 1e6,
                (size_t)tr.model.nparams, nb_tf_flops_per_token(&tr.model, o.seq) / 1e6);
        double rec = nb_tf_recompute_flops_per_token(&tr.model, o.seq, o.ckpt_interval, tr.keep);
        if (rec > 0)
            fprintf(stderr, "recompute   +%.3f MFLOP per token (layer forwards run twice): hardware %.3f MFLOP per token\n",
                    rec / 1e6, (nb_tf_flops_per_token(&tr.model, o.seq) + rec) / 1e6);
        if (tr.step > 0) fprintf(stderr, "resumed     at step %d\n", tr.step);
    }
    nb_trainer_run(&tr);
    nb_trainer_free(&tr);
    return 0;
}

/* Options of a checkpoint's run, ready for a forward-only trainer with batch B. */
void nb_opts_from_ckpt(const char *cmd, const char *dir, int batch, int threads, const char *device, nb_train_opts *o,
                       char *resolved, size_t cap) {
    nb_train_opts_defaults(o);
    nb_ckpt_resolve(dir, resolved, cap);
    nb_ckpt_state st;
    nb_ckpt_read_state(resolved, o, &st);
    snprintf(o->resume, sizeof o->resume, "%s", resolved);
    o->data[0] = o->val_data[0] = o->out[0] = o->trace[0] = 0;
    o->batch = batch;
    o->threads = threads;
    snprintf(o->device, sizeof o->device, "%s", device);
    o->precision[0] = 0;
    o->seq = o->model.seq;
    /* forward only: no segments, no side lanes, no streaming */
    o->detach[0] = 0;
    o->ckpt_interval = o->keep_layers = 0;
    snprintf(o->schedule, sizeof o->schedule, "plain");
    (void)cmd;
}

int nb_cmd_eval(int argc, char **argv) {
    char ckpt[NB_PATH_MAX] = "", data[NB_PATH_MAX] = "";
    int batch = 4, batches = 0, threads = 0;
    char device[32] = "cpu";
    nb_arg args[] = {
        {"device", ARG_STR, device, sizeof device, "DEV", "cpu, cuda or cuda:N", 0, 0},
        {"ckpt", ARG_STR, ckpt, sizeof ckpt, "DIR", "run directory (or its ckpt/) to evaluate", 0, 0},
        {"data", ARG_STR, data, sizeof data, "SHARD", "token shard to evaluate on", 0, 0},
        {"batch", ARG_INT, &batch, 0, "B", "sequences per forward pass", 1, 0},
        {"batches", ARG_INT, &batches, 0, "N", "batches to evaluate (0: the whole shard)", 0, 0},
        {"threads", ARG_INT, &threads, 0, "N", "CPU threads (0: all cores)", 0, 0},
    };
    int nargs = (int)(sizeof args / sizeof args[0]);
    if (nb_args_parse("eval", "Mean cross-entropy (nats per token) of a checkpoint on a token shard.", args, nargs,
                      argc, argv))
        return 0;
    if (!ckpt[0]) nb_usage_error("eval", "--ckpt DIR is required");
    if (!data[0]) nb_usage_error("eval", "--data SHARD is required");
    nb_train_opts o;
    char resolved[NB_PATH_MAX];
    nb_opts_from_ckpt("eval", ckpt, batch, threads, device, &o, resolved, sizeof resolved);
    nb_trainer tr;
    nb_trainer_init(&tr, &o);
    double t0 = nb_now();
    double loss = nb_trainer_eval_shard(&tr, data, batches);
    printf("loss %.4f nats/token (perplexity %.2f) on %s, checkpoint %s, %.1f s\n", loss, exp(loss), data, resolved,
           nb_now() - t0);
    nb_trainer_free(&tr);
    return 0;
}
