/* Attention-family CPU ops (rope, causal GQA attention, cross-entropy, softmax) against plain
 * double-precision forwards written here (attention through a materialized T x T score matrix):
 * eval mode checks each forward and the backward's semantics (accumulation, NULL, determinism
 * over thread counts and chunkings), grad mode each backward against central finite differences.
 * Sizes are odd on purpose (T = 7, V = 37, C = 13, HS = 12) so tail loops and partial chunks run. */
#include <omp.h>
#include <stdint.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ops/ops.h"
#include "optest.h"
#include "uref.h"

/* ---- rope ---- */

typedef struct {
    int B, T, nh, HS, W, off;
    nb_rope rope;
    const float *wout; /* [B, T, W] weights of the scalar loss sum(wout * y) */
} rope_ctx;

/* inv_freq in double, from the formulas as transformers' modeling_rope_utils.py states them
 * (default, linear, llama3), not from rope.c's float expressions. */
static double ref_inv_freq(const nb_rope *r, int i, int HS) {
    double inv = pow((double)r->theta, -2.0 * i / HS);
    if (r->type == NB_ROPE_LINEAR) return inv / r->factor;
    if (r->type != NB_ROPE_LLAMA3) return inv;
    double wavelen = 2 * M_PI / inv, low = r->original_ctx / (double)r->low_freq_factor;
    double high = r->original_ctx / (double)r->high_freq_factor;
    if (wavelen < high) return inv;
    if (wavelen > low) return inv / r->factor;
    double s = (r->original_ctx / wavelen - r->low_freq_factor) / ((double)r->high_freq_factor - r->low_freq_factor);
    return (1 - s) * inv / r->factor + s * inv;
}

/* y = x with columns [off, off + nh*HS) of each row rotated (HF rotate_half), the rest passed
 * through: what nb_rope_forward does to a row of width W. */
static void rope_ref(double *y, const double *x, const rope_ctx *c) {
    int h = c->HS / 2;
    memcpy(y, x, (size_t)c->B * c->T * c->W * sizeof(double));
    for (int b = 0; b < c->B; b++)
        for (int t = 0; t < c->T; t++)
            for (int hd = 0; hd < c->nh; hd++) {
                size_t base = ((size_t)b * c->T + t) * c->W + c->off + (size_t)hd * c->HS;
                for (int i = 0; i < h; i++) {
                    double ang = t * ref_inv_freq(&c->rope, i, c->HS);
                    double a = x[base + i], bb = x[base + i + h];
                    y[base + i] = a * cos(ang) - bb * sin(ang);
                    y[base + i + h] = bb * cos(ang) + a * sin(ang);
                }
            }
}

static double rope_loss(const double *x, const void *vctx) {
    const rope_ctx *c = vctx;
    size_t n = (size_t)c->B * c->T * c->W;
    double *y = dalloc(n);
    rope_ref(y, x, c);
    double L = 0;
    for (size_t i = 0; i < n; i++) L += c->wout[i] * y[i];
    free(y);
    return L;
}

static void check_rope(nb_rope rope) {
    ur_reset();
    rope_ctx c = {2, 7, 3, 12, 0, 5, rope, NULL};
    c.W = c.off + c.nh * c.HS + 4; /* pass-through columns on both sides of the heads */
    size_t n = (size_t)c.B * c.T * c.W;
    float *x = falloc(n), *y = falloc(n), *wout = falloc(n), *dx = falloc(n);
    double *xd = dalloc(n), *yd = dalloc(n), *gd = dalloc(n);
    fill(x, n, -1, 1);
    fill(wout, n, -1, 1);
    c.wout = wout;
    to_double(xd, x, n);

    memcpy(y, x, n * sizeof(float));
    nb_rope_forward(y + c.off, c.B, c.T, c.nh, c.HS, c.W, &c.rope);
    rope_ref(yd, xd, &c);
    double e = rel_err_d(y, yd, n);
    if (ot_eval()) ot_err(e, 1e-6);
    CHECK(e < 1e-6, "rope forward rel err %.3g", e);
    for (int r = 0; r < c.B * c.T; r++) /* untouched columns are bitwise untouched */
        for (int j = 0; j < c.W; j++)
            if (j < c.off || j >= c.off + c.nh * c.HS)
                CHECK(y[(size_t)r * c.W + j] == x[(size_t)r * c.W + j], "column %d of row %d changed", j, r);

    memcpy(dx, wout, n * sizeof(float));
    nb_rope_backward(dx + c.off, c.B, c.T, c.nh, c.HS, c.W, &c.rope);
    if (ot_grad()) {
        finite_diff(gd, xd, n, rope_loss, &c, 1e-5);
        e = rel_err_d(dx, gd, n);
        ot_err(e, 1e-6);
        CHECK(e < 1e-6, "rope backward vs finite differences rel err %.3g", e);
    }

    /* forward then backward on the same buffer is the identity (a rotation's transpose) */
    memcpy(y, x, n * sizeof(float));
    nb_rope_forward(y + c.off, c.B, c.T, c.nh, c.HS, c.W, &c.rope);
    nb_rope_backward(y + c.off, c.B, c.T, c.nh, c.HS, c.W, &c.rope);
    double back = rel_err(y, x, n);
    CHECK(back < 1e-6, "rope backward(forward(x)) != x, rel err %.3g", back);
    free(x), free(y), free(wout), free(dx), free(xd), free(yd), free(gd);
}

