/* LoRA's math on the CPU backend (model/transformer_lora.c), for both layouts with every target:
 *  - a zero B gives the base model's per-token losses, bit for bit (the branch adds exact zeros);
 *  - the gradients of A and B (the base frozen: no gradient asked) against central finite
 *    differences of the mean loss;
 *  - merging scale * B A into the base weights gives the LoRA model's losses (export --merge);
 *  - the seeded init group by group (stream's LoRA loads its base so) is the whole init's bits,
 *    and the groups tile the slab (their chained CRC-32C is the slab's). */
#include <omp.h>
#include <string.h>

#include "check.h"
#include "core.h"
#include "model/transformer.h"
#include "ops/backend.h"
#include "rng.h"

typedef struct {
    nb_tf_model m;
    nb_tf_lora lo;
    int B, T, use_lora;
    float *w, *lw, *lg; /* base, adapters, adapter gradients */
    void *acts_buf;
    nb_tf_acts acts;
    int32_t tok[64], tgt[64];
    nb_task_ctx ctx;
} rig;

/* variant 1 of the Llama layout: Qwen3's q/k norm with a head size of its own, and Qwen2's qkv bias */
static int qwen_variant;

static void rig_init(rig *r, nb_arch arch, unsigned sites) {
    memset(r, 0, sizeof *r);
    nb_tf_config c = {0};
    snprintf(c.preset, sizeof c.preset, "lora-test");
    c.arch = arch, c.layers = 2, c.dim = 16, c.heads = 4, c.kv_heads = arch == NB_ARCH_GPT2 ? 4 : 2;
    c.ffn = 24, c.vocab = 61, c.seq = 8, c.norm_eps = 1e-5f, c.rope_theta = 10000.0f, c.tied = arch == NB_ARCH_GPT2;
    if (qwen_variant) c.qk_norm = 1, c.qkv_bias = 1, c.head_dim = 6;
    nb_tf_config_finalize(&c);
    nb_tf_model_init(&r->m, &c);
    nb_tf_lora_init(&r->lo, &c, 3, 6.0f, sites);
    r->B = 2, r->T = 8;
    r->w = nb_malloc(r->m.total * sizeof(float), "base");
    nb_tf_init_weights(&r->m, r->w, 7, NULL);
    for (size_t i = 0; i < r->m.total; i++) r->w[i] *= 8.0f; /* larger than GPT-2's 0.02: gradients well above rounding */
    for (int i = 0; i < r->m.nparams; i++) /* norm weights back near 1 */
        if (r->m.params[i].ndim == 1)
            for (size_t k = 0; k < r->m.params[i].numel; k++) r->w[r->m.params[i].offset + k] = 1.0f + 0.1f * (float)(k % 3);
    r->lw = nb_malloc(r->lo.total * sizeof(float), "adapters");
    r->lg = nb_malloc(r->lo.total * sizeof(float), "adapter gradients");
    nb_tf_lora_init_weights(&r->lo, r->lw, 11);
    r->m.lora = &r->lo;
    size_t bytes = nb_tf_acts_bytes(&r->m, r->B, r->T, sizeof(float));
    r->acts_buf = nb_malloc(bytes, "activations");
    nb_tf_acts_bind(&r->m, &r->acts, r->acts_buf, r->B, r->T, sizeof(float));
    for (int i = 0; i < r->B * r->T; i++) r->tok[i] = (i * 7 + 3) % c.vocab, r->tgt[i] = (i * 5 + 1) % c.vocab;
}

static void rig_free(rig *r) {
    nb_tf_acts_unbind(&r->acts);
    free(r->w), free(r->lw), free(r->lg), free(r->acts_buf);
    nb_tf_lora_free(&r->lo);
    nb_tf_model_free(&r->m);
}

