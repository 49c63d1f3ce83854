/* seqctr whole model: finite-difference gradients of every dense tensor and every touched
 * embedding row on a tiny config, and a short training run that must lower the held-out loss. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "core.h"
#include "data/synth.h"
#include "model/seqctr.h"
#include "optim/optim.h"
#include "optim/optim_sparse.h"
#include "step/evalmetrics.h"

enum { TB = 4, TL = 5 };

static void tiny_config(nb_sc_config *c) {
    nb_sc_config_default(c);
    c->E = 8;
    c->hist_layers = 2;
    c->heads = 4;
    c->blocks = 2;
    c->cross_rank = 3;
    c->block_hidden = 7;
    c->max_len = TL;
    for (int f = 0; f < NB_SC_STD_NCAT; f++) c->cat_rows[f] = 2 + f % 4;
    c->item_rows = 6; /* few rows: the target and history share rows */
    c->aux_weight = 0.5f;
    c->seed = 7;
}

typedef struct {
    float dense[TB * 13], label[TB];
    uint32_t cat[TB * 26], target[TB], hist[TB * TL];
    int32_t len[TB];
    nb_sc_batch b;
} tiny_batch;

static void tiny_fill(tiny_batch *t) {
    static const int32_t lens[TB] = {0, 5, 2, 3}; /* an empty history and a full one */
    uint64_t s = 12345;
    for (int i = 0; i < TB * 13; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        t->dense[i] = (float)((s >> 40) % 1000) / 250.0f;
    }
    for (int i = 0; i < TB * 26; i++) t->cat[i] = (uint32_t)(i * 2654435761u >> 7);
    for (int i = 0; i < TB; i++) {
        t->target[i] = (uint32_t)(i * 5 + 1);
        t->len[i] = lens[i];
        t->label[i] = (float)(i % 2);
        for (int j = 0; j < TL; j++) t->hist[i * TL + j] = j < lens[i] ? (uint32_t)(i + 3 * j) : 0;
    }
    t->b = (nb_sc_batch){.B = TB, .hist_stride = TL, .dense = t->dense, .cat = t->cat, .target = t->target,
                         .hist = t->hist, .hist_len = t->len, .label = t->label};
}

static int kinks; /* checks accepted only as a ReLU kink */

static int close_enough(double an, double num) {
    return fabs(an - num) <= 2e-2 * fmax(fabs(an), fabs(num)) + 2e-4;
}

/* Does the analytic derivative match the loss around *p? The central difference must agree,
 * unless a ReLU kink lies within the step: then the one-sided differences differ and the
 * analytic value (one side's derivative) must lie between them. */
static int grad_ok(nb_sc_model *m, const nb_sc_batch *b, float *p, double an, double *num) {
    const float h = 1e-3f;
    float save = *p;
    double l0 = nb_sc_forward(m, b, NULL);
    *p = save + h;
    double lp = nb_sc_forward(m, b, NULL);
    double hp = (double)(save + h) - save;
    *p = save - h;
    double lm = nb_sc_forward(m, b, NULL);
    double hm = (double)save - (save - h);
    *p = save;
    *num = (lp - lm) / (hp + hm);
    if (close_enough(an, *num)) return 1;
    double right = (lp - l0) / hp, left = (l0 - lm) / hm;
    double lo = fmin(left, right), hi = fmax(left, right), tol = 2e-2 * fmax(fabs(lo), fabs(hi)) + 2e-4;
    if (hi - lo > tol && an >= lo - tol && an <= hi + tol) {
        kinks++;
        return 1;
    }
    return 0;
}

/* Central difference of the loss in one float. */
static double fd(nb_sc_model *m, const nb_sc_batch *b, float *p) {
    double num;
    grad_ok(m, b, p, 0.0, &num);
    return num;
}

/* Every dense tensor's gradient g against finite differences at up to six spread entries; counts
 * the checks, the disagreements and the tensors with any nonzero gradient. */
typedef struct {
    int checked, bad, nonzero_tensors;
} dense_sweep;

static dense_sweep check_dense_grads(nb_sc_model *m, const nb_sc_batch *b, const float *g) {
    dense_sweep r = {0, 0, 0};
    for (int k = 0; k < m->ntensors; k++) {
        const nb_sc_tensor *tt = &m->t[k];
        double gnorm = 0;
        for (size_t i = 0; i < tt->n; i++) gnorm += fabs(g[tt->off + i]);
        r.nonzero_tensors += gnorm > 0;
        int samples = tt->n < 6 ? (int)tt->n : 6;
        for (int s = 0; s < samples; s++) {
            size_t i = (size_t)s * 7919u % tt->n;
            double num, an = g[tt->off + i];
            r.checked++;
            if (!grad_ok(m, b, &m->params[tt->off + i], an, &num)) {
                r.bad++;
                fprintf(stderr, "    %s[%zu]: analytic %.6g numeric %.6g\n", tt->name, i, an, num);
            }
        }
    }
    return r;
}

