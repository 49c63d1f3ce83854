/* seqctr CPU ops (ops/ops_ctr.h) and sparse optimizers (optim/optim_sparse.h) against double
 * references written out here (the cpu rows of the ctr family; ctr_cuda*.c has the cuda rows).
 * eval mode: forwards and gradient semantics; grad mode: the finite differences.
 *
 * For each differentiable op, with the scalar loss L = sum(out * R) (R random, so dL/dout = R):
 * - the float forward matches a double reference of the same formula;
 * - every analytic gradient matches central differences of the double reference;
 * - a NULL gradient skips that gradient and leaves the others bit-identical; all NULL is a no-op;
 * - backward accumulates (G0 + 2g after two calls);
 * - two runs are bitwise equal, and so are runs with 1 and 3 OpenMP threads.
 * Sizes are awkward on purpose: B=3, L=5 with lengths {0, 5, 2}, E=12, H=3, D=13, r=4.
 * Padded history rows hold random garbage and R is non-zero there: the masks must hide both. */
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "core.h"
#include "ops/ops_ctr.h"
#include "optest.h"
#include "mvlists_case.h"
#include "optim/optim_sparse.h"
#include "rng.h"

#define SEED 20261129u
#define FWD_TOL 1e-5
#define GRAD_TOL 1e-4

/* ---- helpers ---- */

#include "op_util.h"

/* Every element: all tensors here are small. 0 (not computed) outside grad mode. */
static double fd_error(loss_fn f, const void *ctx, double *x, const float *g, size_t n) {
    if (!ot_grad()) return 0;
    return fd_error_sampled(f, ctx, x, g, n, SIZE_MAX, 0, 0);
}

#include "grad_semantics.h"

/* ---- shared history shapes ---- */
enum { SB = 3, SL = 5, SE = 12, SH = 3 };
static const int32_t S_LENGTHS[SB] = {0, 5, 2};

/* ---- embedding lookups, dedup, unique backward ---- */

enum { ENROWS = 9, EE = 70 }; /* E = 70: not a multiple of any vector width */
/* 11 lookups in 4 bags, one empty; rows repeat within and across bags; row 8 untouched. */
static const int64_t E_ROWS[11] = {3, 5, 3, 0, 7, 5, 5, 1, 3, 0, 6};
static const int32_t E_OFFS[5] = {0, 3, 3, 8, 11};

TEST_CASE(test_embag_gather_unique) {
    int n = 11;
    float *table = randn((size_t)ENROWS * EE, 1, 0.0f, 1.0f), *out = zeros((size_t)n * EE);
    nb_embag_gather(out, table, E_ROWS, n, ENROWS, EE);
    int ok = 1;
    for (int i = 0; i < n; i++) ok &= same_bits(out + (size_t)i * EE, table + (size_t)E_ROWS[i] * EE, EE);
    CHECK(ok, "gather does not copy the table rows");

    int64_t uniq[11];
    int32_t inv[11];
    int U = nb_embag_unique(uniq, inv, E_ROWS, n);
    static const int64_t want_uniq[7] = {0, 1, 3, 5, 6, 7};
    CHECK(U == 6, "U = %d, want 6", U);
    for (int u = 0; u < U && u < 6; u++) CHECK(uniq[u] == want_uniq[u], "uniq[%d] = %lld", u, (long long)uniq[u]);
    for (int i = 0; i < n; i++) CHECK(inv[i] >= 0 && inv[i] < U && uniq[inv[i]] == E_ROWS[i], "inverse[%d] wrong", i);
    CHECK(nb_embag_unique(uniq, inv, E_ROWS, 0) == 0, "empty input must give U = 0");

    /* Unique backward vs a dense scatter-add in double, read back at the unique rows. */
    float *dout = randn((size_t)n * EE, 2, 0.0f, 1.0f);
    double *dense = nb_calloc((size_t)ENROWS * EE, sizeof(double), "dense");
    for (int i = 0; i < n; i++)
        for (int e = 0; e < EE; e++) dense[(size_t)E_ROWS[i] * EE + e] += dout[(size_t)i * EE + e];
    double *want = nb_malloc((size_t)U * EE * sizeof(double), "want");
    for (int u = 0; u < U; u++) memcpy(want + (size_t)u * EE, dense + (size_t)uniq[u] * EE, EE * sizeof(double));
    float *du = zeros((size_t)U * EE);
    nb_embag_backward_unique(du, dout, inv, n, EE);
    double e = max_rel(du, want, (size_t)U * EE);
    CHECK(e < 1e-6, "unique backward vs dense scatter-add: %.3g", e);
    /* The fixed order: each unique row is its lookups added in position order, from zero. */
    float row3[EE];
    memset(row3, 0, sizeof(row3));
    for (int i = 0; i < n; i++)
        if (E_ROWS[i] == 3)
            for (int c = 0; c < EE; c++) row3[c] += dout[(size_t)i * EE + c];
    CHECK(same_bits(du + (size_t)2 * EE, row3, EE), "row 3's sum is not in position order");
    /* Accumulation, NULL, thread count. */
    nb_embag_backward_unique(NULL, dout, inv, n, EE);
    float *du2 = zeros((size_t)U * EE);
    omp_set_num_threads(1);
    nb_embag_backward_unique(du2, dout, inv, n, EE);
    CHECK(same_bits(du2, du, (size_t)U * EE), "unique backward changes with 1 thread");
    omp_set_num_threads(ot_threads);
    nb_embag_backward_unique(du2, dout, inv, n, EE);
    for (size_t i = 0; i < (size_t)U * EE; i++) want[i] = 2.0 * du[i];
    CHECK(max_rel(du2, want, (size_t)U * EE) < 1e-6, "unique backward does not accumulate");
    free(table), free(out), free(dout), free(dense), free(want), free(du), free(du2);
}

typedef struct {
    nb_embag_mode mode;
    const float *R;
    double *xt; /* table in double */
    const int32_t *inv;
    int U;
} bag_case;

static double bag_loss(const void *p) {
    const bag_case *c = p;
    double L = 0;
    for (int b = 0; b < 4; b++) {
        int len = E_OFFS[b + 1] - E_OFFS[b];
        for (int e = 0; e < EE; e++) {
            double s = 0;
            for (int i = E_OFFS[b]; i < E_OFFS[b + 1]; i++) s += c->xt[(size_t)E_ROWS[i] * EE + e];
            if (c->mode == NB_EMBAG_MEAN && len > 0) s /= len;
            L += s * c->R[(size_t)b * EE + e];
        }
    }
    return L;
}

