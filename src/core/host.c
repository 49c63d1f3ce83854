#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#endif
#include "host.h"

#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#ifdef _OPENMP
#include <omp.h>
#endif

void openblas_set_num_threads(int num_threads);

size_t nb_host_mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    size_t kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %zu kB", &kb) == 1) break;
    fclose(f);
    return kb * 1024;
}

int nb_host_max_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

int nb_host_cores(void) {
    cpu_set_t set;
    CPU_ZERO(&set);
    /* Fails with EINVAL on hosts with more CPUs than a cpu_set_t holds (1024): count online ones. */
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

int nb_host_set_threads(int n) {
    static atomic_int noted;
    int cores = nb_host_cores();
    if (n > cores) {
        if (!atomic_exchange(&noted, 1))
            nb_log(1, "note: --threads %d capped at %d (the cores available)\n", n, cores);
        n = cores;
    }
#ifdef _OPENMP
    /* libgomp sized its default from the mask it saw at load; nb_host_spread may have widened it */
    const char *env = getenv("OMP_NUM_THREADS");
    if (n <= 0 && (!env || !*env)) n = cores;
    if (n <= 0 && omp_get_max_threads() > cores) n = cores; /* OMP_NUM_THREADS asked for more */
    if (n > 0) omp_set_num_threads(n);
    n = omp_get_max_threads();
#else
    if (n <= 0) n = 1;
#endif
    /* OpenBLAS keeps its own pool; give it the same count so the two never oversubscribe */
    openblas_set_num_threads(n);
    return n;
}

int nb_host_spread(int local_rank, int local_size) {
    const char *keep = getenv("NB_KEEP_BINDING");
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    if ((keep && *keep && strcmp(keep, "0") != 0) || local_size <= 0 || local_rank < 0 || online <= 0) return 0;
    int share = (int)(online / local_size), now = nb_host_cores();
    if (share <= now || share > CPU_SETSIZE) return 0;
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int c = local_rank * share; c < (local_rank + 1) * share && c < CPU_SETSIZE; c++) CPU_SET(c, &set);
    /* the kernel keeps only the CPUs the cgroup allows; EINVAL when none is left */
    if (sched_setaffinity(0, sizeof set, &set) != 0) return 0;
    int got = nb_host_cores();
    return got > now ? got : 0;
}

void nb_copy_stream(void *dst, const void *src, size_t bytes) {
#if defined(__x86_64__)
    char *d = dst;
    const char *s = src;
    size_t head = (16 - ((uintptr_t)d & 15)) & 15;
    if (bytes < 256 || head) { /* small or misaligned: not worth it (landings are page-aligned) */
        memcpy(d, s, bytes);
        return;
    }
    size_t n = bytes / 64 * 64;
    for (size_t i = 0; i < n; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(s + i)), b = _mm_loadu_si128((const __m128i *)(s + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + i + 32)), e = _mm_loadu_si128((const __m128i *)(s + i + 48));
        _mm_stream_si128((__m128i *)(d + i), a);
        _mm_stream_si128((__m128i *)(d + i + 16), b);
        _mm_stream_si128((__m128i *)(d + i + 32), c);
        _mm_stream_si128((__m128i *)(d + i + 48), e);
    }
    memcpy(d + n, s + n, bytes - n);
    _mm_sfence();
#else
    memcpy(dst, src, bytes);
#endif
}
