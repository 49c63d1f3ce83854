/* GPU timings of the seqctr ops (`test_ops --mode perf --op ctr_model [-- SPEC [TABLE_CAP [B]]]`): every op of
 * the seqctr model's phases at the model's shapes, one synthetic batch, bf16 (fp32 in a second column).
 *
 * The batch is the trainer's: samples 0 .. B-1 of the generator SPEC (default the benchmarks'
 * synth:cap=1000000,max_len=256; B = 4096), tables of min(cardinality, TABLE_CAP) rows (default 1000000, as
 * bench/seqctr_bench.sh), the lookup lists, packed history offsets and unique-row groups built as nb_sc_prepare builds
 * them; E 64, 4 heads, 1 history layer, 6 blocks, rank 256, hidden 512 (nb_sc_config_default). Every buffer starts as
 * random non-zero data (magnitudes 0.25..1 of a scale, random signs; positive where it must be); one pass over all the
 * phases then makes the saved activations (lse, attention weights, LN statistics) the real ones.
 *
 * Per op: "alone" = median of BN_REPS launches after BN_WARM warm-ups, one event pair around one launch, behind a 2
 * GiB memset that keeps the GPU busy while the host enqueues (so the time is the kernels' own, with a cold L2); "in
 * seq" = the median time between the events recorded after each op of the phase's sequence (warm L2, as in the model).
 * GB/s = bytes / alone time, bytes = the least traffic: each input read once, each output written once, an accumulated
 * (+=) output read and written, weights and fp32 gradients / statistics included, index lists included. TFLOP/s = 2 x
 * multiply-adds (attention: the valid pairs only; backward = 2.5 x forward; cross backward = 4 GEMMs of N x D x r:
 * t = vx U^T + b is kept by the forward).
 *
 * Per phase: the sums of both, then the sequence enqueued back to back with one event pair around it, (a) behind the
 * memset (kernels only, launch latency hidden) and (b) with the GPU idle before it (b - a = launch and host gaps), the
 * host time to enqueue it, and the model's own phase (nb_sc_model on the same batch, nb_sc_enqueue_phase, events
 * between the phases of whole steps, bf16): what the trainer's lane spans measure. */
#include "optest.h"

#ifdef NB_WITH_CUDA
#include "ctr_cuda.h"

#ifndef BN_REPS
#define BN_REPS 21
#define BN_WARM 3
#endif
#define BN_MAXOPS 128
#define BN_MAXSEQ 128
#define BN_EXTRA NB_SC_NPHASES   /* ops outside the model's phases (alternatives) */
#define BN_NPH (NB_SC_NPHASES + 1)
#ifndef BN_FILL_BYTES
#define BN_FILL_BYTES ((size_t)2 << 30)
#endif

/* GPU time of the phases measured in training (H200, B 4096, E 64, max_len 256), ms */
static const double BN_MEASURED_MS[BN_NPH] = {[NB_SC_FWD_HIST] = 2.4, [NB_SC_BWD_HIST] = 2.9, [NB_SC_BWD_EMB] = 1.1};

/* the batch, host side (built once) */
static struct {
    char spec[256];
    long long table_cap;
    nb_sc_config cfg;
    int B, E, H, L, D0, R, HID, NBLK;
    int nh, nlk, U, max_len_seen, max_group, singles;
    double sum_len2; /* sum over samples of len^2: the attention's valid (query, key) pairs per head */
    size_t nsrc;     /* elements of the gradient region [dx0 | dtemb | dh] */
    int64_t emb_rows;
    float *dense, *label;
    uint32_t *cat, *target, *hist;
    int32_t *hist_len, *off, *order, *seg, *inverse;
    int64_t *rows, *dst, *src, *uniq;
} BT;

#define BN_MAX_TENSORS 512 /* the model's tensor table (nb_sc_init_on): 6 + 12 + 3 + 9 * 6 tensors */
static nb_sc_tensor BTT[BN_MAX_TENSORS];
static int BNT;
static size_t BNPARAMS, BNUSED; /* the bench model's parameter counts */
static nb_adamw_span BSPANS[BN_MAX_TENSORS];

/* the precision being timed: column 0 bf16, 1 fp32 */
static int PI;
static const nb_backend_i *BE;
static const nb_ctr_ops_i *CO;
static size_t ES;  /* bytes of an activation element */
static int LOWP;   /* 1: the backend keeps a low-precision compute copy of the weights (bf16) */
#define CX (&ot_gctx)
static void *ACT(void *p, size_t i) { return p ? (char *)p + i * ES : NULL; }

/* device buffers of the op-level timing */
static struct {
    int32_t *off, *order, *seg;
    int64_t *rows, *dst, *src, *uniq;
    float *dense, *label;
    float *hp_dense, *hp_label; /* pinned copies the embedding forward uploads (the lists: below) */
    int64_t *hp_rows, *hp_dst, *hp_src, *hp_uniq;
    int32_t *hp_order, *hp_seg, *hp_off;
    float *emb, *eacc, *ugrad;
    float *params, *grads, *am, *av;
    void *w;
    nb_adamw_scalars *k, *hk;
    void *dense_c, *a1, *a2, *bot, *x0, *temb;
    void *h0, *h1, *ln1, *qkv, *att, *x1, *ln2, *f1, *q, *kv, *pooled;
    float *mean1, *rstd1, *lse, *mean2, *rstd2, *attn;
    void *xprev, *c, *vx, *u, *hid, *xs;
    float *logit, *dz;
    double *loss;
    void *dsrc, *dx0, *dtemb, *dh, *dcur, *dprev, *dc, *dhid, *dhidp, *dbot, *da2, *da2p, *da1, *da1p;
    void *dq, *dpooled, *dkv, *dx1, *datt, *dqkv, *dln, *df1, *df1p;
} BD;

typedef struct {
    void *w; /* compute weight (act dtype) */
    float *g; /* fp32 gradient */
} bn_wt;
static struct {
    bn_wt bw[3], bb[3], ln1w, ln1b, qkvw, qkvb, projw, projb, ln2w, ln2b, fc1w, fc1b, fc2w, fc2b, wq, wk;
    bn_wt U, V, cb, w1, b1, w2, b2, hw, hb;
} TW;

static void *BN_DEV[160];
static int BN_NDEV;
static void *BN_HOST[16];
static int BN_NHOST;

static void *bn_dev(size_t bytes) {
    NB_ASSERT(BN_NDEV < (int)(sizeof BN_DEV / sizeof BN_DEV[0]));
    void *d = NULL;
    CUDA_CHECK(cudaMalloc(&d, bytes ? bytes : 16));
    return BN_DEV[BN_NDEV++] = d;
}

static void *bn_pinned(const void *src, size_t bytes) {
    NB_ASSERT(BN_NHOST < (int)(sizeof BN_HOST / sizeof BN_HOST[0]));
    void *h = BE->host_alloc(bytes ? bytes : 16, "bench batch");
    if (src && bytes) memcpy(h, src, bytes);
    return BN_HOST[BN_NHOST++] = h;
}
static void bn_free_all(void) {
    CUDA_CHECK(cudaDeviceSynchronize());
    for (int i = 0; i < BN_NDEV; i++) CUDA_CHECK(cudaFree(BN_DEV[i]));
    for (int i = 0; i < BN_NHOST; i++) BE->host_free(BN_HOST[i]);
    BN_NDEV = BN_NHOST = 0;
}
/* scale * (0.25 .. 1), a random sign unless positive: never zero */
static uint32_t bn_lcg = 12345u;
static float bn_rand(float scale, int positive) {
    bn_lcg = bn_lcg * 1664525u + 1013904223u;
    float mag = scale * (0.25f + 0.75f * (float)((bn_lcg >> 8) & 0x7fffffu) / 8388608.0f);
    return positive || (bn_lcg >> 31) ? mag : -mag;
}

/* n random elements (bf16 when half) into device memory d */
static void bn_fill(void *d, size_t n, int half, float scale, int positive) {
    size_t chunk = (size_t)1 << 22, es = half ? 2 : 4;
    void *h = nb_malloc(chunk * 4, "bench staging");
    for (size_t i0 = 0; i0 < n; i0 += chunk) {
        size_t m = n - i0 < chunk ? n - i0 : chunk;
        for (size_t i = 0; i < m; i++) {
            float v = bn_rand(scale, positive);
            if (half)
                ((uint16_t *)h)[i] = f2bf(v);
            else
                ((float *)h)[i] = v;
        }
        CUDA_CHECK(cudaMemcpy((char *)d + i0 * es, h, m * es, cudaMemcpyHostToDevice));
    }
    free(h);
}

static void *bn_act(size_t n, float scale) {
    void *d = bn_dev(n * ES);
    bn_fill(d, n, ES == 2, scale, 0);
    return d;
}
static float *bn_f32(size_t n, float scale, int positive) {
    float *d = bn_dev(n * 4);
    bn_fill(d, n, 0, scale, positive);
    return d;
}
static void *bn_up(const void *h, size_t bytes) {
    void *d = bn_dev(bytes);
    CUDA_CHECK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}

static bn_wt bn_w(const char *fmt, int idx) {
    char name[48];
    snprintf(name, sizeof name, fmt, idx);
    for (int i = 0; i < BNT; i++)
        if (!strcmp(BTT[i].name, name)) return (bn_wt){ACT(BD.w, BTT[i].off), BD.grads + BTT[i].off};
    nb_fail("the bench's tensor names follow seqctr.c's", "no tensor %s in the seqctr model", name);
}

/* ---- the batch: samples 0 .. B-1 of the generator, lists as nb_sc_prepare makes them ---- */

