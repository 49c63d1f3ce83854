/* The low-rank DCNv2 cross layer on CUDA (cross.c's): c = x0 * (vx @ Uw^T + b) + x, vx = x @ Vw.
 * The products are cuBLASLt GEMMs (row-major through rm_gemm); the elementwise combine and the
 * backward's elementwise pass are ours, the bias gradient a column sum over fixed row blocks.
 * u = vx @ Uw^T + b is kept where the caller gives it a buffer; otherwise the backward makes it
 * again with the forward's GEMM (the same shapes, alignments and algorithm: the same bits). */
#include "ctr_cuda.cuh"

/* c = x0 * u + x, with u in c's buffer (nb_cross_forward's order of operations) */
static __device__ __forceinline__ float cross_f(float u, float x0, float x) { return x0 * u + x; }

/* out[i] = cross_f(a[i], b[i], c[i]), four elements per thread (out may alias a) */
template <typename T>
static __global__ void cross_combine_kernel(T *out, const T *a, const T *b, const T *c, size_t n, int vec) {
    NB_GRID_STRIDE(g, (n + 3) / 4) {
        size_t i = 4 * g;
        if (vec && i + 4 <= n) {
            float4 x = ld4(a + i), y = ld4(b + i), z = ld4(c + i);
            st4(out + i, make_float4(cross_f(x.x, y.x, z.x), cross_f(x.y, y.y, z.y), cross_f(x.z, y.z, z.z),
                                     cross_f(x.w, y.w, z.w)));
        } else {
            for (size_t k = i; k < n && k < i + 4; k++)
                nb_st(out + k, cross_f(nb_ld(a + k), nb_ld(b + k), nb_ld(c + k)));
        }
    }
}

/* One pass of the backward over [N, D]: dx0 += dc * u, buf = du = dc * x0 (when want_du; u may be
 * buf itself: each element is read before it is written, by the same thread), and db's partial
 * sums of du (when part). (dx = dc + dvx Vw^T is one GEMM that reads dc as its C.) */
template <typename T>
static __global__ void cross_bwd_elem_kernel(T *dx0, T *buf, float *part, const T *dc, const T *x0, const T *u, int N,
                                             int D, int want_du) {
    int c = blockIdx.x * 32 + threadIdx.x;
    int r1 = min(N, (int)(blockIdx.y + 1) * NB_COL_ROWS);
    float acc = 0.0f;
    if (c < D)
        for (int r = blockIdx.y * NB_COL_ROWS + threadIdx.y; r < r1; r += 8) {
            size_t i = (size_t)r * D + c;
            float g = nb_ld(dc + i);
            if (dx0) nb_st(dx0 + i, nb_ld(dx0 + i) + g * nb_ld(u + i));
            if (want_du || part) {
                float du = g * nb_ld(x0 + i);
                if (want_du) nb_st(buf + i, du);
                acc += du;
            }
        }
    if (part) col_part_store(part, acc, c, D);
}

/* The same pass for bf16 rows of 16-byte vectors (D % 8 == 0, every tensor 16-byte aligned): a
 * thread takes 8 adjacent columns, so a warp moves 512 contiguous bytes of each tensor per row where
 * the one-column kernel moved 64 (it ran at under half the memory bandwidth: 0.76 ms of DLRM's
 * step at B 6,912). Each element's arithmetic is the one-column kernel's expression, and each
 * column's partial sum takes the same rows in the same order (row lane y: r0 + y, r0 + y + 8, ...;
 * lanes added 0..7): the same bits. */
static __device__ __forceinline__ void ld8(const nb_bf16_t *p, size_t i, float *v) {
    nb_bf16x8_unpack(*(const uint4 *)(p + i), v);
}
static __device__ __forceinline__ void st8(nb_bf16_t *p, size_t i, const float *v) { *(uint4 *)(p + i) = nb_bf16x8_pack(v); }

static __global__ void cross_bwd_elem_v8_kernel(nb_bf16_t *dx0, nb_bf16_t *buf, float *part, const nb_bf16_t *dc,
                                                const nb_bf16_t *x0, const nb_bf16_t *u, int N, int D, int want_du) {
    __shared__ float sh[8][8][33]; /* [row lane][element][column vector]: no bank conflicts */
    const int v = blockIdx.x * 32 + threadIdx.x, nv = D / 8;
    const int r1 = min(N, (int)(blockIdx.y + 1) * NB_COL_ROWS);
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (v < nv)
        for (int r = blockIdx.y * NB_COL_ROWS + threadIdx.y; r < r1; r += 8) {
            const size_t i = (size_t)r * D + (size_t)v * 8;
            float g[8], t[8], b[8];
            ld8(dc, i, g);
            if (dx0) {
                ld8(dx0, i, t);
                ld8(u, i, b);
#pragma unroll
                for (int e = 0; e < 8; e++) t[e] = t[e] + g[e] * b[e];
                st8(dx0, i, t);
            }
            if (want_du || part) {
                ld8(x0, i, t);
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    t[e] = g[e] * t[e];
                    acc[e] += t[e];
                }
                if (want_du) st8(buf, i, t);
            }
        }
    if (!part) return; /* uniform over the block */
