/* Criteo TSV parser and binary format: handcrafted good and bad lines (counted by reason, strict
 * mode fatal with the line number, checked in forked children since nb_fail exits), corrupt
 * binary files refused, and the 200 real Kaggle rows in ../shared/data/ctr_samples/ checked
 * against an independent parse of the raw text and against the DeepCTR CSV of the same rows.
 * The real-data part is skipped (exit 77 when everything else passed) when that folder is
 * absent; NB_SHARED overrides where ../shared is. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* fork, mkdtemp, strsep, readlink */
#endif
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zlib.h>

#include "check.h"
#include "child.h"
#include "core.h"
#include "data/criteo.h"

static char dir[64];
static char shared_kaggle[4096], shared_csv[4096];

static const char *tmp_path(const char *name) {
    static char p[8][256];
    static int k = 0;
    k = (k + 1) % 8;
    snprintf(p[k], sizeof p[k], "%s/%s", dir, name);
    return p[k];
}

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    NB_ASSERT(f && fwrite(data, 1, n, f) == n && fclose(f) == 0);
}

static char *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    NB_ASSERT(f);
    NB_ASSERT(fseek(f, 0, SEEK_END) == 0);
    long sz = ftell(f);
    NB_ASSERT(sz >= 0 && fseek(f, 0, SEEK_SET) == 0);
    char *b = malloc((size_t)sz + 1);
    NB_ASSERT(b && fread(b, 1, (size_t)sz, f) == (size_t)sz);
    fclose(f);
    b[sz] = 0;
    if (n) *n = (size_t)sz;
    return b;
}

static int file_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* ../shared: NB_SHARED if set, else "../shared" from the working directory (tests run from the
 * repository root), else "<ancestor of this executable>/../shared". */
static int find_shared(void) {
    const char *rel = "data/ctr_samples/criteo_kaggle_200.tsv";
    const char *env = getenv("NB_SHARED");
    char base[1200] = "";
    if (env) {
        snprintf(base, sizeof base, "%s", env);
    } else {
        char exe[1024];
        ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
        snprintf(base, sizeof base, "../shared");
        snprintf(shared_kaggle, sizeof shared_kaggle, "%s/%s", base, rel);
        for (exe[n > 0 ? n : 0] = 0; !file_exists(shared_kaggle) && n > 0;) {
            char *slash = strrchr(exe, '/');
            if (!slash || slash == exe) break;
            *slash = 0;
            snprintf(base, sizeof base, "%s/../shared", exe);
            snprintf(shared_kaggle, sizeof shared_kaggle, "%s/%s", base, rel);
        }
    }
    snprintf(shared_kaggle, sizeof shared_kaggle, "%s/%s", base, rel);
    snprintf(shared_csv, sizeof shared_csv, "%s/data/ctr_samples/criteo_200_deepctr.csv", base);
    return file_exists(shared_kaggle);
}

static int sample_eq(const nb_ctr_sample *a, const nb_ctr_sample *b) {
    return memcmp(a->dense, b->dense, sizeof a->dense) == 0 && memcmp(a->cat, b->cat, sizeof a->cat) == 0 &&
           a->cat_missing == b->cat_missing && a->dense_missing == b->dense_missing && a->label == b->label;
}

/* Read a whole file; returns the number of samples (up to cap kept in out). */
static size_t read_samples(const char *path, nb_criteo_layout layout, nb_ctr_sample *out, size_t cap,
                           nb_criteo_stats *st) {
    nb_criteo_reader *r = nb_criteo_open(path, layout, 0);
    nb_ctr_sample s;
    size_t n = 0;
    while (nb_criteo_next(r, &s)) {
        if (n < cap) out[n] = s;
        n++;
    }
    if (st) *st = *nb_criteo_get_stats(r);
    nb_criteo_close(r);
    return n;
}

static float tf(double x) { return x > 0 ? (float)log1p(x) : 0.0f; }

/* ------------------------------------------------------------------ handcrafted lines */

#define NF 40
static const char *base_fields[NF] = {
    "1",
    "5", "-3", "", "0", "17668", "", "1", "35", "", "1", "", "0", "12",
    "05db9164", "08d6d899", "", "F56B7DD5", "25c83c98", "7e0ccccf", "df5c2d18", "0b153874", "a73ee510",
    "8f48ce11", "a7b606c4", "ae1bb660", "eae197fd", "b28479f6", "bfef54b3", "bad5ee18", "e5ba7672",
    "87c6f83c", "", "", "0429f84b", "", "3a171ecb", "c0d61a5c", "ffffffff", ""};

