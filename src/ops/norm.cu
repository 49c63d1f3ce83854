/* LayerNorm and RMSNorm on CUDA, same formulas as norm.c.
 *
 * Row kernels: one warp per row (8 rows per 256-thread block); row statistics in fp32, two-pass
 * variance (no cancellation when |mean| >> std), warp sums by xor butterfly. The dw / db
 * reductions over rows run in two fixed-order passes: partial sums over NB_COL_ROWS rows per
 * block, then nb_col_finish adds the partials in order. No atomics anywhere. */
#include "ops_cuda_common.cuh"

#define ROWS_PER_BLOCK 8

static unsigned row_blocks(int N) { return (unsigned)((N + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK); }

/* ---- LayerNorm ---- */

#define DEF_LN_FWD(T)                                                                              \
    static __global__ void ln_fwd_kernel(T *out, float *mean, float *rstd, const T *inp, const T *w, \
                                         const T *b, int N, int C, float eps) {                    \
        int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;       \
        if (row >= N) return;                                                                      \
        const T *x = inp + (size_t)row * C;                                                        \
        T *y = out + (size_t)row * C;                                                              \
        float s = 0.0f;                                                                            \
        for (int i = lane; i < C; i += 32) s += nb_ld(x + i);                                      \
        float m = nb_warp_sum(s) / C;                                                              \
        float ss = 0.0f;                                                                           \
        for (int i = lane; i < C; i += 32) {                                                       \
            float d = nb_ld(x + i) - m;                                                            \
            ss += d * d;                                                                           \
        }                                                                                          \
        float r = 1.0f / sqrtf(nb_warp_sum(ss) / C + eps);                                         \
        for (int i = lane; i < C; i += 32)                                                         \
            nb_st(y + i, (nb_ld(x + i) - m) * r * nb_ld(w + i) + nb_ld(b + i));                    \
        if (lane == 0) {                                                                           \
            if (mean) mean[row] = m;                                                               \
            if (rstd) rstd[row] = r;                                                               \
        }                                                                                          \
    }
NB_FOR_EACH_DTYPE(DEF_LN_FWD)

/* dx += rstd * (g - mean(g) - xhat * mean(g * xhat)), g = w * dout. */
#define DEF_LN_DINP(T)                                                                             \
    static __global__ void ln_dinp_kernel(T *dinp, const T *dout, const T *inp, const T *w,        \
                                          const float *mean, const float *rstd, int N, int C) {    \
        int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;       \
        if (row >= N) return;                                                                      \
        const T *x = inp + (size_t)row * C, *dy = dout + (size_t)row * C;                          \
        T *dx = dinp + (size_t)row * C;                                                            \
        float m = mean[row], r = rstd[row];                                                        \
        float sg = 0.0f, sgx = 0.0f;                                                               \
        for (int i = lane; i < C; i += 32) {                                                       \
            float xhat = (nb_ld(x + i) - m) * r, g = nb_ld(w + i) * nb_ld(dy + i);                 \
            sg += g;                                                                               \
            sgx += g * xhat;                                                                       \
        }                                                                                          \
        float mg = nb_warp_sum(sg) / C, mgx = nb_warp_sum(sgx) / C;                                \
        for (int i = lane; i < C; i += 32) {                                                       \
            float xhat = (nb_ld(x + i) - m) * r, g = nb_ld(w + i) * nb_ld(dy + i);                 \
            nb_st(dx + i, nb_ld(dx + i) + (g - mg - xhat * mgx) * r);                              \
        }                                                                                          \
    }
NB_FOR_EACH_DTYPE(DEF_LN_DINP)

/* First pass of dw / db: part_w[k][c] = sum dout * xhat, part_b[k][c] = sum dout over the k-th
 * block of NB_COL_ROWS rows; block (32, 8): 32 columns, 8 row lanes, combined in lane order. */
#define DEF_LN_DPARAMS(T)                                                                          \
    static __global__ void ln_dparams_kernel(float *part_w, float *part_b, const T *dout, const T *inp, \
                                             const float *mean, const float *rstd, int N, int C) { \
        __shared__ float sw[8][33], sb[8][33];                                                     \
        int c = blockIdx.x * 32 + threadIdx.x;                                                     \
        int r0 = blockIdx.y * NB_COL_ROWS, r1 = min(N, r0 + NB_COL_ROWS);                          \
        float aw = 0.0f, ab = 0.0f;                                                                \
        if (c < C)                                                                                 \
            for (int r = r0 + threadIdx.y; r < r1; r += 8) {                                       \
                float dy = nb_ld(dout + (size_t)r * C + c);                                        \
                aw += dy * ((nb_ld(inp + (size_t)r * C + c) - mean[r]) * rstd[r]);                 \
                ab += dy;                                                                          \
            }                                                                                      \
        sw[threadIdx.y][threadIdx.x] = aw;                                                         \
        sb[threadIdx.y][threadIdx.x] = ab;                                                         \
        __syncthreads();                                                                           \
        if (threadIdx.y == 0 && c < C) {                                                           \
            float s1 = 0.0f, s2 = 0.0f;                                                            \
            for (int i = 0; i < 8; i++) {                                                          \
                s1 += sw[i][threadIdx.x];                                                          \
                s2 += sb[i][threadIdx.x];                                                          \
            }                                                                                      \
            part_w[(size_t)blockIdx.y * C + c] = s1;                                               \
            part_b[(size_t)blockIdx.y * C + c] = s2;                                               \
        }                                                                                          \
    }
NB_FOR_EACH_DTYPE(DEF_LN_DPARAMS)

#define DEF_LN_LAUNCHERS(SFX, T, KT)                                                               \
    extern "C" void nb_cuda_layernorm_forward_##SFX(T *out, float *mean, float *rstd, const T *inp, \
                                                     const T *w, const T *b, int N, int C, float eps, \
                                                     nb_stream_t stream) {                         \
        NB_CUDA_SHAPE(N >= 0 && C > 0 && out && inp && w && b, "nb_cuda_layernorm_forward_" #SFX); \
        if (N == 0) return;                                                                        \
        ln_fwd_kernel<<<row_blocks(N), 32 * ROWS_PER_BLOCK, 0, stream>>>(                          \
            (KT *)out, mean, rstd, (const KT *)inp, (const KT *)w, (const KT *)b, N, C, eps);      \
        CUDA_CHECK_LAUNCH("layernorm forward");                                                    \
    }                                                                                              \
    extern "C" void nb_cuda_layernorm_backward_##SFX(T *dinp, float *dw, float *db, const T *dout, \
                                                      const T *inp, const T *w, const float *mean, \
                                                      const float *rstd, int N, int C,             \
                                                      nb_stream_t stream) {                        \
        const char *name = "nb_cuda_layernorm_backward_" #SFX;                                     \
        NB_CUDA_SHAPE(N >= 0 && C > 0 && dout && inp && w && mean && rstd, name);                  \
        if (N == 0) return;                                                                        \
        if (dinp) {                                                                                \
            ln_dinp_kernel<<<row_blocks(N), 32 * ROWS_PER_BLOCK, 0, stream>>>(                     \
                (KT *)dinp, (const KT *)dout, (const KT *)inp, (const KT *)w, mean, rstd, N, C);   \
            CUDA_CHECK_LAUNCH("layernorm backward (dinp)");                                        \
        }                                                                                          \
        if (!dw && !db) return;                                                                    \
        int nparts = nb_col_parts(N);                                                              \
        NB_CUDA_SHAPE(nparts <= 65535, name);                                                      \
        float *part = (float *)nb_cuda_scratch(2 * (size_t)nparts * C * sizeof(float), stream);    \
        float *part_b = part + (size_t)nparts * C;                                                 \
        ln_dparams_kernel<<<dim3((C + 31) / 32, nparts), dim3(32, 8), 0, stream>>>(                \
            part, part_b, (const KT *)dout, (const KT *)inp, mean, rstd, N, C);                    \
        CUDA_CHECK_LAUNCH("layernorm backward (dw/db first pass)");                                \
        if (dw) nb_col_finish(dw, part, nparts, C, stream);                                        \
        if (db) nb_col_finish(db, part_b, nparts, C, stream);                                      \
        nb_cuda_scratch_free(part, stream);                                                        \
    }
