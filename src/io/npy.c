/* .npy / .npz reading in place and writing (see npy.h). */
#include "io/npy.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core.h"
#include "io/atomic.h"

#define NPY_HINT "pass the reference's preprocessed files (.npy arrays, .npz of stored .npy members)"

void nb_npy_map(nb_npy_file *f, const char *path) {
    memset(f, 0, sizeof *f);
    snprintf(f->path, sizeof f->path, "%s", path);
    int fd = open(path, O_RDONLY);
    NB_CHECK(fd >= 0, "check the path (--data mlperf:DIR reads DIR/day_N_*.npy / .npz)", "cannot open %s: %s", path,
             strerror(errno));
    struct stat st;
    NB_CHECK(fstat(fd, &st) == 0, NPY_HINT, "cannot stat %s: %s", path, strerror(errno));
    f->size = (size_t)st.st_size;
    if (f->size) {
        void *p = mmap(NULL, f->size, PROT_READ, MAP_SHARED, fd, 0);
        NB_CHECK(p != MAP_FAILED, NPY_HINT, "cannot map %s: %s", path, strerror(errno));
        f->base = p;
    }
    close(fd);
}

void nb_npy_unmap(nb_npy_file *f) {
    if (f->base) munmap((void *)f->base, f->size);
    f->base = NULL;
}

