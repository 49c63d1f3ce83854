/* plain: the reference schedule. Forward all, loss, backward all, optimizer, in order on one
 * lane. Every other schedule is tested against this one. */
#include <stdio.h>

#include "sched/trainer.h"

nb_mark nb_sched_plain_step(nb_trainer *tr, int step) {
    nb_lane *c = tr->compute;
    int L = tr->model.cfg.layers;
    char name[40];
    /* the trainer has waited for the batch and staged its tokens before this step */
    nb_lane_run(c, "embed fwd", NB_SPAN_FWD, step, nb_work_embed_fwd, &tr->whole);
    for (int l = 0; l < L; l++) {
        snprintf(name, sizeof name, "fwd L%d", l);
        nb_lane_run(c, name, NB_SPAN_FWD, step, nb_work_layer_fwd, &tr->work[l]);
    }
    nb_lane_run(c, "head + loss", NB_SPAN_LOSS, step, nb_work_head, &tr->whole);
    for (int l = L - 1; l >= 0; l--) {
        snprintf(name, sizeof name, "bwd L%d", l);
        nb_lane_run(c, name, NB_SPAN_BWD, step, nb_work_layer_bwd, &tr->work[l]);
    }
    nb_lane_run(c, "embed bwd", NB_SPAN_BWD, step, nb_work_embed_bwd, &tr->whole);
    nb_lane_run(c, "adamw", NB_SPAN_OPTIM, step, nb_work_optim, &tr->whole);
    return nb_lane_mark(c);
}
