/* stream: MegaTrain, host-memory-centric training of a model whose state does not fit the GPU:
 * the state lives in host memory and the layers stream through device slots. It runs any family
 * that offers the layers capability (step.h nb_layers_i: the transformer family today) and knows
 * nothing else of the model: it binds the family's input and output stages to its resident
 * buffers, runs the family's own items for them, and runs each layer's forward and backward
 * (nb_layers_i.forward/backward) with the weights in the slot it loaded. Its memory plan and
 * options are in stream_plan.c.
 *
 * Where things live:
 *  - host: the fp32 master weights of the whole model, the AdamW moments and gradients of every
 *    part but the device layers (the trainer's host slabs, in the model's slab layout less the
 *    device layers: host_off; the global gradient norm is summed in plain's blocks and order),
 *    and a bounded pool of pinned staging slabs (2 up, 2 down, one layer each, plus one for the
 *    embeddings/final norm/head);
 *  - device: the embeddings, final norm and head stay resident (compute copy + fp32 gradient),
 *    the weight slots that layers stream through (--stream-slots, 2 by default, up to one per
 *    layer), two gradient slots, the activations; and with --gpu-layers N, N layers spread over
 *    the model whose whole state (master, moments, gradient, compute copy) lives on the device and
 *    is updated there (the host's copy of them is refreshed by quiesce).
 *
 * Lanes: compute (device), h2d and d2h (device: copy engines on CUDA), stage, host and optim
 * (threads; stage and host apart, so that staging an upload never queues behind a gradient that
 * is still on its way down).
 *   forward:  layer l's compute-precision weights go into an up slab: written there by the
 *             previous step's AdamW of layer l (below), or by stage (the first step, no clipping);
 *             h2d copies them into a weight slot once the slot's last user is done; compute runs
 *             layer l as soon as its slot is filled. Layer l+1 loads while l runs.
 *   backward: the last layers of the forward are still in their slots and are reused (a new load
 *             takes the slot used longest ago); the others load again (stage rounds the master).
 *             Layer l's gradient goes into a zeroed gradient slot; d2h copies it into a down slab
 *             as soon as the layer's backward ends; host puts it into the host gradient slab. The
 *             embeddings' and head's gradients follow the same way at the end.
 *   device layers: bound to their own buffers, nothing loaded; their gradient stays, its norm
 *             blocks are summed on the device (the host's blocks and roundings) and only those
 *             sums and the few elements of blocks shared with a neighbour come down. Their AdamW
 *             (plain's kernel) runs on the compute lane before the layer's next forward.
 *   recompute (--ckpt-interval K): only every K-th layer's input is kept through the step; before
 *             the backward of a block of K layers, its forward runs again from that checkpoint
 *             (the last block's activations are still there and are not recomputed).
 *             --keep-layers N: the last N layers keep all their activations and are never
 *             recomputed (-1: as many as fit on the GPU), the recompute runs below them.
 *   optimizer: clipping needs the global norm, so the optim lane starts when the last gradient
 *             has landed: the norm (nb_sumsq's blocks, summed as each layer and the resident part
 *             land, the rest at the end, in plain's order), then AdamW of the embeddings (then
 *             copied up). The step ends once the norm is known. Each layer's AdamW is enqueued by
 *             the next forward's load of that layer and writes the layer's bf16 weights (round to
 *             nearest even, as the device cast) straight into its up slab: the update and the
 *             staging are one pass over host memory, whose bandwidth paces the forward. The final
 *             norm and head's AdamW and upload come after the layers' (upload_head). Each is a
 *             task of its own (nb_adamw_host_apply: the per-element formula of plain, vectorized).
 *   With the CPU backend (host and "device" are both RAM, the copies still go through the lanes)
 *   the result is bitwise plain's (tests/stream_test.sh).
 *
 *   no clipping (--grad-clip 0): nothing waits for the norm, so each layer's AdamW runs as soon
 *             as its gradient has landed (a device layer's: after its backward), during the rest
 *             of the backward; the next forward's uploads are staged from the master.
 *
 *   LoRA (the family's slab is frozen: nb_layer_slab.frozen): the schedule keeps only the frozen
 *             base, in compute precision, loaded group by group through bind_base (base_sink):
 *             the streamed layers' in one pinned host buffer, the stages' and the device layers'
 *             on the device. A load is one h2d copy from that buffer into a slot (nothing staged);
 *             slots keep their layer across steps (the base never changes). The backward gives no
 *             gradient for the base: the layer's adapters add theirs into the family's resident
 *             slab, and the family's own AdamW item (plain's) follows the step on the compute
 *             lane. Nothing comes down; the host lanes have no work. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "host.h"
#include "optim/adamw_host.h"
#include "optim/optim.h"
#include "sched/stream.h"

static size_t es(const nb_stream *st) { return nb_dtype_size(st->r->be->act_dtype); }
static int lowp(const nb_stream *st) { return st->r->be->act_dtype != NB_F32; }

/* ---- the resident part: the input stage and the output stage, packed ---- */

/* One half of the packed resident part, in elements: layer -1 the input stage (the embeddings),
 * -2 the output stage (final norm and head). The input stage's gradient is complete after its
 * backward, the output stage's right after the head's backward; the next forward needs the input
 * stage first. */
static void glob_half(const nb_stream *st, int layer, size_t *off, size_t *n) {
    *off = layer == -2 ? st->sl.in_n : 0;
    *n = layer == -2 ? st->sl.out_n : st->sl.in_n;
}

/* the slab offset of that half */
static size_t glob_slab_offset(const nb_stream *st, int layer) { return layer == -2 ? st->sl.out_off : st->sl.in_off; }

/* Threads of the host copies (staging an upload, landing a gradient): one core does not reach the
 * host's memory bandwidth. With clipping the optimizer waits for the norm, so during the backward
 * it is idle and the copies may take half the cores (a 14b layer is 1 GB of fp32 gradient: four
 * threads land it slower than the GPU computes the next layer); without clipping AdamW runs
 * beside them on every core and they keep to four. OMP_NUM_THREADS caps it. */
#define COPY_THREADS 4
#define COPY_CHUNK ((size_t)1 << 20)
static int copy_threads(const nb_stream *st) {
    int all = nb_host_max_threads(), few = all < COPY_THREADS ? all : COPY_THREADS;
    return st->r->o.grad_clip > 0 && all / 2 > few ? all / 2 : few;
}

static void copy_par(const nb_stream *st, void *dst, const void *src, size_t bytes) {
    long n = (long)((bytes + COPY_CHUNK - 1) / COPY_CHUNK);
#pragma omp parallel for schedule(static) num_threads(copy_threads(st)) if (n > 1)
    for (long i = 0; i < n; i++) {
        size_t o = (size_t)i * COPY_CHUNK, len = bytes - o < COPY_CHUNK ? bytes - o : COPY_CHUNK;
        nb_copy_stream((char *)dst + o, (const char *)src + o, len);
    }
}

/* ---- setup ---- */

static void *dev(nb_stream *st, size_t bytes, const char *what) {
    st->device_bytes += bytes;
    return st->r->be->alloc(bytes, what);
}

