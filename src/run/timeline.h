/* timeline.svg: the spans a run recorded (one step, usually) as lanes x time, drawn with
 * io/svg.h. Shared by the schedules so every run directory shows the same picture. */
#ifndef NB_TIMELINE_H
#define NB_TIMELINE_H

#include "lanes/lanes.h"

/* Draws the recorded spans of L that overlap step `step` (from the first span of that step to the
 * end of its last; spans of neighbouring steps inside that window too, such as the previous
 * step's optimizer under this step's forward), or every span when step < 0: one row per lane,
 * time in microseconds from the first span drawn.
 * Colour: forward and backward spans of segment k ("S<k>" or a trailing " k" in the span name,
 * else 0)
 * get palette colours 2k and 2k+1, optimizer spans 8, the rest 9; the label is the span name. */
void nb_timeline_write(nb_lanes *L, int step, const char *path, const char *title);

/* The same picture from a Chrome trace written by --trace (any step of the run, 0-based here);
 * title NULL: the run the trace names and the step. Returns the spans read. Fails with a hint on
 * a file that is not such a trace or lacks the step. */
int nb_timeline_from_trace(const char *trace, int step, const char *path, const char *title);

#endif
