/* Whole model against PyTorch. For each reference file written by tests/torch/ref_check.py gen
 * (committed: tests/torch/ref/gpt2_tiny.safetensors and llama_tiny.safetensors; qwen2_tiny and qwen3_tiny
 * when generated, read when present), build the model
 * from the file's metadata, load its weights and batch, and through the model API (embed, layer
 * forward, head with backward, layer backward, embed backward: the trainer's work items) compare
 * with the float64 PyTorch reference:
 *   loss (rel 1e-5), logits of every position (rel 1e-5), every parameter gradient (rel 1e-4 per
 *   tensor, norm-wise), then N AdamW steps on the same batch (torch.optim.AdamW semantics:
 *   constant lr, decay on 2-D tensors only, no clipping): each step's loss (rel 1e-4) and the
 *   weights after the last step (rel 1e-3 per tensor).
 * Beside each error it prints the error of PyTorch's own float32 run against the same float64
 * reference (stored in the file), the noise floor a float32 implementation can reach.
 *
 * Backends are rows of a table (runner): memory and copies of the device, and the op table. The
 * CPU row and, in CUDA builds, the CUDA fp32 row (cudaMalloc/cudaMemcpy and a stream).
 *
 *   test_torch_ref [--ref FILE]... [--backend NAME] [--save-ckpt DIR] [--threads N] [--verbose]
 * --save-ckpt DIR writes each reference's initial weights as a nobubble checkpoint DIR/<name>/
 * (for 'nobubble export' + 'ref_check.py check-export'). Without reference files: exit 77. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "core.h"
#include "family/family.h"
#include "host.h"
#include "io/atomic.h"
#include "io/safetensors.h"
#include "model/transformer.h"
#include "ops/backend.h"
#include "ref_file.h"
#include "optim/optim.h"
#include "run/ckpt.h"
#include "run/run.h"

#define REGEN_HINT "regenerate it with tests/torch/ref_check.py gen (see tests/torch/README.md)"
#define MAX_STEPS 1000

static double tol_loss = 1e-5, tol_logits = 1e-5, tol_grad = 1e-4, tol_losses = 1e-4, tol_weights = 1e-3;
static int verbose = 0;

/* ---------------------------------------------------------------- backends */

typedef struct {
    const char *name;
    const nb_backend_i *be;
    void *(*alloc)(size_t bytes); /* zeroed device memory */
    void (*release)(void *p);
    void (*upload)(void *dst, const void *src, size_t bytes);
    void (*download)(void *dst, const void *src, size_t bytes);
    void (*sync)(nb_ctx ctx); /* wait for the ops enqueued on ctx */
    void (*ctx_init)(nb_task_ctx *ctx); /* NULL: no stream (CPU); CUDA sets ctx->stream */
    int (*available)(void);             /* NULL: always; 0 skips this backend (no GPU here) */
} runner;

static void *cpu_alloc(size_t bytes) { return nb_aligned_alloc(bytes ? bytes : 1, "test buffer"); }
static void cpu_copy(void *dst, const void *src, size_t bytes) { memcpy(dst, src, bytes); }
static void cpu_sync(nb_ctx ctx) { (void)ctx; }

#ifdef NB_WITH_CUDA
#include <cuda_runtime.h>

#include "cuda_check.h"

/* The CUDA fp32 backend (TF32 off): the same comparisons, on the GPU. */
static void *cuda_alloc(size_t bytes) {
    void *p = NULL;
    CUDA_CHECK(cudaMalloc(&p, bytes ? bytes : 1));
    CUDA_CHECK(cudaMemset(p, 0, bytes ? bytes : 1));
    return p;
}
static void cuda_release(void *p) { CUDA_CHECK(cudaFree(p)); }
static void cuda_upload(void *dst, const void *src, size_t bytes) {
    CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}
static void cuda_download(void *dst, const void *src, size_t bytes) {
    CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}
