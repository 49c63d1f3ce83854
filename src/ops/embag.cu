/* Embedding lookups on CUDA (embag.c's, the gather and unique-row gradient entries of
 * backend_ctr.h): rows of the fp32 tables gathered into the activations, and the gradient of the
 * unique rows in backend_ctr.h's chunked order, so that a row looked up 100k times is not one
 * warp's serial chain and fp32 gives the CPU table's bits.
 *
 * Gather: G consecutive lanes per lookup (G a power of two <= 32 sized to the row, so a warp copies
 * two E = 64 rows at once); 16-byte loads when the row and its destination are aligned.
 *
 * Unique-row gradient, two passes:
 * Pass 1 (egu_tiles): the lookup positions k (0 .. n-1, n = seg[U] read on the device) in tiles of
 * EGU_TILE; a warp takes a tile and sums every chunk that starts in it (a chunk: up to
 * NB_EMB_GRAD_CHUNK consecutive lookups of one row, from the row's first lookup on), streaming
 * the positions 32 at a time: the 32 rows' columns come in with coalesced loads into the warp's
 * shared memory, then each lane adds its columns in k order. A row's first chunk sum goes to
 * dunique[u]; chunk j >= 1 (starting at k) to part[k / CHUNK], a slot no other chunk uses (the
 * row contains position (k / CHUNK) * CHUNK, and only one row does).
 * Pass 2 (egu_finish): a block per 32 rows; each row with more than one chunk adds its chunk sums
 * to dunique[u] in chunk order (its columns split over the block's warps). The scratch has a slot
 * per chunk of the caller's lookup count n (up to 256 MB); slots past it are summed by pass 2
 * itself, one lookup at a time, in the same order: same bits, far slower (a hot row's chunks then
 * run serially on one block: at B 55,296 with a 16 MB scratch that was 87 ms of a 107 ms step).
 * The result depends only on the lookups (not on the grid), and equals the CPU table's.
 *
 * The gradient's kernels are plain C between ctr_warp.cuh's primitives and the launchers, so
 * tests/ops/emu_tc.c can include this file with CTR_TC_EMU defined (which leaves out the
 * gather and the launchers) and run them on its warp emulator. */
#include "ctr_warp.cuh"
#ifndef CTR_TC_EMU
#include "ctr_cuda.cuh"

/* The chunks of emb_grad_unique's order are whole batches of 32 lookups (a pass-1 step). */
static_assert(NB_EMB_GRAD_CHUNK % 32 == 0, "NB_EMB_GRAD_CHUNK must be a multiple of 32");

/* ---- gather ---- */

template <typename T>
static __global__ void emb_gather_kernel(T *out, const int64_t *dst, const float *table, const int64_t *rows, int n,
                                         int E, int G, int vec) {
    size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t i = t / G;
    int gl = (int)(t % G);
    if (i >= (size_t)n) return;
    const float *tr = table + (size_t)rows[i] * E;
    int64_t o = dst[i];
    if (vec && (o & 3) == 0)
        for (int e = 4 * gl; e < E; e += 4 * G) st4(out + o + e, ld4(tr + e));
    else
        for (int e = gl; e < E; e += G) nb_st(out + o + e, tr[e]);
}

template <typename T>
static void emb_gather(T *out, const int64_t *dst, const float *table, const int64_t *rows, int n, int E,
                       cudaStream_t stream, const char *name) {
    NB_CUDA_SHAPE(n >= 0 && E >= 0 && (n == 0 || (out && dst && table && rows)), name);
    if (n == 0 || E == 0) return;
    int vec = E % 4 == 0 && al4(out, sizeof(T)) && al4(table, sizeof(float));
    int G = 1;
    while (G < 32 && 4 * G < E) G *= 2;
    unsigned blocks = (unsigned)(((size_t)n * G + CTR_THREADS - 1) / CTR_THREADS);
    emb_gather_kernel<<<blocks, CTR_THREADS, 0, stream>>>(out, dst, table, rows, n, E, G, vec);
    CUDA_CHECK_LAUNCH("embedding gather");
}

