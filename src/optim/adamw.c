/* AdamW (PyTorch's formula), global-norm helpers. CPU fp32.
 *
 * nb_adamw_update follows torch.optim.AdamW's single-tensor path (_single_tensor_adamw) operation
 * by operation, so that a parity test against torch only sees rounding-level differences:
 *   param.mul_(1 - lr*wd)                      p = p * (float)(1 - lr*wd)
 *   exp_avg.lerp_(grad, 1 - beta1)             m = m + (float)(1-b1) * (g - m)
 *   exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1-beta2)
 *                                              v = v * (float)b2 ;  v = v + ((float)(1-b2) * g) * g
 *   step_size = lr / (1 - beta1**t)            scalar math in double, like Python's floats
 *   denom = (v.sqrt() / sqrt(1 - beta2**t)) + eps
 *   param.addcdiv_(m, denom, value=-step_size) p = p + ((float)(-step_size) * m) / denom
 * Scalars are formed in double and rounded to float once, as torch passes Python floats to float
 * kernels. Known differences from torch: our hyperparameters arrive as float (0.9f is not
 * Python's 0.9, a relative difference ~3e-8 in beta1), and torch's vectorized lerp uses an FMA;
 * both are rounding-level. */
#include "optim/optim.h"

#include "core.h"

#include <math.h>
#include <stdlib.h>

/* Below this many elements the OpenMP fork/join costs more than the loop. */
#define OPTIM_PAR_MIN 32768

nb_adamw_scalars nb_adamw_prepare(nb_adamw_cfg cfg, int t) {
    NB_ASSERT(t >= 1);
    double lr = cfg.lr, b1 = cfg.beta1, b2 = cfg.beta2;
    double bc1 = 1.0 - pow(b1, (double)t);
    double bc2 = 1.0 - pow(b2, (double)t);
    nb_adamw_scalars k;
    k.decay = (float)(1.0 - lr * (double)cfg.weight_decay);
    k.w1 = (float)(1.0 - b1);
    k.b2 = (float)b2;
    k.w2 = (float)(1.0 - b2);
    k.neg_step = (float)(-(lr / bc1));
    k.bc2_sqrt = (float)sqrt(bc2);
    k.eps = cfg.eps;
    k.pad = 0.0f;
    return k;
}

void nb_adamw_apply(float *params, const float *grads, float *m, float *v, size_t n, const nb_adamw_scalars *k,
                    float grad_scale) {
    const float decay = k->decay, w1 = k->w1, fb2 = k->b2, w2 = k->w2, neg_step = k->neg_step;
    const float bc2_sqrt = k->bc2_sqrt, eps = k->eps;
    const int clip = grad_scale < 1.0f;
#pragma omp parallel for schedule(static) if (n >= OPTIM_PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        float g = clip ? grads[i] * grad_scale : grads[i];
        float p = params[i] * decay;
        float mi = m[i] + w1 * (g - m[i]);
        float vi = v[i] * fb2;
        vi = vi + (w2 * g) * g;
        float denom = sqrtf(vi) / bc2_sqrt + eps;
        params[i] = p + (neg_step * mi) / denom;
        m[i] = mi;
        v[i] = vi;
    }
}

void nb_adamw_apply_spans(float *params, const float *grads, float *m, float *v, const nb_adamw_span *spans,
                          int nspans, const nb_adamw_scalars *k, float grad_scale) {
    NB_ASSERT(nspans >= 0 && (spans || nspans == 0) && k);
    for (int i = 0; i < nspans; i++) {
        const nb_adamw_span *s = &spans[i];
        NB_ASSERT(s->scalars >= 0);
        nb_adamw_apply(params + s->offset, grads + s->offset, m + s->offset, v + s->offset, s->numel, &k[s->scalars],
                       grad_scale);
    }
}

void nb_adamw_update(float *params, const float *grads, float *m, float *v, size_t n, nb_adamw_cfg cfg, int t) {
    nb_adamw_scalars k = nb_adamw_prepare(cfg, t);
    nb_adamw_apply(params, grads, m, v, n, &k, 1.0f);
}

