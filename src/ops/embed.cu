/* Token (+ learned position) embedding on CUDA.
 *
 * The backward is a scatter-add (several rows can carry one token), deterministic without float
 * atomics: every dwte element gets its additions from one thread, in token order, exactly as
 * embed.c adds them (fp32: the same bits). Two ways to get there:
 *   sorted (default): the token ids are radix-sorted with their positions (CUB's sort is stable,
 *     so a token's positions stay ascending); a warp per (run of one token, slice of columns)
 *     then adds the run's dout rows in order into its dwte row. Cost: one sort of N keys and
 *     one read of dout.
 *   scan (shapes the sort does not take: more than 2^26 tokens, or rows of more than 65535
 *     slices): each block owns VOCAB_ROWS vocabulary rows and scans all N token ids for its own,
 *     (V / VOCAB_ROWS) scans in all; 3 ms at gpt2's B = 32 (N = 32768, V = 50304) against
 *     ~0.1 ms sorted (issue 18). */
#include <cub/cub.cuh>

#include "ops_cuda_common.cuh"

#define THREADS 256
#define VOCAB_ROWS 128
#define TOKEN_CHUNK 2048

/* A token outside [0, V) gives a NaN row: the loss shows it, nothing reads out of bounds. */
template <typename T>
static __global__ void embed_fwd_kernel(T *out, const int32_t *tokens, const T *wte, const T *wpe,
                                        int T_, int C, int V, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t row = i / C;
        int c = (int)(i % C);
        int tok = tokens[row];
        if (tok < 0 || tok >= V) {
            nb_st(out + i, __int_as_float(0x7fc00000));
            continue;
        }
        float v = nb_ld(wte + (size_t)tok * C + c);
        if (wpe) v = v + nb_ld(wpe + (row % T_) * C + c);
        nb_st(out + i, v);
    }
}
template <typename T>
static __global__ void embed_dwte_kernel(float *dwte, const T *dout, const int32_t *tokens, int N,
                                         int C, int V) {
    __shared__ int32_t tok[TOKEN_CHUNK];
    int v0 = blockIdx.x * VOCAB_ROWS, v1 = min(V, v0 + VOCAB_ROWS);
    for (int n0 = 0; n0 < N; n0 += TOKEN_CHUNK) {
        int cnt = min(TOKEN_CHUNK, N - n0);
        __syncthreads();
        for (int j = threadIdx.x; j < cnt; j += blockDim.x) tok[j] = tokens[n0 + j];
        __syncthreads();
        for (int j = 0; j < cnt; j++) {
            int tk = tok[j];
            if (tk < v0 || tk >= v1) continue;
            float *d = dwte + (size_t)tk * C;
            const T *g = dout + (size_t)(n0 + j) * C;
            for (int c = threadIdx.x; c < C; c += blockDim.x) d[c] += nb_ld(g + c);
        }
    }
}
/* dwpe[t] += dout[b, t] for b = 0, 1, ... in order: one thread per (t, c). */
template <typename T>
static __global__ void embed_dwpe_kernel(float *dwpe, const T *dout, int B, int T_, int C) {
    size_t n = (size_t)T_ * C;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float acc = dwpe[i];
        for (int b = 0; b < B; b++) acc += nb_ld(dout + (size_t)b * n + i);
        dwpe[i] = acc;
    }
}

/* ---- the sorted backward ---- */

#define RUN_COLS_PER_LANE 4 /* a warp's slice: 128 columns */
#define RUN_ROWS_IN_FLIGHT 8 /* dout rows loaded before they are added (in order): a frequent
                                token's long run is latency-bound, so its loads overlap */

/* key: the token, or V for an id outside [0, V) (no row: such a token adds nothing, as in the
 * scan); pos: its position */
static __global__ void dwte_keys_kernel(uint32_t *key, int32_t *pos, const int32_t *tokens, int N, int V) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < N; i += gridDim.x * blockDim.x) {
        int t = tokens[i];
        key[i] = (t < 0 || t >= V) ? (uint32_t)V : (uint32_t)t;
        pos[i] = i;
    }
}

