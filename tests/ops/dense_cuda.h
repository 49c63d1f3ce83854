/* Shared by the dense cuda rows (dense_cuda.c, fused_cuda.c, perf_cuda.c): the includes, the
 * launchers' f32/bf16 dispatch and the GEMM helpers. Include once per file, under NB_WITH_CUDA. */
#ifndef NB_OT_DENSE_CUDA_H
#define NB_OT_DENSE_CUDA_H
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "../bf16_host.h"
#include "optest.h"
#include <cuda_runtime.h>

#include "core.h"
#include "cuda_check.h"
#include "ops/ops.h"
#include "ops/ops_cuda.h"
#include "optim/optim.h"
#include "rng.h"

#define SEED 20250611u
#include "cuda_util.h"

/* h uploaded one element past the start of a fresh allocation (*base, to free): a tensor whose
 * rows are not 16-byte aligned, so ops take their scalar path. */
static inline void *dev_up_shifted(const float *h, size_t n, int bf, void **base) {
    float *t = nb_malloc((n + 1) * sizeof(float), "shifted staging");
    t[0] = 0.0f;
    memcpy(t + 1, h, n * sizeof(float));
    *base = dev_up(t, n + 1, bf);
    free(t);
    return (char *)*base + (bf ? 2 : 4);
}

/* Calls the _f32 or _bf16 launcher (device pointers are void * here). */
#define CALL(bf, fn, ...)                                                                          \
    do {                                                                                           \
        if (bf)                                                                                    \
            fn##_bf16(__VA_ARGS__);                                                                \
        else                                                                                       \
            fn##_f32(__VA_ARGS__);                                                                 \
    } while (0)

static inline void expect_untouched(const char *what, const float *got, const float *init, size_t n) {
    CHECK(memcmp(got, init, n * sizeof(float)) == 0, "%s: written although its pointer was NULL or out of range",
          what);
}


static inline void gpu_matmul_fwd(int bf, float *out, const float *inp, const float *w, const float *bias, int N, int C,
                           int OC) {
    void *di = dev_up(inp, (size_t)N * C, bf), *dw = dev_up(w, (size_t)OC * C, bf);
    void *db = bias ? dev_up(bias, OC, bf) : NULL, *dout = dev_nan((size_t)N * OC, bf);
    CALL(bf, nb_cuda_matmul_forward, dout, di, dw, db, N, C, OC, lt, st);
    dev_down(out, dout, (size_t)N * OC, bf);
    dev_free(di), dev_free(dw), dev_free(db), dev_free(dout);
}

static inline void gpu_matmul_gelu(int bf, float *out, float *pre, const float *inp, const float *w, const float *bias,
                            int N, int C, int OC) {
    void *di = dev_up(inp, (size_t)N * C, bf), *dw = dev_up(w, (size_t)OC * C, bf);
    void *db = bias ? dev_up(bias, OC, bf) : NULL;
    void *dout = dev_nan((size_t)N * OC, bf), *dpre = dev_nan((size_t)N * OC, bf);
    CALL(bf, nb_cuda_matmul_gelu_forward, dout, dpre, di, dw, db, N, C, OC, lt, st);
    dev_down(out, dout, (size_t)N * OC, bf);
    dev_down(pre, dpre, (size_t)N * OC, bf);
    dev_free(di), dev_free(dw), dev_free(db), dev_free(dout), dev_free(dpre);
}

static inline void set_env(const char *name, int v) {
    char b[12];
    snprintf(b, sizeof b, "%d", v);
    setenv(name, b, 1);
}

/* pick < 0: the default algorithm choice; else NB_LT_ALGO_GELU=pick (another of cuBLASLt's
 * ranked algorithms for the GELU epilogues, the last one past the end of the list). */
static inline void set_gelu_candidate(int pick) {
    if (pick < 0) unsetenv("NB_LT_ALGO_GELU");
    else set_env("NB_LT_ALGO_GELU", pick);
}

#endif
