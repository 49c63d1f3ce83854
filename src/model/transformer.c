#include "model/transformer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "rng.h"

/* ---------------------------------------------------------------- presets */

typedef struct {
    const char *name;
    nb_arch arch;
    int layers, dim, heads, kv_heads, ffn, vocab, seq;
} preset_row;

/* ffn = 0 means 4*dim (GPT-2). Tiny presets exist for tests; gpt2-mini is the default model on
 * the CPU (small enough to learn the default corpus in minutes on two cores); gpt2-proxy is the
 * 16M-parameter proxy of the benchmarks. */
static const preset_row presets[] = {
    {"gpt2-tiny", NB_ARCH_GPT2, 2, 64, 4, 4, 0, 50257, 64},
    {"gpt2-mini", NB_ARCH_GPT2, 4, 128, 4, 4, 0, 50257, 128},
    {"gpt2-proxy", NB_ARCH_GPT2, 4, 256, 4, 4, 0, 50257, 256},
    {"gpt2", NB_ARCH_GPT2, 12, 768, 12, 12, 0, 50257, 1024},
    {"gpt2-medium", NB_ARCH_GPT2, 24, 1024, 16, 16, 0, 50257, 1024},
    {"gpt2-large", NB_ARCH_GPT2, 36, 1280, 20, 20, 0, 50257, 1024},
    {"gpt2-xl", NB_ARCH_GPT2, 48, 1600, 25, 25, 0, 50257, 1024},
    {"llama-tiny", NB_ARCH_LLAMA, 2, 64, 4, 2, 172, 50304, 64},
    {"llama-1b", NB_ARCH_LLAMA, 16, 2048, 32, 8, 8192, 50304, 2048},
    {"llama-8b", NB_ARCH_LLAMA, 32, 4096, 32, 8, 14336, 50304, 2048},
    {"llama-14b", NB_ARCH_LLAMA, 48, 5120, 40, 8, 13824, 50304, 2048},
};
#define NPRESETS ((int)(sizeof presets / sizeof presets[0]))

const char *nb_tf_preset_names(void) {
    return "gpt2-tiny, gpt2-mini, gpt2-proxy, gpt2, gpt2-medium, gpt2-large, gpt2-xl, llama-tiny, "
           "llama-1b, llama-8b, llama-14b";
}

int nb_tf_preset(const char *name, nb_tf_config *cfg) {
    for (int i = 0; i < NPRESETS; i++) {
        const preset_row *p = &presets[i];
        if (strcmp(p->name, name) != 0) continue;
        memset(cfg, 0, sizeof *cfg);
        snprintf(cfg->preset, sizeof cfg->preset, "%s", p->name);
        cfg->arch = p->arch;
        cfg->layers = p->layers;
        cfg->dim = p->dim;
        cfg->heads = p->heads;
        cfg->kv_heads = p->kv_heads;
        cfg->ffn = p->ffn ? p->ffn : 4 * p->dim;
        cfg->vocab = p->vocab;
        cfg->seq = p->seq;
        cfg->norm_eps = 1e-5f;
        cfg->rope_theta = 10000.0f;
        cfg->tied = p->arch == NB_ARCH_GPT2;
        nb_tf_config_finalize(cfg);
        return 1;
    }
    return 0;
}

/* The scaling's numbers as transformers requires them (_validate_*_rope_parameters); a default
 * RoPE's unused ones are zeroed, so two plain configs compare equal. */
static void check_rope_scaling(nb_tf_config *c) {
    const char *hint = "rope scaling takes factor >= 1, and for llama3 0 < low_freq_factor < high_freq_factor and "
                       "original_max_position_embeddings >= 1";
    NB_CHECK(nb_rope_type_name(c->rope_scaling), hint, "unknown rope scaling %d", (int)c->rope_scaling);
    if (c->rope_scaling == NB_ROPE_DEFAULT) {
        c->rope_factor = c->rope_low_freq_factor = c->rope_high_freq_factor = 0.0f;
        c->rope_original_ctx = 0;
        return;
    }
    NB_CHECK(isfinite(c->rope_factor) && c->rope_factor >= 1.0f, hint, "rope scaling factor %g",
             (double)c->rope_factor);
    if (c->rope_scaling == NB_ROPE_LINEAR) {
        c->rope_low_freq_factor = c->rope_high_freq_factor = 0.0f;
        c->rope_original_ctx = 0;
        return;
    }
    NB_CHECK(isfinite(c->rope_low_freq_factor) && isfinite(c->rope_high_freq_factor) && c->rope_low_freq_factor > 0 &&
                 c->rope_high_freq_factor > c->rope_low_freq_factor && c->rope_original_ctx >= 1,
             hint, "llama3 rope scaling: low_freq_factor %g, high_freq_factor %g, original context %d",
             (double)c->rope_low_freq_factor, (double)c->rope_high_freq_factor, c->rope_original_ctx);
}

nb_rope nb_tf_rope(const nb_tf_config *c) {
    nb_rope r = nb_rope_plain(c->rope_theta);
    r.type = c->rope_scaling;
    if (r.type != NB_ROPE_DEFAULT) r.factor = c->rope_factor;
    r.low_freq_factor = c->rope_low_freq_factor, r.high_freq_factor = c->rope_high_freq_factor;
    r.original_ctx = c->rope_original_ctx;
    return r;
}

