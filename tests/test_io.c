/* io layer tests: JSON writer/parser, safetensors (round trip, byte-exact against the reference
 * implementation's own test vectors, and every kind of corrupt file), atomic files, directory
 * swap and its crash recovery, SVG output well-formedness.
 * Cases that must fail run in a forked child: exit code 1 and exactly one "nobubble: error:"
 * line on stderr that names the problem. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "core.h"
#include "io/atomic.h"
#include "io/crc32c.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "io/svg.h"

static char tmpdir[256];

static const char *tpath(const char *name) {
    static char buf[32][512];
    static int k;
    char *p = buf[k++ % 32];
    snprintf(p, 512, "%s/%s", tmpdir, name);
    return p;
}

static char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    nb_sbuf b = {0};
    char chunk[65536];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) nb_sbuf_append(&b, chunk, n);
    fclose(f);
    if (!b.data) nb_sbuf_append(&b, "", 0);
    if (len) *len = b.len;
    return b.data;
}

static void write_raw(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        exit(2);
    }
    if (len) fwrite(data, 1, len, f);
    fclose(f);
}

static int file_exists(const char *path) {
    struct stat st;
    return lstat(path, &st) == 0;
}

/* Number of entries in dir whose name contains needle. */
static int count_entries(const char *dir, const char *needle) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && strstr(e->d_name, needle)) n++;
    closedir(d);
    return n;
}

/* Run fn(ctx) in a child; it must exit(1) with a single "nobubble: error:" line that contains
 * `want` (and `want2` when given). */
typedef void (*fail_fn)(const void *ctx);

