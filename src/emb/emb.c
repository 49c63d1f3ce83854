/* Embedding tables: their memory and placement, the shard geometry, the ring of batches in
 * flight (see emb.h). */
#include "emb/emb.h"

#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "ops/backend.h"
#include "ops/backend_ctr.h"
#include "rng.h"

int nb_emb_sharded(const nb_emb *e) { return e->shard.world > 0; }

/* --emb-place host on a device backend: the shard and its optimizer state in host memory, the
 * device's kernels reading and writing them over the bus (on the CPU every table is host memory) */
static int host_tables(const nb_emb *e) { return e->host && !e->on_cpu; }

static void *take(nb_arena *a, size_t bytes) { return nb_arena_take(a, bytes ? bytes : 16); }
static float *F32(nb_emb *e, size_t n) { return take(e->dev, n * sizeof(float)); }

/* A shard's rows and the most rows one batch may ask of it (every rank asks each row once). */
static void plan_shard(nb_emb *e, const nb_emb_shard *shard) {
    if (!shard || shard->world < 1) return;
    int N = shard->world, r = shard->rank;
    NB_CHECK(r >= 0 && r < N, "this is a bug in nobubble; please report it", "shard rank %d of %d", r, N);
    e->shard = *shard;
    /* a power of two, so the hot loops split owner-major keys with a shift and a mask */
    int64_t per = (e->total + N - 1) / N;
    e->shift = 0;
    while (((int64_t)1 << e->shift) < per) e->shift++;
    e->stride = (int64_t)1 << e->shift;
    e->rows = (e->total - r + N - 1) / N; /* rows g < total with g % N == r */
    size_t per_rank = e->max_lookups < (size_t)e->rows ? e->max_lookups : (size_t)e->rows;
    e->max_served = (size_t)N * (per_rank ? per_rank : 1);
    e->max_window = e->max_served * (size_t)e->nparts;
}

/* The host scratch of the id and collision routing. */
static void plan_route(nb_emb *e) {
    nb_emb_route *t = &e->route;
    size_t N = (size_t)e->shard.world;
    t->all_asked = nb_malloc(N * N * sizeof(size_t), "the id exchange");
    t->served = nb_malloc(3 * N * sizeof(size_t), "the id exchange");
    t->asked_displ = t->served + N, t->served_displ = t->served + 2 * N;
    t->cnt = nb_malloc(4 * N * sizeof(size_t), "the id exchange");
    t->recv_ids = nb_malloc(e->max_served * sizeof(int64_t), "the id exchange");
    if (!e->pipelined) return;
    t->resync_cnt = nb_malloc(N * N * sizeof(size_t), "the collision exchange");
    t->resync_in = nb_malloc(3 * N * sizeof(size_t), "the collision exchange");
    t->resync_in_displ = t->resync_in + N, t->resync_out_displ = t->resync_in + 2 * N;
    t->resync_pos = nb_malloc(e->max_lookups * sizeof(int64_t), "the collision exchange");
}

void nb_emb_plan(nb_emb *e, const nb_emb_opts *o, int64_t total, int E, size_t max_lookups, const nb_backend_i *be,
                 nb_arena *dev, nb_arena *pin, nb_arena *host) {
    memset(e, 0, sizeof *e);
    e->E = E, e->total = total, e->rows = total, e->max_lookups = max_lookups;
    e->be = be, e->co = nb_ctr_ops_for(be), e->on_cpu = be->device == NB_DEV_CPU;
    e->dev = dev, e->pin = pin, e->hostar = host;
    e->opt = o->opt;
    e->nparts = o->parts > 1 ? o->parts : 1;
    plan_shard(e, o->shard.world > 0 ? &o->shard : NULL);
    e->pipelined = o->pipelined && nb_emb_sharded(e);
    e->priority = o->priority && e->pipelined;
    e->host = o->host;
    e->cur = 0, e->next = e->latest = -1;
    if (!nb_emb_sharded(e)) return;
    e->wins = nb_calloc(NB_EMB_RING, sizeof(nb_emb_window), "embedding windows");
    plan_route(e);
}

/* The tables, the owner's exchange buffers, the tables' optimizer state (as planned: opt), and
 * their host mirrors on a device. Host tables: pinned host memory, which the device reads and
 * writes in place over the bus (unified addressing maps every pinned allocation), so the owner's
 * lookups, sums and updates are the same kernels as on the device, and no copy or host hop sits
 * between them. */
