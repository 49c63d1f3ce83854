/* Comm instances: the kind (auto resolved), the lane, and every op as one task on that lane.
 *
 * An op is checked and copied into a heap record when it is enqueued (so the caller's count
 * arrays can go away), then the lane runs it: mpi on the lane's thread (hostcoll.c), host on the
 * lane's thread with copies through pinned memory (comm_host.c), nccl on the lane's stream
 * (comm_nccl.c; on CUDA a device lane's task runs at enqueue and only launches). With sm_free,
 * all-gather and all-to-all-v go to the copy-engine lane instead (comm_peer.c). The record is
 * freed by the task. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdlib.h>
#include <string.h>

#include "comm/comm_internal.h"
#include "core.h"

static const char *const kind_names[NB_COMM_KIND_COUNT] = {"auto", "mpi", "nccl", "host"};

nb_comm_kind nb_comm_kind_parse(const char *s) {
    for (int k = 0; k < NB_COMM_KIND_COUNT; k++)
        if (s && strcmp(s, kind_names[k]) == 0) return (nb_comm_kind)k;
    nb_fail("use --comm auto (the default), nccl (one GPU per rank), host (GPU buffers through host memory, "
            "also for ranks sharing a GPU) or mpi (the CPU backend)",
            "unknown --comm '%s'", s ? s : "(null)");
}

const char *nb_comm_kind_name(nb_comm_kind k) {
    NB_ASSERT(k >= 0 && k < NB_COMM_KIND_COUNT);
    return kind_names[k];
}

size_t nb_comm_dtype_size(nb_comm_dtype t) {
    static const size_t sz[NB_COMM_DTYPE_COUNT] = {4, 8, 4, 8, 2, 1};
    NB_ASSERT(t >= 0 && t < NB_COMM_DTYPE_COUNT);
    return sz[t];
}

const char *nb_comm_dtype_name(nb_comm_dtype t) {
    static const char *const n[NB_COMM_DTYPE_COUNT] = {"f32", "f64", "i32", "i64", "bf16", "u8"};
    NB_ASSERT(t >= 0 && t < NB_COMM_DTYPE_COUNT);
    return n[t];
}

const char *nb_comm_op_name(nb_comm_op_kind k) {
    static const char *const n[] = {"all-reduce", "reduce-scatter", "all-gather", "all-to-all-v", "broadcast", "barrier"};
    return n[k];
}

/* ---- kind ---- */

static nb_comm_kind resolve_auto(const nb_backend_i *be) {
    if (be->device == NB_DEV_CPU) return NB_COMM_MPI;
#ifdef NB_WITH_CUDA
    if (!nb_comm_gpus_unique()) return NB_COMM_HOST;
    return nb_comm_have_nccl() ? NB_COMM_NCCL : NB_COMM_HOST;
#else
    return NB_COMM_MPI;
#endif
}

static void check_kind_fits(nb_comm_kind k, const nb_backend_i *be) {
    int gpu = be->device != NB_DEV_CPU;
    NB_CHECK(k != NB_COMM_MPI || !gpu, "with --device cuda use --comm host, nccl or auto",
             "--comm mpi moves host memory, but backend '%s' keeps its buffers on the GPU", be->name);
    NB_CHECK(k == NB_COMM_MPI || gpu, "on the CPU use --comm mpi (or auto); host and nccl need --device cuda",
             "--comm %s moves GPU buffers, but backend '%s' keeps them in host memory", kind_names[k], be->name);
#ifndef NB_WITH_CUDA
    NB_CHECK(!gpu, "rebuild with nvcc on the PATH", "--comm %s needs CUDA, and this build has none", kind_names[k]);
#endif
    if (k != NB_COMM_NCCL) return;
    NB_CHECK(nb_comm_have_nccl(), "point the build at NCCL (make NCCL_HOME=DIR, DIR holding include/nccl.h), or use --comm host",
             "--comm nccl: this build has no NCCL");
#ifdef NB_WITH_CUDA
    NB_CHECK(nb_comm_gpus_unique(), "use --comm host (auto picks it when ranks share a GPU), or start one rank per GPU",
             "--comm nccl needs one GPU per rank, but ranks share a GPU (NCCL refuses duplicate GPUs)");
#endif
}

