/* nobubble sample: generate text from a checkpoint, streaming tokens as they are drawn, with
 * GPT-2's tokenizer or the run's Hugging Face tokenizer (--chat: a one-turn conversation in the
 * chat template, the model answering as the assistant until its turn ends). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "commands.h"
#include "core.h"
#include "data/chat.h"
#include "data/hf_tokenizer.h"
#include "data/tokenizer.h"
#include "io/json.h"
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

/* The tokenizer sample reads and writes with: GPT-2's files or a Hugging Face tokenizer.json. */
typedef struct {
    nb_tokenizer *gpt2;
    nb_hf_tokenizer *hf;
    int tpl;         /* --chat: the template */
    int32_t stop[2]; /* --chat: the template's end of turn and eos (-1: none) */
} sample_tok;

/* A token's id by its text (an added token encodes to one id), or -1. */
static int32_t token_id(const nb_hf_tokenizer *t, const char *text) {
    int32_t *ids;
    size_t n = nb_hf_tokenizer_encode(t, text, strlen(text), 0, &ids);
    int32_t id = n == 1 ? ids[0] : -1;
    free(ids);
    return id;
}

static void token_text(const nb_hf_tokenizer *t, int32_t id, char *buf, size_t cap) {
    size_t len = 0;
    const char *b = id >= 0 ? nb_hf_tokenizer_token_bytes(t, id, &len) : NULL;
    snprintf(buf, cap, "%.*s", b && len < cap ? (int)len : 0, b ? b : "");
}

/* The prompt as tokenize --chat renders a conversation of one user turn, up to where the
 * assistant's answer starts (Llama 3 and ChatML: after the assistant header; Llama 2: after
 * [/INST]; plain: after the blank line). */
static char *chat_prompt(const sample_tok *t, const char *user) {
    nb_json_writer w;
    nb_json_writer_init(&w, 0);
    nb_json_begin_obj(&w);
    nb_json_key(&w, "messages");
    nb_json_begin_arr(&w);
    nb_json_begin_obj(&w), nb_json_kstr(&w, "role", "user"), nb_json_kstr(&w, "content", user), nb_json_end_obj(&w);
    nb_json_begin_obj(&w), nb_json_kstr(&w, "role", "assistant"), nb_json_kstr(&w, "content", ""), nb_json_end_obj(&w);
    nb_json_end_arr(&w);
    nb_json_end_obj(&w);
    nb_json *ex = nb_json_parse_or_fail(nb_json_text(&w), nb_json_len(&w), "--chat");
    nb_json_writer_free(&w);
    char bos[256], eos[256], err[512];
    token_text(t->hf, nb_hf_tokenizer_bos(t->hf), bos, sizeof bos);
    token_text(t->hf, nb_hf_tokenizer_eos(t->hf), eos, sizeof eos);
    nb_chat_out c = {0};
    NB_CHECK(!nb_chat_render(t->tpl, ex, bos, eos, &c, err, sizeof err), "pass the user's message as --chat TEXT", "--chat: %s", err);
    nb_sbuf b = {0};
    nb_sbuf_puts(&b, "");
    for (int k = 0; k < c.n && !c.seg[k].response; k++) nb_sbuf_append(&b, c.seg[k].text, c.seg[k].len);
    nb_chat_out_free(&c);
    nb_json_free(ex);
    return b.data;
}

/* --tokenizer, else the run's Hugging Face tokenizer (train --tokenizer or --init-from's), else
 * GPT-2's files in data/gpt2. */
