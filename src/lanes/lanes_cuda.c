/* Device lanes on CUDA (backend "cuda"): every DEVICE lane is a non-blocking cudaStream_t; HOST
 * lanes stay worker threads (lanes_cpu.c, which also checks every rule of lanes.h before it calls
 * the table at the end of this file).
 *
 * Tasks. nb_lane_run calls fn at once on the enqueuing thread with ctx->stream set; fn launches
 * kernels. A per-lane recursive mutex is held meanwhile, so one task's launches (and its timing
 * events) stay contiguous in the stream even when several threads enqueue on the lane.
 *
 * Marks. A mark's seq counts the lane's stream operations (tasks, waits, graph launches) enqueued
 * before it; its event is a pooled `slot` (cudaEventDisableTiming | cudaEventBlockingSync: host
 * waits sleep instead of spinning, which leaves the cores to host lanes). Slots of a lane are
 * recorded on one stream, so they complete in record order: they wait in a FIFO and a new mark
 * re-records the oldest one once it has completed. Before re-recording a slot, `done` (every op
 * up to it has finished) is raised to the slot's seq; so a mark whose seq <= done is reached
 * without looking at its event, and a mark with seq > done still owns its slot. In steady state
 * no mark creates an event (nb_lanes_cuda_events_created counts them, for the tests). A device
 * lane told to wait on a HOST lane's mark blocks the enqueuing thread until it is reached: CUDA
 * cannot wait for a host thread without a host callback that could stall every other stream.
 *
 * Spans. Each timed task is bracketed by two events from a pool (created with timing). They are
 * turned into nb_now() seconds lazily, when the host learns that work finished (a mark waited on
 * or found reached, a sync, or a lane with many unresolved spans), against an anchor: an event
 * recorded on an otherwise idle stream together with nb_now() read right after enqueueing it
 * (the event executes microseconds later, so GPU spans may read a few microseconds early). A new
 * anchor is taken when the current one is older than NB_ANCHOR_PERIOD_S, and it is chained onto
 * the previous one through their event delta, so all GPU spans share one GPU clock and their order
 * across lanes is exact; an anchor only re-syncs to its own host reading when the chained time has
 * drifted from it by more than NB_ANCHOR_RESYNC_S.
 *
 * Graphs. capture_begin starts a capture (cudaStreamCaptureModeThreadLocal: other threads, e.g.
 * host lanes synchronizing on events, are unaffected) on the origin's stream and makes every other
 * device lane join it by waiting on an event recorded there; capture_end records an event on each
 * of them for the origin to wait on, then ends the capture and instantiates the graph. Marks taken
 * meanwhile use capture-only slots (never mixed with plain ones, so a mark from an ended capture
 * is recognized). Timed tasks record their events with cudaEventRecordExternal, which makes them
 * event-record nodes of the graph; before each launch those nodes are pointed at fresh pool events
 * (cudaGraphExecEventRecordNodeSetEvent), so every replay times every task and replays in flight
 * never overwrite each other's timestamps. */
#ifdef NB_WITH_CUDA
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* PTHREAD_MUTEX_RECURSIVE */
#endif
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core.h"
#include "cuda_check.h"
#include "lanes/lanes_internal.h"

#define NB_ANCHOR_PERIOD_S 1.0
#define NB_ANCHOR_RESYNC_S 200e-6
/* A lane with this many unresolved spans resolves the finished ones as it enqueues. */
#define NB_PENDING_RESOLVE 256

typedef struct slot {
    cudaEvent_t ev;
    uint64_t seq;      /* the lane's op count when it was recorded */
    uint64_t capture;  /* id of the capture it was recorded in; 0 for plain marks */
    int pins;          /* host threads synchronizing on it: not to be re-recorded meanwhile */
    struct slot *next; /* FIFO of recorded plain slots, or a list of capture slots */
    struct slot *all;  /* every slot of the lane, for lane_fini */
} slot;

typedef struct anchor {
    cudaEvent_t ev;
    double measured; /* nb_now() right after ev was enqueued on the idle anchor stream */
    double host;     /* ev's time on the nb_now() timeline, once resolved */
    bool resolved;
    struct anchor *prev; /* until resolved: the anchor it chains onto */
    int refs;            /* unresolved spans + an unresolved successor + being the current one */
    struct anchor *next_free;
    struct anchor *all;
} anchor;

typedef struct {
    char name[sizeof(((nb_span *)0)->name)];
    int lane, step;
    nb_span_kind kind;
    cudaEvent_t e0, e1;
    anchor *a;
} pending;

