/* Lanes runtime tests: ordering through marks, FIFO, random DAGs against serial execution,
 * sync/destroy, traces and step statistics. Shared data between tasks is deliberately plain
 * (non-atomic) where marks must order it, so `make tsan` flags any missing happens-before edge.
 * Failures inside tasks go to an atomic counter (CHECK is for the main thread only). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
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
#include "lanes_test.h"

/* Deterministic per-task jitter: nothing, a yield, or a sleep of up to 200 us. */
static void jitter(uint64_t key) {
    uint64_t r = mix64(key);
    if (r % 4 == 0) sched_yield();
    else if (r % 4 == 1) sleep_us((long)(r >> 32) % 200);
}

static int count_threads(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    int n = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "Threads: %d", &n) == 1) break;
    fclose(f);
    return n;
}

/* ---- 0. backends and the debug timeout ---- */

static void child_cuda(void) { nb_lanes_create("cuda", 0); }
static void child_unknown(void) { nb_lanes_create("tpu", 0); }
static void child_bad_timeout(void) {
    setenv("NB_LANES_TIMEOUT", "soon", 1);
    nb_lanes_create("cpu", 0);
}

static atomic_int never_open;
static void block_forever(void *arg, const nb_task_ctx *ctx) {
    while (!atomic_load(&never_open)) sleep_us(1000);
}
static void child_stuck(void) {
    setenv("NB_LANES_TIMEOUT", "0.2", 1);
    nb_lanes *L = nb_lanes_create("cpu", 0);
    nb_lane *s = nb_lane_create(L, "stuck", NB_LANE_HOST);
    nb_lane_run(s, "forever", NB_SPAN_OTHER, 0, block_forever, NULL);
    nb_mark_wait_host(nb_lane_mark(s));
}

TEST_CASE(test_backends_and_timeout) {
    char err[4096];
    int rc = run_child(child_cuda, err, sizeof err);
#ifdef NB_WITH_CUDA
    (void)rc;
#else
    CHECK(rc == 1, "cuda backend without CUDA: exit %d", rc);
    CHECK(strstr(err, "this build has no CUDA") && strstr(err, "--device cpu"), "stderr: %s", err);
#endif
    rc = run_child(child_unknown, err, sizeof err);
    CHECK(rc == 1 && strstr(err, "unknown lanes backend 'tpu'"), "exit %d, stderr: %s", rc, err);
    rc = run_child(child_bad_timeout, err, sizeof err);
    CHECK(rc == 1 && strstr(err, "NB_LANES_TIMEOUT='soon'"), "exit %d, stderr: %s", rc, err);
    double t = nb_now();
    rc = run_child(child_stuck, err, sizeof err);
    t = nb_now() - t;
    CHECK(rc == 1 && strstr(err, "the host thread waited") && strstr(err, "lane 'stuck'") &&
              strstr(err, "finished 0 of the 1 tasks") && strstr(err, "now running 'forever'"),
          "exit %d, stderr: %s", rc, err);
    CHECK(t >= 0.2 && t < 5.0, "timeout fired after %.3f s", t);
}

/* ---- 1. ordering ---- */

#define ROUNDS 100
typedef struct {
    atomic_int flag[ROUNDS];
    int payload[ROUNDS]; /* plain: only marks order the writer and the reader */
    long sleep_us[ROUNDS];
} order_state;

typedef struct {
    order_state *st;
    int i;
} order_arg;

static void order_produce(void *arg, const nb_task_ctx *ctx) {
    order_arg *a = arg;
    sleep_us(a->st->sleep_us[a->i]);
    a->st->payload[a->i] = 1000 + a->i;
    atomic_store_explicit(&a->st->flag[a->i], 1, memory_order_relaxed);
}

static void order_consume(void *arg, const nb_task_ctx *ctx) {
    order_arg *a = arg;
    TASK_CHECK(atomic_load_explicit(&a->st->flag[a->i], memory_order_relaxed) == 1);
    TASK_CHECK(a->st->payload[a->i] == 1000 + a->i);
}

