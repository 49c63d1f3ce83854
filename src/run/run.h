/* The run: the one training loop, the same for every model family and schedule.
 *
 *   tools/cmd_train.c  options -> nb_run_init -> nb_run_train -> nb_run_free
 *   nb_run_init        backend instance, lanes, the family (model, items), the memory plan (the
 *                      schedule's, or the family's own), the schedule's lanes and state, the
 *                      weights (seed or checkpoint), the data
 *   nb_run_train       per step: family begin_step (batch, optimizer scalars on the host) ->
 *                      schedule step (work items on lanes; may return before the device is done)
 *                      -> family end_step (loss, gradient norm) -> metrics.jsonl, evaluation,
 *                      checkpoint, progress line; at the end timeline.svg, loss.svg, trace
 *
 * What the run shares with a family (src/family) and a schedule (src/sched) is the step contract
 * (src/step/step.h: nb_run, work items, the family and binding interfaces). */
#ifndef NB_RUN_H
#define NB_RUN_H

#include "step/step.h"

/* Build everything for options o (normalized and checked); with eval_only, for evaluation,
 * export or sampling of the checkpoint in o->resume. */
void nb_run_init(nb_run *r, const nb_train_opts *o, int eval_only);
void nb_run_free(nb_run *r);
/* The memory plan for options o only (r->mem, the arenas' planned bytes, r->sched_*_bytes):
 * nothing allocated, no budget enforced. gpu_mem > 0 plans for a GPU of that many bytes (an
 * emulated one on a machine without), 0 for the CPU backend. */
void nb_run_plan_only(nb_run *r, const nb_train_opts *o, size_t gpu_mem);

/* Train from r->step to o.steps (or o.stop_after, --time-limit); writes metrics, checkpoints. */
void nb_run_train(nb_run *r);
/* Evaluate now (waits for the schedule's work in flight first). */
void nb_run_evaluate(nb_run *r, nb_eval *ev);
/* Everything in flight is done and the host copies are current. */
void nb_run_sync_to_host(nb_run *r);

#endif
