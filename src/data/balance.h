/* FreeScale (balanced, prioritized, SM-free training of sequence recommendation models) in one
 * place. Its three parts, as the paper presents them, and where each lives:
 *
 *   1. load balancing of skewed history lengths: a cost model of a sample (c0 + L^alpha), a plan
 *      that places the global batch's samples over the ranks by it (fbs: equal counts, equal mix;
 *      vbs: variable counts, equal cost), and the cost model's fit from measured part times
 *                                                   here (data/balance.c)
 *      the plan carried out: each rank reads its slice, the ranks all-gather the lengths and an
 *      all-to-all moves every sample to its rank (--emulate-ranks: one process stands in for N)
 *                                                   data/balance_place.c
 *   2. prioritized embedding updates: rows a batch shares with the batch before (collisions)
 *      move after that batch's update, the others ahead (--emb-priority)
 *                                                   emb/resync.c (with NestPipe's re-sync)
 *   3. SM-free communication: all-to-alls on copy engines, not on the GPU's SMs (--comm-sm-free)
 *                                                   comm/copy_sm.cu, comm/comm_host.c
 *
 * Length-balanced placement of a global batch's samples over ranks (`--balance`).
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

/* The cost model's fit (--emulate-ranks): least squares of the parts' measured times
 * t = k + x n + y sum L^a for each exponent a of a grid (k: what every part costs whatever its
 * samples, launches and fixed-size kernels: no placement moves it). The best fit's a and
 * c0 = x / y (a sample's own cost in units of L^a) are what --balance vbs:a:c0 takes. */
#define NB_BALANCE_FIT_NA 16 /* the exponents a = 1, 1.1, .., 2.5 */
double nb_balance_fit_alpha(int j);
typedef struct {
    double *rec; /* per part: samples, time (-1 until the part ran), sum of L^a per exponent */
    int n, cap;
} nb_balance_fit;
void nb_balance_fit_init(nb_balance_fit *f, int cap);
void nb_balance_fit_free(nb_balance_fit *f);
/* Adds a part's samples (their history lengths) to sum_pow: sum of L^a per exponent of the grid. */
void nb_balance_fit_lengths(double sum_pow[NB_BALANCE_FIT_NA], const int32_t *len, int n);
/* A part's record, its time still unknown (none once the records are full). */
void nb_balance_fit_add(nb_balance_fit *f, int samples, const double sum_pow[NB_BALANCE_FIT_NA]);
/* The times of the last m records (the step's parts, once they ran). */
void nb_balance_fit_times(nb_balance_fit *f, const double *secs, int m);
/* "cost fit: part time = ..." on stdout (nothing with fewer than 6 timed parts). */
void nb_balance_fit_print(const nb_balance_fit *f);

#endif
