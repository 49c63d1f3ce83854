/* Decoder-only transformers: GPT-2 layout (learned positions, LayerNorm, GELU, tied head, biases)
 * and Llama layout (RoPE, RMSNorm, SwiGLU, grouped-query attention, untied head, no biases), with
 * the two Qwen variants of the Llama layout: q/k/v biases (Qwen2, qkv_bias) and a per-head RMSNorm
 * of q and k before RoPE with a head size of its own (Qwen3, qk_norm and head_dim).
 *
 * A model is a parameter table plus stateless blocks. All parameters live in one slab (llm.c's
 * "malloc and point"), laid out in groups: group 0 = embeddings, group 1+l = layer l, group L+1 =
 * final norm and head. Each group is contiguous and every tensor is NB_ALIGN-aligned, so one
 * layer can be copied, streamed or checkpointed as one piece, and a block binds to whichever
 * buffer holds its layer (nb_tf_bind_layer). Gradients and optimizer state use the same layout. */
#ifndef NB_TRANSFORMER_H
#define NB_TRANSFORMER_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ops/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { NB_ARCH_GPT2 = 0, NB_ARCH_LLAMA = 1 } nb_arch;

typedef struct nb_tf_config {
    char preset[32];
    nb_arch arch;
    int layers, dim, heads, kv_heads, head_size, ffn;
    int vocab;        /* real vocabulary (targets and sampling stay below it) */
    int vocab_padded; /* rows of the embedding / head: vocab rounded up to a multiple of 64 */
    int seq;          /* context length (rows of the learned position table) */
    float norm_eps, rope_theta;
    int tied; /* head shares the token embedding */
    /* Llama-layout variants (0 in GPT-2 layouts and older checkpoints) */
    int head_dim; /* head size when not dim / heads (Qwen3); 0: dim / heads */
    int qkv_bias; /* the fused qkv projection has a bias (Qwen2) */
    int qk_norm;  /* per-head RMSNorm of q and k (weights [head_size]) before RoPE (Qwen3) */
    /* RoPE scaling (config.json's rope_scaling): NB_ROPE_DEFAULT (none; factor etc. unused),
     * NB_ROPE_LINEAR (rope_factor), NB_ROPE_LLAMA3 (all four) */
    nb_rope_type rope_scaling;
    float rope_factor, rope_low_freq_factor, rope_high_freq_factor;
    int rope_original_ctx; /* original_max_position_embeddings */
} nb_tf_config;

/* The largest --vocab: ids travel as int32 and index size_t offsets, so the bound is not the
 * kernels' (none has one below 2^31); it keeps a typo from asking for a terabyte table. */
#define NB_TF_MAX_VOCAB (1 << 24)

/* Fill cfg from a preset name; returns 0 if the name is unknown. */
int nb_tf_preset(const char *name, nb_tf_config *cfg);
/* Comma-separated preset names, for --help and errors. */
const char *nb_tf_preset_names(void);
/* Recompute derived fields (head_size: head_dim or dim / heads; vocab_padded) and validate; fails
 * with a hint. */
void nb_tf_config_finalize(nb_tf_config *cfg);
void nb_tf_config_print(const nb_tf_config *cfg, FILE *f);
/* The model's RoPE frequencies for the ops (theta and scaling). */
nb_rope nb_tf_rope(const nb_tf_config *cfg);

/* Per-layer tensors. Llama leaves the biases absent (param index -1), but for QKV_B with qkv_bias.
 * For Llama FC is the fused gate/up projection [2F, C] (gate rows first) and FCPROJ the down
 * projection [C, F]. QNORM_W / KNORM_W [head_size] exist with qk_norm only. */
enum {
    NB_TF_LN1_W, NB_TF_LN1_B, NB_TF_QKV_W, NB_TF_QKV_B, NB_TF_PROJ_W, NB_TF_PROJ_B,
    NB_TF_LN2_W, NB_TF_LN2_B, NB_TF_FC_W, NB_TF_FC_B, NB_TF_FCPROJ_W, NB_TF_FCPROJ_B,
    NB_TF_QNORM_W, NB_TF_KNORM_W,
    NB_TF_LAYER_TENSORS
};
/* Global tensors. */
enum { NB_TF_WTE, NB_TF_WPE, NB_TF_LNF_W, NB_TF_LNF_B, NB_TF_LM_HEAD, NB_TF_GLOBAL_TENSORS };

