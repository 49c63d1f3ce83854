/* The OpenBLAS kernel choice (core/blas.h): the decision as a pure function of (OpenBLAS's core,
 * its build, the CPU's features, OPENBLAS_CORETYPE), the GEMM check (passes on OpenBLAS, catches
 * a wrong element, a wrong transpose, a NaN), and the startup steps on simulated facts: set and
 * exec, confirmed after the exec, the note when the exec did not happen, the fall back when the
 * chosen kernel fails its check. tests/blas_test.sh runs the GEMM check under every kernel
 * OpenBLAS has for this CPU. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdlib.h>
#include <string.h>

#include "blas.h"
#include "check.h"
#include "core.h"

static const char *DYN = "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH NO_AFFINITY USE_OPENMP Prescott MAX_THREADS=64";
static const char *STATIC = "OpenBLAS 0.3.21 NO_LAPACKE USE_OPENMP PRESCOTT MAX_THREADS=64";

TEST_CASE(decide_table) {
    const nb_cpu_features avx512 = {1, 1, 1, 1}, avx512_nobf16 = {1, 1, 1, 0}, avx2 = {1, 1, 0, 0}, avx2_nofma = {1, 0, 0, 0},
                          none = {0, 0, 0, 0};
    struct {
        const char *core, *config;
        nb_cpu_features cpu;
        const char *env;
        int want;
        const char *name;
    } cases[] = {
        {"Prescott", DYN, avx512, NULL, NB_BLAS_SET, "SkylakeX"}, /* the machine */
        {"Prescott", DYN, avx512_nobf16, NULL, NB_BLAS_SET, "SkylakeX"},
        {"Prescott", DYN, avx2, NULL, NB_BLAS_SET, "Haswell"},
        {"Nehalem", DYN, avx512, NULL, NB_BLAS_SET, "SkylakeX"},
        {"Core2", DYN, avx2, NULL, NB_BLAS_SET, "Haswell"},
        {"Unknown", DYN, avx2, NULL, NB_BLAS_SET, "Haswell"},
        {"Sandybridge", DYN, avx2, NULL, NB_BLAS_SET, "Haswell"},
        {"Haswell", DYN, avx512, NULL, NB_BLAS_SET, "SkylakeX"},
        {"prescott", DYN, avx512, NULL, NB_BLAS_SET, "SkylakeX"}, /* OpenBLAS compares names without case */
        {"Prescott", DYN, avx2_nofma, NULL, NB_BLAS_KEEP, ""},
        {"Prescott", DYN, none, NULL, NB_BLAS_KEEP, ""},
        {"SkylakeX", DYN, avx512, NULL, NB_BLAS_KEEP, ""},
        {"Cooperlake", DYN, avx512, NULL, NB_BLAS_KEEP, ""},
        {"Haswell", DYN, avx2, NULL, NB_BLAS_KEEP, ""},
        {"Zen", DYN, avx512, NULL, NB_BLAS_KEEP, ""}, /* AMD: OpenBLAS knew the CPU */
        {"Bulldozer", DYN, avx2, NULL, NB_BLAS_KEEP, ""},
        {"SomethingNew", DYN, avx512, NULL, NB_BLAS_KEEP, ""},
        {"Prescott", DYN, avx512, "Prescott", NB_BLAS_KEEP, ""}, /* the user's value wins */
        {"Prescott", DYN, avx512, "", NB_BLAS_KEEP, ""},
        {"Haswell", DYN, avx512, "Haswell", NB_BLAS_KEEP, ""},
        {"Prescott", STATIC, avx512, NULL, NB_BLAS_ADVISE, "SkylakeX"}, /* the variable would do nothing */
        {"Prescott", NULL, avx2, NULL, NB_BLAS_ADVISE, "Haswell"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        nb_blas_facts f = {cases[i].core, cases[i].config, cases[i].cpu};
        char name[32] = "";
        int got = nb_blas_decide(&f, cases[i].env, name, sizeof name);
        CHECK(got == cases[i].want && (got == NB_BLAS_KEEP || !strcmp(name, cases[i].name)),
              "case %zu (%s, env %s): got %d '%s', want %d '%s'", i, cases[i].core, cases[i].env ? cases[i].env : "unset",
              got, name, cases[i].want, cases[i].name);
    }
}

