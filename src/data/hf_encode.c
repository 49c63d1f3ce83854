/* Encode and decode with a loaded Hugging Face tokenizer (see hf_tokenizer.h for the steps). */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "core.h"
#include "data/hf_internal.h"
#include "data/tokenizer.h"

/* ---- growable buffers ------------------------------------------------------------------- */

typedef struct {
    int32_t *v;
    size_t n, cap;
} ivec;

static void ivec_push(ivec *a, int32_t x) {
    if (a->n == a->cap) {
        a->cap = a->cap ? 2 * a->cap : 1024;
        a->v = realloc(a->v, a->cap * sizeof *a->v);
        NB_CHECK(a->v, "encode smaller texts", "out of host memory for %zu token ids", a->cap);
    }
    a->v[a->n++] = x;
}

typedef struct {
    char *s;
    size_t n, cap;
} sbuf;

static void sb_add(sbuf *b, const void *p, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        b->s = realloc(b->s, cap);
        NB_CHECK(b->s, "encode smaller texts", "out of host memory for %zu bytes of text", cap);
        b->cap = cap;
    }
    if (n) memcpy(b->s + b->n, p, n);
    b->n += n;
    b->s[b->n] = 0;
}

/* ---- character classes (node's \p{L}, \p{N}, \s; see tokenizer.h) -------------------------- */

static inline uint32_t cp_at(const unsigned char *s, int *len) {
    unsigned b0 = s[0];
    if (b0 < 0x80) return *len = 1, b0;
    if (b0 < 0xE0) return *len = 2, (b0 & 0x1Fu) << 6 | (s[1] & 0x3Fu);
    if (b0 < 0xF0) return *len = 3, (b0 & 0x0Fu) << 12 | (s[1] & 0x3Fu) << 6 | (s[2] & 0x3Fu);
    return *len = 4, (b0 & 0x07u) << 18 | (s[1] & 0x3Fu) << 12 | (s[2] & 0x3Fu) << 6 | (s[3] & 0x3Fu);
}

static inline char cls_at(const unsigned char *s, int *len) {
    if (s[0] < 0x80) {
        *len = 1;
        unsigned c = s[0];
        if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return 'L';
        if (c >= '0' && c <= '9') return 'N';
        if (c == ' ' || (c >= 0x09 && c <= 0x0D)) return 'W';
        return 'O';
    }
    return nb_tokenizer_char_class(cp_at(s, len));
}

static size_t run_of(const unsigned char *s, size_t q, size_t n, char cls) {
    int l;
    while (q < n && cls_at(s + q, &l) == cls) q += (size_t)l;
    return q;
}

static int is_nl(unsigned char c) { return c == '\r' || c == '\n'; }

/* The end of the whitespace alternatives \s*[\r\n]+ (when nl), \s+(?!\S) and \s+ at p. */
static size_t space_end(const unsigned char *s, size_t p, size_t n, int nl) {
    size_t w = p, last = p, last_nl = (size_t)-1;
    int l;
    while (w < n && cls_at(s + w, &l) == 'W') {
        if (is_nl(s[w])) last_nl = w;
        last = w, w += (size_t)l;
    }
    if (nl && last_nl != (size_t)-1) return last_nl + 1; /* \s* backs off to the last newline */
    if (w == n || last == p) return w;                    /* at the end, or a single space: \s+ */
    return last;                                          /* leave one space for the next word */
}

/* (?i:'s|'t|'re|'ve|'m|'ll|'d) as the reference rewrites it ([sS]...), or the case-sensitive one. */
static size_t contraction(const unsigned char *s, size_t p, size_t n, int fold) {
    if (s[p] != '\'' || p + 1 >= n) return 0;
    unsigned a = s[p + 1], b = p + 2 < n ? s[p + 2] : 0;
    if (fold) a |= 0x20, b |= 0x20;
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return p + 2;
    if (((a == 'r' || a == 'v') && b == 'e') || (a == 'l' && b == 'l')) return p + 3;
    return 0;
}

