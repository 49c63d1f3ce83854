/* The stream schedule's table: its options, its memory plan (the model state in host memory,
 * what fits on the GPU resolved for the "-1: as many as fit" options), and its entries. The
 * step itself is in stream.c. */
#include <stdio.h>
#include <string.h>

#include "core.h"
#include "sched/sched.h"
#include "sched/stream.h"

static int applies(const nb_family_i *fam, const char **why) {
    *why = "it streams a transformer's layers through GPU slots; seqctr's tables and dense part stay resident";
    return fam == &nb_family_transformer;
}

/* The ranges hold whatever the schedule: a state.json with --stream-slots 0 is damaged. */
static void slot_ranges(const nb_train_opts *o) {
    NB_CHECK(o->stream_slots >= 1 || o->stream_slots == -1, "pass --stream-slots N >= 1, or -1 for as many as fit",
             "--stream-slots %d", o->stream_slots);
    NB_CHECK(o->pinned_slabs >= 1 && o->pinned_slabs <= NB_STREAM_MAX_SLOTS, "pass --pinned-slabs between 1 and 4",
             "--pinned-slabs %d", o->pinned_slabs);
}

static void stream_check(const nb_train_opts *o) {
    NB_CHECK(!o->detach[0], "drop --detach with --schedule stream", "stream does not split the model yet");
    NB_CHECK(o->world == 1 && o->grad_accum == 1, "run --schedule stream on one rank without --grad-accum",
             "stream does not accumulate micro-batches or reduce over ranks yet");
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

/* The stream's device budget for the "-1: as many as fit" options: the GPU's free memory (or
 * --gpu-mem-limit) less a margin for the libraries' workspaces. */
static size_t stream_budget(const nb_tf_train *tr) {
    size_t budget = tr->o.gpu_mem_limit ? (size_t)tr->o.gpu_mem_limit : tr->be->mem_available();
    size_t margin = budget / 32 > ((size_t)2 << 30) ? budget / 32 : (size_t)2 << 30;
    return budget > margin ? budget - margin : 0;
}

/* Device bytes of the stream's fixed part (resident part, wslots weight slots, glayers layers on
 * the device, the tokens). */
static size_t stream_fixed(const nb_tf_train *tr, int wslots, int glayers) {
    return nb_stream_device_need(&tr->model, wslots, glayers, nb_tf_es(tr)) + 2 * (size_t)tr->o.batch * tr->o.seq * sizeof(int32_t);
}

/* Device bytes the stream's budget has left (negative: over) with wslots weight slots, glayers
 * device layers and keep layers' activations kept whole. */
static long long stream_room(const nb_tf_train *tr, int wslots, int glayers, int keep) {
    return (long long)stream_budget(tr) - (long long)(stream_fixed(tr, wslots, glayers) + nb_tf_acts_plan_bytes(tr, keep));
}

/* --keep-layers: how many of the last layers keep every activation through the step instead of
 * being recomputed. -1 takes the most that fit beside the rest of the stream's device plan (with
 * two weight slots and no device layers where those are -1: activations come first, they save
 * compute). */
static int resolve_keep(const nb_tf_train *tr) {
    const nb_train_opts *o = &tr->o;
    int L = tr->model.cfg.layers, K = o->ckpt_interval;
    if (K <= 0) return 0;
    if (o->keep_layers >= 0) return o->keep_layers < L ? o->keep_layers : L;
    if (!nb_tf_on_device(tr)) return L;
    int wslots = o->stream_slots > 0 ? o->stream_slots : 2, glayers = o->gpu_layers > 0 ? o->gpu_layers : 0;
    for (int keep = L; keep > 0; keep--)
        if (stream_room(tr, wslots, glayers, keep) >= 0) return keep;
    return 0;
}

/* Weight slots that fit beside the rest with glayers device layers: the asked number, or with -1
 * two plus one for each further layer whose weights fit (the last layers of the forward then stay
 * on the GPU for their backward instead of crossing PCIe again); at most one per streamed layer. */
static int fit_wslots(const nb_tf_train *tr, int glayers) {
    int host_layers = tr->model.cfg.layers - glayers, most = host_layers > 1 ? host_layers : 1;
    if (tr->o.stream_slots > 0) return tr->o.stream_slots < most ? tr->o.stream_slots : most;
    if (!nb_tf_on_device(tr) || most <= 2) return most;
    long long room = stream_room(tr, 2, glayers, tr->keep);
    size_t extra = room > 0 ? (size_t)room / nb_stream_wslot_bytes(&tr->model, nb_tf_es(tr)) : 0;
    return extra >= (size_t)(most - 2) ? most : 2 + (int)extra;
}

/* --gpu-layers: N layers (spread over the model, stream.c) keep their fp32 weights, AdamW moments
 * and gradients on the GPU and update there (the host's bandwidth paces the streamed layers'
 * update; the GPU's is ~30x larger). -1 takes the most that fit beside the activations, leaving
 * room for a weight slot per streamed layer when --stream-slots is -1 too. The CPU backend has no
 * device memory to spare: -1 means none there. */
static int resolve_glayers(const nb_tf_train *tr) {
    const nb_train_opts *o = &tr->o;
    int L = tr->model.cfg.layers;
    if (o->gpu_layers >= 0) return o->gpu_layers < L ? o->gpu_layers : L;
    if (!nb_tf_on_device(tr)) return 0;
    for (int r = L; r > 0; r--) {
        int streamed = L - r > 1 ? L - r : 1;
        int slots = o->stream_slots > 0 && o->stream_slots < streamed ? o->stream_slots : streamed;
        if (stream_room(tr, slots, r, tr->keep) >= 0) return r;
    }
    return 0;
}

static void print_plan(const nb_tf_train *tr, size_t slab, size_t acts) {
    const nb_tf_model *m = &tr->model;
    int K = tr->o.ckpt_interval;
    char kept[128], b[6][32];
    if (K > 0 && tr->keep >= m->cfg.layers)
        snprintf(kept, sizeof kept, "all kept (--keep-layers %d)", tr->keep);
    else if (K > 0 && tr->keep > 0)
        snprintf(kept, sizeof kept, "%s%d layer%s kept whole, below them inputs kept every %d layer%s, the rest recomputed",
                 tr->o.keep_layers < 0 ? "as many as fit: " : "", tr->keep, tr->keep == 1 ? "" : "s", K, K == 1 ? "" : "s");
    else if (K > 0)
        snprintf(kept, sizeof kept, "layer inputs kept every %d layer%s, the rest recomputed", K, K == 1 ? "" : "s");
    else
        snprintf(kept, sizeof kept, "all kept");
    nb_log(1, "memory      host: params %s + adamw %s + grads %s; %s: activations %s (B=%d, T=%d), %s\n",
           nb_fmt_bytes(b[0], 32, (double)slab), nb_fmt_bytes(b[1], 32, 2.0 * slab), nb_fmt_bytes(b[2], 32, (double)slab),
           nb_tf_on_device(tr) ? "device" : "host", nb_fmt_bytes(b[3], 32, (double)acts), tr->o.batch, tr->o.seq, kept);
    if (4.0 * slab > 16e9)
        nb_log(1, "setup       allocating %s of host state and initializing the weights (seconds to minutes)\n",
               nb_fmt_bytes(b[4], 32, 4.0 * slab));
    NB_CHECK(!tr->o.host_mem_limit || 4.0 * slab <= (double)tr->o.host_mem_limit, "pick a smaller --model, or raise --host-mem-limit",
             "the host state needs %s but --host-mem-limit is %s", nb_fmt_bytes(b[4], 32, 4.0 * slab),
             nb_fmt_bytes(b[5], 32, (double)tr->o.host_mem_limit));
}

/* Host: the fp32 master, moments and gradients (16 bytes per parameter); device (or host on the
 * CPU backend): activations, tokens, step scalars. The slots are the schedule's own (init). */
static void stream_plan(nb_run *r) {
    nb_tf_train *tr = nb_tf_of(r);
    tr->keep = resolve_keep(tr);
    tr->glayers = resolve_glayers(tr);
    tr->wslots = fit_wslots(tr, tr->glayers);
    size_t slab = tr->model.total * sizeof(float);
    size_t acts = nb_tf_acts_plan_bytes(tr, tr->keep) + nb_tf_seg_bytes(tr);
    size_t toks = 2 * (size_t)tr->o.batch * tr->o.seq * sizeof(int32_t);
    print_plan(tr, slab, acts);
    int devb = nb_tf_on_device(tr);
    nb_arena *host = &r->host, *dev = &r->dev;
    size_t hp = nb_arena_plan_bytes(host, slab), hm = nb_arena_plan_bytes(host, slab), hv = nb_arena_plan_bytes(host, slab);
    size_t hg = nb_arena_plan_bytes(host, slab), ha = devb ? 0 : nb_arena_plan_bytes(host, acts);
    size_t dac = 0, dt = 0, ds = 0;
    if (devb) dac = nb_arena_plan_bytes(dev, acts), dt = nb_arena_plan_bytes(dev, toks), ds = nb_arena_plan_bytes(dev, sizeof(nb_step_scalars));
    nb_run_alloc_arenas(r, "pick a smaller --model (the stream schedule keeps 16 bytes per parameter in host memory)");
    tr->params = (float *)(host->base + hp);
    tr->m = (float *)(host->base + hm);
    tr->v = (float *)(host->base + hv);
    /* the arena starts zeroed, so alignment gaps stay zero: the global norm sums them */
    tr->h_grads = (float *)(host->base + hg);
    if (!devb) {
        tr->d_acts = host->base + ha;
        tr->d_step = tr->h_step = &tr->cpu_step;
        return;
    }
    tr->d_acts = dev->base + dac;
    tr->d_tokens = (int32_t *)(dev->base + dt);
    tr->d_step = (nb_step_scalars *)(dev->base + ds);
    tr->h_step = tr->be->host_alloc(sizeof(nb_step_scalars), "step scalars");
    tr->h_tokens = tr->be->host_alloc(toks, "token staging");
}

static void stream_init(nb_run *r) { nb_stream_init(nb_tf_of(r), r->dev.planned); }
static nb_mark stream_step(nb_run *r, int step) { return nb_stream_step(nb_tf_of(r), step); }
static void stream_drain(nb_run *r) { nb_stream_quiesce(nb_tf_of(r)); }
static void stream_report(nb_run *r) { nb_stream_report(nb_tf_of(r)); }
static void stream_free(nb_run *r) {
    if (r->fs) nb_stream_free(nb_tf_of(r));
}

const nb_sched_i nb_sched_stream = {
    .name = "stream",
    .summary = "MegaTrain: a transformer's state in host memory, layers streamed through GPU slots, AdamW on the host",
    .applies = applies,
    .check = stream_check,
    .reject = stream_reject,
    .plan = stream_plan,
    .init = stream_init,
    .step = stream_step,
    .drain = stream_drain,
    .report = stream_report,
    .free = stream_free,
    .settles = 0,
    .graphs = 0,
    .own_optimizer = 1,
};
