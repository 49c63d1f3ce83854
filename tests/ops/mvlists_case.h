/* A batch with multi-valued columns for the lists_mv rows (ctr.c: the CPU reference against the
 * lists spelled out from ops_ctr.h's formula; ctr_cuda.c: the device's lists against the CPU's,
 * byte for byte). Header-only, static functions. */
#ifndef NB_OT_MVLISTS_CASE_H
#define NB_OT_MVLISTS_CASE_H
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "ops/ops_ctr.h"
#include "rng.h"

typedef struct {
    nb_ctr_lists_shape sh;
    uint32_t *cat, *target, *hist, *mv;
    int32_t *hoff, *moff;
    long n; /* lookups */
} mvl_case;

static inline uint32_t mvl_u32(uint64_t stream, uint64_t i) { return nb_philox(20261206u, stream, i).v[0]; }

/* B samples, ncat fields of which the columns in cols[ncols] are multi-valued (summed where the
 * field's index is even, averaged where odd) with at most kmax[j] values each (fixed: every field holds exactly kmax[j], as MLPerf's multi-hot data; otherwise
 * 0 .. kmax[j], empty and one-value fields included), histories up to max_len and 37 padding
 * rows (max_len 0: none). */
static inline mvl_case mvl_make(int B, int ncat, const int *cols, const int *kmax, int ncols, int max_len, int fixed,
                                uint64_t seed) {
    mvl_case c;
    memset(&c, 0, sizeof c);
    nb_ctr_lists_shape *s = &c.sh;
    s->B = B, s->ncat = ncat, s->E = 16, s->D0 = (int64_t)(ncat + 3) * 16, s->MB = B + 5;
    int64_t at = 0;
    for (int f = 0; f <= ncat; f++) {
        s->off[f] = at;
        s->rows[f] = f == 2 ? 1 : f % 5 == 1 ? 7 : 1000 + 37 * f; /* a one-row table, small ones: duplicates */
        at += s->rows[f];
    }
    s->pad_row = s->off[ncat];
    s->ncols = ncols;
    for (int j = 0; j < ncols; j++) s->col_field[j] = cols[j], s->col_sum[j] = cols[j] % 2 == 0; /* both kinds */
    c.cat = nb_malloc((size_t)B * ncat * 4 + 4, "cat");
    c.target = nb_malloc((size_t)B * 4 + 4, "target");
    c.hoff = nb_malloc(((size_t)B + 1) * 4, "hoff");
    c.moff = nb_malloc(((size_t)B * ncols + 1) * 4, "moff");
    c.hoff[0] = c.moff[0] = 0;
    int32_t nmv = 0;
    for (int i = 0; i < B; i++) {
        for (int f = 0; f < ncat; f++) c.cat[(size_t)i * ncat + f] = mvl_u32(seed, (uint64_t)(i * ncat + f));
        c.target[i] = mvl_u32(seed + 1, (uint64_t)i);
        int len = max_len ? (int)(mvl_u32(seed + 2, (uint64_t)i) % (uint32_t)(max_len + 1)) : 0;
        c.hoff[i + 1] = c.hoff[i] + len;
        for (int j = 0; j < ncols; j++) {
            size_t g = (size_t)i * ncols + j;
            int n = fixed ? kmax[j] : (int)(mvl_u32(seed + 3, g) % (uint32_t)(kmax[j] + 1));
            if (!fixed && i % 9 == 4) n = 0; /* whole samples without a value */
            c.moff[g + 1] = c.moff[g] + n;
            nmv += n > 1 ? n - 1 : 0;
        }
    }
    s->nh = c.hoff[B];
    s->nh_pad = s->nh + (max_len ? 37 : 0);
    s->nvals = c.moff[(size_t)B * ncols];
    s->nmv = nmv;
    s->mv_src = (int64_t)s->MB * (s->D0 + s->E) + (int64_t)s->nh_pad * s->E;
    s->zero_src = s->mv_src + (int64_t)s->nvals * s->E;
    c.hist = nb_malloc((size_t)s->nh * 4 + 4, "hist");
    for (int r = 0; r < s->nh; r++) c.hist[r] = mvl_u32(seed + 4, (uint64_t)r);
    c.mv = nb_malloc((size_t)s->nvals * 4 + 4, "mv");
    for (int r = 0; r < s->nvals; r++) c.mv[r] = mvl_u32(seed + 5, (uint64_t)r);
    c.n = nb_ctr_lists_count(s);
    return c;
}

static inline void mvl_free(mvl_case *c) {
    free(c->cat), free(c->target), free(c->hist), free(c->mv), free(c->hoff), free(c->moff);
}
#endif
