/* The seqctr family's host side of the pipeline: the parts of the step's window made ready ahead
 * of the step that trains them.
 *
 * For each part, while the step before it runs (the family's overlap), the host takes the
 * samples of the next global batch once per window (read ahead by the loader,
 * family/seqctr_loader.c: placed over the ranks by --balance, data/balance_place.c; clustered
 * by --cluster-keys), builds the part's index lists
 * (model/seqctr_batch.c), and routes its keys to their owners (emb/exchange.c) and the owners'
 * collisions back (emb/resync.c): NestPipe's stages 1 (prefetch) and 3 (key routing), see
 * sched/pipe.c. A schedule that does not route ahead (plain) routes the ids at the step's start,
 * in line: the synchronous baseline. */

#include "core.h"
#include "family/seqctr_family.h"
#include "host.h"
#include "step/step_stats.h"

/* Part k of the window being cut, as a batch (a view). */
static nb_sc_batch part_of(const sc_train *t, int k) {
    const sc_window *w = t->win;
    nb_sc_batch b = w->b.b;
    size_t at = (size_t)w->part_at[k];
    b.B = w->part_at[k + 1] - w->part_at[k];
    b.dense += at * (size_t)w->b.nd, b.cat += at * (size_t)w->b.nc, b.target += at, b.hist += at * b.hist_stride;
    b.hist_len += at, b.label += at;
    if (b.mv) b.mv += at * (size_t)w->b.mw, b.mv_len += at * (size_t)w->b.nmv;
    return b;
}

static void log_samples(sc_train *t, int k) {
    long step = t->next_u / t->M;
    for (int i = t->win->part_at[k]; i < t->win->part_at[k + 1]; i++)
        fprintf(t->samples_log, "%ld %d %d %d\n", step, t->run->rank, k, t->win->idx[i]);
    fflush(t->samples_log);
}

/* The next part (this rank's slice of the global batch, cut into the window's parts): the samples
 * at a window's first part (NestPipe's stage 1, prefetch), then the model's index lists and, when
 * sharded, the routing of its keys to their owners (stage 3; host work, timed). */
static void prefetch(sc_train *t) {
    NB_ASSERT(t->nahead < NB_SC_RING);
    int k = (int)(t->next_u % t->M);
    double t0 = nb_now(), read_s = 0;
    if (k == 0) read_s = nb_seqctr_next_window(t)->fill_s;
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
    *a = (sc_ahead){t->win->pos, t1 - t0, read_s, t4 - t1, t3 - t2, t4 - t3, t->m.stage_dedup_s,
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
        t->host.samples += t->ahead[0].fill_s, t->host.read += t->ahead[0].read_s, t->host.prep += t->ahead[0].prep_s;
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

