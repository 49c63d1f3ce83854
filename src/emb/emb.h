/* Embedding tables, whole or sharded row-wise over ranks: where their rows live, how a batch gets
 * the rows it reads and gives back their gradients, and the ring of batches in flight that
 * NestPipe pipelines. A model (model/seqctr) builds a batch's lookup lists and reads rows by
 * them; everything about owners, exchanges and placement is here.
 *
 *   emb.c       the tables and their optimizer state (--emb-place: device or pinned host memory),
 *               the shard geometry (row g on rank g % world), the memory plan, the ring of
 *               batches in flight (the step's, the next one, the one being prepared)
 *   exchange.c  a batch's rows from their owners and its gradients back: the ids routed to the
 *               owners (host collectives), the owners' lookups, the rows and gradients
 *               all-to-alls on the comm lane, the owners' sums per row in rank order, the update
 *   window.c    Frozen-Window Pipelining (NestPipe, --micro-batches): the parts of a window read
 *               one frozen embedding state; the owners sum the window's gradients and update once
 *   resync.c    staleness-free pipelining (NestPipe's dual buffer): the next batch's rows that the
 *               step's update changes are sent again after it; --emb-priority (FreeScale): only
 *               the other (exclusive) rows move ahead, the collision rows after the update
 *
 * Row-wise sharding (--emb-shard row): global row g (table offset + row) lives on rank g % world,
 * at row g / world of that rank's shard. A batch asks each owner for its unique rows (host:
 * nb_emb_asked, then nb_emb_serve with what the other ranks asked of this one), the owner looks
 * them up (nb_emb_serve_rows), the rows all-to-all moves them into the batch's work buffer (the
 * batch reads its lookups from there); backward sends each unique row's gradient back to its
 * owner, which sums what it got per row in rank order (nb_emb_sum) and updates its rows
 * (nb_emb_update). world 1 is a shard of everything: the same path with copies. */
#ifndef NB_EMB_H
#define NB_EMB_H

#include <stddef.h>
#include <stdint.h>

#include "lanes/lanes.h"
#include "ops/backend.h"
#include "tensor.h"

struct nb_ctr_ops_i;
struct nb_comm;

/* Training batches in flight: the step's (the active buffer), the next one (the prefetch buffer,
 * filled while the step trains) and the one the host prepares; slot NB_EMB_RING is the
 * evaluation batch's, outside the ring. */
#define NB_EMB_RING 3
enum { NB_EMB_CURRENT = 0, NB_EMB_NEXT = 1, NB_EMB_LATEST = 2 }; /* which batch: nb_emb_exchange_of */
/* the tables' optimizer: row-wise Adagrad, lazy sparse Adam, element-wise Adagrad (its sums in avg_sq) */
enum { NB_EMB_ADAGRAD = 0, NB_EMB_ADAM = 1, NB_EMB_ADAGRAD_EXACT = 2 };

typedef struct {
    int world, rank;
} nb_emb_shard;

typedef struct {
    int opt;            /* NB_EMB_ADAGRAD, NB_EMB_ADAM, NB_EMB_ADAGRAD_EXACT, or -1: state for every one */
    nb_emb_shard shard; /* world 0: the tables whole on this rank */
    /* sharded, for a schedule that fetches the next batch's rows while this one trains: every
     * batch of the ring keeps its own device lists and work buffer, and the rows a batch shares
     * with the batch before it are re-synced after that one's update (resync.c) */
    int pipelined;
    /* --emb-place host: the tables (sharded: this rank's shard) and their optimizer state in
     * pinned host memory; the device's own kernels read and update them in place over the bus */
    int host;
    int parts;    /* sharded: batches come in windows of this many parts (window.c); 0, 1: none */
    int priority; /* pipelined, --emb-priority: collision rows after the update (resync.c) */
} nb_emb_opts;

/* The buffers and row counts of a batch's all-to-alls (rows asked of / served to rank j,
 * starting at the displacement: multiply by E for floats). Rows: serve_rows (this owner's
 * lookups, asker blocks) -> work (the batch's unique rows, owner blocks). Gradients: uniq_grads
 * (owner blocks) -> serve_grads (asker blocks). Pipelined, the re-sync of the rows the batch
 * before this one updates: resync_rows (this owner's, asker blocks) -> resync_in (owner blocks),
 * then scattered into work. --emb-priority: the next batch's exclusive rows (owner serve_rows,
 * packed -> excl_in, then nb_emb_fetch_apply scatters them into work). */
