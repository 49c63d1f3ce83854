/* nobubble core: errors, checked allocation, clocks, logging.
 *
 * Every failure a user can cause ends in nb_fail(): one line on stderr that names what went
 * wrong, a hint that says what to do, and the file:line that detected it; then exit(1).
 * Nothing is half-written when we exit: writers go through temp files + rename (io/). */
#ifndef NB_CORE_H
#define NB_CORE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define NB_NORETURN __attribute__((noreturn))
#define NB_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define NB_NORETURN
#define NB_PRINTF(a, b)
#endif

/* Print "nobubble: error: <msg> (hint: <hint>) [file:line]" and exit(1). hint may be NULL. */
NB_NORETURN void nb_fail_at(const char *file, int line, const char *hint, const char *fmt, ...)
    NB_PRINTF(4, 5);
#define nb_fail(hint, ...) nb_fail_at(__FILE__, __LINE__, (hint), __VA_ARGS__)
/* Called once by nb_fail_at after its message is printed and before exit(1), from whichever thread
 * failed (the first failure only): comm/ sets it to abort the whole MPI job, so that no other rank
 * waits for this one. Keep it short; it must not call nb_fail. NULL removes it. */
typedef void (*nb_fail_hook_fn)(void);
void nb_set_fail_hook(nb_fail_hook_fn fn);
/* The exit status nb_fail ends the process with: 1 unless set. Code that reads a user's input
 * files before anything runs (a Hugging Face import) sets 2, "bad input", for that span, so that
 * every refusal inside it (its own, and the JSON and safetensors readers') exits 2. Returns the
 * previous status. */
int nb_fail_set_exit_code(int code);

/* Check a condition that user input can break. */
#define NB_CHECK(cond, hint, ...)                                                                  \
    do {                                                                                           \
        if (!(cond)) nb_fail_at(__FILE__, __LINE__, (hint), __VA_ARGS__);                          \
    } while (0)

/* Internal invariant: a failure here is a nobubble bug, not a user error. */
#define NB_ASSERT(cond)                                                                            \
    do {                                                                                           \
        if (!(cond))                                                                               \
            nb_fail_at(__FILE__, __LINE__, "this is a bug in nobubble; please report it",         \
                       "internal check failed: %s", #cond);                                        \
    } while (0)

/* Checked libc wrappers: fail with what was being allocated/opened and errno's text. */
void *nb_malloc_at(const char *file, int line, size_t bytes, const char *what);
void *nb_calloc_at(const char *file, int line, size_t n, size_t size, const char *what);
/* 256-byte aligned, zeroed. Free with free(). */
void *nb_aligned_alloc_at(const char *file, int line, size_t bytes, const char *what);
/* memset to zero on every core (first touch of large buffers) */
void nb_zero_par(void *p, size_t bytes);
/* Does anything exist at path (stat succeeds)? */
int nb_file_exists(const char *path);
/* Read modes ("r", "rb") open through nb_open_input: only regular files are accepted. */
FILE *nb_fopen_at(const char *file, int line, const char *path, const char *mode, const char *hint);
/* Open an input file read-only. Anything but a regular file (a FIFO, a device such as /dev/zero,
 * a directory, a socket) is refused before a read could block or run forever: the open itself
 * uses O_NONBLOCK, so a named pipe without a writer cannot hang it. Symlinks are followed and
 * judged by their target. Returns the descriptor (blocking again) and, when size is not NULL,
 * the file's size. Failures end in nb_fail naming the file; hint NULL gives a default one. */
int nb_open_input_at(const char *file, int line, const char *path, const char *hint, size_t *size);
/* A whole input file (nb_open_input rules) in a malloc'd buffer with a NUL after the last byte
 * (not counted in *len). A file over max bytes is refused before its contents are read. */
char *nb_read_file_at(const char *file, int line, const char *path, size_t max, size_t *len,
                      const char *hint);
#define nb_malloc(bytes, what) nb_malloc_at(__FILE__, __LINE__, (bytes), (what))
#define nb_calloc(n, size, what) nb_calloc_at(__FILE__, __LINE__, (n), (size), (what))
#define nb_aligned_alloc(bytes, what) nb_aligned_alloc_at(__FILE__, __LINE__, (bytes), (what))
#define nb_fopen(path, mode, hint) nb_fopen_at(__FILE__, __LINE__, (path), (mode), (hint))
#define nb_open_input(path, hint, size) nb_open_input_at(__FILE__, __LINE__, (path), (hint), (size))
#define nb_read_file(path, max, len, hint) nb_read_file_at(__FILE__, __LINE__, (path), (max), (len), (hint))

/* The longest path a run keeps (run directory, data, checkpoint); longer ones are refused. */
#define NB_PATH_MAX 1024
#define NB_ALIGN 256
static inline size_t nb_align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

/* Monotonic clock in seconds (CLOCK_MONOTONIC), shared by lanes' spans and step timing. */
double nb_now(void);

/* Verbosity: 0 quiet, 1 normal (default), 2 debug. nb_log goes to stderr. */
extern int nb_verbosity;
void nb_log(int level, const char *fmt, ...) NB_PRINTF(2, 3);

/* Human-readable byte count into buf ("1.50 GiB"). Returns buf. */
const char *nb_fmt_bytes(char *buf, size_t cap, double bytes);
/* A count with thousands separated into buf ("16,384"). Returns buf. */
const char *nb_fmt_count(char *buf, size_t cap, unsigned long long v);

#ifdef __cplusplus
}
#endif
#endif