/* The base line with field k replaced by v (k < 0: none), joined with tabs, then eol. */
static size_t line_with(char *out, size_t cap, int k, const char *v, const char *eol) {
    size_t n = 0;
    for (int i = 0; i < NF; i++)
        n += (size_t)snprintf(out + n, cap - n, "%s%s", i ? "\t" : "", i == k ? v : base_fields[i]);
    n += (size_t)snprintf(out + n, cap - n, "%s", eol);
    NB_ASSERT(n < cap);
    return n;
}

static nb_criteo_reason parse(const char *line, nb_ctr_sample *s, char *why) {
    return nb_criteo_parse_line(line, strlen(line), NB_CRITEO_KAGGLE, s, why, 256);
}

TEST_CASE(test_parse_good_line) {
    char line[1024], why[256];
    nb_ctr_sample s;
    line_with(line, sizeof line, -1, NULL, "");
    CHECK(parse(line, &s, why) == NB_CRITEO_OK, "%s", why);
    CHECK(s.label == 1, "label %d", s.label);
    CHECK(s.dense[0] == tf(5) && s.dense[0] == (float)log(6.0), "I1 %g", s.dense[0]);
    CHECK(s.dense[1] == 0 && !(s.dense_missing & 2), "negative I2 is 0 and present");
    CHECK(s.dense[2] == 0 && (s.dense_missing & 4), "empty I3 is missing");
    CHECK(s.dense[4] == tf(17668), "I5 %g", s.dense[4]);
    CHECK(s.dense_missing == ((1u << 2) | (1u << 5) | (1u << 8) | (1u << 10)), "dense mask %x", s.dense_missing);
    CHECK(s.cat[0] == 0x05db9164u && s.cat[1] == 0x08d6d899u, "C1 %x C2 %x", s.cat[0], s.cat[1]);
    CHECK(s.cat[3] == 0xf56b7dd5u, "uppercase hex C4 %x", s.cat[3]);
    CHECK(s.cat[24] == 0xffffffffu, "C25 %x", s.cat[24]);
    uint32_t want_missing = (1u << 2) | (1u << 18) | (1u << 19) | (1u << 21) | (1u << 25);
    CHECK(s.cat_missing == want_missing, "cat mask %x want %x", s.cat_missing, want_missing);
    CHECK(s.cat[2] == 0 && s.cat[25] == 0, "missing cats are 0");

    /* a trailing \r is not part of C26 */
    line_with(line, sizeof line, 39, "0000abcd", "\r");
    CHECK(parse(line, &s, why) == NB_CRITEO_OK && s.cat[25] == 0xabcd && !(s.cat_missing >> 25), "CRLF %s", why);
    /* every feature empty: 40 fields, all missing */
    snprintf(line, sizeof line, "0");
    for (int i = 1; i < NF; i++) strcat(line, "\t");
    CHECK(parse(line, &s, why) == NB_CRITEO_OK, "%s", why);
    CHECK(s.dense_missing == 0x1fff && s.cat_missing == 0x3ffffff && s.label == 0, "all missing");
    /* int64 extremes */
    line_with(line, sizeof line, 1, "-9223372036854775808", "");
    CHECK(parse(line, &s, why) == NB_CRITEO_OK && s.dense[0] == 0, "INT64_MIN %s", why);
    line_with(line, sizeof line, 1, "9223372036854775807", "");
    CHECK(parse(line, &s, why) == NB_CRITEO_OK && s.dense[0] == tf(9223372036854775807.0), "INT64_MAX %s", why);
    /* the unlabeled layout: 39 fields */
    line_with(line, sizeof line, -1, NULL, "");
    const char *nolabel = strchr(line, '\t') + 1;
    CHECK(nb_criteo_parse_line(nolabel, strlen(nolabel), NB_CRITEO_UNLABELED, &s, why, sizeof why) == NB_CRITEO_OK &&
              s.label == 0 && s.dense[0] == tf(5) && s.cat[0] == 0x05db9164u,
          "unlabeled %s", why);
    CHECK(nb_criteo_parse_line(line, strlen(line), NB_CRITEO_UNLABELED, &s, why, sizeof why) == NB_CRITEO_BAD_FIELDS,
          "40 fields in the unlabeled layout");
}

