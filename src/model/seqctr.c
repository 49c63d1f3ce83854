/* seqctr forward and backward on any backend (see seqctr.h for the model and the tensor names).
 *
 * A batch becomes index lists (nb_sc_prepare): the embedding rows to gather and where each goes,
 * the packed history offsets, and the deduplicated rows with their lookups grouped for a
 * fixed-order gradient sum. The host builds them (the CPU backend, sharded tables: the owners'
 * plans need them on the host), or with device lists the host stages the raw ids and the
 * device builds the same lists in the batch's upload phase (ctr ops lists / unique_groups). The
 * backend then only gathers, computes and scatters by those lists, so the result does not depend
 * on who built them or on the backend's threads.
 *
 * Lookup list of a batch of B samples with nh history items (global rows, one table set):
 *   [0, 27B)          sample i's 26 categorical rows and its target row, into x0[i, E..28E)
 *   [27B, 28B)        the target row again: the gradient that reaches it through target.wq
 *   [28B, 28B + nh)   the history items, packed in (sample, position) order, into h0
 * Backward sums each unique row's lookups from one gradient region [dx0 | dtemb | dh]. */
#include "model/seqctr.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "io/safetensors.h"
#include "ops/backend.h"
#include "ops/backend_ctr.h"
#include "ops/ops_ctr.h"
#include "optim/optim.h"
#include "rng.h"

#define LN_EPS 1e-5f
#define NLK_PER_SAMPLE (NB_SC_NTABLES + 1) /* 26 categorical + target, + target via wq */

typedef struct {
    void *ln1, *qkv, *att, *x1, *ln2, *f1;
    float *mean1, *rstd1, *lse, *mean2, *rstd2;
} enc_acts;

/* A segment's backward scratch; dx0 is its share of x0's gradient (segment 0's is x0's gradient
 * itself, the others are added to it in segment order by the join). */
typedef struct {
    void *dcur, *dprev, *dc, *dhid, *dhidp, *dx0;
} seg_scratch;

struct nb_sc_acts {
    void *dense, *a1, *a2, *bot, *x0;
    void *temb, *q, *kv, *pooled;
    float *attn;
    void **h; /* [layers + 1] encoder inputs; h[layers] is the output */
    enc_acts *enc;
    void **xs, **c, **vx, **hid;
    float **logit, **dz;
    /* gradient region the embedding rows are summed from: [dx0 (MB*D0) | dtemb (MB*E) | dh (NH*E)] */
    void *dsrc, *dx0, *dtemb, *dh;
    seg_scratch *seg; /* [segments]: each segment's backward has its own, so segments can run at once */
    void *dbot, *da2, *da2p, *da1, *da1p;
    void *dq, *dpooled, *dkv, *dx1, *datt, *dqkv, *dln, *df1, *df1p;
};

/* The batch as index lists: host arrays (h_) and their backend copies (d_; the same memory on
 * the CPU). */
/* A window's owner side (sharded): the rows the askers asked of this owner in each of its parts
 * (part-major, then asker rank), their gradients' sums per row in that order, and the rows the
 * window's single update touches. Windows go round a ring like the stages: the one training, the
 * one being fetched, the one being planned. */
struct nb_sc_window {
    int parts_done, complete;
    size_t n, *part_base; /* served rows so far; part k's block starts at part_base[k] */
    int64_t *h_serve, *h_off, *h_own;
    int32_t *h_order, *h_seg, *h_inverse;
    uint64_t *h_keys;
    int nown;
    int64_t *d_off, *d_own;
    int32_t *d_order, *d_seg;
};

struct nb_sc_stage {
    int B, nh, nlk, nuniq; /* of the prepared batch (nh, nlk with the padding rows; nuniq -1:
                            * device lists, not counted on the host yet) */
    int nh_real;           /* history rows before padding */
    int nlk_real;          /* lookups before the padding rows: the deduplicated ones */
    uint32_t *h_hist;      /* the history items packed ([nh_real]) */
    /* device lists: the batch's raw ids staged (pinned), their device copies, the device's count
     * of unique rows */
    uint32_t *h_cat, *h_target, *d_cat, *d_target, *d_hist;
    int32_t *d_count;
    int has_label;
    float *h_dense, *h_label;
    int64_t *h_rows, *h_dst, *h_src, *h_uniq;
    int32_t *h_order, *h_seg, *h_off, *h_inverse;
    uint64_t *h_keys; /* [2 * lookups] deduplication scratch */
    float *d_dense, *d_label;
    int64_t *d_rows, *d_dst, *d_src;
    int32_t *d_order, *d_seg, *d_off;
    int64_t *d_uniq;
    /* sharded (nb_sc_shard): rows asked of each owner (ids: h_uniq's local rows, owner blocks),
     * rows other ranks ask of this one (asker blocks) with their offsets j * E, and the owner's
     * deduplication of them (its unique rows, each one's requests in rank order) */
    size_t *asked, *asked_displ, *served, *served_displ; /* [world] */
    int64_t *h_ask, *h_serve, *h_serve_off;
    int nserve;
    int64_t *d_serve, *d_serve_off;
    /* the batch is part `part` of `nparts` of a window (--micro-batches: parts share one frozen
     * embedding state; the tables change once, after the last part); the eval stage has none */
    int part, nparts;
    nb_sc_window *win, *prev_win;
    float *work; /* [lookups, E] the batch's unique rows (owner blocks), as the rows all-to-all left them */
    /* pipelined: the served rows the batch before updates (owner: its local rows, their positions
     * in the asker's block, per asker), and where the re-sent rows go (asker: work offsets) */
    size_t *resync_out, *resync_out_displ, *resync_in, *resync_in_displ; /* [world] */
    int64_t *h_resync_src, *h_resync_pos, *h_resync_dst;
    int nresync_out, nresync_in;
    int64_t *d_resync_src, *d_resync_dst;
    /* --emb-priority (pipelined): only the exclusive rows (those the batch before does not update)
     * move while that batch trains; the collision rows come only after its update (the re-sync).
     * Owner: the exclusive rows per asker (local rows); asker: where they go in work */
    size_t *excl_out, *excl_out_displ, *excl_in, *excl_in_displ; /* [world] */
    int64_t *h_excl_src, *h_excl_dst, *d_excl_src, *d_excl_dst;
    int nexcl_out, nexcl_in;
};

static nb_ctx CTX(const nb_sc_model *m) { return m->ctx ? m->ctx : &m->own_ctx; }
static int on_cpu(const nb_sc_model *m) { return m->be->device == NB_DEV_CPU; }
static int sharded(const nb_sc_model *m) { return m->shard.world > 0; }
/* --emb-place host on a device backend: the shard and its optimizer state in host memory, the
 * owner's lookups, sums and updates on the host (the CPU's ops), the rows copied over */
static int host_tables(const nb_sc_model *m) { return m->host_tables && !on_cpu(m); }

static size_t act_es(const nb_sc_model *m) { return nb_dtype_size(m->be->act_dtype); }
/* element i of an act_dtype buffer */
static void *AT(const nb_sc_model *m, void *p, size_t i) { return (char *)p + i * act_es(m); }

void nb_sc_config_default(nb_sc_config *c) {
    memset(c, 0, sizeof *c);
    c->E = 64;
    c->hist_layers = 1;
    c->heads = 4;
    c->blocks = 6;
    c->cross_rank = 256;
    c->block_hidden = 512;
    c->max_len = 256;
    for (int f = 0; f < NB_SC_NCAT; f++) c->cat_rows[f] = 1;
    c->item_rows = 1;
    c->aux_weight = 0;
    c->seed = 1;
}

/* init kinds of add_tensor */
enum { INIT_ZERO, INIT_ONE, INIT_FANIN };

