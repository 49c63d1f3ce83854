#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "io/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core.h"
#include "io/atomic.h"
#include "io/crc32c.h"
#include "io/json.h"

#define ST_MAX_HEADER 100000000ull /* the reference implementation's limit */
#define ST_STAGE_BYTES ((size_t)16 << 20)
#define BUG_HINT "this is a bug in nobubble; please report it"
#define CORRUPT_HINT "the file is corrupt, truncated or not a safetensors file; write or download it again"
#define DAMAGED_HINT "resume from an older checkpoint, or write the file again"
#define CRC_KEY "nobubble.crc32c"         /* the header's checksum */
#define CRC_PREFIX "nobubble.crc32c."     /* + tensor name: that tensor's checksum */
#define CRC_CHUNK ((size_t)1 << 20)       /* checksum and copy in cache-sized pieces */
#define MISMATCH_HINT "the file was written for another model shape or dtype; use the flags it was written with, or another file"

static char *xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = nb_malloc(n, "string");
    memcpy(p, s, n);
    return p;
}

const char *nb_st_shape_str(char *buf, size_t cap, int ndim, const int64_t *shape) {
    size_t k = 0;
    k += (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && k < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%" PRId64, i ? ", " : "", shape[i]);
    if (k < cap) snprintf(buf + k, cap - k, "]");
    return buf;
}

/* numel and bytes with overflow checks; returns 0 on overflow. */
static int shape_bytes(nb_dtype dt, int ndim, const int64_t *shape, int64_t *numel, size_t *bytes) {
    uint64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return 0;
        if (shape[i] && n > (uint64_t)INT64_MAX / (uint64_t)shape[i]) return 0;
        n *= (uint64_t)shape[i];
    }
    uint64_t sz = nb_dtype_size(dt);
    if (n > SIZE_MAX / sz || n * sz > (uint64_t)INT64_MAX) return 0;
    *numel = (int64_t)n;
    *bytes = (size_t)(n * sz);
    return 1;
}

/* ------------------------------------------------------------------ checksums */

/* What the header checksum covers: every metadata pair but the checksums and every tensor's
 * name, dtype and shape, each as one item, items sorted, each hashed with its length. Sorting
 * makes it independent of member order and JSON layout (tools that rewrite a header keep the
 * meaning, not the bytes); data offsets are left out because the layout checks and the tensors'
 * own checksums catch any change to them. */
typedef struct {
    char *s;
    size_t n;
} canon_item;

typedef struct {
    canon_item *v;
    int n, cap;
} canon;

static void canon_add(canon *c, char tag, const char *a, const char *b) {
    if (c->n == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 64;
        c->v = realloc(c->v, (size_t)c->cap * sizeof *c->v);
        NB_CHECK(c->v, "free some host memory", "out of memory checksumming a safetensors header");
    }
    size_t la = strlen(a), lb = strlen(b), n = 1 + la + 1 + lb;
    char *s = nb_malloc(n, "safetensors header item");
    s[0] = tag;
    memcpy(s + 1, a, la);
    s[1 + la] = '\0';
    memcpy(s + 2 + la, b, lb);
    c->v[c->n++] = (canon_item){s, n};
}

static void canon_tensor(canon *c, const char *name, nb_dtype dt, int ndim, const int64_t *shape) {
    char desc[32 + NB_ST_MAX_DIMS * 24];
    size_t k = (size_t)snprintf(desc, sizeof desc, "%s", nb_dtype_name(dt));
    for (int i = 0; i < ndim; i++) k += (size_t)snprintf(desc + k, sizeof desc - k, " %" PRId64, shape[i]);
    canon_add(c, 'T', name, desc);
}

static int canon_cmp(const void *a, const void *b) {
    const canon_item *x = a, *y = b;
    int r = memcmp(x->s, y->s, x->n < y->n ? x->n : y->n);
    return r ? r : (x->n > y->n) - (x->n < y->n);
}

