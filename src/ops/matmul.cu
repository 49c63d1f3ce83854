/* Linear layer on CUDA: GEMMs through cuBLASLt (bias and GELU fused as epilogues), a
 * deterministic two-pass bias gradient, and the helpers every .cu shares (stream-ordered
 * scratch, the column-reduction second pass).
 *
 * Row-major [rows, cols] is column-major [cols, rows], so with nn.Linear's w[OC, C]:
 *   out^T[OC,N]  = w[C,OC]^T . inp^T[C,N]        (transa)
 *   dinp^T[C,N] += w[C,OC]   . dout^T[OC,N]
 *   dw^T[C,OC]  += inp^T[C,N] . dout^T[OC,N]^T   (transb)
 * Every GEMM runs with CUBLAS_COMPUTE_32F (fp32 accumulation; with fp32 operands that is true
 * fp32, TF32 off). cuBLASLt picks the same algorithm for the same shapes, alignments and
 * workspace limit, and its split-K reductions are not atomic, so results repeat bit for bit. */
#include <pthread.h>
#include <stdint.h>

#include "ops_cuda_common.cuh"

/* ---- stream-ordered scratch ---- */

/* From the device's default pool, which the backend instance told to keep its memory
 * (nb_cuda_instance_open), so steps do not pay for fresh mappings. */
void *nb_cuda_scratch(size_t bytes, cudaStream_t stream) {
    if (bytes == 0) return NULL;
    void *p = NULL;
    CUDA_CHECK(cudaMallocAsync(&p, bytes, stream));
    return p;
}

void nb_cuda_scratch_free(void *p, cudaStream_t stream) {
    if (p) CUDA_CHECK(cudaFreeAsync(p, stream));
}

/* ---- column reductions, second pass ---- */

/* blockIdx.y = 0: dst0[c] += sum over k of part0[k][c]; 1: the same for dst1 / part1 (a NULL dst:
 * nothing). COLF_LANES row lanes add k = lane, lane + COLF_LANES, ... in order, then the lane sums
 * are added in lane order: fixed by the shapes, and 16 loads in flight per column where one
 * thread per column walked all the partials (gpt2 B=32: 256 of them, 9 us a call). */
#define COLF_LANES 16
static __global__ void col_finish_kernel(float *dst0, const float *part0, float *dst1, const float *part1, int nparts,
                                         int ncols) {
    __shared__ float sh[COLF_LANES][33];
    float *dst = blockIdx.y ? dst1 : dst0;
    const float *part = blockIdx.y ? part1 : part0;
    if (!dst) return; /* uniform over the block */
    const int c = blockIdx.x * 32 + threadIdx.x;
    float s = 0.0f;
    if (c < ncols)
        for (int k = threadIdx.y; k < nparts; k += COLF_LANES) s += part[(size_t)k * ncols + c];
    sh[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < ncols) {
        float t = 0.0f;
        for (int i = 0; i < COLF_LANES; i++) t += sh[i][threadIdx.x];
        dst[c] += t;
    }
}

void nb_col_finish2(float *dst0, const float *part0, float *dst1, const float *part1, int nparts, int ncols,
                    cudaStream_t stream) {
    if (ncols <= 0 || (!dst0 && !dst1)) return;
    dim3 grid((unsigned)(ncols + 31) / 32, dst1 ? 2 : 1);
    col_finish_kernel<<<grid, dim3(32, COLF_LANES), 0, stream>>>(dst0, part0, dst1, part1, nparts, ncols);
    CUDA_CHECK_LAUNCH("column reduction (second pass)");
}

void nb_col_finish(float *dst, const float *part, int nparts, int ncols, cudaStream_t stream) {
    nb_col_finish2(dst, part, NULL, NULL, nparts, ncols, stream);
}

/* ---- cuBLASLt ---- */

/* Fixed, so the algorithm choice never depends on memory pressure. */
#define LT_MAX_WORKSPACE ((size_t)32 << 20)
#define WS_SLOTS 64

/* What nb_blas_t points to: a backend instance's cuBLASLt handle and its GEMM workspaces, one per
 * stream, made on the stream's first GEMM outside a graph capture and kept: otherwise each GEMM
 * is a cudaMallocAsync, the GEMM and a cudaFreeAsync, and in a captured step three graph nodes
 * where one does (issue 18: the proxy's step is launch-bound). Work on one stream runs in order,
 * so its GEMMs can share one buffer; each lane has its own stream. A stream first seen inside a
 * capture takes scratch instead. The buffers live as long as the instance (a few per run). */