TEST_CASE(test_parse_bad_lines) {
    struct { int field; const char *value; nb_criteo_reason want; const char *msg_has; } cases[] = {
        {0, "2", NB_CRITEO_BAD_LABEL, "label is '2'"},
        {0, "", NB_CRITEO_BAD_LABEL, "label"},
        {0, "01", NB_CRITEO_BAD_LABEL, "label"},
        {3, "1.5", NB_CRITEO_BAD_INT, "I3 is '1.5'"},
        {3, "12a", NB_CRITEO_BAD_INT, "I3"},
        {3, "+5", NB_CRITEO_BAD_INT, "I3"},
        {3, " 5", NB_CRITEO_BAD_INT, "I3"},
        {3, "-", NB_CRITEO_BAD_INT, "I3"},
        {13, "9223372036854775808", NB_CRITEO_BAD_INT, "I13"},
        {13, "-9223372036854775809", NB_CRITEO_BAD_INT, "I13"},
        {14, "0429f84g", NB_CRITEO_BAD_HEX, "C1 is '0429f84g'"},
        {14, "0429f84", NB_CRITEO_BAD_HEX, "C1"},
        {39, "0429f84bb", NB_CRITEO_BAD_HEX, "C26"},
        {20, "0x29f84b", NB_CRITEO_BAD_HEX, "C7"},
        {20, "0429 84b", NB_CRITEO_BAD_HEX, "C7"},
        {39, "a\tb", NB_CRITEO_BAD_FIELDS, "41 tab-separated fields"},
    };
    char line[1024], why[256];
    nb_ctr_sample s;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        line_with(line, sizeof line, cases[i].field, cases[i].value, "");
        why[0] = 0;
        nb_criteo_reason got = parse(line, &s, why);
        CHECK(got == cases[i].want && strstr(why, cases[i].msg_has), "case %zu ('%s'): reason %d, why '%s'", i,
              cases[i].value, (int)got, why);
    }
    /* too few fields: drop the last one (and its tab) */
    line_with(line, sizeof line, -1, NULL, "");
    *strrchr(line, '\t') = 0;
    CHECK(parse(line, &s, why) == NB_CRITEO_BAD_FIELDS && strstr(why, "39 tab-separated fields"), "%s", why);
    CHECK(parse("", &s, why) == NB_CRITEO_BAD_FIELDS, "empty line");
    /* a NUL byte inside a field is not a digit (the parser works on lengths, not C strings) */
    line_with(line, sizeof line, 1, "12", "");
    char *p = strchr(line, '\t') + 1;
    size_t n = strlen(line);
    p[1] = 0;
    CHECK(nb_criteo_parse_line(line, n, NB_CRITEO_KAGGLE, &s, why, sizeof why) == NB_CRITEO_BAD_INT, "NUL byte");
}

/* Lines of the handcrafted file; "good" marks the ones the reader must return. */
static size_t make_mixed_file(const char *path, nb_ctr_sample *want, size_t *nwant) {
    char buf[16384], line[1024];
    size_t n = 0, k = 0;
    char why[256];
#define ADD(...) n += (size_t)snprintf(buf + n, sizeof buf - n, __VA_ARGS__)
#define GOOD(l)                                                                                    \
    do {                                                                                           \
        NB_ASSERT(nb_criteo_parse_line(l, strlen(l), NB_CRITEO_KAGGLE, &want[k++], why, sizeof why) == 0); \
    } while (0)
    line_with(line, sizeof line, -1, NULL, ""); /* 1 good, label 1 */
    GOOD(line);
    ADD("%s\n", line);
    *strrchr(line, '\t') = 0; /* 2: 39 fields */
    ADD("%s\n", line);
    line_with(line, sizeof line, 18, "0429f84g", "\n"); /* 3: bad hex */
    ADD("%s", line);
    line_with(line, sizeof line, 0, "0", ""); /* 4: good, label 0, negative I2, CRLF */
    GOOD(line);
    ADD("%s\r\n", line);
    line_with(line, sizeof line, 0, "2", "\n"); /* 5: label 2 */
    ADD("%s", line);
    line_with(line, sizeof line, 3, "1.5", "\n"); /* 6: not an integer */
    ADD("%s", line);
    line_with(line, sizeof line, -1, NULL, "\t\n"); /* 7: 41 fields */
    ADD("%s", line);
    ADD("\n"); /* 8: empty line */
    snprintf(line, sizeof line, "0"); /* 9: good, every feature missing */
    for (int i = 1; i < NF; i++) strcat(line, "\t");
    GOOD(line);
    ADD("%s\n", line);
    line_with(line, sizeof line, 14, "0429f84", "\n"); /* 10: 7 hex digits */
    ADD("%s", line);
    line_with(line, sizeof line, 2, "99999999999999999999", "\n"); /* 11: int64 overflow */
    ADD("%s", line);
    line_with(line, sizeof line, 0, "", "\n"); /* 12: empty label */
    ADD("%s", line);
    line_with(line, sizeof line, 5, "-7", ""); /* 13: good, label 1, no final newline */
    GOOD(line);
    ADD("%s", line);
#undef ADD
#undef GOOD
    write_bytes(path, buf, n);
    *nwant = k;
    return 13;
}

