/* LoRA adapters of a transformer (transformer.h): their table and slab, PEFT's init, and the
 * low-rank branch's forward and backward through the backend's ops (matmul_fwd, matmul_bwd and
 * scale_cols), so every backend that runs the model runs its adapters. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "model/transformer.h"
#include "rng.h"

static const char *const site_names[NB_LORA_SITES] = {"q", "k", "v", "o", "gate", "up", "down"};

int nb_tf_lora_site(const nb_tf_config *c, int s, nb_lora_site *g) {
    int hs = c->head_size, H = c->heads, KV = c->kv_heads, C = c->dim, F = c->ffn;
    int QKV = (H + 2 * KV) * hs, A = H * hs;
    if (c->arch == NB_ARCH_GPT2) {
        switch (s) {
        case NB_LORA_Q: *g = (nb_lora_site){NB_TF_QKV_W, C, QKV, 0, QKV}; return 1; /* c_attn: q, k and v */
        case NB_LORA_O: *g = (nb_lora_site){NB_TF_PROJ_W, A, C, 0, C}; return 1;
        case NB_LORA_UP: *g = (nb_lora_site){NB_TF_FC_W, C, F, 0, F}; return 1;
        case NB_LORA_DOWN: *g = (nb_lora_site){NB_TF_FCPROJ_W, F, C, 0, C}; return 1;
        default: return 0;
        }
    }
    switch (s) {
    case NB_LORA_Q: *g = (nb_lora_site){NB_TF_QKV_W, C, H * hs, 0, QKV}; return 1;
    case NB_LORA_K: *g = (nb_lora_site){NB_TF_QKV_W, C, KV * hs, H * hs, QKV}; return 1;
    case NB_LORA_V: *g = (nb_lora_site){NB_TF_QKV_W, C, KV * hs, (H + KV) * hs, QKV}; return 1;
    case NB_LORA_O: *g = (nb_lora_site){NB_TF_PROJ_W, A, C, 0, C}; return 1;
    case NB_LORA_GATE: *g = (nb_lora_site){NB_TF_FC_W, C, F, 0, 2 * F}; return 1; /* gate rows first */
    case NB_LORA_UP: *g = (nb_lora_site){NB_TF_FC_W, C, F, F, 2 * F}; return 1;
    case NB_LORA_DOWN: *g = (nb_lora_site){NB_TF_FCPROJ_W, F, C, 0, C}; return 1;
    default: return 0;
    }
}

const char *nb_tf_lora_hf_module(nb_arch arch, int s, const char **parent) {
    static const char *const llama[NB_LORA_SITES] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
    static const char *const gpt2[NB_LORA_SITES] = {"c_attn", NULL, NULL, "c_proj", NULL, "c_fc", "c_proj"};
    int attn = s <= NB_LORA_O;
    if (arch == NB_ARCH_GPT2) {
        if (parent) *parent = attn ? "attn" : "mlp";
        return gpt2[s];
    }
    if (parent) *parent = attn ? "self_attn" : "mlp";
    return llama[s];
}

/* GPT-2's c_attn is one matrix: q, k and v are adapted together or not at all. */
unsigned nb_tf_lora_parse_targets(const char *list, nb_arch arch) {
    const char *hint = "pass --lora-targets as a comma-separated subset of q,k,v,o,gate,up,down";
    unsigned sites = 0;
    char buf[256];
    NB_CHECK(strlen(list) < sizeof buf, hint, "--lora-targets '%s' is too long", list);
    snprintf(buf, sizeof buf, "%s", list);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int s = 0;
        while (s < NB_LORA_SITES && strcmp(site_names[s], t) != 0) s++;
        NB_CHECK(s < NB_LORA_SITES, hint, "--lora-targets: unknown target '%s'", t);
        sites |= 1u << s;
    }
    NB_CHECK(sites, hint, "--lora-targets '%s' names no target", list);
    if (arch != NB_ARCH_GPT2) return sites;
    unsigned qkv = 1u << NB_LORA_Q | 1u << NB_LORA_K | 1u << NB_LORA_V;
    NB_CHECK(!(sites & qkv) || (sites & qkv) == qkv, "GPT-2 fuses q, k and v in one matrix (c_attn): name all three or none",
             "--lora-targets '%s' names part of q,k,v on a GPT-2 layout", list);
    NB_CHECK(!(sites & 1u << NB_LORA_GATE), "GPT-2 layouts have no gate projection: drop 'gate' (up is c_fc, down mlp.c_proj)",
             "--lora-targets '%s' on a GPT-2 layout", list);
    return sites & ~(1u << NB_LORA_K | 1u << NB_LORA_V); /* c_attn is site q */
}

