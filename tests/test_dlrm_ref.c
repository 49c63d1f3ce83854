/* dlrm-dcnv2 (seqctr's DLRM form) against its PyTorch twin in MLPerf's reference layout: replays
 * tests/torch/ref/dlrm_tiny.safetensors (written by tests/torch/dlrm_twin_check.py gen, float64;
 * see that script for the twin) through nb_sc_forward/backward and nobubble's optimizers (dense
 * Adagrad, element-wise Adagrad on the touched rows: the preset's), and compares:
 *   logits (rel 1e-5), loss (rel 1e-5), every dense gradient (rel 1e-4 per tensor, norm-wise), the
 *   touched embedding rows (same rows) and their gradients (rel 1e-4), then 20 steps on the same
 *   batch: each step's loss (rel 1e-4).
 * On the CPU backend always; with a GPU also on CUDA fp32 (the same tolerances) and CUDA bf16
 * (logits and the first 3 steps' losses 3e-2, gradients 1e-1, then a falling loss).
 *   test_dlrm_ref [--ref FILE] [--verbose] [--diagnose]   (--diagnose: the device diagnosis on every
 *   backend, failing or not; on the CPU it compares the CPU run with itself)
 * Without the reference file (made where torch is: the GPU machine): exit 77. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bf16_host.h"
#include "check.h"
#include "core.h"
#include "io/safetensors.h"
#include "model/seqctr.h"
#include "model/seqctr_internal.h"
#include "ops/backend.h"
#include "optim/optim.h"
#include "ref_file.h"

#define REGEN_HINT "generate it with python3 tests/torch/dlrm_twin_check.py gen --out tests/torch/ref/dlrm_tiny.safetensors"
#include "ref_tensors.h"

#define NSTEPS 20
static double TOL_LOGITS, TOL_LOSS, TOL_GRAD, TOL_LOSSES;

static int verbose, diagnose; /* --diagnose: the diagnosis on every backend, failing or not */
static nb_sc_model M;
static nb_sc_batch BT;
static float *dense, *label;
static uint32_t *cat, *target, *hist, *mv;
static int32_t *hist_len, *mv_len;
static float LR, EPS, EMB_EPS;

/* "a,b,c" into v[0..n-1] (nb_fail unless exactly n numbers) */
static void meta_list(const char *key, int64_t *v, int n) {
    const char *s = nb_st_meta_get(F, key);
    NB_CHECK(s != NULL, REGEN_HINT, "%s: metadata '%s' missing", ref_path, key);
    for (int k = 0; k < n; k++) {
        char *end;
        v[k] = strtoll(s, &end, 10);
        NB_CHECK(end != s, REGEN_HINT, "%s: metadata '%s' has fewer than %d entries", ref_path, key, n);
        s = *end == ',' ? end + 1 : end;
    }
}

