/* cuDNN's fused flash attention (src/ops/attention_cudnn.c) against our CUDA kernels
 * (attention.cu / attention_fa.cu) and, on small shapes, the CPU reference (attention.c).
 *
 * Per shape (T 64-128 with NH = NKV and GQA NH = 4 NKV, HS 64 and 128, B 2-4, one T that is not a
 * multiple of 64, and gpt2's heads at B=4 T=1024):
 * - outputs poisoned with NaN first (an element cuDNN leaves unwritten stays NaN and fails);
 * - forward out (bf16, relative error <= 2e-2 against ours: two bf16 implementations, each within
 *   1e-2 of the truth; <= 1e-2 against the CPU) and lse (<= 1e-4: cuDNN's Stats must be our lse,
 *   or --attn cudnn-fwd would feed our backward a wrong one); the forward repeats bitwise;
 * - backward dq, dk, dv compared separately (deterministic and fast variants) against ours and the
 *   CPU, from the same out and lse; the deterministic one repeats bitwise over 3 runs (the fast one
 *   is reported, not required to); our backward fed cuDNN's out and lse matches it fed ours;
 * - the backend table under each --attn mode runs what it says (bitwise the direct launcher),
 *   a call cuDNN cannot take (unaligned qkv) runs ours, and a plan built eagerly replays inside a
 *   captured CUDA graph bitwise while a shape first seen in the capture is refused.
 * Perf mode: ms and TFLOP/s of ours, cuDNN deterministic and cuDNN fast at gpt2 (B=32 T=1024 NH=12
 * HS=64) and llama-1b (B=16 T=2048 NH=32 NKV=8 HS=64) shapes.
 * Without a GPU, or where libcudnn.so.9 does not load: SKIP. */
#include <stdio.h>

#include "optest.h"

#ifdef NB_WITH_CUDA
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../bf16_host.h"
#include "core.h"
#include "cuda_check.h"
#include "ops/backend.h"
#include "ops/ops.h"
#include "ops/ops_cuda.h"
#include "rng.h"

#define SEED 20261202u
#define TOL 1e-2      /* against the CPU in fp32 */
#define TOL_PAIR 2e-2 /* cuDNN against ours: both bf16 */
#define TOL_LSE 1e-4

extern cudaStream_t st;  /* cuda_util.c */
static nb_backend *inst; /* this file's own: the rows switch its --attn mode */

/* ---- host and device helpers ---- */

static float *randn_bf(size_t n, float std) {
    float *p = nb_malloc((n ? n : 1) * sizeof(float), "test tensor");
    nb_rng_fill_normal(p, n, SEED, ot_stream++, 0.0f, std);
    for (size_t i = 0; i < n; i++) p[i] = bf2f(f2bf(p[i]));
    return p;
}

static float *zeros(size_t n) { return nb_calloc(n ? n : 1, sizeof(float), "test tensor"); }

static void *up_bf(const float *h, size_t n) {
    uint16_t *t = nb_malloc((n ? n : 1) * 2, "bf16 staging");
    for (size_t i = 0; i < n; i++) t[i] = f2bf(h[i]);
    void *d = NULL;
    CUDA_CHECK(cudaMalloc(&d, (n ? n : 1) * 2));
    CUDA_CHECK(cudaMemcpy(d, t, n * 2, cudaMemcpyHostToDevice));
    free(t);
    return d;
}

/* All-ones bytes: NaN in bf16 and fp32 alike. */
static void *dev_nan(size_t bytes) {
    void *d = NULL;
    CUDA_CHECK(cudaMalloc(&d, bytes ? bytes : 1));
    CUDA_CHECK(cudaMemset(d, 0xff, bytes ? bytes : 1));
    return d;
}

