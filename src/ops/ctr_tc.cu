/* Faster kernels for three of ctr.cu's ops (issue 19), drop-in behind ctr.cu's launchers
 * (NB_CTR_KERNELS=old, or nb_cuda_ctr_kernels_set(0), keeps the previous ones):
 *
 * 1. History self-attention over packed histories on tensor cores (bf16 table only; the fp32
 *    table keeps ctr.cu's exact CUDA-core kernels): a varlen flash attention with
 *    `mma.sync.m16n8k16` (bf16 in, fp32 accumulators) and an online softmax.
 * 2. emb_grad_unique in two passes, so that a row looked up 100k times is not one warp's serial
 *    chain: lookups are summed in chunks of NB_EMB_GRAD_CHUNK (backend_ctr.h's order), the chunks
 *    of one row by different warps, then each long row's chunk sums in chunk order.
 * 3. Target attention (bf16) a warp per sample instead of a block (see its section below).
 *
 * ---- attention ----
 * Work: a block of TC_WARPS warps takes one sample and one 64-row chunk of its rows (queries in
 * the forward and dq, keys in dk/dv; the last chunk of the grid takes every row past it, so a
 * history longer than max_len is still right); its warps take (head, 16-row tile) items in turn.
 * Each warp walks the other side's 16-row tiles of the sample on its own: no shared memory and no
 * barriers; the fragments come straight from global memory (L1 serves the other warps of the
 * sample), the next tile's loads issued before this tile's math.
 *
 * Fragment layout. A head's 16 columns of a row are 32 bytes (one sector). Thread (g = lane/4,
 * t = lane%4) loads 8 bytes, columns 4t..4t+3 of a 16-column chunk, of rows g and g+8 of a tile:
 * that is the mma A operand (and the B operand of a [n][k] product) for the column order
 * 0 1 4 5 8 9 12 13 | 2 3 6 7 10 11 14 15 (a0/a1: the lower 32 bits, a2/a3 the upper), and both
 * operands of a dot product over columns use it, so the product is the plain one. Where a product
 * needs the other orientation (P V, dS K, P^T dO, dS^T Q: B = rows [k][n]), movmatrix.trans turns
 * the same 32-bit words into it; the result's columns then come out as 4t..4t+3 again, so stores
 * are 8 bytes per row too.
 *
 * Forward per (head, query tile): S = Q K^T, running max m and sum l (exp2 with the scale folded
 * in), O += P V with P rounded to bf16 from the accumulators; out = O / l, lse = m*scale + log(l).
 * Backward (deterministic, no atomics; every dqkv element has one writer adding its terms in a
 * fixed order): P = exp(scale S - lse), dP = dO V^T, D = rowsum(dO * O), dS = P (dP - D);
 *   dq kernel:  per (head, query tile), walks the key tiles:  dQ += scale dS K;
 *   dkv kernel: per (head, key tile), walks the query tiles:  dV += P^T dO, dK += scale dS^T Q
 *               (D of the query tile computed again from dO and O: no nh-sized scratch, since
 *               the host does not know nh).
 * Masking: rows past the history load as zeros; keys past it get -inf scores (forward) or P = 0;
 * queries past it get lse = +inf (P = 0) and are never stored.
 *
 * ---- embedding gradient ----
 * Pass 1 (egu_tiles): the lookup positions k (0 .. n-1, n = seg[U] read on the device) in tiles of
 * EGU_TILE; a warp takes a tile and sums every chunk that starts in it (a chunk: up to
 * NB_EMB_GRAD_CHUNK consecutive lookups of one row, from the row's first lookup on), streaming
 * the positions 32 at a time: the 32 rows' columns come in with coalesced loads into the warp's
 * shared memory, then each lane adds its columns in k order. A row's first chunk sum goes to
 * dunique[u]; chunk j >= 1 (starting at k) to part[k / CHUNK], a slot no other chunk uses (the
 * row contains position (k / CHUNK) * CHUNK, and only one row does).
 * Pass 2 (egu_finish): a warp per 32 rows; each row with more than one chunk adds its chunk sums
 * to dunique[u] in chunk order. Slots past the scratch's capacity (only with far more lookups than
 * 64 per unique row) are summed by pass 2 itself, in the same order: same bits, slower.
 * The result depends only on the lookups (not on the grid), and equals the CPU table's.
 *
 * Everything between the primitives and the launchers is plain C, so tests/test_ctr_tc.c can
 * define CTR_TC_EMU, supply host versions of the primitives (a warp emulator) and run these
 * kernels on a machine without a GPU. */
#ifndef CTR_TC_EMU
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ops/backend_ctr.h"
#include "ops/ops_ctr_cuda.h"
#include "ops_cuda_common.cuh"
#define TC_UNROLL _Pragma("unroll")
#define TC_PRAGMA(x) _Pragma(#x)
#define TC_UNROLL_N(n) TC_PRAGMA(unroll n)
#define TC_SMEM(name) extern __shared__ __align__(16) unsigned char name[]
#endif

#define TC_WARPS 4      /* warps per block (both ops) */
#define TC_CHUNK_ROWS 64 /* attention rows (4 tiles of 16) per block */
#define TC_MAX_KC 4      /* 16-column chunks of a head: head sizes 16, 32, 64 */
#define TC_LOG2E 1.4426950408889634f

/* 8 bytes: four bf16 (x: elements 0, 1; y: 2, 3) */
typedef struct {
    unsigned x, y;
} tc_u2;
/* 16 bytes: eight bf16 */
typedef struct {
    unsigned x, y, z, w;
} tc_u4;