TEST_CASE(test_rope) { check_rope(nb_rope_plain(10000.0f)); }
TEST_CASE(test_rope_linear) {
    nb_rope r = nb_rope_plain(10000.0f);
    r.type = NB_ROPE_LINEAR, r.factor = 4.0f;
    check_rope(r);
}
/* At HS 12 and theta 1e4 the wavelengths are 6.3, 29, 135, 628, 2916 and 13539: with an
 * original context of 1024 and low/high frequency factors 1 and 4 (bounds 1024 and 256) pairs
 * 0-2 keep their frequency, pair 3 is interpolated and pairs 4-5 are divided by the factor. */
TEST_CASE(test_rope_llama3) {
    nb_rope r = {10000.0f, NB_ROPE_LLAMA3, 8.0f, 1.0f, 4.0f, 1024};
    check_rope(r);
    nb_rope plain = nb_rope_plain(10000.0f);
    for (int i = 0; i < 3; i++)
        CHECK(nb_rope_inv_freq(&r, i, 12) == nb_rope_inv_freq(&plain, i, 12), "pair %d: high frequency changed", i);
    for (int i = 4; i < 6; i++)
        CHECK(nb_rope_inv_freq(&r, i, 12) == nb_rope_inv_freq(&plain, i, 12) / 8.0f, "pair %d: not divided by 8", i);
    float mid = nb_rope_inv_freq(&r, 3, 12), p3 = nb_rope_inv_freq(&plain, 3, 12);
    CHECK(mid < p3 && mid > p3 / 8.0f, "pair 3: %g is not between %g and %g", (double)mid, (double)p3 / 8, (double)p3);
}

/* Llama 3.1's own numbers (theta 5e5, HS 128, factor 8, 1, 4, 8192): inv_freq of pairs in each
 * band (28: kept, 29-34: interpolated, 35+: divided) against values computed in double in
 * Python from the formula of _compute_llama3_parameters (float32 rounding stays within 1e-6),
 * then bit for bit against the formula's float32 ops. */
