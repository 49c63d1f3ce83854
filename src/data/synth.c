/* Synthetic click data: see synth.h for the model of the data and the options. */
#include "data/synth.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "rng.h"

const uint32_t nb_synth_criteo_card[NB_SYNTH_NCAT] = {
    1460, 583,  10131227, 2202608, 305, 24,      12517, 633, 3,  93145,  5683, 8351593, 3194,
    27,   14992, 5461306, 10,      5652, 2173,   4,     7046547, 18, 15, 286181, 105, 142572};

/* MLPerf DLRM-DCNv2's tables (its reference's --num_embeddings_per_feature, capped at 40M there)
 * and multi-hot sizes (--multi_hot_sizes). */
const uint32_t nb_synth_mlperf_rows[NB_SYNTH_NCAT] = {
    40000000, 39060, 17295, 7424, 20265, 3,        7122,     1543,     63,     40000000, 3067956, 405282, 10,
    2209,     11938, 155,   4,    976,   14,       40000000, 40000000, 40000000, 590152, 12973,   108,    36};
const int nb_synth_mlperf_hot[NB_SYNTH_NCAT] = {3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1};

/* Dense counts x = floor(exp(mu + sigma z)) and missing rates, shaped after Criteo's I1..I13
 * (small counts for most, a few wide ones like I5). Only the shape matters, not the exact
 * values: the model sees log(1 + x). */
static const float dense_mu[NB_SYNTH_NDENSE] = {0.5f, 2.0f, 1.5f, 1.5f, 7.0f, 3.0f, 1.5f,
                                                2.0f, 3.5f, 0.0f, 0.8f, -0.5f, 1.5f};
static const float dense_sigma[NB_SYNTH_NDENSE] = {1.2f, 2.0f, 1.5f, 1.0f, 2.0f, 1.6f, 1.5f,
                                                   1.0f, 1.3f, 0.6f, 1.0f, 1.5f, 1.1f};
static const float criteo_missing[NB_SYNTH_NDENSE] = {0.45f, 0.0f,  0.21f, 0.22f, 0.03f,
                                                      0.22f, 0.04f, 0.0005f, 0.04f, 0.45f,
                                                      0.04f, 0.77f, 0.22f};

/* Teacher strengths. With these the teacher's logit has a standard deviation of about 1.5,
 * so its own AUC is about 0.8: a model has something to learn in every input part. */
#define CAT_W 0.25
#define CROSS_W 0.3
#define DENSE_W 0.15
#define TARGET_W 0.3
#define AFF_W 3.0
/* Field pairs whose joint value carries a weight of its own (a feature cross to learn). */
static const int cross_pairs[4][2] = {{0, 1}, {4, 5}, {7, 8}, {13, 16}};

/* Philox counter layout within one sample's stream: tag (what is drawn) in the top byte, the
 * slot (field, position) in the middle, the rejection attempt in the low byte. */
enum { T_CAT = 1, T_CAT_RETRY, T_DENSE, T_USER, T_TARGET, T_HIST, T_HIST_RETRY, T_MH, T_MH_RETRY };
static inline uint64_t ctr(uint64_t tag, uint64_t slot, uint64_t attempt) {
    return (tag << 56) | (slot << 8) | attempt;
}

/* splitmix64's finalizer: the teacher's weights are a hash of (field, id), not random draws,
 * so the same id always carries the same weight. */
