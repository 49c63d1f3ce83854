/* nobubble timeline: draw one step of a Chrome trace (train --trace FILE) as timeline.svg, the
 * picture the trainer leaves for the last step, for any step of the run. */
#include <stdio.h>
#include <string.h>

#include "args.h"
#include "commands.h"
#include "core.h"
#include "run/timeline.h"

#define TIMELINE_SUMMARY                                                                            \
    "Draw one step of a trace written by 'nobubble train --trace FILE' as an SVG timeline: lanes " \
    "as rows, each span a box coloured by segment and pass, spans of neighbouring steps that "    \
    "overlap the step included."

int nb_cmd_timeline(int argc, char **argv) {
    char trace[4096] = "", out[4096] = "timeline.svg", title[256] = "";
    int step = -1;
    nb_arg args[] = {
        {"trace", ARG_STR, trace, sizeof trace, "FILE", "Chrome trace from train --trace (required)", 0, 0, 0},
        {"step", ARG_INT, &step, 0, "N", "step to draw, counted from 1 as in metrics.jsonl and the progress line (required)", 1, 0, 0},
        {"out", ARG_STR, out, sizeof out, "FILE", "SVG to write (default timeline.svg)", 0, 0, 0},
        {"title", ARG_STR, title, sizeof title, "TEXT", "title line (default: the run the trace names, and the step)", 0, 0, 0},
    };
    int nargs = (int)(sizeof args / sizeof args[0]);
    if (nb_args_parse("timeline", TIMELINE_SUMMARY, args, nargs, argc, argv)) return 0;
    if (!trace[0]) nb_usage_error("timeline", "--trace FILE is required");
    if (!nb_args_seen(args, nargs, "step")) nb_usage_error("timeline", "--step N is required");
    int n = nb_timeline_from_trace(trace, step - 1, out, title[0] ? title : NULL);
    fprintf(stderr, "timeline of step %d (%d spans in the trace) written to %s\n", step, n, out);
    return 0;
}