/* The default embedding init (std 0.05) puts history rows where LayerNorm over E = 8 divides
 * by a tiny std, so the loss is too curved for a float finite difference there: spread them. */
static void spread_embeddings(nb_sc_model *m) {
    size_t n = (size_t)m->emb_off[NB_SC_STD_NCAT + 1] * (size_t)m->cfg.E;
    for (size_t i = 0; i < n; i++) m->emb.table[i] *= 10.0f;
}

static void grad_dense_with(int hist_layers, float aux) {
    nb_sc_config c;
    tiny_config(&c);
    c.hist_layers = hist_layers;
    c.aux_weight = aux;
    nb_sc_model m;
    nb_sc_init(&m, &c, TB);
    spread_embeddings(&m);
    tiny_batch t;
    tiny_fill(&t);
    memset(m.grads, 0, m.nparams * sizeof(float));
    double loss = nb_sc_forward(&m, &t.b, NULL);
    CHECK(isfinite(loss) && loss > 0, "loss %g", loss);
    nb_sc_backward(&m, &t.b);
    float *g = nb_malloc(m.nparams * sizeof(float), "test");
    memcpy(g, m.grads, m.nparams * sizeof(float));
    dense_sweep d = check_dense_grads(&m, &t.b, g);
    CHECK(d.bad == 0, "%d of %d sampled dense gradients disagree", d.bad, d.checked);
    CHECK(kinks * 50 <= d.checked, "%d of %d checks only matched as ReLU kinks", kinks, d.checked);
    /* without aux heads, the earlier heads get no gradient: every other tensor must */
    int expect = m.ntensors - (aux > 0 ? 0 : 2 * (c.blocks - 1));
    CHECK(d.nonzero_tensors == expect, "%d of %d tensors got a gradient (want %d)", d.nonzero_tensors, m.ntensors,
          expect);
    free(g);
    nb_sc_free(&m);
}

/* two history layers with aux heads; no history encoder and no aux heads */
TEST_CASE(grad_dense) { grad_dense_with(2, 0.5f); }
TEST_CASE(grad_dense_plain) { grad_dense_with(0, 0.0f); }

TEST_CASE(grad_embeddings) {
    nb_sc_config c;
    tiny_config(&c);
    nb_sc_model m;
    nb_sc_init(&m, &c, TB);
    spread_embeddings(&m);
    tiny_batch t;
    tiny_fill(&t);
    memset(m.grads, 0, m.nparams * sizeof(float));
    nb_sc_forward(&m, &t.b, NULL);
    nb_sc_backward(&m, &t.b);
    int U = m.nuniq, E = c.E;
    CHECK(U > 0, "no touched rows");
    for (int u = 1; u < U; u++) CHECK(m.uniq_rows[u] > m.uniq_rows[u - 1], "rows not strictly increasing");
    int64_t *rows = nb_malloc((size_t)U * sizeof(int64_t), "test");
    float *gr = nb_malloc((size_t)U * E * sizeof(float), "test");
    memcpy(rows, m.uniq_rows, (size_t)U * sizeof(int64_t));
    memcpy(gr, m.uniq_grads, (size_t)U * E * sizeof(float));
    int bad = 0, checked = 0, items = 0;
    for (int u = 0; u < U; u++) {
        items += rows[u] >= m.emb_off[NB_SC_STD_NCAT];
        for (int e = 0; e < E; e += 3) {
            double num;
            checked++;
            if (!grad_ok(&m, &t.b, &m.emb.table[rows[u] * E + e], gr[(size_t)u * E + e], &num)) {
                bad++;
                fprintf(stderr, "    row %lld e %d: analytic %.6g numeric %.6g\n", (long long)rows[u], e,
                        gr[(size_t)u * E + e], num);
            }
        }
    }
    CHECK(bad == 0, "%d of %d embedding gradients disagree", bad, checked);
    CHECK(items >= 4, "expected several item rows touched, got %d", items);
    /* an untouched row: no gradient, and the loss does not depend on it */
    int64_t free_row = -1;
    for (int64_t r = 0; r < m.emb_off[NB_SC_STD_NCAT + 1] && free_row < 0; r++) {
        int seen = 0;
        for (int u = 0; u < U; u++) seen |= rows[u] == r;
        if (!seen) free_row = r;
    }
    CHECK(free_row >= 0, "every row touched");
    if (free_row >= 0) CHECK(fd(&m, &t.b, &m.emb.table[free_row * E]) == 0.0, "untouched row changes the loss");
    free(rows);
    free(gr);
    nb_sc_free(&m);
}