/* ---- primitives: the only PTX ---- */
#ifndef CTR_TC_EMU
/* c[16x8] += a[16x16] . b[16x8], fp32 accumulators. */
static __device__ __forceinline__ void tc_mma(float c[4], const unsigned a[4], unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
/* The warp's 8x8 bf16 matrix (lane l: row l/4, columns 2(l%4), +1), transposed, in that layout. */
static __device__ __forceinline__ unsigned tc_movt(unsigned x) {
    unsigned r;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(r) : "r"(x));
    return r;
}
/* Two floats -> bf16x2 (lo in the low half), round to nearest even like nb_st. */
static __device__ __forceinline__ unsigned tc_pack(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
/* 2^x; 2^-inf = 0. */
static __device__ __forceinline__ float tc_ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
static __device__ __forceinline__ float tc_shfl_xor(float v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
static __device__ __forceinline__ float tc_shfl_f(float v, int src) { return __shfl_sync(0xffffffffu, v, src); }
static __device__ __forceinline__ int tc_shfl_i(int v, int src) { return __shfl_sync(0xffffffffu, v, src); }
static __device__ __forceinline__ long long tc_shfl_ll(long long v, int src) {
    return __shfl_sync(0xffffffffu, v, src);
}
static __device__ __forceinline__ unsigned tc_ballot(int p) { return __ballot_sync(0xffffffffu, p); }
static __device__ __forceinline__ void tc_syncwarp(void) { __syncwarp(); }
static __device__ __forceinline__ int tc_clz(unsigned x) { return __clz(x); }
static __device__ __forceinline__ tc_u2 tc_ld8(const nb_bf16 *p) {
    uint2 u = *(const uint2 *)p;
    tc_u2 r = {u.x, u.y};
    return r;
}
static __device__ __forceinline__ void tc_st8(nb_bf16 *p, tc_u2 v) { *(uint2 *)p = make_uint2(v.x, v.y); }
static __device__ __forceinline__ tc_u4 tc_ld16(const nb_bf16 *p) {
    uint4 u = *(const uint4 *)p;
    tc_u4 r = {u.x, u.y, u.z, u.w};
    return r;
}
#else
/* the emulator defines these after including this file */
static tc_u2 tc_ld8(const nb_bf16 *p);
static void tc_st8(nb_bf16 *p, tc_u2 v);
static tc_u4 tc_ld16(const nb_bf16 *p);
#endif

static __device__ __forceinline__ float tc_lo(unsigned u) { return __uint_as_float(u << 16); }
static __device__ __forceinline__ float tc_hi(unsigned u) { return __uint_as_float(u & 0xffff0000u); }
static __device__ __forceinline__ float tc_bf(nb_bf16 h) { return __uint_as_float((unsigned)h << 16); }

/* 8 bytes at p, or zeros when !ok (p is not read) */
static __device__ __forceinline__ tc_u2 tc_ld8z(const nb_bf16 *p, int ok) {
    tc_u2 z = {0u, 0u};
    return ok ? tc_ld8(p) : z;
}
/* p[0..3] += (a, b, c, d): fp32 sums, bf16 storage (the bf16 ops' accumulate rule) */
static __device__ __forceinline__ void tc_add4(nb_bf16 *p, float a, float b, float c, float d) {
    tc_u2 u = tc_ld8(p), r;
    r.x = tc_pack(tc_lo(u.x) + a, tc_hi(u.x) + b);
    r.y = tc_pack(tc_lo(u.y) + c, tc_hi(u.y) + d);
    tc_st8(p, r);
}
/* The A operand of the next product from the accumulators of two 16x8 tiles (n-blocks 0, 1). */
static __device__ __forceinline__ void tc_acc_to_a(unsigned a[4], const float c0[4], const float c1[4]) {
    a[0] = tc_pack(c0[0], c0[1]);
    a[1] = tc_pack(c0[2], c0[3]);
    a[2] = tc_pack(c1[0], c1[1]);
    a[3] = tc_pack(c1[2], c1[3]);
}
/* dot of the thread's 4 columns of two rows (8 bytes each) */
static __device__ __forceinline__ float tc_dot4(tc_u2 a, tc_u2 b) {
    return tc_lo(a.x) * tc_lo(b.x) + tc_hi(a.x) * tc_hi(b.x) + tc_lo(a.y) * tc_lo(b.y) + tc_hi(a.y) * tc_hi(b.y);
}

/* ==== attention over packed histories ==== */

typedef struct {
    int H, E, nch;      /* nch: 64-row chunks per sample in the grid (the last takes the rest) */
    float scale, sl2;   /* 1/sqrt(HS), and scale * log2(e) */
} tc_sa_dims;

/* The block's sample b (rows start .. start+len-1) and its tiles t0 .. t0+nt-1; 0: no work. */
static __device__ __forceinline__ int tc_sa_block(const int32_t *off, int nch, int *start, int *len, int *t0,
                                                  int *nt) {
    const int b = blockIdx.x / nch, ch = blockIdx.x % nch;
    const int s = off[b], l = off[b + 1] - s;
    const int ntiles = l > 0 ? (l + 15) / 16 : 0, first = 4 * ch;
    if (first >= ntiles) return 0;
    *start = s, *len = l, *t0 = first;
    *nt = ch == nch - 1 ? ntiles - first : min(4, ntiles - first);
    return 1;
}

/* The A operand of rows r0 + g, r0 + g + 8 (16-column chunks kc) from a matrix with row pitch ld
 * whose row 0 column 4t of the head is p; rows >= len are zeros. */
static __device__ __forceinline__ void tc_load_a(unsigned f[TC_MAX_KC][4], const nb_bf16 *p, size_t ld, int r0,
                                                 int len, int g, const int KC) {
    const int ra = r0 + g, rb = r0 + g + 8;
    TC_UNROLL
    for (int kc = 0; kc < KC; kc++) {
        tc_u2 x = tc_ld8z(p + (size_t)ra * ld + 16 * kc, ra < len), y = tc_ld8z(p + (size_t)rb * ld + 16 * kc, rb < len);
        f[kc][0] = x.x, f[kc][1] = y.x, f[kc][2] = x.y, f[kc][3] = y.y;
    }
}
/* Rows r0 + g (w[0]) and r0 + 8 + g (w[1]) of a tile, 8 bytes per chunk; rows >= len zero. */
static __device__ __forceinline__ void tc_load_rows(tc_u2 w[2][TC_MAX_KC], const nb_bf16 *p, size_t ld, int r0,
                                                    int len, int g, const int KC) {
    TC_UNROLL
    for (int j = 0; j < 2; j++) {
        const int r = r0 + 8 * j + g;
        TC_UNROLL
        for (int kc = 0; kc < KC; kc++) w[j][kc] = tc_ld8z(p + (size_t)r * ld + 16 * kc, r < len);
    }
}
static __device__ __forceinline__ void tc_zero_acc(float c[TC_MAX_KC][2][4], const int KC) {
    TC_UNROLL
    for (int kc = 0; kc < KC; kc++)
        TC_UNROLL
        for (int hf = 0; hf < 2; hf++) c[kc][hf][0] = c[kc][hf][1] = c[kc][hf][2] = c[kc][hf][3] = 0.0f;
}
/* s[j] (16 x 8, n-block j) = A . rows^T over the head's columns: B from natural rows. */
static __device__ __forceinline__ void tc_qk(float s[2][4], const unsigned a[TC_MAX_KC][4], const tc_u2 w[2][TC_MAX_KC],
                                             const int KC) {
    TC_UNROLL
    for (int j = 0; j < 2; j++) {
        s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
        TC_UNROLL
        for (int kc = 0; kc < KC; kc++) tc_mma(s[j], a[kc], w[j][kc].x, w[j][kc].y);
    }
}
/* c += A . rows, rows [k = 16 rows][n = the head's columns] (B through movmatrix.trans). */
static __device__ __forceinline__ void tc_pv(float c[TC_MAX_KC][2][4], const unsigned a[4], const tc_u2 w[2][TC_MAX_KC],
                                             const int KC) {
    TC_UNROLL
    for (int kc = 0; kc < KC; kc++) {
        tc_mma(c[kc][0], a, tc_movt(w[0][kc].x), tc_movt(w[1][kc].x));
        tc_mma(c[kc][1], a, tc_movt(w[0][kc].y), tc_movt(w[1][kc].y));
    }
}
/* rows r0 + g (i = 0) and r0 + g + 8 (i = 1) of p (pitch ld) += f * c, for rows < len */
static __device__ __forceinline__ void tc_store_add(nb_bf16 *p, size_t ld, int r0, int len, int g, float f,
                                                    const float c[TC_MAX_KC][2][4], const int KC) {
    TC_UNROLL
    for (int i = 0; i < 2; i++) {
        const int r = r0 + g + 8 * i;
        if (r < len)
            TC_UNROLL
            for (int kc = 0; kc < KC; kc++)
                tc_add4(p + (size_t)r * ld + 16 * kc, f * c[kc][0][2 * i], f * c[kc][0][2 * i + 1], f * c[kc][1][2 * i],
                        f * c[kc][1][2 * i + 1]);
    }
}

static __device__ __forceinline__ void tc_sa_fwd(nb_bf16 *out, float *lse, const nb_bf16 *qkv, const int32_t *off,
                                                 tc_sa_dims a, const int HS) {
    int start, len, t0, nt;
    if (!tc_sa_block(off, a.nch, &start, &len, &t0, &nt)) return;
    const int KC = HS / 16, E = a.E, H = a.H, nkt = (len + 15) / 16;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const size_t ld = 3 * (size_t)E;
    for (int it = warp; it < nt * H; it += TC_WARPS) {
        const int h = it / nt, i0 = 16 * (t0 + it % nt);
        const nb_bf16 *qh = qkv + (size_t)start * ld + (size_t)h * HS + 4 * t4, *kh = qh + E, *vh = qh + 2 * E;
        unsigned qf[TC_MAX_KC][4];
        tc_load_a(qf, qh, ld, i0, len, g, KC);
        float o[TC_MAX_KC][2][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
        tc_zero_acc(o, KC);
        tc_u2 kn[2][TC_MAX_KC], vn[2][TC_MAX_KC];
        tc_load_rows(kn, kh, ld, 0, len, g, KC);
        tc_load_rows(vn, vh, ld, 0, len, g, KC);
        for (int kt = 0; kt < nkt; kt++) {
            const int k0 = 16 * kt;
            tc_u2 kr[2][TC_MAX_KC], vr[2][TC_MAX_KC];
            TC_UNROLL
            for (int j = 0; j < 2; j++)
                TC_UNROLL
                for (int kc = 0; kc < KC; kc++) kr[j][kc] = kn[j][kc], vr[j][kc] = vn[j][kc];
            if (kt + 1 < nkt) { /* the next tile's loads fly during this tile's math */
                tc_load_rows(kn, kh, ld, k0 + 16, len, g, KC);
                tc_load_rows(vn, vh, ld, k0 + 16, len, g, KC);
            }
            float s[2][4];
            tc_qk(s, qf, kr, KC);
            if (k0 + 16 > len) /* keys past the history (warp-uniform test) */
                TC_UNROLL
                for (int j = 0; j < 2; j++)
                    TC_UNROLL
                    for (int e = 0; e < 4; e++)
                        if (k0 + 8 * j + 2 * t4 + (e & 1) >= len) s[j][e] = -INFINITY;
            /* online softmax; every tile has a visible key (k0 < len), so the max is finite */
            float mx[2], c[2], ms[2], ps[2] = {0.0f, 0.0f};
            mx[0] = fmaxf(fmaxf(s[0][0], s[0][1]), fmaxf(s[1][0], s[1][1]));
            mx[1] = fmaxf(fmaxf(s[0][2], s[0][3]), fmaxf(s[1][2], s[1][3]));
            TC_UNROLL
            for (int r = 0; r < 2; r++) { /* the 4 lanes of a quad hold one row */
                mx[r] = fmaxf(mx[r], tc_shfl_xor(mx[r], 1));
                mx[r] = fmaxf(mx[r], tc_shfl_xor(mx[r], 2));
                mx[r] = fmaxf(mx[r], m[r]);
                ms[r] = mx[r] * a.sl2;
                c[r] = tc_ex2(m[r] * a.sl2 - ms[r]); /* 0 on the first tile (m = -inf) */
                m[r] = mx[r];
            }
            TC_UNROLL
            for (int j = 0; j < 2; j++)
                TC_UNROLL
                for (int e = 0; e < 4; e++) {
                    s[j][e] = tc_ex2(fmaf(s[j][e], a.sl2, -ms[e >> 1]));
                    ps[e >> 1] += s[j][e];
                }
            /* l stays a per-lane partial sum (the quad's lanes scale by the same c) */
            l[0] = l[0] * c[0] + ps[0];
            l[1] = l[1] * c[1] + ps[1];
            TC_UNROLL
            for (int kc = 0; kc < KC; kc++)
                TC_UNROLL
                for (int hf = 0; hf < 2; hf++)
                    TC_UNROLL
                    for (int e = 0; e < 4; e++) o[kc][hf][e] *= c[e >> 1];
            unsigned pa[4];
            tc_acc_to_a(pa, s[0], s[1]);
            tc_pv(o, pa, vr, KC);
        }
        TC_UNROLL
        for (int i = 0; i < 2; i++) {
            const int r = i0 + g + 8 * i;
            float li = l[i];
            li += tc_shfl_xor(li, 1);
            li += tc_shfl_xor(li, 2);
            const float inv = 1.0f / li;
            if (r < len) {
                nb_bf16 *orow = out + (size_t)(start + r) * E + (size_t)h * HS + 4 * t4;
                TC_UNROLL
                for (int kc = 0; kc < KC; kc++) {
                    tc_u2 v;
                    v.x = tc_pack(o[kc][0][2 * i] * inv, o[kc][0][2 * i + 1] * inv);
                    v.y = tc_pack(o[kc][1][2 * i] * inv, o[kc][1][2 * i + 1] * inv);
                    tc_st8(orow + 16 * kc, v);
                }
                if (t4 == 0) lse[(size_t)start * H + (size_t)h * len + r] = m[i] * a.scale + logf(li);
            }
        }
    }
}

/* dq of one block's query tiles: per (head, query tile), over the sample's key tiles. */
static __device__ __forceinline__ void tc_sa_dq(nb_bf16 *dqkv, const nb_bf16 *dout, const nb_bf16 *qkv,
                                                const nb_bf16 *out, const float *lse, const int32_t *off,
                                                tc_sa_dims a, const int HS) {
    int start, len, t0, nt;
    if (!tc_sa_block(off, a.nch, &start, &len, &t0, &nt)) return;
    const int KC = HS / 16, E = a.E, H = a.H, nkt = (len + 15) / 16;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const size_t ld = 3 * (size_t)E;
    for (int it = warp; it < nt * H; it += TC_WARPS) {
        const int h = it / nt, i0 = 16 * (t0 + it % nt);
        const size_t hc = (size_t)h * HS + 4 * t4;
        const nb_bf16 *qh = qkv + (size_t)start * ld + hc, *kh = qh + E, *vh = qh + 2 * E;
        const nb_bf16 *gh = dout + (size_t)start * E + hc, *oh = out + (size_t)start * E + hc;
        unsigned qf[TC_MAX_KC][4], df[TC_MAX_KC][4];
        tc_load_a(qf, qh, ld, i0, len, g, KC);
        tc_load_a(df, gh, E, i0, len, g, KC);
        /* D = dO . O and lse (as log2) of rows i0 + g (+ 8); +inf lse past the history: P = 0 */
        float D[2], L[2];
        TC_UNROLL
        for (int i = 0; i < 2; i++) {
            const int r = i0 + g + 8 * i;
            float d = 0.0f;
            TC_UNROLL
            for (int kc = 0; kc < KC; kc++) {
                tc_u2 dv, ov;
                dv.x = df[kc][i], dv.y = df[kc][2 + i];
                ov = tc_ld8z(oh + (size_t)r * E + 16 * kc, r < len);
                d += tc_dot4(dv, ov);
            }
            d += tc_shfl_xor(d, 1);
            d += tc_shfl_xor(d, 2);
            D[i] = d;
            L[i] = r < len ? lse[(size_t)start * H + (size_t)h * len + r] * TC_LOG2E : INFINITY;
        }
        float dq[TC_MAX_KC][2][4];
        tc_zero_acc(dq, KC);
        tc_u2 kn[2][TC_MAX_KC], vn[2][TC_MAX_KC];
        tc_load_rows(kn, kh, ld, 0, len, g, KC);
        tc_load_rows(vn, vh, ld, 0, len, g, KC);
        for (int kt = 0; kt < nkt; kt++) {
            const int k0 = 16 * kt;
            tc_u2 kr[2][TC_MAX_KC], vr[2][TC_MAX_KC];
            TC_UNROLL
            for (int j = 0; j < 2; j++)
                TC_UNROLL
                for (int kc = 0; kc < KC; kc++) kr[j][kc] = kn[j][kc], vr[j][kc] = vn[j][kc];
            if (kt + 1 < nkt) {
                tc_load_rows(kn, kh, ld, k0 + 16, len, g, KC);
                tc_load_rows(vn, vh, ld, k0 + 16, len, g, KC);
            }
            float s[2][4], dp[2][4];
            tc_qk(s, qf, kr, KC);
            tc_qk(dp, df, vr, KC);
            TC_UNROLL
            for (int j = 0; j < 2; j++)
                TC_UNROLL
                for (int e = 0; e < 4; e++) {
                    float p = tc_ex2(fmaf(s[j][e], a.sl2, -L[e >> 1]));
                    if (k0 + 8 * j + 2 * t4 + (e & 1) >= len) p = 0.0f;
                    s[j][e] = p * (dp[j][e] - D[e >> 1]); /* dS */
                }
            unsigned da[4];
            tc_acc_to_a(da, s[0], s[1]);
            tc_pv(dq, da, kr, KC);
        }
        tc_store_add(dqkv + (size_t)start * ld + hc, ld, i0, len, g, a.scale, dq, KC);
    }
}

/* dk, dv of one block's key tiles: per (head, key tile), over the sample's query tiles. */
static __device__ __forceinline__ void tc_sa_dkv(nb_bf16 *dqkv, const nb_bf16 *dout, const nb_bf16 *qkv,
                                                 const nb_bf16 *out, const float *lse, const int32_t *off,
                                                 tc_sa_dims a, const int HS) {
    int start, len, t0, nt;
    if (!tc_sa_block(off, a.nch, &start, &len, &t0, &nt)) return;
    const int KC = HS / 16, E = a.E, H = a.H, nqt = (len + 15) / 16;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const size_t ld = 3 * (size_t)E;
    for (int it = warp; it < nt * H; it += TC_WARPS) {
        const int h = it / nt, j0 = 16 * (t0 + it % nt);
        const size_t hc = (size_t)h * HS + 4 * t4;
        const nb_bf16 *qh = qkv + (size_t)start * ld + hc, *kh = qh + E, *vh = qh + 2 * E;
        const nb_bf16 *gh = dout + (size_t)start * E + hc, *oh = out + (size_t)start * E + hc;
        const float *lh = lse + (size_t)start * H + (size_t)h * len;
        unsigned kf[TC_MAX_KC][4], vf[TC_MAX_KC][4];
        tc_load_a(kf, kh, ld, j0, len, g, KC);
        tc_load_a(vf, vh, ld, j0, len, g, KC);
        float dk[TC_MAX_KC][2][4], dv[TC_MAX_KC][2][4];
        tc_zero_acc(dk, KC);
        tc_zero_acc(dv, KC);
        tc_u2 qn[2][TC_MAX_KC], gn[2][TC_MAX_KC], on[2][TC_MAX_KC];
        tc_load_rows(qn, qh, ld, 0, len, g, KC);
        tc_load_rows(gn, gh, E, 0, len, g, KC);
        tc_load_rows(on, oh, E, 0, len, g, KC);
        for (int qt = 0; qt < nqt; qt++) {
            const int q0 = 16 * qt;
            tc_u2 qr[2][TC_MAX_KC], gr[2][TC_MAX_KC], orr[2][TC_MAX_KC];
            TC_UNROLL
            for (int j = 0; j < 2; j++)
                TC_UNROLL
                for (int kc = 0; kc < KC; kc++) qr[j][kc] = qn[j][kc], gr[j][kc] = gn[j][kc], orr[j][kc] = on[j][kc];
            if (qt + 1 < nqt) {
                tc_load_rows(qn, qh, ld, q0 + 16, len, g, KC);
                tc_load_rows(gn, gh, E, q0 + 16, len, g, KC);
                tc_load_rows(on, oh, E, q0 + 16, len, g, KC);
            }
            /* lse (log2) and D of the queries this thread's accumulators hold: q0 + 8j + 2t + b.
             * D of row q0 + 8j + g comes from the quad g; lane 4 q' holds query q' of the block. */
            float L[2][2], Dq[2][2];
            TC_UNROLL
            for (int j = 0; j < 2; j++) {
                float d = 0.0f;
                TC_UNROLL
                for (int kc = 0; kc < KC; kc++) d += tc_dot4(gr[j][kc], orr[j][kc]);
                d += tc_shfl_xor(d, 1);
                d += tc_shfl_xor(d, 2);
                TC_UNROLL
                for (int bb = 0; bb < 2; bb++) {
                    const int q = q0 + 8 * j + 2 * t4 + bb;
                    Dq[j][bb] = tc_shfl_f(d, 4 * (2 * t4 + bb));
                    L[j][bb] = q < len ? lh[q] * TC_LOG2E : INFINITY;
                }
            }
            float st[2][4], dpt[2][4]; /* S^T = K Q^T, dP^T = V dO^T */
            tc_qk(st, kf, qr, KC);
            tc_qk(dpt, vf, gr, KC);
            TC_UNROLL
            for (int j = 0; j < 2; j++)
                TC_UNROLL
                for (int e = 0; e < 4; e++) {
                    const float p = tc_ex2(fmaf(st[j][e], a.sl2, -L[j][e & 1]));
                    st[j][e] = p;
                    dpt[j][e] = p * (dpt[j][e] - Dq[j][e & 1]); /* dS^T */
                }
            unsigned pa[4], da[4];
            tc_acc_to_a(pa, st[0], st[1]);
            tc_acc_to_a(da, dpt[0], dpt[1]);
            tc_pv(dv, pa, gr, KC);
            tc_pv(dk, da, qr, KC);
        }
        nb_bf16 *gb = dqkv + (size_t)start * ld + hc;
        tc_store_add(gb + E, ld, j0, len, g, a.scale, dk, KC);
        tc_store_add(gb + 2 * (size_t)E, ld, j0, len, g, 1.0f, dv, KC);
    }
}

/* ==== embedding gradient of the unique rows ==== */

#define EGU_CHUNK NB_EMB_GRAD_CHUNK
#define EGU_TILE 64     /* lookup positions per pass-1 work item */
#define EGU_COLS 64     /* columns per pass over a row (2 per lane) */
#define EGU_SMEM_BYTES (TC_WARPS * 32 * EGU_COLS * 4)

/* column e of the src row at element offset o (fp32 or bf16 src) */
static __device__ __forceinline__ float egu_ld(const void *src, long long o, const int BF) {
    return BF ? tc_bf(((const nb_bf16 *)src)[o]) : ((const float *)src)[o];
}

/* The row u with seg[u] <= k < seg[u + 1] (seg strictly increasing, seg[0] = 0 <= k < seg[U]):
 * the warp probes 32 evenly spaced rows per round. */
static __device__ __forceinline__ int egu_find(const int32_t *seg, int U, int k, int lane) {
    int lo = 0, hi = U; /* seg[lo] <= k; the row is in [lo, hi) */
    while (hi - lo > 32) {
        const int step = (hi - lo + 31) / 32, pos = lo + lane * step;
        const unsigned m = tc_ballot(pos < hi && seg[pos] <= k); /* lane 0 always */
        lo += (31 - tc_clz(m)) * step;
        hi = min(hi, lo + step);
    }
    const unsigned m = tc_ballot(lo + lane < hi && seg[lo + lane] <= k);
    return lo + 31 - tc_clz(m);
}

/* Sum of lookups c .. c1-1 (one chunk) of columns e0 + lane, e0 + 32 + lane, one lookup at a
 * time: pass 2's path for chunks without a slot (same additions as pass 1's). */
static __device__ __forceinline__ void egu_chunk_direct(float acc[2], const void *src, const int64_t *src_off,
                                                        const int32_t *order, int c, int c1, int e0, int E,
                                                        int lane, const int BF) {
    acc[0] = acc[1] = 0.0f;
    for (int k = c; k < c1; k++) {
        const long long o = src_off[order[k]];
        if (e0 + lane < E) acc[0] += egu_ld(src, o + e0 + lane, BF);
        if (e0 + 32 + lane < E) acc[1] += egu_ld(src, o + e0 + 32 + lane, BF);
    }
}

/* Pass 1: a warp per tile of EGU_TILE positions (grid-stride); each chunk starting in the tile. */
static __device__ __forceinline__ void egu_tiles(float *dunique, float *part, int cap, const void *src,
                                                 const int64_t *src_off, const int32_t *order, const int32_t *seg,
                                                 int U, int E, const int BF) {
    TC_SMEM(sm);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float *rows = (float *)sm + (size_t)warp * 32 * EGU_COLS; /* [32 positions][EGU_COLS] */
    const int n = seg[U], ntiles = (n + EGU_TILE - 1) / EGU_TILE;
    const int nw = (int)(gridDim.x * (blockDim.x >> 5));
    for (int t = (int)(blockIdx.x * (blockDim.x >> 5)) + warp; t < ntiles; t += nw) {
        const int kb = t * EGU_TILE, ke = min(n, kb + EGU_TILE);
        int u = egu_find(seg, U, kb, lane), s = seg[u], e = seg[u + 1];
        int j = (kb - s + EGU_CHUNK - 1) / EGU_CHUNK, c = s + j * EGU_CHUNK; /* first chunk start >= kb */
        if (c >= e) {
            if (++u >= U) continue;
            s = e, e = seg[u + 1], j = 0, c = s;
        }
        if (c >= ke) continue;
        /* no chunk starting in the tile reaches past lim */
        const int lim = min(n, ke + EGU_CHUNK - 1);
        for (int e0 = 0; e0 < E; e0 += EGU_COLS) {
            const int col0 = e0 + lane, col1 = e0 + 32 + lane;
            /* the walk: chunk j of row u is [c, c1); sb/segc: seg[sb + lane], a window of ends */
            int cu = u, cs = s, ce = e, cj = j, cc = c, c1 = min(e, c + EGU_CHUNK), done = 0;
            int sb = cu + 1, segc = sb + lane <= U ? seg[sb + lane] : 0;
            float acc0 = 0.0f, acc1 = 0.0f;
            (void)cs;
            for (int gb = c; !done; gb += 32) {
                /* 32 positions' rows, coalesced, into the warp's shared rows: every load is
                 * issued before the first store (a store could alias a later load for all the
                 * compiler knows, so interleaving them would leave one load in flight) */
                const long long mine = gb + lane < lim ? (long long)src_off[order[gb + lane]] : 0;
                float v0[32], v1[32];
                TC_UNROLL
                for (int q = 0; q < 32; q++) {
                    const long long o = tc_shfl_ll(mine, q);
                    const int ok = gb + q < lim;
                    v0[q] = ok && col0 < E ? egu_ld(src, o + col0, BF) : 0.0f;
                    v1[q] = ok && col1 < E ? egu_ld(src, o + col1, BF) : 0.0f;
                }
                TC_UNROLL
                for (int q = 0; q < 32; q++) rows[q * EGU_COLS + lane] = v0[q], rows[q * EGU_COLS + 32 + lane] = v1[q];
                tc_syncwarp();
                /* each lane adds its own two columns in k order; chunk ends are warp-uniform */
                const int gend = min(gb + 32, lim);
                for (int k = gb; k < gend && !done; k++) {
                    acc0 += rows[(k - gb) * EGU_COLS + lane];
                    acc1 += rows[(k - gb) * EGU_COLS + 32 + lane];
                    if (k + 1 == c1) {
                        float *dst = cj == 0 ? dunique + (size_t)cu * E
                                             : (cc / EGU_CHUNK < cap ? part + (size_t)(cc / EGU_CHUNK) * E : NULL);
                        if (dst) {
                            if (col0 < E) dst[col0] = acc0;
                            if (col1 < E) dst[col1] = acc1;
                        }
                        acc0 = acc1 = 0.0f;
                        if (c1 == ce) { /* next row */
                            if (++cu >= U) {
                                done = 1;
                                break;
                            }
                            if (cu + 1 - sb >= 32) sb = cu + 1, segc = sb + lane <= U ? seg[sb + lane] : 0;
                            cs = ce, ce = tc_shfl_i(segc, cu + 1 - sb), cj = 0, cc = cs;
                        } else {
                            cj++, cc = c1;
                        }
                        if (cc >= ke) done = 1;
                        c1 = min(ce, cc + EGU_CHUNK);
                    }
                }
                tc_syncwarp(); /* the rows are read before the next positions overwrite them */
            }
        }
    }
}

/* Pass 2: a warp per 32 rows; rows of more than one chunk add their chunk sums in order. */
static __device__ __forceinline__ void egu_finish(float *dunique, const float *part, int cap, const void *src,
                                                  const int64_t *src_off, const int32_t *order, const int32_t *seg,
                                                  int U, int E, const int BF) {
    const int lane = threadIdx.x & 31;
    const int u0 = (int)((blockIdx.x * blockDim.x + threadIdx.x) >> 5) * 32;
    if (u0 >= U) return;
    const int mine = u0 + lane < U ? seg[u0 + lane] : 0, cnt = u0 + lane < U ? seg[u0 + lane + 1] - mine : 0;
    unsigned long_rows = tc_ballot(cnt > EGU_CHUNK);
    while (long_rows) {
        const int l = 31 - tc_clz(long_rows);
        long_rows &= ~(1u << l);
        const int u = u0 + l, s = tc_shfl_i(mine, l), e = s + tc_shfl_i(cnt, l);
        const int nch = (e - s + EGU_CHUNK - 1) / EGU_CHUNK;
        for (int e0 = 0; e0 < E; e0 += EGU_COLS) {
            const int col0 = e0 + lane, col1 = e0 + 32 + lane;
            float *d = dunique + (size_t)u * E;
            float a0 = col0 < E ? d[col0] : 0.0f, a1 = col1 < E ? d[col1] : 0.0f;
            TC_UNROLL_N(8)
            for (int jj = 1; jj < nch; jj++) {
                const int c = s + jj * EGU_CHUNK, w = c / EGU_CHUNK;
                float v[2];
                if (w < cap) {
                    v[0] = col0 < E ? part[(size_t)w * E + col0] : 0.0f;
                    v[1] = col1 < E ? part[(size_t)w * E + col1] : 0.0f;
                } else {
                    egu_chunk_direct(v, src, src_off, order, c, min(e, c + EGU_CHUNK), e0, E, lane, BF);
                }
                a0 += v[0];
                a1 += v[1];
            }
            if (col0 < E) d[col0] = a0;
            if (col1 < E) d[col1] = a1;
        }
    }
}

/* ==== target attention ====
 * A warp per sample (TC_WARPS samples a block). Scores, weights and the backward's ds: a lane per
 * key (keys lane + 32 r, r < TA_SLOTS, kept in registers: max_len <= 32 * TA_SLOTS), each key's
 * row read whole with 16-byte loads against q (or dpooled) in the warp's shared memory (one
 * broadcast address per access); softmax max and sums by butterflies (a fixed order). Pooling
 * and the row gradients: a lane per column, the keys in order with their weight (ds) shuffled
 * from the lane that holds it; rows read and written coalesced. dq sums ds_j k_j in key order. */

#define TA_SLOTS 8   /* keys per lane */
#define TA_MAX_E 256 /* columns (q and dpooled in shared memory) */

static __device__ __forceinline__ float ta_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += tc_shfl_xor(v, o);
    return v;
}
static __device__ __forceinline__ float ta_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, tc_shfl_xor(v, o));
    return v;
}
static __device__ __forceinline__ nb_bf16 ta_bf(float x) { return (nb_bf16)(tc_pack(x, 0.0f) & 0xffffu); }

