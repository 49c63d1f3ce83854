#include "model/transformer_hf.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "io/atomic.h"
#include "io/json.h"
#include "io/safetensors.h"

/* ---------------------------------------------------------------- export table */

typedef struct {
    const nb_tf_model *m;
    nb_hf_tensor *t;
    int n, cap;
} table;

/* Adds rows [row0, row0 + rows) of param (rows < 0: all of them). */
static void add(table *tb, int param, int64_t row0, int64_t rows, int transpose, const char *fmt, int layer) {
    if (param < 0) return; /* absent in this layout (Llama biases) */
    NB_ASSERT(tb->n < tb->cap);
    const nb_param *p = &tb->m->params[param];
    nb_hf_tensor *t = &tb->t[tb->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, fmt, layer);
    t->param = param;
    t->row0 = row0;
    t->rows = rows < 0 ? p->shape[0] : rows;
    NB_ASSERT(row0 >= 0 && row0 + t->rows <= p->shape[0]);
    t->transpose = transpose;
    t->ndim = p->ndim;
    if (p->ndim == 1) {
        t->shape[0] = t->rows;
    } else if (transpose) {
        t->shape[0] = p->shape[1];
        t->shape[1] = t->rows;
    } else {
        t->shape[0] = t->rows;
        t->shape[1] = p->shape[1];
    }
}

static void gpt2_table(table *tb) {
    const nb_tf_model *m = tb->m;
    const nb_tf_config *c = &m->cfg;
    add(tb, m->global_idx[NB_TF_WTE], 0, c->vocab, 0, "transformer.wte.weight", 0);
    add(tb, m->global_idx[NB_TF_WPE], 0, -1, 0, "transformer.wpe.weight", 0);
    for (int l = 0; l < c->layers; l++) {
        const int *ix = m->layer_idx[l];
        add(tb, ix[NB_TF_LN1_W], 0, -1, 0, "transformer.h.%d.ln_1.weight", l);
        add(tb, ix[NB_TF_LN1_B], 0, -1, 0, "transformer.h.%d.ln_1.bias", l);
        add(tb, ix[NB_TF_QKV_W], 0, -1, 1, "transformer.h.%d.attn.c_attn.weight", l);
        add(tb, ix[NB_TF_QKV_B], 0, -1, 0, "transformer.h.%d.attn.c_attn.bias", l);
        add(tb, ix[NB_TF_PROJ_W], 0, -1, 1, "transformer.h.%d.attn.c_proj.weight", l);
        add(tb, ix[NB_TF_PROJ_B], 0, -1, 0, "transformer.h.%d.attn.c_proj.bias", l);
        add(tb, ix[NB_TF_LN2_W], 0, -1, 0, "transformer.h.%d.ln_2.weight", l);
        add(tb, ix[NB_TF_LN2_B], 0, -1, 0, "transformer.h.%d.ln_2.bias", l);
        add(tb, ix[NB_TF_FC_W], 0, -1, 1, "transformer.h.%d.mlp.c_fc.weight", l);
        add(tb, ix[NB_TF_FC_B], 0, -1, 0, "transformer.h.%d.mlp.c_fc.bias", l);
        add(tb, ix[NB_TF_FCPROJ_W], 0, -1, 1, "transformer.h.%d.mlp.c_proj.weight", l);
        add(tb, ix[NB_TF_FCPROJ_B], 0, -1, 0, "transformer.h.%d.mlp.c_proj.bias", l);
    }
    add(tb, m->global_idx[NB_TF_LNF_W], 0, -1, 0, "transformer.ln_f.weight", 0);
    add(tb, m->global_idx[NB_TF_LNF_B], 0, -1, 0, "transformer.ln_f.bias", 0);
    if (!c->tied) add(tb, m->global_idx[NB_TF_LM_HEAD], 0, c->vocab, 0, "lm_head.weight", 0);
}