static uint32_t canon_crc(canon *c) {
    qsort(c->v, (size_t)c->n, sizeof *c->v, canon_cmp);
    uint32_t crc = 0;
    for (int i = 0; i < c->n; i++) {
        uint64_t n = c->v[i].n;
        crc = nb_crc32c(crc, &n, sizeof n);
        crc = nb_crc32c(crc, c->v[i].s, c->v[i].n);
        free(c->v[i].s);
    }
    free(c->v);
    memset(c, 0, sizeof *c);
    return crc;
}

static int is_crc_key(const char *key) { return !strncmp(key, CRC_KEY, strlen(CRC_KEY)); }

/* ------------------------------------------------------------------ writer */

typedef struct {
    char *name;
    nb_dtype dtype;
    int ndim;
    int64_t shape[NB_ST_MAX_DIMS];
    size_t nbytes;
    const void *data;
    nb_st_fill_fn fill;
    void *ctx;
} st_entry;

struct nb_st_writer {
    char *path;
    st_entry *t;
    int n, cap;
    char **mkey, **mval;
    int nmeta, mcap;
    int checksums;
};

nb_st_writer *nb_st_begin(const char *path) {
    nb_st_writer *w = nb_calloc(1, sizeof *w, "safetensors writer");
    w->path = xstrdup(path);
    w->checksums = 1;
    return w;
}

void nb_st_set_checksums(nb_st_writer *w, int on) { w->checksums = on; }

static void add_entry(nb_st_writer *w, const char *name, nb_dtype dtype, int ndim, const int64_t *shape,
                      const void *data, nb_st_fill_fn fill, void *ctx) {
    NB_CHECK(name && name[0] && strcmp(name, "__metadata__") != 0, BUG_HINT,
             "invalid tensor name '%s' for '%s'", name ? name : "(null)", w->path);
    NB_CHECK((unsigned)dtype < NB_DTYPE_COUNT, BUG_HINT, "tensor '%s': unknown dtype %d", name, (int)dtype);
    NB_CHECK(ndim >= 0 && ndim <= NB_ST_MAX_DIMS, BUG_HINT, "tensor '%s': %d dims (at most %d)", name,
             ndim, NB_ST_MAX_DIMS);
    for (int i = 0; i < w->n; i++)
        NB_CHECK(strcmp(w->t[i].name, name) != 0, BUG_HINT, "tensor '%s' added twice to '%s'", name, w->path);
    int64_t numel;
    size_t bytes;
    NB_CHECK(shape_bytes(dtype, ndim, shape, &numel, &bytes), BUG_HINT,
             "tensor '%s': invalid or overflowing shape", name);
    NB_CHECK(bytes == 0 || data || fill, BUG_HINT, "tensor '%s': no data", name);
    if (w->n == w->cap) {
        w->cap = w->cap ? 2 * w->cap : 64;
        w->t = realloc(w->t, (size_t)w->cap * sizeof *w->t);
        NB_CHECK(w->t, "free some host memory", "out of memory recording tensors for '%s'", w->path);
    }
    st_entry *e = &w->t[w->n++];
    memset(e, 0, sizeof *e);
    e->name = xstrdup(name);
    e->dtype = dtype;
    e->ndim = ndim;
    for (int i = 0; i < ndim; i++) e->shape[i] = shape[i];
    e->nbytes = bytes;
    e->data = data;
    e->fill = fill;
    e->ctx = ctx;
}

void nb_st_add(nb_st_writer *w, const char *name, nb_dtype dtype, int ndim, const int64_t *shape,
               const void *data) {
    add_entry(w, name, dtype, ndim, shape, data, NULL, NULL);
}

void nb_st_add_fn(nb_st_writer *w, const char *name, nb_dtype dtype, int ndim, const int64_t *shape,
                  nb_st_fill_fn fill, void *ctx) {
    NB_ASSERT(fill);
    add_entry(w, name, dtype, ndim, shape, NULL, fill, ctx);
}