TEST_CASE(test_rope_llama31_freqs) {
    static const struct {
        int i;
        double want;
    } ref[] = {{0, 1.0},
               {20, 0.016560440080994446},
               {28, 0.0032114459947525913},
               {29, 0.002166570763503359},
               {31, 0.0008567514129196321},
               {34, 0.00017850781276799638},
               {35, 9.556212353964683e-05},
               {63, 3.068925988914511e-07}};
    nb_rope r = {500000.0f, NB_ROPE_LLAMA3, 8.0f, 1.0f, 4.0f, 8192};
    double worst = 0;
    for (size_t k = 0; k < sizeof ref / sizeof ref[0]; k++) {
        double got = nb_rope_inv_freq(&r, ref[k].i, 128), e = fabs(got - ref[k].want) / ref[k].want;
        CHECK(e < 1e-6, "pair %d: inv_freq %.9g, want %.9g", ref[k].i, got, ref[k].want);
        if (e > worst) worst = e;
    }
    /* Bit for bit: the float32 ops of the formula (Python, each result rounded with struct, as
     * torch rounds each tensor op) from the same unscaled inv_freq; pairs 28-36 cross both band
     * edges. A pair whose unscaled value differs from Python's powf emulation is skipped. */
    static const uint32_t plain_bits[] = {0x3b527720, 0x3b2b72dc, 0x3b0baa41, 0x3ae38c10, 0x3ab95d21,
                                          0x3a970023, 0x3a7603ea, 0x3a486886, 0x3a23418d};
    static const uint32_t want_bits[] = {0x3b527720, 0x3b0dfd06, 0x3ab3d11d, 0x3a60979e, 0x3a0995d2,
                                         0x39a3f108, 0x393b2dd2, 0x38c86886, 0x38a3418d};
    nb_rope plain = nb_rope_plain(500000.0f);
    int same = 0;
    for (int k = 0; k < 9; k++) {
        float p = nb_rope_inv_freq(&plain, 28 + k, 128), got = nb_rope_inv_freq(&r, 28 + k, 128);
        uint32_t pb, gb;
        memcpy(&pb, &p, 4), memcpy(&gb, &got, 4);
        if (pb != plain_bits[k]) continue;
        same++;
        CHECK(gb == want_bits[k], "pair %d: llama3 inv_freq bits %08x, want %08x", 28 + k, (unsigned)gb,
              (unsigned)want_bits[k]);
    }
    CHECK(same >= 7, "only %d of 9 unscaled frequencies match Python's", same);
    if (ot_eval()) ot_err(worst, 1e-6);
}

/* ---- attention ---- */

typedef struct {
    int B, T, NH, NKV, HS;
    const float *wout; /* [B, T, NH*HS] */
} attn_ctx;

/* Materialized causal GQA attention in double. out[B,T,NH*HS], lse[B,NH,T]. */
static void attn_ref(double *out, double *lse, const double *qkv, const attn_ctx *c) {
    int R = (c->NH + 2 * c->NKV) * c->HS, grp = c->NH / c->NKV;
    double scale = 1.0 / sqrt((double)c->HS);
    double *s = dalloc((size_t)c->T * c->T);
    for (int b = 0; b < c->B; b++)
        for (int h = 0; h < c->NH; h++) {
            int kvh = h / grp;
            for (int t = 0; t < c->T; t++) {
                const double *q = qkv + ((size_t)b * c->T + t) * R + h * c->HS;
                double mx = -INFINITY;
                for (int j = 0; j <= t; j++) {
                    const double *k = qkv + ((size_t)b * c->T + j) * R + (c->NH + kvh) * c->HS;
                    double d = 0;
                    for (int i = 0; i < c->HS; i++) d += q[i] * k[i];
                    s[t * c->T + j] = d * scale;
                    if (d * scale > mx) mx = d * scale;
                }
                double sum = 0;
                for (int j = 0; j <= t; j++) sum += exp(s[t * c->T + j] - mx);
                double l = mx + log(sum);
                if (lse) lse[((size_t)b * c->NH + h) * c->T + t] = l;
                double *o = out + ((size_t)b * c->T + t) * c->NH * c->HS + h * c->HS;
                for (int i = 0; i < c->HS; i++) o[i] = 0;
                for (int j = 0; j <= t; j++) {
                    const double *v = qkv + ((size_t)b * c->T + j) * R + (c->NH + c->NKV + kvh) * c->HS;
                    double p = exp(s[t * c->T + j] - l);
                    for (int i = 0; i < c->HS; i++) o[i] += p * v[i];
                }
            }
        }
    free(s);
}

static double attn_loss(const double *qkv, const void *vctx) {
    const attn_ctx *c = vctx;
    size_t no = (size_t)c->B * c->T * c->NH * c->HS;
    double *out = dalloc(no);
    attn_ref(out, NULL, qkv, c);
    double L = 0;
    for (size_t i = 0; i < no; i++) L += c->wout[i] * out[i];
    free(out);
    return L;
}

