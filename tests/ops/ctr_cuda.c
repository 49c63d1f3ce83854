/* The CUDA seqctr tables (nb_ctr_ops_cuda_f32 / _bf16) against the CPU table (nb_ctr_ops_cpu),
 * entry by entry: the cuda rows of the ctr family's embedding, index-list and sparse-optimizer
 * entries (ctr_cuda_b.c: the dense and attention entries; perf_ctr_cuda.c: the timings).
 *
 * As dense_cuda.c: awkward sizes (E = 12 and 13 beside 64, N and D not multiples of 8, a head
 * size of 3 and one padded from 20 to 32), packed histories with empty ones, length 1, lengths
 * past the 64 rows of one pass and the shared-memory tile, up to max_len 37, 100, 256 and 300;
 * embedding gradients with one row taking 40% of the lookups; outputs poisoned with NaN first;
 * gradients start from random non-zero values and the increments are compared (so overwriting
 * instead of accumulating fails); NULL gradients skipped while the others come out with the same
 * bits; f32 within 1e-5 relative (true fp32), bf16 within 1e-2 with inputs rounded to bf16 on
 * both sides; every GPU op run twice and compared bit for bit. SKIP without a GPU. */
#include "optest.h"

#ifdef NB_WITH_CUDA
#include "ctr_cuda.h"
#include "mvlists_case.h"

/* ---- embeddings ---- */

/* Lookups of F fields into rows of D0 = F * E + pad columns (pad != 0: destinations not all
 * 4-aligned, so the vector path and the scalar one mix); the pad columns must stay untouched. */
