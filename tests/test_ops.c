/* The op tests: one table of rows (op x backend x dtype), tests/ops/FAMILY.c, run here.
 *
 *   build/tests/test_ops [--mode eval|grad|perf|all] [--backend cpu|cuda|emu] [--op NAME]
 *                        [--dtype f32|bf16] [--list] [--small] [--all-shapes] [--verbose] [-- ARGS]
 *
 * Modes: eval (default with grad): each op against its reference (cpu rows: a double-precision
 * formula written in the row's file; cuda rows: the CPU op on the same inputs, outputs
 * NaN-poisoned first, gradients accumulated onto random values, two runs bitwise equal, NULL
 * gradients skipped; emu rows: the CUDA kernels' C code on the CPU emulator of the GPU, under two
 * schedules that must give the same bits); grad: every analytic gradient of the CPU ops against
 * central finite differences; perf: the GPU timings (ARGS after `--` go to the perf rows, e.g. the
 * seqctr bench's SPEC TABLE_CAP B); all: the three. --op takes a shell pattern (fnmatch: 'matmul*').
 * Prints one line per row (verdict, mode, backend, dtype, op, shapes, the worst error against its
 * tolerance, seconds), FAIL details on stderr, then a summary. Exit 0: every row that ran passed;
 * 1: a row failed; 77: every selected row skipped (no GPU, built without CUDA, nothing selected).
 *
 * What the default covers and what --all-shapes adds (CI runs the default; 2 cores):
 * - cpu and cuda rows: every case, always (they are fast);
 * - emu fa (attention_fa.cu's kernels): each default kernel on one token, GQA 2, two batches and
 *   T past two tiles, for HS 64 and 128, and every other compiled variant on one GQA shape (T 100);
 *   --all-shapes adds the second HS 128 shape (T 150), the same as T 130 at HS 64 for the tile walk;
 * - emu tc (seqattn_tc.cu, embag.cu): attention at HS 16 (the model's), 32 and 64 over the tile
 *   edges, a max_len history and histories past max_len; the embedding gradient's bits at E 12,
 *   64, 200, one lookup, 129 of one row; --all-shapes adds the hot row (100k lookups of one row
 *   among 5000, ~100 s on the emulator: the same pass-2 paths as 129 of one row, at scale) and
 *   the HS 64 attention under the 1.5-std softmax.
 * --small keeps one small row per kernel family (tests/asan_test.sh runs it under ASan, and
 * compute-sanitizer's runs want few launches). */
#include <fnmatch.h>
#include <omp.h>
#include <string.h>

#include "core.h"
#include "ops/optest.h"

void ot_row_begin(const ot_row *r, int mode);
int ot_row_end(double *err, double *tol, const char **skip_why);
int ot_cuda_ready(const char **why); /* tests/ops/cuda_util.c: 1 when a GPU is there */

extern const ot_table ot_dense, ot_attention, ot_optim, ot_ctr, ot_dense_cuda, ot_fused_cuda, ot_perf_cuda,
    ot_ctr_cuda, ot_ctr_cuda_b, ot_perf_ctr_cuda, ot_attention_fa_cuda, ot_attention_cudnn, ot_emu_fa, ot_emu_tc;
static const ot_table *const TABLES[] = {&ot_dense,           &ot_attention,     &ot_optim,
                                         &ot_ctr,             &ot_dense_cuda,    &ot_fused_cuda,
                                         &ot_ctr_cuda,        &ot_ctr_cuda_b,    &ot_attention_fa_cuda,
                                         &ot_attention_cudnn, &ot_emu_fa,        &ot_emu_tc,
                                         &ot_perf_cuda,       &ot_perf_ctr_cuda};
#define NTABLES (int)(sizeof TABLES / sizeof TABLES[0])

static const char *const DTYPE[] = {"f32", "bf16", "f32+bf16", "-"};
static const char *const MODE_NAME[] = {"", "eval", "grad", "", "perf"};

typedef struct {
    int modes, all_shapes, list;
    const char *backend, *op, *dtype;
} opts;

static void usage(void) {
    fprintf(stderr, "usage: test_ops [--mode eval|grad|perf|all] [--backend cpu|cuda|emu] [--op NAME] "
                    "[--dtype f32|bf16] [--list] [--small] [--all-shapes] [--verbose] [-- ARGS for perf rows]\n");
    exit(2);
}

static opts parse(int argc, char **argv) {
    opts o = {OT_EVAL | OT_GRAD, 0, 0, NULL, NULL, NULL};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--")) {
            ot_extra_argc = argc - i - 1, ot_extra_argv = argv + i + 1;
            break;
        } else if (!strcmp(a, "--mode") && v) {
            o.modes = !strcmp(v, "eval") ? OT_EVAL : !strcmp(v, "grad") ? OT_GRAD : !strcmp(v, "perf") ? OT_PERF
                      : !strcmp(v, "all") ? OT_EVAL | OT_GRAD | OT_PERF : 0;
            if (!o.modes) usage();
            i++;
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

static int selected(const opts *o, const ot_row *r, int mode) {
    if (!(r->modes & mode)) return 0;
    if (o->backend && strcmp(o->backend, r->backend)) return 0;
    if (o->op && fnmatch(o->op, r->op, 0)) return 0;
    if (o->dtype) {
        int want = !strcmp(o->dtype, "bf16") ? OT_BF16 : OT_F32;
        if (r->dtype != want && r->dtype != OT_BOTH) return 0;
    }
    if ((r->flags & OT_FULL) && !o->all_shapes) return 0;
    if (ot_small && !(r->flags & OT_SMALL)) return 0;
    return 1;
}

typedef struct {
    int run, pass, fail, skip;
} tally;

static void run_row(const ot_row *r, int mode, tally *t) {
    const char *why = NULL;
    double t0 = nb_now(), err = -1, tol = 0;
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
    char e[64] = "-";
    if (why && !nfail) snprintf(e, sizeof e, "(%s)", why);
    else if (err >= 0) snprintf(e, sizeof e, "err %.2e tol %.0e", err, tol);
    else if (mode != OT_PERF) snprintf(e, sizeof e, "exact checks");
    printf("%s %-4s %-4s %-8s %-22s %-34s %-26s %6.2f s\n", verdict, MODE_NAME[mode], r->backend, DTYPE[r->dtype],
           r->op, r->shape, e, nb_now() - t0);
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
                if (!selected(&o, r, r->modes & o.modes ? r->modes & o.modes : 0) &&
                    !(selected(&o, r, OT_EVAL) || selected(&o, r, OT_GRAD) || selected(&o, r, OT_PERF)))
                    continue;
                printf("%-4s %-8s %-22s %-34s tol %-7.0e %s%s%s%s\n", r->backend, DTYPE[r->dtype], r->op, r->shape,
                       r->tol, r->modes & OT_EVAL ? "eval " : "", r->modes & OT_GRAD ? "grad " : "",
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
