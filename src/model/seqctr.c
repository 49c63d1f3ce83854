/* seqctr's math on any backend (see seqctr.h for the model and the tensor names): the step's
 * phases over the typed views (nb_sc_view) and the batch's index lists (seqctr_batch.c), and the
 * optimizers. A phase only gathers, computes and scatters: which rows a batch reads, where they
 * come from and where their gradients go is the embedding module's (emb/emb.h). */
#include <math.h>
#include <string.h>

#include "core.h"
#include "model/seqctr_internal.h"
#include "ops/backend_ctr.h"
#include "optim/optim.h"

static void encoder_fwd(nb_sc_model *m, nb_ctx c, int l, int N) {
    const nb_sc_enc_view *w = &m->w.hist[l];
    nb_sc_acts *a = m->acts;
    const nb_backend_i *be = m->be;
    enc_acts *e = &a->enc[l];
    int E = m->cfg.E;
    void *hin = a->h[l], *hout = a->h[l + 1];
    be->layernorm_fwd(c, e->ln1, e->mean1, e->rstd1, hin, w->ln1_w, w->ln1_b, N, E, LN_EPS);
    be->matmul_fwd(c, e->qkv, e->ln1, w->qkv_w, w->qkv_b, N, E, 3 * E);
    m->co->seqattn_fwd(c, e->att, e->lse, e->qkv, m->stage->d_off, m->stage->B, m->cfg.max_len, m->cfg.heads, E);
    be->matmul_fwd(c, hout, e->att, w->proj_w, w->proj_b, N, E, E);
    be->residual_fwd(c, e->x1, hin, hout, (size_t)N * E);
    be->layernorm_fwd(c, e->ln2, e->mean2, e->rstd2, e->x1, w->ln2_w, w->ln2_b, N, E, LN_EPS);
    be->matmul_fwd(c, e->f1, e->ln2, w->fc1_w, w->fc1_b, N, E, 4 * E);
    m->co->relu_fwd(c, e->f1, e->f1, (size_t)N * 4 * E);
    be->matmul_fwd(c, hout, e->f1, w->fc2_w, w->fc2_b, N, 4 * E, E);
    be->residual_fwd(c, hout, e->x1, hout, (size_t)N * E);
}

/* dh: gradient of encoder layer l's output in, of its input out (in place). */
static void encoder_bwd(nb_sc_model *m, nb_ctx c, int l, int N, void *dh) {
    const nb_sc_enc_view *w = &m->w.hist[l], *dw = &m->dw.hist[l];
    nb_sc_acts *a = m->acts;
    const nb_backend_i *be = m->be;
    enc_acts *e = &a->enc[l];
    int E = m->cfg.E;
    size_t NE = (size_t)N * E, es = act_es(m);
    m->co->copy_cols(c, a->dx1, E, dh, E, N, E);
    be->zero(c, a->df1, NE * 4 * es);
    be->matmul_bwd(c, a->df1, dw->fc2_w, dw->fc2_b, dh, e->f1, w->fc2_w, N, 4 * E, E);
    be->zero(c, a->df1p, NE * 4 * es);
    m->co->relu_bwd(c, a->df1p, e->f1, a->df1, NE * 4);
    be->zero(c, a->dln, NE * es);
    be->matmul_bwd(c, a->dln, dw->fc1_w, dw->fc1_b, a->df1p, e->ln2, w->fc1_w, N, E, 4 * E);
    be->layernorm_bwd(c, a->dx1, dw->ln2_w, dw->ln2_b, a->dln, e->x1, w->ln2_w, e->mean2, e->rstd2, N, E);
    m->co->copy_cols(c, dh, E, a->dx1, E, N, E);
    be->zero(c, a->datt, NE * es);
    be->matmul_bwd(c, a->datt, dw->proj_w, dw->proj_b, a->dx1, e->att, w->proj_w, N, E, E);
    be->zero(c, a->dqkv, NE * 3 * es);
    m->co->seqattn_bwd(c, a->dqkv, a->datt, e->qkv, e->att, e->lse, m->stage->d_off, m->stage->B, m->cfg.max_len,
                       m->cfg.heads, E);
    be->zero(c, a->dln, NE * es);
    be->matmul_bwd(c, a->dln, dw->qkv_w, dw->qkv_b, a->dqkv, e->ln1, w->qkv_w, N, E, 3 * E);
    be->layernorm_bwd(c, dh, dw->ln1_w, dw->ln1_b, a->dln, a->h[l], w->ln1_w, e->mean1, e->rstd1, N, E);
}