void nb_st_meta(nb_st_writer *w, const char *key, const char *value) {
    NB_ASSERT(key && value);
    NB_CHECK(!is_crc_key(key), BUG_HINT, "metadata key '%s' of '%s' is reserved for checksums", key, w->path);
    for (int i = 0; i < w->nmeta; i++)
        if (!strcmp(w->mkey[i], key)) {
            free(w->mval[i]);
            w->mval[i] = xstrdup(value);
            return;
        }
    if (w->nmeta == w->mcap) {
        w->mcap = w->mcap ? 2 * w->mcap : 8;
        w->mkey = realloc(w->mkey, (size_t)w->mcap * sizeof *w->mkey);
        w->mval = realloc(w->mval, (size_t)w->mcap * sizeof *w->mval);
        NB_CHECK(w->mkey && w->mval, "free some host memory", "out of memory recording metadata");
    }
    w->mkey[w->nmeta] = xstrdup(key);
    w->mval[w->nmeta++] = xstrdup(value);
}

static uint32_t writer_header_crc(const nb_st_writer *w) {
    canon c = {0};
    for (int i = 0; i < w->nmeta; i++) canon_add(&c, 'M', w->mkey[i], w->mval[i]);
    for (int i = 0; i < w->n; i++) canon_tensor(&c, w->t[i].name, w->t[i].dtype, w->t[i].ndim, w->t[i].shape);
    return canon_crc(&c);
}

static void put_crc(nb_json_writer *j, const char *key, uint32_t crc) {
    char hex[9];
    snprintf(hex, sizeof hex, "%08" PRIx32, crc);
    nb_json_kstr(j, key, hex);
}

/* Compact JSON, metadata first, keys in the reference writer's order, padded to 8 bytes. With
 * checksums (crc not NULL), the header's and then each tensor's, 8 hex digits each: the text has
 * the same length whatever their values, so it is written with zeros first and again once the
 * data (and so the tensors' checksums) has been written. */
static void build_header(const nb_st_writer *w, nb_json_writer *j, const uint32_t *crc) {
    nb_json_writer_init(j, 0);
    nb_json_begin_obj(j);
    if (w->nmeta || crc) {
        nb_json_key(j, "__metadata__");
        nb_json_begin_obj(j);
        for (int i = 0; i < w->nmeta; i++) nb_json_kstr(j, w->mkey[i], w->mval[i]);
        if (crc) {
            put_crc(j, CRC_KEY, writer_header_crc(w));
            nb_sbuf key = {0};
            for (int i = 0; i < w->n; i++) {
                key.len = 0;
                nb_sbuf_printf(&key, "%s%s", CRC_PREFIX, w->t[i].name);
                put_crc(j, key.data, crc[i]);
            }
            nb_sbuf_free(&key);
        }
        nb_json_end_obj(j);
    }
    uint64_t off = 0;
    for (int i = 0; i < w->n; i++) {
        const st_entry *e = &w->t[i];
        nb_json_key(j, e->name);
        nb_json_begin_obj(j);
        nb_json_kstr(j, "dtype", nb_dtype_name(e->dtype));
        nb_json_key(j, "shape");
        nb_json_begin_arr(j);
        for (int d = 0; d < e->ndim; d++) nb_json_int(j, e->shape[d]);
        nb_json_end_arr(j);
        nb_json_key(j, "data_offsets");
        nb_json_begin_arr(j);
        nb_json_uint(j, off);
        nb_json_uint(j, off + e->nbytes);
        nb_json_end_arr(j);
        nb_json_end_obj(j);
        off += e->nbytes;
    }
    nb_json_end_obj(j);
    while (nb_json_len(j) % 8) nb_sbuf_append(&j->out, " ", 1);
}

typedef struct {
    FILE *f;
    const char *tmp, *path;
    void *stage;
} st_out;

/* Writes a tensor's bytes piece by piece, each checksummed just before it is written (while it
 * is in cache). Write errors end in nb_fail with errno's cause (nb_atomic_write). */