static void *pinned(nb_stream *st, size_t bytes, const char *what) {
    st->pinned_bytes += bytes;
    return st->r->be->host_alloc(bytes, what);
}

/* ---- device layers (--gpu-layers) ---- */

/* device layer l's compute weights (the master itself in fp32) and gradient */
static void *gw_of(const nb_stream *st, int l) {
    return st->d_gw ? (void *)((char *)st->d_gw + nb_stream_goff(st, l) * es(st)) : (void *)(st->d_gp + nb_stream_goff(st, l));
}

static float *gg_of(const nb_stream *st, int l) { return st->d_gg + nb_stream_goff(st, l); }

/* device layer l's norm blocks on the device, and its pinned buffer (blocks, then edges) */
static double *gpart_of(const nb_stream *st, int l) { return st->d_gpart + (size_t)st->gidx[l] * st->gpart_stride; }


/* R of L layers on the device, spread evenly and starting with layer 0: layer l is one when
 * ceil((l + 1) R / L) > ceil(l R / L). Spread, the forward alternates between device layers (the
 * GPU's own update, ~2 ms) and streamed ones (the host's, ~45 ms for a llama-8b layer), so the
 * host's updates run back to back while the GPU computes; in one run the host would stall once
 * its few staging slabs were full. */
static int spread_on_device(int l, int R, int L) {
    long a = ((long)(l + 1) * R + L - 1) / L, b = ((long)l * R + L - 1) / L;
    return a > b;
}

static void gpu_layers_init(nb_stream *st) {
    int R = st->nglayer, L = st->sl.layers;
    st->gopt_step = -1;
    if (R == 0) return;
    st->gidx = nb_malloc((size_t)L * sizeof(int), "device layers");
    st->hcut = nb_malloc((size_t)L * sizeof(int), "device layers");
    for (int l = 0, k = 0; l < L; l++) {
        st->hcut[l] = k;
        st->gidx[l] = spread_on_device(l, R, L) ? k++ : -1;
    }
    size_t n = (size_t)R * st->layer_numel;
    if (st->sl.frozen) { /* LoRA: their frozen base only, in compute precision */
        st->d_gw = dev(st, n * es(st), "device layers' frozen base");
        return;
    }
    st->d_gp = dev(st, n * sizeof(float), "device layers' weights");
    st->d_gm = dev(st, n * sizeof(float), "device layers' AdamW m");
    st->d_gv = dev(st, n * sizeof(float), "device layers' AdamW v");
    st->d_gg = dev(st, n * sizeof(float), "device layers' gradients");
    st->d_gw = lowp(st) ? dev(st, n * es(st), "device layers' compute weights") : NULL;
    st->d_opt = dev(st, sizeof(gpu_opt), "device layers' AdamW scalars");
    st->h_opt = pinned(st, 2 * sizeof(gpu_opt), "device layers' AdamW scalars");
    st->gpart_stride = st->layer_numel / NB_SUMSQ_BLOCK + 2;
    st->d_gpart = dev(st, (size_t)R * st->gpart_stride * sizeof(double), "device layers' norm blocks");
    st->gnorm_stride = nb_stream_gnorm_stride(st->layer_numel);
    st->h_gnorm = pinned(st, (size_t)R * st->gnorm_stride, "device layers' norm blocks");
    st->gpending = nb_calloc((size_t)L, 1, "device layers");
    st->gspans = nb_calloc((size_t)st->sl.nspans, sizeof(nb_adamw_span), "device layers");
    size_t l0 = st->sl.layer_offset[0];
    for (int i = 0; i < st->sl.nspans; i++) { /* layer 0's tensors stand for every layer's (all alike) */
        nb_adamw_span sp = st->sl.spans[i];
        if (sp.offset < l0 || sp.offset >= l0 + st->layer_numel) continue;
        sp.offset -= l0;
        st->gspans[st->ngspans++] = sp;
    }
    for (int p = 0; p < 2; p++) st->gopt_items[p] = (gpu_opt_item){st, p};
}

static void gpu_layers_free(nb_stream *st) {
    if (st->nglayer == 0) return;
    const nb_backend_i *be = st->r->be;
    if (st->sl.frozen) {
        be->free(st->d_gw);
        free(st->gidx), free(st->hcut);
        return;
    }
    be->free(st->d_gp), be->free(st->d_gm), be->free(st->d_gv), be->free(st->d_gg), be->free(st->d_opt);
    be->free(st->d_gpart);
    if (st->d_gw) be->free(st->d_gw);
    be->host_free(st->h_opt), be->host_free(st->h_gnorm);
    free(st->gpending), free(st->gspans), free(st->gidx), free(st->hcut);
}

static const void *fetch_layer(void *self, nb_ctx ctx, int l);
static void base_sink(void *self, int group, const float *w);

