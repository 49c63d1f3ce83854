/* The seqctr family (family/seqctr*.c): the seqctr model (model/seqctr.h) in a run. The family
 * itself is nb_family_seqctr (run/run.h); its export is here. */
#ifndef NB_FAMILY_SEQCTR_H
#define NB_FAMILY_SEQCTR_H

struct nb_run;
/* The model's tensors of a seqctr run (dense weights and tables, fp32, seqctr.h's names; metadata
 * seqctr.config with the shape) into one safetensors file, crash-safely; returns the count. */
int nb_sc_export(struct nb_run *r, const char *path);
/* An evaluation-only run's held-out set (--val-data: a whole file) scored into path (TSV,
 * crash-safely): a header "line\tscore" (or "id\tscore" with the schema's id column), then each
 * row's line in its file (or id) and its click probability sigmoid(logit), in file order. The
 * logits are the model's forward as held-out evaluation computes it. Returns the rows. */
long nb_sc_predict(struct nb_run *r, const char *path);

#endif
