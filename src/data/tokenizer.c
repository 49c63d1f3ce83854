/* GPT-2 byte-level BPE, written to reproduce gpt-3-encoder@1.1.4's Encoder.js id for id.
 * See tokenizer.h for the reference's quirks that are kept on purpose. */
#include "data/tokenizer.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "datapath.h"

/* ------------------------------------------------------------------------------------------ */
/* Files and hashing                                                                           */

#define TOK_FILE_MAX ((size_t)64 << 20) /* GPT-2's files are 1.0 MB and 0.5 MB */

static char *read_whole_file(const char *path, size_t *len_out, const char *hint) {
    return nb_read_file(path, TOK_FILE_MAX, len_out, hint);
}

static uint64_t hash_bytes(const unsigned char *s, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a: words are short, this is fast enough */
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c *= 2;
    return c;
}

/* Open-addressing map from byte strings to two int32 values; keys are copied into an arena. */
typedef struct {
    uint64_t hash;
    uint32_t koff, klen;
    int32_t v0, v1;
    int used;
} strmap_slot;

typedef struct {
    strmap_slot *slots;
    size_t cap, n;
    unsigned char *keys;
    size_t klen, kcap;
} strmap;

static void strmap_init(strmap *m, size_t expect) {
    memset(m, 0, sizeof *m);
    m->cap = pow2_at_least(expect * 2);
    m->slots = nb_calloc(m->cap, sizeof(strmap_slot), "tokenizer hash map");
    m->kcap = 4096;
    m->keys = nb_malloc(m->kcap, "tokenizer hash map keys");
}

static void strmap_free(strmap *m) {
    free(m->slots);
    free(m->keys);
    memset(m, 0, sizeof *m);
}

static strmap_slot *strmap_probe(const strmap *m, const void *key, size_t len, uint64_t h) {
    size_t mask = m->cap - 1;
    for (size_t i = (size_t)h & mask;; i = (i + 1) & mask) {
        strmap_slot *s = &m->slots[i];
        if (!s->used) return s;
        if (s->hash == h && s->klen == len && memcmp(m->keys + s->koff, key, len) == 0) return s;
    }
}

static const strmap_slot *strmap_get(const strmap *m, const void *key, size_t len) {
    const strmap_slot *s = strmap_probe(m, key, len, hash_bytes(key, len));
    return s->used ? s : NULL;
}

static void strmap_grow(strmap *m) {
    strmap old = *m;
    m->cap *= 2;
    m->slots = nb_calloc(m->cap, sizeof(strmap_slot), "tokenizer hash map");
    for (size_t i = 0; i < old.cap; i++) {
        if (!old.slots[i].used) continue;
        strmap_slot *s = strmap_probe(m, old.keys + old.slots[i].koff, old.slots[i].klen,
                                      old.slots[i].hash);
        *s = old.slots[i];
    }
    free(old.slots);
}

/* Insert or overwrite. Returns 1 when the key was new. */
static int strmap_put(strmap *m, const void *key, size_t len, int32_t v0, int32_t v1) {
    if ((m->n + 1) * 2 > m->cap) strmap_grow(m);
    uint64_t h = hash_bytes(key, len);
    strmap_slot *s = strmap_probe(m, key, len, h);
    int fresh = !s->used;
    if (fresh) {
        NB_ASSERT(len < UINT32_MAX && m->klen + len < UINT32_MAX);
        while (m->klen + len > m->kcap) {
            m->kcap *= 2;
            m->keys = realloc(m->keys, m->kcap);
            NB_CHECK(m->keys, NULL, "out of host memory for the tokenizer's hash map");
        }
        memcpy(m->keys + m->klen, key, len);
        s->hash = h;
        s->koff = (uint32_t)m->klen;
        s->klen = (uint32_t)len;
        s->used = 1;
        m->klen += len;
        m->n++;
    }
    s->v0 = v0;
    s->v1 = v1;
    return fresh;
}

/* ------------------------------------------------------------------------------------------ */
/* The tokenizer                                                                               */

struct nb_tokenizer {
    int n_vocab;
    uint32_t *tok_off, *tok_len; /* id -> raw bytes in tok_bytes */
    unsigned char *tok_bytes;
    int32_t byte_token[256];     /* id of each single-byte token */
    /* (left id, right id) -> rank and merged id. Includes the pairs that merge only because
     * their ','-joined text equals a real merge's (see tokenizer.h). */
    uint64_t *pair_key; /* (a << 32 | b) + 1; 0 = empty */
    int32_t *pair_rank, *pair_merged;
    size_t pair_cap;
};

/* GPT-2's byte alphabet: printable Latin-1 bytes stand for themselves, the other 68 bytes are
 * shifted to U+0100.. in byte order, so every token is a printable string in the JSON. */
static void byte_alphabet(uint32_t byte_to_cp[256], int16_t cp_to_byte[0x144]) {
    int n = 0;
    for (int cp = 0; cp < 0x144; cp++) cp_to_byte[cp] = -1;
    for (int b = 0; b < 256; b++) {
        int keep = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        byte_to_cp[b] = keep ? (uint32_t)b : (uint32_t)(256 + n++);
        cp_to_byte[byte_to_cp[b]] = (int16_t)b;
    }
}

