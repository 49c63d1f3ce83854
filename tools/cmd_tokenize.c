/* nobubble tokenize: text files -> one token shard (GPT-2's tokenizer, or a Hugging Face
 * tokenizer.json: Llama 2/3, Mistral, Qwen2/3). */
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "core.h"
#include "data/chat.h"
#include "data/hf_tokenizer.h"
#include "io/json.h"
#include "data/shard.h"
#include "data/tokenizer.h"

static const char *usage_text =
    "usage: nobubble tokenize --out SHARD [--tokenizer DIR] [--eot-between] [--eot TOKEN] [--bos]\n"
    "                         [--jsonl FIELD | --chat [--template T] [--train-on WHAT]]\n"
    "                         [--max-tokens N [--split-long]] FILE...\n"
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
    "  --jsonl FIELD     (Hugging Face) the files are JSON lines; each line's string FIELD is a\n"
    "                    document (--bos and --eot-between apply to each)\n"
    "  --chat            (Hugging Face) the files are JSON lines of instruction or chat examples:\n"
    "                    alpaca {instruction, input, output}, sharegpt {conversations: [{from,\n"
    "                    value}]} or OpenAI {messages: [{role, content}]}; each is rendered with\n"
    "                    the chat template and followed by the end-of-text token (eos_token or\n"
    "                    --eot); also writes SHARD.mask (see --train-on)\n"
    "  --template T      llama3, chatml (Qwen2/2.5), qwen3 (chatml with Qwen3's thinking\n"
    "                    blocks), llama2 ([INST]) or plain; default: the one\n"
    "                    tokenizer_config.json's chat_template is (templates put bos_token where\n"
    "                    the family does; --bos is for text files and --jsonl)\n"
    "  --train-on WHAT   response (default), prompt or all: the tokens SHARD.mask marks as\n"
    "                    targets (uint8 per token, 1 = trained; header magic 20261205, version 1);\n"
    "                    train and eval find it beside the shard and average the loss over\n"
    "                    those targets only\n"
    "  --max-tokens N    a document or example over N tokens is an error naming file and line...\n"
    "  --split-long      ...unless this is given: then it is kept and the loader's sequences cut it\n"
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

typedef struct {
    const char *field;   /* --jsonl */
    int chat, tpl, train_on; /* train_on: 0 response, 1 prompt, 2 all */
    long max_tokens;
    int split_long;
} tok_opts;

typedef struct {
    id_list ids;
    uint8_t *mask;
    size_t mask_cap;
} tok_out;

static void mark(tok_out *o, size_t from, int target) {
    if (o->ids.n == from) return;
    if (o->ids.n > o->mask_cap) {
        o->mask_cap = o->ids.cap;
        o->mask = realloc(o->mask, o->mask_cap);
        NB_CHECK(o->mask, "tokenize fewer files into each shard", "out of host memory for the loss mask");
    }
    memset(o->mask + from, target, o->ids.n - from);
}

static void check_length(const tok_opts *op, const char *file, long line, size_t n) {
    NB_CHECK(op->max_tokens <= 0 || op->split_long || n <= (size_t)op->max_tokens,
             "shorten the example, raise --max-tokens, or pass --split-long to keep it whole",
             "%s:%ld: %zu tokens, more than --max-tokens %ld", file, line, n, op->max_tokens);
}

/* One document: bos, its tokens, eot. */
static void add_document(const any_tokenizer *t, tok_out *o, int eot, const char *text, size_t len, double *t_enc) {
    int32_t *ids;
    double t1 = nb_now();
    size_t n = encode_any(t, text, len, &ids);
    *t_enc += nb_now() - t1;
    if (t->bos >= 0) id_list_append(&o->ids, &t->bos, 1);
    id_list_append(&o->ids, ids, n);
    if (eot) id_list_append(&o->ids, &t->eot, 1);
    free(ids);
}

