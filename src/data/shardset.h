/* The token stream a run trains (or evaluates) on: one llm.c shard or several.
 *
 * --data (--val-data, eval --data) names one shard, a glob ('data/fw/train_*.bin': its matches
 * in sorted name order, byte by byte), or a comma-separated list of either (in the order given;
 * each glob's matches sorted). A path under data/ is also looked for under $NB_DATA_DIR and next
 * to the binary (core/datapath.h).
 *
 * The shards are read as ONE concatenated stream: position p is token p of shard 0, then of
 * shard 1, ... A batch may span a shard boundary, and a position (a checkpoint's data_pos) names
 * the shard and the offset in it, so resume is bitwise across boundaries and a run on shards split
 * from one file reads exactly the tokens of the run on that file.
 *
 * Opening checks every shard's header and size (magic, version, size == 1024 + 2 or 4 * count) before
 * anything trains; a shard's tokens are read (and checked against the vocabulary) when the stream
 * first reaches it and dropped once a read no longer needs it, so host memory holds the shards of
 * one batch, not the whole set.
 *
 * Loss masks (data/shard.h, 'nobubble tokenize --chat'): a shard may have SHARD.mask beside it; a
 * shard without one counts as all ones (every token a target), so a set may mix both. The masks
 * are read like the tokens (when a read first reaches their shard) but kept apart from them, so a
 * rank that reads the whole batch's mask and only its slice of the tokens loads no token it does
 * not use. */
#ifndef NB_SHARDSET_H
#define NB_SHARDSET_H

#include <stddef.h>
#include <stdint.h>

#include "core.h"
#include "data/shard.h"

typedef struct {
    char spec[NB_PATH_MAX]; /* as given */
    int n, vocab;
    char **paths;          /* [n] resolved */
    size_t *start;         /* [n + 1]: stream position of each shard's first token; start[n]: total */
    nb_shard *loaded;      /* [n]: a shard while loaded (ntok 0 and no tokens otherwise) */
    char *has_mask;        /* [n]: the shard has a loss mask file (SHARD.mask) */
    uint8_t **masks;       /* [n]: a shard's loss mask while loaded (NULL otherwise) */
    int nmasked;           /* shards with a mask: 0 = the stream trains on every token */
} nb_shardset;

/* Expand spec (failing with every place looked for an item that names nothing), check each
 * shard's header and size, refuse a shard named twice. what ("training data", "validation
 * data") starts the error messages. */
void nb_shardset_open(nb_shardset *s, const char *spec, int vocab, const char *what);
void nb_shardset_close(nb_shardset *s);
static inline size_t nb_shardset_ntok(const nb_shardset *s) { return s->start[s->n]; }
/* Tokens [pos, pos + n) of the stream into out (pos + n <= the total). Loads the shards that
 * range needs and drops the others. Not thread-safe: one reader per set. */
void nb_shardset_read(nb_shardset *s, size_t pos, size_t n, uint32_t *out);
/* The loss mask of tokens [pos, pos + n) into out (1 = a target; all ones in a shard without a
 * mask). Loads the masks that range needs and drops the other masks. Not thread-safe either. */
void nb_shardset_read_mask(nb_shardset *s, size_t pos, size_t n, uint8_t *out);
/* Tokens of the whole stream that are targets (the ones of every mask, every token of a shard
 * without one): reads and checks every mask file once, holding one at a time. */
size_t nb_shardset_count_targets(nb_shardset *s);
/* For messages: the mask of a single masked shard ("SHARD.mask"), else "N of M shards' masks" */
void nb_shardset_describe_masks(const nb_shardset *s, char *buf, size_t cap);
/* For messages: the path of a single shard, else "N shards: FIRST, SECOND, ..., LAST" */
void nb_shardset_describe(const nb_shardset *s, char *buf, size_t cap);
/* Does every item of spec name an existing file (or a glob with a match)? If not, why names the
 * item and every place looked. Touches no shard's contents. */
int nb_shardset_check(const char *spec, char *why, size_t cap);

#endif
