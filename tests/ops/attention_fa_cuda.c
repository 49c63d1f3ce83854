/* The cuda rows of attention_fa.cu (the tensor-core attention) against the CPU reference
 * (attention.c), through the public bf16 launchers (ops_cuda.h), which dispatch to it for head
 * sizes 64 and 128:
 * - awkward shapes: T not a multiple of any tile (1, 16, 67, 130, 1029), GQA groups of 1, 2, 4, 8,
 *   B up to 4, a sharp softmax (inputs with std 3);
 * - outputs poisoned with NaN first (an element the kernels forget stays NaN and fails);
 * - bf16 inputs rounded the same on both sides; relative error <= 1e-2 for out and for each of
 *   dq, dk, dv (compared separately, so an error in one cannot hide in the others), <= 1e-4 for lse;
 * - the backward accumulates: dqkv starts from random values, increments are compared;
 * - determinism: two GPU runs from the same state are bitwise equal;
 * - dispatch: the launcher's result is bitwise the fast path's own (so the launcher uses it), and
 *   shapes the fast path refuses (HS 96, unaligned tensors) still work through the fallback.
 * --small: one small case per head size (for compute-sanitizer); perf mode: ms and TFLOP/s.
 * The same kernels on the CPU emulator: emu_fa.c. */
#include "optest.h"

#ifdef NB_WITH_CUDA
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "cuda_check.h"
#include "ops/ops.h"
#include "ops/ops_cuda.h"
#include "rng.h"

#define SEED 20250917u
#define TOL 1e-2
#define TOL_LSE 1e-4
#include "attn_util.h"

extern cudaStream_t st; /* cuda_util.c */

/* attention_fa.cu (no header of its own yet): the fast path, callable directly. Each returns 1
 * if it took the call, 0 if the shape or alignment is not one it handles. */
int nb_cuda_attention_fa_forward_bf16(nb_bf16 *out, float *lse, const nb_bf16 *qkv, int B, int T, int NH,
                                      int NKV, int HS, nb_stream_t stream);
int nb_cuda_attention_fa_backward_bf16(nb_bf16 *dqkv, const nb_bf16 *dout, const nb_bf16 *qkv, const nb_bf16 *out,
                                       const float *lse, int B, int T, int NH, int NKV, int HS, nb_stream_t stream);

/* ---- device helpers ---- */

static void *up_bf(const float *h, size_t n) {
    uint16_t *t = nb_malloc((n ? n : 1) * 2, "bf16 staging");
    for (size_t i = 0; i < n; i++) t[i] = f2bf(h[i]);
    void *d = NULL;
    CUDA_CHECK(cudaMalloc(&d, (n ? n : 1) * 2));
    CUDA_CHECK(cudaMemcpy(d, t, n * 2, cudaMemcpyHostToDevice));
    free(t);
    return d;
}

static void *up_f32(const float *h, size_t n) {
    void *d = NULL;
    CUDA_CHECK(cudaMalloc(&d, (n ? n : 1) * 4));
    CUDA_CHECK(cudaMemcpy(d, h, n * 4, cudaMemcpyHostToDevice));
    return d;
}

/* All-ones bytes: NaN in both bf16 and fp32. */
static void *dev_nan(size_t bytes) {
    void *d = NULL;
    CUDA_CHECK(cudaMalloc(&d, bytes ? bytes : 1));
    CUDA_CHECK(cudaMemset(d, 0xff, bytes ? bytes : 1));
    return d;
}

static float *down_bf(const void *d, size_t n) {
    CUDA_CHECK(cudaStreamSynchronize(st));
    uint16_t *t = nb_malloc((n ? n : 1) * 2, "bf16 staging");
    CUDA_CHECK(cudaMemcpy(t, d, n * 2, cudaMemcpyDeviceToHost));
    float *h = zeros(n);
    for (size_t i = 0; i < n; i++) h[i] = bf2f(t[i]);
    free(t);
    return h;
}

static float *down_f32(const void *d, size_t n) {
    CUDA_CHECK(cudaStreamSynchronize(st));
    float *h = zeros(n);
    CUDA_CHECK(cudaMemcpy(h, d, n * 4, cudaMemcpyDeviceToHost));
    return h;
}

static void dev_free(void *d) {
    if (d) CUDA_CHECK(cudaFree(d));
}

/* ---- one shape: forward and backward against the CPU ---- */

