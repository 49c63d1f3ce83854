/* The emu rows of attention_fa.cu: its tensor-core kernels, compiled here as C, on a CPU emulator
 * of the GPU features they use (threads as coroutines, __syncthreads, shuffles, ldmatrix,
 * mma.sync, cp.async groups), against the CPU reference (attention.c) on bf16-rounded inputs:
 * out within 1e-2, lse 1e-4, dq, dk, dv (compared separately) 1e-2; outputs NaN-poisoned; the
 * backward accumulates (dqkv starts random) and its write mode (attention_bwd_set) from NaN is
 * bitwise the accumulating kernels' from zero. Every shape runs under two schedules that must
 * give the same bits: one that delays async copies to their wait, one that does them at once and
 * runs warps far apart, so a missing barrier or wait changes the result. Runs everywhere, GPU or
 * not (the same kernels on a GPU: attention_fa_cuda.c). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "ops/ops.h"
#include "ops/ops_cuda.h"
#include "rng.h"

#define SEED 20250917u
#define TOL 1e-2
#define TOL_LSE 1e-4
#include "attn_util.h"
#include "emu_ctx.h"

/* ==== CPU emulator ====
 * attention_fa.cu's kernels are plain C between its PTX primitives and its launchers; included
 * here with FA_EMU defined, they run on host versions of those primitives:
 * - each GPU thread is a ucontext coroutine; a round-robin scheduler resumes them;
 * - __syncthreads and the warp collectives are barriers (a thread yields until its block, or its
 *   warp, has arrived); a pass over all threads without progress is a deadlock (a barrier some
 *   thread never reaches) and aborts;
 * - shfl, ldmatrix and mma.sync exchange operands through per-warp slots and compute what each
 *   lane receives from the PTX ISA's fragment layouts (the layouts are the code under test);
 * - cp.async copies are queued per thread and done at wait_group ("lazy"), or done at once
 *   ("eager", with whole warps run one at a time in a rotating order): a kernel that reads a tile
 *   before waiting, or overwrites one before every warp is done with it, gives different bits
 *   under the two schedules;
 * - shared memory starts as 0xff bytes (bf16 NaN), so reading a byte nothing wrote shows. */

typedef struct {
    int x, y, z;
} emu_dim3;
typedef struct {
    unsigned x, y, z, w;
} emu_uint4;
typedef struct {
    void *dst;
    const void *src;
    int ok, group;
} emu_copy;

#define EMU_MAX_COPIES 512
#define EMU_STACK (256 * 1024)
#define EMU_MAX_THREADS 256

typedef struct {
    emu_ctx ctx;
    emu_dim3 tid;
    int done, warp, lane, groups, ncopies;
    emu_copy copies[EMU_MAX_COPIES];
    char *stack;
} emu_thread;

typedef struct {
    int count, gen;
    float fv[32];
    const void *addr[32];
    unsigned a[32][4], b[32][2];
} emu_warp;

static struct {
    emu_thread *cur, *threads;
    emu_warp *warps;
    int nthreads, nalloc, bar_count, bar_gen, eager;
    long progress;
    emu_dim3 block, grid, block_dim;
    unsigned char *smem;
    size_t smem_bytes;
    emu_ctx sched;
    void (*body)(void *);
    void *arg;
} emu;

static void emu_die(const char *what) {
    fprintf(stderr, "emulator: %s (block %d %d %d, thread %d)\n", what, emu.block.x, emu.block.y, emu.block.z,
            emu.cur ? emu.cur->tid.x : -1);
    abort();
}

static void emu_yield(void) { emu_ctx_switch(&emu.cur->ctx, &emu.sched); }

static void emu_syncthreads(void) {
    int g = emu.bar_gen;
    emu.progress++;
    if (++emu.bar_count == emu.nthreads) {
        emu.bar_count = 0;
        emu.bar_gen++;
    } else {
        while (emu.bar_gen == g) emu_yield();
    }
}

static void emu_warp_sync(void) {
    emu_warp *w = &emu.warps[emu.cur->warp];
    int g = w->gen;
    emu.progress++;
    if (++w->count == 32) {
        w->count = 0;
        w->gen++;
    } else {
        while (w->gen == g) emu_yield();
    }
}

