/* LayerNorm and RMSNorm on CUDA, same formulas as norm.c.
 *
 * Row kernels: one warp per row (8 rows per 256-thread block); row statistics in fp32, two-pass
 * variance (no cancellation when |mean| >> std), warp sums by xor butterfly. The dw / db
 * reductions over rows run in two fixed-order passes: partial sums over a fixed block of rows,
 * then a second pass adds the partials in order. No atomics anywhere.
 *
 * LayerNorm backward is one fused pass (ln_bwd_kernel): each warp reads its rows once with
 * 16-byte loads, keeps them in registers for dinp's second sweep, and adds dout * xhat and dout
 * into per-warp column sums in shared memory; the block then writes one partial row of dw and
 * db, and nb_col_finish2 adds the partials in a fixed order. Two launches, ~8 bytes of traffic
 * per bf16 element (the old path: four launches, dout and inp read twice with 2-byte loads).
 * RMSNorm's backward is the same kernel with mean 0 and no mean(g) term (mean == NULL).
 *
 * The forwards read 16-byte vectors too when rows and tensors allow it, a row held in registers
 * across the passes over it; the scalar kernels serve every other shape. */
#include "ops_cuda_common.cuh"

#define ROWS_PER_BLOCK 8

static unsigned row_blocks(int N) { return (unsigned)((N + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK); }

/* ---- LayerNorm ---- */

template <typename T>
static __global__ void ln_fwd_kernel(T *out, float *mean, float *rstd, const T *inp, const T *w, const T *b, int N,
                                     int C, float eps) {
    int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    const T *x = inp + (size_t)row * C;
    T *y = out + (size_t)row * C;
    float s = 0.0f;
    for (int i = lane; i < C; i += 32) s += nb_ld(x + i);
    float m = nb_warp_sum(s) / C;
    float ss = 0.0f;
    for (int i = lane; i < C; i += 32) {
        float d = nb_ld(x + i) - m;
        ss += d * d;
    }
    float r = 1.0f / sqrtf(nb_warp_sum(ss) / C + eps);
    for (int i = lane; i < C; i += 32) nb_st(y + i, (nb_ld(x + i) - m) * r * nb_ld(w + i) + nb_ld(b + i));
    if (lane == 0) {
        if (mean) mean[row] = m;
        if (rstd) rstd[row] = r;
    }
}

/* dx += rstd * (g - mean(g) - xhat * mean(g * xhat)), g = w * dout. */
template <typename T>
static __global__ void ln_dinp_kernel(T *dinp, const T *dout, const T *inp, const T *w, const float *mean,
                                      const float *rstd, int N, int C) {
    int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    const T *x = inp + (size_t)row * C, *dy = dout + (size_t)row * C;
    T *dx = dinp + (size_t)row * C;
    float m = mean[row], r = rstd[row];
    float sg = 0.0f, sgx = 0.0f;
    for (int i = lane; i < C; i += 32) {
        float xhat = (nb_ld(x + i) - m) * r, g = nb_ld(w + i) * nb_ld(dy + i);
        sg += g;
        sgx += g * xhat;
    }
    float mg = nb_warp_sum(sg) / C, mgx = nb_warp_sum(sgx) / C;
    for (int i = lane; i < C; i += 32) {
        float xhat = (nb_ld(x + i) - m) * r, g = nb_ld(w + i) * nb_ld(dy + i);
        nb_st(dx + i, nb_ld(dx + i) + (g - mg - xhat * mgx) * r);
    }
}

/* First pass of dw / db: part_w[k][c] = sum dout * xhat, part_b[k][c] = sum dout over the k-th
 * block of NB_COL_ROWS rows; block (32, 8): 32 columns, 8 row lanes, combined in lane order. */
template <typename T>
static __global__ void ln_dparams_kernel(float *part_w, float *part_b, const T *dout, const T *inp, const float *mean,
                                         const float *rstd, int N, int C) {
    __shared__ float sw[8][33], sb[8][33];
    int c = blockIdx.x * 32 + threadIdx.x;
    int r0 = blockIdx.y * NB_COL_ROWS, r1 = min(N, r0 + NB_COL_ROWS);
    float aw = 0.0f, ab = 0.0f;
    if (c < C)
        for (int r = r0 + threadIdx.y; r < r1; r += 8) {
            float dy = nb_ld(dout + (size_t)r * C + c);
            aw += dy * ((nb_ld(inp + (size_t)r * C + c) - mean[r]) * rstd[r]);
            ab += dy;
        }
    sw[threadIdx.y][threadIdx.x] = aw;
    sb[threadIdx.y][threadIdx.x] = ab;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float s1 = 0.0f, s2 = 0.0f;
        for (int i = 0; i < 8; i++) {
            s1 += sw[i][threadIdx.x];
            s2 += sb[i][threadIdx.x];
        }
        part_w[(size_t)blockIdx.y * C + c] = s1;
        part_b[(size_t)blockIdx.y * C + c] = s2;
    }
}

/* ---- LayerNorm backward, fused ---- */

/* Vector access: RAW is what one lane loads (16 bytes, or one element in the scalar variant),
 * ln_unpack turns it into fp32 (bf16 -> fp32 is exact), ln_st rounds back (nearest even). */
static __device__ __forceinline__ void ln_unpack(float a, float *v) { v[0] = a; }
static __device__ __forceinline__ void ln_unpack(nb_bf16_t a, float *v) { v[0] = __bfloat162float(a); }
static __device__ __forceinline__ void ln_unpack(float4 a, float *v) { v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w; }
static __device__ __forceinline__ void ln_unpack(uint4 a, float *v) { nb_bf16x8_unpack(a, v); }
static __device__ __forceinline__ void ln_st(float *p, const float *v) { *p = v[0]; }
static __device__ __forceinline__ void ln_st(nb_bf16_t *p, const float *v) { *p = __float2bfloat16_rn(v[0]); }
static __device__ __forceinline__ void ln_st(float4 *p, const float *v) { *p = make_float4(v[0], v[1], v[2], v[3]); }
static __device__ __forceinline__ void ln_st(uint4 *p, const float *v) { *p = nb_bf16x8_pack(v); }

