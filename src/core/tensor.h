/* Tensors are views: (dtype, shape, device) plus an offset into an arena. Arenas are planned
 * before they are allocated: every tensor is added to the plan first, then the arena checks the
 * total against its byte budget and reports needed vs available (and which flag lowers it)
 * instead of failing halfway through a run. */
#ifndef NB_TENSOR_H
#define NB_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { NB_F32 = 0, NB_BF16, NB_F16, NB_I32, NB_U16, NB_U8, NB_DTYPE_COUNT } nb_dtype;
typedef enum { NB_DEV_CPU = 0, NB_DEV_CUDA } nb_device_kind;
typedef struct { nb_device_kind kind; int index; } nb_device;

size_t nb_dtype_size(nb_dtype t);
const char *nb_dtype_name(nb_dtype t); /* safetensors spelling: "F32", "BF16", ... */

#define NB_MAX_DIMS 4
#define NB_NAME_MAX 96

typedef struct nb_arena nb_arena;

typedef struct nb_tensor {
    char name[NB_NAME_MAX];
    nb_dtype dtype;
    int ndim;
    int64_t shape[NB_MAX_DIMS];
    nb_arena *arena;
    size_t offset; /* bytes from the arena base, NB_ALIGN-aligned */
} nb_tensor;

int64_t nb_tensor_numel(const nb_tensor *t);
size_t nb_tensor_bytes(const nb_tensor *t);
void *nb_tensor_data(const nb_tensor *t); /* NULL until the arena is allocated */

/* Allocator hooks let a backend supply device memory (cudaMalloc) or pinned host memory. */
typedef struct nb_allocator_i {
    void *(*alloc)(void *self, size_t bytes, const char *what);
    void (*free)(void *self, void *ptr);
    void *self;
} nb_allocator_i;
extern const nb_allocator_i nb_host_allocator;

struct nb_arena {
    char name[32];
    nb_device device;
    size_t budget;  /* 0 = unlimited */
    size_t planned; /* bytes the plan needs so far */
    uint8_t *base;  /* NULL until nb_arena_alloc */
    nb_allocator_i allocator;
    const char *budget_flag; /* flag that changes the budget, named in the error */
    size_t cursor;           /* nb_arena_take's next offset once the arena is allocated */
};

void nb_arena_init(nb_arena *a, const char *name, nb_device dev, size_t budget, nb_allocator_i alloc);
/* Add a tensor to the plan; returns a view that becomes valid after nb_arena_alloc. */
nb_tensor nb_arena_plan(nb_arena *a, const char *name, nb_dtype dt, int ndim, const int64_t *shape);
/* Reserve raw bytes in the plan (aligned); returns the offset. */
size_t nb_arena_plan_bytes(nb_arena *a, size_t bytes);
/* One layout walk that plans and then binds: before the arena is allocated, reserves bytes in the
 * plan and returns NULL; afterwards the same walk (started again at the same offset with
 * nb_arena_seek) hands out the same offsets as pointers. Lets a model describe its memory once. */
void *nb_arena_take(nb_arena *a, size_t bytes);
void nb_arena_seek(nb_arena *a, size_t offset);
/* Check the plan against the budget (fails with needed vs available and the hint), then allocate. */
void nb_arena_alloc(nb_arena *a, const char *hint);
void nb_arena_free(nb_arena *a);

#ifdef __cplusplus
}
#endif
#endif
