/* The seqctr ops on CUDA (ops_ctr_cuda.h), the GPU side of backend_ctr.h's table.
 *
 * Determinism without float atomics, op by op:
 * - emb_grad_unique: backend_ctr.h's chunked order (the CPU's, so fp32 gives the CPU's bits),
 *   by ctr_tc.cu's two passes; the previous kernel here (NB_CTR_KERNELS=old), one warp per unique
 *   row, gives the same bits with a hot row as one warp's serial chain.
 * - history self-attention in bf16: ctr_tc.cu's tensor-core kernels where they apply; the
 *   CUDA-core kernels below for fp32, other head sizes and NB_CTR_KERNELS=old. Target attention
 *   in bf16 likewise: ctr_tc.cu's warp per sample, or the block per sample below.
 * - cross and linear1 parameter gradients: cuBLASLt GEMMs (non-atomic split-K, see matmul.cu)
 *   and column sums over fixed blocks of NB_COL_ROWS rows finished by nb_col_finish.
 * - bce: one block, each thread a contiguous run of indices in order, then a fixed tree, in double.
 * - attention: every gradient element has one writer (query rows in one kernel, key rows in
 *   another), each summing over the other side in index order.
 * Loads and stores convert at the memory boundary (nb_ld / nb_st); all arithmetic is fp32. */
#include <math.h>
#include <stdint.h>

#include <stdlib.h>
#include <string.h>

#include "ops/backend_ctr.h"
#include "ops/ops_ctr_cuda.h"
#include "ops_cuda_common.cuh"

/* The chunks of emb_grad_unique's order are whole batches of the old kernel's 32 lookups. */
static_assert(NB_EMB_GRAD_CHUNK % 32 == 0, "NB_EMB_GRAD_CHUNK must be a multiple of 32");

/* ---- which kernels (ops_ctr_cuda.h): -1 = not decided yet, then NB_CTR_KERNELS's choice:
 * 0 (old) the previous kernels; 1 (default) the tensor-core history attention and the two-pass
 * embedding gradient; 2 (all) also the warp-per-sample target attention, which measured slower
 * than the block-per-sample kernel on the H200 (2026-12-01: 124 vs 94 us forward, 482 vs 229 us
 * backward at B=4096), so it is not the default ---- */
static int ctr_new = -1;
extern "C" int nb_cuda_ctr_kernels_new(void) {
    if (ctr_new < 0) {
        const char *v = getenv("NB_CTR_KERNELS");
        ctr_new = v && strcmp(v, "old") == 0 ? 0 : v && strcmp(v, "all") == 0 ? 2 : 1;
    }
    return ctr_new;
}
extern "C" void nb_cuda_ctr_kernels_set(int use_new) { ctr_new = use_new ? 2 : 0; }

#define THREADS 256
#define WARPS (THREADS / 32)

/* Dynamic shared memory of every kernel here; float4 so rows can be read 16 bytes at a time. */
extern __shared__ float4 ctr_smem[];

#define GRID_STRIDE(i, n)                                                                          \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

/* ---- four consecutive elements in one access (16 bytes fp32, 8 bytes bf16; p aligned to it) ---- */

static __device__ __forceinline__ float4 ld4(const float *p) { return *(const float4 *)p; }
static __device__ __forceinline__ float4 ld4(const nb_bf16_t *p) {
    uint2 u = *(const uint2 *)p; /* little endian: element 0 is the low half of u.x */
    return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u), __uint_as_float(u.y << 16),
                       __uint_as_float(u.y & 0xffff0000u));
}
static __device__ __forceinline__ void st4(float *p, float4 v) { *(float4 *)p = v; }
static __device__ __forceinline__ uint32_t bf16x2_bits(float lo, float hi) {
    return (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(lo)) |
           ((uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(hi)) << 16);
}
static __device__ __forceinline__ void st4(nb_bf16_t *p, float4 v) {
    *(uint2 *)p = make_uint2(bf16x2_bits(v.x, v.y), bf16x2_bits(v.z, v.w));
}

/* Host side: may a pointer to elements of es bytes take ld4/st4 (NULL: it is not accessed)? */
static int al4(const void *p, size_t es) { return p == NULL || (uintptr_t)p % (4 * es) == 0; }

static __device__ __forceinline__ float relu_f(float x) { return x > 0.0f ? x : 0.0f; }
static __device__ __forceinline__ float relu_bwd_f(float d, float x, float g) { return x > 0.0f ? d + g : d; }
/* c = x0 * u + x, with u in c's buffer (nb_cross_forward's order of operations) */
static __device__ __forceinline__ float cross_f(float u, float x0, float x) { return x0 * u + x; }

#define MAP4_1(F, a) make_float4(F(a.x), F(a.y), F(a.z), F(a.w))
#define MAP4_3(F, a, b, c) make_float4(F(a.x, b.x, c.x), F(a.y, b.y, c.y), F(a.z, b.z, c.z), F(a.w, b.w, c.w))

/* ---- elementwise kernels: each thread owns four consecutive elements (one vector access when
 * vec, else four scalar ones: unaligned pointers and the tail), so out may alias an input ---- */

/* name(out, a, b, c, n, vec): out[i] = F(a[i], b[i], c[i]), four elements per thread */
#define ELEM3_KERNEL(T, name, F)                                                                   \
    static __global__ void name(T *out, const T *a, const T *b, const T *c, size_t n, int vec) {   \
        GRID_STRIDE(g, (n + 3) / 4) {                                                              \
            size_t i = 4 * g;                                                                      \
            if (vec && i + 4 <= n) {                                                               \
                float4 x = ld4(a + i), y = ld4(b + i), z = ld4(c + i);                             \
                st4(out + i, MAP4_3(F, x, y, z));                                                  \
            } else {                                                                               \
                for (size_t k = i; k < n && k < i + 4; k++)                                        \
                    nb_st(out + k, F(nb_ld(a + k), nb_ld(b + k), nb_ld(c + k)));                   \
            }                                                                                      \
        }                                                                                          \
    }

#define DEF_ELEM_KERNELS(T)                                                                        \
    static __global__ void relu_fwd_kernel(T *out, const T *inp, size_t n, int vec) {              \
        GRID_STRIDE(g, (n + 3) / 4) {                                                              \
            size_t i = 4 * g;                                                                      \
            if (vec && i + 4 <= n)                                                                 \
                st4(out + i, MAP4_1(relu_f, ld4(inp + i)));                                        \
            else                                                                                   \
                for (size_t k = i; k < n && k < i + 4; k++) nb_st(out + k, relu_f(nb_ld(inp + k))); \
        }                                                                                          \
    }                                                                                              \
    /* out[i] = F(a[i], b[i], c[i]) for the three-input elementwise ops (out aliases a) */         \
    ELEM3_KERNEL(T, relu_bwd_kernel, relu_bwd_f)                                                   \
    ELEM3_KERNEL(T, cross_combine_kernel, cross_f)                                                 \
    /* dst[r, c] = (add ? dst[r, c] : 0) + src[r, c]; four columns per thread */                   \
    static __global__ void cols_kernel(T *dst, int ldd, const T *src, int lds, int rows, int cols, int add, \
                                       int vec) {                                                  \
        size_t cg = ((size_t)cols + 3) / 4;                                                        \
        GRID_STRIDE(g, (size_t)rows * cg) {                                                        \
            size_t r = g / cg;                                                                     \
            int c = (int)(g - r * cg) * 4;                                                         \
            T *d = dst + r * ldd + c;                                                              \
            const T *s = src + r * lds + c;                                                        \
            if (vec && c + 4 <= cols) {                                                            \
                float4 v = ld4(s);                                                                 \
                if (add) {                                                                         \
                    float4 o = ld4(d);                                                             \
                    v = make_float4(o.x + v.x, o.y + v.y, o.z + v.z, o.w + v.w);                   \
                }                                                                                  \
                st4(d, v);                                                                         \
            } else {                                                                               \
                for (int k = 0; k < 4 && c + k < cols; k++)                                        \
                    nb_st(d + k, add ? nb_ld(d + k) + nb_ld(s + k) : nb_ld(s + k));                \
            }                                                                                      \
        }                                                                                          \
    }
