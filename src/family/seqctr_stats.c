/* The seqctr family's timing statistics: each part's compute from its spans, the ranks'
 * straggler share (FreeScale's measure: real ranks all-gathered, or --emulate-ranks' shares),
 * the cost model's fit records, the step breakdown by phase, and the end-of-run summary. Nothing
 * here changes what is computed. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "core.h"
#include "data/synth.h"
#include "family/seqctr_family.h"
#include "step/evalmetrics.h"
#include "step/step_stats.h"

/* "dense fwd 3" is a span of the phase "dense fwd" */
static int phase_named(const char *span, const char *phase) {
    size_t n = strlen(phase);
    return !strncmp(span, phase, n) && (span[n] == 0 || span[n] == ' ');
}

/* Phases that serve the whole step, not one rank's share: the owners' sums and updates, the
 * re-sync after them, the dense optimizer. */
static int common_phase(const char *span) {
    static const nb_sc_phase common[] = {NB_SC_OPT_DENSE, NB_SC_EMB_SUM, NB_SC_RESYNC_SERVE, NB_SC_RESYNC_APPLY,
                                         NB_SC_OPT_EMB};
    for (size_t i = 0; i < sizeof common / sizeof common[0]; i++)
        if (phase_named(span, nb_sc_phase_name(common[i]))) return 1;
    return 0;
}

/* The compute lane's busy seconds in the step's spans recorded since the last call: a rank's (or
 * an emulated rank's) compute time for its share, the common phases left out. */
double nb_seqctr_part_busy(nb_run *r, sc_train *t) {
    const nb_span *sp;
    size_t n = nb_lanes_spans(r->lanes, &sp);
    int lane = nb_lane_index(r->compute);
    double busy = 0;
    for (size_t i = t->span_seen; i < n; i++) {
        if (sp[i].step != t->step) continue;
        int comm = sp[i].kind == NB_SPAN_COMM, common = !comm && sp[i].lane == lane && common_phase(sp[i].name);
        if (comm || common)
            t->step_shared_s += sp[i].t1 - sp[i].t0;
        else if (sp[i].lane == lane)
            busy += sp[i].t1 - sp[i].t0;
    }
    t->span_seen = n;
    return busy;
}

/* The step's ranks (emulated: the parts; real: every rank's busy time, all-gathered): the
 * straggler share (max - mean) / max, the ranks' idle share of the synchronous step, and for
 * emulated ranks the step they stand for: the slowest share plus what the step did besides the
 * shares (the communication, the owners' updates, the optimizer). */
void nb_seqctr_rank_times(nb_run *r, sc_train *t, int step) {
    int N = t->emulate ? t->M : r->world;
    if (N < 2) return;
    double mine = 0, *all = t->rank_s;
    for (int k = 0; k < t->M; k++) mine += t->part_s[k];
    if (t->emulate)
        memcpy(all, t->part_s, (size_t)N * sizeof(double));
    else
        nb_comm_all_gather_host(&mine, all, sizeof(double), "rank times");
    double mx = 0, sum = 0, longest = 0;
    int slowest = 0;
    for (int k = 0; k < N; k++) {
        if (all[k] > mx) mx = all[k], slowest = k;
        sum += all[k];
        if (t->emulate) longest = fmax(longest, t->part_maxlen[k]);
    }
    t->step_slow_long = t->emulate && t->part_maxlen[slowest] == longest;
    t->step_slow_n = t->emulate ? (int)t->part_n[slowest] : 0;
    /* emulated: the slowest share, then what every rank waits for together (the exchanges, the
     * owners' updates, the optimizer), as their spans measured them */
    double mean = sum / N, sync = t->emulate ? mx + t->step_shared_s : r->last_secs;
    t->step_strag = mx > 0 ? 100 * (mx - mean) / mx : 0;
    t->step_rank_bubble = sync > 0 ? 100 * (mx - mean) / sync : 0;
    t->step_emul_s = sync, t->step_max_s = mx, t->step_mean_s = mean;
    if (t->emulate && step >= nb_step_warmup(r->o.steps)) nb_balance_fit_times(&t->fit, t->part_s, t->M);
    if (step >= nb_step_warmup(r->o.steps)) {
        t->strag_sum += t->step_strag, t->rank_bubble_sum += t->step_rank_bubble, t->nslow_long += t->step_slow_long;
        t->nslow_alone += t->step_slow_long && t->step_slow_n == 1;
        if (t->nstrag < r->o.steps) t->strag_steps[t->nstrag] = t->step_strag, t->bubble_steps[t->nstrag++] = t->step_rank_bubble;
    }
}

