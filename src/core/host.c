#include "host.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

void openblas_set_num_threads(int num_threads);

size_t nb_host_mem_available(void) {
    const char *env = getenv("NB_HOST_MEM_LIMIT");
    if (env && *env) return (size_t)strtoull(env, NULL, 10);
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

int nb_host_set_threads(int n) {
#ifdef _OPENMP
    if (n > 0) omp_set_num_threads(n);
    n = omp_get_max_threads();
#else
    if (n <= 0) n = 1;
#endif
    /* OpenBLAS keeps its own pool; give it the same count so the two never oversubscribe */
    openblas_set_num_threads(n);
    return n;
}