typedef struct {
    cublasLtHandle_t h;
    pthread_mutex_t mu;
    int nslots;
    struct {
        cudaStream_t stream;
        int device;
        void *p;
    } slot[WS_SLOTS];
} lt_instance;

extern "C" nb_blas_t nb_cuda_blas_create(void) {
    lt_instance *lt = (lt_instance *)nb_calloc(1, sizeof *lt, "the cuBLASLt instance");
    CUBLAS_CHECK(cublasLtCreate(&lt->h));
    NB_CHECK(pthread_mutex_init(&lt->mu, NULL) == 0, "this is a bug in nobubble; please report it",
             "pthread_mutex_init failed for the cuBLASLt instance");
    return lt;
}
extern "C" void nb_cuda_blas_destroy(nb_blas_t blas) {
    lt_instance *lt = (lt_instance *)blas;
    if (!lt) return;
    for (int i = 0; i < lt->nslots; i++) CUDA_CHECK(cudaFree(lt->slot[i].p)); /* waits for the GEMMs using it */
    CUBLAS_CHECK(cublasLtDestroy(lt->h));
    pthread_mutex_destroy(&lt->mu);
    free(lt);
}

static uint32_t ptr_align(const void *p) {
    uint32_t a = 256;
    while (a > 1 && ((uintptr_t)p % a) != 0) a >>= 1;
    return a;
}

/* The instance's workspace for stream (above), or NULL: take scratch. */
static void *cached_workspace(lt_instance *lt, cudaStream_t stream) {
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    void *p = NULL;
    pthread_mutex_lock(&lt->mu);
    for (int i = 0; i < lt->nslots && !p; i++)
        if (lt->slot[i].stream == stream && lt->slot[i].device == dev) p = lt->slot[i].p;
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    if (!p && lt->nslots < WS_SLOTS && cudaStreamIsCapturing(stream, &cap) == cudaSuccess &&
        cap == cudaStreamCaptureStatusNone) {
        CUDA_CHECK(cudaMalloc(&p, LT_MAX_WORKSPACE));
        lt->slot[lt->nslots].stream = stream, lt->slot[lt->nslots].device = dev, lt->slot[lt->nslots].p = p;
        lt->nslots++;
    }
    pthread_mutex_unlock(&lt->mu);
    return p;
}

/* Which of the heuristic's ranked algorithms a GEMM takes (past the end of the list, the last).
 * The list is a function of the shapes, the device and the library, so any fixed index gives the
 * same bits on every run. The first, except where lt_tuned lists a measured better one. */
#define LT_MAX_CANDIDATES 8

/* Measured exceptions (H200, cuBLAS 13, 2026-12-03, bench/NOTES.md session 13): gpt2's fc GEMMs,
 * where the heuristic's first GELU-epilogue choices ran at ~470 TFLOP/s against ~750-780 for the
 * plain GEMMs of the same size. Only the shapes measured: a rank is a property of one shape's list
 * (at N = 65536 the forward's fourth was a 64x512 tile, 33% slower than the first). */
static const struct {
    cublasLtEpilogue_t epi;
    int m, n, k, index; /* the GEMM as nb_lt_gemm has it; index: the rank taken */
} lt_tuned[] = {
    {CUBLASLT_EPILOGUE_GELU_AUX_BIAS, 3072, 32768, 768, 3}, /* gpt2 B=32 fc forward: 327 -> 284 us */
    {CUBLASLT_EPILOGUE_DGELU, 3072, 32768, 768, 3},         /* gpt2 B=32 fc-proj backward: 334 -> 304 us */
    {CUBLASLT_EPILOGUE_DGELU, 3072, 65536, 768, 3},         /* gpt2 B=64: 657 -> 586 us */
};

/* The table was measured on sm_90 with cuBLAS 13: elsewhere the lists differ, and it stays out.
 * (Asked only for a GEMM the table names: a few per layer.) */
static int lt_tuned_applies(void) {
    int dev = 0, major = 0, minor = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    return major == 9 && minor == 0 && cublasLtGetVersion() / 10000 == 13;
}