static void *down_raw(const void *d, size_t bytes) {
    CUDA_CHECK(cudaStreamSynchronize(st));
    void *h = nb_malloc(bytes ? bytes : 1, "download");
    CUDA_CHECK(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
    return h;
}

static float *down_bf(const void *d, size_t n) {
    uint16_t *t = down_raw(d, n * 2);
    float *h = zeros(n);
    for (size_t i = 0; i < n; i++) h[i] = bf2f(t[i]);
    free(t);
    return h;
}

static float *down_f32(const void *d, size_t n) { return down_raw(d, n * 4); }

static void dev_free(void *d) {
    if (d) CUDA_CHECK(cudaFree(d));
}

/* ---- comparisons ---- */

static void expect_close(const char *what, const float *got, const float *ref, size_t n, double tol) {
    double e = rel_err(got, ref, n);
    ot_err(e, tol);
    ot_log("    %-64s rel err %.2e\n", what, e);
    CHECK(e <= tol, "%s: relative error %.3g > %.3g", what, e, tol);
}

static int same_bytes(const void *a, const void *b, size_t bytes) { return memcmp(a, b, bytes) == 0; }

/* The q, k and v columns of two dqkv, compared separately (an error in one cannot hide). */
static void expect_dqkv(const char *tag, const float *got, const float *ref, int BT, int NH, int NKV, int HS,
                        double tol) {
    int R = (NH + 2 * NKV) * HS, c0[4] = {0, NH * HS, (NH + NKV) * HS, R};
    static const char *name[3] = {"dq", "dk", "dv"};
    for (int part = 0; part < 3; part++) {
        size_t w = (size_t)(c0[part + 1] - c0[part]), n = (size_t)BT * w;
        float *g = zeros(n), *r = zeros(n);
        for (size_t row = 0; row < (size_t)BT; row++)
            for (size_t c = 0; c < w; c++) {
                g[row * w + c] = got[row * R + c0[part] + c];
                r[row * w + c] = ref[row * R + c0[part] + c];
            }
        char what[200];
        snprintf(what, sizeof what, "%s %s", tag, name[part]);
        expect_close(what, g, r, n, tol);
        free(g), free(r);
    }
}

static const char *refusal(void) {
    static char why[sizeof ((nb_attn_record *)0)->why];
    nb_attn_record r = nb_attn_record_get(inst);
    snprintf(why, sizeof why, "%s", r.why[0] ? r.why : "(no reason recorded)");
    return why;
}

/* ---- one shape ---- */

typedef struct {
    int B, T, NH, NKV, HS;
    size_t nqkv, no, nl;
    char tag[96];
} shape;

static shape shape_of(int B, int T, int NH, int NKV, int HS) {
    shape s = {B, T, NH, NKV, HS, (size_t)B * T * (NH + 2 * NKV) * HS, (size_t)B * T * NH * HS, (size_t)B * NH * T, ""};
    snprintf(s.tag, sizeof s.tag, "B=%d T=%d NH=%d NKV=%d HS=%d", B, T, NH, NKV, HS);
    return s;
}

/* cuDNN's forward into fresh NaN buffers; 0 (and NULL buffers) if it refused. */
static int cudnn_forward(const shape *s, const void *dq, void **out, void **lse) {
    *out = dev_nan(s->no * 2), *lse = dev_nan(s->nl * 4);
    int rc = nb_cudnn_attention_forward_bf16(inst, *out, *lse, dq, s->B, s->T, s->NH, s->NKV, s->HS, st);
    CHECK(rc == 0, "%s: cuDNN refused the forward: %s", s->tag, refusal());
    if (rc) {
        dev_free(*out), dev_free(*lse);
        *out = *lse = NULL;
    }
    return rc == 0;
}

/* cuDNN's backward into a fresh NaN dqkv, downloaded as raw bf16; NULL if it refused. */
static uint16_t *cudnn_backward(const shape *s, const void *ddo, const void *dq, const void *o, const void *l,
                                int det) {
    void *g = dev_nan(s->nqkv * 2);
    int rc = nb_cudnn_attention_backward_set_bf16(inst, g, ddo, dq, o, l, s->B, s->T, s->NH, s->NKV, s->HS, det, st);
    CHECK(rc == 0, "%s: cuDNN refused the %s backward: %s", s->tag, det ? "deterministic" : "fast", refusal());
    uint16_t *h = rc == 0 ? down_raw(g, s->nqkv * 2) : NULL;
    dev_free(g);
    return h;
}

static float *widen(const uint16_t *b, size_t n) {
    float *h = zeros(n);
    for (size_t i = 0; i < n; i++) h[i] = bf2f(b[i]);
    return h;
}

/* Forward: cuDNN twice against ours (and the CPU); returns ours' out and lse on the device for
 * the backward, and cuDNN's in *dn_out, *dn_lse. */
static void check_forward(const shape *s, const float *qkv, const void *dq, int cpu, void **fa_out, void **fa_lse,
                          void **dn_out, void **dn_lse) {
    char what[200];
    *fa_out = dev_nan(s->no * 2), *fa_lse = dev_nan(s->nl * 4);
    nb_cuda_attention_forward_bf16(*fa_out, *fa_lse, dq, s->B, s->T, s->NH, s->NKV, s->HS, st);
    void *o2 = NULL, *l2 = NULL;
    *dn_out = *dn_lse = NULL;
    if (!cudnn_forward(s, dq, dn_out, dn_lse)) return;
    if (!cudnn_forward(s, dq, &o2, &l2)) {
        dev_free(*dn_out), dev_free(*dn_lse);
        *dn_out = *dn_lse = NULL;
        return;
    }
    float *of = down_bf(*fa_out, s->no), *lf = down_f32(*fa_lse, s->nl);
    float *od = down_bf(*dn_out, s->no), *ld = down_f32(*dn_lse, s->nl);
    float *od2 = down_bf(o2, s->no), *ld2 = down_f32(l2, s->nl);
    snprintf(what, sizeof what, "%s fwd out, cudnn vs ours", s->tag);
    expect_close(what, od, of, s->no, TOL_PAIR);
    snprintf(what, sizeof what, "%s fwd lse, cudnn vs ours", s->tag);
    expect_close(what, ld, lf, s->nl, TOL_LSE);
    CHECK(same_bytes(od, od2, s->no * 4) && same_bytes(ld, ld2, s->nl * 4), "%s: two cuDNN forwards differ bitwise",
          s->tag);
    if (cpu) {
        float *ro = zeros(s->no), *rl = zeros(s->nl);
        nb_attention_forward(ro, rl, qkv, s->B, s->T, s->NH, s->NKV, s->HS);
        snprintf(what, sizeof what, "%s fwd out, cudnn vs cpu", s->tag);
        expect_close(what, od, ro, s->no, TOL);
        snprintf(what, sizeof what, "%s fwd lse, cudnn vs cpu", s->tag);
        expect_close(what, ld, rl, s->nl, TOL_LSE);
        free(ro), free(rl);
    }
    free(of), free(lf), free(od), free(ld), free(od2), free(ld2);
    dev_free(o2), dev_free(l2);
}

/* Our backward (the _set variant) from out and lse, downloaded. */
static float *ours_backward(const shape *s, const void *ddo, const void *dq, const void *o, const void *l) {
    void *g = dev_nan(s->nqkv * 2);
    nb_cuda_attention_backward_set_bf16(g, ddo, dq, o, l, s->B, s->T, s->NH, s->NKV, s->HS, st);
    float *h = down_bf(g, s->nqkv);
    dev_free(g);
    return h;
}

static void check_backward(const shape *s, const float *qkv, const float *dout, const void *dq, const void *ddo,
                           const void *o, const void *l, const void *dn_o, const void *dn_l, int cpu) {
    char tag[160];
    size_t bytes = s->nqkv * 2;
    float *ours = ours_backward(s, ddo, dq, o, l), *cpu_g = NULL;
    if (cpu) { /* from the same (bf16) out and lse as the GPU's */
        float *of = down_bf(o, s->no), *lf = down_f32(l, s->nl);
        cpu_g = zeros(s->nqkv);
        nb_attention_backward(cpu_g, dout, qkv, of, lf, s->B, s->T, s->NH, s->NKV, s->HS);
        free(of), free(lf);
    }
    uint16_t *det[3] = {NULL, NULL, NULL}, *fast[2] = {NULL, NULL};
    for (int r = 0; r < 3; r++) det[r] = cudnn_backward(s, ddo, dq, o, l, 1);
    for (int r = 0; r < 2; r++) fast[r] = cudnn_backward(s, ddo, dq, o, l, 0);
    for (int v = 0; v < 2; v++) {
        uint16_t *b = v ? fast[0] : det[0];
        if (!b) continue;
        float *g = widen(b, s->nqkv);
        snprintf(tag, sizeof tag, "%s bwd %s vs ours", s->tag, v ? "fast" : "det ");
        expect_dqkv(tag, g, ours, s->B * s->T, s->NH, s->NKV, s->HS, TOL_PAIR);
        if (cpu_g) {
            snprintf(tag, sizeof tag, "%s bwd %s vs cpu ", s->tag, v ? "fast" : "det ");
            expect_dqkv(tag, g, cpu_g, s->B * s->T, s->NH, s->NKV, s->HS, TOL);
        }
        free(g);
    }
    if (det[0] && det[1] && det[2])
        CHECK(same_bytes(det[0], det[1], bytes) && same_bytes(det[0], det[2], bytes),
              "%s: the deterministic cuDNN backward differs bitwise between runs", s->tag);
    if (fast[0] && fast[1])
        ot_log("    %-64s %s\n", "fast backward, two runs:", same_bytes(fast[0], fast[1], bytes) ? "bitwise equal"
                                                                                              : "differ (allowed: dQ atomics)");
    if (dn_o && dn_l) { /* --attn cudnn-fwd: our backward reads cuDNN's out and lse */
        float *mixed = ours_backward(s, ddo, dq, dn_o, dn_l);
        snprintf(tag, sizeof tag, "%s bwd ours from cudnn's fwd", s->tag);
        expect_dqkv(tag, mixed, ours, s->B * s->T, s->NH, s->NKV, s->HS, TOL_PAIR);
        free(mixed);
    }
    free(ours), free(cpu_g);
    for (int r = 0; r < 3; r++) free(det[r]);
    for (int r = 0; r < 2; r++) free(fast[r]);
}

static void check_shape(int B, int T, int NH, int NKV, int HS, int cpu) {
    shape s = shape_of(B, T, NH, NKV, HS);
    double t0 = nb_now();
    float *qkv = randn_bf(s.nqkv, 1.0f), *dout = randn_bf(s.no, 1.0f);
    void *dq = up_bf(qkv, s.nqkv), *ddo = up_bf(dout, s.no);
    void *o = NULL, *l = NULL, *dn_o = NULL, *dn_l = NULL;
    check_forward(&s, qkv, dq, cpu, &o, &l, &dn_o, &dn_l);
    check_backward(&s, qkv, dout, dq, ddo, o, l, dn_o, dn_l, cpu);
    ot_log("    (%.1f s)\n", nb_now() - t0);
    dev_free(dq), dev_free(ddo), dev_free(o), dev_free(l), dev_free(dn_o), dev_free(dn_l);
    free(qkv), free(dout);
}

TEST_CASE(test_shapes) {
    check_shape(2, 64, 4, 4, 64, 1);
    check_shape(3, 128, 8, 2, 64, 1);   /* GQA 4 */
    check_shape(2, 128, 4, 4, 128, 1);  /* HS 128 */
    check_shape(4, 64, 8, 2, 128, 1);   /* GQA 4, HS 128 */
    check_shape(2, 100, 8, 2, 64, 1);   /* T not a multiple of 64 */
    check_shape(4, 1024, 12, 12, 64, 0); /* gpt2's heads */
}

/* ---- the backend table under each --attn mode ---- */

static int last_ran(int backward) { return (int)nb_attn_record_get(inst).last[backward]; }

TEST_CASE(test_selection) {
    shape s = shape_of(2, 128, 8, 2, 64);
    const nb_backend_i *be = &nb_backend_cuda_bf16;
    nb_task_ctx ctx = {NULL, st, inst};
    float *qkv = randn_bf(s.nqkv, 1.0f), *dout = randn_bf(s.no, 1.0f);
    void *dq = up_bf(qkv, s.nqkv), *ddo = up_bf(dout, s.no);
    void *o[2] = {dev_nan(s.no * 2), dev_nan(s.no * 2)}, *l[2] = {dev_nan(s.nl * 4), dev_nan(s.nl * 4)};
    void *g[2] = {dev_nan(s.nqkv * 2), dev_nan(s.nqkv * 2)};
    static const struct {
        const char *env;
        int fwd, bwd, det;
    } modes[] = {{"auto", NB_ATTN_RAN_OURS, NB_ATTN_RAN_OURS, 0}, /* T = 128: below NB_ATTN_AUTO_MIN_T */
                 {"fa", NB_ATTN_RAN_OURS, NB_ATTN_RAN_OURS, 0},
                 {"cudnn", NB_ATTN_RAN_CUDNN, NB_ATTN_RAN_CUDNN, 1},
                 {"cudnn-fwd", NB_ATTN_RAN_CUDNN, NB_ATTN_RAN_OURS, 0},
                 {"cudnn-fast", NB_ATTN_RAN_CUDNN, NB_ATTN_RAN_CUDNN_FAST, 0}};
    for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
        nb_attn_mode mode = NB_ATTN_AUTO;
        CHECK(nb_attn_mode_parse(modes[m].env, &mode) == 0, "--attn %s is not a mode", modes[m].env);
        nb_backend_set_attn(inst, mode);
        be->attention_fwd(&ctx, o[0], l[0], dq, s.B, s.T, s.NH, s.NKV, s.HS);
        CHECK(last_ran(0) == modes[m].fwd, "--attn %s: the forward ran %s", modes[m].env,
              nb_attn_ran_name((nb_attn_ran)last_ran(0)));
        if (modes[m].fwd == NB_ATTN_RAN_CUDNN) nb_cudnn_attention_forward_bf16(inst, o[1], l[1], dq, s.B, s.T, s.NH, s.NKV, s.HS, st);
        else nb_cuda_attention_forward_bf16(o[1], l[1], dq, s.B, s.T, s.NH, s.NKV, s.HS, st);
        be->attention_bwd_set(&ctx, g[0], ddo, dq, o[1], l[1], s.B, s.T, s.NH, s.NKV, s.HS);
        CHECK(last_ran(1) == modes[m].bwd, "--attn %s: the backward ran %s", modes[m].env,
              nb_attn_ran_name((nb_attn_ran)last_ran(1)));
        if (modes[m].bwd == NB_ATTN_RAN_OURS)
            nb_cuda_attention_backward_set_bf16(g[1], ddo, dq, o[1], l[1], s.B, s.T, s.NH, s.NKV, s.HS, st);
        else
            nb_cudnn_attention_backward_set_bf16(inst, g[1], ddo, dq, o[1], l[1], s.B, s.T, s.NH, s.NKV, s.HS, modes[m].det, st);
        void *a = down_raw(o[0], s.no * 2), *b = down_raw(o[1], s.no * 2);
        CHECK(same_bytes(a, b, s.no * 2), "--attn %s: the table's forward is not the launcher's", modes[m].env);
        free(a), free(b);
        if (modes[m].bwd != NB_ATTN_RAN_CUDNN_FAST) { /* the fast one varies run to run */
            a = down_raw(g[0], s.nqkv * 2), b = down_raw(g[1], s.nqkv * 2);
            CHECK(same_bytes(a, b, s.nqkv * 2), "--attn %s: the table's backward is not the launcher's", modes[m].env);
            free(a), free(b);
        }
        ot_log("    --attn %-10s forward %-10s backward %s\n", modes[m].env, nb_attn_ran_name((nb_attn_ran)last_ran(0)),
               nb_attn_ran_name((nb_attn_ran)last_ran(1)));
    }
    /* a qkv 2 bytes into its allocation: cuDNN's 16-byte views refuse it, ours take it */
    nb_backend_set_attn(inst, NB_ATTN_CUDNN);
    float *q2 = zeros(s.nqkv + 1);
    memcpy(q2 + 1, qkv, s.nqkv * sizeof(float));
    void *dq2 = up_bf(q2, s.nqkv + 1);
    const nb_bf16 *odd = (const nb_bf16 *)dq2 + 1;
    CHECK(nb_cudnn_attention_forward_bf16(inst, o[0], l[0], odd, s.B, s.T, s.NH, s.NKV, s.HS, st) != 0,
          "cuDNN took a qkv that is not 16-byte aligned");
    be->attention_fwd(&ctx, o[0], l[0], odd, s.B, s.T, s.NH, s.NKV, s.HS);
    CHECK(last_ran(0) == NB_ATTN_RAN_OURS, "an unaligned qkv did not fall back to our kernels");
    nb_cuda_attention_forward_bf16(o[1], l[1], odd, s.B, s.T, s.NH, s.NKV, s.HS, st);
    void *a = down_raw(o[0], s.no * 2), *b = down_raw(o[1], s.no * 2);
    CHECK(same_bytes(a, b, s.no * 2), "the fallback's forward is not our launcher's");
    CHECK(nb_attn_record_get(inst).why[0] != 0, "a refusal left no reason");
    ot_log("    refusal recorded: %s\n", refusal());
    free(a), free(b), free(q2);
    nb_backend_set_attn(inst, NB_ATTN_AUTO); /* auto: cuDNN's deterministic pair from NB_ATTN_AUTO_MIN_T tokens */
    CHECK(nb_attn_mode_for(NB_ATTN_AUTO, NB_ATTN_AUTO_MIN_T) == NB_ATTN_CUDNN &&
              nb_attn_mode_for(NB_ATTN_AUTO, NB_ATTN_AUTO_MIN_T - 1) == NB_ATTN_FA,
          "--attn auto does not pick cudnn from %d tokens and fa below", NB_ATTN_AUTO_MIN_T);
    dev_free(dq), dev_free(ddo), dev_free(dq2);
    for (int i = 0; i < 2; i++) dev_free(o[i]), dev_free(l[i]), dev_free(g[i]);
    free(qkv), free(dout);
}

