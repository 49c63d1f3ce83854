/* Minimal test helpers: each test program runs its cases, prints "ok"/"FAIL" per case and exits
 * non-zero if any failed (77 = skipped, as in automake). tests/run.sh totals the programs. */
#ifndef NB_CHECK_H
#define NB_CHECK_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "rel_err.h"

static int nb_test_failures = 0;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "  FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                      \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            nb_test_failures++;                                                                    \
        }                                                                                          \
    } while (0)

#define TEST_CASE(name) static void name(void)
#define RUN(name)                                                                                  \
    do {                                                                                           \
        int before_ = nb_test_failures;                                                            \
        name();                                                                                    \
        printf("%s %s\n", nb_test_failures == before_ ? "ok  " : "FAIL", #name);                   \
        fflush(stdout);                                                                            \
    } while (0)
#define TEST_EXIT() return nb_test_failures ? 1 : 0

#endif
