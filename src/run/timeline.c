/* timeline.svg from the lanes' spans (see timeline.h). */
#include "run/timeline.h"

#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "io/json.h"
#include "io/svg.h"
#include "lanes/lanes.h"

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

/* The key of the colours that color_of gave the drawn boxes, in palette order. */
static int colour_key(const nb_svg_box *boxes, int nb, nb_svg_key keys[10], char labels[10][32]) {
    int used[10] = {0}, n = 0;
    for (int i = 0; i < nb; i++) used[boxes[i].color_index % 10] = 1;
    for (int c = 0; c < 10; c++) {
        if (!used[c]) continue;
        if (c < 8) snprintf(labels[n], 32, "%s, segment %d", c % 2 ? "backward" : "forward", c / 2);
        else snprintf(labels[n], 32, "%s", c == 8 ? "optimizer" : "copies, comm, other");
        keys[n] = (nb_svg_key){c, labels[n]};
        n++;
    }
    return n;
}

/* One step's window of spans (every span when step < 0) as lanes x time. */
static void draw(const nb_span *sp, size_t n, int nrows, const char *const *names, int step, const char *path,
                 const char *title) {
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
        if (sp[i].t1 < w0 || sp[i].t0 > w1 || sp[i].lane < 0 || sp[i].lane >= nrows) continue;
        double t0 = sp[i].t0 < w0 ? w0 : sp[i].t0, t1 = sp[i].t1 > w1 ? w1 : sp[i].t1;
        boxes[nb++] = (nb_svg_box){sp[i].lane, 1e6 * (t0 - w0), 1e6 * (t1 - w0), color_of(&sp[i]), sp[i].name};
    }
    char labels[10][32];
    nb_svg_key keys[10];
    int nkeys = colour_key(boxes, nb, keys, labels);
    nb_svg_timeline(path, title, nrows, names, nb, boxes, nkeys, keys);
    free(boxes);
}

void nb_timeline_write(nb_lanes *L, int step, const char *path, const char *title) {
    const nb_span *sp;
    size_t n = nb_lanes_spans(L, &sp);
    int nrows = nb_lanes_count(L);
    const char **names = nb_malloc((size_t)(nrows ? nrows : 1) * sizeof(char *), "timeline");
    for (int i = 0; i < nrows; i++) names[i] = nb_lane_name(nb_lanes_get(L, i));
    draw(sp, n, nrows, names, step, path, title);
    free(names);
}

static nb_span_kind kind_named(const char *name) {
    for (int k = 0; k < NB_SPAN_KIND_COUNT; k++)
        if (!strcmp(name, nb_span_kind_name((nb_span_kind)k))) return (nb_span_kind)k;
    return NB_SPAN_OTHER;
}

int nb_timeline_from_trace(const char *trace, int step, const char *path, const char *title) {
    nb_json *root = nb_json_load_file(trace);
    const nb_json *ev = nb_json_get(root, "traceEvents");
    NB_CHECK(ev && ev->type == NB_JSON_ARR, "pass a trace written by nobubble train --trace",
             "%s has no traceEvents array", trace);
    const char *names[64] = {0};
    nb_span *sp = nb_malloc((ev->len ? ev->len : 1) * sizeof *sp, "timeline spans");
    size_t n = 0;
    int nrows = 0, steps_seen = 0;
    for (size_t i = 0; i < ev->len; i++) {
        const nb_json *e = &ev->items[i];
        const char *ph = nb_json_get_str(e, "ph", ""), *name = nb_json_get_str(e, "name", "");
        int tid = (int)nb_json_get_int(e, "tid", -1);
        if (tid < 0 || tid >= 64) continue;
        if (!strcmp(ph, "M") && !strcmp(name, "thread_name")) {
            names[tid] = nb_json_get_str(nb_json_get(e, "args"), "name", "?");
            nrows = tid + 1 > nrows ? tid + 1 : nrows;
        } else if (!strcmp(ph, "X")) {
            nb_span *s = &sp[n++];
            nb_span_set_name(s->name, name);
            s->lane = tid;
            s->step = (int)nb_json_get_int(nb_json_get(e, "args"), "step", -1);
            s->kind = kind_named(nb_json_get_str(e, "cat", ""));
            s->t0 = 1e-6 * nb_json_get_num(e, "ts", 0);
            s->t1 = s->t0 + 1e-6 * nb_json_get_num(e, "dur", 0);
            steps_seen += s->step == step;
        }
    }
    NB_CHECK(step < 0 || steps_seen > 0, "pick a --step that the run traced (metrics.jsonl lists them)",
             "%s has no span of step %d", trace, step + 1);
    for (int i = 0; i < nrows; i++)
        if (!names[i]) names[i] = "?";
    char own[1024];
    if (!title) { /* the run the trace names (train --trace writes it), else the file's name */
        const char *run = nb_json_get_str(nb_json_get(root, "otherData"), "title", NULL), *base = strrchr(trace, '/');
        snprintf(own, sizeof own, "%.900s; step %d", run ? run : base ? base + 1 : trace, step + 1);
        title = own;
    }
    draw(sp, n, nrows, names, step, path, title);
    free(sp);
    nb_json_free(root);
    return (int)n;
}