typedef struct {
    cudaStream_t stream;
    pthread_mutex_t run_mu; /* recursive: a task may enqueue more work on its own lane */
    /* Guarded by the runtime's mu: */
    uint64_t ops;  /* stream operations enqueued: the seq of a mark taken now */
    uint64_t done; /* every op up to here has finished */
    slot *last;    /* recorded at ops == last->seq: reused while nothing new is enqueued */
    slot *fifo_head, *fifo_tail;
    slot *capture_free, *capture_used; /* capture-only slots: idle / recorded in this capture */
    slot *all;
    pending *pend; /* ring of spans whose events have not been turned into times yet */
    size_t pend_head, pend_len, pend_cap;
} dev_lane;

typedef struct {
    char name[sizeof(((nb_span *)0)->name)];
    int lane;
    nb_span_kind kind;
    cudaEvent_t ph0, ph1;   /* the events recorded at capture; replaced before every launch */
    cudaGraphNode_t n0, n1; /* their event-record nodes */
} graph_task;

typedef struct dev_rt dev_rt;

typedef struct {
    dev_rt *rt;
    uint64_t id;
    nb_lane *origin;
    graph_task *tasks;
    size_t ntasks, cap;
    cudaEvent_t *launch_ev; /* 2 per task, scratch for one launch (launches are serialized) */
    cudaGraph_t graph;
    cudaGraphExec_t exec;
} cuda_graph;

struct dev_rt {
    nb_lanes *L;
    int device;
    bool timed;         /* tracing on: tasks are bracketed by timing events */
    pthread_mutex_t mu; /* leaf lock: held only around non-blocking CUDA calls */
    cudaStream_t anchor_stream;
    anchor *cur, *anchors_free, *anchors_all;
    cudaEvent_t *timing; /* idle timing events */
    size_t ntiming, timing_cap;
    size_t events_created;
    cuda_graph *capture; /* the capture in progress */
    uint64_t capture_ids;
};

/* ---- small helpers ---- */

/* Calls made into a capturing stream: once a task broke the capture, the first of them to notice
 * says so with what to change, instead of a bare CUDA error. */
#define NB_CAPTURE_HINT                                                                            \
    "a captured task must only launch work on ctx->stream: no cudaMalloc, cudaMemcpy or "          \
    "synchronization inside a capture, and no other thread enqueueing meanwhile"
#define CAPTURE_CHECK(call)                                                                        \
    do {                                                                                           \
        cudaError_t nb_err_ = (call);                                                              \
        if (nb_err_ != cudaSuccess)                                                                \
            nb_fail_at(__FILE__, __LINE__, NB_CAPTURE_HINT,                                        \
                       "during a CUDA graph capture, %s failed: %s (%s)", #call,                   \
                       cudaGetErrorString(nb_err_), cudaGetErrorName(nb_err_));                    \
    } while (0)

static void lock(pthread_mutex_t *m) { NB_ASSERT(pthread_mutex_lock(m) == 0); }
static void unlock(pthread_mutex_t *m) { NB_ASSERT(pthread_mutex_unlock(m) == 0); }

static dev_rt *rt_of(const nb_lane *lane) { return nb_lanes_device_state(nb_lane_owner(lane)); }
static dev_lane *dl(const nb_lane *lane) { return nb_lane_device(lane); }

/* Host lanes' threads (and any other thread) may call in here: make the runtime's GPU current. */
static void use_device(const dev_rt *rt) {
    int cur = -1;
    CUDA_CHECK(cudaGetDevice(&cur));
    if (cur != rt->device) CUDA_CHECK(cudaSetDevice(rt->device));
}

/* cudaEventQuery's "not ready" is also left as the thread's last error; clear it, or the next
 * CUDA_CHECK_LAUNCH in an op would report it as a launch failure. */
static bool event_done(cudaEvent_t e) {
    cudaError_t q = cudaEventQuery(e);
    if (q == cudaSuccess) return true;
    if (q == cudaErrorNotReady) {
        (void)cudaGetLastError();
        return false;
    }
    CUDA_CHECK_NAMED(q, "cudaEventQuery");
    return false;
}

static cudaEvent_t event_new(dev_rt *rt, unsigned flags) {
    cudaEvent_t e;
    CUDA_CHECK(cudaEventCreateWithFlags(&e, flags));
    rt->events_created++;
    return e;
}

/* ---- timing events and anchors (under rt->mu) ---- */

static cudaEvent_t timing_get(dev_rt *rt) {
    if (rt->ntiming) return rt->timing[--rt->ntiming];
    return event_new(rt, cudaEventDefault);
}

