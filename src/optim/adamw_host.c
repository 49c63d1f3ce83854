/* Host AdamW: nb_adamw_apply's formula with AVX2 / AVX-512, chosen at run time, over OpenMP
 * threads. See adamw_host.h for the contract (bitwise equal to the scalar reference).
 *
 * Why the bits match: every operation of the reference (mul, add, sub, sqrtf, '/') is an IEEE
 * fp32 operation rounded to nearest, and the packed instructions (vmulps, vaddps, vsubps,
 * vsqrtps, vdivps) round each lane exactly as the scalar ones do, under the same MXCSR. What
 * could break it is a fused multiply-add: FMA rounds once where the reference rounds twice.
 * x86-64-v2 (the Makefile's baseline, which adamw.c is built for) has no FMA, so the reference
 * never fuses; the AVX2 path is compiled for "avx2" alone (no "fma"), so it cannot fuse either;
 * AVX-512F does include FMA, and GCC's _mm512_mul_ps / _mm512_add_ps are plain vector '*' and
 * '+' that it is free to contract under -ffp-contract=fast (the GNU C default; -std=c11 turns
 * it off). The pragma below keeps contraction off in this file whatever the flags say; it comes
 * before the includes so the always-inline intrinsics get the same setting as their callers. */
#pragma GCC optimize("fp-contract=off")

#include "optim/adamw_host.h"

#include "core.h"

#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#define NB_ADAMW_X86 1
#include <immintrin.h>
#else
#define NB_ADAMW_X86 0
#endif

/* Below this many elements one thread does it all: the fork/join costs more than the loop
 * (the same cut as adamw.c's OPTIM_PAR_MIN). */
#define ADAMW_HOST_PAR_MIN 32768
/* Thread chunks start on this many bytes of params, so two threads never write the same cache
 * line (no false sharing) and each vector loop runs on aligned lines. */
#define ADAMW_HOST_CHUNK_ALIGN 64

enum { ISA_UNSET = -1, ISA_SCALAR = 0, ISA_AVX2 = 1, ISA_AVX512 = 2, ISA_COUNT = 3 };
static const char *const isa_names[ISA_COUNT] = {"scalar", "avx2", "avx512"};

/* Elements [i0, i1) of one step; every path has this shape so the dispatcher and the thread
 * split are shared. */
typedef void adamw_range_fn(float *params, const float *grads, float *m, float *v, uint16_t *lp, size_t i0,
                            size_t i1, const nb_adamw_scalars *k, float grad_scale);

/* ---- scalar: nb_adamw_apply's loop body, operation for operation ---- */

static inline __attribute__((always_inline)) void adamw_one(float *params, const float *grads, float *m, float *v,
                                                           uint16_t *lp, size_t i, const nb_adamw_scalars *k,
                                                           float grad_scale, int clip) {
    float g = clip ? grads[i] * grad_scale : grads[i];
    float p = params[i] * k->decay;
    float mi = m[i] + k->w1 * (g - m[i]);
    float vi = v[i] * k->b2;
    vi = vi + (k->w2 * g) * g;
    float denom = sqrtf(vi) / k->bc2_sqrt + k->eps;
    p = p + (k->neg_step * mi) / denom;
    params[i] = p;
    m[i] = mi;
    v[i] = vi;
    if (lp) lp[i] = nb_bf16_from_f32(p);
}

static void range_scalar(float *params, const float *grads, float *m, float *v, uint16_t *lp, size_t i0, size_t i1,
                         const nb_adamw_scalars *k, float grad_scale) {
    const int clip = grad_scale < 1.0f;
    /* two loops, so the one without the copy has no store under a condition and gcc vectorizes
     * it for the baseline ISA (SSE) as it does adamw.c's loop: the same bits, 2x faster (the
     * loop with the copy stays scalar: gcc sees control flow in it) */
    if (lp)
        for (size_t i = i0; i < i1; i++) adamw_one(params, grads, m, v, lp, i, k, grad_scale, clip);
    else
        for (size_t i = i0; i < i1; i++) adamw_one(params, grads, m, v, NULL, i, k, grad_scale, clip);
}