/* Adds the step's span durations to their phase (spans are named by nb_sc_phase_name). */
void nb_seqctr_add_breakdown(nb_lanes *lanes, int step, double *phase_s) {
    const nb_span *sp;
    size_t n = nb_lanes_spans(lanes, &sp);
    for (size_t i = 0; i < n; i++)
        for (int p = 0; p < NB_SC_NPHASES && sp[i].step == step; p++)
            if (phase_named(sp[i].name, nb_sc_phase_name(p))) phase_s[p] += sp[i].t1 - sp[i].t0;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median_of(const double *v, int n) {
    if (n <= 0) return 0;
    double *c = nb_malloc((size_t)n * sizeof *c, "a median");
    memcpy(c, v, (size_t)n * sizeof *c);
    qsort(c, (size_t)n, sizeof *c, cmp_double);
    double m = n % 2 ? c[n / 2] : 0.5 * (c[n / 2 - 1] + c[n / 2]);
    free(c);
    return m;
}

/* The ranks' compute: straggler and idle shares; for emulated ranks the synchronous step they
 * stand for, and the cost fit of their shares' times. */
static void print_rank_times(const nb_run *r, const sc_train *t, int measured) {
    printf("ranks: %d%s, straggler_pct=%.2f rank_bubble_pct=%.2f (mean over %d steps), median_straggler_pct=%.2f "
           "median_rank_bubble_pct=%.2f; straggler = (max - mean) / max of the ranks' compute\n", t->emulate ? t->emulate : r->world,
           t->emulate ? " emulated (one GPU, one after another)" : "", t->strag_sum / measured, t->rank_bubble_sum / measured,
           measured, median_of(t->strag_steps, t->nstrag), median_of(t->bubble_steps, t->nstrag));
    if (!t->emulate) return;
    printf("ranks: the slowest share held the step's longest history in %d of %d steps, and nothing else in %d (no placement "
           "splits a sample: those steps' straggler share is the least any placement leaves)\n", t->nslow_long, measured, t->nslow_alone);
    nb_step_times st = nb_step_times_of(t->emul_secs, t->nsteps);
    if (st.n)
        printf("emulated steps=%d p90_step_ms=%.3f median_step_ms=%.3f p90_samples_per_s=%.0f (the slowest rank's share + "
               "the step's communication and common phases)\n", st.n, 1e3 * st.p90, 1e3 * st.median, r->o.batch / st.p90);
    nb_balance_fit_print(&t->fit);
}

/* The summary lines the benchmarks and tests read (stdout), after the run's own. */
void nb_seqctr_summary(nb_run *r, int steps_run) {
    sc_train *t = T(r);
    const nb_train_opts *o = &r->o;
    int n = t->nsteps, warm = nb_step_warmup(o->steps), measured = n - warm;
    double secs = nb_now() - t->t_start;
    if (n > 0)
        printf("train steps=%d samples_per_s=%.0f (including evaluation)\n", n, (double)n * o->batch / (secs > 0 ? secs : 1e-9));
    nb_step_times st = nb_step_times_of(t->step_secs, n);
    if (st.n)
        printf("throughput steps=%d warmup=%d p90_samples_per_s=%.0f median_samples_per_s=%.0f p90_step_ms=%.3f\n", st.n,
               st.warmup, o->batch / st.p90, o->batch / st.median, 1e3 * st.p90);
    if (measured > 0) {
        double total = 0, busy = 0;
        for (int p = 0; p < NB_SC_NPHASES; p++) total += t->phase_s[p];
        printf("breakdown ms/step%s:", r->world > 1 ? " (rank 0)" : "");
        for (int p = 0; p < NB_SC_NPHASES; p++) printf(" %s=%.3f", nb_sc_phase_name(p), 1e3 * t->phase_s[p] / measured);
        printf(" total=%.3f\n", 1e3 * total / measured);
        printf("host ms/step (overlapped with the step before): samples=%.3f (reading %.3f, %s) index_lists=%.3f (lists %.3f, "
               "ids routed %.3f, collisions %.3f); in the step: ids routed %.3f; of these, the lists' dedup %.3f, the owner's "
               "window groups %.3f\n",
               1e3 * t->host.samples / measured, 1e3 * t->host.read / measured, t->loader ? "on the loader's thread" : "in line",
               1e3 * t->host.prep / measured,
               1e3 * (t->host.prep - t->host.ids - t->host.coll) / measured, 1e3 * t->host.ids / measured,
               1e3 * t->host.coll / measured, 1e3 * t->host.ids_in_step / measured, 1e3 * t->host.dedup / measured,
               1e3 * t->host.wdedup / measured);
        if (t->m.nseg > 1)
            printf("overlap: %.1f%% of the step had two or more lanes busy (mean over the measured steps)\n",
                   t->overlap_sum / measured);
        double fl = nb_sc_flops(&t->m, t->Bl, (long)(t->hist_rows / measured));
        for (int p = 0; p < NB_SC_NPHASES; p++) busy += t->phase_s[p];
        printf("flops: %.1f GFLOP/step%s (matmuls, forward + backward, %.1f history rows per sample); %.1f TFLOP/s over "
               "the phases\n", fl / 1e9, r->world > 1 ? " on rank 0" : "", t->hist_rows / measured / t->Bl,
               busy > 0 ? fl * measured / busy / 1e12 : 0.0);
    }
    (void)steps_run;
    if (measured > 0 && (t->emulate || r->world > 1)) print_rank_times(r, t, measured);
    if (t->src.kind == NB_CTR_SYNTH) { /* the best any model can do on this evaluation range */
        long ne = o->eval_samples;
        float *tl = nb_malloc((size_t)ne * sizeof(float), "teacher logits"), *lab = nb_malloc((size_t)ne * sizeof(float), "labels");
        nb_synth_teacher_logit(t->src.g, NB_CTR_EVAL_BASE, (int)ne, tl);
        nb_synth_fill(t->src.g, NB_CTR_EVAL_BASE, (int)ne, NULL, NULL, NULL, NULL, NULL, lab, NULL);
        nb_eval te = nb_eval_binary(tl, lab, ne, 1);
        nb_seqctr_eval_line("teacher", r->step, &te);
        free(tl), free(lab);
    }
    if (t->src.kind == NB_CTR_MOVIELENS) {
        long ne = nb_ctr_eval_count(&t->src);
        float *score = nb_malloc((size_t)ne * sizeof(float), "popularity");
        nb_ctr_popularity_scores(&t->src, score);
        nb_eval pb = nb_eval_binary(score, t->src.eval.label, ne, 0);
        nb_seqctr_eval_line("baseline-popularity", r->step, &pb);
        free(score);
    }
}

