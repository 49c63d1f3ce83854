/* Rotary position embedding on CUDA, rotate_half convention, in place; same angles as rope.c:
 *   inv_freq = 1.0f / powf(theta, (float)(2i) / (float)HS),  angle = (float)t * inv_freq,
 *   cos, sin = (float)cos((double)angle), (float)sin((double)angle).
 * powf is evaluated in double and rounded once (correctly rounded, as glibc's powf nearly always
 * is), and the trig in double, so the float angle and its cos/sin match the CPU's bit for bit in
 * all but rare one-ulp cases; then the rotation is the same products, rounded the same way.
 * One thread per (row, head, pair i < HS/2); each pair is read and written by that thread only. */
#include "ops_cuda_common.cuh"

#define THREADS 256

#define DEF_ROPE_KERNEL(T)                                                                         \
    static __global__ void rope_kernel(T *x, int T_, int nheads, int HS, int row_stride, float theta, \
                                       float sign, size_t n) {                                     \
        int h = HS / 2;                                                                            \
        for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n;                  \
             idx += (size_t)gridDim.x * blockDim.x) {                                              \
            int i = (int)(idx % h);                                                                \
            size_t rest = idx / h;                                                                 \
            int hd = (int)(rest % nheads);                                                         \
            size_t bt = rest / nheads;                                                             \
            int t = (int)(bt % T_);                                                                \
            float ex = __fdiv_rn((float)(2 * i), (float)HS);                                       \
            float inv_freq = __fdiv_rn(1.0f, (float)pow((double)theta, (double)ex));               \
            float angle = __fmul_rn((float)t, inv_freq);                                           \
            float c = (float)cos((double)angle), s = sign * (float)sin((double)angle);             \
            T *x1 = x + bt * row_stride + (size_t)hd * HS + i, *x2 = x1 + h;                       \
            float a = nb_ld(x1), b = nb_ld(x2);                                                    \
            nb_st(x1, __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)));                                \
            nb_st(x2, __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s)));                                \
        }                                                                                          \
    }
NB_FOR_EACH_DTYPE(DEF_ROPE_KERNEL)

#define DEF_ROPE_LAUNCHERS(SFX, T, KT)                                                             \
    static void rope_##SFX(T *x, int B, int T_, int nheads, int HS, int row_stride, float theta, float sign, \
                           nb_stream_t stream, const char *name) {                                 \
        NB_CUDA_SHAPE(x && B >= 0 && T_ >= 0 && nheads >= 0 && HS > 0 && HS % 2 == 0 &&            \
                          row_stride >= nheads * HS && theta > 0.0f,                               \
                      name);                                                                       \
        size_t n = (size_t)B * T_ * nheads * (HS / 2);                                             \
        if (n == 0) return;                                                                        \
        rope_kernel<<<nb_grid_1d(n, THREADS), THREADS, 0, stream>>>((KT *)x, T_, nheads, HS, row_stride, \
                                                                    theta, sign, n);               \
        CUDA_CHECK_LAUNCH(name);                                                                   \
    }                                                                                              \
    extern "C" void nb_cuda_rope_forward_##SFX(T *x, int B, int T_, int nheads, int HS, int row_stride, \
                                                float theta, nb_stream_t stream) {                 \
        rope_##SFX(x, B, T_, nheads, HS, row_stride, theta, 1.0f, stream, "nb_cuda_rope_forward_" #SFX); \
    }                                                                                              \
    /* The backward of a rotation is the rotation by -angle. */                                    \
    extern "C" void nb_cuda_rope_backward_##SFX(T *dx, int B, int T_, int nheads, int HS, int row_stride, \
                                                 float theta, nb_stream_t stream) {                \
        if (!dx) return;                                                                           \
        rope_##SFX(dx, B, T_, nheads, HS, row_stride, theta, -1.0f, stream, "nb_cuda_rope_backward_" #SFX); \
    }
DEF_ROPE_LAUNCHERS(f32, float, float)
DEF_ROPE_LAUNCHERS(bf16, nb_bf16, nb_bf16_t)
