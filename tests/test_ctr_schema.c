/* The CTR schema and its CSV reader (data/ctr_schema.h): the built-in Criteo schema reads the same
 * samples as the Criteo reader (handcrafted lines, and the 200 real Kaggle rows of
 * ../shared/data/ctr_samples/ when present); RFC 4180 quoting (delimiters, doubled quotes and
 * line breaks inside quotes, CRLF), missing values, hashed and integer ids, the history, a row's
 * first line, ids, a .gz file, and a file without the label column read with labels 0. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "check.h"
#include "core.h"
#include "data/criteo.h"
#include "data/ctr_schema.h"

static char dir[64];

static const char *tmp(const char *name) {
    static char p[4][256];
    static int k = 0;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", dir, name);
    return p[k];
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    NB_ASSERT(f && fwrite(text, 1, strlen(text), f) == strlen(text) && fclose(f) == 0);
}

/* Every sample of path through both readers: the same dense values, ids (missing: 0) and labels. */
static long compare_criteo(const char *path) {
    nb_ctr_schema s;
    nb_ctr_schema_load(&s, "criteo", 100000);
    nb_criteo_reader *cr = nb_criteo_open(path, NB_CRITEO_KAGGLE, 1);
    nb_ctr_table *t = nb_ctr_table_open(path, &s, 1);
    nb_ctr_sample x;
    nb_ctr_row row;
    long n = 0, bad = 0;
    while (nb_criteo_next(cr, &x)) {
        if (!nb_ctr_table_next(t, &row)) {
            bad++;
            break;
        }
        n++;
        if (memcmp(x.dense, row.dense, sizeof x.dense) || memcmp(x.cat, row.cat, sizeof x.cat) || x.label != row.label ||
            row.len != 0)
            bad++;
    }
    CHECK(!nb_ctr_table_next(t, &row), "%s: the table reader has more rows", path);
    CHECK(bad == 0, "%s: %ld of %ld samples differ", path, bad, n);
    nb_criteo_close(cr);
    nb_ctr_table_close(t);
    nb_ctr_schema_free(&s);
    return n;
}

TEST_CASE(test_builtin_criteo) {
    const char *lines =
        "1\t5\t-3\t\t0\t17668\t\t1\t35\t\t1\t\t0\t12\t05db9164\t08d6d899\t\tF56B7DD5\t25c83c98\t7e0ccccf\tdf5c2d18\t"
        "0b153874\ta73ee510\t8f48ce11\ta7b606c4\tae1bb660\teae197fd\tb28479f6\tbfef54b3\tbad5ee18\te5ba7672\t87c6f83c\t\t\t"
        "0429f84b\t\t3a171ecb\tc0d61a5c\tffffffff\t\n"
        "0\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\r\n";
    write_text(tmp("c.tsv"), lines);
    CHECK(compare_criteo(tmp("c.tsv")) == 2, "handcrafted Criteo lines");
    const char *shared = getenv("NB_SHARED");
    char real[1024];
    snprintf(real, sizeof real, "%s/data/ctr_samples/criteo_kaggle_200.tsv", shared && shared[0] ? shared : "../shared");
    if (access(real, R_OK) == 0) CHECK(compare_criteo(real) == 200, "the 200 Kaggle rows");
    else printf("note: %s absent: the real-row comparison is skipped\n", real);
}

static const char *SCHEMA =
    "{\"label\": \"y\", \"id\": \"key\", \"missing\": [\"\", \"NA\"],\n"
    " \"dense\": [\"a\", {\"name\": \"b\", \"transform\": \"none\"}],\n"
    " \"categorical\": [{\"name\": \"u\", \"cardinality\": 10}, {\"name\": \"c\", \"hash_size\": 1000}],\n"
    " \"sequence\": {\"target\": \"item\", \"history\": \"hist\", \"separator\": \";\", \"cardinality\": 100},\n"
    " \"embedding_dim\": 8}";

