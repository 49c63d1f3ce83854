/* Ranks from the launcher's environment, MPI's start and end, the process-wide helpers (agree,
 * check, broadcast, barrier) and the on-fail hook that aborts the job.
 *
 * Launchers, in the order they are recognised:
 *   mpirun (Open MPI)  OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK
 *   srun (Slurm step)  SLURM_PROCID / SLURM_STEP_NUM_TASKS / SLURM_LOCALID (MPI starts through
 *                      PMI or PMIx: srun --mpi=pmix). A batch script's own shell has no step
 *                      variables, so `nobubble` run directly inside sbatch is one process.
 *   pmi                PMI_RANK / PMI_SIZE (another PMI launcher, e.g. srun --mpi=pmi2)
 *   torchrun           RANK / WORLD_SIZE / LOCAL_RANK: read, but torchrun starts no MPI job, so a
 *                      WORLD_SIZE above 1 is refused before MPI is touched.
 * A world of one (no launcher, or -np 1) never initialises MPI: no singleton start (~0.3 s), no
 * MPI output, nothing changes for a single process. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm_internal.h"
#include "core.h"
#include "host.h"

typedef struct {
    int inited, mpi, finalized;
    int rank, size, local_rank, local_size;
    const char *launcher;
    double timeout_s;
    void *helpers; /* MPI communicator of the process-wide helpers (main thread) */
    void *blame;   /* MPI communicator of nb_comm__blame (any thread, failures only) */
    nb_hc hc;      /* the helpers' collectives */
    uint64_t seq;  /* helpers' ops so far */
} nb_world;

static nb_world W = {.size = 1, .local_size = 1, .launcher = "none", .timeout_s = NB_COMM_TIMEOUT_DEFAULT};
/* Set from any thread by nb_comm__fail_together, read by the hook. */
static volatile int fail_together;

#define NB_LAUNCH_HINT                                                                             \
    "launch several ranks with mpirun -np N nobubble ... (or srun -n N --mpi=pmix nobubble ...); " \
    "unset WORLD_SIZE to run one process"

/* -1 when unset; fails when set to something that is not a count */
static int env_int(const char *name) {
    const char *s = getenv(name);
    if (!s || !s[0]) return -1;
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < 0 || v > INT_MAX)
        nb_fail("unset it, or launch with mpirun or srun, which set it", "%s='%s' is not a rank or rank count", name, s);
    return (int)v;
}

typedef struct {
    const char *launcher;
    int rank, size, local_rank; /* local_rank -1: not given */
} env_world;