static void bag_bwd(const void *p, float *const *g) {
    const bag_case *c = p;
    nb_embag_bag_backward_unique(g[0], c->R, E_OFFS, c->inv, 4, EE, c->mode);
}

static void check_bag(nb_embag_mode mode) {
    float *table = randn((size_t)ENROWS * EE, 3, 0.0f, 1.0f), *out = zeros((size_t)4 * EE);
    int64_t uniq[11];
    int32_t inv[11];
    int U = nb_embag_unique(uniq, inv, E_ROWS, 11);
    bag_case c = {mode, randn((size_t)4 * EE, 4, 0.0f, 1.0f), to_double(table, (size_t)ENROWS * EE), inv, U};
    nb_embag_bag_forward(out, table, E_ROWS, E_OFFS, 4, ENROWS, EE, mode);
    double *want = nb_malloc((size_t)4 * EE * sizeof(double), "want");
    for (int b = 0; b < 4; b++) {
        int len = E_OFFS[b + 1] - E_OFFS[b];
        for (int e = 0; e < EE; e++) {
            double s = 0;
            for (int i = E_OFFS[b]; i < E_OFFS[b + 1]; i++) s += table[(size_t)E_ROWS[i] * EE + e];
            want[(size_t)b * EE + e] = mode == NB_EMBAG_MEAN && len > 0 ? s / len : s;
        }
    }
    double fe = max_rel(out, want, (size_t)4 * EE);
    CHECK(fe < FWD_TOL, "bag forward error %.3g", fe);
    int zero = 1;
    for (int e = 0; e < EE; e++) zero &= out[EE + e] == 0.0f;
    CHECK(zero, "empty bag must give a zero row");

    grad_op op = {mode == NB_EMBAG_MEAN ? "bag mean" : "bag sum", 1, {(size_t)U * EE}, {"dunique"}, bag_bwd, &c, 0, 0};
    float *ref[1];
    check_grad_semantics(&op, ref);
    /* FD over the whole table: touched rows must match dunique, untouched rows (2, 4, 8) must be 0. */
    float *dense = zeros((size_t)ENROWS * EE);
    for (int u = 0; u < U; u++) memcpy(dense + (size_t)uniq[u] * EE, ref[0] + (size_t)u * EE, EE * sizeof(float));
    double ge[1] = {fd_error(bag_loss, &c, c.xt, dense, (size_t)ENROWS * EE)};
    CHECK(ge[0] < GRAD_TOL, "%s gradient error %.3g", op.name, ge[0]);
    report(op.name, fe, ge, &op);
    free(table), free(out), free(want), free(dense), free(ref[0]), free((void *)c.R), free(c.xt);
}

TEST_CASE(test_embag_bag) {
    check_bag(NB_EMBAG_SUM);
    check_bag(NB_EMBAG_MEAN);
}

/* ---- multi-valued columns (mvpool): 3 samples x 2 columns sharing one offset array (stride 2);
 * bags of 3, 0, 1, 4, 0, 3 values over 11 rows of E = 70. As the model does, each bag's first
 * value is gathered into its slot before the forward, and the slot's gradient after the backward
 * is the first value's. ---- */
enum { MV_B = 3, MV_ROWS = 11, MV_LD = 2 * EE + 1 };
static const int32_t MV_OFF[2 * MV_B + 1] = {0, 3, 3, 4, 8, 8, 11};

typedef struct {
    int mean;
    const float *R; /* [MV_B, MV_LD] */
    double *xv;     /* the values in double */
} mv_case;

static double mv_ref(const double *v, int mean, int i, int j, int e) {
    int r0 = MV_OFF[i * 2 + j], r1 = MV_OFF[i * 2 + j + 1];
    double s = 0;
    for (int r = r0; r < r1; r++) s += v[(size_t)r * EE + e];
    return mean && r1 > r0 ? s / (r1 - r0) : s;
}

static double mv_loss(const void *p) {
    const mv_case *c = p;
    double L = 0;
    for (int i = 0; i < MV_B; i++)
        for (int j = 0; j < 2; j++)
            for (int e = 0; e < EE; e++) L += mv_ref(c->xv, c->mean, i, j, e) * c->R[(size_t)i * MV_LD + j * EE + e];
    return L;
}

/* dvals: the other values' gradients from the op, and each first value's (the slot's, rescaled) */
static void mv_bwd(const void *p, float *const *g) {
    const mv_case *c = p;
    float *d = nb_malloc(sizeof(float) * MV_B * MV_LD, "slot gradients");
    memcpy(d, c->R, sizeof(float) * MV_B * MV_LD);
    for (int j = 0; j < 2; j++) nb_mvpool_backward(g[0], d + j * EE, MV_LD, MV_OFF + j, 2, MV_B, EE, c->mean);
    for (int i = 0; i < MV_B && g[0]; i++)
        for (int j = 0; j < 2; j++) {
            int r0 = MV_OFF[i * 2 + j];
            if (MV_OFF[i * 2 + j + 1] > r0)
                for (int e = 0; e < EE; e++) g[0][(size_t)r0 * EE + e] += d[(size_t)i * MV_LD + j * EE + e];
        }
    free(d);
}

/* The lookups past each bag's first value as nb_ctr_lists_mv makes them (bag order, value order),
 * each value r stored at table row (5 r + 2) mod MV_ROWS, and each bag's before (the bags with a
 * value ahead of it): how the forward finds a value's row. */
static void mv_lookups(const float *vals, float *table, int64_t *rows, int32_t *before) {
    int k = 0, nonempty = 0;
    for (int r = 0; r < MV_ROWS; r++) memcpy(table + (size_t)((5 * r + 2) % MV_ROWS) * EE, vals + (size_t)r * EE, EE * sizeof(float));
    for (int g = 0; g < MV_B * 2; g++) {
        before[g] = nonempty;
        for (int r = MV_OFF[g] + 1; r < MV_OFF[g + 1]; r++) rows[k++] = (5 * r + 2) % MV_ROWS;
        nonempty += MV_OFF[g + 1] > MV_OFF[g];
    }
}

