/* seqctr's host staging of a batch (see seqctr.h for the model).
 *
 * A batch becomes index lists (nb_sc_prepare): the embedding rows to gather and where each goes,
 * the packed history offsets, and the deduplicated rows with their lookups grouped for a
 * fixed-order gradient sum. The host builds them (the CPU backend, sharded tables: the owners'
 * plans need them on the host), or with device lists the host stages the raw ids and the
 * device builds the same lists in the batch's upload phase (ctr ops lists / lists_mv /
 * unique_groups; multi-valued columns' values go up packed, as the host packs them). The
 * backend then only gathers, computes and scatters by those lists, so the result does not depend
 * on who built them or on the backend's threads.
 *
 * Lookup list of a batch of B samples with nh history items (global rows, one table set; n =
 * ncat + 1 fields: the categorical tables and the target):
 *   [0, nB)             sample i's ncat categorical rows and its target row, into x0[i, E..(n+1)E)
 *   [nB, (n+1)B)        the target row again: the gradient that reaches it through target.wq
 *   [(n+1)B, + nmv)     multi-valued columns' values after each field's first, packed in
 *                       (sample, column, value) order, into their rows of acts.mv. A field's
 *                       first value is its slot's own lookup in the first range (as a
 *                       single-valued column's id: a one-value field is exactly one), and the
 *                       pooling op (mvpool) adds the others to the slot. A field without a value
 *                       looks up the sample's target row with the gradient of a zero row (a row
 *                       the batch touches anyway, so no optimizer sees an extra row) and the pool
 *                       zeroes the slot.
 *   [.. + nmv, + nh)    the history items, packed in (sample, position) order, into h0
 * Backward sums each unique row's lookups from one gradient region [dx0 | dtemb | dh | dmv |
 * a zero row].
 *
 * Sharded tables: the lookups index the batch's work buffer (its unique rows in owner-major
 * order, as the rows all-to-all leaves them), and the batch's exchange lists are the embedding
 * module's (emb/exchange.c). */
#include <string.h>

#include "core.h"
#include "model/seqctr_internal.h"
#include "ops/backend_ctr.h"
#include "ops/ops_ctr.h"

void nb_sc_check_batch(const nb_sc_model *m, const nb_sc_batch *b) {
    NB_CHECK(b->B >= 1 && b->B <= m->max_batch, "pass a batch no larger than the model was built for",
             "batch of %d samples, model built for at most %d", b->B, m->max_batch);
    for (int i = 0; i < b->B; i++) {
        int len = b->hist_len[i];
        NB_CHECK(len >= 0 && len <= m->cfg.max_len && len <= b->hist_stride, "histories are capped at --max-len",
                 "sample %d has a history of %d items (max_len %d)", i, len, m->cfg.max_len);
    }
    int nmv = nb_sc_nmv(&m->cfg);
    if (!nmv) return;
    NB_CHECK(b->mv && b->mv_len && b->mv_stride >= nb_sc_mv_width(&m->cfg), "this is a bug in nobubble; please report it",
             "a batch without the model's multi-valued columns (stride %d of %d)", b->mv_stride, nb_sc_mv_width(&m->cfg));
    for (int i = 0; i < b->B; i++)
        for (int f = 0, j = 0; f < m->cfg.ncat; f++) {
            if (m->cfg.pool[f] == NB_SC_POOL_NONE) continue;
            int n = b->mv_len[(size_t)i * nmv + j++];
            NB_CHECK(n >= 0 && n <= m->cfg.mv_max[f], "this is a bug in nobubble; please report it",
                     "sample %d has %d values in multi-valued column %d (max_values %d)", i, n, f, m->cfg.mv_max[f]);
        }
}

/* A device step has fixed kernel sizes once captured as a graph: histories are padded to a bucket
 * (at most 1/32 more rows), so one graph serves every batch whose rows round up to it, and eager
 * steps pad the same way, so graphs and eager steps compute the same bits. */
static int bucket_rows(int n, int cap) {
    if (n <= 0) return 0;
    long g = 64;
    while (g * 32 < n) g *= 2;
    long b = ((long)n + g - 1) / g * g;
    return b < cap ? (int)b : cap;
}

/* Training batches go round the embedding ring (emb.c): at most the step's batch, the next one
 * and the one after are in use at a time (a pipelined schedule fetches the next one's rows while
 * the step trains, and the host prepares the one after). */
void nb_sc_prepare(nb_sc_model *m, const nb_sc_batch *b) { nb_sc_prepare_part(m, b, 0, 1); }

