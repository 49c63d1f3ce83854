/* Host AdamW (optim/adamw_host.c) against the scalar reference nb_adamw_apply (optim/adamw.c):
 * every ISA this CPU has (scalar, AVX2, AVX-512) must give memcmp-identical params, m, v and
 * bf16 copy, for every n, every misalignment of the start pointers, thread counts 1, 3, 4 and
 * all, grad_scale below, at and above 1, weight decay 0 and > 0, over several steps in a row.
 * Data mixes zeros (both signs), subnormals, values near FLT_MIN, large values whose squares
 * overflow to inf, and ordinary ones; a second set puts inf/NaN inputs in (bitwise too while an
 * element sees one NaN payload; see test_bitwise_nan_mix for two). Guard floats around
 * every array must stay untouched (the masked head/tail stores), and grads must stay unchanged.
 * The bf16 rounding itself is checked against known answers.
 *
 * `test_adamw_host --bench` instead times each path at 1<<26 parameters next to this host's
 * memory bandwidth measured in the same program (see bench_main). */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "core.h"
#include "host.h"
#include "optim/adamw_host.h"
#include "optim/optim.h"
#include "rng.h"

#define SEED 20261201u
#define STEPS 3
#define GUARD 16                 /* floats of canary before and after every array */
#define CANARY_BITS 0x7fa5a5a5u  /* a NaN no computation produces */
#define CANARY_BF16 0xa5a5u

static const char *const ISAS[] = {"scalar", "avx2", "avx512"};
#define NISA 3
static int isa_on[NISA];
static const int THREADS[] = {1, 3, 4, 0}; /* 0: all (OpenMP's maximum) */
#define NTHREADS 4

static float bits_f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint32_t f_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* ---- data ---- */

/* DATA_NONFINITE puts its non-finite inputs in the starting state and the first step's grads;
 * DATA_NAN_MIX also in every later step's grads, so a new NaN payload meets the NaN state of
 * the steps before. */
enum { DATA_WIDE, DATA_NONFINITE, DATA_NAN_MIX };

/* Element i of array `stream`: a pseudo-random float drawn from a mix of magnitudes.
 * positive: for v (a second moment is never negative). */
static float wide_value(uint64_t stream, uint64_t i, int positive) {
    nb_u32x4 r = nb_philox(SEED, stream, i);
    float sign = (!positive && (r.v[1] & 1u)) ? -1.0f : 1.0f;
    float unit = nb_u32_to_unit(r.v[2]); /* (0, 1] */
    switch (r.v[0] % 16u) {
    case 0: return sign * 0.0f;                                                       /* +-0 */
    case 1: return sign * bits_f(r.v[3] & 0x007fffffu);                               /* subnormal */
    case 2: return sign * ldexpf(unit, -120 - (int)(r.v[3] % 8u));                    /* near FLT_MIN */
    case 3: return sign * ldexpf(unit, 40 + (int)(r.v[3] % 25u));                     /* up to 2^64 */
    case 4: return sign * ldexpf(unit, 100 + (int)(r.v[3] % 28u));                    /* g^2 overflows */
    default: return sign * ldexpf(unit, -(int)(r.v[3] % 24u));                        /* 2^-24 .. 1 */
    }
}

/* Moderate finite values, except that with probability 1/8 one of the four inputs of the element
 * (which) is +-inf or a NaN with a random payload. Only one input is non-finite and the others
 * cannot overflow, so each element has at most one NaN payload in flight (NaNs made by invalid
 * operations, inf - inf and the like, all have the same bits): the NaN that comes out does not
 * depend on the operand order the compiler picked for a commutative add or multiply (x86 returns
 * the first operand's payload when both are NaN). bad = 0: finite only. */
static float nonfinite_value(uint64_t stream, uint64_t i, int which, int positive, int bad) {
    nb_u32x4 r = nb_philox(SEED + 1, stream, i);
    nb_u32x4 e = nb_philox(SEED + 2, 0, i); /* per element, shared by the four arrays */
    float sign = (!positive && (r.v[1] & 1u)) ? -1.0f : 1.0f;
    if (bad && e.v[0] % 8u == 0 && (int)(e.v[1] % 4u) == which) {
        switch (r.v[2] % 3u) {
        case 0: return sign * INFINITY;
        case 1: return bits_f((r.v[1] & 0x80000000u) | 0x7f800000u | (r.v[3] & 0x7fffffu) | 1u); /* NaN, quiet or not */
        default: return bits_f(0x7fc00000u | (r.v[3] & 0x3fffffu));
        }
    }
    return sign * ldexpf(nb_u32_to_unit(r.v[3]), -(int)(r.v[0] % 12u));
}

