/* Token (+ learned position) embedding on the CPU.
 *
 * The backward is a scatter-add: several rows can carry the same token. To stay deterministic
 * without atomics, threads split the channels (not the rows): each thread owns a block of
 * channels of every dwte row and applies the rows in (b, t) order, so each dwte element sees the
 * same sequence of additions whatever the thread count. */
#include "core.h"
#include "ops/ops.h"

/* Channels per work item: 64 floats = 256 bytes, so two threads never write one cache line. */
#define NB_EMBED_CBLOCK 64

/* The contract has no vocabulary size, so only the lower bound can be checked here; token shards
 * are checked against the vocabulary when they are loaded. Done before any parallel region so
 * that nb_fail exits from the calling thread. */
static void embed_check_tokens(const int32_t *tokens, int N) {
    for (int n = 0; n < N; n++)
        NB_CHECK(tokens[n] >= 0, "the token data is corrupt; re-create the token shards",
                 "negative token id %d at position %d", (int)tokens[n], n);
}

void nb_embed_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe, int B, int T, int C) {
    NB_ASSERT(out && tokens && wte && B >= 0 && T >= 0 && C >= 0);
    int N = B * T;
    embed_check_tokens(tokens, N);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *e = wte + (size_t)tokens[n] * C;
        float *o = out + (size_t)n * C;
        if (wpe) {
            const float *p = wpe + (size_t)(n % T) * C;
            for (int i = 0; i < C; i++) o[i] = e[i] + p[i];
        } else {
            for (int i = 0; i < C; i++) o[i] = e[i];
        }
    }
}

static void embed_dwte(float *dwte, const float *dout, const int32_t *tokens, int N, int C) {
    int nblocks = (C + NB_EMBED_CBLOCK - 1) / NB_EMBED_CBLOCK;
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < nblocks; blk++) {
        int c0 = blk * NB_EMBED_CBLOCK;
        int c1 = c0 + NB_EMBED_CBLOCK < C ? c0 + NB_EMBED_CBLOCK : C;
        for (int n = 0; n < N; n++) {
            float *d = dwte + (size_t)tokens[n] * C;
            const float *g = dout + (size_t)n * C;
            for (int i = c0; i < c1; i++) d[i] += g[i];
        }
    }
}

/* Each position row t belongs to one thread, which adds the batch rows in b order. */
static void embed_dwpe(float *dwpe, const float *dout, int B, int T, int C) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        float *d = dwpe + (size_t)t * C;
        for (int b = 0; b < B; b++) {
            const float *g = dout + ((size_t)b * T + t) * C;
            for (int i = 0; i < C; i++) d[i] += g[i];
        }
    }
}

void nb_embed_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens, int B, int T, int C) {
    NB_ASSERT(dout && B >= 0 && T >= 0 && C >= 0);
    if (dwte) {
        NB_ASSERT(tokens);
        embed_check_tokens(tokens, B * T);
        embed_dwte(dwte, dout, tokens, B * T, C);
    }
    if (dwpe) embed_dwpe(dwpe, dout, B, T, C);
}