void nb_stream_init(nb_stream *st, size_t other_device_bytes) {
    nb_run *r = st->r;
    st->li->slab(r, &st->sl); /* the family's buffers exist now */
    int L = st->sl.layers;
    st->layer_numel = st->sl.layer_numel;
    st->glob_numel = st->sl.in_n + st->sl.out_n;
    size_t lw = st->layer_numel, gw = st->glob_numel;
    /* check the device plan before allocating anything (--gpu-mem-limit emulates a smaller GPU) */
    st->nslot = st->wslots;
    int frozen = st->sl.frozen; /* LoRA: the frozen base streams, nothing comes back */
    st->ngslot = frozen ? 0 : nb_stream_gradient_slots(st->nslot);
    st->nslab = frozen ? 0 : st->r->o.pinned_slabs;
    st->nglayer = st->glayers;
    size_t need = nb_stream_device_need(&st->sl, st->nslot, st->nglayer);
    /* the trainer's plan (other_device_bytes) is allocated already: compare with what was free before it */
    size_t budget = st->r->o.gpu_mem_limit ? (size_t)st->r->o.gpu_mem_limit : st->r->dev_free0;
    if (st->r->be->device != NB_DEV_CPU && budget && need + other_device_bytes > budget) {
        char a[32], b[32];
        nb_fail("lower --batch or --seq, or raise --gpu-mem-limit", "--schedule stream needs %s of GPU memory but %s is available",
                nb_fmt_bytes(a, 32, (double)(need + other_device_bytes)), nb_fmt_bytes(b, 32, (double)budget));
    }
    st->d_glob_g = frozen ? NULL : dev(st, gw * sizeof(float), "resident gradients");
    st->d_glob_w = dev(st, gw * es(st), "resident weights");
    st->d_wslot = nb_calloc((size_t)st->nslot, sizeof(void *), "stream slots");
    st->wslot_free = nb_calloc((size_t)st->nslot, sizeof(opt_mark), "stream slots");
    st->wslot_layer = nb_calloc((size_t)st->nslot, sizeof(int), "stream slots");
    st->wslot_used = nb_calloc((size_t)st->nslot, sizeof(long), "stream slots");
    for (int k = 0; k < st->nslot; k++) {
        st->d_wslot[k] = dev(st, lw * es(st), "layer weight slot");
        st->wslot_layer[k] = -1;
    }
    for (int k = 0; k < st->ngslot; k++) st->d_gslot[k] = dev(st, lw * sizeof(float), "layer gradient slot");
    for (int k = 0; k < st->nslab; k++) {
        st->h_up[k] = pinned(st, lw * es(st), "upload staging");
        st->h_down[k] = pinned(st, lw * sizeof(float), "download staging");
    }
    st->h_glob = frozen ? NULL : pinned(st, gw * sizeof(float), "resident-part staging");
    size_t hb = nb_stream_base_host_numel(&st->sl, st->glayers) * es(st);
    st->h_base = frozen && hb ? pinned(st, hb, "the streamed layers' frozen base") : NULL;
    gpu_layers_init(st);
    st->h2d = nb_lane_create(st->r->lanes, "h2d", NB_LANE_DEVICE);
    st->d2h = nb_lane_create(st->r->lanes, "d2h", NB_LANE_DEVICE);
    st->stage = nb_lane_create(st->r->lanes, "stage", NB_LANE_HOST);
    st->host = nb_lane_create(st->r->lanes, "host", NB_LANE_HOST);
    st->optim = nb_lane_create(st->r->lanes, "optim", NB_LANE_HOST);
    st->updated = nb_calloc((size_t)(L ? L : 1), sizeof(opt_mark), "stream marks");
    st->pending = nb_calloc((size_t)(L ? L : 1), sizeof(opt_item *), "stream items");
    for (int p = 0; p < 2; p++) st->opt_items[p] = nb_calloc((size_t)L + 2, sizeof(opt_item), "stream items");
    size_t nblk = frozen ? 0 : (st->sl.total + NB_SUMSQ_BLOCK - 1) / NB_SUMSQ_BLOCK; /* LoRA: the family's norm */
    st->norm_part = nb_calloc(nblk ? nblk : 1, sizeof(double), "norm partial sums");
    st->norm_have = nb_calloc(nblk ? nblk : 1, 1, "norm partial sums");
    st->glob_part[0] = (opt_item){st, -1, -1, NULL, NULL};
    st->glob_part[1] = (opt_item){st, -2, -1, NULL, NULL};
    st->fwd = nb_calloc((size_t)(L ? L : 1), sizeof(stream_item), "stream items");
    st->bwd = nb_calloc((size_t)(L ? L : 1), sizeof(stream_item), "stream items");
    st->rec = nb_calloc((size_t)(L ? L : 1), sizeof(stream_item), "stream items");
    st->loads = nb_calloc((size_t)(3 * L + 1), sizeof(load_item), "stream items");
    st->gitems = nb_calloc((size_t)(L ? L : 1), sizeof(stream_item), "stream items");
    for (int l = 0; l < L; l++) st->gitems[l] = (stream_item){st, l, -1, -1, -1};
    /* the family's items read and write the resident part here; evaluation fetches layers */
    st->li->bind(r, st->d_glob_w, st->d_glob_g, fetch_layer, st);
    if (frozen) st->li->bind_base(r, base_sink, st); /* the family loads it at start */
    nb_stream_bind_state(st);
    char a[32], b[32], c[32], d[32];
    nb_stream_host h;
    nb_stream_host_need(&st->sl, st->nglayer, st->noclip, &h);
    r->sched_dev_bytes = st->device_bytes, r->sched_pinned_bytes = st->pinned_bytes; /* what was allocated */
    if (frozen) {
        nb_log(1, "stream      LoRA: the frozen base of %d streamed layers in pinned host memory (%s); device: %s (the "
                  "stages' and %d device layers' base, %d layer slots of %s); the adapters stay%s on the device\n",
               L - st->nglayer, nb_fmt_bytes(a, 32, (double)st->pinned_bytes), nb_fmt_bytes(b, 32, (double)st->device_bytes),
               st->nglayer, st->nslot, nb_fmt_bytes(c, 32, (double)(lw * es(st))), r->eval_only ? "" : " and train");
        return;
    }
    double host_bytes = (double)(h.master + h.moments + h.grads);
    nb_log(1, "stream      host: %s (%.2f bytes/param: fp32 weights, 2 AdamW moments, gradients) + pinned staging %s; "
              "device: %s for weights and gradients (embeddings, final norm and head resident; %d layer weight slots "
              "of %s%s, %d gradient slots) + activations\n",
           nb_fmt_bytes(a, 32, host_bytes), host_bytes / (double)(st->sl.total ? st->sl.total : 1),
           nb_fmt_bytes(b, 32, (double)st->pinned_bytes),
           nb_fmt_bytes(c, 32, (double)st->device_bytes), st->nslot, nb_fmt_bytes(d, 32, (double)(lw * es(st))),
           st->nslot >= L - st->nglayer && L - st->nglayer > 2 ? ": the forward's weights stay for the backward" : "",
           st->ngslot);
    if (st->nglayer) {
        char list[256] = "";
        size_t at = 0;
        for (int l = 0; l < L && at + 8 < sizeof list; l++)
            if (nb_stream_on_gpu(st, l)) at += (size_t)snprintf(list + at, sizeof list - at, "%s%d", at ? " " : "", l);
        nb_log(1, "stream      %d of %d layers (%s) keep weights, AdamW state and gradients on the device and update "
                  "there (--gpu-layers): %s of device memory; the host keeps only their fp32 weights (checkpoints fetch "
                  "their moments)\n",
               st->nglayer, L, list, nb_fmt_bytes(a, 32, (double)st->nglayer * nb_stream_glayer_bytes(&st->sl)));
    }
}

void nb_stream_free(nb_stream *st) {
    if (!st) return;
    const nb_backend_i *be = st->r->be;
    if (st->d_glob_g) be->free(st->d_glob_g);
    be->free(st->d_glob_w);
    for (int k = 0; k < st->nslot; k++) be->free(st->d_wslot[k]);
    for (int k = 0; k < st->ngslot; k++) be->free(st->d_gslot[k]);
    free(st->d_wslot), free(st->wslot_free), free(st->wslot_layer), free(st->wslot_used);
    for (int k = 0; k < st->nslab; k++) {
        be->host_free(st->h_up[k]);
        be->host_free(st->h_down[k]);
    }
    if (st->h_glob) be->host_free(st->h_glob);
    if (st->h_base) be->host_free(st->h_base);
    free(st->base_tmp);
    gpu_layers_free(st);
    free(st->norm_part), free(st->norm_have);
    free(st->fwd), free(st->rec), free(st->bwd), free(st->loads), free(st->updated), free(st->pending), free(st->opt_items[0]), free(st->opt_items[1]);
    free(st->gitems);
    free(st);
}

/* ---- work items ---- */

/* n compute-precision weights from slab offset into dst: the fp32 master itself, or rounded to
 * bf16 on the way (round to nearest even, as AdamW's bf16 output and the device cast). Most
 * uploads do not come here: the update of the step before writes them (run_update). threads 0:
 * the copies' share of the cores (copy_threads); the LoRA base's load at start takes them all. */
