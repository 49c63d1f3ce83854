/* cuDNN 9's fused flash attention (SDPA) as a second CUDA implementation of the transformer's
 * causal attention, beside our own kernels (attention.cu, attention_fa.cu); the backend
 * instance's attention mode (nb_backend_set_attn, the CLI's --attn) picks one (backend_cuda.c),
 * and every call cuDNN cannot take runs ours.
 *
 * Loading. cuDNN is opened with dlopen at the first call and the few functions used are looked
 * up by name: the binary neither links nor needs libcudnn (CI builds without a GPU; a machine
 * without cuDNN trains with our kernels). The header only gives the types and enums; a build
 * without it compiles the refusing stubs at the end of this file.
 *
 * The graphs are the ones PyTorch's cuDNN SDPA sends (cuDNN frontend's CompositeSDPANode and
 * CompositeSDPABackwardNode, captured with CUDNN_LOGLEVEL_DBG=3 on an H200 with cuDNN 9.19),
 * rebuilt node by node on the backend API, with the same data types, math precisions and
 * virtual tensors, so the engines that recognise them take them:
 *   forward   S = Q K^T, S *= scale, causal mask (row >= col, else -inf), M = rowmax, E =
 *             exp(S - M), Z = rowsum E, Stats = M + log Z (our lse), P = E / Z (bf16), O = P V.
 *   backward  softmax_sum = rowsum(dO * O) (fp32, ours to allocate); P = exp(scale Q K^T - Stats)
 *             masked; dV = P^T dO; dS = scale P (dO V^T - softmax_sum); dK = dS^T Q; dQ = dS K.
 * The "fast" backward is the captured default: dQ summed in an fp32 dQ_accum with atomics, then
 * an IDENTITY node rounds it into dQ (run to run the bits differ). The deterministic one is the
 * variant the frontend builds when asked for a deterministic algorithm on Hopper (the "dP
 * workspace" one): no dQ_accum, dS K written straight into dQ. GQA (NKV < NH): dK and dV are
 * formed per query head (virtual bf16 "full head" tensors) and ADD-reduced onto the kv heads,
 * as the frontend does; the matmuls against K and V broadcast the kv heads themselves.
 *
 * Layout: strided 4-D views straight into our buffers, no copies (attention.c's layout):
 *   Q   [B, NH, T, HS]  strides [T R, HS, R, 1] at qkv          (R = (NH + 2 NKV) HS)
 *   K^T [B, NKV, HS, T] strides [T R, HS, 1, R] at qkv + NH HS  (V^T likewise, V as Q)
 *   O   [B, NH, T, HS]  strides [T C, HS, C, 1]                 (C = NH HS; dO the same)
 *   Stats = lse [B, NH, T, 1]; dQ, dK, dV: the Q, K, V views of dqkv, so the backward writes
 * every element of dqkv (the _set contract). Every pointer is declared 16-byte aligned, as the
 * frontend does: HS must be a multiple of 8 and the buffers 16-byte aligned, or the call is
 * refused.
 *
 * Plans are built on the first call of a shape (operation graph, heuristics mode A, the first
 * engine config that finalizes) and cached per backend instance by (B, T, NH, NKV, HS,
 * direction, deterministic); a key cuDNN refused stays refused, so a refusal costs one build. Scratch (the
 * backward's softmax_sum and dQ_accum, and cuDNN's workspace) is stream-ordered memory
 * (cudaMallocAsync on the call's stream), as for every launcher of ops_cuda.h: private to the
 * stream, so lanes running attention concurrently never share it, and legal inside a CUDA graph
 * capture (the graph keeps a fixed address). Building a plan is not: a shape first seen while
 * the stream captures is refused (the run's first step is eager, so its shapes are built then).
 * An instance holds its state (nb_attn_state: the cuDNN handle of its device, the plan cache, the
 * record of which implementation ran) behind a mutex of its own around the cache, the handle and
 * set-stream + execute. The library itself is opened once per process.
 */
#include <stdio.h>
#include <string.h>

#include "core.h"
#include "ops/backend.h"
#include "ops/ops_cuda.h"

/* ---- the attention mode of a backend instance (every build: the CLI parses it) ---- */

const char *const nb_attn_mode_names[NB_ATTN_MODE_COUNT + 1] = {"auto", "fa", "cudnn", "cudnn-fwd", "cudnn-fast", NULL};
const char nb_attn_mode_help[] =
    "auto (the default: cudnn from 512 tokens, fa below), fa (nobubble's kernels), cudnn (cuDNN forward and its "
    "deterministic backward), cudnn-fwd (cuDNN forward, nobubble's backward) or cudnn-fast (cuDNN forward and its "
    "faster non-deterministic backward)";

int nb_attn_mode_parse(const char *name, nb_attn_mode *mode) {
    for (int i = 0; i < NB_ATTN_MODE_COUNT; i++)
        if (name && strcmp(name, nb_attn_mode_names[i]) == 0) {
            *mode = (nb_attn_mode)i;
            return 0;
        }
    return -1;
}

void nb_backend_set_attn(nb_backend *b, nb_attn_mode mode) {
    NB_ASSERT(b && (int)mode >= 0 && mode < NB_ATTN_MODE_COUNT);
    b->attn = mode;
}

#ifdef NB_WITH_CUDA
#include <cuda_runtime.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__has_include)
#if __has_include(<cudnn_graph.h>)
#define NB_HAVE_CUDNN_H 1
#include <cudnn_graph.h>
#include <dlfcn.h>
#include <stdbool.h>
#endif
#endif

#include "cuda_check.h"

/* ---- an instance's state, and which implementation ran ---- */

nb_attn_mode nb_attn_mode_for(nb_attn_mode mode, int T) {
    if (mode != NB_ATTN_AUTO) return mode;
    return T >= NB_ATTN_AUTO_MIN_T ? NB_ATTN_CUDNN : NB_ATTN_FA;
}

#ifdef NB_HAVE_CUDNN_H
typedef struct dnn_plan dnn_plan;
#define MAX_PLANS 32
#endif

struct nb_attn_state {
    const nb_backend *b; /* its instance: the attention mode the messages name */
    pthread_mutex_t lock;
    nb_attn_record record; /* zero: nothing ran yet (NB_ATTN_RAN_NONE) */
    int notice_printed;
#ifdef NB_HAVE_CUDNN_H
    dnn_plan *plans;       /* [MAX_PLANS] */
    void *handle;          /* cudnnHandle_t of the instance's device, made at the first plan */
#endif
};

