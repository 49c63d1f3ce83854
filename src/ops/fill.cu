/* Seeded normal init on the GPU with the host's bits (nb_rng_fill_normal, core/rng.c).
 *
 * Why: a 70B model's seeded init is 70 billion Box-Muller draws in double; the host makes about
 * 50 million per second per core, so a 16-core machine spends minutes before step 1. The GPU
 * makes them in milliseconds, but its double log/sin/cos are not the host's libm: CUDA documents
 * at most 1 ulp (log) and 2 ulp (sin, cos) of error, glibc under 1 ulp, so the two doubles may
 * differ in their last few bits. After the double rounds to float that changes the float only when
 * the double lies next to a rounding boundary (halfway between two floats). Each thread therefore
 * also says whether its double lies within `margin` (relative; 2^-46, 64 ulps, by default) of a
 * boundary; those rare elements (about 1 in 2 million) are listed, and the host redraws them with
 * nb_rng_normal_at. Every other element's float is the host's: the host's and the device's
 * doubles are both within a few ulps of the true value, on the same side of every boundary.
 *
 * Same float arithmetic as the host: mean + std * x as two correctly rounded operations
 * (__fmul_rn, __fadd_rn: nvcc would otherwise contract them into one fma, which the host never
 * does); the uniform draws and the double products are single IEEE operations on both. */
#include "ops_cuda_common.cuh"
#include "rng.h"

#define THREADS 256

/* 1 when float rounding of y may differ between two doubles within margin * |y| of it: y lies
 * that close to a halfway point between floats (or is tiny enough for signs and subnormals to
 * matter). */
static __device__ __forceinline__ int near_boundary(double y, float f, double margin) {
    double a = fabs(y);
    if (a < 1e-30) return 1;
    double up = 0.5 * ((double)f + (double)nextafterf(f, INFINITY)); /* exact: 25 bits */
    double dn = 0.5 * ((double)f + (double)nextafterf(f, -INFINITY));
    double d = fmin(up - y, y - dn);
    return d <= margin * a;
}

static __device__ __forceinline__ void put(float *out, size_t j, double y, float mean, float std, double margin,
                                           uint32_t *flags, uint32_t cap, unsigned int *count) {
    float f = __double2float_rn(y);
    out[j] = __fadd_rn(mean, __fmul_rn(std, f));
    if (near_boundary(y, f, margin)) {
        unsigned int k = atomicAdd(count, 1u); /* the order of the list does not matter: each is redrawn */
        if (k < cap) flags[k] = (uint32_t)j;
    }
}

/* Elements [first, first + len) of the sequence into out[0, len); first even, so each thread
 * makes one Box-Muller pair as the host's fill does. */
static __global__ void fill_normal_kernel(float *out, size_t first, size_t len, uint64_t seed, uint64_t stream, float mean,
                                          float std, double margin, uint32_t *flags, uint32_t cap, unsigned int *count) {
    size_t pairs = (len + 1) / 2, p0 = first / 2;
    NB_GRID_STRIDE(q, pairs) {
        nb_u32x4 r = nb_philox(seed, stream, p0 + q);
        double u1 = ((double)r.v[0] + 1.0) / 4294967296.0; /* as nb_rng_normal_at */
        double u2 = (double)r.v[1] / 4294967296.0;
        double rad = sqrt(-2.0 * log(u1)), ang = 6.283185307179586476925 * u2;
        double s, c;
        sincos(ang, &s, &c);
        put(out, 2 * q, rad * c, mean, std, margin, flags, cap, count);
        if (2 * q + 1 < len) put(out, 2 * q + 1, rad * s, mean, std, margin, flags, cap, count);
    }
}

extern "C" void nb_cuda_fill_normal(float *out, size_t first, size_t len, uint64_t seed, uint64_t stream, float mean,
                                    float std, double margin, uint32_t *flags, uint32_t cap, unsigned int *count,
                                    nb_stream_t s) {
    NB_CHECK(first % 2 == 0 && len < ((size_t)1 << 32), "fill in chunks that start at an even element, under 2^32 each",
             "nb_cuda_fill_normal: first %zu, len %zu", first, len);
    if (!len) return;
    size_t pairs = (len + 1) / 2, blocks = (pairs + THREADS - 1) / THREADS;
    fill_normal_kernel<<<(unsigned)(blocks < 65535 * 16 ? blocks : 65535 * 16), THREADS, 0, s>>>(
        out, first, len, seed, stream, mean, std, margin, flags, cap, count);
    CUDA_CHECK_LAUNCH("fill_normal_kernel");
}