static void llama_table(table *tb) {
    const nb_tf_model *m = tb->m;
    const nb_tf_config *c = &m->cfg;
    int64_t q = (int64_t)c->heads * c->head_size, kv = (int64_t)c->kv_heads * c->head_size, F = c->ffn;
    add(tb, m->global_idx[NB_TF_WTE], 0, c->vocab, 0, "model.embed_tokens.weight", 0);
    for (int l = 0; l < c->layers; l++) {
        const int *ix = m->layer_idx[l];
        add(tb, ix[NB_TF_LN1_W], 0, -1, 0, "model.layers.%d.input_layernorm.weight", l);
        add(tb, ix[NB_TF_QKV_W], 0, q, 0, "model.layers.%d.self_attn.q_proj.weight", l);
        add(tb, ix[NB_TF_QKV_W], q, kv, 0, "model.layers.%d.self_attn.k_proj.weight", l);
        add(tb, ix[NB_TF_QKV_W], q + kv, kv, 0, "model.layers.%d.self_attn.v_proj.weight", l);
        add(tb, ix[NB_TF_QKV_B], 0, q, 0, "model.layers.%d.self_attn.q_proj.bias", l);
        add(tb, ix[NB_TF_QKV_B], q, kv, 0, "model.layers.%d.self_attn.k_proj.bias", l);
        add(tb, ix[NB_TF_QKV_B], q + kv, kv, 0, "model.layers.%d.self_attn.v_proj.bias", l);
        add(tb, ix[NB_TF_QNORM_W], 0, -1, 0, "model.layers.%d.self_attn.q_norm.weight", l);
        add(tb, ix[NB_TF_KNORM_W], 0, -1, 0, "model.layers.%d.self_attn.k_norm.weight", l);
        add(tb, ix[NB_TF_PROJ_W], 0, -1, 0, "model.layers.%d.self_attn.o_proj.weight", l);
        add(tb, ix[NB_TF_LN2_W], 0, -1, 0, "model.layers.%d.post_attention_layernorm.weight", l);
        add(tb, ix[NB_TF_FC_W], 0, F, 0, "model.layers.%d.mlp.gate_proj.weight", l);
        add(tb, ix[NB_TF_FC_W], F, F, 0, "model.layers.%d.mlp.up_proj.weight", l);
        add(tb, ix[NB_TF_FCPROJ_W], 0, -1, 0, "model.layers.%d.mlp.down_proj.weight", l);
    }
    add(tb, m->global_idx[NB_TF_LNF_W], 0, -1, 0, "model.norm.weight", 0);
    if (!c->tied) add(tb, m->global_idx[NB_TF_LM_HEAD], 0, c->vocab, 0, "lm_head.weight", 0);
}

int nb_hf_tensors(const nb_tf_model *m, nb_hf_tensor **out) {
    /* at most 3 HF tensors per parameter (q/k/v from one qkv) */
    table tb = {m, NULL, 0, 3 * m->nparams};
    tb.t = nb_calloc((size_t)tb.cap, sizeof *tb.t, "export table");
    if (m->cfg.arch == NB_ARCH_GPT2)
        gpt2_table(&tb);
    else
        llama_table(&tb);
    *out = tb.t;
    return tb.n;
}

/* The Llama layout's variants name their class: q/k norm is Qwen3's, a qkv bias Qwen2's. */
static const char *qwen_class(const nb_tf_config *c) {
    return c->qk_norm ? "Qwen3ForCausalLM" : c->qkv_bias ? "Qwen2ForCausalLM" : NULL;
}

const char *nb_hf_class_name(const nb_tf_model *m) {
    if (m->cfg.arch == NB_ARCH_GPT2) return "GPT2LMHeadModel";
    return qwen_class(&m->cfg) ? qwen_class(&m->cfg) : "LlamaForCausalLM";
}

