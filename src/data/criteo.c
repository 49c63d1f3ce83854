#include "data/criteo.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <glob.h>
#include <sys/stat.h>
#include <zlib.h>

#include "core.h"
#include "io/atomic.h"

/* The binary format is little-endian and records are packed with memcpy of native fields. */
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the Criteo binary format assumes a little-endian host"
#endif
_Static_assert(4 * NB_CRITEO_NDENSE + 4 * NB_CRITEO_NCAT + 4 + 2 + 1 + 1 == NB_CRITEO_BIN_RECORD_BYTES,
               "record layout");

#define MAX_LOGGED_BAD 10 /* bad lines logged one by one; the rest are only counted */
#define BIN_CHUNK 4096    /* records per fread */
#define STRICT_HINT "fix or drop that line, or run without --strict to skip bad lines"
#define BIN_HINT "remake it from the TSV with nb_criteo_convert ('nobubble criteo-convert')"

#define MAX_FILES 4096 /* files in one --data list */

struct nb_criteo_reader {
    char path[1024];   /* the file being read */
    char **paths;      /* the list, in reading order */
    int npaths, cur;   /* current file */
    uint64_t fline;    /* lines read of the current file (messages name path:fline) */
    uint64_t cur_good; /* good samples of the current file */
    FILE *f;
    gzFile gz;  /* TSV files, plain or gzip (zlib reads plain files through unchanged) */
    unsigned char *ibuf;
    size_t ilen, ipos;
    nb_criteo_layout layout;
    int strict;
    int binary;
    int done; /* end reached and summarised */
    nb_criteo_stats st;
    /* TSV */
    char *line;
    size_t line_cap;
    /* binary */
    uint64_t count, header_positives, next_index, file_positives;
    int from_start; /* this pass began at record 0, so positives can be checked at the end */
    unsigned char *chunk;
    size_t chunk_n, chunk_pos;
};

const char *nb_criteo_layout_name(nb_criteo_layout layout) {
    switch (layout) {
    case NB_CRITEO_KAGGLE: return "kaggle";
    case NB_CRITEO_1TB: return "1tb";
    case NB_CRITEO_UNLABELED: return "unlabeled";
    }
    return "unknown";
}

static int layout_valid(int layout) {
    return layout == NB_CRITEO_KAGGLE || layout == NB_CRITEO_1TB || layout == NB_CRITEO_UNLABELED;
}

/* ------------------------------------------------------------------ one TSV line */

static nb_criteo_reason why_set(char *why, size_t cap, nb_criteo_reason r, const char *fmt, ...)
    NB_PRINTF(4, 5);
static nb_criteo_reason why_set(char *why, size_t cap, nb_criteo_reason r, const char *fmt, ...) {
    if (why && cap) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, cap, fmt, ap);
        va_end(ap);
    }
    return r;
}

/* Shown field text is cut, so a garbage line cannot flood the log. */
#define SHOW(s, n) (int)((n) > 24 ? 24 : (n)), (s)

/* Decimal int64, optional leading '-', nothing else (no '+', spaces, or decimal point). */
static int parse_i64(const char *s, size_t n, int64_t *v) {
    int neg = n > 0 && s[0] == '-';
    size_t i = (size_t)neg;
    if (i == n) return 0;
    uint64_t acc = 0, limit = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    for (; i < n; i++) {
        unsigned d = (unsigned char)s[i] - '0';
        if (d > 9) return 0;
        if (acc > (limit - d) / 10) return 0;
        acc = acc * 10 + d;
    }
    /* -(acc) as int64 without overflowing at INT64_MIN */
    *v = neg ? (int64_t)(0 - acc) : (int64_t)acc;
    return 1;
}

static int parse_hex8(const char *s, size_t n, uint32_t *v) {
    if (n != 8) return 0;
    uint32_t acc = 0;
    for (size_t i = 0; i < 8; i++) {
        unsigned c = (unsigned char)s[i], d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else return 0;
        acc = acc << 4 | d;
    }
    *v = acc;
    return 1;
}

/* The model's dense transform; in double so the float result does not depend on libm's logf. */
static float dense_transform(int64_t x) { return x > 0 ? (float)log1p((double)x) : 0.0f; }

