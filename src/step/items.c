/* The step contract's shared mechanics (step.h): item lists, gradient buckets (summed over
 * micro-batches and all-reduced as the backward completes them, whichever lane runs the item),
 * and the run's memory and compute-lane helpers that families and schedules call. */
#include "step/step.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "core.h"
#include "host.h"

void nb_items_add(nb_items *l, const char *name, nb_span_kind kind, nb_task_fn fn, void *arg) {
    nb_items_add_bucket(l, name, kind, fn, arg, -1);
}

void nb_items_add_bucket(nb_items *l, const char *name, nb_span_kind kind, nb_task_fn fn, void *arg, int b) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 8;
        l->v = realloc(l->v, (size_t)l->cap * sizeof *l->v);
        NB_CHECK(l->v != NULL, NULL, "out of memory for the step's work items");
    }
    nb_item *it = &l->v[l->n++];
    snprintf(it->name, sizeof it->name, "%s", name);
    it->kind = kind, it->fn = fn, it->arg = arg, it->bucket = b, it->layer = -1, it->hook = NULL;
}

void nb_items_mark_layer(nb_items *l, int layer) {
    NB_ASSERT(l->n > 0);
    l->v[l->n - 1].layer = layer;
}

void nb_items_add_hook(nb_items *l, const char *name, nb_hook_fn hook, void *arg) {
    nb_items_add(l, name, NB_SPAN_OTHER, NULL, arg);
    l->v[l->n - 1].hook = hook;
}

void nb_items_free(nb_items *l) {
    free(l->v);
    memset(l, 0, sizeof *l);
}

int nb_run_sharded(nb_run *r) { return r->fam->shard_tensors && r->fam->shard_tensors(r, NULL); }

typedef struct nb_bucket_work {
    nb_run *r;
    int b;
    char name[32];
} nb_bucket_work;

void nb_run_set_buckets(nb_run *r, nb_bucket *buckets, int n) {
    r->buckets = buckets;
    r->nbuckets = n;
    r->bucket_work = nb_calloc((size_t)(n ? n : 1), sizeof *r->bucket_work, "gradient buckets");
    for (int b = 0; b < n; b++) {
        r->bucket_work[b] = (nb_bucket_work){r, b, ""};
        snprintf(r->bucket_work[b].name, sizeof r->bucket_work[b].name, "all-reduce %d", b);
    }
}

/* The step's gradient += this micro-batch's, over the bucket's ranges (micro-batch order: the
 * bits of ranks whose gradients are summed in rank order). */
static void work_bucket_add(void *arg, const nb_task_ctx *ctx) {
    nb_bucket_work *w = arg;
    const nb_bucket *b = &w->r->buckets[w->b];
    for (int k = 0; k < b->nr; k++) w->r->be->add_f32(ctx, w->r->grad_sum + b->off[k], w->r->grad_micro + b->off[k], b->n[k]);
}

static void bucket_done(nb_run *r, nb_lane *lane, int b, int step) {
    /* a family without a micro-batch slab accumulates in place */
    if (r->micro > 0 && r->grad_micro) nb_lane_run(lane, "accumulate", NB_SPAN_BWD, step, work_bucket_add, &r->bucket_work[b]);
    if (!r->comm || r->micro + 1 < r->nmicro || r->capturing) return;
    const nb_bucket *bk = &r->buckets[b];
    nb_comm_wait(r->comm, nb_lane_mark(lane));
    for (int k = 0; k < bk->nr; k++)
        r->reduced = nb_comm_all_reduce(r->comm, r->grad_sum + bk->off[k], r->grad_sum + bk->off[k], bk->n[k], NB_COMM_F32,
                                        r->bucket_work[b].name);
    r->reduced_set = 1;
}

void nb_run_reduce_buckets(nb_run *r) {
    nb_comm_wait(r->comm, nb_lane_mark(r->compute));
    for (int b = 0; b < r->nbuckets; b++)
        for (int k = 0; k < r->buckets[b].nr; k++)
            r->reduced = nb_comm_all_reduce(r->comm, r->grad_sum + r->buckets[b].off[k], r->grad_sum + r->buckets[b].off[k],
                                            r->buckets[b].n[k], NB_COMM_F32, r->bucket_work[b].name);
    r->reduced_set = 1;
}

