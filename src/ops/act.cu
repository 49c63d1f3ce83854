/* Elementwise ops on CUDA (GELU-tanh, SwiGLU, residual adds, dtype casts), same formulas as
 * act.c, computed in fp32 whatever the storage type. Each element is written by one thread
 * (grid-stride loops), so results never depend on the launch shape. */
#include "ops_cuda_common.cuh"

#define THREADS 256
#define GELU_K 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_A 0.044715f

static __device__ __forceinline__ float gelu_f(float x) {
    float u = GELU_K * (x + GELU_A * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
}

static __device__ __forceinline__ float gelu_grad_f(float x) {
    float u = GELU_K * (x + GELU_A * x * x * x);
    float t = tanhf(u);
    float du = GELU_K * (1.0f + 3.0f * GELU_A * x * x);
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
}

/* silu(g) * u, silu(g) = g / (1 + exp(-g)), as torch writes it (g < -88: exp -> inf, silu -> -0).
 * The scalar and the vector kernels share these, so both round every element alike. */
static __device__ __forceinline__ float swiglu_f(float g, float u) { return g / (1.0f + expf(-g)) * u; }

/* dy times d/dg and d/du of swiglu_f: with s = sigmoid(g), d silu/dg = s (1 + g (1 - s)). */
static __device__ __forceinline__ void swiglu_grad_f(float g, float u, float dy, float *dg, float *du) {
    float e1 = 1.0f + expf(-g);
    float s = 1.0f / e1, silu = g / e1;
    *dg = dy * u * s * (1.0f + g * (1.0f - s));
    *du = dy * silu;
}

/* 16 bytes of elements, 16-byte aligned, to and from fp32 (as nb_ld / nb_st). */
#define VEC(T) ((int)(16 / sizeof(T)))
static __device__ __forceinline__ void ld_vec(const float *p, float *v) {
    float4 a = *(const float4 *)p;
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
}
static __device__ __forceinline__ void ld_vec(const nb_bf16_t *p, float *v) {
    nb_bf16x8_unpack(*(const uint4 *)p, v);
}
static __device__ __forceinline__ void st_vec(float *p, const float *v) {
    *(float4 *)p = make_float4(v[0], v[1], v[2], v[3]);
}
static __device__ __forceinline__ void st_vec(nb_bf16_t *p, const float *v) {
    *(uint4 *)p = nb_bf16x8_pack(v);
}

/* Offset in gu of the gate under output vector k: output element k * vec lies in row
 * r = k / (F / vec), and each row of gu is F longer than a row of out, so r * F further on. */
static __device__ __forceinline__ size_t swiglu_vec_gate(size_t k, int F, int vec) {
    return k * vec + k / (size_t)(F / vec) * F;
}

template <typename T> static __global__ void gelu_fwd_kernel(T *out, const T *inp, size_t n) {
    NB_GRID_STRIDE(i, n) nb_st(out + i, gelu_f(nb_ld(inp + i)));
}
template <typename T> static __global__ void gelu_bwd_kernel(T *dinp, const T *inp, const T *dout, size_t n) {
    NB_GRID_STRIDE(i, n) nb_st(dinp + i, nb_ld(dinp + i) + gelu_grad_f(nb_ld(inp + i)) * nb_ld(dout + i));
}
/* x = gelu'(pre) * x in place: the unfused half of nb_cuda_matmul_dgelu_backward */
template <typename T> static __global__ void gelu_bwd_scale_kernel(T *x, const T *pre, size_t n) {
    NB_GRID_STRIDE(i, n) nb_st(x + i, gelu_grad_f(nb_ld(pre + i)) * nb_ld(x + i));
}

template <typename T> static __global__ void swiglu_fwd_kernel(T *out, const T *gu, int F, size_t n) {
    NB_GRID_STRIDE(i, n) {
        size_t row = i / F, col = i % F;
        nb_st(out + i, swiglu_f(nb_ld(gu + row * 2 * F + col), nb_ld(gu + row * 2 * F + F + col)));
    }
}
template <typename T> static __global__ void swiglu_bwd_kernel(T *dgu, const T *dout, const T *gu, int F, size_t n) {
    NB_GRID_STRIDE(i, n) {
        size_t row = i / F, col = i % F;
        size_t ig = row * 2 * F + col, iu = ig + F;
        float dg, du;
        swiglu_grad_f(nb_ld(gu + ig), nb_ld(gu + iu), nb_ld(dout + i), &dg, &du);
        nb_st(dgu + ig, nb_ld(dgu + ig) + dg);
        nb_st(dgu + iu, nb_ld(dgu + iu) + du);
    }
}
/* the same, writing dgu (=) instead of adding to it */
template <typename T>
static __global__ void swiglu_bwd_set_kernel(T *dgu, const T *dout, const T *gu, int F, size_t n) {
    NB_GRID_STRIDE(i, n) {
        size_t row = i / F, col = i % F;
        size_t ig = row * 2 * F + col, iu = ig + F;
        float dg, du;
        swiglu_grad_f(nb_ld(gu + ig), nb_ld(gu + iu), nb_ld(dout + i), &dg, &du);
        nb_st(dgu + ig, dg);
        nb_st(dgu + iu, du);
    }
}
/* The vector forms of the three (swiglu_vec_ok): thread k owns output columns [k * VEC, k * VEC +
 * VEC) of one row, and the gate, up and gradient columns under them; it loads all it reads
 * before it stores, as the scalar kernels do element by element. */
template <typename T> static __global__ void swiglu_fwd_vec_kernel(T *out, const T *gu, int F, size_t nv) {
    NB_GRID_STRIDE(k, nv) {
        size_t ig = swiglu_vec_gate(k, F, VEC(T));
        float g[VEC(T)], u[VEC(T)];
        ld_vec(gu + ig, g), ld_vec(gu + ig + F, u);
#pragma unroll
        for (int e = 0; e < VEC(T); e++) g[e] = swiglu_f(g[e], u[e]);
        st_vec(out + k * VEC(T), g);
    }
}
/* acc: dgu += the gradient (swiglu_bwd_kernel's sums), else dgu = it (the _set kernel's) */
template <typename T>
static __global__ void swiglu_bwd_vec_kernel(T *dgu, const T *dout, const T *gu, int F, size_t nv, int acc) {
    NB_GRID_STRIDE(k, nv) {
        size_t ig = swiglu_vec_gate(k, F, VEC(T));
        float g[VEC(T)], u[VEC(T)], dy[VEC(T)], dg[VEC(T)], du[VEC(T)];
        ld_vec(gu + ig, g), ld_vec(gu + ig + F, u), ld_vec(dout + k * VEC(T), dy);
        if (acc) ld_vec(dgu + ig, dg), ld_vec(dgu + ig + F, du);
#pragma unroll
        for (int e = 0; e < VEC(T); e++) {
            float a, b;
            swiglu_grad_f(g[e], u[e], dy[e], &a, &b);
            dg[e] = acc ? dg[e] + a : a, du[e] = acc ? du[e] + b : b;
        }
        st_vec(dgu + ig, dg), st_vec(dgu + ig + F, du);
    }
}

template <typename T> static __global__ void residual_kernel(T *out, const T *a, const T *b, size_t n) {
    NB_GRID_STRIDE(i, n) nb_st(out + i, nb_ld(a + i) + nb_ld(b + i));
}
template <typename T> static __global__ void add_inplace_kernel(T *dst, const T *src, size_t n) {
    NB_GRID_STRIDE(i, n) nb_st(dst + i, nb_ld(dst + i) + nb_ld(src + i));
}
template <typename T>
static __global__ void scale_cols_kernel(T *dst, int ld_dst, const T *src, int ld_src, int cols, size_t n, float alpha,
                                         int acc) {
    NB_GRID_STRIDE(e, n) {
        size_t i = e / (size_t)cols, j = e % (size_t)cols;
        T *d = dst + i * ld_dst + j;
        float v = alpha * nb_ld(src + i * ld_src + j);
        nb_st(d, acc ? nb_ld(d) + v : v);
    }
}
/* dst = src in dst's type (bf16: round to nearest even) */
template <typename D, typename S> static __global__ void cast_kernel(D *dst, const S *src, size_t n) {
    NB_GRID_STRIDE(i, n) nb_st(dst + i, nb_ld(src + i));
}

/* kernel<<<enough blocks for n threads, THREADS>>>(args) on stream, then the launch check. */
template <typename... P, typename... A>
static void launch_1d(void (*kernel)(P...), size_t n, const char *what, cudaStream_t stream, A... args) {
    if (n == 0) return;
    kernel<<<nb_grid_1d(n, THREADS), THREADS, 0, stream>>>(args...);
    CUDA_CHECK_LAUNCH(what);
}

/* The swiglu vector kernels: F a multiple of the vector, so that with 16-byte aligned bases every
 * row of gu, dgu and out (and every vector in them) is 16-byte aligned too. */
static int swiglu_vec_ok(int F, int vec, const void *a, const void *b, const void *c) {
    return F % vec == 0 && (((uintptr_t)a | (uintptr_t)b | (uintptr_t)c) & 15) == 0;
}

/* ---- launchers: one template each, and an extern "C" wrapper per dtype ---- */

template <typename T>
static void gelu_forward(T *out, const T *inp, size_t n, cudaStream_t stream, const char *name) {
    NB_CUDA_SHAPE(out && inp, name);
    launch_1d(gelu_fwd_kernel<T>, n, "gelu forward", stream, out, inp, n);
}

template <typename T>
static void gelu_backward(T *dinp, const T *inp, const T *dout, size_t n, cudaStream_t stream, const char *name) {
    if (!dinp) return;
    NB_CUDA_SHAPE(inp && dout && (const void *)dinp != (const void *)dout, name);
    launch_1d(gelu_bwd_kernel<T>, n, "gelu backward", stream, dinp, inp, dout, n);
}

template <typename T>
static void gelu_backward_scale(T *x, const T *pre, size_t n, cudaStream_t stream, const char *name) {
    NB_CUDA_SHAPE(x && pre && (const void *)x != (const void *)pre, name);
    launch_1d(gelu_bwd_scale_kernel<T>, n, "gelu backward (scale in place)", stream, x, pre, n);
}

template <typename T>
static void swiglu_forward(T *out, const T *gu, int N, int F, cudaStream_t stream, const char *name) {
    NB_CUDA_SHAPE(out && gu && N >= 0 && F >= 0, name);
    size_t n = (size_t)N * F, nv = n / VEC(T);
    if (swiglu_vec_ok(F, VEC(T), out, gu, gu))
        launch_1d(swiglu_fwd_vec_kernel<T>, nv, "swiglu forward", stream, out, gu, F, nv);
    else
        launch_1d(swiglu_fwd_kernel<T>, n, "swiglu forward", stream, out, gu, F, n);
}

/* acc: dgu += the gradient (nb_cuda_swiglu_backward); else dgu = it (the _set launchers) */
template <typename T>
static void swiglu_backward(T *dgu, const T *dout, const T *gu, int N, int F, int acc, cudaStream_t stream,
                            const char *name) {
    if (!dgu) return;
    NB_CUDA_SHAPE(dout && gu && N >= 0 && F >= 0, name);
    size_t n = (size_t)N * F, nv = n / VEC(T);
    if (swiglu_vec_ok(F, VEC(T), dgu, dout, gu))
        launch_1d(swiglu_bwd_vec_kernel<T>, nv, "swiglu backward", stream, dgu, dout, gu, F, nv, acc);
    else if (acc)
        launch_1d(swiglu_bwd_kernel<T>, n, "swiglu backward", stream, dgu, dout, gu, F, n);
    else
        launch_1d(swiglu_bwd_set_kernel<T>, n, "swiglu backward (set)", stream, dgu, dout, gu, F, n);
}

template <typename T>
static void residual_forward(T *out, const T *a, const T *b, size_t n, cudaStream_t stream, const char *name) {
    NB_CUDA_SHAPE(out && a && b, name);
    launch_1d(residual_kernel<T>, n, "residual forward", stream, out, a, b, n);
}

template <typename T>
static void add_inplace(T *dst, const T *src, size_t n, cudaStream_t stream, const char *name) {
    NB_CUDA_SHAPE(dst && src, name);
    launch_1d(add_inplace_kernel<T>, n, "add in place", stream, dst, src, n);
}

template <typename T>
static void scale_cols(T *dst, int ld_dst, const T *src, int ld_src, int rows, int cols, float alpha, int acc,
                       cudaStream_t stream, const char *name) {
    NB_CUDA_SHAPE(dst && src && rows >= 0 && cols >= 1 && cols <= ld_dst && cols <= ld_src, name);
    size_t n = (size_t)rows * cols;
    if (n) launch_1d(scale_cols_kernel<T>, n, "scale cols", stream, dst, ld_dst, src, ld_src, cols, n, alpha, acc);
}

extern "C" void nb_cuda_gelu_forward_f32(float *out, const float *inp, size_t n, nb_stream_t stream) {
    gelu_forward(out, inp, n, stream, __func__);
}
extern "C" void nb_cuda_gelu_forward_bf16(nb_bf16 *out, const nb_bf16 *inp, size_t n, nb_stream_t stream) {
    gelu_forward(nb_kt(out), nb_kt(inp), n, stream, __func__);
}
extern "C" void nb_cuda_gelu_backward_f32(float *dinp, const float *inp, const float *dout, size_t n,
                                          nb_stream_t stream) {
    gelu_backward(dinp, inp, dout, n, stream, __func__);
}
extern "C" void nb_cuda_gelu_backward_bf16(nb_bf16 *dinp, const nb_bf16 *inp, const nb_bf16 *dout, size_t n,
                                           nb_stream_t stream) {
    gelu_backward(nb_kt(dinp), nb_kt(inp), nb_kt(dout), n, stream, __func__);
}
extern "C" void nb_cuda_gelu_backward_scale_f32(float *x, const float *pre, size_t n, nb_stream_t stream) {
    gelu_backward_scale(x, pre, n, stream, __func__);
}
extern "C" void nb_cuda_gelu_backward_scale_bf16(nb_bf16 *x, const nb_bf16 *pre, size_t n, nb_stream_t stream) {
    gelu_backward_scale(nb_kt(x), nb_kt(pre), n, stream, __func__);
}
extern "C" void nb_cuda_swiglu_forward_f32(float *out, const float *gu, int N, int F, nb_stream_t stream) {
    swiglu_forward(out, gu, N, F, stream, __func__);
}
extern "C" void nb_cuda_swiglu_forward_bf16(nb_bf16 *out, const nb_bf16 *gu, int N, int F, nb_stream_t stream) {
    swiglu_forward(nb_kt(out), nb_kt(gu), N, F, stream, __func__);
}
extern "C" void nb_cuda_swiglu_backward_f32(float *dgu, const float *dout, const float *gu, int N, int F,
                                            nb_stream_t stream) {
    swiglu_backward(dgu, dout, gu, N, F, 1, stream, __func__);
}
extern "C" void nb_cuda_swiglu_backward_bf16(nb_bf16 *dgu, const nb_bf16 *dout, const nb_bf16 *gu, int N, int F,
                                             nb_stream_t stream) {
    swiglu_backward(nb_kt(dgu), nb_kt(dout), nb_kt(gu), N, F, 1, stream, __func__);
}
extern "C" void nb_cuda_swiglu_backward_set_f32(float *dgu, const float *dout, const float *gu, int N, int F,
                                                nb_stream_t stream) {
    swiglu_backward(dgu, dout, gu, N, F, 0, stream, __func__);
}
extern "C" void nb_cuda_swiglu_backward_set_bf16(nb_bf16 *dgu, const nb_bf16 *dout, const nb_bf16 *gu, int N, int F,
                                                 nb_stream_t stream) {
    swiglu_backward(nb_kt(dgu), nb_kt(dout), nb_kt(gu), N, F, 0, stream, __func__);
}
extern "C" void nb_cuda_residual_forward_f32(float *out, const float *a, const float *b, size_t n,
                                             nb_stream_t stream) {
    residual_forward(out, a, b, n, stream, __func__);
}
extern "C" void nb_cuda_residual_forward_bf16(nb_bf16 *out, const nb_bf16 *a, const nb_bf16 *b, size_t n,
                                              nb_stream_t stream) {
    residual_forward(nb_kt(out), nb_kt(a), nb_kt(b), n, stream, __func__);
}
extern "C" void nb_cuda_add_inplace_f32(float *dst, const float *src, size_t n, nb_stream_t stream) {
    add_inplace(dst, src, n, stream, __func__);
}
extern "C" void nb_cuda_add_inplace_bf16(nb_bf16 *dst, const nb_bf16 *src, size_t n, nb_stream_t stream) {
    add_inplace(nb_kt(dst), nb_kt(src), n, stream, __func__);
}

extern "C" void nb_cuda_cast_f32_to_bf16(nb_bf16 *dst, const float *src, size_t n, nb_stream_t stream) {
    NB_CUDA_SHAPE(dst && src, __func__);
    launch_1d(cast_kernel<nb_bf16_t, float>, n, "cast f32 -> bf16", stream, nb_kt(dst), src, n);
}

extern "C" void nb_cuda_cast_bf16_to_f32(float *dst, const nb_bf16 *src, size_t n, nb_stream_t stream) {
    NB_CUDA_SHAPE(dst && src, __func__);
    launch_1d(cast_kernel<float, nb_bf16_t>, n, "cast bf16 -> f32", stream, dst, nb_kt(src), n);
}
extern "C" void nb_cuda_scale_cols_f32(float *dst, int ld_dst, const float *src, int ld_src, int rows, int cols,
                                       float alpha, int acc, nb_stream_t stream) {
    scale_cols(dst, ld_dst, src, ld_src, rows, cols, alpha, acc, stream, __func__);
}
extern "C" void nb_cuda_scale_cols_bf16(nb_bf16 *dst, int ld_dst, const nb_bf16 *src, int ld_src, int rows, int cols,
                                        float alpha, int acc, nb_stream_t stream) {
    scale_cols(nb_kt(dst), ld_dst, nb_kt(src), ld_src, rows, cols, alpha, acc, stream, __func__);
}
