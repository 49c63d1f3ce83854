/* The CUDA seqctr tables (nb_ctr_ops_cuda_f32 / _bf16) against the CPU table (nb_ctr_ops_cpu),
 * entry by entry, in fp32 and bf16 modes.
 *
 * As tests/test_ops_cuda.c: awkward sizes (E = 12 and 13 beside 64, N and D not multiples of 8,
 * a head size of 3 and one padded from 20 to 32), packed histories with empty ones, length 1,
 * lengths past the 64 rows of one pass and the shared-memory tile, up to max_len 37, 100, 256
 * and 300; embedding gradients with one row taking 40% of the lookups; outputs poisoned with NaN
 * first; gradients start from random non-zero values and the increments are compared (so
 * overwriting instead of accumulating fails); NULL gradients skipped while the others come out
 * with the same bits; fp32 within 1e-5 relative (true fp32), bf16 within 1e-2 with inputs
 * rounded to bf16 on both sides; every GPU op run twice and compared bit for bit.
 * Exits 77 (skipped) without a GPU, or when built without CUDA. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "check.h"

#ifndef NB_WITH_CUDA
int main(void) {
    (void)nb_test_failures;
    printf("skip: built without CUDA (nvcc was not found when this was compiled)\n");
    return 77;
}
#else

#include <cuda_runtime.h>

#include "core.h"
#include "cuda_check.h"
#include "ops/backend_ctr.h"
#include "ops/ops_ctr.h"
#include "rng.h"

#define SEED 20260214u
static const double TOL[2] = {1e-5, 1e-2}; /* [bf] */
static const char *MODE[2] = {"f32", "bf16"};

static cudaStream_t st;
static nb_task_ctx gctx, cctx; /* the GPU lane's context (its stream) and the CPU's */
static uint64_t next_stream = 1;

#define CPU (&nb_ctr_ops_cpu)
static const nb_ctr_ops_i *gpu(int bf) { return bf ? &nb_ctr_ops_cuda_bf16 : &nb_ctr_ops_cuda_f32; }

/* ---- host helpers ---- */

static uint16_t f2bf(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);                                            /* nearest even */
    return (uint16_t)(u >> 16);
}