static void bottom_fwd(nb_sc_model *m, nb_ctx c, int B) {
    const nb_sc_bottom_view *w = &m->w.bottom;
    nb_sc_acts *a = m->acts;
    const nb_backend_i *be = m->be;
    int E = m->cfg.E;
    const void *dense = m->stage->d_dense;
    if (a->dense) {
        be->cast_params(c, a->dense, m->stage->d_dense, (size_t)B * m->cfg.ndense);
        dense = a->dense;
    }
    be->matmul_fwd(c, a->a1, dense, w->weight[0], w->bias[0], B, m->cfg.ndense, NB_SC_BOTTOM1);
    m->co->relu_fwd(c, a->a1, a->a1, (size_t)B * NB_SC_BOTTOM1);
    be->matmul_fwd(c, a->a2, a->a1, w->weight[1], w->bias[1], B, NB_SC_BOTTOM1, NB_SC_BOTTOM2);
    m->co->relu_fwd(c, a->a2, a->a2, (size_t)B * NB_SC_BOTTOM2);
    be->matmul_fwd(c, a->bot, a->a2, w->weight[2], w->bias[2], B, NB_SC_BOTTOM2, E);
    if (nb_sc_dlrm(&m->cfg)) m->co->relu_fwd(c, a->bot, a->bot, (size_t)B * E); /* torchrec's DenseArch */
}

static void bottom_bwd(nb_sc_model *m, nb_ctx c, int B) {
    const nb_sc_bottom_view *w = &m->w.bottom, *dw = &m->dw.bottom;
    nb_sc_acts *a = m->acts;
    const nb_backend_i *be = m->be;
    int E = m->cfg.E;
    size_t es = act_es(m);
    const void *dense = a->dense ? a->dense : (const void *)m->stage->d_dense;
    const void *dbot = a->dbot;
    if (nb_sc_dlrm(&m->cfg)) { /* through the output's ReLU */
        be->zero(c, a->dbotp, (size_t)B * E * es);
        m->co->relu_bwd(c, a->dbotp, a->bot, a->dbot, (size_t)B * E);
        dbot = a->dbotp;
    }
    be->zero(c, a->da2, (size_t)B * NB_SC_BOTTOM2 * es);
    be->matmul_bwd(c, a->da2, dw->weight[2], dw->bias[2], dbot, a->a2, w->weight[2], B, NB_SC_BOTTOM2, E);
    be->zero(c, a->da2p, (size_t)B * NB_SC_BOTTOM2 * es);
    m->co->relu_bwd(c, a->da2p, a->a2, a->da2, (size_t)B * NB_SC_BOTTOM2);
    be->zero(c, a->da1, (size_t)B * NB_SC_BOTTOM1 * es);
    be->matmul_bwd(c, a->da1, dw->weight[1], dw->bias[1], a->da2p, a->a1, w->weight[1], B, NB_SC_BOTTOM1,
                   NB_SC_BOTTOM2);
    be->zero(c, a->da1p, (size_t)B * NB_SC_BOTTOM1 * es);
    m->co->relu_bwd(c, a->da1p, a->a1, a->da1, (size_t)B * NB_SC_BOTTOM1);
    be->matmul_bwd(c, NULL, dw->weight[0], dw->bias[0], a->da1p, dense, w->weight[0], B, m->cfg.ndense, NB_SC_BOTTOM1);
}

/* Whether head i contributes to the loss. */
static int head_used(const nb_sc_model *m, int i) { return i == m->cfg.blocks - 1 || m->cfg.aux_weight > 0; }

/* Multi-valued columns: each column's pool into its slot (which the slot's own lookup gave the first
 * value), the other values' table rows read where they are. The averaged columns' gradient rows
 * are zeroed here too (a summed column's values read their slot's gradient: no rows of their own). */