static const char *token_text(const nb_hf_tokenizer *t, int32_t id, char *buf, size_t cap) {
    size_t len;
    const char *b = id >= 0 ? nb_hf_tokenizer_token_bytes(t, id, &len) : NULL;
    NB_CHECK(!b || len < cap, "use a tokenizer whose bos/eos tokens are shorter", "token %d is %zu bytes long", (int)id, len);
    snprintf(buf, cap, "%.*s", b ? (int)len : 0, b ? b : "");
    return buf;
}

/* One chat example: the whole rendered text is encoded at once (the ids transformers gives the
 * same text), then each token is a target when any of its bytes is in a segment --train-on picks.
 * Where the ids cannot be lined up with the text (NFC changed it; a literal U+2581 for
 * SentencePiece), the segments are encoded one by one instead, and counted. */
static int add_example(const any_tokenizer *t, const tok_opts *op, tok_out *o, const nb_chat_out *c,
                       const char *file, long line, double *t_enc) {
    size_t start = o->ids.n, len = 0;
    for (int k = 0; k < c->n; k++) len += c->seg[k].len;
    char *text = nb_malloc(len + 1, "conversation");
    uint8_t *want = nb_malloc(len + 1, "conversation mask");
    size_t p = 0;
    for (int k = 0; k < c->n; k++) {
        int target = op->train_on == 2 || (op->train_on == 0) == (c->seg[k].response != 0);
        memcpy(text + p, c->seg[k].text, c->seg[k].len);
        memset(want + p, target, c->seg[k].len);
        p += c->seg[k].len;
    }
    int32_t *ids;
    double t1 = nb_now();
    size_t n = nb_hf_tokenizer_encode(t->hf, text, len, 0, &ids);
    *t_enc += nb_now() - t1;
    size_t *off = nb_malloc((n + 1) * sizeof(size_t), "token offsets");
    int whole = nb_hf_tokenizer_offsets(t->hf, text, len, ids, n, off) == 0;
    if (whole) {
        id_list_append(&o->ids, ids, n);
        for (size_t i = 0; i < n; i++) {
            int target = 0;
            for (size_t b = off[i]; b < off[i + 1] && !target; b++) target = want[b];
            mark(o, start + i, target);
        }
    } else {
        for (int k = 0; k < c->n; k++) {
            size_t from = o->ids.n;
            int32_t *seg;
            size_t m = nb_hf_tokenizer_encode(t->hf, c->seg[k].text, c->seg[k].len, 0, &seg);
            id_list_append(&o->ids, seg, m);
            free(seg);
            mark(o, from, op->train_on == 2 || (op->train_on == 0) == (c->seg[k].response != 0));
        }
    }
    free(ids), free(off), free(text), free(want);
    size_t from = o->ids.n;
    /* the separator, unless the template already ended the example with it (plain, Llama 2) */
    if (from == start || o->ids.v[from - 1] != t->eot) id_list_append(&o->ids, &t->eot, 1);
    mark(o, from, op->train_on == 2);
    check_length(op, file, line, o->ids.n - start);
    return !whole;
}