static void cuda_sync(nb_ctx ctx) { CUDA_CHECK(cudaStreamSynchronize((cudaStream_t)ctx->stream)); }
/* the ops find their cuBLASLt handle through ctx->backend: one instance of GPU 0 */
static void cuda_ctx_init(nb_task_ctx *ctx) {
    static nb_backend *inst;
    if (!inst) inst = nb_backend_create("cuda", "fp32");
    cudaStream_t s;
    CUDA_CHECK(cudaStreamCreate(&s));
    ctx->stream = s;
    ctx->backend = inst;
}
static int cuda_available(void) { return nb_cuda_device_count(NULL, 0) > 0; }
#endif

static const runner runners[] = {
    {"cpu", &nb_backend_cpu, cpu_alloc, free, cpu_copy, cpu_copy, cpu_sync, NULL, NULL},
#ifdef NB_WITH_CUDA
    {"cuda", &nb_backend_cuda_f32, cuda_alloc, cuda_release, cuda_upload, cuda_download, cuda_sync, cuda_ctx_init,
     cuda_available},
#endif
};
#define NRUNNERS ((int)(sizeof runners / sizeof runners[0]))

/* ---------------------------------------------------------------- reference file */

typedef struct {
    const char *path;
    nb_st_file *f;
    nb_tf_model m;
    int B, T, steps;
    uint64_t seed;
    float lr, beta1, beta2, eps, weight_decay;
    float *w0, *g, *w_final; /* host slabs in the model's layout; w_final NULL when absent */
    int32_t *tokens, *targets;
    float loss, *logits, *losses;
    float torch32_loss, *torch32_losses; /* PyTorch float32 run, for context; NULL when absent */
} reference;

static const char *meta_str(const nb_st_file *f, const char *key) {
    const char *v = nb_st_meta_get(f, key);
    NB_CHECK(v, REGEN_HINT, "%s: metadata field '%s' is missing", nb_st_path(f), key);
    return v;
}

static double meta_num(const nb_st_file *f, const char *key, double lo, double hi) {
    const char *s = meta_str(f, key);
    char *end;
    double v = strtod(s, &end);
    NB_CHECK(end != s && !*end && v >= lo && v <= hi, REGEN_HINT, "%s: metadata '%s' = '%s' is not a number in [%g, %g]",
             nb_st_path(f), key, s, lo, hi);
    return v;
}

static int meta_int(const nb_st_file *f, const char *key, int lo, int hi) {
    double v = meta_num(f, key, lo, hi);
    NB_CHECK(v == floor(v), REGEN_HINT, "%s: metadata '%s' is not an integer", nb_st_path(f), key);
    return (int)v;
}

static void read_config(const nb_st_file *f, nb_tf_config *c) {
    const char *preset = meta_str(f, "preset"), *arch = meta_str(f, "arch");
    NB_CHECK(!strcmp(arch, "gpt2") || !strcmp(arch, "llama"), REGEN_HINT, "%s: unknown arch '%s'", nb_st_path(f), arch);
    memset(c, 0, sizeof *c);
    snprintf(c->preset, sizeof c->preset, "%s", preset);
    c->arch = strcmp(arch, "gpt2") ? NB_ARCH_LLAMA : NB_ARCH_GPT2;
    c->layers = meta_int(f, "layers", 1, 4096);
    c->dim = meta_int(f, "dim", 1, 1 << 20);
    c->heads = meta_int(f, "heads", 1, 1 << 16);
    c->kv_heads = meta_int(f, "kv_heads", 1, 1 << 16);
    c->ffn = meta_int(f, "ffn", 1, 1 << 24);
    c->vocab = meta_int(f, "vocab", 2, NB_TF_MAX_VOCAB);
    c->seq = meta_int(f, "seq", 1, 1 << 20);
    c->tied = meta_int(f, "tied", 0, 1);
    c->norm_eps = (float)meta_num(f, "norm_eps", 0, 1);
    c->rope_theta = (float)meta_num(f, "rope_theta", 1, 1e9);
    /* the Qwen variants of the Llama layout; absent in older references */
    c->head_dim = nb_st_meta_get(f, "head_dim") ? meta_int(f, "head_dim", 0, 1 << 16) : 0;
    c->qkv_bias = nb_st_meta_get(f, "qkv_bias") ? meta_int(f, "qkv_bias", 0, 1) : 0;
    c->qk_norm = nb_st_meta_get(f, "qk_norm") ? meta_int(f, "qk_norm", 0, 1) : 0;
    nb_tf_config_finalize(c);
    NB_CHECK(c->vocab_padded == meta_int(f, "vocab_padded", 2, NB_TF_MAX_VOCAB), REGEN_HINT,
             "%s: vocab_padded %d, this build pads to %d", nb_st_path(f), meta_int(f, "vocab_padded", 2, NB_TF_MAX_VOCAB),
             c->vocab_padded);
}

