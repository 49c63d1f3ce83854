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
#include "sched/sched.h"

/* A row of the options table as a flag of this parse: the value goes through the table's setter
 * into the options being built. */
typedef struct {
    const nb_opt *row;
    nb_train_opts *o;
    nb_arg_custom custom;
    char help[640]; /* the row's help and its range ("in 1..64"), the range the value is checked against */
} flag_ctx;

static int set_flag(const void *ctx, const char *value, char *err, size_t cap) {
    const flag_ctx *f = ctx;
    return nb_opt_set(f->row, f->o, value, err, cap);
}

static void show_flag(const void *ctx, char *buf, size_t cap) {
    const flag_ctx *f = ctx;
    nb_opt_format(f->row, f->o, buf, cap);
}

/* The flags of nobubble train, one per name, from the options table: where several rows share a
 * name (--heads), the one of the family's groups. Returns the count. */
static int table_flags(nb_train_opts *o, unsigned groups, nb_arg *args, flag_ctx *ctx, int cap) {
    int nrows, n = 0;
    const nb_opt *rows = nb_opts_table(&nrows);
    for (int i = 0; i < nrows && n < cap; i++) {
        const nb_opt *row = &rows[i];
        if (!row->flag) continue;
        const nb_opt *own = nb_opt_find(row->name, groups);
        if (own ? own != row : nb_opt_find(row->name, ~0u) != row) continue;
        ctx[n] = (flag_ctx){row, o, {set_flag, show_flag, &ctx[n]}, ""};
        int is_bool = row->type == NB_OPT_BOOL, numeric = row->type <= NB_OPT_FLOAT;
        if (numeric && row->range && row->help)
            snprintf(ctx[n].help, sizeof ctx[n].help, "%s (%s)", row->help, row->range);
        else
            snprintf(ctx[n].help, sizeof ctx[n].help, "%s", row->help ? row->help : "");
        args[n] = (nb_arg){row->name, is_bool ? ARG_BOOL : ARG_CUSTOM, is_bool ? (void *)((char *)o + row->offset) : &ctx[n].custom,
                           0, row->meta, ctx[n].help, 0, 0, (int)row->group};
        n++;
    }
    return n;
}

typedef struct {
    const nb_arg *args;
    int n;
} parsed_flags;

static int flag_seen(const void *ctx, const char *name) {
    const parsed_flags *p = ctx;
    return nb_args_seen(p->args, p->n, name);
}

/* "--name X" / "--name=X" before the real parse (the family and the checkpoint decide the
 * defaults the flags apply on top of); the last one, as the parse takes it. */
static const char *prescan(int argc, char **argv, const char *flag) {
    size_t n = strlen(flag);
    const char *v = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], flag) && i + 1 < argc) v = argv[++i];
        else if (!strncmp(argv[i], flag, n) && argv[i][n] == '=') v = argv[i] + n + 1;
    }
    return v;
}

static const char *TRAIN_SUMMARY =
    "Train a model. With no flags: gpt2-mini on the State of the Union corpus (fetch it with\n"
    "'bash scripts/fetch_data.sh'), on the CPU. --model seqctr trains the CTR / sequence-recommendation\n"
    "model on --data synth[:k=v,...] (synthetic, evaluated on a fixed index range never trained on),\n"
    "criteo:PATH (the first --eval-samples samples held out; no histories) or movielens\n"
    "(data/movielens/clicks_{train,test}.tsv; also prints an item-popularity baseline).\n"
    "--resume DIR continues a run from its checkpoint up to --steps, with the options it was started\n"
    "with (flags given now override them), writing to DIR unless --out says otherwise.\n"
    "This lists the options of the family --model names (defaults in []); the other family's with\n"
    "'nobubble train --model seqctr --help' or 'nobubble train --model gpt2-mini --help'.";

