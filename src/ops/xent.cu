/* Fused unembedding + softmax cross-entropy on CUDA, chunked over rows like xent.c:
 *   logits[rows, V] = inp_chunk @ w[:V]^T      cuBLASLt, fp32 output in both variants, so the
 *                                              loss never sees bf16-rounded logits
 *   one block per row: max, sum of exp (double), loss = max + log(sum) - logit[target], and
 *   dlogits = grad_scale * (softmax - onehot(target)) (over the logits in fp32; into a bf16
 *   buffer in the bf16 variant, since the gradient GEMMs take bf16 operands)
 *   dinp_chunk += dlogits @ w[:V],  dw[:V] += dlogits^T @ inp_chunk   (nb_cuda_matmul_backward)
 * At most chunk_rows x V logits exist at once; rows V..Vp-1 of w and dw are never touched.
 * Block reductions are fixed trees and the chunks run in order: deterministic. */
#include "ops_cuda_common.cuh"

#define ROW_THREADS 512
/* Default chunk: about 64 MB of fp32 logits (330 rows of GPT-2's 50257). */
#define CHUNK_BYTES ((size_t)512 << 20) /* ~2600 rows at V = 50257: wide GEMMs, few launches */

/* A target outside [0, V) gives a NaN loss (the caller sees it) and a zero gradient row. */
#define DEF_XENT_ROW(G)                                                                            \
    static __global__ void __launch_bounds__(ROW_THREADS)                                          \
        xent_row_kernel(G *dlogits, float *losses, const float *logits, const int32_t *targets, int V, \
                        int ld, float grad_scale, int want_grad) {                                 \
        __shared__ float shf[32];                                                                  \
        __shared__ double shd[32];                                                                 \
        const float *x = logits + (size_t)blockIdx.x * ld;                                         \
        G *dx = dlogits + (size_t)blockIdx.x * ld;                                                 \
        int target = targets[blockIdx.x];                                                          \
        int ok = target >= 0 && target < V;                                                        \
        /* read before the barriers: in place, other threads overwrite x once they are passed */   \
        float tlogit = ok ? x[target] : 0.0f;                                                      \
        float mx = -INFINITY;                                                                      \
        for (int j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, x[j]);                    \
        mx = nb_block_max(mx, shf);                                                                \
        double sum = 0.0;                                                                          \
        for (int j = threadIdx.x; j < V; j += blockDim.x) sum += (double)expf(x[j] - mx);          \
        sum = nb_block_sum_d(sum, shd);                                                            \
        if (threadIdx.x == 0)                                                                      \
            losses[blockIdx.x] = ok ? (float)((double)mx + log(sum) - (double)tlogit)              \
                                    : __int_as_float(0x7fc00000);                                  \
        if (!want_grad) return;                                                                    \
        float scale = ok ? (float)((double)grad_scale / sum) : 0.0f;                               \
        for (int j = threadIdx.x; j < V; j += blockDim.x) {                                        \
            float v = expf(x[j] - mx) * scale;                                                     \
            if (ok && j == target) v -= grad_scale;                                                \
            nb_st(dx + j, v);                                                                      \
        }                                                                                          \
        /* alignment columns (see xent_gemm_width) carry no gradient */                            \
        for (int j = V + threadIdx.x; j < ld; j += blockDim.x) nb_st(dx + j, 0.0f);               \
    }
NB_FOR_EACH_DTYPE(DEF_XENT_ROW)

/* GEMM width: V rounded up to a multiple of 64 when w has that many rows. Tensor-core GEMMs
 * need 16-byte aligned leading dimensions; at V = 50257 (odd) cuBLASLt fell back to kernels
 * running at 77 TFLOP/s. The extra columns are computed from w's padding rows, kept out of the
 * softmax, and given zero gradient, so dw's padding rows only ever get += 0. */
static int xent_gemm_width(int V, int w_rows) {
    int aligned = (V + 63) / 64 * 64;
    return w_rows >= aligned ? aligned : V;
}