NB_FOR_EACH_DTYPE(DEF_ELEM_KERNELS)

/* ---- embeddings ---- */

/* Elements per lane per pass of emb_grad_unique: rows up to 128 wide take one pass. */
#define EGU_J 4

#define DEF_EMB_KERNELS(T)                                                                         \
    /* G consecutive lanes per lookup (G a power of two <= 32 sized to the row, so a warp copies \
     * two E = 64 rows at once); 16-byte loads when the row and its destination are aligned. */    \
    static __global__ void emb_gather_kernel(T *out, const int64_t *dst, const float *table, const int64_t *rows, \
                                             int n, int E, int G, int vec) {                       \
        size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;                                  \
        size_t i = t / G;                                                                          \
        int gl = (int)(t % G);                                                                     \
        if (i >= (size_t)n) return;                                                                \
        const float *tr = table + (size_t)rows[i] * E;                                             \
        int64_t o = dst[i];                                                                        \
        if (vec && (o & 3) == 0)                                                                   \
            for (int e = 4 * gl; e < E; e += 4 * G) st4(out + o + e, ld4(tr + e));                 \
        else                                                                                       \
            for (int e = gl; e < E; e += G) nb_st(out + o + e, tr[e]);                             \
    }                                                                                              \
    /* One warp per unique row; lane owns columns e0 + lane + 32 j. Each column is summed in      \
     * backend_ctr.h's order (chunks of NB_EMB_GRAD_CHUNK from 0 in k order, then the chunk sums  \
     * in order), as the CPU does; four lookups' loads are issued before their adds. The previous \
     * kernel (NB_CTR_KERNELS=old): a hot row is this warp's serial chain. */                     \
    static __global__ void emb_grad_unique_kernel(float *dunique, const T *src, const int64_t *src_off, \
                                                  const int32_t *order, const int32_t *seg,        \
                                                  const int32_t *count, int U, int E) {            \
        int u = blockIdx.x * WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;                  \
        if (u >= (count ? *count : U)) return;                                                     \
        int k0 = seg[u], k1 = seg[u + 1];                                                          \
        for (int e0 = 0; e0 < E; e0 += 32 * EGU_J) {                                               \
            float acc[EGU_J], tot[EGU_J];                                                          \
            _Pragma("unroll") for (int j = 0; j < EGU_J; j++) acc[j] = tot[j] = 0.0f;              \
            for (int kb = k0; kb < k1; kb += 32) {                                                 \
                int cnt = min(32, k1 - kb);                                                        \
                long long mine = lane < cnt ? (long long)src_off[order[kb + lane]] : 0;            \
                int q = 0;                                                                         \
                for (; q + 4 <= cnt; q += 4) {                                                     \
                    float v[4][EGU_J];                                                             \
                    _Pragma("unroll") for (int a = 0; a < 4; a++) {                                \
                        const T *s = src + __shfl_sync(0xffffffffu, mine, q + a);                  \
                        _Pragma("unroll") for (int j = 0; j < EGU_J; j++) {                        \
                            int e = e0 + lane + 32 * j;                                            \
                            v[a][j] = e < E ? nb_ld(s + e) : 0.0f;                                 \
                        }                                                                          \
                    }                                                                              \
                    _Pragma("unroll") for (int a = 0; a < 4; a++)                                  \
                        _Pragma("unroll") for (int j = 0; j < EGU_J; j++) acc[j] += v[a][j];       \
                }                                                                                  \
                for (; q < cnt; q++) {                                                             \
                    const T *s = src + __shfl_sync(0xffffffffu, mine, q);                          \
                    _Pragma("unroll") for (int j = 0; j < EGU_J; j++) {                            \
                        int e = e0 + lane + 32 * j;                                                \
                        if (e < E) acc[j] += nb_ld(s + e);                                         \
                    }                                                                              \
                }                                                                                  \
                /* a chunk ends (chunks are whole 32-lookup batches): fold it into the total */    \
                if ((kb - k0 + 32) % NB_EMB_GRAD_CHUNK == 0 || kb + 32 >= k1) {                    \
                    _Pragma("unroll") for (int j = 0; j < EGU_J; j++) {                            \
                        tot[j] = kb - k0 < NB_EMB_GRAD_CHUNK ? acc[j] : tot[j] + acc[j];           \
                        acc[j] = 0.0f;                                                             \
                    }                                                                              \
                }                                                                                  \
            }                                                                                      \
            _Pragma("unroll") for (int j = 0; j < EGU_J; j++) {                                    \
                int e = e0 + lane + 32 * j;                                                        \
                if (e < E) dunique[(size_t)u * E + e] = tot[j];                                    \
            }                                                                                      \
        }                                                                                          \
    }
NB_FOR_EACH_DTYPE(DEF_EMB_KERNELS)

/* ---- column sums over fixed row blocks (db of the cross, dw of linear1) ---- */

/* Block (32, 8) over 32 columns and rows [blockIdx.y * NB_COL_ROWS, +NB_COL_ROWS): writes the
 * block's column sums of the per-thread values acc to part[blockIdx.y] in a fixed order. */
static __device__ __forceinline__ void col_part_store(float *part, float acc, int c, int D) {
    __shared__ float sh[8][33];
    sh[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < D) {
        float s = 0.0f;
        for (int i = 0; i < 8; i++) s += sh[i][threadIdx.x];
        part[(size_t)blockIdx.y * D + c] = s;
    }
}

#define DEF_COLS_KERNELS(T)                                                                        \
    /* One pass of the cross backward over [N, D]: dx0 += dc * u (u read from buf), dx += dc,    \
     * buf = du = dc * x0 (when want_du), and db's partial sums of du (when part). */              \
    static __global__ void cross_bwd_elem_kernel(T *dx0, T *dx, T *buf, float *part, const T *dc, const T *x0, \
                                                 int N, int D, int want_du) {                      \
        int c = blockIdx.x * 32 + threadIdx.x;                                                     \
        int r1 = min(N, (int)(blockIdx.y + 1) * NB_COL_ROWS);                                      \
        float acc = 0.0f;                                                                          \
        if (c < D)                                                                                 \
            for (int r = blockIdx.y * NB_COL_ROWS + threadIdx.y; r < r1; r += 8) {                 \
                size_t i = (size_t)r * D + c;                                                      \
                float g = nb_ld(dc + i);                                                           \
                if (dx0) nb_st(dx0 + i, nb_ld(dx0 + i) + g * nb_ld(buf + i));                      \
                if (dx) nb_st(dx + i, nb_ld(dx + i) + g);                                          \
                if (want_du || part) {                                                             \
                    float du = g * nb_ld(x0 + i);                                                  \
                    if (want_du) nb_st(buf + i, du);                                               \
                    acc += du;                                                                     \
                }                                                                                  \
            }                                                                                      \
        if (part) col_part_store(part, acc, c, D);                                                 \
    }                                                                                              \
    /* linear1 backward in one pass over x: dx += dz[r] w, and dw's partial sums of dz[r] x[r]. */ \
    static __global__ void linear1_bwd_kernel(T *dx, float *part, const float *dz, const T *x, const T *w, int N, \
                                              int D) {                                             \
        int c = blockIdx.x * 32 + threadIdx.x;                                                     \
        int r1 = min(N, (int)(blockIdx.y + 1) * NB_COL_ROWS);                                      \
        float acc = 0.0f;                                                                          \
        if (c < D) {                                                                               \
            float wc = nb_ld(w + c);                                                               \
            for (int r = blockIdx.y * NB_COL_ROWS + threadIdx.y; r < r1; r += 8) {                 \
                size_t i = (size_t)r * D + c;                                                      \
                float g = dz[r];                                                                   \
                if (dx) nb_st(dx + i, nb_ld(dx + i) + g * wc);                                     \
                if (part) acc += g * nb_ld(x + i);                                                 \
            }                                                                                      \
        }                                                                                          \
        if (part) col_part_store(part, acc, c, D);                                                 \
    }                                                                                              \
    /* z[i] = w . x[i] + b: one warp per row, lanes over columns, a fixed butterfly at the end. */ \
    static __global__ void linear1_fwd_kernel(float *z, const T *x, const T *w, const T *b, int N, int D, int vec) { \
        int i = blockIdx.x * WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;                  \
        if (i >= N) return;                                                                        \
        const T *xi = x + (size_t)i * D;                                                           \
        float s = 0.0f;                                                                            \
        if (vec) {                                                                                 \
            for (int k = 4 * lane; k < D; k += 128) {                                              \
                float4 a = ld4(xi + k), c = ld4(w + k);                                            \
                s += a.x * c.x;                                                                    \
                s += a.y * c.y;                                                                    \
                s += a.z * c.z;                                                                    \
                s += a.w * c.w;                                                                    \
            }                                                                                      \
        } else {                                                                                   \
            for (int k = lane; k < D; k += 32) s += nb_ld(xi + k) * nb_ld(w + k);                  \
        }                                                                                          \
        s = nb_warp_sum(s);                                                                        \
        if (lane == 0) z[i] = s + (b ? nb_ld(b) : 0.0f);                                           \
    }