extern "C" void nb_cuda_emb_gather_f32(float *out, const int64_t *dst, const float *table, const int64_t *rows, int n,
                                       int E, nb_stream_t stream) {
    emb_gather(out, dst, table, rows, n, E, stream, __func__);
}
extern "C" void nb_cuda_emb_gather_bf16(nb_bf16 *out, const int64_t *dst, const float *table, const int64_t *rows,
                                        int n, int E, nb_stream_t stream) {
    emb_gather(nb_kt(out), dst, table, rows, n, E, stream, __func__);
}
#endif /* CTR_TC_EMU */

/* ---- the unique-row gradient ---- */

#define EGU_CHUNK NB_EMB_GRAD_CHUNK
#define EGU_TILE 64     /* lookup positions per pass-1 work item */
#define EGU_COLS1 128   /* pass 1's columns per walk over the positions (4 per lane) */
#define EGU_BATCH 8     /* pass 1's positions per batch of loads (EGU_BATCH x 4 floats a lane) */
#define EGU_FOLD 32     /* pass 2's chunk sums per batch of loads (one float each a lane) */
#define EGU_QUEUE 4     /* pass 1's finished rows whose table updates are issued together */
#define EGU_TILE_MIN_BLOCKS 4 /* pass 1's blocks per SM: at most 128 registers a thread */
#define EGU_SMEM_BYTES (TC_WARPS * (EGU_BATCH + EGU_QUEUE) * 32 * 16)

/* column e of the src row at element offset o (fp32 or bf16 src) */
static __device__ __forceinline__ float egu_ld(const void *src, long long o, const int BF) {
    return BF ? tc_bf(((const nb_bf16 *)src)[o]) : ((const float *)src)[o];
}

/* The row u with seg[u] <= k < seg[u + 1] (seg strictly increasing, seg[0] = 0 <= k < seg[U]):
 * the warp probes 32 evenly spaced rows per round. */
static __device__ __forceinline__ int egu_find(const int32_t *seg, int U, int k, int lane) {
    int lo = 0, hi = U; /* seg[lo] <= k; the row is in [lo, hi) */
    while (hi - lo > 32) {
        const int step = (hi - lo + 31) / 32, pos = lo + lane * step;
        const unsigned m = tc_ballot(pos < hi && seg[pos] <= k); /* lane 0 always */
        lo += (31 - tc_clz(m)) * step;
        hi = min(hi, lo + step);
    }
    const unsigned m = tc_ballot(lo + lane < hi && seg[lo + lane] <= k);
    return lo + 31 - tc_clz(m);
}

/* Sum of lookups c .. c1-1 (one chunk) of column col, one lookup at a time: pass 2's path for
 * chunks without a slot (the same additions as pass 1's). */
static __device__ __forceinline__ float egu_chunk_direct(const void *src, const int64_t *src_off, const int32_t *order,
                                                         int c, int c1, int col, const int BF) {
    float acc = 0.0f;
    for (int k = c; k < c1; k++) acc += egu_ld(src, src_off[order[k]] + col, BF);
    return acc;
}

/* Columns col .. col + 3 of the src row at element offset o; vec: the four are one aligned 8-byte
 * (bf16) or 16-byte (fp32) load wherever they are all in the row. */
static __device__ __forceinline__ tc_f4 egu_ld4(const void *src, long long o, int col, int E, int vec, const int BF) {
    tc_f4 v;
    if (vec && col + 3 < E) {
        if (BF) {
            const tc_u2 u = tc_ld8((const nb_bf16 *)src + o + col);
            v.x = tc_lo(u.x), v.y = tc_hi(u.x), v.z = tc_lo(u.y), v.w = tc_hi(u.y);
        } else {
            v = tc_ld16f((const float *)src + o + col);
        }
    } else {
        v.x = col < E ? egu_ld(src, o + col, BF) : 0.0f;
        v.y = col + 1 < E ? egu_ld(src, o + col + 1, BF) : 0.0f;
        v.z = col + 2 < E ? egu_ld(src, o + col + 2, BF) : 0.0f;
        v.w = col + 3 < E ? egu_ld(src, o + col + 3, BF) : 0.0f;
    }
    return v;
}