static void setup(const nb_backend_i *be) {
    nb_sc_config c;
    nb_sc_config_default(&c);
    c.E = meta_int("E");
    c.hist_layers = 0, c.heads = 1, c.max_len = 0, c.block_hidden = 1;
    c.blocks = meta_int("blocks");
    c.cross_rank = meta_int("cross_rank");
    const char *top = nb_st_meta_get(F, "top"), *lr = nb_st_meta_get(F, "lr"), *eps = nb_st_meta_get(F, "eps"),
               *emb_eps = nb_st_meta_get(F, "emb_eps");
    NB_CHECK(top && lr && eps && emb_eps && nb_sc_top_parse(&c, top) && c.ntop >= 1, REGEN_HINT, "%s: metadata top/lr/eps/emb_eps",
             ref_path);
    LR = (float)atof(lr), EPS = (float)atof(eps), EMB_EPS = (float)atof(emb_eps);
    int64_t v[NB_SC_STD_NCAT];
    meta_list("cat_rows", v, NB_SC_STD_NCAT);
    for (int f = 0; f < NB_SC_STD_NCAT; f++) c.cat_rows[f] = v[f];
    meta_list("hot", v, NB_SC_STD_NCAT);
    int width = 0;
    for (int f = 0; f < NB_SC_STD_NCAT; f++) c.pool[f] = NB_SC_POOL_SUM, c.mv_max[f] = (int)v[f], width += (int)v[f];
    c.item_rows = 1;
    int B = meta_int("B");
    nb_sc_init_on(&M, &c, B, be);
    for (int i = 0; i < M.ntensors; i++) {
        char name[64];
        snprintf(name, sizeof name, "w.%s", M.t[i].name);
        read_bf16(name, M.params + M.t[i].off, (int64_t)M.t[i].n);
    }
    for (int t = 0; t <= NB_SC_STD_NCAT; t++) {
        char name[32];
        if (t == NB_SC_STD_NCAT)
            snprintf(name, sizeof name, "w.emb.item");
        else
            snprintf(name, sizeof name, "w.emb.cat.%d", t);
        int64_t rows = M.emb_off[t + 1] - M.emb_off[t];
        read_bf16(name, M.emb.table + (size_t)M.emb_off[t] * c.E, rows * c.E);
    }
    nb_sc_to_device(&M);
    dense = read_raw("batch.dense", NB_F32, (int64_t)B * NB_SC_STD_NDENSE);
    mv = read_raw("batch.mv", NB_I32, (int64_t)B * width);
    label = read_raw("batch.label", NB_F32, B);
    cat = nb_calloc((size_t)B * NB_SC_STD_NCAT, sizeof *cat, "batch"); /* multi-valued columns: not read */
    target = nb_calloc((size_t)B, sizeof *target, "batch");
    hist = nb_calloc(1, sizeof *hist, "batch");
    hist_len = nb_calloc((size_t)B, sizeof *hist_len, "batch");
    mv_len = nb_malloc((size_t)B * NB_SC_STD_NCAT * sizeof *mv_len, "batch");
    for (int i = 0; i < B; i++)
        for (int f = 0; f < NB_SC_STD_NCAT; f++) mv_len[i * NB_SC_STD_NCAT + f] = c.mv_max[f];
    BT = (nb_sc_batch){B, 0, dense, cat, target, hist, hist_len, label, mv, mv_len, width};
}
static double rel1(double a, double b) { return fabs(a - b) / (fabs(b) > 1e-30 ? fabs(b) : 1e-30); }

/* one table row; failures are always printed, passes with --verbose */
static int row(const char *what, double err, double tol) {
    int bad = !(err <= tol);
    if (bad || verbose) printf("  %-22s rel err %.3e  tol %.0e  %s\n", what, err, tol, bad ? "FAIL" : "ok");
    return bad;
}

/* A device's fp32 buffer downloaded. */
static float *f32_down(const void *src, size_t n) {
    nb_ctx c = M.ctx ? M.ctx : &M.own_ctx;
    float *f = nb_malloc(n * sizeof(float), "diagnosis");
    M.be->to_host(c, f, src, n * sizeof(float));
    return f;
}

/* A device's activation (bf16 or fp32) downloaded as floats. */
static float *act_down(const void *src, size_t n) {
    if (M.be->act_dtype != NB_BF16) return f32_down(src, n);
    nb_ctx c = M.ctx ? M.ctx : &M.own_ctx;
    float *f = nb_malloc(n * sizeof(float), "diagnosis");
    uint16_t *h = nb_malloc(n * sizeof(uint16_t), "diagnosis");
    M.be->to_host(c, h, src, n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++) f[i] = bf2f(h[i]);
    free(h);
    return f;
}

/* Where top.0's gradients go wrong on a device (the bf16 twin bug, bench/NOTES.md): its weight
 * gradient recomputed on the host from the device's own dout (dtp) and input (the last cross's
 * output), and dtp from the device's dt and ReLU output. Both near 0: the GEMM and the ReLU did
 * what their inputs say, and the inputs differ from the reference's; large: that op is wrong. */
