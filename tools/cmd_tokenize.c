/* nobubble tokenize: text files -> one GPT-2 token shard. */
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "core.h"
#include "data/shard.h"
#include "data/tokenizer.h"

static const char *usage_text =
    "usage: nobubble tokenize --out SHARD [--tokenizer DIR] [--eot-between] FILE...\n"
    "\n"
    "Encode text files with the GPT-2 tokenizer into one token shard (llm.c layout: a\n"
    "1024-byte header, then uint16 tokens).\n"
    "\n"
    "  --out SHARD       shard to write (written to a temporary name, then renamed)\n"
    "  --tokenizer DIR   folder with encoder.json and vocab.bpe (default: data/gpt2, made by\n"
    "                    scripts/fetch_data.sh tokenizer)\n"
    "  --eot-between     end every file's tokens with <|endoftext|> (id 50256), the last file\n"
    "                    included, so documents stay apart also when shards are concatenated\n"
    "  -h, --help        show this help\n"
    "\n"
    "Each file is encoded on its own, so no token spans two files; without --eot-between the\n"
    "files' tokens follow each other with nothing in between. The text \"<|endoftext|>\" inside a\n"
    "file is encoded as plain text, as OpenAI's encoder does. Invalid UTF-8 is encoded as U+FFFD\n"
    "(node's reading of the file), with a warning.\n";

static int usage_error(char **files, const char *fmt, const char *arg) {
    free(files);
    fprintf(stderr, "nobubble: error: tokenize: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, " (hint: run 'nobubble tokenize --help')\n");
    return 2;
}

/* Text files can be large (a shard holds up to 2^31 tokens, ~10 GB of English); the cap only
 * stops a runaway read. */
#define TEXT_MAX ((size_t)64 << 30)

static char *read_text(const char *path, size_t *len) {
    char *text = nb_read_file(path, TEXT_MAX, len, "check the path of the text file");
    NB_CHECK(*len > 0, "pass text files with something in them", "'%s' is empty; nothing to tokenize", path);
    return text;
}

typedef struct {
    int32_t *v;
    size_t n, cap;
} id_list;

static void id_list_append(id_list *a, const int32_t *ids, size_t n) {
    if (n == 0) return; /* memcpy from or to NULL is undefined even for 0 bytes */
    if (a->n + n > a->cap) {
        size_t cap = a->cap ? a->cap : 1 << 16;
        while (cap < a->n + n) cap *= 2;
        a->v = realloc(a->v, cap * sizeof(int32_t));
        NB_CHECK(a->v, "tokenize fewer files into each shard", "out of host memory for %zu tokens",
                 cap);
        a->cap = cap;
    }
    memcpy(a->v + a->n, ids, n * sizeof(int32_t));
    a->n += n;
}

int nb_cmd_tokenize(int argc, char **argv) {
    const char *out = NULL, *dir = "data/gpt2";
    int eot = 0, nfiles = 0;
    char **files = nb_malloc(sizeof(char *) * (size_t)(argc + 1), "file list");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage_text, stdout);
            free(files);
            return 0;
        } else if (!strcmp(a, "--out") || !strcmp(a, "--tokenizer")) {
            if (i + 1 >= argc) return usage_error(files, "%s needs a value", a);
            if (!strcmp(a, "--out")) out = argv[++i];
            else dir = argv[++i];
        } else if (!strncmp(a, "--out=", 6)) {
            out = a + 6;
        } else if (!strncmp(a, "--tokenizer=", 12)) {
            dir = a + 12;
        } else if (!strcmp(a, "--eot-between")) {
            eot = 1;
        } else if (!strcmp(a, "--")) {
            while (++i < argc) files[nfiles++] = argv[i];
        } else if (a[0] == '-' && a[1]) {
            return usage_error(files, "unknown option '%s'", a);
        } else {
            files[nfiles++] = argv[i];
        }
    }
    if (!out || !out[0]) return usage_error(files, "%s", "--out SHARD is required");
    if (nfiles == 0) return usage_error(files, "%s", "no input files");

    double t0 = nb_now();
    nb_tokenizer *tok = nb_tokenizer_load(dir);
    double t_load = nb_now() - t0, t_enc = 0;
    id_list all = {0};
    size_t bytes = 0;
    const int32_t eot_id = NB_GPT2_EOT;
    for (int i = 0; i < nfiles; i++) {
        size_t len;
        char *text = read_text(files[i], &len);
        size_t bad = nb_tokenizer_count_invalid(text, len);
        if (bad)
            nb_log(1, "nobubble: warning: '%s' has %zu invalid UTF-8 sequences, encoded as U+FFFD\n",
                   files[i], bad);
        int32_t *ids;
        double t1 = nb_now();
        size_t n = nb_tokenizer_encode(tok, text, len, &ids);
        t_enc += nb_now() - t1;
        id_list_append(&all, ids, n);
        if (eot) id_list_append(&all, &eot_id, 1);
        bytes += len;
        free(ids);
        free(text);
    }
    nb_shard_write(out, all.v, all.n);
    char b[32];
    printf("tokenize: %d file%s, %s, %zu tokens (%.2f bytes/token) in %.2f s (%.1f M tokens/s; "
           "tokenizer load %.2f s) -> %s\n",
           nfiles, nfiles == 1 ? "" : "s", nb_fmt_bytes(b, sizeof b, (double)bytes), all.n,
           all.n ? (double)bytes / (double)all.n : 0.0, t_enc,
           t_enc > 0 ? (double)all.n / t_enc / 1e6 : 0.0, t_load, out);
    free(all.v);
    free(files);
    nb_tokenizer_free(tok);
    return 0;
}
