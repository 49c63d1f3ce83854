/* Issue 18's fused and gradient-writing CUDA ops (matmul+residual, matmul+dgelu backward,
 * matmul_backward_set, swiglu/attention _set) against the CPU's unfused sequence: the cuda rows of
 * the dense family's fused ops, one per op and dtype (as dense_cuda.c: NaN-poisoned outputs,
 * bitwise repeats, f32 1e-5 and bf16 1e-2, under each environment switch). */
#include "optest.h"

#ifdef NB_WITH_CUDA
#include "dense_cuda.h"

/* ---- issue 18: fused and gradient-writing ops ----
 * Each against the CPU's unfused sequence, with NaN-poisoned outputs (a _set op must write every
 * element; an accumulating one would keep the NaN), twice for bitwise repeatability, and under
 * each of its environment switches (the paths the integrator can pick on the device). */

/* out = resid + inp @ w^T + bias; OC = 64 fuses the add into the GEMM (if cuBLASLt offers it),
 * OC = 53 and NB_FUSE_RESIDUAL=0 take the GEMM + residual kernel. */
TEST_CASE(test_matmul_residual_forward) {
    int N = 3 * 101, C = 80;
    int ocs[2] = {64, 53};
    FOR_DTYPE(bf)
        for (int k = 0; k < 2; k++)
            for (int fuse = 0; fuse <= 1; fuse++)
                for (int with_bias = 0; with_bias <= 1; with_bias++) {
                    int OC = ocs[k];
                    size_t no = (size_t)N * OC;
                    set_env("NB_FUSE_RESIDUAL", fuse);
                    float *inp = randn((size_t)N * C, 0, 1), *w = randn((size_t)OC * C, 0, 0.1f), *b = randn(OC, 0, 1);
                    float *res = randn(no, 0, 1);
                    round_bf(inp, (size_t)N * C, bf), round_bf(w, (size_t)OC * C, bf), round_bf(b, OC, bf);
                    round_bf(res, no, bf);
                    float *ref = zeros(no);
                    nb_matmul_forward(ref, inp, w, with_bias ? b : NULL, N, C, OC);
                    for (size_t i = 0; i < no; i++) ref[i] += res[i];
                    float *g[2];
                    for (int run = 0; run < 2; run++) {
                        void *di = dev_up(inp, (size_t)N * C, bf), *dw = dev_up(w, (size_t)OC * C, bf);
                        void *db = with_bias ? dev_up(b, OC, bf) : NULL, *dr = dev_up(res, no, bf);
                        void *dout = dev_nan(no, bf);
                        CALL(bf, nb_cuda_matmul_residual_forward, dout, di, dw, db, dr, N, C, OC, lt, st);
                        g[run] = zeros(no);
                        dev_down(g[run], dout, no, bf);
                        float *rback = zeros(no);
                        dev_down(rback, dr, no, bf);
                        expect_untouched("matmul+residual resid", rback, res, no);
                        free(rback);
                        dev_free(di), dev_free(dw), dev_free(db), dev_free(dr), dev_free(dout);
                    }
                    char what[96];
                    snprintf(what, sizeof what, "matmul+residual OC=%d%s%s", OC, with_bias ? " bias" : "",
                             fuse ? "" : " (unfused)");
                    expect_close(what, bf, g[0], ref, no);
                    expect_same(what, g[0], g[1], no);
                    free(inp), free(w), free(b), free(res), free(ref), free(g[0]), free(g[1]);
                }
    unsetenv("NB_FUSE_RESIDUAL");
}

/* The backward of out = gelu(pre) @ w^T + bias. C = 64: DGELU epilogue (DGELU_BGRAD with
 * NB_BGRAD=1), C = 53: the GEMM + gelu'-scale kernel, as with NB_FUSE_DGELU=0. */
