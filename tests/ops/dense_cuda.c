/* The dense CUDA ops (ops_cuda.h) against the CPU reference ops (ops.h, optim.h): the cuda rows of
 * the dense family, one per op and dtype.
 *
 * For every op: random inputs of awkward sizes (not multiples of 8, T not a power of two,
 * NH != NKV), outputs poisoned with NaN first (an element the kernel forgets stays NaN and fails
 * the comparison), the CPU op and the CUDA op on the same inputs, then
 * - f32 rows: relative error ||gpu - cpu|| / ||cpu|| <= 1e-5 (GEMMs in true fp32, TF32 off);
 * - bf16 rows: inputs rounded to bf16 on both sides, <= 1e-2 (the outputs' bf16 rounding);
 * - gradients start from random non-zero values (scaled like the gradient itself) and the
 *   comparison is on the increments, so a kernel that overwrites instead of accumulating fails;
 * - a NULL gradient is skipped while the others are still computed;
 * - determinism: the CUDA op runs twice from the same state and the results must be bitwise equal.
 * SKIP without a GPU, or when built without CUDA. fused_cuda.c: issue 18's fused and
 * gradient-writing ops; perf_cuda.c: the timings. */
#include "optest.h"

#ifdef NB_WITH_CUDA
#include "dense_cuda.h"

/* ---- matmul ---- */


static void check_matmul_forward(int N, int C, int OC) {
    char what[96];
    FOR_DTYPE(bf)
        for (int with_bias = 0; with_bias <= 1; with_bias++) {
            float *inp = randn((size_t)N * C, 0, 1), *w = randn((size_t)OC * C, 0, 0.1f), *b = randn(OC, 0, 1);
            round_bf(inp, (size_t)N * C, bf), round_bf(w, (size_t)OC * C, bf), round_bf(b, OC, bf);
            float *ref = zeros((size_t)N * OC), *g1 = zeros((size_t)N * OC), *g2 = zeros((size_t)N * OC);
            nb_matmul_forward(ref, inp, w, with_bias ? b : NULL, N, C, OC);
            gpu_matmul_fwd(bf, g1, inp, w, with_bias ? b : NULL, N, C, OC);
            gpu_matmul_fwd(bf, g2, inp, w, with_bias ? b : NULL, N, C, OC);
            snprintf(what, sizeof what, "matmul fwd%s out (%dx%dx%d)", with_bias ? " (bias epilogue)" : "", N, C, OC);
            expect_close(what, bf, g1, ref, (size_t)N * OC);
            expect_same("matmul fwd", g1, g2, (size_t)N * OC);
            free(inp), free(w), free(b), free(ref), free(g1), free(g2);
        }
}

/* and test_dlrm_ref's twin (B 6): its bottom MLP 13 -> 512 -> 256 -> 8, its top 216 -> 7 -> 5 */
TEST_CASE(test_matmul_forward) {
    check_matmul_forward(3 * 101, 77, 53);
    check_matmul_forward(6, 13, 512);
    check_matmul_forward(6, 512, 256);
    check_matmul_forward(6, 256, 8);
    check_matmul_forward(6, 216, 7);
    check_matmul_forward(6, 7, 5);
}

/* OC = 64 takes the fused cuBLASLt GELU epilogue (if offered), OC = 53 the GEMM + GELU path. */
TEST_CASE(test_matmul_gelu_forward) {
    int N = 3 * 101, C = 80;
    int ocs[2] = {64, 53};
    int picks[3] = {-1, 3, 7};
    FOR_DTYPE(bf)
        for (int k = 0; k < 2; k++)
            for (int with_bias = 0; with_bias <= 1; with_bias++)
                for (int p = 0; p < (bf && k == 0 ? 3 : 1); p++) {
                    set_gelu_candidate(picks[p]);
                    int OC = ocs[k];
                    size_t no = (size_t)N * OC;
                    float *inp = randn((size_t)N * C, 0, 1), *w = randn((size_t)OC * C, 0, 0.1f);
                    float *b = randn(OC, 0, 1);
                    round_bf(inp, (size_t)N * C, bf), round_bf(w, (size_t)OC * C, bf), round_bf(b, OC, bf);
                    float *rpre = zeros(no), *rout = zeros(no);
                    nb_matmul_forward(rpre, inp, w, with_bias ? b : NULL, N, C, OC);
                    /* bf16: the GPU's GELU reads pre as computed in fp32 (fused) or rounded (unfused);
                     * both are within bf16 rounding of this reference. */
                    nb_gelu_forward(rout, rpre, no);
                    float *o1 = zeros(no), *p1 = zeros(no), *o2 = zeros(no), *p2 = zeros(no);
                    gpu_matmul_gelu(bf, o1, p1, inp, w, with_bias ? b : NULL, N, C, OC);
                    gpu_matmul_gelu(bf, o2, p2, inp, w, with_bias ? b : NULL, N, C, OC);
                    char what[96];
                    snprintf(what, sizeof what, "matmul+gelu OC=%d%s candidate %d pre", OC, with_bias ? " bias" : "",
                             picks[p]);
                    expect_close(what, bf, p1, rpre, no);
                    snprintf(what, sizeof what, "matmul+gelu OC=%d%s candidate %d out", OC, with_bias ? " bias" : "",
                             picks[p]);
                    expect_close(what, bf, o1, rout, no);
                    expect_same("matmul+gelu out", o1, o2, no);
                    expect_same("matmul+gelu pre", p1, p2, no);
                    free(inp), free(w), free(b), free(rpre), free(rout), free(o1), free(p1), free(o2), free(p2);
                }
    unsetenv("NB_LT_ALGO_GELU");
}

/* gpt2's fc forward at B = 32 (N = 32768, 768 -> 3072, bf16): on an H200 the default takes another
 * of cuBLASLt's ranked algorithms for its GELU epilogue (matmul.cu, lt_tuned). That one and the
 * heuristic's first against the CPU, each repeated bit for bit. */
TEST_CASE(test_matmul_gelu_forward_large) {
    const int N = 32768, C = 768, OC = 3072;
    const size_t no = (size_t)N * OC;
    float *inp = randn((size_t)N * C, 0, 1), *w = randn((size_t)OC * C, 0, 0.05f), *b = randn(OC, 0, 1);
    round_bf(inp, (size_t)N * C, 1), round_bf(w, (size_t)OC * C, 1), round_bf(b, OC, 1);
    float *rpre = zeros(no), *rout = zeros(no);
    nb_matmul_forward(rpre, inp, w, b, N, C, OC);
    nb_gelu_forward(rout, rpre, no);
    float *o1 = zeros(no), *p1 = zeros(no), *o2 = zeros(no), *p2 = zeros(no);
    for (int pick = -1; pick <= 0; pick++) {
        set_gelu_candidate(pick);
        gpu_matmul_gelu(1, o1, p1, inp, w, b, N, C, OC);
        gpu_matmul_gelu(1, o2, p2, inp, w, b, N, C, OC);
        char what[96];
        snprintf(what, sizeof what, "matmul+gelu %dx%dx%d candidate %d pre", N, C, OC, pick);
        expect_close(what, 1, p1, rpre, no);
        expect_same(what, p1, p2, no);
        snprintf(what, sizeof what, "matmul+gelu %dx%dx%d candidate %d out", N, C, OC, pick);
        expect_close(what, 1, o1, rout, no);
        expect_same(what, o1, o2, no);
    }
    unsetenv("NB_LT_ALGO_GELU");
    free(inp), free(w), free(b), free(rpre), free(rout), free(o1), free(p1), free(o2), free(p2);
}

/* Element offset of every tensor of gpu_matmul_bwd within its allocation: a model's tensors are
 * views into slabs, only as aligned as their element size (0: cudaMalloc's 256 bytes). */
static int mm_shift;

/* h uploaded mm_shift elements into a fresh allocation (*base, to free) */
static void *dev_up_at(const float *h, size_t n, int bf, void **base) {
    float *t = zeros(n + (size_t)mm_shift);
    memcpy(t + mm_shift, h, n * sizeof(float));
    *base = dev_up(t, n + (size_t)mm_shift, bf);
    free(t);
    return (char *)*base + (size_t)mm_shift * (bf ? 2 : 4);
}

/* Gradients: dinp is an activation gradient (bf16 in bf16 mode), dw and dbias parameter
 * gradients (always fp32). */
static void gpu_matmul_bwd(int bf, float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                           const float *w, int N, int C, int OC) {
    void *b[6] = {0};
    void *ddo = dev_up_at(dout, (size_t)N * OC, bf, &b[0]), *di = dev_up_at(inp, (size_t)N * C, bf, &b[1]);
    void *dwt = dev_up_at(w, (size_t)OC * C, bf, &b[2]);
    void *gdi = dinp ? dev_up_at(dinp, (size_t)N * C, bf, &b[3]) : NULL;
    void *gdw = dw ? dev_up_at(dw, (size_t)OC * C, 0, &b[4]) : NULL;
    void *gdb = dbias ? dev_up_at(dbias, OC, 0, &b[5]) : NULL;
    CALL(bf, nb_cuda_matmul_backward, gdi, gdw, gdb, ddo, di, dwt, N, C, OC, lt, st);
    if (dinp) dev_down(dinp, gdi, (size_t)N * C, bf);
    if (dw) dev_down(dw, gdw, (size_t)OC * C, 0);
    if (dbias) dev_down(dbias, gdb, OC, 0);
    for (int k = 0; k < 6; k++) dev_free(b[k]);
}

/* N > 2 * 128: several dbias partials. With OC % 8 == 0 the bf16 bias gradient takes the
 * 8-column vector kernel (check_dbias_order pins its bits). */