static void bn_batch(void) {
    nb_synth *g = nb_malloc(sizeof *g, "synthetic generator");
    nb_synth_open(g, BT.spec);
    nb_sc_config *c = &BT.cfg;
    nb_sc_config_default(c);
    c->max_len = g->o.max_len;
    for (int f = 0; f < NB_SC_STD_NCAT; f++) c->cat_rows[f] = g->card[f] < BT.table_cap ? g->card[f] : BT.table_cap;
    c->item_rows = g->o.items < BT.table_cap ? g->o.items : BT.table_cap;
    int B = BT.B, L = c->max_len, E = c->E;
    BT.E = E, BT.H = c->heads, BT.L = L, BT.D0 = 29 * E, BT.R = c->cross_rank, BT.HID = c->block_hidden;
    BT.NBLK = c->blocks;
    NB_CHECK(c->hist_layers == 1 && L > 0, "the bench times one history layer over non-empty histories",
             "hist_layers %d, max_len %d", c->hist_layers, L);
    BT.dense = nb_malloc((size_t)B * NB_SC_STD_NDENSE * 4, "bench batch");
    BT.label = nb_malloc((size_t)B * 4, "bench batch");
    BT.cat = nb_malloc((size_t)B * NB_SC_STD_NCAT * 4, "bench batch");
    BT.target = nb_malloc((size_t)B * 4, "bench batch");
    BT.hist = nb_malloc((size_t)B * L * 4, "bench batch");
    BT.hist_len = nb_malloc((size_t)B * 4, "bench batch");
    nb_synth_fill(g, 0, B, BT.dense, BT.cat, BT.target, BT.hist, BT.hist_len, BT.label, NULL);
    int64_t off[(NB_SC_STD_NCAT + 1) + 1] = {0};
    for (int t = 0; t < (NB_SC_STD_NCAT + 1); t++) off[t + 1] = off[t] + (t < NB_SC_STD_NCAT ? c->cat_rows[t] : c->item_rows);
    BT.emb_rows = off[NB_SC_STD_NCAT + 1];
    long nh = 0;
    for (int i = 0; i < B; i++) {
        int len = BT.hist_len[i];
        nh += len;
        BT.sum_len2 += (double)len * len;
        if (len > BT.max_len_seen) BT.max_len_seen = len;
    }
    BT.nh = (int)nh;
    BT.nlk = B * ((NB_SC_STD_NCAT + 1) + 1) + BT.nh;
    NB_CHECK(BT.nh > 0, "pick a generator with histories", "the batch has no history rows");
    size_t n = (size_t)BT.nlk, D0 = (size_t)BT.D0;
    BT.rows = nb_malloc(n * 8, "bench lookups"), BT.dst = nb_malloc(n * 8, "bench lookups");
    BT.src = nb_malloc(n * 8, "bench lookups"), BT.uniq = nb_malloc(n * 8, "bench lookups");
    BT.order = nb_malloc(n * 4, "bench lookups"), BT.inverse = nb_malloc(n * 4, "bench lookups");
    BT.seg = nb_malloc((n + 1) * 4, "bench lookups"), BT.off = nb_malloc(((size_t)B + 1) * 4, "bench lookups");
    for (int i = 0; i < B; i++) {
        for (int f = 0; f < (NB_SC_STD_NCAT + 1); f++) {
            size_t k = (size_t)i * (NB_SC_STD_NCAT + 1) + f;
            uint64_t id = f < NB_SC_STD_NCAT ? BT.cat[(size_t)i * NB_SC_STD_NCAT + f] : BT.target[i];
            BT.rows[k] = off[f] + (int64_t)(id % (uint64_t)(off[f + 1] - off[f]));
            BT.dst[k] = BT.src[k] = (int64_t)i * (int64_t)D0 + (int64_t)(1 + f) * E;
        }
        size_t k = (size_t)B * (NB_SC_STD_NCAT + 1) + i;
        BT.rows[k] = BT.rows[(size_t)i * (NB_SC_STD_NCAT + 1) + NB_SC_STD_NCAT];
        BT.dst[k] = -1;
        BT.src[k] = (int64_t)(B * D0) + (int64_t)i * E;
    }
    size_t k = (size_t)B * ((NB_SC_STD_NCAT + 1) + 1);
    BT.off[0] = 0;
    for (int i = 0; i < B; i++) {
        for (int j = 0; j < BT.hist_len[i]; j++, k++) {
            int64_t row = (int64_t)(k - (size_t)B * ((NB_SC_STD_NCAT + 1) + 1));
            BT.rows[k] = off[NB_SC_STD_NCAT] + (int64_t)(BT.hist[(size_t)i * L + j] % (uint64_t)c->item_rows);
            BT.dst[k] = row * E;
            BT.src[k] = (int64_t)(B * D0 + (size_t)B * E) + row * E;
        }
        BT.off[i + 1] = (int32_t)(k - (size_t)B * ((NB_SC_STD_NCAT + 1) + 1));
    }
    BT.U = nb_embag_unique_groups(BT.uniq, BT.order, BT.seg, BT.inverse, BT.rows, BT.nlk, NULL);
    for (int u = 0; u < BT.U; u++) {
        int cnt = BT.seg[u + 1] - BT.seg[u];
        if (cnt > BT.max_group) BT.max_group = cnt;
        BT.singles += cnt == 1;
    }
    BT.nsrc = (size_t)B * D0 + (size_t)B * E + (size_t)BT.nh * E;
    free(g);
}

/* ---- the ops, in the model's order (seqctr.c), on the buffers above ---- */

#define nB BT.B
#define nE BT.E
#define nH ((size_t)BT.nh)
#define FIRST ((size_t)BT.B * ((NB_SC_STD_NCAT + 1) + 1))
static const void *dense_in(void) { return BD.dense_c ? BD.dense_c : (const void *)BD.dense; }

/* embedding fwd (nb_sc_zero_grads is in the trainer's span of this phase) */
static void op_zero_grads(void) { BE->zero(CX, BD.grads, BNPARAMS * sizeof(float)); }
static double upload_bytes(void) {
    return (double)nB * (NB_SC_STD_NDENSE + 1) * 4 + (double)BT.nlk * (3 * 8 + 4) + ((double)BT.U + 1) * 4 +
           (double)BT.U * 8 + ((double)nB + 1) * 4;
}
static void op_upload(void) {
    size_t n = (size_t)BT.nlk, U = (size_t)BT.U;
    BE->to_backend(CX, BD.dense, BD.hp_dense, (size_t)nB * NB_SC_STD_NDENSE * sizeof(float));
    BE->to_backend(CX, BD.label, BD.hp_label, (size_t)nB * sizeof(float));
    BE->to_backend(CX, BD.rows, BD.hp_rows, n * 8);
    BE->to_backend(CX, BD.dst, BD.hp_dst, n * 8);
    BE->to_backend(CX, BD.src, BD.hp_src, n * 8);
    BE->to_backend(CX, BD.order, BD.hp_order, n * 4);
    BE->to_backend(CX, BD.seg, BD.hp_seg, (U + 1) * 4);
    BE->to_backend(CX, BD.uniq, BD.hp_uniq, U * 8);
    BE->to_backend(CX, BD.off, BD.hp_off, ((size_t)nB + 1) * 4);
}
static void op_zero_loss(void) { BE->zero(CX, BD.loss, sizeof(double)); }
static void op_zero_dsrc(void) { BE->zero(CX, BD.dsrc, BT.nsrc * ES); }
static void op_cast_dense(void) { BE->cast_params(CX, BD.dense_c, BD.dense, (size_t)nB * NB_SC_STD_NDENSE); }
static void op_bot0(void) {
    BE->matmul_fwd(CX, BD.a1, dense_in(), TW.bw[0].w, TW.bb[0].w, nB, NB_SC_STD_NDENSE, NB_SC_BOTTOM1);
}
static void op_bot_relu0(void) { CO->relu_fwd(CX, BD.a1, BD.a1, (size_t)nB * NB_SC_BOTTOM1); }
static void op_bot1(void) {
    BE->matmul_fwd(CX, BD.a2, BD.a1, TW.bw[1].w, TW.bb[1].w, nB, NB_SC_BOTTOM1, NB_SC_BOTTOM2);
}
static void op_bot_relu1(void) { CO->relu_fwd(CX, BD.a2, BD.a2, (size_t)nB * NB_SC_BOTTOM2); }
static void op_bot2(void) { BE->matmul_fwd(CX, BD.bot, BD.a2, TW.bw[2].w, TW.bb[2].w, nB, NB_SC_BOTTOM2, nE); }
static void op_copy_bot(void) { CO->copy_cols(CX, BD.x0, BT.D0, BD.bot, nE, nB, nE); }
static void op_gather_x0(void) { CO->emb_gather(CX, BD.x0, BD.dst, BD.emb, BD.rows, nB * (NB_SC_STD_NCAT + 1), nE); }
static void op_copy_temb(void) {
    CO->copy_cols(CX, BD.temb, nE, ACT(BD.x0, (size_t)(1 + NB_SC_STD_NCAT) * nE), BT.D0, nB, nE);
}

