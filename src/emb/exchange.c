/* A batch's rows from their owners and its gradients back (see emb.h): the ids routed to the
 * owners on the host, the owners' lookups, the all-to-alls on the comm lane, the owners' sums in
 * rank order, the sparse update. */
#include <string.h>

#include "comm/comm.h"
#include "core.h"
#include "emb/emb.h"
#include "ops/backend.h"
#include "ops/backend_ctr.h"

void nb_emb_ask(nb_emb *e, int slot, const int64_t *uniq, int nuniq, const int32_t *inverse, int64_t *rows,
                size_t nlookups) {
    nb_emb_batch *s = &e->batch[slot];
    int N = e->shard.world, sh = e->shift;
    int64_t mask = e->stride - 1;
    for (int j = 0; j < N; j++) s->asked[j] = 0;
    for (int u = 0; u < nuniq; u++) s->asked[uniq[u] >> sh]++;
#pragma omp parallel for schedule(static) if (nuniq >= 65536)
    for (int u = 0; u < nuniq; u++) s->h_ask[u] = uniq[u] & mask;
    for (int j = 0, at = 0; j < N; at += (int)s->asked[j], j++) s->asked_displ[j] = (size_t)at;
#pragma omp parallel for schedule(static) if (nlookups >= 65536)
    for (size_t i = 0; i < nlookups; i++) rows[i] = inverse[i];
}

void nb_emb_asked(const nb_emb *e, const int64_t **ids, const size_t **asked) {
    NB_ASSERT(nb_emb_sharded(e) && e->latest >= 0);
    *ids = e->batch[e->latest].h_ask;
    *asked = e->batch[e->latest].asked;
}

void nb_emb_serve(nb_emb *e, const int64_t *ids, const size_t *served) {
    NB_ASSERT(nb_emb_sharded(e) && e->latest >= 0);
    nb_emb_batch *s = &e->batch[e->latest];
    size_t n = 0;
    for (int j = 0; j < e->shard.world; j++) s->served_displ[j] = n, s->served[j] = served[j], n += served[j];
    NB_CHECK(n <= e->max_served, "this is a bug in nobubble; please report it",
             "rank %d is asked for %zu rows, more than the %zu planned", e->shard.rank, n, e->max_served);
    int64_t E = e->E, rows = e->rows;
    size_t bad = n; /* the first id outside the shard, checked after the copy (a part serves ~10^5 rows) */
#pragma omp parallel for schedule(static) reduction(min : bad) if (n >= 65536)
    for (size_t i = 0; i < n; i++) {
        if ((ids[i] < 0 || ids[i] >= rows) && i < bad) bad = i;
        s->h_serve[i] = ids[i];
        s->h_serve_off[i] = (int64_t)i * E;
    }
    NB_CHECK(bad == n, "the ranks disagree on the tables: start every rank with the same flags and data",
             "rank %d is asked for row %lld of its shard, which has %lld rows", e->shard.rank,
             (long long)(bad < n ? ids[bad] : 0), (long long)rows);
    s->nserve = (int)n;
    if (e->latest == NB_EMB_RING) return; /* evaluation: lookups only */
    nb_emb_window_add(e, s);
    if (e->pipelined) nb_emb_find_collisions(e, s);
}

void nb_emb_route_ids(nb_emb *e) {
    nb_emb_route *t = &e->route;
    int N = e->shard.world, me = e->shard.rank;
    const int64_t *ids;
    const size_t *asked;
    nb_emb_asked(e, &ids, &asked);
    nb_comm_all_gather_host(asked, t->all_asked, (size_t)N * sizeof(size_t), "rows asked");
    size_t a = 0, b = 0;
    for (int j = 0; j < N; j++) {
        t->served[j] = t->all_asked[(size_t)j * N + me];
        t->asked_displ[j] = a, t->served_displ[j] = b;
        a += asked[j], b += t->served[j];
    }
    NB_CHECK(b <= e->max_served, "this is a bug in nobubble; please report it", "rank %d is asked for %zu rows (%zu planned)",
             me, b, e->max_served);
    nb_comm_all_to_all_v_host(ids, asked, t->asked_displ, t->recv_ids, t->served, t->served_displ, sizeof(int64_t),
                              "row ids");
    nb_emb_serve(e, t->recv_ids, t->served);
}

