/* Chat and instruction examples -> template text segments (see chat.h). */
#include "data/chat.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"

static const char *names[NB_CHAT_COUNT] = {"plain", "llama3", "chatml", "llama2", "qwen3"};

int nb_chat_template_parse(const char *name) {
    for (int i = 0; i < NB_CHAT_COUNT; i++)
        if (!strcmp(name, names[i])) return i;
    return -1;
}

const char *nb_chat_template_name(nb_chat_template t) { return names[t]; }

typedef enum { ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT } role;
static const char *role_names[] = {"system", "user", "assistant"};

typedef struct {
    role r;
    const char *text;
    size_t len;
} msg;

#define MAX_TURNS 4096

static int fail(char *err, size_t cap, const char *fmt, ...) NB_PRINTF(3, 4);
static int fail(char *err, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, cap, fmt, ap);
    va_end(ap);
    return -1;
}

static const nb_json *str_field(const nb_json *obj, const char *key, int required, const char *where, char *err,
                                size_t cap, int *bad) {
    const nb_json *v = nb_json_get(obj, key);
    if (!v || v->type == NB_JSON_NULL) {
        if (required) *bad = fail(err, cap, "%s%s: missing", where, key);
        return NULL;
    }
    if (v->type != NB_JSON_STR) {
        *bad = fail(err, cap, "%s%s: is a %s, expected a string", where, key, nb_json_type_name(v->type));
        return NULL;
    }
    return v;
}

static int role_of(const char *s, role *r) {
    if (!strcmp(s, "system")) return *r = ROLE_SYSTEM, 0;
    if (!strcmp(s, "user") || !strcmp(s, "human")) return *r = ROLE_USER, 0;
    if (!strcmp(s, "assistant") || !strcmp(s, "gpt")) return *r = ROLE_ASSISTANT, 0;
    return -1;
}

/* The example's turns, whichever layout it has. */
static int parse_turns(const nb_json *ex, msg *m, int *n, char *err, size_t cap) {
    int bad = 0;
    *n = 0;
    if (ex->type != NB_JSON_OBJ) return fail(err, cap, "expected a JSON object, found a %s", nb_json_type_name(ex->type));
    const nb_json *list = nb_json_get(ex, "messages");
    const char *rk = "role", *ck = "content", *lk = "messages";
    if (!list) list = nb_json_get(ex, "conversations"), rk = "from", ck = "value", lk = "conversations";
    if (!list) {
        const nb_json *ins = str_field(ex, "instruction", 1, "", err, cap, &bad);
        if (bad) return fail(err, cap, "%s (an example has instruction/output, conversations or messages)", err);
        const nb_json *in = str_field(ex, "input", 0, "", err, cap, &bad);
        const nb_json *out = str_field(ex, "output", 1, "", err, cap, &bad);
        if (bad) return -1;
        /* alpaca: the input, when there is one, follows the instruction after a blank line */
        size_t len = ins->len + (in && in->len ? 2 + in->len : 0);
        char *u = nb_malloc(len + 1, "instruction");
        memcpy(u, ins->str, ins->len);
        if (in && in->len) memcpy(u + ins->len, "\n\n", 2), memcpy(u + ins->len + 2, in->str, in->len);
        u[len] = 0;
        m[0] = (msg){ROLE_USER, u, len};
        m[1] = (msg){ROLE_ASSISTANT, out->str, out->len};
        *n = 2;
        return 1; /* m[0].text is owned */
    }
    if (list->type != NB_JSON_ARR) return fail(err, cap, "%s: expected an array", lk);
    if (list->len == 0) return fail(err, cap, "%s: is empty", lk);
    if (list->len > MAX_TURNS) return fail(err, cap, "%s: more than %d turns", lk, MAX_TURNS);
    for (size_t i = 0; i < list->len; i++) {
        char where[64];
        snprintf(where, sizeof where, "%s[%zu].", lk, i);
        const nb_json *t = &list->items[i];
        if (t->type != NB_JSON_OBJ) return fail(err, cap, "%s[%zu]: expected an object", lk, i);
        const nb_json *r = str_field(t, rk, 1, where, err, cap, &bad);
        const nb_json *c = bad ? NULL : str_field(t, ck, 1, where, err, cap, &bad);
        if (bad) return -1;
        if (role_of(r->str, &m[*n].r))
            return fail(err, cap, "%s%s: '%s' is not a role (system, user/human, assistant/gpt)", where, rk, r->str);
        if (m[*n].r == ROLE_SYSTEM && i != 0) return fail(err, cap, "%s%s: a system turn must come first", where, rk);
        m[*n].text = c->str, m[*n].len = c->len;
        (*n)++;
    }
    int has_assistant = 0;
    for (int i = 0; i < *n; i++) has_assistant |= m[i].r == ROLE_ASSISTANT;
    if (!has_assistant) return fail(err, cap, "%s: has no assistant turn to train on", lk);
    return 0;
}