/* Field f of the labelled layout (0 label, 1..13 I, 14..39 C) into out. */
static inline nb_criteo_reason parse_field(size_t f, const char *p, size_t len, nb_ctr_sample *out, char *why,
                                           size_t cap) {
    if (f == 0) {
        if (len != 1 || (p[0] != '0' && p[0] != '1'))
            return why_set(why, cap, NB_CRITEO_BAD_LABEL, "label is '%.*s', expected 0 or 1", SHOW(p, len));
        out->label = (uint8_t)(p[0] - '0');
    } else if (f <= NB_CRITEO_NDENSE) {
        int64_t v;
        if (len == 0) out->dense_missing |= (uint16_t)(1u << (f - 1));
        else if (parse_i64(p, len, &v)) out->dense[f - 1] = dense_transform(v);
        else return why_set(why, cap, NB_CRITEO_BAD_INT, "I%zu is '%.*s', not an integer", f, SHOW(p, len));
    } else {
        size_t c = f - 1 - NB_CRITEO_NDENSE;
        if (len == 0) out->cat_missing |= 1u << c;
        else if (!parse_hex8(p, len, &out->cat[c]))
            return why_set(why, cap, NB_CRITEO_BAD_HEX, "C%zu is '%.*s', not 8 hex digits", c + 1, SHOW(p, len));
    }
    return NB_CRITEO_OK;
}

nb_criteo_reason nb_criteo_parse_line(const char *line, size_t n, nb_criteo_layout layout,
                                      nb_ctr_sample *out, char *why, size_t cap) {
    NB_CHECK(layout_valid(layout), "this is a bug in the caller", "unknown Criteo layout %d", (int)layout);
    if (n > 0 && line[n - 1] == '\r') n--;
    const int has_label = layout != NB_CRITEO_UNLABELED;
    const size_t want = (size_t)has_label + NB_CRITEO_NDENSE + NB_CRITEO_NCAT;
    memset(out, 0, sizeof *out);
    /* One pass: fields are short (~6 bytes), so an inline scan beats a memchr call per field.
     * The scan goes on after a bad value so that a wrong field count, the likelier cause (a lost
     * or doubled tab shifts every later field), is the reason reported. */
    nb_criteo_reason err = NB_CRITEO_OK;
    size_t k = 0;
    for (const char *p = line, *end = line + n;; k++) {
        const char *q = p;
        while (q < end && *q != '\t') q++;
        if (k < want && err == NB_CRITEO_OK) err = parse_field(k + !has_label, p, (size_t)(q - p), out, why, cap);
        if (q == end) break;
        p = q + 1;
    }
    if (k + 1 != want)
        return why_set(why, cap, NB_CRITEO_BAD_FIELDS,
                       "%zu tab-separated fields, expected %zu (%sI1..I13, C1..C26)", k + 1, want,
                       has_label ? "label, " : "");
    return err;
}

/* ------------------------------------------------------------------ binary records */

static void pack_record(const nb_ctr_sample *s, unsigned char *b) {
    memcpy(b, s->dense, 4 * NB_CRITEO_NDENSE);
    b += 4 * NB_CRITEO_NDENSE;
    memcpy(b, s->cat, 4 * NB_CRITEO_NCAT);
    b += 4 * NB_CRITEO_NCAT;
    memcpy(b, &s->cat_missing, 4);
    memcpy(b + 4, &s->dense_missing, 2);
    b[6] = s->label;
    b[7] = 0;
}

