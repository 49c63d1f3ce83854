/* nobubble train --model seqctr: its own flag table (the transformer's flags stay untouched). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "core.h"
#include "sched/ctr_trainer.h"

int nb_ctr_train_main(int argc, char **argv);

static const char *CTR_SUMMARY =
    "Train the seqctr CTR / sequence-recommendation model on the CPU or a GPU and report held-out NE\n"
    "and AUC. --data synth[:k=v,...] (synthetic, evaluated on a fixed index range never trained on),\n"
    "criteo:PATH (the first --eval-samples samples are held out; no histories) or movielens\n"
    "(data/movielens/clicks_{train,test}.tsv; also prints an item-popularity baseline).";

/* "all" (blocks 1 .. n-1) or a comma list of block indices in 1 .. n-1, as a bit mask. */
static uint64_t parse_detach(const char *s, int blocks) {
    if (!strcmp(s, "all")) return blocks >= 64 ? ~1ULL : ((1ULL << blocks) - 1) & ~1ULL;
    uint64_t mask = 0;
    for (const char *p = s; *p;) {
        char *end;
        long i = strtol(p, &end, 10);
        if (end == p || i < 1 || i >= blocks || (*end && *end != ','))
            nb_usage_error("train", "--detach '%s': give 'all' or block indices 1..%d separated by commas", s, blocks - 1);
        mask |= 1ULL << i;
        p = *end ? end + 1 : end;
    }
    return mask;
}

