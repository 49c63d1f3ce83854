/* seqctr's tensors and memory (see seqctr.h for the model and the tensor names): the tensor table
 * and its typed views, the memory plan, initialization, host <-> backend copies, save and load.
 *
 * Memory: one layout walk, run twice (nb_arena_take): first it plans the bytes of each arena,
 * then, once the run has allocated them, it binds the same offsets as views. The tables and their
 * exchange buffers are laid out by the embedding module (emb/emb.c) in the same walk. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "io/safetensors.h"
#include "model/seqctr_internal.h"
#include "ops/backend_ctr.h"
#include "optim/optim.h"
#include "rng.h"

void nb_sc_config_default(nb_sc_config *c) {
    memset(c, 0, sizeof *c);
    c->E = 64;
    c->hist_layers = 1;
    c->heads = 4;
    c->blocks = 6;
    c->cross_rank = 256;
    c->block_hidden = 512;
    c->max_len = 256;
    c->ndense = NB_SC_STD_NDENSE;
    c->ncat = NB_SC_STD_NCAT;
    for (int f = 0; f < NB_SC_MAX_CAT; f++) c->cat_rows[f] = 1;
    c->item_rows = 1;
    c->aux_weight = 0;
    c->seed = 1;
}

/* init kinds of add_tensor */
enum { INIT_ZERO, INIT_ONE, INIT_FANIN };

/* The dense tensors of a config: walk_tensors' count (bottom 6, 12 per history layer, target 3,
 * 9 per block), so the table is sized to the model, not to a guess. */
static int tensor_count(const nb_sc_config *c) {
    if (nb_sc_dlrm(c)) return 6 + 3 * c->blocks + 2 * (c->ntop + 1); /* bottom, crosses, top MLP */
    return 6 + 12 * c->hist_layers + 3 + 9 * c->blocks;
}

static void add_tensor(nb_sc_model *m, int kind, int rows, int cols, const char *fmt, int idx) {
    NB_ASSERT(m->ntensors < tensor_count(&m->cfg));
    nb_sc_tensor *t = &m->t[m->ntensors];
    snprintf(t->name, sizeof t->name, fmt, idx);
    t->rows = rows;
    t->cols = cols;
    t->n = (size_t)rows * (size_t)cols;
    t->off = m->nparams;
    t->decay = cols > 1;
    m->init_kind[m->ntensors++] = (unsigned char)kind;
    /* 64-element (128-byte in bf16) alignment: GEMMs and vector loads want aligned weights */
    m->nparams += (t->n + 63) / 64 * 64;
    m->nparams_used += t->n;
}

/* One walk over the dense tensors in slab order. Planning (slab NULL) it builds the tensor table:
 * names, shapes, init kinds, offsets; binding it points each field of a view at its tensor in a
 * slab. The table and the views come from the same lines, so they cannot drift apart. */
typedef struct {
    nb_sc_model *m;
    nb_sc_view *v;
    char *slab; /* NULL: the planning walk */
    size_t es;  /* the slab's element size */
    int i;
} tensor_walk;

static void tensor(tensor_walk *k, void **field, int kind, int rows, int cols, const char *fmt, int idx) {
    if (!k->slab) add_tensor(k->m, kind, rows, cols, fmt, idx);
    *field = k->slab ? k->slab + k->m->t[k->i].off * k->es : NULL;
    k->i++;
}

/* The DLRM form's tensors after the bottom MLP: the crosses on xd, then the top MLP. */
static void walk_dlrm(tensor_walk *k) {
    const nb_sc_config *c = &k->m->cfg;
    nb_sc_view *v = k->v;
    int Dx = (c->ncat + 1) * c->E, r = c->cross_rank;
    for (int i = 0; i < c->blocks; i++) {
        nb_sc_block_view *b = &v->block[i];
        tensor(k, &b->U, INIT_FANIN, Dx, r, "block.%d.U", i);
        tensor(k, &b->V, INIT_FANIN, Dx, r, "block.%d.V", i);
        tensor(k, &b->b, INIT_ZERO, Dx, 1, "block.%d.b", i);
    }
    for (int j = 0, in = Dx; j <= c->ntop; j++) {
        int out = j < c->ntop ? c->top[j] : 1;
        tensor(k, &v->top_w[j], INIT_FANIN, out, in, "top.%d.weight", j);
        tensor(k, &v->top_b[j], INIT_ZERO, out, 1, "top.%d.bias", j);
        in = out;
    }
}

