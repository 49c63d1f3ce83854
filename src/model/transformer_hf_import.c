/* Hugging Face import (model/transformer_hf.h): the reverse of the export. config.json gives the
 * shape, the safetensors files the weights, through the export's own table (nb_hf_tensors), so
 * a name, a transpose or a split can never differ between the two directions.
 * Every refusal is one nb_fail line; the public calls run with nb_fail's exit status at 2 (bad
 * input), the JSON and safetensors readers' refusals included. */
#include "model/transformer_hf.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "io/crc32c.h"
#include "io/json.h"
#include "io/safetensors.h"

#define CFG_HINT                                                                                                       \
    "nobubble imports GPT2LMHeadModel, LlamaForCausalLM, MistralForCausalLM (Llama's math), Qwen2ForCausalLM and "        \
    "Qwen3ForCausalLM checkpoints"
#define FILE_HINT "the checkpoint is damaged or not a transformers save_pretrained directory: fetch or save it again"

/* ---------------------------------------------------------------- config.json */

/* config.json or the shards' index: a damaged one is named with where it breaks. */
static nb_json *load_json(const char *path) {
    size_t len;
    char *text = nb_read_file(path, NB_JSON_MAX_BYTES, &len, FILE_HINT), err[512];
    nb_json *j = nb_json_parse(text, len, path, err, sizeof err);
    free(text);
    if (!j) nb_fail(FILE_HINT, "invalid JSON: %s", err);
    return j;
}

typedef struct {
    const char *path; /* DIR/config.json, for messages */
    const nb_json *j;
} cfg_in;

/* A present, non-null member. */
static const nb_json *member(const cfg_in *c, const char *key) {
    const nb_json *v = nb_json_get(c->j, key);
    return v && v->type != NB_JSON_NULL ? v : NULL;
}

/* An integer field in [lo, INT_MAX]; absent: def, or a refusal when def < lo (required). */
static int int_field(const cfg_in *c, const char *key, int lo, int def) {
    const nb_json *v = member(c, key);
    NB_CHECK(v || def >= lo, CFG_HINT, "%s: field '%s' is missing", c->path, key);
    if (!v) return def;
    NB_CHECK(v->type == NB_JSON_NUM && v->is_int && v->i64 >= lo && v->i64 <= INT_MAX, CFG_HINT,
             "%s: field '%s' must be an integer >= %d", c->path, key, lo);
    return (int)v->i64;
}

/* A positive finite number that a float holds (eps, rope theta). */
static float num_field(const cfg_in *c, const char *key, double def) {
    const nb_json *v = member(c, key);
    if (!v) return (float)def;
    NB_CHECK(v->type == NB_JSON_NUM && isfinite(v->num) && v->num > 0 && (float)v->num > 0 && isfinite((float)v->num),
             CFG_HINT, "%s: field '%s' must be a positive number (a float32)", c->path, key);
    return (float)v->num;
}

static int bool_field(const cfg_in *c, const char *key, int def) {
    const nb_json *v = member(c, key);
    if (!v) return def;
    NB_CHECK(v->type == NB_JSON_BOOL, CFG_HINT, "%s: field '%s' must be true or false", c->path, key);
    return v->boolean;
}

static const char *str_field(const cfg_in *c, const char *key, const char *def) {
    const nb_json *v = member(c, key);
    if (!v) return def;
    NB_CHECK(v->type == NB_JSON_STR, CFG_HINT, "%s: field '%s' must be a string", c->path, key);
    return v->str;
}

/* A field that must hold one value (a bias switch, an activation) for our math to be the model's. */
static void want_bool(const cfg_in *c, const char *key, int def, int want, const char *why) {
    NB_CHECK(bool_field(c, key, def) == want, CFG_HINT, "%s: field '%s' is %s: %s", c->path, key, want ? "false" : "true",
             why);
}