static void timing_put(dev_rt *rt, cudaEvent_t e) {
    if (rt->ntiming == rt->timing_cap) {
        size_t cap = rt->timing_cap ? 2 * rt->timing_cap : 256;
        cudaEvent_t *grown = nb_malloc(cap * sizeof *grown, "the lanes' timing events");
        if (rt->ntiming) memcpy(grown, rt->timing, rt->ntiming * sizeof *grown);
        free(rt->timing);
        rt->timing = grown;
        rt->timing_cap = cap;
    }
    rt->timing[rt->ntiming++] = e;
}

static void anchor_release(dev_rt *rt, anchor *a) {
    NB_ASSERT(a->refs > 0);
    if (--a->refs > 0) return;
    if (a->prev) anchor_release(rt, a->prev);
    a->prev = NULL;
    a->next_free = rt->anchors_free;
    rt->anchors_free = a;
}

/* The anchor for spans enqueued now; the caller takes a reference for each span. */
static anchor *anchor_current(dev_rt *rt) {
    if (rt->cur && nb_now() - rt->cur->measured < NB_ANCHOR_PERIOD_S) return rt->cur;
    anchor *a = rt->anchors_free;
    if (a) {
        rt->anchors_free = a->next_free;
    } else {
        a = nb_calloc(1, sizeof *a, "a lanes timing anchor");
        a->ev = event_new(rt, cudaEventDefault);
        a->all = rt->anchors_all;
        rt->anchors_all = a;
    }
    CUDA_CHECK(cudaEventRecord(a->ev, rt->anchor_stream));
    a->measured = nb_now();
    a->resolved = false;
    a->prev = rt->cur; /* the old current's "current" reference becomes this one's */
    a->refs = 1;
    rt->cur = a;
    return a;
}

/* Gives a its nb_now() time; false if its event (or its predecessor's) has not executed yet. */
static bool anchor_resolve(dev_rt *rt, anchor *a) {
    if (a->resolved) return true;
    if (!event_done(a->ev)) return false;
    a->host = a->measured;
    if (a->prev) {
        if (!anchor_resolve(rt, a->prev)) return false;
        float ms = 0;
        CUDA_CHECK(cudaEventElapsedTime(&ms, a->prev->ev, a->ev));
        double chained = a->prev->host + 1e-3 * ms;
        /* Beyond 10 s a float of milliseconds is coarser than the drift we tolerate. */
        if (ms < 1e4f && fabs(chained - a->measured) < NB_ANCHOR_RESYNC_S) a->host = chained;
        anchor_release(rt, a->prev);
        a->prev = NULL;
    }
    a->resolved = true;
    return true;
}

/* ---- pending spans (under rt->mu) ---- */

static void pending_push(dev_lane *d, const pending *p) {
    if (d->pend_len == d->pend_cap) {
        size_t cap = d->pend_cap ? 2 * d->pend_cap : 64;
        pending *grown = nb_malloc(cap * sizeof *grown, "a lane's pending spans");
        for (size_t i = 0; i < d->pend_len; i++)
            grown[i] = d->pend[(d->pend_head + i) % d->pend_cap];
        free(d->pend);
        d->pend = grown;
        d->pend_cap = cap;
        d->pend_head = 0;
    }
    d->pend[(d->pend_head + d->pend_len) % d->pend_cap] = *p;
    d->pend_len++;
}

static bool span_resolve(dev_rt *rt, const pending *p) {
    if (!event_done(p->e1) || !anchor_resolve(rt, p->a)) return false;
    float m0 = 0, m1 = 0;
    CUDA_CHECK(cudaEventElapsedTime(&m0, p->a->ev, p->e0));
    CUDA_CHECK(cudaEventElapsedTime(&m1, p->a->ev, p->e1));
    nb_lanes_record_span(rt->L, p->name, p->lane, p->kind, p->step, p->a->host + 1e-3 * m0,
                         p->a->host + 1e-3 * m1);
    timing_put(rt, p->e0);
    timing_put(rt, p->e1);
    anchor_release(rt, p->a);
    return true;
}

/* Spans of one lane finish in stream order (a graph's may not: then a later one waits). */
static void resolve_lane(dev_rt *rt, dev_lane *d) {
    while (d->pend_len && span_resolve(rt, &d->pend[d->pend_head])) {
        d->pend_head = (d->pend_head + 1) % d->pend_cap;
        d->pend_len--;
    }
}