static void check_mvpool(int mean) {
    float *vals = randn((size_t)MV_ROWS * EE, 31, 0.0f, 1.0f), *out = randn((size_t)MV_B * MV_LD, 32, 0.0f, 1.0f);
    float *table = nb_malloc((size_t)MV_ROWS * EE * sizeof(float), "table");
    int64_t rows[MV_ROWS];
    int32_t before[MV_B * 2];
    mv_lookups(vals, table, rows, before);
    mv_case c = {mean, randn((size_t)MV_B * MV_LD, 33, 0.0f, 1.0f), to_double(vals, (size_t)MV_ROWS * EE)};
    for (int i = 0; i < MV_B; i++) /* the slots' own lookups: the first values (garbage in an empty bag's) */
        for (int j = 0; j < 2; j++)
            if (MV_OFF[i * 2 + j + 1] > MV_OFF[i * 2 + j])
                memcpy(out + (size_t)i * MV_LD + j * EE, vals + (size_t)MV_OFF[i * 2 + j] * EE, EE * sizeof(float));
    float gap = out[EE * 2];
    for (int j = 0; j < 2; j++) nb_mvpool_forward(out + j * EE, MV_LD, table, rows, before + j, MV_OFF + j, 2, MV_B, EE, mean);
    double fe = 0;
    for (int i = 0; i < MV_B; i++)
        for (int j = 0; j < 2; j++)
            for (int e = 0; e < EE; e++) {
                double w = mv_ref(c.xv, mean, i, j, e), d = out[(size_t)i * MV_LD + j * EE + e] - w;
                d = (d < 0 ? -d : d) / (1.0 + (w < 0 ? -w : w));
                fe = d > fe ? d : fe;
            }
    CHECK(fe < FWD_TOL, "mvpool forward error %.3g", fe);
    /* one value is its row bit for bit; no value gives zeros; the column past the slots is untouched */
    CHECK(same_bits(out + MV_LD, vals + (size_t)3 * EE, EE), "a one-value bag is not its row");
    int zero = 1;
    for (int e = 0; e < EE; e++) zero &= out[EE + e] == 0.0f && out[(size_t)2 * MV_LD + e] == 0.0f;
    CHECK(zero, "an empty bag must give a zero row");
    CHECK(same_bits(out + EE * 2, &gap, 1), "the pool wrote past its slots");
    grad_op op = {mean ? "mvpool mean" : "mvpool sum", 1, {(size_t)MV_ROWS * EE}, {"dvals"}, mv_bwd, &c, 0, 0};
    float *ref[1];
    check_grad_semantics(&op, ref);
    double ge[1] = {fd_error(mv_loss, &c, c.xv, ref[0], (size_t)MV_ROWS * EE)};
    CHECK(ge[0] < GRAD_TOL, "%s gradient error %.3g", op.name, ge[0]);
    report(op.name, fe, ge, &op);
    free(vals), free(table), free(out), free(ref[0]), free((void *)c.R), free(c.xv);
}

TEST_CASE(test_mvpool) {
    check_mvpool(0);
    check_mvpool(1);
}

/* Rows that need 3 radix passes (up to ~5M), many duplicates: against brute force. */
TEST_CASE(test_embag_unique_large) {
    enum { N = 3000 };
    int64_t *rows = nb_malloc(N * sizeof(int64_t), "rows"), *uniq = nb_malloc(N * sizeof(int64_t), "uniq");
    int32_t *inv = nb_malloc(N * sizeof(int32_t), "inv");
    for (int i = 0; i < N; i++) rows[i] = (int64_t)(nb_philox(SEED, 70, i).v[0] % 61) * 80021 + (i % 3 == 0);
    int U = nb_embag_unique(uniq, inv, rows, N);
    int distinct = 0;
    for (int i = 0; i < N; i++) {
        int seen = 0;
        for (int j = 0; j < i && !seen; j++) seen = rows[j] == rows[i];
        distinct += !seen;
    }
    CHECK(U == distinct, "U = %d, brute force %d", U, distinct);
    int ok = 1;
    for (int u = 1; u < U; u++) ok &= uniq[u] > uniq[u - 1];
    for (int i = 0; i < N; i++) ok &= inv[i] >= 0 && inv[i] < U && uniq[inv[i]] == rows[i];
    CHECK(ok, "large dedup: uniq not ascending or inverse wrong");
    free(rows), free(uniq), free(inv);
}

/* nb_embag_unique_groups against nb_embag_unique plus a serial stable grouping, for 1 and 4
 * threads: the same arrays. */
static int groups_agree(const int64_t *rows, int n) {
    int64_t *u1 = nb_malloc((size_t)n * sizeof(int64_t), "uniq"), *u2 = nb_malloc((size_t)n * sizeof(int64_t), "uniq");
    int32_t *inv1 = nb_malloc((size_t)n * sizeof(int32_t), "inv"), *inv2 = nb_malloc((size_t)n * sizeof(int32_t), "inv");
    int32_t *ord = nb_malloc((size_t)n * sizeof(int32_t), "order"), *seg = nb_malloc(((size_t)n + 1) * sizeof(int32_t), "seg");
    int U = nb_embag_unique(u1, inv1, rows, n), ok = 1;
    for (int t = 1; t <= 4; t += 3) {
        omp_set_num_threads(t);
        int U2 = nb_embag_unique_groups(u2, ord, seg, inv2, rows, n, NULL);
        ok &= U2 == U && !memcmp(u1, u2, (size_t)U * sizeof(int64_t)) && !memcmp(inv1, inv2, (size_t)n * sizeof(int32_t));
        ok &= seg[0] == 0 && seg[U2] == n;
        for (int u = 0; ok && u < U2; u++)
            for (int k = seg[u]; k < seg[u + 1]; k++) {
                ok &= rows[ord[k]] == u2[u];
                if (k > seg[u]) ok &= ord[k] > ord[k - 1]; /* position order inside a group */
            }
    }
    omp_set_num_threads(ot_threads);
    free(u1), free(u2), free(inv1), free(inv2), free(ord), free(seg);
    return ok;
}

/* Past the 65536-lookup threshold (the parallel packed-key sort), and the ascending fast path. */
TEST_CASE(test_embag_unique_groups_parallel) {
    enum { N = 200003 };
    int64_t *rows = nb_malloc(N * sizeof(int64_t), "rows");
    for (int i = 0; i < N; i++) { /* heavy duplicates (a hot head) over ~6.5M rows: 3 radix passes */
        uint32_t r = nb_philox(SEED, 71, i).v[0];
        rows[i] = (r & 1) ? (int64_t)(r >> 1) % 37 : (int64_t)(r >> 1) % 6500000;
    }
    CHECK(groups_agree(rows, N), "hot-head rows: unique_groups disagrees with nb_embag_unique or its groups are out of order");
    for (int i = 0; i < N; i++) rows[i] = 3 * (int64_t)i + (i & 1); /* already unique and ascending */
    CHECK(groups_agree(rows, N), "ascending rows: the fast path disagrees with nb_embag_unique");
    rows[N - 1] = rows[N - 2]; /* one repeat at the end: not strictly ascending, the sort again */
    CHECK(groups_agree(rows, N), "ascending rows with one repeat: unique_groups disagrees with nb_embag_unique");
    rows[0] = rows[1] + 1; /* one descent at the start */
    CHECK(groups_agree(rows, N), "ascending rows with one descent: unique_groups disagrees with nb_embag_unique");
    free(rows);
}

