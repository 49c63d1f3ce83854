/* History self-attention over packed histories on tensor cores (bf16; issue 19), behind
 * seqattn.cu's bf16 launchers: a varlen flash attention with `mma.sync.m16n8k16` (bf16 in, fp32
 * accumulators) and an online softmax. The fp32 table, head sizes other than 16, 32 and 64, and
 * rows not 8-byte aligned keep seqattn.cu's CUDA-core kernels.
 *
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
 * Everything between the primitives (ctr_warp.cuh, mma.cuh) and the launchers is plain C, so
 * tests/ops/emu_tc.c can define CTR_TC_EMU, supply host versions of the primitives (a warp
 * emulator) and run these kernels on a machine without a GPU. */
#include "ctr_warp.cuh"

#define TC_CHUNK_ROWS 64 /* attention rows (4 tiles of 16) per block */
#define TC_MAX_KC 4      /* 16-column chunks of a head: head sizes 16, 32, 64 */
#define TC_LOG2E 1.4426950408889634f

/* 8 bytes at p, or zeros when !ok (p is not read) */
static __device__ __forceinline__ tc_u2 tc_ld8z(const nb_bf16 *p, int ok) {
    tc_u2 z = {0u, 0u};
    return ok ? tc_ld8(p) : z;
}
/* p[0..3] += (a, b, c, d): fp32 sums, bf16 storage (the bf16 ops' accumulate rule) */
static __device__ __forceinline__ void tc_add4(nb_bf16 *p, float a, float b, float c, float d) {
    tc_u2 u = tc_ld8(p), r;
    r.x = nb_pack_bf16x2(tc_lo(u.x) + a, tc_hi(u.x) + b);
    r.y = nb_pack_bf16x2(tc_lo(u.y) + c, tc_hi(u.y) + d);
    tc_st8(p, r);
}
/* The A operand of the next product from the accumulators of two 16x8 tiles (n-blocks 0, 1). */
static __device__ __forceinline__ void tc_acc_to_a(unsigned a[4], const float c0[4], const float c1[4]) {
    a[0] = nb_pack_bf16x2(c0[0], c0[1]);
    a[1] = nb_pack_bf16x2(c0[2], c0[3]);
    a[2] = nb_pack_bf16x2(c1[0], c1[1]);
    a[3] = nb_pack_bf16x2(c1[2], c1[3]);
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
        for (int kc = 0; kc < KC; kc++) nb_mma_bf16(s[j], a[kc], w[j][kc].x, w[j][kc].y);
    }
}
/* c += A . rows, rows [k = 16 rows][n = the head's columns] (B through movmatrix.trans). */
static __device__ __forceinline__ void tc_pv(float c[TC_MAX_KC][2][4], const unsigned a[4], const tc_u2 w[2][TC_MAX_KC],
                                             const int KC) {
    TC_UNROLL
    for (int kc = 0; kc < KC; kc++) {
        nb_mma_bf16(c[kc][0], a, nb_movmatrix_trans(w[0][kc].x), nb_movmatrix_trans(w[1][kc].x));
        nb_mma_bf16(c[kc][1], a, nb_movmatrix_trans(w[0][kc].y), nb_movmatrix_trans(w[1][kc].y));
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
                mx[r] = fmaxf(mx[r], nb_shfl_xor(mx[r], 1));
                mx[r] = fmaxf(mx[r], nb_shfl_xor(mx[r], 2));
                mx[r] = fmaxf(mx[r], m[r]);
                ms[r] = mx[r] * a.sl2;
                c[r] = nb_ex2(m[r] * a.sl2 - ms[r]); /* 0 on the first tile (m = -inf) */
                m[r] = mx[r];
            }
            TC_UNROLL
            for (int j = 0; j < 2; j++)
                TC_UNROLL
                for (int e = 0; e < 4; e++) {
                    s[j][e] = nb_ex2(fmaf(s[j][e], a.sl2, -ms[e >> 1]));
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
            li += nb_shfl_xor(li, 1);
            li += nb_shfl_xor(li, 2);
            const float inv = 1.0f / li;
            if (r < len) {
                nb_bf16 *orow = out + (size_t)(start + r) * E + (size_t)h * HS + 4 * t4;
                TC_UNROLL
                for (int kc = 0; kc < KC; kc++) {
                    tc_u2 v;
                    v.x = nb_pack_bf16x2(o[kc][0][2 * i] * inv, o[kc][0][2 * i + 1] * inv);
                    v.y = nb_pack_bf16x2(o[kc][1][2 * i] * inv, o[kc][1][2 * i + 1] * inv);
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
            d += nb_shfl_xor(d, 1);
            d += nb_shfl_xor(d, 2);
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
                    float p = nb_ex2(fmaf(s[j][e], a.sl2, -L[e >> 1]));
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
                d += nb_shfl_xor(d, 1);
                d += nb_shfl_xor(d, 2);
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
                    const float p = nb_ex2(fmaf(st[j][e], a.sl2, -L[j][e & 1]));
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

/* ---- kernels: one per head size and pass, the head size a literal ---- */

static __global__ void __launch_bounds__(32 * TC_WARPS)
    tc_sa_fwd_16(nb_bf16 *out, float *lse, const nb_bf16 *qkv, const int32_t *off, tc_sa_dims a) {
    tc_sa_fwd(out, lse, qkv, off, a, 16);
}
static __global__ void __launch_bounds__(32 * TC_WARPS)
    tc_sa_fwd_32(nb_bf16 *out, float *lse, const nb_bf16 *qkv, const int32_t *off, tc_sa_dims a) {
    tc_sa_fwd(out, lse, qkv, off, a, 32);
}
static __global__ void __launch_bounds__(32 * TC_WARPS)
    tc_sa_fwd_64(nb_bf16 *out, float *lse, const nb_bf16 *qkv, const int32_t *off, tc_sa_dims a) {
    tc_sa_fwd(out, lse, qkv, off, a, 64);
}
static __global__ void __launch_bounds__(32 * TC_WARPS)
    tc_sa_dq_16(nb_bf16 *dqkv, const nb_bf16 *dout, const nb_bf16 *qkv, const nb_bf16 *out, const float *lse,
                const int32_t *off, tc_sa_dims a) {
    tc_sa_dq(dqkv, dout, qkv, out, lse, off, a, 16);
}
static __global__ void __launch_bounds__(32 * TC_WARPS)
    tc_sa_dq_32(nb_bf16 *dqkv, const nb_bf16 *dout, const nb_bf16 *qkv, const nb_bf16 *out, const float *lse,
                const int32_t *off, tc_sa_dims a) {
    tc_sa_dq(dqkv, dout, qkv, out, lse, off, a, 32);
}
static __global__ void __launch_bounds__(32 * TC_WARPS)
    tc_sa_dq_64(nb_bf16 *dqkv, const nb_bf16 *dout, const nb_bf16 *qkv, const nb_bf16 *out, const float *lse,
                const int32_t *off, tc_sa_dims a) {
    tc_sa_dq(dqkv, dout, qkv, out, lse, off, a, 64);
}
static __global__ void __launch_bounds__(32 * TC_WARPS)
    tc_sa_dkv_16(nb_bf16 *dqkv, const nb_bf16 *dout, const nb_bf16 *qkv, const nb_bf16 *out, const float *lse,
                 const int32_t *off, tc_sa_dims a) {
    tc_sa_dkv(dqkv, dout, qkv, out, lse, off, a, 16);
}
static __global__ void __launch_bounds__(32 * TC_WARPS)
    tc_sa_dkv_32(nb_bf16 *dqkv, const nb_bf16 *dout, const nb_bf16 *qkv, const nb_bf16 *out, const float *lse,
                 const int32_t *off, tc_sa_dims a) {
    tc_sa_dkv(dqkv, dout, qkv, out, lse, off, a, 32);
}
static __global__ void __launch_bounds__(32 * TC_WARPS)
    tc_sa_dkv_64(nb_bf16 *dqkv, const nb_bf16 *dout, const nb_bf16 *qkv, const nb_bf16 *out, const float *lse,
                 const int32_t *off, tc_sa_dims a) {
    tc_sa_dkv(dqkv, dout, qkv, out, lse, off, a, 64);
}

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

#endif /* CTR_TC_EMU */
