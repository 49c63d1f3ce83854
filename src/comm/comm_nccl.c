/* --comm nccl: one NCCL communicator per instance, one process per GPU, ops on a device lane's
 * stream. The unique id travels from rank 0 over MPI (nb_comm_bcast_host); a world of one needs no
 * MPI and still gets a real communicator, so one rank runs the same code path as many.
 *
 * Failure without hangs, in two places:
 *  - Enqueueing. The communicator is nonblocking (config.blocking = 0): init and every call return
 *    at once (ncclInProgress while NCCL connects to peers), and we poll ncclCommGetAsyncError
 *    against the deadline, so a rank that never arrives cannot block the enqueuing thread.
 *  - Completion. A watchdog thread follows the ops: an event recorded after each one on the
 *    stream, queried (cudaEventQuery) in order, and ncclCommGetAsyncError. An op whose kernels have
 *    not finished timeout_s after it could have started (enqueued, and its predecessor done) is a
 *    timeout; an asynchronous NCCL error is one at once. Either way the watchdog asks the ranks
 *    who else is stuck (nb_comm__blame: the ranks that do not answer are the ones that died or
 *    stalled), aborts the communicator (ncclCommAbort frees the spinning kernels) and fails, which
 *    aborts the MPI job. Ops recorded into a CUDA graph capture are not watched (their kernels run
 *    at the graph's launches).
 *
 * Determinism: NCCL's sums are not in rank order; for a fixed world size, message sizes, NCCL
 * version and environment they repeat bit for bit (the algorithm and protocol NCCL picks depend
 * only on those). We pin no NCCL_ALGO or NCCL_PROTO and never touch NCCL_NVLS_ENABLE. */
#if defined(NB_WITH_CUDA) && defined(NB_WITH_NCCL)
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cuda_runtime.h>
#include <errno.h>
#include <nccl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm_internal.h"
#include "core.h"
#include "cuda_check.h"

#define NB_NCCL_HINT                                                                               \
    "rerun with NCCL_DEBUG=WARN for NCCL's own reason; look for an earlier error on another rank"
#define NB_WATCH_MAX 1024 /* ops in flight on one instance before enqueueing waits for the oldest */

typedef struct {
    cudaEvent_t ev;
    uint64_t seq;
    nb_comm_op_kind op;
    double t_enq;
} watch_entry;

typedef struct {
    ncclComm_t comm;
    int device;
    nb_comm *c;
    int *barrier_buf; /* device int for the barrier's all-reduce */
    /* watchdog: a FIFO of ops in flight */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    watch_entry q[NB_WATCH_MAX];
    int head, count, stop, failed;
    cudaEvent_t pool[NB_WATCH_MAX]; /* events free for reuse */
    int npool;
    double t_last_done;
} nb_comm_nccl;

static ncclDataType_t nccl_type(nb_comm_dtype t) {
    switch (t) {
    case NB_COMM_F32: return ncclFloat32;
    case NB_COMM_F64: return ncclFloat64;
    case NB_COMM_I32: return ncclInt32;
    case NB_COMM_I64: return ncclInt64;
    case NB_COMM_BF16: return ncclBfloat16;
    case NB_COMM_U8: return ncclUint8;
    default: NB_ASSERT(!"comm dtype");
    }
    return ncclUint8;
}

static NB_NORETURN void nccl_fail(nb_comm_nccl *s, ncclResult_t rc, const char *call) {
    const char *last = s->comm ? ncclGetLastError(s->comm) : "";
    nb_fail(NB_NCCL_HINT, "rank %d: %s failed: %s%s%s", s->c->rank, call, ncclGetErrorString(rc),
            last && last[0] ? ": " : "", last ? last : "");
}

/* After a nonblocking call: wait until NCCL has taken it, at most timeout_s. */
static void nccl_settle(nb_comm_nccl *s, ncclResult_t rc, const char *call) {
    double t0 = nb_now();
    while (rc == ncclInProgress) {
        if (nb_now() - t0 > s->c->timeout_s) {
            char missing[256];
            nb_comm__blame(s->c->seq, 5.0, missing, sizeof missing);
            ncclCommAbort(s->comm);
            nb_fail("look for an earlier error in that rank's output; raise --comm-timeout if it was only busy",
                    "rank %d: %s did not complete within %g s (--comm-timeout); ranks that did not answer: %s",
                    s->c->rank, call, s->c->timeout_s, missing);
        }
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
        ncclResult_t st = ncclCommGetAsyncError(s->comm, &rc);
        if (st != ncclSuccess) nccl_fail(s, st, "ncclCommGetAsyncError");
    }
    if (rc != ncclSuccess) nccl_fail(s, rc, call);
}
#define NCCL_CALL(s, call) nccl_settle((s), (call), #call)