const char *nb_hf_export_class(const nb_tf_model *m, const nb_hf_export_opts *x) {
    return x && x->origin && x->origin->cls[0] ? x->origin->cls : nb_hf_class_name(m);
}

/* ---------------------------------------------------------------- config.json */

/* The shortest decimal that reads back as the same float, always spelled as a float (Python's
 * json gives int for "10000", and a strict config field declared float refuses an int). */
static void fmt_float(char *buf, size_t cap, float v) {
    if (v == floorf(v) && fabsf(v) < 1e15f) {
        snprintf(buf, cap, "%.1f", (double)v);
        return;
    }
    for (int p = 1; p <= 9; p++) {
        snprintf(buf, cap, "%.*g", p, (double)v);
        if (strtof(buf, NULL) == v) break; /* 9 significant digits always round-trip a float */
    }
    if (!strpbrk(buf, ".eE")) snprintf(buf + strlen(buf), cap - strlen(buf), ".0");
}

/* A flat JSON object, one "key": value per line; values arrive already spelled. A key is
 * written once: the first value given for it stays. Where an imported model's config.json has
 * a key of ORIGIN_WINS, its value is written instead of ours, in our place (an export of an
 * import of an export is the same file). */
#define CFG_MAX_KEYS 512
typedef struct {
    nb_sbuf b;
    int n;
    char *keys[CFG_MAX_KEYS];
    const nb_json *origin; /* the imported config.json, or NULL */
} cfg_out;

/* The imported config.json's value of a key where it is the truth and ours a default or a
 * stand-in (defined with the origin's fields below), or NULL. */
static const nb_json *origin_wins(const cfg_out *o, const char *key);

static int has_key(const cfg_out *o, const char *key) {
    for (int i = 0; i < o->n; i++)
        if (!strcmp(o->keys[i], key)) return 1;
    return 0;
}

static void kv_raw(cfg_out *o, const char *key, const char *raw) {
    if (has_key(o, key)) return;
    NB_CHECK(o->n < CFG_MAX_KEYS, "remove fields transformers does not need from the imported config.json",
             "config.json: more than %d fields", CFG_MAX_KEYS);
    o->keys[o->n] = strdup(key);
    NB_CHECK(o->keys[o->n], "free some host memory", "out of memory writing config.json");
    nb_sbuf_printf(&o->b, "%s\n  \"%s\": %s", o->n++ ? "," : "{", key, raw);
}

static void kv_spelled(cfg_out *o, const char *key, const nb_json *v) {
    nb_sbuf b = {0};
    nb_json_spell(&b, v);
    kv_raw(o, key, b.data);
    nb_sbuf_free(&b);
}

static void kv(cfg_out *o, const char *key, const char *raw) {
    const nb_json *theirs = origin_wins(o, key);
    if (theirs)
        kv_spelled(o, key, theirs);
    else
        kv_raw(o, key, raw);
}

static void kv_int(cfg_out *o, const char *key, int64_t v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%lld", (long long)v);
    kv(o, key, buf);
}
static void kv_float(cfg_out *o, const char *key, float v) {
    char buf[48];
    fmt_float(buf, sizeof buf, v);
    kv(o, key, buf);
}
static void kv_str(cfg_out *o, const char *key, const char *s) {
    char buf[96]; /* our values are fixed ASCII identifiers: nothing to escape */
    snprintf(buf, sizeof buf, "\"%s\"", s);
    kv(o, key, buf);
}
static void kv_bool(cfg_out *o, const char *key, int v) { kv(o, key, v ? "true" : "false"); }

/* GPT-2's end-of-text token, HF's bos/eos for GPT-2 vocabularies; a smaller vocabulary (tests)
 * has no such token and gets null. */
#define GPT2_EOT 50256

static void token_ids(cfg_out *o, const nb_tf_config *c) {
    if (c->vocab > GPT2_EOT) {
        kv_int(o, "bos_token_id", GPT2_EOT);
        kv_int(o, "eos_token_id", GPT2_EOT);
    } else {
        kv(o, "bos_token_id", "null");
        kv(o, "eos_token_id", "null");
    }
}

