/* Where a global batch's samples train (FreeScale's load balancing, --balance, --emulate-ranks;
 * data/balance.h has FreeScale in one place): the plan of data/balance.h carried out. Every rank
 * reads its contiguous slice of the global batch (the data order), the ranks all-gather the
 * slices' history lengths, every rank computes the same plan, and an all-to-all moves each sample
 * to the rank the plan gives it. Emulated ranks (one process standing in for several) read the
 * whole global batch and reorder it: this process's window then holds every emulated rank's
 * share, one after another. */
#ifndef NB_DATA_BALANCE_PLACE_H
#define NB_DATA_BALANCE_PLACE_H

#include <stddef.h>
#include <stdint.h>

#include "data/balance.h"
#include "data/ctr_source.h"

#define NB_BALANCE_MAX_EMULATE 256 /* --emulate-ranks at most */

typedef struct {
    nb_balance bal;
    int Bg, world, rank, per_rank; /* per_rank: the shares of this process (emulated ranks, else 1) */
    int shares, cap, Bl;           /* shares = world * per_rank, at most cap samples each; Bl = Bg / world */
    int32_t *len;                  /* [Bg] the global batch's history lengths */
    int *share_of, *count, *order, *first; /* the plan: [Bg], [shares], [Bg], [shares + 1] */
    void *scratch;                 /* nb_balance_scratch_bytes */
    nb_ctr_batch read;             /* the samples this rank reads before they move */
    uint32_t *send, *recv;
    size_t *cnt; /* [4 * world]: the all-to-all's counts and displacements */
} nb_balance_placer;

void nb_balance_placer_init(nb_balance_placer *p, const nb_balance *bal, int Bg, int world, int rank, int per_rank, int max_len,
                            const nb_sc_config *shape);
void nb_balance_placer_free(nb_balance_placer *p);
/* Samples this rank's window must hold. */
int nb_balance_placer_window_cap(const nb_balance_placer *p);
/* Whether placing a window needs no other rank (one rank, or each rank reads its own slice): then
 * it may run on a thread other than the one that talks to the ranks. */
int nb_balance_placer_local(const nb_balance_placer *p);
/* Reads the next global batch from src and fills win with this rank's samples: its shares one
 * after another, data order within each; idx[k] is window sample k's index in the global batch;
 * share_first[s], s = 0 .. per_rank, where this rank's share s starts. Each share gets at least
 * min_count samples. Collective when world > 1 (every rank calls it for every batch). */
void nb_balance_place(nb_balance_placer *p, nb_ctr_source *src, nb_ctr_batch *win, int *idx, int *share_first, int min_count);

#endif