/* Fields of mixture-of-experts variants that reuse Llama's model_type or a Mistral class. */
static void refuse_moe(const cfg_in *c) {
    static const char *const keys[] = {"num_local_experts", "num_experts", "n_routed_experts", "num_experts_per_tok",
                                        "moe_intermediate_size", NULL};
    for (const char *const *k = keys; *k; k++) {
        const nb_json *v = member(c, *k);
        NB_CHECK(!v || (v->type == NB_JSON_NUM && v->num == 0), CFG_HINT,
                 "%s: field '%s' is set: mixture-of-experts models are not supported (dense MLPs only)", c->path, *k);
    }
}

/* One rope_scaling (transformers 4) or rope_parameters (5) object into m's scaling fields: its
 * rope_type (4's older configs say "type") and the numbers that type reads. */
#define ROPE_HINT "nobubble supports rope_type default, linear and llama3 (Llama 3.1 / 3.2)"
static void rope_object(const cfg_in *c, const char *key, const nb_json *o, nb_tf_config *m) {
    NB_CHECK(o->type == NB_JSON_OBJ, CFG_HINT, "%s: field '%s' must be an object or null", c->path, key);
    cfg_in oc = {c->path, o};
    const char *type = member(&oc, "rope_type") ? str_field(&oc, "rope_type", NULL) : str_field(&oc, "type", "default");
    if (!strcmp(type, "default")) {
        m->rope_scaling = NB_ROPE_DEFAULT;
        return;
    }
    if (!strcmp(type, "linear"))
        m->rope_scaling = NB_ROPE_LINEAR;
    else if (!strcmp(type, "llama3"))
        m->rope_scaling = NB_ROPE_LLAMA3;
    else
        nb_fail(ROPE_HINT, "%s: field '%s' has rope_type '%s', which is not supported", c->path, key, type);
    NB_CHECK(member(&oc, "factor"), ROPE_HINT, "%s: field '%s' (%s) has no 'factor'", c->path, key, type);
    m->rope_factor = num_field(&oc, "factor", 1.0);
    if (m->rope_scaling != NB_ROPE_LLAMA3) return;
    static const char *const need[] = {"low_freq_factor", "high_freq_factor", "original_max_position_embeddings"};
    for (int k = 0; k < 3; k++)
        NB_CHECK(member(&oc, need[k]), ROPE_HINT, "%s: field '%s' (llama3) has no '%s'", c->path, key, need[k]);
    m->rope_low_freq_factor = num_field(&oc, "low_freq_factor", 1.0);
    m->rope_high_freq_factor = num_field(&oc, "high_freq_factor", 1.0);
    m->rope_original_ctx = int_field(&oc, "original_max_position_embeddings", 1, 0);
    NB_CHECK(m->rope_high_freq_factor > m->rope_low_freq_factor, ROPE_HINT,
             "%s: field '%s' (llama3): high_freq_factor %g must exceed low_freq_factor %g", c->path, key,
             (double)m->rope_high_freq_factor, (double)m->rope_low_freq_factor);
}

/* rope_theta and the scaling: transformers 4 keeps them in rope_theta and rope_scaling, 5 in
 * rope_parameters (our export writes both); where both are there they must agree. */
static void read_rope(const cfg_in *c, nb_tf_config *m) {
    m->rope_theta = num_field(c, "rope_theta", 10000.0);
    const nb_json *s = member(c, "rope_scaling"), *p = member(c, "rope_parameters");
    if (s) rope_object(c, "rope_scaling", s, m);
    if (!p) return;
    nb_tf_config v4 = *m;
    rope_object(c, "rope_parameters", p, m);
    m->rope_theta = num_field(&(cfg_in){c->path, p}, "rope_theta", m->rope_theta);
    NB_CHECK(!s || (v4.rope_scaling == m->rope_scaling && v4.rope_factor == m->rope_factor &&
                    v4.rope_low_freq_factor == m->rope_low_freq_factor &&
                    v4.rope_high_freq_factor == m->rope_high_freq_factor &&
                    v4.rope_original_ctx == m->rope_original_ctx),
             CFG_HINT, "%s: fields 'rope_scaling' and 'rope_parameters' describe different RoPE scalings", c->path);
}

