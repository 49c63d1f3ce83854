/* CTR schemas: a JSON file or a built-in layout (see ctr_schema.h). */
#include "data/ctr_schema.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/json.h"
#include "model/seqctr.h"

#define HINT "fix the schema file (see the README's 'Your own CTR data' section)"
#define CRITEO_NDENSE 13
#define CRITEO_NCAT 26

static const nb_json *typed(const nb_json *j, const char *src, const char *key, nb_json_type t) {
    const nb_json *v = nb_json_get(j, key);
    if (!v || v->type == NB_JSON_NULL) return NULL;
    NB_CHECK(v->type == t, HINT, "%s:%d:%d: \"%s\" is %s, expected %s", src, v->line, v->col, key,
             nb_json_type_name(v->type), nb_json_type_name(t));
    return v;
}

static void set_name(char *dst, const nb_json *v, const char *src, const char *what) {
    NB_CHECK(v && v->type == NB_JSON_STR && v->len > 0 && v->len < NB_SCHEMA_NAME, HINT,
             "%s:%d:%d: %s must be a column name of 1..%d characters", src, v ? v->line : 0, v ? v->col : 0, what,
             NB_SCHEMA_NAME - 1);
    snprintf(dst, NB_SCHEMA_NAME, "%s", v->str);
}

static nb_schema_col *add_col(nb_ctr_schema *s, const char *name, nb_col_role role) {
    NB_CHECK(s->ncols < (int)(sizeof s->col / sizeof s->col[0]), HINT, "%s: too many columns", s->src);
    for (int i = 0; i < s->ncols; i++)
        NB_CHECK(strcmp(s->col[i].name, name) != 0, HINT, "%s: column '%s' is named twice", s->src, name);
    nb_schema_col *c = &s->col[s->ncols++];
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, "%s", name);
    c->role = role;
    return c;
}

static int64_t cap_rows(int64_t rows, int64_t cap) { return rows < cap ? rows : cap; }

/* "cardinality" N or "hash_size" N (exactly one) */
static void table_rows(const nb_json *o, const char *src, const char *what, int64_t cap, int64_t *rows, int64_t *card,
                       int *hashed) {
    const nb_json *cj = typed(o, src, "cardinality", NB_JSON_NUM), *hs = typed(o, src, "hash_size", NB_JSON_NUM);
    NB_CHECK(!cj != !hs, HINT, "%s:%d:%d: %s needs exactly one of \"cardinality\" (integer values 0..N-1) and \"hash_size\" (hashed text)",
             src, o->line, o->col, what);
    const nb_json *v = cj ? cj : hs;
    NB_CHECK(v->is_int && v->i64 >= 1 && v->i64 < (1ll << 31), HINT, "%s:%d:%d: %s: %s must be an integer in 1..2^31-1",
             src, v->line, v->col, what, cj ? "cardinality" : "hash_size");
    *rows = cap_rows(v->i64, cap);
    *card = v->i64;
    *hashed = hs != NULL;
}

static void load_dense(nb_ctr_schema *s, const nb_json *arr) {
    NB_CHECK(arr->len <= NB_SCHEMA_MAX_DENSE, "combine or drop dense columns: the model reads at most 64",
             "%s: %zu dense columns, at most %d", s->src, arr->len, NB_SCHEMA_MAX_DENSE);
    for (size_t i = 0; i < arr->len; i++) {
        const nb_json *e = &arr->items[i];
        char name[NB_SCHEMA_NAME];
        int log1p = 1;
        if (e->type == NB_JSON_OBJ) {
            set_name(name, nb_json_get(e, "name"), s->src, "a dense column's \"name\"");
            const char *t = nb_json_get_str(e, "transform", "log1p");
            NB_CHECK(!strcmp(t, "log1p") || !strcmp(t, "none"), HINT, "%s:%d:%d: dense '%s': transform '%s' (log1p or none)",
                     s->src, e->line, e->col, name, t);
            log1p = !strcmp(t, "log1p");
        } else {
            set_name(name, e, s->src, "a dense column");
        }
        nb_schema_col *c = add_col(s, name, NB_COL_DENSE);
        c->slot = s->ndense++, c->log1p = log1p;
    }
}

/* "pooling": "none" (one value), "sum" or "mean" (a multi-valued column: "max_values",
 * "separator") */