/* x (E floats, shared) . the bf16 row r (16-byte aligned, E % 8 == 0), in column order */
static __device__ __forceinline__ float ta_dot(const float *x, const nb_bf16 *r, int E) {
    float s = 0.0f;
    for (int e = 0; e < E; e += 8) {
        const tc_u4 u = tc_ld16(r + e);
        s += x[e] * tc_lo(u.x);
        s += x[e + 1] * tc_hi(u.x);
        s += x[e + 2] * tc_lo(u.y);
        s += x[e + 3] * tc_hi(u.y);
        s += x[e + 4] * tc_lo(u.z);
        s += x[e + 5] * tc_hi(u.z);
        s += x[e + 6] * tc_lo(u.w);
        s += x[e + 7] * tc_hi(u.w);
    }
    return s;
}

static __device__ __forceinline__ void ta_fwd(nb_bf16 *pooled, float *attn, const nb_bf16 *q, const nb_bf16 *k,
                                              const nb_bf16 *v, const int32_t *off, int B, int E, int ldkv) {
    TC_SMEM(sm);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, b = (int)blockIdx.x * TC_WARPS + warp;
    if (b >= B) return;
    float *sq = (float *)sm + (size_t)warp * 2 * TA_MAX_E;
    const int start = off[b], len = off[b + 1] - start > 0 ? off[b + 1] - start : 0;
    nb_bf16 *pb = pooled + (size_t)b * E;
    if (len == 0) {
        for (int c = lane; c < E; c += 32) pb[c] = 0; /* bf16 zero */
        return;
    }
    for (int c = lane; c < E; c += 32) sq[c] = tc_bf(q[(size_t)b * E + c]);
    tc_syncwarp();
    const float scale = 1.0f / sqrtf((float)E);
    float w[TA_SLOTS], mx = -INFINITY;
    TC_UNROLL
    for (int r = 0; r < TA_SLOTS; r++) {
        const int j = lane + 32 * r;
        w[r] = j < len ? scale * ta_dot(sq, k + (size_t)(start + j) * ldkv, E) : -INFINITY;
        mx = fmaxf(mx, w[r]);
    }
    mx = ta_warp_max(mx);
    float sum = 0.0f;
    TC_UNROLL
    for (int r = 0; r < TA_SLOTS; r++) {
        w[r] = lane + 32 * r < len ? expf(w[r] - mx) : 0.0f;
        sum += w[r];
    }
    const float inv = 1.0f / ta_warp_sum(sum);
    TC_UNROLL
    for (int r = 0; r < TA_SLOTS; r++) {
        w[r] *= inv;
        if (lane + 32 * r < len) attn[start + lane + 32 * r] = w[r];
    }
    for (int c0 = 0; c0 < E; c0 += 64) {
        const int c = c0 + lane, d = c0 + 32 + lane;
        float a0 = 0.0f, a1 = 0.0f;
        TC_UNROLL
        for (int r = 0; r < TA_SLOTS; r++) {
            const int n = len - 32 * r < 32 ? len - 32 * r : 32; /* <= 0: no key in slot r */
            TC_UNROLL_N(4)
            for (int jj = 0; jj < n; jj++) {
                const float a = tc_shfl_f(w[r], jj);
                const nb_bf16 *vr = v + (size_t)(start + 32 * r + jj) * ldkv;
                if (c < E) a0 += a * tc_bf(vr[c]);
                if (d < E) a1 += a * tc_bf(vr[d]);
            }
        }
        if (c < E) pb[c] = ta_bf(a0);
        if (d < E) pb[d] = ta_bf(a1);
    }
}

