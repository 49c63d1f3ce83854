/* The comm layer (src/comm). Run alone it is a world of one (every collective a copy, no MPI
 * call); under `mpirun -np N` (tests/comm_test.sh: N = 2, 4) it checks real results on every rank:
 *  - every collective and element type against values computed here, per rank, bitwise;
 *  - all-reduce and reduce-scatter against ONE process adding the N ranks' buffers in rank order
 *    (values like 1e8, 1, -1e8 whose sum depends on the order; the test checks that it does);
 *  - in place and not, zero and uneven counts (all-to-all-v with zeros and gaps that must stay
 *    untouched), many segments and message pieces (both shrunk), several ops in flight;
 *  - ordering on lanes: a compute lane produces a buffer (late), the comm lane all-reduces it after
 *    a mark, a third lane consumes it; the spans are NB_SPAN_COMM and in that order;
 *  - the process-wide helpers (agree, check, broadcast, barrier).
 * Modes for the shell test: --fail kill|exit|stall|fail|counts|check --fail-rank R (one rank
 * misbehaves in the middle of a run of all-reduces), --timeout S, --parse KIND, --bench MB,
 * --gpu nccl|host (exit 77 without CUDA or a GPU). --sm-free: the instance moves all-gather and
 * all-to-all by copy engines (every case above runs on it, plus the sm_free_* cases: random bytes,
 * zero, uneven and large counts, buffers reused and replaced, ops ordered across its two lanes);
 * --staged with it takes the host-staged path of several machines even on one. On the CPU,
 * --sm-free must fail with a hint. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "comm/comm.h"
#include "comm/comm_internal.h"
#include "core.h"
#include "lanes/lanes.h"
#include "ops/backend.h"

#ifdef NB_WITH_CUDA
#include <cuda_runtime.h>

#include "lanes/lanes_cuda_testkern.h"
#endif

static int R, N; /* this rank, world size */

