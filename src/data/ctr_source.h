/* The seqctr model's data sources (`--data`), as batches of nb_sc_batch:
 *   synth[:k=v,...]  nb_synth; training reads samples 0, B, 2B, ... in order; evaluation reads the
 *                    fixed range [2^40, 2^40 + eval_samples), never trained on. The model's
 *                    max_len is the generator's (max_len= in the spec, else --max-len).
 *                    Table rows: min(cardinality, --table-cap); items: min(items, --table-cap).
 *   criteo:PATH      Kaggle TSV or nb_criteo binary; the FIRST eval_samples good samples are held
 *                    out (kept in memory) and training streams the rest, rewinding at the end.
 *                    No sequence part: every history is empty and the target item is 0 (so the
 *                    item table has one row and pooled = 0); table rows = --table-cap.
 *   csv:PATH         your own CSV / TSV (plain or .gz) described by --schema (data/ctr_schema.h),
 *                    held in memory; training reshuffles it every epoch by a fixed seed (as
 *                    MovieLens); the FIRST eval_samples rows are held out. The dense and
 *                    categorical column counts, table rows, max_len and the embedding width come
 *                    from the schema, so another file of the same schema fits the same model.
 *                    Multi-valued columns ("pooling": "sum" / "mean") are kept per sample as a
 *                    padded [max_values] block of ids with a count (nb_sc_batch's mv / mv_len),
 *                    set, batch and packed sample alike.
 *   movielens[:DIR]  DIR/clicks_train.tsv (training, reshuffled every epoch by a fixed seed) and
 *                    DIR/clicks_test.tsv (evaluation, all of it); header checked verbatim. DIR
 *                    defaults to data/movielens from the working directory, else $NB_DATA_DIR/
 *                    movielens, else the data/ folder of the repository the binary was built in.
 *                    Categorical tables 0..5 = user, item, year, genre, hour, weekday (rows =
 *                    largest id in either file + 1, capped by --table-cap, id mod rows); tables
 *                    6..25 have one row and always see id 0 (a learned constant: the model's
 *                    shape stays the 26-table one). No dense features: all 13 are 0 (the bottom
 *                    MLP gives a learned constant). target = movieId; history = the listed
 *                    movieIds (the most recent max_len).
 *   mlperf:DIR       MLPerf DLRM-DCNv2's multi-hot days (data/mlperf.h): training reads days 0..22
 *                    (those present) in order, wrapping round; evaluation reads day 23's first
 *                    half (at most eval_samples). 13 dense, 26 multi-valued columns summed, k_f
 *                    from the files; table rows: MLPerf's counts, capped by --table-cap.
 * --val-data FILE (criteo and csv): FILE (a list or glob for criteo) is the evaluation set, all of
 * it, and training reads the whole --data (nothing held out). An evaluation-only source (eval,
 * predict) with val_data reads no training data at all.
 * A source's position (where the next training batch starts: a sample index for synth, training
 * samples read for criteo, epoch * samples + offset for movielens and csv) goes into checkpoints; a
 * source seeked to it reads the same batches again, so a resumed run is bitwise a straight one. */
#ifndef NB_CTR_SOURCE_H
#define NB_CTR_SOURCE_H

#include "data/mlperf.h"
#include <stdint.h>

#include "data/criteo.h"
#include "data/ctr_schema.h"
#include "data/synth.h"
#include "model/seqctr.h"

#define NB_CTR_EVAL_BASE (1ULL << 40) /* synth: first held-out sample index */

/* in-memory sample sets (MovieLens, Criteo's held-out head) */
typedef struct {
    int nd, nc; /* dense and categorical values per sample (the model's shape) */
    long n, cap;
    uint64_t *line; /* files' rows: each sample's line in its file (predict writes it) */
    char **id;      /* csv with an "id" column: each sample's id (else NULL) */
    float *dense, *label;
    uint32_t *cat, *target;
    long *hoff; /* [n + 1] into hids */
    uint32_t *hids;
    long nh, hcap;
    int nmv, mw;    /* multi-valued columns (the model's cfg.pool), their max_values summed */
    uint32_t *mv;   /* [n, mw]: each sample's values (nb_sc_batch's layout) */
    int32_t *mvlen; /* [n, nmv] */
    long mvcap;
} nb_ctr_set;

/* The batch the model reads: host buffers of the largest batch. */
typedef struct {
    int nd, nc; /* dense [B, nd], cat [B, nc]: the model's shape */
    int nmv, mw; /* multi-valued columns: mv [B, mw] padded, mvlen [B, nmv] counts (nb_sc_batch) */
    float *dense, *label;
    uint32_t *cat, *target, *hist, *mv;
    int32_t *len, *mvlen;
    nb_sc_batch b;
} nb_ctr_batch;

enum { NB_CTR_SYNTH, NB_CTR_CRITEO, NB_CTR_MOVIELENS, NB_CTR_TABLE, NB_CTR_MLPERF };

