/* Helpers shared by the cuda rows (dense_cuda.c, fused_cuda.c, ctr_cuda*.c): the tensors of
 * tests/cuda_tensors.h (random host tensors, device up/down in fp32 or bf16, NaN-poisoned outputs)
 * and the comparisons against the CPU reference with each dtype's tolerance. Define SEED before
 * including; include after optest.h, bf16_host.h, core.h, cuda_check.h, rng.h and ops/ops_cuda.h.
 * The GPU state (st, inst, lt) is cuda_util.c's. */
#ifndef NB_OPS_CUDA_UTIL_H
#define NB_OPS_CUDA_UTIL_H

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "ops/backend.h"
#include "ops/ops_cuda.h"
#include "optest.h"

static const double TOL[2] = {1e-5, 1e-2}; /* [bf] */
static const char *MODE[2] = {"f32", "bf16"};

extern cudaStream_t st;   /* the stream the ops run on */
extern nb_backend *inst;  /* the backend instance of GPU 0: its cuBLASLt handle serves the */
extern nb_blas_t lt;      /* GEMM launchers, and task contexts point at it (ctx.backend) */
extern nb_task_ctx ot_gctx, ot_cctx; /* a GPU lane's context (stream st) and the CPU's */

#include "../cuda_tensors.h"

/* ---- comparisons ---- */

static inline void expect_close(const char *what, int bf, const float *got, const float *ref, size_t n) {
    double e = rel_err(got, ref, n);
    ot_err(e, TOL[bf]);
    ot_log("    %-46s %-4s rel err %.2e\n", what, MODE[bf], e);
    CHECK(e <= TOL[bf], "%s (%s): relative error %.3g > %.3g", what, MODE[bf], e, TOL[bf]);
}

/* Compares the increments got - init and ref - init. */
static inline void expect_grad(const char *what, int bf, const float *got, const float *ref, const float *init, size_t n) {
    float *dg = zeros(n), *dr = zeros(n);
    for (size_t i = 0; i < n; i++) {
        dg[i] = got[i] - init[i];
        dr[i] = ref[i] - init[i];
    }
    expect_close(what, bf, dg, dr, n);
    free(dg);
    free(dr);
}

/* Two GPU runs of the same op: the same bits (no float atomics, no order that varies). */
static inline void expect_same(const char *what, const float *a, const float *b, size_t n) {
    CHECK(memcmp(a, b, n * sizeof(float)) == 0, "%s: two GPU runs differ bit for bit (not deterministic)", what);
}

#endif