TEST_CASE(test_matmul_dgelu_backward) {
    int N = 3 * 101, OC = 40;
    int cs[2] = {64, 53};
    /* NB_FUSE_DGELU, NB_BGRAD, NB_LT_ALGO_GELU (-1: the default choice) */
    int modes[5][3] = {{1, 0, -1}, {1, 1, -1}, {0, 0, -1}, {1, 0, 3}, {1, 0, 7}};
    FOR_DTYPE(bf)
        for (int k = 0; k < 2; k++)
            for (int m = 0; m < 5; m++) {
                int C = cs[k];
                size_t ni = (size_t)N * C, nw = (size_t)OC * C;
                set_env("NB_FUSE_DGELU", modes[m][0]);
                set_env("NB_BGRAD", modes[m][1]);
                set_gelu_candidate(modes[m][2]);
                float *pre = randn(ni, 0, 1.5f), *dout = randn((size_t)N * OC, 0, 1), *w = randn(nw, 0, 0.1f);
                round_bf(pre, ni, bf), round_bf(dout, (size_t)N * OC, bf), round_bf(w, nw, bf);
                float *inp = zeros(ni);
                nb_gelu_forward(inp, pre, ni);
                round_bf(inp, ni, bf);
                /* reference: dz = dout @ w (from zero), dpre = gelu'(pre) * dz, dbias_pre = colsum */
                float *dz = zeros(ni), *g0w = zeros(nw), *g0b = zeros(OC), *rdpre = zeros(ni);
                nb_matmul_backward(dz, g0w, g0b, dout, inp, w, N, C, OC);
                nb_gelu_backward(rdpre, pre, dz, ni);
                float *g0bp = zeros(C);
                for (int r = 0; r < N; r++)
                    for (int c = 0; c < C; c++) g0bp[c] += rdpre[(size_t)r * C + c];
                float *iw = grad_init(g0w, nw, 0), *ib = grad_init(g0b, OC, 0), *ibp = grad_init(g0bp, C, 0);
                float *rw = copy_of(iw, nw), *rb = copy_of(ib, OC), *rbp = copy_of(ibp, C);
                for (size_t i = 0; i < nw; i++) rw[i] += g0w[i];
                for (int i = 0; i < OC; i++) rb[i] += g0b[i];
                for (int i = 0; i < C; i++) rbp[i] += g0bp[i];
                float *gp[2], *gw[2], *gb[2], *gbp[2];
                for (int run = 0; run < 2; run++) {
                    void *dpre_ = dev_nan(ni, bf), *ddo = dev_up(dout, (size_t)N * OC, bf), *di = dev_up(inp, ni, bf);
                    void *dwt = dev_up(w, nw, bf), *dp = dev_up(pre, ni, bf);
                    void *gdw = dev_up(iw, nw, 0), *gdb = dev_up(ib, OC, 0), *gdbp = dev_up(ibp, C, 0);
                    CALL(bf, nb_cuda_matmul_dgelu_backward, dpre_, gdw, gdb, gdbp, ddo, di, dwt, dp, N, C, OC, lt, st);
                    gp[run] = zeros(ni), gw[run] = zeros(nw), gb[run] = zeros(OC), gbp[run] = zeros(C);
                    dev_down(gp[run], dpre_, ni, bf), dev_down(gw[run], gdw, nw, 0);
                    dev_down(gb[run], gdb, OC, 0), dev_down(gbp[run], gdbp, C, 0);
                    dev_free(dpre_), dev_free(ddo), dev_free(di), dev_free(dwt), dev_free(dp);
                    dev_free(gdw), dev_free(gdb), dev_free(gdbp);
                }
                char what[120];
                char tag[32];
                if (modes[m][2] >= 0) snprintf(tag, sizeof tag, "fused candidate %d", modes[m][2]);
                else snprintf(tag, sizeof tag, "%s", modes[m][0] ? (modes[m][1] ? "fused+bgrad" : "fused") : "unfused");
                snprintf(what, sizeof what, "matmul+dgelu bwd C=%d %s dpre", C, tag);
                expect_close(what, bf, gp[0], rdpre, ni);
                expect_same(what, gp[0], gp[1], ni);
                snprintf(what, sizeof what, "matmul+dgelu bwd C=%d %s dw", C, tag);
                expect_grad(what, bf, gw[0], rw, iw, nw);
                expect_same(what, gw[0], gw[1], nw);
                snprintf(what, sizeof what, "matmul+dgelu bwd C=%d %s dbias", C, tag);
                expect_grad(what, bf, gb[0], rb, ib, OC);
                expect_same(what, gb[0], gb[1], OC);
                snprintf(what, sizeof what, "matmul+dgelu bwd C=%d %s dbias_pre", C, tag);
                expect_grad(what, bf, gbp[0], rbp, ibp, C);
                expect_same(what, gbp[0], gbp[1], C);
                free(pre), free(dout), free(w), free(inp), free(dz), free(g0w), free(g0b), free(rdpre), free(g0bp);
                free(iw), free(ib), free(ibp), free(rw), free(rb), free(rbp);
                for (int run = 0; run < 2; run++) free(gp[run]), free(gw[run]), free(gb[run]), free(gbp[run]);
            }
    unsetenv("NB_FUSE_DGELU");
    unsetenv("NB_BGRAD");
    unsetenv("NB_LT_ALGO_GELU");
}