static void load_pooling(nb_ctr_schema *s, nb_schema_col *c, const nb_json *e) {
    const char *pool = nb_json_get_str(e, "pooling", "none");
    c->pool = !strcmp(pool, "sum") ? NB_SC_POOL_SUM : !strcmp(pool, "mean") ? NB_SC_POOL_MEAN : NB_SC_POOL_NONE;
    NB_CHECK(c->pool != NB_SC_POOL_NONE || !strcmp(pool, "none"), HINT,
             "%s:%d:%d: categorical '%s': pooling '%s' (none, sum or mean; the sequence's pooling is target_attention)",
             s->src, e->line, e->col, c->name, pool);
    const nb_json *k = nb_json_get(e, "max_values"), *sep = nb_json_get(e, "separator");
    if (c->pool == NB_SC_POOL_NONE) {
        NB_CHECK(!k && !sep, HINT, "%s:%d:%d: categorical '%s': \"max_values\" and \"separator\" go with \"pooling\": \"sum\" or \"mean\"",
                 s->src, e->line, e->col, c->name);
        return;
    }
    NB_CHECK(k && k->type == NB_JSON_NUM && k->is_int && k->i64 >= 1 && k->i64 <= NB_SC_MAX_MV, HINT,
             "%s:%d:%d: categorical '%s': a multi-valued column needs \"max_values\": the most values a row holds, 1..%d",
             s->src, k ? k->line : e->line, k ? k->col : e->col, c->name, NB_SC_MAX_MV);
    NB_CHECK(!c->hex8, HINT, "%s: categorical '%s': hex8 is for single-valued columns", s->src, c->name);
    const char *sp = nb_json_get_str(e, "separator", " ");
    NB_CHECK(strlen(sp) == 1 && sp[0] != s->delim && sp[0] != '"', HINT,
             "%s:%d:%d: categorical '%s': the separator must be one character other than the delimiter and '\"'", s->src,
             e->line, e->col, c->name);
    c->sep = sp[0];
    c->max_values = (int)k->i64;
    c->mv_index = s->nmv++;
    c->mv_off = s->mv_width;
    s->mv_width += c->max_values;
}

static void load_cat(nb_ctr_schema *s, const nb_json *arr, int64_t cap) {
    NB_CHECK(arr->len <= NB_SCHEMA_MAX_CAT, "hash some columns together: the model has at most 64 categorical tables",
             "%s: %zu categorical columns, at most %d", s->src, arr->len, NB_SCHEMA_MAX_CAT);
    for (size_t i = 0; i < arr->len; i++) {
        const nb_json *e = &arr->items[i];
        NB_CHECK(e->type == NB_JSON_OBJ, HINT, "%s:%d:%d: a categorical column is {\"name\": ..., \"cardinality\" or \"hash_size\": N}",
                 s->src, e->line, e->col);
        char name[NB_SCHEMA_NAME];
        set_name(name, nb_json_get(e, "name"), s->src, "a categorical column's \"name\"");
        nb_schema_col *c = add_col(s, name, NB_COL_CAT);
        c->slot = s->ncat++;
        table_rows(e, s->src, name, cap, &c->rows, &c->card, &c->hashed);
        c->hex8 = nb_json_get_bool(e, "hex8", 0);
        NB_CHECK(!c->hex8 || c->hashed, HINT, "%s: categorical '%s': hex8 goes with hash_size", s->src, name);
        int64_t dim = nb_json_get_int(e, "embedding_dim", 0);
        NB_CHECK(dim == 0 || dim == s->emb_dim, "give every table the schema's \"embedding_dim\"",
                 "%s: categorical '%s' asks for embedding_dim %lld; the model has one width for every table (%d)", s->src,
                 name, (long long)dim, s->emb_dim);
        load_pooling(s, c, e);
    }
}

static void load_seq(nb_ctr_schema *s, const nb_json *o, int64_t cap) {
    char name[NB_SCHEMA_NAME];
    set_name(name, nb_json_get(o, "target"), s->src, "sequence \"target\"");
    add_col(s, name, NB_COL_TARGET);
    set_name(name, nb_json_get(o, "history"), s->src, "sequence \"history\"");
    add_col(s, name, NB_COL_HISTORY);
    int hashed;
    int64_t card;
    table_rows(o, s->src, "sequence", cap, &s->item_rows, &card, &hashed);
    for (int k = 1; k <= 2; k++)
        s->col[s->ncols - k].hashed = hashed, s->col[s->ncols - k].rows = s->item_rows, s->col[s->ncols - k].card = card;
    const char *sep = nb_json_get_str(o, "separator", " ");
    NB_CHECK(strlen(sep) == 1 && sep[0] != s->delim, HINT, "%s: the history separator must be one character other than the delimiter",
             s->src);
    s->hist_sep = sep[0];
    int64_t L = nb_json_get_int(o, "max_len", 0);
    NB_CHECK(L >= 0 && L <= 65536, HINT, "%s: sequence max_len %lld (0..65536; 0: --max-len)", s->src, (long long)L);
    s->max_len = (int)L;
    const char *pool = nb_json_get_str(o, "pooling", "target_attention");
    NB_CHECK(!strcmp(pool, "target_attention"), "use \"target_attention\" (the model's history pooling)",
             "%s: sequence pooling '%s' is not built", s->src, pool);
    s->has_seq = 1;
}

