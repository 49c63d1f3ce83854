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
    /* silu(g) = g / (1 + exp(-g)), as torch writes it (g < -88: exp -> inf, silu -> -0). */       \
    static __global__ void swiglu_fwd_kernel(T *out, const T *gu, int F, size_t n) {               \
        GRID_STRIDE(i, n) {                                                                        \
            size_t row = i / F, col = i % F;                                                       \
            float g = nb_ld(gu + row * 2 * F + col), u = nb_ld(gu + row * 2 * F + F + col);        \
            nb_st(out + i, g / (1.0f + expf(-g)) * u);                                             \
        }                                                                                          \
    }                                                                                              \
    static __global__ void swiglu_bwd_kernel(T *dgu, const T *dout, const T *gu, int F, size_t n) { \
        GRID_STRIDE(i, n) {                                                                        \
            size_t row = i / F, col = i % F;                                                       \
            size_t ig = row * 2 * F + col, iu = ig + F;                                            \
            float g = nb_ld(gu + ig), u = nb_ld(gu + iu), dy = nb_ld(dout + i);                    \
            float e1 = 1.0f + expf(-g);                                                            \
            float s = 1.0f / e1, silu = g / e1;                                                    \
            nb_st(dgu + ig, nb_ld(dgu + ig) + dy * u * s * (1.0f + g * (1.0f - s)));               \
            nb_st(dgu + iu, nb_ld(dgu + iu) + dy * silu);                                          \
        }                                                                                          \
    }                                                                                              \
    /* the same, writing dgu (=) instead of adding to it */                                      \
    static __global__ void swiglu_bwd_set_kernel(T *dgu, const T *dout, const T *gu, int F, size_t n) { \
        GRID_STRIDE(i, n) {                                                                        \
            size_t row = i / F, col = i % F;                                                       \
            size_t ig = row * 2 * F + col, iu = ig + F;                                            \
            float g = nb_ld(gu + ig), u = nb_ld(gu + iu), dy = nb_ld(dout + i);                    \
            float e1 = 1.0f + expf(-g);                                                            \
            float s = 1.0f / e1, silu = g / e1;                                                    \
            nb_st(dgu + ig, dy * u * s * (1.0f + g * (1.0f - s)));                                 \
            nb_st(dgu + iu, dy * silu);                                                            \
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
        size_t n = (size_t)N * F;                                                                  \
        LAUNCH_1D(swiglu_fwd_kernel, n, "swiglu forward", (KT *)out, (const KT *)gu, F, n);        \
    }                                                                                              \
    extern "C" void nb_cuda_swiglu_backward_##SFX(T *dgu, const T *dout, const T *gu, int N, int F, \
                                                   nb_stream_t stream) {                           \
        if (!dgu) return;                                                                          \
        NB_CUDA_SHAPE(dout && gu && N >= 0 && F >= 0, "nb_cuda_swiglu_backward_" #SFX);            \
        size_t n = (size_t)N * F;                                                                  \
        LAUNCH_1D(swiglu_bwd_kernel, n, "swiglu backward", (KT *)dgu, (const KT *)dout, (const KT *)gu, F, n); \
    }                                                                                              \
    extern "C" void nb_cuda_swiglu_backward_set_##SFX(T *dgu, const T *dout, const T *gu, int N, int F, \
                                                       nb_stream_t stream) {                       \
        if (!dgu) return;                                                                          \
        NB_CUDA_SHAPE(dout && gu && N >= 0 && F >= 0, "nb_cuda_swiglu_backward_set_" #SFX);        \
        size_t n = (size_t)N * F;                                                                  \
        if (!nb_env_flag("NB_GRAD_SET", 1)) {                                                      \
            if (n) CUDA_CHECK(cudaMemsetAsync(dgu, 0, 2 * n * sizeof(T), stream));                 \
            LAUNCH_1D(swiglu_bwd_kernel, n, "swiglu backward", (KT *)dgu, (const KT *)dout, (const KT *)gu, F, n); \
            return;                                                                                \
        }                                                                                          \
        LAUNCH_1D(swiglu_bwd_set_kernel, n, "swiglu backward (set)", (KT *)dgu, (const KT *)dout, (const KT *)gu, F, n); \
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
