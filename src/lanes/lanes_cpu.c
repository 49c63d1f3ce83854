/* Lanes on the CPU: every lane is a worker thread draining a FIFO of entries. An entry is a task
 * (run it, then count it as completed) or a wait (block until another lane's completed count
 * reaches a mark's seq). A mark is just (lane, seq): reached once lane->completed >= seq, so
 * marks cost no allocation and can be copied freely.
 *
 * Locks: each lane's mutex guards its queue and counters; L->mu guards the runtime's count of
 * entries in flight (for nb_lanes_sync). No code path holds two of them at once, so no lock
 * order can deadlock. Blocking waits sleep on condition variables; nothing spins.
 *
 * With backend "cuda", DEVICE lanes go through the device table (lanes_internal.h); HOST lanes
 * are threads here in both backends.
 *
 * Graphs (nb_lanes_capture_*, nb_graph_*): this file checks the capture rules of lanes.h for both
 * backends, so a schedule that breaks one fails on the CPU too. On the CPU backend a capture
 * records the device lanes' tasks and waits; a replay re-enqueues them on hidden replay lanes
 * (one thread per captured lane, owned by the graph), forked from and joined back into the launch
 * lane, so a replay is one task on that lane exactly as a CUDA graph launch is. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* pthread_condattr_setclock, clock_gettime */
#endif
#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core.h"
#include "lanes/lanes_internal.h"

#define NB_LANES_MAX 64
#define NB_LANE_RING_MIN 64

typedef enum { ENTRY_TASK, ENTRY_WAIT } entry_type;

typedef struct {
    entry_type type;
    bool quiet; /* a replay's fork/join point: completes like a task, records no span */
    nb_task_fn fn;
    void *arg;
    char name[sizeof(((nb_span *)0)->name)];
    nb_span_kind kind;
    int step;
    nb_lane *as;  /* the lane the task was enqueued on (ctx and span), if not this one */
    nb_mark mark; /* ENTRY_WAIT only */
} lane_entry;

struct nb_lane {
    nb_lanes *L;
    int index;
    nb_lane_kind kind;
    char name[40];
    void *device; /* device backend's per-lane state */
    bool threaded;
    bool hidden; /* a graph's replay lane: not in L->lanes, spans carry the captured lane's index */
    pthread_t thread;

    pthread_mutex_t mu;
    pthread_cond_t cv_work; /* worker sleeps here: queue empty */
    pthread_cond_t cv_done; /* waiters sleep here: completed has not reached their mark */
    lane_entry *ring;       /* growable ring, so nb_lane_run never blocks on the worker */
    size_t cap, head, len;
    uint64_t enqueued;  /* tasks ever enqueued: the seq of a mark taken now */
    uint64_t completed; /* tasks ever finished */
    int waiters;        /* threads sleeping on cv_done; completion only broadcasts if > 0 */
    bool shutdown;
    lane_entry current; /* what the worker is doing (for the timeout report) */
    bool busy;
};

struct nb_lanes {
    const nb_lanes_device_i *dev; /* NULL: every lane is a thread */
    void *dev_state;
    const void *backend; /* nb_lanes_bind: handed to every task in its ctx */
    void (*thread_start)(void *); /* nb_lanes_set_thread_start */
    void *thread_start_arg;
    nb_lane *lanes[NB_LANES_MAX];
    atomic_int count;
    pthread_mutex_t mu;
    pthread_cond_t cv_idle;
    size_t inflight;  /* entries enqueued on thread lanes and not yet finished */
    double timeout_s; /* NB_LANES_TIMEOUT: 0 = wait forever */
    nb_trace trace;
    _Atomic(nb_graph *) capture; /* the capture in progress, if any */
    atomic_int graphs;           /* graphs not yet destroyed */
    uint64_t capture_ids;        /* under mu; ids start at 1 */
};

/* One captured operation (CPU backend). */
typedef struct {
    entry_type type;
    int lane; /* index of the lane it was enqueued on */
    nb_task_fn fn;
    void *arg;
    char name[sizeof(((nb_span *)0)->name)];
    nb_span_kind kind;
    int target;   /* ENTRY_WAIT: the lane waited on ... */
    uint64_t pos; /* ... and how many of its captured tasks */
} cap_entry;

