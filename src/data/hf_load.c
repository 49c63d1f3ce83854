/* Reading and validating a Hugging Face tokenizer.json (+ tokenizer_config.json). Everything the
 * encoder relies on is checked here, so encode() never meets a surprise: every merge's parts and
 * result are tokens, byte-level vocabularies only use the byte alphabet, every byte has a token. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core.h"
#include "data/chat.h"
#include "data/hf_internal.h"
#include "io/json.h"

#define HF_HINT "nobubble reads the tokenizer.json of Llama 2/3, Mistral and Qwen2/3 (byte-level or SentencePiece-style BPE)"

/* One line naming the file and field, exit code 2 (bad input, not a crash). */
static NB_NORETURN NB_PRINTF(3, 4) void hf_fail(const char *file, const char *field, const char *fmt, ...) {
    fflush(stdout);
    fprintf(stderr, "nobubble: error: %s: %s: ", file, field);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, " (hint: %s)\n", HF_HINT);
    exit(2);
}

/* ---- maps ------------------------------------------------------------------------------- */

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

void hf_map_init(hf_map *m, size_t expect) {
    size_t cap = 64;
    while (cap < expect * 2) cap *= 2;
    m->cap = cap, m->n = 0;
    m->key = nb_calloc(cap, sizeof *m->key, "tokenizer map");
    m->klen = nb_calloc(cap, sizeof *m->klen, "tokenizer map");
    m->val = nb_calloc(cap, sizeof *m->val, "tokenizer map");
}

void hf_map_free(hf_map *m) {
    free(m->key), free(m->klen), free(m->val);
    memset(m, 0, sizeof *m);
}

static size_t map_slot(const hf_map *m, const char *key, size_t len) {
    size_t i = hash_bytes(key, len) & (m->cap - 1);
    while (m->key[i] && !(m->klen[i] == len && !memcmp(m->key[i], key, len))) i = (i + 1) & (m->cap - 1);
    return i;
}

int32_t hf_map_put(hf_map *m, const char *key, uint32_t len, int32_t v) {
    if (2 * (m->n + 1) > m->cap) {
        hf_map old = *m;
        hf_map_init(m, old.cap);
        for (size_t i = 0; i < old.cap; i++)
            if (old.key[i]) hf_map_put(m, old.key[i], old.klen[i], old.val[i]);
        hf_map_free(&old);
    }
    size_t i = map_slot(m, key, len);
    int32_t prev = m->key[i] ? m->val[i] : -1;
    if (!m->key[i]) m->n++;
    m->key[i] = key, m->klen[i] = len, m->val[i] = v;
    return prev;
}

int32_t hf_map_get(const hf_map *m, const char *key, size_t len) {
    size_t i = map_slot(m, key, len);
    return m->key[i] ? m->val[i] : -1;
}

static void pairs_init(hf_pairs *p, size_t n) {
    size_t cap = 64;
    while (cap < n * 2) cap *= 2;
    p->cap = cap;
    p->key = nb_calloc(cap, sizeof *p->key, "merge table");
    p->rank = nb_calloc(cap, sizeof *p->rank, "merge table");
    p->merged = nb_calloc(cap, sizeof *p->merged, "merge table");
}

/* A pair listed twice keeps the later rank, as the reference's Map does. */
static void pairs_put(hf_pairs *p, int32_t a, int32_t b, int32_t rank, int32_t merged) {
    uint64_t k = ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 1;
    size_t i = (size_t)((k * 0x9E3779B97F4A7C15ull) >> 20) & (p->cap - 1);
    while (p->key[i] && p->key[i] != k) i = (i + 1) & (p->cap - 1);
    p->key[i] = k, p->rank[i] = rank, p->merged[i] = merged;
}

/* ---- small helpers ---------------------------------------------------------------------- */

void hf_byte_alphabet(uint32_t byte_to_cp[256]) {
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        byte_to_cp[b] = printable ? (uint32_t)b : (uint32_t)(256 + n++);
    }
}

int hf_utf8_put(uint32_t cp, unsigned char *o) {
    if (cp < 0x80) return o[0] = (unsigned char)cp, 1;
    if (cp < 0x800) return o[0] = (unsigned char)(0xC0 | cp >> 6), o[1] = (unsigned char)(0x80 | (cp & 0x3F)), 2;
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | cp >> 12), o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | cp >> 18), o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F)), o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

