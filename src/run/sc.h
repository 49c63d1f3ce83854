/* The seqctr family's metrics (run/sc_family.c). */
#ifndef NB_RUN_SC_H
#define NB_RUN_SC_H

/* Exact ROC AUC of scores against 0/1 labels (ties: average rank); NAN when one class is absent.
 * Deterministic: sorted by (score, index). */
double nb_ctr_auc(const float *score, const float *label, long n);
/* Normalized entropy: mean BCE / -(p log p + (1-p) log(1-p)); NAN when p is 0 or 1. */
double nb_ctr_ne(double mean_bce, double p);

struct nb_run;
/* The model's tensors of a seqctr run (dense weights and tables, fp32, seqctr.h's names; metadata
 * seqctr.config with the shape) into one safetensors file, crash-safely; returns the count. */
int nb_sc_export(struct nb_run *r, const char *path);

#endif