void nb_tf_config_finalize(nb_tf_config *c) {
    NB_CHECK(c->layers >= 1 && c->layers <= 4096, "--layers takes 1..4096", "bad layer count %d", c->layers);
    NB_CHECK(c->dim >= 1, "--dim takes a positive width", "bad width %d", c->dim);
    NB_CHECK(c->head_dim >= 0 && c->head_dim <= 65536, "the checkpoint's head_dim must be positive",
             "bad head size %d", c->head_dim);
    NB_CHECK(c->heads >= 1 && (c->head_dim || c->dim % c->heads == 0), "--dim must be a multiple of --heads",
             "width %d does not split into %d heads", c->dim, c->heads);
    NB_CHECK(c->arch == NB_ARCH_LLAMA || !(c->head_dim || c->qkv_bias || c->qk_norm),
             "head_dim, qkv_bias and qk_norm are Llama-layout variants (Qwen2, Qwen3)",
             "a GPT-2 layout with an explicit head size, a qkv bias switch or a q/k norm");
    NB_CHECK(c->kv_heads >= 1 && c->heads % c->kv_heads == 0, "--heads must be a multiple of --kv-heads",
             "%d query heads do not group into %d kv heads", c->heads, c->kv_heads);
    NB_CHECK(c->arch == NB_ARCH_LLAMA || c->kv_heads == c->heads, "GPT-2 layouts have kv-heads == heads",
             "--kv-heads %d differs from --heads %d for a GPT-2 model", c->kv_heads, c->heads);
    NB_CHECK(c->ffn >= 1, "--ffn takes a positive width", "bad ffn width %d", c->ffn);
    NB_CHECK(c->vocab >= 2 && c->vocab <= NB_TF_MAX_VOCAB, "--vocab takes 2..16777216", "bad vocabulary size %d",
             c->vocab);
    NB_CHECK(c->seq >= 1, "--seq takes a positive length", "bad sequence length %d", c->seq);
    c->head_size = c->head_dim ? c->head_dim : c->dim / c->heads;
    NB_CHECK(c->arch != NB_ARCH_LLAMA || c->head_size % 2 == 0, "RoPE needs an even head size",
             "head size %d is odd", c->head_size);
    c->vocab_padded = (c->vocab + 63) / 64 * 64;
    check_rope_scaling(c);
}

void nb_tf_config_print(const nb_tf_config *c, FILE *f) {
    fprintf(f, "model       %s (%s): layers %d, dim %d, heads %d, kv-heads %d, head size %d, ffn %d, vocab %d (padded %d), seq %d%s%s%s\n",
            c->preset, c->arch == NB_ARCH_GPT2 ? "gpt2 layout" : "llama layout", c->layers, c->dim, c->heads,
            c->kv_heads, c->head_size, c->ffn, c->vocab, c->vocab_padded, c->seq, c->tied ? ", tied head" : "",
            c->qkv_bias ? ", qkv bias" : "", c->qk_norm ? ", q/k norm" : "");
    if (c->rope_scaling == NB_ROPE_LINEAR)
        fprintf(f, "rope        theta %g, linear scaling: factor %g\n", (double)c->rope_theta, (double)c->rope_factor);
    else if (c->rope_scaling == NB_ROPE_LLAMA3)
        fprintf(f, "rope        theta %g, llama3 scaling: factor %g, low_freq_factor %g, high_freq_factor %g, "
                   "original context %d\n",
                (double)c->rope_theta, (double)c->rope_factor, (double)c->rope_low_freq_factor,
                (double)c->rope_high_freq_factor, c->rope_original_ctx);
}

/* ---------------------------------------------------------------- parameter table */

static int qkv_width(const nb_tf_config *c) { return (c->heads + 2 * c->kv_heads) * c->head_size; }
static int fc_width(const nb_tf_config *c) { return c->arch == NB_ARCH_GPT2 ? c->ffn : 2 * c->ffn; }
static int att_width(const nb_tf_config *c) { return c->heads * c->head_size; }

static int add_param(nb_tf_model *m, int cap, int group, const char *name, int ndim, int64_t d0, int64_t d1,
                     int decay) {
    NB_ASSERT(m->nparams < cap);
    nb_param *p = &m->params[m->nparams];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->group = group;
    p->ndim = ndim;
    p->shape[0] = d0;
    p->shape[1] = ndim > 1 ? d1 : 1;
    p->numel = (size_t)d0 * (size_t)(ndim > 1 ? d1 : 1);
    p->offset = m->total;
    p->decay = decay;
    m->total += nb_align_up(p->numel, NB_ALIGN / sizeof(float));
    m->n_real += p->numel;
    return m->nparams++;
}

void nb_tf_model_init(nb_tf_model *m, const nb_tf_config *cfg) {
    memset(m, 0, sizeof *m);
    m->cfg = *cfg;
    const nb_tf_config *c = &m->cfg;
    int gpt2 = c->arch == NB_ARCH_GPT2;
    int cap = 4 + NB_TF_LAYER_TENSORS * c->layers + 4;
    m->params = nb_calloc((size_t)cap, sizeof *m->params, "parameter table");
    m->layer_idx = nb_calloc((size_t)c->layers, sizeof *m->layer_idx, "layer table");
    m->ngroups = c->layers + 2;
    m->group_offset = nb_calloc((size_t)m->ngroups, sizeof(size_t), "group table");
    m->group_numel = nb_calloc((size_t)m->ngroups, sizeof(size_t), "group table");
    for (int k = 0; k < NB_TF_GLOBAL_TENSORS; k++) m->global_idx[k] = -1;

    int C = c->dim;
    m->group_offset[0] = m->total;
    m->global_idx[NB_TF_WTE] = add_param(m, cap, 0, "wte", 2, c->vocab_padded, C, 1);
    if (gpt2) m->global_idx[NB_TF_WPE] = add_param(m, cap, 0, "wpe", 2, c->seq, C, 1);
    m->group_numel[0] = m->total - m->group_offset[0];

    for (int l = 0; l < c->layers; l++) {
        int g = 1 + l, *ix = m->layer_idx[l];
        char nm[64];
        for (int k = 0; k < NB_TF_LAYER_TENSORS; k++) ix[k] = -1;
        m->group_offset[g] = m->total;
#define P(k, suffix, nd, d0, d1, dec)                                                              \
    do {                                                                                           \
        snprintf(nm, sizeof nm, "layers.%d.%s", l, suffix);                                        \
        ix[k] = add_param(m, cap, g, nm, nd, d0, d1, dec);                                         \
    } while (0)
        P(NB_TF_LN1_W, "ln1.weight", 1, C, 1, 0);
        if (gpt2) P(NB_TF_LN1_B, "ln1.bias", 1, C, 1, 0);
        P(NB_TF_QKV_W, "attn.qkv.weight", 2, qkv_width(c), C, 1);
        if (gpt2 || c->qkv_bias) P(NB_TF_QKV_B, "attn.qkv.bias", 1, qkv_width(c), 1, 0);
        if (c->qk_norm) {
            P(NB_TF_QNORM_W, "attn.q_norm.weight", 1, c->head_size, 1, 0);
            P(NB_TF_KNORM_W, "attn.k_norm.weight", 1, c->head_size, 1, 0);
        }
        P(NB_TF_PROJ_W, "attn.proj.weight", 2, C, att_width(c), 1);
        if (gpt2) P(NB_TF_PROJ_B, "attn.proj.bias", 1, C, 1, 0);
        P(NB_TF_LN2_W, "ln2.weight", 1, C, 1, 0);
        if (gpt2) P(NB_TF_LN2_B, "ln2.bias", 1, C, 1, 0);
        P(NB_TF_FC_W, gpt2 ? "mlp.fc.weight" : "mlp.gate_up.weight", 2, fc_width(c), C, 1);
        if (gpt2) P(NB_TF_FC_B, "mlp.fc.bias", 1, fc_width(c), 1, 0);
        P(NB_TF_FCPROJ_W, gpt2 ? "mlp.proj.weight" : "mlp.down.weight", 2, C, c->ffn, 1);
        if (gpt2) P(NB_TF_FCPROJ_B, "mlp.proj.bias", 1, C, 1, 0);
#undef P
        m->group_numel[g] = m->total - m->group_offset[g];
    }

    int gf = c->layers + 1;
    m->group_offset[gf] = m->total;
    m->global_idx[NB_TF_LNF_W] = add_param(m, cap, gf, "lnf.weight", 1, C, 1, 0);
    if (gpt2) m->global_idx[NB_TF_LNF_B] = add_param(m, cap, gf, "lnf.bias", 1, C, 1, 0);
    if (!c->tied) m->global_idx[NB_TF_LM_HEAD] = add_param(m, cap, gf, "lm_head.weight", 2, c->vocab_padded, C, 1);
    m->group_numel[gf] = m->total - m->group_offset[gf];
}