static void open_tok(sample_tok *t, const char *flag, const nb_train_opts *o, int chat, const char *tpl_name) {
    const char *dir = flag[0] ? flag : o->tokenizer[0] ? o->tokenizer : "data/gpt2";
    memset(t, 0, sizeof *t);
    t->stop[0] = t->stop[1] = -1;
    NB_CHECK(flag[0] || !o->tokenizer[0] || nb_hf_tokenizer_present(dir), "pass the folder where it is now with --tokenizer DIR",
             "the run's tokenizer folder %s holds no tokenizer.json (moved or deleted?)", dir);
    if (!nb_hf_tokenizer_present(dir)) {
        NB_CHECK(!chat, "pass a Hugging Face tokenizer folder with --tokenizer (or sample a run that has one)",
                 "--chat needs a Hugging Face tokenizer (tokenizer.json); '%s' is GPT-2's", dir);
        t->gpt2 = nb_tokenizer_load(dir);
        return;
    }
    t->hf = nb_hf_tokenizer_load(dir);
    if (!chat) return;
    t->tpl = tpl_name[0] ? nb_chat_template_parse(tpl_name) : nb_hf_tokenizer_chat_template(t->hf);
    NB_CHECK(!tpl_name[0] || t->tpl >= 0, "pass --template llama3, chatml, qwen3, llama2 or plain", "unknown --template '%s'",
             tpl_name);
    NB_CHECK(t->tpl >= 0, "pick one with --template llama3|chatml|qwen3|llama2|plain",
             "%s/tokenizer_config.json has a chat_template nobubble does not recognize", dir);
    static const char *const end_of_turn[NB_CHAT_COUNT] = {
        [NB_CHAT_LLAMA3] = "<|eot_id|>", [NB_CHAT_CHATML] = "<|im_end|>", [NB_CHAT_QWEN3] = "<|im_end|>"};
    t->stop[0] = end_of_turn[t->tpl] ? token_id(t->hf, end_of_turn[t->tpl]) : -1;
    t->stop[1] = nb_hf_tokenizer_eos(t->hf);
}

/* The prompt's ids (never empty: a lone start token when there is no text). */
static size_t encode_prompt(const sample_tok *t, const char *prompt, int chat, int32_t **ids) {
    size_t n;
    int32_t start = NB_GPT2_EOT;
    if (t->gpt2) {
        n = nb_tokenizer_encode(t->gpt2, prompt, strlen(prompt), ids);
    } else if (chat) {
        char *text = chat_prompt(t, prompt);
        n = nb_hf_tokenizer_encode(t->hf, text, strlen(text), 0, ids);
        free(text);
    } else {
        /* the post-processor's start (Llama's bos), as transformers' tokenizer(prompt) gives it */
        n = nb_hf_tokenizer_encode(t->hf, prompt, strlen(prompt), 1, ids);
        start = nb_hf_tokenizer_bos(t->hf) >= 0 ? nb_hf_tokenizer_bos(t->hf) : nb_hf_tokenizer_eos(t->hf);
        NB_CHECK(n > 0 || start >= 0, "pass a non-empty --prompt", "the tokenizer has neither bos_token nor eos_token to start from");
    }
    if (n == 0) {
        free(*ids);
        *ids = nb_malloc(sizeof(int32_t), "prompt");
        (*ids)[n++] = start;
    }
    return n;
}

static const char *token_bytes(const sample_tok *t, int32_t id, size_t *len) {
    return t->gpt2 ? nb_tokenizer_token_bytes(t->gpt2, id, len) : nb_hf_tokenizer_token_bytes(t->hf, id, len);
}

static void print_ids(const char *what, const int32_t *ids, size_t n) {
    fprintf(stderr, "%s (%zu):", what, n);
    for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", (int)ids[i]);
    fputc('\n', stderr);
}