static void check_matmul_backward(int N, int C, int OC) {
    size_t ni = (size_t)N * C, nw = (size_t)OC * C;
    FOR_DTYPE(bf) {
        float *dout = randn((size_t)N * OC, 0, 1), *inp = randn(ni, 0, 1), *w = randn(nw, 0, 0.1f);
        round_bf(dout, (size_t)N * OC, bf), round_bf(inp, ni, bf), round_bf(w, nw, bf);
        float *g0i = zeros(ni), *g0w = zeros(nw), *g0b = zeros(OC);
        nb_matmul_backward(g0i, g0w, g0b, dout, inp, w, N, C, OC);
        float *ii = grad_init(g0i, ni, bf), *iw = grad_init(g0w, nw, 0), *ib = grad_init(g0b, OC, 0);
        float *ri = copy_of(ii, ni), *rw = copy_of(iw, nw), *rb = copy_of(ib, OC);
        nb_matmul_backward(ri, rw, rb, dout, inp, w, N, C, OC);
        float *gi[2], *gw[2], *gb[2];
        for (int run = 0; run < 2; run++) {
            gi[run] = copy_of(ii, ni), gw[run] = copy_of(iw, nw), gb[run] = copy_of(ib, OC);
            gpu_matmul_bwd(bf, gi[run], gw[run], gb[run], dout, inp, w, N, C, OC);
        }
        expect_grad("matmul bwd dinp", bf, gi[0], ri, ii, ni);
        expect_grad("matmul bwd dw", bf, gw[0], rw, iw, nw);
        expect_grad("matmul bwd dbias", bf, gb[0], rb, ib, OC);
        expect_same("matmul bwd dinp", gi[0], gi[1], ni);
        expect_same("matmul bwd dw", gw[0], gw[1], nw);
        expect_same("matmul bwd dbias", gb[0], gb[1], OC);
        /* NULL dinp and dbias: dw alone, the same bits as before. */
        float *gw3 = copy_of(iw, nw);
        gpu_matmul_bwd(bf, NULL, gw3, NULL, dout, inp, w, N, C, OC);
        expect_same("matmul bwd dw (dinp, dbias NULL)", gw[0], gw3, nw);
        free(dout), free(inp), free(w), free(g0i), free(g0w), free(g0b), free(ii), free(iw), free(ib);
        free(ri), free(rw), free(rb), free(gw3);
        for (int run = 0; run < 2; run++) free(gi[run]), free(gw[run]), free(gb[run]);
    }
}

/* The bias gradient's summation order, on the host (the kernels' constants: NB_COL_ROWS = 128 rows
 * a partial, 8 row lanes, nb_col_finish's 16 lanes): partial k adds rows [128k, 128k + 128) as 8
 * row lanes (r = 128k + y, + 8, ...) added in lane order; then 16 lanes over the partials (k = l,
 * l + 16, ...), added in lane order, and db += the total. */
static void dbias_in_order(float *db, const float *dout, int N, int OC) {
    int nparts = (N + 127) / 128;
    float *part = zeros((size_t)nparts * OC);
    for (int k = 0; k < nparts; k++)
        for (int c = 0; c < OC; c++) {
            float s = 0.0f;
            for (int y = 0; y < 8; y++) {
                float acc = 0.0f;
                for (int r = 128 * k + y; r < N && r < 128 * (k + 1); r += 8) acc += dout[(size_t)r * OC + c];
                s += acc;
            }
            part[(size_t)k * OC + c] = s;
        }
    for (int c = 0; c < OC; c++) {
        float t = 0.0f;
        for (int l = 0; l < 16; l++) {
            float s = 0.0f;
            for (int k = l; k < nparts; k += 16) s += part[(size_t)k * OC + c];
            t += s;
        }
        db[c] += t;
    }
    free(part);
}

/* The bias gradient in exactly that order, bit for bit (any faster finish must keep it): fp32
 * rows, bf16 rows of 8-column vectors (OC % 8 == 0), bf16 scalar rows (odd OC); each run twice. */
static void check_dbias_order(int N, int OC) {
    FOR_DTYPE(bf) {
        float *dout = randn((size_t)N * OC, 0, 1), *db0 = randn(OC, 0, 1), *inp = zeros((size_t)N * 8),
              *w = zeros((size_t)OC * 8);
        round_bf(dout, (size_t)N * OC, bf);
        float *want = copy_of(db0, OC);
        dbias_in_order(want, dout, N, OC);
        for (int run = 0; run < 2; run++) {
            float *got = copy_of(db0, OC);
            gpu_matmul_bwd(bf, NULL, NULL, got, dout, inp, w, N, 8, OC);
            char what[96];
            snprintf(what, sizeof what, "dbias in its fixed order (N %d, OC %d, run %d)", N, OC, run);
            expect_same(what, got, want, OC);
            free(got);
        }
        free(dout), free(db0), free(want), free(inp), free(w);
    }
}

TEST_CASE(test_matmul_backward) {
    check_matmul_backward(3 * 101, 77, 53);
    check_matmul_backward(3 * 101, 64, 264); /* two blocks of 32 column vectors */
    check_dbias_order(2048, 256);            /* the proxy's: 16 partials */
    check_dbias_order(2048, 264);            /* two column groups */
    check_dbias_order(8192, 53);             /* 64 partials: 4 per row lane of the finish */
    check_dbias_order(8192 + 1, 24);         /* 65: one lane with a fifth */
    check_dbias_order(200, 7);               /* 2 partials, the last one short */
}

/* The tiny odd shapes of the DLRM twin's top MLP (test_dlrm_ref: B 6, widths 216 -> 7 -> 5 -> 1):
 * cuBLASLt takes other kernels for GEMMs this small, and in bf16 7 -> 5 is where its gradients
 * went wrong. */
TEST_CASE(test_matmul_backward_tiny) {
    check_matmul_backward(6, 7, 5);
    check_matmul_backward(6, 5, 7);
    check_matmul_backward(6, 216, 7);
    check_matmul_backward(6, 7, 8);
    check_matmul_backward(6, 8, 5);
    check_matmul_backward(1, 3, 3);
    check_matmul_backward(6, 13, 512); /* the twin's bottom MLP: 13 -> 512 -> 256 -> 8 */
    check_matmul_backward(6, 512, 256);
    check_matmul_backward(6, 256, 8);
    /* the twin's shapes with every tensor only element-aligned, as views into the model's slabs */
    for (mm_shift = 1; mm_shift <= 3; mm_shift += 2) {
        check_matmul_backward(6, 7, 5);
        check_matmul_backward(6, 5, 7);
        check_matmul_backward(6, 216, 7);
    }
    mm_shift = 0;
}

/* ---- layernorm / rmsnorm ---- */