static void add(nb_chat_out *o, int response, const char *a, size_t al, const char *b, size_t bl, const char *c, size_t cl) {
    if (o->n == o->cap) {
        o->cap = o->cap ? 2 * o->cap : 16;
        o->seg = realloc(o->seg, (size_t)o->cap * sizeof *o->seg);
        NB_CHECK(o->seg, NULL, "out of host memory rendering a conversation");
    }
    char *t = nb_malloc(al + bl + cl + 1, "conversation text");
    memcpy(t, a, al), memcpy(t + al, b, bl), memcpy(t + al + bl, c, cl);
    t[al + bl + cl] = 0;
    o->seg[o->n++] = (nb_chat_seg){t, al + bl + cl, response};
}
#define S(x) (x), strlen(x)

/* Python's str.strip() of the characters Jinja's trim removes (ASCII whitespace is enough for the
 * turns seen in practice; other Unicode spaces are kept). */
static int ascii_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

static void trim(const char **s, size_t *n) {
    while (*n && ascii_space((*s)[0])) (*s)++, (*n)--;
    while (*n && ascii_space((*s)[*n - 1])) (*n)--;
}

/* The first occurrence of needle in s[0..n), or NULL; last: the last one. */
static const char *find(const char *s, size_t n, const char *needle, int last) {
    size_t k = strlen(needle);
    const char *hit = NULL;
    for (size_t i = 0; i + k <= n; i++)
        if (!memcmp(s + i, needle, k)) {
            hit = s + i;
            if (!last) break;
        }
    return hit;
}

static void strip_newlines(const char **s, size_t *n, int front, int back) {
    while (front && *n && (*s)[0] == '\n') (*s)++, (*n)--;
    while (back && *n && (*s)[*n - 1] == '\n') (*n)--;
}

/* An assistant turn of Qwen3's template: a content holding </think> splits into reasoning (after
 * the last <think> before the first </think>) and the answer (after the last </think>); turns
 * after the last user turn keep a thinking block (the last turn always, empty or not). */
static void qwen3_assistant(const msg *m, int i, int n, int last_query, nb_chat_out *o) {
    const char *c = m[i].text, *r = "";
    size_t cl = m[i].len, rl = 0;
    const char *close = find(c, cl, "</think>", 0);
    if (close) {
        const char *after = find(c, cl, "</think>", 1) + 8;
        r = c, rl = (size_t)(close - c);
        strip_newlines(&r, &rl, 0, 1);
        const char *open = find(r, rl, "<think>", 1);
        if (open) rl -= (size_t)(open + 7 - r), r = open + 7;
        strip_newlines(&r, &rl, 1, 0);
        cl -= (size_t)(after - c), c = after;
        strip_newlines(&c, &cl, 1, 0);
    }
    add(o, 0, S("<|im_start|>assistant\n"), "", 0, "", 0);
    if (i > last_query && (i == n - 1 || rl)) {
        strip_newlines(&r, &rl, 1, 1);
        strip_newlines(&c, &cl, 1, 0);
        add(o, 1, S("<think>\n"), r, rl, S("\n</think>\n\n"));
    }
    add(o, 1, c, cl, S("<|im_end|>"), "", 0);
    add(o, 0, S("\n"), "", 0, "", 0);
}

