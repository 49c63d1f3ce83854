/* Trace: span storage, Chrome trace export, and per-step bubble / overlap statistics.
 *
 * Spans arrive from every lane's thread into one preallocated buffer under a mutex (one short
 * critical section per task, far cheaper than any task worth a lane). When the buffer is full new
 * spans are dropped and counted, so tracing never allocates while a step runs. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "io/atomic.h"
#include "lanes/lanes_internal.h"

static const char *const span_kind_names[NB_SPAN_KIND_COUNT] = {
    "fwd", "bwd", "loss", "optim", "h2d", "d2h", "data", "comm", "other"};

const char *nb_span_kind_name(nb_span_kind k) {
    return (unsigned)k < NB_SPAN_KIND_COUNT ? span_kind_names[k] : "unknown";
}

void nb_span_set_name(char *dst, const char *src) {
    const size_t cap = sizeof(((nb_span *)0)->name);
    if (!src) src = "";
    size_t n = strnlen(src, cap - 1);
    /* If we cut inside a multi-byte UTF-8 character, drop its partial bytes. */
    if (n == cap - 1 && src[n] != '\0') {
        size_t k = n;
        while (k > 0 && ((unsigned char)src[k] & 0xC0) == 0x80) k--;
        n = k;
    }
    memcpy(dst, src, n);
    dst[n] = '\0';
}

/* ---- storage ---- */

void nb_trace_init(nb_trace *t, size_t capacity) {
    memset(t, 0, sizeof *t);
    NB_ASSERT(pthread_mutex_init(&t->mu, NULL) == 0);
    t->capacity = capacity;
    if (capacity) t->spans = nb_malloc(capacity * sizeof *t->spans, "the lanes trace");
}

void nb_trace_free(nb_trace *t) {
    free(t->spans);
    free(t->snapshot);
    NB_ASSERT(pthread_mutex_destroy(&t->mu) == 0);
    memset(t, 0, sizeof *t);
}

void nb_trace_record(nb_trace *t, const nb_span *s) {
    if (t->capacity == 0) return; /* fixed at init: safe to read unlocked */
    NB_ASSERT(pthread_mutex_lock(&t->mu) == 0);
    if (t->count < t->capacity)
        t->spans[t->count++] = *s;
    else
        t->dropped++;
    NB_ASSERT(pthread_mutex_unlock(&t->mu) == 0);
}

void nb_lanes_record_span(nb_lanes *L, const char *name, int lane, nb_span_kind kind, int step,
                          double t0, double t1) {
    NB_ASSERT(lane >= 0 && lane < nb_lanes_count(L));
    NB_ASSERT((unsigned)kind < NB_SPAN_KIND_COUNT);
    nb_span s;
    nb_span_set_name(s.name, name);
    s.lane = lane;
    s.step = step;
    s.kind = kind;
    s.t0 = t0;
    s.t1 = t1;
    nb_trace_record(nb_lanes_trace(L), &s);
}

static int span_cmp(const void *pa, const void *pb) {
    const nb_span *a = pa, *b = pb;
    if (a->t0 != b->t0) return a->t0 < b->t0 ? -1 : 1;
    if (a->lane != b->lane) return a->lane < b->lane ? -1 : 1;
    if (a->t1 != b->t1) return a->t1 < b->t1 ? -1 : 1;
    return 0;
}

size_t nb_lanes_spans(nb_lanes *L, const nb_span **out) {
    nb_trace *t = nb_lanes_trace(L);
    NB_ASSERT(pthread_mutex_lock(&t->mu) == 0);
    if (!t->snapshot && t->capacity)
        t->snapshot = nb_malloc(t->capacity * sizeof *t->snapshot, "the lanes trace snapshot");
    size_t n = t->count;
    if (n) memcpy(t->snapshot, t->spans, n * sizeof *t->spans);
    NB_ASSERT(pthread_mutex_unlock(&t->mu) == 0);
    if (n) qsort(t->snapshot, n, sizeof *t->snapshot, span_cmp);
    if (out) *out = t->snapshot;
    return n;
}

size_t nb_lanes_spans_dropped(nb_lanes *L) {
    nb_trace *t = nb_lanes_trace(L);
    NB_ASSERT(pthread_mutex_lock(&t->mu) == 0);
    size_t d = t->dropped;
    NB_ASSERT(pthread_mutex_unlock(&t->mu) == 0);
    return d;
}