/* ds_j = a_j (dp . v_j - sum_i a_i dp . v_i) / sqrt(E); dv_j += a_j dp, dk_j += ds_j q, dq += sum_j ds_j k_j */
static __device__ __forceinline__ void ta_bwd(nb_bf16 *dq, nb_bf16 *dk, nb_bf16 *dv, const nb_bf16 *dpooled,
                                              const nb_bf16 *q, const nb_bf16 *k, const nb_bf16 *v, const float *attn,
                                              const int32_t *off, int B, int E, int ldkv) {
    TC_SMEM(sm);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, b = (int)blockIdx.x * TC_WARPS + warp;
    if (b >= B) return;
    float *sq = (float *)sm + (size_t)warp * 2 * TA_MAX_E, *sdp = sq + TA_MAX_E;
    const int start = off[b], len = off[b + 1] - start;
    if (len <= 0) return;
    for (int c = lane; c < E; c += 32) sq[c] = tc_bf(q[(size_t)b * E + c]), sdp[c] = tc_bf(dpooled[(size_t)b * E + c]);
    tc_syncwarp();
    const float scale = 1.0f / sqrtf((float)E);
    float a[TA_SLOTS], ds[TA_SLOTS], ada = 0.0f;
    TC_UNROLL
    for (int r = 0; r < TA_SLOTS; r++) {
        const int j = lane + 32 * r;
        a[r] = j < len ? attn[start + j] : 0.0f;
        ds[r] = j < len ? ta_dot(sdp, v + (size_t)(start + j) * ldkv, E) : 0.0f; /* da_j */
        ada += a[r] * ds[r];
    }
    ada = ta_warp_sum(ada);
    TC_UNROLL
    for (int r = 0; r < TA_SLOTS; r++) ds[r] = a[r] * (ds[r] - ada) * scale;
    for (int c0 = 0; c0 < E; c0 += 64) {
        const int c = c0 + lane, d = c0 + 32 + lane;
        const float q0 = c < E ? sq[c] : 0.0f, q1 = d < E ? sq[d] : 0.0f;
        const float p0 = c < E ? sdp[c] : 0.0f, p1 = d < E ? sdp[d] : 0.0f;
        float g0 = 0.0f, g1 = 0.0f;
        TC_UNROLL
        for (int r = 0; r < TA_SLOTS; r++) {
            const int n = len - 32 * r < 32 ? len - 32 * r : 32; /* <= 0: no key in slot r */
            TC_UNROLL_N(2)
            for (int jj = 0; jj < n; jj++) {
                const float aj = tc_shfl_f(a[r], jj), dj = tc_shfl_f(ds[r], jj);
                const size_t row = (size_t)(start + 32 * r + jj) * ldkv;
                if (dv) {
                    if (c < E) dv[row + c] = ta_bf(tc_bf(dv[row + c]) + aj * p0);
                    if (d < E) dv[row + d] = ta_bf(tc_bf(dv[row + d]) + aj * p1);
                }
                if (dk) {
                    if (c < E) dk[row + c] = ta_bf(tc_bf(dk[row + c]) + dj * q0);
                    if (d < E) dk[row + d] = ta_bf(tc_bf(dk[row + d]) + dj * q1);
                }
                if (dq) {
                    if (c < E) g0 += dj * tc_bf(k[row + c]);
                    if (d < E) g1 += dj * tc_bf(k[row + d]);
                }
            }
        }
        if (dq) {
            if (c < E) dq[(size_t)b * E + c] = ta_bf(tc_bf(dq[(size_t)b * E + c]) + g0);
            if (d < E) dq[(size_t)b * E + d] = ta_bf(tc_bf(dq[(size_t)b * E + d]) + g1);
        }
    }
}

