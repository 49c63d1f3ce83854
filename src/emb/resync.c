/* Staleness-free pipelining (NestPipe's dual-buffer pipelining) and collision-first rows
 * (FreeScale's prioritized embedding updates, --emb-priority).
 *
 * Under --schedule pipe the next batch's rows are fetched while the step trains, so they are read
 * before the step's update. The rows both batches touch (the collisions: found by the owner, who
 * knows which of its rows the window before updates) are looked up again after that update and
 * sent over the stale copies before the next batch reads them; every other row is the same either
 * way, so the result is bitwise the synchronous schedule's. With --emb-priority only the
 * exclusive rows move ahead, packed; the collision rows move only after the update, first on the
 * comm lane, through the same re-sync. */
#include "comm/comm.h"
#include "core.h"
#include "emb/emb.h"
#include "ops/backend.h"
#include "ops/backend_ctr.h"

/* The served rows of x that the window before it updates on this owner (its unique rows):
 * fetched before that update, they are sent again after it. Only a window's first part is
 * fetched before the window before it is done (its later parts are fetched while it trains);
 * a window with nothing before it has none. */
void nb_emb_find_collisions(nb_emb *e, nb_emb_batch *s) {
    const nb_emb_window *prev = s->part == 0 ? s->prev_win : NULL;
    NB_CHECK(!prev || prev->complete, "this is a bug in nobubble; please report it",
             "seqctr: a window's first part planned before the window before it");
    int N = e->shard.world, c = 0;
    uint64_t *bits = e->own_bits; /* the previous window's rows, one bit per row of the shard */
    if (prev)
        for (int u = 0; u < prev->nown; u++) bits[prev->h_own[u] >> 6] |= 1ULL << (prev->h_own[u] & 63);
    int x = 0; /* --emb-priority: the exclusive rows, sent ahead */
    for (int j = 0; j < N; j++) {
        s->resync_out_displ[j] = (size_t)c;
        if (e->priority) s->excl_out_displ[j] = (size_t)x;
        for (size_t q = 0; q < s->served[j]; q++) {
            int64_t row = s->h_serve[s->served_displ[j] + q];
            if (prev && bits[row >> 6] >> (row & 63) & 1) {
                s->h_resync_src[c] = row;
                s->h_resync_pos[c++] = (int64_t)q;
            } else if (e->priority) {
                s->h_excl_src[x++] = row;
            }
        }
        s->resync_out[j] = (size_t)c - s->resync_out_displ[j];
        if (e->priority) s->excl_out[j] = (size_t)x - s->excl_out_displ[j];
    }
    s->nresync_out = c, s->nexcl_out = x;
    if (prev)
        for (int u = 0; u < prev->nown; u++) bits[prev->h_own[u] >> 6] = 0;
}

void nb_emb_collisions(const nb_emb *e, const int64_t **pos, const size_t **counts) {
    NB_ASSERT(e->pipelined && e->latest >= 0);
    *pos = e->batch[e->latest].h_resync_pos;
    *counts = e->batch[e->latest].resync_out;
}

void nb_emb_set_resync(nb_emb *e, const int64_t *pos, const size_t *counts) {
    NB_ASSERT(e->pipelined && e->latest >= 0);
    nb_emb_batch *s = &e->batch[e->latest];
    int64_t E = e->E;
    size_t n = 0;
    for (int j = 0; j < e->shard.world; j++) {
        s->resync_in_displ[j] = n, s->resync_in[j] = counts[j];
        for (size_t q = 0; q < counts[j]; q++, n++) {
            NB_CHECK(pos[n] >= 0 && (size_t)pos[n] < s->asked[j], "this is a bug in nobubble; please report it",
                     "rank %d: owner %d re-syncs position %lld of %zu rows asked", e->shard.rank, j, (long long)pos[n], s->asked[j]);
            s->h_resync_dst[n] = ((int64_t)s->asked_displ[j] + pos[n]) * E;
        }
    }
    s->nresync_in = (int)n;
    if (!e->priority) return;
    size_t x = 0, at = 0;
    for (int j = 0; j < e->shard.world; j++) { /* positions are increasing per owner (nb_emb_find_collisions' order) */
        s->excl_in_displ[j] = x;
        size_t q = 0, end = at + counts[j];
        for (size_t p = 0; p < s->asked[j]; p++) {
            if (at + q < end && (size_t)pos[at + q] == p) {
                q++;
                continue;
            }
            s->h_excl_dst[x++] = ((int64_t)s->asked_displ[j] + (int64_t)p) * E;
        }
        NB_CHECK(q == counts[j], "this is a bug in nobubble; please report it", "rank %d: owner %d's collision positions are not increasing",
                 e->shard.rank, j);
        s->excl_in[j] = x - s->excl_in_displ[j];
        at = end;
    }
    s->nexcl_in = (int)x;
}

/* For a training batch after nb_emb_serve: each owner tells each asker which of the rows it asked
 * for the batch before will update (their positions in its request block). */
void nb_emb_route_collisions(nb_emb *e) {
    nb_emb_route *t = &e->route;
    int N = e->shard.world, me = e->shard.rank;
    const int64_t *pos;
    const size_t *out;
    nb_emb_collisions(e, &pos, &out);
    nb_comm_all_gather_host(out, t->resync_cnt, (size_t)N * sizeof(size_t), "collision rows");
    size_t a = 0, b = 0;
    for (int j = 0; j < N; j++) {
        t->resync_in[j] = t->resync_cnt[(size_t)j * N + me];
        t->resync_out_displ[j] = a, t->resync_in_displ[j] = b;
        a += out[j], b += t->resync_in[j];
    }
    nb_comm_all_to_all_v_host(pos, out, t->resync_out_displ, t->resync_pos, t->resync_in, t->resync_in_displ,
                              sizeof(int64_t), "collision positions");
    nb_emb_set_resync(e, t->resync_pos, t->resync_in);
}

/* The offsets j * E of the served list serve as the re-sent rows'. */
void nb_emb_resync_serve(nb_emb *e, nb_ctx c, int slot) {
    const nb_emb_batch *s = &e->batch[slot];
    if (e->skip_resync || !s->nresync_out) return;
    nb_ctr_ops_f32_for(e->be)->emb_gather(c, e->d_resync_rows, s->d_serve_off, e->d_table, s->d_resync_src, s->nresync_out,
                                          e->E);
}

void nb_emb_resync_apply(nb_emb *e, nb_ctx c, int slot) {
    const nb_emb_batch *s = &e->batch[slot];
    if (e->skip_resync || !s->nresync_in) return;
    nb_ctr_ops_f32_for(e->be)->emb_gather(c, s->work, s->d_resync_dst, e->d_resync_in, e->d_iota, s->nresync_in, e->E);
}

void nb_emb_fetch_apply(nb_emb *e, nb_ctx c, int slot) {
    const nb_emb_batch *s = &e->batch[slot];
    if (!e->priority || !s->nexcl_in) return;
    nb_ctr_ops_f32_for(e->be)->emb_gather(c, s->work, s->d_excl_dst, e->d_excl_in, e->d_iota, s->nexcl_in, e->E);
}

int nb_emb_resynced(const nb_emb *e) { return e->cur >= 0 && e->pipelined ? e->batch[e->cur].nresync_in : 0; }

int nb_emb_rows_ahead(const nb_emb *e) { return e->cur >= 0 && e->priority ? e->batch[e->cur].nexcl_in : -1; }
