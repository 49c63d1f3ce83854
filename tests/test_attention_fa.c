/* Tensor-core attention (src/ops/attention_fa.cu) against the CPU reference (attention.c).
 *
 * On a GPU, through the public bf16 launchers (ops_cuda.h), which dispatch to it for head sizes
 * 64 and 128:
 * - awkward shapes: T not a multiple of any tile (1, 16, 67, 130, 1029), GQA groups of 1, 2, 4, 8,
 *   B up to 4, a sharp softmax (inputs with std 3);
 * - outputs poisoned with NaN first (an element the kernels forget stays NaN and fails);
 * - bf16 inputs rounded the same on both sides; relative error <= 1e-2 for out and for each of
 *   dq, dk, dv (compared separately, so an error in one cannot hide in the others), <= 1e-4 for lse;
 * - the backward accumulates: dqkv starts from random values, increments are compared;
 * - determinism: two GPU runs from the same state are bitwise equal;
 * - dispatch: the launcher's result is bitwise the fast path's own (so the launcher uses it), and
 *   shapes the fast path refuses (HS 96, unaligned tensors) still work through the fallback.
 * Modes: --small (one small case: for compute-sanitizer), --bench (ms and TFLOP/s).
 *
 * Without a GPU (CI), or with --emu: the same kernel code, compiled here as C, runs on a CPU
 * emulator of the GPU features it uses (threads as coroutines, __syncthreads, shuffles, ldmatrix,
 * mma.sync, cp.async groups); see "CPU emulator" below. Same comparisons, on small shapes, and
 * every shape runs under two schedules that must give the same bits: one that delays async copies
 * to their wait, one that does them at once and runs warps far apart, so a missing barrier or
 * wait changes the result. --bench exits 77 (skipped) without a GPU. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#include "bf16_host.h"
#include "check.h"
#include "core.h"
#include "ops/ops.h"
#include "ops/ops_cuda.h"
#include "rng.h"

#ifdef NB_WITH_CUDA
#include <cuda_runtime.h>

#include "cuda_check.h"

/* attention_fa.cu (no header of its own yet): the fast path, callable directly. Each returns 1
 * if it took the call, 0 if the shape or alignment is not one it handles. */
int nb_cuda_attention_fa_forward_bf16(nb_bf16 *out, float *lse, const nb_bf16 *qkv, int B, int T, int NH,
                                      int NKV, int HS, nb_stream_t stream);
int nb_cuda_attention_fa_backward_bf16(nb_bf16 *dqkv, const nb_bf16 *dout, const nb_bf16 *qkv, const nb_bf16 *out,
                                       const float *lse, int B, int T, int NH, int NKV, int HS, nb_stream_t stream);
#endif

#define SEED 20250917u
#define TOL 1e-2
#define TOL_LSE 1e-4

static uint64_t next_stream = 1;
static double worst;

/* ---- host helpers ---- */

/* Normal values already rounded to bf16, so the CPU sees what the GPU sees. */
static float *randn_bf(size_t n, float std) {
    float *p = nb_malloc((n ? n : 1) * sizeof(float), "test tensor");
    nb_rng_fill_normal(p, n, SEED, next_stream++, 0.0f, std);
    for (size_t i = 0; i < n; i++) p[i] = bf2f(f2bf(p[i]));
    return p;
}

static float *zeros(size_t n) { return nb_calloc(n ? n : 1, sizeof(float), "test tensor"); }

static float *copy_of(const float *h, size_t n) {
    float *p = nb_malloc((n ? n : 1) * sizeof(float), "test tensor");
    memcpy(p, h, n * sizeof(float));
    return p;
}

static double rms(const float *x, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return n ? sqrt(s / n) : 0;
}

/* ---- comparisons ---- */

static void expect_close(const char *what, const float *got, const float *ref, size_t n, double tol) {
    double e = rel_err(got, ref, n);
    if (e > worst && isfinite(e) && tol == TOL) worst = e;
    printf("    %-58s rel err %.2e\n", what, e);
    CHECK(e <= tol, "%s: relative error %.3g > %.3g", what, e, tol);
}

static void expect_same(const char *what, const float *a, const float *b, size_t n) {
    CHECK(memcmp(a, b, n * sizeof(float)) == 0, "%s: results differ bitwise", what);
}

