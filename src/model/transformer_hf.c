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

const char *nb_hf_class_name(const nb_tf_model *m) {
    return m->cfg.arch == NB_ARCH_GPT2 ? "GPT2LMHeadModel" : "LlamaForCausalLM";
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

/* A flat JSON object, one "key": value per line; values arrive already spelled. */
typedef struct {
    nb_sbuf b;
    int n;
} cfg_out;

static void kv(cfg_out *o, const char *key, const char *raw) {
    nb_sbuf_printf(&o->b, "%s\n  \"%s\": %s", o->n++ ? "," : "{", key, raw);
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

static void llama_config(cfg_out *o, const nb_tf_config *c) {
    kv(o, "architectures", "[\"LlamaForCausalLM\"]");
    kv_str(o, "model_type", "llama");
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
    kv_bool(o, "attention_bias", 0);
    kv_float(o, "attention_dropout", 0.0f);
    kv_bool(o, "mlp_bias", 0);
    kv_float(o, "initializer_range", 0.02f);
    kv_int(o, "pretraining_tp", 1);
    kv_bool(o, "use_cache", 1);
    token_ids(o, c);
    kv_bool(o, "tie_word_embeddings", c->tied);
}

char *nb_hf_config_json(const nb_tf_model *m) {
    cfg_out o = {{0}, 0};
    if (m->cfg.arch == NB_ARCH_GPT2)
        gpt2_config(&o, &m->cfg);
    else
        llama_config(&o, &m->cfg);
    kv_str(&o, "dtype", "float32");
    nb_sbuf_puts(&o.b, "\n}\n");
    return o.b.data;
}

/* ---------------------------------------------------------------- writing */

typedef struct {
    const float *src; /* first source row */
    int64_t rows, cols;
} transposed_src;

/* HF element k of a [cols, rows] tensor is source element (k % rows, k / rows). Chunks come
 * from the safetensors writer's staging buffer, so only a bounded piece is ever materialized. */
static void fill_transposed(void *ctx, void *dst, size_t offset, size_t bytes) {
    const transposed_src *s = ctx;
    NB_ASSERT(offset % sizeof(float) == 0 && bytes % sizeof(float) == 0);
    float *out = dst;
    size_t k0 = offset / sizeof(float), n = bytes / sizeof(float), R = (size_t)s->rows, C = (size_t)s->cols;
    for (size_t k = 0; k < n; k++) {
        size_t i = (k0 + k) / R, j = (k0 + k) % R;
        out[k] = s->src[j * C + i];
    }
}

int nb_hf_export(const char *out_dir, const nb_tf_model *m, const float *params) {
    nb_hf_tensor *t;
    int n = nb_hf_tensors(m, &t);
    char path[4096];
    NB_CHECK(strlen(out_dir) < sizeof path - 32, "choose a shorter output path", "output path too long: %s", out_dir);
    nb_mkdir_p(out_dir);

    transposed_src *ts = nb_calloc((size_t)n, sizeof *ts, "export sources");
    snprintf(path, sizeof path, "%s/model.safetensors", out_dir);
    nb_st_writer *w = nb_st_begin(path);
    /* from_pretrained refuses safetensors files whose metadata format is not "pt" */
    nb_st_meta(w, "format", "pt");
    nb_st_meta(w, "producer", "nobubble");
    for (int i = 0; i < n; i++) {
        const nb_param *p = &m->params[t[i].param];
        int64_t cols = p->ndim > 1 ? p->shape[1] : 1;
        const float *src = params + p->offset + (size_t)t[i].row0 * (size_t)cols;
        if (t[i].transpose) {
            ts[i] = (transposed_src){src, t[i].rows, cols};
            nb_st_add_fn(w, t[i].name, NB_F32, t[i].ndim, t[i].shape, fill_transposed, &ts[i]);
        } else {
            nb_st_add(w, t[i].name, NB_F32, t[i].ndim, t[i].shape, src);
        }
    }
    nb_st_end(w);
    free(ts);
    free(t);

    /* config.json last: the weights are the write likely to fail (size), and when it fails the
     * previous export in out_dir stays whole (both files are replaced atomically) */
    char *cfg = nb_hf_config_json(m);
    snprintf(path, sizeof path, "%s/config.json", out_dir);
    nb_write_file_atomic(path, cfg, strlen(cfg));
    free(cfg);
    return n;
}