static char *dup_bytes(const char *s, size_t n) {
    char *d = nb_malloc(n + 1, "tokenizer text");
    if (n) memcpy(d, s, n);
    d[n] = 0;
    return d;
}

typedef struct {
    const char *file; /* for messages */
    char field[256];
} ctx;

static const char *fld(ctx *c, const char *fmt, ...) NB_PRINTF(2, 3);
static const char *fld(ctx *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->field, sizeof c->field, fmt, ap);
    va_end(ap);
    return c->field;
}

static const nb_json *want(ctx *c, const nb_json *obj, const char *key, nb_json_type ty, const char *path) {
    const nb_json *v = nb_json_get(obj, key);
    if (!v) hf_fail(c->file, path, "missing");
    if (v->type != ty) hf_fail(c->file, path, "is a %s, expected a %s", nb_json_type_name(v->type), nb_json_type_name(ty));
    return v;
}

static int opt_bool(ctx *c, const nb_json *obj, const char *key, int def, const char *path) {
    const nb_json *v = nb_json_get(obj, key);
    if (!v || v->type == NB_JSON_NULL) return def;
    if (v->type != NB_JSON_BOOL) hf_fail(c->file, path, "is a %s, expected true or false", nb_json_type_name(v->type));
    return v->boolean;
}

/* A member that must be missing, null, or one of the listed values the encoder can honour. */
static void need_null_or_empty(ctx *c, const nb_json *obj, const char *key, const char *path) {
    const nb_json *v = nb_json_get(obj, key);
    if (v && v->type != NB_JSON_NULL && !(v->type == NB_JSON_STR && v->len == 0))
        hf_fail(c->file, path, "is set; only null or \"\" is supported");
}

static const char *type_of(ctx *c, const nb_json *obj, const char *path) {
    if (!obj || obj->type != NB_JSON_OBJ) hf_fail(c->file, path, "expected an object");
    const nb_json *t = nb_json_get(obj, "type");
    if (!t || t->type != NB_JSON_STR) hf_fail(c->file, fld(c, "%s.type", path), "missing or not a string");
    return t->str;
}

static int32_t token_id(ctx *c, const nb_hf_tokenizer *t, const char *s, size_t len, const char *path) {
    int32_t id = hf_map_get(&t->vocab, s, len);
    if (id < 0) hf_fail(c->file, path, "'%s' is not a token of the vocabulary", s);
    return id;
}

/* ---- model ------------------------------------------------------------------------------ */

static void set_token(ctx *c, nb_hf_tokenizer *t, int32_t id, const char *s, size_t len, int added, const char *path) {
    if (t->tok[id] && !added)
        hf_fail(c->file, path, "id %d is given to both '%s' and '%s'", (int)id, t->tok[id], s);
    t->is_added[id] = (unsigned char)added;
    if (t->tok[id] && t->tok_len[id] == len && !memcmp(t->tok[id], s, len)) return;
    if (t->tok[id]) { /* an added token renames a model token: the old text stays a key of the map */
        t->spare = realloc(t->spare, (size_t)(t->n_spare + 1) * sizeof *t->spare);
        NB_CHECK(t->spare, NULL, "out of memory reading added tokens");
        t->spare[t->n_spare++] = t->tok[id];
    }
    t->tok[id] = dup_bytes(s, len);
    t->tok_len[id] = (uint32_t)len;
}

static int32_t read_id(ctx *c, const nb_json *v, const char *path) {
    if (v->type != NB_JSON_NUM || !v->is_int || v->i64 < 0 || v->i64 >= (1 << 30))
        hf_fail(c->file, path, "expected an id in 0..2^30");
    return (int32_t)v->i64;
}

