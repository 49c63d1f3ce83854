/* Step-time statistics shared by the trainers' summaries: the p90 rate is the work per step over
 * the 90th-percentile step time (the rate 90% of steps reach; the ERASE paper's p90 QPS read
 * conservatively), taken after warm-up steps, which pay for allocation, heuristics and capture. */
#ifndef NB_STEP_STATS_H
#define NB_STEP_STATS_H

typedef struct {
    int warmup, n;       /* steps left out, steps counted */
    double p90, median;  /* step times, in the unit given */
} nb_step_times;

/* Warm-up steps of a run of `steps`: 10 from 20 steps on, else half. */
int nb_step_warmup(int steps);
/* Over times[warmup .. steps); n = 0 when nothing is left after the warm-up. */
nb_step_times nb_step_times_of(const double *times, int steps);

#endif
