/* nobubble train --model seqctr: its own flag table (the transformer's flags stay untouched). */
#include <stdio.h>
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

int nb_ctr_train_main(int argc, char **argv) {
    nb_ctr_opts o;
    nb_ctr_opts_defaults(&o);
    char model[32] = "seqctr";
    int quiet = 0, table_cap = (int)o.table_cap;
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
        {"aux-weight", ARG_FLOAT, &c->aux_weight, 0, "X", "weight of the other blocks' BCE heads (0: off)", 0, 0},
        {"table-cap", ARG_INT, &table_cap, 0, "N", "rows per embedding table at most (ids mod rows)", 1, 0},
        {"seed", ARG_U64, &c->seed, 0, "N", "seed of the weight init", 0, 0},
        {"eval-every", ARG_INT, &o.eval_every, 0, "N", "held-out NE/AUC every N steps (0: only at the end)", 0, 0},
        {"eval-samples", ARG_INT, &o.eval_samples, 0, "N", "held-out samples (synth, criteo)", 1, 0},
        {"strict", ARG_BOOL, &o.strict, 0, NULL, "criteo: stop at the first bad line (default: skip and count)", 0, 0},
        {"out", ARG_STR, o.out, sizeof o.out, "DIR", "run directory: metrics.jsonl, model.safetensors", 0, 0},
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
    o.table_cap = table_cap;
    if (quiet) nb_verbosity = 0;
    nb_ctr_train(&o);
    return 0;
}