static void walk_tensors(tensor_walk *k) {
    const nb_sc_config *c = &k->m->cfg;
    nb_sc_view *v = k->v;
    int E = c->E, D0 = k->m->D0, r = c->cross_rank, H = c->block_hidden;
    const int bdims[4] = {c->ndense, NB_SC_BOTTOM1, NB_SC_BOTTOM2, E};
    for (int i = 0; i < 3; i++) {
        tensor(k, &v->bottom.weight[i], INIT_FANIN, bdims[i + 1], bdims[i], "bottom.%d.weight", i);
        tensor(k, &v->bottom.bias[i], INIT_ZERO, bdims[i + 1], 1, "bottom.%d.bias", i);
    }
    if (nb_sc_dlrm(c)) {
        walk_dlrm(k);
        return;
    }
    for (int l = 0; l < c->hist_layers; l++) {
        nb_sc_enc_view *e = &v->hist[l];
        tensor(k, &e->ln1_w, INIT_ONE, E, 1, "hist.%d.ln1.weight", l);
        tensor(k, &e->ln1_b, INIT_ZERO, E, 1, "hist.%d.ln1.bias", l);
        tensor(k, &e->qkv_w, INIT_FANIN, 3 * E, E, "hist.%d.qkv.weight", l);
        tensor(k, &e->qkv_b, INIT_ZERO, 3 * E, 1, "hist.%d.qkv.bias", l);
        tensor(k, &e->proj_w, INIT_FANIN, E, E, "hist.%d.proj.weight", l);
        tensor(k, &e->proj_b, INIT_ZERO, E, 1, "hist.%d.proj.bias", l);
        tensor(k, &e->ln2_w, INIT_ONE, E, 1, "hist.%d.ln2.weight", l);
        tensor(k, &e->ln2_b, INIT_ZERO, E, 1, "hist.%d.ln2.bias", l);
        tensor(k, &e->fc1_w, INIT_FANIN, 4 * E, E, "hist.%d.fc1.weight", l);
        tensor(k, &e->fc1_b, INIT_ZERO, 4 * E, 1, "hist.%d.fc1.bias", l);
        tensor(k, &e->fc2_w, INIT_FANIN, E, 4 * E, "hist.%d.fc2.weight", l);
        tensor(k, &e->fc2_b, INIT_ZERO, E, 1, "hist.%d.fc2.bias", l);
    }
    tensor(k, &v->target.wq, INIT_FANIN, E, E, "target.wq", 0);
    /* wk then wv, adjacent: together they are the fused [2E, E] key/value projection */
    tensor(k, &v->target.wk, INIT_FANIN, E, E, "target.wk", 0);
    tensor(k, &v->target.wv, INIT_FANIN, E, E, "target.wv", 0);
    for (int i = 0; i < c->blocks; i++) {
        nb_sc_block_view *b = &v->block[i];
        tensor(k, &b->U, INIT_FANIN, D0, r, "block.%d.U", i);
        tensor(k, &b->V, INIT_FANIN, D0, r, "block.%d.V", i);
        tensor(k, &b->b, INIT_ZERO, D0, 1, "block.%d.b", i);
        tensor(k, &b->w1, INIT_FANIN, H, D0, "block.%d.w1", i);
        tensor(k, &b->b1, INIT_ZERO, H, 1, "block.%d.b1", i);
        tensor(k, &b->w2, INIT_FANIN, D0, H, "block.%d.w2", i);
        tensor(k, &b->b2, INIT_ZERO, D0, 1, "block.%d.b2", i);
        tensor(k, &b->head_w, INIT_FANIN, 1, D0, "block.%d.head.w", i);
        tensor(k, &b->head_b, INIT_ZERO, 1, 1, "block.%d.head.b", i);
    }
}

/* The tensor table (nb_sc_plan). */
static void build_tensors(nb_sc_model *m) {
    int n = tensor_count(&m->cfg);
    m->t = nb_calloc((size_t)n, sizeof *m->t, "seqctr tensor table");
    m->init_kind = nb_calloc((size_t)n, sizeof *m->init_kind, "seqctr tensor table");
    tensor_walk k = {m, &m->w, NULL, 0, 0};
    walk_tensors(&k);
}

/* The views: compute weights (act dtype) and fp32 gradients, once the slabs are bound. */
static void bind_views(nb_sc_model *m) {
    tensor_walk w = {m, &m->w, (char *)m->d_w, act_es(m), 0}, g = {m, &m->dw, (char *)m->d_grads, sizeof(float), 0};
    walk_tensors(&w);
    walk_tensors(&g);
    NB_ASSERT(w.i == m->ntensors && g.i == m->ntensors);
}

const nb_sc_tensor *nb_sc_find(const nb_sc_model *m, const char *name) {
    for (int i = 0; i < m->ntensors; i++)
        if (!strcmp(m->t[i].name, name)) return &m->t[i];
    return NULL;
}

static void init_params(nb_sc_model *m) {
    const unsigned char *kinds = m->init_kind;
    for (int i = 0; i < m->ntensors; i++) {
        const nb_sc_tensor *t = &m->t[i];
        float *p = m->params + t->off;
        if (kinds[i] == INIT_ZERO) {
            memset(p, 0, t->n * sizeof(float));
        } else if (kinds[i] == INIT_ONE) {
            for (size_t k = 0; k < t->n; k++) p[k] = 1.0f;
        } else {
            /* [out, in] weights: fan-in = cols; the cross's U/V [D0, r] map r -> D0 and D0 -> r,
             * so U's fan-in is r and V's is D0 */
            int fan = t->cols;
            size_t len = strlen(t->name);
            if (len >= 2 && !strcmp(t->name + len - 2, ".V")) fan = t->rows;
            float std = 1.0f / sqrtf((float)fan);
            if (len >= 2 && !strcmp(t->name + len - 2, ".U")) std *= 0.1f; /* start near a plain residual */
            nb_rng_fill_normal(p, t->n, m->cfg.seed, nb_rng_stream_id(t->name), 0.0f, std);
        }
    }
}

/* ---- memory: one layout walk, run twice (nb_arena_take): first it plans the bytes of each
 * arena, then, once the run has allocated them, it binds the same offsets as views ---- */

enum { AR_DEV, AR_PIN, AR_HOST };

