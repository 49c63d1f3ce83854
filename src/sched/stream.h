/* The stream schedule's pieces, shared by its step (stream.c) and its memory plan
 * (stream_plan.c). Everything else reaches the schedule through its registry table. */
#ifndef NB_SCHED_STREAM_H
#define NB_SCHED_STREAM_H

#include <stddef.h>
#include <stdint.h>

#include "optim/optim.h"

#include "step/step.h"

#define NB_STREAM_MAX_SLOTS 4 /* pinned slabs each way; gradient slots (min(2, weight slots)) */

typedef struct nb_stream nb_stream;

typedef struct {
    nb_mark m;
    int set;
} opt_mark;

/* a forward or backward of one layer, bound to its slots */
typedef struct {
    nb_stream *st;
    int layer, wslot, gslot, dslot;
} stream_item;

/* one AdamW task: a layer (or -1, -2: the resident part's halves) with its step's scalars, the
 * up slab that receives the layer's compute-precision weights (-1: none), and where its gradient
 * is (NULL: the host gradient slab; without clipping a layer's down slab) */
typedef struct opt_item {
    nb_stream *st;
    int layer, uslot;
    const nb_adamw_scalars *k;
    const float *g;
} opt_item;

/* The update's scalars for the device layers (backend memory): the step's AdamW scalars and the
 * global norm squared, from which the kernel forms the clip factor as plain does. */
typedef struct {
    double sumsq;
    nb_adamw_scalars k[2];
} gpu_opt;

/* which of the two host copies of gpu_opt (by the update's step parity) goes up */
typedef struct {
    nb_stream *st;
    int par;
} gpu_opt_item;

/* a layer upload: master -> up slab (stage lane), up slab -> weight slot (h2d lane) */
typedef struct {
    nb_stream *st;
    int layer, uslot, wslot;
} load_item;

struct nb_stream {
    nb_run *r;
    const nb_layers_i *li; /* the family's layers capability */
    nb_layer_slab sl;      /* its slab (geometry at plan time; buffers once the family placed them) */
    /* the plan (stream_plan.c): layers whose activations are kept whole, device weight slots,
     * layers whose state lives on the device; the host gradient slab (arena offset, address) */
    int keep, wslots, glayers, noclip;
    size_t hg, he;
    float *h_grads; /* with clipping: every part but the device layers (nb_stream_host_off); without
                     * (noclip): the resident part only, packed, the layers' gradients are read from
                     * their down slabs */
    float *h_edges; /* noclip: [layers][2 * NB_SUMSQ_BLOCK], each layer's gradient elements in norm
                     * blocks shared with a neighbour */
    size_t layer_numel;           /* elements of one layer group (all layers are alike) */
    size_t glob_numel;            /* embeddings + final group, packed */
    void *d_glob_w;               /* compute copy of the resident part */
    float *d_glob_g;              /* its gradients */
    void **d_wslot;               /* [nslot]: layer weights in compute precision */
    float *d_gslot[NB_STREAM_MAX_SLOTS];        /* layer gradients */
    void *h_up[NB_STREAM_MAX_SLOTS];            /* pinned staging: weights up (compute precision) */
    float *h_down[NB_STREAM_MAX_SLOTS], *h_glob; /* gradients down; the resident part both ways */
    void *h_base;                 /* LoRA (sl.frozen): the streamed layers' frozen base, compute
                                   * precision, pinned (uploads read it in place; nothing is staged) */
    void *base_tmp;               /* LoRA: a device-bound group cast while the base loads (base_sink) */
    nb_lane *h2d, *d2h, *stage, *host; /* stage: weights into up slabs; host: gradients out of down slabs */
    opt_mark *wslot_free, gslot_free[NB_STREAM_MAX_SLOTS], up_free[NB_STREAM_MAX_SLOTS], down_free[NB_STREAM_MAX_SLOTS], emb_ready, final_ready, norm_done;
    opt_item *head_item;          /* the head's update, not enqueued yet (or NULL) */
    opt_mark *updated;            /* [layers]: layer l's AdamW of the previous step is done */
    opt_item **pending;           /* [layers]: layer l's update, not enqueued yet (or NULL) */
    nb_lane *optim;               /* host lane of the optimizer */
    /* the step's AdamW scalars and items, by step parity: the main thread prepares step s+1
     * while step s's updates may still run */
    nb_adamw_scalars k[2][2];
    struct opt_item *opt_items[2]; /* [layers + 2]: the layers, then the embeddings, then the final group */
    int nslot, ngslot, nslab;     /* device weight slots, gradient slots; pinned slabs each way */
    int *wslot_layer;             /* [nslot]: the layer a slot holds this step (-1: none) */
    long *wslot_used, uses;       /* [nslot]: when the slot's last user was enqueued (a counter) */
    int next_gslot, next_up, next_down;
    stream_item *fwd, *rec, *bwd; /* [layers]: forward, recompute, backward */
    stream_item *gitems;          /* [layers]: a device layer's update */
    load_item *loads;             /* [2 * layers]: forward and backward loads */
    int nloads;
    /* device layers (--gpu-layers): nglayer layers, spread evenly over the model, keep their fp32
     * master, moments and gradients on the device ([nglayer * layer_numel] each, gidx[l] the place
     * of layer l, -1 for a streamed one) and update there with the backend's AdamW; the host master
     * of those layers is brought up to date by quiesce */
    int nglayer, *gidx, *hcut;     /* hcut[l]: device layers before layer l (the host slabs skip them) */
    nb_state_map map;             /* the device layers' moments, for the family's checkpoints */
    float *d_gp, *d_gm, *d_gv, *d_gg;
    void *d_gw;                   /* their compute copy (bf16; NULL in fp32: the master is it) */
    nb_adamw_span *gspans;        /* one layer's tensors, offsets from the layer's start */
    int ngspans;
    gpu_opt *d_opt, *h_opt;       /* device; pinned [2] by the update's step parity */
    gpu_opt_item gopt_items[2];
    int gopt_step;                /* the step whose scalars d_opt holds (-1: none yet) */
    unsigned char *gpending;      /* [layers]: the device layer's update waits for the next forward */
    int gpend_step, gdirty;       /* the pending updates' step; the host master is stale */
    double *d_gpart;              /* [nglayer * gpart_stride]: each device layer's norm blocks */
    char *h_gnorm;                /* pinned [nglayer * gnorm_stride]: those blocks, then the gradient's
                                   * edges (the elements in blocks shared with a neighbour) */
    size_t gpart_stride, gnorm_stride;
    double sumsq;                 /* the step's global gradient norm squared (host) */
    double *norm_part;            /* [slab blocks]: each NB_SUMSQ_BLOCK block's sum of squares, */
    unsigned char *norm_have;     /* summed as a layer's gradient lands (1) or by the norm task */
    opt_item glob_part[2];        /* the resident part's halves: embeddings (-1), final norm and head (-2) */
    size_t device_bytes, pinned_bytes;
};

