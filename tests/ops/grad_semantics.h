/* The gradient contract every CPU op's backward keeps (dense.c, ctr.c): a NULL gradient is
 * skipped and leaves the others bit-identical, all NULL is a no-op, gradients accumulate (G0 + 2g
 * after two calls) unless written over, and two runs give the same bits, with 1 or 3 OpenMP
 * threads too. Include after op_util.h, with FWD_TOL and GRAD_TOL defined. */
#ifndef NB_GRAD_SEMANTICS_H
#define NB_GRAD_SEMANTICS_H

#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "optest.h"

#define MAX_GRADS 5
typedef struct {
    const char *name;
    int ngrads;
    size_t sizes[MAX_GRADS];
    const char *gname[MAX_GRADS];
    void (*backward)(const void *ctx, float *const *grads); /* grads[k] may be NULL */
    const void *ctx;
    unsigned written;      /* bit k: gradient k is written, not added to (the cross's dx) */
    unsigned threads_vary; /* bit k: gradient k may change with the OpenMP thread count (BLAS's sums) */
} grad_op;

/* Gradient k alone must equal gradient k computed with all the others. */
static void check_each_alone(const grad_op *op, float *const *ref) {
    for (int k = 0; k < op->ngrads; k++) {
        float *only[MAX_GRADS] = {0};
        only[k] = zeros(op->sizes[k]);
        op->backward(op->ctx, only);
        CHECK(same_bits(only[k], ref[k], op->sizes[k]), "%s: %s alone differs from %s with all gradients",
              op->name, op->gname[k], op->gname[k]);
        free(only[k]);
    }
}

/* After two calls on G0: G0 + 2g, or g where the gradient is written over. */
static void check_accumulates(const grad_op *op, float *const *ref, float **g) {
    for (int k = 0; k < op->ngrads; k++) nb_rng_fill_normal(g[k], op->sizes[k], SEED, 900 + k, 0.0f, 1.0f);
    op->backward(op->ctx, g);
    op->backward(op->ctx, g);
    for (int k = 0; k < op->ngrads; k++) {
        if (op->written >> k & 1) {
            CHECK(same_bits(g[k], ref[k], op->sizes[k]), "%s: %s is not written over what it held", op->name,
                  op->gname[k]);
            continue;
        }
        float *g0 = randn(op->sizes[k], 900 + k, 0.0f, 1.0f);
        double *want = nb_malloc(op->sizes[k] * sizeof(double), "test tensor");
        for (size_t i = 0; i < op->sizes[k]; i++) want[i] = (double)g0[i] + 2.0 * ref[k][i];
        double e = max_rel(g[k], want, op->sizes[k]);
        CHECK(e < 1e-5, "%s: %s does not accumulate (G0 + 2g): error %.3g", op->name, op->gname[k], e);
        free(want);
        free(g0);
    }
}

static void check_thread_counts(const grad_op *op, float *const *ref, float **g) {
    const int counts[2] = {1, 3};
    for (int c = 0; c < 2; c++) {
        omp_set_num_threads(counts[c]);
        for (int k = 0; k < op->ngrads; k++) memset(g[k], 0, op->sizes[k] * sizeof(float));
        op->backward(op->ctx, g);
        for (int k = 0; k < op->ngrads; k++)
            if (!(op->threads_vary >> k & 1))
                CHECK(same_bits(g[k], ref[k], op->sizes[k]), "%s: %s changes with %d threads", op->name,
                      op->gname[k], counts[c]);
    }
    omp_set_num_threads(ot_threads);
}

/* The gradients from zero into ref[k] (the caller frees them); in eval mode, the contract above. */
static void check_grad_semantics(const grad_op *op, float **ref) {
    float *g[MAX_GRADS] = {0};
    for (int k = 0; k < op->ngrads; k++) ref[k] = zeros(op->sizes[k]);
    op->backward(op->ctx, ref);
    if (!ot_eval()) return; /* grad mode: the gradients for the finite differences only */
    for (int k = 0; k < op->ngrads; k++) g[k] = zeros(op->sizes[k]);
    op->backward(op->ctx, g);
    for (int k = 0; k < op->ngrads; k++)
        CHECK(same_bits(g[k], ref[k], op->sizes[k]), "%s: %s differs between two runs", op->name, op->gname[k]);
    check_each_alone(op, ref);
    float *none[MAX_GRADS] = {0};
    op->backward(op->ctx, none); /* every gradient NULL: must not touch memory */
    check_accumulates(op, ref, g);
    check_thread_counts(op, ref, g);
    for (int k = 0; k < op->ngrads; k++) free(g[k]);
}

static void report(const char *name, double fwd_err, const double *grad_err, const grad_op *op) {
    if (ot_eval()) ot_err(fwd_err, FWD_TOL);
    ot_log("  %-22s fwd %.1e", name, fwd_err);
    for (int k = 0; k < op->ngrads; k++) {
        if (ot_grad()) ot_err(grad_err[k], GRAD_TOL);
        ot_log("  %s %.1e", op->gname[k], grad_err[k]);
    }
    ot_log("\n");
}

#endif
