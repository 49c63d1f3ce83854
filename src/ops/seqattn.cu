/* Attention over packed histories on CUDA (seqattn.c's): the history self-attention and the
 * target attention of seqctr, fp32 inside. bf16 self-attention goes to seqattn_tc.cu's tensor-core
 * kernels first; these CUDA-core kernels are the fp32 path (the CPU's order of operations per
 * element) and serve the shapes the tensor-core kernels do not take.
 *
 * Every gradient element has one writer (query rows in one kernel, key rows in another), each
 * summing over the other side in index order: deterministic without atomics.
 *
 * Self-attention: one block of SA_THREADS per (sample, head); a thread per query row (forward,
 * dq) or key row (dk, dv), in passes of SA_THREADS rows. The other side's rows of the head sit in
 * shared memory as fp32 rows padded to HSM (the head size rounded up to a compile-time 4..64,
 * padding zero), in tiles of up to SA_SMEM_BYTES; a history within one tile is loaded once,
 * longer ones per pass and tile. The inner loops read one shared row for the whole warp (a
 * broadcast) 16 bytes at a time and keep the thread's own row and accumulators in registers. */
#include "ctr_cuda.cuh"

/* Dynamic shared memory of every kernel here; float4 so rows can be read 16 bytes at a time. */
extern __shared__ float4 ctr_smem[];

#define SA_THREADS 64
#define SA_SMEM_BYTES (16 * 1024)

/* q . row over HSM (row: 16-byte aligned shared memory), in d order */
template <int HSM> static __device__ __forceinline__ float sa_dot(const float *q, const float *row) {
    const float4 *r4 = (const float4 *)row;
    float a = 0.0f;
#pragma unroll
    for (int d4 = 0; d4 < HSM / 4; d4++) {
        float4 k = r4[d4];
        a += q[4 * d4] * k.x;
        a += q[4 * d4 + 1] * k.y;
        a += q[4 * d4 + 2] * k.z;
        a += q[4 * d4 + 3] * k.w;
    }
    return a;
}
/* acc += p * row */
template <int HSM> static __device__ __forceinline__ void sa_axpy(float *acc, float p, const float *row) {
    const float4 *r4 = (const float4 *)row;
#pragma unroll
    for (int d4 = 0; d4 < HSM / 4; d4++) {
        float4 v = r4[d4];
        acc[4 * d4] += p * v.x;
        acc[4 * d4 + 1] += p * v.y;
        acc[4 * d4 + 2] += p * v.z;
        acc[4 * d4 + 3] += p * v.w;
    }
}
template <int HSM> static __device__ __forceinline__ void sa_scale(float *acc, float f) {
#pragma unroll
    for (int d = 0; d < HSM; d++) acc[d] *= f;
}
/* Online softmax step (running max m, sum l, output acc) for one key of score s (already
 * scaled) and value row vrow. */
template <int HSM>
static __device__ __forceinline__ void sa_online_key(float s, const float *vrow, float &m, float &l, float *acc) {
    if (s > m) {
        float f = expf(m - s);
        l *= f;
        sa_scale<HSM>(acc, f);
        m = s;
    }
    float p = expf(s - m);
    l += p;
    sa_axpy<HSM>(acc, p, vrow);
}

/* s[r * HSM + d] = src[r * ld + d] for r < rows, zero for HS <= d < HSM (the whole block). */
template <typename T>
static __device__ __forceinline__ void sa_load(float *s, const T *src, size_t ld, int rows, int HS, int HSM) {
    for (int x = threadIdx.x; x < rows * HSM; x += blockDim.x) {
        int r = x / HSM, d = x - r * HSM;
        s[x] = d < HS ? nb_ld(src + (size_t)r * ld + d) : 0.0f;
    }
}