/* Unpack and validate; returns NULL or what is wrong. */
static const char *unpack_record(const unsigned char *b, nb_criteo_layout layout, nb_ctr_sample *s) {
    memset(s, 0, sizeof *s);
    memcpy(s->dense, b, 4 * NB_CRITEO_NDENSE);
    b += 4 * NB_CRITEO_NDENSE;
    memcpy(s->cat, b, 4 * NB_CRITEO_NCAT);
    b += 4 * NB_CRITEO_NCAT;
    memcpy(&s->cat_missing, b, 4);
    memcpy(&s->dense_missing, b + 4, 2);
    s->label = b[6];
    if (b[7] != 0) return "padding byte is not zero";
    if (s->label > 1 || (layout == NB_CRITEO_UNLABELED && s->label != 0)) return "label is not 0/1";
    if (s->cat_missing >> NB_CRITEO_NCAT) return "categorical missing mask has bits above C26";
    if (s->dense_missing >> NB_CRITEO_NDENSE) return "dense missing mask has bits above I13";
    for (int i = 0; i < NB_CRITEO_NDENSE; i++) {
        if (!isfinite(s->dense[i]) || s->dense[i] < 0) return "a dense value is negative or not finite";
        if ((s->dense_missing >> i & 1) && s->dense[i] != 0) return "a missing dense value is not 0";
    }
    for (int j = 0; j < NB_CRITEO_NCAT; j++)
        if ((s->cat_missing >> j & 1) && s->cat[j] != 0) return "a missing categorical value is not 0";
    return NULL;
}

typedef struct {
    char magic[8];
    uint32_t version, layout, record_bytes, zero0;
    uint64_t count, positives, source_lines, source_bad;
    unsigned char zero1[8];
} bin_header;
_Static_assert(sizeof(bin_header) == NB_CRITEO_BIN_HEADER_BYTES, "binary header size");

static void bin_open(nb_criteo_reader *r, const unsigned char *head, size_t got) {
    const char *p = r->path;
    bin_header h;
    NB_CHECK(got == sizeof h, BIN_HINT, "Criteo binary file '%s' is truncated: %zu bytes, shorter than the %d-byte header",
             p, got, NB_CRITEO_BIN_HEADER_BYTES);
    memcpy(&h, head, sizeof h);
    NB_CHECK(h.version == NB_CRITEO_BIN_VERSION, BIN_HINT, "'%s' has format version %u, expected %d", p,
             h.version, NB_CRITEO_BIN_VERSION);
    NB_CHECK(h.record_bytes == NB_CRITEO_BIN_RECORD_BYTES, BIN_HINT, "'%s' has %u-byte records, expected %d", p,
             h.record_bytes, NB_CRITEO_BIN_RECORD_BYTES);
    NB_CHECK(layout_valid((int)h.layout), BIN_HINT, "'%s' has unknown layout %u", p, h.layout);
    NB_CHECK((int)h.layout == (int)r->layout, "pass the layout the file was converted from, or reconvert",
             "'%s' holds the %s layout, but the %s layout was asked for", p,
             nb_criteo_layout_name((nb_criteo_layout)h.layout), nb_criteo_layout_name(r->layout));
    static const unsigned char zeros[8];
    NB_CHECK(h.zero0 == 0 && memcmp(h.zero1, zeros, 8) == 0, BIN_HINT, "'%s': reserved header bytes are not zero", p);
    NB_CHECK(h.positives <= h.count, BIN_HINT, "'%s': header says %" PRIu64 " positives of %" PRIu64 " records", p,
             h.positives, h.count);
    /* a labeled file without one click is a damaged header (or useless data): say so now, not
     * after the full pass that would find the records' positives differ */
    NB_CHECK(h.positives > 0 || h.count == 0 || h.layout != NB_CRITEO_KAGGLE, BIN_HINT,
             "'%s': header says 0 positives of %" PRIu64 " labeled records (no click to learn from)", p, h.count);
    struct stat sb;
    NB_CHECK(fstat(fileno(r->f), &sb) == 0, NULL, "cannot stat '%s': %s", p, strerror(errno));
    NB_CHECK(h.count <= (UINT64_MAX - NB_CRITEO_BIN_HEADER_BYTES) / NB_CRITEO_BIN_RECORD_BYTES, BIN_HINT,
             "'%s': record count %" PRIu64 " is impossible", p, h.count);
    uint64_t want = NB_CRITEO_BIN_HEADER_BYTES + h.count * NB_CRITEO_BIN_RECORD_BYTES;
    NB_CHECK((uint64_t)sb.st_size == want, BIN_HINT,
             "'%s' is %" PRIu64 " bytes, but its header promises %" PRIu64 " records = %" PRIu64
             " bytes (cut short, or bytes appended)", p, (uint64_t)sb.st_size, h.count, want);
    r->binary = 1;
    r->count = h.count;
    r->header_positives = h.positives;
    r->chunk = nb_malloc((size_t)BIN_CHUNK * NB_CRITEO_BIN_RECORD_BYTES, "Criteo binary read buffer");
    r->from_start = 1;
}