static int lt_candidate_index(const nb_lt_gemm *g) {
    for (size_t i = 0; i < sizeof lt_tuned / sizeof lt_tuned[0]; i++)
        if (lt_tuned[i].epi == g->epi && lt_tuned[i].m == g->m && lt_tuned[i].n == g->n && lt_tuned[i].k == g->k &&
            lt_tuned_applies())
            return lt_tuned[i].index;
    return 0;
}

int nb_lt_run(const nb_lt_gemm *g, nb_blas_t blas, cudaStream_t stream, int may_fail) {
    NB_ASSERT(blas != NULL); /* the launcher's caller passes its backend instance's handle */
    lt_instance *lt = (lt_instance *)blas;
    cublasLtHandle_t lt_handle = lt->h;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulPreference_t pref;
    cublasOperation_t ta = g->transa ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t tb = g->transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (g->epi != CUBLASLT_EPILOGUE_DEFAULT)
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &g->epi, sizeof g->epi));
    if (g->bias)
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias,
                                                    sizeof g->bias));
    if (g->aux) {
        int64_t ldaux = g->ldd;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g->aux,
                                                    sizeof g->aux));
        CUBLAS_CHECK(
            cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ldaux, sizeof ldaux));
    }
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, g->tab, g->transa ? g->k : g->m, g->transa ? g->m : g->k, g->lda));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, g->tab, g->transb ? g->n : g->k, g->transb ? g->k : g->n, g->ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ld, g->td, g->m, g->n, g->ldd));

    /* Tell the heuristic the real alignments: its default assumes 256-byte aligned pointers,
     * and a view such as qkv + NH*HS is not. */
    const void *Cm = g->C ? g->C : g->D;
    uint32_t al_a = ptr_align(g->A), al_b = ptr_align(g->B), al_d = ptr_align(g->D), al_c = ptr_align(Cm);
    size_t max_ws = LT_MAX_WORKSPACE;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_ws,
                                                      sizeof max_ws));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a,
                                                      sizeof al_a));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b,
                                                      sizeof al_b));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c,
                                                      sizeof al_c));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d,
                                                      sizeof al_d));

    cublasLtMatmulHeuristicResult_t cand[LT_MAX_CANDIDATES];
    const int pick = lt_candidate_index(g);
    int nres = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt_handle, op, la, lb, ld, ld, pref, pick + 1, cand, &nres);
    int found = st == CUBLAS_STATUS_SUCCESS && nres > 0;
    const cublasLtMatmulHeuristicResult_t heur = cand[found ? (pick < nres ? pick : nres - 1) : 0];
    if (!found && !may_fail)
        nb_fail("a shape or alignment cuBLASLt cannot handle; report the shapes to the nobubble developers",
                "cuBLASLt has no algorithm for a %dx%dx%d GEMM (transa %d, transb %d, epilogue %d, "
                "alignments %u/%u/%u): %s",
                g->m, g->n, g->k, g->transa, g->transb, (int)g->epi, al_a, al_b, al_d,
                cublasLtGetStatusString(st));
    if (found) {
        float alpha = 1.0f, beta = g->beta;
        void *kept = heur.workspaceSize ? cached_workspace(lt, stream) : NULL;
        void *ws = kept ? kept : nb_cuda_scratch(heur.workspaceSize, stream);
        CUBLAS_CHECK(cublasLtMatmul(lt_handle, op, &alpha, g->A, la, g->B, lb, &beta, Cm, ld, g->D, ld, &heur.algo,
                                    ws, heur.workspaceSize, stream));
        if (!kept) nb_cuda_scratch_free(ws, stream);
    }
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(op);
    return found;
}

/* ---- forward ---- */

