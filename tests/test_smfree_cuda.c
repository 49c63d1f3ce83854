/* SM-free communication (FreeScale): what a copy done by SM kernels (NCCL-style channels) takes
 * from a GEMM running beside it, against copies done by the copy engines (cudaMemcpyAsync).
 *
 * Test mode (default): nb_cuda_copy_sm copies random non-zero bytes exactly (tails under 16
 * bytes, misaligned pointers, 1 to 32 CTAs) into a zeroed buffer and writes nothing around them;
 * a cudaMemcpyAsync D2D copy and a pinned D2H copy of the same bytes agree.
 *
 * --bench [--no-graph]: bf16 GEMMs through the CUDA backend's matmul_fwd (the seqctr dense
 * blocks' shapes and a large one) timed on stream A alone, then while stream B keeps copying:
 * the SM copy kernel (8/16/32 CTAs), cudaMemcpyAsync D2D, pinned D2H + H2D. A's loop is one CUDA
 * graph (--no-graph: launched from the host), so host launch speed stays out of the numbers.
 * Exits 77 (skipped) without a GPU, or when built without CUDA. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bf16_host.h"
#include "check.h"

#ifndef NB_WITH_CUDA
int main(void) {
    (void)nb_test_failures;
    printf("skip: built without CUDA (nvcc was not found when this was compiled)\n");
    return 77;
}
#else

#include <cuda_runtime.h>

#include "comm/copy_sm.h"
#include "core.h"
#include "cuda_check.h"
#include "ops/backend.h"
#include "ops/ops_cuda.h"
#include "rng.h"

#define SEED 20260301u
#include "cuda_test_util.h"

static void fill_bytes(unsigned char *p, size_t n, uint32_t s) {
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        p[i] = (unsigned char)(1 + (s >> 24) % 255); /* never 0, the poison */
    }
}

#define GUARD 64 /* bytes checked untouched after the copy */

TEST_CASE(test_copy_sm) {
    const size_t sizes[] = {1, 15, 16, 17, 4095, 1000003, (16u << 20) + 9};
    const int blocks[] = {1, 8, 32}, offs[3][2] = {{0, 0}, {1, 1}, {3, 1}}; /* dst, src byte offsets */
    const size_t cap = (16u << 20) + 9 + 16 + GUARD;
    unsigned char *h = nb_malloc(cap, "copy source"), *back = nb_malloc(cap, "copy result"), *dsrc, *ddst;
    fill_bytes(h, cap, 7);
    CUDA_CHECK(cudaMalloc((void **)&dsrc, cap));
    CUDA_CHECK(cudaMalloc((void **)&ddst, cap));
    CUDA_CHECK(cudaMemcpy(dsrc, h, cap, cudaMemcpyHostToDevice));
    int cases = 0;
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
        for (int bi = 0; bi < 3; bi++)
            for (int oi = 0; oi < 3; oi++) {
                size_t n = sizes[si], od = offs[oi][0], os = offs[oi][1], span = od + n + GUARD;
                CUDA_CHECK(cudaMemsetAsync(ddst, 0, span, st));
                CUDA_CHECK(nb_cuda_copy_sm(ddst + od, dsrc + os, n, blocks[bi], st));
                CUDA_CHECK(cudaStreamSynchronize(st));
                CUDA_CHECK(cudaMemcpy(back, ddst, span, cudaMemcpyDeviceToHost));
                int head = 1, tail = 1;
                for (size_t i = 0; i < od; i++) head &= back[i] == 0;
                for (size_t i = od + n; i < span; i++) tail &= back[i] == 0;
                CHECK(memcmp(back + od, h + os, n) == 0, "%zu bytes, %d CTAs, offsets %zu/%zu: wrong bytes", n,
                      blocks[bi], od, os);
                CHECK(head && tail, "%zu bytes, %d CTAs, offsets %zu/%zu: wrote outside dst", n, blocks[bi], od, os);
                cases++;
            }
    CHECK(nb_cuda_copy_sm(ddst, dsrc, 16, 0, st) == cudaErrorInvalidValue, "0 CTAs was accepted");
    printf("    %d copies (7 sizes x 1/8/32 CTAs x 3 alignments) exact\n", cases);
    CUDA_CHECK(cudaFree(dsrc));
    CUDA_CHECK(cudaFree(ddst));
    free(h), free(back);
}

