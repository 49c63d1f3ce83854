/* Communication between ranks: who we are (the launcher's ranks), and collectives enqueued on a
 * comm lane like every other piece of work.
 *
 * Transport. MPI launches the job and carries the CPU backend's data (never a home-made
 * transport); NCCL carries GPU buffers between GPUs, its unique id broadcast over MPI.
 * Three implementations behind one interface (nb_comm_kind):
 *   mpi   CPU buffers; point-to-point MPI messages, sums formed by this file in RANK ORDER.
 *   nccl  GPU buffers; one NCCL communicator, one process per GPU; ops on a device lane's stream.
 *   host  GPU buffers copied into pinned host memory, the mpi collective on them, copied back:
 *         works when several ranks share one GPU (NCCL refuses duplicate GPUs); no kernel of
 *         ours or NCCL's runs for it (and see SM-free communication below).
 *   auto  mpi on the CPU backend; nccl when every rank has its own GPU; host when ranks share one.
 *
 * Launch: `mpirun -np N nobubble ...`, or Slurm's `srun` (MPI initialised through PMI/PMIx). A
 * torchrun-style environment (RANK, WORLD_SIZE, LOCAL_RANK) is read too, but the data still
 * moves over MPI: a WORLD_SIZE > 1 without an MPI launcher is a clear error. One process with
 * no launcher is a world of 1 and never calls into MPI (MPI's singleton start costs ~0.3 s).
 *
 * Program shape (main):
 *   nb_comm_init(&argc, &argv);              // before any thread starts; installs the on-fail hook
 *   cudaSetDevice(nb_comm_pick_device(ndev)); // the local rank picks the GPU
 *   nb_comm *c = nb_comm_create(lanes, backend, &(nb_comm_opts){.kind = kind, .timeout_s = t});
 *   ...  nb_comm_wait(c, grads_ready); nb_mark m = nb_comm_all_reduce(c, g, g, n, NB_COMM_F32, "ar L3");
 *        nb_lane_wait(compute, m);           // the optimizer reads the summed gradients
 *   nb_comm_destroy(c);
 *   nb_comm_finalize();                       // every rank, at the end of main
 *
 * Failure. Every MPI, NCCL and CUDA call is checked. Waits are nonblocking requests polled
 * against a deadline (opts.timeout_s, the CLI's --comm-timeout): a rank that dies or stalls makes
 * the others fail with a message that names it ("rank 0: no data from rank 2 within 30 s in
 * all-reduce #5 (--comm-timeout) ..."), and the job is aborted (ncclCommAbort, MPI_Abort) so that
 * nothing hangs. nb_fail on any rank, anywhere, aborts the whole job (the on-fail hook of core.h).
 * mpirun itself kills the other ranks when one dies or exits without nb_comm_finalize, and names
 * it ("mpirun noticed that process rank 1 ... exited on signal 9").
 *
 * Determinism. mpi and host: every element of an all-reduce or reduce-scatter is summed in rank
 * order, out = ((x_0 + x_1) + x_2) + ... + x_{N-1}, in the element type (no FMA, no pairwise
 * tree), by one rank, and the result is copied to the others: the same bits on every rank, and the
 * bits of one process that adds the N buffers in that order (acc = x_0; acc += x_1; ...; a result
 * of zero may differ in sign from "acc = 0; acc += x_k"). nccl: the same bits run to run for a
 * fixed world size, message sizes, NCCL version and NCCL environment (we pin no NCCL_ALGO or
 * NCCL_PROTO; NVLS stays as the machine sets it), and within fp32 rounding of one rank.
 *
 * SM-free communication (opts.sm_free, --comm-sm-free; FreeScale): all-gather and all-to-all(-v)
 * move their bytes with copy engines only (no kernel of ours or NCCL's takes multiprocessors from
 * the compute beside them); reductions, broadcast and barrier stay on the instance's kind. The two
 * run as tasks on a HOST lane (host: its own lane; nccl: a lane "<name>-ce" with its own MPI
 * communicator), and ops keep their enqueue order across the two lanes (for nccl, a reduction
 * enqueued after a copy-engine op blocks the enqueuing thread until that op is done: a device
 * lane cannot wait on a host lane). Paths (comm_peer.c):
 *   one machine: CUDA IPC, each rank copying its blocks straight into the peers' recv buffers
 *     (cudaMemcpyAsync device to device) between an MPI exchange of {handle, offset, counts} and a
 *     host barrier; ranks may share a GPU. recv must lie in one cudaMalloc allocation (the
 *     backend's alloc; not cudaMallocAsync pools, cuMemCreate or managed memory); the peers keep
 *     it mapped (a few allocations a peer, the least recently used closed first) until
 *     nb_comm_destroy, so free it after that (CUDA calls freeing memory that another process has
 *     open undefined).
 *   several machines: the host kind's staging (D2H, MPI, H2D).
 * Either way the bytes are those of the other kinds. Not built: NCCL 2.28's zero-CTA path
 * (ncclConfig_t.CTAPolicy = NCCL_CTA_POLICY_ZERO on buffers in symmetric windows from
 * ncclCommWindowRegister(..., NCCL_WIN_COLL_SYMMETRIC)): the NCCL headers here are 2.28.9 and
 * have it, so --comm nccl could use it later. */