/* GEMMs that are wrong in one way each */
static void off_by_one_element(int ta, int tb, int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                               float beta, float *C, int ldc) {
    nb_blas_sgemm(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
    if (M * N > 100) C[M * N / 2] += 0.01f;
}
static void ignores_trans_b(int ta, int tb, int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                            float beta, float *C, int ldc) {
    (void)tb;
    nb_blas_sgemm(ta, 0, M, N, K, A, lda, B, tb ? N : ldb, beta, C, ldc); /* same buffer, read untransposed */
}
static void nan_out(int ta, int tb, int M, int N, int K, const float *A, int lda, const float *B, int ldb, float beta,
                    float *C, int ldc) {
    nb_blas_sgemm(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
    C[0] = NAN;
}
static void loses_precision(int ta, int tb, int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                            float beta, float *C, int ldc) {
    nb_blas_sgemm(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
    for (int i = 0; i < M * N; i++) C[i] *= 1.0f + 1e-4f; /* bf16-like rounding would do this and worse */
}

TEST_CASE(gemm_check) {
    char why[160] = "";
    CHECK(nb_blas_gemm_check(nb_blas_sgemm, why, sizeof why), "OpenBLAS fails the check: %s", why);
    CHECK(!nb_blas_gemm_check(off_by_one_element, why, sizeof why) && strstr(why, "64x48x80"), "one element: %s", why);
    CHECK(!nb_blas_gemm_check(ignores_trans_b, why, sizeof why) && strstr(why, "B^T"), "transpose: %s", why);
    CHECK(!nb_blas_gemm_check(nan_out, why, sizeof why) && strstr(why, "7x5x3"), "NaN: %s", why);
    CHECK(!nb_blas_gemm_check(loses_precision, why, sizeof why), "1e-4 relative passed");
}

TEST_CASE(startup_steps) {
    const nb_cpu_features avx512 = {1, 1, 1, 1};
    nb_blas_facts generic = {"Prescott", DYN, avx512}, chosen = {"SkylakeX", DYN, avx512};
    unsetenv("OPENBLAS_CORETYPE");
    unsetenv("NB_BLAS_CHOSEN");
    /* 1. OpenBLAS fell back: set the variable, remember its own choice, exec again */
    CHECK(nb_blas_prepare_with(&generic) == 1, "prepare asks for an exec");
    CHECK(getenv("OPENBLAS_CORETYPE") && !strcmp(getenv("OPENBLAS_CORETYPE"), "SkylakeX") &&
              getenv("NB_BLAS_CHOSEN") && !strcmp(getenv("NB_BLAS_CHOSEN"), "Prescott"),
          "environment after prepare");
    /* 2. after the exec: the variable is set, so prepare leaves it; the kernel passes its check */
    CHECK(nb_blas_prepare_with(&chosen) == 0, "second prepare changes nothing");
    CHECK(nb_blas_confirm_with(&chosen, nb_blas_sgemm) == 0, "a good kernel is kept");
    CHECK(!strcmp(getenv("OPENBLAS_CORETYPE"), "SkylakeX"), "kept");
    /* 3. a kernel that fails its check: back to OpenBLAS's own choice, exec again, never loop */
    CHECK(nb_blas_confirm_with(&chosen, off_by_one_element) == 1, "a bad kernel asks for an exec");
    CHECK(!strcmp(getenv("OPENBLAS_CORETYPE"), "Prescott") && !getenv("NB_BLAS_CHOSEN"), "fell back to Prescott");
    nb_blas_facts back = {"Prescott", DYN, avx512};
    CHECK(nb_blas_prepare_with(&back) == 0 && nb_blas_confirm_with(&back, off_by_one_element) == 0, "no loop");
    /* 4. the exec did not happen: OpenBLAS still runs Prescott with the variable set: a note, no exec */
    unsetenv("OPENBLAS_CORETYPE");
    CHECK(nb_blas_prepare_with(&generic) == 1, "prepare");
    CHECK(nb_blas_confirm_with(&generic, nb_blas_sgemm) == 0 && !getenv("NB_BLAS_CHOSEN"), "note only");
    /* 5. the user's own value: nothing is checked or changed, whatever the check would say */
    setenv("OPENBLAS_CORETYPE", "Haswell", 1);
    nb_blas_facts user = {"Haswell", DYN, avx512};
    CHECK(nb_blas_prepare_with(&user) == 0 && nb_blas_confirm_with(&user, off_by_one_element) == 0 &&
              !strcmp(getenv("OPENBLAS_CORETYPE"), "Haswell"),
          "the user's choice is left alone");
    unsetenv("OPENBLAS_CORETYPE");
}

int main(void) {
    nb_blas_facts f;
    nb_blas_facts_detect(&f);
    printf("OpenBLAS core %s (%s); CPU avx2 %d fma %d avx512 %d avx512bf16 %d\n", f.corename, f.config, f.cpu.avx2,
           f.cpu.fma, f.cpu.avx512, f.cpu.avx512bf16);
    RUN(decide_table);
    RUN(gemm_check);
    RUN(startup_steps);
    TEST_EXIT();
}
