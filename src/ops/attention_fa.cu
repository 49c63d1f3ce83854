/* Causal grouped-query attention on tensor cores (FlashAttention-2 style), bf16 in, fp32 inside.
 * Same contract as attention.c / attention.cu (qkv [B, T, (NH + 2*NKV) * HS], query head h reads
 * kv head h / (NH/NKV), scale 1/sqrt(HS), lse [B, NH, T] fp32, backward accumulates into dqkv);
 * attention.cu's bf16 launchers call in here when the head size has a kernel (64, 128) and fall
 * back to their own CUDA-core kernels otherwise.
 *
 * Tensor cores through `mma.sync.m16n8k16` (bf16 x bf16 -> fp32) fed by `ldmatrix`; tiles come in
 * through `cp.async`, two shared-memory stages deep, so the next tile loads while this one is
 * used. Each warp owns MT m-tiles of 16 rows of the tile product (queries in the forward and dq,
 * keys in dk/dv), so each B fragment read from shared memory feeds MT mmas: softmax statistics
 * stay in registers, probabilities go from the accumulators straight into the next product's A
 * operand (no shared-memory round trip), and a warp whose rows see none of a tile (causal) skips it.
 *
 * Forward: a block takes BQ = 16*NW*MT query rows of one (b, h) and walks the key tiles up to the
 * diagonal with an online softmax (running max m, sum l); out = O / l, lse = m*scale + log(l).
 * Backward, with D = rowsum(dout * out) precomputed (fa_d_kernel):
 *   P = exp(scale * Q K^T - lse), dP = dO V^T, dS = P * (dP - D)
 *   dq kernel:  blocks over query tiles, walks key tiles:  dQ = scale * dS K
 *   dkv kernel: blocks over key tiles of one kv head; for each query head of the group, in order,
 *               walks the query tiles from the diagonal:  dV = P^T dO, dK = scale * dS^T Q
 * P and dP are recomputed in both passes (7 tile products instead of FA2's 5) so that every
 * dq/dk/dv element has exactly one writer adding its terms in a fixed order: deterministic without
 * atomics or T-sized partial buffers, and GQA's sum over query heads is the dkv kernel's outer loop.
 *
 * Masking: rows (keys) past T are zero-filled by cp.async, so every product stays finite; the
 * causal mask (key > query) also removes keys past T for every real query; queries past T get
 * lse = +inf in the backward, hence P = 0, and are never stored.
 *
 * Kernels are device functions with the tile shape as arguments, called with literal shapes by
 * one small kernel per shape, so every loop unrolls and every register array stays in registers
 * (the build's ptxas report shows no stack frame).
 *
 * Measured on an H200 (test_ops --mode perf --op attention_fa; TFLOP/s counting 4*B*NH*T*T*HS/2 forward and
 * 2.5x that backward): GPT-2 heads (B 16, T 1024, 12 x 64) 200 forward / 118 backward (B 64:
 * 213 / 120), Llama-1B-like (B 2, T 2048, 32 heads over 8 kv, HS 64) 233 / 160, HS 128 at
 * T 4096 257 / 160. attention.cu's CUDA-core kernels: 3-4.5; PyTorch 2.11's SDPA on that card:
 * 256-294 / 178-217 at HS 64, 488 / 317 at HS 128. */
#ifndef FA_EMU
#include "mma.cuh"
#include "ops_cuda_common.cuh"
#define FA_UNROLL _Pragma("unroll")
#endif

#define FA_PAD 8 /* elements added to each shared-memory row: ldmatrix's 8 row reads hit 8 bank groups */
#define FA_LOG2E 1.4426950408889634f
/* Register arrays are declared at these sizes; the kernels' shapes are literals, the loops unroll
 * fully and the parts a smaller shape does not touch are never allocated. */
#define FA_MAX_HS 128
#define FA_MAX_TILE 64
#define FA_MAX_MT 2

typedef struct {
    int T, NH, NKV, R, group; /* R = (NH + 2*NKV) * HS: one qkv row; group = NH / NKV */
    float scale, sl2;         /* 1/sqrt(HS), and scale * log2(e) for exp2 */
    int acc;                  /* backward: 1 adds into dqkv, 0 writes it (its old contents unread) */
} fa_dims;

/* ---- primitives: mma.cuh's (the only PTX). Everything from here to the launchers is also plain
 * C, so that tests/ops/emu_fa.c can define FA_EMU, supply host versions of mma.cuh's
 * primitives (a warp-level emulator) and run the kernels on the CPU where no GPU is present. ---- */
#ifndef FA_EMU
#define FA_SMEM(name) extern __shared__ __align__(16) unsigned char name[]
#endif

static __device__ __forceinline__ float fa_lo(unsigned u) { return __uint_as_float(u << 16); }
static __device__ __forceinline__ float fa_hi(unsigned u) { return __uint_as_float(u & 0xffff0000u); }

/* ---- fragment loads from a shared tile with row pitch ld (elements) ----
 * mma's A operand (16x16, row-major): rows m0..m0+15, columns k0..k0+15 of a [m][k] tile. */
static __device__ __forceinline__ void fa_ld_a(unsigned r[4], const nb_bf16 *t, int ld, int m0, int k0, int lane) {
    nb_ldmatrix_x4(r, t + (m0 + (lane & 15)) * ld + k0 + ((lane >> 4) << 3));
}
/* B operands (16x8, b[k][n]) of the two n-blocks n0..n0+7 (r[0], r[1]) and n0+8..n0+15 (r[2],
 * r[3]) at k0..k0+15, from a tile stored [n][k] (b = tile^T: keys against Q, V against dO). */
static __device__ __forceinline__ void fa_ld_b_nk(unsigned r[4], const nb_bf16 *t, int ld, int n0, int k0, int lane) {
    nb_ldmatrix_x4(r, t + (n0 + (lane & 7) + ((lane >> 4) << 3)) * ld + k0 + (((lane >> 3) & 1) << 3));
}
/* The same from a tile stored [k][n] (b = tile itself: V in P.V, K in dS.K, Q and dO in dkv). */
static __device__ __forceinline__ void fa_ld_b_kn(unsigned r[4], const nb_bf16 *t, int ld, int k0, int n0, int lane) {
    nb_ldmatrix_x4_trans(r, t + (k0 + (lane & 7) + (((lane >> 3) & 1) << 3)) * ld + n0 + ((lane >> 4) << 3));
}