NB_FOR_EACH_DTYPE(DEF_COLS_KERNELS)

/* db[0] += sum of dz: one block, contiguous runs per thread, then a fixed tree. */
static __global__ void sum_into_kernel(float *db, const float *dz, int N) {
    __shared__ float red[32];
    int per = (N + blockDim.x - 1) / blockDim.x, i0 = threadIdx.x * per, i1 = min(N, i0 + per);
    float s = 0.0f;
    for (int i = i0; i < i1; i++) s += dz[i];
    s = nb_block_sum(s, red);
    if (threadIdx.x == 0) db[0] += s;
}

/* ---- BCE with logits (relu.c's formulas, in double) ---- */

/* exp of a non-positive argument only: no overflow for any logit. */
static __device__ double bce_sigmoid(double z) {
    if (z >= 0) return 1.0 / (1.0 + exp(-z));
    double e = exp(z);
    return e / (1.0 + e);
}

#define BCE_THREADS 512

/* One block: thread t takes a contiguous run of indices in order, the runs are added in a fixed
 * tree. N is a batch (thousands): one block is plenty and keeps the sum in one place. */
static __global__ void bce_kernel(float *dz, double *loss, const float *z, const float *y, int N, float scale) {
    __shared__ double red[32];
    int per = (N + blockDim.x - 1) / blockDim.x, i0 = threadIdx.x * per, i1 = min(N, i0 + per);
    double s = 0.0;
    for (int i = i0; i < i1; i++) {
        double zi = z[i], yi = y[i];
        s += fmax(zi, 0.0) - zi * yi + log1p(exp(-fabs(zi)));
        if (dz) dz[i] += (float)((double)scale * (bce_sigmoid(zi) - yi));
    }
    s = nb_block_sum_d(s, red);
    if (threadIdx.x == 0 && loss) *loss += (double)scale * s;
}

/* ---- self-attention over packed histories ----
 * One block of SA_THREADS per (sample, head); a thread per query row (forward, dq) or key row
 * (dk, dv), in passes of SA_THREADS rows. The other side's rows of the head sit in shared memory
 * as fp32 rows padded to HSM (the head size rounded up to a compile-time 4..64, padding zero),
 * in tiles of up to SA_SMEM_BYTES; a history within one tile is loaded once, longer ones per pass
 * and tile. The inner loops read one shared row for the whole warp (a broadcast) 16 bytes at a
 * time and keep the thread's own row and accumulators in registers. */

#define SA_THREADS 64
#define SA_SMEM_BYTES (16 * 1024)

/* a = q . row over HSM (row: 16-byte aligned shared memory), in d order */
#define SA_DOT(a, q, row, HSM)                                                                     \
    do {                                                                                           \
        const float4 *r4_ = (const float4 *)(row);                                                 \
        a = 0.0f;                                                                                  \
        _Pragma("unroll") for (int d4_ = 0; d4_ < (HSM) / 4; d4_++) {                              \
            float4 k_ = r4_[d4_];                                                                  \
            a += q[4 * d4_] * k_.x;                                                                \
            a += q[4 * d4_ + 1] * k_.y;                                                            \
            a += q[4 * d4_ + 2] * k_.z;                                                            \
            a += q[4 * d4_ + 3] * k_.w;                                                            \
        }                                                                                          \
    } while (0)
/* acc += p * row */
#define SA_AXPY(acc, p, row, HSM)                                                                  \
    do {                                                                                           \
        const float4 *r4_ = (const float4 *)(row);                                                 \
        _Pragma("unroll") for (int d4_ = 0; d4_ < (HSM) / 4; d4_++) {                              \
            float4 v_ = r4_[d4_];                                                                  \
            acc[4 * d4_] += (p) * v_.x;                                                            \
            acc[4 * d4_ + 1] += (p) * v_.y;                                                        \
            acc[4 * d4_ + 2] += (p) * v_.z;                                                        \
            acc[4 * d4_ + 3] += (p) * v_.w;                                                        \
        }                                                                                          \
    } while (0)
#define SA_SCALE(acc, f, HSM) _Pragma("unroll") for (int d_ = 0; d_ < (HSM); d_++) acc[d_] *= (f)

/* Online softmax step for one key of score s (already scaled) and value row vrow. */
#define SA_ONLINE_KEY(s, vrow, HSM)                                                                \
    do {                                                                                           \
        if ((s) > m) {                                                                             \
            float f_ = expf(m - (s));                                                              \
            l *= f_;                                                                               \
            SA_SCALE(acc, f_, HSM);                                                                \
            m = (s);                                                                               \
        }                                                                                          \
        float p_ = expf((s) - m);                                                                  \
        l += p_;                                                                                   \
        SA_AXPY(acc, p_, vrow, HSM);                                                               \
    } while (0)

/* The sample and head of this block; returns from the kernel for an empty history. */
#define SA_PROLOGUE(T)                                                                             \
    int b = blockIdx.x, h = blockIdx.y, start = off[b], len = off[b + 1] - start;                  \
    if (len <= 0) return;                                                                          \
    int HS = E / H;                                                                                \
    float scale = 1.0f / sqrtf((float)HS);                                                         \
    size_t ld = 3 * (size_t)E;                                                                     \
    const T *base = qkv + (size_t)start * ld + (size_t)h * HS; /* row 0's q of this head */        \
    float *lse_h = (float *)lse + (size_t)start * H + (size_t)h * len /* this head's rows */

/* s[r * HSM + d] = src[r * ld + d] for r < rows, zero for HS <= d < HSM (the whole block). */
#define DEF_SA_LOAD(T)                                                                             \
    static __device__ __forceinline__ void sa_load(float *s, const T *src, size_t ld, int rows, int HS, int HSM) { \
        for (int x = threadIdx.x; x < rows * HSM; x += blockDim.x) {                               \
            int r = x / HSM, d = x - r * HSM;                                                      \
            s[x] = d < HS ? nb_ld(src + (size_t)r * ld + d) : 0.0f;                                \
        }                                                                                          \
    }
NB_FOR_EACH_DTYPE(DEF_SA_LOAD)