/* Llama 3 (digits 3) and Qwen2/3 (digits 1):
 * (?i:'s|...)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,k}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
static size_t split_end(const unsigned char *s, size_t p, size_t n, int digits) {
    size_t e = contraction(s, p, n, 1);
    if (e) return e;
    int l0, l;
    char c0 = cls_at(s + p, &l0);
    if (c0 == 'L') return run_of(s, p, n, 'L');
    if (c0 != 'N' && !is_nl(s[p]) && p + (size_t)l0 < n && cls_at(s + p + l0, &l) == 'L')
        return run_of(s, p + (size_t)l0, n, 'L');
    if (c0 == 'N') {
        size_t q = p;
        for (int k = 0; k < digits && q < n && cls_at(s + q, &l) == 'N'; k++) q += (size_t)l;
        return q;
    }
    size_t q = p + (s[p] == ' ');
    if (q < n && cls_at(s + q, &l) == 'O') {
        q = run_of(s, q, n, 'O');
        while (q < n && is_nl(s[q])) q++;
        return q;
    }
    return space_end(s, p, n, 1);
}

/* GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static size_t gpt2_end(const unsigned char *s, size_t p, size_t n) {
    size_t e = contraction(s, p, n, 0);
    if (e) return e;
    size_t q = p + (s[p] == ' ');
    int l;
    if (q < n) {
        char c = cls_at(s + q, &l);
        if (c != 'W') return run_of(s, q, n, c);
    }
    return space_end(s, p, n, 0);
}

/* ---- BPE -------------------------------------------------------------------------------- */

typedef struct {
    int32_t *id, *next, *prev;
    size_t cap;
    uint64_t *heap; /* rank << 32 | position of the left symbol: lowest rank, then leftmost */
    size_t hn, hcap;
} bpe_work;

static int32_t pair_rank(const nb_hf_tokenizer *t, int32_t a, int32_t b, int32_t *merged) {
    if (a < 0 || b < 0) return -1;
    uint64_t k = ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 1;
    const hf_pairs *p = &t->pairs;
    size_t i = (size_t)((k * 0x9E3779B97F4A7C15ull) >> 20) & (p->cap - 1);
    while (p->key[i]) {
        if (p->key[i] == k) return *merged = p->merged[i], p->rank[i];
        i = (i + 1) & (p->cap - 1);
    }
    return -1;
}

static void heap_push(bpe_work *w, uint64_t k) {
    if (w->hn == w->hcap) {
        w->hcap = w->hcap ? 2 * w->hcap : 256;
        w->heap = realloc(w->heap, w->hcap * sizeof *w->heap);
        NB_CHECK(w->heap, "encode smaller texts", "out of host memory for the merge queue");
    }
    size_t i = w->hn++;
    while (i && w->heap[(i - 1) / 2] > k) w->heap[i] = w->heap[(i - 1) / 2], i = (i - 1) / 2;
    w->heap[i] = k;
}

static uint64_t heap_pop(bpe_work *w) {
    uint64_t top = w->heap[0], last = w->heap[--w->hn];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= w->hn) break;
        if (c + 1 < w->hn && w->heap[c + 1] < w->heap[c]) c++;
        if (w->heap[c] >= last) break;
        w->heap[i] = w->heap[c], i = c;
    }
    if (w->hn) w->heap[i] = last;
    return top;
}

static void push_pair(const nb_hf_tokenizer *t, bpe_work *w, int32_t i) {
    int32_t j = w->next[i], m;
    if (i < 0 || j < 0) return;
    int32_t r = pair_rank(t, w->id[i], w->id[j], &m);
    if (r >= 0) heap_push(w, (uint64_t)r << 32 | (uint32_t)i);
}