static void check_mixed_stats(const nb_criteo_stats *st, const char *what) {
    CHECK(st->lines == 13 && st->good == 4 && st->bad == 9 && st->positives == 2,
          "%s: lines %llu good %llu bad %llu positives %llu", what, (unsigned long long)st->lines,
          (unsigned long long)st->good, (unsigned long long)st->bad, (unsigned long long)st->positives);
    CHECK(st->bad_by[NB_CRITEO_BAD_FIELDS] == 3 && st->bad_by[NB_CRITEO_BAD_HEX] == 2 &&
              st->bad_by[NB_CRITEO_BAD_LABEL] == 2 && st->bad_by[NB_CRITEO_BAD_INT] == 2,
          "%s: by reason %llu %llu %llu %llu", what, (unsigned long long)st->bad_by[1],
          (unsigned long long)st->bad_by[2], (unsigned long long)st->bad_by[3], (unsigned long long)st->bad_by[4]);
    CHECK(st->first_bad_line == 2 && strstr(st->first_bad, "39 tab-separated fields"), "%s: first bad %llu '%s'",
          what, (unsigned long long)st->first_bad_line, st->first_bad);
}

TEST_CASE(test_file_bad_lines_counted) {
    const char *path = tmp_path("mixed.tsv");
    nb_ctr_sample want[8], got[8];
    size_t nwant;
    make_mixed_file(path, want, &nwant);
    NB_ASSERT(nwant == 4);
    nb_criteo_stats st;
    int v = nb_verbosity;
    nb_verbosity = 0; /* the skipped-line log is expected here */
    size_t n = read_samples(path, NB_CRITEO_KAGGLE, got, 8, &st);
    nb_verbosity = v;
    CHECK(n == 4, "%zu samples", n);
    for (size_t i = 0; i < n && i < 4; i++) CHECK(sample_eq(&got[i], &want[i]), "sample %zu differs", i);
    check_mixed_stats(&st, "tsv");
    CHECK(got[1].label == 0 && got[1].dense[1] == 0 && !(got[1].dense_missing & 2), "line 4 (negative I2, CRLF)");
    CHECK(got[3].label == 1 && got[3].dense[4] == 0 && !(got[3].dense_missing & 16), "line 13 (I5 = -7)");

    /* a second pass after rewind sees the same, with fresh counts */
    nb_verbosity = 0;
    nb_criteo_reader *r = nb_criteo_open(path, NB_CRITEO_KAGGLE, 0);
    nb_ctr_sample s;
    while (nb_criteo_next(r, &s)) {}
    nb_criteo_rewind(r);
    size_t k = 0;
    while (nb_criteo_next(r, &s)) {
        CHECK(k < 4 && sample_eq(&s, &want[k]), "rewound sample %zu", k);
        k++;
    }
    nb_verbosity = v;
    CHECK(k == 4, "%zu after rewind", k);
    check_mixed_stats(nb_criteo_get_stats(r), "rewound");
    CHECK(nb_criteo_next(r, &s) == 0, "stays at the end");
    nb_criteo_close(r);
}

static void child_read_all(const void *arg) {
    const char *const *a = arg; /* path, layout as text, strict as text */
    nb_criteo_reader *r = nb_criteo_open(a[0], (nb_criteo_layout)atoi(a[1]), atoi(a[2]));
    nb_ctr_sample s;
    while (nb_criteo_next(r, &s)) {}
    nb_criteo_close(r);
}

/* Expect reading path to exit 1 with every needle in stderr. */
static void expect_fail(const char *path, nb_criteo_layout layout, int strict, const char *needle1,
                        const char *needle2) {
    char lay[8], st[8], err[4096];
    snprintf(lay, sizeof lay, "%d", (int)layout);
    snprintf(st, sizeof st, "%d", strict);
    const char *args[3] = {path, lay, st};
    int rc = child_stderr(child_read_all, args, err, sizeof err);
    CHECK(rc == 1, "reading %s: exit %d, stderr: %s", path, rc, err);
    CHECK(strstr(err, "nobubble: error: ") && strstr(err, needle1), "missing '%s' in: %s", needle1, err);
    if (needle2) CHECK(strstr(err, needle2), "missing '%s' in: %s", needle2, err);
}

TEST_CASE(test_strict_mode) {
    const char *path = tmp_path("mixed.tsv");
    nb_ctr_sample want[8];
    size_t nwant;
    make_mixed_file(path, want, &nwant);
    char where[300];
    snprintf(where, sizeof where, "%s:2: bad Criteo line: 39 tab-separated fields", path);
    expect_fail(path, NB_CRITEO_KAGGLE, 1, where, "hint:");
    /* a file whose only bad line is the last one: the line number counts every line */
    char buf[8192];
    size_t n = 0;
    for (int i = 0; i < 5; i++) n += line_with(buf + n, sizeof buf - n, -1, NULL, "\n");
    n += line_with(buf + n, sizeof buf - n, 30, "zzzzzzzz", "\n");
    write_bytes(tmp_path("late.tsv"), buf, n);
    snprintf(where, sizeof where, "%s:6: bad Criteo line: C17 is 'zzzzzzzz'", tmp_path("late.tsv"));
    expect_fail(tmp_path("late.tsv"), NB_CRITEO_KAGGLE, 1, where, NULL);
    /* the same file without strict: 5 good, 1 bad, no exit */
    nb_criteo_stats st;
    int v = nb_verbosity;
    nb_verbosity = 0;
    CHECK(read_samples(tmp_path("late.tsv"), NB_CRITEO_KAGGLE, NULL, 0, &st) == 5 && st.bad == 1 &&
              st.first_bad_line == 6,
          "non-strict late bad line");
    nb_verbosity = v;
}