static int bin_next(nb_criteo_reader *r, nb_ctr_sample *out) {
    if (r->chunk_pos == r->chunk_n) {
        uint64_t left = r->count - r->next_index;
        if (left == 0) return 0;
        size_t want = left < BIN_CHUNK ? (size_t)left : BIN_CHUNK;
        size_t got = fread(r->chunk, NB_CRITEO_BIN_RECORD_BYTES, want, r->f);
        NB_CHECK(got == want, "check the disk; " BIN_HINT, "cannot read record %" PRIu64 " of '%s': %s",
                 r->next_index + got, r->path, ferror(r->f) ? strerror(errno) : "unexpected end of file");
        r->chunk_n = got;
        r->chunk_pos = 0;
    }
    const char *bad = unpack_record(r->chunk + r->chunk_pos * NB_CRITEO_BIN_RECORD_BYTES, r->layout, out);
    NB_CHECK(!bad, BIN_HINT, "'%s' record %" PRIu64 " is corrupt: %s", r->path, r->next_index, bad);
    r->chunk_pos++;
    r->next_index++;
    return 1;
}

/* ------------------------------------------------------------------ reader */

/* A TSV file (plain or gzip) goes through zlib; the header bytes were only peeked. */
static void tsv_open(nb_criteo_reader *r) {
    fclose(r->f);
    r->f = NULL;
    r->gz = gzopen(r->path, "rb");
    NB_CHECK(r->gz != NULL, "check the path and permissions of the Criteo file", "cannot open '%s': %s", r->path,
             errno ? strerror(errno) : "out of memory");
    NB_CHECK(gzbuffer(r->gz, 1 << 20) == 0, NULL, "cannot size zlib's buffer for '%s'", r->path);
    if (!r->ibuf) r->ibuf = nb_malloc(1 << 20, "a Criteo read buffer");
    r->ilen = r->ipos = 0;
}

/* Opens file i of the list; its kind (binary or TSV) by its first bytes. */
static void open_file(nb_criteo_reader *r, int i) {
    r->cur = i;
    r->fline = r->cur_good = r->file_positives = 0;
    snprintf(r->path, sizeof r->path, "%s", r->paths[i]);
    const char *path = r->path;
    r->f = nb_fopen(path, "rb", "check the path of the Criteo file");
    struct stat sb;
    NB_CHECK(fstat(fileno(r->f), &sb) == 0, NULL, "cannot stat '%s': %s", path, strerror(errno));
    NB_CHECK(!S_ISDIR(sb.st_mode), "pass a Criteo file, not a folder", "'%s' is a directory", path);
    unsigned char head[NB_CRITEO_BIN_HEADER_BYTES];
    size_t got = fread(head, 1, sizeof head, r->f);
    NB_CHECK(!ferror(r->f), NULL, "cannot read '%s': %s", path, strerror(errno));
    r->binary = 0;
    if (got >= 8 && memcmp(head, NB_CRITEO_BIN_MAGIC, 8) == 0) {
        free(r->chunk);
        r->chunk = NULL;
        r->chunk_n = r->chunk_pos = 0;
        r->next_index = 0;
        bin_open(r, head, got);
    } else {
        tsv_open(r);
    }
}

static void close_file(nb_criteo_reader *r) {
    if (r->f) fclose(r->f); /* read-only: nothing to lose on a close error */
    if (r->gz) gzclose_r(r->gz);
    r->f = NULL, r->gz = NULL;
}

static int has_glob(const char *s) { return strpbrk(s, "*?[") != NULL; }

