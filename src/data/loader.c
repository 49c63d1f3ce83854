#include "data/loader.h"

#include <stdlib.h>
#include <string.h>

#include "core.h"

/* the whole batch a position steps over (every slice of it) */
static size_t batch_span(const nb_loader *ld) { return (size_t)ld->Bg * ld->T; }

/* Position of the batch after one that starts at pos. */
static size_t advance(const nb_loader *ld, size_t pos) {
    size_t next = pos + batch_span(ld);
    return next + batch_span(ld) + 1 > nb_shardset_ntok(&ld->shards) ? 0 : next;
}

/* The whole batch's mask (so every rank counts the same targets), the targets it leaves out of
 * this slice ignored. */
static void apply_mask(nb_loader *ld, nb_loader_slot *s) {
    size_t span = batch_span(ld), n = (size_t)ld->B * ld->T;
    nb_shardset_read_mask(&ld->shards, s->pos, span + 1, s->mask);
    size_t counted = 0;
    for (size_t i = 1; i <= span; i++) counted += s->mask[i]; /* the targets: every position but the first */
    s->counted = counted;
    const uint8_t *mine = s->mask + ld->off_seqs * (size_t)ld->T;
    for (size_t i = 0; i < n; i++)
        if (!mine[i + 1]) s->targets[i] = NB_LOADER_IGNORE;
}

/* the slice's B*T+1 tokens (only the fills touch the set: one thread, the data lane's) */
static void fill_slot(void *arg, const nb_task_ctx *ctx) {
    (void)ctx;
    nb_loader_slot *s = arg;
    nb_loader *ld = s->owner;
    size_t n = (size_t)ld->B * ld->T;
    nb_shardset_read(&ld->shards, s->pos + ld->off_seqs * (size_t)ld->T, n + 1, s->raw);
    const uint32_t *tok = s->raw; /* < vocab <= INT32_MAX: checked as each shard loads */
    for (size_t i = 0; i < n; i++) {
        s->inputs[i] = (int32_t)tok[i];
        s->targets[i] = (int32_t)tok[i + 1];
    }
    s->counted = batch_span(ld);
    if (ld->masked) apply_mask(ld, s);
}

static void enqueue_fill(nb_loader *ld, nb_loader_slot *s) {
    s->pos = ld->next_pos;
    ld->next_pos = advance(ld, ld->next_pos);
    ld->next_fill++;
    if (ld->lane) {
        nb_lane_run(ld->lane, "load batch", NB_SPAN_DATA, -1, fill_slot, s);
        s->filled = nb_lane_mark(ld->lane);
    } else {
        fill_slot(s, NULL);
    }
}

void nb_loader_open(nb_loader *ld, const char *spec, int vocab, int B, int T, size_t start_pos, int depth,
                    nb_lane *lane) {
    nb_loader_open_slice(ld, spec, vocab, B, T, B, 0, start_pos, depth, lane);
}

void nb_loader_open_slice(nb_loader *ld, const char *spec, int vocab, int B, int T, int Bg, size_t off_seqs,
                          size_t start_pos, int depth, nb_lane *lane) {
    memset(ld, 0, sizeof *ld);
    NB_ASSERT(depth >= 1 && depth <= NB_LOADER_MAX_DEPTH);
    NB_ASSERT(Bg >= B && off_seqs + (size_t)B <= (size_t)Bg);
    nb_shardset_open(&ld->shards, spec, vocab, "token data");
    size_t ntok = nb_shardset_ntok(&ld->shards);
    ld->B = B;
    ld->T = T;
    ld->Bg = Bg;
    ld->off_seqs = off_seqs;
    ld->depth = depth;
    ld->lane = lane;
    ld->masked = ld->shards.nmasked > 0;
    NB_CHECK(B > 0 && T > 0, "pass a positive --batch and --seq", "batch %d x sequence %d for shard '%s': both must be positive",
             B, T, spec);
    size_t span = (size_t)Bg * T + 1; /* one batch: Bg*T inputs and the target after the last */
    char hint[160];
    snprintf(hint, sizeof hint, "use a larger shard or a smaller --batch/--seq (one batch needs %zu tokens)", span);
    NB_CHECK(ntok >= span, hint, "shard '%s' holds %zu tokens, fewer than one batch", spec, ntok);
    /* Written as a bound on start_pos, not start_pos + span <= ntok: a corrupt checkpoint's
     * data_pos of -1 is SIZE_MAX here, and the sum would wrap around and pass. */
    char as_signed[48] = "";
    if (start_pos > SIZE_MAX / 2) snprintf(as_signed, sizeof as_signed, " (%lld as a signed number)", (long long)start_pos);
    NB_CHECK(start_pos <= ntok - span,
             "the checkpoint's data_pos does not fit this shard: resume with the shard it was trained on",
             "data position %zu%s is not a batch start in shard '%s': it holds %zu tokens, so a batch of %zu tokens "
             "starts at 0..%zu", start_pos, as_signed, spec, ntok, span, ntok - span);
    ld->next_pos = start_pos;
    /* the first batch's shards read (and their tokens checked) here, not on the data lane */
    uint32_t *first = nb_malloc(((size_t)B * T + 1) * sizeof(uint32_t), "batch tokens");
    nb_shardset_read(&ld->shards, start_pos + off_seqs * (size_t)T, (size_t)B * T + 1, first);
    free(first);
    if (ld->masked) { /* and their masks (every mask is checked as it loads) */
        uint8_t *m = nb_malloc(span, "batch mask");
        nb_shardset_read_mask(&ld->shards, start_pos, span, m);
        free(m);
    }
    for (int i = 0; i < depth; i++) {
        nb_loader_slot *s = &ld->slots[i];
        s->owner = ld;
        s->inputs = nb_malloc((size_t)B * T * sizeof(int32_t), "batch inputs");
        s->targets = nb_malloc((size_t)B * T * sizeof(int32_t), "batch targets");
        s->raw = nb_malloc(((size_t)B * T + 1) * sizeof(uint32_t), "batch tokens");
        if (ld->masked) s->mask = nb_malloc(span, "batch mask");
        enqueue_fill(ld, s);
    }
}

void nb_loader_close(nb_loader *ld) {
    if (ld->lane) nb_mark_wait_host(nb_lane_mark(ld->lane));
    for (int i = 0; i < ld->depth; i++) {
        free(ld->slots[i].inputs);
        free(ld->slots[i].targets);
        free(ld->slots[i].raw);
        free(ld->slots[i].mask);
    }
    nb_shardset_close(&ld->shards);
    memset(ld, 0, sizeof *ld);
}

nb_loader_slot *nb_loader_take(nb_loader *ld) {
    NB_ASSERT(ld->next_take < ld->next_fill);
    return &ld->slots[ld->next_take++ % ld->depth];
}

void nb_loader_release(nb_loader *ld, nb_loader_slot *slot, nb_mark done) {
    if (ld->lane) nb_lane_wait(ld->lane, done);
    enqueue_fill(ld, slot);
}

size_t nb_loader_position(const nb_loader *ld) {
    /* the oldest slot not yet taken holds the next batch */
    return ld->slots[ld->next_take % ld->depth].pos;
}

size_t nb_loader_batches_per_epoch(const nb_loader *ld) {
    return (nb_shardset_ntok(&ld->shards) - 1) / batch_span(ld);
}