/* dt (top.0's output gradient, which top.1's input-gradient GEMM wrote) recomputed on the host
 * from the device's own buffers, for a top MLP of two layers: dt1 = dz w2 (the logit's linear,
 * rounded as the device stores it), dtp1 = ReLU'(top.1) dt1, dt = dtp1 W1. */
static void diagnose_dt(const float *dt) {
    nb_sc_acts *a = M.acts;
    nb_ctx c = M.ctx ? M.ctx : &M.own_ctx;
    int B = M.stage->B, K0 = M.cfg.top[0], K1 = M.cfg.top[1];
    float *dz = nb_malloc((size_t)B * sizeof(float), "diagnosis");
    M.be->to_host(c, dz, a->dz[M.cfg.blocks - 1], (size_t)B * sizeof(float));
    float *w2 = act_down(M.w.top_w[2], (size_t)K1), *w1 = act_down(M.w.top_w[1], (size_t)K1 * K0);
    float *top1 = act_down(a->top[1], (size_t)B * K1);
    double num = 0, den = 0;
    for (int b = 0; b < B; b++)
        for (int k0 = 0; k0 < K0; k0++) {
            double s = 0;
            for (int k1 = 0; k1 < K1; k1++) {
                float d1 = dz[b] * w2[k1];
                if (M.be->act_dtype == NB_BF16) d1 = bf2f(f2bf(d1));
                s += (top1[(size_t)b * K1 + k1] > 0 ? d1 : 0.0f) * (double)w1[(size_t)k1 * K0 + k0];
            }
            double d = dt[(size_t)b * K0 + k0] - s;
            num += d * d, den += s * s;
        }
    printf("  diagnosis: dt (top.1's input gradient) vs dz w2 through ReLU'(top.1) then W1, recomputed on the host "
           "from the device's buffers: rel err %.3e (bf16 rounding: ~1e-2)\n", den > 0 ? sqrt(num / den) : -1.0);
    free(dz), free(w2), free(w1), free(top1);
}

/* rel err of out[N, nout] against act(in[N, nin] W^T + b) (W [nout, nin]), on the host in double */
static double layer_err(const float *out, const float *in, const float *W, const float *b, int N, int nin, int nout,
                        int relu) {
    double num = 0, den = 0;
    for (int n = 0; n < N; n++)
        for (int o = 0; o < nout; o++) {
            double s = b ? b[o] : 0.0;
            for (int k = 0; k < nin; k++) s += (double)in[(size_t)n * nin + k] * W[(size_t)o * nin + k];
            if (relu && s < 0) s = 0;
            double d = out[(size_t)n * nout + o] - s;
            num += d * d, den += s * s;
        }
    return den > 0 ? sqrt(num / den) : -1.0;
}

/* The forward's ops one by one, each recomputed on the host from the device's own inputs (so an
 * op that is wrong shows alone, not through the ops after it): the bottom MLP, each cross (vx =
 * x V, u = vx U^T + b, out = xd * u + x) and top.0; first, whether the backward changed the last
 * cross's output (top.0's input) before the forward wrote it again. */