void nb_items_run(nb_run *r, const nb_items *l, nb_lane *lane, int step) {
    for (int i = 0; i < l->n; i++) {
        if (l->v[i].hook) {
            NB_ASSERT(!r->capturing);
            l->v[i].hook(r, lane, step, l->v[i].arg);
            continue;
        }
        nb_lane_run(lane, l->v[i].name, l->v[i].kind, step, l->v[i].fn, l->v[i].arg);
        if (l->v[i].bucket >= 0 && (r->micro > 0 || r->comm)) bucket_done(r, lane, l->v[i].bucket, step);
    }
}

/* ---------------------------------------------------------------- the run's memory and lanes */

void nb_run_on_compute(nb_run *r, const char *name, nb_task_fn fn, void *arg) {
    nb_lane_run(r->compute, name, NB_SPAN_OTHER, -1, fn, arg);
    nb_mark_wait_host(nb_lane_mark(r->compute));
}

static void work_zero_dev(void *arg, const nb_task_ctx *ctx) {
    nb_run *r = arg;
    r->be->zero(ctx, r->dev.base, r->dev.planned);
}

size_t nb_run_host_bytes(const nb_run *r) {
    size_t h = r->host.planned + r->pinned.planned + r->sched_pinned_bytes;
    return r->be->device == NB_DEV_CPU ? h + r->dev.planned + r->sched_dev_bytes : h;
}

size_t nb_run_dev_bytes(const nb_run *r) { return r->be->device == NB_DEV_CPU ? 0 : r->dev.planned + r->sched_dev_bytes; }

/* The whole host plan against the host, before anything is allocated: never an OOM kill halfway. */
static void check_host(const nb_run *r, const char *hint) {
    size_t need = nb_run_host_bytes(r) + r->mem.setup, have = r->o.host_mem_limit ? (size_t)r->o.host_mem_limit : nb_host_mem_available();
    char a[32], b[32], c[64] = "", h[512];
    snprintf(h, sizeof h, "%s; `nobubble plan` shows what fits", hint);
    if (r->mem.setup) {
        char s[32];
        snprintf(c, sizeof c, " (%s of it only while the base loads)", nb_fmt_bytes(s, 32, (double)r->mem.setup));
    }
    if (have && need > have)
        nb_fail(h, "the plan needs %s of host memory%s but %s is available%s", nb_fmt_bytes(a, 32, (double)need), c,
                nb_fmt_bytes(b, 32, (double)have), r->o.host_mem_limit ? " (--host-mem-limit)" : "");
}

void nb_run_alloc_arenas(nb_run *r, const char *hint) {
    char need[32], have[32];
    if (r->dry) return; /* nobubble plan: the plan is what it wants */
    check_host(r, hint);
    /* the device check comes first, before any allocation; --gpu-mem-limit emulates a smaller GPU */
    if (r->be->device != NB_DEV_CPU && r->dev.budget && r->dev.planned > r->dev.budget)
        nb_fail(hint, "the plan needs %s of GPU memory but %s is available%s", nb_fmt_bytes(need, 32, (double)r->dev.planned),
                nb_fmt_bytes(have, 32, (double)r->dev.budget), r->o.gpu_mem_limit ? " (--gpu-mem-limit)" : "");
    if (r->host.planned && !r->host.base) nb_arena_alloc(&r->host, hint);
    if (r->pinned.planned && !r->pinned.base) nb_arena_alloc(&r->pinned, hint);
    if (r->dev.planned && !r->dev.base) {
        nb_arena_alloc(&r->dev, hint);
        /* device memory starts as whatever was there: zero it, so padding and unused rows are 0 */
        if (r->be->device != NB_DEV_CPU) nb_run_on_compute(r, "zero device memory", work_zero_dev, r);
    }
}

int nb_run_nonfinite(nb_run *r, const float *p, size_t n) {
    if (r->be->device == NB_DEV_CPU) {
        for (size_t i = 0; i < n; i++)
            if (!isfinite(p[i])) return 1;
        return 0;
    }
    enum { CHUNK = 1 << 20 };
    float *buf = nb_malloc(CHUNK * sizeof(float), "finiteness check");
    int bad = 0;
    nb_task_ctx ctx = {r->compute, NULL, r->backend};
    for (size_t at = 0; at < n && !bad; at += CHUNK) {
        size_t k = n - at < CHUNK ? n - at : CHUNK;
        r->be->to_host(&ctx, buf, p + at, k * sizeof(float));
        for (size_t i = 0; i < k; i++)
            if (!isfinite(buf[i])) bad = 1;
    }
    free(buf);
    return bad;
}