#if NB_ADAMW_X86

/* ---- AVX2: 8 lanes; head (to 32-byte alignment of params) and tail go through adamw_one ---- */

#define NB_AVX2 __attribute__((target("avx2")))

/* nb_bf16_from_f32 on 8 lanes: add 0x7fff + lsb, keep the high half, NaN -> 0x7fff. */
static inline NB_AVX2 __m128i bf16_avx2(__m256 p) {
    const __m256i one = _mm256_set1_epi32(1), half = _mm256_set1_epi32(0x7fff);
    __m256i u = _mm256_castps_si256(p);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(half, lsb)), 16);
    __m256 nan = _mm256_cmp_ps(p, p, _CMP_UNORD_Q);
    r = _mm256_blendv_epi8(r, half, _mm256_castps_si256(nan));
    /* every lane is <= 0xffff, so the unsigned-saturating pack is a plain narrowing */
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

static NB_AVX2 void range_avx2(float *params, const float *grads, float *m, float *v, uint16_t *lp, size_t i0,
                               size_t i1, const nb_adamw_scalars *k, float grad_scale) {
    const int clip = grad_scale < 1.0f;
    int nt = 0;
    const __m256 decay = _mm256_set1_ps(k->decay), w1 = _mm256_set1_ps(k->w1), b2 = _mm256_set1_ps(k->b2);
    const __m256 w2 = _mm256_set1_ps(k->w2), neg_step = _mm256_set1_ps(k->neg_step);
    const __m256 bc2 = _mm256_set1_ps(k->bc2_sqrt), eps = _mm256_set1_ps(k->eps), scale = _mm256_set1_ps(grad_scale);
    size_t i = i0;
    for (; i < i1 && ((uintptr_t)(params + i) & 31); i++) adamw_one(params, grads, m, v, lp, i, k, grad_scale, clip);
    nt = lp && ((uintptr_t)(lp + i) & 15) == 0; /* streaming stores for the bf16 output, as range_avx512 */
    for (; i + 8 <= i1; i += 8) {
        __m256 g = _mm256_loadu_ps(grads + i);
        if (clip) g = _mm256_mul_ps(g, scale);
        __m256 m0 = _mm256_loadu_ps(m + i);
        __m256 p = _mm256_mul_ps(_mm256_loadu_ps(params + i), decay);
        __m256 mi = _mm256_add_ps(m0, _mm256_mul_ps(w1, _mm256_sub_ps(g, m0)));
        __m256 vi = _mm256_mul_ps(_mm256_loadu_ps(v + i), b2);
        vi = _mm256_add_ps(vi, _mm256_mul_ps(_mm256_mul_ps(w2, g), g));
        __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), bc2), eps);
        p = _mm256_add_ps(p, _mm256_div_ps(_mm256_mul_ps(neg_step, mi), denom));
        _mm256_storeu_ps(params + i, p);
        _mm256_storeu_ps(m + i, mi);
        _mm256_storeu_ps(v + i, vi);
        if (nt)
            _mm_stream_si128((__m128i *)(lp + i), bf16_avx2(p));
        else if (lp)
            _mm_storeu_si128((__m128i *)(lp + i), bf16_avx2(p));
    }
    for (; i < i1; i++) adamw_one(params, grads, m, v, lp, i, k, grad_scale, clip);
    if (nt) _mm_sfence();
}

/* ---- AVX-512: 16 lanes; head and tail as masked vectors (masked-off lanes are neither read
 * nor written, so a tail at the end of an allocation cannot fault) ---- */

#define NB_AVX512 __attribute__((target("avx512f")))

typedef struct {
    __m512 decay, w1, b2, w2, neg_step, bc2, eps, scale;
    int clip;
} adamw_v16;

