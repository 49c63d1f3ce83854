/* seqctr forward and backward on the CPU (see seqctr.h for the model and the tensor names). */
#include "model/seqctr.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "io/safetensors.h"
#include "ops/ops.h"
#include "ops/ops_ctr.h"
#include "rng.h"

#define LN_EPS 1e-5f

typedef struct {
    float *ln1, *mean1, *rstd1, *qkv, *att, *lse, *x1, *ln2, *mean2, *rstd2, *f1;
} enc_acts;

struct nb_sc_acts {
    float *a1, *a2, *bot, *x0, *dx0;
    float *embg, *temb, *q, *kv, *attn, *pooled;
    float **h; /* [layers + 1] encoder inputs; h[layers] is the output */
    enc_acts *enc;
    float **xs, **c, **vx, **hid, **logit, **dz;
    /* lookups: B*27 categorical + target, then the valid history positions in (b, j) order */
    int64_t *lk_rows;
    int32_t *inverse;
    float *dlk;
    int nlk, Lb; /* of the last forward */
    /* backward scratch */
    float *dcur, *dprev, *dc, *dhid, *dhidp, *dbot, *da2, *da2p, *da1, *da1p;
    float *dtemb, *dq, *dpooled, *dkv, *dh, *dx1, *datt, *dqkv, *dln, *df1, *df1p;
};

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

static void add_tensor(nb_sc_model *m, int *kinds, int kind, int rows, int cols, const char *fmt, int idx) {
    NB_ASSERT(m->ntensors < NB_SC_MAX_TENSORS);
    nb_sc_tensor *t = &m->t[m->ntensors];
    snprintf(t->name, sizeof t->name, fmt, idx);
    t->rows = rows;
    t->cols = cols;
    t->n = (size_t)rows * (size_t)cols;
    t->off = m->nparams;
    t->decay = cols > 1;
    kinds[m->ntensors++] = kind;
    m->nparams += t->n;
}

static void build_tensors(nb_sc_model *m, int *kinds) {
    const nb_sc_config *c = &m->cfg;
    int E = c->E, D0 = m->D0, r = c->cross_rank, H = c->block_hidden;
    const int bdims[4] = {NB_SC_NDENSE, NB_SC_BOTTOM1, NB_SC_BOTTOM2, E};
    for (int i = 0; i < 3; i++) {
        add_tensor(m, kinds, INIT_FANIN, bdims[i + 1], bdims[i], "bottom.%d.weight", i);
        add_tensor(m, kinds, INIT_ZERO, bdims[i + 1], 1, "bottom.%d.bias", i);
    }
    for (int l = 0; l < c->hist_layers; l++) {
        add_tensor(m, kinds, INIT_ONE, E, 1, "hist.%d.ln1.weight", l);
        add_tensor(m, kinds, INIT_ZERO, E, 1, "hist.%d.ln1.bias", l);
        add_tensor(m, kinds, INIT_FANIN, 3 * E, E, "hist.%d.qkv.weight", l);
        add_tensor(m, kinds, INIT_ZERO, 3 * E, 1, "hist.%d.qkv.bias", l);
        add_tensor(m, kinds, INIT_FANIN, E, E, "hist.%d.proj.weight", l);
        add_tensor(m, kinds, INIT_ZERO, E, 1, "hist.%d.proj.bias", l);
        add_tensor(m, kinds, INIT_ONE, E, 1, "hist.%d.ln2.weight", l);
        add_tensor(m, kinds, INIT_ZERO, E, 1, "hist.%d.ln2.bias", l);
        add_tensor(m, kinds, INIT_FANIN, 4 * E, E, "hist.%d.fc1.weight", l);
        add_tensor(m, kinds, INIT_ZERO, 4 * E, 1, "hist.%d.fc1.bias", l);
        add_tensor(m, kinds, INIT_FANIN, E, 4 * E, "hist.%d.fc2.weight", l);
        add_tensor(m, kinds, INIT_ZERO, E, 1, "hist.%d.fc2.bias", l);
    }
    add_tensor(m, kinds, INIT_FANIN, E, E, "target.wq", 0);
    /* wk then wv, adjacent: together they are the fused [2E, E] key/value projection */
    add_tensor(m, kinds, INIT_FANIN, E, E, "target.wk", 0);
    add_tensor(m, kinds, INIT_FANIN, E, E, "target.wv", 0);
    for (int i = 0; i < c->blocks; i++) {
        add_tensor(m, kinds, INIT_FANIN, D0, r, "block.%d.U", i);
        add_tensor(m, kinds, INIT_FANIN, D0, r, "block.%d.V", i);
        add_tensor(m, kinds, INIT_ZERO, D0, 1, "block.%d.b", i);
        add_tensor(m, kinds, INIT_FANIN, H, D0, "block.%d.w1", i);
        add_tensor(m, kinds, INIT_ZERO, H, 1, "block.%d.b1", i);
        add_tensor(m, kinds, INIT_FANIN, D0, H, "block.%d.w2", i);
        add_tensor(m, kinds, INIT_ZERO, D0, 1, "block.%d.b2", i);
        add_tensor(m, kinds, INIT_FANIN, 1, D0, "block.%d.head.w", i);
        add_tensor(m, kinds, INIT_ZERO, 1, 1, "block.%d.head.b", i);
    }
}