static void cast_w(const nb_stream *st, void *dst, const float *p, size_t n, int threads) {
    if (!lowp(st)) {
        copy_par(st, dst, p, n * sizeof(float));
    } else {
        uint16_t *d = dst;
#pragma omp parallel for schedule(static) num_threads(threads ? threads : copy_threads(st)) if (n > 65536)
        for (size_t i = 0; i < n; i++) d[i] = nb_bf16_from_f32(p[i]);
    }
}

static void stage_w(const nb_stream *st, void *dst, size_t offset, size_t n) { cast_w(st, dst, st->sl.params + offset, n, 0); }

/* ---- LoRA: the frozen base ---- */

/* streamed layer l's frozen base in the pinned host copy (the device layers have none there) */
static void *base_of(const nb_stream *st, int l) {
    return (char *)st->h_base + (size_t)(l - (st->hcut ? st->hcut[l] : 0)) * st->layer_numel * es(st);
}

typedef struct {
    nb_stream *st;
    void *dst;
    const void *src;
    size_t bytes;
} base_job;

static void work_base_up(void *arg, const nb_task_ctx *ctx) {
    base_job *j = arg;
    j->st->r->be->to_backend(ctx, j->dst, j->src, j->bytes);
}

/* The family's base, one group at a time (nb_base_sink_fn), rounded to compute precision as the
 * device cast rounds it under plain: a streamed layer's into the pinned host copy, the stages'
 * and the device layers' up to their place on the device (in order on the compute lane). */
static size_t n_max(size_t a, size_t b, size_t c) { return a > b ? (a > c ? a : c) : (b > c ? b : c); }

static void base_sink(void *self, int group, const float *w) {
    nb_stream *st = self;
    int L = st->sl.layers, l = group - 1;
    size_t n = group == 0 ? st->sl.in_n : group == L + 1 ? st->sl.out_n : st->layer_numel;
    if (l >= 0 && l < L && !nb_stream_on_gpu(st, l)) {
        cast_w(st, base_of(st, l), w, n, nb_host_max_threads());
    } else {
        void *dst = group == 0 ? st->d_glob_w : group == L + 1 ? (char *)st->d_glob_w + st->sl.in_n * es(st) : gw_of(st, l);
        if (!st->base_tmp) /* one buffer for every group that goes up: pages faulted in once */
            st->base_tmp = nb_malloc(n_max(st->sl.in_n, st->sl.out_n, st->layer_numel) * es(st) + 1, "a group of the LoRA base");
        cast_w(st, st->base_tmp, w, n, nb_host_max_threads());
        base_job j = {st, dst, st->base_tmp, n * es(st)};
        nb_run_on_compute(st->r, "LoRA base up", work_base_up, &j);
    }
    if (group == L + 1) free(st->base_tmp), st->base_tmp = NULL; /* the last group */
}

/* Compute-precision weights of one half of the resident part into its place in the staging slab. */
static void glob_pack_part(const nb_stream *st, void *packed, int layer) {
    size_t off, n;
    glob_half(st, layer, &off, &n);
    stage_w(st, (char *)packed + off * es(st), glob_slab_offset(st, layer), n);
}

static void glob_pack_w(const nb_stream *st, void *packed) {
    glob_pack_part(st, packed, -1);
    glob_pack_part(st, packed, -2);
}

/* The device layers' master between the host slab and the device, on ctx: up at start and resume
 * (with their compute copy), down before checkpoints, evaluation and the end. Their moments have
 * no host copy: zeroed at setup, written by resume and read by checkpoints through the state map
 * (state_fetch, state_store). */
static void gpu_state_copy(nb_stream *st, nb_ctx ctx, int up) {
    size_t lw = st->layer_numel, bytes = lw * sizeof(float);
    for (int l = 0; l < st->sl.layers; l++) {
        if (!nb_stream_on_gpu(st, l)) continue;
        size_t o = st->sl.layer_offset[l], off = nb_stream_goff(st, l);
        if (up)
            st->r->be->to_backend(ctx, st->d_gp + off, st->sl.params + o, bytes);
        else
            st->r->be->to_host(ctx, st->sl.params + o, st->d_gp + off, bytes);
        if (up && st->d_gw) st->r->be->cast_params(ctx, gw_of(st, l), st->d_gp + off, lw);
    }
}

/* The resident part and the device layers from the host master, on ctx (start, resume). */
static void work_upload(void *arg, const nb_task_ctx *ctx) {
    nb_stream *st = arg;
    if (st->sl.frozen) return; /* LoRA: the base went up as the family loaded it (base_sink) */
    glob_pack_w(st, st->h_glob);
    st->r->be->to_backend(ctx, st->d_glob_w, st->h_glob, st->glob_numel * es(st));
    gpu_state_copy(st, ctx, 1);
    if (st->gpending) memset(st->gpending, 0, (size_t)st->sl.layers);
    st->gdirty = 0;
    st->gopt_step = -1;
}

static void work_stage_up(void *arg, const nb_task_ctx *ctx) {
    load_item *it = arg;
    nb_stream *st = it->st;
    nb_host_set_threads(st->r->o.threads);
    stage_w(st, st->h_up[it->uslot], st->sl.layer_offset[it->layer], st->layer_numel);
}

static void work_h2d(void *arg, const nb_task_ctx *ctx) {
    load_item *it = arg;
    nb_stream *st = it->st;
    const void *src = st->sl.frozen ? base_of(st, it->layer) : st->h_up[it->uslot]; /* LoRA: read in place */
    st->r->be->to_backend(ctx, st->d_wslot[it->wslot], src, st->layer_numel * es(st));
}

/* an item's weights and gradient: its slots, or a device layer's own buffers (wslot -1) */
static void *item_w(nb_stream *st, const stream_item *it) {
    return it->wslot < 0 ? gw_of(st, it->layer) : st->d_wslot[it->wslot];
}

static float *item_g(nb_stream *st, const stream_item *it) {
    return it->wslot < 0 ? gg_of(st, it->layer) : st->d_gslot[it->gslot];
}

/* the family's layer forward and backward, bound to the item's slots */
static void work_fwd(void *arg, const nb_task_ctx *ctx) {
    stream_item *it = arg;
    nb_stream *st = it->st;
    st->li->forward(st->r, ctx, it->layer, item_w(st, it));
}

static void work_bwd(void *arg, const nb_task_ctx *ctx) {
    stream_item *it = arg;
    nb_stream *st = it->st;
    if (st->sl.frozen) { /* LoRA: no gradient for the base; the adapters' is the family's */
        st->li->backward(st->r, ctx, it->layer, item_w(st, it), NULL);
        return;
    }
    st->r->be->zero(ctx, item_g(st, it), st->layer_numel * sizeof(float));
    st->li->backward(st->r, ctx, it->layer, item_w(st, it), item_g(st, it));
    if (it->wslot < 0) { /* a device layer: its share of the norm, block by block, where it is */
        nb_norm_geom g = nb_stream_geom_of(st, it->layer);
        if (g.nparts)
            st->r->be->sumsq_blocks(ctx, gpart_of(st, it->layer), item_g(st, it) + g.head, g.nparts * NB_SUMSQ_BLOCK);
    }
}