static void render_qwen3(const msg *m, int n, nb_chat_out *o) {
    int last_query = n - 1;
    for (int i = n - 1; i >= 0; i--)
        if (m[i].r == ROLE_USER) {
            last_query = i;
            break;
        }
    for (int i = 0; i < n; i++) {
        if (m[i].r == ROLE_ASSISTANT) {
            qwen3_assistant(m, i, n, last_query, o);
            continue;
        }
        add(o, 0, S("<|im_start|>"), S(role_names[m[i].r]), S("\n"));
        add(o, 0, m[i].text, m[i].len, S("<|im_end|>\n"), "", 0);
    }
}

static void render(nb_chat_template tpl, const msg *m, int n, const char *bos, const char *eos, nb_chat_out *o) {
    if (tpl == NB_CHAT_QWEN3) {
        render_qwen3(m, n, o);
        return;
    }
    int first_user = 1;
    for (int i = 0; i < n; i++) {
        const char *t = m[i].text;
        size_t len = m[i].len;
        int resp = m[i].r == ROLE_ASSISTANT;
        const char *role = role_names[m[i].r];
        if (tpl == NB_CHAT_LLAMA3) {
            trim(&t, &len);
            add(o, 0, S(i == 0 ? bos : ""), S("<|start_header_id|>"), S(role));
            add(o, 0, S("<|end_header_id|>\n\n"), "", 0, "", 0);
            add(o, resp, t, len, S("<|eot_id|>"), "", 0);
        } else if (tpl == NB_CHAT_CHATML) {
            add(o, 0, S("<|im_start|>"), S(role), S("\n"));
            add(o, resp, t, len, S("<|im_end|>"), "", 0);
            add(o, 0, S("\n"), "", 0, "", 0);
        } else if (tpl == NB_CHAT_LLAMA2) {
            trim(&t, &len);
            if (m[i].r == ROLE_SYSTEM) continue; /* folded into the first user turn below */
            if (!resp) {
                add(o, 0, S(bos), S("[INST] "), "", 0);
                if (first_user && m[0].r == ROLE_SYSTEM) {
                    const char *st = m[0].text;
                    size_t sl = m[0].len;
                    trim(&st, &sl);
                    add(o, 0, S("<<SYS>>\n"), st, sl, S("\n<</SYS>>\n\n"));
                }
                add(o, 0, t, len, S(" [/INST]"), "", 0);
                first_user = 0;
            } else {
                add(o, 1, S(" "), t, len, S(" "));
                add(o, 1, S(eos), "", 0, "", 0);
            }
        } else {
            if (resp) add(o, 1, t, len, S(eos), "", 0);
            else add(o, 0, t, len, S("\n\n"), "", 0);
        }
    }
}

int nb_chat_render(nb_chat_template tpl, const nb_json *example, const char *bos, const char *eos, nb_chat_out *out,
                   char *err, size_t errcap) {
    msg *m = nb_malloc(sizeof(msg) * (MAX_TURNS + 2), "conversation turns");
    int n, owned = parse_turns(example, m, &n, err, errcap);
    if (owned >= 0) render(tpl, m, n, bos, eos, out);
    if (owned == 1) free((char *)m[0].text);
    free(m);
    return owned < 0 ? -1 : 0;
}

void nb_chat_out_clear(nb_chat_out *o) {
    for (int i = 0; i < o->n; i++) free(o->seg[i].text);
    o->n = 0;
}

void nb_chat_out_free(nb_chat_out *o) {
    nb_chat_out_clear(o);
    free(o->seg);
    o->seg = NULL, o->cap = 0;
}