void nb_tf_lora_targets_str(unsigned sites, nb_arch arch, char *out, size_t cap) {
    size_t n = 0;
    out[0] = 0;
    if (arch == NB_ARCH_GPT2 && sites & 1u << NB_LORA_Q) sites |= 1u << NB_LORA_K | 1u << NB_LORA_V; /* c_attn */
    for (int s = 0; s < NB_LORA_SITES; s++)
        if (sites & 1u << s) n += (size_t)snprintf(out + n, n < cap ? cap - n : 0, "%s%s", n ? "," : "", site_names[s]);
}

void nb_tf_lora_init(nb_tf_lora *lo, const nb_tf_config *c, int r, float alpha, unsigned sites) {
    memset(lo, 0, sizeof *lo);
    lo->r = r, lo->alpha = alpha, lo->scale = alpha / (float)r, lo->sites = sites;
    int L = c->layers;
    lo->params = nb_calloc((size_t)L * NB_LORA_SITES * 2 + 1, sizeof *lo->params, "LoRA table");
    lo->idx = nb_calloc((size_t)(L ? L : 1), sizeof *lo->idx, "LoRA table");
    lo->ngroups = L + 2;
    lo->group_offset = nb_calloc((size_t)lo->ngroups, sizeof(size_t), "LoRA groups");
    lo->group_numel = nb_calloc((size_t)lo->ngroups, sizeof(size_t), "LoRA groups");
    for (int l = 0; l < L; l++) {
        lo->group_offset[1 + l] = lo->total;
        for (int s = 0; s < NB_LORA_SITES; s++) {
            nb_lora_site g;
            lo->idx[l][s][0] = lo->idx[l][s][1] = -1;
            if (!(sites & 1u << s) || !nb_tf_lora_site(c, s, &g)) continue;
            for (int ab = 0; ab < 2; ab++) {
                nb_param *p = &lo->params[lo->nparams];
                snprintf(p->name, sizeof p->name, "layers.%d.lora.%s.%s", l, site_names[s], ab ? "B" : "A");
                p->group = 1 + l, p->ndim = 2, p->decay = 1;
                p->shape[0] = ab ? g.OC : r, p->shape[1] = ab ? r : g.K;
                p->numel = (size_t)p->shape[0] * (size_t)p->shape[1];
                p->offset = lo->total;
                lo->total += nb_align_up(p->numel, NB_ALIGN / sizeof(float));
                lo->n_real += p->numel;
                lo->idx[l][s][ab] = lo->nparams++;
            }
        }
        lo->group_numel[1 + l] = lo->total - lo->group_offset[1 + l];
    }
    lo->group_offset[L + 1] = lo->total;
}

void nb_tf_lora_free(nb_tf_lora *lo) {
    free(lo->params), free(lo->idx), free(lo->group_offset), free(lo->group_numel);
    memset(lo, 0, sizeof *lo);
}

void nb_tf_lora_init_weights(const nb_tf_lora *lo, float *slab, uint64_t seed) {
    nb_zero_par(slab, lo->total * sizeof(float));
    for (int i = 0; i < lo->nparams; i++) {
        const nb_param *p = &lo->params[i];
        if (p->name[strlen(p->name) - 1] != 'A') continue; /* B starts at zero: the branch adds nothing at step 0 */
        float bound = 1.0f / sqrtf((float)p->shape[1]);
        nb_rng_fill_uniform(slab + p->offset, p->numel, seed, nb_rng_stream_id(p->name), -bound, bound);
    }
}

void nb_tf_lora_bind(const nb_tf_lora *lo, int l, void *slab, size_t es, nb_tf_layer_view *v) {
    for (int s = 0; s < NB_LORA_SITES; s++) {
        int a = lo && slab ? lo->idx[l][s][0] : -1, b = lo && slab ? lo->idx[l][s][1] : -1;
        v->la[s] = a < 0 ? NULL : (char *)slab + lo->params[a].offset * es;
        v->lb[s] = b < 0 ? NULL : (char *)slab + lo->params[b].offset * es;
    }
}