static void mv_fwd(nb_sc_model *m, nb_ctx c) {
    nb_sc_acts *a = m->acts;
    nb_sc_stage *s = m->stage;
    const nb_sc_config *cf = &m->cfg;
    int B = s->B, E = cf->E, nmv = nb_sc_nmv(cf);
    const int64_t *vrows = s->d_rows + (size_t)B * NLK_PER_SAMPLE(cf); /* the lookups past the firsts */
    if (s->nmv_vals > 0 && a->dmv) m->be->zero(c, a->dmv, (size_t)s->nmv_vals * E * act_es(m));
    m->be->zero(c, AT(m, a->dsrc, a->zero_src), (size_t)E * act_es(m));
    for (int f = 0, j = 0; f < cf->ncat; f++)
        if (cf->pool[f] != NB_SC_POOL_NONE) {
            m->co->mvpool_fwd(c, AT(m, a->x0, (size_t)(1 + f) * E), m->D0, nb_emb_lookup_table(&m->emb), vrows,
                              s->d_mvb + j, s->d_moff + j, nmv, B, E, cf->pool[f] == NB_SC_POOL_MEAN);
            j++;
        }
}

/* x0 = [bottom | ncat categorical | target | (pooled, later)] and the target embedding. */
static void embedding_fwd(nb_sc_model *m, nb_ctx c) {
    nb_sc_acts *a = m->acts;
    nb_sc_stage *s = m->stage;
    const nb_ctr_ops_i *co = m->co;
    int B = s->B, E = m->cfg.E, D0 = m->D0;
    if (nb_emb_first_part(&m->emb)) m->be->zero(c, m->d_loss, sizeof(double)); /* a window's parts add up their losses */
    /* the gradient region is zeroed here, on the forward's lane, so that the segments' backward
     * passes (on any lane, after their forward) can accumulate into it */
    m->be->zero(c, a->dsrc, ((size_t)m->max_batch * (D0 + E) + (size_t)s->nh * E) * act_es(m));
    bottom_fwd(m, c, B);
    co->copy_cols(c, a->x0, D0, a->bot, E, B, E);
    co->emb_gather(c, a->x0, s->d_dst, nb_emb_lookup_table(&m->emb), s->d_rows, B * nb_sc_ntables(&m->cfg), E);
    if (nb_sc_nmv(&m->cfg)) mv_fwd(m, c);
    co->copy_cols(c, a->temb, E, AT(m, a->x0, (size_t)(1 + m->cfg.ncat) * E), D0, B, E);
}

/* The history encoder and target attention: pooled into x0. */
static void history_fwd(nb_sc_model *m, nb_ctx c) {
    nb_sc_acts *a = m->acts;
    nb_sc_stage *s = m->stage;
    const nb_backend_i *be = m->be;
    const nb_ctr_ops_i *co = m->co;
    const nb_sc_config *cf = &m->cfg;
    int B = s->B, E = cf->E, D0 = m->D0, nh = s->nh;
    if (nh > 0) {
        size_t first = (size_t)B * NLK_PER_SAMPLE(cf) + (size_t)s->nmv;
        co->emb_gather(c, a->h[0], s->d_dst + first, nb_emb_lookup_table(&m->emb), s->d_rows + first, nh, E);
        for (int l = 0; l < cf->hist_layers; l++) encoder_fwd(m, c, l, nh);
        be->matmul_fwd(c, a->q, a->temb, m->w.target.wq, NULL, B, E, E);
        be->matmul_fwd(c, a->kv, a->h[cf->hist_layers], m->w.target.wk, NULL, nh, E, 2 * E);
        co->targetattn_fwd(c, a->pooled, a->attn, a->q, a->kv, AT(m, a->kv, (size_t)E), s->d_off, B, cf->max_len, E,
                           2 * E);
    } else {
        be->zero(c, a->pooled, (size_t)B * E * act_es(m));
    }
    co->copy_cols(c, AT(m, a->x0, (size_t)(cf->ncat + 2) * E), D0, a->pooled, E, B, E);
}