/* Increments (got - init, ref - init) of the q, k and v columns of dqkv, compared separately. */
static void expect_dqkv(const char *tag, const float *got, const float *ref, const float *init, int BT, int NH,
                        int NKV, int HS) {
    int R = (NH + 2 * NKV) * HS, c0[4] = {0, NH * HS, (NH + NKV) * HS, R};
    static const char *name[3] = {"dq", "dk", "dv"};
    for (int part = 0; part < 3; part++) {
        size_t w = (size_t)(c0[part + 1] - c0[part]), n = (size_t)BT * w;
        float *dg = zeros(n), *dr = zeros(n);
        for (size_t r = 0; r < (size_t)BT; r++)
            for (size_t c = 0; c < w; c++) {
                size_t i = r * R + c0[part] + c;
                dg[r * w + c] = got[i] - init[i];
                dr[r * w + c] = ref[i] - init[i];
            }
        char what[256];
        snprintf(what, sizeof what, "%s bwd %s", tag, name[part]);
        expect_close(what, dg, dr, n, TOL);
        free(dg), free(dr);
    }
}

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
    _Alignas(64) ucontext_t ctx; /* swapcontext saves FPU state into it with aligned stores */
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
    ucontext_t sched;
    void (*body)(void *);
    void *arg;
} emu;

static void emu_die(const char *what) {
    fprintf(stderr, "emulator: %s (block %d %d %d, thread %d)\n", what, emu.block.x, emu.block.y, emu.block.z,
            emu.cur ? emu.cur->tid.x : -1);
    abort();
}

static void emu_yield(void) { swapcontext(&emu.cur->ctx, &emu.sched); }

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
static void nb_mma_bf16(float c[4], const unsigned a[4], unsigned b0, unsigned b1) {
    emu_warp *w = &emu.warps[emu.cur->warp];
    int lane = emu.cur->lane;
    memcpy(w->a[lane], a, sizeof w->a[lane]);
    w->b[lane][0] = b0, w->b[lane][1] = b1;
    emu_warp_sync();
    float A[16][16], Bm[16][8];
    for (int l = 0; l < 32; l++) {
        int g = l >> 2, t = l & 3;
        for (int i = 0; i < 4; i++) {
            int row = g + 8 * (i & 1), col = 2 * t + 8 * (i >> 1);
            A[row][col] = emu_bf(w->a[l][i]), A[row][col + 1] = emu_bf(w->a[l][i] >> 16);
        }
        for (int i = 0; i < 2; i++) {
            Bm[2 * t + 8 * i][g] = emu_bf(w->b[l][i]), Bm[2 * t + 8 * i + 1][g] = emu_bf(w->b[l][i] >> 16);
        }
    }
    int g = lane >> 2, t = lane & 3;
    for (int e = 0; e < 4; e++) {
        int row = g + 8 * (e >> 1), col = 2 * t + (e & 1);
        float s = c[e];
        for (int k = 0; k < 16; k++) s += A[row][k] * Bm[k][col];
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
                    swapcontext(&emu.sched, &emu.threads[i].ctx);
                }
            } while (emu.progress != before);
        }
    } else {
        for (int i = 0; i < emu.nthreads; i++) {
            if (emu.threads[i].done) continue;
            emu.cur = &emu.threads[i];
            swapcontext(&emu.sched, &emu.threads[i].ctx);
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
                    NB_CHECK(getcontext(&t->ctx) == 0, "", "getcontext failed");
                    t->ctx.uc_stack.ss_sp = t->stack;
                    t->ctx.uc_stack.ss_size = EMU_STACK;
                    t->ctx.uc_link = &emu.sched;
                    makecontext(&t->ctx, emu_entry, 0);
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

/* Every compiled kernel at least once (the defaults on several shapes, others on one). */
TEST_CASE(test_emulated) {
    static const int shapes[][5] = {
        {1, 1, 2, 1, 64},  {1, 67, 4, 2, 64},  {2, 33, 3, 3, 64}, /* one token; GQA 2; two batches */
        {1, 130, 2, 1, 64}, {1, 67, 4, 2, 128}, {1, 150, 2, 1, 128},
    };
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int HS = shapes[s][4];
        emu_check(shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], HS, fa_find(0, HS, 0), fa_find(1, HS, 0),
                  fa_find(2, HS, 0));
    }
    for (int kind = 0; kind < 3; kind++)
        for (int HS = 64; HS <= 128; HS += 64)
            for (int v = 1; fa_find(kind, HS, v); v++)
                emu_check(1, 100, 4, 2, HS, fa_find(0, HS, kind == 0 ? v : 0), fa_find(1, HS, kind == 1 ? v : 0),
                          fa_find(2, HS, kind == 2 ? v : 0));
}

