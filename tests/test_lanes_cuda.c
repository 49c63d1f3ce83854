/* CUDA device lanes (lanes_cuda.c) on a real GPU: marks order kernels across streams (with a
 * control that shows the same kernels race without the mark), random DAGs of kernels over four
 * streams match serial execution, GPU spans have the right durations on the host clock, two
 * streams overlap in the step statistics (and do not once a mark serializes them), host lanes and
 * device lanes wait on each other, marks and spans reuse pooled events, and a broken capture
 * fails with a clear message. Graph capture and replay on CUDA is in test_lanes_graph.c.
 * Without CUDA in the build, or without a GPU, exits 77 (after checking, in the latter case, that
 * the "cuda" backend refuses to start with a clear message). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdio.h>

#ifndef NB_WITH_CUDA
int main(void) {
    printf("skipped: this build has no CUDA (nvcc was not found)\n");
    return 77;
}
#else

#include <cuda_runtime.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "child.h"
#include "core.h"
#include "lanes/lanes.h"
#include "lanes/lanes_cuda_testkern.h"
#include "lanes_test.h"

static int cu_ok(cudaError_t e, const char *call) {
    if (e != cudaSuccess) fprintf(stderr, "  %s: %s\n", call, cudaGetErrorString(e));
    return e == cudaSuccess;
}
#define CU(call) CHECK(cu_ok((call), #call), "a CUDA call failed")

/* ---- tasks ---- */

typedef struct {
    uint64_t ns;
} spin_arg;
static void spin_task(void *arg, const nb_task_ctx *ctx) {
    TASK_CHECK(ctx->stream != NULL);
    nb_lanes_testkern_spin(ctx->stream, ((spin_arg *)arg)->ns);
}

typedef struct {
    int *dst;
    int value;
    uint64_t ns;
} store_arg;
static void store_task(void *arg, const nb_task_ctx *ctx) {
    store_arg *a = arg;
    nb_lanes_testkern_store(ctx->stream, a->dst, a->value, a->ns);
}

typedef struct {
    int *dst;
    const int *src;
} copy_arg;
static void copy_task(void *arg, const nb_task_ctx *ctx) {
    copy_arg *a = arg;
    nb_lanes_testkern_copy(ctx->stream, a->dst, a->src);
}

typedef struct {
    void *dst;
    const void *src;
    size_t bytes;
    enum cudaMemcpyKind kind;
} memcpy_arg;
static void memcpy_task(void *arg, const nb_task_ctx *ctx) {
    memcpy_arg *a = arg;
    TASK_CHECK(cudaMemcpyAsync(a->dst, a->src, a->bytes, a->kind, (cudaStream_t)ctx->stream) ==
               cudaSuccess);
}

static const nb_span *find_span(nb_lanes *L, const char *name) {
    const nb_span *sp;
    size_t n = nb_lanes_spans(L, &sp);
    for (size_t i = 0; i < n; i++)
        if (strcmp(sp[i].name, name) == 0) return &sp[i];
    return NULL;
}

/* ---- 1. marks order kernels across streams ---- */