/* ---- instances ---- */

nb_comm *nb_comm_create(nb_lanes *L, const nb_backend_i *be, const nb_comm_opts *o) {
    NB_ASSERT(L && be && o);
    nb_comm_init(NULL, NULL);
    nb_comm *c = nb_calloc(1, sizeof *c, "comm instance");
    c->L = L;
    c->be = be;
    c->rank = nb_comm_rank();
    c->size = nb_comm_size();
    c->timeout_s = o->timeout_s > 0 ? o->timeout_s : nb_comm_timeout();
    c->kind = o->kind == NB_COMM_AUTO ? resolve_auto(be) : o->kind;
    check_kind_fits(c->kind, be);
    NB_CHECK(!o->sm_free || c->kind != NB_COMM_MPI,
             "--comm-sm-free is for GPU ranks (--device cuda, --comm host or nccl); drop it on the CPU",
             "--comm-sm-free moves GPU buffers with copy engines, but backend '%s' keeps its buffers in host memory "
             "(--comm mpi)",
             be->name);
    nb_lane_kind want = c->kind == NB_COMM_NCCL ? NB_LANE_DEVICE : NB_LANE_HOST;
    c->lane = o->lane ? o->lane : nb_lane_create(L, o->name ? o->name : "comm", want);
    NB_CHECK(nb_lane_get_kind(c->lane) == want, "this is a bug in nobubble; please report it",
             "--comm %s runs on a %s lane, lane '%s' is not one", kind_names[c->kind],
             want == NB_LANE_HOST ? "host" : "device", nb_lane_name(c->lane));
    switch (c->kind) {
    case NB_COMM_MPI:
    case NB_COMM_HOST:
        c->mpi_comm = nb_comm__dup_mpi();
        nb_hc_init(&c->hc, c->mpi_comm, c->rank, c->size, c->timeout_s);
#ifdef NB_WITH_CUDA
        if (c->kind == NB_COMM_HOST) c->impl = nb_comm_stage_create(be);
#endif
        break;
    case NB_COMM_NCCL:
#if defined(NB_WITH_CUDA) && defined(NB_WITH_NCCL)
        nb_comm_nccl_create(c);
#endif
        break;
    default: NB_ASSERT(!"comm kind");
    }
#ifdef NB_WITH_CUDA
    if (o->sm_free) {
        if (c->kind == NB_COMM_HOST) {
            c->ce_lane = c->lane; /* already a host lane with an MPI communicator */
        } else {
            char name[40];
            snprintf(name, sizeof name, "%s-ce", o->name ? o->name : "comm");
            c->ce_lane = nb_lane_create(L, name, NB_LANE_HOST);
        }
        c->ce = nb_comm_ce_create(c, o->sm_free_staged);
    }
#endif
    return c;
}

void nb_comm_destroy(nb_comm *c) {
    if (!c) return;
    nb_mark_wait_host(nb_lane_mark(c->lane));
    if (c->ce_lane && c->ce_lane != c->lane) nb_mark_wait_host(nb_lane_mark(c->ce_lane));
#ifdef NB_WITH_CUDA
    nb_comm_ce_destroy(c->ce); /* before the staging it may borrow */
    if (c->kind == NB_COMM_HOST) nb_comm_stage_destroy(c->impl);
#endif
#if defined(NB_WITH_CUDA) && defined(NB_WITH_NCCL)
    if (c->kind == NB_COMM_NCCL) nb_comm_nccl_destroy(c);
#endif
    nb_hc_free(&c->hc);
    nb_comm__free_mpi(c->mpi_comm);
    free(c);
}

nb_comm_kind nb_comm_get_kind(const nb_comm *c) { return c->kind; }
nb_lane *nb_comm_lane(nb_comm *c) { return c->lane; }
void nb_comm_set_step(nb_comm *c, int step) { c->step = step; }
void nb_comm_wait(nb_comm *c, nb_mark m) {
    nb_lane_wait(c->lane, m);
    if (c->ce_lane && c->ce_lane != c->lane) nb_lane_wait(c->ce_lane, m);
}