/* rows [row0, row0 + nrows) of a [T, *] matrix (row stride `stride` elements, HS columns from g)
 * -> shared tile with pitch HS + FA_PAD; rows >= T become zeros. Issued, not waited for. */
static __device__ __forceinline__ void fa_load_tile(nb_bf16 *dst, const nb_bf16 *g, size_t stride, int row0,
                                                    int nrows, int T, int HS, int nthreads) {
    const int cpr = HS / 8, n = nrows * cpr; /* 16-byte chunks per row, in the tile */
    FA_UNROLL
    for (int i = 0; i < (n + nthreads - 1) / nthreads; i++) {
        int c = i * nthreads + threadIdx.x, r = c / cpr, ch = c % cpr, t = row0 + r, ok = t < T;
        if (c < n) nb_cp_async16(dst + r * (HS + FA_PAD) + ch * 8, g + (size_t)(ok ? t : 0) * stride + ch * 8, ok);
    }
}

/* The A operand of the next product from four accumulator tiles (the 16 columns n-block 2kk,
 * 2kk+1 of a 16-row result): an mma's C layout and A layout line up, so no data moves. */
static __device__ __forceinline__ void fa_acc_to_a(unsigned a[4], const float c0[4], const float c1[4]) {
    a[0] = nb_pack_bf16x2(c0[0], c0[1]);
    a[1] = nb_pack_bf16x2(c0[2], c0[3]);
    a[2] = nb_pack_bf16x2(c1[0], c1[1]);
    a[3] = nb_pack_bf16x2(c1[2], c1[3]);
}

/* dst[2 elements at p] += (x0, x1): fp32 sum, bf16 storage (the bf16 ops' accumulate rule). */
static __device__ __forceinline__ void fa_add2(nb_bf16 *p, float x0, float x1) {
    unsigned *q = (unsigned *)p, u = *q;
    *q = nb_pack_bf16x2(fa_lo(u) + x0, fa_hi(u) + x1);
}

/* dst[2 elements at p] = (x0, x1) in bf16: the write mode (fa_dims.acc == 0). */
static __device__ __forceinline__ void fa_set2(nb_bf16 *p, float x0, float x1) {
    *(unsigned *)p = nb_pack_bf16x2(x0, x1);
}

/* ---- forward ---- */