static void attn_case(int B, int T, int NH, int NKV, int HS) {
    attn_ctx c = {B, T, NH, NKV, HS, NULL};
    size_t nq = (size_t)B * T * (NH + 2 * NKV) * HS, no = (size_t)B * T * NH * HS, nl = (size_t)B * NH * T;
    float *qkv = falloc(nq), *out = falloc(no), *lse = falloc(nl), *dout = falloc(no);
    float *dqkv = falloc(nq), *acc = falloc(nq), *pre = falloc(nq);
    double *qd = dalloc(nq), *outd = dalloc(no), *lsed = dalloc(nl), *gd = dalloc(nq);
    fill(qkv, nq, -1.5f, 1.5f);
    fill(dout, no, -1, 1);
    fill(pre, nq, -1, 1);
    c.wout = dout;
    to_double(qd, qkv, nq);

    nb_attention_forward(out, lse, qkv, B, T, NH, NKV, HS);
    attn_ref(outd, lsed, qd, &c);
    double eo = rel_err_d(out, outd, no), el = rel_err_d(lse, lsed, nl);
    if (ot_eval()) ot_err(eo, 1e-6), ot_err(el, 1e-6);
    CHECK(eo < 1e-6 && el < 1e-6, "B%d T%d NH%d NKV%d HS%d: forward rel err out %.3g lse %.3g", B, T, NH,
          NKV, HS, eo, el);

    nb_attention_backward(dqkv, dout, qkv, out, lse, B, T, NH, NKV, HS);
    if (ot_grad()) {
        finite_diff(gd, qd, nq, attn_loss, &c, 1e-5);
        double eg = rel_err_d(dqkv, gd, nq);
        ot_err(eg, 1e-5);
        CHECK(eg < 1e-5, "B%d T%d NH%d NKV%d HS%d: dqkv vs finite differences rel err %.3g", B, T, NH, NKV,
              HS, eg);
    }

    /* backward accumulates: starting from pre it ends at pre + gradient */
    memcpy(acc, pre, nq * sizeof(float));
    nb_attention_backward(acc, dout, qkv, out, lse, B, T, NH, NKV, HS);
    double worst = 0;
    for (size_t i = 0; i < nq; i++) {
        double d = fabs((double)acc[i] - ((double)pre[i] + dqkv[i]));
        if (d > worst) worst = d;
    }
    CHECK(worst < 1e-5, "attention backward does not accumulate: max |acc - (pre + g)| = %.3g", worst);
    nb_attention_backward(NULL, dout, qkv, out, lse, B, T, NH, NKV, HS); /* NULL: nothing to do */
    free(qkv), free(out), free(lse), free(dout), free(dqkv), free(acc), free(pre);
    free(qd), free(outd), free(lsed), free(gd);
}

TEST_CASE(test_attention_gqa) { attn_case(2, 7, 4, 2, 8); }
TEST_CASE(test_attention_mha) { attn_case(2, 7, 2, 2, 8); }
TEST_CASE(test_attention_mqa_odd_hs) { attn_case(1, 5, 3, 1, 12); }
TEST_CASE(test_attention_t1) { attn_case(2, 1, 2, 1, 4); }

/* Same inputs, 1 vs 2 threads and twice with 2: bitwise equal out, lse and dqkv. */
TEST_CASE(test_attention_deterministic) {
    ur_reset();
    int B = 3, T = 33, NH = 4, NKV = 2, HS = 16;
    size_t nq = (size_t)B * T * (NH + 2 * NKV) * HS, no = (size_t)B * T * NH * HS, nl = (size_t)B * NH * T;
    float *qkv = falloc(nq), *dout = falloc(no);
    fill(qkv, nq, -2, 2);
    fill(dout, no, -1, 1);
    float *out[3], *lse[3], *dq[3];
    int threads[3] = {1, 2, 2};
    int saved = omp_get_max_threads();
    for (int r = 0; r < 3; r++) {
        out[r] = falloc(no), lse[r] = falloc(nl), dq[r] = falloc(nq);
        omp_set_num_threads(threads[r]);
        nb_attention_forward(out[r], lse[r], qkv, B, T, NH, NKV, HS);
        nb_attention_backward(dq[r], dout, qkv, out[r], lse[r], B, T, NH, NKV, HS);
    }
    omp_set_num_threads(saved);
    for (int r = 1; r < 3; r++) {
        CHECK(memcmp(out[0], out[r], no * sizeof(float)) == 0, "attention out differs in run %d", r);
        CHECK(memcmp(lse[0], lse[r], nl * sizeof(float)) == 0, "attention lse differs in run %d", r);
        CHECK(memcmp(dq[0], dq[r], nq * sizeof(float)) == 0, "attention dqkv differs in run %d", r);
    }
    for (int r = 0; r < 3; r++) free(out[r]), free(lse[r]), free(dq[r]);
    free(qkv), free(dout);
}