template <typename T, int HSM>
static __global__ void __launch_bounds__(SA_THREADS)
    seqattn_fwd_kernel(T *out, float *lse, const T *qkv, const int32_t *off, int H, int E, int tile) {
    int b = blockIdx.x, h = blockIdx.y, start = off[b], len = off[b + 1] - start;
    if (len <= 0) return;
    int HS = E / H;
    float scale = 1.0f / sqrtf((float)HS);
    size_t ld = 3 * (size_t)E;
    const T *base = qkv + (size_t)start * ld + (size_t)h * HS; /* row 0's q of this head */
    float *lse_h = (float *)lse + (size_t)start * H + (size_t)h * len; /* this head's rows */
    float *sK = (float *)ctr_smem, *sV = sK + (size_t)tile * HSM;
    for (int r0 = 0; r0 < len; r0 += SA_THREADS) {
        int i = r0 + threadIdx.x, act = i < len;
        float q[HSM], acc[HSM], m = -INFINITY, l = 0.0f;
#pragma unroll
        for (int d = 0; d < HSM; d++) {
            q[d] = act && d < HS ? nb_ld(base + (size_t)i * ld + d) : 0.0f;
            acc[d] = 0.0f;
        }
        for (int t0 = 0; t0 < len; t0 += tile) {
            int tl = min(tile, len - t0);
            if (r0 == 0 || len > tile) {
                __syncthreads();
                sa_load(sK, base + (size_t)t0 * ld + E, ld, tl, HS, HSM);
                sa_load(sV, base + (size_t)t0 * ld + 2 * (size_t)E, ld, tl, HS, HSM);
                __syncthreads();
            }
            if (!act) continue;
            int j = 0;
            /* four scores, then at most one rescale for the four */
            for (; j + 4 <= tl; j += 4) {
                float s0 = sa_dot<HSM>(q, sK + (size_t)j * HSM), s1 = sa_dot<HSM>(q, sK + (size_t)(j + 1) * HSM);
                float s2 = sa_dot<HSM>(q, sK + (size_t)(j + 2) * HSM), s3 = sa_dot<HSM>(q, sK + (size_t)(j + 3) * HSM);
                s0 *= scale, s1 *= scale, s2 *= scale, s3 *= scale;
                float cm = fmaxf(fmaxf(s0, s1), fmaxf(s2, s3));
                if (cm > m) {
                    float f = expf(m - cm);
                    l *= f;
                    sa_scale<HSM>(acc, f);
                    m = cm;
                }
                sa_online_key<HSM>(s0, sV + (size_t)j * HSM, m, l, acc);
                sa_online_key<HSM>(s1, sV + (size_t)(j + 1) * HSM, m, l, acc);
                sa_online_key<HSM>(s2, sV + (size_t)(j + 2) * HSM, m, l, acc);
                sa_online_key<HSM>(s3, sV + (size_t)(j + 3) * HSM, m, l, acc);
            }
            for (; j < tl; j++) {
                float s = sa_dot<HSM>(q, sK + (size_t)j * HSM);
                s *= scale;
                sa_online_key<HSM>(s, sV + (size_t)j * HSM, m, l, acc);
            }
        }
        if (act) {
            float inv = 1.0f / l;
            T *o = out + (size_t)(start + i) * E + (size_t)h * HS;
#pragma unroll
            for (int d = 0; d < HSM; d++) if (d < HS) nb_st(o + d, acc[d] * inv);
            lse_h[i] = m + logf(l);
        }
    }
}

/* dq_i += sum_j dS_ij k_j with P_ij = exp(scale q_i.k_j - lse_i), dS_ij = P_ij (dO_i.v_j - D_i)
 * scale and D_i = dO_i . o_i (seqattn.c's formulas), one thread per query row. */
