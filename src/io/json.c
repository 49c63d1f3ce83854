#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "io/json.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ string buffer */

static void sbuf_reserve(nb_sbuf *b, size_t extra) {
    if (b->len + extra + 1 <= b->cap) return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra + 1) {
        NB_CHECK(cap <= SIZE_MAX / 2, NULL, "text buffer too large (%zu bytes)", b->len);
        cap *= 2;
    }
    char *p = realloc(b->data, cap);
    if (!p) nb_fail("free some host memory", "out of memory growing a text buffer to %zu bytes", cap);
    b->data = p;
    b->cap = cap;
}

void nb_sbuf_append(nb_sbuf *b, const char *s, size_t n) {
    sbuf_reserve(b, n);
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
}

void nb_sbuf_puts(nb_sbuf *b, const char *s) { nb_sbuf_append(b, s, strlen(s)); }

void nb_sbuf_printf(nb_sbuf *b, const char *fmt, ...) {
    char small[256]; /* most pieces (numbers, short elements) fit: one format pass */
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    NB_ASSERT(n >= 0);
    if ((size_t)n < sizeof small) {
        nb_sbuf_append(b, small, (size_t)n);
    } else {
        sbuf_reserve(b, (size_t)n);
        vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap2);
        b->len += (size_t)n;
    }
    va_end(ap2);
}

void nb_sbuf_free(nb_sbuf *b) {
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

int nb_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp) {
    if (n == 0) return 0;
    unsigned c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    int len;
    uint32_t v, min;
    if ((c & 0xE0) == 0xC0) len = 2, v = c & 0x1F, min = 0x80;
    else if ((c & 0xF0) == 0xE0) len = 3, v = c & 0x0F, min = 0x800;
    else if ((c & 0xF8) == 0xF0) len = 4, v = c & 0x07, min = 0x10000;
    else return 0;
    if ((size_t)len > n) return 0;
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        v = (v << 6) | (s[i] & 0x3F);
    }
    /* Overlong forms and surrogates are invalid UTF-8 (RFC 3629). */
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
    *cp = v;
    return len;
}

/* ------------------------------------------------------------------ writer */

void nb_json_writer_init(nb_json_writer *w, int indent) {
    memset(w, 0, sizeof *w);
    w->indent = indent;
    nb_sbuf_append(&w->out, "", 0);
}

void nb_json_writer_free(nb_json_writer *w) { nb_sbuf_free(&w->out); }
const char *nb_json_text(const nb_json_writer *w) { return w->out.data; }
size_t nb_json_len(const nb_json_writer *w) { return w->out.len; }

static void newline(nb_json_writer *w) {
    if (!w->indent) return;
    nb_sbuf_append(&w->out, "\n", 1);
    for (int i = 0; i < w->depth * w->indent; i++) nb_sbuf_append(&w->out, " ", 1);
}

/* Separator and indentation before a value (or a key, inside an object). */
static void before_item(nb_json_writer *w, int is_key) {
    if (w->depth == 0) {
        NB_ASSERT(w->out.len == 0); /* one top-level value per writer */
        return;
    }
    int obj = w->is_obj[w->depth - 1];
    if (obj && !is_key) {
        NB_ASSERT(w->after_key); /* an object member needs nb_json_key first */
        w->after_key = 0;
        return;
    }
    NB_ASSERT(!w->after_key);
    if (w->count[w->depth - 1]) nb_sbuf_append(&w->out, ",", 1);
    w->count[w->depth - 1] = 1;
    newline(w);
}

static void begin(nb_json_writer *w, int obj) {
    before_item(w, 0);
    NB_ASSERT(w->depth < NB_JSON_MAX_DEPTH);
    nb_sbuf_append(&w->out, obj ? "{" : "[", 1);
    w->is_obj[w->depth] = (unsigned char)obj;
    w->count[w->depth] = 0;
    w->depth++;
}

