#include "data/shard.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core.h"

#define SHARD_HINT "regenerate it with 'nobubble tokenize' (or scripts/fetch_data.sh)"

/* The header is little-endian on disk; this code assumes a little-endian host (x86-64, arm64). */
_Static_assert(sizeof(int32_t) * NB_SHARD_HEADER_INTS == NB_SHARD_HEADER_BYTES, "header size");

static void fsync_parent_dir(const char *path) {
    char copy[4096];
    snprintf(copy, sizeof copy, "%s", path);
    int fd = open(dirname(copy), O_RDONLY | O_DIRECTORY);
    if (fd < 0) return; /* the rename is done; a missing dir fsync only weakens crash safety */
    fsync(fd);
    close(fd);
}

/* Write header + body to a temporary name, fsync, rename over path. */
static void write_shard(const char *path, const int32_t *header, const void *body, size_t width, size_t n) {
    char tmp[4200];
    NB_CHECK(snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) < (int)sizeof tmp,
             "use a shorter path", "shard path too long: '%s'", path);
    FILE *f = nb_fopen(tmp, "wb", "check that the output folder exists and is writable");
    int ok = fwrite(header, sizeof(int32_t) * NB_SHARD_HEADER_INTS, 1, f) == 1 &&
             (n == 0 || fwrite(body, width, n, f) == n) && fflush(f) == 0 && fsync(fileno(f)) == 0;
    int err = errno;
    ok = (fclose(f) == 0) && ok;
    if (!ok) {
        unlink(tmp);
        nb_fail("check free disk space", "cannot write '%s': %s", tmp, strerror(err));
    }
    if (rename(tmp, path) != 0) {
        err = errno;
        unlink(tmp);
        nb_fail("check that the output folder is writable", "cannot rename '%s' to '%s': %s", tmp,
                path, strerror(err));
    }
    fsync_parent_dir(path);
}

void nb_shard_write(const char *path, const int32_t *ids, size_t n) {
    NB_CHECK(n <= INT32_MAX, "split the text into several shards",
             "cannot write %zu tokens to '%s': a shard holds at most %d", n, path, INT32_MAX);
    uint16_t *body = nb_malloc(n * sizeof(uint16_t), "shard tokens");
    for (size_t i = 0; i < n; i++) {
        NB_CHECK(ids[i] >= 0 && ids[i] <= 65535, "shards store uint16 tokens (vocabularies up to 65536)",
                 "cannot write '%s': token %zu is %d, outside 0..65535", path, i, (int)ids[i]);
        body[i] = (uint16_t)ids[i];
    }
    int32_t header[NB_SHARD_HEADER_INTS] = {0};
    header[0] = NB_SHARD_MAGIC;
    header[1] = NB_SHARD_VERSION;
    header[2] = (int32_t)n;
    write_shard(path, header, body, sizeof(uint16_t), n);
    free(body);
}

void nb_shard_write32(const char *path, const int32_t *ids, size_t n) {
    NB_CHECK(n <= INT32_MAX, "split the text into several shards",
             "cannot write %zu tokens to '%s': a shard holds at most %d", n, path, INT32_MAX);
    for (size_t i = 0; i < n; i++)
        NB_CHECK(ids[i] >= 0, "this is a bug in the caller", "cannot write '%s': token %zu is %d", path, i, (int)ids[i]);
    int32_t header[NB_SHARD_HEADER_INTS] = {0};
    header[0] = NB_SHARD_MAGIC32;
    header[1] = NB_SHARD_VERSION32;
    header[2] = (int32_t)n;
    write_shard(path, header, ids, sizeof(uint32_t), n);
}

void nb_mask_write(const char *path, const uint8_t *mask, size_t n) {
    NB_CHECK(n <= INT32_MAX, "split the text into several shards",
             "cannot write %zu mask bytes to '%s': a mask holds at most %d", n, path, INT32_MAX);
    int32_t header[NB_SHARD_HEADER_INTS] = {0};
    header[0] = NB_MASK_MAGIC;
    header[1] = NB_MASK_VERSION;
    header[2] = (int32_t)n;
    write_shard(path, header, mask, 1, n);
}

static void mask_path(char *path, size_t cap, const char *shard_path) {
    NB_CHECK(snprintf(path, cap, "%s.mask", shard_path) < (int)cap, "use a shorter path", "shard path '%s' is too long",
             shard_path);
}

int nb_mask_exists(const char *shard_path) {
    char path[4096];
    mask_path(path, sizeof path, shard_path);
    return access(path, F_OK) == 0;
}