/* Layout. A row is nv = C / VEC vectors; lane l of a warp owns vectors l, l + 32, ... (slot k
 * holds vector 32k + l). Slots below LNB_KEEP stay in registers (raw, 4 registers per slot and
 * tensor) between the two sweeps over a row (C <= 2048 in bf16, 1024 in fp32); further slots
 * are read again (L1/L2 hits).
 * Column sums: warp q of the block owns 2 * Cp floats of shared memory (dw sums, then db sums;
 * Cp alone in RMS mode, which has no db), Cp = 32 * VEC * slots; the sum of column (vector
 * 32k + l, element e) sits at index
 * (k * VEC + e) * 32 + l: every lane only ever touches its own indices (no races, no barrier,
 * no bank conflicts). Warps per block W depend on C alone (LNB_SMEM_FLOATS bounds W * 2 * Cp),
 * and block b sums rows [b * R, b * R + R) with R from N alone, warp q taking rows q, q + W, ...:
 * the partial sums, hence dw and db, have the same bits whatever the vector width or which of
 * dinp / dw / db are wanted (their products use explicitly rounded intrinsics).
 * RMS mode (mean == NULL): xhat = x * rstd, m = 0 and mean(g) = 0 taken as values (the LN code
 * path is unchanged; in RMS mode the subtractions of 0 are exact), no db sums, part_b unused. */
#define LNB_KEEP 8
#define LNB_MAX_WARPS 8
#define LNB_SMEM_FLOATS 12288 /* 48 KB: the static shared-memory limit, no opt-in needed */

static int lnb_pad_cols(int C) { return (C + 255) / 256 * 256; } /* >= Cp for every VEC */
static int lnb_warps(int C) {
    int w = LNB_SMEM_FLOATS / (2 * lnb_pad_cols(C));
    return w > LNB_MAX_WARPS ? LNB_MAX_WARPS : w; /* 0: C too wide, the unfused path */
}
/* rows per block: about 512 blocks for large N (enough to fill the GPU, few partials), at
 * least 16 rows (two per warp) */
static int lnb_rows(int N) {
    int r = (N + 511) / 512;
    return r < 16 ? 16 : r;
}

/* Sweep 1 over vector slot k of a row, xv / dv / wv unpacked: the row sums sg of g = w * dout
 * (LN only) and sgx of g * xhat, and (sums) the column sums aw of dout * xhat and (LN only) ab
 * of dout. */
template <int VEC>
static __device__ __forceinline__ void lnb_sweep1(float &sg, float &sgx, float *aw, float *ab, const float *xv,
                                                  const float *dv, const float *wv, float m, float r, int k, int lane,
                                                  int rms, int sums) {
#pragma unroll
    for (int e = 0; e < VEC; e++) {
        const float xhat = __fmul_rn(__fsub_rn(xv[e], m), r), g = __fmul_rn(wv[e], dv[e]);
        if (!rms) sg += g;
        sgx += g * xhat;
        if (sums) {
            const int si = (k * VEC + e) * 32 + lane;
            aw[si] = __fadd_rn(aw[si], __fmul_rn(dv[e], xhat));
            if (!rms) ab[si] = __fadd_rn(ab[si], dv[e]);
        }
    }
}
/* Sweep 2 over vector v: dinp += rstd * (g - mean(g) - xhat * mean(g * xhat)); in RMS mode
 * mean(g) = 0, which makes it RMSNorm's r * g - x * r^3 * mean(g * x). */
template <typename RAW, int VEC, typename T>
static __device__ __forceinline__ void lnb_sweep2(T *dx, int v, const float *xv, const float *dv, const float *wv,
                                                  float m, float r, float mg, float mgx) {
    float ov[VEC];
    ln_unpack(*(const RAW *)(dx + (size_t)v * VEC), ov);
#pragma unroll
    for (int e = 0; e < VEC; e++) {
        const float xhat = (xv[e] - m) * r, g = wv[e] * dv[e];
        ov[e] = ov[e] + (g - mg - xhat * mgx) * r;
    }
    ln_st((RAW *)(dx + (size_t)v * VEC), ov);
}

/* The fused backward's per-warp column sums: zeroed by each lane at its own indices; at the end
 * the block's partial row, warps added in order 0..W-1 (each sum at (slot * VEC + e) * 32 + lane). */
static __device__ __forceinline__ void lnb_zero_sums(float *aw, int S, int lane) {
    for (int i = lane; i < S; i += 32) aw[i] = 0.0f;
}
static __device__ __forceinline__ void lnb_write_partial(float *part_w, float *part_b, const float *sh, int C, int vec,
                                                         int S, int Cp, int rms) {
    const int W = blockDim.x >> 5;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        const int v = c / vec, e = c - v * vec, si = ((v >> 5) * vec + e) * 32 + (v & 31);
        float s1 = 0.0f, s2 = 0.0f;
        for (int q = 0; q < W; q++) {
            s1 = __fadd_rn(s1, sh[(size_t)q * S + si]);
            if (!rms) s2 = __fadd_rn(s2, sh[(size_t)q * S + Cp + si]);
        }
        part_w[(size_t)blockIdx.x * C + c] = s1;
        if (!rms) part_b[(size_t)blockIdx.x * C + c] = s2;
    }
}

/* T: the element type; RAW: what a lane loads at once (T itself, or 16 bytes: VEC elements).
 * Each sweep over a row takes the vectors kept in registers (kx, kd: the first LNB_KEEP per lane),
 * then the rest from memory. */