/* history fwd */
static void op_gather_h(void) { CO->emb_gather(CX, BD.h0, BD.dst + FIRST, BD.emb, BD.rows + FIRST, BT.nh, nE); }
static void op_ln1(void) {
    BE->layernorm_fwd(CX, BD.ln1, BD.mean1, BD.rstd1, BD.h0, TW.ln1w.w, TW.ln1b.w, BT.nh, nE, 1e-5f);
}
static void op_qkv(void) { BE->matmul_fwd(CX, BD.qkv, BD.ln1, TW.qkvw.w, TW.qkvb.w, BT.nh, nE, 3 * nE); }
static void op_seqattn_f(void) { CO->seqattn_fwd(CX, BD.att, BD.lse, BD.qkv, BD.off, nB, BT.L, BT.H, nE); }
static void op_proj(void) { BE->matmul_fwd(CX, BD.h1, BD.att, TW.projw.w, TW.projb.w, BT.nh, nE, nE); }
static void op_res1(void) { BE->residual_fwd(CX, BD.x1, BD.h0, BD.h1, nH * nE); }
static void op_ln2(void) {
    BE->layernorm_fwd(CX, BD.ln2, BD.mean2, BD.rstd2, BD.x1, TW.ln2w.w, TW.ln2b.w, BT.nh, nE, 1e-5f);
}
static void op_fc1(void) { BE->matmul_fwd(CX, BD.f1, BD.ln2, TW.fc1w.w, TW.fc1b.w, BT.nh, nE, 4 * nE); }
static void op_relu_f1(void) { CO->relu_fwd(CX, BD.f1, BD.f1, nH * 4 * nE); }
static void op_fc2(void) { BE->matmul_fwd(CX, BD.h1, BD.f1, TW.fc2w.w, TW.fc2b.w, BT.nh, 4 * nE, nE); }
static void op_res2(void) { BE->residual_fwd(CX, BD.h1, BD.x1, BD.h1, nH * nE); }
static void op_q(void) { BE->matmul_fwd(CX, BD.q, BD.temb, TW.wq.w, NULL, nB, nE, nE); }
static void op_kv(void) { BE->matmul_fwd(CX, BD.kv, BD.h1, TW.wk.w, NULL, BT.nh, nE, 2 * nE); }
static void op_targetattn_f(void) {
    CO->targetattn_fwd(CX, BD.pooled, BD.attn, BD.q, BD.kv, ACT(BD.kv, nE), BD.off, nB, BT.L, nE, 2 * nE);
}
static void op_copy_pooled(void) { CO->copy_cols(CX, ACT(BD.x0, (size_t)28 * nE), BT.D0, BD.pooled, nE, nB, nE); }

/* dense fwd: one block's ops (every block has the same shapes), then the last head's loss */
static void op_cross_f(void) {
    CO->cross_fwd(CX, BD.c, BD.vx, BD.u, BD.x0, BD.xprev, TW.U.w, TW.V.w, TW.cb.w, nB, BT.D0, BT.R);
}
static void op_w1_f(void) { BE->matmul_fwd(CX, BD.hid, BD.c, TW.w1.w, TW.b1.w, nB, BT.D0, BT.HID); }
static void op_relu_hid(void) { CO->relu_fwd(CX, BD.hid, BD.hid, (size_t)nB * BT.HID); }
static void op_w2_f(void) { BE->matmul_fwd(CX, BD.xs, BD.hid, TW.w2.w, TW.b2.w, nB, BT.HID, BT.D0); }
static void op_res_blk(void) { BE->residual_fwd(CX, BD.xs, BD.xs, BD.c, (size_t)nB * BT.D0); }
static void op_head_f(void) { CO->linear1_fwd(CX, BD.logit, BD.xs, TW.hw.w, TW.hb.w, nB, BT.D0); }
static void op_zero_dz(void) { BE->zero(CX, BD.dz, (size_t)nB * sizeof(float)); }
static void op_bce(void) { CO->bce(CX, BD.dz, BD.loss, BD.logit, BD.label, nB, 1.0f / (float)nB); }

/* dense bwd (one segment: every block keeps dx_prev) */
static void op_zero_dcur(void) { BE->zero(CX, BD.dcur, (size_t)nB * BT.D0 * ES); }
static void op_head_b(void) { CO->linear1_bwd(CX, BD.dcur, TW.hw.g, TW.hb.g, BD.dz, BD.xs, TW.hw.w, nB, BT.D0); }
static void op_copy_dc(void) { CO->copy_cols(CX, BD.dc, BT.D0, BD.dcur, BT.D0, nB, BT.D0); }
static void op_zero_dhid(void) { BE->zero(CX, BD.dhid, (size_t)nB * BT.HID * ES); }
static void op_w2_b(void) {
    BE->matmul_bwd(CX, BD.dhid, TW.w2.g, TW.b2.g, BD.dcur, BD.hid, TW.w2.w, nB, BT.HID, BT.D0);
}
static void op_zero_dhidp(void) { BE->zero(CX, BD.dhidp, (size_t)nB * BT.HID * ES); }
static void op_relu_hid_b(void) { CO->relu_bwd(CX, BD.dhidp, BD.hid, BD.dhid, (size_t)nB * BT.HID); }
static void op_w1_b(void) { BE->matmul_bwd(CX, BD.dc, TW.w1.g, TW.b1.g, BD.dhidp, BD.c, TW.w1.w, nB, BT.D0, BT.HID); }
static void op_cross_b(void) {
    CO->cross_bwd(CX, BD.dx0, BD.dprev, TW.U.g, TW.V.g, TW.cb.g, BD.dc, BD.x0, BD.xprev, TW.U.w, TW.V.w, TW.cb.w,
                  BD.vx, BD.u, nB, BT.D0, BT.R);
}
static void op_add_dx0(void) { BE->add_inplace(CX, BD.dx0, BD.dcur, (size_t)nB * BT.D0); }

/* join bwd */
static void op_copy_dbot(void) { CO->copy_cols(CX, BD.dbot, nE, BD.dx0, BT.D0, nB, nE); }
static void op_copy_dpooled(void) { CO->copy_cols(CX, BD.dpooled, nE, ACT(BD.dx0, (size_t)28 * nE), BT.D0, nB, nE); }

/* history bwd */
static void op_zero_dq(void) { BE->zero(CX, BD.dq, (size_t)nB * nE * ES); }
static void op_zero_dkv(void) { BE->zero(CX, BD.dkv, nH * 2 * nE * ES); }
static void op_targetattn_b(void) {
    CO->targetattn_bwd(CX, BD.dq, BD.dkv, ACT(BD.dkv, nE), BD.dpooled, BD.q, BD.kv, ACT(BD.kv, nE), BD.attn, BD.off,
                       nB, BT.L, nE, 2 * nE);
}
static void op_q_b(void) { BE->matmul_bwd(CX, BD.dtemb, TW.wq.g, NULL, BD.dq, BD.temb, TW.wq.w, nB, nE, nE); }
static void op_kv_b(void) { BE->matmul_bwd(CX, BD.dh, TW.wk.g, NULL, BD.dkv, BD.h1, TW.wk.w, BT.nh, nE, 2 * nE); }
static void op_copy_dx1(void) { CO->copy_cols(CX, BD.dx1, nE, BD.dh, nE, BT.nh, nE); }
static void op_zero_df1(void) { BE->zero(CX, BD.df1, nH * 4 * nE * ES); }
static void op_fc2_b(void) {
    BE->matmul_bwd(CX, BD.df1, TW.fc2w.g, TW.fc2b.g, BD.dh, BD.f1, TW.fc2w.w, BT.nh, 4 * nE, nE);
}
static void op_zero_df1p(void) { BE->zero(CX, BD.df1p, nH * 4 * nE * ES); }
static void op_relu_f1_b(void) { CO->relu_bwd(CX, BD.df1p, BD.f1, BD.df1, nH * 4 * nE); }
static void op_zero_dln(void) { BE->zero(CX, BD.dln, nH * nE * ES); }
static void op_fc1_b(void) {
    BE->matmul_bwd(CX, BD.dln, TW.fc1w.g, TW.fc1b.g, BD.df1p, BD.ln2, TW.fc1w.w, BT.nh, nE, 4 * nE);
}
static void op_ln2_b(void) {
    BE->layernorm_bwd(CX, BD.dx1, TW.ln2w.g, TW.ln2b.g, BD.dln, BD.x1, TW.ln2w.w, BD.mean2, BD.rstd2, BT.nh, nE);
}
static void op_copy_dh(void) { CO->copy_cols(CX, BD.dh, nE, BD.dx1, nE, BT.nh, nE); }
static void op_zero_datt(void) { BE->zero(CX, BD.datt, nH * nE * ES); }
static void op_proj_b(void) {
    BE->matmul_bwd(CX, BD.datt, TW.projw.g, TW.projb.g, BD.dx1, BD.att, TW.projw.w, BT.nh, nE, nE);
}
static void op_zero_dqkv(void) { BE->zero(CX, BD.dqkv, nH * 3 * nE * ES); }
static void op_seqattn_b(void) {
    CO->seqattn_bwd(CX, BD.dqkv, BD.datt, BD.qkv, BD.att, BD.lse, BD.off, nB, BT.L, BT.H, nE);
}
static void op_qkv_b(void) {
    BE->matmul_bwd(CX, BD.dln, TW.qkvw.g, TW.qkvb.g, BD.dqkv, BD.ln1, TW.qkvw.w, BT.nh, nE, 3 * nE);
}
static void op_ln1_b(void) {
    BE->layernorm_bwd(CX, BD.dh, TW.ln1w.g, TW.ln1b.g, BD.dln, BD.h0, TW.ln1w.w, BD.mean1, BD.rstd1, BT.nh, nE);
}