/* The end of the run of key k that starts at i (sorted keys): 32 keys compared per step. */
static __device__ int run_end(const uint32_t *key, int i, int N, uint32_t k) {
    int lane = threadIdx.x & 31, end = i + 1;
    for (;;) {
        int j = end + lane;
        unsigned same = __ballot_sync(0xffffffffu, j < N && key[j] == k);
        if (same != 0xffffffffu) return end + __ffs(~same) - 1;
        end += 32;
    }
}

/* dout[i] as fp32 (bf: dout holds bf16; uniform over the grid, so the branch costs nothing) */
static __device__ __forceinline__ float dout_at(const void *dout, size_t i, int bf) {
    return bf ? __bfloat162float(((const nb_bf16_t *)dout)[i]) : ((const float *)dout)[i];
}

/* Warp w of the grid's x range takes sorted index w; blockIdx.y is its slice of columns. Only a
 * run's first index does work: it adds the run's rows of dout, in position order, to its slice
 * of dwte[token]. */
static __global__ void dwte_runs_kernel(float *dwte, const void *dout, int bf, const uint32_t *key,
                                        const int32_t *pos, int N, int C, int V) {
    const int i = (int)((blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5), lane = threadIdx.x & 31;
    if (i >= N) return;
    const uint32_t k = key[i];
    if (k >= (uint32_t)V || (i > 0 && key[i - 1] == k)) return; /* uniform over the warp */
    const int end = run_end(key, i, N, k);
    const int c0 = blockIdx.y * 32 * RUN_COLS_PER_LANE + lane;
    float *d = dwte + (size_t)k * C;
    float acc[RUN_COLS_PER_LANE];
#pragma unroll
    for (int u = 0; u < RUN_COLS_PER_LANE; u++) acc[u] = c0 + 32 * u < C ? d[c0 + 32 * u] : 0.0f;
    for (int j0 = i; j0 < end; j0 += RUN_ROWS_IN_FLIGHT) {
        float v[RUN_ROWS_IN_FLIGHT][RUN_COLS_PER_LANE];
#pragma unroll
        for (int r = 0; r < RUN_ROWS_IN_FLIGHT; r++) {
            const size_t row = j0 + r < end ? (size_t)pos[j0 + r] * C : 0;
#pragma unroll
            for (int u = 0; u < RUN_COLS_PER_LANE; u++) {
                const int c = c0 + 32 * u;
                v[r][u] = (j0 + r < end && c < C) ? dout_at(dout, row + c, bf) : 0.0f;
            }
        }
        /* added in position order, one row after another (not a tree): the scan's order */
#pragma unroll
        for (int r = 0; r < RUN_ROWS_IN_FLIGHT; r++)
            if (j0 + r < end)
#pragma unroll
                for (int u = 0; u < RUN_COLS_PER_LANE; u++) acc[u] += v[r][u];
    }
#pragma unroll
    for (int u = 0; u < RUN_COLS_PER_LANE; u++)
        if (c0 + 32 * u < C) d[c0 + 32 * u] = acc[u];
}

/* dwte += the scatter of dout by tokens, sorted (see the top); 0 when it does not apply (the
 * caller scans instead) */
static int dwte_sorted(float *dwte, const void *dout, int bf, const int32_t *tokens, int N, int C, int V,
                       cudaStream_t stream) {
    const int slices = (C + 32 * RUN_COLS_PER_LANE - 1) / (32 * RUN_COLS_PER_LANE);
    if (slices > 65535 || N > (1 << 26)) return 0;
    size_t sort_bytes = 0;
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(NULL, sort_bytes, (const uint32_t *)NULL, (uint32_t *)NULL,
                                               (const int32_t *)NULL, (int32_t *)NULL, N, 0, nb_key_bits(V), stream));
    const size_t ints = ((size_t)N * 4 + 255) & ~(size_t)255;
    char *base = (char *)nb_cuda_scratch(4 * ints + sort_bytes, stream);
    uint32_t *k_in = (uint32_t *)base, *k_out = (uint32_t *)(base + ints);
    int32_t *p_in = (int32_t *)(base + 2 * ints), *p_out = (int32_t *)(base + 3 * ints);
    dwte_keys_kernel<<<nb_grid_1d((size_t)N, THREADS), THREADS, 0, stream>>>(k_in, p_in, tokens, N, V);
    CUDA_CHECK_LAUNCH("embedding backward (sort keys)");
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(base + 4 * ints, sort_bytes, k_in, k_out, p_in, p_out, N, 0,
                                               nb_key_bits(V), stream));
    dim3 grid((unsigned)(((size_t)N * 32 + THREADS - 1) / THREADS), (unsigned)slices);
    dwte_runs_kernel<<<grid, THREADS, 0, stream>>>(dwte, dout, bf, k_out, p_out, N, C, V);
    CUDA_CHECK_LAUNCH("embedding backward (dwte runs)");
    nb_cuda_scratch_free(base, stream);
    return 1;
}

