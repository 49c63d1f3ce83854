/* The emu rows of the seqctr kernels written in plain C (seqattn_tc.cu's tensor-core history
 * attention, embag.cu's two-pass embedding gradient) on a CPU emulator of the GPU, against the CPU
 * table (nb_ctr_ops_cpu): runs everywhere, GPU or not, so the kernels' indexing, fragment layouts
 * and chunk walk are checked in CI. (The same kernels on a real GPU: ctr_cuda*.c's rows, which
 * compare the CUDA tables with the CPU table.)
 *
 * The emulator (after emu_fa.c's): each GPU thread is a ucontext coroutine; warp
 * collectives (shuffles, ballot, mma.sync, movmatrix, __syncwarp) are barriers over the warp's
 * 32 threads that exchange operands through per-warp slots and compute what each lane receives
 * from the PTX ISA's fragment layouts; blocks run one at a time. Two schedules must give the same
 * bits: threads round-robin with blocks in order, and whole warps one at a time (a rotating
 * order) with blocks in reverse order, so a kernel that depends on how warps or blocks interleave
 * shows. Shared memory starts as NaN bytes.
 *
 * Checks: attention forward (out, lse) and backward (dq, dk, dv increments, compared separately)
 * within bf16's 1e-2 (lse 1e-4) of the fp32 CPU reference on bf16-rounded inputs, head sizes 16,
 * 32, 64, histories of length 0, 1, 15, 16, 17, 63..65, 100, 256 and past max_len, B = 1;
 * outputs poisoned with NaN; the backward accumulates (dqkv starts random). Embedding gradient:
 * the CPU table's bits exactly (fp32 and bf16 src), one row looked up 100k times among 5000 others,
 * E = 12, 64, 200 on unaligned source rows and 128 on aligned ones, two grid sizes, and a scratch
 * too small for the hot row (pass 2's own path) giving the same bits. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../bf16_host.h"
#include "core.h"
#include "ops/backend_ctr.h"
#include "ops/ops_ctr.h"
#include "ops/ops_cuda.h"
#include "emu_ctx.h"
#include "optest.h"
#include "rng.h"

#define SEED 20261219u
#define TOL 1e-2
#define TOL_LSE 1e-4


/* ==== the emulator ==== */

typedef struct {
    int x, y, z;
} emu_dim3;

#define EMU_STACK (256 * 1024)
#define EMU_MAX_THREADS 128

typedef struct {
    emu_ctx ctx;
    emu_dim3 tid;
    int done, warp, lane;
    char *stack;
} emu_thread;

typedef struct {
    int count, gen;
    unsigned u[32];
    long long ll[32];
    unsigned a[32][4], b[32][2];
} emu_warp;

static struct {
    emu_thread *cur, *threads;
    emu_warp *warps;
    int nthreads, nalloc, by_warp;
    long progress;
    emu_dim3 block, grid, block_dim;
    unsigned char *smem;
    size_t smem_bytes;
    emu_ctx sched;
    void (*body)(void *);
    void *arg;
} emu;

static void emu_die(const char *what) {
    fprintf(stderr, "emulator: %s (block %d, thread %d)\n", what, emu.block.x, emu.cur ? emu.cur->tid.x : -1);
    abort();
}

static void emu_yield(void) { emu_ctx_switch(&emu.cur->ctx, &emu.sched); }

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

