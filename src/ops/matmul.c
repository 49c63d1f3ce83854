/* Linear layer (nn.Linear layout: w is [OC, C]) on the CPU: the GEMMs go to OpenBLAS, the bias
 * add and the bias gradient are plain OpenMP loops.
 *
 * <cblas.h> is Debian's alternatives link to OpenBLAS's header (libopenblas-dev), and the
 * Makefile links -lopenblas. OpenBLAS does not split the K dimension of sgemm across threads, so
 * each output element is one dot product in a fixed order: repeatable run to run. */
#include <cblas.h>
#include <string.h>

#include "core.h"
#include "ops/ops.h"

/* Output channels per OpenMP work item in the dbias reduction: 64 floats = 256 bytes, so no two
 * threads write the same cache line, and each channel is summed over rows, in row order, by
 * exactly one thread. The result does not depend on the thread count. */
#define NB_MM_CBLOCK 64

void nb_matmul_forward(float *out, const float *inp, const float *w, const float *bias, int N, int C, int OC) {
    NB_ASSERT(out && inp && w && N >= 0 && C >= 0 && OC >= 0);
    if (N == 0 || OC == 0) return;
    if (C == 0) {
        memset(out, 0, (size_t)N * OC * sizeof(float));
    } else {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, w, C, 0.0f, out, OC);
    }
    if (!bias) return;
    /* Added after the GEMM rather than pre-loaded with beta = 1: out = (inp @ w^T) + bias, the
     * same rounding as cuBLASLt's bias epilogue in the CUDA version. */
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *o = out + (size_t)n * OC;
        for (int j = 0; j < OC; j++) o[j] += bias[j];
    }
}

/* dbias[o] += sum over rows of dout[n, o]. Double accumulator: this is the reference that the
 * CUDA reductions are checked against, so it should be the accurate side. */
static void matmul_dbias(float *dbias, const float *dout, int N, int OC) {
    int nblocks = (OC + NB_MM_CBLOCK - 1) / NB_MM_CBLOCK;
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < nblocks; blk++) {
        int o0 = blk * NB_MM_CBLOCK;
        int o1 = o0 + NB_MM_CBLOCK < OC ? o0 + NB_MM_CBLOCK : OC;
        double acc[NB_MM_CBLOCK] = {0};
        for (int n = 0; n < N; n++) {
            const float *d = dout + (size_t)n * OC;
            for (int o = o0; o < o1; o++) acc[o - o0] += d[o];
        }
        for (int o = o0; o < o1; o++) dbias[o] += (float)acc[o - o0];
    }
}

void nb_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                        const float *w, int N, int C, int OC) {
    NB_ASSERT(dout && N >= 0 && C >= 0 && OC >= 0);
    if (N == 0 || OC == 0) return; /* every gradient term is an empty sum */
    if (C > 0) {
        /* beta = 1 makes OpenBLAS accumulate into the existing gradient, as the contract says. */
        if (dinp) {
            NB_ASSERT(w);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, w, C, 1.0f,
                        dinp, C);
        }
        if (dw) {
            NB_ASSERT(inp);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f,
                        dw, C);
        }
    }
    if (dbias) matmul_dbias(dbias, dout, N, OC);
}