#define DEF_SEQATTN_FWD(T, HSM)                                                                    \
    static __global__ void __launch_bounds__(SA_THREADS)                                           \
        seqattn_fwd_kernel_##HSM(T *out, float *lse, const T *qkv, const int32_t *off, int H, int E, int tile) { \
        SA_PROLOGUE(T);                                                                            \
        float *sK = (float *)ctr_smem, *sV = sK + (size_t)tile * HSM;                              \
        for (int r0 = 0; r0 < len; r0 += SA_THREADS) {                                             \
            int i = r0 + threadIdx.x, act = i < len;                                               \
            float q[HSM], acc[HSM], m = -INFINITY, l = 0.0f;                                       \
            _Pragma("unroll") for (int d = 0; d < HSM; d++) {                                      \
                q[d] = act && d < HS ? nb_ld(base + (size_t)i * ld + d) : 0.0f;                    \
                acc[d] = 0.0f;                                                                     \
            }                                                                                      \
            for (int t0 = 0; t0 < len; t0 += tile) {                                               \
                int tl = min(tile, len - t0);                                                      \
                if (r0 == 0 || len > tile) {                                                       \
                    __syncthreads();                                                               \
                    sa_load(sK, base + (size_t)t0 * ld + E, ld, tl, HS, HSM);                      \
                    sa_load(sV, base + (size_t)t0 * ld + 2 * (size_t)E, ld, tl, HS, HSM);          \
                    __syncthreads();                                                               \
                }                                                                                  \
                if (!act) continue;                                                                \
                int j = 0;                                                                         \
                /* four scores, then at most one rescale for the four */                           \
                for (; j + 4 <= tl; j += 4) {                                                      \
                    float s0, s1, s2, s3;                                                          \
                    SA_DOT(s0, q, sK + (size_t)j * HSM, HSM);                                      \
                    SA_DOT(s1, q, sK + (size_t)(j + 1) * HSM, HSM);                                \
                    SA_DOT(s2, q, sK + (size_t)(j + 2) * HSM, HSM);                                \
                    SA_DOT(s3, q, sK + (size_t)(j + 3) * HSM, HSM);                                \
                    s0 *= scale, s1 *= scale, s2 *= scale, s3 *= scale;                            \
                    float cm = fmaxf(fmaxf(s0, s1), fmaxf(s2, s3));                                \
                    if (cm > m) {                                                                  \
                        float f = expf(m - cm);                                                    \
                        l *= f;                                                                    \
                        SA_SCALE(acc, f, HSM);                                                     \
                        m = cm;                                                                    \
                    }                                                                              \
                    SA_ONLINE_KEY(s0, sV + (size_t)j * HSM, HSM);                                  \
                    SA_ONLINE_KEY(s1, sV + (size_t)(j + 1) * HSM, HSM);                            \
                    SA_ONLINE_KEY(s2, sV + (size_t)(j + 2) * HSM, HSM);                            \
                    SA_ONLINE_KEY(s3, sV + (size_t)(j + 3) * HSM, HSM);                            \
                }                                                                                  \
                for (; j < tl; j++) {                                                              \
                    float s;                                                                       \
                    SA_DOT(s, q, sK + (size_t)j * HSM, HSM);                                       \
                    s *= scale;                                                                    \
                    SA_ONLINE_KEY(s, sV + (size_t)j * HSM, HSM);                                   \
                }                                                                                  \
            }                                                                                      \
            if (act) {                                                                             \
                float inv = 1.0f / l;                                                              \
                T *o = out + (size_t)(start + i) * E + (size_t)h * HS;                             \
                _Pragma("unroll") for (int d = 0; d < HSM; d++) if (d < HS) nb_st(o + d, acc[d] * inv); \
                lse_h[i] = m + logf(l);                                                            \
            }                                                                                      \
        }                                                                                          \
    }

/* dq_i += sum_j dS_ij k_j with P_ij = exp(scale q_i.k_j - lse_i), dS_ij = P_ij (dO_i.v_j - D_i)
 * scale and D_i = dO_i . o_i (seqattn.c's formulas), one thread per query row. */
#define DEF_SEQATTN_DQ(T, HSM)                                                                     \
    static __global__ void __launch_bounds__(SA_THREADS)                                           \
        seqattn_dq_kernel_##HSM(T *dqkv, const T *dout, const T *qkv, const T *out, const float *lse, \
                                const int32_t *off, int H, int E, int tile) {                      \
        SA_PROLOGUE(T);                                                                            \
        const T *ob = out + (size_t)start * E + (size_t)h * HS, *gb = dout + (size_t)start * E + (size_t)h * HS; \
        float *sK = (float *)ctr_smem, *sV = sK + (size_t)tile * HSM;                              \
        for (int r0 = 0; r0 < len; r0 += SA_THREADS) {                                             \
            int i = r0 + threadIdx.x, act = i < len;                                               \
            float q[HSM], dO[HSM], dq[HSM], Di = 0.0f, li = act ? lse_h[i] : 0.0f;                 \
            _Pragma("unroll") for (int d = 0; d < HSM; d++) {                                      \
                int ok = act && d < HS;                                                            \
                q[d] = ok ? nb_ld(base + (size_t)i * ld + d) : 0.0f;                               \
                dO[d] = ok ? nb_ld(gb + (size_t)i * E + d) : 0.0f;                                 \
                dq[d] = 0.0f;                                                                      \
                if (ok) Di += dO[d] * nb_ld(ob + (size_t)i * E + d);                               \
            }                                                                                      \
            for (int t0 = 0; t0 < len; t0 += tile) {                                               \
                int tl = min(tile, len - t0);                                                      \
                if (r0 == 0 || len > tile) {                                                       \
                    __syncthreads();                                                               \
                    sa_load(sK, base + (size_t)t0 * ld + E, ld, tl, HS, HSM);                      \
                    sa_load(sV, base + (size_t)t0 * ld + 2 * (size_t)E, ld, tl, HS, HSM);          \
                    __syncthreads();                                                               \
                }                                                                                  \
                if (!act) continue;                                                                \
                _Pragma("unroll 2") for (int j = 0; j < tl; j++) {                                 \
                    float s, dp;                                                                   \
                    SA_DOT(s, q, sK + (size_t)j * HSM, HSM);                                       \
                    SA_DOT(dp, dO, sV + (size_t)j * HSM, HSM);                                     \
                    float P = expf(scale * s - li);                                                \
                    float dS = P * (dp - Di) * scale;                                              \
                    SA_AXPY(dq, dS, sK + (size_t)j * HSM, HSM);                                    \
                }                                                                                  \
            }                                                                                      \
            if (act) {                                                                             \
                T *g = dqkv + (size_t)(start + i) * ld + (size_t)h * HS;                           \
                _Pragma("unroll") for (int d = 0; d < HSM; d++) if (d < HS) nb_st(g + d, nb_ld(g + d) + dq[d]); \
            }                                                                                      \
        }                                                                                          \
    }

/* dk_j += sum_i dS_ij q_i, dv_j += sum_i P_ij dO_i: one thread per key row; the query side's
 * q, dO, lse and D_i tile in shared memory (D_i computed once per tile load). */
