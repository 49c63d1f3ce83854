/* Embedding lookups and jagged bags with a deduplicated backward.
 *
 * The backward never scatters into the full table: it produces one gradient row per UNIQUE row
 * the batch touched, which is what the sparse (row-wise) optimizers apply, and what a sharded
 * table would send to the owner of each row. Determinism without atomics: a segmented reduction.
 * The lookups are grouped by unique row (a stable counting sort, so position order is kept
 * inside each group) and each unique row is summed by one thread in position order: every
 * output element is the same sequence of float additions whatever the thread count. */
#include <stdlib.h>
#include <string.h>

#include "core.h"
#ifdef _OPENMP
#include <omp.h>
#endif
#include "ops/ops_ctr.h"

/* Checked before any parallel region so that nb_fail exits from the calling thread. */
static void embag_check_rows(const int64_t *rows, int n, int64_t nrows) {
    for (int i = 0; i < n; i++)
        NB_CHECK(rows[i] >= 0 && rows[i] < nrows, "map ids to rows with id mod rows_t before the lookup",
                 "embedding row %lld at lookup %d is outside the table's %lld rows", (long long)rows[i], i,
                 (long long)nrows);
}

static void embag_check_offsets(const int32_t *offsets, int B) {
    NB_CHECK(offsets[0] == 0, "bag offsets must start at 0", "bag offsets[0] = %d", (int)offsets[0]);
    for (int b = 0; b < B; b++)
        NB_CHECK(offsets[b + 1] >= offsets[b], "bag offsets must be non-decreasing",
                 "bag %d has offsets %d .. %d", b, (int)offsets[b], (int)offsets[b + 1]);
}

void nb_embag_gather(float *out, const float *table, const int64_t *rows, int n, int64_t nrows, int E) {
    NB_ASSERT(n >= 0 && E >= 0 && (n == 0 || (out && table && rows)));
    embag_check_rows(rows, n, nrows);
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; i++) memcpy(out + (size_t)i * E, table + (size_t)rows[i] * E, (size_t)E * sizeof(float));
}

void nb_embag_bag_forward(float *out, const float *table, const int64_t *rows, const int32_t *offsets, int B,
                          int64_t nrows, int E, nb_embag_mode mode) {
    NB_ASSERT(out && offsets && B >= 0 && E >= 0);
    embag_check_offsets(offsets, B);
    embag_check_rows(rows, offsets[B], nrows);
#pragma omp parallel for schedule(static)
    for (int b = 0; b < B; b++) {
        float *o = out + (size_t)b * E;
        for (int e = 0; e < E; e++) o[e] = 0.0f;
        int len = offsets[b + 1] - offsets[b];
        for (int i = offsets[b]; i < offsets[b + 1]; i++) {
            const float *t = table + (size_t)rows[i] * E;
            for (int e = 0; e < E; e++) o[e] += t[e];
        }
        if (mode == NB_EMBAG_MEAN && len > 0) {
            float s = 1.0f / (float)len;
            for (int e = 0; e < E; e++) o[e] *= s;
        }
    }
}

typedef struct {
    int64_t row;
    int32_t pos;
} embag_key;

/* 11-bit digits: 2 passes cover 4M rows, 3 passes 8G; the counts fit in L1. */
#define NB_EMBAG_RADIX_BITS 11
#define NB_EMBAG_RADIX (1 << NB_EMBAG_RADIX_BITS)

/* LSD radix sort of (row, pos) by row. Each pass is stable, and the keys start in position order,
 * so equal rows end up in position order: the result is a pure function of the input. */
