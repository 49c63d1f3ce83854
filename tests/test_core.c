/* core: Philox known answers, RNG determinism and distribution, arenas that refuse an
 * over-budget plan with needed vs available, tensor views, byte formatting, the streaming copy,
 * input files (anything but a regular file refused before a read could block; size caps). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "core.h"
#include "host.h"
#include "rng.h"
#include "tensor.h"

/* Known-answer vectors of Philox4x32-10 from Random123 (kat_vectors): counter, key -> output.
 * nb_philox(seed, stream, offset) uses counter = (offset lo, offset hi, stream lo, stream hi)
 * and key = (seed lo, seed hi). */
TEST_CASE(test_philox_known_answers) {
    struct { uint32_t ctr[4], key[2], out[4]; } kat[] = {
        {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
        {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff},
         {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
        {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0},
         {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
    };
    for (size_t i = 0; i < sizeof kat / sizeof kat[0]; i++) {
        uint64_t offset = kat[i].ctr[0] | (uint64_t)kat[i].ctr[1] << 32;
        uint64_t stream = kat[i].ctr[2] | (uint64_t)kat[i].ctr[3] << 32;
        uint64_t seed = kat[i].key[0] | (uint64_t)kat[i].key[1] << 32;
        nb_u32x4 r = nb_philox(seed, stream, offset);
        for (int j = 0; j < 4; j++) CHECK(r.v[j] == kat[i].out[j], "vector %zu word %d: %08x != %08x", i, j, r.v[j], kat[i].out[j]);
    }
}

TEST_CASE(test_normal_fill) {
    size_t n = 1 << 18;
    float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float)), *c = malloc(n * sizeof(float));
    nb_rng_fill_normal(a, n, 7, nb_rng_stream_id("w"), 0.0f, 1.0f);
    nb_rng_fill_normal(b, n, 7, nb_rng_stream_id("w"), 0.0f, 1.0f);
    nb_rng_fill_normal(c, n, 7, nb_rng_stream_id("other"), 0.0f, 1.0f);
    CHECK(memcmp(a, b, n * sizeof(float)) == 0, "same key, different numbers");
    CHECK(memcmp(a, c, n * sizeof(float)) != 0, "different streams, same numbers");
    double s = 0, s2 = 0;
    for (size_t i = 0; i < n; i++) s += a[i], s2 += (double)a[i] * a[i];
    double mean = s / n, var = s2 / n - mean * mean;
    CHECK(fabs(mean) < 0.01 && fabs(var - 1.0) < 0.01, "mean %g var %g", mean, var);
    /* element i depends only on (seed, stream, i): a suffix drawn alone matches */
    CHECK(nb_rng_normal_at(7, nb_rng_stream_id("w"), 12345) == a[12345], "random access differs");
    /* the fill makes Box-Muller pairs together: every element (an odd count's last one too, and
     * a mean and std applied) is still nb_rng_normal_at's (random access to the stream) */
    size_t odd = 100001, bad = 0;
    nb_rng_fill_normal(b, odd, 11, 5, 0.25f, 0.02f);
    for (size_t i = 0; i < odd; i++) bad += b[i] != 0.25f + 0.02f * nb_rng_normal_at(11, 5, i);
    CHECK(bad == 0, "%zu of %zu elements differ from nb_rng_normal_at", bad, odd);
    float u[1001];
    nb_rng_fill_uniform(u, 1001, 3, 4, -2.0f, 5.0f);
    int ok = 1;
    for (int i = 0; i < 1001; i++) ok &= u[i] >= -2.0f && u[i] < 5.0f;
    CHECK(ok, "uniform out of range");
    free(a), free(b), free(c);
}

TEST_CASE(test_arena_plan_and_views) {
    nb_arena a;
    nb_arena_init(&a, "test", (nb_device){NB_DEV_CPU, 0}, 0, nb_host_allocator);
    int64_t s1[2] = {3, 5}, s2[1] = {7};
    nb_tensor t1 = nb_arena_plan(&a, "t1", NB_F32, 2, s1);
    nb_tensor t2 = nb_arena_plan(&a, "t2", NB_BF16, 1, s2);
    CHECK(t1.offset % NB_ALIGN == 0 && t2.offset % NB_ALIGN == 0, "unaligned offsets");
    CHECK(nb_tensor_bytes(&t1) == 60 && nb_tensor_bytes(&t2) == 14, "bytes %zu %zu", nb_tensor_bytes(&t1),
          nb_tensor_bytes(&t2));
    CHECK(nb_tensor_data(&t1) == NULL, "data before allocation");
    nb_arena_alloc(&a, "hint");
    float *p = nb_tensor_data(&t1);
    CHECK(p && (uintptr_t)p % NB_ALIGN == 0, "data not aligned");
    CHECK((char *)nb_tensor_data(&t2) >= (char *)p + 60, "tensors overlap");
    CHECK(!strcmp(nb_dtype_name(NB_BF16), "BF16"), "dtype name");
    nb_arena_free(&a);
}

/* Over budget: the process exits 1 with one line naming needed and available bytes. */
TEST_CASE(test_arena_over_budget) {
    int fds[2];
    CHECK(pipe(fds) == 0, "pipe");
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 2);
        nb_arena a;
        nb_arena_init(&a, "device", (nb_device){NB_DEV_CPU, 0}, 1000, nb_host_allocator);
        nb_arena_plan_bytes(&a, 5000);
        nb_arena_alloc(&a, "lower --batch");
        _exit(0);
    }
    close(fds[1]);
    char buf[512] = {0};
    ssize_t n = read(fds[0], buf, sizeof buf - 1);
    close(fds[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK(n > 0 && WIFEXITED(st) && WEXITSTATUS(st) == 1, "exit status %d", st);
    CHECK(strstr(buf, "needs 5.00 KiB but only 1000 B is available") && strstr(buf, "lower --batch"), "message: %s", buf);
}

TEST_CASE(test_fmt_bytes) {
    char b[32];
    CHECK(!strcmp(nb_fmt_bytes(b, sizeof b, 512), "512 B"), "%s", b);
    CHECK(!strcmp(nb_fmt_bytes(b, sizeof b, 1.5 * 1024 * 1024 * 1024), "1.50 GiB"), "%s", b);
}

/* nb_copy_stream is memcpy whatever the sizes and alignments (streaming stores on the aligned
 * middle, plain copies around it), and leaves the bytes past the end alone. */
TEST_CASE(test_copy_stream) {
    enum { N = 4096 + 192 };
    static unsigned char src[N], dst[N + 64];
    for (int i = 0; i < N; i++) src[i] = (unsigned char)(i * 131 + 7);
    size_t sizes[] = {0, 1, 63, 255, 256, 257, 1000, 4096, 4096 + 100};
    for (int a = 0; a < 32; a += 3)
        for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
            memset(dst, 0xA5, sizeof dst);
            nb_copy_stream(dst + a, src + (a * 5) % 17, sizes[k]);
            CHECK(!memcmp(dst + a, src + (a * 5) % 17, sizes[k]), "offset %d size %zu", a, sizes[k]);
            CHECK(dst[a + sizes[k]] == 0xA5 && (a == 0 || dst[a - 1] == 0xA5), "offset %d size %zu wrote outside", a, sizes[k]);
        }
}

