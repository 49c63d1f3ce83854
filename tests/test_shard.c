/* Token shards: write -> load round trip, and every malformed shard is refused with one clear
 * line and exit status 1 (checked in a forked child, since nb_fail exits). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* fork, mkdtemp, popen */
#endif
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "child.h"
#include "core.h"
#include "data/loader.h"
#include "data/shard.h"
#include "data/shardset.h"

static char dir[64];

static const char *tmp_path(const char *name) {
    static char p[4][256];
    static int k = 0;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", dir, name);
    return p[k];
}

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    NB_ASSERT(f && fwrite(data, 1, n, f) == n && fclose(f) == 0);
}

static long file_size(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

/* A valid shard image in memory: header + tokens. Caller frees. */
static unsigned char *shard_image(int32_t magic, int32_t version, int32_t count,
                                  const uint16_t *tok, size_t ntok, size_t *len) {
    *len = NB_SHARD_HEADER_BYTES + 2 * ntok;
    unsigned char *b = calloc(1, *len);
    int32_t h[3] = {magic, version, count};
    memcpy(b, h, sizeof h);
    memcpy(b + NB_SHARD_HEADER_BYTES, tok, 2 * ntok);
    return b;
}

/* fn(arg) in a child (child.h): its exit status (-1 if it crashed), its stderr in err and the
 * number of lines there (an error is one line). */
typedef struct {
    void (*fn)(const char *);
    const char *arg;
} path_child;

static void call_path_child(const void *p) {
    const path_child *c = p;
    c->fn(c->arg);
}

static int run_child_on(void (*fn)(const char *), const char *arg, char *err, size_t cap, int *lines) {
    path_child c = {fn, arg};
    int rc = child_stderr(call_path_child, &c, err, cap);
    *lines = 0;
    for (const char *p = err; *p; p++) *lines += *p == '\n';
    return rc;
}

static void load_50257(const char *path) {
    nb_shard s;
    nb_shard_load(&s, path, 50257);
    nb_shard_free(&s);
}

/* The child must exit 1 with exactly one line that names the file and contains want. */
static void expect_load_error(const char *path, const char *want) {
    char err[2048];
    int lines;
    int rc = run_child_on(load_50257, path, err, sizeof err, &lines);
    CHECK(rc == 1, "loading %s: exit status %d, expected 1", path, rc);
    CHECK(lines == 1, "loading %s: %d lines on stderr, expected 1", path, lines);
    CHECK(strstr(err, path) != NULL, "error does not name the file: %s", err);
    CHECK(strstr(err, want) != NULL, "error lacks '%s': %s", want, err);
    CHECK(strstr(err, "hint:") != NULL, "error has no hint: %s", err);
}

static void load_mask_of_4(const char *shard) { free(nb_mask_load(shard, 4)); }

/* SHARD.mask: absent = NULL, a good one reads back, a wrong count is refused naming the file */
TEST_CASE(test_mask_load) {
    const char *shard = tmp_path("m.bin");
    char mpath[4200];
    snprintf(mpath, sizeof mpath, "%s.mask", shard);
    unlink(mpath);
    CHECK(nb_mask_load(shard, 4) == NULL, "no mask file must read as NULL");
    uint8_t m[4] = {0, 1, 1, 0};
    nb_mask_write(mpath, m, 4);
    uint8_t *got = nb_mask_load(shard, 4);
    CHECK(got && memcmp(got, m, 4) == 0, "mask does not read back");
    free(got);
    nb_mask_write(mpath, m, 3);
    char err[2048];
    int lines;
    int rc = run_child_on(load_mask_of_4, shard, err, sizeof err, &lines);
    CHECK(rc == 1 && strstr(err, mpath) && strstr(err, "holds 3 entries but its shard") && strstr(err, "hint:"),
          "a 3-entry mask for a 4-token shard: rc %d, %s", rc, err);
    unlink(mpath);
}

TEST_CASE(test_roundtrip) {
    size_t n = 100003;
    int32_t *ids = malloc(n * sizeof(int32_t));
    uint32_t x = 12345;
    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        ids[i] = (int32_t)(x >> 16);
    }
    ids[0] = 0;
    ids[1] = 50256;
    ids[2] = 65535;
    const char *path = tmp_path("rt.bin");
    nb_shard_write(path, ids, n);
    CHECK(file_size(path) == (long)(1024 + 2 * n), "size %ld", file_size(path));
    FILE *f = fopen(path, "rb");
    int32_t h[256];
    CHECK(f && fread(h, sizeof h, 1, f) == 1, "cannot read back the header");
    if (f) fclose(f);
    CHECK(h[0] == 20240520 && h[1] == 1 && h[2] == (int32_t)n, "header %d %d %d", h[0], h[1], h[2]);
    int zeros = 1;
    for (int i = 3; i < 256; i++) zeros &= h[i] == 0;
    CHECK(zeros, "header words 3..255 are not zero");
    nb_shard s;
    nb_shard_load(&s, path, 65536);
    CHECK(s.ntok == n, "ntok %zu", s.ntok);
    size_t bad = 0;
    for (size_t i = 0; i < n && s.ntok == n; i++) bad += s.tokens[i] != (uint16_t)ids[i];
    CHECK(bad == 0, "%zu tokens differ after the round trip", bad);
    CHECK(strcmp(s.path, path) == 0, "path '%s'", s.path);
    nb_shard_free(&s);
    CHECK(s.tokens == NULL && s.ntok == 0, "free did not reset the shard");
    free(ids);
}