static embag_key *embag_sort(const int64_t *rows, int n) {
    embag_key *a = nb_malloc((size_t)n * sizeof(embag_key), "embedding dedup keys");
    embag_key *b = nb_malloc((size_t)n * sizeof(embag_key), "embedding dedup keys");
    int64_t maxrow = 0;
    for (int i = 0; i < n; i++) {
        NB_CHECK(rows[i] >= 0, "map ids to rows with id mod rows_t before the lookup",
                 "negative embedding row %lld at lookup %d", (long long)rows[i], i);
        a[i] = (embag_key){rows[i], i};
        if (rows[i] > maxrow) maxrow = rows[i];
    }
    size_t *count = nb_malloc(NB_EMBAG_RADIX * sizeof(size_t), "radix counts");
    for (int shift = 0; shift < 63 && (maxrow >> shift) > 0; shift += NB_EMBAG_RADIX_BITS) {
        for (int d = 0; d < NB_EMBAG_RADIX; d++) count[d] = 0;
        for (int i = 0; i < n; i++) count[(a[i].row >> shift) & (NB_EMBAG_RADIX - 1)]++;
        size_t sum = 0;
        for (int d = 0; d < NB_EMBAG_RADIX; d++) {
            size_t c = count[d];
            count[d] = sum;
            sum += c;
        }
        for (int i = 0; i < n; i++) b[count[(a[i].row >> shift) & (NB_EMBAG_RADIX - 1)]++] = a[i];
        embag_key *t = a;
        a = b;
        b = t;
    }
    free(count);
    free(b);
    return a;
}

int nb_embag_unique(int64_t *uniq, int32_t *inverse, const int64_t *rows, int n) {
    NB_ASSERT(n >= 0 && (n == 0 || (uniq && inverse && rows)));
    if (n == 0) return 0;
    embag_key *keys = embag_sort(rows, n);
    int U = 0;
    for (int i = 0; i < n; i++) {
        if (i == 0 || keys[i].row != keys[i - 1].row) uniq[U++] = keys[i].row;
        inverse[keys[i].pos] = U - 1;
    }
    free(keys);
    return U;
}

/* Lookups grouped by unique row, in position order inside each group (a stable counting sort
 * of the positions by inverse): pos[start[u] .. start[u+1]) are the lookups of unique row u.
 * Returns U = max inverse + 1. */
static int embag_groups(const int32_t *inverse, int n, int32_t **start_out, int32_t **pos_out) {
    int U = 0;
    for (int i = 0; i < n; i++) {
        NB_ASSERT(inverse[i] >= 0);
        if (inverse[i] + 1 > U) U = inverse[i] + 1;
    }
    int32_t *start = nb_calloc((size_t)U + 1, sizeof(int32_t), "embedding gradient groups");
    int32_t *pos = nb_malloc((size_t)n * sizeof(int32_t), "embedding gradient groups");
    for (int i = 0; i < n; i++) start[inverse[i] + 1]++;
    for (int u = 0; u < U; u++) start[u + 1] += start[u];
    int32_t *fill = nb_malloc((size_t)U * sizeof(int32_t), "embedding gradient groups");
    memcpy(fill, start, (size_t)U * sizeof(int32_t));
    for (int i = 0; i < n; i++) pos[fill[inverse[i]]++] = i;
    free(fill);
    *start_out = start;
    *pos_out = pos;
    return U;
}

/* Threads for the dedup's passes over n lookups: one below a size where a team costs more than
 * it saves. */
static int dedup_threads(int n) {
#ifdef _OPENMP
    int nt = n < 65536 ? 1 : omp_get_max_threads();
    return nt > 64 ? 64 : nt;
#else
    (void)n;
    return 1;
#endif
}

/* This thread's index in its team and the team's size (which may be smaller than asked for):
 * the passes cut their chunks by the team they got. */
static void team_slot(int *t, int *nt) {
    *t = 0, *nt = 1;
#ifdef _OPENMP
    *t = omp_get_thread_num(), *nt = omp_get_num_threads();
#endif
}

/* Stable parallel LSD radix sort of keys (row << 32 | position) by row: each thread counts and
 * scatters one contiguous chunk, and the chunks' slots are laid out in chunk order, so the result
 * is the serial stable sort's for any thread count. */
