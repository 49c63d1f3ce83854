/* Column slices on CUDA (cols.c's): dst[r, c] = (or +=) src[r, c] for rows of different pitch,
 * how seqctr assembles x0 from its pieces and hands the gradient back. Each thread owns four
 * consecutive columns of a row (one vector access when rows and pointers allow it). */
#include "ctr_cuda.cuh"

/* dst[r, c] = (add ? dst[r, c] : 0) + src[r, c]; four columns per thread */
template <typename T>
static __global__ void cols_kernel(T *dst, int ldd, const T *src, int lds, int rows, int cols, int add, int vec) {
    size_t cg = ((size_t)cols + 3) / 4;
    NB_GRID_STRIDE(g, (size_t)rows * cg) {
        size_t r = g / cg;
        int c = (int)(g - r * cg) * 4;
        T *d = dst + r * ldd + c;
        const T *s = src + r * lds + c;
        if (vec && c + 4 <= cols) {
            float4 v = ld4(s);
            if (add) {
                float4 o = ld4(d);
                v = make_float4(o.x + v.x, o.y + v.y, o.z + v.z, o.w + v.w);
            }
            st4(d, v);
        } else {
            for (int k = 0; k < 4 && c + k < cols; k++) nb_st(d + k, add ? nb_ld(d + k) + nb_ld(s + k) : nb_ld(s + k));
        }
    }
}

template <typename T>
static void cols_launch(T *dst, int ld_dst, const T *src, int ld_src, int rows, int cols, int add, cudaStream_t stream,
                        const char *name) {
    NB_CUDA_SHAPE(rows >= 0 && cols >= 0 && ld_dst >= cols && ld_src >= cols &&
                      (rows == 0 || cols == 0 || (dst && src)),
                  name);
    if (rows == 0 || cols == 0) return;
    int vec = cols % 4 == 0 && ld_dst % 4 == 0 && ld_src % 4 == 0 && al4(dst, sizeof(T)) && al4(src, sizeof(T));
    size_t n = (size_t)rows * ((cols + 3) / 4);
    cols_kernel<<<nb_grid_1d(n, CTR_THREADS), CTR_THREADS, 0, stream>>>(dst, ld_dst, src, ld_src, rows, cols, add, vec);
    CUDA_CHECK_LAUNCH(add ? "add columns" : "copy columns");
}

extern "C" void nb_cuda_copy_cols_f32(float *dst, int ld_dst, const float *src, int ld_src, int rows, int cols,
                                      nb_stream_t stream) {
    cols_launch(dst, ld_dst, src, ld_src, rows, cols, 0, stream, __func__);
}
extern "C" void nb_cuda_copy_cols_bf16(nb_bf16 *dst, int ld_dst, const nb_bf16 *src, int ld_src, int rows, int cols,
                                       nb_stream_t stream) {
    cols_launch(nb_kt(dst), ld_dst, nb_kt(src), ld_src, rows, cols, 0, stream, __func__);
}
extern "C" void nb_cuda_add_cols_f32(float *dst, int ld_dst, const float *src, int ld_src, int rows, int cols,
                                     nb_stream_t stream) {
    cols_launch(dst, ld_dst, src, ld_src, rows, cols, 1, stream, __func__);
}
extern "C" void nb_cuda_add_cols_bf16(nb_bf16 *dst, int ld_dst, const nb_bf16 *src, int ld_src, int rows, int cols,
                                      nb_stream_t stream) {
    cols_launch(nb_kt(dst), ld_dst, nb_kt(src), ld_src, rows, cols, 1, stream, __func__);
}