static void gpt2_config(cfg_out *o, const nb_tf_config *c) {
    kv(o, "architectures", "[\"GPT2LMHeadModel\"]");
    kv_str(o, "model_type", "gpt2");
    kv_int(o, "vocab_size", c->vocab);
    kv_int(o, "n_positions", c->seq);
    kv_int(o, "n_embd", c->dim);
    kv_int(o, "n_layer", c->layers);
    kv_int(o, "n_head", c->heads);
    kv_int(o, "n_inner", c->ffn);
    /* tanh-approximated GELU, as our kernel computes it ("gelu" would be the erf form) */
    kv_str(o, "activation_function", "gelu_new");
    /* no dropout: the export is for inference and for exact parity checks */
    kv_float(o, "resid_pdrop", 0.0f);
    kv_float(o, "embd_pdrop", 0.0f);
    kv_float(o, "attn_pdrop", 0.0f);
    kv_float(o, "layer_norm_epsilon", c->norm_eps);
    kv_float(o, "initializer_range", 0.02f);
    kv_bool(o, "scale_attn_weights", 1);
    kv_bool(o, "scale_attn_by_inverse_layer_idx", 0);
    kv_bool(o, "reorder_and_upcast_attn", 0);
    kv_bool(o, "use_cache", 1);
    token_ids(o, c);
    kv_bool(o, "tie_word_embeddings", c->tied);
}

/* RoPE: transformers 5 reads rope_parameters; 4.x reads rope_theta and rope_scaling (5 also
 * accepts them). rope_scaling is written only for a scaled RoPE, so a plain model's config is
 * what it was; the importer reads both spellings back (transformer_hf_import.c, read_rope). */
static void rope_config(cfg_out *o, const nb_tf_config *c) {
    char theta[48], f[4][48], scaling[320] = "", rope[400];
    fmt_float(theta, sizeof theta, c->rope_theta);
    fmt_float(f[0], sizeof f[0], c->rope_factor);
    fmt_float(f[1], sizeof f[1], c->rope_low_freq_factor);
    fmt_float(f[2], sizeof f[2], c->rope_high_freq_factor);
    if (c->rope_scaling == NB_ROPE_LINEAR)
        snprintf(scaling, sizeof scaling, "\"rope_type\": \"linear\", \"factor\": %s", f[0]);
    if (c->rope_scaling == NB_ROPE_LLAMA3)
        snprintf(scaling, sizeof scaling,
                 "\"rope_type\": \"llama3\", \"factor\": %s, \"low_freq_factor\": %s, \"high_freq_factor\": %s, "
                 "\"original_max_position_embeddings\": %d",
                 f[0], f[1], f[2], c->rope_original_ctx);
    kv(o, "rope_theta", theta);
    if (scaling[0]) {
        snprintf(rope, sizeof rope, "{%s}", scaling);
        kv(o, "rope_scaling", rope);
        snprintf(rope, sizeof rope, "{%s, \"rope_theta\": %s}", scaling, theta);
    } else {
        snprintf(rope, sizeof rope, "{\"rope_type\": \"default\", \"rope_theta\": %s}", theta);
    }
    kv(o, "rope_parameters", rope);
}

/* The fields Llama's and Qwen's configs share, in their order: the shape, eps and RoPE. */
static void decoder_shape(cfg_out *o, const nb_tf_config *c) {
    kv_int(o, "vocab_size", c->vocab);
    kv_int(o, "hidden_size", c->dim);
    kv_int(o, "intermediate_size", c->ffn);
    kv_int(o, "num_hidden_layers", c->layers);
    kv_int(o, "num_attention_heads", c->heads);
    kv_int(o, "num_key_value_heads", c->kv_heads);
    kv_int(o, "head_dim", c->head_size);
    kv_str(o, "hidden_act", "silu");
    kv_int(o, "max_position_embeddings", c->seq);
    kv_float(o, "rms_norm_eps", c->norm_eps);
    rope_config(o, c);
}