/* Blocks seg_first[k] .. seg_first[k+1]-1, their heads and losses. */
static void segment_fwd(nb_sc_model *m, nb_ctx c, int k) {
    nb_sc_acts *a = m->acts;
    nb_sc_stage *s = m->stage;
    const nb_backend_i *be = m->be;
    const nb_ctr_ops_i *co = m->co;
    const nb_sc_config *cf = &m->cfg;
    int B = s->B, D0 = m->D0;
    int r = cf->cross_rank, H = cf->block_hidden, last = cf->blocks - 1;
    if (nb_sc_dlrm(cf)) {
        nb_sc_dlrm_fwd(m, c);
        return;
    }
    for (int i = m->seg_first[k]; i < m->seg_first[k + 1]; i++) {
        const nb_sc_block_view *w = &m->w.block[i];
        const void *xprev = i ? a->xs[i - 1] : a->x0;
        co->cross_fwd(c, a->c[i], a->vx[i], a->u[i], a->x0, xprev, w->U, w->V, w->b, B, D0, r);
        be->matmul_fwd(c, a->hid[i], a->c[i], w->w1, w->b1, B, D0, H);
        co->relu_fwd(c, a->hid[i], a->hid[i], (size_t)B * H);
        be->matmul_fwd(c, a->xs[i], a->hid[i], w->w2, w->b2, B, H, D0);
        be->residual_fwd(c, a->xs[i], a->xs[i], a->c[i], (size_t)B * D0);
        co->linear1_fwd(c, a->logit[i], a->xs[i], w->head_w, w->head_b, B, D0);
        if (s->has_label && head_used(m, i)) {
            float scale = (i == last ? 1.0f : cf->aux_weight) / (m->loss_den > 0 ? m->loss_den : (float)B);
            be->zero(c, a->dz[i], (size_t)B * sizeof(float));
            co->bce(c, a->dz[i], m->d_loss, a->logit[i], s->d_label, B, scale);
        }
    }
}

void nb_sc_forward_phases(nb_sc_model *m, nb_ctx c) {
    nb_sc_upload_slot(m, c, m->emb.cur);
    embedding_fwd(m, c);
    history_fwd(m, c);
    for (int k = 0; k < m->nseg; k++) segment_fwd(m, c, k);
}

void nb_sc_forward_enqueue(nb_sc_model *m) {
    nb_sc_begin_step(m);
    nb_sc_forward_phases(m, CTX(m));
}

double nb_sc_loss(nb_sc_model *m) {
    double loss;
    m->be->to_host(CTX(m), &loss, m->d_loss, sizeof loss);
    return loss;
}

void nb_sc_logits(nb_sc_model *m, float *logits) {
    m->be->to_host(CTX(m), logits, m->acts->logit[m->cfg.blocks - 1], (size_t)m->stage->B * sizeof(float));
}

/* In the third stage: a training batch prepared ahead stays prepared. */
double nb_sc_forward(nb_sc_model *m, const nb_sc_batch *b, float *logits) {
    nb_sc_check_batch(m, b);
    NB_CHECK(!sharded(m), "this is a bug in nobubble; please report it",
             "nb_sc_forward on a sharded model (its rows come from the owners: nb_sc_prepare_aside)");
    nb_sc_prepare_into(m, b, NB_SC_RING);
    nb_sc_use_slot(m, NB_SC_RING);
    nb_sc_forward_phases(m, CTX(m));
    if (logits) nb_sc_logits(m, logits);
    return b->label ? nb_sc_loss(m) : 0.0;
}

/* Backward of segment k, from its heads down to its first block; a segment that starts at block
 * 0 sends its last dx_prev to x0 (block 0 reads x0), a detached one drops it. Writes only the
 * segment's parameter gradients and its own scratch and dx0 share. */
static void segment_bwd(nb_sc_model *m, nb_ctx c, int k) {
    nb_sc_acts *a = m->acts;
    seg_scratch *g = &a->seg[k];
    const nb_backend_i *be = m->be;
    const nb_ctr_ops_i *co = m->co;
    const nb_sc_config *cf = &m->cfg;
    if (nb_sc_dlrm(cf)) {
        nb_sc_dlrm_bwd(m, c);
        return;
    }
    NB_CHECK(m->stage->has_label, "pass labels to the forward before a backward", "seqctr backward without labels");
    int B = m->stage->B, D0 = m->D0, r = cf->cross_rank, H = cf->block_hidden;
    int first = m->seg_first[k], end = m->seg_first[k + 1];
    size_t BD = (size_t)B * D0, es = act_es(m);
    if (k) be->zero(c, g->dx0, BD * es);
    be->zero(c, g->dcur, BD * es);
    for (int i = end - 1; i >= first; i--) {
        const nb_sc_block_view *w = &m->w.block[i], *dw = &m->dw.block[i];
        if (head_used(m, i)) co->linear1_bwd(c, g->dcur, dw->head_w, dw->head_b, a->dz[i], a->xs[i], w->head_w, B, D0);
        co->copy_cols(c, g->dc, D0, g->dcur, D0, B, D0);
        be->zero(c, g->dhid, (size_t)B * H * es);
        be->matmul_bwd(c, g->dhid, dw->w2, dw->b2, g->dcur, a->hid[i], w->w2, B, H, D0);
        be->zero(c, g->dhidp, (size_t)B * H * es);
        co->relu_bwd(c, g->dhidp, a->hid[i], g->dhid, (size_t)B * H);
        be->matmul_bwd(c, g->dc, dw->w1, dw->b1, g->dhidp, a->c[i], w->w1, B, D0, H);
        const void *xprev = i ? a->xs[i - 1] : a->x0;
        int keep_prev = i > first || first == 0; /* the detached input's gradient is not needed */
        co->cross_bwd(c, g->dx0, keep_prev ? g->dprev : NULL, dw->U, dw->V, dw->b, g->dc, a->x0, xprev, w->U, w->V,
                      w->b, a->vx[i], a->u[i], B, D0, r);
        if (keep_prev) {
            void *t = g->dcur;
            g->dcur = g->dprev;
            g->dprev = t;
        }
    }
    if (first == 0) be->add_inplace(c, g->dx0, g->dcur, BD); /* block 0's x_prev is x0 itself */
}