/* embedding bwd */
static void op_zero_da2(void) { BE->zero(CX, BD.da2, (size_t)nB * NB_SC_BOTTOM2 * ES); }
static void op_bot2_b(void) {
    BE->matmul_bwd(CX, BD.da2, TW.bw[2].g, TW.bb[2].g, BD.dbot, BD.a2, TW.bw[2].w, nB, NB_SC_BOTTOM2, nE);
}
static void op_zero_da2p(void) { BE->zero(CX, BD.da2p, (size_t)nB * NB_SC_BOTTOM2 * ES); }
static void op_relu_a2_b(void) { CO->relu_bwd(CX, BD.da2p, BD.a2, BD.da2, (size_t)nB * NB_SC_BOTTOM2); }
static void op_zero_da1(void) { BE->zero(CX, BD.da1, (size_t)nB * NB_SC_BOTTOM1 * ES); }
static void op_bot1_b(void) {
    BE->matmul_bwd(CX, BD.da1, TW.bw[1].g, TW.bb[1].g, BD.da2p, BD.a1, TW.bw[1].w, nB, NB_SC_BOTTOM1, NB_SC_BOTTOM2);
}
static void op_zero_da1p(void) { BE->zero(CX, BD.da1p, (size_t)nB * NB_SC_BOTTOM1 * ES); }
static void op_relu_a1_b(void) { CO->relu_bwd(CX, BD.da1p, BD.a1, BD.da1, (size_t)nB * NB_SC_BOTTOM1); }
static void op_bot0_b(void) {
    BE->matmul_bwd(CX, NULL, TW.bw[0].g, TW.bb[0].g, BD.da1p, dense_in(), TW.bw[0].w, nB, NB_SC_STD_NDENSE,
                   NB_SC_BOTTOM1);
}
static void op_grad_unique(void) {
    CO->emb_grad_unique(CX, BD.ugrad, BD.dsrc, BD.src, BD.order, BD.seg, NULL, BT.U, BT.nlk, nE);
}

/* optimizers */
static void op_adagrad(void) { CO->rowwise_adagrad(CX, BD.emb, BD.eacc, BD.uniq, BD.ugrad, NULL, BT.U, nE, 0.05f, 1e-8f); }
static void op_upload_k(void) { BE->to_backend(CX, BD.k, BD.hk, 2 * sizeof(nb_adamw_scalars)); }
static void op_adamw_tensors(void) {
    for (int i = 0; i < BNT; i++) {
        size_t o = BTT[i].off;
        BE->adamw(CX, BD.params + o, BD.grads + o, BD.am + o, BD.av + o, LOWP ? ACT(BD.w, o) : NULL, BTT[i].n,
                  &BD.k[BTT[i].decay ? 0 : 1], NULL);
    }
}
static void op_adamw_spans(void) {
    BE->adamw_spans(CX, BD.params, BD.grads, BD.am, BD.av, LOWP ? BD.w : NULL, BSPANS, BNT, BD.k, NULL, 0.0f);
}

/* ---- the table of ops ---- */

typedef struct {
    int phase, count; /* count: calls per phase (a block's ops: once per block) */
    char name[24], shape[48];
    double flop, bytes[2];
    void (*fn)(void);
    double alone[2], inseq[2]; /* microseconds per call (medians) */
    int absent[2];             /* not run in this precision */
} bn_op;

static bn_op BOPS[BN_MAXOPS];
static int BNOPS, BK;

static void NB_PRINTF(7, 8) add_op(int ph, int count, const char *name, double flop, double bytes, void (*fn)(void),
                                   const char *fmt, ...) {
    NB_ASSERT(BK < BN_MAXOPS);
    bn_op *o = &BOPS[BK++];
    if (BK > BNOPS) { /* first precision: the entry is new */
        memset(o, 0, sizeof *o);
        o->phase = ph, o->count = count, o->flop = flop, o->fn = fn;
        snprintf(o->name, sizeof o->name, "%s", name);
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(o->shape, sizeof o->shape, fmt, ap);
        va_end(ap);
        BNOPS = BK;
    }
    NB_ASSERT(o->fn == fn && o->phase == ph);
    o->bytes[PI] = bytes;
}

/* traffic of the common ops (ES bytes an activation element) */
static double b_mm_f(double N, double C, double OC, int bias) { return ES * (N * C + OC * C + N * OC + (bias ? OC : 0)); }
static double b_mm_b(int dinp, double N, double C, double OC, int dbias) {
    return ES * (N * OC + N * C + OC * C + (dinp ? 2 * N * C : 0)) + 8 * OC * C + (dbias ? 8 * OC : 0);
}
static double f_mm(double N, double C, double OC) { return 2 * N * C * OC; }

