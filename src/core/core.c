#define _POSIX_C_SOURCE 200809L
#include "core.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int nb_verbosity = 1;

static _Atomic(nb_fail_hook_fn) fail_hook;
void nb_set_fail_hook(nb_fail_hook_fn fn) { atomic_store(&fail_hook, fn); }

void nb_fail_at(const char *file, int line, const char *hint, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* One line, so scripts and people can grep it. */
    if (hint && hint[0])
        fprintf(stderr, "nobubble: error: %s (hint: %s) [%s:%d]\n", msg, hint, file, line);
    else
        fprintf(stderr, "nobubble: error: %s [%s:%d]\n", msg, file, line);
    fflush(stderr);
    /* exchange: two threads failing at once run the hook once, and a hook that fails ends here */
    nb_fail_hook_fn hook = atomic_exchange(&fail_hook, (nb_fail_hook_fn)NULL);
    if (hook) hook();
    exit(1);
}

static NB_NORETURN void fail_oom(const char *file, int line, size_t bytes, const char *what) {
    char b[32];
    nb_fail_at(file, line, "lower --batch or --seq, or pick a smaller preset",
               "out of host memory allocating %s for %s", nb_fmt_bytes(b, sizeof b, (double)bytes),
               what);
}

void *nb_malloc_at(const char *file, int line, size_t bytes, const char *what) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) fail_oom(file, line, bytes, what);
    return p;
}

void *nb_calloc_at(const char *file, int line, size_t n, size_t size, const char *what) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) fail_oom(file, line, n * size, what);
    return p;
}

/* Zeroing a fresh buffer also faults its pages in, a few GB/s per core: a 14B-parameter model's
 * 200 GB of host state takes over a minute on one core, seconds on all of them. */
void nb_zero_par(void *p, size_t bytes) {
    const size_t chunk = (size_t)1 << 24;
    long n = (long)((bytes + chunk - 1) / chunk);
#pragma omp parallel for schedule(static) if (n > 4)
    for (long i = 0; i < n; i++) {
        size_t o = (size_t)i * chunk;
        memset((char *)p + o, 0, bytes - o < chunk ? bytes - o : chunk);
    }
}

void *nb_aligned_alloc_at(const char *file, int line, size_t bytes, const char *what) {
    void *p = NULL;
    if (posix_memalign(&p, NB_ALIGN, nb_align_up(bytes ? bytes : 1, NB_ALIGN)) != 0)
        fail_oom(file, line, bytes, what);
    nb_zero_par(p, nb_align_up(bytes ? bytes : 1, NB_ALIGN));
    return p;
}

FILE *nb_fopen_at(const char *file, int line, const char *path, const char *mode, const char *hint) {
    FILE *f = fopen(path, mode);
    if (!f)
        nb_fail_at(file, line, hint ? hint : "check the path and its permissions",
                   "cannot open '%s' (%s): %s", path, mode[0] == 'r' ? "read" : "write",
                   strerror(errno));
    return f;
}

double nb_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void nb_log(int level, const char *fmt, ...) {
    if (level > nb_verbosity) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
}

const char *nb_fmt_bytes(char *buf, size_t cap, double bytes) {
    const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (bytes >= 1024.0 && u < 4) {
        bytes /= 1024.0;
        u++;
    }
    snprintf(buf, cap, u ? "%.2f %s" : "%.0f %s", bytes, units[u]);
    return buf;
}