DEF_LN_LAUNCHERS(f32, float, float)
DEF_LN_LAUNCHERS(bf16, nb_bf16, nb_bf16_t)

/* ---- RMSNorm ---- */

/* HF LlamaRMSNorm: y = w * (x * rstd), the normalized value rounded before the weight. */
#define DEF_RMS_FWD(T)                                                                             \
    static __global__ void rms_fwd_kernel(T *out, float *rstd, const T *inp, const T *w, int N, int C, \
                                          float eps) {                                             \
        int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;       \
        if (row >= N) return;                                                                      \
        const T *x = inp + (size_t)row * C;                                                        \
        T *y = out + (size_t)row * C;                                                              \
        float ss = 0.0f;                                                                           \
        for (int i = lane; i < C; i += 32) {                                                       \
            float v = nb_ld(x + i);                                                                \
            ss += v * v;                                                                           \
        }                                                                                          \
        float r = 1.0f / sqrtf(nb_warp_sum(ss) / C + eps);                                         \
        for (int i = lane; i < C; i += 32) nb_st(y + i, nb_ld(w + i) * (nb_ld(x + i) * r));        \
        if (lane == 0 && rstd) rstd[row] = r;                                                      \
    }
NB_FOR_EACH_DTYPE(DEF_RMS_FWD)