static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBull;
    x ^= x >> 31;
    return x;
}
/* The key of one weight table (a field, a pair, the items): precomputed at init. */
static inline uint64_t table_key(uint64_t key, uint64_t tag) {
    return mix64(key ^ (tag * 0x9E3779B97F4A7C15ull));
}
/* Entry x of a table: a unit-variance weight, uniform in [-sqrt 3, sqrt 3]. */
static inline double hashed_weight(uint64_t tkey, uint64_t x) {
    uint64_t h = mix64(tkey ^ x);
    return ((double)(h >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0) * 1.7320508075688772;
}
static inline double u32_open(uint32_t x) { return ((double)x + 0.5) * (1.0 / 4294967296.0); }

/* ---- Zipf by rejection-inversion (Hormann & Derflinger 1996, as in Apache Commons' sampler).
 * h(x) = x^-s is dominated by the integral H; a uniform on H's range is inverted, rounded to a
 * rank k and accepted when it falls under the mass of k. The squeeze accepts most draws without
 * evaluating H again. Exact for every n and s > 0 (s = 1 included, via the helpers). */
static double helper1(double x) { /* log1p(x) / x */
    return fabs(x) > 1e-8 ? log1p(x) / x : 1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x));
}
static double helper2(double x) { /* expm1(x) / x */
    return fabs(x) > 1e-8 ? expm1(x) / x : 1.0 + x * 0.5 * (1.0 + x * (1.0 / 3.0) * (1.0 + 0.25 * x));
}
static double zipf_H(double x, double s) {
    double lx = log(x);
    return helper2((1.0 - s) * lx) * lx;
}
static double zipf_h(double x, double s) { return exp(-s * log(x)); }
static double zipf_Hinv(double x, double s) {
    double t = x * (1.0 - s);
    if (t < -1.0) t = -1.0;
    return exp(helper1(t) * x);
}

/* The head table holds the first `head` ranks exactly (their probabilities need the total mass
 * Z, whose tail part is H(n + 1/2) - H(head + 1/2) by the midpoint rule with its first
 * Euler-Maclaurin correction; the next term is below 1e-12 relative for head = 1024, far under
 * the 2^-32 resolution of a draw). The tail is rejection-inversion with u limited to
 * [H(head + 1/2), H(n + 1/2)]: each rank k keeps its acceptance interval, of measure h(k), and
 * those intervals lie inside [H(k - 1/2), H(k + 1/2)], so exactly the ranks > head remain, with
 * the right relative probabilities. */
static void zipf_init(nb_zipf *z, uint64_t n, double s) {
    memset(z, 0, sizeof *z);
    z->n = (double)n;
    z->s = s;
    z->head = (uint32_t)(n < NB_ZIPF_HEAD ? n : NB_ZIPF_HEAD);
    double hh = (double)z->head + 0.5, hn = (double)n + 0.5;
    z->h_head = zipf_H(hh, s);
    z->h_n = zipf_H(hn, s);
    z->squeeze = 2.0 - zipf_Hinv(zipf_H(2.5, s) - zipf_h(2.0, s), s);
    double head_sum = 0, tail = 0;
    for (uint32_t k = 1; k <= z->head; k++) head_sum += zipf_h(k, s);
    if (n > z->head)
        tail = (z->h_n - z->h_head) - s / 24.0 * (exp((-s - 1) * log(hh)) - exp((-s - 1) * log(hn)));
    double total = head_sum + tail, acc = 0;
    for (uint32_t k = 1; k <= z->head; k++) {
        acc += zipf_h(k, s);
        double c = floor(acc / total * 4294967296.0 + 0.5);
        z->cdf[k - 1] = c >= 4294967295.0 ? 4294967295u : (uint32_t)c;
    }
    z->head_mass = n > z->head ? (uint64_t)floor(head_sum / total * 4294967296.0 + 0.5) : (1ull << 32);
    uint32_t k = 0;
    for (uint32_t b = 0; b < NB_ZIPF_HEAD; b++) {
        uint64_t start = (uint64_t)b << 22;
        while (k + 1 < z->head && z->cdf[k] <= start) k++;
        z->guide[b] = (uint16_t)k;
    }
}

/* One rank in 1..n from the uniform bits `first` (from the caller's Philox block). A rejected
 * tail draw takes a fresh block at (tag, slot, attempt). Rejections are rare (a few % of tail
 * draws), so the cap of 255 attempts is never reached in practice; reaching it returns the last
 * rank. */