/* x0's gradient = the segments' shares in segment order; then its bottom and pooled slices. */
static void join_bwd(nb_sc_model *m, nb_ctx c) {
    nb_sc_acts *a = m->acts;
    int B = m->stage->B, E = m->cfg.E, D0 = m->D0;
    for (int k = 1; k < m->nseg; k++) m->be->add_inplace(c, a->dx0, a->seg[k].dx0, (size_t)B * D0);
    m->co->copy_cols(c, a->dbot, E, a->dx0, D0, B, E);
    m->co->copy_cols(c, a->dpooled, E, AT(m, a->dx0, (size_t)(m->cfg.ncat + 2) * E), D0, B, E);
    /* averaged columns: each slot's gradient, scaled, to its values' rows (dmv; the first value's
     * stays in the slot). A summed column's values read the slot's gradient as it is (lists_mv). */
    const nb_sc_config *cf = &m->cfg;
    int nmv = nb_sc_nmv(cf);
    for (int f = 0, j = 0; f < cf->ncat && nmv; f++) {
        if (cf->pool[f] == NB_SC_POOL_MEAN)
            m->co->mvpool_bwd(c, a->dmv, AT(m, a->dx0, (size_t)(1 + f) * E), D0, m->stage->d_moff + j, nmv, B, E, 1);
        j += cf->pool[f] != NB_SC_POOL_NONE;
    }
}

static void history_bwd(nb_sc_model *m, nb_ctx c) {
    nb_sc_acts *a = m->acts;
    nb_sc_stage *s = m->stage;
    const nb_backend_i *be = m->be;
    const nb_sc_config *cf = &m->cfg;
    int B = s->B, E = cf->E, nh = s->nh;
    if (nh == 0) return;
    size_t es = act_es(m), NE = (size_t)nh * E;
    be->zero(c, a->dq, (size_t)B * E * es);
    be->zero(c, a->dkv, NE * 2 * es);
    m->co->targetattn_bwd(c, a->dq, a->dkv, AT(m, a->dkv, (size_t)E), a->dpooled, a->q, a->kv, AT(m, a->kv, (size_t)E),
                          a->attn, s->d_off, B, cf->max_len, E, 2 * E);
    be->matmul_bwd(c, a->dtemb, m->dw.target.wq, NULL, a->dq, a->temb, m->w.target.wq, B, E, E);
    be->matmul_bwd(c, a->dh, m->dw.target.wk, NULL, a->dkv, a->h[cf->hist_layers], m->w.target.wk, nh, E, 2 * E);
    for (int l = cf->hist_layers - 1; l >= 0; l--) encoder_bwd(m, c, l, nh, a->dh);
}

/* Device lists: the unique rows' count is on the device, and the lookups bound it. */
static const int32_t *dev_count(const nb_sc_model *m, const nb_sc_stage *s) { return m->dev_lists ? s->d_count : NULL; }
static int rows_bound(const nb_sc_model *m, const nb_sc_stage *s) { return m->dev_lists ? s->nlk_real : s->nuniq; }
/* The lookups' bound with the history padding: the same for every batch of a captured graph's
 * bucket (the chunk sums' scratch is sized by it) */
static int lookups_bound(const nb_sc_stage *s) { return s->nlk; }

/* The embedding rows: one dedup over all lookups, so an item row's target and history
 * gradients are summed. */
