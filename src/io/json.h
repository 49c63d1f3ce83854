/* Small JSON writer and parser for state.json, config.json, metrics.jsonl and safetensors headers.
 *
 * Writer: appends to a growable buffer. Strings are escaped so the output is always valid JSON
 * (control characters as \uXXXX, invalid UTF-8 replaced by U+FFFD); NaN and +-inf are written as
 * null because JSON has no spelling for them. Misuse (a value where a key is due, unbalanced
 * ends) is a bug in the caller and trips NB_ASSERT.
 *
 *     nb_json_writer w; nb_json_writer_init(&w, 0);
 *     nb_json_begin_obj(&w);
 *     nb_json_kint(&w, "step", 100); nb_json_knum(&w, "loss", 3.25);
 *     nb_json_end_obj(&w);
 *     fputs(nb_json_text(&w), f); nb_json_writer_free(&w);
 *
 * Parser: builds a tree. Errors name the source, line and column ("state.json:3:14: ..."). The
 * parser accepts strict JSON (RFC 8259) plus NaN, Infinity and -Infinity, which Python's json
 * module writes by default. Strings must be valid UTF-8; \u escapes (surrogate pairs included)
 * are decoded to UTF-8. A key that appears twice in one object is an error (RFC 8259 leaves it
 * open; Python silently keeps the last, which hides a damaged or hand-merged state.json).
 * Resource bounds, so that a hostile or damaged document fails cleanly instead of taking the
 * host's memory or stack: at most NB_JSON_MAX_BYTES of text, NB_JSON_MAX_VALUES values (a value
 * costs ~120 bytes of tree) and NB_JSON_MAX_NESTING levels of arrays and objects. */
#ifndef NB_JSON_H
#define NB_JSON_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- growable string buffer (also used by the SVG writer) ---- */
typedef struct {
    char *data; /* always NUL-terminated once anything was appended */
    size_t len, cap;
} nb_sbuf;

void nb_sbuf_append(nb_sbuf *b, const char *s, size_t n);
void nb_sbuf_puts(nb_sbuf *b, const char *s);
void nb_sbuf_printf(nb_sbuf *b, const char *fmt, ...) NB_PRINTF(2, 3);
void nb_sbuf_free(nb_sbuf *b);

/* Decode one UTF-8 code point from s[0..n). Returns the bytes consumed (1..4) and sets *cp, or 0
 * when the sequence is invalid (overlong, surrogate, > U+10FFFF, truncated). */
int nb_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp);

/* ---- writer ---- */
#define NB_JSON_MAX_DEPTH 256 /* the writer's nesting */

/* ---- parser bounds ---- */
#define NB_JSON_MAX_BYTES ((size_t)64 << 20) /* state.json is a few KB, safetensors headers < 10 MB */
#define NB_JSON_MAX_VALUES ((size_t)8 << 20) /* ~1 GB of tree; a 64 MiB trace has ~5 M values */
#define NB_JSON_MAX_NESTING 64               /* nobubble's own files nest 4 deep */

typedef struct {
    nb_sbuf out;
    int indent; /* 0: compact, one line; n: pretty, n spaces per level */
    int depth;
    int after_key;                       /* a key was written, its value is due */
    unsigned char count[NB_JSON_MAX_DEPTH]; /* 0 = container empty so far, 1 = has items */
    unsigned char is_obj[NB_JSON_MAX_DEPTH];
} nb_json_writer;

void nb_json_writer_init(nb_json_writer *w, int indent);
void nb_json_writer_free(nb_json_writer *w);
/* The text written so far (valid JSON once every container is closed). Owned by w. */
const char *nb_json_text(const nb_json_writer *w);
size_t nb_json_len(const nb_json_writer *w);