static uint64_t pair_hash(uint64_t key, size_t cap) {
    return (key * 0x9E3779B97F4A7C15ull >> 17) & (cap - 1);
}

static void pair_put(nb_tokenizer *t, int32_t a, int32_t b, int32_t rank, int32_t merged) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 1;
    size_t i = pair_hash(key, t->pair_cap);
    while (t->pair_key[i] && t->pair_key[i] != key) i = (i + 1) & (t->pair_cap - 1);
    t->pair_key[i] = key;
    t->pair_rank[i] = rank;
    t->pair_merged[i] = merged;
}

/* Rank of the pair (a, b), or INT32_MAX when it never merges. */
static inline int32_t pair_get(const nb_tokenizer *t, int32_t a, int32_t b, int32_t *merged) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 1;
    size_t i = pair_hash(key, t->pair_cap);
    for (;;) {
        if (t->pair_key[i] == key) {
            *merged = t->pair_merged[i];
            return t->pair_rank[i];
        }
        if (!t->pair_key[i]) return INT32_MAX;
        i = (i + 1) & (t->pair_cap - 1);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* UTF-8                                                                                       */

/* WHATWG decoder step. Returns the length of a well-formed sequence (and its code point), or
 * -k: the first k bytes are one ill-formed "maximal subpart" that becomes a single U+FFFD. */
static int utf8_step(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned b0 = s[0];
    if (b0 < 0x80) {
        *cp = b0;
        return 1;
    }
    int need;
    unsigned lo = 0x80, hi = 0xBF;
    if (b0 >= 0xC2 && b0 <= 0xDF) need = 1, *cp = b0 & 0x1F;
    else if (b0 >= 0xE0 && b0 <= 0xEF) {
        need = 2, *cp = b0 & 0x0F;
        if (b0 == 0xE0) lo = 0xA0; /* overlong */
        if (b0 == 0xED) hi = 0x9F; /* surrogates */
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
        need = 3, *cp = b0 & 0x07;
        if (b0 == 0xF0) lo = 0x90; /* overlong */
        if (b0 == 0xF4) hi = 0x8F; /* > U+10FFFF */
    } else
        return -1;
    size_t k = 1;
    for (int i = 0; i < need; i++, k++) {
        if (k >= n || s[k] < lo || s[k] > hi) return -(int)k;
        *cp = *cp << 6 | (s[k] & 0x3F);
        lo = 0x80, hi = 0xBF;
    }
    return (int)k;
}

size_t nb_tokenizer_count_invalid(const char *utf8, size_t len) {
    const unsigned char *s = (const unsigned char *)utf8;
    size_t bad = 0;
    uint32_t cp;
    for (size_t i = 0; i < len;) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        int k = utf8_step(s + i, len - i, &cp);
        if (k < 0) bad++;
        i += (size_t)(k < 0 ? -k : k);
    }
    return bad;
}

/* Copy of the text with each ill-formed subpart replaced by EF BF BD (what node hands to the
 * reference encoder), or NULL when the text is valid and can be used as it is. */
static unsigned char *utf8_sanitize(const unsigned char *s, size_t n, size_t *out_len) {
    if (nb_tokenizer_count_invalid((const char *)s, n) == 0) return NULL;
    unsigned char *out = nb_malloc(n * 3 + 1, "UTF-8 sanitized text"); /* 1 byte -> 3 at worst */
    size_t o = 0;
    uint32_t cp;
    for (size_t i = 0; i < n;) {
        int k = utf8_step(s + i, n - i, &cp);
        if (k > 0) {
            memcpy(out + o, s + i, (size_t)k);
            o += (size_t)k;
            i += (size_t)k;
        } else {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i += (size_t)-k;
        }
    }
    *out_len = o;
    return out;
}

char *nb_utf8_sanitize(const char *utf8, size_t len, size_t *out_len) {
    return (char *)utf8_sanitize((const unsigned char *)utf8, len, out_len);
}

/* Decode one code point of text already known to be valid UTF-8. */
static inline uint32_t utf8_valid_cp(const unsigned char *s, int *len) {
    unsigned b0 = s[0];
    if (b0 < 0x80) return *len = 1, b0;
    if (b0 < 0xE0) return *len = 2, (b0 & 0x1Fu) << 6 | (s[1] & 0x3Fu);
    if (b0 < 0xF0) return *len = 3, (b0 & 0x0Fu) << 12 | (s[1] & 0x3Fu) << 6 | (s[2] & 0x3Fu);
    return *len = 4,
           (b0 & 0x07u) << 18 | (s[1] & 0x3Fu) << 12 | (s[2] & 0x3Fu) << 6 | (s[3] & 0x3Fu);
}

/* ------------------------------------------------------------------------------------------ */
/* Character classes of the pre-tokenizer                                                      */

/* \p{L} and \p{N} exactly as the reference's regex engine (node) sees them: the table is generated
 * from node by scripts/gen_unicode_classes.js, and tests/tokenizer_test.sh re-checks all 1,112,064
 * scalar values against node. No Unicode library is needed at build or run time. */
static const struct { uint32_t lo, hi; char cls; } unicode_classes[] = {
#include "unicode_classes.inc"
};