static void gpt2_config(const cfg_in *c, int seq, nb_tf_config *m) {
    m->arch = NB_ARCH_GPT2;
    m->dim = int_field(c, "n_embd", 1, 0);
    m->layers = int_field(c, "n_layer", 1, 0);
    m->heads = m->kv_heads = int_field(c, "n_head", 1, 0);
    m->ffn = int_field(c, "n_inner", 1, 4 * m->dim);
    int positions = int_field(c, "n_positions", 1, 0);
    /* our position table has --seq rows: the first seq of the checkpoint's */
    NB_CHECK(seq <= positions, "pass --seq at most n_positions", "%s: --seq %d exceeds n_positions %d (the position table's rows)",
             c->path, seq, positions);
    m->seq = seq ? seq : positions;
    m->norm_eps = num_field(c, "layer_norm_epsilon", 1e-5);
    m->tied = bool_field(c, "tie_word_embeddings", 1);
    const char *act = str_field(c, "activation_function", "gelu_new");
    NB_CHECK(!strcmp(act, "gelu_new") || !strcmp(act, "gelu_pytorch_tanh"), CFG_HINT,
             "%s: field 'activation_function' is '%s': only the tanh GELU (gelu_new) is supported", c->path, act);
    want_bool(c, "scale_attn_weights", 1, 1, "attention without the 1/sqrt(head size) scale is not supported");
    want_bool(c, "scale_attn_by_inverse_layer_idx", 0, 0, "per-layer attention scaling is not supported");
    want_bool(c, "add_cross_attention", 0, 0, "cross-attention is not supported");
}

static void llama_config(const cfg_in *c, int seq, int mistral, nb_tf_config *m) {
    m->arch = NB_ARCH_LLAMA;
    refuse_moe(c);
    m->dim = int_field(c, "hidden_size", 1, 0);
    m->ffn = int_field(c, "intermediate_size", 1, 0);
    m->layers = int_field(c, "num_hidden_layers", 1, 0);
    m->heads = int_field(c, "num_attention_heads", 1, 0);
    m->kv_heads = int_field(c, "num_key_value_heads", 1, m->heads);
    /* transformers takes the head size from head_dim where the config sets it (q_proj then has
     * heads * head_dim rows and o_proj as many columns, whatever hidden_size is), else
     * hidden_size / heads, which must then divide */
    int split = m->dim % m->heads == 0 ? m->dim / m->heads : 0;
    int head_dim = int_field(c, "head_dim", 1, split);
    m->head_dim = head_dim == split ? 0 : head_dim;
    m->norm_eps = num_field(c, "rms_norm_eps", 1e-6);
    read_rope(c, m);
    m->tied = bool_field(c, "tie_word_embeddings", 0);
    const char *act = str_field(c, "hidden_act", "silu");
    NB_CHECK(!strcmp(act, "silu"), CFG_HINT, "%s: field 'hidden_act' is '%s': only silu (SwiGLU) is supported", c->path, act);
    want_bool(c, "attention_bias", 0, 0, "attention biases are not supported (Llama layouts have none)");
    want_bool(c, "mlp_bias", 0, 0, "MLP biases are not supported (Llama layouts have none)");
    int positions = member(c, "max_position_embeddings") ? int_field(c, "max_position_embeddings", 1, 0) : 0;
    NB_CHECK(seq || positions > 0, "pass --seq N", "%s: no max_position_embeddings to take the sequence length from", c->path);
    m->seq = seq ? seq : positions;
    /* sliding-window attention equals full causal attention while the window covers the sequence */
    int window = mistral ? int_field(c, "sliding_window", 1, INT_MAX) : INT_MAX;
    NB_CHECK(window >= m->seq, "pass --seq at most sliding_window (nobubble's attention is full causal)",
             "%s: sliding_window %d is shorter than the sequence length %d: sliding-window attention is not supported",
             c->path, window, m->seq);
}