template <typename T, typename RAW>
static __global__ void __launch_bounds__(32 * LNB_MAX_WARPS, 2)
    ln_bwd_kernel(T *dinp, float *part_w, float *part_b, const T *dout, const T *inp, const T *w, const float *mean,
                  const float *rstd, int N, int C, int R) {
    constexpr int VEC = sizeof(RAW) / sizeof(T);
    extern __shared__ float lnb_sh[];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, W = blockDim.x >> 5;
    const int nv = C / VEC, K = (nv + 31) >> 5, Cp = K * 32 * VEC;
    const int sums = part_w != NULL, rms = mean == NULL, S = rms ? Cp : 2 * Cp; /* S: per warp */
    float *aw = lnb_sh + (size_t)wid * S, *ab = aw + Cp;
    if (sums) lnb_zero_sums(aw, S, lane);
    const int r0 = blockIdx.x * R, r1 = min(N, r0 + R);
    for (int row = r0 + wid; row < r1; row += W) {
        const T *x = inp + (size_t)row * C, *dy = dout + (size_t)row * C;
        const float m = rms ? 0.0f : mean[row], r = rstd[row];
        RAW kx[LNB_KEEP], kd[LNB_KEEP];
#pragma unroll
        for (int k = 0; k < LNB_KEEP; k++) { /* all loads in flight first */
            const int v = k * 32 + lane;
            if (v < nv) {
                kx[k] = *(const RAW *)(x + (size_t)v * VEC);
                kd[k] = *(const RAW *)(dy + (size_t)v * VEC);
            }
        }
        float sg = 0.0f, sgx = 0.0f;
#pragma unroll
        for (int k = 0; k < LNB_KEEP; k++) {
            const int v = k * 32 + lane;
            if (v < nv) {
                float xv[VEC], dv[VEC], wv[VEC];
                ln_unpack(kx[k], xv), ln_unpack(kd[k], dv);
                ln_unpack(*(const RAW *)(w + (size_t)v * VEC), wv);
                lnb_sweep1<VEC>(sg, sgx, aw, ab, xv, dv, wv, m, r, k, lane, rms, sums);
            }
        }
        for (int k = LNB_KEEP; k < K; k++) {
            const int v = k * 32 + lane;
            if (v >= nv) break;
            float xv[VEC], dv[VEC], wv[VEC];
            ln_unpack(*(const RAW *)(x + (size_t)v * VEC), xv);
            ln_unpack(*(const RAW *)(dy + (size_t)v * VEC), dv);
            ln_unpack(*(const RAW *)(w + (size_t)v * VEC), wv);
            lnb_sweep1<VEC>(sg, sgx, aw, ab, xv, dv, wv, m, r, k, lane, rms, sums);
        }
        if (!dinp) continue; /* uniform over the warp */
        const float mg = rms ? 0.0f : nb_warp_sum(sg) / C, mgx = nb_warp_sum(sgx) / C;
        T *dx = dinp + (size_t)row * C;
#pragma unroll
        for (int k = 0; k < LNB_KEEP; k++) {
            const int v = k * 32 + lane;
            if (v < nv) {
                float xv[VEC], dv[VEC], wv[VEC];
                ln_unpack(kx[k], xv), ln_unpack(kd[k], dv);
                ln_unpack(*(const RAW *)(w + (size_t)v * VEC), wv);
                lnb_sweep2<RAW, VEC>(dx, v, xv, dv, wv, m, r, mg, mgx);
            }
        }
        for (int k = LNB_KEEP; k < K; k++) {
            const int v = k * 32 + lane;
            if (v >= nv) break;
            float xv[VEC], dv[VEC], wv[VEC];
            ln_unpack(*(const RAW *)(x + (size_t)v * VEC), xv);
            ln_unpack(*(const RAW *)(dy + (size_t)v * VEC), dv);
            ln_unpack(*(const RAW *)(w + (size_t)v * VEC), wv);
            lnb_sweep2<RAW, VEC>(dx, v, xv, dv, wv, m, r, mg, mgx);
        }
    }
    if (!sums) return;
    __syncthreads();
    lnb_write_partial(part_w, part_b, lnb_sh, C, VEC, S, Cp, rms);
}

/* The fused backward for short bf16 rows (KS = C / 256 rounded up <= LNP_MAX_SLOTS: gpt2's 768,
 * the proxy's 256), software-pipelined. ln_bwd_kernel waits for each row twice (x and dout, then
 * dinp's old value for the second sweep) with nothing else in flight, and ran at ~2.2 TB/s
 * (gpt2 B=32: 90 us a call). Here a warp's registers hold its current row (x, dout, dinp's old
 * value) and the next one's loads are issued before the current one's math, so every wait
 * overlaps the work of a row; w is read once per warp (H200, 2026-12-03: gpt2 B=32 92 -> 61 us a
 * call, proxy 6.3 -> 4.4 us). Slots, row order, column-sum indices and every expression are
 * ln_bwd_kernel's (bf16, 16-byte vectors): the same bits. */
#define LNP_MAX_SLOTS 3
template <int KS>
static __device__ __forceinline__ void lnp_load_row(uint4 *x8, uint4 *d8, uint4 *o8, const nb_bf16_t *inp,
                                                    const nb_bf16_t *dout, const nb_bf16_t *dinp, size_t at, int nv,
                                                    int lane) {
#pragma unroll
    for (int k = 0; k < KS; k++) {
        const int v = k * 32 + lane;
        if (v < nv) {
            x8[k] = *(const uint4 *)(inp + at + (size_t)v * 8);
            d8[k] = *(const uint4 *)(dout + at + (size_t)v * 8);
            if (dinp) o8[k] = *(const uint4 *)(dinp + at + (size_t)v * 8);
        }
    }
}

