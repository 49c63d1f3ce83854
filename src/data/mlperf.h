/* MLPerf DLRM-DCNv2's preprocessed Criteo 1TB multi-hot days (`--data mlperf:DIR`), read in place
 * from memory maps. The reference (mlcommons/training recommendation_v2/torchrec_dlrm: its
 * preprocessing, then materialize_synthetic_multihot_dataset.py; read by its
 * data/multi_hot_criteo.py) keeps day N in three files:
 *   DIR/day_N_dense.npy              float32 [rows, 13]  the dense features, used as stored
 *                                    (the preprocessing applied its log transform)
 *   DIR/day_N_labels.npy             int32 (or float32) [rows, 1] or [rows]  0 or 1
 *   DIR/day_N_sparse_multi_hot.npz   members 0.npy .. 25.npy, stored (not compressed):
 *                                    int32 [rows, k_f]  feature f's k_f ids per sample
 *                                    (k = 3,2,1,2,6,1,1,1,1,7,3,8,1,6,9,5,1,1,1,12,100,27,10,3,1,1)
 * Training reads days 0, 1, ... (those present from day 0, up to day 22) in order, wrapping round;
 * held out is the first half of day 23 (rows 0 .. ceil(rows / 2) - 1: the reference's "val" split).
 * Ids are read as unsigned and taken mod the table's rows by the model, as the reference takes
 * them mod its num_embeddings_per_feature. Every file is checked (magic, dtype, shape against the
 * others, the bytes the shape needs) before a sample is read. */
#ifndef NB_DATA_MLPERF_H
#define NB_DATA_MLPERF_H

#include <stdint.h>

#include "io/npy.h"

#define NB_MLPERF_NDENSE 13
#define NB_MLPERF_NCAT 26
#define NB_MLPERF_TRAIN_DAYS 23 /* days 0 .. 22; day 23 is the held-out one */

typedef struct {
    nb_npy_file dense, labels, sparse;
    nb_npy d, l, s[NB_MLPERF_NCAT];
    int64_t first, rows; /* the rows of the day this set reads */
} nb_mlperf_day;

typedef struct {
    int ndays;
    nb_mlperf_day day[NB_MLPERF_TRAIN_DAYS];
    int64_t start[NB_MLPERF_TRAIN_DAYS + 1]; /* set row -> day: start[d] <= i < start[d + 1] */
    int hot[NB_MLPERF_NCAT];                 /* k_f, the same on every day */
    int width;                               /* their sum: a sample's values */
} nb_mlperf_set;

/* The training days (held_out 0) or day 23's first half (1) of DIR; nb_fail on a missing or damaged
 * file, naming it. */
void nb_mlperf_open(nb_mlperf_set *s, const char *dir, int held_out);
void nb_mlperf_close(nb_mlperf_set *s);
/* Sample i (0 .. start[ndays] - 1) of the set: dense [13], cat [26] (each feature's first id), mv
 * [width] (feature after feature), mv_len [26] (k_f each), label. */
void nb_mlperf_get(const nb_mlperf_set *s, int64_t i, float *dense, uint32_t *cat, uint32_t *mv, int32_t *mv_len, float *label);
static inline int64_t nb_mlperf_rows(const nb_mlperf_set *s) { return s->start[s->ndays]; }

#endif
