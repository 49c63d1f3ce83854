/* The seqctr family's private parts, shared by its files (see family/seqctr.c). */
#ifndef NB_FAMILY_SEQCTR_FAMILY_H
#define NB_FAMILY_SEQCTR_FAMILY_H

#include <stdio.h>

#include "data/balance.h"
#include "data/balance_place.h"
#include "data/ctr_source.h"
#include "model/seqctr.h"
#include "step/step.h"

/* One phase of the step (seqctr.h's nb_sc_phase; seg for the per-segment ones), a span of its
 * own, so the trace gives the step breakdown and the timeline. */
typedef struct {
    struct sc_train *t;
    nb_sc_phase phase;
    int seg;
} sc_work;

/* A part prepared ahead, with its host seconds: fill_s getting its window's samples (read_s
 * reading them, on the loader's thread or in line), prep_s its lists and then (sharded) ids_s
 * routing its ids and coll_s the collisions; of prep_s, dedup_s the lists' dedup; of ids_s,
 * wdedup_s the owner's window grouping. */
typedef struct {
    uint64_t pos;
    double fill_s, read_s, prep_s, ids_s, coll_s, dedup_s, wdedup_s;
    int nh, B, max_len; /* max_len: the part's longest history */
    double sum_pow[NB_BALANCE_FIT_NA]; /* sum over the part's samples of L^a (the cost fit) */
} sc_ahead;

/* A window of samples as read, placed over the shares (--balance) and clustered (--cluster-keys):
 * each sample's index in its global batch, where each part starts, the source position of its
 * global batch and the host seconds the read took. */
typedef struct {
    nb_ctr_batch b;
    int *idx, *part_at;
    uint64_t pos;
    double fill_s;
} sc_window;

typedef struct sc_train {
    nb_run *run;
    nb_sc_model m;
    /* ranks: this rank trains samples first .. first + Bl - 1 of each global batch; sharded: the
     * tables row-wise over the ranks (emb/emb.h) */
    int sharded, Bl, first;
    /* Frozen-Window Pipelining (--micro-batches M, the run's micro-batches): a rank's slice of the
     * global batch is a window of M parts of Bm samples (read once into a window, reordered by
     * --cluster-keys), trained one after another on one embedding state */
    int M, Bm;
    sc_window wins[2], *win; /* the windows read (two with the loader), the one being cut into parts */
    struct sc_loader *loader; /* the thread that reads the next windows (seqctr_loader.c); NULL: read in line */
    nb_ctr_cluster cluster;   /* --cluster-keys: its scratch */
    /* FreeScale: where the global batch's samples train (--balance), and --emulate-ranks N (this
     * process trains N ranks' shares one after another: the window's parts are the shares) */
    nb_balance_placer place;
    int emulate;
    FILE *samples_log;       /* NB_SAMPLES_LOG: every trained sample's (step, part, index), for tests */
    /* per part of the step: compute-lane busy seconds (its spans), samples and history rows */
    size_t span_seen;
    int part_k;
    double *part_s, *part_nh, *part_maxlen, *part_n;
    /* straggler statistics over the measured steps: (max - mean) / max of the ranks' compute, the
     * ranks' idle share of the synchronous step, the emulated step time */
    double step_shared_s; /* the step's communication and common phases (busy seconds) */
    double strag_sum, rank_bubble_sum, step_strag, step_rank_bubble, step_emul_s, step_max_s, step_mean_s;
    /* emulated: does the step's slowest share hold its longest history (no placement splits a
     * sample), and over the measured steps how often */
    int step_slow_long, nslow_long, step_slow_n, nslow_alone;
    double *emul_secs;
    double *strag_steps, *bubble_steps; /* per measured step, for the medians */
    double *rank_s;                     /* [max(world, M)]: the step's ranks' compute seconds */
    int nstrag;
    nb_balance_fit fit; /* the cost model's fit (emulated ranks): per part, samples, time, sum of L^a */
    long next_u, popped_u;     /* parts prepared, and popped, since the run started (part u = step * M + k) */
    int step_rows, step_resynced; /* the step's parts: distinct rows moved, re-synced */
    int step_ahead;               /* --emb-priority: those moved ahead (the exclusive ones) */
    nb_bucket dense_bucket;       /* the dense gradient: one bucket for the ranks' all-reduce */
    nb_ctr_source src;
    nb_ctr_batch batch;
    nb_sc_optim optim;
    nb_task_ctx ctx;   /* the compute lane's, kept for the model's calls from the host */
    int step;          /* the step whose items run (the sparse optimizer's t = step + 1) */
    /* batches prepared ahead, oldest first (the model's queue): each one's source position (of
     * its global batch's first sample), host times (samples, index lists) and history rows */
    sc_ahead ahead[NB_SC_RING];
    int nahead;
    int pipelined; /* the schedule fetches the next batch while the step trains (two batches ahead) */
    int ids_ahead; /* the next batch's ids are routed while the step trains (else at the step's start) */
    sc_work fixed[NB_SC_NPHASES], fwd[NB_SC_MAX_BLOCKS], bwd[NB_SC_MAX_BLOCKS], next[NB_SC_NPHASES];
    /* the summary's statistics, over the steps after warm-up */
    double phase_s[NB_SC_NPHASES], hist_rows, overlap_sum, t_start;
    /* host seconds: the samples, their prep (lists, then sharded: ids routed ahead, collisions),
     * and the ids routed in the step (the synchronous baseline) */
    struct { double samples, read, prep, ids, coll, ids_in_step, dedup, wdedup; } host;
    double *step_secs;
    int nsteps;
} sc_train;


