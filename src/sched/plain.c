/* plain: the reference schedule. The step's work items in order on the compute lane: the input
 * stage, each segment's forward followed by its backward (its head first), the tail (join,
 * input backward, optimizer). Every other schedule is tested against this one. */
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

const nb_sched_i nb_sched_plain = {
    .name = "plain",
    .summary = "every work item in order on one lane (the reference)",
    .step = nb_plain_step,
    .settles = 1,
    .graphs = 1,
};
