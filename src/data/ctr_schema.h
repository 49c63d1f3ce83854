/* Your own CTR features: a schema (JSON) that says which columns of a CSV / TSV file are the
 * label, an id, dense features, categorical features and a sequence (a target item and its
 * history), and the reader that follows it (`--data csv:FILE --schema SCHEMA.json`).
 *
 * Schema file (every key but "label" and one feature is optional):
 *   {
 *     "delimiter": ",",                 ","  (default), "\t" or ";"
 *     "header": true,                   the first line names the columns (default true)
 *     "columns": ["label", "x", ...],   without a header: every column's name, in file order
 *     "label": "clicked",               0/1 (any number in [0, 1]); may be absent from the file
 *                                       only for `nobubble predict`
 *     "id": "impression_id",            optional: `predict` writes it beside each score
 *     "missing": ["", "NA", "null"],    values that mean "missing" (this list is the default)
 *     "dense": ["age", {"name": "price", "transform": "log1p"}],
 *                                       numbers; transform log1p (default: log(1 + max(x, 0)),
 *                                       Criteo's) or none; missing -> 0
 *     "categorical": [{"name": "user", "cardinality": 50000},
 *                     {"name": "city", "hash_size": 4096}],
 *                                       cardinality N: the values are integers 0..N-1;
 *                                       hash_size N: any text, hashed (FNV-1a) into N rows;
 *                                       "hex8": true with hash_size: 8 hex digits as one id (Criteo);
 *                                       missing -> row 0;
 *                                       "pooling": "sum" or "mean" (default "none": one value) with
 *                                       "max_values" K (1..256) and "separator" (default " "): a
 *                                       multi-valued column (values split by the separator, each
 *                                       hashed / checked as above; the model sums or averages their
 *                                       rows; empty or missing: no value, a zero vector; a row with
 *                                       more than K values is refused, naming file:line:column)
 *     "sequence": {"target": "item", "history": "recent_items", "separator": " ",
 *                  "cardinality": 100000 (or "hash_size"), "max_len": 32,
 *                  "pooling": "target_attention"},
 *                                       target and history share one item table; the history
 *                                       lists items oldest first (the most recent max_len are
 *                                       kept); pooling: target_attention (the model's: the
 *                                       target item attends over the encoded history)
 *     "embedding_dim": 16               the embedding width (--emb-dim, unless given)
 *   }
 * The model takes its shape from the schema (model/seqctr.h): as many dense inputs and
 * categorical tables as the schema names (at most 64 of each: NB_SCHEMA_MAX_DENSE, _MAX_CAT;
 * none reads as one slot that is always 0, a learned constant), one sequence, one embedding
 * width for every table. Columns the schema does not name are ignored. A checkpoint keeps the
 * shape; one written before it did (no "ndense" / "ncat" in state.json) has 13 and 26, and a
 * schema with fewer columns fills the rest as MovieLens does: dense slots read 0, categorical
 * slots get a table of one row.
 *
 * Built-in schemas (--schema NAME): "criteo" is Kaggle Criteo's TSV (no header, tab-separated:
 * label, I1..I13 as log1p dense, C1..C26 as 8 hex digits), so `csv:train.txt --schema criteo`
 * reads the same samples as `criteo:train.txt`. The synthetic generator (`--data synth`, data/
 * synth.h) describes its own columns as a schema too (nb_ctr_schema_synth): every source's model
 * shape comes from one description.
 *
 * Quoted fields ("a, b", "say ""hi""", a quoted field across lines) follow RFC 4180; a trailing
 * "\r" is dropped; .gz files are read as they are. A bad row ends the run naming the file, the
 * line, the column (name and number) and what is wrong. */
#ifndef NB_CTR_SCHEMA_H
#define NB_CTR_SCHEMA_H

#include <stdint.h>

#include "core.h"
#include "data/synth.h"

#define NB_SCHEMA_MAX_DENSE 64 /* = model/seqctr.h's NB_SC_MAX_DENSE */
#define NB_SCHEMA_MAX_CAT 64   /* = NB_SC_MAX_CAT */
#define NB_SCHEMA_MAX_COLS 1024
#define NB_SCHEMA_NAME 64
#define NB_SCHEMA_MAX_MISSING 8