/* The instance's state (the CUDA backend creates it with the instance). */
static nb_attn_state *state_of(const nb_backend *b) {
    NB_CHECK(b && b->attn_state, "this is a bug in nobubble; please report it",
             "cuDNN attention called without a CUDA backend instance");
    return b->attn_state;
}

const char *nb_attn_ran_name(nb_attn_ran r) {
    switch (r) {
    case NB_ATTN_RAN_OURS: return "nobubble";
    case NB_ATTN_RAN_CUDNN: return "cudnn";
    case NB_ATTN_RAN_CUDNN_FAST: return "cudnn-fast";
    default: return "none";
    }
}

static void note_locked(nb_attn_state *st, int backward, nb_attn_ran ran) {
    st->record.last[backward] = ran;
    st->record.count[backward][ran]++;
}

void nb_attn_note(const nb_backend *b, int backward, nb_attn_ran ran) {
    nb_attn_state *st = state_of(b);
    pthread_mutex_lock(&st->lock);
    note_locked(st, backward != 0, ran);
    pthread_mutex_unlock(&st->lock);
}

nb_attn_record nb_attn_record_get(const nb_backend *b) {
    nb_attn_state *st = state_of(b);
    pthread_mutex_lock(&st->lock);
    nb_attn_record r = st->record;
    pthread_mutex_unlock(&st->lock);
    return r;
}

void nb_attn_report(const nb_backend *b) {
    if (!b || !b->attn_state) return; /* not a CUDA instance */
    nb_attn_record r = nb_attn_record_get(b);
    const char *mode = nb_attn_mode_names[b->attn];
    long any = 0;
    for (int d = 0; d < 2; d++)
        for (int k = NB_ATTN_RAN_CUDNN; k <= NB_ATTN_RAN_CUDNN_FAST; k++) any += r.count[d][k];
    if (b->attn == NB_ATTN_FA || (!any && !r.why[0])) return;
    fprintf(stderr, "attention   --attn %s: forward cudnn %ld, nobubble %ld; backward cudnn %ld, cudnn-fast %ld, "
            "nobubble %ld calls\n", mode, r.count[0][NB_ATTN_RAN_CUDNN], r.count[0][NB_ATTN_RAN_OURS],
            r.count[1][NB_ATTN_RAN_CUDNN], r.count[1][NB_ATTN_RAN_CUDNN_FAST], r.count[1][NB_ATTN_RAN_OURS]);
    if (r.why[0]) fprintf(stderr, "            cuDNN refused a call: %s\n", r.why);
}

/* A call cuDNN does not take: the reason is kept for the report, and said once per instance. */
static int refuse_locked(nb_attn_state *st, const char *what, const char *fmt, ...) NB_PRINTF(3, 4);
static int refuse_locked(nb_attn_state *st, const char *what, const char *fmt, ...) {
    char why[sizeof st->record.why];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    if (!st->record.why[0]) snprintf(st->record.why, sizeof st->record.why, "%s: %.400s", what, why);
    if (!st->notice_printed) {
        st->notice_printed = 1;
        fprintf(stderr, "nobubble: note: --attn %s asks for cuDNN attention, but cuDNN cannot take the %s: %s; "
                "nobubble's own attention kernels run it instead (said once)\n", nb_attn_mode_names[st->b->attn],
                what, why);
    }
    return 1;
}

#ifdef NB_HAVE_CUDNN_H
/* ---- the library, opened at first use ---- */

typedef struct {
    size_t version;
    cudnnStatus_t (*create)(cudnnHandle_t *);
    cudnnStatus_t (*destroy)(cudnnHandle_t);
    cudnnStatus_t (*set_stream)(cudnnHandle_t, cudaStream_t);
    const char *(*error_string)(cudnnStatus_t);
    void (*last_error)(char *, size_t);
    size_t (*get_version)(void);
    cudnnStatus_t (*be_create)(cudnnBackendDescriptorType_t, cudnnBackendDescriptor_t *);
    cudnnStatus_t (*be_set)(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t, cudnnBackendAttributeType_t,
                            int64_t, const void *);
    cudnnStatus_t (*be_get)(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t, cudnnBackendAttributeType_t,
                            int64_t, int64_t *, void *);
    cudnnStatus_t (*be_finalize)(cudnnBackendDescriptor_t);
    cudnnStatus_t (*be_execute)(cudnnHandle_t, cudnnBackendDescriptor_t, cudnnBackendDescriptor_t);
    cudnnStatus_t (*be_destroy)(cudnnBackendDescriptor_t);
} dnn_api;

/* The library is the process's: opened once, by the first instance that needs it. */
static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;
static dnn_api dnn;
static int dnn_state;            /* 0: not tried yet, 1: loaded, -1: unavailable (dnn_missing says why) */
static char dnn_missing[400];
/* The last failed cuDNN call of this thread, as dnn_fail wrote it: a build or a call writes it and
 * reads it back under its instance's lock, on one thread. */
static _Thread_local char dnn_err[NB_ATTN_WHY_BYTES];

/* dlsym's void * into a function pointer: memcpy, since C has no cast between the two. */
static int sym(void *lib, const char *name, void *fn, size_t size) {
    void *p = dlsym(lib, name);
    if (!p) {
        snprintf(dnn_missing, sizeof dnn_missing, "libcudnn.so.9 has no %s", name);
        return 1;
    }
    memcpy(fn, &p, size);
    return 0;
}
#define SYM(lib, name, field) sym((lib), (name), &dnn.field, sizeof dnn.field)

static void *open_cudnn(void) {
    char alt[512] = "", tried[sizeof dnn_missing] = "";
    const char *home = getenv("CUDA_HOME");
    if (home && *home) snprintf(alt, sizeof alt, "%s/lib64/libcudnn.so.9", home);
    const char *paths[3] = {"libcudnn.so.9", alt[0] ? alt : NULL, "/usr/local/cuda/lib64/libcudnn.so.9"};
    for (int i = 0; i < 3; i++) {
        if (!paths[i]) continue;
        void *lib = dlopen(paths[i], RTLD_NOW | RTLD_LOCAL);
        if (lib) return lib;
        if (!tried[0]) snprintf(tried, sizeof tried, "%s", dlerror());
    }
    snprintf(dnn_missing, sizeof dnn_missing, "libcudnn.so.9 not found (%.300s); install cuDNN 9 or set CUDA_HOME", tried);
    return NULL;
}

