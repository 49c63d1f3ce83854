/* Rotary position embedding on CUDA, rotate_half convention, in place; same angles as rope.c:
 *   inv_freq = 1.0f / powf(theta, (float)(2i) / (float)HS), scaled by the rope type the way
 *              nb_rope_inv_freq scales it (every float op _rn, never contracted into an FMA),
 *   angle = (float)t * inv_freq,
 *   cos, sin = (float)cos((double)angle), (float)sin((double)angle).
 * powf is evaluated in double and rounded once (correctly rounded, as glibc's powf nearly always
 * is), and the trig in double, so the float angle and its cos/sin match the CPU's bit for bit in
 * all but rare one-ulp cases; then the rotation is the same products, rounded the same way.
 *
 * The angle depends on (t, i) only, and the double pow/cos/sin cost far more than moving a pair,
 * so a thread evaluates them once for its (t, i) and then rotates that pair in every head of
 * several batch rows. Each pair is read and written by one thread only, and its value does not
 * depend on which thread or launch shape: results never depend on the launch. */
#include "ops_cuda_common.cuh"

#define THREADS 256
/* Pairs of one head a block covers (blockDim.x); longer heads are split into chunks. */
#define ROPE_MAX_PAIRS 256
/* Pairs a thread loads before it stores any: bf16 pairs are 4 bytes, and one pair in flight
 * per thread is far too little memory parallelism. */
#define ROPE_UNROLL 8
/* The batch rows are split over blockIdx.y until about this many threads fill the GPU ... */
#define ROPE_TARGET_THREADS (1024 * THREADS)
/* ... but each thread keeps this many pairs at least, so the trig stays a small share. */
#define ROPE_MIN_PAIRS 16

/* rope.c's llama3_inv_freq (transformers' _compute_llama3_parameters in float32), op for op. */
static __device__ float llama3_inv_freq(const nb_rope &r, float inv_freq) {
    const float low_wavelen = (float)__ddiv_rn((double)r.original_ctx, (double)r.low_freq_factor);
    const float high_wavelen = (float)__ddiv_rn((double)r.original_ctx, (double)r.high_freq_factor);
    const float two_pi = (float)6.283185307179586; /* Python's 2 * math.pi, as torch casts it */
    const float wavelen = __fmul_rn(__fdiv_rn(1.0f, inv_freq), two_pi);
    if (wavelen > low_wavelen) return __fdiv_rn(inv_freq, r.factor);
    if (wavelen < high_wavelen) return inv_freq;
    const float span = (float)__dsub_rn((double)r.high_freq_factor, (double)r.low_freq_factor);
    const float smooth =
        __fdiv_rn(__fsub_rn(__fmul_rn(__fdiv_rn(1.0f, wavelen), (float)r.original_ctx), r.low_freq_factor), span);
    return __fadd_rn(__fdiv_rn(__fmul_rn(__fsub_rn(1.0f, smooth), inv_freq), r.factor), __fmul_rn(smooth, inv_freq));
}

/* cos and sign * sin of the angle of position t, frequency i: the expressions of rope.c. */
static __device__ __forceinline__ void rope_cos_sin(int t, int i, int HS, const nb_rope &r, float sign, float *c,
                                                    float *s) {
    float ex = __fdiv_rn((float)(2 * i), (float)HS);
    float inv_freq = __fdiv_rn(1.0f, (float)pow((double)r.theta, (double)ex));
    if (r.type == NB_ROPE_LINEAR) inv_freq = __fdiv_rn(inv_freq, r.factor);
    if (r.type == NB_ROPE_LLAMA3) inv_freq = llama3_inv_freq(r, inv_freq);
    float angle = __fmul_rn((float)t, inv_freq);
    *c = (float)cos((double)angle), *s = sign * (float)sin((double)angle);
}

/* Block (cw, tp): threadIdx.x is the pair i within a chunk of cw pairs of a head (consecutive
 * threads on consecutive elements), threadIdx.y the position within a tile of tp positions.
 * blockIdx.x runs over (tile, chunk), grid-stride; blockIdx.y picks the batch rows
 * b = blockIdx.y + k * gridDim.y. A thread rotates pair i of position t in every head of those
 * rows, ROPE_UNROLL (b, head) items at a time; the items are distinct elements, so loading a
 * group before storing it gives what one item after the other would. */
