/* Deterministic mutations of one input file, for tests/fuzz_test.sh.
 *
 *   mutate KIND SEED COUNT IN OUTDIR   writes OUTDIR/000 .. OUTDIR/<COUNT-1> and prints one line per
 *                                      case: "NNN MUST_REJECT description"
 *   mutate shard-gen N VOCAB SEED OUT  writes an llm.c token shard of N ids below VOCAB
 *   mutate edit IN OUT KEY VALUE [N]   sets the N-th member KEY of a JSON file to VALUE
 *
 * KIND: shard, safetensors, json, tsv, criteo-bin, text. Every kind gets the generic mutations
 * (bit flips, byte inserts and deletes, truncation, extension, overwrites) and its own: header
 * fields set to edge values (huge, negative, off by one), JSON values replaced by NaN, inf,
 * huge or float numbers, duplicate keys, deep nesting, odd strings (also inside a safetensors
 * header, re-framed with its new length), token ids past the vocabulary, Criteo fields and lines
 * broken, invalid UTF-8. MUST_REJECT is 1 when a correct reader has to refuse the result: any
 * change to a safetensors file (nobubble's carry checksums), a change of size of a shard or a
 * Criteo binary file (their headers give the size). The same SEED gives the same cases. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    unsigned char *p;
    size_t n, cap;
} buf;

static uint64_t rs;
static uint64_t rnd(void) { /* xorshift64* */
    rs ^= rs >> 12, rs ^= rs << 25, rs ^= rs >> 27;
    return rs * 2685821657736338717ull;
}
static size_t below(size_t n) { return n ? (size_t)(rnd() % n) : 0; }

static void reserve(buf *b, size_t n) {
    if (n <= b->cap) return;
    b->cap = n * 2 + 64;
    b->p = realloc(b->p, b->cap);
    if (!b->p) exit(3);
}
static void insert(buf *b, size_t at, const void *s, size_t k) {
    reserve(b, b->n + k);
    memmove(b->p + at + k, b->p + at, b->n - at);
    memcpy(b->p + at, s, k);
    b->n += k;
}
static void erase(buf *b, size_t at, size_t k) {
    if (at + k > b->n) k = b->n - at;
    memmove(b->p + at, b->p + at + k, b->n - at - k);
    b->n -= k;
}
static void replace(buf *b, size_t at, size_t k, const char *s) {
    erase(b, at, k);
    insert(b, at, s, strlen(s));
}

/* ---- generic mutations ---- */

static void generic(buf *b, char *d, size_t dc) {
    size_t at = below(b->n);
    switch (below(6)) {
    case 0: {
        int k = 1 + (int)below(4);
        for (int i = 0; i < k && b->n; i++) b->p[below(b->n)] ^= (unsigned char)(1u << below(8));
        snprintf(d, dc, "flip %d bit(s)", k);
        break;
    }
    case 1: {
        unsigned char s[16];
        size_t k = 1 + below(16);
        for (size_t i = 0; i < k; i++) s[i] = (unsigned char)rnd();
        insert(b, at, s, k);
        snprintf(d, dc, "insert %zu bytes at %zu", k, at);
        break;
    }
    case 2: {
        size_t k = 1 + below(16);
        erase(b, at, k);
        snprintf(d, dc, "delete %zu bytes at %zu", k, at);
        break;
    }
    case 3: {
        size_t to = below(4) == 0 ? below(16) : below(b->n);
        b->n = to;
        snprintf(d, dc, "truncate to %zu bytes", to);
        break;
    }
    case 4: {
        size_t k = 1 + below(4096);
        int zero = (int)below(2);
        reserve(b, b->n + k);
        for (size_t i = 0; i < k; i++) b->p[b->n + i] = zero ? 0 : (unsigned char)rnd();
        b->n += k;
        snprintf(d, dc, "append %zu %s bytes", k, zero ? "zero" : "random");
        break;
    }
    default: {
        size_t k = 1 + below(8);
        int v = below(2) ? 0xff : 0;
        for (size_t i = 0; i < k && at + i < b->n; i++) b->p[at + i] = (unsigned char)v;
        snprintf(d, dc, "overwrite %zu bytes at %zu with 0x%02x", k, at, v);
    }
    }
}

/* ---- JSON text mutations ---- */

typedef struct {
    size_t at, len;
} span;

