/* The one-output linear of seqctr's logit heads on CUDA (linear1.c's): z[i] = w . x[i] + b, one
 * warp per row with a fixed butterfly; the backward's dw is column sums over fixed row blocks
 * finished by nb_col_finish, db one block summing contiguous runs in a fixed tree. */
#include "ctr_cuda.cuh"

/* z[i] = w . x[i] + b: one warp per row, lanes over columns, a fixed butterfly at the end. */
template <typename T>
static __global__ void linear1_fwd_kernel(float *z, const T *x, const T *w, const T *b, int N, int D, int vec) {
    int i = blockIdx.x * CTR_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (i >= N) return;
    const T *xi = x + (size_t)i * D;
    float s = 0.0f;
    if (vec) {
        for (int k = 4 * lane; k < D; k += 128) {
            float4 a = ld4(xi + k), c = ld4(w + k);
            s += a.x * c.x;
            s += a.y * c.y;
            s += a.z * c.z;
            s += a.w * c.w;
        }
    } else {
        for (int k = lane; k < D; k += 32) s += nb_ld(xi + k) * nb_ld(w + k);
    }
    s = nb_warp_sum(s);
    if (lane == 0) z[i] = s + (b ? nb_ld(b) : 0.0f);
}

/* The backward in one pass over x: dx += dz[r] w, and dw's partial sums of dz[r] x[r]. */
template <typename T>
static __global__ void linear1_bwd_kernel(T *dx, float *part, const float *dz, const T *x, const T *w, int N, int D) {
    int c = blockIdx.x * 32 + threadIdx.x;
    int r1 = min(N, (int)(blockIdx.y + 1) * NB_COL_ROWS);
    float acc = 0.0f;
    if (c < D) {
        float wc = nb_ld(w + c);
        for (int r = blockIdx.y * NB_COL_ROWS + threadIdx.y; r < r1; r += 8) {
            size_t i = (size_t)r * D + c;
            float g = dz[r];
            if (dx) nb_st(dx + i, nb_ld(dx + i) + g * wc);
            if (part) acc += g * nb_ld(x + i);
        }
    }
    if (part) col_part_store(part, acc, c, D);
}

/* db[0] += sum of dz: one block, contiguous runs per thread, then a fixed tree. */
static __global__ void sum_into_kernel(float *db, const float *dz, int N) {
    __shared__ float red[32];
    int per = (N + blockDim.x - 1) / blockDim.x, i0 = threadIdx.x * per, i1 = min(N, i0 + per);
    float s = 0.0f;
    for (int i = i0; i < i1; i++) s += dz[i];
    s = nb_block_sum(s, red);
    if (threadIdx.x == 0) db[0] += s;
}

template <typename T>
static void linear1_forward(float *z, const T *x, const T *w, const T *b, int N, int D, cudaStream_t stream,
                            const char *name) {
    NB_CUDA_SHAPE(N >= 0 && D > 0 && (N == 0 || (z && x && w)), name);
    if (N == 0) return;
    int vec = D % 4 == 0 && al4(x, sizeof(T)) && al4(w, sizeof(T));
    linear1_fwd_kernel<<<(N + CTR_WARPS - 1) / CTR_WARPS, CTR_THREADS, 0, stream>>>(z, x, w, b, N, D, vec);
    CUDA_CHECK_LAUNCH("linear1 forward");
}

template <typename T>
static void linear1_backward(T *dx, float *dw, float *db, const float *dz, const T *x, const T *w, int N, int D,
                             cudaStream_t stream, const char *name) {
    NB_CUDA_SHAPE(N >= 0 && D > 0 && (N == 0 || (dz && (!dx || w) && (!dw || x))), name);
    if (N == 0) return;
    if (dx || dw) {
        int nparts = nb_col_parts(N);
        NB_CUDA_SHAPE(nparts <= 65535, name);
        float *part = dw ? (float *)nb_cuda_scratch((size_t)nparts * D * sizeof(float), stream) : NULL;
        dim3 grid((D + 31) / 32, nparts);
        linear1_bwd_kernel<<<grid, dim3(32, 8), 0, stream>>>(dx, part, dz, x, w, N, D);
        CUDA_CHECK_LAUNCH("linear1 backward (dx, dw partials)");
        if (dw) nb_col_finish(dw, part, nparts, D, stream);
        nb_cuda_scratch_free(part, stream);
    }
    if (db) {
        sum_into_kernel<<<1, CTR_THREADS, 0, stream>>>(db, dz, N);
        CUDA_CHECK_LAUNCH("linear1 backward (db)");
    }
}

extern "C" void nb_cuda_linear1_forward_f32(float *z, const float *x, const float *w, const float *b, int N, int D,
                                            nb_stream_t stream) {
    linear1_forward(z, x, w, b, N, D, stream, __func__);
}
extern "C" void nb_cuda_linear1_forward_bf16(float *z, const nb_bf16 *x, const nb_bf16 *w, const nb_bf16 *b, int N,
                                             int D, nb_stream_t stream) {
    linear1_forward(z, nb_kt(x), nb_kt(w), nb_kt(b), N, D, stream, __func__);
}
extern "C" void nb_cuda_linear1_backward_f32(float *dx, float *dw, float *db, const float *dz, const float *x,
                                             const float *w, int N, int D, nb_stream_t stream) {
    linear1_backward(dx, dw, db, dz, x, w, N, D, stream, __func__);
}
extern "C" void nb_cuda_linear1_backward_bf16(nb_bf16 *dx, float *dw, float *db, const float *dz, const nb_bf16 *x,
                                              const nb_bf16 *w, int N, int D, nb_stream_t stream) {
    linear1_backward(nb_kt(dx), dw, db, dz, nb_kt(x), nb_kt(w), N, D, stream, __func__);
}