/* dx += r * g - x * r^3 * mean(g * x), g = w * dout. */
#define DEF_RMS_DINP(T)                                                                            \
    static __global__ void rms_dinp_kernel(T *dinp, const T *dout, const T *inp, const T *w,       \
                                           const float *rstd, int N, int C) {                      \
        int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;       \
        if (row >= N) return;                                                                      \
        const T *x = inp + (size_t)row * C, *dy = dout + (size_t)row * C;                          \
        T *dx = dinp + (size_t)row * C;                                                            \
        float r = rstd[row];                                                                       \
        float sgx = 0.0f;                                                                          \
        for (int i = lane; i < C; i += 32) sgx += (nb_ld(w + i) * nb_ld(dy + i)) * nb_ld(x + i);   \
        float k = nb_warp_sum(sgx) / C * r * r * r;                                                \
        for (int i = lane; i < C; i += 32)                                                         \
            nb_st(dx + i, nb_ld(dx + i) + r * (nb_ld(w + i) * nb_ld(dy + i)) - nb_ld(x + i) * k);  \
    }
NB_FOR_EACH_DTYPE(DEF_RMS_DINP)

#define DEF_RMS_DW(T)                                                                              \
    static __global__ void rms_dw_kernel(float *part, const T *dout, const T *inp, const float *rstd, \
                                         int N, int C) {                                           \
        __shared__ float sw[8][33];                                                                \
        int c = blockIdx.x * 32 + threadIdx.x;                                                     \
        int r0 = blockIdx.y * NB_COL_ROWS, r1 = min(N, r0 + NB_COL_ROWS);                          \
        float aw = 0.0f;                                                                           \
        if (c < C)                                                                                 \
            for (int r = r0 + threadIdx.y; r < r1; r += 8)                                         \
                aw += nb_ld(dout + (size_t)r * C + c) * (nb_ld(inp + (size_t)r * C + c) * rstd[r]); \
        sw[threadIdx.y][threadIdx.x] = aw;                                                         \
        __syncthreads();                                                                           \
        if (threadIdx.y == 0 && c < C) {                                                           \
            float s = 0.0f;                                                                        \
            for (int i = 0; i < 8; i++) s += sw[i][threadIdx.x];                                   \
            part[(size_t)blockIdx.y * C + c] = s;                                                  \
        }                                                                                          \
    }
NB_FOR_EACH_DTYPE(DEF_RMS_DW)

#define DEF_RMS_LAUNCHERS(SFX, T, KT)                                                              \
    extern "C" void nb_cuda_rmsnorm_forward_##SFX(T *out, float *rstd, const T *inp, const T *w, int N, \
                                                   int C, float eps, nb_stream_t stream) {         \
        NB_CUDA_SHAPE(N >= 0 && C > 0 && out && inp && w, "nb_cuda_rmsnorm_forward_" #SFX);        \
        if (N == 0) return;                                                                        \
        rms_fwd_kernel<<<row_blocks(N), 32 * ROWS_PER_BLOCK, 0, stream>>>(                         \
            (KT *)out, rstd, (const KT *)inp, (const KT *)w, N, C, eps);                           \
        CUDA_CHECK_LAUNCH("rmsnorm forward");                                                      \
    }                                                                                              \
    extern "C" void nb_cuda_rmsnorm_backward_##SFX(T *dinp, float *dw, const T *dout, const T *inp, \
                                                    const T *w, const float *rstd, int N, int C,   \
                                                    nb_stream_t stream) {                          \
        const char *name = "nb_cuda_rmsnorm_backward_" #SFX;                                       \
        NB_CUDA_SHAPE(N >= 0 && C > 0 && dout && inp && w && rstd, name);                          \
        if (N == 0) return;                                                                        \
        if (dinp) {                                                                                \
            rms_dinp_kernel<<<row_blocks(N), 32 * ROWS_PER_BLOCK, 0, stream>>>(                    \
                (KT *)dinp, (const KT *)dout, (const KT *)inp, (const KT *)w, rstd, N, C);         \
            CUDA_CHECK_LAUNCH("rmsnorm backward (dinp)");                                          \
        }                                                                                          \
        if (!dw) return;                                                                           \
        int nparts = nb_col_parts(N);                                                              \
        NB_CUDA_SHAPE(nparts <= 65535, name);                                                      \
        float *part = (float *)nb_cuda_scratch((size_t)nparts * C * sizeof(float), stream);        \
        rms_dw_kernel<<<dim3((C + 31) / 32, nparts), dim3(32, 8), 0, stream>>>(                    \
            part, (const KT *)dout, (const KT *)inp, rstd, N, C);                                  \
        CUDA_CHECK_LAUNCH("rmsnorm backward (dw first pass)");                                     \
        nb_col_finish(dw, part, nparts, C, stream);                                                \
        nb_cuda_scratch_free(part, stream);                                                        \
    }
DEF_RMS_LAUNCHERS(f32, float, float)
DEF_RMS_LAUNCHERS(bf16, nb_bf16, nb_bf16_t)