/* gpt2's fc-proj backward at B = 32 (N = 32768, 3072 <- 768, bf16): on an H200 the default takes
 * another of cuBLASLt's ranked algorithms for its DGELU epilogue (matmul.cu, lt_tuned). That one
 * and the heuristic's first against the CPU, each repeated bit for bit. */
TEST_CASE(test_matmul_dgelu_backward_large) {
    const int N = 32768, C = 3072, OC = 768;
    const size_t ni = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
    float *pre = randn(ni, 0, 1.5f), *dout = randn(no, 0, 1), *w = randn(nw, 0, 0.05f);
    round_bf(pre, ni, 1), round_bf(dout, no, 1), round_bf(w, nw, 1);
    float *inp = zeros(ni), *dz = zeros(ni), *g0w = zeros(nw), *g0b = zeros(OC), *rdpre = zeros(ni);
    nb_gelu_forward(inp, pre, ni);
    round_bf(inp, ni, 1);
    nb_matmul_backward(dz, g0w, g0b, dout, inp, w, N, C, OC);
    nb_gelu_backward(rdpre, pre, dz, ni);
    void *ddo = dev_up(dout, no, 1), *di = dev_up(inp, ni, 1), *dwt = dev_up(w, nw, 1), *dp = dev_up(pre, ni, 1);
    float *gp[2] = {zeros(ni), zeros(ni)};
    for (int pick = -1; pick <= 0; pick++) {
        set_gelu_candidate(pick);
        for (int run = 0; run < 2; run++) {
            void *dpre_ = dev_nan(ni, 1), *gdw = dev_up(g0w, nw, 0), *gdb = dev_up(g0b, OC, 0);
            nb_cuda_matmul_dgelu_backward_bf16(dpre_, gdw, gdb, NULL, ddo, di, dwt, dp, N, C, OC, lt, st);
            dev_down(gp[run], dpre_, ni, 1);
            dev_free(dpre_), dev_free(gdw), dev_free(gdb);
        }
        char what[96];
        snprintf(what, sizeof what, "matmul+dgelu bwd %dx%dx%d candidate %d dpre", N, C, OC, pick);
        expect_close(what, 1, gp[0], rdpre, ni);
        expect_same(what, gp[0], gp[1], ni);
    }
    unsetenv("NB_LT_ALGO_GELU");
    dev_free(ddo), dev_free(di), dev_free(dwt), dev_free(dp);
    free(pre), free(dout), free(w), free(inp), free(dz), free(g0w), free(g0b), free(rdpre), free(gp[0]), free(gp[1]);
}

/* matmul_backward_set writes dinp (NaN-poisoned here; NB_GRAD_SET=0: its memset + accumulate
 * fallback); dw, dbias accumulate, with NB_BGRAD=1 dbias through the BGRADB epilogue. */
