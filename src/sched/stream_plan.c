/* The stream schedule's table: its options, its memory plan (the model state in host memory,
 * what fits on the GPU resolved for the "-1: as many as fit" options), and its entries. The
 * step itself is in stream.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "sched/sched.h"
#include "sched/stream.h"

static int applies(const nb_family_i *fam, const char **why) {
    *why = "it streams a stack of alike layers through GPU slots (the layers capability: transformers); "
           "seqctr's tables and dense part stay resident";
    return fam->layers != NULL;
}

/* The ranges hold whatever the schedule: a state.json with --stream-slots 0 is damaged. */
static void slot_ranges(const nb_train_opts *o) {
    NB_CHECK(o->stream_slots >= 1 || o->stream_slots == -1, "pass --stream-slots N >= 1, or -1 for as many as fit",
             "--stream-slots %d", o->stream_slots);
    NB_CHECK(o->pinned_slabs >= 1 && o->pinned_slabs <= NB_STREAM_MAX_SLOTS, "pass --pinned-slabs between 1 and 4",
             "--pinned-slabs %d", o->pinned_slabs);
}

static const char *stream_refuses(const nb_train_opts *o, const char **hint) {
    if (o->detach[0]) {
        *hint = "drop --detach with --schedule stream";
        return "it does not split the model yet (--detach)";
    }
    if (o->world != 1 || o->grad_accum != 1) {
        *hint = "run --schedule stream on one rank without --grad-accum";
        return "it does not accumulate micro-batches or reduce over ranks yet";
    }
    return NULL;
}

static void stream_check(const nb_train_opts *o) {
    NB_CHECK(o->ckpt_interval >= 0 && o->ckpt_interval <= NB_TF_MAX_CKPT_INTERVAL,
             "pass --ckpt-interval between 0 (keep all) and 64", "--ckpt-interval %d", o->ckpt_interval);
    NB_CHECK(o->keep_layers >= -1, "pass --keep-layers N >= 0, or -1 for as many as fit", "--keep-layers %d", o->keep_layers);
    NB_CHECK(o->keep_layers == 0 || o->ckpt_interval > 0, "use --keep-layers with --schedule stream --ckpt-interval K",
             "--keep-layers chooses which layers skip recomputation");
    slot_ranges(o);
    NB_CHECK(o->gpu_layers >= -1, "pass --gpu-layers N >= 0, or -1 for as many as fit", "--gpu-layers %d", o->gpu_layers);
}

/* Other schedules: the stream's own options must stay unset. */
static void stream_reject(const nb_train_opts *o) {
    slot_ranges(o);
    NB_CHECK(o->ckpt_interval == 0, "use --ckpt-interval with --schedule stream",
             "--ckpt-interval recomputes activations in the stream schedule only");
    NB_CHECK(o->keep_layers == 0, "use --keep-layers with --schedule stream --ckpt-interval K",
             "--keep-layers chooses which layers skip recomputation");
    NB_CHECK(o->gpu_layers == 0, "use --gpu-layers with --schedule stream",
             "--gpu-layers chooses which streamed layers stay on the GPU");
}

static int on_device(const nb_stream *st) { return st->r->be->device != NB_DEV_CPU; }

/* The stream's device budget for the "-1: as many as fit" options: the GPU's free memory (or
 * --gpu-mem-limit) less a margin for the libraries' workspaces. */
static size_t stream_budget(const nb_stream *st) {
    size_t budget = st->r->o.gpu_mem_limit ? (size_t)st->r->o.gpu_mem_limit : st->r->be->mem_available();
    size_t margin = budget / 32 > ((size_t)2 << 30) ? budget / 32 : (size_t)2 << 30;
    return budget > margin ? budget - margin : 0;
}

/* Device bytes of the stream's fixed part (resident part, wslots weight slots, glayers layers on
 * the device, the tokens). */
static size_t stream_fixed(const nb_stream *st, int wslots, int glayers) {
    size_t adapters = on_device(st) ? nb_stream_trained_dev_bytes(&st->sl) : 0; /* LoRA: resident, the family's */
    return nb_stream_device_need(&st->sl, wslots, glayers) + st->li->io_bytes(st->r) + adapters;
}

/* Device bytes the stream's budget has left (negative: over) with wslots weight slots, glayers
 * device layers and keep layers' activations kept whole. */
