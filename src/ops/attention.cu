/* Causal grouped-query attention on CUDA, flash-style: scores live in registers one tile at a
 * time, never T x T in memory. Same math as attention.c (scale 1/sqrt(HS), query head h reads kv
 * head h / (NH/NKV), lse saved for the backward); simple tiled kernels, fp32 inside.
 *
 * Forward: a block takes BR = 16 query rows of one (b, h); each of its 4 warps owns 4 rows. Keys
 * and values come through shared memory in tiles of 32; lane j scores key j of the tile against
 * the row (a dot product over HS), the warp keeps an online softmax (running max m, sum l), and
 * each lane accumulates the output dims d = lane + 32k.
 * Backward (FlashAttention-2 style, D = rowsum(dout * out) precomputed):
 *   p = exp(s - lse), ds = p (dout . v - D),
 *   dq += scale * sum_j ds k_j   (kernel 1: blocks over query rows, like the forward)
 *   dk += scale * sum_i ds q_i, dv += sum_i p dout_i   (kernel 2: blocks over key rows of one
 *   kv head, looping over that head's query heads in order)
 * Every dq/dk/dv row has exactly one writer that adds its terms in a fixed order: deterministic
 * without atomics, and GQA's sum over query heads is just the outer loop of kernel 2. */
#include "ops_cuda_common.cuh"

#define NWARPS 4
#define RPW 4                 /* rows per warp */
#define BR (NWARPS * RPW)     /* rows per block */
#define BC 32                 /* key (or query) tile: one per lane */
#define MAX_HS 256
#define DPL (MAX_HS / 32)     /* output dims per lane */

typedef struct {
    int B, Tn, NH, NKV, HS, R, group;
    float scale;
} attn_dims;

/* dst[r * ld + d] = src[(row0 + r) * stride + d] for rows < T, zeros past the end (masked lanes
 * multiply by 0 and must not meet garbage). */
template <typename T>
static __device__ void load_rows(float *dst, int ld, const T *src, size_t stride, int row0, int nrows,
                                 int T_, int HS) {
    for (int idx = threadIdx.x; idx < nrows * HS; idx += blockDim.x) {
        int r = idx / HS, d = idx % HS, t = row0 + r;
        dst[r * ld + d] = t < T_ ? nb_ld(src + (size_t)t * stride + d) : 0.0f;
    }
}

static __device__ __forceinline__ float dot_sh(const float *a, const float *b, int n) {
    float s = 0.0f;
    for (int d = 0; d < n; d++) s += a[d] * b[d];
    return s;
}

/* ---- forward ---- */