static void size_vocab(ctx *c, nb_hf_tokenizer *t, const nb_json *vocab, const nb_json *added) {
    int64_t top = -1;
    for (size_t i = 0; i < vocab->len; i++) {
        int32_t id = read_id(c, &vocab->items[i], fld(c, "model.vocab['%s']", vocab->keys[i]));
        if (id > top) top = id;
    }
    for (size_t i = 0; i < added->len; i++) {
        const nb_json *a = &added->items[i];
        if (a->type != NB_JSON_OBJ) hf_fail(c->file, fld(c, "added_tokens[%zu]", i), "expected an object");
        int32_t id = read_id(c, want(c, a, "id", NB_JSON_NUM, fld(c, "added_tokens[%zu].id", i)), c->field);
        if (id > top) top = id;
    }
    if (top < 0) hf_fail(c->file, "model.vocab", "is empty");
    t->n_vocab = (int)top + 1;
    t->tok = nb_calloc((size_t)t->n_vocab, sizeof *t->tok, "vocabulary");
    t->tok_len = nb_calloc((size_t)t->n_vocab, sizeof *t->tok_len, "vocabulary");
    t->out = nb_calloc((size_t)t->n_vocab, sizeof *t->out, "vocabulary");
    t->out_len = nb_calloc((size_t)t->n_vocab, sizeof *t->out_len, "vocabulary");
    t->is_added = nb_calloc((size_t)t->n_vocab, 1, "vocabulary");
}