static void load_missing(nb_ctr_schema *s, const nb_json *root) {
    const nb_json *m = typed(root, s->src, "missing", NB_JSON_ARR);
    static const char *def[] = {"", "NA", "null"};
    if (!m) {
        s->nmissing = 3;
        for (int i = 0; i < 3; i++) snprintf(s->missing[i], sizeof s->missing[i], "%s", def[i]);
        return;
    }
    NB_CHECK(m->len <= NB_SCHEMA_MAX_MISSING, HINT, "%s: at most %d \"missing\" values", s->src, NB_SCHEMA_MAX_MISSING);
    for (size_t i = 0; i < m->len; i++) {
        NB_CHECK(m->items[i].type == NB_JSON_STR && m->items[i].len < 16, HINT, "%s: \"missing\" holds strings of up to 15 bytes",
                 s->src);
        snprintf(s->missing[s->nmissing++], sizeof s->missing[0], "%s", m->items[i].str);
    }
}

static void load_header_less(nb_ctr_schema *s, const nb_json *cols) {
    NB_CHECK(cols, HINT, "%s: \"header\": false needs \"columns\": every column's name in file order", s->src);
    NB_CHECK(cols->len >= 1 && cols->len <= NB_SCHEMA_MAX_COLS, HINT, "%s: \"columns\" holds 1..%d names", s->src, NB_SCHEMA_MAX_COLS);
    s->nfile = (int)cols->len;
    s->file_cols = nb_calloc(cols->len, sizeof *s->file_cols, "schema columns");
    for (size_t i = 0; i < cols->len; i++) set_name(s->file_cols[i], &cols->items[i], s->src, "\"columns\" entry");
}

/* Criteo's columns (and the synthetic generator's, which mimics them): label, I1..I13, C1..C26
 * in file order, header-less. */
static void criteo_columns(nb_ctr_schema *s, int log1p) {
    s->header = 0;
    s->nfile = 1 + CRITEO_NDENSE + CRITEO_NCAT;
    s->file_cols = nb_calloc((size_t)s->nfile, sizeof *s->file_cols, "schema columns");
    snprintf(s->file_cols[0], NB_SCHEMA_NAME, "label");
    add_col(s, "label", NB_COL_LABEL);
    for (int i = 0; i < CRITEO_NDENSE; i++) {
        snprintf(s->file_cols[1 + i], NB_SCHEMA_NAME, "I%d", i + 1);
        nb_schema_col *c = add_col(s, s->file_cols[1 + i], NB_COL_DENSE);
        c->slot = s->ndense++, c->log1p = log1p;
    }
    for (int j = 0; j < CRITEO_NCAT; j++) {
        snprintf(s->file_cols[1 + CRITEO_NDENSE + j], NB_SCHEMA_NAME, "C%d", j + 1);
        nb_schema_col *c = add_col(s, s->file_cols[1 + CRITEO_NDENSE + j], NB_COL_CAT);
        c->slot = s->ncat++;
    }
}

/* Kaggle Criteo: label, I1..I13, C1..C26; tab-separated, no header */
static void builtin_criteo(nb_ctr_schema *s, int64_t cap) {
    snprintf(s->src, sizeof s->src, "built-in schema criteo");
    s->delim = '\t', s->emb_dim = 0;
    criteo_columns(s, 1);
    for (int i = 0; i < s->ncols; i++)
        if (s->col[i].role == NB_COL_CAT) s->col[i].rows = cap, s->col[i].hashed = 1, s->col[i].hex8 = 1;
    s->nmissing = 1; /* only the empty field */
    s->missing[0][0] = 0;
}