/* sm_free: all-gather and all-to-all-v are the copy engines' */
static int on_ce(const nb_comm *c, nb_comm_op_kind k) {
    return c->ce && (k == NB_OP_ALL_GATHER || k == NB_OP_ALL_TO_ALL_V);
}

/* ---- ops ---- */

/* Run op on host buffers (mpi kind directly; host kind on its pinned copies). */
void nb_comm_run_hc(nb_hc *h, const nb_comm_op *op, const void *send, void *recv) {
    nb_hc_begin(h, nb_comm_op_name(op->op), op->label, op->seq);
    switch (op->op) {
    case NB_OP_ALL_REDUCE: nb_hc_all_reduce(h, send, recv, op->count, op->dt); break;
    case NB_OP_REDUCE_SCATTER: nb_hc_reduce_scatter(h, send, recv, op->count, op->dt); break;
    case NB_OP_ALL_GATHER: nb_hc_all_gather(h, send, recv, op->count, op->dt); break;
    case NB_OP_ALL_TO_ALL_V: nb_hc_all_to_all_v(h, send, recv, op->counts, op->dt); break;
    case NB_OP_BROADCAST: nb_hc_broadcast(h, recv, op->count, op->dt, op->root); break;
    case NB_OP_BARRIER: nb_hc_barrier(h); break;
    }
}

static void run_op(void *arg, const nb_task_ctx *ctx) {
    nb_comm_op *op = arg;
    nb_comm *c = op->c;
#ifdef NB_WITH_CUDA
    if (on_ce(c, op->op)) {
        nb_comm_ce_run(c->ce, op);
        free(op);
        return;
    }
#endif
    switch (c->kind) {
    case NB_COMM_MPI: nb_comm_run_hc(&c->hc, op, op->send, op->recv); break;
#ifdef NB_WITH_CUDA
    case NB_COMM_HOST: nb_comm_stage_run(c->impl, &c->hc, op); break;
#endif
#if defined(NB_WITH_CUDA) && defined(NB_WITH_NCCL)
    case NB_COMM_NCCL:
        NB_CHECK(ctx->stream, "this is a bug in nobubble; please report it",
                 "--comm nccl needs a \"cuda\" lanes runtime (lane '%s' has no stream)", nb_lane_name(ctx->lane));
        nb_comm_nccl_run(c, op, ctx->stream);
        break;
#endif
    default: NB_ASSERT(!"comm kind");
    }
    free(op);
}

static nb_comm_op *new_op(nb_comm *c, nb_comm_op_kind k, const void *send, void *recv, size_t count, nb_comm_dtype t,
                          const char *name, size_t ncounts) {
    NB_ASSERT(c && t >= 0 && t < NB_COMM_DTYPE_COUNT);
    nb_comm_op *op = nb_calloc(1, sizeof *op + ncounts * sizeof(size_t), "comm op");
    *op = (nb_comm_op){.c = c, .op = k, .send = send, .recv = recv, .count = count, .dt = t};
    snprintf(op->label, sizeof op->label, "%s", name ? name : "");
    return op;
}

static nb_mark enqueue(nb_comm *c, nb_comm_op *op, const char *name) {
    op->seq = ++c->seq;
    nb_lane *lane = on_ce(c, op->op) ? c->ce_lane : c->lane;
    /* the contract of comm.h: an op sees its predecessors' results, whichever lane ran them */
    if (c->last_lane && c->last_lane != lane) nb_lane_wait(lane, nb_lane_mark(c->last_lane));
    c->last_lane = lane;
    nb_lane_run(lane, name ? name : nb_comm_op_name(op->op), NB_SPAN_COMM, c->step, run_op, op);
    return nb_lane_mark(lane);
}

static void check_sum_type(nb_comm_dtype t, const char *what) {
    NB_CHECK(t == NB_COMM_F32 || t == NB_COMM_F64 || t == NB_COMM_I32 || t == NB_COMM_I64,
             "sum f32, f64, i32 or i64 buffers (convert bf16 to f32 first)", "%s of %s: no sum for that type", what,
             nb_comm_dtype_name(t));
}