/* ==== kernels ==== */

#define TC_SA_KERNELS(HS)                                                                          \
    static __global__ void __launch_bounds__(32 * TC_WARPS)                                        \
        tc_sa_fwd_##HS(nb_bf16 *out, float *lse, const nb_bf16 *qkv, const int32_t *off, tc_sa_dims a) { \
        tc_sa_fwd(out, lse, qkv, off, a, HS);                                                      \
    }                                                                                              \
    static __global__ void __launch_bounds__(32 * TC_WARPS)                                        \
        tc_sa_dq_##HS(nb_bf16 *dqkv, const nb_bf16 *dout, const nb_bf16 *qkv, const nb_bf16 *out,   \
                      const float *lse, const int32_t *off, tc_sa_dims a) {                        \
        tc_sa_dq(dqkv, dout, qkv, out, lse, off, a, HS);                                           \
    }                                                                                              \
    static __global__ void __launch_bounds__(32 * TC_WARPS)                                        \
        tc_sa_dkv_##HS(nb_bf16 *dqkv, const nb_bf16 *dout, const nb_bf16 *qkv, const nb_bf16 *out,  \
                       const float *lse, const int32_t *off, tc_sa_dims a) {                       \
        tc_sa_dkv(dqkv, dout, qkv, out, lse, off, a, HS);                                          \
    }