void nb_lanes_trace_clear(nb_lanes *L) {
    nb_trace *t = nb_lanes_trace(L);
    NB_ASSERT(pthread_mutex_lock(&t->mu) == 0);
    t->count = 0;
    t->dropped = 0;
    NB_ASSERT(pthread_mutex_unlock(&t->mu) == 0);
}

/* ---- Chrome trace JSON ---- */

typedef struct {
    FILE *f;
    const char *tmp, *path;
} json_out;

static void out_check(const json_out *o, int rc) {
    if (rc < 0) nb_atomic_fail(o->f, o->tmp, o->path, "write", errno);
}

/* A JSON string literal: quotes, backslashes and control characters escaped. */
static void out_string(const json_out *o, const char *s) {
    out_check(o, fputc('"', o->f) == EOF ? -1 : 0);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        int rc;
        if (*p == '"' || *p == '\\')
            rc = fprintf(o->f, "\\%c", *p);
        else if (*p < 0x20)
            rc = fprintf(o->f, "\\u%04x", *p);
        else
            rc = fputc(*p, o->f) == EOF ? -1 : 0;
        out_check(o, rc);
    }
    out_check(o, fputc('"', o->f) == EOF ? -1 : 0);
}

static void write_lane_names(const json_out *o, nb_lanes *L) {
    out_check(o, fprintf(o->f, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":0,\"tid\":0,"
                               "\"args\":{\"name\":\"nobubble\"}}"));
    for (int i = 0; i < nb_lanes_count(L); i++) {
        out_check(o, fprintf(o->f, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":%d,"
                                   "\"args\":{\"name\":", i));
        out_string(o, nb_lane_name(nb_lanes_get(L, i)));
        out_check(o, fprintf(o->f, "}}"));
    }
}

static void write_span(const json_out *o, const nb_span *s, double origin) {
    out_check(o, fprintf(o->f, ",\n{\"name\":"));
    out_string(o, s->name);
    out_check(o, fprintf(o->f,
                         ",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":0,\"tid\":%d,\"ts\":%.3f,"
                         "\"dur\":%.3f,\"args\":{\"step\":%d}}",
                         nb_span_kind_name(s->kind), s->lane, (s->t0 - origin) * 1e6,
                         (s->t1 - s->t0) * 1e6, s->step));
}

void nb_lanes_write_chrome_trace(nb_lanes *L, const char *path, const char *title) {
    NB_ASSERT(L && path);
    const nb_span *spans = NULL;
    size_t n = nb_lanes_spans(L, &spans);
    char tmp[PATH_MAX];
    /* a fresh temp file (never one someone planted, nor a link's target) + rename: a crash or a
     * full disk never leaves a half-written trace at `path` */
    json_out o = {nb_atomic_open(path, tmp, sizeof tmp), tmp, path};
    out_check(&o, fprintf(o.f, "{\"traceEvents\":[\n"));
    write_lane_names(&o, L);
    double origin = n ? spans[0].t0 : 0; /* spans are sorted by start */
    for (size_t i = 0; i < n; i++) write_span(&o, &spans[i], origin);
    out_check(&o, fprintf(o.f, "\n]"));
    if (title) { /* Chrome's trace format keeps free-form metadata here: the timeline's title */
        out_check(&o, fprintf(o.f, ",\n\"otherData\":{\"title\":"));
        out_string(&o, title);
        out_check(&o, fprintf(o.f, "}"));
    }
    out_check(&o, fprintf(o.f, "}\n"));
    nb_atomic_commit(o.f, tmp, path);
}

/* ---- step statistics ---- */

typedef struct {
    int lane;
    double a, b;
    int moves; /* a transfer: COMM, H2D, D2H or OTHER */
} interval;

static int interval_cmp(const void *pa, const void *pb) {
    const interval *x = pa, *y = pb;
    if (x->lane != y->lane) return x->lane < y->lane ? -1 : 1;
    if (x->a != y->a) return x->a < y->a ? -1 : 1;
    return 0;
}

typedef struct {
    double t;
    int delta;
} edge;

static int edge_cmp(const void *pa, const void *pb) {
    const edge *x = pa, *y = pb;
    if (x->t != y->t) return x->t < y->t ? -1 : 1;
    return x->delta - y->delta; /* ends before starts: touching spans do not overlap */
}