/* Qwen2 is Llama's math with q/k/v biases; Qwen3 has no biases, a per-head RMSNorm of q and of k
 * before RoPE (eps rms_norm_eps) and head_dim 128 where config.json does not set it (Qwen3Config's
 * default). Their sliding window is off unless use_sliding_window (max_window_layers only says
 * which layers use it then), and equals full causal attention while it covers the sequence. */
static void qwen_config(const cfg_in *c, int qwen3, nb_tf_config *m) {
    if (qwen3) {
        int head_dim = int_field(c, "head_dim", 1, 128);
        m->head_dim = m->dim % m->heads == 0 && head_dim == m->dim / m->heads ? 0 : head_dim;
        m->qk_norm = 1;
    } else {
        m->qkv_bias = 1;
    }
    if (!bool_field(c, "use_sliding_window", 0)) return;
    int window = int_field(c, "sliding_window", 1, 0);
    NB_CHECK(window >= m->seq, "pass --seq at most sliding_window (nobubble's attention is full causal)",
             "%s: use_sliding_window is true and sliding_window %d is shorter than the sequence length %d: "
             "sliding-window attention is not supported",
             c->path, window, m->seq);
}

/* The class config.json names (architectures[0], else model_type). */
static int arch_of(const cfg_in *c) {
    static const char *const classes[] = {"GPT2LMHeadModel", "LlamaForCausalLM", "MistralForCausalLM",
                                          "Qwen2ForCausalLM", "Qwen3ForCausalLM"};
    static const char *const types[] = {"gpt2", "llama", "mistral", "qwen2", "qwen3"};
    const nb_json *a = member(c, "architectures");
    const char *cls = NULL, *type = str_field(c, "model_type", NULL);
    if (a) {
        NB_CHECK(a->type == NB_JSON_ARR && a->len == 1 && a->items[0].type == NB_JSON_STR, CFG_HINT,
                 "%s: field 'architectures' must be a list of one class name", c->path);
        cls = a->items[0].str;
    }
    NB_CHECK(cls || type, CFG_HINT, "%s: neither 'architectures' nor 'model_type' says what model this is", c->path);
    for (int k = 0; k < (int)(sizeof types / sizeof types[0]); k++) {
        if (cls ? strcmp(cls, classes[k]) : strcmp(type, types[k])) continue;
        NB_CHECK(!type || !strcmp(type, types[k]), CFG_HINT, "%s: field 'model_type' is '%s' but architectures names %s",
                 c->path, type, classes[k]);
        return k;
    }
    if (cls) nb_fail(CFG_HINT, "%s: field 'architectures': %s is not supported", c->path, cls);
    nb_fail(CFG_HINT, "%s: field 'model_type': '%s' is not supported", c->path, type);
}

static void read_config(const char *dir, int seq, nb_tf_config *cfg) {
    char path[NB_PATH_MAX + 32];
    NB_CHECK(strlen(dir) < NB_PATH_MAX, "choose a shorter path", "--init-from path too long: %s", dir);
    snprintf(path, sizeof path, "%s/config.json", dir);
    NB_CHECK(nb_file_exists(path), "--init-from takes a transformers model directory (config.json + model.safetensors)",
             "%s: no such file", path);
    nb_json *j = load_json(path);
    cfg_in c = {path, j};
    NB_CHECK(j->type == NB_JSON_OBJ, CFG_HINT, "%s: must be a JSON object", path);
    NB_CHECK(!member(&c, "quantization_config"), "import an unquantized (F32, BF16 or F16) checkpoint",
             "%s: field 'quantization_config' is set: quantized checkpoints are not supported", path);
    int kind = arch_of(&c);
    memset(cfg, 0, sizeof *cfg);
    if (kind == 0)
        gpt2_config(&c, seq, cfg);
    else
        llama_config(&c, seq, kind == 2, cfg);
    if (kind >= 3) qwen_config(&c, kind == 4, cfg);
    cfg->vocab = int_field(&c, "vocab_size", 2, 0);
    NB_CHECK(cfg->vocab <= NB_TF_MAX_VOCAB, "nobubble takes vocabularies up to 16777216",
             "%s: field 'vocab_size' is %d, more than %d", path, cfg->vocab, NB_TF_MAX_VOCAB);
    NB_CHECK(cfg->arch == NB_ARCH_GPT2 || cfg->rope_theta > 0, CFG_HINT, "%s: no rope_theta", path);
    if (cfg->arch == NB_ARCH_GPT2) cfg->rope_theta = 10000.0f; /* unused by GPT-2; kept like a preset's */
    static const char *const names[] = {"gpt2", "llama", "mistral", "qwen2", "qwen3"};
    snprintf(cfg->preset, sizeof cfg->preset, "hf-%s", names[kind]);
    nb_json_free(j);
    nb_tf_config_finalize(cfg);
}