TC_SA_KERNELS(16)
TC_SA_KERNELS(32)
TC_SA_KERNELS(64)

#define EGU_KERNELS(SFX, BF)                                                                       \
    static __global__ void __launch_bounds__(32 * TC_WARPS)                                        \
        egu_tiles_##SFX(float *dunique, float *part, int cap, const void *src, const int64_t *src_off, \
                        const int32_t *order, const int32_t *seg, const int32_t *count, int U, int E) { \
        egu_tiles(dunique, part, cap, src, src_off, order, seg, count ? *count : U, E, BF);        \
    }                                                                                              \
    static __global__ void __launch_bounds__(32 * TC_WARPS)                                        \
        egu_finish_##SFX(float *dunique, const float *part, int cap, const void *src, const int64_t *src_off, \
                         const int32_t *order, const int32_t *seg, const int32_t *count, int U, int E) { \
        egu_finish(dunique, part, cap, src, src_off, order, seg, count ? *count : U, E, BF);       \
    }
EGU_KERNELS(f32, 0)
EGU_KERNELS(bf16, 1)

static __global__ void __launch_bounds__(32 * TC_WARPS)
    ta_fwd_kernel(nb_bf16 *pooled, float *attn, const nb_bf16 *q, const nb_bf16 *k, const nb_bf16 *v,
                  const int32_t *off, int B, int E, int ldkv) {
    ta_fwd(pooled, attn, q, k, v, off, B, E, ldkv);
}
static __global__ void __launch_bounds__(32 * TC_WARPS)
    ta_bwd_kernel(nb_bf16 *dq, nb_bf16 *dk, nb_bf16 *dv, const nb_bf16 *dpooled, const nb_bf16 *q, const nb_bf16 *k,
                  const nb_bf16 *v, const float *attn, const int32_t *off, int B, int E, int ldkv) {
    ta_bwd(dq, dk, dv, dpooled, q, k, v, attn, off, B, E, ldkv);
}
#define TA_SMEM_BYTES (TC_WARPS * 2 * TA_MAX_E * 4)
static unsigned ta_blocks(int B) { return (unsigned)((B + TC_WARPS - 1) / TC_WARPS); }