typedef struct {
    float *serve_rows, *work, *uniq_grads, *serve_grads, *resync_rows, *resync_in;
    const size_t *asked, *asked_displ, *served, *served_displ;
    const size_t *resync_out, *resync_out_displ, *resync_inn, *resync_in_displ;
    float *excl_in;
    const size_t *excl_out, *excl_out_displ, *excl_inn, *excl_in_displ;
} nb_emb_exchange;

/* A window's owner side (window.c): the rows the askers asked of this owner in each of its parts
 * (part-major, then asker rank), their gradients' sums per row in that order, and the rows the
 * window's single update touches. Windows go round a ring like the batches. */
typedef struct nb_emb_window {
    int parts_done, complete;
    size_t n, *part_base; /* served rows so far; part k's block starts at part_base[k] */
    int64_t *h_serve, *h_off, *h_own;
    int32_t *h_order, *h_seg, *h_inverse;
    uint64_t *h_keys;
    int nown;
    int64_t *d_off, *d_own;
    int32_t *d_order, *d_seg;
} nb_emb_window;

/* A batch's side of the exchange: host lists and their backend copies (shared by the slots on a
 * device unless pipelined; the host arrays themselves on the CPU). */
typedef struct {
    /* the batch is part `part` of `nparts` of a window (--micro-batches: parts share one frozen
     * embedding state; the tables change once, after the last part); the eval slot has none */
    int part, nparts;
    nb_emb_window *win, *prev_win;
    /* rows asked of each owner (ids: the batch's unique rows as local rows, owner blocks), rows
     * other ranks ask of this one (asker blocks) with their offsets j * E */
    size_t *asked, *asked_displ, *served, *served_displ; /* [world] */
    int64_t *h_ask, *h_serve, *h_serve_off;
    int nserve;
    int64_t *d_serve, *d_serve_off;
    float *work; /* [lookups, E] the batch's unique rows (owner blocks), as the rows all-to-all left them */
    /* pipelined: the served rows the window before updates (owner: its local rows, their
     * positions in the asker's block, per asker), and where the re-sent rows go (asker: work
     * offsets) */
    size_t *resync_out, *resync_out_displ, *resync_in, *resync_in_displ; /* [world] */
    int64_t *h_resync_src, *h_resync_pos, *h_resync_dst;
    int nresync_out, nresync_in;
    int64_t *d_resync_src, *d_resync_dst;
    /* --emb-priority: owner: the exclusive rows per asker (local rows); asker: where they go in work */
    size_t *excl_out, *excl_out_displ, *excl_in, *excl_in_displ; /* [world] */
    int64_t *h_excl_src, *h_excl_dst, *d_excl_src, *d_excl_dst;
    int nexcl_out, nexcl_in;
} nb_emb_batch;

/* The host scratch of the id and collision routing (host collectives). */
typedef struct {
    size_t *all_asked;                                 /* [world * world]: rank j asks rank k at j * world + k */
    size_t *served, *asked_displ, *served_displ, *cnt; /* [world] each; cnt [4 * world] */
    int64_t *recv_ids;                                 /* [max_served] */
    size_t *resync_cnt;                                /* [world * world] */
    size_t *resync_in, *resync_in_displ, *resync_out_displ; /* [world] each */
    int64_t *resync_pos;                                    /* [max lookups] */
} nb_emb_route;