/* JavaScript's \s: WhiteSpace + LineTerminator of ECMA-262, i.e. TAB..CR, SPACE, NBSP, ZWNBSP
 * (U+FEFF) and the Zs category. Not U+0085 (NEL) and not U+180E (no longer Zs). */
static int js_space(uint32_t cp) {
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
           cp == 0x205F || cp == 0x3000 || cp == 0xFEFF;
}

static char class_slow(uint32_t cp) {
    if (js_space(cp)) return 'W';
    size_t lo = 0, hi = sizeof unicode_classes / sizeof unicode_classes[0];
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < unicode_classes[mid].lo) hi = mid;
        else if (cp > unicode_classes[mid].hi) lo = mid + 1;
        else return unicode_classes[mid].cls;
    }
    return 'O';
}

/* ASCII classes, one row per 32 code points (checked against node by the exhaustive test). */
static const char ascii_class[129] = "OOOOOOOOOWWWWWOOOOOOOOOOOOOOOOOO"
                                     "WOOOOOOOOOOOOOOONNNNNNNNNNOOOOOO"
                                     "OLLLLLLLLLLLLLLLLLLLLLLLLLLOOOOO"
                                     "OLLLLLLLLLLLLLLLLLLLLLLLLLLOOOOO";

char nb_tokenizer_char_class(uint32_t cp) {
    if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 'O';
    return class_slow(cp);
}

static inline char class_at(const unsigned char *s, int *len) {
    if (s[0] < 0x80) return *len = 1, ascii_class[s[0]];
    return class_slow(utf8_valid_cp(s, len));
}

/* ------------------------------------------------------------------------------------------ */
/* Pre-tokenizer: end of the regex match that starts at p (text is valid UTF-8).               */

static size_t run_end(const unsigned char *s, size_t q, size_t n, char cls) {
    int l;
    while (q < n && class_at(s + q, &l) == cls) q += (size_t)l;
    return q;
}

static size_t pretoken_end(const unsigned char *s, size_t p, size_t n) {
    /* 's|'t|'re|'ve|'m|'ll|'d : case-sensitive, ASCII apostrophe only */
    if (s[p] == '\'' && p + 1 < n) {
        unsigned char c = s[p + 1];
        if (c == 's' || c == 't' || c == 'm' || c == 'd') return p + 2;
        if (p + 2 < n && ((c == 'r' && s[p + 2] == 'e') || (c == 'v' && s[p + 2] == 'e') ||
                          (c == 'l' && s[p + 2] == 'l')))
            return p + 3;
    }
    int l0, l1;
    char c0 = class_at(s + p, &l0);
    /* ' ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+' with the optional space (U+0020 only) */
    if (s[p] == ' ' && p + 1 < n) {
        char c1 = class_at(s + p + 1, &l1);
        if (c1 != 'W') return run_end(s, p + 1 + (size_t)l1, n, c1);
    }
    if (c0 != 'W') return run_end(s, p + (size_t)l0, n, c0);
    /* '\s+(?!\S)|\s+' : a whitespace run leaves its last character to the next token when a
     * non-space follows (so " word" keeps its space), unless the run is a single character. */
    size_t q = p + (size_t)l0, last = p;
    int count = 1, l;
    while (q < n && class_at(s + q, &l) == 'W') {
        last = q;
        q += (size_t)l;
        count++;
    }
    if (q == n || count == 1) return q;
    return last;
}

/* ------------------------------------------------------------------------------------------ */
/* BPE                                                                                         */

typedef struct {
    int32_t *v;
    size_t n, cap;
} ivec;

static void ivec_reserve(ivec *a, size_t extra) {
    if (a->n + extra <= a->cap) return;
    size_t cap = a->cap ? a->cap : 1024;
    while (cap < a->n + extra) cap *= 2;
    int32_t *v = realloc(a->v, cap * sizeof(int32_t));
    NB_CHECK(v, "the text may be too large for host memory", "out of host memory for %zu token ids",
             cap);
    a->v = v;
    a->cap = cap;
}

/* Merge the byte tokens of one pre-token the way Encoder.js's bpe() does: take the lowest-rank
 * pair (the last one on ties), merge all its occurrences left to right, repeat. syms is
 * rewritten in place; returns the final count. Each step scans the whole word, so a word of m
 * bytes costs O(m^2): the reference for short words (and for tests), bpe_word_heap for long. */
static size_t bpe_word_naive(const nb_tokenizer *t, int32_t *syms, size_t m) {
    while (m > 1) {
        int32_t best_rank = INT32_MAX, best_merged = -1, merged = -1;
        size_t best = 0;
        for (size_t i = 0; i + 1 < m; i++) {
            int32_t r = pair_get(t, syms[i], syms[i + 1], &merged);
            if (r != INT32_MAX && r <= best_rank) best_rank = r, best = i, best_merged = merged;
        }
        if (best_rank == INT32_MAX) break;
        int32_t a = syms[best], b = syms[best + 1];
        size_t j = 0;
        for (size_t i = 0; i < m;) {
            if (i + 1 < m && syms[i] == a && syms[i + 1] == b) {
                syms[j++] = best_merged;
                i += 2;
            } else
                syms[j++] = syms[i++];
        }
        m = j;
    }
    return m;
}

