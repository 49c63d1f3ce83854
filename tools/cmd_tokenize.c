/* nobubble tokenize: text files -> one token shard (GPT-2's tokenizer, or a Hugging Face
 * tokenizer.json: Llama 2/3, Mistral, Qwen2/3). */
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "core.h"
#include "data/hf_tokenizer.h"
#include "data/shard.h"
#include "data/tokenizer.h"

static const char *usage_text =
    "usage: nobubble tokenize --out SHARD [--tokenizer DIR] [--eot-between] [--eot TOKEN] [--bos] FILE...\n"
    "\n"
    "Encode text files into one token shard in llm.c's layout: a 1024-byte header, then uint16\n"
    "tokens, or uint32 tokens (magic 20240801, version 7) when the vocabulary is over 65,536.\n"
    "\n"
    "  --out SHARD       shard to write (written to a temporary name, then renamed)\n"
    "  --tokenizer DIR   GPT-2: a folder with encoder.json and vocab.bpe (default: data/gpt2, made\n"
    "                    by scripts/fetch_data.sh tokenizer); Hugging Face: a folder with\n"
    "                    tokenizer.json and tokenizer_config.json (Llama 2/3, Mistral, Qwen2/3;\n"
    "                    scripts/fetch_data.sh tokenizers puts three in data/hf_tokenizers/)\n"
    "  --eot-between     end every file's tokens with the end-of-text token, the last file\n"
    "                    included, so documents stay apart also when shards are concatenated:\n"
    "                    GPT-2 <|endoftext|> (50256); Hugging Face: eos_token of\n"
    "                    tokenizer_config.json, or the token --eot names\n"
    "  --eot TOKEN       (Hugging Face) the end-of-text token's text, e.g. '<|endoftext|>' for\n"
    "                    Qwen, whose eos_token <|im_end|> ends chat turns; implies --eot-between\n"
    "  --bos             (Hugging Face) start every file with bos_token of tokenizer_config.json\n"
    "                    (Llama 2 and 3 train with it in front of each document)\n"
    "  -h, --help        show this help\n"
    "\n"
    "Each file is encoded on its own, so no token spans two files; without --eot-between the\n"
    "files' tokens follow each other with nothing in between. GPT-2: the text \"<|endoftext|>\"\n"
    "inside a file is encoded as plain text, as OpenAI's encoder does. Hugging Face: the text of\n"
    "an added or special token inside a file becomes that token, as in transformers. Invalid\n"
    "UTF-8 is encoded as U+FFFD (node's reading of the file), with a warning.\n";

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

/* The tokenizer behind --tokenizer: GPT-2's files or a Hugging Face tokenizer.json. */
typedef struct {
    nb_tokenizer *gpt2;
    nb_hf_tokenizer *hf;
    int32_t bos, eot;
} any_tokenizer;

static size_t encode_any(const any_tokenizer *t, const char *text, size_t len, int32_t **ids) {
    return t->hf ? nb_hf_tokenizer_encode(t->hf, text, len, 0, ids) : nb_tokenizer_encode(t->gpt2, text, len, ids);
}

/* A token's id by its text, from the ids encode gives it (an added token is one id). */
static int32_t named_token(const nb_hf_tokenizer *t, const char *text) {
    int32_t *ids;
    size_t n = nb_hf_tokenizer_encode(t, text, strlen(text), 0, &ids);
    int32_t id = n == 1 ? ids[0] : -1;
    free(ids);
    NB_CHECK(id >= 0, "name an added or special token of tokenizer.json, e.g. '<|endoftext|>'",
             "--eot '%s' is not a single token of this tokenizer", text);
    return id;
}