static uint64_t zipf_draw(const nb_zipf *z, uint32_t first, uint64_t key, uint64_t idx,
                          uint64_t tag, uint64_t slot) {
    if (first < z->head_mass) {
        uint32_t k = z->guide[first >> 22];
        while (k + 1 < z->head && first >= z->cdf[k]) k++;
        return (uint64_t)k + 1;
    }
    /* the conditional uniform on the tail, then fresh ones */
    double u01 = ((double)(first - z->head_mass) + 0.5) / (double)((1ull << 32) - z->head_mass);
    double lo = (double)z->head + 1.0;
    for (uint64_t a = 1;; a++) {
        double u = z->h_head + u01 * (z->h_n - z->h_head);
        double x = zipf_Hinv(u, z->s);
        double kd = floor(x + 0.5);
        if (kd < lo) kd = lo;
        if (kd > z->n) kd = z->n;
        if (kd - x <= z->squeeze || u >= zipf_H(kd + 0.5, z->s) - zipf_h(kd, z->s) || a == 255)
            return (uint64_t)kd;
        u01 = u32_open(nb_philox(key, idx, ctr(tag, slot, a)).v[0]);
    }
}

/* ---- rank -> id: id = (rank0 * mul + add) mod n with gcd(mul, n) = 1, a bijection of [0, n).
 * mul near n / golden ratio spreads consecutive ranks across the range. */