typedef struct nb_emb {
    int E;
    int64_t total;          /* rows of every table together (global rows 0 .. total-1) */
    int64_t rows;           /* rows held here: total, or the shard's */
    nb_emb_shard shard;     /* world 0: not sharded */
    int64_t stride;         /* 2^shift >= ceil(total / world): owner-major key = owner * stride + row */
    int shift;
    size_t max_lookups;     /* lookups of one batch (the model's bound) */
    size_t max_served;      /* rows one batch may ask of this owner */
    size_t max_window;      /* rows one window (its parts) may ask of this owner */
    int nparts, pipelined, priority, host, opt;
    int skip_resync;        /* debug: leave the collision rows stale (a test shows the results then differ) */
    int on_cpu;
    const struct nb_backend_i *be;
    const struct nb_ctr_ops_i *co;
    struct nb_arena *dev, *pin, *hostar; /* the model's arenas */
    /* the tables [rows, E] and their optimizer state (as planned: opt), backend and host (on the
     * CPU, and for host tables, the same memory) */
    float *d_table, *table;
    float *d_acc, *d_avg, *d_avg_sq; /* Adagrad sums per row; sparse Adam moments */
    float *acc, *avg, *avg_sq;
    /* sharded: the owner's lookups, the gradients it gets (a window's) and their sums */
    float *d_serve_rows, *d_serve_grads, *d_own_grads;
    float *d_resync_rows, *d_resync_in; /* pipelined: the re-synced rows, sent and received */
    float *d_excl_in;                   /* --emb-priority: the exclusive rows received ahead */
    int64_t *d_iota, *h_iota;           /* pipelined: 0, 1, 2, ... (the received rows' order) */
    uint64_t *own_bits;                 /* pipelined: a bit per shard row (the collision test; zero between uses) */
    /* the ring: slots 0 .. NB_EMB_RING-1 (training), NB_EMB_RING (evaluation) */
    nb_emb_batch batch[NB_EMB_RING + 1];
    int queue[NB_EMB_RING], nqueue, ring;
    int cur, next, latest; /* slots: the step's, the one after it (if prepared), prepared last; -1 none */
    nb_emb_window *wins, *cur_win, *prev_win; /* sharded: windows, a ring */
    int wring;
    nb_emb_route route;
    double window_dedup_s; /* host seconds the last nb_emb_serve spent grouping its window (0 but at a window's end) */
} nb_emb;

/* The optimizer of the rows a step touched: row-wise Adagrad (accumulators start at 0) or, with
 * adam, lazy sparse Adam. */
typedef struct {
    float lr, beta1, beta2, eps;
    int adam;
    int exact; /* element-wise Adagrad (its sums in avg_sq) instead of row-wise */
} nb_emb_optim;

/* ---- emb.c ---- */
/* Plan tables of `total` rows of width E for batches of up to max_lookups lookups; the memory comes
 * from the model's arenas (nb_emb_layout). Fails on an invalid shard. */
void nb_emb_plan(nb_emb *e, const nb_emb_opts *o, int64_t total, int E, size_t max_lookups, const struct nb_backend_i *be,
                 struct nb_arena *dev, struct nb_arena *pin, struct nb_arena *host);
/* The tables' views, then each slot's exchange lists, then the windows (the planning walk and
 * the binding walk take the same bytes in the same order). */
void nb_emb_layout_state(nb_emb *e);
void nb_emb_layout_batch(nb_emb *e, int slot);
void nb_emb_layout_windows(nb_emb *e);
/* Every element of global row g is element g * E + e of one normal sequence (seed): a shard
 * draws its rows' elements, so N ranks start from the tables of one. Resets the ring. */
void nb_emb_init(nb_emb *e, uint64_t seed, nb_ctx c);
void nb_emb_free(nb_emb *e);
/* Host -> backend (tables and optimizer state) and back; nothing to copy on the CPU and for
 * host tables' rows (one copy). */
void nb_emb_to_device(nb_emb *e, nb_ctx c);
void nb_emb_to_host(nb_emb *e, nb_ctx c);
int nb_emb_sharded(const nb_emb *e);
/* The ring. push: the slot of the batch prepared now (part `part` of a window of nparts: the
 * window begins with its first part); pop: the oldest prepared becomes the step's; aside: the
 * evaluation slot becomes the one prepared last (returns what to restore with nb_emb_end_aside). */
int nb_emb_push(nb_emb *e, int part, int nparts);
int nb_emb_pop(nb_emb *e);
int nb_emb_begin_aside(nb_emb *e);
void nb_emb_end_aside(nb_emb *e, int latest);
/* The step's batch is the first part of its window (the eval slot and unsharded batches alike). */
int nb_emb_first_part(const nb_emb *e);
/* Global rows -> owner-major keys (owner * stride + local row), so that the sorted unique rows
 * come grouped by owner, each group in local row order: the order of the rows all-to-all. */
void nb_emb_owner_keys(const nb_emb *e, int64_t *rows, size_t n);
/* The rows the current batch's lookups index: the tables, or (sharded) its work buffer. */
const float *nb_emb_lookup_table(const nb_emb *e);

/* ---- exchange.c ---- */
/* Sharded, the batch prepared last (slot), after its deduplication (uniq: nuniq owner-major keys;
 * inverse: each lookup's unique row): the rows asked of each owner, and each lookup's row in
 * the work buffer into rows[nlookups] (its unique row's position: the rows arrive in unique
 * order). */