/* dst[col .. col + 3] = a, the columns inside the row (vec: one 16-byte store) */
static __device__ __forceinline__ void egu_st4(float *dst, int col, int E, int vec, tc_f4 a) {
    if (vec && col + 3 < E) {
        tc_st16f(dst + col, a);
    } else {
        if (col < E) dst[col] = a.x;
        if (col + 1 < E) dst[col + 1] = a.y;
        if (col + 2 < E) dst[col + 2] = a.z;
        if (col + 3 < E) dst[col + 3] = a.w;
    }
}

/* Where a row's gradient is applied at once (emb_grad_adagrad): element-wise Adagrad on the
 * table's rows (table == NULL: the gradient is stored in dunique, emb_grad_unique). */
typedef struct {
    float *table, *acc;
    const int64_t *rows;
    float lr, eps;
} egu_upd;

/* One element of element-wise Adagrad: sparse_optim.cu's exact_adagrad_kernel's operations, each
 * explicitly rounded, so the fused update gives that kernel's (and the CPU's) bits. */
static __device__ __forceinline__ void egu_adagrad1(float *w, float *s, float g, float lr, float eps) {
    const float a = __fadd_rn(*s, __fmul_rn(g, g));
    *s = a;
    *w = __fsub_rn(*w, __fdiv_rn(__fmul_rn(lr, g), __fadd_rn(__fsqrt_rn(a), eps)));
}

/* Four adjacent elements of it, held in registers */
static __device__ __forceinline__ void egu_adagrad4(tc_f4 *w, tc_f4 *s, tc_f4 g, float lr, float eps) {
    egu_adagrad1(&w->x, &s->x, g.x, lr, eps);
    egu_adagrad1(&w->y, &s->y, g.y, lr, eps);
    egu_adagrad1(&w->z, &s->z, g.z, lr, eps);
    egu_adagrad1(&w->w, &s->w, g.w, lr, eps);
}

/* The queued rows' updates (qn of them, warp-uniform): the table and sum loads of all of them are
 * issued before the first is used, so the warp waits on memory once per EGU_QUEUE rows, not once
 * per row (a table of GBs misses the TLB on nearly every row). Lane q's qrow is queued row q;
 * queue[q * 32 + lane] its gradient in the lane's columns. */
static __device__ __forceinline__ void egu_flush(const egu_upd *up, const tc_f4 *queue, long long qrow, int qn,
                                                 int col, int lane, int E, int vec) {
    tc_f4 w[EGU_QUEUE], a[EGU_QUEUE];
    long long r[EGU_QUEUE];
    TC_UNROLL
    for (int q = 0; q < EGU_QUEUE; q++) {
        r[q] = tc_shfl_ll(qrow, q);
        if (vec && q < qn && col + 3 < E) {
            w[q] = tc_ld16f(up->table + (size_t)r[q] * E + col);
            a[q] = tc_ld16f(up->acc + (size_t)r[q] * E + col);
        }
    }
    TC_UNROLL
    for (int q = 0; q < EGU_QUEUE; q++) {
        if (q >= qn) break;
        const tc_f4 g = queue[q * 32 + lane];
        const size_t o = (size_t)r[q] * E + col;
        if (vec && col + 3 < E) {
            egu_adagrad4(&w[q], &a[q], g, up->lr, up->eps);
            tc_st16f(up->table + o, w[q]);
            tc_st16f(up->acc + o, a[q]);
        } else { /* element by element, the columns inside the row */
            const float gs[4] = {g.x, g.y, g.z, g.w};
            for (int i = 0; i < 4 && col + i < E; i++)
                egu_adagrad1(up->table + o + i, up->acc + o + i, gs[i], up->lr, up->eps);
        }
    }
}