/* The DLRM form (dlrm-dcnv2's): crosses on [bottom | tables], a top MLP, every column multi-hot
 * and summed. Every dense tensor and every touched row against finite differences, and the item
 * row (looked up, never read) with a zero gradient. */
TEST_CASE(grad_dlrm) {
    nb_sc_config c;
    tiny_config(&c);
    c.hist_layers = 0, c.max_len = 0, c.aux_weight = 0, c.blocks = 3, c.item_rows = 1;
    c.ntop = 2, c.top[0] = 7, c.top[1] = 5;
    int width = 0;
    for (int f = 0; f < NB_SC_STD_NCAT; f++) c.pool[f] = NB_SC_POOL_SUM, c.mv_max[f] = 1 + f % 3, width += c.mv_max[f];
    nb_sc_model m;
    nb_sc_init(&m, &c, TB);
    spread_embeddings(&m);
    tiny_batch t;
    tiny_fill(&t);
    uint32_t *mv = nb_malloc((size_t)TB * width * sizeof(uint32_t), "test");
    int32_t *mvlen = nb_malloc((size_t)TB * NB_SC_STD_NCAT * sizeof(int32_t), "test");
    for (int i = 0; i < TB * width; i++) mv[i] = (uint32_t)(i * 2654435761u >> 9);
    for (int i = 0; i < TB; i++)
        for (int f = 0; f < NB_SC_STD_NCAT; f++) mvlen[i * NB_SC_STD_NCAT + f] = c.mv_max[f];
    for (int i = 0; i < TB; i++) t.len[i] = 0;
    t.b.hist_stride = 0, t.b.mv = mv, t.b.mv_len = mvlen, t.b.mv_stride = width;
    memset(m.grads, 0, m.nparams * sizeof(float));
    double loss = nb_sc_forward(&m, &t.b, NULL);
    CHECK(isfinite(loss) && loss > 0, "loss %g", loss);
    nb_sc_backward(&m, &t.b);
    float *g = nb_malloc(m.nparams * sizeof(float), "test");
    memcpy(g, m.grads, m.nparams * sizeof(float));
    dense_sweep d = check_dense_grads(&m, &t.b, g);
    int checked = d.checked, bad = d.bad;
    CHECK(m.ntensors == 6 + 3 * c.blocks + 2 * 3, "%d tensors", m.ntensors);
    CHECK(d.nonzero_tensors == m.ntensors, "%d of %d tensors got a gradient", d.nonzero_tensors, m.ntensors);
    int U = m.nuniq, E = c.E;
    int64_t *rows = nb_malloc((size_t)U * sizeof(int64_t), "test");
    float *gr = nb_malloc((size_t)U * E * sizeof(float), "test");
    memcpy(rows, m.uniq_rows, (size_t)U * sizeof(int64_t));
    memcpy(gr, m.uniq_grads, (size_t)U * E * sizeof(float));
    for (int u = 0; u < U; u++) {
        if (rows[u] >= m.emb_off[NB_SC_STD_NCAT]) { /* the item row: looked up, never read */
            for (int e = 0; e < E; e++) CHECK(gr[(size_t)u * E + e] == 0.0f, "the item row has a gradient");
            continue;
        }
        for (int e = 0; e < E; e += 3) {
            double num;
            checked++;
            if (!grad_ok(&m, &t.b, &m.emb.table[rows[u] * E + e], gr[(size_t)u * E + e], &num)) {
                bad++;
                fprintf(stderr, "    row %lld e %d: analytic %.6g numeric %.6g\n", (long long)rows[u], e, gr[(size_t)u * E + e], num);
            }
        }
    }
    CHECK(bad == 0, "%d of %d sampled gradients disagree", bad, checked);
    /* one dense Adagrad step: acc = g^2, p -= lr g / (sqrt(acc) + eps), as torch.optim.Adagrad */
    float p0 = m.params[m.t[0].off], g0 = m.grads[m.t[0].off];
    /* and the tables' element-wise Adagrad (FBGEMM's EXACT_ADAGRAD): the same formula per element */
    nb_sc_optim o = {.lr = 0.01f, .eps = 1e-10f, .emb_lr = 0.01f, .emb_eps = 1e-8f, .emb_exact = 1, .dense_adagrad = 1};
    nb_sc_forward(&m, &t.b, NULL);
    memset(m.grads, 0, m.nparams * sizeof(float));
    nb_sc_backward(&m, &t.b);
    g0 = m.grads[m.t[0].off];
    int64_t r0 = m.uniq_rows[0];
    float w0 = m.emb.table[r0 * E + 1], ge = m.uniq_grads[1];
    nb_sc_optim_enqueue(&m, &o, 1);
    CHECK(m.am[m.t[0].off] == g0 * g0 && m.params[m.t[0].off] == p0 + -0.01f * g0 / (sqrtf(g0 * g0) + 1e-10f),
          "Adagrad step: p %.9g -> %.9g with g %.9g", p0, m.params[m.t[0].off], g0);
    CHECK(ge != 0 && m.emb.avg_sq[r0 * E + 1] == ge * ge && m.emb.table[r0 * E + 1] == w0 - 0.01f * ge / (sqrtf(ge * ge) + 1e-8f),
          "element-wise Adagrad: w %.9g -> %.9g with g %.9g", w0, m.emb.table[r0 * E + 1], ge);
    free(g), free(rows), free(gr), free(mv), free(mvlen);
    nb_sc_free(&m);
}