/* The same merges in O(m log m), for long words (a 1 MB run of letters took 79 s above).
 * Symbols form a linked list over their first byte's index (so index order is word order, and
 * a merge keeps the left node); a min-heap holds (rank, left index) of every adjacent pair that
 * has a rank, stale entries skipped when popped. One step pops every entry of the lowest rank r,
 * like the naive scan sees every pair of the word: the pair at the last such position is the one
 * merged (several distinct pairs share a rank only through the ','-join quirk); its occurrences
 * are merged in index order, each one checked again, which is the naive left-to-right greedy
 * scan (for a pair (a, a), "a a a" becomes "aa a"); the other pairs of rank r go back to the
 * heap. A merge forms at most two new pairs, both holding the new symbol, so none of them can be
 * the pair being merged: they wait for a later step, as in the naive loop. */
typedef struct {
    int32_t *sym, *prev, *next; /* sym -1: merged into its left neighbour */
    uint64_t *heap;             /* rank << 32 | left index */
    size_t nheap, cap;
    int32_t *hit;               /* this step's positions */
} bpe_state;

static void heap_push(bpe_state *b, uint64_t key) {
    if (b->nheap == b->cap) {
        b->cap = b->cap ? 2 * b->cap : 1024;
        b->heap = realloc(b->heap, b->cap * sizeof *b->heap);
        NB_CHECK(b->heap, "the text may be too large for host memory", "out of host memory for BPE");
    }
    size_t i = b->nheap++;
    while (i && b->heap[(i - 1) / 2] > key) {
        b->heap[i] = b->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    b->heap[i] = key;
}

static uint64_t heap_pop(bpe_state *b) {
    uint64_t top = b->heap[0], last = b->heap[--b->nheap];
    size_t i = 0, n = b->nheap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && b->heap[c + 1] < b->heap[c]) c++;
        if (b->heap[c] >= last) break;
        b->heap[i] = b->heap[c];
        i = c;
    }
    if (n) b->heap[i] = last;
    return top;
}

/* Rank of the pair starting at node i now (INT32_MAX: no pair there, or it never merges). */
static int32_t rank_at(const nb_tokenizer *t, const bpe_state *b, int32_t i, int32_t *merged) {
    if (i < 0 || b->sym[i] < 0 || b->next[i] < 0) return INT32_MAX;
    return pair_get(t, b->sym[i], b->sym[b->next[i]], merged);
}

static void push_pair(const nb_tokenizer *t, bpe_state *b, int32_t i) {
    int32_t merged, r = rank_at(t, b, i, &merged);
    if (r != INT32_MAX) heap_push(b, (uint64_t)(uint32_t)r << 32 | (uint32_t)i);
}

/* Pop every live entry of the lowest rank into b->hit, in index order (the heap's key order)
 * without repeats. Returns the count; 0 when nothing is left to merge. */
static size_t pop_lowest_rank(const nb_tokenizer *t, bpe_state *b) {
    size_t k = 0;
    int32_t r = INT32_MAX, merged;
    while (b->nheap && (k == 0 || (int32_t)(b->heap[0] >> 32) == r)) {
        uint64_t key = heap_pop(b);
        int32_t kr = (int32_t)(key >> 32), i = (int32_t)(uint32_t)key;
        if (rank_at(t, b, i, &merged) != kr) continue; /* stale: the pair there changed */
        if (k && b->hit[k - 1] == i) continue;        /* the same pair pushed twice */
        r = kr;
        b->hit[k++] = i;
    }
    return k;
}

static void merge_at(const nb_tokenizer *t, bpe_state *b, int32_t i, int32_t merged) {
    int32_t j = b->next[i];
    b->sym[i] = merged;
    b->sym[j] = -1;
    b->next[i] = b->next[j];
    if (b->next[j] >= 0) b->prev[b->next[j]] = i;
    push_pair(t, b, b->prev[i]);
    push_pair(t, b, i);
}

static size_t bpe_word_heap(const nb_tokenizer *t, int32_t *syms, size_t m) {
    NB_CHECK(m < INT32_MAX, "split the text: a run of over 2 GB without a space cannot be encoded",
             "a word of %zu bytes is too long for the tokenizer", m);
    bpe_state b = {0};
    b.sym = syms;
    b.prev = nb_malloc(m * sizeof(int32_t), "BPE links");
    b.next = nb_malloc(m * sizeof(int32_t), "BPE links");
    b.hit = nb_malloc(m * sizeof(int32_t), "BPE positions");
    for (size_t i = 0; i < m; i++) {
        b.prev[i] = (int32_t)i - 1;
        b.next[i] = i + 1 < m ? (int32_t)i + 1 : -1;
    }
    for (size_t i = 0; i + 1 < m; i++) push_pair(t, &b, (int32_t)i);
    size_t live = m, k;
    while (live > 1 && (k = pop_lowest_rank(t, &b)) > 0) {
        int32_t last = b.hit[k - 1], a = syms[last], c = syms[b.next[last]], merged;
        for (size_t h = 0; h < k; h++) {
            int32_t i = b.hit[h];
            if (rank_at(t, &b, i, &merged) == INT32_MAX) continue; /* taken by the merge before */
            if (syms[i] == a && syms[b.next[i]] == c) {
                merge_at(t, &b, i, merged);
                live--;
            } else {
                push_pair(t, &b, i); /* another pair of the same rank: a later step */
            }
        }
    }
    size_t n = 0;
    for (int32_t i = 0; i >= 0; i = b.next[i]) syms[n++] = syms[i]; /* node 0 is never merged away */
    free(b.prev);
    free(b.next);
    free(b.hit);
    free(b.heap);
    return n;
}

