/* seqctr's lookup lists on the host (ops_ctr.h); ctr_lists.cu builds the same lists on CUDA. */
#include <stdint.h>

#include "core.h"
#include "ops/ops_ctr.h"

long nb_ctr_lists_count(const nb_ctr_lists_shape *s) { return (long)(s->ncat + 2) * s->B + s->nmv + s->nh_pad; }

void nb_ctr_lists(const nb_ctr_lists_shape *s, const uint32_t *cat, const uint32_t *target, const uint32_t *hist,
                  const int32_t *hoff, int64_t *rows, int64_t *dst, int64_t *src) {
    NB_ASSERT(s->ncat >= 0 && s->ncat < NB_CTR_LISTS_MAX_FIELDS && s->B >= 0 && s->nh >= 0 && s->nh_pad >= s->nh && s->nmv >= 0);
    const int B = s->B, nf = s->ncat + 1;
    const int64_t E = s->E, D0 = s->D0, MB = s->MB;
    /* independent per sample: threads fill them (at B = 4096 this is milliseconds of the host's
     * time, which the device would otherwise wait for) */
#pragma omp parallel for schedule(static) if (B >= 256)
    for (int i = 0; i < B; i++) {
        for (int f = 0; f < nf; f++) {
            size_t k = (size_t)i * nf + f;
            uint64_t id = f < s->ncat ? cat[(size_t)i * s->ncat + f] : target[i];
            rows[k] = s->off[f] + (int64_t)(id % (uint64_t)s->rows[f]);
            dst[k] = src[k] = (int64_t)i * D0 + (int64_t)(1 + f) * E;
        }
        size_t k = (size_t)B * nf + i;
        rows[k] = rows[(size_t)i * nf + s->ncat];
        dst[k] = -1;
        src[k] = MB * D0 + (int64_t)i * E;
    }
    const size_t first = (size_t)B * (nf + 1) + (size_t)s->nmv;
    const int64_t item_off = s->off[s->ncat];
    const uint64_t item_rows = (uint64_t)s->rows[s->ncat];
#pragma omp parallel for schedule(static) if (B >= 256)
    for (int i = 0; i < B; i++)
        for (int64_t r = hoff[i]; r < hoff[i + 1]; r++) {
            size_t k = first + (size_t)r;
            rows[k] = item_off + (int64_t)(hist[r] % item_rows);
            dst[k] = r * E;
            src[k] = MB * (D0 + E) + r * E;
        }
    for (int64_t r = s->nh; r < s->nh_pad; r++) {
        size_t k = first + (size_t)r;
        rows[k] = s->pad_row;
        dst[k] = r * E;
        src[k] = 0;
    }
}

/* The reference: one pass in (sample, column, value) order, the lookups appended as they come. */
void nb_ctr_lists_mv(const nb_ctr_lists_shape *s, const uint32_t *mv, const int32_t *moff, int64_t *rows,
                     int64_t *dst, int64_t *src, int32_t *before) {
    NB_ASSERT(s->ncols >= 0 && s->ncols <= s->ncat && s->nvals >= 0 && s->nmv >= 0);
    if (s->ncols == 0) return;
    NB_ASSERT(moff[0] == 0 && moff[(size_t)s->B * s->ncols] == s->nvals);
    const int nf = s->ncat + 1;
    const int64_t E = s->E;
    size_t k = (size_t)s->B * (nf + 1);
    for (int i = 0; i < s->B; i++)
        for (int j = 0; j < s->ncols; j++) {
            const size_t g = (size_t)i * s->ncols + j;
            const int f = s->col_field[j];
            const size_t slot = (size_t)i * nf + f;
            const int32_t r0 = moff[g], r1 = moff[g + 1];
            before[g] = (int32_t)((size_t)r0 - (k - (size_t)s->B * (nf + 1))); /* the fields with a value so far */
            if (r1 == r0) {
                rows[slot] = rows[(size_t)i * nf + s->ncat];
                src[slot] = s->zero_src;
                continue;
            }
            rows[slot] = s->off[f] + (int64_t)(mv[r0] % (uint64_t)s->rows[f]);
            for (int32_t r = r0 + 1; r < r1; r++, k++) {
                rows[k] = s->off[f] + (int64_t)(mv[r] % (uint64_t)s->rows[f]);
                dst[k] = r * E;
                src[k] = s->col_sum[j] ? src[slot] : s->mv_src + r * E; /* a sum: the slot's own gradient */
            }
        }
    NB_ASSERT(k == (size_t)s->B * (nf + 1) + (size_t)s->nmv);
}