TEST_CASE(test_ordering) {
    static order_state st;
    static order_arg args[ROUNDS];
    memset(&st, 0, sizeof st);
    atomic_store(&task_failures, 0);
    nb_lanes *L = nb_lanes_create("cpu", 0);
    nb_lane *lane[2] = {nb_lane_create(L, "A", NB_LANE_HOST), nb_lane_create(L, "B", NB_LANE_DEVICE)};
    /* Round 0: a 20 ms producer; then 99 rounds with jittered producers, alternating which lane
     * produces, so both directions of waiting are exercised. */
    for (int i = 0; i < ROUNDS; i++) {
        st.sleep_us[i] = i == 0 ? 20000 : (long)(mix64((uint64_t)i) % 300);
        args[i] = (order_arg){&st, i};
        nb_lane *prod = lane[i % 2], *cons = lane[1 - i % 2];
        nb_lane_run(prod, "produce", NB_SPAN_FWD, i, order_produce, &args[i]);
        nb_lane_wait(cons, nb_lane_mark(prod));
        nb_lane_run(cons, "consume", NB_SPAN_BWD, i, order_consume, &args[i]);
    }
    nb_lanes_sync(L);
    CHECK(atomic_load(&task_failures) == 0, "%d ordering violations", atomic_load(&task_failures));
    nb_lanes_destroy(L);
}

/* ---- 2. FIFO ---- */

#define FIFO_N 2000
typedef struct {
    int order[FIFO_N];
    int n; /* written only by the lane's thread */
} fifo_state;
typedef struct {
    fifo_state *st;
    int i;
} fifo_arg;

static void fifo_task(void *arg, const nb_task_ctx *ctx) {
    fifo_arg *a = arg;
    if ((a->i & 63) == 0) sched_yield();
    a->st->order[a->st->n++] = a->i;
}

static void spin_task(void *arg, const nb_task_ctx *ctx) { jitter((uint64_t)(uintptr_t)arg); }

TEST_CASE(test_fifo) {
    static fifo_state st;
    static fifo_arg args[FIFO_N];
    memset(&st, 0, sizeof st);
    nb_lanes *L = nb_lanes_create("cpu", 0);
    nb_lane *q = nb_lane_create(L, "q", NB_LANE_HOST);
    nb_lane *other = nb_lane_create(L, "other", NB_LANE_HOST);
    for (int i = 0; i < FIFO_N; i++) {
        args[i] = (fifo_arg){&st, i};
        /* Waits interleaved with tasks must not reorder the tasks around them. */
        if (i % 100 == 50) {
            nb_lane_run(other, "spin", NB_SPAN_OTHER, 0, spin_task, (void *)(uintptr_t)i);
            nb_lane_wait(q, nb_lane_mark(other));
        }
        nb_lane_run(q, "fifo", NB_SPAN_OTHER, 0, fifo_task, &args[i]);
    }
    nb_lanes_sync(L);
    int bad = 0;
    for (int i = 0; i < FIFO_N; i++) bad += st.order[i] != i;
    CHECK(st.n == FIFO_N && bad == 0, "n %d, %d out of order", st.n, bad);
    nb_lanes_destroy(L);
}

/* ---- 3. random DAGs against serial execution ---- */

#define DAG_MAX 320
#define DAG_MAX_LANES 6
typedef struct {
    int id, ndeps, deps[4];
    uint64_t seed;
    uint64_t *values;
} dag_task;

static uint64_t dag_value(const dag_task *t, const uint64_t *values) {
    uint64_t v = mix64(t->seed * 0x100000001B3ull + (uint64_t)t->id);
    for (int k = 0; k < t->ndeps; k++) v = mix64(v ^ values[t->deps[k]] ^ (uint64_t)k);
    return v;
}

static void dag_fn(void *arg, const nb_task_ctx *ctx) {
    dag_task *t = arg;
    jitter(t->seed ^ ((uint64_t)t->id << 20));
    t->values[t->id] = dag_value(t, t->values);
}

static uint64_t rng_next(uint64_t *s) { return mix64(*s += 0x632BE59BD9B4E019ull); }

