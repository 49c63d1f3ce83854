/* Rank-order collectives on host buffers, built from MPI point-to-point messages.
 *
 * Why not MPI_Allreduce: MPI does not promise the order in which it adds the ranks' values (trees
 * and rings differ by message size and rank count), so neither bitwise equality with one process
 * nor the same bits on every rank is guaranteed. Here every element is summed by ONE rank, from
 * all N contributions in rank order, and that result is sent to the others:
 *   all-reduce = reduce-scatter (rank k receives every rank's slice k and sums it in rank order)
 *                + all-gather (rank k sends its summed slice to every rank).
 * Slices depend only on the element count and N, so the bits do not depend on timing.
 *
 * Why point-to-point for everything: each wait knows which peer it waits for, so a timeout names
 * the rank that died or stalled instead of "a collective timed out". Waits are nonblocking
 * requests polled (MPI_Testsome) against a deadline that restarts whenever data arrives.
 * Messages are pieces of at most piece_bytes (completions pace the waits); every (pair, op) sends
 * at least one message, a zero-byte one for a zero count, so a count that disagrees between two
 * ranks shows as a size mismatch that names both ranks, not as a timeout. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm_internal.h"
#include "core.h"

/* The largest MPI message (nb_hc.piece_bytes). Not larger than this: a wait counts as idle while no
 * request completes, and MPI moves a big message (shared-memory copy-in/out) only while it is
 * polled, so one 35 MB piece let the backoff below sleep between polls: a 70 MB all-reduce of two
 * ranks on one GPU took 195 ms (session 9). 4 MB pieces complete every millisecond or so. */
#define NB_HC_PIECE_BYTES ((size_t)4 << 20)
/* All-reduce and reduce-scatter work in segments of this many bytes (nb_hc.seg_bytes): the
 * scratch that holds the other ranks' slices stays this size whatever the buffer. */
#define NB_HC_SEG_BYTES ((size_t)64 << 20)
#define NB_HC_SUM_BLOCK 1024 /* elements summed through a stack buffer at a time */

#define NB_HC_TIMEOUT_HINT                                                                         \
    "look for an earlier error in that rank's output; if it was only busy (e.g. writing a "       \
    "checkpoint), raise --comm-timeout"

void nb_hc_init(nb_hc *h, void *mpi_comm, int rank, int size, double timeout_s) {
    memset(h, 0, sizeof *h);
    NB_ASSERT(size >= 1 && rank >= 0 && rank < size && timeout_s > 0);
    NB_ASSERT(size == 1 || mpi_comm);
    h->rank = rank;
    h->size = size;
    h->timeout_s = timeout_s;
    h->piece_bytes = NB_HC_PIECE_BYTES;
    h->seg_bytes = NB_HC_SEG_BYTES;
    h->what = "collective";
    h->srcs = nb_malloc((size_t)size * sizeof *h->srcs, "rank-order sum sources");
#ifdef NB_WITH_MPI
    h->comm = mpi_comm ? *(MPI_Comm *)mpi_comm : MPI_COMM_NULL;
#endif
}

void nb_hc_set_sizes(nb_hc *h, size_t seg_bytes, size_t piece_bytes) {
    h->seg_bytes = seg_bytes ? seg_bytes : NB_HC_SEG_BYTES;
    h->piece_bytes = piece_bytes ? piece_bytes : NB_HC_PIECE_BYTES;
}

void nb_comm_set_message_sizes(nb_comm *c, size_t seg_bytes, size_t piece_bytes) {
    nb_hc_set_sizes(&c->hc, seg_bytes, piece_bytes);
#ifdef NB_WITH_CUDA
    nb_comm_ce_set_message_sizes(c->ce, seg_bytes, piece_bytes);
#endif
}

void nb_hc_free(nb_hc *h) {
#ifdef NB_WITH_MPI
    free(h->reqs);
    free(h->stats);
    free(h->done_idx);
#endif
    free(h->meta);
    free(h->scratch);
    free((void *)h->srcs);
    memset(h, 0, sizeof *h);
}

void nb_hc_begin(nb_hc *h, const char *what, const char *label, uint64_t seq) {
    h->what = what;
    h->label = label;
    h->seq = seq;
    h->tag = (int)(seq % 32768); /* MPI_TAG_UB is at least 32767; ops complete one at a time */
}

static void *hc_scratch(nb_hc *h, size_t bytes) {
    if (bytes > h->scratch_cap) {
        free(h->scratch);
        h->scratch = nb_malloc(bytes, "rank-order collective scratch");
        h->scratch_cap = bytes;
    }
    return h->scratch;
}