/* Below this many bytes the naive loop is faster (no allocation, a few cache lines). */
#define BPE_HEAP_MIN 256

static size_t bpe_word(const nb_tokenizer *t, int32_t *syms, size_t m, int naive) {
    return naive || m < BPE_HEAP_MIN ? bpe_word_naive(t, syms, m) : bpe_word_heap(t, syms, m);
}

/* Per-call memo of pre-token -> ids (Encoder.js keeps the same cache). Local to one call, so a
 * shared tokenizer needs no locks. */
typedef struct {
    strmap map; /* word -> (offset in ids, count) */
    ivec ids;
} word_cache;

/* Words longer than this are not memoized: they seldom repeat, and a copy of a megabyte-long
 * run of letters (key and ids) would only cost memory. */
#define CACHE_MAX_WORD 4096

static void encode_word(const nb_tokenizer *t, word_cache *wc, const unsigned char *w, size_t n,
                        ivec *out, ivec *scratch, int naive) {
    if (n == 1) {
        ivec_reserve(out, 1);
        out->v[out->n++] = t->byte_token[w[0]];
        return;
    }
    const strmap_slot *hit = n <= CACHE_MAX_WORD ? strmap_get(&wc->map, w, n) : NULL;
    if (!hit) {
        scratch->n = 0;
        ivec_reserve(scratch, n);
        for (size_t i = 0; i < n; i++) scratch->v[i] = t->byte_token[w[i]];
        size_t m = bpe_word(t, scratch->v, n, naive);
        if (n > CACHE_MAX_WORD) {
            ivec_reserve(out, m);
            memcpy(out->v + out->n, scratch->v, m * sizeof(int32_t));
            out->n += m;
            return;
        }
        ivec_reserve(&wc->ids, m);
        NB_ASSERT(wc->ids.n + m < INT32_MAX);
        memcpy(wc->ids.v + wc->ids.n, scratch->v, m * sizeof(int32_t));
        strmap_put(&wc->map, w, n, (int32_t)wc->ids.n, (int32_t)m);
        wc->ids.n += m;
        hit = strmap_get(&wc->map, w, n);
    }
    ivec_reserve(out, (size_t)hit->v1);
    memcpy(out->v + out->n, wc->ids.v + hit->v0, (size_t)hit->v1 * sizeof(int32_t));
    out->n += (size_t)hit->v1;
}

static size_t encode(const nb_tokenizer *t, const char *utf8, size_t len, int32_t **ids_out, int naive) {
    size_t clean_len = len;
    unsigned char *clean = utf8_sanitize((const unsigned char *)utf8, len, &clean_len);
    const unsigned char *s = clean ? clean : (const unsigned char *)utf8;
    ivec out = {0}, scratch = {0};
    ivec_reserve(&out, clean_len / 3 + 16); /* English runs at ~4.5 bytes per token */
    word_cache wc = {0};
    strmap_init(&wc.map, 4096);
    for (size_t p = 0; p < clean_len;) {
        size_t e = pretoken_end(s, p, clean_len);
        encode_word(t, &wc, s + p, e - p, &out, &scratch, naive);
        p = e;
    }
    strmap_free(&wc.map);
    free(wc.ids.v);
    free(scratch.v);
    free(clean);
    *ids_out = out.v;
    return out.n;
}

size_t nb_tokenizer_encode(const nb_tokenizer *t, const char *utf8, size_t len, int32_t **ids_out) {
    return encode(t, utf8, len, ids_out, 0);
}

size_t nb_tokenizer_encode_reference(const nb_tokenizer *t, const char *utf8, size_t len, int32_t **ids_out) {
    return encode(t, utf8, len, ids_out, 1);
}

const char *nb_tokenizer_token_bytes(const nb_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_vocab) {
        *len = 0;
        return NULL;
    }
    *len = t->tok_len[id];
    return (const char *)t->tok_bytes + t->tok_off[id];
}

char *nb_tokenizer_decode(const nb_tokenizer *t, const int32_t *ids, size_t n, size_t *len_out) {
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        NB_CHECK(ids[i] >= 0 && ids[i] < t->n_vocab,
                 "mask logits past the vocabulary before sampling, or check the token shard",
                 "cannot decode token id %d at position %zu: the GPT-2 vocabulary has ids 0..%d",
                 (int)ids[i], i, t->n_vocab - 1);
        total += t->tok_len[ids[i]];
    }
    char *text = nb_malloc(total + 1, "decoded text");
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        memcpy(text + o, t->tok_bytes + t->tok_off[ids[i]], t->tok_len[ids[i]]);
        o += t->tok_len[ids[i]];
    }
    text[o] = 0;
    if (len_out) *len_out = o;
    return text;
}