int nb_ctr_train_main(int argc, char **argv) {
    nb_ctr_opts o;
    nb_ctr_opts_defaults(&o);
    char model[32] = "seqctr";
    int quiet = 0, table_cap = (int)o.table_cap;
    char detach[256] = "";
    nb_sc_config *c = &o.model;
    nb_arg args[] = {
        {"model", ARG_STR, model, sizeof model, "NAME", "seqctr", 0, 0},
        {"data", ARG_STR, o.data, sizeof o.data, "SRC", "synth[:k=v,...], criteo:PATH or movielens", 0, 0},
        {"device", ARG_STR, o.device, sizeof o.device, "DEV", "cpu, cuda or cuda:N", 0, 0},
        {"precision", ARG_STR, o.precision, sizeof o.precision, "P", "bf16 or fp32 (GPU; default bf16)", 0, 0},
        {"steps", ARG_INT, &o.steps, 0, "N", "optimizer steps", 1, 0},
        {"batch", ARG_INT, &o.batch, 0, "B", "samples per step (and per evaluation forward)", 1, 0},
        {"lr", ARG_FLOAT, &o.lr, 0, "X", "AdamW learning rate of the dense parameters", 0, 0},
        {"weight-decay", ARG_FLOAT, &o.weight_decay, 0, "X", "AdamW decoupled weight decay (2-D weights)", 0, 0},
        {"emb-lr", ARG_FLOAT, &o.emb_lr, 0, "X", "embedding learning rate (default 0.05 adagrad, 0.001 adam)", 0, 0},
        {"emb-optim", ARG_STR, o.emb_optim, sizeof o.emb_optim, "NAME", "adagrad (row-wise) or adam (lazy sparse)", 0, 0},
        {"emb-dim", ARG_INT, &c->E, 0, "E", "embedding width (a multiple of 4, the heads)", 4, 0},
        {"blocks", ARG_INT, &c->blocks, 0, "N", "dense blocks (cross + MLP) in the chain", 1, 0},
        {"cross-rank", ARG_INT, &c->cross_rank, 0, "R", "rank of each low-rank cross", 1, 0},
        {"block-hidden", ARG_INT, &c->block_hidden, 0, "H", "hidden width of each block's MLP", 1, 0},
        {"hist-layers", ARG_INT, &c->hist_layers, 0, "N", "transformer layers over the history", 0, 0},
        {"max-len", ARG_INT, &c->max_len, 0, "L", "history cap (synth: unless max_len= is in the spec)", 0, 0},
        {"aux-weight", ARG_FLOAT, &c->aux_weight, 0, "X", "weight of the other blocks' BCE heads (0: off; 1 with --detach)", 0, 0},
        {"detach", ARG_STR, detach, sizeof detach, "LIST", "blocks that read a detached x_{i-1}: all, or indices like 2,4", 0, 0},
        {"schedule", ARG_STR, o.schedule, sizeof o.schedule, "NAME", "plain, or erase (segments' backward on side lanes)", 0, 0},
        {"side-lanes", ARG_INT, &o.side_lanes, 0, "K", "erase: side lanes, round robin over the segments", 1, 0},
        {"erase-dispatch", ARG_STR, o.erase_dispatch, sizeof o.erase_dispatch, "MODE", "erase: blocking (main thread enqueues) or async (a thread per side lane)", 0, 0},
        {"trace", ARG_STR, o.trace, sizeof o.trace, "FILE", "Chrome trace of the last step (one row per lane)", 0, 0},
        {"table-cap", ARG_INT, &table_cap, 0, "N", "rows per embedding table at most (ids mod rows)", 1, 0},
        {"seed", ARG_U64, &c->seed, 0, "N", "seed of the weight init", 0, 0},
        {"eval-every", ARG_INT, &o.eval_every, 0, "N", "held-out NE/AUC every N steps (0: only at the end)", 0, 0},
        {"eval-samples", ARG_INT, &o.eval_samples, 0, "N", "held-out samples (synth, criteo)", 1, 0},
        {"strict", ARG_BOOL, &o.strict, 0, NULL, "criteo: stop at the first bad line (default: skip and count)", 0, 0},
        {"out", ARG_STR, o.out, sizeof o.out, "DIR", "run directory: metrics.jsonl, model.safetensors", 0, 0},
        {"no-ckpt", ARG_BOOL, &o.no_ckpt, 0, NULL, "write no model.safetensors (benchmarks)", 0, 0},
        {"threads", ARG_INT, &o.threads, 0, "N", "CPU threads (0: all cores)", 0, 0},
        {"log-every", ARG_INT, &o.log_every, 0, "N", "progress line every N steps (0: none)", 0, 0},
        {"quiet", ARG_BOOL, &quiet, 0, NULL, "print only errors and the eval lines", 0, 0},
    };
    int nargs = (int)(sizeof args / sizeof args[0]);
    if (nb_args_parse("train", CTR_SUMMARY, args, nargs, argc, argv)) return 0;
    if (strcmp(model, "seqctr")) nb_usage_error("train", "this flag table is seqctr's; got --model '%s'", model);
    if (c->E % c->heads) nb_usage_error("train", "--emb-dim %d must be a multiple of the %d heads", c->E, c->heads);
    if (c->max_len > 65536) nb_usage_error("train", "--max-len must be at most 65536");
    if (!(c->aux_weight >= 0)) nb_usage_error("train", "--aux-weight must be >= 0");
    if (!(o.lr > 0) || !(o.emb_lr > 0)) nb_usage_error("train", "--lr and --emb-lr must be > 0");
    if (strcmp(o.emb_optim, "adagrad") && strcmp(o.emb_optim, "adam"))
        nb_usage_error("train", "unknown --emb-optim '%s'; use adagrad or adam", o.emb_optim);
    if (!strcmp(o.emb_optim, "adam") && !nb_args_seen(args, nargs, "emb-lr")) o.emb_lr = 1e-3f;
    if (strcmp(o.schedule, "plain") && strcmp(o.schedule, "erase"))
        nb_usage_error("train", "unknown --schedule '%s'; use plain or erase", o.schedule);
    if (strcmp(o.erase_dispatch, "blocking") && strcmp(o.erase_dispatch, "async"))
        nb_usage_error("train", "unknown --erase-dispatch '%s'; use blocking or async", o.erase_dispatch);
    if (o.side_lanes > NB_SC_MAX_BLOCKS) nb_usage_error("train", "--side-lanes must be at most %d", NB_SC_MAX_BLOCKS);
    if (c->blocks > NB_SC_MAX_BLOCKS) nb_usage_error("train", "--blocks must be at most %d", NB_SC_MAX_BLOCKS);
    if (detach[0]) {
        c->detach = parse_detach(detach, c->blocks);
        if (!nb_args_seen(args, nargs, "aux-weight")) c->aux_weight = 1.0f;
        if (!(c->aux_weight > 0)) nb_usage_error("train", "--detach needs --aux-weight > 0 (each detached block learns from its own head)");
    }
    if (!strcmp(o.schedule, "erase") && !c->detach)
        fprintf(stderr, "note: --schedule erase without --detach: one segment, nothing to overlap\n");
    o.table_cap = table_cap;
    if (quiet) nb_verbosity = 0;
    nb_ctr_train(&o);
    return 0;
}
