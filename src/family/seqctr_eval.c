/* The seqctr family's held-out evaluation: the scores of the evaluation set (sharded tables: in
 * rounds of one global batch split over the ranks, each batch's rows from their owners like a
 * training batch's), then NE and AUC (run/evalmetrics.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "core.h"
#include "family/seqctr_family.h"
#include "step/evalmetrics.h"

void nb_seqctr_eval_line(const char *what, int step, const nb_eval *e) {
    printf("%s step=%d n=%ld loss=%.5f ne=%.5f auc=%.5f base_rate=%.5f\n", what, step, e->n, e->loss, e->ne, e->auc,
           e->base_rate);
    /* NE and AUC are undefined when the held-out labels are all equal: say so instead of
     * leaving a bare nan for the reader to interpret */
    if (!isfinite(e->ne) || !isfinite(e->auc))
        printf("note: the %ld held-out labels are all %s: NE and AUC are undefined (metrics.jsonl leaves them out)\n",
               e->n, e->base_rate > 0.5 ? "1" : "0");
    fflush(stdout);
}

/* Sharded: a forward of an evaluation batch through the run's lanes (the rows come from their
 * owners, like a training step's); logits[b->B] on the host. */
static void sharded_forward(nb_run *r, sc_train *t, const nb_sc_batch *b, float *logits) {
    int ahead = nb_sc_prepare_aside(&t->m, b);
    nb_emb_route_ids(&t->m.emb);
    nb_sc_begin_aside(&t->m);
    nb_items_run(r, &r->items.pre, r->compute, t->step);
    nb_items_run(r, &r->items.input, r->compute, t->step);
    for (int k = 0; k < t->m.nseg; k++) nb_items_run(r, &r->items.fwd[k], r->compute, t->step);
    nb_mark_wait_host(nb_lane_mark(r->compute));
    nb_sc_logits(&t->m, logits);
    nb_sc_end_aside(&t->m, ahead);
}

/* Sharded: the held-out set in rounds of one global batch, split over the ranks (a rank with no
 * sample left in a round scores a stand-in it drops: every rank takes part in each exchange);
 * the scores are gathered, so every rank computes the same NE and AUC. */
static void sharded_scores(nb_run *r, sc_train *t, long n, float *logit, float *label) {
    int N = r->world;
    long round = (long)t->Bm * N; /* every rank scores at most one part's samples at a time */
    float *mine = nb_malloc((size_t)t->Bm * sizeof(float), "evaluation scores");
    float *all = nb_malloc((size_t)t->Bm * N * sizeof(float), "evaluation scores");
    for (long first = 0; first < n; first += round) {
        long cnt = n - first < round ? n - first : round, per = (cnt + N - 1) / N;
        long from = first + r->rank * per, own = cnt - r->rank * per;
        own = own < 0 ? 0 : own > per ? per : own;
        nb_ctr_fill_eval(&t->src, &t->batch, own ? from : first, own ? (int)own : 1);
        nb_sc_batch b = t->batch.b;
        b.label = NULL;
        sharded_forward(r, t, &b, mine);
        nb_comm_all_gather_host(mine, all, (size_t)per * sizeof(float), "evaluation scores");
        for (int k = 0; k < N; k++) {
            long at = first + k * per, len = cnt - k * per;
            len = len < 0 ? 0 : len > per ? per : len;
            if (len) memcpy(logit + at, all + (size_t)k * per, (size_t)len * sizeof(float));
        }
    }
    for (long first = 0; first < n; first += t->Bm) { /* the labels: the held-out set is the same on every rank */
        int B = (int)(n - first < t->Bm ? n - first : t->Bm);
        nb_ctr_fill_eval(&t->src, &t->batch, first, B);
        memcpy(label + first, t->batch.label, (size_t)B * sizeof(float));
    }
    free(mine), free(all);
}

void nb_seqctr_evaluate(nb_run *r, nb_eval *ev) {
    sc_train *t = T(r);
    long n = nb_ctr_eval_count(&t->src);
    float *logit = nb_malloc((size_t)n * sizeof(float), "evaluation scores");
    float *label = nb_malloc((size_t)n * sizeof(float), "evaluation labels");
    if (t->sharded) {
        sharded_scores(r, t, n, logit, label);
    } else {
        for (long first = 0; first < n; first += t->Bl) {
            int B = (int)(n - first < t->Bl ? n - first : t->Bl);
            nb_ctr_fill_eval(&t->src, &t->batch, first, B);
            nb_sc_batch b = t->batch.b;
            b.label = NULL;
            nb_sc_forward(&t->m, &b, logit + first);
            memcpy(label + first, t->batch.label, (size_t)B * sizeof(float));
        }
    }
    *ev = nb_eval_binary(logit, label, n, 1);
    free(logit);
    free(label);
}

void nb_seqctr_print_eval(const nb_run *r, int step, const nb_eval *ev) {
    (void)r;
    nb_seqctr_eval_line("eval", step, ev);
}

