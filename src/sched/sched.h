/* Schedules: which lane runs which work item of a step, and which marks it waits on. A schedule
 * is a table in the registry (sched.c), looked up once by --schedule; nothing else compares
 * schedule names. Adding one = a file with its table + a line in the registry + a row in
 * tests/schedules_test.sh.
 *
 *   plain   the step's items in order on the compute lane: the reference (plain.c)
 *   erase   detached segments' backward on side lanes while later segments run forward (erase.c)
 *   stream  a transformer's state in host memory, layers streamed through device slots (stream.c)
 *   sparse-dist  TorchRec's TrainPipelineSparseDist for seqctr (a baseline): the next batch's ids
 *           routed while this one trains, its lookups and rows all-to-all in line (plain.c)
 *   pipe    NestPipe's dual-buffer pipelining for seqctr: the next batch's rows fetched while this
 *           one trains, the rows this step updates sent again before the next one reads them (pipe.c)
 *
 * A schedule's step may return before the device has finished it: the run waits on the mark it
 * returns, and the host may prepare the next batch meanwhile (and a pipelining schedule may
 * start the next step's input stages before that). */
#ifndef NB_SCHED_H
#define NB_SCHED_H

#include "step/step.h"

typedef struct nb_sched_i {
    const char *name;
    const char *summary; /* one line for --help */
    /* can it run this family? (NULL: any); why not, for the error */
    int (*applies)(const nb_family_i *fam, const char **why);
    /* its options, from flags or a state.json (the options of other schedules must be unset) */
    void (*check)(const nb_train_opts *o);
    /* the first of the run's options it cannot run with (what is not built yet), as a sentence,
     * with what to do in *hint; NULL when it can (NULL hook: none). nb_sched_refuses asks it:
     * training fails on the answer, `nobubble plan` prints it instead of planning the schedule */
    const char *(*refuses)(const nb_train_opts *o, const char **hint);
    /* when another schedule runs: fails if an option only this one reads was set (NULL: none) */
    void (*reject)(const nb_train_opts *o);
    /* plans the run's memory instead of the family's resident plan (NULL: the family's) */
    void (*plan)(nb_run *r);
    void (*init)(nb_run *r); /* its lanes and state, after the family's init */
    /* enqueue step `step`; returns the compute-lane mark at its end */
    nb_mark (*step)(nb_run *r, int step);
    /* waits until all of its work in flight is done (before the host reads the model state) */
    void (*drain)(nb_run *r);
    void (*report)(nb_run *r); /* end-of-run lines (NULL: none) */
    /* how it runs, for titles (" (async dispatch)"); NULL: nothing to add */
    void (*describe)(const nb_run *r, char *buf, size_t cap);
    void (*free)(nb_run *r);
    /* what it does besides placing items (step.h): its family-visible traits */
    nb_sched_traits traits;
    /* a schedule that keeps the model state (traits.keeps_state): the host's weights and
     * optimizer state -> its memory (start, resume), and the step's gradient norm (after the
     * step's end mark) */
    void (*upload)(nb_run *r);
    float (*grad_norm)(nb_run *r);
    /* host work around the pass, outside any graph capture (NULL: none): before the pass; after
     * the optimizer, before the family's post items; after them */
    void (*prologue)(nb_run *r, int step);
    void (*before_post)(nb_run *r, int step);
    void (*epilogue)(nb_run *r, int step);
} nb_sched_i;

/* The schedule of a --schedule name, or NULL. */
const nb_sched_i *nb_sched_find(const char *name);
/* The registered schedules, in registry order (NULL-terminated). */
const nb_sched_i *const *nb_sched_all(void);
/* "plain, erase or stream" */
const char *nb_sched_names(void);
/* The first of the run's options that schedule s cannot run with (not built yet: --graphs where
 * its steps are not captured, and its own refuses()), as a sentence with what to do in *hint;
 * NULL when it can. Training fails on it; `nobubble plan` prints it. */
const char *nb_sched_refuses(const nb_sched_i *s, const nb_train_opts *o, const char **hint);

extern const nb_sched_i nb_sched_plain, nb_sched_erase, nb_sched_stream, nb_sched_sparse_dist, nb_sched_pipe;
/* plain's step (the pass in order on the compute lane), for schedules that add work around it */
nb_mark nb_plain_step(nb_run *r, int step);

#endif