enum { ARR_P, ARR_G, ARR_M, ARR_V };
static float value(int kind, int arr, int step, uint64_t i) {
    uint64_t stream = (uint64_t)arr * 16u + (arr == ARR_G ? (uint64_t)step : 0u);
    if (kind == DATA_WIDE) return wide_value(stream, i, arr == ARR_V);
    int bad = kind == DATA_NAN_MIX || arr != ARR_G || step == 0;
    return nonfinite_value(stream, i, arr, arr == ARR_V, bad);
}

/* ---- buffers with guards ---- */

/* n floats at float offset off (0..15) past a 64-byte boundary, with GUARD canary floats on
 * each side of the data. */
typedef struct {
    float *base, *x;
    size_t n;
} gbuf;

static gbuf gbuf_new(size_t n, int off, const char *what) {
    gbuf b;
    b.n = n;
    b.base = nb_aligned_alloc((n + 2 * GUARD + 16) * sizeof(float), what);
    b.x = b.base + GUARD + off; /* GUARD = 16 floats = 64 bytes: off sets the misalignment */
    return b;
}

static void gbuf_fill_canary(gbuf *b) {
    size_t total = b->n + 2 * GUARD + 16;
    for (size_t i = 0; i < total; i++) b->base[i] = bits_f(CANARY_BITS);
}

static int gbuf_guards_ok(const gbuf *b) {
    for (float *q = b->base; q < b->x; q++)
        if (f_bits(*q) != CANARY_BITS) return 0;
    for (float *q = b->x + b->n; q < b->x + b->n + GUARD; q++)
        if (f_bits(*q) != CANARY_BITS) return 0;
    return 1;
}

/* ---- known answers for the bf16 rounding ---- */

TEST_CASE(test_bf16_rounding) {
    struct { uint32_t in; uint16_t out; } kat[] = {
        {0x3f800000u, 0x3f80u}, /* 1.0 */
        {0x3f808000u, 0x3f80u}, /* halfway, even below: stays */
        {0x3f818000u, 0x3f82u}, /* halfway, odd below: up to even */
        {0x3f808001u, 0x3f81u}, /* just above halfway: up */
        {0x3f807fffu, 0x3f80u}, /* just below halfway: down */
        {0xbf818000u, 0xbf82u}, /* negative: same rule on the magnitude */
        {0x7f7fffffu, 0x7f80u}, /* FLT_MAX rounds to inf */
        {0x7f800000u, 0x7f80u}, /* inf */
        {0xff800000u, 0xff80u}, /* -inf */
        {0x80000000u, 0x8000u}, /* -0 */
        {0x00018000u, 0x0002u}, /* subnormal halfway, odd: up (not flushed) */
        {0x00008000u, 0x0000u}, /* subnormal halfway, even: down */
        {0x00000001u, 0x0000u}, /* smallest subnormal */
        {0x007fffffu, 0x0080u}, /* largest subnormal rounds to FLT_MIN */
        {0x7fc00000u, 0x7fffu}, /* quiet NaN -> CUDA's canonical 0x7fff */
        {0xffc00001u, 0x7fffu}, /* negative NaN */
        {0x7f800001u, 0x7fffu}, /* signalling NaN (rounding would have made it inf) */
        {0x7fffffffu, 0x7fffu}, /* (rounding would have carried into the sign) */
    };
    for (size_t i = 0; i < sizeof kat / sizeof kat[0]; i++) {
        uint16_t got = nb_bf16_from_f32(bits_f(kat[i].in));
        CHECK(got == kat[i].out, "bf16(%08x) = %04x, expected %04x", kat[i].in, got, kat[i].out);
    }
}

/* ---- dispatch ---- */

