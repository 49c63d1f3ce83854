/* A check that must end its process (nb_fail, an abort, a timeout) runs in a child: its exit
 * status and what it wrote to stderr come back for the test to compare. */
#ifndef NB_TEST_CHILD_H
#define NB_TEST_CHILD_H

#include <stdio.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

/* fn(arg) in a child process; err gets its stderr (at most cap - 1 bytes, NUL-terminated).
 * Returns the child's exit status, -1 when a signal ended it, -2 when pipe, fork or wait failed. */
static inline int child_stderr(void (*fn)(const void *), const void *arg, char *err, size_t cap) {
    int fd[2];
    if (pipe(fd) != 0) return -2;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) return -2;
    if (pid == 0) {
        close(fd[0]);
        dup2(fd[1], 2);
        fn(arg);
        _exit(0);
    }
    close(fd[1]);
    size_t n = 0;
    ssize_t r;
    while (n < cap - 1 && (r = read(fd[0], err + n, cap - 1 - n)) > 0) n += (size_t)r;
    err[n] = '\0';
    char rest[256]; /* past cap: read to the end, so a child that says more is not killed by SIGPIPE */
    while (read(fd[0], rest, sizeof rest) > 0) {
    }
    close(fd[0]);
    int st = 0;
    if (waitpid(pid, &st, 0) != pid) return -2;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

typedef struct {
    void (*fn)(void);
} child_thunk;

static inline void child_call_thunk(const void *t) { ((const child_thunk *)t)->fn(); }

/* fn() in a child: child_stderr without an argument. */
static inline int run_child(void (*fn)(void), char *err, size_t cap) {
    child_thunk t = {fn};
    return child_stderr(child_call_thunk, &t, err, cap);
}

#endif
