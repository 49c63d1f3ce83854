#include "args.h"

#include "core.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

void nb_usage_error(const char *cmd, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "nobubble %s: error: %s (hint: run 'nobubble %s --help')\n", cmd, msg, cmd);
    exit(2);
}

static const char *kind_meta(const nb_arg *a) {
    if (a->meta) return a->meta;
    switch (a->kind) {
    case ARG_INT: return "N";
    case ARG_FLOAT: return "X";
    case ARG_U64: return "N";
    case ARG_STR: return "S";
    default: return "";
    }
}

static const char *const *help_groups;
static unsigned help_shown = ~0u;
static const char *help_epilogue;
void nb_args_set_groups(const char *const *groups, unsigned shown) {
    help_groups = groups;
    help_shown = shown;
}
void nb_args_set_epilogue(const char *text) { help_epilogue = text; }

static void help_line(FILE *f, const nb_arg *a);

void nb_args_help(FILE *f, const char *cmd, const char *summary, const nb_arg *args, int nargs) {
    fprintf(f, "usage: nobubble %s [options]\n\n%s\n", cmd, summary);
    int ngroups = 1;
    while (help_groups && help_groups[ngroups]) ngroups++;
    for (int g = 0; g < ngroups; g++) {
        if (!(help_shown & (1u << g))) continue;
        fprintf(f, "\n%s:\n", help_groups ? help_groups[g] : "options");
        for (int i = 0; i < nargs; i++)
            if (args[i].group == g) help_line(f, &args[i]);
    }
    fprintf(f, "  %-24s %s\n", "--help", "print this help and exit");
    if (help_epilogue) fprintf(f, "\n%s", help_epilogue);
}

const nb_arg *nb_args_find(const nb_arg *args, int nargs, const char *name) {
    for (int i = 0; i < nargs; i++)
        if (!strcmp(args[i].name, name)) return &args[i];
    return NULL;
}

static void help_line(FILE *f, const nb_arg *a) {
    char left[64];
    snprintf(left, sizeof left, "--%s %s", a->name, a->kind == ARG_BOOL ? "" : kind_meta(a));
    fprintf(f, "  %-24s %s", left, a->help);
    if (strstr(a->help, "(required)")) { /* a required flag has no default to show */
        fputc('\n', f);
        return;
    }
    switch (a->kind) {
    case ARG_INT: fprintf(f, " [%d]", *(int *)a->dst); break;
    case ARG_FLOAT: fprintf(f, " [%g]", *(float *)a->dst); break;
    case ARG_U64: fprintf(f, " [%llu]", (unsigned long long)*(uint64_t *)a->dst); break;
    case ARG_STR:
        if (((char *)a->dst)[0]) fprintf(f, " [%s]", (char *)a->dst);
        break;
    case ARG_CUSTOM: {
        const nb_arg_custom *c = a->dst;
        char v[128] = "";
        if (c->show) c->show(c->ctx, v, sizeof v);
        if (v[0]) fprintf(f, " [%s]", v);
        break;
    }
    default: break;
    }
    fputc('\n', f);
}

static void set_value(const char *cmd, nb_arg *a, const char *v) {
    char *end = NULL;
    errno = 0;
    switch (a->kind) {
    case ARG_INT: {
        long x = strtol(v, &end, 10);
        if (!*v || *end || errno || x < INT_MIN || x > INT_MAX)
            nb_usage_error(cmd, "--%s takes an integer, got '%s'", a->name, v);
        if (x < a->min_int) nb_usage_error(cmd, "--%s takes a value >= %d, got %ld", a->name, a->min_int, x);
        *(int *)a->dst = (int)x;
        break;
    }
    case ARG_U64: {
        unsigned long long x = strtoull(v, &end, 10);
        if (!*v || *end || errno || v[0] == '-') nb_usage_error(cmd, "--%s takes a non-negative integer, got '%s'", a->name, v);
        *(uint64_t *)a->dst = x;
        break;
    }
    case ARG_FLOAT: {
        float x = strtof(v, &end);
        if (!*v || *end || errno || !isfinite(x)) nb_usage_error(cmd, "--%s takes a number, got '%s'", a->name, v);
        *(float *)a->dst = x;
        break;
    }
    case ARG_STR:
        if (strlen(v) >= a->cap) nb_usage_error(cmd, "--%s value is longer than %zu bytes", a->name, a->cap - 1);
        memcpy(a->dst, v, strlen(v) + 1);
        break;
    case ARG_BOOL: *(int *)a->dst = 1; break;
    case ARG_CUSTOM: {
        const nb_arg_custom *c = a->dst;
        char err[512];
        if (!c->set(c->ctx, v, err, sizeof err)) nb_usage_error(cmd, "%s", err);
        break;
    }
    }
    a->seen = 1;
}