static int xent_chunk_rows(int chunk_rows, int N, int V) {
    if (chunk_rows <= 0) {
        size_t rows = CHUNK_BYTES / ((size_t)V * sizeof(float));
        chunk_rows = rows < 1 ? 1 : rows > (size_t)N ? N : (int)rows;
    }
    return chunk_rows > N ? N : chunk_rows;
}

/* SAME_BUF: fp32 writes dlogits over its logits; bf16 needs its own buffer. */
#define DEF_XENT_LAUNCHER(SFX, T, KT, CT, SAME_BUF)                                                \
    extern "C" void nb_cuda_xent_padded_##SFX(T *dinp, float *dw, float *losses, const T *inp, const T *w, \
                                              const int32_t *targets, int N, int C, int V, int w_rows, \
                                              float grad_scale, int chunk_rows, nb_stream_t stream) { \
        const char *name = "nb_cuda_xent_forward_backward_" #SFX;                                  \
        NB_CUDA_SHAPE(N >= 0 && C > 0 && V > 0 && w_rows >= V && losses && inp && w && targets, name); \
        if (N == 0) return;                                                                        \
        int Vg = xent_gemm_width(V, w_rows);                                                       \
        int rows_max = xent_chunk_rows(chunk_rows, N, Vg);                                         \
        int want_grad = dinp != NULL || dw != NULL;                                                \
        size_t cells = (size_t)rows_max * Vg;                                                      \
        float *logits = (float *)nb_cuda_scratch(cells * sizeof(float), stream);                   \
        KT *dlogits = SAME_BUF ? (KT *)logits                                                      \
                               : want_grad ? (KT *)nb_cuda_scratch(cells * sizeof(KT), stream) : NULL; \
        for (int r0 = 0; r0 < N; r0 += rows_max) {                                                 \
            int rows = N - r0 < rows_max ? N - r0 : rows_max;                                      \
            const T *x = inp + (size_t)r0 * C;                                                     \
            nb_lt_gemm g = {};                                                                     \
            g.m = Vg, g.n = rows, g.k = C;                                                         \
            g.transa = 1;                                                                          \
            g.A = w, g.lda = C;                                                                    \
            g.B = x, g.ldb = C;                                                                    \
            g.D = logits, g.ldd = Vg;                                                              \
            g.tab = CT, g.td = CUDA_R_32F;                                                         \
            g.epi = CUBLASLT_EPILOGUE_DEFAULT;                                                     \
            nb_lt_run(&g, stream, 0);                                                              \
            xent_row_kernel<<<rows, ROW_THREADS, 0, stream>>>(dlogits ? dlogits : (KT *)logits,    \
                                                             losses + r0, logits, targets + r0, V, \
                                                             Vg, grad_scale, want_grad);           \
            CUDA_CHECK_LAUNCH("cross-entropy softmax rows");                                       \
            if (want_grad)                                                                         \
                nb_cuda_matmul_backward_##SFX(dinp ? dinp + (size_t)r0 * C : NULL, dw, NULL,       \
                                              (const T *)dlogits, x, w, rows, C, Vg, stream);      \
        }                                                                                          \
        if (!SAME_BUF) nb_cuda_scratch_free(dlogits, stream);                                      \
        nb_cuda_scratch_free(logits, stream);                                                      \
    }                                                                                              \
    extern "C" void nb_cuda_xent_forward_backward_##SFX(T *dinp, float *dw, float *losses, const T *inp, \
                                                         const T *w, const int32_t *targets, int N, int C, \
                                                         int V, float grad_scale, int chunk_rows,  \
                                                         nb_stream_t stream) {                     \
        nb_cuda_xent_padded_##SFX(dinp, dw, losses, inp, w, targets, N, C, V, V, grad_scale, chunk_rows, stream); \
    }
DEF_XENT_LAUNCHER(f32, float, float, CUDA_R_32F, 1)
DEF_XENT_LAUNCHER(bf16, nb_bf16, nb_bf16_t, CUDA_R_16BF, 0)

extern "C" void nb_cuda_sum_f64(double *out, const float *x, size_t n, nb_stream_t stream) {
    NB_CUDA_SHAPE(out && (x || n == 0), "nb_cuda_sum_f64");
    nb_cuda_reduce_f64(out, x, n, 0, stream);
}
