/* seqctr against PyTorch: replays tests/torch/ref/seqctr_tiny.safetensors (written by
 * tests/torch/seqctr_ref.py gen from a float64 PyTorch model written from issue 4's spec) through
 * nb_sc_forward/backward and nobubble's own optimizers, and compares:
 *   logits of the last head (rel 1e-5), loss (rel 1e-5), every dense gradient (rel 1e-4 per
 *   tensor, norm-wise), the touched embedding rows (same rows) and their gradients (rel 1e-4),
 *   then 10 steps on the same batch (the model's optimizers: AdamW per tensor, decay on 2-D
 *   tensors only; row-wise Adagrad on the touched rows): each step's loss (rel 1e-4).
 * On the CPU backend always; with a GPU also on CUDA fp32 (the same tolerances) and CUDA bf16
 * (bf16 tolerances: logits and losses 3e-2, gradients 1e-1).
 *   test_seqctr_ref [--ref FILE] [--verbose]
 * Beside the errors it prints torch's own float32 run against the same float64 reference.
 * Without the reference file: exit 77. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "core.h"
#include "io/safetensors.h"
#include "model/seqctr.h"
#include "ops/backend.h"
#include "optim/optim.h"
#include "ref_file.h"

#define REGEN_HINT "regenerate it with /usr/bin/python3 tests/torch/seqctr_ref.py gen (see tests/torch/README.md)"
#include "ref_tensors.h"

#define NSTEPS 10
/* the reference's optimizer settings (seqctr_ref.py ADAMW / ADAGRAD): the CTR trainer's lr,
 * betas, eps and --emb-lr default; weight decay 0.1 so the 2-D-only rule is exercised */
static const float LR = 1e-3f, B1 = 0.9f, B2 = 0.999f, EPS = 1e-8f, WD = 0.1f, EMB_LR = 0.05f, EMB_EPS = 1e-8f;
static double TOL_LOGITS, TOL_LOSS, TOL_GRAD, TOL_LOSSES;

static int verbose;
static nb_sc_model M;
static nb_sc_batch BT;
static float *dense, *label;
static uint32_t *cat, *target, *hist;
static int32_t *hist_len;

static void table_name(char *buf, size_t cap, int t) {
    if (t == NB_SC_STD_NCAT)
        snprintf(buf, cap, "w.emb.item");
    else
        snprintf(buf, cap, "w.emb.cat.%d", t);
}

static void setup(const nb_backend_i *be) {
    nb_sc_config c;
    nb_sc_config_default(&c);
    c.E = meta_int("E");
    c.hist_layers = meta_int("hist_layers");
    c.heads = meta_int("heads");
    c.blocks = meta_int("blocks");
    c.cross_rank = meta_int("cross_rank");
    c.block_hidden = meta_int("block_hidden");
    c.max_len = meta_int("max_len");
    c.item_rows = meta_int("item_rows");
    const char *av = nb_st_meta_get(F, "aux_weight"), *cr = nb_st_meta_get(F, "cat_rows");
    NB_CHECK(av && cr, REGEN_HINT, "%s: metadata aux_weight/cat_rows missing", ref_path);
    c.aux_weight = (float)atof(av);
    for (int f = 0; f < NB_SC_STD_NCAT; f++) {
        NB_CHECK(*cr, REGEN_HINT, "%s: cat_rows has fewer than 26 entries", ref_path);
        char *end;
        c.cat_rows[f] = strtoll(cr, &end, 10);
        cr = *end == ',' ? end + 1 : end;
    }
    int B = meta_int("B");
    nb_sc_init_on(&M, &c, B, be);
    for (int i = 0; i < M.ntensors; i++) {
        char name[64];
        snprintf(name, sizeof name, "w.%s", M.t[i].name);
        read_bf16(name, M.params + M.t[i].off, (int64_t)M.t[i].n);
    }
    for (int t = 0; t < (NB_SC_STD_NCAT + 1); t++) {
        char name[32];
        table_name(name, sizeof name, t);
        int64_t rows = M.emb_off[t + 1] - M.emb_off[t];
        read_bf16(name, M.emb.table + (size_t)M.emb_off[t] * c.E, rows * c.E);
    }
    nb_sc_to_device(&M);
    int L = c.max_len;
    dense = read_raw("batch.dense", NB_F32, (int64_t)B * NB_SC_STD_NDENSE);
    cat = read_raw("batch.cat", NB_I32, (int64_t)B * NB_SC_STD_NCAT);
    target = read_raw("batch.target", NB_I32, B);
    hist = read_raw("batch.hist", NB_I32, (int64_t)B * L);
    hist_len = read_raw("batch.hist_len", NB_I32, B);
    label = read_raw("batch.label", NB_F32, B);
    BT = (nb_sc_batch){B, L, dense, cat, target, hist, hist_len, label, NULL, NULL, 0};
}

static double rel1(double a, double b) { return fabs(a - b) / (fabs(b) > 1e-30 ? fabs(b) : 1e-30); }

/* one table row; failures are always printed, passes with --verbose */
static int row(const char *what, double err, double tol) {
    int bad = !(err <= tol);
    if (bad || verbose) printf("  %-22s rel err %.3e  tol %.0e  %s\n", what, err, tol, bad ? "FAIL" : "ok");
    return bad;
}

