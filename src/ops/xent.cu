/* Fused unembedding + softmax cross-entropy on CUDA, chunked over rows like xent.c:
 *   logits[rows, Vg] = inp_chunk @ w[:Vg]^T    cuBLASLt; Vg is V rounded up to 64 when w has
 *                                              the padding rows (aligned, tensor cores)
 *   one block per row, two passes over its logits (llm.c's fused classifier does the same):
 *     1. online softmax (Milakov & Gimelshein 2018): a running max and a sum of exp(x - max),
 *        rescaled when the max grows, so max and sum come from one read; then
 *        loss = max + log(sum) - logit[target]
 *     2. dlogits = grad_scale * (softmax - onehot(target)), written over the logits (the row
 *        was read just before by the same block, so this read is mostly an L2 hit)
 *   dinp_chunk += dlogits @ w[:Vg],  dw[:Vg] += dlogits^T @ inp_chunk   (nb_cuda_matmul_backward)
 * The logits are fp32 in the f32 variant and bf16 in the bf16 variant, as torch autocast and
 * llm.c keep them: half the bytes in the GEMM's output and in both passes,
 * and the gradient GEMMs take bf16 operands anyway. All arithmetic is fp32 (the sum of exp in
 * double, as xent.c); the loss and its gradient are those of the bf16-rounded logits, a
 * rounding-level change of the loss (rel ~1e-3 per row, unbiased). Columns V..Vg-1 come from
 * w's padding rows: left out of the softmax by index (never by arithmetic, so NaN there cannot
 * leak in) and given zero gradient, so dw's padding rows only ever get += 0.
 * At most chunk_rows x Vg logits exist at once. Block reductions are fixed trees, every thread's
 * share of a row is fixed, and the chunks run in order: deterministic. */
#include "ops_cuda_common.cuh"

#define ROW_THREADS 512
/* Logits per chunk: ~512 MB (about 5000 rows of bf16 logits at Vg = 50304), split evenly over
 * the chunks: wide GEMMs, few launches. */
#define CHUNK_BYTES ((size_t)512 << 20)

/* ---- 16-byte vector access (4 fp32 or 8 bf16 logits), converted to / from fp32 at the memory
 * boundary; bf16 -> fp32 is exact (a shift), fp32 -> bf16 rounds to nearest even. Stores are
 * evict-first: the dlogits are read next by the gradient GEMMs, long after this row's
 * neighbours, whose logits should stay in L2 for their second pass. */
#define XENT_VEC(T) ((int)(16 / sizeof(T)))
static __device__ __forceinline__ void xent_ld(const float *p, float *v) {
    float4 a = *(const float4 *)p;
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
}
static __device__ __forceinline__ void xent_st(float *p, const float *v) {
    __stcs((float4 *)p, make_float4(v[0], v[1], v[2], v[3]));
}
static __device__ __forceinline__ void xent_ld(const nb_bf16_t *p, float *v) { nb_bf16x8_unpack(*(const uint4 *)p, v); }
static __device__ __forceinline__ void xent_st(nb_bf16_t *p, const float *v) { __stcs((uint4 *)p, nb_bf16x8_pack(v)); }

/* Online softmax update of a thread's (m, s) by a vector v of VEC columns, all below V: the max
 * moves first and s is rescaled to it unconditionally (by exp(0) = 1 when it stays: exact, and
 * no branch between the loads of a batch); the VEC terms (each <= 1) are summed in fp32, then
 * added to s in double. */
template <int VEC> static __device__ __forceinline__ void xent_online(const float *v, float &m, double &s) {
    float lm = v[0];
#pragma unroll
    for (int e = 1; e < VEC; e++) lm = fmaxf(lm, v[e]);
    const float nm = fmaxf(m, lm);
    s *= (double)expf(m - nm);
    m = nm;
    float t = 0.0f;
#pragma unroll
    for (int e = 0; e < VEC; e++) t += expf(v[e] - m);
    s += (double)t;
}
/* v (columns j0.., all below V) -> grad_scale * (softmax - onehot(target)) */
template <int VEC>
static __device__ __forceinline__ void xent_grad(float *v, int j0, float mx, float scale, int tj, float grad_scale) {
#pragma unroll
    for (int e = 0; e < VEC; e++) {
        const float d = expf(v[e] - mx) * scale;
        v[e] = j0 + e == tj ? d - grad_scale : d;
    }
}

/* The last vectors of a row, which reach into the padding columns (j0 + e >= V): left out by
 * index. Online softmax update of (m, s), and the gradient written over v. */
