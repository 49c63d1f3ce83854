/* Token shards in llm.c's layout, so shards made by llm.c's scripts load here and ours load there.
 *
 *   header: 256 x int32, little-endian: [0] = 20240520 (magic), [1] = 1 (version: uint16
 *           tokens), [2] = number of tokens; the rest zero
 *   body:   the tokens, uint16 each
 *
 * The file size must be exactly 1024 + 2 * count: a shard cut short by a crash, or with bytes
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
#define NB_SHARD_HEADER_INTS 256
#define NB_SHARD_HEADER_BYTES (NB_SHARD_HEADER_INTS * 4)

typedef struct {
    char path[1024]; /* for error messages (cut if longer) */
    size_t ntok;
    uint16_t *tokens; /* malloc'd */
} nb_shard;

/* Write ids[0..n) as a shard: to "path.tmp.<pid>", fsync, then rename over path, so a crash
 * never leaves a half-written file under the final name. An id outside 0..65535, or more than
 * INT32_MAX tokens, ends in nb_fail before anything is written. */
void nb_shard_write(const char *path, const int32_t *ids, size_t n);

/* Load and validate a whole shard: magic, version, size == 1024 + 2 * count, and every token
 * < vocab (pass 65536 to accept any uint16). Every failure ends in nb_fail naming the file and
 * what was expected vs found (for a token: its position and value). */
void nb_shard_load(nb_shard *s, const char *path, int vocab);
/* Check a shard's header and size (the checks of nb_shard_load but the tokens'); its token count. */
size_t nb_shard_probe(const char *path);
void nb_shard_free(nb_shard *s);

#ifdef __cplusplus
}
#endif
#endif
