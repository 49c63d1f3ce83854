/* SVG plots drawn by nobubble itself (no plotting library): loss curves and lane timelines.
 * Files are written atomically; all text is XML-escaped, so any names make a valid file.
 *
 * Line plot: x/y axes with "nice" ticks (1, 2, 5 x 10^k), a legend, one polyline per
 * series. Non-finite points (NaN, inf) are skipped and break the line; series with few points
 * also get a marker per point so a sparse validation curve stays visible.
 *
 * Timeline (timeline.svg): one row per lane, one box per span, coloured by category
 * (color_index into a fixed palette), labels drawn inside boxes wide enough for them and always
 * available as a hover tooltip (<title>); the time axis is in microseconds. */
#ifndef NB_SVG_H
#define NB_SVG_H

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const char *name;  /* legend text */
    const char *color; /* any SVG colour ("#1f77b4", "red"), or NULL for the palette */
    int n;
    const double *x, *y;
} nb_svg_series;

void nb_svg_line_plot(const char *path, const char *title, const char *xlabel, const char *ylabel,
                      const nb_svg_series *series, int nseries);

/* A grid of line plots (two columns) under one title: loss.svg's loss, learning rate, gradient
 * norm, throughput and held-out metrics side by side. `robust`: the y axis ends at the largest
 * value after the first tenth of the steps, so an early spike does not flatten the curve (the
 * clipped points sit on the top edge and the panel says so). */
typedef struct {
    const char *title, *xlabel, *ylabel;
    const nb_svg_series *series;
    int nseries;
    int robust;
} nb_svg_panel;

void nb_svg_panels(const char *path, const char *title, const nb_svg_panel *panels, int npanels);

typedef struct {
    int row;            /* 0 .. nrows-1 */
    double t0_us, t1_us; /* t1_us >= t0_us */
    int color_index;    /* category; palette colour color_index % 10 */
    const char *label;  /* may be NULL */
} nb_svg_box;

/* A colour key under the time axis: one swatch per entry (palette colour color_index % 10). */
typedef struct {
    int color_index;
    const char *label;
} nb_svg_key;

void nb_svg_timeline(const char *path, const char *title, int nrows, const char *const *row_names,
                     int nboxes, const nb_svg_box *boxes, int nkeys, const nb_svg_key *keys);

/* The palette colour for index i ("#4e79a7", ...), shared so other outputs can match it. */
const char *nb_svg_color(int i);

#ifdef __cplusplus
}
#endif
#endif
