/* Kernel table from CUPTI's activity records (kprof.h). */
#include "lanes/kprof.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(NB_WITH_CUDA) && defined(__has_include)
#if __has_include(<cupti_activity.h>)
#define NB_KPROF_CUPTI 1
#endif
#endif

#ifndef NB_KPROF_CUPTI

int nb_kprof_open(char *why, size_t cap) {
    snprintf(why, cap, "this build has no CUDA (or no cupti_activity.h): no kernel table");
    return 0;
}
void nb_kprof_mark_begin(void) {}
void nb_kprof_mark_end(void) {}
void nb_kprof_report(FILE *f, int steps, int rows) { (void)f, (void)steps, (void)rows; }

#else

#include <dlfcn.h>
#include <pthread.h>

#include <cupti_activity.h>

#include "core.h"

typedef struct {
    CUptiResult (*register_callbacks)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc);
    CUptiResult (*enable)(CUpti_ActivityKind);
    CUptiResult (*disable)(CUpti_ActivityKind);
    CUptiResult (*flush_all)(uint32_t);
    CUptiResult (*next_record)(uint8_t *, size_t, CUpti_Activity **);
    CUptiResult (*dropped)(CUcontext, uint32_t, size_t *);
    CUptiResult (*timestamp)(uint64_t *);
    CUptiResult (*result_string)(CUptiResult, const char **);
    char *(*demangle)(const char *, char *, size_t *, int *); /* libstdc++'s __cxa_demangle, if loaded */
} cupti_api;

typedef enum { REC_KERNEL, REC_MEMSET, REC_COPY } rec_kind;
typedef struct {
    uint64_t start, end;
    int name; /* index into names */
    rec_kind kind;
} rec;

static struct {
    cupti_api api;
    int open;
    pthread_mutex_t mu;
    uint64_t t_begin, t_end; /* the window, in CUPTI's clock; t_begin 0: not started */
    rec *recs;
    size_t n, cap;
    const char **name_ptr; /* CUPTI's pointer, for the fast match */
    char **names;
    int nnames, names_cap;
    size_t dropped;
} kp = {.mu = PTHREAD_MUTEX_INITIALIZER};

static const CUpti_ActivityKind kinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMSET,
                                           CUPTI_ACTIVITY_KIND_MEMCPY};
#define NKINDS ((int)(sizeof kinds / sizeof kinds[0]))

static int sym(void *lib, const char *name, void *fn, size_t size, char *why, size_t cap) {
    void *p = dlsym(lib, name);
    if (!p) {
        snprintf(why, cap, "libcupti has no %s", name);
        return 1;
    }
    memcpy(fn, &p, size);
    return 0;
}
#define SYM(lib, name, field) sym((lib), (name), &kp.api.field, sizeof kp.api.field, why, cap)

static void *open_cupti(char *why, size_t cap) {
    char alt[2][512] = {"", ""};
    const char *home = getenv("CUDA_HOME");
    if (!home || !*home) home = "/usr/local/cuda";
    snprintf(alt[0], sizeof alt[0], "%s/lib64/libcupti.so", home);
    snprintf(alt[1], sizeof alt[1], "%s/extras/CUPTI/lib64/libcupti.so", home);
    const char *paths[] = {"libcupti.so", alt[0], alt[1], "libcupti.so.13", "libcupti.so.12"};
    char first[300] = "";
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
        void *lib = dlopen(paths[i], RTLD_NOW | RTLD_LOCAL);
        if (lib) return lib;
        if (!first[0]) snprintf(first, sizeof first, "%s", dlerror());
    }
    snprintf(why, cap, "libcupti.so not found (%s); it ships with the CUDA toolkit: set CUDA_HOME", first);
    return NULL;
}

static int cupti_ok(CUptiResult r, const char *call, char *why, size_t cap) {
    if (r == CUPTI_SUCCESS) return 1;
    const char *s = "?";
    if (kp.api.result_string) kp.api.result_string(r, &s);
    snprintf(why, cap, "%s failed: %s (%d)", call, s, (int)r);
    return 0;
}

/* ---- the record store: CUPTI's worker thread hands in buffers, the report reads them ---- */

static void *grow(void *p, size_t bytes) {
    void *q = realloc(p, bytes);
    NB_CHECK(q, "free some host memory, or run without --kernel-table", "out of memory for the kernel table (%zu bytes)", bytes);
    return q;
}

static int intern(const char *name) {
    for (int i = 0; i < kp.nnames; i++)
        if (kp.name_ptr[i] == name || !strcmp(kp.names[i], name)) return i;
    if (kp.nnames == kp.names_cap) {
        kp.names_cap = kp.names_cap ? 2 * kp.names_cap : 64;
        kp.names = grow(kp.names, (size_t)kp.names_cap * sizeof *kp.names);
        kp.name_ptr = grow(kp.name_ptr, (size_t)kp.names_cap * sizeof *kp.name_ptr);
    }
    kp.name_ptr[kp.nnames] = name;
    size_t len = strlen(name) + 1;
    kp.names[kp.nnames] = memcpy(grow(NULL, len), name, len);
    return kp.nnames++;
}

