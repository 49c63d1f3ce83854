/* Frozen-Window Pipelining (NestPipe, --micro-batches M): a rank's batch is a window of M parts
 * trained one after another on one frozen embedding state. Each part fetches its rows like a
 * batch (and, under --schedule pipe, while the part before it trains); the owners keep the
 * window's requests part-major, sum each row's gradients over every part and asker once the last
 * part's gradients are in, and update the tables once: the parts never see each other's updates,
 * so none of their rows goes stale inside a window, and only a window's first part can collide
 * with the window before it (resync.c). Key-centric clustering (--cluster-keys,
 * data/ctr_source.c nb_ctr_cluster_keys) cuts the window into parts that share hot keys. */
#include "core.h"
#include "emb/emb.h"
#include "ops/ops_ctr.h"

/* A window's lists for up to parts * max_served rows (host, and the device's copies). */
static void layout_window(nb_emb *e, nb_emb_window *w) {
    size_t NW = e->max_window;
    w->part_base = nb_arena_take(e->hostar, (size_t)e->nparts * sizeof(size_t));
    w->h_serve = nb_arena_take(e->hostar, NW * sizeof(int64_t));
    w->h_off = nb_arena_take(e->pin, NW * sizeof(int64_t));
    w->h_own = nb_arena_take(e->pin, NW * sizeof(int64_t));
    w->h_order = nb_arena_take(e->pin, NW * sizeof(int32_t));
    w->h_seg = nb_arena_take(e->pin, (NW + 1) * sizeof(int32_t));
    w->h_inverse = nb_arena_take(e->hostar, NW * sizeof(int32_t));
    w->h_keys = nb_arena_take(e->hostar, 2 * NW * sizeof(uint64_t));
    if (e->on_cpu) {
        w->d_off = w->h_off, w->d_own = w->h_own, w->d_order = w->h_order, w->d_seg = w->h_seg;
        return;
    }
    w->d_off = nb_arena_take(e->dev, NW * sizeof(int64_t));
    w->d_own = nb_arena_take(e->dev, NW * sizeof(int64_t));
    w->d_order = nb_arena_take(e->dev, NW * sizeof(int32_t));
    w->d_seg = nb_arena_take(e->dev, (NW + 1) * sizeof(int32_t));
}

void nb_emb_layout_windows(nb_emb *e) {
    if (!nb_emb_sharded(e)) return;
    for (int k = 0; k < NB_EMB_RING; k++) layout_window(e, &e->wins[k]);
}

void nb_emb_window_join(nb_emb *e, nb_emb_batch *x, int part, int nparts) {
    (void)nparts;
    if (part == 0) { /* a window begins with its first part */
        e->prev_win = e->cur_win;
        e->cur_win = &e->wins[e->wring];
        e->wring = (e->wring + 1) % NB_EMB_RING;
        e->cur_win->parts_done = e->cur_win->complete = 0;
        e->cur_win->n = 0;
    }
    NB_CHECK(e->cur_win && e->cur_win->parts_done == part, "this is a bug in nobubble; please report it",
             "seqctr: part %d prepared out of order", part);
    x->win = e->cur_win, x->prev_win = e->prev_win;
}

/* After the window's last part: the owner's sums per row over every part and asker, in (part,
 * rank) order. */
void nb_emb_window_add(nb_emb *e, nb_emb_batch *x) {
    nb_emb_window *w = x->win;
    int64_t E = e->E;
    NB_CHECK(w->n + (size_t)x->nserve <= e->max_window, "this is a bug in nobubble; please report it",
             "seqctr: a window's rows exceed the %zu planned", e->max_window);
    w->part_base[x->part] = w->n;
    size_t at = w->n;
#pragma omp parallel for schedule(static) if (x->nserve >= 65536)
    for (int i = 0; i < x->nserve; i++) w->h_serve[at + i] = x->h_serve[i], w->h_off[at + i] = (int64_t)(at + i) * E;
    w->n += (size_t)x->nserve;
    w->parts_done++;
    e->window_dedup_s = 0;
    if (x->part + 1 < x->nparts) return;
    double t0 = nb_now();
    w->nown = nb_embag_unique_groups(w->h_own, w->h_order, w->h_seg, w->h_inverse, w->h_serve, (int)w->n, w->h_keys);
    e->window_dedup_s = nb_now() - t0;
    w->complete = 1;
}

int nb_emb_window_end(const nb_emb_batch *x) { return x->win && x->part + 1 == x->nparts; }
