/* plain: the reference schedule. Forward all, loss, backward all, optimizer, in order on one
 * lane. Every other schedule is tested against this one. With --detach, each segment's local
 * head and backward run right after its forward, still on the one lane. */
#include <stdio.h>

#include "sched/trainer.h"

void nb_sched_segment_backward(nb_trainer *tr, nb_lane *lane, int s, int step) {
    char name[40];
    if (s + 1 < tr->nseg) {
        snprintf(name, sizeof name, "head S%d", s);
        nb_lane_run(lane, name, NB_SPAN_LOSS, step, nb_work_seg_head, &tr->seg_work[s]);
    }
    for (int l = tr->seg_first[s + 1] - 1; l >= tr->seg_first[s]; l--) {
        snprintf(name, sizeof name, "bwd S%d L%d", s, l);
        nb_lane_run(lane, name, NB_SPAN_BWD, step, nb_work_layer_bwd, &tr->work[l]);
    }
}

static void segment_forward(nb_trainer *tr, int s, int step) {
    char name[40];
    for (int l = tr->seg_first[s]; l < tr->seg_first[s + 1]; l++) {
        snprintf(name, sizeof name, "fwd S%d L%d", s, l);
        nb_lane_run(tr->compute, name, NB_SPAN_FWD, step, nb_work_layer_fwd, &tr->work[l]);
    }
}

nb_mark nb_sched_plain_step(nb_trainer *tr, int step) {
    nb_lane *c = tr->compute;
    int last = tr->nseg - 1;
    /* the trainer has waited for the batch and staged its tokens before this step */
    nb_lane_run(c, "embed fwd", NB_SPAN_FWD, step, nb_work_embed_fwd, &tr->whole);
    for (int s = 0; s < last; s++) {
        segment_forward(tr, s, step);
        nb_sched_segment_backward(tr, c, s, step);
    }
    segment_forward(tr, last, step);
    nb_lane_run(c, "head + loss", NB_SPAN_LOSS, step, nb_work_head, &tr->whole);
    nb_sched_segment_backward(tr, c, last, step);
    if (tr->nseg > 1) nb_lane_run(c, "join", NB_SPAN_BWD, step, nb_work_join, &tr->whole);
    nb_lane_run(c, "embed bwd", NB_SPAN_BWD, step, nb_work_embed_bwd, &tr->whole);
    nb_lane_run(c, "adamw", NB_SPAN_OPTIM, step, nb_work_optim, &tr->whole);
    return nb_lane_mark(c);
}