static void run_dag(uint64_t seed) {
    static dag_task tasks[DAG_MAX];
    static uint64_t values[DAG_MAX], expect[DAG_MAX];
    static nb_mark after[DAG_MAX];
    static int lane_of[DAG_MAX];
    uint64_t r = seed;
    int n = 220 + (int)(rng_next(&r) % 100), nl = 4 + (int)(rng_next(&r) % 3);
    memset(values, 0, sizeof values);
    for (int i = 0; i < n; i++) {
        dag_task *t = &tasks[i];
        *t = (dag_task){.id = i, .seed = seed, .values = values};
        lane_of[i] = (int)(rng_next(&r) % (uint64_t)nl);
        int want = i ? (int)(rng_next(&r) % 4) : 0;
        for (int k = 0; k < want; k++) {
            int window = i < 24 ? i : 24; /* mostly recent tasks: tight chains race more */
            int j = rng_next(&r) % 5 ? i - 1 - (int)(rng_next(&r) % (uint64_t)window)
                                     : (int)(rng_next(&r) % (uint64_t)i);
            int dup = 0;
            for (int q = 0; q < t->ndeps; q++) dup |= t->deps[q] == j;
            if (!dup) t->deps[t->ndeps++] = j;
        }
        expect[i] = dag_value(t, expect); /* serial execution in topological order */
    }

    nb_lanes *L = nb_lanes_create("cpu", 1024);
    nb_lane *lanes[DAG_MAX_LANES];
    for (int x = 0; x < nl; x++) {
        char name[16];
        snprintf(name, sizeof name, "dag%d", x);
        lanes[x] = nb_lane_create(L, name, x % 2 ? NB_LANE_DEVICE : NB_LANE_HOST);
    }
    int host_checks = 0, host_bad = 0;
    for (int i = 0; i < n; i++) {
        nb_lane *x = lanes[lane_of[i]];
        for (int k = 0; k < tasks[i].ndeps; k++) nb_lane_wait(x, after[tasks[i].deps[k]]);
        char name[16];
        snprintf(name, sizeof name, "d%d", i);
        nb_lane_run(x, name, NB_SPAN_OTHER, i, dag_fn, &tasks[i]);
        after[i] = nb_lane_mark(x);
        if (rng_next(&r) % 20 == 0) { /* the host consumes a result mid-stream */
            int j = (int)(rng_next(&r) % (uint64_t)(i + 1));
            nb_mark_wait_host(after[j]);
            host_checks++;
            host_bad += values[j] != expect[j];
        }
    }
    nb_lanes_sync(L);
    int bad = 0;
    for (int i = 0; i < n; i++) bad += values[i] != expect[i];
    CHECK(bad == 0 && host_bad == 0, "seed %llu: %d of %d values differ from serial, %d of %d host "
          "checks", (unsigned long long)seed, bad, n, host_bad, host_checks);

    /* Timestamps must agree: every task starts after each dependency ended. */
    const nb_span *sp;
    size_t ns = nb_lanes_spans(L, &sp);
    static double t0[DAG_MAX], t1[DAG_MAX];
    int lane_bad = 0, time_bad = 0;
    for (size_t s = 0; s < ns; s++) {
        int id = atoi(sp[s].name + 1);
        t0[id] = sp[s].t0;
        t1[id] = sp[s].t1;
        lane_bad += sp[s].lane != lane_of[id] || sp[s].step != id;
    }
    for (int i = 0; i < n; i++)
        for (int k = 0; k < tasks[i].ndeps; k++) time_bad += t0[i] < t1[tasks[i].deps[k]];
    CHECK(ns == (size_t)n && lane_bad == 0 && time_bad == 0, "spans %zu of %d, lane/step wrong %d, "
          "started before a dependency ended %d", ns, n, lane_bad, time_bad);
    nb_lanes_destroy(L);
}

TEST_CASE(test_random_dags) {
    for (uint64_t seed = 1; seed <= 6; seed++) run_dag(seed * 7919);
}

/* ---- 4. trace ---- */

typedef struct {
    int lane_seen;
} trace_arg;

static void trace_task(void *arg, const nb_task_ctx *ctx) {
    ((trace_arg *)arg)->lane_seen = nb_lane_index(ctx->lane);
    TASK_CHECK(ctx->stream == NULL);
    sleep_us(200);
}

static void noop_task(void *arg, const nb_task_ctx *ctx) {}