static void *take(nb_sc_model *m, int which, size_t bytes) {
    nb_arena *a = which == AR_DEV ? m->ar_dev : which == AR_PIN ? m->ar_pin : m->ar_host;
    return nb_arena_take(a, bytes ? bytes : 16);
}
static void *A(nb_sc_model *m, size_t n) { return take(m, AR_DEV, n * act_es(m)); }
static float *F32(nb_sc_model *m, size_t n) { return take(m, AR_DEV, n * sizeof(float)); }
/* The views' pointer tables (host heap, allocated once: the walk only fills them). */
static void acts_tables(nb_sc_model *m) {
    nb_sc_acts *a = m->acts;
    int nl = m->cfg.hist_layers, nb = m->cfg.blocks;
    a->h = nb_calloc((size_t)nl + 1, sizeof(void *), "seqctr");
    a->enc = nb_calloc((size_t)(nl ? nl : 1), sizeof(enc_acts), "seqctr");
    a->xs = nb_calloc((size_t)nb, sizeof(void *), "seqctr");
    a->c = nb_calloc((size_t)nb, sizeof(void *), "seqctr");
    a->vx = nb_calloc((size_t)nb, sizeof(void *), "seqctr");
    a->u = nb_calloc((size_t)nb, sizeof(void *), "seqctr");
    a->hid = nb_calloc((size_t)nb, sizeof(void *), "seqctr");
    a->logit = nb_calloc((size_t)nb, sizeof(float *), "seqctr");
    a->dz = nb_calloc((size_t)nb, sizeof(float *), "seqctr");
    a->seg = nb_calloc((size_t)m->nseg, sizeof(seg_scratch), "seqctr");
}

static void layout_encoder(nb_sc_model *m, enc_acts *e, size_t NH, size_t E) {
    e->ln1 = A(m, NH * E);
    e->mean1 = F32(m, NH);
    e->rstd1 = F32(m, NH);
    e->qkv = A(m, NH * 3 * E);
    e->att = A(m, NH * E);
    e->lse = F32(m, NH * (size_t)m->cfg.heads);
    e->x1 = A(m, NH * E);
    e->ln2 = A(m, NH * E);
    e->mean2 = F32(m, NH);
    e->rstd2 = F32(m, NH);
    e->f1 = A(m, NH * 4 * E);
}

/* The DLRM form's own activations (the crosses' outputs are xs, their V^T x are vx). */
static void layout_dlrm(nb_sc_model *m, size_t MB) {
    const nb_sc_config *c = &m->cfg;
    nb_sc_acts *a = m->acts;
    size_t Dx = (size_t)dlrm_dx(m), widest = 1;
    a->xd = A(m, MB * Dx);
    a->dxd = A(m, MB * Dx);
    for (int j = 0; j < c->ntop; j++) {
        a->top[j] = A(m, MB * (size_t)c->top[j]);
        widest = (size_t)c->top[j] > widest ? (size_t)c->top[j] : widest;
    }
    widest = Dx > widest ? Dx : widest; /* the last cross's gradient goes through them too */
    a->dt = A(m, MB * widest);
    a->dtp = A(m, MB * widest);
    a->dbotp = A(m, MB * (size_t)c->E);
}

/* Activations and scratch for batches of max_batch samples and up to max_batch * max_len
 * history rows (the packed worst case). */
static void layout_acts(nb_sc_model *m) {
    const nb_sc_config *c = &m->cfg;
    nb_sc_acts *a = m->acts;
    size_t MB = (size_t)m->max_batch, E = (size_t)c->E, D0 = (size_t)m->D0;
    size_t NH = MB * (size_t)c->max_len, H = (size_t)c->block_hidden, r = (size_t)c->cross_rank;
    /* fp32 backends read the fp32 inputs directly; others get a converted copy */
    a->dense = m->be->act_dtype == NB_F32 ? NULL : A(m, MB * (size_t)c->ndense);
    a->a1 = A(m, MB * NB_SC_BOTTOM1);
    a->a2 = A(m, MB * NB_SC_BOTTOM2);
    a->bot = A(m, MB * E);
    a->x0 = A(m, MB * D0);
    a->temb = A(m, MB * E);
    a->q = A(m, MB * E);
    a->kv = A(m, NH * 2 * E);
    a->attn = F32(m, NH);
    a->pooled = A(m, MB * E);
    for (int l = 0; l <= c->hist_layers; l++) a->h[l] = A(m, NH * E);
    for (int l = 0; l < c->hist_layers; l++) layout_encoder(m, &a->enc[l], NH, E);
    int dlrm = nb_sc_dlrm(c); /* its blocks are crosses alone: no c, no hidden layer */
    for (int i = 0; i < c->blocks; i++) {
        a->xs[i] = A(m, MB * D0);
        a->c[i] = dlrm ? NULL : A(m, MB * D0);
        a->vx[i] = A(m, MB * r);
        a->u[i] = A(m, MB * (dlrm ? (size_t)dlrm_dx(m) : D0));
        a->hid[i] = dlrm ? NULL : A(m, MB * H);
        a->logit[i] = F32(m, MB);
        a->dz[i] = F32(m, MB);
    }
    size_t MV = MB * (size_t)nb_sc_mv_width(c);
    size_t DMV = nb_sc_has_mean(c) ? MV : 0; /* the values' gradient rows: averaged columns only */
    a->dsrc = A(m, MB * D0 + MB * E + NH * E + (MV ? DMV * E + E : 0));
    for (int k = 0; k < m->nseg; k++) {
        seg_scratch *g = &a->seg[k];
        g->dcur = A(m, MB * D0);
        g->dprev = A(m, MB * D0);
        g->dc = dlrm ? NULL : A(m, MB * D0);
        g->dhid = dlrm ? NULL : A(m, MB * H);
        g->dhidp = dlrm ? NULL : A(m, MB * H);
        g->dx0 = k ? A(m, MB * D0) : NULL;
    }
    a->dbot = A(m, MB * E);
    a->da2 = A(m, MB * NB_SC_BOTTOM2);
    a->da2p = A(m, MB * NB_SC_BOTTOM2);
    a->da1 = A(m, MB * NB_SC_BOTTOM1);
    a->da1p = A(m, MB * NB_SC_BOTTOM1);
    a->dq = A(m, MB * E);
    a->dpooled = A(m, MB * E);
    a->dkv = A(m, NH * 2 * E);
    a->dx1 = A(m, NH * E);
    a->datt = A(m, NH * E);
    a->dqkv = A(m, NH * 3 * E);
    a->dln = A(m, NH * E);
    a->df1 = A(m, NH * 4 * E);
    a->df1p = A(m, NH * 4 * E);
    if (nb_sc_dlrm(c)) layout_dlrm(m, MB);
    if (!a->dsrc) return; /* the planning walk */
    /* the gradient region the embedding rows are summed from: [dx0 | dtemb | dh] */
    a->dx0 = a->dsrc;
    a->dtemb = AT(m, a->dsrc, MB * D0);
    a->dh = AT(m, a->dsrc, MB * D0 + MB * E);
    a->mv_src = MB * D0 + MB * E + NH * E;
    a->zero_src = a->mv_src + DMV * E;
    a->dmv = DMV ? AT(m, a->dsrc, a->mv_src) : NULL;
    a->seg[0].dx0 = a->dx0;
}

