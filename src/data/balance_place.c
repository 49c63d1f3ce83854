#include "data/balance_place.h"

#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "core.h"

static int balanced(const nb_balance_placer *p) { return p->bal.kind != NB_BALANCE_NONE || p->per_rank > 1; }

void nb_balance_placer_init(nb_balance_placer *p, const nb_balance *bal, int Bg, int world, int rank, int per_rank, int max_len,
                            const nb_sc_config *shape) {
    memset(p, 0, sizeof *p);
    NB_ASSERT(world >= 1 && per_rank >= 1 && (world == 1 || per_rank == 1) && Bg % world == 0);
    p->bal = *bal, p->Bg = Bg, p->world = world, p->rank = rank, p->per_rank = per_rank;
    p->shares = world * per_rank, p->Bl = Bg / world;
    p->cap = nb_balance_cap(bal, Bg, p->shares);
    if (!balanced(p)) return;
    p->len = nb_malloc((size_t)Bg * sizeof *p->len, "the balance plan");
    p->share_of = nb_malloc((size_t)Bg * sizeof(int), "the balance plan");
    p->order = nb_malloc((size_t)Bg * sizeof(int), "the balance plan");
    p->count = nb_malloc((size_t)p->shares * sizeof(int), "the balance plan");
    p->first = nb_malloc((size_t)(p->shares + 1) * sizeof(int), "the balance plan");
    p->scratch = nb_malloc(nb_balance_scratch_bytes(Bg, p->shares), "the balance plan");
    nb_ctr_batch_alloc(&p->read, p->Bl, max_len, shape->ndense, shape->ncat);
    nb_ctr_batch_alloc_mv(&p->read, p->Bl, shape); /* before the words of a packed sample are counted */
    if (world > 1) {
        size_t most = (size_t)(p->cap > p->Bl ? p->cap : p->Bl) * nb_ctr_packed_words(&p->read, max_len);
        p->send = nb_malloc(most * sizeof(uint32_t), "the samples' all-to-all");
        p->recv = nb_malloc(most * sizeof(uint32_t), "the samples' all-to-all");
        p->cnt = nb_malloc(4 * (size_t)world * sizeof(size_t), "the samples' all-to-all");
    }
}

void nb_balance_placer_free(nb_balance_placer *p) {
    free(p->len), free(p->share_of), free(p->order), free(p->count), free(p->first), free(p->scratch);
    if (p->read.dense) nb_ctr_batch_free(&p->read);
    free(p->send), free(p->recv), free(p->cnt);
    memset(p, 0, sizeof *p);
}

int nb_balance_placer_local(const nb_balance_placer *p) { return p->world == 1 || !balanced(p); }

int nb_balance_placer_window_cap(const nb_balance_placer *p) {
    if (p->per_rank > 1) return p->Bg; /* every emulated rank's share */
    return p->bal.kind == NB_BALANCE_VBS ? p->cap : p->Bl;
}

/* The ranks' slices' lengths, then the plan (the same on every rank). */
static void plan(nb_balance_placer *p, int min_count) {
    if (p->world > 1)
        nb_comm_all_gather_host(p->read.len, p->len, (size_t)p->Bl * sizeof(int32_t), "history lengths");
    else
        memcpy(p->len, p->read.len, (size_t)p->Bg * sizeof(int32_t));
    nb_balance_assign(&p->bal, p->len, p->Bg, p->shares, min_count, p->share_of, p->count, p->scratch);
}

/* Every sample to its rank: counts from the plan (every rank knows every length), blocks in rank
 * order and data order within, so the window comes out in data order. */
static int exchange(nb_balance_placer *p, nb_ctr_batch *win, int *idx) {
    int N = p->world, me = p->rank;
    size_t *scnt = p->cnt, *sdsp = p->cnt + N, *rcnt = p->cnt + 2 * N, *rdsp = p->cnt + 3 * N, at = 0;
    for (int j = 0; j < N; j++) {
        sdsp[j] = at;
        for (int i = 0; i < p->Bl; i++) {
            int g = me * p->Bl + i;
            if (p->share_of[g] == j) at += nb_ctr_pack(&p->read, i, (uint32_t)g, p->send + at);
        }
        scnt[j] = at - sdsp[j];
    }
    at = 0;
    for (int k = 0; k < N; k++) {
        rdsp[k] = at;
        for (int g = k * p->Bl; g < (k + 1) * p->Bl; g++)
            if (p->share_of[g] == me) at += nb_ctr_packed_words(&p->read, p->len[g]);
        rcnt[k] = at - rdsp[k];
    }
    nb_comm_all_to_all_v_host(p->send, scnt, sdsp, p->recv, rcnt, rdsp, sizeof(uint32_t), "samples");
    int n = 0;
    for (size_t w = 0; w < at; n++) {
        uint32_t g;
        w += nb_ctr_unpack(win, n, p->recv + w, at - w, &g);
        idx[n] = (int)g;
    }
    NB_CHECK(n == p->count[me], "this is a bug in nobubble; please report it", "rank %d received %d samples, the plan gives it %d",
             me, n, p->count[me]);
    return n;
}

void nb_balance_place(nb_balance_placer *p, nb_ctr_source *src, nb_ctr_batch *win, int *idx, int *share_first, int min_count) {
    int first = p->rank * p->Bl;
    if (!balanced(p)) { /* the data order: rank r trains the r-th slice */
        nb_ctr_fill_train_slice(src, win, p->Bg, first, p->Bl);
        for (int i = 0; i < p->Bl; i++) idx[i] = first + i;
        share_first[0] = 0, share_first[1] = p->Bl;
        return;
    }
    nb_ctr_fill_train_slice(src, &p->read, p->Bg, first, p->Bl);
    plan(p, min_count);
    if (p->world > 1) {
        win->b.B = exchange(p, win, idx);
        share_first[0] = 0, share_first[1] = win->b.B;
        return;
    }
    nb_balance_order(p->share_of, p->Bg, p->shares, p->order, p->first, p->scratch);
    for (int k = 0; k < p->Bg; k++) nb_ctr_batch_copy(win, k, &p->read, p->order[k]), idx[k] = p->order[k];
    win->b.B = p->Bg;
    memcpy(share_first, p->first, (size_t)(p->shares + 1) * sizeof(int));
}
