/* plain: the reference schedule. The step's work items in order on the compute lane: the input
 * stage, each segment's forward followed by its backward (its head first), the tail (join,
 * input backward, optimizer). Every other schedule is tested against this one. With sharded
 * tables the step routes its own ids at its start: the synchronous baseline.
 *
 * sparse-dist: plain's order, but the next batch's ids are routed to their owners while the step
 * trains (the host, between enqueue and wait), as TorchRec's TrainPipelineSparseDist does; the
 * lookups and the rows all-to-all stay in line. A baseline for --schedule pipe (TorchRec itself
 * cannot be installed here). */
#include "sched/sched.h"

nb_mark nb_plain_step(nb_run *r, int step) {
    const nb_step_items *it = &r->items;
    nb_items_run(r, &it->input, r->compute, step);
    for (int s = 0; s < it->nseg; s++) {
        nb_items_run(r, &it->fwd[s], r->compute, step);
        nb_items_run(r, &it->bwd[s], r->compute, step);
    }
    nb_items_run(r, &it->tail, r->compute, step);
    return nb_lane_mark(r->compute);
}

static int fetches(const nb_family_i *fam, const char **why) {
    *why = "it routes an embedding model's ids ahead (seqctr)";
    return fam->fetches_ahead;
}

const nb_sched_i nb_sched_sparse_dist = {
    .name = "sparse-dist",
    .summary = "TorchRec-style baseline: the next batch's ids routed while this one trains, lookups in line (seqctr)",
    .applies = fetches,
    .step = nb_plain_step,
    .traits = {.settles = 1, .graphs = 1, .ids_ahead = 1},
};

const nb_sched_i nb_sched_plain = {
    .name = "plain",
    .summary = "every work item in order on one lane (the reference)",
    .step = nb_plain_step,
    .traits = {.settles = 1, .graphs = 1},
};