template <int KS>
static __global__ void __launch_bounds__(32 * LNB_MAX_WARPS, 2)
    ln_bwd_pf_bf16(nb_bf16_t *dinp, float *part_w, float *part_b, const nb_bf16_t *dout, const nb_bf16_t *inp,
                   const nb_bf16_t *w, const float *mean, const float *rstd, int N, int C, int R) {
    extern __shared__ float lnb_sh[];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, W = blockDim.x >> 5;
    const int nv = C / 8, Cp = KS * 32 * 8;
    const int sums = part_w != NULL, rms = mean == NULL, S = rms ? Cp : 2 * Cp;
    float *aw = lnb_sh + (size_t)wid * S, *ab = aw + Cp;
    if (sums) lnb_zero_sums(aw, S, lane);
    uint4 w8[KS];
#pragma unroll
    for (int k = 0; k < KS; k++)
        if (k * 32 + lane < nv) w8[k] = *(const uint4 *)(w + (size_t)(k * 32 + lane) * 8);
    const int r0 = blockIdx.x * R, r1 = min(N, r0 + R);
    int row = r0 + wid;
    uint4 cx[KS], cd[KS], co[KS];
    float cm = 0.0f, cr = 0.0f;
    if (row < r1) {
        lnp_load_row<KS>(cx, cd, co, inp, dout, dinp, (size_t)row * C, nv, lane);
        cm = rms ? 0.0f : mean[row], cr = rstd[row];
    }
    for (; row < r1; row += W) {
        const int next = row + W;
        uint4 nx[KS], nd[KS], no[KS];
        float nm = 0.0f, nr = 0.0f;
        if (next < r1) { /* uniform over the warp */
            lnp_load_row<KS>(nx, nd, no, inp, dout, dinp, (size_t)next * C, nv, lane);
            nm = rms ? 0.0f : mean[next], nr = rstd[next];
        }
        const float m = cm, r = cr;
        float sg = 0.0f, sgx = 0.0f;
#pragma unroll
        for (int k = 0; k < KS; k++) {
            if (k * 32 + lane < nv) {
                float xv[8], dv[8], wv[8];
                ln_unpack(cx[k], xv), ln_unpack(cd[k], dv), ln_unpack(w8[k], wv);
                lnb_sweep1<8>(sg, sgx, aw, ab, xv, dv, wv, m, r, k, lane, rms, sums);
            }
        }
        if (dinp) {
            const float mg = rms ? 0.0f : nb_warp_sum(sg) / C, mgx = nb_warp_sum(sgx) / C;
            nb_bf16_t *dx = dinp + (size_t)row * C;
#pragma unroll
            for (int k = 0; k < KS; k++) {
                const int v = k * 32 + lane;
                if (v < nv) {
                    float xv[8], dv[8], wv[8], ov[8];
                    ln_unpack(cx[k], xv), ln_unpack(cd[k], dv), ln_unpack(w8[k], wv), ln_unpack(co[k], ov);
#pragma unroll
                    for (int e = 0; e < 8; e++) {
                        const float xhat = (xv[e] - m) * r, g = wv[e] * dv[e];
                        ov[e] = ov[e] + (g - mg - xhat * mgx) * r;
                    }
                    ln_st((uint4 *)(dx + (size_t)v * 8), ov);
                }
            }
        }
#pragma unroll
        for (int k = 0; k < KS; k++) cx[k] = nx[k], cd[k] = nd[k], co[k] = no[k];
        cm = nm, cr = nr;
    }
    if (!sums) return;
    __syncthreads();
    lnb_write_partial(part_w, part_b, lnb_sh, C, 8, S, Cp, rms);
}

/* Launches the pipelined kernel when it applies (bf16 16-byte rows of at most LNP_MAX_SLOTS slots);
 * returns 0 otherwise. */
static int ln_bwd_pf_launch(nb_bf16_t *dinp, float *part, float *part_b, const nb_bf16_t *dout, const nb_bf16_t *inp,
                            const nb_bf16_t *w, const float *mean, const float *rstd, int N, int C, int R, int K,
                            int nparts, int W, size_t smem, cudaStream_t stream) {
    if (K > LNP_MAX_SLOTS) return 0;
    if (K == 1)
        ln_bwd_pf_bf16<1><<<nparts, 32 * W, smem, stream>>>(dinp, part, part_b, dout, inp, w, mean, rstd, N, C, R);
    else if (K == 2)
        ln_bwd_pf_bf16<2><<<nparts, 32 * W, smem, stream>>>(dinp, part, part_b, dout, inp, w, mean, rstd, N, C, R);
    else
        ln_bwd_pf_bf16<3><<<nparts, 32 * W, smem, stream>>>(dinp, part, part_b, dout, inp, w, mean, rstd, N, C, R);
    return 1;
}
static int ln_bwd_pf_launch(float *, float *, float *, const float *, const float *, const float *, const float *,
                            const float *, int, int, int, int, int, int, size_t, cudaStream_t) {
    return 0; /* fp32 rows: the unpipelined kernels */
}

static int ln_aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* The fused backward; returns 0 (nothing launched) when C is too wide for its shared memory.
 * mean NULL: RMSNorm's backward (no db; db must be NULL). V16: 16 bytes of T. */
template <typename T, typename V16>
static int ln_bwd_fused(T *dinp, float *dw, float *db, const T *dout, const T *inp, const T *w, const float *mean,
                        const float *rstd, int N, int C, cudaStream_t stream) {
    const int VEC = sizeof(V16) / sizeof(T);
    const int W = lnb_warps(C);
    if (W < 1) return 0;
    if (!dinp && !dw && !db) return 1;
    const int vec = C % VEC == 0 && ln_aligned16(dout) && ln_aligned16(inp) && ln_aligned16(w) &&
                    (!dinp || ln_aligned16(dinp));
    const int v = vec ? VEC : 1, K = (C / v + 31) / 32, Cp = K * 32 * v;
    const int R = lnb_rows(N), nparts = (N + R - 1) / R, sums = dw || db;
    const int nsum = mean ? 2 : 1; /* column sums per column: dw and db, or dw alone (RMS) */
    float *part = sums ? (float *)nb_cuda_scratch(nsum * (size_t)nparts * C * sizeof(float), stream) : NULL;
    float *part_b = sums && mean ? part + (size_t)nparts * C : NULL;
    size_t smem = sums ? (size_t)W * nsum * Cp * sizeof(float) : 0;
    const int piped =
        vec && ln_bwd_pf_launch(dinp, part, part_b, dout, inp, w, mean, rstd, N, C, R, K, nparts, W, smem, stream);
    if (!piped && vec) {
        ln_bwd_kernel<T, V16><<<nparts, 32 * W, smem, stream>>>(dinp, part, part_b, dout, inp, w, mean, rstd, N, C, R);
    } else if (!piped) {
        ln_bwd_kernel<T, T><<<nparts, 32 * W, smem, stream>>>(dinp, part, part_b, dout, inp, w, mean, rstd, N, C, R);
    }
    CUDA_CHECK_LAUNCH(mean ? "layernorm backward (fused)" : "rmsnorm backward (fused)");
    if (sums) {
        nb_col_finish2(dw, part, db, part_b, nparts, C, stream);
        nb_cuda_scratch_free(part, stream);
    }
    return 1;
}

