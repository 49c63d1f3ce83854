/* The op tests: one table of rows (op x backend x dtype), tests/ops/FAMILY.c, run here.
 *
 *   build/tests/test_ops [--mode eval|grad|perf|all] [--backend cpu|cuda|emu] [--op PATTERNS]
 *                        [--dtype f32|bf16] [--list] [--small] [--all-shapes] [--verbose] [-- ARGS]
 *
 * Modes: eval (default with grad): each op against its reference (cpu rows: a double-precision
 * formula written in the row's file; cuda rows: the CPU op on the same inputs, outputs
 * NaN-poisoned first, gradients accumulated onto random values, two runs bitwise equal, NULL
 * gradients skipped; emu rows: the CUDA kernels' C code on the CPU emulator of the GPU, under two
 * schedules that must give the same bits); grad: every analytic gradient of the CPU ops against
 * central finite differences; perf: the GPU timings (ARGS after `--` go to the perf rows, e.g. the
 * seqctr bench's SPEC TABLE_CAP B); all: the three. --op takes shell patterns separated by commas
 * ('matmul*,xent'); --list prints the table (the rows --backend, --op, --dtype and --mode select).
 * Prints one line per row (verdict, mode, backend, dtype, op, shapes, wall and CPU seconds, the
 * worst error against its tolerance or why the row skipped), FAIL details on stderr, then a summary. Exit 0: every row that
 * ran passed; 1: a row failed; 77: every selected row skipped (no GPU, built without CUDA, nothing
 * selected).
 *
 * What the default covers and what --all-shapes adds: every row of every backend runs by default,
 * the emulator's included. The emu rows used to be the slow part of CI (test_ctr_tc 175 s and
 * test_attention_fa's emulator minutes on 2 cores): glibc's swapcontext makes a system call per
 * switch and mma.sync's emulation unpacked the whole warp's fragments in every lane; with
 * emu_ctx.h's switch and the lane reading only its own operands, all 20 emu rows (each attention_fa
 * kernel on 6 shapes, seqattn_tc on 6 history sets, emb_grad_unique on 6 lookup sets incl. the
 * 100k-lookup hot row) take ~7 s of CPU, the whole default run ~10 s. So nothing is trimmed and
 * --all-shapes adds nothing today; it is where a row flagged OT_FULL (a shape too slow or too
 * redundant for CI) goes.
 * --small keeps the cpu rows (all small) and the rows flagged small of the cuda and emu backends:
 * one small case per kernel family (tests/asan_test.sh runs it under ASan, compute-sanitizer's
 * runs on the GPU want few launches). */
#include <fnmatch.h>
#include <omp.h>
#include <string.h>
#include <time.h>

#include "core.h"
#include "ops/optest.h"

extern const ot_table ot_dense, ot_headnorm, ot_headnorm_cuda, ot_attention, ot_optim, ot_ctr, ot_dense_cuda, ot_fused_cuda, ot_perf_cuda,
    ot_ctr_cuda, ot_ctr_cuda_b, ot_perf_ctr_cuda, ot_attention_fa_cuda, ot_attention_cudnn, ot_emu_fa, ot_emu_tc, ot_fill_cuda;
/* the families' tables, in the order they run (a new family adds its table here) */
static const ot_table *const TABLES[] = {
    &ot_dense,    &ot_headnorm, &ot_attention,       &ot_optim,  &ot_ctr,    &ot_dense_cuda, &ot_headnorm_cuda,
    &ot_fused_cuda, &ot_fill_cuda, &ot_ctr_cuda,
    &ot_ctr_cuda_b, &ot_attention_fa_cuda, &ot_attention_cudnn, &ot_emu_fa, &ot_emu_tc, &ot_perf_cuda,
    &ot_perf_ctr_cuda,
};
#define NTABLES (int)(sizeof TABLES / sizeof TABLES[0])

static const char *const DTYPE[] = {"f32", "bf16", "f32+bf16", "-"};
static const char *const MODE_NAME[] = {"", "eval", "grad", "", "perf"};

typedef struct {
    int modes, mode_given, all_shapes, list;
    const char *backend, *op, *dtype;
} opts;

static void usage(void) {
    fprintf(stderr, "usage: test_ops [--mode eval|grad|perf|all] [--backend cpu|cuda|emu] [--op PATTERNS] "
                    "[--dtype f32|bf16] [--list] [--small] [--all-shapes] [--verbose] [-- ARGS for perf rows]\n");
    exit(2);
}

static opts parse(int argc, char **argv) {
    opts o = {OT_EVAL | OT_GRAD, 0, 0, 0, NULL, NULL, NULL};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--")) {
            ot_extra_argc = argc - i - 1, ot_extra_argv = argv + i + 1;
            break;
        } else if (!strcmp(a, "--mode") && v) {
            o.modes = !strcmp(v, "eval") ? OT_EVAL : !strcmp(v, "grad") ? OT_GRAD : !strcmp(v, "perf") ? OT_PERF
                      : !strcmp(v, "all") ? OT_EVAL | OT_GRAD | OT_PERF : 0;
            if (!o.modes) usage();
            o.mode_given = 1, i++;
        } else if (!strcmp(a, "--backend") && v) {
            if (strcmp(v, "cpu") && strcmp(v, "cuda") && strcmp(v, "emu")) usage();
            o.backend = v, i++;
        } else if (!strcmp(a, "--op") && v) {
            o.op = v, i++;
        } else if (!strcmp(a, "--dtype") && v) {
            if (strcmp(v, "f32") && strcmp(v, "bf16")) usage();
            o.dtype = v, i++;
        } else if (!strcmp(a, "--list")) {
            o.list = 1;
        } else if (!strcmp(a, "--small")) {
            ot_small = 1;
        } else if (!strcmp(a, "--all-shapes")) {
            o.all_shapes = 1;
        } else if (!strcmp(a, "--verbose")) {
            ot_verbose = 1;
        } else {
            usage();
        }
    }
    return o;
}