TEST_CASE(test_matmul_backward_set) {
    int N = 3 * 101, C = 80, OC = 64;
    size_t ni = (size_t)N * C, nw = (size_t)OC * C;
    FOR_DTYPE(bf)
        for (int bgrad = 0; bgrad <= 1; bgrad++)
            for (int set = 0; set <= 1; set++) {
                set_env("NB_BGRAD", bgrad);
                set_env("NB_GRAD_SET", set);
                float *dout = randn((size_t)N * OC, 0, 1), *inp = randn(ni, 0, 1), *w = randn(nw, 0, 0.1f);
                round_bf(dout, (size_t)N * OC, bf), round_bf(inp, ni, bf), round_bf(w, nw, bf);
                float *ri = zeros(ni), *g0w = zeros(nw), *g0b = zeros(OC);
                nb_matmul_backward(ri, g0w, g0b, dout, inp, w, N, C, OC);
                float *iw = grad_init(g0w, nw, 0), *ib = grad_init(g0b, OC, 0);
                float *rw = copy_of(iw, nw), *rb = copy_of(ib, OC);
                for (size_t i = 0; i < nw; i++) rw[i] += g0w[i];
                for (int i = 0; i < OC; i++) rb[i] += g0b[i];
                float *gi[2], *gw[2], *gb[2];
                for (int run = 0; run < 2; run++) {
                    void *ddo = dev_up(dout, (size_t)N * OC, bf), *di = dev_up(inp, ni, bf), *dwt = dev_up(w, nw, bf);
                    void *gdi = dev_nan(ni, bf), *gdw = dev_up(iw, nw, 0), *gdb = dev_up(ib, OC, 0);
                    /* NB_GRAD_SET=0: the op zeroes dinp itself, then accumulates */
                    CALL(bf, nb_cuda_matmul_backward_set, gdi, gdw, gdb, ddo, di, dwt, N, C, OC, lt, st);
                    gi[run] = zeros(ni), gw[run] = zeros(nw), gb[run] = zeros(OC);
                    dev_down(gi[run], gdi, ni, bf), dev_down(gw[run], gdw, nw, 0), dev_down(gb[run], gdb, OC, 0);
                    dev_free(ddo), dev_free(di), dev_free(dwt), dev_free(gdi), dev_free(gdw), dev_free(gdb);
                }
                char what[96];
                snprintf(what, sizeof what, "matmul bwd set%s%s dinp", set ? "" : " (memset)", bgrad ? " bgrad" : "");
                expect_close(what, bf, gi[0], ri, ni);
                expect_same(what, gi[0], gi[1], ni);
                snprintf(what, sizeof what, "matmul bwd set%s%s dw", set ? "" : " (memset)", bgrad ? " bgrad" : "");
                expect_grad(what, bf, gw[0], rw, iw, nw);
                expect_same(what, gw[0], gw[1], nw);
                snprintf(what, sizeof what, "matmul bwd set%s%s dbias", set ? "" : " (memset)", bgrad ? " bgrad" : "");
                expect_grad(what, bf, gb[0], rb, ib, OC);
                expect_same(what, gb[0], gb[1], OC);
                free(dout), free(inp), free(w), free(ri), free(g0w), free(g0b), free(iw), free(ib), free(rw), free(rb);
                for (int run = 0; run < 2; run++) free(gi[run]), free(gw[run]), free(gb[run]);
            }
    unsetenv("NB_BGRAD");
    unsetenv("NB_GRAD_SET");
}

/* swiglu_bwd_set and attention_bwd_set: written from NaN, against the CPU from zero, and bitwise
 * the accumulating op's result from zero (x rounds the same as 0 + x). */
