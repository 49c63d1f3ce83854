/* --comm-sm-free: all-gather and all-to-all-v moved by copy engines only, as tasks on a HOST lane
 * (the host kind's own lane; for nccl a lane of the instance's own with its own MPI communicator,
 * so that these ops and NCCL's reductions never share MPI matching or a thread).
 *
 * One machine (every rank local): CUDA IPC, push model. Per op each rank
 *  1. finds its recv buffer's allocation (cuMemGetAddressRange, through the runtime's driver
 *     entry point: the build links cudart, not libcuda) and exports it (cudaIpcGetMemHandle takes
 *     an allocation's base, so {handle, recv - base} names recv);
 *  2. all-gathers over MPI {handle, offset, element size, and for all-to-all-v its send counts,
 *     recv counts and recv displacements}: a rank's record arrives only once that rank's task is
 *     running, i.e. it has waited for its own inputs and its recv buffer is free to be written;
 *  3. checks every count against its peers' (a mismatch names both ranks, like hostcoll.c);
 *  4. copies each of its blocks into each peer's recv at that peer's displacement for it
 *     (cudaMemcpyAsync device to device on a stream of its own: copy engines; its own block is a
 *     local copy), peers in the order r+1, r+2, ... so that ranks do not all write rank 0 first;
 *  5. synchronizes the stream, then a host barrier: every copy INTO this rank is done when it
 *     returns, so the lane's mark after the op means "the result is in recv", as on the other
 *     kinds.
 * Ranks may share one GPU: IPC between two processes on the same device maps the same memory.
 * A peer's handle is opened once (cudaIpcOpenMemHandle, cudaIpcMemLazyEnablePeerAccess) and kept
 * for the next op on the same allocation, NB_CE_MAPS per peer at most (least recently used
 * closed first: an allocation the caller freed and replaced gets a new handle, per the CUDA
 * docs, and its stale mapping ages out); all are closed at destroy, which returns on no rank
 * before every rank has closed them. Opening a handle this process already holds open would only
 * take another reference, but the cache never does.
 *
 * Several machines: the host kind's staging (comm_host.c), D2H, the rank-order MPI collective,
 * H2D: copy engines too, and the same bytes. */
#ifdef NB_WITH_CUDA
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_internal.h"
#include "core.h"
#include "cuda_check.h"

#define NB_CE_MAPS 8 /* a peer's allocations kept open */

#define NB_CE_IPC_HINT                                                                             \
    "CUDA IPC must work between the ranks' processes (GPUs that can reach each other: "            \
    "cudaDeviceCanAccessPeer; ranks in different containers need shared IPC and PID namespaces; "   \
    "sandboxes such as gVisor may refuse it); or drop --comm-sm-free (--comm host stages through "  \
    "host memory, also without kernels)"
#define NB_CE_BUF_HINT                                                                             \
    "give --comm-sm-free's all-gather and all-to-all a recv buffer inside one cudaMalloc "          \
    "allocation (the backend's alloc; memory of cudaMallocAsync pools, cuMemCreate or "             \
    "cudaMallocManaged has no IPC handle); or drop --comm-sm-free"

typedef struct {
    cudaIpcMemHandle_t handle;
    char *ptr;     /* its mapping here (the exporter's allocation base); NULL: slot free */
    uint64_t used; /* seq of the last op that used it */
} ce_map;

/* One rank's record, all-gathered per op; for all-to-all-v followed by its send counts, recv
 * counts and recv displacements (N each, elements). */
typedef struct {
    cudaIpcMemHandle_t handle; /* of recv's allocation, when has_buf */
    uint64_t offset;           /* recv - the allocation's base, bytes */
    uint64_t count;            /* all-gather: elements per rank */
    uint32_t es;               /* element bytes */
    uint32_t has_buf;          /* peers write into this rank's recv */
} ce_rec;
_Static_assert(sizeof(ce_rec) % sizeof(uint64_t) == 0, "ce_rec: the counts after it stay aligned");