static uint32_t write_entry(st_out *o, const st_entry *e) {
    uint32_t crc = 0;
    if (!e->fill) {
        for (size_t off = 0; off < e->nbytes; off += CRC_CHUNK) {
            size_t n = e->nbytes - off < CRC_CHUNK ? e->nbytes - off : CRC_CHUNK;
            crc = nb_crc32c(crc, (const char *)e->data + off, n);
            nb_atomic_write(o->f, o->tmp, o->path, (const char *)e->data + off, n);
        }
        return crc;
    }
    size_t chunk = e->nbytes < ST_STAGE_BYTES ? e->nbytes : ST_STAGE_BYTES;
    if (!o->stage && chunk) o->stage = nb_malloc(ST_STAGE_BYTES, "safetensors staging buffer");
    for (size_t off = 0; off < e->nbytes; off += chunk) {
        size_t n = e->nbytes - off < chunk ? e->nbytes - off : chunk;
        e->fill(e->ctx, o->stage, off, n);
        crc = nb_crc32c(crc, o->stage, n);
        nb_atomic_write(o->f, o->tmp, o->path, o->stage, n);
    }
    return crc;
}

static void writer_free(nb_st_writer *w) {
    for (int i = 0; i < w->n; i++) free(w->t[i].name);
    for (int i = 0; i < w->nmeta; i++) free(w->mkey[i]), free(w->mval[i]);
    free(w->t);
    free(w->mkey);
    free(w->mval);
    free(w->path);
    free(w);
}

/* The header again, now with the tensors' checksums, over the placeholder of the same length. */
static void rewrite_header(st_out *o, const nb_st_writer *w, const uint32_t *crc, uint64_t len) {
    nb_json_writer j;
    build_header(w, &j, crc);
    NB_ASSERT(nb_json_len(&j) == len);
    if (fflush(o->f) != 0) nb_atomic_fail(o->f, o->tmp, o->path, "write", errno);
    const char *p = nb_json_text(&j);
    for (size_t done = 0; done < len;) {
        ssize_t k = pwrite(fileno(o->f), p + done, len - done, (off_t)(8 + done));
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) nb_atomic_fail(o->f, o->tmp, o->path, "write", k < 0 ? errno : EIO);
        done += (size_t)k;
    }
    nb_json_writer_free(&j);
}

void nb_st_end(nb_st_writer *w) {
    uint32_t *crc = w->checksums ? nb_calloc((size_t)w->n, sizeof *crc, "safetensors checksums") : NULL;
    nb_json_writer j;
    build_header(w, &j, crc);
    uint64_t n = nb_json_len(&j);
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)(n >> (8 * i));
    char tmp[PATH_MAX];
    st_out o = {nb_atomic_open(w->path, tmp, sizeof tmp), tmp, w->path, NULL};
    nb_atomic_write(o.f, tmp, w->path, len8, 8);
    nb_atomic_write(o.f, tmp, w->path, nb_json_text(&j), n);
    nb_json_writer_free(&j);
    for (int i = 0; i < w->n; i++) {
        uint32_t c = write_entry(&o, &w->t[i]);
        if (crc) crc[i] = c;
    }
    free(o.stage);
    if (crc) rewrite_header(&o, w, crc, n);
    nb_atomic_commit(o.f, tmp, w->path);
    free(crc);
    writer_free(w);
}

/* ------------------------------------------------------------------ reader */

struct nb_st_file {
    char *path;
    int fd;
    const uint8_t *map;
    size_t size;
    nb_st_tensor *t;      /* file order */
    nb_st_tensor **by_name;
    int n;
    char **mkey, **mval;
    int nmeta;
    int has_header_crc;
    uint32_t header_crc;
    char **crc_name; /* per-tensor checksums as read, matched to tensors once all are parsed */
    uint32_t *crc_val;
    int ncrc;
};

const char *nb_st_path(const nb_st_file *f) { return f->path; }
int nb_st_count(const nb_st_file *f) { return f->n; }
const nb_st_tensor *nb_st_at(const nb_st_file *f, int i) {
    NB_ASSERT(i >= 0 && i < f->n);
    return &f->t[i];
}
int nb_st_meta_count(const nb_st_file *f) { return f->nmeta; }
void nb_st_meta_at(const nb_st_file *f, int i, const char **key, const char **value) {
    NB_ASSERT(i >= 0 && i < f->nmeta);
    *key = f->mkey[i];
    *value = f->mval[i];
}
const char *nb_st_meta_get(const nb_st_file *f, const char *key) {
    for (int i = 0; i < f->nmeta; i++)
        if (!strcmp(f->mkey[i], key)) return f->mval[i];
    return NULL;
}