int nb_tokenizer_vocab_size(const nb_tokenizer *t) { return t->n_vocab; }

/* ------------------------------------------------------------------------------------------ */
/* Loading encoder.json                                                                        */

#define TOK_HINT "run scripts/fetch_data.sh tokenizer, or pass --tokenizer DIR with OpenAI's GPT-2 files"

typedef struct {
    const unsigned char *s;
    size_t n, i;
    const char *path;
    uint32_t byte_to_cp[256];
    int16_t cp_to_byte[0x144];
} json_in;

static NB_NORETURN void json_fail(const json_in *j, const char *what) {
    int line = 1, col = 1;
    for (size_t k = 0; k < j->i && k < j->n; k++) {
        if (j->s[k] == '\n') line++, col = 1;
        else col++;
    }
    nb_fail(TOK_HINT, "%s:%d:%d: %s", j->path, line, col, what);
}

static void json_ws(json_in *j) {
    while (j->i < j->n && (j->s[j->i] == ' ' || j->s[j->i] == '\t' || j->s[j->i] == '\n' ||
                           j->s[j->i] == '\r'))
        j->i++;
}

static unsigned json_hex4(json_in *j) {
    unsigned v = 0;
    for (int k = 0; k < 4; k++, j->i++) {
        if (j->i >= j->n) json_fail(j, "unterminated \\u escape");
        unsigned char c = j->s[j->i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) json_fail(j, "bad hex digit in a \\u escape");
        v = v << 4 | (unsigned)d;
    }
    return v;
}

/* One code point of a JSON string body, escapes resolved. */
static uint32_t json_char(json_in *j) {
    unsigned char c = j->s[j->i];
    if (c < 0x20) json_fail(j, "control character inside a string");
    if (c != '\\') {
        uint32_t cp;
        int k = utf8_step(j->s + j->i, j->n - j->i, &cp);
        if (k < 0) json_fail(j, "invalid UTF-8 inside a string");
        j->i += (size_t)k;
        return cp;
    }
    if (++j->i >= j->n) json_fail(j, "unterminated escape");
    c = j->s[j->i++];
    switch (c) {
    case '"': return '"';
    case '\\': return '\\';
    case '/': return '/';
    case 'b': return '\b';
    case 'f': return '\f';
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    case 'u': break;
    default: j->i--; json_fail(j, "unknown escape");
    }
    uint32_t cp = json_hex4(j);
    if (cp >= 0xD800 && cp <= 0xDBFF && j->i + 1 < j->n && j->s[j->i] == '\\' &&
        j->s[j->i + 1] == 'u') {
        j->i += 2;
        uint32_t lo = json_hex4(j);
        if (lo < 0xDC00 || lo > 0xDFFF) json_fail(j, "unpaired surrogate in a \\u escape");
        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
    } else if (cp >= 0xD800 && cp <= 0xDFFF)
        json_fail(j, "unpaired surrogate in a \\u escape");
    return cp;
}

/* A token string, mapped from GPT-2's byte alphabet back to raw bytes into buf. */
static size_t json_token(json_in *j, unsigned char *buf, size_t cap) {
    if (j->i >= j->n || j->s[j->i] != '"') json_fail(j, "expected a token string");
    j->i++;
    size_t n = 0;
    for (;;) {
        if (j->i >= j->n) json_fail(j, "unterminated string");
        if (j->s[j->i] == '"') break;
        size_t at = j->i;
        uint32_t cp = json_char(j);
        if (cp >= 0x144 || j->cp_to_byte[cp] < 0) {
            char msg[128];
            j->i = at;
            snprintf(msg, sizeof msg, "character U+%04X is not in GPT-2's byte alphabet",
                     (unsigned)cp);
            json_fail(j, msg);
        }
        if (n >= cap) json_fail(j, "token string too long");
        buf[n++] = (unsigned char)j->cp_to_byte[cp];
    }
    j->i++;
    return n;
}

static long json_id(json_in *j) {
    long v = 0;
    size_t start = j->i;
    while (j->i < j->n && j->s[j->i] >= '0' && j->s[j->i] <= '9') {
        v = v * 10 + (j->s[j->i++] - '0');
        if (v > 100000000) json_fail(j, "token id too large");
    }
    if (j->i == start) json_fail(j, "expected a non-negative integer token id");
    if (j->i < j->n && (j->s[j->i] == '.' || j->s[j->i] == 'e' || j->s[j->i] == 'E'))
        json_fail(j, "token id must be an integer");
    return v;
}