static void embedding_bwd(nb_sc_model *m, nb_ctx c) {
    nb_sc_stage *s = m->stage;
    m->co->emb_grad_unique(c, m->d_uniq_grads, m->acts->dsrc, s->d_src, s->d_order, s->d_seg, dev_count(m, s),
                           rows_bound(m, s), lookups_bound(s), m->cfg.E);
}

/* The same gradient, each row applied by element-wise Adagrad as it completes (no pass that writes
 * the [U, E] gradient and another that reads it back): nb_emb_update's exact_adagrad, same bits. */
static void embedding_bwd_update(nb_sc_model *m, nb_ctx c, const nb_sc_optim *o) {
    nb_sc_stage *s = m->stage;
    nb_emb *e = &m->emb;
    NB_CHECK(!nb_emb_sharded(e) && o->emb_exact && e->d_avg_sq, "this is a bug in nobubble; please report it",
             "the fused embedding update needs unsharded tables with element-wise Adagrad");
    m->co->emb_grad_adagrad(c, e->d_table, e->d_avg_sq, s->d_uniq, m->d_uniq_grads, m->acts->dsrc, s->d_src,
                            s->d_order, s->d_seg, dev_count(m, s), rows_bound(m, s), lookups_bound(s), m->cfg.E, o->emb_lr,
                            o->emb_eps);
}

void nb_sc_backward_enqueue(nb_sc_model *m) {
    nb_ctx c = CTX(m);
    for (int k = m->nseg - 1; k >= 0; k--) segment_bwd(m, c, k);
    join_bwd(m, c);
    history_bwd(m, c);
    bottom_bwd(m, c, m->stage->B);
    embedding_bwd(m, c);
}

void nb_sc_backward(nb_sc_model *m, const nb_sc_batch *b) {
    (void)b;
    nb_sc_backward_enqueue(m);
    if (!on_cpu(m)) nb_sc_to_host(m);
}

/* The rows the step touched (sharded: once per window, the owner's rows). */
static void optim_emb(nb_sc_model *m, nb_ctx c, const nb_sc_optim *o, int t) {
    const nb_sc_stage *s = m->stage;
    nb_emb_optim eo = {o->emb_lr, o->beta1, o->beta2, o->emb_eps, o->emb_adam, o->emb_exact};
    nb_emb_update(&m->emb, c, &eo, t, s->d_uniq, m->d_uniq_grads, dev_count(m, s), rows_bound(m, s));
}

void nb_sc_optim_prepare(nb_sc_model *m, const nb_sc_optim *o, int t) {
    nb_adamw_scalars *k = m->h_k;
    if (o->dense_adagrad) { /* the kernel reads the rate and eps from here, like AdamW's scalars */
        k[0] = k[1] = (nb_adamw_scalars){.neg_step = -o->lr, .eps = o->eps};
        return;
    }
    k[0] = nb_adamw_prepare((nb_adamw_cfg){o->lr, o->beta1, o->beta2, o->eps, o->weight_decay}, t);
    k[1] = nb_adamw_prepare((nb_adamw_cfg){o->lr, o->beta1, o->beta2, o->eps, 0.0f}, t);
}

/* Every dense tensor in one AdamW pass (the same bits as one call per tensor), its scalars from
 * backend memory (a captured graph copies them in), clipped by the dense gradient's global norm
 * when o->grad_clip > 0 (padding between tensors holds zeros: the whole slab gives the norm). */
static void optim_dense(nb_sc_model *m, nb_ctx c, const nb_sc_optim *o) {
    const nb_backend_i *be = m->be;
    if (m->d_k != m->h_k) be->to_backend(c, m->d_k, m->h_k, 2 * sizeof(nb_adamw_scalars));
    if (o->dense_adagrad) { /* the accumulators live in the first moment's buffer */
        m->co->adagrad_dense(c, m->d_params, m->d_grads, m->d_am, m->d_w != (void *)m->d_params ? m->d_w : NULL, m->nparams,
                             m->d_k);
        return;
    }
    double *sumsq = o->grad_clip > 0 ? m->d_loss + 1 : NULL;
    if (sumsq) be->sumsq_f64(c, sumsq, m->d_grads, m->nparams);
    void *lowp = m->d_w != (void *)m->d_params ? m->d_w : NULL;
    be->adamw_spans(c, m->d_params, m->d_grads, m->d_am, m->d_av, lowp, m->spans, m->ntensors, m->d_k, sumsq, o->grad_clip);
}