/* act.cu's launchers by element type, for the unfused halves below. */
static void gelu_forward(float *out, const float *pre, size_t n, cudaStream_t s) {
    nb_cuda_gelu_forward_f32(out, pre, n, s);
}
static void gelu_forward(nb_bf16 *out, const nb_bf16 *pre, size_t n, cudaStream_t s) {
    nb_cuda_gelu_forward_bf16(out, pre, n, s);
}
static void gelu_backward_scale(float *x, const float *pre, size_t n, cudaStream_t s) {
    nb_cuda_gelu_backward_scale_f32(x, pre, n, s);
}
static void gelu_backward_scale(nb_bf16 *x, const nb_bf16 *pre, size_t n, cudaStream_t s) {
    nb_cuda_gelu_backward_scale_bf16(x, pre, n, s);
}
static void residual_forward(float *out, const float *a, const float *b, size_t n, cudaStream_t s) {
    nb_cuda_residual_forward_f32(out, a, b, n, s);
}
static void residual_forward(nb_bf16 *out, const nb_bf16 *a, const nb_bf16 *b, size_t n, cudaStream_t s) {
    nb_cuda_residual_forward_bf16(out, a, b, n, s);
}
/* The GEMMs' type of ops_cuda.h's element types; bf16 is the mode with fused epilogues (fp32 is the
 * tight-parity mode: act.c's order of roundings, so no fusion). */
static cudaDataType_t lt_type(const float *) { return CUDA_R_32F; }
static cudaDataType_t lt_type(const nb_bf16 *) { return CUDA_R_16BF; }
template <typename T> static int fuses(const T *p) { return lt_type(p) == CUDA_R_16BF; }

static void check_shapes(const char *op, int N, int C, int OC) {
    NB_CUDA_SHAPE(N >= 0 && C > 0 && OC >= 0, op);
}

/* out^T = w^T . inp^T (+ bias, GELU per epi). Returns 0 if cuBLASLt had no algorithm and may_fail. */
static int linear_forward(void *out, void *pre, const void *inp, const void *w, const void *bias, int N, int C,
                          int OC, cudaDataType_t t, cublasLtEpilogue_t epi, nb_blas_t lt, cudaStream_t stream, int may_fail) {
    nb_lt_gemm g = {};
    g.m = OC, g.n = N, g.k = C;
    g.transa = 1, g.transb = 0;
    g.A = w, g.lda = C;
    g.B = inp, g.ldb = C;
    g.D = out, g.ldd = OC;
    g.tab = t, g.td = t;
    g.beta = 0.0f;
    g.epi = epi;
    g.bias = bias;
    g.aux = pre;
    return nb_lt_run(&g, lt, stream, may_fail);
}

template <typename T>
static void matmul_forward(T *out, const T *inp, const T *w, const T *bias, int N, int C, int OC, nb_blas_t lt,
                           cudaStream_t stream, const char *name) {
    check_shapes(name, N, C, OC);
    NB_CUDA_SHAPE(out && inp && w, name);
    if (N == 0 || OC == 0) return;
    linear_forward(out, NULL, inp, w, bias, N, C, OC, lt_type(out),
                   bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT, lt, stream, 0);
}

/* bf16: GELU fused into the GEMM's epilogue (cuBLASLt's tanh GELU; it also writes pre to the
 * aux buffer), which needs OC divisible by 8 and 16-byte aligned outputs; otherwise, or if
 * cuBLASLt offers no fused algorithm, the GEMM writes pre and a separate GELU reads it. fp32 is
 * the tight-parity mode, so it always takes the separate GELU, whose formula is act.c's. */
template <typename T>
static void matmul_gelu_forward(T *out, T *pre, const T *inp, const T *w, const T *bias, int N, int C, int OC,
                                nb_blas_t lt, cudaStream_t stream, const char *name) {
    check_shapes(name, N, C, OC);
    NB_CUDA_SHAPE(out && pre && inp && w && out != pre, name);
    if (N == 0 || OC == 0) return;
    const int fuse = fuses(out);
    int fusable = fuse && OC % 8 == 0 && ptr_align(pre) >= 16 && ptr_align(out) >= 16;
    cublasLtEpilogue_t epi = bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    if (fusable && linear_forward(out, pre, inp, w, bias, N, C, OC, lt_type(out), epi, lt, stream, 1)) return;
    if (fuse)
        nb_log(2, "matmul+gelu %dx%dx%d: GELU not fused (OC %% 8 = %d, or no cuBLASLt algorithm)", N, C, OC, OC % 8);
    matmul_forward(pre, inp, w, bias, N, C, OC, lt, stream, name);
    gelu_forward(out, pre, (size_t)N * OC, stream);
}

/* ---- forward with the residual add (issue 18) ---- */