#ifndef NB_COMM_H
#define NB_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "core.h"
#include "lanes/lanes.h"
#include "ops/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- ranks (process-wide) ---- */

/* Read the launcher's environment; with a world of more than one rank, initialise MPI
 * (MPI_THREAD_MULTIPLE, errors returned, not fatal) and install the on-fail hook that aborts the
 * job. Idempotent; argc/argv may be NULL. The other nb_comm_* functions call it when it has not
 * been called, but call it from main before starting threads. Fails with a hint when the
 * environment and MPI disagree (e.g. torchrun's WORLD_SIZE=4 without mpirun or srun). */
void nb_comm_init(int *argc, char ***argv);
/* Every rank, at the end of a successful run (after nb_comm_destroy): MPI_Finalize. A rank that
 * exits without it is an abnormal end for mpirun, which then kills the job. */
void nb_comm_finalize(void);

int nb_comm_rank(void);       /* 0 .. size-1 */
int nb_comm_size(void);       /* 1 without a launcher */
int nb_comm_local_rank(void); /* rank among the ranks of this machine */
int nb_comm_local_size(void);
/* "none", "mpirun", "srun", "pmi" (another PMI launcher), or "torchrun" (env only: an error
 * unless it is a world of 1) */
const char *nb_comm_launcher(void);
/* The GPU this rank uses: local_rank % ndev (ndev >= 1). More local ranks than GPUs share them:
 * then --comm auto picks host. */
int nb_comm_pick_device(int ndev);
/* Whether this build carries MPI (Makefile's NB_MPI) and NCCL (NB_NCCL): for `nobubble info`. */
int nb_comm_have_mpi(void);
int nb_comm_have_nccl(void);

/* ---- process-wide helpers (blocking, on the calling thread; every rank calls them in the same
 * order; a rank that does not arrive within nb_comm_set_timeout's limit is named) ---- */

#define NB_COMM_TIMEOUT_DEFAULT 300.0
/* The default deadline of the helpers below and of new instances (seconds, > 0). */
void nb_comm_set_timeout(double seconds);
double nb_comm_timeout(void);
/* Rank 0 prints (to stdout), the others do not. */
void nb_comm_printf0(const char *fmt, ...) NB_PRINTF(1, 2);
/* Every rank passes its own value; every rank gets the minimum (the maximum). E.g. ranks agree on
 * the number of steps before they start, so a rank with less data never leaves others waiting. */
int64_t nb_comm_agree_min_i64(int64_t value);
int64_t nb_comm_agree_max_i64(int64_t value);
/* Every rank passes a value; every rank gets their sum in rank order (((v_0 + v_1) + v_2) ...). */
double nb_comm_sum_f64_host(double value);
/* Every rank checks a condition: when it is false on any rank, EVERY rank fails (nb_fail) with the
 * message of the lowest failing rank, prefixed "rank R: " and followed by how many others failed.
 * E.g. a data file missing on one rank is a clear error on all. Returns when ok on every rank. */