static void end(nb_json_writer *w, int obj) {
    NB_ASSERT(w->depth > 0 && w->is_obj[w->depth - 1] == obj && !w->after_key);
    int had_items = w->count[w->depth - 1];
    w->depth--;
    if (had_items) newline(w);
    nb_sbuf_append(&w->out, obj ? "}" : "]", 1);
}

void nb_json_begin_obj(nb_json_writer *w) { begin(w, 1); }
void nb_json_end_obj(nb_json_writer *w) { end(w, 1); }
void nb_json_begin_arr(nb_json_writer *w) { begin(w, 0); }
void nb_json_end_arr(nb_json_writer *w) { end(w, 0); }

static void put_escaped(nb_sbuf *b, const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    nb_sbuf_append(b, "\"", 1);
    size_t i = 0;
    while (i < n) {
        unsigned c = u[i];
        if (c >= 0x20 && c < 0x80 && c != '"' && c != '\\') {
            size_t j = i; /* copy runs of plain ASCII in one go */
            while (j < n && u[j] >= 0x20 && u[j] < 0x80 && u[j] != '"' && u[j] != '\\') j++;
            nb_sbuf_append(b, s + i, j - i);
            i = j;
        } else if (c == '"' || c == '\\') {
            nb_sbuf_append(b, c == '"' ? "\\\"" : "\\\\", 2);
            i++;
        } else if (c < 0x20) {
            const char *short_esc = c == '\n' ? "\\n" : c == '\t' ? "\\t" : c == '\r' ? "\\r"
                                  : c == '\b' ? "\\b" : c == '\f' ? "\\f" : NULL;
            if (short_esc) nb_sbuf_append(b, short_esc, 2);
            else nb_sbuf_printf(b, "\\u%04x", c);
            i++;
        } else {
            uint32_t cp;
            int k = nb_utf8_decode(u + i, n - i, &cp);
            if (k) {
                nb_sbuf_append(b, s + i, (size_t)k);
                i += (size_t)k;
            } else {
                /* Keep the output valid JSON whatever bytes the caller passed. */
                nb_sbuf_append(b, "\\ufffd", 6);
                i++;
            }
        }
    }
    nb_sbuf_append(b, "\"", 1);
}

void nb_json_key(nb_json_writer *w, const char *key) {
    NB_ASSERT(w->depth > 0 && w->is_obj[w->depth - 1]);
    before_item(w, 1);
    put_escaped(&w->out, key, strlen(key));
    nb_sbuf_append(&w->out, w->indent ? ": " : ":", w->indent ? 2 : 1);
    w->after_key = 1;
}

void nb_json_strn(nb_json_writer *w, const char *s, size_t n) {
    before_item(w, 0);
    put_escaped(&w->out, s, n);
}
void nb_json_str(nb_json_writer *w, const char *s) {
    if (!s) {
        nb_json_null(w);
        return;
    }
    nb_json_strn(w, s, strlen(s));
}

void nb_json_num(nb_json_writer *w, double v) {
    before_item(w, 0);
    if (!isfinite(v)) nb_sbuf_append(&w->out, "null", 4);
    else nb_sbuf_printf(&w->out, "%.9g", v);
}

void nb_json_double(nb_json_writer *w, double v) {
    before_item(w, 0);
    if (!isfinite(v)) {
        nb_sbuf_append(&w->out, "null", 4);
        return;
    }
    char buf[40];
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, v);
        if (strtod(buf, NULL) == v) break; /* 17 digits always round-trip */
    }
    nb_sbuf_puts(&w->out, buf);
}

void nb_json_int(nb_json_writer *w, int64_t v) {
    before_item(w, 0);
    nb_sbuf_printf(&w->out, "%" PRId64, v);
}
void nb_json_uint(nb_json_writer *w, uint64_t v) {
    before_item(w, 0);
    nb_sbuf_printf(&w->out, "%" PRIu64, v);
}
void nb_json_bool(nb_json_writer *w, int v) {
    before_item(w, 0);
    nb_sbuf_puts(&w->out, v ? "true" : "false");
}
void nb_json_null(nb_json_writer *w) {
    before_item(w, 0);
    nb_sbuf_append(&w->out, "null", 4);
}

