/* Shared by the ctr cuda rows (ctr_cuda.c, ctr_cuda_b.c): the CUDA seqctr tables against the CPU
 * table, helpers for packed histories and device up/down. Include once, under NB_WITH_CUDA. */
#ifndef NB_OT_CTR_CUDA_H
#define NB_OT_CTR_CUDA_H
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "../bf16_host.h"
#include "optest.h"
#include <cuda_runtime.h>
#include <stdarg.h>

#include "core.h"
#include "cuda_check.h"
#include "data/synth.h"
#include "model/seqctr.h"
#include "ops/backend_ctr.h"
#include "ops/ops_ctr.h"
#include "ops/ops_ctr_cuda.h"
#include "optim/optim.h"
#include "rng.h"

#define SEED 20260214u
#include "cuda_util.h"


#define CPU (&nb_ctr_ops_cpu)
static inline const nb_ctr_ops_i *gpu(int bf) { return bf ? &nb_ctr_ops_cuda_bf16 : &nb_ctr_ops_cuda_f32; }

/* ---- host helpers ---- */

static inline uint32_t rand_u32(uint64_t stream, uint64_t i) { return nb_philox(SEED, stream, i).v[0]; }

static inline float *randn_bf(size_t n, float mean, float std, int bf) {
    float *p = randn(n, mean, std);
    round_bf(p, n, bf);
    return p;
}

/* ---- device helpers (bf16 tensors are 2 bytes an element, fp32 ones 4) ---- */

/* Downloads n elements into a new host array (freed by the caller). */
static inline float *dev_get(const void *d, size_t n, int bf) {
    float *h = zeros(n);
    dev_down(h, d, n, bf);
    return h;
}

/* d + i elements of the mode's type (views into a device buffer, such as v = kv + E) */
static inline void *dev_at(void *d, size_t i, int bf) { return d ? (char *)d + i * (bf ? 2 : 4) : NULL; }

static inline int32_t *make_offsets(int B, int max_len, int *nh) {
    int32_t *off = nb_malloc(((size_t)B + 1) * sizeof(int32_t), "offsets");
    uint64_t s = ot_stream++;
    off[0] = 0;
    for (int b = 0; b < B; b++) {
        uint32_t u = rand_u32(s, (uint64_t)b);
        int len = b % 7 == 0 ? 0 : b % 11 == 1 ? 1 : b == 2 ? max_len : b == 3 ? max_len - 1
                  : u % 4 == 0 ? (int)(u >> 8) % (max_len + 1) : (int)(u >> 8) % (max_len / 8 + 2);
        off[b + 1] = off[b] + len;
    }
    *nh = off[B];
    return off;
}

#endif
