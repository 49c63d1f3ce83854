/* nobubble export: a checkpoint as a Hugging Face model directory (model/transformer_hf.h). */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "args.h"
#include "commands.h"
#include "core.h"
#include "io/atomic.h"
#include "io/crc32c.h"
#include "family/family.h"
#include "family/transformer.h"
#include "model/transformer_hf.h"
#include "run/ckpt.h"
#include "run/run.h"
#include "family/seqctr.h"

static const char *EXPORT_SUMMARY =
    "Transformers: write a checkpoint as a Hugging Face model directory (--hf OUT): OUT/config.json and\n"
    "OUT/model.safetensors (the master weights in --dtype). GPT-2 presets load with transformers'\n"
    "GPT2LMHeadModel.from_pretrained(OUT), Llama presets with LlamaForCausalLM.from_pretrained(OUT); a\n"
    "run started with --init-from HF_DIR exports as the class it came from (MistralForCausalLM, ...),\n"
    "with the fields of its config.json nobubble does not model written back unchanged, and the\n"
    "tokenizer files of its --tokenizer folder (tokenizer.json, tokenizer_config.json,\n"
    "special_tokens_map.json, generation_config.json: those present) copied, so AutoTokenizer and\n"
    "AutoModelForCausalLM load OUT. Existing files of those names in OUT are replaced; each is written\n"
    "under a temporary name and swapped in. seqctr: write the model's tensors (dense weights and every\n"
    "embedding table, fp32, the names of the README's seqctr section) to one safetensors file\n"
    "(--out FILE), crash-safely. A LoRA run (--lora) exports as a PEFT adapter directory\n"
    "(adapter_config.json, adapter_model.safetensors) whose base_model_name_or_path is the run's\n"
    "--init-from folder (a run from nobubble's seeded init writes that base to OUT/base first), or\n"
    "with --merge as the merged model (W + alpha / r * B A) in the Hugging Face layout above.";

/* The files AutoTokenizer (and generate's defaults) read beside the model. */
static const char *const TOKENIZER_FILES[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                              "generation_config.json", NULL};

/* Each tokenizer file from the run's tokenizer folder, else from the imported model's folder
 * (generation_config.json lives there). Returns the number copied. */
static int copy_tokenizer(const nb_train_opts *o, const char *out) {
    const char *from[] = {o->tokenizer, o->init_source};
    int copied = 0;
    for (int k = 0; k < 2; k++)
        if (from[k][0] && !nb_file_exists(from[k]))
            fprintf(stderr, "warning: the run's %s folder %s is gone: its files are not copied\n", k ? "--init-from" : "--tokenizer",
                    from[k]);
    for (const char *const *f = TOKENIZER_FILES; *f; f++)
        for (int k = 0; k < 2; k++) {
            char src[2 * NB_PATH_MAX], dst[2 * NB_PATH_MAX];
            snprintf(src, sizeof src, "%s/%s", from[k], *f);
            if (!from[k][0] || !nb_file_exists(src)) continue;
            size_t len;
            char *text = nb_read_file(src, (size_t)1 << 30, &len, "check the tokenizer folder the run names");
            snprintf(dst, sizeof dst, "%s/%s", out, *f);
            nb_write_file_atomic(dst, text, len);
            free(text);
            copied++;
            break;
        }
    return copied;
}

/* Two paths name the same existing directory. */
static int same_dir(const char *a, const char *b) {
    char ra[PATH_MAX], rb[PATH_MAX];
    return realpath(a, ra) && realpath(b, rb) && !strcmp(ra, rb);
}

/* Nonzero padding rows of the embedding or head are not exported (HF tables have exactly vocab
 * rows). nobubble keeps them at zero; anything else means the slab was written by other code. */
static void check_padding(const nb_tf_model *m, const float *slab, const char *dir) {
    for (int which = NB_TF_WTE; which <= NB_TF_LM_HEAD; which += NB_TF_LM_HEAD - NB_TF_WTE) {
        int i = m->global_idx[which];
        if (i < 0) continue;
        const nb_param *p = &m->params[i];
        size_t real = (size_t)m->cfg.vocab * (size_t)p->shape[1];
        for (size_t k = real; k < p->numel; k++)
            if (slab[p->offset + k] != 0.0f) {
                fprintf(stderr, "note: %s in %s has nonzero padding rows (>= vocab %d); they are not exported\n", p->name,
                        dir, m->cfg.vocab);
                break;
            }
    }
}