void nb_emb_ask(nb_emb *e, int slot, const int64_t *uniq, int nuniq, const int32_t *inverse, int64_t *rows,
                size_t nlookups);
/* The batch prepared last: its rows asked of each owner (ids: local rows, owner blocks). */
void nb_emb_asked(const nb_emb *e, const int64_t **ids, const size_t **asked);
/* The rows the other ranks asked of this one for the batch prepared last (asker blocks in rank
 * order, served[world] counts, as the id all-to-all delivered them): the owner's lookups and the
 * plan of its gradient sums. Fails on a row outside this shard. */
void nb_emb_serve(nb_emb *e, const int64_t *ids, const size_t *served);
/* NestPipe's key routing for the batch prepared last: every rank learns what the others ask of
 * it (the counts, then the ids: host collectives), then nb_emb_serve. */
void nb_emb_route_ids(nb_emb *e);
/* A batch's exchange buffers and counts (which: NB_EMB_CURRENT, _NEXT, _LATEST); uniq_grads: the
 * model's unique rows' gradients (the gradient all-to-all's send buffer). */
void nb_emb_exchange_of(const nb_emb *e, int which, float *uniq_grads, nb_emb_exchange *x);
/* The all-to-alls on the comm lane, which waits for `lane`; `lane` then waits for them. */
enum { NB_EMB_ROWS, NB_EMB_GRADS, NB_EMB_ROWS_NEXT, NB_EMB_RESYNC };
void nb_emb_all_to_all(nb_emb *e, struct nb_comm *comm, nb_lane *lane, int what, float *uniq_grads);
/* The slot's lists to the backend (nothing on the CPU). */
void nb_emb_upload(nb_emb *e, nb_ctx c, int slot);
/* Sharded: the owner's lookups of the slot's batch, fp32 (host tables: read over the bus); ahead:
 * the next batch's while the step trains (with --emb-priority its exclusive rows only). */
void nb_emb_serve_rows(nb_emb *e, nb_ctx c, int slot, int ahead);
/* Sharded, after the gradient all-to-all of a window's last part: each served row's gradient
 * summed over its parts and askers in (part, rank) order. */
void nb_emb_sum(nb_emb *e, nb_ctx c);
/* The optimizer step t on the touched rows: sharded, once per window (the owner's rows and their
 * sums); whole tables, the batch's unique rows (uniq, grads: n rows, or with a device count
 * dcount at most n). */
void nb_emb_update(nb_emb *e, nb_ctx c, const nb_emb_optim *o, int t, const int64_t *uniq, const float *grads,
                   const int32_t *dcount, int n);

/* ---- window.c ---- */
/* Begin the slot's window (its first part) or join the current one. */
void nb_emb_window_join(nb_emb *e, nb_emb_batch *x, int part, int nparts);
/* The window gets the part's served rows; after its last part, the owner's unique rows. */
void nb_emb_window_add(nb_emb *e, nb_emb_batch *x);
/* The current batch is its window's last part (the window's sums and update follow it). */
int nb_emb_window_end(const nb_emb_batch *x);

/* ---- resync.c ---- */
/* Pipelined, after nb_emb_serve: the served rows the previous window updates on this owner. */
void nb_emb_find_collisions(nb_emb *e, nb_emb_batch *x);
/* The owner tells each asker which rows it asked will be re-sent after the update (positions in
 * its request block; host collectives), and the asker plans where they go (nb_emb_set_resync). */
void nb_emb_route_collisions(nb_emb *e);
void nb_emb_collisions(const nb_emb *e, const int64_t **pos, const size_t **counts);
void nb_emb_set_resync(nb_emb *e, const int64_t *pos, const size_t *counts);
/* Pipelined, once the step's update is done: the next batch's collision rows from this owner's
 * updated shard; after their all-to-all, over the stale copies in its work buffer. */
void nb_emb_resync_serve(nb_emb *e, nb_ctx c, int slot);
void nb_emb_resync_apply(nb_emb *e, nb_ctx c, int slot);
/* --emb-priority, after the exclusive rows' all-to-all: into their places in the next batch's work. */
void nb_emb_fetch_apply(nb_emb *e, nb_ctx c, int slot);
/* The step's rows re-synced (pipelined), and moved ahead (--emb-priority; -1 without it). */
int nb_emb_resynced(const nb_emb *e);
int nb_emb_rows_ahead(const nb_emb *e);

#endif