static __device__ __forceinline__ void fa_fwd(nb_bf16 *out, float *lse, const nb_bf16 *qkv, fa_dims a,
                                              const int HS, const int NW, const int MT, const int BK) {
    FA_SMEM(sm);
    const int LD = HS + FA_PAD, BQ = 16 * MT * NW, NT = 32 * NW;
    nb_bf16 *Qs = (nb_bf16 *)sm, *Ks = Qs + BQ * LD, *Vs = Ks + 2 * BK * LD;
    const int q0 = (gridDim.z - 1 - blockIdx.z) * BQ; /* longest rows first: less tail */
    const int h = blockIdx.x, b = blockIdx.y, kvh = h / a.group, T = a.T;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, tq = lane & 3;
    const nb_bf16 *base = qkv + (size_t)b * T * a.R;
    const nb_bf16 *kg = base + (size_t)(a.NH + kvh) * HS, *vg = kg + (size_t)a.NKV * HS;
    fa_load_tile(Qs, base + (size_t)h * HS, a.R, q0, BQ, T, HS, NT);
    fa_load_tile(Ks, kg, a.R, 0, BK, T, HS, NT);
    fa_load_tile(Vs, vg, a.R, 0, BK, T, HS, NT);
    nb_cp_async_commit();

    /* the warp owns rows [w0, w0 + 16*MT): m-tile mt, this thread's rows w0 + 16*mt + gr (+ 8);
     * index i = 2*mt + (e >> 1) below names one of them (e: accumulator element) */
    const int w0 = q0 + 16 * MT * warp;
    const int nkt = (min(q0 + BQ, T) + BK - 1) / BK;
    unsigned qf[FA_MAX_MT][FA_MAX_HS / 16][4];
    float o[FA_MAX_MT][FA_MAX_HS / 8][4], m[2 * FA_MAX_MT], l[2 * FA_MAX_MT];
    FA_UNROLL
    for (int mt = 0; mt < MT; mt++) {
        m[2 * mt] = m[2 * mt + 1] = -INFINITY;
        l[2 * mt] = l[2 * mt + 1] = 0.0f;
        FA_UNROLL
        for (int d = 0; d < HS / 8; d++) o[mt][d][0] = o[mt][d][1] = o[mt][d][2] = o[mt][d][3] = 0.0f;
    }

    for (int kt = 0; kt < nkt; kt++) {
        const int k0 = kt * BK;
        if (kt + 1 < nkt) {
            fa_load_tile(Ks + ((kt + 1) & 1) * BK * LD, kg, a.R, k0 + BK, BK, T, HS, NT);
            fa_load_tile(Vs + ((kt + 1) & 1) * BK * LD, vg, a.R, k0 + BK, BK, T, HS, NT);
        }
        nb_cp_async_commit();
        nb_cp_async_wait1();
        __syncthreads();
        if (kt == 0) {
            FA_UNROLL
            for (int mt = 0; mt < MT; mt++)
                FA_UNROLL
                for (int kk = 0; kk < HS / 16; kk++) fa_ld_a(qf[mt][kk], Qs, LD, 16 * (MT * warp + mt), kk * 16, lane);
        }
        const nb_bf16 *kb = Ks + (kt & 1) * BK * LD, *vb = Vs + (kt & 1) * BK * LD;
        if (k0 <= w0 + 16 * MT - 1) { /* warp-uniform: some row of the warp sees some key of the tile */
            float s[FA_MAX_MT][FA_MAX_TILE / 8][4];
            FA_UNROLL
            for (int mt = 0; mt < MT; mt++)
                FA_UNROLL
                for (int j = 0; j < BK / 8; j++) s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.0f;
            /* S = Q K^T: each K fragment feeds MT m-tiles */
            FA_UNROLL
            for (int kk = 0; kk < HS / 16; kk++)
                FA_UNROLL
                for (int j = 0; j < BK / 16; j++) {
                    unsigned kf[4];
                    fa_ld_b_nk(kf, kb, LD, j * 16, kk * 16, lane);
                    FA_UNROLL
                    for (int mt = 0; mt < MT; mt++) {
                        nb_mma_bf16(s[mt][2 * j], qf[mt][kk], kf[0], kf[1]);
                        nb_mma_bf16(s[mt][2 * j + 1], qf[mt][kk], kf[2], kf[3]);
                    }
                }
            if (k0 + BK - 1 > w0) { /* the diagonal crosses this warp's part of the tile */
                FA_UNROLL
                for (int mt = 0; mt < MT; mt++)
                    FA_UNROLL
                    for (int j = 0; j < BK / 8; j++)
                        FA_UNROLL
                        for (int e = 0; e < 4; e++)
                            if (k0 + j * 8 + 2 * tq + (e & 1) > w0 + 16 * mt + gr + 8 * (e >> 1))
                                s[mt][j][e] = -INFINITY;
            }
            FA_UNROLL
            for (int mt = 0; mt < MT; mt++) {
                float mx[2] = {m[2 * mt], m[2 * mt + 1]}, ms[2], c[2], ps[2] = {0.0f, 0.0f};
                FA_UNROLL
                for (int j = 0; j < BK / 8; j++) {
                    mx[0] = fmaxf(mx[0], fmaxf(s[mt][j][0], s[mt][j][1]));
                    mx[1] = fmaxf(mx[1], fmaxf(s[mt][j][2], s[mt][j][3]));
                }
                FA_UNROLL
                for (int r = 0; r < 2; r++) {
                    /* the 4 lanes of a quad hold one row */
                    mx[r] = fmaxf(mx[r], nb_shfl_xor(mx[r], 1));
                    mx[r] = fmaxf(mx[r], nb_shfl_xor(mx[r], 2));
                    /* a row with no visible key yet keeps max -inf: subtract 0 there, not -inf */
                    ms[r] = mx[r] == -INFINITY ? 0.0f : mx[r] * a.sl2;
                    c[r] = nb_ex2(m[2 * mt + r] * a.sl2 - ms[r]);
                    m[2 * mt + r] = mx[r];
                }
                FA_UNROLL
                for (int j = 0; j < BK / 8; j++)
                    FA_UNROLL
                    for (int e = 0; e < 4; e++) {
                        s[mt][j][e] = nb_ex2(fmaf(s[mt][j][e], a.sl2, -ms[e >> 1]));
                        ps[e >> 1] += s[mt][j][e];
                    }
                /* l stays a per-lane partial sum (every lane of the quad scales by the same c);
                 * the quad's partials are added once, at the end */
                l[2 * mt] = l[2 * mt] * c[0] + ps[0];
                l[2 * mt + 1] = l[2 * mt + 1] * c[1] + ps[1];
                FA_UNROLL
                for (int d = 0; d < HS / 8; d++)
                    FA_UNROLL
                    for (int e = 0; e < 4; e++) o[mt][d][e] *= c[e >> 1];
            }
            /* O += P V: P straight from the accumulators; each V fragment feeds MT m-tiles */
            FA_UNROLL
            for (int kk = 0; kk < BK / 16; kk++) {
                unsigned pa[FA_MAX_MT][4];
                FA_UNROLL
                for (int mt = 0; mt < MT; mt++) fa_acc_to_a(pa[mt], s[mt][2 * kk], s[mt][2 * kk + 1]);
                FA_UNROLL
                for (int dn = 0; dn < HS / 16; dn++) {
                    unsigned vf[4];
                    fa_ld_b_kn(vf, vb, LD, kk * 16, dn * 16, lane);
                    FA_UNROLL
                    for (int mt = 0; mt < MT; mt++) {
                        nb_mma_bf16(o[mt][2 * dn], pa[mt], vf[0], vf[1]);
                        nb_mma_bf16(o[mt][2 * dn + 1], pa[mt], vf[2], vf[3]);
                    }
                }
            }
        }
        __syncthreads(); /* everyone is done with buffer kt & 1 before it is refilled */
    }

    float *lrow = lse + ((size_t)b * a.NH + h) * T;
    FA_UNROLL
    for (int i = 0; i < 2 * MT; i++) {
        const int r = w0 + 16 * (i >> 1) + gr + 8 * (i & 1);
        float li = l[i];
        li += nb_shfl_xor(li, 1);
        li += nb_shfl_xor(li, 2);
        const float inv = 1.0f / li;
        nb_bf16 *orow = out + ((size_t)b * T + r) * a.NH * HS + (size_t)h * HS + 2 * tq;
        if (r < T) {
            FA_UNROLL
            for (int d = 0; d < HS / 8; d++)
                *(unsigned *)(orow + d * 8) =
                    nb_pack_bf16x2(o[i >> 1][d][2 * (i & 1)] * inv, o[i >> 1][d][2 * (i & 1) + 1] * inv);
            if (tq == 0) lrow[r] = m[i] * a.scale + logf(li);
        }
    }
}

/* ---- backward ---- */

/* D[b, h, t] = dout[b, t, h, :] . out[b, t, h, :], fp32; 8 lanes per row, 16-byte loads. */
static __device__ __forceinline__ void fa_d(float *Dv, const nb_bf16 *dout, const nb_bf16 *out, size_t nrows,
                                            int T, int NH, int HS) {
    size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 3;
    int sub = threadIdx.x & 7;
    float s = 0.0f;
    if (row < nrows)
        for (int c = sub * 8; c < HS; c += 64) {
            const uint4 x = *(const uint4 *)(dout + row * HS + c), y = *(const uint4 *)(out + row * HS + c);
            s += fa_lo(x.x) * fa_lo(y.x) + fa_hi(x.x) * fa_hi(y.x) + fa_lo(x.y) * fa_lo(y.y) +
                 fa_hi(x.y) * fa_hi(y.y) + fa_lo(x.z) * fa_lo(y.z) + fa_hi(x.z) * fa_hi(y.z) +
                 fa_lo(x.w) * fa_lo(y.w) + fa_hi(x.w) * fa_hi(y.w);
        }
    s += nb_shfl_xor(s, 4); /* every lane takes part: the row test is not warp-uniform */
    s += nb_shfl_xor(s, 2);
    s += nb_shfl_xor(s, 1);
    if (row < nrows && sub == 0) {
        /* row enumerates (b, t, h) in memory order; D is stored [b, h, t] like lse */
        size_t bt = row / NH, b = bt / T;
        Dv[(b * NH + row % NH) * T + bt % T] = s;
    }
}