#ifdef NB_WITH_MPI

/* "rank 2" or "ranks 2, 5, 7" into buf. */
static void rank_list(char *buf, size_t cap, const int *ranks, int n) {
    size_t o = (size_t)snprintf(buf, cap, "rank%s ", n > 1 ? "s" : "");
    for (int i = 0; i < n && o < cap; i++) o += (size_t)snprintf(buf + o, cap - o, "%s%d", i ? ", " : "", ranks[i]);
}

/* " (\"ar L3\")" when the op has a span name, for messages */
static const char *label_of(const nb_hc *h, char *buf, size_t cap) {
    if (!h->label || !h->label[0]) return "";
    snprintf(buf, cap, " (\"%s\")", h->label);
    return buf;
}

static NB_NORETURN void hc_mpi_fail(const nb_hc *h, int rc, const char *call, int peer) {
    char s[MPI_MAX_ERROR_STRING + 1] = "";
    int len = 0;
    if (MPI_Error_string(rc, s, &len) != MPI_SUCCESS) snprintf(s, sizeof s, "MPI error %d", rc);
    char lb[64];
    if (peer >= 0)
        nb_fail("a rank died or the network failed; look for an earlier error from rank that rank",
                "rank %d: %s failed in %s #%llu%s with rank %d: %s", h->rank, call, h->what,
                (unsigned long long)h->seq, label_of(h, lb, sizeof lb), peer, s);
    nb_fail("a rank died or the network failed; look for an earlier error on another rank",
            "rank %d: %s failed in %s #%llu%s: %s", h->rank, call, h->what, (unsigned long long)h->seq,
            label_of(h, lb, sizeof lb), s);
}

static void hc_reserve(nb_hc *h, int more) {
    if (h->nreq + more <= h->cap) return;
    int cap = h->cap ? h->cap : 16;
    while (cap < h->nreq + more) cap *= 2;
    MPI_Request *r = realloc(h->reqs, (size_t)cap * sizeof *r);
    MPI_Status *s = realloc(h->stats, (size_t)cap * sizeof *s);
    int *d = realloc(h->done_idx, (size_t)cap * sizeof *d);
    nb_hc_req *m = realloc(h->meta, (size_t)cap * sizeof *m);
    if (!r || !s || !d || !m) nb_fail("free some host memory", "out of host memory for %d MPI requests", cap);
    h->reqs = r, h->stats = s, h->done_idx = d, h->meta = m, h->cap = cap;
}

/* Post one direction of one logical message to/from peer, cut into pieces. */
static void hc_post(nb_hc *h, int peer, const void *buf, size_t bytes, int is_recv) {
    static char empty;
    NB_ASSERT(peer != h->rank && peer >= 0 && peer < h->size);
    char *p = buf ? (char *)buf : &empty;
    size_t left = bytes;
    do {
        size_t piece = left < h->piece_bytes ? left : h->piece_bytes;
        hc_reserve(h, 1);
        if (h->nreq == 0) h->posted_at = nb_now();
        MPI_Request *rq = &h->reqs[h->nreq];
        int rc = is_recv ? MPI_Irecv(p, (int)piece, MPI_BYTE, peer, h->tag, h->comm, rq)
                         : MPI_Isend(p, (int)piece, MPI_BYTE, peer, h->tag, h->comm, rq);
        if (rc != MPI_SUCCESS) hc_mpi_fail(h, rc, is_recv ? "MPI_Irecv" : "MPI_Isend", peer);
        h->meta[h->nreq++] = (nb_hc_req){.peer = peer, .is_recv = is_recv, .bytes = piece};
        p += piece;
        left -= piece;
    } while (left > 0);
}

static NB_NORETURN void hc_timeout(nb_hc *h) {
    int *recv_from = nb_malloc((size_t)h->size * 2 * sizeof(int), "timeout report");
    int *send_to = recv_from + h->size;
    int nr = 0, ns = 0;
    for (int peer = 0; peer < h->size; peer++) {
        int r = 0, s = 0;
        for (int i = 0; i < h->nreq; i++) {
            if (h->reqs[i] == MPI_REQUEST_NULL || h->meta[i].peer != peer) continue;
            if (h->meta[i].is_recv) r = 1;
            else s = 1;
        }
        if (r) recv_from[nr++] = peer;
        else if (s) send_to[ns++] = peer;
    }
    char who[256], lb[64], own[96] = "";
    if (h->own_stall_s > 0)
        snprintf(own, sizeof own, " (not counting the %.0f s this rank itself was stopped)", h->own_stall_s);
    if (nr > 0) {
        rank_list(who, sizeof who, recv_from, nr);
        nb_fail(NB_HC_TIMEOUT_HINT,
                "rank %d: no data from %s within %g s%s in %s #%llu%s (--comm-timeout): %s died or stalled",
                h->rank, who, h->timeout_s, own, h->what, (unsigned long long)h->seq, label_of(h, lb, sizeof lb), who);
    }
    rank_list(who, sizeof who, send_to, ns);
    nb_fail(NB_HC_TIMEOUT_HINT,
            "rank %d: %s did not take its data within %g s%s in %s #%llu%s (--comm-timeout): %s died or stalled",
            h->rank, who, h->timeout_s, own, h->what, (unsigned long long)h->seq, label_of(h, lb, sizeof lb), who);
}

