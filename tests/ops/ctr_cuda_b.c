/* The CUDA seqctr tables against the CPU table, continued (see ctr_cuda.c): the dense entries
 * (DCNv2 cross, ReLU, the one-output linear, BCE, column slices) and the attentions over packed
 * histories (self-attention, its tensor-core kernels, target attention). */
#include "optest.h"

#ifdef NB_WITH_CUDA
#include "ctr_cuda.h"

/* ---- DCNv2 cross ---- */

typedef struct {
    float *dx0, *dx, *dU, *dV, *db;
} cross_grads;

/* Runs the GPU backward on copies of g (NULL members skipped) and downloads the results into g;
 * u: the forward's kept U vx + b (NULL: the backward makes it from vx). */
static void gpu_cross_bwd(int bf, cross_grads *g, const float *dc, const float *x0, const float *x, const float *Uw,
                          const float *Vw, const float *b, const float *vx, const float *u, int N, int D, int r) {
    size_t nd = (size_t)N * D, nw = (size_t)D * r;
    void *ddc = dev_up(dc, nd, bf), *dx0_ = dev_up(x0, nd, bf), *dx_ = dev_up(x, nd, bf), *dU_ = dev_up(Uw, nw, bf);
    void *dV_ = dev_up(Vw, nw, bf), *db_ = dev_up(b, D, bf), *dvx = dev_up(vx, (size_t)N * r, bf);
    void *du_ = u ? dev_up(u, nd, bf) : NULL;
    void *gx0 = g->dx0 ? dev_up(g->dx0, nd, bf) : NULL, *gx = g->dx ? dev_up(g->dx, nd, bf) : NULL;
    void *gU = g->dU ? dev_up(g->dU, nw, 0) : NULL, *gV = g->dV ? dev_up(g->dV, nw, 0) : NULL;
    void *gb = g->db ? dev_up(g->db, D, 0) : NULL;
    gpu(bf)->cross_bwd(&ot_gctx, gx0, gx, gU, gV, gb, ddc, dx0_, dx_, dU_, dV_, db_, dvx, du_, N, D, r);
    if (gx0) dev_down(g->dx0, gx0, nd, bf);
    if (gx) dev_down(g->dx, gx, nd, bf);
    if (gU) dev_down(g->dU, gU, nw, 0);
    if (gV) dev_down(g->dV, gV, nw, 0);
    if (gb) dev_down(g->db, gb, D, 0);
    dev_free(ddc), dev_free(dx0_), dev_free(dx_), dev_free(dU_), dev_free(dV_), dev_free(db_), dev_free(dvx);
    dev_free(du_), dev_free(gx0), dev_free(gx), dev_free(gU), dev_free(gV), dev_free(gb);
}

