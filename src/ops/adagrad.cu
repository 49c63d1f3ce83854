/* Dense Adagrad on CUDA (adagrad.c's formula): one thread per element, every operation an
 * explicitly rounded intrinsic so nvcc cannot fuse a*b+c into an FMA: the CPU's bits. The rate and
 * eps come from device memory (nb_adamw_scalars' neg_step and eps), so a captured step replays
 * with the step's rate; a bf16 copy of the new weights is written in the same pass when asked. */
#include "ctr_cuda.cuh"

static __global__ void adagrad_kernel(float *p, const float *g, float *acc, nb_bf16_t *lowp, size_t n,
                                      const nb_adamw_scalars *k) {
    const float neg_lr = k->neg_step, eps = k->eps;
    NB_GRID_STRIDE(i, n) {
        float gi = g[i];
        float a = __fadd_rn(acc[i], __fmul_rn(gi, gi));
        acc[i] = a;
        float pi = __fadd_rn(p[i], __fdiv_rn(__fmul_rn(neg_lr, gi), __fadd_rn(__fsqrt_rn(a), eps)));
        p[i] = pi;
        if (lowp) lowp[i] = __float2bfloat16_rn(pi);
    }
}

extern "C" void nb_cuda_adagrad_dense(float *p, const float *g, float *acc, nb_bf16 *lowp, size_t n,
                                      const nb_adamw_scalars *k, nb_stream_t stream) {
    NB_CUDA_SHAPE(n == 0 || (p && g && acc && k), __func__);
    if (n == 0) return;
    adagrad_kernel<<<nb_grid_1d(n, CTR_THREADS), CTR_THREADS, 0, (cudaStream_t)stream>>>(p, g, acc, (nb_bf16_t *)lowp, n, k);
    CUDA_CHECK_LAUNCH("adagrad dense");
}