TEST_CASE(test_copy_engines) {
    const size_t n = 1000003; /* odd: not a multiple of any vector width */
    unsigned char *h = nb_malloc(n, "copy source"), *pin_sm, *pin_ce, *dsrc, *dsm, *dce;
    fill_bytes(h, n, 11);
    CUDA_CHECK(cudaMallocHost((void **)&pin_sm, n));
    CUDA_CHECK(cudaMallocHost((void **)&pin_ce, n));
    CUDA_CHECK(cudaMalloc((void **)&dsrc, n));
    CUDA_CHECK(cudaMalloc((void **)&dsm, n));
    CUDA_CHECK(cudaMalloc((void **)&dce, n));
    CUDA_CHECK(cudaMemcpy(dsrc, h, n, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemsetAsync(dsm, 0, n, st));
    CUDA_CHECK(cudaMemsetAsync(dce, 0, n, st));
    CUDA_CHECK(nb_cuda_copy_sm(dsm, dsrc, n, 16, st));
    CUDA_CHECK(cudaMemcpyAsync(dce, dsrc, n, cudaMemcpyDeviceToDevice, st));
    CUDA_CHECK(cudaMemcpyAsync(pin_sm, dsm, n, cudaMemcpyDeviceToHost, st));
    CUDA_CHECK(cudaMemcpyAsync(pin_ce, dce, n, cudaMemcpyDeviceToHost, st));
    CUDA_CHECK(cudaStreamSynchronize(st));
    CHECK(memcmp(pin_sm, h, n) == 0, "SM copy then pinned D2H: wrong bytes");
    CHECK(memcmp(pin_ce, h, n) == 0, "cudaMemcpyAsync D2D then pinned D2H: wrong bytes");
    CUDA_CHECK(cudaFreeHost(pin_sm));
    CUDA_CHECK(cudaFreeHost(pin_ce));
    CUDA_CHECK(cudaFree(dsrc));
    CUDA_CHECK(cudaFree(dsm));
    CUDA_CHECK(cudaFree(dce));
    free(h);
}

/* ---- --bench ---- */

#define TRIALS 3
#define LOOP_MS 40.0     /* GEMM loop length: several host-staged copies of 256 MiB fit in it */
#define MAX_COPIES 4096  /* copies (and events) stream B may queue in one trial */

typedef enum { CP_NONE, CP_SM, CP_D2D, CP_HOST } cp_kind;
typedef struct {
    cp_kind kind;
    int blocks;
    size_t bytes;
    double solo_ms; /* one copy with nothing beside it */
} cp_case;

typedef struct {
    cudaStream_t a, b; /* GEMMs, copies */
    nb_task_ctx ctx;   /* A's: the backend's ops run on it */
    nb_backend *be;
    void *src, *dst, *host;
    cudaEvent_t a0, a1, ev[MAX_COPIES]; /* ev[i]: B after copy i */
} rig;

typedef struct {
    const char *name;
    int N, C, OC, sets, reps; /* sets: input copies rotated so L2 does not hold them */
    void *inp[8], *w[8], *bias, *out;
    cudaGraphExec_t exec;
} gemm;

static float since(cudaEvent_t x, cudaEvent_t y) {
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, x, y));
    return ms;
}

static double payload(const cp_case *c) { return c->kind == CP_HOST ? 2.0 * c->bytes : (double)c->bytes; }

static void copy_issue(rig *r, const cp_case *c) {
    if (c->kind == CP_SM) CUDA_CHECK(nb_cuda_copy_sm(r->dst, r->src, c->bytes, c->blocks, r->b));
    if (c->kind == CP_D2D) CUDA_CHECK(cudaMemcpyAsync(r->dst, r->src, c->bytes, cudaMemcpyDeviceToDevice, r->b));
    if (c->kind == CP_HOST) {
        CUDA_CHECK(cudaMemcpyAsync(r->host, r->src, c->bytes, cudaMemcpyDeviceToHost, r->b));
        CUDA_CHECK(cudaMemcpyAsync(r->dst, r->host, c->bytes, cudaMemcpyHostToDevice, r->b));
    }
}

static void copy_mark(rig *r, const cp_case *c, int i) {
    copy_issue(r, c);
    CUDA_CHECK(cudaEventRecord(r->ev[i], r->b));
}

static double copy_solo_ms(rig *r, const cp_case *c) {
    for (int i = 0; i < 2; i++) copy_issue(r, c);
    CUDA_CHECK(cudaEventRecord(r->ev[0], r->b));
    for (int i = 0; i < 10; i++) copy_issue(r, c);
    CUDA_CHECK(cudaEventRecord(r->ev[1], r->b));
    CUDA_CHECK(cudaEventSynchronize(r->ev[1]));
    return since(r->ev[0], r->ev[1]) / 10;
}

static void gemm_issue(rig *r, gemm *g, int k) {
    r->be->ops->matmul_fwd(&r->ctx, g->out, g->inp[k % g->sets], g->w[k % g->sets], g->bias, g->N, g->C, g->OC);
}