/* ---- inside a captured CUDA graph ---- */

TEST_CASE(test_capture) {
    shape s = shape_of(2, 128, 4, 4, 64), s2 = shape_of(1, 96, 4, 4, 64);
    float *qkv = randn_bf(s.nqkv, 1.0f), *dout = randn_bf(s.no, 1.0f);
    void *dq = up_bf(qkv, s.nqkv), *ddo = up_bf(dout, s.no);
    void *oe = dev_nan(s.no * 2), *le = dev_nan(s.nl * 4), *ge = dev_nan(s.nqkv * 2);
    void *oc = dev_nan(s.no * 2), *lc = dev_nan(s.nl * 4), *gc = dev_nan(s.nqkv * 2);
    void *o2 = dev_nan(s2.no * 2), *l2 = dev_nan(s2.nl * 4);
    /* eager first: builds the plans */
    int rc = nb_cudnn_attention_forward_bf16(inst, oe, le, dq, s.B, s.T, s.NH, s.NKV, s.HS, st);
    rc |= nb_cudnn_attention_backward_set_bf16(inst, ge, ddo, dq, oe, le, s.B, s.T, s.NH, s.NKV, s.HS, 1, st);
    CHECK(rc == 0, "cuDNN refused the eager calls: %s", refusal());
    CUDA_CHECK(cudaStreamSynchronize(st));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    int rf = nb_cudnn_attention_forward_bf16(inst, oc, lc, dq, s.B, s.T, s.NH, s.NKV, s.HS, st);
    int rb = nb_cudnn_attention_backward_set_bf16(inst, gc, ddo, dq, oc, lc, s.B, s.T, s.NH, s.NKV, s.HS, 1, st);
    int rn = nb_cudnn_attention_forward_bf16(inst, o2, l2, dq, s2.B, s2.T, s2.NH, s2.NKV, s2.HS, st);
    CUDA_CHECK(cudaStreamEndCapture(st, &graph));
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CUDA_CHECK(cudaGraphLaunch(exec, st));
    CUDA_CHECK(cudaStreamSynchronize(st));
    CHECK(rf == 0 && rb == 0, "cuDNN refused a built plan inside the capture: %s", refusal());
    CHECK(rn != 0, "a shape first seen inside a capture must be refused (no plan is built there)");
    void *a = down_raw(oe, s.no * 2), *b = down_raw(oc, s.no * 2);
    CHECK(same_bytes(a, b, s.no * 2), "the captured forward differs from the eager one");
    free(a), free(b);
    a = down_raw(ge, s.nqkv * 2), b = down_raw(gc, s.nqkv * 2);
    CHECK(same_bytes(a, b, s.nqkv * 2), "the captured deterministic backward differs from the eager one");
    free(a), free(b);
    ot_log("    graph replay bitwise the eager calls; a new shape inside the capture was refused\n");
    CUDA_CHECK(cudaGraphExecDestroy(exec));
    CUDA_CHECK(cudaGraphDestroy(graph));
    dev_free(dq), dev_free(ddo), dev_free(oe), dev_free(le), dev_free(ge), dev_free(oc), dev_free(lc), dev_free(gc);
    dev_free(o2), dev_free(l2);
    free(qkv), free(dout);
}