struct nb_graph {
    nb_lanes *L;
    uint64_t id;
    pthread_t owner; /* the capturing thread */
    void *dev;       /* the device backend's graph */
    pthread_mutex_t mu; /* guards the recording while capturing; serializes launches */
    /* CPU backend: */
    cap_entry *entries;
    size_t n, cap;
    uint64_t tasks[NB_LANES_MAX];  /* tasks captured per lane: the seq of a capture mark */
    nb_lane *replay[NB_LANES_MAX]; /* hidden lane replaying lane i's tasks (NULL: none) */
    nb_mark last_end;              /* on the launch lane, after the latest replay */
};

/* ---- pthread calls: failures here mean corrupted state, i.e. a bug ---- */

static void lock(pthread_mutex_t *m) { NB_ASSERT(pthread_mutex_lock(m) == 0); }
static void unlock(pthread_mutex_t *m) { NB_ASSERT(pthread_mutex_unlock(m) == 0); }

/* Condition variables on CLOCK_MONOTONIC, so a timed wait is immune to wall-clock jumps. */
static void cond_init(pthread_cond_t *cv) {
    pthread_condattr_t a;
    NB_ASSERT(pthread_condattr_init(&a) == 0);
    NB_ASSERT(pthread_condattr_setclock(&a, CLOCK_MONOTONIC) == 0);
    NB_ASSERT(pthread_cond_init(cv, &a) == 0);
    NB_ASSERT(pthread_condattr_destroy(&a) == 0);
}

