/* The family registry (family.h). The transformer family comes last: it takes every --model that
 * no other family owns, and its preset table names the unknown ones. */
#include "family/family.h"

#include <string.h>

extern const nb_family_i nb_family_seqctr, nb_family_transformer;

static const nb_family_i *const registry[] = {&nb_family_seqctr, &nb_family_transformer, NULL};

const nb_family_i *const *nb_family_all(void) { return registry; }

const nb_family_i *nb_family_find(const char *name) {
    for (int i = 0; registry[i]; i++)
        if (!strcmp(registry[i]->name, name)) return registry[i];
    return NULL;
}

const nb_family_i *nb_family_of_model(const char *model) {
    for (int i = 0; registry[i]; i++)
        if (registry[i]->owns_model(model)) return registry[i];
    return NULL;
}