/* A batch's host index lists and their backend copies: one set per slot of the ring and one for
 * evaluation, so the host prepares the next batches while the copies of the current one are in
 * flight, and an evaluation never overwrites a prepared training batch. dev: the slot whose
 * device arrays this one shares (on a device, unless pipelined: the copies and every use are
 * ordered on the model's lane); on the CPU each "backend copy" is the host array itself. */
static void layout_stage(nb_sc_model *m, nb_sc_stage *s, const nb_sc_stage *dev) {
    size_t MB = (size_t)m->max_batch, NLK = max_lookups(m);
    s->h_dense = take(m, AR_PIN, MB * (size_t)m->cfg.ndense * sizeof(float));
    s->h_label = take(m, AR_PIN, MB * sizeof(float));
    s->h_rows = take(m, AR_PIN, NLK * sizeof(int64_t));
    s->h_dst = take(m, AR_PIN, NLK * sizeof(int64_t));
    s->h_src = take(m, AR_PIN, NLK * sizeof(int64_t));
    s->h_uniq = take(m, AR_PIN, NLK * sizeof(int64_t));
    s->h_order = take(m, AR_PIN, NLK * sizeof(int32_t));
    s->h_seg = take(m, AR_PIN, (NLK + 1) * sizeof(int32_t));
    s->h_off = take(m, AR_PIN, (MB + 1) * sizeof(int32_t));
    s->h_inverse = take(m, AR_HOST, NLK * sizeof(int32_t));
    s->h_keys = take(m, AR_HOST, 2 * NLK * sizeof(uint64_t));
    s->h_hist = take(m, AR_PIN, MB * (size_t)m->cfg.max_len * sizeof(uint32_t));
    size_t nmvc = (size_t)nb_sc_nmv(&m->cfg);
    if (nmvc) {
        s->h_mv = take(m, AR_PIN, MB * (size_t)nb_sc_mv_width(&m->cfg) * sizeof(uint32_t));
        s->h_moff = take(m, AR_PIN, (MB * nmvc + 1) * sizeof(int32_t));
        s->d_moff = on_cpu(m) ? s->h_moff : dev ? dev->d_moff : take(m, AR_DEV, (MB * nmvc + 1) * sizeof(int32_t));
        s->h_mvb = take(m, AR_PIN, MB * nmvc * sizeof(int32_t));
        s->d_mvb = on_cpu(m) ? s->h_mvb : dev ? dev->d_mvb : take(m, AR_DEV, MB * nmvc * sizeof(int32_t));
    }
    if (m->dev_lists) {
        s->h_cat = take(m, AR_PIN, MB * (size_t)m->cfg.ncat * sizeof(uint32_t));
        s->h_target = take(m, AR_PIN, MB * sizeof(uint32_t));
        s->d_cat = dev ? dev->d_cat : take(m, AR_DEV, MB * (size_t)m->cfg.ncat * sizeof(uint32_t));
        s->d_target = dev ? dev->d_target : take(m, AR_DEV, MB * sizeof(uint32_t));
        s->d_hist = dev ? dev->d_hist : take(m, AR_DEV, MB * (size_t)m->cfg.max_len * sizeof(uint32_t));
        s->d_count = dev ? dev->d_count : take(m, AR_DEV, sizeof(int32_t));
        if (nmvc) s->d_mv = dev ? dev->d_mv : take(m, AR_DEV, MB * (size_t)nb_sc_mv_width(&m->cfg) * sizeof(uint32_t));
    }
    if (on_cpu(m)) {
        s->d_dense = s->h_dense, s->d_label = s->h_label, s->d_rows = s->h_rows, s->d_dst = s->h_dst;
        s->d_src = s->h_src, s->d_order = s->h_order, s->d_seg = s->h_seg, s->d_off = s->h_off;
        s->d_uniq = s->h_uniq;
    } else if (dev) {
        s->d_dense = dev->d_dense, s->d_label = dev->d_label, s->d_rows = dev->d_rows, s->d_dst = dev->d_dst;
        s->d_src = dev->d_src, s->d_order = dev->d_order, s->d_seg = dev->d_seg, s->d_off = dev->d_off;
        s->d_uniq = dev->d_uniq;
    } else {
        s->d_dense = F32(m, MB * (size_t)m->cfg.ndense);
        s->d_label = F32(m, MB);
        s->d_rows = take(m, AR_DEV, NLK * sizeof(int64_t));
        s->d_dst = take(m, AR_DEV, NLK * sizeof(int64_t));
        s->d_src = take(m, AR_DEV, NLK * sizeof(int64_t));
        s->d_uniq = take(m, AR_DEV, NLK * sizeof(int64_t));
        s->d_order = take(m, AR_DEV, NLK * sizeof(int32_t));
        s->d_seg = take(m, AR_DEV, (NLK + 1) * sizeof(int32_t));
        s->d_off = take(m, AR_DEV, (MB + 1) * sizeof(int32_t));
    }
}