static inline NB_AVX512 __attribute__((always_inline)) void step_avx512(float *params, const float *grads, float *m,
                                                                        float *v, uint16_t *lp, size_t i,
                                                                        __mmask16 mask, int nt, const adamw_v16 *c) {
    __m512 g = _mm512_maskz_loadu_ps(mask, grads + i);
    if (c->clip) g = _mm512_mul_ps(g, c->scale);
    __m512 m0 = _mm512_maskz_loadu_ps(mask, m + i);
    __m512 p = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, params + i), c->decay);
    __m512 mi = _mm512_add_ps(m0, _mm512_mul_ps(c->w1, _mm512_sub_ps(g, m0)));
    __m512 vi = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, v + i), c->b2);
    vi = _mm512_add_ps(vi, _mm512_mul_ps(_mm512_mul_ps(c->w2, g), g));
    __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vi), c->bc2), c->eps);
    p = _mm512_add_ps(p, _mm512_div_ps(_mm512_mul_ps(c->neg_step, mi), denom));
    _mm512_mask_storeu_ps(params + i, mask, p);
    _mm512_mask_storeu_ps(m + i, mask, mi);
    _mm512_mask_storeu_ps(v + i, mask, vi);
    if (lp) {
        /* nb_bf16_from_f32 on 16 lanes, narrowed by vpmovdw (AVX512F, no BW needed) */
        const __m512i one = _mm512_set1_epi32(1), half = _mm512_set1_epi32(0x7fff);
        __m512i u = _mm512_castps_si512(p);
        __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
        __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(half, lsb)), 16);
        r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(p, p, _CMP_UNORD_Q), half);
        if (nt)
            _mm256_stream_si256((__m256i *)(lp + i), _mm512_cvtepi32_epi16(r));
        else
            _mm512_mask_cvtepi32_storeu_epi16(lp + i, mask, r);
    }
}

static NB_AVX512 void range_avx512(float *params, const float *grads, float *m, float *v, uint16_t *lp, size_t i0,
                                   size_t i1, const nb_adamw_scalars *k, float grad_scale) {
    adamw_v16 c = {
        .decay = _mm512_set1_ps(k->decay), .w1 = _mm512_set1_ps(k->w1), .b2 = _mm512_set1_ps(k->b2),
        .w2 = _mm512_set1_ps(k->w2), .neg_step = _mm512_set1_ps(k->neg_step), .bc2 = _mm512_set1_ps(k->bc2_sqrt),
        .eps = _mm512_set1_ps(k->eps), .scale = _mm512_set1_ps(grad_scale), .clip = grad_scale < 1.0f,
    };
    size_t i = i0;
    /* head: up to 15 elements so params + i is 64-byte aligned (one cache line per vector) */
    size_t head = ((64 - ((uintptr_t)(params + i) & 63)) & 63) / sizeof(float);
    if (head > i1 - i) head = i1 - i;
    if (head) {
        step_avx512(params, grads, m, v, lp, i, (__mmask16)((1u << head) - 1u), 0, &c);
        i += head;
    }
    /* whole vectors write their bf16 output (32 bytes) with streaming stores when it is aligned:
     * the output is not read again here, so a plain store would first read each line in */
    int nt = lp && ((uintptr_t)(lp + i) & 31) == 0;
    for (; i + 16 <= i1; i += 16) step_avx512(params, grads, m, v, lp, i, (__mmask16)0xffff, nt, &c);
    if (i < i1) step_avx512(params, grads, m, v, lp, i, (__mmask16)((1u << (i1 - i)) - 1u), 0, &c);
    if (nt) _mm_sfence(); /* streaming stores are weakly ordered: done before the task says so */
}

static adamw_range_fn *const isa_fns[ISA_COUNT] = {range_scalar, range_avx2, range_avx512};

static int isa_supported(int isa) {
    /* __builtin_cpu_supports also checks (via XGETBV) that the OS saves the ymm/zmm state */
    __builtin_cpu_init();
    switch (isa) {
    case ISA_SCALAR: return 1;
    case ISA_AVX2: return __builtin_cpu_supports("avx2") != 0;
    case ISA_AVX512: return __builtin_cpu_supports("avx512f") != 0;
    default: return 0;
    }
}