static void check_emb_gather(int E, int pad) {
    int B = 77, F = 5, D0 = F * E + pad, n = B * F;
    int64_t nrows = 1000;
    size_t nout = (size_t)B * D0, ntab = (size_t)nrows * E;
    float *table = randn(ntab, 0, 1), *ref = zeros(nout);
    int64_t *rows = nb_malloc((size_t)n * 8, "rows"), *dst = nb_malloc((size_t)n * 8, "dst");
    uint64_t s = ot_stream++;
    for (int i = 0; i < n; i++) {
        dst[i] = (int64_t)(i / F) * D0 + (int64_t)(i % F) * E;
        rows[i] = rand_u32(s, (uint64_t)i) % nrows;
    }
    CPU->emb_gather(&ot_cctx, ref, dst, table, rows, n, E);
    void *dtab = dev_up(table, ntab, 0), *drows = dev_raw(rows, (size_t)n * 8), *ddst = dev_raw(dst, (size_t)n * 8);
    char what[96];
    snprintf(what, sizeof what, "emb_gather E=%d pad=%d", E, pad);
    FOR_DTYPE(bf) {
        float *got[2];
        for (int run = 0; run < 2; run++) {
            void *dout = dev_nan(nout, bf);
            gpu(bf)->emb_gather(&ot_gctx, dout, ddst, dtab, drows, n, E);
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
        ot_log("    %-46s %-4s %s\n", what, MODE[bf], same ? "same bits as the CPU (rounded)" : "DIFFERENT");
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

/* The fused gradient + element-wise Adagrad against the CPU's gradient then Adagrad: the table and
 * its sums bit for bit. */
static void check_emb_grad_adagrad(int bf, const float *src, const void *dsrc, const int64_t *src_off, const void *doff,
                                   const int32_t *order, const void *dord, const int32_t *seg, const void *dseg,
                                   const int64_t *uniq, int U, int E) {
    size_t nt = (size_t)(uniq[U - 1] + 1) * E, nu = (size_t)U * E;
    float *t0 = randn(nt, 0, 0.1f), *a0 = randn(nt, 0, 1), *scratch = zeros(nu);
    for (size_t i = 0; i < nt; i++) a0[i] = fabsf(a0[i]);
    float *t1 = copy_of(t0, nt), *a1 = copy_of(a0, nt);
    CPU->emb_grad_adagrad(&ot_cctx, t1, a1, uniq, scratch, src, src_off, order, seg, NULL, U, seg[U], E, 0.05f, 1e-8f);
    void *dt = dev_up(t0, nt, 0), *da = dev_up(a0, nt, 0), *dsc = dev_nan(nu, 0);
    void *duniq = dev_raw(uniq, (size_t)U * 8);
    gpu(bf)->emb_grad_adagrad(&ot_gctx, dt, da, duniq, dsc, dsrc, doff, dord, dseg, NULL, U, seg[U], E, 0.05f, 1e-8f);
    float *gt = dev_get(dt, nt, 0), *ga = dev_get(da, nt, 0);
    char what[96];
    snprintf(what, sizeof what, "emb_grad_adagrad E=%d U=%d table", E, U);
    expect_same(what, gt, t1, nt);
    expect_same("emb_grad_adagrad Adagrad sums", ga, a1, nt);
    dev_free(dt), dev_free(da), dev_free(dsc), dev_free(duniq);
    free(t0), free(a0), free(t1), free(a1), free(gt), free(ga), free(scratch);
}

/* 40% of the lookups hit one row (more than one 32-lookup batch), one in five is a row of its
 * own (groups of one), the rest spread over 50 rows; src rows are read at scattered, unaligned
 * offsets (aligned: [n, E] rows, DLRM's layout). E = 200 takes two passes over the lookups. */
static void check_emb_grad_unique(int E, int aligned) {
    int n = 3000, ld = aligned ? E : E + 3;
    int64_t *rows = nb_malloc((size_t)n * 8, "rows"), *src_off = nb_malloc((size_t)n * 8, "src_off");
    int64_t *uniq = nb_malloc((size_t)n * 8, "uniq");
    int32_t *order = nb_malloc((size_t)n * 4, "order"), *inverse = nb_malloc((size_t)n * 4, "inverse");
    int32_t *seg = nb_malloc(((size_t)n + 1) * 4, "seg");
    uint64_t s = ot_stream++;
    for (int i = 0; i < n; i++) {
        rows[i] = i % 5 < 2 ? 7 : i % 5 == 2 ? 1000 + i : (int64_t)(rand_u32(s, (uint64_t)i) % 50);
        src_off[i] = (int64_t)((i * 7919) % n) * ld + (aligned ? 0 : i % 3);
    }
    int U = nb_embag_unique_groups(uniq, order, seg, inverse, rows, n, NULL);
    void *doff = dev_raw(src_off, (size_t)n * 8), *dord = dev_raw(order, (size_t)n * 4);
    void *dseg = dev_raw(seg, ((size_t)U + 1) * 4);
    size_t nsrc = (size_t)n * ld, nu = (size_t)U * E;
    char what[96];
    snprintf(what, sizeof what, "emb_grad_unique E=%d U=%d", E, U);
    FOR_DTYPE(bf) {
        float *src = randn_bf(nsrc, 0, 1, bf), *ref = randn(nu, 0, 1); /* overwritten */
        CPU->emb_grad_unique(&ot_cctx, ref, src, src_off, order, seg, NULL, U, n, E);
        void *dsrc = dev_up(src, nsrc, bf);
        float *got[2];
        for (int run = 0; run < 2; run++) {
            void *dd = dev_nan(nu, 0);
            gpu(bf)->emb_grad_unique(&ot_gctx, dd, dsrc, doff, dord, dseg, NULL, U, n, E);
            got[run] = dev_get(dd, nu, 0);
            dev_free(dd);
        }
        expect_close(what, bf, got[0], ref, nu);
        /* backend_ctr.h's chunked order, in every table: the CPU's float additions */
        expect_same("emb_grad_unique vs CPU (same order of adds)", got[0], ref, nu);
        expect_same(what, got[0], got[1], nu);
        check_emb_grad_adagrad(bf, src, dsrc, src_off, doff, order, dord, seg, dseg, uniq, U, E);
        dev_free(dsrc), free(src), free(ref), free(got[0]), free(got[1]);
    }
    dev_free(doff), dev_free(dord), dev_free(dseg);
    free(rows), free(src_off), free(uniq), free(order), free(inverse), free(seg);
}

/* The hot row: one row looked up 100k times among 5000 rows looked up once (interleaved), E = 64,
 * contiguous source rows (the trainer's layout): the CPU's bits, twice the same; and the time. */
static void check_emb_grad_hot(void) {
    int n = 105000, E = 64;
    int64_t *rows = nb_malloc((size_t)n * 8, "rows"), *src_off = nb_malloc((size_t)n * 8, "src_off");
    int64_t *uniq = nb_malloc((size_t)n * 8, "uniq");
    int32_t *order = nb_malloc((size_t)n * 4, "order"), *inverse = nb_malloc((size_t)n * 4, "inverse");
    int32_t *seg = nb_malloc(((size_t)n + 1) * 4, "seg");
    for (int i = 0; i < n; i++) rows[i] = i % 21 == 5 ? 100000 + i : 42, src_off[i] = (int64_t)i * E;
    int U = nb_embag_unique_groups(uniq, order, seg, inverse, rows, n, NULL);
    void *doff = dev_raw(src_off, (size_t)n * 8), *dord = dev_raw(order, (size_t)n * 4);
    void *dseg = dev_raw(seg, ((size_t)U + 1) * 4);
    size_t nsrc = (size_t)n * E, nu = (size_t)U * E;
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    FOR_DTYPE(bf) {
        float *src = randn_bf(nsrc, 0, 1, bf), *ref = zeros(nu);
        CPU->emb_grad_unique(&ot_cctx, ref, src, src_off, order, seg, NULL, U, n, E);
        void *dsrc = dev_up(src, nsrc, bf);
        float *got[2], ms[2] = {0, 0};
        for (int run = 0; run < 2; run++) {
            void *dd = dev_nan(nu, 0);
            gpu(bf)->emb_grad_unique(&ot_gctx, dd, dsrc, doff, dord, dseg, NULL, U, n, E); /* warm-up */
            CUDA_CHECK(cudaMemsetAsync(dd, 0xff, nu * 4, st));
            CUDA_CHECK(cudaEventRecord(e0, st));
            gpu(bf)->emb_grad_unique(&ot_gctx, dd, dsrc, doff, dord, dseg, NULL, U, n, E);
            CUDA_CHECK(cudaEventRecord(e1, st));
            CUDA_CHECK(cudaEventSynchronize(e1));
            CUDA_CHECK(cudaEventElapsedTime(&ms[run], e0, e1));
            got[run] = dev_get(dd, nu, 0);
            dev_free(dd);
        }
        char what[96];
        snprintf(what, sizeof what, "emb_grad_unique hot row (100k of %d lookups, U=%d)", n, U);
        int same = memcmp(got[0], ref, nu * 4) == 0;
        ot_log("    %-58s %-4s %s; %.3f ms\n", what, MODE[bf], same ? "same bits as the CPU" : "DIFFERENT", ms[0]);
        CHECK(same, "%s (%s): differs from the CPU (rel err %.3g)", what, MODE[bf], rel_err(got[0], ref, nu));
        expect_same("emb_grad_unique hot row, two runs", got[0], got[1], nu);
        check_emb_grad_adagrad(bf, src, dsrc, src_off, doff, order, dord, seg, dseg, uniq, U, E);
        dev_free(dsrc), free(src), free(ref);
        for (int run = 0; run < 2; run++) free(got[run]);
    }
    CUDA_CHECK(cudaEventDestroy(e0));
    CUDA_CHECK(cudaEventDestroy(e1));
    dev_free(doff), dev_free(dord), dev_free(dseg);
    free(rows), free(src_off), free(uniq), free(order), free(inverse), free(seg);
}

TEST_CASE(test_emb_grad_unique) {
    check_emb_grad_unique(12, 0);
    check_emb_grad_unique(64, 0);
    check_emb_grad_unique(200, 0);
    check_emb_grad_unique(128, 1);
    check_emb_grad_hot();
}

/* ---- index lists and their deduplication on the device: the host's bits ---- */

static void *dev_get_raw(const void *d, size_t bytes) {
    void *h = nb_malloc(bytes ? bytes : 1, "device copy");
    CUDA_CHECK(cudaStreamSynchronize(st));
    if (bytes) CUDA_CHECK(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
    return h;
}

static void expect_bytes(const char *what, const void *got, const void *want, size_t bytes) {
    CHECK(bytes == 0 || memcmp(got, want, bytes) == 0, "%s: the device's differ from the host's", what);
}

/* nb_cuda_emb_unique_groups against nb_embag_unique_groups: uniq, order, seg, the count; twice. */
static void check_unique_case(const char *name, const int64_t *rows, int n, int64_t maxrow) {
    size_t cap = (size_t)(n > 0 ? n : 1);
    int64_t *uniq = nb_malloc(cap * 8, "uniq");
    int32_t *order = nb_malloc(cap * 4, "order"), *inverse = nb_malloc(cap * 4, "inverse");
    int32_t *seg = nb_malloc((cap + 1) * 4, "seg");
    int U = nb_embag_unique_groups(uniq, order, seg, inverse, rows, n, NULL);
    void *drows = dev_raw(rows, (size_t)n * 8);
    for (int run = 0; run < 2; run++) {
        void *du = dev_nan(cap * 2, 0), *dord = dev_nan(cap, 0), *dseg = dev_nan(cap + 1, 0), *dcnt = dev_nan(1, 0);
        gpu(run)->unique_groups(&ot_gctx, du, dord, dseg, dcnt, drows, n, maxrow);
        int32_t *cnt = dev_get_raw(dcnt, 4);
        char what[128];
        snprintf(what, sizeof what, "unique_groups %s (n %d, U %d): count", name, n, U);
        CHECK(*cnt == U, "%s: device %d, host %d", what, (int)*cnt, U);
        if (*cnt == U) {
            void *gu = dev_get_raw(du, (size_t)U * 8), *go = dev_get_raw(dord, (size_t)n * 4);
            void *gs = dev_get_raw(dseg, ((size_t)U + 1) * 4);
            snprintf(what, sizeof what, "unique_groups %s: unique rows", name);
            expect_bytes(what, gu, uniq, (size_t)U * 8);
            snprintf(what, sizeof what, "unique_groups %s: order", name);
            expect_bytes(what, go, order, (size_t)n * 4);
            snprintf(what, sizeof what, "unique_groups %s: segments", name);
            expect_bytes(what, gs, seg, ((size_t)U + 1) * 4);
            free(gu), free(go), free(gs);
        }
        free(cnt);
        dev_free(du), dev_free(dord), dev_free(dseg), dev_free(dcnt);
    }
    ot_log("    %-58s n %d, %d unique\n", name, n, U);
    dev_free(drows);
    free(uniq), free(order), free(inverse), free(seg);
}

TEST_CASE(test_unique_groups) {
    int n = 200000;
    int64_t *rows = nb_malloc((size_t)n * 8, "rows");
    uint64_t s = ot_stream++;
    int64_t big = 27000000; /* the Criteo-scale tables' rows: 25 bits of key */
    for (int i = 0; i < n; i++) rows[i] = (int64_t)(rand_u32(s, (uint64_t)i) % (uint32_t)(i % 3 ? big : 5000));
    check_unique_case("Criteo-scale rows, hot and cold", rows, n, big - 1);
    for (int i = 0; i < 105000; i++) rows[i] = i % 21 == 5 ? 100000 + i : 42; /* one row 100k times */
    check_unique_case("one row looked up 100k times", rows, 105000, 205000);
    for (int i = 0; i < 1000; i++) rows[i] = 7;
    check_unique_case("every lookup the same row", rows, 1000, 7);
    rows[0] = 0;
    check_unique_case("one lookup of row 0", rows, 1, 0);
    check_unique_case("no lookups", rows, 0, 0);
    for (int i = 0; i < 5000; i++) rows[i] = 4294967295LL - (int64_t)(rand_u32(s, (uint64_t)i + n) % 3000);
    check_unique_case("rows near 2^32 (32-bit keys)", rows, 5000, 4294967295LL);
    free(rows);
}

/* nb_cuda_ctr_lists against nb_ctr_lists: a batch with empty, short and long histories and
 * padding rows, the trainer's field layout. */
TEST_CASE(test_lists) {
    int B = 300, ncat = 26, max_len = 60;
    uint64_t s = ot_stream++;
    nb_ctr_lists_shape sh = {.B = B, .ncat = ncat, .D0 = 29 * 16, .E = 16, .MB = 512};
    int64_t at = 0;
    for (int f = 0; f <= ncat; f++) {
        sh.off[f] = at;
        sh.rows[f] = f == 5 ? 1 : 1000 + 37 * f; /* a one-row table too */
        at += sh.rows[f];
    }
    sh.pad_row = sh.off[ncat];
    uint32_t *cat = nb_malloc((size_t)B * ncat * 4, "cat"), *target = nb_malloc((size_t)B * 4, "target");
    int32_t *hoff = nb_malloc(((size_t)B + 1) * 4, "hoff");
    hoff[0] = 0;
    for (int i = 0; i < B; i++) {
        for (int f = 0; f < ncat; f++) cat[(size_t)i * ncat + f] = rand_u32(s, (uint64_t)(i * ncat + f));
        target[i] = rand_u32(s, 1000000u + (uint64_t)i);
        hoff[i + 1] = hoff[i] + (i % 7 == 0 ? 0 : (int)(rand_u32(s, 2000000u + (uint64_t)i) % (uint32_t)max_len));
    }
    sh.nh = hoff[B];
    sh.nh_pad = sh.nh + 93;
    uint32_t *hist = nb_malloc((size_t)sh.nh * 4 + 4, "hist");
    for (int r = 0; r < sh.nh; r++) hist[r] = rand_u32(s, 3000000u + (uint64_t)r);
    long n = nb_ctr_lists_count(&sh);
    int64_t *rows = nb_malloc((size_t)n * 8, "rows"), *dst = nb_malloc((size_t)n * 8, "dst"), *src = nb_malloc((size_t)n * 8, "src");
    CPU->lists(&ot_cctx, &sh, cat, target, hist, hoff, rows, dst, src);
    void *dcat = dev_raw(cat, (size_t)B * ncat * 4), *dtar = dev_raw(target, (size_t)B * 4);
    void *dhist = dev_raw(hist, (size_t)sh.nh * 4), *dhoff = dev_raw(hoff, ((size_t)B + 1) * 4);
    void *drows = dev_nan((size_t)n * 2, 0), *ddst = dev_nan((size_t)n * 2, 0), *dsrc = dev_nan((size_t)n * 2, 0);
    gpu(1)->lists(&ot_gctx, &sh, dcat, dtar, dhist, dhoff, drows, ddst, dsrc);
    void *g[3] = {dev_get_raw(drows, (size_t)n * 8), dev_get_raw(ddst, (size_t)n * 8), dev_get_raw(dsrc, (size_t)n * 8)};
    expect_bytes("lists: rows", g[0], rows, (size_t)n * 8);
    expect_bytes("lists: gather destinations", g[1], dst, (size_t)n * 8);
    expect_bytes("lists: gradient sources", g[2], src, (size_t)n * 8);
    ot_log("    lists of %d samples, %d history rows + %d padding: %ld lookups\n", B, sh.nh, sh.nh_pad - sh.nh, n);
    for (int k = 0; k < 3; k++) free(g[k]);
    dev_free(dcat), dev_free(dtar), dev_free(dhist), dev_free(dhoff), dev_free(drows), dev_free(ddst), dev_free(dsrc);
    free(cat), free(target), free(hoff), free(hist), free(rows), free(dst), free(src);
}

/* nb_cuda_ctr_lists + nb_cuda_ctr_lists_mv against the CPU's nb_ctr_lists + nb_ctr_lists_mv, byte
 * for byte, twice; and the deduplication of those lists. */
static void check_lists_mv_case(const char *name, mvl_case *c) {
    const nb_ctr_lists_shape *sh = &c->sh;
    size_t n = (size_t)c->n, B = (size_t)sh->B, G = B * (size_t)sh->ncols;
    int64_t *rows = nb_malloc(n * 8 + 8, "rows"), *dst = nb_malloc(n * 8 + 8, "dst"), *src = nb_malloc(n * 8 + 8, "src");
    CPU->lists(&ot_cctx, sh, c->cat, c->target, c->hist, c->hoff, rows, dst, src);
    int32_t *before = nb_malloc(G * 4 + 4, "before");
    CPU->lists_mv(&ot_cctx, sh, c->mv, c->moff, rows, dst, src, before);
    void *dcat = dev_raw(c->cat, B * (size_t)sh->ncat * 4), *dtar = dev_raw(c->target, B * 4);
    void *dhist = dev_raw(c->hist, (size_t)sh->nh * 4), *dhoff = dev_raw(c->hoff, (B + 1) * 4);
    void *dmv = dev_raw(c->mv, (size_t)sh->nvals * 4), *dmoff = dev_raw(c->moff, (G + 1) * 4);
    for (int run = 0; run < 2; run++) {
        void *drows = dev_nan(n * 2, 0), *ddst = dev_nan(n * 2, 0), *dsrc = dev_nan(n * 2, 0);
        void *dbefore = dev_nan(G + 1, 0);
        gpu(run)->lists(&ot_gctx, sh, dcat, dtar, dhist, dhoff, drows, ddst, dsrc);
        gpu(run)->lists_mv(&ot_gctx, sh, dmv, dmoff, drows, ddst, dsrc, dbefore);
        void *g[3] = {dev_get_raw(drows, n * 8), dev_get_raw(ddst, n * 8), dev_get_raw(dsrc, n * 8)};
        void *gb = dev_get_raw(dbefore, G * 4);
        char what[160];
        snprintf(what, sizeof what, "lists_mv %s (run %d): before", name, run);
        expect_bytes(what, gb, before, G * 4);
        free(gb), dev_free(dbefore);
        snprintf(what, sizeof what, "lists_mv %s (run %d): rows", name, run);
        expect_bytes(what, g[0], rows, n * 8);
        snprintf(what, sizeof what, "lists_mv %s (run %d): gather destinations", name, run);
        expect_bytes(what, g[1], dst, n * 8);
        snprintf(what, sizeof what, "lists_mv %s (run %d): gradient sources", name, run);
        expect_bytes(what, g[2], src, n * 8);
        for (int k = 0; k < 3; k++) free(g[k]);
        dev_free(drows), dev_free(ddst), dev_free(dsrc);
    }
    int64_t maxrow = sh->off[sh->ncat] + sh->rows[sh->ncat] - 1;
    check_unique_case(name, rows, (int)(B * (size_t)(sh->ncat + 2) + (size_t)sh->nmv + (size_t)sh->nh), maxrow);
    ot_log("    lists_mv %-44s %zu samples, %d values, %d lookups past the firsts\n", name, B, sh->nvals, sh->nmv);
    dev_free(dcat), dev_free(dtar), dev_free(dhist), dev_free(dhoff), dev_free(dmv), dev_free(dmoff);
    free(rows), free(dst), free(src), free(before);
}

TEST_CASE(test_lists_mv) {
    static const int cols[4] = {0, 3, 4, 9}, kmax[4] = {5, 1, 12, 3};
    mvl_case c = mvl_make(300, 12, cols, kmax, 4, 9, 0, 11);
    check_lists_mv_case("empty, one-value, long fields, histories", &c);
    mvl_free(&c);
    static const int one[1] = {1}, k1[1] = {1};
    c = mvl_make(50, 3, one, k1, 1, 4, 0, 23);
    check_lists_mv_case("at most one value each", &c);
    mvl_free(&c);
    /* DLRM-DCNv2 at MLPerf's per-GPU batch: 26 multi-hot columns of fixed sizes, no history */
    static const int dk[26] = {3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1};
    int dc[26];
    for (int j = 0; j < 26; j++) dc[j] = j;
    c = mvl_make(6912, 26, dc, dk, 26, 0, 1, 29);
    check_lists_mv_case("DLRM-DCNv2, B 6912", &c);
    mvl_free(&c);
}

/* The device count: with count in device memory and U only a bound, the gradient sums and the
 * updates are those of the exact U (rows past the count are not touched). */
TEST_CASE(test_device_count) {
    int n = 3000, E = 64;
    int64_t *rows = nb_malloc((size_t)n * 8, "rows"), *src_off = nb_malloc((size_t)n * 8, "src_off");
    int64_t *uniq = nb_malloc((size_t)n * 8, "uniq");
    int32_t *order = nb_malloc((size_t)n * 4, "order"), *inverse = nb_malloc((size_t)n * 4, "inverse");
    int32_t *seg = nb_malloc(((size_t)n + 1) * 4, "seg");
    uint64_t s = ot_stream++;
    for (int i = 0; i < n; i++) rows[i] = i % 4 ? (int64_t)(rand_u32(s, (uint64_t)i) % 900) : 17, src_off[i] = (int64_t)i * E;
    int U = nb_embag_unique_groups(uniq, order, seg, inverse, rows, n, NULL);
    int32_t cnt = U;
    void *doff = dev_raw(src_off, (size_t)n * 8), *dord = dev_raw(order, (size_t)n * 4);
    void *dseg = dev_raw(seg, ((size_t)U + 1) * 4), *dcnt = dev_raw(&cnt, 4), *duniq = dev_raw(uniq, (size_t)U * 8);
    size_t nsrc = (size_t)n * E, nu = (size_t)U * E, nb = (size_t)n * E;
    FOR_DTYPE(bf) {
        float *src = randn_bf(nsrc, 0, 1, bf);
        void *dsrc = dev_up(src, nsrc, bf), *d1 = dev_nan(nb, 0), *d2 = dev_nan(nb, 0);
        gpu(bf)->emb_grad_unique(&ot_gctx, d1, dsrc, doff, dord, dseg, NULL, U, n, E);
        gpu(bf)->emb_grad_unique(&ot_gctx, d2, dsrc, doff, dord, dseg, dcnt, n, n, E);
        float *g1 = dev_get(d1, nb, 0), *g2 = dev_get(d2, nb, 0);
        expect_same("emb_grad_unique, the count on the device vs the host's", g2, g1, nb); /* NaN past U in both */
        free(g1), free(g2), free(src);
        dev_free(dsrc), dev_free(d1), dev_free(d2);
    }
    float *grads = randn(nu, 0, 0.1f), *table = randn((size_t)900 * E, 0, 1), *acc = randn(900, 0, 1);
    for (int i = 0; i < 900; i++) acc[i] = fabsf(acc[i]);
    void *dg = dev_up(grads, nu, 0);
    float *res[2][2];
    for (int way = 0; way < 2; way++) {
        void *dt = dev_up(table, (size_t)900 * E, 0), *da = dev_up(acc, 900, 0);
        gpu(1)->rowwise_adagrad(&ot_gctx, dt, da, duniq, dg, way ? dcnt : NULL, way ? n : U, E, 0.05f, 1e-8f);
        res[way][0] = dev_get(dt, (size_t)900 * E, 0), res[way][1] = dev_get(da, 900, 0);
        dev_free(dt), dev_free(da);
    }
    expect_same("rowwise_adagrad, the count on the device: table", res[1][0], res[0][0], (size_t)900 * E);
    expect_same("rowwise_adagrad, the count on the device: sums", res[1][1], res[0][1], 900);
    for (int way = 0; way < 2; way++) free(res[way][0]), free(res[way][1]);
    float *mv = randn((size_t)900 * E, 0, 0.01f);
    for (size_t i = 0; i < (size_t)900 * E; i++) mv[i] *= mv[i];
    for (int way = 0; way < 2; way++) {
        void *dt = dev_up(table, (size_t)900 * E, 0), *dm = dev_up(mv, (size_t)900 * E, 0), *dv = dev_up(mv, (size_t)900 * E, 0);
        gpu(1)->sparse_adam(&ot_gctx, dt, dm, dv, duniq, dg, way ? dcnt : NULL, way ? n : U, E, 1e-2f, 0.9f, 0.999f, 1e-8f, 3);
        res[way][0] = dev_get(dt, (size_t)900 * E, 0), res[way][1] = dev_get(dm, (size_t)900 * E, 0);
        dev_free(dt), dev_free(dm), dev_free(dv);
    }
    expect_same("sparse_adam, the count on the device: table", res[1][0], res[0][0], (size_t)900 * E);
    expect_same("sparse_adam, the count on the device: m", res[1][1], res[0][1], (size_t)900 * E);
    for (int way = 0; way < 2; way++) free(res[way][0]), free(res[way][1]);
    dev_free(doff), dev_free(dord), dev_free(dseg), dev_free(dcnt), dev_free(duniq), dev_free(dg);
    free(rows), free(src_off), free(uniq), free(order), free(inverse), free(seg), free(grads), free(table), free(acc), free(mv);
}

/* ---- sparse optimizers (fp32 state whatever the precision) ---- */

static void check_sparse_optim(int E) {
    int nrows = 300, U = 77;
    size_t nt = (size_t)nrows * E, ng = (size_t)U * E;
    int64_t *rows = nb_malloc((size_t)U * 8, "rows");
    uint64_t s = ot_stream++;
    for (int u = 0; u < U; u++) rows[u] = 3 * u + rand_u32(s, (uint64_t)u) % 3; /* strictly increasing */
    float *table = randn(nt, 0, 1), *grads = randn(ng, 0, 0.1f), *acc = randn(nrows, 0, 1);
    float *m = randn(nt, 0, 0.01f), *v = randn(nt, 0, 0.01f);
    for (int i = 0; i < nrows; i++) acc[i] = fabsf(acc[i]);
    for (size_t i = 0; i < nt; i++) v[i] *= v[i];
    void *drows = dev_raw(rows, (size_t)U * 8), *dg = dev_up(grads, ng, 0);
    char what[96];
    /* row-wise adagrad (rows not listed must keep their values: compared as part of the table) */
    float *rt = copy_of(table, nt), *ra = copy_of(acc, nrows);
    CPU->rowwise_adagrad(&ot_cctx, rt, ra, rows, grads, NULL, U, E, 0.05f, 1e-8f);
    float *gt[2], *ga[2];
    for (int run = 0; run < 2; run++) {
        void *dt = dev_up(table, nt, 0), *da = dev_up(acc, nrows, 0);
        gpu(run)->rowwise_adagrad(&ot_gctx, dt, da, drows, dg, NULL, U, E, 0.05f, 1e-8f); /* both tables' entry */
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
    CPU->sparse_adam(&ot_cctx, rt2, rm, rv, rows, grads, NULL, U, E, 1e-2f, 0.9f, 0.999f, 1e-8f, 5);
    void *dt = dev_up(table, nt, 0), *dm = dev_up(m, nt, 0), *dv = dev_up(v, nt, 0);
    gpu(1)->sparse_adam(&ot_gctx, dt, dm, dv, drows, dg, NULL, U, E, 1e-2f, 0.9f, 0.999f, 1e-8f, 5);
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

#define FN(f) f
#else
#define FN(f) NULL
#endif

static const ot_row rows[] = {
    {"emb_gather", "cuda", OT_F32, "B77 F5, E 12, 13, 64, pad", 1e-5, OT_EVAL, FN(test_emb_gather), 0, OT_SMALL},
    {"emb_gather", "cuda", OT_BF16, "B77 F5, E 12, 13, 64, pad", 1e-2, OT_EVAL, FN(test_emb_gather), 0, OT_SMALL},
    {"emb_grad_unique", "cuda", OT_F32, "E 12, 64, 200, 128 aligned; hot row; +Adagrad", 1e-5, OT_EVAL, FN(test_emb_grad_unique), 0, 0},
    {"emb_grad_unique", "cuda", OT_BF16, "E 12, 64, 200, 128 aligned; hot row; +Adagrad", 1e-2, OT_EVAL, FN(test_emb_grad_unique), 0, 0},
    {"unique_groups", "cuda", OT_NONE, "200k Criteo-scale, 100k of one row, 2^32", 0, OT_EVAL, FN(test_unique_groups), 0, 0},
    {"lists", "cuda", OT_NONE, "empty, short, long histories", 0, OT_EVAL, FN(test_lists), 0, 0},
    {"lists_mv", "cuda", OT_NONE, "empty, one-value, 12-value fields; DLRM B 6912", 0, OT_EVAL, FN(test_lists_mv), 0, 0},
    {"device_count", "cuda", OT_F32, "n 3000 E 64, counts on the device", 1e-5, OT_EVAL, FN(test_device_count), 0, 0},
    {"device_count", "cuda", OT_BF16, "n 3000 E 64, counts on the device", 1e-2, OT_EVAL, FN(test_device_count), 0, 0},
    {"sparse_optim", "cuda", OT_F32, "adagrad, adam: E 12, 64", 1e-5, OT_EVAL, FN(test_sparse_optim), 0, 0},
};
OT_TABLE(ot_ctr_cuda, rows);