const nb_sc_tensor *nb_sc_find(const nb_sc_model *m, const char *name) {
    for (int i = 0; i < m->ntensors; i++)
        if (!strcmp(m->t[i].name, name)) return &m->t[i];
    return NULL;
}

/* Parameter (or gradient, from base) pointer of a named tensor; the name must exist. */
static float *P(const nb_sc_model *m, float *base, const char *fmt, int idx) {
    char name[48];
    snprintf(name, sizeof name, fmt, idx);
    const nb_sc_tensor *t = nb_sc_find(m, name);
    NB_ASSERT(t != NULL);
    return base + t->off;
}

static void init_params(nb_sc_model *m, const int *kinds) {
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

static float *fa(size_t n, const char *what) { return nb_aligned_alloc((n ? n : 1) * sizeof(float), what); }

static void alloc_acts(nb_sc_model *m) {
    const nb_sc_config *c = &m->cfg;
    size_t MB = (size_t)m->max_batch, E = (size_t)c->E, D0 = (size_t)m->D0, ML = (size_t)c->max_len;
    size_t N = MB * ML, H = (size_t)c->block_hidden, r = (size_t)c->cross_rank;
    nb_sc_acts *a = nb_calloc(1, sizeof *a, "seqctr activations");
    a->a1 = fa(MB * NB_SC_BOTTOM1, "seqctr");
    a->a2 = fa(MB * NB_SC_BOTTOM2, "seqctr");
    a->bot = fa(MB * E, "seqctr");
    a->x0 = fa(MB * D0, "seqctr");
    a->dx0 = fa(MB * D0, "seqctr");
    a->embg = fa(MB * NB_SC_NTABLES * E, "seqctr");
    a->temb = fa(MB * E, "seqctr");
    a->q = fa(MB * E, "seqctr");
    a->kv = fa(N * 2 * E, "seqctr");
    a->attn = fa(N, "seqctr");
    a->pooled = fa(MB * E, "seqctr");
    int nl = c->hist_layers;
    a->h = nb_calloc((size_t)nl + 1, sizeof(float *), "seqctr");
    a->enc = nb_calloc((size_t)(nl ? nl : 1), sizeof(enc_acts), "seqctr");
    for (int l = 0; l <= nl; l++) a->h[l] = fa(N * E, "seqctr history");
    for (int l = 0; l < nl; l++) {
        enc_acts *e = &a->enc[l];
        e->ln1 = fa(N * E, "seqctr");
        e->mean1 = fa(N, "seqctr");
        e->rstd1 = fa(N, "seqctr");
        e->qkv = fa(N * 3 * E, "seqctr");
        e->att = fa(N * E, "seqctr");
        e->lse = fa(MB * (size_t)c->heads * ML, "seqctr");
        e->x1 = fa(N * E, "seqctr");
        e->ln2 = fa(N * E, "seqctr");
        e->mean2 = fa(N, "seqctr");
        e->rstd2 = fa(N, "seqctr");
        e->f1 = fa(N * 4 * E, "seqctr");
    }
    int nb = c->blocks;
    float ***lists[] = {&a->xs, &a->c, &a->vx, &a->hid, &a->logit, &a->dz};
    size_t sizes[] = {MB * D0, MB * D0, MB * r, MB * H, MB, MB};
    for (int k = 0; k < 6; k++) {
        *lists[k] = nb_calloc((size_t)nb, sizeof(float *), "seqctr");
        for (int i = 0; i < nb; i++) (*lists[k])[i] = fa(sizes[k], "seqctr blocks");
    }
    size_t nlk = MB * NB_SC_NTABLES + N;
    a->lk_rows = nb_malloc(nlk * sizeof(int64_t), "seqctr lookups");
    a->inverse = nb_malloc(nlk * sizeof(int32_t), "seqctr lookups");
    a->dlk = fa(nlk * E, "seqctr lookup gradients");
    m->uniq_rows = nb_malloc(nlk * sizeof(int64_t), "seqctr unique rows");
    m->uniq_grads = fa(nlk * E, "seqctr unique gradients");
    a->dcur = fa(MB * D0, "seqctr");
    a->dprev = fa(MB * D0, "seqctr");
    a->dc = fa(MB * D0, "seqctr");
    a->dhid = fa(MB * H, "seqctr");
    a->dhidp = fa(MB * H, "seqctr");
    a->dbot = fa(MB * E, "seqctr");
    a->da2 = fa(MB * NB_SC_BOTTOM2, "seqctr");
    a->da2p = fa(MB * NB_SC_BOTTOM2, "seqctr");
    a->da1 = fa(MB * NB_SC_BOTTOM1, "seqctr");
    a->da1p = fa(MB * NB_SC_BOTTOM1, "seqctr");
    a->dtemb = fa(MB * E, "seqctr");
    a->dq = fa(MB * E, "seqctr");
    a->dpooled = fa(MB * E, "seqctr");
    a->dkv = fa(N * 2 * E, "seqctr");
    a->dh = fa(N * E, "seqctr");
    a->dx1 = fa(N * E, "seqctr");
    a->datt = fa(N * E, "seqctr");
    a->dqkv = fa(N * 3 * E, "seqctr");
    a->dln = fa(N * E, "seqctr");
    a->df1 = fa(N * 4 * E, "seqctr");
    a->df1p = fa(N * 4 * E, "seqctr");
    m->acts = a;
}

void nb_sc_init(nb_sc_model *m, const nb_sc_config *cfg, int max_batch) {
    memset(m, 0, sizeof *m);
    m->cfg = *cfg;
    const nb_sc_config *c = &m->cfg;
    static const char *hint = "check the seqctr flags (--emb-dim, --blocks, --cross-rank, --block-hidden, --max-len)";
    NB_CHECK(c->E >= 1 && c->heads >= 1 && c->E % c->heads == 0, hint,
             "embedding width %d must be a positive multiple of the %d heads", c->E, c->heads);
    NB_CHECK(c->hist_layers >= 0 && c->blocks >= 1 && c->cross_rank >= 1 && c->block_hidden >= 1, hint,
             "need hist_layers >= 0, blocks >= 1, cross_rank >= 1, block_hidden >= 1");
    NB_CHECK(c->max_len >= 0 && c->max_len <= 65536, hint, "max_len %d out of 0..65536", c->max_len);
    NB_CHECK(max_batch >= 1, "pass --batch >= 1", "batch %d", max_batch);
    NB_CHECK(c->aux_weight >= 0 && isfinite(c->aux_weight), "pass --aux-weight >= 0", "aux weight %g",
             (double)c->aux_weight);
    m->max_batch = max_batch;
    m->D0 = 29 * c->E;
    int kinds[NB_SC_MAX_TENSORS];
    build_tensors(m, kinds);
    m->params = fa(m->nparams, "seqctr parameters");
    m->grads = fa(m->nparams, "seqctr gradients");
    init_params(m, kinds);
    m->emb_off[0] = 0;
    for (int t = 0; t < NB_SC_NTABLES; t++) {
        int64_t rows = t < NB_SC_NCAT ? c->cat_rows[t] : c->item_rows;
        NB_CHECK(rows >= 1, "every table needs at least one row", "table %d has %lld rows", t, (long long)rows);
        m->emb_off[t + 1] = m->emb_off[t] + rows;
    }
    size_t nemb = (size_t)m->emb_off[NB_SC_NTABLES] * (size_t)c->E;
    m->emb = fa(nemb, "seqctr embedding tables (lower the table cap)");
    nb_rng_fill_normal(m->emb, nemb, c->seed, nb_rng_stream_id("emb"), 0.0f, 0.05f);
    alloc_acts(m);
}

void nb_sc_free(nb_sc_model *m) {
    nb_sc_acts *a = m->acts;
    if (a) {
        const nb_sc_config *c = &m->cfg;
        for (int l = 0; l <= c->hist_layers; l++) free(a->h[l]);
        for (int l = 0; l < c->hist_layers; l++) {
            enc_acts *e = &a->enc[l];
            float *ps[] = {e->ln1, e->mean1, e->rstd1, e->qkv, e->att, e->lse, e->x1, e->ln2, e->mean2, e->rstd2, e->f1};
            for (size_t k = 0; k < sizeof ps / sizeof ps[0]; k++) free(ps[k]);
        }
        free(a->h);
        free(a->enc);
        float **lists[] = {a->xs, a->c, a->vx, a->hid, a->logit, a->dz};
        for (int k = 0; k < 6; k++) {
            for (int i = 0; i < c->blocks; i++) free(lists[k][i]);
            free(lists[k]);
        }
        float *ps[] = {a->a1, a->a2, a->bot, a->x0, a->dx0, a->embg, a->temb, a->q, a->kv, a->attn, a->pooled,
                       a->dlk, a->dcur, a->dprev, a->dc, a->dhid, a->dhidp, a->dbot, a->da2, a->da2p, a->da1,
                       a->da1p, a->dtemb, a->dq, a->dpooled, a->dkv, a->dh, a->dx1, a->datt, a->dqkv, a->dln,
                       a->df1, a->df1p};
        for (size_t k = 0; k < sizeof ps / sizeof ps[0]; k++) free(ps[k]);
        free(a->lk_rows);
        free(a->inverse);
        free(a);
    }
    free(m->uniq_rows);
    free(m->uniq_grads);
    free(m->params);
    free(m->grads);
    free(m->emb);
    memset(m, 0, sizeof *m);
}

static void check_batch(const nb_sc_model *m, const nb_sc_batch *b) {
    NB_CHECK(b->B >= 1 && b->B <= m->max_batch, "pass a batch no larger than the model was built for",
             "batch of %d samples, model built for at most %d", b->B, m->max_batch);
    for (int i = 0; i < b->B; i++) {
        int len = b->hist_len[i];
        NB_CHECK(len >= 0 && len <= m->cfg.max_len && len <= b->hist_stride, "histories are capped at --max-len",
                 "sample %d has a history of %d items (max_len %d)", i, len, m->cfg.max_len);
    }
}

/* Lookup rows: per sample 26 categorical + the target, then the valid history items in
 * (sample, position) order; also gathers the history into h0 [B, Lb, E] (padding zeroed). */
static int build_lookups(nb_sc_model *m, const nb_sc_batch *b, int Lb) {
    nb_sc_acts *a = m->acts;
    int E = m->cfg.E, B = b->B;
    const int64_t *off = m->emb_off;
    int64_t item_rows = m->cfg.item_rows;
    for (int i = 0; i < B; i++) {
        for (int f = 0; f < NB_SC_NCAT; f++)
            a->lk_rows[(size_t)i * NB_SC_NTABLES + f] = off[f] + (int64_t)(b->cat[(size_t)i * NB_SC_NCAT + f] % (uint64_t)m->cfg.cat_rows[f]);
        a->lk_rows[(size_t)i * NB_SC_NTABLES + NB_SC_NCAT] = off[NB_SC_ITEM_TABLE] + (int64_t)(b->target[i] % (uint64_t)item_rows);
    }
    int n = B * NB_SC_NTABLES;
    float *h0 = a->h[0];
    memset(h0, 0, (size_t)B * Lb * E * sizeof(float));
    for (int i = 0; i < B; i++)
        for (int j = 0; j < b->hist_len[i]; j++) {
            int64_t row = off[NB_SC_ITEM_TABLE] + (int64_t)(b->hist[(size_t)i * b->hist_stride + j] % (uint64_t)item_rows);
            a->lk_rows[n++] = row;
            memcpy(h0 + ((size_t)i * Lb + j) * E, m->emb + (size_t)row * E, (size_t)E * sizeof(float));
        }
    return n;
}

static void encoder_fwd(nb_sc_model *m, int l, int B, int Lb, const int32_t *lens) {
    nb_sc_acts *a = m->acts;
    enc_acts *e = &a->enc[l];
    int E = m->cfg.E, N = B * Lb;
    float *w = m->params;
    float *hin = a->h[l], *hout = a->h[l + 1];
    nb_layernorm_forward(e->ln1, e->mean1, e->rstd1, hin, P(m, w, "hist.%d.ln1.weight", l), P(m, w, "hist.%d.ln1.bias", l),
                         N, E, LN_EPS);
    nb_matmul_forward(e->qkv, e->ln1, P(m, w, "hist.%d.qkv.weight", l), P(m, w, "hist.%d.qkv.bias", l), N, E, 3 * E);
    nb_seqattn_forward(e->att, e->lse, e->qkv, lens, B, Lb, m->cfg.heads, E);
    nb_matmul_forward(hout, e->att, P(m, w, "hist.%d.proj.weight", l), P(m, w, "hist.%d.proj.bias", l), N, E, E);
    nb_residual_forward(e->x1, hin, hout, (size_t)N * E);
    nb_layernorm_forward(e->ln2, e->mean2, e->rstd2, e->x1, P(m, w, "hist.%d.ln2.weight", l),
                         P(m, w, "hist.%d.ln2.bias", l), N, E, LN_EPS);
    nb_matmul_forward(e->f1, e->ln2, P(m, w, "hist.%d.fc1.weight", l), P(m, w, "hist.%d.fc1.bias", l), N, E, 4 * E);
    nb_relu_forward(e->f1, e->f1, (size_t)N * 4 * E);
    nb_matmul_forward(hout, e->f1, P(m, w, "hist.%d.fc2.weight", l), P(m, w, "hist.%d.fc2.bias", l), N, 4 * E, E);
    nb_residual_forward(hout, e->x1, hout, (size_t)N * E);
}

static void zero(float *p, size_t n) { memset(p, 0, n * sizeof(float)); }

/* dh: gradient of encoder layer l's output in, of its input out (in place). */
static void encoder_bwd(nb_sc_model *m, int l, int B, int Lb, const int32_t *lens, float *dh) {
    nb_sc_acts *a = m->acts;
    enc_acts *e = &a->enc[l];
    int E = m->cfg.E, N = B * Lb;
    size_t NE = (size_t)N * E;
    float *w = m->params, *g = m->grads;
    float *hin = a->h[l];
    memcpy(a->dx1, dh, NE * sizeof(float));
    zero(a->df1, NE * 4);
    nb_matmul_backward(a->df1, P(m, g, "hist.%d.fc2.weight", l), P(m, g, "hist.%d.fc2.bias", l), dh, e->f1,
                       P(m, w, "hist.%d.fc2.weight", l), N, 4 * E, E);
    zero(a->df1p, NE * 4);
    nb_relu_backward(a->df1p, e->f1, a->df1, NE * 4);
    zero(a->dln, NE);
    nb_matmul_backward(a->dln, P(m, g, "hist.%d.fc1.weight", l), P(m, g, "hist.%d.fc1.bias", l), a->df1p, e->ln2,
                       P(m, w, "hist.%d.fc1.weight", l), N, E, 4 * E);
    nb_layernorm_backward(a->dx1, P(m, g, "hist.%d.ln2.weight", l), P(m, g, "hist.%d.ln2.bias", l), a->dln, e->x1,
                          P(m, w, "hist.%d.ln2.weight", l), e->mean2, e->rstd2, N, E);
    memcpy(dh, a->dx1, NE * sizeof(float));
    zero(a->datt, NE);
    nb_matmul_backward(a->datt, P(m, g, "hist.%d.proj.weight", l), P(m, g, "hist.%d.proj.bias", l), a->dx1, e->att,
                       P(m, w, "hist.%d.proj.weight", l), N, E, E);
    zero(a->dqkv, NE * 3);
    nb_seqattn_backward(a->dqkv, a->datt, e->qkv, e->att, e->lse, lens, B, Lb, m->cfg.heads, E);
    zero(a->dln, NE);
    nb_matmul_backward(a->dln, P(m, g, "hist.%d.qkv.weight", l), P(m, g, "hist.%d.qkv.bias", l), a->dqkv, e->ln1,
                       P(m, w, "hist.%d.qkv.weight", l), N, E, 3 * E);
    nb_layernorm_backward(dh, P(m, g, "hist.%d.ln1.weight", l), P(m, g, "hist.%d.ln1.bias", l), a->dln, hin,
                          P(m, w, "hist.%d.ln1.weight", l), e->mean1, e->rstd1, N, E);
}

static void bottom_fwd(nb_sc_model *m, const nb_sc_batch *b) {
    nb_sc_acts *a = m->acts;
    float *w = m->params;
    int B = b->B, E = m->cfg.E;
    nb_matmul_forward(a->a1, b->dense, P(m, w, "bottom.%d.weight", 0), P(m, w, "bottom.%d.bias", 0), B, NB_SC_NDENSE,
                      NB_SC_BOTTOM1);
    nb_relu_forward(a->a1, a->a1, (size_t)B * NB_SC_BOTTOM1);
    nb_matmul_forward(a->a2, a->a1, P(m, w, "bottom.%d.weight", 1), P(m, w, "bottom.%d.bias", 1), B, NB_SC_BOTTOM1,
                      NB_SC_BOTTOM2);
    nb_relu_forward(a->a2, a->a2, (size_t)B * NB_SC_BOTTOM2);
    nb_matmul_forward(a->bot, a->a2, P(m, w, "bottom.%d.weight", 2), P(m, w, "bottom.%d.bias", 2), B, NB_SC_BOTTOM2, E);
}

static void bottom_bwd(nb_sc_model *m, const nb_sc_batch *b) {
    nb_sc_acts *a = m->acts;
    float *w = m->params, *g = m->grads;
    int B = b->B, E = m->cfg.E;
    zero(a->da2, (size_t)B * NB_SC_BOTTOM2);
    nb_matmul_backward(a->da2, P(m, g, "bottom.%d.weight", 2), P(m, g, "bottom.%d.bias", 2), a->dbot, a->a2,
                       P(m, w, "bottom.%d.weight", 2), B, NB_SC_BOTTOM2, E);
    zero(a->da2p, (size_t)B * NB_SC_BOTTOM2);
    nb_relu_backward(a->da2p, a->a2, a->da2, (size_t)B * NB_SC_BOTTOM2);
    zero(a->da1, (size_t)B * NB_SC_BOTTOM1);
    nb_matmul_backward(a->da1, P(m, g, "bottom.%d.weight", 1), P(m, g, "bottom.%d.bias", 1), a->da2p, a->a1,
                       P(m, w, "bottom.%d.weight", 1), B, NB_SC_BOTTOM1, NB_SC_BOTTOM2);
    zero(a->da1p, (size_t)B * NB_SC_BOTTOM1);
    nb_relu_backward(a->da1p, a->a1, a->da1, (size_t)B * NB_SC_BOTTOM1);
    nb_matmul_backward(NULL, P(m, g, "bottom.%d.weight", 0), P(m, g, "bottom.%d.bias", 0), a->da1p, b->dense,
                       P(m, w, "bottom.%d.weight", 0), B, NB_SC_NDENSE, NB_SC_BOTTOM1);
}

/* Whether head i contributes to the loss. */
static int head_used(const nb_sc_model *m, int i) { return i == m->cfg.blocks - 1 || m->cfg.aux_weight > 0; }

double nb_sc_forward(nb_sc_model *m, const nb_sc_batch *b, float *logits) {
    check_batch(m, b);
    nb_sc_acts *a = m->acts;
    const nb_sc_config *c = &m->cfg;
    int B = b->B, E = c->E, D0 = m->D0;
    float *w = m->params;
    int Lb = 0;
    for (int i = 0; i < B; i++) Lb = b->hist_len[i] > Lb ? b->hist_len[i] : Lb;
    a->Lb = Lb;
    a->nlk = build_lookups(m, b, Lb);

    bottom_fwd(m, b);
    nb_embag_gather(a->embg, m->emb, a->lk_rows, B * NB_SC_NTABLES, m->emb_off[NB_SC_NTABLES], E);
    for (int i = 0; i < B; i++) {
        float *x = a->x0 + (size_t)i * D0;
        memcpy(x, a->bot + (size_t)i * E, (size_t)E * sizeof(float));
        memcpy(x + E, a->embg + (size_t)i * NB_SC_NTABLES * E, (size_t)NB_SC_NTABLES * E * sizeof(float));
        memcpy(a->temb + (size_t)i * E, x + (size_t)(1 + NB_SC_NCAT) * E, (size_t)E * sizeof(float));
    }
    zero(a->pooled, (size_t)B * E);
    if (Lb > 0) {
        for (int l = 0; l < c->hist_layers; l++) encoder_fwd(m, l, B, Lb, b->hist_len);
        nb_matmul_forward(a->q, a->temb, P(m, w, "target.wq", 0), NULL, B, E, E);
        nb_matmul_forward(a->kv, a->h[c->hist_layers], P(m, w, "target.wk", 0), NULL, B * Lb, E, 2 * E);
        nb_targetattn_forward(a->pooled, a->attn, a->q, a->kv, a->kv + E, b->hist_len, B, Lb, E, 2 * E);
    }
    for (int i = 0; i < B; i++)
        memcpy(a->x0 + (size_t)i * D0 + (size_t)28 * E, a->pooled + (size_t)i * E, (size_t)E * sizeof(float));

    double loss = 0;
    int r = c->cross_rank, H = c->block_hidden, last = c->blocks - 1;
    for (int i = 0; i <= last; i++) {
        const float *xprev = i ? a->xs[i - 1] : a->x0;
        nb_cross_forward(a->c[i], a->vx[i], a->x0, xprev, P(m, w, "block.%d.U", i), P(m, w, "block.%d.V", i),
                         P(m, w, "block.%d.b", i), B, D0, r);
        nb_matmul_forward(a->hid[i], a->c[i], P(m, w, "block.%d.w1", i), P(m, w, "block.%d.b1", i), B, D0, H);
        nb_relu_forward(a->hid[i], a->hid[i], (size_t)B * H);
        nb_matmul_forward(a->xs[i], a->hid[i], P(m, w, "block.%d.w2", i), P(m, w, "block.%d.b2", i), B, H, D0);
        nb_residual_forward(a->xs[i], a->xs[i], a->c[i], (size_t)B * D0);
        nb_matmul_forward(a->logit[i], a->xs[i], P(m, w, "block.%d.head.w", i), P(m, w, "block.%d.head.b", i), B, D0, 1);
        if (b->label && head_used(m, i)) {
            float scale = (i == last ? 1.0f : c->aux_weight) / (float)B;
            zero(a->dz[i], (size_t)B);
            loss += nb_bce_logits_forward_backward(a->dz[i], NULL, a->logit[i], b->label, NULL, B, scale);
        }
    }
    if (logits) memcpy(logits, a->logit[last], (size_t)B * sizeof(float));
    return loss;
}

static void blocks_bwd(nb_sc_model *m, int B) {
    nb_sc_acts *a = m->acts;
    const nb_sc_config *c = &m->cfg;
    int D0 = m->D0, r = c->cross_rank, H = c->block_hidden;
    size_t BD = (size_t)B * D0;
    float *w = m->params, *g = m->grads;
    zero(a->dcur, BD);
    zero(a->dx0, BD);
    for (int i = c->blocks - 1; i >= 0; i--) {
        if (head_used(m, i))
            nb_matmul_backward(a->dcur, P(m, g, "block.%d.head.w", i), P(m, g, "block.%d.head.b", i), a->dz[i],
                               a->xs[i], P(m, w, "block.%d.head.w", i), B, D0, 1);
        memcpy(a->dc, a->dcur, BD * sizeof(float));
        zero(a->dhid, (size_t)B * H);
        nb_matmul_backward(a->dhid, P(m, g, "block.%d.w2", i), P(m, g, "block.%d.b2", i), a->dcur, a->hid[i],
                           P(m, w, "block.%d.w2", i), B, H, D0);
        zero(a->dhidp, (size_t)B * H);
        nb_relu_backward(a->dhidp, a->hid[i], a->dhid, (size_t)B * H);
        nb_matmul_backward(a->dc, P(m, g, "block.%d.w1", i), P(m, g, "block.%d.b1", i), a->dhidp, a->c[i],
                           P(m, w, "block.%d.w1", i), B, D0, H);
        const float *xprev = i ? a->xs[i - 1] : a->x0;
        zero(a->dprev, BD);
        nb_cross_backward(a->dx0, a->dprev, P(m, g, "block.%d.U", i), P(m, g, "block.%d.V", i), P(m, g, "block.%d.b", i),
                          a->dc, a->x0, xprev, P(m, w, "block.%d.U", i), P(m, w, "block.%d.V", i),
                          P(m, w, "block.%d.b", i), a->vx[i], B, D0, r);
        float *t = a->dcur;
        a->dcur = a->dprev;
        a->dprev = t;
    }
    nb_add_inplace(a->dx0, a->dcur, BD); /* block 0's x_prev is x0 itself */
}

void nb_sc_backward(nb_sc_model *m, const nb_sc_batch *b) {
    NB_CHECK(b->label != NULL, "pass labels to the forward before a backward", "seqctr backward without labels");
    nb_sc_acts *a = m->acts;
    const nb_sc_config *c = &m->cfg;
    int B = b->B, E = c->E, D0 = m->D0, Lb = a->Lb;
    float *w = m->params, *g = m->grads;
    blocks_bwd(m, B);

    size_t ncat = (size_t)NB_SC_NTABLES * E;
    for (int i = 0; i < B; i++) {
        const float *dx = a->dx0 + (size_t)i * D0;
        memcpy(a->dbot + (size_t)i * E, dx, (size_t)E * sizeof(float));
        memcpy(a->dlk + (size_t)i * ncat, dx + E, ncat * sizeof(float));
        memcpy(a->dpooled + (size_t)i * E, dx + (size_t)28 * E, (size_t)E * sizeof(float));
    }
    bottom_bwd(m, b);

    int n0 = B * NB_SC_NTABLES;
    if (Lb > 0) {
        size_t NE = (size_t)B * Lb * E;
        zero(a->dq, (size_t)B * E);
        zero(a->dkv, NE * 2);
        nb_targetattn_backward(a->dq, a->dkv, a->dkv + E, a->dpooled, a->q, a->kv, a->kv + E, a->attn, b->hist_len, B,
                               Lb, E, 2 * E);
        zero(a->dtemb, (size_t)B * E);
        nb_matmul_backward(a->dtemb, P(m, g, "target.wq", 0), NULL, a->dq, a->temb, P(m, w, "target.wq", 0), B, E, E);
        zero(a->dh, NE);
        nb_matmul_backward(a->dh, P(m, g, "target.wk", 0), NULL, a->dkv, a->h[c->hist_layers], P(m, w, "target.wk", 0),
                           B * Lb, E, 2 * E);
        for (int l = c->hist_layers - 1; l >= 0; l--) encoder_bwd(m, l, B, Lb, b->hist_len, a->dh);
        for (int i = 0; i < B; i++)
            nb_add_inplace(a->dlk + ((size_t)i * NB_SC_NTABLES + NB_SC_NCAT) * E, a->dtemb + (size_t)i * E, (size_t)E);
        int n = n0;
        for (int i = 0; i < B; i++)
            for (int j = 0; j < b->hist_len[i]; j++, n++)
                memcpy(a->dlk + (size_t)n * E, a->dh + ((size_t)i * Lb + j) * E, (size_t)E * sizeof(float));
        NB_ASSERT(n == a->nlk);
    }
    /* one dedup over all lookups: the item table's rows get target and history gradients summed */
    m->nuniq = nb_embag_unique(m->uniq_rows, a->inverse, a->lk_rows, a->nlk);
    zero(m->uniq_grads, (size_t)m->nuniq * E);
    nb_embag_backward_unique(m->uniq_grads, a->dlk, a->inverse, a->nlk, E);
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
}