template <typename T, int HSM>
static __global__ void __launch_bounds__(SA_THREADS)
    seqattn_dq_kernel(T *dqkv, const T *dout, const T *qkv, const T *out, const float *lse,
                            const int32_t *off, int H, int E, int tile) {
    int b = blockIdx.x, h = blockIdx.y, start = off[b], len = off[b + 1] - start;
    if (len <= 0) return;
    int HS = E / H;
    float scale = 1.0f / sqrtf((float)HS);
    size_t ld = 3 * (size_t)E;
    const T *base = qkv + (size_t)start * ld + (size_t)h * HS; /* row 0's q of this head */
    float *lse_h = (float *)lse + (size_t)start * H + (size_t)h * len; /* this head's rows */
    const T *ob = out + (size_t)start * E + (size_t)h * HS, *gb = dout + (size_t)start * E + (size_t)h * HS;
    float *sK = (float *)ctr_smem, *sV = sK + (size_t)tile * HSM;
    for (int r0 = 0; r0 < len; r0 += SA_THREADS) {
        int i = r0 + threadIdx.x, act = i < len;
        float q[HSM], dO[HSM], dq[HSM], Di = 0.0f, li = act ? lse_h[i] : 0.0f;
#pragma unroll
        for (int d = 0; d < HSM; d++) {
            int ok = act && d < HS;
            q[d] = ok ? nb_ld(base + (size_t)i * ld + d) : 0.0f;
            dO[d] = ok ? nb_ld(gb + (size_t)i * E + d) : 0.0f;
            dq[d] = 0.0f;
            if (ok) Di += dO[d] * nb_ld(ob + (size_t)i * E + d);
        }
        for (int t0 = 0; t0 < len; t0 += tile) {
            int tl = min(tile, len - t0);
            if (r0 == 0 || len > tile) {
                __syncthreads();
                sa_load(sK, base + (size_t)t0 * ld + E, ld, tl, HS, HSM);
                sa_load(sV, base + (size_t)t0 * ld + 2 * (size_t)E, ld, tl, HS, HSM);
                __syncthreads();
            }
            if (!act) continue;
#pragma unroll 2
            for (int j = 0; j < tl; j++) {
                float s = sa_dot<HSM>(q, sK + (size_t)j * HSM);
                float dp = sa_dot<HSM>(dO, sV + (size_t)j * HSM);
                float P = expf(scale * s - li);
                float dS = P * (dp - Di) * scale;
                sa_axpy<HSM>(dq, dS, sK + (size_t)j * HSM);
            }
        }
        if (act) {
            T *g = dqkv + (size_t)(start + i) * ld + (size_t)h * HS;
#pragma unroll
            for (int d = 0; d < HSM; d++) if (d < HS) nb_st(g + d, nb_ld(g + d) + dq[d]);
        }
    }
}

/* dk_j += sum_i dS_ij q_i, dv_j += sum_i P_ij dO_i: one thread per key row; the query side's
 * q, dO, lse and D_i tile in shared memory (D_i computed once per tile load). */
template <typename T, int HSM>
static __global__ void __launch_bounds__(SA_THREADS)
    seqattn_dkv_kernel(T *dqkv, const T *dout, const T *qkv, const T *out, const float *lse,
                             const int32_t *off, int H, int E, int tile) {
    int b = blockIdx.x, h = blockIdx.y, start = off[b], len = off[b + 1] - start;
    if (len <= 0) return;
    int HS = E / H;
    float scale = 1.0f / sqrtf((float)HS);
    size_t ld = 3 * (size_t)E;
    const T *base = qkv + (size_t)start * ld + (size_t)h * HS; /* row 0's q of this head */
    float *lse_h = (float *)lse + (size_t)start * H + (size_t)h * len; /* this head's rows */
    const T *ob = out + (size_t)start * E + (size_t)h * HS, *gb = dout + (size_t)start * E + (size_t)h * HS;
    float *sQ = (float *)ctr_smem, *sG = sQ + (size_t)tile * HSM, *sL = sG + (size_t)tile * HSM, *sD = sL + tile;
    for (int r0 = 0; r0 < len; r0 += SA_THREADS) {
        int j = r0 + threadIdx.x, act = j < len;
        float k[HSM], v[HSM], dk[HSM], dv[HSM];
#pragma unroll
        for (int d = 0; d < HSM; d++) {
            int ok = act && d < HS;
            k[d] = ok ? nb_ld(base + (size_t)j * ld + E + d) : 0.0f;
            v[d] = ok ? nb_ld(base + (size_t)j * ld + 2 * (size_t)E + d) : 0.0f;
            dk[d] = 0.0f, dv[d] = 0.0f;
        }
        for (int t0 = 0; t0 < len; t0 += tile) {
            int tl = min(tile, len - t0);
            if (r0 == 0 || len > tile) {
                __syncthreads();
                sa_load(sQ, base + (size_t)t0 * ld, ld, tl, HS, HSM);
                sa_load(sG, gb + (size_t)t0 * E, E, tl, HS, HSM);
                __syncthreads();
                for (int x = threadIdx.x; x < tl; x += blockDim.x) {
                    float D = 0.0f;
                    for (int d = 0; d < HS; d++) D += sG[(size_t)x * HSM + d] * nb_ld(ob + (size_t)(t0 + x) * E + d);
                    sD[x] = D;
                    sL[x] = lse_h[t0 + x];
                }
                __syncthreads();
            }
            if (!act) continue;
#pragma unroll 2
            for (int i = 0; i < tl; i++) {
                float s = sa_dot<HSM>(k, sQ + (size_t)i * HSM);
                float dp = sa_dot<HSM>(v, sG + (size_t)i * HSM);
                float P = expf(scale * s - sL[i]);
                float dS = P * (dp - sD[i]) * scale;
                sa_axpy<HSM>(dv, P, sG + (size_t)i * HSM);
                sa_axpy<HSM>(dk, dS, sQ + (size_t)i * HSM);
            }
        }
        if (act) {
            T *g = dqkv + (size_t)(start + j) * ld + (size_t)h * HS;
#pragma unroll
            for (int d = 0; d < HSM; d++) if (d < HS) {
                nb_st(g + E + d, nb_ld(g + E + d) + dk[d]);
                nb_st(g + 2 * (size_t)E + d, nb_ld(g + 2 * (size_t)E + d) + dv[d]);
            }
        }
    }
}