TEST_CASE(test_dispatch) {
    CHECK(nb_adamw_host_force("scalar") == 0, "scalar must always be available");
    CHECK(strcmp(nb_adamw_host_isa(), "scalar") == 0, "forced scalar, got %s", nb_adamw_host_isa());
    CHECK(nb_adamw_host_force("sse9") == -1, "an unknown name must be refused");
    CHECK(strcmp(nb_adamw_host_isa(), "scalar") == 0, "a refused force changed the path to %s", nb_adamw_host_isa());
    for (int s = 0; s < NISA; s++) {
        int ok = nb_adamw_host_force(ISAS[s]) == 0;
        CHECK(ok == nb_adamw_host_supported(ISAS[s]), "%s: force and supported disagree", ISAS[s]);
        if (ok) CHECK(strcmp(nb_adamw_host_isa(), ISAS[s]) == 0, "forced %s, got %s", ISAS[s], nb_adamw_host_isa());
    }
    CHECK(nb_adamw_host_force("auto") == 0, "auto must always work");
    const char *best = isa_on[2] ? "avx512" : isa_on[1] ? "avx2" : "scalar";
    CHECK(strcmp(nb_adamw_host_isa(), best) == 0, "auto chose %s, expected %s", nb_adamw_host_isa(), best);
    /* n = 0 touches nothing, even through NULL pointers */
    nb_adamw_scalars k = nb_adamw_prepare((nb_adamw_cfg){1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f}, 1);
    nb_adamw_host_apply(NULL, NULL, NULL, NULL, NULL, 0, &k, 1.0f, 4);
}

/* ---- the bitwise comparison ---- */

static size_t cases_run[NISA];

/* First differing element of two arrays of 32- or 16-bit words, or n. nan_any: any NaN equals
 * any NaN. */
static size_t first_diff32(const float *a, const float *b, size_t n, int nan_any) {
    for (size_t i = 0; i < n; i++)
        if (f_bits(a[i]) != f_bits(b[i]) && !(nan_any && isnan(a[i]) && isnan(b[i]))) return i;
    return n;
}
static size_t first_diff16(const uint16_t *a, const uint16_t *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i]) return i;
    return n;
}

/* One data set: STEPS reference steps (nb_adamw_apply, then the bf16 of each param), then every
 * supported ISA x thread count x {with, without bf16} from the same start, compared after every
 * step. Params sit at float offset off_p past a 64-byte boundary, the other arrays at off_o. */
