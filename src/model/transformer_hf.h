/* Hugging Face export: a model directory (config.json + model.safetensors in F32, BF16 or F16)
 * that transformers loads with GPT2LMHeadModel / LlamaForCausalLM.from_pretrained, or, for a
 * model imported with --init-from, with the class it came from (nb_hf_origin below).
 *
 * GPT-2 layouts map to GPT2LMHeadModel. Its linear layers are Conv1D modules whose weight is
 * [in, out] (y = x @ W + b), so our [out, in] weights are written transposed: c_attn [C, 3C],
 * attn.c_proj [C, C], mlp.c_fc [C, F], mlp.c_proj [F, C]. c_attn's columns are q, k, v in that
 * order, as in our fused qkv rows. The head is tied to transformer.wte, so lm_head.weight is not
 * written (what save_pretrained does; from_pretrained ties it back).
 * Llama layouts map to LlamaForCausalLM. Weights are nn.Linear [out, in] like ours; the fused
 * qkv rows split into q_proj (first H*hs rows), k_proj (next KV*hs), v_proj (last KV*hs), and
 * gate_up into gate_proj (first F rows) and up_proj (last F rows). Our RoPE is HF's rotate_half
 * on heads laid out as q_proj's rows are, so no permutation is needed (llama's original
 * checkpoints interleave pairs and need one; HF checkpoints and ours do not).
 * Llama layouts with a qkv bias map to Qwen2ForCausalLM (the bias splits into q/k/v_proj.bias as the
 * weight does), those with a q/k norm to Qwen3ForCausalLM (self_attn.q_norm / k_norm.weight
 * [head_dim]); head_dim is the model's head size, which need not be hidden_size / heads.
 * Embedding and head rows >= vocab (our padding to a multiple of 64) are dropped: HF's tables
 * have exactly vocab_size rows.
 * Values are written straight from the parameter slab (transposed and rounded chunk by chunk),
 * so exporting needs no second copy of the model in memory. Both files are written crash-safely. */
#ifndef NB_MODEL_TRANSFORMER_HF_H
#define NB_MODEL_TRANSFORMER_HF_H

#include <stdint.h>

#include "io/json.h"
#include "model/transformer.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One tensor of the export and where its values come from: rows [row0, row0 + rows) of our
 * parameter `param` (all of it for 1-D tensors), written as they are or transposed. */
typedef struct {
    char name[96]; /* HF state-dict name, e.g. "transformer.h.0.attn.c_attn.weight" */
    int param;     /* index into model->params */
    int64_t row0, rows;
    int transpose; /* HF shape is [cols, rows] (GPT-2 Conv1D) instead of [rows, cols] */
    int ndim;
    int64_t shape[2]; /* HF shape */
} nb_hf_tensor;

/* Where an imported model came from (state.json's model.hf), so that its export is the
 * architecture it was: its class, model_type and every config.json field nobubble does not model
 * (bos/eos ids, sliding_window, max_position_embeddings, ...) go back unchanged. An empty cls:
 * a model trained from scratch (and every checkpoint from before imports kept this). */
#define NB_HF_CONFIG_MAX 16384
typedef struct {
    char cls[64];                  /* architectures[0], e.g. "MistralForCausalLM" */
    char model_type[32];           /* e.g. "mistral" */
    char dtype[8];                 /* the checkpoint's tensors: "f32", "bf16" or "f16" */
    char config[NB_HF_CONFIG_MAX]; /* config.json's object as nb_json_spell writes it */
} nb_hf_origin;

/* What an export writes: the tensors' dtype (NB_F32, NB_BF16 or NB_F16, rounded to nearest
 * even) and the model's origin (NULL or an empty one: trained here, config.json from the shape). */
typedef struct {
    nb_dtype dtype;
    const nb_hf_origin *origin;
} nb_hf_export_opts;

/* The export table of a model, in file order. Returns the count; *out is malloc'd (free it). */
int nb_hf_tensors(const nb_tf_model *m, nb_hf_tensor **out);
/* "GPT2LMHeadModel", "LlamaForCausalLM", "Qwen2ForCausalLM" or "Qwen3ForCausalLM": the class of our layout. */
const char *nb_hf_class_name(const nb_tf_model *m);
/* The class an export writes: the origin's, else our layout's. */
const char *nb_hf_export_class(const nb_tf_model *m, const nb_hf_export_opts *x);
/* config.json text for the model, NUL-terminated, malloc'd (free it). Floats are always
 * written with a decimal point or an exponent: transformers 5's strict configs reject an
 * integer where a float is declared. */
char *nb_hf_config_json(const nb_tf_model *m, const nb_hf_export_opts *x);
/* Write out_dir/config.json and out_dir/model.safetensors from fp32 weights in the model's slab
 * layout; creates out_dir. Returns the number of tensors written. */
