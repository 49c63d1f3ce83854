/* A LoRA run as a PEFT adapter directory (transformer_hf.h): adapter_config.json and
 * adapter_model.safetensors, the names and shapes peft's PeftModel.from_pretrained reads. */
#include <string.h>

#include "core.h"
#include "io/atomic.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "model/transformer_hf.h"

/* peft's state-dict name of a site's A or B in layer l (the adapter name dropped, as peft saves) */
static void peft_name(const nb_tf_model *m, int l, int s, int ab, char *out, size_t cap) {
    const char *parent, *mod = nb_tf_lora_hf_module(m->cfg.arch, s, &parent);
    if (m->cfg.arch == NB_ARCH_GPT2)
        snprintf(out, cap, "base_model.model.transformer.h.%d.%s.%s.lora_%s.weight", l, parent, mod, ab ? "B" : "A");
    else
        snprintf(out, cap, "base_model.model.model.layers.%d.%s.%s.lora_%s.weight", l, parent, mod, ab ? "B" : "A");
}

/* target_modules: the HF module names; GPT-2's two c_proj are told apart by their parent when only
 * one of them is adapted (peft matches a target as a suffix of the module's dotted name) */
static void write_targets(const nb_tf_model *m, const nb_tf_lora *lo, nb_json_writer *w) {
    int gpt2 = m->cfg.arch == NB_ARCH_GPT2;
    unsigned both = 1u << NB_LORA_O | 1u << NB_LORA_DOWN;
    nb_json_key(w, "target_modules");
    nb_json_begin_arr(w);
    for (int s = 0; s < NB_LORA_SITES; s++) {
        if (!(lo->sites & 1u << s)) continue;
        const char *parent, *mod = nb_tf_lora_hf_module(m->cfg.arch, s, &parent);
        char name[64];
        if (gpt2 && (s == NB_LORA_O || s == NB_LORA_DOWN) && (lo->sites & both) != both)
            snprintf(name, sizeof name, "%s.%s", parent, mod);
        else if (gpt2 && s == NB_LORA_DOWN)
            continue; /* "c_proj", written once for both */
        else
            snprintf(name, sizeof name, "%s", mod);
        nb_json_str(w, name);
    }
    nb_json_end_arr(w);
}

int nb_hf_export_lora(const char *out_dir, const nb_tf_model *m, const nb_tf_lora *lo, const float *lslab,
                      const char *base_ref) {
    char path[4096], name[160];
    NB_CHECK(strlen(out_dir) < sizeof path - 32, "choose a shorter output path", "output path too long: %s", out_dir);
    nb_mkdir_p(out_dir);
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", out_dir);
    nb_st_writer *st = nb_st_begin(path);
    nb_st_meta(st, "format", "pt");
    nb_st_meta(st, "producer", "nobubble");
    int n = 0;
    for (int l = 0; l < m->cfg.layers; l++)
        for (int s = 0; s < NB_LORA_SITES; s++)
            for (int ab = 0; ab < 2; ab++) {
                int i = lo->idx[l][s][ab];
                if (i < 0) continue;
                const nb_param *p = &lo->params[i];
                peft_name(m, l, s, ab, name, sizeof name);
                nb_st_add(st, name, NB_F32, 2, p->shape, lslab + p->offset);
                n++;
            }
    nb_st_end(st);

    nb_json_writer w;
    nb_json_writer_init(&w, 2);
    nb_json_begin_obj(&w);
    nb_json_kstr(&w, "peft_type", "LORA");
    nb_json_kstr(&w, "task_type", "CAUSAL_LM");
    nb_json_kstr(&w, "base_model_name_or_path", base_ref);
    nb_json_kint(&w, "r", lo->r);
    nb_json_knum(&w, "lora_alpha", lo->alpha);
    nb_json_knum(&w, "lora_dropout", 0.0);
    write_targets(m, lo, &w);
    nb_json_kstr(&w, "bias", "none");
    /* GPT-2's projections are Conv1D ([in, out]): peft sets this for them itself, and says so */
    nb_json_kbool(&w, "fan_in_fan_out", m->cfg.arch == NB_ARCH_GPT2);
    nb_json_kbool(&w, "inference_mode", 1);
    nb_json_kbool(&w, "init_lora_weights", 1);
    nb_json_kbool(&w, "use_rslora", 0);
    nb_json_kbool(&w, "use_dora", 0);
    nb_json_key(&w, "modules_to_save");
    nb_json_null(&w);
    nb_json_end_obj(&w);
    snprintf(path, sizeof path, "%s/adapter_config.json", out_dir);
    nb_write_file_atomic(path, nb_json_text(&w), nb_json_len(&w));
    nb_json_writer_free(&w);
    return n;
}