/* Numbers (and literals) and strings outside strings, by a light scan. */
static size_t scan(const buf *b, span *nums, span *strs, size_t cap, size_t *nstr) {
    size_t nn = 0, ns = 0;
    for (size_t i = 0; i < b->n;) {
        unsigned char c = b->p[i];
        if (c == '"') {
            size_t j = i + 1;
            while (j < b->n && b->p[j] != '"') j += b->p[j] == '\\' ? 2 : 1;
            if (ns < cap) strs[ns++] = (span){i, (j < b->n ? j + 1 : b->n) - i};
            i = j + 1;
        } else if (c == '-' || (c >= '0' && c <= '9') || c == 't' || c == 'f' || c == 'n' || c == 'N' || c == 'I') {
            size_t j = i;
            while (j < b->n && strchr("-+.eE0123456789truefalsnNaIiy", b->p[j]) && b->p[j]) j++;
            if (nn < cap && j > i) nums[nn++] = (span){i, j - i};
            i = j > i ? j : i + 1;
        } else {
            i++;
        }
    }
    *nstr = ns;
    return nn;
}

static const char *num_values[] = {"-1", "0", "1", "NaN", "Infinity", "-Infinity", "1e308", "-1e308", "1e-320",
                                   "18446744073709551616", "9223372036854775807", "-9223372036854775808",
                                   "2147483648", "50304.0", "1.5", "1e3", "null", "true", "\"7\"", "[]", "{}"};
static const char *str_values[] = {"\"\"", "\"F64\"", "\"BF16\"", "\"U8\"", "\"I32\"", "\"\\ud800\"", "\"\xff\"",
                                   "\"../../nope\"", "\"gpt2-tiny\"", "\"llama\"", "\"plain\"", "\"erase\"", "\"a\\u0000b\"",
                                   "\"nobubble-checkpoint\"", "7", "null", "{\"a\":1}"};

/* " (key \"lr\")" when the value at `at` is a member's, for the case's description. */
static void key_before(const buf *b, size_t at, char *out, size_t cap) {
    out[0] = '\0';
    size_t i = at;
    while (i > 0 && (b->p[i - 1] == ' ' || b->p[i - 1] == ':')) i--;
    if (i == 0 || b->p[i - 1] != '"' || i == at) return;
    size_t e = --i;
    while (i > 0 && b->p[i - 1] != '"') i--;
    if (i == 0 || e - i > 40) return;
    snprintf(out, cap, " (key %.*s)", (int)(e - i), (const char *)b->p + i);
}

/* One mutation of JSON text; returns 0 when the text has nothing it applies to. */
static int json_mutation(buf *b, char *d, size_t dc) {
    static span nums[4096], strs[4096];
    size_t ns, nn = scan(b, nums, strs, 4096, &ns);
    int m = (int)below(6);
    if (m == 5 && nn) { /* a member's value: the number after a key, the likeliest to be trusted */
        size_t k = below(nn), tries = 0;
        while (tries++ < nn && !(nums[k].at >= 2 && b->p[nums[k].at - 1] == ' ' && b->p[nums[k].at - 2] == ':' ))
            k = (k + 1) % nn;
        m = 0, nums[0] = nums[k], nn = 1;
    }
    if (m == 0 && nn) {
        span s = nums[below(nn)];
        const char *v = num_values[below(sizeof num_values / sizeof *num_values)];
        if (strlen(v) == s.len && !memcmp(b->p + s.at, v, s.len)) v = "-7";
        char key[64];
        key_before(b, s.at, key, sizeof key);
        snprintf(d, dc, "number at %zu%s -> %s", s.at, key, v);
        replace(b, s.at, s.len, v);
        return 1;
    }
    if (m == 1 && ns) { /* a key of an object, or any string */
        span s = strs[below(ns)];
        const char *v = str_values[below(sizeof str_values / sizeof *str_values)];
        if (strlen(v) == s.len && !memcmp(b->p + s.at, v, s.len)) v = "\"zz\"";
        snprintf(d, dc, "string at %zu -> %s", s.at, v);
        replace(b, s.at, s.len, v);
        return 1;
    }
    if (m == 2) { /* the first key of some object, repeated at its front */
        size_t opens[1024], no = 0;
        for (size_t i = 0; i + 1 < b->n && no < 1024; i++)
            if (b->p[i] == '{' && b->p[i + 1] == '"') opens[no++] = i;
        if (!no) return 0;
        size_t at = opens[below(no)], j = at + 2;
        while (j < b->n && b->p[j] != '"') j++;
        char ins[300];
        int k = snprintf(ins, sizeof ins, "%.*s:0,", (int)(j + 1 - (at + 1) < 200 ? j + 1 - (at + 1) : 200),
                         (const char *)b->p + at + 1);
        insert(b, at + 1, ins, (size_t)k);
        snprintf(d, dc, "duplicate key %.40s at %zu", ins, at);
        return 1;
    }
    if (m == 3 && nn) {
        static const size_t depths[] = {65, 1000, 100000};
        size_t depth = depths[below(3)];
        span s = nums[below(nn)];
        char *v = malloc(2 * depth + 2);
        memset(v, '[', depth);
        v[depth] = '1';
        memset(v + depth + 1, ']', depth);
        v[2 * depth + 1] = '\0';
        replace(b, s.at, s.len, v);
        free(v);
        snprintf(d, dc, "number at %zu -> nested %zu deep", s.at, depth);
        return 1;
    }
    if (m == 4 && b->n > 2) { /* cut out what lies between two commas */
        size_t a = below(b->n), c = a + 1;
        while (a < b->n && b->p[a] != ',') a++;
        c = a + 1;
        while (c < b->n && b->p[c] != ',' && b->p[c] != '}') c++;
        if (a >= b->n) return 0;
        erase(b, a, c - a);
        snprintf(d, dc, "delete %zu bytes of members at %zu", c - a, a);
        return 1;
    }
    return 0;
}