static void gemm_loop(rig *r, gemm *g) {
    if (g->exec) CUDA_CHECK(cudaGraphLaunch(g->exec, r->a));
    else
        for (int k = 0; k < g->reps; k++) gemm_issue(r, g, k);
}

/* Random bf16 inputs (never zeros: they run faster), reps for a ~LOOP_MS loop, the graph. */
static void gemm_setup(rig *r, gemm *g, size_t l2, int graph) {
    size_t ni = (size_t)g->N * g->C, nw = (size_t)g->OC * g->C, set = 2 * (ni + nw);
    g->sets = (int)((2 * l2 + set - 1) / set);
    g->sets = g->sets < 1 ? 1 : g->sets > 8 ? 8 : g->sets;
    float *hi = randn(ni, 0, 1), *hw = randn(nw, 0, 1.0f / sqrtf((float)g->C)), *hb = randn(g->OC, 0, 0.1f);
    for (int s = 0; s < g->sets; s++) g->inp[s] = dev_up(hi, ni, 1), g->w[s] = dev_up(hw, nw, 1);
    g->bias = dev_up(hb, g->OC, 1);
    CUDA_CHECK(cudaMalloc(&g->out, (size_t)g->N * g->OC * 2));
    free(hi), free(hw), free(hb);
    for (int k = 0; k < 10; k++) gemm_issue(r, g, k);
    CUDA_CHECK(cudaEventRecord(r->a0, r->a));
    for (int k = 0; k < 20; k++) gemm_issue(r, g, k);
    CUDA_CHECK(cudaEventRecord(r->a1, r->a));
    CUDA_CHECK(cudaEventSynchronize(r->a1));
    double reps = LOOP_MS / (since(r->a0, r->a1) / 20 + 1e-6);
    g->reps = reps < 50 ? 50 : reps > 5000 ? 5000 : (int)reps;
    g->exec = NULL;
    if (!graph) return;
    cudaGraph_t gr;
    CUDA_CHECK(cudaStreamBeginCapture(r->a, cudaStreamCaptureModeThreadLocal));
    for (int k = 0; k < g->reps; k++) gemm_issue(r, g, k);
    CUDA_CHECK(cudaStreamEndCapture(r->a, &gr));
    CUDA_CHECK(cudaGraphInstantiate(&g->exec, gr, 0));
    CUDA_CHECK(cudaGraphDestroy(gr));
    gemm_loop(r, g); /* first launch: uploads the graph */
    CUDA_CHECK(cudaStreamSynchronize(r->a));
}

static void gemm_free(gemm *g) {
    for (int s = 0; s < g->sets; s++) dev_free(g->inp[s]), dev_free(g->w[s]);
    dev_free(g->bias), dev_free(g->out);
    if (g->exec) CUDA_CHECK(cudaGraphExecDestroy(g->exec));
}

typedef struct {
    double ms, gbs; /* GEMM ms per call; B's GB/s over the copies that ended while A ran (0: none) */
    int covered;    /* B was still copying when A's loop ended */
} trial;

/* B gets three copies' head start and A waits for the first, so B is copying when A's clock
 * starts; B then queues copies for twice A's loop alone, so it stays busy if A slows. */
static trial run_trial(rig *r, gemm *g, const cp_case *c, double alone_ms) {
    trial t = {0, 0, 1};
    int need = 0, i = 0;
    if (c->kind != CP_NONE) {
        need = (int)ceil(2.0 * alone_ms * g->reps / c->solo_ms) + 3;
        need = need > MAX_COPIES ? MAX_COPIES : need;
        for (; i < 3; i++) copy_mark(r, c, i);
        CUDA_CHECK(cudaStreamWaitEvent(r->a, r->ev[0], 0));
    }
    CUDA_CHECK(cudaEventRecord(r->a0, r->a));
    gemm_loop(r, g);
    CUDA_CHECK(cudaEventRecord(r->a1, r->a));
    for (; i < need; i++) copy_mark(r, c, i);
    CUDA_CHECK(cudaDeviceSynchronize());
    t.ms = since(r->a0, r->a1) / g->reps;
    if (c->kind == CP_NONE) return t;
    float ta0 = since(r->ev[0], r->a0), ta1 = since(r->ev[0], r->a1);
    int j0 = 0, j1 = 0;
    for (int k = 0; k < need; k++) {
        float tk = since(r->ev[0], r->ev[k]);
        if (tk <= ta0) j0 = k;
        if (tk <= ta1) j1 = k;
    }
    t.covered = since(r->ev[0], r->ev[need - 1]) >= ta1;
    if (j1 > j0) t.gbs = payload(c) * (j1 - j0) / (since(r->ev[j0], r->ev[j1]) * 1e6);
    return t;
}