/* Edit distance (insertions, deletions, substitutions, swaps of neighbours) between a and
 * b[0..bn), capped at 9. */
static int edit_distance(const char *a, const char *b, size_t bn) {
    size_t an = strlen(a);
    if (an > 63 || bn > 63) return 9;
    int d[64][64];
    for (size_t i = 0; i <= an; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= bn; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= an; i++)
        for (size_t j = 1; j <= bn; j++) {
            int sub = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]), del = d[i - 1][j] + 1, ins = d[i][j - 1] + 1;
            d[i][j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < d[i][j])
                d[i][j] = d[i - 2][j - 2] + 1;
        }
    return d[an][bn] < 9 ? d[an][bn] : 9;
}

/* "unknown flag '--stpes' (did you mean --steps?)": the nearest flag within a third of its length */
static void unknown_flag(const char *cmd, const nb_arg *args, int nargs, const char *name, size_t nlen) {
    const char *best = NULL;
    int best_d = 9;
    for (int k = 0; k < nargs; k++) {
        int d = edit_distance(args[k].name, name, nlen);
        int limit = (int)strlen(args[k].name) / 3 > 1 ? (int)strlen(args[k].name) / 3 : 1;
        if (d <= limit && d < best_d) best = args[k].name, best_d = d;
    }
    if (best) nb_usage_error(cmd, "unknown flag '--%.*s' (did you mean --%s?)", (int)nlen, name, best);
    nb_usage_error(cmd, "unknown flag '--%.*s'", (int)nlen, name);
}

int nb_args_parse(const char *cmd, const char *summary, nb_arg *args, int nargs, int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        if (!strcmp(s, "--help") || !strcmp(s, "-h")) {
            nb_args_help(stdout, cmd, summary, args, nargs);
            return 1;
        }
        /* an existing file here is most often the second match of a glob the shell expanded */
        if (strncmp(s, "--", 2) != 0)
            nb_usage_error(cmd, "unexpected argument '%s' (flags start with --%s)", s,
                           nb_file_exists(s) ? "; several shards: quote the glob, --data 'data/x/train_*.bin', or join "
                                               "them with commas, --data a.bin,b.bin"
                                             : "");
        const char *name = s + 2, *eq = strchr(name, '=');
        size_t nlen = eq ? (size_t)(eq - name) : strlen(name);
        nb_arg *a = NULL;
        for (int k = 0; k < nargs; k++)
            if (strlen(args[k].name) == nlen && !strncmp(args[k].name, name, nlen)) a = &args[k];
        if (!a) unknown_flag(cmd, args, nargs, name, nlen);
        if (a->kind == ARG_BOOL) {
            if (eq) nb_usage_error(cmd, "--%s takes no value", a->name);
            set_value(cmd, a, "");
            continue;
        }
        const char *v = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!v) nb_usage_error(cmd, "--%s needs a value", a->name);
        set_value(cmd, a, v);
    }
    return 0;
}

int nb_args_seen(const nb_arg *args, int nargs, const char *name) {
    for (int i = 0; i < nargs; i++)
        if (!strcmp(args[i].name, name)) return args[i].seen;
    return 0;
}
