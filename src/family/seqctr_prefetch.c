/* The seqctr family's host side of the pipeline: the parts of the step's window made ready ahead
 * of the step that trains them.
 *
 * For each part, while the step before it runs (the family's overlap), the host reads the
 * samples of the next global batch once per window (placed over the ranks by --balance,
 * data/balance_place.c; clustered by --cluster-keys), builds the part's index lists
 * (model/seqctr_batch.c), and routes its keys to their owners (emb/exchange.c) and the owners'
 * collisions back (emb/resync.c): NestPipe's stages 1 (prefetch) and 3 (key routing), see
 * sched/pipe.c. A schedule that does not route ahead (plain) routes the ids at the step's start,
 * in line: the synchronous baseline. */
#include <string.h>

#include "core.h"
#include "family/seqctr_family.h"
#include "host.h"
#include "step/step_stats.h"

/* Part k of the window in t->window, as a batch (a view). */
static nb_sc_batch part_of(const sc_train *t, int k) {
    nb_sc_batch b = t->window.b;
    size_t at = (size_t)t->part_at[k];
    b.B = t->part_at[k + 1] - t->part_at[k];
    b.dense += at * (size_t)t->window.nd, b.cat += at * (size_t)t->window.nc, b.target += at, b.hist += at * b.hist_stride;
    b.hist_len += at, b.label += at;
    if (b.mv) b.mv += at * (size_t)t->window.mw, b.mv_len += at * (size_t)t->window.nmv;
    return b;
}

/* This rank's samples of the next global batch (placed by --balance) and the window's parts: the
 * emulated ranks' shares, or the rank's samples cut into M near-equal parts. */
static void fill_window(sc_train *t) {
    int share_first[NB_BALANCE_MAX_EMULATE + 1];
    nb_balance_place(&t->place, &t->src, &t->window, t->win_idx, share_first, t->emulate ? 1 : t->M);
    if (t->emulate) {
        memcpy(t->part_at, share_first, (size_t)(t->M + 1) * sizeof(int));
        return;
    }
    if (t->run->o.cluster_keys && t->M > 1) nb_ctr_cluster_keys(&t->window, &t->m, t->M, &t->cluster);
    int n = t->window.b.B;
    for (int k = 0; k <= t->M; k++) t->part_at[k] = (int)((long)k * n / t->M);
}

static void log_samples(sc_train *t, int k) {
    long step = t->next_u / t->M;
    for (int i = t->part_at[k]; i < t->part_at[k + 1]; i++)
        fprintf(t->samples_log, "%ld %d %d %d\n", step, t->run->rank, k, t->win_idx[i]);
    fflush(t->samples_log);
}

/* The next part (this rank's slice of the global batch, cut into the window's parts): the samples
 * at a window's first part (NestPipe's stage 1, prefetch), then the model's index lists and, when
 * sharded, the routing of its keys to their owners (stage 3; host work, timed). */
static void prefetch(sc_train *t) {
    NB_ASSERT(t->nahead < NB_SC_RING);
    int k = (int)(t->next_u % t->M);
    double t0 = nb_now();
    if (k == 0) {
        t->window_pos = nb_ctr_source_position(&t->src);
        fill_window(t);
    }
    double t1 = nb_now();
    nb_sc_batch b = part_of(t, k);
    if (t->samples_log) log_samples(t, k);
    nb_sc_prepare_part(&t->m, &b, k, t->M);
    double t2 = nb_now();
    if (t->sharded && t->ids_ahead) nb_emb_route_ids(&t->m.emb);
    double t3 = nb_now();
    if (t->pipelined && t->sharded) nb_emb_route_collisions(&t->m.emb);
    double t4 = nb_now();
    sc_ahead *a = &t->ahead[t->nahead++];
    *a = (sc_ahead){t->window_pos, t1 - t0, t4 - t1, t3 - t2, t4 - t3, t->m.stage_dedup_s,
                    t->sharded && t->ids_ahead ? t->m.emb.window_dedup_s : 0, t->m.stage_nh, b.B, 0, {0}};
    if (t->emulate) { /* the shares' statistics: longest history, sums of L^a for the cost fit */
        for (int i = 0; i < b.B; i++) a->max_len = b.hist_len[i] > a->max_len ? b.hist_len[i] : a->max_len;
        nb_balance_fit_lengths(a->sum_pow, b.hist_len, b.B);
    }
    t->next_u++;
}

int nb_seqctr_lookahead(const sc_train *t) { return t->pipelined ? 2 : 1; }

void nb_seqctr_top_up(sc_train *t, long upto) {
    long total = (long)t->run->o.steps * t->M;
    while (t->next_u < upto && t->next_u < total) prefetch(t);
}

/* The next part becomes the step's: prepared (with the one a pipelining schedule fetches while it
 * trains), its statistics counted, its ids routed now when the schedule does not route ahead. */
void nb_seqctr_pop_part(nb_run *r, sc_train *t, int step) {
    nb_seqctr_top_up(t, t->popped_u + 1 + (t->pipelined ? 1 : 0));
    t->part_nh[t->part_k] = t->ahead[0].nh, t->part_maxlen[t->part_k] = t->ahead[0].max_len, t->part_n[t->part_k] = t->ahead[0].B;
    if (t->emulate && step >= nb_step_warmup(r->o.steps)) nb_balance_fit_add(&t->fit, t->ahead[0].B, t->ahead[0].sum_pow);
    if (step >= nb_step_warmup(r->o.steps)) {
        t->hist_rows += (double)t->ahead[0].nh;
        t->host.samples += t->ahead[0].fill_s, t->host.prep += t->ahead[0].prep_s;
        t->host.ids += t->ahead[0].ids_s, t->host.coll += t->ahead[0].coll_s;
        t->host.dedup += t->ahead[0].dedup_s, t->host.wdedup += t->ahead[0].wdedup_s;
    }
    for (int k = 1; k < t->nahead; k++) t->ahead[k - 1] = t->ahead[k];
    t->nahead--;
    t->popped_u++;
    if (t->sharded && !t->ids_ahead) { /* the synchronous baseline: in line */
        double t0 = nb_now();
        nb_emb_route_ids(&t->m.emb);
        if (step >= nb_step_warmup(r->o.steps)) t->host.ids_in_step += nb_now() - t0, t->host.wdedup += t->m.emb.window_dedup_s;
    }
    nb_sc_begin_step(&t->m);
}

/* Device lists: counted on the device, so after the part ran. */
void nb_seqctr_count_rows(sc_train *t) {
    int distinct, resynced;
    nb_sc_batch_rows(&t->m, &distinct, &resynced);
    t->step_rows += distinct, t->step_resynced += resynced;
    if (t->m.emb.priority) t->step_ahead += nb_sc_rows_ahead(&t->m);
}