int nb_hf_export(const char *out_dir, const nb_tf_model *m, const float *params, const nb_hf_export_opts *x);
/* The same export with the weights from group(self, g): group g's fp32 values (offsets from the
 * group's start), valid until a call for another group. The tensors go in group order, so the
 * groups are asked for in ascending order (the same g many times: a piece at a time): one group
 * in memory, never the whole model (a merged 70B LoRA). The same tensors as nb_hf_export's; the
 * file may list them in another order. */
typedef const float *(*nb_hf_group_fn)(void *self, int g);
int nb_hf_export_by_groups(const char *out_dir, const nb_tf_model *m, nb_hf_group_fn group, void *self,
                           const nb_hf_export_opts *x);
/* transformer_hf_lora.c: a LoRA run's adapters as a PEFT adapter directory: adapter_config.json
 * (r, lora_alpha, target_modules as HF module names, base_model_name_or_path = base_ref) and
 * adapter_model.safetensors (fp32, peft's names: base_model.model.model.layers.N.self_attn.q_proj
 * .lora_A.weight; GPT-2 base_model.model.transformer.h.N.attn.c_attn.lora_A.weight). Returns the
 * tensor count. */
int nb_hf_export_lora(const char *out_dir, const nb_tf_model *m, const nb_tf_lora *lo, const float *lora_slab,
                      const char *base_ref);

/* Import (transformer_hf_import.c), the reverse through the same table: --init-from HF_DIR.
 * HF_DIR holds config.json and model.safetensors, or model.safetensors.index.json and the
 * shards its weight_map names; tensors in F32, BF16 or F16 become fp32 master weights.
 * Accepted: GPT2LMHeadModel (tanh GELU), LlamaForCausalLM and MistralForCausalLM (Llama's math:
 * no biases, silu, RoPE plain or scaled the linear or llama3 way, a sliding window no shorter
 * than the sequence), Qwen2ForCausalLM (and q/k/v biases) and Qwen3ForCausalLM (a per-head q/k
 * RMSNorm); head_dim may differ from hidden / heads. Anything else, a missing, misshaped or
 * unexpected tensor, an unknown dtype or a damaged file is refused with one line and exit status
 * 2 before training starts. */
/* The shape from HF_DIR/config.json: vocab (any, up to 16777216; padded to 64 as always), eps,
 * rope theta and scaling, tied head; seq: the training length (0: n_positions /
 * max_position_embeddings;
 * GPT-2 keeps the first seq rows of its position table). The preset name is "hf-<type>". */
void nb_hf_import_config(const char *dir, int seq, nb_tf_config *cfg);
/* Every tensor present with its shape and a dtype we read, none left over; reads no values. */
void nb_hf_import_check(const char *dir, const nb_tf_model *m);
/* The weights into an fp32 slab of the model's layout (m->total elements), tensor by tensor
 * straight from the mapped files; everything the checkpoint does not set (vocab padding rows)
 * is zero. */
void nb_hf_import(const char *dir, const nb_tf_model *m, float *params);
/* Group g of that import into dst ([group_numel[g]], offsets from the group's start): the same
 * bits as the whole import's group, one group in memory at a time. */
void nb_hf_import_group(const char *dir, const nb_tf_model *m, int g, float *dst);
/* A LoRA run's frozen base one group at a time, in slab order: read from the --init-from folder
 * dir, or drawn from the seeded init (dir ""), each group handed to sink (NULL: none). Returns
 * state.json's lora_base_crc (1 + the CRC-32C of the whole fp32 slab, chained group by group),
 * with one group in memory, never the whole base (a 70B base is 282 GB in fp32). */
/* Group g of that base into buf ([group_numel[g]]), drawn with fill where seeded (NULL: the host);
 * returns the group's CRC-32C, which nb_crc32c_combine chains in slab order. */
uint32_t nb_tf_base_group(const nb_tf_model *m, const char *dir, uint64_t seed, const nb_tf_filler *fill, int g,
                          float *buf);
uint64_t nb_tf_base_by_groups(const nb_tf_model *m, const char *dir, uint64_t seed, const nb_tf_filler *fill,
                              void (*sink)(void *self, int group, const float *w), void *self);
/* The dtype most of the checkpoint's tensors have (F32, BF16 or F16). */
nb_dtype nb_hf_import_dtype(const char *dir, const nb_tf_model *m);

/* The origin of HF_DIR's model (transformer_hf_origin.c): its config.json and tensors' dtype. */
void nb_hf_origin_import(const char *dir, const nb_tf_model *m, nb_hf_origin *h);
/* state.json's model.hf (nothing for an empty origin), and back (absent: an empty one). */
void nb_hf_origin_write(nb_json_writer *w, const nb_hf_origin *h);
void nb_hf_origin_read(const nb_json *model, nb_hf_origin *h);
/* "f32" -> NB_F32, "bf16" -> NB_BF16, "f16" -> NB_F16, else -1; and back. */
int nb_hf_dtype_parse(const char *name);
const char *nb_hf_dtype_name(nb_dtype dtype);

#ifdef __cplusplus
}
#endif
#endif