void nb_json_begin_obj(nb_json_writer *w);
void nb_json_end_obj(nb_json_writer *w);
void nb_json_begin_arr(nb_json_writer *w);
void nb_json_end_arr(nb_json_writer *w);
void nb_json_key(nb_json_writer *w, const char *key);
void nb_json_str(nb_json_writer *w, const char *s);
void nb_json_strn(nb_json_writer *w, const char *s, size_t n);
void nb_json_num(nb_json_writer *w, double v);    /* %.9g: exact for float32 values */
void nb_json_double(nb_json_writer *w, double v); /* shortest text that reads back bit-exact */
void nb_json_int(nb_json_writer *w, int64_t v);
void nb_json_uint(nb_json_writer *w, uint64_t v);
void nb_json_bool(nb_json_writer *w, int v);
void nb_json_null(nb_json_writer *w);
/* key + value in one call */
void nb_json_kstr(nb_json_writer *w, const char *key, const char *s);
void nb_json_knum(nb_json_writer *w, const char *key, double v);
void nb_json_kdouble(nb_json_writer *w, const char *key, double v);
void nb_json_kint(nb_json_writer *w, const char *key, int64_t v);
void nb_json_kbool(nb_json_writer *w, const char *key, int v);

/* ---- parser ---- */
typedef enum { NB_JSON_NULL, NB_JSON_BOOL, NB_JSON_NUM, NB_JSON_STR, NB_JSON_ARR, NB_JSON_OBJ } nb_json_type;

typedef struct nb_json nb_json;
struct nb_json {
    nb_json_type type;
    int line, col;   /* where the value starts, 1-based (col counts bytes) */
    const char *src; /* name of the source, for error messages; owned by the root */
    int boolean;
    double num;
    int is_int;  /* the number is integral and fits int64 (then i64 holds it exactly) */
    int int_literal; /* ... and is written as an integer: no fraction, no exponent ("3", not "3.0") */
    int64_t i64;
    int is_u64;  /* the number is a non-negative integer that fits uint64 (u64 holds it exactly) */
    uint64_t u64;
    char *str;   /* strings: NUL-terminated UTF-8 (may hold \u0000; len is exact) */
    size_t len;  /* string bytes, or number of items / members */
    nb_json *items; /* array items or object values */
    char **keys;    /* object keys, parallel to items */
};

/* Parse text[0..len). On error returns NULL and writes "src:line:col: message" into err. */
nb_json *nb_json_parse(const char *text, size_t len, const char *src, char *err, size_t errcap);
/* Same, but a parse error ends in nb_fail naming the source and position. */
nb_json *nb_json_parse_or_fail(const char *text, size_t len, const char *src);
/* Read and parse a whole file (a regular file of at most NB_JSON_MAX_BYTES, refused before it is
 * read); any failure ends in nb_fail naming the file. */
nb_json *nb_json_load_file(const char *path);
void nb_json_free(nb_json *root);

const char *nb_json_type_name(nb_json_type t);
/* Member of an object, or NULL (also NULL when obj is not an object). Keys are unique (the
 * parser refuses duplicates). Linear in the number of members. */
const nb_json *nb_json_get(const nb_json *obj, const char *key);
/* Optional members: missing or null -> def; present with the wrong type -> nb_fail naming the
 * source, position, key, expected and found type. */
int64_t nb_json_get_int(const nb_json *obj, const char *key, int64_t def);
double nb_json_get_num(const nb_json *obj, const char *key, double def); /* null -> NAN */
const char *nb_json_get_str(const nb_json *obj, const char *key, const char *def);
int nb_json_get_bool(const nb_json *obj, const char *key, int def);
/* Required members: missing -> nb_fail. */
int64_t nb_json_req_int(const nb_json *obj, const char *key);
uint64_t nb_json_req_u64(const nb_json *obj, const char *key); /* exact up to 2^64-1 (seeds) */
double nb_json_req_num(const nb_json *obj, const char *key);
const char *nb_json_req_str(const nb_json *obj, const char *key);
const nb_json *nb_json_req(const nb_json *obj, const char *key, nb_json_type type);

/* A parsed value spelled again, compact (", " and ": " between items): strings escaped as the
 * writer escapes them, integer literals as they were, other numbers as the shortest text that
 * reads back the same double and always with a '.' or an exponent (a float stays a float, which
 * transformers' strict configs check), NaN and infinities as Python's json spells them. */
void nb_json_spell(nb_sbuf *b, const nb_json *v);
/* A value already spelled (nb_json_spell's text), written as it is. */
void nb_json_raw(nb_json_writer *w, const char *text);

#ifdef __cplusplus
}
#endif
#endif