static void llama_config(cfg_out *o, const nb_tf_config *c) {
    kv(o, "architectures", "[\"LlamaForCausalLM\"]");
    kv_str(o, "model_type", "llama");
    decoder_shape(o, c);
    kv_bool(o, "attention_bias", 0);
    kv_float(o, "attention_dropout", 0.0f);
    kv_bool(o, "mlp_bias", 0);
    kv_float(o, "initializer_range", 0.02f);
    kv_int(o, "pretraining_tp", 1);
    kv_bool(o, "use_cache", 1);
    token_ids(o, c);
    kv_bool(o, "tie_word_embeddings", c->tied);
}

/* Qwen2Config / Qwen3Config: Llama's fields, the sliding window off, Qwen3's head_dim, and no
 * attention_bias for Qwen2 (its q/k/v biases are not a switch there). */
static void qwen_config(cfg_out *o, const nb_tf_config *c) {
    char cls[48];
    int qwen3 = c->qk_norm;
    snprintf(cls, sizeof cls, "[\"%s\"]", qwen_class(c));
    kv(o, "architectures", cls);
    kv_str(o, "model_type", qwen3 ? "qwen3" : "qwen2");
    decoder_shape(o, c);
    if (qwen3) kv_bool(o, "attention_bias", 0);
    kv_float(o, "attention_dropout", 0.0f);
    kv_bool(o, "use_sliding_window", 0);
    kv(o, "sliding_window", "null");
    kv_int(o, "max_window_layers", c->layers);
    kv_float(o, "initializer_range", 0.02f);
    kv_bool(o, "use_cache", 1);
    token_ids(o, c);
    kv_bool(o, "tie_word_embeddings", c->tied);
}

/* ---------------------------------------------------------------- an imported model's fields */

/* torch's name of the export's dtype, as config.json spells it */
static const char *torch_dtype(nb_dtype d) { return d == NB_BF16 ? "bfloat16" : d == NB_F16 ? "float16" : "float32"; }

/* The imported config.json, parsed (NULL for a model trained here). */
static nb_json *origin_config(const nb_hf_export_opts *x) {
    if (!x || !x->origin || !x->origin->cls[0]) return NULL;
    return nb_json_parse_or_fail(x->origin->config, strlen(x->origin->config), "state.json model.hf.config");
}

static const nb_json *origin_wins(const cfg_out *o, const char *key) {
    /* its class and type; the context RoPE models were trained for (not --seq); the tokenizer's
     * ids; settings of its own that our defaults stand in for */
    static const char *const keys[] = {"architectures", "model_type", "max_position_embeddings", "bos_token_id",
                                       "eos_token_id", "pad_token_id", "initializer_range", "use_cache", NULL};
    if (!o->origin) return NULL;
    for (const char *const *k = keys; *k; k++)
        if (!strcmp(key, *k)) return nb_json_get(o->origin, key);
    return NULL;
}

/* After our fields: every other field of the imported config.json, unchanged (sliding_window,
 * rope_scaling: null, transformers_version, ...); ours stay where both have one. */
static void origin_rest(cfg_out *o, const nb_json *j) {
    for (size_t i = 0; i < j->len; i++) kv_spelled(o, j->keys[i], &j->items[i]);
}