static int cmp_double(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* median of TRIALS; *spread = (max - min) / median of the GEMM times */
static trial run_case(rig *r, gemm *g, const cp_case *c, double alone_ms, double *spread) {
    double ms[TRIALS], gbs[TRIALS];
    trial m = {0, 0, 1};
    for (int k = 0; k < TRIALS; k++) {
        trial t = run_trial(r, g, c, alone_ms);
        ms[k] = t.ms, gbs[k] = t.gbs, m.covered &= t.covered;
    }
    qsort(ms, TRIALS, sizeof ms[0], cmp_double);
    qsort(gbs, TRIALS, sizeof gbs[0], cmp_double);
    m.ms = ms[TRIALS / 2], m.gbs = gbs[TRIALS / 2];
    if (spread) *spread = (ms[TRIALS - 1] - ms[0]) / m.ms;
    return m;
}

static void case_label(char *s, size_t cap, const cp_case *c) {
    const char *k = c->kind == CP_SM    ? "sm copy kernel"
                    : c->kind == CP_D2D ? "memcpy D2D (CE?)"
                                        : "memcpy D2H+H2D pinned";
    if (c->kind == CP_SM) snprintf(s, cap, "%s %2d CTAs %4zu MiB", k, c->blocks, c->bytes >> 20);
    else snprintf(s, cap, "%s %4zu MiB", k, c->bytes >> 20);
}

static void bench_shape(rig *r, gemm *g, cp_case *cases, int ncases, size_t l2, int graph) {
    gemm_setup(r, g, l2, graph);
    cp_case none = {CP_NONE, 0, 0, 0};
    double spread = 0, flop = 2.0 * g->N * g->C * g->OC;
    double alone = run_case(r, g, &none, 0, NULL).ms; /* the loop length B has to cover */
    alone = run_case(r, g, &none, alone, &spread).ms;
    printf("\n== %s: N=%d C=%d OC=%d, %d calls a loop, %d input sets, median of %d\n", g->name, g->N, g->C, g->OC,
           g->reps, g->sets, TRIALS);
    printf("   alone: %.4f ms per call, %.1f TFLOP/s (spread of %d loops %.1f%%)\n", alone, flop / alone / 1e9, TRIALS,
           100 * spread);
    printf("   %-34s %10s %9s %14s %14s\n", "stream B beside the GEMMs", "GEMM ms", "slowdown", "copy GB/s",
           "alone GB/s");
    double slow[16] = {0};
    for (int k = 0; k < ncases; k++) {
        trial t = run_case(r, g, &cases[k], alone, NULL);
        char lab[64], gb[24];
        case_label(lab, sizeof lab, &cases[k]);
        slow[k] = 100 * (t.ms / alone - 1);
        if (t.gbs > 0) snprintf(gb, sizeof gb, "%.1f", t.gbs);
        else snprintf(gb, sizeof gb, "n/a");
        printf("   %-34s %10.4f %+8.1f%% %14s %14.1f%s\n", lab, t.ms, slow[k], gb,
               payload(&cases[k]) / cases[k].solo_ms / 1e6, t.covered ? "" : "  (B went idle before the loop ended)");
    }
    /* the clock may drift over the cases: alone again, and the noise is the larger of the two */
    double again = run_case(r, g, &none, alone, NULL).ms, drift = 100 * fabs(again / alone - 1);
    printf("   alone again after the cases: %.4f ms (%+.1f%%)\n", again, 100 * (again / alone - 1));
    /* No assumption about what executes a D2D cudaMemcpyAsync: its slowdown next to the SM copy's
     * and the host-staged path's (copy engines over PCIe, little HBM traffic) says it. */
    for (int k = 0; k < ncases; k++) {
        if (cases[k].kind != CP_D2D) continue;
        double sm = 0, host = 0, noise = fmax(fmax(100 * spread, drift), 1.0);
        for (int j = 0; j < ncases; j++)
            if (cases[j].bytes == cases[k].bytes) {
                if (cases[j].kind == CP_SM && cases[j].blocks == 8) sm = slow[j];
                if (cases[j].kind == CP_HOST) host = slow[j];
            }
        printf("   D2D %zu MiB: %+.1f%% (noise %.1f%%; sm copy 8 CTAs %+.1f%%, host-staged %+.1f%%): %s\n",
               cases[k].bytes >> 20, slow[k], noise, sm, host,
               slow[k] <= noise      ? "within noise, as copy engines would be"
               : slow[k] >= 0.5 * sm ? "near the SM copy's: this driver may run it as a kernel on SMs"
                                     : "above noise, well below the SM copy: likely shared HBM/L2, not SMs");
    }
    gemm_free(g);
}

static void run_bench(int graph) {
    rig r = {0};
    r.be = nb_backend_create("cuda", "bf16");
    NB_ASSERT(r.be->ops->act_dtype == NB_BF16);
    int lo = 0, hi = 0;
    CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    /* the GEMMs first, as a trainer's compute lane would be: a slowdown is then despite it */
    CUDA_CHECK(cudaStreamCreateWithPriority(&r.a, cudaStreamNonBlocking, hi));
    CUDA_CHECK(cudaStreamCreateWithPriority(&r.b, cudaStreamNonBlocking, lo));
    r.ctx = (nb_task_ctx){NULL, r.a, r.be};
    CUDA_CHECK(cudaEventCreate(&r.a0));
    CUDA_CHECK(cudaEventCreate(&r.a1));
    for (int i = 0; i < MAX_COPIES; i++) CUDA_CHECK(cudaEventCreate(&r.ev[i]));
    const size_t big = 256u << 20;
    unsigned char *h = nb_malloc(big, "copy source");
    fill_bytes(h, big, 3);
    CUDA_CHECK(cudaMalloc(&r.src, big));
    CUDA_CHECK(cudaMalloc(&r.dst, big));
    CUDA_CHECK(cudaMallocHost(&r.host, big));
    CUDA_CHECK(cudaMemcpy(r.src, h, big, cudaMemcpyHostToDevice));
    free(h);
    struct cudaDeviceProp p;
    CUDA_CHECK(cudaGetDeviceProperties(&p, 0));
    printf("smfree bench on %s (%s): %d SMs, L2 %d MiB; backend %s; stream A priority %d, B %d; %s\n", r.be->desc,
           r.be->ops->name, p.multiProcessorCount, p.l2CacheSize >> 20, r.be->ops->name, hi, lo,
           graph ? "A's loop is one CUDA graph" : "A's loop launched from the host");
    printf("copy GB/s: bytes copied per second on B while A ran (D2H+H2D counts both); alone GB/s: B by itself\n");
    cp_case cases[16];
    int nc = 0;
    for (int s = 0; s < 2; s++) {
        size_t bytes = (size_t)(s ? 256 : 64) << 20;
        for (int b = 8; b <= 32; b *= 2) cases[nc++] = (cp_case){CP_SM, b, bytes, 0};
        cases[nc++] = (cp_case){CP_D2D, 0, bytes, 0};
        cases[nc++] = (cp_case){CP_HOST, 0, bytes, 0};
    }
    for (int k = 0; k < nc; k++) cases[k].solo_ms = copy_solo_ms(&r, &cases[k]);
    gemm shapes[3] = {{.name = "(a) seqctr block w1", .N = 4096, .C = 1856, .OC = 512},
                      {.name = "(b) seqctr block w2", .N = 4096, .C = 512, .OC = 1856},
                      {.name = "(c) large", .N = 8192, .C = 4096, .OC = 4096}};
    for (int k = 0; k < 3; k++) bench_shape(&r, &shapes[k], cases, nc, (size_t)p.l2CacheSize, graph);
    for (int i = 0; i < MAX_COPIES; i++) CUDA_CHECK(cudaEventDestroy(r.ev[i]));
    CUDA_CHECK(cudaEventDestroy(r.a0));
    CUDA_CHECK(cudaEventDestroy(r.a1));
    CUDA_CHECK(cudaFree(r.src));
    CUDA_CHECK(cudaFree(r.dst));
    CUDA_CHECK(cudaFreeHost(r.host));
    CUDA_CHECK(cudaStreamDestroy(r.a));
    CUDA_CHECK(cudaStreamDestroy(r.b));
    nb_backend_destroy(r.be);
}

int main(int argc, char **argv) {
    int bench = 0, graph = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--bench")) bench = 1;
        else if (!strcmp(argv[i], "--no-graph")) graph = 0;
        else {
            fprintf(stderr, "test_smfree_cuda: unknown option '%s' (use --bench [--no-graph])\n", argv[i]);
            return 2;
        }
    }
    if (cuda_test_start()) return 77;
    if (bench) {
        run_bench(graph);
        CUDA_CHECK(cudaStreamDestroy(st));
        return 0;
    }
    RUN(test_copy_sm);
    RUN(test_copy_engines);
    CUDA_CHECK(cudaStreamDestroy(st));
    TEST_EXIT();
}
#endif