typedef enum { NB_COL_LABEL, NB_COL_ID, NB_COL_DENSE, NB_COL_CAT, NB_COL_TARGET, NB_COL_HISTORY } nb_col_role;

typedef struct {
    char name[NB_SCHEMA_NAME];
    nb_col_role role;
    int slot;       /* dense: 0..ndense-1, categorical: 0..ncat-1 */
    int log1p;      /* dense: log(1 + max(x, 0)) */
    int64_t rows;   /* categorical / items: the table's rows (capped by --table-cap: ids mod rows) */
    int64_t card;   /* cardinality: values must be below it */
    int hashed;     /* 1: values hashed into rows; 0: integers 0..rows-1 */
    int hex8;       /* Criteo: 8 hex digits, the id as a uint32 (the model takes it mod rows) */
    int pool;       /* categorical: NB_SC_POOL_NONE (one value), _SUM or _MEAN (multi-valued) */
    int max_values; /* multi-valued: the most values a row may hold (K) */
    int mv_index;   /* multi-valued: its index among them (0..nmv-1) and where its values start in a */
    int mv_off;     /* row's [mv_width] (the earlier multi-valued columns' max_values summed) */
    char sep;       /* multi-valued: the values' separator */
} nb_schema_col;

typedef struct {
    char src[NB_PATH_MAX]; /* the file (or "built-in NAME"), for messages */
    char delim;
    int header;
    int ncols;              /* named columns */
    nb_schema_col col[NB_SCHEMA_MAX_DENSE + NB_SCHEMA_MAX_CAT + 4];
    int nfile;              /* header-less: the file's columns ("columns") */
    char (*file_cols)[NB_SCHEMA_NAME];
    int ndense, ncat, has_seq, max_len, emb_dim;
    int nmv, mv_width; /* multi-valued categorical columns, their max_values summed */
    int64_t item_rows;
    char hist_sep;
    int nmissing;
    char missing[NB_SCHEMA_MAX_MISSING][16];
} nb_ctr_schema;

/* A schema file, or a built-in name ("criteo"); any mistake ends in nb_fail naming the file and
 * the key. table_cap bounds the table rows (rows = min(schema rows, table_cap)). */
void nb_ctr_schema_load(nb_ctr_schema *s, const char *path_or_name, int64_t table_cap);
void nb_ctr_schema_free(nb_ctr_schema *s);
int nb_ctr_schema_builtin(const char *name);
/* The synthetic generator's columns (data/synth.h) as a schema: I1..I13 dense (already the
 * model's values: transform none), C1..C26 categorical of the generator's cardinalities, and the
 * sequence "item" / "history" over its items, max_len the generator's; table rows capped by
 * table_cap. It describes; nb_synth_fill fills the columns in this order. */
void nb_ctr_schema_synth(nb_ctr_schema *s, const nb_synth *g, int64_t table_cap);

/* One row as the model reads it. */
typedef struct {
    float dense[NB_SCHEMA_MAX_DENSE]; /* [ndense]; the rest 0 */
    uint32_t cat[NB_SCHEMA_MAX_CAT];  /* [ncat]; the rest 0 */
    uint32_t target;
    uint32_t *hist; /* [len], oldest first; the reader's buffer */
    uint32_t *mv;   /* [mv_width]: multi-valued column j's values at its mv_off; the reader's buffer */
    int32_t mv_len[NB_SCHEMA_MAX_CAT]; /* [nmv] */
    int len;
    float label;
    uint64_t line;  /* the row's first line in its file (1-based) */
    const char *id; /* the id column's text, or NULL; the reader's buffer */
} nb_ctr_row;

typedef struct nb_ctr_table nb_ctr_table;
/* need_label 0: a file without the label column reads label 0 (predict). */
nb_ctr_table *nb_ctr_table_open(const char *path, const nb_ctr_schema *s, int need_label);
/* The next row: 1, or 0 at the end of the file. */
int nb_ctr_table_next(nb_ctr_table *t, nb_ctr_row *row);
void nb_ctr_table_close(nb_ctr_table *t);

#endif