void nb_json_kstr(nb_json_writer *w, const char *k, const char *s) { nb_json_key(w, k); nb_json_str(w, s); }
void nb_json_knum(nb_json_writer *w, const char *k, double v) { nb_json_key(w, k); nb_json_num(w, v); }
void nb_json_kdouble(nb_json_writer *w, const char *k, double v) { nb_json_key(w, k); nb_json_double(w, v); }
void nb_json_kint(nb_json_writer *w, const char *k, int64_t v) { nb_json_key(w, k); nb_json_int(w, v); }
void nb_json_kbool(nb_json_writer *w, const char *k, int v) { nb_json_key(w, k); nb_json_bool(w, v); }

/* ------------------------------------------------------------------ parser */

typedef struct {
    const char *s;
    size_t n, pos;
    int line;
    size_t line_start;
    const char *src;
    char *err;
    size_t errcap;
    int failed;
    size_t values; /* parsed so far, against NB_JSON_MAX_VALUES */
} parser;

/* The root owns the source name that every node points at. */
typedef struct {
    nb_json v;
    char *src;
} json_root;

static int perr_at(parser *p, size_t pos, const char *fmt, ...) NB_PRINTF(3, 4);
static int perr_vlc(parser *p, int line, int col, const char *fmt, va_list ap) {
    if (p->failed) return 0;
    p->failed = 1;
    char msg[320];
    vsnprintf(msg, sizeof msg, fmt, ap);
    if (p->err && p->errcap) snprintf(p->err, p->errcap, "%s:%d:%d: %s", p->src, line, col, msg);
    return 0;
}

static int perr_at(parser *p, size_t pos, const char *fmt, ...) {
    /* Positions on the current line only: errors are raised before the next newline is read. */
    va_list ap;
    va_start(ap, fmt);
    perr_vlc(p, p->line, (int)(pos - p->line_start) + 1, fmt, ap);
    va_end(ap);
    return 0;
}

/* An error at a value parsed earlier (its line and column are stored in it). */
static int perr_value(parser *p, const nb_json *v, const char *fmt, ...) NB_PRINTF(3, 4);
static int perr_value(parser *p, const nb_json *v, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    perr_vlc(p, v->line, v->col, fmt, ap);
    va_end(ap);
    return 0;
}

static void skip_ws(parser *p) {
    while (p->pos < p->n) {
        char c = p->s[p->pos];
        if (c == '\n') {
            p->line++;
            p->line_start = p->pos + 1;
        } else if (c != ' ' && c != '\t' && c != '\r') {
            return;
        }
        p->pos++;
    }
}

static int match_word(parser *p, const char *w) {
    size_t k = strlen(w);
    if (p->n - p->pos < k || memcmp(p->s + p->pos, w, k) != 0) return 0;
    p->pos += k;
    return 1;
}

static const char *describe_char(const parser *p, char *buf, size_t cap) {
    if (p->pos >= p->n) return "end of input";
    unsigned char c = (unsigned char)p->s[p->pos];
    if (c >= 0x20 && c < 0x7f) snprintf(buf, cap, "'%c'", c);
    else snprintf(buf, cap, "byte 0x%02x", c);
    return buf;
}

static int hex4(const char *s, uint32_t *out) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return 0;
        v = v * 16 + (uint32_t)d;
    }
    *out = v;
    return 1;
}