/* ---- cross-entropy ---- */

typedef struct {
    int N, C, V;
    const int32_t *tg;
    double grad_scale;
    const double *w;   /* used when differentiating w.r.t. inp */
    const double *inp; /* used when differentiating w.r.t. w */
} xent_ctx;

/* losses[N] = -log softmax(inp @ w^T)[target], in double. */
static double xent_ref(double *losses, const double *inp, const double *w, const xent_ctx *c) {
    double total = 0;
    double *z = dalloc((size_t)c->V);
    for (int r = 0; r < c->N; r++) {
        if (c->tg[r] == NB_XENT_IGNORE) { /* a masked row counts for nothing */
            if (losses) losses[r] = 0;
            continue;
        }
        double mx = -INFINITY;
        for (int j = 0; j < c->V; j++) {
            double d = 0;
            for (int i = 0; i < c->C; i++) d += inp[(size_t)r * c->C + i] * w[(size_t)j * c->C + i];
            z[j] = d;
            if (d > mx) mx = d;
        }
        double sum = 0;
        for (int j = 0; j < c->V; j++) sum += exp(z[j] - mx);
        double l = mx + log(sum) - z[c->tg[r]];
        if (losses) losses[r] = l;
        total += l;
    }
    free(z);
    return total;
}
static double xent_loss_inp(const double *inp, const void *v) {
    const xent_ctx *c = v;
    return c->grad_scale * xent_ref(NULL, inp, c->w, c);
}
static double xent_loss_w(const double *w, const void *v) {
    const xent_ctx *c = v;
    return c->grad_scale * xent_ref(NULL, c->inp, w, c);
}

/* The op's gradients (dinp, dw) against finite differences of the double reference at inpd and wd
 * (c->inp and c->w point at them); gi and gw are scratch of their sizes. */
static void xent_grad_check(xent_ctx *c, double *inpd, double *wd, const float *dinp, const float *dw, double *gi,
                            double *gw, const char *what) {
    size_t ni = (size_t)c->N * c->C, nw = (size_t)c->V * c->C;
    finite_diff(gi, inpd, ni, xent_loss_inp, c, 1e-5);
    finite_diff(gw, wd, nw, xent_loss_w, c, 1e-5);
    double ei = rel_err_d(dinp, gi, ni), ew = rel_err_d(dw, gw, nw);
    ot_err(ei, 1e-5), ot_err(ew, 1e-5);
    CHECK(ei < 1e-5 && ew < 1e-5, "%s grads vs finite differences: dinp %.3g dw %.3g", what, ei, ew);
}

