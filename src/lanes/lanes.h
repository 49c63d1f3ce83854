/* Lanes: ordered queues of work. On the CPU backend a lane is a worker thread; on CUDA a device
 * lane is a cudaStream_t (host lanes stay threads). A mark is a point in a lane that other lanes
 * (or the host) can wait on. Every piece of work is a span in the trace.
 *
 * Work is a task: fn(arg, ctx). On a CPU lane the lane's thread calls it, in enqueue order,
 * after every mark the lane was told to wait on (before the task was enqueued) has been reached.
 * On a CUDA device lane (lanes_cuda.c) the enqueuing thread calls it at once and fn launches
 * its kernels on ctx->stream; ordering then comes from the stream and its events, and a device
 * lane told to wait on a HOST lane's mark blocks the enqueuing thread until that mark is reached.
 *
 * Usage (a schedule):
 *   nb_lane_run(compute, "fwd L0", NB_SPAN_FWD, 0, block_fwd, &args[0]);
 *   nb_mark m = nb_lane_mark(compute);
 *   nb_lane_wait(side, m);               // side's next task starts after compute reached m
 *   nb_lane_run(side, "bwd L0", NB_SPAN_BWD, 0, block_bwd, &args[1]);
 *   nb_mark_wait_host(nb_lane_mark(side));
 * A task's arg must stay valid until the task has run (wait on a mark after it first). */
#ifndef NB_LANES_H
#define NB_LANES_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nb_lanes nb_lanes; /* the runtime: a set of lanes sharing a trace */
typedef struct nb_lane nb_lane;

typedef enum { NB_LANE_HOST = 0, NB_LANE_DEVICE = 1 } nb_lane_kind;

/* Span categories: colour and meaning in the trace and timeline. */
typedef enum {
    NB_SPAN_FWD = 0,
    NB_SPAN_BWD,
    NB_SPAN_LOSS,
    NB_SPAN_OPTIM,
    NB_SPAN_H2D,
    NB_SPAN_D2H,
    NB_SPAN_DATA,
    NB_SPAN_COMM,
    NB_SPAN_OTHER,
    NB_SPAN_KIND_COUNT
} nb_span_kind;
const char *nb_span_kind_name(nb_span_kind k);

typedef struct nb_task_ctx {
    nb_lane *lane;
    void *stream;        /* cudaStream_t on a CUDA device lane, NULL on CPU lanes */
    const void *backend; /* the backend instance the runtime was bound to (nb_lanes_bind), or NULL */
} nb_task_ctx;
typedef void (*nb_task_fn)(void *arg, const nb_task_ctx *ctx);

/* A point in a lane: reached once every task enqueued on the lane before the mark is done. */
typedef struct nb_mark {
    nb_lane *lane;
    uint64_t seq;  /* number of tasks that must have completed on the lane */
    void *event;   /* cudaEvent_t on CUDA device lanes */
} nb_mark;

/* Create the runtime. backend: "cpu" (every lane a thread) or "cuda" (device lanes are streams;
 * only when built with CUDA). trace_capacity: spans kept (0 = tracing off). */
nb_lanes *nb_lanes_create(const char *backend, size_t trace_capacity);
void nb_lanes_destroy(nb_lanes *L); /* drains all lanes first */
/* Every worker thread the runtime starts from now on (lanes' threads, a CPU graph's replay
 * threads) calls fn(arg) first: per-thread settings such as OpenMP's thread count. */
void nb_lanes_set_thread_start(nb_lanes *L, void (*fn)(void *arg), void *arg);
/* Every task's ctx->backend is `backend` from now on: the ops find the instance they run on
 * (device index, library handles) through it (ops/backend.h). */
void nb_lanes_bind(nb_lanes *L, const void *backend);
nb_lane *nb_lane_create(nb_lanes *L, const char *name, nb_lane_kind kind);
nb_lane_kind nb_lane_get_kind(const nb_lane *lane);
const char *nb_lane_name(const nb_lane *lane);
int nb_lane_index(const nb_lane *lane);
int nb_lanes_count(const nb_lanes *L);
nb_lane *nb_lanes_get(nb_lanes *L, int index);

/* Enqueue a task. name is copied into the span; step tags the span for per-step statistics. */
void nb_lane_run(nb_lane *lane, const char *name, nb_span_kind kind, int step, nb_task_fn fn, void *arg);
/* The mark at the current end of lane's queue. */
nb_mark nb_lane_mark(nb_lane *lane);
/* Tasks enqueued on lane after this call start only once m is reached. The lane's own marks do
 * not move: a mark taken right after a wait is the mark of the task before it. */
void nb_lane_wait(nb_lane *lane, nb_mark m);
/* A wait the lane's marks cover: nb_lane_wait and an empty task (a span named `name`), so a mark
 * of lane taken after it is reached only once m is (other lanes and the host can wait on it). */
void nb_lane_join(nb_lane *lane, nb_mark m, const char *name);
/* Block the calling (host) thread until m is reached. */
void nb_mark_wait_host(nb_mark m);
/* Non-blocking: has m been reached? */
int nb_mark_reached(nb_mark m);
/* Wait until every lane has drained its queue. */
void nb_lanes_sync(nb_lanes *L);