static void resolve_all(dev_rt *rt) {
    int n = nb_lanes_count(rt->L);
    for (int i = 0; i < n; i++) {
        nb_lane *lane = nb_lanes_get(rt->L, i);
        if (nb_lane_get_kind(lane) == NB_LANE_DEVICE) resolve_lane(rt, dl(lane));
    }
}

/* ---- runtime and lanes ---- */

static void *cuda_create(nb_lanes *L) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) (void)cudaGetLastError();
    NB_CHECK(
        e == cudaSuccess && n > 0,
        "check that nvidia-smi lists a GPU and CUDA_VISIBLE_DEVICES allows it, or use --device cpu",
        "lanes backend 'cuda': no usable GPU (%s)",
        e == cudaSuccess ? "no CUDA device" : cudaGetErrorString(e));
    dev_rt *rt = nb_calloc(1, sizeof *rt, "the CUDA lanes runtime");
    rt->L = L;
    CUDA_CHECK(cudaGetDevice(&rt->device));
    rt->timed = nb_lanes_trace(L)->capacity > 0;
    NB_ASSERT(pthread_mutex_init(&rt->mu, NULL) == 0);
    CUDA_CHECK(cudaStreamCreateWithFlags(&rt->anchor_stream, cudaStreamNonBlocking));
    return rt;
}

static void cuda_destroy(nb_lanes *L) {
    dev_rt *rt = nb_lanes_device_state(L);
    use_device(rt);
    for (anchor *a = rt->anchors_all, *next; a; a = next) {
        next = a->all;
        CUDA_CHECK(cudaEventDestroy(a->ev));
        free(a);
    }
    for (size_t i = 0; i < rt->ntiming; i++)
        CUDA_CHECK(cudaEventDestroy(rt->timing[i]));
    free(rt->timing);
    CUDA_CHECK(cudaStreamDestroy(rt->anchor_stream));
    NB_ASSERT(pthread_mutex_destroy(&rt->mu) == 0);
    free(rt);
}

static void cuda_lane_init(nb_lanes *L, nb_lane *lane) {
    dev_rt *rt = nb_lanes_device_state(L);
    use_device(rt);
    dev_lane *d = nb_calloc(1, sizeof *d, "a CUDA lane");
    CUDA_CHECK(cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking));
    pthread_mutexattr_t a;
    NB_ASSERT(pthread_mutexattr_init(&a) == 0);
    NB_ASSERT(pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE) == 0);
    NB_ASSERT(pthread_mutex_init(&d->run_mu, &a) == 0);
    NB_ASSERT(pthread_mutexattr_destroy(&a) == 0);
    nb_lane_set_device(lane, d);
}

/* After nb_lanes_sync: the stream is idle and every span resolved. */
static void cuda_lane_fini(nb_lanes *L, nb_lane *lane) {
    dev_rt *rt = nb_lanes_device_state(L);
    dev_lane *d = dl(lane);
    use_device(rt);
    NB_ASSERT(d->pend_len == 0);
    for (slot *s = d->all, *next; s; s = next) {
        next = s->all;
        NB_ASSERT(s->pins == 0);
        CUDA_CHECK(cudaEventDestroy(s->ev));
        free(s);
    }
    CUDA_CHECK(cudaStreamDestroy(d->stream));
    NB_ASSERT(pthread_mutex_destroy(&d->run_mu) == 0);
    free(d->pend);
    free(d);
    nb_lane_set_device(lane, NULL);
}

/* ---- marks (under rt->mu) ---- */

static slot *slot_new(dev_rt *rt, dev_lane *d) {
    slot *s = nb_calloc(1, sizeof *s, "a lane mark");
    s->ev = event_new(rt, cudaEventDisableTiming | cudaEventBlockingSync);
    s->all = d->all;
    d->all = s;
    return s;
}

static void raise_done(dev_lane *d, uint64_t seq) {
    if (d->done < seq) d->done = seq;
}

/* A slot recorded inside the capture in progress, at the lane's current end. */
static slot *capture_slot(dev_rt *rt, dev_lane *d) {
    if (d->last && d->last->capture == rt->capture->id && d->last->seq == d->ops) return d->last;
    slot *s = d->capture_free;
    if (s)
        d->capture_free = s->next;
    else
        s = slot_new(rt, d);
    s->capture = rt->capture->id;
    s->seq = d->ops;
    CAPTURE_CHECK(cudaEventRecord(s->ev, d->stream));
    s->next = d->capture_used;
    d->capture_used = s;
    d->last = s;
    return s;
}