/* B random (a zero B has no gradient for A to check) */
static void randomize_b(rig *r) {
    for (int i = 0; i < r->lo.nparams; i++) {
        const nb_param *p = &r->lo.params[i];
        if (p->name[strlen(p->name) - 1] == 'B') nb_rng_fill_normal(r->lw + p->offset, p->numel, 13, (uint64_t)i, 0.0f, 0.3f);
    }
}

static void *gp(const rig *r, int which) { return nb_tf_global_ptr(&r->m, which, r->w, sizeof(float)); }

/* Mean loss (and, with backward, the adapters' gradients into r->lg); losses of each token into
 * out (NULL: not wanted). use_lora 0 runs the model without adapters. */
static double run(rig *r, int backward, float *out) {
    const nb_backend_i *be = &nb_backend_cpu;
    nb_tf_model *m = &r->m;
    m->lora = r->use_lora ? &r->lo : NULL;
    int L = m->cfg.layers, N = r->B * r->T, head = m->cfg.tied ? NB_TF_WTE : NB_TF_LM_HEAD;
    nb_tf_layer_view w, dw;
    memset(r->lg, 0, r->lo.total * sizeof(float));
    nb_tf_embed_forward(m, be, &r->ctx, gp(r, NB_TF_WTE), gp(r, NB_TF_WPE), r->tok, &r->acts);
    for (int l = 0; l < L; l++) {
        nb_tf_bind_layer(m, l, (char *)r->w + m->group_offset[1 + l] * sizeof(float), sizeof(float), &w);
        nb_tf_lora_bind(m->lora, l, r->lw, sizeof(float), &w);
        nb_tf_layer_forward(m, be, &r->ctx, &w, l, &r->acts);
    }
    nb_tf_head(m, be, &r->ctx, gp(r, NB_TF_LNF_W), gp(r, NB_TF_LNF_B), gp(r, head), L, r->tgt, backward, 1.0f / (float)N,
               NULL, NULL, NULL, NULL, &r->acts);
    double s = 0;
    for (int i = 0; i < N; i++) s += r->acts.losses[i];
    if (out) memcpy(out, r->acts.losses, (size_t)N * sizeof(float));
    for (int l = L - 1; backward && l >= 0; l--) {
        nb_tf_bind_layer(m, l, (char *)r->w + m->group_offset[1 + l] * sizeof(float), sizeof(float), &w);
        nb_tf_lora_bind(m->lora, l, r->lw, sizeof(float), &w);
        nb_tf_bind_layer(m, l, NULL, sizeof(float), &dw); /* the base is frozen */
        nb_tf_lora_bind(m->lora, l, r->lg, sizeof(float), &dw);
        nb_tf_layer_backward(m, be, &r->ctx, &w, &dw, l, &r->acts);
    }
    m->lora = &r->lo;
    return s / N;
}

static const unsigned ALL = (1u << NB_LORA_SITES) - 1;

/* A check over both layouts with every target, and over llama's with Qwen's extras (q/k norm,
 * head_dim 6, qkv bias). */
typedef void (*layout_check)(nb_arch arch, unsigned sites, const char *what);

static void on_each_layout(layout_check check) {
    check(NB_ARCH_LLAMA, ALL, "llama, every target");
    check(NB_ARCH_GPT2, nb_tf_lora_parse_targets("q,k,v,o,up,down", NB_ARCH_GPT2), "gpt2, every target");
    qwen_variant = 1;
    check(NB_ARCH_LLAMA, ALL, "llama with q/k norm, head_dim 6 and qkv bias (Qwen), every target");
    qwen_variant = 0;
}

static void zero_b_is_base(nb_arch arch, unsigned sites, const char *what) {
    rig r;
    rig_init(&r, arch, sites);
    float base[64], lora[64];
    r.use_lora = 0;
    run(&r, 0, base);
    r.use_lora = 1;
    run(&r, 0, lora);
    CHECK(!memcmp(base, lora, sizeof(float) * (size_t)(r.B * r.T)), "%s: zero B changes the losses", what);
    rig_free(&r);
}

