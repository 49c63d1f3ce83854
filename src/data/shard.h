/* Token shards in llm.c's layouts, so shards made by llm.c's scripts load here and ours load there.
 *
 *   header: 256 x int32, little-endian: [0] = magic, [1] = version, [2] = number of tokens; the
 *           rest zero. Two layouts, as llm.c's dev/data/data_common.py writes them:
 *             magic 20240520, version 1: uint16 tokens (GPT-2; vocabularies up to 65,536)
 *             magic 20240801, version 7: uint32 tokens (Llama 3; any vocabulary up to 2^31)
 *   body:   the tokens, 2 or 4 bytes each
 *
 * The file size must be exactly 1024 + width * count: a shard cut short by a crash, or with bytes
 * appended, is refused rather than read as a shorter or longer stream. */
#ifndef NB_SHARD_H
#define NB_SHARD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define NB_SHARD_MAGIC 20240520
#define NB_SHARD_VERSION 1
#define NB_SHARD_MAGIC32 20240801
#define NB_SHARD_VERSION32 7
#define NB_SHARD_HEADER_INTS 256
#define NB_SHARD_HEADER_BYTES (NB_SHARD_HEADER_INTS * 4)

typedef struct {
    char path[1024]; /* for error messages (cut if longer) */
    size_t ntok;
    uint16_t *tokens;   /* malloc'd: the tokens of a uint16 shard, else NULL */
    uint32_t *tokens32; /* malloc'd: the tokens of a uint32 shard, else NULL */
} nb_shard;

/* Token i of a loaded shard, whichever its width. */
static inline uint32_t nb_shard_token(const nb_shard *s, size_t i) {
    return s->tokens32 ? s->tokens32[i] : s->tokens[i];
}

/* Write ids[0..n) as a shard: to "path.tmp.<pid>", fsync, then rename over path, so a crash
 * never leaves a half-written file under the final name. An id outside 0..65535, or more than
 * INT32_MAX tokens, ends in nb_fail before anything is written. */
void nb_shard_write(const char *path, const int32_t *ids, size_t n);
/* The same in the uint32 layout (magic 20240801, version 7); ids must be >= 0. */
void nb_shard_write32(const char *path, const int32_t *ids, size_t n);

/* Loss masks of 'nobubble tokenize --chat' (nobubble's own layout, versioned like a shard):
 *   header: 256 x int32: [0] = 20261205 (magic), [1] = 1 (version), [2] = number of tokens
 *   body:   one uint8 per token of the shard it goes with: 1 = train on predicting this token
 *           (it is a target), 0 = context only (a prompt token under --train-on response)
 * Written next to the shard as SHARD.mask, with the same count. nb_mask_load reads one back;
 * the data loader (data/loader.h) turns the targets it leaves out into ignored targets. */
#define NB_MASK_MAGIC 20261205
#define NB_MASK_VERSION 1
void nb_mask_write(const char *path, const uint8_t *mask, size_t n);
/* The mask of the shard at shard_path ("SHARD.mask"), checked (magic, version, size, a count
 * equal to ntok, bytes 0 or 1; any failure ends in nb_fail naming the file): ntok bytes to free,
 * or NULL when there is no mask file (every token trains). */
uint8_t *nb_mask_load(const char *shard_path, size_t ntok);
/* Is there a mask file next to the shard at shard_path? (Its contents are checked by nb_mask_load.) */
int nb_mask_exists(const char *shard_path);

/* Load and validate a whole shard of either layout: magic, version, size == 1024 + width *
 * count, and every token < vocab (pass 65536 to accept any uint16). Every failure ends in nb_fail naming the file and
 * what was expected vs found (for a token: its position and value). */
void nb_shard_load(nb_shard *s, const char *path, int vocab);
/* Check a shard's header and size (the checks of nb_shard_load but the tokens'); its token count. */
size_t nb_shard_probe(const char *path);
void nb_shard_free(nb_shard *s);

#ifdef __cplusplus
}
#endif
#endif