/* dq for BQ = 16*NW*MT query rows of one (b, h); walks key tiles of BK up to the diagonal. */
static __device__ __forceinline__ void fa_dq(nb_bf16 *dqkv, const nb_bf16 *dout, const nb_bf16 *qkv,
                                             const float *lse, const float *Dv, fa_dims a, const int HS,
                                             const int NW, const int MT, const int BK) {
    FA_SMEM(sm);
    const int LD = HS + FA_PAD, BQ = 16 * MT * NW, NT = 32 * NW;
    nb_bf16 *Qs = (nb_bf16 *)sm, *dOs = Qs + BQ * LD, *Ks = dOs + BQ * LD, *Vs = Ks + 2 * BK * LD;
    const int q0 = (gridDim.z - 1 - blockIdx.z) * BQ;
    const int h = blockIdx.x, b = blockIdx.y, kvh = h / a.group, T = a.T;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, tq = lane & 3;
    const nb_bf16 *base = qkv + (size_t)b * T * a.R;
    const nb_bf16 *kg = base + (size_t)(a.NH + kvh) * HS, *vg = kg + (size_t)a.NKV * HS;
    fa_load_tile(Qs, base + (size_t)h * HS, a.R, q0, BQ, T, HS, NT);
    fa_load_tile(dOs, dout + (size_t)b * T * a.NH * HS + (size_t)h * HS, (size_t)a.NH * HS, q0, BQ, T, HS, NT);
    fa_load_tile(Ks, kg, a.R, 0, BK, T, HS, NT);
    fa_load_tile(Vs, vg, a.R, 0, BK, T, HS, NT);
    nb_cp_async_commit();

    /* rows [w0, w0 + 16*MT); i = 2*mt + (e >> 1) names this thread's row w0 + 16*mt + gr (+ 8) */
    const int w0 = q0 + 16 * MT * warp;
    const size_t lrow = ((size_t)b * a.NH + h) * T;
    float L[2 * FA_MAX_MT], D[2 * FA_MAX_MT];
    FA_UNROLL
    for (int i = 0; i < 2 * MT; i++) {
        const int r = w0 + 16 * (i >> 1) + gr + 8 * (i & 1);
        /* queries past T: lse = +inf makes P = 0, so dS = 0 whatever D is */
        L[i] = r < T ? lse[lrow + r] * FA_LOG2E : INFINITY;
        D[i] = r < T ? Dv[lrow + r] : 0.0f;
    }
    const int nkt = (min(q0 + BQ, T) + BK - 1) / BK;
    float dq[FA_MAX_MT][FA_MAX_HS / 8][4];
    FA_UNROLL
    for (int mt = 0; mt < MT; mt++)
        FA_UNROLL
        for (int d = 0; d < HS / 8; d++) dq[mt][d][0] = dq[mt][d][1] = dq[mt][d][2] = dq[mt][d][3] = 0.0f;

    for (int kt = 0; kt < nkt; kt++) {
        const int k0 = kt * BK;
        if (kt + 1 < nkt) {
            fa_load_tile(Ks + ((kt + 1) & 1) * BK * LD, kg, a.R, k0 + BK, BK, T, HS, NT);
            fa_load_tile(Vs + ((kt + 1) & 1) * BK * LD, vg, a.R, k0 + BK, BK, T, HS, NT);
        }
        nb_cp_async_commit();
        nb_cp_async_wait1();
        __syncthreads();
        const nb_bf16 *kb = Ks + (kt & 1) * BK * LD, *vb = Vs + (kt & 1) * BK * LD;
        if (k0 <= w0 + 16 * MT - 1) {
            float s[FA_MAX_MT][FA_MAX_TILE / 8][4], dp[FA_MAX_MT][FA_MAX_TILE / 8][4];
            FA_UNROLL
            for (int mt = 0; mt < MT; mt++)
                FA_UNROLL
                for (int j = 0; j < BK / 8; j++)
                    FA_UNROLL
                    for (int e = 0; e < 4; e++) s[mt][j][e] = dp[mt][j][e] = 0.0f;
            /* S = Q K^T, dP = dO V^T */
            FA_UNROLL
            for (int kk = 0; kk < HS / 16; kk++) {
                unsigned qa[FA_MAX_MT][4], oa[FA_MAX_MT][4];
                FA_UNROLL
                for (int mt = 0; mt < MT; mt++) {
                    fa_ld_a(qa[mt], Qs, LD, 16 * (MT * warp + mt), kk * 16, lane);
                    fa_ld_a(oa[mt], dOs, LD, 16 * (MT * warp + mt), kk * 16, lane);
                }
                FA_UNROLL
                for (int j = 0; j < BK / 16; j++) {
                    unsigned f[4];
                    fa_ld_b_nk(f, kb, LD, j * 16, kk * 16, lane);
                    FA_UNROLL
                    for (int mt = 0; mt < MT; mt++) {
                        nb_mma_bf16(s[mt][2 * j], qa[mt], f[0], f[1]);
                        nb_mma_bf16(s[mt][2 * j + 1], qa[mt], f[2], f[3]);
                    }
                    fa_ld_b_nk(f, vb, LD, j * 16, kk * 16, lane);
                    FA_UNROLL
                    for (int mt = 0; mt < MT; mt++) {
                        nb_mma_bf16(dp[mt][2 * j], oa[mt], f[0], f[1]);
                        nb_mma_bf16(dp[mt][2 * j + 1], oa[mt], f[2], f[3]);
                    }
                }
            }
            const int diag = k0 + BK - 1 > w0;
            FA_UNROLL
            for (int mt = 0; mt < MT; mt++)
                FA_UNROLL
                for (int j = 0; j < BK / 8; j++)
                    FA_UNROLL
                    for (int e = 0; e < 4; e++) {
                        const int i = 2 * mt + (e >> 1);
                        float p = nb_ex2(fmaf(s[mt][j][e], a.sl2, -L[i]));
                        if (diag && k0 + j * 8 + 2 * tq + (e & 1) > w0 + 16 * mt + gr + 8 * (e >> 1)) p = 0.0f;
                        s[mt][j][e] = p * (dp[mt][j][e] - D[i]); /* dS */
                    }
            /* dQ += dS K */
            FA_UNROLL
            for (int kk = 0; kk < BK / 16; kk++) {
                unsigned da[FA_MAX_MT][4];
                FA_UNROLL
                for (int mt = 0; mt < MT; mt++) fa_acc_to_a(da[mt], s[mt][2 * kk], s[mt][2 * kk + 1]);
                FA_UNROLL
                for (int dn = 0; dn < HS / 16; dn++) {
                    unsigned f[4];
                    fa_ld_b_kn(f, kb, LD, kk * 16, dn * 16, lane);
                    FA_UNROLL
                    for (int mt = 0; mt < MT; mt++) {
                        nb_mma_bf16(dq[mt][2 * dn], da[mt], f[0], f[1]);
                        nb_mma_bf16(dq[mt][2 * dn + 1], da[mt], f[2], f[3]);
                    }
                }
            }
        }
        __syncthreads();
    }

    FA_UNROLL
    for (int i = 0; i < 2 * MT; i++) {
        const int r = w0 + 16 * (i >> 1) + gr + 8 * (i & 1);
        nb_bf16 *row = dqkv + ((size_t)b * T + r) * a.R + (size_t)h * HS + 2 * tq;
        if (r < T && a.acc)
            FA_UNROLL
            for (int d = 0; d < HS / 8; d++)
                fa_add2(row + d * 8, a.scale * dq[i >> 1][d][2 * (i & 1)], a.scale * dq[i >> 1][d][2 * (i & 1) + 1]);
        else if (r < T)
            FA_UNROLL
            for (int d = 0; d < HS / 8; d++)
                fa_set2(row + d * 8, a.scale * dq[i >> 1][d][2 * (i & 1)], a.scale * dq[i >> 1][d][2 * (i & 1) + 1]);
    }
}