static void json_case(buf *b, char *d, size_t dc) {
    if (below(5) == 0 || !json_mutation(b, d, dc)) generic(b, d, dc);
}

/* ---- kinds ---- */

static void put32(buf *b, size_t at, int32_t v) {
    if (at + 4 <= b->n) memcpy(b->p + at, &v, 4);
}
static void put64(buf *b, size_t at, uint64_t v) {
    if (at + 8 <= b->n) memcpy(b->p + at, &v, 8);
}

static void shard_case(buf *b, char *d, size_t dc) {
    int32_t count = 0;
    if (b->n >= 12) memcpy(&count, b->p + 8, 4);
    switch (below(3)) {
    case 0: {
        const int32_t vals[] = {-1, 0, 1, 2, 7, INT32_MAX, count + 1, count - 1, 20240520};
        size_t f = below(3);
        int32_t v = vals[below(sizeof vals / sizeof *vals)];
        put32(b, 4 * f, v);
        snprintf(d, dc, "header int %zu -> %d", f, (int)v);
        break;
    }
    case 1: {
        const uint16_t vals[] = {511, 512, 65535, 50256};
        uint16_t v = vals[below(4)];
        size_t at = 1024 + 2 * below(count > 0 ? (size_t)count : 1);
        if (at + 2 <= b->n) memcpy(b->p + at, &v, 2);
        snprintf(d, dc, "token at byte %zu -> %u", at, v);
        break;
    }
    default:
        generic(b, d, dc);
    }
}

static void safetensors_case(buf *b, char *d, size_t dc) {
    uint64_t hlen = 0;
    if (b->n >= 8) memcpy(&hlen, b->p, 8);
    int ok = b->n >= 8 && hlen <= b->n - 8;
    switch (ok ? below(4) : 3) {
    case 0: {
        const uint64_t vals[] = {0, 1, 7, hlen - 1, hlen + 1, hlen + 8, b->n, (uint64_t)1 << 40, (uint64_t)1 << 63, UINT64_MAX};
        uint64_t v = vals[below(sizeof vals / sizeof *vals)];
        put64(b, 0, v);
        snprintf(d, dc, "header length %llu -> %llu", (unsigned long long)hlen, (unsigned long long)v);
        break;
    }
    case 1: { /* the header's JSON, re-framed with its new length */
        buf h = {0};
        insert(&h, 0, b->p + 8, hlen);
        json_case(&h, d, dc);
        buf out = {0};
        uint64_t n = h.n;
        insert(&out, 0, &n, 8);
        insert(&out, 8, h.p, h.n);
        insert(&out, out.n, b->p + 8 + hlen, b->n - 8 - hlen);
        free(b->p);
        *b = out;
        free(h.p);
        size_t k = strlen(d);
        snprintf(d + k, dc - k, " (in the header)");
        break;
    }
    case 2: {
        size_t data = b->n - 8 - hlen;
        if (!data) {
            generic(b, d, dc);
            break;
        }
        size_t at = 8 + hlen + below(data);
        b->p[at] ^= (unsigned char)(1u << below(8));
        snprintf(d, dc, "flip a bit of tensor data at %zu", at);
        break;
    }
    default:
        generic(b, d, dc);
    }
}