static float bf2f(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static float *randn(size_t n, float mean, float std) {
    float *p = nb_malloc((n ? n : 1) * sizeof(float), "test tensor");
    nb_rng_fill_normal(p, n, SEED, next_stream++, mean, std);
    return p;
}

static uint32_t rand_u32(uint64_t stream, uint64_t i) { return nb_philox(SEED, stream, i).v[0]; }

static float *copy_of(const float *h, size_t n) {
    float *p = nb_malloc((n ? n : 1) * sizeof(float), "test tensor");
    memcpy(p, h, n * sizeof(float));
    return p;
}

static float *zeros(size_t n) { return nb_calloc(n ? n : 1, sizeof(float), "test tensor"); }

/* In bf16 mode the CPU reference must see the same (rounded) values as the GPU. */
static void round_bf(float *h, size_t n, int bf) {
    if (bf)
        for (size_t i = 0; i < n; i++) h[i] = bf2f(f2bf(h[i]));
}

static float *randn_bf(size_t n, float mean, float std, int bf) {
    float *p = randn(n, mean, std);
    round_bf(p, n, bf);
    return p;
}

static double rms(const float *x, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return n ? sqrt(s / n) : 0;
}

/* A gradient's starting value: random, on the scale of the increment g0 the op will add. */
static float *grad_init(const float *g0, size_t n, int bf) {
    float *p = randn(n, 0.0f, (float)(rms(g0, n) > 0 ? rms(g0, n) : 1.0));
    round_bf(p, n, bf);
    return p;
}

/* ---- device helpers (bf16 tensors are 2 bytes an element, fp32 ones 4) ---- */

static void *dev_raw(const void *h, size_t bytes) {
    void *d = NULL;
    CUDA_CHECK(cudaMalloc(&d, bytes ? bytes : 1));
    if (bytes) CUDA_CHECK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}

static void *dev_up(const float *h, size_t n, int bf) {
    if (!bf) return dev_raw(h, n * 4);
    uint16_t *t = nb_malloc((n ? n : 1) * 2, "bf16 staging");
    for (size_t i = 0; i < n; i++) t[i] = f2bf(h[i]);
    void *d = dev_raw(t, n * 2);
    free(t);
    return d;
}

/* All-ones bytes: NaN in both fp32 and bf16. */
static void *dev_nan(size_t n, int bf) {
    void *d = NULL;
    CUDA_CHECK(cudaMalloc(&d, (n ? n : 1) * (bf ? 2 : 4)));
    CUDA_CHECK(cudaMemset(d, 0xff, (n ? n : 1) * (bf ? 2 : 4)));
    return d;
}

static void dev_down(float *h, const void *d, size_t n, int bf) {
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

/* Downloads n elements into a new host array (freed by the caller). */
static float *dev_get(const void *d, size_t n, int bf) {
    float *h = zeros(n);
    dev_down(h, d, n, bf);
    return h;
}

static void dev_free(void *d) {
    if (d) CUDA_CHECK(cudaFree(d));
}

/* d + i elements of the mode's type (views into a device buffer, such as v = kv + E) */
static void *dev_at(void *d, size_t i, int bf) { return d ? (char *)d + i * (bf ? 2 : 4) : NULL; }

/* ---- comparisons ---- */

static double worst[2]; /* largest error seen per mode, for the summary */

static void expect_close(const char *what, int bf, const float *got, const float *ref, size_t n) {
    double e = rel_err(got, ref, n);
    if (e > worst[bf] && isfinite(e)) worst[bf] = e;
    printf("    %-46s %-4s rel err %.2e\n", what, MODE[bf], e);
    CHECK(e <= TOL[bf], "%s (%s): relative error %.3g > %.3g", what, MODE[bf], e, TOL[bf]);
}

/* Compares the increments got - init and ref - init. */
static void expect_grad(const char *what, int bf, const float *got, const float *ref, const float *init, size_t n) {
    float *dg = zeros(n), *dr = zeros(n);
    for (size_t i = 0; i < n; i++) {
        dg[i] = got[i] - init[i];
        dr[i] = ref[i] - init[i];
    }
    expect_close(what, bf, dg, dr, n);
    free(dg);
    free(dr);
}

static void expect_same(const char *what, const float *a, const float *b, size_t n) {
    CHECK(memcmp(a, b, n * sizeof(float)) == 0, "%s: results differ bit for bit", what);
}

/* Packed history offsets: sample b has off[b] .. off[b+1]-1. Every 7th history is empty, some
 * have length 1, max_len and max_len - 1; the rest are uniform in [0, max_len] or (one in four)
 * short, for a heavy tail. */
static int32_t *make_offsets(int B, int max_len, int *nh) {
    int32_t *off = nb_malloc(((size_t)B + 1) * sizeof(int32_t), "offsets");
    uint64_t s = next_stream++;
    off[0] = 0;
    for (int b = 0; b < B; b++) {
        uint32_t u = rand_u32(s, (uint64_t)b);
        int len = b % 7 == 0 ? 0 : b % 11 == 1 ? 1 : b == 2 ? max_len : b == 3 ? max_len - 1
                  : u % 4 == 0 ? (int)(u >> 8) % (max_len + 1) : (int)(u >> 8) % (max_len / 8 + 2);
        off[b + 1] = off[b] + len;
    }
    *nh = off[B];
    return off;
}

/* ---- embeddings ---- */

/* Lookups of F fields into rows of D0 = F * E + pad columns (pad != 0: destinations not all
 * 4-aligned, so the vector path and the scalar one mix); the pad columns must stay untouched. */
static void check_emb_gather(int E, int pad) {
    int B = 77, F = 5, D0 = F * E + pad, n = B * F;
    int64_t nrows = 1000;
    size_t nout = (size_t)B * D0, ntab = (size_t)nrows * E;
    float *table = randn(ntab, 0, 1), *ref = zeros(nout);
    int64_t *rows = nb_malloc((size_t)n * 8, "rows"), *dst = nb_malloc((size_t)n * 8, "dst");
    uint64_t s = next_stream++;
    for (int i = 0; i < n; i++) {
        dst[i] = (int64_t)(i / F) * D0 + (int64_t)(i % F) * E;
        rows[i] = rand_u32(s, (uint64_t)i) % nrows;
    }
    CPU->emb_gather(&cctx, ref, dst, table, rows, n, E);
    void *dtab = dev_up(table, ntab, 0), *drows = dev_raw(rows, (size_t)n * 8), *ddst = dev_raw(dst, (size_t)n * 8);
    char what[96];
    snprintf(what, sizeof what, "emb_gather E=%d pad=%d", E, pad);
    for (int bf = 0; bf <= 1; bf++) {
        float *got[2];
        for (int run = 0; run < 2; run++) {
            void *dout = dev_nan(nout, bf);
            gpu(bf)->emb_gather(&gctx, dout, ddst, dtab, drows, n, E);
            got[run] = dev_get(dout, nout, bf);
            dev_free(dout);
        }
        float *want = copy_of(ref, nout);
        round_bf(want, nout, bf);
        int same = 1, pad_nan = 1;
        for (size_t i = 0; i < nout; i++) {
            if ((int)(i % D0) < F * E)
                same &= memcmp(&got[0][i], &want[i], 4) == 0;
            else
                pad_nan &= isnan(got[0][i]);
        }
        printf("    %-46s %-4s %s\n", what, MODE[bf], same ? "same bits as the CPU (rounded)" : "DIFFERENT");
        CHECK(same, "%s (%s): gathered rows differ from the table's (rounded) values", what, MODE[bf]);
        CHECK(pad_nan, "%s (%s): wrote outside the destination slices", what, MODE[bf]);
        expect_same(what, got[0], got[1], nout);
        free(want), free(got[0]), free(got[1]);
    }
    dev_free(dtab), dev_free(drows), dev_free(ddst);
    free(table), free(ref), free(rows), free(dst);
}

TEST_CASE(test_emb_gather) {
    check_emb_gather(12, 2);
    check_emb_gather(64, 0);
    check_emb_gather(13, 0);
}

/* 40% of the lookups hit one row (more than one 32-lookup batch), one in five is a row of its
 * own (groups of one), the rest spread over 50 rows; src rows are read at scattered, unaligned
 * offsets. E = 200 takes two passes over the lookups. */
static void check_emb_grad_unique(int E) {
    int n = 3000, ld = E + 3;
    int64_t *rows = nb_malloc((size_t)n * 8, "rows"), *src_off = nb_malloc((size_t)n * 8, "src_off");
    int64_t *uniq = nb_malloc((size_t)n * 8, "uniq");
    int32_t *order = nb_malloc((size_t)n * 4, "order"), *inverse = nb_malloc((size_t)n * 4, "inverse");
    int32_t *seg = nb_malloc(((size_t)n + 1) * 4, "seg");
    uint64_t s = next_stream++;
    for (int i = 0; i < n; i++) {
        rows[i] = i % 5 < 2 ? 7 : i % 5 == 2 ? 1000 + i : (int64_t)(rand_u32(s, (uint64_t)i) % 50);
        src_off[i] = (int64_t)((i * 7919) % n) * ld + i % 3;
    }
    int U = nb_embag_unique_groups(uniq, order, seg, inverse, rows, n);
    void *doff = dev_raw(src_off, (size_t)n * 8), *dord = dev_raw(order, (size_t)n * 4);
    void *dseg = dev_raw(seg, ((size_t)U + 1) * 4);
    size_t nsrc = (size_t)n * ld, nu = (size_t)U * E;
    char what[96];
    snprintf(what, sizeof what, "emb_grad_unique E=%d U=%d", E, U);
    for (int bf = 0; bf <= 1; bf++) {
        float *src = randn_bf(nsrc, 0, 1, bf), *ref = randn(nu, 0, 1); /* overwritten */
        CPU->emb_grad_unique(&cctx, ref, src, src_off, order, seg, U, E);
        void *dsrc = dev_up(src, nsrc, bf);
        float *got[2];
        for (int run = 0; run < 2; run++) {
            void *dd = dev_nan(nu, 0);
            gpu(bf)->emb_grad_unique(&gctx, dd, dsrc, doff, dord, dseg, U, E);
            got[run] = dev_get(dd, nu, 0);
            dev_free(dd);
        }
        expect_close(what, bf, got[0], ref, nu);
        /* one thread per column adding in k order from 0: the CPU's float additions */
        expect_same("emb_grad_unique vs CPU (same order of adds)", got[0], ref, nu);
        expect_same(what, got[0], got[1], nu);
        dev_free(dsrc), free(src), free(ref), free(got[0]), free(got[1]);
    }
    dev_free(doff), dev_free(dord), dev_free(dseg);
    free(rows), free(src_off), free(uniq), free(order), free(inverse), free(seg);
}

TEST_CASE(test_emb_grad_unique) {
    check_emb_grad_unique(12);
    check_emb_grad_unique(64);
    check_emb_grad_unique(200);
}

/* ---- sparse optimizers (fp32 state whatever the precision) ---- */

static void check_sparse_optim(int E) {
    int nrows = 300, U = 77;
    size_t nt = (size_t)nrows * E, ng = (size_t)U * E;
    int64_t *rows = nb_malloc((size_t)U * 8, "rows");
    uint64_t s = next_stream++;
    for (int u = 0; u < U; u++) rows[u] = 3 * u + rand_u32(s, (uint64_t)u) % 3; /* strictly increasing */
    float *table = randn(nt, 0, 1), *grads = randn(ng, 0, 0.1f), *acc = randn(nrows, 0, 1);
    float *m = randn(nt, 0, 0.01f), *v = randn(nt, 0, 0.01f);
    for (int i = 0; i < nrows; i++) acc[i] = fabsf(acc[i]);
    for (size_t i = 0; i < nt; i++) v[i] *= v[i];
    void *drows = dev_raw(rows, (size_t)U * 8), *dg = dev_up(grads, ng, 0);
    char what[96];
    /* row-wise adagrad (rows not listed must keep their values: compared as part of the table) */
    float *rt = copy_of(table, nt), *ra = copy_of(acc, nrows);
    CPU->rowwise_adagrad(&cctx, rt, ra, rows, grads, U, E, 0.05f, 1e-8f);
    float *gt[2], *ga[2];
    for (int run = 0; run < 2; run++) {
        void *dt = dev_up(table, nt, 0), *da = dev_up(acc, nrows, 0);
        gpu(run)->rowwise_adagrad(&gctx, dt, da, drows, dg, U, E, 0.05f, 1e-8f); /* both tables' entry */
        gt[run] = dev_get(dt, nt, 0), ga[run] = dev_get(da, nrows, 0);
        dev_free(dt), dev_free(da);
    }
    snprintf(what, sizeof what, "rowwise_adagrad E=%d table", E);
    expect_close(what, 0, gt[0], rt, nt);
    snprintf(what, sizeof what, "rowwise_adagrad E=%d acc", E);
    expect_close(what, 0, ga[0], ra, nrows);
    expect_same("rowwise_adagrad table", gt[0], gt[1], nt);
    expect_same("rowwise_adagrad acc", ga[0], ga[1], nrows);
    /* sparse adam: FMA-free with sparse.c's scalars, so the CPU's bits */
    float *rm = copy_of(m, nt), *rv = copy_of(v, nt), *rt2 = copy_of(table, nt);
    CPU->sparse_adam(&cctx, rt2, rm, rv, rows, grads, U, E, 1e-2f, 0.9f, 0.999f, 1e-8f, 5);
    void *dt = dev_up(table, nt, 0), *dm = dev_up(m, nt, 0), *dv = dev_up(v, nt, 0);
    gpu(1)->sparse_adam(&gctx, dt, dm, dv, drows, dg, U, E, 1e-2f, 0.9f, 0.999f, 1e-8f, 5);
    float *gt2 = dev_get(dt, nt, 0), *gm = dev_get(dm, nt, 0), *gv = dev_get(dv, nt, 0);
    snprintf(what, sizeof what, "sparse_adam E=%d table", E);
    expect_close(what, 0, gt2, rt2, nt);
    expect_same("sparse_adam table vs CPU (bitwise)", gt2, rt2, nt);
    expect_same("sparse_adam m vs CPU (bitwise)", gm, rm, nt);
    expect_same("sparse_adam v vs CPU (bitwise)", gv, rv, nt);
    dev_free(dt), dev_free(dm), dev_free(dv), dev_free(drows), dev_free(dg);
    free(rows), free(table), free(grads), free(acc), free(m), free(v), free(rt), free(ra), free(rm), free(rv);
    free(rt2), free(gt2), free(gm), free(gv);
    for (int run = 0; run < 2; run++) free(gt[run]), free(ga[run]);
}

TEST_CASE(test_sparse_optim) {
    check_sparse_optim(12);
    check_sparse_optim(64);
}

/* ---- DCNv2 cross ---- */

typedef struct {
    float *dx0, *dx, *dU, *dV, *db;
} cross_grads;

/* Runs the GPU backward on copies of g (NULL members skipped) and downloads the results into g. */
static void gpu_cross_bwd(int bf, cross_grads *g, const float *dc, const float *x0, const float *x, const float *Uw,
                          const float *Vw, const float *b, const float *vx, int N, int D, int r) {
    size_t nd = (size_t)N * D, nw = (size_t)D * r;
    void *ddc = dev_up(dc, nd, bf), *dx0_ = dev_up(x0, nd, bf), *dx_ = dev_up(x, nd, bf), *dU_ = dev_up(Uw, nw, bf);
    void *dV_ = dev_up(Vw, nw, bf), *db_ = dev_up(b, D, bf), *dvx = dev_up(vx, (size_t)N * r, bf);
    void *gx0 = g->dx0 ? dev_up(g->dx0, nd, bf) : NULL, *gx = g->dx ? dev_up(g->dx, nd, bf) : NULL;
    void *gU = g->dU ? dev_up(g->dU, nw, 0) : NULL, *gV = g->dV ? dev_up(g->dV, nw, 0) : NULL;
    void *gb = g->db ? dev_up(g->db, D, 0) : NULL;
    gpu(bf)->cross_bwd(&gctx, gx0, gx, gU, gV, gb, ddc, dx0_, dx_, dU_, dV_, db_, dvx, N, D, r);
    if (gx0) dev_down(g->dx0, gx0, nd, bf);
    if (gx) dev_down(g->dx, gx, nd, bf);
    if (gU) dev_down(g->dU, gU, nw, 0);
    if (gV) dev_down(g->dV, gV, nw, 0);
    if (gb) dev_down(g->db, gb, D, 0);
    dev_free(ddc), dev_free(dx0_), dev_free(dx_), dev_free(dU_), dev_free(dV_), dev_free(db_), dev_free(dvx);
    dev_free(gx0), dev_free(gx), dev_free(gU), dev_free(gV), dev_free(gb);
}

static void check_cross(int N, int D, int r) {
    size_t nd = (size_t)N * D, nw = (size_t)D * r, nv = (size_t)N * r;
    char what[96];
    for (int bf = 0; bf <= 1; bf++) {
        float *x0 = randn_bf(nd, 0, 1, bf), *x = randn_bf(nd, 0, 1, bf), *b = randn_bf(D, 0, 0.3f, bf);
        float *Uw = randn_bf(nw, 0, 1.0f / sqrtf((float)r), bf), *Vw = randn_bf(nw, 0, 1.0f / sqrtf((float)D), bf);
        float *rc = zeros(nd), *rvx = zeros(nv);
        CPU->cross_fwd(&cctx, rc, rvx, x0, x, Uw, Vw, b, N, D, r);
        float *gc[2], *gvx[2];
        for (int run = 0; run < 2; run++) {
            void *dc = dev_nan(nd, bf), *dvx = dev_nan(nv, bf), *dx0 = dev_up(x0, nd, bf), *dx = dev_up(x, nd, bf);
            void *dU = dev_up(Uw, nw, bf), *dV = dev_up(Vw, nw, bf), *db = dev_up(b, D, bf);
            gpu(bf)->cross_fwd(&gctx, dc, dvx, dx0, dx, dU, dV, db, N, D, r);
            gc[run] = dev_get(dc, nd, bf), gvx[run] = dev_get(dvx, nv, bf);
            dev_free(dc), dev_free(dvx), dev_free(dx0), dev_free(dx), dev_free(dU), dev_free(dV), dev_free(db);
        }
        snprintf(what, sizeof what, "cross fwd c (N=%d D=%d r=%d)", N, D, r);
        expect_close(what, bf, gc[0], rc, nd);
        expect_close("cross fwd vx", bf, gvx[0], rvx, nv);
        expect_same("cross fwd c", gc[0], gc[1], nd);
        expect_same("cross fwd vx", gvx[0], gvx[1], nv);

        /* backward from the CPU's vx (rounded like the GPU's in bf16 mode) */
        round_bf(rvx, nv, bf);
        float *dcg = randn_bf(nd, 0, 1, bf);
        cross_grads z = {zeros(nd), zeros(nd), zeros(nw), zeros(nw), zeros(D)};
        CPU->cross_bwd(&cctx, z.dx0, z.dx, z.dU, z.dV, z.db, dcg, x0, x, Uw, Vw, b, rvx, N, D, r);
        cross_grads init = {grad_init(z.dx0, nd, bf), grad_init(z.dx, nd, bf), grad_init(z.dU, nw, 0),
                            grad_init(z.dV, nw, 0), grad_init(z.db, D, 0)};
        cross_grads ref = {copy_of(init.dx0, nd), copy_of(init.dx, nd), copy_of(init.dU, nw), copy_of(init.dV, nw),
                           copy_of(init.db, D)};
        CPU->cross_bwd(&cctx, ref.dx0, ref.dx, ref.dU, ref.dV, ref.db, dcg, x0, x, Uw, Vw, b, rvx, N, D, r);
        cross_grads g[2];
        for (int run = 0; run < 2; run++) {
            g[run] = (cross_grads){copy_of(init.dx0, nd), copy_of(init.dx, nd), copy_of(init.dU, nw),
                                   copy_of(init.dV, nw), copy_of(init.db, D)};
            gpu_cross_bwd(bf, &g[run], dcg, x0, x, Uw, Vw, b, rvx, N, D, r);
        }
        expect_grad("cross bwd dx0", bf, g[0].dx0, ref.dx0, init.dx0, nd);
        expect_grad("cross bwd dx", bf, g[0].dx, ref.dx, init.dx, nd);
        expect_grad("cross bwd dU", bf, g[0].dU, ref.dU, init.dU, nw);
        expect_grad("cross bwd dV", bf, g[0].dV, ref.dV, init.dV, nw);
        expect_grad("cross bwd db", bf, g[0].db, ref.db, init.db, D);
        expect_same("cross bwd dx0", g[0].dx0, g[1].dx0, nd);
        expect_same("cross bwd dx", g[0].dx, g[1].dx, nd);
        expect_same("cross bwd dU", g[0].dU, g[1].dU, nw);
        expect_same("cross bwd dV", g[0].dV, g[1].dV, nw);
        expect_same("cross bwd db", g[0].db, g[1].db, D);
        /* NULL gradients: the parameter ones alone, dx0 alone, dx alone: the same bits */
        cross_grads p = {NULL, NULL, copy_of(init.dU, nw), copy_of(init.dV, nw), copy_of(init.db, D)};
        gpu_cross_bwd(bf, &p, dcg, x0, x, Uw, Vw, b, rvx, N, D, r);
        expect_same("cross bwd dU (dx0, dx NULL)", p.dU, g[0].dU, nw);
        expect_same("cross bwd dV (dx0, dx NULL)", p.dV, g[0].dV, nw);
        expect_same("cross bwd db (dx0, dx NULL)", p.db, g[0].db, D);
        cross_grads a0 = {copy_of(init.dx0, nd), NULL, NULL, NULL, NULL};
        gpu_cross_bwd(bf, &a0, dcg, x0, x, Uw, Vw, b, rvx, N, D, r);
        expect_same("cross bwd dx0 (others NULL)", a0.dx0, g[0].dx0, nd);
        cross_grads a1 = {NULL, copy_of(init.dx, nd), NULL, NULL, NULL};
        gpu_cross_bwd(bf, &a1, dcg, x0, x, Uw, Vw, b, rvx, N, D, r);
        expect_same("cross bwd dx (others NULL)", a1.dx, g[0].dx, nd);
        cross_grads *all[] = {&z, &init, &ref, &g[0], &g[1], &p, &a0, &a1};
        for (size_t k = 0; k < sizeof all / sizeof all[0]; k++)
            free(all[k]->dx0), free(all[k]->dx), free(all[k]->dU), free(all[k]->dV), free(all[k]->db);
        free(x0), free(x), free(b), free(Uw), free(Vw), free(rc), free(rvx), free(dcg);
        for (int run = 0; run < 2; run++) free(gc[run]), free(gvx[run]);
    }
}

TEST_CASE(test_cross) {
    check_cross(101, 29 * 12, 20);   /* E = 12: D = 348 */
    check_cross(300, 29 * 64, 256); /* the target's D and rank */
}

/* ---- ReLU ---- */

TEST_CASE(test_relu) {
    size_t n = 100003;
    for (int bf = 0; bf <= 1; bf++) {
        float *inp = randn_bf(n, 0, 1, bf), *dout = randn_bf(n, 0, 1, bf), *rout = zeros(n);
        CPU->relu_fwd(&cctx, rout, inp, n);
        float *init = randn_bf(n, 0, 1, bf), *rg = copy_of(init, n);
        CPU->relu_bwd(&cctx, rg, inp, dout, n);
        float *out[2], *g[2], *inpl = NULL;
        for (int run = 0; run < 2; run++) {
            void *di = dev_up(inp, n, bf), *ddo = dev_up(dout, n, bf), *dout_ = dev_nan(n, bf);
            void *gd = dev_up(init, n, bf);
            gpu(bf)->relu_fwd(&gctx, dout_, di, n);
            gpu(bf)->relu_bwd(&gctx, gd, di, ddo, n);
            out[run] = dev_get(dout_, n, bf), g[run] = dev_get(gd, n, bf);
            if (run == 0) { /* in place */
                gpu(bf)->relu_fwd(&gctx, di, di, n);
                inpl = dev_get(di, n, bf);
            }
            dev_free(di), dev_free(ddo), dev_free(dout_), dev_free(gd);
        }
        expect_close("relu fwd", bf, out[0], rout, n);
        expect_grad("relu bwd", bf, g[0], rg, init, n);
        /* one fp32 max or add, then one rounding: the CPU's bits */
        round_bf(rg, n, bf);
        expect_same("relu fwd vs CPU", out[0], rout, n);
        expect_same("relu bwd vs CPU (rounded)", g[0], rg, n);
        expect_same("relu fwd in place", inpl, out[0], n);
        expect_same("relu fwd", out[0], out[1], n);
        expect_same("relu bwd", g[0], g[1], n);
        free(inp), free(dout), free(rout), free(init), free(rg), free(inpl);
        for (int run = 0; run < 2; run++) free(out[run]), free(g[run]);
    }
}

/* ---- one-output linear ---- */

static void gpu_linear1_bwd(int bf, float *dx, float *dw, float *db, const float *dz, const float *x, const float *w,
                            int N, int D) {
    size_t nx = (size_t)N * D;
    void *ddz = dev_up(dz, N, 0), *dx_ = dev_up(x, nx, bf), *dw_ = dev_up(w, D, bf);
    void *gx = dx ? dev_up(dx, nx, bf) : NULL, *gw = dw ? dev_up(dw, D, 0) : NULL, *gb = db ? dev_up(db, 1, 0) : NULL;
    gpu(bf)->linear1_bwd(&gctx, gx, gw, gb, ddz, dx_, dw_, N, D);
    if (gx) dev_down(dx, gx, nx, bf);
    if (gw) dev_down(dw, gw, D, 0);
    if (gb) dev_down(db, gb, 1, 0);
    dev_free(ddz), dev_free(dx_), dev_free(dw_), dev_free(gx), dev_free(gw), dev_free(gb);
}

static void check_linear1(int N, int D) {
    size_t nx = (size_t)N * D;
    char what[96];
    for (int bf = 0; bf <= 1; bf++) {
        float *x = randn_bf(nx, 0, 1, bf), *w = randn_bf(D, 0, 0.2f, bf), *b = randn_bf(1, 0, 1, bf);
        float *rz = zeros(N), *gz[2];
        CPU->linear1_fwd(&cctx, rz, x, w, b, N, D);
        for (int run = 0; run < 2; run++) {
            void *dx = dev_up(x, nx, bf), *dw = dev_up(w, D, bf), *db = dev_up(b, 1, bf), *dz = dev_nan(N, 0);
            gpu(bf)->linear1_fwd(&gctx, dz, dx, dw, db, N, D);
            gz[run] = dev_get(dz, N, 0);
            dev_free(dx), dev_free(dw), dev_free(db), dev_free(dz);
        }
        snprintf(what, sizeof what, "linear1 fwd z (N=%d D=%d)", N, D);
        expect_close(what, bf, gz[0], rz, N);
        expect_same("linear1 fwd", gz[0], gz[1], N);

        float *dz = randn(N, 0, 1), *z0x = zeros(nx), *z0w = zeros(D), z0b = 0;
        CPU->linear1_bwd(&cctx, z0x, z0w, &z0b, dz, x, w, N, D);
        float *ix = grad_init(z0x, nx, bf), *iw = grad_init(z0w, D, 0), *ib = grad_init(&z0b, 1, 0);
        float *rx = copy_of(ix, nx), *rw = copy_of(iw, D), *rb = copy_of(ib, 1);
        CPU->linear1_bwd(&cctx, rx, rw, rb, dz, x, w, N, D);
        float *gx[2], *gw[2], *gb[2];
        for (int run = 0; run < 2; run++) {
            gx[run] = copy_of(ix, nx), gw[run] = copy_of(iw, D), gb[run] = copy_of(ib, 1);
            gpu_linear1_bwd(bf, gx[run], gw[run], gb[run], dz, x, w, N, D);
        }
        expect_grad("linear1 bwd dx", bf, gx[0], rx, ix, nx);
        expect_grad("linear1 bwd dw", bf, gw[0], rw, iw, D);
        expect_grad("linear1 bwd db", bf, gb[0], rb, ib, 1);
        expect_same("linear1 bwd dx", gx[0], gx[1], nx);
        expect_same("linear1 bwd dw", gw[0], gw[1], D);
        expect_same("linear1 bwd db", gb[0], gb[1], 1);
        float *ox = copy_of(ix, nx), *ow = copy_of(iw, D), *ob = copy_of(ib, 1);
        gpu_linear1_bwd(bf, ox, NULL, NULL, dz, x, w, N, D);
        gpu_linear1_bwd(bf, NULL, ow, NULL, dz, x, w, N, D);
        gpu_linear1_bwd(bf, NULL, NULL, ob, dz, x, w, N, D);
        expect_same("linear1 bwd dx (dw, db NULL)", ox, gx[0], nx);
        expect_same("linear1 bwd dw (dx, db NULL)", ow, gw[0], D);
        expect_same("linear1 bwd db (dx, dw NULL)", ob, gb[0], 1);
        free(x), free(w), free(b), free(rz), free(dz), free(z0x), free(z0w), free(ix), free(iw), free(ib);
        free(rx), free(rw), free(rb), free(ox), free(ow), free(ob);
        for (int run = 0; run < 2; run++) free(gz[run]), free(gx[run]), free(gw[run]), free(gb[run]);
    }
}

TEST_CASE(test_linear1) {
    check_linear1(301, 29 * 12); /* vector loads */
    check_linear1(301, 77);      /* scalar loads */
    check_linear1(1029, 29 * 64);
}

/* ---- BCE with logits (fp32 logits and labels in both modes) ---- */

static void gpu_bce(int bf, float *dz, double *loss, const float *z, const float *y, int N, float scale) {
    void *dzz = dev_up(z, N, 0), *dy = dev_up(y, N, 0), *gdz = dz ? dev_up(dz, N, 0) : NULL;
    double *dl = loss ? dev_raw(loss, sizeof(double)) : NULL;
    gpu(bf)->bce(&gctx, gdz, dl, dzz, dy, N, scale);
    if (gdz) dev_down(dz, gdz, N, 0);
    if (dl) CUDA_CHECK(cudaMemcpy(loss, dl, sizeof(double), cudaMemcpyDeviceToHost));
    dev_free(dzz), dev_free(dy), dev_free(gdz), dev_free(dl);
}

static void check_bce(int N) {
    float *z = randn(N, 0, 3), *y = zeros(N), scale = 1.0f / (float)N;
    uint64_t s = next_stream++;
    for (int i = 0; i < N; i++) {
        uint32_t u = rand_u32(s, (uint64_t)i);
        y[i] = u % 5 == 0 ? 0.3f : (float)(u & 1);
        if (i % 97 == 5) z[i] = i % 2 ? 40.0f : -40.0f; /* saturated logits */
    }
    float *init = randn(N, 0, 1.0f / (float)N), *rdz = copy_of(init, N);
    double rl = 0.75;
    CPU->bce(&cctx, rdz, &rl, z, y, N, scale);
    char what[96];
    snprintf(what, sizeof what, "bce dz (N=%d)", N);
    for (int bf = 0; bf <= 1; bf++) {
        float *g[2];
        double gl[2];
        for (int run = 0; run < 2; run++) {
            g[run] = copy_of(init, N), gl[run] = 0.75;
            gpu_bce(bf, g[run], &gl[run], z, y, N, scale);
        }
        expect_grad(what, 0, g[0], rdz, init, N);
        double le = fabs(gl[0] - rl) / fabs(rl);
        printf("    %-46s %-4s rel err %.2e\n", "bce loss (double)", MODE[bf], le);
        CHECK(le <= 1e-12, "bce loss %.17g vs CPU %.17g", gl[0], rl);
        expect_same("bce dz", g[0], g[1], N);
        CHECK(gl[0] == gl[1], "bce loss differs between runs");
        float *g2 = copy_of(init, N);
        double l2 = 0.75;
        gpu_bce(bf, g2, NULL, z, y, N, scale);
        gpu_bce(bf, NULL, &l2, z, y, N, scale);
        expect_same("bce dz (loss NULL)", g2, g[0], N);
        CHECK(l2 == gl[0], "bce loss with dz NULL differs");
        free(g2), free(g[0]), free(g[1]);
    }
    free(z), free(y), free(init), free(rdz);
}

TEST_CASE(test_bce) {
    check_bce(4099);
    check_bce(5);
}

/* ---- column slices ---- */

static void check_cols(int rows, int cols, int ld_dst, int ld_src) {
    size_t nd = (size_t)rows * ld_dst, ns = (size_t)rows * ld_src;
    char what[96];
    for (int bf = 0; bf <= 1; bf++)
        for (int add = 0; add <= 1; add++) {
            float *src = randn_bf(ns, 0, 1, bf), *init = randn_bf(nd, 0, 1, bf), *ref = copy_of(init, nd);
            (add ? CPU->add_cols : CPU->copy_cols)(&cctx, ref, ld_dst, src, ld_src, rows, cols);
            round_bf(ref, nd, bf); /* one fp32 add, one rounding: the same bits */
            float *got[2];
            for (int run = 0; run < 2; run++) {
                void *dd = dev_up(init, nd, bf), *ds = dev_up(src, ns, bf);
                (add ? gpu(bf)->add_cols : gpu(bf)->copy_cols)(&gctx, dd, ld_dst, ds, ld_src, rows, cols);
                got[run] = dev_get(dd, nd, bf);
                dev_free(dd), dev_free(ds);
            }
            snprintf(what, sizeof what, "%s %dx%d (ld %d <- %d)", add ? "add_cols" : "copy_cols", rows, cols, ld_dst,
                     ld_src);
            expect_close(what, bf, got[0], ref, nd);
            expect_same(what, got[0], ref, nd);
            expect_same(what, got[0], got[1], nd);
            free(src), free(init), free(ref), free(got[0]), free(got[1]);
        }
}

TEST_CASE(test_cols) {
    check_cols(77, 12, 29 * 12, 12);
    check_cols(77, 13, 29, 15);
    check_cols(5, 64, 29 * 64, 3 * 64);
}

/* ---- self-attention over packed histories ---- */

static void check_seqattn(int B, int max_len, int H, int E) {
    int nh = 0;
    int32_t *off = make_offsets(B, max_len, &nh);
    size_t nq = (size_t)nh * 3 * E, no = (size_t)nh * E, nl = (size_t)nh * H;
    void *doff = dev_raw(off, ((size_t)B + 1) * 4);
    char what[128];
    for (int bf = 0; bf <= 1; bf++) {
        float *qkv = randn_bf(nq, 0, 1.5f, bf), *dout = randn_bf(no, 0, 1, bf);
        float *rout = zeros(no), *rlse = zeros(nl);
        CPU->seqattn_fwd(&cctx, rout, rlse, qkv, off, B, max_len, H, E);
        float *out[2], *lse[2];
        for (int run = 0; run < 2; run++) {
            void *dq = dev_up(qkv, nq, bf), *dout_ = dev_nan(no, bf), *dl = dev_nan(nl, 0);
            gpu(bf)->seqattn_fwd(&gctx, dout_, dl, dq, doff, B, max_len, H, E);
            out[run] = dev_get(dout_, no, bf), lse[run] = dev_get(dl, nl, 0);
            dev_free(dq), dev_free(dout_), dev_free(dl);
        }
        snprintf(what, sizeof what, "seqattn fwd out (B=%d max_len=%d H=%d E=%d nh=%d)", B, max_len, H, E, nh);
        expect_close(what, bf, out[0], rout, no);
        expect_close("seqattn fwd lse", bf, lse[0], rlse, nl);
        expect_same("seqattn fwd out", out[0], out[1], no);
        expect_same("seqattn fwd lse", lse[0], lse[1], nl);

        /* backward from the CPU's out (rounded like the GPU's in bf16 mode) and lse */
        round_bf(rout, no, bf);
        float *g0 = zeros(nq);
        CPU->seqattn_bwd(&cctx, g0, dout, qkv, rout, rlse, off, B, max_len, H, E);
        float *init = grad_init(g0, nq, bf), *rg = copy_of(init, nq), *g[2];
        CPU->seqattn_bwd(&cctx, rg, dout, qkv, rout, rlse, off, B, max_len, H, E);
        for (int run = 0; run < 2; run++) {
            void *dq = dev_up(qkv, nq, bf), *ddo = dev_up(dout, no, bf), *dout_ = dev_up(rout, no, bf);
            void *dl = dev_up(rlse, nl, 0), *gd = dev_up(init, nq, bf);
            gpu(bf)->seqattn_bwd(&gctx, gd, ddo, dq, dout_, dl, doff, B, max_len, H, E);
            g[run] = dev_get(gd, nq, bf);
            dev_free(dq), dev_free(ddo), dev_free(dout_), dev_free(dl), dev_free(gd);
        }
        snprintf(what, sizeof what, "seqattn bwd dqkv (HS=%d)", E / H);
        expect_grad(what, bf, g[0], rg, init, nq);
        expect_same("seqattn bwd dqkv", g[0], g[1], nq);
        free(qkv), free(dout), free(rout), free(rlse), free(g0), free(init), free(rg);
        for (int run = 0; run < 2; run++) free(out[run]), free(lse[run]), free(g[run]);
    }
    dev_free(doff);
    free(off);
}

TEST_CASE(test_seqattn) {
    check_seqattn(61, 37, 4, 12);  /* head size 3 */
    check_seqattn(40, 256, 4, 64); /* the target's heads; histories past one 128-row tile */
    check_seqattn(23, 100, 2, 40); /* head size 20, padded to 32 */
}

/* ---- target attention ---- */

typedef struct {
    float *dq, *dkv; /* dkv: dk and dv (fused rows of 2E) or dk then dv (separate, nh * E each) */
} ta_grads;

/* k and v views of a kv buffer: fused rows [k | v] of 2E, or k then v as two [nh, E] blocks. */
static size_t ta_voff(int fused, int nh, int E) { return fused ? (size_t)E : (size_t)nh * E; }

static void gpu_ta_bwd(int bf, ta_grads *g, int want_kv, const float *dp, const float *q, const float *kv,
                       const float *attn, const int32_t *doff, int B, int max_len, int E, int nh, int fused) {
    size_t nkv = (size_t)nh * 2 * E, vo = ta_voff(fused, nh, E);
    int ld = fused ? 2 * E : E;
    void *ddp = dev_up(dp, (size_t)B * E, bf), *dq_ = dev_up(q, (size_t)B * E, bf), *dkv_ = dev_up(kv, nkv, bf);
    void *da = dev_up(attn, nh, 0);
    void *gq = g->dq ? dev_up(g->dq, (size_t)B * E, bf) : NULL, *gkv = want_kv ? dev_up(g->dkv, nkv, bf) : NULL;
    gpu(bf)->targetattn_bwd(&gctx, gq, gkv, dev_at(gkv, vo, bf), ddp, dq_, dkv_, dev_at(dkv_, vo, bf), da, doff, B,
                            max_len, E, ld);
    if (gq) dev_down(g->dq, gq, (size_t)B * E, bf);
    if (gkv) dev_down(g->dkv, gkv, nkv, bf);
    dev_free(ddp), dev_free(dq_), dev_free(dkv_), dev_free(da), dev_free(gq), dev_free(gkv);
}

static void check_targetattn(int B, int max_len, int E, int fused) {
    int nh = 0;
    int32_t *off = make_offsets(B, max_len, &nh);
    size_t nq = (size_t)B * E, nkv = (size_t)nh * 2 * E, vo = ta_voff(fused, nh, E);
    int ld = fused ? 2 * E : E;
    void *doff = dev_raw(off, ((size_t)B + 1) * 4);
    char what[128];
    for (int bf = 0; bf <= 1; bf++) {
        float *q = randn_bf(nq, 0, 2, bf), *kv = randn_bf(nkv, 0, 1, bf), *dp = randn_bf(nq, 0, 1, bf);
        float *rp = zeros(nq), *ra = zeros(nh ? nh : 1);
        CPU->targetattn_fwd(&cctx, rp, ra, q, kv, kv + vo, off, B, max_len, E, ld);
        float *gp[2], *ga[2];
        for (int run = 0; run < 2; run++) {
            void *dq = dev_up(q, nq, bf), *dkv = dev_up(kv, nkv, bf), *dpo = dev_nan(nq, bf), *da = dev_nan(nh, 0);
            gpu(bf)->targetattn_fwd(&gctx, dpo, da, dq, dkv, dev_at(dkv, vo, bf), doff, B, max_len, E, ld);
            gp[run] = dev_get(dpo, nq, bf), ga[run] = dev_get(da, nh, 0);
            dev_free(dq), dev_free(dkv), dev_free(dpo), dev_free(da);
        }
        snprintf(what, sizeof what, "targetattn fwd pooled (B=%d max_len=%d E=%d %s)", B, max_len, E,
                 fused ? "k|v fused" : "k, v apart");
        expect_close(what, bf, gp[0], rp, nq);
        expect_close("targetattn fwd attn", bf, ga[0], ra, nh);
        expect_same("targetattn fwd pooled", gp[0], gp[1], nq);
        expect_same("targetattn fwd attn", ga[0], ga[1], nh);

        /* backward from the CPU's attn (fp32 in both modes) */
        ta_grads z = {zeros(nq), zeros(nkv)};
        CPU->targetattn_bwd(&cctx, z.dq, z.dkv, z.dkv + vo, dp, q, kv, kv + vo, ra, off, B, max_len, E, ld);
        ta_grads init = {grad_init(z.dq, nq, bf), grad_init(z.dkv, nkv, bf)};
        ta_grads ref = {copy_of(init.dq, nq), copy_of(init.dkv, nkv)};
        CPU->targetattn_bwd(&cctx, ref.dq, ref.dkv, ref.dkv + vo, dp, q, kv, kv + vo, ra, off, B, max_len, E, ld);
        ta_grads g[2];
        for (int run = 0; run < 2; run++) {
            g[run] = (ta_grads){copy_of(init.dq, nq), copy_of(init.dkv, nkv)};
            gpu_ta_bwd(bf, &g[run], 1, dp, q, kv, ra, doff, B, max_len, E, nh, fused);
        }
        expect_grad("targetattn bwd dq", bf, g[0].dq, ref.dq, init.dq, nq);
        expect_grad("targetattn bwd dk, dv", bf, g[0].dkv, ref.dkv, init.dkv, nkv);
        expect_same("targetattn bwd dq", g[0].dq, g[1].dq, nq);
        expect_same("targetattn bwd dk, dv", g[0].dkv, g[1].dkv, nkv);
        ta_grads a = {copy_of(init.dq, nq), NULL}, b = {NULL, copy_of(init.dkv, nkv)};
        gpu_ta_bwd(bf, &a, 0, dp, q, kv, ra, doff, B, max_len, E, nh, fused);
        gpu_ta_bwd(bf, &b, 1, dp, q, kv, ra, doff, B, max_len, E, nh, fused);
        expect_same("targetattn bwd dq (dk, dv NULL)", a.dq, g[0].dq, nq);
        expect_same("targetattn bwd dk, dv (dq NULL)", b.dkv, g[0].dkv, nkv);
        ta_grads *all[] = {&z, &init, &ref, &g[0], &g[1], &a, &b};
        for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) free(all[k]->dq), free(all[k]->dkv);
        free(q), free(kv), free(dp), free(rp), free(ra);
        for (int run = 0; run < 2; run++) free(gp[run]), free(ga[run]);
    }
    dev_free(doff);
    free(off);
}

TEST_CASE(test_targetattn) {
    check_targetattn(61, 37, 12, 0);
    check_targetattn(45, 300, 64, 1); /* histories past one 256-key chunk */
}

int main(void) {
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        printf("skip: no CUDA device (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return 77;
    }
    struct cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s (sm_%d%d), %d SMs\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
    CUDA_CHECK(cudaStreamCreate(&st));
    gctx.stream = st;
    double t0 = nb_now();
    RUN(test_emb_gather);
    RUN(test_emb_grad_unique);
    RUN(test_sparse_optim);
    RUN(test_cross);
    RUN(test_relu);
    RUN(test_linear1);
    RUN(test_bce);
    RUN(test_cols);
    RUN(test_seqattn);
    RUN(test_targetattn);
    CUDA_CHECK(cudaStreamDestroy(st));
    printf("largest relative error: f32 %.2e (tol %.0e), bf16 %.2e (tol %.0e); %.1f s\n", worst[0], TOL[0], worst[1],
           TOL[1], nb_now() - t0);
    TEST_EXIT();
}
#endif