void nb_opts_from_ckpt(const char *dir, int batch, int threads, const char *device, nb_train_opts *o, char *resolved,
                       size_t cap);

/* seqctr: the model's tensors from a forward-only run of the checkpoint on the CPU */
static void check_base_crc(const nb_train_opts *o, uint64_t crc) {
    NB_CHECK(!o->lora_base_crc || o->lora_base_crc == crc, "put back the base the run was trained on",
             "the LoRA run's base (%s) is not the one it was trained on: its weights changed since",
             o->init_source[0] ? o->init_source : "nobubble's seeded init");
}

/* The --init-from folder a LoRA run started from, read group by group: its CRC. */
static uint64_t base_from_disk(const nb_train_opts *o, const nb_tf_model *m) {
    NB_CHECK(nb_file_exists(o->init_source), "put the base model back where the run found it (state.json's init_source)",
             "the LoRA run's base %s is gone", o->init_source);
    return nb_tf_base_by_groups(m, o->init_source, o->seed, NULL, NULL, NULL);
}

/* The merged model one group at a time (nb_hf_export_by_groups): the base's group (read or drawn),
 * its layer's adapters added; the base's CRC is chained as the groups come and checked at the last,
 * before the file is committed. */
typedef struct {
    const nb_train_opts *o;
    const nb_tf_model *m;
    const nb_tf_lora *lo;
    const float *ls;
    float *buf;
    int g;
    uint32_t crc;
} merged_src;

static const float *merged_group(void *self, int g) {
    merged_src *s = self;
    const nb_tf_model *m = s->m;
    while (s->g < g) { /* a group no tensor reads still counts in the CRC */
        int k = ++s->g;
        size_t bytes = m->group_numel[k] * sizeof(float);
        s->crc = nb_crc32c_combine(s->crc, nb_tf_base_group(m, s->o->init_source, s->o->seed, NULL, k, s->buf), bytes);
        if (k >= 1 && k <= m->cfg.layers) nb_tf_lora_merge_layer(m, s->lo, k - 1, s->buf, s->ls);
        if (k == m->ngroups - 1) check_base_crc(s->o, 1 + (uint64_t)s->crc);
    }
    NB_ASSERT(s->g == g);
    return s->buf;
}

static int export_merged(const char *out, const nb_train_opts *o, const nb_tf_model *m, const nb_tf_lora *lo,
                         const float *ls, const nb_hf_export_opts *x) {
    if (o->init_source[0])
        NB_CHECK(nb_file_exists(o->init_source), "put the base model back where the run found it (state.json's init_source)",
                 "the LoRA run's base %s is gone", o->init_source);
    size_t most = 0;
    for (int g = 0; g < m->ngroups; g++) most = m->group_numel[g] > most ? m->group_numel[g] : most;
    merged_src s = {o, m, lo, ls, nb_aligned_alloc(most * sizeof(float), "a group of the merged model"), -1, 0};
    int n = nb_hf_export_by_groups(out, m, merged_group, &s, x);
    merged_group(&s, m->ngroups - 1); /* the CRC of every group, even where the last tensor sat earlier */
    free(s.buf);
    return n;
}

/* The base of a LoRA run whole: its reference (the --init-from folder), or nobubble's seeded init. */
static void load_base(const nb_train_opts *o, const nb_tf_model *m, float *slab) {
    if (o->init_source[0]) {
        NB_CHECK(nb_file_exists(o->init_source), "put the base model back where the run found it (state.json's init_source)",
                 "the LoRA run's base %s is gone", o->init_source);
        nb_hf_import(o->init_source, m, slab);
    } else {
        nb_tf_init_weights(m, slab, o->seed, NULL);
    }
    check_base_crc(o, 1 + (uint64_t)nb_crc32c_par(NULL, slab, m->total * sizeof(float)));
}

