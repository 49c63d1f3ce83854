/* Tiny kernels for the lanes tests (tests/test_lanes_cuda.c, tests/test_lanes_graph.c): they make
 * ordering and timing observable on the GPU. Single-thread kernels; `stream` is a cudaStream_t. */
#ifndef NB_LANES_CUDA_TESTKERN_H
#define NB_LANES_CUDA_TESTKERN_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Spin for ns nanoseconds of the GPU's global timer. */
void nb_lanes_testkern_spin(void *stream, uint64_t ns);
/* Spin for spin_ns, then *dst = value. */
void nb_lanes_testkern_store(void *stream, int *dst, int value, uint64_t spin_ns);
/* *dst = *src (read through a volatile pointer, so it sees the value at run time). */
void nb_lanes_testkern_copy(void *stream, int *dst, const int *src);
/* values[id] = nb_lanes_dag_step(values, id, deps, ndeps, seed) after spinning spin_ns: the same
 * function as the host reference in the tests (ndeps <= 4). */
void nb_lanes_testkern_dag(void *stream, uint64_t *values, int id, const int deps[4], int ndeps,
                           uint64_t seed, uint64_t spin_ns);

#ifdef __cplusplus
}
#endif

/* The DAG test's task function: mixes the task's previous value, its id and its dependencies'
 * current values (splitmix64 finalizer), so replays accumulate and any misordering shows. */
#ifdef __CUDACC__
#define NB_LANES_HD __host__ __device__
#else
#define NB_LANES_HD
#endif
NB_LANES_HD static inline uint64_t nb_lanes_dag_step(const uint64_t *values, int id,
                                                     const int *deps, int ndeps, uint64_t seed) {
    uint64_t v = values[id] ^ (seed * 0x100000001B3ull + (uint64_t)id);
    for (int k = 0; k <= ndeps; k++) {
        if (k) v ^= values[deps[k - 1]] + (uint64_t)k;
        v += 0x9E3779B97F4A7C15ull;
        v = (v ^ (v >> 30)) * 0xBF58476D1CE4E5B9ull;
        v = (v ^ (v >> 27)) * 0x94D049BB133111EBull;
        v ^= v >> 31;
    }
    return v;
}

#endif
