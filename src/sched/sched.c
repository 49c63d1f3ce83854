/* The schedule registry: the one place that knows schedule names. */
#include "sched/sched.h"

#include <string.h>

static const nb_sched_i *const registry[] = {&nb_sched_plain, &nb_sched_erase, &nb_sched_stream, &nb_sched_sparse_dist, &nb_sched_pipe, NULL};

const nb_sched_i *const *nb_sched_all(void) { return registry; }

const nb_sched_i *nb_sched_find(const char *name) {
    for (int i = 0; registry[i]; i++)
        if (!strcmp(registry[i]->name, name)) return registry[i];
    return NULL;
}

const char *nb_sched_names(void) {
    static char names[256];
    if (names[0]) return names;
    size_t len = 0;
    for (int i = 0; registry[i]; i++) {
        const char *sep = !i ? "" : registry[i + 1] ? ", " : " or ";
        len += (size_t)snprintf(names + len, sizeof names - len, "%s%s", sep, registry[i]->name);
    }
    return names;
}

const char *nb_sched_refuses(const nb_sched_i *s, const nb_train_opts *o, const char **hint) {
    if (o->graphs && !s->traits.graphs) {
        *hint = "drop --graphs with this schedule";
        return "its steps are not captured as graphs yet";
    }
    return s->refuses ? s->refuses(o, hint) : NULL;
}