static int cmp_added(const void *x, const void *y) {
    const hf_added *a = x, *b = y;
    unsigned char fa = (unsigned char)a->text[0], fb = (unsigned char)b->text[0];
    if (fa != fb) return fa < fb ? -1 : 1;
    if (a->len != b->len) return a->len > b->len ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

static void load_vocab(ctx *c, nb_hf_tokenizer *t, const nb_json *vocab, const nb_json *added) {
    size_vocab(c, t, vocab, added);
    hf_map_init(&t->vocab, vocab->len + added->len);
    for (size_t i = 0; i < vocab->len; i++) {
        const char *k = vocab->keys[i];
        size_t len = strlen(k); /* keys hold no NUL: the parser's keys are C strings */
        set_token(c, t, (int32_t)vocab->items[i].i64, k, len, 0, fld(c, "model.vocab['%s']", k));
    }
    for (int32_t id = 0; id < t->n_vocab; id++)
        if (t->tok[id]) hf_map_put(&t->vocab, t->tok[id], t->tok_len[id], id);
    t->n_added = (int)added->len;
    t->added = nb_calloc(added->len + 1, sizeof *t->added, "added tokens");
    for (size_t i = 0; i < added->len; i++) {
        const nb_json *a = &added->items[i];
        const nb_json *content = want(c, a, "content", NB_JSON_STR, fld(c, "added_tokens[%zu].content", i));
        if (content->len == 0) hf_fail(c->file, c->field, "is empty");
        hf_added *d = &t->added[i];
        d->id = (int32_t)nb_json_get(a, "id")->i64;
        d->text = dup_bytes(content->str, content->len);
        d->len = content->len;
        d->lstrip = opt_bool(c, a, "lstrip", 0, fld(c, "added_tokens[%zu].lstrip", i));
        d->rstrip = opt_bool(c, a, "rstrip", 0, fld(c, "added_tokens[%zu].rstrip", i));
        set_token(c, t, d->id, d->text, d->len, 1, "added_tokens");
        hf_map_put(&t->vocab, t->tok[d->id], t->tok_len[d->id], d->id);
    }
    qsort(t->added, added->len, sizeof *t->added, cmp_added);
    int k = 0;
    for (int b = 0; b <= 256; b++) {
        while (k < t->n_added && (unsigned char)t->added[k].text[0] < b) k++;
        t->added_first[b] = k;
    }
}

static void merge_parts(ctx *c, const nb_json *m, size_t i, const char **a, size_t *al, const char **b, size_t *bl) {
    const char *path = fld(c, "model.merges[%zu]", i);
    if (m->type == NB_JSON_ARR) {
        if (m->len != 2 || m->items[0].type != NB_JSON_STR || m->items[1].type != NB_JSON_STR)
            hf_fail(c->file, path, "expected two strings");
        *a = m->items[0].str, *al = m->items[0].len, *b = m->items[1].str, *bl = m->items[1].len;
        return;
    }
    if (m->type != NB_JSON_STR) hf_fail(c->file, path, "expected \"left right\" or [left, right]");
    /* "a b": split at spaces, the first two parts (JavaScript's split(" ", 2)) */
    const char *sp = memchr(m->str, ' ', m->len);
    if (!sp) hf_fail(c->file, path, "'%s' has no space between its two parts", m->str);
    *a = m->str, *al = (size_t)(sp - m->str);
    *b = sp + 1;
    const char *end = memchr(*b, ' ', m->len - *al - 1);
    *bl = end ? (size_t)(end - *b) : m->len - *al - 1;
}

static void load_merges(ctx *c, nb_hf_tokenizer *t, const nb_json *merges) {
    pairs_init(&t->pairs, merges->len);
    char *buf = NULL;
    size_t cap = 0;
    for (size_t i = 0; i < merges->len; i++) {
        const char *a, *b;
        size_t al, bl;
        merge_parts(c, &merges->items[i], i, &a, &al, &b, &bl);
        if (al + bl + 1 > cap) buf = realloc(buf, cap = 2 * (al + bl + 1));
        NB_CHECK(buf, NULL, "out of memory reading merges");
        memcpy(buf, a, al), memcpy(buf + al, b, bl), buf[al + bl] = 0;
        int32_t ia = hf_map_get(&t->vocab, a, al), ib = hf_map_get(&t->vocab, b, bl);
        int32_t im = hf_map_get(&t->vocab, buf, al + bl);
        if (ia < 0 || ib < 0 || im < 0)
            hf_fail(c->file, fld(c, "model.merges[%zu]", i), "'%.*s' + '%.*s': %s is not a token",
                    (int)al, a, (int)bl, b, ia < 0 ? "the left part" : ib < 0 ? "the right part" : "the result");
        pairs_put(&t->pairs, ia, ib, (int32_t)i, im);
    }
    free(buf);
}

static void load_model(ctx *c, nb_hf_tokenizer *t, const nb_json *root) {
    const nb_json *m = want(c, root, "model", NB_JSON_OBJ, "model");
    const char *ty = type_of(c, m, "model");
    if (strcmp(ty, "BPE")) hf_fail(c->file, "model.type", "'%s' is not supported; only BPE", ty);
    const nb_json *dropout = nb_json_get(m, "dropout");
    if (dropout && dropout->type != NB_JSON_NULL) hf_fail(c->file, "model.dropout", "must be null (BPE dropout is for training a tokenizer)");
    need_null_or_empty(c, m, "continuing_subword_prefix", "model.continuing_subword_prefix");
    need_null_or_empty(c, m, "end_of_word_suffix", "model.end_of_word_suffix");
    const nb_json *added = nb_json_get(root, "added_tokens");
    static const nb_json none = {.type = NB_JSON_ARR};
    if (!added || added->type == NB_JSON_NULL) added = &none;
    if (added->type != NB_JSON_ARR) hf_fail(c->file, "added_tokens", "expected an array");
    load_vocab(c, t, want(c, m, "vocab", NB_JSON_OBJ, "model.vocab"), added);
    load_merges(c, t, want(c, m, "merges", NB_JSON_ARR, "model.merges"));
    t->fuse_unk = opt_bool(c, m, "fuse_unk", 0, "model.fuse_unk");
    t->byte_fallback = opt_bool(c, m, "byte_fallback", 0, "model.byte_fallback");
    t->ignore_merges = opt_bool(c, m, "ignore_merges", 0, "model.ignore_merges");
    const nb_json *unk = nb_json_get(m, "unk_token");
    t->unk_id = -1;
    if (unk && unk->type == NB_JSON_STR) t->unk_id = token_id(c, t, unk->str, unk->len, "model.unk_token");
    else if (unk && unk->type != NB_JSON_NULL) hf_fail(c->file, "model.unk_token", "expected a string or null");
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        t->fallback_id[b] = hf_map_get(&t->vocab, name, 6);
    }
}

/* ---- normalizer, pre-tokenizer, post-processor, decoder ---------------------------------- */