TEST_CASE(test_trace_spans) {
    atomic_store(&task_failures, 0);
    enum { N = 24 };
    static trace_arg args[N];
    nb_lanes *L = nb_lanes_create("cpu", 100);
    nb_lane *lanes[3];
    for (int x = 0; x < 3; x++) lanes[x] = nb_lane_create(L, x == 0 ? "compute" : "side", NB_LANE_HOST);
    CHECK(nb_lanes_count(L) == 3 && nb_lanes_get(L, 2) == lanes[2] && nb_lane_index(lanes[1]) == 1,
          "lane bookkeeping");
    for (int i = 0; i < N; i++) {
        char name[16];
        snprintf(name, sizeof name, "t%d", i);
        args[i].lane_seen = -1;
        nb_lane_run(lanes[i % 3], name, (nb_span_kind)(i % NB_SPAN_KIND_COUNT), i / 4, trace_task,
                    &args[i]);
        memset(name, 'x', sizeof name - 1); /* the span must hold its own copy */
    }
    char longname[64];
    memset(longname, 'a', 63);
    longname[63] = '\0';
    nb_lane_run(lanes[0], longname, NB_SPAN_OTHER, 99, noop_task, NULL);
    char utf8[64] = "";
    for (int k = 0; k < 30; k++) strcat(utf8, "\xc3\xa9"); /* 60 bytes of 'é' */
    nb_lane_run(lanes[1], utf8, NB_SPAN_OTHER, 99, noop_task, NULL);
    nb_lanes_sync(L);

    const nb_span *sp;
    size_t ns = nb_lanes_spans(L, &sp);
    CHECK(ns == N + 2 && nb_lanes_spans_dropped(L) == 0, "spans %zu", ns);
    int bad = 0, sorted = 1;
    for (size_t s = 0; s < ns; s++) {
        sorted &= s == 0 || sp[s - 1].t0 <= sp[s].t0;
        if (sp[s].step == 99) continue;
        int i = atoi(sp[s].name + 1);
        bad += sp[s].name[0] != 't' || i < 0 || i >= N || sp[s].t1 < sp[s].t0 ||
               sp[s].t1 - sp[s].t0 < 150e-6 || sp[s].lane != i % 3 || args[i].lane_seen != i % 3 ||
               sp[s].kind != (nb_span_kind)(i % NB_SPAN_KIND_COUNT) || sp[s].step != i / 4;
    }
    CHECK(bad == 0 && sorted, "%d spans wrong, sorted %d", bad, sorted);
    for (size_t s = 0; s < ns; s++) {
        if (sp[s].step != 99) continue;
        if (sp[s].lane == 0) CHECK(strlen(sp[s].name) == 39, "long name kept %zu bytes", strlen(sp[s].name));
        if (sp[s].lane == 1) CHECK(strlen(sp[s].name) == 38 && memcmp(sp[s].name, utf8, 38) == 0,
                                   "utf-8 name cut to %zu bytes", strlen(sp[s].name));
    }
    CHECK(atomic_load(&task_failures) == 0, "task checks failed");
    CHECK(strcmp(nb_span_kind_name(NB_SPAN_H2D), "h2d") == 0 &&
          strcmp(nb_span_kind_name(NB_SPAN_OPTIM), "optim") == 0, "kind names");
    nb_lanes_destroy(L);

    /* A full buffer drops and counts; clear empties it; capacity 0 records nothing. */
    L = nb_lanes_create("cpu", 5);
    nb_lane *a = nb_lane_create(L, "a", NB_LANE_HOST);
    for (int i = 0; i < 8; i++) nb_lane_run(a, "n", NB_SPAN_OTHER, 0, noop_task, NULL);
    nb_lanes_sync(L);
    CHECK(nb_lanes_spans(L, &sp) == 5 && nb_lanes_spans_dropped(L) == 3, "capacity 5 of 8");
    nb_lanes_trace_clear(L);
    CHECK(nb_lanes_spans(L, &sp) == 0 && nb_lanes_spans_dropped(L) == 0, "clear");
    for (int i = 0; i < 2; i++) nb_lane_run(a, "n", NB_SPAN_OTHER, 0, noop_task, NULL);
    nb_lanes_sync(L);
    CHECK(nb_lanes_spans(L, &sp) == 2, "after clear");
    nb_lanes_destroy(L);
    L = nb_lanes_create("cpu", 0);
    a = nb_lane_create(L, "a", NB_LANE_HOST);
    nb_lane_run(a, "n", NB_SPAN_OTHER, 0, noop_task, NULL);
    nb_lanes_sync(L);
    CHECK(nb_lanes_spans(L, &sp) == 0 && nb_lanes_spans_dropped(L) == 0, "tracing off");
    nb_lanes_destroy(L);
}