static void criteo_bin_case(buf *b, char *d, size_t dc) {
    if (below(2)) {
        generic(b, d, dc);
        return;
    }
    uint64_t count = 0;
    if (b->n >= 32) memcpy(&count, b->p + 24, 8);
    struct { size_t at; int wide; const char *name; } f[] = {{8, 0, "version"}, {12, 0, "layout"}, {16, 0, "record_bytes"},
                                                           {20, 0, "reserved"}, {24, 1, "count"}, {32, 1, "positives"}};
    size_t i = below(6);
    const uint64_t vals[] = {0, 1, 2, 3, 104, count + 1, count - 1, UINT64_MAX, (uint64_t)1 << 60};
    uint64_t v = vals[below(sizeof vals / sizeof *vals)];
    if (f[i].wide) put64(b, f[i].at, v);
    else put32(b, f[i].at, (int32_t)v);
    snprintf(d, dc, "header %s -> %llu", f[i].name, (unsigned long long)v);
}

static void tsv_case(buf *b, char *d, size_t dc) {
    if (below(4) == 0 || !b->n) {
        generic(b, d, dc);
        return;
    }
    size_t starts[4096], nl = 0;
    starts[nl++] = 0;
    for (size_t i = 0; i + 1 < b->n && nl < 4096; i++)
        if (b->p[i] == '\n') starts[nl++] = i + 1;
    size_t l = starts[below(nl)], e = l;
    while (e < b->n && b->p[e] != '\n') e++;
    size_t tabs[64], nt = 0;
    for (size_t i = l; i < e && nt < 64; i++)
        if (b->p[i] == '\t') tabs[nt++] = i;
    static const char *fields[] = {"", "-1", "99999999999999999999", "nan", "1e400", "zzzz", "\xff\xfe", "0x10", " 1",
                                   "-9223372036854775809", "ffffffffff", "4294967295", "2147483647"};
    switch (below(6)) {
    case 0:
        if (nt) {
            size_t t = tabs[below(nt)];
            erase(b, t, 1);
            snprintf(d, dc, "line at %zu: a field fewer", l);
            break;
        }
        /* fall through */
    case 1: {
        const char *v = fields[below(sizeof fields / sizeof *fields)];
        size_t a = nt ? tabs[below(nt)] + 1 : l, z = a;
        while (z < e && b->p[z] != '\t') z++;
        replace(b, a, z - a, v);
        snprintf(d, dc, "line at %zu: a field -> '%s'", l, v);
        break;
    }
    case 2:
        insert(b, e, "\t1\t2\t3\t4\t5\t6\t7\t8\t9\t10", 21);
        snprintf(d, dc, "line at %zu: 10 fields more", l);
        break;
    case 3: {
        size_t k = 100000;
        char *run = malloc(k);
        memset(run, 'a', k);
        insert(b, l, run, k);
        free(run);
        snprintf(d, dc, "line at %zu: 100 KB longer", l);
        break;
    }
    case 4:
        insert(b, e, "\r", 1);
        insert(b, l, "\n\n", 2);
        snprintf(d, dc, "line at %zu: CRLF and empty lines", l);
        break;
    default:
        insert(b, l + (e > l ? below(e - l) : 0), "\0", 1);
        snprintf(d, dc, "line at %zu: a NUL byte", l);
    }
}

static void text_case(buf *b, char *d, size_t dc) {
    static const char *bad[] = {"\xff", "\xc3", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xe2\x82", "\0"};
    size_t at = below(b->n + 1);
    switch (below(3)) {
    case 0: {
        const char *s = bad[below(6)];
        size_t k = s[0] ? strlen(s) : 1;
        insert(b, at, s, k);
        snprintf(d, dc, "insert invalid UTF-8 (%zu bytes) at %zu", k, at);
        break;
    }
    case 1: {
        size_t k = 1000 + below(20000);
        char *run = malloc(k);
        for (size_t i = 0; i < k; i++) run[i] = (char)('a' + below(3));
        insert(b, at, run, k);
        free(run);
        snprintf(d, dc, "insert a %zu-byte word at %zu", k, at);
        break;
    }
    default:
        generic(b, d, dc);
    }
}

static buf load(const char *path) {
    buf b = {0};
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        exit(2);
    }
    unsigned char chunk[65536];
    size_t k;
    while ((k = fread(chunk, 1, sizeof chunk, f)) > 0) insert(&b, b.n, chunk, k);
    fclose(f);
    return b;
}

static void save(const char *path, const buf *b) {
    FILE *f = fopen(path, "wb");
    if (!f || (b->n && fwrite(b->p, 1, b->n, f) != b->n) || fclose(f) != 0) {
        perror(path);
        exit(2);
    }
}