TEST_CASE(deterministic) {
    nb_sc_config c;
    tiny_config(&c);
    nb_sc_model m1, m2;
    nb_sc_init(&m1, &c, TB);
    nb_sc_init(&m2, &c, TB);
    tiny_batch t;
    tiny_fill(&t);
    memset(m1.grads, 0, m1.nparams * sizeof(float));
    memset(m2.grads, 0, m2.nparams * sizeof(float));
    double l1 = nb_sc_forward(&m1, &t.b, NULL), l2 = nb_sc_forward(&m2, &t.b, NULL);
    nb_sc_backward(&m1, &t.b);
    nb_sc_backward(&m2, &t.b);
    CHECK(l1 == l2, "losses differ");
    CHECK(!memcmp(m1.grads, m2.grads, m1.nparams * sizeof(float)), "gradients differ");
    CHECK(m1.nuniq == m2.nuniq && !memcmp(m1.uniq_grads, m2.uniq_grads, (size_t)m1.nuniq * c.E * sizeof(float)),
          "embedding gradients differ");
    nb_sc_free(&m1);
    nb_sc_free(&m2);
}

/* ~50 steps of AdamW + row-wise Adagrad on synthetic data lower the held-out loss. */
TEST_CASE(training_lowers_loss) {
    static nb_synth g;
    nb_synth_open(&g, "synth:cap=40,items=64,max_len=8,calib=4096,seed=3");
    nb_sc_config c;
    nb_sc_config_default(&c);
    c.E = 8;
    c.blocks = 2;
    c.cross_rank = 8;
    c.block_hidden = 32;
    c.max_len = 8;
    for (int f = 0; f < NB_SC_STD_NCAT; f++) c.cat_rows[f] = g.card[f];
    c.item_rows = 64;
    enum { B = 128, EV = 1024 };
    nb_sc_model m;
    nb_sc_init(&m, &c, EV);
    float *dense = nb_malloc(EV * 13 * sizeof(float), "t"), *label = nb_malloc(EV * sizeof(float), "t");
    uint32_t *cat = nb_malloc(EV * 26 * sizeof(uint32_t), "t"), *tg = nb_malloc(EV * sizeof(uint32_t), "t");
    uint32_t *hist = nb_malloc(EV * 8 * sizeof(uint32_t), "t");
    int32_t *len = nb_malloc(EV * sizeof(int32_t), "t");
    nb_sc_batch b = {.hist_stride = 8, .dense = dense, .cat = cat, .target = tg, .hist = hist, .hist_len = len,
                     .label = label};
    float *mo = nb_calloc(m.nparams, sizeof(float), "t"), *vo = nb_calloc(m.nparams, sizeof(float), "t");
    float *acc = nb_calloc((size_t)m.emb_off[NB_SC_STD_NCAT + 1], sizeof(float), "t");
    b.B = EV;
    nb_synth_fill(&g, 1000000, EV, dense, cat, tg, hist, len, label, NULL);
    double before = nb_sc_forward(&m, &b, NULL);
    for (int step = 0; step < 60; step++) {
        b.B = B;
        nb_synth_fill(&g, (uint64_t)step * B, B, dense, cat, tg, hist, len, label, NULL);
        memset(m.grads, 0, m.nparams * sizeof(float));
        nb_sc_forward(&m, &b, NULL);
        nb_sc_backward(&m, &b);
        for (int k = 0; k < m.ntensors; k++) {
            const nb_sc_tensor *t = &m.t[k];
            nb_adamw_cfg ac = {3e-3f, 0.9f, 0.999f, 1e-8f, t->decay ? 1e-4f : 0.0f};
            nb_adamw_update(m.params + t->off, m.grads + t->off, mo + t->off, vo + t->off, t->n, ac, step + 1);
        }
        nb_rowwise_adagrad_update(m.emb.table, acc, m.uniq_rows, m.uniq_grads, m.nuniq, c.E, m.emb_off[NB_SC_STD_NCAT + 1],
                                  (nb_rowwise_adagrad_cfg){0.05f, 1e-8f});
    }
    b.B = EV;
    nb_synth_fill(&g, 1000000, EV, dense, cat, tg, hist, len, label, NULL);
    double after = nb_sc_forward(&m, &b, NULL);
    printf("    held-out loss %.4f -> %.4f\n", before, after);
    CHECK(isfinite(after) && after < before - 0.02, "loss %.4f -> %.4f", before, after);
    free(dense), free(label), free(cat), free(tg), free(hist), free(len), free(mo), free(vo), free(acc);
    nb_sc_free(&m);
}