static inline sc_train *T(nb_run *r) { return r->fs; }
static inline const sc_train *CT(const nb_run *r) { return r->fs; }

/* family/seqctr.c: were the checkpoint's (or this run's) tables sharded? (--emb-shard auto:
 * with several ranks) */
int nb_seqctr_shard_opts(const nb_train_opts *o, int world);

/* family/seqctr_prefetch.c: the host's side of the pipeline */
/* Prepare parts up to `upto` (exclusive), never past the run's last. */
void nb_seqctr_top_up(sc_train *t, long upto);
/* Parts prepared ahead of the one training: one, or two when the schedule fetches the next one
 * while this one trains (the host prepares the one after). */
int nb_seqctr_lookahead(const sc_train *t);
/* The next part becomes the step's. */
void nb_seqctr_pop_part(nb_run *r, sc_train *t, int step);
/* The rows the part that ran moved. */
void nb_seqctr_count_rows(sc_train *t);

/* family/seqctr_loader.c: the windows' samples, read ahead on a thread of their own */
/* The next window (read now when there is no loader); the one before it is done with. */
sc_window *nb_seqctr_next_window(sc_train *t);
/* The source position of the next window not yet cut into parts (a checkpoint's). */
uint64_t nb_seqctr_next_position(const sc_train *t);
/* The windows and --cluster-keys' scratch; free stops the loader (after the window it is reading). */
void nb_seqctr_windows_alloc(sc_train *t, const nb_sc_config *mc);
void nb_seqctr_windows_free(sc_train *t);

/* family/seqctr_stats.c: timing statistics and the end-of-run summary */
double nb_seqctr_part_busy(nb_run *r, sc_train *t);
void nb_seqctr_rank_times(nb_run *r, sc_train *t, int step);
void nb_seqctr_add_breakdown(nb_lanes *lanes, int step, double *phase_s);
void nb_seqctr_summary(nb_run *r, int steps_run);

/* family/seqctr_eval.c */
void nb_seqctr_evaluate(nb_run *r, nb_eval *ev);
void nb_seqctr_print_eval(const nb_run *r, int step, const nb_eval *ev);
/* "eval step=.. n=.. loss=.. ne=.. auc=.. base_rate=.." on stdout (what: eval, teacher, ..) */
void nb_seqctr_eval_line(const char *what, int step, const nb_eval *e);

/* family/seqctr_ckpt.c: checkpoints, resume, the model's shape in state.json */
void nb_seqctr_start(nb_run *r, const char *resume_dir);
void nb_seqctr_ckpt_tensors(nb_run *r, nb_ckpt_list *model, nb_ckpt_list *optim);
int nb_seqctr_shard_tensors(nb_run *r, nb_ckpt_list *shard);
void nb_seqctr_write_config(const nb_train_opts *o, nb_json_writer *w);
void nb_seqctr_read_config(const nb_json *j, nb_train_opts *o);

/* seqctr_predict.c: --schema's embedding width and max_len become the run's (unless given), and
 * the schema and --val-data paths absolute */
void nb_seqctr_schema_flags(nb_train_opts *o, int (*seen)(const void *, const char *), const void *ctx);

#endif
