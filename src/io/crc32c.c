#include "io/crc32c.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <smmintrin.h> /* SSE4.1 _mm_extract_epi64, SSE4.2 crc32 via nmmintrin */
#include <nmmintrin.h>
#endif

#define POLY 0x82F63B78u /* Castagnoli, bit-reflected */
#define LANE 8192        /* bytes per stream in the 3-stream loop */

static uint32_t slice[8][256];   /* slicing-by-8 */
static uint32_t x2n[32];         /* x^(2^k) mod P */
static uint32_t lane_shift[4][256]; /* multiply by x^(8 LANE) mod P, byte by byte */
static int have_sse42;
static pthread_once_t once = PTHREAD_ONCE_INIT;

/* a(x) b(x) mod P(x), reflected (zlib's multmodp). */
static uint32_t multmodp(uint32_t a, uint32_t b) {
    uint32_t m = 1u << 31, p = 0;
    for (;;) {
        if (a & m) {
            p ^= b;
            if ((a & (m - 1)) == 0) break;
        }
        m >>= 1;
        b = b & 1 ? (b >> 1) ^ POLY : b >> 1;
    }
    return p;
}

/* x^(8 n) mod P: the operator that appends n zero bytes to a CRC register. */
static uint32_t x8nmodp(size_t n) {
    uint32_t p = 1u << 31; /* x^0 */
    unsigned k = 3;        /* x^(2^3) = x^8: one byte */
    while (n) {
        if (n & 1) p = multmodp(x2n[k & 31], p);
        n >>= 1;
        k++;
    }
    return p;
}

static void init_tables(void) {
    for (uint32_t b = 0; b < 256; b++) {
        uint32_t c = b;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ POLY : c >> 1;
        slice[0][b] = c;
    }
    for (uint32_t b = 0; b < 256; b++)
        for (int t = 1; t < 8; t++) slice[t][b] = (slice[t - 1][b] >> 8) ^ slice[0][slice[t - 1][b] & 0xFF];
    uint32_t p = 1u << 30; /* x^1 */
    x2n[0] = p;
    for (int k = 1; k < 32; k++) x2n[k] = p = multmodp(p, p);
    uint32_t K = x8nmodp(LANE);
    for (int j = 0; j < 4; j++)
        for (uint32_t v = 0; v < 256; v++) lane_shift[j][v] = multmodp(K, v << (8 * j));
#if defined(__x86_64__)
    __builtin_cpu_init();
    have_sse42 = __builtin_cpu_supports("sse4.2");
#endif
}

static inline uint32_t shift_lane(uint32_t r) {
    return lane_shift[0][r & 0xFF] ^ lane_shift[1][(r >> 8) & 0xFF] ^ lane_shift[2][(r >> 16) & 0xFF] ^
           lane_shift[3][r >> 24];
}

/* Raw register update (no pre/post inversion), so pieces combine linearly. */
static uint32_t raw_portable(uint32_t r, const unsigned char *p, size_t n) {
    while (n && ((uintptr_t)p & 7)) r = (r >> 8) ^ slice[0][(r ^ *p++) & 0xFF], n--;
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t w;
        memcpy(&w, p, 8); /* little-endian hosts (x86-64, arm64), like the rest of nobubble */
        w ^= r;
        r = slice[7][w & 0xFF] ^ slice[6][(w >> 8) & 0xFF] ^ slice[5][(w >> 16) & 0xFF] ^
            slice[4][(w >> 24) & 0xFF] ^ slice[3][(w >> 32) & 0xFF] ^ slice[2][(w >> 40) & 0xFF] ^
            slice[1][(w >> 48) & 0xFF] ^ slice[0][w >> 56];
    }
    while (n--) r = (r >> 8) ^ slice[0][(r ^ *p++) & 0xFF];
    return r;
}

#if defined(__x86_64__)
/* dst NULL: checksum only; else also copy src to dst in the same pass (the loop waits on the
 * crc32 instruction's latency, so the loads and stores of the copy come nearly free). */