static void diagnose_forward(void) {
    nb_sc_acts *a = M.acts;
    const nb_sc_config *cf = &M.cfg;
    int B = M.stage->B, E = cf->E, D = (cf->ncat + 1) * E, r = cf->cross_rank, L = cf->blocks;
    size_t BD = (size_t)B * D;
    float *after_bwd = act_down(a->xs[L - 1], BD);
    nb_sc_forward(&M, &BT, NULL);
    float *fresh = act_down(a->xs[L - 1], BD);
    printf("  diagnosis: the last cross's output after the backward vs the forward's again: rel err %.3e (0: the "
           "backward left top.0's input alone)\n", rel_err(after_bwd, fresh, BD));
    const int nb[4] = {NB_SC_STD_NDENSE, NB_SC_BOTTOM1, NB_SC_BOTTOM2, E};
    const void *outs[3] = {a->a1, a->a2, a->bot};
    /* the bottom's input: its act-dtype copy (bf16), or the batch's fp32 dense features themselves */
    float *in = act_down(a->dense ? a->dense : M.stage->d_dense, (size_t)B * nb[0]);
    for (int l = 0; l < 3; l++) {
        float *W = act_down(M.w.bottom.weight[l], (size_t)nb[l + 1] * nb[l]), *b = act_down(M.w.bottom.bias[l], (size_t)nb[l + 1]);
        float *out = act_down(outs[l], (size_t)B * nb[l + 1]);
        printf("  diagnosis: bottom.%d (%d -> %d, ReLU) vs the host from its input: rel err %.3e\n", l, nb[l], nb[l + 1],
               layer_err(out, in, W, b, B, nb[l], nb[l + 1], 1));
        free(W), free(b), free(in);
        in = out;
    }
    free(in);
    float *xd = act_down(a->xd, BD);
    for (int i = 0; i < L; i++) {
        float *xp = act_down(i ? a->xs[i - 1] : a->xd, BD), *vx = act_down(a->vx[i], (size_t)B * r);
        float *u = act_down(a->u[i], BD), *xs = act_down(a->xs[i], BD);
        float *U = act_down(M.w.block[i].U, (size_t)D * r), *V = act_down(M.w.block[i].V, (size_t)D * r);
        float *bb = act_down(M.w.block[i].b, (size_t)D), *Vt = nb_malloc((size_t)D * r * sizeof(float), "diagnosis");
        for (int d = 0; d < D; d++)
            for (int k = 0; k < r; k++) Vt[(size_t)k * D + d] = V[(size_t)d * r + k];
        double e_vx = layer_err(vx, xp, Vt, NULL, B, D, r, 0), e_u = layer_err(u, vx, U, bb, B, r, D, 0);
        double n2 = 0, d2 = 0;
        for (size_t j = 0; j < BD; j++) {
            double want = (double)xd[j] * u[j] + xp[j];
            n2 += (xs[j] - want) * (xs[j] - want), d2 += want * want;
        }
        printf("  diagnosis: cross %d (D %d, rank %d) from the device's inputs: vx rel err %.3e, u %.3e, out %.3e\n", i, D,
               r, e_vx, e_u, d2 > 0 ? sqrt(n2 / d2) : -1.0);
        free(xp), free(vx), free(u), free(xs), free(U), free(V), free(bb), free(Vt);
    }
    int K = cf->top[0];
    float *W0 = act_down(M.w.top_w[0], (size_t)K * D), *b0 = act_down(M.w.top_b[0], (size_t)K);
    float *top0 = act_down(a->top[0], (size_t)B * K);
    printf("  diagnosis: top.0 (%d -> %d, ReLU) from the last cross's output: rel err %.3e\n", D, K,
           layer_err(top0, fresh, W0, b0, B, D, K, 1));
    free(W0), free(b0), free(top0), free(xd), free(after_bwd), free(fresh);
}

/* The forward's and backward's buffers of the CPU run (float64-faithful: it matches torch to 1e-6),
 * kept to say where a device run leaves them: each buffer's rel err against the CPU's and, for
 * ReLU outputs, how many units changed side (a pre-activation within rounding of zero flips the
 * unit, and its gradient with it: a conditioning effect, not a wrong op). */
enum { MAX_SNAP = 64 };
typedef struct {
    char name[24];
    const void *p;
    size_t n;
    int is_f32, relu;
} snap_buf;
static float *cpu_snap[MAX_SNAP];
static int cpu_snap_n;

