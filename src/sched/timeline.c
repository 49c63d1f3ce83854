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

void nb_timeline_write(nb_lanes *L, const char *path, const char *title) {
    const nb_span *sp;
    size_t n = nb_lanes_spans(L, &sp);
    int nrows = nb_lanes_count(L);
    const char **names = nb_malloc((size_t)(nrows ? nrows : 1) * sizeof(char *), "timeline");
    for (int i = 0; i < nrows; i++) names[i] = nb_lane_name(nb_lanes_get(L, i));
    nb_svg_box *boxes = nb_malloc((n ? n : 1) * sizeof(nb_svg_box), "timeline");
    double origin = n ? sp[0].t0 : 0;
    for (size_t i = 0; i < n; i++) origin = sp[i].t0 < origin ? sp[i].t0 : origin;
    for (size_t i = 0; i < n; i++)
        boxes[i] = (nb_svg_box){sp[i].lane, 1e6 * (sp[i].t0 - origin), 1e6 * (sp[i].t1 - origin), color_of(&sp[i]),
                                sp[i].name};
    nb_svg_timeline(path, title, nrows, names, (int)n, boxes);
    free(boxes);
    free(names);
}