/* Every parameter "<prefix><name>" into a slab of the model's layout (shape-checked). */
static float *read_slab(const nb_st_file *f, const nb_tf_model *m, const char *prefix) {
    float *slab = nb_aligned_alloc(m->total * sizeof(float), "reference slab");
    for (int i = 0; i < m->nparams; i++) {
        const nb_param *p = &m->params[i];
        char name[128];
        snprintf(name, sizeof name, "%s%s", prefix, p->name);
        NB_CHECK(nb_st_find(f, name), REGEN_HINT, "%s has no tensor '%s'", nb_st_path(f), name);
        nb_st_read_shaped(f, name, NB_F32, p->ndim, p->shape, slab + p->offset);
    }
    return slab;
}

static void *read_tensor(const nb_st_file *f, const char *name, nb_dtype dt, int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    void *buf = nb_malloc((size_t)n * nb_dtype_size(dt), name);
    NB_CHECK(nb_st_find(f, name), REGEN_HINT, "%s has no tensor '%s'", nb_st_path(f), name);
    nb_st_read_shaped(f, name, dt, ndim, shape, buf);
    return buf;
}

static void load_reference(reference *r, const char *path) {
    memset(r, 0, sizeof *r);
    r->path = path;
    r->f = nb_st_open(path);
    const nb_st_file *f = r->f;
    NB_CHECK(!strcmp(meta_str(f, "format"), "nobubble-torch-ref"), REGEN_HINT, "%s is not a reference file", path);
    NB_CHECK(meta_int(f, "version", 0, 1000) == 1, REGEN_HINT, "%s: unknown reference version", path);
    nb_tf_config c;
    read_config(f, &c);
    nb_tf_model_init(&r->m, &c);
    r->B = meta_int(f, "batch", 1, 1 << 16);
    r->T = meta_int(f, "T", 1, c.seq);
    r->steps = meta_int(f, "steps", 1, MAX_STEPS);
    r->seed = (uint64_t)meta_num(f, "seed", 0, 1e15);
    r->lr = (float)meta_num(f, "lr", 0, 1);
    r->beta1 = (float)meta_num(f, "beta1", 0, 1);
    r->beta2 = (float)meta_num(f, "beta2", 0, 1);
    r->eps = (float)meta_num(f, "eps", 0, 1);
    r->weight_decay = (float)meta_num(f, "weight_decay", 0, 10);
    NB_CHECK(meta_num(f, "grad_clip", 0, 1e9) == 0 && !strcmp(meta_str(f, "lr_schedule"), "constant"), REGEN_HINT,
             "%s: this test replays unclipped AdamW at a constant lr", path);

    r->w0 = read_slab(f, &r->m, "w.");
    r->g = read_slab(f, &r->m, "g.");
    if (nb_st_find(f, "w10.wte")) r->w_final = read_slab(f, &r->m, "w10.");
    int64_t bt[2] = {r->B, r->T}, btv[3] = {r->B, r->T, c.vocab}, one = 1, steps = r->steps;
    r->tokens = read_tensor(f, "tokens", NB_I32, 2, bt);
    r->targets = read_tensor(f, "targets", NB_I32, 2, bt);
    for (int64_t i = 0; i < bt[0] * bt[1]; i++)
        NB_CHECK(r->tokens[i] >= 0 && r->tokens[i] < c.vocab && r->targets[i] >= 0 && r->targets[i] < c.vocab,
                 REGEN_HINT, "%s: token id out of range at %lld", path, (long long)i);
    float *loss = read_tensor(f, "loss", NB_F32, 1, &one);
    r->loss = *loss;
    free(loss);
    r->logits = read_tensor(f, "logits", NB_F32, 3, btv);
    r->losses = read_tensor(f, "losses10", NB_F32, 1, &steps);
    if (nb_st_find(f, "torch32.losses10")) {
        loss = read_tensor(f, "torch32.loss", NB_F32, 1, &one);
        r->torch32_loss = *loss;
        free(loss);
        r->torch32_losses = read_tensor(f, "torch32.losses10", NB_F32, 1, &steps);
    }
}