void nb_hf_import_config(const char *dir, int seq, nb_tf_config *cfg) {
    int was = nb_fail_set_exit_code(2);
    read_config(dir, seq, cfg);
    nb_fail_set_exit_code(was);
}

/* ---------------------------------------------------------------- the safetensors files */

/* One file, or the shards a model.safetensors.index.json names (its weight_map: tensor -> file). */
typedef struct {
    char dir[NB_PATH_MAX];
    int nfiles;
    nb_st_file **files;
    nb_json *index;          /* NULL for one file */
    const nb_json *weight_map;
} hf_src;

/* A shard's name: a plain file name inside the directory (no path, nothing hidden). */
static void check_shard_name(const char *index, const char *tensor, const char *name) {
    NB_CHECK(name[0] && name[0] != '.' && !strchr(name, '/') && !strchr(name, '\\'), FILE_HINT,
             "%s: weight_map['%s'] is '%s', not a file name in the directory", index, tensor, name);
}

static int shard_of(const hf_src *s, const char *name) {
    for (int i = 0; i < s->nfiles; i++) {
        const char *p = nb_st_path(s->files[i]), *base = strrchr(p, '/');
        if (!strcmp(base ? base + 1 : p, name)) return i;
    }
    return -1;
}

static void open_sharded(hf_src *s, const char *index) {
    s->index = load_json(index);
    NB_CHECK(s->index->type == NB_JSON_OBJ, FILE_HINT, "%s: must be a JSON object", index);
    s->weight_map = nb_json_get(s->index, "weight_map");
    NB_CHECK(s->weight_map && s->weight_map->type == NB_JSON_OBJ && s->weight_map->len > 0, FILE_HINT,
             "%s: field 'weight_map' must be an object naming each tensor's file", index);
    const nb_json *w = s->weight_map;
    s->files = nb_calloc(w->len, sizeof *s->files, "safetensors shards");
    char path[2 * NB_PATH_MAX];
    for (size_t i = 0; i < w->len; i++) {
        NB_CHECK(w->items[i].type == NB_JSON_STR, FILE_HINT, "%s: weight_map['%s'] must be a file name", index, w->keys[i]);
        check_shard_name(index, w->keys[i], w->items[i].str);
        if (shard_of(s, w->items[i].str) >= 0) continue;
        snprintf(path, sizeof path, "%s/%s", s->dir, w->items[i].str);
        s->files[s->nfiles++] = nb_st_open(path);
    }
}

static void src_open(hf_src *s, const char *dir) {
    memset(s, 0, sizeof *s);
    snprintf(s->dir, sizeof s->dir, "%s", dir);
    char one[NB_PATH_MAX + 64], index[NB_PATH_MAX + 64];
    snprintf(one, sizeof one, "%s/model.safetensors", dir);
    snprintf(index, sizeof index, "%s/model.safetensors.index.json", dir);
    /* transformers' own order: the single file first */
    if (nb_file_exists(one)) {
        s->files = nb_calloc(1, sizeof *s->files, "safetensors file");
        s->files[s->nfiles++] = nb_st_open(one);
        return;
    }
    NB_CHECK(nb_file_exists(index), "save the model with safe_serialization (pytorch_model.bin is not read)",
             "%s holds neither model.safetensors nor model.safetensors.index.json", dir);
    open_sharded(s, index);
}