static nb_mark plain_mark(dev_rt *rt, nb_lane *lane, dev_lane *d) {
    nb_mark m = {.lane = lane, .seq = d->ops, .event = NULL};
    if (d->ops <= d->done) return m; /* everything enqueued is known to have finished */
    if (d->last && d->last->seq == d->ops) {
        m.event = d->last;
        return m;
    }
    slot *s = d->fifo_head;
    if (s && s->pins == 0 && event_done(s->ev)) {
        raise_done(d, s->seq); /* before re-recording: marks still naming s now read as reached */
        d->fifo_head = s->next;
        if (!d->fifo_head) d->fifo_tail = NULL;
    } else {
        s = slot_new(rt, d);
    }
    s->seq = d->ops;
    s->capture = 0;
    s->next = NULL;
    CUDA_CHECK(cudaEventRecord(s->ev, d->stream));
    if (d->fifo_tail)
        d->fifo_tail->next = s;
    else
        d->fifo_head = s;
    d->fifo_tail = s;
    d->last = s;
    m.event = s;
    return m;
}

static nb_mark cuda_mark(nb_lane *lane) {
    dev_rt *rt = rt_of(lane);
    dev_lane *d = dl(lane);
    use_device(rt);
    lock(&rt->mu);
    nb_mark m;
    if (rt->capture)
        m = (nb_mark){.lane = lane, .seq = d->ops, .event = capture_slot(rt, d)};
    else
        m = plain_mark(rt, lane, d);
    unlock(&rt->mu);
    return m;
}

static int cuda_mark_class(nb_mark m) {
    if (!m.event) return NB_MARK_PLAIN;
    dev_rt *rt = rt_of(m.lane);
    const slot *s = m.event;
    lock(&rt->mu);
    int c = NB_MARK_PLAIN;
    if (s->capture)
        c = rt->capture && s->capture == rt->capture->id && s->seq == m.seq ? NB_MARK_IN_CAPTURE
                                                                            : NB_MARK_STALE;
    unlock(&rt->mu);
    return c;
}

static void cuda_wait(nb_lane *lane, nb_mark m) {
    if (nb_lane_get_kind(m.lane) == NB_LANE_HOST) {
        nb_mark_wait_host(m); /* see the file comment: the enqueuer waits for the host lane */
        return;
    }
    if (m.lane == lane || !m.event) return;
    dev_rt *rt = rt_of(lane);
    dev_lane *d = dl(lane), *md = dl(m.lane);
    slot *s = m.event;
    use_device(rt);
    lock(&rt->mu);
    /* lanes_cpu.c let a capture slot through only if it belongs to the capture in progress. */
    if (s->capture || m.seq > md->done) {
        NB_ASSERT(s->seq == m.seq);
        if (s->capture)
            CAPTURE_CHECK(cudaStreamWaitEvent(d->stream, s->ev, 0));
        else
            CUDA_CHECK(cudaStreamWaitEvent(d->stream, s->ev, 0));
        d->ops++;
        d->last = NULL;
    }
    unlock(&rt->mu);
}

/* While another thread captures, a host thread polls instead of blocking in the driver: querying
 * events from other threads is what thread-local capture mode is meant to allow, while reports
 * differ on whether a concurrent blocking synchronize on the same GPU invalidates a capture. */
static void event_wait(dev_rt *rt, cudaEvent_t e) {
    for (;;) {
        lock(&rt->mu);
        bool capture = rt->capture != NULL;
        unlock(&rt->mu);
        if (!capture) {
            CUDA_CHECK(cudaEventSynchronize(e));
            return;
        }
        if (event_done(e)) return;
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
    }
}

/* Both host-side checks also turn every finished span into times, so statistics computed after a
 * step's end mark was waited on (or found reached) see all of that step's GPU spans. */
static void cuda_wait_host(nb_mark m) {
    dev_rt *rt = rt_of(m.lane);
    dev_lane *md = dl(m.lane);
    slot *s = m.event;
    use_device(rt);
    lock(&rt->mu);
    if (s && m.seq > md->done) { /* a mark without event was complete when it was taken */
        NB_ASSERT(s->seq == m.seq && s->capture == 0);
        s->pins++; /* keeps s from being re-recorded while we sleep on it unlocked */
        unlock(&rt->mu);
        event_wait(rt, s->ev);
        lock(&rt->mu);
        s->pins--;
        raise_done(md, m.seq);
    }
    if (!rt->capture) resolve_all(rt);
    unlock(&rt->mu);
}

static int cuda_reached(nb_mark m) {
    dev_rt *rt = rt_of(m.lane);
    dev_lane *md = dl(m.lane);
    const slot *s = m.event;
    use_device(rt);
    lock(&rt->mu);
    int r = !s || m.seq <= md->done;
    if (!r) {
        NB_ASSERT(s->seq == m.seq && s->capture == 0);
        r = event_done(s->ev);
        if (r) raise_done(md, m.seq);
    }
    if (r && !rt->capture) resolve_all(rt);
    unlock(&rt->mu);
    return r;
}

