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

/* ------------------------------------------------------------------ line plots */

enum { LP_W = 800, LP_H = 500, LP_L = 75, LP_R = 25, LP_T = 40, LP_B = 55 };
enum { PN_W = 560, PN_H = 300, PN_COLS = 2 }; /* one panel of a panel grid */

typedef struct {
    axis ax, ay;
    double x0, x1, y0, y1; /* plot area in pixels (y0 top) */
} frame;

static double px(const frame *f, double x) { return f->x0 + (x - f->ax.lo) / (f->ax.hi - f->ax.lo) * (f->x1 - f->x0); }
/* clamped to the plot area: a point clipped by a robust axis is drawn on its edge */
static double py(const frame *f, double y) {
    double p = f->y1 - (y - f->ay.lo) / (f->ay.hi - f->ay.lo) * (f->y1 - f->y0);
    return p < f->y0 ? f->y0 : p > f->y1 ? f->y1 : p;
}

static int finite_point(const nb_svg_series *s, int i) { return isfinite(s->x[i]) && isfinite(s->y[i]); }

static void data_range(int ns, const nb_svg_series *s, double *xlo, double *xhi, double *ylo, double *yhi) {
    *xlo = *ylo = INFINITY;
    *xhi = *yhi = -INFINITY;
    for (int k = 0; k < ns; k++)
        for (int i = 0; i < s[k].n; i++) {
            if (!finite_point(&s[k], i)) continue;
            double x = s[k].x[i], y = s[k].y[i];
            *xlo = fmin(*xlo, x), *xhi = fmax(*xhi, x);
            *ylo = fmin(*ylo, y), *yhi = fmax(*yhi, y);
        }
}

/* The top of a robust y axis: the largest value after the first tenth of the x range. A spike in
 * the first steps (a loss that starts at ln V, an optimizer's first steps) would otherwise squash
 * the rest of the curve into a flat line; it is drawn clipped at the top and named in the title. */
static double robust_top(int ns, const nb_svg_series *s, double xlo, double xhi, double yhi) {
    double cut = xlo + 0.1 * (xhi - xlo), top = -INFINITY;
    for (int k = 0; k < ns; k++)
        for (int i = 0; i < s[k].n; i++)
            if (finite_point(&s[k], i) && s[k].x[i] >= cut) top = fmax(top, s[k].y[i]);
    return isfinite(top) ? fmin(yhi, top + 0.05 * fabs(top)) : yhi;
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
    nb_sbuf_printf(b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">", (f->x0 + f->x1) / 2, f->y1 + 43);
    put_text(b, xlabel);
    double cy = (f->y0 + f->y1) / 2, lx = f->x0 - 59;
    nb_sbuf_printf(b, "</text>\n<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" transform=\"rotate(-90 %.1f %.1f)\">",
                   lx, cy, lx, cy);
    put_text(b, ylabel);
    nb_sbuf_puts(b, "</text>\n");
}

