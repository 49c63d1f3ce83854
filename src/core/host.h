/* Facts about the host: memory, threads. */
#ifndef NB_HOST_H
#define NB_HOST_H
#include <stddef.h>
/* Bytes of host memory available now (MemAvailable), or 0 when unknown (= no budget); the run's
 * --host-mem-limit caps what a plan may use. */
size_t nb_host_mem_available(void);
/* Cores this process may run on: its CPU affinity mask (taskset, cgroups' cpusets), else the
 * online CPUs; at least 1. */
int nb_host_cores(void);
/* Threads for OpenMP and OpenBLAS; n <= 0 keeps the default (all cores). More threads than
 * cores only make the threads take turns (--threads 100000 ran 129 threads on 2 cores, 20x
 * slower): n is capped at nb_host_cores(), with one note on stderr the first time. Returns the
 * count used. */
int nb_host_set_threads(int n);
/* A launcher that pins each rank to one core (Open MPI's default for two ranks) leaves
 * nobubble's host lanes and OpenMP lists one core between them. When this process's mask holds
 * fewer cores than its even share of the node (online CPUs / local_size), widen it to that share
 * (cores local_rank * share .. + share - 1) before any thread starts; NB_KEEP_BINDING=1 keeps the
 * launcher's binding. Returns the cores now in the mask, or 0 when nothing changed. */
int nb_host_spread(int local_rank, int local_size);
/* Threads a parallel region started by the calling thread would get (1 without OpenMP). */
int nb_host_max_threads(void);
/* memcpy for a destination that is not read again soon (a gradient landing in host memory, a
 * staging slab a DMA reads): streaming stores on x86, which skip reading each destination line
 * in first (a third less memory traffic for a copy); memcpy elsewhere. Ordered (sfence) before
 * it returns. */
void nb_copy_stream(void *dst, const void *src, size_t bytes);
#endif