/* ---- tasks ---- */

static void graph_add_task(dev_rt *rt, cuda_graph *g, const char *name, int lane, nb_span_kind kind,
                           cudaEvent_t *e0, cudaEvent_t *e1) {
    if (g->ntasks == g->cap) {
        size_t cap = g->cap ? 2 * g->cap : 64;
        graph_task *grown = nb_malloc(cap * sizeof *grown, "a captured graph");
        if (g->ntasks) memcpy(grown, g->tasks, g->ntasks * sizeof *grown);
        free(g->tasks);
        g->tasks = grown;
        g->cap = cap;
    }
    graph_task *t = &g->tasks[g->ntasks++];
    memset(t, 0, sizeof *t);
    nb_span_set_name(t->name, name);
    t->lane = lane;
    t->kind = kind;
    t->ph0 = *e0 = event_new(rt, cudaEventDefault);
    t->ph1 = *e1 = event_new(rt, cudaEventDefault);
}

static void cuda_run(nb_lane *lane, const char *name, nb_span_kind kind, int step, nb_task_fn fn,
                     void *arg) {
    dev_rt *rt = rt_of(lane);
    dev_lane *d = dl(lane);
    use_device(rt);
    lock(&d->run_mu);
    cudaEvent_t e0 = NULL, e1 = NULL;
    anchor *a = NULL;
    lock(&rt->mu);
    cuda_graph *g = rt->capture;
    if (rt->timed && g) {
        graph_add_task(rt, g, name, nb_lane_index(lane), kind, &e0, &e1);
    } else if (rt->timed) {
        e0 = timing_get(rt);
        e1 = timing_get(rt);
        a = anchor_current(rt);
        a->refs++;
    }
    unlock(&rt->mu);

    /* Inside a capture, External makes the records event-record nodes of the graph (a plain
     * record there would only be a dependency point, with no timestamp at replay). */
    if (e0 && g)
        CAPTURE_CHECK(cudaEventRecordWithFlags(e0, d->stream, cudaEventRecordExternal));
    else if (e0)
        CUDA_CHECK(cudaEventRecord(e0, d->stream));
    nb_task_ctx ctx = {.lane = lane, .stream = d->stream, .backend = nb_lanes_backend(nb_lane_owner(lane))};
    fn(arg, &ctx);
    if (e1 && g)
        CAPTURE_CHECK(cudaEventRecordWithFlags(e1, d->stream, cudaEventRecordExternal));
    else if (e1)
        CUDA_CHECK(cudaEventRecord(e1, d->stream));

    lock(&rt->mu);
    d->ops++;
    d->last = NULL;
    if (a) {
        pending p = {
            .lane = nb_lane_index(lane), .step = step, .kind = kind, .e0 = e0, .e1 = e1, .a = a};
        nb_span_set_name(p.name, name);
        pending_push(d, &p);
        if (d->pend_len >= NB_PENDING_RESOLVE) resolve_lane(rt, d);
    }
    unlock(&rt->mu);
    unlock(&d->run_mu);
}

static void cuda_sync(nb_lanes *L) {
    dev_rt *rt = nb_lanes_device_state(L);
    use_device(rt);
    int n = nb_lanes_count(L);
    for (int i = 0; i < n; i++) {
        nb_lane *lane = nb_lanes_get(L, i);
        if (nb_lane_get_kind(lane) != NB_LANE_DEVICE) continue;
        dev_lane *d = dl(lane);
        lock(&rt->mu);
        uint64_t ops = d->ops;
        unlock(&rt->mu);
        CUDA_CHECK(cudaStreamSynchronize(d->stream));
        lock(&rt->mu);
        raise_done(d, ops);
        unlock(&rt->mu);
    }
    CUDA_CHECK(cudaStreamSynchronize(rt->anchor_stream));
    lock(&rt->mu);
    resolve_all(rt); /* all of it, unless another thread enqueued meanwhile */
    unlock(&rt->mu);
}

/* ---- graphs ---- */

/* Every device lane's `last` slot is reset around a capture: a plain slot is no mark inside it,
 * and a capture slot none outside it. */
static void forget_last(dev_rt *rt) {
    int n = nb_lanes_count(rt->L);
    for (int i = 0; i < n; i++) {
        nb_lane *lane = nb_lanes_get(rt->L, i);
        if (nb_lane_get_kind(lane) == NB_LANE_DEVICE) dl(lane)->last = NULL;
    }
}