int nb_tf_lora_max_out(const nb_tf_model *m) {
    int w = 0;
    nb_lora_site g;
    for (int s = 0; m->lora && s < NB_LORA_SITES; s++)
        if (m->lora->sites & 1u << s && nb_tf_lora_site(&m->cfg, s, &g) && g.OC > w) w = g.OC;
    return w;
}

static void *at(const void *p, size_t elems, size_t es) { return (char *)p + elems * es; }

/* PEFT's order: the branch lora_B(lora_A(x)), then times the scale, added to the projection. */
void nb_tf_lora_forward(const nb_tf_model *m, const nb_backend_i *be, nb_ctx ctx, const nb_tf_layer_view *w, int site,
                        nb_tf_layer_acts *s, nb_tf_acts *a, const void *x, void *y) {
    if (!w->la[site]) return;
    const nb_tf_lora *lo = m->lora;
    nb_lora_site g;
    NB_ASSERT(lo && nb_tf_lora_site(&m->cfg, site, &g));
    int N = a->B * a->T;
    be->matmul_fwd(ctx, s->lu[site], x, w->la[site], NULL, N, g.K, lo->r);
    be->matmul_fwd(ctx, a->lt, s->lu[site], w->lb[site], NULL, N, lo->r, g.OC);
    be->scale_cols(ctx, at(y, (size_t)g.off, nb_dtype_size(be->act_dtype)), g.ld, a->lt, g.OC, N, g.OC, lo->scale, 1);
}

void nb_tf_lora_backward(const nb_tf_model *m, const nb_backend_i *be, nb_ctx ctx, const nb_tf_layer_view *w,
                         const nb_tf_layer_view *dw, int site, const nb_tf_layer_acts *s, nb_tf_acts *a, const void *x,
                         void *dx, const void *dy) {
    if (!w->la[site]) return;
    const nb_tf_lora *lo = m->lora;
    nb_lora_site g;
    NB_ASSERT(lo && nb_tf_lora_site(&m->cfg, site, &g));
    int N = a->B * a->T;
    size_t es = nb_dtype_size(be->act_dtype);
    /* d(branch output) = scale * dy's slice, packed; d(x A^T) starts from zero (matmul_bwd adds) */
    be->scale_cols(ctx, a->lt, g.OC, at(dy, (size_t)g.off, es), g.ld, N, g.OC, lo->scale, 0);
    be->zero(ctx, a->ldu, (size_t)N * lo->r * es);
    be->matmul_bwd(ctx, a->ldu, dw->lb[site], NULL, a->lt, s->lu[site], w->lb[site], N, lo->r, g.OC);
    be->matmul_bwd(ctx, dx, dw->la[site], NULL, a->ldu, x, w->la[site], N, g.K, lo->r);
}

/* W[off + o, k] += scale * sum_j B[o, j] A[j, k], in double, rounded once */
void nb_tf_lora_merge_layer(const nb_tf_model *m, const nb_tf_lora *lo, int l, float *group, const float *lslab) {
    size_t g0 = m->group_offset[1 + l];
    for (int s = 0; s < NB_LORA_SITES; s++) {
        nb_lora_site g;
        int ia = lo->idx[l][s][0], ib = lo->idx[l][s][1];
        if (ia < 0 || !nb_tf_lora_site(&m->cfg, s, &g)) continue;
        const float *A = lslab + lo->params[ia].offset, *B = lslab + lo->params[ib].offset;
        float *W = group + (m->params[m->layer_idx[l][g.w]].offset - g0);
#pragma omp parallel for schedule(static) if ((size_t)g.OC * g.K > (1u << 20))
        for (int o = 0; o < g.OC; o++)
            for (int k = 0; k < g.K; k++) {
                double acc = 0;
                for (int j = 0; j < lo->r; j++) acc += (double)B[(size_t)o * lo->r + j] * A[(size_t)j * g.K + k];
                float *wp = &W[(size_t)(g.off + o) * g.K + k];
                *wp = (float)((double)*wp + (double)lo->scale * acc);
            }
    }
}

void nb_tf_lora_merge(const nb_tf_model *m, const nb_tf_lora *lo, float *slab, const float *lslab) {
    for (int l = 0; l < m->cfg.layers; l++) nb_tf_lora_merge_layer(m, lo, l, slab + m->group_offset[1 + l], lslab);
}