static env_world env_detect(void) {
    static const struct {
        const char *launcher, *rank, *size, *local;
    } tab[] = {
        {"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
        {"srun", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID"},
        {"pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"},
        {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
    };
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++) {
        int size = env_int(tab[i].size);
        if (size < 0) continue;
        int rank = env_int(tab[i].rank);
        NB_CHECK(size >= 1 && rank >= 0 && rank < size, NB_LAUNCH_HINT, "%s=%d and %s=%d do not make a rank of a job",
                 tab[i].size, size, tab[i].rank, rank);
        return (env_world){tab[i].launcher, rank, size, env_int(tab[i].local)};
    }
    return (env_world){"none", 0, 1, 0};
}

#ifdef NB_WITH_MPI

static NB_NORETURN void mpi_fail(int rc, const char *call) {
    char s[MPI_MAX_ERROR_STRING + 1] = "";
    int len = 0;
    if (MPI_Error_string(rc, s, &len) != MPI_SUCCESS) snprintf(s, sizeof s, "MPI error %d", rc);
    nb_fail("check the launcher's own messages above (mpirun, srun)", "rank %d: %s failed: %s", W.rank, call, s);
}
#define MPI_CHECK(call)                                                                            \
    do {                                                                                           \
        int nb_rc_ = (call);                                                                       \
        if (nb_rc_ != MPI_SUCCESS) mpi_fail(nb_rc_, #call);                                        \
    } while (0)

/* nb_fail anywhere on a rank of a running job: abort every rank, so none waits for this one
 * (mpirun prints "MPI_ABORT was invoked on rank R", naming it). When every rank fails together
 * (nb_comm_check_all), finalize instead: each prints its own message and exits 1, none is killed. */
static void on_fail(void) {
    if (!W.mpi || W.finalized) return;
    if (fail_together) {
        W.finalized = 1;
        MPI_Finalize();
        return;
    }
    /* mpirun's own "MPI_ABORT was invoked on rank R" banner is sometimes lost (Open MPI 4.1:
     * "ORTE_ERROR_LOG: Data unpack would read past end of buffer"), so name the rank here too */
    fprintf(stderr, "nobubble: rank %d of %d failed (the error above): aborting every rank\n", W.rank, W.size);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

static void *dup_world(void) {
    MPI_Comm *c = nb_malloc(sizeof *c, "MPI communicator");
    MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, c)); /* inherits MPI_ERRORS_RETURN */
    return c;
}

static void mpi_start(int *argc, char ***argv, env_world e) {
    int provided = 0;
    int rc = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS) nb_fail("check the launcher's messages above", "%s started %d ranks but MPI_Init_thread failed (%d)", e.launcher, e.size, rc);
    W.mpi = 1;
    MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    /* Comm lanes of several instances and the main thread's helpers call MPI at the same time */
    NB_CHECK(provided >= MPI_THREAD_MULTIPLE, "use an MPI built with thread support (Debian's openmpi is)",
             "MPI provides thread level %d, nobubble needs MPI_THREAD_MULTIPLE (%d)", provided, MPI_THREAD_MULTIPLE);
    int size = 0, rank = 0;
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    NB_CHECK(size == e.size && rank == e.rank,
             "with srun, pick the PMI that this MPI speaks (srun --mpi=pmix; srun --mpi=list shows them); "
             "or launch with the mpirun of the Open MPI nobubble was built with",
             "%s says this is rank %d of %d, but MPI sees rank %d of a world of %d", e.launcher, e.rank, e.size, rank,
             size);
    W.rank = rank, W.size = size;
    /* from here on a failure on this rank ends the job (the checks above fail alike on every rank,
     * or in a singleton MPI: no abort banner for them) */
    nb_set_fail_hook(on_fail);
    MPI_Comm node;
    MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
    MPI_CHECK(MPI_Comm_rank(node, &W.local_rank));
    MPI_CHECK(MPI_Comm_size(node, &W.local_size));
    MPI_CHECK(MPI_Comm_free(&node));
    /* the launcher's local rank, when it gives one, is the one its GPU binding follows */
    if (e.local_rank >= 0 && e.local_rank < W.local_size) W.local_rank = e.local_rank;
    int was = nb_host_cores(), now = nb_host_spread(W.local_rank, W.local_size);
    if (now && rank == 0)
        nb_log(1, "ranks       the launcher bound each rank to %d core%s: widened to its share of the node, %d cores "
               "(NB_KEEP_BINDING=1 keeps the launcher's binding)\n", was, was == 1 ? "" : "s", now);
    W.helpers = dup_world();
    W.blame = dup_world();
    nb_hc_init(&W.hc, W.helpers, W.rank, W.size, W.timeout_s);
}

#endif

void nb_comm_init(int *argc, char ***argv) {
    if (W.inited) return;
    W.inited = 1;
    env_world e = env_detect();
    W.launcher = e.launcher;
    if (e.size == 1) {
        nb_hc_init(&W.hc, NULL, 0, 1, W.timeout_s);
        return;
    }
    if (strcmp(e.launcher, "torchrun") == 0)
        nb_fail(NB_LAUNCH_HINT,
                "WORLD_SIZE=%d says this process is rank %d of %d, but no MPI launcher started it: nobubble's ranks "
                "talk over MPI, and torchrun starts no MPI job",
                e.size, e.rank, e.size);
#ifdef NB_WITH_MPI
    mpi_start(argc, argv, e);
#else
    (void)argc, (void)argv;
    nb_fail("install libopenmpi-dev and openmpi-bin (bash scripts/setup.sh), then rebuild (make clean && make)",
            "%s started %d ranks but this build of nobubble has no MPI", e.launcher, e.size);
#endif
}

void nb_comm_finalize(void) {
    if (!W.inited || !W.mpi || W.finalized) return;
#ifdef NB_WITH_MPI
    /* MPI_Finalize waits for every rank without a deadline: a barrier first names a stalled rank */
    nb_comm_barrier_host();
    nb_hc_free(&W.hc);
    nb_comm__free_mpi(W.helpers);
    nb_comm__free_mpi(W.blame);
    W.helpers = W.blame = NULL;
    nb_set_fail_hook(NULL);
    W.finalized = 1;
    MPI_CHECK(MPI_Finalize());
#endif
}

static void ensure(void) {
    if (!W.inited) nb_comm_init(NULL, NULL);
}

int nb_comm_rank(void) { return ensure(), W.rank; }
int nb_comm_size(void) { return ensure(), W.size; }
int nb_comm_local_rank(void) { return ensure(), W.local_rank; }
int nb_comm_local_size(void) { return ensure(), W.local_size; }
const char *nb_comm_launcher(void) { return ensure(), W.launcher; }

int nb_comm_pick_device(int ndev) {
    NB_CHECK(ndev >= 1, "check nvidia-smi; or run on the CPU (--device cpu)", "no GPU to pick for rank %d",
             nb_comm_rank());
    return nb_comm_local_rank() % ndev;
}

int nb_comm_have_mpi(void) {
#ifdef NB_WITH_MPI
    return 1;
#else
    return 0;
#endif
}

int nb_comm_have_nccl(void) {
#if defined(NB_WITH_CUDA) && defined(NB_WITH_NCCL)
    return 1;
#else
    return 0;
#endif
}

void nb_comm_set_timeout(double seconds) {
    NB_CHECK(seconds > 0, "give --comm-timeout a positive number of seconds", "comm timeout %g s is not positive", seconds);
    ensure();
    W.timeout_s = seconds;
    W.hc.timeout_s = seconds;
}

double nb_comm_timeout(void) { return W.timeout_s; }

void nb_comm_printf0(const char *fmt, ...) {
    if (nb_comm_rank() != 0) return;
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    fflush(stdout);
}

static nb_hc *helpers(const char *what) {
    ensure();
    nb_hc_begin(&W.hc, what, NULL, ++W.seq);
    return &W.hc;
}

void nb_comm_all_gather_host(const void *mine, void *all, size_t bytes, const char *what) {
    nb_hc_all_gather(helpers(what), mine, all, bytes, NB_COMM_U8);
}

void nb_comm__all_gather_host(const void *mine, void *all, size_t bytes, const char *what) {
    nb_comm_all_gather_host(mine, all, bytes, what);
}

void nb_comm_all_to_all_v_host(const void *send, const size_t *send_counts, const size_t *send_displs, void *recv,
                               const size_t *recv_counts, const size_t *recv_displs, size_t elem_bytes, const char *what) {
    int N = nb_comm_size();
    size_t *c = nb_malloc(4 * (size_t)N * sizeof *c, "all-to-all counts");
    for (int j = 0; j < N; j++) { /* in bytes: the helpers' element type is one byte */
        c[j] = send_counts[j] * elem_bytes, c[N + j] = send_displs[j] * elem_bytes;
        c[2 * N + j] = recv_counts[j] * elem_bytes, c[3 * N + j] = recv_displs[j] * elem_bytes;
    }
    nb_hc_all_to_all_v(helpers(what), send, recv, c, NB_COMM_U8);
    free(c);
}

static int64_t *gather_i64(int64_t v, const char *what) {
    int64_t *all = nb_malloc((size_t)nb_comm_size() * sizeof *all, what);
    nb_comm__all_gather_host(&v, all, sizeof v, what);
    return all;
}

int64_t nb_comm_agree_min_i64(int64_t value) {
    int64_t *all = gather_i64(value, "agree-min");
    for (int k = 0; k < W.size; k++) value = all[k] < value ? all[k] : value;
    free(all);
    return value;
}

int64_t nb_comm_agree_max_i64(int64_t value) {
    int64_t *all = gather_i64(value, "agree-max");
    for (int k = 0; k < W.size; k++) value = all[k] > value ? all[k] : value;
    free(all);
    return value;
}

double nb_comm_sum_f64_host(double value) {
    double *all = nb_malloc((size_t)nb_comm_size() * sizeof *all, "sum");
    nb_comm__all_gather_host(&value, all, sizeof value, "sum");
    double s = all[0]; /* rank order: the bits of one process adding them in that order */
    for (int k = 1; k < W.size; k++) s += all[k];
    free(all);
    return s;
}

typedef struct {
    int32_t ok;
    char msg[1024]; /* room for an error that lists every place a file was looked for */
    char hint[256];
} check_rec;

void nb_comm_check_all_at(const char *file, int line, int ok, const char *hint, const char *fmt, ...) {
    check_rec mine = {.ok = ok != 0};
    if (!ok) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(mine.msg, sizeof mine.msg, fmt, ap);
        va_end(ap);
        snprintf(mine.hint, sizeof mine.hint, "%s", hint ? hint : "");
    }
    ensure();
    if (W.size == 1) {
        if (!ok) nb_fail_at(file, line, mine.hint, "%s", mine.msg);
        return;
    }
    check_rec *all = nb_malloc((size_t)W.size * sizeof *all, "check on every rank");
    nb_comm__all_gather_host(&mine, all, sizeof mine, "check");
    int first = -1, nbad = 0;
    for (int k = 0; k < W.size; k++)
        if (!all[k].ok) nbad++, first = first < 0 ? k : first;
    if (nbad == 0) {
        free(all);
        return;
    }
    all[first].msg[sizeof all[first].msg - 1] = all[first].hint[sizeof all[first].hint - 1] = 0;
    char more[48] = "";
    if (nbad > 1) snprintf(more, sizeof more, " (and %d other rank%s)", nbad - 1, nbad > 2 ? "s" : "");
    nb_comm__fail_together();
    nb_fail_at(file, line, all[first].hint, "rank %d: %s%s", first, all[first].msg, more);
}

