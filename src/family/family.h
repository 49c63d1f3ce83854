/* The model families: a registry like the schedules' (sched/sched.c), the one place that knows
 * their names. Adding one = its nb_family_i in a file of this folder + a line in family.c. */
#ifndef NB_FAMILY_H
#define NB_FAMILY_H

#include "step/step.h"

/* The family of a state.json's "family" field, or NULL. */
const nb_family_i *nb_family_find(const char *name);
/* The family whose model --model names (every family is asked in registry order). */
const nb_family_i *nb_family_of_model(const char *model);
/* The registered families, in registry order (NULL-terminated). */
const nb_family_i *const *nb_family_all(void);

#endif