TEST_CASE(test_empty_shard) {
    const char *path = tmp_path("empty.bin");
    nb_shard_write(path, NULL, 0);
    CHECK(file_size(path) == 1024, "size %ld", file_size(path));
    nb_shard s;
    nb_shard_load(&s, path, 50257);
    CHECK(s.ntok == 0, "ntok %zu", s.ntok);
    nb_shard_free(&s);
}

TEST_CASE(test_overwrite_is_atomic) {
    const char *path = tmp_path("over.bin");
    int32_t a[3] = {1, 2, 3}, b[2] = {7, 8};
    nb_shard_write(path, a, 3);
    nb_shard_write(path, b, 2);
    nb_shard s;
    nb_shard_load(&s, path, 50257);
    CHECK(s.ntok == 2 && s.tokens[0] == 7 && s.tokens[1] == 8, "second write not seen");
    nb_shard_free(&s);
    /* no temp files left behind */
    char cmd[256];
    snprintf(cmd, sizeof cmd, "ls %s | grep -c tmp", dir);
    FILE *p = popen(cmd, "r");
    int ntmp = -1;
    CHECK(p && fscanf(p, "%d", &ntmp) == 1 && ntmp == 0, "%d temp files left", ntmp);
    if (p) pclose(p);
}

TEST_CASE(test_bad_headers) {
    uint16_t tok[4] = {1, 2, 3, 4};
    size_t len;
    unsigned char *b;

    b = shard_image(12345, 1, 4, tok, 4, &len);
    write_bytes(tmp_path("magic.bin"), b, len);
    free(b);
    expect_load_error(tmp_path("magic.bin"), "magic 12345, expected 20240520");

    b = shard_image(20240520, 2, 4, tok, 4, &len);
    write_bytes(tmp_path("version.bin"), b, len);
    free(b);
    expect_load_error(tmp_path("version.bin"), "version 2, expected 1");

    b = shard_image(20240520, 1, 4, tok, 4, &len);
    write_bytes(tmp_path("trunc.bin"), b, len - 1);
    expect_load_error(tmp_path("trunc.bin"), "truncated: its header says 4 tokens, so 1032 bytes, "
                                             "but the file has 1031 bytes");
    write_bytes(tmp_path("short.bin"), b, 100);
    expect_load_error(tmp_path("short.bin"), "truncated: 100 bytes, shorter than the 1024-byte");
    free(b);

    b = shard_image(20240520, 1, 3, tok, 4, &len); /* 4 tokens on disk, header says 3 */
    write_bytes(tmp_path("long.bin"), b, len);
    free(b);
    expect_load_error(tmp_path("long.bin"), "longer than its header says");

    b = shard_image(20240520, 1, -5, tok, 0, &len);
    write_bytes(tmp_path("neg.bin"), b, len);
    free(b);
    expect_load_error(tmp_path("neg.bin"), "negative token count -5");
}

TEST_CASE(test_token_outside_vocab) {
    uint16_t tok[5] = {10, 50256, 20, 50257, 9};
    size_t len;
    unsigned char *b = shard_image(20240520, 1, 5, tok, 5, &len);
    write_bytes(tmp_path("vocab.bin"), b, len);
    free(b);
    expect_load_error(tmp_path("vocab.bin"), "token 3 is 50257, outside the vocabulary 0..50256");
    /* the same file is fine for a larger vocabulary */
    nb_shard s;
    nb_shard_load(&s, tmp_path("vocab.bin"), 50304);
    CHECK(s.ntok == 5 && s.tokens[3] == 50257, "load with vocab 50304 failed");
    nb_shard_free(&s);
}