/* A finished request: its error (if any), and for receives the size the sender sent. */
static void hc_check_done(nb_hc *h, int idx, const MPI_Status *st, int rc_all) {
    const nb_hc_req *m = &h->meta[idx];
    char lb[64];
    if (rc_all == MPI_ERR_IN_STATUS && st->MPI_ERROR != MPI_SUCCESS) {
        if (st->MPI_ERROR == MPI_ERR_TRUNCATE)
            nb_fail("every rank must enqueue the same ops with matching counts (send_counts[j] on rank i "
                    "== recv_counts[i] on rank j)",
                    "rank %d: rank %d sent more than the %zu bytes expected in %s #%llu%s: the ranks' counts "
                    "disagree",
                    h->rank, m->peer, m->bytes, h->what, (unsigned long long)h->seq, label_of(h, lb, sizeof lb));
        hc_mpi_fail(h, st->MPI_ERROR, m->is_recv ? "receive" : "send", m->peer);
    }
    if (!m->is_recv) return;
    int got = 0;
    int rc = MPI_Get_count(st, MPI_BYTE, &got);
    if (rc != MPI_SUCCESS) hc_mpi_fail(h, rc, "MPI_Get_count", m->peer);
    if ((size_t)got != m->bytes)
        nb_fail("every rank must enqueue the same ops with matching counts (send_counts[j] on rank i == "
                "recv_counts[i] on rank j)",
                "rank %d: rank %d sent %d bytes where %zu were expected in %s #%llu%s: the ranks' counts disagree",
                h->rank, m->peer, got, m->bytes, h->what, (unsigned long long)h->seq, label_of(h, lb, sizeof lb));
}

/* Between polls that found nothing, `idle_s` after the last progress: spin for the first 50 us (a
 * message is often microseconds away), then sleep, briefly first, so that waiting ranks leave the
 * cores to compute lanes and to oversubscribed ranks (2 cores, 4 ranks in CI). */
/* Between polls that completed nothing: spin, then yield (a peer a little behind), then sleep (a
 * peer still computing), so that a waiting rank gives its core back without slowing a transfer. */