static void free_reference(reference *r) {
    free(r->w0), free(r->g), free(r->w_final), free(r->tokens), free(r->targets), free(r->logits), free(r->losses);
    free(r->torch32_losses);
    nb_tf_model_free(&r->m);
    nb_st_close(r->f);
}

/* ---------------------------------------------------------------- one backend */

typedef struct {
    const runner *rn;
    nb_task_ctx ctx;
    void *params, *grads, *acts_buf, *tokens, *targets, *logits;
    nb_tf_acts acts;
    float *losses; /* host copy of acts.losses */
} device;

static void device_init(device *d, const runner *rn, const reference *r) {
    const nb_tf_model *m = &r->m;
    size_t N = (size_t)r->B * r->T, slab = m->total * sizeof(float), acts = nb_tf_acts_bytes(m, r->B, r->T, sizeof(float));
    /* fp32 parity: weights go to the device as they are (a bf16 backend needs a cast here) */
    NB_ASSERT(rn->be->act_dtype == NB_F32);
    memset(d, 0, sizeof *d);
    d->rn = rn;
    if (rn->ctx_init) rn->ctx_init(&d->ctx);
    d->params = rn->alloc(slab);
    d->grads = rn->alloc(slab);
    d->acts_buf = rn->alloc(acts);
    d->tokens = rn->alloc(N * sizeof(int32_t));
    d->targets = rn->alloc(N * sizeof(int32_t));
    d->logits = rn->alloc(N * (size_t)m->cfg.vocab * sizeof(float));
    d->losses = nb_malloc(N * sizeof(float), "losses");
    rn->upload(d->tokens, r->tokens, N * sizeof(int32_t));
    rn->upload(d->targets, r->targets, N * sizeof(int32_t));
    nb_tf_acts_bind(m, &d->acts, d->acts_buf, r->B, r->T, sizeof(float));
}

static void device_free(device *d) {
    nb_tf_acts_unbind(&d->acts);
    void *bufs[] = {d->params, d->grads, d->acts_buf, d->tokens, d->targets, d->logits};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) d->rn->release(bufs[i]);
    free(d->losses);
}

static void *gp(const nb_tf_model *m, int which, void *slab) { return nb_tf_global_ptr(m, which, slab, sizeof(float)); }

static void views(const nb_tf_model *m, int l, device *d, nb_tf_layer_view *w, nb_tf_layer_view *dw) {
    size_t g0 = m->group_offset[1 + l] * sizeof(float);
    nb_tf_bind_layer(m, l, (char *)d->params + g0, sizeof(float), w);
    nb_tf_bind_layer(m, l, (char *)d->grads + g0, sizeof(float), dw);
}

/* One training step's forward and backward, as the trainer's work items run it; gradients of
 * the mean loss into d->grads. Returns the mean loss. */
