#include "io/svg.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "io/atomic.h"
#include "io/json.h"

#define BUG_HINT "this is a bug in nobubble; please report it"

/* Tableau 10: distinct, readable on white, fine for colour-blind readers in the first few. */
static const char *palette[10] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                  "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};
/* Text colour readable on each palette colour. */
static const char *palette_text[10] = {"#fff", "#000", "#fff", "#000", "#fff",
                                       "#000", "#fff", "#000", "#fff", "#000"};

static int pal_index(int i) { return ((i % 10) + 10) % 10; }
const char *nb_svg_color(int i) { return palette[pal_index(i)]; }

/* XML text/attribute escaping. Characters XML 1.0 forbids (most C0 controls) are dropped and
 * invalid UTF-8 becomes U+FFFD, so whatever the caller passes, the file stays well-formed. */
static void put_text(nb_sbuf *b, const char *s) {
    if (!s) return;
    const unsigned char *u = (const unsigned char *)s;
    size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        unsigned c = u[i];
        const char *ent = c == '&' ? "&amp;" : c == '<' ? "&lt;" : c == '>' ? "&gt;"
                        : c == '"' ? "&quot;" : c == '\'' ? "&apos;" : NULL;
        if (ent) {
            nb_sbuf_puts(b, ent);
            i++;
        } else if (c < 0x20) {
            if (c == '\t' || c == '\n' || c == '\r') nb_sbuf_append(b, " ", 1);
            i++;
        } else if (c < 0x80) {
            nb_sbuf_append(b, s + i, 1);
            i++;
        } else {
            uint32_t cp;
            int k = nb_utf8_decode(u + i, n - i, &cp);
            if (k && !(cp == 0xFFFE || cp == 0xFFFF)) nb_sbuf_append(b, s + i, (size_t)k);
            else nb_sbuf_puts(b, "\xEF\xBF\xBD");
            i += k ? (size_t)k : 1;
        }
    }
}

/* Rough width of text in pixels at font size 12 (no font metrics here; used for layout only). */
static double text_width(const char *s, double font_px) { return s ? 0.6 * font_px * (double)strlen(s) : 0; }

/* ------------------------------------------------------------------ axes */

typedef struct {
    double lo, hi, step; /* axis range and tick spacing: ticks at lo, lo+step, ..., hi */
    double scale;        /* labels are value/scale with a suffix (k, M, G) for large values */
    const char *suffix;
    int decimals;
} axis;

/* Heckbert's "nice numbers" (Graphics Gems, 1990): 1, 2 or 5 times a power of ten. */
static double nice_num(double x, int round) {
    double e = floor(log10(x)), f = x / pow(10, e), nf;
    if (round) nf = f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10;
    else nf = f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10;
    return nf * pow(10, e);
}

static axis make_axis(double lo, double hi, int max_ticks) {
    axis a;
    if (!(lo <= hi)) lo = 0, hi = 1; /* no finite data */
    if (hi - lo < 1e-12 * fmax(1.0, fabs(hi))) {
        double pad = lo == 0 ? 1 : fabs(lo) * 0.1;
        lo -= pad, hi += pad;
    }
    double range = nice_num(hi - lo, 0);
    a.step = nice_num(range / (max_ticks - 1), 1);
    a.lo = floor(lo / a.step) * a.step;
    a.hi = ceil(hi / a.step) * a.step;
    double m = fmax(fabs(a.lo), fabs(a.hi));
    a.scale = 1, a.suffix = "";
    if (m >= 1e9) a.scale = 1e9, a.suffix = "G";
    else if (m >= 1e6) a.scale = 1e6, a.suffix = "M";
    else if (m >= 1e4) a.scale = 1e3, a.suffix = "k";
    double d = -floor(log10(a.step / a.scale) + 1e-9);
    a.decimals = d > 0 ? (int)d : 0;
    return a;
}

static int axis_ticks(const axis *a) { return (int)floor((a->hi - a->lo) / a->step + 0.5) + 1; }

static void tick_label(char *buf, size_t cap, const axis *a, int i) {
    double v = a->lo + i * a->step;
    if (fabs(v) < a->step * 1e-9) {
        snprintf(buf, cap, "0"); /* not "-0", nor "0k" */
        return;
    }
    snprintf(buf, cap, "%.*f%s", a->decimals, v / a->scale, a->suffix);
}

/* ------------------------------------------------------------------ shared pieces */

