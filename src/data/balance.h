/* Length-balanced placement of a global batch's samples over ranks (FreeScale, `--balance`).
 *
 * Sequence samples cost what their histories cost: the encoder's work grows like L^alpha (linear
 * layers ~ L, attention ~ L^2), so with heavy-tailed lengths the rank that drew the longest
 * histories is the straggler every other rank waits for. A plan moves samples between ranks; the
 * global batch and every sample in it stay the same (only where each one trains changes), and so
 * does the loss: a sum over the global batch's samples over its size.
 *
 *   none  rank r trains the r-th contiguous slice (the data order), Bg / shares samples each
 *   fbs   fixed batch size: the same count per rank, dealt zig-zag over the lengths sorted
 *         longest first (rank 0, 1, .., S-1, S-1, .., 0, 0, 1, ..), so every rank gets the same
 *         mix of long and short histories
 *   vbs   variable batch size: counts differ, the sums of cost(L) = c0 + L^alpha match as well as a
 *         greedy longest-first placement (each sample to the least loaded share) can make them;
 *         a share holds at most 2 Bg / S samples (the memory plan) and at least `min_count`
 *
 * Deterministic: ties break by sample index, so every rank computes the same plan from the same
 * lengths. Within a share the samples keep their data order. */
#ifndef NB_BALANCE_H
#define NB_BALANCE_H

#include <stddef.h>
#include <stdint.h>

typedef enum { NB_BALANCE_NONE = 0, NB_BALANCE_FBS, NB_BALANCE_VBS } nb_balance_kind;

typedef struct {
    nb_balance_kind kind;
    double alpha, c0; /* vbs: the cost model c0 + L^alpha of one sample */
} nb_balance;

#define NB_BALANCE_ALPHA 1.5
#define NB_BALANCE_C0 16.0

/* "none", "fbs", "vbs", "vbs:ALPHA" or "vbs:ALPHA:C0"; anything else fails naming --balance. */
void nb_balance_parse(nb_balance *b, const char *spec);
/* The spec back, as parsed ("vbs:1.5:16"). */
void nb_balance_name(const nb_balance *b, char *buf, int cap);
/* The most samples one share may get from a global batch of Bg over `shares` shares. none and
 * fbs need Bg divisible by shares (checked by the caller). */
int nb_balance_cap(const nb_balance *b, int Bg, int shares);
double nb_balance_cost(const nb_balance *b, int32_t len);
/* Scratch bytes nb_balance_assign and nb_balance_order need (the caller allocates it once: a plan
 * is made every step). */
size_t nb_balance_scratch_bytes(int Bg, int shares);
/* The plan for one global batch: share_of[i] in 0..shares-1 for sample i (len[i] its history
 * length), count[s] samples per share (each in min_count..cap). Needs shares * min_count <= Bg. */
void nb_balance_assign(const nb_balance *b, const int32_t *len, int Bg, int shares, int min_count, int *share_of,
                       int *count, void *scratch);
/* The samples in share order (data order within a share): order[k] = the sample at position k;
 * first[s] = where share s starts (shares + 1 entries). */
void nb_balance_order(const int *share_of, int Bg, int shares, int *order, int *first, void *scratch);

#endif