#pragma unroll
    for (int e = 0; e < 8; e++) sh[threadIdx.y][e][threadIdx.x] = acc[e];
    __syncthreads();
    const int e = threadIdx.y; /* thread (x, y) finishes element y of vector x */
    if (v < nv) {
        float s = 0.0f;
        for (int l = 0; l < 8; l++) s += sh[l][e][threadIdx.x];
        part[(size_t)blockIdx.y * D + (size_t)v * 8 + e] = s;
    }
}

/* Whether a pointer may take the 16-byte vector loads (NULL: it is not accessed). */
static int al16(const void *p) { return p == NULL || (uintptr_t)p % 16 == 0; }

static void cross_bwd_elem(float *dx0, float *buf, float *part, const float *dc, const float *x0, const float *u,
                           int N, int D, int want_du, cudaStream_t stream) {
    dim3 grid((D + 31) / 32, nb_col_parts(N));
    cross_bwd_elem_kernel<<<grid, dim3(32, 8), 0, stream>>>(dx0, buf, part, dc, x0, u, N, D, want_du);
}
static void cross_bwd_elem(nb_bf16_t *dx0, nb_bf16_t *buf, float *part, const nb_bf16_t *dc, const nb_bf16_t *x0,
                           const nb_bf16_t *u, int N, int D, int want_du, cudaStream_t stream) {
    if (D % 8 == 0 && al16(dx0) && al16(buf) && al16(dc) && al16(x0) && al16(u)) {
        dim3 grid((D / 8 + 31) / 32, nb_col_parts(N));
        cross_bwd_elem_v8_kernel<<<grid, dim3(32, 8), 0, stream>>>(dx0, buf, part, dc, x0, u, N, D, want_du);
    } else {
        dim3 grid((D + 31) / 32, nb_col_parts(N));
        cross_bwd_elem_kernel<<<grid, dim3(32, 8), 0, stream>>>(dx0, buf, part, dc, x0, u, N, D, want_du);
    }
}

/* Row-major C[M, N] = op(A)[M, K] @ op(B)[K, N] + beta Cin (+ bias[N] on every row); Cin: C's
 * layout, NULL: C itself. Row-major is column-major transposed, so cuBLASLt computes
 * C^T = op(B)^T op(A)^T: B is its first operand. ta: A is stored [K, M]; tb: B is stored [N, K]. */
static void rm_gemm_c(void *C, int ldc, const void *A, int lda, int ta, const void *B, int ldb, int tb, int M, int N,
                      int K, cudaDataType_t tab, cudaDataType_t tc, float beta, const void *Cin, const void *bias,
                      nb_blas_t lt, cudaStream_t stream) {
    nb_lt_gemm g = {};
    g.m = N, g.n = M, g.k = K;
    g.A = B, g.lda = ldb, g.transa = tb;
    g.B = A, g.ldb = lda, g.transb = ta;
    g.D = C, g.ldd = ldc;
    g.tab = tab, g.td = tc;
    g.beta = beta;
    g.epi = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    g.bias = bias;
    g.C = Cin;
    nb_lt_run(&g, lt, stream, 0);
}
static void rm_gemm(void *C, int ldc, const void *A, int lda, int ta, const void *B, int ldb, int tb, int M, int N,
                    int K, cudaDataType_t tab, cudaDataType_t tc, float beta, const void *bias, nb_blas_t lt,
                    cudaStream_t stream) {
    rm_gemm_c(C, ldc, A, lda, ta, B, ldb, tb, M, N, K, tab, tc, beta, NULL, bias, lt, stream);
}

template <typename T>
static void cross_forward(T *c, T *vx, T *u, const T *x0, const T *x, const T *Uw, const T *Vw, const T *b, int N,
                          int D, int r, nb_blas_t lt, cudaStream_t stream, const char *name) {
    const cudaDataType_t CT = nb_cuda_dtype(c);
    NB_CUDA_SHAPE(c && vx && x0 && x && Uw && Vw && N >= 0 && D > 0 && r > 0 && c != x0 && c != x && c != u, name);
    if (N == 0) return;
    T *uu = u ? u : c; /* without a kept u, c holds it until the combine overwrites it in place */
    rm_gemm(vx, r, x, D, 0, Vw, r, 0, N, r, D, CT, CT, 0.0f, NULL, lt, stream); /* vx = x Vw */
    rm_gemm(uu, D, vx, r, 0, Uw, r, 1, N, D, r, CT, CT, 0.0f, b, lt, stream);   /* u = vx Uw^T + b */
    size_t n = (size_t)N * D;
    int vec = al4(c, sizeof(T)) && al4(uu, sizeof(T)) && al4(x0, sizeof(T)) && al4(x, sizeof(T));
    cross_combine_kernel<<<ctr_elem_grid(n), CTR_THREADS, 0, stream>>>(c, (const T *)uu, x0, x, n, vec);
    CUDA_CHECK_LAUNCH("cross forward (x0 * u + x)");
}