static size_t put_utf8(char *o, uint32_t cp) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Decode one \uXXXX escape (pos at the 'u'), pairing surrogates. */
static int parse_u_escape(parser *p, uint32_t *cp) {
    size_t at = p->pos - 1;
    uint32_t hi;
    if (p->n - p->pos < 5 || !hex4(p->s + p->pos + 1, &hi))
        return perr_at(p, at, "invalid \\u escape: expected 4 hex digits");
    p->pos += 5;
    if (hi >= 0xDC00 && hi <= 0xDFFF) return perr_at(p, at, "invalid \\u escape: lone low surrogate");
    if (hi < 0xD800 || hi > 0xDBFF) {
        *cp = hi;
        return 1;
    }
    uint32_t lo;
    if (p->n - p->pos < 6 || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u' ||
        !hex4(p->s + p->pos + 2, &lo) || lo < 0xDC00 || lo > 0xDFFF)
        return perr_at(p, at, "invalid \\u escape: high surrogate not followed by a low surrogate");
    p->pos += 6;
    *cp = 0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00);
    return 1;
}

/* pos at the opening quote. Escapes never expand, so the raw length bounds the output. */
static int parse_string(parser *p, char **out, size_t *out_len) {
    size_t start = p->pos++;
    size_t end = p->pos;
    while (end < p->n && p->s[end] != '"') end += p->s[end] == '\\' ? 2 : 1;
    if (end >= p->n) return perr_at(p, start, "unterminated string");
    char *o = nb_malloc(end - p->pos + 1, "JSON string");
    size_t k = 0;
    while (p->pos < end) {
        unsigned char c = (unsigned char)p->s[p->pos];
        if (c < 0x20) {
            free(o);
            return perr_at(p, p->pos, "control character 0x%02x inside a string (escape it)", c);
        }
        if (c == '\\') {
            char e = p->s[p->pos + 1];
            const char *from = "\"\\/bfnrt", *to = "\"\\/\b\f\n\r\t";
            const char *hit = e ? strchr(from, e) : NULL;
            if (hit) {
                o[k++] = to[hit - from];
                p->pos += 2;
            } else if (e == 'u') {
                uint32_t cp = 0;
                p->pos++;
                if (!parse_u_escape(p, &cp)) {
                    free(o);
                    return 0;
                }
                k += put_utf8(o + k, cp);
            } else {
                free(o);
                return perr_at(p, p->pos, "invalid escape '\\%c' in a string", e);
            }
        } else if (c < 0x80) {
            o[k++] = (char)c;
            p->pos++;
        } else {
            uint32_t cp;
            int len = nb_utf8_decode((const unsigned char *)p->s + p->pos, end - p->pos, &cp);
            if (!len) {
                free(o);
                return perr_at(p, p->pos, "invalid UTF-8 byte 0x%02x in a string", c);
            }
            memcpy(o + k, p->s + p->pos, (size_t)len);
            k += (size_t)len;
            p->pos += (size_t)len;
        }
    }
    p->pos = end + 1;
    o[k] = '\0';
    *out = o;
    *out_len = k;
    return 1;
}