static void build_ops(void) {
    BK = 0;
    double B = nB, E = nE, nh = (double)BT.nh, D0 = BT.D0, R = BT.R, HID = BT.HID, n = BT.nlk, U = BT.U;
    double es = (double)ES, b1 = NB_SC_BOTTOM1, b2 = NB_SC_BOTTOM2, nd = NB_SC_STD_NDENSE, S2 = BT.sum_len2;
    int nb = BT.NBLK, ph;
    int iB = nB, iE = nE, inh = BT.nh, iD0 = BT.D0;

    ph = NB_SC_FWD_EMB;
    add_op(ph, 1, "zero dense grads", 0, 4.0 * BNPARAMS, op_zero_grads, "%zu fp32 (nb_sc_zero_grads)", BNPARAMS);
    add_op(ph, 1, "upload batch", 0, upload_bytes(), op_upload, "9 H2D copies, n=%d U=%d", BT.nlk, BT.U);
    add_op(ph, 1, "zero loss", 0, 8, op_zero_loss, "8 bytes");
    add_op(ph, 1, "zero grad region", 0, es * BT.nsrc, op_zero_dsrc, "[dx0|dtemb|dh] %zu", BT.nsrc);
    add_op(ph, 1, "cast dense", 0, B * nd * (4 + es), op_cast_dense, "%dx%d f32->bf16", iB, NB_SC_STD_NDENSE);
    BOPS[BK - 1].absent[PI] = BD.dense_c == NULL; /* the fp32 model reads the dense inputs as they are */
    add_op(ph, 1, "matmul_fwd bottom0", f_mm(B, nd, b1), b_mm_f(B, nd, b1, 1), op_bot0, "N=%d C=%d OC=%d", iB,
           NB_SC_STD_NDENSE, NB_SC_BOTTOM1);
    add_op(ph, 1, "relu_fwd", 0, 2 * es * B * b1, op_bot_relu0, "%dx%d", iB, NB_SC_BOTTOM1);
    add_op(ph, 1, "matmul_fwd bottom1", f_mm(B, b1, b2), b_mm_f(B, b1, b2, 1), op_bot1, "N=%d C=%d OC=%d", iB,
           NB_SC_BOTTOM1, NB_SC_BOTTOM2);
    add_op(ph, 1, "relu_fwd", 0, 2 * es * B * b2, op_bot_relu1, "%dx%d", iB, NB_SC_BOTTOM2);
    add_op(ph, 1, "matmul_fwd bottom2", f_mm(B, b2, E), b_mm_f(B, b2, E, 1), op_bot2, "N=%d C=%d OC=%d", iB,
           NB_SC_BOTTOM2, iE);
    add_op(ph, 1, "copy_cols bot->x0", 0, 2 * es * B * E, op_copy_bot, "%dx%d ld %d<-%d", iB, iE, iD0, iE);
    add_op(ph, 1, "emb_gather x0", 0, B * 27 * (E * 4 + 16) + es * B * 27 * E, op_gather_x0,
           "n=%d E=%d into x0 [%d,%d]", iB * (NB_SC_STD_NCAT + 1), iE, iB, iD0);
    add_op(ph, 1, "copy_cols temb", 0, 2 * es * B * E, op_copy_temb, "%dx%d ld %d<-%d", iB, iE, iE, iD0);

    ph = NB_SC_FWD_HIST;
    add_op(ph, 1, "emb_gather h0", 0, nh * (E * 4 + 16) + es * nh * E, op_gather_h, "n=nh=%d E=%d", inh, iE);
    add_op(ph, 1, "layernorm_fwd ln1", 0, es * (2 * nh * E + 2 * E) + 8 * nh, op_ln1, "[%d,%d]", inh, iE);
    add_op(ph, 1, "matmul_fwd qkv", f_mm(nh, E, 3 * E), b_mm_f(nh, E, 3 * E, 1), op_qkv, "N=%d C=%d OC=%d", inh, iE,
           3 * iE);
    add_op(ph, 1, "seqattn_fwd", 4 * S2 * E, es * (nh * 3 * E + nh * E) + 4 * nh * BT.H + 4 * (B + 1),
           op_seqattn_f, "B=%d L=%d H=%d E=%d nh=%d", iB, BT.L, BT.H, iE, inh);
    add_op(ph, 1, "matmul_fwd proj", f_mm(nh, E, E), b_mm_f(nh, E, E, 1), op_proj, "N=%d C=%d OC=%d", inh, iE, iE);
    add_op(ph, 1, "residual_fwd", 0, 3 * es * nh * E, op_res1, "%d x %d", inh, iE);
    add_op(ph, 1, "layernorm_fwd ln2", 0, es * (2 * nh * E + 2 * E) + 8 * nh, op_ln2, "[%d,%d]", inh, iE);
    add_op(ph, 1, "matmul_fwd fc1", f_mm(nh, E, 4 * E), b_mm_f(nh, E, 4 * E, 1), op_fc1, "N=%d C=%d OC=%d", inh, iE,
           4 * iE);
    add_op(ph, 1, "relu_fwd", 0, 2 * es * nh * 4 * E, op_relu_f1, "%d x %d (in place)", inh, 4 * iE);
    add_op(ph, 1, "matmul_fwd fc2", f_mm(nh, 4 * E, E), b_mm_f(nh, 4 * E, E, 1), op_fc2, "N=%d C=%d OC=%d", inh,
           4 * iE, iE);
    add_op(ph, 1, "residual_fwd", 0, 3 * es * nh * E, op_res2, "%d x %d", inh, iE);
    add_op(ph, 1, "matmul_fwd q", f_mm(B, E, E), b_mm_f(B, E, E, 0), op_q, "N=%d C=%d OC=%d no bias", iB, iE, iE);
    add_op(ph, 1, "matmul_fwd kv", f_mm(nh, E, 2 * E), b_mm_f(nh, E, 2 * E, 0), op_kv, "N=%d C=%d OC=%d no bias",
           inh, iE, 2 * iE);
    add_op(ph, 1, "targetattn_fwd", 4 * nh * E, es * (2 * B * E + 2 * nh * E) + 4 * nh + 4 * (B + 1),
           op_targetattn_f, "B=%d E=%d ldkv=%d nh=%d", iB, iE, 2 * iE, inh);
    add_op(ph, 1, "copy_cols pooled", 0, 2 * es * B * E, op_copy_pooled, "%dx%d ld %d<-%d", iB, iE, iD0, iE);

    ph = NB_SC_FWD_SEG;
    add_op(ph, nb, "cross_fwd", 4 * B * D0 * R + 3 * B * D0,
           es * (2 * B * D0 + 2 * D0 * R + D0 + 2 * B * D0 + B * R), op_cross_f, "N=%d D=%d r=%d", iB, iD0, BT.R);
    add_op(ph, nb, "matmul_fwd w1", f_mm(B, D0, HID), b_mm_f(B, D0, HID, 1), op_w1_f, "N=%d C=%d OC=%d", iB, iD0,
           BT.HID);
    add_op(ph, nb, "relu_fwd", 0, 2 * es * B * HID, op_relu_hid, "%dx%d", iB, BT.HID);
    add_op(ph, nb, "matmul_fwd w2", f_mm(B, HID, D0), b_mm_f(B, HID, D0, 1), op_w2_f, "N=%d C=%d OC=%d", iB, BT.HID,
           iD0);
    add_op(ph, nb, "residual_fwd", 0, 3 * es * B * D0, op_res_blk, "%dx%d", iB, iD0);
    add_op(ph, nb, "linear1_fwd", 2 * B * D0, es * (B * D0 + D0 + 1) + 4 * B, op_head_f, "N=%d D=%d", iB, iD0);
    add_op(ph, 1, "zero dz", 0, 4 * B, op_zero_dz, "%d fp32", iB);
    add_op(ph, 1, "bce", 0, 16 * B + 16, op_bce, "N=%d", iB);

    ph = NB_SC_BWD_SEG;
    add_op(ph, 1, "zero dcur", 0, es * B * D0, op_zero_dcur, "%dx%d", iB, iD0);
    add_op(ph, 1, "linear1_bwd", 4 * B * D0, es * (3 * B * D0 + D0) + 4 * B + 8 * (D0 + 1), op_head_b, "N=%d D=%d",
           iB, iD0);
    add_op(ph, nb, "copy_cols dc<-dcur", 0, 2 * es * B * D0, op_copy_dc, "%dx%d", iB, iD0);
    add_op(ph, nb, "zero dhid", 0, es * B * HID, op_zero_dhid, "%dx%d", iB, BT.HID);
    add_op(ph, nb, "matmul_bwd w2", 2 * f_mm(B, HID, D0), b_mm_b(1, B, HID, D0, 1), op_w2_b, "N=%d C=%d OC=%d", iB,
           BT.HID, iD0);
    add_op(ph, nb, "zero dhidp", 0, es * B * HID, op_zero_dhidp, "%dx%d", iB, BT.HID);
    add_op(ph, nb, "relu_bwd", 0, 4 * es * B * HID, op_relu_hid_b, "%dx%d", iB, BT.HID);
    add_op(ph, nb, "matmul_bwd w1", 2 * f_mm(B, D0, HID), b_mm_b(1, B, D0, HID, 1), op_w1_b, "N=%d C=%d OC=%d", iB,
           iD0, BT.HID);
    add_op(ph, nb, "cross_bwd", 8 * B * D0 * R,
           es * (3 * B * D0 + 2 * D0 * R + D0 + B * R + 2 * B * D0) + 4 * (4 * D0 * R + 2 * D0), op_cross_b,
           "N=%d D=%d r=%d", iB, iD0, BT.R);
    add_op(ph, 1, "add_inplace dx0", 0, 3 * es * B * D0, op_add_dx0, "%dx%d", iB, iD0);

    ph = NB_SC_BWD_JOIN;
    add_op(ph, 1, "copy_cols dbot", 0, 2 * es * B * E, op_copy_dbot, "%dx%d ld %d<-%d", iB, iE, iE, iD0);
    add_op(ph, 1, "copy_cols dpooled", 0, 2 * es * B * E, op_copy_dpooled, "%dx%d ld %d<-%d", iB, iE, iE, iD0);

    ph = NB_SC_BWD_HIST;
    add_op(ph, 1, "zero dq", 0, es * B * E, op_zero_dq, "%dx%d", iB, iE);
    add_op(ph, 1, "zero dkv", 0, es * nh * 2 * E, op_zero_dkv, "%dx%d", inh, 2 * iE);
    add_op(ph, 1, "targetattn_bwd", 8 * nh * E, es * (4 * B * E + 6 * nh * E) + 4 * nh + 4 * (B + 1),
           op_targetattn_b, "B=%d E=%d ldkv=%d nh=%d", iB, iE, 2 * iE, inh);
    add_op(ph, 1, "matmul_bwd q", 2 * f_mm(B, E, E), b_mm_b(1, B, E, E, 0), op_q_b, "N=%d C=%d OC=%d", iB, iE, iE);
    add_op(ph, 1, "matmul_bwd kv", 2 * f_mm(nh, E, 2 * E), b_mm_b(1, nh, E, 2 * E, 0), op_kv_b, "N=%d C=%d OC=%d",
           inh, iE, 2 * iE);
    add_op(ph, 1, "copy_cols dx1<-dh", 0, 2 * es * nh * E, op_copy_dx1, "%dx%d", inh, iE);
    add_op(ph, 1, "zero df1", 0, es * nh * 4 * E, op_zero_df1, "%dx%d", inh, 4 * iE);
    add_op(ph, 1, "matmul_bwd fc2", 2 * f_mm(nh, 4 * E, E), b_mm_b(1, nh, 4 * E, E, 1), op_fc2_b, "N=%d C=%d OC=%d",
           inh, 4 * iE, iE);
    add_op(ph, 1, "zero df1p", 0, es * nh * 4 * E, op_zero_df1p, "%dx%d", inh, 4 * iE);
    add_op(ph, 1, "relu_bwd", 0, 4 * es * nh * 4 * E, op_relu_f1_b, "%dx%d", inh, 4 * iE);
    add_op(ph, 1, "zero dln", 0, es * nh * E, op_zero_dln, "%dx%d", inh, iE);
    add_op(ph, 1, "matmul_bwd fc1", 2 * f_mm(nh, E, 4 * E), b_mm_b(1, nh, E, 4 * E, 1), op_fc1_b, "N=%d C=%d OC=%d",
           inh, iE, 4 * iE);
    add_op(ph, 1, "layernorm_bwd ln2", 0, es * (4 * nh * E + E) + 8 * nh + 16 * E, op_ln2_b, "[%d,%d]", inh, iE);
    add_op(ph, 1, "copy_cols dh<-dx1", 0, 2 * es * nh * E, op_copy_dh, "%dx%d", inh, iE);
    add_op(ph, 1, "zero datt", 0, es * nh * E, op_zero_datt, "%dx%d", inh, iE);
    add_op(ph, 1, "matmul_bwd proj", 2 * f_mm(nh, E, E), b_mm_b(1, nh, E, E, 1), op_proj_b, "N=%d C=%d OC=%d", inh,
           iE, iE);
    add_op(ph, 1, "zero dqkv", 0, es * nh * 3 * E, op_zero_dqkv, "%dx%d", inh, 3 * iE);
    add_op(ph, 1, "seqattn_bwd", 10 * S2 * E, es * (3 * nh * E + 2 * nh * E + 6 * nh * E) + 4 * nh * BT.H,
           op_seqattn_b, "B=%d L=%d H=%d E=%d nh=%d", iB, BT.L, BT.H, iE, inh);
    add_op(ph, 1, "zero dln", 0, es * nh * E, op_zero_dln, "%dx%d", inh, iE);
    add_op(ph, 1, "matmul_bwd qkv", 2 * f_mm(nh, E, 3 * E), b_mm_b(1, nh, E, 3 * E, 1), op_qkv_b, "N=%d C=%d OC=%d",
           inh, iE, 3 * iE);
    add_op(ph, 1, "layernorm_bwd ln1", 0, es * (4 * nh * E + E) + 8 * nh + 16 * E, op_ln1_b, "[%d,%d]", inh, iE);

    ph = NB_SC_BWD_BOTTOM;
    add_op(ph, 1, "zero da2", 0, es * B * b2, op_zero_da2, "%dx%d", iB, NB_SC_BOTTOM2);
    add_op(ph, 1, "matmul_bwd bottom2", 2 * f_mm(B, b2, E), b_mm_b(1, B, b2, E, 1), op_bot2_b, "N=%d C=%d OC=%d", iB,
           NB_SC_BOTTOM2, iE);
    add_op(ph, 1, "zero da2p", 0, es * B * b2, op_zero_da2p, "%dx%d", iB, NB_SC_BOTTOM2);
    add_op(ph, 1, "relu_bwd", 0, 4 * es * B * b2, op_relu_a2_b, "%dx%d", iB, NB_SC_BOTTOM2);
    add_op(ph, 1, "zero da1", 0, es * B * b1, op_zero_da1, "%dx%d", iB, NB_SC_BOTTOM1);
    add_op(ph, 1, "matmul_bwd bottom1", 2 * f_mm(B, b1, b2), b_mm_b(1, B, b1, b2, 1), op_bot1_b, "N=%d C=%d OC=%d",
           iB, NB_SC_BOTTOM1, NB_SC_BOTTOM2);
    add_op(ph, 1, "zero da1p", 0, es * B * b1, op_zero_da1p, "%dx%d", iB, NB_SC_BOTTOM1);
    add_op(ph, 1, "relu_bwd", 0, 4 * es * B * b1, op_relu_a1_b, "%dx%d", iB, NB_SC_BOTTOM1);
    add_op(ph, 1, "matmul_bwd bottom0", f_mm(B, nd, b1), b_mm_b(0, B, nd, b1, 1), op_bot0_b,
           "N=%d C=%d OC=%d, dinp NULL", iB, NB_SC_STD_NDENSE, NB_SC_BOTTOM1);
    ph = NB_SC_BWD_EMB;
    add_op(ph, 1, "emb_grad_unique", 0, es * n * E + 12 * n + 4 * (U + 1) + 4 * U * E, op_grad_unique,
           "n=%d U=%d (max group %d)", BT.nlk, BT.U, BT.max_group);

    ph = NB_SC_OPT_EMB;
    add_op(ph, 1, "rowwise_adagrad", 0, U * (8 + 4 * E + 8 * E + 8), op_adagrad, "U=%d E=%d of %lld rows", BT.U, iE,
           (long long)BT.emb_rows);

    ph = NB_SC_OPT_DENSE;
    add_op(ph, 1, "upload adamw scalars", 0, 2 * sizeof(nb_adamw_scalars), op_upload_k, "64 bytes H2D");
    add_op(ph, 1, "adamw_spans", 0, (28.0 + (LOWP ? 2 : 0)) * BNUSED, op_adamw_spans, "1 launch, %d spans, %zu",
           BNT, BNUSED);

    ph = BN_EXTRA;
    add_op(ph, 1, "adamw per tensor", 0, (28.0 + (LOWP ? 2 : 0)) * BNUSED, op_adamw_tensors,
           "%d launches, %zu params", BNT, BNUSED);
    NB_ASSERT(BK == BNOPS);
}