struct nb_comm_ce {
    nb_comm *c;
    nb_hc *hc;              /* the host kind's (same lane), or own_hc */
    nb_hc own_hc;           /* nccl: this lane's rank-order collectives */
    void *mpi_comm;         /* nccl: own_hc's MPI communicator */
    nb_comm_stage *stage;   /* several machines: the staged path (the host kind's own, or owned) */
    int own_stage;
    int ipc;                /* every rank on this machine */
    int keep_maps;          /* keep peer mappings for the next op (nb_comm_set_sm_free_keep_maps) */
    int device;             /* current at create: set again on the lane's thread */
    cudaStream_t stream;    /* ipc: the copies */
    PFN_cuMemGetAddressRange_v3020 get_range;
    ce_map *maps;           /* [size][NB_CE_MAPS] */
    char *recs;             /* size records of rec_bytes */
    size_t recs_cap;
};

static void open_driver(nb_comm_ce *ce) {
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult st = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
    /* 12000: the ABI of cuMemGetAddressRange_v2, which every driver this runtime runs on has */
    CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault, &st));
#else
    CUDA_CHECK(cudaGetDriverEntryPoint("cuMemGetAddressRange", &fn, cudaEnableDefault, &st));
#endif
    NB_CHECK(fn && st == cudaDriverEntryPointSuccess, "update the NVIDIA driver, or drop --comm-sm-free",
             "--comm-sm-free: the driver has no cuMemGetAddressRange (entry point query result %d)", (int)st);
    ce->get_range = (PFN_cuMemGetAddressRange_v3020)fn;
}

nb_comm_ce *nb_comm_ce_create(nb_comm *c, int staged) {
    nb_comm_ce *ce = nb_calloc(1, sizeof *ce, "sm-free comm");
    ce->c = c;
    ce->keep_maps = 1;
    CUDA_CHECK(cudaGetDevice(&ce->device));
    /* the same answer on every rank: all local, or (several machines) none sees them all */
    ce->ipc = nb_comm_local_size() == c->size && !staged;
    if (c->kind == NB_COMM_HOST) {
        ce->hc = &c->hc;
        ce->stage = c->impl;
    } else {
        ce->mpi_comm = nb_comm__dup_mpi();
        nb_hc_init(&ce->own_hc, ce->mpi_comm, c->rank, c->size, c->timeout_s);
        ce->hc = &ce->own_hc;
        if (!ce->ipc) ce->stage = nb_comm_stage_create(c->be), ce->own_stage = 1;
    }
    if (ce->ipc) {
        CUDA_CHECK(cudaStreamCreateWithFlags(&ce->stream, cudaStreamNonBlocking));
        if (c->size > 1) {
            open_driver(ce);
            ce->maps = nb_calloc((size_t)c->size * NB_CE_MAPS, sizeof *ce->maps, "sm-free peer mappings");
        }
    }
    return ce;
}

void nb_comm_ce_set_message_sizes(nb_comm_ce *ce, size_t seg_bytes, size_t piece_bytes) {
    if (ce && ce->hc == &ce->own_hc) nb_hc_set_sizes(&ce->own_hc, seg_bytes, piece_bytes);
}

void nb_comm_set_sm_free_keep_maps(nb_comm *c, int keep) {
    NB_CHECK(c->ce, "this is a bug in the caller; please report it",
             "nb_comm_set_sm_free_keep_maps on an instance without --comm-sm-free");
    c->ce->keep_maps = keep != 0;
}

static void close_maps(nb_comm_ce *ce) {
    if (!ce->maps) return;
    for (size_t i = 0; i < (size_t)ce->c->size * NB_CE_MAPS; i++)
        if (ce->maps[i].ptr) {
            CUDA_CHECK(cudaIpcCloseMemHandle(ce->maps[i].ptr));
            ce->maps[i].ptr = NULL;
        }
}

void nb_comm_ce_destroy(nb_comm_ce *ce) {
    if (!ce) return;
    if (ce->ipc) {
        CUDA_CHECK(cudaSetDevice(ce->device));
        close_maps(ce);
        CUDA_CHECK(cudaStreamDestroy(ce->stream));
        /* no rank returns (and frees its buffers) before every rank has closed its mappings of
         * them: freeing memory another process still has open is undefined for CUDA */
        if (ce->maps) {
            nb_hc_begin(ce->hc, "--comm-sm-free teardown", NULL, ce->c->seq + 1);
            nb_hc_barrier(ce->hc);
        }
    }
    if (ce->own_stage) nb_comm_stage_destroy(ce->stage);
    if (ce->hc == &ce->own_hc) {
        nb_hc_free(&ce->own_hc);
        nb_comm__free_mpi(ce->mpi_comm);
    }
    free(ce->maps);
    free(ce->recs);
    free(ce);
}