/* Merge symbols id[0..m) in place; returns through next[] links starting at 0. */
static void bpe(const nb_hf_tokenizer *t, bpe_work *w, size_t m) {
    w->hn = 0;
    for (size_t i = 0; i < m; i++) w->next[i] = i + 1 < m ? (int32_t)(i + 1) : -1, w->prev[i] = (int32_t)i - 1;
    for (size_t i = 0; i + 1 < m; i++) push_pair(t, w, (int32_t)i);
    while (w->hn) {
        uint64_t k = heap_pop(w);
        int32_t i = (int32_t)(uint32_t)k, rank = (int32_t)(k >> 32), merged = -1;
        int32_t j = w->next[i];
        /* stale: the left symbol was absorbed, or its right neighbour changed */
        if (w->id[i] < 0 || j < 0 || pair_rank(t, w->id[i], w->id[j], &merged) != rank) continue;
        w->id[i] = merged;
        w->next[i] = w->next[j];
        if (w->next[j] >= 0) w->prev[w->next[j]] = i;
        w->id[j] = -2; /* absorbed */
        w->next[j] = -1;
        if (w->prev[i] >= 0) push_pair(t, w, w->prev[i]);
        push_pair(t, w, i);
    }
}

static void work_reserve(bpe_work *w, size_t m) {
    if (m <= w->cap) return;
    NB_CHECK(m < INT32_MAX, "split the text", "a piece of %zu characters is too long to encode", m);
    w->cap = m;
    w->id = realloc(w->id, m * sizeof *w->id);
    w->next = realloc(w->next, m * sizeof *w->next);
    w->prev = realloc(w->prev, m * sizeof *w->prev);
    NB_CHECK(w->id && w->next && w->prev, "encode smaller texts", "out of host memory for %zu symbols", m);
}

typedef struct {
    bpe_work w;
    size_t *cstart; /* byte offset of each symbol's character (SentencePiece fallback) */
    size_t ccap;
    sbuf mapped, norm, tmp;
} enc_work;

static void emit_unknown(const nb_hf_tokenizer *t, const unsigned char *s, size_t len, ivec *out) {
    int all = t->byte_fallback;
    for (size_t i = 0; all && i < len; i++) all = t->fallback_id[s[i]] >= 0;
    if (all) {
        for (size_t i = 0; i < len; i++) ivec_push(out, t->fallback_id[s[i]]);
        return;
    }
    NB_CHECK(t->unk_id >= 0, "the tokenizer has neither byte fallback nor an unknown token for this text",
             "a character has no token");
    ivec_push(out, t->unk_id);
}

/* One pre-token through the model. */
static void model_piece(const nb_hf_tokenizer *t, enc_work *e, const unsigned char *s, size_t n, ivec *out) {
    if (n == 0) return;
    bpe_work *w = &e->w;
    size_t m = 0;
    if (t->byte_level) {
        if (t->ignore_merges) {
            e->mapped.n = 0;
            uint32_t b2c[256];
            hf_byte_alphabet(b2c);
            for (size_t i = 0; i < n; i++) {
                unsigned char u[4];
                sb_add(&e->mapped, u, (size_t)hf_utf8_put(b2c[s[i]], u));
            }
            int32_t id = hf_map_get(&t->vocab, e->mapped.s, e->mapped.n);
            if (id >= 0) {
                ivec_push(out, id);
                return;
            }
        }
        work_reserve(w, n);
        for (size_t i = 0; i < n; i++) w->id[m++] = t->byte_id[s[i]];
    } else {
        work_reserve(w, n);
        if (n > e->ccap) {
            e->ccap = n;
            e->cstart = realloc(e->cstart, (n + 1) * sizeof *e->cstart);
            NB_CHECK(e->cstart, "encode smaller texts", "out of host memory");
        }
        for (size_t i = 0; i < n;) {
            int l;
            cp_at(s + i, &l);
            e->cstart[m] = i;
            w->id[m++] = hf_map_get(&t->vocab, (const char *)s + i, (size_t)l);
            i += (size_t)l;
        }
        e->cstart[m] = n;
    }
    bpe(t, w, m);
    for (int32_t i = 0; i >= 0; i = w->next[i]) {
        if (w->id[i] >= 0) ivec_push(out, w->id[i]);
        else emit_unknown(t, s + e->cstart[i], e->cstart[i + 1] - e->cstart[i], out);
    }
}

/* ---- normalizers and sections ----------------------------------------------------------- */