static void work_d2h(void *arg, const nb_task_ctx *ctx) {
    stream_item *it = arg;
    nb_stream *st = it->st;
    st->r->be->to_host_async(ctx, st->h_down[it->dslot], st->d_gslot[it->gslot], st->layer_numel * sizeof(float));
}

/* n gradients from a down slab into dst (the host slab's place of slab offset o), summing the
 * squares of every norm block that lies inside [o, o + n) on the way (one read of the slab instead
 * of two; the blocks are nb_sumsq's, so the norm keeps plain's bits: the norm task sums the rest
 * and adds in order). dst NULL: the sums only, the gradient stays in the down slab (no clipping). */
static void land(nb_stream *st, size_t o, const float *src, size_t n, float *dst) {
    const size_t B = NB_SUMSQ_BLOCK;
    nb_norm_geom g = nb_stream_geom_range(o, n);
    if (!g.nparts) {
        if (dst) copy_par(st, dst, src, n * sizeof(float));
        return;
    }
    if (dst) memcpy(dst, src, g.head * sizeof(float));
    if (dst) memcpy(dst + (n - g.tail), src + (n - g.tail), g.tail * sizeof(float));
    long nb = (long)g.nparts;
#pragma omp parallel for schedule(static) num_threads(copy_threads(st)) if (nb > 64)
    for (long k = 0; k < nb; k++) {
        size_t at = g.head + (size_t)k * B;
        if (dst) nb_copy_stream(dst + at, src + at, B * sizeof(float));
        st->norm_part[g.b0 + (size_t)k] = nb_sumsq_block(src + at, B); /* the copy's bits, read from cache */
        st->norm_have[g.b0 + (size_t)k] = 1;
    }
}

/* A layer's gradient: into the host slab; without clipping only its norm blocks and edges (the
 * elements it shares blocks with its neighbours), its AdamW reading the down slab itself. */
static void work_grad_land(void *arg, const nb_task_ctx *ctx) {
    stream_item *it = arg;
    nb_stream *st = it->st;
    size_t o = st->sl.layer_offset[it->layer], n = st->layer_numel;
    const float *src = st->h_down[it->dslot];
    if (!st->noclip) {
        land(st, o, src, n, st->h_grads + nb_stream_host_off(st, o));
        return;
    }
    land(st, o, src, n, NULL);
    nb_norm_geom g = nb_stream_geom_range(o, n);
    float *edges = nb_stream_edges_of(st, it->layer);
    memcpy(edges, src, g.head * sizeof(float));
    memcpy(edges + g.head, src + (n - g.tail), g.tail * sizeof(float));
}

static void work_glob_d2h(void *arg, const nb_task_ctx *ctx) {
    opt_item *it = arg;
    nb_stream *st = it->st;
    size_t off, n;
    glob_half(st, it->layer, &off, &n);
    st->r->be->to_host_async(ctx, st->h_glob + off, st->d_glob_g + off, n * sizeof(float));
}

static void work_glob_land(void *arg, const nb_task_ctx *ctx) {
    opt_item *it = arg;
    nb_stream *st = it->st;
    size_t off, n;
    glob_half(st, it->layer, &off, &n);
    land(st, glob_slab_offset(st, it->layer), st->h_glob + off, n, nb_stream_grad_of(st, glob_slab_offset(st, it->layer)));
}

/* Host AdamW with the vectorized, multi-threaded nb_adamw_host_apply: the same bits as the CPU
 * backend's plain step (the norm over the same slab, the same per-element formula), so CPU runs of
 * stream and plain stay bitwise equal. w16_out: where the group's bf16 weights go (NULL: nowhere). */
static void adamw_range(nb_stream *st, size_t off, size_t n, const nb_adamw_scalars *k, uint16_t *w16_out, const float *g) {
    const nb_layer_slab *s = &st->sl;
    float clip = nb_clip_factor(sqrt(st->sumsq), st->r->o.grad_clip);
    for (int i = 0; i < s->nspans; i++) {
        const nb_adamw_span *p = &s->spans[i];
        if (p->offset < off || p->offset >= off + n) continue;
        uint16_t *w16 = w16_out ? w16_out + (p->offset - off) : NULL;
        size_t h = nb_stream_host_off(st, p->offset);
        nb_adamw_host_apply(s->params + p->offset, g + (p->offset - off), s->m + h, s->v + h, w16, p->numel, &k[p->scalars],
                            clip, st->r->o.threads);
    }
}

static void work_norm(void *arg, const nb_task_ctx *ctx) {
    nb_stream *st = ((nb_stream *)arg);
    nb_host_set_threads(st->r->o.threads);
    st->sumsq = st->nglayer || st->noclip ? nb_stream_sumsq_split(st) : nb_sumsq_finish(st->h_grads, st->sl.total, st->norm_part, st->norm_have);
    memset(st->norm_have, 0, (st->sl.total + NB_SUMSQ_BLOCK - 1) / NB_SUMSQ_BLOCK);
}

/* it->layer -1: the embeddings; -2: the final norm and head */
static void work_adamw_resident(void *arg, const nb_task_ctx *ctx) {
    opt_item *it = arg;
    nb_stream *st = it->st;
    size_t off, n;
    glob_half(st, it->layer, &off, &n);
    size_t o = glob_slab_offset(st, it->layer);
    adamw_range(st, o, n, it->k, NULL, nb_stream_grad_of(st, o));
    glob_pack_part(st, st->h_glob, it->layer);
}

/* Layer l's update; given an up slab, also its compute-precision weights into it (bf16: AdamW's
 * own rounded output, so the forward's upload reads no host memory again). */
static void work_adamw_layer(void *arg, const nb_task_ctx *ctx) {
    opt_item *it = arg;
    nb_stream *st = it->st;
    void *up = it->uslot >= 0 ? st->h_up[it->uslot] : NULL;
    size_t o = st->sl.layer_offset[it->layer];
    adamw_range(st, o, st->layer_numel, it->k, lowp(st) ? up : NULL, it->g ? it->g : nb_stream_grad_of(st, o));
    if (up && !lowp(st)) /* fp32: the master is the compute copy */
        copy_par(st, up, st->sl.params + st->sl.layer_offset[it->layer], st->layer_numel * sizeof(float));
}

static void work_glob_h2d(void *arg, const nb_task_ctx *ctx) {
    opt_item *it = arg;
    nb_stream *st = it->st;
    size_t e = es(st), off, n;
    glob_half(st, it->layer, &off, &n);
    st->r->be->to_backend(ctx, (char *)st->d_glob_w + off * e, (char *)st->h_glob + off * e, n * e);
}

/* A device layer's norm blocks and gradient edges into its pinned buffer... */
static void work_gpu_norm_d2h(void *arg, const nb_task_ctx *ctx) {
    stream_item *it = arg;
    nb_stream *st = it->st;
    nb_norm_geom g = nb_stream_geom_of(st, it->layer);
    char *h = nb_stream_gnorm_of(st, it->layer);
    float *edges = (float *)(h + g.nparts * sizeof(double)), *grad = gg_of(st, it->layer);
    if (g.nparts) st->r->be->to_host_async(ctx, h, gpart_of(st, it->layer), g.nparts * sizeof(double));
    if (g.head) st->r->be->to_host_async(ctx, edges, grad, g.head * sizeof(float));
    if (g.tail) st->r->be->to_host_async(ctx, edges + g.head, grad + g.n - g.tail, g.tail * sizeof(float));
}