/* ---- graphs: capture a segment of work once, replay it many times ----
 * On CUDA a capture is a multi-stream CUDA graph: it removes per-kernel launch overhead and fixes
 * the launch order. On the CPU backend the same calls record the tasks and replay them, so a
 * schedule written for graphs runs, and is tested, without a GPU.
 *
 *   nb_lanes_capture_begin(L, compute);         // every device lane of L joins the capture
 *   nb_lane_run(compute, "fwd", ...);           // recorded, not run
 *   nb_lane_wait(side, nb_lane_mark(compute));  // marks inside the capture order its branches
 *   nb_lane_run(side, "bwd", ...);
 *   nb_graph *g = nb_lanes_capture_end(L);      // joins every device lane back into compute
 *   for (step...) {
 *       nb_lane_wait(compute, batch_ready);     // order a replay from outside: before it...
 *       nb_graph_launch(g, compute, step);
 *       nb_loader_release(..., nb_lane_mark(compute));  // ...and after it, on the launch lane
 *   }
 *   nb_graph_destroy(g);
 *
 * Rules (the same on both backends; breaking one ends in nb_fail with a hint):
 *  - Between begin and end, work on DEVICE lanes is captured; HOST lanes keep running tasks.
 *    Begin and end are called from the same thread, which does not wait on device lanes' marks
 *    in between; no lane is created, nothing syncs, and no other capture starts meanwhile.
 *  - Inside the capture a device lane may wait only on marks taken inside it; a mark taken
 *    inside the capture can only be waited on by device lanes inside it (not by host lanes, not
 *    by nb_mark_wait_host / nb_mark_reached, and never after capture_end).
 *  - A replay behaves as ONE task on the launch lane `on` (a device lane): it starts after what
 *    was enqueued on `on` before it (tasks and waits) and a mark on `on` taken after the launch
 *    covers all of it. Marks of the other lanes do not: they never see the replayed work.
 *    Replays of one graph run one after another. Spans of a replay keep the lanes their tasks
 *    were captured on and take `step` from the launch.
 *  - On CUDA a captured task's fn runs once, at capture (its kernels are recorded), and not at
 *    replays; on the CPU backend fn runs at every replay and not at capture. So a task must not
 *    depend on host values that change between replays: pass those through memory (e.g. the
 *    learning rate as a device scalar). On CUDA, fn must only enqueue work on ctx->stream
 *    (no cudaMalloc, cudaMemcpy, synchronization: they break the capture). */
typedef struct nb_graph nb_graph;
/* origin: the device lane the capture forks from and joins back into. */
void nb_lanes_capture_begin(nb_lanes *L, nb_lane *origin);
nb_graph *nb_lanes_capture_end(nb_lanes *L);
/* Enqueue one replay on device lane `on` (of the same runtime); its spans carry `step`. */
void nb_graph_launch(nb_graph *g, nb_lane *on, int step);
/* Frees the graph; on the CPU backend waits for its replays to finish first. Destroy every graph
 * before nb_lanes_destroy. */
void nb_graph_destroy(nb_graph *g);

/* ---- trace (lanes/trace.c) ---- */
/* Copy a span name into dst (sizeof nb_span.name bytes), truncating on a UTF-8 character
 * boundary so the trace stays valid JSON text. NULL becomes "". */
void nb_span_set_name(char *dst, const char *src);
typedef struct nb_span {
    char name[40];
    int lane;
    int step;
    nb_span_kind kind;
    double t0, t1; /* seconds, nb_now() clock */
} nb_span;

/* Copies of recorded spans (after nb_lanes_sync); returns the count, *out valid until the next
 * call that records. Spans that did not fit in trace_capacity are dropped and counted. A CUDA
 * device lane's span enters the trace once the host has seen its work finish: a mark of a device
 * lane waited on (nb_mark_wait_host, or by a host lane) or found reached, or nb_lanes_sync. Its
 * times are GPU event timestamps mapped onto the nb_now() clock (lanes_cuda.c). */
size_t nb_lanes_spans(nb_lanes *L, const nb_span **out);
size_t nb_lanes_spans_dropped(nb_lanes *L);
void nb_lanes_trace_clear(nb_lanes *L);
/* Record one span of lane `lane` (index): for device backends that time work themselves, and
 * for tests of the statistics. */
void nb_lanes_record_span(nb_lanes *L, const char *name, int lane, nb_span_kind kind, int step, double t0, double t1);
/* CUDA events created so far by a "cuda" runtime (marks, timing, anchors, graph placeholders; 0
 * on the CPU): lets tests check that steady-state marks and spans reuse pooled events. */
size_t nb_lanes_cuda_events_created(nb_lanes *L);
/* Chrome trace JSON (open in Perfetto or chrome://tracing): one row (tid) per lane. */
void nb_lanes_write_chrome_trace(nb_lanes *L, const char *path, const char *title /* or NULL */);

/* Per-step statistics over [t0, t1] (the step's wall window) for the spans of that step:
 * bubble_pct = 100 * idle time of `lane` within the window / window;
 * overlap_pct = 100 * time when two or more lanes were busy / window;
 * exposed_pct = 100 * time when `lane` was idle while another lane moved data (spans of kind
 * COMM, H2D, D2H, or OTHER: lookups, copies) / window: the transfers nothing hid. */
typedef struct {
    double window_s;
    double busy_s;
    double bubble_pct;
    double overlap_pct;
    double exposed_pct;
} nb_step_stats;
nb_step_stats nb_lanes_step_stats(nb_lanes *L, int step, int lane, double t0, double t1);

#ifdef __cplusplus
}
#endif
#endif