/* The sorted keys end in a after an even number of passes, in b after an odd one. */
static void radix_sort_rows(uint64_t *a, uint64_t *b, int n, int64_t maxrow) {
    int want = dedup_threads(n);
    size_t *count = nb_malloc((size_t)want * NB_EMBAG_RADIX * sizeof(size_t), "radix counts");
    for (int shift = 32; shift < 64 && (maxrow >> (shift - 32)) > 0; shift += NB_EMBAG_RADIX_BITS) {
#pragma omp parallel num_threads(want)
        {
            int t, nt;
            team_slot(&t, &nt);
            int lo = (int)((int64_t)n * t / nt), hi = (int)((int64_t)n * (t + 1) / nt);
            size_t *c = count + (size_t)t * NB_EMBAG_RADIX;
            memset(c, 0, NB_EMBAG_RADIX * sizeof(size_t));
            for (int i = lo; i < hi; i++) c[(a[i] >> shift) & (NB_EMBAG_RADIX - 1)]++;
#pragma omp barrier
#pragma omp single
            {
                size_t sum = 0;
                for (int d = 0; d < NB_EMBAG_RADIX; d++)
                    for (int u = 0; u < nt; u++) {
                        size_t v = count[(size_t)u * NB_EMBAG_RADIX + d];
                        count[(size_t)u * NB_EMBAG_RADIX + d] = sum;
                        sum += v;
                    }
            }
            for (int i = lo; i < hi; i++) b[c[(a[i] >> shift) & (NB_EMBAG_RADIX - 1)]++] = a[i];
        }
        uint64_t *t = a;
        a = b;
        b = t;
    }
    free(count);
}

/* The range of rows (the smallest, to reject negatives, and the largest, for the sort's passes). */
static void row_range(const int64_t *rows, int n, int64_t *lo, int64_t *hi) {
    int64_t mn = 0, mx = 0;
#pragma omp parallel for num_threads(dedup_threads(n)) reduction(min : mn) reduction(max : mx) schedule(static)
    for (int i = 0; i < n; i++) {
        if (rows[i] < mn) mn = rows[i];
        if (rows[i] > mx) mx = rows[i];
    }
    *lo = mn, *hi = mx;
}

/* The groups from keys sorted by row (equal rows in position order): each thread takes a chunk,
 * counts the groups that start in it, and after a prefix over the chunks writes its groups at
 * their global index, so the output is the serial pass's for any thread count. */
static int write_groups(int64_t *uniq, int32_t *order, int32_t *seg, int32_t *inverse, const uint64_t *sorted, int n) {
    int starts[65], team = 1;
    starts[0] = 0;
#pragma omp parallel num_threads(dedup_threads(n))
    {
        int t, nt;
        team_slot(&t, &nt);
        int lo = (int)((int64_t)n * t / nt), hi = (int)((int64_t)n * (t + 1) / nt), heads = 0;
        for (int k = lo; k < hi; k++) heads += k == 0 || sorted[k] >> 32 != sorted[k - 1] >> 32;
        starts[t + 1] = heads;
#pragma omp barrier
#pragma omp single
        {
            for (int u = 0; u < nt; u++) starts[u + 1] += starts[u];
            team = nt;
        }
        int U = starts[t];
        for (int k = lo; k < hi; k++) {
            int64_t row = (int64_t)(sorted[k] >> 32);
            int32_t pos = (int32_t)(sorted[k] & 0xffffffffu);
            if (k == 0 || sorted[k] >> 32 != sorted[k - 1] >> 32) {
                seg[U] = k;
                uniq[U++] = row;
            }
            order[k] = pos;
            inverse[pos] = U - 1;
        }
    }
    seg[starts[team]] = n;
    return starts[team];
}

/* Rows that are already unique and sorted need no sort: one owner's rows asked by one rank (a
 * window of one part at one rank) are, and sorting them again cost sync a millisecond a step. */
static int strictly_ascending(const int64_t *rows, int n) {
    int ok = 1;
#pragma omp parallel for num_threads(dedup_threads(n)) schedule(static) reduction(&& : ok)
    for (int i = 1; i < n; i++) ok = ok && rows[i - 1] < rows[i];
    return ok;
}