void nb_sc_prepare_part(nb_sc_model *m, const nb_sc_batch *b, int part, int nparts) {
    nb_sc_check_batch(m, b);
    NB_CHECK(part >= 0 && part < nparts && nparts <= m->emb.nparts, "this is a bug in nobubble; please report it",
             "seqctr: part %d of %d (the model was planned for windows of %d parts)", part, nparts, m->emb.nparts);
    int slot = nb_emb_push(&m->emb, part, nparts);
    nb_sc_prepare_into(m, b, slot);
    /* --graphs: a captured step replays the value counts it was captured with (DLRM's multi-hot
     * data always fills every field) */
    NB_CHECK(!m->full_mv || m->stages[slot]->nmv_vals == b->B * nb_sc_mv_width(&m->cfg),
             "drop --graphs, or give every multi-valued field max_values values (a captured step has fixed sizes)",
             "--graphs: a batch of %d samples holds %d multi-valued values, not %d (every field full)", b->B,
             m->stages[slot]->nmv_vals, b->B * nb_sc_mv_width(&m->cfg));
    m->stage_nh = m->stages[slot]->nh_real;
}

int nb_sc_first_part(const nb_sc_model *m) { return nb_emb_first_part(&m->emb); }

int nb_sc_rows_ahead(const nb_sc_model *m) { return nb_emb_rows_ahead(&m->emb); }

void nb_sc_learn_unique(nb_sc_model *m, nb_sc_stage *s, int with_rows) {
    if (s->nuniq < 0) {
        int32_t n;
        m->be->to_host(CTX(m), &n, s->d_count, sizeof n);
        NB_CHECK(n >= 0 && n <= s->nlk_real, "this is a bug in nobubble; please report it",
                 "seqctr: the device counts %d unique rows of %d lookups", (int)n, s->nlk_real);
        s->nuniq = n;
    }
    if (with_rows) m->be->to_host(CTX(m), s->h_uniq, s->d_uniq, (size_t)s->nuniq * sizeof(int64_t));
    if (s == m->stage) m->nuniq = s->nuniq;
}

int nb_sc_unique_rows(nb_sc_model *m) {
    if (!m->stage) return 0;
    nb_sc_learn_unique(m, m->stage, 0);
    return m->stage->nuniq;
}

void nb_sc_batch_rows(nb_sc_model *m, int *distinct, int *resynced) {
    *distinct = nb_sc_unique_rows(m);
    *resynced = nb_emb_resynced(&m->emb);
}

int nb_sc_current_slot(const nb_sc_model *m) { return m->emb.cur; }

int nb_sc_prepared_rows(const nb_sc_model *m) { return m->stage ? m->stage->nh : 0; }

/* Evaluation batches: the slot after the ring, which no training batch uses. */
int nb_sc_prepare_aside(nb_sc_model *m, const nb_sc_batch *b) {
    nb_sc_check_batch(m, b);
    int latest = m->emb.latest;
    nb_sc_prepare_into(m, b, NB_SC_RING);
    nb_emb_begin_aside(&m->emb);
    return latest;
}

void nb_sc_use_slot(nb_sc_model *m, int slot) {
    nb_sc_stage *s = m->stages[slot];
    m->emb.cur = slot;
    m->stage = s;
    m->uniq_rows = s->h_uniq;
    m->nuniq = s->nuniq;
}

void nb_sc_begin_aside(nb_sc_model *m) { nb_sc_use_slot(m, NB_SC_RING); }

void nb_sc_end_aside(nb_sc_model *m, int latest) { nb_emb_end_aside(&m->emb, latest); }

/* The lists' shape for a batch of B samples with nh_real history rows, nh with the padding. */
static nb_ctr_lists_shape lists_shape(const nb_sc_model *m, int B, int nh_real, int nh) {
    nb_ctr_lists_shape sh = {.B = B, .ncat = m->cfg.ncat, .nh = nh_real, .nh_pad = nh, .D0 = m->D0, .E = m->cfg.E,
                             .MB = m->max_batch};
    /* padding rows: gathered and encoded like history rows, in no sample, left out of the
     * deduplication: their gradient is 0 and reaches no table row (sharded: the batch's first
     * unique row; whole tables: the item table's row 0) */
    sh.pad_row = sharded(m) ? 0 : m->emb_off[nb_sc_item_table(&m->cfg)];
    for (int f = 0; f < nb_sc_ntables(&m->cfg); f++) {
        sh.off[f] = m->emb_off[f];
        sh.rows[f] = f < m->cfg.ncat ? m->cfg.cat_rows[f] : m->cfg.item_rows;
    }
    return sh;
}

static nb_ctr_lists_shape stage_shape(const nb_sc_model *m, const nb_sc_stage *s) {
    nb_ctr_lists_shape sh = lists_shape(m, s->B, s->nh_real, s->nh);
    const nb_sc_config *c = &m->cfg;
    sh.nmv = s->nmv;
    sh.nvals = s->nmv_vals;
    sh.mv_src = (int64_t)m->acts->mv_src;
    sh.zero_src = (int64_t)m->acts->zero_src;
    for (int f = 0; f < c->ncat; f++)
        if (c->pool[f] != NB_SC_POOL_NONE) {
            sh.col_sum[sh.ncols] = c->pool[f] == NB_SC_POOL_SUM;
            sh.col_field[sh.ncols++] = f;
        }
    return sh;
}