static int dtype_from_name(const char *s, nb_dtype *out) {
    for (int d = 0; d < NB_DTYPE_COUNT; d++)
        if (!strcmp(s, nb_dtype_name((nb_dtype)d))) {
            *out = (nb_dtype)d;
            return 1;
        }
    return 0;
}

/* A non-negative integer that fits int64, written as one: "50304.0" and "5.0304e4" are
 * refused, as the reference (Rust, serde usize) refuses them. */
static int json_uint(const nb_json *v, uint64_t *out) {
    if (!v || v->type != NB_JSON_NUM || !v->is_int || !v->int_literal || v->i64 < 0) return 0;
    *out = (uint64_t)v->i64;
    return 1;
}

static uint32_t parse_crc(const nb_st_file *f, const char *key, const char *v) {
    int ok = strlen(v) == 8;
    for (int i = 0; ok && i < 8; i++) ok = (v[i] >= '0' && v[i] <= '9') || (v[i] >= 'a' && v[i] <= 'f');
    NB_CHECK(ok, CORRUPT_HINT, "'%s': metadata '%s' must be 8 hex digits (a CRC32C), found '%.40s'", f->path, key, v);
    return (uint32_t)strtoul(v, NULL, 16);
}

static void parse_metadata(nb_st_file *f, const nb_json *m) {
    NB_CHECK(m->type == NB_JSON_OBJ, CORRUPT_HINT, "'%s': header field '__metadata__' must be an object, found %s",
             f->path, nb_json_type_name(m->type));
    f->mkey = nb_calloc(m->len, sizeof *f->mkey, "safetensors metadata");
    f->mval = nb_calloc(m->len, sizeof *f->mval, "safetensors metadata");
    f->crc_name = nb_calloc(m->len, sizeof *f->crc_name, "safetensors checksums");
    f->crc_val = nb_calloc(m->len, sizeof *f->crc_val, "safetensors checksums");
    for (size_t i = 0; i < m->len; i++) {
        const char *k = m->keys[i];
        NB_CHECK(m->items[i].type == NB_JSON_STR, CORRUPT_HINT,
                 "'%s': metadata value '%s' must be a string, found %s", f->path, k,
                 nb_json_type_name(m->items[i].type));
        if (!strcmp(k, CRC_KEY)) {
            f->has_header_crc = 1;
            f->header_crc = parse_crc(f, k, m->items[i].str);
        } else if (!strncmp(k, CRC_PREFIX, strlen(CRC_PREFIX))) {
            f->crc_val[f->ncrc] = parse_crc(f, k, m->items[i].str);
            f->crc_name[f->ncrc++] = xstrdup(k + strlen(CRC_PREFIX));
        } else {
            f->mkey[f->nmeta] = xstrdup(k);
            f->mval[f->nmeta++] = xstrdup(m->items[i].str);
        }
    }
}