#define nb_comm_check_all(ok, hint, ...) nb_comm_check_all_at(__FILE__, __LINE__, (ok), (hint), __VA_ARGS__)
void nb_comm_check_all_at(const char *file, int line, int ok, const char *hint, const char *fmt, ...)
    NB_PRINTF(5, 6);
/* all[k * bytes ..] = rank k's `mine` (bytes each), on every rank (host memory). */
void nb_comm_all_gather_host(const void *mine, void *all, size_t bytes, const char *what);
/* Host memory, elem_bytes per element: rank r sends send[send_displs[j] ..+ send_counts[j]) to
 * rank j, which receives it at recv[recv_displs[r] ..]; counts as nb_comm_all_to_all_v's (exchange
 * them first, e.g. with nb_comm_all_gather_host or an all-to-all of N counts). */
void nb_comm_all_to_all_v_host(const void *send, const size_t *send_counts, const size_t *send_displs, void *recv,
                               const size_t *recv_counts, const size_t *recv_displs, size_t elem_bytes, const char *what);
/* bytes of buf on rank root are copied to buf on every rank (host memory). */
void nb_comm_bcast_host(void *buf, size_t bytes, int root);
/* Every rank waits until every rank has arrived. */
void nb_comm_barrier_host(void);

/* ---- instances ---- */

typedef enum { NB_COMM_AUTO = 0, NB_COMM_MPI, NB_COMM_NCCL, NB_COMM_HOST, NB_COMM_KIND_COUNT } nb_comm_kind;
/* "auto", "mpi", "nccl", "host"; anything else fails naming --comm and the choices. */
nb_comm_kind nb_comm_kind_parse(const char *s);
const char *nb_comm_kind_name(nb_comm_kind k);

/* Element types. Sums (all-reduce, reduce-scatter) take F32, F64, I32, I64; the others any. */
typedef enum { NB_COMM_F32 = 0, NB_COMM_F64, NB_COMM_I32, NB_COMM_I64, NB_COMM_BF16, NB_COMM_U8, NB_COMM_DTYPE_COUNT } nb_comm_dtype;
size_t nb_comm_dtype_size(nb_comm_dtype t);
const char *nb_comm_dtype_name(nb_comm_dtype t);

typedef struct nb_comm nb_comm;

typedef struct nb_comm_opts {
    nb_comm_kind kind;  /* NB_COMM_AUTO: see the file comment */
    double timeout_s;   /* a collective not done this long after it started fails; 0: nb_comm_timeout() */
    /* The lane the ops run on. NULL: nb_comm_create makes one named `name` ("comm"): a HOST lane
     * for mpi and host (the MPI waits run on its thread), a DEVICE lane for nccl (its stream). */
    nb_lane *lane;
    const char *name;
    /* GPU backends: all-gather and all-to-all(-v) by copy engines on a host lane (see the file
     * comment); the CPU backend (kind mpi) refuses it. */
    int sm_free;
    /* For the tests: sm_free takes the host-staged path (that of several machines) even when
     * every rank is on one machine, where it would take CUDA IPC. */
    int sm_free_staged;
} nb_comm_opts;

/* Collective over every rank (each creates its instances in the same order). backend says where
 * the buffers live (CPU: mpi; CUDA: nccl or host, on the current CUDA device, set it first).
 * Fails with a hint when the kind does not fit (host or nccl on the CPU, mpi on a GPU, nccl with
 * two ranks on one GPU, nccl or CUDA missing from the build). */