TEST_CASE(test_xent) {
    ur_reset();
    int N = 10, C = 13, V = 37, Vp = 40;
    float gs = 1.0f / N;
    float *inp = falloc((size_t)N * C), *w = falloc((size_t)Vp * C), *losses = falloc(N);
    float *dinp = falloc((size_t)N * C), *dw = falloc((size_t)Vp * C);
    int32_t tg[10];
    fill(inp, (size_t)N * C, -1, 1);
    fill(w, (size_t)V * C, -1, 1);
    for (size_t i = (size_t)V * C; i < (size_t)Vp * C; i++) w[i] = NAN; /* padding: must never be read */
    for (size_t i = (size_t)V * C; i < (size_t)Vp * C; i++) dw[i] = 123.0f;
    for (int r = 0; r < N; r++) tg[r] = (int32_t)((r * 11 + 3) % V);
    tg[0] = 0, tg[1] = V - 1;
    double *inpd = dalloc((size_t)N * C), *wd = dalloc((size_t)V * C), *ld = dalloc(N);
    double *gi = dalloc((size_t)N * C), *gw = dalloc((size_t)V * C);
    to_double(inpd, inp, (size_t)N * C);
    to_double(wd, w, (size_t)V * C);
    xent_ctx c = {N, C, V, tg, gs, wd, inpd};

    /* chunk_rows 4: chunks of 4, 4, 2 rows */
    double sum = nb_xent_forward_backward(dinp, dw, losses, inp, w, tg, N, C, V, gs, 4);
    double sumd = xent_ref(ld, inpd, wd, &c);
    CHECK(fabs(sum - sumd) < 1e-5 * fabs(sumd), "loss sum %.9g vs reference %.9g", sum, sumd);
    double el = rel_err_d(losses, ld, N);
    if (ot_eval()) ot_err(el, 1e-6);
    CHECK(el < 1e-6, "losses rel err %.3g", el);
    if (ot_grad()) xent_grad_check(&c, inpd, wd, dinp, dw, gi, gw, "xent");
    int pad_ok = 1;
    for (size_t i = (size_t)V * C; i < (size_t)Vp * C; i++) pad_ok &= dw[i] == 123.0f;
    CHECK(pad_ok, "padding rows of dw were written");

    /* default chunk, and one chunk bigger than N: same values (GEMM blocking may round differently) */
    int chunks[2] = {0, 1000};
    for (int k = 0; k < 2; k++) {
        float *l2 = falloc(N), *di2 = falloc((size_t)N * C), *dw2 = falloc((size_t)Vp * C);
        double s2 = nb_xent_forward_backward(di2, dw2, l2, inp, w, tg, N, C, V, gs, chunks[k]);
        CHECK(fabs(s2 - sum) < 1e-6 * fabs(sum), "chunk_rows %d: sum %.9g vs %.9g", chunks[k], s2, sum);
        CHECK(rel_err(l2, losses, N) < 1e-6, "chunk_rows %d: losses differ", chunks[k]);
        CHECK(rel_err(di2, dinp, (size_t)N * C) < 1e-6 && rel_err(dw2, dw, (size_t)V * C) < 1e-6,
              "chunk_rows %d: gradients differ", chunks[k]);
        free(l2), free(di2), free(dw2);
    }

    /* forward only: NULL gradients, bitwise the same losses; deterministic across two runs */
    float *l3 = falloc(N);
    double s3 = nb_xent_forward_backward(NULL, NULL, l3, inp, w, tg, N, C, V, gs, 4);
    CHECK(s3 == sum && memcmp(l3, losses, N * sizeof(float)) == 0, "forward-only run differs");

    /* accumulation: dinp starts at pre, dw at its last value: both add exactly one more gradient */
    float *di4 = falloc((size_t)N * C), *dw4 = falloc((size_t)Vp * C), *pre = falloc((size_t)N * C);
    fill(pre, (size_t)N * C, -1, 1);
    memcpy(di4, pre, (size_t)N * C * sizeof(float));
    memcpy(dw4, dw, (size_t)Vp * C * sizeof(float));
    nb_xent_forward_backward(di4, dw4, NULL, inp, w, tg, N, C, V, gs, 4);
    double worst = 0;
    for (size_t i = 0; i < (size_t)N * C; i++) worst = fmax(worst, fabs(di4[i] - (pre[i] + dinp[i])));
    for (size_t i = 0; i < (size_t)V * C; i++) worst = fmax(worst, fabs(dw4[i] - 2.0 * dw[i]));
    CHECK(worst < 1e-6, "xent backward does not accumulate: max err %.3g", worst);
    free(l3), free(di4), free(dw4), free(pre);

    /* determinism: same call twice, bitwise */
    float *l5 = falloc(N), *di5 = falloc((size_t)N * C), *dw5 = falloc((size_t)Vp * C);
    for (size_t i = (size_t)V * C; i < (size_t)Vp * C; i++) dw5[i] = 123.0f;
    nb_xent_forward_backward(di5, dw5, l5, inp, w, tg, N, C, V, gs, 4);
    CHECK(memcmp(l5, losses, N * sizeof(float)) == 0 && memcmp(di5, dinp, (size_t)N * C * sizeof(float)) == 0 &&
              memcmp(dw5, dw, (size_t)Vp * C * sizeof(float)) == 0,
          "xent is not bitwise reproducible");
    free(l5), free(di5), free(dw5);
    free(inp), free(w), free(losses), free(dinp), free(dw), free(inpd), free(wd), free(ld), free(gi), free(gw);
}

/* Logits near +-2000: exp would overflow without the max subtraction. */
/* Ignored rows (NB_XENT_IGNORE, a loss mask's 0): loss 0 and gradient 0; the others are the
 * unmasked op's rows, and the gradient of grad_scale * (sum of counted losses) matches finite
 * differences (grad_scale = 1 / count, the mean over counted rows). */