static int expect_fail_impl(fail_fn fn, const void *ctx, const char *want, const char *want2, const char *what) {
    int fds[2];
    if (pipe(fds) != 0) return 0;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], 2);
        fn(ctx);
        _exit(0); /* returned normally: the failure we wanted did not happen */
    }
    close(fds[1]);
    char out[4096];
    size_t n = 0;
    ssize_t r;
    while ((r = read(fds[0], out + n, sizeof out - 1 - n)) > 0) n += (size_t)r;
    out[n] = '\0';
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    int ok = 1;
    int lines = 0;
    for (size_t i = 0; i < n; i++) lines += out[i] == '\n';
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 1) ok = 0;
    if (strncmp(out, "nobubble: error: ", 17) != 0 || lines != 1 || out[n ? n - 1 : 0] != '\n') ok = 0;
    if (want && !strstr(out, want)) ok = 0;
    if (want2 && !strstr(out, want2)) ok = 0;
    if (!ok)
        fprintf(stderr, "  %s: exit %d, stderr: %s  (wanted '%s'%s%s)\n", what,
                WIFEXITED(status) ? WEXITSTATUS(status) : -1, n ? out : "(empty)\n", want ? want : "",
                want2 ? " and " : "", want2 ? want2 : "");
    return ok;
}
#define EXPECT_FAIL(fn, ctx, want, want2)                                                          \
    CHECK(expect_fail_impl((fn), (ctx), (want), (want2), #fn), "expected a clean failure")

/* Run fn(ctx) in a child that must exit 0. For code that starts OpenMP threads: libgomp's pool
 * does not survive fork(), so the parent must never start one before the children it forks. */
static int expect_ok_impl(fail_fn fn, const void *ctx) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        fn(ctx);
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}
#define EXPECT_OK(fn, ctx) CHECK(expect_ok_impl((fn), (ctx)), "%s failed", #fn)

/* ================================================================== JSON */

TEST_CASE(json_writer_compact) {
    nb_json_writer w;
    nb_json_writer_init(&w, 0);
    nb_json_begin_obj(&w);
    nb_json_kstr(&w, "s", "a\"b\\c\n\t\x01/\xc3\xa9");
    nb_json_knum(&w, "f", (double)0.1f);
    nb_json_kint(&w, "i", INT64_MIN);
    nb_json_key(&w, "u");
    nb_json_uint(&w, UINT64_MAX);
    nb_json_kbool(&w, "b", 1);
    nb_json_key(&w, "z");
    nb_json_null(&w);
    nb_json_knum(&w, "nan", NAN);
    nb_json_knum(&w, "inf", -INFINITY);
    nb_json_kstr(&w, "bad utf8", "x\xff\xc3y");
    nb_json_key(&w, "arr");
    nb_json_begin_arr(&w);
    nb_json_int(&w, 1);
    nb_json_num(&w, 2.5);
    nb_json_begin_arr(&w);
    nb_json_end_arr(&w);
    nb_json_begin_obj(&w);
    nb_json_end_obj(&w);
    nb_json_end_arr(&w);
    nb_json_end_obj(&w);
    const char *want = "{\"s\":\"a\\\"b\\\\c\\n\\t\\u0001/\xc3\xa9\",\"f\":0.100000001,\"i\":-9223372036854775808,"
                       "\"u\":18446744073709551615,\"b\":true,\"z\":null,\"nan\":null,\"inf\":null,"
                       "\"bad utf8\":\"x\\ufffd\\ufffdy\",\"arr\":[1,2.5,[],{}]}";
    CHECK(strcmp(nb_json_text(&w), want) == 0, "got %s", nb_json_text(&w));
    CHECK(nb_json_len(&w) == strlen(want), "len %zu", nb_json_len(&w));
    /* and it parses back */
    nb_json *j = nb_json_parse(nb_json_text(&w), nb_json_len(&w), "w", NULL, 0);
    CHECK(j && j->type == NB_JSON_OBJ && j->len == 10, "reparse");
    if (j) {
        CHECK(!strcmp(nb_json_get_str(j, "s", ""), "a\"b\\c\n\t\x01/\xc3\xa9"), "string round trip");
        CHECK(isnan(nb_json_get_num(j, "nan", 0)), "null reads back as NaN");
        CHECK(nb_json_get_int(j, "i", 0) == INT64_MIN, "int64 min exact");
        CHECK(nb_json_req_u64(j, "u") == UINT64_MAX, "uint64 max exact");
    }
    nb_json_free(j);
    nb_json_writer_free(&w);
}

TEST_CASE(sbuf_printf_long) {
    char big[1000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    nb_sbuf b = {0};
    nb_sbuf_printf(&b, "<%s>", "short");
    nb_sbuf_printf(&b, "[%s]%d", big, 42); /* longer than the one-pass buffer */
    CHECK(b.len == 7 + 1 + 999 + 1 + 2 && !strncmp(b.data, "<short>[x", 9) && !strcmp(b.data + b.len - 4, "x]42"),
          "len %zu", b.len);
    nb_sbuf_free(&b);
}

TEST_CASE(json_writer_pretty) {
    nb_json_writer w;
    nb_json_writer_init(&w, 2);
    nb_json_begin_obj(&w);
    nb_json_kint(&w, "a", 1);
    nb_json_key(&w, "b");
    nb_json_begin_arr(&w);
    nb_json_bool(&w, 0);
    nb_json_str(&w, "x");
    nb_json_end_arr(&w);
    nb_json_key(&w, "c");
    nb_json_begin_obj(&w);
    nb_json_end_obj(&w);
    nb_json_end_obj(&w);
    const char *want = "{\n  \"a\": 1,\n  \"b\": [\n    false,\n    \"x\"\n  ],\n  \"c\": {}\n}";
    CHECK(strcmp(nb_json_text(&w), want) == 0, "got\n%s", nb_json_text(&w));
    nb_json_writer_free(&w);
}

TEST_CASE(json_double_exact) {
    double vals[] = {0.1, 1.0 / 3, 1e-300, 5e-324, DBL_MAX, -0.0, 123456789012345678.0, 2.5, -7.0, 3e-4};
    for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) {
        nb_json_writer w;
        nb_json_writer_init(&w, 0);
        nb_json_double(&w, vals[i]);
        nb_json *j = nb_json_parse(nb_json_text(&w), nb_json_len(&w), "d", NULL, 0);
        CHECK(j && j->type == NB_JSON_NUM && memcmp(&j->num, &vals[i], sizeof(double)) == 0,
              "%.17g written as %s", vals[i], nb_json_text(&w));
        if (i == 9) CHECK(!strcmp(nb_json_text(&w), "0.0003"), "shortest form, got %s", nb_json_text(&w));
        nb_json_free(j);
        nb_json_writer_free(&w);
    }
}

TEST_CASE(json_parse_values) {
    const char *text = " {\"a\": [1, -0, 1e3, 2.5, 9223372036854775807, 18446744073709551615, -12],\n"
                       "  \"s\": \"\\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9\\ud83d\\ude00\\u0041\",\n"
                       "  \"t\": true, \"f\": false, \"n\": null, \"e\": {}, \"ea\": [],\n"
                       "  \"py\": [NaN, Infinity, -Infinity],\n"
                       "  \"z\": \"a\\u0000b\" }  \n";
    char err[256] = "";
    nb_json *j = nb_json_parse(text, strlen(text), "v.json", err, sizeof err);
    CHECK(j, "parse failed: %s", err);
    if (!j) return;
    const nb_json *a = nb_json_get(j, "a");
    CHECK(a && a->type == NB_JSON_ARR && a->len == 7, "array");
    if (a && a->len == 7) {
        CHECK(a->items[0].is_int && a->items[0].i64 == 1, "1");
        CHECK(a->items[1].is_int && a->items[1].i64 == 0 && signbit(a->items[1].num), "-0");
        CHECK(a->items[2].is_int && a->items[2].i64 == 1000, "1e3 is integral");
        CHECK(!a->items[3].is_int && a->items[3].num == 2.5, "2.5");
        CHECK(a->items[4].is_int && a->items[4].i64 == INT64_MAX, "int64 max exact");
        CHECK(!a->items[5].is_int && a->items[5].is_u64 && a->items[5].u64 == UINT64_MAX, "uint64 max exact");
        CHECK(a->items[6].is_int && a->items[6].i64 == -12 && !a->items[6].is_u64, "-12");
        CHECK(a->line == 1 && a->col == 8, "position of a: %d:%d", a->line, a->col);
    }
    const char *s = nb_json_get_str(j, "s", NULL);
    CHECK(s && !strcmp(s, "\"\\/\b\f\n\r\t\xc3\xa9\xf0\x9f\x98\x80" "A"), "escapes decoded: %s", s ? s : "(null)");
    CHECK(nb_json_get_bool(j, "t", 0) == 1 && nb_json_get_bool(j, "f", 1) == 0, "bools");
    CHECK(nb_json_get(j, "n")->type == NB_JSON_NULL, "null");
    CHECK(nb_json_get_int(j, "n", 42) == 42, "null -> default");
    CHECK(nb_json_get_int(j, "missing", 7) == 7, "missing -> default");
    CHECK(!strcmp(nb_json_get_str(j, "missing", "dflt"), "dflt"), "missing str -> default");
    CHECK(nb_json_get(j, "e")->type == NB_JSON_OBJ && nb_json_get(j, "e")->len == 0, "empty object");
    CHECK(nb_json_get(j, "ea")->type == NB_JSON_ARR && nb_json_get(j, "ea")->len == 0, "empty array");
    const nb_json *py = nb_json_get(j, "py");
    CHECK(py && py->len == 3 && isnan(py->items[0].num) && py->items[1].num == INFINITY &&
          py->items[2].num == -INFINITY, "Python's NaN/Infinity");
    const nb_json *z = nb_json_get(j, "z");
    CHECK(z && z->len == 3 && !memcmp(z->str, "a\0b", 3), "\\u0000 kept with exact length");
    const nb_json *sv = nb_json_get(j, "s");
    CHECK(sv->line == 2 && sv->col == 8, "position of s: %d:%d", sv->line, sv->col);
    CHECK(nb_json_get(a, "x") == NULL, "get on an array is NULL");
    nb_json_free(j);
}

TEST_CASE(json_round_trip_strings) {
    /* every ASCII byte except NUL, and multi-byte code points of each length */
    char s[200];
    int k = 0;
    for (int c = 1; c < 128; c++) s[k++] = (char)c;
    const char *mb = "\xc2\xa2\xe2\x82\xac\xf0\x90\x8d\x88\xef\xbf\xbf";
    strcpy(s + k, mb);
    nb_json_writer w;
    nb_json_writer_init(&w, 0);
    nb_json_begin_arr(&w);
    nb_json_str(&w, s);
    nb_json_end_arr(&w);
    char err[256] = "";
    nb_json *j = nb_json_parse(nb_json_text(&w), nb_json_len(&w), "rt", err, sizeof err);
    CHECK(j && j->len == 1 && !strcmp(j->items[0].str, s), "round trip failed: %s", err);
    for (size_t i = 0; i < nb_json_len(&w); i++)
        CHECK((unsigned char)nb_json_text(&w)[i] >= 0x20, "raw control byte in output at %zu", i);
    nb_json_free(j);
    nb_json_writer_free(&w);
}

TEST_CASE(json_parse_errors) {
    char deep[700], deep65[140], big_dup[2048];
    memset(deep, '[', 600);
    deep[600] = '\0';
    memset(deep65, '[', 65);
    memset(deep65 + 65, ']', 65);
    deep65[130] = '\0';
    /* more than 16 members: the sorted check */
    size_t o = (size_t)snprintf(big_dup, sizeof big_dup, "{");
    for (int i = 0; i < 40; i++) o += (size_t)snprintf(big_dup + o, sizeof big_dup - o, "\"k%d\": %d, ", i, i);
    snprintf(big_dup + o, sizeof big_dup - o, "\"k7\": 0}");
    struct {
        const char *text, *where, *msg;
    } cases[] = {
        {"{\"a\": 1,}", "e.json:1:9:", "expected a string key"},
        {"[1 2]", "e.json:1:4:", "expected ',' or ']'"},
        {"{\n  \"a\": tru\n}", "e.json:2:8:", "expected a value"},
        {"\"abc", "e.json:1:1:", "unterminated string"},
        {"[\"\\ud800\"]", "e.json:1:3:", "high surrogate"},
        {"[\"\\udc00\"]", "e.json:1:3:", "lone low surrogate"},
        {"[\"\\u12g4\"]", "e.json:1:3:", "4 hex digits"},
        {"[\"a\\q\"]", "e.json:1:4:", "invalid escape"},
        {"\"a\x01\"", "e.json:1:3:", "control character"},
        {"\"\xff\"", "e.json:1:2:", "invalid UTF-8"},
        {"\"\xc0\xaf\"", "e.json:1:2:", "invalid UTF-8"}, /* overlong '/' */
        {"01", "e.json:1:2:", "unexpected '1'"},
        {"1.", "e.json:1:3:", "digit after '.'"},
        {"-", "e.json:1:1:", "expected a digit"},
        {"1e+", "e.json:1:4:", "exponent digits"},
        {"", "e.json:1:1:", "found end of input"},
        {"{} x", "e.json:1:4:", "unexpected 'x'"},
        {"1e999", "e.json:1:1:", "out of range"},
        {"{\"a\" 1}", "e.json:1:6:", "expected ':'"},
        {deep, "e.json:1:", "nesting deeper"},
        {deep65, "e.json:1:65:", "nesting deeper than 64 levels"},
        /* duplicate keys: Python keeps the last silently; here they are an error at the second */
        {"{\"a\": 1, \"b\": 2, \"a\": 3}", "e.json:1:23:", "duplicate key 'a' (first at line 1, column 7)"},
        {"{\"o\": {\"x\": [], \"y\": 0,\n \"x\": null}}", "e.json:2:7:", "duplicate key 'x' (first at line 1, column 13)"},
        {"{\"k\\u0000a\": 1, \"k\\u0000b\": 2}", "e.json:1:", "duplicate key 'k'"}, /* one key to strcmp lookups */
        {big_dup, "e.json:1:", "duplicate key 'k7' (first at line 1, column "},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char err[256] = "";
        nb_json *j = nb_json_parse(cases[i].text, strlen(cases[i].text), "e.json", err, sizeof err);
        CHECK(!j, "case %zu parsed but should not", i);
        CHECK(strstr(err, cases[i].where) == err && strstr(err, cases[i].msg), "case %zu: got '%s', want %s %s", i,
              err, cases[i].where, cases[i].msg);
        nb_json_free(j);
    }
    /* 64 levels parse; a document over NB_JSON_MAX_BYTES is refused before a byte is read */
    char *deep64 = deep65 + 1;
    deep64[128] = '\0';
    nb_json *ok64 = nb_json_parse(deep64, 128, "e.json", NULL, 0);
    CHECK(ok64, "64 levels of nesting");
    nb_json_free(ok64);
    char err[256] = "";
    CHECK(!nb_json_parse("{}", NB_JSON_MAX_BYTES + 1, "e.json", err, sizeof err) &&
              strstr(err, "e.json:1:1: the document is 64.00 MiB, more than the 64.00 MiB a JSON input may be"),
          "size cap: %s", err);
    /* the length is honoured: text past len is not read */
    nb_json *j = nb_json_parse("[1]garbage", 3, "e.json", NULL, 0);
    CHECK(j && j->len == 1, "explicit length");
    nb_json_free(j);
}

static const char *cfg_text = "{\"n\": \"twelve\", \"x\": 1.5, \"o\": {\"k\": 1}}";
static void get_int_on_string(const void *ctx) {
    (void)ctx;
    nb_json *j = nb_json_parse_or_fail(cfg_text, strlen(cfg_text), "cfg.json");
    nb_json_get_int(j, "n", 0);
}
static void get_int_on_fraction(const void *ctx) {
    (void)ctx;
    nb_json *j = nb_json_parse_or_fail(cfg_text, strlen(cfg_text), "cfg.json");
    nb_json_req_int(j, "x");
}
static void req_missing(const void *ctx) {
    (void)ctx;
    nb_json *j = nb_json_parse_or_fail(cfg_text, strlen(cfg_text), "cfg.json");
    nb_json_req_str(nb_json_get(j, "o"), "name");
}
static void req_wrong_container(const void *ctx) {
    (void)ctx;
    nb_json *j = nb_json_parse_or_fail(cfg_text, strlen(cfg_text), "cfg.json");
    nb_json_req(j, "o", NB_JSON_ARR);
}
static void parse_bad(const void *ctx) { nb_json_parse_or_fail(ctx, strlen(ctx), "state.json"); }
static void load_missing(const void *ctx) { nb_json_load_file(ctx); }

TEST_CASE(json_getter_failures) {
    EXPECT_FAIL(get_int_on_string, NULL, "cfg.json:1:7: 'n' must be an integer, found a string", NULL);
    EXPECT_FAIL(get_int_on_fraction, NULL, "cfg.json:1:22: 'x' must be an integer, found 1.5", NULL);
    EXPECT_FAIL(req_missing, NULL, "missing required field 'name'", "cfg.json:1:32");
    EXPECT_FAIL(req_wrong_container, NULL, "'o' must be an array, found an object", NULL);
    EXPECT_FAIL(parse_bad, "{\"step\": 3,\n\"loss\": }", "invalid JSON: state.json:2:9:", "expected a value");
    EXPECT_FAIL(load_missing, tpath("no_such.json"), "cannot open", "no_such.json");
    /* a file over the cap is refused from its size, before it is read (sparse: costs nothing) */
    const char *big = tpath("big.json");
    write_raw(big, "{}", 2);
    CHECK(truncate(big, (off_t)NB_JSON_MAX_BYTES + 1) == 0, "truncate");
    EXPECT_FAIL(load_missing, big, "big.json' is 64.00 MiB, more than the 64.00 MiB such a file can be", NULL);
    const char *dup = "{\"lr\": 1, \"lr\": 2}";
    write_raw(big, dup, strlen(dup));
    EXPECT_FAIL(load_missing, big, "big.json:1:17: duplicate key 'lr' (first at line 1, column 8)", NULL);
}

TEST_CASE(json_load_file) {
    const char *p = tpath("state.json");
    const char *t = "{\n  \"step\": 1200,\n  \"seed\": 18446744073709551557,\n  \"lr\": 0.0003\n}\n";
    nb_write_file_atomic(p, t, strlen(t));
    nb_json *j = nb_json_load_file(p);
    CHECK(nb_json_req_int(j, "step") == 1200, "step");
    CHECK(nb_json_req_u64(j, "seed") == 18446744073709551557ull, "u64 seed exact");
    CHECK(nb_json_req_num(j, "lr") == 0.0003, "lr");
    CHECK(!strcmp(j->src, p), "source name kept");
    nb_json_free(j);
}

/* ================================================================== safetensors */

static uint16_t bf16_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

static void fill_pattern(void *ctx, void *dst, size_t off, size_t bytes) {
    (*(int *)ctx)++;
    unsigned char *d = dst;
    for (size_t i = 0; i < bytes; i++) d[i] = (unsigned char)((off + i) * 131u >> 3);
}

TEST_CASE(st_round_trip) {
    const char *p = tpath("model.safetensors");
    float a[6] = {1, -2, 3.5f, 1e-8f, -0.0f, 65504};
    uint16_t b[5];
    for (int i = 0; i < 5; i++) b[i] = bf16_of((float)i * 0.5f - 1);
    uint16_t h[4] = {0x3c00, 0xc000, 0x7bff, 0x0001}; /* F16 1, -2, max, min subnormal */
    int32_t s = -123456;
    uint16_t u16[3] = {0, 1, 65535};
    uint8_t u8[7] = {1, 2, 3, 4, 5, 6, 255};
    uint8_t tail[4] = {9, 8, 7, 6};
    int64_t sa[] = {2, 3}, sb[] = {5}, sh[] = {1, 1, 2, 2}, su16[] = {3}, su8[] = {7}, sempty[] = {0, 4}, stail[] = {4};
    /* 17 MiB through the callback: more than one staging chunk */
    int64_t sbig[] = {17, 1024, 1024};
    int calls = 0;
    nb_st_writer *w = nb_st_begin(p);
    nb_st_meta(w, "format", "pt");
    nb_st_meta(w, "note \"quoted\"", "caf\xc3\xa9 \\ \n");
    nb_st_meta(w, "format", "pt2"); /* replaces */
    nb_st_add(w, "a.weight", NB_F32, 2, sa, a);
    nb_st_add(w, "b", NB_BF16, 1, sb, b);
    nb_st_add(w, "h.half", NB_F16, 4, sh, h);
    nb_st_add(w, "scalar", NB_I32, 0, NULL, &s);
    nb_st_add(w, "u16", NB_U16, 1, su16, u16);
    nb_st_add(w, "odd bytes \xe2\x82\xac", NB_U8, 1, su8, u8);
    nb_st_add(w, "empty", NB_F32, 2, sempty, NULL);
    nb_st_add(w, "tail", NB_U8, 1, stail, tail);
    nb_st_add_fn(w, "big", NB_U8, 3, sbig, fill_pattern, &calls);
    nb_st_end(w);
    CHECK(calls == 2, "17 MiB in 16 MiB chunks: 2 fill calls, got %d", calls);
    CHECK(count_entries(tmpdir, "model.safetensors.tmp") == 0, "temp file left behind");

    size_t len;
    unsigned char *raw = (unsigned char *)read_all(p, &len);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | raw[i];
    size_t data = 24 + 10 + 8 + 4 + 6 + 7 + 0 + 4 + (size_t)17 * 1024 * 1024;
    CHECK(n % 8 == 0 && raw[8] == '{' && len == 8 + n + data, "layout: N=%llu len=%zu", (unsigned long long)n, len);
    free(raw);

    nb_st_file *f = nb_st_open(p);
    CHECK(nb_st_count(f) == 9, "count %d", nb_st_count(f));
    const char *order[] = {"a.weight", "b", "h.half", "scalar", "u16", "odd bytes \xe2\x82\xac", "empty", "tail", "big"};
    for (int i = 0; i < 9 && i < nb_st_count(f); i++)
        CHECK(!strcmp(nb_st_at(f, i)->name, order[i]), "file order %d: %s", i, nb_st_at(f, i)->name);
    const nb_st_tensor *t = nb_st_find(f, "a.weight");
    CHECK(t && t->dtype == NB_F32 && t->ndim == 2 && t->shape[0] == 2 && t->shape[1] == 3 && t->numel == 6 &&
          t->nbytes == 24 && t->offset == 8 + n && !memcmp(t->data, a, 24), "a.weight");
    t = nb_st_find(f, "scalar");
    CHECK(t && t->ndim == 0 && t->numel == 1 && !memcmp(t->data, &s, 4), "scalar");
    t = nb_st_find(f, "empty");
    CHECK(t && t->numel == 0 && t->nbytes == 0 && t->shape[0] == 0 && t->shape[1] == 4, "empty tensor");
    t = nb_st_find(f, "big");
    int big_ok = t && t->nbytes == (size_t)17 << 20;
    if (big_ok) {
        const unsigned char *d = t->data;
        for (size_t i = 0; i < t->nbytes; i += 4093) big_ok &= d[i] == (unsigned char)(i * 131u >> 3);
        big_ok &= d[t->nbytes - 1] == (unsigned char)((t->nbytes - 1) * 131u >> 3);
    }
    CHECK(big_ok, "callback tensor contents");
    CHECK(nb_st_find(f, "nope") == NULL && nb_st_find(f, "") == NULL, "missing names");

    uint16_t b2[5], h2[4], u16b[3];
    uint8_t u8b[7];
    float a2[6];
    int32_t s2;
    nb_st_read_into(f, "b", NB_BF16, 5, b2);
    nb_st_read_into(f, "h.half", NB_F16, 4, h2);
    nb_st_read_into(f, "u16", NB_U16, 3, u16b);
    nb_st_read_into(f, "odd bytes \xe2\x82\xac", NB_U8, 7, u8b);
    nb_st_read_into(f, "scalar", NB_I32, 1, &s2);
    nb_st_read_shaped(f, "a.weight", NB_F32, 2, sa, a2);
    CHECK(!memcmp(b2, b, sizeof b) && !memcmp(h2, h, sizeof h) && !memcmp(u16b, u16, sizeof u16) &&
          !memcmp(u8b, u8, sizeof u8) && s2 == s && !memcmp(a2, a, sizeof a), "read back bit-exact");

    CHECK(nb_st_meta_count(f) == 2, "meta count %d", nb_st_meta_count(f));
    CHECK(nb_st_meta_get(f, "format") && !strcmp(nb_st_meta_get(f, "format"), "pt2"), "meta replaced");
    CHECK(nb_st_meta_get(f, "note \"quoted\"") && !strcmp(nb_st_meta_get(f, "note \"quoted\""), "caf\xc3\xa9 \\ \n"),
          "meta escapes");
    CHECK(nb_st_meta_get(f, "nope") == NULL, "missing meta");
    const char *k, *v;
    nb_st_meta_at(f, 0, &k, &v);
    CHECK(!strcmp(k, "format"), "meta order");
    nb_st_close(f);
}

/* Byte vectors from the reference implementation's own tests (huggingface/safetensors,
 * safetensors/src/tensor.rs: test_serialization, test_empty, test_serialization_forced_alignement). */
static const unsigned char ref_attn0[] = {
    64, 0, 0, 0, 0, 0, 0, 0, 123, 34, 97, 116, 116, 110, 46, 48, 34, 58, 123, 34, 100, 116, 121, 112, 101,
    34, 58, 34, 70, 51, 50, 34, 44, 34, 115, 104, 97, 112, 101, 34, 58, 91, 49, 44, 50, 44, 51, 93, 44, 34,
    100, 97, 116, 97, 95, 111, 102, 102, 115, 101, 116, 115, 34, 58, 91, 48, 44, 50, 52, 93, 125, 125, 0, 0,
    0, 0, 0, 0, 128, 63, 0, 0, 0, 64, 0, 0, 64, 64, 0, 0, 128, 64, 0, 0, 160, 64};
static const unsigned char ref_empty[] = {8, 0, 0, 0, 0, 0, 0, 0, 123, 125, 32, 32, 32, 32, 32, 32};
static const unsigned char ref_meta[] = {40, 0, 0, 0, 0, 0, 0, 0, 123, 34, 95, 95, 109, 101, 116, 97, 100, 97,
                                         116, 97, 95, 95, 34, 58, 123, 34, 102, 114, 97, 109, 101, 119, 111, 114,
                                         107, 34, 58, 34, 112, 116, 34, 125, 125, 32, 32, 32, 32, 32};
static const unsigned char ref_aligned[] = {
    72, 0, 0, 0, 0, 0, 0, 0, 123, 34, 97, 116, 116, 110, 48, 34, 58, 123, 34, 100, 116, 121, 112, 101, 34, 58,
    34, 70, 51, 50, 34, 44, 34, 115, 104, 97, 112, 101, 34, 58, 91, 49, 44, 49, 44, 50, 44, 51, 93, 44, 34, 100,
    97, 116, 97, 95, 111, 102, 102, 115, 101, 116, 115, 34, 58, 91, 48, 44, 50, 52, 93, 125, 125, 32, 32, 32,
    32, 32, 32, 32, 0, 0, 0, 0, 0, 0, 128, 63, 0, 0, 0, 64, 0, 0, 64, 64, 0, 0, 128, 64, 0, 0, 160, 64};

static int file_equals(const char *path, const unsigned char *want, size_t n) {
    size_t len;
    char *got = read_all(path, &len);
    int ok = got && len == n && !memcmp(got, want, n);
    free(got);
    return ok;
}

TEST_CASE(st_reference_bytes) {
    const float v[6] = {0, 1, 2, 3, 4, 5};
    int64_t s123[] = {1, 2, 3}, s1123[] = {1, 1, 2, 3};
    /* our writer produces the reference bytes exactly (without nobubble's checksums) */
    nb_st_writer *w = nb_st_begin(tpath("w1.safetensors"));
    nb_st_set_checksums(w, 0);
    nb_st_add(w, "attn.0", NB_F32, 3, s123, v);
    nb_st_end(w);
    CHECK(file_equals(tpath("w1.safetensors"), ref_attn0, sizeof ref_attn0), "attn.0 bytes differ");
    w = nb_st_begin(tpath("w2.safetensors"));
    nb_st_set_checksums(w, 0);
    nb_st_end(w);
    CHECK(file_equals(tpath("w2.safetensors"), ref_empty, sizeof ref_empty), "empty bytes differ");
    w = nb_st_begin(tpath("w3.safetensors"));
    nb_st_set_checksums(w, 0);
    nb_st_meta(w, "framework", "pt");
    nb_st_end(w);
    CHECK(file_equals(tpath("w3.safetensors"), ref_meta, sizeof ref_meta), "metadata bytes differ");
    w = nb_st_begin(tpath("w4.safetensors"));
    nb_st_set_checksums(w, 0);
    nb_st_add(w, "attn0", NB_F32, 4, s1123, v);
    nb_st_end(w);
    CHECK(file_equals(tpath("w4.safetensors"), ref_aligned, sizeof ref_aligned), "padded bytes differ");

    /* and the reader reads the reference bytes */
    write_raw(tpath("r1.safetensors"), ref_attn0, sizeof ref_attn0);
    nb_st_file *f = nb_st_open(tpath("r1.safetensors"));
    float got[6];
    nb_st_read_shaped(f, "attn.0", NB_F32, 3, s123, got);
    CHECK(!memcmp(got, v, sizeof v) && nb_st_count(f) == 1 && nb_st_meta_count(f) == 0, "reference file 1");
    nb_st_close(f);
    write_raw(tpath("r2.safetensors"), ref_meta, sizeof ref_meta);
    f = nb_st_open(tpath("r2.safetensors"));
    CHECK(nb_st_count(f) == 0 && nb_st_meta_get(f, "framework") && !strcmp(nb_st_meta_get(f, "framework"), "pt"),
          "reference file 2");
    nb_st_close(f);
    write_raw(tpath("r3.safetensors"), ref_aligned, sizeof ref_aligned);
    f = nb_st_open(tpath("r3.safetensors"));
    const nb_st_tensor *t = nb_st_find(f, "attn0");
    CHECK(t && t->ndim == 4 && t->offset == 80 && ((uintptr_t)t->data % 4) == 0 && !memcmp(t->data, v, 24),
          "reference file 3");
    nb_st_close(f);
}

/* A safetensors file built by hand from the format description: header + data. Tensors listed
 * out of offset order, and with the header not padded (both allowed by the format). */
TEST_CASE(st_hand_built) {
    const char *hdr = "{\"w\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[2,10]},"
                      "\"__metadata__\":{\"who\":\"hand\"},"
                      "\"x\":{\"shape\":[1,2],\"dtype\":\"BF16\",\"data_offsets\":[10,14]},"
                      "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}";
    size_t n = strlen(hdr);
    unsigned char buf[512];
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)n >> (8 * i));
    memcpy(buf + 8, hdr, n);
    unsigned char data[14] = {0xAA, 0xBB, 1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x80, 0x3f, 0x00, 0xc0};
    memcpy(buf + 8 + n, data, sizeof data);
    write_raw(tpath("hand.safetensors"), buf, 8 + n + sizeof data);
    nb_st_file *f = nb_st_open(tpath("hand.safetensors"));
    CHECK(nb_st_count(f) == 3, "count");
    CHECK(!strcmp(nb_st_at(f, 0)->name, "b") && !strcmp(nb_st_at(f, 1)->name, "w") && !strcmp(nb_st_at(f, 2)->name, "x"),
          "sorted by offset");
    int32_t w[2];
    nb_st_read_into(f, "w", NB_I32, 2, w);
    CHECK(w[0] == 1 && w[1] == -1, "I32 little-endian: %d %d", w[0], w[1]);
    uint16_t x[2];
    nb_st_read_into(f, "x", NB_BF16, 2, x);
    CHECK(x[0] == 0x3f80 && x[1] == 0xc000, "BF16 1.0, -2.0");
    uint8_t b[2];
    nb_st_read_into(f, "b", NB_U8, 2, b);
    CHECK(b[0] == 0xAA && b[1] == 0xBB, "U8");
    CHECK(!strcmp(nb_st_meta_get(f, "who"), "hand"), "meta");
    CHECK(nb_st_find(f, "x")->offset == 8 + n + 10, "absolute offset");
    nb_st_close(f);
}

