/* Lanes internals shared by lanes_cpu.c (threads, marks, queues), trace.c (span storage and
 * statistics) and lanes_cuda.c (device lanes as streams + events). Not for schedules:
 * they use lanes.h only. Plain C with no _Atomic types, so nvcc can include it as C++. */
#ifndef NB_LANES_INTERNAL_H
#define NB_LANES_INTERNAL_H

#include <pthread.h>

#include "lanes/lanes.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- span storage (trace.c) ---- */
typedef struct nb_trace {
    pthread_mutex_t mu; /* guards everything below: spans arrive from every lane's thread */
    nb_span *spans;     /* capacity entries, in the order they finished */
    nb_span *snapshot;  /* what nb_lanes_spans hands out: sorted by start time */
    size_t capacity;    /* 0 = tracing off */
    size_t count;
    size_t dropped;
} nb_trace;

void nb_trace_init(nb_trace *t, size_t capacity);
void nb_trace_free(nb_trace *t);
/* Thread-safe. Keeps s if there is room, else counts it as dropped; no-op when tracing is off. */
void nb_trace_record(nb_trace *t, const nb_span *s);


/* The runtime's span store, so a device backend can add spans it timed with events. */
nb_trace *nb_lanes_trace(nb_lanes *L);

/* ---- device lanes hook ----
 * With backend "cuda", lanes of kind NB_LANE_DEVICE are driven through this table; HOST lanes
 * stay worker threads in every backend (lanes_cpu.c). Every entry is required.
 *   create/destroy: the runtime-wide state (nb_lanes_device_state); destroy runs after every
 *            lane's lane_fini.
 *   lane_init/lane_fini: create/destroy the lane's stream (store it with nb_lane_set_device).
 *   run:     call fn(arg, &ctx) at once with ctx.stream set, timing it with events; the span goes
 *            into the trace once the host learns the task finished (nb_lanes_record_span).
 *   mark:    record an event on the lane; the returned mark has lane, seq and event set.
 *   wait:    device lane waits for m, which may be a device mark (cudaStreamWaitEvent) or a host
 *            lane's mark (e.g. block the enqueuer with nb_mark_wait_host before returning).
 *   wait_host / reached: host side of a device mark (event synchronize / query).
 *   sync:    drain every device lane, then move their timed spans into the trace.
 *   mark_class: NB_MARK_PLAIN, or whether a mark taken during a capture belongs to the capture
 *            in progress (NB_MARK_IN_CAPTURE) or to one that has ended (NB_MARK_STALE).
 *   capture_begin/capture_end/graph_launch/graph_destroy: the device side of nb_lanes_capture_*
 *            and nb_graph_* (lanes.h); lanes_cpu.c checks the rules before calling them.
 * A host lane's worker that meets a device mark in its queue calls wait_host. */
enum { NB_MARK_PLAIN = 0, NB_MARK_IN_CAPTURE = 1, NB_MARK_STALE = 2 };

typedef struct nb_lanes_device_i {
    const char *name;
    void *(*create)(nb_lanes *L);
    void (*destroy)(nb_lanes *L);
    void (*lane_init)(nb_lanes *L, nb_lane *lane);
    void (*lane_fini)(nb_lanes *L, nb_lane *lane);
    void (*run)(nb_lane *lane, const char *name, nb_span_kind kind, int step, nb_task_fn fn,
                void *arg);
    nb_mark (*mark)(nb_lane *lane);
    void (*wait)(nb_lane *lane, nb_mark m);
    void (*wait_host)(nb_mark m);
    int (*reached)(nb_mark m);
    void (*sync)(nb_lanes *L);
    int (*mark_class)(nb_mark m);
    void *(*capture_begin)(nb_lanes *L, nb_lane *origin);
    void (*capture_end)(nb_lanes *L, void *graph);
    void (*graph_launch)(void *graph, nb_lane *on, int step);
    void (*graph_destroy)(void *graph);
} nb_lanes_device_i;

#ifdef NB_WITH_CUDA
/* Defined by lanes_cuda.c (referenced strongly from lanes_cpu.c, so it is always linked in). */
const nb_lanes_device_i *nb_lanes_cuda_device(void);
#endif

/* The backend instance of nb_lanes_bind (NULL before). */
const void *nb_lanes_backend(const nb_lanes *L);
/* What the device table's create returned (NULL on the CPU backend). */
void *nb_lanes_device_state(const nb_lanes *L);

nb_lanes *nb_lane_owner(const nb_lane *lane);
/* Per-lane slot for the device backend (the cudaStream_t and whatever else it keeps). */
void *nb_lane_device(const nb_lane *lane);
void nb_lane_set_device(nb_lane *lane, void *state);

#ifdef __cplusplus
}
#endif
#endif