__attribute__((target("sse4.2"))) static uint32_t raw_sse42(uint32_t r, unsigned char *dst, const unsigned char *p,
                                                            size_t n) {
    while (n && ((uintptr_t)p & 7)) {
        if (dst) *dst++ = *p;
        r = _mm_crc32_u8(r, *p++), n--;
    }
    /* Three streams hide the instruction's latency; the second and third start from 0 and are
     * folded in by shifting the first over one lane's bytes: R(A B) = shift(R(A), |B|) ^ R(B). */
    while (n >= 3 * LANE) {
        uint64_t a = r, b = 0, c = 0, wa, wb, wc;
        if (!dst)
            for (size_t i = 0; i < LANE; i += 8) {
                memcpy(&wa, p + i, 8);
                memcpy(&wb, p + LANE + i, 8);
                memcpy(&wc, p + 2 * LANE + i, 8);
                a = _mm_crc32_u64(a, wa);
                b = _mm_crc32_u64(b, wb);
                c = _mm_crc32_u64(c, wc);
            }
        else /* 16-byte loads and stores: half the memory operations of 8-byte ones */
            for (size_t i = 0; i < LANE; i += 16) {
                __m128i va = _mm_loadu_si128((const __m128i *)(p + i));
                __m128i vb = _mm_loadu_si128((const __m128i *)(p + LANE + i));
                __m128i vc = _mm_loadu_si128((const __m128i *)(p + 2 * LANE + i));
                _mm_storeu_si128((__m128i *)(dst + i), va);
                _mm_storeu_si128((__m128i *)(dst + LANE + i), vb);
                _mm_storeu_si128((__m128i *)(dst + 2 * LANE + i), vc);
                a = _mm_crc32_u64(a, (uint64_t)_mm_cvtsi128_si64(va));
                b = _mm_crc32_u64(b, (uint64_t)_mm_cvtsi128_si64(vb));
                c = _mm_crc32_u64(c, (uint64_t)_mm_cvtsi128_si64(vc));
                a = _mm_crc32_u64(a, (uint64_t)_mm_extract_epi64(va, 1));
                b = _mm_crc32_u64(b, (uint64_t)_mm_extract_epi64(vb, 1));
                c = _mm_crc32_u64(c, (uint64_t)_mm_extract_epi64(vc, 1));
            }
        r = shift_lane(shift_lane((uint32_t)a) ^ (uint32_t)b) ^ (uint32_t)c;
        p += 3 * LANE;
        if (dst) dst += 3 * LANE;
        n -= 3 * LANE;
    }
    uint64_t a = r, w;
    for (; n >= 8; n -= 8, p += 8) {
        memcpy(&w, p, 8);
        a = _mm_crc32_u64(a, w);
        if (dst) memcpy(dst, &w, 8), dst += 8;
    }
    r = (uint32_t)a;
    while (n--) {
        if (dst) *dst++ = *p;
        r = _mm_crc32_u8(r, *p++);
    }
    return r;
}
#endif

uint32_t nb_crc32c_portable(uint32_t crc, const void *data, size_t n) {
    pthread_once(&once, init_tables);
    return ~raw_portable(~crc, data, n);
}

uint32_t nb_crc32c(uint32_t crc, const void *data, size_t n) {
    pthread_once(&once, init_tables);
#if defined(__x86_64__)
    if (have_sse42) return ~raw_sse42(~crc, NULL, data, n);
#endif
    return ~raw_portable(~crc, data, n);
}

uint32_t nb_crc32c_copy(uint32_t crc, void *dst, const void *src, size_t n) {
    pthread_once(&once, init_tables);
#if defined(__x86_64__)
    if (have_sse42) return ~raw_sse42(~crc, dst, src, n);
#endif
    if (n) memcpy(dst, src, n);
    return ~raw_portable(~crc, dst, n);
}

uint32_t nb_crc32c_combine(uint32_t crc_a, uint32_t crc_b, size_t len_b) {
    pthread_once(&once, init_tables);
    return multmodp(x8nmodp(len_b), crc_a) ^ crc_b;
}

uint32_t nb_crc32c_par(void *dst, const void *src, size_t n) {
    const size_t seg = (size_t)8 << 20;
    long nseg = (long)((n + seg - 1) / seg);
    if (nseg <= 1) return dst ? nb_crc32c_copy(0, dst, src, n) : nb_crc32c(0, src, n);
    uint32_t *part = malloc((size_t)nseg * sizeof *part);
    if (!part) return dst ? nb_crc32c_copy(0, dst, src, n) : nb_crc32c(0, src, n); /* one thread will do */
#pragma omp parallel for schedule(dynamic, 1)
    for (long i = 0; i < nseg; i++) {
        size_t o = (size_t)i * seg, k = n - o < seg ? n - o : seg;
        part[i] = dst ? nb_crc32c_copy(0, (char *)dst + o, (const char *)src + o, k) : nb_crc32c(0, (const char *)src + o, k);
    }
    uint32_t crc = part[0];
    for (long i = 1; i < nseg; i++) crc = nb_crc32c_combine(crc, part[i], n - (size_t)i * seg < seg ? n - (size_t)i * seg : seg);
    free(part);
    return crc;
}

const char *nb_crc32c_impl(void) {
    pthread_once(&once, init_tables);
    return have_sse42 ? "sse4.2" : "portable";
}