template <typename T>
static __global__ void __launch_bounds__(NWARPS * 32)
    attn_fwd_kernel(T *out, float *lse, const T *qkv, attn_dims a) {
    extern __shared__ float sh[];
    int HS = a.HS, T_ = a.Tn;
    float *Qs = sh, *Ks = Qs + BR * HS, *Vs = Ks + BC * (HS + 1);
    int q0 = blockIdx.x * BR, h = blockIdx.y, b = blockIdx.z, g = h / a.group;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const T *base = qkv + (size_t)b * T_ * a.R;
    load_rows(Qs, HS, base + (size_t)h * HS, a.R, q0, BR, T_, HS);
    float m[RPW], l[RPW], o[RPW][DPL];
#pragma unroll
    for (int rr = 0; rr < RPW; rr++) {
        m[rr] = -INFINITY;
        l[rr] = 0.0f;
#pragma unroll
        for (int k = 0; k < DPL; k++) o[rr][k] = 0.0f;
    }
    int last = min(T_ - 1, q0 + BR - 1);
    for (int j0 = 0; j0 <= last; j0 += BC) {
        __syncthreads();
        load_rows(Ks, HS + 1, base + (size_t)(a.NH + g) * HS, a.R, j0, BC, T_, HS);
        load_rows(Vs, HS, base + (size_t)(a.NH + a.NKV + g) * HS, a.R, j0, BC, T_, HS);
        __syncthreads();
#pragma unroll
        for (int rr = 0; rr < RPW; rr++) {
            int r = warp * RPW + rr, t = q0 + r;
            if (t >= T_ || j0 > t) continue; /* warp-uniform */
            int valid = j0 + lane <= t;
            float s = dot_sh(Qs + r * HS, Ks + lane * (HS + 1), HS) * a.scale;
            s = valid ? s : -INFINITY;
            float mn = fmaxf(m[rr], nb_warp_max(s));
            float corr = expf(m[rr] - mn); /* 0 on the first tile (m = -inf) */
            float p = valid ? expf(s - mn) : 0.0f;
            l[rr] = l[rr] * corr + nb_warp_sum(p);
            m[rr] = mn;
#pragma unroll
            for (int k = 0; k < DPL; k++) o[rr][k] *= corr;
            for (int j = 0; j < BC; j++) {
                float pj = __shfl_sync(0xffffffffu, p, j);
                const float *v = Vs + j * HS;
#pragma unroll
                for (int k = 0; k < DPL; k++) {
                    int d = lane + 32 * k;
                    if (d < HS) o[rr][k] += pj * v[d];
                }
            }
        }
    }
#pragma unroll
    for (int rr = 0; rr < RPW; rr++) {
        int t = q0 + warp * RPW + rr;
        if (t >= T_) continue;
        float inv = 1.0f / l[rr];
        T *orow = out + ((size_t)b * T_ + t) * a.NH * HS + (size_t)h * HS;
#pragma unroll
        for (int k = 0; k < DPL; k++) {
            int d = lane + 32 * k;
            if (d < HS) nb_st(orow + d, o[rr][k] * inv);
        }
        if (lane == 0) lse[((size_t)b * a.NH + h) * T_ + t] = m[rr] + logf(l[rr]);
    }
}

/* ---- backward ---- */

/* D[b, h, t] = dout[b, t, h] . out[b, t, h]: one warp per row. */
template <typename T>
static __global__ void attn_d_kernel(float *Dv, const T *dout, const T *out, attn_dims a) {
    size_t row = (size_t)blockIdx.x * NWARPS + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    size_t nrows = (size_t)a.B * a.Tn * a.NH;
    if (row >= nrows) return;
    /* row enumerates (b, t, h) in memory order; D is stored [b, h, t] like lse */
    int h = (int)(row % a.NH);
    size_t bt = row / a.NH;
    int t = (int)(bt % a.Tn), b = (int)(bt / a.Tn);
    const T *dy = dout + row * a.HS, *y = out + row * a.HS;
    float s = 0.0f;
    for (int d = lane; d < a.HS; d += 32) s += nb_ld(dy + d) * nb_ld(y + d);
    s = nb_warp_sum(s);
    if (lane == 0) Dv[((size_t)b * a.NH + h) * a.Tn + t] = s;
}