static void src_close(hf_src *s) {
    for (int i = 0; i < s->nfiles; i++) nb_st_close(s->files[i]);
    free(s->files);
    nb_json_free(s->index);
}

/* A tensor by name and its file, or NULL. */
static const nb_st_tensor *src_find(const hf_src *s, const char *name, const nb_st_file **file) {
    if (!s->index) {
        *file = s->files[0];
        return nb_st_find(s->files[0], name);
    }
    const nb_json *f = nb_json_get(s->weight_map, name);
    if (!f) return NULL;
    *file = s->files[shard_of(s, f->str)];
    const nb_st_tensor *t = nb_st_find(*file, name);
    NB_CHECK(t, FILE_HINT, "model.safetensors.index.json puts tensor '%s' in %s, which does not hold it", name,
             nb_st_path(*file));
    return t;
}

/* Every tensor name the checkpoint holds (the index's, or the file's). */
static int src_count(const hf_src *s) { return s->index ? (int)s->weight_map->len : nb_st_count(s->files[0]); }
static const char *src_name(const hf_src *s, int i) {
    return s->index ? s->weight_map->keys[i] : nb_st_at(s->files[0], i)->name;
}

/* ---------------------------------------------------------------- tensors */

/* GPT-2 checkpoints come with or without the "transformer." prefix (GPT2Model's own saves, the
 * original "gpt2" repository); from_pretrained takes both. */
static const nb_st_tensor *lookup(const hf_src *s, const nb_tf_model *m, const char *name, const nb_st_file **file) {
    const nb_st_tensor *t = src_find(s, name, file);
    const char *pre = "transformer.";
    if (!t && m->cfg.arch == NB_ARCH_GPT2 && !strncmp(name, pre, strlen(pre))) t = src_find(s, name + strlen(pre), file);
    return t;
}

static int same_name(const nb_tf_model *m, const char *ours, const char *theirs) {
    const char *pre = "transformer.";
    if (!strcmp(ours, theirs)) return 1;
    return m->cfg.arch == NB_ARCH_GPT2 && !strncmp(ours, pre, strlen(pre)) && !strcmp(ours + strlen(pre), theirs);
}

static int ends_with(const char *s, const char *tail) {
    size_t n = strlen(s), k = strlen(tail);
    return n >= k && !strcmp(s + n - k, tail);
}

/* Tensors a checkpoint may hold that carry no parameter of ours: GPT-2's attention-mask buffers,
 * old Llama saves' RoPE frequencies, and the head of a tied model (the embedding, again). */
static int ignorable(const nb_tf_model *m, const char *name) {
    if (m->cfg.tied && !strcmp(name, "lm_head.weight")) return 1;
    if (m->cfg.arch == NB_ARCH_GPT2) return ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias");
    return ends_with(name, ".rotary_emb.inv_freq");
}

/* Nothing in the checkpoint goes unread: a tensor we would drop (a Llama bias, a layer beyond
 * num_hidden_layers) means config.json does not describe these weights. */
static void check_unclaimed(const hf_src *s, const nb_tf_model *m, const nb_hf_tensor *t, int n) {
    for (int i = 0; i < src_count(s); i++) {
        const char *name = src_name(s, i);
        int claimed = ignorable(m, name);
        for (int k = 0; k < n && !claimed; k++) claimed = same_name(m, t[k].name, name);
        if (claimed) continue;
        NB_CHECK(m->cfg.arch == NB_ARCH_GPT2 || !ends_with(name, ".bias"), CFG_HINT,
                 "%s: tensor '%s': a %s has no such bias", s->dir, name, nb_hf_class_name(m));
        nb_fail(CFG_HINT, "%s: tensor '%s' is not part of a %s with this config.json", s->dir, name, nb_hf_class_name(m));
    }
}

