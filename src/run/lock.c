/* The run directory's lock (run/lock.h). */
#include "run/lock.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "core.h"
#include "io/atomic.h"

#define LOCK_NAME ".nobubble.lock"

/* The pid the holder wrote into the lock file (0 if unreadable). */
static long holder_pid(int fd) {
    char buf[32] = "";
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    if (n <= 0) return 0;
    buf[n] = 0;
    return strtol(buf, NULL, 10);
}

int nb_dir_lock(const char *dir, int create) {
    char path[4096];
    if (create) nb_mkdir_p(dir);
    snprintf(path, sizeof path, "%s/" LOCK_NAME, dir);
    /* O_NOFOLLOW: a link planted in the run directory must not redirect the write */
    int fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
    NB_CHECK(fd >= 0, "choose a writable run directory", "cannot open the lock file %s: %s", path, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        long pid = holder_pid(fd);
        close(fd);
        NB_CHECK(e == EWOULDBLOCK, "check the file system (flock)", "cannot lock %s: %s", path, strerror(e));
        char who[64] = "another process";
        if (pid > 0) snprintf(who, sizeof who, "nobubble pid %ld", pid);
        nb_fail("wait for it to finish, or pass another --out", "%s is in use by %s (a run writing to it)", dir, who);
    }
    char pid[32];
    int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    NB_CHECK(ftruncate(fd, 0) == 0 && pwrite(fd, pid, (size_t)n, 0) == n, "check free disk space",
             "cannot write the lock file %s: %s", path, strerror(errno));
    return fd; /* held until the process exits (or nb_dir_unlock) */
}

int nb_dir_try_lock(const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/" LOCK_NAME, dir);
    int fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) return -1; /* a read-only directory: no writer can be there either */
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

void nb_dir_unlock(int fd) {
    if (fd >= 0) close(fd); /* closing drops the flock */
}
