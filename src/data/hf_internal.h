/* Shared by hf_load.c (reading and validating tokenizer.json) and hf_encode.c (encode/decode). */
#ifndef NB_HF_INTERNAL_H
#define NB_HF_INTERNAL_H

#include <stdint.h>

#include "data/hf_tokenizer.h"

/* String -> id, open addressing; keys point into the tokenizer's own copies. */
typedef struct {
    const char **key;
    uint32_t *klen;
    int32_t *val;
    size_t cap, n;
} hf_map;

void hf_map_init(hf_map *m, size_t expect);
void hf_map_free(hf_map *m);
/* Returns the previous value or -1; the key is not copied. */
int32_t hf_map_put(hf_map *m, const char *key, uint32_t len, int32_t v);
int32_t hf_map_get(const hf_map *m, const char *key, size_t len);

/* (left id, right id) -> merge rank and merged id. */
typedef struct {
    uint64_t *key; /* (a << 32 | b) + 1; 0 = empty */
    int32_t *rank, *merged;
    size_t cap;
} hf_pairs;

typedef enum { HF_NORM_NFC, HF_NORM_PREPEND, HF_NORM_REPLACE } hf_norm_kind;
typedef struct {
    hf_norm_kind kind;
    char *a, *b; /* Prepend: a; Replace: a -> b */
    size_t alen, blen;
} hf_norm;

typedef enum { HF_PRE_NONE, HF_PRE_LLAMA3, HF_PRE_QWEN, HF_PRE_GPT2 } hf_pre_kind;

typedef struct {
    char *text;
    size_t len;
    int32_t id;
    int lstrip, rstrip;
} hf_added;

#define HF_MAX_NORM 8
#define HF_MAX_TEMPLATE 8

struct nb_hf_tokenizer {
    int n_vocab;          /* largest id + 1 */
    char **tok;           /* id -> token text as in the file (NULL: hole) */
    uint32_t *tok_len;
    char **out;           /* id -> bytes the decoder makes of it mid-text */
    uint32_t *out_len;
    unsigned char *is_added;
    char **spare;         /* model token texts an added token replaced (still map keys) */
    int n_spare;
    hf_map vocab;         /* token text -> id, added tokens included (they win) */
    hf_pairs pairs;

    int n_norm;
    hf_norm norm[HF_MAX_NORM];
    hf_pre_kind pre;
    int byte_level;       /* ByteLevel pre-tokenizer: bytes are mapped to GPT-2's alphabet */
    int prefix_space;     /* ByteLevel add_prefix_space (alone, not inside a Sequence) */
    int32_t byte_id[256]; /* byte-level: id of each byte's character */
    int ignore_merges, byte_fallback, fuse_unk;
    int32_t unk_id;       /* -1: none */
    int32_t fallback_id[256]; /* <0xNN>, or -1 */

    int n_added;
    hf_added *added;
    int32_t added_first[257]; /* added tokens sorted by first byte, then longest first */

    int n_pre_tmpl, n_post_tmpl; /* TemplateProcessing: ids before and after the sequence */
    int32_t pre_tmpl[HF_MAX_TEMPLATE], post_tmpl[HF_MAX_TEMPLATE];

    int strip_start;      /* SentencePiece decoder: leading spaces its Strip removes */
    int32_t bos, eos;
    int chat;             /* nb_chat_template the config's chat_template is, or -1: unknown */
};

/* GPT-2's byte <-> character alphabet (printable bytes stand for themselves). */
void hf_byte_alphabet(uint32_t byte_to_cp[256]);
/* UTF-8 of one code point into out (>= 4 bytes); returns the length. */
int hf_utf8_put(uint32_t cp, unsigned char *out);

#endif