static int near(double a, double b) { return fabs(a - b) < 1e-9; }

TEST_CASE(test_step_stats) {
    nb_lanes *L = nb_lanes_create("cpu", 64);
    for (int x = 0; x < 3; x++) nb_lane_create(L, "s", NB_LANE_HOST);
    /* Window [100, 110] (offset so clipping at 0 would be wrong). Step 1:
     *   lane 0: [101,103] [102,104] [106,108]   -> union [101,104] [106,108], busy 5
     *   lane 1: [103,107]                        -> busy 4
     *   lane 2: [98,100.5] [103.5,103.75] [109,112] -> clipped busy 0.5 + 0.25 + 1 = 1.75
     * >= 2 lanes busy: [103,104] and [106,107] = 2 (the triple overlap inside [103,104] counts
     * once). Step 2 adds lane 0: [104,106], which joins lane 0's spans for "all steps":
     *   lane 0 busy [101,108] = 7; overlap [103,107] = 4. */
    double sp[][4] = {{0, 1, 101, 103}, {0, 1, 102, 104}, {0, 1, 106, 108}, {1, 1, 103, 107},
                      {2, 1, 98, 100.5}, {2, 1, 103.5, 103.75}, {2, 1, 109, 112}, {0, 2, 104, 106}};
    for (size_t i = 0; i < sizeof sp / sizeof sp[0]; i++)
        nb_lanes_record_span(L, "syn", (int)sp[i][0], NB_SPAN_FWD, (int)sp[i][1], sp[i][2], sp[i][3]);
    nb_step_stats s = nb_lanes_step_stats(L, 1, 0, 100, 110);
    CHECK(near(s.window_s, 10) && near(s.busy_s, 5) && near(s.bubble_pct, 50) &&
          near(s.overlap_pct, 20), "lane 0 step 1: busy %g bubble %g overlap %g", s.busy_s,
          s.bubble_pct, s.overlap_pct);
    s = nb_lanes_step_stats(L, 1, 1, 100, 110);
    CHECK(near(s.busy_s, 4) && near(s.bubble_pct, 60) && near(s.overlap_pct, 20), "lane 1 step 1");
    s = nb_lanes_step_stats(L, 1, 2, 100, 110);
    CHECK(near(s.busy_s, 1.75) && near(s.bubble_pct, 82.5), "lane 2 step 1: busy %g", s.busy_s);
    s = nb_lanes_step_stats(L, -1, 0, 100, 110);
    CHECK(near(s.busy_s, 7) && near(s.bubble_pct, 30) && near(s.overlap_pct, 40),
          "lane 0 all steps: busy %g overlap %g", s.busy_s, s.overlap_pct);
    s = nb_lanes_step_stats(L, 2, 0, 100, 110);
    CHECK(near(s.busy_s, 2) && near(s.overlap_pct, 0), "lane 0 step 2");
    s = nb_lanes_step_stats(L, 7, 0, 100, 110);
    CHECK(near(s.busy_s, 0) && near(s.bubble_pct, 100) && near(s.overlap_pct, 0), "empty step");
    s = nb_lanes_step_stats(L, 1, 0, 103, 103);
    CHECK(s.window_s == 0 && s.bubble_pct == 0, "empty window");
    nb_lanes_destroy(L);
}

static size_t count_str(const char *hay, const char *needle) {
    size_t n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p++) n++;
    return n;
}