void nb_tf_model_free(nb_tf_model *m) {
    free(m->params);
    free(m->layer_idx);
    free(m->group_offset);
    free(m->group_numel);
    memset(m, 0, sizeof *m);
}

static int is_residual_projection(const char *name) {
    return strstr(name, "attn.proj.weight") || strstr(name, "mlp.proj.weight") || strstr(name, "mlp.down.weight");
}

/* One tensor's init into w (its own Philox stream: the same values whatever else is filled). */
/* Writes every element of p's tensor (so init never zeroes a slab first and writes it again). */
static void init_param(const nb_tf_model *m, const nb_param *p, float *w, uint64_t seed, const nb_tf_filler *fill) {
    float resid_std = 0.02f / sqrtf(2.0f * (float)m->cfg.layers);
    if (p->ndim == 1) {
        /* norm weights start at 1, biases at 0 */
        float v = (strstr(p->name, "ln") || strstr(p->name, "_norm")) && strstr(p->name, ".weight") ? 1.0f : 0.0f;
        for (size_t j = 0; j < p->numel; j++) w[j] = v;
        return;
    }
    /* Padded vocabulary rows stay zero: no token ever reads them. */
    size_t n = p->numel;
    if (!strcmp(p->name, "wte") || !strcmp(p->name, "lm_head.weight")) n = (size_t)m->cfg.vocab * (size_t)p->shape[1];
    float std = is_residual_projection(p->name) ? resid_std : 0.02f;
    uint64_t stream = nb_rng_stream_id(p->name);
    if (fill && fill->fn)
        fill->fn(fill->self, w, n, seed, stream, 0.0f, std);
    else
        nb_rng_fill_normal(w, n, seed, stream, 0.0f, std);
    if (n < p->numel) nb_zero_par(w + n, (p->numel - n) * sizeof(float));
}

/* The tensors of group g (every group: g < 0) into dst, which starts at slab offset g0 and holds
 * numel elements; what no tensor covers (alignment padding) is zeroed. */
static void init_span(const nb_tf_model *m, int g, float *dst, size_t g0, size_t numel, uint64_t seed,
                      const nb_tf_filler *fill) {
    size_t end = 0;
    int ascending = 1;
    for (int i = 0; i < m->nparams; i++)
        if (g < 0 || m->params[i].group == g) {
            ascending &= m->params[i].offset - g0 >= end;
            end = m->params[i].offset - g0 + m->params[i].numel;
        }
    if (!ascending) nb_zero_par(dst, numel * sizeof(float)); /* gaps unknown: zero all first */
    end = 0;
    for (int i = 0; i < m->nparams; i++) {
        const nb_param *p = &m->params[i];
        if (g >= 0 && p->group != g) continue;
        size_t off = p->offset - g0;
        if (ascending && off > end) nb_zero_par(dst + end, (off - end) * sizeof(float));
        init_param(m, p, dst + off, seed, fill);
        end = off + p->numel;
    }
    if (ascending && numel > end) nb_zero_par(dst + end, (numel - end) * sizeof(float));
}

void nb_tf_init_weights(const nb_tf_model *m, float *slab, uint64_t seed, const nb_tf_filler *fill) {
    init_span(m, -1, slab, 0, m->total, seed, fill);
}

void nb_tf_init_group(const nb_tf_model *m, int g, float *dst, uint64_t seed, const nb_tf_filler *fill) {
    init_span(m, g, dst, m->group_offset[g], m->group_numel[g], seed, fill);
}

void *nb_tf_param_ptr(const nb_tf_model *m, int i, void *slab, size_t es) {
    if (i < 0 || !slab) return NULL;
    return (char *)slab + m->params[i].offset * es;
}

void *nb_tf_global_ptr(const nb_tf_model *m, int which, void *slab, size_t es) {
    return nb_tf_param_ptr(m, m->global_idx[which], slab, es);
}