static void bad_row(void) {
    int64_t rows[2] = {1, 9};
    float table[9 * 2] = {0}, out[4];
    nb_embag_gather(out, table, rows, 2, 9, 2);
}
TEST_CASE(test_embag_rejects_bad_row) {
    int st = ot_child_status(bad_row);
    CHECK(st == 1, "row outside the table: want exit 1, got %d", st);
}

/* ---- cross ---- */

enum { CN = 3, CD = 13, CR = 4 };
typedef struct {
    const float *x0, *x, *U, *V, *b, *vx, *u, *R;
    double *d[5]; /* x0, x, U, V, b */
} cross_case;

static double cross_ref(const cross_case *c, int n, int d) {
    double u = c->d[4][d];
    for (int k = 0; k < CR; k++) {
        double vx = 0;
        for (int j = 0; j < CD; j++) vx += c->d[3][(size_t)j * CR + k] * c->d[1][(size_t)n * CD + j];
        u += c->d[2][(size_t)d * CR + k] * vx;
    }
    return c->d[0][(size_t)n * CD + d] * u + c->d[1][(size_t)n * CD + d];
}

static double cross_loss(const void *p) {
    const cross_case *c = p;
    double L = 0;
    for (int n = 0; n < CN; n++)
        for (int d = 0; d < CD; d++) L += cross_ref(c, n, d) * c->R[(size_t)n * CD + d];
    return L;
}

static void cross_bwd(const void *p, float *const *g) {
    const cross_case *c = p;
    nb_cross_backward(g[0], g[1], g[2], g[3], g[4], c->R, c->x0, c->x, c->U, c->V, c->b, c->vx, c->u, CN, CD, CR);
}

TEST_CASE(test_cross) {
    size_t nx = (size_t)CN * CD, nw = (size_t)CD * CR;
    cross_case c = {randn(nx, 10, 0.0f, 1.0f), randn(nx, 11, 0.0f, 1.0f), randn(nw, 12, 0.0f, 0.5f), randn(nw, 13, 0.0f, 0.5f),
                    randn(CD, 14, 0.0f, 1.0f), NULL, NULL, randn(nx, 15, 0.0f, 1.0f), {0}};
    size_t sz[5] = {nx, nx, nw, nw, CD};
    const float *src[5] = {c.x0, c.x, c.U, c.V, c.b};
    for (int k = 0; k < 5; k++) c.d[k] = to_double(src[k], sz[k]);
    float *out = zeros(nx), *vx = zeros((size_t)CN * CR), *u = zeros(nx), *out_nou = zeros(nx);
    nb_cross_forward(out, vx, u, c.x0, c.x, c.U, c.V, c.b, CN, CD, CR);
    nb_cross_forward(out_nou, vx, NULL, c.x0, c.x, c.U, c.V, c.b, CN, CD, CR);
    CHECK(same_bits(out, out_nou, nx), "cross forward: keeping u changed c");
    c.vx = vx, c.u = u;
    double *want = nb_malloc(nx * sizeof(double), "want");
    for (int n = 0; n < CN; n++)
        for (int d = 0; d < CD; d++) want[(size_t)n * CD + d] = cross_ref(&c, n, d);
    double fe = max_rel(out, want, nx);
    CHECK(fe < FWD_TOL, "cross forward error %.3g", fe);

    grad_op op = {"cross", 5, {nx, nx, nw, nw, CD}, {"dx0", "dx", "dU", "dV", "db"}, cross_bwd, &c, 1u << 1, 0};
    float *ref[5];
    check_grad_semantics(&op, ref);
    double ge[5];
    for (int k = 0; k < 5; k++) {
        ge[k] = fd_error(cross_loss, &c, c.d[k], ref[k], sz[k]);
        CHECK(ge[k] < GRAD_TOL, "cross %s error %.3g", op.gname[k], ge[k]);
    }
    report("cross", fe, ge, &op);
    /* u made again from vx: the same bits as the kept one */
    float *g0[5], *g1[5];
    for (int k = 0; k < 5; k++) g0[k] = zeros(sz[k]), g1[k] = zeros(sz[k]);
    nb_cross_backward(g0[0], g0[1], g0[2], g0[3], g0[4], c.R, c.x0, c.x, c.U, c.V, c.b, c.vx, c.u, CN, CD, CR);
    nb_cross_backward(g1[0], g1[1], g1[2], g1[3], g1[4], c.R, c.x0, c.x, c.U, c.V, c.b, c.vx, NULL, CN, CD, CR);
    for (int k = 0; k < 5; k++) {
        CHECK(same_bits(g0[k], g1[k], sz[k]), "cross backward %s: the kept u and the remade one differ", op.gname[k]);
        free(g0[k]), free(g1[k]);
    }
    for (int k = 0; k < 5; k++) free(ref[k]), free(c.d[k]), free((void *)src[k]);
    free(out), free(out_nou), free(vx), free(u), free(want), free((void *)c.R);
}

/* ---- relu, BCE ---- */

TEST_CASE(test_relu) {
    size_t n = 1000;
    float *x = randn(n, 20, 0.0f, 1.0f), *y = zeros(n), *dout = randn(n, 21, 0.0f, 1.0f), *dx = randn(n, 22, 0.0f, 1.0f);
    float *dx0 = nb_malloc(n * sizeof(float), "dx0");
    memcpy(dx0, dx, n * sizeof(float));
    nb_relu_forward(y, x, n);
    nb_relu_backward(dx, x, dout, n);
    int ok = 1;
    for (size_t i = 0; i < n; i++) {
        ok &= y[i] == (x[i] > 0 ? x[i] : 0.0f);
        ok &= dx[i] == (x[i] > 0 ? dx0[i] + dout[i] : dx0[i]);
    }
    CHECK(ok, "relu forward/backward (accumulating) wrong");
    nb_relu_backward(NULL, x, dout, n);
    nb_relu_forward(x, x, n); /* in place */
    CHECK(same_bits(x, y, n), "relu in place differs");
    free(x), free(y), free(dout), free(dx), free(dx0);
}

enum { BN = 9 };
typedef struct {
    double *z;
    const float *y, *w;
    float scale;
} bce_case;

static double bce_ref(double z, double y) { return fmax(z, 0) - z * y + log1p(exp(-fabs(z))); }