#else /* not x86: only the reference loop */

static adamw_range_fn *const isa_fns[ISA_COUNT] = {range_scalar, range_scalar, range_scalar};
static int isa_supported(int isa) { return isa == ISA_SCALAR; }

#endif

/* ---- dispatch ---- */

static _Atomic int isa_chosen = ISA_UNSET;

static int isa_best(void) {
    for (int isa = ISA_COUNT - 1; isa > ISA_SCALAR; isa--)
        if (isa_supported(isa)) return isa;
    return ISA_SCALAR;
}

/* "auto" -> the best supported; a path name -> its index; unknown -> ISA_UNSET. */
static int isa_parse(const char *name) {
    if (!name) return ISA_UNSET;
    if (strcmp(name, "auto") == 0) return isa_best();
    for (int isa = 0; isa < ISA_COUNT; isa++)
        if (strcmp(name, isa_names[isa]) == 0) return isa;
    return ISA_UNSET;
}

static int isa_current(void) {
    int isa = atomic_load_explicit(&isa_chosen, memory_order_relaxed);
    if (isa != ISA_UNSET) return isa;
    /* First use: the best this CPU has (nb_adamw_host_force picks another). Two threads racing
     * here compute the same answer, so a plain store is enough. */
    isa = isa_best();
    atomic_store_explicit(&isa_chosen, isa, memory_order_relaxed);
    return isa;
}

int nb_adamw_host_force(const char *isa) {
    int want = isa_parse(isa);
    if (want == ISA_UNSET || !isa_supported(want)) return -1;
    atomic_store_explicit(&isa_chosen, want, memory_order_relaxed);
    return 0;
}

int nb_adamw_host_supported(const char *isa) {
    int want = isa_parse(isa);
    return want != ISA_UNSET && isa_supported(want);
}

const char *nb_adamw_host_isa(void) { return isa_names[isa_current()]; }

/* First element of thread t's chunk out of T: after a lead that brings params to a 64-byte
 * boundary, whole 64-byte blocks are dealt out evenly; thread 0 also takes the lead and the
 * last thread the final partial block. Written as q*t + r*t/T so blocks*t cannot overflow. */
static size_t chunk_start(const float *params, size_t n, int t, int T) {
    if (t <= 0) return 0;
    if (t >= T) return n;
    const size_t per_block = ADAMW_HOST_CHUNK_ALIGN / sizeof(float);
    size_t lead = ((ADAMW_HOST_CHUNK_ALIGN - ((uintptr_t)params % ADAMW_HOST_CHUNK_ALIGN)) % ADAMW_HOST_CHUNK_ALIGN) /
                  sizeof(float);
    if (lead >= n) return n;
    size_t blocks = (n - lead) / per_block, ut = (size_t)t, uT = (size_t)T;
    return lead + per_block * (blocks / uT * ut + blocks % uT * ut / uT);
}

void nb_adamw_host_apply(float *params, const float *grads, float *m, float *v, uint16_t *params_bf16, size_t n,
                         const nb_adamw_scalars *k, float grad_scale, int threads) {
    NB_ASSERT(k && (n == 0 || (params && grads && m && v)));
    if (n == 0) return;
    adamw_range_fn *fn = isa_fns[isa_current()];
#ifdef _OPENMP
    int nt = threads > 0 ? threads : omp_get_max_threads();
    if (n < ADAMW_HOST_PAR_MIN) nt = 1;
    if (nt > 1) {
#pragma omp parallel num_threads(nt)
        {
            /* the team may be smaller than asked (nested region, thread limit): split by what we got */
            int t = omp_get_thread_num(), T = omp_get_num_threads();
            size_t b = chunk_start(params, n, t, T), e = chunk_start(params, n, t + 1, T);
            if (b < e) fn(params, grads, m, v, params_bf16, b, e, k, grad_scale);
        }
        return;
    }
#endif
    fn(params, grads, m, v, params_bf16, 0, n, k, grad_scale);
}