void nb_tf_bind_layer(const nb_tf_model *m, int layer, void *base, size_t es, nb_tf_layer_view *v) {
    size_t g0 = m->group_offset[1 + layer];
    for (int k = 0; k < NB_TF_LAYER_TENSORS; k++) {
        int i = m->layer_idx[layer][k];
        v->t[k] = (i < 0 || !base) ? NULL : (char *)base + (m->params[i].offset - g0) * es;
    }
    nb_tf_lora_bind(NULL, layer, NULL, es, v); /* the adapters are bound apart (nb_tf_lora_bind) */
}

/* ---------------------------------------------------------------- activations */

typedef struct {
    char *base, *cur;
} carver;

static void *carve(carver *cv, size_t bytes) {
    void *p = cv->cur;
    cv->cur += nb_align_up(bytes, NB_ALIGN);
    return cv->base ? p : NULL;
}

/* One routine both sizes and binds the activation slab, so the two can never disagree. */
/* The head's buffers and the backward scratch. Carved last and in this order, so that
 * nb_tf_layer_backward and nb_tf_head zero runs of the scratch with one memset each (zero_from). */
static void head_scratch_layout(const nb_tf_model *m, nb_tf_acts *o, carver *cv, size_t N, size_t es) {
    const nb_tf_config *c = &m->cfg;
    size_t C = (size_t)c->dim;
    o->lnf = carve(cv, N * C * es);
    o->lnf_mean = carve(cv, N * sizeof(float));
    o->lnf_rstd = carve(cv, N * sizeof(float));
    o->losses = carve(cv, N * sizeof(float));
    o->dres = carve(cv, N * C * es);
    o->dln = carve(cv, N * C * es);
    o->dqkv = carve(cv, N * (size_t)qkv_width(c) * es);
    o->datty = carve(cv, N * (size_t)att_width(c) * es);
    o->dfch = carve(cv, N * (size_t)fc_width(c) * es);
    o->dfca = carve(cv, N * (size_t)c->ffn * es);
    o->lt = o->ldu = NULL;
    if (!m->lora) return;
    o->lt = carve(cv, N * (size_t)nb_tf_lora_max_out(m) * es);
    o->ldu = carve(cv, N * (size_t)m->lora->r * es);
}

static void layer_acts_layout(const nb_tf_model *m, nb_tf_layer_acts *la, carver *cv, int B, int T, size_t es) {
    const nb_tf_config *c = &m->cfg;
    size_t N = (size_t)B * T, C = (size_t)c->dim;
    la->ln1 = carve(cv, N * C * es);
    la->qkv = carve(cv, N * (size_t)qkv_width(c) * es);
    la->atty = carve(cv, N * (size_t)att_width(c) * es);
    la->res2 = carve(cv, N * C * es);
    la->ln2 = carve(cv, N * C * es);
    la->fch = carve(cv, N * (size_t)fc_width(c) * es);
    la->fca = carve(cv, N * (size_t)c->ffn * es);
    la->ln1_mean = carve(cv, N * sizeof(float));
    la->ln1_rstd = carve(cv, N * sizeof(float));
    la->ln2_mean = carve(cv, N * sizeof(float));
    la->ln2_rstd = carve(cv, N * sizeof(float));
    la->lse = carve(cv, (size_t)B * c->heads * T * sizeof(float));
    for (int s = 0; s < NB_LORA_SITES; s++)
        la->lu[s] = m->lora && m->lora->idx[0][s][0] >= 0 ? carve(cv, N * (size_t)m->lora->r * es) : NULL;
    la->qk_in = la->qk_rstd = NULL;
    if (!c->qk_norm) return;
    size_t heads = N * (size_t)(c->heads + c->kv_heads);
    la->qk_in = carve(cv, heads * (size_t)c->head_size * es);
    la->qk_rstd = carve(cv, heads * sizeof(float));
}

static size_t acts_layout(const nb_tf_model *m, nb_tf_acts *a, void *buf, int B, int T, size_t es) {
    const nb_tf_config *c = &m->cfg;
    size_t N = (size_t)B * T, C = (size_t)c->dim, L = (size_t)c->layers;
    carver cv = {buf, buf};
    if (!buf) cv.base = NULL, cv.cur = (char *)0;
    void **resid = a ? a->resid : NULL;
    for (size_t l = 0; l <= L; l++) {
        void *p = carve(&cv, N * C * es);
        if (resid) resid[l] = p;
    }
    for (size_t l = 0; l < L; l++) {
        nb_tf_layer_acts tmp;
        layer_acts_layout(m, a ? &a->layer[l] : &tmp, &cv, B, T, es);
    }
    nb_tf_acts tmp, *o = a ? a : &tmp;
    head_scratch_layout(m, o, &cv, N, es);
    return (size_t)(cv.cur - cv.base);
}

size_t nb_tf_acts_bytes(const nb_tf_model *m, int B, int T, size_t es) { return acts_layout(m, NULL, NULL, B, T, es); }

/* Checkpointed layout: the last M layers (keep) have their own resid and activations; of the
 * first L - M, resid[l] has its own slot when l is a multiple of K, the other resid[l] share K-1
 * window slots and layer l's activations share K slots (l mod K), so a block of K layers can be
 * recomputed from its checkpoint. */
static size_t acts_layout_window(const nb_tf_model *m, nb_tf_acts *a, void *buf, int B, int T, size_t es, int K, int keep) {
    const nb_tf_config *c = &m->cfg;
    size_t N = (size_t)B * T, C = (size_t)c->dim;
    int L = c->layers, Lw = L - keep; /* layers in the recomputed part */
    carver cv = {buf, buf};
    if (!buf) cv.base = NULL, cv.cur = (char *)0;
    void *win[NB_TF_MAX_CKPT_INTERVAL];
    for (int k = 0; k + 1 < K && k + 1 < Lw; k++) win[k] = carve(&cv, N * C * es);
    for (int l = 0; l <= L; l++) {
        void *p = (l % K == 0 || l >= Lw) ? carve(&cv, N * C * es) : win[l % K - 1];
        if (a) a->resid[l] = p;
    }
    nb_tf_layer_acts slots[NB_TF_MAX_CKPT_INTERVAL];
    for (int k = 0; k < K && k < Lw; k++) layer_acts_layout(m, &slots[k], &cv, B, T, es);
    for (int l = 0; l < L; l++) {
        nb_tf_layer_acts own, *la = a ? &a->layer[l] : &own;
        if (l >= Lw)
            layer_acts_layout(m, la, &cv, B, T, es);
        else if (a)
            *la = slots[l % K];
    }
    nb_tf_acts tmp, *o = a ? a : &tmp;
    head_scratch_layout(m, o, &cv, N, es);
    return (size_t)(cv.cur - cv.base);
}

