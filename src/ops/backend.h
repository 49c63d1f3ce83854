/* A backend is a table of ops (ggml's interface-table style): models and schedules call ops
 * through it and never know whether they run on the CPU (fp32 reference, the .c files of src/ops) or on a
 * CUDA stream (the .cu files beside them). Tensors are void* because their element type depends on the
 * backend's precision (fp32 on the CPU; bf16 or fp32 on CUDA); statistics (mean, rstd, lse,
 * losses) are always fp32. Every op takes the lane context it runs on (ctx->stream on CUDA).
 * Semantics are those of ops.h: backward ops accumulate (+=) into gradients; NULL skips one. */
#ifndef NB_BACKEND_H
#define NB_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "lanes/lanes.h"
#include "ops/rope.h"
#include "optim/optim.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef const nb_task_ctx *nb_ctx;

typedef struct nb_backend_i {
    const char *name;
    nb_device_kind device;
    nb_dtype act_dtype; /* element type of activations and compute weights */
    /* the recommendation ops on this backend (ops/backend_ctr.h); a copy of the table (nobubble
     * plan's CPU backend planning as a GPU) keeps its own */
    const struct nb_ctr_ops_i *ctr;

    void (*matmul_fwd)(nb_ctx, void *out, const void *inp, const void *w, const void *bias, int N, int C, int OC);
    void (*matmul_bwd)(nb_ctx, void *dinp, void *dw, void *dbias, const void *dout, const void *inp,
                       const void *w, int N, int C, int OC);
    void (*layernorm_fwd)(nb_ctx, void *out, float *mean, float *rstd, const void *inp, const void *w,
                          const void *b, int N, int C, float eps);
    void (*layernorm_bwd)(nb_ctx, void *dinp, void *dw, void *db, const void *dout, const void *inp,
                          const void *w, const float *mean, const float *rstd, int N, int C);
    void (*rmsnorm_fwd)(nb_ctx, void *out, float *rstd, const void *inp, const void *w, int N, int C, float eps);
    void (*rmsnorm_bwd)(nb_ctx, void *dinp, void *dw, const void *dout, const void *inp, const void *w,
                        const float *rstd, int N, int C);
    /* pre[N,OC] = inp @ w^T + bias (kept for backward), out = gelu(pre): an MLP's first linear;
     * CUDA fuses the GELU into the GEMM epilogue in bf16 */
    void (*matmul_gelu_fwd)(nb_ctx, void *out, void *pre, const void *inp, const void *w, const void *bias, int N,
                            int C, int OC);
    void (*gelu_fwd)(nb_ctx, void *out, const void *inp, size_t n);
    void (*gelu_bwd)(nb_ctx, void *dinp, const void *inp, const void *dout, size_t n);
    void (*swiglu_fwd)(nb_ctx, void *out, const void *gu, int N, int F);
    void (*swiglu_bwd)(nb_ctx, void *dgu, const void *dout, const void *gu, int N, int F);
    void (*residual_fwd)(nb_ctx, void *out, const void *a, const void *b, size_t n);
    void (*add_inplace)(nb_ctx, void *dst, const void *src, size_t n);
    /* dst += src on fp32 buffers whatever act_dtype is (gradient partials) */
    void (*add_f32)(nb_ctx, float *dst, const float *src, size_t n);
    /* dst[i * ld_dst + j] = (acc: dst +) alpha * src[i * ld_src + j] (act_dtype, math in fp32):
     * LoRA's scaled branch into a column slice of a fused projection, and its gradient back out */
    void (*scale_cols)(nb_ctx, void *dst, int ld_dst, const void *src, int ld_src, int rows, int cols, float alpha,
                       int acc);
    /* per-head RMSNorm in place on a strided view (Qwen3's q/k norm): see nb_headnorm_forward */
    void (*headnorm_fwd)(nb_ctx, void *x, void *x_in, float *rstd, const void *w, int N, int nh, int HS, int stride,
                         float eps);
    void (*headnorm_bwd)(nb_ctx, void *dx, void *dw, const void *x_in, const void *w, const float *rstd, int N, int nh,
                         int HS, int stride);
    void (*rope_fwd)(nb_ctx, void *x, int B, int T, int nheads, int HS, int row_stride, const nb_rope *r);
    void (*rope_bwd)(nb_ctx, void *dx, int B, int T, int nheads, int HS, int row_stride, const nb_rope *r);
    void (*attention_fwd)(nb_ctx, void *out, float *lse, const void *qkv, int B, int T, int NH, int NKV, int HS);
    void (*attention_bwd)(nb_ctx, void *dqkv, const void *dout, const void *qkv, const void *out,
                          const float *lse, int B, int T, int NH, int NKV, int HS);
    /* V = rows of wte (tokens must be below it) */
    void (*embed_fwd)(nb_ctx, void *out, const int32_t *tokens, const void *wte, const void *wpe, int B, int T, int C,
                      int V);
    void (*embed_bwd)(nb_ctx, void *dwte, void *dwpe, const void *dout, const int32_t *tokens, int B, int T, int C,
                      int V);
    /* Fused unembedding + cross-entropy (+ gradient when dinp/dw non-NULL); w has Vp >= V rows
     * (a backend may use the padding rows to align its GEMMs). Writes losses[N];
     * the loss sum is read from losses by the caller once the lane is done (no host sync here).
     * Each counted token's loss gradient is grad_scale, times *scale_by when scale_by is not NULL:
     * a float in backend memory, read when the op runs (a per-step scale that a captured graph
     * must not bake in: the masked loss's 1 / counted targets). */
    void (*xent_fwd_bwd)(nb_ctx, void *dinp, void *dw, float *losses, const void *inp, const void *w,
                         const int32_t *targets, int N, int C, int V, int Vp, float grad_scale, const float *scale_by);

    /* ---- optional (issue 18): fused ops and gradient-writing variants. NULL where a backend has
     * none (the CPU, CUDA fp32: the tight-parity path keeps its order of roundings), and the model
     * then calls the plain ops above. The _set ops WRITE their activation gradient (=) where the
     * plain op accumulates (+=), so that buffer needs no zeroing first; parameter gradients (dw,
     * dbias) still accumulate. ---- */
    /* out = resid + inp @ w^T + bias (out != resid): matmul_fwd then residual_fwd(out, resid, out) */
    void (*matmul_residual_fwd)(nb_ctx, void *out, const void *inp, const void *w, const void *bias,
                                const void *resid, int N, int C, int OC);
    /* the backward of out = gelu(pre) @ w^T + bias, inp = gelu(pre): dw, dbias as matmul_bwd;
     * dpre = gelu'(pre) * (dout @ w) (written); dbias_pre += column sums of dpre (NULL skips) */
    void (*matmul_dgelu_bwd)(nb_ctx, void *dpre, void *dw, void *dbias, void *dbias_pre, const void *dout,
                             const void *inp, const void *w, const void *pre, int N, int C, int OC);
    void (*matmul_bwd_set)(nb_ctx, void *dinp, void *dw, void *dbias, const void *dout, const void *inp,
                           const void *w, int N, int C, int OC);
    void (*swiglu_bwd_set)(nb_ctx, void *dgu, const void *dout, const void *gu, int N, int F);
    void (*attention_bwd_set)(nb_ctx, void *dqkv, const void *dout, const void *qkv, const void *out,
                              const float *lse, int B, int T, int NH, int NKV, int HS);

    /* ---- optimizer pieces (parameters, their gradients and AdamW state are fp32 slabs) ---- */
    /* *out = sum of x[0..n) (out: backend memory; fixed order) */
    void (*sum_f64)(nb_ctx, double *out, const float *x, size_t n);
    /* *out = sum of squares of x[0..n) (fixed order) */
    void (*sumsq_f64)(nb_ctx, double *out, const float *x, size_t n);
    /* part[b] = nb_sumsq_block of x's block b (NB_SUMSQ_BLOCK elements, the last one shorter), the
     * same bits as the host's (part in backend memory): the stream schedule's norm over gradients
     * that stay on the device */
    void (*sumsq_blocks)(nb_ctx, double *part, const float *x, size_t n);
    /* *clip = nb_clip_factor(sqrt(*sumsq), max_norm) (both in backend memory) */
    void (*clip_factor)(nb_ctx, float *clip, const double *sumsq, float max_norm);
    /* AdamW over one tensor with the step's scalars k and the clip factor (both in backend memory,
     * so a captured graph replays as they change; clip may be NULL). params_lowp (the compute
     * copy in act_dtype) is refreshed when the backend keeps one (NULL otherwise). */
    void (*adamw)(nb_ctx, float *params, const float *grads, float *m, float *v, void *params_lowp, size_t n,
                  const nb_adamw_scalars *k, const float *clip);
    /* AdamW over every tensor of a slab in one pass (one launch on CUDA): span i updates elements
     * [offset, offset + numel) of params, grads, m, v (and params_lowp) with k[spans[i].scalars]
     * (k in backend memory). The gradients are scaled by nb_clip_factor(sqrt(*sumsq), max_norm)
     * when it is below 1, formed where it is used (sumsq in backend memory; NULL: no clipping),
     * so no launch of its own. spans is host memory, read during the call (a captured graph keeps
     * its values); ascending and disjoint; elements between spans are not touched. The same bits
     * as adamw over each span with clip_factor's result. */
    void (*adamw_spans)(nb_ctx, float *params, const float *grads, float *m, float *v, void *params_lowp,
                        const nb_adamw_span *spans, int nspans, const nb_adamw_scalars *k, const double *sumsq,
                        float max_norm);
    /* params_lowp[0..n) = params converted to act_dtype (NULL-op for fp32 backends) */
    void (*cast_params)(nb_ctx, void *params_lowp, const float *params, size_t n);

    /* n normals of (seed, stream) into HOST memory out, element i = mean + std * nb_rng_normal_at(seed,
     * stream, i): nb_rng_fill_normal's bits (the CUDA backend draws them on the GPU: fill.cu);
     * returns when out is written. The seeded init of big models. */
    void (*fill_normal)(nb_ctx, float *out, size_t n, uint64_t seed, uint64_t stream, float mean, float std);

    /* ---- memory (backend memory: host RAM on the CPU, device memory on CUDA) ---- */
    void *(*alloc)(size_t bytes, const char *what);
    void (*free)(void *ptr);
    void (*zero)(nb_ctx, void *ptr, size_t bytes);
    void (*to_backend)(nb_ctx, void *dst, const void *host_src, size_t bytes); /* ordered on ctx */
    void (*to_host)(nb_ctx, void *host_dst, const void *src, size_t bytes);    /* returns when done */
    /* ordered on ctx and returns at once (host_dst from host_alloc); a mark of the lane after it
     * says when the bytes are there */
    void (*to_host_async)(nb_ctx, void *host_dst, const void *src, size_t bytes);
    /* Host memory the backend copies from and to asynchronously (pinned on CUDA). */
    void *(*host_alloc)(size_t bytes, const char *what);
    void (*host_free)(void *ptr);
    /* Bytes the backend can still allocate (0: unknown). */
    size_t (*mem_available)(void);
} nb_backend_i;