TEST_CASE(test_marks_order_kernels) {
    atomic_store(&task_failures, 0);
    int *d = NULL;
    CU(cudaMalloc((void **)&d, 4 * sizeof(int)));
    CU(cudaMemset(d, 0, 4 * sizeof(int)));
    nb_lanes *L = nb_lanes_create("cuda", 64);
    nb_lane *a = nb_lane_create(L, "A", NB_LANE_DEVICE),
            *b = nb_lane_create(L, "B", NB_LANE_DEVICE);

    /* A writes 42 after spinning 20 ms; B copies it once A's mark is reached. */
    store_arg st = {&d[0], 42, 20000000};
    copy_arg cp = {&d[1], &d[0]};
    nb_lane_run(a, "store", NB_SPAN_FWD, 0, store_task, &st);
    nb_mark m = nb_lane_mark(a);
    nb_lane_wait(b, m);
    nb_lane_run(b, "copy", NB_SPAN_BWD, 0, copy_task, &cp);
    int early = nb_mark_reached(m);
    double t = nb_now();
    nb_mark_wait_host(m);
    t = nb_now() - t;
    CHECK(!early && nb_mark_reached(m) && t > 0.010,
          "reached %d before the kernel ran; waited %.1f ms", early, t * 1e3);

    /* Control: the same pair without the mark races, so the check above can fail. */
    store_arg st2 = {&d[2], 42, 20000000};
    copy_arg cp2 = {&d[3], &d[2]};
    nb_lane_run(a, "store", NB_SPAN_FWD, 0, store_task, &st2);
    nb_lane_run(b, "copy", NB_SPAN_BWD, 0, copy_task, &cp2);
    nb_lanes_sync(L);
    int h[4];
    CU(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
    CHECK(h[0] == 42 && h[1] == 42, "with the mark: stored %d, copied %d", h[0], h[1]);
    CHECK(h[2] == 42 && h[3] == 0, "without the mark the copy should run first: %d %d", h[2], h[3]);
    CHECK(atomic_load(&task_failures) == 0, "task checks");
    nb_lanes_destroy(L);
    CU(cudaFree(d));
}

/* ---- 2. random DAGs of kernels against serial execution ---- */

#define DAG_N 300
#define DAG_LANES 4
typedef struct {
    int id, ndeps, deps[4];
    uint64_t seed, spin_ns;
    uint64_t *values;
} dag_task;
static void dag_fn(void *arg, const nb_task_ctx *ctx) {
    dag_task *t = arg;
    nb_lanes_testkern_dag(ctx->stream, t->values, t->id, t->deps, t->ndeps, t->seed, t->spin_ns);
}

static void run_dag(uint64_t seed) {
    static dag_task tasks[DAG_N];
    static uint64_t expect[DAG_N], got[DAG_N];
    static nb_mark after[DAG_N];
    static int lane_of[DAG_N];
    uint64_t *values = NULL;
    CU(cudaMalloc((void **)&values, sizeof got));
    CU(cudaMemset(values, 0, sizeof got));
    memset(expect, 0, sizeof expect);
    uint64_t r = seed;
    for (int i = 0; i < DAG_N; i++) {
        dag_task *t = &tasks[i];
        *t = (dag_task){.id = i, .seed = seed, .values = values, .spin_ns = mix64(r += 7) % 30000};
        lane_of[i] = (int)(mix64(r += 7) % DAG_LANES);
        int want = i ? (int)(mix64(r += 7) % 4) : 0;
        for (int k = 0; k < want; k++) {
            int window = i < 24 ? i : 24;
            int j = mix64(r += 7) % 5 ? i - 1 - (int)(mix64(r += 7) % (uint64_t)window)
                                      : (int)(mix64(r += 7) % (uint64_t)i);
            int dup = 0;
            for (int q = 0; q < t->ndeps; q++)
                dup |= t->deps[q] == j;
            if (!dup) t->deps[t->ndeps++] = j;
        }
        expect[i] = nb_lanes_dag_step(expect, i, t->deps, t->ndeps, seed);
    }
    nb_lanes *L = nb_lanes_create("cuda", 1024);
    nb_lane *lanes[DAG_LANES];
    for (int x = 0; x < DAG_LANES; x++)
        lanes[x] = nb_lane_create(L, "dag", NB_LANE_DEVICE);
    int host_checks = 0, host_bad = 0;
    for (int i = 0; i < DAG_N; i++) {
        nb_lane *x = lanes[lane_of[i]];
        for (int k = 0; k < tasks[i].ndeps; k++)
            nb_lane_wait(x, after[tasks[i].deps[k]]);
        char name[16];
        snprintf(name, sizeof name, "d%d", i);
        nb_lane_run(x, name, NB_SPAN_OTHER, 0, dag_fn, &tasks[i]);
        after[i] = nb_lane_mark(x);
        if (mix64(r += 7) % 16 == 0) { /* the host reads a result mid-stream, maybe an old one */
            int j = (int)(mix64(r += 7) % (uint64_t)(i + 1));
            nb_mark_wait_host(after[j]);
            uint64_t v = 0;
            CU(cudaMemcpy(&v, values + j, sizeof v, cudaMemcpyDeviceToHost));
            host_checks++;
            host_bad += v != expect[j];
        }
    }
    nb_lanes_sync(L);
    CU(cudaMemcpy(got, values, sizeof got, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int i = 0; i < DAG_N; i++)
        bad += got[i] != expect[i];
    CHECK(bad == 0 && host_bad == 0,
          "seed %llu: %d of %d values differ from serial, %d of %d host checks",
          (unsigned long long)seed, bad, DAG_N, host_bad, host_checks);

    /* GPU spans share one clock: a task starts after each dependency ended (1 us: the events'
     * resolution). */
    const nb_span *sp;
    size_t ns = nb_lanes_spans(L, &sp);
    static double t0[DAG_N], t1[DAG_N];
    int lane_bad = 0, time_bad = 0;
    for (size_t s = 0; s < ns; s++) {
        int id = atoi(sp[s].name + 1);
        t0[id] = sp[s].t0;
        t1[id] = sp[s].t1;
        lane_bad += sp[s].lane != nb_lane_index(lanes[lane_of[id]]) || sp[s].t1 < sp[s].t0;
    }
    for (int i = 0; i < DAG_N; i++)
        for (int k = 0; k < tasks[i].ndeps; k++)
            time_bad += t0[i] < t1[tasks[i].deps[k]] - 1e-6;
    CHECK(ns == DAG_N && lane_bad == 0 && time_bad == 0,
          "spans %zu of %d, wrong lane/negative %d, started before a dependency ended %d", ns,
          DAG_N, lane_bad, time_bad);
    nb_lanes_destroy(L);
    CU(cudaFree(values));
}

TEST_CASE(test_random_dags) {
    for (uint64_t seed = 1; seed <= 4; seed++)
        run_dag(seed * 104729);
}

/* ---- 3. span timing on the host clock ---- */

TEST_CASE(test_span_timing) {
    atomic_store(&task_failures, 0);
    nb_lanes *L = nb_lanes_create("cuda", 64);
    nb_lane *a = nb_lane_create(L, "A", NB_LANE_DEVICE);
    spin_arg ms1 = {1000000};
    nb_lane_run(a, "warmup", NB_SPAN_OTHER, 0, spin_task, &ms1);
    nb_lanes_sync(L);
    double before = nb_now();
    nb_lane_run(a, "one", NB_SPAN_FWD, 1, spin_task, &ms1);
    nb_lanes_sync(L);
    double after = nb_now();
    const nb_span *s = find_span(L, "one");
    CHECK(s != NULL, "no span");
    if (s) {
        double dur = s->t1 - s->t0;
        CHECK(dur > 0.95e-3 && dur < 1.5e-3, "a 1 ms kernel's span lasts %.3f ms", dur * 1e3);
        CHECK(s->t0 > before - 50e-6 && s->t1 < after + 50e-6,
              "span [%.1f, %.1f] us outside the host window [0, %.1f] us", (s->t0 - before) * 1e6,
              (s->t1 - before) * 1e6, (after - before) * 1e6);
        CHECK(s->lane == nb_lane_index(a) && s->step == 1 && s->kind == NB_SPAN_FWD, "fields");
    }
    /* Back to back: five 1 ms spans, each after the previous, nearly without gaps. */
    const char *names[5] = {"b0", "b1", "b2", "b3", "b4"};
    for (int i = 0; i < 5; i++)
        nb_lane_run(a, names[i], NB_SPAN_FWD, 2, spin_task, &ms1);
    nb_lanes_sync(L);
    int bad = 0;
    double gap_max = 0;
    for (int i = 0; i < 5; i++) {
        const nb_span *x = find_span(L, names[i]);
        if (!x) {
            bad++;
            continue;
        }
        bad += x->t1 - x->t0 < 0.95e-3 || x->t1 - x->t0 > 1.5e-3;
        if (i) {
            const nb_span *p = find_span(L, names[i - 1]);
            double gap = p ? x->t0 - p->t1 : -1;
            bad += gap < -1e-6;
            if (gap > gap_max) gap_max = gap;
        }
    }
    CHECK(bad == 0 && gap_max < 200e-6, "back-to-back spans: %d wrong, largest gap %.1f us", bad,
          gap_max * 1e6);
    const nb_span *first = find_span(L, "b0"), *last = find_span(L, "b4");
    if (first && last) {
        nb_step_stats st = nb_lanes_step_stats(L, 2, nb_lane_index(a), first->t0, last->t1);
        CHECK(st.bubble_pct < 5, "back-to-back kernels: bubble %.2f %%", st.bubble_pct);
    }

    /* The Chrome trace holds the GPU spans like any other. */
    char path[] = "/tmp/nb_lanes_cuda_trace_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    if (fd >= 0) {
        close(fd);
        nb_lanes_write_chrome_trace(L, path, NULL);
        FILE *f = fopen(path, "r");
        char buf[8192] = "";
        size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
        buf[n] = '\0';
        if (f) fclose(f);
        int events = 0;
        for (const char *p = buf; (p = strstr(p, "\"ph\":\"X\"")); p++)
            events++;
        CHECK(events == 7 && strstr(buf, "\"name\":\"b4\""), "trace has %d spans", events);
        remove(path);
    }
    CHECK(atomic_load(&task_failures) == 0, "task checks");
    nb_lanes_destroy(L);
}

/* ---- 4. two streams overlap; a mark serializes them ---- */

TEST_CASE(test_overlap) {
    nb_lanes *L = nb_lanes_create("cuda", 64);
    nb_lane *a = nb_lane_create(L, "A", NB_LANE_DEVICE),
            *b = nb_lane_create(L, "B", NB_LANE_DEVICE);
    spin_arg ms5 = {5000000}, ms3 = {3000000};
    nb_lane_run(a, "warmup", NB_SPAN_OTHER, 0, spin_task, &ms3);
    nb_lane_run(b, "warmup", NB_SPAN_OTHER, 0, spin_task, &ms3);
    nb_lanes_sync(L);

    double t0 = nb_now();
    nb_lane_run(a, "pa", NB_SPAN_FWD, 2, spin_task, &ms5);
    nb_lane_run(b, "pb", NB_SPAN_BWD, 2, spin_task, &ms5);
    nb_lanes_sync(L);
    double t1 = nb_now();
    nb_step_stats s = nb_lanes_step_stats(L, 2, nb_lane_index(a), t0, t1);
    double overlap = s.overlap_pct / 100 * s.window_s;
    CHECK(overlap > 4e-3 && s.busy_s > 4.9e-3 && s.busy_s < 6e-3,
          "concurrent 5 ms kernels: overlap %.3f ms, A busy %.3f ms of %.3f ms", overlap * 1e3,
          s.busy_s * 1e3, s.window_s * 1e3);

    t0 = nb_now();
    nb_lane_run(a, "sa", NB_SPAN_FWD, 3, spin_task, &ms3);
    nb_lane_wait(b, nb_lane_mark(a));
    nb_lane_run(b, "sb", NB_SPAN_BWD, 3, spin_task, &ms3);
    nb_lanes_sync(L);
    t1 = nb_now();
    s = nb_lanes_step_stats(L, 3, nb_lane_index(b), t0, t1);
    const nb_span *sa = find_span(L, "sa"), *sb = find_span(L, "sb");
    CHECK(sa && sb && sb->t0 >= sa->t1 - 1e-6, "B started %.1f us before A ended",
          sa && sb ? (sa->t1 - sb->t0) * 1e6 : -1.0);
    CHECK(s.overlap_pct / 100 * s.window_s < 20e-6 && s.busy_s > 2.9e-3,
          "serialized: overlap %.3f ms, B busy %.3f ms", s.overlap_pct / 100 * s.window_s * 1e3,
          s.busy_s * 1e3);
    nb_lanes_destroy(L);
}

/* ---- 5. host lanes and device lanes wait on each other ---- */

typedef struct {
    volatile int *pinned;
    int seen;
} read_arg;
static void read_pinned(void *arg, const nb_task_ctx *ctx) {
    read_arg *a = arg;
    TASK_CHECK(ctx->stream == NULL);
    a->seen = *a->pinned;
}

typedef struct {
    volatile int *pinned;
    int value;
} write_arg;
static void slow_write_pinned(void *arg, const nb_task_ctx *ctx) {
    write_arg *a = arg;
    sleep_us(20000);
    *a->pinned = a->value;
}

TEST_CASE(test_host_device_waits) {
    atomic_store(&task_failures, 0);
    int *d = NULL, *h = NULL;
    CU(cudaMalloc((void **)&d, 4 * sizeof(int)));
    CU(cudaMemset(d, 0, 4 * sizeof(int)));
    CU(cudaMallocHost((void **)&h, 4 * sizeof(int)));
    memset(h, 0xff, 4 * sizeof(int));
    nb_lanes *L = nb_lanes_create("cuda", 64);
    nb_lane *dev = nb_lane_create(L, "dev", NB_LANE_DEVICE),
            *host = nb_lane_create(L, "host", NB_LANE_HOST);

    /* Host lane waits on a device mark: GPU spins 20 ms, stores 42, copies it to pinned memory. */
    store_arg st = {&d[0], 42, 20000000};
    memcpy_arg down = {&h[0], &d[0], sizeof(int), cudaMemcpyDeviceToHost};
    nb_lane_run(dev, "store", NB_SPAN_FWD, 0, store_task, &st);
    nb_lane_run(dev, "d2h", NB_SPAN_D2H, 0, memcpy_task, &down);
    nb_lane_wait(host, nb_lane_mark(dev));
    read_arg rd = {&h[0], -1};
    nb_lane_run(host, "read", NB_SPAN_OPTIM, 0, read_pinned, &rd);
    nb_mark_wait_host(nb_lane_mark(host));
    CHECK(rd.seen == 42, "host lane read %d before the device wrote it", rd.seen);

    /* Device lane waits on a host mark: the host lane writes 7 after 20 ms; the GPU copies it. */
    write_arg wr = {&h[1], 7};
    nb_lane_run(host, "write", NB_SPAN_DATA, 0, slow_write_pinned, &wr);
    nb_lane_wait(dev, nb_lane_mark(host));
    memcpy_arg up = {&d[1], &h[1], sizeof(int), cudaMemcpyHostToDevice};
    copy_arg cp = {&d[2], &d[1]};
    memcpy_arg back = {&h[2], &d[2], sizeof(int), cudaMemcpyDeviceToHost};
    nb_lane_run(dev, "h2d", NB_SPAN_H2D, 0, memcpy_task, &up);
    nb_lane_run(dev, "copy", NB_SPAN_FWD, 0, copy_task, &cp);
    nb_lane_run(dev, "d2h", NB_SPAN_D2H, 0, memcpy_task, &back);
    nb_lanes_sync(L);
    CHECK(h[2] == 7, "device lane copied %d instead of the host lane's 7", h[2]);
    const nb_span *w = find_span(L, "write"), *u = find_span(L, "h2d");
    CHECK(w && u && u->t0 >= w->t1 - 50e-6, "h2d started %.1f us before the host write ended",
          w && u ? (w->t1 - u->t0) * 1e6 : -1.0);
    CHECK(atomic_load(&task_failures) == 0, "task checks");
    nb_lanes_destroy(L);
    CU(cudaFreeHost(h));
    CU(cudaFree(d));
}

/* ---- 6. steady state creates no events ---- */

static void tiny_task(void *arg, const nb_task_ctx *ctx) {
    nb_lanes_testkern_spin(ctx->stream, 2000);
}

static void pool_rounds(nb_lanes *L, nb_lane *a, nb_lane *b, int rounds) {
    for (int i = 0; i < rounds; i++) {
        nb_lane_run(a, "ta", NB_SPAN_FWD, i, tiny_task, NULL);
        nb_lane_wait(b, nb_lane_mark(a));
        nb_lane_run(b, "tb", NB_SPAN_BWD, i, tiny_task, NULL);
        nb_lane_wait(a, nb_lane_mark(b));
        if (i % 10 == 9) nb_mark_wait_host(nb_lane_mark(a)); /* as a training step would */
    }
}

TEST_CASE(test_event_pool) {
    nb_lanes *L = nb_lanes_create("cuda", 1 << 14);
    nb_lane *a = nb_lane_create(L, "A", NB_LANE_DEVICE),
            *b = nb_lane_create(L, "B", NB_LANE_DEVICE);
    pool_rounds(L, a, b, 300);
    nb_lanes_sync(L);
    size_t before = nb_lanes_cuda_events_created(L);
    pool_rounds(L, a, b, 1000);
    nb_lanes_sync(L);
    size_t grown = nb_lanes_cuda_events_created(L) - before;
    printf("  events: %zu after 300 warm-up rounds, %zu more over 1000 rounds (4000 marks + "
           "spans' 4000 timing events)\n",
           before, grown);
    CHECK(before < 200 && grown <= 16, "pooled events: %zu, then %zu more", before, grown);
    const nb_span *sp;
    CHECK(nb_lanes_spans(L, &sp) == 2600, "spans %zu", nb_lanes_spans(L, &sp));
    nb_lanes_destroy(L);
}

/* ---- 7. errors, in a fresh process (a forked CUDA process cannot use CUDA) ---- */

static void noop_task(void *arg, const nb_task_ctx *ctx) {}
static void sync_task(void *arg, const nb_task_ctx *ctx) {
    (void)cudaStreamSynchronize((cudaStream_t)ctx->stream); /* illegal inside a capture */
    (void)cudaGetLastError();
}

static int child_main(const char *mode) {
    if (strcmp(mode, "create") == 0) {
        nb_lanes_create("cuda", 0);
        return 0;
    }
    nb_lanes *L = nb_lanes_create("cuda", 64);
    nb_lane *a = nb_lane_create(L, "A", NB_LANE_DEVICE),
            *b = nb_lane_create(L, "B", NB_LANE_DEVICE);
    nb_lanes_capture_begin(L, a);
    if (strcmp(mode, "sync_in_capture") == 0) {
        nb_lane_run(b, "sync", NB_SPAN_OTHER, 0, sync_task, NULL);
        nb_lanes_capture_end(L);
    } else if (strcmp(mode, "stale") == 0) {
        nb_lane_run(a, "x", NB_SPAN_OTHER, 0, noop_task, NULL);
        nb_mark m = nb_lane_mark(a);
        nb_lanes_capture_end(L);
        nb_lane_wait(b, m);
    } else if (strcmp(mode, "reached_in_capture") == 0) {
        nb_lane_run(a, "x", NB_SPAN_OTHER, 0, noop_task, NULL);
        nb_mark_reached(nb_lane_mark(a));
    }
    return 0;
}

static void exec_child(const void *mode) {
    execl("/proc/self/exe", "test_lanes_cuda", "--child", (const char *)mode, (char *)NULL);
    _exit(127);
}

static int spawn_self(const char *mode, char *err, size_t cap) { return child_stderr(exec_child, mode, err, cap); }

TEST_CASE(test_capture_errors) {
    char err[4096];
    int rc = spawn_self("sync_in_capture", err, sizeof err);
    CHECK(rc == 1 && strstr(err, "CUDA graph capture") &&
              strstr(err, "only launch work on ctx->stream"),
          "synchronizing inside a capture: exit %d, stderr: %s", rc, err);
    rc = spawn_self("stale", err, sizeof err);
    CHECK(rc == 1 && strstr(err, "taken inside a capture that has ended"),
          "stale mark: exit %d, stderr: %s", rc, err);
    rc = spawn_self("reached_in_capture", err, sizeof err);
    CHECK(rc == 1 && strstr(err, "taken inside the capture in progress"), "exit %d, stderr: %s", rc,
          err);
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--child") == 0) return child_main(argv[2]);
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        /* What a user sees when asking for CUDA lanes here must be one clear line. */
        char err[4096];
        int rc = spawn_self("create", err, sizeof err);
        if (rc != 1 || !strstr(err, "no usable GPU") || !strstr(err, "--device cpu")) {
            fprintf(stderr, "FAIL: backend 'cuda' without a GPU: exit %d, stderr: %s\n", rc, err);
            return 1;
        }
        printf("skipped: no GPU visible (%s)\n",
               e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return 77;
    }
    RUN(test_marks_order_kernels);
    RUN(test_random_dags);
    RUN(test_span_timing);
    RUN(test_overlap);
    RUN(test_host_device_waits);
    RUN(test_event_pool);
    RUN(test_capture_errors);
    TEST_EXIT();
}
#endif