static double forward_backward(const reference *r, device *d) {
    const nb_tf_model *m = &r->m;
    const nb_backend_i *be = d->rn->be;
    nb_ctx ctx = &d->ctx;
    int L = m->cfg.layers, N = r->B * r->T, head = m->cfg.tied ? NB_TF_WTE : NB_TF_LM_HEAD;
    nb_tf_layer_view w, dw;
    be->zero(ctx, d->grads, m->total * sizeof(float));
    nb_tf_embed_forward(m, be, ctx, gp(m, NB_TF_WTE, d->params), gp(m, NB_TF_WPE, d->params), d->tokens, &d->acts);
    for (int l = 0; l < L; l++) {
        views(m, l, d, &w, &dw);
        nb_tf_layer_forward(m, be, ctx, &w, l, &d->acts);
    }
    nb_tf_head(m, be, ctx, gp(m, NB_TF_LNF_W, d->params), gp(m, NB_TF_LNF_B, d->params), gp(m, head, d->params), L,
               d->targets, 1, 1.0f / (float)N, NULL, gp(m, NB_TF_LNF_W, d->grads), gp(m, NB_TF_LNF_B, d->grads),
               gp(m, head, d->grads), &d->acts);
    for (int l = L - 1; l >= 0; l--) {
        views(m, l, d, &w, &dw);
        nb_tf_layer_backward(m, be, ctx, &w, &dw, l, &d->acts);
    }
    nb_tf_embed_backward(m, be, ctx, gp(m, NB_TF_WTE, d->grads), gp(m, NB_TF_WPE, d->grads), d->tokens, &d->acts);
    d->rn->sync(ctx);
    d->rn->download(d->losses, d->acts.losses, (size_t)N * sizeof(float));
    double s = 0;
    for (int i = 0; i < N; i++) s += d->losses[i];
    return s / N;
}

/* Logits of every position: the head's final-norm output (a->lnf, left by nb_tf_head) times the
 * head weight, as the fused cross-entropy forms them. */
static void logits_all(const reference *r, device *d, float *host) {
    const nb_tf_model *m = &r->m;
    int N = r->B * r->T, V = m->cfg.vocab;
    const void *head = gp(m, m->cfg.tied ? NB_TF_WTE : NB_TF_LM_HEAD, d->params);
    d->rn->be->matmul_fwd(&d->ctx, d->logits, d->acts.lnf, head, NULL, N, m->cfg.dim, V);
    d->rn->sync(&d->ctx);
    d->rn->download(host, d->logits, (size_t)N * V * sizeof(float));
}

/* ---------------------------------------------------------------- comparisons */

static double max_abs_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - (double)b[i]));
    return m;
}

/* Per-tensor relative error of slab a against b; prints the table when asked or on failure.
 * Returns the number of tensors over tol and the worst error in *worst / *worst_name. */
static int compare_slabs(const nb_tf_model *m, const float *a, const float *b, double tol, const char *what,
                         double *worst, const char **worst_name) {
    int bad = 0;
    *worst = 0;
    *worst_name = "";
    for (int i = 0; i < m->nparams; i++) {
        const nb_param *p = &m->params[i];
        double e = rel_err(a + p->offset, b + p->offset, p->numel);
        if (!(e <= tol)) bad++;
        if (!(e <= *worst)) *worst = e, *worst_name = p->name;
    }
    if (bad || verbose) {
        printf("    %-32s %12s %12s %12s\n", what, "rel err", "max |diff|", "ref norm");
        for (int i = 0; i < m->nparams; i++) {
            const nb_param *p = &m->params[i];
            double e = rel_err(a + p->offset, b + p->offset, p->numel), nrm = 0;
            for (size_t k = 0; k < p->numel; k++) nrm += (double)b[p->offset + k] * b[p->offset + k];
            printf("    %-32s %12.3e %12.3e %12.3e%s\n", p->name, e, max_abs_diff(a + p->offset, b + p->offset, p->numel),
                   sqrt(nrm), e <= tol ? "" : "   <-- over tolerance");
        }
    }
    return bad;
}

static const char *verdict(int ok) { return ok ? "ok  " : "FAIL"; }