int nb_embag_unique_groups(int64_t *uniq, int32_t *order, int32_t *seg, int32_t *inverse, const int64_t *rows,
                           int n, uint64_t *scratch) {
    NB_ASSERT(n >= 0 && (n == 0 || (uniq && order && seg && inverse && rows)));
    int64_t minrow, maxrow;
    row_range(rows, n, &minrow, &maxrow);
    if (minrow < 0)
        for (int i = 0; i < n; i++)
            NB_CHECK(rows[i] >= 0, "map ids to rows with id mod rows_t before the lookup",
                     "negative embedding row %lld at lookup %d", (long long)rows[i], i);
    seg[0] = 0;
    if (n == 0) return 0;
    if (strictly_ascending(rows, n)) { /* the groups are the positions */
        memcpy(uniq, rows, (size_t)n * sizeof(int64_t));
        for (int i = 0; i < n; i++) order[i] = inverse[i] = i, seg[i + 1] = i + 1;
        return n;
    }
    if (maxrow >= ((int64_t)1 << 32)) { /* rare: too many rows to pack; the general path */
        int U = nb_embag_unique(uniq, inverse, rows, n);
        memset(seg, 0, ((size_t)U + 1) * sizeof(int32_t));
        for (int i = 0; i < n; i++) seg[inverse[i] + 1]++;
        for (int u = 0; u < U; u++) seg[u + 1] += seg[u];
        int32_t *fill = nb_malloc(((size_t)U + 1) * sizeof(int32_t), "embedding gradient groups");
        memcpy(fill, seg, ((size_t)U + 1) * sizeof(int32_t));
        for (int i = 0; i < n; i++) order[fill[inverse[i]]++] = i; /* position order inside each group */
        free(fill);
        return U;
    }
    uint64_t *own = scratch ? NULL : nb_malloc(2 * (size_t)n * sizeof(uint64_t), "embedding dedup keys");
    uint64_t *a = scratch ? scratch : own, *b = a + n;
#pragma omp parallel for num_threads(dedup_threads(n)) schedule(static)
    for (int i = 0; i < n; i++) a[i] = (uint64_t)rows[i] << 32 | (uint32_t)i;
    int passes = 0;
    for (int shift = 32; shift < 64 && (maxrow >> (shift - 32)) > 0; shift += NB_EMBAG_RADIX_BITS) passes++;
    radix_sort_rows(a, b, n, maxrow);
    /* sorted by row, equal rows in position order: the groups, in order, are the unique rows */
    int U = write_groups(uniq, order, seg, inverse, passes % 2 ? b : a, n);
    free(own);
    return U;
}

/* Each unique row belongs to one thread, which adds its lookups' rows in position order: the
 * same float additions as a serial scatter-add in position order, for any thread count.
 * scale[i] (NULL: 1) multiplies lookup i's row of src, which is row src_row[i] (NULL: i). */
static void embag_segmented_sum(float *dunique, const float *src, const int32_t *src_row, const float *scale,
                                const int32_t *inverse, int n, int E) {
    int32_t *start, *pos;
    int U = embag_groups(inverse, n, &start, &pos);
#pragma omp parallel for schedule(dynamic, 256)
    for (int u = 0; u < U; u++) {
        float *d = dunique + (size_t)u * E;
        for (int k = start[u]; k < start[u + 1]; k++) {
            int i = pos[k];
            const float *g = src + (size_t)(src_row ? src_row[i] : i) * E;
            if (scale) {
                float s = scale[i];
                for (int e = 0; e < E; e++) d[e] += s * g[e];
            } else {
                for (int e = 0; e < E; e++) d[e] += g[e];
            }
        }
    }
    free(start);
    free(pos);
}

void nb_embag_backward_unique(float *dunique, const float *dout, const int32_t *inverse, int n, int E) {
    NB_ASSERT(n >= 0 && E >= 0);
    if (!dunique || n == 0) return;
    NB_ASSERT(dout && inverse);
    embag_segmented_sum(dunique, dout, NULL, NULL, inverse, n, E);
}

void nb_embag_bag_backward_unique(float *dunique, const float *dout, const int32_t *offsets,
                                  const int32_t *inverse, int B, int E, nb_embag_mode mode) {
    NB_ASSERT(offsets && B >= 0 && E >= 0);
    if (!dunique) return;
    embag_check_offsets(offsets, B);
    int n = offsets[B];
    if (n == 0) return;
    NB_ASSERT(dout && inverse);
    int32_t *bag = nb_malloc((size_t)n * sizeof(int32_t), "bag of each lookup");
    float *scale = mode == NB_EMBAG_MEAN ? nb_malloc((size_t)n * sizeof(float), "bag scales") : NULL;
    for (int b = 0; b < B; b++) {
        int len = offsets[b + 1] - offsets[b];
        for (int i = offsets[b]; i < offsets[b + 1]; i++) {
            bag[i] = b;
            /* Same factor as the forward's multiply by 1/len: the gradient of o *= s is s. */
            if (scale) scale[i] = 1.0f / (float)len;
        }
    }
    embag_segmented_sum(dunique, dout, bag, scale, inverse, n, E);
    free(bag);
    free(scale);
}