TEST_CASE(forward_backward_matches_torch) {
    int B = BT.B, E = M.cfg.E;
    float *logits = nb_malloc((size_t)B * sizeof(float), "logits");
    nb_sc_zero_grads(&M);
    double loss = nb_sc_forward(&M, &BT, logits);
    nb_sc_backward(&M, &BT);
    const float *ref_logits = need("logits", NB_F32, (int64_t)M.cfg.blocks * B)->data;
    /* the file holds every head's logits [blocks, B]; the API returns the last head's */
    const float *ref_last = ref_logits + (size_t)(M.cfg.blocks - 1) * B;
    const float *ref_loss = need("loss", NB_F32, 1)->data;
    int bad = 0;
    bad += row("logits (last head)", rel_err(logits, ref_last, (size_t)B), TOL_LOGITS);
    bad += row("loss", rel1(loss, ref_loss[0]), TOL_LOSS);
    double worst = 0;
    const char *worst_name = "";
    for (int i = 0; i < M.ntensors; i++) {
        char name[64];
        snprintf(name, sizeof name, "g.%s", M.t[i].name);
        const float *g = need(name, NB_F32, (int64_t)M.t[i].n)->data;
        double e = rel_err(M.grads + M.t[i].off, g, M.t[i].n);
        bad += row(name, e, TOL_GRAD);
        if (e > worst) worst = e, worst_name = M.t[i].name;
    }
    const nb_st_tensor *rt = nb_st_find(F, "g.emb.rows");
    NB_CHECK(rt && rt->dtype == NB_I32, REGEN_HINT, "%s: g.emb.rows missing", ref_path);
    int U = (int)rt->numel;
    const int32_t *rows = rt->data;
    int same_rows = M.nuniq == U;
    for (int u = 0; same_rows && u < U; u++) same_rows = M.uniq_rows[u] == rows[u];
    if (!same_rows) printf("  touched rows: nobubble %d, torch %d, or different rows  FAIL\n", M.nuniq, U);
    bad += !same_rows;
    if (same_rows) {
        const float *ge = need("g.emb", NB_F32, (int64_t)U * E)->data;
        double ee = rel_err(M.uniq_grads, ge, (size_t)U * E);
        bad += row("g.emb (touched rows)", ee, TOL_GRAD);
        double wr = 0;
        for (int u = 0; u < U; u++) {
            double e = rel_err(M.uniq_grads + (size_t)u * E, ge + (size_t)u * E, (size_t)E);
            wr = e > wr ? e : wr;
        }
        printf("  %d touched rows, worst single row rel err %.3e\n", U, wr);
    }
    printf("  loss %.9f (torch %.9f); worst dense gradient %s %.3e\n", loss, (double)ref_loss[0], worst_name, worst);
    const char *n32 = nb_st_meta_get(F, "torch32_err");
    if (n32) printf("  torch's float32 run vs float64 (noise floor): %s\n", n32);
    CHECK(bad == 0, "%d comparison(s) out of tolerance (table above)", bad);
    free(logits);
}

TEST_CASE(ten_steps_match_torch) {
    const float *ref = need("losses10", NB_F32, NSTEPS)->data;
    nb_sc_optim o = {.lr = LR, .beta1 = B1, .beta2 = B2, .eps = EPS, .weight_decay = WD, .emb_lr = EMB_LR,
                     .emb_eps = EMB_EPS};
    int bad = 0;
    for (int step = 0; step < NSTEPS; step++) {
        nb_sc_zero_grads(&M);
        double loss = nb_sc_forward(&M, &BT, NULL);
        nb_sc_backward_enqueue(&M);
        nb_sc_optim_enqueue(&M, &o, step + 1);
        double e = rel1(loss, ref[step]);
        int b = !(e <= TOL_LOSSES);
        bad += b;
        if (b || verbose) printf("  step %d loss %.9f torch %.9f rel err %.3e %s\n", step, loss, (double)ref[step], e, b ? "FAIL" : "ok");
    }
    CHECK(bad == 0, "%d of %d step losses out of tolerance %.0e", bad, NSTEPS, TOL_LOSSES);
}

/* Both cases on one backend, from a fresh model. */
static void run_on(const nb_backend_i *be, double tol_scale_logits, double tol_grad) {
    printf("backend %s\n", be->name);
    TOL_LOGITS = TOL_LOSS = tol_scale_logits;
    TOL_GRAD = tol_grad;
    TOL_LOSSES = tol_scale_logits > 1e-5 ? tol_scale_logits : 1e-4;
    setup(be);
    RUN(forward_backward_matches_torch);
    RUN(ten_steps_match_torch);
    nb_sc_free(&M);
    free(dense), free(cat), free(target), free(hist), free(hist_len), free(label);
}

int main(int argc, char **argv) {
    static char path[PATH_MAX];
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--ref") && i + 1 < argc)
            ref_path = argv[++i];
        else if (!strcmp(argv[i], "--verbose"))
            verbose = 1;
        else
            nb_fail("usage: test_seqctr_ref [--ref FILE] [--verbose]", "unknown argument '%s'", argv[i]);
    }
    if (!ref_path) {
        ref_file("seqctr_tiny.safetensors", path, sizeof path);
        ref_path = path;
    }
    if (access(ref_path, R_OK) != 0) {
        printf("skipped: reference file %s not found; %s\n", ref_path, REGEN_HINT);
        return 77;
    }
    F = nb_st_open(ref_path);
    ref_run_backends(run_on);
    nb_st_close(F);
    TEST_EXIT();
}
