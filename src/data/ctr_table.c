/* The CSV / TSV reader that follows a CTR schema (see ctr_schema.h). */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "data/ctr_schema.h"

#define MAX_RECORD ((size_t)16 << 20) /* a row this long is not a CSV row (a binary file, no newlines) */
#define BUF_BYTES (1 << 20)
#define ROW_HINT "fix that row of the file (or the schema: delimiter, header, column kinds)"

struct nb_ctr_table {
    const nb_ctr_schema *s;
    char path[NB_PATH_MAX];
    gzFile gz;
    unsigned char *buf;
    size_t blen, bpos;
    int eof;
    uint64_t line, rec_line; /* lines read; the current record's first line */
    char *rec;               /* the record's fields, each NUL-terminated */
    size_t rec_len, rec_cap;
    size_t *off;             /* [fcap] where each field starts in rec */
    int nf, fcap, nhead;     /* fields of this record; of the header (or "columns") */
    char (*head)[NB_SCHEMA_NAME];
    int *at; /* [schema ncols] the file column of each schema column (-1: absent) */
    int need_label;
    uint32_t *hist;
    int hcap;
    uint32_t *mv; /* [mv_width]: the row's multi-valued columns' values */
};

static int next_byte(nb_ctr_table *t) {
    if (t->bpos < t->blen) return t->buf[t->bpos++];
    if (t->eof) return EOF;
    int n = gzread(t->gz, t->buf, BUF_BYTES);
    int err = Z_OK;
    const char *msg = gzerror(t->gz, &err);
    NB_CHECK(n >= 0 && err == Z_OK, "check the file (gzip -t tests a .gz)", "cannot read '%s' after line %" PRIu64 ": %s",
             t->path, t->line, err == Z_ERRNO ? strerror(errno ? errno : EIO) : msg);
    if (n == 0) {
        t->eof = 1;
        return EOF;
    }
    t->blen = (size_t)n, t->bpos = 1;
    return t->buf[0];
}

static void put(nb_ctr_table *t, char c) {
    if (t->rec_len + 1 >= t->rec_cap) {
        NB_CHECK(t->rec_cap < MAX_RECORD, "check that the file is CSV/TSV with one row a line (and balanced quotes)",
                 "%s:%" PRIu64 ": a row longer than %zu bytes", t->path, t->rec_line, MAX_RECORD);
        t->rec_cap = t->rec_cap ? 2 * t->rec_cap : 4096;
        t->rec = realloc(t->rec, t->rec_cap);
        NB_CHECK(t->rec != NULL, NULL, "out of memory reading '%s'", t->path);
    }
    t->rec[t->rec_len++] = c;
}

static void end_field(nb_ctr_table *t, size_t start) {
    if (t->nf == t->fcap) {
        t->fcap = t->fcap ? 2 * t->fcap : 64;
        NB_CHECK(t->fcap <= 4 * NB_SCHEMA_MAX_COLS, "check the delimiter in the schema", "%s:%" PRIu64 ": more than %d fields",
                 t->path, t->rec_line, 2 * NB_SCHEMA_MAX_COLS);
        t->off = realloc(t->off, (size_t)t->fcap * sizeof *t->off);
        NB_CHECK(t->off != NULL, NULL, "out of memory reading '%s'", t->path);
    }
    t->off[t->nf++] = start;
    put(t, 0);
}

/* The next record's fields (RFC 4180 quoting; a quoted field may span lines). 0 at the end. */
static int read_record(nb_ctr_table *t) {
    const char d = t->s->delim;
    int c;
    do { /* blank lines between rows are skipped */
        c = next_byte(t);
        if (c == '\n') t->line++;
        else if (c == '\r') { /* a blank CRLF line */
            int n = next_byte(t);
            if (n != '\n') NB_CHECK(n == EOF, ROW_HINT, "%s:%" PRIu64 ": a stray carriage return", t->path, t->line + 1);
            else t->line++;
            c = n == EOF ? EOF : '\n';
        }
    } while (c == '\n');
    if (c == EOF) return 0;
    t->rec_line = ++t->line;
    t->nf = 0, t->rec_len = 0;
    for (;;) { /* one field per turn; c is its first byte */
        size_t start = t->rec_len;
        if (c == '"') {
            for (;;) {
                c = next_byte(t);
                NB_CHECK(c != EOF, ROW_HINT, "%s:%" PRIu64 ": a quoted field is not closed before the end of the file", t->path,
                         t->rec_line);
                if (c == '"') {
                    c = next_byte(t);
                    if (c != '"') break; /* the closing quote; "" is a quote */
                }
                if (c == '\n') t->line++;
                put(t, (char)c);
            }
            if (c == '\r') c = next_byte(t);
            NB_CHECK(c == d || c == '\n' || c == EOF, ROW_HINT, "%s:%" PRIu64 ": column '%s' (column %d): text after its closing quote",
                     t->path, t->rec_line, t->head && t->nf < t->nhead ? t->head[t->nf] : "?", t->nf + 1);
        } else {
            while (c != d && c != '\n' && c != EOF) {
                put(t, (char)c);
                c = next_byte(t);
            }
            if (c != d && t->rec_len > start && t->rec[t->rec_len - 1] == '\r') t->rec_len--; /* CRLF */
        }
        end_field(t, start);
        if (c != d) return 1;
        c = next_byte(t);
    }
}