/* out = resid + inp @ w^T + bias in one GEMM: resid is cuBLASLt's C matrix (beta = 1, C != D),
 * so the separate residual kernel (read 2, write 1 of N x OC) disappears. bf16 only (fp32 is the
 * tight-parity mode and keeps act.c's order: round(matmul) then the add); if cuBLASLt has no
 * algorithm, the GEMM and nb_cuda_residual_forward. bf16 rounds once (fp32 accumulator + resid +
 * bias) instead of twice. */
template <typename T>
static void matmul_residual_forward(T *out, const T *inp, const T *w, const T *bias, const T *resid, int N, int C,
                                    int OC, nb_blas_t lt, cudaStream_t stream, const char *name) {
    check_shapes(name, N, C, OC);
    NB_CUDA_SHAPE(out && inp && w && resid && (const void *)out != (const void *)resid, name);
    if (N == 0 || OC == 0) return;
    if (fuses(out)) {
        nb_lt_gemm g = {};
        g.m = OC, g.n = N, g.k = C;
        g.transa = 1, g.transb = 0;
        g.A = w, g.lda = C;
        g.B = inp, g.ldb = C;
        g.D = out, g.ldd = OC;
        g.C = resid;
        g.tab = lt_type(out), g.td = lt_type(out);
        g.beta = 1.0f;
        g.epi = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
        g.bias = bias;
        if (nb_lt_run(&g, lt, stream, 1)) return;
        nb_log(2, "matmul+residual %dx%dx%d: residual not fused (no cuBLASLt algorithm)", N, C, OC);
    }
    matmul_forward(out, inp, w, bias, N, C, OC, lt, stream, name);
    residual_forward(out, resid, out, (size_t)N * OC, stream);
}

/* ---- backward ---- */

/* part[blockIdx.y][c] = sum of dout[r][c] over this block's NB_COL_ROWS rows: 32 columns per
 * block (coalesced), 8 row lanes summed in a fixed order through shared memory. */
template <typename T> static __global__ void dbias_part_kernel(float *part, const T *dout, int N, int OC) {
    __shared__ float sh[8][33];
    int c = blockIdx.x * 32 + threadIdx.x;
    int r0 = blockIdx.y * NB_COL_ROWS, r1 = min(N, r0 + NB_COL_ROWS);
    float acc = 0.0f;
    if (c < OC)
        for (int r = r0 + threadIdx.y; r < r1; r += 8) acc += nb_ld(dout + (size_t)r * OC + c);
    sh[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < OC) {
        float s = 0.0f;
        for (int i = 0; i < 8; i++) s += sh[i][threadIdx.x];
        part[(size_t)blockIdx.y * OC + c] = s;
    }
}

/* The same partial sums for bf16 rows of 16-byte vectors (OC % 8 == 0, dout 16-byte aligned): a
 * thread takes 8 adjacent columns, so a warp reads 512 contiguous bytes per row instead of 64.
 * Each column still gets row lane y's rows r0 + y, r0 + y + 8, ... in that order and the lanes
 * added 0..7: the bits of dbias_part_kernel. */
static __global__ void dbias_part_v8_kernel(float *part, const nb_bf16_t *dout, int N, int OC) {
    __shared__ float sh[8][8][33]; /* [row lane][element][column vector]: no bank conflicts */
    const int v = blockIdx.x * 32 + threadIdx.x, nv = OC / 8;
    const int r0 = blockIdx.y * NB_COL_ROWS, r1 = min(N, r0 + NB_COL_ROWS);
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (v < nv)
        for (int r = r0 + threadIdx.y; r < r1; r += 8) {
            float x[8];
            nb_bf16x8_unpack(*(const uint4 *)(dout + (size_t)r * OC + (size_t)v * 8), x);
#pragma unroll
            for (int e = 0; e < 8; e++) acc[e] += x[e];
        }
#pragma unroll
    for (int e = 0; e < 8; e++) sh[threadIdx.y][e][threadIdx.x] = acc[e];
    __syncthreads();
    /* 256 threads, 256 columns: thread (x, y) finishes element y of vector x */
    const int e = threadIdx.y, c = v * 8 + e;
    if (v < nv) {
        float s = 0.0f;
        for (int i = 0; i < 8; i++) s += sh[i][e][threadIdx.x];
        part[(size_t)blockIdx.y * OC + c] = s;
    }
}