/* llm.c's uint32 layout (magic 20240801, version 7): ids over 65535 round-trip, and the header
 * and size checks hold for it too. */
TEST_CASE(test_uint32_shards) {
    int32_t ids[5] = {128000, 5, 151668, 65536, 0};
    const char *path = tmp_path("wide.bin");
    nb_shard_write32(path, ids, 5);
    CHECK(file_size(path) == NB_SHARD_HEADER_BYTES + 20, "size %lld", (long long)file_size(path));
    nb_shard s;
    nb_shard_load(&s, path, 151669);
    CHECK(s.ntok == 5 && s.tokens == NULL && s.tokens32, "not loaded as a uint32 shard");
    for (int i = 0; i < 5 && s.ntok == 5; i++) CHECK(nb_shard_token(&s, (size_t)i) == (uint32_t)ids[i], "token %d", i);
    nb_shard_free(&s);
    CHECK(s.tokens32 == NULL && s.ntok == 0, "free did not reset the shard");
    expect_load_error(path, "token 0 is 128000, outside the vocabulary 0..50256"); /* loaded with 50257 */

    uint16_t tok[4] = {1, 2, 3, 4}; /* 8 bytes: 2 uint32 tokens */
    size_t len;
    unsigned char *b = shard_image(20240801, 1, 2, tok, 4, &len);
    write_bytes(tmp_path("wide_version.bin"), b, len);
    expect_load_error(tmp_path("wide_version.bin"), "has version 1, expected 7");
    free(b);
    b = shard_image(20240801, 7, 3, tok, 4, &len); /* header says 3 x 4 bytes, 8 on disk */
    write_bytes(tmp_path("wide_short.bin"), b, len);
    expect_load_error(tmp_path("wide_short.bin"), "truncated: its header says 3 tokens, so 1036 bytes");
    free(b);
}

TEST_CASE(test_missing_file) {
    expect_load_error(tmp_path("does-not-exist.bin"), "cannot open");
}

static void write_bad_id(const char *path) {
    int32_t ids[3] = {5, 65536, 7};
    nb_shard_write(path, ids, 3);
}

static void write_negative_id(const char *path) {
    int32_t ids[2] = {5, -1};
    nb_shard_write(path, ids, 2);
}

TEST_CASE(test_write_refuses_bad_ids) {
    char err[2048];
    int lines;
    const char *path = tmp_path("badid.bin");
    int rc = run_child_on(write_bad_id, path, err, sizeof err, &lines);
    CHECK(rc == 1 && lines == 1, "exit %d, %d lines", rc, lines);
    CHECK(strstr(err, "token 1 is 65536, outside 0..65535"), "%s", err);
    CHECK(file_size(path) == -1, "a shard was written despite the bad id");
    rc = run_child_on(write_negative_id, path, err, sizeof err, &lines);
    CHECK(rc == 1 && strstr(err, "token 1 is -1"), "exit %d: %s", rc, err);
    CHECK(file_size(path) == -1, "a shard was written despite the negative id");
}

static void write_into_missing_dir(const char *path) {
    int32_t ids[1] = {1};
    nb_shard_write(path, ids, 1);
}

TEST_CASE(test_write_unwritable_dir) {
    char err[2048], path[256];
    int lines;
    snprintf(path, sizeof path, "%s/no/such/dir/x.bin", dir);
    int rc = run_child_on(write_into_missing_dir, path, err, sizeof err, &lines);
    CHECK(rc == 1 && lines == 1 && strstr(err, "cannot open"), "exit %d: %s", rc, err);
}

/* Loader start positions: a checkpoint's data_pos must be a batch start inside the shard. */
static size_t loader_start;
static void open_loader_at(const char *path) {
    nb_loader ld;
    nb_loader_open(&ld, path, 50257, 2, 4, loader_start, 1, NULL);
    nb_loader_close(&ld);
}

static void expect_loader_error(const char *path, size_t start, const char *want) {
    char err[2048];
    int lines;
    loader_start = start;
    int rc = run_child_on(open_loader_at, path, err, sizeof err, &lines);
    CHECK(rc == 1 && lines == 1, "start %zu: exit %d, %d lines: %s", start, rc, lines, err);
    CHECK(strstr(err, path) && strstr(err, want), "start %zu: error lacks the shard or '%s': %s", start, want, err);
    CHECK(strstr(err, "hint: the checkpoint's data_pos does not fit this shard: resume with the shard it was trained on"),
          "start %zu: hint: %s", start, err);
}