static const char *field(const nb_ctr_table *t, int k) { return t->rec + t->off[k]; }

static void map_columns(nb_ctr_table *t) {
    const nb_ctr_schema *s = t->s;
    t->at = nb_malloc((size_t)s->ncols * sizeof *t->at, "schema columns");
    for (int i = 0; i < s->ncols; i++) {
        t->at[i] = -1;
        for (int k = 0; k < t->nhead; k++)
            if (!strcmp(t->head[k], s->col[i].name)) {
                NB_CHECK(t->at[i] < 0, "give the columns distinct names", "%s: column '%s' appears twice in the header",
                         t->path, s->col[i].name);
                t->at[i] = k;
            }
        if (t->at[i] < 0 && s->col[i].role == NB_COL_LABEL && !t->need_label) continue;
        NB_CHECK(t->at[i] >= 0, "name the column in the file's header as the schema does (or fix the schema)",
                 "%s: the schema's %s column '%s' is not in %s", t->path,
                 s->col[i].role == NB_COL_LABEL ? "label" : "feature", s->col[i].name,
                 s->header ? "the file's header (its first line)" : "the schema's \"columns\"");
    }
}

nb_ctr_table *nb_ctr_table_open(const char *path, const nb_ctr_schema *s, int need_label) {
    nb_ctr_table *t = nb_calloc(1, sizeof *t, "a CSV reader");
    NB_CHECK(strlen(path) < sizeof t->path, "use a shorter path", "path too long: '%s'", path);
    snprintf(t->path, sizeof t->path, "%s", path);
    t->s = s;
    t->need_label = need_label;
    fclose(nb_fopen(path, "rb", "check the path of the CSV file")); /* its error names the path */
    errno = 0;
    t->gz = gzopen(path, "rb");
    NB_CHECK(t->gz != NULL, "check the file's permissions", "cannot open '%s': %s", path, errno ? strerror(errno) : "out of memory");
    t->buf = nb_malloc(BUF_BYTES, "a CSV read buffer");
    if (s->header) {
        NB_CHECK(read_record(t), "add a header line naming the columns (or set \"header\": false in the schema)",
                 "%s is empty: no header line", path);
        t->nhead = t->nf;
        t->head = nb_calloc((size_t)t->nf, sizeof *t->head, "the header");
        for (int k = 0; k < t->nf; k++) snprintf(t->head[k], NB_SCHEMA_NAME, "%s", field(t, k));
    } else {
        t->nhead = s->nfile;
        t->head = nb_calloc((size_t)s->nfile, sizeof *t->head, "the header");
        memcpy(t->head, s->file_cols, (size_t)s->nfile * sizeof *t->head);
    }
    map_columns(t);
    t->mv = nb_calloc((size_t)(s->mv_width ? s->mv_width : 1), sizeof *t->mv, "a CSV reader");
    return t;
}

void nb_ctr_table_close(nb_ctr_table *t) {
    if (!t) return;
    gzclose_r(t->gz); /* read-only: nothing to lose */
    free(t->buf), free(t->rec), free(t->off), free(t->head), free(t->at), free(t->hist), free(t->mv), free(t);
}

/* ---- one row ---- */

static NB_NORETURN void bad(const nb_ctr_table *t, int i, const char *fmt, const char *v) {
    const nb_schema_col *c = &t->s->col[i];
    char what[200];
    snprintf(what, sizeof what, fmt, v);
    nb_fail(ROW_HINT, "%s:%" PRIu64 ": column '%s' (column %d): %s", t->path, t->rec_line, c->name, t->at[i] + 1, what);
}

static int is_missing(const nb_ctr_schema *s, const char *v) {
    for (int k = 0; k < s->nmissing; k++)
        if (!strcmp(v, s->missing[k])) return 1;
    return 0;
}

static double number(const nb_ctr_table *t, int i, const char *v) {
    char *e;
    errno = 0;
    double x = strtod(v, &e);
    if (e == v || *e || errno == ERANGE || !isfinite(x)) bad(t, i, "'%.40s' is not a finite number", v);
    return x;
}

static uint64_t fnv1a(const char *v) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (const unsigned char *p = (const unsigned char *)v; *p; p++) h = (h ^ *p) * 0x100000001b3ULL;
    return h;
}