/* The HF tensor's rows the file must hold: the table's, except GPT-2's position table, whose
 * first --seq rows of n_positions are taken. */
static void check_tensor(const nb_st_file *f, const nb_st_tensor *st, const nb_hf_tensor *t, int prefix_rows) {
    char a[128], b[128];
    int ok = st->ndim == t->ndim;
    for (int d = 0; ok && d < t->ndim; d++) ok = st->shape[d] == t->shape[d] || (d == 0 && prefix_rows && st->shape[0] >= t->shape[0]);
    NB_CHECK(ok, CFG_HINT, "%s: tensor '%s' has shape %s, config.json makes it %s%s", nb_st_path(f), st->name,
             nb_st_shape_str(a, sizeof a, st->ndim, st->shape), nb_st_shape_str(b, sizeof b, t->ndim, t->shape),
             prefix_rows ? " (or more rows)" : "");
    NB_CHECK(st->dtype == NB_F32 || st->dtype == NB_BF16 || st->dtype == NB_F16, "convert the checkpoint to F32, BF16 or F16",
             "%s: tensor '%s' has dtype %s; nobubble imports F32, BF16 or F16", nb_st_path(f), st->name,
             nb_dtype_name(st->dtype));
}

static float bf16_value(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* IEEE half to float, exactly (every half is a float). */
static float f16_value(uint16_t h) {
    int e = (h >> 10) & 31, mant = h & 1023;
    float sign = h & 0x8000 ? -1.0f : 1.0f;
    if (e == 0) return sign * ldexpf((float)mant, -24);
    if (e == 31) return mant ? NAN : sign * INFINITY;
    return sign * ldexpf((float)(1024 + mant), e - 25);
}

/* Element i of a tensor in the mapping (unaligned: safetensors aligns nothing). */
static float value_at(const unsigned char *data, nb_dtype dt, size_t i) {
    if (dt == NB_F32) {
        float x;
        memcpy(&x, data + 4 * i, 4);
        return x;
    }
    uint16_t h;
    memcpy(&h, data + 2 * i, 2);
    return dt == NB_BF16 ? bf16_value(h) : f16_value(h);
}

/* The HF tensor into our parameter rows: straight, or transposed (GPT-2's Conv1D holds [in, out]
 * where we hold [out, in]). Reads the mapping and writes the slab, nothing in between. */
static void copy_tensor(const nb_st_file *f, const nb_st_tensor *st, const nb_hf_tensor *t, const nb_tf_model *m, float *slab,
                        size_t slab0) {
    const nb_param *p = &m->params[t->param];
    size_t cols = p->ndim > 1 ? (size_t)p->shape[1] : 1, rows = (size_t)t->rows;
    float *dst = slab + (p->offset - slab0) + (size_t)t->row0 * cols;
    const unsigned char *src = st->data;
    nb_st_verify(f, st); /* nobubble's own exports carry checksums */
    if (t->transpose) {
#pragma omp parallel for schedule(static) if (rows * cols > (1u << 20))
        for (long c = 0; c < (long)cols; c++)
            for (size_t r = 0; r < rows; r++) dst[r * cols + (size_t)c] = value_at(src, st->dtype, (size_t)c * rows + r);
    } else {
        size_t n = rows * cols;
#pragma omp parallel for schedule(static) if (n > (1u << 20))
        for (long k = 0; k < (long)n; k++) dst[k] = value_at(src, st->dtype, (size_t)k);
    }
    for (size_t k = 0; k < rows * cols; k++)
        NB_CHECK(isfinite(dst[k]), "import a checkpoint with finite weights", "%s: tensor '%s' holds a non-finite value at element %zu",
                 nb_st_path(f), st->name, k);
}

/* Check every tensor (slab NULL) or load them into the slab: all of them (group -1), or group
 * g's into a slab that starts at the group (offsets from group_offset[g]). */
static void walk(const char *dir, const nb_tf_model *m, float *slab, int group) {
    hf_src s;
    src_open(&s, dir);
    nb_hf_tensor *t;
    int n = nb_hf_tensors(m, &t);
    check_unclaimed(&s, m, t, n);
    for (int i = 0; i < n; i++) {
        if (group >= 0 && m->params[t[i].param].group != group) continue;
        const nb_st_file *f = NULL;
        const nb_st_tensor *st = lookup(&s, m, t[i].name, &f);
        NB_CHECK(st, CFG_HINT, "%s: tensor '%s' is missing (config.json describes a %s with it)", dir, t[i].name,
                 nb_hf_class_name(m));
        check_tensor(f, st, &t[i], t[i].param == m->global_idx[NB_TF_WPE]);
        if (slab) copy_tensor(f, st, &t[i], m, slab, group >= 0 ? m->group_offset[group] : 0);
    }
    free(t);
    src_close(&s);
}

void nb_hf_import_check(const char *dir, const nb_tf_model *m) {
    int was = nb_fail_set_exit_code(2);
    walk(dir, m, NULL, -1);
    nb_fail_set_exit_code(was);
}

void nb_hf_import(const char *dir, const nb_tf_model *m, float *params) {
    int was = nb_fail_set_exit_code(2);
    /* everything the checkpoint does not set is zero: the vocabulary's padding rows, the gaps
     * between tensors */
    nb_zero_par(params, m->total * sizeof(float));
    walk(dir, m, params, -1);
    nb_fail_set_exit_code(was);
}

void nb_hf_import_group(const char *dir, const nb_tf_model *m, int g, float *dst) {
    int was = nb_fail_set_exit_code(2);
    nb_zero_par(dst, m->group_numel[g] * sizeof(float));
    walk(dir, m, dst, g);
    nb_fail_set_exit_code(was);
}

nb_dtype nb_hf_import_dtype(const char *dir, const nb_tf_model *m) {
    int was = nb_fail_set_exit_code(2);
    hf_src s;
    src_open(&s, dir);
    nb_hf_tensor *t;
    int n = nb_hf_tensors(m, &t), count[NB_DTYPE_COUNT] = {0};
    for (int i = 0; i < n; i++) {
        const nb_st_file *f = NULL;
        const nb_st_tensor *st = lookup(&s, m, t[i].name, &f);
        if (st) count[st->dtype]++;
    }
    nb_dtype most = NB_F32;
    for (int d = 0; d < NB_DTYPE_COUNT; d++)
        if (count[d] > count[most]) most = (nb_dtype)d;
    free(t);
    src_close(&s);
    nb_fail_set_exit_code(was);
    return most;
}

uint32_t nb_tf_base_group(const nb_tf_model *m, const char *dir, uint64_t seed, const nb_tf_filler *fill, int g,
                          float *buf) {
    if (dir && dir[0])
        nb_hf_import_group(dir, m, g, buf);
    else
        nb_tf_init_group(m, g, buf, seed, fill);
    return nb_crc32c_par(NULL, buf, m->group_numel[g] * sizeof(float));
}

uint64_t nb_tf_base_by_groups(const nb_tf_model *m, const char *dir, uint64_t seed, const nb_tf_filler *fill,
                              void (*sink)(void *self, int group, const float *w), void *self) {
    size_t most = 0;
    for (int g = 0; g < m->ngroups; g++) most = m->group_numel[g] > most ? m->group_numel[g] : most;
    float *buf = nb_malloc(most ? most * sizeof(float) : 1, "a group of the LoRA base");
    uint32_t crc = 0;
    for (int g = 0; g < m->ngroups; g++) {
        /* the groups tile the slab in order, so the chained CRC is the whole slab's */
        NB_ASSERT(m->group_offset[g] == (g ? m->group_offset[g - 1] + m->group_numel[g - 1] : 0));
        crc = nb_crc32c_combine(crc, nb_tf_base_group(m, dir, seed, fill, g, buf), m->group_numel[g] * sizeof(float));
        if (sink) sink(self, g, buf);
    }
    free(buf);
    return 1 + (uint64_t)crc;
}
