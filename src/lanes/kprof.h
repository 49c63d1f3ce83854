/* The device's own account of a run's steps: every kernel, memset and copy the GPU ran in a
 * window of steps, with its time, from CUPTI's activity records (the same records Nsight Systems
 * reads). Replayed graphs are counted node by node, so the table shows what a step is made of
 * and where the device sat idle between launches.
 *
 * CUPTI is opened with dlopen when a run asks for the table (`train --kernel-table`), never
 * linked: a machine without it trains as before and says why there is no table. Recording is on
 * from nb_kprof_open (before any graph is captured: CUPTI sees a graph's kernels only if it was
 * on when the graph was made); only work that started inside the window is counted.
 *
 *   nb_kprof_open(why, cap)     before the first step; 0 (and why) when CUPTI cannot be used
 *   nb_kprof_mark_begin()       after the sync that ends the last step outside the window
 *   nb_kprof_mark_end()         after the sync of each step inside it (the last call counts)
 *   nb_kprof_report(f, steps)   the table, per step, over `steps` steps; closes the recorder */
#ifndef NB_KPROF_H
#define NB_KPROF_H

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

int nb_kprof_open(char *why, size_t cap);
void nb_kprof_mark_begin(void);
void nb_kprof_mark_end(void);
void nb_kprof_report(FILE *f, int steps, int rows);

#ifdef __cplusplus
}
#endif
#endif
