/* GPU timings of the dense ops (perf mode; not checks): GPT-2 124M shapes (B=8, T=1024) and a
 * Llama-8B-like attention in bf16 (ops_gpt2, was test_ops_cuda --bench), issue 18's old vs new
 * sequences at gpt2 B=32 (fused_gpt2, was --bench18; also the end of --bench), and whether
 * cuBLASLt's ranked candidates give the same bits (lt_candidates, was --candidates: a report). */
#include "optest.h"

#ifdef NB_WITH_CUDA
#include "dense_cuda.h"

/* ---- timing (the ops_gpt2 perf row): GPT-2 124M shapes (B=8, T=1024) and a Llama-8B-like
 * attention, bf16. Not a test: numbers for planning the tuning work. ---- */

#define BENCH_REPS 10

static void *dev_rand_bf16(size_t n, float scale) {
    uint16_t *h = nb_malloc(n * 2, "bench staging");
    uint32_t s = 12345u;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u; /* cheap LCG: random enough, fast for 100M+ elements */
        h[i] = f2bf(scale * ((float)(s >> 8) / 16777216.0f - 0.5f));
    }
    void *d = NULL;
    CUDA_CHECK(cudaMalloc(&d, n * 2));
    CUDA_CHECK(cudaMemcpy(d, h, n * 2, cudaMemcpyHostToDevice));
    free(h);
    return d;
}

