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
 * Exits 77 (skipped) without a GPU, or when built without CUDA.
 *
 * `--bench [SPEC [TABLE_CAP [B]]]` times instead of testing: every op of the seqctr model's
 * phases at the model's shapes, on one synthetic batch (see the comment above bench()). */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "bf16_host.h"
#include "check.h"

#ifndef NB_WITH_CUDA
int main(void) {
    (void)nb_test_failures;
    printf("skip: built without CUDA (nvcc was not found when this was compiled)\n");
    return 77;
}
#else

#include <cuda_runtime.h>
#include <stdarg.h>

#include "core.h"
#include "cuda_check.h"
#include "data/synth.h"
#include "model/seqctr.h"
#include "ops/backend_ctr.h"
#include "ops/ops_ctr.h"
#include "ops/ops_ctr_cuda.h"
#include "optim/optim.h"
#include "rng.h"

#define SEED 20260214u
#include "cuda_test_util.h"

static nb_task_ctx gctx, cctx; /* the GPU lane's context (its stream) and the CPU's */

#define CPU (&nb_ctr_ops_cpu)
static const nb_ctr_ops_i *gpu(int bf) { return bf ? &nb_ctr_ops_cuda_bf16 : &nb_ctr_ops_cuda_f32; }

/* ---- host helpers ---- */

static uint32_t rand_u32(uint64_t stream, uint64_t i) { return nb_philox(SEED, stream, i).v[0]; }

static float *randn_bf(size_t n, float mean, float std, int bf) {
    float *p = randn(n, mean, std);
    round_bf(p, n, bf);
    return p;
}

/* ---- device helpers (bf16 tensors are 2 bytes an element, fp32 ones 4) ---- */

/* Downloads n elements into a new host array (freed by the caller). */
static float *dev_get(const void *d, size_t n, int bf) {
    float *h = zeros(n);
    dev_down(h, d, n, bf);
    return h;
}

/* d + i elements of the mode's type (views into a device buffer, such as v = kv + E) */
static void *dev_at(void *d, size_t i, int bf) { return d ? (char *)d + i * (bf ? 2 : 4) : NULL; }

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
    int U = nb_embag_unique_groups(uniq, order, seg, inverse, rows, n, NULL);
    void *doff = dev_raw(src_off, (size_t)n * 8), *dord = dev_raw(order, (size_t)n * 4);
    void *dseg = dev_raw(seg, ((size_t)U + 1) * 4);
    size_t nsrc = (size_t)n * ld, nu = (size_t)U * E;
    char what[96];
    snprintf(what, sizeof what, "emb_grad_unique E=%d U=%d", E, U);
    for (int bf = 0; bf <= 1; bf++) {
        float *src = randn_bf(nsrc, 0, 1, bf), *ref = randn(nu, 0, 1); /* overwritten */
        CPU->emb_grad_unique(&cctx, ref, src, src_off, order, seg, NULL, U, E);
        void *dsrc = dev_up(src, nsrc, bf);
        float *got[2];
        for (int run = 0; run < 2; run++) {
            void *dd = dev_nan(nu, 0);
            gpu(bf)->emb_grad_unique(&gctx, dd, dsrc, doff, dord, dseg, NULL, U, E);
            got[run] = dev_get(dd, nu, 0);
            dev_free(dd);
        }
        expect_close(what, bf, got[0], ref, nu);
        /* backend_ctr.h's chunked order, in every table: the CPU's float additions */
        expect_same("emb_grad_unique vs CPU (same order of adds)", got[0], ref, nu);
        expect_same(what, got[0], got[1], nu);
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
    for (int bf = 0; bf <= 1; bf++) {
        float *src = randn_bf(nsrc, 0, 1, bf), *ref = zeros(nu);
        CPU->emb_grad_unique(&cctx, ref, src, src_off, order, seg, NULL, U, E);
        void *dsrc = dev_up(src, nsrc, bf);
        float *got[2], ms[2] = {0, 0};
        for (int run = 0; run < 2; run++) {
            void *dd = dev_nan(nu, 0);
            gpu(bf)->emb_grad_unique(&gctx, dd, dsrc, doff, dord, dseg, NULL, U, E); /* warm-up */
            CUDA_CHECK(cudaMemsetAsync(dd, 0xff, nu * 4, st));
            CUDA_CHECK(cudaEventRecord(e0, st));
            gpu(bf)->emb_grad_unique(&gctx, dd, dsrc, doff, dord, dseg, NULL, U, E);
            CUDA_CHECK(cudaEventRecord(e1, st));
            CUDA_CHECK(cudaEventSynchronize(e1));
            CUDA_CHECK(cudaEventElapsedTime(&ms[run], e0, e1));
            got[run] = dev_get(dd, nu, 0);
            dev_free(dd);
        }
        char what[96];
        snprintf(what, sizeof what, "emb_grad_unique hot row (100k of %d lookups, U=%d)", n, U);
        int same = memcmp(got[0], ref, nu * 4) == 0;
        printf("    %-58s %-4s %s; %.3f ms\n", what, MODE[bf], same ? "same bits as the CPU" : "DIFFERENT", ms[0]);
        CHECK(same, "%s (%s): differs from the CPU (rel err %.3g)", what, MODE[bf], rel_err(got[0], ref, nu));
        expect_same("emb_grad_unique hot row, two runs", got[0], got[1], nu);
        dev_free(dsrc), free(src), free(ref);
        for (int run = 0; run < 2; run++) free(got[run]);
    }
    CUDA_CHECK(cudaEventDestroy(e0));
    CUDA_CHECK(cudaEventDestroy(e1));
    dev_free(doff), dev_free(dord), dev_free(dseg);
    free(rows), free(src_off), free(uniq), free(order), free(inverse), free(seg);
}

TEST_CASE(test_emb_grad_unique) {
    check_emb_grad_unique(12);
    check_emb_grad_unique(64);
    check_emb_grad_unique(200);
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
        gpu(run)->unique_groups(&gctx, du, dord, dseg, dcnt, drows, n, maxrow);
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
    printf("    %-58s n %d, %d unique\n", name, n, U);
    dev_free(drows);
    free(uniq), free(order), free(inverse), free(seg);
}

TEST_CASE(test_unique_groups) {
    int n = 200000;
    int64_t *rows = nb_malloc((size_t)n * 8, "rows");
    uint64_t s = next_stream++;
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
    uint64_t s = next_stream++;
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
    CPU->lists(&cctx, &sh, cat, target, hist, hoff, rows, dst, src);
    void *dcat = dev_raw(cat, (size_t)B * ncat * 4), *dtar = dev_raw(target, (size_t)B * 4);
    void *dhist = dev_raw(hist, (size_t)sh.nh * 4), *dhoff = dev_raw(hoff, ((size_t)B + 1) * 4);
    void *drows = dev_nan((size_t)n * 2, 0), *ddst = dev_nan((size_t)n * 2, 0), *dsrc = dev_nan((size_t)n * 2, 0);
    gpu(1)->lists(&gctx, &sh, dcat, dtar, dhist, dhoff, drows, ddst, dsrc);
    void *g[3] = {dev_get_raw(drows, (size_t)n * 8), dev_get_raw(ddst, (size_t)n * 8), dev_get_raw(dsrc, (size_t)n * 8)};
    expect_bytes("lists: rows", g[0], rows, (size_t)n * 8);
    expect_bytes("lists: gather destinations", g[1], dst, (size_t)n * 8);
    expect_bytes("lists: gradient sources", g[2], src, (size_t)n * 8);
    printf("    lists of %d samples, %d history rows + %d padding: %ld lookups\n", B, sh.nh, sh.nh_pad - sh.nh, n);
    for (int k = 0; k < 3; k++) free(g[k]);
    dev_free(dcat), dev_free(dtar), dev_free(dhist), dev_free(dhoff), dev_free(drows), dev_free(ddst), dev_free(dsrc);
    free(cat), free(target), free(hoff), free(hist), free(rows), free(dst), free(src);
}

/* The device count: with count in device memory and U only a bound, the gradient sums and the
 * updates are those of the exact U (rows past the count are not touched). */