/* ---- buffers ---- */

static void bn_alloc(void) {
    size_t B = (size_t)nB, E = (size_t)nE, nh = nH, D0 = (size_t)BT.D0, R = (size_t)BT.R, HID = (size_t)BT.HID;
    size_t n = (size_t)BT.nlk, U = (size_t)BT.U;
    memset(&BD, 0, sizeof BD);
    /* the batch: pinned host copies (what the embedding forward uploads) and device lists */
    float *hd = nb_malloc(B * NB_SC_STD_NDENSE * sizeof(float), "bench dense");
    for (size_t i = 0; i < B * NB_SC_STD_NDENSE; i++) hd[i] = bn_rand(1.0f, 0);
    BD.hp_dense = bn_pinned(hd, B * NB_SC_STD_NDENSE * 4), BD.hp_label = bn_pinned(BT.label, B * 4);
    free(hd);
    BD.hp_rows = bn_pinned(BT.rows, n * 8), BD.hp_dst = bn_pinned(BT.dst, n * 8), BD.hp_src = bn_pinned(BT.src, n * 8);
    BD.hp_order = bn_pinned(BT.order, n * 4), BD.hp_seg = bn_pinned(BT.seg, (U + 1) * 4);
    BD.hp_uniq = bn_pinned(BT.uniq, U * 8), BD.hp_off = bn_pinned(BT.off, (B + 1) * 4);
    BD.dense = bn_up(BD.hp_dense, B * NB_SC_STD_NDENSE * 4), BD.label = bn_up(BT.label, B * 4);
    BD.rows = bn_up(BT.rows, n * 8), BD.dst = bn_up(BT.dst, n * 8), BD.src = bn_up(BT.src, n * 8);
    BD.order = bn_up(BT.order, n * 4), BD.seg = bn_up(BT.seg, (U + 1) * 4), BD.uniq = bn_up(BT.uniq, U * 8);
    BD.off = bn_up(BT.off, (B + 1) * 4);
    /* embedding tables and their optimizer state (fp32) */
    BD.emb = bn_f32((size_t)BT.emb_rows * E, 0.5f, 0);
    BD.eacc = bn_f32((size_t)BT.emb_rows, 1.0f, 1);
    BD.ugrad = bn_f32(U * E, 0.01f, 0);
    /* dense slab: fp32 master weights (scale 1/sqrt(fan-in)), gradients, moments; compute copy */
    BD.params = bn_dev(BNPARAMS * 4);
    CUDA_CHECK(cudaMemset(BD.params, 0, BNPARAMS * 4));
    for (int i = 0; i < BNT; i++) bn_fill(BD.params + BTT[i].off, BTT[i].n, 0, 1.0f / sqrtf((float)BTT[i].cols), 0);
    BD.grads = bn_f32(BNPARAMS, 1e-3f, 0), BD.am = bn_f32(BNPARAMS, 1e-3f, 0), BD.av = bn_f32(BNPARAMS, 1e-6f, 1);
    if (LOWP) {
        BD.w = bn_dev(BNPARAMS * ES);
        BE->cast_params(CX, BD.w, BD.params, BNPARAMS);
    } else {
        BD.w = BD.params;
    }
    nb_adamw_scalars hk[2] = {nb_adamw_prepare((nb_adamw_cfg){1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f}, 1),
                              nb_adamw_prepare((nb_adamw_cfg){1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f}, 1)};
    BD.hk = bn_pinned(hk, sizeof hk);
    BD.k = bn_up(hk, sizeof hk);
    /* activations and gradients (act dtype unless fp32 by contract) */
    BD.dense_c = LOWP ? bn_act(B * NB_SC_STD_NDENSE, 1.0f) : NULL; /* as the model: fp32 reads the inputs */
    BD.a1 = bn_act(B * NB_SC_BOTTOM1, 1), BD.a2 = bn_act(B * NB_SC_BOTTOM2, 1), BD.bot = bn_act(B * E, 1);
    BD.x0 = bn_act(B * D0, 0.5f), BD.temb = bn_act(B * E, 0.5f);
    BD.h0 = bn_act(nh * E, 0.5f), BD.h1 = bn_act(nh * E, 1), BD.ln1 = bn_act(nh * E, 1), BD.qkv = bn_act(nh * 3 * E, 1);
    BD.att = bn_act(nh * E, 1), BD.x1 = bn_act(nh * E, 1), BD.ln2 = bn_act(nh * E, 1), BD.f1 = bn_act(nh * 4 * E, 1);
    BD.q = bn_act(B * E, 1), BD.kv = bn_act(nh * 2 * E, 1), BD.pooled = bn_act(B * E, 1);
    BD.mean1 = bn_f32(nh, 0.1f, 0), BD.rstd1 = bn_f32(nh, 2.0f, 1), BD.lse = bn_f32(nh * (size_t)BT.H, 3.0f, 1);
    BD.mean2 = bn_f32(nh, 0.1f, 0), BD.rstd2 = bn_f32(nh, 2.0f, 1), BD.attn = bn_f32(nh, 0.1f, 1);
    BD.xprev = bn_act(B * D0, 1), BD.c = bn_act(B * D0, 1), BD.vx = bn_act(B * R, 1), BD.u = bn_act(B * D0, 1), BD.hid = bn_act(B * HID, 1);
    BD.xs = bn_act(B * D0, 1), BD.logit = bn_f32(B, 2.0f, 0), BD.dz = bn_f32(B, 1e-3f, 0);
    BD.loss = bn_dev(sizeof(double));
    CUDA_CHECK(cudaMemset(BD.loss, 0, sizeof(double)));
    BD.dsrc = bn_act(BT.nsrc, 0.01f);
    BD.dx0 = BD.dsrc, BD.dtemb = ACT(BD.dsrc, B * D0), BD.dh = ACT(BD.dsrc, B * D0 + B * E);
    BD.dcur = bn_act(B * D0, 0.01f), BD.dprev = bn_act(B * D0, 0.01f), BD.dc = bn_act(B * D0, 0.01f);
    BD.dhid = bn_act(B * HID, 0.01f), BD.dhidp = bn_act(B * HID, 0.01f), BD.dbot = bn_act(B * E, 0.01f);
    BD.da2 = bn_act(B * NB_SC_BOTTOM2, 0.01f), BD.da2p = bn_act(B * NB_SC_BOTTOM2, 0.01f);
    BD.da1 = bn_act(B * NB_SC_BOTTOM1, 0.01f), BD.da1p = bn_act(B * NB_SC_BOTTOM1, 0.01f);
    BD.dq = bn_act(B * E, 0.01f), BD.dpooled = bn_act(B * E, 0.01f), BD.dkv = bn_act(nh * 2 * E, 0.01f);
    BD.dx1 = bn_act(nh * E, 0.01f), BD.datt = bn_act(nh * E, 0.01f), BD.dqkv = bn_act(nh * 3 * E, 0.01f);
    BD.dln = bn_act(nh * E, 0.01f), BD.df1 = bn_act(nh * 4 * E, 0.01f), BD.df1p = bn_act(nh * 4 * E, 0.01f);
    /* the weights the ops read */
    for (int i = 0; i < 3; i++) TW.bw[i] = bn_w("bottom.%d.weight", i), TW.bb[i] = bn_w("bottom.%d.bias", i);
    TW.ln1w = bn_w("hist.%d.ln1.weight", 0), TW.ln1b = bn_w("hist.%d.ln1.bias", 0);
    TW.qkvw = bn_w("hist.%d.qkv.weight", 0), TW.qkvb = bn_w("hist.%d.qkv.bias", 0);
    TW.projw = bn_w("hist.%d.proj.weight", 0), TW.projb = bn_w("hist.%d.proj.bias", 0);
    TW.ln2w = bn_w("hist.%d.ln2.weight", 0), TW.ln2b = bn_w("hist.%d.ln2.bias", 0);
    TW.fc1w = bn_w("hist.%d.fc1.weight", 0), TW.fc1b = bn_w("hist.%d.fc1.bias", 0);
    TW.fc2w = bn_w("hist.%d.fc2.weight", 0), TW.fc2b = bn_w("hist.%d.fc2.bias", 0);
    TW.wq = bn_w("target.wq", 0), TW.wk = bn_w("target.wk", 0);
    TW.U = bn_w("block.%d.U", 0), TW.V = bn_w("block.%d.V", 0), TW.cb = bn_w("block.%d.b", 0);
    TW.w1 = bn_w("block.%d.w1", 0), TW.b1 = bn_w("block.%d.b1", 0), TW.w2 = bn_w("block.%d.w2", 0);
    TW.b2 = bn_w("block.%d.b2", 0), TW.hw = bn_w("block.%d.head.w", 0), TW.hb = bn_w("block.%d.head.b", 0);
    CUDA_CHECK(cudaDeviceSynchronize());
}

