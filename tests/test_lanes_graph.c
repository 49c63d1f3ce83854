/* Graph capture and replay (lanes.h "graphs"), on the CPU backend always and on CUDA when a GPU is
 * visible: a random DAG of tasks over three device lanes, each task mixing its previous value
 * with its dependencies' current ones, is run directly N times and captured once and replayed N
 * times; both must equal a serial reference. Spans show every replay, ordered as the DAG says and
 * replays one after another. Then the capture rules: each violation must end in a clear nb_fail
 * (checked in child processes, CPU backend: the rules are enforced backend-independently). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
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

#ifdef NB_WITH_CUDA
#include <cuda_runtime.h>
#endif

/* ---- the program: a DAG over device lanes ---- */

#define NT 48 /* tasks */
#define NL 3  /* device lanes */
#define REPLAYS 5
#define SLOW_US 1000 /* task 0 takes this long: its span must show it in every replay */

typedef struct {
    int id, ndeps, deps[4], lane;
    uint64_t seed;
    uint64_t *values; /* host array (cpu) or device array (cuda) */
    long spin_us;
} gtask;

static gtask tasks[NT];
static atomic_int calls; /* how often a task fn ran on the host (CPU) or launched kernels (CUDA) */

static void gtask_fn(void *arg, const nb_task_ctx *ctx) {
    gtask *t = arg;
    atomic_fetch_add(&calls, 1);
#ifdef NB_WITH_CUDA
    if (ctx->stream) {
        nb_lanes_testkern_dag(ctx->stream, t->values, t->id, t->deps, t->ndeps, t->seed,
                              (uint64_t)t->spin_us * 1000);
        return;
    }
#endif
    if (t->spin_us)
        sleep_us(t->spin_us);
    else if (mix64(t->seed ^ (uint64_t)t->id) % 3 == 0)
        sched_yield();
    t->values[t->id] = nb_lanes_dag_step(t->values, t->id, t->deps, t->ndeps, t->seed);
}

static void make_program(uint64_t seed, uint64_t *values) {
    uint64_t r = seed;
    for (int i = 0; i < NT; i++) {
        gtask *t = &tasks[i];
        *t = (gtask){.id = i, .seed = seed, .values = values};
        t->lane = (int)(mix64(r += 77) % NL);
        t->spin_us = i == 0 ? SLOW_US : (long)(mix64(r += 77) % 20);
        int want = i ? (int)(mix64(r += 77) % 4) : 0;
        for (int k = 0; k < want; k++) {
            int window = i < 8 ? i : 8;
            int j = i - 1 - (int)(mix64(r += 77) % (uint64_t)window);
            int dup = 0;
            for (int q = 0; q < t->ndeps; q++)
                dup |= t->deps[q] == j;
            if (!dup) t->deps[t->ndeps++] = j;
        }
    }
}

static void initial_values(uint64_t *v) {
    for (int i = 0; i < NT; i++)
        v[i] = mix64(1000 + (uint64_t)i);
}

static void reference(uint64_t *v, int rounds) {
    initial_values(v);
    for (int r = 0; r < rounds; r++)
        for (int i = 0; i < NT; i++)
            v[i] = nb_lanes_dag_step(v, i, tasks[i].deps, tasks[i].ndeps, tasks[i].seed);
}

static void enqueue_program(nb_lane **lanes, int step) {
    nb_mark after[NT];
    for (int i = 0; i < NT; i++) {
        nb_lane *x = lanes[tasks[i].lane];
        for (int k = 0; k < tasks[i].ndeps; k++)
            nb_lane_wait(x, after[tasks[i].deps[k]]);
        char name[16];
        snprintf(name, sizeof name, "g%d", i);
        nb_lane_run(x, name, NB_SPAN_OTHER, step, gtask_fn, &tasks[i]);
        after[i] = nb_lane_mark(x);
    }
}

/* ---- memory that is host or device depending on the backend ---- */

typedef struct {
    int cuda;
    uint64_t *buf; /* where the tasks work */
} store;