#define DEF_SEQATTN_DKV(T, HSM)                                                                    \
    static __global__ void __launch_bounds__(SA_THREADS)                                           \
        seqattn_dkv_kernel_##HSM(T *dqkv, const T *dout, const T *qkv, const T *out, const float *lse, \
                                 const int32_t *off, int H, int E, int tile) {                     \
        SA_PROLOGUE(T);                                                                            \
        const T *ob = out + (size_t)start * E + (size_t)h * HS, *gb = dout + (size_t)start * E + (size_t)h * HS; \
        float *sQ = (float *)ctr_smem, *sG = sQ + (size_t)tile * HSM, *sL = sG + (size_t)tile * HSM, *sD = sL + tile; \
        for (int r0 = 0; r0 < len; r0 += SA_THREADS) {                                             \
            int j = r0 + threadIdx.x, act = j < len;                                               \
            float k[HSM], v[HSM], dk[HSM], dv[HSM];                                                \
            _Pragma("unroll") for (int d = 0; d < HSM; d++) {                                      \
                int ok = act && d < HS;                                                            \
                k[d] = ok ? nb_ld(base + (size_t)j * ld + E + d) : 0.0f;                           \
                v[d] = ok ? nb_ld(base + (size_t)j * ld + 2 * (size_t)E + d) : 0.0f;               \
                dk[d] = 0.0f, dv[d] = 0.0f;                                                        \
            }                                                                                      \
            for (int t0 = 0; t0 < len; t0 += tile) {                                               \
                int tl = min(tile, len - t0);                                                      \
                if (r0 == 0 || len > tile) {                                                       \
                    __syncthreads();                                                               \
                    sa_load(sQ, base + (size_t)t0 * ld, ld, tl, HS, HSM);                          \
                    sa_load(sG, gb + (size_t)t0 * E, E, tl, HS, HSM);                              \
                    __syncthreads();                                                               \
                    for (int x = threadIdx.x; x < tl; x += blockDim.x) {                           \
                        float D = 0.0f;                                                            \
                        for (int d = 0; d < HS; d++) D += sG[(size_t)x * HSM + d] * nb_ld(ob + (size_t)(t0 + x) * E + d); \
                        sD[x] = D;                                                                 \
                        sL[x] = lse_h[t0 + x];                                                     \
                    }                                                                              \
                    __syncthreads();                                                               \
                }                                                                                  \
                if (!act) continue;                                                                \
                _Pragma("unroll 2") for (int i = 0; i < tl; i++) {                                 \
                    float s, dp;                                                                   \
                    SA_DOT(s, k, sQ + (size_t)i * HSM, HSM);                                       \
                    SA_DOT(dp, v, sG + (size_t)i * HSM, HSM);                                      \
                    float P = expf(scale * s - sL[i]);                                             \
                    float dS = P * (dp - sD[i]) * scale;                                           \
                    SA_AXPY(dv, P, sG + (size_t)i * HSM, HSM);                                     \
                    SA_AXPY(dk, dS, sQ + (size_t)i * HSM, HSM);                                    \
                }                                                                                  \
            }                                                                                      \
            if (act) {                                                                             \
                T *g = dqkv + (size_t)(start + j) * ld + (size_t)h * HS;                           \
                _Pragma("unroll") for (int d = 0; d < HSM; d++) if (d < HS) {                      \
                    nb_st(g + E + d, nb_ld(g + E + d) + dk[d]);                                    \
                    nb_st(g + 2 * (size_t)E + d, nb_ld(g + 2 * (size_t)E + d) + dv[d]);            \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    }

#define DEF_SEQATTN(T, HSM) DEF_SEQATTN_FWD(T, HSM) DEF_SEQATTN_DQ(T, HSM) DEF_SEQATTN_DKV(T, HSM)
#define DEF_SEQATTN_ALL(T)                                                                         \
    DEF_SEQATTN(T, 4) DEF_SEQATTN(T, 8) DEF_SEQATTN(T, 16) DEF_SEQATTN(T, 32) DEF_SEQATTN(T, 64)
NB_FOR_EACH_DTYPE(DEF_SEQATTN_ALL)

/* The smallest compiled head-size bound that holds HS. */
static int sa_hsm(int HS) { return HS <= 4 ? 4 : HS <= 8 ? 8 : HS <= 16 ? 16 : HS <= 32 ? 32 : 64; }

/* Rows per shared-memory tile: the budget, but no more than a history can have. */
static int sa_tile(int max_len, int floats_per_row) {
    int t = SA_SMEM_BYTES / (floats_per_row * (int)sizeof(float));
    int ml = max_len > 0 ? max_len : 1;
    return t < ml ? t : ml;
}

#define SA_LAUNCH(kernel, hsm, grid, smem, stream, ...)                                            \
    do {                                                                                           \
        switch (hsm) {                                                                             \
        case 4: kernel##_4<<<grid, SA_THREADS, smem, stream>>>(__VA_ARGS__); break;                \
        case 8: kernel##_8<<<grid, SA_THREADS, smem, stream>>>(__VA_ARGS__); break;                \
        case 16: kernel##_16<<<grid, SA_THREADS, smem, stream>>>(__VA_ARGS__); break;              \
        case 32: kernel##_32<<<grid, SA_THREADS, smem, stream>>>(__VA_ARGS__); break;              \
        default: kernel##_64<<<grid, SA_THREADS, smem, stream>>>(__VA_ARGS__); break;              \
        }                                                                                          \
    } while (0)

/* ---- target attention: one block per sample ---- */

#define TA_THREADS 128
#define TA_CHUNK 256 /* keys whose ds the backward keeps in shared memory at a time */

#define DEF_TARGETATTN_KERNELS(T)                                                                  \
    /* Scores (a warp per key, lanes over E) go to attn, which then holds exp(s - max), then the  \
     * weights; pooled sums the weighted v rows in key order, a thread per column. */             \
    static __global__ void targetattn_fwd_kernel(T *pooled, float *attn, const T *q, const T *k, const T *v, \
                                                 const int32_t *off, int E, int ldkv) {            \
        __shared__ float red[32];                                                                  \
        float *sq = (float *)ctr_smem;                                                             \
        int b = blockIdx.x, start = off[b], len = max(0, off[b + 1] - start);                      \
        int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;                \
        T *pb = pooled + (size_t)b * E;                                                            \
        if (len == 0) {                                                                            \
            for (int e = threadIdx.x; e < E; e += blockDim.x) nb_st(pb + e, 0.0f);                 \
            return;                                                                                \
        }                                                                                          \
        for (int e = threadIdx.x; e < E; e += blockDim.x) sq[e] = nb_ld(q + (size_t)b * E + e);    \
        __syncthreads();                                                                           \
        float scale = 1.0f / sqrtf((float)E), mx = -INFINITY;                                      \
        for (int j = warp; j < len; j += nw) {                                                     \
            const T *kj = k + (size_t)(start + j) * ldkv;                                          \
            float s = 0.0f;                                                                        \
            for (int e = lane; e < E; e += 32) s += sq[e] * nb_ld(kj + e);                         \
            s = scale * nb_warp_sum(s);                                                            \
            if (lane == 0) attn[start + j] = s;                                                    \
            mx = fmaxf(mx, s);                                                                     \
        }                                                                                          \
        mx = nb_block_max(mx, red); /* its barriers also publish the scores */                     \
        float sum = 0.0f;                                                                          \
        for (int j = threadIdx.x; j < len; j += blockDim.x) {                                      \
            float p = expf(attn[start + j] - mx);                                                  \
            attn[start + j] = p;                                                                   \
            sum += p;                                                                              \
        }                                                                                          \
        float inv = 1.0f / nb_block_sum(sum, red);                                                 \
        for (int j = threadIdx.x; j < len; j += blockDim.x) attn[start + j] *= inv;                \
        __syncthreads();                                                                           \
        for (int e = threadIdx.x; e < E; e += blockDim.x) {                                        \
            float acc = 0.0f;                                                                      \
            for (int j = 0; j < len; j++) acc += attn[start + j] * nb_ld(v + (size_t)(start + j) * ldkv + e); \
            nb_st(pb + e, acc);                                                                    \
        }                                                                                          \
    }                                                                                              \
    /* ds_j = a_j (dp . v_j - sum_i a_i dp . v_i) / sqrt(E): a warp per key writes that key's dk \
     * and dv rows and puts ds_j in shared memory; then a thread per column adds the chunk's      \
     * ds_j k_j to dq in key order. */                                                             \
    static __global__ void targetattn_bwd_kernel(T *dq, T *dk, T *dv, const T *dpooled, const T *q, const T *k, \
                                                 const T *v, const float *attn, const int32_t *off, int E, \
                                                 int ldkv) {                                       \
        __shared__ float red[32];                                                                  \
        float *sds = (float *)ctr_smem, *sdq = sds + TA_CHUNK, *sq = sdq + E, *sdp = sq + E;       \
        int b = blockIdx.x, start = off[b], len = off[b + 1] - start;                              \
        if (len <= 0) return;                                                                      \
        int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;                \
        for (int e = threadIdx.x; e < E; e += blockDim.x) {                                        \
            sq[e] = nb_ld(q + (size_t)b * E + e);                                                  \
            sdp[e] = nb_ld(dpooled + (size_t)b * E + e);                                           \
            sdq[e] = dq ? nb_ld(dq + (size_t)b * E + e) : 0.0f;                                    \
        }                                                                                          \
        __syncthreads();                                                                           \
        float scale = 1.0f / sqrtf((float)E), part = 0.0f;                                         \
        for (int j = warp; j < len; j += nw) {                                                     \
            const T *vj = v + (size_t)(start + j) * ldkv;                                          \
            float da = 0.0f;                                                                       \
            for (int e = lane; e < E; e += 32) da += sdp[e] * nb_ld(vj + e);                       \
            part += attn[start + j] * nb_warp_sum(da);                                             \
        }                                                                                          \
        float ada = nb_block_sum(lane == 0 ? part : 0.0f, red);                                    \
        for (int c0 = 0; c0 < len; c0 += TA_CHUNK) {                                               \
            int c1 = min(len, c0 + TA_CHUNK);                                                      \
            for (int j = c0 + warp; j < c1; j += nw) {                                             \
                size_t row = (size_t)(start + j) * ldkv;                                           \
                float da = 0.0f, a = attn[start + j];                                              \
                for (int e = lane; e < E; e += 32) da += sdp[e] * nb_ld(v + row + e);              \
                float ds = a * (nb_warp_sum(da) - ada) * scale;                                    \
                for (int e = lane; e < E; e += 32) {                                               \
                    if (dv) nb_st(dv + row + e, nb_ld(dv + row + e) + a * sdp[e]);                 \
                    if (dk) nb_st(dk + row + e, nb_ld(dk + row + e) + ds * sq[e]);                 \
                }                                                                                  \
                if (lane == 0) sds[j - c0] = ds;                                                   \
            }                                                                                      \
            __syncthreads();                                                                       \
            if (dq)                                                                                \
                for (int e = threadIdx.x; e < E; e += blockDim.x) {                                \
                    float acc = sdq[e];                                                            \
                    for (int j = c0; j < c1; j++) acc += sds[j - c0] * nb_ld(k + (size_t)(start + j) * ldkv + e); \
                    sdq[e] = acc;                                                                  \
                }                                                                                  \
            __syncthreads();                                                                       \
        }                                                                                          \
        if (dq)                                                                                    \
            for (int e = threadIdx.x; e < E; e += blockDim.x) nb_st(dq + (size_t)b * E + e, sdq[e]); \
    }
NB_FOR_EACH_DTYPE(DEF_TARGETATTN_KERNELS)

/* ---- GEMMs ---- */

/* Row-major C[M, N] = op(A)[M, K] @ op(B)[K, N] + beta C (+ bias[N] on every row). Row-major is
 * column-major transposed, so cuBLASLt computes C^T = op(B)^T op(A)^T: B is its first operand.
 * ta: A is stored [K, M]; tb: B is stored [N, K]. */
static void rm_gemm(void *C, int ldc, const void *A, int lda, int ta, const void *B, int ldb, int tb, int M, int N,
                    int K, cudaDataType_t tab, cudaDataType_t tc, float beta, const void *bias, nb_blas_t lt,
                    cudaStream_t stream) {
    nb_lt_gemm g = {};
    g.m = N, g.n = M, g.k = K;
    g.A = B, g.lda = ldb, g.transa = tb;
    g.B = A, g.ldb = lda, g.transb = ta;
    g.D = C, g.ldd = ldc;
    g.tab = tab, g.td = tc;
    g.beta = beta;
    g.epi = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    g.bias = bias;
    nb_lt_run(&g, lt, stream, 0);
}

/* ---- launchers ---- */

#define ELEM_GRID(n) nb_grid_1d(((n) + 3) / 4, THREADS)

#define DEF_CTR_LAUNCHERS(SFX, T, KT, CT)                                                          \
    extern "C" void nb_cuda_emb_gather_##SFX(T *out, const int64_t *dst, const float *table, const int64_t *rows, \
                                              int n, int E, nb_stream_t stream) {                  \
        NB_CUDA_SHAPE(n >= 0 && E >= 0 && (n == 0 || (out && dst && table && rows)), "nb_cuda_emb_gather_" #SFX); \
        if (n == 0 || E == 0) return;                                                              \
        int vec = E % 4 == 0 && al4(out, sizeof(KT)) && al4(table, sizeof(float));                 \
        int G = 1;                                                                                 \
        while (G < 32 && 4 * G < E) G *= 2;                                                        \
        unsigned blocks = (unsigned)(((size_t)n * G + THREADS - 1) / THREADS);                     \
        emb_gather_kernel<<<blocks, THREADS, 0, stream>>>((KT *)out, dst, table, rows, n, E, G, vec); \
        CUDA_CHECK_LAUNCH("embedding gather");                                                     \
    }                                                                                              \
    extern "C" void nb_cuda_emb_grad_unique_##SFX(float *dunique, const T *src, const int64_t *src_off, \
                                                   const int32_t *order, const int32_t *seg,       \
                                                   const int32_t *count, int U, int E, nb_stream_t stream) { \
        NB_CUDA_SHAPE(U >= 0 && E >= 0 && (U == 0 || (dunique && src && src_off && order && seg)), \
                      "nb_cuda_emb_grad_unique_" #SFX);                                            \
        if (U == 0 || E == 0) return;                                                              \
        if (nb_cuda_ctr_kernels_new()) {                                                           \
            nb_cuda_emb_grad_unique_chunked(dunique, src, sizeof(KT) == 2, src_off, order, seg, count, U, E, \
                                            stream);                                               \
            return;                                                                                \
        }                                                                                          \
        emb_grad_unique_kernel<<<(U + WARPS - 1) / WARPS, THREADS, 0, stream>>>(dunique, (const KT *)src, src_off, \
                                                                                order, seg, count, U, E); \
        CUDA_CHECK_LAUNCH("embedding unique-row gradient");                                        \
    }                                                                                              \
    extern "C" void nb_cuda_cross_forward_##SFX(T *c, T *vx, const T *x0, const T *x, const T *Uw, const T *Vw, \
                                                 const T *b, int N, int D, int r, nb_blas_t lt, nb_stream_t stream) { \
        NB_CUDA_SHAPE(c && vx && x0 && x && Uw && Vw && N >= 0 && D > 0 && r > 0 && c != x0 && c != x, \
                      "nb_cuda_cross_forward_" #SFX);                                              \
        if (N == 0) return;                                                                        \
        rm_gemm(vx, r, x, D, 0, Vw, r, 0, N, r, D, CT, CT, 0.0f, NULL, lt, stream);  /* vx = x Vw */   \
        rm_gemm(c, D, vx, r, 0, Uw, r, 1, N, D, r, CT, CT, 0.0f, b, lt, stream);     /* u = vx Uw^T + b */ \
        size_t n = (size_t)N * D;                                                                  \
        int vec = al4(c, sizeof(KT)) && al4(x0, sizeof(KT)) && al4(x, sizeof(KT));                \
        cross_combine_kernel<<<ELEM_GRID(n), THREADS, 0, stream>>>((KT *)c, (const KT *)c, (const KT *)x0, \
                                                                   (const KT *)x, n, vec);        \
        CUDA_CHECK_LAUNCH("cross forward (x0 * u + x)");                                           \
    }                                                                                              \
    extern "C" void nb_cuda_cross_backward_##SFX(T *dx0, T *dx, float *dU, float *dV, float *db, const T *dc, \
                                                  const T *x0, const T *x, const T *Uw, const T *Vw, const T *b, \
                                                  const T *vx, int N, int D, int r, nb_blas_t lt, nb_stream_t stream) { \
        const char *name = "nb_cuda_cross_backward_" #SFX;                                         \
        int want_du = dU || dV || dx;                                                              \
        NB_CUDA_SHAPE(dc && N >= 0 && D > 0 && r > 0, name);                                       \
        NB_CUDA_SHAPE((!dx0 || (vx && Uw)) && (!(want_du || db) || x0) && (!dU || vx) && (!(dV || dx) || Uw) && \
                          (!dV || x) && (!dx || Vw),                                               \
                      name);                                                                       \
        if (N == 0 || !(dx0 || dx || want_du || db)) return;                                       \
        size_t n = (size_t)N * D;                                                                  \
        int nparts = nb_col_parts(N);                                                              \
        NB_CUDA_SHAPE(nparts <= 65535, name);                                                      \
        /* buf holds u = vx Uw^T + b for dx0, then du = dc * x0 in its place (same thread) */      \
        T *buf = dx0 || want_du ? (T *)nb_cuda_scratch(n * sizeof(T), stream) : NULL;              \
        float *part = db ? (float *)nb_cuda_scratch((size_t)nparts * D * sizeof(float), stream) : NULL; \
        if (dx0) rm_gemm(buf, D, vx, r, 0, Uw, r, 1, N, D, r, CT, CT, 0.0f, b, lt, stream);            \
        dim3 grid((D + 31) / 32, nparts);                                                          \
        cross_bwd_elem_kernel<<<grid, dim3(32, 8), 0, stream>>>((KT *)dx0, (KT *)dx, (KT *)buf, part, \
                                                                (const KT *)dc, (const KT *)x0, N, D, want_du); \
        CUDA_CHECK_LAUNCH("cross backward (elementwise)");                                         \
        if (db) nb_col_finish(db, part, nparts, D, stream);                                        \
        if (dU) rm_gemm(dU, r, buf, D, 1, vx, r, 0, D, r, N, CT, CUDA_R_32F, 1.0f, NULL, lt, stream); /* du^T vx */ \
        if (dV || dx) {                                                                            \
            T *dvx = (T *)nb_cuda_scratch((size_t)N * r * sizeof(T), stream);                      \
            rm_gemm(dvx, r, buf, D, 0, Uw, r, 0, N, r, D, CT, CT, 0.0f, NULL, lt, stream); /* du Uw */ \
            if (dV) rm_gemm(dV, r, x, D, 1, dvx, r, 0, D, r, N, CT, CUDA_R_32F, 1.0f, NULL, lt, stream); /* x^T dvx */ \
            if (dx) rm_gemm(dx, D, dvx, r, 0, Vw, r, 1, N, D, r, CT, CT, 1.0f, NULL, lt, stream); /* dvx Vw^T */ \
            nb_cuda_scratch_free(dvx, stream);                                                     \
        }                                                                                          \
        nb_cuda_scratch_free(part, stream);                                                        \
        nb_cuda_scratch_free(buf, stream);                                                         \
    }                                                                                              \
    extern "C" void nb_cuda_relu_forward_##SFX(T *out, const T *inp, size_t n, nb_stream_t stream) { \
        NB_CUDA_SHAPE(n == 0 || (out && inp), "nb_cuda_relu_forward_" #SFX);                       \
        if (n == 0) return;                                                                        \
        int vec = al4(out, sizeof(KT)) && al4(inp, sizeof(KT));                                    \
        relu_fwd_kernel<<<ELEM_GRID(n), THREADS, 0, stream>>>((KT *)out, (const KT *)inp, n, vec); \
        CUDA_CHECK_LAUNCH("relu forward");                                                         \
    }                                                                                              \
    extern "C" void nb_cuda_relu_backward_##SFX(T *dinp, const T *inp, const T *dout, size_t n,    \
                                                 nb_stream_t stream) {                             \
        if (!dinp || n == 0) return;                                                               \
        NB_CUDA_SHAPE(inp && dout, "nb_cuda_relu_backward_" #SFX);                                 \
        int vec = al4(dinp, sizeof(KT)) && al4(inp, sizeof(KT)) && al4(dout, sizeof(KT));          \
        relu_bwd_kernel<<<ELEM_GRID(n), THREADS, 0, stream>>>((KT *)dinp, (const KT *)dinp, (const KT *)inp, \
                                                              (const KT *)dout, n, vec);           \
        CUDA_CHECK_LAUNCH("relu backward");                                                        \
    }                                                                                              \
    extern "C" void nb_cuda_linear1_forward_##SFX(float *z, const T *x, const T *w, const T *b, int N, int D, \
                                                   nb_stream_t stream) {                           \
        NB_CUDA_SHAPE(N >= 0 && D > 0 && (N == 0 || (z && x && w)), "nb_cuda_linear1_forward_" #SFX); \
        if (N == 0) return;                                                                        \
        int vec = D % 4 == 0 && al4(x, sizeof(KT)) && al4(w, sizeof(KT));                          \
        linear1_fwd_kernel<<<(N + WARPS - 1) / WARPS, THREADS, 0, stream>>>(z, (const KT *)x, (const KT *)w, \
                                                                            (const KT *)b, N, D, vec); \
        CUDA_CHECK_LAUNCH("linear1 forward");                                                      \
    }                                                                                              \
    extern "C" void nb_cuda_linear1_backward_##SFX(T *dx, float *dw, float *db, const float *dz, const T *x, \
                                                    const T *w, int N, int D, nb_stream_t stream) { \
        const char *name = "nb_cuda_linear1_backward_" #SFX;                                       \
        NB_CUDA_SHAPE(N >= 0 && D > 0 && (N == 0 || (dz && (!dx || w) && (!dw || x))), name);     \
        if (N == 0) return;                                                                        \
        if (dx || dw) {                                                                            \
            int nparts = nb_col_parts(N);                                                          \
            NB_CUDA_SHAPE(nparts <= 65535, name);                                                  \
            float *part = dw ? (float *)nb_cuda_scratch((size_t)nparts * D * sizeof(float), stream) : NULL; \
            dim3 grid((D + 31) / 32, nparts);                                                      \
            linear1_bwd_kernel<<<grid, dim3(32, 8), 0, stream>>>((KT *)dx, part, dz, (const KT *)x, (const KT *)w, \
                                                                 N, D);                            \
            CUDA_CHECK_LAUNCH("linear1 backward (dx, dw partials)");                               \
            if (dw) nb_col_finish(dw, part, nparts, D, stream);                                    \
            nb_cuda_scratch_free(part, stream);                                                    \
        }                                                                                          \
        if (db) {                                                                                  \
            sum_into_kernel<<<1, THREADS, 0, stream>>>(db, dz, N);                                 \
            CUDA_CHECK_LAUNCH("linear1 backward (db)");                                            \
        }                                                                                          \
    }                                                                                              \
    static void cols_launch_##SFX(T *dst, int ld_dst, const T *src, int ld_src, int rows, int cols, int add, \
                                  nb_stream_t stream) {                                            \
        NB_CUDA_SHAPE(rows >= 0 && cols >= 0 && ld_dst >= cols && ld_src >= cols &&                \
                          (rows == 0 || cols == 0 || (dst && src)),                                \
                      add ? "nb_cuda_add_cols_" #SFX : "nb_cuda_copy_cols_" #SFX);                 \
        if (rows == 0 || cols == 0) return;                                                        \
        int vec = cols % 4 == 0 && ld_dst % 4 == 0 && ld_src % 4 == 0 && al4(dst, sizeof(KT)) &&   \
                  al4(src, sizeof(KT));                                                            \
        size_t n = (size_t)rows * ((cols + 3) / 4);                                                \
        cols_kernel<<<nb_grid_1d(n, THREADS), THREADS, 0, stream>>>((KT *)dst, ld_dst, (const KT *)src, ld_src, \
                                                                    rows, cols, add, vec);        \
        CUDA_CHECK_LAUNCH(add ? "add columns" : "copy columns");                                   \
    }                                                                                              \
    extern "C" void nb_cuda_copy_cols_##SFX(T *dst, int ld_dst, const T *src, int ld_src, int rows, int cols, \
                                             nb_stream_t stream) {                                 \
        cols_launch_##SFX(dst, ld_dst, src, ld_src, rows, cols, 0, stream);                        \
    }                                                                                              \
    extern "C" void nb_cuda_add_cols_##SFX(T *dst, int ld_dst, const T *src, int ld_src, int rows, int cols, \
                                            nb_stream_t stream) {                                  \
        cols_launch_##SFX(dst, ld_dst, src, ld_src, rows, cols, 1, stream);                        \
    }                                                                                              \
    extern "C" void nb_cuda_seqattn_forward_##SFX(T *out, float *lse, const T *qkv, const int32_t *off, int B, \
                                                   int max_len, int H, int E, nb_stream_t stream) { \
        NB_CUDA_SHAPE(B >= 0 && H > 0 && H <= 65535 && E > 0 && E % H == 0 && E / H <= 64 &&       \
                          (B == 0 || (out && lse && qkv && off)),                                  \
                      "nb_cuda_seqattn_forward_" #SFX);                                            \
        if (B == 0) return;                                                                        \
        if (sizeof(KT) == 2 && nb_cuda_ctr_kernels_new() &&                                        \
            nb_cuda_seqattn_tc_forward_bf16((nb_bf16 *)out, lse, (const nb_bf16 *)qkv, off, B, max_len, H, E, stream)) \
            return;                                                                                \
        int hsm = sa_hsm(E / H), tile = sa_tile(max_len, 2 * hsm);                                 \
        size_t smem = (size_t)tile * 2 * hsm * sizeof(float);                                      \
        SA_LAUNCH(seqattn_fwd_kernel, hsm, dim3(B, H), smem, stream, (KT *)out, lse, (const KT *)qkv, off, H, E, \
                  tile);                                                                           \
        CUDA_CHECK_LAUNCH("history self-attention forward");                                       \
    }                                                                                              \
    extern "C" void nb_cuda_seqattn_backward_##SFX(T *dqkv, const T *dout, const T *qkv, const T *out,     \
                                                    const float *lse, const int32_t *off, int B, int max_len, \
                                                    int H, int E, nb_stream_t stream) {            \
        NB_CUDA_SHAPE(B >= 0 && H > 0 && H <= 65535 && E > 0 && E % H == 0 && E / H <= 64 &&       \
                          (B == 0 || !dqkv || (dout && qkv && out && lse && off)),                 \
                      "nb_cuda_seqattn_backward_" #SFX);                                           \
        if (B == 0 || !dqkv) return;                                                               \
        if (sizeof(KT) == 2 && nb_cuda_ctr_kernels_new() &&                                        \
            nb_cuda_seqattn_tc_backward_bf16((nb_bf16 *)dqkv, (const nb_bf16 *)dout, (const nb_bf16 *)qkv,  \
                                             (const nb_bf16 *)out, lse, off, B, max_len, H, E, stream)) \
            return;                                                                                \
        int hsm = sa_hsm(E / H);                                                                   \
        int tq = sa_tile(max_len, 2 * hsm), tkv = sa_tile(max_len, 2 * hsm + 2);                   \
        SA_LAUNCH(seqattn_dq_kernel, hsm, dim3(B, H), (size_t)tq * 2 * hsm * sizeof(float), stream, (KT *)dqkv, \
                  (const KT *)dout, (const KT *)qkv, (const KT *)out, lse, off, H, E, tq);         \
        CUDA_CHECK_LAUNCH("history self-attention backward (dq)");                                 \
        SA_LAUNCH(seqattn_dkv_kernel, hsm, dim3(B, H), (size_t)tkv * (2 * hsm + 2) * sizeof(float), stream, \
                  (KT *)dqkv, (const KT *)dout, (const KT *)qkv, (const KT *)out, lse, off, H, E, tkv); \
        CUDA_CHECK_LAUNCH("history self-attention backward (dk, dv)");                             \
    }                                                                                              \
    extern "C" void nb_cuda_targetattn_forward_##SFX(T *pooled, float *attn, const T *q, const T *k, const T *v, \
                                                      const int32_t *off, int B, int max_len, int E, int ldkv, \
                                                      nb_stream_t stream) {                        \
        NB_CUDA_SHAPE(B >= 0 && E > 0 && ldkv >= E && (size_t)E * sizeof(float) <= 32768 &&       \
                          (B == 0 || (pooled && attn && q && k && v && off)),                      \
                      "nb_cuda_targetattn_forward_" #SFX);                                         \
        if (B == 0) return;                                                                        \
        if (sizeof(KT) == 2 && nb_cuda_ctr_kernels_new() >= 2 &&                                   \
            nb_cuda_targetattn_warp_forward_bf16((nb_bf16 *)pooled, attn, (const nb_bf16 *)q, (const nb_bf16 *)k, \
                                                 (const nb_bf16 *)v, off, B, max_len, E, ldkv, stream)) \
            return;                                                                                \
        targetattn_fwd_kernel<<<B, TA_THREADS, (size_t)E * sizeof(float), stream>>>(               \
            (KT *)pooled, attn, (const KT *)q, (const KT *)k, (const KT *)v, off, E, ldkv);        \
        CUDA_CHECK_LAUNCH("target attention forward");                                             \
    }                                                                                              \
    extern "C" void nb_cuda_targetattn_backward_##SFX(T *dq, T *dk, T *dv, const T *dpooled, const T *q,   \
                                                       const T *k, const T *v, const float *attn,  \
                                                       const int32_t *off, int B, int max_len, int E, int ldkv, \
                                                       nb_stream_t stream) {                       \
        NB_CUDA_SHAPE(B >= 0 && E > 0 && ldkv >= E && (size_t)(TA_CHUNK + 3 * E) * sizeof(float) <= 49152 && \
                          (B == 0 || !(dq || dk || dv) || (dpooled && q && k && v && attn && off)), \
                      "nb_cuda_targetattn_backward_" #SFX);                                        \
        if (B == 0 || !(dq || dk || dv)) return;                                                   \
        if (sizeof(KT) == 2 && nb_cuda_ctr_kernels_new() >= 2 &&                                   \
            nb_cuda_targetattn_warp_backward_bf16((nb_bf16 *)dq, (nb_bf16 *)dk, (nb_bf16 *)dv,    \
                                                  (const nb_bf16 *)dpooled, (const nb_bf16 *)q, (const nb_bf16 *)k, \
                                                  (const nb_bf16 *)v, attn, off, B, max_len, E, ldkv, stream)) \
            return;                                                                                \
        targetattn_bwd_kernel<<<B, TA_THREADS, (size_t)(TA_CHUNK + 3 * E) * sizeof(float), stream>>>( \
            (KT *)dq, (KT *)dk, (KT *)dv, (const KT *)dpooled, (const KT *)q, (const KT *)k, (const KT *)v, attn, \
            off, E, ldkv);                                                                         \
        CUDA_CHECK_LAUNCH("target attention backward");                                            \
    }
DEF_CTR_LAUNCHERS(f32, float, float, CUDA_R_32F)
DEF_CTR_LAUNCHERS(bf16, nb_bf16, nb_bf16_t, CUDA_R_16BF)

extern "C" void nb_cuda_bce_logits(float *dz, double *loss, const float *z, const float *y, int N, float scale,
                                   nb_stream_t stream) {
    NB_CUDA_SHAPE(N >= 0 && (N == 0 || (z && y)), "nb_cuda_bce_logits");
    if (N == 0 || (!dz && !loss)) return;
    bce_kernel<<<1, BCE_THREADS, 0, stream>>>(dz, loss, z, y, N, scale);
    CUDA_CHECK_LAUNCH("bce with logits");
}