/* The smallest compiled head-size bound that holds HS. */
static int sa_hsm(int HS) { return HS <= 4 ? 4 : HS <= 8 ? 8 : HS <= 16 ? 16 : HS <= 32 ? 32 : 64; }

/* Rows per shared-memory tile: the budget, but no more than a history can have. */
static int sa_tile(int max_len, int floats_per_row) {
    int t = SA_SMEM_BYTES / (floats_per_row * (int)sizeof(float));
    int ml = max_len > 0 ? max_len : 1;
    return t < ml ? t : ml;
}

/* ---- target attention: one block per sample ---- */

#define TA_THREADS 128
#define TA_CHUNK 256 /* keys whose ds the backward keeps in shared memory at a time */

/* Scores (a warp per key, lanes over E) go to attn, which then holds exp(s - max), then the
 * weights; pooled sums the weighted v rows in key order, a thread per column. */
template <typename T>
static __global__ void targetattn_fwd_kernel(T *pooled, float *attn, const T *q, const T *k, const T *v,
                                             const int32_t *off, int E, int ldkv) {
    __shared__ float red[32];
    float *sq = (float *)ctr_smem;
    int b = blockIdx.x, start = off[b], len = max(0, off[b + 1] - start);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    T *pb = pooled + (size_t)b * E;
    if (len == 0) {
        for (int e = threadIdx.x; e < E; e += blockDim.x) nb_st(pb + e, 0.0f);
        return;
    }
    for (int e = threadIdx.x; e < E; e += blockDim.x) sq[e] = nb_ld(q + (size_t)b * E + e);
    __syncthreads();
    float scale = 1.0f / sqrtf((float)E), mx = -INFINITY;
    for (int j = warp; j < len; j += nw) {
        const T *kj = k + (size_t)(start + j) * ldkv;
        float s = 0.0f;
        for (int e = lane; e < E; e += 32) s += sq[e] * nb_ld(kj + e);
        s = scale * nb_warp_sum(s);
        if (lane == 0) attn[start + j] = s;
        mx = fmaxf(mx, s);
    }
    mx = nb_block_max(mx, red); /* its barriers also publish the scores */
    float sum = 0.0f;
    for (int j = threadIdx.x; j < len; j += blockDim.x) {
        float p = expf(attn[start + j] - mx);
        attn[start + j] = p;
        sum += p;
    }
    float inv = 1.0f / nb_block_sum(sum, red);
    for (int j = threadIdx.x; j < len; j += blockDim.x) attn[start + j] *= inv;
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < len; j++) acc += attn[start + j] * nb_ld(v + (size_t)(start + j) * ldkv + e);
        nb_st(pb + e, acc);
    }
}
/* ds_j = a_j (dp . v_j - sum_i a_i dp . v_i) / sqrt(E): a warp per key writes that key's dk
 * and dv rows and puts ds_j in shared memory; then a thread per column adds the chunk's
 * ds_j k_j to dq in key order. */