/* ---- timing ---- */

static void *dev_rand_bf16(size_t n, float scale, uint32_t seed) {
    uint16_t *h = nb_malloc(n * 2, "bench staging");
    uint32_t s = seed;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u; /* a cheap LCG: random enough, fast for 100M+ elements */
        h[i] = f2bf(scale * ((float)(s >> 8) / 16777216.0f - 0.5f));
    }
    void *d = NULL;
    CUDA_CHECK(cudaMalloc(&d, n * 2));
    CUDA_CHECK(cudaMemcpy(d, h, n * 2, cudaMemcpyHostToDevice));
    free(h);
    return d;
}

typedef struct {
    shape s;
    void *qkv, *dout, *out, *lse, *dqkv;
} bench_case;

enum { B_OURS, B_CUDNN_DET, B_CUDNN_FAST };

/* One call; 0 if the implementation took it. */
static int bench_call(bench_case *c, int bwd, int impl) {
    const shape *s = &c->s;
    if (!bwd && impl == B_OURS) {
        nb_cuda_attention_forward_bf16(c->out, c->lse, c->qkv, s->B, s->T, s->NH, s->NKV, s->HS, st);
        return 0;
    }
    if (!bwd) return nb_cudnn_attention_forward_bf16(inst, c->out, c->lse, c->qkv, s->B, s->T, s->NH, s->NKV, s->HS, st);
    if (impl == B_OURS) {
        nb_cuda_attention_backward_set_bf16(c->dqkv, c->dout, c->qkv, c->out, c->lse, s->B, s->T, s->NH, s->NKV,
                                            s->HS, st);
        return 0;
    }
    return nb_cudnn_attention_backward_set_bf16(inst, c->dqkv, c->dout, c->qkv, c->out, c->lse, s->B, s->T, s->NH, s->NKV,
                                                s->HS, impl == B_CUDNN_DET, st);
}

