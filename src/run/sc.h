/* Kept for the callers of before the seqctr family moved (tools/, tests): the family's export is
 * in family/seqctr.h, NE and AUC in run/evalmetrics.h (nb_ne, nb_auc). Drop once they include
 * those. */
#ifndef NB_RUN_SC_H
#define NB_RUN_SC_H

#include "family/seqctr.h"
#include "run/evalmetrics.h"

static inline double nb_ctr_auc(const float *score, const float *label, long n) { return nb_auc(score, label, n); }
static inline double nb_ctr_ne(double mean_bce, double p) { return nb_ne(mean_bce, p); }

#endif