static int snap_list(snap_buf *s) {
    nb_sc_acts *a = M.acts;
    const nb_sc_config *cf = &M.cfg;
    int B = M.stage->B, E = cf->E, D = (cf->ncat + 1) * E, r = cf->cross_rank, L = cf->blocks, n = 0;
    size_t BD = (size_t)B * D;
    struct { const char *name; const void *p; size_t n; int f32, relu; } t[] = {
        {"a1", a->a1, (size_t)B * NB_SC_BOTTOM1, 0, 1}, {"a2", a->a2, (size_t)B * NB_SC_BOTTOM2, 0, 1},
        {"bot", a->bot, (size_t)B * E, 0, 1},           {"xd", a->xd, BD, 0, 0},
        {"top0", a->top[0], (size_t)B * cf->top[0], 0, 1},
        {"top1", cf->ntop >= 2 ? a->top[1] : NULL, (size_t)B * cf->top[cf->ntop >= 2 ? 1 : 0], 0, 1},
        {"logit", a->logit[L - 1], (size_t)B, 1, 0},    {"dz", a->dz[L - 1], (size_t)B, 1, 0},
        {"dt", a->dt, (size_t)B * cf->top[0], 0, 0},   {"dtp", a->dtp, (size_t)B * cf->top[0], 0, 0},
        {"dxd", a->dxd, BD, 0, 0},                     {"dbot", a->dbot, (size_t)B * E, 0, 0},
        {"dbotp", a->dbotp, (size_t)B * E, 0, 0},      {"da2", a->da2, (size_t)B * NB_SC_BOTTOM2, 0, 0},
        {"da2p", a->da2p, (size_t)B * NB_SC_BOTTOM2, 0, 0}, {"da1", a->da1, (size_t)B * NB_SC_BOTTOM1, 0, 0},
        {"da1p", a->da1p, (size_t)B * NB_SC_BOTTOM1, 0, 0},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (t[i].p) s[n] = (snap_buf){.p = t[i].p, .n = t[i].n, .is_f32 = t[i].f32, .relu = t[i].relu}, snprintf(s[n].name, 24, "%s", t[i].name), n++;
    for (int i = 0; i < L && n + 3 <= MAX_SNAP; i++) {
        s[n] = (snap_buf){.p = a->vx[i], .n = (size_t)B * r}, snprintf(s[n].name, 24, "vx%d", i), n++;
        s[n] = (snap_buf){.p = a->u[i], .n = BD}, snprintf(s[n].name, 24, "u%d", i), n++;
        s[n] = (snap_buf){.p = a->xs[i], .n = BD}, snprintf(s[n].name, 24, "xs%d", i), n++;
    }
    return n;
}

static float *snap_down(const snap_buf *b) { return b->is_f32 ? f32_down(b->p, b->n) : act_down(b->p, b->n); }

static void snap_keep_cpu(void) {
    snap_buf s[MAX_SNAP];
    cpu_snap_n = snap_list(s);
    for (int i = 0; i < cpu_snap_n; i++) cpu_snap[i] = snap_down(&s[i]);
}

static void snap_compare(void) {
    snap_buf s[MAX_SNAP];
    int n = snap_list(s);
    if (n != cpu_snap_n) {
        printf("  diagnosis: %d buffers here, %d in the CPU run: not compared\n", n, cpu_snap_n);
        return;
    }
    for (int i = 0; i < n; i++) {
        float *d = snap_down(&s[i]);
        const float *ref = cpu_snap[i];
        double sq = 0, near = 0; /* near: the largest value of a unit that changed side */
        int flips = 0;
        for (size_t j = 0; j < s[i].n; j++) {
            sq += (double)ref[j] * ref[j];
            if (s[i].relu && (d[j] > 0) != (ref[j] > 0)) flips++, near = fmax(near, fmax(fabs(d[j]), fabs(ref[j])));
        }
        const double rms = sqrt(sq / (double)s[i].n);
        printf("  diagnosis: %-6s vs the CPU run: rel err %.3e", s[i].name, rel_err(d, ref, s[i].n));
        if (s[i].relu) printf(", %d of %zu units on the other side of 0 (largest flipped value %.2e, rms %.2e)", flips, s[i].n, near, rms);
        printf("\n");
        free(d);
    }
}

static void diagnose_top0(void) {
    snap_compare();
    nb_sc_acts *a = M.acts;
    int B = M.stage->B, Dx = (M.cfg.ncat + 1) * M.cfg.E, K = M.cfg.top[0];
    float *dtp = act_down(a->dtp, (size_t)B * K), *dt = act_down(a->dt, (size_t)B * K);
    float *top0 = act_down(a->top[0], (size_t)B * K), *xs = act_down(a->xs[M.cfg.blocks - 1], (size_t)B * Dx);
    const float *dw = NULL;
    for (int i = 0; i < M.ntensors; i++)
        if (!strcmp(M.t[i].name, "top.0.weight")) dw = M.grads + M.t[i].off;
    double relu_err = 0, num = 0, den = 0;
    for (int i = 0; i < B * K; i++) relu_err = fmax(relu_err, fabs(dtp[i] - (top0[i] > 0 ? dt[i] : 0.0f)));
    for (int k = 0; k < K && dw; k++)
        for (int d = 0; d < Dx; d++) {
            double s = 0;
            for (int b = 0; b < B; b++) s += (double)dtp[(size_t)b * K + k] * xs[(size_t)b * Dx + d];
            num += (dw[(size_t)k * Dx + d] - s) * (dw[(size_t)k * Dx + d] - s), den += s * s;
        }
    printf("  diagnosis: top.0's dtp vs ReLU'(top.0) * dt: max abs diff %.3e; top.0.weight gradient vs dtp^T xs "
           "recomputed on the host from the device's own buffers: rel err %.3e\n", relu_err, den > 0 ? sqrt(num / den) : -1.0);
    if (M.cfg.ntop == 2) diagnose_dt(dt);
    diagnose_forward();
    free(dtp), free(dt), free(top0), free(xs);
}

TEST_CASE(forward_backward_matches_torch) {
    int B = BT.B, E = M.cfg.E;
    float *logits = nb_malloc((size_t)B * sizeof(float), "logits");
    nb_sc_zero_grads(&M);
    double loss = nb_sc_forward(&M, &BT, logits);
    nb_sc_backward(&M, &BT);
    if (M.be->device == NB_DEV_CPU && !cpu_snap_n) snap_keep_cpu();
    float *ref_last = read_raw("logits", NB_F32, B), *ref_loss = read_raw("loss", NB_F32, 1);
    int bad = 0;
    bad += row("logits", rel_err(logits, ref_last, (size_t)B), TOL_LOGITS);
    bad += row("loss", rel1(loss, ref_loss[0]), TOL_LOSS);
    double worst = 0;
    const char *worst_name = "";
    for (int i = 0; i < M.ntensors; i++) {
        char name[64];
        snprintf(name, sizeof name, "g.%s", M.t[i].name);
        float *g = read_raw(name, NB_F32, (int64_t)M.t[i].n);
        double e = rel_err(M.grads + M.t[i].off, g, M.t[i].n);
        free(g);
        bad += row(name, e, TOL_GRAD);
        if (e > worst) worst = e, worst_name = M.t[i].name;
    }
    const nb_st_tensor *rt = nb_st_find(F, "g.emb.rows");
    NB_CHECK(rt && rt->dtype == NB_I32, REGEN_HINT, "%s: g.emb.rows missing", ref_path);
    int U = (int)rt->numel;
    int32_t *rows = read_raw("g.emb.rows", NB_I32, U); /* an aligned copy: the file packs tensors at any offset */
    int same_rows = M.nuniq == U;
    for (int u = 0; same_rows && u < U; u++) same_rows = M.uniq_rows[u] == rows[u];
    if (!same_rows) printf("  touched rows: nobubble %d, torch %d, or different rows  FAIL\n", M.nuniq, U);
    bad += !same_rows;
    if (same_rows) {
        float *ge = read_raw("g.emb", NB_F32, (int64_t)U * E);
        double ee = rel_err(M.uniq_grads, ge, (size_t)U * E);
        bad += row("g.emb (touched rows)", ee, TOL_GRAD);
        double wr = 0;
        for (int u = 0; u < U; u++) {
            double e = rel_err(M.uniq_grads + (size_t)u * E, ge + (size_t)u * E, (size_t)E);
            wr = e > wr ? e : wr;
        }
        printf("  %d touched rows, worst single row rel err %.3e\n", U, wr);
        free(ge);
    }
    printf("  loss %.9f (torch %.9f); worst dense gradient %s %.3e\n", loss, (double)ref_loss[0], worst_name, worst);
    const char *n32 = nb_st_meta_get(F, "torch32_err");
    if (n32) printf("  torch's float32 run vs float64 (noise floor): %s\n", n32);
    const char *n16 = nb_st_meta_get(F, "torch_bf16_err");
    if (n16 && M.be->act_dtype == NB_BF16) printf("  torch's bfloat16 step vs float64 (the bf16 floor): %s\n", n16);
    if ((bad || diagnose) && M.cfg.ntop >= 1) diagnose_top0();
    free(logits), free(ref_last), free(ref_loss), free(rows);
    CHECK(bad == 0, "%d comparison(s) out of tolerance (table above)", bad);
}

TEST_CASE(twenty_steps_match_torch) {
    float *ref = read_raw("losses", NB_F32, NSTEPS);
    nb_sc_optim o = {.lr = LR, .eps = EPS, .emb_lr = LR, .emb_eps = EMB_EPS, .emb_exact = 1, .dense_adagrad = 1};
    /* bf16 (TOL_LOSSES above 1e-4) rounds every step's activations; Adagrad's first updates are
     * about lr * sign(g), so tiny gradients' rounding moves weights by whole steps and the bf16
     * trajectory leaves the float64 one after a few steps: its first BF16_STEPS losses are compared,
     * then the loss must fall by at least half of torch's fall (the fp32 backends compare all 20 steps). */
    enum { BF16_STEPS = 3 };
    int bad = 0, lowp = TOL_LOSSES > 1e-4, compared = lowp ? BF16_STEPS : NSTEPS;
    double first = 0, loss = 0;
    for (int step = 0; step < NSTEPS; step++) {
        nb_sc_zero_grads(&M);
        loss = nb_sc_forward(&M, &BT, NULL);
        nb_sc_backward_enqueue(&M);
        nb_sc_optim_enqueue(&M, &o, step + 1);
        if (step == 0) first = loss;
        double e = rel1(loss, ref[step]);
        int b = step < compared && !(e <= TOL_LOSSES);
        bad += b;
        if (b || verbose)
            printf("  step %d loss %.9f torch %.9f rel err %.3e %s\n", step, loss, (double)ref[step], e,
                   b ? "FAIL" : step < compared ? "ok" : "(not compared)");
    }
    double t0 = ref[0], t1 = ref[NSTEPS - 1];
    free(ref);
    CHECK(bad == 0, "%d of the first %d step losses out of tolerance %.0e", bad, compared, TOL_LOSSES);
    if (lowp)
        CHECK(isfinite(loss) && first - loss >= 0.5 * (t0 - t1),
              "bf16: the loss went %.6f -> %.6f over %d steps, less than half of torch's fall %.6f -> %.6f", first, loss, NSTEPS,
              t0, t1);
}

/* Both cases on one backend, from a fresh model. */
static void run_on(const nb_backend_i *be, double tol_scale_logits, double tol_grad) {
    printf("backend %s\n", be->name);
    TOL_LOGITS = TOL_LOSS = tol_scale_logits;
    TOL_GRAD = tol_grad;
    TOL_LOSSES = tol_scale_logits > 1e-5 ? tol_scale_logits : 1e-4;
    setup(be);
    RUN(forward_backward_matches_torch);
    RUN(twenty_steps_match_torch);
    nb_sc_free(&M);
    free(dense), free(cat), free(target), free(hist), free(hist_len), free(label), free(mv), free(mv_len);
}

int main(int argc, char **argv) {
    static char path[PATH_MAX];
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--ref") && i + 1 < argc)
            ref_path = argv[++i];
        else if (!strcmp(argv[i], "--verbose"))
            verbose = 1;
        else if (!strcmp(argv[i], "--diagnose"))
            diagnose = 1;
        else
            nb_fail("usage: test_dlrm_ref [--ref FILE] [--verbose] [--diagnose]", "unknown argument '%s'", argv[i]);
    }
    if (!ref_path) {
        ref_file("dlrm_tiny.safetensors", path, sizeof path);
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