static void load_encoder(nb_tokenizer *t, strmap *vocab, const char *path) {
    json_in j = {0};
    size_t n;
    char *text = read_whole_file(path, &n, TOK_HINT);
    j.s = (const unsigned char *)text;
    j.n = n;
    j.path = path;
    byte_alphabet(j.byte_to_cp, j.cp_to_byte);

    int n_vocab = NB_GPT2_VOCAB;
    t->n_vocab = n_vocab;
    t->tok_off = nb_malloc(sizeof(uint32_t) * (size_t)n_vocab, "token offsets");
    t->tok_len = nb_malloc(sizeof(uint32_t) * (size_t)n_vocab, "token lengths");
    t->tok_bytes = nb_malloc(n + 1, "token bytes"); /* raw tokens are never longer than JSON */
    for (int i = 0; i < n_vocab; i++) t->tok_len[i] = UINT32_MAX;
    size_t used = 0, count = 0;
    unsigned char tok[1024];

    json_ws(&j);
    if (j.i >= j.n || j.s[j.i] != '{') json_fail(&j, "expected '{' (a JSON object of token: id)");
    j.i++;
    json_ws(&j);
    if (j.i < j.n && j.s[j.i] == '}') json_fail(&j, "the object is empty");
    for (;;) {
        json_ws(&j);
        size_t at = j.i;
        size_t len = json_token(&j, tok, sizeof tok);
        json_ws(&j);
        if (j.i >= j.n || j.s[j.i] != ':') json_fail(&j, "expected ':'");
        j.i++;
        json_ws(&j);
        long id = json_id(&j);
        if (id >= n_vocab) {
            char msg[128];
            snprintf(msg, sizeof msg, "token id %ld is outside 0..%d (GPT-2 has %d tokens)", id,
                     n_vocab - 1, n_vocab);
            json_fail(&j, msg);
        }
        if (t->tok_len[id] != UINT32_MAX) {
            char msg[64];
            snprintf(msg, sizeof msg, "token id %ld appears twice", id);
            json_fail(&j, msg);
        }
        if (!strmap_put(vocab, tok, len, (int32_t)id, 0)) {
            j.i = at;
            json_fail(&j, "the same token string appears twice");
        }
        memcpy(t->tok_bytes + used, tok, len);
        t->tok_off[id] = (uint32_t)used;
        t->tok_len[id] = (uint32_t)len;
        used += len;
        count++;
        json_ws(&j);
        if (j.i < j.n && j.s[j.i] == ',') {
            j.i++;
            continue;
        }
        if (j.i < j.n && j.s[j.i] == '}') break;
        json_fail(&j, "expected ',' or '}'");
    }
    j.i++;
    json_ws(&j);
    if (j.i != j.n) json_fail(&j, "unexpected text after the closing '}'");
    NB_CHECK(count == (size_t)n_vocab, TOK_HINT,
             "%s: has %zu tokens, GPT-2's encoder.json has %d", path, count, n_vocab);
    NB_CHECK(t->tok_len[NB_GPT2_EOT] == 13 &&
                 !memcmp(t->tok_bytes + t->tok_off[NB_GPT2_EOT], "<|endoftext|>", 13),
             TOK_HINT, "%s: token %d is not <|endoftext|>", path, NB_GPT2_EOT);
    for (int b = 0; b < 256; b++) {
        unsigned char c = (unsigned char)b;
        const strmap_slot *s = strmap_get(vocab, &c, 1);
        NB_CHECK(s, TOK_HINT, "%s: byte 0x%02X has no token (byte-level BPE needs all 256)", path,
                 b);
        t->byte_token[b] = s->v0;
    }
    free(text);
}

/* ------------------------------------------------------------------------------------------ */
/* Loading vocab.bpe                                                                           */

/* One merge half: GPT-2 byte-alphabet text -> raw bytes. Returns the length or -1. */
static int merge_part(const unsigned char *s, size_t n, const int16_t *cp_to_byte,
                      unsigned char *out, size_t cap) {
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int k = utf8_step(s + i, n - i, &cp);
        if (k < 0 || cp >= 0x144 || cp_to_byte[cp] < 0 || o >= cap) return -1;
        out[o++] = (unsigned char)cp_to_byte[cp];
        i += (size_t)k;
    }
    return (int)o;
}

static int is_ascii_space(unsigned char c) {
    return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f';
}

/* Reads the merges into ranks: "a,b" -> rank, a later merge overwriting an equal key, as the
 * reference's object keyed by String([a, b]) does. */