static uint16_t u16(const unsigned char *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t u32(const unsigned char *p) { return (uint32_t)u16(p) | (uint32_t)u16(p + 2) << 16; }
static uint64_t u64(const unsigned char *p) { return (uint64_t)u32(p) | (uint64_t)u32(p + 4) << 32; }

/* The value after 'key': in the header dict (NULL when absent). */
static const char *dict_value(const char *h, const char *key) {
    char k[32];
    snprintf(k, sizeof k, "'%s':", key);
    const char *p = strstr(h, k);
    if (!p) return NULL;
    p += strlen(k);
    while (*p == ' ') p++;
    return p;
}

void nb_npy_parse(const nb_npy_file *f, size_t at, size_t len, const char *what, nb_npy *out) {
    memset(out, 0, sizeof *out);
    const unsigned char *p = f->base + at;
    NB_CHECK(len >= 10 && !memcmp(p, "\x93NUMPY", 6), NPY_HINT, "%s: not a .npy file (no \\x93NUMPY magic)", what);
    int major = p[6];
    NB_CHECK(major >= 1 && major <= 3, NPY_HINT, "%s: .npy format version %d.%d (1.0 to 3.0 are read)", what, major, p[7]);
    size_t hl = major == 1 ? u16(p + 8) : (len >= 12 ? u32(p + 8) : (size_t)-1), hs = major == 1 ? 10 : 12;
    NB_CHECK(hl < 65536 && hs + hl <= len, NPY_HINT, "%s: a .npy header of %zu bytes in %zu", what, hl, len);
    char h[65536];
    memcpy(h, p + hs, hl);
    h[hl] = 0;
    const char *d = dict_value(h, "descr"), *fo = dict_value(h, "fortran_order"), *sh = dict_value(h, "shape");
    NB_CHECK(d && fo && sh && *d == '\'' && *sh == '(', NPY_HINT, "%s: a .npy header without descr, fortran_order and shape: %.200s",
             what, h);
    size_t dl = strcspn(d + 1, "'");
    NB_CHECK(dl < sizeof out->descr, NPY_HINT, "%s: dtype '%.20s'", what, d + 1);
    memcpy(out->descr, d + 1, dl);
    NB_CHECK(!strncmp(fo, "False", 5), "write the arrays in C order (np.save's default)", "%s: a Fortran-order array", what);
    const char *q = sh + 1;
    int64_t dims[3];
    int nd = 0;
    while (nd < 3) {
        while (*q == ' ') q++;
        if (*q == ')') break;
        char *end;
        long long v = strtoll(q, &end, 10);
        NB_CHECK(end != q && v >= 0, NPY_HINT, "%s: shape %.40s", what, sh);
        dims[nd++] = v;
        q = end;
        while (*q == ' ') q++;
        if (*q == ',') q++;
    }
    NB_CHECK(nd == 1 || nd == 2, "pass 1-D or 2-D arrays", "%s: a %d-D array (shape %.40s)", what, nd, sh);
    out->ndim = nd;
    out->shape[0] = dims[0];
    out->shape[1] = nd == 2 ? dims[1] : 1;
    NB_CHECK(out->descr[0] == '<' || out->descr[0] == '|', "write little-endian arrays", "%s: dtype %s", what, out->descr);
    size_t es = (size_t)atoi(out->descr + 2);
    NB_CHECK(es >= 1 && es <= 8, NPY_HINT, "%s: dtype %s", what, out->descr);
    double need = (double)out->shape[0] * (double)out->shape[1] * (double)es;
    NB_CHECK(need <= (double)(len - hs - hl), "the file is truncated or damaged: write it again",
             "%s: %zu bytes of data, the header's shape needs %.0f", what, len - hs - hl, need);
    out->data = p + hs + hl;
}

/* The end of central directory record (and its zip64 form): the central directory's place. */
static void zip_directory(const nb_npy_file *f, uint64_t *cd_off, uint64_t *entries) {
    const unsigned char *b = f->base;
    size_t n = f->size, lo = n > 65557 ? n - 65557 : 0, e = (size_t)-1;
    for (size_t i = n >= 22 ? n - 22 : 0; n >= 22 && i + 1 > lo; i--)
        if (u32(b + i) == 0x06054b50u) {
            e = i;
            break;
        }
    NB_CHECK(e != (size_t)-1, NPY_HINT, "%s: not a .npz (zip) archive", f->path);
    *entries = u16(b + e + 10);
    *cd_off = u32(b + e + 16);
    if ((*cd_off == 0xFFFFFFFFu || *entries == 0xFFFF) && e >= 20 && u32(b + e - 20) == 0x07064b50u) {
        uint64_t z = u64(b + e - 20 + 8);
        NB_CHECK(z + 56 <= n && u32(b + z) == 0x06064b50u, NPY_HINT, "%s: a damaged zip64 directory", f->path);
        *entries = u64(b + z + 32);
        *cd_off = u64(b + z + 48);
    }
    NB_CHECK(*cd_off < n, NPY_HINT, "%s: a damaged zip directory", f->path);
}

int nb_npz_member(const nb_npy_file *f, const char *name, size_t *at, size_t *len) {
    const unsigned char *b = f->base;
    uint64_t off, entries;
    zip_directory(f, &off, &entries);
    size_t nl = strlen(name);
    for (uint64_t k = 0; k < entries; k++) {
        NB_CHECK(off + 46 <= f->size && u32(b + off) == 0x02014b50u, NPY_HINT, "%s: a damaged zip directory entry", f->path);
        uint16_t method = u16(b + off + 10), fl = u16(b + off + 28), xl = u16(b + off + 30), cl = u16(b + off + 32);
        uint64_t size = u32(b + off + 24), local = u32(b + off + 42);
        NB_CHECK(off + 46 + fl + xl <= f->size, NPY_HINT, "%s: a damaged zip directory entry", f->path);
        if (fl == nl && !memcmp(b + off + 46, name, nl)) {
            /* zip64: the fields that overflowed, in order, in extra block 0x0001 */
            for (const unsigned char *x = b + off + 46 + fl, *xe = x + xl; x + 4 <= xe; x += 4 + u16(x + 2)) {
                if (u16(x) != 1) continue;
                const unsigned char *v = x + 4;
                if (size == 0xFFFFFFFFu) size = u64(v), v += 8;
                if (u32(b + off + 20) == 0xFFFFFFFFu) v += 8;
                if (local == 0xFFFFFFFFu) local = u64(v);
            }
            NB_CHECK(method == 0, "save the arrays with np.savez (stored), not np.savez_compressed",
                     "%s: member %s is compressed (method %u)", f->path, name, method);
            NB_CHECK(local + 30 <= f->size && u32(b + local) == 0x04034b50u, NPY_HINT, "%s: member %s: a damaged local header",
                     f->path, name);
            uint64_t data = local + 30 + u16(b + local + 26) + u16(b + local + 28);
            NB_CHECK(data + size <= f->size, "the file is truncated or damaged: write it again",
                     "%s: member %s ends at byte %llu of %zu", f->path, name, (unsigned long long)(data + size), f->size);
            *at = (size_t)data, *len = (size_t)size;
            return 1;
        }
        off += 46 + (uint64_t)fl + xl + cl;
    }
    return 0;
}

/* ---- writing ---- */

size_t nb_npy_encode(unsigned char *buf, const char *descr, int ndim, int64_t n, int64_t k, const void *data, size_t es) {
    char h[128];
    int hl = ndim == 1 ? snprintf(h, sizeof h, "{'descr': '%s', 'fortran_order': False, 'shape': (%lld,), }", descr, (long long)n)
                       : snprintf(h, sizeof h, "{'descr': '%s', 'fortran_order': False, 'shape': (%lld, %lld), }", descr,
                                  (long long)n, (long long)k);
    size_t total_h = ((size_t)10 + (size_t)hl + 1 + 63) / 64 * 64; /* magic .. '\n' padded to 64 */
    size_t bytes = (size_t)n * (size_t)k * es;
    if (!buf) return total_h + bytes;
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    buf[8] = (unsigned char)((total_h - 10) & 0xff), buf[9] = (unsigned char)((total_h - 10) >> 8);
    memset(buf + 10, ' ', total_h - 10);
    memcpy(buf + 10, h, (size_t)hl);
    buf[total_h - 1] = '\n';
    memcpy(buf + total_h, data, bytes);
    return total_h + bytes;
}

static uint32_t crc32_zip(const unsigned char *p, size_t n) {
    static uint32_t table[256];
    static int ready;
    if (!ready) {
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
            table[i] = c;
        }
        ready = 1;
    }
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) c = table[(c ^ p[i]) & 0xff] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