/* One item of the dkv loop: query tile [q0, q0 + BQ) of query head h -> Q, dO buffers (async). */
static __device__ __forceinline__ void fa_dkv_issue(nb_bf16 *Qb, nb_bf16 *Ob, const nb_bf16 *qkv,
                                                    const nb_bf16 *dout, fa_dims a, int b, int h, int q0,
                                                    const int HS, const int BQ, const int NT) {
    fa_load_tile(Qb, qkv + (size_t)b * a.T * a.R + (size_t)h * HS, a.R, q0, BQ, a.T, HS, NT);
    fa_load_tile(Ob, dout + (size_t)b * a.T * a.NH * HS + (size_t)h * HS, (size_t)a.NH * HS, q0, BQ, a.T, HS, NT);
}

/* dk, dv for BKV = 16*NW*MT keys of one (b, kv head); items = (query head of the group, query
 * tile of BQ from the diagonal on), in that order. */
static __device__ __forceinline__ void fa_dkv(nb_bf16 *dqkv, const nb_bf16 *dout, const nb_bf16 *qkv,
                                              const float *lse, const float *Dv, fa_dims a, const int HS,
                                              const int NW, const int MT, const int BQ) {
    FA_SMEM(sm);
    const int LD = HS + FA_PAD, BKV = 16 * MT * NW, NT = 32 * NW;
    nb_bf16 *Ks = (nb_bf16 *)sm, *Vs = Ks + BKV * LD, *Qs = Vs + BKV * LD, *dOs = Qs + 2 * BQ * LD;
    float *Ls = (float *)(dOs + 2 * BQ * LD), *Ds = Ls + 2 * BQ; /* [2][BQ] each */
    const int k0 = blockIdx.z * BKV, kvh = blockIdx.x, b = blockIdx.y, T = a.T;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, tq = lane & 3;
    const nb_bf16 *kg = qkv + (size_t)b * T * a.R + (size_t)(a.NH + kvh) * HS, *vg = kg + (size_t)a.NKV * HS;
    const int qt0 = k0 / BQ, nq = (T + BQ - 1) / BQ - qt0, nit = a.group * nq, h0 = kvh * a.group;

    fa_load_tile(Ks, kg, a.R, k0, BKV, T, HS, NT);
    fa_load_tile(Vs, vg, a.R, k0, BKV, T, HS, NT);
    fa_dkv_issue(Qs, dOs, qkv, dout, a, b, h0, qt0 * BQ, HS, BQ, NT);
    nb_cp_async_commit();
    /* lse (as log2) and D of the item's queries; +inf lse for queries past T (P = 0) */
    float nl = 0.0f, nd = 0.0f;
    if (threadIdx.x < BQ) {
        int t = qt0 * BQ + threadIdx.x;
        size_t i = ((size_t)b * a.NH + h0) * T + t;
        Ls[threadIdx.x] = t < T ? lse[i] * FA_LOG2E : INFINITY;
        Ds[threadIdx.x] = t < T ? Dv[i] : 0.0f;
    }

    /* keys [w0, w0 + 16*MT); this thread's keys: w0 + 16*mt + gr (+ 8) */
    const int w0 = k0 + 16 * MT * warp;
    float dk[FA_MAX_MT][FA_MAX_HS / 8][4], dv[FA_MAX_MT][FA_MAX_HS / 8][4];
    FA_UNROLL
    for (int mt = 0; mt < MT; mt++)
        FA_UNROLL
        for (int d = 0; d < HS / 8; d++)
            FA_UNROLL
            for (int e = 0; e < 4; e++) dk[mt][d][e] = dv[mt][d][e] = 0.0f;

    for (int it = 0; it < nit; it++) {
        const int nx = it + 1 < nit;
        if (nx) {
            const int h = h0 + (it + 1) / nq, q0 = (qt0 + (it + 1) % nq) * BQ;
            fa_dkv_issue(Qs + ((it + 1) & 1) * BQ * LD, dOs + ((it + 1) & 1) * BQ * LD, qkv, dout, a, b, h, q0,
                         HS, BQ, NT);
            /* into registers now, into shared memory after this item's products: the loads'
             * latency hides behind the math */
            if (threadIdx.x < BQ) {
                int t = q0 + threadIdx.x;
                size_t i = ((size_t)b * a.NH + h) * T + t;
                nl = t < T ? lse[i] * FA_LOG2E : INFINITY;
                nd = t < T ? Dv[i] : 0.0f;
            }
        }
        nb_cp_async_commit();
        nb_cp_async_wait1();
        __syncthreads();
        const int q0 = (qt0 + it % nq) * BQ, buf = it & 1;
        const nb_bf16 *qb = Qs + buf * BQ * LD, *ob = dOs + buf * BQ * LD;
        const float *lb = Ls + buf * BQ, *db = Ds + buf * BQ;
        if (q0 + BQ - 1 >= w0) { /* some query of the tile sees some key of the warp */
            float st[FA_MAX_MT][FA_MAX_TILE / 8][4], dpt[FA_MAX_MT][FA_MAX_TILE / 8][4]; /* S^T, dP^T */
            FA_UNROLL
            for (int mt = 0; mt < MT; mt++)
                FA_UNROLL
                for (int j = 0; j < BQ / 8; j++)
                    FA_UNROLL
                    for (int e = 0; e < 4; e++) st[mt][j][e] = dpt[mt][j][e] = 0.0f;
            /* S^T = K Q^T, dP^T = V dO^T */
            FA_UNROLL
            for (int kk = 0; kk < HS / 16; kk++) {
                unsigned ka[FA_MAX_MT][4], va[FA_MAX_MT][4];
                FA_UNROLL
                for (int mt = 0; mt < MT; mt++) {
                    fa_ld_a(ka[mt], Ks, LD, 16 * (MT * warp + mt), kk * 16, lane);
                    fa_ld_a(va[mt], Vs, LD, 16 * (MT * warp + mt), kk * 16, lane);
                }
                FA_UNROLL
                for (int j = 0; j < BQ / 16; j++) {
                    unsigned f[4];
                    fa_ld_b_nk(f, qb, LD, j * 16, kk * 16, lane);
                    FA_UNROLL
                    for (int mt = 0; mt < MT; mt++) {
                        nb_mma_bf16(st[mt][2 * j], ka[mt], f[0], f[1]);
                        nb_mma_bf16(st[mt][2 * j + 1], ka[mt], f[2], f[3]);
                    }
                    fa_ld_b_nk(f, ob, LD, j * 16, kk * 16, lane);
                    FA_UNROLL
                    for (int mt = 0; mt < MT; mt++) {
                        nb_mma_bf16(dpt[mt][2 * j], va[mt], f[0], f[1]);
                        nb_mma_bf16(dpt[mt][2 * j + 1], va[mt], f[2], f[3]);
                    }
                }
            }
            const int diag = q0 < w0 + 16 * MT - 1; /* some query of the tile comes before some key */
            FA_UNROLL
            for (int mt = 0; mt < MT; mt++)
                FA_UNROLL
                for (int j = 0; j < BQ / 8; j++)
                    FA_UNROLL
                    for (int e = 0; e < 4; e++) {
                        const int qi = j * 8 + 2 * tq + (e & 1);
                        float p = nb_ex2(fmaf(st[mt][j][e], a.sl2, -lb[qi]));
                        if (diag && q0 + qi < w0 + 16 * mt + gr + 8 * (e >> 1)) p = 0.0f;
                        st[mt][j][e] = p;
                        dpt[mt][j][e] = p * (dpt[mt][j][e] - db[qi]); /* dS^T */
                    }
            /* dV += P^T dO, dK += dS^T Q */
            FA_UNROLL
            for (int kk = 0; kk < BQ / 16; kk++) {
                unsigned pa[FA_MAX_MT][4], da[FA_MAX_MT][4];
                FA_UNROLL
                for (int mt = 0; mt < MT; mt++) {
                    fa_acc_to_a(pa[mt], st[mt][2 * kk], st[mt][2 * kk + 1]);
                    fa_acc_to_a(da[mt], dpt[mt][2 * kk], dpt[mt][2 * kk + 1]);
                }
                FA_UNROLL
                for (int dn = 0; dn < HS / 16; dn++) {
                    unsigned f[4];
                    fa_ld_b_kn(f, ob, LD, kk * 16, dn * 16, lane);
                    FA_UNROLL
                    for (int mt = 0; mt < MT; mt++) {
                        nb_mma_bf16(dv[mt][2 * dn], pa[mt], f[0], f[1]);
                        nb_mma_bf16(dv[mt][2 * dn + 1], pa[mt], f[2], f[3]);
                    }
                    fa_ld_b_kn(f, qb, LD, kk * 16, dn * 16, lane);
                    FA_UNROLL
                    for (int mt = 0; mt < MT; mt++) {
                        nb_mma_bf16(dk[mt][2 * dn], da[mt], f[0], f[1]);
                        nb_mma_bf16(dk[mt][2 * dn + 1], da[mt], f[2], f[3]);
                    }
                }
            }
        }
        if (nx && threadIdx.x < BQ) { /* buffer buf ^ 1 was last read before the previous barrier */
            Ls[(buf ^ 1) * BQ + threadIdx.x] = nl;
            Ds[(buf ^ 1) * BQ + threadIdx.x] = nd;
        }
        __syncthreads();
    }

    const size_t voff = (size_t)a.NKV * HS;
    FA_UNROLL
    for (int i = 0; i < 2 * MT; i++) {
        const int key = w0 + 16 * (i >> 1) + gr + 8 * (i & 1), mt = i >> 1, e = 2 * (i & 1);
        nb_bf16 *krow = dqkv + ((size_t)b * T + key) * a.R + (size_t)(a.NH + kvh) * HS + 2 * tq;
        if (key < T && a.acc)
            FA_UNROLL
            for (int d = 0; d < HS / 8; d++) {
                fa_add2(krow + d * 8, a.scale * dk[mt][d][e], a.scale * dk[mt][d][e + 1]);
                fa_add2(krow + voff + d * 8, dv[mt][d][e], dv[mt][d][e + 1]);
            }
        else if (key < T)
            FA_UNROLL
            for (int d = 0; d < HS / 8; d++) {
                fa_set2(krow + d * 8, a.scale * dk[mt][d][e], a.scale * dk[mt][d][e + 1]);
                fa_set2(krow + voff + d * 8, dv[mt][d][e], dv[mt][d][e + 1]);
            }
    }
}

