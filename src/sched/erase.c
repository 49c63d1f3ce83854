/* erase: ERASE (early backpropagation) for detached segments. After segment s's forward is
 * enqueued on the main lane, its local head and backward go to side lane s mod K, waiting only
 * on a mark of the main lane, while the main lane goes on with the next segment's forward. The
 * last segment's head and backward stay on the main lane; the join (the local heads' partial
 * gradients, in segment order), the embedding backward and AdamW wait for every side lane.
 * The work items are plain's, and every item writes memory no other concurrent item touches, so
 * the result is bitwise plain's (tests/erase_test.sh).
 *
 * Dispatch: blocking, the main thread enqueues the side work itself; async, a host lane per side
 * lane does it (the paper's thread-pool dispatch), so the main thread never waits on a side
 * lane's enqueue. */
#include <stdio.h>
#include <string.h>

#include "sched/trainer.h"

typedef struct {
    nb_trainer *tr;
    nb_lane *side;
    nb_mark after;
    int seg, step;
} erase_dispatch;

static erase_dispatch dispatches[NB_MAX_SEGMENTS];

static void work_dispatch(void *arg, const nb_task_ctx *ctx) {
    (void)ctx;
    erase_dispatch *d = arg;
    nb_lane_wait(d->side, d->after);
    nb_sched_segment_backward(d->tr, d->side, d->seg, d->step);
}

nb_mark nb_sched_erase_step(nb_trainer *tr, int step) {
    nb_lane *c = tr->compute;
    int last = tr->nseg - 1, async = tr->dispatch[0] != NULL;
    char name[40];
    nb_mark queued[NB_MAX_SEGMENTS];
    nb_lane_run(c, "embed fwd", NB_SPAN_FWD, step, nb_work_embed_fwd, &tr->whole);
    for (int s = 0; s <= last; s++) {
        for (int l = tr->seg_first[s]; l < tr->seg_first[s + 1]; l++) {
            snprintf(name, sizeof name, "fwd S%d L%d", s, l);
            nb_lane_run(c, name, NB_SPAN_FWD, step, nb_work_layer_fwd, &tr->work[l]);
        }
        if (s == last) break;
        int j = s % tr->nside;
        nb_mark fwd_done = nb_lane_mark(c);
        if (async) {
            dispatches[s] = (erase_dispatch){tr, tr->side[j], fwd_done, s, step};
            nb_lane_run(tr->dispatch[j], "dispatch", NB_SPAN_OTHER, step, work_dispatch, &dispatches[s]);
            queued[j] = nb_lane_mark(tr->dispatch[j]);
        } else {
            nb_lane_wait(tr->side[j], fwd_done);
            nb_sched_segment_backward(tr, tr->side[j], s, step);
        }
    }
    nb_lane_run(c, "head + loss", NB_SPAN_LOSS, step, nb_work_head, &tr->whole);
    nb_sched_segment_backward(tr, c, last, step);
    int used = last < tr->nside ? last : tr->nside;
    for (int j = 0; j < used; j++) {
        /* a side lane's mark counts only the work already queued on it: with async dispatch,
         * wait until its dispatcher has queued everything first */
        if (async) nb_mark_wait_host(queued[j]);
        nb_lane_wait(c, nb_lane_mark(tr->side[j]));
    }
    if (tr->nseg > 1) nb_lane_run(c, "join", NB_SPAN_BWD, step, nb_work_join, &tr->whole);
    nb_lane_run(c, "embed bwd", NB_SPAN_BWD, step, nb_work_embed_bwd, &tr->whole);
    nb_lane_run(c, "adamw", NB_SPAN_OPTIM, step, nb_work_optim, &tr->whole);
    return nb_lane_mark(c);
}
