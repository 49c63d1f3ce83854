/* Helpers shared by the cuda rows (dense_cuda.c, fused_cuda.c, ctr_cuda*.c): random host
 * tensors, device up/down in fp32 or bf16, NaN-poisoned outputs, and the comparisons against the CPU reference with each
 * dtype's tolerance. Define SEED before including; include after optest.h, bf16_host.h, core.h,
 * cuda_check.h, rng.h and ops/ops_cuda.h. The GPU state (st, inst, lt) is cuda_util.c's. */
#ifndef NB_CUDA_TEST_UTIL_H
#define NB_CUDA_TEST_UTIL_H

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

/* ---- host helpers ---- */

static inline float *randn(size_t n, float mean, float std) {
    float *p = nb_malloc((n ? n : 1) * sizeof(float), "test tensor");
    nb_rng_fill_normal(p, n, SEED, ot_stream++, mean, std);
    return p;
}

static inline float *copy_of(const float *h, size_t n) {
    float *p = nb_malloc((n ? n : 1) * sizeof(float), "test tensor");
    memcpy(p, h, n * sizeof(float));
    return p;
}

static inline float *zeros(size_t n) { return nb_calloc(n ? n : 1, sizeof(float), "test tensor"); }

/* In bf16 mode the CPU reference must see the same (rounded) values as the GPU. */
static inline void round_bf(float *h, size_t n, int bf) {
    if (bf)
        for (size_t i = 0; i < n; i++) h[i] = bf2f(f2bf(h[i]));
}

static inline double rms(const float *x, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return n ? sqrt(s / n) : 0;
}

/* A gradient's starting value: random, on the scale of the increment g0 the op will add. */
static inline float *grad_init(const float *g0, size_t n, int bf) {
    float *p = randn(n, 0.0f, (float)(rms(g0, n) > 0 ? rms(g0, n) : 1.0));
    round_bf(p, n, bf);
    return p;
}

/* ---- device helpers (bf16 tensors are 2 bytes an element, fp32 ones 4) ---- */

static inline void *dev_raw(const void *h, size_t bytes) {
    void *d = NULL;
    CUDA_CHECK(cudaMalloc(&d, bytes ? bytes : 1));
    if (bytes) CUDA_CHECK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}

static inline void *dev_up(const float *h, size_t n, int bf) {
    if (!bf) return dev_raw(h, n * 4);
    uint16_t *t = nb_malloc((n ? n : 1) * 2, "bf16 staging");
    for (size_t i = 0; i < n; i++) t[i] = f2bf(h[i]);
    void *d = dev_raw(t, n * 2);
    free(t);
    return d;
}

/* All-ones bytes: NaN in both fp32 and bf16. */
static inline void *dev_nan(size_t n, int bf) {
    void *d = NULL;
    CUDA_CHECK(cudaMalloc(&d, (n ? n : 1) * (bf ? 2 : 4)));
    CUDA_CHECK(cudaMemset(d, 0xff, (n ? n : 1) * (bf ? 2 : 4)));
    return d;
}

static inline void dev_down(float *h, const void *d, size_t n, int bf) {
    CUDA_CHECK(cudaStreamSynchronize(st));
    if (bf) {
        uint16_t *t = nb_malloc((n ? n : 1) * 2, "bf16 staging");
        CUDA_CHECK(cudaMemcpy(t, d, n * 2, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < n; i++) h[i] = bf2f(t[i]);
        free(t);
    } else {
        CUDA_CHECK(cudaMemcpy(h, d, n * 4, cudaMemcpyDeviceToHost));
    }
}

static inline void dev_free(void *d) {
    if (d) CUDA_CHECK(cudaFree(d));
}

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