static void check_reference(const reference *r, const runner *rn) {
    const nb_tf_model *m = &r->m;
    const nb_tf_config *c = &m->cfg;
    size_t N = (size_t)r->B * r->T, slab = m->total * sizeof(float);
    const char *t32 = nb_st_meta_get(r->f, "torch32_impl");
    printf("%s on %s: %s (%s layout) layers %d, dim %d, heads %d/%d, ffn %d, vocab %d; batch %d x %d\n", r->path, rn->name,
           c->preset, c->arch == NB_ARCH_GPT2 ? "gpt2" : "llama", c->layers, c->dim, c->heads, c->kv_heads, c->ffn, c->vocab,
           r->B, r->T);
    printf("  (in brackets: the error of PyTorch's own float32 run, %s, against the same float64 reference)\n",
           t32 ? t32 : "not recorded");
    device d;
    device_init(&d, rn, r);
    float *params = nb_aligned_alloc(slab, "params"), *grads = nb_aligned_alloc(slab, "grads");
    float *mom = nb_aligned_alloc(slab, "adamw m"), *vel = nb_aligned_alloc(slab, "adamw v");
    float *logits = nb_malloc(N * (size_t)c->vocab * sizeof(float), "logits");
    memcpy(params, r->w0, slab);
    rn->upload(d.params, params, slab);

    double t0 = nb_now();
    double loss = forward_backward(r, &d);
    double t_fb = nb_now() - t0;
    double e = fabs(loss - r->loss) / fabs(r->loss);
    printf("  %s loss                 %.7f vs %.7f, rel err %.2e [%.2e]  (tol %.0e)\n", verdict(e <= tol_loss), loss, r->loss,
           e, r->torch32_losses ? fabs(r->torch32_loss - r->loss) / fabs(r->loss) : NAN, tol_loss);
    CHECK(e <= tol_loss, "%s: loss %.8f vs reference %.8f", r->path, loss, r->loss);

    logits_all(r, &d, logits);
    e = rel_err(logits, r->logits, N * (size_t)c->vocab);
    printf("  %s logits [%d, %d, %d]   rel err %.2e [%s], max |diff| %.2e  (tol %.0e)\n", verdict(e <= tol_logits), r->B,
           r->T, c->vocab, e, nb_st_meta_get(r->f, "torch32_logits_relerr") ? nb_st_meta_get(r->f, "torch32_logits_relerr") : "-",
           max_abs_diff(logits, r->logits, N * (size_t)c->vocab), tol_logits);
    CHECK(e <= tol_logits, "%s: logits rel err %.3e", r->path, e);

    rn->download(grads, d.grads, slab);
    double worst;
    const char *wname;
    int bad = compare_slabs(m, grads, r->g, tol_grad, "gradient", &worst, &wname);
    printf("  %s gradients            %d tensors, worst rel err %.2e in %s [%s in %s]  (tol %.0e)\n", verdict(!bad),
           m->nparams, worst, wname,
           nb_st_meta_get(r->f, "torch32_grad_worst_relerr") ? nb_st_meta_get(r->f, "torch32_grad_worst_relerr") : "-",
           nb_st_meta_get(r->f, "torch32_grad_worst_name") ? nb_st_meta_get(r->f, "torch32_grad_worst_name") : "-",
           tol_grad);
    CHECK(!bad, "%s: %d gradient tensors over tolerance", r->path, bad);

    /* AdamW on the host master weights (as the trainer's optimizer item), then upload. The
     * first step's gradients are the ones just compared. */
    double worst_step = 0, worst_t32 = 0;
    float *losses = nb_malloc((size_t)r->steps * sizeof(float), "losses");
    double t1 = nb_now();
    for (int s = 0; s < r->steps; s++) {
        if (s > 0) {
            losses[s] = (float)forward_backward(r, &d);
            rn->download(grads, d.grads, slab);
        } else {
            losses[s] = (float)loss;
        }
        for (int i = 0; i < m->nparams; i++) {
            const nb_param *p = &m->params[i];
            nb_adamw_cfg oc = {r->lr, r->beta1, r->beta2, r->eps, p->decay ? r->weight_decay : 0.0f};
            nb_adamw_update(params + p->offset, grads + p->offset, mom + p->offset, vel + p->offset, p->numel, oc, s + 1);
        }
        rn->upload(d.params, params, slab);
        worst_step = fmax(worst_step, fabs((double)losses[s] - r->losses[s]) / fabs(r->losses[s]));
        if (r->torch32_losses)
            worst_t32 = fmax(worst_t32, fabs((double)r->torch32_losses[s] - r->losses[s]) / fabs(r->losses[s]));
    }
    double t_steps = nb_now() - t1;
    /* Over many AdamW steps float32 rounding grows with the model (Adam turns tiny gradient
     * differences of near-zero elements into whole-lr steps): the bar is the larger of the
     * tolerance and twice the error PyTorch's own float32 run shows against float64. */
    double tol_steps = fmax(tol_losses, 2.0 * worst_t32);
    int ok = worst_step <= tol_steps;
    printf("  %s %d AdamW steps        loss %.5f -> %.5f (reference %.5f -> %.5f), worst step rel err %.2e [%.2e]  (tol %.1e)\n",
           verdict(ok), r->steps, losses[0], losses[r->steps - 1], r->losses[0], r->losses[r->steps - 1], worst_step,
           worst_t32, tol_steps);
    if (!ok || verbose)
        for (int s = 0; s < r->steps; s++)
            printf("      step %2d  ours %.7f  reference %.7f  rel err %.2e\n", s, losses[s], r->losses[s],
                   fabs((double)losses[s] - r->losses[s]) / fabs(r->losses[s]));
    CHECK(ok, "%s: AdamW losses differ (worst rel err %.3e)", r->path, worst_step);

    if (r->w_final) {
        bad = compare_slabs(m, params, r->w_final, tol_weights, "weight after the steps", &worst, &wname);
        printf("  %s weights after %2d steps worst rel err %.2e in %s  (tol %.0e)\n", verdict(!bad), r->steps, worst, wname,
               tol_weights);
        CHECK(!bad, "%s: %d weight tensors over tolerance after %d steps", r->path, bad, r->steps);
    }
    printf("  forward+backward on %s: %.1f ms the first time, %.1f ms per AdamW step after\n", rn->name, 1e3 * t_fb,
           r->steps > 1 ? 1e3 * t_steps / (r->steps - 1) : NAN);
    free(losses), free(params), free(grads), free(mom), free(vel), free(logits);
    device_free(&d);
}