static double bce_loss(const void *p) {
    const bce_case *c = p;
    double L = 0;
    for (int i = 0; i < BN; i++) L += (c->w ? c->w[i] : 1.0) * bce_ref(c->z[i], c->y[i]);
    return c->scale * L;
}

TEST_CASE(test_bce) {
    /* Large logits of both signs must give finite losses and gradients. */
    float z[BN] = {-3.0f, 0.5f, 2.0f, -0.1f, 0.0f, 90.0f, -90.0f, 1.5f, -200.0f};
    float y[BN] = {0, 1, 1, 0, 1, 0, 1, 0.25f, 0};
    float w[BN] = {1, 2, 0.5f, 1, 3, 1, 1, 1, 1};
    for (int weighted = 0; weighted < 2; weighted++) {
        bce_case c = {to_double(z, BN), y, weighted ? w : NULL, weighted ? 1.0f : 1.0f / BN};
        float losses[BN], dz[BN] = {0}, dz2[BN], acc[BN];
        double L = nb_bce_logits_forward_backward(dz, losses, z, y, c.w, BN, c.scale);
        double Lref = bce_loss(&c), lref[BN];
        for (int i = 0; i < BN; i++) lref[i] = bce_ref(z[i], y[i]);
        CHECK(fabs(L - Lref) < 1e-6 * fabs(Lref), "bce loss %.9g vs %.9g", L, Lref);
        CHECK(max_rel(losses, lref, BN) < FWD_TOL, "bce per-sample losses wrong");
        CHECK(losses[5] > 89.0f && isfinite(losses[5]) && losses[8] < 1e-30, "bce at extreme logits");
        double ge = fd_error(bce_loss, &c, c.z, dz, BN);
        CHECK(ge < GRAD_TOL, "bce gradient error %.3g", ge);
        for (int i = 0; i < BN; i++) CHECK(isfinite(dz[i]), "bce gradient %d not finite", i);
        memcpy(dz2, dz, sizeof(dz));
        nb_bce_logits_forward_backward(dz2, NULL, z, y, c.w, BN, c.scale);
        for (int i = 0; i < BN; i++) acc[i] = 2 * dz[i];
        CHECK(same_bits(dz2, acc, BN), "bce gradient does not accumulate");
        double L2 = nb_bce_logits_forward_backward(NULL, NULL, z, y, c.w, BN, c.scale);
        CHECK(L2 == L, "bce loss without gradient differs");
        if (ot_grad()) ot_err(ge, GRAD_TOL);
        else ot_err(fabs(L - Lref) / fabs(Lref), 1e-6);
        ot_log("  bce %-12s loss %.6f  err %.1e  dz %.1e\n", weighted ? "weighted" : "mean", L, fabs(L - Lref), ge);
        free(c.z);
    }
}

/* ---- masked self-attention ---- */

typedef struct {
    double *xq; /* qkv in double */
    const float *qkv, *out, *lse, *R;
} sa_case;

static void sa_ref(const sa_case *c, double *out) {
    int HS = SE / SH;
    size_t ld = 3 * SE;
    memset(out, 0, (size_t)SB * SL * SE * sizeof(double));
    for (int b = 0; b < SB; b++)
        for (int h = 0; h < SH; h++)
            for (int i = 0; i < S_LENGTHS[b]; i++) {
                const double *x = c->xq + (size_t)b * SL * ld;
                double s[SL], mx = -INFINITY, sum = 0;
                for (int j = 0; j < S_LENGTHS[b]; j++) {
                    s[j] = 0;
                    for (int d = 0; d < HS; d++) s[j] += x[i * ld + h * HS + d] * x[j * ld + SE + h * HS + d];
                    s[j] /= sqrt(HS);
                    mx = fmax(mx, s[j]);
                }
                for (int j = 0; j < S_LENGTHS[b]; j++) sum += (s[j] = exp(s[j] - mx));
                for (int j = 0; j < S_LENGTHS[b]; j++)
                    for (int d = 0; d < HS; d++)
                        out[((size_t)b * SL + i) * SE + h * HS + d] += s[j] / sum * x[j * ld + 2 * SE + h * HS + d];
            }
}

static double sa_loss(const void *p) {
    const sa_case *c = p;
    double out[SB * SL * SE], L = 0;
    sa_ref(c, out);
    for (int i = 0; i < SB * SL * SE; i++) L += out[i] * c->R[i];
    return L;
}

static void sa_bwd(const void *p, float *const *g) {
    const sa_case *c = p;
    nb_seqattn_backward(g[0], c->R, c->qkv, c->out, c->lse, S_LENGTHS, SB, SL, SH, SE);
}

TEST_CASE(test_seqattn) {
    size_t nq = (size_t)SB * SL * 3 * SE, no = (size_t)SB * SL * SE;
    float *qkv = randn(nq, 30, 0.0f, 1.0f), *out = randn(no, 31, 0.0f, 1.0f), *lse = zeros((size_t)SB * SH * SL);
    sa_case c = {to_double(qkv, nq), qkv, out, lse, randn(no, 32, 0.0f, 1.0f)};
    nb_seqattn_forward(out, lse, qkv, S_LENGTHS, SB, SL, SH, SE);
    double want[SB * SL * SE];
    sa_ref(&c, want);
    double fe = max_rel(out, want, no);
    CHECK(fe < FWD_TOL, "self-attention forward error %.3g", fe);
    int zero = 1;
    for (int b = 0; b < SB; b++)
        for (int i = S_LENGTHS[b]; i < SL; i++)
            for (int e = 0; e < SE; e++) zero &= out[((size_t)b * SL + i) * SE + e] == 0.0f;
    CHECK(zero, "padded rows (and the empty history) must output zeros");

    grad_op op = {"seqattn", 1, {nq}, {"dqkv"}, sa_bwd, &c, 0, 0};
    float *ref[1];
    check_grad_semantics(&op, ref);
    double ge[1] = {fd_error(sa_loss, &c, c.xq, ref[0], nq)};
    CHECK(ge[0] < GRAD_TOL, "self-attention gradient error %.3g", ge[0]);
    zero = 1;
    for (int b = 0; b < SB; b++)
        for (int i = S_LENGTHS[b]; i < SL; i++)
            for (int e = 0; e < 3 * SE; e++) zero &= ref[0][((size_t)b * SL + i) * 3 * SE + e] == 0.0f;
    CHECK(zero, "padded rows must get no gradient");
    report("seqattn", fe, ge, &op);
    free(qkv), free(out), free(lse), free(c.xq), free((void *)c.R), free(ref[0]);
}

