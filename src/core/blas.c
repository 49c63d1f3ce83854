#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "blas.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core.h"

char *openblas_get_corename(void);
char *openblas_get_config(void);

void nb_cpu_features_detect(nb_cpu_features *f) {
    memset(f, 0, sizeof *f);
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    f->avx2 = __builtin_cpu_supports("avx2") != 0;
    f->fma = __builtin_cpu_supports("fma") != 0;
    f->avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#if __GNUC__ >= 11
    f->avx512bf16 = __builtin_cpu_supports("avx512bf16") != 0;
#endif
#endif
}

void nb_blas_facts_detect(nb_blas_facts *facts) {
    facts->corename = openblas_get_corename();
    facts->config = openblas_get_config();
    nb_cpu_features_detect(&facts->cpu);
}

/* OpenBLAS's x86-64 core names (driver/others/dynamic.c) that a better Intel kernel can replace,
 * ranked by the instruction set their kernels use; 0: leave it (AMD, VIA, a name this table
 * does not know). */
static int core_rank(const char *name) {
    static const char *const generic[] = {"Unknown", "Katmai", "Coppermine", "Northwood", "Prescott", "Banias",
                                          "Atom", "Core2", "Penryn", "Dunnington", "Nehalem"};
    for (size_t i = 0; i < sizeof generic / sizeof *generic; i++)
        if (!strcasecmp(name, generic[i])) return 1;
    if (!strcasecmp(name, "Sandybridge")) return 2;
    if (!strcasecmp(name, "Haswell")) return 3;
    if (!strcasecmp(name, "SkylakeX") || !strcasecmp(name, "Cooperlake") || !strcasecmp(name, "SapphireRapids"))
        return 4;
    return 0;
}

int nb_blas_decide(const nb_blas_facts *facts, const char *env, char *name, size_t cap) {
    if (env) return NB_BLAS_KEEP; /* the user's choice, whatever it is */
    const char *best = facts->cpu.avx512 ? "SkylakeX" : facts->cpu.avx2 && facts->cpu.fma ? "Haswell" : NULL;
    int have = core_rank(facts->corename ? facts->corename : "");
    if (!best || have == 0 || have >= core_rank(best)) return NB_BLAS_KEEP;
    snprintf(name, cap, "%s", best);
    return facts->config && strstr(facts->config, "DYNAMIC_ARCH") ? NB_BLAS_SET : NB_BLAS_ADVISE;
}

void nb_blas_sgemm(int trans_a, int trans_b, int M, int N, int K, const float *A, int lda, const float *B,
                   int ldb, float beta, float *C, int ldc) {
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N, K,
                1.0f, A, lda, B, ldb, beta, C, ldc);
}

/* Values in [-1, 1) from a fixed sequence: the check must not depend on the run. */
static float next_value(uint32_t *s) {
    *s = *s * 1664525u + 1013904223u;
    return (float)((int32_t)*s >> 8) / 8388608.0f;
}

/* One case: norm-wise relative error of gemm against a double triple loop. */
static double gemm_case(nb_sgemm_fn gemm, int ta, int tb, int M, int N, int K, float beta) {
    int lda = ta ? M : K, ldb = tb ? K : N;
    float *A = nb_malloc(sizeof(float) * (size_t)M * K, "GEMM check"), *B = nb_malloc(sizeof(float) * (size_t)K * N, "GEMM check");
    float *C = nb_malloc(sizeof(float) * (size_t)M * N, "GEMM check");
    uint32_t s = (uint32_t)(M * 7919 + N * 104729 + K * 1299709 + ta * 2 + tb);
    for (int i = 0; i < M * K; i++) A[i] = next_value(&s);
    for (int i = 0; i < K * N; i++) B[i] = next_value(&s);
    for (int i = 0; i < M * N; i++) C[i] = next_value(&s);
    double num = 0, den = 0;
    double *want = nb_malloc(sizeof(double) * (size_t)M * N, "GEMM check");
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double acc = (double)beta * C[i * N + j];
            for (int k = 0; k < K; k++)
                acc += (double)(ta ? A[k * lda + i] : A[i * lda + k]) * (tb ? B[j * ldb + k] : B[k * ldb + j]);
            want[i * N + j] = acc;
        }
    gemm(ta, tb, M, N, K, A, lda, B, ldb, beta, C, N);
    for (int i = 0; i < M * N; i++) {
        double d = C[i] - want[i];
        num += d * d;
        den += want[i] * want[i];
        if (!isfinite(C[i])) num = INFINITY;
    }
    free(A), free(B), free(C), free(want);
    return sqrt(num) / (den > 0 ? sqrt(den) : 1);
}