/* ...then into the norm's partial sums; the edges stay in the pinned buffer, where the norm task
 * reads them for the blocks the layer shares with its neighbours (grad_at) */
static void work_gpu_norm_land(void *arg, const nb_task_ctx *ctx) {
    stream_item *it = arg;
    nb_stream *st = it->st;
    nb_norm_geom g = nb_stream_geom_of(st, it->layer);
    memcpy(st->norm_part + g.b0, nb_stream_gnorm_of(st, it->layer), g.nparts * sizeof(double));
    memset(st->norm_have + g.b0, 1, g.nparts);
}

/* The update's scalars up, read in the lane's order (after the norm it waited for). */
static void work_gpu_opt_up(void *arg, const nb_task_ctx *ctx) {
    gpu_opt_item *it = arg;
    nb_stream *st = it->st;
    gpu_opt *h = &st->h_opt[it->par];
    h->sumsq = st->sumsq;
    memcpy(h->k, st->k[it->par], sizeof h->k);
    st->r->be->to_backend(ctx, st->d_opt, h, sizeof *h);
}

/* Device layer it->layer's AdamW, plain's kernel and formula (clip factor from the norm on the
 * device), writing its compute copy too. */
static void work_gpu_adamw(void *arg, const nb_task_ctx *ctx) {
    const stream_item *it = arg; /* st->gitems[layer] */
    nb_stream *st = it->st;
    size_t off = nb_stream_goff(st, it->layer);
    st->r->be->adamw_spans(ctx, st->d_gp + off, st->d_gg + off, st->d_gm + off, st->d_gv + off,
                        st->d_gw ? gw_of(st, it->layer) : NULL, st->gspans, st->ngspans, st->d_opt->k,
                        st->r->o.grad_clip > 0 ? &st->d_opt->sumsq : NULL, st->r->o.grad_clip);
}

static void work_gpu_download(void *arg, const nb_task_ctx *ctx) { gpu_state_copy(((nb_stream *)arg), ctx, 0); }

/* ---- the step ---- */

static void wait_if(nb_lane *lane, opt_mark m) {
    if (m.set) nb_lane_wait(lane, m.m);
}

static opt_mark mark(nb_lane *lane) { return (opt_mark){nb_lane_mark(lane), 1}; }

/* Enqueues layer l's pending update on the optim lane, writing into up slab u (-1: none). */
static void run_update(nb_stream *st, int l, int u, int step) {
    char name[40];
    st->pending[l]->uslot = u;
    snprintf(name, sizeof name, "adamw L%d", l);
    nb_lane_run(st->optim, name, NB_SPAN_OPTIM, step, work_adamw_layer, st->pending[l]);
    st->updated[l] = mark(st->optim);
    st->pending[l] = NULL;
}

/* The head's update and upload. Both are enqueued late (before the next head, or by quiesce),
 * after every layer's update: a device lane told to wait on a host mark blocks the enqueuing
 * thread, and enqueued at the step's end it would hold the next forward's enqueueing until every
 * layer's update is done. */
static void upload_head(nb_stream *st, int step) {
    if (!st->head_item) return;
    for (int l = 0; l < st->sl.layers; l++)
        if (st->pending[l]) run_update(st, l, -1, step);
    nb_lane_run(st->optim, "adamw head", NB_SPAN_OPTIM, step, work_adamw_resident, st->head_item);
    nb_lane_wait(st->h2d, nb_lane_mark(st->optim));
    nb_lane_run(st->h2d, "h2d head", NB_SPAN_H2D, step, work_glob_h2d, st->head_item);
    st->final_ready = (opt_mark){nb_lane_mark(st->h2d), 1};
    st->head_item = NULL;
}

/* Slot w's newest user is the compute work just enqueued. */
static void slot_used(nb_stream *st, int w) {
    st->wslot_free[w] = mark(st->r->compute);
    st->wslot_used[w] = ++st->uses;
}

/* The slot whose last user was enqueued first, so the upload waits least: in the forward the
 * oldest layer's; in the backward, a layer whose backward is done (not the one the forward left
 * in a slot and whose backward comes last). */
static int lru_slot(const nb_stream *st) {
    int w = 0;
    for (int k = 1; k < st->nslot; k++)
        if (st->wslot_used[k] < st->wslot_used[w]) w = k;
    return w;
}

/* The upload of a load's layer into its weight slot, once the slot's last reader is done; the
 * compute lane is told to wait for it. */
static int load_into(nb_stream *st, load_item *it, int step) {
    char name[40];
    wait_if(st->h2d, st->wslot_free[it->wslot]);
    snprintf(name, sizeof name, "h2d L%d", it->layer);
    nb_lane_run(st->h2d, name, NB_SPAN_H2D, step, work_h2d, it);
    nb_lane_wait(st->r->compute, nb_lane_mark(st->h2d));
    st->wslot_layer[it->wslot] = it->layer;
    return it->wslot;
}

/* Enqueues the upload of layer l into a weight slot (reusing the slot if it already holds l)
 * and returns the slot; the compute lane is told to wait for it. */
static int load(nb_stream *st, int l, int step) {
    for (int k = 0; k < st->nslot; k++)
        if (st->wslot_layer[k] == l) return k;
    int w = lru_slot(st), u = st->next_up;
    st->wslot_used[w] = ++st->uses;
    load_item *it = &st->loads[st->nloads++];
    char name[40];
    if (st->sl.frozen) { /* LoRA: the frozen base goes up from its pinned copy, nothing to stage */
        *it = (load_item){st, l, -1, w};
        return load_into(st, it, step);
    }
    st->next_up = (u + 1) % st->nslab;
    *it = (load_item){st, l, u, w};
    nb_lane *fill = st->pending[l] ? st->optim : st->stage;
    wait_if(fill, st->up_free[u]); /* the slab's previous upload has left it */
    if (st->pending[l]) {          /* the previous step's update of layer l fills the slab */
        run_update(st, l, u, step);
    } else {
        wait_if(st->stage, st->updated[l]); /* the previous step's AdamW of this layer is done */
        snprintf(name, sizeof name, "stage L%d", l);
        nb_lane_run(st->stage, name, NB_SPAN_OTHER, step, work_stage_up, it);
    }
    nb_lane_wait(st->h2d, nb_lane_mark(fill));
    w = load_into(st, it, step);
    st->up_free[u] = mark(st->h2d);
    return w;
}

/* Device layer l's update of step ustep on the compute lane, the step's scalars going up first
 * (once per step). */