/* --op: shell patterns separated by commas ("emb_*,lists"). */
static int op_matches(const char *patterns, const char *op) {
    char buf[512];
    snprintf(buf, sizeof buf, "%s", patterns);
    for (char *save = NULL, *p = strtok_r(buf, ",", &save); p; p = strtok_r(NULL, ",", &save))
        if (!fnmatch(p, op, 0)) return 1;
    return 0;
}

static int selected(const opts *o, const ot_row *r, int mode) {
    if (!(r->modes & mode)) return 0;
    if (o->backend && strcmp(o->backend, r->backend)) return 0;
    if (o->op && !op_matches(o->op, r->op)) return 0;
    if (o->dtype) {
        int want = !strcmp(o->dtype, "bf16") ? OT_BF16 : OT_F32;
        if (r->dtype != want && r->dtype != OT_BOTH) return 0;
    }
    if ((r->flags & OT_FULL) && !o->all_shapes) return 0;
    if (ot_small && !(r->flags & OT_SMALL) && strcmp(r->backend, "cpu")) return 0;
    return 1;
}

typedef struct {
    int run, pass, fail, skip;
} tally;

static void run_row(const ot_row *r, int mode, tally *t) {
    const char *why = NULL;
    double t0 = nb_now(), c0 = (double)clock() / CLOCKS_PER_SEC, err = -1, tol = 0;
    int nfail = 0;
    if (!r->fn) why = "built without CUDA";
    else if (!strcmp(r->backend, "cuda") && !ot_cuda_ready(&why)) {
    } else {
        fflush(stdout);
        ot_row_begin(r, mode);
        r->fn();
        omp_set_num_threads(ot_threads);
        nfail = ot_row_end(&err, &tol, &why);
    }
    const char *verdict = nfail ? "FAIL" : why ? "SKIP" : "PASS";
    char e[200] = "-";
    if (why && !nfail) snprintf(e, sizeof e, "(%s)", why);
    else if (err >= 0) snprintf(e, sizeof e, "err %.2e tol %.0e", err, tol);
    else if (mode != OT_PERF) snprintf(e, sizeof e, "exact checks");
    printf("%s %-4s %-4s %-8s %-22s %-34s %7.2f s (cpu %6.2f)  %s\n", verdict, MODE_NAME[mode], r->backend,
           DTYPE[r->dtype], r->op, r->shape, nb_now() - t0, (double)clock() / CLOCKS_PER_SEC - c0, e);
    fflush(stdout);
    t->run++;
    if (nfail) t->fail++;
    else if (why) t->skip++;
    else t->pass++;
}

int main(int argc, char **argv) {
    opts o = parse(argc, argv);
    ot_threads = omp_get_max_threads();
    int nrows = 0;
    for (int k = 0; k < NTABLES; k++) nrows += TABLES[k]->n;
    if (o.list) {
        for (int k = 0; k < NTABLES; k++)
            for (int i = 0; i < TABLES[k]->n; i++) {
                const ot_row *r = &TABLES[k]->rows[i];
                int any = 0, lm = o.mode_given ? o.modes : OT_EVAL | OT_GRAD | OT_PERF;
                for (int m = OT_EVAL; m <= OT_PERF; m <<= 1) any |= (lm & m) && selected(&o, r, m);
                if (!any) continue;
                char tol[16] = "-";
                if (r->tol > 0) snprintf(tol, sizeof tol, "%.0e", r->tol);
                printf("%-4s %-8s %-22s %-34s tol %-6s %s%s%s%s\n", r->backend, DTYPE[r->dtype], r->op, r->shape, tol,
                       r->modes & OT_EVAL ? "eval " : "", r->modes & OT_GRAD ? "grad " : "",
                       r->modes & OT_PERF ? "perf " : "", r->flags & OT_FULL ? "(--all-shapes)" : "");
            }
        printf("%d rows in the table\n", nrows);
        return 0;
    }
    tally t = {0};
    double t0 = nb_now();
    /* death tests first: they fork, which must happen before OpenMP's and BLAS's threads exist */
    for (int pass = 0; pass < 2; pass++)
        for (int mode = OT_EVAL; mode <= OT_PERF; mode <<= 1) {
            if (!(o.modes & mode)) continue;
            for (int k = 0; k < NTABLES; k++)
                for (int i = 0; i < TABLES[k]->n; i++) {
                    const ot_row *r = &TABLES[k]->rows[i];
                    if (!!(r->flags & OT_FORK) == (pass == 0) && selected(&o, r, mode)) run_row(r, mode, &t);
                }
        }
    printf("test_ops: %d rows run: %d passed, %d failed, %d skipped (%d in the table); %.1f s\n", t.run, t.pass,
           t.fail, t.skip, nrows, nb_now() - t0);
    if (t.fail || ot_failures()) return 1;
    return t.pass ? 0 : 77;
}
