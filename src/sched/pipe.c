/* pipe: NestPipe's dual-buffer pipelining (DBP) for a family that fetches ahead (seqctr with its
 * tables sharded over the ranks, nb_sc_shard). While the compute lane trains batch t from its
 * work buffer, the "emb" lane copies batch t+1's index lists in and has the owners look up its
 * rows, and the comm lane moves them into t+1's own work buffer (the family's items.next); the
 * host meanwhile prepares batch t+2 and routes its ids. Staleness-free: t+1's rows were read
 * before t's update, so after it the rows both batches touch are looked up again and sent over
 * the stale copies (items.resync) before t+1 reads them. Every other row is the same either way,
 * so the result is bitwise the synchronous schedule's (tests/pipe_test.sh; --pipe-skip-resync
 * leaves the stale copies, and the test shows the results then differ).
 *
 * Order on the lanes of step t: emb: [wait the compute lane's mark (t-1's update is done)] t+1's
 * lists in, t+1's lookups; comm: t+1's rows all-to-all, ...; compute: t's pass and optimizer,
 * [wait the emb lane: the lookups read the rows t's update writes] t's sparse update, t+1's
 * collision rows, their all-to-all, their scatter, [wait the emb lane's all-to-all]. */
#include <stdlib.h>

#include "core.h"
#include "host.h"
#include "sched/sched.h"

typedef struct {
    nb_lane *emb;
} pipe_state;

static pipe_state *P(nb_run *r) { return r->ss; }

static int applies(const nb_family_i *fam, const char **why) {
    *why = "it pipelines an embedding model's lookups across batches (seqctr)";
    return fam->fetches_ahead;
}

static void pipe_reject(const nb_train_opts *o) {
    NB_CHECK(!o->pipe_skip_resync, "drop --pipe-skip-resync, or use --schedule pipe",
             "--pipe-skip-resync is a debug switch of --schedule pipe");
}

static void work_set_threads(void *arg, const nb_task_ctx *ctx) {
    (void)ctx;
    nb_host_set_threads(((nb_run *)arg)->o.threads);
}

static void pipe_init(nb_run *r) {
    pipe_state *st = nb_calloc(1, sizeof *st, "the pipe schedule");
    r->ss = st;
    st->emb = nb_lane_create(r->lanes, "emb", NB_LANE_DEVICE);
    nb_lane_run(st->emb, "set threads", NB_SPAN_OTHER, -1, work_set_threads, r);
}

static void pipe_free(nb_run *r) {
    free(r->ss);
    r->ss = NULL;
}

/* the next batch's fetch, behind the last step's update */
static void pipe_prologue(nb_run *r, int step) {
    pipe_state *st = P(r);
    nb_lane_wait(st->emb, nb_lane_mark(r->compute));
    nb_items_run(r, &r->items.next, st->emb, step);
}

/* the step's table update writes rows the next batch's lookups read */
static void pipe_before_post(nb_run *r, int step) {
    (void)step;
    nb_lane_join(r->compute, nb_lane_mark(P(r)->emb), "wait next lookups");
}

/* the collision rows, then the step ends once the next batch is whole */
static void pipe_epilogue(nb_run *r, int step) {
    nb_items_run(r, &r->items.resync, r->compute, step);
    nb_lane_join(r->compute, nb_lane_mark(P(r)->emb), "wait next rows");
}

const nb_sched_i nb_sched_pipe = {
    .name = "pipe",
    .summary = "NestPipe: the next batch's embedding rows fetched while this one trains, staleness-free (seqctr)",
    .applies = applies,
    .reject = pipe_reject,
    .init = pipe_init,
    .step = nb_plain_step,
    .free = pipe_free,
    .prologue = pipe_prologue,
    .before_post = pipe_before_post,
    .epilogue = pipe_epilogue,
    .traits = {.settles = 1, .graphs = 1, .prefetches = 1, .ids_ahead = 1},
};