static void check_layernorm(int N, int C) {
    size_t n = (size_t)N * C;
    char what[96];
    FOR_DTYPE(bf) {
        /* mean far from 0: catches a one-pass variance's cancellation */
        float *inp = randn(n, 3.0f, 1.5f), *w = randn(C, 1, 0.2f), *b = randn(C, 0, 0.2f), *dout = randn(n, 0, 1);
        round_bf(inp, n, bf), round_bf(w, C, bf), round_bf(b, C, bf), round_bf(dout, n, bf);
        float *rout = zeros(n), *rmean = zeros(N), *rrstd = zeros(N);
        nb_layernorm_forward(rout, rmean, rrstd, inp, w, b, N, C, 1e-5f);
        float *out[2], *mean[2], *rstd[2];
        for (int run = 0; run < 2; run++) {
            void *di = dev_up(inp, n, bf), *dw = dev_up(w, C, bf), *db = dev_up(b, C, bf);
            void *dout_ = dev_nan(n, bf), *dm = dev_nan(N, 0), *dr = dev_nan(N, 0);
            CALL(bf, nb_cuda_layernorm_forward, dout_, dm, dr, di, dw, db, N, C, 1e-5f, st);
            out[run] = zeros(n), mean[run] = zeros(N), rstd[run] = zeros(N);
            dev_down(out[run], dout_, n, bf), dev_down(mean[run], dm, N, 0), dev_down(rstd[run], dr, N, 0);
            dev_free(di), dev_free(dw), dev_free(db), dev_free(dout_), dev_free(dm), dev_free(dr);
        }
        snprintf(what, sizeof what, "layernorm fwd out (N=%d C=%d)", N, C);
        expect_close(what, bf, out[0], rout, n);
        expect_close("layernorm fwd mean", bf, mean[0], rmean, N);
        expect_close("layernorm fwd rstd", bf, rstd[0], rrstd, N);
        expect_same("layernorm fwd out", out[0], out[1], n);
        expect_same("layernorm fwd rstd", rstd[0], rstd[1], N);
        {
            /* rows not 16-byte aligned: the scalar kernel */
            void *b1, *sdi = dev_up_shifted(inp, n, bf, &b1), *dw = dev_up(w, C, bf), *db = dev_up(b, C, bf);
            void *ob = dev_nan(n + 1, bf), *so = (char *)ob + (bf ? 2 : 4), *dm = dev_nan(N, 0), *dr = dev_nan(N, 0);
            CALL(bf, nb_cuda_layernorm_forward, so, dm, dr, sdi, dw, db, N, C, 1e-5f, st);
            float *o3 = zeros(n), *m3 = zeros(N), *r3 = zeros(N);
            dev_down(o3, so, n, bf), dev_down(m3, dm, N, 0), dev_down(r3, dr, N, 0);
            expect_close("layernorm fwd out (unaligned rows)", bf, o3, rout, n);
            expect_close("layernorm fwd mean (unaligned rows)", bf, m3, rmean, N);
            expect_close("layernorm fwd rstd (unaligned rows)", bf, r3, rrstd, N);
            dev_free(b1), dev_free(dw), dev_free(db), dev_free(ob), dev_free(dm), dev_free(dr);
            free(o3), free(m3), free(r3);
        }

        /* backward from the CPU's saved statistics, on both sides */
        float *g0i = zeros(n), *g0w = zeros(C), *g0b = zeros(C);
        nb_layernorm_backward(g0i, g0w, g0b, dout, inp, w, rmean, rrstd, N, C);
        float *ii = grad_init(g0i, n, bf), *iw = grad_init(g0w, C, 0), *ib = grad_init(g0b, C, 0);
        float *ri = copy_of(ii, n), *rw = copy_of(iw, C), *rb = copy_of(ib, C);
        nb_layernorm_backward(ri, rw, rb, dout, inp, w, rmean, rrstd, N, C);
        float *gi[2], *gw[2], *gb[2];
        for (int run = 0; run < 2; run++) {
            setenv("NB_LN_BWD_PF", run ? "0" : "1", 1); /* run 1: the unpipelined kernel, the same bits */
            void *ddo = dev_up(dout, n, bf), *di = dev_up(inp, n, bf), *dw = dev_up(w, C, bf);
            void *dm = dev_up(rmean, N, 0), *dr = dev_up(rrstd, N, 0);
            void *gdi = dev_up(ii, n, bf), *gdw = dev_up(iw, C, 0), *gdb = dev_up(ib, C, 0);
            CALL(bf, nb_cuda_layernorm_backward, gdi, gdw, gdb, ddo, di, dw, dm, dr, N, C, st);
            gi[run] = zeros(n), gw[run] = zeros(C), gb[run] = zeros(C);
            dev_down(gi[run], gdi, n, bf), dev_down(gw[run], gdw, C, 0), dev_down(gb[run], gdb, C, 0);
            /* NULL dinp and dw: db alone must still come out, dw's buffer untouched */
            if (run == 1) {
                void *gdb2 = dev_up(ib, C, 0);
                float *gb2 = zeros(C);
                CALL(bf, nb_cuda_layernorm_backward, NULL, NULL, gdb2, ddo, di, dw, dm, dr, N, C, st);
                dev_down(gb2, gdb2, C, 0);
                expect_same("layernorm bwd db (dinp, dw NULL)", gb[0], gb2, C);
                dev_free(gdb2), free(gb2);
                /* rows not 16-byte aligned: scalar accesses, the same dw and db bits */
                void *b1, *b2, *b3;
                void *sdo = dev_up_shifted(dout, n, bf, &b1), *sdi = dev_up_shifted(inp, n, bf, &b2);
                void *sgi = dev_up_shifted(ii, n, bf, &b3), *gdw3 = dev_up(iw, C, 0), *gdb3 = dev_up(ib, C, 0);
                CALL(bf, nb_cuda_layernorm_backward, sgi, gdw3, gdb3, sdo, sdi, dw, dm, dr, N, C, st);
                float *gi3 = zeros(n), *gw3 = zeros(C), *gb3 = zeros(C);
                dev_down(gi3, sgi, n, bf), dev_down(gw3, gdw3, C, 0), dev_down(gb3, gdb3, C, 0);
                expect_grad("layernorm bwd dinp (unaligned rows)", bf, gi3, ri, ii, n);
                expect_same("layernorm bwd dw (unaligned rows: same bits)", gw[0], gw3, C);
                expect_same("layernorm bwd db (unaligned rows: same bits)", gb[0], gb3, C);
                dev_free(b1), dev_free(b2), dev_free(b3), dev_free(gdw3), dev_free(gdb3);
                free(gi3), free(gw3), free(gb3);
            }
            dev_free(ddo), dev_free(di), dev_free(dw), dev_free(dm), dev_free(dr);
            dev_free(gdi), dev_free(gdw), dev_free(gdb);
            unsetenv("NB_LN_BWD_PF");
        }
        snprintf(what, sizeof what, "layernorm bwd dinp (N=%d C=%d)", N, C);
        expect_grad(what, bf, gi[0], ri, ii, n);
        expect_grad("layernorm bwd dw", bf, gw[0], rw, iw, C);
        expect_grad("layernorm bwd db", bf, gb[0], rb, ib, C);
        expect_same("layernorm bwd dinp", gi[0], gi[1], n);
        expect_same("layernorm bwd dw", gw[0], gw[1], C);
        expect_same("layernorm bwd db", gb[0], gb[1], C);
        free(inp), free(w), free(b), free(dout), free(rout), free(rmean), free(rrstd);
        free(g0i), free(g0w), free(g0b), free(ii), free(iw), free(ib), free(ri), free(rw), free(rb);
        for (int run = 0; run < 2; run++) {
            free(out[run]), free(mean[run]), free(rstd[run]);
            free(gi[run]), free(gw[run]), free(gb[run]);
        }
    }
}

TEST_CASE(test_layernorm) {
    check_layernorm(3 * 101, 77);  /* odd width: scalar accesses */
    check_layernorm(3 * 101, 768); /* GPT-2's width: 16-byte accesses, rows kept in registers */
    check_layernorm(1000, 256);    /* the proxy's width; 63 blocks of rows, the last partial */
    check_layernorm(333, 512);     /* 2 slots per lane in bf16 (the pipelined kernel's middle case) */
    check_layernorm(77, 1600);     /* 7 slots per lane in bf16, 13 in fp32 (some read twice); 3 warps */
    check_layernorm(40, 6400);     /* wider than the fused kernel's shared memory: the two-kernel path */
}

/* C % 8 == 0: the forward's 16-byte vector kernel and the fused backward's (RMS mode); other
 * widths the scalar accesses; C > 6144 the unfused backward. */
static void check_rmsnorm(int N, int C) {
    size_t n = (size_t)N * C;
    char what[96];
    FOR_DTYPE(bf) {
        float *inp = randn(n, 0.5f, 1.5f), *w = randn(C, 1, 0.2f), *dout = randn(n, 0, 1);
        round_bf(inp, n, bf), round_bf(w, C, bf), round_bf(dout, n, bf);
        float *rout = zeros(n), *rrstd = zeros(N);
        nb_rmsnorm_forward(rout, rrstd, inp, w, N, C, 1e-6f);
        float *out[2], *rstd[2];
        for (int run = 0; run < 2; run++) {
            void *di = dev_up(inp, n, bf), *dw = dev_up(w, C, bf), *dout_ = dev_nan(n, bf), *dr = dev_nan(N, 0);
            CALL(bf, nb_cuda_rmsnorm_forward, dout_, dr, di, dw, N, C, 1e-6f, st);
            out[run] = zeros(n), rstd[run] = zeros(N);
            dev_down(out[run], dout_, n, bf), dev_down(rstd[run], dr, N, 0);
            dev_free(di), dev_free(dw), dev_free(dout_), dev_free(dr);
        }
        snprintf(what, sizeof what, "rmsnorm fwd out (N=%d C=%d)", N, C);
        expect_close(what, bf, out[0], rout, n);
        expect_close("rmsnorm fwd rstd", bf, rstd[0], rrstd, N);
        expect_same("rmsnorm fwd out", out[0], out[1], n);
        expect_same("rmsnorm fwd rstd", rstd[0], rstd[1], N);
        {
            /* rows not 16-byte aligned: the scalar kernel */
            void *b1, *sdi = dev_up_shifted(inp, n, bf, &b1), *dw = dev_up(w, C, bf);
            void *ob = dev_nan(n + 1, bf), *so = (char *)ob + (bf ? 2 : 4), *dr = dev_nan(N, 0);
            CALL(bf, nb_cuda_rmsnorm_forward, so, dr, sdi, dw, N, C, 1e-6f, st);
            float *o3 = zeros(n), *r3 = zeros(N);
            dev_down(o3, so, n, bf), dev_down(r3, dr, N, 0);
            expect_close("rmsnorm fwd out (unaligned rows)", bf, o3, rout, n);
            expect_close("rmsnorm fwd rstd (unaligned rows)", bf, r3, rrstd, N);
            dev_free(b1), dev_free(dw), dev_free(ob), dev_free(dr);
            free(o3), free(r3);
        }

        float *g0i = zeros(n), *g0w = zeros(C);
        nb_rmsnorm_backward(g0i, g0w, dout, inp, w, rrstd, N, C);
        float *ii = grad_init(g0i, n, bf), *iw = grad_init(g0w, C, 0);
        float *ri = copy_of(ii, n), *rw = copy_of(iw, C);
        nb_rmsnorm_backward(ri, rw, dout, inp, w, rrstd, N, C);
        float *gi[2], *gw[2];
        for (int run = 0; run < 2; run++) {
            setenv("NB_LN_BWD_PF", run ? "0" : "1", 1); /* run 1: the unpipelined kernel, the same bits */
            void *ddo = dev_up(dout, n, bf), *di = dev_up(inp, n, bf), *dw = dev_up(w, C, bf);
            void *dr = dev_up(rrstd, N, 0), *gdi = dev_up(ii, n, bf), *gdw = dev_up(iw, C, 0);
            CALL(bf, nb_cuda_rmsnorm_backward, gdi, gdw, ddo, di, dw, dr, N, C, st);
            gi[run] = zeros(n), gw[run] = zeros(C);
            dev_down(gi[run], gdi, n, bf), dev_down(gw[run], gdw, C, 0);
            if (run == 1) {
                /* one of dinp / dw NULL: the other comes out with the same bits */
                void *gdi2 = dev_up(ii, n, bf), *gdw2 = dev_up(iw, C, 0);
                CALL(bf, nb_cuda_rmsnorm_backward, gdi2, NULL, ddo, di, dw, dr, N, C, st);
                CALL(bf, nb_cuda_rmsnorm_backward, NULL, gdw2, ddo, di, dw, dr, N, C, st);
                float *gi2 = zeros(n), *gw2 = zeros(C);
                dev_down(gi2, gdi2, n, bf), dev_down(gw2, gdw2, C, 0);
                expect_same("rmsnorm bwd dinp (dw NULL)", gi[0], gi2, n);
                expect_same("rmsnorm bwd dw (dinp NULL)", gw[0], gw2, C);
                dev_free(gdi2), dev_free(gdw2), free(gi2), free(gw2);
                /* rows not 16-byte aligned: scalar accesses, the same dw bits */
                void *b1, *b2, *b3;
                void *sdo = dev_up_shifted(dout, n, bf, &b1), *sdi = dev_up_shifted(inp, n, bf, &b2);
                void *sgi = dev_up_shifted(ii, n, bf, &b3), *gdw3 = dev_up(iw, C, 0);
                CALL(bf, nb_cuda_rmsnorm_backward, sgi, gdw3, sdo, sdi, dw, dr, N, C, st);
                float *gi3 = zeros(n), *gw3 = zeros(C);
                dev_down(gi3, sgi, n, bf), dev_down(gw3, gdw3, C, 0);
                expect_grad("rmsnorm bwd dinp (unaligned rows)", bf, gi3, ri, ii, n);
                expect_same("rmsnorm bwd dw (unaligned rows: same bits)", gw[0], gw3, C);
                dev_free(b1), dev_free(b2), dev_free(b3), dev_free(gdw3);
                free(gi3), free(gw3);
            }
            dev_free(ddo), dev_free(di), dev_free(dw), dev_free(dr), dev_free(gdi), dev_free(gdw);
            unsetenv("NB_LN_BWD_PF");
        }
        snprintf(what, sizeof what, "rmsnorm bwd dinp (N=%d C=%d)", N, C);
        expect_grad(what, bf, gi[0], ri, ii, n);
        expect_grad("rmsnorm bwd dw", bf, gw[0], rw, iw, C);
        expect_same("rmsnorm bwd dinp", gi[0], gi[1], n);
        expect_same("rmsnorm bwd dw", gw[0], gw[1], C);
        free(inp), free(w), free(dout), free(rout), free(rrstd), free(g0i), free(g0w), free(ii), free(iw);
        free(ri), free(rw);
        for (int run = 0; run < 2; run++) free(out[run]), free(rstd[run]), free(gi[run]), free(gw[run]);
    }
}