static void load_merges(const strmap *vocab, strmap *ranks, const char *path) {
    size_t n;
    char *text = read_whole_file(path, &n, TOK_HINT);
    const unsigned char *s = (const unsigned char *)text;
    NB_CHECK(n >= 8 && !memcmp(s, "#version", 8), TOK_HINT,
             "%s:1: expected a '#version: 0.2' line, found something else", path);
    int16_t cp_to_byte[0x144];
    uint32_t byte_to_cp[256];
    byte_alphabet(byte_to_cp, cp_to_byte);
    /* Like the reference (lines[1 .. len-1)): the text after the last newline is not a merge. */
    const unsigned char *first_nl = memchr(s, '\n', n);
    NB_CHECK(first_nl, TOK_HINT, "%s: has no merge lines", path);
    size_t p = (size_t)(first_nl - s) + 1;
    int32_t rank = 0;
    int line = 1;
    while (p < n) {
        const unsigned char *nl = memchr(s + p, '\n', n - p);
        if (!nl) break;
        size_t e = (size_t)(nl - s);
        line++;
        size_t pos[4], end[4];
        int parts = 0;
        for (size_t i = p; i < e;) {
            while (i < e && is_ascii_space(s[i])) i++;
            if (i >= e) break;
            size_t st = i;
            while (i < e && !is_ascii_space(s[i])) i++;
            if (parts < 4) pos[parts] = st, end[parts] = i;
            parts++;
        }
        NB_CHECK(parts == 2, TOK_HINT, "%s:%d: expected two tokens separated by a space, found %d",
                 path, line, parts);
        unsigned char key[2048];
        int la = merge_part(s + pos[0], end[0] - pos[0], cp_to_byte, key, 1000);
        int lb = la < 0 ? -1 : merge_part(s + pos[1], end[1] - pos[1], cp_to_byte, key + la + 1, 1000);
        NB_CHECK(la > 0 && lb > 0, TOK_HINT,
                 "%s:%d: a merge has a character outside GPT-2's byte alphabet", path, line);
        NB_CHECK(strmap_get(vocab, key, (size_t)la) && strmap_get(vocab, key + la + 1, (size_t)lb),
                 TOK_HINT, "%s:%d: a merge half is not a token of encoder.json", path, line);
        memmove(key + la, key + la + 1, (size_t)lb);
        NB_CHECK(strmap_get(vocab, key, (size_t)(la + lb)), TOK_HINT,
                 "%s:%d: the merged token is not in encoder.json", path, line);
        memmove(key + la + 1, key + la, (size_t)lb);
        key[la] = ',';
        strmap_put(ranks, key, (size_t)(la + 1 + lb), rank++, 0);
        p = e + 1;
    }
    NB_CHECK(rank == NB_GPT2_MERGES, TOK_HINT,
             "%s: has %d merge lines, GPT-2's vocab.bpe has %d (one per line, ending in a newline)",
             path, (int)rank, NB_GPT2_MERGES);
    free(text);
}

/* Every split of every "a,b" key at a ',' whose halves are tokens becomes a pair with that rank:
 * this is the whole effect of the reference's comma-joined lookup on words made of tokens. With
 * GPT-2's files it adds 11 pairs such as ('",', '"'); a search over ~1M punctuation strings found
 * none that changes ids (the real merge of their last two bytes always comes first), but keeping
 * the rule means exactness does not rest on that search. */
static void build_pairs(nb_tokenizer *t, const strmap *vocab, const strmap *ranks,
                        const char *path) {
    t->pair_cap = pow2_at_least((size_t)ranks->n * 4);
    t->pair_key = nb_calloc(t->pair_cap, sizeof(uint64_t), "BPE pair table");
    t->pair_rank = nb_malloc(t->pair_cap * sizeof(int32_t), "BPE pair table");
    t->pair_merged = nb_malloc(t->pair_cap * sizeof(int32_t), "BPE pair table");
    size_t npairs = 0;
    for (size_t i = 0; i < ranks->cap; i++) {
        const strmap_slot *r = &ranks->slots[i];
        if (!r->used) continue;
        const unsigned char *k = ranks->keys + r->koff;
        for (uint32_t c = 1; c + 1 < r->klen; c++) {
            if (k[c] != ',') continue;
            const strmap_slot *a = strmap_get(vocab, k, c);
            const strmap_slot *b = strmap_get(vocab, k + c + 1, r->klen - c - 1);
            if (!a || !b) continue;
            unsigned char joined[2048];
            memcpy(joined, k, c);
            memcpy(joined + c, k + c + 1, r->klen - c - 1);
            const strmap_slot *m = strmap_get(vocab, joined, r->klen - 1);
            NB_CHECK(m, TOK_HINT,
                     "%s: merge %d, split at another ',', joins two tokens into a non-token",
                     path, (int)r->v0);
            NB_CHECK(++npairs * 2 <= t->pair_cap, TOK_HINT, "%s: too many comma splits", path);
            pair_put(t, a->v0, b->v0, r->v0, m->v0);
        }
    }
}

nb_tokenizer *nb_tokenizer_load(const char *given) {
    /* the default data/gpt2 is found from any working directory (core/datapath.h) */
    char dir[NB_PATH_MAX], looked[2048];
    if (!nb_data_path(given, dir, sizeof dir, looked, sizeof looked) && !strncmp(given, "data/", 5))
        nb_fail("run 'bash scripts/fetch_data.sh tokenizer', set NB_DATA_DIR to a data folder, or pass --tokenizer DIR",
                "tokenizer folder '%s' not found; looked at %s", given, looked);
    nb_tokenizer *t = nb_calloc(1, sizeof *t, "tokenizer");
    char path[4096];
    strmap vocab, ranks;
    strmap_init(&vocab, NB_GPT2_VOCAB);
    strmap_init(&ranks, NB_GPT2_MERGES);
    NB_CHECK(snprintf(path, sizeof path, "%s/encoder.json", dir) < (int)sizeof path,
             "use a shorter path", "tokenizer directory path too long: '%s'", dir);
    load_encoder(t, &vocab, path);
    snprintf(path, sizeof path, "%s/vocab.bpe", dir);
    load_merges(&vocab, &ranks, path);
    build_pairs(t, &vocab, &ranks, path);
    strmap_free(&vocab);
    strmap_free(&ranks);
    return t;
}

void nb_tokenizer_free(nb_tokenizer *t) {
    if (!t) return;
    free(t->tok_off);
    free(t->tok_len);
    free(t->tok_bytes);
    free(t->pair_key);
    free(t->pair_rank);
    free(t->pair_merged);
    free(t);
}