TEST_CASE(test_unusable_files_refused) {
    write_bytes(tmp_path("empty.tsv"), "", 0);
    expect_fail(tmp_path("empty.tsv"), NB_CRITEO_KAGGLE, 0, "has no valid Criteo line", NULL);
    const char *csv = "label,I1,I2\n0,,3\n1,2,3\n";
    write_bytes(tmp_path("a.csv"), csv, strlen(csv));
    expect_fail(tmp_path("a.csv"), NB_CRITEO_KAGGLE, 0, "has no valid Criteo line", "3 lines read");
    /* a gzip header with nothing after it: zlib's error names the file */
    const unsigned char gz[] = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3};
    write_bytes(tmp_path("day_0.gz"), gz, sizeof gz);
    expect_fail(tmp_path("day_0.gz"), NB_CRITEO_1TB, 0, "day_0.gz", "gzip -t");
    expect_fail(tmp_path("nothing-*.tsv"), NB_CRITEO_KAGGLE, 0, "no Criteo file matches", NULL);
    expect_fail(tmp_path("does-not-exist.tsv"), NB_CRITEO_KAGGLE, 0, "does-not-exist.tsv", NULL);
}

/* ------------------------------------------------------------------ .gz and lists */

static void write_gz(const char *path, const char *data, size_t n) {
    gzFile g = gzopen(path, "wb");
    NB_ASSERT(g && gzwrite(g, data, (unsigned)n) == (int)n && gzclose(g) == Z_OK);
}

/* A .gz file, a comma list and a glob read the same samples, in order, as the plain file; a .gz
 * cut short is an error naming it, not a silently shorter file. */
TEST_CASE(test_gz_and_lists) {
    const char *tsv = tmp_path("mixed.tsv");
    nb_ctr_sample want[8], got[16];
    size_t nwant;
    make_mixed_file(tsv, want, &nwant);
    size_t n;
    char *text = read_all(tsv, &n);
    write_gz(tmp_path("part-1.tsv.gz"), text, n);
    write_bytes(tmp_path("part-2.tsv"), text, n);
    int v = nb_verbosity;
    nb_verbosity = 0;
    size_t k = read_samples(tmp_path("part-1.tsv.gz"), NB_CRITEO_KAGGLE, got, 16, NULL);
    CHECK(k == nwant, "gz: %zu samples, want %zu", k, nwant);
    for (size_t i = 0; i < k && i < nwant; i++) CHECK(sample_eq(&got[i], &want[i]), "gz sample %zu", i);
    char list[600];
    snprintf(list, sizeof list, "%s,%s", tmp_path("part-2.tsv"), tmp_path("part-1.tsv.gz"));
    nb_criteo_stats st;
    k = read_samples(list, NB_CRITEO_KAGGLE, got, 16, &st);
    CHECK(k == 2 * nwant && st.good == 2 * nwant, "list: %zu samples, want %zu", k, 2 * nwant);
    for (size_t i = 0; i < k && i < 2 * nwant; i++) CHECK(sample_eq(&got[i], &want[i % nwant]), "list sample %zu", i);
    k = read_samples(tmp_path("part-*"), NB_CRITEO_KAGGLE, got, 16, NULL); /* sorted: part-1 (gz), then part-2 */
    CHECK(k == 2 * nwant, "glob: %zu samples", k);
    /* rewinding a list starts again at its first file */
    nb_criteo_reader *r = nb_criteo_open(list, NB_CRITEO_KAGGLE, 0);
    nb_ctr_sample x;
    size_t first = 0, again = 0;
    while (nb_criteo_next(r, &x)) first++;
    nb_criteo_rewind(r);
    while (nb_criteo_next(r, &x)) again++;
    uint64_t line;
    CHECK(first == 2 * nwant && again == first && nb_criteo_files(r) == 2, "rewound list: %zu then %zu", first, again);
    CHECK(strstr(nb_criteo_where(r, &line), "part-1.tsv.gz") != NULL, "where after the list");
    nb_criteo_close(r);
    nb_verbosity = v;
    /* the same .gz cut short */
    FILE *f = fopen(tmp_path("part-1.tsv.gz"), "rb");
    NB_ASSERT(f);
    unsigned char buf[8192];
    size_t m = fread(buf, 1, sizeof buf, f);
    fclose(f);
    write_bytes(tmp_path("cut.tsv.gz"), buf, m - 12);
    expect_fail(tmp_path("cut.tsv.gz"), NB_CRITEO_KAGGLE, 0, "cut.tsv.gz", "unexpected end of file");
    free(text);
}