/* an id of a categorical or item column (n bytes of v, not necessarily NUL-terminated) */
static uint32_t id_of(const nb_ctr_table *t, int i, const char *v, size_t n) {
    const nb_schema_col *c = &t->s->col[i];
    char tok[64];
    if (n >= sizeof tok) bad(t, i, "a value of more than 63 bytes ('%.40s...')", v);
    memcpy(tok, v, n), tok[n] = 0;
    if (c->hex8) {
        uint32_t acc = 0;
        if (n != 8) bad(t, i, "'%.40s' is not 8 hex digits", tok);
        for (int k = 0; k < 8; k++) {
            unsigned ch = (unsigned char)tok[k], dg;
            if (ch >= '0' && ch <= '9') dg = ch - '0';
            else if ((ch | 32) >= 'a' && (ch | 32) <= 'f') dg = (ch | 32) - 'a' + 10;
            else bad(t, i, "'%.40s' is not 8 hex digits", tok);
            acc = acc << 4 | dg;
        }
        return acc;
    }
    if (c->hashed) return (uint32_t)(fnv1a(tok) % (uint64_t)c->rows);
    char *e;
    errno = 0;
    unsigned long long x = strtoull(tok, &e, 10);
    if (e == tok || *e || tok[0] == '-' || errno || x >= (unsigned long long)c->card) {
        char msg[120];
        snprintf(msg, sizeof msg, "'%%.40s' is not an integer in 0..%lld (the schema's cardinality)", (long long)c->card - 1);
        bad(t, i, msg, tok);
    }
    return (uint32_t)x;
}

static void history(nb_ctr_table *t, int i, const char *v, nb_ctr_row *row) {
    row->len = 0;
    for (const char *p = v; *p;) {
        const char *q = strchr(p, t->s->hist_sep);
        size_t n = q ? (size_t)(q - p) : strlen(p);
        if (n) {
            if (row->len == t->hcap) {
                t->hcap = t->hcap ? 2 * t->hcap : 256;
                t->hist = realloc(t->hist, (size_t)t->hcap * sizeof *t->hist);
                NB_CHECK(t->hist != NULL, NULL, "out of memory reading '%s'", t->path);
            }
            t->hist[row->len++] = id_of(t, i, p, n);
        }
        p += n + (q != NULL);
    }
    row->hist = t->hist;
}

/* A multi-valued column's values into its block of the row's mv; more than max_values refuses
 * the row (never cut silently: the model would train on other data than the file holds). */
static void values(nb_ctr_table *t, int i, const char *v, nb_ctr_row *row) {
    const nb_schema_col *c = &t->s->col[i];
    uint32_t *out = t->mv + c->mv_off;
    int n = 0;
    for (const char *p = v; *p;) {
        const char *q = strchr(p, c->sep);
        size_t len = q ? (size_t)(q - p) : strlen(p);
        if (len) {
            if (n == c->max_values) {
                char msg[160];
                snprintf(msg, sizeof msg, "more than %d values (the schema's \"max_values\": raise it or shorten the row) in '%%.40s'",
                         c->max_values);
                bad(t, i, msg, v);
            }
            out[n++] = id_of(t, i, p, len);
        }
        p += len + (q != NULL);
    }
    row->mv_len[c->mv_index] = n;
}

int nb_ctr_table_next(nb_ctr_table *t, nb_ctr_row *row) {
    if (!read_record(t)) return 0;
    const nb_ctr_schema *s = t->s;
    NB_CHECK(t->nf == t->nhead, ROW_HINT, "%s:%" PRIu64 ": %d fields, but the %s has %d (check the delimiter and quotes)", t->path,
             t->rec_line, t->nf, s->header ? "header" : "schema's \"columns\"", t->nhead);
    memset(row, 0, sizeof *row);
    row->line = t->rec_line;
    row->mv = t->mv;
    memset(t->mv, 0, (size_t)s->mv_width * sizeof *t->mv);
    for (int i = 0; i < s->ncols; i++) {
        const nb_schema_col *c = &s->col[i];
        if (t->at[i] < 0) continue; /* an absent label (predict) */
        const char *v = field(t, t->at[i]);
        int miss = is_missing(s, v);
        switch (c->role) {
        case NB_COL_LABEL: {
            if (miss) bad(t, i, "the label is missing ('%s')", v);
            double y = number(t, i, v);
            if (y < 0 || y > 1) bad(t, i, "label '%.40s' is outside [0, 1]", v);
            row->label = (float)y;
            break;
        }
        case NB_COL_ID: row->id = v; break;
        case NB_COL_DENSE: {
            if (miss) break;
            double x = number(t, i, v);
            /* as Criteo's: in double, so the float does not depend on libm's logf */
            float f = c->log1p ? (x > 0 ? (float)log1p(x) : 0.0f) : (float)x;
            if (!isfinite(f)) bad(t, i, "'%.40s' does not fit a float", v);
            row->dense[c->slot] = f;
            break;
        }
        case NB_COL_CAT:
            if (c->max_values) {
                if (!miss) values(t, i, v, row); /* missing: no value (mv_len stays 0) */
            } else {
                row->cat[c->slot] = miss ? 0 : id_of(t, i, v, strlen(v));
            }
            break;
        case NB_COL_TARGET: row->target = miss ? 0 : id_of(t, i, v, strlen(v)); break;
        case NB_COL_HISTORY:
            if (miss) row->len = 0, row->hist = t->hist;
            else history(t, i, v, row);
            break;
        }
    }
    return 1;
}