/* ---- the layout helpers shared by stream.c and stream_state.c ---- */

/* Slab elements [o, o + n) against the norm's blocks: nparts whole blocks from block b0, the first
 * head and the last tail elements in blocks shared with the neighbours (a range inside one or two
 * blocks: all of it is head). */
typedef struct {
    size_t o, n, b0, nparts, head, tail;
} nb_norm_geom;

static inline nb_norm_geom nb_stream_geom_range(size_t o, size_t n) {
    const size_t B = NB_SUMSQ_BLOCK;
    nb_norm_geom g = {o, n, 0, 0, n, 0};
    size_t b0 = (o + B - 1) / B, b1 = (o + n) / B;
    if (b1 > b0) g.b0 = b0, g.nparts = b1 - b0, g.head = b0 * B - o, g.tail = o + n - b1 * B;
    return g;
}

static inline nb_norm_geom nb_stream_geom_of(const nb_stream *st, int l) {
    return nb_stream_geom_range(st->sl.layer_offset[l], st->layer_numel);
}

static inline int nb_stream_on_gpu(const nb_stream *st, int l) { return st->gidx && st->gidx[l] >= 0; }

/* where device layer l's state starts in the device buffers, in elements */
static inline size_t nb_stream_goff(const nb_stream *st, int l) { return (size_t)st->gidx[l] * st->layer_numel; }