int nb_blas_gemm_check(nb_sgemm_fn gemm, char *why, size_t cap) {
    /* small shapes take OpenBLAS's small-matrix paths, the 256 x 64 x 96 one its blocked kernels */
    static const int shapes[][3] = {{7, 5, 3}, {64, 48, 80}, {256, 64, 96}};
    for (int s = 0; s < 3; s++)
        for (int v = 0; v < (s == 2 ? 2 : 8); v++) {
            int ta = v & 1, tb = (v >> 1) & 1;
            float beta = (v >> 2) & 1 ? 1.0f : 0.0f;
            const int *d = shapes[s];
            double err = gemm_case(gemm, ta, tb, d[0], d[1], d[2], beta);
            if (!(err <= 1e-5)) {
                snprintf(why, cap, "%dx%dx%d%s%s beta %g: relative error %.3g", d[0], d[1], d[2], ta ? " A^T" : "",
                         tb ? " B^T" : "", (double)beta, err);
                return 0;
            }
        }
    return 1;
}

int nb_blas_prepare_with(const nb_blas_facts *facts) {
    char name[32];
    int d = nb_blas_decide(facts, getenv("OPENBLAS_CORETYPE"), name, sizeof name);
    if (d == NB_BLAS_ADVISE)
        nb_log(1, "note: OpenBLAS runs its %s kernels on this CPU, which has %s, and it was built without "
                  "DYNAMIC_ARCH, so OPENBLAS_CORETYPE cannot change them: install an OpenBLAS built with "
                  "DYNAMIC_ARCH (Debian's libopenblas0-openmp is) or for %s for faster CPU matmuls\n",
               facts->corename, facts->cpu.avx512 ? "AVX-512" : "AVX2", name);
    if (d != NB_BLAS_SET) return 0;
    /* Remember OpenBLAS's own choice: the fallback if the chosen kernel fails its check. */
    return setenv("NB_BLAS_CHOSEN", facts->corename, 1) == 0 && setenv("OPENBLAS_CORETYPE", name, 1) == 0;
}

int nb_blas_confirm_with(const nb_blas_facts *facts, nb_sgemm_fn gemm) {
    const char *own = getenv("NB_BLAS_CHOSEN"), *want = getenv("OPENBLAS_CORETYPE");
    if (!own || !want) return 0;
    if (strcasecmp(facts->corename, want) != 0) { /* no fresh exec: OpenBLAS never saw the variable */
        nb_log(1, "note: OpenBLAS runs its %s kernels on this CPU; start nobubble with OPENBLAS_CORETYPE=%s for "
                  "faster CPU matmuls\n", facts->corename, want);
        unsetenv("NB_BLAS_CHOSEN");
        return 0;
    }
    char why[160];
    if (nb_blas_gemm_check(gemm, why, sizeof why)) return 0;
    /* "Unknown" is not a name OpenBLAS accepts; Prescott is its generic x86-64 kernel set. */
    char back[32];
    snprintf(back, sizeof back, "%s", strcasecmp(own, "Unknown") ? own : "Prescott");
    nb_log(0, "warning: OpenBLAS's %s kernels disagree with a reference GEMM on this CPU (%s): going back to "
              "its %s kernels (set OPENBLAS_CORETYPE to choose)\n", want, why, back);
    unsetenv("NB_BLAS_CHOSEN");
    return setenv("OPENBLAS_CORETYPE", back, 1) == 0;
}

int nb_blas_prepare(void) {
    nb_blas_facts facts;
    nb_blas_facts_detect(&facts);
    return nb_blas_prepare_with(&facts);
}

int nb_blas_confirm(void) {
    nb_blas_facts facts;
    nb_blas_facts_detect(&facts);
    return nb_blas_confirm_with(&facts, nb_blas_sgemm);
}
