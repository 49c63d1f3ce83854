#include "rng.h"

/* Counter-based: element i depends on (seed, stream, i) alone, so threads give the same bits
 * (a 14B-parameter model takes minutes to initialize on one core). Elements 2p and 2p + 1 share
 * one Philox block and one radius (nb_rng_normal_at's Box-Muller pair): made together, the pair
 * costs one block, one log and one sqrt instead of two of each, with nb_rng_normal_at's bits. */
void nb_rng_fill_normal(float *out, size_t n, uint64_t seed, uint64_t stream, float mean, float std) {
    size_t pairs = (n + 1) / 2;
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t p = 0; p < pairs; p++) {
        nb_u32x4 r = nb_philox(seed, stream, p);
        double u1 = ((double)r.v[0] + 1.0) / 4294967296.0; /* as nb_rng_normal_at */
        double u2 = (double)r.v[1] / 4294967296.0;
        double rad = sqrt(-2.0 * log(u1)), ang = 6.283185307179586476925 * u2;
        out[2 * p] = mean + std * (float)(rad * cos(ang));
        if (2 * p + 1 < n) out[2 * p + 1] = mean + std * (float)(rad * sin(ang));
    }
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