static long long stream_room(const nb_stream *st, int wslots, int glayers, int keep) {
    size_t acts = st->li->acts_bytes(st->r, st->r->o.ckpt_interval, keep);
    return (long long)stream_budget(st) - (long long)(stream_fixed(st, wslots, glayers) + acts);
}

/* --keep-layers: how many of the last layers keep every activation through the step instead of
 * being recomputed. -1 takes the most that fit beside the rest of the stream's device plan (with
 * two weight slots and no device layers where those are -1: activations come first, they save
 * compute). */
static int resolve_keep(const nb_stream *st) {
    const nb_train_opts *o = &st->r->o;
    int L = st->sl.layers, K = o->ckpt_interval;
    if (K <= 0) return 0;
    if (o->keep_layers >= 0) return o->keep_layers < L ? o->keep_layers : L;
    if (!on_device(st)) return L;
    int wslots = o->stream_slots > 0 ? o->stream_slots : 2, glayers = o->gpu_layers > 0 ? o->gpu_layers : 0;
    for (int keep = L; keep > 0; keep--)
        if (stream_room(st, wslots, glayers, keep) >= 0) return keep;
    return 0;
}

/* Weight slots that fit beside the rest with glayers device layers: the asked number, or with -1
 * two plus one for each further layer whose weights fit (the last layers of the forward then stay
 * on the GPU for their backward instead of crossing PCIe again); at most one per streamed layer. */
static int fit_wslots(const nb_stream *st, int glayers) {
    const nb_train_opts *o = &st->r->o;
    int host_layers = st->sl.layers - glayers, most = host_layers > 1 ? host_layers : 1;
    if (o->stream_slots > 0) return o->stream_slots < most ? o->stream_slots : most;
    if (!on_device(st) || most <= 2) return most;
    long long room = stream_room(st, 2, glayers, st->keep);
    size_t extra = room > 0 ? (size_t)room / nb_stream_wslot_bytes(&st->sl) : 0;
    return extra >= (size_t)(most - 2) ? most : 2 + (int)extra;
}

/* --gpu-layers: N layers (spread over the model, stream.c) keep their fp32 weights, AdamW moments
 * and gradients on the GPU and update there (the host's bandwidth paces the streamed layers'
 * update; the GPU's is ~30x larger). -1 takes the most that fit beside the activations, leaving
 * room for a weight slot per streamed layer when --stream-slots is -1 too. The CPU backend has no
 * device memory to spare: -1 means none there. */
static int resolve_glayers(const nb_stream *st) {
    const nb_train_opts *o = &st->r->o;
    int L = st->sl.layers;
    if (o->gpu_layers >= 0) return o->gpu_layers < L ? o->gpu_layers : L;
    if (!on_device(st)) return 0;
    for (int r = L; r > 0; r--) {
        int streamed = L - r > 1 ? L - r : 1;
        int slots = o->stream_slots > 0 && o->stream_slots < streamed ? o->stream_slots : streamed;
        if (stream_room(st, slots, r, st->keep) >= 0) return r;
    }
    return 0;
}

/* What the recompute setting keeps of the activations, for the plan's line. */
static void kept_text(const nb_stream *st, char *kept, size_t cap) {
    const nb_train_opts *o = &st->r->o;
    int K = o->ckpt_interval;
    if (K > 0 && st->keep >= st->sl.layers)
        snprintf(kept, cap, "all kept (--keep-layers %d)", st->keep);
    else if (K > 0 && st->keep > 0)
        snprintf(kept, cap, "%s%d layer%s kept whole, below them inputs kept every %d layer%s, the rest recomputed",
                 o->keep_layers < 0 ? "as many as fit: " : "", st->keep, st->keep == 1 ? "" : "s", K, K == 1 ? "" : "s");
    else if (K > 0)
        snprintf(kept, cap, "layer inputs kept every %d layer%s, the rest recomputed", K, K == 1 ? "" : "s");
    else
        snprintf(kept, cap, "all kept");
}