typedef struct nb_param {
    char name[64]; /* checkpoint name, e.g. "layers.3.attn.qkv.weight" */
    int group;
    int ndim;
    int64_t shape[2];
    size_t offset; /* elements from the slab start */
    size_t numel;
    int decay; /* AdamW weight decay applies (2-D weights) */
} nb_param;

/* LoRA (PEFT's semantics): a frozen projection y = x W^T gains (alpha / r) * (x A^T) B^T with
 * A [r, in] and B [out, r] trained. The sites are the Llama layout's q, k, v, o, gate, up and down
 * projections; in the GPT-2 layout q (standing for q, k and v together) is the fused c_attn, o
 * the attention's c_proj, up the MLP's c_fc and down its c_proj (k, v and gate have no matrix of
 * their own there). Where a site is a column slice of a fused matrix (Llama's q, k, v of qkv;
 * gate, up of the gate/up projection), its branch adds into that slice only. */
enum { NB_LORA_Q, NB_LORA_K, NB_LORA_V, NB_LORA_O, NB_LORA_GATE, NB_LORA_UP, NB_LORA_DOWN, NB_LORA_SITES };

/* Where a site's branch reads and writes: input width K, output OC columns from `off` of a
 * row of ld columns, of layer tensor `w` (NB_TF_QKV_W ..). */
typedef struct {
    int w, K, OC, off, ld;
} nb_lora_site;

/* The adapters of a model: their own fp32 slab, laid out as the model's (group 1+l: layer l's
 * adapters; groups 0 and L+1 empty), so gradients, AdamW state and buckets follow the model's
 * conventions. */
typedef struct nb_tf_lora {
    int r;
    float alpha, scale; /* scale = alpha / r */
    unsigned sites;     /* bit s: site s adapted */
    int nparams;
    struct nb_param *params;
    int (*idx)[NB_LORA_SITES][2]; /* [layers][site][0: A, 1: B] -> param index or -1 */
    int ngroups;
    size_t *group_offset, *group_numel, total, n_real;
} nb_tf_lora;

typedef struct nb_tf_model {
    nb_tf_config cfg;
    const nb_tf_lora *lora; /* adapters the layers run (NULL: none); the caller owns them */
    int nparams;
    nb_param *params;
    int (*layer_idx)[NB_TF_LAYER_TENSORS]; /* [layers][k] -> param index or -1 */
    int global_idx[NB_TF_GLOBAL_TENSORS];
    int ngroups;
    size_t *group_offset, *group_numel; /* elements */
    size_t total; /* elements in the slab, including alignment padding */
    size_t n_real; /* elements that are real parameters (without padding) */
} nb_tf_model;

void nb_tf_model_init(nb_tf_model *m, const nb_tf_config *cfg);
void nb_tf_model_free(nb_tf_model *m);
/* GPT-2 init into an fp32 slab: normal(0, 0.02), residual projections scaled by 1/sqrt(2L),
 * biases 0, norm weights 1. Each tensor draws from its own Philox stream (seed, name). */
/* fill draws the normals (a backend's fill_normal: the GPU's has nb_rng_fill_normal's bits and is
 * far faster on big models); NULL: nb_rng_fill_normal on the host. */
typedef struct {
    void (*fn)(void *self, float *out, size_t n, uint64_t seed, uint64_t stream, float mean, float std);
    void *self;
} nb_tf_filler;
void nb_tf_init_weights(const nb_tf_model *m, float *slab, uint64_t seed, const nb_tf_filler *fill);
/* Group g's part of that init into dst ([group_numel[g]], offsets from the group's start): the
 * same values, one group at a time (stream's LoRA loads its frozen base so, never the whole
 * model in fp32). */
void nb_tf_init_group(const nb_tf_model *m, int g, float *dst, uint64_t seed, const nb_tf_filler *fill);

/* A layer's tensors bound to a buffer that holds that layer's group (base = group start). */
typedef struct {
    void *t[NB_TF_LAYER_TENSORS];
    void *la[NB_LORA_SITES], *lb[NB_LORA_SITES]; /* LoRA's A and B per site (NULL: none) */
} nb_tf_layer_view;
void nb_tf_bind_layer(const nb_tf_model *m, int layer, void *group_base, size_t elem_size, nb_tf_layer_view *v);
/* Pointer to a parameter inside a slab holding the whole model. */
void *nb_tf_param_ptr(const nb_tf_model *m, int param_index, void *slab, size_t elem_size);
void *nb_tf_global_ptr(const nb_tf_model *m, int which, void *slab, size_t elem_size);