static int run_emulated(void) {
    double t0 = nb_now();
    printf("running the tensor-core kernels on the CPU emulator\n");
    RUN(test_emulated);
    printf("largest relative error %.2e (tol %.0e); %.1f s\n", worst, TOL, nb_now() - t0);
    for (int i = 0; i < emu.nalloc; i++) free(emu.threads[i].stack);
    free(emu.threads);
    TEST_EXIT();
}

/* ==== on the GPU ==== */
#ifdef NB_WITH_CUDA

static cudaStream_t st;

/* ---- device helpers ---- */

static void *up_bf(const float *h, size_t n) {
    uint16_t *t = nb_malloc((n ? n : 1) * 2, "bf16 staging");
    for (size_t i = 0; i < n; i++) t[i] = f2bf(h[i]);
    void *d = NULL;
    CUDA_CHECK(cudaMalloc(&d, (n ? n : 1) * 2));
    CUDA_CHECK(cudaMemcpy(d, t, n * 2, cudaMemcpyHostToDevice));
    free(t);
    return d;
}

static void *up_f32(const float *h, size_t n) {
    void *d = NULL;
    CUDA_CHECK(cudaMalloc(&d, (n ? n : 1) * 4));
    CUDA_CHECK(cudaMemcpy(d, h, n * 4, cudaMemcpyHostToDevice));
    return d;
}

/* All-ones bytes: NaN in both bf16 and fp32. */
static void *dev_nan(size_t bytes) {
    void *d = NULL;
    CUDA_CHECK(cudaMalloc(&d, bytes ? bytes : 1));
    CUDA_CHECK(cudaMemset(d, 0xff, bytes ? bytes : 1));
    return d;
}

static float *down_bf(const void *d, size_t n) {
    CUDA_CHECK(cudaStreamSynchronize(st));
    uint16_t *t = nb_malloc((n ? n : 1) * 2, "bf16 staging");
    CUDA_CHECK(cudaMemcpy(t, d, n * 2, cudaMemcpyDeviceToHost));
    float *h = zeros(n);
    for (size_t i = 0; i < n; i++) h[i] = bf2f(t[i]);
    free(t);
    return h;
}

static float *down_f32(const void *d, size_t n) {
    CUDA_CHECK(cudaStreamSynchronize(st));
    float *h = zeros(n);
    CUDA_CHECK(cudaMemcpy(h, d, n * 4, cudaMemcpyDeviceToHost));
    return h;
}

static void dev_free(void *d) {
    if (d) CUDA_CHECK(cudaFree(d));
}

/* ---- one shape: forward and backward against the CPU ---- */