static void print_plan(const nb_stream *st, const nb_stream_host *h, size_t acts) {
    const nb_train_opts *o = &st->r->o;
    char kept[128], b[6][32];
    kept_text(st, kept, sizeof kept);
    if (st->sl.frozen) {
        nb_log(1, "memory      LoRA: host: frozen base of %d streamed layers %s (pinned) + adapters %s (master, 2 moments); "
                  "%s: base of the stages and %d device layers + adapters, activations %s (B=%d, T=%d), %s\n",
               st->sl.layers - st->glayers,
               nb_fmt_bytes(b[0], 32, (double)(nb_stream_base_host_numel(&st->sl, st->glayers) * st->sl.elem)),
               nb_fmt_bytes(b[1], 32, (double)(h->master + h->moments)), on_device(st) ? "device" : "host", st->glayers,
               nb_fmt_bytes(b[3], 32, (double)acts), o->batch, o->seq, kept);
        return;
    }
    nb_log(1, "memory      host: params %s + adamw %s + grads %s (%.2f bytes/param%s%s%s%s); %s: activations %s (B=%d, T=%d), %s\n",
           nb_fmt_bytes(b[0], 32, (double)h->master), nb_fmt_bytes(b[1], 32, (double)h->moments),
           nb_fmt_bytes(b[2], 32, (double)h->grads),
           (double)(h->master + h->moments + h->grads) / (double)(st->sl.total ? st->sl.total : 1),
           h->glayers_saved ? "; --gpu-layers leaves out " : "", h->glayers_saved ? nb_fmt_bytes(b[5], 32, (double)h->glayers_saved) : "",
           h->noclip_saved ? "; --grad-clip 0 leaves out " : "", h->noclip_saved ? nb_fmt_bytes(b[4], 32, (double)h->noclip_saved) : "",
           on_device(st) ? "device" : "host", nb_fmt_bytes(b[3], 32, (double)acts), o->batch, o->seq, kept);
    double state = (double)(h->master + h->moments + h->grads);
    if (state > 16e9)
        nb_log(1, "setup       allocating %s of host state and initializing the weights (seconds to minutes)\n",
               nb_fmt_bytes(b[4], 32, state));
}

/* The plan term by term (r->mem) and what the schedule allocates itself at init (slots, staging). */
static void record_plan(const nb_stream *st, const nb_stream_host *h, size_t acts) {
    nb_run *r = st->r;
    const nb_layer_slab *s = &st->sl;
    size_t lw = s->layer_numel, gw = s->in_n + s->out_n, e = s->elem, G = (size_t)st->glayers;
    size_t dev_need = nb_stream_device_need(s, st->wslots, st->glayers);
    nb_mem_plan *m = &r->mem;
    m->glayers = st->glayers, m->wslots = st->wslots, m->keep = st->keep;
    if (s->frozen) { /* LoRA: the base (2 bytes/param in bf16) where it lives; the adapters' full state */
        size_t a = s->trained * sizeof(float), aw = on_device(st) && e != sizeof(float) ? s->trained * e : 0;
        size_t hbase = nb_stream_base_host_numel(s, st->glayers) * e;
        m->host = (nb_mem_side){.weights = hbase + a, .moments = 2 * a};
        nb_mem_side *d = on_device(st) ? &m->dev : &m->host;
        if (on_device(st)) d->weights = (gw + G * lw) * e + a + aw, d->moments = 2 * a;
        d->grads = a, d->acts = acts, d->slots = (size_t)st->wslots * lw * e, d->other = st->li->io_bytes(r);
        m->saved = "", m->params = s->total;
        /* at start the base comes one group at a time: its fp32 buffer, and the cast of a group
         * bound for the device (nb_tf_base_by_groups, the stream's base sink) */
        size_t most = lw > s->in_n ? lw : s->in_n;
        most = most > s->out_n ? most : s->out_n;
        m->setup = most * (sizeof(float) + (on_device(st) ? e : 0));
        r->sched_dev_bytes = dev_need;
        r->sched_pinned_bytes = nb_stream_pinned_need(s, r->o.pinned_slabs, st->glayers);
        return;
    }
    m->host = (nb_mem_side){.weights = h->master, .grads = h->grads, .moments = h->moments};
    size_t slots = (size_t)st->wslots * lw * e + (size_t)nb_stream_gradient_slots(st->wslots) * lw * sizeof(float);
    size_t dw = gw * e + G * lw * (sizeof(float) + (e == sizeof(float) ? 0 : e)), dm = G * lw * 2 * sizeof(float);
    size_t dg = gw * sizeof(float) + G * lw * sizeof(float);
    m->dev = (nb_mem_side){.weights = dw, .grads = dg, .moments = dm, .acts = acts, .slots = slots,
                           .other = dev_need - slots - dw - dg - dm + st->li->io_bytes(r)};
    m->host.slots = nb_stream_pinned_need(s, r->o.pinned_slabs, st->glayers);
    snprintf(m->saved_buf, sizeof m->saved_buf, "%s%s%s", h->glayers_saved ? "--gpu-layers: device layers' moments and gradients" : "",
             h->glayers_saved && h->noclip_saved ? "; " : "", h->noclip_saved ? "--grad-clip 0: the layers' fp32 gradient slab" : "");
    m->saved = m->saved_buf;
    r->sched_dev_bytes = dev_need;
    r->sched_pinned_bytes = m->host.slots;
}