/* dq: blocks over BR query rows of one (b, h); lane j handles key j of each tile. */
template <typename T>
static __global__ void __launch_bounds__(NWARPS * 32)
    attn_dq_kernel(T *dqkv, const T *dout, const T *qkv, const float *lse, const float *Dv, attn_dims a) {
    extern __shared__ float sh[];
    int HS = a.HS, T_ = a.Tn;
    float *Qs = sh, *dOs = Qs + BR * HS, *Ks = dOs + BR * HS, *Vs = Ks + BC * (HS + 1);
    int q0 = blockIdx.x * BR, h = blockIdx.y, b = blockIdx.z, g = h / a.group;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const T *base = qkv + (size_t)b * T_ * a.R;
    load_rows(Qs, HS, base + (size_t)h * HS, a.R, q0, BR, T_, HS);
    load_rows(dOs, HS, dout + (size_t)b * T_ * a.NH * HS + (size_t)h * HS, (size_t)a.NH * HS, q0, BR, T_, HS);
    float dq[RPW][DPL], L[RPW], Dr[RPW];
#pragma unroll
    for (int rr = 0; rr < RPW; rr++) {
        int t = q0 + warp * RPW + rr;
        L[rr] = t < T_ ? lse[((size_t)b * a.NH + h) * T_ + t] : 0.0f;
        Dr[rr] = t < T_ ? Dv[((size_t)b * a.NH + h) * T_ + t] : 0.0f;
#pragma unroll
        for (int k = 0; k < DPL; k++) dq[rr][k] = 0.0f;
    }
    int last = min(T_ - 1, q0 + BR - 1);
    for (int j0 = 0; j0 <= last; j0 += BC) {
        __syncthreads();
        load_rows(Ks, HS + 1, base + (size_t)(a.NH + g) * HS, a.R, j0, BC, T_, HS);
        load_rows(Vs, HS + 1, base + (size_t)(a.NH + a.NKV + g) * HS, a.R, j0, BC, T_, HS);
        __syncthreads();
#pragma unroll
        for (int rr = 0; rr < RPW; rr++) {
            int r = warp * RPW + rr, t = q0 + r;
            if (t >= T_ || j0 > t) continue;
            int valid = j0 + lane <= t;
            float s = dot_sh(Qs + r * HS, Ks + lane * (HS + 1), HS) * a.scale;
            float p = valid ? expf(s - L[rr]) : 0.0f;
            float dp = dot_sh(dOs + r * HS, Vs + lane * (HS + 1), HS);
            float ds = p * (dp - Dr[rr]);
            for (int j = 0; j < BC; j++) {
                float dsj = __shfl_sync(0xffffffffu, ds, j);
                const float *k_ = Ks + j * (HS + 1);
#pragma unroll
                for (int k = 0; k < DPL; k++) {
                    int d = lane + 32 * k;
                    if (d < HS) dq[rr][k] += dsj * k_[d];
                }
            }
        }
    }
#pragma unroll
    for (int rr = 0; rr < RPW; rr++) {
        int t = q0 + warp * RPW + rr;
        if (t >= T_) continue;
        T *row = dqkv + ((size_t)b * T_ + t) * a.R + (size_t)h * HS;
#pragma unroll
        for (int k = 0; k < DPL; k++) {
            int d = lane + 32 * k;
            if (d < HS) nb_st(row + d, nb_ld(row + d) + a.scale * dq[rr][k]);
        }
    }
}

/* dk, dv: blocks over BR key rows of one (b, kv head g); for each query head of the group, in
 * order, query tiles of 32 (lane i = query i of the tile) from the first that can see the keys. */