static void check_shape(int B, int T, int NH, int NKV, int HS, float std) {
    int R = (NH + 2 * NKV) * HS;
    size_t nqkv = (size_t)B * T * R, no = (size_t)B * T * NH * HS, nl = (size_t)B * NH * T;
    char tag[96], what[160];
    snprintf(tag, sizeof tag, "B=%d T=%d NH=%d NKV=%d HS=%d std=%g", B, T, NH, NKV, HS, std);
    double t0 = nb_now();
    float *qkv = randn_bf(nqkv, std), *dout = randn_bf(no, 1.0f);
    float *rout = zeros(no), *rlse = zeros(nl);
    nb_attention_forward(rout, rlse, qkv, B, T, NH, NKV, HS);

    /* forward: the launcher twice, then the fast path directly */
    void *dq = up_bf(qkv, nqkv);
    float *out[3], *lse[3];
    for (int run = 0; run < 3; run++) {
        void *dout_ = dev_nan(no * 2), *dl = dev_nan(nl * 4);
        if (run < 2) nb_cuda_attention_forward_bf16(dout_, dl, dq, B, T, NH, NKV, HS, st);
        else CHECK(nb_cuda_attention_fa_forward_bf16(dout_, dl, dq, B, T, NH, NKV, HS, st) == 1,
                   "%s: the fast path refused a shape it has kernels for", tag);
        out[run] = down_bf(dout_, no), lse[run] = down_f32(dl, nl);
        dev_free(dout_), dev_free(dl);
    }
    snprintf(what, sizeof what, "%s fwd out", tag);
    expect_close(what, out[0], rout, no, TOL);
    snprintf(what, sizeof what, "%s fwd lse", tag);
    expect_close(what, lse[0], rlse, nl, TOL_LSE);
    expect_same("attention fwd out, two runs", out[0], out[1], no);
    expect_same("attention fwd lse, two runs", lse[0], lse[1], nl);
    expect_same("attention fwd out, launcher vs fast path (dispatch)", out[0], out[2], no);

    /* backward from the CPU's out (rounded to bf16) and lse, into a random starting dqkv */
    for (size_t i = 0; i < no; i++) rout[i] = bf2f(f2bf(rout[i]));
    float *g0 = zeros(nqkv);
    nb_attention_backward(g0, dout, qkv, rout, rlse, B, T, NH, NKV, HS);
    float *init = randn_bf(nqkv, (float)(rms(g0, nqkv) > 0 ? rms(g0, nqkv) : 1.0));
    float *rg = copy_of(init, nqkv);
    nb_attention_backward(rg, dout, qkv, rout, rlse, B, T, NH, NKV, HS);
    void *ddo = up_bf(dout, no), *dro = up_bf(rout, no), *dl = up_f32(rlse, nl);
    float *g[3];
    for (int run = 0; run < 3; run++) {
        void *gd = up_bf(init, nqkv);
        if (run < 2) nb_cuda_attention_backward_bf16(gd, ddo, dq, dro, dl, B, T, NH, NKV, HS, st);
        else CHECK(nb_cuda_attention_fa_backward_bf16(gd, ddo, dq, dro, dl, B, T, NH, NKV, HS, st) == 1,
                   "%s: the fast backward refused a shape it has kernels for", tag);
        g[run] = down_bf(gd, nqkv);
        dev_free(gd);
    }
    expect_dqkv(tag, g[0], rg, init, B * T, NH, NKV, HS);
    expect_same("attention bwd dqkv, two runs", g[0], g[1], nqkv);
    expect_same("attention bwd dqkv, launcher vs fast path (dispatch)", g[0], g[2], nqkv);
    printf("    (%.1f s)\n", nb_now() - t0);

    dev_free(dq), dev_free(ddo), dev_free(dro), dev_free(dl);
    free(qkv), free(dout), free(rout), free(rlse), free(g0), free(init), free(rg);
    for (int run = 0; run < 3; run++) free(out[run]), free(lse[run]), free(g[run]);
}

TEST_CASE(test_shapes) {
    check_shape(1, 1, 2, 1, 64, 1.0f);      /* one token */
    check_shape(2, 16, 2, 2, 128, 1.0f);    /* less than one tile */
    check_shape(2, 67, 12, 12, 64, 1.0f);   /* GPT-2 heads, T past a tile */
    check_shape(4, 130, 4, 2, 64, 1.0f);    /* GQA 2, B = 4 */
    check_shape(1, 67, 32, 8, 128, 1.0f);   /* Llama-like GQA 4, HS 128 */
    check_shape(1, 257, 8, 1, 64, 3.0f);    /* one kv head for 8, sharp softmax */
    check_shape(3, 1029, 12, 12, 64, 1.0f); /* long, T = 1024 + 5 */
    check_shape(2, 1029, 32, 8, 128, 1.0f);
}