/* The reference's initial weights as a nobubble checkpoint in dir (for nobubble export). */
static void save_ckpt(const reference *r, const char *dir) {
    nb_train_opts o;
    nb_train_opts_defaults(&o, nb_family_find("transformer"));
    o.model = r->m.cfg;
    o.batch = r->B;
    o.seq = r->T;
    o.steps = r->steps;
    o.lr = r->lr, o.beta1 = r->beta1, o.beta2 = r->beta2, o.eps = r->eps, o.weight_decay = r->weight_decay;
    o.grad_clip = 0;
    o.seed = r->seed;
    float *zero = nb_aligned_alloc(r->m.total * sizeof(float), "zero moments");
    nb_ckpt_state st = {0, 0, r->seed};
    nb_mkdir_p(dir);
    nb_ckpt_list model = {0}, optim = {0};
    for (int i = 0; i < r->m.nparams; i++) {
        const nb_param *p = &r->m.params[i];
        char name[96];
        nb_ckpt_list_add(&model, p->name, p->ndim, p->shape, r->w0 + p->offset);
        snprintf(name, sizeof name, "%s.exp_avg", p->name);
        nb_ckpt_list_add(&optim, name, p->ndim, p->shape, zero + p->offset);
        snprintf(name, sizeof name, "%s.exp_avg_sq", p->name);
        nb_ckpt_list_add(&optim, name, p->ndim, p->shape, zero + p->offset);
    }
    nb_ckpt_write(dir, nb_family_find("transformer"), &o, &model, &optim, &st);
    nb_ckpt_list_free(&model), nb_ckpt_list_free(&optim);
    free(zero);
    printf("  wrote the reference weights as a checkpoint: %s/ckpt\n", dir);
}

/* ---------------------------------------------------------------- main */