/* Saved activations of one layer for (B, T). */
typedef struct {
    void *ln1, *qkv, *atty, *res2, *ln2, *fch, *fca; /* fca: gelu(fch) or swiglu(fch) */
    float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd, *lse;
    void *qk_in;     /* qk_norm: q and k heads before their norm, [N * (heads + kv_heads), head_size] */
    float *qk_rstd;  /* qk_norm: [N * (heads + kv_heads)] */
    void *lu[NB_LORA_SITES]; /* LoRA: x A^T of each adapted site [N, r] */
} nb_tf_layer_acts;

/* Activations and scratch for a batch shape, in one slab. */
typedef struct nb_tf_acts {
    int B, T;
    size_t bytes;
    void *slab;
    void **resid;               /* [layers + 1] residual stream: resid[0] = embeddings */
    nb_tf_layer_acts *layer;    /* [layers] */
    void *lnf;                  /* final norm output [N, C] */
    float *lnf_mean, *lnf_rstd; /* [N] */
    float *losses;              /* [N] */
    /* backward scratch, reused by every layer */
    void *dres, *dln, *dqkv, *datty, *dfch, *dfca;
    void *lt, *ldu; /* LoRA scratch: a branch's output (or its gradient) [N, widest site], d(x A^T) [N, r] */
} nb_tf_acts;

/* Bytes needed for activations of (B, T) in a given element size. */
size_t nb_tf_acts_bytes(const nb_tf_model *m, int B, int T, size_t elem_size);
/* Carve acts out of a caller-provided buffer of nb_tf_acts_bytes bytes. */
void nb_tf_acts_bind(const nb_tf_model *m, nb_tf_acts *a, void *buf, int B, int T, size_t elem_size);
void nb_tf_acts_unbind(nb_tf_acts *a);
/* Activations checkpointed every K layers (1 <= K <= NB_TF_MAX_CKPT_INTERVAL): the last `keep`
 * layers keep all their activations; of the others only resid[l] for l a multiple of K keeps its
 * value through a step, and a block of K layers is recomputed from its checkpoint before its
 * backward (the stream schedule). */
#define NB_TF_MAX_CKPT_INTERVAL 64
size_t nb_tf_acts_bytes_ckpt(const nb_tf_model *m, int B, int T, size_t elem_size, int K, int keep);
void nb_tf_acts_bind_ckpt(const nb_tf_model *m, nb_tf_acts *a, void *buf, int B, int T, size_t elem_size, int K,
                          int keep);
/* A segment's view for detached training (ERASE): the shared forward activations with its own
 * final-norm output, losses and backward scratch, carved from buf (nb_tf_seg_scratch_bytes),
 * so several segments' heads and backward passes can run at once. */
size_t nb_tf_seg_scratch_bytes(const nb_tf_model *m, int B, int T, size_t elem_size);
void nb_tf_seg_view(const nb_tf_model *m, const nb_tf_acts *shared, nb_tf_acts *view, void *buf, size_t elem_size);

/* Blocks. They own no memory; the schedule binds weights, activations and gradients. */
void nb_tf_embed_forward(const nb_tf_model *m, const nb_backend_i *be, nb_ctx ctx, const void *wte,
                         const void *wpe, const int32_t *tokens, nb_tf_acts *a);
void nb_tf_embed_backward(const nb_tf_model *m, const nb_backend_i *be, nb_ctx ctx, void *dwte, void *dwpe,
                          const int32_t *tokens, nb_tf_acts *a);
void nb_tf_layer_forward(const nb_tf_model *m, const nb_backend_i *be, nb_ctx ctx, const nb_tf_layer_view *w,
                         int layer, nb_tf_acts *a);
/* a->dres holds d(output of layer) on entry and d(input of layer) on return. dw may hold NULLs. */
void nb_tf_layer_backward(const nb_tf_model *m, const nb_backend_i *be, nb_ctx ctx, const nb_tf_layer_view *w,
                          const nb_tf_layer_view *dw, int layer, nb_tf_acts *a);
/* Final norm + unembedding + cross-entropy on x = resid[layer_out]. Writes a->losses. With
 * backward, a->dres is overwritten with d(x) and dlnf_w/dlnf_b/dhead accumulate; grad_scale is
 * d(total loss)/d(each token's loss), times *scale_by when that is not NULL (backend memory, read
 * when the head runs: nb_backend_i.xent_fwd_bwd). head = wte (tied) or lm_head. */