int nb_cmd_sample(int argc, char **argv) {
    char ckpt[NB_PATH_MAX] = "", prompt[4096] = "", tokdir[NB_PATH_MAX] = "", chat[4096] = "", tpl_name[16] = "";
    int ntok = 64, top_k = 40, threads = 0, print_tokens = 0;
    float temperature = 1.0f;
    char device[32] = "cpu";
    uint64_t seed = 42;
    nb_arg args[] = {
        {"ckpt", ARG_STR, ckpt, sizeof ckpt, "DIR", "run directory (or its ckpt/)", 0, 0, 0},
        {"device", ARG_STR, device, sizeof device, "DEV", "cpu, cuda or cuda:N", 0, 0, 0},
        {"prompt", ARG_STR, prompt, sizeof prompt, "TEXT", "text to continue (empty: start of a document)", 0, 0, 0},
        {"chat", ARG_STR, chat, sizeof chat, "TEXT",
         "a user's message: the answer the model gives as the assistant in the chat template, up to its end of turn "
         "(needs a Hugging Face tokenizer)", 0, 0, 0},
        {"template", ARG_STR, tpl_name, sizeof tpl_name, "T",
         "--chat: llama3, chatml, qwen3, llama2 or plain (default: the one tokenizer_config.json's chat_template is)", 0, 0, 0},
        {"tokens", ARG_INT, &ntok, 0, "N", "tokens to generate (at most)", 1, 0, 0},
        {"temperature", ARG_FLOAT, &temperature, 0, "X", "softmax temperature (> 0)", 0, 0, 0},
        {"top-k", ARG_INT, &top_k, 0, "K", "sample among the K most likely tokens (0: all)", 0, 0, 0},
        {"seed", ARG_U64, &seed, 0, "N", "sampling seed", 0, 0, 0},
        {"tokenizer", ARG_STR, tokdir, sizeof tokdir, "DIR",
         "GPT-2's folder (encoder.json, vocab.bpe) or a Hugging Face one (tokenizer.json); default: the run's "
         "(train --tokenizer or --init-from), else data/gpt2", 0, 0, 0},
        {"print-tokens", ARG_BOOL, &print_tokens, 0, NULL, "print the prompt's and the answer's token ids on stderr", 0, 0, 0},
        {"threads", ARG_INT, &threads, 0, "N", "CPU threads (0: all cores)", 0, 0, 0},
    };
    int nargs = (int)(sizeof args / sizeof args[0]);
    if (nb_args_parse("sample", "Generate text from a trained checkpoint.", args, nargs, argc, argv)) return 0;
    if (!ckpt[0]) nb_usage_error("sample", "--ckpt DIR is required");
    if (!(temperature > 0)) nb_usage_error("sample", "--temperature must be > 0");
    if (chat[0] && prompt[0]) nb_usage_error("sample", "--chat and --prompt exclude each other");
    if (tpl_name[0] && !chat[0]) nb_usage_error("sample", "--template goes with --chat");

    nb_train_opts o;
    char resolved[NB_PATH_MAX];
    nb_opts_from_ckpt(ckpt, 1, threads, device, &o, resolved, sizeof resolved);
    NB_CHECK(nb_family_find(o.family) == &nb_family_transformer,
             "pass a transformer's run directory (seqctr models score clicks: nobubble eval)",
             "%s holds a %s checkpoint: sample generates text", resolved, o.family);
    sample_tok tok;
    open_tok(&tok, tokdir, &o, chat[0] != 0, tpl_name);
    int32_t *ids = NULL;
    size_t n = encode_prompt(&tok, chat[0] ? chat : prompt, chat[0] != 0, &ids);
    if (print_tokens) print_ids("prompt tokens", ids, n);
    int V = o.model.vocab, T = o.model.seq;
    for (size_t i = 0; i < n; i++)
        NB_CHECK(ids[i] >= 0 && ids[i] < V, "sample with the tokenizer the model was trained with (--tokenizer DIR)",
                 "prompt token %d is outside the model's vocabulary (%d)", ids[i], V);

    o.data[0] = o.val_data[0] = 0;
    /* its T grows a token per step: under --attn auto each T >= 512 would build a cuDNN plan */
    o.attn = NB_ATTN_FA;
    static nb_run r;
    nb_run_init(&r, &o, 1);
    int32_t *ctx = nb_malloc((size_t)(n + ntok) * sizeof(int32_t), "sample context");
    memcpy(ctx, ids, n * sizeof(int32_t));
    size_t len = n;
    free(ids);
    if (!chat[0]) fwrite(prompt, 1, strlen(prompt), stdout);
    fflush(stdout);
    float *logits = nb_malloc((size_t)V * sizeof(float), "logits");
    for (int i = 0; i < ntok; i++) {
        /* the model sees at most its context length: keep the most recent tokens */
        size_t start = len > (size_t)T ? len - (size_t)T : 0;
        nb_tf_logits(&r, ctx + start, (int)(len - start), logits);
        nb_u32x4 r = nb_philox(seed, nb_rng_stream_id("sample"), (uint64_t)i);
        int next = draw(logits, V, temperature, top_k, nb_u32_to_unit(r.v[0]) - 0.5f / 16777216.0f);
        if (next == tok.stop[0] || next == tok.stop[1]) break; /* --chat: the assistant's turn is over */
        ctx[len++] = next;
        size_t blen = 0;
        const char *bytes = token_bytes(&tok, next, &blen);
        if (bytes) fwrite(bytes, 1, blen, stdout);
        fflush(stdout);
    }
    fputc('\n', stdout);
    if (print_tokens) print_ids("answer tokens", ctx + n, len - n);
    free(logits);
    free(ctx);
    nb_run_free(&r);
    nb_tokenizer_free(tok.gpt2);
    nb_hf_tokenizer_free(tok.hf);
    return 0;
}