/* ---- LayerNorm and RMSNorm forward over 16-byte vectors ---- */

/* One warp per row as in the scalar kernels, with the fused backward's layout: lane l owns vectors
 * l, l + 32, ... (slot k: vector 32k + l). The first LNB_KEEP slots are loaded once, all in flight
 * together, and stay in registers through the passes over the row (C <= 2048 in bf16, 1024 in
 * fp32); further slots are read again (L1/L2 hits). A lane adds each vector's elements in a fixed
 * pairwise tree (a short dependency chain), then the vectors in slot order, then the warp's
 * butterfly: the order depends on C alone. The per-element outputs are the scalar kernels'
 * expressions, so the results differ from theirs only through the order of the row sums. */

/* Sum of v[0..n) in a fixed pairwise tree; n = VEC (8 or 4), a constant once inlined. */
static __device__ __forceinline__ float nfv_sum(const float *v, int n) {
    const float s4 = (v[0] + v[1]) + (v[2] + v[3]);
    return n == 8 ? s4 + ((v[4] + v[5]) + (v[6] + v[7])) : s4;
}
/* Sum of (v[e] - m)^2 over one vector, in nfv_sum's order. */
static __device__ __forceinline__ float nfv_sumsq(const float *v, int n, float m) {
    float d[8];
#pragma unroll
    for (int e = 0; e < n; e++) {
        const float t = v[e] - m;
        d[e] = t * t;
    }
    return nfv_sum(d, n);
}

/* What a pass over a row does with each vector xv (vector v of the row): add its sum, or its sum
 * of squared deviations from m, to acc; or write the output y = (x - m) * r * w + b
 * (ln_fwd_kernel's expression) or y = w * (x * r) (rms_fwd_kernel's), element by element. */
enum { NFV_SUM, NFV_SUMSQ, NFV_LN_OUT, NFV_RMS_OUT };
template <int OP, typename T, typename RAW>
static __device__ __forceinline__ void nfv_vector(float &acc, const float *xv, int v, float m, float r, const T *w,
                                                  const T *b, T *y) {
    constexpr int VEC = sizeof(RAW) / sizeof(T);
    if (OP == NFV_SUM) {
        acc += nfv_sum(xv, VEC);
    } else if (OP == NFV_SUMSQ) {
        acc += nfv_sumsq(xv, VEC, m);
    } else {
        float wv[VEC], ov[VEC];
        ln_unpack(((const RAW *)w)[v], wv);
        if (OP == NFV_LN_OUT) {
            float bv[VEC];
            ln_unpack(((const RAW *)b)[v], bv);
#pragma unroll
            for (int e = 0; e < VEC; e++) ov[e] = (xv[e] - m) * r * wv[e] + bv[e];
        } else {
#pragma unroll
            for (int e = 0; e < VEC; e++) ov[e] = wv[e] * (xv[e] * r);
        }
        ln_st((RAW *)(y + (size_t)v * VEC), ov);
    }
}

/* One pass over this lane's vectors of the row xr: the kept slots kx, then the rest from memory;
 * returns acc (NFV_SUM, NFV_SUMSQ) summed from 0 in slot order. */
template <int OP, typename T, typename RAW>
static __device__ __forceinline__ float nfv_row_pass(const RAW *kx, const RAW *xr, int nv, int lane, float m, float r,
                                                     const T *w, const T *b, T *y) {
    constexpr int VEC = sizeof(RAW) / sizeof(T);
    float acc = 0.0f;
#pragma unroll
    for (int k = 0; k < LNB_KEEP; k++) {
        const int v = k * 32 + lane;
        if (v < nv) {
            float xv[VEC];
            ln_unpack(kx[k], xv);
            nfv_vector<OP, T, RAW>(acc, xv, v, m, r, w, b, y);
        }
    }
    for (int v = LNB_KEEP * 32 + lane; v < nv; v += 32) {
        float xv[VEC];
        ln_unpack(xr[v], xv);
        nfv_vector<OP, T, RAW>(acc, xv, v, m, r, w, b, y);
    }
    return acc;
}

/* The first LNB_KEEP slots of this lane of row xr, all loads in flight together. */
template <typename RAW>
static __device__ __forceinline__ void nfv_keep(RAW *kx, const RAW *xr, int nv, int lane) {
#pragma unroll
    for (int k = 0; k < LNB_KEEP; k++)
        if (k * 32 + lane < nv) kx[k] = xr[k * 32 + lane];
}

/* Two passes for the statistics (mean, then squared deviations from it: no cancellation), one
 * for the output. */
template <typename T, typename RAW>
static __global__ void __launch_bounds__(32 * ROWS_PER_BLOCK)
    ln_fwd_vec_kernel(T *out, float *mean, float *rstd, const T *inp, const T *w, const T *b, int N, int C, float eps) {
    const int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    const int nv = C / (int)(sizeof(RAW) / sizeof(T));
    const RAW *xr = (const RAW *)(inp + (size_t)row * C);
    T *y = out + (size_t)row * C;
    RAW kx[LNB_KEEP];
    nfv_keep(kx, xr, nv, lane);
    const float s = nfv_row_pass<NFV_SUM>(kx, xr, nv, lane, 0.0f, 0.0f, w, b, y);
    const float m = nb_warp_sum(s) / C;
    const float ss = nfv_row_pass<NFV_SUMSQ>(kx, xr, nv, lane, m, 0.0f, w, b, y);
    const float r = 1.0f / sqrtf(nb_warp_sum(ss) / C + eps);
    nfv_row_pass<NFV_LN_OUT>(kx, xr, nv, lane, m, r, w, b, y);
    if (lane == 0) {
        if (mean) mean[row] = m;
        if (rstd) rstd[row] = r;
    }
}

/* VEC: elements per 16-byte vector (V16). Vector rows need C % VEC == 0 and every tensor the
 * kernel reads or writes 16-byte aligned; any other shape takes the scalar kernel. */
