/* exp for loops that the compiler vectorizes: libm's expf is a call per element, so a loop around
 * it stays scalar; this one is plain float arithmetic (no calls, no tables), so a loop of it
 * becomes SIMD code at whatever width the function is compiled for.
 *
 * Cody-Waite range reduction (x = n ln2 + r, ln2 in two parts) and a degree-6 polynomial for
 * e^r on |r| <= ln2/2 (Cephes' expf coefficients), scaled by 2^n through the exponent bits:
 * within 1 ulp of the exact e^x on [-87.3, 88.7] (0.99 at worst over all 2.2e9 floats there;
 * tests/test_vmath.c checks a sample of them).
 * Below -87.33 (where e^x leaves the normal floats) it returns 0; above 88.72, +inf; NaN stays NaN.
 * The same bits at every vector width and on every x86-64: the build compiles C11 with
 * -ffp-contract=off (no fused multiply-adds), so each line is the same IEEE operations in the
 * same order whether a lane is SSE, AVX2 or AVX-512.
 * Only for loops that vectorize: one value at a time, glibc's expf (FMA, a table) is faster. */
#ifndef NB_VMATH_H
#define NB_VMATH_H

#include <math.h>
#include <stdint.h>

#define NB_EXPF_LO (-87.33654475f) /* ln(FLT_MIN): below it the result is 0 */
#define NB_EXPF_HI 88.72283905f    /* ln(FLT_MAX): above it, +inf */

/* A loop's function compiled for AVX-512, AVX2 and the baseline (x86-64-v2), the widest one this
 * CPU runs picked when the program loads (GNU ifunc). Put it on a function without an OpenMP
 * region (the region's outlined body would not be cloned): the parallel loop calls it per chunk. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__) &&         \
    !defined(__SANITIZE_ADDRESS__)
/* (not in sanitizer builds: an ifunc resolver runs before the sanitizer's runtime is up) */
#define NB_SIMD_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define NB_SIMD_CLONES
#endif

static inline float nb_expf(float x) {
    float n = floorf(x * 1.44269504088896341f + 0.5f); /* round(x / ln2) */
    float r = x - n * 0.693359375f;                    /* ln2's upper bits: exact product */
    r = r - n * -2.12194440e-4f;                       /* the rest of ln2 */
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    /* 2^n for n in [-126, 127] (a NaN n takes -126: p is NaN already); the clamp keeps the
     * conversion to int defined */
    float nc = n > -126.0f ? n : -126.0f;
    nc = nc < 127.0f ? nc : 127.0f;
    union {
        int32_t i;
        float f;
    } scale = {.i = ((int32_t)nc + 127) << 23};
    float y = p * scale.f * (n > 127.0f ? 2.0f : 1.0f); /* n = 128: x in (88.38, 88.72] */
    y = x < NB_EXPF_LO ? 0.0f : y;
    return x > NB_EXPF_HI ? INFINITY : y;
}

#endif
