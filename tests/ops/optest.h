/* The op-test table (tests/test_ops.c runs it): one row per op x backend x dtype (x shape group).
 * A row names the op, the backend (cpu: the CPU ops against double references; cuda: the CUDA
 * ops against the CPU ops; emu: the CUDA kernels' C code on tests/ops/emu_*.c's CPU emulator of
 * the GPU), the dtype, the shapes, the tolerance printed, the modes it has (eval: the forward and
 * the gradient semantics against the reference; grad: gradients against finite differences; perf:
 * timing) and the function that checks it. Adding an op adds a row to its family's table
 * (tests/ops/FAMILY.c) and, for a new family, the table to tests/test_ops.c's list.
 *
 * A row's function reads its row (ot_cur: dtype, arg) and the mode it runs in (ot_mode), checks
 * with CHECK (a failure is printed with file:line and fails the row) and reports each error it
 * compares with ot_err(err, tol) (the row line shows the worst one relative to its tolerance).
 * Detail lines go through ot_log (printed with --verbose, or in perf mode). */
#ifndef NB_OPTEST_H
#define NB_OPTEST_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../rel_err.h"

enum { OT_EVAL = 1, OT_GRAD = 2, OT_PERF = 4 };
enum { OT_F32 = 0, OT_BF16 = 1, OT_BOTH = 2, OT_NONE = 3 }; /* BOTH: one row loops over f32 and bf16 */
enum {
    OT_FULL = 1,  /* only with --all-shapes (redundant or slow beside the default rows) */
    OT_FORK = 2,  /* a death test that forks: run before the OpenMP/BLAS thread pools exist */
    OT_SMALL = 4, /* the row --small keeps (a small case, e.g. for compute-sanitizer) */
};

typedef struct ot_row {
    const char *op;      /* the op (or op group) checked */
    const char *backend; /* "cpu", "cuda" or "emu" */
    int dtype;           /* OT_F32, OT_BF16, OT_BOTH, OT_NONE */
    const char *shape;   /* the shapes, as printed */
    double tol;          /* the main tolerance, as printed (a row's checks may use tighter ones too) */
    int modes;           /* OT_EVAL | OT_GRAD | OT_PERF */
    void (*fn)(void);    /* the check; reads ot_cur and ot_mode */
    int arg;             /* a variant for functions shared by rows (a shape index, ...) */
    unsigned flags;      /* OT_FULL, OT_FORK, OT_SMALL */
} ot_row;

typedef struct {
    const char *name;
    const ot_row *rows;
    int n;
} ot_table;
#define OT_TABLE(name, rows) const ot_table name = {#name, rows, (int)(sizeof rows / sizeof rows[0])}
#define OT_EMPTY_TABLE(name) const ot_table name = {#name, NULL, 0}

extern const ot_row *ot_cur;   /* the row running */
extern int ot_mode;            /* the mode it runs in */
extern int ot_small;           /* --small */
extern int ot_verbose;         /* --verbose */
extern int ot_threads;         /* OpenMP threads at start (rows that change them restore this) */
extern uint64_t ot_stream;     /* the next random stream: 1 at the start of every row */
extern int ot_extra_argc;      /* arguments after `--` (perf rows' own options) */
extern char **ot_extra_argv;

void ot_fail(const char *file, int line, const char *cond, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void ot_err(double err, double tol);
void ot_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void ot_skip(const char *why); /* the row cannot run here (no GPU, no cuDNN): SKIP, not PASS */
int ot_failures(void);

/* For the runner (tests/test_ops.c): a row's start and results (util.c), and the GPU (cuda_util.c:
 * 1 when there is one, else 0 and why). */
void ot_row_begin(const ot_row *r, int mode);
int ot_row_end(double *err, double *tol, const char **skip_why);
int ot_cuda_ready(const char **why);

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) ot_fail(__FILE__, __LINE__, #cond, __VA_ARGS__);                              \
    } while (0)
#define TEST_CASE(name) static void name(void)
/* The row's dtype as the loop variable bf of a body written for both (a BOTH row runs both). */
#define FOR_DTYPE(bf)                                                                              \
    for (int bf = ot_cur->dtype == OT_BF16; bf <= (ot_cur->dtype == OT_F32 ? 0 : 1); bf++)
static inline int ot_eval(void) { return ot_mode == OT_EVAL; }
static inline int ot_grad(void) { return ot_mode == OT_GRAD; }

/* Runs fn in a child process (stderr to /dev/null) and returns its exit status, or -1 if it
 * did not exit: the death tests (a bad input must end in nb_fail's exit 1, not a wild access). */
int ot_child_status(void (*fn)(void));

#endif