/* The multi-valued columns' values packed (sample, column, value) with their offsets, and the
 * lookups they need (every value but each field's first): the offsets in one pass, then the
 * samples' values copied in parallel (DLRM: 214 values a sample, 1.5 M at B = 6912). */
static void pack_mv(const nb_sc_model *m, nb_sc_stage *s, const nb_sc_batch *b) {
    const nb_sc_config *c = &m->cfg;
    int nmv = nb_sc_nmv(c), B = b->B;
    s->nmv = s->nmv_vals = 0;
    if (!nmv) return;
    int32_t k = 0, lookups = 0;
    s->h_moff[0] = 0;
    for (size_t g = 0; g < (size_t)B * nmv; g++) {
        int n = b->mv_len[g];
        k += n;
        lookups += n > 1 ? n - 1 : 0;
        s->h_moff[g + 1] = k;
    }
    s->nmv_vals = k;
    s->nmv = lookups;
#pragma omp parallel for schedule(static) if (B >= 256)
    for (int i = 0; i < B; i++) {
        const uint32_t *v = b->mv + (size_t)i * b->mv_stride;
        const int32_t *at = s->h_moff + (size_t)i * nmv;
        for (int f = 0, j = 0; f < c->ncat; f++) {
            if (c->pool[f] == NB_SC_POOL_NONE) continue;
            memcpy(s->h_mv + at[j], v, (size_t)(at[j + 1] - at[j]) * sizeof(uint32_t));
            v += c->mv_max[f];
            j++;
        }
    }
}

void nb_sc_prepare_into(nb_sc_model *m, const nb_sc_batch *b, int slot) {
    nb_sc_stage *s = m->stages[slot];
    int B = b->B;
    s->B = B;
    s->has_label = b->label != NULL;
    memcpy(s->h_dense, b->dense, (size_t)B * (size_t)m->cfg.ndense * sizeof(float));
    if (b->label) memcpy(s->h_label, b->label, (size_t)B * sizeof(float));
    s->h_off[0] = 0;
    for (int i = 0; i < B; i++) s->h_off[i + 1] = s->h_off[i] + b->hist_len[i];
#pragma omp parallel for schedule(static) if (B >= 256)
    for (int i = 0; i < B; i++)
        memcpy(s->h_hist + s->h_off[i], b->hist + (size_t)i * b->hist_stride, (size_t)b->hist_len[i] * sizeof(uint32_t));
    s->nh_real = s->h_off[B];
    s->nh = m->pad_rows ? bucket_rows(s->nh_real, m->max_batch * m->cfg.max_len) : s->nh_real;
    pack_mv(m, s, b);
    s->nlk_real = B * (int)NLK_PER_SAMPLE(&m->cfg) + s->nmv + s->nh_real;
    s->nlk = B * (int)NLK_PER_SAMPLE(&m->cfg) + s->nmv + s->nh;
    if (m->dev_lists) { /* the device builds the lists from these in the upload phase */
        memcpy(s->h_cat, b->cat, (size_t)B * (size_t)m->cfg.ncat * sizeof(uint32_t));
        memcpy(s->h_target, b->target, (size_t)B * sizeof(uint32_t));
        s->nuniq = -1;
        m->stage_dedup_s = 0;
        return;
    }
    nb_ctr_lists_shape sh = stage_shape(m, s);
    nb_ctr_lists(&sh, b->cat, b->target, s->h_hist, s->h_off, s->h_rows, s->h_dst, s->h_src);
    nb_ctr_lists_mv(&sh, s->h_mv, s->h_moff, s->h_rows, s->h_dst, s->h_src, s->h_mvb);
    size_t k = (size_t)s->nlk_real;
    double t0 = nb_now();
    if (sharded(m)) nb_emb_owner_keys(&m->emb, s->h_rows, k);
    s->nuniq = nb_embag_unique_groups(s->h_uniq, s->h_order, s->h_seg, s->h_inverse, s->h_rows, (int)k, s->h_keys);
    if (sharded(m)) nb_emb_ask(&m->emb, slot, s->h_uniq, s->nuniq, s->h_inverse, s->h_rows, k);
    m->stage_dedup_s = nb_now() - t0;
}

/* Device lists: the raw ids in, the lists built and deduplicated there (an evaluation batch's
 * too: nb_sc_forward's batch may be trained on). */