static void store_init(store *s, int cuda) {
    s->cuda = cuda;
#ifdef NB_WITH_CUDA
    if (cuda) {
        CHECK(cudaMalloc((void **)&s->buf, NT * sizeof(uint64_t)) == cudaSuccess, "cudaMalloc");
        return;
    }
#endif
    s->buf = calloc(NT, sizeof(uint64_t));
}

static void store_put(store *s, const uint64_t *host) {
#ifdef NB_WITH_CUDA
    if (s->cuda) {
        CHECK(cudaMemcpy(s->buf, host, NT * sizeof *host, cudaMemcpyHostToDevice) == cudaSuccess,
              "put");
        return;
    }
#endif
    memcpy(s->buf, host, NT * sizeof *host);
}

static void store_get(store *s, uint64_t *host) {
#ifdef NB_WITH_CUDA
    if (s->cuda) {
        CHECK(cudaMemcpy(host, s->buf, NT * sizeof *host, cudaMemcpyDeviceToHost) == cudaSuccess,
              "get");
        return;
    }
#endif
    memcpy(host, s->buf, NT * sizeof *host);
}

static void store_free(store *s) {
#ifdef NB_WITH_CUDA
    if (s->cuda) {
        cudaFree(s->buf);
        return;
    }
#endif
    free(s->buf);
}

/* A task on the launch lane copies the values out; a host lane then checks them. */
typedef struct {
    store *s;
    uint64_t *host; /* pinned on CUDA */
    const uint64_t *expect;
    int ok;
} copy_out;

static void copy_out_task(void *arg, const nb_task_ctx *ctx) {
    copy_out *c = arg;
#ifdef NB_WITH_CUDA
    if (ctx->stream) {
        if (cudaMemcpyAsync(c->host, c->s->buf, NT * sizeof(uint64_t), cudaMemcpyDeviceToHost,
                            (cudaStream_t)ctx->stream) != cudaSuccess)
            c->ok = -1;
        return;
    }
#endif
    memcpy(c->host, c->s->buf, NT * sizeof(uint64_t));
}

static void check_out_task(void *arg, const nb_task_ctx *ctx) {
    copy_out *c = arg;
    if (c->ok == 0) c->ok = memcmp(c->host, c->expect, NT * sizeof(uint64_t)) == 0 ? 1 : -1;
}

static void slow_host_task(void *arg, const nb_task_ctx *ctx) { sleep_us(30000); }

static int span_id(const nb_span *s) { return s->name[0] == 'g' ? atoi(s->name + 1) : -1; }

/* tol: how far apart two ordered timestamps may read in the wrong order. 0 on the CPU (one
 * monotonic clock, causally ordered reads). On CUDA, GPU-GPU comparisons get 1 us (the events'
 * resolution), GPU vs host (the gate) 50 us: GPU spans are mapped onto the host clock through an
 * anchor read a few microseconds off (lanes_cuda.c). */
static void check_spans(nb_lanes *L, int first_step, int rounds, nb_lane **lanes, double gate_t1,
                        const char *backend) {
    int cuda = strcmp(backend, "cuda") == 0;
    double tol = cuda ? 1e-6 : 0, tol_host = cuda ? 50e-6 : 0;
    const nb_span *sp;
    size_t ns = nb_lanes_spans(L, &sp);
    static double t0[REPLAYS][NT], t1[REPLAYS][NT];
    int seen[REPLAYS][NT];
    memset(seen, 0, sizeof seen);
    int lane_bad = 0;
    for (size_t s = 0; s < ns; s++) {
        int id = span_id(&sp[s]), r = sp[s].step - first_step;
        if (id < 0 || r < 0 || r >= rounds) continue;
        seen[r][id]++;
        t0[r][id] = sp[s].t0;
        t1[r][id] = sp[s].t1;
        lane_bad += sp[s].lane != nb_lane_index(lanes[tasks[id].lane]);
    }
    int missing = 0, order_bad = 0, serial_bad = 0, slow_bad = 0;
    for (int r = 0; r < rounds; r++) {
        double start = 1e300, end = -1e300;
        for (int i = 0; i < NT; i++) {
            missing += seen[r][i] != 1;
            for (int k = 0; k < tasks[i].ndeps; k++)
                order_bad += t0[r][i] < t1[r][tasks[i].deps[k]] - tol;
            if (t0[r][i] < start) start = t0[r][i];
            if (t1[r][i] > end) end = t1[r][i];
        }
        double slow = t1[r][0] - t0[r][0];
        slow_bad += slow < 0.9 * SLOW_US * 1e-6 || slow > 50 * SLOW_US * 1e-6;
        if (r > 0) {
            double prev_end = -1e300;
            for (int i = 0; i < NT; i++)
                prev_end = t1[r - 1][i] > prev_end ? t1[r - 1][i] : prev_end;
            serial_bad += start < prev_end - tol;
        }
        if (r == 0 && gate_t1 > 0) serial_bad += start < gate_t1 - tol_host;
    }
    CHECK(missing == 0 && lane_bad == 0, "%s: spans missing/duplicated %d, on the wrong lane %d",
          backend, missing, lane_bad);
    CHECK(order_bad == 0 && serial_bad == 0 && slow_bad == 0,
          "%s: started before a dependency ended %d, replay overlapping the previous one (or the "
          "gate) %d, slow task's span off %d (replay 0: %.3f ms)",
          backend, order_bad, serial_bad, slow_bad, (t1[0][0] - t0[0][0]) * 1e3);
}

