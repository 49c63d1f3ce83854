/* Batches of (inputs, targets) from a token stream (one shard or several: data/shardset.h),
 * prefetched on a host lane.
 *
 * Batch k of a run starts at a position that depends only on the position of batch 0 and k
 * (llm.c's sequential walk: B*T+1 contiguous tokens, advance by B*T, wrap to the start when
 * the next batch would run past the end of the stream), so a checkpoint that stores the next batch's position
 * resumes the exact token stream. Fills run on the data lane `depth` batches ahead of the
 * compute lane; a slot is refilled only after the compute lane has finished with it.
 *
 * Loss masks (data/shardset.h): when a shard of the stream has one, a target whose token the mask
 * leaves out (mask 0 at its stream position: the input's position + 1) becomes
 * NB_LOADER_IGNORE, which cross-entropy skips, and each slot counts the targets the mask keeps in
 * the WHOLE batch (every rank's slice: each loader reads the whole batch's mask, which costs one
 * byte a token, so the ranks agree on the count without talking). With no mask anywhere the
 * loader reads nothing more and its targets are the next tokens, as before. */
#ifndef NB_LOADER_H
#define NB_LOADER_H

#include <stddef.h>
#include <stdint.h>

#include "data/shardset.h"
#include "lanes/lanes.h"

#define NB_LOADER_MAX_DEPTH 4
#define NB_LOADER_IGNORE (-1) /* a target the loss leaves out: NB_XENT_IGNORE (ops/ops.h) */

typedef struct nb_loader_slot {
    int32_t *inputs, *targets; /* [B*T] each */
    uint32_t *raw;             /* [B*T+1] the slice's tokens as read (uint16 and uint32 shards alike) */
    uint8_t *mask;             /* [Bg*T+1] the whole batch's loss mask (masked streams only, else NULL) */
    size_t counted;            /* targets of the whole batch that count (Bg*T without a mask) */
    size_t pos;                /* stream position of this batch */
    nb_mark filled;            /* data-lane mark: the slot holds its batch */
    struct nb_loader *owner;
} nb_loader_slot;

typedef struct nb_loader {
    nb_shardset shards;
    int B, T, depth;
    int Bg;           /* sequences of the whole batch the position steps over (B without slicing) */
    int masked;       /* a shard has a loss mask: targets may be NB_LOADER_IGNORE */
    size_t off_seqs;  /* where this loader's B sequences start inside it */
    size_t next_pos;      /* position of the next batch to be enqueued for filling */
    long long next_fill;  /* index of the next batch to be enqueued */
    long long next_take;  /* index of the next batch handed to the trainer */
    nb_lane *lane;        /* NULL: fill synchronously on the caller's thread */
    nb_loader_slot slots[NB_LOADER_MAX_DEPTH];
} nb_loader;

/* Open the shards of spec (one path, a glob or a list: data/shardset.h; what names it in errors)
 * and fill the first `depth` batches on `lane`. The shard at start_pos is read and its tokens
 * checked against vocab here, on the caller's thread. */
void nb_loader_open(nb_loader *ld, const char *spec, int vocab, int B, int T, size_t start_pos, int depth,
                    nb_lane *lane);
void nb_loader_close(nb_loader *ld);
/* The same for one slice of each batch (a rank's share of the global batch): the position steps
 * over batches of Bg sequences, and this loader's B sequences start off_seqs sequences into each.
 * Positions (nb_loader_position, start_pos) are those of the whole batch. */
void nb_loader_open_slice(nb_loader *ld, const char *spec, int vocab, int B, int T, int Bg, size_t off_seqs,
                          size_t start_pos, int depth, nb_lane *lane);
/* The slot of the next batch; the caller's lane must nb_lane_wait(lane, slot->filled). */
nb_loader_slot *nb_loader_take(nb_loader *ld);
/* The caller is done with the slot once `done` is reached (a compute-lane mark): refill it with
 * the batch `depth` ahead. */
void nb_loader_release(nb_loader *ld, nb_loader_slot *slot, nb_mark done);
/* Position of the batch that the next nb_loader_take returns (what a checkpoint stores). */
size_t nb_loader_position(const nb_loader *ld);
/* Number of batches in one pass over the stream. */
size_t nb_loader_batches_per_epoch(const nb_loader *ld);

#endif