/* Returns the adapters' slab (from the checkpoint) of lo. */
static float *load_adapters(const char *dir, const nb_train_opts *o, nb_tf_lora *lo) {
    nb_tf_lora_init(lo, &o->model, o->lora_r, o->lora_alpha, nb_tf_lora_parse_targets(o->lora_targets, o->model.arch));
    float *ls = nb_aligned_alloc((lo->total ? lo->total : 1) * sizeof(float), "LoRA adapters");
    nb_ckpt_list list = {0};
    for (int i = 0; i < lo->nparams; i++)
        nb_ckpt_list_add(&list, lo->params[i].name, lo->params[i].ndim, lo->params[i].shape, ls + lo->params[i].offset);
    nb_ckpt_load_lists(dir, &list, NULL);
    nb_ckpt_list_free(&list);
    return ls;
}

/* PEFT's adapter directory; a base that is not on disk (the seeded init) goes to OUT/base */
static int export_adapter(const char *out, const nb_train_opts *o, const nb_tf_model *m, const nb_tf_lora *lo,
                          const float *ls, const float *base, const nb_hf_export_opts *x) {
    char ref[2 * NB_PATH_MAX];
    if (o->init_source[0]) {
        snprintf(ref, sizeof ref, "%s", o->init_source);
    } else {
        char abs[NB_PATH_MAX];
        nb_mkdir_p(out);
        char real[PATH_MAX];
        NB_CHECK(realpath(out, real) && strlen(real) < sizeof abs, "pass a writable --hf directory with a shorter path", "--hf %s: cannot resolve", out);
        snprintf(abs, sizeof abs, "%s", real);
        snprintf(ref, sizeof ref, "%s/base", abs);
        nb_hf_export(ref, m, base, x);
        copy_tokenizer(o, ref);
        fprintf(stderr, "the base (nobubble's init, seed %llu) written to %s\n", (unsigned long long)o->seed, ref);
    }
    return nb_hf_export_lora(out, m, lo, ls, ref);
}

static int export_seqctr(const char *ckpt, const char *file) {
    nb_train_opts o;
    char dir[NB_PATH_MAX];
    nb_opts_from_ckpt(ckpt, 1, 0, "cpu", &o, dir, sizeof dir);
    static nb_run r;
    double t0 = nb_now();
    nb_run_init(&r, &o, 1);
    int n = nb_sc_export(&r, file);
    fprintf(stderr, "exported seqctr (step %d, %d tensors) to %s in %.1f s\n", r.step, n, file, nb_now() - t0);
    nb_run_free(&r);
    return 0;
}