/* ---- target attention ---- */

typedef struct {
    double *d[3]; /* q, k, v */
    const float *q, *k, *v, *attn, *R;
} ta_case;

static void ta_ref(const ta_case *c, double *pooled) {
    memset(pooled, 0, (size_t)SB * SE * sizeof(double));
    for (int b = 0; b < SB; b++) {
        int len = S_LENGTHS[b];
        double s[SL], mx = -INFINITY, sum = 0;
        for (int j = 0; j < len; j++) {
            s[j] = 0;
            for (int e = 0; e < SE; e++) s[j] += c->d[0][b * SE + e] * c->d[1][((size_t)b * SL + j) * SE + e];
            s[j] /= sqrt(SE);
            mx = fmax(mx, s[j]);
        }
        for (int j = 0; j < len; j++) sum += (s[j] = exp(s[j] - mx));
        for (int j = 0; j < len; j++)
            for (int e = 0; e < SE; e++) pooled[b * SE + e] += s[j] / sum * c->d[2][((size_t)b * SL + j) * SE + e];
    }
}

static double ta_loss(const void *p) {
    const ta_case *c = p;
    double pooled[SB * SE], L = 0;
    ta_ref(c, pooled);
    for (int i = 0; i < SB * SE; i++) L += pooled[i] * c->R[i];
    return L;
}

static void ta_bwd(const void *p, float *const *g) {
    const ta_case *c = p;
    nb_targetattn_backward(g[0], g[1], g[2], c->R, c->q, c->k, c->v, c->attn, S_LENGTHS, SB, SL, SE, SE);
}

TEST_CASE(test_targetattn) {
    size_t nq = (size_t)SB * SE, nk = (size_t)SB * SL * SE;
    float *q = randn(nq, 40, 0.0f, 1.0f), *k = randn(nk, 41, 0.0f, 1.0f), *v = randn(nk, 42, 0.0f, 1.0f);
    float *pooled = randn(nq, 43, 0.0f, 1.0f), *attn = randn((size_t)SB * SL, 44, 0.0f, 1.0f);
    ta_case c = {{to_double(q, nq), to_double(k, nk), to_double(v, nk)}, q, k, v, attn, randn(nq, 45, 0.0f, 1.0f)};
    nb_targetattn_forward(pooled, attn, q, k, v, S_LENGTHS, SB, SL, SE, SE);
    double want[SB * SE];
    ta_ref(&c, want);
    double fe = max_rel(pooled, want, nq);
    CHECK(fe < FWD_TOL, "target attention forward error %.3g", fe);
    int zero = 1;
    for (int e = 0; e < SE; e++) zero &= pooled[e] == 0.0f; /* sample 0: empty history */
    for (int b = 0; b < SB; b++)
        for (int j = S_LENGTHS[b]; j < SL; j++) zero &= attn[b * SL + j] == 0.0f;
    CHECK(zero, "empty history must pool to zeros and padded weights must be 0");

    /* Fused [k | v] rows (ldkv = 2E) give bitwise the same result. */
    float *kv = zeros(2 * nk), *pooled2 = zeros(nq), *attn2 = zeros((size_t)SB * SL);
    for (size_t r = 0; r < (size_t)SB * SL; r++) {
        memcpy(kv + r * 2 * SE, k + r * SE, SE * sizeof(float));
        memcpy(kv + r * 2 * SE + SE, v + r * SE, SE * sizeof(float));
    }
    nb_targetattn_forward(pooled2, attn2, q, kv, kv + SE, S_LENGTHS, SB, SL, SE, 2 * SE);
    CHECK(same_bits(pooled2, pooled, nq), "fused k|v (ldkv = 2E) differs from separate k, v");

    grad_op op = {"targetattn", 3, {nq, nk, nk}, {"dq", "dk", "dv"}, ta_bwd, &c, 0, 0};
    float *ref[3];
    check_grad_semantics(&op, ref);
    double ge[3];
    size_t sz[3] = {nq, nk, nk};
    for (int i = 0; i < 3; i++) {
        ge[i] = fd_error(ta_loss, &c, c.d[i], ref[i], sz[i]);
        CHECK(ge[i] < GRAD_TOL, "target attention %s error %.3g", op.gname[i], ge[i]);
    }
    zero = 1;
    for (int b = 0; b < SB; b++)
        for (int j = S_LENGTHS[b]; j < SL; j++)
            for (int e = 0; e < SE; e++)
                zero &= ref[1][((size_t)b * SL + j) * SE + e] == 0.0f && ref[2][((size_t)b * SL + j) * SE + e] == 0.0f;
    CHECK(zero, "padded k, v rows must get no gradient");
    /* Fused backward: dk, dv interleaved in one [B, L, 2E] buffer match the separate ones. */
    float *dkv = zeros(2 * nk);
    nb_targetattn_backward(NULL, dkv, dkv + SE, c.R, q, kv, kv + SE, attn, S_LENGTHS, SB, SL, SE, 2 * SE);
    int ok = 1;
    for (size_t r = 0; r < (size_t)SB * SL; r++)
        ok &= same_bits(dkv + r * 2 * SE, ref[1] + r * SE, SE) && same_bits(dkv + r * 2 * SE + SE, ref[2] + r * SE, SE);
    CHECK(ok, "fused dk|dv differs from separate");
    report("targetattn", fe, ge, &op);
    for (int i = 0; i < 3; i++) free(c.d[i]), free(ref[i]);
    free(q), free(k), free(v), free(pooled), free(attn), free(kv), free(pooled2), free(attn2), free(dkv);
    free((void *)c.R);
}

/* ---- sparse optimizers ---- */

enum { ON = 10, OE = 12, OU = 3 };
static const int64_t O_ROWS[OU] = {1, 4, 7};

