/* The GPU's seeded normal init (nb_cuda_fill_normal_host: fill.cu + backend_cuda.c) against the
 * host's nb_rng_fill_normal, bit for bit: across chunk boundaries and odd lengths, at the default
 * redraw margin, at margins that force the listed redraw and the whole-chunk redraw, and with no
 * margin at all (how many floats the GPU's own log/sin/cos would have changed: logged). */
#include "optest.h"

#ifdef NB_WITH_CUDA
#include <stdlib.h>
#include <string.h>

#include "../bf16_host.h"
#include "core.h"
#include "cuda_check.h"
#include "rng.h"
#define SEED 1234
#include "cuda_util.h"

static size_t count_diff(const float *a, const float *b, size_t n) {
    size_t d = 0;
    for (size_t i = 0; i < n; i++) d += memcmp(a + i, b + i, sizeof(float)) != 0;
    return d;
}

TEST_CASE(test_fill_normal) {
    const size_t ns[] = {1, 2, 7, 4099, ((size_t)1 << 24) + 3, ((size_t)3 << 24) + 1};
    const struct { uint64_t seed, stream; float mean, std; } keys[] = {{1337, 11, 0.0f, 0.02f}, {7, 0xFFFFFFFFFFull, 0.5f, 1.0f}};
    int small = ot_small;
    for (int k = 0; k < 2; k++)
        for (size_t t = 0; t < sizeof ns / sizeof ns[0] - (small ? 2 : 0); t++) {
            size_t n = ns[t];
            float *ref = nb_malloc(n * sizeof(float), "reference"), *got = nb_malloc(n * sizeof(float), "fill");
            nb_rng_fill_normal(ref, n, keys[k].seed, keys[k].stream, keys[k].mean, keys[k].std);
            /* the default margin: the same bits */
            memset(got, 0xFF, n * sizeof(float));
            size_t redrawn = nb_cuda_fill_normal_host(got, n, keys[k].seed, keys[k].stream, keys[k].mean, keys[k].std,
                                                      NB_FILL_MARGIN, st);
            size_t d = count_diff(ref, got, n);
            CHECK(d == 0, "n %zu key %d: %zu of %zu elements differ from the host's fill (redrawn %zu)", n, k, d, n, redrawn);
            if (n > 4096) {
                /* margin 0: nothing redrawn; what differs is the device's libm (each differs by one float ulp) */
                size_t r0 = nb_cuda_fill_normal_host(got, n, keys[k].seed, keys[k].stream, keys[k].mean, keys[k].std, 0.0, st);
                size_t d0 = count_diff(ref, got, n);
                ot_log("n %zu: %zu redrawn at the default margin; with no margin %zu redrawn and %zu of %zu differ\n", n,
                       redrawn, r0, d0, n);
                /* 2^-38: about one element in 8,000 listed and redrawn; 2^-20: every element, whole chunks */
                const double margins[2] = {0x1p-38, 0x1p-20};
                for (int m = 0; m < 2; m++) {
                    memset(got, 0xFF, n * sizeof(float));
                    size_t r = nb_cuda_fill_normal_host(got, n, keys[k].seed, keys[k].stream, keys[k].mean, keys[k].std,
                                                        margins[m], st);
                    d = count_diff(ref, got, n);
                    CHECK(d == 0, "n %zu margin %g: %zu elements differ", n, margins[m], d);
                    /* at 2^-38 about n / 8,000 (a 4,099-element draw may list none) */
                    CHECK(m ? r == n : (r < n / 100 && (r > 0 || n < 100000)), "n %zu margin %g: %zu redrawn", n, margins[m], r);
                }
            }
            free(ref), free(got);
        }
}
#define FN(f) f
#else
#define FN(f) NULL
#endif

static const ot_row rows[] = {
    {"fill_normal", "cuda", OT_NONE, "1 .. 3x2^24+1, 2 keys, 4 margins", 0, OT_EVAL, FN(test_fill_normal), 0, OT_SMALL},
};
OT_TABLE(ot_fill_cuda, rows);