template <typename T, typename V16>
static void layernorm_forward(T *out, float *mean, float *rstd, const T *inp, const T *w, const T *b, int N, int C,
                              float eps, cudaStream_t stream, const char *name) {
    const int VEC = sizeof(V16) / sizeof(T);
    NB_CUDA_SHAPE(N >= 0 && C > 0 && out && inp && w && b, name);
    if (N == 0) return;
    if (C % VEC == 0 && ln_aligned16(out) && ln_aligned16(inp) && ln_aligned16(w) && ln_aligned16(b))
        ln_fwd_vec_kernel<T, V16><<<row_blocks(N), 32 * ROWS_PER_BLOCK, 0, stream>>>(out, mean, rstd, inp, w, b, N, C,
                                                                                     eps);
    else
        ln_fwd_kernel<<<row_blocks(N), 32 * ROWS_PER_BLOCK, 0, stream>>>(out, mean, rstd, inp, w, b, N, C, eps);
    CUDA_CHECK_LAUNCH("layernorm forward");
}

template <typename T, typename V16>
static void layernorm_backward(T *dinp, float *dw, float *db, const T *dout, const T *inp, const T *w,
                               const float *mean, const float *rstd, int N, int C, cudaStream_t stream,
                               const char *name) {
    NB_CUDA_SHAPE(N >= 0 && C > 0 && dout && inp && w && mean && rstd, name);
    if (N == 0) return;
    if (ln_bwd_fused<T, V16>(dinp, dw, db, dout, inp, w, mean, rstd, N, C, stream)) return;
    /* C too wide for the fused kernel's shared memory: row kernel, then column sums */
    if (dinp) {
        ln_dinp_kernel<<<row_blocks(N), 32 * ROWS_PER_BLOCK, 0, stream>>>(dinp, dout, inp, w, mean, rstd, N, C);
        CUDA_CHECK_LAUNCH("layernorm backward (dinp)");
    }
    if (!dw && !db) return;
    int nparts = nb_col_parts(N);
    NB_CUDA_SHAPE(nparts <= 65535, name);
    float *part = (float *)nb_cuda_scratch(2 * (size_t)nparts * C * sizeof(float), stream);
    float *part_b = part + (size_t)nparts * C;
    ln_dparams_kernel<<<dim3((C + 31) / 32, nparts), dim3(32, 8), 0, stream>>>(part, part_b, dout, inp, mean, rstd, N,
                                                                               C);
    CUDA_CHECK_LAUNCH("layernorm backward (dw/db first pass)");
    nb_col_finish2(dw, part, db, part_b, nparts, C, stream);
    nb_cuda_scratch_free(part, stream);
}

/* ---- RMSNorm ---- */

/* HF LlamaRMSNorm: y = w * (x * rstd), the normalized value rounded before the weight. */
template <typename T>
static __global__ void rms_fwd_kernel(T *out, float *rstd, const T *inp, const T *w, int N, int C, float eps) {
    int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    const T *x = inp + (size_t)row * C;
    T *y = out + (size_t)row * C;
    float ss = 0.0f;
    for (int i = lane; i < C; i += 32) {
        float v = nb_ld(x + i);
        ss += v * v;
    }
    float r = 1.0f / sqrtf(nb_warp_sum(ss) / C + eps);
    for (int i = lane; i < C; i += 32) nb_st(y + i, nb_ld(w + i) * (nb_ld(x + i) * r));
    if (lane == 0 && rstd) rstd[row] = r;
}

/* The vector form (nfv_row_pass's layout and sum order); y = w * (x * r) as rms_fwd_kernel. */
template <typename T, typename RAW>
static __global__ void __launch_bounds__(32 * ROWS_PER_BLOCK)
    rms_fwd_vec_kernel(T *out, float *rstd, const T *inp, const T *w, int N, int C, float eps) {
    const int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    const int nv = C / (int)(sizeof(RAW) / sizeof(T));
    const RAW *xr = (const RAW *)(inp + (size_t)row * C);
    T *y = out + (size_t)row * C;
    RAW kx[LNB_KEEP];
    nfv_keep(kx, xr, nv, lane);
    const float ss = nfv_row_pass<NFV_SUMSQ>(kx, xr, nv, lane, 0.0f, 0.0f, w, (const T *)NULL, y);
    const float r = 1.0f / sqrtf(nb_warp_sum(ss) / C + eps);
    nfv_row_pass<NFV_RMS_OUT>(kx, xr, nv, lane, 0.0f, r, w, (const T *)NULL, y);
    if (lane == 0 && rstd) rstd[row] = r;
}

/* dx += r * g - x * r^3 * mean(g * x), g = w * dout. The unfused path, for C too wide for the
 * fused kernel (the RMS mode of ln_bwd_fused). */
template <typename T>
static __global__ void rms_dinp_kernel(T *dinp, const T *dout, const T *inp, const T *w, const float *rstd, int N,
                                       int C) {
    int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    const T *x = inp + (size_t)row * C, *dy = dout + (size_t)row * C;
    T *dx = dinp + (size_t)row * C;
    float r = rstd[row];
    float sgx = 0.0f;
    for (int i = lane; i < C; i += 32) sgx += (nb_ld(w + i) * nb_ld(dy + i)) * nb_ld(x + i);
    float k = nb_warp_sum(sgx) / C * r * r * r;
    for (int i = lane; i < C; i += 32)
        nb_st(dx + i, nb_ld(dx + i) + r * (nb_ld(w + i) * nb_ld(dy + i)) - nb_ld(x + i) * k);
}

/* Partial column sums of dout * x * rstd over blocks of NB_COL_ROWS rows. inp's rows are contiguous;
 * dout's row r lies at (r / nh) * stride + (r % nh) * C (nh = 1, stride = C: a plain [N, C]
 * tensor; the per-head norm's strided q or k heads otherwise). */
