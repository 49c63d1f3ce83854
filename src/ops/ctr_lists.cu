/* seqctr's lookup lists and their deduplication on CUDA (ops_ctr.h's nb_ctr_lists and
 * nb_embag_unique_groups, the same outputs bit for bit), so that the host of a step only stages
 * the raw ids: at B = 4096 the host's lists and radix sort took ~3.3 ms a step, longer than the
 * device needed for everything else it waited on.
 *
 * The deduplication is a stable radix sort of (row, position) by row (CUB's, LSD: equal rows keep
 * their position order, which is the host sort's order), then the run heads: a flag per sorted
 * lookup, an inclusive scan of the flags (each run's 1-based index) and a scatter of the heads into
 * uniq / seg. The count of unique rows stays on the device (the ops that read the groups take it
 * from there), so nothing here waits for the device. */
#include <cub/cub.cuh>

#include "ops/ops_ctr_cuda.h"
#include "ops/ops_cuda_common.cuh"

#define THREADS 256

static size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

/* Lookups [0, (nf + 1) B) and the padding rows (after the nmv multi-valued lookups and the
 * history rows): one thread each. */
static __global__ void lists_fixed_kernel(nb_ctr_lists_shape s, const uint32_t *cat, const uint32_t *target,
                                          int64_t *rows, int64_t *dst, int64_t *src) {
    const int nf = s.ncat + 1;
    const long fixed = (long)(nf + 1) * s.B, pad = s.nh_pad - s.nh;
    for (long k = (long)blockIdx.x * blockDim.x + threadIdx.x; k < fixed + pad; k += (long)gridDim.x * blockDim.x) {
        if (k >= fixed) { /* padding row r */
            const int64_t r = s.nh + (k - fixed), at = fixed + s.nmv + r;
            rows[at] = s.pad_row, dst[at] = r * s.E, src[at] = 0;
            continue;
        }
        const int i = (int)(k < (long)nf * s.B ? k / nf : k - (long)nf * s.B);
        const int f = k < (long)nf * s.B ? (int)(k % nf) : s.ncat; /* the second target lookup: the target's row */
        const uint64_t id = f < s.ncat ? cat[(size_t)i * s.ncat + f] : target[i];
        rows[k] = s.off[f] + (int64_t)(id % (uint64_t)s.rows[f]);
        if (k < (long)nf * s.B)
            dst[k] = src[k] = (int64_t)i * s.D0 + (int64_t)(1 + f) * s.E;
        else
            dst[k] = -1, src[k] = s.MB * s.D0 + (int64_t)i * s.E;
    }
}

/* History rows: one thread per packed row. */
static __global__ void lists_hist_kernel(nb_ctr_lists_shape s, const uint32_t *hist, int64_t *rows, int64_t *dst,
                                         int64_t *src) {
    const long first = (long)(s.ncat + 2) * s.B + s.nmv;
    const int64_t item_off = s.off[s.ncat];
    const uint64_t item_rows = (uint64_t)s.rows[s.ncat];
    for (long r = (long)blockIdx.x * blockDim.x + threadIdx.x; r < s.nh; r += (long)gridDim.x * blockDim.x) {
        rows[first + r] = item_off + (int64_t)(hist[r] % item_rows);
        dst[first + r] = r * s.E;
        src[first + r] = s.MB * (s.D0 + s.E) + r * s.E;
    }
}

extern "C" void nb_cuda_ctr_lists(const nb_ctr_lists_shape *s, const uint32_t *cat, const uint32_t *target,
                                  const uint32_t *hist, int64_t *rows, int64_t *dst, int64_t *src, nb_stream_t stream) {
    NB_CUDA_SHAPE(s && s->nmv >= 0 && s->ncat >= 0 && s->ncat < NB_CTR_LISTS_MAX_FIELDS && s->B >= 0 && s->nh >= 0 &&
                      s->nh_pad >= s->nh && (s->B == 0 || (cat && target)) && (s->nh == 0 || hist) &&
                      (nb_ctr_lists_count(s) == 0 || (rows && dst && src)),
                  "nb_cuda_ctr_lists");
    const long fixed = (long)(s->ncat + 2) * s->B + (s->nh_pad - s->nh);
    if (fixed > 0) {
        lists_fixed_kernel<<<nb_grid_1d((size_t)fixed, THREADS), THREADS, 0, stream>>>(*s, cat, target, rows, dst, src);
        CUDA_CHECK_LAUNCH("lookup lists (fields, padding)");
    }
    if (s->nh > 0) {
        lists_hist_kernel<<<nb_grid_1d((size_t)s->nh, THREADS), THREADS, 0, stream>>>(*s, hist, rows, dst, src);
        CUDA_CHECK_LAUNCH("lookup lists (histories)");
    }
}

