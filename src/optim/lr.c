/* Learning-rate schedules. */
#include "optim/optim.h"

#include <math.h>

/* llm.c's schedule, evaluated in double:
 *   step <  warmup:          max_lr * (step + 1) / warmup   (step 0 already trains; step warmup-1 hits max_lr)
 *   warmup <= step < total:  min_lr + 0.5 * (1 + cos(pi * (step - warmup) / (total - warmup))) * (max_lr - min_lr)
 *   step >= total:           min_lr
 * so lr(warmup) = max_lr, lr at the midpoint of the decay = (max_lr + min_lr) / 2, lr(total) = min_lr. */
float nb_lr_cosine(int step, int warmup, int total, float max_lr, float min_lr) {
    if (step < 0) step = 0;
    if (warmup < 0) warmup = 0;
    if (step < warmup) return (float)((double)max_lr * (double)(step + 1) / (double)warmup);
    if (step >= total) return min_lr;
    double ratio = (double)(step - warmup) / (double)(total - warmup);
    double coeff = 0.5 * (1.0 + cos(3.14159265358979323846 * ratio));
    return (float)((double)min_lr + coeff * ((double)max_lr - (double)min_lr));
}