void nb_sc_optim_enqueue(nb_sc_model *m, const nb_sc_optim *o, int t) {
    nb_ctx c = CTX(m);
    nb_sc_optim_prepare(m, o, t);
    optim_emb(m, c, o, t);
    optim_dense(m, c, o);
}

void nb_sc_zero_grads(nb_sc_model *m) { m->be->zero(CTX(m), m->d_grads, m->nparams * sizeof(float)); }

static const char *PHASE_NAMES[NB_SC_NPHASES] = {
    "batch upload", "embedding serve", "embedding fwd", "history fwd",  "dense fwd",    "dense bwd",
    "join bwd",     "history bwd",     "bottom bwd",    "dense optim",  "embedding bwd", "embedding sum",
    "resync serve", "resync apply",    "embedding optim", "rows apply"};

const char *nb_sc_phase_name(nb_sc_phase p) { return p >= 0 && p < NB_SC_NPHASES ? PHASE_NAMES[p] : "?"; }

void nb_sc_enqueue_phase(nb_sc_model *m, const nb_task_ctx *ctx, nb_sc_phase p, int seg, const nb_sc_optim *o,
                         int t) {
    nb_ctx c = ctx ? ctx : CTX(m);
    NB_ASSERT(seg >= 0 && seg < m->nseg);
    switch (p) {
    case NB_SC_FWD_UPLOAD: nb_sc_upload_slot(m, c, m->emb.cur); break;
    case NB_SC_EMB_SERVE: nb_emb_serve_rows(&m->emb, c, m->emb.cur, 0); break;
    case NB_SC_EMB_SUM: nb_emb_sum(&m->emb, c); break;
    case NB_SC_FWD_EMB: embedding_fwd(m, c); break;
    case NB_SC_FWD_HIST: history_fwd(m, c); break;
    case NB_SC_FWD_SEG: segment_fwd(m, c, seg); break;
    case NB_SC_BWD_SEG: segment_bwd(m, c, seg); break;
    case NB_SC_BWD_JOIN: join_bwd(m, c); break;
    case NB_SC_BWD_HIST: history_bwd(m, c); break;
    case NB_SC_BWD_BOTTOM: bottom_bwd(m, c, m->stage->B); break;
    case NB_SC_BWD_EMB:
        if (m->emb_update_in_bwd) embedding_bwd_update(m, c, o);
        else embedding_bwd(m, c);
        break;
    case NB_SC_OPT_EMB:
        NB_ASSERT(!m->emb_update_in_bwd); /* the trainer leaves this phase out then */
        optim_emb(m, c, o, t);
        break;
    case NB_SC_OPT_DENSE: optim_dense(m, c, o); break;
    case NB_SC_RESYNC_SERVE: /* the next batch's (nothing without one) */
    case NB_SC_RESYNC_APPLY:
    case NB_SC_FETCH_APPLY:
        if (m->emb.next >= 0) nb_sc_enqueue_next_phase(m, c, p);
        break;
    default: NB_ASSERT(0);
    }
}

double nb_sc_flops(const nb_sc_model *m, int B, long nh) {
    const nb_sc_config *c = &m->cfg;
    double E = c->E, D0 = m->D0, r = c->cross_rank, H = c->block_hidden;
    double bottom = (double)B * ((double)c->ndense * NB_SC_BOTTOM1 + NB_SC_BOTTOM1 * NB_SC_BOTTOM2 + NB_SC_BOTTOM2 * E);
    if (nb_sc_dlrm(c)) { /* the crosses' two rank-r products and the top MLP */
        double Dx = dlrm_dx(m), top = 0, in = Dx;
        for (int j = 0; j <= c->ntop; j++) {
            double out = j < c->ntop ? c->top[j] : 1;
            top += in * out;
            in = out;
        }
        return 6.0 * (bottom + (double)B * (c->blocks * 2 * Dx * r + top));
    }
    double enc = (double)nh * c->hist_layers * (3 * E * E + E * E + 8 * E * E) + (double)nh * 2 * E * E + (double)B * E * E;
    double blocks = (double)B * c->blocks * (2 * D0 * r + 2 * D0 * H + D0);
    return 6.0 * (bottom + enc + blocks); /* 2 FLOPs per MAC, forward + 2x backward */
}