static const char *REGEX_LLAMA3 =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char *REGEX_QWEN =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static void add_norm(ctx *c, nb_hf_tokenizer *t, const nb_json *n, const char *path) {
    const char *ty = type_of(c, n, path);
    if (t->n_norm == HF_MAX_NORM) hf_fail(c->file, path, "more than %d normalizers", HF_MAX_NORM);
    hf_norm *d = &t->norm[t->n_norm++];
    if (!strcmp(ty, "NFC")) {
        d->kind = HF_NORM_NFC;
    } else if (!strcmp(ty, "Prepend")) {
        const nb_json *p = want(c, n, "prepend", NB_JSON_STR, fld(c, "%s.prepend", path));
        d->kind = HF_NORM_PREPEND, d->a = dup_bytes(p->str, p->len), d->alen = p->len;
    } else if (!strcmp(ty, "Replace")) {
        const nb_json *pat = want(c, n, "pattern", NB_JSON_OBJ, fld(c, "%s.pattern", path));
        const nb_json *s = nb_json_get(pat, "String");
        if (!s || s->type != NB_JSON_STR || s->len == 0)
            hf_fail(c->file, fld(c, "%s.pattern", path), "only a non-empty String pattern is supported");
        const nb_json *to = want(c, n, "content", NB_JSON_STR, fld(c, "%s.content", path));
        d->kind = HF_NORM_REPLACE, d->a = dup_bytes(s->str, s->len), d->alen = s->len;
        d->b = dup_bytes(to->str, to->len), d->blen = to->len;
    } else {
        hf_fail(c->file, fld(c, "%s.type", path), "normalizer '%s' is not supported (NFC, Prepend, Replace, Sequence are)", ty);
    }
}

static void load_normalizer(ctx *c, nb_hf_tokenizer *t, const nb_json *root) {
    const nb_json *n = nb_json_get(root, "normalizer");
    if (!n || n->type == NB_JSON_NULL) return;
    if (strcmp(type_of(c, n, "normalizer"), "Sequence")) {
        add_norm(c, t, n, "normalizer");
        return;
    }
    const nb_json *list = want(c, n, "normalizers", NB_JSON_ARR, "normalizer.normalizers");
    for (size_t i = 0; i < list->len; i++) {
        char path[64];
        snprintf(path, sizeof path, "normalizer.normalizers[%zu]", i);
        add_norm(c, t, &list->items[i], path);
    }
}

static void byte_level_pre(ctx *c, nb_hf_tokenizer *t, const nb_json *p, const char *path, int alone) {
    t->byte_level = 1;
    int use_regex = opt_bool(c, p, "use_regex", 1, fld(c, "%s.use_regex", path));
    int prefix = opt_bool(c, p, "add_prefix_space", 1, fld(c, "%s.add_prefix_space", path));
    if (!alone && (use_regex || prefix))
        hf_fail(c->file, path, "a ByteLevel after Split must have use_regex and add_prefix_space false");
    if (use_regex) t->pre = HF_PRE_GPT2;
    t->prefix_space = prefix;
}

static void split_pre(ctx *c, nb_hf_tokenizer *t, const nb_json *p, const char *path) {
    const nb_json *pat = want(c, p, "pattern", NB_JSON_OBJ, fld(c, "%s.pattern", path));
    const nb_json *re = nb_json_get(pat, "Regex");
    if (!re || re->type != NB_JSON_STR) hf_fail(c->file, fld(c, "%s.pattern", path), "only a Regex pattern is supported");
    if (!strcmp(re->str, REGEX_LLAMA3)) t->pre = HF_PRE_LLAMA3;
    else if (!strcmp(re->str, REGEX_QWEN)) t->pre = HF_PRE_QWEN;
    else hf_fail(c->file, fld(c, "%s.pattern.Regex", path), "this regex is not one nobubble implements (Llama 3's, Qwen2/3's)");
    const nb_json *beh = want(c, p, "behavior", NB_JSON_STR, fld(c, "%s.behavior", path));
    if (strcmp(beh->str, "Isolated")) hf_fail(c->file, c->field, "'%s' is not supported; only Isolated", beh->str);
    if (opt_bool(c, p, "invert", 0, fld(c, "%s.invert", path))) hf_fail(c->file, c->field, "must be false");
}