/* Elements per block, and blocks summed per parallel pass. The blocking is fixed, so the set of
 * partial sums and the order they are added in do not depend on the thread count. A pass is
 * 16 M elements (its partial sums, 32 KB, on the stack: no allocation in a training step), so a
 * model-sized slab costs tens of thread fork/joins, not thousands. */
#define SUMSQ_BLOCK NB_SUMSQ_BLOCK
#define SUMSQ_GROUP 4096

double nb_sumsq_block(const float *g, size_t n) {
    double acc[4] = {0, 0, 0, 0};
    size_t i = 0;
    for (; i + 4 <= n; i += 4)
        for (int j = 0; j < 4; j++) acc[j] += (double)g[i + j] * (double)g[i + j];
    for (int j = 0; i < n; i++, j++) acc[j] += (double)g[i] * (double)g[i];
    return (acc[0] + acc[2]) + (acc[1] + acc[3]);
}

void nb_sumsq_blocks(double *part, const float *g, size_t n) {
    long nblocks = (long)((n + SUMSQ_BLOCK - 1) / SUMSQ_BLOCK);
#pragma omp parallel for schedule(static) if (nblocks > 8)
    for (long k = 0; k < nblocks; k++) {
        size_t start = (size_t)k * SUMSQ_BLOCK;
        part[k] = nb_sumsq_block(g + start, n - start < SUMSQ_BLOCK ? n - start : SUMSQ_BLOCK);
    }
}

double nb_sumsq(const float *g, size_t n) {
    size_t nblocks = (n + SUMSQ_BLOCK - 1) / SUMSQ_BLOCK;
    double total = 0.0, part[SUMSQ_GROUP];
    for (size_t b0 = 0; b0 < nblocks; b0 += SUMSQ_GROUP) {
        const size_t pass = (size_t)SUMSQ_GROUP * SUMSQ_BLOCK;
        size_t start = b0 * SUMSQ_BLOCK, len = n - start < pass ? n - start : pass;
        int cnt = (int)((len + SUMSQ_BLOCK - 1) / SUMSQ_BLOCK);
        nb_sumsq_blocks(part, g + start, len);
        for (int k = 0; k < cnt; k++) total += part[k];
    }
    return total;
}

double nb_sumsq_finish(const float *g, size_t n, double *part, const unsigned char *have) {
    long nblocks = (long)((n + SUMSQ_BLOCK - 1) / SUMSQ_BLOCK);
    /* what is left is a few contiguous runs (the stream schedule sums most blocks as they land):
     * dynamic, so that no one thread gets a whole run */
#pragma omp parallel for schedule(dynamic, 16) if (nblocks > 64)
    for (long b = 0; b < nblocks; b++) {
        if (have[b]) continue;
        size_t start = (size_t)b * SUMSQ_BLOCK;
        part[b] = nb_sumsq_block(g + start, n - start < SUMSQ_BLOCK ? n - start : SUMSQ_BLOCK);
    }
    double total = 0.0;
    for (long b = 0; b < nblocks; b++) total += part[b];
    return total;
}

void nb_scale_inplace(float *g, size_t n, float s) {
#pragma omp parallel for schedule(static) if (n >= OPTIM_PAR_MIN)
    for (size_t i = 0; i < n; i++) g[i] *= s;
}

/* torch.nn.utils.clip_grad_norm_: clip_coef = max_norm / (total_norm + 1e-6), clamped to <= 1.
 * A NaN/inf norm yields NaN/0 like torch, so a diverged step shows up instead of being hidden. */
float nb_clip_factor(double norm, float max_norm) {
    if (max_norm <= 0.0f) return 1.0f;
    double f = (double)max_norm / (norm + 1e-6);
    if (isnan(f)) return NAN;
    return f < 1.0 ? (float)f : 1.0f;
}