static void add_path(nb_criteo_reader *r, const char *p) {
    NB_CHECK(r->npaths < MAX_FILES, "concatenate some files", "more than %d Criteo files in one list", MAX_FILES);
    NB_CHECK(strlen(p) < sizeof r->path, "use a shorter path", "path too long: '%s'", p);
    r->paths[r->npaths] = strdup(p);
    NB_CHECK(r->paths[r->npaths] != NULL, NULL, "out of memory listing Criteo files");
    r->npaths++;
}

/* "a.tsv,b.tsv.gz,day_*.gz": comma-separated items in that order, each glob in sorted order */
static void expand_list(nb_criteo_reader *r, const char *spec) {
    r->paths = nb_calloc(MAX_FILES, sizeof *r->paths, "the Criteo file list");
    char *copy = strdup(spec), *save = NULL;
    NB_CHECK(copy != NULL, NULL, "out of memory listing Criteo files");
    for (char *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        if (!has_glob(item) || nb_file_exists(item)) {
            add_path(r, item);
            continue;
        }
        glob_t g;
        int rc = glob(item, GLOB_ERR, NULL, &g);
        NB_CHECK(rc != GLOB_NOMATCH, "check the pattern (quote it so the shell does not expand it first)",
                 "no Criteo file matches '%s'", item);
        NB_CHECK(rc == 0, "check the folder's permissions", "cannot list '%s' (glob error %d)", item, rc);
        for (size_t k = 0; k < g.gl_pathc; k++) add_path(r, g.gl_pathv[k]);
        globfree(&g);
    }
    free(copy);
    NB_CHECK(r->npaths > 0, "pass a Criteo file, a comma-separated list or a glob", "no Criteo file in '%s'", spec);
}

nb_criteo_reader *nb_criteo_open(const char *path, nb_criteo_layout layout, int strict) {
    NB_CHECK(layout_valid(layout), "this is a bug in the caller", "unknown Criteo layout %d", (int)layout);
    nb_criteo_reader *r = nb_calloc(1, sizeof *r, "Criteo reader");
    r->layout = layout;
    r->strict = strict;
    expand_list(r, path);
    open_file(r, 0);
    return r;
}

static void note_bad(nb_criteo_reader *r, nb_criteo_reason why, const char *msg) {
    r->st.bad++;
    r->st.bad_by[why]++;
    if (r->strict) nb_fail(STRICT_HINT, "%s:%" PRIu64 ": bad Criteo line: %s", r->path, r->fline, msg);
    if (r->st.first_bad_line == 0) {
        r->st.first_bad_line = r->fline;
        snprintf(r->st.first_bad, sizeof r->st.first_bad, "%s", msg);
    }
    if (r->st.bad <= MAX_LOGGED_BAD)
        nb_log(1, "criteo: %s:%" PRIu64 ": skipping bad line: %s%s\n", r->path, r->fline, msg,
               r->st.bad == MAX_LOGGED_BAD ? " (further bad lines are only counted)" : "");
}

/* The end of the current file: a binary file's positives against its header (a whole pass of
 * it), a TSV file must have held a good line. */
static void finish_file(nb_criteo_reader *r) {
    const nb_criteo_stats *s = &r->st;
    if (r->binary) {
        NB_CHECK(!r->from_start || r->file_positives == r->header_positives, BIN_HINT,
                 "'%s' is corrupt: its records hold %" PRIu64 " positives, its header says %" PRIu64, r->path,
                 r->file_positives, r->header_positives);
        return;
    }
    NB_CHECK(r->cur_good > 0, "check that the file is Criteo TSV of the given layout (label, I1..I13, C1..C26, tabs)",
             "'%s' has no valid Criteo line (%" PRIu64 " lines read; first bad, line %" PRIu64 ": %s)",
             r->path, r->fline, s->first_bad_line, s->first_bad_line ? s->first_bad : "none");
}

static void finish_pass(nb_criteo_reader *r) {
    if (r->done) return;
    r->done = 1;
    const nb_criteo_stats *s = &r->st;
    if (s->bad)
        nb_log(1,
               "criteo: %s%s: %" PRIu64 " lines, %" PRIu64 " good, %" PRIu64 " bad skipped (field count %" PRIu64
               ", label %" PRIu64 ", integer %" PRIu64 ", hex %" PRIu64 ")\n",
               r->path, r->npaths > 1 ? " and the files before it" : "", s->lines, s->good, s->bad,
               s->bad_by[NB_CRITEO_BAD_FIELDS], s->bad_by[NB_CRITEO_BAD_LABEL], s->bad_by[NB_CRITEO_BAD_INT],
               s->bad_by[NB_CRITEO_BAD_HEX]);
}