template <typename T>
static __global__ void __launch_bounds__(THREADS)
    rope_kernel(T *x, int B, int T_, int nheads, int HS, int row_stride, nb_rope r, float sign, int nchunks,
                size_t ntc) {
    int h = HS / 2;
    for (size_t k = blockIdx.x; k < ntc; k += gridDim.x) {
        int i = (int)(k % nchunks) * (int)blockDim.x + (int)threadIdx.x;
        size_t tt = k / nchunks * blockDim.y + threadIdx.y;
        if (i >= h || tt >= (size_t)T_) continue;
        int t = (int)tt;
        float c, s;
        rope_cos_sin(t, i, HS, r, sign, &c, &s);
        int b = (int)blockIdx.y, hd = 0;
        while (b < B) {
            size_t off[ROPE_UNROLL];
            bool ok[ROPE_UNROLL];
#pragma unroll
            for (int u = 0; u < ROPE_UNROLL; u++) {
                ok[u] = b < B;
                off[u] = ((size_t)(ok[u] ? b : 0) * T_ + t) * row_stride + (size_t)hd * HS + i;
                if (++hd == nheads) hd = 0, b += (int)gridDim.y;
            }
            float x1[ROPE_UNROLL], x2[ROPE_UNROLL];
#pragma unroll
            for (int u = 0; u < ROPE_UNROLL; u++) {
                x1[u] = ok[u] ? nb_ld(x + off[u]) : 0.0f;
                x2[u] = ok[u] ? nb_ld(x + off[u] + h) : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < ROPE_UNROLL; u++) {
                if (!ok[u]) continue;
                nb_st(x + off[u], __fsub_rn(__fmul_rn(x1[u], c), __fmul_rn(x2[u], s)));
                nb_st(x + off[u] + h, __fadd_rn(__fmul_rn(x2[u], c), __fmul_rn(x1[u], s)));
            }
        }
    }
}

/* Launch shape (performance only). Chunks of cw <= ROPE_MAX_PAIRS pairs, as even as they come;
 * tiles of tp <= THREADS / cw positions (a block's trig is one evaluation per thread). */
template <typename T>
static void rope_launch(T *x, int B, int T_, int nheads, int HS, int row_stride, const nb_rope &r, float sign,
                        nb_stream_t stream) {
    int h = HS / 2;
    int nchunks = (h + ROPE_MAX_PAIRS - 1) / ROPE_MAX_PAIRS;
    int cw = (h + nchunks - 1) / nchunks, tp = THREADS / cw < T_ ? THREADS / cw : T_;
    size_t ntc = ((size_t)T_ + tp - 1) / tp * nchunks, per_row = ntc * cw * tp; /* threads a b-row */
    size_t gx = ntc < 0x7fffffffu ? ntc : 0x7fffffffu;
    size_t gy = (ROPE_TARGET_THREADS + per_row - 1) / per_row, most = (size_t)B * nheads / ROPE_MIN_PAIRS;
    if (gy > most) gy = most;
    if (gy > (size_t)B) gy = B;
    if (gy > 65535) gy = 65535;
    if (gy < 1) gy = 1;
    rope_kernel<<<dim3((unsigned)gx, (unsigned)gy), dim3(cw, tp), 0, stream>>>(x, B, T_, nheads, HS, row_stride,
                                                                              r, sign, nchunks, ntc);
}

template <typename T>
static void rope(T *x, int B, int T_, int nheads, int HS, int row_stride, const nb_rope *r, float sign,
                 nb_stream_t stream, const char *name) {
    NB_CUDA_SHAPE(x && B >= 0 && T_ >= 0 && nheads >= 0 && HS > 0 && HS % 2 == 0 && row_stride >= nheads * HS && r &&
                      r->theta > 0.0f && (unsigned)r->type <= NB_ROPE_LLAMA3,
                  name);
    if ((size_t)B * T_ * nheads == 0) return;
    rope_launch(x, B, T_, nheads, HS, row_stride, *r, sign, stream);
    CUDA_CHECK_LAUNCH(name);
}

extern "C" void nb_cuda_rope_forward_f32(float *x, int B, int T, int nheads, int HS, int row_stride, const nb_rope *r,
                                         nb_stream_t stream) {
    rope(x, B, T, nheads, HS, row_stride, r, 1.0f, stream, __func__);
}
extern "C" void nb_cuda_rope_forward_bf16(nb_bf16 *x, int B, int T, int nheads, int HS, int row_stride,
                                          const nb_rope *r, nb_stream_t stream) {
    rope(nb_kt(x), B, T, nheads, HS, row_stride, r, 1.0f, stream, __func__);
}
/* The backward of a rotation is the rotation by -angle. */
extern "C" void nb_cuda_rope_backward_f32(float *dx, int B, int T, int nheads, int HS, int row_stride, const nb_rope *r,
                                          nb_stream_t stream) {
    if (!dx) return;
    rope(dx, B, T, nheads, HS, row_stride, r, -1.0f, stream, __func__);
}
extern "C" void nb_cuda_rope_backward_bf16(nb_bf16 *dx, int B, int T, int nheads, int HS, int row_stride,
                                           const nb_rope *r, nb_stream_t stream) {
    if (!dx) return;
    rope(nb_kt(dx), B, T, nheads, HS, row_stride, r, -1.0f, stream, __func__);
}