/* Runs fn(arg) in a child with a 10 s alarm (a blocking open must fail the test, not hang it).
 * The child must exit 1 with exactly one "nobubble: error:" line containing want. */
static void expect_death(void (*fn)(const char *), const char *arg, const char *want) {
    int fds[2];
    CHECK(pipe(fds) == 0, "pipe");
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], 2);
        alarm(10);
        fn(arg);
        _exit(0);
    }
    close(fds[1]);
    char buf[2048] = {0};
    size_t n = 0;
    ssize_t r;
    while (n < sizeof buf - 1 && (r = read(fds[0], buf + n, sizeof buf - 1 - n)) > 0) n += (size_t)r;
    close(fds[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    int lines = 0;
    for (size_t i = 0; i < n; i++) lines += buf[i] == '\n';
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 1, "%s: %s (status %d): %s", arg,
          WIFSIGNALED(st) ? (WTERMSIG(st) == SIGALRM ? "hung" : "killed by a signal") : "wrong exit", st, buf);
    CHECK(lines == 1 && !strncmp(buf, "nobubble: error: ", 17) && strstr(buf, want), "%s: wanted one error line with '%s': %s",
          arg, want, buf);
}

static void fopen_read(const char *path) { fclose(nb_fopen(path, "rb", NULL)); }
static void read_small(const char *path) {
    size_t n;
    free(nb_read_file(path, 10, &n, NULL));
}

/* Only regular files are inputs: a FIFO without a writer used to block forever in fopen, and
 * /dev/zero (say, behind a state.json symlink) to be read without end. */