static void *dev_zero(size_t bytes) {
    void *d = NULL;
    CUDA_CHECK(cudaMalloc(&d, bytes));
    CUDA_CHECK(cudaMemset(d, 0, bytes));
    return d;
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static cudaEvent_t ev0, ev1;

/* Median of BENCH_REPS timed runs after 2 warm-ups; flop and bytes are what the op must do. */
#define BENCH(label, flop, bytes, stmt)                                                            \
    do {                                                                                           \
        float ms_[BENCH_REPS];                                                                     \
        for (int w_ = 0; w_ < 2; w_++) { stmt; }                                                   \
        for (int r_ = 0; r_ < BENCH_REPS; r_++) {                                                  \
            CUDA_CHECK(cudaEventRecord(ev0, st));                                                  \
            stmt;                                                                                  \
            CUDA_CHECK(cudaEventRecord(ev1, st));                                                  \
            CUDA_CHECK(cudaEventSynchronize(ev1));                                                 \
            CUDA_CHECK(cudaEventElapsedTime(&ms_[r_], ev0, ev1));                                  \
        }                                                                                          \
        qsort(ms_, BENCH_REPS, sizeof(float), cmp_float);                                          \
        double med_ = (ms_[BENCH_REPS / 2 - 1] + ms_[BENCH_REPS / 2]) / 2;                         \
        printf("  %-44s %9.3f ms %8.1f TFLOP/s %8.1f GB/s\n", label, med_, (flop) / med_ / 1e9,    \
               (bytes) / med_ / 1e6);                                                              \
    } while (0)

static void bench(void) {
    CUDA_CHECK(cudaEventCreate(&ev0));
    CUDA_CHECK(cudaEventCreate(&ev1));
    printf("bf16 timings, median of %d (TFLOP/s and GB/s from the minimum work and traffic)\n", BENCH_REPS);
    {
        int n = 8192;
        void *a = dev_rand_bf16((size_t)n * n, 1), *b = dev_rand_bf16((size_t)n * n, 1), *c = dev_zero((size_t)n * n * 2);
        BENCH("matmul 8192^3 (ceiling)", 2.0 * n * n * n, 6.0 * n * n,
              nb_cuda_matmul_forward_bf16(c, a, b, NULL, n, n, n, lt, st));
        dev_free(a), dev_free(b), dev_free(c);
    }
    int B = 8, T = 1024, C = 768, NH = 12, HS = 64, V = 50257, N = B * T;
    {
        int OC = 3 * C;
        void *inp = dev_rand_bf16((size_t)N * C, 1), *w = dev_rand_bf16((size_t)OC * C, 0.1f);
        void *bias = dev_rand_bf16(OC, 1), *out = dev_zero((size_t)N * OC * 2), *dout = dev_rand_bf16((size_t)N * OC, 1);
        void *dinp = dev_zero((size_t)N * C * 2), *dw = dev_zero((size_t)OC * C * 4), *db = dev_zero((size_t)OC * 4);
        BENCH("matmul fwd +bias N=8192 C=768 OC=2304", 2.0 * N * C * OC, 2.0 * ((double)N * C + (double)OC * C + (double)N * OC),
              nb_cuda_matmul_forward_bf16(out, inp, w, bias, N, C, OC, lt, st));
        BENCH("matmul bwd dinp+dw+dbias (same shape)", 4.0 * N * C * OC, 2.0 * N * OC + 4.0 * N * C + 8.0 * OC * C,
              nb_cuda_matmul_backward_bf16(dinp, dw, db, dout, inp, w, N, C, OC, lt, st));
        void *pre = dev_zero((size_t)N * 4 * C * 2), *w4 = dev_rand_bf16((size_t)4 * C * C, 0.1f);
        void *out4 = dev_zero((size_t)N * 4 * C * 2);
        BENCH("matmul+gelu fwd (fused) N=8192 C=768 OC=3072", 2.0 * N * C * 4 * C, 2.0 * ((double)N * C + 8.0 * N * C),
              nb_cuda_matmul_gelu_forward_bf16(out4, pre, inp, w4, NULL, N, C, 4 * C, lt, st));
        BENCH("gelu bwd N*3072", 0, 8.0 * N * 4 * C,
              nb_cuda_gelu_backward_bf16(out4, pre, pre, (size_t)N * 4 * C, st));
        dev_free(inp), dev_free(w), dev_free(bias), dev_free(out), dev_free(dout), dev_free(dinp), dev_free(dw);
        dev_free(db), dev_free(pre), dev_free(w4), dev_free(out4);
    }
    {
        void *x = dev_rand_bf16((size_t)N * C, 1), *w = dev_rand_bf16(C, 1), *b = dev_rand_bf16(C, 1);
        void *y = dev_zero((size_t)N * C * 2), *dy = dev_rand_bf16((size_t)N * C, 1), *dx = dev_zero((size_t)N * C * 2);
        void *mean = dev_zero((size_t)N * 4), *rstd = dev_zero((size_t)N * 4), *dw = dev_zero(C * 4), *db = dev_zero(C * 4);
        BENCH("layernorm fwd N=8192 C=768", 0, 4.0 * N * C, nb_cuda_layernorm_forward_bf16(y, mean, rstd, x, w, b, N, C, 1e-5f, st));
        BENCH("layernorm bwd (dinp, dw, db)", 0, 8.0 * N * C,
              nb_cuda_layernorm_backward_bf16(dx, dw, db, dy, x, w, mean, rstd, N, C, st));
        BENCH("residual fwd N*768", 0, 6.0 * N * C, nb_cuda_residual_forward_bf16(y, x, dy, (size_t)N * C, st));
        dev_free(x), dev_free(w), dev_free(b), dev_free(y), dev_free(dy), dev_free(dx), dev_free(mean), dev_free(rstd);
        dev_free(dw), dev_free(db);
    }
    for (int cfg = 0; cfg < 2; cfg++) {
        /* GPT-2 small; then Llama-3-8B-like heads (GQA 32/8, HS 128) at T = 4096 */
        int b_ = cfg ? 1 : B, t_ = cfg ? 4096 : T, nh = cfg ? 32 : NH, nkv = cfg ? 8 : NH, hs = cfg ? 128 : HS;
        size_t nqkv = (size_t)b_ * t_ * (nh + 2 * nkv) * hs, no = (size_t)b_ * t_ * nh * hs;
        void *qkv = dev_rand_bf16(nqkv, 2), *out = dev_zero(no * 2), *lse = dev_zero((size_t)b_ * nh * t_ * 4);
        void *dout = dev_rand_bf16(no, 1), *dqkv = dev_zero(nqkv * 2);
        double unit = (double)b_ * nh * t_ * t_ * hs; /* one causal T x T x HS product = 2 * unit / 2 */
        char label[96];
        snprintf(label, sizeof label, "attention fwd B=%d T=%d NH=%d NKV=%d HS=%d", b_, t_, nh, nkv, hs);
        BENCH(label, 2 * unit, 2.0 * (nqkv + no), nb_cuda_attention_forward_bf16(out, lse, qkv, b_, t_, nh, nkv, hs, st));
        BENCH("attention bwd (same shape)", 5 * unit, 2.0 * (2 * nqkv + 2 * no),
              nb_cuda_attention_backward_bf16(dqkv, dout, qkv, out, lse, b_, t_, nh, nkv, hs, st));
        dev_free(qkv), dev_free(out), dev_free(lse), dev_free(dout), dev_free(dqkv);
    }
    {
        int32_t *tok = nb_malloc((size_t)N * 4, "bench tokens"), *dtok = NULL;
        for (int i = 0; i < N; i++) tok[i] = (int32_t)(((unsigned)i * 2654435761u) % (unsigned)V);
        CUDA_CHECK(cudaMalloc((void **)&dtok, (size_t)N * 4));
        CUDA_CHECK(cudaMemcpy(dtok, tok, (size_t)N * 4, cudaMemcpyHostToDevice));
        int Vp = (V + 63) / 64 * 64; /* the model's padded vocabulary */
        void *wte = dev_rand_bf16((size_t)Vp * C, 1), *dout = dev_rand_bf16((size_t)N * C, 1);
        void *inp = dev_rand_bf16((size_t)N * C, 1), *dinp = dev_zero((size_t)N * C * 2);
        void *dwte = dev_zero((size_t)Vp * C * 4), *losses = dev_zero((size_t)N * 4);
        BENCH("embed bwd dwte N=8192 V=50257 C=768", 0, 2.0 * N * C + 8.0 * N * C,
              nb_cuda_embed_backward_bf16(dwte, NULL, dout, dtok, B, T, C, V, st));
        BENCH("xent fwd+bwd N=8192 C=768 V=50257", 6.0 * N * C * V, 2.0 * V * C + 8.0 * V * C,
              nb_cuda_xent_forward_backward_bf16(dinp, dwte, losses, inp, wte, dtok, N, C, V, 1.0f / N, 0, lt, st));
        BENCH("xent fwd+bwd, padded to 50304 (the trainer's)", 6.0 * N * C * Vp, 2.0 * Vp * C + 8.0 * Vp * C,
              nb_cuda_xent_padded_bf16(dinp, dwte, losses, inp, wte, dtok, N, C, V, Vp, 1.0f / N, 0, lt, st));
        CUDA_CHECK(cudaFree(dtok));
        free(tok);
        dev_free(wte), dev_free(dout), dev_free(inp), dev_free(dinp), dev_free(dwte), dev_free(losses);
    }
    {
        size_t n = 125u * 1000 * 1000; /* GPT-2 124M's slab (below) fits */
        float *p = dev_zero(n * 4), *g = dev_zero(n * 4), *m = dev_zero(n * 4), *v = dev_zero(n * 4);
        void *lp = dev_zero(n * 2);
        nb_adamw_cfg cfg = {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f};
        BENCH("adamw 125M params (+bf16 copy)", 0, 30.0 * n, nb_cuda_adamw_update(p, g, m, v, lp, n, cfg, 1, st));
        double *out = dev_zero(8);
        BENCH("sumsq 125M", 0, 4.0 * n, nb_cuda_sumsq(out, g, n, st));
        /* GPT-2 124M's tensor table (offsets aligned to 64 elements, as the model's slab) */
        nb_adamw_span sp[160];
        int ns = 0;
        size_t off = 0, lay[12] = {768, 768, 2304 * 768, 2304, 768 * 768, 768, 768, 768, 3072 * 768, 3072,
                                   768 * 3072, 768};
#define ADD_SPAN(nel, dec) (sp[ns++] = (nb_adamw_span){off, (nel), (dec) ? 0 : 1}, off += ((nel) + 63) / 64 * 64)
        ADD_SPAN((size_t)50304 * 768, 1);
        ADD_SPAN((size_t)1024 * 768, 1);
        for (int l = 0; l < 12; l++)
            for (int t = 0; t < 12; t++) ADD_SPAN(lay[t], lay[t] > 3072);
        ADD_SPAN(768, 0);
        ADD_SPAN(768, 0);
#undef ADD_SPAN
        NB_CHECK(off <= n, NULL, "bench: the GPT-2 table (%zu elements) exceeds the slab", off);
        nb_adamw_scalars hk[2] = {nb_adamw_prepare(cfg, 1), nb_adamw_prepare(cfg, 1)}, *dk = dev_zero(sizeof hk);
        CUDA_CHECK(cudaMemcpy(dk, hk, sizeof hk, cudaMemcpyHostToDevice));
        char label[96];
        snprintf(label, sizeof label, "adamw %d tensors, one launch each", ns);
        BENCH(label, 0, 30.0 * off,
              for (int i = 0; i < ns; i++) nb_cuda_adamw_apply(p + sp[i].offset, g + sp[i].offset, m + sp[i].offset,
                                                               v + sp[i].offset, (nb_bf16 *)lp + sp[i].offset,
                                                               sp[i].numel, &dk[sp[i].scalars], NULL, st));
        snprintf(label, sizeof label, "adamw %d tensors, one launch (spans)", ns);
        BENCH(label, 0, 30.0 * off, nb_cuda_adamw_apply_spans(p, g, m, v, lp, sp, ns, dk, out, 1.0f, st));
        dev_free(p), dev_free(g), dev_free(m), dev_free(v), dev_free(lp), dev_free(out), dev_free(dk);
    }
    CUDA_CHECK(cudaEventDestroy(ev0));
    CUDA_CHECK(cudaEventDestroy(ev1));
}

/* ---- issue 18 (the fused_gpt2 perf row): old vs new sequences at
 * GPT-2 124M's B=32 x T=1024 (N = 32768, C = 768, 12 heads) and llama-1b's SwiGLU width. "old" is
 * what the model ran before (memsets included), "new" the fused / writing op; the per-step
 * figure multiplies the difference by the calls a gpt2 step makes (12 layers). ---- */

#define BENCH_PAIR(label, calls, flop, bytes_old, bytes_new, old_stmt, new_stmt)                   \
    do {                                                                                           \
        char lo_[96], ln_[96];                                                                     \
        snprintf(lo_, sizeof lo_, "%s (old)", (label));                                            \
        snprintf(ln_, sizeof ln_, "%s (new)", (label));                                            \
        double o_ = bench_median(lo_, (flop), (bytes_old), ({ old_stmt; }));                       \
        double n_ = bench_median(ln_, (flop), (bytes_new), ({ new_stmt; }));                       \
        printf("  %-44s %+9.3f ms per call, %+8.2f ms per gpt2 B=32 step (x%d)\n", "  -> new - old",  \
               n_ - o_, (n_ - o_) * (calls), (calls));                                             \
    } while (0)

/* the BENCH macro's loop, returning the median (statement expressions: nvcc's host compiler and
 * gcc both take them) */
#define bench_median(label, flop, bytes, stmt)                                                     \
    ({                                                                                             \
        float ms_[BENCH_REPS];                                                                     \
        for (int w_ = 0; w_ < 2; w_++) { stmt; }                                                   \
        for (int r_ = 0; r_ < BENCH_REPS; r_++) {                                                  \
            CUDA_CHECK(cudaEventRecord(ev0, st));                                                  \
            stmt;                                                                                  \
            CUDA_CHECK(cudaEventRecord(ev1, st));                                                  \
            CUDA_CHECK(cudaEventSynchronize(ev1));                                                 \
            CUDA_CHECK(cudaEventElapsedTime(&ms_[r_], ev0, ev1));                                  \
        }                                                                                          \
        qsort(ms_, BENCH_REPS, sizeof(float), cmp_float);                                          \
        double med_ = (ms_[BENCH_REPS / 2 - 1] + ms_[BENCH_REPS / 2]) / 2;                         \
        printf("  %-44s %9.3f ms %8.1f TFLOP/s %8.1f GB/s\n", label, med_, (flop) / med_ / 1e9,    \
               (bytes) / med_ / 1e6);                                                              \
        med_;                                                                                      \
    })

/* --candidates: whether cuBLASLt's ranked candidates for one GEMM give the same bits. For each of
 * gpt2 B=32's bf16 GEMM shapes, the output with NB_LT_ALGO=k (k = 1..7; past the end of a shape's
 * list the last candidate repeats) against k = 0, element by element. A report, not a test: the
 * question is whether a timing-based pick among them could keep runs bitwise (bench/NOTES.md). */
static void report_candidates(const char *what, int kind, int N, int C, int OC) {
    const size_t ni = (size_t)N * C, no = (size_t)N * OC, nw = (size_t)OC * C;
    float *inp = randn(kind == 2 ? no : ni, 0, 1), *w = randn(nw, 0, 0.05f), *b = randn(OC, 0, 1);
    float *pre = randn(ni, 0, 1.5f);
    round_bf(inp, kind == 2 ? no : ni, 1), round_bf(w, nw, 1), round_bf(b, OC, 1), round_bf(pre, ni, 1);
    const size_t nout = kind == 2 ? ni : no;
    float *out[2] = {zeros(nout), zeros(nout)}, *aux = zeros(no);
    for (int k = 0; k < 8; k++) {
        set_env("NB_LT_ALGO", k);
        float *o = out[k ? 1 : 0];
        if (kind == 0) gpu_matmul_fwd(1, o, inp, w, b, N, C, OC);
        else if (kind == 1) gpu_matmul_gelu(1, o, aux, inp, w, b, N, C, OC);
        else {
            /* dpre[N, C] = gelu'(pre) * (dout[N, OC] @ w[OC, C]): the DGELU epilogue */
            void *ddo = dev_up(inp, no, 1), *dwt = dev_up(w, nw, 1), *dp = dev_up(pre, ni, 1);
            void *dpre = dev_nan(ni, 1);
            nb_cuda_matmul_dgelu_backward_bf16(dpre, NULL, NULL, NULL, ddo, NULL, dwt, dp, N, C, OC, lt, st);
            dev_down(o, dpre, ni, 1);
            dev_free(ddo), dev_free(dwt), dev_free(dp), dev_free(dpre);
        }
        if (k == 0) continue;
        size_t differ = 0;
        double worst = 0.0;
        for (size_t i = 0; i < nout; i++)
            if (memcmp(&out[0][i], &out[1][i], sizeof(float)) != 0) {
                differ++;
                const double d = fabs((double)out[0][i] - out[1][i]);
                if (d > worst) worst = d;
            }
        printf("    %-34s candidate %d vs 0: %s", what, k, differ ? "differs" : "same bits");
        if (differ) printf(" (%zu of %zu elements, largest difference %.3g)", differ, nout, worst);
        printf("\n");
    }
    unsetenv("NB_LT_ALGO");
    free(inp), free(w), free(b), free(pre), free(out[0]), free(out[1]), free(aux);
}

static void candidates(void) {
    printf("cuBLASLt candidates against the first, gpt2 B=32 (N = 32768) bf16 GEMMs:\n");
    report_candidates("qkv forward (bias) 768 -> 2304", 0, 32768, 768, 2304);
    report_candidates("fc forward (GELU) 768 -> 3072", 1, 32768, 768, 3072);
    report_candidates("fc-proj backward (DGELU) 3072 <- 768", 2, 32768, 3072, 768);
}

static void bench18(void) {
    if (!ev0) CUDA_CHECK(cudaEventCreate(&ev0));
    if (!ev1) CUDA_CHECK(cudaEventCreate(&ev1));
    const int B = 32, T = 1024, C = 768, NH = 12, HS = 64, F = 4 * C, L = 12;
    const int N = B * T;
    const double nc = (double)N * C, nf = (double)N * F;
    printf("issue 18 kernels, bf16, gpt2 124M B=%d T=%d (N=%d): old vs new, median of %d; ceilings ~790 TFLOP/s, "
           "~4200 GB/s\n", B, T, N, BENCH_REPS);
    void *x = dev_rand_bf16((size_t)N * C, 1), *y = dev_zero((size_t)N * C * 2), *att = dev_rand_bf16((size_t)N * C, 1);
    void *wp = dev_rand_bf16((size_t)C * C, 0.05f), *bp = dev_rand_bf16(C, 0.1f);
    void *fca = dev_rand_bf16((size_t)N * F, 1), *fch = dev_rand_bf16((size_t)N * F, 2);
    void *wfp = dev_rand_bf16((size_t)C * F, 0.03f), *bfp = dev_rand_bf16(C, 0.1f);
    void *dres = dev_rand_bf16((size_t)N * C, 1), *dfca = dev_zero((size_t)N * F * 2), *dfch = dev_zero((size_t)N * F * 2);
    float *dwfp = dev_zero((size_t)C * F * 4), *dbfp = dev_zero(C * 4), *dbfc = dev_zero(F * 4);
    float *dwp = dev_zero((size_t)C * C * 4), *dbp = dev_zero(C * 4);
    /* forward: projection + residual (attention proj: K = 768; MLP proj: K = 3072) */
    BENCH_PAIR("attn proj + residual N x 768 x 768", L, 2.0 * nc * C, 2.0 * (3 * nc + nc) + 2.0 * nc, 2.0 * 3 * nc,
               nb_cuda_matmul_forward_bf16(y, att, wp, bp, N, C, C, lt, st);
               nb_cuda_residual_forward_bf16(y, x, y, (size_t)N * C, st),
               nb_cuda_matmul_residual_forward_bf16(y, att, wp, bp, x, N, C, C, lt, st));
    BENCH_PAIR("mlp proj + residual N x 3072 x 768", L, 2.0 * nc * F, 2.0 * (nf + nc + 3 * nc), 2.0 * (nf + 2 * nc),
               nb_cuda_matmul_forward_bf16(y, fca, wfp, bfp, N, F, C, lt, st);
               nb_cuda_residual_forward_bf16(y, x, y, (size_t)N * C, st),
               nb_cuda_matmul_residual_forward_bf16(y, fca, wfp, bfp, x, N, F, C, lt, st));
    /* backward: MLP proj GEMMs + GELU backward + the fc bias gradient */
    for (int bgrad = 0; bgrad <= 1; bgrad++) {
        set_env("NB_BGRAD", bgrad);
        BENCH_PAIR(bgrad ? "mlp proj bwd + gelu bwd + fc dbias (BGRAD)" : "mlp proj bwd + gelu bwd + fc dbias", L,
                   4.0 * nc * F, 2.0 * (nc + nf) + 2.0 * 4 * nf + 2.0 * 2 * nf + 2.0 * nf + 2.0 * nf,
                   2.0 * (nc + 2 * nf + nf) + 2.0 * nf,
                   CUDA_CHECK(cudaMemsetAsync(dfca, 0, (size_t)N * F * 2, st)); /* the model zeroed both */
                   CUDA_CHECK(cudaMemsetAsync(dfch, 0, (size_t)N * F * 2, st));
                   nb_cuda_matmul_backward_bf16(dfca, dwfp, dbfp, dres, fca, wfp, N, F, C, lt, st);
                   nb_cuda_gelu_backward_bf16(dfch, fch, dfca, (size_t)N * F, st);
                   nb_cuda_matmul_backward_bf16(NULL, NULL, dbfc, dfch, NULL, NULL, N, C, F, lt, st),
                   nb_cuda_matmul_dgelu_backward_bf16(dfch, dwfp, dbfp, dbfc, dres, fca, wfp, fch, N, F, C, lt, st));
    }
    unsetenv("NB_BGRAD");
    /* dinp written instead of zeroed + accumulated: the qkv backward (dout N x 2304 -> dln N x 768) */
    {
        int OC = 3 * C;
        void *dqkv = dev_rand_bf16((size_t)N * OC, 1), *wq = dev_rand_bf16((size_t)OC * C, 0.05f);
        float *dwq = dev_zero((size_t)OC * C * 4), *dbq = dev_zero(OC * 4);
        for (int bgrad = 0; bgrad <= 1; bgrad++) {
            set_env("NB_BGRAD", bgrad);
            BENCH_PAIR(bgrad ? "qkv bwd, dinp written (BGRADB)" : "qkv bwd, dinp written", L, 4.0 * nc * OC,
                       2.0 * nc + 2.0 * ((double)N * OC * 2 + nc * 3), 2.0 * ((double)N * OC * 2 + nc * 2),
                       CUDA_CHECK(cudaMemsetAsync(y, 0, (size_t)N * C * 2, st));
                       nb_cuda_matmul_backward_bf16(y, dwq, dbq, dqkv, x, wq, N, C, OC, lt, st),
                       nb_cuda_matmul_backward_set_bf16(y, dwq, dbq, dqkv, x, wq, N, C, OC, lt, st));
        }
        unsetenv("NB_BGRAD");
        dev_free(dqkv), dev_free(wq), dev_free(dwq), dev_free(dbq);
    }
    dev_free(x), dev_free(y), dev_free(att), dev_free(wp), dev_free(bp), dev_free(fca), dev_free(fch);
    dev_free(wfp), dev_free(bfp), dev_free(dres), dev_free(dfca), dev_free(dfch), dev_free(dwfp), dev_free(dbfp);
    dev_free(dbfc), dev_free(dwp), dev_free(dbp);
    /* attention backward writing dqkv (no memset, no read-modify-write) */
    {
        size_t nqkv = (size_t)N * 3 * C, no = (size_t)N * C;
        void *qkv = dev_rand_bf16(nqkv, 2), *out = dev_zero(no * 2), *lse = dev_zero((size_t)B * NH * T * 4);
        void *dout = dev_rand_bf16(no, 1), *dqkv = dev_zero(nqkv * 2);
        nb_cuda_attention_forward_bf16(out, lse, qkv, B, T, NH, NH, HS, st);
        double unit = (double)B * NH * T * T * HS;
        BENCH_PAIR("attention bwd, dqkv written", L, 5 * unit, 2.0 * (2 * nqkv + 2 * no) + 2.0 * nqkv * 2,
                   2.0 * (2 * nqkv + 2 * no),
                   CUDA_CHECK(cudaMemsetAsync(dqkv, 0, nqkv * 2, st));
                   nb_cuda_attention_backward_bf16(dqkv, dout, qkv, out, lse, B, T, NH, NH, HS, st),
                   nb_cuda_attention_backward_set_bf16(dqkv, dout, qkv, out, lse, B, T, NH, NH, HS, st));
        dev_free(qkv), dev_free(out), dev_free(lse), dev_free(dout), dev_free(dqkv);
    }
    /* llama-1b's SwiGLU backward (B=16 x T=2048, F = 8192): written instead of zeroed + added */
    {
        int Nl = 16 * 2048, Fl = 8192;
        size_t n = (size_t)Nl * Fl;
        void *gu = dev_rand_bf16(2 * n, 2), *dy = dev_rand_bf16(n, 1), *dgu = dev_zero(4 * n);
        BENCH_PAIR("llama-1b swiglu bwd N=32768 F=8192", 16, 0, 2.0 * (2 * n + n + 2 * n + 2 * n) + 4.0 * n,
                   2.0 * (2 * n + n + 2 * n),
                   CUDA_CHECK(cudaMemsetAsync(dgu, 0, 4 * n, st));
                   nb_cuda_swiglu_backward_bf16(dgu, dy, gu, Nl, Fl, st),
                   nb_cuda_swiglu_backward_set_bf16(dgu, dy, gu, Nl, Fl, st));
        printf("  (the llama line's per-step figure is for llama-1b's 16 layers)\n");
        dev_free(gu), dev_free(dy), dev_free(dgu);
    }
}

static void perf_ops(void) {
    int v = nb_verbosity;
    nb_verbosity = 2; /* says whether the GELU epilogue was fused */
    bench();
    nb_verbosity = v;
}
static void perf_fused(void) {
    int v = nb_verbosity;
    nb_verbosity = 2; /* says where a fused epilogue fell back */
    bench18();
    nb_verbosity = v;
}
#define FN(f) f
#else
#define FN(f) NULL
#endif

static const ot_row rows[] = {
    {"ops_gpt2", "cuda", OT_BF16, "gpt2 B8 T1024, llama-8B attention", 0, OT_PERF, FN(perf_ops), 0, 0},
    {"fused_gpt2", "cuda", OT_BF16, "gpt2 B32 T1024 old vs new", 0, OT_PERF, FN(perf_fused), 0, 0},
    {"lt_candidates", "cuda", OT_BF16, "gpt2 B32 GEMMs, NB_LT_ALGO 0..7", 0, OT_PERF, FN(candidates), 0, 0},
};
OT_TABLE(ot_perf_cuda, rows);