/* ---- launch shapes (shared with the emulator) ---- */

typedef void (*tc_sa_fwd_fn)(nb_bf16 *, float *, const nb_bf16 *, const int32_t *, tc_sa_dims);
typedef void (*tc_sa_bwd_fn)(nb_bf16 *, const nb_bf16 *, const nb_bf16 *, const nb_bf16 *, const float *,
                             const int32_t *, tc_sa_dims);

/* The kernels of a head size (0: none). */
static int tc_sa_kernels(int HS, tc_sa_fwd_fn *f, tc_sa_bwd_fn *dq, tc_sa_bwd_fn *dkv) {
    switch (HS) {
    case 16: *f = tc_sa_fwd_16, *dq = tc_sa_dq_16, *dkv = tc_sa_dkv_16; return 1;
    case 32: *f = tc_sa_fwd_32, *dq = tc_sa_dq_32, *dkv = tc_sa_dkv_32; return 1;
    case 64: *f = tc_sa_fwd_64, *dq = tc_sa_dq_64, *dkv = tc_sa_dkv_64; return 1;
    default: return 0;
    }
}

static tc_sa_dims tc_sa_dims_of(int max_len, int H, int E) {
    tc_sa_dims a;
    a.H = H, a.E = E;
    a.nch = max_len > TC_CHUNK_ROWS ? (max_len + TC_CHUNK_ROWS - 1) / TC_CHUNK_ROWS : 1;
    a.scale = 1.0f / sqrtf((float)(E / H));
    a.sl2 = a.scale * TC_LOG2E;
    return a;
}

/* Slots of pass 1's chunk-sum scratch: one per NB_EMB_GRAD_CHUNK lookup positions for up to
 * 64 lookups per unique row (plus 2^17), at most 16 MB. */
static int egu_cap(int U, int E) {
    long long want = (64LL * U + (1LL << 17)) / EGU_CHUNK + 1, most = (16LL << 20) / (4LL * (E > 0 ? E : 1));
    long long c = want < most ? want : most;
    return (int)(c > 1 ? c : 1);
}
#define EGU_TILE_BLOCKS 1024 /* pass 1's grid (grid-stride over the tiles; the result does not depend on it) */
static unsigned egu_finish_blocks(int U) { return (unsigned)((U + 32 * TC_WARPS - 1) / (32 * TC_WARPS)); }