TEST_CASE(test_rmsnorm) {
    check_rmsnorm(3 * 101, 77);   /* odd width: scalar accesses */
    check_rmsnorm(3 * 101, 768);  /* 3 slots per lane in bf16, 6 in fp32 */
    check_rmsnorm(1000, 256);     /* 1 slot per lane in bf16, rows left over in the last block */
    check_rmsnorm(301, 2048);     /* llama-1b's width: 8 slots per lane in bf16, all kept; 3 warps */
    check_rmsnorm(40, 6400);      /* wider than the fused kernel's shared memory: the two-kernel path */
}

/* ---- elementwise ---- */

TEST_CASE(test_gelu) {
    size_t n = 3 * 101 * 77;
    FOR_DTYPE(bf) {
        float *inp = randn(n, 0, 2), *dout = randn(n, 0, 1);
        round_bf(inp, n, bf), round_bf(dout, n, bf);
        float *rout = zeros(n), *g0 = zeros(n);
        nb_gelu_forward(rout, inp, n);
        nb_gelu_backward(g0, inp, dout, n);
        float *init = grad_init(g0, n, bf), *rg = copy_of(init, n);
        nb_gelu_backward(rg, inp, dout, n);
        float *out[2], *g[2];
        for (int run = 0; run < 2; run++) {
            void *di = dev_up(inp, n, bf), *ddo = dev_up(dout, n, bf), *dout_ = dev_nan(n, bf);
            void *gd = dev_up(init, n, bf);
            CALL(bf, nb_cuda_gelu_forward, dout_, di, n, st);
            CALL(bf, nb_cuda_gelu_backward, gd, di, ddo, n, st);
            out[run] = zeros(n), g[run] = zeros(n);
            dev_down(out[run], dout_, n, bf), dev_down(g[run], gd, n, bf);
            dev_free(di), dev_free(ddo), dev_free(dout_), dev_free(gd);
        }
        expect_close("gelu fwd", bf, out[0], rout, n);
        expect_grad("gelu bwd", bf, g[0], rg, init, n);
        expect_same("gelu fwd", out[0], out[1], n);
        expect_same("gelu bwd", g[0], g[1], n);
        free(inp), free(dout), free(rout), free(g0), free(init), free(rg);
        for (int run = 0; run < 2; run++) free(out[run]), free(g[run]);
    }
}

/* F % 8 == 0: the vector kernels (16 bytes a thread); other widths, or gu one element off
 * 16-byte alignment (the third run), the scalar ones, which must give the same bits. */
static void check_swiglu(int N, int F) {
    size_t nio = (size_t)N * 2 * F, no = (size_t)N * F;
    char what[96];
    FOR_DTYPE(bf) {
        float *gu = randn(nio, 0, 2), *dout = randn(no, 0, 1);
        round_bf(gu, nio, bf), round_bf(dout, no, bf);
        float *rout = zeros(no), *g0 = zeros(nio);
        nb_swiglu_forward(rout, gu, N, F);
        nb_swiglu_backward(g0, dout, gu, N, F);
        float *init = grad_init(g0, nio, bf), *rg = copy_of(init, nio);
        nb_swiglu_backward(rg, dout, gu, N, F);
        float *out[3], *g[3], *gs[3];
        for (int run = 0; run < 3; run++) {
            void *base = NULL;
            void *dgu = run < 2 ? dev_up(gu, nio, bf) : dev_up_shifted(gu, nio, bf, &base);
            void *ddo = dev_up(dout, no, bf), *dout_ = dev_nan(no, bf);
            void *gd = dev_up(init, nio, bf), *gset = dev_nan(nio, bf);
            CALL(bf, nb_cuda_swiglu_forward, dout_, dgu, N, F, st);
            CALL(bf, nb_cuda_swiglu_backward, gd, ddo, dgu, N, F, st);
            CALL(bf, nb_cuda_swiglu_backward_set, gset, ddo, dgu, N, F, st);
            out[run] = zeros(no), g[run] = zeros(nio), gs[run] = zeros(nio);
            dev_down(out[run], dout_, no, bf), dev_down(g[run], gd, nio, bf), dev_down(gs[run], gset, nio, bf);
            dev_free(run < 2 ? dgu : base), dev_free(ddo), dev_free(dout_), dev_free(gd), dev_free(gset);
        }
        snprintf(what, sizeof what, "swiglu fwd (N=%d F=%d)", N, F);
        expect_close(what, bf, out[0], rout, no);
        snprintf(what, sizeof what, "swiglu bwd dgu (N=%d F=%d)", N, F);
        expect_grad(what, bf, g[0], rg, init, nio);
        snprintf(what, sizeof what, "swiglu bwd set dgu (N=%d F=%d)", N, F);
        expect_close(what, bf, gs[0], g0, nio);
        expect_same("swiglu fwd", out[0], out[1], no);
        expect_same("swiglu bwd", g[0], g[1], nio);
        expect_same("swiglu bwd set", gs[0], gs[1], nio);
        expect_same("swiglu fwd (unaligned gu: scalar kernel, same bits)", out[0], out[2], no);
        expect_same("swiglu bwd (unaligned gu: scalar kernel, same bits)", g[0], g[2], nio);
        expect_same("swiglu bwd set (unaligned gu: scalar kernel, same bits)", gs[0], gs[2], nio);
        free(gu), free(dout), free(rout), free(g0), free(init), free(rg);
        for (int run = 0; run < 3; run++) free(out[run]), free(g[run]), free(gs[run]);
    }
}

TEST_CASE(test_swiglu) {
    check_swiglu(3 * 101, 45);  /* odd width: scalar kernels only */
    check_swiglu(3 * 101, 256); /* 32 (bf16) or 64 (fp32) vectors a row */
    check_swiglu(77, 344);      /* 43 bf16 vectors a row: rows of odd vector count */
}

/* LoRA's scaled branch into (and its gradient out of) a column slice: the CPU op's values, the
 * columns outside the slice untouched (dst starts as data, not NaN, to see them) */
TEST_CASE(test_scale_cols) {
    int rows = 1003, ld_dst = 96, ld_src = 40, cols = 33, off = 31;
    size_t nd = (size_t)rows * ld_dst, ns = (size_t)rows * ld_src;
    FOR_DTYPE(bf) {
        for (int acc = 0; acc < 2; acc++) {
            float *d = randn(nd, 0, 1), *s = randn(ns, 0, 1);
            round_bf(d, nd, bf), round_bf(s, ns, bf);
            float *want = copy_of(d, nd), *got = zeros(nd);
            nb_scale_cols(want + off, ld_dst, s, ld_src, rows, cols, 1.5f, acc);
            round_bf(want, nd, bf);
            void *dd = dev_up(d, nd, bf), *ds = dev_up(s, ns, bf);
            size_t es = bf ? 2 : 4;
            CALL(bf, nb_cuda_scale_cols, (void *)((char *)dd + off * es), ld_dst, ds, ld_src, rows, cols, 1.5f, acc, st);
            dev_down(got, dd, nd, bf);
            expect_close(acc ? "scale_cols (acc)" : "scale_cols (set)", bf, got, want, nd);
            dev_free(dd), dev_free(ds);
            free(d), free(s), free(want), free(got);
        }
    }
}

TEST_CASE(test_residual_and_add) {
    size_t n = 100003;
    FOR_DTYPE(bf) {
        float *a = randn(n, 0, 1), *b = randn(n, 0, 1);
        round_bf(a, n, bf), round_bf(b, n, bf);
        float *rsum = zeros(n), *radd = copy_of(a, n);
        nb_residual_forward(rsum, a, b, n);
        nb_add_inplace(radd, b, n);
        void *da = dev_up(a, n, bf), *db = dev_up(b, n, bf), *dout = dev_nan(n, bf);
        CALL(bf, nb_cuda_residual_forward, dout, da, db, n, st);
        CALL(bf, nb_cuda_add_inplace, da, db, n, st);
        float *gsum = zeros(n), *gadd = zeros(n);
        dev_down(gsum, dout, n, bf), dev_down(gadd, da, n, bf);
        round_bf(rsum, n, bf), round_bf(radd, n, bf); /* one rounding of an exact-ish sum */
        expect_close("residual fwd", bf, gsum, rsum, n);
        expect_close("add in place", bf, gadd, radd, n);
        if (!bf) expect_same("residual fwd vs CPU (fp32 adds are exact ops)", gsum, rsum, n);
        dev_free(da), dev_free(db), dev_free(dout);
        free(a), free(b), free(rsum), free(radd), free(gsum), free(gadd);
    }
    /* casts: f32 -> bf16 -> f32 is the host's round to nearest even */
    float *x = randn(n, 0, 3);
    void *dx = dev_up(x, n, 0), *dbf = dev_nan(n, 1), *dback = dev_nan(n, 0);
    nb_cuda_cast_f32_to_bf16(dbf, dx, n, st);
    nb_cuda_cast_bf16_to_f32(dback, dbf, n, st);
    float *back = zeros(n);
    dev_down(back, dback, n, 0);
    round_bf(x, n, 1);
    expect_same("cast f32 -> bf16 -> f32 vs host rounding", back, x, n);
    dev_free(dx), dev_free(dbf), dev_free(dback), free(x), free(back);
}