static void gpu_update(nb_stream *st, int l, int ustep, int step) {
    char name[40];
    if (st->gopt_step != ustep) {
        nb_lane_run(st->r->compute, "adamw scalars up", NB_SPAN_OTHER, step, work_gpu_opt_up, &st->gopt_items[ustep & 1]);
        st->gopt_step = ustep;
    }
    snprintf(name, sizeof name, "adamw L%d (gpu)", l);
    nb_lane_run(st->r->compute, name, NB_SPAN_OPTIM, step, work_gpu_adamw, &st->gitems[l]);
    st->gpending[l] = 0;
    st->gdirty = 1;
}

/* Layer l's item for the forward or recompute: a device layer binds its own buffers (after its
 * pending update), a streamed one is loaded into a slot. */
static stream_item forward_item(nb_stream *st, int l, int step) {
    if (!nb_stream_on_gpu(st, l)) return (stream_item){st, l, load(st, l, step), 0, 0};
    if (st->gpending && st->gpending[l]) gpu_update(st, l, st->gpend_step, step);
    return (stream_item){st, l, -1, -1, -1};
}

/* A device layer's backward: its gradient stays; only its norm blocks and edges go down. */
static void gpu_backward(nb_stream *st, int l, int step) {
    nb_lane *c = st->r->compute;
    char name[40];
    stream_item *it = &st->bwd[l];
    *it = (stream_item){st, l, -1, -1, -1};
    snprintf(name, sizeof name, "bwd L%d", l);
    nb_lane_run(c, name, NB_SPAN_BWD, step, work_bwd, it);
    nb_lane_wait(st->d2h, nb_lane_mark(c));
    snprintf(name, sizeof name, "d2h L%d norm", l);
    nb_lane_run(st->d2h, name, NB_SPAN_D2H, step, work_gpu_norm_d2h, it);
    nb_lane_wait(st->host, nb_lane_mark(st->d2h));
    snprintf(name, sizeof name, "grad L%d (gpu)", l);
    nb_lane_run(st->host, name, NB_SPAN_OTHER, step, work_gpu_norm_land, it);
    if (st->r->o.grad_clip <= 0) gpu_update(st, l, step, step); /* nothing waits for the norm */
}

/* Layer l's backward into a gradient slot, then its gradient out: d2h, then into the host slab. */
static void backward_layer(nb_stream *st, int l, int step) {
    nb_lane *c = st->r->compute;
    char name[40];
    stream_item *it = &st->bwd[l];
    if (st->sl.frozen) { /* LoRA: the backward alone, its gradient is the family's resident adapters' */
        *it = (stream_item){st, l, nb_stream_on_gpu(st, l) ? -1 : load(st, l, step), -1, -1};
        snprintf(name, sizeof name, "bwd L%d", l);
        nb_lane_run(c, name, NB_SPAN_BWD, step, work_bwd, it);
        if (it->wslot >= 0) slot_used(st, it->wslot);
        return;
    }
    if (nb_stream_on_gpu(st, l)) {
        gpu_backward(st, l, step);
        return;
    }
    int w = load(st, l, step), g = st->next_gslot, d = st->next_down;
    st->next_gslot = (g + 1) % st->ngslot;
    st->next_down = (d + 1) % st->nslab;
    *it = (stream_item){st, l, w, g, d};
    wait_if(c, st->gslot_free[g]); /* its previous gradient has been copied out */
    snprintf(name, sizeof name, "bwd L%d", l);
    nb_lane_run(c, name, NB_SPAN_BWD, step, work_bwd, it);
    slot_used(st, w);
    nb_lane_wait(st->d2h, nb_lane_mark(c));
    wait_if(st->d2h, st->down_free[d]);
    snprintf(name, sizeof name, "d2h L%d", l);
    nb_lane_run(st->d2h, name, NB_SPAN_D2H, step, work_d2h, it);
    st->gslot_free[g] = mark(st->d2h);
    nb_lane_wait(st->host, nb_lane_mark(st->d2h));
    snprintf(name, sizeof name, "grad L%d", l);
    nb_lane_run(st->host, name, NB_SPAN_OTHER, step, work_grad_land, it);
    st->down_free[d] = mark(st->host);
    if (st->noclip) { /* no clipping: nothing waits for the norm, update the layer now, from the down slab */
        opt_item *u = &st->opt_items[step & 1][l];
        *u = (opt_item){st, l, -1, st->k[step & 1], st->h_down[d]};
        nb_lane_wait(st->optim, st->down_free[d].m);
        snprintf(name, sizeof name, "adamw L%d", l);
        nb_lane_run(st->optim, name, NB_SPAN_OPTIM, step, work_adamw_layer, u);
        st->updated[l] = mark(st->optim);
        st->down_free[d] = st->updated[l]; /* the slab is free once the update has read it */
    }
}

/* The family's items of the input and output stages (not its layer items, which this schedule
 * binds to its slots), enqueued in order; one rank and one micro-batch: no bucket to reduce. */
static void run_stage_items(nb_stream *st, const nb_items *l, nb_lane *lane, int step) {
    for (int i = 0; i < l->n; i++)
        if (l->v[i].layer < 0 && !l->v[i].hook) nb_lane_run(lane, l->v[i].name, l->v[i].kind, step, l->v[i].fn, l->v[i].arg);
}

/* Every layer's backward, from the last: the layers kept whole, then block by block from their
 * checkpoints (--ckpt-interval). */
static void backward_layers(nb_stream *st, int step) {
    nb_lane *c = st->r->compute;
    int L = st->sl.layers;
    char name[40];
    int K = st->r->o.ckpt_interval > 0 ? st->r->o.ckpt_interval : L; /* 0: every activation kept */
    int Lw = st->r->o.ckpt_interval > 0 ? L - st->keep : L;          /* below the layers kept whole */
    for (int l = L - 1; l >= Lw; l--) backward_layer(st, l, step);
    for (int b = (Lw - 1) / K * K; b >= 0 && Lw > 0; b -= K) {
        int e = b + K < Lw ? b + K : Lw;
        /* the last block's activations are still there from the forward; the others are
         * recomputed from their checkpoint, and the weights loaded for that serve the backward
         * of the same layers when they are still in their slots */
        for (int l = b; l < e && e < Lw; l++) {
            stream_item *it = &st->rec[l];
            *it = forward_item(st, l, step);
            snprintf(name, sizeof name, "refwd L%d", l);
            nb_lane_run(c, name, NB_SPAN_FWD, step, work_fwd, it);
            if (it->wslot >= 0) slot_used(st, it->wslot);
        }
        for (int l = e - 1; l >= b; l--) backward_layer(st, l, step);
    }
}

/* LoRA's step after the head: the layers' backward (each adds to the resident adapters'
 * gradient), then the input stage's items; the family's AdamW item follows on the compute lane. */
static nb_mark frozen_backward(nb_stream *st, int step) {
    backward_layers(st, step);
    run_stage_items(st, &st->r->items.tail, st->r->compute, step);
    return nb_lane_mark(st->r->compute);
}