static void load_pre(ctx *c, nb_hf_tokenizer *t, const nb_json *root) {
    const nb_json *p = nb_json_get(root, "pre_tokenizer");
    if (!p || p->type == NB_JSON_NULL) return;
    const char *ty = type_of(c, p, "pre_tokenizer");
    if (!strcmp(ty, "ByteLevel")) {
        byte_level_pre(c, t, p, "pre_tokenizer", 1);
        return;
    }
    if (strcmp(ty, "Sequence")) hf_fail(c->file, "pre_tokenizer.type", "'%s' is not supported (ByteLevel, Sequence of Split + ByteLevel are)", ty);
    const nb_json *list = want(c, p, "pretokenizers", NB_JSON_ARR, "pre_tokenizer.pretokenizers");
    if (list->len != 2 || strcmp(type_of(c, &list->items[0], "pre_tokenizer.pretokenizers[0]"), "Split") ||
        strcmp(type_of(c, &list->items[1], "pre_tokenizer.pretokenizers[1]"), "ByteLevel"))
        hf_fail(c->file, "pre_tokenizer.pretokenizers", "only [Split, ByteLevel] is supported");
    split_pre(c, t, &list->items[0], "pre_tokenizer.pretokenizers[0]");
    byte_level_pre(c, t, &list->items[1], "pre_tokenizer.pretokenizers[1]", 0);
}

static void load_post(ctx *c, nb_hf_tokenizer *t, const nb_json *root) {
    const nb_json *p = nb_json_get(root, "post_processor");
    if (!p || p->type == NB_JSON_NULL) return;
    const char *ty = type_of(c, p, "post_processor");
    if (!strcmp(ty, "ByteLevel")) return; /* offsets only; the ids are unchanged */
    if (strcmp(ty, "TemplateProcessing")) hf_fail(c->file, "post_processor.type", "'%s' is not supported (ByteLevel, TemplateProcessing are)", ty);
    const nb_json *single = want(c, p, "single", NB_JSON_ARR, "post_processor.single");
    int seen_seq = 0;
    for (size_t i = 0; i < single->len; i++) {
        const nb_json *it = &single->items[i];
        const nb_json *sp = nb_json_get(it, "SpecialToken"), *seq = nb_json_get(it, "Sequence");
        if (seq) {
            const nb_json *id = want(c, seq, "id", NB_JSON_STR, fld(c, "post_processor.single[%zu].Sequence.id", i));
            if (strcmp(id->str, "A") || seen_seq) hf_fail(c->file, c->field, "only one sequence A is supported");
            seen_seq = 1;
        } else if (sp) {
            const nb_json *id = want(c, sp, "id", NB_JSON_STR, fld(c, "post_processor.single[%zu].SpecialToken.id", i));
            int32_t tid = token_id(c, t, id->str, id->len, c->field);
            int *n = seen_seq ? &t->n_post_tmpl : &t->n_pre_tmpl;
            if (*n == HF_MAX_TEMPLATE) hf_fail(c->file, c->field, "more than %d special tokens", HF_MAX_TEMPLATE);
            (seen_seq ? t->post_tmpl : t->pre_tmpl)[(*n)++] = tid;
        } else {
            hf_fail(c->file, fld(c, "post_processor.single[%zu]", i), "expected SpecialToken or Sequence");
        }
    }
    if (!seen_seq) hf_fail(c->file, "post_processor.single", "has no Sequence A");
}

/* What each token turns into mid-text: byte-level tokens back to their bytes; SentencePiece
 * tokens with U+2581 as a space and <0xNN> as the byte. */
static void build_out(ctx *c, nb_hf_tokenizer *t, int sp_replace, int sp_bytes) {
    uint32_t b2c[256];
    int16_t c2b[0x144];
    hf_byte_alphabet(b2c);
    memset(c2b, 0xff, sizeof c2b);
    for (int b = 0; b < 256; b++) c2b[b2c[b]] = (int16_t)b;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        const char *s = t->tok[id];
        if (!s) continue;
        size_t n = t->tok_len[id], o = 0;
        char *out = nb_malloc(n + 1, "token bytes");
        if (t->byte_level && !t->is_added[id]) {
            for (size_t i = 0; i < n;) {
                uint32_t cp;
                int k = nb_utf8_decode((const unsigned char *)s + i, n - i, &cp);
                if (k <= 0 || cp >= 0x144 || c2b[cp] < 0)
                    hf_fail(c->file, fld(c, "model.vocab['%s']", s), "has a character outside the byte-level alphabet");
                out[o++] = (char)c2b[cp], i += (size_t)k;
            }
        } else if (sp_bytes && n == 6 && !strncmp(s, "<0x", 3) && s[5] == '>' && strchr("0123456789ABCDEFabcdef", s[3]) && s[3] &&
                   strchr("0123456789ABCDEFabcdef", s[4]) && s[4]) {
            out[o++] = (char)strtol((char[]){s[3], s[4], 0}, NULL, 16);
        } else {
            for (size_t i = 0; i < n;) {
                if (sp_replace && n - i >= 3 && !memcmp(s + i, "\xE2\x96\x81", 3)) out[o++] = ' ', i += 3;
                else out[o++] = s[i++];
            }
        }
        out[o] = 0;
        t->out[id] = out, t->out_len[id] = (uint32_t)o;
    }
    if (t->byte_level)
        for (int b = 0; b < 256; b++) {
            unsigned char u[4];
            int k = hf_utf8_put(b2c[b], u);
            t->byte_id[b] = hf_map_get(&t->vocab, (const char *)u, (size_t)k);
            if (t->byte_id[b] < 0) hf_fail(c->file, "model.vocab", "byte 0x%02X has no token (its character is U+%04X)", b, (unsigned)b2c[b]);
        }
}