/* ---- timing ---- */

static cudaEvent_t BEV[BN_MAXSEQ + 1];
static void *BFILL;
static unsigned BFILL_K;

/* keeps the GPU busy (~0.7 ms) so that the host has enqueued what follows before it starts */
static void bn_busy(void) { CUDA_CHECK(cudaMemsetAsync(BFILL, (int)(BFILL_K++ % 255u) + 1, BN_FILL_BYTES, st)); }

static double bn_us(int a, int b) {
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, BEV[a], BEV[b]));
    return 1e3 * (double)ms;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double bn_median(double *x, int n) {
    qsort(x, (size_t)n, sizeof *x, cmp_double);
    return x[n / 2];
}

static void bn_sync(void) {
    CUDA_CHECK(cudaStreamSynchronize(st));
    CUDA_CHECK(cudaGetLastError());
}

/* The phase's calls in the model's order: a run of ops with count c > 1 (a block) repeats c times. */
static int bn_seq(int ph, int *list) {
    int n = 0;
    for (int i = 0; i < BNOPS;) {
        bn_op *o = &BOPS[i];
        if (o->phase != ph || o->absent[PI]) {
            i++;
            continue;
        }
        int j = i + 1;
        if (o->count > 1)
            while (j < BNOPS && BOPS[j].phase == ph && BOPS[j].count == o->count) j++;
        for (int r = 0; r < o->count; r++)
            for (int k = i; k < j; k++) {
                if (BOPS[k].absent[PI]) continue;
                NB_ASSERT(n < BN_MAXSEQ);
                list[n++] = k;
            }
        i = j;
    }
    return n;
}

static void bn_run_seq(const int *list, int n) {
    for (int k = 0; k < n; k++) BOPS[list[k]].fn();
}

/* What the phase's accumulating outputs hold when the model starts it (history bwd: dh = 0, as
 * the embedding forward leaves it); run before each timed sequence, outside the events. */
static void bn_reset(int ph) {
    if (ph == NB_SC_BWD_HIST) BE->zero(CX, BD.dh, nH * nE * ES);
}

typedef struct {
    double alone, inseq, busy, idle, host; /* sums and sequence times, us */
    double model, model_host;              /* the model's phase (bf16 only) */
} bn_phase_t;
static bn_phase_t BPH[BN_NPH][2];
static double BMODEL_STEP, BMODEL_LOSS;

static void bn_time_alone(bn_op *o) {
    double t[BN_REPS];
    for (int w = 0; w < BN_WARM; w++) o->fn();
    bn_sync();
    for (int r = 0; r < BN_REPS; r++) {
        bn_busy();
        CUDA_CHECK(cudaEventRecord(BEV[0], st));
        o->fn();
        CUDA_CHECK(cudaEventRecord(BEV[1], st));
        CUDA_CHECK(cudaEventSynchronize(BEV[1]));
        t[r] = bn_us(0, 1);
    }
    bn_sync();
    o->alone[PI] = bn_median(t, BN_REPS);
}

static void bn_time_phase(int ph) {
    bn_phase_t *res = &BPH[ph][PI];
    for (int i = 0; i < BNOPS; i++)
        if (BOPS[i].phase == ph && !BOPS[i].absent[PI]) {
            bn_time_alone(&BOPS[i]);
            res->alone += BOPS[i].count * BOPS[i].alone[PI];
        }
    if (ph == BN_EXTRA) return;
    int list[BN_MAXSEQ], n = bn_seq(ph, list);
    static double per[BN_MAXOPS][BN_REPS];
    double busy[BN_REPS], idle[BN_REPS], host[BN_REPS];
    for (int r = -BN_WARM; r < BN_REPS; r++) {
        /* (a) back to back behind the memset: the kernels' time */
        bn_reset(ph);
        bn_busy();
        CUDA_CHECK(cudaEventRecord(BEV[0], st));
        bn_run_seq(list, n);
        CUDA_CHECK(cudaEventRecord(BEV[1], st));
        bn_sync();
        if (r >= 0) busy[r] = bn_us(0, 1);
        /* (b) back to back, the GPU idle before: + launch latency and host gaps */
        bn_reset(ph);
        bn_sync();
        double h0 = nb_now();
        CUDA_CHECK(cudaEventRecord(BEV[0], st));
        bn_run_seq(list, n);
        CUDA_CHECK(cudaEventRecord(BEV[1], st));
        double h1 = nb_now();
        bn_sync();
        if (r >= 0) idle[r] = bn_us(0, 1), host[r] = 1e6 * (h1 - h0);
        /* (c) an event after every op */
        bn_reset(ph);
        bn_busy();
        CUDA_CHECK(cudaEventRecord(BEV[0], st));
        for (int k = 0; k < n; k++) {
            BOPS[list[k]].fn();
            CUDA_CHECK(cudaEventRecord(BEV[k + 1], st));
        }
        bn_sync();
        if (r >= 0) {
            for (int k = 0; k < n; k++) per[list[k]][r] = 0;
            for (int k = 0; k < n; k++) per[list[k]][r] += bn_us(k, k + 1);
        }
    }
    res->busy = bn_median(busy, BN_REPS), res->idle = bn_median(idle, BN_REPS), res->host = bn_median(host, BN_REPS);
    for (int i = 0; i < BNOPS; i++)
        if (BOPS[i].phase == ph && !BOPS[i].absent[PI]) {
            BOPS[i].inseq[PI] = bn_median(per[i], BN_REPS) / BOPS[i].count;
            res->inseq += BOPS[i].count * BOPS[i].inseq[PI];
        }
}

/* The model itself on the same batch (nb_sc_model on this precision's backend): whole steps with
 * an event between the phases; also gives the bench its tensor table. */
static void bn_model(void) {
    nb_sc_model *m = nb_calloc(1, sizeof *m, "bench model");
    nb_sc_init_on(m, &BT.cfg, BT.B, BE);
    nb_sc_set_ctx(m, &ot_gctx);
    BNT = m->ntensors, BNPARAMS = m->nparams, BNUSED = m->nparams_used;
    NB_CHECK(BNT <= BN_MAX_TENSORS, "raise BN_MAX_TENSORS", "the bench's model has %d tensors", BNT);
    memcpy(BTT, m->t, (size_t)BNT * sizeof BTT[0]);
    for (int i = 0; i < BNT; i++) BSPANS[i] = (nb_adamw_span){BTT[i].off, BTT[i].n, BTT[i].decay ? 0 : 1};
    {
        CUDA_CHECK(cudaDeviceSynchronize());
        nb_sc_batch b = {BT.B, BT.L, BT.dense, BT.cat, BT.target, BT.hist, BT.hist_len, BT.label, NULL, NULL, 0};
        nb_sc_prepare(m, &b);
        NB_CHECK(m->stage_nh == BT.nh, NULL, "bench: the model packs %d history rows, the bench %d", m->stage_nh, BT.nh);
        nb_sc_begin_step(m);
        nb_sc_optim o = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .emb_lr = 0.05f,
                         .emb_eps = 1e-8f}; /* the trainer's defaults */
        nb_sc_optim_prepare(m, &o, 1);
        static double t[NB_SC_NPHASES][BN_REPS], h[NB_SC_NPHASES][BN_REPS];
        double step[BN_REPS];
        for (int r = -BN_WARM; r < BN_REPS; r++) {
            bn_sync();
            CUDA_CHECK(cudaEventRecord(BEV[0], st));
            for (int p = 0; p < NB_SC_NPHASES; p++) {
                double h0 = nb_now();
                if (p == NB_SC_FWD_EMB) nb_sc_zero_grads(m); /* as the trainer's embedding fwd span */
                nb_sc_enqueue_phase(m, &ot_gctx, (nb_sc_phase)p, 0, &o, r + BN_WARM + 1);
                double h1 = nb_now();
                CUDA_CHECK(cudaEventRecord(BEV[p + 1], st));
                if (r >= 0) h[p][r] = 1e6 * (h1 - h0);
            }
            bn_sync();
            if (r >= 0) {
                for (int p = 0; p < NB_SC_NPHASES; p++) t[p][r] = bn_us(p, p + 1);
                step[r] = bn_us(0, NB_SC_NPHASES);
            }
        }
        for (int p = 0; p < NB_SC_NPHASES; p++) {
            BPH[p][PI].model = bn_median(t[p], BN_REPS);
            BPH[p][PI].model_host = bn_median(h[p], BN_REPS);
        }
        BMODEL_STEP = bn_median(step, BN_REPS);
        BMODEL_LOSS = nb_sc_loss(m);
        int U = nb_sc_unique_rows(m); /* device lists: counted by the phases above */
        NB_CHECK(U == BT.U, NULL, "bench: the model finds %d unique rows, the bench %d", U, BT.U);
    }
    nb_sc_free(m);
    free(m);
    CUDA_CHECK(cudaDeviceSynchronize());
}