static void keep(uint64_t start, uint64_t end, const char *name, rec_kind kind) {
    if (!kp.t_begin || start < kp.t_begin) return; /* before the window */
    if (kp.n == kp.cap) {
        kp.cap = kp.cap ? 2 * kp.cap : 4096;
        kp.recs = grow(kp.recs, kp.cap * sizeof *kp.recs);
    }
    kp.recs[kp.n++] = (rec){start, end, intern(name), kind};
}

static const char *copy_name(uint8_t copy_kind) {
    switch (copy_kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "[copy host to device]";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "[copy device to host]";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "[copy device to device]";
    default: return "[copy, other kind]";
    }
}

static void take(const CUpti_Activity *a) {
    switch (a->kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)a;
        keep(k->start, k->end, k->name ? k->name : "?", REC_KERNEL);
        break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
        const CUpti_ActivityMemset4 *m = (const CUpti_ActivityMemset4 *)a;
        keep(m->start, m->end, "[memset]", REC_MEMSET);
        break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const CUpti_ActivityMemcpy6 *m = (const CUpti_ActivityMemcpy6 *)a;
        keep(m->start, m->end, copy_name(m->copyKind), REC_COPY);
        break;
    }
    default: break;
    }
}

#define BUF_BYTES ((size_t)8 << 20)

static void CUPTIAPI buffer_requested(uint8_t **buf, size_t *size, size_t *max_records) {
    *buf = aligned_alloc(8, BUF_BYTES);
    *size = *buf ? BUF_BYTES : 0; /* 0: CUPTI drops records and counts them */
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size, size_t valid) {
    (void)size;
    pthread_mutex_lock(&kp.mu);
    CUpti_Activity *a = NULL;
    while (kp.api.next_record(buf, valid, &a) == CUPTI_SUCCESS) take(a);
    size_t dropped = 0;
    if (kp.api.dropped(ctx, stream, &dropped) == CUPTI_SUCCESS) kp.dropped += dropped;
    pthread_mutex_unlock(&kp.mu);
    free(buf);
}

int nb_kprof_open(char *why, size_t cap) {
    if (kp.open) return 1;
    void *lib = open_cupti(why, cap);
    if (!lib) return 0;
    if (SYM(lib, "cuptiActivityRegisterCallbacks", register_callbacks) || SYM(lib, "cuptiActivityEnable", enable) ||
        SYM(lib, "cuptiActivityDisable", disable) || SYM(lib, "cuptiActivityFlushAll", flush_all) ||
        SYM(lib, "cuptiActivityGetNextRecord", next_record) || SYM(lib, "cuptiActivityGetNumDroppedRecords", dropped) ||
        SYM(lib, "cuptiGetTimestamp", timestamp) || SYM(lib, "cuptiGetResultString", result_string))
        return 0;
    void *dm = dlsym(RTLD_DEFAULT, "__cxa_demangle");
    if (dm) memcpy(&kp.api.demangle, &dm, sizeof dm);
    if (!cupti_ok(kp.api.register_callbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks", why,
                  cap))
        return 0;
    for (int i = 0; i < NKINDS; i++)
        if (!cupti_ok(kp.api.enable(kinds[i]), "cuptiActivityEnable", why, cap)) return 0;
    kp.open = 1;
    return 1;
}

static uint64_t now_ns(void) {
    uint64_t t = 0;
    if (kp.open) kp.api.timestamp(&t);
    return t;
}

void nb_kprof_mark_begin(void) {
    uint64_t t = now_ns();
    pthread_mutex_lock(&kp.mu);
    kp.t_begin = t ? t : 1;
    pthread_mutex_unlock(&kp.mu);
}

void nb_kprof_mark_end(void) {
    uint64_t t = now_ns();
    pthread_mutex_lock(&kp.mu);
    kp.t_end = t;
    pthread_mutex_unlock(&kp.mu);
}

/* ---- the report ---- */

/* "void flash_fwd<64, true>(fa_dims, ...)" -> "flash_fwd<64, true>": the parameter list and the
 * return type say nothing the name does not */
static void short_name(const char *mangled, char *out, size_t cap) {
    char *dem = NULL;
    int status = -1;
    if (kp.api.demangle && mangled[0] == '_' && mangled[1] == 'Z') dem = kp.api.demangle(mangled, NULL, NULL, &status);
    const char *s = (dem && status == 0) ? dem : mangled;
    if (!strncmp(s, "void ", 5)) s += 5;
    size_t len = strlen(s), depth = 0, cut = len;
    for (size_t i = 0; i < len; i++) { /* the first '(' outside template brackets */
        if (s[i] == '<') depth++;
        else if (s[i] == '>' && depth) depth--;
        else if (s[i] == '(' && !depth && i > 0) {
            cut = i;
            break;
        }
    }
    if (cut >= cap) cut = cap - 1;
    memcpy(out, s, cut);
    out[cut] = 0;
    if (cut == cap - 1 && cap > 4) memcpy(out + cap - 4, "...", 4);
    free(dem);
}