static void run_set(int kind, size_t n, int off_p, int off_o, float wd, float grad_scale) {
    const size_t fb = n * sizeof(float);
    nb_adamw_scalars k[STEPS];
    for (int s = 0; s < STEPS; s++) {
        /* lr changes between steps, as under a schedule */
        nb_adamw_cfg cfg = {1e-3f * (float)(s + 1), 0.9f, 0.999f, 1e-8f, wd};
        k[s] = nb_adamw_prepare(cfg, s + 1);
    }
    /* inputs */
    float *p0 = nb_malloc(fb + 4, "p0"), *m0 = nb_malloc(fb + 4, "m0"), *v0 = nb_malloc(fb + 4, "v0");
    gbuf g[STEPS];
    float *gcopy[STEPS];
    for (size_t i = 0; i < n; i++) {
        p0[i] = value(kind, ARR_P, 0, i);
        m0[i] = value(kind, ARR_M, 0, i);
        v0[i] = value(kind, ARR_V, 0, i);
    }
    for (int s = 0; s < STEPS; s++) {
        g[s] = gbuf_new(n, off_o, "grads");
        gbuf_fill_canary(&g[s]);
        gcopy[s] = nb_malloc(fb + 4, "grads copy");
        for (size_t i = 0; i < n; i++) g[s].x[i] = gcopy[s][i] = value(kind, ARR_G, s, i);
    }
    /* the reference, state after every step */
    float *rp[STEPS], *rm[STEPS], *rv[STEPS];
    uint16_t *rl[STEPS];
    {
        float *p = nb_malloc(fb + 4, "ref p"), *m = nb_malloc(fb + 4, "ref m"), *v = nb_malloc(fb + 4, "ref v");
        memcpy(p, p0, fb);
        memcpy(m, m0, fb);
        memcpy(v, v0, fb);
        for (int s = 0; s < STEPS; s++) {
            nb_adamw_apply(p, gcopy[s], m, v, n, &k[s], grad_scale);
            rp[s] = nb_malloc(fb + 4, "ref p step");
            rm[s] = nb_malloc(fb + 4, "ref m step");
            rv[s] = nb_malloc(fb + 4, "ref v step");
            rl[s] = nb_malloc(n * sizeof(uint16_t) + 2, "ref bf16 step");
            memcpy(rp[s], p, fb);
            memcpy(rm[s], m, fb);
            memcpy(rv[s], v, fb);
            for (size_t i = 0; i < n; i++) rl[s][i] = nb_bf16_from_f32(p[i]);
        }
        free(p);
        free(m);
        free(v);
    }
    gbuf P = gbuf_new(n, off_p, "params"), M = gbuf_new(n, off_o, "m"), V = gbuf_new(n, off_o, "v");
    /* the bf16 copy: its own misalignment (off_p in 2-byte units past a 64-byte boundary), with guards */
    uint16_t *lbase = nb_aligned_alloc((n + 2 * 32 + 32) * sizeof(uint16_t), "bf16");
    uint16_t *L = lbase + 32 + off_p;

    for (int si = 0; si < NISA; si++) {
        if (!isa_on[si]) continue;
        NB_ASSERT(nb_adamw_host_force(ISAS[si]) == 0);
        for (int ti = 0; ti < NTHREADS; ti++) {
            for (int with_bf16 = 0; with_bf16 < 2; with_bf16++) {
                gbuf_fill_canary(&P);
                gbuf_fill_canary(&M);
                gbuf_fill_canary(&V);
                for (size_t i = 0; i < n + 2 * 32 + 32; i++) lbase[i] = CANARY_BF16;
                memcpy(P.x, p0, fb);
                memcpy(M.x, m0, fb);
                memcpy(V.x, v0, fb);
                int bad = 0;
                for (int s = 0; s < STEPS && !bad; s++) {
                    nb_adamw_host_apply(P.x, g[s].x, M.x, V.x, with_bf16 ? L : NULL, n, &k[s], grad_scale,
                                        THREADS[ti]);
                    const int nan_any = kind == DATA_NAN_MIX;
                    size_t dp = first_diff32(P.x, rp[s], n, nan_any), dm = first_diff32(M.x, rm[s], n, nan_any);
                    size_t dv = first_diff32(V.x, rv[s], n, nan_any), dl = with_bf16 ? first_diff16(L, rl[s], n) : n;
                    const char *arr = dp < n ? "params" : dm < n ? "m" : dv < n ? "v" : dl < n ? "bf16" : NULL;
                    if (arr) {
                        size_t i = dp < n ? dp : dm < n ? dm : dv < n ? dv : dl;
                        CHECK(0,
                              "%s differs from the reference: isa %s threads %d bf16 %d n %zu off %d/%d wd %g scale %g "
                              "step %d element %zu (p0 %08x g %08x m0 %08x v0 %08x; got p %08x m %08x v %08x, "
                              "ref p %08x m %08x v %08x)",
                              arr, ISAS[si], THREADS[ti], with_bf16, n, off_p, off_o, wd, grad_scale, s + 1, i,
                              f_bits(p0[i]), f_bits(gcopy[s][i]), f_bits(m0[i]), f_bits(v0[i]), f_bits(P.x[i]),
                              f_bits(M.x[i]), f_bits(V.x[i]), f_bits(rp[s][i]), f_bits(rm[s][i]), f_bits(rv[s][i]));
                        bad = 1;
                    }
                }
                CHECK(gbuf_guards_ok(&P) && gbuf_guards_ok(&M) && gbuf_guards_ok(&V),
                      "a write outside [0, n): isa %s threads %d n %zu off %d/%d", ISAS[si], THREADS[ti], n, off_p,
                      off_o);
                int lguard = 1;
                for (uint16_t *q = lbase; q < L; q++) lguard &= *q == CANARY_BF16;
                for (size_t i = n; i < n + 32; i++) lguard &= L[i] == CANARY_BF16;
                if (!with_bf16)
                    for (size_t i = 0; i < n; i++) lguard &= L[i] == CANARY_BF16;
                CHECK(lguard, "bf16 written outside [0, n) (or with params_bf16 = NULL): isa %s threads %d n %zu",
                      ISAS[si], THREADS[ti], n);
                cases_run[si]++;
            }
        }
    }
    for (int s = 0; s < STEPS; s++) {
        CHECK(memcmp(g[s].x, gcopy[s], fb) == 0 && gbuf_guards_ok(&g[s]), "grads were written (n %zu)", n);
        free(g[s].base);
        free(gcopy[s]);
        free(rp[s]);
        free(rm[s]);
        free(rv[s]);
        free(rl[s]);
    }
    free(P.base);
    free(M.base);
    free(V.base);
    free(lbase);
    free(p0);
    free(m0);
    free(v0);
}

