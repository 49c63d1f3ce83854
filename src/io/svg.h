/* SVG plots drawn by nobubble itself (no plotting library): loss curves and lane timelines.
 * Files are written atomically; all text is XML-escaped, so any names make a valid file.
 *
 * Line plot (loss.svg): x/y axes with "nice" ticks (1, 2, 5 x 10^k), a legend, one polyline per
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

typedef struct {
    int row;            /* 0 .. nrows-1 */
    double t0_us, t1_us; /* t1_us >= t0_us */
    int color_index;    /* category; palette colour color_index % 10 */
    const char *label;  /* may be NULL */
} nb_svg_box;

void nb_svg_timeline(const char *path, const char *title, int nrows, const char *const *row_names,
                     int nboxes, const nb_svg_box *boxes);

/* The palette colour for index i ("#4e79a7", ...), shared so other outputs can match it. */
const char *nb_svg_color(int i);

#ifdef __cplusplus
}
#endif
#endif