template <typename T>
static void cross_backward(T *dx0, T *dx, float *dU, float *dV, float *db, const T *dc, const T *x0, const T *x,
                           const T *Uw, const T *Vw, const T *b, const T *vx, const T *u, int N, int D, int r,
                           nb_blas_t lt, cudaStream_t stream, const char *name) {
    const cudaDataType_t CT = nb_cuda_dtype(dc);
    int want_du = dU || dV || dx;
    NB_CUDA_SHAPE(dc && N >= 0 && D > 0 && r > 0, name);
    NB_CUDA_SHAPE((!dx0 || u || (vx && Uw)) && (!(want_du || db) || x0) && (!dU || vx) && (!(dV || dx) || Uw) &&
                      (!dV || x) && (!dx || Vw) && dx != dc,
                  name);
    if (N == 0 || !(dx0 || dx || want_du || db)) return;
    size_t n = (size_t)N * D;
    int nparts = nb_col_parts(N);
    NB_CUDA_SHAPE(nparts <= 65535, name);
    /* buf: du = dc * x0; without a kept u it holds u = vx Uw^T + b first (read, then overwritten by
     * the same thread) */
    const int make_u = dx0 && !u;
    T *buf = make_u || want_du ? (T *)nb_cuda_scratch(n * sizeof(T), stream) : NULL;
    float *part = db ? (float *)nb_cuda_scratch((size_t)nparts * D * sizeof(float), stream) : NULL;
    if (make_u) rm_gemm(buf, D, vx, r, 0, Uw, r, 1, N, D, r, CT, CT, 0.0f, b, lt, stream);
    cross_bwd_elem(dx0, buf, part, dc, x0, make_u ? (const T *)buf : u, N, D, want_du, stream);
    CUDA_CHECK_LAUNCH("cross backward (elementwise)");
    if (db) nb_col_finish(db, part, nparts, D, stream);
    if (dU) rm_gemm(dU, r, buf, D, 1, vx, r, 0, D, r, N, CT, CUDA_R_32F, 1.0f, NULL, lt, stream); /* du^T vx */
    if (dV || dx) {
        T *dvx = (T *)nb_cuda_scratch((size_t)N * r * sizeof(T), stream);
        rm_gemm(dvx, r, buf, D, 0, Uw, r, 0, N, r, D, CT, CT, 0.0f, NULL, lt, stream);                  /* du Uw */
        if (dV) rm_gemm(dV, r, x, D, 1, dvx, r, 0, D, r, N, CT, CUDA_R_32F, 1.0f, NULL, lt, stream); /* x^T dvx */
        if (dx) rm_gemm_c(dx, D, dvx, r, 0, Vw, r, 1, N, D, r, CT, CT, 1.0f, dc, NULL, lt, stream); /* dc + dvx Vw^T */
        nb_cuda_scratch_free(dvx, stream);
    }
    nb_cuda_scratch_free(part, stream);
    nb_cuda_scratch_free(buf, stream);
}

extern "C" void nb_cuda_cross_forward_f32(float *c, float *vx, float *u, const float *x0, const float *x,
                                          const float *Uw, const float *Vw, const float *b, int N, int D, int r,
                                          nb_blas_t lt, nb_stream_t stream) {
    cross_forward(c, vx, u, x0, x, Uw, Vw, b, N, D, r, lt, stream, __func__);
}
extern "C" void nb_cuda_cross_forward_bf16(nb_bf16 *c, nb_bf16 *vx, nb_bf16 *u, const nb_bf16 *x0, const nb_bf16 *x,
                                           const nb_bf16 *Uw, const nb_bf16 *Vw, const nb_bf16 *b, int N, int D, int r,
                                           nb_blas_t lt, nb_stream_t stream) {
    cross_forward(nb_kt(c), nb_kt(vx), nb_kt(u), nb_kt(x0), nb_kt(x), nb_kt(Uw), nb_kt(Vw), nb_kt(b), N, D, r, lt,
                  stream, __func__);
}
extern "C" void nb_cuda_cross_backward_f32(float *dx0, float *dx, float *dU, float *dV, float *db, const float *dc,
                                           const float *x0, const float *x, const float *Uw, const float *Vw,
                                           const float *b, const float *vx, const float *u, int N, int D, int r,
                                           nb_blas_t lt, nb_stream_t stream) {
    cross_backward(dx0, dx, dU, dV, db, dc, x0, x, Uw, Vw, b, vx, u, N, D, r, lt, stream, __func__);
}
extern "C" void nb_cuda_cross_backward_bf16(nb_bf16 *dx0, nb_bf16 *dx, float *dU, float *dV, float *db,
                                            const nb_bf16 *dc, const nb_bf16 *x0, const nb_bf16 *x, const nb_bf16 *Uw,
                                            const nb_bf16 *Vw, const nb_bf16 *b, const nb_bf16 *vx, const nb_bf16 *u,
                                            int N, int D, int r, nb_blas_t lt, nb_stream_t stream) {
    cross_backward(nb_kt(dx0), nb_kt(dx), dU, dV, db, nb_kt(dc), nb_kt(x0), nb_kt(x), nb_kt(Uw), nb_kt(Vw), nb_kt(b),
                   nb_kt(vx), nb_kt(u), N, D, r, lt, stream, __func__);
}
