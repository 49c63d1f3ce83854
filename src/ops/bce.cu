/* BCE with logits on CUDA (bce.c's formulas, in double): one block, each thread a contiguous run
 * of indices in order, the runs added in a fixed tree, so the loss has one order whatever the GPU. */
#include "ctr_cuda.cuh"

/* exp of a non-positive argument only: no overflow for any logit. */
static __device__ double bce_sigmoid(double z) {
    if (z >= 0) return 1.0 / (1.0 + exp(-z));
    double e = exp(z);
    return e / (1.0 + e);
}

#define BCE_THREADS 512

/* N is a batch (thousands): one block is plenty and keeps the sum in one place. */
static __global__ void bce_kernel(float *dz, double *loss, const float *z, const float *y, int N, float scale) {
    __shared__ double red[32];
    int per = (N + blockDim.x - 1) / blockDim.x, i0 = threadIdx.x * per, i1 = min(N, i0 + per);
    double s = 0.0;
    for (int i = i0; i < i1; i++) {
        double zi = z[i], yi = y[i];
        s += fmax(zi, 0.0) - zi * yi + log1p(exp(-fabs(zi)));
        if (dz) dz[i] += (float)((double)scale * (bce_sigmoid(zi) - yi));
    }
    s = nb_block_sum_d(s, red);
    if (threadIdx.x == 0 && loss) *loss += (double)scale * s;
}

extern "C" void nb_cuda_bce_logits(float *dz, double *loss, const float *z, const float *y, int N, float scale,
                                   nb_stream_t stream) {
    NB_CUDA_SHAPE(N >= 0 && (N == 0 || (z && y)), "nb_cuda_bce_logits");
    if (N == 0 || (!dz && !loss)) return;
    bce_kernel<<<1, BCE_THREADS, 0, stream>>>(dz, loss, z, y, N, scale);
    CUDA_CHECK_LAUNCH("bce with logits");
}
