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

#define GRID_STRIDE(i, n)                                                                          \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

#define DEF_ACT_KERNELS(T)                                                                         \
    static __global__ void gelu_fwd_kernel(T *out, const T *inp, size_t n) {                       \
        GRID_STRIDE(i, n) nb_st(out + i, gelu_f(nb_ld(inp + i)));                                  \
    }                                                                                              \
    static __global__ void gelu_bwd_kernel(T *dinp, const T *inp, const T *dout, size_t n) {       \
        GRID_STRIDE(i, n) nb_st(dinp + i, nb_ld(dinp + i) + gelu_grad_f(nb_ld(inp + i)) * nb_ld(dout + i)); \
    }                                                                                              \
    /* x = gelu'(pre) * x in place: the unfused half of nb_cuda_matmul_dgelu_backward */        \
    static __global__ void gelu_bwd_scale_kernel(T *x, const T *pre, size_t n) {                   \
        GRID_STRIDE(i, n) nb_st(x + i, gelu_grad_f(nb_ld(pre + i)) * nb_ld(x + i));                \
    }                                                                                              \
    static __global__ void swiglu_fwd_kernel(T *out, const T *gu, int F, size_t n) {               \
        GRID_STRIDE(i, n) {                                                                        \
            size_t row = i / F, col = i % F;                                                       \
            nb_st(out + i, swiglu_f(nb_ld(gu + row * 2 * F + col), nb_ld(gu + row * 2 * F + F + col))); \
        }                                                                                          \
    }                                                                                              \
    static __global__ void swiglu_bwd_kernel(T *dgu, const T *dout, const T *gu, int F, size_t n) { \
        GRID_STRIDE(i, n) {                                                                        \
            size_t row = i / F, col = i % F;                                                       \
            size_t ig = row * 2 * F + col, iu = ig + F;                                            \
            float dg, du;                                                                          \
            swiglu_grad_f(nb_ld(gu + ig), nb_ld(gu + iu), nb_ld(dout + i), &dg, &du);              \
            nb_st(dgu + ig, nb_ld(dgu + ig) + dg);                                                 \
            nb_st(dgu + iu, nb_ld(dgu + iu) + du);                                                 \
        }                                                                                          \
    }                                                                                              \
    /* the same, writing dgu (=) instead of adding to it */                                      \
    static __global__ void swiglu_bwd_set_kernel(T *dgu, const T *dout, const T *gu, int F, size_t n) { \
        GRID_STRIDE(i, n) {                                                                        \
            size_t row = i / F, col = i % F;                                                       \
            size_t ig = row * 2 * F + col, iu = ig + F;                                            \
            float dg, du;                                                                          \
            swiglu_grad_f(nb_ld(gu + ig), nb_ld(gu + iu), nb_ld(dout + i), &dg, &du);              \
            nb_st(dgu + ig, dg);                                                                   \
            nb_st(dgu + iu, du);                                                                   \
        }                                                                                          \
    }                                                                                              \
    /* The vector forms of the three (swiglu_vec_ok): thread k owns output columns            \
     * [k * VEC, k * VEC + VEC) of one row, and the gate, up and gradient columns under them;     \
     * it loads all it reads before it stores, as the scalar kernels do element by element. */   \
    static __global__ void swiglu_fwd_vec_kernel(T *out, const T *gu, int F, size_t nv) {          \
        GRID_STRIDE(k, nv) {                                                                       \
            size_t ig = swiglu_vec_gate(k, F, VEC(T));                                             \
            float g[VEC(T)], u[VEC(T)];                                                            \
            ld_vec(gu + ig, g), ld_vec(gu + ig + F, u);                                            \
            _Pragma("unroll") for (int e = 0; e < VEC(T); e++) g[e] = swiglu_f(g[e], u[e]);        \
            st_vec(out + k * VEC(T), g);                                                           \
        }                                                                                          \
    }                                                                                              \
    /* acc: dgu += the gradient (swiglu_bwd_kernel's sums), else dgu = it (the _set kernel's) */  \
    static __global__ void swiglu_bwd_vec_kernel(T *dgu, const T *dout, const T *gu, int F, size_t nv, \
                                                 int acc) {                                        \
        GRID_STRIDE(k, nv) {                                                                       \
            size_t ig = swiglu_vec_gate(k, F, VEC(T));                                             \
            float g[VEC(T)], u[VEC(T)], dy[VEC(T)], dg[VEC(T)], du[VEC(T)];                        \
            ld_vec(gu + ig, g), ld_vec(gu + ig + F, u), ld_vec(dout + k * VEC(T), dy);             \
            if (acc) ld_vec(dgu + ig, dg), ld_vec(dgu + ig + F, du);                               \
            _Pragma("unroll") for (int e = 0; e < VEC(T); e++) {                                   \
                float a, b;                                                                        \
                swiglu_grad_f(g[e], u[e], dy[e], &a, &b);                                          \
                dg[e] = acc ? dg[e] + a : a, du[e] = acc ? du[e] + b : b;                          \
            }                                                                                      \
            st_vec(dgu + ig, dg), st_vec(dgu + ig + F, du);                                        \
        }                                                                                          \
    }                                                                                              \
    static __global__ void residual_kernel(T *out, const T *a, const T *b, size_t n) {             \
        GRID_STRIDE(i, n) nb_st(out + i, nb_ld(a + i) + nb_ld(b + i));                             \
    }                                                                                              \
    static __global__ void add_inplace_kernel(T *dst, const T *src, size_t n) {                    \
        GRID_STRIDE(i, n) nb_st(dst + i, nb_ld(dst + i) + nb_ld(src + i));                         \
    }