static const size_t SIZES[] = {0, 1, 7, 15, 16, 17, 1000, (1u << 20) + 3};
#define NSIZES (sizeof SIZES / sizeof SIZES[0])

TEST_CASE(test_bitwise_wide) {
    const float wds[] = {0.0f, 0.1f}, scales[] = {0.37f, 1.0f, 1.5f};
    for (size_t si = 0; si < NSIZES; si++) {
        size_t n = SIZES[si];
        int big = n > 100000;
        /* every misalignment for the small sizes; for the large one, a few (each costs ~100
         * steps of 1M elements), one of them with params and the other arrays misaligned apart */
        static const int big_offs[][2] = {{0, 0}, {15, 15}, {5, 12}};
        int noffs = big ? 3 : 17;
        for (int oi = 0; oi < noffs; oi++) {
            int off_p = big ? big_offs[oi][0] : oi < 16 ? oi : 3;
            int off_o = big ? big_offs[oi][1] : oi < 16 ? oi : 10;
            for (int wi = 0; wi < 2; wi++)
                for (int sc = 0; sc < (big ? 2 : 3); sc++) run_set(DATA_WIDE, n, off_p, off_o, wds[wi], scales[sc]);
        }
    }
}

TEST_CASE(test_bitwise_nonfinite) {
    run_set(DATA_NONFINITE, 1000, 3, 3, 0.1f, 0.5f);
    run_set(DATA_NONFINITE, (1u << 16) + 5, 7, 2, 0.0f, 1.0f);
}

/* A NaN gradient arriving on NaN state brings two payloads into one add; which survives is the
 * compiler's choice of operand order, and C leaves it open (measured: gcc's build of adamw.c and
 * this file's scalar path keep different ones). What must still hold: every non-NaN value
 * bitwise, NaN exactly where the reference has NaN, and the bf16 copy bitwise (every NaN is
 * 0x7fff there). */
TEST_CASE(test_bitwise_nan_mix) {
    run_set(DATA_NAN_MIX, 1000, 3, 3, 0.1f, 0.5f);
    run_set(DATA_NAN_MIX, (1u << 16) + 5, 7, 2, 0.0f, 1.0f);
}

/* ---- --bench ---- */

static double best_of(int reps, double *times) {
    double b = times[0];
    for (int i = 1; i < reps; i++) b = times[i] < b ? times[i] : b;
    return b;
}

#define BENCH_REPS 5

/* Cheap deterministic fill in parallel (first touch by the threads that will use the pages). */
static void bench_fill(float *x, size_t n, uint32_t salt, float lo, float hi) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        uint32_t h = (uint32_t)i * 0x9E3779B1u ^ salt;
        h ^= h >> 15;
        h *= 0x85EBCA77u;
        h ^= h >> 13;
        x[i] = lo + (hi - lo) * (float)(h >> 8) * (1.0f / 16777216.0f);
    }
}

/* Host memory bandwidth at `threads` threads over four arrays of n floats each (each much
 * larger than the L3), GB/s counted as the bytes the loop reads and writes:
 *   read      sum of a                       4 B/elem (4 SSE sums: not latency-bound)
 *   copy      memcpy b <- a, per thread      8 B/elem
 *   triad     c = a + s*b (STREAM)           12 B/elem (+4 of write-allocate, uncounted, as STREAM)
 *   adamw-rw  a += d, b += d, c += d         28 B/elem: AdamW's streams (read 4, write 3 back to
 *             lines just read, so no write-allocate) without its arithmetic: the roofline of the
 *             optimizer's access pattern on this host. */