static void *cuda_capture_begin(nb_lanes *L, nb_lane *origin) {
    dev_rt *rt = nb_lanes_device_state(L);
    use_device(rt);
    cuda_graph *g = nb_calloc(1, sizeof *g, "a CUDA graph");
    g->rt = rt;
    g->origin = origin;
    dev_lane *od = dl(origin);
    CUDA_CHECK(cudaStreamBeginCapture(od->stream, cudaStreamCaptureModeThreadLocal));
    lock(&rt->mu);
    g->id = ++rt->capture_ids;
    rt->capture = g;
    forget_last(rt);
    slot *fork = capture_slot(rt, od);
    int n = nb_lanes_count(L);
    for (int i = 0; i < n; i++) {
        nb_lane *lane = nb_lanes_get(L, i);
        if (lane == origin || nb_lane_get_kind(lane) != NB_LANE_DEVICE) continue;
        dev_lane *d = dl(lane);
        CAPTURE_CHECK(cudaStreamWaitEvent(d->stream, fork->ev, 0)); /* d joins the capture */
        d->ops++;
    }
    unlock(&rt->mu);
    return g;
}

static int event_key_cmp(const void *pa, const void *pb) {
    const cudaEvent_t *x = pa, *y = pb;
    uintptr_t a = (uintptr_t)*x, b = (uintptr_t)*y;
    return a < b ? -1 : a > b;
}

/* Finds the event-record node of every task's placeholder events. */
static void map_timing_nodes(cuda_graph *g) {
    size_t n = 0;
    CUDA_CHECK(cudaGraphGetNodes(g->graph, NULL, &n));
    cudaGraphNode_t *nodes = nb_malloc((n ? n : 1) * sizeof *nodes, "a graph's node list");
    CUDA_CHECK(cudaGraphGetNodes(g->graph, nodes, &n));
    /* keys[k] = placeholder event, sorted; which[k] = 2 * task + (end ? 1 : 0). */
    size_t nk = 2 * g->ntasks;
    struct key {
        cudaEvent_t ev;
        size_t which;
    } *keys = nb_malloc((nk ? nk : 1) * sizeof *keys, "graph timing");
    for (size_t t = 0; t < g->ntasks; t++) {
        keys[2 * t] = (struct key){g->tasks[t].ph0, 2 * t};
        keys[2 * t + 1] = (struct key){g->tasks[t].ph1, 2 * t + 1};
    }
    qsort(keys, nk, sizeof *keys, event_key_cmp);
    for (size_t k = 0; k < n; k++) {
        enum cudaGraphNodeType type;
        CUDA_CHECK(cudaGraphNodeGetType(nodes[k], &type));
        if (type != cudaGraphNodeTypeEventRecord) continue;
        struct key probe = {0};
        CUDA_CHECK(cudaGraphEventRecordNodeGetEvent(nodes[k], &probe.ev));
        struct key *hit = bsearch(&probe, keys, nk, sizeof *keys, event_key_cmp);
        if (!hit) continue;
        graph_task *t = &g->tasks[hit->which / 2];
        if (hit->which % 2)
            t->n1 = nodes[k];
        else
            t->n0 = nodes[k];
    }
    for (size_t t = 0; t < g->ntasks; t++)
        NB_ASSERT(g->tasks[t].n0 && g->tasks[t].n1);
    free(keys);
    free(nodes);
}

static void cuda_capture_end(nb_lanes *L, void *graph) {
    dev_rt *rt = nb_lanes_device_state(L);
    cuda_graph *g = graph;
    dev_lane *od = dl(g->origin);
    use_device(rt);
    int n = nb_lanes_count(L);
    lock(&rt->mu);
    for (int i = 0; i < n; i++) {
        nb_lane *lane = nb_lanes_get(L, i);
        if (lane == g->origin || nb_lane_get_kind(lane) != NB_LANE_DEVICE) continue;
        slot *join = capture_slot(rt, dl(lane));
        CAPTURE_CHECK(cudaStreamWaitEvent(od->stream, join->ev, 0));
    }
    od->ops++;
    unlock(&rt->mu);
    cudaError_t e = cudaStreamEndCapture(od->stream, &g->graph);
    if (e != cudaSuccess)
        nb_fail_at(__FILE__, __LINE__, NB_CAPTURE_HINT,
                   "ending the CUDA graph capture on lane '%s' failed: %s (%s)",
                   nb_lane_name(g->origin), cudaGetErrorString(e), cudaGetErrorName(e));
    CUDA_CHECK(cudaGraphInstantiate(&g->exec, g->graph, 0));
    if (rt->timed) map_timing_nodes(g);
    if (g->ntasks)
        g->launch_ev = nb_malloc(2 * g->ntasks * sizeof *g->launch_ev, "a graph's events");
    lock(&rt->mu);
    for (int i = 0; i < n; i++) {
        nb_lane *lane = nb_lanes_get(L, i);
        if (nb_lane_get_kind(lane) != NB_LANE_DEVICE) continue;
        dev_lane *d = dl(lane);
        while (d->capture_used) { /* nothing refers to them once the capture has ended */
            slot *s = d->capture_used;
            d->capture_used = s->next;
            s->next = d->capture_free;
            d->capture_free = s;
        }
    }
    rt->capture = NULL;
    forget_last(rt);
    unlock(&rt->mu);
}