static void check_shape(int B, int T, int NH, int NKV, int HS, float std) {
    int R = (NH + 2 * NKV) * HS;
    size_t nqkv = (size_t)B * T * R, no = (size_t)B * T * NH * HS, nl = (size_t)B * NH * T;
    char tag[96], what[160];
    snprintf(tag, sizeof tag, "B=%d T=%d NH=%d NKV=%d HS=%d std=%g", B, T, NH, NKV, HS, std);
    double t0 = nb_now();
    float *qkv = randn_bf(nqkv, std), *dout = randn_bf(no, 1.0f);
    float *rout = zeros(no), *rlse = zeros(nl);
    nb_attention_forward(rout, rlse, qkv, B, T, NH, NKV, HS);

    /* forward: the launcher twice, then the fast path directly */
    void *dq = up_bf(qkv, nqkv);
    float *out[3], *lse[3];
    for (int run = 0; run < 3; run++) {
        void *dout_ = dev_nan(no * 2), *dl = dev_nan(nl * 4);
        if (run < 2) nb_cuda_attention_forward_bf16(dout_, dl, dq, B, T, NH, NKV, HS, st);
        else CHECK(nb_cuda_attention_fa_forward_bf16(dout_, dl, dq, B, T, NH, NKV, HS, st) == 1,
                   "%s: the fast path refused a shape it has kernels for", tag);
        out[run] = down_bf(dout_, no), lse[run] = down_f32(dl, nl);
        dev_free(dout_), dev_free(dl);
    }
    snprintf(what, sizeof what, "%s fwd out", tag);
    expect_close(what, out[0], rout, no, TOL);
    snprintf(what, sizeof what, "%s fwd lse", tag);
    expect_close(what, lse[0], rlse, nl, TOL_LSE);
    expect_same("attention fwd out, two runs", out[0], out[1], no);
    expect_same("attention fwd lse, two runs", lse[0], lse[1], nl);
    expect_same("attention fwd out, launcher vs fast path (dispatch)", out[0], out[2], no);

    /* backward from the CPU's out (rounded to bf16) and lse, into a random starting dqkv */
    for (size_t i = 0; i < no; i++) rout[i] = bf2f(f2bf(rout[i]));
    float *g0 = zeros(nqkv);
    nb_attention_backward(g0, dout, qkv, rout, rlse, B, T, NH, NKV, HS);
    float *init = randn_bf(nqkv, (float)(rms(g0, nqkv) > 0 ? rms(g0, nqkv) : 1.0));
    float *rg = copy_of(init, nqkv);
    nb_attention_backward(rg, dout, qkv, rout, rlse, B, T, NH, NKV, HS);
    void *ddo = up_bf(dout, no), *dro = up_bf(rout, no), *dl = up_f32(rlse, nl);
    float *g[3];
    for (int run = 0; run < 3; run++) {
        void *gd = up_bf(init, nqkv);
        if (run < 2) nb_cuda_attention_backward_bf16(gd, ddo, dq, dro, dl, B, T, NH, NKV, HS, st);
        else CHECK(nb_cuda_attention_fa_backward_bf16(gd, ddo, dq, dro, dl, B, T, NH, NKV, HS, st) == 1,
                   "%s: the fast backward refused a shape it has kernels for", tag);
        g[run] = down_bf(gd, nqkv);
        dev_free(gd);
    }
    expect_dqkv(tag, g[0], rg, init, B * T, NH, NKV, HS);
    expect_same("attention bwd dqkv, two runs", g[0], g[1], nqkv);
    expect_same("attention bwd dqkv, launcher vs fast path (dispatch)", g[0], g[2], nqkv);
    ot_log("    (%.1f s)\n", nb_now() - t0);

    dev_free(dq), dev_free(ddo), dev_free(dro), dev_free(dl);
    free(qkv), free(dout), free(rout), free(rlse), free(g0), free(init), free(rg);
    for (int run = 0; run < 3; run++) free(out[run]), free(lse[run]), free(g[run]);
}

TEST_CASE(test_shapes) {
    if (ot_small) { /* one small case per head size (for compute-sanitizer) */
        check_shape(1, 67, 4, 2, 64, 1.0f);
        check_shape(1, 67, 4, 2, 128, 1.0f);
        return;
    }
    check_shape(1, 1, 2, 1, 64, 1.0f);      /* one token */
    check_shape(2, 16, 2, 2, 128, 1.0f);    /* less than one tile */
    check_shape(2, 67, 12, 12, 64, 1.0f);   /* GPT-2 heads, T past a tile */
    check_shape(4, 130, 4, 2, 64, 1.0f);    /* GQA 2, B = 4 */
    check_shape(1, 67, 32, 8, 128, 1.0f);   /* Llama-like GQA 4, HS 128 */
    check_shape(1, 257, 8, 1, 64, 3.0f);    /* one kv head for 8, sharp softmax */
    check_shape(3, 1029, 12, 12, 64, 1.0f); /* long, T = 1024 + 5 */
    check_shape(2, 1029, 32, 8, 128, 1.0f);
}

