/* ReLU on the CPU (seqctr's MLPs): the reference of relu.cu. */
#include "core.h"
#include "ops/ops_ctr.h"

void nb_relu_forward(float *out, const float *inp, size_t n) {
    NB_ASSERT(n == 0 || (out && inp));
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = inp[i] > 0.0f ? inp[i] : 0.0f;
}

void nb_relu_backward(float *dinp, const float *inp, const float *dout, size_t n) {
    if (!dinp || n == 0) return;
    NB_ASSERT(inp && dout);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++)
        if (inp[i] > 0.0f) dinp[i] += dout[i];
}