/* Spans of `step` (all if step < 0) clipped to [t0, t1]; empty results dropped. */
static size_t collect_intervals(nb_lanes *L, int step, double t0, double t1, interval **out) {
    nb_trace *t = nb_lanes_trace(L);
    int lanes = nb_lanes_count(L);
    NB_ASSERT(pthread_mutex_lock(&t->mu) == 0);
    interval *iv = nb_malloc((t->count ? t->count : 1) * sizeof *iv, "step statistics");
    size_t n = 0;
    for (size_t i = 0; i < t->count; i++) {
        const nb_span *s = &t->spans[i];
        if (step >= 0 && s->step != step) continue;
        if (s->lane < 0 || s->lane >= lanes) continue;
        double a = s->t0 > t0 ? s->t0 : t0, b = s->t1 < t1 ? s->t1 : t1;
        int moves = s->kind == NB_SPAN_COMM || s->kind == NB_SPAN_H2D || s->kind == NB_SPAN_D2H || s->kind == NB_SPAN_OTHER;
        if (b > a) iv[n++] = (interval){s->lane, a, b, moves};
    }
    NB_ASSERT(pthread_mutex_unlock(&t->mu) == 0);
    *out = iv;
    return n;
}

/* Sorts iv by (lane, start) and merges overlaps within each lane, in place: afterwards no two
 * intervals of one lane intersect, so counting intervals at a time counts busy lanes. */
static size_t merge_per_lane(interval *iv, size_t n) {
    if (n == 0) return 0;
    qsort(iv, n, sizeof *iv, interval_cmp);
    size_t m = 0;
    for (size_t i = 1; i < n; i++) {
        if (iv[i].lane == iv[m].lane && iv[i].a <= iv[m].b) {
            if (iv[i].b > iv[m].b) iv[m].b = iv[i].b;
        } else {
            iv[++m] = iv[i];
        }
    }
    return m + 1;
}

/* Measure of the time covered by at least two lanes. */
static double overlap_measure(const interval *iv, size_t n) {
    if (n < 2) return 0;
    edge *e = nb_malloc(2 * n * sizeof *e, "step statistics");
    for (size_t i = 0; i < n; i++) {
        e[2 * i] = (edge){iv[i].a, +1};
        e[2 * i + 1] = (edge){iv[i].b, -1};
    }
    qsort(e, 2 * n, sizeof *e, edge_cmp);
    double total = 0;
    int busy = 0;
    for (size_t i = 0; i < 2 * n; i++) {
        if (busy >= 2) total += e[i].t - e[i - 1].t;
        busy += e[i].delta;
    }
    free(e);
    return total;
}

/* Union of the intervals keep() selects, sorted and disjoint, into out; returns the count. */
static size_t union_of(const interval *iv, size_t n, int lane, int transfers, interval *out) {
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (transfers ? iv[i].lane != lane && iv[i].moves : iv[i].lane == lane) out[m++] = (interval){0, iv[i].a, iv[i].b, 0};
    return merge_per_lane(out, m);
}

/* Time the transfers of other lanes ran while `lane` was idle. */
static double exposed_measure(const interval *iv, size_t n, int lane) {
    interval *c = nb_malloc((n ? n : 1) * sizeof *c, "step statistics"), *x = nb_malloc((n ? n : 1) * sizeof *x, "step statistics");
    size_t nc = union_of(iv, n, lane, 0, c), nx = union_of(iv, n, lane, 1, x);
    double total = 0, both = 0;
    for (size_t i = 0; i < nx; i++) total += x[i].b - x[i].a;
    for (size_t i = 0, j = 0; i < nx && j < nc;) { /* |x and c| over two sorted disjoint lists */
        double a = x[i].a > c[j].a ? x[i].a : c[j].a, b = x[i].b < c[j].b ? x[i].b : c[j].b;
        if (b > a) both += b - a;
        if (x[i].b < c[j].b) i++; else j++;
    }
    free(c), free(x);
    return total - both;
}

nb_step_stats nb_lanes_step_stats(nb_lanes *L, int step, int lane, double t0, double t1) {
    NB_ASSERT(L && lane >= 0 && lane < nb_lanes_count(L));
    nb_step_stats st = {0};
    if (!(t1 > t0)) return st; /* an empty window has no idle time to speak of */
    interval *iv = NULL;
    size_t n = collect_intervals(L, step, t0, t1, &iv);
    n = merge_per_lane(iv, n);
    st.window_s = t1 - t0;
    for (size_t i = 0; i < n; i++)
        if (iv[i].lane == lane) st.busy_s += iv[i].b - iv[i].a;
    st.bubble_pct = 100.0 * (st.window_s - st.busy_s) / st.window_s;
    st.overlap_pct = 100.0 * overlap_measure(iv, n) / st.window_s;
    st.exposed_pct = 100.0 * exposed_measure(iv, n, lane) / st.window_s;
    free(iv);
    return st;
}