static void normalize(const nb_hf_tokenizer *t, enc_work *e, const char *s, size_t n) {
    e->norm.n = 0;
    sb_add(&e->norm, s, n);
    for (int k = 0; k < t->n_norm; k++) {
        const hf_norm *d = &t->norm[k];
        sbuf *b = &e->norm, *o = &e->tmp;
        o->n = 0;
        if (d->kind == HF_NORM_NFC) {
            utf8proc_uint8_t *r = NULL;
            utf8proc_ssize_t len = b->n ? utf8proc_map((const utf8proc_uint8_t *)b->s, (utf8proc_ssize_t)b->n, &r,
                                                       UTF8PROC_STABLE | UTF8PROC_COMPOSE)
                                        : 0;
            NB_CHECK(len >= 0, "report this text", "NFC normalization failed: %s", utf8proc_errmsg(len));
            sb_add(o, r, (size_t)len);
            free(r);
        } else if (d->kind == HF_NORM_PREPEND) {
            sb_add(o, d->a, d->alen);
            sb_add(o, b->s, b->n);
        } else {
            for (size_t i = 0; i < b->n;) {
                if (b->n - i >= d->alen && !memcmp(b->s + i, d->a, d->alen)) sb_add(o, d->b, d->blen), i += d->alen;
                else sb_add(o, b->s + i, 1), i++;
            }
        }
        sbuf x = *b;
        *b = *o, *o = x;
    }
}

static void encode_section(const nb_hf_tokenizer *t, enc_work *e, const char *text, size_t len, ivec *out) {
    normalize(t, e, text, len);
    if (e->norm.n == 0) return;
    if (t->prefix_space && e->norm.s[0] != ' ') {
        e->tmp.n = 0;
        sb_add(&e->tmp, " ", 1);
        sb_add(&e->tmp, e->norm.s, e->norm.n);
        sbuf x = e->norm;
        e->norm = e->tmp, e->tmp = x;
    }
    const unsigned char *s = (const unsigned char *)e->norm.s;
    size_t n = e->norm.n, first = out->n;
    for (size_t p = 0; p < n;) {
        size_t q = t->pre == HF_PRE_LLAMA3 ? split_end(s, p, n, 3)
                   : t->pre == HF_PRE_QWEN ? split_end(s, p, n, 1)
                   : t->pre == HF_PRE_GPT2 ? gpt2_end(s, p, n)
                                           : n;
        model_piece(t, e, s + p, q - p, out);
        p = q;
    }
    if (t->fuse_unk && t->unk_id >= 0) { /* consecutive unknowns of one section become one */
        size_t o = first;
        for (size_t i = first; i < out->n; i++)
            if (!(out->v[i] == t->unk_id && o > first && out->v[o - 1] == t->unk_id)) out->v[o++] = out->v[i];
        out->n = o;
    }
}

/* The longest added token at s[i..n), or NULL. */
static const hf_added *added_at(const nb_hf_tokenizer *t, const char *s, size_t i, size_t n) {
    unsigned char b = (unsigned char)s[i];
    for (int k = t->added_first[b]; k < t->added_first[b + 1]; k++) {
        const hf_added *a = &t->added[k];
        if (a->len <= n - i && !memcmp(s + i, a->text, a->len)) return a;
    }
    return NULL;
}

static int js_space_at(const char *s, size_t n, size_t i, int *l) {
    (void)n;
    return cls_at((const unsigned char *)s + i, l) == 'W';
}

static size_t trim_start(const char *s, size_t from, size_t to) {
    int l;
    while (from < to && js_space_at(s, to, from, &l)) from += (size_t)l;
    return from;
}

static size_t trim_end(const char *s, size_t from, size_t to) {
    while (to > from) {
        size_t k = to - 1;
        while (k > from && ((unsigned char)s[k] & 0xC0) == 0x80) k--;
        int l;
        if (!js_space_at(s, to, k, &l)) break;
        to = k;
    }
    return to;
}

