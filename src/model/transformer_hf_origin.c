/* Where an imported model came from (model/transformer_hf.h nb_hf_origin): read from HF_DIR at
 * --init-from, kept in state.json's model.hf, written back by the export. */
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "io/json.h"
#include "model/transformer_hf.h"

static const char *const dtype_names[] = {[NB_F32] = "f32", [NB_BF16] = "bf16", [NB_F16] = "f16"};

int nb_hf_dtype_parse(const char *name) {
    for (int d = NB_F32; d <= NB_F16; d++)
        if (!strcmp(name, dtype_names[d])) return d;
    return -1;
}

const char *nb_hf_dtype_name(nb_dtype dtype) { return dtype <= NB_F16 ? dtype_names[dtype] : "?"; }

/* The class of a config.json that names only its model_type (old saves). */
static const char *class_of_type(const char *type) {
    static const char *const map[][2] = {
        {"gpt2", "GPT2LMHeadModel"}, {"llama", "LlamaForCausalLM"}, {"mistral", "MistralForCausalLM"},
        {"qwen2", "Qwen2ForCausalLM"}, {"qwen3", "Qwen3ForCausalLM"}};
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (!strcmp(type, map[i][0])) return map[i][1];
    return "";
}

/* nb_hf_import_config has read this config.json and accepted it: what is read here is there. */
void nb_hf_origin_import(const char *dir, const nb_tf_model *m, nb_hf_origin *h) {
    int was = nb_fail_set_exit_code(2);
    char path[NB_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/config.json", dir);
    nb_json *j = nb_json_load_file(path);
    memset(h, 0, sizeof *h);
    const nb_json *a = nb_json_get(j, "architectures");
    const char *type = nb_json_get_str(j, "model_type", "");
    const char *cls = a && a->type == NB_JSON_ARR && a->len == 1 && a->items[0].type == NB_JSON_STR ? a->items[0].str
                                                                                                   : class_of_type(type);
    snprintf(h->cls, sizeof h->cls, "%s", cls);
    snprintf(h->model_type, sizeof h->model_type, "%s", type);
    snprintf(h->dtype, sizeof h->dtype, "%s", nb_hf_dtype_name(nb_hf_import_dtype(dir, m)));
    nb_sbuf b = {0};
    nb_json_spell(&b, j);
    NB_CHECK(b.len < sizeof h->config, "remove the fields transformers does not need from config.json",
             "%s: %zu bytes, more than the %d nobubble keeps to write it back on export", path, b.len, NB_HF_CONFIG_MAX - 1);
    memcpy(h->config, b.data, b.len + 1);
    nb_sbuf_free(&b);
    nb_json_free(j);
    nb_fail_set_exit_code(was);
}

void nb_hf_origin_write(nb_json_writer *w, const nb_hf_origin *h) {
    if (!h->cls[0]) return;
    nb_json_key(w, "hf");
    nb_json_begin_obj(w);
    nb_json_kstr(w, "class", h->cls);
    nb_json_kstr(w, "model_type", h->model_type);
    nb_json_kstr(w, "dtype", h->dtype);
    nb_json_key(w, "config");
    nb_json_raw(w, h->config);
    nb_json_end_obj(w);
}

void nb_hf_origin_read(const nb_json *model, nb_hf_origin *h) {
    static const char *damaged = "the checkpoint is damaged: resume from an earlier copy of the run directory";
    memset(h, 0, sizeof *h);
    const nb_json *hf = nb_json_get(model, "hf");
    if (!hf) return; /* trained from scratch, or a checkpoint from before imports kept their origin */
    const char *cls = nb_json_req_str(hf, "class"), *type = nb_json_req_str(hf, "model_type"),
               *dtype = nb_json_req_str(hf, "dtype");
    NB_CHECK(cls[0] && strlen(cls) < sizeof h->cls && strlen(type) < sizeof h->model_type && nb_hf_dtype_parse(dtype) >= 0,
             damaged, "state.json: model.hf: class '%s', model_type '%s' or dtype '%s' is not one an import writes", cls, type,
             dtype);
    nb_sbuf b = {0};
    nb_json_spell(&b, nb_json_req(hf, "config", NB_JSON_OBJ));
    NB_CHECK(b.len < sizeof h->config, damaged, "state.json: model.hf.config is over %d bytes", NB_HF_CONFIG_MAX - 1);
    snprintf(h->cls, sizeof h->cls, "%s", cls);
    snprintf(h->model_type, sizeof h->model_type, "%s", type);
    snprintf(h->dtype, sizeof h->dtype, "%s", dtype);
    memcpy(h->config, b.data, b.len + 1);
    nb_sbuf_free(&b);
}