char *nb_hf_config_json(const nb_tf_model *m, const nb_hf_export_opts *x) {
    cfg_out o = {{0}, 0, {0}, NULL};
    nb_json *origin = origin_config(x);
    o.origin = origin;
    if (origin && !nb_json_get(origin, "architectures")) { /* a config.json that names only its model_type */
        char cls[96];
        snprintf(cls, sizeof cls, "[\"%s\"]", x->origin->cls);
        kv_raw(&o, "architectures", cls);
    }
    if (m->cfg.arch == NB_ARCH_GPT2)
        gpt2_config(&o, &m->cfg);
    else if (qwen_class(&m->cfg))
        qwen_config(&o, &m->cfg);
    else
        llama_config(&o, &m->cfg);
    /* transformers 4 reads torch_dtype, 5 dtype: the export's, whichever the import had */
    if (origin && nb_json_get(origin, "torch_dtype")) kv_str(&o, "torch_dtype", torch_dtype(x->dtype));
    kv_str(&o, "dtype", torch_dtype(x ? x->dtype : NB_F32));
    if (origin) origin_rest(&o, origin);
    nb_json_free(origin);
    for (int i = 0; i < o.n; i++) free(o.keys[i]);
    nb_sbuf_puts(&o.b, "\n}\n");
    return o.b.data;
}

/* ---------------------------------------------------------------- writing */

/* float -> bfloat16, rounded to nearest even (what torch's .to(torch.bfloat16) does) */
static uint16_t bf16_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* NaN stays a quiet NaN */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

/* float -> IEEE half, rounded to nearest even; beyond 65504 (past the halfway point to 65536) the
 * value is infinite, below 2^-14 subnormal */
static uint16_t f16_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00;
    if (a >= 0x477ff000u) return sign | 0x7c00;
    if (a >= 0x38800000u) { /* normal */
        uint32_t h = ((a >> 23) - 112) << 10 | (a & 0x7fffff) >> 13, rem = a & 0x1fff;
        return sign | (uint16_t)(h + (rem > 0x1000 || (rem == 0x1000 && (h & 1))));
    }
    if (a <= 0x33000000u) return sign; /* at most half the smallest subnormal: zero (even) */
    uint32_t mant = (a & 0x7fffff) | 0x800000, shift = 126 - (a >> 23), h = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    return sign | (uint16_t)(h + (rem > half || (rem == half && (h & 1))));
}

/* Where the weights come from: a whole slab, or one group at a time (nb_hf_group_fn). */
typedef struct {
    const float *slab;
    nb_hf_group_fn group;
    void *self;
    size_t overflows; /* f16 values beyond its range, counted as written */
} export_from;

typedef struct {
    const float *src; /* first source row (a slab); NULL: from the group, found when written */
    size_t rel;       /* the first row's offset from its group's start */
    int g;            /* its group */
    export_from *from;
    int64_t rows, cols;
    int transpose;
    nb_dtype dtype;
} export_src;

/* A chunk of the HF tensor in its dtype. Element k is source element k, or (k % rows, k / rows)
 * of a transposed one ([cols, rows]). Chunks come from the safetensors writer's staging buffer,
 * so only a bounded piece is ever materialized. */
static void fill(void *ctx, void *dst, size_t offset, size_t bytes) {
    const export_src *s = ctx;
    size_t es = s->dtype == NB_F32 ? 4 : 2, bad = 0;
    NB_ASSERT(offset % es == 0 && bytes % es == 0);
    size_t k0 = offset / es, n = bytes / es, R = (size_t)s->rows, C = (size_t)s->cols;
    const float *src = s->src ? s->src : s->from->group(s->from->self, s->g) + s->rel;
    for (size_t k = 0; k < n; k++) {
        size_t e = k0 + k;
        float v = s->transpose ? src[(e % R) * C + e / R] : src[e];
        if (s->dtype == NB_F32) {
            memcpy((char *)dst + 4 * k, &v, 4);
        } else {
            uint16_t h = s->dtype == NB_BF16 ? bf16_bits(v) : f16_bits(v);
            bad += s->dtype == NB_F16 && (h & 0x7c00) == 0x7c00;
            memcpy((char *)dst + 2 * k, &h, 2);
        }
    }
    s->from->overflows += bad;
}