static void draw_series(nb_sbuf *b, const frame *f, const nb_svg_series *s, const char *color) {
    int finite = 0;
    for (int i = 0; i < s->n; i++) finite += finite_point(s, i);
    nb_sbuf_puts(b, "<path fill=\"none\" stroke-width=\"1.5\" stroke-linejoin=\"round\" stroke=\"");
    put_text(b, color);
    nb_sbuf_puts(b, "\" d=\"");
    int pen_down = 0;
    for (int i = 0; i < s->n; i++) {
        if (!finite_point(s, i)) {
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
        if (!finite_point(s, i)) continue;
        int prev = i > 0 && finite_point(s, i - 1);
        int next = i + 1 < s->n && finite_point(s, i + 1);
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

static void check_series(const char *path, const nb_svg_series *series, int nseries) {
    NB_CHECK(nseries >= 0 && (nseries == 0 || series), BUG_HINT, "bad series list for '%s'", path);
    for (int k = 0; k < nseries; k++)
        NB_CHECK(series[k].n >= 0 && (series[k].n == 0 || (series[k].x && series[k].y)), BUG_HINT,
                 "series %d of '%s' has no data pointers", k, path);
}

/* One plot in the area [x0, x1] x [y0, y1] of the picture (the plot frame inside its margins);
 * the x range is the caller's, so that panels side by side share it. */
static void draw_plot(nb_sbuf *b, double x0, double y0, double x1, double y1, const nb_svg_panel *p, double xlo,
                      double xhi, int legend) {
    double dxlo, dxhi, ylo, yhi;
    data_range(p->nseries, p->series, &dxlo, &dxhi, &ylo, &yhi);
    double top = p->robust && xlo < xhi ? robust_top(p->nseries, p->series, xlo, xhi, yhi) : yhi;
    int clipped = top > ylo && yhi - top > 0.5 * (top - ylo); /* only a spike, not a curve's own top */
    frame f = {make_axis(xlo, xhi, 8), make_axis(ylo, clipped ? top : yhi, 7), x0 + LP_L, x1 - LP_R, y0 + LP_T,
               y1 - LP_B};
    if (p->title && p->title[0]) {
        nb_sbuf_printf(b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"13\" font-weight=\"bold\">",
                       (f.x0 + f.x1) / 2, f.y0 - 8);
        put_text(b, p->title);
        if (clipped) nb_sbuf_printf(b, " (first steps clipped: up to %.4g)", yhi);
        nb_sbuf_puts(b, "</text>\n");
    }
    draw_axes(b, &f, p->xlabel, p->ylabel);
    const char **colors = nb_calloc((size_t)p->nseries + 1, sizeof *colors, "plot colours");
    for (int k = 0; k < p->nseries; k++) {
        colors[k] = p->series[k].color ? p->series[k].color : nb_svg_color(k);
        draw_series(b, &f, &p->series[k], colors[k]);
    }
    if (!(dxlo <= dxhi))
        nb_sbuf_printf(b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"#999\">no data yet</text>\n",
                       (f.x0 + f.x1) / 2, (f.y0 + f.y1) / 2);
    if (legend) draw_legend(b, &f, p->nseries, p->series, colors);
    free(colors);
}

void nb_svg_line_plot(const char *path, const char *title, const char *xlabel, const char *ylabel,
                      const nb_svg_series *series, int nseries) {
    check_series(path, series, nseries);
    nb_svg_panel p = {NULL, xlabel, ylabel, series, nseries, 0};
    nb_sbuf b = {0};
    double xlo, xhi, ylo, yhi;
    data_range(nseries, series, &xlo, &xhi, &ylo, &yhi);
    svg_open(&b, LP_W, LP_H, title);
    draw_plot(&b, 0, 0, LP_W, LP_H, &p, xlo, xhi, nseries > 0);
    svg_close_and_write(&b, path);
}

void nb_svg_panels(const char *path, const char *title, const nb_svg_panel *panels, int npanels) {
    NB_CHECK(npanels > 0 && panels, BUG_HINT, "no panels for '%s'", path);
    for (int i = 0; i < npanels; i++) check_series(path, panels[i].series, panels[i].nseries);
    int cols = npanels < PN_COLS ? npanels : PN_COLS, rows = (npanels + cols - 1) / cols, top = 30;
    double xlo = INFINITY, xhi = -INFINITY, ylo, yhi;
    for (int i = 0; i < npanels; i++) {
        double a, z;
        data_range(panels[i].nseries, panels[i].series, &a, &z, &ylo, &yhi);
        xlo = fmin(xlo, a), xhi = fmax(xhi, z);
    }
    nb_sbuf b = {0};
    svg_open(&b, cols * PN_W, top + rows * PN_H, title);
    for (int i = 0; i < npanels; i++) {
        double x0 = (i % cols) * PN_W, y0 = top + (i / cols) * PN_H;
        draw_plot(&b, x0, y0, x0 + PN_W, y0 + PN_H, &panels[i], xlo, xhi, panels[i].nseries > 1);
    }
    svg_close_and_write(&b, path);
}

/* ------------------------------------------------------------------ timeline */

enum { TL_W = 1400, TL_ROW = 26, TL_T = 40, TL_B = 50, TL_R = 25 };

/* The colour key: swatches and labels in rows under the time axis, starting at y. */
static double key_rows(const nb_svg_key *keys, int nkeys, double x0, double x1, double y, nb_sbuf *b) {
    double x = x0;
    int any = 0;
    for (int i = 0; i < nkeys; i++) {
        double w = 22 + text_width(keys[i].label, 12) + 18;
        if (any && x + w > x1) x = x0, y += 20;
        if (b) {
            nb_sbuf_printf(b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"14\" height=\"12\" fill=\"%s\"/>\n<text x=\"%.1f\" "
                              "y=\"%.1f\">", x, y - 10, palette[pal_index(keys[i].color_index)], x + 19, y);
            put_text(b, keys[i].label);
            nb_sbuf_puts(b, "</text>\n");
        }
        x += w, any = 1;
    }
    return any ? y + 20 : y;
}

void nb_svg_timeline(const char *path, const char *title, int nrows, const char *const *row_names,
                     int nboxes, const nb_svg_box *boxes, int nkeys, const nb_svg_key *keys) {
    NB_CHECK(nrows >= 0 && nboxes >= 0 && (nboxes == 0 || boxes), BUG_HINT, "bad timeline input for '%s'", path);
    NB_CHECK(nkeys >= 0 && (nkeys == 0 || keys), BUG_HINT, "bad colour key for '%s'", path);
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
    double key_y = f.y1 + TL_B + 6;
    int h = nkeys ? (int)key_rows(keys, nkeys, f.x0, f.x1, key_y, NULL) : (int)f.y1 + TL_B;
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
    nb_sbuf_printf(&b, "</g>\n<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">time (\xC2\xB5s)</text>\n",
                   (f.x0 + f.x1) / 2, f.y1 + TL_B - 10);
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
    key_rows(keys, nkeys, f.x0, f.x1, key_y, &b);
    svg_close_and_write(&b, path);
}