/* The dense state: fp32 parameters, their gradients and AdamW moments, the compute copy, the
 * unique rows' gradients, the step's scalars; on CUDA host mirrors for checkpoints. */
static void layout_state(nb_sc_model *m) {
    size_t NU = max_lookups(m) * (size_t)m->cfg.E;
    m->d_params = F32(m, m->nparams);
    m->d_grads = F32(m, m->nparams);
    m->d_am = F32(m, m->nparams);
    m->d_av = F32(m, m->nparams);
    m->d_uniq_grads = F32(m, NU);
    m->d_w = m->be->act_dtype == NB_F32 ? (void *)m->d_params : A(m, m->nparams);
    m->d_loss = take(m, AR_DEV, 2 * sizeof(double)); /* the loss, then the dense gradient's sum of squares */
    m->d_k = take(m, AR_DEV, 2 * sizeof(nb_adamw_scalars));
    m->h_k = on_cpu(m) ? m->d_k : take(m, AR_PIN, 2 * sizeof(nb_adamw_scalars));
    if (on_cpu(m)) {
        m->params = m->d_params, m->grads = m->d_grads, m->uniq_grads = m->d_uniq_grads, m->am = m->d_am, m->av = m->d_av;
        return;
    }
    m->params = take(m, AR_HOST, m->nparams * sizeof(float));
    m->grads = take(m, AR_HOST, m->nparams * sizeof(float));
    m->uniq_grads = take(m, AR_HOST, NU * sizeof(float));
    m->am = take(m, AR_HOST, m->nparams * sizeof(float));
    m->av = take(m, AR_HOST, m->nparams * sizeof(float));
}

static void layout(nb_sc_model *m) {
    layout_state(m);
    nb_emb_layout_state(&m->emb);
    /* the stages share one set of device lists (the copies and every use are ordered on the
     * model's lane), except when pipelined: the next batch's lists are copied in while this one's
     * are read */
    for (int k = 0; k <= NB_SC_RING; k++) {
        layout_stage(m, m->stages[k], k && !m->ahead ? m->stages[0] : NULL);
        nb_emb_layout_batch(&m->emb, k);
    }
    nb_emb_layout_windows(&m->emb);
    layout_acts(m);
}

void nb_sc_check_batch_size(int max_batch, int max_len, int ncat) {
    NB_CHECK(max_batch >= 1, "pass --batch >= 1", "batch %d", max_batch);
    NB_CHECK((double)max_batch * (ncat + 2 + max_len) < 2147483647.0, "lower --batch or --max-len",
             "a batch of %d samples with histories of up to %d items has too many lookups for 32-bit indices",
             max_batch, max_len);
}

static void check_config(const nb_sc_config *c, int max_batch) {
    static const char *hint = "check the seqctr flags (--emb-dim, --blocks, --cross-rank, --block-hidden, --max-len)";
    NB_CHECK(c->E >= 1 && c->heads >= 1 && c->E % c->heads == 0, hint,
             "embedding width %d must be a positive multiple of the %d heads", c->E, c->heads);
    NB_CHECK(c->hist_layers >= 0 && c->blocks >= 1 && c->cross_rank >= 1 && c->block_hidden >= 1, hint,
             "need hist_layers >= 0, blocks >= 1, cross_rank >= 1, block_hidden >= 1");
    NB_CHECK(c->max_len >= 0 && c->max_len <= 65536, hint, "max_len %d out of 0..65536", c->max_len);
    NB_CHECK(c->ndense >= 1 && c->ndense <= NB_SC_MAX_DENSE && c->ncat >= 1 && c->ncat <= NB_SC_MAX_CAT,
             "describe at most 64 dense and 64 categorical columns", "the model reads %d dense and %d categorical columns "
             "(1..%d and 1..%d)", c->ndense, c->ncat, NB_SC_MAX_DENSE, NB_SC_MAX_CAT);
    for (int f = 0; f < c->ncat; f++)
        NB_CHECK(c->pool[f] <= NB_SC_POOL_MEAN && (c->pool[f] == NB_SC_POOL_NONE || (c->mv_max[f] >= 1 && c->mv_max[f] <= NB_SC_MAX_MV)),
                 "give a multi-valued column \"max_values\" in 1..256", "categorical column %d: pooling %d, max_values %d", f,
                 c->pool[f], c->mv_max[f]);
    nb_sc_check_batch_size(max_batch, c->max_len + nb_sc_mv_width(c), c->ncat);
    NB_CHECK(c->aux_weight >= 0 && isfinite(c->aux_weight), "pass --aux-weight >= 0", "aux weight %g",
             (double)c->aux_weight);
    NB_CHECK(c->blocks <= NB_SC_MAX_BLOCKS, hint, "at most %d blocks", NB_SC_MAX_BLOCKS);
    NB_CHECK(!(c->detach & 1), "detach blocks 1 and up (block 0 reads x0, which stays attached)",
             "block 0 cannot be detached");
    NB_CHECK(c->detach >> c->blocks == 0, "detach only blocks that exist (--detach)",
             "a detached block index is not below the %d blocks", c->blocks);
    NB_CHECK(!c->detach || c->aux_weight > 0, "pass --aux-weight > 0 with --detach",
             "detached blocks need their own loss: aux weight is 0");
    NB_CHECK(c->ntop >= 0 && c->ntop <= NB_SC_MAX_TOP, "give the top MLP 1..8 hidden layers", "%d top layers", c->ntop);
    for (int j = 0; j < c->ntop; j++)
        NB_CHECK(c->top[j] >= 1 && c->top[j] <= (1 << 20), "give the top MLP widths in 1..1048576", "top layer %d: width %d",
                 j, c->top[j]);
    NB_CHECK(!nb_sc_dlrm(c) || (c->hist_layers == 0 && c->max_len == 0 && !c->detach && c->aux_weight == 0),
             "drop the history and the per-block heads (--hist-layers 0, no --detach / --aux-weight) with --model dlrm-dcnv2",
             "the DLRM form has no user history and one head (hist_layers %d, max_len %d)", c->hist_layers, c->max_len);
}

