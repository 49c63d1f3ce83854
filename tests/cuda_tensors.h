/* Tensors of the CUDA tests (test_ops's cuda rows through tests/ops/cuda_util.h, and
 * test_smfree_cuda through tests/cuda_test_util.h): random host tensors, device up/down in fp32 or
 * bf16, NaN-poisoned outputs. The includer defines SEED and declares `st` (the stream the ops run
 * on, which dev_down waits for) and `ot_stream` (the next random stream: every random tensor draws
 * from a stream of its own) first; include after bf16_host.h, core.h, cuda_check.h and rng.h. */
#ifndef NB_CUDA_TENSORS_H
#define NB_CUDA_TENSORS_H

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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

#endif