/* Default references: those of the four transformer layouts that exist (ref_file.h says where). */
static int default_refs(char paths[][PATH_MAX], int cap) {
    static const char *names[] = {"gpt2_tiny.safetensors", "llama_tiny.safetensors", "qwen2_tiny.safetensors",
                                  "qwen3_tiny.safetensors"};
    int k = 0;
    for (int i = 0; i < (int)(sizeof names / sizeof names[0]) && k < cap; i++) k += ref_file(names[i], paths[k], PATH_MAX);
    return k;
}

static void usage(FILE *f) {
    fprintf(f, "usage: test_torch_ref [--ref FILE]... [--backend NAME] [--save-ckpt DIR] [--threads N] [--verbose]\n"
               "       [--tol-loss X] [--tol-logits X] [--tol-grad X] [--tol-losses X] [--tol-weights X]\n"
               "backends:");
    for (int i = 0; i < NRUNNERS; i++) fprintf(f, " %s", runners[i].name);
    fprintf(f, "\n");
}

int main(int argc, char **argv) {
    char refs[16][PATH_MAX];
    int nref = 0, threads = 0;
    const char *backend = NULL, *save = NULL;
    struct {
        const char *flag;
        double *dst;
    } tols[] = {{"--tol-loss", &tol_loss}, {"--tol-logits", &tol_logits}, {"--tol-grad", &tol_grad},
                {"--tol-losses", &tol_losses}, {"--tol-weights", &tol_weights}};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int used = 1, known = 1;
        if (!strcmp(a, "--verbose")) {
            verbose = 1, used = 0;
        } else if (!strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!v) {
            known = 0;
        } else if (!strcmp(a, "--ref") && nref < 16) {
            snprintf(refs[nref++], PATH_MAX, "%.3900s", v);
        } else if (!strcmp(a, "--backend")) {
            backend = v;
        } else if (!strcmp(a, "--save-ckpt")) {
            save = v;
        } else if (!strcmp(a, "--threads")) {
            threads = atoi(v);
        } else {
            known = 0;
            for (size_t t = 0; t < sizeof tols / sizeof tols[0]; t++)
                if (!strcmp(a, tols[t].flag)) *tols[t].dst = atof(v), known = 1;
        }
        if (!known) {
            fprintf(stderr, "test_torch_ref: bad argument '%s'\n", a);
            usage(stderr);
            return 2;
        }
        i += used;
    }
    int chosen = -1;
    if (backend) {
        for (int i = 0; i < NRUNNERS; i++)
            if (!strcmp(runners[i].name, backend)) chosen = i;
        if (chosen < 0) {
            fprintf(stderr, "test_torch_ref: backend '%s' is not in this test\n", backend);
            usage(stderr);
            return 2;
        }
    }
    nb_host_set_threads(threads);
    if (nref == 0) nref = default_refs(refs, 16);
    if (nref == 0) {
        printf("reference files not generated yet: tests/torch/ref/{gpt2_tiny,llama_tiny}.safetensors "
               "(see tests/torch/README.md)\n");
        return 77;
    }
    for (int i = 0; i < nref; i++) {
        reference r;
        load_reference(&r, refs[i]);
        if (save) {
            char dir[PATH_MAX + 64], base[PATH_MAX];
            snprintf(base, sizeof base, "%.3900s", refs[i]);
            char *b = basename(base), *dot = strstr(b, ".safetensors");
            if (dot) *dot = 0;
            snprintf(dir, sizeof dir, "%.2000s/%.2000s", save, b);
            save_ckpt(&r, dir);
        }
        for (int k = 0; k < NRUNNERS; k++) {
            if (chosen >= 0 && chosen != k) continue;
            if (runners[k].available && !runners[k].available()) {
                printf("%s: backend %s not available here, skipped\n", refs[i], runners[k].name);
                continue;
            }
            check_reference(&r, &runners[k]);
        }
        free_reference(&r);
    }
    printf("%s\n", nb_test_failures ? "FAIL: nobubble differs from the PyTorch reference" : "ok: nobubble matches the PyTorch reference");
    TEST_EXIT();
}
