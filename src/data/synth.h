/* Synthetic click data for the CTR / sequence model (`--data synth[:key=value,...]`).
 *
 * Every sample is a pure function of (options, sample index): its random numbers come from
 * Philox keyed by the seed, with the sample index as the stream and (field, slot, attempt) as
 * the counter. So the stream is unlimited (any uint64 index), any sample can be generated alone
 * and any batch in parallel, and the bytes never depend on the thread count.
 *
 * A sample (the same fields as Criteo's, plus a sequence part):
 *   - 26 categorical ids: field f has card_f = min(Criteo Kaggle's distinct count of C(f+1),
 *     cap) ids. Rank k (1 = most popular) has probability proportional to k^-zipf, drawn exactly
 *     (to the 2^-32 resolution of the uniforms): the 1024 most popular ranks from an inverse-CDF
 *     table, the tail by rejection-inversion (Hormann & Derflinger 1996) restricted to ranks
 *     > 1024; O(1) expected per draw, tables of 6 KB per distribution whatever the cardinality.
 *     Ranks map to ids by a fixed bijection of [0, card_f) (scramble=1) so popular ids are spread
 *     over the id range like real hashes are; scramble=0 makes id = rank - 1.
 *   - 13 dense features: counts floor(exp(mu_j + sigma_j z)) (log-normal, per-feature mu/sigma
 *     resembling Criteo's I1..I13), missing with Criteo-like per-feature rates (or `missing=p`).
 *     Stored as the model reads them, as nb_ctr_sample does: log(1 + x), 0 when missing.
 *   - items: `items` ids, Zipf(zipf) popularity over item ranks. Item rank r belongs to interest
 *     cluster r mod 32. Each sample has a user with one interest cluster; the target and each
 *     history item come from that cluster with probability 1/2, otherwise from all items.
 *   - history length: floor(hist_scale * (U^(-1/hist_alpha) - 1)) (Pareto type II, heavy tail),
 *     capped at max_len; 0 (empty history) has probability 1 - (1 + 1/hist_scale)^-hist_alpha.
 *     The history is hist[0 .. len), most recent last; the rest of the row is 0 padding.
 *   - label ~ Bernoulli(sigmoid(logit)) from a hidden teacher:
 *       logit = bias + 0.25 sum_f w_f(cat_f) + 0.3 sum of 4 field-pair weights
 *               + sum_j v_j dense_j + 0.3 w_item(target) + 3 * affinity
 *     where the w are hashed unit-variance weights, affinity = the fraction of history items in
 *     the target's cluster (0 for an empty history). The bias is calibrated at nb_synth_init so
 *     that the mean of sigmoid(logit) over `calib` samples from an independent stream is exactly
 *     base_rate (Newton's method on the bias; the mean is monotone in it). The expected label
 *     rate then equals base_rate up to that Monte Carlo error, std(p)/sqrt(calib) (about 0.2%
 *     relative with the default 262144).
 *
 * Options ("synth" alone takes every default):
 *   seed=1  cap=1000000  zipf=1.05  items=1000000  max_len=256  hist_alpha=1.2  hist_scale=8
 *   base_rate=0.25  missing=criteo|p  scramble=1  calib=262144  multi_hot=0 */
#ifndef NB_SYNTH_H
#define NB_SYNTH_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define NB_SYNTH_NDENSE 13
#define NB_SYNTH_NCAT 26
#define NB_SYNTH_CLUSTERS 32

typedef struct {
    uint64_t seed;
    uint32_t cap;      /* upper bound on every categorical cardinality */
    double zipf;       /* Zipf exponent s > 0 of categorical ids and items */
    uint32_t items;    /* item vocabulary */
    int max_len;       /* history cap, 0 .. 65536 */
    double hist_alpha; /* Pareto tail index of history lengths */
    double hist_scale; /* Pareto scale of history lengths */
    double base_rate;  /* target mean label, in (0, 1) */
    double missing;    /* < 0: Criteo-like per-feature rates; else one rate for all 13 */
    int scramble;      /* 1: ranks map to ids by a bijection; 0: id = rank - 1 */
    int calib;         /* samples used to calibrate the bias */
    int multi_hot;     /* 1: MLPerf DLRM-DCNv2's multi-hot shape (below); 0: one id per field */
} nb_synth_opts;

/* multi_hot=1 (--model dlrm-dcnv2 asks for it): field f has MLPerf's row count capped at `cap`
 * (nb_synth_mlperf_rows) instead of Criteo Kaggle's cardinality, and nb_synth_mlperf_hot[f] ids per
 * sample (214 in all), each drawn like the single id (Zipf over ranks, scrambled); the first is
 * the field's cat id. The teacher's field term becomes CAT_W / sqrt(hot_f) times the sum of the
 * values' weights (unit variance per field whatever its size); the pairs read the first ids. */