nb_comm *nb_comm_create(nb_lanes *L, const nb_backend_i *backend, const nb_comm_opts *opts);
/* Drains the instance's lanes first. Every rank destroys it (collective for nccl). */
void nb_comm_destroy(nb_comm *c);
nb_comm_kind nb_comm_get_kind(const nb_comm *c); /* auto resolved */
nb_lane *nb_comm_lane(nb_comm *c); /* the reductions' lane (sm_free's copy-engine ops may run on another) */
/* Step number for the spans of the ops enqueued from now on (per-step statistics). */
void nb_comm_set_step(nb_comm *c, int step);
/* For the tests, so that small buffers cover several segments and messages: the instance's
 * all-reduce / reduce-scatter segment size and largest MPI message (the defaults 64 MiB and
 * 4 MiB; 0 restores one). */
void nb_comm_set_message_sizes(nb_comm *c, size_t seg_bytes, size_t piece_bytes);
/* For the tests: 0 closes every sm_free peer mapping at the end of each op instead of keeping it
 * for the next op on the same buffer (1, the default). CUDA builds, sm_free instances only. */
void nb_comm_set_sm_free_keep_maps(nb_comm *c, int keep);

/* ---- collectives ----
 * Each op is enqueued on the instance's lane (with sm_free all-gather and all-to-all on its
 * copy-engine lane) as one task (span kind NB_SPAN_COMM, named `name` or the op's name when
 * NULL) and returns the lane's mark after it: reached when the results are in
 * recv on this rank and send is no longer read. Ops of one instance run one after another in
 * enqueue order, on every rank in the same order (the caller's duty: the same sequence of ops with
 * matching counts on every rank). An op starts after the marks given to nb_comm_wait before it.
 * Buffers are backend memory (host memory on the CPU, device memory on CUDA) and must stay valid
 * until the returned mark is reached. Counts are in elements. N = nb_comm_size(), r = this rank.
 * With N == 1 every op is a copy (or nothing, in place). */

/* The next op starts once m is reached (m from any lane of the same lanes runtime); with sm_free
 * both of the instance's lanes wait. */
void nb_comm_wait(nb_comm *c, nb_mark m);

/* recv[i] = sum over ranks k (in rank order) of send_k[i], i < count, on every rank.
 * In place when send == recv. */
nb_mark nb_comm_all_reduce(nb_comm *c, const void *send, void *recv, size_t count, nb_comm_dtype t,
                           const char *name);
/* send holds N chunks of count elements, chunk j for rank j; recv[i] = sum over ranks k (rank
 * order) of send_k[r * count + i]. In place when recv == send + r * count (in elements). */
nb_mark nb_comm_reduce_scatter(nb_comm *c, const void *send, void *recv, size_t count, nb_comm_dtype t,
                               const char *name);
/* recv[k * count + i] = send_k[i] on every rank. In place when send == recv + r * count. */
nb_mark nb_comm_all_gather(nb_comm *c, const void *send, void *recv, size_t count, nb_comm_dtype t,
                           const char *name);
/* Rank r sends send[send_displs[j] .. + send_counts[j]) to rank j, which puts it at
 * recv[recv_displs[r] .. + recv_counts[r]). send_counts[j] on rank r must equal recv_counts[r] on
 * rank j (a mismatch fails naming both ranks); zero counts are fine. The four arrays have N entries
 * and are copied by the call (the host knows the counts when it enqueues: exchange them first
 * with nb_comm_all_to_all and wait for its mark). send and recv must not overlap. */
nb_mark nb_comm_all_to_all_v(nb_comm *c, const void *send, const size_t *send_counts, const size_t *send_displs,
                             void *recv, const size_t *recv_counts, const size_t *recv_displs, nb_comm_dtype t,
                             const char *name);
/* The even case: send[j * count ..] goes to rank j, recv[k * count ..] comes from rank k. */
nb_mark nb_comm_all_to_all(nb_comm *c, const void *send, void *recv, size_t count, nb_comm_dtype t,
                           const char *name);
/* buf[0 .. count) of rank root is copied into buf on every rank. */
nb_mark nb_comm_broadcast(nb_comm *c, void *buf, size_t count, nb_comm_dtype t, int root, const char *name);
/* Reached on every rank only once every rank's lane has reached its barrier. */
nb_mark nb_comm_barrier(nb_comm *c, const char *name);

#ifdef __cplusplus
}
#endif
#endif