/* ---- IPC ---- */

/* " (\"rows all-to-all\")" when the op has a span name, for messages */
static const char *label_of(const nb_comm_op *op, char *buf, size_t cap) {
    if (!op->label[0]) return "";
    snprintf(buf, cap, " (\"%s\")", op->label);
    return buf;
}

/* Fill rec with recv's handle and offset: peers write into recv[0 .. extent) bytes. */
static void export_recv(nb_comm_ce *ce, ce_rec *rec, void *recv, size_t extent, const nb_comm_op *op) {
    const int r = ce->c->rank;
    char lb[64];
    struct cudaPointerAttributes a;
    CUDA_CHECK(cudaPointerGetAttributes(&a, recv));
    NB_CHECK(a.type == cudaMemoryTypeDevice, NB_CE_BUF_HINT,
             "rank %d: --comm-sm-free %s #%llu%s: recv %p is not device memory (CUDA memory type %d)", r,
             nb_comm_op_name(op->op), (unsigned long long)op->seq, label_of(op, lb, sizeof lb), recv, (int)a.type);
    CUdeviceptr base = 0;
    size_t size = 0;
    CUresult e = ce->get_range(&base, &size, (CUdeviceptr)(uintptr_t)recv);
    NB_CHECK(e == CUDA_SUCCESS, NB_CE_BUF_HINT,
             "rank %d: --comm-sm-free %s #%llu%s: cuMemGetAddressRange(%p) failed (CUresult %d)", r,
             nb_comm_op_name(op->op), (unsigned long long)op->seq, label_of(op, lb, sizeof lb), recv, (int)e);
    size_t off = (size_t)((uintptr_t)recv - (uintptr_t)base);
    NB_CHECK(off + extent <= size, NB_CE_BUF_HINT,
             "rank %d: --comm-sm-free %s #%llu%s: recv's %zu bytes run past its allocation (%zu bytes from offset %zu)", r,
             nb_comm_op_name(op->op), (unsigned long long)op->seq, label_of(op, lb, sizeof lb), extent, size, off);
    cudaError_t ge = cudaIpcGetMemHandle(&rec->handle, (void *)(uintptr_t)base);
    if (ge != cudaSuccess)
        nb_fail(NB_CE_BUF_HINT,
                "rank %d: --comm-sm-free %s #%llu%s: cudaIpcGetMemHandle of recv's allocation failed: %s (%s)", r,
                nb_comm_op_name(op->op), (unsigned long long)op->seq, label_of(op, lb, sizeof lb), cudaGetErrorString(ge),
                cudaGetErrorName(ge));
    rec->offset = off;
    rec->has_buf = 1;
}