/* Pass 1: a warp per tile of EGU_TILE positions (grid-stride); each chunk starting in the tile.
 * Each lane owns four adjacent columns (EGU_COLS1 = 128 a pass: E = 128 is one walk over the
 * positions) and adds them in k order, so each column's sum is the same chain of additions as
 * one column a lane would make: the CPU table's bits. */
static __device__ __forceinline__ void egu_tiles(float *dunique, float *part, int cap, const void *src,
                                                 const int64_t *src_off, const int32_t *order, const int32_t *seg,
                                                 int U, int E, const int BF, egu_upd up) {
    TC_SMEM(sm);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    tc_f4 *rows = (tc_f4 *)sm + (size_t)warp * EGU_BATCH * 32; /* [EGU_BATCH positions][32 lanes] */
    tc_f4 *queue = (tc_f4 *)sm + (size_t)TC_WARPS * EGU_BATCH * 32 + (size_t)warp * EGU_QUEUE * 32; /* rows to update */
    const int n = seg[U], ntiles = (n + EGU_TILE - 1) / EGU_TILE;
    const int nw = (int)(gridDim.x * (blockDim.x >> 5));
    /* loads of four columns need the base aligned to their width (and each row's offset to 4
     * elements, checked per position); stores need E % 4 == 0 (rows of dunique and part) */
    const int src_al = ((uintptr_t)src & (BF ? 7 : 15)) == 0;
    const int dst_vec = E % 4 == 0 && ((uintptr_t)dunique & 15) == 0 && ((uintptr_t)part & 15) == 0;
    const int upd_vec = E % 4 == 0 && ((uintptr_t)up.table & 15) == 0 && ((uintptr_t)up.acc & 15) == 0;
    for (int t = (int)(blockIdx.x * (blockDim.x >> 5)) + warp; t < ntiles; t += nw) {
        const int kb = t * EGU_TILE, ke = min(n, kb + EGU_TILE);
        int u = egu_find(seg, U, kb, lane), s = seg[u], e = seg[u + 1];
        int j = (kb - s + EGU_CHUNK - 1) / EGU_CHUNK, c = s + j * EGU_CHUNK; /* first chunk start >= kb */
        if (c >= e) {
            if (++u >= U) continue;
            s = e, e = seg[u + 1], j = 0, c = s;
        }
        if (c >= ke) continue;
        /* no chunk starting in the tile reaches past lim */
        const int lim = min(n, ke + EGU_CHUNK - 1);
        for (int e0 = 0; e0 < E; e0 += EGU_COLS1) {
            const int col = e0 + 4 * lane;
            /* the walk: chunk j of row u is [c, c1); sb/segc: seg[sb + lane], a window of ends;
             * rowc: the same rows' table rows (rows[sb - 1 + lane]) where they are updated */
            int cu = u, ce = e, cj = j, cc = c, c1 = min(e, c + EGU_CHUNK), done = 0;
            int sb = cu + 1, segc = sb + lane <= U ? seg[sb + lane] : 0;
            long long rowc = up.table && sb - 1 + lane < U ? (long long)up.rows[sb - 1 + lane] : 0;
            long long qrow = 0; /* lane q: the table row of queued update q (qn queued) */
            int qn = 0;
            tc_f4 acc = {0.0f, 0.0f, 0.0f, 0.0f};
            for (int gb = c; !done; gb += 32) {
                const long long mine = gb + lane < lim ? (long long)src_off[order[gb + lane]] : 0;
                for (int h = 0; h < 32 && !done; h += EGU_BATCH) {
                    /* EGU_BATCH positions' columns into the warp's shared rows: every load is
                     * issued before the first store (a store could alias a later load for all
                     * the compiler knows, so interleaving them would leave one load in flight) */
                    const int hb = gb + h, hend = min(hb + EGU_BATCH, lim);
                    tc_f4 v[EGU_BATCH];
                    TC_UNROLL
                    for (int q = 0; q < EGU_BATCH; q++) {
                        const long long o = tc_shfl_ll(mine, h + q);
                        const tc_f4 zero = {0.0f, 0.0f, 0.0f, 0.0f};
                        v[q] = hb + q < lim ? egu_ld4(src, o, col, E, src_al && (o & 3) == 0, BF) : zero;
                    }
                    TC_UNROLL
                    for (int q = 0; q < EGU_BATCH; q++) rows[q * 32 + lane] = v[q];
                    tc_syncwarp();
                    /* each lane adds its own columns in k order; chunk ends are warp-uniform */
                    for (int k = hb; k < hend && !done; k++) {
                        const tc_f4 r = rows[(k - hb) * 32 + lane];
                        acc.x += r.x, acc.y += r.y, acc.z += r.z, acc.w += r.w;
                        if (k + 1 == c1) {
                            float *dst = cj == 0 ? dunique + (size_t)cu * E
                                                 : (cc / EGU_CHUNK < cap ? part + (size_t)(cc / EGU_CHUNK) * E : NULL);
                            if (up.table && cj == 0 && c1 == ce) { /* the row's only chunk: its whole gradient */
                                const long long row = tc_shfl_ll(rowc, cu + 1 - sb);
                                queue[qn * 32 + lane] = acc;
                                qrow = lane == qn ? row : qrow;
                                if (++qn == EGU_QUEUE) egu_flush(&up, queue, qrow, qn, col, lane, E, upd_vec), qn = 0;
                            } else if (dst)
                                egu_st4(dst, col, E, dst_vec, acc);
                            acc.x = acc.y = acc.z = acc.w = 0.0f;
                            if (c1 == ce) { /* next row */
                                if (++cu >= U) {
                                    done = 1;
                                    break;
                                }
                                if (cu + 1 - sb >= 32) {
                                    sb = cu + 1, segc = sb + lane <= U ? seg[sb + lane] : 0;
                                    if (up.table) rowc = sb - 1 + lane < U ? (long long)up.rows[sb - 1 + lane] : 0;
                                }
                                cc = ce, ce = tc_shfl_i(segc, cu + 1 - sb), cj = 0;
                            } else {
                                cj++, cc = c1;
                            }
                            if (cc >= ke) done = 1;
                            c1 = min(ce, cc + EGU_CHUNK);
                        }
                    }
                    tc_syncwarp(); /* the rows are read before the next positions overwrite them */
                }
            }
            if (qn) egu_flush(&up, queue, qrow, qn, col, lane, E, upd_vec);
        }
    }
}