/* ---- printing ---- */

static const char *bn_num(char *buf, size_t cap, double v, const char *fmt) {
    if (v > 0 && isfinite(v))
        snprintf(buf, cap, fmt, v);
    else
        snprintf(buf, cap, "-");
    return buf;
}

static void bn_print_op(const bn_op *o) {
    char a[6][24];
    double t0 = o->alone[0], t1 = o->alone[1];
    printf("  %-20s %-36s x%-2d %8.2f | %8s %8s %6s %6s | %8s %6s\n", o->name, o->shape, o->count, o->bytes[0] / 1e6,
           bn_num(a[0], 24, o->absent[0] ? 0 : t0, "%.1f"), bn_num(a[1], 24, o->absent[0] ? 0 : o->inseq[0], "%.1f"),
           bn_num(a[2], 24, o->absent[0] ? 0 : o->bytes[0] / t0 / 1e3, "%.0f"),
           bn_num(a[3], 24, o->absent[0] ? 0 : o->flop / t0 / 1e6, "%.2f"), bn_num(a[4], 24, o->absent[1] ? 0 : t1, "%.1f"),
           bn_num(a[5], 24, o->absent[1] ? 0 : o->bytes[1] / t1 / 1e3, "%.0f"));
}

static void bn_print_sum(const char *what, double v0, double v1) {
    char a[2][24];
    printf("  %-70s | %8s %22s | %8s\n", what, bn_num(a[0], 24, v0, "%.1f"), "", bn_num(a[1], 24, v1, "%.1f"));
}

static void bn_print(void) {
    printf("\nper op: MB = bytes read + written in bf16 (the least traffic: every input read once, every output\n"
           "written once, += outputs read and written, weights, fp32 statistics/gradients and index lists included);\n"
           "alone = median us of one launch behind a 2 GiB memset (kernel time, cold L2); in seq = median us between\n"
           "the events after each op of the phase's sequence (warm L2, per call); GB/s and TFLOP/s from alone;\n"
           "xN = calls per phase (a block's ops run once per block).\n");
    for (int ph = 0; ph < BN_NPH; ph++) {
        if (ph < BN_EXTRA)
            printf("\n== %s%s\n", nb_sc_phase_name((nb_sc_phase)ph),
                   BN_MEASURED_MS[ph] > 0 ? " (a phase measured in training)" : "");
        else
            printf("\n== not in a phase (alternatives)\n");
        printf("  %-20s %-36s %-3s %8s | %8s %8s %6s %6s | %8s %6s\n", "op", "shape", "x", "MB", "bf16 us", "in seq",
               "GB/s", "TFLOP", "fp32 us", "GB/s");
        for (int i = 0; i < BNOPS; i++)
            if (BOPS[i].phase == ph) bn_print_op(&BOPS[i]);
        if (ph == BN_EXTRA) continue;
        const bn_phase_t *b = BPH[ph], *f = BPH[ph] + 1;
        bn_print_sum("= sum of the ops alone (x N)", b->alone, f->alone);
        bn_print_sum("= sum of the ops in sequence (an event after every op)", b->inseq, f->inseq);
        bn_print_sum("= back to back, one event pair, GPU busy before (kernels only)", b->busy, f->busy);
        bn_print_sum("= back to back, one event pair, GPU idle before (+ launch/host gaps)", b->idle, f->idle);
        bn_print_sum("= host time to enqueue the sequence", b->host, f->host);
        bn_print_sum("= the model's phase (nb_sc_enqueue_phase in whole steps)", b->model, 0);
        bn_print_sum("= host time to enqueue the model's phase", b->model_host, 0);
        if (BN_MEASURED_MS[ph] > 0) bn_print_sum("= measured in training (reference)", 1e3 * BN_MEASURED_MS[ph], 0);
    }
    printf("\nsummary, bf16, us per phase: ops alone | ops in seq | back to back busy / idle | host enqueue | "
           "model phase (host) | measured in training\n");
    double tot[6] = {0};
    for (int ph = 0; ph < BN_EXTRA; ph++) {
        const bn_phase_t *b = BPH[ph];
        char m[24];
        printf("  %-16s %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f (%6.1f) %9s\n", nb_sc_phase_name((nb_sc_phase)ph), b->alone,
               b->inseq, b->busy, b->idle, b->host, b->model, b->model_host,
               bn_num(m, sizeof m, 1e3 * BN_MEASURED_MS[ph], "%.0f"));
        tot[0] += b->alone, tot[1] += b->inseq, tot[2] += b->busy, tot[3] += b->idle, tot[4] += b->host;
        tot[5] += b->model;
    }
    printf("  %-16s %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f; one whole step of the model: %.1f us (loss %.4f)\n", "total",
           tot[0], tot[1], tot[2], tot[3], tot[4], tot[5], BMODEL_STEP, BMODEL_LOSS);
}

static void bench(int argc, char **argv) {
    snprintf(BT.spec, sizeof BT.spec, "%s", argc > 0 ? argv[0] : "synth:cap=1000000,max_len=256");
    BT.table_cap = argc > 1 ? atoll(argv[1]) : 1000000;
    BT.B = argc > 2 ? atoi(argv[2]) : 4096;
    NB_CHECK(BT.table_cap >= 1 && BT.B >= 1, "usage: test_ops --mode perf --op ctr_model -- [SPEC [TABLE_CAP [B]]]",
             "bad table cap %lld or batch %d", BT.table_cap, BT.B);
    double t0 = nb_now();
    bn_batch();
    printf("seqctr ops at the model's shapes: B=%d E=%d heads=%d max_len=%d D0=%d rank=%d hidden=%d blocks=%d\n", BT.B,
           BT.E, BT.H, BT.L, BT.D0, BT.R, BT.HID, BT.NBLK);
    printf("batch: samples 0..%d of %s, tables capped at %lld rows (%lld rows, %.2f GB fp32)\n", BT.B - 1, BT.spec,
           BT.table_cap, (long long)BT.emb_rows, (double)BT.emb_rows * BT.E * 4 / 1e9);
    printf("  nh=%d history rows (mean length %.1f, longest %d, sum of len^2 %.3g); lookups n=%d, unique rows U=%d "
           "(largest group %d lookups, %d rows looked up once)\n",
           BT.nh, (double)BT.nh / BT.B, BT.max_len_seen, BT.sum_len2, BT.nlk, BT.U, BT.max_group, BT.singles);
    printf("timing: median of %d after %d warm-ups; measured in training (H200): history fwd %.1f ms, history bwd "
           "%.1f ms, embedding bwd %.1f ms\n",
           BN_REPS, BN_WARM, BN_MEASURED_MS[NB_SC_FWD_HIST], BN_MEASURED_MS[NB_SC_BWD_HIST],
           BN_MEASURED_MS[NB_SC_BWD_EMB]);
    fflush(stdout);
    for (int i = 0; i <= BN_MAXSEQ; i++) CUDA_CHECK(cudaEventCreate(&BEV[i]));
    CUDA_CHECK(cudaMalloc(&BFILL, BN_FILL_BYTES));
    for (PI = 0; PI < 2; PI++) {
        BE = PI == 0 ? &nb_backend_cuda_bf16 : &nb_backend_cuda_f32;
        CO = PI == 0 ? &nb_ctr_ops_cuda_bf16 : &nb_ctr_ops_cuda_f32;
        ES = nb_dtype_size(BE->act_dtype), LOWP = BE->act_dtype != NB_F32;
        if (PI == 0) bn_model(); /* the model's own phases: bf16 only (and the tensor table) */
        bn_alloc();
        build_ops();
        for (int ph = 0; ph < BN_EXTRA; ph++) { /* one pass: the saved activations become real ones */
            int list[BN_MAXSEQ], n = bn_seq(ph, list);
            bn_run_seq(list, n);
        }
        bn_sync();
        for (int ph = 0; ph < BN_NPH; ph++) bn_time_phase(ph);
        bn_free_all();
        printf("  %s done (%.0f s)\n", PI == 0 ? "bf16" : "fp32", nb_now() - t0);
        fflush(stdout);
    }
    bn_print();
    CUDA_CHECK(cudaFree(BFILL));
    for (int i = 0; i <= BN_MAXSEQ; i++) CUDA_CHECK(cudaEventDestroy(BEV[i]));
    free(BT.dense), free(BT.label), free(BT.cat), free(BT.target), free(BT.hist), free(BT.hist_len), free(BT.off);
    free(BT.order), free(BT.seg), free(BT.inverse), free(BT.rows), free(BT.dst), free(BT.src), free(BT.uniq);
}

static void perf_ctr_model(void) { bench(ot_extra_argc, ot_extra_argv); }
#define FN(f) f
#else
#define FN(f) NULL
#endif

static const ot_row rows[] = {
    {"ctr_model", "cuda", OT_BOTH, "seqctr phases, B 4096 (-- SPEC CAP B)", 0, OT_PERF, FN(perf_ctr_model), 0, 0},
};
OT_TABLE(ot_perf_ctr_cuda, rows);
