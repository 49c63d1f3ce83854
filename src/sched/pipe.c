/* pipe: NestPipe (nested pipelining for large-scale recommendation training) in one place.
 *
 * Dual-Buffer Pipelining (DBP): batch t trains from the active buffer while batch t+1 is made
 * ready in the prefetch buffer and the host prepares batch t+2. The paper's five stages, which
 * batch each works on during step t, the lane it runs on, and the code:
 *
 *   stage                         batch  lane                  code
 *   1 prefetch: samples read      t+2    host (family overlap) family/seqctr_prefetch.c prefetch,
 *     and index lists built                                    model/seqctr_batch.c nb_sc_prepare_part
 *   2 H2D: the lists copied in    t+1    emb                   stage_h2d_and_retrieval below: items.next
 *                                                              "batch upload (next)"
 *   3 key routing: ids to their   t+2    host (family overlap) emb/exchange.c nb_emb_route_ids
 *     owners, collisions back                                  emb/resync.c nb_emb_route_collisions
 *   4 retrieval into the          t+1    emb, comm             stage_h2d_and_retrieval: "embedding serve
 *     prefetch buffer: owners'                                 (next)" emb/exchange.c nb_emb_serve_rows,
 *     lookups, rows all-to-all                                 "rows all-to-all (next)" nb_emb_all_to_all
 *   5 train from the active       t      compute               stage_train: plain's order (nb_plain_step)
 *     buffer                                                   over the family's items
 *   resync (staleness-free)       t+1    compute, comm         resync below: items.resync, emb/resync.c
 *
 * The buffers are the embedding module's ring (emb/emb.h): each batch in flight has its own
 * device lists and work buffer; the slot the step reads is the active buffer, the next one the
 * prefetch buffer. Staleness-free: t+1's rows were read before t's update, so after it the rows
 * both batches touch (the collisions, found by their owners) are looked up again and sent over
 * the stale copies before t+1 reads them. Every other row is the same either way, so the result
 * is bitwise the synchronous schedule's (tests/pipe_test.sh; --pipe-skip-resync leaves the stale
 * copies, and the test shows the results then differ). With --emb-priority (FreeScale's
 * collision-first updates) stage 4 moves only the exclusive rows and the collision rows come
 * through the resync alone.
 *
 * Frozen-Window Pipelining (FWP, --micro-batches M): a rank's batch is a window of M parts that
 * read one frozen embedding state (emb/window.c); the run runs this schedule once per part, so
 * the stages above pipeline the parts too: part k+1's H2D and retrieval run while part k trains,
 * and since the tables change only after the window's last part, only a window's first part can
 * collide with what came before it. Key-centric clustering (--cluster-keys,
 * data/ctr_source.c nb_ctr_cluster_keys) cuts the window into parts that share hot keys, so each
 * part moves fewer distinct rows. The family reads M in one place (family/seqctr.c fwp_parts).
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
    nb_lane *emb; /* stages 2 and 4 of the batch after the step's */
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

/* Stages 2 and 4 for the batch after the step's, on the emb lane, behind the last step's update
 * (its lookups read rows that update writes). */
static void stage_h2d_and_retrieval(nb_run *r, int step) {
    pipe_state *st = P(r);
    nb_lane_wait(st->emb, nb_lane_mark(r->compute));
    nb_items_run(r, &r->items.next, st->emb, step);
}

/* Stage 5: the step's batch from the active buffer, in plain's order on the compute lane. */
static nb_mark stage_train(nb_run *r, int step) { return nb_plain_step(r, step); }

/* After stage 5's optimizer, before the step's table update: the update writes rows that the
 * next batch's lookups (stage 4) read. */
static void before_update(nb_run *r, int step) {
    (void)step;
    nb_lane_join(r->compute, nb_lane_mark(P(r)->emb), "wait next lookups");
}

/* After the update: the next batch's collision rows again, then the step ends once the next
 * batch is whole in its buffer. */
static void resync(nb_run *r, int step) {
    nb_items_run(r, &r->items.resync, r->compute, step);
    nb_lane_join(r->compute, nb_lane_mark(P(r)->emb), "wait next rows");
}

const nb_sched_i nb_sched_pipe = {
    .name = "pipe",
    .summary = "NestPipe: the next batch's embedding rows fetched while this one trains, staleness-free (seqctr)",
    .applies = applies,
    .reject = pipe_reject,
    .init = pipe_init,
    .step = stage_train,
    .free = pipe_free,
    .prologue = stage_h2d_and_retrieval,
    .before_post = before_update,
    .epilogue = resync,
    /* prefetches: stages 2 and 4 run ahead (the run enqueues the batch's own pre items once);
     * ids_ahead: stage 3 runs ahead, on the host */
    .traits = {.settles = 1, .graphs = 1, .prefetches = 1, .ids_ahead = 1},
};
