/* AdamW and the global-norm helpers on CUDA: the device side of optim/adamw.c (a backend op).
 *
 * nb_cuda_adamw_update runs adamw.c's formula operation by operation, with the host forming the
 * same float scalars (nb_adamw_prepare), and every device operation written as an explicitly rounded
 * intrinsic (__fmul_rn, ...) so nvcc cannot contract a*b+c into an FMA: the GPU result is the
 * CPU result, bit for bit. One thread per element over a contiguous slab, plus the bf16 copy of
 * the new params in the same pass (the weights the next forward reads).
 * nb_cuda_adamw_apply_spans does the same over every tensor of a model in one launch: the
 * tensor table travels in the kernel's parameters, each block takes a fixed run of the slab,
 * finds its first tensor by binary search, and updates the tensors it overlaps with 16-byte
 * accesses (the same per-element operations, so the same bits).
 * The reductions (sum, sum of squares) go in fixed blocks of REDUCE_BLOCK elements, then one
 * block adds the block sums in a fixed tree: the result depends only on n. */
#include "ops/ops_cuda_common.cuh"

#include <math.h>
#include <string.h>

#define THREADS 256
#define REDUCE_BLOCK 65536
#define REDUCE_THREADS 512

/* One element of AdamW from prepared scalars (nb_adamw_prepare, optim/adamw.c), in registers,
 * with the gradient first multiplied by the clip factor when it is below 1, as the CPU does. */
static __device__ __forceinline__ void adamw_math(float *pp, float g, float *mp, float *vp, const nb_adamw_scalars *k,
                                                  float clip) {
    if (clip < 1.0f) g = __fmul_rn(g, clip);
    const float m0 = *mp;
    float p = __fmul_rn(*pp, k->decay);
    float mi = __fadd_rn(m0, __fmul_rn(k->w1, __fsub_rn(g, m0)));
    float vi = __fmul_rn(*vp, k->b2);
    vi = __fadd_rn(vi, __fmul_rn(__fmul_rn(k->w2, g), g));
    float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), k->bc2_sqrt), k->eps);
    *pp = __fadd_rn(p, __fdiv_rn(__fmul_rn(k->neg_step, mi), denom));
    *mp = mi;
    *vp = vi;
}

static __device__ __forceinline__ void adamw_element(size_t i, float *params, const float *grads, float *m, float *v,
                                                     nb_bf16_t *lp, const nb_adamw_scalars *k, float clip) {
    float p = params[i], mi = m[i], vi = v[i];
    adamw_math(&p, grads[i], &mi, &vi, k, clip);
    params[i] = p;
    m[i] = mi;
    v[i] = vi;
    if (lp) lp[i] = __float2bfloat16_rn(p);
}

static __device__ __forceinline__ unsigned bf16x2_bits(float lo, float hi) {
    return (unsigned)__bfloat16_as_ushort(__float2bfloat16_rn(lo)) |
           ((unsigned)__bfloat16_as_ushort(__float2bfloat16_rn(hi)) << 16);
}

/* Elements i..i+3 (i % 4 == 0, 16-byte aligned slabs, 8-byte aligned bf16 copy). */
static __device__ __forceinline__ void adamw_vec4(size_t i, float *params, const float *grads, float *m, float *v,
                                                  nb_bf16_t *lp, const nb_adamw_scalars *k, float clip) {
    float4 p = *(const float4 *)(params + i), g = *(const float4 *)(grads + i);
    float4 mm = *(const float4 *)(m + i), vv = *(const float4 *)(v + i);
    adamw_math(&p.x, g.x, &mm.x, &vv.x, k, clip);
    adamw_math(&p.y, g.y, &mm.y, &vv.y, k, clip);
    adamw_math(&p.z, g.z, &mm.z, &vv.z, k, clip);
    adamw_math(&p.w, g.w, &mm.w, &vv.w, k, clip);
    *(float4 *)(params + i) = p;
    *(float4 *)(m + i) = mm;
    *(float4 *)(v + i) = vv;
    if (lp) *(uint2 *)(lp + i) = make_uint2(bf16x2_bits(p.x, p.y), bf16x2_bits(p.z, p.w));
}