static void graph_vs_direct(const char *backend) {
    int cuda = strcmp(backend, "cuda") == 0;
    store s;
    store_init(&s, cuda);
    static uint64_t init[NT], expect[NT], got[NT];
    make_program(0xC0FFEE, s.buf);
    reference(expect, REPLAYS);
    initial_values(init);

    nb_lanes *L = nb_lanes_create(backend, 4096);
    nb_lane *lanes[NL];
    for (int x = 0; x < NL; x++) {
        char name[16];
        snprintf(name, sizeof name, "dev%d", x);
        lanes[x] = nb_lane_create(L, name, NB_LANE_DEVICE);
    }
    nb_lane *host = nb_lane_create(L, "host", NB_LANE_HOST);

    /* Direct: the same enqueue sequence, REPLAYS times. */
    store_put(&s, init);
    for (int r = 0; r < REPLAYS; r++) {
        enqueue_program(lanes, r);
        nb_lanes_sync(L); /* the next round rewrites values this round's tasks still read */
    }
    store_get(&s, got);
    CHECK(memcmp(got, expect, sizeof got) == 0, "%s: direct execution differs from the reference",
          backend);
    check_spans(L, 0, REPLAYS, lanes, 0, backend);

    /* Capture: nothing runs (CPU) / fn launches once into the graph (CUDA). */
    store_put(&s, init);
    nb_lanes_trace_clear(L);
    atomic_store(&calls, 0);
    nb_lanes_capture_begin(L, lanes[0]);
    enqueue_program(lanes, 0);
    nb_graph *g = nb_lanes_capture_end(L);
    nb_lanes_sync(L);
    store_get(&s, got);
    CHECK(memcmp(got, init, sizeof got) == 0, "%s: capturing ran the tasks", backend);
    CHECK(atomic_load(&calls) == (cuda ? NT : 0), "%s: fn called %d times at capture", backend,
          atomic_load(&calls));
    const nb_span *sp;
    CHECK(nb_lanes_spans(L, &sp) == 0, "%s: a capture recorded spans", backend);

    /* Replays: the first one waits for a 30 ms host task through the launch lane. */
    nb_lane_run(host, "gate", NB_SPAN_OTHER, 99, slow_host_task, NULL);
    nb_lane_wait(lanes[1], nb_lane_mark(host));
    for (int r = 0; r < REPLAYS; r++)
        nb_graph_launch(g, lanes[1], 100 + r);
    /* A mark on the launch lane covers every replayed task, whichever lane captured it. */
    uint64_t *pinned = NULL;
#ifdef NB_WITH_CUDA
    if (cuda) CHECK(cudaMallocHost((void **)&pinned, NT * sizeof *pinned) == cudaSuccess, "pinned");
#endif
    if (!cuda) pinned = calloc(NT, sizeof *pinned);
    copy_out co = {&s, pinned, expect, 0};
    nb_lane_run(lanes[1], "copy out", NB_SPAN_D2H, 200, copy_out_task, &co);
    nb_lane_wait(host, nb_lane_mark(lanes[1]));
    nb_lane_run(host, "check", NB_SPAN_OTHER, 200, check_out_task, &co);
    nb_lanes_sync(L);
    CHECK(co.ok == 1,
          "%s: the host lane did not see the replays' results after the launch "
          "lane's mark (%d)",
          backend, co.ok);
    store_get(&s, got);
    CHECK(memcmp(got, expect, sizeof got) == 0, "%s: %d replays differ from the reference", backend,
          REPLAYS);
    CHECK(atomic_load(&calls) == (cuda ? NT : NT * REPLAYS), "%s: fn called %d times after replays",
          backend, atomic_load(&calls));
    double gate_t1 = 0;
    size_t ns = nb_lanes_spans(L, &sp);
    for (size_t k = 0; k < ns; k++)
        if (strcmp(sp[k].name, "gate") == 0) gate_t1 = sp[k].t1;
    CHECK(gate_t1 > 0, "%s: no gate span", backend);
    check_spans(L, 100, REPLAYS, lanes, gate_t1, backend);

    /* Destroying right after a launch is safe; the replay still completes. */
    store_put(&s, init);
    nb_graph_launch(g, lanes[0], 300);
    nb_graph_destroy(g);
    nb_lanes_sync(L);
    store_get(&s, got);
    reference(expect, 1);
    CHECK(memcmp(got, expect, sizeof got) == 0, "%s: a replay destroyed in flight differs",
          backend);

    nb_lanes_destroy(L);
#ifdef NB_WITH_CUDA
    if (cuda) cudaFreeHost(pinned);
#endif
    if (!cuda) free(pinned);
    store_free(&s);
}