static void upload_build(nb_sc_model *m, nb_ctx c, const nb_sc_stage *s) {
    const nb_backend_i *be = m->be;
    size_t B = (size_t)s->B;
    be->to_backend(c, s->d_dense, s->h_dense, B * (size_t)m->cfg.ndense * sizeof(float));
    if (s->has_label) be->to_backend(c, s->d_label, s->h_label, B * sizeof(float));
    be->to_backend(c, s->d_cat, s->h_cat, B * (size_t)m->cfg.ncat * sizeof(uint32_t));
    be->to_backend(c, s->d_target, s->h_target, B * sizeof(uint32_t));
    be->to_backend(c, s->d_hist, s->h_hist, (size_t)s->nh_real * sizeof(uint32_t));
    be->to_backend(c, s->d_off, s->h_off, (B + 1) * sizeof(int32_t));
    size_t nmvc = (size_t)nb_sc_nmv(&m->cfg);
    if (nmvc) {
        be->to_backend(c, s->d_mv, s->h_mv, (size_t)s->nmv_vals * sizeof(uint32_t));
        be->to_backend(c, s->d_moff, s->h_moff, (B * nmvc + 1) * sizeof(int32_t));
    }
    nb_ctr_lists_shape sh = stage_shape(m, s);
    m->co->lists(c, &sh, s->d_cat, s->d_target, s->d_hist, s->d_off, s->d_rows, s->d_dst, s->d_src);
    if (nmvc) m->co->lists_mv(c, &sh, s->d_mv, s->d_moff, s->d_rows, s->d_dst, s->d_src, s->d_mvb);
    m->co->unique_groups(c, s->d_uniq, s->d_order, s->d_seg, s->d_count, s->d_rows, s->nlk_real,
                         nb_sc_total_rows(m) - 1);
}

void nb_sc_upload_slot(nb_sc_model *m, nb_ctx c, int slot) {
    const nb_sc_stage *s = m->stages[slot];
    if (on_cpu(m)) return;
    if (m->dev_lists) {
        upload_build(m, c, s);
        return;
    }
    const nb_backend_i *be = m->be;
    size_t n = (size_t)s->nlk, U = (size_t)s->nuniq;
    be->to_backend(c, s->d_dense, s->h_dense, (size_t)s->B * (size_t)m->cfg.ndense * sizeof(float));
    if (s->has_label) be->to_backend(c, s->d_label, s->h_label, (size_t)s->B * sizeof(float));
    be->to_backend(c, s->d_rows, s->h_rows, n * sizeof(int64_t));
    be->to_backend(c, s->d_dst, s->h_dst, n * sizeof(int64_t));
    be->to_backend(c, s->d_src, s->h_src, n * sizeof(int64_t));
    be->to_backend(c, s->d_order, s->h_order, n * sizeof(int32_t));
    be->to_backend(c, s->d_seg, s->h_seg, (U + 1) * sizeof(int32_t));
    be->to_backend(c, s->d_uniq, s->h_uniq, U * sizeof(int64_t));
    be->to_backend(c, s->d_off, s->h_off, ((size_t)s->B + 1) * sizeof(int32_t));
    size_t nmvc = (size_t)nb_sc_nmv(&m->cfg);
    if (nmvc) {
        be->to_backend(c, s->d_moff, s->h_moff, ((size_t)s->B * nmvc + 1) * sizeof(int32_t));
        be->to_backend(c, s->d_mvb, s->h_mvb, (size_t)s->B * nmvc * sizeof(int32_t));
    }
    nb_emb_upload(&m->emb, c, slot); /* sharded: the exchange's lists */
}

/* The batch after the step's (pipelined: its phases run while the step trains). */
void nb_sc_enqueue_next_phase(nb_sc_model *m, const nb_task_ctx *ctx, int phase) {
    nb_ctx c = ctx ? ctx : CTX(m);
    int slot = m->emb.next;
    NB_CHECK(slot >= 0, "this is a bug in nobubble; please report it", "seqctr: a next-batch phase without a next batch");
    switch (phase) {
    case NB_SC_FWD_UPLOAD: nb_sc_upload_slot(m, c, slot); break;
    case NB_SC_EMB_SERVE: nb_emb_serve_rows(&m->emb, c, slot, 1); break;
    case NB_SC_FETCH_APPLY: nb_emb_fetch_apply(&m->emb, c, slot); break;
    case NB_SC_RESYNC_SERVE: nb_emb_resync_serve(&m->emb, c, slot); break;
    case NB_SC_RESYNC_APPLY: nb_emb_resync_apply(&m->emb, c, slot); break;
    default: NB_ASSERT(!"not a next-batch phase");
    }
}

/* The oldest prepared batch becomes the step's. */
void nb_sc_begin_step(nb_sc_model *m) { nb_sc_use_slot(m, nb_emb_pop(&m->emb)); }