TEST_CASE(test_inputs_regular_only) {
    char dir[] = "/tmp/nb_test_core.XXXXXX", fifo[64], link[64], file[64];
    CHECK(mkdtemp(dir), "mkdtemp");
    snprintf(fifo, sizeof fifo, "%s/fifo", dir);
    snprintf(link, sizeof link, "%s/state.json", dir);
    snprintf(file, sizeof file, "%s/file", dir);
    CHECK(mkfifo(fifo, 0600) == 0, "mkfifo: %s", strerror(errno));
    CHECK(symlink("/dev/zero", link) == 0, "symlink: %s", strerror(errno));
    expect_death(fopen_read, fifo, "is a FIFO (named pipe), not a regular file");
    expect_death(fopen_read, link, "is a character device, not a regular file");
    expect_death(fopen_read, dir, "is a directory, not a regular file");
    expect_death(read_small, fifo, "is a FIFO");
    expect_death(fopen_read, "/nonexistent/x", "cannot open '/nonexistent/x' (read)");

    FILE *f = fopen(file, "wb");
    CHECK(f && fwrite("0123456789A", 1, 11, f) == 11 && fclose(f) == 0, "write");
    expect_death(read_small, file, "is 11 B, more than the 10 B such a file can be");
    size_t n = 0;
    char *s = nb_read_file(file, 11, &n, NULL);
    CHECK(n == 11 && !memcmp(s, "0123456789A", 12), "read back %zu bytes", n);
    free(s);
    s = nb_read_file("/proc/self/stat", 1 << 20, &n, NULL); /* size 0 in stat, but has contents */
    CHECK(n > 10 && strlen(s) == n, "/proc file: %zu bytes", n);
    free(s);
    f = nb_fopen(file, "rb", NULL);
    char b[4] = {0};
    CHECK(fread(b, 1, 3, f) == 3 && !strcmp(b, "012"), "fopen read");
    fclose(f);
    size_t size = 0;
    int fd = nb_open_input(file, NULL, &size);
    CHECK(fd >= 0 && size == 11, "open_input size %zu", size);
    close(fd);
    unlink(fifo);
    unlink(link);
    unlink(file);
    rmdir(dir);
}

/* --threads beyond the cores only makes threads take turns: capped, with one note. */
TEST_CASE(test_threads_capped) {
    int cores = nb_host_cores();
    CHECK(cores >= 1 && cores <= sysconf(_SC_NPROCESSORS_ONLN), "cores %d", cores);
    int fds[2];
    CHECK(pipe(fds) == 0, "pipe");
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], 2);
        int a = nb_host_set_threads(100000), b = nb_host_set_threads(cores + 1), c = nb_host_set_threads(1);
        _exit(a == cores && b == cores && c == 1 ? 0 : 3);
    }
    close(fds[1]);
    char buf[1024] = {0};
    size_t n = 0;
    ssize_t r;
    while (n < sizeof buf - 1 && (r = read(fds[0], buf + n, sizeof buf - 1 - n)) > 0) n += (size_t)r;
    close(fds[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "thread counts not capped at %d (status %d)", cores, st);
    char want[128];
    snprintf(want, sizeof want, "note: --threads 100000 capped at %d (the cores available)\n", cores);
    CHECK(!strcmp(buf, want), "want exactly one note '%s', got '%s'", want, buf);
}

/* A launcher's one-core binding widened to the rank's share of the node (in a child: the mask
 * is the process's). Needs two online CPUs; NB_KEEP_BINDING=1 keeps the binding. */
static int spread_child(int keep) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(0, &one);
    if (sched_setaffinity(0, sizeof one, &one) != 0 || nb_host_cores() != 1) return 3;
    if (keep) setenv("NB_KEEP_BINDING", "1", 1);
    unsetenv("OMP_NUM_THREADS"); /* a user's explicit count wins over the widened share: not this case */
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    int got = nb_host_spread(0, 1), threads = nb_host_set_threads(0);
    if (keep) return got == 0 && nb_host_cores() == 1 && threads == 1 ? 0 : 4;
    /* one local rank: its share is the whole node (as far as the cgroup allows) */
    return got >= 2 && got <= online && nb_host_cores() == got && threads == got && nb_host_spread(0, 1) == 0 ? 0 : 5;
}

TEST_CASE(test_spread_binding) {
    if (sysconf(_SC_NPROCESSORS_ONLN) < 2) {
        printf("    (one CPU: nothing to widen)\n");
        return;
    }
    for (int keep = 0; keep <= 1; keep++) {
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) _exit(spread_child(keep));
        int st = 0;
        waitpid(pid, &st, 0);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s: status %d", keep ? "NB_KEEP_BINDING=1" : "widen", st);
    }
}

int main(void) {
    RUN(test_philox_known_answers);
    RUN(test_normal_fill);
    RUN(test_arena_plan_and_views);
    RUN(test_arena_over_budget);
    RUN(test_fmt_bytes);
    RUN(test_copy_stream);
    RUN(test_inputs_regular_only);
    RUN(test_threads_capped);
    RUN(test_spread_binding);
    TEST_EXIT();
}