static uint32_t fnv(const char *v, uint32_t rows) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (const unsigned char *p = (const unsigned char *)v; *p; p++) h = (h ^ *p) * 0x100000001b3ULL;
    return (uint32_t)(h % rows);
}

static void read_quoted(const char *path, int labelled) {
    nb_ctr_schema s;
    nb_ctr_schema_load(&s, tmp("s.json"), 1000000);
    CHECK(s.ndense == 2 && s.ncat == 2 && s.has_seq && s.emb_dim == 8 && s.item_rows == 100, "schema counts");
    nb_ctr_table *t = nb_ctr_table_open(path, &s, labelled);
    nb_ctr_row r;
    CHECK(nb_ctr_table_next(t, &r), "row 1");
    CHECK(r.line == 2 && !strcmp(r.id, "k1") && r.label == (labelled ? 1.0f : 0.0f), "row 1 line %llu id %s label %g",
          (unsigned long long)r.line, r.id, r.label);
    CHECK(r.dense[0] == (float)log1p(3.0) && r.dense[1] == -2.5f && r.dense[2] == 0, "row 1 dense %g %g", r.dense[0], r.dense[1]);
    CHECK(r.cat[0] == 7 && r.cat[1] == fnv("x, \"y\"", 1000) && r.cat[2] == 0, "row 1 ids %u %u", r.cat[0], r.cat[1]);
    CHECK(r.target == 42 && r.len == 3 && r.hist[0] == 1 && r.hist[1] == 2 && r.hist[2] == 99, "row 1 sequence");
    CHECK(nb_ctr_table_next(t, &r), "row 2");
    /* a quoted line break: the row starts on line 3, the next on line 5 */
    CHECK(r.line == 3 && !strcmp(r.id, "k2") && r.dense[0] == 0 && r.dense[1] == 0 && r.cat[0] == 0 &&
              r.cat[1] == fnv("two\nlines", 1000) && r.len == 0 && r.target == 0,
          "row 2 (missing values, a quoted line break): line %llu", (unsigned long long)r.line);
    CHECK(nb_ctr_table_next(t, &r) && r.line == 5 && !strcmp(r.id, "k3") && r.len == 1 && r.hist[0] == 5, "row 3 (CRLF)");
    CHECK(!nb_ctr_table_next(t, &r), "three rows");
    nb_ctr_table_close(t);
    nb_ctr_schema_free(&s);
}

TEST_CASE(test_csv_quoting) {
    write_text(tmp("s.json"), SCHEMA);
    const char *csv = "key,y,a,b,u,c,item,hist,ignored\n"
                      "k1,1,3,-2.5,7,\"x, \"\"y\"\"\",42,1;2;99,zzz\n"
                      "k2,0,NA,,,\"two\nlines\",,,\n"
                      "k3,0,,,,,,5,\r\n"
                      "\n";
    write_text(tmp("d.csv"), csv);
    read_quoted(tmp("d.csv"), 1);
    gzFile g = gzopen(tmp("d.csv.gz"), "wb");
    NB_ASSERT(g && gzwrite(g, csv, (unsigned)strlen(csv)) == (int)strlen(csv) && gzclose(g) == Z_OK);
    read_quoted(tmp("d.csv.gz"), 1);
    /* without the label column: predict reads labels 0 */
    const char *nolabel = "key,a,b,u,c,item,hist\n"
                          "k1,3,-2.5,7,\"x, \"\"y\"\"\",42,1;2;99\n"
                          "k2,NA,,,\"two\nlines\",,\n"
                          "k3,,,,,,5\r\n";
    write_text(tmp("n.csv"), nolabel);
    read_quoted(tmp("n.csv"), 0);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/nb_schema_XXXXXX");
    NB_ASSERT(mkdtemp(dir));
    nb_verbosity = 0;
    RUN(test_builtin_criteo);
    RUN(test_csv_quoting);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "note: could not remove %s\n", dir);
    return nb_test_failures ? 1 : 0;
}