/* Tensors' checksums matched to the tensors; the header's checked against the header. */
static void check_checksums(nb_st_file *f) {
    for (int i = 0; i < f->ncrc; i++) {
        nb_st_tensor *t = (nb_st_tensor *)nb_st_find(f, f->crc_name[i]);
        NB_CHECK(t, CORRUPT_HINT, "'%s': metadata has a checksum for tensor '%s', which the file does not hold", f->path,
                 f->crc_name[i]);
        t->has_crc = 1;
        t->crc32c = f->crc_val[i];
    }
    /* a writer that checksums its tensors checksums its header too: tensor checksums without a
     * header checksum mean the header's own was lost (a damaged header) */
    NB_CHECK(f->has_header_crc || f->ncrc == 0, DAMAGED_HINT,
             "'%s': the header has tensor checksums but not its own: the header is damaged", f->path);
    if (!f->has_header_crc) return;
    for (int i = 0; i < f->n; i++)
        NB_CHECK(f->t[i].has_crc, DAMAGED_HINT, "'%s': the header has no checksum for tensor '%s': the header is damaged",
                 f->path, f->t[i].name);
    canon c = {0};
    for (int i = 0; i < f->nmeta; i++) canon_add(&c, 'M', f->mkey[i], f->mval[i]);
    for (int i = 0; i < f->n; i++) canon_tensor(&c, f->t[i].name, f->t[i].dtype, f->t[i].ndim, f->t[i].shape);
    NB_CHECK(canon_crc(&c) == f->header_crc, DAMAGED_HINT,
             "checksum mismatch in the header of '%s' (its metadata, names, dtypes or shapes): the file is damaged",
             f->path);
}

static void parse_entry(nb_st_file *f, const char *name, const nb_json *e, uint64_t data_size, nb_st_tensor *t) {
    const char *p = f->path;
    NB_CHECK(e->type == NB_JSON_OBJ, CORRUPT_HINT, "'%s': tensor '%s' must be an object, found %s", p, name,
             nb_json_type_name(e->type));
    const nb_json *dt = nb_json_get(e, "dtype"), *sh = nb_json_get(e, "shape"), *off = nb_json_get(e, "data_offsets");
    NB_CHECK(dt && dt->type == NB_JSON_STR, CORRUPT_HINT, "'%s': tensor '%s' has no string field 'dtype'", p, name);
    NB_CHECK(dtype_from_name(dt->str, &t->dtype), "convert the file to F32, BF16, F16, I32, U16 or U8",
             "'%s': tensor '%s' has dtype '%s', which nobubble does not support", p, name, dt->str);
    NB_CHECK(sh && sh->type == NB_JSON_ARR, CORRUPT_HINT, "'%s': tensor '%s' has no array field 'shape'", p, name);
    NB_CHECK(sh->len <= NB_ST_MAX_DIMS, "reshape the tensor to at most 8 dims",
             "'%s': tensor '%s' has %zu dims (at most %d supported)", p, name, sh->len, NB_ST_MAX_DIMS);
    t->ndim = (int)sh->len;
    for (int i = 0; i < t->ndim; i++) {
        uint64_t d;
        NB_CHECK(json_uint(&sh->items[i], &d), CORRUPT_HINT,
                 "'%s': tensor '%s': shape[%d] is not a non-negative integer", p, name, i);
        t->shape[i] = (int64_t)d;
    }
    NB_CHECK(off && off->type == NB_JSON_ARR && off->len == 2, CORRUPT_HINT,
             "'%s': tensor '%s' has no field 'data_offsets' of two integers", p, name);
    uint64_t b, en;
    NB_CHECK(json_uint(&off->items[0], &b) && json_uint(&off->items[1], &en) && b <= en, CORRUPT_HINT,
             "'%s': tensor '%s': data_offsets must be two non-negative integers [begin, end] with begin <= end",
             p, name);
    char sbuf[128];
    NB_CHECK(shape_bytes(t->dtype, t->ndim, t->shape, &t->numel, &t->nbytes), CORRUPT_HINT,
             "'%s': tensor '%s': shape %s overflows", p, name, nb_st_shape_str(sbuf, sizeof sbuf, t->ndim, t->shape));
    NB_CHECK(en - b == t->nbytes, CORRUPT_HINT,
             "'%s': tensor '%s': shape %s of %s needs %zu bytes but data_offsets [%" PRIu64 ", %" PRIu64
             "] span %" PRIu64, p, name, nb_st_shape_str(sbuf, sizeof sbuf, t->ndim, t->shape),
             nb_dtype_name(t->dtype), t->nbytes, b, en, en - b);
    NB_CHECK(en <= data_size, CORRUPT_HINT,
             "'%s': tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] go past the end of the data (%" PRIu64
             " bytes); the file is truncated", p, name, b, en, data_size);
    t->name = xstrdup(name);
    t->offset = b; /* relative for now; made absolute once the header length is known */
}