static int slot_of(const nb_emb *e, int which) {
    return which == NB_EMB_CURRENT ? e->cur : which == NB_EMB_NEXT ? e->next : e->latest;
}

void nb_emb_exchange_of(const nb_emb *e, int which, float *uniq_grads, nb_emb_exchange *x) {
    int slot = slot_of(e, which);
    NB_ASSERT(nb_emb_sharded(e) && slot >= 0);
    const nb_emb_batch *s = &e->batch[slot];
    /* a part's gradients land in its window's block of the gradient buffer */
    float *grads_in = e->d_serve_grads + (s->win ? s->win->part_base[s->part] * (size_t)e->E : 0);
    *x = (nb_emb_exchange){e->d_serve_rows, s->work, uniq_grads, grads_in, e->d_resync_rows, e->d_resync_in,
                           s->asked, s->asked_displ, s->served, s->served_displ,
                           s->resync_out, s->resync_out_displ, s->resync_in, s->resync_in_displ,
                           e->d_excl_in, s->excl_out, s->excl_out_displ, s->excl_in, s->excl_in_displ};
}

/* The count arrays of an all-to-all in elements (rows * E): send_counts | send_displs |
 * recv_counts | recv_displs, each [world]. */
static const size_t *element_counts(nb_emb *e, const size_t *sc, const size_t *sd, const size_t *rc, const size_t *rd) {
    int N = e->shard.world;
    size_t E = (size_t)e->E, *cnt = e->route.cnt;
    for (int j = 0; j < N; j++) cnt[j] = sc[j] * E, cnt[N + j] = sd[j] * E, cnt[2 * N + j] = rc[j] * E, cnt[3 * N + j] = rd[j] * E;
    return cnt;
}

static void all_to_all_on(nb_comm *comm, int N, nb_lane *lane, const void *send, void *recv, const size_t *cnt,
                          const char *name) {
    nb_comm_wait(comm, nb_lane_mark(lane));
    /* joined: later marks of the lane (the next lane's waits, the step's end) cover the exchange */
    nb_lane_join(lane, nb_comm_all_to_all_v(comm, send, cnt, cnt + N, recv, cnt + 2 * N, cnt + 3 * N, NB_COMM_F32, name),
                 "wait all-to-all");
}

void nb_emb_all_to_all(nb_emb *e, nb_comm *comm, nb_lane *lane, int what, float *uniq_grads) {
    int N = e->shard.world;
    nb_emb_exchange x;
    switch (what) {
    case NB_EMB_ROWS: /* the owners' rows to the ranks that asked, into the batch's work buffer */
        nb_emb_exchange_of(e, NB_EMB_CURRENT, uniq_grads, &x);
        all_to_all_on(comm, N, lane, x.serve_rows, x.work, element_counts(e, x.served, x.served_displ, x.asked, x.asked_displ),
                      "rows all-to-all");
        break;
    case NB_EMB_GRADS: /* each unique row's gradient to its owner */
        nb_emb_exchange_of(e, NB_EMB_CURRENT, uniq_grads, &x);
        all_to_all_on(comm, N, lane, x.uniq_grads, x.serve_grads,
                      element_counts(e, x.asked, x.asked_displ, x.served, x.served_displ), "grads all-to-all");
        break;
    case NB_EMB_ROWS_NEXT: /* pipelined: the next batch's rows, fetched while the step trains */
        if (e->next < 0) return;
        nb_emb_exchange_of(e, NB_EMB_NEXT, uniq_grads, &x);
        if (e->priority) { /* the exclusive rows only: the collision rows come after the step's update */
            all_to_all_on(comm, N, lane, x.serve_rows, x.excl_in,
                          element_counts(e, x.excl_out, x.excl_out_displ, x.excl_inn, x.excl_in_displ),
                          "exclusive rows all-to-all (next)");
            return;
        }
        all_to_all_on(comm, N, lane, x.serve_rows, x.work, element_counts(e, x.served, x.served_displ, x.asked, x.asked_displ),
                      "rows all-to-all (next)");
        break;
    case NB_EMB_RESYNC: /* pipelined, after the step's update: the next batch's rows that it changed, again */
        if (e->next < 0 || e->skip_resync) return;
        nb_emb_exchange_of(e, NB_EMB_NEXT, uniq_grads, &x);
        all_to_all_on(comm, N, lane, x.resync_rows, x.resync_in,
                      element_counts(e, x.resync_out, x.resync_out_displ, x.resync_inn, x.resync_in_displ), "resync all-to-all");
        break;
    default: NB_ASSERT(!"not an embedding all-to-all");
    }
}