uint8_t *nb_mask_load(const char *shard_path, size_t ntok) {
    char path[4096];
    mask_path(path, sizeof path, shard_path);
    if (access(path, F_OK) != 0) return NULL;
    const char *hint = "remake the shard and its mask together with 'nobubble tokenize --chat/--jsonl', or delete "
                       "the .mask file to train on every token";
    FILE *f = nb_fopen(path, "rb", hint);
    int32_t h[NB_SHARD_HEADER_INTS];
    NB_CHECK(fread(h, sizeof h, 1, f) == 1, hint, "loss mask '%s' is truncated: shorter than the %d-byte header",
             path, NB_SHARD_HEADER_BYTES);
    NB_CHECK(h[0] == NB_MASK_MAGIC && h[1] == NB_MASK_VERSION, hint,
             "'%s' is not a loss mask: magic %d version %d, expected %d version %d", path, (int)h[0], (int)h[1],
             NB_MASK_MAGIC, NB_MASK_VERSION);
    NB_CHECK(h[2] >= 0 && (size_t)h[2] == ntok, hint,
             "loss mask '%s' holds %d entries but its shard '%s' holds %zu tokens", path, (int)h[2], shard_path, ntok);
    uint8_t *m = nb_malloc(ntok ? ntok : 1, "loss mask");
    NB_CHECK(fread(m, 1, ntok, f) == ntok, hint, "loss mask '%s' is truncated: fewer than the %zu entries its header says",
             path, ntok);
    NB_CHECK(fgetc(f) == EOF, hint, "loss mask '%s' is longer than its header says (%zu entries)", path, ntok);
    fclose(f);
    for (size_t i = 0; i < ntok; i++)
        NB_CHECK(m[i] <= 1, hint, "loss mask '%s' holds %d at position %zu: entries are 0 or 1", path, (int)m[i], i);
    return m;
}

/* Open a shard and check its header and size (uint16 or uint32 tokens); the stream is left at
 * the first token. */
static FILE *open_checked(const char *path, size_t *ntok_out, int *wide_out) {
    FILE *f = nb_fopen(path, "rb", "check the path; make shards with 'nobubble tokenize'");
    struct stat st;
    NB_CHECK(fstat(fileno(f), &st) == 0, NULL, "cannot stat '%s': %s", path, strerror(errno));
    NB_CHECK(S_ISREG(st.st_mode), "pass a token shard file", "'%s' is not a regular file", path);
    size_t size = (size_t)st.st_size;
    NB_CHECK(size >= NB_SHARD_HEADER_BYTES, SHARD_HINT,
             "token shard '%s' is truncated: %zu bytes, shorter than the %d-byte header", path,
             size, NB_SHARD_HEADER_BYTES);
    int32_t h[NB_SHARD_HEADER_INTS];
    NB_CHECK(fread(h, sizeof h, 1, f) == 1, NULL, "cannot read the header of '%s'", path);
    NB_CHECK(h[0] == NB_SHARD_MAGIC || h[0] == NB_SHARD_MAGIC32, "expected an llm.c-format token shard; " SHARD_HINT,
             "'%s' is not a token shard: magic %d, expected %d (uint16 tokens) or %d (uint32)", path,
             (int)h[0], NB_SHARD_MAGIC, NB_SHARD_MAGIC32);
    int wide = h[0] == NB_SHARD_MAGIC32;
    NB_CHECK(h[1] == (wide ? NB_SHARD_VERSION32 : NB_SHARD_VERSION), SHARD_HINT,
             "token shard '%s' (magic %d) has version %d, expected %d", path, (int)h[0], (int)h[1],
             wide ? NB_SHARD_VERSION32 : NB_SHARD_VERSION);
    size_t width = wide ? 4 : 2;
    NB_CHECK(h[2] >= 0, SHARD_HINT, "token shard '%s' has a negative token count %d", path,
             (int)h[2]);
    size_t ntok = (size_t)h[2];
    size_t expect = NB_SHARD_HEADER_BYTES + width * ntok;
    NB_CHECK(size == expect, SHARD_HINT,
             "token shard '%s' is %s: its header says %zu tokens, so %zu bytes, but the file has "
             "%zu bytes",
             path, size < expect ? "truncated" : "longer than its header says", ntok, expect, size);
    *ntok_out = ntok;
    *wide_out = wide;
    return f;
}

size_t nb_shard_probe(const char *path) {
    size_t ntok;
    int wide;
    fclose(open_checked(path, &ntok, &wide));
    return ntok;
}

void nb_shard_load(nb_shard *s, const char *path, int vocab) {
    NB_CHECK(vocab >= 1, "this is a bug in the caller", "nb_shard_load: vocab %d is below 1", vocab);
    memset(s, 0, sizeof *s);
    snprintf(s->path, sizeof s->path, "%s", path);
    size_t ntok;
    int wide;
    FILE *f = open_checked(path, &ntok, &wide);
    size_t width = wide ? 4 : 2;
    void *body = nb_malloc(ntok * width, path);
    if (wide) s->tokens32 = body;
    else s->tokens = body;
    NB_CHECK(ntok == 0 || fread(body, width, ntok, f) == ntok, NULL,
             "cannot read the %zu tokens of '%s'", ntok, path);
    fclose(f);
    for (size_t i = 0; i < ntok; i++)
        NB_CHECK(nb_shard_token(s, i) < (uint32_t)vocab, "the shard was made with another tokenizer; " SHARD_HINT,
                 "token shard '%s': token %zu is %u, outside the vocabulary 0..%d", path, i,
                 (unsigned)nb_shard_token(s, i), vocab - 1);
    s->ntok = ntok;
}

void nb_shard_free(nb_shard *s) {
    free(s->tokens);
    free(s->tokens32);
    s->tokens = NULL;
    s->tokens32 = NULL;
    s->ntok = 0;
}
