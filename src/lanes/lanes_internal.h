/* Lanes internals shared by lanes_cpu.c (threads, marks, queues), trace.c (span storage and
 * statistics) and a later lanes_cuda.c (device lanes as streams + events). Not for schedules:
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

/* Copy a span name into dst (sizeof nb_span.name bytes), truncating on a UTF-8 character
 * boundary so the trace stays valid JSON text. NULL becomes "". */
void nb_span_set_name(char *dst, const char *src);

/* The runtime's span store, so a device backend can add spans it timed with events. */
nb_trace *nb_lanes_trace(nb_lanes *L);
/* Convenience for device backends and tests: record one span of lane `lane` (index). */
void nb_lanes_record_span(nb_lanes *L, const char *name, int lane, nb_span_kind kind, int step,
                          double t0, double t1);

/* ---- device lanes hook ----
 * With backend "cuda", lanes of kind NB_LANE_DEVICE are driven through this table; HOST lanes
 * stay worker threads in every backend (lanes_cpu.c). Every entry is required.
 *   lane_init/lane_fini: create/destroy the lane's stream (store it with nb_lane_set_device).
 *   run:     call fn(arg, &ctx) at once with ctx.stream set, timing it with events; the span goes
 *            into the trace at sync (nb_lanes_record_span).
 *   mark:    record an event on the lane; the returned mark has lane, seq and event set.
 *   wait:    device lane waits for m, which may be a device mark (cudaStreamWaitEvent) or a host
 *            lane's mark (e.g. block the enqueuer with nb_mark_wait_host before returning).
 *   wait_host / reached: host side of a device mark (event synchronize / query).
 *   sync:    drain every device lane, then move their timed spans into the trace.
 * A host lane's worker that meets a device mark in its queue calls wait_host. */
typedef struct nb_lanes_device_i {
    const char *name;
    void (*lane_init)(nb_lanes *L, nb_lane *lane);
    void (*lane_fini)(nb_lanes *L, nb_lane *lane);
    void (*run)(nb_lane *lane, const char *name, nb_span_kind kind, int step, nb_task_fn fn,
                void *arg);
    nb_mark (*mark)(nb_lane *lane);
    void (*wait)(nb_lane *lane, nb_mark m);
    void (*wait_host)(nb_mark m);
    int (*reached)(nb_mark m);
    void (*sync)(nb_lanes *L);
} nb_lanes_device_i;

#ifdef NB_WITH_CUDA
/* Defined by lanes_cuda.c. Referenced weakly from lanes_cpu.c so that a CUDA build links before
 * lanes_cuda.c exists; once it does, drop the weak attribute there (a weak reference does not
 * pull an archive member into the link, so keep it strong in the finished tree). */
const nb_lanes_device_i *nb_lanes_cuda_device(void);
#endif

nb_lanes *nb_lane_owner(const nb_lane *lane);
nb_lane_kind nb_lane_get_kind(const nb_lane *lane);
/* Per-lane slot for the device backend (the cudaStream_t and whatever else it keeps). */
void *nb_lane_device(const nb_lane *lane);
void nb_lane_set_device(nb_lane *lane, void *state);

#ifdef __cplusplus
}
#endif
#endif