TEST_CASE(zero_b_gives_base_losses) { on_each_layout(zero_b_is_base); }

static void grads_vs_fd(nb_arch arch, unsigned sites, const char *what) {
    rig r;
    rig_init(&r, arch, sites);
    randomize_b(&r);
    r.use_lora = 1;
    run(&r, 1, NULL);
    float *g = nb_malloc(r.lo.total * sizeof(float), "gradients");
    memcpy(g, r.lg, r.lo.total * sizeof(float));
    /* three elements of every tensor: first, middle, last */
    double num = 0, den = 0, worst = 0;
    const float h = 1e-2f;
    for (int i = 0; i < r.lo.nparams; i++) {
        const nb_param *p = &r.lo.params[i];
        size_t pick[3] = {0, p->numel / 2, p->numel - 1};
        for (int k = 0; k < 3; k++) {
            float *x = r.lw + p->offset + pick[k], x0 = *x;
            *x = x0 + h;
            double up = run(&r, 0, NULL);
            *x = x0 - h;
            double dn = run(&r, 0, NULL);
            *x = x0;
            double fd = (up - dn) / (2.0 * h), an = g[p->offset + pick[k]], d = fd - an;
            num += d * d, den += an * an;
            double e = fabs(d) / (fabs(an) + 1e-3);
            if (e > worst) worst = e;
        }
    }
    double rel = sqrt(num) / sqrt(den);
    CHECK(den > 1e-8, "%s: the adapters' gradients vanish", what);
    CHECK(rel < 1e-2, "%s: gradients vs finite differences: relative error %.3g", what, rel);
    printf("  %s: adapters' gradients vs central differences: relative error %.2g (worst element %.2g)\n", what, rel, worst);
    free(g);
    rig_free(&r);
}

TEST_CASE(adapter_grads_vs_finite_differences) { on_each_layout(grads_vs_fd); }

static void merge_matches(nb_arch arch, unsigned sites, const char *what) {
    rig r;
    rig_init(&r, arch, sites);
    randomize_b(&r);
    float lora[64], merged[64];
    r.use_lora = 1;
    run(&r, 0, lora);
    nb_tf_lora_merge(&r.m, &r.lo, r.w, r.lw);
    r.use_lora = 0;
    run(&r, 0, merged);
    CHECK(rel_err(merged, lora, (size_t)(r.B * r.T)) < 1e-5, "%s: merged model's losses differ: %.3g", what,
          rel_err(merged, lora, (size_t)(r.B * r.T)));
    rig_free(&r);
}

TEST_CASE(merge_gives_lora_losses) { on_each_layout(merge_matches); }

static void groups_match(nb_arch arch, unsigned sites, const char *what) {
    rig r;
    rig_init(&r, arch, sites);
    nb_tf_init_weights(&r.m, r.w, 1337, NULL);
    float *g = nb_malloc(r.m.total * sizeof(float), "group");
    size_t at = 0;
    int same = 1;
    for (int k = 0; k < r.m.ngroups; k++) {
        same &= r.m.group_offset[k] == at;
        nb_tf_init_group(&r.m, k, g, 1337, NULL);
        same &= !memcmp(g, r.w + at, r.m.group_numel[k] * sizeof(float));
        at += r.m.group_numel[k];
    }
    CHECK(same && at == r.m.total, "%s: %d groups drawn one by one give the whole init's bits", what, r.m.ngroups);
    free(g);
    rig_free(&r);
}

TEST_CASE(init_by_groups_is_the_whole_init) { on_each_layout(groups_match); }

int main(void) {
    omp_set_num_threads(1); /* shapes of a few hundred elements: threads only add their wake-ups */
    RUN(zero_b_gives_base_losses);
    RUN(adapter_grads_vs_finite_differences);
    RUN(merge_gives_lora_losses);
    RUN(init_by_groups_is_the_whole_init);
    return nb_test_failures ? 1 : 0;
}