/* JSON lines: --jsonl FIELD documents or --chat examples. Bad lines name file, line and field. */
static size_t add_jsonl(const any_tokenizer *t, const tok_opts *op, tok_out *o, int eot, const char *file,
                        const char *text, size_t len, double *t_enc, size_t *by_segment) {
    char bos[256], eos[256], err[512];
    token_text(t->hf, t->bos >= 0 ? t->bos : nb_hf_tokenizer_bos(t->hf), bos, sizeof bos);
    token_text(t->hf, t->eot, eos, sizeof eos);
    nb_chat_out c = {0};
    size_t examples = 0;
    long line = 0;
    for (size_t p = 0; p < len;) {
        const char *nl = memchr(text + p, '\n', len - p);
        size_t e = nl ? (size_t)(nl - text) : len, n = e - p;
        line++;
        if (n && text[p + n - 1] == '\r') n--;
        size_t q = 0;
        while (q < n && (text[p + q] == ' ' || text[p + q] == '\t')) q++;
        if (q < n) {
            nb_json *j = nb_json_parse(text + p, n, file, err, sizeof err);
            if (!j) {
                const char *msg = strstr(err, ": ");
                nb_fail("each line must be one JSON object", "%s:%ld: bad JSON%s", file, line, msg ? msg : err);
            }
            if (op->chat) {
                nb_chat_out_clear(&c);
                if (nb_chat_render(op->tpl, j, bos, eos, &c, err, sizeof err))
                    nb_fail("see 'nobubble tokenize --help' for the example layouts", "%s:%ld: %s", file, line, err);
                *by_segment += add_example(t, op, o, &c, file, line, t_enc);
            } else {
                const nb_json *f = nb_json_get(j, op->field);
                NB_CHECK(j->type == NB_JSON_OBJ && f && f->type == NB_JSON_STR, "name the text field with --jsonl FIELD",
                         "%s:%ld: %s: %s", file, line, op->field, !f ? "missing" : "not a string");
                size_t before = o->ids.n;
                add_document(t, o, eot, f->str, f->len, t_enc);
                check_length(op, file, line, o->ids.n - before);
            }
            nb_json_free(j);
            examples++;
        }
        p = e + 1;
    }
    nb_chat_out_free(&c);
    return examples;
}

