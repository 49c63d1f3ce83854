/* What the lanes tests (test_lanes, test_lanes_cuda, test_lanes_graph) share: a check inside a
 * task, which runs on a lane's thread where CHECK's counter is not safe to bump, and the delays
 * and hash that make their tasks' timing vary from run to run on purpose. */
#ifndef NB_TEST_LANES_TEST_H
#define NB_TEST_LANES_TEST_H

#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

static atomic_int task_failures __attribute__((unused)); /* TASK_CHECK's failures; main adds them up */
#define TASK_CHECK(cond)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "  FAIL (in task) %s:%d: %s\n", __FILE__, __LINE__, #cond);            \
            atomic_fetch_add(&task_failures, 1);                                                   \
        }                                                                                          \
    } while (0)

static inline void sleep_us(long us) {
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static inline uint64_t mix64(uint64_t x) { /* splitmix64 finalizer */
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

#endif