template <typename T>
static __global__ void rms_dw_kernel(float *part, const T *dout, const T *inp, const float *rstd, int N, int C, int nh,
                                     int stride) {
    __shared__ float sw[8][33];
    int c = blockIdx.x * 32 + threadIdx.x;
    int r0 = blockIdx.y * NB_COL_ROWS, r1 = min(N, r0 + NB_COL_ROWS);
    float aw = 0.0f;
    if (c < C)
        for (int r = r0 + threadIdx.y; r < r1; r += 8)
            aw += nb_ld(dout + (size_t)(r / nh) * stride + (size_t)(r % nh) * C + c) *
                  (nb_ld(inp + (size_t)r * C + c) * rstd[r]);
    sw[threadIdx.y][threadIdx.x] = aw;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float s = 0.0f;
        for (int i = 0; i < 8; i++) s += sw[i][threadIdx.x];
        part[(size_t)blockIdx.y * C + c] = s;
    }
}

/* VEC as in layernorm_forward. */
template <typename T, typename V16>
static void rmsnorm_forward(T *out, float *rstd, const T *inp, const T *w, int N, int C, float eps,
                            cudaStream_t stream, const char *name) {
    const int VEC = sizeof(V16) / sizeof(T);
    NB_CUDA_SHAPE(N >= 0 && C > 0 && out && inp && w, name);
    if (N == 0) return;
    if (C % VEC == 0 && ln_aligned16(out) && ln_aligned16(inp) && ln_aligned16(w))
        rms_fwd_vec_kernel<T, V16><<<row_blocks(N), 32 * ROWS_PER_BLOCK, 0, stream>>>(out, rstd, inp, w, N, C, eps);
    else
        rms_fwd_kernel<<<row_blocks(N), 32 * ROWS_PER_BLOCK, 0, stream>>>(out, rstd, inp, w, N, C, eps);
    CUDA_CHECK_LAUNCH("rmsnorm forward");
}

template <typename T, typename V16>
static void rmsnorm_backward(T *dinp, float *dw, const T *dout, const T *inp, const T *w, const float *rstd, int N,
                             int C, cudaStream_t stream, const char *name) {
    NB_CUDA_SHAPE(N >= 0 && C > 0 && dout && inp && w && rstd, name);
    if (N == 0) return;
    if (ln_bwd_fused<T, V16>(dinp, dw, NULL, dout, inp, w, NULL, rstd, N, C, stream)) return;
    /* C too wide for the fused kernel's shared memory: row kernel, then column sums */
    if (dinp) {
        rms_dinp_kernel<<<row_blocks(N), 32 * ROWS_PER_BLOCK, 0, stream>>>(dinp, dout, inp, w, rstd, N, C);
        CUDA_CHECK_LAUNCH("rmsnorm backward (dinp)");
    }
    if (!dw) return;
    int nparts = nb_col_parts(N);
    NB_CUDA_SHAPE(nparts <= 65535, name);
    float *part = (float *)nb_cuda_scratch((size_t)nparts * C * sizeof(float), stream);
    rms_dw_kernel<<<dim3((C + 31) / 32, nparts), dim3(32, 8), 0, stream>>>(part, dout, inp, rstd, N, C, 1, C);
    CUDA_CHECK_LAUNCH("rmsnorm backward (dw first pass)");
    nb_col_finish(dw, part, nparts, C, stream);
    nb_cuda_scratch_free(part, stream);
}

/* ---- per-head RMSNorm on a strided view (Qwen3's q/k norm), in place ----
 * Head r = n * nh + h of the view lies at x + n * stride + h * HS; one warp per head, the math of
 * rms_fwd_kernel / rms_dinp_kernel. Each lane rewrites only the elements it read itself, so the
 * in-place update needs no barrier. dw: rms_dw_kernel's fixed-order partials, then
 * nb_col_finish, before the output gradient is overwritten (same stream). */

static __device__ __forceinline__ size_t head_at(int r, int nh, int HS, int stride) {
    return (size_t)(r / nh) * stride + (size_t)(r % nh) * HS;
}

template <typename T>
static __global__ void head_fwd_kernel(T *x, T *x_in, float *rstd, const T *w, int R, int nh, int HS, int stride,
                                       float eps) {
    int r = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (r >= R) return;
    T *y = x + head_at(r, nh, HS, stride), *keep = x_in + (size_t)r * HS;
    float ss = 0.0f;
    for (int i = lane; i < HS; i += 32) {
        float v = nb_ld(y + i);
        ss += v * v;
        keep[i] = y[i];
    }
    float s = 1.0f / sqrtf(nb_warp_sum(ss) / HS + eps);
    for (int i = lane; i < HS; i += 32) nb_st(y + i, nb_ld(w + i) * (nb_ld(keep + i) * s));
    if (lane == 0) rstd[r] = s;
}

/* d = r * g - x * r^3 * mean(g * x), g = w * dout, written over dout */
template <typename T>
static __global__ void head_dinp_kernel(T *dx, const T *x_in, const T *w, const float *rstd, int R, int nh, int HS,
                                        int stride) {
    int r = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (r >= R) return;
    T *d = dx + head_at(r, nh, HS, stride);
    const T *x = x_in + (size_t)r * HS;
    float s = rstd[r], sgx = 0.0f;
    for (int i = lane; i < HS; i += 32) sgx += (nb_ld(w + i) * nb_ld(d + i)) * nb_ld(x + i);
    float k = nb_warp_sum(sgx) / HS * s * s * s;
    for (int i = lane; i < HS; i += 32) nb_st(d + i, s * (nb_ld(w + i) * nb_ld(d + i)) - nb_ld(x + i) * k);
}

template <typename T>
static void headnorm_forward(T *x, T *x_in, float *rstd, const T *w, int N, int nh, int HS, int stride, float eps,
                             cudaStream_t stream, const char *name) {
    NB_CUDA_SHAPE(N >= 0 && nh >= 0 && HS > 0 && stride >= nh * HS && x && x_in && rstd && w, name);
    int R = N * nh;
    if (R == 0) return;
    head_fwd_kernel<<<row_blocks(R), 32 * ROWS_PER_BLOCK, 0, stream>>>(x, x_in, rstd, w, R, nh, HS, stride, eps);
    CUDA_CHECK_LAUNCH("per-head rmsnorm forward");
}