/* Mean ms of 20 calls after 3 warm-ups (cudaEvents around the 20); < 0 if refused. */
static double bench_ms(bench_case *c, int bwd, int impl) {
    for (int w = 0; w < 3; w++)
        if (bench_call(c, bwd, impl)) return -1;
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    CUDA_CHECK(cudaEventRecord(e0, st));
    for (int r = 0; r < 20; r++) bench_call(c, bwd, impl);
    CUDA_CHECK(cudaEventRecord(e1, st));
    CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    CUDA_CHECK(cudaEventDestroy(e0));
    CUDA_CHECK(cudaEventDestroy(e1));
    return ms / 20.0;
}

static void bench_shape(const char *name, int B, int T, int NH, int NKV, int HS) {
    bench_case c = {shape_of(B, T, NH, NKV, HS), NULL, NULL, NULL, NULL, NULL};
    c.qkv = dev_rand_bf16(c.s.nqkv, 4.0f, 12345u); /* scores of std ~1: a realistic softmax */
    c.dout = dev_rand_bf16(c.s.no, 1.0f, 777u);
    c.dqkv = dev_nan(c.s.nqkv * 2), c.out = dev_nan(c.s.no * 2), c.lse = dev_nan(c.s.nl * 4);
    nb_cuda_attention_forward_bf16(c.out, c.lse, c.qkv, B, T, NH, NKV, HS, st);
    double flop_fwd = 2.0 * B * NH * (double)T * T * HS; /* causal: half of 4 B NH T^2 HS */
    static const char *impl_name[3] = {"nobubble", "cudnn (deterministic)", "cudnn-fast"};
    for (int bwd = 0; bwd < 2; bwd++) {
        double flop = flop_fwd * (bwd ? 2.5 : 1.0), ours = 0;
        for (int impl = 0; impl < (bwd ? 3 : 2); impl++) {
            double ms = bench_ms(&c, bwd, impl);
            const char *label = bwd ? impl_name[impl] : impl ? "cudnn" : "nobubble";
            if (impl == B_OURS) ours = ms;
            if (ms < 0) {
                printf("  %-9s %s %-22s refused: %s\n", name, bwd ? "bwd" : "fwd", label, refusal());
                continue;
            }
            size_t ws = impl == B_OURS ? 0 : nb_cudnn_attention_workspace(inst, B, T, NH, NKV, HS, bwd, impl == B_CUDNN_DET);
            char wsb[32];
            printf("  %-9s %s %-22s %8.3f ms %7.1f TFLOP/s %6.2fx ours", name, bwd ? "bwd" : "fwd", label, ms,
                   flop / ms / 1e9, ours / ms);
            if (impl != B_OURS) printf("   scratch %s", nb_fmt_bytes(wsb, sizeof wsb, (double)ws));
            printf("\n");
        }
    }
    dev_free(c.qkv), dev_free(c.dout), dev_free(c.dqkv), dev_free(c.out), dev_free(c.lse);
}

