/* Counter-based RNG (Philox4x32-10, Salmon et al. 2011), keyed by (seed, stream) and indexed by
 * a counter offset. A draw is a pure function of (seed, stream, offset): CPU and CUDA code that
 * include this header produce the same numbers, any thread can draw any element without shared
 * state, and a checkpoint only has to store the seed and the step. */
#ifndef NB_RNG_H
#define NB_RNG_H

#include <stddef.h>
#include <stdint.h>

#ifdef __CUDACC__
#define NB_HD __host__ __device__ __forceinline__
#else
#define NB_HD static inline
#endif

typedef struct { uint32_t v[4]; } nb_u32x4;

NB_HD uint32_t nb_mulhilo32(uint32_t a, uint32_t b, uint32_t *hi) {
    uint64_t p = (uint64_t)a * (uint64_t)b;
    *hi = (uint32_t)(p >> 32);
    return (uint32_t)p;
}

/* Counter = (offset lo, offset hi, stream lo, stream hi); key = seed. 10 rounds. */
NB_HD nb_u32x4 nb_philox(uint64_t seed, uint64_t stream, uint64_t offset) {
    uint32_t c0 = (uint32_t)offset, c1 = (uint32_t)(offset >> 32);
    uint32_t c2 = (uint32_t)stream, c3 = (uint32_t)(stream >> 32);
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int r = 0; r < 10; r++) {
        uint32_t hi0, hi1;
        uint32_t lo0 = nb_mulhilo32(0xD2511F53u, c0, &hi0);
        uint32_t lo1 = nb_mulhilo32(0xCD9E8D57u, c2, &hi1);
        uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
        c0 = n0; c1 = n1; c2 = n2; c3 = n3;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    nb_u32x4 out = {{c0, c1, c2, c3}};
    return out;
}

/* Uniform in (0, 1]: never 0, so log() is safe. 24 bits of mantissa. */
NB_HD float nb_u32_to_unit(uint32_t x) { return ((float)(x >> 8) + 1.0f) * (1.0f / 16777216.0f); }

/* Element i of a standard normal sequence (Box-Muller on one Philox block per pair of elements).
 * Computed in double so the CPU and GPU agree bit for bit after rounding to float. */
#ifdef __CUDACC__
__host__ __device__
#else
static inline
#endif
float nb_rng_normal_at(uint64_t seed, uint64_t stream, uint64_t i);

#ifndef NB_RNG_NO_IMPL
#include <math.h>
#ifdef __CUDACC__
__host__ __device__
#else
static inline
#endif
float nb_rng_normal_at(uint64_t seed, uint64_t stream, uint64_t i) {
    nb_u32x4 r = nb_philox(seed, stream, i >> 1);
    double u1 = ((double)r.v[0] + 1.0) / 4294967296.0; /* (0, 1] */
    double u2 = (double)r.v[1] / 4294967296.0;         /* [0, 1) */
    double rad = sqrt(-2.0 * log(u1));
    double ang = 6.283185307179586476925 * u2;
    return (float)((i & 1) ? rad * sin(ang) : rad * cos(ang));
}
#endif

/* Host-side fills (src/core/rng.c). stream names the tensor (e.g. a hash of its name). */
void nb_rng_fill_normal(float *out, size_t n, uint64_t seed, uint64_t stream, float mean, float std);
void nb_rng_fill_uniform(float *out, size_t n, uint64_t seed, uint64_t stream, float lo, float hi);
/* A stable 64-bit stream id from a string (FNV-1a). */
uint64_t nb_rng_stream_id(const char *name);

#endif