template <typename T>
static __global__ void targetattn_bwd_kernel(T *dq, T *dk, T *dv, const T *dpooled, const T *q, const T *k,
                                             const T *v, const float *attn, const int32_t *off, int E,
                                             int ldkv) {
    __shared__ float red[32];
    float *sds = (float *)ctr_smem, *sdq = sds + TA_CHUNK, *sq = sdq + E, *sdp = sq + E;
    int b = blockIdx.x, start = off[b], len = off[b + 1] - start;
    if (len <= 0) return;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        sq[e] = nb_ld(q + (size_t)b * E + e);
        sdp[e] = nb_ld(dpooled + (size_t)b * E + e);
        sdq[e] = dq ? nb_ld(dq + (size_t)b * E + e) : 0.0f;
    }
    __syncthreads();
    float scale = 1.0f / sqrtf((float)E), part = 0.0f;
    for (int j = warp; j < len; j += nw) {
        const T *vj = v + (size_t)(start + j) * ldkv;
        float da = 0.0f;
        for (int e = lane; e < E; e += 32) da += sdp[e] * nb_ld(vj + e);
        part += attn[start + j] * nb_warp_sum(da);
    }
    float ada = nb_block_sum(lane == 0 ? part : 0.0f, red);
    for (int c0 = 0; c0 < len; c0 += TA_CHUNK) {
        int c1 = min(len, c0 + TA_CHUNK);
        for (int j = c0 + warp; j < c1; j += nw) {
            size_t row = (size_t)(start + j) * ldkv;
            float da = 0.0f, a = attn[start + j];
            for (int e = lane; e < E; e += 32) da += sdp[e] * nb_ld(v + row + e);
            float ds = a * (nb_warp_sum(da) - ada) * scale;
            for (int e = lane; e < E; e += 32) {
                if (dv) nb_st(dv + row + e, nb_ld(dv + row + e) + a * sdp[e]);
                if (dk) nb_st(dk + row + e, nb_ld(dk + row + e) + ds * sq[e]);
            }
            if (lane == 0) sds[j - c0] = ds;
        }
        __syncthreads();
        if (dq)
            for (int e = threadIdx.x; e < E; e += blockDim.x) {
                float acc = sdq[e];
                for (int j = c0; j < c1; j++) acc += sds[j - c0] * nb_ld(k + (size_t)(start + j) * ldkv + e);
                sdq[e] = acc;
            }
        __syncthreads();
    }
    if (dq)
        for (int e = threadIdx.x; e < E; e += blockDim.x) nb_st(dq + (size_t)b * E + e, sdq[e]);
}
/* ---- launchers ---- */

/* bf16 self-attention goes to the tensor-core kernels when they take the shape (1), else 0. */
static int sa_tc_forward(nb_bf16_t *out, float *lse, const nb_bf16_t *qkv, const int32_t *off, int B, int max_len,
                         int H, int E, cudaStream_t stream) {
    return nb_cuda_seqattn_tc_forward_bf16((nb_bf16 *)out, lse, (const nb_bf16 *)qkv, off, B, max_len, H, E, stream);
}
static int sa_tc_forward(float *, float *, const float *, const int32_t *, int, int, int, int, cudaStream_t) {
    return 0;
}
static int sa_tc_backward(nb_bf16_t *dqkv, const nb_bf16_t *dout, const nb_bf16_t *qkv, const nb_bf16_t *out,
                          const float *lse, const int32_t *off, int B, int max_len, int H, int E, cudaStream_t stream) {
    return nb_cuda_seqattn_tc_backward_bf16((nb_bf16 *)dqkv, (const nb_bf16 *)dout, (const nb_bf16 *)qkv,
                                            (const nb_bf16 *)out, lse, off, B, max_len, H, E, stream);
}
static int sa_tc_backward(float *, const float *, const float *, const float *, const float *, const int32_t *, int,
                          int, int, int, cudaStream_t) {
    return 0;
}