template <int VEC>
static __device__ __forceinline__ void xent_online_masked(const float *v, int j0, int V, float &m, double &s) {
    float lm = m;
#pragma unroll
    for (int e = 0; e < VEC; e++)
        if (j0 + e < V) lm = fmaxf(lm, v[e]);
    if (lm > m) {
        s *= (double)expf(m - lm);
        m = lm;
    }
    float t = 0.0f;
#pragma unroll
    for (int e = 0; e < VEC; e++)
        if (j0 + e < V) t += expf(v[e] - m);
    s += (double)t;
}
template <int VEC>
static __device__ __forceinline__ void xent_grad_masked(float *v, int j0, int V, float mx, float scale, int tj,
                                                        float grad_scale) {
#pragma unroll
    for (int e = 0; e < VEC; e++) {
        const float d = j0 + e < V ? expf(v[e] - mx) * scale : 0.0f;
        v[e] = j0 + e == tj ? d - grad_scale : d;
    }
}

/* Row kernel: T = the logits' type, whose buffer the gradient overwrites; VEC = T elements per
 * 16 bytes. vec: rows are 16-byte aligned (ld % VEC == 0, aligned bases), else every access is
 * scalar. A target outside [0, V) gives a NaN loss and a zero gradient row, except NB_XENT_IGNORE
 * (a masked row): loss 0 and a zero gradient row. The gradient scale is grad_scale, times
 * *scale_by when given (one rounding, never contracted into the uses below). */
template <typename T>
static __global__ void __launch_bounds__(ROW_THREADS)
    xent_row_kernel(T *dlogits, float *losses, const T *logits, const int32_t *targets, int V, int ld,
                    float grad_scale_arg, const float *scale_by, int want_grad, int vec) {
    const float grad_scale = scale_by ? __fmul_rn(grad_scale_arg, *scale_by) : grad_scale_arg;
    constexpr int VEC = XENT_VEC(T);
    __shared__ float shf[32];
    __shared__ double shd[32];
    /* last rows first: the GEMM wrote them last, so they are the likeliest to be in L2 */
    const int row = gridDim.x - 1 - blockIdx.x;
    const T *x = logits + (size_t)row * ld;
    T *dx = dlogits + (size_t)row * ld;
    const int target = targets[row];
    const int ok = target >= 0 && target < V;
    /* read before the barriers: in place, other threads overwrite x once they are past them */
    const float tlogit = ok ? nb_ld(x + target) : 0.0f;
    /* vectors [0, nfull) lie below V: no masks, no branches, so the loads of several
     * iterations go out together; [nfull, nvec) reach into the padding columns; the scalar
     * loops take what no vector covers (everything when !vec) */
    const int nvec = vec ? ld / VEC : 0, nfull = vec ? V / VEC : 0;
    /* pass 1: this thread's running max m and sum s of exp(x - m) (s in double) */
    float m = -INFINITY;
    double s = 0.0;
    const int bd = blockDim.x;
    int i = threadIdx.x;
    for (; i + 3 * bd < nfull; i += 4 * bd) { /* four loads in flight, then the math */
        float v0[VEC], v1[VEC], v2[VEC], v3[VEC];
        xent_ld(x + (size_t)i * VEC, v0), xent_ld(x + (size_t)(i + bd) * VEC, v1);
        xent_ld(x + (size_t)(i + 2 * bd) * VEC, v2);
        xent_ld(x + (size_t)(i + 3 * bd) * VEC, v3);
        xent_online<VEC>(v0, m, s), xent_online<VEC>(v1, m, s);
        xent_online<VEC>(v2, m, s), xent_online<VEC>(v3, m, s);
    }
    for (; i < nfull; i += bd) {
        float v0[VEC];
        xent_ld(x + (size_t)i * VEC, v0);
        xent_online<VEC>(v0, m, s);
    }
    for (i = nfull + threadIdx.x; i < nvec; i += bd) { /* masked: the last vectors */
        float v[VEC];
        xent_ld(x + (size_t)i * VEC, v);
        xent_online_masked<VEC>(v, i * VEC, V, m, s);
    }
    for (int j = nvec * VEC + threadIdx.x; j < V; j += blockDim.x) {
        float xj = nb_ld(x + j);
        if (xj > m) {
            s *= (double)expf(m - xj);
            m = xj;
        }
        s += (double)expf(xj - m);
    }
    const float mx = nb_block_max(m, shf);
    /* a thread that saw no column has m = -inf, s = 0: it adds 0 (mx is finite) */
    const double sum = nb_block_sum_d(s * (double)expf(m - mx), shd);
    if (threadIdx.x == 0)
        losses[row] = ok                          ? (float)((double)mx + log(sum) - (double)tlogit)
                      : target == NB_XENT_IGNORE ? 0.0f
                                                 : __int_as_float(0x7fc00000);
    if (!want_grad) return;
    /* pass 2: the gradient, over every column of the row (zero past V) */
    const float scale = ok ? (float)((double)grad_scale / sum) : 0.0f;
    const int tj = ok ? target : -1;
    for (i = threadIdx.x; i + bd < nfull; i += 2 * bd) { /* two loads in flight */
        float v0[VEC], v1[VEC];
        xent_ld(x + (size_t)i * VEC, v0), xent_ld(x + (size_t)(i + bd) * VEC, v1);
        xent_grad<VEC>(v0, i * VEC, mx, scale, tj, grad_scale);
        xent_grad<VEC>(v1, (i + bd) * VEC, mx, scale, tj, grad_scale);
        xent_st(dx + (size_t)i * VEC, v0), xent_st(dx + (size_t)(i + bd) * VEC, v1);
    }
    for (; i < nfull; i += bd) {
        float v0[VEC];
        xent_ld(x + (size_t)i * VEC, v0);
        xent_grad<VEC>(v0, i * VEC, mx, scale, tj, grad_scale);
        xent_st(dx + (size_t)i * VEC, v0);
    }
    for (i = nfull + threadIdx.x; i < nvec; i += bd) { /* masked: the last vectors */
        float v[VEC];
        xent_ld(x + (size_t)i * VEC, v);
        xent_grad_masked<VEC>(v, i * VEC, V, mx, scale, tj, grad_scale);
        xent_st(dx + (size_t)i * VEC, v);
    }
    for (int j = nvec * VEC + threadIdx.x; j < ld; j += blockDim.x) {
        const float d = j < V ? expf(nb_ld(x + j) - mx) * scale : 0.0f;
        nb_st(dx + j, j == tj ? d - grad_scale : d);
    }
}