static void cuda_graph_launch(void *graph, nb_lane *on, int step) {
    cuda_graph *g = graph;
    dev_rt *rt = g->rt;
    dev_lane *d = dl(on);
    use_device(rt);
    lock(&d->run_mu);
    anchor *a = NULL;
    if (rt->timed && g->ntasks) {
        lock(&rt->mu);
        for (size_t i = 0; i < 2 * g->ntasks; i++)
            g->launch_ev[i] = timing_get(rt);
        a = anchor_current(rt);
        a->refs += (int)g->ntasks;
        unlock(&rt->mu);
        /* Takes effect for this launch only; launches already enqueued keep their events. */
        for (size_t i = 0; i < g->ntasks; i++) {
            CUDA_CHECK(
                cudaGraphExecEventRecordNodeSetEvent(g->exec, g->tasks[i].n0, g->launch_ev[2 * i]));
            CUDA_CHECK(cudaGraphExecEventRecordNodeSetEvent(g->exec, g->tasks[i].n1,
                                                            g->launch_ev[2 * i + 1]));
        }
    }
    CUDA_CHECK(cudaGraphLaunch(g->exec, d->stream));
    lock(&rt->mu);
    d->ops++;
    d->last = NULL;
    for (size_t i = 0; a && i < g->ntasks; i++) {
        pending p = {.lane = g->tasks[i].lane,
                     .step = step,
                     .kind = g->tasks[i].kind,
                     .e0 = g->launch_ev[2 * i],
                     .e1 = g->launch_ev[2 * i + 1],
                     .a = a};
        memcpy(p.name, g->tasks[i].name, sizeof p.name);
        pending_push(d, &p);
    }
    if (d->pend_len >= NB_PENDING_RESOLVE) resolve_lane(rt, d);
    unlock(&rt->mu);
    unlock(&d->run_mu);
}

/* An executable graph destroyed while a launch is in flight is freed when that launch completes;
 * its nodes record pool events by then, so the placeholders can go at once. */
static void cuda_graph_destroy(void *graph) {
    cuda_graph *g = graph;
    use_device(g->rt);
    CUDA_CHECK(cudaGraphExecDestroy(g->exec));
    CUDA_CHECK(cudaGraphDestroy(g->graph));
    for (size_t i = 0; i < g->ntasks; i++) {
        CUDA_CHECK(cudaEventDestroy(g->tasks[i].ph0));
        CUDA_CHECK(cudaEventDestroy(g->tasks[i].ph1));
    }
    free(g->tasks);
    free(g->launch_ev);
    free(g);
}

size_t nb_lanes_cuda_events_created(nb_lanes *L) {
    dev_rt *rt = nb_lanes_device_state(L);
    if (!rt) return 0; /* a "cpu" runtime */
    lock(&rt->mu);
    size_t n = rt->events_created;
    unlock(&rt->mu);
    return n;
}

static const nb_lanes_device_i cuda_device = {
    .name = "cuda",
    .create = cuda_create,
    .destroy = cuda_destroy,
    .lane_init = cuda_lane_init,
    .lane_fini = cuda_lane_fini,
    .run = cuda_run,
    .mark = cuda_mark,
    .wait = cuda_wait,
    .wait_host = cuda_wait_host,
    .reached = cuda_reached,
    .sync = cuda_sync,
    .mark_class = cuda_mark_class,
    .capture_begin = cuda_capture_begin,
    .capture_end = cuda_capture_end,
    .graph_launch = cuda_graph_launch,
    .graph_destroy = cuda_graph_destroy,
};

const nb_lanes_device_i *nb_lanes_cuda_device(void) { return &cuda_device; }

#endif /* NB_WITH_CUDA */
