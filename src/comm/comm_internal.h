/* Comm internals shared by world.c (ranks, MPI start, process-wide helpers, the on-fail hook),
 * hostcoll.c (rank-order collectives over MPI point-to-point on host buffers), comm.c (instances,
 * ops as lane tasks), comm_host.c (GPU buffers staged through pinned host memory),
 * comm_peer.c (--comm-sm-free: all-gather and all-to-all-v by copy engines) and comm_nccl.c
 * (NCCL). Not for callers: they use comm.h. */
#ifndef NB_COMM_INTERNAL_H
#define NB_COMM_INTERNAL_H

#include <stdint.h>

#include "comm/comm.h"

#ifdef NB_WITH_MPI
#include <mpi.h>
#endif

/* ---- host collectives (hostcoll.c) ----
 * One context per MPI communicator, used by one thread at a time (its lane's worker, or the main
 * thread for the process-wide helpers). With size == 1 nothing calls into MPI, so the same code
 * runs a world of one without MPI initialised. */
typedef struct nb_hc_req {
    int peer;
    int is_recv;
    size_t bytes; /* of this MPI message (a piece of at most nb_hc.piece_bytes) */
} nb_hc_req;

typedef struct nb_hc {
#ifdef NB_WITH_MPI
    MPI_Comm comm; /* MPI_COMM_NULL when size == 1 */
    MPI_Request *reqs;
    MPI_Status *stats;
    int *done_idx;
#endif
    nb_hc_req *meta;
    int nreq, cap;
    int rank, size;
    double timeout_s;
    double own_stall_s; /* time this process did not run in the current wait (SIGSTOP, a debugger): not its peers' lateness */
    double posted_at;   /* when the first request of the current wait was posted: its deadline counts from there */
    size_t piece_bytes; /* the largest MPI message (4 MiB; nb_hc_set_sizes) */
    size_t seg_bytes;   /* all-reduce and reduce-scatter segments (64 MiB) */
    const char *what; /* the op in progress, for messages ("all-reduce") */
    const char *label; /* its span name when it has one */
    uint64_t seq;     /* its number on this communicator */
    int tag;
    const void **srcs; /* size entries: the sources of one rank-order sum */
    void *scratch;    /* rank-order sums: the other ranks' slices */
    size_t scratch_cap;
} nb_hc;

/* comm: an MPI communicator of its own (the caller dups it), or MPI_COMM_NULL-equivalent when
 * size == 1 (pass NULL). */
void nb_hc_init(nb_hc *h, void *mpi_comm, int rank, int size, double timeout_s);
void nb_hc_free(nb_hc *h);
/* The segment and message sizes of h's collectives (0: the default); nb_comm_set_message_sizes
 * sets an instance's. */
void nb_hc_set_sizes(nb_hc *h, size_t seg_bytes, size_t piece_bytes);
/* Names the op for messages and tags; call before each op. */
void nb_hc_begin(nb_hc *h, const char *what, const char *label, uint64_t seq);

void nb_hc_all_reduce(nb_hc *h, const void *send, void *recv, size_t count, nb_comm_dtype t);
void nb_hc_reduce_scatter(nb_hc *h, const void *send, void *recv, size_t count, nb_comm_dtype t);
void nb_hc_all_gather(nb_hc *h, const void *send, void *recv, size_t count, nb_comm_dtype t);
/* counts: 4 * size entries: send_counts, send_displs, recv_counts, recv_displs (elements) */
void nb_hc_all_to_all_v(nb_hc *h, const void *send, void *recv, const size_t *counts, nb_comm_dtype t);
void nb_hc_broadcast(nb_hc *h, void *buf, size_t count, nb_comm_dtype t, int root);
void nb_hc_barrier(nb_hc *h);

/* dst = ((src[0] + src[1]) + ...) + src[n_src-1] element by element, in t (a sum type); dst may be
 * one of the sources. Exposed for the tests' single-process reference. */
void nb_hc_sum_rank_order(void *dst, const void *const *src, int n_src, size_t count, nb_comm_dtype t);

/* ---- world (world.c) ---- */
/* Process-wide all-gather of `bytes` per rank into all[size * bytes] (blocking, named rank). */
void nb_comm__all_gather_host(const void *mine, void *all, size_t bytes, const char *what);
/* An MPI communicator of its own for an instance (MPI_Comm_dup of the world; collective), or
 * NULL in a world of one. Returned as a pointer to a heap MPI_Comm, freed by nb_comm__free_mpi. */