#define BW_KERNELS 4
static const char *const BW_NAMES[BW_KERNELS] = {"read", "copy", "triad", "adamw-rw"};
static const double BW_BYTES[BW_KERNELS] = {4.0, 8.0, 12.0, 28.0};

static void bench_bandwidth(int threads, size_t n, float *a, float *b, float *c, float *d, double gbs[BW_KERNELS]) {
    omp_set_num_threads(threads);
    double t[BW_KERNELS][BENCH_REPS];
    volatile float sink = 0.0f;
    for (int r = -1; r < BENCH_REPS; r++) { /* r = -1: warm-up */
        double t0 = nb_now();
        float total = 0.0f;
#pragma omp parallel reduction(+ : total)
        {
            /* four independent SSE sums (gcc keeps a float array of accumulators on the stack) */
            __m128 s0 = _mm_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
#pragma omp for schedule(static)
            for (size_t i = 0; i < n / 16; i++) {
                const float *q = a + 16 * i;
                s0 = _mm_add_ps(s0, _mm_load_ps(q));
                s1 = _mm_add_ps(s1, _mm_load_ps(q + 4));
                s2 = _mm_add_ps(s2, _mm_load_ps(q + 8));
                s3 = _mm_add_ps(s3, _mm_load_ps(q + 12));
            }
            float part[4];
            _mm_storeu_ps(part, _mm_add_ps(_mm_add_ps(s0, s1), _mm_add_ps(s2, s3)));
            total += part[0] + part[1] + part[2] + part[3];
        }
        sink += total;
        double t1 = nb_now();
#pragma omp parallel
        {
            int id = omp_get_thread_num(), nt = omp_get_num_threads();
            size_t lo = n / (size_t)nt * (size_t)id, hi = id == nt - 1 ? n : n / (size_t)nt * (size_t)(id + 1);
            memcpy(b + lo, a + lo, (hi - lo) * sizeof(float));
        }
        double t2 = nb_now();
#pragma omp parallel for simd schedule(static)
        for (size_t i = 0; i < n; i++) c[i] = a[i] + 0.5f * b[i];
        double t3 = nb_now();
#pragma omp parallel for simd schedule(static)
        for (size_t i = 0; i < n; i++) {
            float x = d[i];
            a[i] += x;
            b[i] += x;
            c[i] += x;
        }
        double t4 = nb_now();
        if (r >= 0) {
            t[0][r] = t1 - t0;
            t[1][r] = t2 - t1;
            t[2][r] = t3 - t2;
            t[3][r] = t4 - t3;
        }
    }
    (void)sink;
    for (int j = 0; j < BW_KERNELS; j++) gbs[j] = BW_BYTES[j] * (double)n / best_of(BENCH_REPS, t[j]) / 1e9;
}

static void cpu_model(char *out, size_t cap) {
    snprintf(out, cap, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (strncmp(line, "model name", 10) == 0 && colon) {
            snprintf(out, cap, "%s", colon + 2);
            out[strcspn(out, "\n")] = 0;
            break;
        }
    }
    fclose(f);
}