TEST_CASE(test_loader_start_bounds) {
    int32_t ids[100];
    for (int i = 0; i < 100; i++) ids[i] = i;
    char path[256];
    snprintf(path, sizeof path, "%s", tmp_path("loader.bin")); /* tmp_path's buffers rotate */
    nb_shard_write(path, ids, 100);
    /* B*T = 8 tokens plus one target: the last batch start is 100 - 9 = 91 */
    nb_loader ld;
    nb_loader_open(&ld, path, 50257, 2, 4, 91, 1, NULL);
    nb_loader_slot *sl = nb_loader_take(&ld);
    CHECK(sl->pos == 91 && sl->inputs[0] == 91 && sl->targets[7] == 99, "batch at 91: pos %zu, %d .. %d", sl->pos,
          sl->inputs[0], sl->targets[7]);
    nb_loader_close(&ld);
    expect_loader_error(path, 92, "data position 92 is not a batch start");
    expect_loader_error(path, 100000, "starts at 0..91");
    /* "data_pos": -1 in state.json: start + 9 wrapped to 8 and passed the old check (ASan:
     * heap-buffer-overflow in fill_slot; the release build trained on foreign memory) */
    expect_loader_error(path, (size_t)-1, "data position 18446744073709551615 (-1 as a signed number)");
    expect_loader_error(path, (size_t)-8, "(-8 as a signed number)");
}

/* Several shards read as one stream: a glob's matches in sorted order (created out of order
 * here), reads across boundaries (an empty shard in between) equal the same reads of one shard
 * holding the concatenation, and the loader over the set gives the single shard's batches,
 * wrap-around included. */
TEST_CASE(test_shardset_concat) {
    enum { N = 100 };
    int32_t ids[N];
    for (int i = 0; i < N; i++) ids[i] = (i * 37 + 11) % 50257;
    char whole[256], pattern[256], list[1024];
    snprintf(whole, sizeof whole, "%s", tmp_path("whole.bin"));
    nb_shard_write(whole, ids, N);
    /* parts 0..3 hold ids [0,30) [30,30) [30,71) [71,100), written in another order */
    nb_shard_write(tmp_path("part_2.bin"), ids + 30, 41);
    nb_shard_write(tmp_path("part_0.bin"), ids, 30);
    nb_shard_write(tmp_path("part_3.bin"), ids + 71, 29);
    nb_shard_write(tmp_path("part_1.bin"), ids + 30, 0);
    snprintf(pattern, sizeof pattern, "%s/part_*.bin", dir);
    nb_shardset set;
    nb_shardset_open(&set, pattern, 50257, "test data");
    CHECK(set.n == 4 && nb_shardset_ntok(&set) == N, "%d shards, %zu tokens", set.n, nb_shardset_ntok(&set));
    for (int i = 0; i < set.n; i++) {
        char want[32];
        snprintf(want, sizeof want, "part_%d.bin", i);
        CHECK(strstr(set.paths[i], want) != NULL, "shard %d is %s, want %s", i, set.paths[i], want);
    }
    uint32_t got[N];
    size_t spans[][2] = {{0, 100}, {25, 10}, {29, 2}, {30, 41}, {70, 2}, {95, 5}, {0, 30}};
    for (size_t k = 0; k < sizeof spans / sizeof spans[0]; k++) {
        size_t pos = spans[k][0], n = spans[k][1];
        nb_shardset_read(&set, pos, n, got);
        int same = 1;
        for (size_t i = 0; i < n; i++) same &= got[i] == (uint32_t)ids[pos + i];
        CHECK(same, "read [%zu, %zu) differs from the concatenation", pos, pos + n);
    }
    char what[512];
    nb_shardset_describe(&set, what, sizeof what);
    CHECK(!strncmp(what, "4 shards: ", 10) && strstr(what, "part_0.bin, ") && strstr(what, "part_3.bin"), "describe: %s", what);
    nb_shardset_close(&set);
    /* a uint32 shard (vocabularies over 65,536) in the same stream: the tokens, whatever the width */
    nb_shard_write32(tmp_path("part_3.bin"), ids + 71, 29);
    nb_shardset_open(&set, pattern, 50257, "test data");
    nb_shardset_read(&set, 60, 40, got);
    int same = 1;
    for (size_t i = 0; i < 40; i++) same &= got[i] == (uint32_t)ids[60 + i];
    CHECK(same && nb_shardset_ntok(&set) == N, "a stream over uint16 and uint32 shards differs");
    nb_shardset_close(&set);

    /* the loader: B=2, T=4, 13 batches of 9 tokens fit; the 12th (at 88) is the last, then 0 */
    snprintf(list, sizeof list, "%s/part_0.bin,%s/part_1.bin,%s/part_2.bin,%s/part_3.bin", dir, dir, dir, dir);
    nb_loader a, b;
    nb_loader_open(&a, whole, 50257, 2, 4, 0, 2, NULL);
    nb_loader_open(&b, list, 50257, 2, 4, 0, 2, NULL);
    same = 1;
    for (int step = 0; step < 30; step++) {
        nb_loader_slot *sa = nb_loader_take(&a), *sb = nb_loader_take(&b);
        same &= sa->pos == sb->pos && !memcmp(sa->inputs, sb->inputs, 8 * sizeof(int32_t)) &&
                !memcmp(sa->targets, sb->targets, 8 * sizeof(int32_t));
        nb_loader_release(&a, sa, (nb_mark){0});
        nb_loader_release(&b, sb, (nb_mark){0});
    }
    CHECK(same, "the loader over 4 shards gives other batches than over their concatenation");
    nb_loader_close(&a);
    nb_loader_close(&b);
}