typedef struct {
    int name, calls;
    uint64_t ns;
} agg;

static int by_start(const void *a, const void *b) {
    uint64_t x = ((const rec *)a)->start, y = ((const rec *)b)->start;
    return (x > y) - (x < y);
}
static int by_time(const void *a, const void *b) {
    uint64_t x = ((const agg *)a)->ns, y = ((const agg *)b)->ns;
    return (x < y) - (x > y);
}

/* time the device ran anything: the union of the records' intervals (side lanes overlap) */
static uint64_t busy_ns(rec *r, size_t n) {
    qsort(r, n, sizeof *r, by_start);
    uint64_t busy = 0, lo = 0, hi = 0;
    for (size_t i = 0; i < n; i++) {
        if (i == 0 || r[i].start > hi) {
            busy += hi - lo;
            lo = r[i].start, hi = r[i].end;
        } else if (r[i].end > hi) {
            hi = r[i].end;
        }
    }
    return n ? busy + (hi - lo) : 0;
}

void nb_kprof_report(FILE *f, int steps, int rows) {
    if (!kp.open) return;
    kp.api.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    for (int i = 0; i < NKINDS; i++) kp.api.disable(kinds[i]);
    pthread_mutex_lock(&kp.mu);
    size_t n = 0, counts[3] = {0, 0, 0};
    for (size_t i = 0; i < kp.n; i++) /* the window's end: work after it (the last evaluation) is left out */
        if (kp.recs[i].start <= kp.t_end) kp.recs[n++] = kp.recs[i], counts[kp.recs[i].kind]++;
    double per = steps > 0 ? 1.0 / steps : 0.0, wall_ms = 1e-6 * (double)(kp.t_end - kp.t_begin) * per;
    if (!kp.t_begin || !kp.t_end || kp.t_end <= kp.t_begin || steps < 1 || !n) {
        fprintf(f, "kernels     no table: no device work was recorded in the window (%d steps)\n", steps);
        pthread_mutex_unlock(&kp.mu);
        return;
    }
    agg *g = nb_calloc((size_t)kp.nnames, sizeof *g, "kernel table");
    uint64_t total = 0;
    for (int i = 0; i < kp.nnames; i++) g[i].name = i;
    for (size_t i = 0; i < n; i++) {
        uint64_t d = kp.recs[i].end > kp.recs[i].start ? kp.recs[i].end - kp.recs[i].start : 0;
        g[kp.recs[i].name].ns += d, g[kp.recs[i].name].calls++, total += d;
    }
    double busy_ms = 1e-6 * (double)busy_ns(kp.recs, n) * per;
    qsort(g, (size_t)kp.nnames, sizeof *g, by_time);
    fprintf(f,
            "kernels     per step over %d steps (CUPTI): %.0f launches (%.0f kernels, %.0f memsets, %.0f copies); the "
            "device busy %.3f of %.3f ms (%.1f%%), idle between launches %.3f ms\n",
            steps, (double)n * per, (double)counts[REC_KERNEL] * per, (double)counts[REC_MEMSET] * per,
            (double)counts[REC_COPY] * per, busy_ms, wall_ms, wall_ms > 0 ? 100.0 * busy_ms / wall_ms : 0.0,
            wall_ms > busy_ms ? wall_ms - busy_ms : 0.0);
    fprintf(f, "  %9s %6s %7s %9s  %s\n", "ms/step", "share", "calls", "us/call", "kernel");
    double rest_ms = 0.0;
    int rest = 0;
    for (int i = 0; i < kp.nnames && g[i].calls; i++) {
        double ms = 1e-6 * (double)g[i].ns * per;
        if (i >= rows) {
            rest_ms += ms, rest++;
            continue;
        }
        char nm[100];
        short_name(kp.names[g[i].name], nm, sizeof nm);
        fprintf(f, "  %9.3f %5.1f%% %7.1f %9.2f  %s\n", ms, 100.0 * (double)g[i].ns / (double)total, g[i].calls * per,
                1e-3 * (double)g[i].ns / g[i].calls, nm);
    }
    if (rest) fprintf(f, "  %9.3f %5.1f%% %7s %9s  (%d more kernels)\n", rest_ms, 100.0 * rest_ms / (1e-6 * total * per), "", "", rest);
    if (kp.dropped) fprintf(f, "  note: CUPTI dropped %zu records (the table undercounts)\n", kp.dropped);
    free(g);
    kp.open = 0;
    pthread_mutex_unlock(&kp.mu);
}

#endif
