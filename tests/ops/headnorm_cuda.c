/* The per-head RMSNorm (nb_cuda_headnorm_*, norm.cu) against the CPU op (nb_headnorm_*): the cuda
 * rows of the headnorm family. As in dense_cuda.c: inputs rounded to bf16 on both sides in bf16
 * mode, the kept input and rstd poisoned with NaN first, dw accumulated onto a random start (the
 * increments compared), dx written in place over dy, the values beside the heads (the rest of a
 * qkv row) untouched, a NULL dw leaving dx's bits, two runs bitwise equal. SKIP without a GPU. */
#include "optest.h"

#ifdef NB_WITH_CUDA
#include "dense_cuda.h"

/* N rows of `stride` values; nh heads of HS at the start of each row. */
static void check_headnorm(int N, int nh, int HS, int stride) {
    size_t R = (size_t)N * nh, nv = R * HS, total = (size_t)N * stride;
    char what[96];
    FOR_DTYPE(bf) {
        float *x = randn(total, 0.3f, 1.5f), *w = randn(HS, 1, 0.2f), *dy = randn(total, 0, 1);
        round_bf(x, total, bf), round_bf(w, HS, bf), round_bf(dy, total, bf);
        float *ry = copy_of(x, total), *rkeep = zeros(nv), *rrstd = zeros(R);
        nb_headnorm_forward(ry, rkeep, rrstd, w, N, nh, HS, stride, 1e-6f);
        float *g0 = zeros(HS), *rdx = copy_of(dy, total);
        nb_headnorm_backward(rdx, g0, rkeep, w, rrstd, N, nh, HS, stride);
        float *dw0 = grad_init(g0, HS, 0), *rdw = copy_of(dw0, HS);
        free(rdx), rdx = copy_of(dy, total);
        nb_headnorm_backward(rdx, rdw, rkeep, w, rrstd, N, nh, HS, stride);

        float *y[2], *keep[2], *rstd[2], *dx[2], *dw[2];
        for (int run = 0; run < 2; run++) {
            void *dxv = dev_up(x, total, bf), *dwv = dev_up(w, HS, bf), *dk = dev_nan(nv, bf), *dr = dev_nan(R, 0);
            CALL(bf, nb_cuda_headnorm_forward, dxv, dk, dr, dwv, N, nh, HS, stride, 1e-6f, st);
            y[run] = zeros(total), keep[run] = zeros(nv), rstd[run] = zeros(R);
            dev_down(y[run], dxv, total, bf), dev_down(keep[run], dk, nv, bf), dev_down(rstd[run], dr, R, 0);
            /* the backward from the CPU's saved values, so its comparison is the backward's alone */
            void *dd = dev_up(dy, total, bf), *dkr = dev_up(rkeep, nv, bf), *drr = dev_up(rrstd, R, 0);
            void *dg = dev_up(dw0, HS, 0);
            CALL(bf, nb_cuda_headnorm_backward, dd, dg, dkr, dwv, drr, N, nh, HS, stride, st);
            dx[run] = zeros(total), dw[run] = zeros(HS);
            dev_down(dx[run], dd, total, bf), dev_down(dw[run], dg, HS, 0);
            if (run == 1) {
                void *dd2 = dev_up(dy, total, bf);
                CALL(bf, nb_cuda_headnorm_backward, dd2, NULL, dkr, dwv, drr, N, nh, HS, stride, st);
                float *dx2 = zeros(total);
                dev_down(dx2, dd2, total, bf);
                expect_same("headnorm bwd dx (dw NULL)", dx2, dx[0], total);
                dev_free(dd2), free(dx2);
            }
            dev_free(dxv), dev_free(dwv), dev_free(dk), dev_free(dr), dev_free(dd), dev_free(dkr), dev_free(drr);
            dev_free(dg);
        }
        snprintf(what, sizeof what, "headnorm fwd (N=%d heads=%d HS=%d stride=%d)", N, nh, HS, stride);
        expect_close(what, bf, y[0], ry, total);
        CHECK(memcmp(keep[0], rkeep, nv * sizeof(float)) == 0, "headnorm fwd: the kept input differs from the heads");
        expect_close("headnorm fwd rstd", bf, rstd[0], rrstd, R);
        expect_close("headnorm bwd dx (beside the heads: dy as it was)", bf, dx[0], rdx, total);
        expect_grad("headnorm bwd dw", bf, dw[0], rdw, dw0, HS);
        for (int n = 0; n < N; n++)
            for (int i = nh * HS; i < stride; i++) {
                size_t k = (size_t)n * stride + i;
                CHECK(y[0][k] == x[k] && dx[0][k] == dy[k], "headnorm wrote outside the heads at row %d column %d", n, i);
            }
        expect_same("headnorm fwd", y[0], y[1], total);
        expect_same("headnorm fwd rstd", rstd[0], rstd[1], R);
        expect_same("headnorm bwd dx", dx[0], dx[1], total);
        expect_same("headnorm bwd dw", dw[0], dw[1], HS);
        for (int run = 0; run < 2; run++) free(y[run]), free(keep[run]), free(rstd[run]), free(dx[run]), free(dw[run]);
        free(x), free(w), free(dy), free(ry), free(rkeep), free(rrstd), free(g0), free(rdx), free(dw0), free(rdw);
    }
}

TEST_CASE(test_headnorm) {
    check_headnorm(37, 3, 24, (3 + 2 * 1) * 24); /* q of a GQA qkv row (1 kv head) */
    check_headnorm(300, 16, 128, 32 * 128); /* Qwen3-0.6B: its 16 q heads in qkv rows of 4096 */
    check_headnorm(5, 2, 40, 2 * 40 + 3); /* HS not a multiple of 32, an odd stride */
}

#define FN(f) f
#else
#define FN(f) NULL
#endif

static const ot_row rows[] = {
    {"headnorm", "cuda", OT_F32, "37x3x24, 300x16x128, 5x2x40", 1e-5, OT_EVAL, FN(test_headnorm), 0, OT_SMALL},
    {"headnorm", "cuda", OT_BF16, "37x3x24, 300x16x128, 5x2x40", 1e-2, OT_EVAL, FN(test_headnorm), 0, 0},
};
OT_TABLE(ot_headnorm_cuda, rows);