static int cmp_offset(const void *a, const void *b) {
    const nb_st_tensor *x = a, *y = b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}
static int cmp_name(const void *a, const void *b) {
    return strcmp((*(nb_st_tensor *const *)a)->name, (*(nb_st_tensor *const *)b)->name);
}

/* Offsets must tile [0, data_size) exactly, as the reference reader requires. */
static void check_layout(nb_st_file *f, uint64_t data_size) {
    uint64_t expect = 0;
    for (int i = 0; i < f->n; i++) {
        const nb_st_tensor *t = &f->t[i];
        NB_CHECK(t->offset >= expect, CORRUPT_HINT, "'%s': tensor '%s' (data_offsets from %" PRIu64
                 ") overlaps tensor '%s' (which ends at %" PRIu64 ")", f->path, t->name, t->offset,
                 f->t[i - 1].name, expect);
        NB_CHECK(t->offset == expect, CORRUPT_HINT, "'%s': gap of %" PRIu64 " bytes before tensor '%s'",
                 f->path, t->offset - expect, t->name);
        expect = t->offset + t->nbytes;
    }
    NB_CHECK(expect == data_size, CORRUPT_HINT,
             "'%s': the tensors cover %" PRIu64 " bytes but the data area holds %" PRIu64 " bytes", f->path,
             expect, data_size);
    f->by_name = nb_calloc((size_t)f->n, sizeof *f->by_name, "safetensors index");
    for (int i = 0; i < f->n; i++) f->by_name[i] = &f->t[i];
    qsort(f->by_name, (size_t)f->n, sizeof *f->by_name, cmp_name);
    for (int i = 1; i < f->n; i++)
        NB_CHECK(strcmp(f->by_name[i - 1]->name, f->by_name[i]->name) != 0, CORRUPT_HINT,
                 "'%s': tensor '%s' appears twice in the header", f->path, f->by_name[i]->name);
}

static void parse_header(nb_st_file *f, uint64_t hlen) {
    char err[512], src[PATH_MAX + 16];
    snprintf(src, sizeof src, "%s header", f->path);
    const char *text = (const char *)f->map + 8;
    nb_json *h = nb_json_parse(text, (size_t)hlen, src, err, sizeof err);
    NB_CHECK(h, CORRUPT_HINT, "'%s': invalid JSON in the header: %s", f->path, err);
    NB_CHECK(h->type == NB_JSON_OBJ, CORRUPT_HINT, "'%s': the header must be a JSON object, found %s", f->path,
             nb_json_type_name(h->type));
    uint64_t data_size = f->size - 8 - hlen;
    f->t = nb_calloc(h->len, sizeof *f->t, "safetensors tensors");
    for (size_t i = 0; i < h->len; i++) {
        if (!strcmp(h->keys[i], "__metadata__")) {
            NB_CHECK(!f->mkey, CORRUPT_HINT, "'%s': '__metadata__' appears twice in the header", f->path);
            parse_metadata(f, &h->items[i]);
        } else {
            parse_entry(f, h->keys[i], &h->items[i], data_size, &f->t[f->n++]);
        }
    }
    nb_json_free(h);
    qsort(f->t, (size_t)f->n, sizeof *f->t, cmp_offset);
    check_layout(f, data_size);
    check_checksums(f);
    for (int i = 0; i < f->n; i++) {
        f->t[i].data = f->map + 8 + hlen + f->t[i].offset;
        f->t[i].offset += 8 + hlen;
    }
}