#define NB_SYNTH_MH_WIDTH 214
extern const uint32_t nb_synth_mlperf_rows[NB_SYNTH_NCAT];
extern const int nb_synth_mlperf_hot[NB_SYNTH_NCAT];

/* Zipf(s) over ranks 1..n: the first min(n, NB_ZIPF_HEAD) ranks from a table (inverse CDF with
 * a guide table, O(1) expected), the rest by rejection-inversion restricted to the tail. */
#define NB_ZIPF_HEAD 1024
typedef struct {
    double n, s, h_head, h_n, squeeze; /* rejection-inversion over ranks head+1 .. n */
    uint64_t head_mass;                /* 2^32 P(rank <= head), rounded; 2^32 when n <= head */
    uint32_t head;                     /* min(n, NB_ZIPF_HEAD) */
    uint32_t cdf[NB_ZIPF_HEAD];        /* cdf[k] = 2^32 P(rank <= k + 1), rounded, <= 2^32 - 1 */
    uint16_t guide[NB_ZIPF_HEAD];      /* guide[b]: first k with cdf[k] > b 2^22 */
} nb_zipf;

/* About 170 KB (the Zipf head tables): keep it static or on the heap. Read-only after init, so
 * any number of threads can fill from one generator. */
typedef struct {
    nb_synth_opts o;
    uint32_t card[NB_SYNTH_NCAT];
    nb_zipf cat_zipf[NB_SYNTH_NCAT];
    uint64_t cat_mul[NB_SYNTH_NCAT], cat_add[NB_SYNTH_NCAT]; /* rank -> id bijection */
    nb_zipf item_zipf;    /* over all items */
    nb_zipf cluster_zipf; /* over the ranks of one cluster */
    uint32_t clusters;    /* min(NB_SYNTH_CLUSTERS, items) */
    uint64_t item_mul, item_add;
    float miss_rate[NB_SYNTH_NDENSE];
    float dense_w[NB_SYNTH_NDENSE];
    uint64_t teacher_key, cat_tkey[NB_SYNTH_NCAT], pair_tkey[4], item_tkey; /* weight tables */
    double bias;       /* the calibrated teacher bias */
    double calib_mean; /* mean sigmoid(logit) over the calibration set (= base_rate) */
} nb_synth;

/* Criteo Kaggle's distinct values per C column (uncapped). */
extern const uint32_t nb_synth_criteo_card[NB_SYNTH_NCAT];

void nb_synth_opts_default(nb_synth_opts *o);
/* Parse "synth", "synth:k=v,k=v" or just "k=v,k=v" over the defaults. Unknown keys, bad or
 * out-of-range values, a key given twice, or an item without '=' end in nb_fail with a hint
 * listing the valid keys and their ranges. */
void nb_synth_parse(nb_synth_opts *o, const char *spec);
/* Precompute the distributions and calibrate the teacher's bias (OpenMP over calib samples). */
void nb_synth_init(nb_synth *g, const nb_synth_opts *o);
/* Parse + init. */
void nb_synth_open(nb_synth *g, const char *spec);

/* Samples first_index .. first_index + n - 1 (OpenMP over samples). Outputs, row-major:
 *   dense [n,13] log(1 + x), 0 when missing; cat [n,26] ids < card[f]; target [n] < items;
 *   hist [n,max_len] (hist_len[i] items then 0s); hist_len [n] in 0..max_len; label [n] 0 or 1;
 *   dense_missing [n] bit j set when dense j is missing.
 * Any output may be NULL when the caller does not need it. */
void nb_synth_fill(const nb_synth *g, uint64_t first_index, int n, float *dense, uint32_t *cat,
                   uint32_t *target, uint32_t *hist, int32_t *hist_len, float *label,
                   uint16_t *dense_missing);
/* multi_hot=1: samples first_index .. + n - 1 as nb_synth_fill, their ids as multi-valued columns:
 * mv [n, NB_SYNTH_MH_WIDTH] (field f's nb_synth_mlperf_hot[f] values after the earlier fields'),
 * mv_len [n, 26] (each field's size); cat [n, 26] the first ids. */
void nb_synth_fill_multi_hot(const nb_synth *g, uint64_t first_index, int n, float *dense, uint32_t *cat, uint32_t *mv,
                             int32_t *mv_len, float *label);
/* The teacher's logit (bias included) of the same samples: sigmoid(logit) is P(label = 1).
 * For tests and for the best achievable AUC / NE of a model on this data. */
void nb_synth_teacher_logit(const nb_synth *g, uint64_t first_index, int n, float *logit);

/* The id of rank k (1-based) of field f, or of the items when f == -1 (tests use it to count
 * frequencies per rank). */
uint32_t nb_synth_rank_to_id(const nb_synth *g, int f, uint64_t k);
/* One line describing the generator (cardinalities, options, bias) into buf. */
const char *nb_synth_describe(const nb_synth *g, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