void nb_emb_layout_state(nb_emb *e) {
    size_t E = (size_t)e->E, rows = (size_t)e->rows, nemb = rows * E, NU = e->max_lookups * E;
    int ht = host_tables(e);
    e->d_table = ht ? take(e->pin, nemb * sizeof(float)) : F32(e, nemb);
    if (nb_emb_sharded(e)) { /* the owner's lookups and the gradients it gets (a window's), their sums */
        size_t NS = e->max_served * E, NW = e->max_window * E;
        e->d_serve_rows = F32(e, NS);
        e->d_serve_grads = F32(e, NW);
        e->d_own_grads = F32(e, NW);
        if (e->pipelined) {
            e->d_resync_rows = F32(e, NS);
            e->d_resync_in = F32(e, NU);
            /* --emb-priority: the exclusive rows land where the re-synced ones will: the pipe
             * schedule applies them (emb lane) before the step's update, which the re-sync follows */
            if (e->priority) e->d_excl_in = e->d_resync_in;
            e->d_iota = take(e->dev, e->max_lookups * sizeof(int64_t));
            e->h_iota = e->on_cpu ? e->d_iota : take(e->pin, e->max_lookups * sizeof(int64_t));
            e->own_bits = take(e->hostar, (rows / 64 + 1) * sizeof(uint64_t));
        }
    }
    nb_arena *w = ht ? e->pin : e->dev;
    int rowwise = e->opt == NB_EMB_ADAGRAD || e->opt < 0, adam = e->opt == NB_EMB_ADAM || e->opt < 0;
    int per_elem = adam || e->opt == NB_EMB_ADAGRAD_EXACT; /* avg_sq: Adam's second moment, or exact Adagrad's sums */
    e->d_acc = rowwise ? take(w, rows * sizeof(float)) : NULL;
    e->d_avg = adam ? take(w, nemb * sizeof(float)) : NULL;
    e->d_avg_sq = per_elem ? take(w, nemb * sizeof(float)) : NULL;
    if (e->on_cpu || ht) { /* one copy */
        e->table = e->d_table, e->acc = e->d_acc, e->avg = e->d_avg, e->avg_sq = e->d_avg_sq;
        return;
    }
    e->table = take(e->hostar, nemb * sizeof(float));
    e->acc = rowwise ? take(e->hostar, rows * sizeof(float)) : NULL;
    e->avg = adam ? take(e->hostar, nemb * sizeof(float)) : NULL;
    e->avg_sq = per_elem ? take(e->hostar, nemb * sizeof(float)) : NULL;
}

/* A slot's exchange lists. The slots share one set of device lists (the copies and every use are
 * ordered on the model's lane), except when pipelined: the next batch's lists are copied in while
 * this one's are read. */
void nb_emb_layout_batch(nb_emb *e, int slot) {
    if (!nb_emb_sharded(e)) return;
    nb_emb_batch *s = &e->batch[slot];
    const nb_emb_batch *dev = slot && !e->pipelined ? &e->batch[0] : NULL;
    size_t N = (size_t)e->shard.world, NLK = e->max_lookups, NS = e->max_served;
    nb_arena *host = e->hostar, *pin = e->pin;
    s->asked = take(host, N * sizeof(size_t));
    s->asked_displ = take(host, N * sizeof(size_t));
    s->served = take(host, N * sizeof(size_t));
    s->served_displ = take(host, N * sizeof(size_t));
    s->h_ask = take(host, NLK * sizeof(int64_t));
    s->h_serve = take(pin, NS * sizeof(int64_t));
    s->h_serve_off = take(pin, NS * sizeof(int64_t));
    s->work = dev ? dev->work : F32(e, NLK * (size_t)e->E);
    if (e->pipelined) {
        s->resync_out = take(host, 4 * N * sizeof(size_t));
        s->resync_out_displ = s->resync_out + N, s->resync_in = s->resync_out + 2 * N, s->resync_in_displ = s->resync_out + 3 * N;
        s->h_resync_src = take(pin, NS * sizeof(int64_t));
        s->h_resync_pos = take(host, NS * sizeof(int64_t));
        s->h_resync_dst = take(pin, NLK * sizeof(int64_t));
        s->d_resync_src = e->on_cpu ? s->h_resync_src : take(e->dev, NS * sizeof(int64_t));
        s->d_resync_dst = e->on_cpu ? s->h_resync_dst : take(e->dev, NLK * sizeof(int64_t));
    }
    if (e->priority) {
        s->excl_out = take(host, 4 * N * sizeof(size_t));
        s->excl_out_displ = s->excl_out + N, s->excl_in = s->excl_out + 2 * N, s->excl_in_displ = s->excl_out + 3 * N;
        s->h_excl_src = take(pin, NS * sizeof(int64_t));
        s->h_excl_dst = take(pin, NLK * sizeof(int64_t));
        s->d_excl_src = e->on_cpu ? s->h_excl_src : take(e->dev, NS * sizeof(int64_t));
        s->d_excl_dst = e->on_cpu ? s->h_excl_dst : take(e->dev, NLK * sizeof(int64_t));
    }
    if (e->on_cpu) {
        s->d_serve = s->h_serve, s->d_serve_off = s->h_serve_off;
    } else if (dev) {
        s->d_serve = dev->d_serve, s->d_serve_off = dev->d_serve_off;
    } else {
        s->d_serve = take(e->dev, NS * sizeof(int64_t));
        s->d_serve_off = take(e->dev, NS * sizeof(int64_t));
    }
}

/* The seeded rows: whole tables are one draw, made by the backend (on a GPU: drawn there with the
 * host's bits, fill.cu), as the transformers' weights are; a shard's rows are every world-th of it. */