template <typename T>
static void seqattn_forward(T *out, float *lse, const T *qkv, const int32_t *off, int B, int max_len, int H, int E,
                            cudaStream_t stream, const char *name) {
    NB_CUDA_SHAPE(B >= 0 && H > 0 && H <= 65535 && E > 0 && E % H == 0 && E / H <= 64 &&
                      (B == 0 || (out && lse && qkv && off)),
                  name);
    if (B == 0) return;
    if (sa_tc_forward(out, lse, qkv, off, B, max_len, H, E, stream)) return;
    int hsm = sa_hsm(E / H), tile = sa_tile(max_len, 2 * hsm);
    size_t smem = (size_t)tile * 2 * hsm * sizeof(float);
    dim3 grid(B, H);
    switch (hsm) {
    case 4: seqattn_fwd_kernel<T, 4><<<grid, SA_THREADS, smem, stream>>>(out, lse, qkv, off, H, E, tile); break;
    case 8: seqattn_fwd_kernel<T, 8><<<grid, SA_THREADS, smem, stream>>>(out, lse, qkv, off, H, E, tile); break;
    case 16: seqattn_fwd_kernel<T, 16><<<grid, SA_THREADS, smem, stream>>>(out, lse, qkv, off, H, E, tile); break;
    case 32: seqattn_fwd_kernel<T, 32><<<grid, SA_THREADS, smem, stream>>>(out, lse, qkv, off, H, E, tile); break;
    default: seqattn_fwd_kernel<T, 64><<<grid, SA_THREADS, smem, stream>>>(out, lse, qkv, off, H, E, tile); break;
    }
    CUDA_CHECK_LAUNCH("history self-attention forward");
}

/* The backward's two kernels for head-size bound HSM: dq, then dk and dv. */
template <typename T, int HSM>
static void seqattn_backward_hsm(T *dqkv, const T *dout, const T *qkv, const T *out, const float *lse,
                                 const int32_t *off, int B, int max_len, int H, int E, cudaStream_t stream) {
    int tq = sa_tile(max_len, 2 * HSM), tkv = sa_tile(max_len, 2 * HSM + 2);
    seqattn_dq_kernel<T, HSM><<<dim3(B, H), SA_THREADS, (size_t)tq * 2 * HSM * sizeof(float), stream>>>(
        dqkv, dout, qkv, out, lse, off, H, E, tq);
    CUDA_CHECK_LAUNCH("history self-attention backward (dq)");
    seqattn_dkv_kernel<T, HSM><<<dim3(B, H), SA_THREADS, (size_t)tkv * (2 * HSM + 2) * sizeof(float), stream>>>(
        dqkv, dout, qkv, out, lse, off, H, E, tkv);
    CUDA_CHECK_LAUNCH("history self-attention backward (dk, dv)");
}

template <typename T>
static void seqattn_backward(T *dqkv, const T *dout, const T *qkv, const T *out, const float *lse, const int32_t *off,
                             int B, int max_len, int H, int E, cudaStream_t stream, const char *name) {
    NB_CUDA_SHAPE(B >= 0 && H > 0 && H <= 65535 && E > 0 && E % H == 0 && E / H <= 64 &&
                      (B == 0 || !dqkv || (dout && qkv && out && lse && off)),
                  name);
    if (B == 0 || !dqkv) return;
    if (sa_tc_backward(dqkv, dout, qkv, out, lse, off, B, max_len, H, E, stream)) return;
    switch (sa_hsm(E / H)) {
    case 4: seqattn_backward_hsm<T, 4>(dqkv, dout, qkv, out, lse, off, B, max_len, H, E, stream); break;
    case 8: seqattn_backward_hsm<T, 8>(dqkv, dout, qkv, out, lse, off, B, max_len, H, E, stream); break;
    case 16: seqattn_backward_hsm<T, 16>(dqkv, dout, qkv, out, lse, off, B, max_len, H, E, stream); break;
    case 32: seqattn_backward_hsm<T, 32>(dqkv, dout, qkv, out, lse, off, B, max_len, H, E, stream); break;
    default: seqattn_backward_hsm<T, 64>(dqkv, dout, qkv, out, lse, off, B, max_len, H, E, stream); break;
    }
}

template <typename T>
static void targetattn_forward(T *pooled, float *attn, const T *q, const T *k, const T *v, const int32_t *off, int B,
                               int E, int ldkv, cudaStream_t stream, const char *name) {
    NB_CUDA_SHAPE(B >= 0 && E > 0 && ldkv >= E && (size_t)E * sizeof(float) <= 32768 &&
                      (B == 0 || (pooled && attn && q && k && v && off)),
                  name);
    if (B == 0) return;
    targetattn_fwd_kernel<<<B, TA_THREADS, (size_t)E * sizeof(float), stream>>>(pooled, attn, q, k, v, off, E, ldkv);
    CUDA_CHECK_LAUNCH("target attention forward");
}