TEST_CASE(test_backward_set) {
    int N = 3 * 101, F = 45;
    size_t nio = (size_t)N * 2 * F, no = (size_t)N * F;
    FOR_DTYPE(bf) {
        float *gu = randn(nio, 0, 2), *dout = randn(no, 0, 1);
        round_bf(gu, nio, bf), round_bf(dout, no, bf);
        float *rg = zeros(nio);
        nb_swiglu_backward(rg, dout, gu, N, F);
        void *dgu = dev_up(gu, nio, bf), *ddo = dev_up(dout, no, bf), *gset = dev_nan(nio, bf), *gacc = dev_nan(nio, bf);
        CUDA_CHECK(cudaMemset(gacc, 0, nio * (bf ? 2 : 4)));
        CALL(bf, nb_cuda_swiglu_backward_set, gset, ddo, dgu, N, F, st);
        CALL(bf, nb_cuda_swiglu_backward, gacc, ddo, dgu, N, F, st);
        float *hs = zeros(nio), *ha = zeros(nio);
        dev_down(hs, gset, nio, bf), dev_down(ha, gacc, nio, bf);
        expect_close("swiglu bwd set dgu", bf, hs, rg, nio);
        expect_same("swiglu bwd set vs accumulate from zero", hs, ha, nio);
        dev_free(dgu), dev_free(ddo), dev_free(gset), dev_free(gacc);
        free(gu), free(dout), free(rg), free(hs), free(ha);
    }
    /* HS 64 (bf16: the tensor-core kernels' write mode) and HS 24 (memset + accumulate) */
    static const int shapes[][5] = {{2, 67, 4, 2, 64}, {1, 45, 4, 4, 64}, {2, 37, 6, 2, 24}};
    for (int sh = 0; sh < 3; sh++)
        FOR_DTYPE(bf) {
            int B = shapes[sh][0], T = shapes[sh][1], NH = shapes[sh][2], NKV = shapes[sh][3], HS = shapes[sh][4];
            size_t nqkv = (size_t)B * T * (NH + 2 * NKV) * HS, nob = (size_t)B * T * NH * HS, nl = (size_t)B * NH * T;
            float *qkv = randn(nqkv, 0, 1), *dy = randn(nob, 0, 1);
            round_bf(qkv, nqkv, bf), round_bf(dy, nob, bf);
            float *rout = zeros(nob), *rlse = zeros(nl), *rg = zeros(nqkv);
            nb_attention_forward(rout, rlse, qkv, B, T, NH, NKV, HS);
            round_bf(rout, nob, bf);
            nb_attention_backward(rg, dy, qkv, rout, rlse, B, T, NH, NKV, HS);
            void *dq = dev_up(qkv, nqkv, bf), *ddy = dev_up(dy, nob, bf), *dro = dev_up(rout, nob, bf);
            void *dl = dev_up(rlse, nl, 0), *gset[2] = {dev_nan(nqkv, bf), dev_nan(nqkv, bf)}, *gacc = dev_nan(nqkv, bf);
            CUDA_CHECK(cudaMemset(gacc, 0, nqkv * (bf ? 2 : 4)));
            for (int run = 0; run < 2; run++)
                CALL(bf, nb_cuda_attention_backward_set, gset[run], ddy, dq, dro, dl, B, T, NH, NKV, HS, st);
            CALL(bf, nb_cuda_attention_backward, gacc, ddy, dq, dro, dl, B, T, NH, NKV, HS, st);
            float *h0 = zeros(nqkv), *h1 = zeros(nqkv), *ha = zeros(nqkv);
            dev_down(h0, gset[0], nqkv, bf), dev_down(h1, gset[1], nqkv, bf), dev_down(ha, gacc, nqkv, bf);
            char what[128];
            snprintf(what, sizeof what, "attention bwd set dqkv (T=%d NH=%d NKV=%d HS=%d)", T, NH, NKV, HS);
            expect_close(what, bf, h0, rg, nqkv);
            expect_same(what, h0, h1, nqkv);
            expect_same("attention bwd set vs accumulate from zero", h0, ha, nqkv);
            dev_free(dq), dev_free(ddy), dev_free(dro), dev_free(dl), dev_free(gset[0]), dev_free(gset[1]);
            dev_free(gacc);
            free(qkv), free(dy), free(rout), free(rlse), free(rg), free(h0), free(h1), free(ha);
        }
}

#define FN(f) f
#else
#define FN(f) NULL
#endif

static const ot_row rows[] = {
    {"matmul_residual_fwd", "cuda", OT_F32, "OC 64 (fused) and 53, NB_FUSE_RESIDUAL", 1e-5, OT_EVAL, FN(test_matmul_residual_forward), 0, 0},
    {"matmul_residual_fwd", "cuda", OT_BF16, "OC 64 (fused) and 53, NB_FUSE_RESIDUAL", 1e-2, OT_EVAL, FN(test_matmul_residual_forward), 0, 0},
    {"matmul_dgelu_bwd", "cuda", OT_F32, "C 64 and odd, NB_FUSE_DGELU/BGRAD", 1e-5, OT_EVAL, FN(test_matmul_dgelu_backward), 0, 0},
    {"matmul_dgelu_bwd", "cuda", OT_BF16, "C 64 and odd, NB_FUSE_DGELU/BGRAD", 1e-2, OT_EVAL, FN(test_matmul_dgelu_backward), 0, 0},
    {"matmul_dgelu_bwd", "cuda", OT_BF16, "32768x3072<-768 candidates", 1e-2, OT_EVAL, FN(test_matmul_dgelu_backward_large), 0, 0},
    {"matmul_bwd_set", "cuda", OT_F32, "NB_BGRAD x NB_GRAD_SET", 1e-5, OT_EVAL, FN(test_matmul_backward_set), 0, 0},
    {"matmul_bwd_set", "cuda", OT_BF16, "NB_BGRAD x NB_GRAD_SET", 1e-2, OT_EVAL, FN(test_matmul_backward_set), 0, 0},
    {"swiglu_attention_bwd_set", "cuda", OT_F32, "from NaN vs CPU from zero", 1e-5, OT_EVAL, FN(test_backward_set), 0, 0},
    {"swiglu_attention_bwd_set", "cuda", OT_BF16, "from NaN vs CPU from zero", 1e-2, OT_EVAL, FN(test_backward_set), 0, 0},
};
OT_TABLE(ot_fused_cuda, rows);