size_t nb_tf_acts_bytes_ckpt(const nb_tf_model *m, int B, int T, size_t es, int K, int keep) {
    return acts_layout_window(m, NULL, NULL, B, T, es, K, keep);
}

/* the activation table's empty shell; the layouts fill in the pointers */
static void acts_table(const nb_tf_model *m, nb_tf_acts *a, void *buf, int B, int T) {
    memset(a, 0, sizeof *a);
    a->B = B;
    a->T = T;
    a->slab = buf;
    a->resid = nb_calloc((size_t)m->cfg.layers + 1, sizeof(void *), "activation table");
    a->layer = nb_calloc((size_t)m->cfg.layers, sizeof(nb_tf_layer_acts), "activation table");
}

void nb_tf_acts_bind_ckpt(const nb_tf_model *m, nb_tf_acts *a, void *buf, int B, int T, size_t es, int K, int keep) {
    NB_ASSERT(K >= 1 && K <= NB_TF_MAX_CKPT_INTERVAL && keep >= 0 && keep <= m->cfg.layers);
    acts_table(m, a, buf, B, T);
    a->bytes = acts_layout_window(m, a, buf, B, T, es, K, keep);
}

void nb_tf_acts_bind(const nb_tf_model *m, nb_tf_acts *a, void *buf, int B, int T, size_t es) {
    acts_table(m, a, buf, B, T);
    a->bytes = acts_layout(m, a, buf, B, T, es);
}

size_t nb_tf_seg_scratch_bytes(const nb_tf_model *m, int B, int T, size_t es) {
    nb_tf_acts tmp;
    carver cv = {NULL, (char *)0};
    head_scratch_layout(m, &tmp, &cv, (size_t)B * T, es);
    return (size_t)(cv.cur - cv.base);
}

void nb_tf_seg_view(const nb_tf_model *m, const nb_tf_acts *shared, nb_tf_acts *view, void *buf, size_t es) {
    *view = *shared; /* the forward activations (resid, layer) are shared */
    view->slab = NULL; /* not the owner: nb_tf_acts_unbind must not run on a view */
    carver cv = {buf, buf};
    head_scratch_layout(m, view, &cv, (size_t)shared->B * shared->T, es);
}

void nb_tf_acts_unbind(nb_tf_acts *a) {
    free(a->resid);
    free(a->layer);
    memset(a, 0, sizeof *a);
}

/* ---------------------------------------------------------------- blocks */

static size_t act_es(const nb_backend_i *be) { return nb_dtype_size(be->act_dtype); }
static void *at(const void *p, size_t elems, size_t es) { return (char *)p + elems * es; }

void nb_tf_embed_forward(const nb_tf_model *m, const nb_backend_i *be, nb_ctx ctx, const void *wte,
                         const void *wpe, const int32_t *tokens, nb_tf_acts *a) {
    be->embed_fwd(ctx, a->resid[0], tokens, wte, m->cfg.arch == NB_ARCH_GPT2 ? wpe : NULL, a->B, a->T, m->cfg.dim,
                  m->cfg.vocab_padded);
}

void nb_tf_embed_backward(const nb_tf_model *m, const nb_backend_i *be, nb_ctx ctx, void *dwte, void *dwpe,
                          const int32_t *tokens, nb_tf_acts *a) {
    be->embed_bwd(ctx, dwte, m->cfg.arch == NB_ARCH_GPT2 ? dwpe : NULL, a->dres, tokens, a->B, a->T, m->cfg.dim,
                  m->cfg.vocab_padded);
}

static void norm_fwd(const nb_tf_model *m, const nb_backend_i *be, nb_ctx ctx, void *out, float *mean, float *rstd,
                     const void *x, const void *w, const void *b, int N) {
    if (m->cfg.arch == NB_ARCH_GPT2)
        be->layernorm_fwd(ctx, out, mean, rstd, x, w, b, N, m->cfg.dim, m->cfg.norm_eps);
    else
        be->rmsnorm_fwd(ctx, out, rstd, x, w, N, m->cfg.dim, m->cfg.norm_eps);
}

static void norm_bwd(const nb_tf_model *m, const nb_backend_i *be, nb_ctx ctx, void *dx, void *dw, void *db,
                     const void *dout, const void *x, const void *w, const float *mean, const float *rstd, int N) {
    if (m->cfg.arch == NB_ARCH_GPT2)
        be->layernorm_bwd(ctx, dx, dw, db, dout, x, w, mean, rstd, N, m->cfg.dim);
    else
        be->rmsnorm_bwd(ctx, dx, dw, dout, x, w, rstd, N, m->cfg.dim);
}

/* Qwen3's q_norm and k_norm: every q head, then every k head, of each qkv row normalized over the
 * head size with its own weight, in place (RoPE then rotates the normalized heads); qk_in keeps
 * the heads as they were, q heads first, for the backward. */
static void qk_norm_fwd(const nb_tf_model *m, const nb_backend_i *be, nb_ctx ctx, const nb_tf_layer_view *w,
                        nb_tf_layer_acts *s, int N) {
    const nb_tf_config *c = &m->cfg;
    int H = c->heads, hs = c->head_size, QKV = qkv_width(c);
    size_t es = act_es(be), nq = (size_t)N * H;
    be->headnorm_fwd(ctx, s->qkv, s->qk_in, s->qk_rstd, w->t[NB_TF_QNORM_W], N, H, hs, QKV, c->norm_eps);
    be->headnorm_fwd(ctx, at(s->qkv, (size_t)H * hs, es), at(s->qk_in, nq * hs, es), s->qk_rstd + nq,
                     w->t[NB_TF_KNORM_W], N, c->kv_heads, hs, QKV, c->norm_eps);
}