int nb_cmd_tokenize(int argc, char **argv) {
    const char *out = NULL, *dir = "data/gpt2", *eot_text = NULL, *tpl_name = NULL, *train_on = "response";
    int eot = 0, bos = 0, nfiles = 0;
    tok_opts op = {0};
    char **files = nb_malloc(sizeof(char *) * (size_t)(argc + 1), "file list");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage_text, stdout);
            free(files);
            return 0;
        } else if (!strcmp(a, "--out") || !strcmp(a, "--tokenizer") || !strcmp(a, "--eot") || !strcmp(a, "--jsonl") ||
                   !strcmp(a, "--template") || !strcmp(a, "--train-on") || !strcmp(a, "--max-tokens")) {
            if (i + 1 >= argc) return usage_error(files, "%s needs a value", a);
            const char *v = argv[++i];
            if (!strcmp(a, "--out")) out = v;
            else if (!strcmp(a, "--eot")) eot_text = v, eot = 1;
            else if (!strcmp(a, "--jsonl")) op.field = v;
            else if (!strcmp(a, "--template")) tpl_name = v;
            else if (!strcmp(a, "--train-on")) train_on = v;
            else if (!strcmp(a, "--max-tokens")) {
                char *end;
                op.max_tokens = strtol(v, &end, 10);
                if (*end || op.max_tokens < 1) return usage_error(files, "--max-tokens '%s' is not a positive number", v);
            } else dir = v;
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
        } else if (!strcmp(a, "--chat")) {
            op.chat = 1;
        } else if (!strcmp(a, "--split-long")) {
            op.split_long = 1;
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
    if (op.chat && op.field) return usage_error(files, "%s", "--chat and --jsonl exclude each other");
    op.train_on = !strcmp(train_on, "response") ? 0 : !strcmp(train_on, "prompt") ? 1 : !strcmp(train_on, "all") ? 2 : -1;
    if (op.train_on < 0) return usage_error(files, "--train-on '%s': use response, prompt or all", train_on);
    op.tpl = tpl_name ? nb_chat_template_parse(tpl_name) : -1;
    if (tpl_name && op.tpl < 0) return usage_error(files, "--template '%s': use llama3, chatml, qwen3, llama2 or plain", tpl_name);
    if (op.split_long && !op.max_tokens) return usage_error(files, "%s", "--split-long goes with --max-tokens N");
    if (op.chat) eot = 1; /* examples are packed with the end-of-text token between them */

    double t0 = nb_now();
    any_tokenizer tok;
    open_tokenizer(&tok, dir, eot, eot_text, bos);
    NB_CHECK(tok.hf || (!op.chat && !op.field), "pass a Hugging Face tokenizer folder with --tokenizer",
             "--chat and --jsonl need a Hugging Face tokenizer (tokenizer.json); '%s' is GPT-2's", dir);
    if (op.chat && op.tpl < 0) {
        op.tpl = nb_hf_tokenizer_chat_template(tok.hf);
        NB_CHECK(op.tpl >= 0, "pick one with --template llama3|chatml|qwen3|llama2|plain",
                 "%s/tokenizer_config.json has a chat_template nobubble does not recognize", dir);
    }
    int vocab = tok.hf ? nb_hf_tokenizer_vocab_size(tok.hf) : nb_tokenizer_vocab_size(tok.gpt2);
    double t_load = nb_now() - t0, t_enc = 0;
    tok_out all = {0};
    size_t bytes = 0, docs = 0, by_segment = 0;
    for (int i = 0; i < nfiles; i++) {
        size_t len;
        char *text = read_text(files[i], &len);
        size_t bad = nb_tokenizer_count_invalid(text, len);
        if (bad && !op.chat && !op.field)
            nb_log(1, "nobubble: warning: '%s' has %zu invalid UTF-8 sequences, encoded as U+FFFD\n",
                   files[i], bad);
        if (op.chat || op.field) {
            docs += add_jsonl(&tok, &op, &all, eot, files[i], text, len, &t_enc, &by_segment);
        } else {
            size_t before = all.ids.n;
            add_document(&tok, &all, eot, text, len, &t_enc);
            check_length(&op, files[i], 1, all.ids.n - before);
            docs++;
        }
        bytes += len;
        free(text);
    }
    int wide = vocab > 65536;
    if (wide) nb_shard_write32(out, all.ids.v, all.ids.n);
    else nb_shard_write(out, all.ids.v, all.ids.n);
    size_t targets = 0;
    if (op.chat) {
        char mpath[NB_PATH_MAX + 8];
        NB_CHECK(snprintf(mpath, sizeof mpath, "%s.mask", out) < (int)sizeof mpath, "use a shorter path", "path too long: '%s'", out);
        nb_mask_write(mpath, all.mask, all.ids.n);
        for (size_t k = 0; k < all.ids.n; k++) targets += all.mask[k];
    }
    char b[32];
    printf("tokenize: %d file%s, %s, %zu %s%s, %zu tokens (%.2f bytes/token) in %.2f s (%.1f M tokens/s; "
           "tokenizer load %.2f s; vocabulary %d, %s tokens) -> %s\n",
           nfiles, nfiles == 1 ? "" : "s", nb_fmt_bytes(b, sizeof b, (double)bytes), docs,
           op.chat ? "example" : "document", docs == 1 ? "" : "s", all.ids.n, all.ids.n ? (double)bytes / (double)all.ids.n : 0.0, t_enc,
           t_enc > 0 ? (double)all.ids.n / t_enc / 1e6 : 0.0, t_load, vocab, wide ? "uint32" : "uint16", out);
    if (op.chat)
        printf("tokenize: template %s, train on %s: %zu of %zu tokens are targets -> %s.mask\n",
               nb_chat_template_name(op.tpl), train_on, targets, all.ids.n, out);
    if (by_segment)
        nb_log(1, "nobubble: warning: %zu example%s could not be lined up with its text (NFC changed it, or a literal "
               "U+2581 for SentencePiece): encoded turn by turn, which may differ from encoding the whole text\n",
               by_segment, by_segment == 1 ? "" : "s");
    free(all.ids.v);
    free(all.mask);
    free(files);
    nb_tokenizer_free(tok.gpt2);
    nb_hf_tokenizer_free(tok.hf);
    return 0;
}