static void svg_open(nb_sbuf *b, int w, int h, const char *title) {
    nb_sbuf_printf(b, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
                      "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"12\">\n", w, h, w, h);
    nb_sbuf_printf(b, "<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"#fff\"/>\n", w, h);
    if (title && title[0]) {
        nb_sbuf_printf(b, "<text x=\"%d\" y=\"24\" text-anchor=\"middle\" font-size=\"16\" font-weight=\"bold\">", w / 2);
        put_text(b, title);
        nb_sbuf_puts(b, "</text>\n");
    }
}

static void svg_close_and_write(nb_sbuf *b, const char *path) {
    nb_sbuf_puts(b, "</svg>\n");
    nb_write_file_atomic(path, b->data, b->len);
    nb_sbuf_free(b);
}

/* ------------------------------------------------------------------ line plot */

enum { LP_W = 800, LP_H = 500, LP_L = 75, LP_R = 25, LP_T = 40, LP_B = 55 };

typedef struct {
    axis ax, ay;
    double x0, x1, y0, y1; /* plot area in pixels (y0 top) */
} frame;

static double px(const frame *f, double x) { return f->x0 + (x - f->ax.lo) / (f->ax.hi - f->ax.lo) * (f->x1 - f->x0); }
static double py(const frame *f, double y) { return f->y1 - (y - f->ay.lo) / (f->ay.hi - f->ay.lo) * (f->y1 - f->y0); }

static void data_range(int ns, const nb_svg_series *s, double *xlo, double *xhi, double *ylo, double *yhi) {
    *xlo = *ylo = INFINITY;
    *xhi = *yhi = -INFINITY;
    for (int k = 0; k < ns; k++)
        for (int i = 0; i < s[k].n; i++) {
            double x = s[k].x[i], y = s[k].y[i];
            if (!isfinite(x) || !isfinite(y)) continue;
            *xlo = fmin(*xlo, x), *xhi = fmax(*xhi, x);
            *ylo = fmin(*ylo, y), *yhi = fmax(*yhi, y);
        }
}

static void draw_axes(nb_sbuf *b, const frame *f, const char *xlabel, const char *ylabel) {
    char lab[64];
    nb_sbuf_puts(b, "<g stroke=\"#e5e5e5\" stroke-width=\"1\">\n");
    for (int i = 0; i < axis_ticks(&f->ax); i++) {
        double x = px(f, f->ax.lo + i * f->ax.step);
        nb_sbuf_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", x, f->y0, x, f->y1);
    }
    for (int i = 0; i < axis_ticks(&f->ay); i++) {
        double y = py(f, f->ay.lo + i * f->ay.step);
        nb_sbuf_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", f->x0, y, f->x1, y);
    }
    nb_sbuf_puts(b, "</g>\n");
    nb_sbuf_printf(b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#333\"/>\n",
                   f->x0, f->y0, f->x1 - f->x0, f->y1 - f->y0);
    nb_sbuf_puts(b, "<g text-anchor=\"middle\">\n");
    for (int i = 0; i < axis_ticks(&f->ax); i++) {
        tick_label(lab, sizeof lab, &f->ax, i);
        nb_sbuf_printf(b, "<text x=\"%.1f\" y=\"%.1f\">%s</text>\n", px(f, f->ax.lo + i * f->ax.step), f->y1 + 16, lab);
    }
    nb_sbuf_puts(b, "</g>\n<g text-anchor=\"end\">\n");
    for (int i = 0; i < axis_ticks(&f->ay); i++) {
        tick_label(lab, sizeof lab, &f->ay, i);
        nb_sbuf_printf(b, "<text x=\"%.1f\" y=\"%.1f\">%s</text>\n", f->x0 - 6, py(f, f->ay.lo + i * f->ay.step) + 4, lab);
    }
    nb_sbuf_puts(b, "</g>\n");
    nb_sbuf_printf(b, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">", (f->x0 + f->x1) / 2, LP_H - 12);
    put_text(b, xlabel);
    double cy = (f->y0 + f->y1) / 2;
    nb_sbuf_printf(b, "</text>\n<text x=\"16\" y=\"%.1f\" text-anchor=\"middle\" transform=\"rotate(-90 16 %.1f)\">", cy, cy);
    put_text(b, ylabel);
    nb_sbuf_puts(b, "</text>\n");
}

static void draw_series(nb_sbuf *b, const frame *f, const nb_svg_series *s, const char *color) {
    int finite = 0;
    for (int i = 0; i < s->n; i++) finite += isfinite(s->x[i]) && isfinite(s->y[i]);
    nb_sbuf_puts(b, "<path fill=\"none\" stroke-width=\"1.5\" stroke-linejoin=\"round\" stroke=\"");
    put_text(b, color);
    nb_sbuf_puts(b, "\" d=\"");
    int pen_down = 0;
    for (int i = 0; i < s->n; i++) {
        if (!isfinite(s->x[i]) || !isfinite(s->y[i])) {
            pen_down = 0; /* a gap, not a line across the missing point */
            continue;
        }
        nb_sbuf_printf(b, "%s%.1f %.1f ", pen_down ? "L" : "M", px(f, s->x[i]), py(f, s->y[i]));
        pen_down = 1;
    }
    nb_sbuf_puts(b, "\"/>\n");
    /* Markers: on every point of a sparse series, and on points with no neighbour to join. */
    nb_sbuf_puts(b, "<g fill=\"");
    put_text(b, color);
    nb_sbuf_puts(b, "\">\n");
    for (int i = 0; i < s->n; i++) {
        if (!isfinite(s->x[i]) || !isfinite(s->y[i])) continue;
        int prev = i > 0 && isfinite(s->x[i - 1]) && isfinite(s->y[i - 1]);
        int next = i + 1 < s->n && isfinite(s->x[i + 1]) && isfinite(s->y[i + 1]);
        if (finite <= 60 || (!prev && !next))
            nb_sbuf_printf(b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"2.5\"/>\n", px(f, s->x[i]), py(f, s->y[i]));
    }
    nb_sbuf_puts(b, "</g>\n");
}

static void draw_legend(nb_sbuf *b, const frame *f, int ns, const nb_svg_series *s, const char **colors) {
    double w = 0;
    for (int k = 0; k < ns; k++) w = fmax(w, text_width(s[k].name, 12));
    w += 44;
    double x = f->x1 - w - 8, y = f->y0 + 8, h = 20.0 * ns + 8;
    nb_sbuf_printf(b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#fff\" fill-opacity=\"0.85\" "
                      "stroke=\"#999\"/>\n", x, y, w, h);
    for (int k = 0; k < ns; k++) {
        double ly = y + 16 + 20.0 * k;
        nb_sbuf_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke-width=\"2.5\" stroke=\"",
                       x + 8, ly - 4, x + 30, ly - 4);
        put_text(b, colors[k]);
        nb_sbuf_printf(b, "\"/>\n<text x=\"%.1f\" y=\"%.1f\">", x + 36, ly);
        put_text(b, s[k].name);
        nb_sbuf_puts(b, "</text>\n");
    }
}