static uint64_t gcd64(uint64_t a, uint64_t b) {
    while (b) {
        uint64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}
static void scramble_init(uint64_t n, uint64_t key, int on, uint64_t *mul, uint64_t *add) {
    if (!on || n <= 1) {
        *mul = 1;
        *add = 0;
        return;
    }
    uint64_t m = (uint64_t)((double)n * 0.6180339887498949);
    if (m == 0) m = 1;
    while (gcd64(m, n) != 1) m++;
    *mul = m % n;
    *add = mix64(key) % n;
}
/* rank0 < n <= 2^32 and mul < n: the product fits in 64 bits. */
static inline uint32_t scramble(uint64_t rank0, uint64_t n, uint64_t mul, uint64_t add) {
    return (uint32_t)((rank0 * mul + add) % n);
}

/* ---- one sample ---- */
typedef struct {
    float dense[NB_SYNTH_NDENSE];
    uint16_t miss;
    uint32_t cat[NB_SYNTH_NCAT];
    uint32_t target;
    int32_t len;
    float label;
    uint32_t mh[NB_SYNTH_MH_WIDTH]; /* multi_hot: every field's ids, field after field */
} sample;

/* multi_hot: field f's values after its first (which is cat[f]), one Philox block per four, and
 * the teacher's field term (replacing the single id's). */
static double multi_hot_field(const nb_synth *g, uint64_t key, uint64_t idx, int f, uint32_t *vals) {
    int hot = nb_synth_mlperf_hot[f];
    double w = hashed_weight(g->cat_tkey[f], vals[0]);
    nb_u32x4 b = {{0, 0, 0, 0}};
    for (int k = 1; k < hot; k++) {
        if ((k - 1) % 4 == 0) b = nb_philox(key, idx, ctr(T_MH, ((uint64_t)f << 16) | (uint64_t)((k - 1) / 4), 0));
        uint64_t r = zipf_draw(&g->cat_zipf[f], b.v[(k - 1) % 4], key, idx, T_MH_RETRY, ((uint64_t)f << 16) | (uint64_t)k);
        vals[k] = scramble(r - 1, g->card[f], g->cat_mul[f], g->cat_add[f]);
        w += hashed_weight(g->cat_tkey[f], vals[k]);
    }
    return CAT_W * w / sqrt((double)hot);
}

/* An item's rank: from cluster c with probability 1/2 (bit 31 of choice clear), else from all
 * items. clusters <= items, so every cluster holds at least one rank. */
static uint64_t item_rank(const nb_synth *g, uint32_t choice, uint32_t bits, uint32_t c,
                          uint64_t key, uint64_t idx, uint64_t tag, uint64_t slot) {
    if (!(choice >> 31)) {
        uint64_t r = zipf_draw(&g->cluster_zipf, bits, key, idx, tag, slot) - 1;
        return r * g->clusters + c;
    }
    return zipf_draw(&g->item_zipf, bits, key, idx, tag, slot) - 1;
}

/* Draws sample idx of the stream `key` into *s (and its history into hist when not NULL) and
 * returns the teacher's logit, g->bias included. */
static double gen_sample(const nb_synth *g, uint64_t key, uint64_t idx, sample *s, uint32_t *hist) {
    const nb_synth_opts *o = &g->o;
    double logit = g->bias;

    /* categorical: one Philox block covers four fields */
    for (int q = 0; q < (NB_SYNTH_NCAT + 3) / 4; q++) {
        nb_u32x4 b = nb_philox(key, idx, ctr(T_CAT, (uint64_t)q, 0));
        for (int r = 0; r < 4 && 4 * q + r < NB_SYNTH_NCAT; r++) {
            int f = 4 * q + r;
            uint64_t k = zipf_draw(&g->cat_zipf[f], b.v[r], key, idx, T_CAT_RETRY, (uint64_t)f);
            s->cat[f] = scramble(k - 1, g->card[f], g->cat_mul[f], g->cat_add[f]);
            if (!o->multi_hot) logit += CAT_W * hashed_weight(g->cat_tkey[f], s->cat[f]);
        }
    }
    for (int f = 0, at = 0; o->multi_hot && f < NB_SYNTH_NCAT; at += nb_synth_mlperf_hot[f++]) {
        s->mh[at] = s->cat[f];
        logit += multi_hot_field(g, key, idx, f, s->mh + at);
    }
    for (int p = 0; p < 4; p++) {
        int a = cross_pairs[p][0], c = cross_pairs[p][1];
        uint64_t joint = (uint64_t)s->cat[a] * g->card[c] + s->cat[c];
        logit += CROSS_W * hashed_weight(g->pair_tkey[p], joint);
    }

    /* dense: one block per two features (Box-Muller pair + two missing uniforms) */
    s->miss = 0;
    for (int q = 0; q < (NB_SYNTH_NDENSE + 1) / 2; q++) {
        nb_u32x4 b = nb_philox(key, idx, ctr(T_DENSE, (uint64_t)q, 0));
        /* float math: the features need no more precision, and it halves their cost */
        float rad = sqrtf(-2.0f * logf((float)u32_open(b.v[0])));
        float ang = 6.2831853f * (float)u32_open(b.v[1]);
        float z[2] = {rad * cosf(ang), rad * sinf(ang)};
        for (int r = 0; r < 2 && 2 * q + r < NB_SYNTH_NDENSE; r++) {
            int j = 2 * q + r;
            if (u32_open(b.v[2 + r]) < g->miss_rate[j]) {
                s->dense[j] = 0.0f;
                s->miss |= (uint16_t)(1u << j);
                continue;
            }
            float x = floorf(expf(dense_mu[j] + dense_sigma[j] * z[r]));
            s->dense[j] = logf(1.0f + x); /* x is a whole number: 1 + x is exact below 2^24 */
            logit += g->dense_w[j] * s->dense[j];
        }
    }

    /* user: interest cluster, history length, label uniform, target's source */
    nb_u32x4 user = nb_philox(key, idx, ctr(T_USER, 0, 0));
    uint32_t ucl = (uint32_t)(((uint64_t)user.v[0] * g->clusters) >> 32);
    double U = ((double)user.v[1] + 1.0) * (1.0 / 4294967296.0); /* (0, 1] */
    double t = o->hist_scale * (exp(-log(U) / o->hist_alpha) - 1.0);
    int32_t len = t >= (double)o->max_len ? o->max_len : (int32_t)t;
    s->len = len;

    uint32_t tbits = nb_philox(key, idx, ctr(T_TARGET, 0, 0)).v[0];
    uint64_t trank = item_rank(g, user.v[3], tbits, ucl, key, idx, T_TARGET, 0);
    uint32_t tcl = (uint32_t)(trank % g->clusters);
    s->target = scramble(trank, o->items, g->item_mul, g->item_add);
    logit += TARGET_W * hashed_weight(g->item_tkey, s->target);

    /* history: one block per two items (source choice + Zipf uniform each) */
    int same = 0;
    nb_u32x4 b = {{0, 0, 0, 0}};
    for (int32_t j = 0; j < len; j++) {
        if (!(j & 1)) b = nb_philox(key, idx, ctr(T_HIST, (uint64_t)j >> 1, 0));
        int h = (j & 1) * 2;
        uint64_t rank = item_rank(g, b.v[h], b.v[h + 1], ucl, key, idx, T_HIST_RETRY, (uint64_t)j);
        same += (rank % g->clusters) == tcl;
        if (hist) hist[j] = scramble(rank, o->items, g->item_mul, g->item_add);
    }
    if (hist && len < o->max_len) memset(hist + len, 0, sizeof(uint32_t) * (size_t)(o->max_len - len));
    if (len > 0) logit += AFF_W * (double)same / (double)len;

    double p = 1.0 / (1.0 + exp(-logit));
    s->label = u32_open(user.v[2]) < p ? 1.0f : 0.0f;
    return logit;
}

/* ---- options ---- */
void nb_synth_opts_default(nb_synth_opts *o) {
    o->seed = 1;
    o->cap = 1000000;
    o->zipf = 1.05;
    o->items = 1000000;
    o->max_len = 256;
    o->hist_alpha = 1.2;
    o->hist_scale = 8.0;
    o->base_rate = 0.25;
    o->missing = -1.0;
    o->scramble = 1;
    o->calib = 262144;
    o->multi_hot = 0;
}

#define SYNTH_KEYS_HINT                                                                            \
    "valid keys: seed (uint64), cap (1..4294967295), zipf (0..10, > 0), items (1..4294967295), "   \
    "max_len (0..65536), hist_alpha (0..100, > 0), hist_scale (0..1e6, > 0), base_rate (0..1, "   \
    "exclusive), missing (criteo or 0..1), scramble (0 or 1), calib (1000..100000000), multi_hot "   \
    "(0 or 1); e.g. "                                                                               \
    "--data synth:seed=7,cap=100000,max_len=64"

typedef enum { K_U64, K_U32, K_INT, K_DBL, K_MISSING } key_type;
typedef struct {
    const char *name;
    key_type type;
    double lo, hi; /* inclusive, except doubles with lo_open */
    int lo_open, hi_open;
    size_t off;
} key_spec;

static const key_spec keys[] = {
    {"seed", K_U64, 0, 0, 0, 0, offsetof(nb_synth_opts, seed)},
    {"cap", K_U32, 1, 4294967295.0, 0, 0, offsetof(nb_synth_opts, cap)},
    {"zipf", K_DBL, 0, 10, 1, 0, offsetof(nb_synth_opts, zipf)},
    {"items", K_U32, 1, 4294967295.0, 0, 0, offsetof(nb_synth_opts, items)},
    {"max_len", K_INT, 0, 65536, 0, 0, offsetof(nb_synth_opts, max_len)},
    {"hist_alpha", K_DBL, 0, 100, 1, 0, offsetof(nb_synth_opts, hist_alpha)},
    {"hist_scale", K_DBL, 0, 1e6, 1, 0, offsetof(nb_synth_opts, hist_scale)},
    {"base_rate", K_DBL, 0, 1, 1, 1, offsetof(nb_synth_opts, base_rate)},
    {"missing", K_MISSING, 0, 1, 0, 0, offsetof(nb_synth_opts, missing)},
    {"scramble", K_INT, 0, 1, 0, 0, offsetof(nb_synth_opts, scramble)},
    {"calib", K_INT, 1000, 100000000, 0, 0, offsetof(nb_synth_opts, calib)},
    {"multi_hot", K_INT, 0, 1, 0, 0, offsetof(nb_synth_opts, multi_hot)},
};
#define NKEYS (int)(sizeof keys / sizeof keys[0])

NB_NORETURN static void bad_value(const key_spec *k, const char *v) {
    if (k->type == K_U64)
        nb_fail(SYNTH_KEYS_HINT, "--data synth: %s=%s is not an unsigned 64-bit integer", k->name, v);
    /* %.10g: integer bounds up to 2^32 print in full */
    nb_fail(SYNTH_KEYS_HINT, "--data synth: %s=%s is not %s in %s%.10g, %.10g%s", k->name, v,
            k->type == K_DBL ? "a number" : k->type == K_MISSING ? "'criteo' or a number" : "an integer",
            k->lo_open ? "(" : "[", k->lo, k->hi, k->hi_open ? ")" : "]");
}

static void set_value(nb_synth_opts *o, const key_spec *k, const char *v) {
    char *end = NULL;
    void *dst = (char *)o + k->off;
    if (k->type == K_MISSING && strcmp(v, "criteo") == 0) {
        *(double *)dst = -1.0;
        return;
    }
    if (k->type == K_DBL || k->type == K_MISSING) {
        errno = 0;
        double d = strtod(v, &end);
        if (!*v || *end || errno || !isfinite(d) || d < k->lo || d > k->hi ||
            (k->lo_open && d == k->lo) || (k->hi_open && d == k->hi))
            bad_value(k, v);
        *(double *)dst = d;
        return;
    }
    /* strtoull accepts a sign ("-1" wraps around): allow digits only */
    if (!*v || strspn(v, "0123456789") != strlen(v)) bad_value(k, v);
    errno = 0;
    unsigned long long u = strtoull(v, &end, 10);
    if (errno || *end) bad_value(k, v);
    if (k->type == K_U64) {
        *(uint64_t *)dst = (uint64_t)u;
        return;
    }
    if ((double)u < k->lo || (double)u > k->hi) bad_value(k, v);
    if (k->type == K_U32)
        *(uint32_t *)dst = (uint32_t)u;
    else
        *(int *)dst = (int)u;
}

void nb_synth_parse(nb_synth_opts *o, const char *spec) {
    nb_synth_opts_default(o);
    NB_CHECK(spec, SYNTH_KEYS_HINT, "--data synth: no options string");
    if (strncmp(spec, "synth", 5) == 0 && (spec[5] == 0 || spec[5] == ':')) spec += spec[5] ? 6 : 5;
    if (!*spec) return;
    size_t n = strlen(spec);
    char *buf = nb_malloc(n + 1, "synth options");
    memcpy(buf, spec, n + 1);
    int given[NKEYS] = {0};
    char *item = buf;
    /* strtok would skip empty items ("a=1,,b=2"); walk the commas by hand to refuse them */
    while (item) {
        char *comma = strchr(item, ',');
        if (comma) *comma = 0;
        char *eq = strchr(item, '=');
        if (!*item) nb_fail(SYNTH_KEYS_HINT, "--data synth: empty option in '%s'", spec);
        if (!eq) nb_fail(SYNTH_KEYS_HINT, "--data synth: option '%s' has no '=value'", item);
        *eq = 0;
        int found = -1;
        for (int i = 0; i < NKEYS; i++)
            if (strcmp(item, keys[i].name) == 0) found = i;
        if (found < 0) nb_fail(SYNTH_KEYS_HINT, "--data synth: unknown option '%s'", item);
        if (given[found]) nb_fail(SYNTH_KEYS_HINT, "--data synth: option '%s' given twice", item);
        given[found] = 1;
        set_value(o, &keys[found], eq + 1);
        item = comma ? comma + 1 : NULL;
    }
    free(buf);
}

/* ---- init: distributions, teacher, bias calibration ---- */

/* Solve mean_i sigmoid(b + z_i) = r for b. The mean is increasing in b, and at lo = logit(r) -
 * max z it is <= r, at hi = logit(r) - min z it is >= r: Newton steps inside that bracket,
 * bisection when a step would leave it. Sums run in index order, so the result is exact and
 * reproducible. */
static double solve_bias(const double *z, int n, double r, double *mean_out) {
    double zmin = z[0], zmax = z[0];
    for (int i = 1; i < n; i++) {
        if (z[i] < zmin) zmin = z[i];
        if (z[i] > zmax) zmax = z[i];
    }
    double lr = log(r / (1.0 - r));
    double lo = lr - zmax, hi = lr - zmin, b = 0.5 * (lo + hi), mean = 0;
    for (int it = 0; it < 200; it++) {
        double sp = 0, sd = 0;
        for (int i = 0; i < n; i++) {
            double p = 1.0 / (1.0 + exp(-(b + z[i])));
            sp += p;
            sd += p * (1.0 - p);
        }
        mean = sp / n;
        double f = mean - r;
        if (fabs(f) < 1e-12 * r) break;
        if (f > 0) hi = b; else lo = b;
        double nb = sd > 0 ? b - f / (sd / n) : 0.5 * (lo + hi);
        b = (nb > lo && nb < hi) ? nb : 0.5 * (lo + hi);
        if (hi - lo < 1e-14) break;
    }
    *mean_out = mean;
    return b;
}

void nb_synth_init(nb_synth *g, const nb_synth_opts *o) {
    memset(g, 0, sizeof *g);
    g->o = *o;
    NB_CHECK(o->zipf > 0 && o->items >= 1 && o->cap >= 1 && o->max_len >= 0 && o->hist_alpha > 0 &&
                 o->hist_scale > 0 && o->base_rate > 0 && o->base_rate < 1 && o->calib >= 1,
             SYNTH_KEYS_HINT, "synth: options out of range");
    g->teacher_key = mix64(o->seed ^ 0x7EAC4E12u);
    for (int f = 0; f < NB_SYNTH_NCAT; f++) g->cat_tkey[f] = table_key(g->teacher_key, (uint64_t)f);
    for (int p = 0; p < 4; p++) g->pair_tkey[p] = table_key(g->teacher_key, 100 + (uint64_t)p);
    g->item_tkey = table_key(g->teacher_key, 200);
    for (int f = 0; f < NB_SYNTH_NCAT; f++) {
        uint32_t card = o->multi_hot ? nb_synth_mlperf_rows[f] : nb_synth_criteo_card[f];
        g->card[f] = card < o->cap ? card : o->cap;
        zipf_init(&g->cat_zipf[f], g->card[f], o->zipf);
        scramble_init(g->card[f], mix64(o->seed + 1000 + (uint64_t)f), o->scramble, &g->cat_mul[f],
                      &g->cat_add[f]);
    }
    g->clusters = o->items < NB_SYNTH_CLUSTERS ? o->items : NB_SYNTH_CLUSTERS;
    zipf_init(&g->item_zipf, o->items, o->zipf);
    /* within a cluster c the ranks are c, c + K, c + 2K, ...: floor(items / K) of them exist in
     * every cluster, so drawing from that many never leaves [0, items) */
    zipf_init(&g->cluster_zipf, o->items / g->clusters, o->zipf);
    scramble_init(o->items, mix64(o->seed + 2000), o->scramble, &g->item_mul, &g->item_add);
    for (int j = 0; j < NB_SYNTH_NDENSE; j++) {
        g->miss_rate[j] = o->missing < 0 ? criteo_missing[j] : (float)o->missing;
        g->dense_w[j] = (float)(DENSE_W * hashed_weight(table_key(g->teacher_key, 300), (uint64_t)j));
    }

    /* calibration set: the same distribution, its own Philox key, so it shares no sample with
     * the data the caller draws */
    int n = o->calib;
    double *z = nb_malloc(sizeof(double) * (size_t)n, "synth calibration logits");
    uint64_t ckey = mix64(o->seed ^ 0xCA1B4A7E5EEDull);
    g->bias = 0;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; i++) {
        sample s;
        z[i] = gen_sample(g, ckey, (uint64_t)i, &s, NULL);
    }
    g->bias = solve_bias(z, n, o->base_rate, &g->calib_mean);
    free(z);
    NB_CHECK(isfinite(g->bias) && fabs(g->calib_mean - o->base_rate) < 1e-6 * o->base_rate + 1e-9,
             "pick a base_rate further from 0 and 1", "synth: could not calibrate base_rate=%g (got %g)",
             o->base_rate, g->calib_mean);
}