/* nb_clip_factor (optim/adamw.c) in the same double arithmetic. */
static __device__ __forceinline__ float clip_factor_of(double sumsq, float max_norm) {
    if (max_norm <= 0.0f) return 1.0f;
    double f = (double)max_norm / (sqrt(sumsq) + 1e-6);
    return isnan(f) ? (float)f : f < 1.0 ? (float)f : 1.0f;
}

/* Scalars by value (formed on the host for this launch). */
static __global__ void adamw_kernel(float *params, const float *grads, float *m, float *v, nb_bf16_t *lp, size_t n,
                                    nb_adamw_scalars k) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        adamw_element(i, params, grads, m, v, lp, &k, 1.0f);
}

extern "C" void nb_cuda_adamw_update(float *params, const float *grads, float *m, float *v, nb_bf16 *params_bf16,
                                     size_t n, nb_adamw_cfg cfg, int t, nb_stream_t stream) {
    NB_CUDA_SHAPE(params && grads && m && v && t >= 1, "nb_cuda_adamw_update");
    if (n == 0) return;
    /* the scalars exactly as adamw.c forms them: the GPU result is the CPU result, bit for bit */
    nb_adamw_scalars k = nb_adamw_prepare(cfg, t);
    adamw_kernel<<<nb_grid_1d(n, THREADS), THREADS, 0, stream>>>(params, grads, m, v, (nb_bf16_t *)params_bf16, n,
                                                                 k);
    CUDA_CHECK_LAUNCH("adamw update");
}

/* Scalars and clip factor read from device memory, so a captured graph replays correctly as they
 * change (see nb_adamw_scalars in optim.h). */
static __global__ void adamw_dev_kernel(float *params, const float *grads, float *m, float *v, nb_bf16_t *lp,
                                        size_t n, const nb_adamw_scalars *ks, const float *clip_p) {
    const nb_adamw_scalars k = *ks;
    const float clip = clip_p ? *clip_p : 1.0f;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        adamw_element(i, params, grads, m, v, lp, &k, clip);
}

extern "C" void nb_cuda_adamw_apply(float *params, const float *grads, float *m, float *v, nb_bf16 *params_bf16,
                                    size_t n, const nb_adamw_scalars *k_dev, const float *clip_dev,
                                    nb_stream_t stream) {
    NB_CUDA_SHAPE(params && grads && m && v && k_dev, "nb_cuda_adamw_apply");
    if (n == 0) return;
    adamw_dev_kernel<<<nb_grid_1d(n, THREADS), THREADS, 0, stream>>>(params, grads, m, v, (nb_bf16_t *)params_bf16,
                                                                     n, k_dev, clip_dev);
    CUDA_CHECK_LAUNCH("adamw apply");
}

static __global__ void clip_factor_kernel(float *out, const double *sumsq, float max_norm) {
    *out = clip_factor_of(*sumsq, max_norm);
}

extern "C" void nb_cuda_clip_factor(float *out, const double *sumsq, float max_norm, nb_stream_t stream) {
    clip_factor_kernel<<<1, 1, 0, stream>>>(out, sumsq, max_norm);
    CUDA_CHECK_LAUNCH("clip factor");
}

/* ---- AdamW over the tensors of a slab, one launch ---- */

#define SPAN_THREADS 256
#define SPAN_ELEMS 4096       /* slab elements per block (4 float4 per thread) */
#define SPANS_PER_LAUNCH 256  /* the table below stays under the 4 KB of kernel parameters */
#define SPAN_MAX_NUMEL (1u << 30) /* longer tensors take several table entries */

/* Non-empty tensors in ascending, non-overlapping order; the launch covers [lo, hi). */
typedef struct {
    unsigned long long off[SPANS_PER_LAUNCH]; /* first element */
    unsigned int n[SPANS_PER_LAUNCH];         /* elements */
    unsigned char kix[SPANS_PER_LAUNCH];      /* which scalars */
    unsigned long long lo, hi;
    int count;
} adamw_span_table;
static_assert(sizeof(adamw_span_table) + 64 <= 4096, "the span table must fit the kernel parameters");

