#define _POSIX_C_SOURCE 200809L
#include "core.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int nb_verbosity = 1;

static _Atomic(nb_fail_hook_fn) fail_hook;
void nb_set_fail_hook(nb_fail_hook_fn fn) { atomic_store(&fail_hook, fn); }
static atomic_int fail_exit_code = 1;
int nb_fail_set_exit_code(int code) { return atomic_exchange(&fail_exit_code, code); }

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
    exit(atomic_load(&fail_exit_code));
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

#define OPEN_HINT "check the path and its permissions"

static const char *file_kind(mode_t m) {
    if (S_ISFIFO(m)) return "a FIFO (named pipe)";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISDIR(m)) return "a directory";
    if (S_ISSOCK(m)) return "a socket";
    return "not a regular file";
}

int nb_open_input_at(const char *file, int line, const char *path, const char *hint, size_t *size) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        nb_fail_at(file, line, hint ? hint : OPEN_HINT, "cannot open '%s' (read): %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        nb_fail_at(file, line, hint ? hint : OPEN_HINT, "cannot inspect '%s': %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        nb_fail_at(file, line, "nobubble reads whole files: save the data to a regular file and pass that",
                   "'%s' is %s, not a regular file", path, file_kind(st.st_mode));
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        int e = errno;
        close(fd);
        nb_fail_at(file, line, hint ? hint : OPEN_HINT, "cannot set up reading '%s': %s", path, strerror(e));
    }
    if (size) *size = (size_t)st.st_size;
    return fd;
}

FILE *nb_fopen_at(const char *file, int line, const char *path, const char *mode, const char *hint) {
    if (mode[0] == 'r' && !strchr(mode, '+')) {
        int fd = nb_open_input_at(file, line, path, hint, NULL);
        FILE *f = fdopen(fd, mode);
        if (!f) {
            int e = errno;
            close(fd);
            nb_fail_at(file, line, "free some host memory", "cannot open a stream on '%s': %s", path, strerror(e));
        }
        return f;
    }
    FILE *f = fopen(path, mode);
    if (!f)
        nb_fail_at(file, line, hint ? hint : OPEN_HINT, "cannot open '%s' (%s): %s", path,
                   mode[0] == 'r' ? "read" : "write", strerror(errno));
    return f;
}

/* read(2) that retries on EINTR; -1 with errno set on failure. */
static ssize_t read_some(int fd, void *dst, size_t n) {
    for (;;) {
        ssize_t got = read(fd, dst, n);
        if (got >= 0 || errno != EINTR) return got;
    }
}

char *nb_read_file_at(const char *file, int line, const char *path, size_t max, size_t *len, const char *hint) {
    NB_ASSERT(max < SIZE_MAX / 2);
    size_t size;
    int fd = nb_open_input_at(file, line, path, hint, &size);
    char b1[32], b2[32];
    const char *big_hint = hint ? hint : "pass the right file";
    if (size > max) {
        close(fd);
        nb_fail_at(file, line, big_hint, "'%s' is %s, more than the %s such a file can be", path,
                   nb_fmt_bytes(b1, sizeof b1, (double)size), nb_fmt_bytes(b2, sizeof b2, (double)max));
    }
    /* The size is a first guess only: files in /proc say 0, and a file may grow while we read. */
    size_t cap = size + 1, n = 0;
    char *buf = nb_malloc_at(file, line, cap, path);
    int e = 0;
    for (;;) {
        char extra;
        ssize_t got = n + 1 < cap ? read_some(fd, buf + n, cap - 1 - n) : read_some(fd, &extra, 1);
        if (got < 0) e = errno;
        if (got <= 0) break;
        if (n + 1 == cap) { /* more than the guess: grow, up to one byte past max */
            if (n >= max) {
                n++;
                break;
            }
            cap = cap < (max + 2) / 2 ? 2 * cap : max + 2;
            char *grown = realloc(buf, cap);
            if (!grown) fail_oom(file, line, cap, path);
            buf = grown;
            buf[n] = extra;
        }
        n += (size_t)got;
    }
    close(fd);
    if (e) nb_fail_at(file, line, hint ? hint : "check the file and the disk", "cannot read '%s': %s", path, strerror(e));
    if (n > max)
        nb_fail_at(file, line, big_hint, "'%s' is more than the %s such a file can be", path,
                   nb_fmt_bytes(b2, sizeof b2, (double)max));
    buf[n] = '\0';
    *len = n;
    return buf;
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

const char *nb_fmt_count(char *buf, size_t cap, unsigned long long v) {
    char digits[32];
    int n = snprintf(digits, sizeof digits, "%llu", v);
    size_t o = 0;
    for (int i = 0; i < n && o + 2 < cap; i++) {
        if (i && (n - i) % 3 == 0) buf[o++] = ',';
        buf[o++] = digits[i];
    }
    if (cap) buf[o < cap ? o : cap - 1] = 0;
    return buf;
}

int nb_file_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}
