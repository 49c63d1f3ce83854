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
 * are threads here in both backends. */
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
    nb_task_fn fn;
    void *arg;
    char name[sizeof(((nb_span *)0)->name)];
    nb_span_kind kind;
    int step;
    nb_mark mark; /* ENTRY_WAIT only */
} lane_entry;

struct nb_lane {
    nb_lanes *L;
    int index;
    nb_lane_kind kind;
    char name[40];
    void *device; /* device backend's per-lane state */
    bool threaded;
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
};

struct nb_lanes {
    const nb_lanes_device_i *dev; /* NULL: every lane is a thread */
    nb_lane *lanes[NB_LANES_MAX];
    atomic_int count;
    pthread_mutex_t mu;
    pthread_cond_t cv_idle;
    size_t inflight;  /* entries enqueued on thread lanes and not yet finished */
    double timeout_s; /* NB_LANES_TIMEOUT: 0 = wait forever */
    nb_trace trace;
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
    if (timed_out)
        nb_fail("a task never finishes, or a schedule waits on a mark that is never reached: look "
                "for a task blocking on work queued after it (unset NB_LANES_TIMEOUT to wait forever)",
                "%s waited %.3g s for lane '%s' to reach mark %llu; it has finished %llu of the "
                "%llu tasks enqueued on it",
                who, L->timeout_s, target->name, (unsigned long long)seq,
                (unsigned long long)done, (unsigned long long)enq);
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

int nb_mark_reached(nb_mark m) {
    if (!m.lane) return 1; /* the null mark {0}: nothing to wait for */
    if (is_device(m.lane)) return m.lane->L->dev->reached(m);
    lock(&m.lane->mu);
    int reached = m.lane->completed >= m.seq;
    unlock(&m.lane->mu);
    return reached;
}

void nb_mark_wait_host(nb_mark m) {
    if (!m.lane) return;
    if (is_device(m.lane)) {
        m.lane->L->dev->wait_host(m);
        return;
    }
    wait_reached(m.lane, m.seq, "the host thread");
}

/* ---- the worker ---- */

static void run_task(nb_lane *lane, const lane_entry *e) {
    nb_task_ctx ctx = {.lane = lane, .stream = NULL};
    double t0 = nb_now();
    e->fn(e->arg, &ctx);
    double t1 = nb_now();
    if (lane->L->trace.capacity == 0) return;
    nb_span s;
    memcpy(s.name, e->name, sizeof s.name);
    s.lane = lane->index;
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
        unlock(&lane->mu);

        if (e.type == ENTRY_WAIT)
            run_wait(lane, e.mark);
        else
            run_task(lane, &e);

        if (e.type == ENTRY_TASK) {
            lock(&lane->mu);
            lane->completed++;
            if (lane->waiters > 0) NB_ASSERT(pthread_cond_broadcast(&lane->cv_done) == 0);
            unlock(&lane->mu);
        }
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

void nb_lane_run(nb_lane *lane, const char *name, nb_span_kind kind, int step, nb_task_fn fn,
                 void *arg) {
    NB_ASSERT(lane && fn);
    NB_ASSERT((unsigned)kind < NB_SPAN_KIND_COUNT);
    if (is_device(lane)) {
        lane->L->dev->run(lane, name, kind, step, fn, arg);
        return;
    }
    lane_entry e = {.type = ENTRY_TASK, .fn = fn, .arg = arg, .kind = kind, .step = step};
    nb_span_set_name(e.name, name);
    push(lane, &e);
}

nb_mark nb_lane_mark(nb_lane *lane) {
    NB_ASSERT(lane);
    if (is_device(lane)) return lane->L->dev->mark(lane);
    lock(&lane->mu);
    nb_mark m = {.lane = lane, .seq = lane->enqueued, .event = NULL};
    unlock(&lane->mu);
    return m;
}

void nb_lane_wait(nb_lane *lane, nb_mark m) {
    NB_ASSERT(lane);
    if (!m.lane) return;
    check_mark(lane, m);
    if (is_device(lane)) {
        lane->L->dev->wait(lane, m);
        return;
    }
    /* Own marks are implied by FIFO order; reached marks can never become unreached. */
    if (m.lane == lane || nb_mark_reached(m)) return;
    lane_entry e = {.type = ENTRY_WAIT, .mark = m};
    push(lane, &e);
}

void nb_lanes_sync(nb_lanes *L) {
    NB_ASSERT(L);
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

#ifdef NB_WITH_CUDA
extern const nb_lanes_device_i *nb_lanes_cuda_device(void) __attribute__((weak));
#endif

static const nb_lanes_device_i *pick_backend(const char *backend) {
    NB_CHECK(backend != NULL, "pass \"cpu\" or \"cuda\"", "no lanes backend given");
    if (strcmp(backend, "cpu") == 0) return NULL;
    if (strcmp(backend, "cuda") == 0) {
#ifdef NB_WITH_CUDA
        const nb_lanes_device_i *dev = nb_lanes_cuda_device ? nb_lanes_cuda_device() : NULL;
        NB_CHECK(dev != NULL, "use --device cpu until lanes_cuda.c is part of the build",
                 "this CUDA build has no device lanes linked in (nb_lanes_cuda_device missing)");
        return dev;
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
    NB_ASSERT(pthread_mutex_init(&L->mu, NULL) == 0);
    cond_init(&L->cv_idle);
    L->timeout_s = timeout_from_env();
    nb_trace_init(&L->trace, trace_capacity);
    return L;
}

nb_lane *nb_lane_create(nb_lanes *L, const char *name, nb_lane_kind kind) {
    NB_ASSERT(L);
    NB_ASSERT(kind == NB_LANE_HOST || kind == NB_LANE_DEVICE);
    int idx = atomic_load(&L->count);
    NB_CHECK(idx < NB_LANES_MAX, "use fewer lanes in the schedule",
             "too many lanes (at most %d)", NB_LANES_MAX);
    nb_lane *lane = nb_calloc(1, sizeof *lane, "a lane");
    lane->L = L;
    lane->index = idx;
    lane->kind = kind;
    if (name && name[0])
        snprintf(lane->name, sizeof lane->name, "%s", name);
    else
        snprintf(lane->name, sizeof lane->name, "lane%d", idx);
    L->lanes[idx] = lane;
    if (is_device(lane)) {
        L->dev->lane_init(L, lane);
    } else {
        NB_ASSERT(pthread_mutex_init(&lane->mu, NULL) == 0);
        cond_init(&lane->cv_work);
        cond_init(&lane->cv_done);
        int rc = pthread_create(&lane->thread, NULL, lane_main, lane);
        if (rc != 0)
            nb_fail("the system is out of threads or memory; use fewer lanes or raise ulimit -u",
                    "cannot start the thread of lane '%s': %s", lane->name, strerror(rc));
        lane->threaded = true;
    }
    atomic_store(&L->count, idx + 1); /* publish only a fully built lane */
    return lane;
}

void nb_lanes_destroy(nb_lanes *L) {
    if (!L) return;
    nb_lanes_sync(L);
    int n = atomic_load(&L->count);
    for (int i = 0; i < n; i++) {
        nb_lane *lane = L->lanes[i];
        if (lane->threaded) {
            lock(&lane->mu);
            lane->shutdown = true;
            NB_ASSERT(pthread_cond_signal(&lane->cv_work) == 0);
            unlock(&lane->mu);
            NB_ASSERT(pthread_join(lane->thread, NULL) == 0);
            NB_ASSERT(pthread_cond_destroy(&lane->cv_work) == 0);
            NB_ASSERT(pthread_cond_destroy(&lane->cv_done) == 0);
            NB_ASSERT(pthread_mutex_destroy(&lane->mu) == 0);
            free(lane->ring);
        } else {
            L->dev->lane_fini(L, lane);
        }
        free(lane);
    }
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

/* ---- internal accessors (lanes_internal.h) ---- */

nb_trace *nb_lanes_trace(nb_lanes *L) { return &L->trace; }
nb_lanes *nb_lane_owner(const nb_lane *lane) { return lane->L; }
nb_lane_kind nb_lane_get_kind(const nb_lane *lane) { return lane->kind; }
void *nb_lane_device(const nb_lane *lane) { return lane->device; }
void nb_lane_set_device(nb_lane *lane, void *state) { lane->device = state; }