/* ------------------------------------------------------------------ binary */

TEST_CASE(test_binary_round_trip) {
    const char *tsv = tmp_path("mixed.tsv"), *bin = tmp_path("mixed.bin");
    nb_ctr_sample want[8], got[8];
    size_t nwant;
    make_mixed_file(tsv, want, &nwant);
    int v = nb_verbosity;
    nb_verbosity = 0;
    nb_criteo_stats cst = nb_criteo_convert(tsv, bin, NB_CRITEO_KAGGLE, 0);
    nb_verbosity = v;
    check_mixed_stats(&cst, "convert");
    size_t sz;
    free(read_all(bin, &sz));
    CHECK(sz == NB_CRITEO_BIN_HEADER_BYTES + 4 * NB_CRITEO_BIN_RECORD_BYTES, "size %zu", sz);
    nb_criteo_stats st;
    size_t n = read_samples(bin, NB_CRITEO_KAGGLE, got, 8, &st);
    CHECK(n == 4 && st.good == 4 && st.bad == 0 && st.positives == 2 && st.lines == 4, "binary: %zu samples", n);
    for (size_t i = 0; i < n && i < 4; i++) CHECK(sample_eq(&got[i], &want[i]), "binary sample %zu differs", i);

    nb_criteo_reader *r = nb_criteo_open(bin, NB_CRITEO_KAGGLE, 1);
    CHECK(nb_criteo_is_binary(r) && nb_criteo_count(r) == 4, "count");
    nb_criteo_seek(r, 2);
    nb_ctr_sample s;
    CHECK(nb_criteo_next(r, &s) && sample_eq(&s, &want[2]), "seek 2");
    CHECK(nb_criteo_next(r, &s) && sample_eq(&s, &want[3]) && !nb_criteo_next(r, &s), "after seek 2");
    nb_criteo_rewind(r);
    CHECK(nb_criteo_next(r, &s) && sample_eq(&s, &want[0]), "rewind");
    nb_criteo_close(r);

    /* no temp file left next to the result */
    char cmd[300];
    snprintf(cmd, sizeof cmd, "ls %s | grep -c tmp", dir);
    FILE *p = popen(cmd, "r");
    int ntmp = -1;
    NB_ASSERT(p && fscanf(p, "%d", &ntmp) == 1);
    pclose(p);
    CHECK(ntmp == 0, "%d temp files left", ntmp);
}

/* Copy mixed.bin with one change; returns the new path. */
static const char *corrupt(const char *name, size_t off, const void *bytes, size_t nb, long resize) {
    size_t n;
    unsigned char *b = (unsigned char *)read_all(tmp_path("mixed.bin"), &n);
    if (bytes) memcpy(b + off, bytes, nb);
    const char *out = tmp_path(name);
    write_bytes(out, b, resize ? (size_t)((long)n + resize) : n);
    free(b);
    return out;
}