/* ---- multi-valued columns (nb_ctr_lists_mv): field g = sample i's column j; its values
 * moff[g] .. moff[g + 1] - 1. A value's lookup is (nf + 1) B + r - e_g - 1 with e_g the fields
 * before g that have a value: an exclusive scan of the "has a value" flags gives every e_g, and a
 * value finds its field by binary search in moff. Each output is written by one thread, from
 * integers only, so the lists are the host's bits whatever the launch shape. ---- */

static __device__ __forceinline__ int64_t mv_row(const nb_ctr_lists_shape &s, int f, uint32_t id) {
    return s.off[f] + (int64_t)(id % (uint64_t)s.rows[f]);
}

/* The last field g of [0, G) with moff[g] <= r (moff non-decreasing, moff[0] = 0 <= r): the field
 * that holds value r (an empty field's start equals the next one's, so the search passes it). */
static __device__ __forceinline__ long mv_field_of(const int32_t *moff, long G, int32_t r) {
    long lo = 0, hi = G; /* moff[lo] <= r; the answer is in [lo, hi) */
    while (hi - lo > 1) {
        const long mid = lo + (hi - lo) / 2;
        if (moff[mid] <= r) lo = mid;
        else hi = mid;
    }
    return lo;
}

static __global__ void mv_flags_kernel(int32_t *flag, const int32_t *moff, long G) {
    for (long g = (long)blockIdx.x * blockDim.x + threadIdx.x; g < G; g += (long)gridDim.x * blockDim.x)
        flag[g] = moff[g + 1] > moff[g];
}

/* Each field's slot: its first value's row, or (no value) the target row with a zero gradient. */
static __global__ void mv_slots_kernel(nb_ctr_lists_shape s, const uint32_t *mv, const int32_t *moff, int64_t *rows,
                                       int64_t *src) {
    const int nf = s.ncat + 1;
    const long G = (long)s.B * s.ncols;
    for (long g = (long)blockIdx.x * blockDim.x + threadIdx.x; g < G; g += (long)gridDim.x * blockDim.x) {
        const long i = g / s.ncols;
        const int f = s.col_field[g % s.ncols];
        const long slot = i * nf + f;
        const int32_t r0 = moff[g];
        if (moff[g + 1] == r0) {
            rows[slot] = rows[i * nf + s.ncat];
            src[slot] = s.zero_src;
        } else {
            rows[slot] = mv_row(s, f, mv[r0]);
        }
    }
}

/* Every value after its field's first: one lookup each. */
static __global__ void mv_values_kernel(nb_ctr_lists_shape s, const uint32_t *mv, const int32_t *moff,
                                        const int32_t *before, int64_t *rows, int64_t *dst, int64_t *src) {
    const long G = (long)s.B * s.ncols, first = (long)(s.ncat + 2) * s.B;
    for (long r = (long)blockIdx.x * blockDim.x + threadIdx.x; r < s.nvals; r += (long)gridDim.x * blockDim.x) {
        const long g = mv_field_of(moff, G, (int32_t)r);
        if (moff[g] == r) continue; /* the field's first value: its slot's lookup */
        const long k = first + r - before[g] - 1;
        const int j = (int)(g % s.ncols), f = s.col_field[j];
        rows[k] = mv_row(s, f, mv[r]);
        dst[k] = r * s.E;
        /* a sum: the slot's own gradient (nb_cuda_ctr_lists set the slot's src, earlier on this stream) */
        src[k] = s.col_sum[j] ? src[(g / s.ncols) * (s.ncat + 1) + f] : s.mv_src + r * s.E;
    }
}

extern "C" void nb_cuda_ctr_lists_mv(const nb_ctr_lists_shape *s, const uint32_t *mv, const int32_t *moff,
                                     int64_t *rows, int64_t *dst, int64_t *src, int32_t *before, nb_stream_t stream) {
    NB_CUDA_SHAPE(s && s->ncols >= 0 && s->ncols <= s->ncat && s->ncat < NB_CTR_LISTS_MAX_FIELDS && s->B >= 0 &&
                      s->nvals >= 0 && s->nmv >= 0 && s->nmv <= s->nvals &&
                      (s->ncols == 0 || s->B == 0 || (moff && rows && dst && src && before)) && (s->nvals == 0 || mv),
                  "nb_cuda_ctr_lists_mv");
    const long G = (long)s->B * s->ncols;
    if (G == 0) return;
    mv_slots_kernel<<<nb_grid_1d((size_t)G, THREADS), THREADS, 0, stream>>>(*s, mv, moff, rows, src);
    CUDA_CHECK_LAUNCH("lookup lists (multi-valued slots)");
    size_t scan_bytes = 0;
    CUDA_CHECK(cub::DeviceScan::ExclusiveSum(NULL, scan_bytes, (const int32_t *)NULL, (int32_t *)NULL, (int)G, stream));
    const size_t ints = align256((size_t)G * sizeof(int32_t));
    char *base = (char *)nb_cuda_scratch(ints + scan_bytes, stream);
    int32_t *flag = (int32_t *)base;
    mv_flags_kernel<<<nb_grid_1d((size_t)G, THREADS), THREADS, 0, stream>>>(flag, moff, G);
    CUDA_CHECK_LAUNCH("lookup lists (multi-valued fields with a value)");
    size_t bytes = scan_bytes;
    CUDA_CHECK(cub::DeviceScan::ExclusiveSum(base + ints, bytes, flag, before, (int)G, stream));
    if (s->nmv > 0) /* some field has more than one value */
        mv_values_kernel<<<nb_grid_1d((size_t)s->nvals, THREADS), THREADS, 0, stream>>>(*s, mv, moff, before, rows,
                                                                                         dst, src);
    CUDA_CHECK_LAUNCH("lookup lists (multi-valued values)");
    nb_cuda_scratch_free(base, stream);
}

