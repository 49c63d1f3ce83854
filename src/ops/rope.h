/* RoPE frequencies: which of transformers' rope types (modeling_rope_utils.py) a model uses.
 * The ops (nb_rope_forward, the backends' rope_fwd, nb_cuda_rope_*) take one of these by
 * pointer; the model config holds its fields (model/transformer.h). */
#ifndef NB_OPS_ROPE_H
#define NB_OPS_ROPE_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    NB_ROPE_DEFAULT = 0, /* inv_freq[i] = 1 / theta^(2i/HS) */
    NB_ROPE_LINEAR = 1,  /* inv_freq / factor (_compute_linear_scaling_rope_parameters) */
    NB_ROPE_LLAMA3 = 2   /* Llama 3.1's banded scaling (_compute_llama3_parameters) */
} nb_rope_type;

typedef struct nb_rope {
    float theta;
    nb_rope_type type;
    float factor;                            /* linear and llama3 */
    float low_freq_factor, high_freq_factor; /* llama3 */
    int original_ctx;                        /* llama3: original_max_position_embeddings */
} nb_rope;

/* Plain RoPE with base theta. */
static inline nb_rope nb_rope_plain(float theta) {
    nb_rope r = {theta, NB_ROPE_DEFAULT, 1.0f, 1.0f, 1.0f, 0};
    return r;
}

/* "default", "linear", "llama3" (config.json's rope_type); NULL for an unknown value. */
const char *nb_rope_type_name(nb_rope_type t);
/* inv_freq of pair i of a head of HS, bitwise what transformers computes in float32 on the
 * CPU (the CUDA kernel evaluates the same expressions, rope.cu). */
float nb_rope_inv_freq(const nb_rope *r, int i, int HS);

#ifdef __cplusplus
}
#endif
#endif