/* ---- kernels: one per (head size, tile shape) ----
 * Tile shapes: NW warps of MT m-tiles (16 rows each: queries, keys for dk/dv); the inner tile
 * (BK keys for the forward and dq, BQ queries for dk/dv); MINB blocks per multiprocessor asked of
 * the register allocator (1: no limit below 255). Each is the fastest of the shapes timed on an
 * H200 at T = 1024..4096 (the others were dropped after ae09253, whose -DFA_TUNE build and
 * test_attention_fa --tune timed them). A kernel is named fa_KIND_HS_NW_MT_TILE_MINB; its
 * arguments are literals, so every loop unrolls and every register array stays in registers. */
static __global__ void __launch_bounds__(4 * 32, 1) fa_fwd_64_4_2_64_1(nb_bf16 *out, float *lse, const nb_bf16 *qkv,
                                                                      fa_dims a) {
    fa_fwd(out, lse, qkv, a, 64, 4, 2, 64);
}
static __global__ void __launch_bounds__(8 * 32, 1) fa_fwd_128_8_1_64_1(nb_bf16 *out, float *lse, const nb_bf16 *qkv,
                                                                       fa_dims a) {
    fa_fwd(out, lse, qkv, a, 128, 8, 1, 64);
}
static __global__ void __launch_bounds__(4 * 32, 1) fa_dq_64_4_2_32_1(nb_bf16 *dqkv, const nb_bf16 *dout,
                                                                     const nb_bf16 *qkv, const float *lse,
                                                                     const float *Dv, fa_dims a) {
    fa_dq(dqkv, dout, qkv, lse, Dv, a, 64, 4, 2, 32);
}
static __global__ void __launch_bounds__(4 * 32, 1) fa_dq_128_4_1_32_1(nb_bf16 *dqkv, const nb_bf16 *dout,
                                                                      const nb_bf16 *qkv, const float *lse,
                                                                      const float *Dv, fa_dims a) {
    fa_dq(dqkv, dout, qkv, lse, Dv, a, 128, 4, 1, 32);
}
static __global__ void __launch_bounds__(4 * 32, 1) fa_dkv_64_4_1_64_1(nb_bf16 *dqkv, const nb_bf16 *dout,
                                                                      const nb_bf16 *qkv, const float *lse,
                                                                      const float *Dv, fa_dims a) {
    fa_dkv(dqkv, dout, qkv, lse, Dv, a, 64, 4, 1, 64);
}
static __global__ void __launch_bounds__(4 * 32, 1) fa_dkv_128_4_1_32_1(nb_bf16 *dqkv, const nb_bf16 *dout,
                                                                       const nb_bf16 *qkv, const float *lse,
                                                                       const float *Dv, fa_dims a) {
    fa_dkv(dqkv, dout, qkv, lse, Dv, a, 128, 4, 1, 32);
}

