/* Hugging Face tokenizer.json in C: byte-level BPE (Llama 3, Qwen2/3, GPT-2 style) and
 * SentencePiece-style BPE (Llama 2: Prepend/Replace normalizers, byte fallback), exact against
 * the JavaScript reference @lenml/tokenizers 3.7.2 (a port of transformers.js) on any input.
 *
 * What the reference does and this code does too, step by step:
 *   1. invalid UTF-8 becomes U+FFFD per ill-formed subpart (node's reading of a file as 'utf8');
 *   2. the text is cut at every added token (longest match, scanning left to right: special
 *      tokens such as "<|im_start|>" in the text become their ids); lstrip/rstrip trim the
 *      neighbouring JavaScript whitespace;
 *   3. each other section is normalized (NFC through utf8proc, Prepend, Replace of a string),
 *      pre-tokenized (the Split regexes of Llama 3 and Qwen2/3 and GPT-2's ByteLevel regex,
 *      implemented by hand with node's \p{L}, \p{N} and \s tables) and byte-level mapped;
 *   4. BPE merges the lowest-ranked pair, leftmost first, until none applies (ignore_merges: a
 *      pre-token that is itself a token is taken whole); a piece that is no token falls back to
 *      <0xNN> byte tokens (byte_fallback) or the unknown token (consecutive ones fused);
 *   5. the post-processor (TemplateProcessing) adds its special tokens when asked.
 * Anything else in a tokenizer.json (another model type, normalizer, pre-tokenizer, regex,
 * decoder, post-processor) is refused at load with one line naming the file and field, exit 2.
 *
 * A loaded tokenizer is read-only: encode/decode may run from several threads at once. */
#ifndef NB_HF_TOKENIZER_H
#define NB_HF_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nb_hf_tokenizer nb_hf_tokenizer;

/* Is dir a Hugging Face tokenizer folder (has tokenizer.json)? */
int nb_hf_tokenizer_present(const char *dir);

/* Read dir/tokenizer.json and dir/tokenizer_config.json (optional: bos/eos tokens). A broken or
 * unsupported file prints one line "nobubble: error: FILE: FIELD: ..." and exits with code 2. */
nb_hf_tokenizer *nb_hf_tokenizer_load(const char *dir);
void nb_hf_tokenizer_free(nb_hf_tokenizer *t);

/* Largest id + 1 (model vocabulary and added tokens). */
int nb_hf_tokenizer_vocab_size(const nb_hf_tokenizer *t);
/* bos_token / eos_token of tokenizer_config.json, or -1 when it names none. */
int32_t nb_hf_tokenizer_bos(const nb_hf_tokenizer *t);
int32_t nb_hf_tokenizer_eos(const nb_hf_tokenizer *t);

/* The chat template tokenizer_config.json's chat_template is (an nb_chat_template of
 * data/chat.h: Llama 3's headers, ChatML's <|im_start|>, Llama 2's [INST]; no template: Llama 2
 * for a LlamaTokenizer, else plain), or -1 for a template of another kind. */
int nb_hf_tokenizer_chat_template(const nb_hf_tokenizer *t);

/* Encode len bytes; add_special applies the post-processor's template (Llama 2: <s> first).
 * *ids_out gets a malloc'd array (never NULL); returns the number of ids. */
size_t nb_hf_tokenizer_encode(const nb_hf_tokenizer *t, const char *utf8, size_t len, int add_special,
                              int32_t **ids_out);

/* The text of the ids as the file's decoder makes it (byte-level: the raw bytes; SentencePiece:
 * U+2581 -> ' ', <0xNN> -> byte, the Strip decoder's leading spaces removed), without the
 * reference's clean_up_tokenization_spaces. Added tokens come out as their text. malloc'd and
 * NUL-terminated (not counted in *len_out). An id outside [0, vocab) or a hole ends in nb_fail. */
char *nb_hf_tokenizer_decode(const nb_hf_tokenizer *t, const int32_t *ids, size_t n, size_t *len_out);

/* Where each of the ids that encode(text) gave starts in text: off[0..n], off[n] = len. For
 * loss masks over a rendered conversation. Returns -1 when the ids cannot be lined up with the
 * text byte for byte (invalid UTF-8, NFC changed the text, a literal U+2581 in SentencePiece
 * text): the caller then needs another way. */
int nb_hf_tokenizer_offsets(const nb_hf_tokenizer *t, const char *text, size_t len, const int32_t *ids, size_t n,
                            size_t *off);

/* Bytes of one token as decode() renders it mid-text (no Strip), for printing sampled tokens.
 * NULL and *len = 0 for an id outside the vocabulary. */
const char *nb_hf_tokenizer_token_bytes(const nb_hf_tokenizer *t, int32_t id, size_t *len);

#ifdef __cplusplus
}
#endif
#endif