/* dbias[OC] += column sums of dout[N, OC] (bf: bf16 elements), our two-pass fixed-order reduction. */
static void dbias_reduce(float *dbias, const void *dout, int bf, int N, int OC, cudaStream_t stream, const char *name) {
    int nparts = nb_col_parts(N);
    NB_CUDA_SHAPE(nparts <= 65535, name);
    float *part = (float *)nb_cuda_scratch((size_t)nparts * OC * sizeof(float), stream);
    dim3 grid((OC + 31) / 32, nparts);
    if (bf && OC % 8 == 0 && ((uintptr_t)dout & 15u) == 0)
        dbias_part_v8_kernel<<<dim3((OC / 8 + 31) / 32, nparts), dim3(32, 8), 0, stream>>>(part, (const nb_bf16_t *)dout,
                                                                                         N, OC);
    else if (bf)
        dbias_part_kernel<<<grid, dim3(32, 8), 0, stream>>>(part, (const nb_bf16_t *)dout, N, OC);
    else
        dbias_part_kernel<<<grid, dim3(32, 8), 0, stream>>>(part, (const float *)dout, N, OC);
    CUDA_CHECK_LAUNCH("matmul dbias (first pass)");
    nb_col_finish(dbias, part, nparts, OC, stream);
    nb_cuda_scratch_free(part, stream);
}

/* dinp[N, C] += dout @ w (beta 1), or = when overwrite (beta 0). */
static void dinp_gemm(void *dinp, const void *dout, const void *w, int N, int C, int OC, cudaDataType_t ct,
                      int overwrite, nb_blas_t lt, cudaStream_t stream) {
    nb_lt_gemm g = {};
    g.m = C, g.n = N, g.k = OC;
    g.A = w, g.lda = C;
    g.B = dout, g.ldb = OC;
    g.D = dinp, g.ldd = C;
    g.tab = ct, g.td = ct;
    g.beta = overwrite ? 0.0f : 1.0f;
    g.epi = CUBLASLT_EPILOGUE_DEFAULT;
    nb_lt_run(&g, lt, stream, 0);
}

/* dw[OC, C] += dout^T @ inp (a cuBLASLt GEMM), and dbias[OC] += column sums of dout (ours). */
static void dw_dbias(float *dw, float *dbias, const void *dout, const void *inp, int N, int C, int OC,
                     cudaDataType_t ct, nb_blas_t lt, cudaStream_t stream, const char *name) {
    if (dw) {
        nb_lt_gemm g = {};
        g.m = C, g.n = OC, g.k = N;
        g.transb = 1;
        g.A = inp, g.lda = C;
        g.B = dout, g.ldb = OC;
        g.D = dw, g.ldd = C;
        g.tab = ct, g.td = CUDA_R_32F;
        g.beta = 1.0f;
        g.epi = CUBLASLT_EPILOGUE_DEFAULT;
        nb_lt_run(&g, lt, stream, 0);
    }
    if (dbias) dbias_reduce(dbias, dout, ct == CUDA_R_16BF, N, OC, stream, name);
}

template <typename T>
static void matmul_backward(T *dinp, float *dw, float *dbias, const T *dout, const T *inp, const T *w, int N, int C,
                            int OC, nb_blas_t lt, cudaStream_t stream, const char *name) {
    check_shapes(name, N, C, OC);
    NB_CUDA_SHAPE(dout && (!dinp || w) && (!dw || inp), name);
    if (N == 0 || OC == 0) return;
    if (dinp) dinp_gemm(dinp, dout, w, N, C, OC, lt_type(dout), 0, lt, stream);
    dw_dbias(dw, dbias, dout, inp, N, C, OC, lt_type(dout), lt, stream, name);
}

/* As matmul_backward, but dinp is WRITTEN (beta 0: its old contents, NaN included, are never
 * read), so the caller needs no memset of it and the GEMM no read of it. */