void nb_emb_upload(nb_emb *e, nb_ctx c, int slot) {
    if (e->on_cpu || !nb_emb_sharded(e)) return;
    const nb_backend_i *be = e->be;
    const nb_emb_batch *s = &e->batch[slot];
    size_t ns = (size_t)s->nserve;
    be->to_backend(c, s->d_serve, s->h_serve, ns * sizeof(int64_t));
    be->to_backend(c, s->d_serve_off, s->h_serve_off, ns * sizeof(int64_t));
    if (nb_emb_window_end(s)) { /* the window's sums and update, read after this part's backward */
        const nb_emb_window *w = s->win;
        be->to_backend(c, w->d_off, w->h_off, w->n * sizeof(int64_t));
        be->to_backend(c, w->d_own, w->h_own, (size_t)w->nown * sizeof(int64_t));
        be->to_backend(c, w->d_order, w->h_order, w->n * sizeof(int32_t));
        be->to_backend(c, w->d_seg, w->h_seg, ((size_t)w->nown + 1) * sizeof(int32_t));
    }
    if (!e->pipelined) return;
    be->to_backend(c, s->d_resync_src, s->h_resync_src, (size_t)s->nresync_out * sizeof(int64_t));
    be->to_backend(c, s->d_resync_dst, s->h_resync_dst, (size_t)s->nresync_in * sizeof(int64_t));
    if (!e->priority) return;
    be->to_backend(c, s->d_excl_src, s->h_excl_src, (size_t)s->nexcl_out * sizeof(int64_t));
    be->to_backend(c, s->d_excl_dst, s->h_excl_dst, (size_t)s->nexcl_in * sizeof(int64_t));
}

/* With --emb-priority ahead, the exclusive rows packed: the offsets j * E of the served list serve
 * as theirs. */
void nb_emb_serve_rows(nb_emb *e, nb_ctx c, int slot, int ahead) {
    const nb_emb_batch *s = &e->batch[slot];
    int excl = ahead && e->priority, n = excl ? s->nexcl_out : s->nserve;
    const int64_t *rows = excl ? s->d_excl_src : s->d_serve;
    nb_ctr_ops_f32_for(e->be)->emb_gather(c, e->d_serve_rows, s->d_serve_off, e->d_table, rows, n, e->E);
}

void nb_emb_sum(nb_emb *e, nb_ctx c) {
    const nb_emb_batch *s = &e->batch[e->cur];
    if (!nb_emb_window_end(s)) return;
    const nb_emb_window *w = s->win;
    nb_ctr_ops_f32_for(e->be)->emb_grad_unique(c, e->d_own_grads, e->d_serve_grads, w->d_off, w->d_order, w->d_seg, NULL,
                                               w->nown, (int)w->n, e->E);
}

void nb_emb_update(nb_emb *e, nb_ctx c, const nb_emb_optim *o, int t, const int64_t *uniq, const float *grads,
                   const int32_t *dcount, int n) {
    const nb_ctr_ops_i *co = e->co;
    int E = e->E;
    if (nb_emb_sharded(e)) { /* once per window: the owner's rows, their summed gradients (host tables: over the bus) */
        const nb_emb_batch *s = &e->batch[e->cur];
        if (!nb_emb_window_end(s)) return;
        uniq = s->win->d_own, grads = e->d_own_grads, dcount = NULL, n = s->win->nown;
    } else {
        NB_CHECK(o->adam ? e->d_avg != NULL : o->exact ? e->d_avg_sq != NULL : e->d_acc != NULL,
                 "this is a bug in nobubble; please report it", "%s without its planned state",
                 o->adam ? "sparse Adam" : o->exact ? "element-wise Adagrad" : "Adagrad");
    }
    if (o->exact)
        co->exact_adagrad(c, e->d_table, e->d_avg_sq, uniq, grads, dcount, n, E, o->lr, o->eps);
    else if (o->adam)
        co->sparse_adam(c, e->d_table, e->d_avg, e->d_avg_sq, uniq, grads, dcount, n, E, o->lr, o->beta1, o->beta2, o->eps, t);
    else
        co->rowwise_adagrad(c, e->d_table, e->d_acc, uniq, grads, dcount, n, E, o->lr, o->eps);
}