TEST_CASE(test_rowwise_adagrad) {
    float *table = randn((size_t)ON * OE, 50, 0.0f, 1.0f), *acc = zeros(ON);
    float *table0 = nb_malloc((size_t)ON * OE * sizeof(float), "t0");
    memcpy(table0, table, (size_t)ON * OE * sizeof(float));
    double *wt = to_double(table, (size_t)ON * OE), wacc[ON] = {0};
    nb_rowwise_adagrad_cfg cfg = {0.05f, 1e-8f};
    for (int step = 0; step < 5; step++) {
        float *g = randn((size_t)OU * OE, 51 + step, 0.0f, 1.0f + step);
        nb_rowwise_adagrad_update(table, acc, O_ROWS, g, OU, OE, ON, cfg);
        for (int u = 0; u < OU; u++) {
            int64_t r = O_ROWS[u];
            double ss = 0;
            for (int e = 0; e < OE; e++) ss += (double)g[u * OE + e] * g[u * OE + e];
            wacc[r] += ss / OE;
            for (int e = 0; e < OE; e++) wt[r * OE + e] -= cfg.lr * g[u * OE + e] / (sqrt(wacc[r]) + cfg.eps);
        }
        free(g);
    }
    double e = max_rel(table, wt, (size_t)ON * OE);
    CHECK(e < 1e-6, "row-wise Adagrad vs scalar reference: %.3g", e);
    CHECK(max_rel(acc, wacc, ON) < 1e-6, "row-wise Adagrad accumulators wrong");
    for (int r = 0; r < ON; r++) {
        if (r == 1 || r == 4 || r == 7) continue;
        CHECK(same_bits(table + r * OE, table0 + r * OE, OE) && acc[r] == 0.0f, "untouched row %d changed", r);
    }
    ot_err(e, 1e-6);
    ot_log("  rowwise adagrad  5 steps err %.1e\n", e);
    free(table), free(acc), free(table0), free(wt);
}

TEST_CASE(test_sparse_adam) {
    float *table = randn((size_t)ON * OE, 60, 0.0f, 1.0f), *m = zeros((size_t)ON * OE), *v = zeros((size_t)ON * OE);
    float *table0 = nb_malloc((size_t)ON * OE * sizeof(float), "t0");
    memcpy(table0, table, (size_t)ON * OE * sizeof(float));
    double *wt = to_double(table, (size_t)ON * OE), *wm = nb_calloc((size_t)ON * OE, sizeof(double), "m"),
           *wv = nb_calloc((size_t)ON * OE, sizeof(double), "v");
    nb_sparse_adam_cfg cfg = {0.01f, 0.9f, 0.999f, 1e-8f};
    for (int t = 1; t <= 5; t++) {
        /* Row 7 is skipped at steps 2 and 3: lazy, and the step count stays global. */
        int U = (t == 2 || t == 3) ? 2 : OU;
        float *g = randn((size_t)OU * OE, 61 + t, 0.0f, 1.0f);
        nb_sparse_adam_update(table, m, v, O_ROWS, g, U, OE, ON, cfg, t);
        for (int u = 0; u < U; u++)
            for (int e = 0; e < OE; e++) {
                size_t i = (size_t)O_ROWS[u] * OE + e;
                double gi = g[u * OE + e];
                wm[i] = 0.9 * wm[i] + 0.1 * gi;
                wv[i] = 0.999 * wv[i] + 0.001 * gi * gi;
                wt[i] -= 0.01 * (wm[i] / (1 - pow(0.9, t))) / (sqrt(wv[i] / (1 - pow(0.999, t))) + 1e-8);
            }
        free(g);
    }
    double e = max_rel(table, wt, (size_t)ON * OE);
    CHECK(e < 1e-5, "sparse Adam vs scalar reference: %.3g", e);
    for (int r = 0; r < ON; r++) {
        if (r == 1 || r == 4 || r == 7) continue;
        int zero = 1;
        for (int i = 0; i < OE; i++) zero &= m[r * OE + i] == 0.0f && v[r * OE + i] == 0.0f;
        CHECK(same_bits(table + r * OE, table0 + r * OE, OE) && zero, "untouched row %d changed", r);
    }
    ot_err(e, 1e-5);
    ot_log("  sparse adam      5 steps err %.1e\n", e);
    free(table), free(m), free(v), free(table0), free(wt), free(wm), free(wv);
}

static void unsorted_rows(void) {
    int64_t rows[2] = {4, 4};
    float table[10 * 2] = {0}, acc[10] = {0}, g[4] = {1, 1, 1, 1};
    nb_rowwise_adagrad_update(table, acc, rows, g, 2, 2, 10, (nb_rowwise_adagrad_cfg){0.1f, 1e-8f});
}
TEST_CASE(test_sparse_rejects_duplicate_rows) {
    int st = ot_child_status(unsorted_rows);
    CHECK(st == 1, "duplicate rows in a sparse update: want exit 1, got %d", st);
}

/* ---- lookup lists with multi-valued columns (nb_ctr_lists + nb_ctr_lists_mv) against the
 * lists written out from ops_ctr.h's formula: the slots, lookup (nf + 1) B + r - e_g - 1 of every
 * value after its field's first, the histories and padding after them; every byte compared. ---- */
