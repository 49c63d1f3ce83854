/* Dense Adagrad (ops_ctr.h; its CUDA side is adagrad.cu): torch.optim.Adagrad with lr_decay 0,
 * initial accumulator 0 and no weight decay, as MLPerf's DLRM-DCNv2 reference configures it. Each
 * element is independent, so the thread count cannot change a bit; the CUDA kernel rounds every
 * operation the same way (no contraction into an FMA), so both give the same bits. */
#include <math.h>

#include "ops/ops_ctr.h"

void nb_adagrad_dense(float *p, const float *g, float *acc, size_t n, float neg_lr, float eps) {
#pragma omp parallel for schedule(static) if (n >= 65536)
    for (size_t i = 0; i < n; i++) {
        float gi = g[i];
        float a = acc[i] + gi * gi;
        acc[i] = a;
        p[i] = p[i] + neg_lr * gi / (sqrtf(a) + eps);
    }
}