static void check_cross(int N, int D, int r) {
    size_t nd = (size_t)N * D, nw = (size_t)D * r, nv = (size_t)N * r;
    char what[96];
    FOR_DTYPE(bf) {
        float *x0 = randn_bf(nd, 0, 1, bf), *x = randn_bf(nd, 0, 1, bf), *b = randn_bf(D, 0, 0.3f, bf);
        float *Uw = randn_bf(nw, 0, 1.0f / sqrtf((float)r), bf), *Vw = randn_bf(nw, 0, 1.0f / sqrtf((float)D), bf);
        float *rc = zeros(nd), *rvx = zeros(nv);
        CPU->cross_fwd(&ot_cctx, rc, rvx, NULL, x0, x, Uw, Vw, b, N, D, r);
        /* run 1 keeps u, run 0 does not: the same c and vx */
        float *gc[2], *gvx[2], *gu = NULL;
        for (int run = 0; run < 2; run++) {
            void *dc = dev_nan(nd, bf), *dvx = dev_nan(nv, bf), *dx0 = dev_up(x0, nd, bf), *dx = dev_up(x, nd, bf);
            void *dU = dev_up(Uw, nw, bf), *dV = dev_up(Vw, nw, bf), *db = dev_up(b, D, bf);
            void *du = run ? dev_nan(nd, bf) : NULL;
            gpu(bf)->cross_fwd(&ot_gctx, dc, dvx, du, dx0, dx, dU, dV, db, N, D, r);
            gc[run] = dev_get(dc, nd, bf), gvx[run] = dev_get(dvx, nv, bf);
            if (du) gu = dev_get(du, nd, bf);
            dev_free(dc), dev_free(dvx), dev_free(dx0), dev_free(dx), dev_free(dU), dev_free(dV), dev_free(db), dev_free(du);
        }
        snprintf(what, sizeof what, "cross fwd c (N=%d D=%d r=%d)", N, D, r);
        expect_close(what, bf, gc[0], rc, nd);
        expect_close("cross fwd vx", bf, gvx[0], rvx, nv);
        expect_same("cross fwd c (u kept or not)", gc[0], gc[1], nd);
        expect_same("cross fwd vx (u kept or not)", gvx[0], gvx[1], nv);
        {   /* the backward from the forward's vx: its kept u or u made again, the same bits */
            float *dcr = randn_bf(nd, 0, 1, bf);
            cross_grads k = {zeros(nd), zeros(nd), zeros(nw), zeros(nw), zeros(D)};
            cross_grads m = {zeros(nd), zeros(nd), zeros(nw), zeros(nw), zeros(D)};
            gpu_cross_bwd(bf, &k, dcr, x0, x, Uw, Vw, b, gvx[1], gu, N, D, r);
            gpu_cross_bwd(bf, &m, dcr, x0, x, Uw, Vw, b, gvx[1], NULL, N, D, r);
            expect_same("cross bwd dx0 (u kept / made again)", k.dx0, m.dx0, nd);
            expect_same("cross bwd dx (u kept / made again)", k.dx, m.dx, nd);
            expect_same("cross bwd dU (u kept / made again)", k.dU, m.dU, nw);
            expect_same("cross bwd dV (u kept / made again)", k.dV, m.dV, nw);
            expect_same("cross bwd db (u kept / made again)", k.db, m.db, D);
            cross_grads *km[] = {&k, &m};
            for (int q = 0; q < 2; q++) free(km[q]->dx0), free(km[q]->dx), free(km[q]->dU), free(km[q]->dV), free(km[q]->db);
            free(dcr), free(gu);
        }

        /* backward from the CPU's vx (rounded like the GPU's in bf16 mode) */
        round_bf(rvx, nv, bf);
        float *dcg = randn_bf(nd, 0, 1, bf);
        cross_grads z = {zeros(nd), zeros(nd), zeros(nw), zeros(nw), zeros(D)};
        CPU->cross_bwd(&ot_cctx, z.dx0, z.dx, z.dU, z.dV, z.db, dcg, x0, x, Uw, Vw, b, rvx, NULL, N, D, r);
        cross_grads init = {grad_init(z.dx0, nd, bf), grad_init(z.dx, nd, bf), grad_init(z.dU, nw, 0),
                            grad_init(z.dV, nw, 0), grad_init(z.db, D, 0)};
        cross_grads ref = {copy_of(init.dx0, nd), copy_of(init.dx, nd), copy_of(init.dU, nw), copy_of(init.dV, nw),
                           copy_of(init.db, D)};
        CPU->cross_bwd(&ot_cctx, ref.dx0, ref.dx, ref.dU, ref.dV, ref.db, dcg, x0, x, Uw, Vw, b, rvx, NULL, N, D, r);
        cross_grads g[2];
        for (int run = 0; run < 2; run++) {
            g[run] = (cross_grads){copy_of(init.dx0, nd), copy_of(init.dx, nd), copy_of(init.dU, nw),
                                   copy_of(init.dV, nw), copy_of(init.db, D)};
            gpu_cross_bwd(bf, &g[run], dcg, x0, x, Uw, Vw, b, rvx, NULL, N, D, r);
        }
        expect_grad("cross bwd dx0", bf, g[0].dx0, ref.dx0, init.dx0, nd);
        expect_close("cross bwd dx (written)", bf, g[0].dx, ref.dx, nd);
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
        gpu_cross_bwd(bf, &p, dcg, x0, x, Uw, Vw, b, rvx, NULL, N, D, r);
        expect_same("cross bwd dU (dx0, dx NULL)", p.dU, g[0].dU, nw);
        expect_same("cross bwd dV (dx0, dx NULL)", p.dV, g[0].dV, nw);
        expect_same("cross bwd db (dx0, dx NULL)", p.db, g[0].db, D);
        cross_grads a0 = {copy_of(init.dx0, nd), NULL, NULL, NULL, NULL};
        gpu_cross_bwd(bf, &a0, dcg, x0, x, Uw, Vw, b, rvx, NULL, N, D, r);
        expect_same("cross bwd dx0 (others NULL)", a0.dx0, g[0].dx0, nd);
        cross_grads a1 = {NULL, copy_of(init.dx, nd), NULL, NULL, NULL};
        gpu_cross_bwd(bf, &a1, dcg, x0, x, Uw, Vw, b, rvx, NULL, N, D, r);
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
    check_cross(6, 27 * 8, 3);      /* test_dlrm_ref's twin: B 6, E 8, rank 3 (its bf16 gradients fail) */
}

/* ---- ReLU ---- */

TEST_CASE(test_relu) {
    size_t n = 100003;
    FOR_DTYPE(bf) {
        float *inp = randn_bf(n, 0, 1, bf), *dout = randn_bf(n, 0, 1, bf), *rout = zeros(n);
        CPU->relu_fwd(&ot_cctx, rout, inp, n);
        float *init = randn_bf(n, 0, 1, bf), *rg = copy_of(init, n);
        CPU->relu_bwd(&ot_cctx, rg, inp, dout, n);
        float *out[2], *g[2], *inpl = NULL;
        for (int run = 0; run < 2; run++) {
            void *di = dev_up(inp, n, bf), *ddo = dev_up(dout, n, bf), *dout_ = dev_nan(n, bf);
            void *gd = dev_up(init, n, bf);
            gpu(bf)->relu_fwd(&ot_gctx, dout_, di, n);
            gpu(bf)->relu_bwd(&ot_gctx, gd, di, ddo, n);
            out[run] = dev_get(dout_, n, bf), g[run] = dev_get(gd, n, bf);
            if (run == 0) { /* in place */
                gpu(bf)->relu_fwd(&ot_gctx, di, di, n);
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
    gpu(bf)->linear1_bwd(&ot_gctx, gx, gw, gb, ddz, dx_, dw_, N, D);
    if (gx) dev_down(dx, gx, nx, bf);
    if (gw) dev_down(dw, gw, D, 0);
    if (gb) dev_down(db, gb, 1, 0);
    dev_free(ddz), dev_free(dx_), dev_free(dw_), dev_free(gx), dev_free(gw), dev_free(gb);
}

static void check_linear1(int N, int D) {
    size_t nx = (size_t)N * D;
    char what[96];
    FOR_DTYPE(bf) {
        float *x = randn_bf(nx, 0, 1, bf), *w = randn_bf(D, 0, 0.2f, bf), *b = randn_bf(1, 0, 1, bf);
        float *rz = zeros(N), *gz[2];
        CPU->linear1_fwd(&ot_cctx, rz, x, w, b, N, D);
        for (int run = 0; run < 2; run++) {
            void *dx = dev_up(x, nx, bf), *dw = dev_up(w, D, bf), *db = dev_up(b, 1, bf), *dz = dev_nan(N, 0);
            gpu(bf)->linear1_fwd(&ot_gctx, dz, dx, dw, db, N, D);
            gz[run] = dev_get(dz, N, 0);
            dev_free(dx), dev_free(dw), dev_free(db), dev_free(dz);
        }
        snprintf(what, sizeof what, "linear1 fwd z (N=%d D=%d)", N, D);
        expect_close(what, bf, gz[0], rz, N);
        expect_same("linear1 fwd", gz[0], gz[1], N);

        float *dz = randn(N, 0, 1), *z0x = zeros(nx), *z0w = zeros(D), z0b = 0;
        CPU->linear1_bwd(&ot_cctx, z0x, z0w, &z0b, dz, x, w, N, D);
        float *ix = grad_init(z0x, nx, bf), *iw = grad_init(z0w, D, 0), *ib = grad_init(&z0b, 1, 0);
        float *rx = copy_of(ix, nx), *rw = copy_of(iw, D), *rb = copy_of(ib, 1);
        CPU->linear1_bwd(&ot_cctx, rx, rw, rb, dz, x, w, N, D);
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
    gpu(bf)->bce(&ot_gctx, gdz, dl, dzz, dy, N, scale);
    if (gdz) dev_down(dz, gdz, N, 0);
    if (dl) CUDA_CHECK(cudaMemcpy(loss, dl, sizeof(double), cudaMemcpyDeviceToHost));
    dev_free(dzz), dev_free(dy), dev_free(gdz), dev_free(dl);
}

static void check_bce(int N) {
    float *z = randn(N, 0, 3), *y = zeros(N), scale = 1.0f / (float)N;
    uint64_t s = ot_stream++;
    for (int i = 0; i < N; i++) {
        uint32_t u = rand_u32(s, (uint64_t)i);
        y[i] = u % 5 == 0 ? 0.3f : (float)(u & 1);
        if (i % 97 == 5) z[i] = i % 2 ? 40.0f : -40.0f; /* saturated logits */
    }
    float *init = randn(N, 0, 1.0f / (float)N), *rdz = copy_of(init, N);
    double rl = 0.75;
    CPU->bce(&ot_cctx, rdz, &rl, z, y, N, scale);
    char what[96];
    snprintf(what, sizeof what, "bce dz (N=%d)", N);
    FOR_DTYPE(bf) {
        float *g[2];
        double gl[2];
        for (int run = 0; run < 2; run++) {
            g[run] = copy_of(init, N), gl[run] = 0.75;
            gpu_bce(bf, g[run], &gl[run], z, y, N, scale);
        }
        expect_grad(what, 0, g[0], rdz, init, N);
        double le = fabs(gl[0] - rl) / fabs(rl);
        ot_log("    %-46s %-4s rel err %.2e\n", "bce loss (double)", MODE[bf], le);
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
    FOR_DTYPE(bf)
        for (int add = 0; add <= 1; add++) {
            float *src = randn_bf(ns, 0, 1, bf), *init = randn_bf(nd, 0, 1, bf), *ref = copy_of(init, nd);
            (add ? CPU->add_cols : CPU->copy_cols)(&ot_cctx, ref, ld_dst, src, ld_src, rows, cols);
            round_bf(ref, nd, bf); /* one fp32 add, one rounding: the same bits */
            float *got[2];
            for (int run = 0; run < 2; run++) {
                void *dd = dev_up(init, nd, bf), *ds = dev_up(src, ns, bf);
                (add ? gpu(bf)->add_cols : gpu(bf)->copy_cols)(&ot_gctx, dd, ld_dst, ds, ld_src, rows, cols);
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

/* ---- multi-valued pooling: 2 columns sharing one offset array (stride 2), bags of 3, 0, 1, 4,
 * 0, 3 values, forward into strided slots (holding garbage: the op reads what the caller
 * gathered there) from an fp32 table through the lookups past the firsts (value r at table row
 * (5 r + 2) mod 11, lists_mv's before), and backward into the value rows and the slots (rescaled
 * for mean) ---- */

static void check_mvpool(int mean) {
    enum { B = 3, NV = 11, E = 70, LD = 2 * E + 1 };
    static const int32_t off[2 * B + 1] = {0, 3, 3, 4, 8, 8, 11};
    char what[96];
    FOR_DTYPE(bf) {
        float *vals = randn((size_t)NV * E, 0, 1), *out0 = randn_bf((size_t)B * LD, 0, 1, bf);
        float *table = zeros((size_t)NV * E);
        int64_t rows[NV];
        int32_t before[2 * B];
        for (int r = 0; r < NV; r++) memcpy(table + (size_t)((5 * r + 2) % NV) * E, vals + (size_t)r * E, E * sizeof(float));
        for (int g = 0, k = 0, nonempty = 0; g < 2 * B; g++) {
            before[g] = nonempty;
            for (int r = off[g] + 1; r < off[g + 1]; r++) rows[k++] = (5 * r + 2) % NV;
            nonempty += off[g + 1] > off[g];
        }
        float *dv0 = randn_bf((size_t)NV * E, 0, 1, bf), *dout = randn_bf((size_t)B * LD, 0, 1, bf);
        float *ref = copy_of(out0, (size_t)B * LD), *dref = copy_of(dv0, (size_t)NV * E);
        float *doref = copy_of(dout, (size_t)B * LD);
        for (int j = 0; j < 2; j++) {
            CPU->mvpool_fwd(&ot_cctx, ref + j * E, LD, table, rows, before + j, off + j, 2, B, E, mean);
            CPU->mvpool_bwd(&ot_cctx, dref, doref + j * E, LD, off + j, 2, B, E, mean);
        }
        round_bf(ref, (size_t)B * LD, bf), round_bf(dref, (size_t)NV * E, bf), round_bf(doref, (size_t)B * LD, bf);
        float *got[2], *dgot[2], *dogot[2];
        for (int run = 0; run < 2; run++) {
            float *dtab = dev_raw(table, (size_t)NV * E * sizeof(float));
            int64_t *drows = dev_raw(rows, sizeof rows);
            int32_t *dbefore = dev_raw(before, sizeof before);
            void *dout_d = dev_up(out0, (size_t)B * LD, bf);
            void *ddv = dev_up(dv0, (size_t)NV * E, bf), *ddo = dev_up(dout, (size_t)B * LD, bf);
            int32_t *doff = dev_raw(off, sizeof off);
            for (int j = 0; j < 2; j++) {
                gpu(bf)->mvpool_fwd(&ot_gctx, dev_at(dout_d, (size_t)j * E, bf), LD, dtab, drows, dbefore + j, doff + j,
                                    2, B, E, mean);
                gpu(bf)->mvpool_bwd(&ot_gctx, ddv, dev_at(ddo, (size_t)j * E, bf), LD, doff + j, 2, B, E, mean);
            }
            got[run] = dev_get(dout_d, (size_t)B * LD, bf);
            dgot[run] = dev_get(ddv, (size_t)NV * E, bf);
            dogot[run] = dev_get(ddo, (size_t)B * LD, bf);
            dev_free(dtab), dev_free(drows), dev_free(dbefore), dev_free(dout_d), dev_free(ddv), dev_free(ddo), dev_free(doff);
        }
        snprintf(what, sizeof what, "mvpool %s forward", mean ? "mean" : "sum");
        expect_close(what, bf, got[0], ref, (size_t)B * LD);
        expect_same(what, got[0], got[1], (size_t)B * LD);
        snprintf(what, sizeof what, "mvpool %s backward (values)", mean ? "mean" : "sum");
        expect_close(what, bf, dgot[0], dref, (size_t)NV * E);
        expect_same(what, dgot[0], dgot[1], (size_t)NV * E);
        snprintf(what, sizeof what, "mvpool %s backward (slots)", mean ? "mean" : "sum");
        expect_close(what, bf, dogot[0], doref, (size_t)B * LD);
        expect_same(what, dogot[0], dogot[1], (size_t)B * LD);
        free(vals), free(table), free(out0), free(dv0), free(dout), free(ref), free(dref), free(doref);
        for (int run = 0; run < 2; run++) free(got[run]), free(dgot[run]), free(dogot[run]);
    }
}

TEST_CASE(test_mvpool) {
    check_mvpool(0);
    check_mvpool(1);
}

/* ---- self-attention over packed histories ---- */

static void check_seqattn(int B, int max_len, int H, int E) {
    int nh = 0;
    int32_t *off = make_offsets(B, max_len, &nh);
    size_t nq = (size_t)nh * 3 * E, no = (size_t)nh * E, nl = (size_t)nh * H;
    void *doff = dev_raw(off, ((size_t)B + 1) * 4);
    char what[128];
    FOR_DTYPE(bf) {
        float *qkv = randn_bf(nq, 0, 1.5f, bf), *dout = randn_bf(no, 0, 1, bf);
        float *rout = zeros(no), *rlse = zeros(nl);
        CPU->seqattn_fwd(&ot_cctx, rout, rlse, qkv, off, B, max_len, H, E);
        float *out[2], *lse[2];
        for (int run = 0; run < 2; run++) {
            void *dq = dev_up(qkv, nq, bf), *dout_ = dev_nan(no, bf), *dl = dev_nan(nl, 0);
            gpu(bf)->seqattn_fwd(&ot_gctx, dout_, dl, dq, doff, B, max_len, H, E);
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
        CPU->seqattn_bwd(&ot_cctx, g0, dout, qkv, rout, rlse, off, B, max_len, H, E);
        float *init = grad_init(g0, nq, bf), *rg = copy_of(init, nq), *g[2];
        CPU->seqattn_bwd(&ot_cctx, rg, dout, qkv, rout, rlse, off, B, max_len, H, E);
        for (int run = 0; run < 2; run++) {
            void *dq = dev_up(qkv, nq, bf), *ddo = dev_up(dout, no, bf), *dout_ = dev_up(rout, no, bf);
            void *dl = dev_up(rlse, nl, 0), *gd = dev_up(init, nq, bf);
            gpu(bf)->seqattn_bwd(&ot_gctx, gd, ddo, dq, dout_, dl, doff, B, max_len, H, E);
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

/* bf16 on given lengths (the GPU launch gets max_len, which may be below the longest history):
 * the tensor-core kernels (through the table and directly: the table dispatches to them) and the
 * old CUDA-core ones, each against the CPU. */
static void check_seqattn_lens(const int *lens, int B, int max_len, int H, int E) {
    int32_t *off = nb_malloc(((size_t)B + 1) * 4, "offsets");
    int longest = 0;
    off[0] = 0;
    for (int b = 0; b < B; b++) off[b + 1] = off[b] + lens[b], longest = lens[b] > longest ? lens[b] : longest;
    int nh = off[B], bf = 1;
    size_t nq = (size_t)nh * 3 * E, no = (size_t)nh * E, nl = (size_t)nh * H;
    void *doff = dev_raw(off, ((size_t)B + 1) * 4);
    float *qkv = randn_bf(nq, 0, 1.5f, bf), *dout = randn_bf(no, 0, 1, bf), *rout = zeros(no), *rlse = zeros(nl);
    CPU->seqattn_fwd(&ot_cctx, rout, rlse, qkv, off, B, longest, H, E);
    float *rout_b = copy_of(rout, no), *g0 = zeros(nq);
    round_bf(rout_b, no, bf);
    CPU->seqattn_bwd(&ot_cctx, g0, dout, qkv, rout_b, rlse, off, B, longest, H, E);
    float *init = grad_init(g0, nq, bf), *rg = copy_of(init, nq);
    CPU->seqattn_bwd(&ot_cctx, rg, dout, qkv, rout_b, rlse, off, B, longest, H, E);
    void *dq = dev_up(qkv, nq, bf), *ddo = dev_up(dout, no, bf), *dro = dev_up(rout_b, no, bf);
    void *drl = dev_up(rlse, nl, 0);
    char tag[128], what[192];
    snprintf(tag, sizeof tag, "seqattn B=%d nh=%d longest=%d max_len=%d HS=%d", B, nh, longest, max_len, E / H);
    float *out[2], *lse[2], *g[2];
    for (int v = 0; v < 2; v++) { /* 0: the table, 1: the tensor-core entry points */
        void *o = dev_nan(no, bf), *l = dev_nan(nl, 0), *gd = dev_up(init, nq, bf);
        if (v == 1) {
            CHECK(nb_cuda_seqattn_tc_forward_bf16(o, l, dq, doff, B, max_len, H, E, st) == 1 &&
                      nb_cuda_seqattn_tc_backward_bf16(gd, ddo, dq, dro, drl, doff, B, max_len, H, E, st) == 1,
                  "%s: the tensor-core kernels refused a head size they have", tag);
        } else {
            gpu(bf)->seqattn_fwd(&ot_gctx, o, l, dq, doff, B, max_len, H, E);
            gpu(bf)->seqattn_bwd(&ot_gctx, gd, ddo, dq, dro, drl, doff, B, max_len, H, E);
        }
        out[v] = dev_get(o, no, bf), lse[v] = dev_get(l, nl, 0), g[v] = dev_get(gd, nq, bf);
        dev_free(o), dev_free(l), dev_free(gd);
    }
    snprintf(what, sizeof what, "%s fwd out (tensor cores)", tag);
    expect_close(what, bf, out[0], rout, no);
    snprintf(what, sizeof what, "%s fwd lse (tensor cores)", tag);
    expect_close(what, bf, lse[0], rlse, nl);
    snprintf(what, sizeof what, "%s bwd dqkv (tensor cores)", tag);
    expect_grad(what, bf, g[0], rg, init, nq);
    expect_same("seqattn fwd out: the table's bf16 path is the tensor-core kernel's", out[0], out[1], no);
    expect_same("seqattn fwd lse: the table's bf16 path is the tensor-core kernel's", lse[0], lse[1], nl);
    expect_same("seqattn bwd dqkv: the table's bf16 path is the tensor-core kernel's", g[0], g[1], nq);
    dev_free(doff), dev_free(dq), dev_free(ddo), dev_free(dro), dev_free(drl);
    free(off), free(qkv), free(dout), free(rout), free(rlse), free(rout_b), free(g0), free(init), free(rg);
    for (int v = 0; v < 2; v++) free(out[v]), free(lse[v]), free(g[v]);
}

TEST_CASE(test_seqattn) {
    check_seqattn(61, 37, 4, 12);  /* head size 3 */
    check_seqattn(40, 256, 4, 64); /* the target's heads; histories past one 128-row tile */
    check_seqattn(23, 100, 2, 40); /* head size 20, padded to 32 */
    check_seqattn(7, 300, 2, 128); /* head size 64 (tensor cores in bf16) */
}

/* The tensor-core kernels (bf16), dispatched and direct, on chosen histories. */
TEST_CASE(test_seqattn_tc) {
    static const int one[] = {1}, odd[] = {0, 1, 15, 16, 17, 63, 64, 65, 100, 0, 256, 3, 129};
    check_seqattn_lens(one, 1, 1, 4, 64);    /* B = 1, one row */
    check_seqattn_lens(odd, 13, 256, 4, 64); /* tile and chunk edges, a max_len history */
    check_seqattn_lens(odd, 13, 256, 2, 64); /* HS 32 */
    check_seqattn_lens(odd, 13, 40, 4, 64);  /* histories past max_len (only speed may suffer) */
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
    gpu(bf)->targetattn_bwd(&ot_gctx, gq, gkv, dev_at(gkv, vo, bf), ddp, dq_, dkv_, dev_at(dkv_, vo, bf), da, doff, B,
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
    FOR_DTYPE(bf) {
        float *q = randn_bf(nq, 0, 2, bf), *kv = randn_bf(nkv, 0, 1, bf), *dp = randn_bf(nq, 0, 1, bf);
        float *rp = zeros(nq), *ra = zeros(nh ? nh : 1);
        CPU->targetattn_fwd(&ot_cctx, rp, ra, q, kv, kv + vo, off, B, max_len, E, ld);
        float *gp[2], *ga[2];
        for (int run = 0; run < 2; run++) {
            void *dq = dev_up(q, nq, bf), *dkv = dev_up(kv, nkv, bf), *dpo = dev_nan(nq, bf), *da = dev_nan(nh, 0);
            gpu(bf)->targetattn_fwd(&ot_gctx, dpo, da, dq, dkv, dev_at(dkv, vo, bf), doff, B, max_len, E, ld);
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
        CPU->targetattn_bwd(&ot_cctx, z.dq, z.dkv, z.dkv + vo, dp, q, kv, kv + vo, ra, off, B, max_len, E, ld);
        ta_grads init = {grad_init(z.dq, nq, bf), grad_init(z.dkv, nkv, bf)};
        ta_grads ref = {copy_of(init.dq, nq), copy_of(init.dkv, nkv)};
        CPU->targetattn_bwd(&ot_cctx, ref.dq, ref.dkv, ref.dkv + vo, dp, q, kv, kv + vo, ra, off, B, max_len, E, ld);
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
    check_targetattn(45, 256, 64, 1);
    check_targetattn(30, 70, 64, 0);
    check_targetattn(1, 1, 64, 1);
}

#define FN(f) f
#else
#define FN(f) NULL
#endif

static const ot_row rows[] = {
    {"cross", "cuda", OT_F32, "101x348 r20, 300x1856 r256, 6x216 r3", 1e-5, OT_EVAL, FN(test_cross), 0, 0},
    {"cross", "cuda", OT_BF16, "101x348 r20, 300x1856 r256, 6x216 r3", 1e-2, OT_EVAL, FN(test_cross), 0, 0},
    {"relu", "cuda", OT_F32, "100003, in place", 1e-5, OT_EVAL, FN(test_relu), 0, 0},
    {"relu", "cuda", OT_BF16, "100003, in place", 1e-2, OT_EVAL, FN(test_relu), 0, 0},
    {"linear1", "cuda", OT_F32, "301x348, 301x77, 1029x1856", 1e-5, OT_EVAL, FN(test_linear1), 0, 0},
    {"linear1", "cuda", OT_BF16, "301x348, 301x77, 1029x1856", 1e-2, OT_EVAL, FN(test_linear1), 0, 0},
    {"bce", "cuda", OT_F32, "4099, 5", 1e-5, OT_EVAL, FN(test_bce), 0, 0},
    {"bce", "cuda", OT_BF16, "4099, 5", 1e-2, OT_EVAL, FN(test_bce), 0, 0},
    {"cols", "cuda", OT_F32, "77x12, 77x13, 5x64 strided", 1e-5, OT_EVAL, FN(test_cols), 0, 0},
    {"mvpool", "cuda", OT_F32, "sum, mean: 3x2 bags of 11x70, strided", 1e-5, OT_EVAL, FN(test_mvpool), 0, 0},
    {"mvpool", "cuda", OT_BF16, "sum, mean: 3x2 bags of 11x70, strided", 1e-2, OT_EVAL, FN(test_mvpool), 0, 0},
    {"cols", "cuda", OT_BF16, "77x12, 77x13, 5x64 strided", 1e-2, OT_EVAL, FN(test_cols), 0, 0},
    {"seqattn", "cuda", OT_F32, "4 shapes, HS 3 .. 64, max_len to 300", 1e-5, OT_EVAL, FN(test_seqattn), 0, 0},
    {"seqattn", "cuda", OT_BF16, "4 shapes, HS 3 .. 64, max_len to 300", 1e-2, OT_EVAL, FN(test_seqattn), 0, 0},
    {"seqattn_tc", "cuda", OT_BF16, "lens 0..256, HS 16, 32, past max_len", 1e-2, OT_EVAL, FN(test_seqattn_tc), 0, 0},
    {"targetattn", "cuda", OT_F32, "5 shapes, fused kv, past 256 keys", 1e-5, OT_EVAL, FN(test_targetattn), 0, 0},
    {"targetattn", "cuda", OT_BF16, "5 shapes, fused kv, past 256 keys", 1e-2, OT_EVAL, FN(test_targetattn), 0, 0},
};
OT_TABLE(ot_ctr_cuda_b, rows);