void nb_comm_bcast_host(void *buf, size_t bytes, int root) {
    NB_CHECK(root >= 0 && root < nb_comm_size(), "this is a bug in nobubble; please report it",
             "broadcast from rank %d of a world of %d", root, W.size);
    nb_hc_broadcast(helpers("broadcast"), buf, bytes, NB_COMM_U8, root);
}

void nb_comm_barrier_host(void) { nb_hc_barrier(helpers("barrier")); }

void nb_comm__fail_together(void) { fail_together = 1; }

void *nb_comm__dup_mpi(void) {
    ensure();
    if (!W.mpi) return NULL;
#ifdef NB_WITH_MPI
    /* MPI_Comm_dup waits for every rank with no deadline: a barrier that names a missing rank first */
    nb_comm_barrier_host();
    return dup_world();
#else
    return NULL;
#endif
}

void nb_comm__free_mpi(void *comm) {
    if (!comm) return;
#ifdef NB_WITH_MPI
    MPI_CHECK(MPI_Comm_free((MPI_Comm *)comm));
#endif
    free(comm);
}

void nb_comm__blame(uint64_t seq, double grace_s, char *missing, size_t cap) {
    snprintf(missing, cap, "none");
    if (!W.mpi || W.finalized) return;
#ifdef NB_WITH_MPI
    /* Leaked on purpose: the job is about to be aborted, and a peer may still write into them. */
    const int N = W.size, r = W.rank;
    uint64_t *got = nb_calloc((size_t)N, sizeof *got, "blame");
    MPI_Request *rq = nb_malloc((size_t)N * 2 * sizeof *rq, "blame");
    static uint64_t sent;
    sent = seq;
    MPI_Comm bc = *(MPI_Comm *)W.blame;
    for (int j = 0; j < N; j++) {
        rq[2 * j] = rq[2 * j + 1] = MPI_REQUEST_NULL;
        if (j == r) continue;
        if (MPI_Isend(&sent, 8, MPI_BYTE, j, 1, bc, &rq[2 * j]) != MPI_SUCCESS) return;
        if (MPI_Irecv(&got[j], 8, MPI_BYTE, j, 1, bc, &rq[2 * j + 1]) != MPI_SUCCESS) return;
    }
    double end = nb_now() + grace_s;
    int all = 0;
    while (!all && nb_now() < end) {
        all = 1;
        for (int j = 0; j < N; j++) {
            int flag = 1;
            if (rq[2 * j + 1] != MPI_REQUEST_NULL && MPI_Test(&rq[2 * j + 1], &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS)
                return;
            all &= flag;
        }
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
    size_t o = 0;
    for (int j = 0; j < N && o + 16 < cap; j++)
        if (rq[2 * j + 1] != MPI_REQUEST_NULL) o += (size_t)snprintf(missing + o, cap - o, "%s%d", o ? ", " : "", j);
    if (o == 0) snprintf(missing, cap, "none");
#else
    (void)seq, (void)grace_s;
#endif
}