/* dqkv's q and k heads: d(normalized) in, d(projection) out, after RoPE's backward. */
static void qk_norm_bwd(const nb_tf_model *m, const nb_backend_i *be, nb_ctx ctx, const nb_tf_layer_view *w,
                        const nb_tf_layer_view *dw, const nb_tf_layer_acts *s, void *dqkv, int N) {
    const nb_tf_config *c = &m->cfg;
    int H = c->heads, hs = c->head_size, QKV = qkv_width(c);
    size_t es = act_es(be), nq = (size_t)N * H;
    be->headnorm_bwd(ctx, dqkv, dw->t[NB_TF_QNORM_W], s->qk_in, w->t[NB_TF_QNORM_W], s->qk_rstd, N, H, hs, QKV);
    be->headnorm_bwd(ctx, at(dqkv, (size_t)H * hs, es), dw->t[NB_TF_KNORM_W], at(s->qk_in, nq * hs, es),
                     w->t[NB_TF_KNORM_W], s->qk_rstd + nq, N, c->kv_heads, hs, QKV);
}

/* out = resid + inp @ w^T + bias: one fused op where the backend has it (issue 18), else the
 * projection and the residual add. */
static void proj_residual(const nb_backend_i *be, nb_ctx ctx, void *out, const void *inp, const void *w,
                          const void *bias, const void *resid, int N, int K, int C) {
    if (be->matmul_residual_fwd) {
        be->matmul_residual_fwd(ctx, out, inp, w, bias, resid, N, K, C);
        return;
    }
    be->matmul_fwd(ctx, out, inp, w, bias, N, K, C);
    be->residual_fwd(ctx, out, resid, out, (size_t)N * C);
}

void nb_tf_layer_forward(const nb_tf_model *m, const nb_backend_i *be, nb_ctx ctx, const nb_tf_layer_view *w,
                         int l, nb_tf_acts *a) {
    const nb_tf_config *c = &m->cfg;
    nb_tf_layer_acts *s = &a->layer[l];
    int B = a->B, T = a->T, N = B * T, C = c->dim, QKV = qkv_width(c), A = att_width(c);
    const void *x = a->resid[l];
    void *out = a->resid[l + 1];

    norm_fwd(m, be, ctx, s->ln1, s->ln1_mean, s->ln1_rstd, x, w->t[NB_TF_LN1_W], w->t[NB_TF_LN1_B], N);
    be->matmul_fwd(ctx, s->qkv, s->ln1, w->t[NB_TF_QKV_W], w->t[NB_TF_QKV_B], N, C, QKV);
    for (int k = NB_LORA_Q; k <= NB_LORA_V; k++) nb_tf_lora_forward(m, be, ctx, w, k, s, a, s->ln1, s->qkv);
    if (c->qk_norm) qk_norm_fwd(m, be, ctx, w, s, N);
    if (c->arch == NB_ARCH_LLAMA) {
        /* q and k are rotated in place: attention and its backward both see the rotated values.
         * The k heads follow the q heads in each row, so one call over heads + kv_heads rotates
         * both, each head by the same angles */
        nb_rope rope = nb_tf_rope(c);
        be->rope_fwd(ctx, s->qkv, B, T, c->heads + c->kv_heads, c->head_size, QKV, &rope);
    }
    be->attention_fwd(ctx, s->atty, s->lse, s->qkv, B, T, c->heads, c->kv_heads, c->head_size);
    proj_residual(be, ctx, s->res2, s->atty, w->t[NB_TF_PROJ_W], w->t[NB_TF_PROJ_B], x, N, A, C);
    nb_tf_lora_forward(m, be, ctx, w, NB_LORA_O, s, a, s->atty, s->res2);

    norm_fwd(m, be, ctx, s->ln2, s->ln2_mean, s->ln2_rstd, s->res2, w->t[NB_TF_LN2_W], w->t[NB_TF_LN2_B], N);
    if (c->arch == NB_ARCH_GPT2 && !w->la[NB_LORA_UP]) {
        be->matmul_gelu_fwd(ctx, s->fca, s->fch, s->ln2, w->t[NB_TF_FC_W], w->t[NB_TF_FC_B], N, C, c->ffn);
    } else {
        /* an adapted c_fc adds its branch before the GELU: the fused GEMM epilogue cannot */
        be->matmul_fwd(ctx, s->fch, s->ln2, w->t[NB_TF_FC_W], w->t[NB_TF_FC_B], N, C, fc_width(c));
        for (int k = NB_LORA_GATE; k <= NB_LORA_UP; k++) nb_tf_lora_forward(m, be, ctx, w, k, s, a, s->ln2, s->fch);
        if (c->arch == NB_ARCH_GPT2)
            be->gelu_fwd(ctx, s->fca, s->fch, (size_t)N * c->ffn);
        else
            be->swiglu_fwd(ctx, s->fca, s->fch, N, c->ffn);
    }
    proj_residual(be, ctx, out, s->fca, w->t[NB_TF_FCPROJ_W], w->t[NB_TF_FCPROJ_B], s->res2, N, c->ffn, C);
    nb_tf_lora_forward(m, be, ctx, w, NB_LORA_DOWN, s, a, s->fca, out);
}

/* Zeroes the backward scratch from p (one of dres, dln) to the end of `last` (of `bytes`), in one
 * launch instead of one per buffer: the buffers lie in carve order dres, dln, dqkv, datty, dfch,
 * dfca (acts_layout); the alignment gaps between them are unused. */
static void zero_from(const nb_backend_i *be, nb_ctx ctx, const nb_tf_acts *a, void *p, const void *last,
                      size_t bytes) {
    const char *c[6] = {a->dres, a->dln, a->dqkv, a->datty, a->dfch, a->dfca};
    for (int i = 0; i < 5; i++) NB_ASSERT(c[i] < c[i + 1]);
    NB_ASSERT((const char *)p <= (const char *)last);
    be->zero(ctx, p, (size_t)((const char *)last - (const char *)p) + bytes);
}