/* A Criteo line is under 1 KB; a "line" this long is not Criteo TSV (a binary file, a file
 * without newlines), and is refused as soon as the reader has this much of it, not after the
 * whole file went into memory. */
#define NB_CRITEO_MAX_LINE ((size_t)1 << 20)

/* The next byte of the current TSV file, or EOF; a zlib error (a damaged or cut-short .gz) ends
 * the run naming the file and the line. */
static inline int next_byte(nb_criteo_reader *r) {
    if (r->ipos < r->ilen) return r->ibuf[r->ipos++];
    int n = gzread(r->gz, r->ibuf, 1 << 20);
    int err = Z_OK;
    const char *msg = gzerror(r->gz, &err);
    NB_CHECK(n >= 0 && err == Z_OK, "check the file: re-download or re-compress it (gzip -t tests a .gz)",
             "cannot read '%s' after line %" PRIu64 ": %s", r->path, r->fline,
             err == Z_ERRNO ? strerror(errno ? errno : EIO) : msg);
    if (n == 0) return EOF;
    r->ilen = (size_t)n, r->ipos = 1;
    return r->ibuf[0];
}

/* The next line into r->line without its newline; its length, or -1 at the end of the file. */
static long long read_line(nb_criteo_reader *r) {
    size_t len = 0;
    int c = EOF;
    while ((c = next_byte(r)) != EOF && c != '\n') {
        NB_CHECK(len + 1 < NB_CRITEO_MAX_LINE, "check that the file is Criteo TSV (label, I1..I13, C1..C26, tabs, a line each)",
                 "'%s' line %" PRIu64 " is longer than %zu bytes: not a Criteo line", r->path, r->fline + 1,
                 NB_CRITEO_MAX_LINE - 1);
        if (len + 2 > r->line_cap) {
            size_t cap = r->line_cap ? 2 * r->line_cap : 4096;
            char *p = realloc(r->line, cap);
            NB_CHECK(p != NULL, NULL, "out of memory reading '%s'", r->path);
            r->line = p, r->line_cap = cap;
        }
        r->line[len++] = (char)c;
    }
    if (c == EOF && len == 0) return -1;
    if (!r->line) r->line = nb_malloc(r->line_cap = 4096, "a Criteo line");
    r->line[len] = 0;
    return (long long)len;
}

static int tsv_next(nb_criteo_reader *r, nb_ctr_sample *out) {
    for (;;) {
        long long n = read_line(r);
        if (n < 0) return 0;
        r->st.lines++;
        r->fline++;
        size_t len = (size_t)n;
        char why[256];
        nb_criteo_reason res = nb_criteo_parse_line(r->line, len, r->layout, out, why, sizeof why);
        if (res == NB_CRITEO_OK) return 1;
        note_bad(r, res, why);
    }
}

int nb_criteo_next(nb_criteo_reader *r, nb_ctr_sample *out) {
    if (r->done) return 0;
    for (;;) {
        if (r->binary ? bin_next(r, out) : tsv_next(r, out)) break;
        finish_file(r);
        if (r->cur + 1 == r->npaths) {
            finish_pass(r);
            return 0;
        }
        close_file(r);
        open_file(r, r->cur + 1);
    }
    if (r->binary) r->st.lines++, r->fline++;
    r->st.good++;
    r->cur_good++;
    r->st.positives += out->label;
    r->file_positives += out->label;
    return 1;
}

const char *nb_criteo_where(const nb_criteo_reader *r, uint64_t *line) {
    *line = r->fline;
    return r->path;
}

int nb_criteo_files(const nb_criteo_reader *r) { return r->npaths; }

const nb_criteo_stats *nb_criteo_get_stats(const nb_criteo_reader *r) { return &r->st; }