static void bench(void) {
    printf("bf16 causal attention, mean of 20 calls after 3 warm-ups; TFLOP/s from 2*B*NH*T*T*HS (fwd), 2.5x (bwd)\n");
    bench_shape("gpt2", 32, 1024, 12, 12, 64);
    bench_shape("llama-1b", 16, 2048, 32, 8, 64);
}

/* cuDNN loaded and this file's backend instance made, once; 0 (the row skips) where cuDNN is not
 * usable. */
static int cudnn_ready(void) {
    static int state = -1;
    static char why[400];
    if (state < 0) {
        int version = nb_cudnn_available(why, sizeof why);
        state = version != 0;
        if (state) {
            printf("cuDNN %d.%d.%d\n", version / 10000, version / 100 % 100, version % 100);
            inst = nb_backend_create("cuda", ""); /* also keeps the stream-ordered pool's memory mapped */
        }
    }
    if (!state) ot_skip("cuDNN is not usable here");
    if (!state) ot_log("cuDNN: %s\n", why);
    return state;
}
static void row_shapes(void) {
    if (cudnn_ready()) test_shapes();
}
static void row_selection(void) {
    if (cudnn_ready()) test_selection();
}
static void row_capture(void) {
    if (cudnn_ready()) test_capture();
}
static void row_bench(void) {
    if (cudnn_ready()) bench();
}
#define FN(f) f
#else
#define FN(f) NULL
#endif /* NB_WITH_CUDA */

static const ot_row rows[] = {
    {"attention_cudnn", "cuda", OT_BF16, "T 64 .. 1024, GQA 4, HS 64, 128", 1e-2, OT_EVAL, FN(row_shapes), 0, 0},
    {"attention_cudnn_select", "cuda", OT_BF16, "each --attn mode, unaligned qkv", 0, OT_EVAL, FN(row_selection), 0, 0},
    {"attention_cudnn_graph", "cuda", OT_BF16, "plan replay in a captured graph", 0, OT_EVAL, FN(row_capture), 0, 0},
    {"attention_cudnn", "cuda", OT_BF16, "gpt2 B32 T1024, llama-1b B16 T2048", 0, OT_PERF, FN(row_bench), 0, 0},
};
OT_TABLE(ot_attention_cudnn, rows);
