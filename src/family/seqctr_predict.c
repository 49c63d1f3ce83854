/* The seqctr family and your own data: the schema's flags (--schema) and `nobubble predict`,
 * one score per row of a file, computed as held-out evaluation computes them. */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "family/seqctr.h"
#include "family/seqctr_family.h"
#include "io/atomic.h"

/* A path the run keeps in state.json (the schema, --val-data, a csv --data): absolute, so eval
 * and predict find it from anywhere. */
static void absolute(char *path, size_t cap) {
    char real[PATH_MAX];
    if (path[0] && realpath(path, real) && strlen(real) < cap) snprintf(path, cap, "%s", real);
}

void nb_seqctr_schema_flags(nb_train_opts *o, int (*seen)(const void *, const char *), const void *ctx) {
    int csv = !strncmp(o->data, "csv:", 4);
    NB_CHECK(csv || !o->schema[0], "drop --schema, or pass --data csv:FILE", "--schema describes CSV data; --data is %s",
             o->data);
    if (strcmp(o->val_data, "none")) absolute(o->val_data, sizeof o->val_data);
    if (!csv) return;
    NB_CHECK(o->schema[0], "pass --schema FILE.json (the README's 'Your own CTR data' shows one), or --schema criteo",
             "--data %s needs a schema", o->data);
    if (!nb_ctr_schema_builtin(o->schema)) absolute(o->schema, sizeof o->schema);
    char file[NB_PATH_MAX];
    snprintf(file, sizeof file, "%s", o->data + 4);
    absolute(file, sizeof file);
    if (strlen(file) + 4 < sizeof o->data) snprintf(o->data, sizeof o->data, "csv:%s", file);
    nb_ctr_schema sc;
    nb_ctr_schema_load(&sc, o->schema, o->table_cap);
    if (sc.emb_dim && !seen(ctx, "emb-dim")) o->ctr.E = sc.emb_dim;
    if (sc.max_len && !seen(ctx, "max-len")) o->ctr.max_len = sc.max_len;
    nb_ctr_schema_free(&sc);
}

static float sigmoid(float x) { return x >= 0 ? 1.0f / (1.0f + expf(-x)) : expf(x) / (1.0f + expf(x)); }

long nb_sc_predict(struct nb_run *r, const char *path) {
    sc_train *t = T(r);
    NB_CHECK(!t->sharded, "this is a bug in nobubble; please report it", "predict on a sharded run");
    long n = nb_ctr_eval_count(&t->src);
    float *logit = nb_malloc((size_t)t->Bl * sizeof(float), "scores");
    char tmp[NB_PATH_MAX + 64], line[160];
    FILE *f = nb_atomic_open(path, tmp, sizeof tmp);
    int has_id = nb_ctr_eval_id(&t->src, 0) != NULL;
    int len = snprintf(line, sizeof line, "%s\tscore\n", has_id ? "id" : "line");
    nb_atomic_write(f, tmp, path, line, (size_t)len);
    for (long first = 0; first < n; first += t->Bl) {
        int B = (int)(n - first < t->Bl ? n - first : t->Bl);
        nb_ctr_fill_eval(&t->src, &t->batch, first, B);
        nb_sc_batch b = t->batch.b;
        b.label = NULL;
        nb_sc_forward(&t->m, &b, logit);
        for (int i = 0; i < B; i++) {
            const char *id = nb_ctr_eval_id(&t->src, first + i);
            if (id) nb_atomic_write(f, tmp, path, id, strlen(id));
            else len = snprintf(line, sizeof line, "%llu", (unsigned long long)nb_ctr_eval_line(&t->src, first + i));
            if (!id) nb_atomic_write(f, tmp, path, line, (size_t)len);
            len = snprintf(line, sizeof line, "\t%.9g\n", (double)sigmoid(logit[i]));
            nb_atomic_write(f, tmp, path, line, (size_t)len);
        }
    }
    nb_atomic_commit(f, tmp, path);
    free(logit);
    return n;
}