/* ---- rope ---- */

static void check_rope_with(int B, int T, int NH, int NKV, int HS, const nb_rope *rope) {
    int R = (NH + 2 * NKV) * HS;
    size_t n = (size_t)B * T * R;
    FOR_DTYPE(bf) {
        float *x = randn(n, 0, 1);
        round_bf(x, n, bf);
        /* q heads and k heads, as the attention block applies it; v heads stay as they are */
        float *rf = copy_of(x, n), *rb = copy_of(x, n);
        nb_rope_forward(rf, B, T, NH, HS, R, rope);
        nb_rope_forward(rf + (size_t)NH * HS, B, T, NKV, HS, R, rope);
        nb_rope_backward(rb, B, T, NH, HS, R, rope);
        nb_rope_backward(rb + (size_t)NH * HS, B, T, NKV, HS, R, rope);
        float *gf[2], *gb[2];
        for (int run = 0; run < 2; run++) {
            void *df = dev_up(x, n, bf), *db = dev_up(x, n, bf);
            size_t koff = (size_t)NH * HS * (bf ? 2 : 4);
            CALL(bf, nb_cuda_rope_forward, df, B, T, NH, HS, R, rope, st);
            CALL(bf, nb_cuda_rope_forward, (void *)((char *)df + koff), B, T, NKV, HS, R, rope, st);
            CALL(bf, nb_cuda_rope_backward, db, B, T, NH, HS, R, rope, st);
            CALL(bf, nb_cuda_rope_backward, (void *)((char *)db + koff), B, T, NKV, HS, R, rope, st);
            gf[run] = zeros(n), gb[run] = zeros(n);
            dev_down(gf[run], df, n, bf), dev_down(gb[run], db, n, bf);
            dev_free(df), dev_free(db);
        }
        char what[96];
        snprintf(what, sizeof what, "rope fwd T=%d HS=%d", T, HS);
        expect_close(what, bf, gf[0], rf, n);
        snprintf(what, sizeof what, "rope bwd T=%d HS=%d", T, HS);
        expect_close(what, bf, gb[0], rb, n);
        expect_same("rope fwd", gf[0], gf[1], n);
        expect_same("rope bwd", gb[0], gb[1], n);
        /* v columns are not rotated: bit-for-bit the input */
        for (int r = 0; r < B * T; r++) {
            size_t off = (size_t)r * R + (size_t)(NH + NKV) * HS;
            if (memcmp(gf[0] + off, x + off, (size_t)NKV * HS * sizeof(float)) != 0) {
                CHECK(0, "rope wrote outside its heads (row %d)", r);
                break;
            }
        }
        free(x), free(rf), free(rb);
        for (int run = 0; run < 2; run++) free(gf[run]), free(gb[run]);
    }
}

static void check_rope(int B, int T, int NH, int NKV, int HS) {
    nb_rope plain = nb_rope_plain(10000.0f);
    check_rope_with(B, T, NH, NKV, HS, &plain);
}

/* Scaled RoPE: the kernel's llama3 and linear frequencies against rope.c's (the CPU row checks
 * those against the formula): Llama 3.1's numbers at HS 64 and 128 (all three bands), and a
 * small original context so that short heads cross the bands too. */
TEST_CASE(test_rope_scaled) {
    nb_rope l31 = {500000.0f, NB_ROPE_LLAMA3, 8.0f, 1.0f, 4.0f, 8192};
    nb_rope small = {10000.0f, NB_ROPE_LLAMA3, 32.0f, 1.0f, 4.0f, 1024};
    nb_rope lin = {10000.0f, NB_ROPE_LINEAR, 4.0f, 0.0f, 0.0f, 0};
    check_rope_with(2, 1029, 4, 2, 128, &l31);
    check_rope_with(4, 300, 8, 2, 64, &l31);
    check_rope_with(3, 67, 6, 2, 24, &small);
    check_rope_with(3, 67, 6, 2, 24, &lin);
}

TEST_CASE(test_rope) {
    check_rope(3, 67, 6, 2, 24);
    check_rope(1, 1029, 2, 1, 64); /* angles up to ~1000 rad */
    check_rope(4, 300, 8, 2, 64);  /* llama-like; q heads: the batch split over two block rows */
    check_rope(3, 45, 4, 1, 128);
    check_rope(2, 9, 2, 1, 520);   /* 260 pairs a head: two chunks of pairs */
}

/* ---- attention ---- */

static void check_attention(int B, int T, int NH, int NKV, int HS) {
    int R = (NH + 2 * NKV) * HS;
    size_t nqkv = (size_t)B * T * R, no = (size_t)B * T * NH * HS, nl = (size_t)B * NH * T;
    char what[128];
    FOR_DTYPE(bf) {
        float *qkv = randn(nqkv, 0, 1), *dout = randn(no, 0, 1);
        round_bf(qkv, nqkv, bf), round_bf(dout, no, bf);
        float *rout = zeros(no), *rlse = zeros(nl);
        nb_attention_forward(rout, rlse, qkv, B, T, NH, NKV, HS);
        float *out[2], *lse[2];
        for (int run = 0; run < 2; run++) {
            void *dq = dev_up(qkv, nqkv, bf), *dout_ = dev_nan(no, bf), *dl = dev_nan(nl, 0);
            CALL(bf, nb_cuda_attention_forward, dout_, dl, dq, B, T, NH, NKV, HS, st);
            out[run] = zeros(no), lse[run] = zeros(nl);
            dev_down(out[run], dout_, no, bf), dev_down(lse[run], dl, nl, 0);
            dev_free(dq), dev_free(dout_), dev_free(dl);
        }
        snprintf(what, sizeof what, "attention fwd out (T=%d NH=%d NKV=%d HS=%d)", T, NH, NKV, HS);
        expect_close(what, bf, out[0], rout, no);
        snprintf(what, sizeof what, "attention fwd lse (HS=%d)", HS);
        expect_close(what, bf, lse[0], rlse, nl);
        expect_same("attention fwd out", out[0], out[1], no);
        expect_same("attention fwd lse", lse[0], lse[1], nl);

        /* backward from the CPU's out and lse (rounded like the GPU's out in bf16 mode) */
        round_bf(rout, no, bf);
        float *g0 = zeros(nqkv);
        nb_attention_backward(g0, dout, qkv, rout, rlse, B, T, NH, NKV, HS);
        float *init = grad_init(g0, nqkv, bf), *rg = copy_of(init, nqkv);
        nb_attention_backward(rg, dout, qkv, rout, rlse, B, T, NH, NKV, HS);
        float *g[2];
        for (int run = 0; run < 2; run++) {
            void *dq = dev_up(qkv, nqkv, bf), *ddo = dev_up(dout, no, bf), *dout_ = dev_up(rout, no, bf);
            void *dl = dev_up(rlse, nl, 0), *gd = dev_up(init, nqkv, bf);
            CALL(bf, nb_cuda_attention_backward, gd, ddo, dq, dout_, dl, B, T, NH, NKV, HS, st);
            g[run] = zeros(nqkv);
            dev_down(g[run], gd, nqkv, bf);
            dev_free(dq), dev_free(ddo), dev_free(dout_), dev_free(dl), dev_free(gd);
        }
        snprintf(what, sizeof what, "attention bwd dqkv (HS=%d)", HS);
        expect_grad(what, bf, g[0], rg, init, nqkv);
        expect_same("attention bwd dqkv", g[0], g[1], nqkv);
        free(qkv), free(dout), free(rout), free(rlse), free(g0), free(init), free(rg);
        for (int run = 0; run < 2; run++) free(out[run]), free(lse[run]), free(g[run]);
    }
}

TEST_CASE(test_attention) {
    check_attention(2, 67, 6, 2, 24);  /* GQA groups of 3, HS < 32 */
    check_attention(1, 45, 4, 4, 64);  /* plain multi-head */
    check_attention(2, 50, 3, 1, 130); /* one kv head, HS past 128 */
    check_attention(1, 33, 2, 1, 256); /* the largest head size */
}

/* ---- embedding ---- */

/* skewed: one token in every fifth position (a run of N / 5 after the sort: longer than a warp and
 * than the rows the sorted backward keeps in flight), the rest spread over V */