static void check_lists_mv(const char *name, mvl_case *c) {
    const nb_ctr_lists_shape *s = &c->sh;
    size_t n = (size_t)c->n;
    int64_t *got[3], *want[3];
    for (int a = 0; a < 3; a++) {
        got[a] = nb_malloc(n * 8 + 8, "lists"), want[a] = nb_malloc(n * 8 + 8, "lists");
        for (size_t k = 0; k < n; k++) got[a][k] = want[a][k] = -7; /* nothing may stay unwritten */
    }
    const size_t G = (size_t)s->B * s->ncols;
    int32_t *before = nb_malloc(G * 4 + 4, "before");
    for (size_t g = 0; g < G; g++) before[g] = -7;
    nb_ctr_lists(s, c->cat, c->target, c->hist, c->hoff, got[0], got[1], got[2]);
    nb_ctr_lists_mv(s, c->mv, c->moff, got[0], got[1], got[2], before);
    const int nf = s->ncat + 1;
    const size_t first = (size_t)s->B * (nf + 1);
    for (int i = 0; i < s->B; i++) {
        for (int f = 0; f <= nf; f++) { /* f = nf: the second target lookup */
            int ff = f < nf ? f : s->ncat;
            uint64_t id = ff < s->ncat ? c->cat[(size_t)i * s->ncat + ff] : c->target[i];
            size_t k = f < nf ? (size_t)i * nf + f : (size_t)s->B * nf + i;
            want[0][k] = s->off[ff] + (int64_t)(id % (uint64_t)s->rows[ff]);
            want[1][k] = f < nf ? i * s->D0 + (1 + ff) * s->E : -1;
            want[2][k] = f < nf ? i * s->D0 + (1 + ff) * s->E : s->MB * s->D0 + i * s->E;
        }
    }
    int64_t before_want = 0; /* e_g */
    size_t bad_before = G;
    for (int i = 0; i < s->B; i++)
        for (int j = 0; j < s->ncols; j++) {
            size_t g = (size_t)i * s->ncols + j, slot = (size_t)i * nf + s->col_field[j];
            int f = s->col_field[j];
            int32_t r0 = c->moff[g], r1 = c->moff[g + 1];
            if (bad_before == G && before[g] != before_want) bad_before = g;
            if (r1 == r0) {
                want[0][slot] = want[0][(size_t)i * nf + s->ncat], want[2][slot] = s->zero_src;
                continue;
            }
            want[0][slot] = s->off[f] + (int64_t)(c->mv[r0] % (uint64_t)s->rows[f]);
            for (int32_t r = r0 + 1; r < r1; r++) {
                size_t k = first + (size_t)(r - before_want - 1);
                want[0][k] = s->off[f] + (int64_t)(c->mv[r] % (uint64_t)s->rows[f]);
                want[1][k] = (int64_t)r * s->E;
                want[2][k] = s->col_sum[j] ? i * s->D0 + (1 + f) * s->E : s->mv_src + (int64_t)r * s->E;
            }
            before_want++;
        }
    for (int64_t r = 0; r < s->nh_pad; r++) {
        size_t k = first + (size_t)s->nmv + (size_t)r;
        want[0][k] = r < s->nh ? s->off[s->ncat] + (int64_t)(c->hist[r] % (uint64_t)s->rows[s->ncat]) : s->pad_row;
        want[1][k] = r * s->E;
        want[2][k] = r < s->nh ? s->MB * (s->D0 + s->E) + r * s->E : 0;
    }
    CHECK(bad_before == G, "lists_mv %s: before differs at field %zu of %zu", name, bad_before, G);
    free(before);
    const char *what[3] = {"rows", "gather destinations", "gradient sources"};
    for (int a = 0; a < 3; a++) {
        size_t bad = n;
        for (size_t k = 0; k < n && bad == n; k++)
            if (got[a][k] != want[a][k]) bad = k;
        CHECK(bad == n, "lists_mv %s: %s differ at lookup %zu of %zu (%lld, want %lld)", name, what[a], bad, n,
              bad < n ? (long long)got[a][bad] : 0LL, bad < n ? (long long)want[a][bad] : 0LL);
    }
    ot_log("    lists_mv %-40s %d samples, %d values, %d lookups past the firsts, %ld in all\n", name, s->B, s->nvals,
           s->nmv, c->n);
    for (int a = 0; a < 3; a++) free(got[a]), free(want[a]);
}

TEST_CASE(test_lists_mv) {
    static const int cols[4] = {0, 3, 4, 9}, kmax[4] = {5, 1, 12, 3};
    mvl_case c = mvl_make(300, 12, cols, kmax, 4, 9, 0, 11);
    check_lists_mv("empty, one-value, long fields, histories", &c);
    mvl_free(&c);
    c = mvl_make(64, 12, cols, kmax, 4, 0, 1, 17);
    check_lists_mv("fixed sizes, no history (DLRM's)", &c);
    mvl_free(&c);
    static const int one[1] = {1}, k1[1] = {1};
    c = mvl_make(50, 3, one, k1, 1, 4, 0, 23);
    check_lists_mv("at most one value (no lookup past the firsts)", &c);
    mvl_free(&c);
}

static const ot_row rows[] = {
    {"embag_bad_row", "cpu", OT_NONE, "row 9 of 9", 0, OT_EVAL, test_embag_rejects_bad_row, 0, OT_FORK},
    {"sparse_dup_rows", "cpu", OT_NONE, "rows {4, 4}", 0, OT_EVAL, test_sparse_rejects_duplicate_rows, 0, OT_FORK},
    {"embag_gather_unique", "cpu", OT_F32, "11 lookups of 9x70, 4 bags", 0, OT_EVAL, test_embag_gather_unique, 0, 0},
    {"embag_bag", "cpu", OT_F32, "sum, mean: 4 bags of 9x70", FWD_TOL, OT_EVAL, test_embag_bag, 0, 0},
    {"embag_bag", "cpu", OT_F32, "sum, mean: 4 bags of 9x70", GRAD_TOL, OT_GRAD, test_embag_bag, 0, 0},
    {"mvpool", "cpu", OT_F32, "sum, mean: 3x2 bags {3,0,1,4,0,3} of 11x70", FWD_TOL, OT_EVAL, test_mvpool, 0, 0},
    {"mvpool", "cpu", OT_F32, "sum, mean: 3x2 bags {3,0,1,4,0,3} of 11x70", GRAD_TOL, OT_GRAD, test_mvpool, 0, 0},
    {"lists_mv", "cpu", OT_NONE, "empty, one-value, 12-value fields; DLRM's fixed sizes", 0, OT_EVAL, test_lists_mv, 0, 0},
    {"embag_unique_large", "cpu", OT_NONE, "3000 rows to ~5M", 0, OT_EVAL, test_embag_unique_large, 0, 0},
    {"embag_unique_groups", "cpu", OT_NONE, "parallel, hot head, ascending", 0, OT_EVAL, test_embag_unique_groups_parallel, 0, 0},
    {"cross", "cpu", OT_F32, "N3 D13 r4", FWD_TOL, OT_EVAL, test_cross, 0, 0},
    {"cross", "cpu", OT_F32, "N3 D13 r4", GRAD_TOL, OT_GRAD, test_cross, 0, 0},
    {"relu", "cpu", OT_F32, "1000", 0, OT_EVAL, test_relu, 0, 0},
    {"bce", "cpu", OT_F32, "9 (logits to +-200), weighted", 1e-6, OT_EVAL, test_bce, 0, 0},
    {"bce", "cpu", OT_F32, "9 (logits to +-200), weighted", GRAD_TOL, OT_GRAD, test_bce, 0, 0},
    {"seqattn", "cpu", OT_F32, "B3 L5 lens {0,5,2} E12 H3", FWD_TOL, OT_EVAL, test_seqattn, 0, 0},
    {"seqattn", "cpu", OT_F32, "B3 L5 lens {0,5,2} E12 H3", GRAD_TOL, OT_GRAD, test_seqattn, 0, 0},
    {"targetattn", "cpu", OT_F32, "B3 L5 E12, fused k|v", FWD_TOL, OT_EVAL, test_targetattn, 0, 0},
    {"targetattn", "cpu", OT_F32, "B3 L5 E12, fused k|v", GRAD_TOL, OT_GRAD, test_targetattn, 0, 0},
    {"rowwise_adagrad", "cpu", OT_F32, "10x12, 3 rows x 5 steps", 1e-6, OT_EVAL, test_rowwise_adagrad, 0, 0},
    {"sparse_adam", "cpu", OT_F32, "10x12, 3 rows x 5 steps", 1e-5, OT_EVAL, test_sparse_adam, 0, 0},
};
OT_TABLE(ot_ctr, rows);