TEST_CASE(test_xent_masked) {
    ur_reset();
    int N = 10, C = 13, V = 37, counted = 0;
    float *inp = falloc((size_t)N * C), *w = falloc((size_t)V * C), *l_all = falloc(N), *l = falloc(N);
    float *dinp = falloc((size_t)N * C), *dw = falloc((size_t)V * C), *dinp_all = falloc((size_t)N * C);
    float *dw_all = falloc((size_t)V * C);
    int32_t tg[10], tg_all[10];
    fill(inp, (size_t)N * C, -1, 1);
    fill(w, (size_t)V * C, -1, 1);
    for (int r = 0; r < N; r++) {
        tg_all[r] = (int32_t)((r * 11 + 3) % V);
        tg[r] = r % 3 == 1 ? NB_XENT_IGNORE : tg_all[r];
        counted += tg[r] != NB_XENT_IGNORE;
    }
    float gs = 1.0f / (float)counted;
    double sum = nb_xent_forward_backward(dinp, dw, l, inp, w, tg, N, C, V, gs, 4);
    nb_xent_forward_backward(dinp_all, dw_all, l_all, inp, w, tg_all, N, C, V, gs, 4);
    double want = 0;
    int rows_ok = 1;
    for (int r = 0; r < N; r++) {
        int ign = tg[r] == NB_XENT_IGNORE;
        if (!ign) want += l_all[r];
        rows_ok &= ign ? l[r] == 0.0f : l[r] == l_all[r];
        for (int i = 0; i < C; i++)
            rows_ok &= ign ? dinp[(size_t)r * C + i] == 0.0f : dinp[(size_t)r * C + i] == dinp_all[(size_t)r * C + i];
    }
    CHECK(rows_ok, "ignored rows must have loss 0 and gradient 0, counted rows the unmasked values");
    CHECK(fabs(sum - want) < 1e-6 * fabs(want), "masked sum %.9g vs counted rows %.9g", sum, want);
    double *inpd = dalloc((size_t)N * C), *wd = dalloc((size_t)V * C), *ld = dalloc(N);
    double *gi = dalloc((size_t)N * C), *gw = dalloc((size_t)V * C);
    to_double(inpd, inp, (size_t)N * C);
    to_double(wd, w, (size_t)V * C);
    xent_ctx c = {N, C, V, tg, gs, wd, inpd};
    double el = fabs(sum - xent_ref(ld, inpd, wd, &c)) / fabs(sum);
    if (ot_eval()) ot_err(el, 1e-6);
    CHECK(el < 1e-6, "masked loss vs double reference: rel err %.3g", el);
    if (ot_grad()) xent_grad_check(&c, inpd, wd, dinp, dw, gi, gw, "masked xent");
    free(inp), free(w), free(l_all), free(l), free(dinp), free(dw), free(dinp_all), free(dw_all);
    free(inpd), free(wd), free(ld), free(gi), free(gw);
}

TEST_CASE(test_xent_large_logits) {
    ur_reset();
    int N = 6, C = 8, V = 37;
    float *inp = falloc((size_t)N * C), *w = falloc((size_t)V * C), *losses = falloc(N);
    float *dinp = falloc((size_t)N * C);
    int32_t tg[6] = {0, 5, 36, 17, 17, 2};
    fill(inp, (size_t)N * C, -30, 30);
    fill(w, (size_t)V * C, -10, 10);
    double *inpd = dalloc((size_t)N * C), *wd = dalloc((size_t)V * C), *ld = dalloc(N);
    to_double(inpd, inp, (size_t)N * C);
    to_double(wd, w, (size_t)V * C);
    xent_ctx c = {N, C, V, tg, 1.0, wd, inpd};
    double s = nb_xent_forward_backward(dinp, NULL, losses, inp, w, tg, N, C, V, 1.0f, 4);
    double sd = xent_ref(ld, inpd, wd, &c);
    int finite = isfinite(s);
    for (size_t i = 0; i < (size_t)N * C; i++) finite &= isfinite(dinp[i]);
    CHECK(finite, "non-finite loss or gradient at large logits");
    CHECK(fabs(s - sd) < 1e-4 * fabs(sd) + 1e-3, "large-logit loss %.9g vs reference %.9g", s, sd);
    free(inp), free(w), free(losses), free(dinp), free(inpd), free(wd), free(ld);
}