void nb_ctr_schema_synth(nb_ctr_schema *s, const nb_synth *g, int64_t cap) {
    _Static_assert(NB_SYNTH_NDENSE == CRITEO_NDENSE && NB_SYNTH_NCAT == CRITEO_NCAT, "the generator has Criteo's columns");
    memset(s, 0, sizeof *s);
    snprintf(s->src, sizeof s->src, "the synthetic generator's schema");
    s->delim = '\t', s->hist_sep = ' ';
    criteo_columns(s, 0); /* the generator writes log(1 + x) itself */
    for (int i = 0; i < s->ncols; i++) {
        nb_schema_col *c = &s->col[i];
        if (c->role != NB_COL_CAT) continue;
        c->card = g->card[c->slot], c->rows = cap_rows(c->card, cap);
        if (!g->o.multi_hot) continue;
        c->pool = NB_SC_POOL_SUM, c->max_values = nb_synth_mlperf_hot[c->slot]; /* summed, as MLPerf */
        c->mv_off = s->mv_width;
        s->nmv++, s->mv_width += c->max_values;
    }
    add_col(s, "item", NB_COL_TARGET);
    add_col(s, "history", NB_COL_HISTORY);
    s->item_rows = cap_rows(g->o.items, cap);
    for (int k = 1; k <= 2; k++) s->col[s->ncols - k].rows = s->item_rows, s->col[s->ncols - k].card = g->o.items;
    s->has_seq = 1, s->max_len = g->o.max_len;
}

int nb_ctr_schema_builtin(const char *name) { return !strcmp(name, "criteo"); }

void nb_ctr_schema_load(nb_ctr_schema *s, const char *path, int64_t cap) {
    memset(s, 0, sizeof *s);
    s->item_rows = 1;
    s->hist_sep = ' ';
    if (!strcmp(path, "criteo")) {
        builtin_criteo(s, cap);
        return;
    }
    NB_CHECK(path[0], "pass --schema FILE.json (or a built-in: criteo) with --data csv:FILE", "no schema for the CSV data");
    snprintf(s->src, sizeof s->src, "%s", path);
    nb_json *root = nb_json_load_file(path);
    NB_CHECK(root->type == NB_JSON_OBJ, HINT, "%s: the schema is a JSON object", path);
    static const char *known[] = {"delimiter", "header", "columns", "label", "id", "missing", "dense", "categorical",
                                  "sequence", "embedding_dim", "comment", NULL};
    for (size_t i = 0; i < root->len; i++) {
        int ok = 0;
        for (int k = 0; known[k]; k++) ok |= !strcmp(root->keys[i], known[k]);
        NB_CHECK(ok, "the keys are delimiter, header, columns, label, id, missing, dense, categorical, sequence, embedding_dim, comment",
                 "%s:%d:%d: unknown key \"%s\"", path, root->items[i].line, root->items[i].col, root->keys[i]);
    }
    const char *d = nb_json_get_str(root, "delimiter", ",");
    NB_CHECK(!strcmp(d, ",") || !strcmp(d, "\t") || !strcmp(d, ";"), HINT, "%s: delimiter '%s' (\",\", \"\\t\" or \";\")", path, d);
    s->delim = d[0];
    s->header = nb_json_get_bool(root, "header", 1);
    int64_t E = nb_json_get_int(root, "embedding_dim", 0);
    NB_CHECK(E == 0 || (E >= 4 && E <= 4096), HINT, "%s: embedding_dim %lld (4..4096)", path, (long long)E);
    s->emb_dim = (int)E;
    char name[NB_SCHEMA_NAME];
    set_name(name, nb_json_get(root, "label"), path, "\"label\"");
    add_col(s, name, NB_COL_LABEL);
    const nb_json *id = nb_json_get(root, "id");
    if (id && id->type != NB_JSON_NULL) {
        set_name(name, id, path, "\"id\"");
        add_col(s, name, NB_COL_ID);
    }
    load_missing(s, root);
    const nb_json *dense = typed(root, path, "dense", NB_JSON_ARR), *cat = typed(root, path, "categorical", NB_JSON_ARR);
    const nb_json *seq = typed(root, path, "sequence", NB_JSON_OBJ);
    if (dense) load_dense(s, dense);
    if (cat) load_cat(s, cat, cap);
    if (seq) load_seq(s, seq, cap);
    NB_CHECK(s->ndense + s->ncat + s->has_seq > 0, HINT, "%s: no feature: name \"dense\", \"categorical\" or \"sequence\" columns", path);
    if (!s->header) load_header_less(s, typed(root, path, "columns", NB_JSON_ARR));
    nb_json_free(root);
    /* every named column must be a column of a header-less file */
    for (int i = 0; i < s->ncols && !s->header; i++) {
        int found = 0;
        for (int k = 0; k < s->nfile; k++) found |= !strcmp(s->file_cols[k], s->col[i].name);
        NB_CHECK(found, HINT, "%s: column '%s' is not in \"columns\"", path, s->col[i].name);
    }
}

void nb_ctr_schema_free(nb_ctr_schema *s) {
    free(s->file_cols);
    s->file_cols = NULL;
}