nb_mark nb_stream_step(nb_stream *st, int step) {
    const nb_step_items *items_of = &st->r->items;
    nb_lane *c = st->r->compute;
    int L = st->sl.layers;
    char name[40];
    st->nloads = 0;
    for (int k = 0; k < st->nslot && !st->sl.frozen; k++) st->wslot_layer[k] = -1; /* the optimizer changed every layer */
    if (st->sl.k) memcpy(st->k[step & 1], st->sl.k, sizeof st->k[0]); /* this step's AdamW scalars */
    wait_if(c, st->emb_ready);
    run_stage_items(st, &items_of->input, c, step); /* embed fwd */
    for (int l = 0; l < L; l++) {
        stream_item *it = &st->fwd[l];
        *it = forward_item(st, l, step);
        snprintf(name, sizeof name, "fwd L%d", l);
        nb_lane_run(c, name, NB_SPAN_FWD, step, work_fwd, it);
        if (it->wslot >= 0) slot_used(st, it->wslot);
    }
    upload_head(st, step);
    wait_if(c, st->final_ready);
    run_stage_items(st, &items_of->bwd[0], c, step); /* head + loss */
    if (st->sl.frozen) return frozen_backward(st, step);
    /* the final norm's and head's gradients are complete now: down and landed under the backward */
    nb_lane_wait(st->d2h, nb_lane_mark(c));
    nb_lane_run(st->d2h, "d2h head", NB_SPAN_D2H, step, work_glob_d2h, &st->glob_part[1]);
    nb_lane_wait(st->host, nb_lane_mark(st->d2h));
    nb_lane_run(st->host, "grad head", NB_SPAN_OTHER, step, work_glob_land, &st->glob_part[1]);
    backward_layers(st, step);
    run_stage_items(st, &items_of->tail, c, step); /* embed bwd */
    nb_lane_wait(st->d2h, nb_lane_mark(c));
    nb_lane_run(st->d2h, "d2h embeddings", NB_SPAN_D2H, step, work_glob_d2h, &st->glob_part[0]);
    nb_lane_wait(st->host, nb_lane_mark(st->d2h));
    nb_lane_run(st->host, "grad embeddings", NB_SPAN_OTHER, step, work_glob_land, &st->glob_part[0]);
    nb_lane_wait(st->optim, nb_lane_mark(st->host)); /* every gradient is in the host slab */
    nb_lane_run(st->optim, "grad norm", NB_SPAN_OPTIM, step, work_norm, st);
    st->norm_done = mark(st->optim);
    int par = step & 1;
    opt_item *items = st->opt_items[par];
    items[L] = (opt_item){st, -1, -1, st->k[par], NULL};
    items[L + 1] = (opt_item){st, -2, -1, st->k[par], NULL};
    nb_lane_run(st->optim, "adamw embeddings", NB_SPAN_OPTIM, step, work_adamw_resident, &items[L]);
    nb_lane_wait(st->h2d, nb_lane_mark(st->optim));
    nb_lane_run(st->h2d, "h2d embeddings", NB_SPAN_H2D, step, work_glob_h2d, &items[L]);
    st->emb_ready = mark(st->h2d);
    /* the layers' updates run when the next forward loads them, each writing its compute copy
     * straight into its up slab; the head's after them (upload_head) */
    for (int l = 0; l < L && st->r->o.grad_clip > 0; l++) {
        if (nb_stream_on_gpu(st, l)) { /* the device layers' on the device */
            st->gpending[l] = 1;
            st->gpend_step = step;
            continue;
        }
        items[l] = (opt_item){st, l, -1, st->k[par], NULL};
        st->pending[l] = &items[l];
    }
    st->head_item = &items[L + 1];
    /* the step ends with its loss and norm; the layers' updates run on while the next step's
     * forward starts (each upload waits for its own layer) */
    nb_lane_wait(c, st->norm_done.m);
    for (int k = 0; k < st->nslab; k++) st->up_free[k].set = st->down_free[k].set = 0;
    return nb_lane_mark(c);
}

float nb_stream_grad_norm(const nb_stream *st) { return (float)sqrt(st->sumsq); }

/* The loads of the last step: L in the forward, then those the backward could not reuse from a
 * slot (the recompute's loads serve the backward of the same block). */
void nb_stream_report(const nb_stream *st) {
    int L = st->sl.layers;
    double lb = (double)st->layer_numel, up = (double)st->nloads * lb * (double)es(st) + (double)st->glob_numel * (double)es(st);
    double down = st->sl.frozen ? 0.0 : ((double)(L - st->nglayer) * lb + (double)st->glob_numel) * sizeof(float);
    if (st->sl.frozen) up -= (double)st->glob_numel * (double)es(st); /* LoRA: the stages stay, frozen */
    char a[32], b[32];
    int streamed = L - st->nglayer;
    int cpu = st->r->be->device == NB_DEV_CPU; /* the same copies, but no bus: memory to memory */
    fprintf(stderr, "%s per step: %d layer uploads for %d streamed layers (%.2f each), %s up, %s down%s\n",
            cpu ? "copies     " : "pcie       ", st->nloads, streamed, streamed ? (double)st->nloads / streamed : 0.0,
            nb_fmt_bytes(a, 32, up), nb_fmt_bytes(b, 32, down), cpu ? " (the CPU backend: host memory to host memory)" : "");
}

/* Waits for the optimizer and the resident part's upload (evaluation reads both, checkpoints and
 * the end read the host master). */
void nb_stream_quiesce(nb_stream *st) {
    upload_head(st, -1);
    for (int l = 0; l < st->sl.layers && st->gpending; l++)
        if (st->gpending[l]) gpu_update(st, l, st->gpend_step, -1);
    if (st->gdirty) {
        nb_lane_run(st->r->compute, "device layers down", NB_SPAN_OTHER, -1, work_gpu_download, st);
        nb_mark_wait_host(nb_lane_mark(st->r->compute));
        st->gdirty = 0;
    }
    nb_mark_wait_host(nb_lane_mark(st->optim));
    if (st->emb_ready.set) nb_mark_wait_host(st->emb_ready.m);
    if (st->final_ready.set) nb_mark_wait_host(st->final_ready.m);
}

/* Forward-only use (evaluation): layer l's weights into slot 0, in order on ctx. */
static const void *fetch_layer(void *self, nb_ctx ctx, int l) {
    nb_stream *st = self;
    if (nb_stream_on_gpu(st, l)) return gw_of(st, l); /* up to date: quiesce ran the pending update */
    const void *src = st->h_base ? base_of(st, l) : st->h_up[0]; /* LoRA: the frozen base in place */
    if (!st->h_base) stage_w(st, st->h_up[0], st->sl.layer_offset[l], st->layer_numel);
    st->r->be->to_backend(ctx, st->d_wslot[0], src, st->layer_numel * es(st));
    /* every layer is staged through h_up[0]: the copy must have read it before the next call
     * overwrites it (to_host returns when ctx's work is done; without this wait a CUDA
     * evaluation sometimes ran a layer with the next layer's weights) */
    uint8_t done;
    st->r->be->to_host(ctx, &done, st->d_wslot[0], 1);
    st->wslot_layer[0] = -1;
    return st->d_wslot[0];
}

void nb_stream_upload(nb_stream *st) { nb_run_on_compute(st->r, "upload state", work_upload, st); }