/* Which bf16 attention a CUDA instance runs (the CLI's --attn; attention_cudnn.c). fp32 and the
 * accumulating backward always run nobubble's kernels; the CPU ignores it. */
typedef enum {
    NB_ATTN_AUTO,       /* "auto", the default: NB_ATTN_CUDNN from NB_ATTN_AUTO_MIN_T tokens, NB_ATTN_FA below */
    NB_ATTN_FA,         /* "fa": nobubble's kernels */
    NB_ATTN_CUDNN,      /* "cudnn": cuDNN forward, cuDNN deterministic backward */
    NB_ATTN_CUDNN_FWD,  /* "cudnn-fwd": cuDNN forward, nobubble's backward (reads cuDNN's lse) */
    NB_ATTN_CUDNN_FAST, /* "cudnn-fast": cuDNN forward and non-deterministic backward */
    NB_ATTN_MODE_COUNT
} nb_attn_mode;
extern const char *const nb_attn_mode_names[NB_ATTN_MODE_COUNT + 1]; /* "auto", "fa", ... by value; NULL */
extern const char nb_attn_mode_help[]; /* every name with what it runs, for --help and errors */
/* *mode = the mode named name; 0, or -1 (mode unchanged) when name is not one of the names. */
int nb_attn_mode_parse(const char *name, nb_attn_mode *mode);

