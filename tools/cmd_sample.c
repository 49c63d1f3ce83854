/* nobubble sample: generate text from a checkpoint, streaming tokens as they are drawn. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "commands.h"
#include "core.h"
#include "data/tokenizer.h"
#include "family/family.h"
#include "family/transformer.h"
#include "ops/ops.h"
#include "rng.h"
#include "run/run.h"

void nb_opts_from_ckpt(const char *dir, int batch, int threads, const char *device, nb_train_opts *o, char *resolved,
                       size_t cap);

/* Draw from softmax(logits / temperature) restricted to the top_k largest (0: all). */
static int draw(float *logits, int V, float temperature, int top_k, float u) {
    if (top_k > 0 && top_k < V) {
        /* threshold = k-th largest logit, by partial selection on a copy */
        float *tmp = nb_malloc((size_t)V * sizeof(float), "top-k scratch");
        memcpy(tmp, logits, (size_t)V * sizeof(float));
        float kth = -INFINITY;
        for (int k = 0; k < top_k; k++) {
            int best = 0;
            for (int i = 1; i < V; i++)
                if (tmp[i] > tmp[best]) best = i;
            kth = tmp[best];
            tmp[best] = -INFINITY;
        }
        free(tmp);
        for (int i = 0; i < V; i++)
            if (logits[i] < kth) logits[i] = -INFINITY;
    }
    nb_softmax_inplace(logits, V, temperature);
    double c = 0;
    for (int i = 0; i < V; i++) {
        c += logits[i];
        if (u < c) return i;
    }
    for (int i = V - 1; i >= 0; i--)
        if (logits[i] > 0) return i;
    return V - 1;
}

int nb_cmd_sample(int argc, char **argv) {
    char ckpt[NB_PATH_MAX] = "", prompt[4096] = "", tokdir[NB_PATH_MAX] = "data/gpt2";
    int ntok = 64, top_k = 40, threads = 0;
    float temperature = 1.0f;
    char device[32] = "cpu";
    uint64_t seed = 42;
    nb_arg args[] = {
        {"ckpt", ARG_STR, ckpt, sizeof ckpt, "DIR", "run directory (or its ckpt/)", 0, 0, 0},
        {"device", ARG_STR, device, sizeof device, "DEV", "cpu, cuda or cuda:N", 0, 0, 0},
        {"prompt", ARG_STR, prompt, sizeof prompt, "TEXT", "text to continue (empty: start of a document)", 0, 0, 0},
        {"tokens", ARG_INT, &ntok, 0, "N", "tokens to generate", 1, 0, 0},
        {"temperature", ARG_FLOAT, &temperature, 0, "X", "softmax temperature (> 0)", 0, 0, 0},
        {"top-k", ARG_INT, &top_k, 0, "K", "sample among the K most likely tokens (0: all)", 0, 0, 0},
        {"seed", ARG_U64, &seed, 0, "N", "sampling seed", 0, 0, 0},
        {"tokenizer", ARG_STR, tokdir, sizeof tokdir, "DIR", "folder with encoder.json and vocab.bpe", 0, 0, 0},
        {"threads", ARG_INT, &threads, 0, "N", "CPU threads (0: all cores)", 0, 0, 0},
    };
    int nargs = (int)(sizeof args / sizeof args[0]);
    if (nb_args_parse("sample", "Generate text from a trained checkpoint.", args, nargs, argc, argv)) return 0;
    if (!ckpt[0]) nb_usage_error("sample", "--ckpt DIR is required");
    if (!(temperature > 0)) nb_usage_error("sample", "--temperature must be > 0");

    nb_tokenizer *tok = nb_tokenizer_load(tokdir);
    nb_train_opts o;
    char resolved[NB_PATH_MAX];
    nb_opts_from_ckpt(ckpt, 1, threads, device, &o, resolved, sizeof resolved);
    NB_CHECK(nb_family_find(o.family) == &nb_family_transformer,
             "pass a transformer's run directory (seqctr models score clicks: nobubble eval)",
             "%s holds a %s checkpoint: sample generates text", resolved, o.family);
    o.data[0] = o.val_data[0] = 0;
    /* its T grows a token per step: under --attn auto each T >= 512 would build a cuDNN plan */
    o.attn = NB_ATTN_FA;
    static nb_run r;
    nb_run_init(&r, &o, 1);
    int V = o.model.vocab, T = o.model.seq;

    int32_t *ids = NULL;
    size_t n = nb_tokenizer_encode(tok, prompt, strlen(prompt), &ids);
    int32_t *ctx = nb_malloc((size_t)(n + 1 + ntok) * sizeof(int32_t), "sample context");
    size_t len = 0;
    if (n == 0) ctx[len++] = NB_GPT2_EOT;
    for (size_t i = 0; i < n; i++) {
        NB_CHECK(ids[i] < V, "use a checkpoint trained with the GPT-2 vocabulary", "prompt token %d is outside the model's vocabulary (%d)",
                 ids[i], V);
        ctx[len++] = ids[i];
    }
    free(ids);
    fwrite(prompt, 1, strlen(prompt), stdout);
    fflush(stdout);
    float *logits = nb_malloc((size_t)V * sizeof(float), "logits");
    for (int i = 0; i < ntok; i++) {
        /* the model sees at most its context length: keep the most recent tokens */
        size_t start = len > (size_t)T ? len - (size_t)T : 0;
        nb_tf_logits(&r, ctx + start, (int)(len - start), logits);
        nb_u32x4 r = nb_philox(seed, nb_rng_stream_id("sample"), (uint64_t)i);
        int next = draw(logits, V, temperature, top_k, nb_u32_to_unit(r.v[0]) - 0.5f / 16777216.0f);
        ctx[len++] = next;
        size_t blen = 0;
        const char *bytes = nb_tokenizer_token_bytes(tok, next, &blen);
        if (bytes) fwrite(bytes, 1, blen, stdout);
        fflush(stdout);
    }
    fputc('\n', stdout);
    free(logits);
    free(ctx);
    nb_run_free(&r);
    nb_tokenizer_free(tok);
    return 0;
}