void nb_svg_line_plot(const char *path, const char *title, const char *xlabel, const char *ylabel,
                      const nb_svg_series *series, int nseries) {
    NB_CHECK(nseries >= 0 && (nseries == 0 || series), BUG_HINT, "bad series list for '%s'", path);
    for (int k = 0; k < nseries; k++)
        NB_CHECK(series[k].n >= 0 && (series[k].n == 0 || (series[k].x && series[k].y)), BUG_HINT,
                 "series %d of '%s' has no data pointers", k, path);
    double xlo, xhi, ylo, yhi;
    data_range(nseries, series, &xlo, &xhi, &ylo, &yhi);
    frame f = {make_axis(xlo, xhi, 8), make_axis(ylo, yhi, 7), LP_L, LP_W - LP_R, LP_T, LP_H - LP_B};
    nb_sbuf b = {0};
    svg_open(&b, LP_W, LP_H, title);
    draw_axes(&b, &f, xlabel, ylabel);
    const char **colors = nb_calloc((size_t)nseries + 1, sizeof *colors, "plot colours");
    for (int k = 0; k < nseries; k++) {
        colors[k] = series[k].color ? series[k].color : nb_svg_color(k);
        draw_series(&b, &f, &series[k], colors[k]);
    }
    if (!(xlo <= xhi))
        nb_sbuf_printf(&b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"#999\">no data yet</text>\n",
                       (f.x0 + f.x1) / 2, (f.y0 + f.y1) / 2);
    if (nseries) draw_legend(&b, &f, nseries, series, colors);
    free(colors);
    svg_close_and_write(&b, path);
}

/* ------------------------------------------------------------------ timeline */

enum { TL_W = 1400, TL_ROW = 26, TL_T = 40, TL_B = 50, TL_R = 25 };

