/* OpenBLAS kernel choice.
 *
 * Debian's OpenBLAS (0.3.21, DYNAMIC_ARCH) picks its kernels from the CPU model when it loads.
 * A model it does not know falls through to its generic Prescott (SSE3) kernels, even on a CPU
 * with AVX-512: on a 2-core AVX-512 Xeon the default CPU run trained at 670 tokens/s, and at
 * 1,720 tokens/s with OPENBLAS_CORETYPE=SkylakeX (same bits). OpenBLAS reads that variable while
 * it loads, before main, so the fix is to set it and exec again:
 *
 *     int again = nb_blas_prepare();           first thing in main, before any BLAS call
 *     ... (other environment changes) ...
 *     if (again) execv("/proc/self/exe", argv);
 *     if (nb_blas_confirm()) execv("/proc/self/exe", argv);   the chosen kernel failed its check
 *
 * Rules: a value the user set always wins (nothing is changed or checked); only a generic or
 * older Intel core below what the CPU's features allow is replaced (AMD cores, which OpenBLAS
 * recognised, are left alone); the kernel nobubble chose is checked against a reference GEMM
 * before anything trusts it, and replaced by OpenBLAS's own choice if it disagrees; when the
 * environment cannot fix it (an OpenBLAS built without DYNAMIC_ARCH, or the exec failed), one
 * line says what to set or install. NB_BLAS_CHOSEN=<OpenBLAS's own choice> in the environment
 * marks a kernel that nobubble chose. */
#ifndef NB_BLAS_H
#define NB_BLAS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int avx2, fma;
    int avx512;     /* F, BW, VL and DQ, with the OS saving the ZMM state (libgcc checks XCR0) */
    int avx512bf16;
} nb_cpu_features;

void nb_cpu_features_detect(nb_cpu_features *f);

/* What OpenBLAS and the CPU say: openblas_get_corename(), openblas_get_config(), features. */
typedef struct {
    const char *corename, *config;
    nb_cpu_features cpu;
} nb_blas_facts;

void nb_blas_facts_detect(nb_blas_facts *facts);

#define NB_BLAS_KEEP 0   /* leave OpenBLAS as it is */
#define NB_BLAS_SET 1    /* set OPENBLAS_CORETYPE=name and exec again */
#define NB_BLAS_ADVISE 2 /* better kernels exist but the environment cannot select them */

/* Pure decision: env is OPENBLAS_CORETYPE's value (NULL when unset). Writes the core to use
 * into name (for SET and ADVISE). AVX-512 -> "SkylakeX" (not "Cooperlake": 0.3.21's
 * force_coretype matches names up to index 24 of its table and Cooperlake is 25, so it says
 * "Core not found"), AVX2 + FMA -> "Haswell", else nothing. */
int nb_blas_decide(const nb_blas_facts *facts, const char *env, char *name, size_t cap);

/* Row-major C = op(A) op(B) + beta C, op = transpose when trans_x is 1. nb_blas_sgemm is
 * OpenBLAS's (cblas_sgemm). */
typedef void (*nb_sgemm_fn)(int trans_a, int trans_b, int M, int N, int K, const float *A, int lda,
                            const float *B, int ldb, float beta, float *C, int ldc);
void nb_blas_sgemm(int trans_a, int trans_b, int M, int N, int K, const float *A, int lda, const float *B,
                   int ldb, float beta, float *C, int ldc);

/* gemm against a double-precision triple loop on a few shapes (small-matrix and blocked paths,
 * every transpose, beta 0 and 1): 1 when every result is within 1e-5 relative (norm-wise);
 * else 0 with the first failing case in why. Takes a few milliseconds. */
int nb_blas_gemm_check(nb_sgemm_fn gemm, char *why, size_t cap);

/* The startup steps above, on this process's facts and environment. */
int nb_blas_prepare(void);
int nb_blas_confirm(void);
/* The same on given facts and GEMM (tests). */
int nb_blas_prepare_with(const nb_blas_facts *facts);
int nb_blas_confirm_with(const nb_blas_facts *facts, nb_sgemm_fn gemm);

#ifdef __cplusplus
}
#endif
#endif