/* Pass 2: a block per 32 rows; a row of more than one chunk adds its chunk sums in chunk order,
 * column by column: warp w takes columns w * 32 .. w * 32 + 31 (of each 32 * TC_WARPS), and a lane
 * loads the next EGU_FOLD chunk sums of its column before it adds them in turn, so a hot row's
 * chain of additions waits on one batch of loads per EGU_FOLD chunks, on all of a block's warps. */
static __device__ __forceinline__ void egu_finish(float *dunique, const float *part, int cap, const void *src,
                                                  const int64_t *src_off, const int32_t *order, const int32_t *seg,
                                                  int U, int E, const int BF, egu_upd up) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int u0 = (int)blockIdx.x * 32;
    if (u0 >= U) return;
    const int mine = u0 + lane < U ? seg[u0 + lane] : 0, cnt = u0 + lane < U ? seg[u0 + lane + 1] - mine : 0;
    unsigned long_rows = tc_ballot(cnt > EGU_CHUNK);
    while (long_rows) {
        const int l = 31 - tc_clz(long_rows);
        long_rows &= ~(1u << l);
        const int u = u0 + l, s = tc_shfl_i(mine, l), e = s + tc_shfl_i(cnt, l);
        const int nch = (e - s + EGU_CHUNK - 1) / EGU_CHUNK;
        float *d = dunique + (size_t)u * E;
        for (int col = warp * 32 + lane; col - lane < E; col += 32 * TC_WARPS) {
            const int in = col < E;
            float a = in ? d[col] : 0.0f;
            for (int j0 = 1; j0 < nch; j0 += EGU_FOLD) {
                float v[EGU_FOLD];
                TC_UNROLL
                for (int q = 0; q < EGU_FOLD; q++) {
                    const int jj = j0 + q, c = s + jj * EGU_CHUNK, w = c / EGU_CHUNK;
                    v[q] = jj < nch && in && w < cap ? part[(size_t)w * E + col] : 0.0f;
                }
                TC_UNROLL
                for (int q = 0; q < EGU_FOLD; q++) {
                    const int jj = j0 + q, c = s + jj * EGU_CHUNK, w = c / EGU_CHUNK;
                    if (jj >= nch) break;
                    if (w >= cap && in) v[q] = egu_chunk_direct(src, src_off, order, c, min(e, c + EGU_CHUNK), col, BF);
                    a += v[q];
                }
            }
            if (!in) continue;
            if (up.table) { /* the row's gradient is whole: applied, not stored */
                const size_t o = (size_t)up.rows[u] * E + col;
                egu_adagrad1(up.table + o, up.acc + o, a, up.lr, up.eps);
            } else {
                d[col] = a;
            }
        }
    }
}