template <typename T>
static __global__ void __launch_bounds__(NWARPS * 32)
    attn_dkv_kernel(T *dqkv, const T *dout, const T *qkv, const float *lse, const float *Dv, attn_dims a) {
    extern __shared__ float sh[];
    int HS = a.HS, T_ = a.Tn;
    float *Ks = sh, *Vs = Ks + BR * HS, *Qs = Vs + BR * HS, *dOs = Qs + BC * (HS + 1);
    float *Ls = dOs + BC * (HS + 1), *Ds = Ls + BC;
    int k0 = blockIdx.x * BR, g = blockIdx.y, b = blockIdx.z;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const T *base = qkv + (size_t)b * T_ * a.R;
    const T *dbase = dout + (size_t)b * T_ * a.NH * HS;
    load_rows(Ks, HS, base + (size_t)(a.NH + g) * HS, a.R, k0, BR, T_, HS);
    load_rows(Vs, HS, base + (size_t)(a.NH + a.NKV + g) * HS, a.R, k0, BR, T_, HS);
    float dk[RPW][DPL], dv[RPW][DPL];
#pragma unroll
    for (int rr = 0; rr < RPW; rr++)
#pragma unroll
        for (int k = 0; k < DPL; k++) dk[rr][k] = dv[rr][k] = 0.0f;
    for (int h = g * a.group; h < (g + 1) * a.group; h++) {
        for (int i0 = k0 / BC * BC; i0 < T_; i0 += BC) {
            __syncthreads();
            load_rows(Qs, HS + 1, base + (size_t)h * HS, a.R, i0, BC, T_, HS);
            load_rows(dOs, HS + 1, dbase + (size_t)h * HS, (size_t)a.NH * HS, i0, BC, T_, HS);
            if (threadIdx.x < BC) {
                int t = i0 + threadIdx.x;
                Ls[threadIdx.x] = t < T_ ? lse[((size_t)b * a.NH + h) * T_ + t] : 0.0f;
                Ds[threadIdx.x] = t < T_ ? Dv[((size_t)b * a.NH + h) * T_ + t] : 0.0f;
            }
            __syncthreads();
#pragma unroll
            for (int rr = 0; rr < RPW; rr++) {
                int r = warp * RPW + rr, j = k0 + r;
                if (j >= T_ || i0 + BC - 1 < j) continue; /* no query of the tile sees j */
                int qi = i0 + lane, valid = qi >= j && qi < T_;
                float s = dot_sh(Qs + lane * (HS + 1), Ks + r * HS, HS) * a.scale;
                float p = valid ? expf(s - Ls[lane]) : 0.0f;
                float dp = dot_sh(dOs + lane * (HS + 1), Vs + r * HS, HS);
                float ds = p * (dp - Ds[lane]);
                for (int i = 0; i < BC; i++) {
                    float pi = __shfl_sync(0xffffffffu, p, i);
                    float dsi = __shfl_sync(0xffffffffu, ds, i);
                    const float *q_ = Qs + i * (HS + 1), *dy = dOs + i * (HS + 1);
#pragma unroll
                    for (int k = 0; k < DPL; k++) {
                        int d = lane + 32 * k;
                        if (d < HS) {
                            dv[rr][k] += pi * dy[d];
                            dk[rr][k] += dsi * q_[d];
                        }
                    }
                }
            }
        }
    }
#pragma unroll
    for (int rr = 0; rr < RPW; rr++) {
        int j = k0 + warp * RPW + rr;
        if (j >= T_) continue;
        T *krow = dqkv + ((size_t)b * T_ + j) * a.R + (size_t)(a.NH + g) * HS;
        T *vrow = krow + (size_t)a.NKV * HS;
#pragma unroll
        for (int k = 0; k < DPL; k++) {
            int d = lane + 32 * k;
            if (d < HS) {
                nb_st(krow + d, nb_ld(krow + d) + a.scale * dk[rr][k]);
                nb_st(vrow + d, nb_ld(vrow + d) + dv[rr][k]);
            }
        }
    }
}

static attn_dims attn_dims_of(const char *name, int B, int T, int NH, int NKV, int HS) {
    NB_CUDA_SHAPE(B >= 0 && T >= 0 && NH > 0 && NKV > 0 && NH % NKV == 0, name);
    NB_CUDA_SHAPE(HS > 0 && HS % 2 == 0 && HS <= MAX_HS, name);
    NB_CUDA_SHAPE(B <= 65535 && NH <= 65535, name);
    attn_dims a = {B, T, NH, NKV, HS, (NH + 2 * NKV) * HS, NH / NKV, 1.0f / sqrtf((float)HS)};
    return a;
}