TEST_CASE(test_device_count) {
    int n = 3000, E = 64;
    int64_t *rows = nb_malloc((size_t)n * 8, "rows"), *src_off = nb_malloc((size_t)n * 8, "src_off");
    int64_t *uniq = nb_malloc((size_t)n * 8, "uniq");
    int32_t *order = nb_malloc((size_t)n * 4, "order"), *inverse = nb_malloc((size_t)n * 4, "inverse");
    int32_t *seg = nb_malloc(((size_t)n + 1) * 4, "seg");
    uint64_t s = next_stream++;
    for (int i = 0; i < n; i++) rows[i] = i % 4 ? (int64_t)(rand_u32(s, (uint64_t)i) % 900) : 17, src_off[i] = (int64_t)i * E;
    int U = nb_embag_unique_groups(uniq, order, seg, inverse, rows, n, NULL);
    int32_t cnt = U;
    void *doff = dev_raw(src_off, (size_t)n * 8), *dord = dev_raw(order, (size_t)n * 4);
    void *dseg = dev_raw(seg, ((size_t)U + 1) * 4), *dcnt = dev_raw(&cnt, 4), *duniq = dev_raw(uniq, (size_t)U * 8);
    size_t nsrc = (size_t)n * E, nu = (size_t)U * E, nb = (size_t)n * E;
    for (int bf = 0; bf <= 1; bf++) {
        float *src = randn_bf(nsrc, 0, 1, bf);
        void *dsrc = dev_up(src, nsrc, bf), *d1 = dev_nan(nb, 0), *d2 = dev_nan(nb, 0);
        gpu(bf)->emb_grad_unique(&gctx, d1, dsrc, doff, dord, dseg, NULL, U, E);
        gpu(bf)->emb_grad_unique(&gctx, d2, dsrc, doff, dord, dseg, dcnt, n, E);
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
        gpu(1)->rowwise_adagrad(&gctx, dt, da, duniq, dg, way ? dcnt : NULL, way ? n : U, E, 0.05f, 1e-8f);
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
        gpu(1)->sparse_adam(&gctx, dt, dm, dv, duniq, dg, way ? dcnt : NULL, way ? n : U, E, 1e-2f, 0.9f, 0.999f, 1e-8f, 3);
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
    CPU->rowwise_adagrad(&cctx, rt, ra, rows, grads, NULL, U, E, 0.05f, 1e-8f);
    float *gt[2], *ga[2];
    for (int run = 0; run < 2; run++) {
        void *dt = dev_up(table, nt, 0), *da = dev_up(acc, nrows, 0);
        gpu(run)->rowwise_adagrad(&gctx, dt, da, drows, dg, NULL, U, E, 0.05f, 1e-8f); /* both tables' entry */
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
    CPU->sparse_adam(&cctx, rt2, rm, rv, rows, grads, NULL, U, E, 1e-2f, 0.9f, 0.999f, 1e-8f, 5);
    void *dt = dev_up(table, nt, 0), *dm = dev_up(m, nt, 0), *dv = dev_up(v, nt, 0);
    gpu(1)->sparse_adam(&gctx, dt, dm, dv, drows, dg, NULL, U, E, 1e-2f, 0.9f, 0.999f, 1e-8f, 5);
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
    CPU->seqattn_fwd(&cctx, rout, rlse, qkv, off, B, longest, H, E);
    float *rout_b = copy_of(rout, no), *g0 = zeros(nq);
    round_bf(rout_b, no, bf);
    CPU->seqattn_bwd(&cctx, g0, dout, qkv, rout_b, rlse, off, B, longest, H, E);
    float *init = grad_init(g0, nq, bf), *rg = copy_of(init, nq);
    CPU->seqattn_bwd(&cctx, rg, dout, qkv, rout_b, rlse, off, B, longest, H, E);
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
            gpu(bf)->seqattn_fwd(&gctx, o, l, dq, doff, B, max_len, H, E);
            gpu(bf)->seqattn_bwd(&gctx, gd, ddo, dq, dro, drl, doff, B, max_len, H, E);
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
    check_targetattn(45, 256, 64, 1);
    check_targetattn(30, 70, 64, 0);
    check_targetattn(1, 1, 64, 1);
}

/* ---- timing (test_ops_ctr_cuda --bench [SPEC [TABLE_CAP [B]]]): every op of the seqctr model's
 * phases at the model's shapes, on one synthetic batch, bf16 (and fp32 in a second column). Not a
 * test: numbers that say which op makes a phase slow.
 *
 * The batch is the trainer's: samples 0 .. B-1 of the generator SPEC (default the benchmarks'
 * synth:cap=1000000,max_len=256; B = 4096), tables of min(cardinality, TABLE_CAP) rows (default
 * 1000000, as bench/seqctr_bench.sh), the lookup lists, packed history offsets and unique-row
 * groups built as nb_sc_prepare builds them; E 64, 4 heads, 1 history layer, 6 blocks, rank 256,
 * hidden 512 (nb_sc_config_default). Every buffer starts as random non-zero data (magnitudes
 * 0.25..1 of a scale, random signs; positive where it must be); one pass over all the phases
 * then makes the saved activations (lse, attention weights, LN statistics) the real ones.
 *
 * Per op: "alone" = median of BN_REPS launches after BN_WARM warm-ups, one event pair around one
 * launch, behind a 2 GiB memset that keeps the GPU busy while the host enqueues (so the time is
 * the kernels' own, with a cold L2); "in seq" = the median time between the events recorded
 * after each op of the phase's sequence (warm L2, as in the model). GB/s = bytes / alone time,
 * bytes = the least traffic: each input read once, each output written once, an accumulated (+=)
 * output read and written, weights and fp32 gradients / statistics included, index lists
 * included. TFLOP/s = 2 x multiply-adds (attention: the valid pairs only; backward = 2.5 x
 * forward; cross backward = 5 GEMMs of N x D x r, as t = vx U^T is recomputed).
 *
 * Per phase: the sums of both, then the sequence enqueued back to back with one event pair
 * around it, (a) behind the memset (kernels only, launch latency hidden) and (b) with the GPU
 * idle before it (b - a = launch and host gaps), the host time to enqueue it, and the model's
 * own phase (nb_sc_model on the same batch, nb_sc_enqueue_phase, events between the phases of
 * whole steps, bf16): what the trainer's lane spans measure. */

#ifndef BN_REPS
#define BN_REPS 21
#define BN_WARM 3
#endif
#define BN_MAXOPS 128
#define BN_MAXSEQ 128
#define BN_EXTRA NB_SC_NPHASES   /* ops outside the model's phases (alternatives) */
#define BN_NPH (NB_SC_NPHASES + 1)
#ifndef BN_FILL_BYTES
#define BN_FILL_BYTES ((size_t)2 << 30)
#endif

/* GPU time of the phases measured in training (H200, B 4096, E 64, max_len 256), ms */
static const double BN_MEASURED_MS[BN_NPH] = {[NB_SC_FWD_HIST] = 2.4, [NB_SC_BWD_HIST] = 2.9, [NB_SC_BWD_EMB] = 1.1};

/* the batch, host side (built once) */
static struct {
    char spec[256];
    long long table_cap;
    nb_sc_config cfg;
    int B, E, H, L, D0, R, HID, NBLK;
    int nh, nlk, U, max_len_seen, max_group, singles;
    double sum_len2; /* sum over samples of len^2: the attention's valid (query, key) pairs per head */
    size_t nsrc;     /* elements of the gradient region [dx0 | dtemb | dh] */
    int64_t emb_rows;
    float *dense, *label;
    uint32_t *cat, *target, *hist;
    int32_t *hist_len, *off, *order, *seg, *inverse;
    int64_t *rows, *dst, *src, *uniq;
} BT;

/* the model's tensor table (from nb_sc_init_on; the bench's model has 6 + 12 + 3 + 9 * 6 tensors) */
#define BN_MAX_TENSORS 512
static nb_sc_tensor BTT[BN_MAX_TENSORS];
static int BNT;
static size_t BNPARAMS, BNUSED;
static nb_adamw_span BSPANS[BN_MAX_TENSORS];

/* the precision being timed: column 0 bf16, 1 fp32 */
static int PI;
static const nb_backend_i *BE;
static const nb_ctr_ops_i *CO;
static size_t ES;  /* bytes of an activation element */
static int LOWP;   /* 1: the backend keeps a low-precision compute copy of the weights (bf16) */
#define CX (&gctx)
static void *ACT(void *p, size_t i) { return p ? (char *)p + i * ES : NULL; }

/* device buffers of the op-level timing */
static struct {
    int32_t *off, *order, *seg;
    int64_t *rows, *dst, *src, *uniq;
    float *dense, *label;
    float *hp_dense, *hp_label; /* pinned copies the embedding forward uploads (the lists: below) */
    int64_t *hp_rows, *hp_dst, *hp_src, *hp_uniq;
    int32_t *hp_order, *hp_seg, *hp_off;
    float *emb, *eacc, *ugrad;
    float *params, *grads, *am, *av;
    void *w;
    nb_adamw_scalars *k, *hk;
    void *dense_c, *a1, *a2, *bot, *x0, *temb;
    void *h0, *h1, *ln1, *qkv, *att, *x1, *ln2, *f1, *q, *kv, *pooled;
    float *mean1, *rstd1, *lse, *mean2, *rstd2, *attn;
    void *xprev, *c, *vx, *hid, *xs;
    float *logit, *dz;
    double *loss;
    void *dsrc, *dx0, *dtemb, *dh, *dcur, *dprev, *dc, *dhid, *dhidp, *dbot, *da2, *da2p, *da1, *da1p;
    void *dq, *dpooled, *dkv, *dx1, *datt, *dqkv, *dln, *df1, *df1p;
} BD;

typedef struct {
    void *w; /* compute weight (act dtype) */
    float *g; /* fp32 gradient */
} bn_wt;
static struct {
    bn_wt bw[3], bb[3], ln1w, ln1b, qkvw, qkvb, projw, projb, ln2w, ln2b, fc1w, fc1b, fc2w, fc2b, wq, wk;
    bn_wt U, V, cb, w1, b1, w2, b2, hw, hb;
} TW;

static void *BN_DEV[160];
static int BN_NDEV;
static void *BN_HOST[16];
static int BN_NHOST;

static void *bn_dev(size_t bytes) {
    NB_ASSERT(BN_NDEV < (int)(sizeof BN_DEV / sizeof BN_DEV[0]));
    void *d = NULL;
    CUDA_CHECK(cudaMalloc(&d, bytes ? bytes : 16));
    return BN_DEV[BN_NDEV++] = d;
}

static void *bn_pinned(const void *src, size_t bytes) {
    NB_ASSERT(BN_NHOST < (int)(sizeof BN_HOST / sizeof BN_HOST[0]));
    void *h = BE->host_alloc(bytes ? bytes : 16, "bench batch");
    if (src && bytes) memcpy(h, src, bytes);
    return BN_HOST[BN_NHOST++] = h;
}

static void bn_free_all(void) {
    CUDA_CHECK(cudaDeviceSynchronize());
    for (int i = 0; i < BN_NDEV; i++) CUDA_CHECK(cudaFree(BN_DEV[i]));
    for (int i = 0; i < BN_NHOST; i++) BE->host_free(BN_HOST[i]);
    BN_NDEV = BN_NHOST = 0;
}

/* scale * (0.25 .. 1), a random sign unless positive: never zero */
static uint32_t bn_lcg = 12345u;
static float bn_rand(float scale, int positive) {
    bn_lcg = bn_lcg * 1664525u + 1013904223u;
    float mag = scale * (0.25f + 0.75f * (float)((bn_lcg >> 8) & 0x7fffffu) / 8388608.0f);
    return positive || (bn_lcg >> 31) ? mag : -mag;
}

/* n random elements (bf16 when half) into device memory d */
static void bn_fill(void *d, size_t n, int half, float scale, int positive) {
    size_t chunk = (size_t)1 << 22, es = half ? 2 : 4;
    void *h = nb_malloc(chunk * 4, "bench staging");
    for (size_t i0 = 0; i0 < n; i0 += chunk) {
        size_t m = n - i0 < chunk ? n - i0 : chunk;
        for (size_t i = 0; i < m; i++) {
            float v = bn_rand(scale, positive);
            if (half)
                ((uint16_t *)h)[i] = f2bf(v);
            else
                ((float *)h)[i] = v;
        }
        CUDA_CHECK(cudaMemcpy((char *)d + i0 * es, h, m * es, cudaMemcpyHostToDevice));
    }
    free(h);
}

static void *bn_act(size_t n, float scale) {
    void *d = bn_dev(n * ES);
    bn_fill(d, n, ES == 2, scale, 0);
    return d;
}

static float *bn_f32(size_t n, float scale, int positive) {
    float *d = bn_dev(n * 4);
    bn_fill(d, n, 0, scale, positive);
    return d;
}

static void *bn_up(const void *h, size_t bytes) {
    void *d = bn_dev(bytes);
    CUDA_CHECK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}

static bn_wt bn_w(const char *fmt, int idx) {
    char name[48];
    snprintf(name, sizeof name, fmt, idx);
    for (int i = 0; i < BNT; i++)
        if (!strcmp(BTT[i].name, name)) return (bn_wt){ACT(BD.w, BTT[i].off), BD.grads + BTT[i].off};
    nb_fail("the bench's tensor names follow seqctr.c's", "no tensor %s in the seqctr model", name);
}

/* ---- the batch: samples 0 .. B-1 of the generator, lists as nb_sc_prepare makes them ---- */

static void bn_batch(void) {
    nb_synth *g = nb_malloc(sizeof *g, "synthetic generator");
    nb_synth_open(g, BT.spec);
    nb_sc_config *c = &BT.cfg;
    nb_sc_config_default(c);
    c->max_len = g->o.max_len;
    for (int f = 0; f < NB_SC_NCAT; f++) c->cat_rows[f] = g->card[f] < BT.table_cap ? g->card[f] : BT.table_cap;
    c->item_rows = g->o.items < BT.table_cap ? g->o.items : BT.table_cap;
    int B = BT.B, L = c->max_len, E = c->E;
    BT.E = E, BT.H = c->heads, BT.L = L, BT.D0 = 29 * E, BT.R = c->cross_rank, BT.HID = c->block_hidden;
    BT.NBLK = c->blocks;
    NB_CHECK(c->hist_layers == 1 && L > 0, "the bench times one history layer over non-empty histories",
             "hist_layers %d, max_len %d", c->hist_layers, L);
    BT.dense = nb_malloc((size_t)B * NB_SC_NDENSE * 4, "bench batch");
    BT.label = nb_malloc((size_t)B * 4, "bench batch");
    BT.cat = nb_malloc((size_t)B * NB_SC_NCAT * 4, "bench batch");
    BT.target = nb_malloc((size_t)B * 4, "bench batch");
    BT.hist = nb_malloc((size_t)B * L * 4, "bench batch");
    BT.hist_len = nb_malloc((size_t)B * 4, "bench batch");
    nb_synth_fill(g, 0, B, BT.dense, BT.cat, BT.target, BT.hist, BT.hist_len, BT.label, NULL);
    int64_t off[NB_SC_NTABLES + 1] = {0};
    for (int t = 0; t < NB_SC_NTABLES; t++) off[t + 1] = off[t] + (t < NB_SC_NCAT ? c->cat_rows[t] : c->item_rows);
    BT.emb_rows = off[NB_SC_NTABLES];
    long nh = 0;
    for (int i = 0; i < B; i++) {
        int len = BT.hist_len[i];
        nh += len;
        BT.sum_len2 += (double)len * len;
        if (len > BT.max_len_seen) BT.max_len_seen = len;
    }
    BT.nh = (int)nh;
    BT.nlk = B * (NB_SC_NTABLES + 1) + BT.nh;
    NB_CHECK(BT.nh > 0, "pick a generator with histories", "the batch has no history rows");
    size_t n = (size_t)BT.nlk, D0 = (size_t)BT.D0;
    BT.rows = nb_malloc(n * 8, "bench lookups"), BT.dst = nb_malloc(n * 8, "bench lookups");
    BT.src = nb_malloc(n * 8, "bench lookups"), BT.uniq = nb_malloc(n * 8, "bench lookups");
    BT.order = nb_malloc(n * 4, "bench lookups"), BT.inverse = nb_malloc(n * 4, "bench lookups");
    BT.seg = nb_malloc((n + 1) * 4, "bench lookups"), BT.off = nb_malloc(((size_t)B + 1) * 4, "bench lookups");
    for (int i = 0; i < B; i++) {
        for (int f = 0; f < NB_SC_NTABLES; f++) {
            size_t k = (size_t)i * NB_SC_NTABLES + f;
            uint64_t id = f < NB_SC_NCAT ? BT.cat[(size_t)i * NB_SC_NCAT + f] : BT.target[i];
            BT.rows[k] = off[f] + (int64_t)(id % (uint64_t)(off[f + 1] - off[f]));
            BT.dst[k] = BT.src[k] = (int64_t)i * (int64_t)D0 + (int64_t)(1 + f) * E;
        }
        size_t k = (size_t)B * NB_SC_NTABLES + i;
        BT.rows[k] = BT.rows[(size_t)i * NB_SC_NTABLES + NB_SC_NCAT];
        BT.dst[k] = -1;
        BT.src[k] = (int64_t)(B * D0) + (int64_t)i * E;
    }
    size_t k = (size_t)B * (NB_SC_NTABLES + 1);
    BT.off[0] = 0;
    for (int i = 0; i < B; i++) {
        for (int j = 0; j < BT.hist_len[i]; j++, k++) {
            int64_t row = (int64_t)(k - (size_t)B * (NB_SC_NTABLES + 1));
            BT.rows[k] = off[NB_SC_ITEM_TABLE] + (int64_t)(BT.hist[(size_t)i * L + j] % (uint64_t)c->item_rows);
            BT.dst[k] = row * E;
            BT.src[k] = (int64_t)(B * D0 + (size_t)B * E) + row * E;
        }
        BT.off[i + 1] = (int32_t)(k - (size_t)B * (NB_SC_NTABLES + 1));
    }
    BT.U = nb_embag_unique_groups(BT.uniq, BT.order, BT.seg, BT.inverse, BT.rows, BT.nlk, NULL);
    for (int u = 0; u < BT.U; u++) {
        int cnt = BT.seg[u + 1] - BT.seg[u];
        if (cnt > BT.max_group) BT.max_group = cnt;
        BT.singles += cnt == 1;
    }
    BT.nsrc = (size_t)B * D0 + (size_t)B * E + (size_t)BT.nh * E;
    free(g);
}

/* ---- the ops, in the model's order (seqctr.c), on the buffers above ---- */

#define nB BT.B
#define nE BT.E
#define nH ((size_t)BT.nh)
#define FIRST ((size_t)BT.B * (NB_SC_NTABLES + 1))
static const void *dense_in(void) { return BD.dense_c ? BD.dense_c : (const void *)BD.dense; }

/* embedding fwd (nb_sc_zero_grads is in the trainer's span of this phase) */
static void op_zero_grads(void) { BE->zero(CX, BD.grads, BNPARAMS * sizeof(float)); }
static double upload_bytes(void) {
    return (double)nB * (NB_SC_NDENSE + 1) * 4 + (double)BT.nlk * (3 * 8 + 4) + ((double)BT.U + 1) * 4 +
           (double)BT.U * 8 + ((double)nB + 1) * 4;
}
static void op_upload(void) {
    size_t n = (size_t)BT.nlk, U = (size_t)BT.U;
    BE->to_backend(CX, BD.dense, BD.hp_dense, (size_t)nB * NB_SC_NDENSE * sizeof(float));
    BE->to_backend(CX, BD.label, BD.hp_label, (size_t)nB * sizeof(float));
    BE->to_backend(CX, BD.rows, BD.hp_rows, n * 8);
    BE->to_backend(CX, BD.dst, BD.hp_dst, n * 8);
    BE->to_backend(CX, BD.src, BD.hp_src, n * 8);
    BE->to_backend(CX, BD.order, BD.hp_order, n * 4);
    BE->to_backend(CX, BD.seg, BD.hp_seg, (U + 1) * 4);
    BE->to_backend(CX, BD.uniq, BD.hp_uniq, U * 8);
    BE->to_backend(CX, BD.off, BD.hp_off, ((size_t)nB + 1) * 4);
}
static void op_zero_loss(void) { BE->zero(CX, BD.loss, sizeof(double)); }
static void op_zero_dsrc(void) { BE->zero(CX, BD.dsrc, BT.nsrc * ES); }
static void op_cast_dense(void) { BE->cast_params(CX, BD.dense_c, BD.dense, (size_t)nB * NB_SC_NDENSE); }
static void op_bot0(void) {
    BE->matmul_fwd(CX, BD.a1, dense_in(), TW.bw[0].w, TW.bb[0].w, nB, NB_SC_NDENSE, NB_SC_BOTTOM1);
}
static void op_bot_relu0(void) { CO->relu_fwd(CX, BD.a1, BD.a1, (size_t)nB * NB_SC_BOTTOM1); }
static void op_bot1(void) {
    BE->matmul_fwd(CX, BD.a2, BD.a1, TW.bw[1].w, TW.bb[1].w, nB, NB_SC_BOTTOM1, NB_SC_BOTTOM2);
}
static void op_bot_relu1(void) { CO->relu_fwd(CX, BD.a2, BD.a2, (size_t)nB * NB_SC_BOTTOM2); }
static void op_bot2(void) { BE->matmul_fwd(CX, BD.bot, BD.a2, TW.bw[2].w, TW.bb[2].w, nB, NB_SC_BOTTOM2, nE); }
static void op_copy_bot(void) { CO->copy_cols(CX, BD.x0, BT.D0, BD.bot, nE, nB, nE); }
static void op_gather_x0(void) { CO->emb_gather(CX, BD.x0, BD.dst, BD.emb, BD.rows, nB * NB_SC_NTABLES, nE); }
static void op_copy_temb(void) {
    CO->copy_cols(CX, BD.temb, nE, ACT(BD.x0, (size_t)(1 + NB_SC_NCAT) * nE), BT.D0, nB, nE);
}

/* history fwd */
static void op_gather_h(void) { CO->emb_gather(CX, BD.h0, BD.dst + FIRST, BD.emb, BD.rows + FIRST, BT.nh, nE); }
static void op_ln1(void) {
    BE->layernorm_fwd(CX, BD.ln1, BD.mean1, BD.rstd1, BD.h0, TW.ln1w.w, TW.ln1b.w, BT.nh, nE, 1e-5f);
}
static void op_qkv(void) { BE->matmul_fwd(CX, BD.qkv, BD.ln1, TW.qkvw.w, TW.qkvb.w, BT.nh, nE, 3 * nE); }
static void op_seqattn_f(void) { CO->seqattn_fwd(CX, BD.att, BD.lse, BD.qkv, BD.off, nB, BT.L, BT.H, nE); }
static void op_proj(void) { BE->matmul_fwd(CX, BD.h1, BD.att, TW.projw.w, TW.projb.w, BT.nh, nE, nE); }
static void op_res1(void) { BE->residual_fwd(CX, BD.x1, BD.h0, BD.h1, nH * nE); }
static void op_ln2(void) {
    BE->layernorm_fwd(CX, BD.ln2, BD.mean2, BD.rstd2, BD.x1, TW.ln2w.w, TW.ln2b.w, BT.nh, nE, 1e-5f);
}
static void op_fc1(void) { BE->matmul_fwd(CX, BD.f1, BD.ln2, TW.fc1w.w, TW.fc1b.w, BT.nh, nE, 4 * nE); }
static void op_relu_f1(void) { CO->relu_fwd(CX, BD.f1, BD.f1, nH * 4 * nE); }
static void op_fc2(void) { BE->matmul_fwd(CX, BD.h1, BD.f1, TW.fc2w.w, TW.fc2b.w, BT.nh, 4 * nE, nE); }
static void op_res2(void) { BE->residual_fwd(CX, BD.h1, BD.x1, BD.h1, nH * nE); }
static void op_q(void) { BE->matmul_fwd(CX, BD.q, BD.temb, TW.wq.w, NULL, nB, nE, nE); }
static void op_kv(void) { BE->matmul_fwd(CX, BD.kv, BD.h1, TW.wk.w, NULL, BT.nh, nE, 2 * nE); }
static void op_targetattn_f(void) {
    CO->targetattn_fwd(CX, BD.pooled, BD.attn, BD.q, BD.kv, ACT(BD.kv, nE), BD.off, nB, BT.L, nE, 2 * nE);
}
static void op_copy_pooled(void) { CO->copy_cols(CX, ACT(BD.x0, (size_t)28 * nE), BT.D0, BD.pooled, nE, nB, nE); }

/* dense fwd: one block's ops (every block has the same shapes), then the last head's loss */
static void op_cross_f(void) {
    CO->cross_fwd(CX, BD.c, BD.vx, BD.x0, BD.xprev, TW.U.w, TW.V.w, TW.cb.w, nB, BT.D0, BT.R);
}
static void op_w1_f(void) { BE->matmul_fwd(CX, BD.hid, BD.c, TW.w1.w, TW.b1.w, nB, BT.D0, BT.HID); }
static void op_relu_hid(void) { CO->relu_fwd(CX, BD.hid, BD.hid, (size_t)nB * BT.HID); }
static void op_w2_f(void) { BE->matmul_fwd(CX, BD.xs, BD.hid, TW.w2.w, TW.b2.w, nB, BT.HID, BT.D0); }
static void op_res_blk(void) { BE->residual_fwd(CX, BD.xs, BD.xs, BD.c, (size_t)nB * BT.D0); }
static void op_head_f(void) { CO->linear1_fwd(CX, BD.logit, BD.xs, TW.hw.w, TW.hb.w, nB, BT.D0); }
static void op_zero_dz(void) { BE->zero(CX, BD.dz, (size_t)nB * sizeof(float)); }
static void op_bce(void) { CO->bce(CX, BD.dz, BD.loss, BD.logit, BD.label, nB, 1.0f / (float)nB); }

/* dense bwd (one segment: every block keeps dx_prev) */
static void op_zero_dcur(void) { BE->zero(CX, BD.dcur, (size_t)nB * BT.D0 * ES); }
static void op_head_b(void) { CO->linear1_bwd(CX, BD.dcur, TW.hw.g, TW.hb.g, BD.dz, BD.xs, TW.hw.w, nB, BT.D0); }
static void op_copy_dc(void) { CO->copy_cols(CX, BD.dc, BT.D0, BD.dcur, BT.D0, nB, BT.D0); }
static void op_zero_dhid(void) { BE->zero(CX, BD.dhid, (size_t)nB * BT.HID * ES); }
static void op_w2_b(void) {
    BE->matmul_bwd(CX, BD.dhid, TW.w2.g, TW.b2.g, BD.dcur, BD.hid, TW.w2.w, nB, BT.HID, BT.D0);
}
static void op_zero_dhidp(void) { BE->zero(CX, BD.dhidp, (size_t)nB * BT.HID * ES); }
static void op_relu_hid_b(void) { CO->relu_bwd(CX, BD.dhidp, BD.hid, BD.dhid, (size_t)nB * BT.HID); }
static void op_w1_b(void) { BE->matmul_bwd(CX, BD.dc, TW.w1.g, TW.b1.g, BD.dhidp, BD.c, TW.w1.w, nB, BT.D0, BT.HID); }
static void op_zero_dprev(void) { BE->zero(CX, BD.dprev, (size_t)nB * BT.D0 * ES); }
static void op_cross_b(void) {
    CO->cross_bwd(CX, BD.dx0, BD.dprev, TW.U.g, TW.V.g, TW.cb.g, BD.dc, BD.x0, BD.xprev, TW.U.w, TW.V.w, TW.cb.w,
                  BD.vx, nB, BT.D0, BT.R);
}
static void op_add_dx0(void) { BE->add_inplace(CX, BD.dx0, BD.dcur, (size_t)nB * BT.D0); }

/* join bwd */
static void op_copy_dbot(void) { CO->copy_cols(CX, BD.dbot, nE, BD.dx0, BT.D0, nB, nE); }
static void op_copy_dpooled(void) { CO->copy_cols(CX, BD.dpooled, nE, ACT(BD.dx0, (size_t)28 * nE), BT.D0, nB, nE); }

/* history bwd */
static void op_zero_dq(void) { BE->zero(CX, BD.dq, (size_t)nB * nE * ES); }
static void op_zero_dkv(void) { BE->zero(CX, BD.dkv, nH * 2 * nE * ES); }
static void op_targetattn_b(void) {
    CO->targetattn_bwd(CX, BD.dq, BD.dkv, ACT(BD.dkv, nE), BD.dpooled, BD.q, BD.kv, ACT(BD.kv, nE), BD.attn, BD.off,
                       nB, BT.L, nE, 2 * nE);
}
static void op_q_b(void) { BE->matmul_bwd(CX, BD.dtemb, TW.wq.g, NULL, BD.dq, BD.temb, TW.wq.w, nB, nE, nE); }
static void op_kv_b(void) { BE->matmul_bwd(CX, BD.dh, TW.wk.g, NULL, BD.dkv, BD.h1, TW.wk.w, BT.nh, nE, 2 * nE); }
static void op_copy_dx1(void) { CO->copy_cols(CX, BD.dx1, nE, BD.dh, nE, BT.nh, nE); }
static void op_zero_df1(void) { BE->zero(CX, BD.df1, nH * 4 * nE * ES); }
static void op_fc2_b(void) {
    BE->matmul_bwd(CX, BD.df1, TW.fc2w.g, TW.fc2b.g, BD.dh, BD.f1, TW.fc2w.w, BT.nh, 4 * nE, nE);
}
static void op_zero_df1p(void) { BE->zero(CX, BD.df1p, nH * 4 * nE * ES); }
static void op_relu_f1_b(void) { CO->relu_bwd(CX, BD.df1p, BD.f1, BD.df1, nH * 4 * nE); }
static void op_zero_dln(void) { BE->zero(CX, BD.dln, nH * nE * ES); }
static void op_fc1_b(void) {
    BE->matmul_bwd(CX, BD.dln, TW.fc1w.g, TW.fc1b.g, BD.df1p, BD.ln2, TW.fc1w.w, BT.nh, nE, 4 * nE);
}
static void op_ln2_b(void) {
    BE->layernorm_bwd(CX, BD.dx1, TW.ln2w.g, TW.ln2b.g, BD.dln, BD.x1, TW.ln2w.w, BD.mean2, BD.rstd2, BT.nh, nE);
}
static void op_copy_dh(void) { CO->copy_cols(CX, BD.dh, nE, BD.dx1, nE, BT.nh, nE); }
static void op_zero_datt(void) { BE->zero(CX, BD.datt, nH * nE * ES); }
static void op_proj_b(void) {
    BE->matmul_bwd(CX, BD.datt, TW.projw.g, TW.projb.g, BD.dx1, BD.att, TW.projw.w, BT.nh, nE, nE);
}
static void op_zero_dqkv(void) { BE->zero(CX, BD.dqkv, nH * 3 * nE * ES); }
static void op_seqattn_b(void) {
    CO->seqattn_bwd(CX, BD.dqkv, BD.datt, BD.qkv, BD.att, BD.lse, BD.off, nB, BT.L, BT.H, nE);
}
static void op_qkv_b(void) {
    BE->matmul_bwd(CX, BD.dln, TW.qkvw.g, TW.qkvb.g, BD.dqkv, BD.ln1, TW.qkvw.w, BT.nh, nE, 3 * nE);
}
static void op_ln1_b(void) {
    BE->layernorm_bwd(CX, BD.dh, TW.ln1w.g, TW.ln1b.g, BD.dln, BD.h0, TW.ln1w.w, BD.mean1, BD.rstd1, BT.nh, nE);
}

/* embedding bwd */
static void op_zero_da2(void) { BE->zero(CX, BD.da2, (size_t)nB * NB_SC_BOTTOM2 * ES); }
static void op_bot2_b(void) {
    BE->matmul_bwd(CX, BD.da2, TW.bw[2].g, TW.bb[2].g, BD.dbot, BD.a2, TW.bw[2].w, nB, NB_SC_BOTTOM2, nE);
}
static void op_zero_da2p(void) { BE->zero(CX, BD.da2p, (size_t)nB * NB_SC_BOTTOM2 * ES); }
static void op_relu_a2_b(void) { CO->relu_bwd(CX, BD.da2p, BD.a2, BD.da2, (size_t)nB * NB_SC_BOTTOM2); }
static void op_zero_da1(void) { BE->zero(CX, BD.da1, (size_t)nB * NB_SC_BOTTOM1 * ES); }
static void op_bot1_b(void) {
    BE->matmul_bwd(CX, BD.da1, TW.bw[1].g, TW.bb[1].g, BD.da2p, BD.a1, TW.bw[1].w, nB, NB_SC_BOTTOM1, NB_SC_BOTTOM2);
}
static void op_zero_da1p(void) { BE->zero(CX, BD.da1p, (size_t)nB * NB_SC_BOTTOM1 * ES); }
static void op_relu_a1_b(void) { CO->relu_bwd(CX, BD.da1p, BD.a1, BD.da1, (size_t)nB * NB_SC_BOTTOM1); }
static void op_bot0_b(void) {
    BE->matmul_bwd(CX, NULL, TW.bw[0].g, TW.bb[0].g, BD.da1p, dense_in(), TW.bw[0].w, nB, NB_SC_NDENSE,
                   NB_SC_BOTTOM1);
}
static void op_grad_unique(void) {
    CO->emb_grad_unique(CX, BD.ugrad, BD.dsrc, BD.src, BD.order, BD.seg, NULL, BT.U, nE);
}

/* optimizers */
static void op_adagrad(void) { CO->rowwise_adagrad(CX, BD.emb, BD.eacc, BD.uniq, BD.ugrad, NULL, BT.U, nE, 0.05f, 1e-8f); }
static void op_upload_k(void) { BE->to_backend(CX, BD.k, BD.hk, 2 * sizeof(nb_adamw_scalars)); }
static void op_adamw_tensors(void) {
    for (int i = 0; i < BNT; i++) {
        size_t o = BTT[i].off;
        BE->adamw(CX, BD.params + o, BD.grads + o, BD.am + o, BD.av + o, LOWP ? ACT(BD.w, o) : NULL, BTT[i].n,
                  &BD.k[BTT[i].decay ? 0 : 1], NULL);
    }
}
static void op_adamw_spans(void) {
    BE->adamw_spans(CX, BD.params, BD.grads, BD.am, BD.av, LOWP ? BD.w : NULL, BSPANS, BNT, BD.k, NULL, 0.0f);
}

/* ---- the table of ops ---- */

typedef struct {
    int phase, count; /* count: calls per phase (a block's ops: once per block) */
    char name[24], shape[48];
    double flop, bytes[2];
    void (*fn)(void);
    double alone[2], inseq[2]; /* microseconds per call (medians) */
    int absent[2];             /* not run in this precision */
} bn_op;

static bn_op BOPS[BN_MAXOPS];
static int BNOPS, BK;

static void NB_PRINTF(7, 8) add_op(int ph, int count, const char *name, double flop, double bytes, void (*fn)(void),
                                   const char *fmt, ...) {
    NB_ASSERT(BK < BN_MAXOPS);
    bn_op *o = &BOPS[BK++];
    if (BK > BNOPS) { /* first precision: the entry is new */
        memset(o, 0, sizeof *o);
        o->phase = ph, o->count = count, o->flop = flop, o->fn = fn;
        snprintf(o->name, sizeof o->name, "%s", name);
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(o->shape, sizeof o->shape, fmt, ap);
        va_end(ap);
        BNOPS = BK;
    }
    NB_ASSERT(o->fn == fn && o->phase == ph);
    o->bytes[PI] = bytes;
}

/* traffic of the common ops (ES bytes an activation element) */
static double b_mm_f(double N, double C, double OC, int bias) { return ES * (N * C + OC * C + N * OC + (bias ? OC : 0)); }
static double b_mm_b(int dinp, double N, double C, double OC, int dbias) {
    return ES * (N * OC + N * C + OC * C + (dinp ? 2 * N * C : 0)) + 8 * OC * C + (dbias ? 8 * OC : 0);
}
static double f_mm(double N, double C, double OC) { return 2 * N * C * OC; }

static void build_ops(void) {
    BK = 0;
    double B = nB, E = nE, nh = (double)BT.nh, D0 = BT.D0, R = BT.R, HID = BT.HID, n = BT.nlk, U = BT.U;
    double es = (double)ES, b1 = NB_SC_BOTTOM1, b2 = NB_SC_BOTTOM2, nd = NB_SC_NDENSE, S2 = BT.sum_len2;
    int nb = BT.NBLK, ph;
    int iB = nB, iE = nE, inh = BT.nh, iD0 = BT.D0;

    ph = NB_SC_FWD_EMB;
    add_op(ph, 1, "zero dense grads", 0, 4.0 * BNPARAMS, op_zero_grads, "%zu fp32 (nb_sc_zero_grads)", BNPARAMS);
    add_op(ph, 1, "upload batch", 0, upload_bytes(), op_upload, "9 H2D copies, n=%d U=%d", BT.nlk, BT.U);
    add_op(ph, 1, "zero loss", 0, 8, op_zero_loss, "8 bytes");
    add_op(ph, 1, "zero grad region", 0, es * BT.nsrc, op_zero_dsrc, "[dx0|dtemb|dh] %zu", BT.nsrc);
    add_op(ph, 1, "cast dense", 0, B * nd * (4 + es), op_cast_dense, "%dx%d f32->bf16", iB, NB_SC_NDENSE);
    BOPS[BK - 1].absent[PI] = BD.dense_c == NULL; /* the fp32 model reads the dense inputs as they are */
    add_op(ph, 1, "matmul_fwd bottom0", f_mm(B, nd, b1), b_mm_f(B, nd, b1, 1), op_bot0, "N=%d C=%d OC=%d", iB,
           NB_SC_NDENSE, NB_SC_BOTTOM1);
    add_op(ph, 1, "relu_fwd", 0, 2 * es * B * b1, op_bot_relu0, "%dx%d", iB, NB_SC_BOTTOM1);
    add_op(ph, 1, "matmul_fwd bottom1", f_mm(B, b1, b2), b_mm_f(B, b1, b2, 1), op_bot1, "N=%d C=%d OC=%d", iB,
           NB_SC_BOTTOM1, NB_SC_BOTTOM2);
    add_op(ph, 1, "relu_fwd", 0, 2 * es * B * b2, op_bot_relu1, "%dx%d", iB, NB_SC_BOTTOM2);
    add_op(ph, 1, "matmul_fwd bottom2", f_mm(B, b2, E), b_mm_f(B, b2, E, 1), op_bot2, "N=%d C=%d OC=%d", iB,
           NB_SC_BOTTOM2, iE);
    add_op(ph, 1, "copy_cols bot->x0", 0, 2 * es * B * E, op_copy_bot, "%dx%d ld %d<-%d", iB, iE, iD0, iE);
    add_op(ph, 1, "emb_gather x0", 0, B * 27 * (E * 4 + 16) + es * B * 27 * E, op_gather_x0,
           "n=%d E=%d into x0 [%d,%d]", iB * NB_SC_NTABLES, iE, iB, iD0);
    add_op(ph, 1, "copy_cols temb", 0, 2 * es * B * E, op_copy_temb, "%dx%d ld %d<-%d", iB, iE, iE, iD0);

    ph = NB_SC_FWD_HIST;
    add_op(ph, 1, "emb_gather h0", 0, nh * (E * 4 + 16) + es * nh * E, op_gather_h, "n=nh=%d E=%d", inh, iE);
    add_op(ph, 1, "layernorm_fwd ln1", 0, es * (2 * nh * E + 2 * E) + 8 * nh, op_ln1, "[%d,%d]", inh, iE);
    add_op(ph, 1, "matmul_fwd qkv", f_mm(nh, E, 3 * E), b_mm_f(nh, E, 3 * E, 1), op_qkv, "N=%d C=%d OC=%d", inh, iE,
           3 * iE);
    add_op(ph, 1, "seqattn_fwd", 4 * S2 * E, es * (nh * 3 * E + nh * E) + 4 * nh * BT.H + 4 * (B + 1),
           op_seqattn_f, "B=%d L=%d H=%d E=%d nh=%d", iB, BT.L, BT.H, iE, inh);
    add_op(ph, 1, "matmul_fwd proj", f_mm(nh, E, E), b_mm_f(nh, E, E, 1), op_proj, "N=%d C=%d OC=%d", inh, iE, iE);
    add_op(ph, 1, "residual_fwd", 0, 3 * es * nh * E, op_res1, "%d x %d", inh, iE);
    add_op(ph, 1, "layernorm_fwd ln2", 0, es * (2 * nh * E + 2 * E) + 8 * nh, op_ln2, "[%d,%d]", inh, iE);
    add_op(ph, 1, "matmul_fwd fc1", f_mm(nh, E, 4 * E), b_mm_f(nh, E, 4 * E, 1), op_fc1, "N=%d C=%d OC=%d", inh, iE,
           4 * iE);
    add_op(ph, 1, "relu_fwd", 0, 2 * es * nh * 4 * E, op_relu_f1, "%d x %d (in place)", inh, 4 * iE);
    add_op(ph, 1, "matmul_fwd fc2", f_mm(nh, 4 * E, E), b_mm_f(nh, 4 * E, E, 1), op_fc2, "N=%d C=%d OC=%d", inh,
           4 * iE, iE);
    add_op(ph, 1, "residual_fwd", 0, 3 * es * nh * E, op_res2, "%d x %d", inh, iE);
    add_op(ph, 1, "matmul_fwd q", f_mm(B, E, E), b_mm_f(B, E, E, 0), op_q, "N=%d C=%d OC=%d no bias", iB, iE, iE);
    add_op(ph, 1, "matmul_fwd kv", f_mm(nh, E, 2 * E), b_mm_f(nh, E, 2 * E, 0), op_kv, "N=%d C=%d OC=%d no bias",
           inh, iE, 2 * iE);
    add_op(ph, 1, "targetattn_fwd", 4 * nh * E, es * (2 * B * E + 2 * nh * E) + 4 * nh + 4 * (B + 1),
           op_targetattn_f, "B=%d E=%d ldkv=%d nh=%d", iB, iE, 2 * iE, inh);
    add_op(ph, 1, "copy_cols pooled", 0, 2 * es * B * E, op_copy_pooled, "%dx%d ld %d<-%d", iB, iE, iD0, iE);

    ph = NB_SC_FWD_SEG;
    add_op(ph, nb, "cross_fwd", 4 * B * D0 * R + 3 * B * D0,
           es * (2 * B * D0 + 2 * D0 * R + D0 + B * D0 + B * R), op_cross_f, "N=%d D=%d r=%d", iB, iD0, BT.R);
    add_op(ph, nb, "matmul_fwd w1", f_mm(B, D0, HID), b_mm_f(B, D0, HID, 1), op_w1_f, "N=%d C=%d OC=%d", iB, iD0,
           BT.HID);
    add_op(ph, nb, "relu_fwd", 0, 2 * es * B * HID, op_relu_hid, "%dx%d", iB, BT.HID);
    add_op(ph, nb, "matmul_fwd w2", f_mm(B, HID, D0), b_mm_f(B, HID, D0, 1), op_w2_f, "N=%d C=%d OC=%d", iB, BT.HID,
           iD0);
    add_op(ph, nb, "residual_fwd", 0, 3 * es * B * D0, op_res_blk, "%dx%d", iB, iD0);
    add_op(ph, nb, "linear1_fwd", 2 * B * D0, es * (B * D0 + D0 + 1) + 4 * B, op_head_f, "N=%d D=%d", iB, iD0);
    add_op(ph, 1, "zero dz", 0, 4 * B, op_zero_dz, "%d fp32", iB);
    add_op(ph, 1, "bce", 0, 16 * B + 16, op_bce, "N=%d", iB);

    ph = NB_SC_BWD_SEG;
    add_op(ph, 1, "zero dcur", 0, es * B * D0, op_zero_dcur, "%dx%d", iB, iD0);
    add_op(ph, 1, "linear1_bwd", 4 * B * D0, es * (3 * B * D0 + D0) + 4 * B + 8 * (D0 + 1), op_head_b, "N=%d D=%d",
           iB, iD0);
    add_op(ph, nb, "copy_cols dc<-dcur", 0, 2 * es * B * D0, op_copy_dc, "%dx%d", iB, iD0);
    add_op(ph, nb, "zero dhid", 0, es * B * HID, op_zero_dhid, "%dx%d", iB, BT.HID);
    add_op(ph, nb, "matmul_bwd w2", 2 * f_mm(B, HID, D0), b_mm_b(1, B, HID, D0, 1), op_w2_b, "N=%d C=%d OC=%d", iB,
           BT.HID, iD0);
    add_op(ph, nb, "zero dhidp", 0, es * B * HID, op_zero_dhidp, "%dx%d", iB, BT.HID);
    add_op(ph, nb, "relu_bwd", 0, 4 * es * B * HID, op_relu_hid_b, "%dx%d", iB, BT.HID);
    add_op(ph, nb, "matmul_bwd w1", 2 * f_mm(B, D0, HID), b_mm_b(1, B, D0, HID, 1), op_w1_b, "N=%d C=%d OC=%d", iB,
           iD0, BT.HID);
    add_op(ph, nb, "zero dprev", 0, es * B * D0, op_zero_dprev, "%dx%d", iB, iD0);
    add_op(ph, nb, "cross_bwd", 10 * B * D0 * R,
           es * (3 * B * D0 + 2 * D0 * R + D0 + B * R + 4 * B * D0) + 4 * (4 * D0 * R + 2 * D0), op_cross_b,
           "N=%d D=%d r=%d", iB, iD0, BT.R);
    add_op(ph, 1, "add_inplace dx0", 0, 3 * es * B * D0, op_add_dx0, "%dx%d", iB, iD0);

    ph = NB_SC_BWD_JOIN;
    add_op(ph, 1, "copy_cols dbot", 0, 2 * es * B * E, op_copy_dbot, "%dx%d ld %d<-%d", iB, iE, iE, iD0);
    add_op(ph, 1, "copy_cols dpooled", 0, 2 * es * B * E, op_copy_dpooled, "%dx%d ld %d<-%d", iB, iE, iE, iD0);

    ph = NB_SC_BWD_HIST;
    add_op(ph, 1, "zero dq", 0, es * B * E, op_zero_dq, "%dx%d", iB, iE);
    add_op(ph, 1, "zero dkv", 0, es * nh * 2 * E, op_zero_dkv, "%dx%d", inh, 2 * iE);
    add_op(ph, 1, "targetattn_bwd", 8 * nh * E, es * (4 * B * E + 6 * nh * E) + 4 * nh + 4 * (B + 1),
           op_targetattn_b, "B=%d E=%d ldkv=%d nh=%d", iB, iE, 2 * iE, inh);
    add_op(ph, 1, "matmul_bwd q", 2 * f_mm(B, E, E), b_mm_b(1, B, E, E, 0), op_q_b, "N=%d C=%d OC=%d", iB, iE, iE);
    add_op(ph, 1, "matmul_bwd kv", 2 * f_mm(nh, E, 2 * E), b_mm_b(1, nh, E, 2 * E, 0), op_kv_b, "N=%d C=%d OC=%d",
           inh, iE, 2 * iE);
    add_op(ph, 1, "copy_cols dx1<-dh", 0, 2 * es * nh * E, op_copy_dx1, "%dx%d", inh, iE);
    add_op(ph, 1, "zero df1", 0, es * nh * 4 * E, op_zero_df1, "%dx%d", inh, 4 * iE);
    add_op(ph, 1, "matmul_bwd fc2", 2 * f_mm(nh, 4 * E, E), b_mm_b(1, nh, 4 * E, E, 1), op_fc2_b, "N=%d C=%d OC=%d",
           inh, 4 * iE, iE);
    add_op(ph, 1, "zero df1p", 0, es * nh * 4 * E, op_zero_df1p, "%dx%d", inh, 4 * iE);
    add_op(ph, 1, "relu_bwd", 0, 4 * es * nh * 4 * E, op_relu_f1_b, "%dx%d", inh, 4 * iE);
    add_op(ph, 1, "zero dln", 0, es * nh * E, op_zero_dln, "%dx%d", inh, iE);
    add_op(ph, 1, "matmul_bwd fc1", 2 * f_mm(nh, E, 4 * E), b_mm_b(1, nh, E, 4 * E, 1), op_fc1_b, "N=%d C=%d OC=%d",
           inh, iE, 4 * iE);
    add_op(ph, 1, "layernorm_bwd ln2", 0, es * (4 * nh * E + E) + 8 * nh + 16 * E, op_ln2_b, "[%d,%d]", inh, iE);
    add_op(ph, 1, "copy_cols dh<-dx1", 0, 2 * es * nh * E, op_copy_dh, "%dx%d", inh, iE);
    add_op(ph, 1, "zero datt", 0, es * nh * E, op_zero_datt, "%dx%d", inh, iE);
    add_op(ph, 1, "matmul_bwd proj", 2 * f_mm(nh, E, E), b_mm_b(1, nh, E, E, 1), op_proj_b, "N=%d C=%d OC=%d", inh,
           iE, iE);
    add_op(ph, 1, "zero dqkv", 0, es * nh * 3 * E, op_zero_dqkv, "%dx%d", inh, 3 * iE);
    add_op(ph, 1, "seqattn_bwd", 10 * S2 * E, es * (3 * nh * E + 2 * nh * E + 6 * nh * E) + 4 * nh * BT.H,
           op_seqattn_b, "B=%d L=%d H=%d E=%d nh=%d", iB, BT.L, BT.H, iE, inh);
    add_op(ph, 1, "zero dln", 0, es * nh * E, op_zero_dln, "%dx%d", inh, iE);
    add_op(ph, 1, "matmul_bwd qkv", 2 * f_mm(nh, E, 3 * E), b_mm_b(1, nh, E, 3 * E, 1), op_qkv_b, "N=%d C=%d OC=%d",
           inh, iE, 3 * iE);
    add_op(ph, 1, "layernorm_bwd ln1", 0, es * (4 * nh * E + E) + 8 * nh + 16 * E, op_ln1_b, "[%d,%d]", inh, iE);

    ph = NB_SC_BWD_BOTTOM;
    add_op(ph, 1, "zero da2", 0, es * B * b2, op_zero_da2, "%dx%d", iB, NB_SC_BOTTOM2);
    add_op(ph, 1, "matmul_bwd bottom2", 2 * f_mm(B, b2, E), b_mm_b(1, B, b2, E, 1), op_bot2_b, "N=%d C=%d OC=%d", iB,
           NB_SC_BOTTOM2, iE);
    add_op(ph, 1, "zero da2p", 0, es * B * b2, op_zero_da2p, "%dx%d", iB, NB_SC_BOTTOM2);
    add_op(ph, 1, "relu_bwd", 0, 4 * es * B * b2, op_relu_a2_b, "%dx%d", iB, NB_SC_BOTTOM2);
    add_op(ph, 1, "zero da1", 0, es * B * b1, op_zero_da1, "%dx%d", iB, NB_SC_BOTTOM1);
    add_op(ph, 1, "matmul_bwd bottom1", 2 * f_mm(B, b1, b2), b_mm_b(1, B, b1, b2, 1), op_bot1_b, "N=%d C=%d OC=%d",
           iB, NB_SC_BOTTOM1, NB_SC_BOTTOM2);
    add_op(ph, 1, "zero da1p", 0, es * B * b1, op_zero_da1p, "%dx%d", iB, NB_SC_BOTTOM1);
    add_op(ph, 1, "relu_bwd", 0, 4 * es * B * b1, op_relu_a1_b, "%dx%d", iB, NB_SC_BOTTOM1);
    add_op(ph, 1, "matmul_bwd bottom0", f_mm(B, nd, b1), b_mm_b(0, B, nd, b1, 1), op_bot0_b,
           "N=%d C=%d OC=%d, dinp NULL", iB, NB_SC_NDENSE, NB_SC_BOTTOM1);
    ph = NB_SC_BWD_EMB;
    add_op(ph, 1, "emb_grad_unique", 0, es * n * E + 12 * n + 4 * (U + 1) + 4 * U * E, op_grad_unique,
           "n=%d U=%d (max group %d)", BT.nlk, BT.U, BT.max_group);

    ph = NB_SC_OPT_EMB;
    add_op(ph, 1, "rowwise_adagrad", 0, U * (8 + 4 * E + 8 * E + 8), op_adagrad, "U=%d E=%d of %lld rows", BT.U, iE,
           (long long)BT.emb_rows);

    ph = NB_SC_OPT_DENSE;
    add_op(ph, 1, "upload adamw scalars", 0, 2 * sizeof(nb_adamw_scalars), op_upload_k, "64 bytes H2D");
    add_op(ph, 1, "adamw_spans", 0, (28.0 + (LOWP ? 2 : 0)) * BNUSED, op_adamw_spans, "1 launch, %d spans, %zu",
           BNT, BNUSED);

    ph = BN_EXTRA;
    add_op(ph, 1, "adamw per tensor", 0, (28.0 + (LOWP ? 2 : 0)) * BNUSED, op_adamw_tensors,
           "%d launches, %zu params", BNT, BNUSED);
    NB_ASSERT(BK == BNOPS);
}

/* ---- buffers ---- */

static void bn_alloc(void) {
    size_t B = (size_t)nB, E = (size_t)nE, nh = nH, D0 = (size_t)BT.D0, R = (size_t)BT.R, HID = (size_t)BT.HID;
    size_t n = (size_t)BT.nlk, U = (size_t)BT.U;
    memset(&BD, 0, sizeof BD);
    /* the batch: pinned host copies (what the embedding forward uploads) and device lists */
    float *hd = nb_malloc(B * NB_SC_NDENSE * sizeof(float), "bench dense");
    for (size_t i = 0; i < B * NB_SC_NDENSE; i++) hd[i] = bn_rand(1.0f, 0);
    BD.hp_dense = bn_pinned(hd, B * NB_SC_NDENSE * 4), BD.hp_label = bn_pinned(BT.label, B * 4);
    free(hd);
    BD.hp_rows = bn_pinned(BT.rows, n * 8), BD.hp_dst = bn_pinned(BT.dst, n * 8), BD.hp_src = bn_pinned(BT.src, n * 8);
    BD.hp_order = bn_pinned(BT.order, n * 4), BD.hp_seg = bn_pinned(BT.seg, (U + 1) * 4);
    BD.hp_uniq = bn_pinned(BT.uniq, U * 8), BD.hp_off = bn_pinned(BT.off, (B + 1) * 4);
    BD.dense = bn_up(BD.hp_dense, B * NB_SC_NDENSE * 4), BD.label = bn_up(BT.label, B * 4);
    BD.rows = bn_up(BT.rows, n * 8), BD.dst = bn_up(BT.dst, n * 8), BD.src = bn_up(BT.src, n * 8);
    BD.order = bn_up(BT.order, n * 4), BD.seg = bn_up(BT.seg, (U + 1) * 4), BD.uniq = bn_up(BT.uniq, U * 8);
    BD.off = bn_up(BT.off, (B + 1) * 4);
    /* embedding tables and their optimizer state (fp32) */
    BD.emb = bn_f32((size_t)BT.emb_rows * E, 0.5f, 0);
    BD.eacc = bn_f32((size_t)BT.emb_rows, 1.0f, 1);
    BD.ugrad = bn_f32(U * E, 0.01f, 0);
    /* dense slab: fp32 master weights (scale 1/sqrt(fan-in)), gradients, moments; compute copy */
    BD.params = bn_dev(BNPARAMS * 4);
    CUDA_CHECK(cudaMemset(BD.params, 0, BNPARAMS * 4));
    for (int i = 0; i < BNT; i++) bn_fill(BD.params + BTT[i].off, BTT[i].n, 0, 1.0f / sqrtf((float)BTT[i].cols), 0);
    BD.grads = bn_f32(BNPARAMS, 1e-3f, 0), BD.am = bn_f32(BNPARAMS, 1e-3f, 0), BD.av = bn_f32(BNPARAMS, 1e-6f, 1);
    if (LOWP) {
        BD.w = bn_dev(BNPARAMS * ES);
        BE->cast_params(CX, BD.w, BD.params, BNPARAMS);
    } else {
        BD.w = BD.params;
    }
    nb_adamw_scalars hk[2] = {nb_adamw_prepare((nb_adamw_cfg){1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f}, 1),
                              nb_adamw_prepare((nb_adamw_cfg){1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f}, 1)};
    BD.hk = bn_pinned(hk, sizeof hk);
    BD.k = bn_up(hk, sizeof hk);
    /* activations and gradients (act dtype unless fp32 by contract) */
    BD.dense_c = LOWP ? bn_act(B * NB_SC_NDENSE, 1.0f) : NULL; /* as the model: fp32 reads the inputs */
    BD.a1 = bn_act(B * NB_SC_BOTTOM1, 1), BD.a2 = bn_act(B * NB_SC_BOTTOM2, 1), BD.bot = bn_act(B * E, 1);
    BD.x0 = bn_act(B * D0, 0.5f), BD.temb = bn_act(B * E, 0.5f);
    BD.h0 = bn_act(nh * E, 0.5f), BD.h1 = bn_act(nh * E, 1), BD.ln1 = bn_act(nh * E, 1), BD.qkv = bn_act(nh * 3 * E, 1);
    BD.att = bn_act(nh * E, 1), BD.x1 = bn_act(nh * E, 1), BD.ln2 = bn_act(nh * E, 1), BD.f1 = bn_act(nh * 4 * E, 1);
    BD.q = bn_act(B * E, 1), BD.kv = bn_act(nh * 2 * E, 1), BD.pooled = bn_act(B * E, 1);
    BD.mean1 = bn_f32(nh, 0.1f, 0), BD.rstd1 = bn_f32(nh, 2.0f, 1), BD.lse = bn_f32(nh * (size_t)BT.H, 3.0f, 1);
    BD.mean2 = bn_f32(nh, 0.1f, 0), BD.rstd2 = bn_f32(nh, 2.0f, 1), BD.attn = bn_f32(nh, 0.1f, 1);
    BD.xprev = bn_act(B * D0, 1), BD.c = bn_act(B * D0, 1), BD.vx = bn_act(B * R, 1), BD.hid = bn_act(B * HID, 1);
    BD.xs = bn_act(B * D0, 1), BD.logit = bn_f32(B, 2.0f, 0), BD.dz = bn_f32(B, 1e-3f, 0);
    BD.loss = bn_dev(sizeof(double));
    CUDA_CHECK(cudaMemset(BD.loss, 0, sizeof(double)));
    BD.dsrc = bn_act(BT.nsrc, 0.01f);
    BD.dx0 = BD.dsrc, BD.dtemb = ACT(BD.dsrc, B * D0), BD.dh = ACT(BD.dsrc, B * D0 + B * E);
    BD.dcur = bn_act(B * D0, 0.01f), BD.dprev = bn_act(B * D0, 0.01f), BD.dc = bn_act(B * D0, 0.01f);
    BD.dhid = bn_act(B * HID, 0.01f), BD.dhidp = bn_act(B * HID, 0.01f), BD.dbot = bn_act(B * E, 0.01f);
    BD.da2 = bn_act(B * NB_SC_BOTTOM2, 0.01f), BD.da2p = bn_act(B * NB_SC_BOTTOM2, 0.01f);
    BD.da1 = bn_act(B * NB_SC_BOTTOM1, 0.01f), BD.da1p = bn_act(B * NB_SC_BOTTOM1, 0.01f);
    BD.dq = bn_act(B * E, 0.01f), BD.dpooled = bn_act(B * E, 0.01f), BD.dkv = bn_act(nh * 2 * E, 0.01f);
    BD.dx1 = bn_act(nh * E, 0.01f), BD.datt = bn_act(nh * E, 0.01f), BD.dqkv = bn_act(nh * 3 * E, 0.01f);
    BD.dln = bn_act(nh * E, 0.01f), BD.df1 = bn_act(nh * 4 * E, 0.01f), BD.df1p = bn_act(nh * 4 * E, 0.01f);
    /* the weights the ops read */
    for (int i = 0; i < 3; i++) TW.bw[i] = bn_w("bottom.%d.weight", i), TW.bb[i] = bn_w("bottom.%d.bias", i);
    TW.ln1w = bn_w("hist.%d.ln1.weight", 0), TW.ln1b = bn_w("hist.%d.ln1.bias", 0);
    TW.qkvw = bn_w("hist.%d.qkv.weight", 0), TW.qkvb = bn_w("hist.%d.qkv.bias", 0);
    TW.projw = bn_w("hist.%d.proj.weight", 0), TW.projb = bn_w("hist.%d.proj.bias", 0);
    TW.ln2w = bn_w("hist.%d.ln2.weight", 0), TW.ln2b = bn_w("hist.%d.ln2.bias", 0);
    TW.fc1w = bn_w("hist.%d.fc1.weight", 0), TW.fc1b = bn_w("hist.%d.fc1.bias", 0);
    TW.fc2w = bn_w("hist.%d.fc2.weight", 0), TW.fc2b = bn_w("hist.%d.fc2.bias", 0);
    TW.wq = bn_w("target.wq", 0), TW.wk = bn_w("target.wk", 0);
    TW.U = bn_w("block.%d.U", 0), TW.V = bn_w("block.%d.V", 0), TW.cb = bn_w("block.%d.b", 0);
    TW.w1 = bn_w("block.%d.w1", 0), TW.b1 = bn_w("block.%d.b1", 0), TW.w2 = bn_w("block.%d.w2", 0);
    TW.b2 = bn_w("block.%d.b2", 0), TW.hw = bn_w("block.%d.head.w", 0), TW.hb = bn_w("block.%d.head.b", 0);
    CUDA_CHECK(cudaDeviceSynchronize());
}

/* ---- timing ---- */

static cudaEvent_t BEV[BN_MAXSEQ + 1];
static void *BFILL;
static unsigned BFILL_K;

/* keeps the GPU busy (~0.7 ms) so that the host has enqueued what follows before it starts */
static void bn_busy(void) { CUDA_CHECK(cudaMemsetAsync(BFILL, (int)(BFILL_K++ % 255u) + 1, BN_FILL_BYTES, st)); }

static double bn_us(int a, int b) {
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, BEV[a], BEV[b]));
    return 1e3 * (double)ms;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double bn_median(double *x, int n) {
    qsort(x, (size_t)n, sizeof *x, cmp_double);
    return x[n / 2];
}

static void bn_sync(void) {
    CUDA_CHECK(cudaStreamSynchronize(st));
    CUDA_CHECK(cudaGetLastError());
}

/* The phase's calls in the model's order: a run of ops with count c > 1 (a block) repeats c times. */
static int bn_seq(int ph, int *list) {
    int n = 0;
    for (int i = 0; i < BNOPS;) {
        bn_op *o = &BOPS[i];
        if (o->phase != ph || o->absent[PI]) {
            i++;
            continue;
        }
        int j = i + 1;
        if (o->count > 1)
            while (j < BNOPS && BOPS[j].phase == ph && BOPS[j].count == o->count) j++;
        for (int r = 0; r < o->count; r++)
            for (int k = i; k < j; k++) {
                if (BOPS[k].absent[PI]) continue;
                NB_ASSERT(n < BN_MAXSEQ);
                list[n++] = k;
            }
        i = j;
    }
    return n;
}

static void bn_run_seq(const int *list, int n) {
    for (int k = 0; k < n; k++) BOPS[list[k]].fn();
}

/* What the phase's accumulating outputs hold when the model starts it (history bwd: dh = 0, as
 * the embedding forward leaves it); run before each timed sequence, outside the events. */
static void bn_reset(int ph) {
    if (ph == NB_SC_BWD_HIST) BE->zero(CX, BD.dh, nH * nE * ES);
}

typedef struct {
    double alone, inseq, busy, idle, host; /* sums and sequence times, us */
    double model, model_host;              /* the model's phase (bf16 only) */
} bn_phase_t;
static bn_phase_t BPH[BN_NPH][2];
static double BMODEL_STEP, BMODEL_LOSS;

static void bn_time_alone(bn_op *o) {
    double t[BN_REPS];
    for (int w = 0; w < BN_WARM; w++) o->fn();
    bn_sync();
    for (int r = 0; r < BN_REPS; r++) {
        bn_busy();
        CUDA_CHECK(cudaEventRecord(BEV[0], st));
        o->fn();
        CUDA_CHECK(cudaEventRecord(BEV[1], st));
        CUDA_CHECK(cudaEventSynchronize(BEV[1]));
        t[r] = bn_us(0, 1);
    }
    bn_sync();
    o->alone[PI] = bn_median(t, BN_REPS);
}

static void bn_time_phase(int ph) {
    bn_phase_t *res = &BPH[ph][PI];
    for (int i = 0; i < BNOPS; i++)
        if (BOPS[i].phase == ph && !BOPS[i].absent[PI]) {
            bn_time_alone(&BOPS[i]);
            res->alone += BOPS[i].count * BOPS[i].alone[PI];
        }
    if (ph == BN_EXTRA) return;
    int list[BN_MAXSEQ], n = bn_seq(ph, list);
    static double per[BN_MAXOPS][BN_REPS];
    double busy[BN_REPS], idle[BN_REPS], host[BN_REPS];
    for (int r = -BN_WARM; r < BN_REPS; r++) {
        /* (a) back to back behind the memset: the kernels' time */
        bn_reset(ph);
        bn_busy();
        CUDA_CHECK(cudaEventRecord(BEV[0], st));
        bn_run_seq(list, n);
        CUDA_CHECK(cudaEventRecord(BEV[1], st));
        bn_sync();
        if (r >= 0) busy[r] = bn_us(0, 1);
        /* (b) back to back, the GPU idle before: + launch latency and host gaps */
        bn_reset(ph);
        bn_sync();
        double h0 = nb_now();
        CUDA_CHECK(cudaEventRecord(BEV[0], st));
        bn_run_seq(list, n);
        CUDA_CHECK(cudaEventRecord(BEV[1], st));
        double h1 = nb_now();
        bn_sync();
        if (r >= 0) idle[r] = bn_us(0, 1), host[r] = 1e6 * (h1 - h0);
        /* (c) an event after every op */
        bn_reset(ph);
        bn_busy();
        CUDA_CHECK(cudaEventRecord(BEV[0], st));
        for (int k = 0; k < n; k++) {
            BOPS[list[k]].fn();
            CUDA_CHECK(cudaEventRecord(BEV[k + 1], st));
        }
        bn_sync();
        if (r >= 0) {
            for (int k = 0; k < n; k++) per[list[k]][r] = 0;
            for (int k = 0; k < n; k++) per[list[k]][r] += bn_us(k, k + 1);
        }
    }
    res->busy = bn_median(busy, BN_REPS), res->idle = bn_median(idle, BN_REPS), res->host = bn_median(host, BN_REPS);
    for (int i = 0; i < BNOPS; i++)
        if (BOPS[i].phase == ph && !BOPS[i].absent[PI]) {
            BOPS[i].inseq[PI] = bn_median(per[i], BN_REPS) / BOPS[i].count;
            res->inseq += BOPS[i].count * BOPS[i].inseq[PI];
        }
}

/* The model itself on the same batch (nb_sc_model on this precision's backend): whole steps with
 * an event between the phases; also gives the bench its tensor table. */
static void bn_model(void) {
    nb_sc_model *m = nb_calloc(1, sizeof *m, "bench model");
    nb_sc_init_on(m, &BT.cfg, BT.B, BE);
    nb_sc_set_ctx(m, &gctx);
    BNT = m->ntensors, BNPARAMS = m->nparams, BNUSED = m->nparams_used;
    NB_CHECK(BNT <= BN_MAX_TENSORS, "raise BN_MAX_TENSORS", "the bench's model has %d tensors", BNT);
    memcpy(BTT, m->t, (size_t)BNT * sizeof BTT[0]);
    for (int i = 0; i < BNT; i++) BSPANS[i] = (nb_adamw_span){BTT[i].off, BTT[i].n, BTT[i].decay ? 0 : 1};
    {
        CUDA_CHECK(cudaDeviceSynchronize());
        nb_sc_batch b = {BT.B, BT.L, BT.dense, BT.cat, BT.target, BT.hist, BT.hist_len, BT.label};
        nb_sc_prepare(m, &b);
        NB_CHECK(m->stage_nh == BT.nh, NULL, "bench: the model packs %d history rows, the bench %d", m->stage_nh, BT.nh);
        nb_sc_begin_step(m);
        nb_sc_optim o = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .emb_lr = 0.05f,
                         .emb_eps = 1e-8f}; /* the trainer's defaults */
        nb_sc_optim_prepare(m, &o, 1);
        static double t[NB_SC_NPHASES][BN_REPS], h[NB_SC_NPHASES][BN_REPS];
        double step[BN_REPS];
        for (int r = -BN_WARM; r < BN_REPS; r++) {
            bn_sync();
            CUDA_CHECK(cudaEventRecord(BEV[0], st));
            for (int p = 0; p < NB_SC_NPHASES; p++) {
                double h0 = nb_now();
                if (p == NB_SC_FWD_EMB) nb_sc_zero_grads(m); /* as the trainer's embedding fwd span */
                nb_sc_enqueue_phase(m, &gctx, (nb_sc_phase)p, 0, &o, r + BN_WARM + 1);
                double h1 = nb_now();
                CUDA_CHECK(cudaEventRecord(BEV[p + 1], st));
                if (r >= 0) h[p][r] = 1e6 * (h1 - h0);
            }
            bn_sync();
            if (r >= 0) {
                for (int p = 0; p < NB_SC_NPHASES; p++) t[p][r] = bn_us(p, p + 1);
                step[r] = bn_us(0, NB_SC_NPHASES);
            }
        }
        for (int p = 0; p < NB_SC_NPHASES; p++) {
            BPH[p][PI].model = bn_median(t[p], BN_REPS);
            BPH[p][PI].model_host = bn_median(h[p], BN_REPS);
        }
        BMODEL_STEP = bn_median(step, BN_REPS);
        BMODEL_LOSS = nb_sc_loss(m);
        int U = nb_sc_unique_rows(m); /* device lists: counted by the phases above */
        NB_CHECK(U == BT.U, NULL, "bench: the model finds %d unique rows, the bench %d", U, BT.U);
    }
    nb_sc_free(m);
    free(m);
    CUDA_CHECK(cudaDeviceSynchronize());
}