int nb_criteo_is_binary(const nb_criteo_reader *r) { return r->binary; }

uint64_t nb_criteo_count(const nb_criteo_reader *r) {
    NB_CHECK(r->npaths == 1, "pass one binary file", "'%s' is a list of %d files: its count is only known after reading them",
             r->paths[0], r->npaths);
    NB_CHECK(r->binary, "convert the TSV with nb_criteo_convert to know its length up front",
             "'%s' is TSV: its sample count is only known after reading it", r->path);
    return r->count;
}

void nb_criteo_seek(nb_criteo_reader *r, uint64_t i) {
    NB_CHECK(r->npaths == 1, "pass one binary file for random access", "cannot seek in a list of %d files", r->npaths);
    NB_CHECK(r->binary, "convert the TSV with nb_criteo_convert for random access",
             "cannot seek in TSV file '%s'", r->path);
    NB_CHECK(i <= r->count, "this is a bug in the caller", "seek to record %" PRIu64 " of '%s', which has %" PRIu64,
             i, r->path, r->count);
    uint64_t off = NB_CRITEO_BIN_HEADER_BYTES + i * NB_CRITEO_BIN_RECORD_BYTES;
    NB_CHECK(off <= (uint64_t)INT64_MAX && fseeko(r->f, (off_t)off, SEEK_SET) == 0, NULL,
             "cannot seek in '%s': %s", r->path, strerror(errno));
    memset(&r->st, 0, sizeof r->st);
    r->next_index = i;
    r->chunk_n = r->chunk_pos = 0;
    r->from_start = i == 0;
    r->fline = r->file_positives = r->cur_good = 0;
    r->done = 0;
}

void nb_criteo_rewind(nb_criteo_reader *r) {
    if (r->npaths == 1 && r->binary) {
        nb_criteo_seek(r, 0);
        return;
    }
    close_file(r);
    open_file(r, 0);
    memset(&r->st, 0, sizeof r->st);
    r->file_positives = 0;
    r->done = 0;
}

void nb_criteo_close(nb_criteo_reader *r) {
    if (!r) return;
    close_file(r);
    for (int i = 0; i < r->npaths; i++) free(r->paths[i]);
    free(r->paths);
    free(r->line);
    free(r->chunk);
    free(r->ibuf);
    free(r);
}

/* ------------------------------------------------------------------ conversion */

nb_criteo_stats nb_criteo_convert(const char *tsv_path, const char *bin_path, nb_criteo_layout layout, int strict) {
    nb_criteo_reader *r = nb_criteo_open(tsv_path, layout, strict);
    NB_CHECK(!r->binary, "pass the TSV file as the source", "'%s' is already a Criteo binary file", tsv_path);
    char tmp[4200];
    FILE *f = nb_atomic_open(bin_path, tmp, sizeof tmp);
    bin_header h;
    memset(&h, 0, sizeof h);
    /* Placeholder header (zero magic, so a crash can never leave a plausible file); rewritten at the end. */
    nb_atomic_write(f, tmp, bin_path, &h, sizeof h);
    nb_ctr_sample s;
    unsigned char rec[NB_CRITEO_BIN_RECORD_BYTES];
    while (nb_criteo_next(r, &s)) {
        pack_record(&s, rec);
        nb_atomic_write(f, tmp, bin_path, rec, sizeof rec);
    }
    nb_criteo_stats st = r->st;
    nb_criteo_close(r);
    memcpy(h.magic, NB_CRITEO_BIN_MAGIC, 8);
    h.version = NB_CRITEO_BIN_VERSION;
    h.layout = (uint32_t)layout;
    h.record_bytes = NB_CRITEO_BIN_RECORD_BYTES;
    h.count = st.good;
    h.positives = st.positives;
    h.source_lines = st.lines;
    h.source_bad = st.bad;
    if (fseek(f, 0, SEEK_SET) != 0) nb_atomic_fail(f, tmp, bin_path, "seek", errno);
    nb_atomic_write(f, tmp, bin_path, &h, sizeof h);
    nb_atomic_commit(f, tmp, bin_path);
    return st;
}