TEST_CASE(test_binary_corrupt_refused) {
    /* mixed.bin was made by test_binary_round_trip */
    unsigned char ver2[4] = {2, 0, 0, 0}, two = 2, one = 1, nonzero = 7, pos[8] = {3};
    float neg = -1.0f, nanv = NAN;
    expect_fail(corrupt("short.bin", 0, NULL, 0, -1), NB_CRITEO_KAGGLE, 0, "cut short, or bytes appended", NULL);
    /* a file longer than the header says would pass as one of fewer records if not checked */
    free(read_all(tmp_path("mixed.bin"), NULL));
    {
        size_t n;
        char *b = read_all(tmp_path("mixed.bin"), &n);
        char *b2 = calloc(1, n + NB_CRITEO_BIN_RECORD_BYTES);
        memcpy(b2, b, n);
        write_bytes(tmp_path("long.bin"), b2, n + NB_CRITEO_BIN_RECORD_BYTES);
        free(b);
        free(b2);
        expect_fail(tmp_path("long.bin"), NB_CRITEO_KAGGLE, 0, "cut short, or bytes appended", NULL);
    }
    expect_fail(corrupt("header.bin", 0, NULL, 0, -(long)(4 * NB_CRITEO_BIN_RECORD_BYTES + 10)), NB_CRITEO_KAGGLE,
                0, "truncated", NULL);
    expect_fail(corrupt("ver.bin", 8, ver2, 4, 0), NB_CRITEO_KAGGLE, 0, "format version 2", NULL);
    expect_fail(tmp_path("mixed.bin"), NB_CRITEO_1TB, 0, "holds the kaggle layout", "1tb");
    const size_t rec1 = NB_CRITEO_BIN_HEADER_BYTES + NB_CRITEO_BIN_RECORD_BYTES;
    const size_t tail = 4 * NB_CRITEO_NDENSE + 4 * NB_CRITEO_NCAT; /* masks, label, pad */
    expect_fail(corrupt("label.bin", rec1 + tail + 6, &two, 1, 0), NB_CRITEO_KAGGLE, 0, "record 1 is corrupt",
                "label");
    expect_fail(corrupt("pad.bin", rec1 + tail + 7, &nonzero, 1, 0), NB_CRITEO_KAGGLE, 0, "record 1 is corrupt",
                "padding");
    expect_fail(corrupt("neg.bin", rec1, &neg, 4, 0), NB_CRITEO_KAGGLE, 0, "record 1 is corrupt", "negative");
    expect_fail(corrupt("nan.bin", rec1, &nanv, 4, 0), NB_CRITEO_KAGGLE, 0, "record 1 is corrupt", "finite");
    /* record 2 (every feature missing): a cat mask bit above C26 */
    unsigned char mask_hi[4] = {0xff, 0xff, 0xff, 0x07};
    expect_fail(corrupt("mask.bin", rec1 + NB_CRITEO_BIN_RECORD_BYTES + tail, mask_hi, 4, 0), NB_CRITEO_KAGGLE, 0,
                "record 2 is corrupt", "above C26");
    /* record 0: mark I1 (present, 5) missing although its value is not 0 */
    expect_fail(corrupt("dmask.bin", NB_CRITEO_BIN_HEADER_BYTES + tail + 4, &one, 1, 0), NB_CRITEO_KAGGLE, 0,
                "record 0 is corrupt", "missing dense");
    expect_fail(corrupt("pos.bin", 32, pos, 8, 0), NB_CRITEO_KAGGLE, 0, "records hold 2 positives, its header says 3", NULL);
}

/* ------------------------------------------------------------------ the real Kaggle rows */

/* Independent reference parse of one raw line (strsep keeps empty fields). */
typedef struct {
    int label;
    int ipresent[13];
    long long ival[13];
    int cpresent[26];
    unsigned long cval[26];
} raw_row;

static int raw_parse(char *line, raw_row *r) {
    memset(r, 0, sizeof *r);
    char *f;
    int k = 0;
    line[strcspn(line, "\r\n")] = 0;
    while ((f = strsep(&line, "\t")) != NULL) {
        char *end;
        if (k == 0) r->label = atoi(f);
        else if (k <= 13) {
            if (*f) r->ipresent[k - 1] = 1, r->ival[k - 1] = strtoll(f, &end, 10);
        } else if (k < 40) {
            if (*f) r->cpresent[k - 14] = 1, r->cval[k - 14] = strtoul(f, &end, 16);
        }
        k++;
    }
    return k;
}

static void check_against_raw(const nb_ctr_sample *s, const raw_row *r, size_t row) {
    int bad = 0;
    bad |= s->label != r->label;
    for (int i = 0; i < 13; i++) {
        bad |= ((s->dense_missing >> i) & 1) != !r->ipresent[i];
        bad |= s->dense[i] != (r->ipresent[i] ? tf((double)r->ival[i]) : 0.0f);
    }
    for (int j = 0; j < 26; j++) {
        bad |= ((s->cat_missing >> j) & 1) != (unsigned)!r->cpresent[j];
        bad |= s->cat[j] != (r->cpresent[j] ? (uint32_t)r->cval[j] : 0u);
    }
    CHECK(!bad, "row %zu differs from the raw text", row);
}

