/* --comm host: GPU buffers copied into pinned host memory, the rank-order MPI collective on the
 * host copy (hostcoll.c), the result copied back. It runs where NCCL cannot: several ranks on one
 * GPU (NCCL refuses duplicate GPUs); it launches no kernel (copy engines and CPU only: the
 * "SM-free" path); and it sums on the CPU in rank order, so its results are those of the mpi kind
 * on the same fp32 values, bit for bit.
 *
 * The whole op is one task on a HOST lane: the lane's worker has already waited for the marks the
 * op was told to wait on (device marks by event synchronisation), so the input is ready on the
 * GPU; the task copies D2H on a stream of its own, runs MPI, copies H2D, and returns once the copy
 * is done, so a mark of the lane after the op means "the result is on the GPU". Ops of one
 * instance run one after another, each seeing its predecessors' results, as on the other kinds.
 * The staging state takes any nb_hc, so --comm-sm-free's copy-engine lane (comm_peer.c) runs its
 * all-gathers and all-to-alls through it too when the ranks span several machines.
 * (Later: cut each op into pieces so that piece k+1's D2H overlaps piece k's MPI.) */
#ifdef NB_WITH_CUDA
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_internal.h"
#include "core.h"
#include "cuda_check.h"

struct nb_comm_stage {
    const nb_backend_i *be; /* its host_alloc pins the staging buffer */
    int device;             /* the CUDA device current at create: set again on the lane's thread */
    cudaStream_t stream;    /* the copies */
    char *stage;            /* pinned, grown on demand */
    size_t cap;
};

nb_comm_stage *nb_comm_stage_create(const nb_backend_i *be) {
    nb_comm_stage *h = nb_calloc(1, sizeof *h, "host comm staging");
    h->be = be;
    CUDA_CHECK(cudaGetDevice(&h->device));
    CUDA_CHECK(cudaStreamCreateWithFlags(&h->stream, cudaStreamNonBlocking));
    return h;
}

void nb_comm_stage_destroy(nb_comm_stage *h) {
    if (!h) return;
    if (h->stage) h->be->host_free(h->stage);
    CUDA_CHECK(cudaStreamDestroy(h->stream));
    free(h);
}

static char *stage(nb_comm_stage *h, size_t bytes) {
    if (bytes > h->cap) {
        if (h->stage) h->be->host_free(h->stage);
        size_t cap = h->cap * 2 > bytes ? h->cap * 2 : bytes;
        h->stage = h->be->host_alloc(cap, "host comm staging (pinned)");
        h->cap = cap;
    }
    return h->stage;
}

static void copy(nb_comm_stage *h, void *dst, const void *src, size_t bytes, enum cudaMemcpyKind dir) {
    if (bytes) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, dir, h->stream));
}
static void d2h(nb_comm_stage *h, void *dst, const void *src, size_t bytes) { copy(h, dst, src, bytes, cudaMemcpyDeviceToHost); }
static void h2d(nb_comm_stage *h, void *dst, const void *src, size_t bytes) { copy(h, dst, src, bytes, cudaMemcpyHostToDevice); }
static void done(nb_comm_stage *h) { CUDA_CHECK(cudaStreamSynchronize(h->stream)); }

/* all-to-all-v: only the ranges the op writes go back (the gaps of recv keep their bytes) */
static void run_a2av(nb_comm_stage *h, nb_hc *hc, const nb_comm_op *op, size_t es) {
    const int N = hc->size;
    const size_t *rc = op->counts + 2 * N, *rd = op->counts + 3 * N;
    size_t recv_end = 0;
    for (int j = 0; j < N; j++)
        if (rc[j] && rd[j] + rc[j] > recv_end) recv_end = rd[j] + rc[j];
    size_t send_bytes = nb_align_up(op->count * es, 256);
    char *s = stage(h, send_bytes + recv_end * es), *r = s + send_bytes;
    d2h(h, s, op->send, op->count * es);
    done(h);
    nb_comm_run_hc(hc, op, s, r);
    for (int j = 0; j < N; j++) h2d(h, (char *)op->recv + rd[j] * es, r + rd[j] * es, rc[j] * es);
}

void nb_comm_stage_run(nb_comm_stage *h, nb_hc *hc, const nb_comm_op *op) {
    CUDA_CHECK(cudaSetDevice(h->device)); /* a lane's thread starts on device 0 */
    const size_t es = nb_comm_dtype_size(op->dt), n = op->count * es, N = (size_t)hc->size, r = (size_t)hc->rank;
    char *s;
    switch (op->op) {
    case NB_OP_ALL_REDUCE: /* in place on the copy */
        s = stage(h, n);
        d2h(h, s, op->send, n), done(h);
        nb_comm_run_hc(hc, op, s, s);
        h2d(h, op->recv, s, n);
        break;
    case NB_OP_REDUCE_SCATTER:
        s = stage(h, n * N);
        d2h(h, s, op->send, n * N), done(h);
        nb_comm_run_hc(hc, op, s, s + r * n);
        h2d(h, op->recv, s + r * n, n);
        break;
    case NB_OP_ALL_GATHER:
        s = stage(h, n * N);
        d2h(h, s + r * n, op->send, n), done(h);
        nb_comm_run_hc(hc, op, s + r * n, s);
        h2d(h, op->recv, s, n * N);
        break;
    case NB_OP_ALL_TO_ALL_V: run_a2av(h, hc, op, es); break;
    case NB_OP_BROADCAST:
        s = stage(h, n);
        if ((int)r == op->root) d2h(h, s, op->recv, n), done(h);
        nb_comm_run_hc(hc, op, s, s);
        if ((int)r != op->root) h2d(h, op->recv, s, n);
        break;
    case NB_OP_BARRIER: nb_comm_run_hc(hc, op, NULL, NULL); break;
    }
    done(h);
}

/* Every rank's GPU UUID, gathered: NCCL needs them distinct. */
int nb_comm_gpus_unique(void) {
    const int N = nb_comm_size();
    if (N == 1) return 1;
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    struct cudaDeviceProp p;
    CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
    char *all = nb_malloc((size_t)N * sizeof p.uuid, "GPU UUIDs");
    nb_comm__all_gather_host(&p.uuid, all, sizeof p.uuid, "GPU UUIDs");
    int unique = 1;
    for (int a = 0; a < N && unique; a++)
        for (int b = a + 1; b < N && unique; b++)
            unique = memcmp(all + (size_t)a * sizeof p.uuid, all + (size_t)b * sizeof p.uuid, sizeof p.uuid) != 0;
    free(all);
    return unique;
}

#endif