static void check_buffers(const void *send, const void *recv, size_t count, const char *what) {
    NB_CHECK(count == 0 || (send && recv), "this is a bug in nobubble; please report it", "%s of %zu elements with a NULL buffer",
             what, count);
}

nb_mark nb_comm_all_reduce(nb_comm *c, const void *send, void *recv, size_t count, nb_comm_dtype t, const char *name) {
    check_sum_type(t, "all-reduce");
    check_buffers(send, recv, count, "all-reduce");
    return enqueue(c, new_op(c, NB_OP_ALL_REDUCE, send, recv, count, t, name, 0), name);
}

nb_mark nb_comm_reduce_scatter(nb_comm *c, const void *send, void *recv, size_t count, nb_comm_dtype t,
                               const char *name) {
    check_sum_type(t, "reduce-scatter");
    check_buffers(send, recv, count, "reduce-scatter");
    return enqueue(c, new_op(c, NB_OP_REDUCE_SCATTER, send, recv, count, t, name, 0), name);
}

nb_mark nb_comm_all_gather(nb_comm *c, const void *send, void *recv, size_t count, nb_comm_dtype t, const char *name) {
    check_buffers(send, recv, count, "all-gather");
    return enqueue(c, new_op(c, NB_OP_ALL_GATHER, send, recv, count, t, name, 0), name);
}

nb_mark nb_comm_all_to_all_v(nb_comm *c, const void *send, const size_t *send_counts, const size_t *send_displs,
                             void *recv, const size_t *recv_counts, const size_t *recv_displs, nb_comm_dtype t,
                             const char *name) {
    NB_ASSERT(send_counts && send_displs && recv_counts && recv_displs);
    const int N = c->size;
    nb_comm_op *op = new_op(c, NB_OP_ALL_TO_ALL_V, send, recv, 0, t, name, 4 * (size_t)N);
    size_t send_end = 0, recv_end = 0, es = nb_comm_dtype_size(t);
    for (int j = 0; j < N; j++) {
        op->counts[j] = send_counts[j];
        op->counts[N + j] = send_displs[j];
        op->counts[2 * N + j] = recv_counts[j];
        op->counts[3 * N + j] = recv_displs[j];
        if (send_counts[j] && send_displs[j] + send_counts[j] > send_end) send_end = send_displs[j] + send_counts[j];
        if (recv_counts[j] && recv_displs[j] + recv_counts[j] > recv_end) recv_end = recv_displs[j] + recv_counts[j];
    }
    op->count = send_end; /* extents, for the host kind's staging */
    op->root = 0;
    check_buffers(send, recv, send_end + recv_end, "all-to-all-v");
    const char *s = send, *r = recv;
    NB_CHECK(send_end == 0 || recv_end == 0 || s + send_end * es <= r || r + recv_end * es <= s,
             "give all-to-all-v separate send and recv buffers", "all-to-all-v: send and recv overlap");
    return enqueue(c, op, name);
}

nb_mark nb_comm_all_to_all(nb_comm *c, const void *send, void *recv, size_t count, nb_comm_dtype t, const char *name) {
    const int N = c->size;
    size_t *a = nb_malloc(2 * (size_t)N * sizeof *a, "all-to-all counts");
    for (int j = 0; j < N; j++) a[j] = count, a[N + j] = (size_t)j * count;
    nb_mark m = nb_comm_all_to_all_v(c, send, a, a + N, recv, a, a + N, t, name);
    free(a);
    return m;
}

nb_mark nb_comm_broadcast(nb_comm *c, void *buf, size_t count, nb_comm_dtype t, int root, const char *name) {
    NB_CHECK(root >= 0 && root < c->size, "this is a bug in nobubble; please report it",
             "broadcast from rank %d of a world of %d", root, c->size);
    check_buffers(buf, buf, count, "broadcast");
    nb_comm_op *op = new_op(c, NB_OP_BROADCAST, buf, buf, count, t, name, 0);
    op->root = root;
    return enqueue(c, op, name);
}

nb_mark nb_comm_barrier(nb_comm *c, const char *name) {
    return enqueue(c, new_op(c, NB_OP_BARRIER, NULL, NULL, 0, NB_COMM_U8, name, 0), name);
}