static void open_tokenizer(any_tokenizer *t, const char *dir, int eot, const char *eot_text, int bos) {
    memset(t, 0, sizeof *t);
    t->bos = t->eot = -1;
    if (!nb_hf_tokenizer_present(dir)) {
        NB_CHECK(!eot_text && !bos, "--eot and --bos are for Hugging Face tokenizers (a folder with tokenizer.json)",
                 "'%s' holds GPT-2's tokenizer files", dir);
        t->gpt2 = nb_tokenizer_load(dir);
        t->eot = NB_GPT2_EOT;
        return;
    }
    t->hf = nb_hf_tokenizer_load(dir);
    t->eot = eot_text ? named_token(t->hf, eot_text) : nb_hf_tokenizer_eos(t->hf);
    NB_CHECK(!eot || t->eot >= 0, "name the end-of-text token with --eot TOKEN",
             "--eot-between: %s/tokenizer_config.json names no eos_token", dir);
    t->bos = nb_hf_tokenizer_bos(t->hf);
    NB_CHECK(!bos || t->bos >= 0, "leave out --bos: this tokenizer has no beginning-of-text token",
             "--bos: %s/tokenizer_config.json names no bos_token", dir);
    if (!bos) t->bos = -1;
}

int nb_cmd_tokenize(int argc, char **argv) {
    const char *out = NULL, *dir = "data/gpt2", *eot_text = NULL;
    int eot = 0, bos = 0, nfiles = 0;
    char **files = nb_malloc(sizeof(char *) * (size_t)(argc + 1), "file list");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage_text, stdout);
            free(files);
            return 0;
        } else if (!strcmp(a, "--out") || !strcmp(a, "--tokenizer") || !strcmp(a, "--eot")) {
            if (i + 1 >= argc) return usage_error(files, "%s needs a value", a);
            if (!strcmp(a, "--out")) out = argv[++i];
            else if (!strcmp(a, "--eot")) eot_text = argv[++i], eot = 1;
            else dir = argv[++i];
        } else if (!strncmp(a, "--out=", 6)) {
            out = a + 6;
        } else if (!strncmp(a, "--tokenizer=", 12)) {
            dir = a + 12;
        } else if (!strncmp(a, "--eot=", 6)) {
            eot_text = a + 6, eot = 1;
        } else if (!strcmp(a, "--eot-between")) {
            eot = 1;
        } else if (!strcmp(a, "--bos")) {
            bos = 1;
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
    if (eot_text && !eot_text[0]) return usage_error(files, "%s", "--eot needs a token's text");

    double t0 = nb_now();
    any_tokenizer tok;
    open_tokenizer(&tok, dir, eot, eot_text, bos);
    int vocab = tok.hf ? nb_hf_tokenizer_vocab_size(tok.hf) : nb_tokenizer_vocab_size(tok.gpt2);
    double t_load = nb_now() - t0, t_enc = 0;
    id_list all = {0};
    size_t bytes = 0;
    for (int i = 0; i < nfiles; i++) {
        size_t len;
        char *text = read_text(files[i], &len);
        size_t bad = nb_tokenizer_count_invalid(text, len);
        if (bad)
            nb_log(1, "nobubble: warning: '%s' has %zu invalid UTF-8 sequences, encoded as U+FFFD\n",
                   files[i], bad);
        int32_t *ids;
        double t1 = nb_now();
        size_t n = encode_any(&tok, text, len, &ids);
        t_enc += nb_now() - t1;
        if (tok.bos >= 0) id_list_append(&all, &tok.bos, 1);
        id_list_append(&all, ids, n);
        if (eot) id_list_append(&all, &tok.eot, 1);
        bytes += len;
        free(ids);
        free(text);
    }
    int wide = vocab > 65536;
    if (wide) nb_shard_write32(out, all.v, all.n);
    else nb_shard_write(out, all.v, all.n);
    char b[32];
    printf("tokenize: %d file%s, %s, %zu tokens (%.2f bytes/token) in %.2f s (%.1f M tokens/s; "
           "tokenizer load %.2f s; vocabulary %d, %s tokens) -> %s\n",
           nfiles, nfiles == 1 ? "" : "s", nb_fmt_bytes(b, sizeof b, (double)bytes), all.n,
           all.n ? (double)bytes / (double)all.n : 0.0, t_enc,
           t_enc > 0 ? (double)all.n / t_enc / 1e6 : 0.0, t_load, vocab, wide ? "uint32" : "uint16", out);
    free(all.v);
    free(files);
    nb_tokenizer_free(tok.gpt2);
    nb_hf_tokenizer_free(tok.hf);
    return 0;
}