#define RUN_C(name)                                                                                \
    do {                                                                                           \
        int before_ = nb_test_failures;                                                            \
        name();                                                                                    \
        if (nb_test_failures != before_) printf("FAIL %s (rank %d of %d)\n", #name, R, N);         \
        else if (R == 0) printf("ok   %s (%d rank%s)\n", #name, N, N > 1 ? "s" : "");             \
        fflush(stdout);                                                                            \
    } while (0)

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ---- a "device" for the collectives: host memory on the CPU, GPU memory with --gpu ---- */

typedef struct {
    const nb_backend_i *be;
    nb_lanes *L;
    nb_comm *c;
    int gpu;
    int bitwise; /* sums in rank order (mpi, host); nccl: within fp32 rounding */
    int sm_free; /* all-gather and all-to-all by copy engines */
    int staged;  /* sm_free: the host-staged path even on one machine (--staged) */
} env_t;
static env_t E;

static void *dev_alloc(size_t bytes) { return E.be->alloc(bytes ? bytes : 1, "test buffer"); }
static void dev_free(void *p) { E.be->free(p); }
static void up(void *dev, const void *host, size_t bytes);
static void *dev_zalloc(size_t bytes) {
    void *p = dev_alloc(bytes), *z = calloc(1, bytes ? bytes : 1);
    up(p, z, bytes);
    free(z);
    return p;
}
static void up(void *dev, const void *host, size_t bytes) {
#ifdef NB_WITH_CUDA
    if (E.gpu) {
        /* from pageable memory cudaMemcpy may return before the DMA lands; the comm's copies run
         * on a stream of their own, which the legacy stream does not order: wait for it */
        if (cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess)
            nb_fail(NULL, "cudaMemcpy H2D");
        return;
    }
#endif
    memcpy(dev, host, bytes);
}
static void down(void *host, const void *dev, size_t bytes) {
#ifdef NB_WITH_CUDA
    if (E.gpu) {
        if (cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) nb_fail(NULL, "cudaMemcpy D2H");
        return;
    }
#endif
    memcpy(host, dev, bytes);
}

/* ---- values ---- */

/* Rank k's element i: patterns whose sum depends on the order of the ranks. NCCL adds in an order
 * of its own: for it, multiples of 1/4 below 2^20, whose sums are exact in any order. */
static float vf32(int k, size_t i) {
    static const float pat[] = {1e8f, 1.0f, -1e8f, 0.5f, 3.0f, -7.25f, 1e-3f};
    if (!E.bitwise) return (float)(((size_t)k * 7 + i) % 13) * 0.25f - 1.5f;
    return pat[((size_t)k * 3 + i) % 7] * (1.0f + (float)(i % 5) * 0.125f);
}
static double vf64(int k, size_t i) {
    static const double pat[] = {1e17, 1.0, -1e17, 0.5, 3.0, -7.25, 1e-3};
    if (!E.bitwise) return (double)(((size_t)k * 5 + i) % 11) * 0.25 - 1.0;
    return pat[((size_t)k * 3 + i) % 7] * (1.0 + (double)(i % 5) * 0.125);
}
static int32_t vi32(int k, size_t i) { return (int32_t)(k * 100003 + (int)(i % 100000)) - 50000; }
static int64_t vi64(int k, size_t i) { return ((int64_t)(k + 1) << 33) + (int64_t)i * 7 - 3; }

static void fill_sum(void *buf, nb_comm_dtype t, int k, size_t i0, size_t n) {
    for (size_t i = 0; i < n; i++) switch (t) {
        case NB_COMM_F32: ((float *)buf)[i] = vf32(k, i0 + i); break;
        case NB_COMM_F64: ((double *)buf)[i] = vf64(k, i0 + i); break;
        case NB_COMM_I32: ((int32_t *)buf)[i] = vi32(k, i0 + i); break;
        case NB_COMM_I64: ((int64_t *)buf)[i] = vi64(k, i0 + i); break;
        default: NB_ASSERT(0);
        }
}

/* One process adding the N ranks' buffers in rank order, the way --grad-accum N would:
 * acc = x_0; acc += x_1; ... (reverse = 1: the other order, to show the order matters) */
static void ref_sum(void *out, nb_comm_dtype t, size_t i0, size_t n, int reverse) {
    size_t es = nb_comm_dtype_size(t);
    char *tmp = malloc(n * es + 1);
    for (int kk = 0; kk < N; kk++) {
        int k = reverse ? N - 1 - kk : kk;
        fill_sum(kk == 0 ? out : tmp, t, k, i0, n);
        if (kk == 0) continue;
        for (size_t i = 0; i < n; i++) switch (t) {
            case NB_COMM_F32: ((float *)out)[i] += ((float *)tmp)[i]; break;
            case NB_COMM_F64: ((double *)out)[i] += ((double *)tmp)[i]; break;
            case NB_COMM_I32: ((int32_t *)out)[i] = (int32_t)((uint32_t)((int32_t *)out)[i] + (uint32_t)((int32_t *)tmp)[i]); break;
            case NB_COMM_I64: ((int64_t *)out)[i] += ((int64_t *)tmp)[i]; break;
            default: NB_ASSERT(0);
            }
    }
    free(tmp);
}

/* Compare: bitwise, or (nccl, floats) within a relative tolerance of the largest partial sum. */
static int same(const void *got, const void *want, nb_comm_dtype t, size_t n) {
    if (E.bitwise || (t != NB_COMM_F32 && t != NB_COMM_F64)) return memcmp(got, want, n * nb_comm_dtype_size(t)) == 0;
    for (size_t i = 0; i < n; i++) {
        double g = t == NB_COMM_F32 ? ((const float *)got)[i] : ((const double *)got)[i];
        double w = t == NB_COMM_F32 ? ((const float *)want)[i] : ((const double *)want)[i];
        if (fabs(g - w) > 1e-5 * (1.0 + fabs(w))) return 0;
    }
    return 1;
}

/* Generic element of the data-movement tests: an integer code written in the element's type. */
static void put(void *buf, nb_comm_dtype t, size_t i, int64_t code) {
    switch (t) {
    case NB_COMM_F32: ((float *)buf)[i] = (float)code; break;
    case NB_COMM_F64: ((double *)buf)[i] = (double)code; break;
    case NB_COMM_I32: ((int32_t *)buf)[i] = (int32_t)code; break;
    case NB_COMM_I64: ((int64_t *)buf)[i] = code * 1000003; break;
    case NB_COMM_BF16: ((uint16_t *)buf)[i] = (uint16_t)(code * 31); break;
    case NB_COMM_U8: ((uint8_t *)buf)[i] = (uint8_t)(code * 7); break;
    default: NB_ASSERT(0);
    }
}
static int64_t code_of(int from, int to, size_t e) { return (int64_t)from * 1000 + to * 37 + (int64_t)e; }

/* ---- collectives ---- */

static void check_all_reduce(nb_comm_dtype t, size_t n, int in_place) {
    size_t es = nb_comm_dtype_size(t), bytes = n * es;
    char *h = malloc(bytes + 1), *want = malloc(bytes + 1), *got = malloc(bytes + 1);
    fill_sum(h, t, R, 0, n);
    ref_sum(want, t, 0, n, 0);
    void *send = dev_alloc(bytes), *recv = in_place ? send : dev_alloc(bytes);
    up(send, h, bytes);
    nb_mark_wait_host(nb_comm_all_reduce(E.c, send, recv, n, t, "ar test"));
    down(got, recv, bytes);
    CHECK(same(got, want, t, n), "all-reduce %s n=%zu in_place=%d differs from the rank-order sum", nb_comm_dtype_name(t), n,
          in_place);
    if (!in_place) {
        down(got, send, bytes);
        CHECK(memcmp(got, h, bytes) == 0, "all-reduce changed its send buffer");
        dev_free(recv);
    }
    dev_free(send);
    free(h), free(want), free(got);
}

TEST_CASE(all_reduce_rank_order) {
    const size_t sizes[] = {0, 1, 3, 1000, 4099};
    const nb_comm_dtype types[] = {NB_COMM_F32, NB_COMM_F64, NB_COMM_I32, NB_COMM_I64};
    for (size_t a = 0; a < sizeof types / sizeof *types; a++)
        for (size_t b = 0; b < sizeof sizes / sizeof *sizes; b++)
            for (int ip = 0; ip < 2; ip++) check_all_reduce(types[a], sizes[b], ip);
    if (N >= 3 && E.bitwise) { /* the patterns must make the order visible, or the test above proves nothing */
        float fw[64], rv[64];
        ref_sum(fw, NB_COMM_F32, 0, 64, 0);
        ref_sum(rv, NB_COMM_F32, 0, 64, 1);
        CHECK(memcmp(fw, rv, sizeof fw) != 0, "the test's values sum to the same bits in both orders");
    }
}

/* Segments and message pieces shrunk: the same results across many segments and pieces. */
TEST_CASE(all_reduce_segments_and_pieces) {
    nb_comm_set_message_sizes(E.c, 1000, 96);
    check_all_reduce(NB_COMM_F32, 5003, 0);
    check_all_reduce(NB_COMM_F64, 2001, 1);
    nb_comm_set_message_sizes(E.c, 0, 0);
}

static void check_reduce_scatter(nb_comm_dtype t, size_t n, int in_place) {
    size_t es = nb_comm_dtype_size(t), bytes = n * es;
    char *h = malloc(bytes * N + 1), *want = malloc(bytes + 1), *got = malloc(bytes + 1);
    fill_sum(h, t, R, 0, n * N);
    ref_sum(want, t, (size_t)R * n, n, 0); /* chunk R: elements [R n, (R+1) n) of every rank */
    char *send = dev_alloc(bytes * N), *recv = in_place ? send + (size_t)R * bytes : dev_alloc(bytes);
    up(send, h, bytes * N);
    nb_mark_wait_host(nb_comm_reduce_scatter(E.c, send, recv, n, t, NULL));
    down(got, recv, bytes);
    CHECK(same(got, want, t, n), "reduce-scatter %s n=%zu in_place=%d differs from the rank-order sum",
          nb_comm_dtype_name(t), n, in_place);
    if (!in_place) dev_free(recv);
    dev_free(send);
    free(h), free(want), free(got);
}

TEST_CASE(reduce_scatter_rank_order) {
    const nb_comm_dtype types[] = {NB_COMM_F32, NB_COMM_F64, NB_COMM_I32, NB_COMM_I64};
    for (size_t a = 0; a < 4; a++)
        for (int ip = 0; ip < 2; ip++) {
            check_reduce_scatter(types[a], 0, ip);
            check_reduce_scatter(types[a], 1, ip);
            check_reduce_scatter(types[a], 777, ip);
        }
    nb_comm_set_message_sizes(E.c, 512, 0);
    check_reduce_scatter(NB_COMM_F32, 1001, 1);
    nb_comm_set_message_sizes(E.c, 0, 0);
}

static void check_all_gather(nb_comm_dtype t, size_t n, int in_place) {
    size_t es = nb_comm_dtype_size(t), bytes = n * es;
    char *mine = malloc(bytes + 1), *want = malloc(bytes * N + 1), *got = malloc(bytes * N + 1);
    for (int k = 0; k < N; k++)
        for (size_t i = 0; i < n; i++) put(want, t, (size_t)k * n + i, code_of(k, 0, i));
    memcpy(mine, want + (size_t)R * bytes, bytes);
    char *recv = dev_alloc(bytes * N), *send = in_place ? recv + (size_t)R * bytes : dev_alloc(bytes);
    up(send, mine, bytes);
    nb_mark_wait_host(nb_comm_all_gather(E.c, send, recv, n, t, NULL));
    down(got, recv, bytes * N);
    CHECK(memcmp(got, want, bytes * N) == 0, "all-gather %s n=%zu in_place=%d", nb_comm_dtype_name(t), n, in_place);
    if (!in_place) dev_free(send);
    dev_free(recv);
    free(mine), free(want), free(got);
}

TEST_CASE(all_gather_every_type) {
    for (int t = 0; t < NB_COMM_DTYPE_COUNT; t++)
        for (int ip = 0; ip < 2; ip++) {
            check_all_gather((nb_comm_dtype)t, 0, ip);
            check_all_gather((nb_comm_dtype)t, 5, ip);
        }
}

/* How many elements rank a sends rank b: 0, 2 or 4 (zeros included, uneven). */
static size_t a2a_count(int a, int b) { return (size_t)((a + 2 * b) % 3) * 2; }

static void check_all_to_all_v(nb_comm_dtype t) {
    size_t es = nb_comm_dtype_size(t);
    size_t *sc = calloc(4 * (size_t)N, sizeof(size_t)), *sd = sc + N, *rc = sc + 2 * N, *rd = sc + 3 * N;
    size_t send_n = 0, recv_n = 0;
    for (int j = 0; j < N; j++) { /* blocks with gaps of 1 (send) and 2 (recv) elements */
        sc[j] = a2a_count(R, j), sd[j] = send_n, send_n += sc[j] + 1;
        rc[j] = a2a_count(j, R), rd[j] = recv_n, recv_n += rc[j] + 2;
    }
    char *hs = calloc(send_n + 1, es), *want = calloc(recv_n + 1, es), *got = calloc(recv_n + 1, es);
    for (int j = 0; j < N; j++)
        for (size_t e = 0; e < sc[j]; e++) put(hs, t, sd[j] + e, code_of(R, j, e));
    memset(want, 0x5a, recv_n * es); /* the gaps must keep these bytes */
    for (int k = 0; k < N; k++)
        for (size_t e = 0; e < rc[k]; e++) put(want, t, rd[k] + e, code_of(k, R, e));
    void *send = dev_alloc(send_n * es), *recv = dev_alloc(recv_n * es);
    char *sentinel = malloc(recv_n * es + 1);
    memset(sentinel, 0x5a, recv_n * es);
    up(send, hs, send_n * es);
    up(recv, sentinel, recv_n * es);
    nb_mark_wait_host(nb_comm_all_to_all_v(E.c, send, sc, sd, recv, rc, rd, t, "a2av test"));
    down(got, recv, recv_n * es);
    CHECK(memcmp(got, want, recv_n * es) == 0, "all-to-all-v %s: wrong elements or a gap written", nb_comm_dtype_name(t));
    dev_free(send), dev_free(recv);
    free(sc), free(hs), free(want), free(got), free(sentinel);
}

TEST_CASE(all_to_all_v_uneven) {
    const nb_comm_dtype types[] = {NB_COMM_F32, NB_COMM_I64, NB_COMM_I32, NB_COMM_BF16, NB_COMM_U8};
    for (size_t a = 0; a < sizeof types / sizeof *types; a++) check_all_to_all_v(types[a]);
    nb_comm_set_message_sizes(E.c, 0, 4); /* every block in several messages */
    check_all_to_all_v(NB_COMM_I64);
    nb_comm_set_message_sizes(E.c, 0, 0);
}

TEST_CASE(all_to_all_even) {
    const size_t n = 3;
    int32_t *hs = malloc(n * N * 4), *want = malloc(n * N * 4), *got = malloc(n * N * 4);
    for (int j = 0; j < N; j++)
        for (size_t e = 0; e < n; e++) hs[j * n + e] = (int32_t)code_of(R, j, e), want[j * n + e] = (int32_t)code_of(j, R, e);
    void *send = dev_alloc(n * N * 4), *recv = dev_alloc(n * N * 4);
    up(send, hs, n * N * 4);
    nb_mark_wait_host(nb_comm_all_to_all(E.c, send, recv, n, NB_COMM_I32, NULL));
    down(got, recv, n * N * 4);
    CHECK(memcmp(got, want, n * N * 4) == 0, "all-to-all i32");
    dev_free(send), dev_free(recv);
    free(hs), free(want), free(got);
}

TEST_CASE(broadcast_from_roots) {
    const size_t n = 1001;
    double *h = malloc(n * 8), *want = malloc(n * 8);
    void *buf = dev_alloc(n * 8);
    for (int root = 0; root < N; root += N > 1 ? N - 1 : 1) {
        for (size_t i = 0; i < n; i++) want[i] = (double)code_of(root, 1, i), h[i] = R == root ? want[i] : -1.0;
        up(buf, h, n * 8);
        nb_mark_wait_host(nb_comm_broadcast(E.c, buf, n, NB_COMM_F64, root, NULL));
        down(h, buf, n * 8);
        CHECK(memcmp(h, want, n * 8) == 0, "broadcast from rank %d", root);
    }
    dev_free(buf);
    free(h), free(want);
}

/* Rank r arrives 40 r ms late; nobody may leave before the last one arrived. */
TEST_CASE(barrier_waits_for_everyone) {
    sleep_ms(40L * R);
    double arrive = nb_now();
    nb_mark_wait_host(nb_comm_barrier(E.c, NULL));
    double leave = nb_now();
    double *all = malloc(2 * sizeof(double) * N), mine[2] = {arrive, leave};
    nb_comm__all_gather_host(mine, all, sizeof mine, "test barrier times");
    double last_arrive = 0, first_leave = 1e300;
    for (int k = 0; k < N; k++) {
        last_arrive = all[2 * k] > last_arrive ? all[2 * k] : last_arrive;
        first_leave = all[2 * k + 1] < first_leave ? all[2 * k + 1] : first_leave;
    }
    CHECK(first_leave >= last_arrive, "a rank left the barrier %.3f s before the last one arrived", last_arrive - first_leave);
    free(all);
}

/* Several ops enqueued before any is waited on: they run in order, each sees its inputs. */
TEST_CASE(ops_in_flight_in_order) {
    const size_t n = 257;
    float *h = malloc(n * 4), *want = malloc(n * 4), *got = malloc(n * 4);
    void *a = dev_alloc(n * 4), *b = dev_alloc(n * N * 4);
    fill_sum(h, NB_COMM_F32, R, 0, n);
    up(a, h, n * 4);
    nb_comm_all_reduce(E.c, a, a, n, NB_COMM_F32, "ar 1"); /* a = sum */
    nb_comm_broadcast(E.c, a, n, NB_COMM_F32, 0, NULL);     /* unchanged: equal on every rank */
    nb_mark m = nb_comm_all_gather(E.c, a, b, n, NB_COMM_F32, NULL);
    nb_mark_wait_host(m);
    ref_sum(want, NB_COMM_F32, 0, n, 0);
    for (int k = 0; k < N; k++) {
        down(got, (char *)b + (size_t)k * n * 4, n * 4);
        CHECK(same(got, want, NB_COMM_F32, n), "gathered block %d is not the all-reduced buffer", k);
    }
    dev_free(a), dev_free(b);
    free(h), free(want), free(got);
}

/* ---- ordering with other lanes (CPU lanes) ---- */

typedef struct {
    float *buf, *out;
    size_t n;
    int rank;
} order_args;

static void produce(void *arg, const nb_task_ctx *ctx) {
    order_args *a = arg;
    sleep_ms(60); /* late: a comm op that did not wait for this would read the old values */
    for (size_t i = 0; i < a->n; i++) a->buf[i] = vf32(a->rank, i);
}
static void consume(void *arg, const nb_task_ctx *ctx) {
    order_args *a = arg;
    memcpy(a->out, a->buf, a->n * sizeof(float));
}

TEST_CASE(lanes_produce_reduce_consume) {
    if (E.gpu) return; /* the GPU variant is gpu_lanes_order */
    const size_t n = 1024;
    float *buf = calloc(n, 4), *out = calloc(n, 4), *want = malloc(n * 4);
    order_args a = {buf, out, n, R};
    nb_lane *compute = nb_lane_create(E.L, "compute", NB_LANE_DEVICE);
    nb_lane *opt = nb_lane_create(E.L, "optim", NB_LANE_HOST);
    nb_lanes_trace_clear(E.L);
    nb_lane_run(compute, "produce", NB_SPAN_BWD, 7, produce, &a);
    nb_comm_set_step(E.c, 7);
    nb_comm_wait(E.c, nb_lane_mark(compute));
    nb_mark reduced = nb_comm_all_reduce(E.c, buf, buf, n, NB_COMM_F32, "ar grads");
    nb_lane_wait(opt, reduced);
    nb_lane_run(opt, "consume", NB_SPAN_OPTIM, 7, consume, &a);
    nb_mark_wait_host(nb_lane_mark(opt));
    ref_sum(want, NB_COMM_F32, 0, n, 0);
    CHECK(memcmp(out, want, n * 4) == 0, "the consumer did not see the all-reduced buffer");
    nb_lanes_sync(E.L);
    const nb_span *sp = NULL;
    size_t ns = nb_lanes_spans(E.L, &sp);
    const nb_span *p = NULL, *r = NULL, *q = NULL;
    for (size_t i = 0; i < ns; i++) {
        if (!strcmp(sp[i].name, "produce")) p = &sp[i];
        if (!strcmp(sp[i].name, "ar grads")) r = &sp[i];
        if (!strcmp(sp[i].name, "consume")) q = &sp[i];
    }
    CHECK(p && r && q, "missing spans (produce %p, all-reduce %p, consume %p)", (void *)p, (void *)r, (void *)q);
    if (p && r && q) {
        CHECK(r->kind == NB_SPAN_COMM && r->step == 7, "the all-reduce span has kind %d step %d", r->kind, r->step);
        CHECK(r->lane == nb_lane_index(nb_comm_lane(E.c)), "the all-reduce ran on lane %d, not the comm lane", r->lane);
        CHECK(p->t1 <= r->t0 && r->t1 <= q->t0, "spans out of order: produce [%.4f,%.4f] ar [%.4f,%.4f] consume [%.4f,%.4f]",
              p->t0, p->t1, r->t0, r->t1, q->t0, q->t1);
    }
    free(buf), free(out), free(want);
}

/* ---- process-wide helpers ---- */

TEST_CASE(helpers_agree_check_bcast) {
    CHECK(nb_comm_agree_min_i64(100 + R) == 100, "agree-min");
    CHECK(nb_comm_agree_max_i64(100 + R) == 100 + N - 1, "agree-max");
    CHECK(nb_comm_agree_min_i64(-((int64_t)1 << 40) * (R + 1)) == -((int64_t)1 << 40) * N, "agree-min of 64-bit values");
    nb_comm_check_all(1, NULL, "never printed");
    char msg[32] = "";
    if (R == N - 1) snprintf(msg, sizeof msg, "from rank %d", R);
    nb_comm_bcast_host(msg, sizeof msg, N - 1);
    char want[32];
    snprintf(want, sizeof want, "from rank %d", N - 1);
    CHECK(strcmp(msg, want) == 0, "bcast_host gave '%s'", msg);
    nb_comm_barrier_host();
    CHECK(nb_comm_pick_device(1) == 0 && nb_comm_pick_device(64) == nb_comm_local_rank() % 64, "pick_device");
    CHECK(nb_comm_local_rank() < nb_comm_local_size() && nb_comm_local_size() <= N, "local rank %d of %d",
          nb_comm_local_rank(), nb_comm_local_size());
}

TEST_CASE(kind_names) {
    for (int k = 0; k < NB_COMM_KIND_COUNT; k++)
        CHECK(nb_comm_kind_parse(nb_comm_kind_name((nb_comm_kind)k)) == (nb_comm_kind)k, "kind %d", k);
}

/* ---- failure modes (the shell test checks what the OTHER ranks do) ---- */

static void misbehave(const char *mode, int fail_rank, double timeout) {
    const size_t n = 1 << 16;
    float *buf = dev_zalloc(n * 4); /* device memory with --gpu: the failure modes run there too */
    for (int it = 0; it < 4; it++) {
        if (it == 2 && R == fail_rank) {
            fprintf(stderr, "test_comm: rank %d: injecting '%s'\n", R, mode);
            if (!strcmp(mode, "kill")) raise(SIGKILL);
            if (!strcmp(mode, "exit")) exit(0); /* without nb_comm_finalize */
            if (!strcmp(mode, "stall")) sleep_ms((long)(timeout * 1000) * 10 + 5000);
            if (!strcmp(mode, "fail")) nb_fail("none: injected by the test", "injected failure on rank %d", R);
        }
        if (it == 2 && !strcmp(mode, "check"))
            nb_comm_check_all(R != fail_rank, "copy the data file to every machine", "data file 'x.bin' missing on rank %d", R);
        if (it == 2 && !strcmp(mode, "counts")) { /* fail_rank sends one element too many to rank 0 */
            size_t *a = calloc(4 * (size_t)N, sizeof(size_t));
            for (int j = 0; j < N; j++) a[j] = a[2 * N + j] = 1, a[N + j] = a[3 * N + j] = (size_t)j * 2;
            if (R == fail_rank) a[0] = 2;
            float *s = dev_zalloc(2 * (size_t)N * 4), *r = dev_zalloc(2 * (size_t)N * 4);
            nb_mark_wait_host(nb_comm_all_to_all_v(E.c, s, a, a + N, r, a + 2 * N, a + 3 * N, NB_COMM_F32, "a2av bad"));
        }
        nb_mark_wait_host(nb_comm_all_reduce(E.c, buf, buf, n, NB_COMM_F32, "ar misbehave"));
    }
    dev_free(buf);
}

/* ---- benchmark: all-reduce of MB megabytes of fp32 (GPU memory with --gpu) ---- */

static void bench(double mb) {
    size_t n = (size_t)(mb * 1e6 / 4);
    float *h = malloc(n * 4), *buf = dev_alloc(n * 4);
    for (size_t i = 0; i < n; i++) h[i] = (float)(i % 1000);
    up(buf, h, n * 4);
    nb_mark_wait_host(nb_comm_all_reduce(E.c, buf, buf, n, NB_COMM_F32, NULL)); /* warm-up */
    const int reps = 5;
    nb_comm_barrier_host();
    double t0 = nb_now();
    for (int k = 0; k < reps; k++) nb_mark_wait_host(nb_comm_all_reduce(E.c, buf, buf, n, NB_COMM_F32, NULL));
    double dt = (nb_now() - t0) / reps;
    nb_comm_printf0("bench: all-reduce of %.0f MB fp32 over %d ranks (%s): %.1f ms, %.2f GB/s (buffer bytes / time)\n", mb,
                    N, nb_comm_kind_name(nb_comm_get_kind(E.c)), dt * 1e3, n * 4.0 / dt / 1e9);
    const int small_reps = 200;
    nb_comm_barrier_host();
    t0 = nb_now();
    for (int k = 0; k < small_reps; k++) nb_mark_wait_host(nb_comm_all_reduce(E.c, buf, buf, 1024, NB_COMM_F32, NULL));
    nb_comm_printf0("bench: all-reduce of 4 KB: %.1f us each (enqueue, run on the comm lane, wait)\n",
                    (nb_now() - t0) / small_reps * 1e6);
    dev_free(buf);
    free(h);
}

/* ---- GPU: nccl (any world size) and host (ranks may share one GPU) ---- */

#ifdef NB_WITH_CUDA
typedef struct {
    float *dev;
    const float *host;
    size_t n;
} gpu_produce_args;

static void gpu_produce(void *arg, const nb_task_ctx *ctx) {
    gpu_produce_args *a = arg;
    nb_lanes_testkern_spin(ctx->stream, 50 * 1000 * 1000); /* late, on the GPU */
    if (cudaMemcpyAsync(a->dev, a->host, a->n * 4, cudaMemcpyHostToDevice, ctx->stream) != cudaSuccess)
        nb_fail(NULL, "cudaMemcpyAsync");
}
static void gpu_consume(void *arg, const nb_task_ctx *ctx) {
    gpu_produce_args *a = arg;
    if (cudaMemcpyAsync((float *)a->host, a->dev, a->n * 4, cudaMemcpyDeviceToHost, ctx->stream) != cudaSuccess)
        nb_fail(NULL, "cudaMemcpyAsync");
}

TEST_CASE(gpu_lanes_order) {
    if (!E.gpu) return;
    const size_t n = 4096;
    float *h = malloc(n * 4), *got = NULL, *want = malloc(n * 4);
    if (cudaMallocHost((void **)&got, n * 4) != cudaSuccess) nb_fail(NULL, "cudaMallocHost");
    fill_sum(h, NB_COMM_F32, R, 0, n);
    float *dev = dev_alloc(n * 4);
    if (cudaMemset(dev, 0, n * 4) != cudaSuccess) nb_fail(NULL, "cudaMemset");
    nb_lane *compute = nb_lane_create(E.L, "compute", NB_LANE_DEVICE);
    nb_lane *consumer = nb_lane_create(E.L, "consumer", NB_LANE_DEVICE);
    gpu_produce_args pa = {dev, h, n}, ca = {dev, got, n};
    nb_lane_run(compute, "produce", NB_SPAN_BWD, 0, gpu_produce, &pa);
    nb_comm_wait(E.c, nb_lane_mark(compute));
    nb_mark m = nb_comm_all_reduce(E.c, dev, dev, n, NB_COMM_F32, "ar gpu");
    nb_lane_wait(consumer, m);
    nb_lane_run(consumer, "consume", NB_SPAN_OPTIM, 0, gpu_consume, &ca);
    nb_mark_wait_host(nb_lane_mark(consumer));
    ref_sum(want, NB_COMM_F32, 0, n, 0);
    CHECK(same(got, want, NB_COMM_F32, n), "GPU lanes: the consumer did not see the all-reduced buffer");
    dev_free(dev);
    cudaFreeHost(got);
    free(h), free(want);
}

/* nccl: the same bits twice in a row for the same sizes (run-to-run determinism). */
TEST_CASE(gpu_repeatable) {
    if (!E.gpu) return;
    const size_t n = (size_t)1 << 20;
    float *h = malloc(n * 4), *a = malloc(n * 4), *b = malloc(n * 4);
    for (size_t i = 0; i < n; i++) h[i] = (float)((i * 2654435761u + (size_t)R * 40503u) % 100003) * 1e-3f - 50.0f;
    float *dev = dev_alloc(n * 4);
    for (int rep = 0; rep < 2; rep++) {
        up(dev, h, n * 4);
        nb_mark_wait_host(nb_comm_all_reduce(E.c, dev, dev, n, NB_COMM_F32, NULL));
        down(rep ? b : a, dev, n * 4);
    }
    CHECK(memcmp(a, b, n * 4) == 0, "two all-reduces of the same data differ");
    dev_free(dev);
    free(h), free(a), free(b);
}

/* ---- --sm-free: all-gather and all-to-all by copy engines (IPC on one machine) ---- */

/* Byte i of what rank `from` sends rank `to` in call `call`: random, never zero (a block that was
 * not copied keeps the 0x5a sentinel or zeros, and shows). */
static uint8_t rnd_byte(int call, int from, int to, size_t i) {
    uint64_t x = (uint64_t)call * 0x9E3779B97F4A7C15ull ^ (uint64_t)from << 48 ^ (uint64_t)to << 40 ^ (uint64_t)i;
    x ^= x >> 30, x *= 0xBF58476D1CE4E5B9ull, x ^= x >> 27, x *= 0x94D049BB133111EBull, x ^= x >> 31;
    uint8_t b = (uint8_t)(x >> 56);
    return b ? b : 1;
}

/* Elements rank a sends rank b in call `call`: zero, small, uneven, or large (3 Mi elements). */
static size_t sm_count(int call, int a, int b) {
    static const size_t pick[] = {0, 1, 13, 4099, (size_t)3 << 20};
    return pick[(size_t)(call * 7 + a * 3 + b * 5 + a * b) % 5];
}

/* A device buffer that ops reuse, or replace (fresh: freed and allocated again, so that the peers
 * see a new allocation, often at the same address). */
typedef struct {
    char *p;
    size_t bytes;
} sm_buf;
static char *sm_take(sm_buf *b, size_t bytes, int fresh) {
    if (fresh || !b->p || bytes > b->bytes) {
        if (b->p) dev_free(b->p);
        b->p = dev_alloc(bytes);
        b->bytes = bytes;
    }
    return b->p;
}

/* One all-to-all-v of random bytes; recv starts `off` elements into its allocation, blocks with
 * gaps (send 3, recv 2 elements) that must keep the sentinel, like the bytes before recv. */
static void check_sm_a2av(int call, nb_comm_dtype t, sm_buf *S, sm_buf *Rb, int fresh) {
    const size_t es = nb_comm_dtype_size(t), off = 5 + (size_t)(call % 3) * 17;
    size_t *sc = calloc(4 * (size_t)N, sizeof(size_t)), *sd = sc + N, *rc = sc + 2 * N, *rd = sc + 3 * N;
    size_t send_n = 0, recv_n = 0;
    for (int j = 0; j < N; j++) {
        sc[j] = sm_count(call, R, j), sd[j] = send_n, send_n += sc[j] + 3;
        rc[j] = sm_count(call, j, R), rd[j] = recv_n, recv_n += rc[j] + 2;
    }
    size_t sbytes = send_n * es, abytes = (off + recv_n) * es;
    uint8_t *hs = malloc(sbytes), *want = malloc(abytes), *got = malloc(abytes > sbytes ? abytes : sbytes);
    memset(hs, 0xee, sbytes);
    for (int j = 0; j < N; j++)
        for (size_t e = 0; e < sc[j] * es; e++) hs[sd[j] * es + e] = rnd_byte(call, R, j, e);
    memset(want, 0x5a, abytes);
    for (int k = 0; k < N; k++)
        for (size_t e = 0; e < rc[k] * es; e++) want[(off + rd[k]) * es + e] = rnd_byte(call, k, R, e);
    char *send = sm_take(S, sbytes, fresh), *all = sm_take(Rb, abytes, fresh), *recv = all + off * es;
    uint8_t *sentinel = malloc(abytes);
    memset(sentinel, 0x5a, abytes);
    up(send, hs, sbytes);
    up(all, sentinel, abytes);
    nb_mark_wait_host(nb_comm_all_to_all_v(E.c, send, sc, sd, recv, rc, rd, t, "sm a2av"));
    down(got, all, abytes);
    size_t bad = 0;
    for (size_t i = 0; i < abytes; i++) bad += got[i] != want[i];
    CHECK(bad == 0, "sm-free all-to-all-v call %d (%s, %zu bytes): %zu bytes differ from the expected ones", call,
          nb_comm_dtype_name(t), abytes, bad);
    down(got, send, sbytes);
    CHECK(memcmp(got, hs, sbytes) == 0, "sm-free all-to-all-v call %d changed its send buffer", call);
    free(sc), free(hs), free(want), free(got), free(sentinel);
}

/* One all-gather of n random elements per rank, recv `off` elements into its allocation. */
static void check_sm_all_gather(int call, nb_comm_dtype t, size_t n, int in_place, sm_buf *S, sm_buf *Rb, int fresh) {
    const size_t es = nb_comm_dtype_size(t), off = 11 + (size_t)(call % 5), b = n * es;
    const size_t abytes = off * es + b * N + es;
    uint8_t *want = malloc(abytes), *got = malloc(abytes), *mine = malloc(b + 1);
    memset(want, 0x5a, abytes);
    for (int k = 0; k < N; k++)
        for (size_t e = 0; e < b; e++) want[off * es + (size_t)k * b + e] = rnd_byte(call, k, 0, e);
    memcpy(mine, want + off * es + (size_t)R * b, b);
    char *all = sm_take(Rb, abytes, fresh), *recv = all + off * es;
    char *send = in_place ? recv + (size_t)R * b : sm_take(S, b, fresh);
    uint8_t *sentinel = malloc(abytes);
    memset(sentinel, 0x5a, abytes);
    up(all, sentinel, abytes);
    up(send, mine, b);
    nb_mark_wait_host(nb_comm_all_gather(E.c, send, recv, n, t, "sm all-gather"));
    down(got, all, abytes);
    CHECK(memcmp(got, want, abytes) == 0, "sm-free all-gather call %d (%s, n=%zu, in_place=%d): wrong bytes", call,
          nb_comm_dtype_name(t), n, in_place);
    free(want), free(got), free(mine), free(sentinel);
}

TEST_CASE(sm_free_moves) {
    if (!E.sm_free) return;
    sm_buf S = {0}, Rb = {0}, S2 = {0}, R2 = {0};
    const nb_comm_dtype types[] = {NB_COMM_U8, NB_COMM_BF16, NB_COMM_F64, NB_COMM_I32, NB_COMM_U8, NB_COMM_F32, NB_COMM_U8};
    for (int call = 0; call < 7; call++) /* the same buffers (a kept mapping), replaced at call 3 */
        check_sm_a2av(call, types[call], &S, &Rb, call == 3);
    const size_t sizes[] = {0, 1, 4097, (size_t)3 << 20};
    int call = 10;
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++)
        for (int ip = 0; ip < 2; ip++, call++) check_sm_all_gather(call, NB_COMM_U8, sizes[k], ip, &S2, &R2, call == 13);
    check_sm_all_gather(call++, NB_COMM_F64, 999, 0, &S2, &R2, 0);
    /* every mapping closed after each op (the CUDA docs' lifetime), then kept again */
    nb_comm_set_sm_free_keep_maps(E.c, 0);
    check_sm_a2av(20, NB_COMM_U8, &S, &Rb, 0);
    check_sm_all_gather(21, NB_COMM_U8, 4097, 1, &S2, &R2, 0);
    nb_comm_set_sm_free_keep_maps(E.c, 1);
    check_sm_a2av(22, NB_COMM_U8, &S, &Rb, 1);
    /* a reduction on the same instance: still the base kind's */
    check_all_reduce(NB_COMM_F32, 4099, 0);
    check_all_reduce(NB_COMM_I64, 1000, 1);
    dev_free(S.p), dev_free(Rb.p), dev_free(S2.p), dev_free(R2.p);
}

/* More live recv buffers than a peer's kept mappings: the least recently used are closed and
 * opened again, with the same results. */
TEST_CASE(sm_free_many_buffers) {
    if (!E.sm_free) return;
    enum { NBUF = 11 };
    sm_buf bufs[NBUF] = {{0}}, S = {0};
    for (int round = 0; round < 2; round++)
        for (int b = 0; b < NBUF; b++) check_sm_all_gather(100 + round * NBUF + b, NB_COMM_U8, 3001, b & 1, &S, &bufs[b], 0);
    for (int b = 0; b < NBUF; b++) dev_free(bufs[b].p);
    dev_free(S.p);
}

/* Enqueued back to back with no wait: an all-reduce reads what the all-to-all wrote (on the other
 * lane for nccl), an all-gather what the all-reduce wrote; spans of kind COMM on the right lanes. */
TEST_CASE(sm_free_order_across_lanes) {
    if (!E.sm_free) return;
    const size_t n = 1000;
    float *hs = malloc(n * N * 4), *want = malloc(n * N * 4), *got = malloc(n * N * 4);
    /* multiples of 1/2 below 32: sums exact in any order (nccl's too) */
#define SM_VAL(from, to, i) ((float)(((from) * 31 + (to) * 7 + (int)(i)) % 64) * 0.5f)
    for (int j = 0; j < N; j++)
        for (size_t i = 0; i < n; i++) hs[j * n + i] = SM_VAL(R, j, i);
    float *send = dev_alloc(n * N * 4), *recv = dev_alloc(n * N * 4), *gat = dev_alloc(n * N * 4);
    up(send, hs, n * N * 4);
    nb_lanes_sync(E.L);
    nb_lanes_trace_clear(E.L);
    nb_comm_all_to_all(E.c, send, recv, n, NB_COMM_F32, "sm a2a order");
    nb_comm_all_reduce(E.c, recv, recv, n * N, NB_COMM_F32, "sm ar after a2a");
    nb_mark m = nb_comm_all_gather(E.c, recv, gat, n, NB_COMM_F32, "sm ag after ar");
    nb_mark_wait_host(m);
    for (int k = 0; k < N; k++) /* recv_q[k n + i] = SM_VAL(k, q, i), summed over q */
        for (size_t i = 0; i < n; i++) {
            float v = 0;
            for (int q = 0; q < N; q++) v += SM_VAL(k, q, i);
            want[k * n + i] = v;
        }
    down(got, recv, n * N * 4);
    CHECK(memcmp(got, want, n * N * 4) == 0, "the all-reduce did not see the all-to-all's result");
    down(got, gat, n * N * 4);
    for (int k = 0; k < N; k++)
        CHECK(memcmp(got + k * n, want, n * 4) == 0, "gathered block %d is not the all-reduced block 0", k);
#undef SM_VAL
    nb_lanes_sync(E.L);
    int ce = nb_lane_index(nb_comm_lane(E.c)), base = ce;
    if (nb_comm_get_kind(E.c) == NB_COMM_NCCL) {
        ce = -1;
        for (int i = 0; i < nb_lanes_count(E.L); i++)
            if (!strcmp(nb_lane_name(nb_lanes_get(E.L, i)), "comm-ce")) ce = i;
        CHECK(ce >= 0, "nccl --sm-free: no lane named comm-ce");
    }
    const nb_span *sp = NULL;
    size_t ns = nb_lanes_spans(E.L, &sp);
    int seen = 0;
    for (size_t i = 0; i < ns; i++) {
        int want_lane = !strcmp(sp[i].name, "sm ar after a2a") ? base : !strncmp(sp[i].name, "sm a", 4) ? ce : -2;
        if (want_lane == -2) continue;
        seen++;
        CHECK(sp[i].lane == want_lane && sp[i].kind == NB_SPAN_COMM, "span '%s' on lane %d (want %d), kind %d", sp[i].name,
              sp[i].lane, want_lane, sp[i].kind);
    }
    CHECK(seen == 3, "%d of the 3 spans recorded", seen);
    dev_free(send), dev_free(recv), dev_free(gat);
    free(hs), free(want), free(got);
}
#endif

static int gpu_setup(const char *kind) {
#ifndef NB_WITH_CUDA
    (void)kind;
    printf("skipped: this build has no CUDA\n");
    return 77;
#else
    char name[128] = "";
    int ndev = nb_cuda_device_count(name, sizeof name);
    if (ndev == 0) {
        printf("skipped: no GPU\n");
        return 77;
    }
    int dev = nb_comm_pick_device(ndev);
    char devs[32];
    snprintf(devs, sizeof devs, "cuda:%d", dev);
    E.be = nb_backend_for(devs, "fp32");
    if (cudaSetDevice(dev) != cudaSuccess) nb_fail(NULL, "cudaSetDevice");
    E.gpu = 1;
    E.L = nb_lanes_create("cuda", 4096);
    nb_comm_kind k = nb_comm_kind_parse(kind);
    E.c = nb_comm_create(E.L, E.be, &(nb_comm_opts){.kind = k, .sm_free = E.sm_free, .sm_free_staged = E.staged});
    E.bitwise = nb_comm_get_kind(E.c) != NB_COMM_NCCL;
    const char *ce = !E.sm_free                                ? ""
                     : E.staged || nb_comm_local_size() < N ? ", sm-free (host-staged)"
                                                            : ", sm-free (CUDA IPC)";
    nb_comm_printf0("gpu: %s, %d rank%s, comm %s%s, device %s\n", name, N, N > 1 ? "s" : "",
                    nb_comm_kind_name(nb_comm_get_kind(E.c)), ce, devs);
    return 0;
#endif
}

int main(int argc, char **argv) {
    nb_comm_init(&argc, &argv);
    R = nb_comm_rank(), N = nb_comm_size();
    const char *fail = NULL, *gpu = NULL;
    int fail_rank = 1, staged = 0;
    double timeout = 0, bench_mb = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--fail") && i + 1 < argc) fail = argv[++i];
        else if (!strcmp(argv[i], "--fail-rank") && i + 1 < argc) fail_rank = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--timeout") && i + 1 < argc) timeout = atof(argv[++i]);
        else if (!strcmp(argv[i], "--bench") && i + 1 < argc) bench_mb = atof(argv[++i]);
        else if (!strcmp(argv[i], "--gpu") && i + 1 < argc) gpu = argv[++i];
        else if (!strcmp(argv[i], "--sm-free")) E.sm_free = 1;
        else if (!strcmp(argv[i], "--staged")) staged = 1;
        else if (!strcmp(argv[i], "--parse") && i + 1 < argc) {
            printf("%s\n", nb_comm_kind_name(nb_comm_kind_parse(argv[++i])));
            return 0;
        } else {
            fprintf(stderr, "test_comm: unknown argument '%s'\n", argv[i]);
            return 2;
        }
    }
    if (timeout > 0) nb_comm_set_timeout(timeout);
    E.staged = staged;
    if (gpu) {
        int rc = gpu_setup(gpu);
        if (rc) {
            nb_comm_finalize();
            return rc;
        }
    } else {
        E.be = &nb_backend_cpu;
        E.L = nb_lanes_create("cpu", 4096);
        E.c = nb_comm_create(E.L, E.be, &(nb_comm_opts){.kind = NB_COMM_AUTO, .sm_free = E.sm_free}); /* sm_free: fails */
        E.bitwise = 1;
        CHECK(nb_comm_get_kind(E.c) == NB_COMM_MPI, "auto on the CPU picked %s", nb_comm_kind_name(nb_comm_get_kind(E.c)));
    }
    if (fail) misbehave(fail, fail_rank, nb_comm_timeout());
    else if (bench_mb > 0) bench(bench_mb);
    else {
        RUN_C(all_reduce_rank_order);
        RUN_C(all_reduce_segments_and_pieces);
        RUN_C(reduce_scatter_rank_order);
        RUN_C(all_gather_every_type);
        RUN_C(all_to_all_v_uneven);
        RUN_C(all_to_all_even);
        RUN_C(broadcast_from_roots);
        RUN_C(barrier_waits_for_everyone);
        RUN_C(ops_in_flight_in_order);
        RUN_C(lanes_produce_reduce_consume);
        RUN_C(helpers_agree_check_bcast);
        RUN_C(kind_names);
#ifdef NB_WITH_CUDA
        RUN_C(gpu_lanes_order);
        RUN_C(gpu_repeatable);
        RUN_C(sm_free_moves);
        RUN_C(sm_free_many_buffers);
        RUN_C(sm_free_order_across_lanes);
#endif
    }
    nb_comm_destroy(E.c);
    nb_lanes_destroy(E.L);
    nb_comm_finalize();
    TEST_EXIT();
}