template <typename T>
static void matmul_backward_set(T *dinp, float *dw, float *dbias, const T *dout, const T *inp, const T *w, int N,
                                int C, int OC, nb_blas_t lt, cudaStream_t stream, const char *name) {
    check_shapes(name, N, C, OC);
    NB_CUDA_SHAPE(dout && (!dinp || w) && (!dw || inp), name);
    if (N == 0) return;
    if (dinp && OC == 0) CUDA_CHECK(cudaMemsetAsync(dinp, 0, (size_t)N * C * sizeof(T), stream));
    if (OC == 0) return;
    if (dinp) dinp_gemm(dinp, dout, w, N, C, OC, lt_type(dout), 1, lt, stream);
    dw_dbias(dw, dbias, dout, inp, N, C, OC, lt_type(dout), lt, stream, name);
}

/* ---- backward through GELU (issue 18) ---- */

/* The backward of out = gelu(pre) @ w^T + bias, with inp = gelu(pre) saved by the forward:
 * dw += dout^T inp and dbias += column sums of dout (as nb_cuda_matmul_backward), and
 *   dpre = gelu'(pre) * (dout @ w)        WRITTEN, not accumulated,
 *   dbias_pre += column sums of dpre      (NULL skips; the bias gradient of the layer before),
 * bf16: the GELU derivative is cuBLASLt's DGELU epilogue on the fp32 accumulator (aux = pre,
 * which the forward's GELU_AUX epilogue wrote), so neither dout @ w (N x C) nor a separate GELU
 * backward kernel touches memory. fp32, unaligned tensors or no algorithm: the GEMM writes
 * dout @ w into dpre and a kernel multiplies it by gelu'(pre) in place (the unfused math, one
 * bf16 rounding more). dbias_pre is our reduction over dpre either way. */
static int dgelu_gemm(void *dpre, const void *dout, const void *w, const void *pre, int N, int C, int OC, nb_blas_t lt,
                      cudaStream_t stream) {
    if (C % 8 != 0 || ptr_align(pre) < 16 || ptr_align(dpre) < 16) return 0;
    nb_lt_gemm g = {};
    g.m = C, g.n = N, g.k = OC;
    g.A = w, g.lda = C;
    g.B = dout, g.ldb = OC;
    g.D = dpre, g.ldd = C;
    g.tab = CUDA_R_16BF, g.td = CUDA_R_16BF;
    g.beta = 0.0f;
    g.epi = CUBLASLT_EPILOGUE_DGELU;
    g.aux = (void *)pre;
    if (nb_lt_run(&g, lt, stream, 1)) return 1;
    nb_log(2, "matmul+dgelu %dx%dx%d: GELU backward not fused (no cuBLASLt algorithm)", N, C, OC);
    return 0;
}

template <typename T>
static void matmul_dgelu_backward(T *dpre, float *dw, float *dbias, float *dbias_pre, const T *dout, const T *inp,
                                  const T *w, const T *pre, int N, int C, int OC, nb_blas_t lt, cudaStream_t stream,
                                  const char *name) {
    check_shapes(name, N, C, OC);
    NB_CUDA_SHAPE(dpre && dout && w && pre && (!dw || inp) && (const void *)dpre != (const void *)pre, name);
    if (N == 0) return;
    if (OC == 0) {
        CUDA_CHECK(cudaMemsetAsync(dpre, 0, (size_t)N * C * sizeof(T), stream));
        return;
    }
    const cudaDataType_t ct = lt_type(dout);
    dw_dbias(dw, dbias, dout, inp, N, C, OC, ct, lt, stream, name);
    if (!(fuses(dout) && dgelu_gemm(dpre, dout, w, pre, N, C, OC, lt, stream))) {
        dinp_gemm(dpre, dout, w, N, C, OC, ct, 1, lt, stream);
        gelu_backward_scale(dpre, pre, (size_t)N * C, stream);
    }
    if (dbias_pre) dbias_reduce(dbias_pre, dpre, ct == CUDA_R_16BF, N, C, stream, name);
}

/* ---- the extern "C" launchers (ops_cuda.h) ---- */