/* Dynamic shared memory above 48 KB must be allowed per kernel before the launch. */
static void allow_smem(const void *kernel, size_t bytes) {
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

/* bf16 calls go to the tensor-core kernels of attention_fa.cu when those take the shape (they
 * return 0 when not: head sizes other than 64 and 128, unaligned tensors); these kernels stay
 * the fp32 path and the bf16 fallback. acc: as nb_cuda_attention_fa_backward_mode_bf16. */
static int fa_forward(nb_bf16_t *out, float *lse, const nb_bf16_t *qkv, int B, int T, int NH, int NKV, int HS,
                      cudaStream_t stream) {
    return nb_cuda_attention_fa_forward_bf16((nb_bf16 *)out, lse, (const nb_bf16 *)qkv, B, T, NH, NKV, HS, stream);
}
static int fa_forward(float *, float *, const float *, int, int, int, int, int, cudaStream_t) { return 0; }
static int fa_backward(nb_bf16_t *dqkv, const nb_bf16_t *dout, const nb_bf16_t *qkv, const nb_bf16_t *out,
                       const float *lse, int B, int T, int NH, int NKV, int HS, int acc, cudaStream_t stream) {
    return nb_cuda_attention_fa_backward_mode_bf16((nb_bf16 *)dqkv, (const nb_bf16 *)dout, (const nb_bf16 *)qkv,
                                                   (const nb_bf16 *)out, lse, B, T, NH, NKV, HS, acc, stream);
}
static int fa_backward(float *, const float *, const float *, const float *, const float *, int, int, int, int, int,
                       int, cudaStream_t) {
    return 0;
}

template <typename T>
static void attention_forward(T *out, float *lse, const T *qkv, int B, int T_, int NH, int NKV, int HS,
                              cudaStream_t stream, const char *name) {
    attn_dims a = attn_dims_of(name, B, T_, NH, NKV, HS);
    NB_CUDA_SHAPE(out && lse && qkv, name);
    if (B == 0 || T_ == 0) return;
    if (fa_forward(out, lse, qkv, B, T_, NH, NKV, HS, stream)) return;
    size_t smem = ((size_t)BR * HS + (size_t)BC * (HS + 1) + (size_t)BC * HS) * sizeof(float);
    void (*k)(T *, float *, const T *, attn_dims) = attn_fwd_kernel<T>;
    allow_smem((const void *)k, smem);
    dim3 grid((T_ + BR - 1) / BR, NH, B);
    k<<<grid, NWARPS * 32, smem, stream>>>(out, lse, qkv, a);
    CUDA_CHECK_LAUNCH("attention forward");
}

template <typename T>
static void attention_backward(T *dqkv, const T *dout, const T *qkv, const T *out, const float *lse, int B, int T_,
                               int NH, int NKV, int HS, cudaStream_t stream, const char *name) {
    if (!dqkv) return;
    attn_dims a = attn_dims_of(name, B, T_, NH, NKV, HS);
    NB_CUDA_SHAPE(dout && qkv && out && lse, name);
    if (B == 0 || T_ == 0) return;
    if (fa_backward(dqkv, dout, qkv, out, lse, B, T_, NH, NKV, HS, 1, stream)) return;
    size_t nrows = (size_t)B * T_ * NH;
    float *Dv = (float *)nb_cuda_scratch(nrows * sizeof(float), stream);
    attn_d_kernel<<<(unsigned)((nrows + NWARPS - 1) / NWARPS), NWARPS * 32, 0, stream>>>(Dv, dout, out, a);
    CUDA_CHECK_LAUNCH("attention backward (D = rowsum(dout * out))");
    size_t smem_q = (2 * (size_t)BR * HS + 2 * (size_t)BC * (HS + 1)) * sizeof(float);
    void (*kq)(T *, const T *, const T *, const float *, const float *, attn_dims) = attn_dq_kernel<T>;
    allow_smem((const void *)kq, smem_q);
    kq<<<dim3((T_ + BR - 1) / BR, NH, B), NWARPS * 32, smem_q, stream>>>(dqkv, dout, qkv, lse, Dv, a);
    CUDA_CHECK_LAUNCH("attention backward (dq)");
    size_t smem_kv = (2 * (size_t)BR * HS + 2 * (size_t)BC * (HS + 1) + 2 * BC) * sizeof(float);
    void (*kkv)(T *, const T *, const T *, const float *, const float *, attn_dims) = attn_dkv_kernel<T>;
    allow_smem((const void *)kkv, smem_kv);
    kkv<<<dim3((T_ + BR - 1) / BR, NKV, B), NWARPS * 32, smem_kv, stream>>>(dqkv, dout, qkv, lse, Dv, a);
    CUDA_CHECK_LAUNCH("attention backward (dk, dv)");
    nb_cuda_scratch_free(Dv, stream);
}

/* The write variant (ops_cuda.h): the tensor-core kernels store instead of adding; everything
 * else (fp32, shapes they refuse) zeroes dqkv and accumulates. */
template <typename T>
static void attention_backward_set(T *dqkv, const T *dout, const T *qkv, const T *out, const float *lse, int B,
                                   int T_, int NH, int NKV, int HS, cudaStream_t stream, const char *name) {
    if (!dqkv) return;
    attn_dims_of(name, B, T_, NH, NKV, HS);
    if (B == 0 || T_ == 0) return;
    if (dout && qkv && out && lse && fa_backward(dqkv, dout, qkv, out, lse, B, T_, NH, NKV, HS, 0, stream)) return;
    CUDA_CHECK(cudaMemsetAsync(dqkv, 0, (size_t)B * T_ * (NH + 2 * NKV) * HS * sizeof(T), stream));
    attention_backward(dqkv, dout, qkv, out, lse, B, T_, NH, NKV, HS, stream, name);
}

extern "C" void nb_cuda_attention_forward_f32(float *out, float *lse, const float *qkv, int B, int T, int NH, int NKV,
                                              int HS, nb_stream_t stream) {
    attention_forward(out, lse, qkv, B, T, NH, NKV, HS, stream, __func__);
}
extern "C" void nb_cuda_attention_forward_bf16(nb_bf16 *out, float *lse, const nb_bf16 *qkv, int B, int T, int NH,
                                               int NKV, int HS, nb_stream_t stream) {
    attention_forward(nb_kt(out), lse, nb_kt(qkv), B, T, NH, NKV, HS, stream, __func__);
}
extern "C" void nb_cuda_attention_backward_f32(float *dqkv, const float *dout, const float *qkv, const float *out,
                                               const float *lse, int B, int T, int NH, int NKV, int HS,
                                               nb_stream_t stream) {
    attention_backward(dqkv, dout, qkv, out, lse, B, T, NH, NKV, HS, stream, __func__);
}
extern "C" void nb_cuda_attention_backward_bf16(nb_bf16 *dqkv, const nb_bf16 *dout, const nb_bf16 *qkv,
                                                const nb_bf16 *out, const float *lse, int B, int T, int NH, int NKV,
                                                int HS, nb_stream_t stream) {
    attention_backward(nb_kt(dqkv), nb_kt(dout), nb_kt(qkv), nb_kt(out), lse, B, T, NH, NKV, HS, stream, __func__);
}
extern "C" void nb_cuda_attention_backward_set_f32(float *dqkv, const float *dout, const float *qkv, const float *out,
                                                   const float *lse, int B, int T, int NH, int NKV, int HS,
                                                   nb_stream_t stream) {
    attention_backward_set(dqkv, dout, qkv, out, lse, B, T, NH, NKV, HS, stream, __func__);
}
extern "C" void nb_cuda_attention_backward_set_bf16(nb_bf16 *dqkv, const nb_bf16 *dout, const nb_bf16 *qkv,
                                                    const nb_bf16 *out, const float *lse, int B, int T, int NH,
                                                    int NKV, int HS, nb_stream_t stream) {
    attention_backward_set(nb_kt(dqkv), nb_kt(dout), nb_kt(qkv), nb_kt(out), lse, B, T, NH, NKV, HS, stream,
                           __func__);
}