static int load_locked(void) {
    if (dnn_state) return dnn_state > 0;
    dnn_state = -1;
    void *lib = open_cudnn();
    if (!lib) return 0;
    if (SYM(lib, "cudnnCreate", create) || SYM(lib, "cudnnSetStream", set_stream) ||
        SYM(lib, "cudnnGetErrorString", error_string) || SYM(lib, "cudnnGetLastErrorString", last_error) ||
        SYM(lib, "cudnnGetVersion", get_version) || SYM(lib, "cudnnBackendCreateDescriptor", be_create) ||
        SYM(lib, "cudnnBackendSetAttribute", be_set) || SYM(lib, "cudnnBackendGetAttribute", be_get) ||
        SYM(lib, "cudnnBackendFinalize", be_finalize) || SYM(lib, "cudnnBackendExecute", be_execute) ||
        SYM(lib, "cudnnBackendDestroyDescriptor", be_destroy) || SYM(lib, "cudnnDestroy", destroy))
        return 0;
    dnn.version = dnn.get_version();
    if (dnn.version < 90000) {
        snprintf(dnn_missing, sizeof dnn_missing, "cuDNN %zu is older than 9.0", dnn.version);
        return 0;
    }
    dnn_state = 1;
    return 1;
}

static int load(void) {
    pthread_mutex_lock(&load_lock);
    int ok = load_locked();
    pthread_mutex_unlock(&load_lock);
    return ok;
}

/* ---- checked calls: a failure is kept in dnn_err with file:line and cuDNN's own words ---- */

static int dnn_fail(cudnnStatus_t st, const char *call, const char *on, int line) {
    char last[320] = "";
    dnn.last_error(last, sizeof last);
    snprintf(dnn_err, sizeof dnn_err, "%s:%d: %s%s%s failed: %s (%d)%s%s", __FILE__, line, call, on[0] ? " on " : "",
             on, dnn.error_string(st), (int)st, last[0] ? ": " : "", last);
    return 1;
}
static int dnn_check(cudnnStatus_t st, const char *call, const char *on, int line) {
    return st == CUDNN_STATUS_SUCCESS ? 0 : dnn_fail(st, call, on, line);
}
/* 0 on success; else 1 with dnn_err set (the callers hold their instance's lock) */
#define DNN(call, on) dnn_check((call), #call, (on), __LINE__)

/* ---- building a graph: every descriptor is kept with its plan; the first failure stops the
 * build (later steps do nothing) and leaves its message in dnn_err ---- */

#define MAX_DESC 160
#define MAX_OPS 40
#define MAX_CFGS 16

typedef struct {
    cudnnBackendDescriptor_t own[MAX_DESC];
    int nown;
    cudnnBackendDescriptor_t ops[MAX_OPS];
    int nops;
    int64_t next_uid; /* virtual tensors' uids */
    int failed;
    char what[64];    /* the node being built, for the error message */
} dnn_graph;

typedef cudnnBackendDescriptor_t desc;

static desc gb_new(dnn_graph *g, cudnnBackendDescriptorType_t type) {
    desc d = NULL;
    if (g->failed) return NULL;
    NB_ASSERT(g->nown < MAX_DESC);
    if (DNN(dnn.be_create(type, &d), g->what)) {
        g->failed = 1;
        return NULL;
    }
    g->own[g->nown++] = d;
    return d;
}

static void gb_set(dnn_graph *g, desc d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                   int64_t n, const void *v) {
    if (g->failed) return;
    if (DNN(dnn.be_set(d, name, type, n, v), g->what)) {
        size_t len = strlen(dnn_err);
        snprintf(dnn_err + len, sizeof dnn_err - len, " [attribute %d]", (int)name);
        g->failed = 1;
    }
}

static void gb_desc(dnn_graph *g, desc d, cudnnBackendAttributeName_t name, desc v) {
    gb_set(g, d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v);
}

static void gb_finalize(dnn_graph *g, desc d) {
    if (g->failed) return;
    if (DNN(dnn.be_finalize(d), g->what)) g->failed = 1;
}

static void gb_add_op(dnn_graph *g, desc op) {
    if (g->failed) return;
    NB_ASSERT(g->nops < MAX_OPS);
    g->ops[g->nops++] = op;
}

static void gb_free(dnn_graph *g) {
    for (int i = g->nown - 1; i >= 0; i--) dnn.be_destroy(g->own[i]);
    g->nown = g->nops = 0;
}

/* ---- tensors and nodes ---- */

typedef struct {
    int64_t d[4], s[4];
} nd4;

enum { T_REAL, T_VIRTUAL, T_BY_VALUE };