/* ---- issue 18: the layer backward through ops that WRITE their activation gradients ----
 * Taken when the backend offers every _set op (CUDA bf16): each of dfca, dfch, dln, datty and
 * dqkv is written by the op that produces it (gpt2: the GELU backward rides on the fc-proj
 * GEMM's epilogue, and dfca is never formed), so none is zeroed first and no GEMM reads it back.
 * The same gradients as the accumulating path below (the same math; bf16 rounds once less where
 * the GELU derivative is fused). dres still accumulates (the skip connection's sum). */
static int writes_grads(const nb_tf_model *m, const nb_backend_i *be) {
    /* LoRA's branches add their input gradients to dfca, dln and datty: the accumulating path */
    if (!be->matmul_bwd_set || !be->attention_bwd_set || m->lora) return 0;
    return m->cfg.arch == NB_ARCH_GPT2 ? be->matmul_dgelu_bwd != NULL : be->swiglu_bwd_set != NULL;
}

static void layer_backward_set(const nb_tf_model *m, const nb_backend_i *be, nb_ctx ctx, const nb_tf_layer_view *w,
                               const nb_tf_layer_view *dw, int l, nb_tf_acts *a) {
    const nb_tf_config *c = &m->cfg;
    const nb_tf_layer_acts *s = &a->layer[l];
    int B = a->B, T = a->T, N = B * T, C = c->dim, QKV = qkv_width(c), A = att_width(c), FC = fc_width(c);
    const void *x = a->resid[l];

    /* MLP branch: dres is d(out) */
    if (c->arch == NB_ARCH_GPT2) {
        be->matmul_dgelu_bwd(ctx, a->dfch, dw->t[NB_TF_FCPROJ_W], dw->t[NB_TF_FCPROJ_B], dw->t[NB_TF_FC_B], a->dres,
                             s->fca, w->t[NB_TF_FCPROJ_W], s->fch, N, c->ffn, C);
        be->matmul_bwd_set(ctx, a->dln, dw->t[NB_TF_FC_W], NULL, a->dfch, s->ln2, w->t[NB_TF_FC_W], N, C, FC);
    } else {
        be->matmul_bwd_set(ctx, a->dfca, dw->t[NB_TF_FCPROJ_W], dw->t[NB_TF_FCPROJ_B], a->dres, s->fca,
                           w->t[NB_TF_FCPROJ_W], N, c->ffn, C);
        be->swiglu_bwd_set(ctx, a->dfch, a->dfca, s->fch, N, c->ffn);
        be->matmul_bwd_set(ctx, a->dln, dw->t[NB_TF_FC_W], dw->t[NB_TF_FC_B], a->dfch, s->ln2, w->t[NB_TF_FC_W], N, C,
                           FC);
    }
    norm_bwd(m, be, ctx, a->dres, dw->t[NB_TF_LN2_W], dw->t[NB_TF_LN2_B], a->dln, s->res2, w->t[NB_TF_LN2_W],
             s->ln2_mean, s->ln2_rstd, N);

    /* attention branch: dres is now d(res2) */
    be->matmul_bwd_set(ctx, a->datty, dw->t[NB_TF_PROJ_W], dw->t[NB_TF_PROJ_B], a->dres, s->atty, w->t[NB_TF_PROJ_W], N,
                       A, C);
    be->attention_bwd_set(ctx, a->dqkv, a->datty, s->qkv, s->atty, s->lse, B, T, c->heads, c->kv_heads,
                          c->head_size);
    if (c->arch == NB_ARCH_LLAMA) {
        nb_rope rope = nb_tf_rope(c);
        be->rope_bwd(ctx, a->dqkv, B, T, c->heads + c->kv_heads, c->head_size, QKV, &rope); /* q and k */
    }
    if (c->qk_norm) qk_norm_bwd(m, be, ctx, w, dw, s, a->dqkv, N);
    be->matmul_bwd_set(ctx, a->dln, dw->t[NB_TF_QKV_W], dw->t[NB_TF_QKV_B], a->dqkv, s->ln1, w->t[NB_TF_QKV_W], N, C,
                       QKV);
    norm_bwd(m, be, ctx, a->dres, dw->t[NB_TF_LN1_W], dw->t[NB_TF_LN1_B], a->dln, x, w->t[NB_TF_LN1_W], s->ln1_mean,
             s->ln1_rstd, N);
}