/* A target outside [0, V) is a data error: the process must stop with exit status 1. */
TEST_CASE(test_xent_bad_target) {
    ur_reset();
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen("/dev/null", "w", stderr)) _exit(3);
        float inp[4] = {0}, w[8] = {0};
        int32_t tg[2] = {0, 2};
        nb_xent_forward_backward(NULL, NULL, NULL, inp, w, tg, 2, 2, 2, 1.0f, 0);
        _exit(0);
    }
    int st = 0;
    CHECK(pid > 0 && waitpid(pid, &st, 0) == pid, "fork/wait failed");
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 1, "bad target did not fail cleanly (status %d)", st);
}

TEST_CASE(test_softmax_inplace) {
    ur_reset();
    int V = 37;
    float temps[2] = {1.0f, 0.7f};
    for (int k = 0; k < 2; k++) {
        float x[37];
        double ref[37], mx = -INFINITY, sum = 0, total = 0;
        fill(x, V, -5, 5);
        x[3] = 80.0f; /* expf(80) overflows float without the max subtraction */
        for (int j = 0; j < V; j++) mx = fmax(mx, x[j] / (double)temps[k]);
        for (int j = 0; j < V; j++) sum += ref[j] = exp(x[j] / (double)temps[k] - mx);
        for (int j = 0; j < V; j++) ref[j] /= sum;
        nb_softmax_inplace(x, V, temps[k]);
        for (int j = 0; j < V; j++) total += x[j];
        double e = rel_err_d(x, ref, V);
        CHECK(e < 1e-6 && fabs(total - 1.0) < 1e-6, "temperature %g: rel err %.3g, sum %.9g", temps[k], e, total);
    }
}


static const ot_row rows[] = {
    {"xent_bad_target", "cpu", OT_NONE, "target 2 of V 2", 0, OT_EVAL, test_xent_bad_target, 0, OT_FORK},
    {"rope", "cpu", OT_F32, "2x7 3 heads HS12 W45", 1e-6, OT_EVAL | OT_GRAD, test_rope, 0, 0},
    {"rope", "cpu", OT_F32, "linear x4, 2x7 3 heads HS12", 1e-6, OT_EVAL | OT_GRAD, test_rope_linear, 0, 0},
    {"rope", "cpu", OT_F32, "llama3, 3 bands, 2x7 HS12", 1e-6, OT_EVAL | OT_GRAD, test_rope_llama3, 0, 0},
    {"rope_freqs", "cpu", OT_F32, "Llama 3.1 inv_freq vs Python", 1e-6, OT_EVAL, test_rope_llama31_freqs, 0, 0},
    {"attention", "cpu", OT_F32, "GQA B2 T7 NH4 NKV2 HS8", 1e-5, OT_EVAL | OT_GRAD, test_attention_gqa, 0, 0},
    {"attention", "cpu", OT_F32, "MHA B2 T7 NH2 HS8", 1e-5, OT_EVAL | OT_GRAD, test_attention_mha, 0, 0},
    {"attention", "cpu", OT_F32, "MQA B1 T5 NH3 NKV1 HS12", 1e-5, OT_EVAL | OT_GRAD, test_attention_mqa_odd_hs, 0, 0},
    {"attention", "cpu", OT_F32, "B2 T1 NH2 NKV1 HS4", 1e-5, OT_EVAL | OT_GRAD, test_attention_t1, 0, 0},
    {"attention_determinism", "cpu", OT_F32, "B3 T33 NH4 NKV2 HS16", 0, OT_EVAL, test_attention_deterministic, 0, 0},
    {"xent", "cpu", OT_F32, "N10 C13 V37 (pad 40), chunks", 1e-5, OT_EVAL | OT_GRAD, test_xent, 0, 0},
    {"xent_masked", "cpu", OT_F32, "N10 C13 V37, every 3rd row ignored", 1e-5, OT_EVAL | OT_GRAD, test_xent_masked, 0, 0},
    {"xent_large_logits", "cpu", OT_F32, "N6 C8 V37 logits ~2000", 1e-4, OT_EVAL, test_xent_large_logits, 0, 0},
    {"softmax", "cpu", OT_F32, "V37 temp 1, 0.7", 1e-6, OT_EVAL, test_softmax_inplace, 0, 0},
};
OT_TABLE(ot_attention, rows);