static void check_embed(int B, int T, int C, int V, int skewed) {
    size_t N = (size_t)B * T, no = N * C;
    int32_t *tok = nb_malloc(N * sizeof(int32_t), "tokens");
    for (size_t i = 0; i < N; i++)
        tok[i] = skewed ? (i % 5 == 0 ? 7 : (int32_t)((i * 7919u) % (unsigned)V))
                        : (int32_t)((i * 7919u) % 41u * 7u); /* repeats, up to 280 */
    int32_t *dtok = NULL;
    CUDA_CHECK(cudaMalloc((void **)&dtok, N * sizeof(int32_t)));
    CUDA_CHECK(cudaMemcpy(dtok, tok, N * sizeof(int32_t), cudaMemcpyHostToDevice));
    FOR_DTYPE(bf)
        for (int with_wpe = 0; with_wpe <= 1; with_wpe++) {
            float *wte = randn((size_t)V * C, 0, 1), *wpe = randn((size_t)T * C, 0, 1), *dout = randn(no, 0, 1);
            round_bf(wte, (size_t)V * C, bf), round_bf(wpe, (size_t)T * C, bf), round_bf(dout, no, bf);
            float *rout = zeros(no);
            nb_embed_forward(rout, tok, wte, with_wpe ? wpe : NULL, B, T, C);
            float *g0te = zeros((size_t)V * C), *g0pe = zeros((size_t)T * C);
            nb_embed_backward(g0te, g0pe, dout, tok, B, T, C);
            float *ite = grad_init(g0te, (size_t)V * C, 0), *ipe = grad_init(g0pe, (size_t)T * C, 0);
            float *rte = copy_of(ite, (size_t)V * C), *rpe = copy_of(ipe, (size_t)T * C);
            nb_embed_backward(rte, with_wpe ? rpe : NULL, dout, tok, B, T, C);
            float *out[2], *gte[2], *gpe[2];
            for (int run = 0; run < 2; run++) {
                void *dte = dev_up(wte, (size_t)V * C, bf), *dpe = with_wpe ? dev_up(wpe, (size_t)T * C, bf) : NULL;
                void *ddo = dev_up(dout, no, bf), *dout_ = dev_nan(no, bf);
                void *gdte = dev_up(ite, (size_t)V * C, 0), *gdpe = dev_up(ipe, (size_t)T * C, 0);
                CALL(bf, nb_cuda_embed_forward, dout_, dtok, dte, dpe, B, T, C, V, st);
                /* run 1: the vocabulary-scan backward, which must give the sorted one's bits */
                setenv("NB_EMBED_SCAN", run ? "1" : "0", 1);
                CALL(bf, nb_cuda_embed_backward, gdte, with_wpe ? gdpe : NULL, ddo, dtok, B, T, C, V, st);
                unsetenv("NB_EMBED_SCAN");
                out[run] = zeros(no), gte[run] = zeros((size_t)V * C), gpe[run] = zeros((size_t)T * C);
                dev_down(out[run], dout_, no, bf);
                dev_down(gte[run], gdte, (size_t)V * C, 0), dev_down(gpe[run], gdpe, (size_t)T * C, 0);
                dev_free(dte), dev_free(dpe), dev_free(ddo), dev_free(dout_), dev_free(gdte), dev_free(gdpe);
            }
            round_bf(rout, no, bf);
            expect_close(with_wpe ? "embed fwd (wte + wpe)" : "embed fwd (wte only)", bf, out[0], rout, no);
            expect_grad("embed bwd dwte", bf, gte[0], rte, ite, (size_t)V * C);
            if (with_wpe) expect_grad("embed bwd dwpe", bf, gpe[0], rpe, ipe, (size_t)T * C);
            else expect_untouched("embed bwd dwpe (NULL)", gpe[0], ipe, (size_t)T * C);
            /* the same additions in the same order as embed.c: the same bits */
            if (!bf) expect_same("embed bwd dwte vs CPU (same order)", gte[0], rte, (size_t)V * C);
            expect_same("embed fwd", out[0], out[1], no);
            expect_same("embed bwd dwte (sorted vs scan)", gte[0], gte[1], (size_t)V * C);
            expect_same("embed bwd dwpe", gpe[0], gpe[1], (size_t)T * C);
            free(wte), free(wpe), free(dout), free(rout), free(g0te), free(g0pe), free(ite), free(ipe);
            free(rte), free(rpe);
            for (int run = 0; run < 2; run++) free(out[run]), free(gte[run]), free(gpe[run]);
        }
    /* An out-of-range token: its row is NaN, the others are right, nothing else is read. */
    float *wte = randn((size_t)V * C, 0, 1), *out = zeros(no);
    tok[5] = V;
    CUDA_CHECK(cudaMemcpy(dtok, tok, N * sizeof(int32_t), cudaMemcpyHostToDevice));
    void *dte = dev_up(wte, (size_t)V * C, 0), *dout_ = dev_nan(no, 0);
    nb_cuda_embed_forward_f32(dout_, dtok, dte, NULL, B, T, C, V, st);
    dev_down(out, dout_, no, 0);
    CHECK(isnan(out[5 * C]) && isnan(out[5 * C + C - 1]), "token %d >= V should give a NaN row", V);
    CHECK(out[4 * C] == wte[(size_t)tok[4] * C], "rows next to a bad token must be normal");
    dev_free(dte), dev_free(dout_), free(wte), free(out);
    CUDA_CHECK(cudaFree(dtok));
    free(tok);
}

TEST_CASE(test_embed) {
    check_embed(3, 37, 77, 301, 0); /* V > 2 * 128: several vocabulary blocks of the scan */
    check_embed(4, 256, 300, 1000, 1); /* C > 128: several column slices of the sorted runs */
}

/* ---- cross-entropy ---- */

/* padded = 0: w has 3 padding rows, NaN (must never be read), and the op sees w_rows = V;
 * padded = 1: w has the model's padding to a multiple of 64 (zero rows) and the op sees them
 * (nb_cuda_xent_padded): the GEMMs run over them (aligned, vectorized rows), their columns stay
 * out of the softmax and their gradient rows get += 0. Either way dw's padding rows hold a
 * sentinel that must come back unchanged. */
/* masked: every third target is NB_XENT_IGNORE (loss 0, gradient 0; the CPU op is the reference) */
static void check_xent(int N, int C, int V, int chunk_rows, int padded, int masked) {
    int Vp = padded ? (V + 63) / 64 * 64 : V + 3;
    size_t ni = (size_t)N * C, nw = (size_t)Vp * C, nwv = (size_t)V * C;
    float gs = 1.0f / N;
    char what[128];
    int32_t *tg = nb_malloc((size_t)N * sizeof(int32_t), "targets"), *dtg = NULL;
    for (int i = 0; i < N; i++) tg[i] = (int32_t)(((unsigned)i * 2654435761u) % (unsigned)V);
    for (int i = 1; masked && i < N; i += 3) tg[i] = NB_XENT_IGNORE;
    CUDA_CHECK(cudaMalloc((void **)&dtg, (size_t)N * sizeof(int32_t)));
    CUDA_CHECK(cudaMemcpy(dtg, tg, (size_t)N * sizeof(int32_t), cudaMemcpyHostToDevice));
    FOR_DTYPE(bf) {
        float *inp = randn(ni, 0, 1), *w = randn(nw, 0, 0.3f);
        round_bf(inp, ni, bf), round_bf(w, nw, bf);
        for (size_t i = nwv; i < nw; i++) w[i] = padded ? 0.0f : NAN;
        float *g0i = zeros(ni), *g0w = zeros(nw), *rl = zeros(N);
        nb_xent_forward_backward(g0i, g0w, rl, inp, w, tg, N, C, V, gs, chunk_rows);
        float *ii = grad_init(g0i, ni, bf), *iw = grad_init(g0w, nw, 0);
        for (size_t i = nwv; i < nw; i++) iw[i] = 7.0f;
        float *ri = copy_of(ii, ni), *rw = copy_of(iw, nw);
        double rsum = nb_xent_forward_backward(ri, rw, rl, inp, w, tg, N, C, V, gs, chunk_rows);
        float *gi[2], *gw[2], *gl[2], *gl_fwd = zeros(N);
        double gsum[2];
        for (int run = 0; run < 2; run++) {
            void *di = dev_up(inp, ni, bf), *dw = dev_up(w, nw, bf), *dl = dev_nan(N, 0);
            void *gdi = dev_up(ii, ni, bf), *gdw = dev_up(iw, nw, 0);
            double *dsum = NULL;
            CUDA_CHECK(cudaMalloc((void **)&dsum, sizeof(double)));
            if (padded)
                CALL(bf, nb_cuda_xent_padded, gdi, gdw, dl, di, dw, dtg, N, C, V, Vp, gs, chunk_rows, lt, st);
            else
                CALL(bf, nb_cuda_xent_forward_backward, gdi, gdw, dl, di, dw, dtg, N, C, V, gs, chunk_rows, lt, st);
            nb_cuda_sum_f64(dsum, dl, N, st);
            gi[run] = zeros(ni), gw[run] = zeros(nw), gl[run] = zeros(N);
            dev_down(gi[run], gdi, ni, bf), dev_down(gw[run], gdw, nw, 0), dev_down(gl[run], dl, N, 0);
            CUDA_CHECK(cudaMemcpy(&gsum[run], dsum, sizeof(double), cudaMemcpyDeviceToHost));
            if (run == 0) { /* forward only: the same losses, no gradient work */
                void *dl2 = dev_nan(N, 0);
                if (padded)
                    CALL(bf, nb_cuda_xent_padded, NULL, NULL, dl2, di, dw, dtg, N, C, V, Vp, gs, chunk_rows, lt, st);
                else
                    CALL(bf, nb_cuda_xent_forward_backward, NULL, NULL, dl2, di, dw, dtg, N, C, V, gs, chunk_rows,
                         lt, st);
                dev_down(gl_fwd, dl2, N, 0);
                dev_free(dl2);
            }
            dev_free(di), dev_free(dw), dev_free(dl), dev_free(gdi), dev_free(gdw);
            CUDA_CHECK(cudaFree(dsum));
        }
        snprintf(what, sizeof what, "xent losses (V=%d%s chunk=%d)", V, padded ? " padded" : "", chunk_rows);
        expect_close(what, bf, gl[0], rl, N);
        expect_close("xent losses, forward only", bf, gl_fwd, rl, N);
        double se = fabs(gsum[0] - rsum) / fabs(rsum);
        ot_log("    %-40s %-4s rel err %.2e\n", "xent loss sum (nb_cuda_sum_f64)", MODE[bf], se);
        CHECK(se <= TOL[bf], "xent loss sum: %.9g vs CPU %.9g", gsum[0], rsum);
        expect_grad("xent dinp", bf, gi[0], ri, ii, ni);
        expect_grad("xent dw[:V]", bf, gw[0], rw, iw, nwv);
        expect_untouched("xent dw padding rows", gw[0] + nwv, iw + nwv, nw - nwv);
        expect_same("xent losses", gl[0], gl[1], N);
        expect_same("xent dinp", gi[0], gi[1], ni);
        expect_same("xent dw", gw[0], gw[1], nw);
        CHECK(gsum[0] == gsum[1], "xent loss sum differs between runs");
        free(inp), free(w), free(g0i), free(g0w), free(rl), free(ii), free(iw), free(ri), free(rw), free(gl_fwd);
        for (int run = 0; run < 2; run++) free(gi[run]), free(gw[run]), free(gl[run]);
    }
    CUDA_CHECK(cudaFree(dtg));
    free(tg);
}