TEST_CASE(test_chrome_trace) {
    char dir[] = "/tmp/nb_lanes_test_XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    char path[128], tmp[140];
    snprintf(path, sizeof path, "%s/trace.json", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);

    nb_lanes *L = nb_lanes_create("cpu", 64);
    nb_lane *c = nb_lane_create(L, "compute", NB_LANE_DEVICE);
    nb_lane *s = nb_lane_create(L, "side \"q\"\\", NB_LANE_HOST);
    for (int i = 0; i < 6; i++) {
        nb_lane_run(c, i == 2 ? "fwd \"x\"\n\t" : "fwd", NB_SPAN_FWD, i, spin_task, (void *)(uintptr_t)i);
        nb_lane_wait(s, nb_lane_mark(c));
        nb_lane_run(s, "bwd\\", NB_SPAN_BWD, i, spin_task, (void *)(uintptr_t)(i + 100));
    }
    nb_lanes_sync(L);
    const nb_span *sp;
    size_t ns = nb_lanes_spans(L, &sp);
    nb_lanes_write_chrome_trace(L, path, NULL);
    nb_lanes_destroy(L);

    FILE *f = fopen(path, "r");
    CHECK(f != NULL, "trace not written");
    if (!f) return;
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    CHECK(strncmp(buf, "{\"traceEvents\":[", 16) == 0, "begins: %.20s", buf);
    CHECK(n > 4 && strcmp(buf + n - 4, "\n]}\n") == 0, "ends: %s", buf + (n > 8 ? n - 8 : 0));
    CHECK(count_str(buf, "\"ph\":\"X\"") == ns && ns == 12, "X events %zu, spans %zu",
          count_str(buf, "\"ph\":\"X\""), ns);
    CHECK(count_str(buf, "\"ph\":\"M\"") == 3, "metadata events %zu", count_str(buf, "\"ph\":\"M\""));
    CHECK(strstr(buf, "\"side \\\"q\\\"\\\\\"") && strstr(buf, "\"fwd \\\"x\\\"\\u000a\\u0009\"") &&
          strstr(buf, "\"cat\":\"bwd\"") && strstr(buf, "\"ts\":0.000,"), "escaping / fields");
    CHECK(access(tmp, F_OK) != 0, "temp file left behind");

    /* Full JSON validation when python3 is around (it is optional for the test suite). */
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "python3 -c \"import json,sys; d=json.load(open(sys.argv[1])); "
             "x=[e for e in d['traceEvents'] if e['ph']=='X']; "
             "assert len(x)==12 and min(e['ts'] for e in x)==0 and all(e['dur']>=0 for e in x); "
             "assert {e['tid'] for e in x}=={0,1}; "
             "m=[e['args']['name'] for e in d['traceEvents'] if e['name']=='thread_name']; "
             "assert m==['compute','side \\\"q\\\"\\\\\\\\'], m\" %s 2>&1",
             path);
    if (system("command -v python3 >/dev/null 2>&1") == 0) {
        int rc = system(cmd);
        CHECK(rc == 0, "python3 json validation failed (%d)", rc);
    }
    remove(path);
    rmdir(dir);
}

/* ---- 5. marks, sync, create/destroy ---- */

static atomic_int gate, ran;
static void gated_task(void *arg, const nb_task_ctx *ctx) {
    while (!atomic_load(&gate)) sleep_us(500);
}
static void count_task(void *arg, const nb_task_ctx *ctx) {
    jitter((uint64_t)(uintptr_t)arg);
    atomic_fetch_add(&ran, 1);
}

TEST_CASE(test_marks) {
    atomic_store(&gate, 0);
    atomic_store(&ran, 0);
    nb_lanes *L = nb_lanes_create("cpu", 0);
    nb_lane *a = nb_lane_create(L, "a", NB_LANE_HOST), *b = nb_lane_create(L, "b", NB_LANE_HOST);
    nb_mark m0 = nb_lane_mark(a);
    nb_lane_run(a, "gate", NB_SPAN_OTHER, 0, gated_task, NULL);
    nb_mark m1 = nb_lane_mark(a);
    nb_lane_wait(b, m1);
    nb_lane_run(b, "after", NB_SPAN_OTHER, 0, count_task, NULL);
    nb_mark m2 = nb_lane_mark(b);
    nb_mark none = {0};
    CHECK(nb_mark_reached(m0) && nb_mark_reached(none), "empty marks are reached");
    nb_mark_wait_host(m0);
    nb_mark_wait_host(none);
    double t = nb_now();
    int r1 = nb_mark_reached(m1), r2 = nb_mark_reached(m2);
    t = nb_now() - t;
    CHECK(!r1 && !r2 && t < 0.05, "reached %d %d while gated, took %.3f s", r1, r2, t);
    sleep_us(30000);
    CHECK(atomic_load(&ran) == 0 && !nb_mark_reached(m2), "b ran before a's mark");
    atomic_store(&gate, 1);
    nb_mark_wait_host(m2);
    CHECK(nb_mark_reached(m1) && nb_mark_reached(m2) && atomic_load(&ran) == 1, "after gate");
    nb_lanes_destroy(L);
}