/* Host: the fp32 master of every layer, the moments and gradients of all but the device layers
 * (nb_stream_host_need); device (or host on the CPU backend): activations, tokens, step scalars.
 * The slots are the schedule's own (init). The family reserves its part (its master and moments;
 * its activations and per-step buffers) through its layers capability, this schedule the host
 * gradient slab between them. LoRA (a frozen slab): the family reserves its adapters resident (as
 * under plain) and trains them with its own items (keeps_state off); the schedule's own memory is
 * the frozen base (pinned host, slots, device layers: nb_stream_device_need, nb_stream_pinned_need). */
static void stream_plan(nb_run *r) {
    nb_stream *st = nb_calloc(1, sizeof *st, "stream schedule");
    r->ss = st;
    st->r = r;
    st->li = r->fam->layers;
    st->li->slab(r, &st->sl);
    st->keep = resolve_keep(st);
    st->glayers = resolve_glayers(st);
    st->wslots = fit_wslots(st, st->glayers);
    int K = r->o.ckpt_interval;
    /* LoRA: the family trains its resident adapters with its own AdamW item (after the step, as
     * under plain); the schedule keeps and streams the frozen base only */
    if (st->sl.frozen) r->traits.keeps_state = 0;
    st->noclip = r->o.grad_clip <= 0 && !st->sl.frozen;
    size_t mom = nb_stream_moment_numel(&st->sl, st->glayers), acts = st->li->acts_bytes(r, K, st->keep);
    nb_stream_host h;
    nb_stream_host_need(&st->sl, st->glayers, st->noclip, &h);
    print_plan(st, &h, acts);
    st->li->reserve_state(r, mom);
    size_t grads = st->sl.frozen ? 0 : nb_stream_grads_numel(&st->sl, st->glayers, st->noclip) * sizeof(float);
    st->hg = grads ? nb_arena_plan_bytes(&r->host, grads) : 0;
    size_t edges = nb_stream_edges_numel(&st->sl, st->noclip) * sizeof(float);
    st->he = edges ? nb_arena_plan_bytes(&r->host, edges) : 0;
    st->li->reserve_work(r, K, st->keep);
    record_plan(st, &h, acts);
    if (r->dry) return;
    nb_run_alloc_arenas(r, "pass --gpu-layers N (their moments and gradients stay on the GPU), --grad-clip 0 (no host "
                           "gradient slab), lower --batch or --seq, or pick a smaller --model");
    /* the arena starts zeroed, so alignment gaps stay zero: the global norm sums them */
    st->h_grads = grads ? (float *)(r->host.base + st->hg) : NULL;
    st->h_edges = edges ? (float *)(r->host.base + st->he) : NULL;
}

static nb_stream *S(nb_run *r) { return r->ss; }
static void stream_init(nb_run *r) { nb_stream_init(S(r), r->dev.planned); }
static nb_mark stream_step(nb_run *r, int step) { return nb_stream_step(S(r), step); }
static void stream_drain(nb_run *r) { nb_stream_quiesce(S(r)); }
static void stream_report(nb_run *r) { nb_stream_report(S(r)); }
static void stream_upload(nb_run *r) { nb_stream_upload(S(r)); }
static float stream_grad_norm(nb_run *r) { return S(r)->sl.frozen ? r->grad_norm : nb_stream_grad_norm(S(r)); }
static void stream_free(nb_run *r) {
    nb_stream_free(S(r));
    r->ss = NULL;
}

const nb_sched_i nb_sched_stream = {
    .name = "stream",
    .summary = "MegaTrain: a model's state in host memory, layers streamed through GPU slots, AdamW on the host",
    .applies = applies,
    .check = stream_check,
    .refuses = stream_refuses,
    .reject = stream_reject,
    .plan = stream_plan,
    .init = stream_init,
    .step = stream_step,
    .drain = stream_drain,
    .report = stream_report,
    .free = stream_free,
    .upload = stream_upload,
    .grad_norm = stream_grad_norm,
    .traits = {.settles = 0, .graphs = 0, .keeps_state = 1},
};
