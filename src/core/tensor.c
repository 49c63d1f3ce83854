#include "tensor.h"

#include <stdlib.h>
#include <string.h>

#include "core.h"

static const size_t dtype_sizes[NB_DTYPE_COUNT] = {4, 2, 2, 4, 2, 1};
static const char *dtype_names[NB_DTYPE_COUNT] = {"F32", "BF16", "F16", "I32", "U16", "U8"};

size_t nb_dtype_size(nb_dtype t) { return dtype_sizes[t]; }
const char *nb_dtype_name(nb_dtype t) { return dtype_names[t]; }

int64_t nb_tensor_numel(const nb_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

size_t nb_tensor_bytes(const nb_tensor *t) { return (size_t)nb_tensor_numel(t) * nb_dtype_size(t->dtype); }

void *nb_tensor_data(const nb_tensor *t) {
    if (!t->arena || !t->arena->base) return NULL;
    return t->arena->base + t->offset;
}

static void *host_alloc(void *self, size_t bytes, const char *what) {
    (void)self;
    return nb_aligned_alloc(bytes, what);
}
static void host_free(void *self, void *ptr) {
    (void)self;
    free(ptr);
}
const nb_allocator_i nb_host_allocator = {host_alloc, host_free, NULL};

void nb_arena_init(nb_arena *a, const char *name, nb_device dev, size_t budget, nb_allocator_i alloc) {
    memset(a, 0, sizeof *a);
    snprintf(a->name, sizeof a->name, "%s", name);
    a->device = dev;
    a->budget = budget;
    a->allocator = alloc;
}

size_t nb_arena_plan_bytes(nb_arena *a, size_t bytes) {
    NB_ASSERT(a->base == NULL);
    size_t off = a->planned;
    a->planned += nb_align_up(bytes, NB_ALIGN);
    return off;
}

nb_tensor nb_arena_plan(nb_arena *a, const char *name, nb_dtype dt, int ndim, const int64_t *shape) {
    NB_ASSERT(ndim >= 0 && ndim <= NB_MAX_DIMS);
    nb_tensor t;
    memset(&t, 0, sizeof t);
    snprintf(t.name, sizeof t.name, "%s", name);
    t.dtype = dt;
    t.ndim = ndim;
    for (int i = 0; i < ndim; i++) t.shape[i] = shape[i];
    t.arena = a;
    t.offset = nb_arena_plan_bytes(a, nb_tensor_bytes(&t));
    return t;
}

void *nb_arena_take(nb_arena *a, size_t bytes) {
    if (!a->base) {
        nb_arena_plan_bytes(a, bytes);
        return NULL;
    }
    size_t off = nb_align_up(a->cursor, NB_ALIGN);
    a->cursor = off + nb_align_up(bytes, NB_ALIGN);
    NB_ASSERT(a->cursor <= a->planned); /* the binding walk took more than the planning walk */
    return a->base + off;
}

void nb_arena_seek(nb_arena *a, size_t offset) { a->cursor = offset; }

void nb_arena_alloc(nb_arena *a, const char *hint) {
    NB_ASSERT(a->base == NULL);
    if (a->budget && a->planned > a->budget) {
        char need[32], have[32];
        nb_fail(hint, "the %s arena needs %s but only %s is available", a->name,
                nb_fmt_bytes(need, sizeof need, (double)a->planned),
                nb_fmt_bytes(have, sizeof have, (double)a->budget));
    }
    a->base = (uint8_t *)a->allocator.alloc(a->allocator.self, a->planned, a->name);
}

void nb_arena_free(nb_arena *a) {
    if (a->base) a->allocator.free(a->allocator.self, a->base);
    a->base = NULL;
}
