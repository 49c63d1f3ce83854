/* BCE with logits on the CPU (seqctr's loss heads): the reference of bce.cu. */
#include <math.h>

#include "core.h"
#include "ops/ops_ctr.h"

/* exp of a non-positive argument only: no overflow for any logit. */
static double bce_sigmoid(double z) {
    if (z >= 0) return 1.0 / (1.0 + exp(-z));
    double e = exp(z);
    return e / (1.0 + e);
}

double nb_bce_logits_forward_backward(float *dz, float *losses, const float *z, const float *y, const float *w,
                                      int N, float scale) {
    NB_ASSERT(N >= 0 && (N == 0 || (z && y)));
    /* a logit that is not finite gives a loss that is not finite, as on the GPU: the run then
     * names the step and the first tensor that broke */
    /* Per-element work in parallel; the loss is summed serially in index order (N is a batch:
     * thousands, not millions) so it is the same for any thread count. */
    double total = 0;
    for (int i = 0; i < N; i++) {
        double zi = z[i], yi = y[i], wi = w ? w[i] : 1.0;
        double l = fmax(zi, 0.0) - zi * yi + log1p(exp(-fabs(zi)));
        if (losses) losses[i] = (float)l;
        total += wi * l;
    }
    if (dz) {
#pragma omp parallel for schedule(static)
        for (int i = 0; i < N; i++) {
            double wi = w ? w[i] : 1.0;
            dz[i] += (float)((double)scale * wi * (bce_sigmoid(z[i]) - (double)y[i]));
        }
    }
    return (double)scale * total;
}
