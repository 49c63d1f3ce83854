/* ReLU on CUDA (relu.c's): each thread owns four consecutive elements, one vector access when
 * the pointers allow it (else four scalar ones, and for the tail), so out may alias an input. */
#include "ctr_cuda.cuh"

static __device__ __forceinline__ float relu_f(float x) { return x > 0.0f ? x : 0.0f; }
static __device__ __forceinline__ float relu_bwd_f(float d, float x, float g) { return x > 0.0f ? d + g : d; }

template <typename T> static __global__ void relu_fwd_kernel(T *out, const T *inp, size_t n, int vec) {
    NB_GRID_STRIDE(g, (n + 3) / 4) {
        size_t i = 4 * g;
        if (vec && i + 4 <= n) {
            float4 a = ld4(inp + i);
            st4(out + i, make_float4(relu_f(a.x), relu_f(a.y), relu_f(a.z), relu_f(a.w)));
        } else {
            for (size_t k = i; k < n && k < i + 4; k++) nb_st(out + k, relu_f(nb_ld(inp + k)));
        }
    }
}

/* out[i] = relu_bwd_f(d[i], x[i], g[i]): dinp (d, aliased by out) += dout (g) where inp (x) > 0 */
template <typename T>
static __global__ void relu_bwd_kernel(T *out, const T *a, const T *b, const T *c, size_t n, int vec) {
    NB_GRID_STRIDE(g, (n + 3) / 4) {
        size_t i = 4 * g;
        if (vec && i + 4 <= n) {
            float4 x = ld4(a + i), y = ld4(b + i), z = ld4(c + i);
            st4(out + i, make_float4(relu_bwd_f(x.x, y.x, z.x), relu_bwd_f(x.y, y.y, z.y), relu_bwd_f(x.z, y.z, z.z),
                                     relu_bwd_f(x.w, y.w, z.w)));
        } else {
            for (size_t k = i; k < n && k < i + 4; k++)
                nb_st(out + k, relu_bwd_f(nb_ld(a + k), nb_ld(b + k), nb_ld(c + k)));
        }
    }
}

template <typename T> static void relu_forward(T *out, const T *inp, size_t n, cudaStream_t stream, const char *name) {
    NB_CUDA_SHAPE(n == 0 || (out && inp), name);
    if (n == 0) return;
    int vec = al4(out, sizeof(T)) && al4(inp, sizeof(T));
    relu_fwd_kernel<<<ctr_elem_grid(n), CTR_THREADS, 0, stream>>>(out, inp, n, vec);
    CUDA_CHECK_LAUNCH("relu forward");
}

template <typename T>
static void relu_backward(T *dinp, const T *inp, const T *dout, size_t n, cudaStream_t stream, const char *name) {
    if (!dinp || n == 0) return;
    NB_CUDA_SHAPE(inp && dout, name);
    int vec = al4(dinp, sizeof(T)) && al4(inp, sizeof(T)) && al4(dout, sizeof(T));
    relu_bwd_kernel<<<ctr_elem_grid(n), CTR_THREADS, 0, stream>>>(dinp, (const T *)dinp, inp, dout, n, vec);
    CUDA_CHECK_LAUNCH("relu backward");
}

extern "C" void nb_cuda_relu_forward_f32(float *out, const float *inp, size_t n, nb_stream_t stream) {
    relu_forward(out, inp, n, stream, __func__);
}
extern "C" void nb_cuda_relu_forward_bf16(nb_bf16 *out, const nb_bf16 *inp, size_t n, nb_stream_t stream) {
    relu_forward(nb_kt(out), nb_kt(inp), n, stream, __func__);
}
extern "C" void nb_cuda_relu_backward_f32(float *dinp, const float *inp, const float *dout, size_t n,
                                          nb_stream_t stream) {
    relu_backward(dinp, inp, dout, n, stream, __func__);
}
extern "C" void nb_cuda_relu_backward_bf16(nb_bf16 *dinp, const nb_bf16 *inp, const nb_bf16 *dout, size_t n,
                                           nb_stream_t stream) {
    relu_backward(nb_kt(dinp), nb_kt(inp), nb_kt(dout), n, stream, __func__);
}
