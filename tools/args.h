/* Long-flag parsing for the subcommands: a table of flags, "--name value" or "--name=value",
 * strict number parsing, and one-line errors (exit 2) that name the flag and what it takes. */
#ifndef NB_ARGS_H
#define NB_ARGS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum { ARG_INT, ARG_FLOAT, ARG_STR, ARG_U64, ARG_BOOL, ARG_CUSTOM } nb_arg_kind;

typedef struct {
    const char *name; /* without the leading "--" */
    nb_arg_kind kind;
    void *dst;
    size_t cap;       /* ARG_STR: buffer size */
    const char *meta; /* placeholder in --help, e.g. "N" */
    const char *help;
    int min_int;      /* ARG_INT: smallest accepted value */
    int seen;         /* set by the parser */
    int group;        /* --help section (nb_args_help's group names; 0: the first) */
} nb_arg;

/* What an ARG_CUSTOM flag's dst points to: the value goes through set (0 and a one-line reason
 * in err when it is refused), --help shows the current value through show (ctx: theirs). */
typedef struct {
    int (*set)(const void *ctx, const char *value, char *err, size_t cap);
    void (*show)(const void *ctx, char *buf, size_t cap);
    const void *ctx;
} nb_arg_custom;

/* Parse argv[1..argc) (argv[0] is the command name). Returns 1 when --help was asked (help is
 * printed to stdout), 0 otherwise; bad input prints one line to stderr and exits 2. */
int nb_args_parse(const char *cmd, const char *summary, nb_arg *args, int nargs, int argc, char **argv);
void nb_args_help(FILE *f, const char *cmd, const char *summary, const nb_arg *args, int nargs);
/* Section headings of --help by nb_arg.group (NULL-terminated; NULL: one section), and which of
 * them --help shows (a mask of 1 << group; ~0: all). */
void nb_args_set_groups(const char *const *groups, unsigned shown);
/* Text --help prints after the options (NULL: none). */
void nb_args_set_epilogue(const char *text);
/* The flag named, or NULL. */
const nb_arg *nb_args_find(const nb_arg *args, int nargs, const char *name);
/* Was --name given? */
int nb_args_seen(const nb_arg *args, int nargs, const char *name);
/* Print "nobubble <cmd>: error: ..." and exit 2. */
void nb_usage_error(const char *cmd, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));

#endif