/* Device lists need a device, whole tables (a sharded batch's owner plans are host work) and
 * rows that fit the device sort's 32-bit keys. */
static int choose_lists(const nb_sc_model *m, int want) {
    int can = !on_cpu(m) && !sharded(m) && nb_sc_total_rows(m) <= ((int64_t)1 << 32);
    NB_CHECK(want != NB_SC_LISTS_DEVICE || can, "use --index-lists host (or auto)",
             "--index-lists device needs a CUDA device, tables that are not sharded over ranks and at most 2^32 "
             "rows (%s)",
             on_cpu(m) ? "this run is on the CPU" : sharded(m) ? "the tables are sharded" : "more rows");
    return want == NB_SC_LISTS_HOST ? 0 : can;
}

void nb_sc_plan(nb_sc_model *m, const nb_sc_config *cfg, int max_batch, const nb_backend_i *be,
                const nb_sc_plan_opts *po, nb_arena *dev, nb_arena *pinned, nb_arena *host) {
    nb_sc_plan_opts none = {.emb = {.opt = -1}};
    if (!po) po = &none;
    memset(m, 0, sizeof *m);
    check_config(cfg, max_batch);
    m->cfg = *cfg;
    const nb_sc_config *c = &m->cfg;
    m->be = be;
    m->co = nb_ctr_ops_for(be);
    m->max_batch = max_batch;
    m->pad_rows = be->device != NB_DEV_CPU;
    m->D0 = (c->ncat + 3) * c->E; /* bottom, the categorical tables, target, pooled */
    m->nseg = 0;
    for (int i = 0; i < c->blocks; i++)
        if (i == 0 || (c->detach >> i & 1)) m->seg_first[m->nseg++] = i;
    m->seg_first[m->nseg] = c->blocks;
    m->w.hist = nb_calloc((size_t)(c->hist_layers ? c->hist_layers : 1), sizeof(nb_sc_enc_view), "seqctr views");
    m->dw.hist = nb_calloc((size_t)(c->hist_layers ? c->hist_layers : 1), sizeof(nb_sc_enc_view), "seqctr views");
    m->w.block = nb_calloc((size_t)c->blocks, sizeof(nb_sc_block_view), "seqctr views");
    m->dw.block = nb_calloc((size_t)c->blocks, sizeof(nb_sc_block_view), "seqctr views");
    build_tensors(m);
    m->emb_off[0] = 0;
    for (int t = 0; t < nb_sc_ntables(c); t++) {
        int64_t rows = t < c->ncat ? c->cat_rows[t] : c->item_rows;
        NB_CHECK(rows >= 1, "every table needs at least one row", "table %d has %lld rows", t, (long long)rows);
        m->emb_off[t + 1] = m->emb_off[t] + rows;
    }
    nb_emb_plan(&m->emb, &po->emb, nb_sc_total_rows(m), c->E, max_lookups(m), be, dev, pinned, host);
    m->ahead = po->emb.pipelined;
    m->dev_lists = choose_lists(m, po->lists);
    m->full_mv = po->full_mv;
    m->spans = nb_malloc((size_t)m->ntensors * sizeof *m->spans, "seqctr AdamW tensor table");
    for (int i = 0; i < m->ntensors; i++) m->spans[i] = (nb_adamw_span){m->t[i].off, m->t[i].n, m->t[i].decay ? 0 : 1};
    m->acts = nb_calloc(1, sizeof *m->acts, "seqctr activations");
    acts_tables(m);
    for (int k = 0; k <= NB_SC_RING; k++) m->stages[k] = nb_calloc(1, sizeof(nb_sc_stage), "seqctr batch");
    m->ar_dev = dev, m->ar_pin = pinned, m->ar_host = host;
    m->ar_start[AR_DEV] = dev->planned, m->ar_start[AR_PIN] = pinned->planned, m->ar_start[AR_HOST] = host->planned;
    layout(m);
}

void nb_sc_bind(nb_sc_model *m, nb_ctx ctx) {
    nb_arena_seek(m->ar_dev, m->ar_start[AR_DEV]);
    nb_arena_seek(m->ar_pin, m->ar_start[AR_PIN]);
    nb_arena_seek(m->ar_host, m->ar_start[AR_HOST]);
    layout(m);
    m->stage = m->stages[0];
    m->uniq_rows = m->stage->h_uniq;
    bind_views(m);
    init_params(m);
    nb_emb_init(&m->emb, m->cfg.seed, ctx);
    const nb_task_ctx *saved = m->ctx;
    m->ctx = ctx;
    nb_sc_to_device(m);
    m->ctx = saved;
}