static int shard_gen(int argc, char **argv) {
    if (argc != 6) return 2;
    size_t n = strtoull(argv[2], NULL, 10), vocab = strtoull(argv[3], NULL, 10);
    rs = strtoull(argv[4], NULL, 10) | 1;
    buf b = {0};
    int32_t h[256] = {20240520, 1, (int32_t)n};
    insert(&b, 0, h, sizeof h);
    for (size_t i = 0; i < n; i++) {
        uint16_t t = (uint16_t)below(vocab);
        insert(&b, b.n, &t, 2);
    }
    save(argv[5], &b);
    free(b.p);
    return 0;
}

/* mutate edit IN OUT KEY VALUE [N]: the value of the N-th (default 1st) member named KEY set to
 * the JSON text VALUE. */
static int edit(int argc, char **argv) {
    if (argc < 6) return 2;
    buf b = load(argv[2]);
    char pat[128];
    snprintf(pat, sizeof pat, "\"%s\":", argv[4]);
    int nth = argc > 6 ? atoi(argv[6]) : 1;
    size_t at = 0;
    for (int k = 0; k < nth; k++) {
        unsigned char *hit = NULL;
        for (size_t i = at; i + strlen(pat) <= b.n && !hit; i++)
            if (!memcmp(b.p + i, pat, strlen(pat))) hit = b.p + i;
        if (!hit) {
            fprintf(stderr, "no member %s (#%d)\n", argv[4], k + 1);
            return 1;
        }
        at = (size_t)(hit - b.p) + strlen(pat);
    }
    while (at < b.n && b.p[at] == ' ') at++;
    size_t e = at;
    if (e < b.n && b.p[e] == '"') {
        e++;
        while (e < b.n && b.p[e] != '"') e += b.p[e] == '\\' ? 2 : 1;
        e++;
    } else {
        while (e < b.n && !strchr(",}]\n", b.p[e])) e++;
    }
    replace(&b, at, e - at, argv[5]);
    save(argv[3], &b);
    free(b.p);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "shard-gen")) return shard_gen(argc, argv);
    if (argc >= 2 && !strcmp(argv[1], "edit")) return edit(argc, argv);
    if (argc != 6) {
        fprintf(stderr, "usage: mutate KIND SEED COUNT IN OUTDIR | mutate shard-gen N VOCAB SEED OUT\n");
        return 2;
    }
    const char *kind = argv[1];
    void (*fn)(buf *, char *, size_t) = !strcmp(kind, "shard") ? shard_case
                                        : !strcmp(kind, "safetensors") ? safetensors_case
                                        : !strcmp(kind, "json") ? json_case
                                        : !strcmp(kind, "tsv") ? tsv_case
                                        : !strcmp(kind, "criteo-bin") ? criteo_bin_case
                                        : !strcmp(kind, "text") ? text_case : NULL;
    if (!fn) {
        fprintf(stderr, "unknown kind '%s'\n", kind);
        return 2;
    }
    uint64_t seed = strtoull(argv[2], NULL, 10);
    int count = atoi(argv[3]);
    buf orig = load(argv[4]);
    for (int i = 0; i < count; i++) {
        rs = (seed + 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1)) | 1;
        for (const char *k = kind; *k; k++) rs = (rs ^ (unsigned char)*k) * 0x100000001B3ull | 1;
        buf b = {0};
        insert(&b, 0, orig.p, orig.n);
        char d[256] = "";
        fn(&b, d, sizeof d);
        if (b.n == orig.n && !memcmp(b.p, orig.p, b.n)) { /* no change: flip one bit */
            if (b.n) b.p[below(b.n)] ^= 1;
            size_t k = strlen(d);
            snprintf(d + k, sizeof d - k, " + flip 1 bit");
        }
        int changed = b.n != orig.n || memcmp(b.p, orig.p, b.n);
        int must_reject = !strcmp(kind, "safetensors") ? changed
                          : !strcmp(kind, "shard") || !strcmp(kind, "criteo-bin") ? b.n != orig.n : 0;
        char path[4096];
        snprintf(path, sizeof path, "%s/%03d", argv[5], i);
        save(path, &b);
        for (char *c = d; *c; c++)
            if ((unsigned char)*c < 0x20 || (unsigned char)*c >= 0x7f) *c = '?'; /* one printable line */
        printf("%03d %d %s\n", i, must_reject, d);
        free(b.p);
    }
    free(orig.p);
    return 0;
}