static void hc_backoff(double idle_s) {
    if (idle_s < 50e-6) return;
    if (idle_s < 5e-3) {
        sched_yield();
        return;
    }
    struct timespec ts = {0, idle_s < 20e-3 ? 20000 : 200000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* A gap between two polls this long means this process did not run (the backoff sleeps at most
 * 0.2 ms): it was stopped (SIGSTOP, a debugger) or the host stalled it. */
#define NB_HC_OWN_STALL_S 1.0

static void hc_wait(nb_hc *h) {
    int left = h->nreq;
    double last = h->posted_at, polled = last;
    h->own_stall_s = 0;
    while (left > 0) {
        int n = 0;
        int rc = MPI_Testsome(h->nreq, h->reqs, &n, h->done_idx, h->stats);
        if (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS) hc_mpi_fail(h, rc, "MPI_Testsome", -1);
        /* this rank's own stop is not its peers' lateness (they could not answer a stopped rank
         * either): the deadline restarts, so a resumed rank does not blame a peer for its stop.
         * Measured after the poll: a stop inside MPI_Testsome or the backoff counts too. */
        double now = nb_now();
        if (now - polled > NB_HC_OWN_STALL_S) h->own_stall_s += now - polled, last = now;
        polled = now;
        if (n == MPI_UNDEFINED) break;
        for (int k = 0; k < n; k++) hc_check_done(h, h->done_idx[k], &h->stats[k], rc);
        if (n > 0) {
            left -= n;
            last = now;
            continue;
        }
        double idle = now - last;
        if (idle > h->timeout_s) hc_timeout(h);
        hc_backoff(idle);
    }
    h->nreq = 0;
}

#else /* no MPI in this build: a world of one never posts a message */

static void hc_post(nb_hc *h, int peer, const void *buf, size_t bytes, int is_recv) {
    (void)h, (void)peer, (void)buf, (void)bytes, (void)is_recv;
    NB_ASSERT(!"a message between ranks in a build without MPI");
}
static void hc_wait(nb_hc *h) { NB_ASSERT(h->nreq == 0); }

#endif

static void hc_send(nb_hc *h, int peer, const void *buf, size_t bytes) { hc_post(h, peer, buf, bytes, 0); }
static void hc_recv(nb_hc *h, int peer, void *buf, size_t bytes) { hc_post(h, peer, buf, bytes, 1); }

/* ---- rank-order sums ---- */

static void block_copy(void *acc, const void *src, size_t m, size_t es) { memcpy(acc, src, m * es); }

/* acc[0..m) += src[0..m): one rounding per add, in the element type (no FMA: nothing multiplies) */
static void block_add(void *acc, const void *src, size_t m, nb_comm_dtype t) {
    switch (t) {
    case NB_COMM_F32: {
        float *a = acc;
        const float *s = src;
        for (size_t i = 0; i < m; i++) a[i] += s[i];
        break;
    }
    case NB_COMM_F64: {
        double *a = acc;
        const double *s = src;
        for (size_t i = 0; i < m; i++) a[i] += s[i];
        break;
    }
    case NB_COMM_I32: { /* wraps like the unsigned sum: no undefined overflow */
        uint32_t *a = acc;
        const uint32_t *s = src;
        for (size_t i = 0; i < m; i++) a[i] += s[i];
        break;
    }
    case NB_COMM_I64: {
        uint64_t *a = acc;
        const uint64_t *s = src;
        for (size_t i = 0; i < m; i++) a[i] += s[i];
        break;
    }
    default: NB_ASSERT(!"sum of a type that has no sum");
    }
}

/* Blocks through a stack buffer: every source's block b is read before dst's block b is written,
 * so dst may be one of the sources (in-place collectives), and the adds vectorize. */
void nb_hc_sum_rank_order(void *dst, const void *const *src, int n_src, size_t count, nb_comm_dtype t) {
    double acc[NB_HC_SUM_BLOCK]; /* 8-byte elements at most */
    size_t es = nb_comm_dtype_size(t);
    NB_ASSERT(n_src >= 1 && es <= sizeof(double));
    for (size_t b = 0; b < count; b += NB_HC_SUM_BLOCK) {
        size_t m = count - b < NB_HC_SUM_BLOCK ? count - b : NB_HC_SUM_BLOCK;
        block_copy(acc, (const char *)src[0] + b * es, m, es);
        for (int k = 1; k < n_src; k++) block_add(acc, (const char *)src[k] + b * es, m, t);
        memcpy((char *)dst + b * es, acc, m * es);
    }
}

/* ---- collectives ---- */

/* Slice k of a segment of len elements: [len * k / N, len * (k + 1) / N). */
static size_t slice_lo(size_t len, int k, int N) { return len / (size_t)N * (size_t)k + len % (size_t)N * (size_t)k / (size_t)N; }

/* Sum the N contributions to one piece: rank k's comes from scratch slot k, this rank's from mine. */
static void hc_sum_from(nb_hc *h, void *dst, const void *mine, const char *scratch, size_t slot_bytes, size_t n,
                        nb_comm_dtype t) {
    for (int k = 0; k < h->size; k++) h->srcs[k] = k == h->rank ? mine : scratch + (size_t)k * slot_bytes;
    nb_hc_sum_rank_order(dst, h->srcs, h->size, n, t);
}

void nb_hc_all_reduce(nb_hc *h, const void *send, void *recv, size_t count, nb_comm_dtype t) {
    const int N = h->size, r = h->rank;
    const size_t es = nb_comm_dtype_size(t);
    if (N == 1) {
        if (send != recv) memmove(recv, send, count * es);
        return;
    }
    size_t seg = h->seg_bytes / es < (size_t)N ? (size_t)N : h->seg_bytes / es;
    for (size_t off = 0; off < count; off += seg) {
        size_t len = count - off < seg ? count - off : seg;
        size_t slot = (len + (size_t)N - 1) / (size_t)N * es; /* bytes of the largest slice */
        char *scratch = hc_scratch(h, slot * (size_t)N);
        const char *in = (const char *)send + off * es;
        char *out = (char *)recv + off * es;
        size_t lo = slice_lo(len, r, N), mine = slice_lo(len, r + 1, N) - lo;
        /* phase 1: slice j of our contribution to rank j; every rank's slice r to us */
        for (int j = 0; j < N; j++) {
            if (j == r) continue;
            size_t jlo = slice_lo(len, j, N);
            hc_send(h, j, in + jlo * es, (slice_lo(len, j + 1, N) - jlo) * es);
            hc_recv(h, j, scratch + (size_t)j * slot, mine * es);
        }
        hc_wait(h);
        hc_sum_from(h, out + lo * es, in + lo * es, scratch, slot, mine, t);
        /* phase 2: our summed slice to every rank; theirs into place */
        for (int j = 0; j < N; j++) {
            if (j == r) continue;
            size_t jlo = slice_lo(len, j, N);
            hc_send(h, j, out + lo * es, mine * es);
            hc_recv(h, j, out + jlo * es, (slice_lo(len, j + 1, N) - jlo) * es);
        }
        hc_wait(h);
    }
}

void nb_hc_reduce_scatter(nb_hc *h, const void *send, void *recv, size_t count, nb_comm_dtype t) {
    const int N = h->size, r = h->rank;
    const size_t es = nb_comm_dtype_size(t);
    if (N == 1) {
        if (send != recv) memmove(recv, send, count * es);
        return;
    }
    size_t seg = h->seg_bytes / es / (size_t)N;
    if (seg == 0) seg = 1;
    for (size_t off = 0; off < count; off += seg) {
        size_t len = count - off < seg ? count - off : seg;
        char *scratch = hc_scratch(h, len * es * (size_t)N);
        for (int j = 0; j < N; j++) {
            if (j == r) continue;
            hc_send(h, j, (const char *)send + ((size_t)j * count + off) * es, len * es);
            hc_recv(h, j, scratch + (size_t)j * len * es, len * es);
        }
        hc_wait(h);
        hc_sum_from(h, (char *)recv + off * es, (const char *)send + ((size_t)r * count + off) * es, scratch,
                    len * es, len, t);
    }
}

void nb_hc_all_gather(nb_hc *h, const void *send, void *recv, size_t count, nb_comm_dtype t) {
    const int N = h->size, r = h->rank;
    const size_t bytes = count * nb_comm_dtype_size(t);
    char *own = (char *)recv + (size_t)r * bytes;
    if (send != own) memmove(own, send, bytes);
    for (int j = 0; j < N; j++) {
        if (j == r) continue;
        hc_send(h, j, own, bytes);
        hc_recv(h, j, (char *)recv + (size_t)j * bytes, bytes);
    }
    hc_wait(h);
}

void nb_hc_all_to_all_v(nb_hc *h, const void *send, void *recv, const size_t *counts, nb_comm_dtype t) {
    const int N = h->size, r = h->rank;
    const size_t es = nb_comm_dtype_size(t);
    const size_t *sc = counts, *sd = counts + N, *rc = counts + 2 * N, *rd = counts + 3 * N;
    NB_CHECK(sc[r] == rc[r], "send_counts[r] and recv_counts[r] of rank r are what it sends itself: make them equal",
             "rank %d: all-to-all-v sends itself %zu elements but expects %zu", r, sc[r], rc[r]);
    if (sc[r]) memmove((char *)recv + rd[r] * es, (const char *)send + sd[r] * es, sc[r] * es);
    for (int j = 0; j < N; j++) {
        if (j == r) continue;
        hc_send(h, j, (const char *)send + sd[j] * es, sc[j] * es);
        hc_recv(h, j, (char *)recv + rd[j] * es, rc[j] * es);
    }
    hc_wait(h);
}

void nb_hc_broadcast(nb_hc *h, void *buf, size_t count, nb_comm_dtype t, int root) {
    const size_t bytes = count * nb_comm_dtype_size(t);
    if (h->size == 1) return;
    if (h->rank == root)
        for (int j = 0; j < h->size; j++) {
            if (j != root) hc_send(h, j, buf, bytes);
        }
    else
        hc_recv(h, root, buf, bytes);
    hc_wait(h);
}

/* All pairs exchange one byte: a rank leaves only after hearing from every rank. */
void nb_hc_barrier(nb_hc *h) {
    static const char token = 1;
    if (h->size == 1) return;
    char *got = hc_scratch(h, (size_t)h->size);
    for (int j = 0; j < h->size; j++) {
        if (j == h->rank) continue;
        hc_send(h, j, &token, 1);
        hc_recv(h, j, got + j, 1);
    }
    hc_wait(h);
}