/* ---- capture rules (CPU backend, in child processes) ---- */

static void noop(void *arg, const nb_task_ctx *ctx) {}

static nb_lanes *RL;
static nb_lane *RA, *RB, *RH;
static void rules_setup(void) {
    RL = nb_lanes_create("cpu", 16);
    RA = nb_lane_create(RL, "A", NB_LANE_DEVICE);
    RB = nb_lane_create(RL, "B", NB_LANE_DEVICE);
    RH = nb_lane_create(RL, "H", NB_LANE_HOST);
}

static void child_outside_mark(void) {
    rules_setup();
    nb_lane_run(RB, "before", NB_SPAN_OTHER, 0, noop, NULL);
    nb_mark m = nb_lane_mark(RB);
    nb_lanes_capture_begin(RL, RA);
    nb_lane_wait(RA, m);
}
static void child_host_waits_capture(void) {
    rules_setup();
    nb_lanes_capture_begin(RL, RA);
    nb_lane_run(RA, "x", NB_SPAN_OTHER, 0, noop, NULL);
    nb_lane_wait(RH, nb_lane_mark(RA));
}
static void child_wait_host_capture(void) {
    rules_setup();
    nb_lanes_capture_begin(RL, RA);
    nb_lane_run(RA, "x", NB_SPAN_OTHER, 0, noop, NULL);
    nb_mark_wait_host(nb_lane_mark(RA));
}
static void child_stale(void) {
    rules_setup();
    nb_lanes_capture_begin(RL, RA);
    nb_lane_run(RA, "x", NB_SPAN_OTHER, 0, noop, NULL);
    nb_mark m = nb_lane_mark(RA);
    nb_graph *g = nb_lanes_capture_end(RL);
    (void)g;
    nb_lanes_capture_begin(RL, RA); /* a second capture: the first one's marks stay stale */
    nb_lane_wait(RB, m);
}
static void child_sync(void) {
    rules_setup();
    nb_lanes_capture_begin(RL, RA);
    nb_lanes_sync(RL);
}
static void child_nested(void) {
    rules_setup();
    nb_lanes_capture_begin(RL, RA);
    nb_lanes_capture_begin(RL, RB);
}
static void child_end_without(void) {
    rules_setup();
    nb_lanes_capture_end(RL);
}
static void child_host_origin(void) {
    rules_setup();
    nb_lanes_capture_begin(RL, RH);
}
static void child_launch_host(void) {
    rules_setup();
    nb_lanes_capture_begin(RL, RA);
    nb_graph *g = nb_lanes_capture_end(RL);
    nb_graph_launch(g, RH, 0);
}
static void child_destroy_live(void) {
    rules_setup();
    nb_lanes_capture_begin(RL, RA);
    nb_lanes_capture_end(RL);
    nb_lanes_destroy(RL);
}
static void *end_capture_thread(void *arg) {
    nb_lanes_capture_end(RL);
    return NULL;
}
static void child_other_thread(void) {
    rules_setup();
    nb_lanes_capture_begin(RL, RA);
    pthread_t t;
    if (pthread_create(&t, NULL, end_capture_thread, NULL) == 0) pthread_join(t, NULL);
}
static void child_create(void) {
    rules_setup();
    nb_lanes_capture_begin(RL, RA);
    nb_lane_create(RL, "late", NB_LANE_DEVICE);
}
static void child_valid(void) { /* the rules allow all of this */
    rules_setup();
    nb_lane_run(RB, "before", NB_SPAN_OTHER, 0, noop, NULL);
    nb_mark before = nb_lane_mark(RB);
    nb_lanes_capture_begin(RL, RA);
    nb_lane_wait(RH, before);                              /* host lanes may wait on plain marks */
    nb_lane_run(RH, "host", NB_SPAN_OTHER, 0, noop, NULL); /* and keep running */
    nb_mark_wait_host(nb_lane_mark(RH));
    nb_lane_run(RA, "a", NB_SPAN_OTHER, 0, noop, NULL);
    nb_lane_wait(RB, nb_lane_mark(RA));
    nb_lane_wait(RA, nb_lane_mark(RA));
    nb_lane_run(RB, "b", NB_SPAN_OTHER, 0, noop, NULL);
    nb_graph *g = nb_lanes_capture_end(RL);
    nb_lane_wait(RA, before);
    nb_graph_launch(g, RB, 1);
    nb_graph_launch(g, RA, 2);
    nb_mark_wait_host(nb_lane_mark(RA));
    nb_graph_destroy(g);
    nb_lanes_destroy(RL);
    fprintf(stderr, "valid-ok\n");
}