template <typename T>
static void headnorm_backward(T *dx, float *dw, const T *x_in, const T *w, const float *rstd, int N, int nh, int HS,
                              int stride, cudaStream_t stream, const char *name) {
    NB_CUDA_SHAPE(N >= 0 && nh >= 0 && HS > 0 && stride >= nh * HS && dx && x_in && w && rstd, name);
    int R = N * nh;
    if (R == 0) return;
    if (dw) {
        int nparts = nb_col_parts(R);
        NB_CUDA_SHAPE(nparts <= 65535, name);
        float *part = (float *)nb_cuda_scratch((size_t)nparts * HS * sizeof(float), stream);
        rms_dw_kernel<<<dim3((HS + 31) / 32, nparts), dim3(32, 8), 0, stream>>>(part, dx, x_in, rstd, R, HS, nh,
                                                                               stride);
        CUDA_CHECK_LAUNCH("per-head rmsnorm backward (dw first pass)");
        nb_col_finish(dw, part, nparts, HS, stream);
        nb_cuda_scratch_free(part, stream);
    }
    head_dinp_kernel<<<row_blocks(R), 32 * ROWS_PER_BLOCK, 0, stream>>>(dx, x_in, w, rstd, R, nh, HS, stride);
    CUDA_CHECK_LAUNCH("per-head rmsnorm backward (dx)");
}

/* ---- the extern "C" launchers (ops_cuda.h): fp32 rows in float4 vectors, bf16 in 8s ---- */

extern "C" void nb_cuda_layernorm_forward_f32(float *out, float *mean, float *rstd, const float *inp, const float *w,
                                              const float *b, int N, int C, float eps, nb_stream_t stream) {
    layernorm_forward<float, float4>(out, mean, rstd, inp, w, b, N, C, eps, stream, __func__);
}
extern "C" void nb_cuda_layernorm_forward_bf16(nb_bf16 *out, float *mean, float *rstd, const nb_bf16 *inp,
                                               const nb_bf16 *w, const nb_bf16 *b, int N, int C, float eps,
                                               nb_stream_t stream) {
    layernorm_forward<nb_bf16_t, uint4>(nb_kt(out), mean, rstd, nb_kt(inp), nb_kt(w), nb_kt(b), N, C, eps, stream,
                                        __func__);
}
extern "C" void nb_cuda_layernorm_backward_f32(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                                               const float *w, const float *mean, const float *rstd, int N, int C,
                                               nb_stream_t stream) {
    layernorm_backward<float, float4>(dinp, dw, db, dout, inp, w, mean, rstd, N, C, stream, __func__);
}
extern "C" void nb_cuda_layernorm_backward_bf16(nb_bf16 *dinp, float *dw, float *db, const nb_bf16 *dout,
                                                const nb_bf16 *inp, const nb_bf16 *w, const float *mean,
                                                const float *rstd, int N, int C, nb_stream_t stream) {
    layernorm_backward<nb_bf16_t, uint4>(nb_kt(dinp), dw, db, nb_kt(dout), nb_kt(inp), nb_kt(w), mean, rstd, N, C,
                                         stream, __func__);
}
extern "C" void nb_cuda_rmsnorm_forward_f32(float *out, float *rstd, const float *inp, const float *w, int N, int C,
                                            float eps, nb_stream_t stream) {
    rmsnorm_forward<float, float4>(out, rstd, inp, w, N, C, eps, stream, __func__);
}
extern "C" void nb_cuda_rmsnorm_forward_bf16(nb_bf16 *out, float *rstd, const nb_bf16 *inp, const nb_bf16 *w, int N,
                                             int C, float eps, nb_stream_t stream) {
    rmsnorm_forward<nb_bf16_t, uint4>(nb_kt(out), rstd, nb_kt(inp), nb_kt(w), N, C, eps, stream, __func__);
}
extern "C" void nb_cuda_rmsnorm_backward_f32(float *dinp, float *dw, const float *dout, const float *inp,
                                             const float *w, const float *rstd, int N, int C, nb_stream_t stream) {
    rmsnorm_backward<float, float4>(dinp, dw, dout, inp, w, rstd, N, C, stream, __func__);
}
extern "C" void nb_cuda_rmsnorm_backward_bf16(nb_bf16 *dinp, float *dw, const nb_bf16 *dout, const nb_bf16 *inp,
                                              const nb_bf16 *w, const float *rstd, int N, int C, nb_stream_t stream) {
    rmsnorm_backward<nb_bf16_t, uint4>(nb_kt(dinp), dw, nb_kt(dout), nb_kt(inp), nb_kt(w), rstd, N, C, stream,
                                       __func__);
}
extern "C" void nb_cuda_headnorm_forward_f32(float *x, float *x_in, float *rstd, const float *w, int N, int nh, int HS,
                                             int stride, float eps, nb_stream_t stream) {
    headnorm_forward<float>(x, x_in, rstd, w, N, nh, HS, stride, eps, stream, __func__);
}
extern "C" void nb_cuda_headnorm_forward_bf16(nb_bf16 *x, nb_bf16 *x_in, float *rstd, const nb_bf16 *w, int N, int nh,
                                              int HS, int stride, float eps, nb_stream_t stream) {
    headnorm_forward<nb_bf16_t>(nb_kt(x), nb_kt(x_in), rstd, nb_kt(w), N, nh, HS, stride, eps, stream, __func__);
}
extern "C" void nb_cuda_headnorm_backward_f32(float *dx, float *dw, const float *x_in, const float *w, const float *rstd,
                                              int N, int nh, int HS, int stride, nb_stream_t stream) {
    headnorm_backward<float>(dx, dw, x_in, w, rstd, N, nh, HS, stride, stream, __func__);
}
extern "C" void nb_cuda_headnorm_backward_bf16(nb_bf16 *dx, float *dw, const nb_bf16 *x_in, const nb_bf16 *w,
                                               const float *rstd, int N, int nh, int HS, int stride,
                                               nb_stream_t stream) {
    headnorm_backward<nb_bf16_t>(nb_kt(dx), dw, nb_kt(x_in), nb_kt(w), rstd, N, nh, HS, stride, stream, __func__);
}