static desc tensor(dnn_graph *g, int64_t uid, cudnnDataType_t dt, nd4 v, int kind) {
    int64_t align = 16;
    bool yes = true;
    snprintf(g->what, sizeof g->what, "tensor %lld", (long long)uid);
    desc t = gb_new(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    gb_set(g, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt);
    gb_set(g, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, v.d);
    gb_set(g, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, v.s);
    gb_set(g, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    gb_set(g, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
    if (kind == T_VIRTUAL) gb_set(g, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &yes);
    if (kind == T_BY_VALUE) gb_set(g, t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &yes);
    gb_finalize(g, t);
    return t;
}

/* An intermediate that never reaches memory. */
static desc virt(dnn_graph *g, cudnnDataType_t dt, nd4 v) { return tensor(g, g->next_uid++, dt, v, T_VIRTUAL); }

/* y = mode(x, b, t); b and t may be NULL; axis: GEN_INDEX's dimension, else -1. */
static void pointwise(dnn_graph *g, cudnnPointwiseMode_t mode, cudnnDataType_t math, desc x, desc b, desc t, desc y,
                      int64_t axis) {
    float one = 1.0f;
    snprintf(g->what, sizeof g->what, "pointwise mode %d", (int)mode);
    desc pw = gb_new(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    gb_set(g, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    gb_set(g, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &math);
    if (axis >= 0) gb_set(g, pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    gb_finalize(g, pw);
    desc op = gb_new(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    gb_desc(g, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw);
    gb_desc(g, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
    if (b) gb_desc(g, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b);
    if (t) gb_desc(g, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t);
    gb_desc(g, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
    gb_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one);
    gb_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one);
    gb_finalize(g, op);
    gb_add_op(g, op);
}

static void pw2(dnn_graph *g, cudnnPointwiseMode_t mode, desc x, desc b, desc y) {
    pointwise(g, mode, CUDNN_DATA_FLOAT, x, b, NULL, y, -1);
}

/* y = reduce(x) over the dimensions where y has extent 1 (or, for the GQA head sums, where its
 * extent divides x's). */
static void reduction(dnn_graph *g, cudnnReduceTensorOp_t how, desc x, desc y) {
    cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    bool no = false;
    snprintf(g->what, sizeof g->what, "reduction %d", (int)how);
    desc r = gb_new(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    gb_set(g, r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32);
    gb_set(g, r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &how);
    gb_set(g, r, CUDNN_ATTR_REDUCTION_IS_DETERMINISTIC, CUDNN_TYPE_BOOLEAN, 1, &no);
    gb_finalize(g, r);
    desc op = gb_new(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    gb_desc(g, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, r);
    gb_desc(g, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x);
    gb_desc(g, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y);
    gb_finalize(g, op);
    gb_add_op(g, op);
}

/* c = a @ b over the last two dimensions (fp32 accumulation), batched over the first two. */
static void matmul(dnn_graph *g, desc a, desc b, desc c) {
    cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    snprintf(g->what, sizeof g->what, "matmul");
    desc mm = gb_new(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    gb_set(g, mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32);
    gb_finalize(g, mm);
    desc op = gb_new(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    gb_desc(g, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a);
    gb_desc(g, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b);
    gb_desc(g, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c);
    gb_desc(g, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, mm);
    gb_finalize(g, op);
    gb_add_op(g, op);
}

/* y = x seen through y's dimensions and strides (a transpose, for the engines). */
static void reshape(dnn_graph *g, desc x, desc y) {
    snprintf(g->what, sizeof g->what, "reshape");
    desc op = gb_new(g, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    gb_desc(g, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x);
    gb_desc(g, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y);
    gb_finalize(g, op);
    gb_add_op(g, op);
}

/* ---- the views (top comment) ---- */

typedef struct {
    int64_t B, T, NH, NKV, HS, R, C;
} geom;

static nd4 nd(int64_t d0, int64_t d1, int64_t d2, int64_t d3, int64_t s0, int64_t s1, int64_t s2, int64_t s3) {
    nd4 v = {{d0, d1, d2, d3}, {s0, s1, s2, s3}};
    return v;
}
/* q, k or v heads (or their gradients) inside the qkv rows: [B, heads, T, HS] */
static nd4 in_rows(const geom *a, int64_t heads) { return nd(a->B, heads, a->T, a->HS, a->T * a->R, a->HS, a->R, 1); }
/* the same, transposed: K^T and V^T, [B, heads, HS, T] */
static nd4 in_rows_t(const geom *a, int64_t heads) {
    return nd(a->B, heads, a->HS, a->T, a->T * a->R, a->HS, 1, a->R);
}
static nd4 out_rows(const geom *a) { return nd(a->B, a->NH, a->T, a->HS, a->T * a->C, a->HS, a->C, 1); }
static nd4 scores(const geom *a) {
    return nd(a->B, a->NH, a->T, a->T, a->NH * a->T * a->T, a->T * a->T, a->T, 1);
}
static nd4 scores_t(const geom *a) {
    return nd(a->B, a->NH, a->T, a->T, a->NH * a->T * a->T, a->T * a->T, 1, a->T);
}
static nd4 per_row(const geom *a) { return nd(a->B, a->NH, a->T, 1, a->NH * a->T, a->T, 1, 1); }
static nd4 scalar(void) { return nd(1, 1, 1, 1, 1, 1, 1, 1); }
/* [B, heads, T, HS] packed: dQ_accum and the GQA per-query-head dK, dV */
static nd4 packed(const geom *a, int64_t heads) {
    return nd(a->B, heads, a->T, a->HS, heads * a->T * a->HS, a->T * a->HS, a->HS, 1);
}
/* dO * O as the frontend lays it out (virtual: only the engine's pattern match sees it) */
static nd4 do_times_o(const geom *a) {
    return nd(a->B, a->NH, a->T, a->HS, a->NH * a->T * a->HS, a->T * a->HS, a->NH * a->HS, 1);
}

/* The tensors that reach memory (the variant pack names them by these uids). */
enum {
    U_Q = 1, U_KT, U_V, U_VT, U_O, U_DO, U_STATS, U_SCALE, U_NEG_INF, U_ONE, U_DQ, U_DK, U_DV, U_SOFTMAX_SUM,
    U_DQ_ACCUM, U_FIRST_VIRTUAL = 100
};

/* s where row >= col, -inf elsewhere (top-left causal; T_q = T_kv) */
static desc causal_mask(dnn_graph *g, const geom *a, desc s, desc neg_inf) {
    nd4 sc = scores(a);
    desc col = virt(g, CUDNN_DATA_INT32, sc), row = virt(g, CUDNN_DATA_INT32, sc);
    desc keep = virt(g, CUDNN_DATA_BOOLEAN, sc), y = virt(g, CUDNN_DATA_FLOAT, sc);
    pointwise(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, s, NULL, NULL, col, 3);
    pointwise(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, s, NULL, NULL, row, 2);
    pointwise(g, CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, col, NULL, keep, -1);
    pointwise(g, CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, s, neg_inf, keep, y, -1);
    return y;
}

static void forward_graph(dnn_graph *g, const geom *a) {
    nd4 sc = scores(a), st = per_row(a);
    desc q = tensor(g, U_Q, CUDNN_DATA_BFLOAT16, in_rows(a, a->NH), T_REAL);
    desc kt = tensor(g, U_KT, CUDNN_DATA_BFLOAT16, in_rows_t(a, a->NKV), T_REAL);
    desc v = tensor(g, U_V, CUDNN_DATA_BFLOAT16, in_rows(a, a->NKV), T_REAL);
    desc o = tensor(g, U_O, CUDNN_DATA_BFLOAT16, out_rows(a), T_REAL);
    desc stats = tensor(g, U_STATS, CUDNN_DATA_FLOAT, st, T_REAL);
    desc scale = tensor(g, U_SCALE, CUDNN_DATA_FLOAT, scalar(), T_BY_VALUE);
    desc neg_inf = tensor(g, U_NEG_INF, CUDNN_DATA_FLOAT, scalar(), T_BY_VALUE);

    desc s = virt(g, CUDNN_DATA_FLOAT, sc), ss = virt(g, CUDNN_DATA_FLOAT, sc);
    matmul(g, q, kt, s);
    pw2(g, CUDNN_POINTWISE_MUL, s, scale, ss);
    desc m = causal_mask(g, a, ss, neg_inf);
    desc mx = virt(g, CUDNN_DATA_FLOAT, st), sub = virt(g, CUDNN_DATA_FLOAT, sc), e = virt(g, CUDNN_DATA_FLOAT, sc);
    reduction(g, CUDNN_REDUCE_TENSOR_MAX, m, mx);
    pw2(g, CUDNN_POINTWISE_SUB, m, mx, sub);
    pointwise(g, CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, sub, NULL, NULL, e, -1);
    desc z = virt(g, CUDNN_DATA_FLOAT, st), logz = virt(g, CUDNN_DATA_FLOAT, st);
    reduction(g, CUDNN_REDUCE_TENSOR_ADD, e, z);
    pointwise(g, CUDNN_POINTWISE_LOG, CUDNN_DATA_FLOAT, z, NULL, NULL, logz, -1);
    pw2(g, CUDNN_POINTWISE_ADD, mx, logz, stats);
    desc p = virt(g, CUDNN_DATA_BFLOAT16, sc);
    pw2(g, CUDNN_POINTWISE_DIV, e, z, p);
    matmul(g, p, v, o);
}

/* out (dK or dV, kv heads) = lhs_t @ rhs; with GQA per query head first, then summed per group */
static void kv_grad(dnn_graph *g, const geom *a, desc lhs_t, desc rhs, desc out) {
    if (a->NH == a->NKV) {
        matmul(g, lhs_t, rhs, out);
        return;
    }
    desc full = virt(g, CUDNN_DATA_BFLOAT16, packed(a, a->NH));
    matmul(g, lhs_t, rhs, full);
    reduction(g, CUDNN_REDUCE_TENSOR_ADD, full, out);
}

static void backward_graph(dnn_graph *g, const geom *a, int deterministic) {
    nd4 sc = scores(a), st = per_row(a);
    desc q = tensor(g, U_Q, CUDNN_DATA_BFLOAT16, in_rows(a, a->NH), T_REAL);
    desc kt = tensor(g, U_KT, CUDNN_DATA_BFLOAT16, in_rows_t(a, a->NKV), T_REAL);
    desc vt = tensor(g, U_VT, CUDNN_DATA_BFLOAT16, in_rows_t(a, a->NKV), T_REAL);
    desc o = tensor(g, U_O, CUDNN_DATA_BFLOAT16, out_rows(a), T_REAL);
    desc dO = tensor(g, U_DO, CUDNN_DATA_BFLOAT16, out_rows(a), T_REAL);
    desc stats = tensor(g, U_STATS, CUDNN_DATA_FLOAT, st, T_REAL);
    desc scale = tensor(g, U_SCALE, CUDNN_DATA_FLOAT, scalar(), T_BY_VALUE);
    desc one = tensor(g, U_ONE, CUDNN_DATA_FLOAT, scalar(), T_BY_VALUE);
    desc neg_inf = tensor(g, U_NEG_INF, CUDNN_DATA_FLOAT, scalar(), T_BY_VALUE);
    desc dq = tensor(g, U_DQ, CUDNN_DATA_BFLOAT16, in_rows(a, a->NH), T_REAL);
    desc dk = tensor(g, U_DK, CUDNN_DATA_BFLOAT16, in_rows(a, a->NKV), T_REAL);
    desc dv = tensor(g, U_DV, CUDNN_DATA_BFLOAT16, in_rows(a, a->NKV), T_REAL);
    desc softmax_sum = tensor(g, U_SOFTMAX_SUM, CUDNN_DATA_FLOAT, st, T_REAL);

    desc dp = virt(g, CUDNN_DATA_FLOAT, sc), s = virt(g, CUDNN_DATA_FLOAT, sc);
    desc doo = virt(g, CUDNN_DATA_FLOAT, do_times_o(a)), k = virt(g, CUDNN_DATA_FLOAT, in_rows(a, a->NKV));
    matmul(g, dO, vt, dp);
    matmul(g, q, kt, s);
    pw2(g, CUDNN_POINTWISE_MUL, dO, o, doo);
    reshape(g, kt, k);
    desc ss = virt(g, CUDNN_DATA_FLOAT, sc), sm = virt(g, CUDNN_DATA_FLOAT, sc);
    pw2(g, CUDNN_POINTWISE_MUL, s, scale, ss);
    pw2(g, CUDNN_POINTWISE_SUB, ss, stats, sm);
    desc masked = causal_mask(g, a, sm, neg_inf);
    desc p = virt(g, CUDNN_DATA_FLOAT, sc), pt = virt(g, CUDNN_DATA_BFLOAT16, scores_t(a));
    pointwise(g, CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, masked, NULL, NULL, p, -1);
    reshape(g, p, pt);
    kv_grad(g, a, pt, dO, dv);
    desc rowsum = virt(g, CUDNN_DATA_FLOAT, st);
    reduction(g, CUDNN_REDUCE_TENSOR_ADD, doo, rowsum);
    pw2(g, CUDNN_POINTWISE_MUL, rowsum, one, softmax_sum);
    desc d1 = virt(g, CUDNN_DATA_FLOAT, sc), d2 = virt(g, CUDNN_DATA_FLOAT, sc), ds = virt(g, CUDNN_DATA_FLOAT, sc);
    pw2(g, CUDNN_POINTWISE_SUB, dp, softmax_sum, d1);
    pw2(g, CUDNN_POINTWISE_MUL, d1, p, d2);
    pw2(g, CUDNN_POINTWISE_MUL, d2, scale, ds);
    if (deterministic) {
        matmul(g, ds, k, dq);
    } else {
        desc acc = tensor(g, U_DQ_ACCUM, CUDNN_DATA_FLOAT, packed(a, a->NH), T_REAL);
        matmul(g, ds, k, acc);
        pointwise(g, CUDNN_POINTWISE_IDENTITY, CUDNN_DATA_FLOAT, acc, NULL, NULL, dq, -1);
    }
    desc dst = virt(g, CUDNN_DATA_BFLOAT16, scores_t(a));
    reshape(g, ds, dst);
    kv_grad(g, a, dst, q, dk);
}

/* ---- plans ---- */

struct dnn_plan {
    int used, ok; /* ok: a plan; used && !ok: cuDNN refused the key (why says how) */
    int B, T, NH, NKV, HS, backward, deterministic;
    dnn_graph g;
    desc plan;
    int64_t engine, cudnn_ws;
    size_t accum_bytes, sum_bytes;  /* the backward's dQ_accum and softmax_sum, in front of cudnn_ws */
    float scale, neg_inf, one;      /* by-value inputs: execute reads them from here */
    char why[NB_ATTN_WHY_BYTES];
};

/* The instance's handle, made on its device (current on the calling thread) at the first use. */
static cudnnHandle_t handle_locked(nb_attn_state *st) {
    if (!st->handle) {
        cudnnHandle_t h = NULL;
        if (DNN(dnn.create(&h), "")) return NULL;
        st->handle = h;
    }
    return (cudnnHandle_t)st->handle;
}

static int engine_is_nondeterministic(desc cfg, int64_t *engine_id) {
    desc engine = NULL;
    int64_t n = 0;
    cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
    int nondet = 0;
    if (dnn.be_create(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &engine) != CUDNN_STATUS_SUCCESS) return 0;
    if (dnn.be_get(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &engine) ==
        CUDNN_STATUS_SUCCESS) {
        dnn.be_get(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, engine_id);
        if (dnn.be_get(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                       CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &n, notes) == CUDNN_STATUS_SUCCESS)
            for (int64_t i = 0; i < n; i++) nondet |= notes[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC;
    }
    dnn.be_destroy(engine);
    return nondet;
}

/* An execution plan for one engine config: 0 with p->plan and p->cudnn_ws set, else 1 (dnn_err). */
static int try_config(dnn_plan *p, desc cfg, int64_t engine) {
    desc plan = NULL;
    int64_t n = 0;
    if (DNN(dnn.be_create(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan), "execution plan")) return 1;
    if (DNN(dnn.be_set(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg),
            "execution plan") ||
        DNN(dnn.be_finalize(plan), "execution plan") ||
        DNN(dnn.be_get(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &p->cudnn_ws),
            "execution plan")) {
        dnn.be_destroy(plan);
        return 1;
    }
    NB_ASSERT(p->g.nown < MAX_DESC);
    p->g.own[p->g.nown++] = plan;
    p->plan = plan, p->engine = engine;
    return 0;
}

/* The heuristics' configs (mode A) in their order; the first whose plan finalizes wins (the
 * first ones may want more shared memory than the GPU has: the captured forward skipped one). A
 * deterministic plan also skips engines that say they are not. */
static int plan_from_heuristics(dnn_plan *p, desc graph) {
    dnn_graph *g = &p->g;
    cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    snprintf(g->what, sizeof g->what, "engine heuristics");
    desc heur = gb_new(g, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    gb_desc(g, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
    gb_set(g, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    gb_finalize(g, heur);
    int64_t n = 0;
    if (g->failed ||
        DNN(dnn.be_get(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &n, NULL), g->what))
        return 1;
    if (n <= 0) {
        snprintf(dnn_err, sizeof dnn_err, "the engine heuristics offer no engine for this graph");
        return 1;
    }
    desc cfgs[MAX_CFGS];
    if (n > MAX_CFGS) n = MAX_CFGS;
    for (int64_t i = 0; i < n; i++) cfgs[i] = gb_new(g, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    if (g->failed ||
        DNN(dnn.be_get(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, n, &n, cfgs), g->what))
        return 1;
    for (int64_t i = 0; i < n; i++) {
        int64_t engine = -1;
        if (engine_is_nondeterministic(cfgs[i], &engine) && p->deterministic) {
            snprintf(dnn_err, sizeof dnn_err, "engine %lld is marked non-deterministic", (long long)engine);
            continue;
        }
        if (!try_config(p, cfgs[i], engine)) return 0;
    }
    return 1;
}

/* Graph, heuristics, plan: 0 with p->plan set, or 1 with dnn_err saying why. */
static int build_plan(dnn_plan *p, cudnnHandle_t h) {
    geom a = {p->B, p->T, p->NH, p->NKV, p->HS, (int64_t)(p->NH + 2 * p->NKV) * p->HS, (int64_t)p->NH * p->HS};
    dnn_graph *g = &p->g;
    g->next_uid = U_FIRST_VIRTUAL;
    if (p->backward) backward_graph(g, &a, p->deterministic);
    else forward_graph(g, &a);
    snprintf(g->what, sizeof g->what, "operation graph");
    desc graph = gb_new(g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    gb_set(g, graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g->nops, g->ops);
    gb_set(g, graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
    gb_finalize(g, graph);
    if (g->failed || plan_from_heuristics(p, graph)) return 1;
    p->scale = 1.0f / sqrtf((float)p->HS);
    /* the frontend's mask value: cuDNN before 9.10 wants the lowest float, later ones -inf */
    p->neg_inf = dnn.version < 91000 ? -3.402823466e38f : -INFINITY;
    p->one = 1.0f;
    if (p->backward) {
        p->sum_bytes = nb_align_up((size_t)p->B * p->NH * p->T * sizeof(float), NB_ALIGN);
        p->accum_bytes = p->deterministic ? 0 : nb_align_up((size_t)a.B * a.NH * a.T * a.HS * sizeof(float), NB_ALIGN);
    }
    return 0;
}

typedef struct {
    int B, T, NH, NKV, HS, backward, deterministic;
} attn_key;

static dnn_plan *find_locked(nb_attn_state *st, const attn_key *k) {
    for (int i = 0; i < MAX_PLANS; i++) {
        dnn_plan *p = &st->plans[i];
        if (p->used && p->B == k->B && p->T == k->T && p->NH == k->NH && p->NKV == k->NKV &&
            p->HS == k->HS && p->backward == k->backward && p->deterministic == k->deterministic)
            return p;
    }
    return NULL;
}

static const char *what_of(const attn_key *k) {
    return !k->backward ? "attention forward"
                        : k->deterministic ? "attention backward (deterministic)" : "attention backward (fast)";
}

/* A fresh entry of the plan cache for k, or NULL when it is full. */
static dnn_plan *new_plan_locked(nb_attn_state *st, const attn_key *k) {
    for (int i = 0; i < MAX_PLANS; i++) {
        dnn_plan *p = &st->plans[i];
        if (p->used) continue;
        memset(p, 0, sizeof *p);
        p->used = 1, p->B = k->B, p->T = k->T, p->NH = k->NH, p->NKV = k->NKV, p->HS = k->HS;
        p->backward = k->backward, p->deterministic = k->deterministic;
        return p;
    }
    return NULL;
}

/* The plan for a call (built at its key's first call), or NULL after refuse_locked. */
static dnn_plan *plan_locked(nb_attn_state *st, const attn_key *k, cudaStream_t stream) {
    const char *what = what_of(k);
    if (!load()) {
        refuse_locked(st, what, "%s", dnn_missing);
        return NULL;
    }
    dnn_plan *p = find_locked(st, k);
    if (p && p->ok) return p;
    if (p) {
        refuse_locked(st, what, "%s", p->why);
        return NULL;
    }
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    CUDA_CHECK(cudaStreamIsCapturing(stream, &cs));
    if (cs != cudaStreamCaptureStatusNone) {
        refuse_locked(st, what, "B=%d T=%d first came inside a CUDA graph capture, where no plan can be built", k->B,
                      k->T);
        return NULL;
    }
    if (!(p = new_plan_locked(st, k))) {
        refuse_locked(st, what, "more than %d attention shapes in one backend instance", MAX_PLANS);
        return NULL;
    }
    double t0 = nb_now();
    cudnnHandle_t h = handle_locked(st);
    dnn_err[0] = 0;
    if (!h || build_plan(p, h)) {
        snprintf(p->why, sizeof p->why, "B=%d T=%d NH=%d NKV=%d HS=%d: %.400s", k->B, k->T, k->NH, k->NKV, k->HS,
                 dnn_err[0] ? dnn_err : "no engine config finalized");
        gb_free(&p->g);
        nb_log(2, "cuDNN refused the %s plan: %s\n", what, p->why);
        refuse_locked(st, what, "%s", p->why);
        return NULL;
    }
    p->ok = 1;
    nb_log(2, "cuDNN %s plan for B=%d T=%d NH=%d NKV=%d HS=%d: engine %lld, workspace %lld bytes, built in %.0f ms\n",
           what, k->B, k->T, k->NH, k->NKV, k->HS, (long long)p->engine, (long long)p->cudnn_ws, 1e3 * (nb_now() - t0));
    return p;
}

/* ---- running a plan ---- */

/* A plan that failed at execute is not tried again. */
static int drop_locked(nb_attn_state *st, dnn_plan *p, const char *fmt, ...) NB_PRINTF(3, 4);
static int drop_locked(nb_attn_state *st, dnn_plan *p, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->why, sizeof p->why, fmt, ap);
    va_end(ap);
    p->ok = 0;
    attn_key k = {p->B, p->T, p->NH, p->NKV, p->HS, p->backward, p->deterministic};
    return refuse_locked(st, what_of(&k), "%s", p->why);
}

static int execute_locked(nb_attn_state *st, dnn_plan *p, cudnnHandle_t h, const int64_t *uids, void **ptrs, int n,
                          void *ws, cudaStream_t stream) {
    desc vp = NULL;
    if (DNN(dnn.be_create(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp), "variant pack"))
        return drop_locked(st, p, "%s", dnn_err);
    int bad = DNN(dnn.be_set(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids), "variant pack") ||
              DNN(dnn.be_set(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs),
                  "variant pack") ||
              DNN(dnn.be_set(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws), "variant pack") ||
              DNN(dnn.be_finalize(vp), "variant pack") ||
              DNN(dnn.set_stream(h, stream), "") ||
              DNN(dnn.be_execute(h, p->plan, vp), "attention plan");
    dnn.be_destroy(vp);
    return bad ? drop_locked(st, p, "%s", dnn_err) : 0;
}

/* Scratch for one call (top comment); the backward's softmax_sum and dQ_accum lie in front of
 * cuDNN's own workspace. NULL (and the plan dropped) when the GPU has no room for it. */
static char *scratch_locked(nb_attn_state *st, dnn_plan *p, cudaStream_t stream) {
    size_t bytes = p->accum_bytes + p->sum_bytes + nb_align_up((size_t)p->cudnn_ws, NB_ALIGN) + NB_ALIGN;
    void *ws = NULL;
    cudaError_t e = cudaMallocAsync(&ws, bytes, stream);
    if (e == cudaErrorMemoryAllocation) {
        char b[32];
        cudaGetLastError();
        drop_locked(st, p, "its scratch of %s does not fit in GPU memory", nb_fmt_bytes(b, sizeof b, (double)bytes));
        return NULL;
    }
    CUDA_CHECK_NAMED(e, "cudaMallocAsync (cuDNN attention scratch)");
    /* before cuDNN 9.6 the engines expected dQ_accum zeroed (the frontend's memset) */
    if (p->accum_bytes && dnn.version < 90600) CUDA_CHECK(cudaMemsetAsync(ws, 0, p->accum_bytes, stream));
    return ws;
}

static int run_locked(nb_attn_state *st, dnn_plan *p, const int64_t *uids, void **ptrs, int n, cudaStream_t stream) {
    cudnnHandle_t h = handle_locked(st);
    if (!h) return drop_locked(st, p, "%s", dnn_err);
    char *ws = scratch_locked(st, p, stream);
    if (!ws) return 1;
    for (int i = 0; i < n; i++) { /* the backward's fp32 tensors live in the scratch */
        if (uids[i] == U_DQ_ACCUM) ptrs[i] = ws;
        if (uids[i] == U_SOFTMAX_SUM) ptrs[i] = ws + p->accum_bytes;
    }
    int rc = execute_locked(st, p, h, uids, ptrs, n, ws + p->accum_bytes + p->sum_bytes, stream);
    CUDA_CHECK(cudaFreeAsync(ws, stream));
    return rc;
}

/* ---- the launchers ---- */

static int aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* Shapes and pointers cuDNN is never given (top comment); 0 if the call may go on. */
static int check_call_locked(nb_attn_state *st, const attn_key *k, const void *const *ptrs, int n) {
    const char *what = what_of(k);
    if (k->B <= 0 || k->T <= 0 || k->NH <= 0 || k->NKV <= 0 || k->NH % k->NKV)
        return refuse_locked(st, what, "B=%d T=%d NH=%d NKV=%d is not a shape it takes", k->B, k->T, k->NH,
                             k->NKV);
    if (k->HS % 8 || k->HS > 256)
        return refuse_locked(st, what, "head size %d is not a multiple of 8 up to 256 (16-byte rows)", k->HS);
    for (int i = 0; i < n; i++)
        if (!ptrs[i] || !aligned16(ptrs[i]))
            return refuse_locked(st, what, "a tensor is NULL or not 16-byte aligned (%p)", ptrs[i]);
    return 0;
}

int nb_cudnn_attention_forward_bf16(const nb_backend *b, nb_bf16 *out, float *lse, const nb_bf16 *qkv, int B, int T,
                                    int NH, int NKV, int HS, nb_stream_t stream) {
    nb_attn_state *st = state_of(b);
    attn_key k = {B, T, NH, NKV, HS, 0, 1};
    const void *ptrs_in[3] = {out, lse, qkv};
    pthread_mutex_lock(&st->lock);
    dnn_plan *p = check_call_locked(st, &k, ptrs_in, 3) ? NULL : plan_locked(st, &k, stream);
    int rc = 1;
    if (p) {
        size_t kv = (size_t)NH * HS, v = (size_t)(NH + NKV) * HS;
        int64_t uids[7] = {U_Q, U_KT, U_V, U_O, U_STATS, U_SCALE, U_NEG_INF};
        void *ptrs[7] = {(void *)qkv, (void *)(qkv + kv), (void *)(qkv + v), out, lse, &p->scale, &p->neg_inf};
        rc = run_locked(st, p, uids, ptrs, 7, stream);
        if (!rc) note_locked(st, 0, NB_ATTN_RAN_CUDNN);
    }
    pthread_mutex_unlock(&st->lock);
    return rc;
}

int nb_cudnn_attention_backward_set_bf16(const nb_backend *b, nb_bf16 *dqkv, const nb_bf16 *dout, const nb_bf16 *qkv,
                                         const nb_bf16 *out, const float *lse, int B, int T, int NH, int NKV, int HS,
                                         int deterministic, nb_stream_t stream) {
    nb_attn_state *st = state_of(b);
    attn_key k = {B, T, NH, NKV, HS, 1, deterministic != 0};
    const void *ptrs_in[5] = {dqkv, dout, qkv, out, lse};
    pthread_mutex_lock(&st->lock);
    dnn_plan *p = check_call_locked(st, &k, ptrs_in, 5) ? NULL : plan_locked(st, &k, stream);
    int rc = 1;
    if (p) {
        size_t kv = (size_t)NH * HS, v = (size_t)(NH + NKV) * HS;
        /* dQ_accum last: the deterministic graph has none */
        int64_t uids[14] = {U_Q, U_KT, U_VT, U_O, U_DO, U_STATS, U_SCALE, U_ONE, U_NEG_INF, U_SOFTMAX_SUM,
                            U_DQ, U_DK, U_DV, U_DQ_ACCUM};
        void *ptrs[14] = {(void *)qkv, (void *)(qkv + kv), (void *)(qkv + v), (void *)out, (void *)dout,
                          (void *)lse, &p->scale, &p->one, &p->neg_inf, NULL, dqkv, dqkv + kv, dqkv + v, NULL};
        rc = run_locked(st, p, uids, ptrs, p->deterministic ? 13 : 14, stream);
        if (!rc) note_locked(st, 1, p->deterministic ? NB_ATTN_RAN_CUDNN : NB_ATTN_RAN_CUDNN_FAST);
    }
    pthread_mutex_unlock(&st->lock);
    return rc;
}

int nb_cudnn_available(char *why, size_t cap) {
    pthread_mutex_lock(&load_lock);
    int ok = load_locked();
    if (why && cap) snprintf(why, cap, "%s", ok ? "" : dnn_missing);
    size_t v = ok ? dnn.version : 0;
    pthread_mutex_unlock(&load_lock);
    return ok ? (int)v : 0;
}

size_t nb_cudnn_attention_workspace(const nb_backend *b, int B, int T, int NH, int NKV, int HS, int backward,
                                    int deterministic) {
    nb_attn_state *st = state_of(b);
    attn_key k = {B, T, NH, NKV, HS, backward != 0, backward ? deterministic != 0 : 1};
    pthread_mutex_lock(&st->lock);
    dnn_plan *p = find_locked(st, &k);
    size_t bytes = p && p->ok ? p->accum_bytes + p->sum_bytes + (size_t)p->cudnn_ws : 0;
    pthread_mutex_unlock(&st->lock);
    return bytes;
}

/* The plans' descriptors and the handle (once the instance's lanes are drained). */
static void free_plans(nb_attn_state *st) {
    for (int i = 0; i < MAX_PLANS; i++)
        if (st->plans[i].used) gb_free(&st->plans[i].g); /* a refused one was freed: nothing left */
    if (st->handle) dnn.destroy((cudnnHandle_t)st->handle);
    free(st->plans);
}

#else /* no cudnn_graph.h at build time: every call runs our kernels */

static int no_header(nb_attn_state *st, int backward) {
    pthread_mutex_lock(&st->lock);
    refuse_locked(st, backward ? "attention backward" : "attention forward",
                  "this build found no cudnn_graph.h (install cuDNN 9's headers under CUDA_HOME and rebuild)");
    pthread_mutex_unlock(&st->lock);
    return 1;
}

int nb_cudnn_attention_forward_bf16(const nb_backend *b, nb_bf16 *out, float *lse, const nb_bf16 *qkv, int B, int T,
                                    int NH, int NKV, int HS, nb_stream_t stream) {
    return no_header(state_of(b), 0);
}

int nb_cudnn_attention_backward_set_bf16(const nb_backend *b, nb_bf16 *dqkv, const nb_bf16 *dout, const nb_bf16 *qkv,
                                         const nb_bf16 *out, const float *lse, int B, int T, int NH, int NKV, int HS,
                                         int deterministic, nb_stream_t stream) {
    return no_header(state_of(b), 1);
}

int nb_cudnn_available(char *why, size_t cap) {
    if (why && cap) snprintf(why, cap, "this build found no cudnn_graph.h");
    return 0;
}

size_t nb_cudnn_attention_workspace(const nb_backend *b, int B, int T, int NH, int NKV, int HS, int backward,
                                    int deterministic) {
    return 0;
}
#endif /* NB_HAVE_CUDNN_H */

nb_attn_state *nb_attn_state_create(const nb_backend *b) {
    nb_attn_state *st = nb_calloc(1, sizeof *st, "the attention state of a backend instance");
    st->b = b;
    NB_CHECK(pthread_mutex_init(&st->lock, NULL) == 0, "this is a bug in nobubble; please report it",
             "pthread_mutex_init failed for the attention state");
#ifdef NB_HAVE_CUDNN_H
    st->plans = nb_calloc(MAX_PLANS, sizeof *st->plans, "the cuDNN attention plans");
#endif
    return st;
}

void nb_attn_state_destroy(nb_attn_state *st) {
    if (!st) return;
#ifdef NB_HAVE_CUDNN_H
    free_plans(st);
#endif
    pthread_mutex_destroy(&st->lock);
    free(st);
}
#endif /* NB_WITH_CUDA */