static void open_set(const char *spec) {
    nb_shardset s;
    nb_shardset_open(&s, spec, 50257, "test data");
    nb_shardset_close(&s);
}

/* A set is refused before anything is read: a shard named twice, a glob or a file that names
 * nothing (the error lists the places looked), a bad header in any shard. */
TEST_CASE(test_shardset_refusals) {
    char err[4096], spec[1024];
    int lines, rc;
    int32_t ids[20] = {0};
    nb_shard_write(tmp_path("ok_a.bin"), ids, 20);
    snprintf(spec, sizeof spec, "%s/ok_a.bin,%s/ok_*.bin", dir, dir);
    rc = run_child_on(open_set, spec, err, sizeof err, &lines);
    CHECK(rc == 1 && lines == 1 && strstr(err, "twice"), "repeat: exit %d: %s", rc, err);
    snprintf(spec, sizeof spec, "%s/none_*.bin", dir);
    rc = run_child_on(open_set, spec, err, sizeof err, &lines);
    CHECK(rc == 1 && lines == 1 && strstr(err, "no file matches") && strstr(err, "looked at"), "no match: exit %d: %s", rc, err);
    rc = run_child_on(open_set, "data/no_such_folder/x.bin", err, sizeof err, &lines);
    CHECK(rc == 1 && lines == 1 && strstr(err, "in the working directory") && strstr(err, "next to the binary"),
          "missing default-style path: exit %d: %s", rc, err);
    size_t len;
    uint16_t tok[4] = {1, 2, 3, 4};
    unsigned char *bad = shard_image(1234, 1, 4, tok, 4, &len);
    write_bytes(tmp_path("ok_b.bin"), bad, len);
    free(bad);
    snprintf(spec, sizeof spec, "%s/ok_*.bin", dir);
    rc = run_child_on(open_set, spec, err, sizeof err, &lines);
    CHECK(rc == 1 && lines == 1 && strstr(err, "ok_b.bin' is not a token shard"), "bad magic in the 2nd shard: exit %d: %s", rc, err);
}

/* Loss masks in the loader (issue 32): over two shards, one with a mask and one without (all
 * ones), each batch's ignored targets (NB_LOADER_IGNORE) are exactly where the mask of the target's
 * stream position (input position + 1) is 0, the others are the next tokens, and the count is of
 * the WHOLE batch's kept targets, the same in each rank's slice; the slices put together are the
 * unsliced batch. A set without masks reads as before: no ignored target, count = B*T. */