static void init_tables(nb_emb *e, uint64_t seed, nb_ctx c) {
    size_t E = (size_t)e->E;
    uint64_t stream = nb_rng_stream_id("emb");
    if (!nb_emb_sharded(e)) {
        e->be->fill_normal(c, e->table, (size_t)e->rows * E, seed, stream, 0.0f, 0.05f);
        return;
    }
    int64_t N = e->shard.world, r = e->shard.rank;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < e->rows; i++) {
        uint64_t g = (uint64_t)(i * N + r);
        for (size_t k = 0; k < E; k++) e->table[(size_t)i * E + k] = 0.0f + 0.05f * nb_rng_normal_at(seed, stream, g * E + k);
    }
}

void nb_emb_init(nb_emb *e, uint64_t seed, nb_ctx c) {
    e->nqueue = 0, e->ring = 0, e->cur = 0, e->next = e->latest = -1;
    e->wring = 0, e->cur_win = e->prev_win = NULL;
    if (e->h_iota) {
        for (size_t i = 0; i < e->max_lookups; i++) e->h_iota[i] = (int64_t)i;
        if (!e->on_cpu) e->be->to_backend(c, e->d_iota, e->h_iota, e->max_lookups * sizeof(int64_t));
    }
    init_tables(e, seed, c);
}

void nb_emb_free(nb_emb *e) {
    nb_emb_route *t = &e->route;
    free(e->wins);
    free(t->all_asked), free(t->served), free(t->cnt), free(t->recv_ids);
    free(t->resync_cnt), free(t->resync_in), free(t->resync_pos);
    memset(e, 0, sizeof *e);
}

/* host <-> backend copies of the tables and their optimizer state */
static void copy_state(nb_emb *e, nb_ctx c, int up) {
    size_t nemb = (size_t)e->rows * (size_t)e->E, rows = (size_t)e->rows;
    float *d[4] = {e->d_table, e->d_acc, e->d_avg, e->d_avg_sq}, *h[4] = {e->table, e->acc, e->avg, e->avg_sq};
    size_t n[4] = {nemb, rows, nemb, nemb};
    for (int k = 0; k < 4; k++) {
        if (!d[k] || d[k] == h[k]) continue; /* host tables: one copy */
        if (up)
            e->be->to_backend(c, d[k], h[k], n[k] * sizeof(float));
        else
            e->be->to_host(c, h[k], d[k], n[k] * sizeof(float));
    }
}

void nb_emb_to_device(nb_emb *e, nb_ctx c) {
    if (!e->on_cpu) copy_state(e, c, 1);
}

void nb_emb_to_host(nb_emb *e, nb_ctx c) {
    if (!e->on_cpu) copy_state(e, c, 0);
}

/* ---- the ring: at most the step's batch, the next one and the one after are in use at a time
 * (a pipelined schedule fetches the next one's rows while the step trains, and the host prepares
 * the one after) ---- */

int nb_emb_push(nb_emb *e, int part, int nparts) {
    NB_CHECK(e->nqueue < NB_EMB_RING - 1, "this is a bug in nobubble; please report it",
             "seqctr: %d batches prepared ahead of the step (at most %d)", e->nqueue + 1, NB_EMB_RING - 1);
    int slot = e->ring;
    e->ring = (e->ring + 1) % NB_EMB_RING;
    nb_emb_batch *x = &e->batch[slot];
    x->part = part, x->nparts = nparts;
    if (nb_emb_sharded(e)) nb_emb_window_join(e, x, part, nparts);
    e->queue[e->nqueue++] = slot;
    e->latest = slot;
    return slot;
}

int nb_emb_pop(nb_emb *e) {
    NB_CHECK(e->nqueue > 0, "call nb_sc_prepare before each forward", "seqctr forward without a prepared batch");
    e->cur = e->queue[0];
    for (int k = 1; k < e->nqueue; k++) e->queue[k - 1] = e->queue[k];
    e->nqueue--;
    e->next = e->nqueue ? e->queue[0] : -1;
    return e->cur;
}

int nb_emb_begin_aside(nb_emb *e) {
    int latest = e->latest;
    e->latest = NB_EMB_RING;
    return latest;
}

void nb_emb_end_aside(nb_emb *e, int latest) { e->latest = latest; }

int nb_emb_first_part(const nb_emb *e) { return e->cur < 0 || e->batch[e->cur].part == 0; }

void nb_emb_owner_keys(const nb_emb *e, int64_t *rows, size_t n) {
    int64_t N = e->shard.world;
    int sh = e->shift;
    if (N == 1) return; /* one owner: the keys are the rows */
#pragma omp parallel for schedule(static) if (n >= 65536)
    for (size_t i = 0; i < n; i++) rows[i] = rows[i] % N << sh | rows[i] / N;
}

const float *nb_emb_lookup_table(const nb_emb *e) { return nb_emb_sharded(e) ? e->batch[e->cur].work : e->d_table; }