/* ---- watchdog ---- */

static NB_NORETURN void watch_timeout(nb_comm_nccl *s, const watch_entry *e, double waited) {
    char missing[256];
    double grace = s->c->timeout_s / 4 < 10 ? s->c->timeout_s / 4 : 10;
    nb_comm__blame(e->seq, grace, missing, sizeof missing);
    ncclCommAbort(s->comm);
    nb_fail("look for an earlier error in that rank's output; if it was only busy (e.g. writing a checkpoint), "
            "raise --comm-timeout",
            "rank %d: nccl %s #%llu did not finish within %.0f s (--comm-timeout): rank %s died or stalled "
            "(did not answer)",
            s->c->rank, nb_comm_op_name(e->op), (unsigned long long)e->seq, waited, missing);
}

static void watch_check_async(nb_comm_nccl *s) {
    ncclResult_t async = ncclSuccess;
    ncclResult_t st = ncclCommGetAsyncError(s->comm, &async);
    if (st != ncclSuccess) nccl_fail(s, st, "ncclCommGetAsyncError");
    if (async != ncclSuccess && async != ncclInProgress) {
        ncclCommAbort(s->comm);
        nccl_fail(s, async, "an NCCL operation (asynchronous error)");
    }
}

static void *watchdog(void *arg) {
    nb_comm_nccl *s = arg;
    CUDA_CHECK(cudaSetDevice(s->device));
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (s->count == 0 && !s->stop) pthread_cond_wait(&s->cv, &s->mu);
        if (s->count == 0 && s->stop) break;
        watch_entry e = s->q[s->head];
        pthread_mutex_unlock(&s->mu);
        cudaError_t q = cudaEventQuery(e.ev);
        if (q != cudaSuccess && q != cudaErrorNotReady) CUDA_CHECK_NAMED(q, "cudaEventQuery (NCCL op)");
        watch_check_async(s);
        double now = nb_now();
        pthread_mutex_lock(&s->mu);
        if (q == cudaSuccess) {
            s->pool[s->npool++] = e.ev;
            s->head = (s->head + 1) % NB_WATCH_MAX;
            s->count--;
            s->t_last_done = now;
            pthread_cond_broadcast(&s->cv);
            continue;
        }
        double started = e.t_enq > s->t_last_done ? e.t_enq : s->t_last_done;
        if (now - started > s->c->timeout_s) {
            s->failed = 1;
            pthread_mutex_unlock(&s->mu);
            watch_timeout(s, &e, now - started);
        }
        pthread_mutex_unlock(&s->mu);
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static void watch_push(nb_comm_nccl *s, cudaStream_t stream, nb_comm_op_kind op, uint64_t seq) {
    enum cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    CUDA_CHECK(cudaStreamIsCapturing(stream, &cap));
    if (cap != cudaStreamCaptureStatusNone) return;
    pthread_mutex_lock(&s->mu);
    while (s->count == NB_WATCH_MAX) pthread_cond_wait(&s->cv, &s->mu);
    cudaEvent_t ev;
    if (s->npool > 0) ev = s->pool[--s->npool];
    else CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(ev, stream));
    double now = nb_now();
    if (s->count == 0 && s->t_last_done < now) s->t_last_done = now; /* idle until now */
    s->q[(s->head + s->count) % NB_WATCH_MAX] = (watch_entry){.ev = ev, .seq = seq, .op = op, .t_enq = now};
    s->count++;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* ---- instance ---- */

void nb_comm_nccl_create(nb_comm *c) {
    nb_comm_nccl *s = nb_calloc(1, sizeof *s, "nccl comm");
    s->c = c;
    CUDA_CHECK(cudaGetDevice(&s->device));
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (c->rank == 0) {
        ncclResult_t rc = ncclGetUniqueId(&id);
        if (rc != ncclSuccess) nccl_fail(s, rc, "ncclGetUniqueId");
    }
    if (c->size > 1) nb_comm_bcast_host(&id, sizeof id, 0);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t rc = ncclCommInitRankConfig(&s->comm, c->size, id, c->rank, &cfg);
    if (rc != ncclInProgress && rc != ncclSuccess) nccl_fail(s, rc, "ncclCommInitRankConfig");
    nccl_settle(s, rc, "ncclCommInitRankConfig");
    CUDA_CHECK(cudaMalloc((void **)&s->barrier_buf, sizeof(int)));
    CUDA_CHECK(cudaMemset(s->barrier_buf, 0, sizeof(int)));
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    int e = pthread_create(&s->thread, NULL, watchdog, s);
    if (e) nb_fail("free some threads or memory", "cannot start the NCCL watchdog thread: %s", strerror(e));
    c->impl = s;
}

void nb_comm_nccl_destroy(nb_comm *c) {
    nb_comm_nccl *s = c->impl;
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    for (int i = 0; i < s->npool; i++) CUDA_CHECK(cudaEventDestroy(s->pool[i]));
    NCCL_CALL(s, ncclCommFinalize(s->comm)); /* nonblocking: settles against the deadline */
    ncclResult_t rc = ncclCommDestroy(s->comm);
    if (rc != ncclSuccess) nccl_fail(s, rc, "ncclCommDestroy");
    CUDA_CHECK(cudaFree(s->barrier_buf));
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
    c->impl = NULL;
}

/* all-to-all-v as grouped sends and receives; this rank's own block is a device copy */
static void run_a2av(nb_comm_nccl *s, const nb_comm_op *op, cudaStream_t st) {
    const int N = s->c->size, r = s->c->rank;
    const size_t *sc = op->counts, *sd = op->counts + N, *rc = op->counts + 2 * N, *rd = op->counts + 3 * N;
    const size_t es = nb_comm_dtype_size(op->dt);
    ncclDataType_t t = nccl_type(op->dt);
    NB_CHECK(sc[r] == rc[r], "send_counts[r] and recv_counts[r] of rank r are what it sends itself: make them equal",
             "rank %d: all-to-all-v sends itself %zu elements but expects %zu", r, sc[r], rc[r]);
    if (sc[r])
        CUDA_CHECK(cudaMemcpyAsync((char *)op->recv + rd[r] * es, (const char *)op->send + sd[r] * es, sc[r] * es,
                                   cudaMemcpyDeviceToDevice, st));
    NCCL_CALL(s, ncclGroupStart());
    for (int j = 0; j < N; j++) {
        if (j == r) continue;
        if (sc[j]) NCCL_CALL(s, ncclSend((const char *)op->send + sd[j] * es, sc[j], t, j, s->comm, st));
        if (rc[j]) NCCL_CALL(s, ncclRecv((char *)op->recv + rd[j] * es, rc[j], t, j, s->comm, st));
    }
    NCCL_CALL(s, ncclGroupEnd());
}

void nb_comm_nccl_run(nb_comm *c, nb_comm_op *op, void *stream) {
    nb_comm_nccl *s = c->impl;
    cudaStream_t st = stream;
    ncclDataType_t t = nccl_type(op->dt);
    CUDA_CHECK(cudaSetDevice(s->device));
    switch (op->op) {
    case NB_OP_ALL_REDUCE: NCCL_CALL(s, ncclAllReduce(op->send, op->recv, op->count, t, ncclSum, s->comm, st)); break;
    case NB_OP_REDUCE_SCATTER:
        NCCL_CALL(s, ncclReduceScatter(op->send, op->recv, op->count, t, ncclSum, s->comm, st));
        break;
    case NB_OP_ALL_GATHER: NCCL_CALL(s, ncclAllGather(op->send, op->recv, op->count, t, s->comm, st)); break;
    case NB_OP_ALL_TO_ALL_V: run_a2av(s, op, st); break;
    case NB_OP_BROADCAST:
        NCCL_CALL(s, ncclBroadcast(op->recv, op->recv, op->count, t, op->root, s->comm, st));
        break;
    case NB_OP_BARRIER:
        NCCL_CALL(s, ncclAllReduce(s->barrier_buf, s->barrier_buf, 1, ncclInt32, ncclSum, s->comm, st));
        break;
    }
    watch_push(s, st, op->op, op->seq);
}

#endif