/* ==== launchers ==== */
#ifndef CTR_TC_EMU

static int tc_al8(const void *p) { return p == NULL || ((uintptr_t)p & 7) == 0; }

/* Whether the tensor-core kernels take a call: a head size they have, rows of 8-byte pieces. */
static int tc_sa_usable(int B, int max_len, int H, int E, const void *p0, const void *p1, const void *p2,
                        const void *p3) {
    tc_sa_fwd_fn f;
    tc_sa_bwd_fn dq, dkv;
    if (H <= 0 || E % H != 0 || !tc_sa_kernels(E / H, &f, &dq, &dkv)) return 0;
    if (!tc_al8(p0) || !tc_al8(p1) || !tc_al8(p2) || !tc_al8(p3)) return 0;
    return (long long)B * tc_sa_dims_of(max_len, H, E).nch <= 0x7fffffffLL;
}

extern "C" int nb_cuda_seqattn_tc_forward_bf16(nb_bf16 *out, float *lse, const nb_bf16 *qkv, const int32_t *off,
                                                int B, int max_len, int H, int E, nb_stream_t stream) {
    if (!tc_sa_usable(B, max_len, H, E, out, qkv, NULL, NULL)) return 0;
    if (B <= 0) return 1;
    tc_sa_fwd_fn f;
    tc_sa_bwd_fn dq, dkv;
    tc_sa_kernels(E / H, &f, &dq, &dkv);
    tc_sa_dims a = tc_sa_dims_of(max_len, H, E);
    f<<<(unsigned)(B * a.nch), 32 * TC_WARPS, 0, stream>>>(out, lse, qkv, off, a);
    CUDA_CHECK_LAUNCH("history self-attention forward (tensor cores)");
    return 1;
}

extern "C" int nb_cuda_seqattn_tc_backward_bf16(nb_bf16 *dqkv, const nb_bf16 *dout, const nb_bf16 *qkv,
                                                 const nb_bf16 *out, const float *lse, const int32_t *off, int B,
                                                 int max_len, int H, int E, nb_stream_t stream) {
    if (!tc_sa_usable(B, max_len, H, E, dqkv, dout, qkv, out)) return 0;
    if (B <= 0 || !dqkv) return 1;
    tc_sa_fwd_fn f;
    tc_sa_bwd_fn dq, dkv;
    tc_sa_kernels(E / H, &f, &dq, &dkv);
    tc_sa_dims a = tc_sa_dims_of(max_len, H, E);
    /* dq and dk/dv write disjoint columns of dqkv */
    dq<<<(unsigned)(B * a.nch), 32 * TC_WARPS, 0, stream>>>(dqkv, dout, qkv, out, lse, off, a);
    CUDA_CHECK_LAUNCH("history self-attention backward (dq, tensor cores)");
    dkv<<<(unsigned)(B * a.nch), 32 * TC_WARPS, 0, stream>>>(dqkv, dout, qkv, out, lse, off, a);
    CUDA_CHECK_LAUNCH("history self-attention backward (dk, dv, tensor cores)");
    return 1;
}

static int tc_al16(const void *p) { return p == NULL || ((uintptr_t)p & 15) == 0; }

/* The warp-per-sample target attention: histories of at most 32 * TA_SLOTS keys (max_len bounds
 * them, backend_ctr.h), E a multiple of 8 up to TA_MAX_E, k and v rows in 16-byte pieces. */
static int ta_usable(int B, int max_len, int E, int ldkv, const void *k, const void *v) {
    return max_len <= 32 * TA_SLOTS && E % 8 == 0 && E <= TA_MAX_E && ldkv % 8 == 0 && tc_al16(k) && tc_al16(v) &&
           B <= 0x7fffffff - TC_WARPS;
}

extern "C" int nb_cuda_targetattn_warp_forward_bf16(nb_bf16 *pooled, float *attn, const nb_bf16 *q, const nb_bf16 *k,
                                                     const nb_bf16 *v, const int32_t *off, int B, int max_len, int E,
                                                     int ldkv, nb_stream_t stream) {
    if (!ta_usable(B, max_len, E, ldkv, k, v)) return 0;
    if (B <= 0) return 1;
    ta_fwd_kernel<<<ta_blocks(B), 32 * TC_WARPS, TA_SMEM_BYTES, stream>>>(pooled, attn, q, k, v, off, B, E, ldkv);
    CUDA_CHECK_LAUNCH("target attention forward (a warp per sample)");
    return 1;
}

extern "C" int nb_cuda_targetattn_warp_backward_bf16(nb_bf16 *dq, nb_bf16 *dk, nb_bf16 *dv, const nb_bf16 *dpooled,
                                                      const nb_bf16 *q, const nb_bf16 *k, const nb_bf16 *v,
                                                      const float *attn, const int32_t *off, int B, int max_len,
                                                      int E, int ldkv, nb_stream_t stream) {
    if (!ta_usable(B, max_len, E, ldkv, k, v)) return 0;
    if (B <= 0 || !(dq || dk || dv)) return 1;
    ta_bwd_kernel<<<ta_blocks(B), 32 * TC_WARPS, TA_SMEM_BYTES, stream>>>(dq, dk, dv, dpooled, q, k, v, attn, off, B,
                                                                          E, ldkv);
    CUDA_CHECK_LAUNCH("target attention backward (a warp per sample)");
    return 1;
}

extern "C" void nb_cuda_emb_grad_unique_chunked(float *dunique, const void *src, int src_bf16,
                                                const int64_t *src_off, const int32_t *order, const int32_t *seg,
                                                const int32_t *count, int U, int E, nb_stream_t stream) {
    NB_CUDA_SHAPE(U >= 0 && E >= 0 && (U == 0 || (dunique && src && src_off && order && seg)),
                  "nb_cuda_emb_grad_unique_chunked");
    if (U == 0 || E == 0) return;
    const int cap = egu_cap(U, E);
    float *part = (float *)nb_cuda_scratch((size_t)cap * E * sizeof(float), stream);
    if (src_bf16)
        egu_tiles_bf16<<<EGU_TILE_BLOCKS, 32 * TC_WARPS, EGU_SMEM_BYTES, stream>>>(dunique, part, cap, src, src_off,
                                                                                   order, seg, count, U, E);
    else
        egu_tiles_f32<<<EGU_TILE_BLOCKS, 32 * TC_WARPS, EGU_SMEM_BYTES, stream>>>(dunique, part, cap, src, src_off,
                                                                                  order, seg, count, U, E);
    CUDA_CHECK_LAUNCH("embedding unique-row gradient (chunk sums)");
    if (src_bf16)
        egu_finish_bf16<<<egu_finish_blocks(U), 32 * TC_WARPS, 0, stream>>>(dunique, part, cap, src, src_off, order,
                                                                            seg, count, U, E);
    else
        egu_finish_f32<<<egu_finish_blocks(U), 32 * TC_WARPS, 0, stream>>>(dunique, part, cap, src, src_off, order,
                                                                           seg, count, U, E);
    CUDA_CHECK_LAUNCH("embedding unique-row gradient (rows of several chunks)");
    nb_cuda_scratch_free(part, stream);
}

#endif /* CTR_TC_EMU */