void *nb_comm__dup_mpi(void);
void nb_comm__free_mpi(void *comm);
/* After an instance's op timed out where the waiting rank cannot tell who is missing (NCCL):
 * every rank that also timed out announces itself to the others; the ranks not heard from within
 * `grace_s` are written into `missing` ("2, 5" or "none"). Runs on any thread. */
void nb_comm__blame(uint64_t seq, double grace_s, char *missing, size_t cap);
/* The on-fail hook aborts the job unless every rank is failing together (nb_comm_check_all):
 * then it finalizes MPI so that each rank's own message is printed and none is killed. */
void nb_comm__fail_together(void);

/* ---- instances ---- */
typedef enum {
    NB_OP_ALL_REDUCE = 0,
    NB_OP_REDUCE_SCATTER,
    NB_OP_ALL_GATHER,
    NB_OP_ALL_TO_ALL_V,
    NB_OP_BROADCAST,
    NB_OP_BARRIER,
} nb_comm_op_kind;
const char *nb_comm_op_name(nb_comm_op_kind k);

typedef struct nb_comm_op {
    nb_comm *c;
    nb_comm_op_kind op;
    uint64_t seq;
    const void *send;
    void *recv;
    size_t count;
    nb_comm_dtype dt;
    int root;
    char label[40];
    size_t counts[]; /* all-to-all-v: 4 * size (see nb_hc_all_to_all_v) */
} nb_comm_op;

struct nb_comm {
    nb_comm_kind kind;
    const nb_backend_i *be;
    nb_lanes *L;
    nb_lane *lane;
    double timeout_s;
    int step;
    int rank, size;
    uint64_t seq;   /* ops enqueued so far */
    void *mpi_comm; /* mpi and host: this instance's MPI communicator (NULL in a world of one) */
    nb_hc hc;       /* mpi and host: the rank-order collectives */
    void *impl;     /* host: nb_comm_stage; nccl: nb_comm_nccl state */
    /* sm_free: all-gather and all-to-all-v run on ce_lane (host: `lane` itself; nccl: a host lane
     * of the instance's own), by ce (comm_peer.c). last_lane: the lane of the latest op, which
     * the next op waits for when it goes to the other lane (ops keep their enqueue order). */
    nb_lane *ce_lane;
    nb_lane *last_lane;
    struct nb_comm_ce *ce;
};

/* comm.c: run one op on host buffers with h (the mpi kind; the host kind on its pinned copies) */
void nb_comm_run_hc(nb_hc *h, const nb_comm_op *op, const void *send, void *recv);

#ifdef NB_WITH_CUDA
/* comm_host.c: staging through pinned host memory (the host kind's ops; --comm-sm-free's across
 * machines). Created on the thread whose current device the copies use. */
typedef struct nb_comm_stage nb_comm_stage;
nb_comm_stage *nb_comm_stage_create(const nb_backend_i *be);
void nb_comm_stage_destroy(nb_comm_stage *s);
/* Any op: D2H, the collective on hc over the host copies, H2D; returns once the result is in recv. */
void nb_comm_stage_run(nb_comm_stage *s, nb_hc *hc, const nb_comm_op *op);
/* unique GPUs? (every rank gathers every rank's GPU UUID) */
int nb_comm_gpus_unique(void);

/* comm_peer.c: --comm-sm-free's all-gather and all-to-all-v (collective create; c's kind, lane
 * and, for the host kind, its hc and staging are set up first). */
typedef struct nb_comm_ce nb_comm_ce;
/* staged: the host-staged path even when every rank is on one machine (nb_comm_opts.sm_free_staged) */
nb_comm_ce *nb_comm_ce_create(nb_comm *c, int staged);
void nb_comm_ce_destroy(nb_comm_ce *ce); /* its lane drained first */
void nb_comm_ce_run(nb_comm_ce *ce, const nb_comm_op *op);
/* nb_comm_set_message_sizes for ce's own collectives (ce may be NULL: nothing) */
void nb_comm_ce_set_message_sizes(nb_comm_ce *ce, size_t seg_bytes, size_t piece_bytes);
#endif
#if defined(NB_WITH_CUDA) && defined(NB_WITH_NCCL)
void nb_comm_nccl_create(nb_comm *c);
void nb_comm_nccl_destroy(nb_comm *c);
void nb_comm_nccl_run(nb_comm *c, nb_comm_op *op, void *stream);
#endif

#endif