/* Shapes the fast path refuses must still be right through the fallback kernels. */
TEST_CASE(test_fallback) {
    int B = 2, T = 45, NH = 4, NKV = 2, HS = 96;
    int R = (NH + 2 * NKV) * HS;
    size_t nqkv = (size_t)B * T * R, no = (size_t)B * T * NH * HS, nl = (size_t)B * NH * T;
    float *qkv = randn_bf(nqkv, 1.0f), *rout = zeros(no), *rlse = zeros(nl);
    nb_attention_forward(rout, rlse, qkv, B, T, NH, NKV, HS);
    void *dq = up_bf(qkv, nqkv), *dout_ = dev_nan(no * 2), *dl = dev_nan(nl * 4);
    CHECK(nb_cuda_attention_fa_forward_bf16(dout_, dl, dq, B, T, NH, NKV, HS, st) == 0,
          "HS 96 has no fast kernels, the fast path must refuse it");
    nb_cuda_attention_forward_bf16(dout_, dl, dq, B, T, NH, NKV, HS, st);
    float *out = down_bf(dout_, no);
    expect_close("fallback fwd out (HS=96)", out, rout, no, TOL);
    free(out);
    /* a qkv starting 2 bytes into an allocation: no 16-byte rows, so the fast path refuses */
    int HS2 = 64, R2 = (NH + 2 * NKV) * HS2;
    size_t n2 = (size_t)B * T * R2, no2 = (size_t)B * T * NH * HS2;
    float *q2 = randn_bf(n2, 1.0f), *r2 = zeros(no2), *l2 = zeros(nl);
    nb_attention_forward(r2, l2, q2, B, T, NH, NKV, HS2);
    float *q2s = zeros(n2 + 1);
    memcpy(q2s + 1, q2, n2 * sizeof(float));
    void *dq2 = up_bf(q2s, n2 + 1), *do2 = dev_nan(no2 * 2);
    nb_bf16 *q2off = (nb_bf16 *)dq2 + 1;
    CHECK(nb_cuda_attention_fa_forward_bf16(do2, dl, q2off, B, T, NH, NKV, HS2, st) == 0,
          "an unaligned qkv must be refused by the fast path");
    nb_cuda_attention_forward_bf16(do2, dl, q2off, B, T, NH, NKV, HS2, st);
    float *o2 = down_bf(do2, no2);
    expect_close("fallback fwd out (HS=64, qkv not 16-byte aligned)", o2, r2, no2, TOL);
    dev_free(dq), dev_free(dout_), dev_free(dl), dev_free(dq2), dev_free(do2);
    free(qkv), free(rout), free(rlse), free(q2), free(r2), free(l2), free(q2s), free(o2);
}

/* ---- timing ---- */

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

typedef struct {
    int B, T, NH, NKV, HS;
    void *qkv, *out, *lse, *dout, *dqkv;
} bench_case;

static void *dev_rand_bf16(size_t n, float scale, uint32_t seed) {
    uint16_t *h = nb_malloc(n * 2, "bench staging");
    uint32_t s = seed;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u; /* cheap LCG: random enough, fast for 100M+ elements */
        h[i] = f2bf(scale * ((float)(s >> 8) / 16777216.0f - 0.5f));
    }
    void *d = NULL;
    CUDA_CHECK(cudaMalloc(&d, n * 2));
    CUDA_CHECK(cudaMemcpy(d, h, n * 2, cudaMemcpyHostToDevice));
    free(h);
    return d;
}

static bench_case bench_make(int B, int T, int NH, int NKV, int HS) {
    bench_case c = {B, T, NH, NKV, HS, NULL, NULL, NULL, NULL, NULL};
    size_t nqkv = (size_t)B * T * (NH + 2 * NKV) * HS, no = (size_t)B * T * NH * HS;
    c.qkv = dev_rand_bf16(nqkv, 4.0f, 12345u); /* scores of std ~1: a realistic softmax */
    c.dout = dev_rand_bf16(no, 1.0f, 777u);
    c.dqkv = dev_rand_bf16(nqkv, 0.01f, 999u);
    CUDA_CHECK(cudaMalloc(&c.out, no * 2));
    CUDA_CHECK(cudaMalloc(&c.lse, (size_t)B * NH * T * 4));
    nb_cuda_attention_forward_bf16(c.out, c.lse, c.qkv, B, T, NH, NKV, HS, st);
    return c;
}

static void bench_free(bench_case *c) {
    dev_free(c->qkv), dev_free(c->out), dev_free(c->lse), dev_free(c->dout), dev_free(c->dqkv);
}

