/* Host AdamW at memory speed: the formula of nb_adamw_apply (optim/adamw.c), vectorized with
 * AVX2 or AVX-512 (picked at run time from what the CPU offers) and split over OpenMP threads,
 * with the bf16 copy of the new params written in the same pass (as the CUDA backend does).
 *
 * Bitwise contract: for every n, pointer alignment, thread count and ISA, params/m/v are the
 * bits nb_adamw_apply gives and params_bf16[i] == nb_bf16_from_f32(params[i]). The vector code
 * does the reference's operations in the reference's order (mul, add, sub, sqrt, div: each
 * correctly rounded in IEEE fp32, no FMA), so only the instruction width differs. One thing C
 * leaves open: when two NaNs with different payloads meet in one add or multiply (a NaN
 * gradient arriving on state that is already NaN), which payload survives is the compiler's
 * choice of operand order, in adamw.c as much as here; the result is NaN either way, and the
 * bf16 copy (every NaN is 0x7fff there) is still bitwise. */
#ifndef NB_ADAMW_HOST_H
#define NB_ADAMW_HOST_H

#include "optim/optim.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* float -> bf16 bits, round to nearest even: CUDA's __float2bfloat16_rn (cuda_bf16.hpp), the
 * cast the CUDA backend's AdamW uses for its bf16 copy. Overflow rounds to infinity, subnormals
 * are rounded, not flushed (which is why the vector code does this in integer arithmetic rather
 * than with AVX512-BF16's vcvtneps2bf16: that one flushes subnormal inputs to zero). A NaN
 * becomes 0x7fff, what that header's software path returns; on sm_80+ the cast is the
 * cvt.rn.bf16.f32 instruction, whose NaN bits have not been checked against this (the CUDA
 * tests' helpers keep the sign and payload instead, (u >> 16) | 0x40): only NaN params can
 * differ. */
static inline uint16_t nb_bf16_from_f32(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* One AdamW step over n elements from prepared scalars (nb_adamw_prepare), each gradient first
 * multiplied by grad_scale when grad_scale < 1, as nb_adamw_apply does. params_bf16 may be
 * NULL (no copy). threads <= 0: OpenMP's current maximum; small n runs on one thread (the
 * fork/join would cost more than the loop). The arrays must not overlap each other. */
void nb_adamw_host_apply(float *params, const float *grads, float *m, float *v, uint16_t *params_bf16, size_t n,
                         const nb_adamw_scalars *k, float grad_scale, int threads);

/* Which code path nb_adamw_host_apply takes: "scalar" (the reference loop, compiled for the
 * baseline ISA), "avx2", "avx512", or "auto" (the widest the CPU and OS support; the default,
 * used when nothing was forced).
 * Returns 0, or -1 (nothing changed) when the name is unknown or the CPU lacks that ISA. */
int nb_adamw_host_force(const char *isa);
/* 1 if this CPU (and its OS) can run the named path, else 0. */
int nb_adamw_host_supported(const char *isa);
/* The path the next nb_adamw_host_apply takes: "scalar", "avx2" or "avx512". */
const char *nb_adamw_host_isa(void);

#ifdef __cplusplus
}
#endif
#endif
