/* nobubble predict: a seqctr checkpoint's click probability for every row of a file. */
#include <stdio.h>
#include <string.h>

#include "args.h"
#include "commands.h"
#include "core.h"
#include "family/family.h"
#include "family/seqctr.h"
#include "family/transformer.h"
#include "run/run.h"

void nb_opts_from_ckpt(const char *dir, int batch, int threads, const char *device, nb_train_opts *o, char *resolved,
                       size_t cap);

static const char *PREDICT_SUMMARY =
    "Score every row of a file with a seqctr checkpoint: --out gets a TSV with a header, then per row\n"
    "its line in the file (or the schema's id column) and its click probability, in file order. The\n"
    "file is of the run's data kind (csv with the run's schema: the label column may be absent; Criteo\n"
    "TSV, .gz or a list); the scores are the model's forward as 'nobubble eval' computes it.";

int nb_cmd_predict(int argc, char **argv) {
    char ckpt[NB_PATH_MAX] = "", data[NB_PATH_MAX] = "", out[NB_PATH_MAX] = "", device[32] = "cpu";
    int batch = 0, threads = 0;
    nb_arg args[] = {
        {"ckpt", ARG_STR, ckpt, sizeof ckpt, "DIR", "run directory (or its ckpt/) to score with", 0, 0, 0},
        {"data", ARG_STR, data, sizeof data, "FILE", "rows to score: a file of the run's data kind", 0, 0, 0},
        {"out", ARG_STR, out, sizeof out, "FILE", "scores to write (TSV; written under a temporary name, then renamed)", 0, 0, 0},
        {"batch", ARG_INT, &batch, 0, "B", "rows per forward pass (0: the run's batch)", 0, 0, 0},
        {"device", ARG_STR, device, sizeof device, "DEV", "cpu, cuda or cuda:N", 0, 0, 0},
        {"threads", ARG_INT, &threads, 0, "N", "CPU threads (0: all cores)", 0, 0, 0},
    };
    int nargs = (int)(sizeof args / sizeof args[0]);
    nb_args_set_groups(NULL, ~0u);
    if (nb_args_parse("predict", PREDICT_SUMMARY, args, nargs, argc, argv)) return 0;
    if (!ckpt[0] || !data[0] || !out[0]) nb_usage_error("predict", "--ckpt DIR, --data FILE and --out FILE are required");
    nb_train_opts o;
    char resolved[NB_PATH_MAX];
    nb_opts_from_ckpt(ckpt, batch, threads, device, &o, resolved, sizeof resolved);
    if (nb_family_find(o.family) == &nb_family_transformer)
        nb_usage_error("predict", "%s is a transformer: predict scores seqctr (CTR) checkpoints; use 'sample' or 'eval'", resolved);
    snprintf(o.val_data, sizeof o.val_data, "%s", data);
    NB_CHECK(strncmp(o.data, "synth", 5) && strncmp(o.data, "movielens", 9),
             "train on your data (--data csv:FILE --schema S, or criteo:FILE) to score files",
             "the run trained on --data %s: predict reads files of a csv or criteo run", o.data);
    o.unlabeled = 1;
    static nb_run r;
    double t0 = nb_now();
    nb_run_init(&r, &o, 1);
    long n = nb_sc_predict(&r, out);
    fprintf(stderr, "predict: %ld rows of %s scored with %s (step %d) into %s in %.1f s\n", n, data, resolved, r.step, out,
            nb_now() - t0);
    nb_run_free(&r);
    return 0;
}