nb_st_file *nb_st_open(const char *path) {
    nb_st_file *f = nb_calloc(1, sizeof *f, "safetensors file");
    f->path = xstrdup(path);
    f->fd = nb_open_input(path, "check the path", &f->size);
    NB_CHECK(f->size >= 8, CORRUPT_HINT, "'%s' is %zu bytes long; a safetensors file has at least 8", path, f->size);
    void *m = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, f->fd, 0);
    NB_CHECK(m != MAP_FAILED, "free some address space or memory", "cannot map '%s': %s", path, strerror(errno));
    f->map = m;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | f->map[i];
    NB_CHECK(hlen <= ST_MAX_HEADER, CORRUPT_HINT, "'%s': header length %" PRIu64 " exceeds the 100 MB limit", path, hlen);
    NB_CHECK(hlen <= f->size - 8, CORRUPT_HINT,
             "'%s': header length %" PRIu64 " goes past the end of the file (%zu bytes)", path, hlen, f->size);
    parse_header(f, hlen);
    return f;
}

void nb_st_close(nb_st_file *f) {
    if (!f) return;
    if (f->map) munmap((void *)f->map, f->size);
    if (f->fd >= 0) close(f->fd);
    for (int i = 0; i < f->n; i++) free((char *)f->t[i].name);
    for (int i = 0; i < f->nmeta; i++) free(f->mkey[i]), free(f->mval[i]);
    for (int i = 0; i < f->ncrc; i++) free(f->crc_name[i]);
    free(f->t);
    free(f->by_name);
    free(f->mkey);
    free(f->mval);
    free(f->crc_name);
    free(f->crc_val);
    free(f->path);
    free(f);
}

const nb_st_tensor *nb_st_find(const nb_st_file *f, const char *name) {
    int lo = 0, hi = f->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(name, f->by_name[mid]->name);
        if (c == 0) return f->by_name[mid];
        if (c < 0) hi = mid - 1;
        else lo = mid + 1;
    }
    return NULL;
}

static const nb_st_tensor *need(const nb_st_file *f, const char *name, nb_dtype dtype) {
    const nb_st_tensor *t = nb_st_find(f, name);
    NB_CHECK(t, MISMATCH_HINT, "tensor '%s' not found in '%s' (it holds %d tensors)", name, f->path, f->n);
    NB_CHECK(t->dtype == dtype, MISMATCH_HINT, "tensor '%s' in '%s' is %s, expected %s", name, f->path,
             nb_dtype_name(t->dtype), nb_dtype_name(dtype));
    return t;
}

static void copy_checked(const nb_st_file *f, const nb_st_tensor *t, void *dst) {
    if (!t->has_crc) {
        if (t->nbytes) memcpy(dst, t->data, t->nbytes);
        return;
    }
    uint32_t crc = nb_crc32c_par(dst, t->data, t->nbytes);
    NB_CHECK(crc == t->crc32c, DAMAGED_HINT, "checksum mismatch in tensor '%s' of '%s': the file is damaged", t->name,
             f->path);
}

void nb_st_verify(const nb_st_file *f, const nb_st_tensor *t) {
    if (!t->has_crc) return;
    NB_CHECK(nb_crc32c_par(NULL, t->data, t->nbytes) == t->crc32c, DAMAGED_HINT,
             "checksum mismatch in tensor '%s' of '%s': the file is damaged", t->name, f->path);
}

void nb_st_read_into(const nb_st_file *f, const char *name, nb_dtype dtype, int64_t numel, void *dst) {
    const nb_st_tensor *t = need(f, name, dtype);
    char s[128];
    NB_CHECK(t->numel == numel, MISMATCH_HINT,
             "tensor '%s' in '%s' has %" PRId64 " elements (shape %s), expected %" PRId64, name, f->path,
             t->numel, nb_st_shape_str(s, sizeof s, t->ndim, t->shape), numel);
    copy_checked(f, t, dst);
}

void nb_st_read_shaped(const nb_st_file *f, const char *name, nb_dtype dtype, int ndim, const int64_t *shape,
                       void *dst) {
    const nb_st_tensor *t = need(f, name, dtype);
    int same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = t->shape[i] == shape[i];
    char a[128], b[128];
    NB_CHECK(same, MISMATCH_HINT, "tensor '%s' in '%s' has shape %s, expected %s", name, f->path,
             nb_st_shape_str(a, sizeof a, t->ndim, t->shape), nb_st_shape_str(b, sizeof b, ndim, shape));
    copy_checked(f, t, dst);
}