/* ---- printing ---- */

static const char *bn_num(char *buf, size_t cap, double v, const char *fmt) {
    if (v > 0 && isfinite(v))
        snprintf(buf, cap, fmt, v);
    else
        snprintf(buf, cap, "-");
    return buf;
}

static void bn_print_op(const bn_op *o) {
    char a[6][24];
    double t0 = o->alone[0], t1 = o->alone[1];
    printf("  %-20s %-36s x%-2d %8.2f | %8s %8s %6s %6s | %8s %6s\n", o->name, o->shape, o->count, o->bytes[0] / 1e6,
           bn_num(a[0], 24, o->absent[0] ? 0 : t0, "%.1f"), bn_num(a[1], 24, o->absent[0] ? 0 : o->inseq[0], "%.1f"),
           bn_num(a[2], 24, o->absent[0] ? 0 : o->bytes[0] / t0 / 1e3, "%.0f"),
           bn_num(a[3], 24, o->absent[0] ? 0 : o->flop / t0 / 1e6, "%.2f"), bn_num(a[4], 24, o->absent[1] ? 0 : t1, "%.1f"),
           bn_num(a[5], 24, o->absent[1] ? 0 : o->bytes[1] / t1 / 1e3, "%.0f"));
}

static void bn_print_sum(const char *what, double v0, double v1) {
    char a[2][24];
    printf("  %-70s | %8s %22s | %8s\n", what, bn_num(a[0], 24, v0, "%.1f"), "", bn_num(a[1], 24, v1, "%.1f"));
}