static void emu_check_smem(const void *p) {
    const unsigned char *c = p;
    if (c < emu.smem || c + 16 > emu.smem + emu.smem_bytes) emu_die("shared memory access out of range");
    if ((size_t)(c - emu.smem) % 16) emu_die("16-byte shared memory access not 16-byte aligned");
}

static float emu_uint_as_float(unsigned u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static int emu_min(int a, int b) { return a < b ? a : b; }

static void emu_copy16(const emu_copy *c) {
    if (c->ok) memcpy(c->dst, c->src, 16);
    else memset(c->dst, 0, 16);
}

static void nb_cp_async16(void *dst, const void *src, int ok) {
    emu_check_smem(dst);
    emu_copy c = {dst, src, ok, emu.cur->groups};
    if (emu.eager) {
        emu_copy16(&c);
        return;
    }
    if (emu.cur->ncopies == EMU_MAX_COPIES) emu_die("too many cp.async in flight");
    emu.cur->copies[emu.cur->ncopies++] = c;
}

static void nb_cp_async_commit(void) { emu.cur->groups++; }

/* cp.async.wait_group 1: every committed group but the newest is complete. */
static void nb_cp_async_wait1(void) {
    emu_thread *t = emu.cur;
    int keep = 0;
    for (int i = 0; i < t->ncopies; i++) {
        if (t->copies[i].group < t->groups - 1) emu_copy16(&t->copies[i]);
        else t->copies[keep++] = t->copies[i];
    }
    t->ncopies = keep;
}

static uint16_t emu_ld16(const void *row, int col) {
    uint16_t v;
    memcpy(&v, (const unsigned char *)row + 2 * col, 2);
    return v;
}

/* ldmatrix .x4: matrix i's rows come from lanes 8i..8i+7; lane l receives row l/4, columns
 * 2(l%4), +1 of each (or, transposed, rows 2(l%4), +1 of column l/4). */
static void emu_ldmatrix(unsigned r[4], const void *p, int trans) {
    emu_warp *w = &emu.warps[emu.cur->warp];
    int lane = emu.cur->lane, g = lane >> 2, t = lane & 3;
    emu_check_smem(p);
    w->addr[lane] = p;
    emu_warp_sync();
    for (int i = 0; i < 4; i++) {
        const void *const *rows = &w->addr[8 * i];
        uint16_t lo = trans ? emu_ld16(rows[2 * t], g) : emu_ld16(rows[g], 2 * t);
        uint16_t hi = trans ? emu_ld16(rows[2 * t + 1], g) : emu_ld16(rows[g], 2 * t + 1);
        r[i] = (unsigned)lo | (unsigned)hi << 16;
    }
    emu_warp_sync();
}
static void nb_ldmatrix_x4(unsigned r[4], const void *p) { emu_ldmatrix(r, p, 0); }
static void nb_ldmatrix_x4_trans(unsigned r[4], const void *p) { emu_ldmatrix(r, p, 1); }

static float emu_bf(unsigned bits16) { return emu_uint_as_float((bits16 & 0xffffu) << 16); }

/* mma.m16n8k16 row.col: A 16x16 from a[0..3] (rows g, g+8; columns 2t, +1 and 2t+8, +9), B 16x8
 * from b0 (rows 2t, +1 of column g) and b1 (rows 2t+8, +9); lane's c: rows g, g+8, columns 2t, +1. */
/* A[row][k] and B[k][col] of the warp's operands, read from the lane that holds them (A: rows g,
 * g+8 in a[0], a[1], columns +8 in a[2], a[3]; B: rows 2t, +1 in b0, +8 in b1; column g). */
static float emu_mma_a(const emu_warp *w, int row, int k) {
    return emu_bf(w->a[(row & 7) * 4 + (k & 7) / 2][(row >> 3) + 2 * (k >> 3)] >> (16 * (k & 1)));
}
static float emu_mma_b(const emu_warp *w, int k, int col) {
    return emu_bf(w->b[col * 4 + (k & 7) / 2][k >> 3] >> (16 * (k & 1)));
}

static void nb_mma_bf16(float c[4], const unsigned a[4], unsigned b0, unsigned b1) {
    emu_warp *w = &emu.warps[emu.cur->warp];
    int lane = emu.cur->lane;
    memcpy(w->a[lane], a, sizeof w->a[lane]);
    w->b[lane][0] = b0, w->b[lane][1] = b1;
    emu_warp_sync();
    int g = lane >> 2, t = lane & 3;
    for (int e = 0; e < 4; e++) {
        int row = g + 8 * (e >> 1), col = 2 * t + (e & 1);
        float s = c[e];
        for (int k = 0; k < 16; k++) s += emu_mma_a(w, row, k) * emu_mma_b(w, k, col);
        c[e] = s;
    }
    emu_warp_sync();
}

static unsigned nb_pack_bf16x2(float lo, float hi) { return (unsigned)f2bf(lo) | (unsigned)f2bf(hi) << 16; }
static float nb_ex2(float x) { return exp2f(x); }

static float nb_shfl_xor(float v, int m) {
    emu_warp *w = &emu.warps[emu.cur->warp];
    int lane = emu.cur->lane;
    w->fv[lane] = v;
    emu_warp_sync();
    float r = w->fv[lane ^ m];
    emu_warp_sync();
    return r;
}

/* What the kernels see of CUDA. */
#undef __device__
#undef __global__
#undef __forceinline__
#define __device__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define FA_UNROLL
#define FA_SMEM(name) unsigned char *name = emu.smem
#define threadIdx (emu.cur->tid)
#define blockIdx (emu.block)
#define gridDim (emu.grid)
#define blockDim (emu.block_dim)
#define __syncthreads() emu_syncthreads()
#define __uint_as_float emu_uint_as_float
#define min emu_min
#define uint4 emu_uint4
#define FA_EMU 1
#include "ops/attention_fa.cu"
#undef min
#undef uint4

static void emu_entry(void) {
    emu.body(emu.arg);
    emu.cur->done = 1;
    emu.progress++;
    emu_ctx_switch(&emu.cur->ctx, &emu.sched); /* done: never resumed */
}

/* One pass of the scheduler; returns the number of threads still running. */
static int emu_pass(unsigned *order) {
    int nw = (emu.nthreads + 31) / 32, alive = 0;
    if (emu.eager) {
        /* whole warps, one at a time, each as far as it can go: warps drift apart */
        *order = *order * 1103515245u + 12345u;
        int first = (int)((*order >> 8) % (unsigned)nw);
        for (int k = 0; k < nw; k++) {
            int w = (first + k) % nw;
            long before;
            do {
                before = emu.progress;
                for (int i = 32 * w; i < 32 * w + 32 && i < emu.nthreads; i++) {
                    if (emu.threads[i].done) continue;
                    emu.cur = &emu.threads[i];
                    emu_ctx_switch(&emu.sched, &emu.threads[i].ctx);
                }
            } while (emu.progress != before);
        }
    } else {
        for (int i = 0; i < emu.nthreads; i++) {
            if (emu.threads[i].done) continue;
            emu.cur = &emu.threads[i];
            emu_ctx_switch(&emu.sched, &emu.threads[i].ctx);
        }
    }
    for (int i = 0; i < emu.nthreads; i++) alive += !emu.threads[i].done;
    emu.cur = NULL;
    return alive;
}

/* Runs body(arg) as a kernel over the whole grid, one block at a time. */
static void emu_launch(const fa_launch *l, void (*body)(void *), void *arg) {
    int n = (int)l->threads;
    NB_CHECK(n <= EMU_MAX_THREADS, "raise EMU_MAX_THREADS", "%d threads per block", n);
    if (!emu.threads) /* allocated once: a context must not move while it may be resumed */
        emu.threads = nb_aligned_alloc(EMU_MAX_THREADS * sizeof(emu_thread), "emulated threads");
    for (; emu.nalloc < n; emu.nalloc++) emu.threads[emu.nalloc].stack = nb_malloc(EMU_STACK, "emulated stack");
    emu.warps = nb_malloc((size_t)(n + 31) / 32 * sizeof(emu_warp), "emulated warps");
    emu.smem_bytes = l->smem;
    emu.smem = nb_aligned_alloc(l->smem, "emulated shared memory");
    emu.grid = (emu_dim3){(int)l->grid[0], (int)l->grid[1], (int)l->grid[2]};
    emu.block_dim = (emu_dim3){n, 1, 1};
    emu.nthreads = n, emu.body = body, emu.arg = arg;
    unsigned order = 12345u;
    for (int bz = 0; bz < emu.grid.z; bz++)
        for (int by = 0; by < emu.grid.y; by++)
            for (int bx = 0; bx < emu.grid.x; bx++) {
                emu.block = (emu_dim3){bx, by, bz};
                memset(emu.smem, 0xff, l->smem);
                memset(emu.warps, 0, (size_t)(n + 31) / 32 * sizeof(emu_warp));
                emu.bar_count = emu.bar_gen = 0;
                for (int i = 0; i < n; i++) {
                    emu_thread *t = &emu.threads[i];
                    t->tid = (emu_dim3){i, 0, 0};
                    t->done = 0, t->warp = i / 32, t->lane = i % 32, t->groups = 0, t->ncopies = 0;
                    emu_ctx_make(&t->ctx, t->stack, EMU_STACK, emu_entry);
                }
                for (;;) {
                    long before = emu.progress;
                    if (!emu_pass(&order)) break;
                    if (emu.progress == before) emu_die("deadlock: a barrier some threads never reach");
                }
            }
    free(emu.warps);
    free(emu.smem);
}

typedef struct {
    const fa_kernel *k;
    nb_bf16 *out, *dqkv;
    float *lse, *Dv;
    const nb_bf16 *qkv, *dout, *o;
    const float *lse_in;
    size_t nrows;
    fa_dims a;
    int T, NH, HS;
} emu_args;

static void emu_fwd_body(void *p) {
    emu_args *e = p;
    e->k->fwd(e->out, e->lse, e->qkv, e->a);
}
static void emu_bwd_body(void *p) {
    emu_args *e = p;
    e->k->bwd(e->dqkv, e->dout, e->qkv, e->lse_in, e->Dv, e->a);
}
static void emu_d_body(void *p) {
    emu_args *e = p;
    fa_d_kernel(e->Dv, e->dout, e->o, e->nrows, e->T, e->NH, e->HS);
}

static nb_bf16 *to_bf(const float *h, size_t n) {
    nb_bf16 *b = nb_malloc((n ? n : 1) * 2, "bf16 tensor");
    for (size_t i = 0; i < n; i++) b[i] = f2bf(h[i]);
    return b;
}

static float *from_bf(const nb_bf16 *b, size_t n) {
    float *h = zeros(n);
    for (size_t i = 0; i < n; i++) h[i] = bf2f(b[i]);
    return h;
}

/* The launchers' sequence (forward; D, dq, dk/dv) on the emulator, with kernels kf, kq, kk. */
static void emu_attention(float *out, float *lse, float *dqkv, const float *qkv, const float *dout,
                          const float *ref_out, const float *ref_lse, int B, int T, int NH, int NKV, int HS,
                          const fa_kernel *kf, const fa_kernel *kq, const fa_kernel *kk, int acc) {
    size_t nqkv = (size_t)B * T * (NH + 2 * NKV) * HS, no = (size_t)B * T * NH * HS, nl = (size_t)B * NH * T;
    emu_args e;
    memset(&e, 0, sizeof e);
    e.a = fa_dims_of(T, NH, NKV, HS), e.T = T, e.NH = NH, e.HS = HS, e.nrows = (size_t)B * T * NH;
    e.a.acc = acc;
    nb_bf16 *q = to_bf(qkv, nqkv), *o = nb_malloc(no * 2, "out"), *dy = to_bf(dout, no), *ro = to_bf(ref_out, no);
    nb_bf16 *g = to_bf(dqkv, nqkv);
    if (!acc) memset(g, 0xff, nqkv * 2); /* the write mode must store every element */
    memset(o, 0xff, no * 2); /* NaN: unwritten elements show */
    for (size_t i = 0; i < nl; i++) lse[i] = NAN;
    e.k = kf, e.out = o, e.lse = lse, e.qkv = q;
    fa_launch l = fa_launch_of(kf, B, T, NH, NKV);
    emu_launch(&l, emu_fwd_body, &e);
    float *of = from_bf(o, no);
    memcpy(out, of, no * sizeof(float));
    free(of);
    /* backward from the reference out and lse, as the GPU test does */
    e.Dv = nb_malloc(e.nrows * sizeof(float), "D"), e.dout = dy, e.o = ro, e.lse_in = ref_lse, e.dqkv = g;
    fa_launch ld = {{(unsigned)((e.nrows + FA_D_ROWS_PER_BLOCK - 1) / FA_D_ROWS_PER_BLOCK), 1, 1}, FA_D_THREADS, 0};
    emu_launch(&ld, emu_d_body, &e);
    const fa_kernel *bk[2] = {kq, kk};
    for (int i = 0; i < 2; i++) {
        e.k = bk[i];
        l = fa_launch_of(bk[i], B, T, NH, NKV);
        emu_launch(&l, emu_bwd_body, &e);
    }
    float *gf = from_bf(g, nqkv);
    memcpy(dqkv, gf, nqkv * sizeof(float));
    free(gf), free(q), free(o), free(dy), free(ro), free(g), free(e.Dv);
}

/* One shape with the given kernels, under both schedules: against the CPU, and bitwise equal. */
static void emu_check(int B, int T, int NH, int NKV, int HS, const fa_kernel *kf, const fa_kernel *kq,
                      const fa_kernel *kk) {
    int R = (NH + 2 * NKV) * HS;
    size_t nqkv = (size_t)B * T * R, no = (size_t)B * T * NH * HS, nl = (size_t)B * NH * T;
    char tag[160], what[200];
    snprintf(tag, sizeof tag, "emulated B=%d T=%d NH=%d NKV=%d HS=%d [%d.%d.%d/%d.%d.%d/%d.%d.%d]", B, T, NH, NKV, HS,
             kf->nw, kf->mt, kf->tile, kq->nw, kq->mt, kq->tile, kk->nw, kk->mt, kk->tile);
    float *qkv = randn_bf(nqkv, 1.0f), *dout = randn_bf(no, 1.0f), *rout32 = zeros(no), *rlse = zeros(nl);
    nb_attention_forward(rout32, rlse, qkv, B, T, NH, NKV, HS);
    float *rout = copy_of(rout32, no); /* the backward's input: rounded like the GPU's out */
    for (size_t i = 0; i < no; i++) rout[i] = bf2f(f2bf(rout[i]));
    float *g0 = zeros(nqkv);
    nb_attention_backward(g0, dout, qkv, rout, rlse, B, T, NH, NKV, HS);
    float *init = randn_bf(nqkv, (float)(rms(g0, nqkv) > 0 ? rms(g0, nqkv) : 1.0));
    float *rg = copy_of(init, nqkv);
    nb_attention_backward(rg, dout, qkv, rout, rlse, B, T, NH, NKV, HS);
    float *out[2], *lse[2], *g[2];
    for (int sched = 0; sched < 2; sched++) {
        emu.eager = sched;
        out[sched] = zeros(no), lse[sched] = zeros(nl), g[sched] = copy_of(init, nqkv);
        emu_attention(out[sched], lse[sched], g[sched], qkv, dout, rout, rlse, B, T, NH, NKV, HS, kf, kq, kk, 1);
    }
    /* the write mode (fa_dims.acc = 0, attention_bwd_set): from NaN, against the CPU from zero,
     * and bitwise the accumulating kernels' result from zero */
    float *gw = zeros(nqkv), *ga = zeros(nqkv), *zero = zeros(nqkv), *ow = zeros(no), *lw = zeros(nl);
    emu.eager = 0;
    emu_attention(ow, lw, gw, qkv, dout, rout, rlse, B, T, NH, NKV, HS, kf, kq, kk, 0);
    emu_attention(ow, lw, ga, qkv, dout, rout, rlse, B, T, NH, NKV, HS, kf, kq, kk, 1);
    snprintf(what, sizeof what, "%s (write mode)", tag);
    /* T = 1: dq and dk are exactly 0 on the CPU and ~1e-9 here (a relative error means nothing) */
    if (T > 1) expect_dqkv(what, gw, g0, zero, B * T, NH, NKV, HS);
    expect_same("emulated bwd dqkv, write mode vs accumulate from zero", gw, ga, nqkv);
    free(gw), free(ga), free(zero), free(ow), free(lw);
    snprintf(what, sizeof what, "%s fwd out", tag);
    expect_close(what, out[0], rout32, no, TOL);
    snprintf(what, sizeof what, "%s fwd lse", tag);
    expect_close(what, lse[0], rlse, nl, TOL_LSE);
    expect_dqkv(tag, g[0], rg, init, B * T, NH, NKV, HS);
    expect_same("emulated fwd out, lazy vs eager schedule", out[0], out[1], no);
    expect_same("emulated fwd lse, lazy vs eager schedule", lse[0], lse[1], nl);
    expect_same("emulated bwd dqkv, lazy vs eager schedule", g[0], g[1], nqkv);
    free(qkv), free(dout), free(rout), free(rlse), free(g0), free(init), free(rg), free(rout32);
    for (int s = 0; s < 2; s++) free(out[s]), free(lse[s]), free(g[s]);
}

static void emu_free(void) {
    for (int i = 0; i < emu.nalloc; i++) free(emu.threads[i].stack);
    free(emu.threads);
    emu.threads = NULL, emu.nalloc = 0;
}

/* The default kernels on one shape (row arg: the index in FA_SHAPES). */
static const int FA_SHAPES[][5] = {
    {1, 1, 2, 1, 64},  {1, 67, 4, 2, 64},  {2, 33, 3, 3, 64}, /* one token; GQA 2; two batches */
    {1, 130, 2, 1, 64}, {1, 67, 4, 2, 128}, {1, 150, 2, 1, 128},
};
static void emu_fa_shape(void) {
    const int *s = FA_SHAPES[ot_cur->arg];
    int HS = s[4];
    emu_check(s[0], s[1], s[2], s[3], HS, fa_find(0, HS, 0), fa_find(1, HS, 0), fa_find(2, HS, 0));
    emu_free();
}

/* Every other compiled kernel (forward, dq, dk/dv variants) once, at head size ot_cur->arg. */
static void emu_fa_variants(void) {
    int HS = ot_cur->arg;
    if (!fa_find(0, HS, 1) && !fa_find(1, HS, 1) && !fa_find(2, HS, 1)) ot_skip("no other variant compiled");
    for (int kind = 0; kind < 3; kind++)
        for (int v = 1; fa_find(kind, HS, v); v++)
            emu_check(1, 100, 4, 2, HS, fa_find(0, HS, kind == 0 ? v : 0), fa_find(1, HS, kind == 1 ? v : 0),
                      fa_find(2, HS, kind == 2 ? v : 0));
    emu_free();
}

#define FA_ROW(shape, arg, flags) {"attention_fa", "emu", OT_BF16, shape, TOL, OT_EVAL, emu_fa_shape, arg, flags}
static const ot_row rows[] = {
    FA_ROW("B1 T1 NH2 NKV1 HS64", 0, OT_SMALL),
    FA_ROW("B1 T67 NH4 NKV2 HS64", 1, 0),
    FA_ROW("B2 T33 NH3 NKV3 HS64", 2, 0),
    FA_ROW("B1 T130 NH2 NKV1 HS64", 3, 0),
    FA_ROW("B1 T67 NH4 NKV2 HS128", 4, 0),
    FA_ROW("B1 T150 NH2 NKV1 HS128", 5, 0),
    {"attention_fa_variants", "emu", OT_BF16, "B1 T100 NH4 NKV2 HS64", TOL, OT_EVAL, emu_fa_variants, 64, 0},
    {"attention_fa_variants", "emu", OT_BF16, "B1 T100 NH4 NKV2 HS128", TOL, OT_EVAL, emu_fa_variants, 128, 0},
};
OT_TABLE(ot_emu_fa, rows);