void nb_sc_init(nb_sc_model *m, const nb_sc_config *cfg, int max_batch) {
    nb_sc_init_on(m, cfg, max_batch, &nb_backend_cpu);
}

static void *own_dev_alloc(void *self, size_t bytes, const char *what) { return ((const nb_backend_i *)self)->alloc(bytes, what); }
static void own_dev_free(void *self, void *p) { ((const nb_backend_i *)self)->free(p); }
static void *own_pin_alloc(void *self, size_t bytes, const char *what) {
    return ((const nb_backend_i *)self)->host_alloc(bytes, what);
}
static void own_pin_free(void *self, void *p) { ((const nb_backend_i *)self)->host_free(p); }

/* A model that owns its arenas and a backend instance (tests, tools): the run's layout, one
 * allocation per arena, both table optimizers' state. */
void nb_sc_init_on(nb_sc_model *m, const nb_sc_config *cfg, int max_batch, const nb_backend_i *be) {
    nb_sc_model tmp;
    nb_arena *own = nb_calloc(3, sizeof(nb_arena), "seqctr arenas");
    nb_arena_init(&own[AR_DEV], "seqctr device", (nb_device){be->device, 0}, 0,
                  (nb_allocator_i){own_dev_alloc, own_dev_free, (void *)be});
    nb_arena_init(&own[AR_PIN], "seqctr pinned", (nb_device){NB_DEV_CPU, 0}, 0,
                  (nb_allocator_i){own_pin_alloc, own_pin_free, (void *)be});
    nb_arena_init(&own[AR_HOST], "seqctr host", (nb_device){NB_DEV_CPU, 0}, 0, nb_host_allocator);
    nb_sc_plan(&tmp, cfg, max_batch, be, NULL, &own[AR_DEV], &own[AR_PIN], &own[AR_HOST]);
    *m = tmp;
    for (int k = 0; k < 3; k++) nb_arena_alloc(&own[k], "lower the batch or the table sizes");
    m->own_arenas = own;
    m->own_backend = nb_backend_create(be->device == NB_DEV_CPU ? "cpu" : "cuda", be->act_dtype == NB_F32 ? "fp32" : "bf16");
    m->own_ctx = (nb_task_ctx){NULL, NULL, m->own_backend};
    if (be->device != NB_DEV_CPU) be->zero(&m->own_ctx, own[AR_DEV].base, own[AR_DEV].planned);
    m->ctx = &m->own_ctx;
    nb_sc_bind(m, &m->own_ctx);
    m->ctx = NULL;
}

void nb_sc_free(nb_sc_model *m) {
    nb_sc_acts *a = m->acts;
    if (!a) return;
    free(a->seg), free(a->h), free(a->enc), free(a->xs), free(a->c), free(a->vx), free(a->u), free(a->hid), free(a->logit), free(a->dz);
    for (int k = 0; k <= NB_SC_RING; k++) free(m->stages[k]);
    nb_emb_free(&m->emb);
    free(m->spans);
    free(m->w.hist), free(m->dw.hist), free(m->w.block), free(m->dw.block);
    free(m->t), free(m->init_kind);
    free(a);
    if (m->own_arenas) {
        for (int k = 0; k < 3; k++) nb_arena_free(&m->own_arenas[k]);
        free(m->own_arenas);
    }
    nb_backend_destroy(m->own_backend);
    memset(m, 0, sizeof *m);
}

void nb_sc_set_ctx(nb_sc_model *m, const nb_task_ctx *ctx) { m->ctx = ctx; }

/* host <-> backend copies of the dense state (weights, AdamW moments) */
static void dense_copy(nb_sc_model *m, nb_ctx c, int up) {
    float *d[3] = {m->d_params, m->d_am, m->d_av}, *h[3] = {m->params, m->am, m->av};
    for (int k = 0; k < 3; k++) {
        if (up)
            m->be->to_backend(c, d[k], h[k], m->nparams * sizeof(float));
        else
            m->be->to_host(c, h[k], d[k], m->nparams * sizeof(float));
    }
}

void nb_sc_to_device(nb_sc_model *m) {
    nb_ctx c = CTX(m);
    if (!on_cpu(m)) {
        dense_copy(m, c, 1);
        nb_emb_to_device(&m->emb, c);
    }
    if (m->d_w != (void *)m->d_params) m->be->cast_params(c, m->d_w, m->d_params, m->nparams);
}

void nb_sc_to_host(nb_sc_model *m) {
    if (on_cpu(m)) return;
    nb_ctx c = CTX(m);
    dense_copy(m, c, 0);
    m->be->to_host(c, m->grads, m->d_grads, m->nparams * sizeof(float));
    nb_emb_to_host(&m->emb, c);
    if (m->dev_lists && m->stage) nb_sc_learn_unique(m, m->stage, 1);
    if (m->nuniq > 0) m->be->to_host(c, m->uniq_grads, m->d_uniq_grads, (size_t)m->nuniq * m->cfg.E * sizeof(float));
}

static void tensor_shape(const nb_sc_tensor *t, int *ndim, int64_t shape[2]) {
    *ndim = t->cols == 1 ? 1 : 2;
    shape[0] = t->rows;
    shape[1] = t->cols;
}

static void table_name(const nb_sc_config *c, char *buf, size_t cap, int t) {
    if (t == nb_sc_item_table(c))
        snprintf(buf, cap, "emb.item");
    else
        snprintf(buf, cap, "emb.cat.%d", t);
}