NB_FOR_EACH_DTYPE(DEF_ACT_KERNELS)

static __global__ void cast_f32_bf16_kernel(nb_bf16_t *dst, const float *src, size_t n) {
    GRID_STRIDE(i, n) nb_st(dst + i, src[i]);
}
static __global__ void cast_bf16_f32_kernel(float *dst, const nb_bf16_t *src, size_t n) {
    GRID_STRIDE(i, n) dst[i] = nb_ld(src + i);
}

#define LAUNCH_1D(kernel, n, what, ...)                                                            \
    do {                                                                                           \
        if ((n) == 0) break;                                                                       \
        kernel<<<nb_grid_1d((n), THREADS), THREADS, 0, stream>>>(__VA_ARGS__);                     \
        CUDA_CHECK_LAUNCH(what);                                                                   \
    } while (0)

/* The swiglu vector kernels: F a multiple of the vector, so that with 16-byte aligned bases every
 * row of gu, dgu and out (and every vector in them) is 16-byte aligned too. */
static int swiglu_vec_ok(int F, int vec, const void *a, const void *b, const void *c) {
    return F % vec == 0 && (((uintptr_t)a | (uintptr_t)b | (uintptr_t)c) & 15) == 0;
}

#define DEF_ACT_LAUNCHERS(SFX, T, KT)                                                              \
    extern "C" void nb_cuda_gelu_forward_##SFX(T *out, const T *inp, size_t n, nb_stream_t stream) { \
        NB_CUDA_SHAPE(out && inp, "nb_cuda_gelu_forward_" #SFX);                                   \
        LAUNCH_1D(gelu_fwd_kernel, n, "gelu forward", (KT *)out, (const KT *)inp, n);              \
    }                                                                                              \
    extern "C" void nb_cuda_gelu_backward_##SFX(T *dinp, const T *inp, const T *dout, size_t n,    \
                                                 nb_stream_t stream) {                             \
        if (!dinp) return;                                                                         \
        NB_CUDA_SHAPE(inp && dout && (const void *)dinp != (const void *)dout,                     \
                      "nb_cuda_gelu_backward_" #SFX);                                              \
        LAUNCH_1D(gelu_bwd_kernel, n, "gelu backward", (KT *)dinp, (const KT *)inp, (const KT *)dout, n); \
    }                                                                                              \
    extern "C" void nb_cuda_gelu_backward_scale_##SFX(T *x, const T *pre, size_t n, nb_stream_t stream) { \
        NB_CUDA_SHAPE(x && pre && (const void *)x != (const void *)pre, "nb_cuda_gelu_backward_scale_" #SFX); \
        LAUNCH_1D(gelu_bwd_scale_kernel, n, "gelu backward (scale in place)", (KT *)x, (const KT *)pre, n); \
    }                                                                                              \
    extern "C" void nb_cuda_swiglu_forward_##SFX(T *out, const T *gu, int N, int F, nb_stream_t stream) { \
        NB_CUDA_SHAPE(out && gu && N >= 0 && F >= 0, "nb_cuda_swiglu_forward_" #SFX);              \
        size_t n = (size_t)N * F, nv = n / VEC(KT);                                                \
        if (swiglu_vec_ok(F, VEC(KT), out, gu, gu))                                                \
            LAUNCH_1D(swiglu_fwd_vec_kernel, nv, "swiglu forward", (KT *)out, (const KT *)gu, F, nv); \
        else                                                                                       \
            LAUNCH_1D(swiglu_fwd_kernel, n, "swiglu forward", (KT *)out, (const KT *)gu, F, n);    \
    }                                                                                              \
    static void swiglu_bwd_##SFX(KT *dgu, const KT *dout, const KT *gu, int F, size_t n, int set,   \
                                 nb_stream_t stream) {                                             \
        size_t nv = n / VEC(KT);                                                                   \
        if (!swiglu_vec_ok(F, VEC(KT), dgu, dout, gu)) {                                           \
            if (set)                                                                               \
                LAUNCH_1D(swiglu_bwd_set_kernel, n, "swiglu backward (set)", dgu, dout, gu, F, n); \
            else                                                                                   \
                LAUNCH_1D(swiglu_bwd_kernel, n, "swiglu backward", dgu, dout, gu, F, n);           \
        } else {                                                                                   \
            LAUNCH_1D(swiglu_bwd_vec_kernel, nv, "swiglu backward", dgu, dout, gu, F, nv, !set);   \
        }                                                                                          \
    }                                                                                              \
    extern "C" void nb_cuda_swiglu_backward_##SFX(T *dgu, const T *dout, const T *gu, int N, int F, \
                                                   nb_stream_t stream) {                           \
        if (!dgu) return;                                                                          \
        NB_CUDA_SHAPE(dout && gu && N >= 0 && F >= 0, "nb_cuda_swiglu_backward_" #SFX);            \
        swiglu_bwd_##SFX((KT *)dgu, (const KT *)dout, (const KT *)gu, F, (size_t)N * F, 0, stream); \
    }                                                                                              \
    extern "C" void nb_cuda_swiglu_backward_set_##SFX(T *dgu, const T *dout, const T *gu, int N, int F, \
                                                       nb_stream_t stream) {                       \
        if (!dgu) return;                                                                          \
        NB_CUDA_SHAPE(dout && gu && N >= 0 && F >= 0, "nb_cuda_swiglu_backward_set_" #SFX);        \
        size_t n = (size_t)N * F;                                                                  \
        int set = nb_env_flag("NB_GRAD_SET", 1);                                                   \
        if (!set && n) CUDA_CHECK(cudaMemsetAsync(dgu, 0, 2 * n * sizeof(T), stream));            \
        swiglu_bwd_##SFX((KT *)dgu, (const KT *)dout, (const KT *)gu, F, n, set, stream);          \
    }                                                                                              \
    extern "C" void nb_cuda_residual_forward_##SFX(T *out, const T *a, const T *b, size_t n,       \
                                                    nb_stream_t stream) {                          \
        NB_CUDA_SHAPE(out && a && b, "nb_cuda_residual_forward_" #SFX);                            \
        LAUNCH_1D(residual_kernel, n, "residual forward", (KT *)out, (const KT *)a, (const KT *)b, n); \
    }                                                                                              \
    extern "C" void nb_cuda_add_inplace_##SFX(T *dst, const T *src, size_t n, nb_stream_t stream) { \
        NB_CUDA_SHAPE(dst && src, "nb_cuda_add_inplace_" #SFX);                                    \
        LAUNCH_1D(add_inplace_kernel, n, "add in place", (KT *)dst, (const KT *)src, n);           \
    }
DEF_ACT_LAUNCHERS(f32, float, float)
DEF_ACT_LAUNCHERS(bf16, nb_bf16, nb_bf16_t)

extern "C" void nb_cuda_cast_f32_to_bf16(nb_bf16 *dst, const float *src, size_t n, nb_stream_t stream) {
    NB_CUDA_SHAPE(dst && src, "nb_cuda_cast_f32_to_bf16");
    LAUNCH_1D(cast_f32_bf16_kernel, n, "cast f32 -> bf16", (nb_bf16_t *)dst, src, n);
}

extern "C" void nb_cuda_cast_bf16_to_f32(float *dst, const nb_bf16 *src, size_t n, nb_stream_t stream) {
    NB_CUDA_SHAPE(dst && src, "nb_cuda_cast_bf16_to_f32");
    LAUNCH_1D(cast_bf16_f32_kernel, n, "cast bf16 -> f32", dst, (const nb_bf16_t *)src, n);
}