void nb_synth_open(nb_synth *g, const char *spec) {
    nb_synth_opts o;
    nb_synth_parse(&o, spec);
    nb_synth_init(g, &o);
}

void nb_synth_fill(const nb_synth *g, uint64_t first_index, int n, float *dense, uint32_t *cat,
                   uint32_t *target, uint32_t *hist, int32_t *hist_len, float *label,
                   uint16_t *dense_missing) {
    NB_ASSERT(n >= 0);
    size_t L = (size_t)g->o.max_len;
#pragma omp parallel for schedule(static) if (n > 64)
    for (int i = 0; i < n; i++) {
        sample s;
        gen_sample(g, g->o.seed, first_index + (uint64_t)i, &s, hist ? hist + (size_t)i * L : NULL);
        if (dense) memcpy(dense + (size_t)i * NB_SYNTH_NDENSE, s.dense, sizeof s.dense);
        if (cat) memcpy(cat + (size_t)i * NB_SYNTH_NCAT, s.cat, sizeof s.cat);
        if (target) target[i] = s.target;
        if (hist_len) hist_len[i] = s.len;
        if (label) label[i] = s.label;
        if (dense_missing) dense_missing[i] = s.miss;
    }
}

void nb_synth_fill_multi_hot(const nb_synth *g, uint64_t first_index, int n, float *dense, uint32_t *cat, uint32_t *mv,
                             int32_t *mv_len, float *label) {
    NB_CHECK(g->o.multi_hot, "this is a bug in nobubble; please report it", "multi-hot samples from a one-hot generator");
#pragma omp parallel for schedule(static) if (n > 64)
    for (int i = 0; i < n; i++) {
        sample s;
        gen_sample(g, g->o.seed, first_index + (uint64_t)i, &s, NULL);
        memcpy(dense + (size_t)i * NB_SYNTH_NDENSE, s.dense, sizeof s.dense);
        memcpy(cat + (size_t)i * NB_SYNTH_NCAT, s.cat, sizeof s.cat);
        memcpy(mv + (size_t)i * NB_SYNTH_MH_WIDTH, s.mh, sizeof s.mh);
        for (int f = 0; f < NB_SYNTH_NCAT; f++) mv_len[(size_t)i * NB_SYNTH_NCAT + f] = nb_synth_mlperf_hot[f];
        if (label) label[i] = s.label;
    }
}