static void add_tensor(nb_sc_model *m, int kind, int rows, int cols, const char *fmt, int idx) {
    NB_ASSERT(m->ntensors < NB_SC_MAX_TENSORS);
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

static void walk_tensors(tensor_walk *k) {
    const nb_sc_config *c = &k->m->cfg;
    nb_sc_view *v = k->v;
    int E = c->E, D0 = k->m->D0, r = c->cross_rank, H = c->block_hidden;
    const int bdims[4] = {NB_SC_NDENSE, NB_SC_BOTTOM1, NB_SC_BOTTOM2, E};
    for (int i = 0; i < 3; i++) {
        tensor(k, &v->bottom.weight[i], INIT_FANIN, bdims[i + 1], bdims[i], "bottom.%d.weight", i);
        tensor(k, &v->bottom.bias[i], INIT_ZERO, bdims[i + 1], 1, "bottom.%d.bias", i);
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
static size_t max_lookups(const nb_sc_model *m) {
    size_t MB = (size_t)m->max_batch;
    return MB * NLK_PER_SAMPLE + MB * (size_t)m->cfg.max_len;
}

/* The views' pointer tables (host heap, allocated once: the walk only fills them). */
static void acts_tables(nb_sc_model *m) {
    nb_sc_acts *a = m->acts;
    int nl = m->cfg.hist_layers, nb = m->cfg.blocks;
    a->h = nb_calloc((size_t)nl + 1, sizeof(void *), "seqctr");
    a->enc = nb_calloc((size_t)(nl ? nl : 1), sizeof(enc_acts), "seqctr");
    a->xs = nb_calloc((size_t)nb, sizeof(void *), "seqctr");
    a->c = nb_calloc((size_t)nb, sizeof(void *), "seqctr");
    a->vx = nb_calloc((size_t)nb, sizeof(void *), "seqctr");
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

/* Activations and scratch for batches of max_batch samples and up to max_batch * max_len
 * history rows (the packed worst case). */
static void layout_acts(nb_sc_model *m) {
    const nb_sc_config *c = &m->cfg;
    nb_sc_acts *a = m->acts;
    size_t MB = (size_t)m->max_batch, E = (size_t)c->E, D0 = (size_t)m->D0;
    size_t NH = MB * (size_t)c->max_len, H = (size_t)c->block_hidden, r = (size_t)c->cross_rank;
    /* fp32 backends read the fp32 inputs directly; others get a converted copy */
    a->dense = m->be->act_dtype == NB_F32 ? NULL : A(m, MB * NB_SC_NDENSE);
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
    for (int i = 0; i < c->blocks; i++) {
        a->xs[i] = A(m, MB * D0);
        a->c[i] = A(m, MB * D0);
        a->vx[i] = A(m, MB * r);
        a->hid[i] = A(m, MB * H);
        a->logit[i] = F32(m, MB);
        a->dz[i] = F32(m, MB);
    }
    a->dsrc = A(m, MB * D0 + MB * E + NH * E);
    for (int k = 0; k < m->nseg; k++) {
        seg_scratch *g = &a->seg[k];
        g->dcur = A(m, MB * D0);
        g->dprev = A(m, MB * D0);
        g->dc = A(m, MB * D0);
        g->dhid = A(m, MB * H);
        g->dhidp = A(m, MB * H);
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
    if (!a->dsrc) return; /* the planning walk */
    /* the gradient region the embedding rows are summed from: [dx0 | dtemb | dh] */
    a->dx0 = a->dsrc;
    a->dtemb = AT(m, a->dsrc, MB * D0);
    a->dh = AT(m, a->dsrc, MB * D0 + MB * E);
    a->seg[0].dx0 = a->dx0;
}

/* A batch's host index lists and their backend copies. Three host stages: two for training, so
 * the host prepares the next batch while the copies of the current one are in flight, and one
 * for nb_sc_forward (evaluation), which never overwrites a prepared training batch. On CUDA they
 * share one set of device arrays (the copies and every use are ordered on the model's lane); on
 * the CPU each stage's "backend copy" is its host array itself. */
/* A stage's exchange lists (sharded models): host lists, and their backend copies as the index
 * lists above (shared by the stages on a device, the host arrays themselves on the CPU). */
static void layout_stage_shard(nb_sc_model *m, nb_sc_stage *s, const nb_sc_stage *dev) {
    size_t N = (size_t)m->shard.world, NLK = max_lookups(m), NS = m->max_served;
    s->asked = take(m, AR_HOST, N * sizeof(size_t));
    s->asked_displ = take(m, AR_HOST, N * sizeof(size_t));
    s->served = take(m, AR_HOST, N * sizeof(size_t));
    s->served_displ = take(m, AR_HOST, N * sizeof(size_t));
    s->h_ask = take(m, AR_HOST, NLK * sizeof(int64_t));
    s->h_serve = take(m, AR_PIN, NS * sizeof(int64_t));
    s->h_serve_off = take(m, AR_PIN, NS * sizeof(int64_t));
    s->work = dev ? dev->work : F32(m, NLK * (size_t)m->cfg.E);
    if (m->pipelined) {
        s->resync_out = take(m, AR_HOST, 4 * N * sizeof(size_t));
        s->resync_out_displ = s->resync_out + N, s->resync_in = s->resync_out + 2 * N, s->resync_in_displ = s->resync_out + 3 * N;
        s->h_resync_src = take(m, AR_PIN, NS * sizeof(int64_t));
        s->h_resync_pos = take(m, AR_HOST, NS * sizeof(int64_t));
        s->h_resync_dst = take(m, AR_PIN, NLK * sizeof(int64_t));
        s->d_resync_src = on_cpu(m) ? s->h_resync_src : take(m, AR_DEV, NS * sizeof(int64_t));
        s->d_resync_dst = on_cpu(m) ? s->h_resync_dst : take(m, AR_DEV, NLK * sizeof(int64_t));
    }
    if (m->priority) {
        s->excl_out = take(m, AR_HOST, 4 * N * sizeof(size_t));
        s->excl_out_displ = s->excl_out + N, s->excl_in = s->excl_out + 2 * N, s->excl_in_displ = s->excl_out + 3 * N;
        s->h_excl_src = take(m, AR_PIN, NS * sizeof(int64_t));
        s->h_excl_dst = take(m, AR_PIN, NLK * sizeof(int64_t));
        s->d_excl_src = on_cpu(m) ? s->h_excl_src : take(m, AR_DEV, NS * sizeof(int64_t));
        s->d_excl_dst = on_cpu(m) ? s->h_excl_dst : take(m, AR_DEV, NLK * sizeof(int64_t));
    }
    if (on_cpu(m)) {
        s->d_serve = s->h_serve, s->d_serve_off = s->h_serve_off;
    } else if (dev) {
        s->d_serve = dev->d_serve, s->d_serve_off = dev->d_serve_off;
    } else {
        s->d_serve = take(m, AR_DEV, NS * sizeof(int64_t));
        s->d_serve_off = take(m, AR_DEV, NS * sizeof(int64_t));
    }
}

/* A window's lists for up to parts * max_served rows (host, and the device's copies). */
static void layout_window(nb_sc_model *m, nb_sc_window *w) {
    size_t NW = m->max_window;
    w->part_base = take(m, AR_HOST, (size_t)m->nparts * sizeof(size_t));
    w->h_serve = take(m, AR_HOST, NW * sizeof(int64_t));
    w->h_off = take(m, AR_PIN, NW * sizeof(int64_t));
    w->h_own = take(m, AR_PIN, NW * sizeof(int64_t));
    w->h_order = take(m, AR_PIN, NW * sizeof(int32_t));
    w->h_seg = take(m, AR_PIN, (NW + 1) * sizeof(int32_t));
    w->h_inverse = take(m, AR_HOST, NW * sizeof(int32_t));
    w->h_keys = take(m, AR_HOST, 2 * NW * sizeof(uint64_t));
    if (on_cpu(m)) {
        w->d_off = w->h_off, w->d_own = w->h_own, w->d_order = w->h_order, w->d_seg = w->h_seg;
        return;
    }
    w->d_off = take(m, AR_DEV, NW * sizeof(int64_t));
    w->d_own = take(m, AR_DEV, NW * sizeof(int64_t));
    w->d_order = take(m, AR_DEV, NW * sizeof(int32_t));
    w->d_seg = take(m, AR_DEV, (NW + 1) * sizeof(int32_t));
}

static void layout_stage(nb_sc_model *m, nb_sc_stage *s, const nb_sc_stage *dev) {
    size_t MB = (size_t)m->max_batch, NLK = max_lookups(m);
    s->h_dense = take(m, AR_PIN, MB * NB_SC_NDENSE * sizeof(float));
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
    if (m->dev_lists) {
        s->h_cat = take(m, AR_PIN, MB * NB_SC_NCAT * sizeof(uint32_t));
        s->h_target = take(m, AR_PIN, MB * sizeof(uint32_t));
        s->d_cat = dev ? dev->d_cat : take(m, AR_DEV, MB * NB_SC_NCAT * sizeof(uint32_t));
        s->d_target = dev ? dev->d_target : take(m, AR_DEV, MB * sizeof(uint32_t));
        s->d_hist = dev ? dev->d_hist : take(m, AR_DEV, MB * (size_t)m->cfg.max_len * sizeof(uint32_t));
        s->d_count = dev ? dev->d_count : take(m, AR_DEV, sizeof(int32_t));
    }
    if (sharded(m)) layout_stage_shard(m, s, dev);
    if (on_cpu(m)) {
        s->d_dense = s->h_dense, s->d_label = s->h_label, s->d_rows = s->h_rows, s->d_dst = s->h_dst;
        s->d_src = s->h_src, s->d_order = s->h_order, s->d_seg = s->h_seg, s->d_off = s->h_off;
        s->d_uniq = s->h_uniq;
    } else if (dev) {
        s->d_dense = dev->d_dense, s->d_label = dev->d_label, s->d_rows = dev->d_rows, s->d_dst = dev->d_dst;
        s->d_src = dev->d_src, s->d_order = dev->d_order, s->d_seg = dev->d_seg, s->d_off = dev->d_off;
        s->d_uniq = dev->d_uniq;
    } else {
        s->d_dense = F32(m, MB * NB_SC_NDENSE);
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

/* The state: fp32 dense parameters, their gradients and AdamW moments, the compute copy, the
 * tables, the unique rows' gradients, the tables' optimizer state (Adagrad sums, or sparse-Adam
 * moments), the step's scalars; on CUDA host mirrors of the weights for checkpoints. */
static void layout_state(nb_sc_model *m) {
    size_t nemb = (size_t)m->emb_rows * (size_t)m->cfg.E, rows = (size_t)m->emb_rows;
    size_t NU = max_lookups(m) * (size_t)m->cfg.E;
    m->d_params = F32(m, m->nparams);
    m->d_grads = F32(m, m->nparams);
    m->d_am = F32(m, m->nparams);
    m->d_av = F32(m, m->nparams);
    /* host tables: pinned host memory, which the device reads and writes in place over the bus
     * (unified addressing maps every pinned allocation), so the owner's lookups, sums and updates
     * are the same kernels as on the device, and no copy or host hop sits between them */
    int ht = host_tables(m);
    m->d_emb = ht ? take(m, AR_PIN, nemb * sizeof(float)) : F32(m, nemb);
    m->d_uniq_grads = F32(m, NU);
    m->d_w = m->be->act_dtype == NB_F32 ? (void *)m->d_params : A(m, m->nparams);
    if (sharded(m)) { /* the batch's rows, the owner's lookups and the gradients it gets, their sums */
        size_t NS = m->max_served * (size_t)m->cfg.E;
        m->d_serve_rows = F32(m, NS);
        size_t NW = m->max_window * (size_t)m->cfg.E; /* a window's gradients, all its parts */
        m->d_serve_grads = F32(m, NW);
        m->d_own_grads = F32(m, NW);
        if (m->pipelined) {
            m->d_resync_rows = F32(m, NS);
            m->d_resync_in = F32(m, NU);
            /* --emb-priority: the exclusive rows land where the re-synced ones will: the pipe
             * schedule applies them (emb lane) before the step's update, which the re-sync follows */
            if (m->priority) m->d_excl_in = m->d_resync_in;
            m->d_iota = take(m, AR_DEV, max_lookups(m) * sizeof(int64_t));
            m->h_iota = on_cpu(m) ? m->d_iota : take(m, AR_PIN, max_lookups(m) * sizeof(int64_t));
            m->own_bits = take(m, AR_HOST, ((size_t)m->emb_rows / 64 + 1) * sizeof(uint64_t));
        }
    }
    int w = ht ? AR_PIN : AR_DEV;
    m->d_eacc = m->emb_opt != NB_SC_ADAM ? take(m, w, rows * sizeof(float)) : NULL;
    m->d_em = m->emb_opt != NB_SC_ADAGRAD ? take(m, w, nemb * sizeof(float)) : NULL;
    m->d_ev = m->emb_opt != NB_SC_ADAGRAD ? take(m, w, nemb * sizeof(float)) : NULL;
    m->d_loss = take(m, AR_DEV, 2 * sizeof(double)); /* the loss, then the dense gradient's sum of squares */
    m->d_k = take(m, AR_DEV, 2 * sizeof(nb_adamw_scalars));
    m->h_k = on_cpu(m) ? m->d_k : take(m, AR_PIN, 2 * sizeof(nb_adamw_scalars));
    if (on_cpu(m)) {
        m->params = m->d_params, m->grads = m->d_grads, m->emb = m->d_emb, m->uniq_grads = m->d_uniq_grads;
        m->am = m->d_am, m->av = m->d_av, m->eacc = m->d_eacc, m->em = m->d_em, m->ev = m->d_ev;
        return;
    }
    m->params = take(m, AR_HOST, m->nparams * sizeof(float));
    m->grads = take(m, AR_HOST, m->nparams * sizeof(float));
    m->emb = ht ? m->d_emb : take(m, AR_HOST, nemb * sizeof(float));
    m->uniq_grads = take(m, AR_HOST, NU * sizeof(float));
    m->am = take(m, AR_HOST, m->nparams * sizeof(float));
    m->av = take(m, AR_HOST, m->nparams * sizeof(float));
    if (ht) { /* the tables' state lives on the host already */
        m->eacc = m->d_eacc, m->em = m->d_em, m->ev = m->d_ev;
        return;
    }
    m->eacc = m->emb_opt != NB_SC_ADAM ? take(m, AR_HOST, rows * sizeof(float)) : NULL;
    m->em = m->emb_opt != NB_SC_ADAGRAD ? take(m, AR_HOST, nemb * sizeof(float)) : NULL;
    m->ev = m->emb_opt != NB_SC_ADAGRAD ? take(m, AR_HOST, nemb * sizeof(float)) : NULL;
}

static void layout(nb_sc_model *m) {
    layout_state(m);
    /* the stages share one set of device lists (the copies and every use are ordered on the
     * model's lane), except when pipelined: the next batch's lists are copied in while this one's
     * are read */
    for (int k = 0; k <= NB_SC_RING; k++) layout_stage(m, m->stages[k], k && !m->pipelined ? m->stages[0] : NULL);
    if (sharded(m))
        for (int k = 0; k < NB_SC_RING; k++) layout_window(m, &m->wins[k]);
    layout_acts(m);
}

static void check_config(const nb_sc_config *c, int max_batch) {
    static const char *hint = "check the seqctr flags (--emb-dim, --blocks, --cross-rank, --block-hidden, --max-len)";
    NB_CHECK(c->E >= 1 && c->heads >= 1 && c->E % c->heads == 0, hint,
             "embedding width %d must be a positive multiple of the %d heads", c->E, c->heads);
    NB_CHECK(c->hist_layers >= 0 && c->blocks >= 1 && c->cross_rank >= 1 && c->block_hidden >= 1, hint,
             "need hist_layers >= 0, blocks >= 1, cross_rank >= 1, block_hidden >= 1");
    NB_CHECK(c->max_len >= 0 && c->max_len <= 65536, hint, "max_len %d out of 0..65536", c->max_len);
    NB_CHECK(max_batch >= 1, "pass --batch >= 1", "batch %d", max_batch);
    NB_CHECK((double)max_batch * (NLK_PER_SAMPLE + c->max_len) < 2147483647.0, "lower --batch or --max-len",
             "a batch of %d samples with histories of up to %d items has too many lookups for 32-bit indices",
             max_batch, c->max_len);
    NB_CHECK(c->aux_weight >= 0 && isfinite(c->aux_weight), "pass --aux-weight >= 0", "aux weight %g",
             (double)c->aux_weight);
    NB_CHECK(c->blocks <= NB_SC_MAX_BLOCKS, hint, "at most %d blocks", NB_SC_MAX_BLOCKS);
    NB_CHECK(!(c->detach & 1), "detach blocks 1 and up (block 0 reads x0, which stays attached)",
             "block 0 cannot be detached");
    NB_CHECK(c->detach >> c->blocks == 0, "detach only blocks that exist (--detach)",
             "a detached block index is not below the %d blocks", c->blocks);
    NB_CHECK(!c->detach || c->aux_weight > 0, "pass --aux-weight > 0 with --detach",
             "detached blocks need their own loss: aux weight is 0");
}

/* A shard's rows and the most rows one batch may ask of it (every rank asks each row once). */
static void plan_shard(nb_sc_model *m, const nb_sc_shard *shard) {
    int64_t total = m->emb_off[NB_SC_NTABLES];
    m->emb_rows = total;
    if (!shard || shard->world < 1) return;
    int N = shard->world, r = shard->rank;
    NB_CHECK(r >= 0 && r < N, "this is a bug in nobubble; please report it", "shard rank %d of %d", r, N);
    m->shard = *shard;
    /* a power of two, so the hot loops split owner-major keys with a shift and a mask */
    int64_t per = (total + N - 1) / N;
    m->shard_shift = 0;
    while (((int64_t)1 << m->shard_shift) < per) m->shard_shift++;
    m->shard_stride = (int64_t)1 << m->shard_shift;
    m->emb_rows = (total - r + N - 1) / N; /* rows g < total with g % N == r */
    size_t per_rank = max_lookups(m) < (size_t)m->emb_rows ? max_lookups(m) : (size_t)m->emb_rows;
    m->max_served = (size_t)N * (per_rank ? per_rank : 1);
    m->max_window = m->max_served * (size_t)m->nparts;
}

/* Device lists need a device, whole tables (a sharded batch's owner plans are host work) and
 * rows that fit the device sort's 32-bit keys. */
static int choose_lists(const nb_sc_model *m, int want) {
    int can = !on_cpu(m) && !sharded(m) && m->emb_off[NB_SC_NTABLES] <= ((int64_t)1 << 32);
    NB_CHECK(want != NB_SC_LISTS_DEVICE || can, "use --index-lists host (or auto)",
             "--index-lists device needs a CUDA device, tables that are not sharded over ranks and at most 2^32 rows "
             "(%s)", on_cpu(m) ? "this run is on the CPU" : sharded(m) ? "the tables are sharded" : "more rows");
    return want == NB_SC_LISTS_HOST ? 0 : can;
}

void nb_sc_plan(nb_sc_model *m, const nb_sc_config *cfg, int max_batch, const nb_backend_i *be,
                const nb_sc_plan_opts *po, nb_arena *dev, nb_arena *pinned, nb_arena *host) {
    nb_sc_plan_opts none = {.emb_opt = -1};
    if (!po) po = &none;
    int emb_opt = po->emb_opt;
    memset(m, 0, sizeof *m);
    check_config(cfg, max_batch);
    m->cfg = *cfg;
    const nb_sc_config *c = &m->cfg;
    m->be = be;
    m->co = nb_ctr_ops_for(be);
    m->max_batch = max_batch;
    m->emb_opt = emb_opt;
    m->pad_rows = be->device != NB_DEV_CPU;
    m->D0 = 29 * c->E;
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
    for (int t = 0; t < NB_SC_NTABLES; t++) {
        int64_t rows = t < NB_SC_NCAT ? c->cat_rows[t] : c->item_rows;
        NB_CHECK(rows >= 1, "every table needs at least one row", "table %d has %lld rows", t, (long long)rows);
        m->emb_off[t + 1] = m->emb_off[t] + rows;
    }
    m->nparts = po->parts > 1 ? po->parts : 1;
    plan_shard(m, po->shard.world > 0 ? &po->shard : NULL);
    if (sharded(m)) m->wins = nb_calloc(NB_SC_RING, sizeof(nb_sc_window), "seqctr windows");
    m->pipelined = po->pipelined && sharded(m);
    m->priority = po->priority && m->pipelined;
    m->host_tables = po->host_tables;
    m->dev_lists = choose_lists(m, po->lists);
    m->spans = nb_malloc((size_t)m->ntensors * sizeof *m->spans, "seqctr AdamW tensor table");
    for (int i = 0; i < m->ntensors; i++) m->spans[i] = (nb_adamw_span){m->t[i].off, m->t[i].n, m->t[i].decay ? 0 : 1};
    m->acts = nb_calloc(1, sizeof *m->acts, "seqctr activations");
    acts_tables(m);
    for (int k = 0; k <= NB_SC_RING; k++) m->stages[k] = nb_calloc(1, sizeof(nb_sc_stage), "seqctr batch");
    m->ar_dev = dev, m->ar_pin = pinned, m->ar_host = host;
    m->ar_start[AR_DEV] = dev->planned, m->ar_start[AR_PIN] = pinned->planned, m->ar_start[AR_HOST] = host->planned;
    layout(m);
}

/* Every element of global row g is element g * E + e of one normal sequence: a shard draws its
 * rows' elements, so N ranks start from the tables of one. */
static void init_tables(nb_sc_model *m) {
    size_t E = (size_t)m->cfg.E;
    uint64_t stream = nb_rng_stream_id("emb");
    if (!sharded(m)) {
        nb_rng_fill_normal(m->emb, (size_t)m->emb_rows * E, m->cfg.seed, stream, 0.0f, 0.05f);
        return;
    }
    int64_t N = m->shard.world, r = m->shard.rank;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < m->emb_rows; i++) {
        uint64_t g = (uint64_t)(i * N + r);
        for (size_t e = 0; e < E; e++) m->emb[(size_t)i * E + e] = 0.0f + 0.05f * nb_rng_normal_at(m->cfg.seed, stream, g * E + e);
    }
}

void nb_sc_bind(nb_sc_model *m, nb_ctx ctx) {
    nb_arena_seek(m->ar_dev, m->ar_start[AR_DEV]);
    nb_arena_seek(m->ar_pin, m->ar_start[AR_PIN]);
    nb_arena_seek(m->ar_host, m->ar_start[AR_HOST]);
    layout(m);
    m->stage = m->stages[0];
    m->uniq_rows = m->stage->h_uniq;
    m->nqueue = 0, m->ring = 0, m->prepared = m->next = m->latest = m->prev_train = NULL;
    m->wring = 0, m->cur_win = m->prev_win = NULL;
    bind_views(m);
    init_params(m);
    if (m->h_iota) {
        for (size_t i = 0; i < max_lookups(m); i++) m->h_iota[i] = (int64_t)i;
        if (!on_cpu(m)) m->be->to_backend(ctx, m->d_iota, m->h_iota, max_lookups(m) * sizeof(int64_t));
    }
    init_tables(m);
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
    free(a->seg), free(a->h), free(a->enc), free(a->xs), free(a->c), free(a->vx), free(a->hid), free(a->logit), free(a->dz);
    for (int k = 0; k <= NB_SC_RING; k++) free(m->stages[k]);
    free(m->wins);
    free(m->spans);
    free(m->w.hist), free(m->dw.hist), free(m->w.block), free(m->dw.block);
    free(a);
    if (m->own_arenas) {
        for (int k = 0; k < 3; k++) nb_arena_free(&m->own_arenas[k]);
        free(m->own_arenas);
    }
    nb_backend_destroy(m->own_backend);
    memset(m, 0, sizeof *m);
}

void nb_sc_set_ctx(nb_sc_model *m, const nb_task_ctx *ctx) { m->ctx = ctx; }

/* host <-> backend copies of the optimizer state (dense moments, the tables' state) */
static void optim_state_copy(nb_sc_model *m, nb_ctx c, int up) {
    size_t nemb = (size_t)m->emb_rows * (size_t)m->cfg.E, rows = (size_t)m->emb_rows;
    float *d[5] = {m->d_am, m->d_av, m->d_eacc, m->d_em, m->d_ev}, *h[5] = {m->am, m->av, m->eacc, m->em, m->ev};
    size_t n[5] = {m->nparams, m->nparams, rows, nemb, nemb};
    for (int k = 0; k < 5; k++) {
        if (!d[k] || d[k] == h[k]) continue; /* host tables: one copy */
        if (up)
            m->be->to_backend(c, d[k], h[k], n[k] * sizeof(float));
        else
            m->be->to_host(c, h[k], d[k], n[k] * sizeof(float));
    }
}

void nb_sc_to_device(nb_sc_model *m) {
    nb_ctx c = CTX(m);
    size_t nemb = (size_t)m->emb_rows * (size_t)m->cfg.E;
    if (!on_cpu(m)) {
        m->be->to_backend(c, m->d_params, m->params, m->nparams * sizeof(float));
        if (!host_tables(m)) m->be->to_backend(c, m->d_emb, m->emb, nemb * sizeof(float));
        optim_state_copy(m, c, 1);
    }
    if (m->d_w != (void *)m->d_params) m->be->cast_params(c, m->d_w, m->d_params, m->nparams);
}

static void learn_unique(nb_sc_model *m, nb_sc_stage *s, int with_rows);

void nb_sc_to_host(nb_sc_model *m) {
    if (on_cpu(m)) return;
    nb_ctx c = CTX(m);
    size_t nemb = (size_t)m->emb_rows * (size_t)m->cfg.E;
    m->be->to_host(c, m->params, m->d_params, m->nparams * sizeof(float));
    m->be->to_host(c, m->grads, m->d_grads, m->nparams * sizeof(float));
    if (!host_tables(m)) m->be->to_host(c, m->emb, m->d_emb, nemb * sizeof(float));
    if (m->dev_lists && m->stage) learn_unique(m, m->stage, 1);
    if (m->nuniq > 0) m->be->to_host(c, m->uniq_grads, m->d_uniq_grads, (size_t)m->nuniq * m->cfg.E * sizeof(float));
    optim_state_copy(m, c, 0);
}

void nb_sc_zero_grads(nb_sc_model *m) { m->be->zero(CTX(m), m->d_grads, m->nparams * sizeof(float)); }

static void check_batch(const nb_sc_model *m, const nb_sc_batch *b) {
    NB_CHECK(b->B >= 1 && b->B <= m->max_batch, "pass a batch no larger than the model was built for",
             "batch of %d samples, model built for at most %d", b->B, m->max_batch);
    for (int i = 0; i < b->B; i++) {
        int len = b->hist_len[i];
        NB_CHECK(len >= 0 && len <= m->cfg.max_len && len <= b->hist_stride, "histories are capped at --max-len",
                 "sample %d has a history of %d items (max_len %d)", i, len, m->cfg.max_len);
    }
}

/* Host side of a step: the lookup lists (see the top of this file) and their deduplication. */
static void prepare_into(nb_sc_model *m, const nb_sc_batch *b, nb_sc_stage *s);

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

/* Training batches go round the ring: at most the step's batch, the next one and the one after
 * are in use at a time (a pipelined schedule fetches the next one's rows while the step trains,
 * and the host prepares the one after). */
void nb_sc_prepare(nb_sc_model *m, const nb_sc_batch *b) { nb_sc_prepare_part(m, b, 0, 1); }

void nb_sc_prepare_part(nb_sc_model *m, const nb_sc_batch *b, int part, int nparts) {
    check_batch(m, b);
    NB_CHECK(part >= 0 && part < nparts && nparts <= m->nparts, "this is a bug in nobubble; please report it",
             "seqctr: part %d of %d (the model was planned for windows of %d parts)", part, nparts, m->nparts);
    NB_CHECK(m->nqueue < NB_SC_RING - 1, "this is a bug in nobubble; please report it",
             "seqctr: %d batches prepared ahead of the step (at most %d)", m->nqueue + 1, NB_SC_RING - 1);
    nb_sc_stage *s = m->stages[m->ring];
    m->ring = (m->ring + 1) % NB_SC_RING;
    prepare_into(m, b, s);
    s->part = part, s->nparts = nparts;
    if (sharded(m)) { /* a window begins with its first part */
        if (part == 0) {
            m->prev_win = m->cur_win;
            m->cur_win = &m->wins[m->wring];
            m->wring = (m->wring + 1) % NB_SC_RING;
            m->cur_win->parts_done = m->cur_win->complete = 0;
            m->cur_win->n = 0;
        }
        NB_CHECK(m->cur_win && m->cur_win->parts_done == part, "this is a bug in nobubble; please report it",
                 "seqctr: part %d prepared out of order", part);
        s->win = m->cur_win, s->prev_win = m->prev_win;
    }
    m->queue[m->nqueue++] = s;
    m->prepared = m->queue[0];
    m->prev_train = m->latest && m->latest != m->stages[NB_SC_RING] ? m->latest : m->prev_train;
    m->latest = s;
    m->stage_nh = s->nh_real;
}

int nb_sc_first_part(const nb_sc_model *m) { return !m->stage || m->stage->part == 0; }

int nb_sc_rows_ahead(const nb_sc_model *m) { return m->stage && m->priority ? m->stage->nexcl_in : -1; }

/* Device lists: the count from the device (its upload phase wrote it), the rows with it. */
static void learn_unique(nb_sc_model *m, nb_sc_stage *s, int with_rows) {
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
    learn_unique(m, m->stage, 0);
    return m->stage->nuniq;
}

void nb_sc_batch_rows(nb_sc_model *m, int *distinct, int *resynced) {
    *distinct = nb_sc_unique_rows(m);
    *resynced = m->stage && m->pipelined ? m->stage->nresync_in : 0;
}

int nb_sc_current_slot(const nb_sc_model *m) {
    for (int k = 0; k <= NB_SC_RING; k++)
        if (m->stage == m->stages[k]) return k;
    return 0;
}

int nb_sc_prepared_rows(const nb_sc_model *m) { return m->stage ? m->stage->nh : 0; }

/* Sharded: global rows -> owner-major keys (owner * stride + local row), so that the sorted unique
 * rows come grouped by owner, each group in local row order: the order of the rows all-to-all. */
static void to_owner_keys(const nb_sc_model *m, int64_t *rows, size_t n) {
    int64_t N = m->shard.world;
    int sh = m->shard_shift;
    if (N == 1) return; /* one owner: the keys are the rows */
#pragma omp parallel for schedule(static) if (n >= 65536)
    for (size_t i = 0; i < n; i++) rows[i] = rows[i] % N << sh | rows[i] / N;
}

/* Sharded, after the deduplication: the rows asked of each owner, and each lookup's row in the
 * work buffer (its unique row's position: the rows arrive in unique order). */
static void ask_owners(const nb_sc_model *m, nb_sc_stage *s, size_t nlookups) {
    int N = m->shard.world, sh = m->shard_shift;
    int64_t mask = m->shard_stride - 1;
    for (int j = 0; j < N; j++) s->asked[j] = 0;
    for (int u = 0; u < s->nuniq; u++) s->asked[s->h_uniq[u] >> sh]++;
#pragma omp parallel for schedule(static) if (s->nuniq >= 65536)
    for (int u = 0; u < s->nuniq; u++) s->h_ask[u] = s->h_uniq[u] & mask;
    for (int j = 0, at = 0; j < N; at += (int)s->asked[j], j++) s->asked_displ[j] = (size_t)at;
#pragma omp parallel for schedule(static) if (nlookups >= 65536)
    for (size_t i = 0; i < nlookups; i++) s->h_rows[i] = s->h_inverse[i];
}

static void find_collisions(nb_sc_model *m, nb_sc_stage *s);

void nb_sc_asked(const nb_sc_model *m, const int64_t **ids, const size_t **asked) {
    NB_ASSERT(sharded(m) && m->latest);
    *ids = m->latest->h_ask;
    *asked = m->latest->asked;
}

/* The window gets the part's served rows; after its last part: the owner's sums per row over
 * every part and asker, in (part, rank) order. */
static void add_to_window(nb_sc_model *m, nb_sc_stage *s) {
    nb_sc_window *w = s->win;
    int64_t E = m->cfg.E;
    NB_CHECK(w->n + (size_t)s->nserve <= m->max_window, "this is a bug in nobubble; please report it",
             "seqctr: a window's rows exceed the %zu planned", m->max_window);
    w->part_base[s->part] = w->n;
    for (int i = 0; i < s->nserve; i++, w->n++) w->h_serve[w->n] = s->h_serve[i], w->h_off[w->n] = (int64_t)w->n * E;
    w->parts_done++;
    if (s->part + 1 < s->nparts) return;
    w->nown = nb_embag_unique_groups(w->h_own, w->h_order, w->h_seg, w->h_inverse, w->h_serve, (int)w->n, w->h_keys);
    w->complete = 1;
}

void nb_sc_serve(nb_sc_model *m, const int64_t *ids, const size_t *served) {
    NB_ASSERT(sharded(m) && m->latest);
    nb_sc_stage *s = m->latest;
    size_t n = 0;
    for (int j = 0; j < m->shard.world; j++) s->served_displ[j] = n, s->served[j] = served[j], n += served[j];
    NB_CHECK(n <= m->max_served, "this is a bug in nobubble; please report it",
             "rank %d is asked for %zu rows, more than the %zu planned", m->shard.rank, n, m->max_served);
    int64_t E = m->cfg.E;
    for (size_t i = 0; i < n; i++) {
        NB_CHECK(ids[i] >= 0 && ids[i] < m->emb_rows, "the ranks disagree on the tables: start every rank with the same flags and data",
                 "rank %d is asked for row %lld of its shard, which has %lld rows", m->shard.rank, (long long)ids[i],
                 (long long)m->emb_rows);
        s->h_serve[i] = ids[i];
        s->h_serve_off[i] = (int64_t)i * E;
    }
    s->nserve = (int)n;
    if (s == m->stages[NB_SC_RING]) return; /* evaluation: lookups only */
    add_to_window(m, s);
    if (m->pipelined) find_collisions(m, s);
}


/* The served rows of s that the window before it updates on this owner (its unique rows):
 * fetched before that update, they are sent again after it. Only a window's first part is
 * fetched before the window before it is done (its later parts are fetched while it trains);
 * a window with nothing before it has none. */
static void find_collisions(nb_sc_model *m, nb_sc_stage *s) {
    const nb_sc_window *prev = s->part == 0 ? s->prev_win : NULL;
    NB_CHECK(!prev || prev->complete, "this is a bug in nobubble; please report it",
             "seqctr: a window's first part planned before the window before it");
    int N = m->shard.world, c = 0;
    uint64_t *bits = m->own_bits; /* the previous window's rows, one bit per row of the shard */
    if (prev)
        for (int u = 0; u < prev->nown; u++) bits[prev->h_own[u] >> 6] |= 1ULL << (prev->h_own[u] & 63);
    int x = 0; /* --emb-priority: the exclusive rows, sent ahead */
    for (int j = 0; j < N; j++) {
        s->resync_out_displ[j] = (size_t)c;
        if (m->priority) s->excl_out_displ[j] = (size_t)x;
        for (size_t q = 0; q < s->served[j]; q++) {
            int64_t row = s->h_serve[s->served_displ[j] + q];
            if (prev && bits[row >> 6] >> (row & 63) & 1) {
                s->h_resync_src[c] = row;
                s->h_resync_pos[c++] = (int64_t)q;
            } else if (m->priority) {
                s->h_excl_src[x++] = row;
            }
        }
        s->resync_out[j] = (size_t)c - s->resync_out_displ[j];
        if (m->priority) s->excl_out[j] = (size_t)x - s->excl_out_displ[j];
    }
    s->nresync_out = c, s->nexcl_out = x;
    if (prev)
        for (int u = 0; u < prev->nown; u++) bits[prev->h_own[u] >> 6] = 0;
}

void nb_sc_collisions(const nb_sc_model *m, const int64_t **pos, const size_t **counts) {
    NB_ASSERT(m->pipelined && m->latest);
    *pos = m->latest->h_resync_pos;
    *counts = m->latest->resync_out;
}

void nb_sc_set_resync(nb_sc_model *m, const int64_t *pos, const size_t *counts) {
    NB_ASSERT(m->pipelined && m->latest);
    nb_sc_stage *s = m->latest;
    int64_t E = m->cfg.E;
    size_t n = 0;
    for (int j = 0; j < m->shard.world; j++) {
        s->resync_in_displ[j] = n, s->resync_in[j] = counts[j];
        for (size_t q = 0; q < counts[j]; q++, n++) {
            NB_CHECK(pos[n] >= 0 && (size_t)pos[n] < s->asked[j], "this is a bug in nobubble; please report it",
                     "rank %d: owner %d re-syncs position %lld of %zu rows asked", m->shard.rank, j, (long long)pos[n], s->asked[j]);
            s->h_resync_dst[n] = ((int64_t)s->asked_displ[j] + pos[n]) * E;
        }
    }
    s->nresync_in = (int)n;
    if (!m->priority) return;
    size_t x = 0, at = 0;
    for (int j = 0; j < m->shard.world; j++) { /* positions are increasing per owner (find_collisions' order) */
        s->excl_in_displ[j] = x;
        size_t q = 0, end = at + counts[j];
        for (size_t p = 0; p < s->asked[j]; p++) {
            if (at + q < end && (size_t)pos[at + q] == p) {
                q++;
                continue;
            }
            s->h_excl_dst[x++] = ((int64_t)s->asked_displ[j] + (int64_t)p) * E;
        }
        NB_CHECK(q == counts[j], "this is a bug in nobubble; please report it", "rank %d: owner %d's collision positions are not increasing",
                 m->shard.rank, j);
        s->excl_in[j] = x - s->excl_in_displ[j];
        at = end;
    }
    s->nexcl_in = (int)x;
}

void nb_sc_exchange_of(const nb_sc_model *m, int which, nb_sc_exchange *x) {
    const nb_sc_stage *s = which == NB_SC_CURRENT ? m->stage : which == NB_SC_NEXT ? m->next : m->latest;
    NB_ASSERT(sharded(m) && s);
    /* a part's gradients land in its window's block of the gradient buffer */
    float *grads_in = m->d_serve_grads + (s->win ? s->win->part_base[s->part] * (size_t)m->cfg.E : 0);
    *x = (nb_sc_exchange){m->d_serve_rows, s->work, m->d_uniq_grads, grads_in, m->d_resync_rows, m->d_resync_in,
                          s->asked, s->asked_displ, s->served, s->served_displ,
                          s->resync_out, s->resync_out_displ, s->resync_in, s->resync_in_displ,
                          m->d_excl_in, s->excl_out, s->excl_out_displ, s->excl_in, s->excl_in_displ};
}

/* Evaluation batches: the stage after the ring, which no training batch uses. */
void *nb_sc_prepare_aside(nb_sc_model *m, const nb_sc_batch *b) {
    check_batch(m, b);
    nb_sc_stage *latest = m->latest;
    prepare_into(m, b, m->stages[NB_SC_RING]);
    m->latest = m->stages[NB_SC_RING];
    return latest;
}

static void begin_stage(nb_sc_model *m, nb_sc_stage *s) {
    m->stage = s;
    m->uniq_rows = s->h_uniq;
    m->nuniq = s->nuniq;
}

void nb_sc_begin_aside(nb_sc_model *m) { begin_stage(m, m->stages[NB_SC_RING]); }

void nb_sc_end_aside(nb_sc_model *m, void *latest) { m->latest = latest; }

/* The lists' shape for a batch of B samples with nh_real history rows, nh with the padding. */
static nb_ctr_lists_shape lists_shape(const nb_sc_model *m, int B, int nh_real, int nh) {
    nb_ctr_lists_shape sh = {.B = B, .ncat = NB_SC_NCAT, .nh = nh_real, .nh_pad = nh, .D0 = m->D0, .E = m->cfg.E,
                             .MB = m->max_batch};
    /* padding rows: gathered and encoded like history rows, in no sample, left out of the
     * deduplication: their gradient is 0 and reaches no table row (sharded: the batch's first
     * unique row; whole tables: the item table's row 0) */
    sh.pad_row = sharded(m) ? 0 : m->emb_off[NB_SC_ITEM_TABLE];
    for (int f = 0; f < NB_SC_NTABLES; f++) {
        sh.off[f] = m->emb_off[f];
        sh.rows[f] = f < NB_SC_NCAT ? m->cfg.cat_rows[f] : m->cfg.item_rows;
    }
    return sh;
}

static nb_ctr_lists_shape stage_shape(const nb_sc_model *m, const nb_sc_stage *s) {
    return lists_shape(m, s->B, s->nh_real, s->nh);
}

static void prepare_into(nb_sc_model *m, const nb_sc_batch *b, nb_sc_stage *s) {
    int B = b->B;
    s->B = B;
    s->has_label = b->label != NULL;
    memcpy(s->h_dense, b->dense, (size_t)B * NB_SC_NDENSE * sizeof(float));
    if (b->label) memcpy(s->h_label, b->label, (size_t)B * sizeof(float));
    s->h_off[0] = 0;
    for (int i = 0; i < B; i++) s->h_off[i + 1] = s->h_off[i] + b->hist_len[i];
#pragma omp parallel for schedule(static) if (B >= 256)
    for (int i = 0; i < B; i++)
        memcpy(s->h_hist + s->h_off[i], b->hist + (size_t)i * b->hist_stride, (size_t)b->hist_len[i] * sizeof(uint32_t));
    s->nh_real = s->h_off[B];
    s->nh = m->pad_rows ? bucket_rows(s->nh_real, m->max_batch * m->cfg.max_len) : s->nh_real;
    s->nlk_real = B * NLK_PER_SAMPLE + s->nh_real;
    s->nlk = B * NLK_PER_SAMPLE + s->nh;
    if (m->dev_lists) { /* the device builds the lists from these in the upload phase */
        memcpy(s->h_cat, b->cat, (size_t)B * NB_SC_NCAT * sizeof(uint32_t));
        memcpy(s->h_target, b->target, (size_t)B * sizeof(uint32_t));
        s->nuniq = -1;
        return;
    }
    nb_ctr_lists_shape sh = stage_shape(m, s);
    nb_ctr_lists(&sh, b->cat, b->target, s->h_hist, s->h_off, s->h_rows, s->h_dst, s->h_src);
    size_t k = (size_t)s->nlk_real;
    if (sharded(m)) to_owner_keys(m, s->h_rows, k);
    s->nuniq = nb_embag_unique_groups(s->h_uniq, s->h_order, s->h_seg, s->h_inverse, s->h_rows, (int)k, s->h_keys);
    if (sharded(m)) ask_owners(m, s, k);
}

/* A window's last part: after its backward the owner sums the window's gradients and updates. */
static int is_window_end(const nb_sc_stage *s) { return s->win && s->part + 1 == s->nparts; }

/* Device lists: the raw ids in, the lists built and deduplicated there (an evaluation batch's
 * too: nb_sc_forward's batch may be trained on). */
static void upload_build(nb_sc_model *m, nb_ctx c, const nb_sc_stage *s) {
    const nb_backend_i *be = m->be;
    size_t B = (size_t)s->B;
    be->to_backend(c, s->d_dense, s->h_dense, B * NB_SC_NDENSE * sizeof(float));
    if (s->has_label) be->to_backend(c, s->d_label, s->h_label, B * sizeof(float));
    be->to_backend(c, s->d_cat, s->h_cat, B * NB_SC_NCAT * sizeof(uint32_t));
    be->to_backend(c, s->d_target, s->h_target, B * sizeof(uint32_t));
    be->to_backend(c, s->d_hist, s->h_hist, (size_t)s->nh_real * sizeof(uint32_t));
    be->to_backend(c, s->d_off, s->h_off, (B + 1) * sizeof(int32_t));
    nb_ctr_lists_shape sh = stage_shape(m, s);
    m->co->lists(c, &sh, s->d_cat, s->d_target, s->d_hist, s->d_off, s->d_rows, s->d_dst, s->d_src);
    m->co->unique_groups(c, s->d_uniq, s->d_order, s->d_seg, s->d_count, s->d_rows, s->nlk_real,
                         m->emb_off[NB_SC_NTABLES] - 1);
}

/* Copies the prepared lists in, or has the device build them (nothing to copy on the CPU). */
static void upload_stage(nb_sc_model *m, nb_ctx c, const nb_sc_stage *s) {
    if (on_cpu(m)) return;
    if (m->dev_lists) {
        upload_build(m, c, s);
        return;
    }
    const nb_backend_i *be = m->be;
    size_t n = (size_t)s->nlk, U = (size_t)s->nuniq;
    be->to_backend(c, s->d_dense, s->h_dense, (size_t)s->B * NB_SC_NDENSE * sizeof(float));
    if (s->has_label) be->to_backend(c, s->d_label, s->h_label, (size_t)s->B * sizeof(float));
    be->to_backend(c, s->d_rows, s->h_rows, n * sizeof(int64_t));
    be->to_backend(c, s->d_dst, s->h_dst, n * sizeof(int64_t));
    be->to_backend(c, s->d_src, s->h_src, n * sizeof(int64_t));
    be->to_backend(c, s->d_order, s->h_order, n * sizeof(int32_t));
    be->to_backend(c, s->d_seg, s->h_seg, (U + 1) * sizeof(int32_t));
    be->to_backend(c, s->d_uniq, s->h_uniq, U * sizeof(int64_t));
    be->to_backend(c, s->d_off, s->h_off, ((size_t)s->B + 1) * sizeof(int32_t));
    if (!sharded(m)) return;
    size_t ns = (size_t)s->nserve;
    be->to_backend(c, s->d_serve, s->h_serve, ns * sizeof(int64_t));
    be->to_backend(c, s->d_serve_off, s->h_serve_off, ns * sizeof(int64_t));
    if (is_window_end(s)) { /* the window's sums and update, read after this part's backward */
        const nb_sc_window *w = s->win;
        be->to_backend(c, w->d_off, w->h_off, w->n * sizeof(int64_t));
        be->to_backend(c, w->d_own, w->h_own, (size_t)w->nown * sizeof(int64_t));
        be->to_backend(c, w->d_order, w->h_order, w->n * sizeof(int32_t));
        be->to_backend(c, w->d_seg, w->h_seg, ((size_t)w->nown + 1) * sizeof(int32_t));
    }
    if (!m->pipelined) return;
    be->to_backend(c, s->d_resync_src, s->h_resync_src, (size_t)s->nresync_out * sizeof(int64_t));
    be->to_backend(c, s->d_resync_dst, s->h_resync_dst, (size_t)s->nresync_in * sizeof(int64_t));
    if (!m->priority) return;
    be->to_backend(c, s->d_excl_src, s->h_excl_src, (size_t)s->nexcl_out * sizeof(int64_t));
    be->to_backend(c, s->d_excl_dst, s->h_excl_dst, (size_t)s->nexcl_in * sizeof(int64_t));
}

static void upload_batch(nb_sc_model *m, nb_ctx c) { upload_stage(m, c, m->stage); }

/* Sharded: the rows the askers want, from this owner's shard (host tables: read over the bus),
 * fp32 (the all-to-all moves them). ahead: the next batch's lookups while the step trains (with
 * --emb-priority its exclusive rows only, packed: the offsets j * E of the served list serve as
 * theirs) */
static void serve_stage(nb_sc_model *m, nb_ctx c, const nb_sc_stage *s, int ahead) {
    int excl = ahead && m->priority, n = excl ? s->nexcl_out : s->nserve;
    const int64_t *rows = excl ? s->d_excl_src : s->d_serve;
    nb_ctr_ops_f32_for(m->be)->emb_gather(c, m->d_serve_rows, s->d_serve_off, m->d_emb, rows, n, m->cfg.E);
}

/* --emb-priority, after the exclusive rows' all-to-all: into their places in the next batch's work */
static void fetch_apply(nb_sc_model *m, nb_ctx c, const nb_sc_stage *s) {
    if (!m->priority || !s->nexcl_in) return;
    nb_ctr_ops_f32_for(m->be)->emb_gather(c, s->work, s->d_excl_dst, m->d_excl_in, m->d_iota, s->nexcl_in, m->cfg.E);
}

static void serve_rows(nb_sc_model *m, nb_ctx c) { serve_stage(m, c, m->stage, 0); }

/* Pipelined, once the step's table update is done: the next batch's collision rows, from this
 * owner's updated shard, to send again (the offsets j * E of the served list serve as theirs). */
static void resync_serve(nb_sc_model *m, nb_ctx c, const nb_sc_stage *s) {
    if (m->skip_resync || !s->nresync_out) return;
    nb_ctr_ops_f32_for(m->be)->emb_gather(c, m->d_resync_rows, s->d_serve_off, m->d_emb, s->d_resync_src, s->nresync_out,
                                          m->cfg.E);
}

/* And after their all-to-all: the fresh rows over the stale ones in the next batch's work buffer. */
static void resync_apply(nb_sc_model *m, nb_ctx c, const nb_sc_stage *s) {
    if (m->skip_resync || !s->nresync_in) return;
    nb_ctr_ops_f32_for(m->be)->emb_gather(c, s->work, s->d_resync_dst, m->d_resync_in, m->d_iota, s->nresync_in, m->cfg.E);
}

void nb_sc_enqueue_next_phase(nb_sc_model *m, const nb_task_ctx *ctx, int phase) {
    nb_ctx c = ctx ? ctx : CTX(m);
    const nb_sc_stage *s = m->next;
    NB_CHECK(s != NULL, "this is a bug in nobubble; please report it", "seqctr: a next-batch phase without a next batch");
    switch (phase) {
    case NB_SC_FWD_UPLOAD: upload_stage(m, c, s); break;
    case NB_SC_EMB_SERVE: serve_stage(m, c, s, 1); break;
    case NB_SC_FETCH_APPLY: fetch_apply(m, c, s); break;
    case NB_SC_RESYNC_SERVE: resync_serve(m, c, s); break;
    case NB_SC_RESYNC_APPLY: resync_apply(m, c, s); break;
    default: NB_ASSERT(!"not a next-batch phase");
    }
}

/* Sharded, after the gradient all-to-all: each served row's gradient summed over its askers in
 * rank order. */
static void sum_served(nb_sc_model *m, nb_ctx c) {
    const nb_sc_stage *s = m->stage;
    if (!is_window_end(s)) return;
    const nb_sc_window *w = s->win;
    nb_ctr_ops_f32_for(m->be)->emb_grad_unique(c, m->d_own_grads, m->d_serve_grads, w->d_off, w->d_order, w->d_seg, NULL,
                                               w->nown, m->cfg.E);
}

/* The table the batch's lookups read: the tables, or (sharded) the batch's rows from the owners. */
static const float *lookup_table(const nb_sc_model *m) { return sharded(m) ? m->stage->work : m->d_emb; }

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
        be->cast_params(c, a->dense, m->stage->d_dense, (size_t)B * NB_SC_NDENSE);
        dense = a->dense;
    }
    be->matmul_fwd(c, a->a1, dense, w->weight[0], w->bias[0], B, NB_SC_NDENSE, NB_SC_BOTTOM1);
    m->co->relu_fwd(c, a->a1, a->a1, (size_t)B * NB_SC_BOTTOM1);
    be->matmul_fwd(c, a->a2, a->a1, w->weight[1], w->bias[1], B, NB_SC_BOTTOM1, NB_SC_BOTTOM2);
    m->co->relu_fwd(c, a->a2, a->a2, (size_t)B * NB_SC_BOTTOM2);
    be->matmul_fwd(c, a->bot, a->a2, w->weight[2], w->bias[2], B, NB_SC_BOTTOM2, E);
}

static void bottom_bwd(nb_sc_model *m, nb_ctx c, int B) {
    const nb_sc_bottom_view *w = &m->w.bottom, *dw = &m->dw.bottom;
    nb_sc_acts *a = m->acts;
    const nb_backend_i *be = m->be;
    int E = m->cfg.E;
    size_t es = act_es(m);
    const void *dense = a->dense ? a->dense : (const void *)m->stage->d_dense;
    be->zero(c, a->da2, (size_t)B * NB_SC_BOTTOM2 * es);
    be->matmul_bwd(c, a->da2, dw->weight[2], dw->bias[2], a->dbot, a->a2, w->weight[2], B, NB_SC_BOTTOM2, E);
    be->zero(c, a->da2p, (size_t)B * NB_SC_BOTTOM2 * es);
    m->co->relu_bwd(c, a->da2p, a->a2, a->da2, (size_t)B * NB_SC_BOTTOM2);
    be->zero(c, a->da1, (size_t)B * NB_SC_BOTTOM1 * es);
    be->matmul_bwd(c, a->da1, dw->weight[1], dw->bias[1], a->da2p, a->a1, w->weight[1], B, NB_SC_BOTTOM1,
                   NB_SC_BOTTOM2);
    be->zero(c, a->da1p, (size_t)B * NB_SC_BOTTOM1 * es);
    m->co->relu_bwd(c, a->da1p, a->a1, a->da1, (size_t)B * NB_SC_BOTTOM1);
    be->matmul_bwd(c, NULL, dw->weight[0], dw->bias[0], a->da1p, dense, w->weight[0], B, NB_SC_NDENSE, NB_SC_BOTTOM1);
}

/* Whether head i contributes to the loss. */
static int head_used(const nb_sc_model *m, int i) { return i == m->cfg.blocks - 1 || m->cfg.aux_weight > 0; }

/* x0 = [bottom | 26 categorical | target | (pooled, later)] and the target embedding. */
void nb_sc_begin_step(nb_sc_model *m) {
    NB_CHECK(m->nqueue > 0, "call nb_sc_prepare before each forward", "seqctr forward without a prepared batch");
    begin_stage(m, m->queue[0]);
    for (int k = 1; k < m->nqueue; k++) m->queue[k - 1] = m->queue[k];
    m->nqueue--;
    m->prepared = m->next = m->nqueue ? m->queue[0] : NULL;
}

static void embedding_fwd(nb_sc_model *m, nb_ctx c) {
    nb_sc_acts *a = m->acts;
    nb_sc_stage *s = m->stage;
    const nb_ctr_ops_i *co = m->co;
    int B = s->B, E = m->cfg.E, D0 = m->D0;
    if (s->part == 0) m->be->zero(c, m->d_loss, sizeof(double)); /* a window's parts add up their losses */
    /* the gradient region is zeroed here, on the forward's lane, so that the segments' backward
     * passes (on any lane, after their forward) can accumulate into it */
    m->be->zero(c, a->dsrc, ((size_t)m->max_batch * (D0 + E) + (size_t)s->nh * E) * act_es(m));
    bottom_fwd(m, c, B);
    co->copy_cols(c, a->x0, D0, a->bot, E, B, E);
    co->emb_gather(c, a->x0, s->d_dst, lookup_table(m), s->d_rows, B * NB_SC_NTABLES, E);
    co->copy_cols(c, a->temb, E, AT(m, a->x0, (size_t)(1 + NB_SC_NCAT) * E), D0, B, E);
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
        size_t first = (size_t)B * NLK_PER_SAMPLE;
        co->emb_gather(c, a->h[0], s->d_dst + first, lookup_table(m), s->d_rows + first, nh, E);
        for (int l = 0; l < cf->hist_layers; l++) encoder_fwd(m, c, l, nh);
        be->matmul_fwd(c, a->q, a->temb, m->w.target.wq, NULL, B, E, E);
        be->matmul_fwd(c, a->kv, a->h[cf->hist_layers], m->w.target.wk, NULL, nh, E, 2 * E);
        co->targetattn_fwd(c, a->pooled, a->attn, a->q, a->kv, AT(m, a->kv, (size_t)E), s->d_off, B, cf->max_len, E,
                           2 * E);
    } else {
        be->zero(c, a->pooled, (size_t)B * E * act_es(m));
    }
    co->copy_cols(c, AT(m, a->x0, (size_t)28 * E), D0, a->pooled, E, B, E);
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
    for (int i = m->seg_first[k]; i < m->seg_first[k + 1]; i++) {
        const nb_sc_block_view *w = &m->w.block[i];
        const void *xprev = i ? a->xs[i - 1] : a->x0;
        co->cross_fwd(c, a->c[i], a->vx[i], a->x0, xprev, w->U, w->V, w->b, B, D0, r);
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

static void forward_phases(nb_sc_model *m, nb_ctx c) {
    upload_batch(m, c);
    embedding_fwd(m, c);
    history_fwd(m, c);
    for (int k = 0; k < m->nseg; k++) segment_fwd(m, c, k);
}

void nb_sc_forward_enqueue(nb_sc_model *m) {
    nb_sc_begin_step(m);
    forward_phases(m, CTX(m));
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
    check_batch(m, b);
    NB_CHECK(!sharded(m), "this is a bug in nobubble; please report it",
             "nb_sc_forward on a sharded model (its rows come from the owners: nb_sc_prepare_aside)");
    prepare_into(m, b, m->stages[NB_SC_RING]);
    begin_stage(m, m->stages[NB_SC_RING]);
    forward_phases(m, CTX(m));
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
        if (keep_prev) be->zero(c, g->dprev, BD * es);
        co->cross_bwd(c, g->dx0, keep_prev ? g->dprev : NULL, dw->U, dw->V, dw->b, g->dc, a->x0, xprev, w->U, w->V,
                      w->b, a->vx[i], B, D0, r);
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
    m->co->copy_cols(c, a->dpooled, E, AT(m, a->dx0, (size_t)28 * E), D0, B, E);
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

/* The embedding rows: one dedup over all lookups, so an item row's target and history
 * gradients are summed. */
static void embedding_bwd(nb_sc_model *m, nb_ctx c) {
    nb_sc_stage *s = m->stage;
    m->co->emb_grad_unique(c, m->d_uniq_grads, m->acts->dsrc, s->d_src, s->d_order, s->d_seg, dev_count(m, s),
                           rows_bound(m, s), m->cfg.E);
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

static void optim_emb(nb_sc_model *m, nb_ctx c, const nb_sc_optim *o, int t) {
    nb_sc_stage *s = m->stage;
    int E = m->cfg.E;
    if (sharded(m)) { /* once per window: the owner's rows, their summed gradients (host tables: written over the bus) */
        if (!is_window_end(s)) return;
        const nb_sc_window *w = s->win;
        const int64_t *own = w->d_own;
        const nb_ctr_ops_i *to = m->co;
        if (o->emb_adam)
            to->sparse_adam(c, m->d_emb, m->d_em, m->d_ev, own, m->d_own_grads, NULL, w->nown, E, o->emb_lr, o->beta1,
                            o->beta2, o->emb_eps, t);
        else
            to->rowwise_adagrad(c, m->d_emb, m->d_eacc, own, m->d_own_grads, NULL, w->nown, E, o->emb_lr, o->emb_eps);
        return;
    }
    if (o->emb_adam) {
        NB_CHECK(m->d_em != NULL, "this is a bug in nobubble; please report it", "sparse Adam without its planned moments");
        m->co->sparse_adam(c, m->d_emb, m->d_em, m->d_ev, s->d_uniq, m->d_uniq_grads, dev_count(m, s), rows_bound(m, s),
                           E, o->emb_lr, o->beta1, o->beta2, o->emb_eps, t);
    } else {
        NB_CHECK(m->d_eacc != NULL, "this is a bug in nobubble; please report it", "Adagrad without its planned sums");
        m->co->rowwise_adagrad(c, m->d_emb, m->d_eacc, s->d_uniq, m->d_uniq_grads, dev_count(m, s), rows_bound(m, s), E,
                               o->emb_lr, o->emb_eps);
    }
}

void nb_sc_optim_prepare(nb_sc_model *m, const nb_sc_optim *o, int t) {
    nb_adamw_scalars *k = m->h_k;
    k[0] = nb_adamw_prepare((nb_adamw_cfg){o->lr, o->beta1, o->beta2, o->eps, o->weight_decay}, t);
    k[1] = nb_adamw_prepare((nb_adamw_cfg){o->lr, o->beta1, o->beta2, o->eps, 0.0f}, t);
}

/* Every dense tensor in one AdamW pass (the same bits as one call per tensor), its scalars from
 * backend memory (a captured graph copies them in), clipped by the dense gradient's global norm
 * when o->grad_clip > 0 (padding between tensors holds zeros: the whole slab gives the norm). */
static void optim_dense(nb_sc_model *m, nb_ctx c, const nb_sc_optim *o) {
    const nb_backend_i *be = m->be;
    if (m->d_k != m->h_k) be->to_backend(c, m->d_k, m->h_k, 2 * sizeof(nb_adamw_scalars));
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
    case NB_SC_FWD_UPLOAD: upload_batch(m, c); break;
    case NB_SC_EMB_SERVE: serve_rows(m, c); break;
    case NB_SC_EMB_SUM: sum_served(m, c); break;
    case NB_SC_FWD_EMB: embedding_fwd(m, c); break;
    case NB_SC_FWD_HIST: history_fwd(m, c); break;
    case NB_SC_FWD_SEG: segment_fwd(m, c, seg); break;
    case NB_SC_BWD_SEG: segment_bwd(m, c, seg); break;
    case NB_SC_BWD_JOIN: join_bwd(m, c); break;
    case NB_SC_BWD_HIST: history_bwd(m, c); break;
    case NB_SC_BWD_BOTTOM: bottom_bwd(m, c, m->stage->B); break;
    case NB_SC_BWD_EMB: embedding_bwd(m, c); break;
    case NB_SC_OPT_EMB: optim_emb(m, c, o, t); break;
    case NB_SC_OPT_DENSE: optim_dense(m, c, o); break;
    case NB_SC_RESYNC_SERVE: /* the next batch's (nothing without one) */
    case NB_SC_RESYNC_APPLY:
    case NB_SC_FETCH_APPLY:
        if (m->next) nb_sc_enqueue_next_phase(m, c, p);
        break;
    default: NB_ASSERT(0);
    }
}

double nb_sc_flops(const nb_sc_model *m, int B, long nh) {
    const nb_sc_config *c = &m->cfg;
    double E = c->E, D0 = m->D0, r = c->cross_rank, H = c->block_hidden;
    double bottom = (double)B * (NB_SC_NDENSE * NB_SC_BOTTOM1 + NB_SC_BOTTOM1 * NB_SC_BOTTOM2 + NB_SC_BOTTOM2 * E);
    double enc = (double)nh * c->hist_layers * (3 * E * E + E * E + 8 * E * E) + (double)nh * 2 * E * E + (double)B * E * E;
    double blocks = (double)B * c->blocks * (2 * D0 * r + 2 * D0 * H + D0);
    return 6.0 * (bottom + enc + blocks); /* 2 FLOPs per MAC, forward + 2x backward */
}

static void tensor_shape(const nb_sc_tensor *t, int *ndim, int64_t shape[2]) {
    *ndim = t->cols == 1 ? 1 : 2;
    shape[0] = t->rows;
    shape[1] = t->cols;
}

static void table_name(char *buf, size_t cap, int t) {
    if (t == NB_SC_ITEM_TABLE)
        snprintf(buf, cap, "emb.item");
    else
        snprintf(buf, cap, "emb.cat.%d", t);
}

void nb_sc_save(const nb_sc_model *m, const char *path) {
    NB_CHECK(!sharded(m), "this is a bug in nobubble; please report it", "nb_sc_save on a sharded model (its rows are on several ranks)");
    const nb_sc_config *c = &m->cfg;
    nb_st_writer *w = nb_st_begin(path);
    char meta[256], names[NB_SC_NTABLES][32];
    snprintf(meta, sizeof meta, "E=%d hist_layers=%d heads=%d blocks=%d cross_rank=%d block_hidden=%d max_len=%d aux_weight=%g",
             c->E, c->hist_layers, c->heads, c->blocks, c->cross_rank, c->block_hidden, c->max_len, (double)c->aux_weight);
    nb_st_meta(w, "seqctr.config", meta);
    for (int i = 0; i < m->ntensors; i++) {
        int nd;
        int64_t sh[2];
        tensor_shape(&m->t[i], &nd, sh);
        nb_st_add(w, m->t[i].name, NB_F32, nd, sh, m->params + m->t[i].off);
    }
    for (int t = 0; t < NB_SC_NTABLES; t++) {
        table_name(names[t], sizeof names[t], t);
        int64_t sh[2] = {m->emb_off[t + 1] - m->emb_off[t], c->E};
        nb_st_add(w, names[t], NB_F32, 2, sh, m->emb + (size_t)m->emb_off[t] * c->E);
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
    for (int t = 0; t < NB_SC_NTABLES; t++) {
        char name[32];
        table_name(name, sizeof name, t);
        int64_t sh[2] = {m->emb_off[t + 1] - m->emb_off[t], m->cfg.E};
        nb_st_read_shaped(f, name, NB_F32, 2, sh, m->emb + (size_t)m->emb_off[t] * m->cfg.E);
    }
    nb_st_close(f);
    nb_sc_to_device(m);
}