void nb_tf_head(const nb_tf_model *m, const nb_backend_i *be, nb_ctx ctx, const void *lnf_w, const void *lnf_b,
                const void *head, int layer_out, const int32_t *targets, int backward, float grad_scale,
                const float *scale_by, void *dlnf_w, void *dlnf_b, void *dhead, nb_tf_acts *a);

/* Logits of the last row of the batch (sampling): final norm of resid[layer_out], then
 * logits[V] = norm(x_last) @ head[:V]^T. */
void nb_tf_logits_last(const nb_tf_model *m, const nb_backend_i *be, nb_ctx ctx, const void *lnf_w, const void *lnf_b,
                       const void *head, int layer_out, nb_tf_acts *a, void *logits);

/* model/transformer_lora.c */
/* Parse --lora-targets ("q,k,v,o,gate,up,down", any subset) for an architecture into a site mask;
 * fails with a hint on an unknown name or one the layout has no matrix for. */
unsigned nb_tf_lora_parse_targets(const char *list, nb_arch arch);
/* The targets of a mask as --lora-targets writes them, and as Hugging Face module names. */
void nb_tf_lora_targets_str(unsigned sites, nb_arch arch, char *out, size_t cap);
/* Site s's geometry in a config; 0 when the layout has no matrix for it (GPT-2's k, v, gate). */
int nb_tf_lora_site(const nb_tf_config *c, int s, nb_lora_site *g);
/* The Hugging Face module name of a site ("q_proj"; GPT-2: "c_attn", "c_proj", "c_fc", "c_proj")
 * and its parent ("self_attn" / "mlp"; GPT-2 "attn" / "mlp"). */
const char *nb_tf_lora_hf_module(nb_arch arch, int s, const char **parent);
void nb_tf_lora_init(nb_tf_lora *lo, const nb_tf_config *c, int r, float alpha, unsigned sites);
void nb_tf_lora_free(nb_tf_lora *lo);
/* PEFT's init: A kaiming-uniform (a = sqrt(5): U(-1/sqrt(in), 1/sqrt(in))) from the run's seed,
 * one Philox stream per tensor name; B zero. */
void nb_tf_lora_init_weights(const nb_tf_lora *lo, float *slab, uint64_t seed);
/* Layer l's adapters in a slab holding all of them (NULL slab: none) into v->la / v->lb. */
void nb_tf_lora_bind(const nb_tf_lora *lo, int l, void *slab, size_t es, nb_tf_layer_view *v);
/* The widest output of an adapted site (scratch sizing). */
int nb_tf_lora_max_out(const nb_tf_model *m);
/* y's slice += scale * (x A^T) B^T (x A^T kept in s->lu[site]); no-op when the view has no A. */
void nb_tf_lora_forward(const nb_tf_model *m, const nb_backend_i *be, nb_ctx ctx, const nb_tf_layer_view *w, int site,
                        nb_tf_layer_acts *s, nb_tf_acts *a, const void *x, void *y);
/* The branch's backward: dy's slice in; dA, dB accumulate (dw->la, dw->lb), dx += its share. */
void nb_tf_lora_backward(const nb_tf_model *m, const nb_backend_i *be, nb_ctx ctx, const nb_tf_layer_view *w,
                         const nb_tf_layer_view *dw, int site, const nb_tf_layer_acts *s, nb_tf_acts *a, const void *x,
                         void *dx, const void *dy);
/* W += scale * B A for every adapted site, into an fp32 slab of the model (export --merge). */
void nb_tf_lora_merge(const nb_tf_model *m, const nb_tf_lora *lo, float *model_slab, const float *lora_slab);
/* The same for layer l alone, into a buffer that holds that layer's group (group start first). */
void nb_tf_lora_merge_layer(const nb_tf_model *m, const nb_tf_lora *lo, int l, float *group, const float *lora_slab);

/* Model FLOPs per token for training (6N + attention; LoRA: 4N for the frozen weights + 6 per
 * adapter parameter), for MFU and the benchmarks. */
double nb_tf_flops_per_token(const nb_tf_model *m, int T);
/* FLOPs per token that recomputation adds (--ckpt-interval K > 0, the last `keep` layers kept whole):
 * one more forward of every other layer but those of their last block of K, whose activations
 * are still there at the backward. */
double nb_tf_recompute_flops_per_token(const nb_tf_model *m, int T, int K, int keep);

#ifdef __cplusplus
}
#endif
#endif