/* --help's tail: the models and the schedules, from their registries */
static const char *help_epilogue(void) {
    static char text[4096];
    size_t at = (size_t)snprintf(text, sizeof text, "models:\n");
    for (const nb_family_i *const *f = nb_family_all(); *f; f++)
        at += (size_t)snprintf(text + at, sizeof text - at, "  %-12s %s\n", (*f)->name, (*f)->model_names());
    at += (size_t)snprintf(text + at, sizeof text - at, "schedules (--schedule):\n");
    for (const nb_sched_i *const *s = nb_sched_all(); *s && at < sizeof text; s++)
        at += (size_t)snprintf(text + at, sizeof text - at, "  %-12s %s\n", (*s)->name, (*s)->summary);
    return text;
}

/* The run directory of a resolved checkpoint directory (DIR for DIR/ckpt). */
static void run_dir_of(const char *ckpt_dir, char *out, size_t cap) {
    snprintf(out, cap, "%s", ckpt_dir);
    size_t n = strlen(out);
    if (n >= 5 && !strcmp(out + n - 5, "/ckpt")) out[n - 5] = 0;
}

/* Flags of a group the family does not read: a usage error, never silently ignored. */
static void reject_foreign(const nb_arg *args, int nargs, unsigned groups) {
    for (int i = 0; i < nargs; i++) {
        int g = args[i].group;
        if (!args[i].seen || (groups & (1u << g))) continue;
        nb_usage_error("train", "--%s applies to %s", args[i].name,
                       nb_opt_groups[g].applies_to ? nb_opt_groups[g].applies_to : "another model family");
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
    if (nb_file_exists(probe))
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
    /* rank 0 recovers a checkpoint a crash left half-swapped (ckpt.old) before any other rank
     * looks for it: the others would find no checkpoint while it is being renamed back */
    if (nb_comm_rank() == 0) nb_ckpt_resolve(resume, ckpt_dir, cap, ours || fd >= 0);
    if (nb_comm_size() > 1) nb_comm_barrier_host();
    if (nb_comm_rank() != 0) nb_ckpt_resolve(resume, ckpt_dir, cap, 0);
    nb_dir_unlock(fd);
    (void)held;
}

/* The family --model names; an unknown name is a usage error listing every family's models. */
static const nb_family_i *family_of(const char *model) {
    const nb_family_i *fam = nb_family_of_model(model);
    if (fam) return fam;
    char names[1024] = "";
    for (const nb_family_i *const *f = nb_family_all(); *f; f++)
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", names[0] ? ", " : "", (*f)->model_names());
    nb_usage_error("train", "unknown --model '%s'; models: %s", model, names);
}

/* The options the flags apply on top of: a checkpoint's (--resume; --model may only name its
 * family, and a preset then replaces its shape), or the family's defaults. */
static const nb_family_i *base_options(const char *model, const char *resume, const char *ckpt_dir, nb_train_opts *o,
                                       int *ckpt_step) {
    const nb_family_i *fam = model ? family_of(model) : NULL;
    if (resume && ckpt_dir[0]) {
        nb_ckpt_state st;
        nb_ckpt_read_state(ckpt_dir, o, &st);
        *ckpt_step = st.step;
        const nb_family_i *ckpt_fam = nb_family_find(o->family);
        if (fam && fam != ckpt_fam) nb_usage_error("train", "--model %s: the checkpoint in %s is a %s run", model, ckpt_dir, o->family);
        if (model && ckpt_fam->defaults) {
            snprintf(o->model_name, sizeof o->model_name, "%s", model);
            ckpt_fam->defaults(o);
        }
        return ckpt_fam;
    }
    if (!fam) fam = family_of("gpt2-mini");
    nb_train_opts_defaults(o, fam);
    if (model) {
        snprintf(o->model_name, sizeof o->model_name, "%s", model);
        if (fam->defaults) fam->defaults(o);
    }
    return fam;
}

static const char *group_titles[NB_OPTG_COUNT + 1];

/* Train's flags for another command (nobubble plan): the options of a fresh run of the family
 * --model names, flags on top; 1 when --help was printed. */
int nb_train_flags(const char *cmd, const char *summary, int argc, char **argv, nb_train_opts *o, const nb_family_i **famp) {
    const char *model = prescan(argc, argv, "--model");
    int step = 0;
    const nb_family_i *fam = base_options(model, NULL, "", o, &step);
    static nb_arg args[160];
    static flag_ctx ctx[160];
    int nargs = table_flags(o, fam->option_groups, args, ctx, 160);
    for (int g = 0; g < NB_OPTG_COUNT; g++) group_titles[g] = nb_opt_groups[g].title;
    nb_args_set_groups(group_titles, fam->option_groups);
    nb_args_set_epilogue(help_epilogue());
    if (nb_args_parse(cmd, summary, args, nargs, argc, argv)) return 1;
    reject_foreign(args, nargs, fam->option_groups);
    parsed_flags seen = {args, nargs};
    if (fam->after_flags) fam->after_flags(o, flag_seen, &seen, NB_FLAGS_PLAN);
    *famp = fam;
    return 0;
}

int nb_cmd_train(int argc, char **argv) {
    nb_train_opts o, was;
    const char *resume = prescan(argc, argv, "--resume"), *model = prescan(argc, argv, "--model");
    const char *out_flag = prescan(argc, argv, "--out");
    char ckpt_dir[NB_PATH_MAX] = "", out_dir[NB_PATH_MAX] = "";
    if (model) family_of(model);
    if (out_flag)
        snprintf(out_dir, sizeof out_dir, "%s", out_flag);
    else if (resume)
        resume_run_dir(resume, out_dir, sizeof out_dir);
    /* the same command again (a scheduler's requeue, a rerun after a crash) continues the run
     * its directory holds instead of overwriting it */
    if (!resume && out_dir[0] && !has_flag(argc, argv, "--fresh") && !has_flag(argc, argv, "--help") &&
        !has_flag(argc, argv, "-h") && nb_ckpt_exists(out_dir)) {
        resume = out_dir;
        nb_log(1, "note: %s holds a checkpoint: resuming it (pass --fresh to start over there)\n", out_dir);
    }
    if (!has_flag(argc, argv, "--help") && !has_flag(argc, argv, "-h")) lock_and_resolve(resume, out_dir, ckpt_dir, sizeof ckpt_dir);
    int ckpt_step = 0;
    const nb_family_i *fam = base_options(model, resume, ckpt_dir, &o, &ckpt_step);
    was = o;
    static nb_arg args[160];
    static flag_ctx ctx[160];
    int nargs = table_flags(&o, fam->option_groups, args, ctx, 160);
    for (int g = 0; g < NB_OPTG_COUNT; g++) group_titles[g] = nb_opt_groups[g].title;
    nb_args_set_groups(group_titles, fam->option_groups);
    nb_args_set_epilogue(help_epilogue());
    if (nb_args_parse("train", TRAIN_SUMMARY, args, nargs, argc, argv)) return 0;
    reject_foreign(args, nargs, fam->option_groups);
    parsed_flags seen = {args, nargs};
    if (fam->after_flags) fam->after_flags(&o, flag_seen, &seen, resume ? NB_FLAGS_RESUME : NB_FLAGS_NEW);
    if (!resume && o.steps == 0 && !o.init_from[0]) nb_usage_error("train", "--steps is 0: it must be at least 1 (0 only with --init-from)");
    if (o.quiet || nb_comm_rank() > 0) nb_verbosity = 0; /* rank 0 speaks for the job */
    if (resume) {
        snprintf(o.resume, sizeof o.resume, "%s", ckpt_dir);
        /* a resumed run keeps its work where it was: the run directory it came from */
        if (!nb_args_seen(args, nargs, "out")) snprintf(o.out, sizeof o.out, "%s", out_dir);
        /* a step-0 checkpoint (--init-from --steps 0) was trained with no option yet */
        if (ckpt_step > 0) nb_train_opts_note_changes(&was, &o);
    }
    if (nb_verbosity > 0) {
        fam->print_model(&o, stderr);
        nb_train_opts_print(&o, fam->option_groups, stderr);
    }
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
    o->precision = NB_PREC_DEFAULT;
    o->graphs = 0;
    /* forward only: no segments, no side lanes; streaming only for a LoRA base (a 70B base is
     * 141 GB in bf16: plain would hold it whole in fp32 on the host) */
    o->detach[0] = 0;
    int stream = o->lora_r > 0 && !strcmp(o->schedule, "stream");
    o->ckpt_interval = o->keep_layers = 0;
    o->gpu_layers = stream ? -1 : 0;
    snprintf(o->schedule, sizeof o->schedule, "%s", stream ? "stream" : "plain");
}

static const char *EVAL_SUMMARY =
    "Held-out evaluation of a checkpoint. Transformers: the mean cross-entropy (nats per token) on\n"
    "token shards (--data: a shard, a quoted glob or a comma-separated list; default: the run's\n"
    "validation data), with the run's --batch and --eval-batches unless told otherwise, so the\n"
    "defaults give the number training printed last; the line says which tokens it covers.\n"
    "seqctr: NE and AUC on all of --data, a file (criteo: a list) of the run's data kind (default:\n"
    "the run's --val-data, else the head of its --data, so the result is the run's own last evaluation).";

int nb_cmd_eval(int argc, char **argv) {
    char ckpt[NB_PATH_MAX] = "", data[NB_PATH_MAX] = "";
    int batch = 0, batches = -1, threads = 0;
    char device[32] = "cpu";
    nb_arg args[] = {
        {"device", ARG_STR, device, sizeof device, "DEV", "cpu, cuda or cuda:N", 0, 0, 0},
        {"ckpt", ARG_STR, ckpt, sizeof ckpt, "DIR", "run directory (or its ckpt/) to evaluate", 0, 0, 0},
        {"data", ARG_STR, data, sizeof data, "SRC", "token shards (a shard, glob or list; a shard's SHARD.mask limits the loss to its targets); seqctr: a file of the run's data kind, scored whole (default: the run's)", 0, 0, 0},
        {"batch", ARG_INT, &batch, 0, "B", "sequences (samples) per forward pass (0: the run's --batch)", 0, 0, 0},
        {"batches", ARG_INT, &batches, 0, "N", "transformer batches to evaluate (-1: the run's --eval-batches; 0: all the data)", 0, 0, 0},
        {"threads", ARG_INT, &threads, 0, "N", "CPU threads (0: all cores)", 0, 0, 0},
    };
    int nargs = (int)(sizeof args / sizeof args[0]);
    nb_args_set_groups(NULL, ~0u);
    if (nb_args_parse("eval", EVAL_SUMMARY, args, nargs, argc, argv)) return 0;
    if (!ckpt[0]) nb_usage_error("eval", "--ckpt DIR is required");
    if (batches < -1) nb_usage_error("eval", "--batches %d: pass N >= 1, 0 for all the data, or -1 for the run's --eval-batches", batches);
    nb_train_opts o;
    char resolved[NB_PATH_MAX];
    nb_opts_from_ckpt(ckpt, batch, threads, device, &o, resolved, sizeof resolved);
    const nb_family_i *fam = nb_family_find(o.family);
    if (batch <= 0 && fam->eval_batch) o.batch = fam->eval_batch;
    /* the run's own --eval-batches by default: the same tokens as its last evaluation */
    if (batches >= 0) o.eval_batches = batches;
    /* --data names the family's held-out data: its validation shard, or the source whose head is held out */
    const nb_opt *held = nb_opt_find(fam->held_out_option, fam->option_groups);
    char err[256];
    if (data[0] && !nb_opt_set(held, &o, data, err, sizeof err)) nb_usage_error("eval", "%s", err);
    nb_opt_format(held, &o, data, sizeof data);
    if ((!data[0] || !strcmp(data, "none")) && fam->held_out_default) /* seqctr: the head of its --data */
        nb_opt_format(nb_opt_find(fam->held_out_default, fam->option_groups), &o, data, sizeof data);
    if (!data[0]) nb_usage_error("eval", "--data is required (the run had no held-out data)");
    static nb_run r;
    nb_run_init(&r, &o, 1);
    double t0 = nb_now();
    nb_eval ev;
    nb_run_evaluate(&r, &ev);
    NB_CHECK(isfinite(ev.loss), "evaluate an earlier checkpoint: training had diverged by this one",
             "the held-out loss of %s on %s is not finite (%g): its weights do not give finite logits", resolved, data, ev.loss);
    fam->eval_line(&r, &ev, data, resolved, nb_now() - t0, stdout);
    nb_run_free(&r);
    return 0;
}
