/* The seqctr model's private parts, shared by its files:
 *   seqctr.c        the math: forward and backward phases over the typed views, the optimizers
 *   seqctr_mem.c    the tensor table and its views, the memory plan (one layout walk, planned
 *                   then bound), initialization, host <-> backend copies, save and load
 *   seqctr_batch.c  a batch's host staging: index lists, deduplication, upload, the ring
 * The embedding tables, their exchange between ranks and the ring of batches in flight are the
 * embedding module's (emb/emb.h). */
#ifndef NB_SEQCTR_INTERNAL_H
#define NB_SEQCTR_INTERNAL_H

#include "model/seqctr.h"
#include "ops/backend.h"

#define LN_EPS 1e-5f
/* lookups per sample besides its history: ncat categorical + target, + target via wq */
#define NLK_PER_SAMPLE(c) ((size_t)(c)->ncat + 2)

typedef struct {
    void *ln1, *qkv, *att, *x1, *ln2, *f1;
    float *mean1, *rstd1, *lse, *mean2, *rstd2;
} enc_acts;

/* A segment's backward scratch; dx0 is its share of x0's gradient (segment 0's is x0's gradient
 * itself, the others are added to it in segment order by the join). */
typedef struct {
    void *dcur, *dprev, *dc, *dhid, *dhidp, *dx0;
} seg_scratch;

struct nb_sc_acts {
    void *dense, *a1, *a2, *bot, *x0;
    void *temb, *q, *kv, *pooled;
    void *dmv; /* the multi-valued columns' values' gradient rows (in dsrc, after dh; only with averaged
                * columns), then one zero row (zero_src) */
    size_t mv_src, zero_src; /* element offsets of dmv and of the zero row in dsrc */
    float *attn;
    void **h; /* [layers + 1] encoder inputs; h[layers] is the output */
    enc_acts *enc;
    void **xs, **c, **vx, **hid;
    void **u; /* [blocks]: each cross's U vx + b [MB, D0 or Dx], kept so its backward need not make it again */
    float **logit, **dz;
    /* gradient region the embedding rows are summed from: [dx0 (MB*D0) | dtemb (MB*E) | dh (NH*E)],
     * with multi-valued columns then [dmv (MB*mv_width*E; averaged columns only) | a zero row (E)] */
    void *dsrc, *dx0, *dtemb, *dh;
    seg_scratch *seg; /* [segments]: each segment's backward has its own, so segments can run at once */
    void *dbot, *da2, *da2p, *da1, *da1p;
    void *dq, *dpooled, *dkv, *dx1, *datt, *dqkv, *dln, *df1, *df1p;
    /* the DLRM form: the cross's input xd and its gradient [MB, Dx], the top MLP's hidden layers
     * (after their ReLU), gradient scratch as wide as the widest of them, the bottom's ReLU'd grad */
    void *xd, *dxd, *top[NB_SC_MAX_TOP], *dt, *dtp, *dbotp;
};

/* A batch's host index lists and their backend copies (the same memory on the CPU): one per slot
 * of the embedding ring (m->emb.batch[slot] holds the same batch's exchange lists). */
struct nb_sc_stage {
    int B, nh, nlk, nuniq; /* of the prepared batch (nh, nlk with the padding rows; nuniq -1:
                            * device lists, not counted on the host yet) */
    int nh_real;           /* history rows before padding */
    int nlk_real;          /* lookups before the padding rows: the deduplicated ones */
    int nmv;               /* multi-valued columns' lookups (values after each field's first) */
    int nmv_vals;          /* their values, first ones too (rows of acts.mv) */
    uint32_t *h_mv;        /* their ids packed ([nmv_vals]) */
    int32_t *h_moff, *d_moff; /* [B * ncols_mv + 1]: sample i's column j: values moff[i*ncols+j] .. */
    int32_t *h_mvb, *d_mvb;   /* [B * ncols_mv]: lists_mv's before (the pooling finds values' lookups by it) */
    uint32_t *h_hist;      /* the history items packed ([nh_real]) */
    /* device lists: the batch's raw ids staged (pinned), their device copies, the device's count
     * of unique rows */
    uint32_t *h_cat, *h_target, *d_cat, *d_target, *d_hist, *d_mv;
    int32_t *d_count;
    int has_label;
    float *h_dense, *h_label;
    int64_t *h_rows, *h_dst, *h_src, *h_uniq;
    int32_t *h_order, *h_seg, *h_off, *h_inverse;
    uint64_t *h_keys; /* [2 * lookups] deduplication scratch */
    float *d_dense, *d_label;
    int64_t *d_rows, *d_dst, *d_src;
    int32_t *d_order, *d_seg, *d_off;
    int64_t *d_uniq;
};

/* The DLRM form's cross width: the bottom and the categorical slots of x0. */
static inline int dlrm_dx(const nb_sc_model *m) { return (m->cfg.ncat + 1) * m->cfg.E; }

static inline nb_ctx CTX(const nb_sc_model *m) { return m->ctx ? m->ctx : &m->own_ctx; }
static inline int on_cpu(const nb_sc_model *m) { return m->be->device == NB_DEV_CPU; }
static inline int sharded(const nb_sc_model *m) { return nb_emb_sharded(&m->emb); }
static inline size_t act_es(const nb_sc_model *m) { return nb_dtype_size(m->be->act_dtype); }
/* element i of an act_dtype buffer */
static inline void *AT(const nb_sc_model *m, void *p, size_t i) { return (char *)p + i * act_es(m); }

/* lookups of a batch of max_batch samples with the longest histories */
static inline size_t max_lookups(const nb_sc_model *m) {
    size_t MB = (size_t)m->max_batch;
    return MB * NLK_PER_SAMPLE(&m->cfg) + MB * (size_t)nb_sc_mv_width(&m->cfg) + MB * (size_t)m->cfg.max_len;
}

/* seqctr_batch.c */
/* The slot's batch becomes the one the next phases read. */
void nb_sc_use_slot(nb_sc_model *m, int slot);
/* Host side of a step: the lookup lists (see seqctr_batch.c) and their deduplication. */
void nb_sc_prepare_into(nb_sc_model *m, const nb_sc_batch *b, int slot);
/* Copies the slot's lists in, or has the device build them (nothing to copy on the CPU). */
void nb_sc_upload_slot(nb_sc_model *m, nb_ctx c, int slot);
/* Device lists: the count from the device (the upload phase wrote it), with_rows: the rows too. */
void nb_sc_learn_unique(nb_sc_model *m, nb_sc_stage *s, int with_rows);
void nb_sc_check_batch(const nb_sc_model *m, const nb_sc_batch *b);
/* seqctr.c */
/* The forward phases of the current batch in order on one lane. */
void nb_sc_forward_phases(nb_sc_model *m, nb_ctx c);
/* seqctr_dlrm.c: the DLRM form's segment (its only one), forward and backward */
void nb_sc_dlrm_fwd(nb_sc_model *m, nb_ctx c);
void nb_sc_dlrm_bwd(nb_sc_model *m, nb_ctx c);

#endif
