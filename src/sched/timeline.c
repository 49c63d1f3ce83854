/* timeline.svg from the lanes' spans (see timeline.h). */
#include "sched/timeline.h"

#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "io/svg.h"

/* The segment of a span: an "S<k>" word in its name ("bwd S1 L3", "head S0"), else a trailing
 * number ("dense bwd 3"), else 0. */
static int segment_of(const char *name) {
    for (const char *p = name; *p; p++)
        if (*p == 'S' && (p == name || p[-1] == ' ') && p[1] >= '0' && p[1] <= '9') return atoi(p + 1);
    const char *sp = strrchr(name, ' ');
    if (!sp || !sp[1]) return 0;
    char *end;
    long k = strtol(sp + 1, &end, 10);
    return *end ? 0 : (int)k;
}

static int color_of(const nb_span *s) {
    if (s->kind == NB_SPAN_OPTIM) return 8;
    if (s->kind != NB_SPAN_FWD && s->kind != NB_SPAN_BWD) return 9;
    return (2 * segment_of(s->name) + (s->kind == NB_SPAN_BWD)) % 8;
}

void nb_timeline_write(nb_lanes *L, int step, const char *path, const char *title) {
    const nb_span *sp;
    size_t n = nb_lanes_spans(L, &sp);
    int nrows = nb_lanes_count(L);
    const char **names = nb_malloc((size_t)(nrows ? nrows : 1) * sizeof(char *), "timeline");
    for (int i = 0; i < nrows; i++) names[i] = nb_lane_name(nb_lanes_get(L, i));
    /* the window: the step's own spans (with --trace, every step's spans are still recorded) */
    double w0 = 1e300, w1 = -1e300;
    for (size_t i = 0; i < n; i++)
        if (step < 0 || sp[i].step == step) {
            w0 = sp[i].t0 < w0 ? sp[i].t0 : w0;
            w1 = sp[i].t1 > w1 ? sp[i].t1 : w1;
        }
    nb_svg_box *boxes = nb_malloc((n ? n : 1) * sizeof(nb_svg_box), "timeline");
    int nb = 0;
    for (size_t i = 0; i < n; i++) {
        if (sp[i].t1 < w0 || sp[i].t0 > w1) continue;
        double t0 = sp[i].t0 < w0 ? w0 : sp[i].t0, t1 = sp[i].t1 > w1 ? w1 : sp[i].t1;
        boxes[nb++] = (nb_svg_box){sp[i].lane, 1e6 * (t0 - w0), 1e6 * (t1 - w0), color_of(&sp[i]), sp[i].name};
    }
    nb_svg_timeline(path, title, nrows, names, nb, boxes);
    free(boxes);
    free(names);
}