static size_t scan_digits(parser *p) {
    size_t k = 0;
    while (p->pos < p->n && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') p->pos++, k++;
    return k;
}

static int parse_number(parser *p, nb_json *v) {
    size_t start = p->pos;
    int integral_literal = 1;
    if (p->pos < p->n && p->s[p->pos] == '-') p->pos++;
    if (match_word(p, "Infinity")) {
        v->num = p->s[start] == '-' ? -INFINITY : INFINITY;
        return 1;
    }
    if (p->pos < p->n && p->s[p->pos] == '0') p->pos++;
    else if (!scan_digits(p)) return perr_at(p, start, "invalid number: expected a digit");
    if (p->pos < p->n && p->s[p->pos] == '.') {
        p->pos++;
        integral_literal = 0;
        if (!scan_digits(p)) return perr_at(p, p->pos, "invalid number: expected a digit after '.'");
    }
    if (p->pos < p->n && (p->s[p->pos] == 'e' || p->s[p->pos] == 'E')) {
        p->pos++;
        integral_literal = 0;
        if (p->pos < p->n && (p->s[p->pos] == '+' || p->s[p->pos] == '-')) p->pos++;
        if (!scan_digits(p)) return perr_at(p, p->pos, "invalid number: expected exponent digits");
    }
    /* strtod needs a NUL-terminated copy; the input need not be terminated. */
    size_t len = p->pos - start;
    char small[64], *buf = len < sizeof small ? small : nb_malloc(len + 1, "JSON number");
    memcpy(buf, p->s + start, len);
    buf[len] = '\0';
    errno = 0;
    v->num = strtod(buf, NULL);
    int overflow = errno == ERANGE && isinf(v->num);
    if (integral_literal) {
        errno = 0;
        long long ll = strtoll(buf, NULL, 10);
        if (errno == 0) v->is_int = 1, v->i64 = ll, v->int_literal = 1;
        errno = 0;
        unsigned long long ull = buf[0] == '-' ? 0 : strtoull(buf, NULL, 10);
        if (buf[0] != '-' && errno == 0) v->is_u64 = 1, v->u64 = ull;
    }
    if (buf != small) free(buf);
    if (overflow) return perr_at(p, start, "number out of range");
    if (!v->is_int && v->num == floor(v->num) && v->num >= -9223372036854775808.0 &&
        v->num < 9223372036854775808.0)
        v->is_int = 1, v->i64 = (int64_t)v->num;
    if (!v->is_u64 && v->num == floor(v->num) && v->num >= 0 && v->num < 18446744073709551616.0)
        v->is_u64 = 1, v->u64 = (uint64_t)v->num;
    return 1;
}

static int parse_value(parser *p, nb_json *v, int depth);

static void grow(nb_json *v, size_t *cap, int obj) {
    if (v->len < *cap) return;
    *cap = *cap ? *cap * 2 : 4;
    nb_json *items = realloc(v->items, *cap * sizeof *items);
    if (!items) nb_fail("free some host memory", "out of memory parsing JSON");
    v->items = items;
    if (obj) {
        char **keys = realloc(v->keys, *cap * sizeof *keys);
        if (!keys) nb_fail("free some host memory", "out of memory parsing JSON");
        v->keys = keys;
    }
}

typedef struct {
    const char *key;
    size_t i;
} key_index;

static int cmp_key_index(const void *a, const void *b) {
    const key_index *x = a, *y = b;
    int c = strcmp(x->key, y->key);
    return c ? c : (x->i > y->i) - (x->i < y->i);
}

static int report_dup(parser *p, const nb_json *v, size_t first, size_t later) {
    return perr_value(p, &v->items[later], "duplicate key '%.200s' (first at line %d, column %d)", v->keys[later],
                      v->items[first].line, v->items[first].col);
}

/* Keys compare as C strings, the way nb_json_get looks them up: "a\u0000b" and "a\u0000c" are
 * one key to every reader, so they are duplicates here too. Sorting keeps a safetensors header
 * of 100,000 tensors fast; small objects compare pairwise. The error points at the later
 * member's value (keys keep no position). */
static int unique_keys(parser *p, const nb_json *v) {
    if (v->len <= 16) {
        for (size_t j = 1; j < v->len; j++)
            for (size_t i = 0; i < j; i++)
                if (!strcmp(v->keys[i], v->keys[j])) return report_dup(p, v, i, j);
        return 1;
    }
    key_index *idx = nb_malloc(v->len * sizeof *idx, "JSON key index");
    for (size_t i = 0; i < v->len; i++) idx[i] = (key_index){v->keys[i], i};
    qsort(idx, v->len, sizeof *idx, cmp_key_index);
    size_t first = 0, later = 0;
    for (size_t i = 1; i < v->len && !later; i++)
        if (!strcmp(idx[i - 1].key, idx[i].key)) first = idx[i - 1].i, later = idx[i].i;
    free(idx);
    return later ? report_dup(p, v, first, later) : 1;
}

/* Containers keep len equal to the number of fully initialized children, so a partial tree
 * can always be freed. */
static int parse_container(parser *p, nb_json *v, int depth, int obj) {
    char close = obj ? '}' : ']';
    size_t cap = 0;
    p->pos++;
    skip_ws(p);
    if (p->pos < p->n && p->s[p->pos] == close) {
        p->pos++;
        return 1;
    }
    for (;;) {
        char d[16];
        grow(v, &cap, obj);
        char *key = NULL;
        if (obj) {
            size_t klen;
            if (p->pos >= p->n || p->s[p->pos] != '"')
                return perr_at(p, p->pos, "expected a string key, found %s", describe_char(p, d, sizeof d));
            if (!parse_string(p, &key, &klen)) return 0;
            skip_ws(p);
            if (p->pos >= p->n || p->s[p->pos] != ':') {
                free(key);
                return perr_at(p, p->pos, "expected ':' after key, found %s", describe_char(p, d, sizeof d));
            }
            p->pos++;
            skip_ws(p);
            v->keys[v->len] = key;
        }
        nb_json *child = &v->items[v->len];
        memset(child, 0, sizeof *child);
        v->len++;
        if (!parse_value(p, child, depth + 1)) return 0;
        skip_ws(p);
        if (p->pos < p->n && p->s[p->pos] == ',') {
            p->pos++;
            skip_ws(p);
            continue;
        }
        if (p->pos < p->n && p->s[p->pos] == close) {
            p->pos++;
            return !obj || unique_keys(p, v);
        }
        return perr_at(p, p->pos, "expected ',' or '%c', found %s", close, describe_char(p, d, sizeof d));
    }
}

static int parse_value(parser *p, nb_json *v, int depth) {
    char d[16];
    v->line = p->line;
    v->col = (int)(p->pos - p->line_start) + 1;
    v->src = p->src;
    if (depth >= NB_JSON_MAX_NESTING) return perr_at(p, p->pos, "nesting deeper than %d levels", NB_JSON_MAX_NESTING);
    if (++p->values > NB_JSON_MAX_VALUES)
        return perr_at(p, p->pos, "more than %zu values in one document", NB_JSON_MAX_VALUES);
    if (p->pos >= p->n) return perr_at(p, p->pos, "expected a value, found end of input");
    char c = p->s[p->pos];
    switch (c) {
    case '{':
        v->type = NB_JSON_OBJ;
        return parse_container(p, v, depth, 1);
    case '[':
        v->type = NB_JSON_ARR;
        return parse_container(p, v, depth, 0);
    case '"':
        v->type = NB_JSON_STR;
        return parse_string(p, &v->str, &v->len);
    default:
        break;
    }
    if (match_word(p, "true") || match_word(p, "false")) {
        v->type = NB_JSON_BOOL;
        v->boolean = c == 't';
        return 1;
    }
    if (match_word(p, "null")) {
        v->type = NB_JSON_NULL;
        return 1;
    }
    v->type = NB_JSON_NUM;
    if (match_word(p, "NaN")) {
        v->num = NAN;
        return 1;
    }
    if (c == '-' || (c >= '0' && c <= '9') || c == 'I') {
        if (c == 'I') return match_word(p, "Infinity") ? (v->num = INFINITY, 1)
                                                     : perr_at(p, p->pos, "expected a value, found 'I'");
        return parse_number(p, v);
    }
    return perr_at(p, p->pos, "expected a value, found %s", describe_char(p, d, sizeof d));
}

static void free_children(nb_json *v) {
    if (v->type == NB_JSON_STR) free(v->str);
    if (v->type == NB_JSON_ARR || v->type == NB_JSON_OBJ) {
        for (size_t i = 0; i < v->len; i++) {
            free_children(&v->items[i]);
            if (v->keys) free(v->keys[i]);
        }
        free(v->items);
        free(v->keys);
    }
}

void nb_json_free(nb_json *root) {
    if (!root) return;
    json_root *r = (json_root *)root;
    free_children(&r->v);
    free(r->src);
    free(r);
}

nb_json *nb_json_parse(const char *text, size_t len, const char *src, char *err, size_t errcap) {
    json_root *r = nb_calloc(1, sizeof *r, "JSON tree");
    r->src = strdup(src ? src : "<json>");
    if (!r->src) nb_fail("free some host memory", "out of memory parsing JSON");
    parser p = {text, len, 0, 1, 0, r->src, err, errcap, 0, 0};
    char b1[32], b2[32];
    int ok = len <= NB_JSON_MAX_BYTES ||
             perr_at(&p, 0, "the document is %s, more than the %s a JSON input may be",
                     nb_fmt_bytes(b1, sizeof b1, (double)len), nb_fmt_bytes(b2, sizeof b2, (double)NB_JSON_MAX_BYTES));
    if (ok) skip_ws(&p);
    if (ok) ok = parse_value(&p, &r->v, 0);
    if (ok) {
        skip_ws(&p);
        char d[16];
        if (p.pos < p.n) ok = perr_at(&p, p.pos, "unexpected %s after the JSON value", describe_char(&p, d, sizeof d));
    }
    if (!ok) {
        nb_json_free(&r->v);
        return NULL;
    }
    return &r->v;
}

nb_json *nb_json_parse_or_fail(const char *text, size_t len, const char *src) {
    char err[512];
    nb_json *v = nb_json_parse(text, len, src, err, sizeof err);
    if (!v) nb_fail("fix the file, or delete it to start fresh", "invalid JSON: %s", err);
    return v;
}

nb_json *nb_json_load_file(const char *path) {
    size_t len;
    char *text = nb_read_file(path, NB_JSON_MAX_BYTES, &len, "pass the right JSON file; nobubble's are a few KB");
    nb_json *v = nb_json_parse_or_fail(text, len, path);
    free(text);
    return v;
}

/* ------------------------------------------------------------------ lookups */

const char *nb_json_type_name(nb_json_type t) {
    static const char *names[] = {"null", "a boolean", "a number", "a string", "an array", "an object"};
    return (unsigned)t < 6 ? names[t] : "?";
}

const nb_json *nb_json_get(const nb_json *obj, const char *key) {
    if (!obj || obj->type != NB_JSON_OBJ) return NULL;
    for (size_t i = obj->len; i-- > 0;)
        if (strcmp(obj->keys[i], key) == 0) return &obj->items[i];
    return NULL;
}

static NB_NORETURN void wrong_type(const nb_json *v, const char *key, const char *want) {
    nb_fail("fix the value in the file", "%s:%d:%d: '%s' must be %s, found %s", v->src, v->line,
            v->col, key, want, nb_json_type_name(v->type));
}

static const nb_json *member(const nb_json *obj, const char *key, int required) {
    NB_CHECK(obj && obj->type == NB_JSON_OBJ, "fix the file", "%s:%d:%d: expected an object holding '%s'",
             obj ? obj->src : "<json>", obj ? obj->line : 0, obj ? obj->col : 0, key);
    const nb_json *v = nb_json_get(obj, key);
    if (!v && required)
        nb_fail("add the field, or regenerate the file", "%s:%d:%d: missing required field '%s'",
                obj->src, obj->line, obj->col, key);
    return v;
}

static int64_t as_int(const nb_json *v, const char *key) {
    if (v->type != NB_JSON_NUM) wrong_type(v, key, "an integer");
    if (!v->is_int)
        nb_fail("fix the value in the file", "%s:%d:%d: '%s' must be an integer, found %.17g", v->src,
                v->line, v->col, key, v->num);
    return v->i64;
}

int64_t nb_json_get_int(const nb_json *obj, const char *key, int64_t def) {
    const nb_json *v = member(obj, key, 0);
    return !v || v->type == NB_JSON_NULL ? def : as_int(v, key);
}

double nb_json_get_num(const nb_json *obj, const char *key, double def) {
    const nb_json *v = member(obj, key, 0);
    if (!v) return def;
    if (v->type == NB_JSON_NULL) return NAN; /* how the writer spells NaN and inf */
    if (v->type != NB_JSON_NUM) wrong_type(v, key, "a number");
    return v->num;
}

const char *nb_json_get_str(const nb_json *obj, const char *key, const char *def) {
    const nb_json *v = member(obj, key, 0);
    if (!v || v->type == NB_JSON_NULL) return def;
    if (v->type != NB_JSON_STR) wrong_type(v, key, "a string");
    return v->str;
}

int nb_json_get_bool(const nb_json *obj, const char *key, int def) {
    const nb_json *v = member(obj, key, 0);
    if (!v || v->type == NB_JSON_NULL) return def;
    if (v->type != NB_JSON_BOOL) wrong_type(v, key, "true or false");
    return v->boolean;
}

int64_t nb_json_req_int(const nb_json *obj, const char *key) { return as_int(member(obj, key, 1), key); }

uint64_t nb_json_req_u64(const nb_json *obj, const char *key) {
    const nb_json *v = member(obj, key, 1);
    if (v->type != NB_JSON_NUM) wrong_type(v, key, "a non-negative integer");
    if (!v->is_u64)
        nb_fail("fix the value in the file", "%s:%d:%d: '%s' must be an integer in [0, 2^64), found %.17g",
                v->src, v->line, v->col, key, v->num);
    return v->u64;
}

double nb_json_req_num(const nb_json *obj, const char *key) {
    const nb_json *v = member(obj, key, 1);
    if (v->type == NB_JSON_NULL) return NAN;
    if (v->type != NB_JSON_NUM) wrong_type(v, key, "a number");
    return v->num;
}

const char *nb_json_req_str(const nb_json *obj, const char *key) {
    const nb_json *v = member(obj, key, 1);
    if (v->type != NB_JSON_STR) wrong_type(v, key, "a string");
    return v->str;
}

const nb_json *nb_json_req(const nb_json *obj, const char *key, nb_json_type type) {
    const nb_json *v = member(obj, key, 1);
    if (v->type != type) wrong_type(v, key, nb_json_type_name(type));
    return v;
}

/* ---- a parsed value written again ---- */

/* The shortest text that reads back as the same double; a float stays a float. */
static void spell_number(nb_sbuf *b, const nb_json *v) {
    char buf[40];
    if (isnan(v->num) || isinf(v->num)) {
        nb_sbuf_puts(b, isnan(v->num) ? "NaN" : v->num < 0 ? "-Infinity" : "Infinity");
        return;
    }
    if (v->int_literal) {
        nb_sbuf_printf(b, "%" PRId64, v->i64);
        return;
    }
    if (v->num == floor(v->num) && fabs(v->num) < 1e15) { /* 10000.0, as Python writes it */
        nb_sbuf_printf(b, "%.1f", v->num);
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, v->num);
        if (strtod(buf, NULL) == v->num) break; /* 17 digits always round-trip */
    }
    nb_sbuf_puts(b, buf);
    if (!strpbrk(buf, ".eE")) nb_sbuf_puts(b, ".0");
}

void nb_json_spell(nb_sbuf *b, const nb_json *v) {
    switch (v->type) {
    case NB_JSON_NULL: nb_sbuf_puts(b, "null"); break;
    case NB_JSON_BOOL: nb_sbuf_puts(b, v->boolean ? "true" : "false"); break;
    case NB_JSON_NUM: spell_number(b, v); break;
    case NB_JSON_STR: put_escaped(b, v->str, v->len); break;
    case NB_JSON_ARR:
    case NB_JSON_OBJ:
        nb_sbuf_puts(b, v->type == NB_JSON_OBJ ? "{" : "[");
        for (size_t i = 0; i < v->len; i++) {
            if (i) nb_sbuf_puts(b, ", ");
            if (v->type == NB_JSON_OBJ) put_escaped(b, v->keys[i], strlen(v->keys[i])), nb_sbuf_puts(b, ": ");
            nb_json_spell(b, &v->items[i]);
        }
        nb_sbuf_puts(b, v->type == NB_JSON_OBJ ? "}" : "]");
        break;
    }
}

void nb_json_raw(nb_json_writer *w, const char *text) {
    before_item(w, 0);
    nb_sbuf_puts(&w->out, text);
}
