/* The stream schedule's state across the two memories: how many bytes each side holds (the
 * plan's and `nobubble plan`'s numbers), and the device layers' moments and gradients, which live
 * on the device only (--gpu-layers): the family reaches their moments through a state map
 * (checkpoints, resume), the global norm gathers the gradient blocks they share with neighbours. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "sched/stream.h"

size_t nb_stream_gnorm_stride(size_t lw) {
    return nb_align_up((lw / NB_SUMSQ_BLOCK + 2) * sizeof(double) + 2 * NB_SUMSQ_BLOCK * sizeof(float), NB_ALIGN);
}


size_t nb_stream_wslot_bytes(const nb_layer_slab *s) { return s->layer_numel * s->elem; }

/* a device layer: master, 2 moments, gradient (fp32), a compute copy unless that is the master,
 * and its norm blocks */
size_t nb_stream_glayer_bytes(const nb_layer_slab *s) {
    size_t lw = s->layer_numel, e = s->elem;
    if (s->frozen) return lw * e; /* LoRA: its frozen base only */
    return lw * (4 * sizeof(float) + (e == sizeof(float) ? 0 : e)) + (lw / NB_SUMSQ_BLOCK + 2) * sizeof(double);
}

int nb_stream_gradient_slots(int wslots) { return wslots < 2 ? wslots : 2; }

/* LoRA: the adapters the family keeps resident where the step runs (master, gradient, moments,
 * and a compute copy in bf16) */
size_t nb_stream_trained_dev_bytes(const nb_layer_slab *s) {
    return s->frozen ? s->trained * (4 * sizeof(float) + (s->elem == sizeof(float) ? 0 : s->elem)) : 0;
}


size_t nb_stream_moment_numel(const nb_layer_slab *s, int glayers) { return s->total - (size_t)glayers * s->layer_numel; }

size_t nb_stream_grads_numel(const nb_layer_slab *s, int glayers, int noclip) {
    return noclip ? s->in_n + s->out_n : nb_stream_moment_numel(s, glayers);
}

size_t nb_stream_edges_numel(const nb_layer_slab *s, int noclip) {
    return noclip ? (size_t)s->layers * 2 * NB_SUMSQ_BLOCK : 0;
}

void nb_stream_host_need(const nb_layer_slab *s, int glayers, int noclip, nb_stream_host *h) {
    if (s->frozen) { /* LoRA: the adapters' fp32 master and moments (the family's); the base is pinned */
        *h = (nb_stream_host){s->trained * sizeof(float), 2 * s->trained * sizeof(float), 0, 0, 0};
        return;
    }
    size_t mom = nb_stream_moment_numel(s, glayers) * sizeof(float);
    h->master = s->total * sizeof(float);
    h->moments = 2 * mom;
    h->grads = (nb_stream_grads_numel(s, glayers, noclip) + nb_stream_edges_numel(s, noclip)) * sizeof(float);
    h->glayers_saved = (size_t)glayers * s->layer_numel * 3 * sizeof(float);
    h->noclip_saved = noclip ? mom - nb_stream_grads_numel(s, glayers, 1) * sizeof(float) : 0;
}

size_t nb_stream_pinned_need(const nb_layer_slab *s, int nslab, int glayers) {
    size_t lw = s->layer_numel, gw = s->in_n + s->out_n;
    if (s->frozen) return nb_stream_base_host_numel(s, glayers) * s->elem; /* uploads read it in place */
    size_t g = glayers ? 2 * sizeof(gpu_opt) + (size_t)glayers * nb_stream_gnorm_stride(lw) : 0;
    return (size_t)nslab * lw * (s->elem + sizeof(float)) + gw * sizeof(float) + g;
}

size_t nb_stream_base_host_numel(const nb_layer_slab *s, int glayers) {
    return (size_t)(s->layers - glayers) * s->layer_numel;
}

size_t nb_stream_device_need(const nb_layer_slab *s, int wslots, int glayers) {
    size_t lw = s->layer_numel, gw = s->in_n + s->out_n, e = s->elem;
    if (s->frozen) /* LoRA: the stages' and device layers' frozen base, the weight slots; no gradient */
        return (gw + (size_t)wslots * lw + (size_t)glayers * lw) * e;
    return gw * (e + 4) + (size_t)wslots * lw * e + (size_t)nb_stream_gradient_slots(wslots) * lw * sizeof(float) +
           (size_t)glayers * nb_stream_glayer_bytes(s) + sizeof(gpu_opt);
}

/* ---- the device layers' moments ---- */

/* One copy of a device layer's moment (which 0: m, 1: v) at slab offset o, n elements. */
typedef struct {
    nb_stream *st;
    int which, up;
    size_t o, n;
    float *h;
} state_job;