static __global__ void __launch_bounds__(SPAN_THREADS)
    adamw_spans_kernel(float *params, const float *grads, float *m, float *v, nb_bf16_t *lp,
                       const __grid_constant__ adamw_span_table t, const nb_adamw_scalars *ks, const double *sumsq,
                       float max_norm, int vec) {
    const unsigned long long c0 = t.lo + (unsigned long long)blockIdx.x * SPAN_ELEMS;
    const unsigned long long c1 = c0 + SPAN_ELEMS < t.hi ? c0 + SPAN_ELEMS : t.hi;
    const float clip = sumsq ? clip_factor_of(*sumsq, max_norm) : 1.0f;
    /* the first tensor that ends after c0 (ends ascend with the offsets) */
    int a = 0, b = t.count - 1;
    while (a < b) {
        int mid = (a + b) >> 1;
        if (t.off[mid] + t.n[mid] > c0)
            b = mid;
        else
            a = mid + 1;
    }
    for (int s = a; s < t.count && t.off[s] < c1; s++) {
        const unsigned long long s0 = t.off[s] > c0 ? t.off[s] : c0;
        const unsigned long long e = t.off[s] + t.n[s], s1 = e < c1 ? e : c1;
        if (s0 >= s1) continue;
        const nb_adamw_scalars k = ks[t.kix[s]];
        size_t body = s0; /* [s0, body): scalar head up to a multiple of 4; then float4; then the tail */
        if (vec) {
            body = (s0 + 3) & ~3ull;
            if (body > s1) body = s1;
        }
        for (size_t i = s0 + threadIdx.x; i < body; i += blockDim.x)
            adamw_element(i, params, grads, m, v, lp, &k, clip);
        const size_t n4 = vec ? (s1 - body) >> 2 : 0;
        for (size_t j = threadIdx.x; j < n4; j += blockDim.x)
            adamw_vec4(body + 4 * j, params, grads, m, v, lp, &k, clip);
        for (size_t i = body + 4 * n4 + threadIdx.x; i < s1; i += blockDim.x)
            adamw_element(i, params, grads, m, v, lp, &k, clip);
    }
}

static void spans_launch(float *params, const float *grads, float *m, float *v, nb_bf16_t *lp, adamw_span_table *t,
                         const nb_adamw_scalars *k_dev, const double *sumsq_dev, float max_norm, int vec,
                         cudaStream_t stream) {
    if (t->count == 0) return;
    t->lo = t->off[0];
    t->hi = t->off[t->count - 1] + t->n[t->count - 1];
    unsigned long long blocks = (t->hi - t->lo + SPAN_ELEMS - 1) / SPAN_ELEMS;
    NB_CUDA_SHAPE(blocks <= 0x7fffffffull, "nb_cuda_adamw_apply_spans");
    adamw_spans_kernel<<<(unsigned)blocks, SPAN_THREADS, 0, stream>>>(params, grads, m, v, lp, *t, k_dev, sumsq_dev,
                                                                      max_norm, vec);
    CUDA_CHECK_LAUNCH("adamw over a slab's tensors");
    memset(t, 0, sizeof *t);
}