static __global__ void __launch_bounds__(32 * TC_WARPS, EGU_TILE_MIN_BLOCKS)
    egu_tiles_f32(float *dunique, float *part, int cap, const void *src, const int64_t *src_off, const int32_t *order,
                  const int32_t *seg, const int32_t *count, int U, int E, egu_upd up) {
    egu_tiles(dunique, part, cap, src, src_off, order, seg, count ? *count : U, E, 0, up);
}
static __global__ void __launch_bounds__(32 * TC_WARPS, EGU_TILE_MIN_BLOCKS)
    egu_tiles_bf16(float *dunique, float *part, int cap, const void *src, const int64_t *src_off,
                   const int32_t *order, const int32_t *seg, const int32_t *count, int U, int E, egu_upd up) {
    egu_tiles(dunique, part, cap, src, src_off, order, seg, count ? *count : U, E, 1, up);
}
static __global__ void __launch_bounds__(32 * TC_WARPS)
    egu_finish_f32(float *dunique, const float *part, int cap, const void *src, const int64_t *src_off,
                   const int32_t *order, const int32_t *seg, const int32_t *count, int U, int E, egu_upd up) {
    egu_finish(dunique, part, cap, src, src_off, order, seg, count ? *count : U, E, 0, up);
}
static __global__ void __launch_bounds__(32 * TC_WARPS)
    egu_finish_bf16(float *dunique, const float *part, int cap, const void *src, const int64_t *src_off,
                    const int32_t *order, const int32_t *seg, const int32_t *count, int U, int E, egu_upd up) {
    egu_finish(dunique, part, cap, src, src_off, order, seg, count ? *count : U, E, 1, up);
}

/* ---- launch shapes (shared with the emulator) ---- */

/* Slots of pass 1's chunk-sum scratch: one per NB_EMB_GRAD_CHUNK of the n lookup positions (slot
 * k / NB_EMB_GRAD_CHUNK for a chunk starting at k), at most 256 MB. */
static int egu_cap(int n, int E) {
    long long want = (long long)n / EGU_CHUNK + 1, most = (256LL << 20) / (4LL * (E > 0 ? E : 1));
    long long c = want < most ? want : most;
    return (int)(c > 1 ? c : 1);
}
#define EGU_TILE_BLOCKS 1024 /* pass 1's grid (grid-stride over the tiles; the result does not depend on it) */
static unsigned egu_finish_blocks(int U) { return (unsigned)((U + 31) / 32); }