static int bench_main(void) {
    const int tmax = omp_get_max_threads();
    long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    size_t avail = nb_host_mem_available();
    char model[256], buf[3][32];
    cpu_model(model, sizeof model);
    time_t now = time(NULL);
    char date[32];
    strftime(date, sizeof date, "%Y-%m-%d", localtime(&now));
    printf("host AdamW benchmark, %s: %s, %d threads, L3 %s, %s available\n", date, model, tmax,
           l3 > 0 ? nb_fmt_bytes(buf[0], 32, (double)l3) : "unknown", avail ? nb_fmt_bytes(buf[1], 32, (double)avail) : "unknown");
    /* thread counts: 1, 2, 4, ... and all */
    int tcounts[16], nt = 0;
    for (int t = 1; t < tmax && nt < 15; t *= 2) tcounts[nt++] = t;
    tcounts[nt++] = tmax;

    /* memory bandwidth: four arrays each at least twice the L3 (so no pass is served from it)
     * and at least 256 MiB, within a quarter of the available memory */
    size_t bw_bytes = (size_t)(l3 > 0 ? 2 * l3 : 0);
    if (bw_bytes < ((size_t)256 << 20)) bw_bytes = (size_t)256 << 20;
    if (avail && 4 * bw_bytes > avail / 4) bw_bytes = avail / 16;
    size_t bw_n = bw_bytes / sizeof(float) / 16 * 16;
    float *bw[4];
    for (int j = 0; j < 4; j++) {
        bw[j] = nb_aligned_alloc(bw_n * sizeof(float), "bandwidth array");
        bench_fill(bw[j], bw_n, (uint32_t)j + 1, -1.0f, 1.0f);
    }
    printf("\nmemory bandwidth, 4 arrays of %s, best of %d (GB/s = 1e9 bytes/s):\n",
           nb_fmt_bytes(buf[0], 32, (double)bw_bytes), BENCH_REPS);
    printf("%8s", "threads");
    for (int j = 0; j < BW_KERNELS; j++) printf(" %9s", BW_NAMES[j]);
    printf("\n");
    double bw_rw[16];
    for (int i = 0; i < nt; i++) {
        double gbs[BW_KERNELS];
        bench_bandwidth(tcounts[i], bw_n, bw[0], bw[1], bw[2], bw[3], gbs);
        bw_rw[i] = gbs[3];
        printf("%8d", tcounts[i]);
        for (int j = 0; j < BW_KERNELS; j++) printf(" %9.1f", gbs[j]);
        printf("\n");
    }
    for (int j = 0; j < 4; j++) free(bw[j]);

    /* AdamW: 1<<26 params, or fewer when memory is short (18 bytes a param with the bf16 copy) */
    size_t n = (size_t)1 << 26;
    while (avail && n > ((size_t)1 << 20) && 18 * n > avail / 2) n /= 2;
    float *p = nb_aligned_alloc(n * sizeof(float), "bench params");
    float *g = nb_aligned_alloc(n * sizeof(float), "bench grads");
    float *m = nb_aligned_alloc(n * sizeof(float), "bench m");
    float *v = nb_aligned_alloc(n * sizeof(float), "bench v");
    uint16_t *lp = nb_aligned_alloc(n * sizeof(uint16_t), "bench bf16");
    /* ordinary magnitudes: no subnormals, which would take microcode assists on x86 */
    bench_fill(p, n, 4, -0.1f, 0.1f);
    bench_fill(g, n, 5, -1.0f, 1.0f);
    bench_fill(m, n, 6, -0.01f, 0.01f);
    bench_fill(v, n, 7, 1e-4f, 1e-3f);
    memset(lp, 0, n * sizeof(uint16_t));
    nb_adamw_scalars k = nb_adamw_prepare((nb_adamw_cfg){1e-4f, 0.9f, 0.999f, 1e-8f, 0.1f}, 10);
    printf("\nAdamW, n = %zu params (%s of fp32 state), best of %d; traffic = 28 bytes/param (read p g m v, write p "
           "m v), 30 with the bf16 copy;\n%% = of adamw-rw (the same streams without the arithmetic) at the same thread count\n",
           n, nb_fmt_bytes(buf[0], 32, 16.0 * (double)n), BENCH_REPS);
    printf("%-22s %7s %5s %9s %8s %6s\n", "path", "threads", "bf16", "ms", "GB/s", "%");
    for (int path = -1; path < NISA; path++) { /* -1: the library's nb_adamw_apply (what trains today) */
        if (path >= 0 && !isa_on[path]) {
            printf("%-22s (skipped: this CPU lacks it)\n", ISAS[path]);
            continue;
        }
        if (path >= 0) NB_ASSERT(nb_adamw_host_force(ISAS[path]) == 0);
        for (int ti = 0; ti < nt; ti++) {
            for (int with_bf16 = 0; with_bf16 < (path < 0 ? 1 : 2); with_bf16++) {
                double t[BENCH_REPS];
                omp_set_num_threads(tcounts[ti]); /* for nb_adamw_apply's own parallel loop */
                for (int r = -1; r < BENCH_REPS; r++) {
                    double t0 = nb_now();
                    if (path < 0)
                        nb_adamw_apply(p, g, m, v, n, &k, 1.0f);
                    else
                        nb_adamw_host_apply(p, g, m, v, with_bf16 ? lp : NULL, n, &k, 1.0f, tcounts[ti]);
                    if (r >= 0) t[r] = nb_now() - t0;
                }
                double s = best_of(BENCH_REPS, t), gbs = (with_bf16 ? 30.0 : 28.0) * (double)n / s / 1e9;
                printf("%-22s %7d %5s %9.2f %8.1f %5.0f%%\n", path < 0 ? "nb_adamw_apply (ref)" : ISAS[path],
                       tcounts[ti], with_bf16 ? "yes" : "no", s * 1e3, gbs, 100.0 * gbs / bw_rw[ti]);
            }
        }
    }
    /* The same paths on 1<<15 params (576 KB with the copy, inside L2), one thread, 400 steps:
     * what the arithmetic alone costs, i.e. how much headroom each path has under the memory. */
    const size_t nc = (size_t)1 << 15;
    const int creps = 400;
    printf("\nAdamW in L2 (n = %zu, one thread, best of %d x %d steps): the compute ceiling of each path\n", nc,
           BENCH_REPS, creps);
    printf("%-22s %5s %12s %8s\n", "path", "bf16", "Mparams/s", "GB/s");
    for (int path = -1; path < NISA; path++) {
        if (path >= 0 && !isa_on[path]) continue;
        if (path >= 0) NB_ASSERT(nb_adamw_host_force(ISAS[path]) == 0);
        for (int with_bf16 = 0; with_bf16 < (path < 0 ? 1 : 2); with_bf16++) {
            double t[BENCH_REPS];
            omp_set_num_threads(1);
            for (int r = -1; r < BENCH_REPS; r++) {
                double t0 = nb_now();
                for (int j = 0; j < creps; j++) {
                    if (path < 0)
                        nb_adamw_apply(p, g, m, v, nc, &k, 1.0f);
                    else
                        nb_adamw_host_apply(p, g, m, v, with_bf16 ? lp : NULL, nc, &k, 1.0f, 1);
                }
                if (r >= 0) t[r] = (nb_now() - t0) / creps;
            }
            double sec = best_of(BENCH_REPS, t);
            printf("%-22s %5s %12.0f %8.1f\n", path < 0 ? "nb_adamw_apply (ref)" : ISAS[path], with_bf16 ? "yes" : "no",
                   (double)nc / sec / 1e6, (with_bf16 ? 30.0 : 28.0) * (double)nc / sec / 1e9);
        }
    }
    NB_ASSERT(nb_adamw_host_force("auto") == 0);
    omp_set_num_threads(tmax);
    free(p);
    free(g);
    free(m);
    free(v);
    free(lp);
    return 0;
}