TEST_CASE(test_kaggle_200) {
    static nb_ctr_sample got[256];
    nb_criteo_stats st;
    size_t n = read_samples(shared_kaggle, NB_CRITEO_KAGGLE, got, 256, &st);
    CHECK(n == 200 && st.lines == 200 && st.good == 200 && st.bad == 0, "%zu samples, %llu bad", n,
          (unsigned long long)st.bad);
    CHECK(st.positives == 49, "%llu positives", (unsigned long long)st.positives);
    size_t pos = 0;
    for (size_t i = 0; i < n && i < 256; i++) pos += got[i].label;
    CHECK(pos == 49, "%zu positive samples", pos);

    /* Spot checks typed from the file's first two lines. */
    const nb_ctr_sample *a = &got[0], *b = &got[1];
    CHECK(a->label == 0 && (a->dense_missing & 1) && a->dense[1] == tf(3) && a->dense[2] == tf(260) &&
              a->dense[4] == tf(17668) && a->dense[7] == tf(33) && a->dense[11] == 0 && !(a->dense_missing & (1 << 11)),
          "row 0 dense");
    CHECK(a->cat[0] == 0x05db9164u && a->cat[17] == 0x87c6f83cu && a->cat[20] == 0x0429f84bu &&
              a->cat[23] == 0xc0d61a5cu,
          "row 0 cats");
    CHECK(a->cat_missing == ((1u << 18) | (1u << 19) | (1u << 21) | (1u << 24) | (1u << 25)), "row 0 cat mask %x",
          a->cat_missing);
    CHECK(b->dense[1] == 0 && !(b->dense_missing & 2) && b->dense[4] == tf(30251) && b->cat[0] == 0x68fd1e64u,
          "row 1 (I2 = -1)");

    /* Every field of every row against an independent parse of the raw text. */
    FILE *f = fopen(shared_kaggle, "r");
    NB_ASSERT(f);
    char line[4096];
    size_t row = 0;
    while (fgets(line, sizeof line, f) && row < n) {
        raw_row r;
        CHECK(raw_parse(line, &r) == 40, "row %zu field count", row);
        check_against_raw(&got[row], &r, row);
        row++;
    }
    fclose(f);
    CHECK(row == 200, "%zu raw rows", row);

    /* Binary round trip of the real rows, and a seek into the middle. */
    const char *bin = tmp_path("kaggle.bin");
    nb_criteo_stats cst = nb_criteo_convert(shared_kaggle, bin, NB_CRITEO_KAGGLE, 1);
    CHECK(cst.good == 200 && cst.positives == 49, "convert counts");
    nb_criteo_reader *rd = nb_criteo_open(bin, NB_CRITEO_KAGGLE, 1);
    CHECK(nb_criteo_count(rd) == 200, "binary count");
    nb_ctr_sample s;
    size_t k = 0, same = 0;
    while (nb_criteo_next(rd, &s)) same += k < 200 && sample_eq(&s, &got[k]), k++;
    CHECK(k == 200 && same == 200 && nb_criteo_get_stats(rd)->positives == 49, "binary: %zu read, %zu equal", k, same);
    nb_criteo_seek(rd, 137);
    CHECK(nb_criteo_next(rd, &s) && sample_eq(&s, &got[137]), "seek 137");
    nb_criteo_close(rd);
}

/* The DeepCTR CSV holds the same rows (integers written as floats, comma-separated, header). */
TEST_CASE(test_kaggle_vs_deepctr_csv) {
    static nb_ctr_sample got[256];
    size_t n = read_samples(shared_kaggle, NB_CRITEO_KAGGLE, got, 256, NULL);
    FILE *f = fopen(shared_csv, "r");
    NB_ASSERT(f);
    char line[4096];
    NB_ASSERT(fgets(line, sizeof line, f) && strncmp(line, "label,I1,", 9) == 0);
    size_t row = 0;
    while (fgets(line, sizeof line, f) && row < n) {
        line[strcspn(line, "\r\n")] = 0;
        char *p = line, *fld;
        int k = 0, bad = 0;
        const nb_ctr_sample *s = &got[row];
        while ((fld = strsep(&p, ",")) != NULL) {
            if (k == 0) bad |= atoi(fld) != s->label;
            else if (k <= 13) {
                int present = *fld != 0;
                bad |= ((s->dense_missing >> (k - 1)) & 1) == present;
                bad |= s->dense[k - 1] != (present ? tf(strtod(fld, NULL)) : 0.0f);
            } else if (k < 40) {
                int present = *fld != 0;
                bad |= ((s->cat_missing >> (k - 14)) & 1) == (unsigned)present;
                bad |= s->cat[k - 14] != (present ? (uint32_t)strtoul(fld, NULL, 16) : 0u);
            }
            k++;
        }
        CHECK(k == 40 && !bad, "csv row %zu differs (%d fields)", row, k);
        row++;
    }
    fclose(f);
    CHECK(row == 200, "%zu csv rows", row);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/nb_test_criteo_XXXXXX");
    NB_ASSERT(mkdtemp(dir));
    RUN(test_parse_good_line);
    RUN(test_parse_bad_lines);
    RUN(test_file_bad_lines_counted);
    RUN(test_strict_mode);
    RUN(test_unusable_files_refused);
    RUN(test_gz_and_lists);
    RUN(test_binary_round_trip);
    RUN(test_binary_corrupt_refused);
    int have = find_shared();
    if (have) {
        RUN(test_kaggle_200);
        if (file_exists(shared_csv)) RUN(test_kaggle_vs_deepctr_csv);
        else printf("skip test_kaggle_vs_deepctr_csv: %s not found\n", shared_csv);
    }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    if (!have && nb_test_failures == 0) {
        printf("skipped: real Criteo rows not found at %s (set NB_SHARED to the shared folder)\n", shared_kaggle);
        return 77;
    }
    TEST_EXIT();
}