TEST_CASE(test_capture_rules) {
    struct {
        void (*fn)(void);
        const char *expect;
    } cases[] = {
        {child_outside_mark, "waits on a mark of lane 'B' taken outside it"},
        {child_host_waits_capture,
         "host lane 'H' waits on a mark of lane 'A' taken inside the capture"},
        {child_wait_host_capture,
         "nb_mark_wait_host on a mark of lane 'A' taken inside the capture in progress"},
        {child_stale, "taken inside a capture that has ended"},
        {child_sync, "nb_lanes_sync while a graph is being captured"},
        {child_nested, "while another capture is in progress"},
        {child_end_without, "without a capture in progress"},
        {child_host_origin, "lane 'H' is not a device lane"},
        {child_launch_host, "nb_graph_launch: lane 'H' is not a device lane"},
        {child_destroy_live, "1 graph(s) not destroyed"},
        {child_other_thread, "from another thread than the one that began the capture"},
        {child_create, "nb_lane_create while a graph is being captured"},
    };
    char err[4096];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = run_child(cases[i].fn, err, sizeof err);
        CHECK(rc == 1 && strstr(err, cases[i].expect) && strstr(err, "hint"),
              "case %zu: exit %d, stderr: %s", i, rc, err);
    }
    int rc = run_child(child_valid, err, sizeof err);
    CHECK(rc == 0 && strstr(err, "valid-ok"), "valid use: exit %d, stderr: %s", rc, err);
}

TEST_CASE(test_graph_cpu) { graph_vs_direct("cpu"); }

#ifdef NB_WITH_CUDA
TEST_CASE(test_graph_cuda) { graph_vs_direct("cuda"); }
#endif

int main(void) {
    RUN(test_capture_rules); /* first: forks before this process has any CUDA state */
    RUN(test_graph_cpu);
#ifdef NB_WITH_CUDA
    int n = 0;
    if (cudaGetDeviceCount(&n) == cudaSuccess && n > 0)
        RUN(test_graph_cuda);
    else
        printf("skip test_graph_cuda: no GPU visible\n");
#endif
    TEST_EXIT();
}