#define FA_D_THREADS 256
static __global__ void __launch_bounds__(FA_D_THREADS)
    fa_d_kernel(float *Dv, const nb_bf16 *dout, const nb_bf16 *out, size_t nrows, int T, int NH, int HS) {
    fa_d(Dv, dout, out, nrows, T, NH, HS);
}

/* ---- kernel table and launch shapes (shared with the CPU emulator) ---- */

typedef void (*fa_fwd_fn)(nb_bf16 *, float *, const nb_bf16 *, fa_dims);
typedef void (*fa_bwd_fn)(nb_bf16 *, const nb_bf16 *, const nb_bf16 *, const float *, const float *, fa_dims);

/* One compiled kernel: kind 0 (forward: fwd set), 1 (dq) or 2 (dk/dv; bwd set); 16*nw*mt rows
 * per block (queries; keys for dk/dv) and the inner tile. */
typedef struct {
    int kind, hs, nw, mt, tile;
    fa_fwd_fn fwd;
    fa_bwd_fn bwd;
    const char *name;
} fa_kernel;

static const fa_kernel fa_kernels[] = {
    {0, 64, 4, 2, 64, fa_fwd_64_4_2_64_1, NULL, "forward HS 64: 4 warps x 2 m-tiles, 64-key tiles, min blocks 1"},
    {0, 128, 8, 1, 64, fa_fwd_128_8_1_64_1, NULL, "forward HS 128: 8 warps x 1 m-tiles, 64-key tiles, min blocks 1"},
    {1, 64, 4, 2, 32, NULL, fa_dq_64_4_2_32_1, "dq HS 64: 4 warps x 2 m-tiles, 32-key tiles, min blocks 1"},
    {1, 128, 4, 1, 32, NULL, fa_dq_128_4_1_32_1, "dq HS 128: 4 warps x 1 m-tiles, 32-key tiles, min blocks 1"},
    {2, 64, 4, 1, 64, NULL, fa_dkv_64_4_1_64_1, "dk/dv HS 64: 4 warps x 1 m-tiles, 64-query tiles, min blocks 1"},
    {2, 128, 4, 1, 32, NULL, fa_dkv_128_4_1_32_1, "dk/dv HS 128: 4 warps x 1 m-tiles, 32-query tiles, min blocks 1"},
};
#define FA_NKERNELS ((int)(sizeof fa_kernels / sizeof fa_kernels[0]))

/* The v-th compiled kernel of this kind and head size (v = 0: the default), or NULL. */
static const fa_kernel *fa_find(int kind, int HS, int v) {
    for (int i = 0; i < FA_NKERNELS; i++)
        if (fa_kernels[i].kind == kind && fa_kernels[i].hs == HS && v-- == 0) return &fa_kernels[i];
    return NULL;
}

static fa_dims fa_dims_of(int T, int NH, int NKV, int HS) {
    fa_dims a;
    a.T = T, a.NH = NH, a.NKV = NKV, a.R = (NH + 2 * NKV) * HS, a.group = NH / NKV;
    a.scale = 1.0f / sqrtf((float)HS);
    a.sl2 = a.scale * FA_LOG2E;
    a.acc = 1;
    return a;
}

