/* bf16 <-> float on the host for the CUDA op tests: round to nearest even (as the kernels'
 * __float2bfloat16_rn), NaN kept quiet. */
#ifndef NB_TEST_BF16_HOST_H
#define NB_TEST_BF16_HOST_H

#include <stdint.h>
#include <string.h>

static inline uint16_t f2bf(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);                                            /* nearest even */
    return (uint16_t)(u >> 16);
}

static inline float bf2f(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

#endif