static void bn_print(void) {
    printf("\nper op: MB = bytes read + written in bf16 (the least traffic: every input read once, every output\n"
           "written once, += outputs read and written, weights, fp32 statistics/gradients and index lists included);\n"
           "alone = median us of one launch behind a 2 GiB memset (kernel time, cold L2); in seq = median us between\n"
           "the events after each op of the phase's sequence (warm L2, per call); GB/s and TFLOP/s from alone;\n"
           "xN = calls per phase (a block's ops run once per block).\n");
    for (int ph = 0; ph < BN_NPH; ph++) {
        if (ph < BN_EXTRA)
            printf("\n== %s%s\n", nb_sc_phase_name((nb_sc_phase)ph),
                   BN_MEASURED_MS[ph] > 0 ? " (a phase measured in training)" : "");
        else
            printf("\n== not in a phase (alternatives)\n");
        printf("  %-20s %-36s %-3s %8s | %8s %8s %6s %6s | %8s %6s\n", "op", "shape", "x", "MB", "bf16 us", "in seq",
               "GB/s", "TFLOP", "fp32 us", "GB/s");
        for (int i = 0; i < BNOPS; i++)
            if (BOPS[i].phase == ph) bn_print_op(&BOPS[i]);
        if (ph == BN_EXTRA) continue;
        const bn_phase_t *b = BPH[ph], *f = BPH[ph] + 1;
        bn_print_sum("= sum of the ops alone (x N)", b->alone, f->alone);
        bn_print_sum("= sum of the ops in sequence (an event after every op)", b->inseq, f->inseq);
        bn_print_sum("= back to back, one event pair, GPU busy before (kernels only)", b->busy, f->busy);
        bn_print_sum("= back to back, one event pair, GPU idle before (+ launch/host gaps)", b->idle, f->idle);
        bn_print_sum("= host time to enqueue the sequence", b->host, f->host);
        bn_print_sum("= the model's phase (nb_sc_enqueue_phase in whole steps)", b->model, 0);
        bn_print_sum("= host time to enqueue the model's phase", b->model_host, 0);
        if (BN_MEASURED_MS[ph] > 0) bn_print_sum("= measured in training (reference)", 1e3 * BN_MEASURED_MS[ph], 0);
    }
    printf("\nsummary, bf16, us per phase: ops alone | ops in seq | back to back busy / idle | host enqueue | "
           "model phase (host) | measured in training\n");
    double tot[6] = {0};
    for (int ph = 0; ph < BN_EXTRA; ph++) {
        const bn_phase_t *b = BPH[ph];
        char m[24];
        printf("  %-16s %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f (%6.1f) %9s\n", nb_sc_phase_name((nb_sc_phase)ph), b->alone,
               b->inseq, b->busy, b->idle, b->host, b->model, b->model_host,
               bn_num(m, sizeof m, 1e3 * BN_MEASURED_MS[ph], "%.0f"));
        tot[0] += b->alone, tot[1] += b->inseq, tot[2] += b->busy, tot[3] += b->idle, tot[4] += b->host;
        tot[5] += b->model;
    }
    printf("  %-16s %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f; one whole step of the model: %.1f us (loss %.4f)\n", "total",
           tot[0], tot[1], tot[2], tot[3], tot[4], tot[5], BMODEL_STEP, BMODEL_LOSS);
}