TEST_CASE(test_loader_masks) {
    enum { N = 120, NA = 70, B = 4, T = 5, STEPS = 14 };
    int32_t ids[N];
    uint8_t mask[N];
    for (int i = 0; i < N; i++) {
        ids[i] = (i * 53 + 7) % 50257;
        mask[i] = i >= NA ? 1 : (uint8_t)((i * 7 + i / 9) % 3 != 0); /* part b: no mask file, all ones */
    }
    char a[256], b[256], spec[600], plain[256];
    snprintf(a, sizeof a, "%s", tmp_path("m_a.bin"));
    snprintf(b, sizeof b, "%s", tmp_path("m_b.bin"));
    snprintf(plain, sizeof plain, "%s", tmp_path("m_plain.bin"));
    nb_shard_write(a, ids, NA);
    nb_shard_write(b, ids + NA, N - NA);
    nb_shard_write(plain, ids, N);
    char am[300];
    snprintf(am, sizeof am, "%s.mask", a);
    nb_mask_write(am, mask, NA);
    snprintf(spec, sizeof spec, "%s,%s", a, b);

    nb_shardset set;
    nb_shardset_open(&set, spec, 50257, "test data");
    size_t want_total = 0;
    for (int i = 0; i < N; i++) want_total += mask[i];
    CHECK(set.nmasked == 1 && nb_shardset_count_targets(&set) == want_total, "count_targets %zu, want %zu",
          nb_shardset_count_targets(&set), want_total);
    uint8_t got[N];
    nb_shardset_read_mask(&set, 60, 20, got); /* across the boundary */
    CHECK(!memcmp(got, mask + 60, 20), "read_mask [60, 80) differs");
    nb_shardset_close(&set);

    nb_loader whole, s0, s1;
    nb_loader_open(&whole, spec, 50257, B, T, 0, 2, NULL);
    nb_loader_open_slice(&s0, spec, 50257, B / 2, T, B, 0, 0, 2, NULL);
    nb_loader_open_slice(&s1, spec, 50257, B / 2, T, B, B / 2, 0, 2, NULL);
    CHECK(whole.masked && s0.masked, "a set with a mask file must load masked");
    int exact = 1, slices = 1, ignored = 0;
    size_t n = (size_t)B * T, h = n / 2;
    for (int step = 0; step < STEPS; step++) {
        nb_loader_slot *w = nb_loader_take(&whole), *x = nb_loader_take(&s0), *y = nb_loader_take(&s1);
        size_t counted = 0;
        for (size_t i = 0; i < n; i++) {
            size_t p = w->pos + i + 1; /* the target's stream position */
            int32_t want = mask[p] ? ids[p] : NB_LOADER_IGNORE;
            exact &= w->targets[i] == want && w->inputs[i] == ids[p - 1];
            counted += mask[p];
            ignored += !mask[p];
        }
        exact &= w->counted == counted;
        slices &= x->pos == w->pos && y->pos == w->pos && x->counted == counted && y->counted == counted &&
                  !memcmp(x->targets, w->targets, h * sizeof(int32_t)) && !memcmp(y->targets, w->targets + h, h * sizeof(int32_t));
        nb_loader_release(&whole, w, (nb_mark){0});
        nb_loader_release(&s0, x, (nb_mark){0});
        nb_loader_release(&s1, y, (nb_mark){0});
    }
    CHECK(exact, "a batch's ignored targets or count differ from the mask");
    CHECK(slices, "the ranks' slices differ from the whole batch, or count other targets");
    CHECK(ignored > 0, "the test's mask left no target out");
    nb_loader_close(&whole), nb_loader_close(&s0), nb_loader_close(&s1);

    /* no mask file: the targets are the next tokens, none ignored */
    nb_loader p;
    nb_loader_open(&p, plain, 50257, B, T, 0, 1, NULL);
    int same = !p.masked;
    for (int step = 0; step < STEPS; step++) {
        nb_loader_slot *w = nb_loader_take(&p);
        for (size_t i = 0; i < n; i++) same &= w->targets[i] == ids[w->pos + i + 1];
        same &= w->counted == n && w->mask == NULL;
        nb_loader_release(&p, w, (nb_mark){0});
    }
    CHECK(same, "a shard without a mask must load every target");
    nb_loader_close(&p);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/nb_test_shard.XXXXXX");
    NB_ASSERT(mkdtemp(dir));
    RUN(test_roundtrip);
    RUN(test_mask_load);
    RUN(test_empty_shard);
    RUN(test_overwrite_is_atomic);
    RUN(test_bad_headers);
    RUN(test_token_outside_vocab);
    RUN(test_uint32_shards);
    RUN(test_missing_file);
    RUN(test_write_refuses_bad_ids);
    RUN(test_write_unwritable_dir);
    RUN(test_loader_start_bounds);
    RUN(test_shardset_concat);
    RUN(test_shardset_refusals);
    RUN(test_loader_masks);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", dir);
    TEST_EXIT();
}