template <typename T>
static void embed_forward(T *out, const int32_t *tokens, const T *wte, const T *wpe, int B, int T_, int C, int V,
                          cudaStream_t stream, const char *name) {
    NB_CUDA_SHAPE(out && tokens && wte && B >= 0 && T_ >= 0 && C > 0 && V > 0, name);
    size_t n = (size_t)B * T_ * C;
    if (n == 0) return;
    embed_fwd_kernel<<<nb_grid_1d(n, THREADS), THREADS, 0, stream>>>(out, tokens, wte, wpe, T_, C, V, n);
    CUDA_CHECK_LAUNCH("embedding forward");
}

template <typename T>
static void embed_backward(float *dwte, float *dwpe, const T *dout, const int32_t *tokens, int B, int T_, int C, int V,
                           cudaStream_t stream, const char *name) {
    NB_CUDA_SHAPE(dout && (!dwte || tokens) && B >= 0 && T_ >= 0 && C > 0 && V > 0, name);
    if (B == 0 || T_ == 0) return;
    if (dwte && !dwte_sorted(dwte, dout, sizeof(T) == 2, tokens, B * T_, C, V, stream)) {
        embed_dwte_kernel<<<(V + VOCAB_ROWS - 1) / VOCAB_ROWS, THREADS, 0, stream>>>(dwte, dout, tokens, B * T_, C, V);
        CUDA_CHECK_LAUNCH("embedding backward (dwte)");
    }
    if (dwpe) {
        embed_dwpe_kernel<<<nb_grid_1d((size_t)T_ * C, THREADS), THREADS, 0, stream>>>(dwpe, dout, B, T_, C);
        CUDA_CHECK_LAUNCH("embedding backward (dwpe)");
    }
}

extern "C" void nb_cuda_embed_forward_f32(float *out, const int32_t *tokens, const float *wte, const float *wpe, int B,
                                          int T, int C, int V, nb_stream_t stream) {
    embed_forward(out, tokens, wte, wpe, B, T, C, V, stream, __func__);
}
extern "C" void nb_cuda_embed_forward_bf16(nb_bf16 *out, const int32_t *tokens, const nb_bf16 *wte, const nb_bf16 *wpe,
                                           int B, int T, int C, int V, nb_stream_t stream) {
    embed_forward(nb_kt(out), tokens, nb_kt(wte), nb_kt(wpe), B, T, C, V, stream, __func__);
}
extern "C" void nb_cuda_embed_backward_f32(float *dwte, float *dwpe, const float *dout, const int32_t *tokens, int B,
                                           int T, int C, int V, nb_stream_t stream) {
    embed_backward(dwte, dwpe, dout, tokens, B, T, C, V, stream, __func__);
}
extern "C" void nb_cuda_embed_backward_bf16(float *dwte, float *dwpe, const nb_bf16 *dout, const int32_t *tokens, int B,
                                            int T, int C, int V, nb_stream_t stream) {
    embed_backward(dwte, dwpe, nb_kt(dout), tokens, B, T, C, V, stream, __func__);
}