static struct timespec deadline_after(double seconds) {
    struct timespec ts;
    NB_ASSERT(clock_gettime(CLOCK_MONOTONIC, &ts) == 0);
    double whole = (double)(long long)seconds;
    ts.tv_sec += (time_t)whole;
    ts.tv_nsec += (long)((seconds - whole) * 1e9);
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec += 1;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

/* Sleep on cv; returns false if the deadline (when given) passed instead. */
static bool cond_wait(pthread_cond_t *cv, pthread_mutex_t *mu, const struct timespec *deadline) {
    if (!deadline) {
        NB_ASSERT(pthread_cond_wait(cv, mu) == 0);
        return true;
    }
    int rc = pthread_cond_timedwait(cv, mu, deadline);
    NB_ASSERT(rc == 0 || rc == ETIMEDOUT);
    return rc == 0;
}

static bool is_device(const nb_lane *lane) {
    return lane->L->dev != NULL && lane->kind == NB_LANE_DEVICE;
}

/* ---- in-flight accounting for nb_lanes_sync ---- */

static void inflight_add(nb_lanes *L) {
    lock(&L->mu);
    L->inflight++;
    unlock(&L->mu);
}

static void inflight_done(nb_lanes *L) {
    lock(&L->mu);
    NB_ASSERT(L->inflight > 0);
    if (--L->inflight == 0) NB_ASSERT(pthread_cond_broadcast(&L->cv_idle) == 0);
    unlock(&L->mu);
}

/* ---- waiting on marks ---- */

/* The timeout report: what every thread lane has finished and is doing now. */
static void dump_lanes(nb_lanes *L) {
    int n = atomic_load(&L->count);
    for (int i = 0; i < n; i++) {
        nb_lane *l = L->lanes[i];
        if (!l || !l->threaded) continue;
        lock(&l->mu);
        lane_entry e = l->current;
        bool busy = l->busy;
        fprintf(stderr, "  lane '%s': %llu of %llu tasks finished, %zu queued; now %s", l->name,
                (unsigned long long)l->completed, (unsigned long long)l->enqueued, l->len,
                !busy ? "idle" : e.type == ENTRY_TASK ? "running " : "waiting on lane ");
        if (busy && e.type == ENTRY_TASK) fprintf(stderr, "'%s' (step %d)", e.name, e.step);
        if (busy && e.type == ENTRY_WAIT)
            fprintf(stderr, "'%s' mark %llu", e.mark.lane->name, (unsigned long long)e.mark.seq);
        fputc('\n', stderr);
        unlock(&l->mu);
    }
}

/* Block until target->completed >= seq. `who` names the waiter for the timeout message. */
static void wait_reached(nb_lane *target, uint64_t seq, const char *who) {
    nb_lanes *L = target->L;
    struct timespec dl;
    if (L->timeout_s > 0) dl = deadline_after(L->timeout_s);
    bool timed_out = false;
    lock(&target->mu);
    target->waiters++;
    while (target->completed < seq && !timed_out)
        timed_out = !cond_wait(&target->cv_done, &target->mu, L->timeout_s > 0 ? &dl : NULL);
    target->waiters--;
    timed_out = target->completed < seq;
    uint64_t done = target->completed, enq = target->enqueued;
    unlock(&target->mu);
    if (timed_out) {
        dump_lanes(L);
        nb_fail("a task never finishes, or a schedule waits on a mark that is never reached: look "
                "for a task blocking on work queued after it (unset NB_LANES_TIMEOUT to wait forever)",
                "%s waited %.3g s for lane '%s' to reach mark %llu; it has finished %llu of the "
                "%llu tasks enqueued on it",
                who, L->timeout_s, target->name, (unsigned long long)seq,
                (unsigned long long)done, (unsigned long long)enq);
    }
}

/* A mark names tasks already enqueued; anything else is a forged or stale mark. */
static void check_mark(nb_lane *lane, nb_mark m) {
    NB_ASSERT(m.lane->L == lane->L);
    if (is_device(m.lane)) return;
    lock(&m.lane->mu);
    uint64_t enq = m.lane->enqueued;
    unlock(&m.lane->mu);
    NB_ASSERT(m.seq <= enq);
}

/* Marks taken during a capture (lanes.h): on the CPU backend their event field holds the
 * capture's id, which is never reused, so a mark from an ended capture is always recognized. */
static int mark_class(nb_mark m) {
    if (!m.lane || m.lane->kind != NB_LANE_DEVICE) return NB_MARK_PLAIN;
    if (is_device(m.lane)) return m.lane->L->dev->mark_class(m);
    if (!m.event) return NB_MARK_PLAIN;
    nb_graph *g = atomic_load(&m.lane->L->capture);
    return g && (uint64_t)(uintptr_t)m.event == g->id ? NB_MARK_IN_CAPTURE : NB_MARK_STALE;
}

#define NB_HINT_STALE_MARK                                                                         \
    "a mark taken inside a capture only orders work inside it; after nb_graph_launch, wait on "    \
    "nb_lane_mark(launch lane)"

/* The host may block on (or poll) a mark only if it is a plain one, and a capturing thread not
 * on a device lane: on CUDA that would synchronize inside the capture and break it. */
static void check_host_wait(nb_mark m, const char *what) {
    int c = mark_class(m);
    NB_CHECK(c != NB_MARK_STALE, NB_HINT_STALE_MARK,
             "%s on a mark of lane '%s' taken inside a capture that has ended", what, m.lane->name);
    NB_CHECK(c != NB_MARK_IN_CAPTURE,
             "wait for a replay with nb_mark_wait_host(nb_lane_mark(on)) after nb_graph_launch",
             "%s on a mark of lane '%s' taken inside the capture in progress: that work has not "
             "been launched", what, m.lane->name);
    nb_graph *g = atomic_load(&m.lane->L->capture);
    NB_CHECK(!(g && m.lane->kind == NB_LANE_DEVICE && pthread_equal(g->owner, pthread_self())),
             "wait for device work before nb_lanes_capture_begin or after nb_lanes_capture_end",
             "%s on device lane '%s' from the thread that is capturing a graph", what,
             m.lane->name);
}

static int reached(nb_mark m) {
    if (is_device(m.lane)) return m.lane->L->dev->reached(m);
    lock(&m.lane->mu);
    int r = m.lane->completed >= m.seq;
    unlock(&m.lane->mu);
    return r;
}

int nb_mark_reached(nb_mark m) {
    if (!m.lane) return 1; /* the null mark {0}: nothing to wait for */
    check_host_wait(m, "nb_mark_reached");
    return reached(m);
}

void nb_mark_wait_host(nb_mark m) {
    if (!m.lane) return;
    check_host_wait(m, "nb_mark_wait_host");
    if (is_device(m.lane)) {
        m.lane->L->dev->wait_host(m);
        return;
    }
    wait_reached(m.lane, m.seq, "the host thread");
}

/* ---- the worker ---- */

static void run_task(nb_lane *lane, const lane_entry *e) {
    nb_task_ctx ctx = {.lane = e->as ? e->as : lane, .stream = NULL, .backend = lane->L->backend};
    double t0 = nb_now();
    e->fn(e->arg, &ctx);
    double t1 = nb_now();
    if (lane->L->trace.capacity == 0 || e->quiet) return;
    nb_span s;
    memcpy(s.name, e->name, sizeof s.name);
    s.lane = ctx.lane->index;
    s.step = e->step;
    s.kind = e->kind;
    s.t0 = t0;
    s.t1 = t1;
    nb_trace_record(&lane->L->trace, &s);
}

static void run_wait(nb_lane *lane, nb_mark m) {
    if (is_device(m.lane)) {
        m.lane->L->dev->wait_host(m);
        return;
    }
    char who[64];
    snprintf(who, sizeof who, "lane '%s'", lane->name);
    wait_reached(m.lane, m.seq, who);
}

static void *lane_main(void *p) {
    nb_lane *lane = p;
    if (lane->L->thread_start) lane->L->thread_start(lane->L->thread_start_arg);
    for (;;) {
        lock(&lane->mu);
        while (lane->len == 0 && !lane->shutdown) cond_wait(&lane->cv_work, &lane->mu, NULL);
        if (lane->len == 0) { /* shutdown with an empty queue */
            unlock(&lane->mu);
            return NULL;
        }
        lane_entry e = lane->ring[lane->head];
        lane->head = (lane->head + 1) % lane->cap;
        lane->len--;
        lane->current = e;
        lane->busy = true;
        unlock(&lane->mu);

        if (e.type == ENTRY_WAIT)
            run_wait(lane, e.mark);
        else
            run_task(lane, &e);

        lock(&lane->mu);
        lane->busy = false;
        if (e.type == ENTRY_TASK) {
            lane->completed++;
            if (lane->waiters > 0) NB_ASSERT(pthread_cond_broadcast(&lane->cv_done) == 0);
        }
        unlock(&lane->mu);
        /* After `completed`, so nb_lanes_sync returning implies every mark is reached. */
        inflight_done(lane->L);
    }
}

/* Append under the lane's lock; grows the ring instead of waiting for room. */
static void push(nb_lane *lane, const lane_entry *e) {
    inflight_add(lane->L); /* before the worker can see (and finish) the entry */
    lock(&lane->mu);
    NB_ASSERT(!lane->shutdown);
    if (lane->len == lane->cap) {
        size_t cap = lane->cap ? 2 * lane->cap : NB_LANE_RING_MIN;
        lane_entry *ring = nb_malloc(cap * sizeof *ring, "a lane's task queue");
        for (size_t i = 0; i < lane->len; i++) ring[i] = lane->ring[(lane->head + i) % lane->cap];
        free(lane->ring);
        lane->ring = ring;
        lane->cap = cap;
        lane->head = 0;
    }
    lane->ring[(lane->head + lane->len) % lane->cap] = *e;
    lane->len++;
    if (e->type == ENTRY_TASK) lane->enqueued++;
    NB_ASSERT(pthread_cond_signal(&lane->cv_work) == 0);
    unlock(&lane->mu);
}

/* ---- public API ---- */

static nb_graph *capturing(const nb_lanes *L) { return atomic_load(&((nb_lanes *)L)->capture); }

/* During a CPU-backend capture, device lanes record instead of run (see the file comment). */
static bool records(const nb_lane *lane, nb_graph **g) {
    if (lane->kind != NB_LANE_DEVICE || lane->L->dev || lane->hidden) return false;
    *g = capturing(lane->L);
    return *g != NULL;
}

static void record(nb_graph *g, const cap_entry *e) {
    lock(&g->mu);
    if (g->n == g->cap) {
        size_t cap = g->cap ? 2 * g->cap : 64;
        cap_entry *grown = nb_malloc(cap * sizeof *grown, "a captured graph");
        if (g->n) memcpy(grown, g->entries, g->n * sizeof *grown);
        free(g->entries);
        g->entries = grown;
        g->cap = cap;
    }
    g->entries[g->n++] = *e;
    if (e->type == ENTRY_TASK) g->tasks[e->lane]++;
    unlock(&g->mu);
}

void nb_lane_run(nb_lane *lane, const char *name, nb_span_kind kind, int step, nb_task_fn fn,
                 void *arg) {
    NB_ASSERT(lane && fn);
    NB_ASSERT((unsigned)kind < NB_SPAN_KIND_COUNT);
    nb_graph *g;
    if (records(lane, &g)) {
        cap_entry c = {.type = ENTRY_TASK, .lane = lane->index, .fn = fn, .arg = arg, .kind = kind};
        nb_span_set_name(c.name, name);
        record(g, &c);
        return;
    }
    if (is_device(lane)) {
        lane->L->dev->run(lane, name, kind, step, fn, arg);
        return;
    }
    lane_entry e = {.type = ENTRY_TASK, .fn = fn, .arg = arg, .kind = kind, .step = step};
    nb_span_set_name(e.name, name);
    push(lane, &e);
}

static void nothing(void *arg, const nb_task_ctx *ctx) { (void)arg, (void)ctx; }

void nb_lane_join(nb_lane *lane, nb_mark m, const char *name) {
    nb_lane_wait(lane, m);
    nb_lane_run(lane, name, NB_SPAN_OTHER, -1, nothing, NULL);
}

nb_mark nb_lane_mark(nb_lane *lane) {
    NB_ASSERT(lane);
    nb_graph *g;
    if (records(lane, &g)) {
        lock(&g->mu);
        nb_mark m = {.lane = lane, .seq = g->tasks[lane->index], .event = (void *)(uintptr_t)g->id};
        unlock(&g->mu);
        return m;
    }
    if (is_device(lane)) return lane->L->dev->mark(lane);
    lock(&lane->mu);
    nb_mark m = {.lane = lane, .seq = lane->enqueued, .event = NULL};
    unlock(&lane->mu);
    return m;
}

/* The capture rules of lanes.h for one wait; returns the mark's class. */
static int check_wait(const nb_lane *lane, nb_mark m) {
    int c = mark_class(m);
    NB_CHECK(c != NB_MARK_STALE, NB_HINT_STALE_MARK,
             "lane '%s' waits on a mark of lane '%s' taken inside a capture that has ended",
             lane->name, m.lane->name);
    bool captured = capturing(lane->L) && lane->kind == NB_LANE_DEVICE;
    NB_CHECK(!captured || c == NB_MARK_IN_CAPTURE,
             "wait before nb_lanes_capture_begin, or order the replay with nb_lane_wait(on, mark) "
             "before nb_graph_launch",
             "inside a capture, device lane '%s' waits on a mark of lane '%s' taken outside it "
             "(a replay could not honour it)", lane->name, m.lane->name);
    NB_CHECK(captured || c == NB_MARK_PLAIN,
             "wait on nb_lane_mark(on) after nb_graph_launch instead",
             "host lane '%s' waits on a mark of lane '%s' taken inside the capture in progress",
             lane->name, m.lane->name);
    return c;
}

void nb_lane_wait(nb_lane *lane, nb_mark m) {
    NB_ASSERT(lane);
    if (!m.lane) return;
    NB_ASSERT(m.lane->L == lane->L);
    if (check_wait(lane, m) == NB_MARK_IN_CAPTURE) {
        nb_graph *g;
        if (records(lane, &g)) {
            if (m.lane == lane) return; /* FIFO within the captured lane */
            cap_entry c = {.type = ENTRY_WAIT, .lane = lane->index, .target = m.lane->index,
                           .pos = m.seq};
            record(g, &c);
        } else {
            lane->L->dev->wait(lane, m);
        }
        return;
    }
    check_mark(lane, m);
    if (is_device(lane)) {
        lane->L->dev->wait(lane, m);
        return;
    }
    /* Own marks are implied by FIFO order; reached marks can never become unreached. A device
     * mark is not polled during a capture: on CUDA the capturing thread must not query events. */
    if (m.lane == lane) return;
    if (!(is_device(m.lane) && capturing(lane->L)) && reached(m)) return;
    lane_entry e = {.type = ENTRY_WAIT, .mark = m};
    push(lane, &e);
}

void nb_lanes_sync(nb_lanes *L) {
    NB_ASSERT(L);
    NB_CHECK(!capturing(L), "call nb_lanes_capture_end first",
             "nb_lanes_sync while a graph is being captured");
    struct timespec dl;
    if (L->timeout_s > 0) dl = deadline_after(L->timeout_s);
    bool timed_out = false;
    lock(&L->mu);
    while (L->inflight > 0 && !timed_out)
        timed_out = !cond_wait(&L->cv_idle, &L->mu, L->timeout_s > 0 ? &dl : NULL);
    timed_out = L->inflight > 0;
    size_t left = L->inflight;
    unlock(&L->mu);
    if (timed_out)
        nb_fail("a task never finishes or a lane waits on a mark that is never reached (unset "
                "NB_LANES_TIMEOUT to wait forever)",
                "nb_lanes_sync waited %.3g s; %zu queued entries have not finished", L->timeout_s,
                left);
    if (L->dev) L->dev->sync(L);
}

static const nb_lanes_device_i *pick_backend(const char *backend) {
    NB_CHECK(backend != NULL, "pass \"cpu\" or \"cuda\"", "no lanes backend given");
    if (strcmp(backend, "cpu") == 0) return NULL;
    if (strcmp(backend, "cuda") == 0) {
#ifdef NB_WITH_CUDA
        return nb_lanes_cuda_device();
#else
        nb_fail("this build has no CUDA; build with nvcc on the PATH or use --device cpu",
                "lanes backend 'cuda' is not available");
#endif
    }
    nb_fail("use --device cpu or --device cuda", "unknown lanes backend '%s'", backend);
}

static double timeout_from_env(void) {
    const char *s = getenv("NB_LANES_TIMEOUT");
    if (!s || !s[0]) return 0;
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    NB_CHECK(errno == 0 && end != s && *end == '\0' && v > 0 && v < 1e9,
             "set NB_LANES_TIMEOUT to a number of seconds, e.g. 30, or unset it",
             "NB_LANES_TIMEOUT='%s' is not a positive number of seconds", s);
    return v;
}

nb_lanes *nb_lanes_create(const char *backend, size_t trace_capacity) {
    const nb_lanes_device_i *dev = pick_backend(backend);
    nb_lanes *L = nb_calloc(1, sizeof *L, "the lanes runtime");
    L->dev = dev;
    atomic_init(&L->count, 0);
    atomic_init(&L->capture, NULL);
    atomic_init(&L->graphs, 0);
    NB_ASSERT(pthread_mutex_init(&L->mu, NULL) == 0);
    cond_init(&L->cv_idle);
    L->timeout_s = timeout_from_env();
    nb_trace_init(&L->trace, trace_capacity);
    if (dev) L->dev_state = dev->create(L);
    return L;
}

/* A lane driven by its own worker thread. */
static nb_lane *thread_lane_new(nb_lanes *L, int index, const char *name, nb_lane_kind kind,
                                bool hidden) {
    nb_lane *lane = nb_calloc(1, sizeof *lane, "a lane");
    lane->L = L;
    lane->index = index;
    lane->kind = kind;
    lane->hidden = hidden;
    snprintf(lane->name, sizeof lane->name, "%s", name);
    NB_ASSERT(pthread_mutex_init(&lane->mu, NULL) == 0);
    cond_init(&lane->cv_work);
    cond_init(&lane->cv_done);
    int rc = pthread_create(&lane->thread, NULL, lane_main, lane);
    if (rc != 0)
        nb_fail("the system is out of threads or memory; use fewer lanes or raise ulimit -u",
                "cannot start the thread of lane '%s': %s", lane->name, strerror(rc));
    lane->threaded = true;
    return lane;
}

/* Drains the lane's queue, then stops its thread and frees it. */
static void thread_lane_free(nb_lane *lane) {
    lock(&lane->mu);
    lane->shutdown = true;
    NB_ASSERT(pthread_cond_signal(&lane->cv_work) == 0);
    unlock(&lane->mu);
    NB_ASSERT(pthread_join(lane->thread, NULL) == 0);
    NB_ASSERT(pthread_cond_destroy(&lane->cv_work) == 0);
    NB_ASSERT(pthread_cond_destroy(&lane->cv_done) == 0);
    NB_ASSERT(pthread_mutex_destroy(&lane->mu) == 0);
    free(lane->ring);
    free(lane);
}

nb_lane *nb_lane_create(nb_lanes *L, const char *name, nb_lane_kind kind) {
    NB_ASSERT(L);
    NB_ASSERT(kind == NB_LANE_HOST || kind == NB_LANE_DEVICE);
    NB_CHECK(!capturing(L), "create every lane before nb_lanes_capture_begin",
             "nb_lane_create while a graph is being captured");
    int idx = atomic_load(&L->count);
    NB_CHECK(idx < NB_LANES_MAX, "use fewer lanes in the schedule",
             "too many lanes (at most %d)", NB_LANES_MAX);
    char label[40];
    if (name && name[0])
        snprintf(label, sizeof label, "%s", name);
    else
        snprintf(label, sizeof label, "lane%d", idx);
    nb_lane *lane;
    if (L->dev && kind == NB_LANE_DEVICE) {
        lane = nb_calloc(1, sizeof *lane, "a lane");
        lane->L = L;
        lane->index = idx;
        lane->kind = kind;
        snprintf(lane->name, sizeof lane->name, "%s", label);
        L->lanes[idx] = lane;
        L->dev->lane_init(L, lane);
    } else {
        lane = thread_lane_new(L, idx, label, kind, false);
        L->lanes[idx] = lane;
    }
    atomic_store(&L->count, idx + 1); /* publish only a fully built lane */
    return lane;
}

void nb_lanes_destroy(nb_lanes *L) {
    if (!L) return;
    NB_CHECK(atomic_load(&L->graphs) == 0, "call nb_graph_destroy on every graph first",
             "nb_lanes_destroy with %d graph(s) not destroyed", atomic_load(&L->graphs));
    nb_lanes_sync(L);
    int n = atomic_load(&L->count);
    for (int i = 0; i < n; i++) {
        nb_lane *lane = L->lanes[i];
        if (lane->threaded) {
            thread_lane_free(lane);
        } else {
            L->dev->lane_fini(L, lane);
            free(lane);
        }
    }
    if (L->dev) L->dev->destroy(L);
    nb_trace_free(&L->trace);
    NB_ASSERT(pthread_cond_destroy(&L->cv_idle) == 0);
    NB_ASSERT(pthread_mutex_destroy(&L->mu) == 0);
    free(L);
}

const char *nb_lane_name(const nb_lane *lane) { return lane->name; }
int nb_lane_index(const nb_lane *lane) { return lane->index; }
int nb_lanes_count(const nb_lanes *L) { return atomic_load(&((nb_lanes *)L)->count); }

nb_lane *nb_lanes_get(nb_lanes *L, int index) {
    NB_ASSERT(L && index >= 0 && index < nb_lanes_count(L));
    return L->lanes[index];
}

/* ---- graphs ---- */

static bool is_launch_lane(const nb_lanes *L, const nb_lane *lane) {
    return lane && lane->L == L && lane->kind == NB_LANE_DEVICE && !lane->hidden;
}

void nb_lanes_capture_begin(nb_lanes *L, nb_lane *origin) {
    NB_ASSERT(L);
    NB_CHECK(is_launch_lane(L, origin), "capture from a device lane of this runtime (e.g. compute)",
             "nb_lanes_capture_begin: lane '%s' is not a device lane of this runtime",
             origin ? origin->name : "(null)");
    NB_CHECK(!capturing(L), "end the capture in progress (nb_lanes_capture_end) first",
             "nb_lanes_capture_begin while another capture is in progress");
    nb_graph *g = nb_calloc(1, sizeof *g, "a graph");
    g->L = L;
    g->owner = pthread_self();
    NB_ASSERT(pthread_mutex_init(&g->mu, NULL) == 0);
    lock(&L->mu);
    g->id = ++L->capture_ids;
    unlock(&L->mu);
    if (L->dev) g->dev = L->dev->capture_begin(L, origin);
    atomic_store(&L->capture, g);
}

nb_graph *nb_lanes_capture_end(nb_lanes *L) {
    NB_ASSERT(L);
    nb_graph *g = capturing(L);
    NB_CHECK(g != NULL, "call nb_lanes_capture_begin first",
             "nb_lanes_capture_end without a capture in progress");
    NB_CHECK(pthread_equal(g->owner, pthread_self()),
             "call nb_lanes_capture_begin and nb_lanes_capture_end from the same thread",
             "nb_lanes_capture_end from another thread than the one that began the capture");
    if (L->dev) {
        L->dev->capture_end(L, g->dev);
    } else {
        for (int i = 0; i < nb_lanes_count(L); i++) {
            if (g->tasks[i] == 0) continue; /* its waits, if any, order nothing on it */
            char name[40];
            snprintf(name, sizeof name, "%.30s/replay", L->lanes[i]->name);
            g->replay[i] = thread_lane_new(L, i, name, NB_LANE_HOST, true);
        }
    }
    atomic_store(&L->capture, NULL);
    atomic_fetch_add(&L->graphs, 1);
    return g;
}

static void noop_task(void *arg, const nb_task_ctx *ctx) {}

/* A fork/join point on `on`: after everything enqueued there before it, waits included. */
static nb_mark push_point(nb_lane *on) {
    lane_entry e = {.type = ENTRY_TASK, .quiet = true, .fn = noop_task};
    push(on, &e);
    return nb_lane_mark(on);
}

static void push_wait(nb_lane *lane, nb_mark m) {
    if (!m.lane || m.lane == lane || reached(m)) return;
    lane_entry e = {.type = ENTRY_WAIT, .mark = m};
    push(lane, &e);
}

static void cpu_launch(nb_graph *g, nb_lane *on, int step) {
    nb_lanes *L = g->L;
    int n = nb_lanes_count(L);
    nb_mark fork = push_point(on);
    uint64_t base[NB_LANES_MAX] = {0};
    for (int i = 0; i < n; i++) {
        nb_lane *r = g->replay[i];
        if (!r) continue;
        push_wait(r, g->last_end); /* replays of one graph run one after another */
        push_wait(r, fork);
        lock(&r->mu);
        base[i] = r->enqueued;
        unlock(&r->mu);
    }
    for (size_t k = 0; k < g->n; k++) {
        const cap_entry *c = &g->entries[k];
        nb_lane *r = g->replay[c->lane];
        if (c->type == ENTRY_TASK) {
            lane_entry e = {.type = ENTRY_TASK, .fn = c->fn, .arg = c->arg, .kind = c->kind,
                            .step = step, .as = L->lanes[c->lane]};
            memcpy(e.name, c->name, sizeof e.name);
            push(r, &e);
        } else if (r && g->replay[c->target]) { /* no tasks on target: the mark is the fork */
            push_wait(r, (nb_mark){.lane = g->replay[c->target], .seq = base[c->target] + c->pos});
        }
    }
    for (int i = 0; i < n; i++)
        if (g->replay[i]) push_wait(on, nb_lane_mark(g->replay[i]));
    g->last_end = push_point(on);
}

void nb_graph_launch(nb_graph *g, nb_lane *on, int step) {
    NB_ASSERT(g);
    NB_CHECK(is_launch_lane(g->L, on), "launch on a device lane of the graph's runtime",
             "nb_graph_launch: lane '%s' is not a device lane of the graph's runtime",
             on ? on->name : "(null)");
    NB_CHECK(!capturing(g->L), "launch graphs outside of a capture (after nb_lanes_capture_end)",
             "nb_graph_launch while a graph is being captured");
    lock(&g->mu);
    if (g->L->dev)
        g->L->dev->graph_launch(g->dev, on, step);
    else
        cpu_launch(g, on, step);
    unlock(&g->mu);
}

void nb_graph_destroy(nb_graph *g) {
    if (!g) return;
    nb_lanes *L = g->L;
    if (L->dev) {
        L->dev->graph_destroy(g->dev);
    } else {
        /* After the last replay's join point no entry refers to the replay lanes any more. */
        if (g->last_end.lane) wait_reached(g->last_end.lane, g->last_end.seq, "nb_graph_destroy");
        for (int i = 0; i < NB_LANES_MAX; i++)
            if (g->replay[i]) thread_lane_free(g->replay[i]);
    }
    free(g->entries);
    NB_ASSERT(pthread_mutex_destroy(&g->mu) == 0);
    atomic_fetch_sub(&L->graphs, 1);
    free(g);
}

/* ---- internal accessors (lanes_internal.h) ---- */

nb_trace *nb_lanes_trace(nb_lanes *L) { return &L->trace; }
void *nb_lanes_device_state(const nb_lanes *L) { return L->dev_state; }
void nb_lanes_bind(nb_lanes *L, const void *backend) { L->backend = backend; }
void nb_lanes_set_thread_start(nb_lanes *L, void (*fn)(void *arg), void *arg) {
    L->thread_start = fn;
    L->thread_start_arg = arg;
}
#ifndef NB_WITH_CUDA
size_t nb_lanes_cuda_events_created(nb_lanes *L) {
    (void)L;
    return 0; /* no CUDA in this build */
}
#endif
const void *nb_lanes_backend(const nb_lanes *L) { return L->backend; }
nb_lanes *nb_lane_owner(const nb_lane *lane) { return lane->L; }
nb_lane_kind nb_lane_get_kind(const nb_lane *lane) { return lane->kind; }
void *nb_lane_device(const nb_lane *lane) { return lane->device; }
void nb_lane_set_device(nb_lane *lane, void *state) { lane->device = state; }