/* Peer's recv buffer, mapped here. */
static char *peer_recv(nb_comm_ce *ce, int peer, const ce_rec *rec, const nb_comm_op *op) {
    char lb[64];
    NB_CHECK(rec->has_buf, "this is a bug in nobubble; please report it",
             "rank %d: --comm-sm-free %s #%llu: rank %d takes bytes but sent no buffer", ce->c->rank, nb_comm_op_name(op->op),
             (unsigned long long)op->seq, peer);
    ce_map *m = ce->maps + (size_t)peer * NB_CE_MAPS, *v = m;
    for (int i = 0; i < NB_CE_MAPS; i++) {
        if (m[i].ptr && memcmp(&m[i].handle, &rec->handle, sizeof rec->handle) == 0) {
            m[i].used = op->seq;
            return m[i].ptr + rec->offset;
        }
        if (!m[i].ptr) {
            if (v->ptr) v = &m[i]; /* the first free slot */
        } else if (v->ptr && m[i].used < v->used) {
            v = &m[i];
        }
    }
    if (v->ptr) CUDA_CHECK(cudaIpcCloseMemHandle(v->ptr));
    v->ptr = NULL;
    void *p = NULL;
    cudaError_t e = cudaIpcOpenMemHandle(&p, rec->handle, cudaIpcMemLazyEnablePeerAccess);
    if (e == cudaErrorAlreadyMapped) {
        /* the peer's allocation is mapped here under a handle the cache holds with other bytes (the
         * peer exported it again, or freed it and got the same memory back): drop this peer's
         * mappings (no op in flight uses them: ops run one at a time) and open it afresh */
        (void)cudaGetLastError();
        for (int i = 0; i < NB_CE_MAPS; i++)
            if (m[i].ptr) {
                CUDA_CHECK(cudaIpcCloseMemHandle(m[i].ptr));
                m[i].ptr = NULL;
            }
        v = m;
        e = cudaIpcOpenMemHandle(&p, rec->handle, cudaIpcMemLazyEnablePeerAccess);
    }
    if (e != cudaSuccess)
        nb_fail(NB_CE_IPC_HINT,
                "rank %d: --comm-sm-free %s #%llu%s: cudaIpcOpenMemHandle of rank %d's recv buffer failed: %s (%s)",
                ce->c->rank, nb_comm_op_name(op->op), (unsigned long long)op->seq, label_of(op, lb, sizeof lb), peer,
                cudaGetErrorString(e), cudaGetErrorName(e));
    v->handle = rec->handle;
    v->ptr = p;
    v->used = op->seq;
    return v->ptr + rec->offset;
}

static ce_rec *rec_at(nb_comm_ce *ce, size_t rec_bytes, int k) { return (ce_rec *)(ce->recs + (size_t)k * rec_bytes); }

/* This rank's zeroed record (the others' slots follow it). */
static ce_rec *records(nb_comm_ce *ce, size_t rec_bytes) {
    size_t need = rec_bytes * (size_t)ce->c->size;
    if (need > ce->recs_cap) {
        free(ce->recs);
        ce->recs = nb_malloc(need, "sm-free records");
        ce->recs_cap = need;
    }
    ce_rec *mine = rec_at(ce, rec_bytes, ce->c->rank);
    memset(mine, 0, rec_bytes);
    return mine;
}

/* Every rank's record into ce->recs; returns once every rank has reached the op. */
static void exchange(nb_comm_ce *ce, const nb_comm_op *op, size_t rec_bytes) {
    nb_hc_begin(ce->hc, nb_comm_op_name(op->op), op->label, op->seq);
    nb_hc_all_gather(ce->hc, rec_at(ce, rec_bytes, ce->c->rank), ce->recs, rec_bytes, NB_COMM_U8);
}

static void dcopy(nb_comm_ce *ce, void *dst, const void *src, size_t bytes) {
    if (bytes && dst != src) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, ce->stream));
}

/* This rank's copies are done; leave once every rank's copies (into this rank too) are. */
static void finish(nb_comm_ce *ce) {
    CUDA_CHECK(cudaStreamSynchronize(ce->stream));
    if (!ce->keep_maps) close_maps(ce);
    nb_hc_barrier(ce->hc);
}

static NB_NORETURN void counts_disagree(nb_comm_ce *ce, const nb_comm_op *op, const char *what) {
    char lb[64];
    nb_fail("every rank must enqueue the same ops with matching counts (send_counts[j] on rank i == recv_counts[i] on "
            "rank j) and element types",
            "rank %d: %s in %s #%llu%s (--comm-sm-free): the ranks' counts disagree", ce->c->rank, what,
            nb_comm_op_name(op->op), (unsigned long long)op->seq, label_of(op, lb, sizeof lb));
}