static void load_decoder(ctx *c, nb_hf_tokenizer *t, const nb_json *root) {
    const nb_json *d = want(c, root, "decoder", NB_JSON_OBJ, "decoder");
    const char *ty = type_of(c, d, "decoder");
    if (t->byte_level) {
        if (strcmp(ty, "ByteLevel")) hf_fail(c->file, "decoder.type", "'%s' with a ByteLevel pre-tokenizer; only ByteLevel is supported", ty);
        build_out(c, t, 0, 0);
        return;
    }
    if (strcmp(ty, "Sequence")) hf_fail(c->file, "decoder.type", "'%s' is not supported (Sequence of Replace, ByteFallback, Fuse, Strip is)", ty);
    const nb_json *list = want(c, d, "decoders", NB_JSON_ARR, "decoder.decoders");
    int replace = 0, bytes = 0, fused = 0;
    for (size_t i = 0; i < list->len; i++) {
        char path[64];
        snprintf(path, sizeof path, "decoder.decoders[%zu]", i);
        const nb_json *e = &list->items[i];
        const char *k = type_of(c, e, path);
        if (!strcmp(k, "Replace")) {
            const nb_json *s = nb_json_get(want(c, e, "pattern", NB_JSON_OBJ, fld(c, "%s.pattern", path)), "String");
            const nb_json *to = nb_json_get(e, "content");
            if (i != 0 || !s || s->type != NB_JSON_STR || strcmp(s->str, "\xE2\x96\x81") || !to || to->type != NB_JSON_STR || strcmp(to->str, " "))
                hf_fail(c->file, path, "only a first Replace of U+2581 by ' ' is supported");
            replace = 1;
        } else if (!strcmp(k, "ByteFallback")) {
            bytes = 1;
        } else if (!strcmp(k, "Fuse")) {
            fused = 1;
        } else if (!strcmp(k, "Strip")) {
            const nb_json *content = want(c, e, "content", NB_JSON_STR, fld(c, "%s.content", path));
            int64_t stop = nb_json_get_int(e, "stop", 0), start = nb_json_get_int(e, "start", 0);
            if (!fused || i + 1 != list->len || strcmp(content->str, " ") || stop != 0 || start < 0 || start > 64)
                hf_fail(c->file, path, "only a last Strip of leading ' ' after Fuse is supported");
            t->strip_start = (int)start;
        } else {
            hf_fail(c->file, fld(c, "%s.type", path), "decoder '%s' is not supported", k);
        }
    }
    build_out(c, t, replace, bytes);
}

/* bos_token / eos_token: a string, {"content": ...}, or null. */
static int32_t config_token(ctx *c, const nb_hf_tokenizer *t, const nb_json *cfg, const char *key) {
    const nb_json *v = nb_json_get(cfg, key);
    if (!v || v->type == NB_JSON_NULL) return -1;
    if (v->type == NB_JSON_OBJ) v = want(c, v, "content", NB_JSON_STR, fld(c, "%s.content", key));
    if (v->type != NB_JSON_STR) hf_fail(c->file, key, "expected a string, an object with content, or null");
    return token_id(c, t, v->str, v->len, key);
}

/* Which built-in template the config's chat_template (a string, or a list of {name, template})
 * is, by the markers each family's template writes. */