extern "C" void nb_cuda_adamw_apply_spans(float *params, const float *grads, float *m, float *v, nb_bf16 *params_bf16,
                                          const nb_adamw_span *spans, int nspans, const nb_adamw_scalars *k_dev,
                                          const double *sumsq_dev, float max_norm, nb_stream_t stream) {
    const char *name = "nb_cuda_adamw_apply_spans";
    NB_CUDA_SHAPE(params && grads && m && v && k_dev && nspans >= 0 && (spans || nspans == 0), name);
    nb_bf16_t *lp = (nb_bf16_t *)params_bf16;
    const int vec = ((uintptr_t)params & 15u) == 0 && ((uintptr_t)grads & 15u) == 0 && ((uintptr_t)m & 15u) == 0 &&
                    ((uintptr_t)v & 15u) == 0 && ((uintptr_t)lp & 7u) == 0;
    adamw_span_table t;
    memset(&t, 0, sizeof t);
    size_t end = 0;
    for (int i = 0; i < nspans; i++) {
        const nb_adamw_span *sp = &spans[i];
        /* ascending and disjoint: the kernel's binary search relies on it */
        NB_CUDA_SHAPE(sp->offset >= end && sp->scalars >= 0 && sp->scalars < 256, name);
        end = sp->offset + sp->numel;
        for (size_t done = 0; done < sp->numel;) {
            size_t n = sp->numel - done < SPAN_MAX_NUMEL ? sp->numel - done : SPAN_MAX_NUMEL;
            if (t.count == SPANS_PER_LAUNCH)
                spans_launch(params, grads, m, v, lp, &t, k_dev, sumsq_dev, max_norm, vec, stream);
            t.off[t.count] = sp->offset + done;
            t.n[t.count] = (unsigned)n;
            t.kix[t.count] = (unsigned char)sp->scalars;
            t.count++;
            done += n;
        }
    }
    spans_launch(params, grads, m, v, lp, &t, k_dev, sumsq_dev, max_norm, vec, stream);
}

static __global__ void scale_kernel(float *g, size_t n, float s) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        g[i] = __fmul_rn(g[i], s);
}

extern "C" void nb_cuda_scale_inplace(float *g, size_t n, float s, nb_stream_t stream) {
    NB_CUDA_SHAPE(g || n == 0, "nb_cuda_scale_inplace");
    if (n == 0) return;
    scale_kernel<<<nb_grid_1d(n, THREADS), THREADS, 0, stream>>>(g, n, s);
    CUDA_CHECK_LAUNCH("scale in place");
}

/* part[blockIdx.x] = sum over elements [blockIdx.x * REDUCE_BLOCK, +REDUCE_BLOCK). With vec (x
 * 16-byte aligned) a thread reads float4 vectors t, t + 512, ... eight loads in flight, into four
 * double lanes (one per component) added (0 + 2) + (1 + 3): the scalar loop kept one 4-byte load
 * in flight per thread and ran at ~1 TB/s (issue 18: 62 us of the proxy's step for 64 MB). The
 * order depends on n alone; the tail past the last whole vector is added by thread 0 in order. */
static __device__ __forceinline__ double reduce_term(float x, int square) {
    double v = x;
    return square ? v * v : v;
}

static __global__ void __launch_bounds__(REDUCE_THREADS) reduce_part_kernel(double *part, const float *x, size_t n,
                                                                            int square, int vec) {
    __shared__ double sh[32];
    size_t start = (size_t)blockIdx.x * REDUCE_BLOCK;
    size_t end = start + REDUCE_BLOCK < n ? start + REDUCE_BLOCK : n;
    double s = 0.0;
    if (vec) {
        const float4 *xv = (const float4 *)(x + start);
        const int nv = (int)((end - start) / 4);
        double a[4] = {0.0, 0.0, 0.0, 0.0};
        int i = threadIdx.x;
        for (; i + 7 * REDUCE_THREADS < nv; i += 8 * REDUCE_THREADS) {
            float4 q[8];
#pragma unroll
            for (int u = 0; u < 8; u++) q[u] = xv[i + u * REDUCE_THREADS];
#pragma unroll
            for (int u = 0; u < 8; u++) {
                a[0] += reduce_term(q[u].x, square), a[1] += reduce_term(q[u].y, square);
                a[2] += reduce_term(q[u].z, square), a[3] += reduce_term(q[u].w, square);
            }
        }
        for (; i < nv; i += REDUCE_THREADS) {
            const float4 q = xv[i];
            a[0] += reduce_term(q.x, square), a[1] += reduce_term(q.y, square);
            a[2] += reduce_term(q.z, square), a[3] += reduce_term(q.w, square);
        }
        s = (a[0] + a[2]) + (a[1] + a[3]);
        if (threadIdx.x == 0)
            for (size_t j = start + (size_t)nv * 4; j < end; j++) s += reduce_term(x[j], square);
    } else {
        for (size_t i = start + threadIdx.x; i < end; i += blockDim.x) s += reduce_term(x[i], square);
    }
    s = nb_block_sum_d(s, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

static __global__ void reduce_final_kernel(double *out, const double *part, size_t nparts) {
    __shared__ double sh[32];
    double s = 0.0;
    for (size_t i = threadIdx.x; i < nparts; i += blockDim.x) s += part[i];
    s = nb_block_sum_d(s, sh);
    if (threadIdx.x == 0) *out = s;
}

void nb_cuda_reduce_f64(double *out, const float *x, size_t n, int square, cudaStream_t stream) {
    if (n == 0) {
        CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(double), stream));
        return;
    }
    size_t nparts = (n + REDUCE_BLOCK - 1) / REDUCE_BLOCK;
    NB_CUDA_SHAPE(nparts <= 0x7fffffffu, "nb_cuda_reduce_f64");
    double *part = (double *)nb_cuda_scratch(nparts * sizeof(double), stream);
    const int vec = ((uintptr_t)x & 15u) == 0;
    reduce_part_kernel<<<(unsigned)nparts, REDUCE_THREADS, 0, stream>>>(part, x, n, square, vec);
    CUDA_CHECK_LAUNCH("reduction (block sums)");
    reduce_final_kernel<<<1, REDUCE_THREADS, 0, stream>>>(out, part, nparts);
    CUDA_CHECK_LAUNCH("reduction (final sum)");
    nb_cuda_scratch_free(part, stream);
}