int main(int argc, char **argv) {
    for (int s = 0; s < NISA; s++) isa_on[s] = nb_adamw_host_supported(ISAS[s]);
    if (argc > 1 && strcmp(argv[1], "--bench") == 0) return bench_main();
    if (argc > 1) {
        fprintf(stderr, "usage: %s [--bench]\n", argv[0]);
        return 2;
    }
    printf("ISAs tested:");
    for (int s = 0; s < NISA; s++)
        if (isa_on[s]) printf(" %s", ISAS[s]);
    printf("\n");
    for (int s = 0; s < NISA; s++)
        if (!isa_on[s]) printf("skipped %s: this CPU (or its OS) lacks it\n", ISAS[s]);
    printf("threads: 1 3 4 all (%d)\n", omp_get_max_threads());
    RUN(test_bf16_rounding);
    RUN(test_dispatch);
    RUN(test_bitwise_wide);
    RUN(test_bitwise_nonfinite);
    RUN(test_bitwise_nan_mix);
    printf("compared configurations (ISA x threads x bf16 on/off, %d steps each):", STEPS);
    for (int s = 0; s < NISA; s++)
        if (isa_on[s]) printf(" %s %zu", ISAS[s], cases_run[s]);
    printf("\n");
    NB_ASSERT(nb_adamw_host_force("auto") == 0);
    TEST_EXIT();
}