/* Grid (x, y, z), threads and dynamic shared memory of a launch of k. */
typedef struct {
    unsigned grid[3], threads;
    size_t smem;
} fa_launch;

static fa_launch fa_launch_of(const fa_kernel *k, int B, int T, int NH, int NKV) {
    const int rows = 16 * k->nw * k->mt, pitch = (k->hs + FA_PAD) * (int)sizeof(nb_bf16);
    fa_launch l;
    l.grid[0] = (unsigned)(k->kind == 2 ? NKV : NH);
    l.grid[1] = (unsigned)B;
    l.grid[2] = (unsigned)((T + rows - 1) / rows);
    l.threads = 32u * (unsigned)k->nw;
    /* forward: Q + two stages of K, V; dq: Q, dO + two of K, V; dkv: K, V + two of Q, dO, lse, D */
    l.smem = (size_t)((k->kind == 0 ? rows : 2 * rows) + 4 * k->tile) * pitch;
    if (k->kind == 2) l.smem += 4 * (size_t)k->tile * sizeof(float);
    return l;
}

#define FA_D_ROWS_PER_BLOCK (FA_D_THREADS / 8)

/* ---- launchers ---- */
#ifndef FA_EMU

static int fa_hs_slot(int HS) { return HS == 64 ? 0 : HS == 128 ? 1 : -1; }

/* The kernel of this kind for a head size with kernels. */
static const fa_kernel *fa_pick(int kind, int HS) { return fa_find(kind, HS, 0); }

static int fa_aligned(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* Whether the tensor-core path takes this call: a head size with kernels, 16-byte aligned
 * tensors (rows move in 16-byte pieces), and a grid within CUDA's limits. */
static int fa_usable(int B, int T, int NH, int NKV, int HS, const void *p0, const void *p1, const void *p2,
                     const void *p3) {
    if (fa_hs_slot(HS) < 0 || NKV <= 0 || NH % NKV != 0 || B > 65535 || NH > 65535) return 0;
    if (!fa_aligned(p0) || !fa_aligned(p1) || !fa_aligned(p2) || !fa_aligned(p3)) return 0;
    return (T + 15) / 16 <= 65535;
}

/* Dynamic shared memory above 48 KB must be allowed per kernel before the launch. */
static fa_launch fa_prepare(const fa_kernel *k, const void *fn, int B, int T, int NH, int NKV) {
    fa_launch l = fa_launch_of(k, B, T, NH, NKV);
    CUDA_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)l.smem));
    return l;
}
#define FA_GRID(l) dim3((l).grid[0], (l).grid[1], (l).grid[2])

extern "C" int nb_cuda_attention_fa_forward_bf16(nb_bf16 *out, float *lse, const nb_bf16 *qkv, int B, int T,
                                                  int NH, int NKV, int HS, nb_stream_t stream) {
    if (!fa_usable(B, T, NH, NKV, HS, out, qkv, qkv, qkv)) return 0;
    NB_CUDA_SHAPE(out && lse && qkv, "nb_cuda_attention_fa_forward_bf16");
    if (B <= 0 || T <= 0) return 1;
    const fa_kernel *k = fa_pick(0, HS);
    fa_launch l = fa_prepare(k, (const void *)k->fwd, B, T, NH, NKV);
    k->fwd<<<FA_GRID(l), l.threads, l.smem, stream>>>(out, lse, qkv, fa_dims_of(T, NH, NKV, HS));
    CUDA_CHECK_LAUNCH("attention forward (tensor cores)");
    return 1;
}

/* acc 1: dqkv += the gradient (the op's contract); 0: dqkv = the gradient (every element of the
 * q, k and v columns is stored once, its old contents never read: no memset needed before). */
extern "C" int nb_cuda_attention_fa_backward_mode_bf16(nb_bf16 *dqkv, const nb_bf16 *dout, const nb_bf16 *qkv,
                                                        const nb_bf16 *out, const float *lse, int B, int T, int NH,
                                                        int NKV, int HS, int acc, nb_stream_t stream) {
    if (!fa_usable(B, T, NH, NKV, HS, dqkv, dout, qkv, out)) return 0;
    if (!dqkv || B <= 0 || T <= 0) return 1;
    NB_CUDA_SHAPE(dout && qkv && out && lse, "nb_cuda_attention_fa_backward_bf16");
    fa_dims a = fa_dims_of(T, NH, NKV, HS);
    a.acc = acc != 0;
    size_t nrows = (size_t)B * T * NH;
    float *Dv = (float *)nb_cuda_scratch(nrows * sizeof(float), stream);
    fa_d_kernel<<<(unsigned)((nrows + FA_D_ROWS_PER_BLOCK - 1) / FA_D_ROWS_PER_BLOCK), FA_D_THREADS, 0, stream>>>(
        Dv, dout, out, nrows, T, NH, HS);
    CUDA_CHECK_LAUNCH("attention backward (D = rowsum(dout * out))");
    /* dq and dk/dv write disjoint columns of dqkv: no order between them matters */
    for (int kind = 1; kind <= 2; kind++) {
        const fa_kernel *k = fa_pick(kind, HS);
        fa_launch l = fa_prepare(k, (const void *)k->bwd, B, T, NH, NKV);
        k->bwd<<<FA_GRID(l), l.threads, l.smem, stream>>>(dqkv, dout, qkv, lse, Dv, a);
        CUDA_CHECK_LAUNCH(kind == 1 ? "attention backward (dq, tensor cores)"
                                    : "attention backward (dk, dv, tensor cores)");
    }
    nb_cuda_scratch_free(Dv, stream);
    return 1;
}

extern "C" int nb_cuda_attention_fa_backward_bf16(nb_bf16 *dqkv, const nb_bf16 *dout, const nb_bf16 *qkv,
                                                   const nb_bf16 *out, const float *lse, int B, int T, int NH,
                                                   int NKV, int HS, nb_stream_t stream) {
    return nb_cuda_attention_fa_backward_mode_bf16(dqkv, dout, qkv, out, lse, B, T, NH, NKV, HS, 1, stream);
}

#endif /* FA_EMU */