/* Shapes the fast path refuses must still be right through the fallback kernels. */
TEST_CASE(test_fallback) {
    int B = 2, T = 45, NH = 4, NKV = 2, HS = 96;
    int R = (NH + 2 * NKV) * HS;
    size_t nqkv = (size_t)B * T * R, no = (size_t)B * T * NH * HS, nl = (size_t)B * NH * T;
    float *qkv = randn_bf(nqkv, 1.0f), *rout = zeros(no), *rlse = zeros(nl);
    nb_attention_forward(rout, rlse, qkv, B, T, NH, NKV, HS);
    void *dq = up_bf(qkv, nqkv), *dout_ = dev_nan(no * 2), *dl = dev_nan(nl * 4);
    CHECK(nb_cuda_attention_fa_forward_bf16(dout_, dl, dq, B, T, NH, NKV, HS, st) == 0,
          "HS 96 has no fast kernels, the fast path must refuse it");
    nb_cuda_attention_forward_bf16(dout_, dl, dq, B, T, NH, NKV, HS, st);
    float *out = down_bf(dout_, no);
    expect_close("fallback fwd out (HS=96)", out, rout, no, TOL);
    free(out);
    /* a qkv starting 2 bytes into an allocation: no 16-byte rows, so the fast path refuses */
    int HS2 = 64, R2 = (NH + 2 * NKV) * HS2;
    size_t n2 = (size_t)B * T * R2, no2 = (size_t)B * T * NH * HS2;
    float *q2 = randn_bf(n2, 1.0f), *r2 = zeros(no2), *l2 = zeros(nl);
    nb_attention_forward(r2, l2, q2, B, T, NH, NKV, HS2);
    float *q2s = zeros(n2 + 1);
    memcpy(q2s + 1, q2, n2 * sizeof(float));
    void *dq2 = up_bf(q2s, n2 + 1), *do2 = dev_nan(no2 * 2);
    nb_bf16 *q2off = (nb_bf16 *)dq2 + 1;
    CHECK(nb_cuda_attention_fa_forward_bf16(do2, dl, q2off, B, T, NH, NKV, HS2, st) == 0,
          "an unaligned qkv must be refused by the fast path");
    nb_cuda_attention_forward_bf16(do2, dl, q2off, B, T, NH, NKV, HS2, st);
    float *o2 = down_bf(do2, no2);
    expect_close("fallback fwd out (HS=64, qkv not 16-byte aligned)", o2, r2, no2, TOL);
    dev_free(dq), dev_free(dout_), dev_free(dl), dev_free(dq2), dev_free(do2);
    free(qkv), free(rout), free(rlse), free(q2), free(r2), free(l2), free(q2s), free(o2);
}

/* ---- timing ---- */

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

typedef struct {
    int B, T, NH, NKV, HS;
    void *qkv, *out, *lse, *dout, *dqkv;
} bench_case;

static void *dev_rand_bf16(size_t n, float scale, uint32_t seed) {
    uint16_t *h = nb_malloc(n * 2, "bench staging");
    uint32_t s = seed;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u; /* cheap LCG: random enough, fast for 100M+ elements */
        h[i] = f2bf(scale * ((float)(s >> 8) / 16777216.0f - 0.5f));
    }
    void *d = NULL;
    CUDA_CHECK(cudaMalloc(&d, n * 2));
    CUDA_CHECK(cudaMemcpy(d, h, n * 2, cudaMemcpyHostToDevice));
    free(h);
    return d;
}

static bench_case bench_make(int B, int T, int NH, int NKV, int HS) {
    bench_case c = {B, T, NH, NKV, HS, NULL, NULL, NULL, NULL, NULL};
    size_t nqkv = (size_t)B * T * (NH + 2 * NKV) * HS, no = (size_t)B * T * NH * HS;
    c.qkv = dev_rand_bf16(nqkv, 4.0f, 12345u); /* scores of std ~1: a realistic softmax */
    c.dout = dev_rand_bf16(no, 1.0f, 777u);
    c.dqkv = dev_rand_bf16(nqkv, 0.01f, 999u);
    CUDA_CHECK(cudaMalloc(&c.out, no * 2));
    CUDA_CHECK(cudaMalloc(&c.lse, (size_t)B * NH * T * 4));
    nb_cuda_attention_forward_bf16(c.out, c.lse, c.qkv, B, T, NH, NKV, HS, st);
    return c;
}