void nb_svg_timeline(const char *path, const char *title, int nrows, const char *const *row_names,
                     int nboxes, const nb_svg_box *boxes) {
    NB_CHECK(nrows >= 0 && nboxes >= 0 && (nboxes == 0 || boxes), BUG_HINT, "bad timeline input for '%s'", path);
    double t0 = INFINITY, t1 = -INFINITY, name_w = 60;
    for (int i = 0; i < nboxes; i++) {
        const nb_svg_box *bx = &boxes[i];
        NB_CHECK(bx->row >= 0 && bx->row < nrows && isfinite(bx->t0_us) && isfinite(bx->t1_us) &&
                 bx->t1_us >= bx->t0_us, BUG_HINT, "timeline box %d of '%s' is invalid (row %d of %d, %g..%g us)",
                 i, path, bx->row, nrows, bx->t0_us, bx->t1_us);
        t0 = fmin(t0, bx->t0_us), t1 = fmax(t1, bx->t1_us);
    }
    for (int r = 0; r < nrows; r++) name_w = fmax(name_w, text_width(row_names ? row_names[r] : NULL, 12) + 16);
    name_w = fmin(name_w, 300);
    frame f = {make_axis(t0, t1, 11), make_axis(0, 1, 2), name_w, TL_W - TL_R, TL_T, TL_T + (double)nrows * TL_ROW};
    int h = TL_T + nrows * TL_ROW + TL_B;
    nb_sbuf b = {0};
    svg_open(&b, TL_W, h, title);
    /* Lanes: alternating stripes with their names. */
    for (int r = 0; r < nrows; r++) {
        double y = f.y0 + r * TL_ROW;
        nb_sbuf_printf(&b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%d\" fill=\"%s\"/>\n", f.x0, y,
                       f.x1 - f.x0, TL_ROW, r % 2 ? "#f4f4f4" : "#fafafa");
        nb_sbuf_printf(&b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">", f.x0 - 8, y + TL_ROW / 2.0 + 4);
        put_text(&b, row_names ? row_names[r] : NULL);
        nb_sbuf_puts(&b, "</text>\n");
    }
    /* Time axis: gridlines over the lanes, labels underneath. */
    char lab[64];
    nb_sbuf_puts(&b, "<g stroke=\"#ddd\">\n");
    for (int i = 0; i < axis_ticks(&f.ax); i++) {
        double x = px(&f, f.ax.lo + i * f.ax.step);
        nb_sbuf_printf(&b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", x, f.y0, x, f.y1 + 4);
    }
    nb_sbuf_puts(&b, "</g>\n<g text-anchor=\"middle\">\n");
    for (int i = 0; i < axis_ticks(&f.ax); i++) {
        tick_label(lab, sizeof lab, &f.ax, i);
        nb_sbuf_printf(&b, "<text x=\"%.1f\" y=\"%.1f\">%s</text>\n", px(&f, f.ax.lo + i * f.ax.step), f.y1 + 18, lab);
    }
    nb_sbuf_printf(&b, "</g>\n<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">time (\xC2\xB5s)</text>\n",
                   (f.x0 + f.x1) / 2, h - 10);
    /* Spans. A box is at least half a pixel wide so that short kernels stay visible. */
    nb_sbuf_puts(&b, "<g font-size=\"10\">\n");
    for (int i = 0; i < nboxes; i++) {
        const nb_svg_box *bx = &boxes[i];
        double x = px(&f, bx->t0_us), w = fmax(px(&f, bx->t1_us) - x, 0.5);
        double y = f.y0 + bx->row * TL_ROW + 3, bh = TL_ROW - 6;
        int c = pal_index(bx->color_index);
        /* a hairline edge separates back-to-back spans of one colour, unless it would hide the box */
        nb_sbuf_printf(&b, "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\"%s><title>", x, y, w,
                       bh, palette[c], w >= 3 ? " stroke=\"#fff\" stroke-width=\"0.6\"" : "");
        put_text(&b, bx->label);
        nb_sbuf_printf(&b, " [%.1f .. %.1f us, %.1f us]</title></rect>\n", bx->t0_us, bx->t1_us, bx->t1_us - bx->t0_us);
        if (bx->label && text_width(bx->label, 10) + 6 <= w) {
            nb_sbuf_printf(&b, "<text x=\"%.2f\" y=\"%.1f\" fill=\"%s\">", x + 3, y + bh / 2 + 3.5, palette_text[c]);
            put_text(&b, bx->label);
            nb_sbuf_puts(&b, "</text>\n");
        }
    }
    nb_sbuf_puts(&b, "</g>\n");
    svg_close_and_write(&b, path);
}