/* Sort input: the row as the key (rows < 2^32), the position as the value. */
static __global__ void unique_keys_kernel(uint32_t *keys, int32_t *pos, const int64_t *rows, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        keys[i] = (uint32_t)rows[i], pos[i] = i;
}

static __global__ void unique_heads_kernel(int32_t *head, const uint32_t *sorted, int n) {
    for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < n; k += gridDim.x * blockDim.x)
        head[k] = k == 0 || sorted[k] != sorted[k - 1];
}

/* id[k]: the 1-based index of sorted lookup k's run; a head writes its run's row and start. */
static __global__ void unique_scatter_kernel(int64_t *uniq, int32_t *seg, int32_t *count, const uint32_t *sorted,
                                             const int32_t *head, const int32_t *id, int n) {
    for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < n; k += gridDim.x * blockDim.x) {
        if (head[k]) uniq[id[k] - 1] = (int64_t)sorted[k], seg[id[k] - 1] = k;
        if (k == n - 1) seg[id[k]] = n, *count = id[k];
    }
}

extern "C" void nb_cuda_emb_unique_groups(int64_t *uniq, int32_t *order, int32_t *seg, int32_t *count,
                                          const int64_t *rows, int n, int64_t maxrow, nb_stream_t stream) {
    NB_CUDA_SHAPE(n >= 0 && maxrow >= 0 && maxrow < ((int64_t)1 << 32) && seg && count &&
                      (n == 0 || (uniq && order && rows)),
                  "nb_cuda_emb_unique_groups");
    if (n == 0) {
        CUDA_CHECK(cudaMemsetAsync(seg, 0, sizeof(int32_t), stream));
        CUDA_CHECK(cudaMemsetAsync(count, 0, sizeof(int32_t), stream));
        return;
    }
    size_t sort_bytes = 0, scan_bytes = 0;
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(NULL, sort_bytes, (const uint32_t *)NULL, (uint32_t *)NULL,
                                               (const int32_t *)NULL, (int32_t *)NULL, n, 0, nb_key_bits(maxrow), stream));
    CUDA_CHECK(cub::DeviceScan::InclusiveSum(NULL, scan_bytes, (const int32_t *)NULL, (int32_t *)NULL, n, stream));
    const size_t keys = align256((size_t)n * sizeof(uint32_t)), ints = align256((size_t)n * sizeof(int32_t));
    const size_t temp = sort_bytes > scan_bytes ? sort_bytes : scan_bytes;
    char *base = (char *)nb_cuda_scratch(2 * keys + 3 * ints + temp, stream);
    uint32_t *k_in = (uint32_t *)base, *k_out = (uint32_t *)(base + keys);
    int32_t *pos = (int32_t *)(base + 2 * keys), *head = (int32_t *)(base + 2 * keys + ints);
    int32_t *id = (int32_t *)(base + 2 * keys + 2 * ints);
    void *tmp = base + 2 * keys + 3 * ints;
    const unsigned grid = nb_grid_1d((size_t)n, THREADS);
    unique_keys_kernel<<<grid, THREADS, 0, stream>>>(k_in, pos, rows, n);
    CUDA_CHECK_LAUNCH("deduplication (keys)");
    size_t bytes = sort_bytes;
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(tmp, bytes, k_in, k_out, pos, order, n, 0, nb_key_bits(maxrow), stream));
    unique_heads_kernel<<<grid, THREADS, 0, stream>>>(head, k_out, n);
    CUDA_CHECK_LAUNCH("deduplication (run heads)");
    bytes = scan_bytes;
    CUDA_CHECK(cub::DeviceScan::InclusiveSum(tmp, bytes, head, id, n, stream));
    unique_scatter_kernel<<<grid, THREADS, 0, stream>>>(uniq, seg, count, k_out, head, id, n);
    CUDA_CHECK_LAUNCH("deduplication (unique rows)");
    nb_cuda_scratch_free(base, stream);
}