/* A backend instance: one device's op table and what belongs to that device, created by the run
 * (not process globals): the device index, the library handles the ops use and their caches, and
 * the instance's settings. Ops reach it through their ctx (ctx->backend: the lanes runtime is
 * bound to it, nb_lanes_bind). */
typedef struct nb_backend {
    const nb_backend_i *ops;
    int device;       /* CUDA device index; -1 on the CPU */
    void *blas;       /* the cuBLASLt handle of that device and its GEMM workspaces (CUDA), NULL on the CPU */
    nb_attn_mode attn; /* NB_ATTN_AUTO unless nb_backend_set_attn says otherwise */
    struct nb_attn_state *attn_state; /* cuDNN's handle and plans, which attention ran (CUDA), NULL on the CPU */
    char desc[320];   /* "cpu", "cuda:0 (NVIDIA H200)" */
} nb_backend;

/* The instance for a device ("cpu", "cuda", "cuda:N") and precision ("bf16", "fp32", or "" for
 * the device's default). "cuda:N" checks that GPU N exists (the error lists the GPUs present)
 * and makes it the calling thread's current device; lanes created afterwards run on it. */
nb_backend *nb_backend_create(const char *device, const char *precision);
void nb_backend_destroy(nb_backend *b);
/* The bf16 attention the instance runs from now on (attention_cudnn.c). */
void nb_backend_set_attn(nb_backend *b, nb_attn_mode mode);
/* The instance a task runs on (its lane's runtime was bound to it); fails on an unbound lane. */
const nb_backend *nb_backend_of(nb_ctx c);
/* The GPU index of a device string: 0 for "cuda", N for "cuda:N", -1 for "cpu"; a bad string
 * is an nb_fail with a hint. */
int nb_device_index(const char *device);

extern const nb_backend_i nb_backend_cpu;
#ifdef NB_WITH_CUDA
extern const nb_backend_i nb_backend_cuda_bf16; /* bf16 compute, fp32 master weights and state */
extern const nb_backend_i nb_backend_cuda_f32;  /* fp32 everywhere, TF32 off: for tight parity */
#endif
/* The op table for a device and precision (what nb_backend_create's instance uses); fails with a
 * hint when the build or the machine lacks it. */
const nb_backend_i *nb_backend_for(const char *device, const char *precision);
#ifdef NB_WITH_CUDA
/* backend_cuda.c: open GPU `index` for an instance (checks it exists, makes it current, sets up
 * its memory pool, creates the handles); and the inverse. */
void nb_cuda_instance_open(nb_backend *b, int index);
void nb_cuda_instance_close(nb_backend *b);
#endif
/* Number of usable CUDA devices (0 in a build without CUDA or on a machine without a GPU);
 * names the first one into name. */
int nb_cuda_device_count(char *name, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