/* The layer whose group starts at or before slab offset o (-1: o is in the input stage). */
static inline int nb_stream_layer_at(const nb_stream *st, size_t o) {
    int lo = 0, hi = st->sl.layers - 1;
    if (hi < 0 || o < st->sl.layer_offset[0]) return -1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (st->sl.layer_offset[mid] <= o) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* Slab offset o's place in the host moment and gradient slabs, which leave the device layers out
 * (their moments and gradients live on the device only); SIZE_MAX inside a device layer. */
static inline size_t nb_stream_host_off(const nb_stream *st, size_t o) {
    int l = st->nglayer ? nb_stream_layer_at(st, o) : -1;
    if (l < 0) return o;
    int inside = o < st->sl.layer_offset[l] + st->layer_numel;
    if (nb_stream_on_gpu(st, l) && inside) return SIZE_MAX;
    size_t cut = (size_t)st->hcut[l] + (size_t)(nb_stream_on_gpu(st, l) && !inside);
    return o - cut * st->layer_numel;
}

/* noclip: streamed layer l's gradient edges */
static inline float *nb_stream_edges_of(const nb_stream *st, int l) { return st->h_edges + (size_t)l * 2 * NB_SUMSQ_BLOCK; }

/* where the host keeps the gradient of slab offset o (the resident part's, or with clipping a
 * streamed layer's) */
static inline float *nb_stream_grad_of(const nb_stream *st, size_t o) {
    if (!st->noclip) return st->h_grads + nb_stream_host_off(st, o);
    return st->h_grads + (o >= st->sl.out_off ? st->sl.in_n + (o - st->sl.out_off) : o - st->sl.in_off);
}

/* device layer l's pinned norm buffer (its blocks' sums, then its edges) */
static inline char *nb_stream_gnorm_of(const nb_stream *st, int l) { return st->h_gnorm + (size_t)st->gidx[l] * st->gnorm_stride; }

/* Setup of the device slots, pinned slabs and lanes, once the family placed its buffers
 * (other_device_bytes: what the run's plan already holds on the device, checked against what was
 * free before it); binds the family's stages to the resident buffers. */
void nb_stream_init(nb_stream *st, size_t other_device_bytes);
void nb_stream_free(nb_stream *st);
nb_mark nb_stream_step(nb_stream *st, int step);
/* The host master -> the resident part and the device layers (start, resume). */
void nb_stream_upload(nb_stream *st);
/* The last step's global gradient norm (the host summed it; the step's end waited for it). */
float nb_stream_grad_norm(const nb_stream *st);
/* Waits until the optimizer has finished (before reading the host master: evaluation, checkpoints). */
void nb_stream_quiesce(nb_stream *st);
/* One line: what crossed PCIe in the last step (layer uploads, bytes each way). */
void nb_stream_report(const nb_stream *st);
/* Device bytes the stream schedule allocates besides the activations (resident part, slots),
 * with wslots weight slots and glayers layers on the device; nb_stream_wslot_bytes and
 * nb_stream_glayer_bytes: what one more weight slot, one more device layer takes. */
size_t nb_stream_device_need(const nb_layer_slab *s, int wslots, int glayers);
/* Host bytes of the stream's state with glayers device layers: the fp32 master of every layer, the
 * two moments and the gradient of all but the device layers (theirs live on the device only:
 * glayers_saved is what that leaves out); without clipping (noclip) the gradient of the resident
 * part and the layers' edges only (noclip_saved: what that leaves out); and the pinned staging
 * with nslab slabs each way. */
typedef struct {
    size_t master, moments, grads, glayers_saved, noclip_saved;
} nb_stream_host;
void nb_stream_host_need(const nb_layer_slab *s, int glayers, int noclip, nb_stream_host *h);
size_t nb_stream_moment_numel(const nb_layer_slab *s, int glayers);
/* elements of the host gradient slab and of the noclip edge store */
size_t nb_stream_grads_numel(const nb_layer_slab *s, int glayers, int noclip);
size_t nb_stream_edges_numel(const nb_layer_slab *s, int noclip);
size_t nb_stream_pinned_need(const nb_layer_slab *s, int nslab, int glayers);
/* bytes of a device layer's pinned norm buffer; gradient slots beside wslots weight slots */
size_t nb_stream_gnorm_stride(size_t layer_numel);
int nb_stream_gradient_slots(int wslots);
/* The device layers' moments through the family's state map (stream_state.c): zeroed, bound. */
void nb_stream_bind_state(nb_stream *st);
/* nb_sumsq_finish over a host gradient slab that lacks the device layers. */
double nb_stream_sumsq_split(nb_stream *st);
size_t nb_stream_wslot_bytes(const nb_layer_slab *s);
/* LoRA (a frozen slab): elements of the base the host keeps (the streamed layers', pinned: the
 * uploads read it in place); bytes of the adapters the family keeps on the device */
size_t nb_stream_base_host_numel(const nb_layer_slab *s, int glayers);
size_t nb_stream_trained_dev_bytes(const nb_layer_slab *s);
size_t nb_stream_glayer_bytes(const nb_layer_slab *s);

#endif