/* ---- launcher ---- */
#ifndef CTR_TC_EMU

/* dunique = the unique rows' gradient of src (fp32, or bf16 when src_bf16), backend_ctr.h's order;
 * with up.table, each row's gradient is applied to the table by element-wise Adagrad as soon as it
 * is whole (dunique then holds only the first chunk sums of rows of several chunks). */
static void emb_grad_unique(float *dunique, const void *src, int src_bf16, const int64_t *src_off, const int32_t *order,
                            const int32_t *seg, const int32_t *count, int U, int n, int E, egu_upd up,
                            cudaStream_t stream, const char *name) {
    NB_CUDA_SHAPE(U >= 0 && n >= 0 && E >= 0 && (U == 0 || (dunique && src && src_off && order && seg)), name);
    NB_CUDA_SHAPE(!up.table || (up.acc && up.rows), name);
    if (U == 0 || E == 0) return;
    const int cap = egu_cap(n, E);
    float *part = (float *)nb_cuda_scratch((size_t)cap * E * sizeof(float), stream);
    if (src_bf16)
        egu_tiles_bf16<<<EGU_TILE_BLOCKS, 32 * TC_WARPS, EGU_SMEM_BYTES, stream>>>(dunique, part, cap, src, src_off,
                                                                                   order, seg, count, U, E, up);
    else
        egu_tiles_f32<<<EGU_TILE_BLOCKS, 32 * TC_WARPS, EGU_SMEM_BYTES, stream>>>(dunique, part, cap, src, src_off,
                                                                                  order, seg, count, U, E, up);
    CUDA_CHECK_LAUNCH("embedding unique-row gradient (chunk sums)");
    if (src_bf16)
        egu_finish_bf16<<<egu_finish_blocks(U), 32 * TC_WARPS, 0, stream>>>(dunique, part, cap, src, src_off, order,
                                                                            seg, count, U, E, up);
    else
        egu_finish_f32<<<egu_finish_blocks(U), 32 * TC_WARPS, 0, stream>>>(dunique, part, cap, src, src_off, order,
                                                                           seg, count, U, E, up);
    CUDA_CHECK_LAUNCH("embedding unique-row gradient (rows of several chunks)");
    nb_cuda_scratch_free(part, stream);
}

extern "C" void nb_cuda_emb_grad_unique_f32(float *dunique, const float *src, const int64_t *src_off,
                                            const int32_t *order, const int32_t *seg, const int32_t *count, int U,
                                            int n, int E, nb_stream_t stream) {
    emb_grad_unique(dunique, src, 0, src_off, order, seg, count, U, n, E, egu_upd{}, stream, __func__);
}
extern "C" void nb_cuda_emb_grad_unique_bf16(float *dunique, const nb_bf16 *src, const int64_t *src_off,
                                             const int32_t *order, const int32_t *seg, const int32_t *count, int U,
                                             int n, int E, nb_stream_t stream) {
    emb_grad_unique(dunique, src, 1, src_off, order, seg, count, U, n, E, egu_upd{}, stream, __func__);
}
extern "C" void nb_cuda_emb_grad_adagrad(float *table, float *acc, const int64_t *rows, float *scratch, const void *src,
                                         int src_bf16, const int64_t *src_off, const int32_t *order,
                                         const int32_t *seg, const int32_t *count, int U, int n, int E, float lr,
                                         float eps, nb_stream_t stream) {
    NB_CUDA_SHAPE(U == 0 || (table && acc && rows), __func__);
    emb_grad_unique(scratch, src, src_bf16, src_off, order, seg, count, U, n, E, egu_upd{table, acc, rows, lr, eps},
                    stream, __func__);
}

#endif /* CTR_TC_EMU */
