/* cuBLASLt, opened with dlopen when the first GPU backend asks for it instead of linked: the
 * library's load-time initialization takes ~0.35 s (it is 540 MB), which every command paid
 * before, CPU runs, --help and the tests' hundreds of short commands included.
 *
 * The functions below carry cuBLASLt's own names and prototypes (cublasLt.h declares them, so
 * the compiler checks each one against the header): matmul.cu calls cuBLASLt as it always did,
 * and the link resolves those calls here, without -lcublasLt. Each forwards to the library's
 * function, looked up once. A machine without the library fails at the first GPU matmul with a
 * hint, as a missing libcublasLt.so did at start before. */
#ifdef NB_WITH_CUDA
#include <cublasLt.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"

#define NB_STR_(x) #x
#define NB_STR(x) NB_STR_(x)
#define LT_SONAME "libcublasLt.so." NB_STR(CUBLAS_VER_MAJOR)

static struct {
    __typeof__(cublasLtCreate) *create;
    __typeof__(cublasLtDestroy) *destroy;
    __typeof__(cublasLtGetVersion) *get_version;
    __typeof__(cublasLtGetStatusString) *status_string;
    __typeof__(cublasLtMatmulDescCreate) *desc_create;
    __typeof__(cublasLtMatmulDescDestroy) *desc_destroy;
    __typeof__(cublasLtMatmulDescSetAttribute) *desc_set;
    __typeof__(cublasLtMatrixLayoutCreate) *layout_create;
    __typeof__(cublasLtMatrixLayoutDestroy) *layout_destroy;
    __typeof__(cublasLtMatmulPreferenceCreate) *pref_create;
    __typeof__(cublasLtMatmulPreferenceDestroy) *pref_destroy;
    __typeof__(cublasLtMatmulPreferenceSetAttribute) *pref_set;
    __typeof__(cublasLtMatmulAlgoGetHeuristic) *heuristic;
    __typeof__(cublasLtMatmul) *matmul;
} lt;
static pthread_once_t lt_once = PTHREAD_ONCE_INIT;
static char lt_missing[600]; /* empty once loaded */

/* dlsym's void * into a function pointer: memcpy, since C has no cast between the two. */
static int sym(void *lib, const char *name, void *fn, size_t size) {
    void *p = dlsym(lib, name);
    if (!p) {
        snprintf(lt_missing, sizeof lt_missing, "%s has no %s", LT_SONAME, name);
        return 1;
    }
    memcpy(fn, &p, size);
    return 0;
}
#define SYM(lib, name, field) sym((lib), (name), &lt.field, sizeof lt.field)

/* The soname through the binary's run path (the CUDA toolkit it was built with) and
 * LD_LIBRARY_PATH, then CUDA_HOME's lib64. */
static void *open_lt(void) {
    char alt[512] = "";
    const char *home = getenv("CUDA_HOME");
    if (home && *home) snprintf(alt, sizeof alt, "%s/lib64/%s", home, LT_SONAME);
    const char *paths[2] = {LT_SONAME, alt[0] ? alt : NULL};
    for (int i = 0; i < 2; i++) {
        if (!paths[i]) continue;
        void *lib = dlopen(paths[i], RTLD_NOW | RTLD_LOCAL);
        if (lib) return lib;
        if (i == 0) snprintf(lt_missing, sizeof lt_missing, "%.500s", dlerror());
    }
    return NULL;
}

static void load(void) {
    void *lib = open_lt();
    if (!lib) return;
    if (SYM(lib, "cublasLtCreate", create) || SYM(lib, "cublasLtDestroy", destroy) ||
        SYM(lib, "cublasLtGetVersion", get_version) || SYM(lib, "cublasLtGetStatusString", status_string) ||
        SYM(lib, "cublasLtMatmulDescCreate", desc_create) || SYM(lib, "cublasLtMatmulDescDestroy", desc_destroy) ||
        SYM(lib, "cublasLtMatmulDescSetAttribute", desc_set) || SYM(lib, "cublasLtMatrixLayoutCreate", layout_create) ||
        SYM(lib, "cublasLtMatrixLayoutDestroy", layout_destroy) ||
        SYM(lib, "cublasLtMatmulPreferenceCreate", pref_create) ||
        SYM(lib, "cublasLtMatmulPreferenceDestroy", pref_destroy) ||
        SYM(lib, "cublasLtMatmulPreferenceSetAttribute", pref_set) ||
        SYM(lib, "cublasLtMatmulAlgoGetHeuristic", heuristic) || SYM(lib, "cublasLtMatmul", matmul))
        return;
    lt_missing[0] = 0;
}

static void need_lt(void) {
    pthread_once(&lt_once, load);
    NB_CHECK(!lt_missing[0], "install the CUDA toolkit's cuBLAS (" LT_SONAME ") or set CUDA_HOME to the toolkit it is in",
             "cannot load cuBLASLt: %s", lt_missing);
}

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
    need_lt();
    return lt.create(h);
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
    need_lt();
    return lt.destroy(h);
}
size_t cublasLtGetVersion(void) {
    need_lt();
    return lt.get_version();
}
const char *cublasLtGetStatusString(cublasStatus_t st) {
    need_lt();
    return lt.status_string(st);
}
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t ct, cudaDataType_t st) {
    need_lt();
    return lt.desc_create(d, ct, st);
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
    need_lt();
    return lt.desc_destroy(d);
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const void *buf,
                                              size_t size) {
    need_lt();
    return lt.desc_set(d, a, buf, size);
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType type, uint64_t rows, uint64_t cols,
                                          int64_t ld) {
    need_lt();
    return lt.layout_create(l, type, rows, cols, ld);
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
    need_lt();
    return lt.layout_destroy(l);
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) {
    need_lt();
    return lt.pref_create(p);
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
    need_lt();
    return lt.pref_destroy(p);
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t a,
                                                    const void *buf, size_t size) {
    need_lt();
    return lt.pref_set(p, a, buf, size);
}
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a,
                                              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[], int *returned) {
    need_lt();
    return lt.heuristic(h, op, a, b, c, d, pref, requested, results, returned);
}
cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t op, const void *alpha, const void *A,
                              cublasLtMatrixLayout_t la, const void *B, cublasLtMatrixLayout_t lb, const void *beta,
                              const void *C, cublasLtMatrixLayout_t lc, void *D, cublasLtMatrixLayout_t ld,
                              const cublasLtMatmulAlgo_t *algo, void *ws, size_t ws_bytes, cudaStream_t stream) {
    /* the hot path: loaded by the backend's cublasLtCreate before any GEMM */
    return lt.matmul(h, op, alpha, A, la, B, lb, beta, C, lc, D, ld, algo, ws, ws_bytes, stream);
}
#endif