template <typename T>
static void targetattn_backward(T *dq, T *dk, T *dv, const T *dpooled, const T *q, const T *k, const T *v,
                                const float *attn, const int32_t *off, int B, int E, int ldkv, cudaStream_t stream,
                                const char *name) {
    NB_CUDA_SHAPE(B >= 0 && E > 0 && ldkv >= E && (size_t)(TA_CHUNK + 3 * E) * sizeof(float) <= 49152 &&
                      (B == 0 || !(dq || dk || dv) || (dpooled && q && k && v && attn && off)),
                  name);
    if (B == 0 || !(dq || dk || dv)) return;
    targetattn_bwd_kernel<<<B, TA_THREADS, (size_t)(TA_CHUNK + 3 * E) * sizeof(float), stream>>>(
        dq, dk, dv, dpooled, q, k, v, attn, off, E, ldkv);
    CUDA_CHECK_LAUNCH("target attention backward");
}

extern "C" void nb_cuda_seqattn_forward_f32(float *out, float *lse, const float *qkv, const int32_t *off, int B,
                                            int max_len, int H, int E, nb_stream_t stream) {
    seqattn_forward(out, lse, qkv, off, B, max_len, H, E, stream, __func__);
}
extern "C" void nb_cuda_seqattn_forward_bf16(nb_bf16 *out, float *lse, const nb_bf16 *qkv, const int32_t *off, int B,
                                             int max_len, int H, int E, nb_stream_t stream) {
    seqattn_forward(nb_kt(out), lse, nb_kt(qkv), off, B, max_len, H, E, stream, __func__);
}
extern "C" void nb_cuda_seqattn_backward_f32(float *dqkv, const float *dout, const float *qkv, const float *out,
                                             const float *lse, const int32_t *off, int B, int max_len, int H, int E,
                                             nb_stream_t stream) {
    seqattn_backward(dqkv, dout, qkv, out, lse, off, B, max_len, H, E, stream, __func__);
}
extern "C" void nb_cuda_seqattn_backward_bf16(nb_bf16 *dqkv, const nb_bf16 *dout, const nb_bf16 *qkv,
                                              const nb_bf16 *out, const float *lse, const int32_t *off, int B,
                                              int max_len, int H, int E, nb_stream_t stream) {
    seqattn_backward(nb_kt(dqkv), nb_kt(dout), nb_kt(qkv), nb_kt(out), lse, off, B, max_len, H, E, stream, __func__);
}
/* max_len: the tiles' bound in the self-attention; the target attention's loops need none */
extern "C" void nb_cuda_targetattn_forward_f32(float *pooled, float *attn, const float *q, const float *k,
                                               const float *v, const int32_t *off, int B, int max_len, int E, int ldkv,
                                               nb_stream_t stream) {
    targetattn_forward(pooled, attn, q, k, v, off, B, E, ldkv, stream, __func__);
}
extern "C" void nb_cuda_targetattn_forward_bf16(nb_bf16 *pooled, float *attn, const nb_bf16 *q, const nb_bf16 *k,
                                                const nb_bf16 *v, const int32_t *off, int B, int max_len, int E,
                                                int ldkv, nb_stream_t stream) {
    targetattn_forward(nb_kt(pooled), attn, nb_kt(q), nb_kt(k), nb_kt(v), off, B, E, ldkv, stream, __func__);
}
extern "C" void nb_cuda_targetattn_backward_f32(float *dq, float *dk, float *dv, const float *dpooled, const float *q,
                                                const float *k, const float *v, const float *attn, const int32_t *off,
                                                int B, int max_len, int E, int ldkv, nb_stream_t stream) {
    targetattn_backward(dq, dk, dv, dpooled, q, k, v, attn, off, B, E, ldkv, stream, __func__);
}
extern "C" void nb_cuda_targetattn_backward_bf16(nb_bf16 *dq, nb_bf16 *dk, nb_bf16 *dv, const nb_bf16 *dpooled,
                                                 const nb_bf16 *q, const nb_bf16 *k, const nb_bf16 *v,
                                                 const float *attn, const int32_t *off, int B, int max_len, int E,
                                                 int ldkv, nb_stream_t stream) {
    targetattn_backward(nb_kt(dq), nb_kt(dk), nb_kt(dv), nb_kt(dpooled), nb_kt(q), nb_kt(k), nb_kt(v), attn, off, B, E,
                        ldkv, stream, __func__);
}
