#include "rng.h"

/* Counter-based: element i depends on (seed, stream, i) alone, so threads give the same bits
 * (a 14B-parameter model takes minutes to initialize on one core). */
void nb_rng_fill_normal(float *out, size_t n, uint64_t seed, uint64_t stream, float mean, float std) {
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++) out[i] = mean + std * nb_rng_normal_at(seed, stream, i);
}

void nb_rng_fill_uniform(float *out, size_t n, uint64_t seed, uint64_t stream, float lo, float hi) {
    for (size_t i = 0; i < n; i += 4) {
        nb_u32x4 r = nb_philox(seed, stream, i / 4);
        for (size_t j = 0; j < 4 && i + j < n; j++)
            out[i + j] = lo + (hi - lo) * (nb_u32_to_unit(r.v[j]) - 0.5f / 16777216.0f);
    }
}

uint64_t nb_rng_stream_id(const char *name) {
    uint64_t h = 1469598103934665603ull;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
        h ^= *p;
        h *= 1099511628211ull;
    }
    return h;
}