/* Corrupt files: header text + number of data bytes. */
static void write_st(const char *path, const char *hdr, size_t ndata) {
    size_t n = strlen(hdr);
    unsigned char *buf = calloc(1, 8 + n + ndata + 1);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)n >> (8 * i));
    memcpy(buf + 8, hdr, n);
    write_raw(path, buf, 8 + n + ndata);
    free(buf);
}
static void open_st(const void *path) { nb_st_open(path); }

typedef struct {
    const char *path, *name;
    nb_dtype dt;
    int64_t numel;
} read_ctx;
static void read_into_ctx(const void *c) {
    const read_ctx *r = c;
    char buf[64];
    nb_st_read_into(nb_st_open(r->path), r->name, r->dt, r->numel, buf);
}
static void read_shaped_32(const void *path) {
    int64_t shape[] = {3, 2};
    float buf[6];
    nb_st_read_shaped(nb_st_open(path), "t", NB_F32, 2, shape, buf);
}

TEST_CASE(st_corrupt_files) {
    const char *p = tpath("bad.safetensors");
    write_raw(p, "\x02\0\0", 3);
    EXPECT_FAIL(open_st, p, "bad.safetensors' is 3 bytes long", NULL);

    write_st(p, "{}", 0);
    FILE *fp = fopen(p, "r+b");
    fputc(200, fp); /* header length 200, file has 10 bytes */
    fclose(fp);
    EXPECT_FAIL(open_st, p, "header length 200 goes past the end of the file (10 bytes)", "bad.safetensors");

    unsigned char huge[16] = {0, 0, 0, 0x10, 0, 0, 0, 0, '{', '}'};
    write_raw(p, huge, sizeof huge);
    EXPECT_FAIL(open_st, p, "exceeds the 100 MB limit", NULL);

    write_st(p, "{\"a\": {\"dtype\": \"F32\",", 0);
    EXPECT_FAIL(open_st, p, "invalid JSON in the header", "bad.safetensors header:1:");

    write_st(p, "[]      ", 0);
    EXPECT_FAIL(open_st, p, "the header must be a JSON object, found an array", NULL);

    write_st(p, "{\"t\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8);
    EXPECT_FAIL(open_st, p, "tensor 't' has dtype 'F64', which nobubble does not support", NULL);
    write_st(p, "{\"t\":{\"dtype\":\"XYZ\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8);
    EXPECT_FAIL(open_st, p, "dtype 'XYZ'", NULL);
    write_st(p, "{\"t\":{\"shape\":[1],\"data_offsets\":[0,8]}}", 8);
    EXPECT_FAIL(open_st, p, "tensor 't' has no string field 'dtype'", NULL);

    write_st(p, "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4);
    EXPECT_FAIL(open_st, p, "tensor 't': shape [2] of F32 needs 8 bytes but data_offsets [0, 4] span 4", NULL);
    write_st(p, "{\"t\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8);
    EXPECT_FAIL(open_st, p, "shape[0] is not a non-negative integer", NULL);
    write_st(p, "{\"t\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,8]}}", 8);
    EXPECT_FAIL(open_st, p, "shape[0] is not a non-negative integer", NULL);
    /* integral values that are not integer literals: the reference refuses them too */
    write_st(p, "{\"t\":{\"dtype\":\"U8\",\"shape\":[8.0],\"data_offsets\":[0,8]}}", 8);
    EXPECT_FAIL(open_st, p, "shape[0] is not a non-negative integer", NULL);
    write_st(p, "{\"t\":{\"dtype\":\"F32\",\"shape\":[50304.0,1],\"data_offsets\":[0,201216]}}", 201216);
    EXPECT_FAIL(open_st, p, "shape[0] is not a non-negative integer", NULL);
    write_st(p, "{\"t\":{\"dtype\":\"U8\",\"shape\":[1e1],\"data_offsets\":[0,10]}}", 10);
    EXPECT_FAIL(open_st, p, "shape[0] is not a non-negative integer", NULL);
    write_st(p, "{\"t\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8.0]}}", 8);
    EXPECT_FAIL(open_st, p, "data_offsets must be two non-negative integers", NULL);
    write_st(p, "{\"t\":{\"dtype\":\"U8\",\"shape\":[NaN],\"data_offsets\":[0,8]}}", 8);
    EXPECT_FAIL(open_st, p, "shape[0] is not a non-negative integer", NULL);
    write_st(p, "{\"t\":{\"dtype\":\"U8\",\"shape\":[9223372036854775808],\"data_offsets\":[0,8]}}", 8);
    EXPECT_FAIL(open_st, p, "shape[0] is not a non-negative integer", NULL);
    write_st(p, "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8);
    EXPECT_FAIL(open_st, p, "begin <= end", NULL);
    write_st(p, "{\"t\":{\"dtype\":\"U8\",\"shape\":[1,2,3,4,5,6,7,8,9],\"data_offsets\":[0,8]}}", 8);
    EXPECT_FAIL(open_st, p, "has 9 dims", NULL);
    write_st(p, "{\"t\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}}", 8);
    EXPECT_FAIL(open_st, p, "overflows", NULL);

    /* truncated data: the header promises more bytes than the file holds */
    write_st(p, "{\"t\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 12);
    EXPECT_FAIL(open_st, p, "go past the end of the data (12 bytes)", "truncated");
    write_st(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12);
    EXPECT_FAIL(open_st, p, "tensor 'b' (data_offsets from 4) overlaps tensor 'a'", NULL);
    write_st(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", 12);
    EXPECT_FAIL(open_st, p, "gap of 4 bytes before tensor 'b'", NULL);
    write_st(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 12);
    EXPECT_FAIL(open_st, p, "the tensors cover 8 bytes but the data area holds 12 bytes", NULL);
    write_st(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8);
    EXPECT_FAIL(open_st, p, "header:1:59: duplicate key 'a'", "bad.safetensors");
    write_st(p, "{\"__metadata__\":{\"k\":1}}", 0);
    EXPECT_FAIL(open_st, p, "metadata value 'k' must be a string, found a number", NULL);
    write_st(p, "{\"__metadata__\":[]}", 0);
    EXPECT_FAIL(open_st, p, "'__metadata__' must be an object", NULL);
    write_st(p, "{\"t\":[1]}", 0);
    EXPECT_FAIL(open_st, p, "tensor 't' must be an object", NULL);
    EXPECT_FAIL(open_st, tpath("missing.safetensors"), "cannot open", "missing.safetensors");
    /* a FIFO used to block in open(): now refused at once (the child would hang otherwise) */
    CHECK(mkfifo(tpath("fifo.safetensors"), 0600) == 0, "mkfifo");
    EXPECT_FAIL(open_st, tpath("fifo.safetensors"), "fifo.safetensors' is a FIFO (named pipe), not a regular file", NULL);
    EXPECT_FAIL(open_st, "/dev/zero", "'/dev/zero' is a character device", NULL);

    /* a real file with its last bytes cut off */
    float v[6] = {1, 2, 3, 4, 5, 6};
    int64_t s23[] = {2, 3};
    nb_st_writer *w = nb_st_begin(p);
    nb_st_add(w, "t", NB_F32, 2, s23, v);
    nb_st_end(w);
    struct stat st;
    stat(p, &st);
    CHECK(truncate(p, st.st_size - 3) == 0, "truncate");
    EXPECT_FAIL(open_st, p, "tensor 't': data_offsets [0, 24] go past the end of the data (21 bytes)", NULL);

    /* reads that do not match what the caller expects */
    w = nb_st_begin(p);
    nb_st_add(w, "t", NB_F32, 2, s23, v);
    nb_st_end(w);
    read_ctx r1 = {p, "t", NB_BF16, 6}, r2 = {p, "t", NB_F32, 5}, r3 = {p, "u", NB_F32, 6};
    EXPECT_FAIL(read_into_ctx, &r1, "tensor 't' in '", "is F32, expected BF16");
    EXPECT_FAIL(read_into_ctx, &r2, "has 6 elements (shape [2, 3]), expected 5", NULL);
    EXPECT_FAIL(read_into_ctx, &r3, "tensor 'u' not found in", "(it holds 1 tensors)");
    EXPECT_FAIL(read_shaped_32, p, "tensor 't' in '", "has shape [2, 3], expected [3, 2]");
}

static void add_twice(const void *ctx) {
    (void)ctx;
    float v = 1;
    nb_st_writer *w = nb_st_begin(tpath("dup.safetensors"));
    nb_st_add(w, "x", NB_F32, 0, NULL, &v);
    nb_st_add(w, "x", NB_F32, 0, NULL, &v);
}
static void write_unwritable(const void *ctx) {
    (void)ctx;
    float v = 1;
    nb_st_writer *w = nb_st_begin("/proc/nb_no_such_dir/x.safetensors");
    nb_st_add(w, "x", NB_F32, 0, NULL, &v);
    nb_st_end(w);
}

static void reserved_meta(const void *ctx) {
    (void)ctx;
    nb_st_meta(nb_st_begin(tpath("r.safetensors")), "nobubble.crc32c.x", "00000000");
}
/* The write paths on a device that is always full: the helper that every writer uses, and the
 * commit of a stream that a plain fwrite left in error (its errno is found again). */
static void write_to_full(const void *ctx) {
    (void)ctx;
    FILE *f = fopen("/dev/full", "wb");
    static char buf[1 << 20];
    nb_atomic_write(f, tpath("gone.tmp"), "/ckpt/model.safetensors", buf, sizeof buf);
}
static void commit_full(const void *ctx) {
    (void)ctx;
    FILE *f = fopen("/dev/full", "wb");
    static char buf[1 << 20];
    if (fwrite(buf, 1, sizeof buf, f) == sizeof buf) _exit(3);
    nb_atomic_commit(f, tpath("gone.tmp"), "/ckpt/optim.safetensors");
}

TEST_CASE(st_writer_failures) {
    EXPECT_FAIL(add_twice, NULL, "tensor 'x' added twice", NULL);
    EXPECT_FAIL(write_unwritable, NULL, "cannot create '/proc/nb_no_such_dir/x.safetensors.tmp.", "--out");
    EXPECT_FAIL(reserved_meta, NULL, "metadata key 'nobubble.crc32c.x' of", "is reserved for checksums");
    /* was "Input/output error" for every failed write */
    EXPECT_FAIL(write_to_full, NULL, "cannot write '/ckpt/model.safetensors' (write failed): No space left on device",
                "df -h");
    EXPECT_FAIL(commit_full, NULL, "cannot write '/ckpt/optim.safetensors' (write failed): No space left on device", NULL);
}

/* ================================================================== checksums */

TEST_CASE(crc32c_values) {
    CHECK(nb_crc32c(0, "123456789", 9) == 0xE3069283u, "check value %08x", nb_crc32c(0, "123456789", 9));
    CHECK(nb_crc32c_portable(0, "123456789", 9) == 0xE3069283u, "portable check value");
    CHECK(nb_crc32c(0, "", 0) == 0, "empty");
    static unsigned char z[32];
    CHECK(nb_crc32c(0, z, 32) == 0x8A9136AAu, "32 zero bytes (RFC 3720 B.4): %08x", nb_crc32c(0, z, 32));
    size_t n = 300000;
    unsigned char *b = malloc(n + 16);
    for (size_t i = 0; i < n + 16; i++) b[i] = (unsigned char)(i * 2654435761u >> 13);
    int bad = 0;
    for (size_t len = 0; len <= n; len = len * 3 / 2 + 1)
        for (int a = 0; a < 9; a += 4) {
            uint32_t want = nb_crc32c_portable(0, b + a, len);
            bad += nb_crc32c(0, b + a, len) != want;
            size_t cut = len / 3;
            bad += nb_crc32c(nb_crc32c(0, b + a, cut), b + a + cut, len - cut) != want;
            bad += nb_crc32c_combine(nb_crc32c(0, b + a, cut), nb_crc32c(0, b + a + cut, len - cut), len - cut) != want;
        }
    CHECK(bad == 0, "%d mismatches between the %s path, the portable one, chaining and combining", bad,
          nb_crc32c_impl());
    free(b);
}

static void write_ckpt_like(const char *path, int checksums, size_t big) {
    float v[6] = {1, 2, 3, 4, 5, 6};
    int64_t s23[] = {2, 3}, sb[] = {(int64_t)big};
    unsigned char *data = malloc(big);
    for (size_t i = 0; i < big; i++) data[i] = (unsigned char)(i * 7 + (i >> 12));
    nb_st_writer *w = nb_st_begin(path);
    nb_st_set_checksums(w, checksums);
    nb_st_meta(w, "format", "pt");
    nb_st_add(w, "h.0.attn.w", NB_F32, 2, s23, v);
    nb_st_add(w, "big", NB_U8, 1, sb, data);
    nb_st_end(w);
    free(data);
}

static void read_all_tensors(const void *ctx) {
    const char *path = ctx;
    nb_st_file *f = nb_st_open(path);
    for (int i = 0; i < nb_st_count(f); i++) {
        const nb_st_tensor *t = nb_st_at(f, i);
        void *dst = malloc(t->nbytes ? t->nbytes : 1);
        nb_st_read_into(f, t->name, t->dtype, t->numel, dst);
        free(dst);
    }
    nb_st_close(f);
}
static void verify_big(const void *ctx) {
    nb_st_file *f = nb_st_open(ctx);
    nb_st_verify(f, nb_st_find(f, "big"));
    nb_st_close(f);
}
static void flip(const char *path, long at) {
    FILE *fp = fopen(path, "r+b");
    fseek(fp, at, at < 0 ? SEEK_END : SEEK_SET);
    int c = fgetc(fp);
    fseek(fp, -1, SEEK_CUR);
    fputc(c ^ 0x10, fp);
    fclose(fp);
}
static long data_start(const char *path) {
    nb_st_file *f = nb_st_open(path);
    long at = (long)nb_st_find(f, "h.0.attn.w")->offset;
    nb_st_close(f);
    return at;
}

/* A flipped byte anywhere in a tensor's data, or in the header's meaning, ends in one error line
 * naming the file and the tensor; untouched files and files without checksums load. */
TEST_CASE(st_checksums) {
    const char *p = tpath("ck.safetensors"), *q = tpath("ck2.safetensors");
    size_t big = (size_t)20 << 20; /* 20 MiB: read in pieces by several threads */
    write_ckpt_like(p, 1, big);
    nb_st_file *f = nb_st_open(p);
    CHECK(nb_st_meta_count(f) == 1 && nb_st_find(f, "big")->has_crc && nb_st_find(f, "h.0.attn.w")->has_crc,
          "checksums read (and not listed as metadata): %d", nb_st_meta_count(f));
    nb_st_close(f);
    EXPECT_OK(read_all_tensors, p); /* checks every tensor, the big one on several threads */
    EXPECT_OK(verify_big, p);

    char cmd[1024];
    long at = data_start(p);
    snprintf(cmd, sizeof cmd, "cp %s %s", p, q);
    CHECK(system(cmd) == 0, "cp");
    flip(q, at + 5);
    EXPECT_FAIL(read_all_tensors, q, "checksum mismatch in tensor 'h.0.attn.w' of '", "ck2.safetensors': the file is damaged");
    CHECK(system(cmd) == 0, "cp");
    flip(q, -1); /* the last byte of the 20 MiB tensor, in the last thread's piece */
    EXPECT_FAIL(read_all_tensors, q, "checksum mismatch in tensor 'big' of '", "resume from an older checkpoint");
    CHECK(system(cmd) == 0, "cp");
    flip(q, at + 24 + (long)big / 2);
    EXPECT_FAIL(read_all_tensors, q, "checksum mismatch in tensor 'big'", NULL);

    /* the header's meaning: a metadata value, a shape with the same byte count, a checksum digit */
    size_t len;
    char *raw = read_all(p, &len);
    char *fmt = strstr(raw + 8, "\"pt\""), *shape = strstr(raw + 8, "[2,3]"), *hex = strstr(raw + 8, "crc32c.big\":\"");
    CHECK(fmt && shape && hex, "header layout");
    fmt[2] = 'u';
    write_raw(q, raw, len);
    EXPECT_FAIL(open_st, q, "checksum mismatch in the header of '", "the file is damaged");
    fmt[2] = 't';
    shape[1] = '3', shape[3] = '2';
    write_raw(q, raw, len);
    EXPECT_FAIL(open_st, q, "checksum mismatch in the header of", NULL);
    shape[1] = '2', shape[3] = '3';
    char *digit = hex + strlen("crc32c.big\":\"");
    char saved = *digit;
    *digit = *digit == '0' ? '1' : '0';
    write_raw(q, raw, len);
    EXPECT_FAIL(read_all_tensors, q, "checksum mismatch in tensor 'big'", NULL);
    *digit = 'G';
    write_raw(q, raw, len);
    EXPECT_FAIL(open_st, q, "metadata 'nobubble.crc32c.big' must be 8 hex digits (a CRC32C), found 'G", NULL);
    *digit = saved;
    free(raw);

    /* without checksums (another tool's file): loads as before, damage and all */
    write_ckpt_like(q, 0, 1000);
    f = nb_st_open(q);
    CHECK(!nb_st_find(f, "big")->has_crc && nb_st_meta_count(f) == 1, "no checksums");
    nb_st_close(f);
    flip(q, -1);
    EXPECT_OK(read_all_tensors, q);
    /* a checksum for a tensor that is not there, or the header's without every tensor's */
    write_st(q, "{\"__metadata__\":{\"nobubble.crc32c.x\":\"00000000\"},\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1);
    EXPECT_FAIL(open_st, q, "metadata has a checksum for tensor 'x', which the file does not hold", NULL);
    write_st(q, "{\"__metadata__\":{\"nobubble.crc32c\":\"00000000\"},\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1);
    EXPECT_FAIL(open_st, q, "the header has no checksum for tensor 't'", NULL);
}

/* ================================================================== atomic files */

TEST_CASE(atomic_files) {
    const char *p = tpath("a.txt");
    nb_write_file_atomic(p, "hello", 5);
    char *s = read_all(p, NULL);
    CHECK(s && !strcmp(s, "hello"), "content");
    free(s);
    nb_write_file_atomic(p, "a longer second version", 23);
    s = read_all(p, NULL);
    CHECK(s && !strcmp(s, "a longer second version"), "overwrite");
    free(s);
    nb_write_file_atomic(p, "", 0);
    s = read_all(p, NULL);
    CHECK(s && s[0] == '\0', "empty file");
    free(s);

    /* abort leaves the old file alone and no temp file */
    nb_write_file_atomic(p, "keep", 4);
    char tmp[512];
    FILE *f = nb_atomic_open(p, tmp, sizeof tmp);
    CHECK(strstr(tmp, "a.txt.tmp.") != NULL && file_exists(tmp), "temp name %s", tmp);
    fputs("discard me", f);
    nb_atomic_abort(f, tmp);
    s = read_all(p, NULL);
    CHECK(s && !strcmp(s, "keep") && !file_exists(tmp), "abort");
    free(s);

    /* a writer killed before commit: the final name still holds the complete old contents */
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        char t[512];
        FILE *g = nb_atomic_open(p, t, sizeof t);
        fputs("half", g);
        fflush(g);
        _exit(3);
    }
    int status;
    waitpid(pid, &status, 0);
    s = read_all(p, NULL);
    CHECK(s && !strcmp(s, "keep"), "crash before commit keeps the old file");
    free(s);
    CHECK(count_entries(tmpdir, "a.txt.tmp.") == 1, "the crashed writer's temp file is recognisable");

    /* a successful commit leaves exactly one entry for the name */
    f = nb_atomic_open(tpath("b.txt"), tmp, sizeof tmp);
    for (int i = 0; i < 1000; i++) fprintf(f, "line %d\n", i);
    nb_atomic_commit(f, tmp, tpath("b.txt"));
    CHECK(count_entries(tmpdir, "b.txt") == 1, "no temp file after commit");
    size_t len;
    s = read_all(tpath("b.txt"), &len);
    CHECK(s && len == 8890 && !strncmp(s + len - 9, "line 999\n", 9), "complete file, %zu bytes", len);
    free(s);
}

static void mkdir_over_file(const void *ctx) {
    (void)ctx;
    nb_mkdir_p(tpath("afile/sub"));
}
static void mkdir_in_proc(const void *ctx) {
    (void)ctx;
    nb_mkdir_p("/proc/nb_test_io/x");
}
static void commit_to_missing_dir(const void *ctx) {
    (void)ctx;
    nb_write_file_atomic(tpath("no/such/dir/f.txt"), "x", 1);
}

TEST_CASE(mkdir_p) {
    nb_mkdir_p(tpath("d1/d2//d3/"));
    struct stat st;
    CHECK(stat(tpath("d1/d2/d3"), &st) == 0 && S_ISDIR(st.st_mode), "nested dirs");
    nb_mkdir_p(tpath("d1/d2/d3")); /* exists: fine */
    nb_mkdir_p(tmpdir);
    nb_write_file_atomic(tpath("afile"), "x", 1);
    EXPECT_FAIL(mkdir_over_file, NULL, "exists and is not a directory", "choose another --out");
    EXPECT_FAIL(mkdir_in_proc, NULL, "cannot create directory '/proc/nb_test_io'", "choose another --out");
    EXPECT_FAIL(commit_to_missing_dir, NULL, "cannot create", "No such file or directory");
}

/* ================================================================== directory swap */

static void make_dir_with(const char *dir, const char *file, const char *content) {
    nb_mkdir_p(dir);
    char p[600];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    nb_write_file_atomic(p, content, strlen(content));
}

static int dir_has(const char *dir, const char *file, const char *content) {
    char p[600];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    char *s = read_all(p, NULL);
    int ok = s && (!content || !strcmp(s, content));
    free(s);
    return ok;
}

TEST_CASE(dir_replace) {
    char fin[512], tmp[512], p[600];
    snprintf(fin, sizeof fin, "%s", tpath("ckpt"));
    /* first save: no final yet */
    nb_dir_tmp_begin(fin, tmp, sizeof tmp);
    CHECK(!strcmp(tmp, tpath("ckpt.tmp")) && nb_is_dir(tmp), "tmp dir %s", tmp);
    make_dir_with(tmp, "model.safetensors", "v1");
    snprintf(p, sizeof p, "%s/sub/deeper", tmp);
    make_dir_with(p, "x", "nested");
    nb_dir_replace(tmp, fin);
    CHECK(dir_has(fin, "model.safetensors", "v1") && dir_has(fin, "sub/deeper/x", "nested"), "first install");
    CHECK(!file_exists(tpath("ckpt.tmp")) && !file_exists(tpath("ckpt.old")), "nothing left over");

    /* second save replaces the whole directory */
    nb_dir_tmp_begin(fin, tmp, sizeof tmp);
    make_dir_with(tmp, "model.safetensors", "v2");
    make_dir_with(tmp, "state.json", "{}");
    nb_dir_replace(tmp, fin);
    CHECK(dir_has(fin, "model.safetensors", "v2") && dir_has(fin, "state.json", "{}"), "second install");
    CHECK(!dir_has(fin, "sub/deeper/x", NULL), "old contents gone");
    CHECK(!file_exists(tpath("ckpt.tmp")) && !file_exists(tpath("ckpt.old")), "nothing left over");
    CHECK(nb_dir_recover(fin) == 0, "clean state needs no recovery");

    /* a trailing slash names the same directory (".old" must not land inside it) */
    char fin_slash[600];
    snprintf(fin_slash, sizeof fin_slash, "%s/", fin);
    nb_dir_tmp_begin(fin_slash, tmp, sizeof tmp);
    CHECK(!strcmp(tmp, tpath("ckpt.tmp")), "tmp for 'ckpt/' is %s", tmp);
    make_dir_with(tmp, "model.safetensors", "v3");
    snprintf(p, sizeof p, "%s/", tmp);
    nb_dir_replace(p, fin_slash);
    CHECK(dir_has(fin, "model.safetensors", "v3") && !dir_has(fin, "state.json", NULL), "third install");
    CHECK(!file_exists(tpath("ckpt.tmp")) && !file_exists(tpath("ckpt.old")) && count_entries(fin, "old") == 0,
          "nothing left over");
}

TEST_CASE(dir_recover) {
    char fin[512], old[512], tmp[512];
    snprintf(fin, sizeof fin, "%s", tpath("rc"));
    snprintf(old, sizeof old, "%s", tpath("rc.old"));
    snprintf(tmp, sizeof tmp, "%s", tpath("rc.tmp"));
    int saved = nb_verbosity;
    nb_verbosity = 0;
    /* crash after step 3 (new in place, old not yet removed) */
    make_dir_with(fin, "v", "new");
    make_dir_with(old, "v", "old");
    CHECK(nb_dir_recover(fin) == NB_RECOVER_REMOVED_OLD, "removed old");
    CHECK(dir_has(fin, "v", "new") && !file_exists(old), "new kept");

    /* crash between steps 2 and 3: final moved away, complete tmp not yet renamed */
    CHECK(rename(fin, old) == 0, "setup");
    make_dir_with(tmp, "v", "newer (maybe incomplete)");
    CHECK(nb_dir_recover(fin) == (NB_RECOVER_RESTORED_OLD | NB_RECOVER_REMOVED_TMP), "restored");
    CHECK(dir_has(fin, "v", "new") && !file_exists(old) && !file_exists(tmp), "old version back");

    /* crash while writing tmp */
    make_dir_with(tmp, "partial", "...");
    CHECK(nb_dir_recover(fin) == NB_RECOVER_REMOVED_TMP && dir_has(fin, "v", "new"), "tmp discarded");

    /* replace with a leftover old and no final (crash between 2 and 3, then a new save) */
    CHECK(rename(fin, old) == 0, "setup 2");
    make_dir_with(tmp, "v", "fresh");
    nb_dir_replace(tmp, fin);
    CHECK(dir_has(fin, "v", "fresh") && !file_exists(old) && !file_exists(tmp), "replace over leftover old");

    /* removal never follows symlinks out of the tree */
    make_dir_with(tpath("victim"), "precious", "data");
    nb_mkdir_p(tmp);
    char link[600];
    snprintf(link, sizeof link, "%s/link", tmp);
    CHECK(symlink(tpath("victim"), link) == 0, "symlink");
    CHECK(nb_dir_recover(fin) == NB_RECOVER_REMOVED_TMP, "tmp with symlink removed");
    CHECK(dir_has(tpath("victim"), "precious", "data"), "symlink target untouched");
    nb_verbosity = saved;
}

/* ================================================================== SVG */

/* Minimal XML well-formedness check: balanced tags, quoted attributes, valid entities, no raw
 * '<' or '&' in text, a single <svg> root with nothing but whitespace after it. Counts elements
 * named `count_tag`. */
static int entity_ok(const char *s) {
    const char *ents[] = {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;"};
    for (int i = 0; i < 5; i++)
        if (!strncmp(s, ents[i], strlen(ents[i]))) return 1;
    return 0;
}

static int xml_well_formed(const char *s, const char *count_tag, int *count, char *why, size_t cap) {
    char stack[64][32];
    int depth = 0, roots = 0;
    *count = 0;
    const char *p = s;
    if (strncmp(p, "<svg", 4) != 0) return snprintf(why, cap, "does not start with <svg"), 0;
    while (*p) {
        if (*p == '&') {
            if (!entity_ok(p)) return snprintf(why, cap, "bad entity at %ld", (long)(p - s)), 0;
            p++;
            continue;
        }
        if (*p != '<') {
            if (depth == 0 && roots && !(*p == ' ' || *p == '\n')) return snprintf(why, cap, "text after root"), 0;
            p++;
            continue;
        }
        int closing = p[1] == '/';
        p += closing ? 2 : 1;
        char name[32];
        int n = 0;
        while ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '-' || *p == ':')
            if (n < 31) name[n++] = *p++;
            else return snprintf(why, cap, "name too long"), 0;
        name[n] = '\0';
        if (!n) return snprintf(why, cap, "empty tag name at %ld", (long)(p - s)), 0;
        if (closing) {
            if (*p != '>' || depth == 0 || strcmp(stack[depth - 1], name))
                return snprintf(why, cap, "mismatched </%s> at %ld", name, (long)(p - s)), 0;
            depth--;
            p++;
            continue;
        }
        if (depth == 0 && roots++) return snprintf(why, cap, "second root element"), 0;
        if (!strcmp(name, count_tag)) (*count)++;
        for (;;) { /* attributes */
            while (*p == ' ' || *p == '\n') p++;
            if (*p == '/' && p[1] == '>') {
                p += 2;
                break;
            }
            if (*p == '>') {
                if (depth == 64) return snprintf(why, cap, "too deep"), 0;
                strcpy(stack[depth++], name);
                p++;
                break;
            }
            int an = 0;
            while ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '-' || *p == ':') p++, an++;
            if (!an || *p != '=' || p[1] != '"') return snprintf(why, cap, "bad attribute in <%s> at %ld", name, (long)(p - s)), 0;
            p += 2;
            while (*p && *p != '"') {
                if (*p == '<') return snprintf(why, cap, "'<' in attribute"), 0;
                if (*p == '&' && !entity_ok(p)) return snprintf(why, cap, "bad entity in attribute"), 0;
                p++;
            }
            if (*p != '"') return snprintf(why, cap, "unterminated attribute"), 0;
            p++;
        }
    }
    if (depth) return snprintf(why, cap, "%d unclosed elements (<%s>)", depth, stack[depth - 1]), 0;
    return 1;
}

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

TEST_CASE(svg_line_plot) {
    enum { N = 200 };
    double x[N], y[N], vx[5], vy[5];
    for (int i = 0; i < N; i++) x[i] = 5 * i, y[i] = 2.13 + 8.77 * exp(-i / 40.0);
    y[50] = NAN; /* a gap */
    y[51] = INFINITY;
    for (int i = 0; i < 5; i++) vx[i] = 200.0 * (i + 1) - 5, vy[i] = 3.5 + 2.0 / (i + 1);
    nb_svg_series s[2] = {{"train <loss> & \"more\"", NULL, N, x, y}, {"val \xff loss", "#d62728", 5, vx, vy}};
    const char *p = tpath("loss.svg");
    nb_svg_line_plot(p, "nobubble: gpt2 <tiny> & 'co'", "step", "loss (nats)", s, 2);
    char *svg = read_all(p, NULL);
    CHECK(svg != NULL, "no file");
    if (!svg) return;
    char why[128] = "";
    int paths = 0;
    CHECK(xml_well_formed(svg, "path", &paths, why, sizeof why), "not well-formed: %s", why);
    CHECK(ends_with(svg, "</svg>\n"), "ends with </svg>");
    CHECK(paths == 2, "one path per series, got %d", paths);
    CHECK(strstr(svg, "nobubble: gpt2 &lt;tiny&gt; &amp; &apos;co&apos;") != NULL, "escaped title");
    CHECK(strstr(svg, "train &lt;loss&gt; &amp; &quot;more&quot;") != NULL, "escaped legend");
    CHECK(strstr(svg, "val \xef\xbf\xbd loss") != NULL, "invalid UTF-8 replaced");
    CHECK(!strstr(svg, "nan") && !strstr(svg, "inf"), "non-finite values leaked into the file");
    /* the NaN and inf points split the train line into two pieces: two moveto commands */
    const char *d = strstr(svg, " d=\"");
    int moves = 0;
    for (const char *q = d; q && *q && *q != '/'; q++) moves += *q == 'M';
    CHECK(moves == 2, "line broken at NaN: %d moveto", moves);
    /* nice ticks: x over [0, 995] -> 0..1000 step 200 (we only check the ends); y over
     * [2.13, 10.9] -> 2..12 step 2 */
    CHECK(strstr(svg, ">0</text>") && strstr(svg, ">1000</text>") && strstr(svg, ">12</text>") &&
          strstr(svg, ">2</text>"), "tick labels");
    CHECK(strstr(svg, "fill=\"#d62728\"") && strstr(svg, "stroke=\"#4e79a7\""), "colours");
    free(svg);

    /* empty plot, huge x values, single points */
    double bx[3] = {0, 25000, 50000}, by[3] = {NAN, 1, NAN};
    nb_svg_series e[1] = {{"only one point", NULL, 3, bx, by}};
    nb_svg_line_plot(tpath("one.svg"), "one", "step", "loss", e, 1);
    svg = read_all(tpath("one.svg"), NULL);
    int circles = 0;
    CHECK(svg && xml_well_formed(svg, "circle", &circles, why, sizeof why), "one.svg: %s", why);
    CHECK(circles == 1, "the isolated point gets a marker (%d)", circles);
    free(svg);
    e[0].n = 0;
    nb_svg_line_plot(tpath("empty.svg"), NULL, NULL, NULL, e, 1);
    svg = read_all(tpath("empty.svg"), NULL);
    CHECK(svg && xml_well_formed(svg, "path", &paths, why, sizeof why) && strstr(svg, "no data yet"), "empty.svg: %s", why);
    free(svg);
    by[0] = 1, by[2] = 2;
    nb_svg_line_plot(tpath("k.svg"), "k", "step", "loss", e, 0);
    e[0].n = 3;
    nb_svg_line_plot(tpath("k.svg"), "k", "step", "loss", e, 1);
    svg = read_all(tpath("k.svg"), NULL);
    CHECK(svg && strstr(svg, ">50k</text>") && strstr(svg, ">0</text>"), "k suffix for large steps");
    free(svg);
    CHECK(count_entries(tmpdir, ".svg.tmp") == 0, "svg written atomically");
}

/* loss.svg's panels: an early spike is clipped (named in the panel's title), panels share x */
TEST_CASE(svg_panels) {
    enum { N = 100 };
    double x[N], loss[N], lr[N / 2], lx[N / 2];
    for (int i = 0; i < N; i++) x[i] = i + 1, loss[i] = i == 1 ? 22.1 : 0.7 - 0.002 * i;
    for (int i = 0; i < N / 2; i++) lx[i] = 2 * i + 50, lr[i] = 1e-3;
    nb_svg_series a[1] = {{"train loss", NULL, N, x, loss}}, b[1] = {{"lr", NULL, N / 2, lx, lr}};
    nb_svg_panel p[2] = {{"loss", "step", "loss", a, 1, 1}, {"learning rate", "step", "lr", b, 1, 0}};
    nb_svg_panels(tpath("panels.svg"), "run <x>", p, 2);
    char *svg = read_all(tpath("panels.svg"), NULL), why[128] = "";
    int paths = 0;
    CHECK(svg && xml_well_formed(svg, "path", &paths, why, sizeof why), "panels.svg: %s", why);
    if (!svg) return;
    CHECK(paths == 2, "one path per panel's series, got %d", paths);
    CHECK(strstr(svg, "loss (first steps clipped: up to 22.1)") != NULL, "the spike is named");
    CHECK(!strstr(svg, ">25</text>") && !strstr(svg, ">15</text>"), "the y axis does not run to the spike");
    CHECK(strstr(svg, ">0.7</text>") != NULL, "the y axis covers the curve");
    /* both panels' x axes run 0..100 although the lr series starts at 50 */
    const char *second = strstr(svg, ">learning rate</text>");
    CHECK(second && strstr(second, ">0</text>") && strstr(second, ">100</text>"), "panels share the x range");
    free(svg);
    /* a curve whose own top is its first step (a loss from ln V) is not clipped */
    for (int i = 0; i < N; i++) loss[i] = 10.8 - 0.03 * i;
    nb_svg_panels(tpath("panels.svg"), "run", p, 1);
    svg = read_all(tpath("panels.svg"), NULL);
    CHECK(svg && !strstr(svg, "clipped"), "a falling curve is drawn whole");
    free(svg);
}

TEST_CASE(svg_timeline) {
    const char *rows[] = {"compute", "side[0] <early bwd>", "h2d"};
    nb_svg_box b[] = {
        {0, 0, 1200, 0, "fwd block 0"}, {0, 1200, 2500, 0, "fwd block 1"}, {1, 1250, 2000, 1, "bwd <b0> & co"},
        {2, 100, 100, 2, "zero-length"}, {2, 300, 900, 13, NULL},        {0, 2500, 2510, -3, "tiny"},
    };
    const char *p = tpath("timeline.svg");
    nb_svg_key keys[] = {{0, "forward <S0>"}, {1, "backward S0"}};
    nb_svg_timeline(p, "step 3 timeline", 3, rows, 6, b, 2, keys);
    char *svg = read_all(p, NULL);
    char why[128] = "";
    int rects = 0, titles = 0;
    CHECK(svg && xml_well_formed(svg, "rect", &rects, why, sizeof why), "not well-formed: %s", why);
    if (!svg) return;
    xml_well_formed(svg, "title", &titles, why, sizeof why);
    CHECK(rects == 1 + 3 + 6 + 2, "background + lanes + boxes + key swatches, got %d rects", rects);
    CHECK(strstr(svg, ">forward &lt;S0&gt;</text>") && strstr(svg, ">backward S0</text>"), "the colour key");
    CHECK(titles == 6, "one tooltip per box, got %d", titles);
    CHECK(strstr(svg, "side[0] &lt;early bwd&gt;") && strstr(svg, "bwd &lt;b0&gt; &amp; co"), "escaped labels");
    CHECK(strstr(svg, ">fwd block 0</text>") != NULL, "label drawn inside a wide box");
    CHECK(!strstr(svg, ">tiny</text>"), "no label inside a box too narrow for it");
    CHECK(strstr(svg, nb_svg_color(13)) && strstr(svg, nb_svg_color(-3)), "palette wraps");
    CHECK(strstr(svg, ">2500</text>") && strstr(svg, "time (\xc2\xb5s)"), "time axis in microseconds");
    free(svg);
    nb_svg_timeline(tpath("tl_empty.svg"), "empty", 0, NULL, 0, NULL, 0, NULL);
    svg = read_all(tpath("tl_empty.svg"), NULL);
    CHECK(svg && xml_well_formed(svg, "rect", &rects, why, sizeof why), "empty timeline: %s", why);
    free(svg);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/nb_test_io.XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    double t0 = nb_now();
    RUN(json_writer_compact);
    RUN(sbuf_printf_long);
    RUN(json_writer_pretty);
    RUN(json_double_exact);
    RUN(json_parse_values);
    RUN(json_round_trip_strings);
    RUN(json_parse_errors);
    RUN(json_getter_failures);
    RUN(json_load_file);
    RUN(st_round_trip);
    RUN(st_reference_bytes);
    RUN(st_hand_built);
    RUN(st_corrupt_files);
    RUN(st_writer_failures);
    RUN(crc32c_values);
    RUN(st_checksums);
    RUN(atomic_files);
    RUN(mkdir_p);
    RUN(dir_replace);
    RUN(dir_recover);
    RUN(svg_line_plot);
    RUN(svg_panels);
    RUN(svg_timeline);
    printf("io tests: %.2f s\n", nb_now() - t0);
    if (!getenv("NB_KEEP_TMP")) nb_rm_rf(tmpdir);
    else printf("kept %s\n", tmpdir);
    TEST_EXIT();
}