size_t nb_hf_tokenizer_encode(const nb_hf_tokenizer *t, const char *utf8, size_t len, int add_special,
                              int32_t **ids_out) {
    size_t clean_len = len;
    char *clean = nb_utf8_sanitize(utf8, len, &clean_len);
    const char *s = clean ? clean : utf8;
    ivec out = {0};
    enc_work e = {0};
    if (add_special)
        for (int i = 0; i < t->n_pre_tmpl; i++) ivec_push(&out, t->pre_tmpl[i]);
    size_t start = 0;   /* of the pending text section */
    int rstrip = 0;     /* the token before it strips spaces on its right */
    for (size_t i = 0; i <= clean_len;) {
        const hf_added *a = i < clean_len ? added_at(t, s, i, clean_len) : NULL;
        if (!a && i < clean_len) {
            i++;
            continue;
        }
        size_t from = rstrip ? trim_start(s, start, i) : start, to = i;
        if (a && a->lstrip) to = trim_end(s, from, to);
        if (to > from) encode_section(t, &e, s + from, to - from, &out);
        if (!a) break;
        ivec_push(&out, a->id);
        rstrip = a->rstrip;
        i += a->len, start = i;
    }
    if (add_special)
        for (int i = 0; i < t->n_post_tmpl; i++) ivec_push(&out, t->post_tmpl[i]);
    free(e.w.id), free(e.w.next), free(e.w.prev), free(e.w.heap), free(e.cstart);
    free(e.mapped.s), free(e.norm.s), free(e.tmp.s);
    free(clean);
    if (!out.v) out.v = nb_malloc(sizeof(int32_t), "token ids");
    *ids_out = out.v;
    return out.n;
}

/* ---- decode ----------------------------------------------------------------------------- */

const char *nb_hf_tokenizer_token_bytes(const nb_hf_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_vocab || !t->out[id]) return *len = 0, NULL;
    *len = t->out_len[id];
    return t->out[id];
}

char *nb_hf_tokenizer_decode(const nb_hf_tokenizer *t, const int32_t *ids, size_t n, size_t *len_out) {
    sbuf b = {0};
    sb_add(&b, "", 0);
    for (size_t i = 0; i < n; i++) {
        size_t l;
        const char *p = nb_hf_tokenizer_token_bytes(t, ids[i], &l);
        NB_CHECK(p, "the ids come from another tokenizer", "cannot decode token %zu: id %d is not in the vocabulary (0..%d)",
                 i, (int)ids[i], t->n_vocab - 1);
        sb_add(&b, p, l);
    }
    size_t cut = 0;
    while ((int)cut < t->strip_start && cut < b.n && b.s[cut] == ' ') cut++;
    memmove(b.s, b.s + cut, b.n - cut + 1);
    *len_out = b.n - cut;
    return b.s;
}

/* ---- token offsets ---------------------------------------------------------------------- */

int nb_hf_tokenizer_offsets(const nb_hf_tokenizer *t, const char *text, size_t len, const int32_t *ids, size_t n,
                            size_t *off) {
    if (nb_tokenizer_count_invalid(text, len)) return -1;
    int prepend = 0;
    for (int k = 0; k < t->n_norm; k++) prepend |= t->norm[k].kind == HF_NORM_PREPEND;
    size_t p = 0;
    int section_start = 1;
    for (size_t i = 0; i < n; i++) {
        size_t ol;
        const char *o = nb_hf_tokenizer_token_bytes(t, ids[i], &ol);
        if (!o) return -1;
        off[i] = p;
        if (t->is_added[ids[i]]) {
            if (ol > len - p || memcmp(text + p, t->tok[ids[i]], ol)) return -1;
            p += ol, section_start = 1;
            continue;
        }
        /* the Prepend normalizer's U+2581 starts each section's first token, decoded as ' ' */
        if (section_start && prepend) {
            if (!ol || o[0] != ' ') return -1;
            o++, ol--;
        }
        section_start = 0;
        if (ol > len - p || memcmp(text + p, o, ol)) return -1;
        p += ol;
    }
    off[n] = p;
    return p == len ? 0 : -1;
}