TEST_CASE(test_xent) {
    check_xent(3 * 37, 77, 997, 40, 0, 0); /* three chunks, the last partial; odd rows (scalar path) */
    check_xent(45, 64, 1531, 0, 0, 0);     /* default chunking */
    check_xent(3 * 37, 80, 997, 40, 1, 0); /* padded to 1024 columns: 16-byte rows, 27 padding columns */
    check_xent(45, 64, 1531, 0, 1, 0);     /* padded to 1536, one chunk */
    check_xent(7, 48, 40, 0, 1, 0);        /* V < 64: most vectors are padding; rows of 64 columns */
    check_xent(9, 64, 50257, 0, 1, 0);     /* GPT-2's vocabulary: 100.6 KB rows in shared memory */
}

TEST_CASE(test_xent_masked) {
    check_xent(3 * 37, 77, 997, 40, 0, 1); /* scalar path, chunks */
    check_xent(45, 64, 1531, 0, 1, 1);     /* padded, vector path */
}

/* ---- AdamW and the norm helpers ---- */

TEST_CASE(test_adamw) {
    size_t n = 100003;
    nb_adamw_cfg cfg = {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f};
    float *p = randn(n, 0, 1), *g = randn(n, 0, 0.1f), *m = randn(n, 0, 0.01f), *v = randn(n, 0, 0.01f);
    for (size_t i = 0; i < n; i++) v[i] = v[i] * v[i];
    float *rp = copy_of(p, n), *rm = copy_of(m, n), *rv = copy_of(v, n);
    nb_adamw_update(rp, g, rm, rv, n, cfg, 7);
    float *gp[2], *gm[2], *gv[2], *glp = zeros(n);
    for (int run = 0; run < 2; run++) {
        void *dp = dev_up(p, n, 0), *dg = dev_up(g, n, 0), *dm = dev_up(m, n, 0), *dv = dev_up(v, n, 0);
        void *dlp = dev_nan(n, 1);
        nb_cuda_adamw_update(dp, dg, dm, dv, dlp, n, cfg, 7, st);
        gp[run] = zeros(n), gm[run] = zeros(n), gv[run] = zeros(n);
        dev_down(gp[run], dp, n, 0), dev_down(gm[run], dm, n, 0), dev_down(gv[run], dv, n, 0);
        if (run == 0) dev_down(glp, dlp, n, 1);
        dev_free(dp), dev_free(dg), dev_free(dm), dev_free(dv), dev_free(dlp);
    }
    expect_close("adamw params", 0, gp[0], rp, n);
    expect_close("adamw m", 0, gm[0], rm, n);
    expect_close("adamw v", 0, gv[0], rv, n);
    /* FMA-free, same scalars: the CPU's bits */
    expect_same("adamw params vs CPU (bitwise)", gp[0], rp, n);
    expect_same("adamw m vs CPU (bitwise)", gm[0], rm, n);
    expect_same("adamw v vs CPU (bitwise)", gv[0], rv, n);
    expect_same("adamw params", gp[0], gp[1], n);
    float *rlp = copy_of(rp, n);
    round_bf(rlp, n, 1);
    expect_same("adamw bf16 copy of params", glp, rlp, n);

    /* sumsq and scale: a slab bigger than one 65536-element reduction block */
    size_t ns = 3 * 65536 + 12345;
    float *x = randn(ns, 0, 1);
    double ref = nb_sumsq(x, ns), got[2];
    void *dx = dev_up(x, ns, 0);
    double *dres = NULL;
    CUDA_CHECK(cudaMalloc((void **)&dres, sizeof(double)));
    for (int run = 0; run < 2; run++) {
        nb_cuda_sumsq(dres, dx, ns, st);
        CUDA_CHECK(cudaStreamSynchronize(st));
        CUDA_CHECK(cudaMemcpy(&got[run], dres, sizeof(double), cudaMemcpyDeviceToHost));
    }
    ot_log("    %-40s %-4s rel err %.2e\n", "sumsq", "f64", fabs(got[0] - ref) / ref);
    CHECK(fabs(got[0] - ref) <= 1e-12 * ref, "sumsq %.17g vs CPU %.17g", got[0], ref);
    CHECK(got[0] == got[1], "sumsq differs between runs");
    { /* 4 bytes off: the scalar loads; and a vector tail of 3 elements */
        double ref1 = nb_sumsq(x + 1, ns - 1), ref3 = nb_sumsq(x, ns - 2), g1 = 0, g3 = 0;
        nb_cuda_sumsq(dres, (const float *)dx + 1, ns - 1, st);
        CUDA_CHECK(cudaStreamSynchronize(st));
        CUDA_CHECK(cudaMemcpy(&g1, dres, sizeof(double), cudaMemcpyDeviceToHost));
        nb_cuda_sumsq(dres, dx, ns - 2, st);
        CUDA_CHECK(cudaStreamSynchronize(st));
        CUDA_CHECK(cudaMemcpy(&g3, dres, sizeof(double), cudaMemcpyDeviceToHost));
        CHECK(fabs(g1 - ref1) <= 1e-12 * ref1, "sumsq (unaligned) %.17g vs CPU %.17g", g1, ref1);
        CHECK(fabs(g3 - ref3) <= 1e-12 * ref3, "sumsq (3-element tail) %.17g vs CPU %.17g", g3, ref3);
    }
    /* the norm's blocks, as the stream schedule sums gradients that stay on the device: the host's
     * bits, block by block (from an aligned start and from one 4 bytes off, with a short last block) */
    for (int shift = 0; shift < 2; shift++) {
        size_t nn = ns - (size_t)shift, nblk = (nn + NB_SUMSQ_BLOCK - 1) / NB_SUMSQ_BLOCK;
        double *dpart = NULL, *gpart = nb_malloc(nblk * sizeof(double), "test");
        CUDA_CHECK(cudaMalloc((void **)&dpart, nblk * sizeof(double)));
        nb_cuda_sumsq_blocks(dpart, (const float *)dx + shift, nn, st);
        CUDA_CHECK(cudaStreamSynchronize(st));
        CUDA_CHECK(cudaMemcpy(gpart, dpart, nblk * sizeof(double), cudaMemcpyDeviceToHost));
        size_t bad = 0;
        for (size_t b = 0; b < nblk; b++) {
            size_t at = b * NB_SUMSQ_BLOCK, len = nn - at < NB_SUMSQ_BLOCK ? nn - at : NB_SUMSQ_BLOCK;
            bad += memcmp(&gpart[b], &(double){nb_sumsq_block(x + shift + at, len)}, sizeof(double)) != 0;
        }
        CHECK(bad == 0, "sumsq blocks (shift %d): %zu of %zu blocks differ from the host's", shift, bad, nblk);
        CUDA_CHECK(cudaFree(dpart));
        free(gpart);
    }
    nb_cuda_scale_inplace(dx, ns, 0.37f, st);
    float *gx = zeros(ns);
    dev_down(gx, dx, ns, 0);
    nb_scale_inplace(x, ns, 0.37f);
    expect_same("scale in place vs CPU", gx, x, ns);
    CUDA_CHECK(cudaFree(dres));
    dev_free(dx), free(x), free(gx);
    free(p), free(g), free(m), free(v), free(rp), free(rm), free(rv), free(glp), free(rlp);
    for (int run = 0; run < 2; run++) free(gp[run]), free(gm[run]), free(gv[run]);
}

/* AdamW over a slab of tensors in one call against the CPU's per-tensor nb_adamw_apply: the same
 * bits. Tensors of awkward sizes, not all starting at a multiple of 4 elements, with gaps between
 * them (sentinels that must stay), both scalar sets, the clip factor formed on the device from a
 * sum of squares (below 1, so the gradients are scaled), more tensors than one launch takes, and
 * an unaligned slab (scalar path). */