typedef struct {
    int kind, max_len, eval_samples, eval_only;
    int ndense, ncat; /* the samples' shape: the model's (nb_ctr_source_open) */
    int nmv, mw;      /* its multi-valued columns (csv only) */
    nb_synth *g;
    nb_mlperf_set *mp; /* mlperf: [2] the training days, the held-out half day */
    nb_ctr_schema *schema; /* the columns: csv's file, criteo's and synth's built-in ones */
    uint64_t next;
    nb_criteo_reader *cr;
    long skip;         /* criteo: held-out samples at the head of every pass */
    uint64_t consumed; /* criteo: training samples read so far (the position) */
    nb_ctr_set train, eval;
    long *perm, pos;
    uint64_t epoch;
} nb_ctr_source;

typedef struct {
    const char *data;
    const char *val_data; /* "" or NULL: held out from data */
    const char *schema;   /* csv: the schema file or built-in name */
    int64_t table_cap;
    int eval_samples, strict;
    int eval_only; /* no training: with val_data, the training data is not read */
    int unlabeled; /* csv: the evaluation file may lack the label column (predict) */
    int shape_only; /* nobubble plan: the shapes only (synth skips most of its label calibration) */
} nb_ctr_source_opts;

/* Opens --data and sets the model config's shape from the data's schema: its dense and
 * categorical columns, the table sizes (and for synth the history cap). mc->ndense / mc->ncat:
 * 0 takes the data's (at least 1 each); otherwise they are a checkpoint's model's, which the data
 * must fit (a schema with fewer columns reads 0 / id 0 in the rest; more is refused). */
void nb_ctr_source_open(nb_ctr_source *s, const nb_ctr_source_opts *o, nb_sc_config *mc);
void nb_ctr_source_close(nb_ctr_source *s);
/* Batches of up to B samples with histories of up to L items, nd dense and nc categorical. */
void nb_ctr_batch_alloc(nb_ctr_batch *t, int B, int L, int nd, int nc);
void nb_ctr_batch_free(nb_ctr_batch *t);
/* The batch's multi-valued columns (after nb_ctr_batch_alloc; the model's cfg: nb_sc_nmv,
 * nb_sc_mv_width). A batch without them carries none (fills of a source with some refuse it). */
void nb_ctr_batch_alloc_mv(nb_ctr_batch *t, int B, const nb_sc_config *c);
/* The next B training samples; held-out samples first .. first + B - 1. */
void nb_ctr_fill_train(nb_ctr_source *s, nb_ctr_batch *t, int B);
/* Samples first .. first + B - 1 of the next Bg (a rank's slice of the global batch); the
 * position moves past all Bg, so every rank stays at the same position. */
void nb_ctr_fill_train_slice(nb_ctr_source *s, nb_ctr_batch *t, int Bg, int first, int B);
/* Sample `from` of src into position `to` of dst (batches of the same max_len). */
void nb_ctr_batch_copy(nb_ctr_batch *dst, int to, const nb_ctr_batch *src, int from);
/* Samples as flat words for moving them between ranks: its global-batch index, then every field
 * and its history (nb_ctr_packed_words long). unpack checks the length against dst's max_len and
 * `words` (what is left of the buffer) and returns the words it read. */
size_t nb_ctr_packed_words(const nb_ctr_batch *t, int32_t len);
size_t nb_ctr_pack(const nb_ctr_batch *t, int i, uint32_t index, uint32_t *out);
size_t nb_ctr_unpack(nb_ctr_batch *t, int j, const uint32_t *in, size_t words, uint32_t *index);
void nb_ctr_fill_eval(nb_ctr_source *s, nb_ctr_batch *t, long first, int B);
/* Key-centric clustering of a window's samples before it is cut into `parts` micro-batches
 * (NestPipe): samples are reordered by the most shared key each has (its table rows, as model m
 * looks them up; keys every sample has are skipped), so samples sharing hot keys land in the same
 * part and each part moves fewer distinct rows. Deterministic; the window's samples are unchanged.
 * The scratch is sized once for windows of up to B samples of up to max_len history items (a
 * step allocates nothing). */
typedef struct {
    int cap_B, cap_L;
    size_t cap_n;
    int64_t *keys, *uniq;
    int32_t *order, *seg, *inverse, *first;
    uint64_t *sort;
    void *samples; /* [cap_B] the samples' chosen keys */
    nb_ctr_batch tmp;
} nb_ctr_cluster;
void nb_ctr_cluster_init(nb_ctr_cluster *c, int B, int max_len, int nd, int nc);
void nb_ctr_cluster_free(nb_ctr_cluster *c);
void nb_ctr_cluster_keys(nb_ctr_batch *w, const nb_sc_model *m, int parts, nb_ctr_cluster *c);
long nb_ctr_eval_count(const nb_ctr_source *s);
/* Where evaluation sample i came from: its line (0 for synth) and id (NULL when none). */
uint64_t nb_ctr_eval_line(const nb_ctr_source *s, long i);
const char *nb_ctr_eval_id(const nb_ctr_source *s, long i);
uint64_t nb_ctr_source_position(const nb_ctr_source *s);
/* Continue from a position another run's source reported (its checkpoint). */
void nb_ctr_source_seek(nb_ctr_source *s, uint64_t pos);
/* MovieLens: each held-out rating scored by its movie's smoothed training positive rate (a
 * baseline any model should beat); score has nb_ctr_eval_count entries. */
void nb_ctr_popularity_scores(const nb_ctr_source *s, float *score);

#endif
