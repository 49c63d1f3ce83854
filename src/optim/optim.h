/* Optimizers, gradient clipping and learning-rate schedules (CPU fp32 reference). */
#ifndef NB_OPTIM_H
#define NB_OPTIM_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    float lr, beta1, beta2, eps, weight_decay;
} nb_adamw_cfg;

/* PyTorch's torch.optim.AdamW formula (decoupled decay), step t >= 1:
 *   p -= lr * wd * p
 *   m = b1*m + (1-b1)*g ;  v = b2*v + (1-b2)*g^2
 *   p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)
 * Called per tensor; the caller passes weight_decay = 0 for 1-D tensors (biases, norms).
 * Elementwise, so the result is bitwise the same for any thread count. */
void nb_adamw_update(float *params, const float *grads, float *m, float *v, size_t n, nb_adamw_cfg cfg, int t);

/* The float scalars of one AdamW step, formed on the host in double exactly as nb_adamw_update
 * forms them. Backends apply them with nb_adamw_apply (CPU) or from device memory (CUDA), so a
 * captured CUDA graph keeps working when the learning rate and the step change: only these
 * scalars are rewritten between replays. */
typedef struct {
    float decay, w1, b2, w2, neg_step, bc2_sqrt, eps, pad;
} nb_adamw_scalars;
nb_adamw_scalars nb_adamw_prepare(nb_adamw_cfg cfg, int t);
/* One AdamW step from prepared scalars; each gradient is first multiplied by grad_scale when
 * grad_scale < 1 (the global-norm clip), as nb_scale_inplace would. */
void nb_adamw_apply(float *params, const float *grads, float *m, float *v, size_t n, const nb_adamw_scalars *k,
                    float grad_scale);

/* One tensor of a slab for nb_adamw_apply_spans: elements [offset, offset + numel), updated with
 * the scalars k[scalars] (the trainer passes k[0] with weight decay, k[1] without). */
typedef struct {
    size_t offset, numel;
    int scalars;
} nb_adamw_span;
/* nb_adamw_apply over each span in turn, with its own scalars: the same bits as one call per
 * tensor. Elements outside every span (alignment padding) are not touched. */
void nb_adamw_apply_spans(float *params, const float *grads, float *m, float *v, const nb_adamw_span *spans,
                          int nspans, const nb_adamw_scalars *k, float grad_scale);

/* Sum of squares of g in double, summed in fixed-size blocks in a fixed order, so the result
 * does not depend on the thread count. */
double nb_sumsq(const float *g, size_t n);
/* nb_sumsq in pieces, for callers that see the data in parts (the stream schedule sums each
 * layer's gradient as it lands): the sum is over fixed blocks of NB_SUMSQ_BLOCK elements from g[0],
 * each by nb_sumsq_block, then added in block order. nb_sumsq_finish(g, n, part, have) computes the
 * blocks whose have[b] is 0, then returns the ordered total: the same bits as nb_sumsq(g, n). */
#define NB_SUMSQ_BLOCK 4096
double nb_sumsq_block(const float *g, size_t n);
/* part[b] = nb_sumsq_block of every block of g[0..n) (the last one shorter) */
void nb_sumsq_blocks(double *part, const float *g, size_t n);
double nb_sumsq_finish(const float *g, size_t n, double *part, const unsigned char *have);
/* g *= s */
void nb_scale_inplace(float *g, size_t n, float s);
/* Clip factor for global-norm clipping: min(1, max_norm / (norm + 1e-6)); max_norm <= 0: 1. */
float nb_clip_factor(double norm, float max_norm);

/* Linear warmup for warmup steps to max_lr, then cosine decay to min_lr at step total.
 * step counts from 0. Past total: min_lr. */
float nb_lr_cosine(int step, int warmup, int total, float max_lr, float min_lr);

#ifdef __cplusplus
}
#endif
#endif