static void work_state_copy(void *arg, const nb_task_ctx *ctx) {
    state_job *j = arg;
    nb_stream *st = j->st;
    int l = nb_stream_layer_at(st, j->o);
    NB_ASSERT(l >= 0 && nb_stream_on_gpu(st, l));
    float *d = (j->which ? st->d_gv : st->d_gm) + nb_stream_goff(st, l) + (j->o - st->sl.layer_offset[l]);
    if (j->up)
        st->r->be->to_backend(ctx, d, j->h, j->n * sizeof(float));
    else
        st->r->be->to_host(ctx, j->h, d, j->n * sizeof(float));
}

static void state_fetch(void *self, int which, size_t o, float *dst, size_t n) {
    state_job j = {self, which, 0, o, n, dst};
    nb_run_on_compute(j.st->r, "device moments down", work_state_copy, &j);
}

static void state_store(void *self, int which, size_t o, const float *src, size_t n) {
    state_job j = {self, which, 1, o, n, (float *)src};
    nb_run_on_compute(j.st->r, "device moments up", work_state_copy, &j);
}

static size_t state_host_off(void *self, size_t o) { return nb_stream_host_off(self, o); }

static void work_zero_moments(void *arg, const nb_task_ctx *ctx) {
    nb_stream *st = arg;
    size_t bytes = (size_t)st->nglayer * st->layer_numel * sizeof(float);
    st->r->be->zero(ctx, st->d_gm, bytes);
    st->r->be->zero(ctx, st->d_gv, bytes);
}

/* The family reaches the device layers' moments through the map (checkpoints, resume); they start
 * at zero, as the host's would. */
void nb_stream_bind_state(nb_stream *st) {
    if (!st->nglayer || st->sl.frozen) return;
    nb_run_on_compute(st->r, "zero device moments", work_zero_moments, st);
    st->map = (nb_state_map){st, state_host_off, state_fetch, state_store};
    st->li->bind_state(st->r, &st->map);
}

/* ---- the global norm without their gradients on the host ---- */

/* A layer's gradient elements in the norm blocks it shares with its neighbours: a device layer's
 * came down with its norm blocks, a streamed layer's were kept as it landed (noclip). */
static const float *layer_edges(const nb_stream *st, int l) {
    if (!nb_stream_on_gpu(st, l)) return nb_stream_edges_of(st, l);
    nb_norm_geom g = nb_stream_geom_of(st, l);
    return (const float *)(nb_stream_gnorm_of(st, l) + g.nparts * sizeof(double));
}

/* Gradient element i of the slab: the host slab's, or a layer's edge (the blocks inside a layer
 * whose gradient is not in the host slab are summed already). Alignment gaps are zero. */
static float grad_at(const nb_stream *st, size_t i) {
    const nb_layer_slab *s = &st->sl;
    int in = i >= s->in_off && i < s->in_off + s->in_n, out = i >= s->out_off && i < s->out_off + s->out_n;
    if (in || out) return *nb_stream_grad_of(st, i);
    int l = nb_stream_layer_at(st, i);
    if (l < 0 || i >= s->layer_offset[l] + st->layer_numel) return 0.0f;
    if (!st->noclip && !nb_stream_on_gpu(st, l)) return *nb_stream_grad_of(st, i);
    nb_norm_geom g = nb_stream_geom_of(st, l);
    size_t rel = i - g.o;
    NB_ASSERT(rel < g.head || rel >= g.n - g.tail);
    const float *edges = layer_edges(st, l);
    return rel < g.head ? edges[rel] : edges[g.head + rel - (g.n - g.tail)];
}

/* nb_sumsq_finish over a slab whose device layers (or without clipping, every layer) are not in
 * host memory: the blocks nobody
 * summed yet (those shared by neighbours) are gathered element by element, summed by the same
 * nb_sumsq_block, and every block added in order: plain's bits. */
double nb_stream_sumsq_split(nb_stream *st) {
    const size_t B = NB_SUMSQ_BLOCK, total = st->sl.total, nblk = (total + B - 1) / B;
    float *blk = nb_malloc(B * sizeof(float), "norm block");
    double sum = 0.0;
    for (size_t b = 0; b < nblk; b++) {
        if (!st->norm_have[b]) {
            size_t start = b * B, n = total - start < B ? total - start : B;
            for (size_t i = 0; i < n; i++) blk[i] = grad_at(st, start + i);
            st->norm_part[b] = nb_sumsq_block(blk, n);
        }
        sum += st->norm_part[b];
    }
    free(blk);
    return sum;
}