static void check_adamw_spans(int nspans, int shift, int clip) {
    static const size_t sizes[] = {1, 3, 77, 64, 4096, 4099, 5, 768, 65536 + 13, 2, 4095, 130};
    nb_adamw_span *sp = nb_malloc((size_t)nspans * sizeof *sp, "spans");
    size_t total = 0;
    for (int i = 0; i < nspans; i++) {
        total += (size_t)(i % 5); /* gaps of 0..4 elements */
        sp[i].offset = total;
        sp[i].numel = sizes[i % (int)(sizeof sizes / sizeof sizes[0])];
        sp[i].scalars = i % 3 == 0 ? 1 : 0;
        total += sp[i].numel;
    }
    total += 7;
    nb_adamw_scalars k[2];
    k[0] = nb_adamw_prepare((nb_adamw_cfg){1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f}, 7);
    k[1] = nb_adamw_prepare((nb_adamw_cfg){1e-3f, 0.9f, 0.95f, 1e-8f, 0.0f}, 7);
    float *p = randn(total, 0, 1), *g = randn(total, 0, 0.1f), *m = randn(total, 0, 0.01f), *v = randn(total, 0, 0.01f);
    for (size_t i = 0; i < total; i++) v[i] = v[i] * v[i];
    double sumsq = nb_sumsq(g, total);
    float max_norm = clip ? (float)(0.5 * sqrt(sumsq)) : 0.0f; /* clip: factor ~0.5 */
    float cf = nb_clip_factor(sqrt(sumsq), max_norm);
    CHECK(!clip || cf < 1.0f, "the test's clip factor should be below 1");
    float *rp = copy_of(p, total), *rm = copy_of(m, total), *rv = copy_of(v, total);
    for (int i = 0; i < nspans; i++)
        nb_adamw_apply(rp + sp[i].offset, g + sp[i].offset, rm + sp[i].offset, rv + sp[i].offset, sp[i].numel,
                       &k[sp[i].scalars], cf);
    float *rlp = copy_of(rp, total);
    round_bf(rlp, total, 1);
    float *lp_init = randn(total, 0, 1);
    round_bf(lp_init, total, 1);
    nb_adamw_scalars *dk = NULL;
    double *dsum = NULL;
    CUDA_CHECK(cudaMalloc((void **)&dk, sizeof k));
    CUDA_CHECK(cudaMalloc((void **)&dsum, sizeof sumsq));
    CUDA_CHECK(cudaMemcpy(dk, k, sizeof k, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dsum, &sumsq, sizeof sumsq, cudaMemcpyHostToDevice));
    float *gp[2], *gm[2], *gv[2], *glp[2];
    for (int run = 0; run < 2; run++) {
        void *b[5], *dp, *dg, *dm, *dv, *dlp;
        if (shift) {
            dp = dev_up_shifted(p, total, 0, &b[0]), dg = dev_up_shifted(g, total, 0, &b[1]);
            dm = dev_up_shifted(m, total, 0, &b[2]), dv = dev_up_shifted(v, total, 0, &b[3]);
            dlp = dev_up_shifted(lp_init, total, 1, &b[4]);
        } else {
            b[0] = dp = dev_up(p, total, 0), b[1] = dg = dev_up(g, total, 0), b[2] = dm = dev_up(m, total, 0);
            b[3] = dv = dev_up(v, total, 0), b[4] = dlp = dev_up(lp_init, total, 1);
        }
        nb_cuda_adamw_apply_spans(dp, dg, dm, dv, dlp, sp, nspans, dk, clip ? dsum : NULL, max_norm, st);
        gp[run] = zeros(total), gm[run] = zeros(total), gv[run] = zeros(total), glp[run] = zeros(total);
        dev_down(gp[run], dp, total, 0), dev_down(gm[run], dm, total, 0), dev_down(gv[run], dv, total, 0);
        dev_down(glp[run], dlp, total, 1);
        for (int j = 0; j < 5; j++) dev_free(b[j]);
    }
    char what[96];
    snprintf(what, sizeof what, "adamw spans x%d%s%s", nspans, shift ? " unaligned" : "", clip ? " clipped" : "");
    expect_close(what, 0, gp[0], rp, total);
    expect_same("adamw spans params vs CPU per tensor (bitwise)", gp[0], rp, total);
    expect_same("adamw spans m vs CPU per tensor (bitwise)", gm[0], rm, total);
    expect_same("adamw spans v vs CPU per tensor (bitwise)", gv[0], rv, total);
    /* the bf16 copy: the new params where a span is, the old bits in the gaps */
    for (size_t i = 0, s = 0; i < total; i++) {
        while (s < (size_t)nspans && sp[s].offset + sp[s].numel <= i) s++;
        if (s == (size_t)nspans || i < sp[s].offset) rlp[i] = lp_init[i];
    }
    expect_same("adamw spans bf16 copy (gaps untouched)", glp[0], rlp, total);
    expect_same("adamw spans params (two runs)", gp[0], gp[1], total);
    free(sp), free(p), free(g), free(m), free(v), free(rp), free(rm), free(rv), free(rlp), free(lp_init);
    CUDA_CHECK(cudaFree(dk));
    CUDA_CHECK(cudaFree(dsum));
    for (int run = 0; run < 2; run++) free(gp[run]), free(gm[run]), free(gv[run]), free(glp[run]);
}

TEST_CASE(test_adamw_spans) {
    check_adamw_spans(12, 0, 1);
    check_adamw_spans(12, 0, 0);  /* no clipping (sumsq NULL) */
    check_adamw_spans(12, 1, 1);  /* unaligned slabs: every element on the scalar path */
    check_adamw_spans(600, 0, 1); /* three launches of up to 256 tensors */
}

#define FN(f) f
#else
#define FN(f) NULL
#endif

static const ot_row rows[] = {
    {"matmul_fwd", "cuda", OT_F32, "303x77x53, the DLRM twin's 6x13x512 .. 6x7x5; +-bias", 1e-5, OT_EVAL, FN(test_matmul_forward), 0, OT_SMALL},
    {"matmul_fwd", "cuda", OT_BF16, "303x77x53, the DLRM twin's 6x13x512 .. 6x7x5; +-bias", 1e-2, OT_EVAL, FN(test_matmul_forward), 0, OT_SMALL},
    {"matmul_gelu_fwd", "cuda", OT_F32, "303x80x64|53 +-bias, candidates", 1e-5, OT_EVAL, FN(test_matmul_gelu_forward), 0, 0},
    {"matmul_gelu_fwd", "cuda", OT_BF16, "303x80x64|53 +-bias, candidates", 1e-2, OT_EVAL, FN(test_matmul_gelu_forward), 0, 0},
    {"matmul_gelu_fwd", "cuda", OT_BF16, "32768x768x3072 candidates -1, 0", 1e-2, OT_EVAL, FN(test_matmul_gelu_forward_large), 0, 0},
    {"matmul_bwd", "cuda", OT_F32, "303x77x53, 303x64x264", 1e-5, OT_EVAL, FN(test_matmul_backward), 0, 0},
    {"matmul_bwd", "cuda", OT_BF16, "303x77x53, 303x64x264", 1e-2, OT_EVAL, FN(test_matmul_backward), 0, 0},
    {"matmul_bwd", "cuda", OT_F32, "tiny: 6x7x5, 6x5x7, 6x216x7, 6x7x8, 6x8x5, 1x3x3, bottom 6x13x512x256x8; +1, +3 elements", 1e-5, OT_EVAL, FN(test_matmul_backward_tiny), 0, OT_SMALL},
    {"matmul_bwd", "cuda", OT_BF16, "tiny: 6x7x5, 6x5x7, 6x216x7, 6x7x8, 6x8x5, 1x3x3, bottom 6x13x512x256x8; +1, +3 elements", 1e-2, OT_EVAL, FN(test_matmul_backward_tiny), 0, OT_SMALL},
    {"layernorm", "cuda", OT_F32, "6 shapes: 303x77 .. 40x6400", 1e-5, OT_EVAL, FN(test_layernorm), 0, 0},
    {"layernorm", "cuda", OT_BF16, "6 shapes: 303x77 .. 40x6400", 1e-2, OT_EVAL, FN(test_layernorm), 0, 0},
    {"rmsnorm", "cuda", OT_F32, "5 shapes: 303x77 .. 40x6400", 1e-5, OT_EVAL, FN(test_rmsnorm), 0, 0},
    {"rmsnorm", "cuda", OT_BF16, "5 shapes: 303x77 .. 40x6400", 1e-2, OT_EVAL, FN(test_rmsnorm), 0, 0},
    {"gelu", "cuda", OT_F32, "23331 (303x77)", 1e-5, OT_EVAL, FN(test_gelu), 0, 0},
    {"gelu", "cuda", OT_BF16, "23331 (303x77)", 1e-2, OT_EVAL, FN(test_gelu), 0, 0},
    {"swiglu", "cuda", OT_F32, "303x45, 303x256, 77x344", 1e-5, OT_EVAL, FN(test_swiglu), 0, 0},
    {"swiglu", "cuda", OT_BF16, "303x45, 303x256, 77x344", 1e-2, OT_EVAL, FN(test_swiglu), 0, 0},
    {"residual_add", "cuda", OT_F32, "100003, add_inplace", 1e-5, OT_EVAL, FN(test_residual_and_add), 0, 0},
    {"residual_add", "cuda", OT_BF16, "100003, add_inplace", 1e-2, OT_EVAL, FN(test_residual_and_add), 0, 0},
    {"scale_cols", "cuda", OT_F32, "1003x33 of ld 96 from ld 40", 1e-5, OT_EVAL, FN(test_scale_cols), 0, 0},
    {"scale_cols", "cuda", OT_BF16, "1003x33 of ld 96 from ld 40", 1e-2, OT_EVAL, FN(test_scale_cols), 0, 0},
    {"rope", "cuda", OT_F32, "5 shapes, HS 24 .. 520", 1e-5, OT_EVAL, FN(test_rope), 0, 0},
    {"rope", "cuda", OT_BF16, "5 shapes, HS 24 .. 520", 1e-2, OT_EVAL, FN(test_rope), 0, 0},
    {"rope", "cuda", OT_F32, "llama3 + linear, HS 24 .. 128", 1e-5, OT_EVAL, FN(test_rope_scaled), 0, 0},
    {"rope", "cuda", OT_BF16, "llama3 + linear, HS 24 .. 128", 1e-2, OT_EVAL, FN(test_rope_scaled), 0, 0},
    {"attention", "cuda", OT_F32, "4 shapes, GQA, HS 24 .. 256", 1e-5, OT_EVAL, FN(test_attention), 0, 0},
    {"attention", "cuda", OT_BF16, "4 shapes, GQA, HS 24 .. 256", 1e-2, OT_EVAL, FN(test_attention), 0, 0},
    {"embed", "cuda", OT_F32, "3x37x77 V301, 4x256x300 V1000", 1e-5, OT_EVAL, FN(test_embed), 0, 0},
    {"embed", "cuda", OT_BF16, "3x37x77 V301, 4x256x300 V1000", 1e-2, OT_EVAL, FN(test_embed), 0, 0},
    {"xent", "cuda", OT_F32, "6 shapes, V to 50257, padded", 1e-5, OT_EVAL, FN(test_xent), 0, 0},
    {"xent", "cuda", OT_BF16, "6 shapes, V to 50257, padded", 1e-2, OT_EVAL, FN(test_xent), 0, 0},
    {"xent_masked", "cuda", OT_F32, "every 3rd row ignored, 2 shapes", 1e-5, OT_EVAL, FN(test_xent_masked), 0, 0},
    {"xent_masked", "cuda", OT_BF16, "every 3rd row ignored, 2 shapes", 1e-2, OT_EVAL, FN(test_xent_masked), 0, 0},
    {"adamw", "cuda", OT_F32, "100003, lowp copy bf16", 1e-5, OT_EVAL, FN(test_adamw), 0, 0},
    {"adamw_spans", "cuda", OT_F32, "12 and 600 spans, unaligned, clip", 1e-5, OT_EVAL, FN(test_adamw_spans), 0, 0},
};
OT_TABLE(ot_dense_cuda, rows);
