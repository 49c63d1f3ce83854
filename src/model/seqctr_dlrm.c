/* seqctr's DLRM form (seqctr.h: cfg.ntop >= 1, MLPerf's DLRM-DCNv2): the crosses on xd = [bottom |
 * the categorical slots] and the top MLP, in place of seqctr's blocks and heads. It is one segment
 * (no --detach): its forward and backward are the segment phases of seqctr.c, so every schedule
 * runs it through the same phases, lanes and embedding exchange. */
#include "core.h"
#include "model/seqctr_internal.h"
#include "ops/backend_ctr.h"

void nb_sc_dlrm_fwd(nb_sc_model *m, nb_ctx c) {
    nb_sc_acts *a = m->acts;
    const nb_sc_stage *s = m->stage;
    const nb_backend_i *be = m->be;
    const nb_ctr_ops_i *co = m->co;
    const nb_sc_config *cf = &m->cfg;
    int B = s->B, Dx = dlrm_dx(m), r = cf->cross_rank, last = cf->blocks - 1;
    co->copy_cols(c, a->xd, Dx, a->x0, m->D0, B, Dx);
    for (int i = 0; i < cf->blocks; i++) {
        const nb_sc_block_view *w = &m->w.block[i];
        co->cross_fwd(c, a->xs[i], a->vx[i], a->u[i], a->xd, i ? a->xs[i - 1] : a->xd, w->U, w->V, w->b, B, Dx, r);
    }
    const void *in = a->xs[last];
    int nin = Dx;
    for (int j = 0; j < cf->ntop; j++) {
        be->matmul_fwd(c, a->top[j], in, m->w.top_w[j], m->w.top_b[j], B, nin, cf->top[j]);
        co->relu_fwd(c, a->top[j], a->top[j], (size_t)B * cf->top[j]);
        in = a->top[j], nin = cf->top[j];
    }
    co->linear1_fwd(c, a->logit[last], in, m->w.top_w[cf->ntop], m->w.top_b[cf->ntop], B, nin);
    if (s->has_label) {
        be->zero(c, a->dz[last], (size_t)B * sizeof(float));
        co->bce(c, a->dz[last], m->d_loss, a->logit[last], s->d_label, B, 1.0f / (m->loss_den > 0 ? m->loss_den : (float)B));
    }
}

/* din = dout @ w (written), dw and db += as matmul_bwd: the backend's writing variant where it has
 * one (CUDA bf16), else a zeroed din accumulated into. */
static void matmul_bwd_into(const nb_backend_i *be, nb_ctx c, void *din, void *dw, void *db, const void *dout,
                            const void *in, const void *w, int B, int nin, int nout, size_t es) {
    if (be->matmul_bwd_set) {
        be->matmul_bwd_set(c, din, dw, db, dout, in, w, B, nin, nout);
        return;
    }
    be->zero(c, din, (size_t)B * nin * es);
    be->matmul_bwd(c, din, dw, db, dout, in, w, B, nin, nout);
}

/* The top MLP's backward: the gradient of the last cross's output into g->dcur. */
static void top_bwd(nb_sc_model *m, nb_ctx c, seg_scratch *g) {
    nb_sc_acts *a = m->acts;
    const nb_backend_i *be = m->be;
    const nb_sc_config *cf = &m->cfg;
    int B = m->stage->B, Dx = dlrm_dx(m), nt = cf->ntop, last = cf->blocks - 1;
    size_t es = act_es(m);
    const void *in = nt ? a->top[nt - 1] : a->xs[last];
    int nin = nt ? cf->top[nt - 1] : Dx;
    void *din = nt ? a->dt : g->dcur;
    be->zero(c, din, (size_t)B * nin * es);
    m->co->linear1_bwd(c, din, m->dw.top_w[nt], m->dw.top_b[nt], a->dz[last], in, m->w.top_w[nt], B, nin);
    for (int j = nt - 1; j >= 0; j--) { /* a->dt holds the gradient of top[j] (after its ReLU) */
        be->zero(c, a->dtp, (size_t)B * cf->top[j] * es);
        m->co->relu_bwd(c, a->dtp, a->top[j], a->dt, (size_t)B * cf->top[j]);
        in = j ? a->top[j - 1] : a->xs[last];
        nin = j ? cf->top[j - 1] : Dx;
        din = j ? a->dt : g->dcur;
        matmul_bwd_into(be, c, din, m->dw.top_w[j], m->dw.top_b[j], a->dtp, in, m->w.top_w[j], B, nin, cf->top[j], es);
    }
}

/* Top MLP, then the crosses from the last down; xd's gradient lands in x0's first Dx columns
 * (the region the embedding rows' gradients are summed from; embedding_fwd zeroed it). */
void nb_sc_dlrm_bwd(nb_sc_model *m, nb_ctx c) {
    nb_sc_acts *a = m->acts;
    seg_scratch *g = &a->seg[0];
    const nb_backend_i *be = m->be;
    const nb_sc_config *cf = &m->cfg;
    NB_CHECK(m->stage->has_label, "pass labels to the forward before a backward", "seqctr backward without labels");
    int B = m->stage->B, Dx = dlrm_dx(m), r = cf->cross_rank;
    size_t BD = (size_t)B * Dx, es = act_es(m);
    top_bwd(m, c, g);
    be->zero(c, a->dxd, BD * es);
    for (int i = cf->blocks - 1; i >= 0; i--) {
        const nb_sc_block_view *w = &m->w.block[i], *dw = &m->dw.block[i];
        m->co->cross_bwd(c, a->dxd, g->dprev, dw->U, dw->V, dw->b, g->dcur, a->xd, i ? a->xs[i - 1] : a->xd, w->U, w->V,
                         w->b, a->vx[i], a->u[i], B, Dx, r);
        void *t = g->dcur;
        g->dcur = g->dprev;
        g->dprev = t;
    }
    be->add_inplace(c, a->dxd, g->dcur, BD); /* cross 0's x_prev is xd itself */
    m->co->copy_cols(c, a->dx0, m->D0, a->dxd, Dx, B, Dx);
}
