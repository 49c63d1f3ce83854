/* Token (+ learned position) embedding on CUDA.
 *
 * The backward is a scatter-add (several rows can carry one token). Deterministic without atomics
 * and without a sort: each block owns a range of VOCAB_ROWS vocabulary rows and scans all tokens
 * in (b, t) order, adding the dout rows whose token falls in its range; so each dwte element gets
 * its additions from one thread, in token order, exactly as embed.c adds them (fp32: the same
 * bits). Its cost is (V / VOCAB_ROWS) scans of the N token ids, read from shared memory. */
#include "ops_cuda_common.cuh"

#define THREADS 256
#define VOCAB_ROWS 128
#define TOKEN_CHUNK 2048

#define DEF_EMBED_KERNELS(T)                                                                       \
    /* A token outside [0, V) gives a NaN row: the loss shows it, nothing reads out of bounds. */  \
    static __global__ void embed_fwd_kernel(T *out, const int32_t *tokens, const T *wte, const T *wpe, \
                                            int T_, int C, int V, size_t n) {                      \
        for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;                      \
             i += (size_t)gridDim.x * blockDim.x) {                                                \
            size_t row = i / C;                                                                    \
            int c = (int)(i % C);                                                                  \
            int tok = tokens[row];                                                                 \
            if (tok < 0 || tok >= V) {                                                             \
                nb_st(out + i, __int_as_float(0x7fc00000));                                        \
                continue;                                                                          \
            }                                                                                      \
            float v = nb_ld(wte + (size_t)tok * C + c);                                            \
            if (wpe) v = v + nb_ld(wpe + (row % T_) * C + c);                                      \
            nb_st(out + i, v);                                                                     \
        }                                                                                          \
    }                                                                                              \
    static __global__ void embed_dwte_kernel(float *dwte, const T *dout, const int32_t *tokens, int N, \
                                             int C, int V) {                                       \
        __shared__ int32_t tok[TOKEN_CHUNK];                                                       \
        int v0 = blockIdx.x * VOCAB_ROWS, v1 = min(V, v0 + VOCAB_ROWS);                            \
        for (int n0 = 0; n0 < N; n0 += TOKEN_CHUNK) {                                              \
            int cnt = min(TOKEN_CHUNK, N - n0);                                                    \
            __syncthreads();                                                                       \
            for (int j = threadIdx.x; j < cnt; j += blockDim.x) tok[j] = tokens[n0 + j];           \
            __syncthreads();                                                                       \
            for (int j = 0; j < cnt; j++) {                                                        \
                int tk = tok[j];                                                                   \
                if (tk < v0 || tk >= v1) continue;                                                 \
                float *d = dwte + (size_t)tk * C;                                                  \
                const T *g = dout + (size_t)(n0 + j) * C;                                          \
                for (int c = threadIdx.x; c < C; c += blockDim.x) d[c] += nb_ld(g + c);            \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
    /* dwpe[t] += dout[b, t] for b = 0, 1, ... in order: one thread per (t, c). */                 \
    static __global__ void embed_dwpe_kernel(float *dwpe, const T *dout, int B, int T_, int C) {   \
        size_t n = (size_t)T_ * C;                                                                 \
        for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;                      \
             i += (size_t)gridDim.x * blockDim.x) {                                                \
            float acc = dwpe[i];                                                                   \
            for (int b = 0; b < B; b++) acc += nb_ld(dout + (size_t)b * n + i);                    \
            dwpe[i] = acc;                                                                         \
        }                                                                                          \
    }
NB_FOR_EACH_DTYPE(DEF_EMBED_KERNELS)

#define DEF_EMBED_LAUNCHERS(SFX, T, KT)                                                            \
    extern "C" void nb_cuda_embed_forward_##SFX(T *out, const int32_t *tokens, const T *wte, const T *wpe, \
                                                 int B, int T_, int C, int V, nb_stream_t stream) { \
        NB_CUDA_SHAPE(out && tokens && wte && B >= 0 && T_ >= 0 && C > 0 && V > 0,                 \
                      "nb_cuda_embed_forward_" #SFX);                                              \
        size_t n = (size_t)B * T_ * C;                                                             \
        if (n == 0) return;                                                                        \
        embed_fwd_kernel<<<nb_grid_1d(n, THREADS), THREADS, 0, stream>>>(                          \
            (KT *)out, tokens, (const KT *)wte, (const KT *)wpe, T_, C, V, n);                     \
        CUDA_CHECK_LAUNCH("embedding forward");                                                    \
    }                                                                                              \
    extern "C" void nb_cuda_embed_backward_##SFX(float *dwte, float *dwpe, const T *dout,          \
                                                  const int32_t *tokens, int B, int T_, int C, int V, \
                                                  nb_stream_t stream) {                            \
        NB_CUDA_SHAPE(dout && (!dwte || tokens) && B >= 0 && T_ >= 0 && C > 0 && V > 0,            \
                      "nb_cuda_embed_backward_" #SFX);                                             \
        if (B == 0 || T_ == 0) return;                                                             \
        if (dwte) {                                                                                \
            embed_dwte_kernel<<<(V + VOCAB_ROWS - 1) / VOCAB_ROWS, THREADS, 0, stream>>>(          \
                dwte, (const KT *)dout, tokens, B * T_, C, V);                                     \
            CUDA_CHECK_LAUNCH("embedding backward (dwte)");                                        \
        }                                                                                          \
        if (dwpe) {                                                                                \
            embed_dwpe_kernel<<<nb_grid_1d((size_t)T_ * C, THREADS), THREADS, 0, stream>>>(        \
                dwpe, (const KT *)dout, B, T_, C);                                                 \
            CUDA_CHECK_LAUNCH("embedding backward (dwpe)");                                        \
        }                                                                                          \
    }
DEF_EMBED_LAUNCHERS(f32, float, float)
DEF_EMBED_LAUNCHERS(bf16, nb_bf16, nb_bf16_t)
