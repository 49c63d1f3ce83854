/* The runner's state and the row-side reporting (optest.h). */
#include <stdarg.h>
#include <sys/wait.h>
#include <unistd.h>

#include "optest.h"

const ot_row *ot_cur;
int ot_mode = OT_EVAL;
int ot_small, ot_verbose, ot_threads = 1;
uint64_t ot_stream = 1;
int ot_extra_argc;
char **ot_extra_argv;

/* Per-row results, read by the runner through ot_row_result. */
static int failures, row_failures, row_skipped;
static double row_err = -1, row_tol, row_ratio = -1;
static char row_skip_why[160];

void ot_fail(const char *file, int line, const char *cond, const char *fmt, ...) {
    fprintf(stderr, "  FAIL %s:%d: %s: ", file, line, cond);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    failures++, row_failures++;
}

/* Keeps the error that is largest relative to its tolerance (a NaN or inf one wins). */
void ot_err(double err, double tol) {
    double ratio = isfinite(err) ? err / (tol > 0 ? tol : 1e-300) : INFINITY;
    if (ratio > row_ratio || row_ratio < 0) row_ratio = ratio, row_err = err, row_tol = tol;
}

void ot_log(const char *fmt, ...) {
    if (!ot_verbose && ot_mode != OT_PERF) return;
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    fflush(stdout);
}

void ot_skip(const char *why) {
    row_skipped = 1;
    snprintf(row_skip_why, sizeof row_skip_why, "%s", why);
}

int ot_failures(void) { return failures; }

/* For the runner: resets the row's results (ot_row_begin) and reads them (ot_row_end). */
void ot_row_begin(const ot_row *r, int mode) {
    ot_cur = r, ot_mode = mode, ot_stream = 1;
    row_failures = row_skipped = 0, row_err = -1, row_tol = 0, row_ratio = -1, row_skip_why[0] = 0;
}
int ot_row_end(double *err, double *tol, const char **skip_why) {
    *err = row_err, *tol = row_tol;
    *skip_why = row_skipped ? row_skip_why : NULL;
    return row_failures;
}

int ot_child_status(void (*fn)(void)) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        if (!freopen("/dev/null", "w", stderr)) _exit(3);
        fn();
        _exit(0);
    }
    int status = 0;
    if (waitpid(pid, &status, 0) != pid) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}