/* A task that enqueues the next link of a chain on the next lane: sync must wait for work that
 * did not exist when it was called. */
typedef struct {
    nb_lanes *L;
    int left;
} chain_arg;
static chain_arg chain[64];
static void chain_task(void *arg, const nb_task_ctx *ctx) {
    chain_arg *c = arg;
    sleep_us(300);
    atomic_fetch_add(&ran, 1);
    if (c->left == 0) return;
    chain_arg *next = c + 1;
    *next = (chain_arg){c->L, c->left - 1};
    nb_lane *to = nb_lanes_get(c->L, (nb_lane_index(ctx->lane) + 1) % nb_lanes_count(c->L));
    nb_lane_run(to, "chain", NB_SPAN_OTHER, 0, chain_task, next);
}

TEST_CASE(test_sync) {
    atomic_store(&ran, 0);
    nb_lanes *L = nb_lanes_create("cpu", 0);
    nb_lane *lanes[4];
    for (int x = 0; x < 4; x++) lanes[x] = nb_lane_create(L, "w", NB_LANE_HOST);
    nb_mark last[4];
    for (int i = 0; i < 200; i++) {
        nb_lane_run(lanes[i % 4], "c", NB_SPAN_OTHER, 0, count_task, (void *)(uintptr_t)i);
        last[i % 4] = nb_lane_mark(lanes[i % 4]);
    }
    nb_lanes_sync(L);
    int reached = 1;
    for (int x = 0; x < 4; x++) reached &= nb_mark_reached(last[x]);
    CHECK(atomic_load(&ran) == 200 && reached, "after sync: ran %d", atomic_load(&ran));

    atomic_store(&ran, 0);
    chain[0] = (chain_arg){L, 20};
    nb_lane_run(lanes[0], "chain", NB_SPAN_OTHER, 0, chain_task, &chain[0]);
    nb_lanes_sync(L);
    CHECK(atomic_load(&ran) == 21, "chain ran %d of 21 links before sync returned", atomic_load(&ran));
    nb_lanes_sync(L); /* idle: returns at once */
    nb_lanes_destroy(L);
}

TEST_CASE(test_create_destroy_many) {
    int before = count_threads();
    atomic_store(&ran, 0);
    for (int it = 0; it < 100; it++) {
        nb_lanes *L = nb_lanes_create("cpu", it % 2 ? 16 : 0);
        nb_lane *lanes[4];
        for (int x = 0; x < 4; x++) lanes[x] = nb_lane_create(L, "t", NB_LANE_HOST);
        for (int i = 0; i < 8; i++) {
            if (i) nb_lane_wait(lanes[i % 4], nb_lane_mark(lanes[(i - 1) % 4]));
            nb_lane_run(lanes[i % 4], "c", NB_SPAN_OTHER, 0, count_task, (void *)(uintptr_t)(it * 8 + i));
        }
        nb_lanes_destroy(L); /* drains without an explicit sync */
    }
    CHECK(atomic_load(&ran) == 800, "ran %d of 800 before destroy returned", atomic_load(&ran));
    int after = count_threads();
    CHECK(before > 0 && after == before, "threads before %d after %d", before, after);
}

int main(void) {
    RUN(test_backends_and_timeout); /* first: forks, best done with no lane threads alive */
    RUN(test_ordering);
    RUN(test_fifo);
    RUN(test_random_dags);
    RUN(test_trace_spans);
    RUN(test_step_stats);
    RUN(test_chrome_trace);
    RUN(test_marks);
    RUN(test_sync);
    RUN(test_create_destroy_many);
    TEST_EXIT();
}