/* Median ms of `reps` runs (after 2 warm-ups) of the forward (bwd = 0) or the backward. */
static double bench_ms(bench_case *c, int bwd, int reps) {
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    float ms[32];
    if (reps > 32) reps = 32;
    for (int r = -2; r < reps; r++) {
        CUDA_CHECK(cudaEventRecord(e0, st));
        if (bwd)
            nb_cuda_attention_backward_bf16(c->dqkv, c->dout, c->qkv, c->out, c->lse, c->B, c->T, c->NH, c->NKV,
                                            c->HS, st);
        else nb_cuda_attention_forward_bf16(c->out, c->lse, c->qkv, c->B, c->T, c->NH, c->NKV, c->HS, st);
        CUDA_CHECK(cudaEventRecord(e1, st));
        CUDA_CHECK(cudaEventSynchronize(e1));
        if (r >= 0) CUDA_CHECK(cudaEventElapsedTime(&ms[r], e0, e1));
    }
    CUDA_CHECK(cudaEventDestroy(e0));
    CUDA_CHECK(cudaEventDestroy(e1));
    qsort(ms, reps, sizeof(float), cmp_float);
    return reps % 2 ? ms[reps / 2] : 0.5 * (ms[reps / 2 - 1] + ms[reps / 2]);
}

/* Causal attention FLOPs: QK^T and PV over half the T x T square. */
static double fwd_flop(const bench_case *c) { return 4.0 * c->B * c->NH * (double)c->T * c->T * c->HS / 2; }

static const int BENCH_SHAPES[][5] = {
    {16, 1024, 12, 12, 64}, /* GPT-2 124M heads */
    {64, 1024, 12, 12, 64}, /* the same at a training batch */
    {2, 2048, 32, 8, 64},   /* Llama-1B-like: dim 2048 / 32 heads, GQA 4 */
    {1, 4096, 32, 8, 128},  /* Llama-8B-like heads */
};
#define N_BENCH_SHAPES (int)(sizeof BENCH_SHAPES / sizeof BENCH_SHAPES[0])

static void bench(void) {
    printf("bf16 causal attention, median of 15; TFLOP/s from 4*B*NH*T*T*HS/2 (fwd), 2.5x that (bwd)\n");
    printf("  %-36s %10s %9s\n", "shape", "ms", "TFLOP/s");
    for (int s = 0; s < N_BENCH_SHAPES; s++) {
        const int *p = BENCH_SHAPES[s];
        bench_case c = bench_make(p[0], p[1], p[2], p[3], p[4]);
        for (int bwd = 0; bwd <= 1; bwd++) {
            double flop = fwd_flop(&c) * (bwd ? 2.5 : 1.0);
            double fast = bench_ms(&c, bwd, 15);
            char label[96];
            snprintf(label, sizeof label, "%s B=%d T=%d NH=%d NKV=%d HS=%d", bwd ? "bwd" : "fwd", p[0], p[1], p[2],
                     p[3], p[4]);
            printf("  %-36s %10.3f %9.1f\n", label, fast, flop / fast / 1e9);
        }
        bench_free(&c);
    }
}

static int run_gpu(const char *mode) {
    struct cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s (sm_%d%d), %d SMs\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
    CUDA_CHECK(cudaStreamCreate(&st));
    if (strcmp(mode, "--bench") == 0) {
        bench();
    } else if (strcmp(mode, "--small") == 0) {
        check_shape(1, 67, 4, 2, 64, 1.0f);
        check_shape(1, 67, 4, 2, 128, 1.0f);
    } else {
        double t0 = nb_now();
        RUN(test_shapes);
        RUN(test_fallback);
        printf("largest relative error %.2e (tol %.0e); %.1f s\n", worst, TOL, nb_now() - t0);
    }
    CUDA_CHECK(cudaStreamDestroy(st));
    TEST_EXIT();
}

#endif /* NB_WITH_CUDA */

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    if (strcmp(mode, "--emu") == 0) return run_emulated();
#ifdef NB_WITH_CUDA
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e == cudaSuccess && ndev > 0) return run_gpu(mode);
    printf("no CUDA device (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
#else
    printf("built without CUDA\n");
#endif
    if (mode[0]) {
        printf("skip: %s needs a GPU\n", mode);
        return 77;
    }
    return run_emulated();
}
