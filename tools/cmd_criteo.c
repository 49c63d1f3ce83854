/* nobubble criteo-convert: Criteo TSV -> the binary format (validated, ~10x faster to read). */
#include <stdio.h>
#include <string.h>

#include "args.h"
#include "commands.h"
#include "core.h"
#include "data/criteo.h"

int nb_cmd_criteo_convert(int argc, char **argv) {
    char in[1024] = "", out[1024] = "", layout_name[16] = "kaggle";
    int strict = 0;
    nb_arg args[] = {
        {"in", ARG_STR, in, sizeof in, "TSV", "Criteo TSV file (decompressed)", 0, 0, 0},
        {"out", ARG_STR, out, sizeof out, "BIN", "binary file to write (crash-safely)", 0, 0, 0},
        {"layout", ARG_STR, layout_name, sizeof layout_name, "L", "kaggle, 1tb or unlabeled", 0, 0, 0},
        {"strict", ARG_BOOL, &strict, 0, NULL, "stop at the first bad line (default: skip and count)", 0, 0, 0},
    };
    int nargs = (int)(sizeof args / sizeof args[0]);
    if (nb_args_parse("criteo-convert",
                      "Convert a Criteo TSV file (Kaggle train.txt, 1TB day_N, or Kaggle test.txt) to nobubble's\n"
                      "binary format; train with --data criteo:BIN as with the TSV.",
                      args, nargs, argc, argv))
        return 0;
    if (!in[0] || !out[0]) nb_usage_error("criteo-convert", "--in TSV and --out BIN are required");
    nb_criteo_layout layout = NB_CRITEO_KAGGLE;
    if (!strcmp(layout_name, "1tb"))
        layout = NB_CRITEO_1TB;
    else if (!strcmp(layout_name, "unlabeled"))
        layout = NB_CRITEO_UNLABELED;
    else if (strcmp(layout_name, "kaggle"))
        nb_usage_error("criteo-convert", "--layout takes kaggle, 1tb or unlabeled, got '%s'", layout_name);
    double t0 = nb_now();
    nb_criteo_stats st = nb_criteo_convert(in, out, layout, strict);
    double dt = nb_now() - t0;
    printf("%s -> %s: %llu samples (%llu positive), %llu bad lines skipped, %.1f s (%.0f samples/s)\n", in, out,
           (unsigned long long)st.good, (unsigned long long)st.positives, (unsigned long long)st.bad, dt,
           dt > 0 ? (double)st.good / dt : 0.0);
    if (st.bad) printf("first bad line: %llu (%s)\n", (unsigned long long)st.first_bad_line, st.first_bad);
    return 0;
}