/* AUC by hand: ties take the average rank; NE of the base-rate predictor is 1. */
TEST_CASE(auc_ne) {
    const float s1[4] = {0.1f, 0.4f, 0.35f, 0.8f}, y1[4] = {0, 0, 1, 1};
    CHECK(fabs(nb_auc(s1, y1, 4) - 0.75) < 1e-12, "auc %g", nb_auc(s1, y1, 4));
    const float s2[4] = {0.5f, 0.5f, 0.5f, 0.5f};
    CHECK(fabs(nb_auc(s2, y1, 4) - 0.5) < 1e-12, "all ties: auc %g", nb_auc(s2, y1, 4));
    const float s3[5] = {0.2f, 0.2f, 0.9f, 0.1f, 0.2f}, y3[5] = {1, 0, 1, 0, 0};
    /* positives at ranks 3 (tie of 2..4) and 5; negatives 1, 3, 3: (3 + 5 - 3) / 6 */
    CHECK(fabs(nb_auc(s3, y3, 5) - 5.0 / 6.0) < 1e-12, "ties: auc %g", nb_auc(s3, y3, 5));
    const float y4[3] = {1, 1, 1};
    CHECK(isnan(nb_auc(s1, y4, 3)), "one class: auc must be NAN");
    double p = 0.25, h = -(p * log(p) + (1 - p) * log(1 - p));
    CHECK(fabs(nb_ne(h, p) - 1.0) < 1e-12, "ne %g", nb_ne(h, p));
    CHECK(isnan(nb_ne(0.1, 0.0)), "ne of an all-negative set must be NAN");
}

/* Save and load give back the same model: same loss on a batch. */
TEST_CASE(checkpoint_roundtrip) {
    nb_sc_config c;
    tiny_config(&c);
    nb_sc_model a, b;
    nb_sc_init(&a, &c, TB);
    c.seed = 99; /* different init, overwritten by the load */
    nb_sc_init(&b, &c, TB);
    tiny_batch t;
    tiny_fill(&t);
    char path[] = "/tmp/nb_test_seqctr_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    close(fd);
    nb_sc_save(&a, path);
    double la = nb_sc_forward(&a, &t.b, NULL), lb0 = nb_sc_forward(&b, &t.b, NULL);
    nb_sc_load(&b, path);
    double lb = nb_sc_forward(&b, &t.b, NULL);
    CHECK(la != lb0, "different seeds gave the same model");
    CHECK(la == lb, "loaded model loss %.9g, saved %.9g", lb, la);
    CHECK(!memcmp(a.emb.table, b.emb.table, (size_t)a.emb_off[NB_SC_STD_NCAT + 1] * c.E * sizeof(float)), "tables differ");
    unlink(path);
    nb_sc_free(&a);
    nb_sc_free(&b);
}

int main(void) {
    RUN(grad_dense);
    RUN(grad_dense_plain);
    RUN(grad_embeddings);
    RUN(grad_dlrm);
    RUN(deterministic);
    RUN(training_lowers_loss);
    RUN(auc_ne);
    RUN(checkpoint_roundtrip);
    TEST_EXIT();
}