static float emu_uint_as_float(unsigned u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static int emu_min(int a, int b) { return a < b ? a : b; }
static float emu_bf(unsigned bits16) { return emu_uint_as_float((bits16 & 0xffffu) << 16); }

/* mma.m16n8k16 row.col: A from a[0..3] (rows g, g+8; columns 2t, +1 and 2t+8, +9), B from b0
 * (rows 2t, +1 of column g) and b1 (rows 2t+8, +9); lane's c: rows g, g+8, columns 2t, +1. */
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

/* movmatrix.m8n8.trans.b16: lane l holds row l/4, columns 2(l%4), +1 of an 8x8 matrix; it gets
 * the same places of the transpose: M[2t][g] (low half) and M[2t+1][g]. */
static unsigned nb_movmatrix_trans(unsigned x) {
    emu_warp *w = &emu.warps[emu.cur->warp];
    int lane = emu.cur->lane, g = lane >> 2, t = lane & 3;
    w->u[lane] = x;
    emu_warp_sync();
    /* M[r][c] = half (c & 1) of lane 4r + c/2 */
    unsigned lo = (w->u[4 * (2 * t) + (g >> 1)] >> (16 * (g & 1))) & 0xffffu;
    unsigned hi = (w->u[4 * (2 * t + 1) + (g >> 1)] >> (16 * (g & 1))) & 0xffffu;
    emu_warp_sync();
    return lo | hi << 16;
}

static unsigned nb_pack_bf16x2(float lo, float hi) { return (unsigned)f2bf(lo) | (unsigned)f2bf(hi) << 16; }
static float nb_ex2(float x) { return exp2f(x); }

static unsigned emu_xchg(unsigned v, int src) {
    emu_warp *w = &emu.warps[emu.cur->warp];
    w->u[emu.cur->lane] = v;
    emu_warp_sync();
    unsigned r = w->u[src & 31];
    emu_warp_sync();
    return r;
}
static float nb_shfl_xor(float v, int m) {
    unsigned u;
    memcpy(&u, &v, 4);
    return emu_uint_as_float(emu_xchg(u, emu.cur->lane ^ m));
}
static float tc_shfl_f(float v, int src) {
    unsigned u;
    memcpy(&u, &v, 4);
    return emu_uint_as_float(emu_xchg(u, src));
}
static int tc_shfl_i(int v, int src) { return (int)emu_xchg((unsigned)v, src); }
static long long tc_shfl_ll(long long v, int src) {
    emu_warp *w = &emu.warps[emu.cur->warp];
    w->ll[emu.cur->lane] = v;
    emu_warp_sync();
    long long r = w->ll[src & 31];
    emu_warp_sync();
    return r;
}
static unsigned tc_ballot(int p) {
    emu_warp *w = &emu.warps[emu.cur->warp];
    w->u[emu.cur->lane] = p != 0;
    emu_warp_sync();
    unsigned m = 0;
    for (int l = 0; l < 32; l++) m |= w->u[l] << l;
    emu_warp_sync();
    return m;
}
static void tc_syncwarp(void) { emu_warp_sync(); }
static int tc_clz(unsigned x) { return x ? __builtin_clz(x) : 32; }

/* What the kernels see of CUDA. */
#undef __device__
#undef __global__
#undef __forceinline__
#define __device__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define TC_UNROLL
#define TC_UNROLL_N(n)
#define TC_SMEM(name) unsigned char *name = emu.smem
#define threadIdx (emu.cur->tid)
#define blockIdx (emu.block)
#define gridDim (emu.grid)
#define blockDim (emu.block_dim)
#define __uint_as_float emu_uint_as_float
#define min emu_min
/* CUDA's explicitly rounded float operations: IEEE's single operations on the host (C11 without
 * contraction: -std=c11 compiles a * b + c as two roundings) */
static float emu_fadd_rn(float a, float b) { return a + b; }
static float emu_fsub_rn(float a, float b) { return a - b; }
static float emu_fmul_rn(float a, float b) { return a * b; }
static float emu_fdiv_rn(float a, float b) { return a / b; }
static float emu_fsqrt_rn(float a) { return sqrtf(a); }
#define __fadd_rn emu_fadd_rn
#define __fsub_rn emu_fsub_rn
#define __fmul_rn emu_fmul_rn
#define __fdiv_rn emu_fdiv_rn
#define __fsqrt_rn emu_fsqrt_rn
#define CTR_TC_EMU 1
#include "ops/seqattn_tc.cu"
#include "ops/embag.cu"
#undef min

/* n bytes from `from` to `to`, the device's n-byte access at addr: aligned to n or an error */
static void emu_access(void *to, const void *from, size_t n, const void *addr) {
    if ((uintptr_t)addr & (n - 1))
        emu_die(n == 8 ? "8-byte access not 8-byte aligned" : "16-byte access not 16-byte aligned");
    memcpy(to, from, n);
}
static tc_u2 tc_ld8(const nb_bf16 *p) {
    tc_u2 r;
    emu_access(&r, p, 8, p);
    return r;
}
static void tc_st8(nb_bf16 *p, tc_u2 v) { emu_access(p, &v, 8, p); }
static tc_f4 tc_ld16f(const float *p) {
    tc_f4 r;
    emu_access(&r, p, 16, p);
    return r;
}
static void tc_st16f(float *p, tc_f4 v) { emu_access(p, &v, 16, p); }

static void emu_entry(void) {
    emu.body(emu.arg);
    emu.cur->done = 1;
    emu.progress++;
    emu_ctx_switch(&emu.cur->ctx, &emu.sched); /* done: never resumed */
}

static int emu_pass(unsigned *order) {
    int nw = (emu.nthreads + 31) / 32, alive = 0;
    if (emu.by_warp) {
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

/* body(arg) as a kernel of `blocks` blocks of `threads` (a multiple of 32), one block at a time. */
static void emu_launch(unsigned blocks, int threads, size_t smem, void (*body)(void *), void *arg) {
    NB_CHECK(threads <= EMU_MAX_THREADS && threads % 32 == 0, "", "%d threads per block", threads);
    if (!emu.threads) emu.threads = nb_aligned_alloc(EMU_MAX_THREADS * sizeof(emu_thread), "emulated threads");
    for (; emu.nalloc < threads; emu.nalloc++) emu.threads[emu.nalloc].stack = nb_malloc(EMU_STACK, "emulated stack");
    int nw = threads / 32;
    emu.warps = nb_malloc((size_t)nw * sizeof(emu_warp), "emulated warps");
    emu.smem_bytes = smem;
    emu.smem = smem ? nb_aligned_alloc(smem, "emulated shared memory") : NULL;
    emu.grid = (emu_dim3){(int)blocks, 1, 1};
    emu.block_dim = (emu_dim3){threads, 1, 1};
    emu.nthreads = threads, emu.body = body, emu.arg = arg;
    unsigned order = 12345u;
    for (unsigned i = 0; i < blocks; i++) {
        int bx = emu.by_warp ? (int)(blocks - 1 - i) : (int)i;
        emu.block = (emu_dim3){bx, 0, 0};
        if (smem) memset(emu.smem, 0xff, smem);
        memset(emu.warps, 0, (size_t)nw * sizeof(emu_warp));
        for (int t = 0; t < threads; t++) {
            emu_thread *th = &emu.threads[t];
            th->tid = (emu_dim3){t, 0, 0};
            th->done = 0, th->warp = t / 32, th->lane = t % 32;
            emu_ctx_make(&th->ctx, th->stack, EMU_STACK, emu_entry);
        }
        for (;;) {
            long before = emu.progress;
            if (!emu_pass(&order)) break;
            if (emu.progress == before) emu_die("deadlock: a collective some lanes never reach");
        }
    }
    free(emu.warps);
    free(emu.smem);
}

/* ==== host helpers ==== */

static float *randn_bf(size_t n, float std) {
    float *p = nb_malloc((n ? n : 1) * sizeof(float), "test tensor");
    nb_rng_fill_normal(p, n, SEED, ot_stream++, 0.0f, std);
    for (size_t i = 0; i < n; i++) p[i] = bf2f(f2bf(p[i]));
    return p;
}
static float *randn_f(size_t n, float std) {
    float *p = nb_malloc((n ? n : 1) * sizeof(float), "test tensor");
    nb_rng_fill_normal(p, n, SEED, ot_stream++, 0.0f, std);
    return p;
}
static float *zeros(size_t n) { return nb_calloc(n ? n : 1, sizeof(float), "test tensor"); }
static float *copy_of(const float *h, size_t n) {
    float *p = nb_malloc((n ? n : 1) * sizeof(float), "test tensor");
    memcpy(p, h, n * sizeof(float));
    return p;
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
static double rms(const float *x, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return n ? sqrt(s / n) : 0;
}

static void expect_close(const char *what, const float *got, const float *ref, size_t n, double tol) {
    double e = rel_err(got, ref, n);
    ot_err(e, tol);
    ot_log("    %-66s rel err %.2e\n", what, e);
    CHECK(e <= tol, "%s: relative error %.3g > %.3g", what, e, tol);
}
static void expect_same(const char *what, const void *a, const void *b, size_t bytes) {
    CHECK(memcmp(a, b, bytes) == 0, "%s: results differ bitwise", what);
}

/* ==== history self-attention ==== */

typedef struct {
    tc_sa_fwd_fn fwd;
    tc_sa_bwd_fn bwd;
    nb_bf16 *out, *dqkv;
    float *lse;
    const nb_bf16 *qkv, *dout, *o;
    const float *lse_in;
    const int32_t *off;
    tc_sa_dims a;
} sa_args;

static void sa_fwd_body(void *p) {
    sa_args *e = p;
    e->fwd(e->out, e->lse, e->qkv, e->off, e->a);
}
static void sa_bwd_body(void *p) {
    sa_args *e = p;
    e->bwd(e->dqkv, e->dout, e->qkv, e->o, e->lse_in, e->off, e->a);
}

/* Increments (got - init, ref - init) of the q, k or v columns of dqkv [nh, 3E]. */
static void expect_part(const char *tag, const char *name, int part, const float *got, const float *ref,
                        const float *init, int nh, int E) {
    size_t n = (size_t)nh * E;
    float *dg = zeros(n), *dr = zeros(n);
    for (size_t r = 0; r < (size_t)nh; r++)
        for (int c = 0; c < E; c++) {
            size_t i = r * 3 * E + (size_t)part * E + c;
            dg[r * E + c] = got[i] - init[i], dr[r * E + c] = ref[i] - init[i];
        }
    char what[200];
    snprintf(what, sizeof what, "%s bwd %s", tag, name);
    expect_close(what, dg, dr, n, TOL);
    free(dg), free(dr);
}

/* One case: lens[B] (the kernel gets max_len, which may be below the longest history). */
static void check_seqattn(const int *lens, int B, int max_len, int H, int E, float std) {
    int32_t *off = nb_malloc(((size_t)B + 1) * 4, "offsets");
    int longest = 0;
    off[0] = 0;
    for (int b = 0; b < B; b++) off[b + 1] = off[b] + lens[b], longest = lens[b] > longest ? lens[b] : longest;
    int nh = off[B];
    size_t nq = (size_t)nh * 3 * E, no = (size_t)nh * E, nl = (size_t)nh * H;
    char tag[160];
    snprintf(tag, sizeof tag, "B=%d nh=%d longest=%d max_len=%d H=%d HS=%d", B, nh, longest, max_len, H, E / H);
    float *qkv = randn_bf(nq, std), *dout = randn_bf(no, 1.0f), *rout = zeros(no), *rlse = zeros(nl);
    nb_ctr_ops_cpu.seqattn_fwd(NULL, rout, rlse, qkv, off, B, longest, H, E);
    float *rout_bf = copy_of(rout, no);
    for (size_t i = 0; i < no; i++) rout_bf[i] = bf2f(f2bf(rout_bf[i]));
    float *g0 = zeros(nq);
    nb_ctr_ops_cpu.seqattn_bwd(NULL, g0, dout, qkv, rout_bf, rlse, off, B, longest, H, E);
    float *init = randn_bf(nq, (float)(rms(g0, nq) > 0 ? rms(g0, nq) : 1.0)), *rg = copy_of(init, nq);
    nb_ctr_ops_cpu.seqattn_bwd(NULL, rg, dout, qkv, rout_bf, rlse, off, B, longest, H, E);

    sa_args e;
    memset(&e, 0, sizeof e);
    tc_sa_bwd_fn dq = NULL, dkv = NULL;
    NB_CHECK(tc_sa_kernels(E / H, &e.fwd, &dq, &dkv), "", "no kernels for HS %d", E / H);
    e.a = tc_sa_dims_of(max_len, H, E), e.off = off;
    nb_bf16 *q = to_bf(qkv, nq), *dy = to_bf(dout, no), *ro = to_bf(rout_bf, no);
    unsigned blocks = (unsigned)(B * e.a.nch);
    float *out[2], *lse[2], *g[2];
    for (int sched = 0; sched < 2; sched++) {
        emu.by_warp = sched;
        nb_bf16 *o = nb_malloc((no ? no : 1) * 2, "out"), *gd = to_bf(init, nq);
        memset(o, 0xff, no * 2); /* NaN: an element the kernel forgets shows */
        lse[sched] = zeros(nl);
        memset(lse[sched], 0xff, nl * 4);
        e.out = o, e.lse = lse[sched], e.qkv = q;
        emu_launch(blocks, 32 * TC_WARPS, 0, sa_fwd_body, &e);
        out[sched] = from_bf(o, no);
        /* the backward from the reference out and lse, as the GPU test does */
        e.dqkv = gd, e.dout = dy, e.o = ro, e.lse_in = rlse;
        e.bwd = dq;
        emu_launch(blocks, 32 * TC_WARPS, 0, sa_bwd_body, &e);
        e.bwd = dkv;
        emu_launch(blocks, 32 * TC_WARPS, 0, sa_bwd_body, &e);
        g[sched] = from_bf(gd, nq);
        free(o), free(gd);
    }
    char what[220];
    snprintf(what, sizeof what, "%s fwd out", tag);
    expect_close(what, out[0], rout, no, TOL);
    snprintf(what, sizeof what, "%s fwd lse", tag);
    expect_close(what, lse[0], rlse, nl, TOL_LSE);
    expect_part(tag, "dq", 0, g[0], rg, init, nh, E);
    expect_part(tag, "dk", 1, g[0], rg, init, nh, E);
    expect_part(tag, "dv", 2, g[0], rg, init, nh, E);
    expect_same("attention fwd out, two schedules", out[0], out[1], no * 4);
    expect_same("attention fwd lse, two schedules", lse[0], lse[1], nl * 4);
    expect_same("attention bwd dqkv, two schedules", g[0], g[1], nq * 4);
    free(qkv), free(dout), free(rout), free(rlse), free(rout_bf), free(g0), free(init), free(rg);
    free(q), free(dy), free(ro), free(off);
    for (int s = 0; s < 2; s++) free(out[s]), free(lse[s]), free(g[s]);
}

static void emu_free(void) {
    for (int i = 0; i < emu.nalloc; i++) free(emu.threads[i].stack);
    free(emu.threads);
    emu.threads = NULL, emu.nalloc = 0;
}

/* One attention case per row (arg: the case). */
static void emu_seqattn(void) {
    static const int one[] = {1}, odd[] = {0, 1, 15, 16, 17, 63, 64, 65, 100, 0, 3};
    static const int longh[] = {256, 5, 0, 129};
    switch (ot_cur->arg) {
    case 0: check_seqattn(one, 1, 1, 4, 64, 1.0f); break;      /* B = 1, one row */
    case 1: check_seqattn(odd, 11, 100, 4, 64, 1.5f); break;   /* the model's heads (HS 16), tile edges */
    case 2: check_seqattn(odd, 11, 100, 2, 64, 1.0f); break;   /* HS 32 */
    case 3: check_seqattn(odd, 11, 100, 2, 128, 1.0f); break;  /* HS 64 */
    case 4: check_seqattn(longh, 4, 256, 4, 64, 1.0f); break;  /* a max_len history, 129 = 2 chunks + 1 */
    case 5: check_seqattn(odd, 11, 40, 4, 64, 3.0f); break;    /* histories past max_len; sharp softmax */
    }
    emu_free();
}

/* ==== embedding gradient ==== */

typedef struct {
    float *dunique, *part;
    int cap, U, E, bf;
    const void *src;
    const int64_t *src_off;
    const int32_t *order, *seg;
    egu_upd up;
} egu_args;

static void egu_tiles_body(void *p) {
    egu_args *e = p;
    if (e->bf)
        egu_tiles_bf16(e->dunique, e->part, e->cap, e->src, e->src_off, e->order, e->seg, NULL, e->U, e->E, e->up);
    else
        egu_tiles_f32(e->dunique, e->part, e->cap, e->src, e->src_off, e->order, e->seg, NULL, e->U, e->E, e->up);
}
static void egu_finish_body(void *p) {
    egu_args *e = p;
    if (e->bf)
        egu_finish_bf16(e->dunique, e->part, e->cap, e->src, e->src_off, e->order, e->seg, NULL, e->U, e->E, e->up);
    else
        egu_finish_f32(e->dunique, e->part, e->cap, e->src, e->src_off, e->order, e->seg, NULL, e->U, e->E, e->up);
}

/* The launcher's two passes on the emulator (pass 1 with `blocks` blocks, scratch of cap slots);
 * with up.table, the fused Adagrad (the returned gradient then holds only what it left there). */
static float *emu_egu(const void *src, int bf, const int64_t *src_off, const int32_t *order, const int32_t *seg,
                      int U, int E, unsigned blocks, int cap, egu_upd up) {
    size_t nu = (size_t)U * E;
    float *d = zeros(nu), *part = nb_malloc((size_t)cap * E * 4, "chunk sums");
    memset(d, 0xff, nu * 4);
    memset(part, 0xff, (size_t)cap * E * 4);
    egu_args e = {d, part, cap, U, E, bf, src, src_off, order, seg, up};
    emu_launch(blocks, 32 * TC_WARPS, EGU_SMEM_BYTES, egu_tiles_body, &e);
    emu_launch(egu_finish_blocks(U), 32 * TC_WARPS, 0, egu_finish_body, &e);
    free(part);
    return d;
}

/* The fused gradient + element-wise Adagrad (emb_grad_adagrad) against the CPU's two in turn: the
 * table and its sums bit for bit, with a scratch big enough for the hot row's chunk sums and one
 * too small (pass 2 sums them itself). */
static void check_egu_adagrad(const void *s, int bf, const float *src, const int64_t *src_off, const int32_t *order,
                              const int32_t *seg, const int64_t *uniq, int U, int E) {
    size_t nt = (size_t)(uniq[U - 1] + 1) * E;
    float *t0 = randn_f(nt, 0.1f), *a0 = randn_f(nt, 1.0f), *scratch = zeros((size_t)U * E);
    for (size_t i = 0; i < nt; i++) a0[i] = fabsf(a0[i]);
    float *t1 = copy_of(t0, nt), *a1 = copy_of(a0, nt);
    const float lr = 0.05f, eps = 1e-8f;
    /* the CPU reads the fp32 copy of src (bf16: the same values) */
    nb_ctr_ops_cpu.emb_grad_adagrad(NULL, t1, a1, uniq, scratch, src, src_off, order, seg, NULL, U, seg[U], E, lr, eps);
    for (int small = 0; small <= 1; small++) {
        float *t = copy_of(t0, nt), *a = copy_of(a0, nt);
        egu_upd up = {t, a, uniq, lr, eps};
        free(emu_egu(s, bf, src_off, order, seg, U, E, 64, small ? 3 : egu_cap(seg[U], E), up));
        CHECK(memcmp(t, t1, nt * 4) == 0 && memcmp(a, a1, nt * 4) == 0,
              "emb_grad_adagrad %s E=%d U=%d%s: the table or its sums differ from the CPU's gradient then Adagrad",
              bf ? "bf16" : "f32", E, U, small ? " (scratch too small)" : "");
        free(t), free(a);
    }
    free(t0), free(a0), free(t1), free(a1), free(scratch);
}

/* n lookups of rows from rows_of(i); src rows at scattered offsets of a [n, E + 3] buffer, unaligned
 * (the four-column loads' other path), or of [n, E] (aligned: DLRM's gradient rows). */
static void check_egu(const char *name, const int64_t *rows, int n, int E, int aligned) {
    int ld = aligned ? E : E + 3;
    int64_t *src_off = nb_malloc((size_t)n * 8, "src_off"), *uniq = nb_malloc((size_t)n * 8, "uniq");
    int32_t *order = nb_malloc((size_t)n * 4, "order"), *inverse = nb_malloc((size_t)n * 4, "inverse");
    int32_t *seg = nb_malloc(((size_t)n + 1) * 4, "seg");
    for (int i = 0; i < n; i++) src_off[i] = (int64_t)(((long long)i * 7919) % n) * ld + (aligned ? 0 : i % 3);
    int U = nb_embag_unique_groups(uniq, order, seg, inverse, rows, n, NULL);
    int most = 0;
    for (int u = 0; u < U; u++) most = seg[u + 1] - seg[u] > most ? seg[u + 1] - seg[u] : most;
    size_t nsrc = (size_t)n * ld, nu = (size_t)U * E;
    for (int bf = 0; bf <= 1; bf++) {
        float *src = bf ? randn_bf(nsrc, 1.0f) : randn_f(nsrc, 1.0f), *ref = randn_f(nu, 1.0f); /* overwritten */
        nb_ctr_ops_cpu.emb_grad_unique(NULL, ref, src, src_off, order, seg, NULL, U, n, E);
        nb_bf16 *sb = bf ? to_bf(src, nsrc) : NULL;
        const void *s = bf ? (const void *)sb : (const void *)src;
        double t0 = nb_now();
        emu.by_warp = 0;
        egu_upd none = {0};
        float *a = emu_egu(s, bf, src_off, order, seg, U, E, 64, egu_cap(n, E), none);
        double t1 = nb_now();
        emu.by_warp = 1;
        float *b = emu_egu(s, bf, src_off, order, seg, U, E, 7, egu_cap(n, E), none); /* another grid */
        float *c = emu_egu(s, bf, src_off, order, seg, U, E, 64, 3, none);          /* scratch too small */
        char what[200];
        snprintf(what, sizeof what, "emb_grad_unique %s %s E=%d n=%d U=%d (largest row %d)", name, bf ? "bf16" : "f32",
                 E, n, U, most);
        int same = memcmp(a, ref, nu * 4) == 0;
        ot_log("    %-80s %s (%.1f s)\n", what, same ? "CPU's bits" : "DIFFERENT", t1 - t0);
        CHECK(same, "%s: differs from the CPU table (rel err %.3g)", what, rel_err(a, ref, nu));
        expect_same("emb_grad_unique: another grid and order of blocks", a, b, nu * 4);
        expect_same("emb_grad_unique: pass 2 summing chunks without slots", a, c, nu * 4);
        check_egu_adagrad(s, bf, src, src_off, order, seg, uniq, U, E);
        free(src), free(ref), free(sb), free(a), free(b), free(c);
    }
    free(src_off), free(uniq), free(order), free(inverse), free(seg);
}

/* One embedding-gradient case per row (arg: the case). */
static void emu_emb_grad(void) {
    uint64_t s = ot_stream++;
    int n = 3000;
    int64_t *rows = nb_malloc(200000 * 8, "rows");
    /* 40% on one row (10 chunks), a fifth rows of their own, the rest over 50 rows */
    for (int i = 0; i < n; i++)
        rows[i] = i % 5 < 2 ? 7 : i % 5 == 2 ? 1000 + i : (int64_t)(nb_philox(SEED, s, (uint64_t)i).v[0] % 50);
    switch (ot_cur->arg) {
    case 0: check_egu("mixed", rows, n, 64, 0); break;
    case 1: check_egu("mixed", rows, n, 12, 0); break;
    case 2: check_egu("mixed", rows, n, 200, 0); break;
    case 6: check_egu("mixed aligned", rows, n, 128, 1); break;
    case 3: /* one lookup */
        rows[0] = 5;
        check_egu("one", rows, 1, 64, 0);
        break;
    case 4: /* 129 lookups of one row (a chunk of one past the first) */
        for (int i = 0; i < 129; i++) rows[i] = 3;
        check_egu("129 of one", rows, 129, 64, 0);
        break;
    case 5: /* the hot row: 100k lookups of one row among 5000 rows looked up once, interleaved */
        n = 105000;
        for (int i = 0; i < n; i++) rows[i] = i % 21 == 5 ? 100000 + i : 42;
        check_egu("hot row", rows, n, 64, 0);
        break;
    }
    free(rows);
    emu_free();
}

#define SA_ROW(shape, arg, flags) {"seqattn_tc", "emu", OT_BF16, shape, TOL, OT_EVAL, emu_seqattn, arg, flags}
#define EGU_ROW(shape, arg, flags) {"emb_grad_unique", "emu", OT_BOTH, shape, 0, OT_EVAL, emu_emb_grad, arg, flags}
static const ot_row rows[] = {
    SA_ROW("B1 one row HS16", 0, OT_SMALL),
    SA_ROW("B11 lens 0..100 HS16 std 1.5", 1, 0),
    SA_ROW("B11 lens 0..100 HS32", 2, 0),
    SA_ROW("B11 lens 0..100 HS64", 3, 0),
    SA_ROW("B4 lens 256,5,0,129 HS16", 4, 0),
    SA_ROW("B11 past max_len 40 HS16 std 3", 5, 0),
    EGU_ROW("n3000 mixed E64", 0, 0),
    EGU_ROW("n3000 mixed E12", 1, OT_SMALL),
    EGU_ROW("n3000 mixed E200", 2, 0),
    EGU_ROW("n3000 mixed E128 aligned (DLRM's rows)", 6, 0),
    EGU_ROW("n1 E64", 3, 0),
    EGU_ROW("n129 of one row E64", 4, 0),
    EGU_ROW("hot row: 100k of one among 5000", 5, 0),
};
OT_TABLE(ot_emu_tc, rows);
