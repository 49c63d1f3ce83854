/* Training and held-out evaluation of the seqctr model on the CPU or a GPU
 * (`nobubble train --model seqctr [--device cuda]`).
 *
 * Data (--data):
 *   synth[:k=v,...]  nb_synth; training reads samples 0, B, 2B, ... in order; evaluation reads the
 *                    fixed range [2^40, 2^40 + eval_samples), never trained on. The model's
 *                    max_len is the generator's (max_len= in the spec, else --max-len).
 *                    Table rows: min(cardinality, --table-cap); items: min(items, --table-cap).
 *   criteo:PATH      Kaggle TSV or nb_criteo binary; the FIRST eval_samples good samples are held
 *                    out (kept in memory) and training streams the rest, rewinding at the end.
 *                    No sequence part: every history is empty and the target item is 0 (so the
 *                    item table has one row and pooled = 0); table rows = --table-cap.
 *   movielens        data/movielens/clicks_train.tsv (training, reshuffled every epoch by a fixed
 *                    seed) and clicks_test.tsv (evaluation, all of it); header checked verbatim.
 *                    Categorical tables 0..5 = user, item, year, genre, hour, weekday (rows =
 *                    largest id in either file + 1, capped by --table-cap, id mod rows); tables
 *                    6..25 have one row and always see id 0 (a learned constant: the model's
 *                    shape stays the 26-table one). No dense features: all 13 are 0 (the bottom
 *                    MLP gives a learned constant). target = movieId; history = the listed
 *                    movieIds (the most recent max_len).
 * Optimizers: AdamW on the dense slab (weight decay on 2-D tensors), constant lr; embedding rows
 * touched by the batch: row-wise Adagrad (default) or lazy sparse Adam (--emb-optim adam).
 * Metrics: metrics.jsonl in --out, one line per step: step, loss, samples_per_s, ms, bubble_pct,
 * plus eval_loss, eval_ne, eval_auc on evaluation steps. NE = mean BCE / H(p) with p the
 * evaluation set's positive rate; AUC exact (ties get the average rank). */
#ifndef NB_CTR_TRAINER_H
#define NB_CTR_TRAINER_H

#include <stdint.h>

#include "model/seqctr.h"
#include "sched/trainer.h"

typedef struct {
    nb_sc_config model;
    char data[NB_PATH_MAX], out[NB_PATH_MAX], emb_optim[16];
    char device[32], precision[16]; /* backend.h's nb_backend_for: "cpu" / "cuda[:N]", "" / "bf16" / "fp32" */
    char schedule[16];       /* plain or erase */
    char erase_dispatch[16]; /* blocking (the main thread enqueues side work) or async (a thread per side lane) */
    char trace[NB_PATH_MAX]; /* Chrome trace of the last step ("" off) */
    int side_lanes;          /* erase: side lanes for the segments' backward (round robin) */
    int no_ckpt;             /* write no model.safetensors (benchmarks) */
    int steps, batch, eval_every, eval_samples, threads, log_every;
    int strict; /* criteo: the first bad line is fatal */
    float lr, emb_lr, weight_decay;
    int64_t table_cap;
} nb_ctr_opts;

void nb_ctr_opts_defaults(nb_ctr_opts *o);

typedef struct {
    long n;
    double loss, ne, auc, base_rate;
} nb_ctr_eval;

/* Exact ROC AUC of scores against 0/1 labels (ties: average rank); NAN when one class is absent.
 * Deterministic: sorted by (score, index). */
double nb_ctr_auc(const float *score, const float *label, long n);
/* Normalized entropy: mean BCE / -(p log p + (1-p) log(1-p)); NAN when p is 0 or 1. */
double nb_ctr_ne(double mean_bce, double p);

/* Train o->steps steps, evaluate every o->eval_every steps (0: only at the end) and at the end.
 * Prints "eval ..." lines on stdout; returns the final evaluation. */
nb_ctr_eval nb_ctr_train(const nb_ctr_opts *o);

#endif