int nb_sc_mv_string(const nb_sc_config *c, char *buf, size_t cap) {
    size_t len = 0;
    buf[0] = 0;
    for (int f = 0; f < c->ncat && f < NB_SC_MAX_CAT; f++) {
        if (c->pool[f] == NB_SC_POOL_NONE) continue;
        int n = snprintf(buf + len, cap - len, "%s%d:%s:%d", len ? "," : "", f, c->pool[f] == NB_SC_POOL_MEAN ? "mean" : "sum",
                         c->mv_max[f]);
        NB_ASSERT(n > 0 && (size_t)n < cap - len);
        len += (size_t)n;
    }
    return len > 0;
}

void nb_sc_top_string(const nb_sc_config *c, char *buf, size_t cap) {
    size_t len = 0;
    buf[0] = 0;
    for (int j = 0; j < c->ntop && j < NB_SC_MAX_TOP; j++) {
        int n = snprintf(buf + len, cap - len, "%s%d", j ? "," : "", c->top[j]);
        NB_ASSERT(n > 0 && (size_t)n < cap - len);
        len += (size_t)n;
    }
}

int nb_sc_top_parse(nb_sc_config *c, const char *s) {
    c->ntop = 0;
    while (s && *s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 1 || v > (1 << 20) || c->ntop == NB_SC_MAX_TOP) return 0;
        c->top[c->ntop++] = (int)v;
        s = end;
        if (*s == ',') s++;
        else if (*s) return 0;
    }
    return 1;
}

int nb_sc_mv_parse(nb_sc_config *c, const char *s) {
    for (int f = 0; f < NB_SC_MAX_CAT; f++) c->pool[f] = NB_SC_POOL_NONE, c->mv_max[f] = 0;
    while (s && *s) {
        int f, k, n = 0;
        char mode[8];
        if (sscanf(s, "%d:%7[a-z]:%d%n", &f, mode, &k, &n) != 3 || f < 0 || f >= NB_SC_MAX_CAT || k < 1 || k > NB_SC_MAX_MV ||
            (strcmp(mode, "sum") && strcmp(mode, "mean")))
            return 0;
        c->pool[f] = strcmp(mode, "mean") ? NB_SC_POOL_SUM : NB_SC_POOL_MEAN;
        c->mv_max[f] = k;
        s += n;
        if (*s == ',') s++;
        else if (*s) return 0;
    }
    return 1;
}

void nb_sc_save(const nb_sc_model *m, const char *path) {
    NB_CHECK(!sharded(m), "this is a bug in nobubble; please report it", "nb_sc_save on a sharded model (its rows are on several ranks)");
    const nb_sc_config *c = &m->cfg;
    nb_st_writer *w = nb_st_begin(path);
    char meta[256 + 16 * NB_SC_MAX_CAT], names[NB_SC_MAX_CAT + 1][32];
    int len = snprintf(meta, sizeof meta,
             "E=%d hist_layers=%d heads=%d blocks=%d cross_rank=%d block_hidden=%d max_len=%d aux_weight=%g ndense=%d ncat=%d",
             c->E, c->hist_layers, c->heads, c->blocks, c->cross_rank, c->block_hidden, c->max_len, (double)c->aux_weight,
             c->ndense, c->ncat);
    /* multi-valued columns only when there are some: other checkpoints keep their bytes */
    char mv[16 * NB_SC_MAX_CAT];
    if (nb_sc_mv_string(c, mv, sizeof mv)) len += snprintf(meta + len, sizeof meta - (size_t)len, " mv=%s", mv);
    if (nb_sc_dlrm(c)) { /* the DLRM form only: other checkpoints keep their bytes */
        char top[16 * NB_SC_MAX_TOP];
        nb_sc_top_string(c, top, sizeof top);
        snprintf(meta + len, sizeof meta - (size_t)len, " top=%s", top);
    }
    nb_st_meta(w, "seqctr.config", meta);
    for (int i = 0; i < m->ntensors; i++) {
        int nd;
        int64_t sh[2];
        tensor_shape(&m->t[i], &nd, sh);
        nb_st_add(w, m->t[i].name, NB_F32, nd, sh, m->params + m->t[i].off);
    }
    for (int t = 0; t < nb_sc_ntables(c); t++) {
        table_name(c, names[t], sizeof names[t], t);
        int64_t sh[2] = {m->emb_off[t + 1] - m->emb_off[t], c->E};
        nb_st_add(w, names[t], NB_F32, 2, sh, m->emb.table + (size_t)m->emb_off[t] * c->E);
    }
    nb_st_end(w);
}

void nb_sc_load(nb_sc_model *m, const char *path) {
    NB_CHECK(!sharded(m), "this is a bug in nobubble; please report it", "nb_sc_load on a sharded model (its rows are on several ranks)");
    nb_st_file *f = nb_st_open(path);
    for (int i = 0; i < m->ntensors; i++) {
        int nd;
        int64_t sh[2];
        tensor_shape(&m->t[i], &nd, sh);
        nb_st_read_shaped(f, m->t[i].name, NB_F32, nd, sh, m->params + m->t[i].off);
    }
    for (int t = 0; t < nb_sc_ntables(&m->cfg); t++) {
        char name[32];
        table_name(&m->cfg, name, sizeof name, t);
        int64_t sh[2] = {m->emb_off[t + 1] - m->emb_off[t], m->cfg.E};
        nb_st_read_shaped(f, name, NB_F32, 2, sh, m->emb.table + (size_t)m->emb_off[t] * m->cfg.E);
    }
    nb_st_close(f);
    nb_sc_to_device(m);
}

