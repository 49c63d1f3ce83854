/* timeline.svg: the spans a run recorded (one step, usually) as lanes x time, drawn with
 * io/svg.h. Shared by the schedules so every run directory shows the same picture. */
#ifndef NB_TIMELINE_H
#define NB_TIMELINE_H

#include "lanes/lanes.h"

/* Draws every recorded span of L: one row per lane, time in microseconds from the first span.
 * Colour: forward and backward spans of segment k ("S<k>" or a trailing " k" in the span name,
 * else 0)
 * get palette colours 2k and 2k+1, optimizer spans 8, the rest 9; the label is the span name. */
void nb_timeline_write(nb_lanes *L, const char *path, const char *title);

#endif