static void ipc_all_gather(nb_comm_ce *ce, const nb_comm_op *op) {
    const int N = ce->c->size, r = ce->c->rank;
    const size_t es = nb_comm_dtype_size(op->dt), n = op->count * es;
    const size_t rb = sizeof(ce_rec);
    ce_rec *mine = records(ce, rb);
    mine->es = (uint32_t)es;
    mine->count = op->count;
    if (N > 1 && n) export_recv(ce, mine, op->recv, n * (size_t)N, op);
    exchange(ce, op, rb);
    char what[160];
    for (int j = 0; j < N; j++) {
        const ce_rec *o = rec_at(ce, rb, j);
        if (o->es == es && o->count == op->count) continue;
        snprintf(what, sizeof what, "it gathers %zu elements of %zu bytes, rank %d %llu of %u", op->count, es, j,
                 (unsigned long long)o->count, o->es);
        counts_disagree(ce, op, what);
    }
    for (int d = 0; d < N && n; d++) { /* block r of every rank's recv */
        int j = (r + d) % N;
        char *dst = (j == r ? (char *)op->recv : peer_recv(ce, j, rec_at(ce, rb, j), op)) + (size_t)r * n;
        dcopy(ce, dst, op->send, n);
    }
    finish(ce);
}

static void ipc_a2av(nb_comm_ce *ce, const nb_comm_op *op) {
    const int N = ce->c->size, r = ce->c->rank;
    const size_t es = nb_comm_dtype_size(op->dt);
    const size_t *sc = op->counts, *sd = op->counts + N, *rc = op->counts + 2 * N, *rd = op->counts + 3 * N;
    NB_CHECK(sc[r] == rc[r], "send_counts[r] and recv_counts[r] of rank r are what it sends itself: make them equal",
             "rank %d: all-to-all-v sends itself %zu elements but expects %zu", r, sc[r], rc[r]);
    const size_t rb = sizeof(ce_rec) + 3 * (size_t)N * sizeof(uint64_t);
    ce_rec *mine = records(ce, rb);
    uint64_t *v = (uint64_t *)(mine + 1);
    size_t from_peers = 0, recv_end = 0;
    for (int j = 0; j < N; j++) {
        v[j] = sc[j], v[N + j] = rc[j], v[2 * N + j] = rd[j];
        if (j != r) from_peers += rc[j];
        if (rc[j] && rd[j] + rc[j] > recv_end) recv_end = rd[j] + rc[j];
    }
    mine->es = (uint32_t)es;
    if (from_peers) export_recv(ce, mine, op->recv, recv_end * es, op);
    exchange(ce, op, rb);
    char what[160];
    for (int j = 0; j < N; j++) {
        if (j == r) continue;
        const ce_rec *o = rec_at(ce, rb, j);
        const uint64_t *ov = (const uint64_t *)(o + 1);
        if (o->es != es) snprintf(what, sizeof what, "its elements have %zu bytes, rank %d's %u", es, j, o->es);
        else if (ov[N + r] != sc[j])
            snprintf(what, sizeof what, "it sends rank %d %zu elements, but rank %d expects %llu", j, sc[j], j,
                     (unsigned long long)ov[N + r]);
        else if (ov[r] != rc[j])
            snprintf(what, sizeof what, "it expects %zu elements from rank %d, but rank %d sends %llu", rc[j], j, j,
                     (unsigned long long)ov[r]);
        else continue;
        counts_disagree(ce, op, what);
    }
    for (int d = 0; d < N; d++) { /* our block for rank j, at j's displacement for us */
        int j = (r + d) % N;
        if (!sc[j]) continue;
        const ce_rec *o = rec_at(ce, rb, j);
        char *dst = j == r ? (char *)op->recv + rd[r] * es
                           : peer_recv(ce, j, o, op) + ((const uint64_t *)(o + 1))[2 * N + r] * es;
        dcopy(ce, dst, (const char *)op->send + sd[j] * es, sc[j] * es);
    }
    finish(ce);
}

void nb_comm_ce_run(nb_comm_ce *ce, const nb_comm_op *op) {
    NB_ASSERT(op->op == NB_OP_ALL_GATHER || op->op == NB_OP_ALL_TO_ALL_V);
    if (!ce->ipc) {
        nb_comm_stage_run(ce->stage, ce->hc, op);
        return;
    }
    CUDA_CHECK(cudaSetDevice(ce->device)); /* a lane's thread starts on device 0 */
    if (op->op == NB_OP_ALL_GATHER) ipc_all_gather(ce, op);
    else ipc_a2av(ce, op);
}

#endif