/* GEMM width: V rounded up to a multiple of 64 when w has that many rows. Tensor-core GEMMs
 * need 16-byte aligned leading dimensions; at V = 50257 (odd) cuBLASLt fell back to kernels
 * running at 77 TFLOP/s. The extra columns are computed from w's padding rows, kept out of the
 * softmax, and given zero gradient, so dw's padding rows only ever get += 0. */
static int xent_gemm_width(int V, int w_rows) {
    int aligned = (V + 63) / 64 * 64;
    return w_rows >= aligned ? aligned : V;
}

/* Rows per chunk: chunk_rows if given, else CHUNK_BYTES of logits, spread evenly over the
 * chunks (no thin last GEMM). A function of the shapes only: the same chunks on every run. */
static int xent_chunk_rows(int chunk_rows, int N, int Vg, size_t elem) {
    if (chunk_rows > 0) return chunk_rows > N ? N : chunk_rows;
    size_t rows = CHUNK_BYTES / ((size_t)Vg * elem);
    if (rows < 1) rows = 1;
    if (rows >= (size_t)N) return N;
    size_t nchunks = ((size_t)N + rows - 1) / rows;
    return (int)(((size_t)N + nchunks - 1) / nchunks);
}

static int aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

static void matmul_backward(float *dinp, float *dw, const float *dout, const float *inp, const float *w, int N, int C,
                            int OC, nb_blas_t lt, cudaStream_t stream) {
    nb_cuda_matmul_backward_f32(dinp, dw, NULL, dout, inp, w, N, C, OC, lt, stream);
}
static void matmul_backward(nb_bf16_t *dinp, float *dw, const nb_bf16_t *dout, const nb_bf16_t *inp,
                            const nb_bf16_t *w, int N, int C, int OC, nb_blas_t lt, cudaStream_t stream) {
    nb_cuda_matmul_backward_bf16((nb_bf16 *)dinp, dw, NULL, (const nb_bf16 *)dout, (const nb_bf16 *)inp,
                                 (const nb_bf16 *)w, N, C, OC, lt, stream);
}

