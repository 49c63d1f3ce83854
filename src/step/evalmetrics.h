/* Held-out metrics of a binary classifier, the same for any model family: normalized entropy
 * and exact ROC AUC (the CTR families' evaluation; DESIGN.md, Models). */
#ifndef NB_STEP_EVALMETRICS_H
#define NB_STEP_EVALMETRICS_H

#include "step/step.h"

/* Exact ROC AUC of scores against 0/1 labels (ties: average rank); NAN when one class is absent.
 * Deterministic: sorted by (score, index). */
double nb_auc(const float *score, const float *label, long n);
/* Normalized entropy: mean BCE / -(p log p + (1-p) log(1-p)); NAN when p is 0 or 1. */
double nb_ne(double mean_bce, double p);
/* The evaluation of n scores against their labels: mean BCE (logits: the scores are logits;
 * else probabilities, clamped to [1e-7, 1 - 1e-7]), the positive rate, NE and AUC. */
nb_eval nb_eval_binary(const float *score, const float *label, long n, int logits);

#endif