static void put16(unsigned char *p, unsigned v) { p[0] = (unsigned char)v, p[1] = (unsigned char)(v >> 8); }
static void put32(unsigned char *p, uint32_t v) { put16(p, v & 0xffff), put16(p + 2, v >> 16); }

void nb_npz_write(const char *path, int count, const char *const *names, const unsigned char *const *bytes,
                  const size_t *lens) {
    double total = 22;
    for (int i = 0; i < count; i++) total += 76.0 + 2.0 * (double)strlen(names[i]) + (double)lens[i];
    NB_CHECK(total < 4294967295.0 && count < 65535, "write fewer samples per file", "%s: %.0f bytes need zip64", path, total);
    char tmp[4200];
    FILE *f = nb_atomic_open(path, tmp, sizeof tmp);
    unsigned char *cd = nb_calloc((size_t)count, 46 + 64, "npz directory");
    size_t cdl = 0, off = 0;
    for (int i = 0; i < count; i++) {
        unsigned char h[30] = {0}, *c = cd + cdl;
        size_t nl = strlen(names[i]);
        NB_ASSERT(nl < 64);
        uint32_t crc = crc32_zip(bytes[i], lens[i]);
        put32(h, 0x04034b50u), put16(h + 4, 20), put32(h + 14, crc), put32(h + 18, (uint32_t)lens[i]),
            put32(h + 22, (uint32_t)lens[i]), put16(h + 26, (unsigned)nl);
        memset(c, 0, 46);
        put32(c, 0x02014b50u), put16(c + 4, 20), put16(c + 6, 20), put32(c + 16, crc), put32(c + 20, (uint32_t)lens[i]),
            put32(c + 24, (uint32_t)lens[i]), put16(c + 28, (unsigned)nl), put32(c + 42, (uint32_t)off);
        memcpy(c + 46, names[i], nl);
        cdl += 46 + nl;
        nb_atomic_write(f, tmp, path, h, 30);
        nb_atomic_write(f, tmp, path, names[i], nl);
        nb_atomic_write(f, tmp, path, bytes[i], lens[i]);
        off += 30 + nl + lens[i];
    }
    unsigned char e[22] = {0};
    put32(e, 0x06054b50u), put16(e + 8, (unsigned)count), put16(e + 10, (unsigned)count), put32(e + 12, (uint32_t)cdl),
        put32(e + 16, (uint32_t)off);
    nb_atomic_write(f, tmp, path, cd, cdl);
    nb_atomic_write(f, tmp, path, e, 22);
    free(cd);
    nb_atomic_commit(f, tmp, path);
}