int nb_cmd_export(int argc, char **argv) {
    char ckpt[NB_PATH_MAX] = "", out[NB_PATH_MAX] = "", file[NB_PATH_MAX] = "", dtype_name[8] = "";
    int merge = 0;
    nb_arg args[] = {
        {"ckpt", ARG_STR, ckpt, sizeof ckpt, "DIR", "run directory (or its ckpt/) to export", 0, 0, 0},
        {"hf", ARG_STR, out, sizeof out, "OUT", "transformers: output directory (created if missing)", 0, 0, 0},
        {"out", ARG_STR, file, sizeof file, "FILE", "seqctr: the safetensors file to write", 0, 0, 0},
        {"dtype", ARG_STR, dtype_name, sizeof dtype_name, "T",
         "transformers: f32, bf16 or f16, rounded to nearest even (default: the dtype of the --init-from checkpoint, else f32)",
         0, 0, 0},
        {"merge", ARG_BOOL, &merge, 0, NULL, "LoRA runs: the merged model (base + alpha / r * B A) instead of a PEFT adapter", 0, 0, 0},
    };
    int nargs = (int)(sizeof args / sizeof args[0]);
    if (nb_args_parse("export", EXPORT_SUMMARY, args, nargs, argc, argv)) return 0;
    if (!ckpt[0]) nb_usage_error("export", "--ckpt DIR is required");

    char dir[NB_PATH_MAX];
    nb_ckpt_resolve(ckpt, dir, sizeof dir, 0);
    nb_train_opts o;
    nb_ckpt_state st;
    nb_ckpt_read_state(dir, &o, &st);
    if (nb_family_find(o.family) != &nb_family_transformer) { /* seqctr: its tensors */
        if (out[0]) nb_usage_error("export", "--hf writes Hugging Face transformers: use --out FILE for seqctr");
        if (!file[0]) nb_usage_error("export", "--out FILE is required for a seqctr checkpoint");
        if (dtype_name[0]) nb_usage_error("export", "--dtype is for transformers: seqctr's tensors are written in fp32");
        return export_seqctr(ckpt, file);
    }
    if (file[0]) nb_usage_error("export", "--out FILE is seqctr's: use --hf OUT for a transformer");
    if (merge && o.lora_r <= 0) nb_usage_error("export", "--merge is for LoRA runs (trained with --lora): this checkpoint has no adapters");
    if (!out[0]) nb_usage_error("export", "--hf OUT is required");
    /* OUT/model.safetensors would overwrite the checkpoint's own weights file */
    NB_CHECK(!same_dir(dir, out), "choose another --hf directory", "--hf %s is the checkpoint directory itself", out);
    struct stat sb;
    NB_CHECK(stat(out, &sb) != 0 || S_ISDIR(sb.st_mode), "choose another --hf directory",
             "--hf %s exists and is not a directory", out);
    nb_hf_export_opts x = {NB_F32, &o.hf};
    const char *dt = dtype_name[0] ? dtype_name : o.hf.cls[0] ? o.hf.dtype : "f32";
    NB_CHECK(nb_hf_dtype_parse(dt) >= 0, "pass --dtype f32, bf16 or f16", "unknown --dtype '%s'", dt);
    x.dtype = (nb_dtype)nb_hf_dtype_parse(dt);
    nb_tf_model m;
    nb_tf_model_init(&m, &o.model);
    double t0 = nb_now();
    /* An adapter of an on-disk base needs the base only to check it, and a merged model only a
     * group at a time: both read it group by group (a 70B base would be 282 GB of fp32); a seeded
     * base is written to OUT/base beside an adapter, so there it is made whole. */
    int whole_base = o.lora_r <= 0 || (!merge && !o.init_source[0]);
    float *slab = whole_base ? nb_aligned_alloc(m.total * sizeof(float), "model weights") : NULL;
    if (o.lora_r > 0) {
        nb_tf_lora lo;
        if (slab)
            load_base(&o, &m, slab);
        else if (!merge)
            check_base_crc(&o, base_from_disk(&o, &m));
        float *ls = load_adapters(dir, &o, &lo);
        int n = merge ? export_merged(out, &o, &m, &lo, ls, &x) : export_adapter(out, &o, &m, &lo, ls, slab, &x);
        int files = copy_tokenizer(&o, out);
        if (merge) {
            fprintf(stderr, "exported %s with its LoRA adapters merged (rank %d, step %d, %d tensors in %s, %d tokenizer files) to %s in %.1f s\n",
                    m.cfg.preset, lo.r, st.step, n, dt, files, out, nb_now() - t0);
            fprintf(stderr, "load it with: transformers.%s.from_pretrained(\"%s\")\n", nb_hf_export_class(&m, &x), out);
        } else {
            fprintf(stderr, "exported the LoRA adapters of %s (rank %d, step %d, %d tensors, %d tokenizer files) to %s in %.1f s\n",
                    m.cfg.preset, lo.r, st.step, n, files, out, nb_now() - t0);
            fprintf(stderr, "load it with: peft.PeftModel.from_pretrained(base_model, \"%s\")\n", out);
        }
        free(ls), free(slab);
        nb_tf_lora_free(&lo);
        nb_tf_model_free(&m);
        return 0;
    }
    nb_ckpt_list list = {0};
    for (int i = 0; i < m.nparams; i++)
        nb_ckpt_list_add(&list, m.params[i].name, m.params[i].ndim, m.params[i].shape, slab + m.params[i].offset);
    nb_ckpt_load_lists(dir, &list, NULL);
    nb_ckpt_list_free(&list);
    check_padding(&m, slab, dir);

    int n = nb_hf_export(out, &m, slab, &x);
    int files = copy_tokenizer(&o, out);
    fprintf(stderr, "exported %s (%s layout, step %d, %.2f M parameters, %d tensors in %s, %d tokenizer files) to %s in %.1f s\n",
            m.cfg.preset, m.cfg.arch == NB_ARCH_GPT2 ? "gpt2" : "llama", st.step, m.n_real / 1e6, n, dt, files, out,
            nb_now() - t0);
    fprintf(stderr, "load it with: transformers.%s.from_pretrained(\"%s\")\n", nb_hf_export_class(&m, &x), out);
    free(slab);
    nb_tf_model_free(&m);
    return 0;
}