extern "C" void nb_cuda_matmul_forward_f32(float *out, const float *inp, const float *w, const float *bias, int N,
                                           int C, int OC, nb_blas_t lt, nb_stream_t stream) {
    matmul_forward(out, inp, w, bias, N, C, OC, lt, stream, __func__);
}
extern "C" void nb_cuda_matmul_forward_bf16(nb_bf16 *out, const nb_bf16 *inp, const nb_bf16 *w, const nb_bf16 *bias,
                                            int N, int C, int OC, nb_blas_t lt, nb_stream_t stream) {
    matmul_forward(out, inp, w, bias, N, C, OC, lt, stream, __func__);
}
extern "C" void nb_cuda_matmul_gelu_forward_f32(float *out, float *pre, const float *inp, const float *w,
                                                const float *bias, int N, int C, int OC, nb_blas_t lt,
                                                nb_stream_t stream) {
    matmul_gelu_forward(out, pre, inp, w, bias, N, C, OC, lt, stream, __func__);
}
extern "C" void nb_cuda_matmul_gelu_forward_bf16(nb_bf16 *out, nb_bf16 *pre, const nb_bf16 *inp, const nb_bf16 *w,
                                                 const nb_bf16 *bias, int N, int C, int OC, nb_blas_t lt,
                                                 nb_stream_t stream) {
    matmul_gelu_forward(out, pre, inp, w, bias, N, C, OC, lt, stream, __func__);
}
extern "C" void nb_cuda_matmul_residual_forward_f32(float *out, const float *inp, const float *w, const float *bias,
                                                    const float *resid, int N, int C, int OC, nb_blas_t lt,
                                                    nb_stream_t stream) {
    matmul_residual_forward(out, inp, w, bias, resid, N, C, OC, lt, stream, __func__);
}
extern "C" void nb_cuda_matmul_residual_forward_bf16(nb_bf16 *out, const nb_bf16 *inp, const nb_bf16 *w,
                                                     const nb_bf16 *bias, const nb_bf16 *resid, int N, int C, int OC,
                                                     nb_blas_t lt, nb_stream_t stream) {
    matmul_residual_forward(out, inp, w, bias, resid, N, C, OC, lt, stream, __func__);
}
extern "C" void nb_cuda_matmul_backward_f32(float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                                            const float *w, int N, int C, int OC, nb_blas_t lt, nb_stream_t stream) {
    matmul_backward(dinp, dw, dbias, dout, inp, w, N, C, OC, lt, stream, __func__);
}
extern "C" void nb_cuda_matmul_backward_bf16(nb_bf16 *dinp, float *dw, float *dbias, const nb_bf16 *dout,
                                             const nb_bf16 *inp, const nb_bf16 *w, int N, int C, int OC, nb_blas_t lt,
                                             nb_stream_t stream) {
    matmul_backward(dinp, dw, dbias, dout, inp, w, N, C, OC, lt, stream, __func__);
}
extern "C" void nb_cuda_matmul_backward_set_f32(float *dinp, float *dw, float *dbias, const float *dout,
                                                const float *inp, const float *w, int N, int C, int OC, nb_blas_t lt,
                                                nb_stream_t stream) {
    matmul_backward_set(dinp, dw, dbias, dout, inp, w, N, C, OC, lt, stream, __func__);
}
extern "C" void nb_cuda_matmul_backward_set_bf16(nb_bf16 *dinp, float *dw, float *dbias, const nb_bf16 *dout,
                                                 const nb_bf16 *inp, const nb_bf16 *w, int N, int C, int OC,
                                                 nb_blas_t lt, nb_stream_t stream) {
    matmul_backward_set(dinp, dw, dbias, dout, inp, w, N, C, OC, lt, stream, __func__);
}
extern "C" void nb_cuda_matmul_dgelu_backward_f32(float *dpre, float *dw, float *dbias, float *dbias_pre,
                                                  const float *dout, const float *inp, const float *w,
                                                  const float *pre, int N, int C, int OC, nb_blas_t lt,
                                                  nb_stream_t stream) {
    matmul_dgelu_backward(dpre, dw, dbias, dbias_pre, dout, inp, w, pre, N, C, OC, lt, stream, __func__);
}
extern "C" void nb_cuda_matmul_dgelu_backward_bf16(nb_bf16 *dpre, float *dw, float *dbias, float *dbias_pre,
                                                   const nb_bf16 *dout, const nb_bf16 *inp, const nb_bf16 *w,
                                                   const nb_bf16 *pre, int N, int C, int OC, nb_blas_t lt,
                                                   nb_stream_t stream) {
    matmul_dgelu_backward(dpre, dw, dbias, dbias_pre, dout, inp, w, pre, N, C, OC, lt, stream, __func__);
}