static int by_group(const void *a, const void *b) {
    const export_src *x = a, *y = b;
    return x->g != y->g ? (x->g < y->g ? -1 : 1) : 0;
}

/* The tensors in file order: the table's, or with weights from groups, the groups' order (stable:
 * the table's within a group), so that the groups are asked for in ascending order. */
static int export_weights(const char *out_dir, const nb_tf_model *m, export_from *from, nb_dtype dtype) {
    NB_ASSERT(dtype == NB_F32 || dtype == NB_BF16 || dtype == NB_F16);
    nb_hf_tensor *t;
    int n = nb_hf_tensors(m, &t);
    char path[4096];
    NB_CHECK(strlen(out_dir) < sizeof path - 32, "choose a shorter output path", "output path too long: %s", out_dir);
    nb_mkdir_p(out_dir);
    export_src *es = nb_calloc((size_t)n, sizeof *es, "export sources");
    int *order = nb_malloc((size_t)n * sizeof *order, "export order");
    for (int i = 0; i < n; i++) {
        const nb_param *p = &m->params[t[i].param];
        int64_t cols = p->ndim > 1 ? p->shape[1] : 1;
        size_t off = p->offset + (size_t)t[i].row0 * (size_t)cols;
        es[i] = (export_src){from->slab ? from->slab + off : NULL, off - m->group_offset[p->group], p->group, from,
                             t[i].rows, cols, t[i].transpose, dtype};
        order[i] = i;
    }
    if (!from->slab) /* insertion sort of the indices by group: stable, n is a few hundred */
        for (int i = 1; i < n; i++)
            for (int j = i; j > 0 && by_group(&es[order[j - 1]], &es[order[j]]) > 0; j--) {
                int k = order[j];
                order[j] = order[j - 1], order[j - 1] = k;
            }
    snprintf(path, sizeof path, "%s/model.safetensors", out_dir);
    nb_st_writer *w = nb_st_begin(path);
    /* from_pretrained refuses safetensors files whose metadata format is not "pt" */
    nb_st_meta(w, "format", "pt");
    nb_st_meta(w, "producer", "nobubble");
    for (int k = 0; k < n; k++) {
        int i = order[k];
        if (dtype == NB_F32 && !t[i].transpose && es[i].src)
            nb_st_add(w, t[i].name, NB_F32, t[i].ndim, t[i].shape, es[i].src);
        else
            nb_st_add_fn(w, t[i].name, dtype, t[i].ndim, t[i].shape, fill, &es[i]);
    }
    nb_st_end(w);
    if (from->overflows)
        fprintf(stderr, "warning: %zu weights are beyond float16's range (65504) and were written as infinities: export "
                        "with --dtype bf16 or f32\n", from->overflows);
    free(order), free(es), free(t);
    return n;
}

static void export_config(const char *out_dir, const nb_tf_model *m, const nb_hf_export_opts *x) {
    char path[4096];
    /* config.json last: the weights are the write likely to fail (size), and when it fails the
     * previous export in out_dir stays whole (both files are replaced atomically) */
    char *cfg = nb_hf_config_json(m, x);
    snprintf(path, sizeof path, "%s/config.json", out_dir);
    nb_write_file_atomic(path, cfg, strlen(cfg));
    free(cfg);
}

int nb_hf_export(const char *out_dir, const nb_tf_model *m, const float *params, const nb_hf_export_opts *x) {
    export_from from = {params, NULL, NULL, 0};
    int n = export_weights(out_dir, m, &from, x ? x->dtype : NB_F32);
    export_config(out_dir, m, x);
    return n;
}

int nb_hf_export_by_groups(const char *out_dir, const nb_tf_model *m, nb_hf_group_fn group, void *self,
                           const nb_hf_export_opts *x) {
    export_from from = {NULL, group, self, 0};
    int n = export_weights(out_dir, m, &from, x ? x->dtype : NB_F32);
    export_config(out_dir, m, x);
    return n;
}