static void bench_free(bench_case *c) {
    dev_free(c->qkv), dev_free(c->out), dev_free(c->lse), dev_free(c->dout), dev_free(c->dqkv);
}

/* Median ms of `reps` runs (after 2 warm-ups) of the forward (bwd = 0) or the backward. */
static double bench_ms(bench_case *c, int bwd, int reps) {
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    float ms[32];
    if (reps > 32) reps = 32;
    for (int r = -2; r < reps; r++) {
        CUDA_CHECK(cudaEventRecord(e0, st));
        if (bwd)
            nb_cuda_attention_backward_bf16(c->dqkv, c->dout, c->qkv, c->out, c->lse, c->B, c->T, c->NH, c->NKV,
                                            c->HS, st);
        else nb_cuda_attention_forward_bf16(c->out, c->lse, c->qkv, c->B, c->T, c->NH, c->NKV, c->HS, st);
        CUDA_CHECK(cudaEventRecord(e1, st));
        CUDA_CHECK(cudaEventSynchronize(e1));
        if (r >= 0) CUDA_CHECK(cudaEventElapsedTime(&ms[r], e0, e1));
    }
    CUDA_CHECK(cudaEventDestroy(e0));
    CUDA_CHECK(cudaEventDestroy(e1));
    qsort(ms, reps, sizeof(float), cmp_float);
    return reps % 2 ? ms[reps / 2] : 0.5 * (ms[reps / 2 - 1] + ms[reps / 2]);
}

/* Causal attention FLOPs: QK^T and PV over half the T x T square. */
static double fwd_flop(const bench_case *c) { return 4.0 * c->B * c->NH * (double)c->T * c->T * c->HS / 2; }

static const int BENCH_SHAPES[][5] = {
    {16, 1024, 12, 12, 64}, /* GPT-2 124M heads */
    {64, 1024, 12, 12, 64}, /* the same at a training batch */
    {2, 2048, 32, 8, 64},   /* Llama-1B-like: dim 2048 / 32 heads, GQA 4 */
    {1, 4096, 32, 8, 128},  /* Llama-8B-like heads */
};
#define N_BENCH_SHAPES (int)(sizeof BENCH_SHAPES / sizeof BENCH_SHAPES[0])

static void bench(void) {
    printf("bf16 causal attention, median of 15; TFLOP/s from 4*B*NH*T*T*HS/2 (fwd), 2.5x that (bwd)\n");
    printf("  %-36s %10s %9s\n", "shape", "ms", "TFLOP/s");
    for (int s = 0; s < N_BENCH_SHAPES; s++) {
        const int *p = BENCH_SHAPES[s];
        bench_case c = bench_make(p[0], p[1], p[2], p[3], p[4]);
        for (int bwd = 0; bwd <= 1; bwd++) {
            double flop = fwd_flop(&c) * (bwd ? 2.5 : 1.0);
            double fast = bench_ms(&c, bwd, 15);
            char label[96];
            snprintf(label, sizeof label, "%s B=%d T=%d NH=%d NKV=%d HS=%d", bwd ? "bwd" : "fwd", p[0], p[1], p[2],
                     p[3], p[4]);
            printf("  %-36s %10.3f %9.1f\n", label, fast, flop / fast / 1e9);
        }
        bench_free(&c);
    }
}


#define FN(f) f
#else
#define FN(f) NULL
#endif

static const ot_row rows[] = {
    {"attention_fa", "cuda", OT_BF16, "8 shapes, T 1 .. 1029, GQA 1 .. 8", 1e-2, OT_EVAL, FN(test_shapes), 0, OT_SMALL},
    {"attention_fa_fallback", "cuda", OT_BF16, "HS 96, unaligned qkv", 1e-2, OT_EVAL, FN(test_fallback), 0, 0},
    {"attention_fa", "cuda", OT_BF16, "gpt2, llama-1B, llama-8B heads", 0, OT_PERF, FN(bench), 0, 0},
};
OT_TABLE(ot_attention_fa_cuda, rows);