/* T: the operands' and the logits' type (the gradient overwrites the logits). */
template <typename T>
static void xent_padded(T *dinp, float *dw, float *losses, const T *inp, const T *w, const int32_t *targets, int N,
                        int C, int V, int w_rows, float grad_scale, const float *scale_by, int chunk_rows, nb_blas_t lt,
                        cudaStream_t stream, const char *name) {
    NB_CUDA_SHAPE(N >= 0 && C > 0 && V > 0 && w_rows >= V && losses && inp && w && targets, name);
    if (N == 0) return;
    const int VEC = XENT_VEC(T);
    int Vg = xent_gemm_width(V, w_rows);
    int rows_max = xent_chunk_rows(chunk_rows, N, Vg, sizeof(T));
    int want_grad = dinp != NULL || dw != NULL;
    size_t cells = (size_t)rows_max * Vg;
    T *logits = (T *)nb_cuda_scratch(cells * sizeof(T), stream);
    /* rows start 16-byte aligned when Vg is a multiple of VEC (scratch is 256-byte aligned) */
    int vec = Vg % VEC == 0 && aligned16(logits);
    for (int r0 = 0; r0 < N; r0 += rows_max) {
        int rows = N - r0 < rows_max ? N - r0 : rows_max;
        const T *x = inp + (size_t)r0 * C;
        nb_lt_gemm g = {};
        g.m = Vg, g.n = rows, g.k = C;
        g.transa = 1;
        g.A = w, g.lda = C;
        g.B = x, g.ldb = C;
        g.D = logits, g.ldd = Vg;
        g.tab = nb_cuda_dtype(x), g.td = nb_cuda_dtype(x);
        g.epi = CUBLASLT_EPILOGUE_DEFAULT;
        nb_lt_run(&g, lt, stream, 0);
        xent_row_kernel<<<rows, ROW_THREADS, 0, stream>>>(logits, losses + r0, logits, targets + r0, V, Vg, grad_scale,
                                                         scale_by, want_grad, vec);
        CUDA_CHECK_LAUNCH("cross-entropy softmax rows");
        if (want_grad)
            matmul_backward(dinp ? dinp + (size_t)r0 * C : NULL, dw, logits, x, w, rows, C, Vg, lt, stream);
    }
    nb_cuda_scratch_free(logits, stream);
}

extern "C" void nb_cuda_xent_padded_f32(float *dinp, float *dw, float *losses, const float *inp, const float *w,
                                        const int32_t *targets, int N, int C, int V, int w_rows, float grad_scale,
                                        int chunk_rows, nb_blas_t lt, nb_stream_t stream) {
    xent_padded(dinp, dw, losses, inp, w, targets, N, C, V, w_rows, grad_scale, (const float *)NULL, chunk_rows, lt,
                stream, "nb_cuda_xent_forward_backward_f32");
}
extern "C" void nb_cuda_xent_padded_bf16(nb_bf16 *dinp, float *dw, float *losses, const nb_bf16 *inp, const nb_bf16 *w,
                                         const int32_t *targets, int N, int C, int V, int w_rows, float grad_scale,
                                         int chunk_rows, nb_blas_t lt, nb_stream_t stream) {
    xent_padded(nb_kt(dinp), dw, losses, nb_kt(inp), nb_kt(w), targets, N, C, V, w_rows, grad_scale, (const float *)NULL,
                chunk_rows, lt, stream, "nb_cuda_xent_forward_backward_bf16");
}
extern "C" void nb_cuda_xent_scaled_f32(float *dinp, float *dw, float *losses, const float *inp, const float *w,
                                        const int32_t *targets, int N, int C, int V, int w_rows, float grad_scale,
                                        const float *scale_by, int chunk_rows, nb_blas_t lt, nb_stream_t stream) {
    xent_padded(dinp, dw, losses, inp, w, targets, N, C, V, w_rows, grad_scale, scale_by, chunk_rows, lt, stream,
                "nb_cuda_xent_scaled_f32");
}
extern "C" void nb_cuda_xent_scaled_bf16(nb_bf16 *dinp, float *dw, float *losses, const nb_bf16 *inp, const nb_bf16 *w,
                                         const int32_t *targets, int N, int C, int V, int w_rows, float grad_scale,
                                         const float *scale_by, int chunk_rows, nb_blas_t lt, nb_stream_t stream) {
    xent_padded(nb_kt(dinp), dw, losses, nb_kt(inp), nb_kt(w), targets, N, C, V, w_rows, grad_scale, scale_by, chunk_rows,
                lt, stream, "nb_cuda_xent_scaled_bf16");
}
extern "C" void nb_cuda_xent_forward_backward_f32(float *dinp, float *dw, float *losses, const float *inp,
                                                  const float *w, const int32_t *targets, int N, int C, int V,
                                                  float grad_scale, int chunk_rows, nb_blas_t lt, nb_stream_t stream) {
    nb_cuda_xent_padded_f32(dinp, dw, losses, inp, w, targets, N, C, V, V, grad_scale, chunk_rows, lt, stream);
}
extern "C" void nb_cuda_xent_forward_backward_bf16(nb_bf16 *dinp, float *dw, float *losses, const nb_bf16 *inp,
                                                   const nb_bf16 *w, const int32_t *targets, int N, int C, int V,
                                                   float grad_scale, int chunk_rows, nb_blas_t lt,
                                                   nb_stream_t stream) {
    nb_cuda_xent_padded_bf16(dinp, dw, losses, inp, w, targets, N, C, V, V, grad_scale, chunk_rows, lt, stream);
}

extern "C" void nb_cuda_sum_f64(double *out, const float *x, size_t n, nb_stream_t stream) {
    NB_CUDA_SHAPE(out && (x || n == 0), "nb_cuda_sum_f64");
    nb_cuda_reduce_f64(out, x, n, 0, stream);
}