static int config_chat(const nb_json *cfg) {
    const nb_json *v = nb_json_get(cfg, "chat_template");
    if (v && v->type == NB_JSON_ARR) {
        const nb_json *pick = NULL;
        for (size_t i = 0; i < v->len; i++) {
            const char *name = nb_json_get_str(&v->items[i], "name", "");
            if (!pick || !strcmp(name, "default")) pick = nb_json_get(&v->items[i], "template");
        }
        v = pick;
    }
    if (!v || v->type != NB_JSON_STR) {
        const char *cls = nb_json_get_str(cfg, "tokenizer_class", "");
        return !strncmp(cls, "LlamaTokenizer", 14) ? NB_CHAT_LLAMA2 : NB_CHAT_PLAIN;
    }
    if (strstr(v->str, "<|start_header_id|>")) return NB_CHAT_LLAMA3;
    if (strstr(v->str, "<|im_start|>")) return strstr(v->str, "<think>") ? NB_CHAT_QWEN3 : NB_CHAT_CHATML;
    if (strstr(v->str, "[INST]")) return NB_CHAT_LLAMA2;
    return -1;
}

static nb_json *load_json(const char *path) {
    size_t len;
    char *text = nb_read_file(path, NB_JSON_MAX_BYTES, &len, "check the tokenizer folder");
    char err[512];
    nb_json *j = nb_json_parse(text, len, path, err, sizeof err);
    free(text);
    if (!j) {
        fflush(stdout);
        fprintf(stderr, "nobubble: error: %s (hint: the tokenizer file is damaged; fetch it again)\n", err);
        exit(2);
    }
    return j;
}

int nb_hf_tokenizer_present(const char *dir) {
    char path[NB_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    struct stat st;
    return stat(path, &st) == 0;
}

nb_hf_tokenizer *nb_hf_tokenizer_load(const char *dir) {
    char path[NB_PATH_MAX + 32];
    NB_CHECK(strlen(dir) < NB_PATH_MAX, "use a shorter path", "tokenizer folder path too long");
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    nb_json *root = load_json(path);
    ctx c = {.file = path};
    if (root->type != NB_JSON_OBJ) hf_fail(path, "(top)", "expected an object");
    nb_hf_tokenizer *t = nb_calloc(1, sizeof *t, "tokenizer");
    load_model(&c, t, root);
    load_normalizer(&c, t, root);
    load_pre(&c, t, root);
    load_post(&c, t, root);
    load_decoder(&c, t, root);
    nb_json_free(root);
    t->bos = t->eos = -1;
    t->chat = NB_CHAT_PLAIN;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    struct stat st;
    if (stat(path, &st) == 0) {
        nb_json *cfg = load_json(path);
        if (cfg->type != NB_JSON_OBJ) hf_fail(path, "(top)", "expected an object");
        t->bos = config_token(&c, t, cfg, "bos_token");
        t->eos = config_token(&c, t, cfg, "eos_token");
        t->chat = config_chat(cfg);
        nb_json_free(cfg);
    }
    return t;
}

void nb_hf_tokenizer_free(nb_hf_tokenizer *t) {
    if (!t) return;
    for (int i = 0; i < t->n_vocab; i++) free(t->tok[i]), free(t->out[i]);
    free(t->tok), free(t->tok_len), free(t->out), free(t->out_len), free(t->is_added);
    hf_map_free(&t->vocab);
    free(t->pairs.key), free(t->pairs.rank), free(t->pairs.merged);
    for (int i = 0; i < t->n_norm; i++) free(t->norm[i].a), free(t->norm[i].b);
    for (int i = 0; i < t->n_added; i++) free(t->added[i].text);
    for (int i = 0; i < t->n_spare; i++) free(t->spare[i]);
    free(t->spare);
    free(t->added);
    free(t);
}

int nb_hf_tokenizer_vocab_size(const nb_hf_tokenizer *t) { return t->n_vocab; }
int32_t nb_hf_tokenizer_bos(const nb_hf_tokenizer *t) { return t->bos; }
int32_t nb_hf_tokenizer_eos(const nb_hf_tokenizer *t) { return t->eos; }
int nb_hf_tokenizer_chat_template(const nb_hf_tokenizer *t) { return t->chat; }