void nb_tf_layer_backward(const nb_tf_model *m, const nb_backend_i *be, nb_ctx ctx, const nb_tf_layer_view *w,
                          const nb_tf_layer_view *dw, int l, nb_tf_acts *a) {
    if (writes_grads(m, be)) {
        layer_backward_set(m, be, ctx, w, dw, l, a);
        return;
    }
    const nb_tf_config *c = &m->cfg;
    const nb_tf_layer_acts *s = &a->layer[l];
    int B = a->B, T = a->T, N = B * T, C = c->dim, QKV = qkv_width(c), A = att_width(c), FC = fc_width(c);
    size_t es = act_es(be);
    const void *x = a->resid[l];

    /* The ops below accumulate into dfca, dfch, dln, datty and dqkv, each starting from zero:
     * one memset here for all five; dln, the only one used twice, is zeroed again before its
     * second use. */
    zero_from(be, ctx, a, a->dln, a->dfca, (size_t)N * c->ffn * es);

    /* MLP branch: dres is d(out) = d(res2 through the skip) + d(mlp output) */
    be->matmul_bwd(ctx, a->dfca, dw->t[NB_TF_FCPROJ_W], dw->t[NB_TF_FCPROJ_B], a->dres, s->fca, w->t[NB_TF_FCPROJ_W],
                   N, c->ffn, C);
    nb_tf_lora_backward(m, be, ctx, w, dw, NB_LORA_DOWN, s, a, s->fca, a->dfca, a->dres);
    if (c->arch == NB_ARCH_GPT2)
        be->gelu_bwd(ctx, a->dfch, s->fch, a->dfca, (size_t)N * c->ffn);
    else
        be->swiglu_bwd(ctx, a->dfch, a->dfca, s->fch, N, c->ffn);
    be->matmul_bwd(ctx, a->dln, dw->t[NB_TF_FC_W], dw->t[NB_TF_FC_B], a->dfch, s->ln2, w->t[NB_TF_FC_W], N, C, FC);
    for (int k = NB_LORA_GATE; k <= NB_LORA_UP; k++) nb_tf_lora_backward(m, be, ctx, w, dw, k, s, a, s->ln2, a->dln, a->dfch);
    norm_bwd(m, be, ctx, a->dres, dw->t[NB_TF_LN2_W], dw->t[NB_TF_LN2_B], a->dln, s->res2, w->t[NB_TF_LN2_W],
             s->ln2_mean, s->ln2_rstd, N);

    /* attention branch: dres is now d(res2) */
    be->matmul_bwd(ctx, a->datty, dw->t[NB_TF_PROJ_W], dw->t[NB_TF_PROJ_B], a->dres, s->atty, w->t[NB_TF_PROJ_W], N,
                   A, C);
    nb_tf_lora_backward(m, be, ctx, w, dw, NB_LORA_O, s, a, s->atty, a->datty, a->dres);
    be->attention_bwd(ctx, a->dqkv, a->datty, s->qkv, s->atty, s->lse, B, T, c->heads, c->kv_heads, c->head_size);
    if (c->arch == NB_ARCH_LLAMA) {
        nb_rope rope = nb_tf_rope(c);
        be->rope_bwd(ctx, a->dqkv, B, T, c->heads + c->kv_heads, c->head_size, QKV, &rope); /* q and k */
    }
    if (c->qk_norm) qk_norm_bwd(m, be, ctx, w, dw, s, a->dqkv, N);
    be->zero(ctx, a->dln, (size_t)N * C * es);
    be->matmul_bwd(ctx, a->dln, dw->t[NB_TF_QKV_W], dw->t[NB_TF_QKV_B], a->dqkv, s->ln1, w->t[NB_TF_QKV_W], N, C, QKV);
    for (int k = NB_LORA_Q; k <= NB_LORA_V; k++) nb_tf_lora_backward(m, be, ctx, w, dw, k, s, a, s->ln1, a->dln, a->dqkv);
    norm_bwd(m, be, ctx, a->dres, dw->t[NB_TF_LN1_W], dw->t[NB_TF_LN1_B], a->dln, x, w->t[NB_TF_LN1_W], s->ln1_mean,
             s->ln1_rstd, N);
}

void nb_tf_head(const nb_tf_model *m, const nb_backend_i *be, nb_ctx ctx, const void *lnf_w, const void *lnf_b,
                const void *head, int layer_out, const int32_t *targets, int backward, float grad_scale,
                const float *scale_by, void *dlnf_w, void *dlnf_b, void *dhead, nb_tf_acts *a) {
    const nb_tf_config *c = &m->cfg;
    int N = a->B * a->T, C = c->dim;
    size_t es = act_es(be);
    const void *x = a->resid[layer_out];
    norm_fwd(m, be, ctx, a->lnf, a->lnf_mean, a->lnf_rstd, x, lnf_w, lnf_b, N);
    if (!backward) {
        be->xent_fwd_bwd(ctx, NULL, NULL, a->losses, a->lnf, head, targets, N, C, c->vocab, c->vocab_padded, grad_scale,
                         scale_by);
        return;
    }
    zero_from(be, ctx, a, a->dres, a->dln, (size_t)N * C * es); /* dres and dln: both accumulate */
    be->xent_fwd_bwd(ctx, a->dln, dhead, a->losses, a->lnf, head, targets, N, C, c->vocab, c->vocab_padded, grad_scale,
                     scale_by);
    norm_bwd(m, be, ctx, a->dres, dlnf_w, dlnf_b, a->dln, x, lnf_w, a->lnf_mean, a->lnf_rstd, N);
}

void nb_tf_logits_last(const nb_tf_model *m, const nb_backend_i *be, nb_ctx ctx, const void *lnf_w, const void *lnf_b,
                       const void *head, int layer_out, nb_tf_acts *a, void *logits) {
    int N = a->B * a->T, C = m->cfg.dim;
    norm_fwd(m, be, ctx, a->lnf, a->lnf_mean, a->lnf_rstd, a->resid[layer_out], lnf_w, lnf_b, N);
    be->matmul_fwd(ctx, logits, at(a->lnf, (size_t)(N - 1) * C, act_es(be)), head, NULL, 1, C, m->cfg.vocab);
}

double nb_tf_recompute_flops_per_token(const nb_tf_model *m, int T, int K, int keep) {
    const nb_tf_config *c = &m->cfg;
    int L = c->layers - keep; /* the recomputed part */
    if (K <= 0 || L <= 0) return 0.0;
    int last = L - (L - 1) / K * K; /* layers in its last block */
    double C = c->dim;
    double per_layer = C * qkv_width(c) + (double)att_width(c) * C + C * fc_width(c) + (double)c->ffn * C;
    return (double)(L - last) * (2.0 * per_layer + 4.0 * (double)att_width(c) * T);
}

double nb_tf_flops_per_token(const nb_tf_model *m, int T) {
    const nb_tf_config *c = &m->cfg;
    double C = c->dim, L = c->layers;
    double per_layer = C * qkv_width(c) + (double)att_width(c) * C + C * fc_width(c) + (double)c->ffn * C;
    double matmul_params = L * per_layer + (double)c->vocab * C;
    /* 6 per matmul weight per token (fwd 2, bwd 4) + attention scores and values (fwd 4*T*C per
     * layer, x3 for training; counted without the causal halving, as in the PaLM paper). LoRA: a
     * frozen weight has no weight-gradient GEMM (fwd 2, bwd 2), its adapters the full 6 */
    double per_weight = m->lora ? 4.0 : 6.0, adapters = m->lora ? (double)m->lora->n_real : 0.0;
    return per_weight * matmul_params + 6.0 * adapters + 12.0 * L * (double)att_width(c) * T;
}
