/* erase: ERASE (early backpropagation) for detached segments, for every model family. After
 * segment s's forward is enqueued on the compute lane, its backward (local head first) goes to
 * side lane s mod K, waiting only on a mark of the compute lane, while the compute lane goes on
 * with the next segment's forward. The last segment's backward stays on the compute lane; the
 * tail (the join of the local heads' partial gradients in segment order, the input backward,
 * the optimizer) waits for every side lane. The items are plain's, and no two items that may
 * run at once write the same memory, so the result is bitwise plain's (tests/schedules_test.sh,
 * tests/erase_test.sh, tests/erase_seqctr_test.sh).
 *
 * Dispatch: blocking, the main thread enqueues the side work itself; async, a host lane per side
 * lane does it (the paper's thread-pool dispatch), so the main thread never waits on a side
 * lane's enqueue. */
#include <stdio.h>
#include <stdlib.h>

#include "core.h"
#include "host.h"
#include "sched/sched.h"

typedef struct {
    nb_run *r;
    nb_lane *side;
    nb_mark after;
    int seg, step;
} erase_dispatch;

typedef struct {
    int nside, async;
    nb_lane *side[NB_MAX_SEGMENTS], *dispatch[NB_MAX_SEGMENTS];
    erase_dispatch jobs[NB_MAX_SEGMENTS];
} erase_state;

static erase_state *E(nb_run *r) { return r->ss; }

static void work_dispatch(void *arg, const nb_task_ctx *ctx) {
    (void)ctx;
    erase_dispatch *d = arg;
    nb_lane_wait(d->side, d->after);
    nb_items_run(d->r, &d->r->items.bwd[d->seg], d->side, d->step);
}

/* OpenMP's thread count belongs to the calling thread: a side lane's ops run on its worker (CPU) */
static void work_set_threads(void *arg, const nb_task_ctx *ctx) {
    (void)ctx;
    nb_host_set_threads(((nb_run *)arg)->o.threads);
}

static void erase_init(nb_run *r) {
    if (r->items.nseg == 1) fprintf(stderr, "note: --schedule erase without --detach: one segment, nothing to overlap\n");
    erase_state *st = nb_calloc(1, sizeof *st, "the erase schedule");
    r->ss = st;
    st->nside = r->o.side_lanes;
    st->async = r->o.erase_dispatch == NB_ERASE_ASYNC;
    for (int j = 0; j < st->nside; j++) {
        char name[32];
        snprintf(name, sizeof name, "side %d", j);
        st->side[j] = nb_lane_create(r->lanes, name, NB_LANE_DEVICE);
        nb_lane_run(st->side[j], "set threads", NB_SPAN_OTHER, -1, work_set_threads, r);
        if (st->async) {
            snprintf(name, sizeof name, "dispatch %d", j);
            st->dispatch[j] = nb_lane_create(r->lanes, name, NB_LANE_HOST);
        }
    }
    nb_lanes_sync(r->lanes);
}

static nb_mark erase_step(nb_run *r, int step) {
    erase_state *st = E(r);
    const nb_step_items *it = &r->items;
    int last = it->nseg - 1;
    nb_mark queued[NB_MAX_SEGMENTS];
    nb_items_run(r, &it->input, r->compute, step);
    for (int s = 0; s < last; s++) {
        nb_items_run(r, &it->fwd[s], r->compute, step);
        int j = s % st->nside;
        nb_mark fwd_done = nb_lane_mark(r->compute);
        if (st->async) {
            st->jobs[s] = (erase_dispatch){r, st->side[j], fwd_done, s, step};
            nb_lane_run(st->dispatch[j], "dispatch", NB_SPAN_OTHER, step, work_dispatch, &st->jobs[s]);
            queued[j] = nb_lane_mark(st->dispatch[j]);
        } else {
            nb_lane_wait(st->side[j], fwd_done);
            nb_items_run(r, &it->bwd[s], st->side[j], step);
        }
    }
    nb_items_run(r, &it->fwd[last], r->compute, step);
    nb_items_run(r, &it->bwd[last], r->compute, step);
    int used = last < st->nside ? last : st->nside;
    for (int j = 0; j < used; j++) {
        /* a side lane's mark counts only the work already queued on it: with async dispatch,
         * wait until its dispatcher has queued everything first */
        if (st->async) nb_mark_wait_host(queued[j]);
        nb_lane_wait(r->compute, nb_lane_mark(st->side[j]));
    }
    nb_items_run(r, &it->tail, r->compute, step);
    return nb_lane_mark(r->compute);
}

static const char *erase_refuses(const nb_train_opts *o, const char **hint) {
    /* the dispatcher threads would enqueue the side lanes' gradient reductions in an order that
     * differs between ranks; every rank must issue its collectives in the same order */
    if (o->world > 1 && o->erase_dispatch == NB_ERASE_ASYNC) {
        *hint = "use --erase-dispatch blocking with several ranks";
        return "async dispatch enqueues collectives from several threads: ranks would disagree on their order";
    }
    if (o->graphs && o->erase_dispatch == NB_ERASE_ASYNC) {
        *hint = "use --erase-dispatch blocking with --graphs";
        return "--graphs captures the step once, so its dispatch is fixed: async dispatch cannot be captured";
    }
    return NULL;
}

static int st_async(const nb_run *r) { return r->o.erase_dispatch == NB_ERASE_ASYNC; }

static void erase_describe(const nb_run *r, char *buf, size_t cap) {
    snprintf(buf, cap, " (%s dispatch, %d side lane%s)", st_async(r) ? "async" : "blocking", r->o.side_lanes, r->o.side_lanes == 1 ? "" : "s");
}

static void erase_free(nb_run *r) {
    free(r->ss);
    r->ss = NULL;
}

const nb_sched_i nb_sched_erase = {
    .name = "erase",
    .summary = "ERASE: detached segments' backward on side lanes while later segments run forward",
    .refuses = erase_refuses,
    .init = erase_init,
    .step = erase_step,
    .free = erase_free,
    .describe = erase_describe,
    .traits = {.settles = 1, .graphs = 1},
};