extern "C" void nb_cuda_sumsq(double *out, const float *g, size_t n, nb_stream_t stream) {
    NB_CUDA_SHAPE(out && (g || n == 0), "nb_cuda_sumsq");
    nb_cuda_reduce_f64(out, g, n, 1, stream);
}

/* nb_sumsq_block, one thread per block of NB_SUMSQ_BLOCK elements: the same four double lanes,
 * the same element order and the same explicitly rounded operations (no fused multiply-add), so
 * each part has the host's bits. A thread reads its block front to back (16-byte loads where
 * aligned, which is where each lane's next element already is). */
static __device__ __forceinline__ double sq_add(double acc, float x) { return __dadd_rn(acc, __dmul_rn((double)x, (double)x)); }

static __global__ void sumsq_blocks_kernel(double *part, const float *g, size_t n, size_t nblocks) {
    size_t b = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= nblocks) return;
    size_t at = b * NB_SUMSQ_BLOCK, len = n - at < NB_SUMSQ_BLOCK ? n - at : NB_SUMSQ_BLOCK, i = 0;
    const float *x = g + at;
    double a[4] = {0.0, 0.0, 0.0, 0.0};
    if (((uintptr_t)x & 15) == 0) {
        for (; i + 4 <= len; i += 4) {
            float4 q = *(const float4 *)(x + i);
            a[0] = sq_add(a[0], q.x), a[1] = sq_add(a[1], q.y), a[2] = sq_add(a[2], q.z), a[3] = sq_add(a[3], q.w);
        }
    } else {
        for (; i + 4 <= len; i += 4)
            for (int j = 0; j < 4; j++) a[j] = sq_add(a[j], x[i + j]);
    }
    for (int j = 0; i < len; i++, j++) a[j] = sq_add(a[j], x[i]);
    part[b] = __dadd_rn(__dadd_rn(a[0], a[2]), __dadd_rn(a[1], a[3]));
}

extern "C" void nb_cuda_sumsq_blocks(double *part, const float *g, size_t n, nb_stream_t stream) {
    NB_CUDA_SHAPE(part && (g || n == 0), "nb_cuda_sumsq_blocks");
    size_t nblocks = (n + NB_SUMSQ_BLOCK - 1) / NB_SUMSQ_BLOCK;
    if (nblocks == 0) return;
    sumsq_blocks_kernel<<<(unsigned)((nblocks + 127) / 128), 128, 0, stream>>>(part, g, n, nblocks);
    CUDA_CHECK_LAUNCH("sum of squares by blocks");
}