static void bench(int argc, char **argv) {
    snprintf(BT.spec, sizeof BT.spec, "%s", argc > 0 ? argv[0] : "synth:cap=1000000,max_len=256");
    BT.table_cap = argc > 1 ? atoll(argv[1]) : 1000000;
    BT.B = argc > 2 ? atoi(argv[2]) : 4096;
    NB_CHECK(BT.table_cap >= 1 && BT.B >= 1, "usage: test_ops_ctr_cuda --bench [SPEC [TABLE_CAP [B]]]",
             "bad table cap %lld or batch %d", BT.table_cap, BT.B);
    double t0 = nb_now();
    bn_batch();
    printf("seqctr ops at the model's shapes: B=%d E=%d heads=%d max_len=%d D0=%d rank=%d hidden=%d blocks=%d\n", BT.B,
           BT.E, BT.H, BT.L, BT.D0, BT.R, BT.HID, BT.NBLK);
    printf("batch: samples 0..%d of %s, tables capped at %lld rows (%lld rows, %.2f GB fp32)\n", BT.B - 1, BT.spec,
           BT.table_cap, (long long)BT.emb_rows, (double)BT.emb_rows * BT.E * 4 / 1e9);
    printf("  nh=%d history rows (mean length %.1f, longest %d, sum of len^2 %.3g); lookups n=%d, unique rows U=%d "
           "(largest group %d lookups, %d rows looked up once)\n",
           BT.nh, (double)BT.nh / BT.B, BT.max_len_seen, BT.sum_len2, BT.nlk, BT.U, BT.max_group, BT.singles);
    printf("timing: median of %d after %d warm-ups; measured in training (H200): history fwd %.1f ms, history bwd "
           "%.1f ms, embedding bwd %.1f ms\n",
           BN_REPS, BN_WARM, BN_MEASURED_MS[NB_SC_FWD_HIST], BN_MEASURED_MS[NB_SC_BWD_HIST],
           BN_MEASURED_MS[NB_SC_BWD_EMB]);
    fflush(stdout);
    for (int i = 0; i <= BN_MAXSEQ; i++) CUDA_CHECK(cudaEventCreate(&BEV[i]));
    CUDA_CHECK(cudaMalloc(&BFILL, BN_FILL_BYTES));
    for (PI = 0; PI < 2; PI++) {
        BE = PI == 0 ? &nb_backend_cuda_bf16 : &nb_backend_cuda_f32;
        CO = PI == 0 ? &nb_ctr_ops_cuda_bf16 : &nb_ctr_ops_cuda_f32;
        ES = nb_dtype_size(BE->act_dtype), LOWP = BE->act_dtype != NB_F32;
        if (PI == 0) bn_model(); /* the model's own phases: bf16 only (and the tensor table) */
        bn_alloc();
        build_ops();
        for (int ph = 0; ph < BN_EXTRA; ph++) { /* one pass: the saved activations become real ones */
            int list[BN_MAXSEQ], n = bn_seq(ph, list);
            bn_run_seq(list, n);
        }
        bn_sync();
        for (int ph = 0; ph < BN_NPH; ph++) bn_time_phase(ph);
        bn_free_all();
        printf("  %s done (%.0f s)\n", PI == 0 ? "bf16" : "fp32", nb_now() - t0);
        fflush(stdout);
    }
    bn_print();
    CUDA_CHECK(cudaFree(BFILL));
    for (int i = 0; i <= BN_MAXSEQ; i++) CUDA_CHECK(cudaEventDestroy(BEV[i]));
    free(BT.dense), free(BT.label), free(BT.cat), free(BT.target), free(BT.hist), free(BT.hist_len), free(BT.off);
    free(BT.order), free(BT.seg), free(BT.inverse), free(BT.rows), free(BT.dst), free(BT.src), free(BT.uniq);
}

#undef CX
#undef nB
#undef nE
#undef nH
#undef FIRST

int main(int argc, char **argv) {
    if (cuda_test_start()) return 77;
    gctx.stream = st;
    gctx.backend = cctx.backend = inst;
    if (argc > 1 && strcmp(argv[1], "--bench") == 0) {
        bench(argc - 2, argv + 2);
        CUDA_CHECK(cudaStreamDestroy(st));
        return 0;
    }
    double t0 = nb_now();
    RUN(test_emb_gather);
    RUN(test_emb_grad_unique);
    RUN(test_unique_groups);
    RUN(test_lists);
    RUN(test_device_count);
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