void nb_synth_teacher_logit(const nb_synth *g, uint64_t first_index, int n, float *logit) {
#pragma omp parallel for schedule(static) if (n > 64)
    for (int i = 0; i < n; i++) {
        sample s;
        logit[i] = (float)gen_sample(g, g->o.seed, first_index + (uint64_t)i, &s, NULL);
    }
}

uint32_t nb_synth_rank_to_id(const nb_synth *g, int f, uint64_t k) {
    NB_ASSERT(f >= -1 && f < NB_SYNTH_NCAT && k >= 1);
    if (f < 0) {
        NB_ASSERT(k <= g->o.items);
        return scramble(k - 1, g->o.items, g->item_mul, g->item_add);
    }
    NB_ASSERT(k <= g->card[f]);
    return scramble(k - 1, g->card[f], g->cat_mul[f], g->cat_add[f]);
}

const char *nb_synth_describe(const nb_synth *g, char *buf, size_t cap) {
    const nb_synth_opts *o = &g->o;
    uint64_t rows = 0;
    for (int f = 0; f < NB_SYNTH_NCAT; f++) rows += g->card[f];
    char miss[32];
    if (o->missing < 0)
        snprintf(miss, sizeof miss, "criteo");
    else
        snprintf(miss, sizeof miss, "%g", o->missing);
    snprintf(buf, cap,
             "synth seed=%llu cap=%u (%llu categorical rows) zipf=%g items=%u max_len=%d "
             "hist_alpha=%g hist_scale=%g base_rate=%g missing=%s scramble=%d calib=%d%s bias=%.4f",
             (unsigned long long)o->seed, o->cap, (unsigned long long)rows, o->zipf, o->items,
             o->max_len, o->hist_alpha, o->hist_scale, o->base_rate, miss, o->scramble, o->calib,
             o->multi_hot ? " multi_hot=1" : "", g->bias);
    return buf;
}
