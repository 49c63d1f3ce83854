#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "io/atomic.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core.h"

#define OUT_HINT "choose another --out directory, or fix its permissions"
#define DISK_HINT "check free space and health of the disk holding the output (df -h)"

static void path_join(char *out, size_t cap, const char *a, const char *b) {
    int n = snprintf(out, cap, "%s%s", a, b);
    NB_CHECK(n >= 0 && (size_t)n < cap, "use a shorter output path", "path too long: '%s%s'", a, b);
}

/* Parent directory of path ("." when there is no slash). */
static void parent_dir(const char *path, char *out, size_t cap) {
    path_join(out, cap, path, "");
    size_t n = strlen(out);
    while (n > 1 && out[n - 1] == '/') out[--n] = '\0'; /* "a/b/" is "a/b" */
    char *slash = strrchr(out, '/');
    if (!slash) snprintf(out, cap, ".");
    else if (slash == out) out[1] = '\0';
    else *slash = '\0';
}

/* 1 if something exists at path (not following a final symlink), 0 if not. */
static int exists(const char *path) {
    struct stat st;
    if (lstat(path, &st) == 0) return 1;
    NB_CHECK(errno == ENOENT || errno == ENOTDIR, OUT_HINT, "cannot inspect '%s': %s", path, strerror(errno));
    return 0;
}

int nb_is_dir(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) {
        NB_CHECK(errno == ENOENT, OUT_HINT, "cannot inspect '%s': %s", path, strerror(errno));
        return 0;
    }
    NB_CHECK(S_ISDIR(st.st_mode), "move it away or choose another --out", "'%s' exists but is not a directory", path);
    return 1;
}

void nb_fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    NB_CHECK(fd >= 0, OUT_HINT, "cannot open directory '%s' to sync it: %s", dir, strerror(errno));
    /* Some filesystems cannot fsync a directory (EINVAL); there is nothing stronger to do. */
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    NB_CHECK(rc == 0 || e == EINVAL || e == ENOTSUP, DISK_HINT, "fsync of directory '%s' failed: %s", dir, strerror(e));
}

static void fsync_parent(const char *path) {
    char dir[PATH_MAX];
    parent_dir(path, dir, sizeof dir);
    nb_fsync_dir(dir);
}

/* ------------------------------------------------------------------ files */

/* Temp files being written, removed at exit: every failure ends in nb_fail's exit, so none is
 * left behind by an error (a kill -9 still can; the names say they are garbage). */
#define PENDING_MAX 32
static pthread_mutex_t pending_mu = PTHREAD_MUTEX_INITIALIZER;
static char *pending[PENDING_MAX];

static void remove_pending(void) {
    pthread_mutex_lock(&pending_mu);
    for (int i = 0; i < PENDING_MAX; i++)
        if (pending[i]) unlink(pending[i]), free(pending[i]), pending[i] = NULL;
    pthread_mutex_unlock(&pending_mu);
}

static void pending_add(const char *tmp) {
    static int registered;
    pthread_mutex_lock(&pending_mu);
    if (!registered) registered = atexit(remove_pending) == 0;
    for (int i = 0; i < PENDING_MAX; i++)
        if (!pending[i]) {
            pending[i] = strdup(tmp); /* NULL when out of memory: then it is only not tracked */
            break;
        }
    pthread_mutex_unlock(&pending_mu);
}

static void pending_drop(const char *tmp) {
    pthread_mutex_lock(&pending_mu);
    for (int i = 0; i < PENDING_MAX; i++)
        if (pending[i] && !strcmp(pending[i], tmp)) free(pending[i]), pending[i] = NULL;
    pthread_mutex_unlock(&pending_mu);
}

FILE *nb_atomic_open(const char *final_path, char *tmp_out, size_t cap) {
    static atomic_uint counter;
    for (int attempt = 0; attempt < 100; attempt++) {
        char suffix[48];
        snprintf(suffix, sizeof suffix, ".tmp.%ld.%u", (long)getpid(), atomic_fetch_add(&counter, 1));
        path_join(tmp_out, cap, final_path, suffix);
        /* O_EXCL: never write through a file (or symlink) someone else put there. */
        int fd = open(tmp_out, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd < 0 && errno == EEXIST) continue;
        NB_CHECK(fd >= 0, OUT_HINT, "cannot create '%s': %s", tmp_out, strerror(errno));
        FILE *f = fdopen(fd, "wb");
        if (!f) {
            int e = errno;
            close(fd);
            unlink(tmp_out);
            nb_fail("free some host memory", "cannot open a stream on '%s': %s", tmp_out, strerror(e));
        }
        pending_add(tmp_out);
        return f;
    }
    nb_fail(OUT_HINT, "cannot find a free temp name for '%s'", final_path);
}

static const char *write_hint(int e) { return e == EACCES || e == EROFS || e == EPERM ? OUT_HINT : DISK_HINT; }

void nb_atomic_fail(FILE *f, const char *tmp, const char *final_path, const char *step, int err) {
    fclose(f); /* discarded: a close error changes nothing */
    pending_drop(tmp);
    if (unlink(tmp) != 0 && errno != ENOENT)
        nb_log(1, "nobubble: warning: cannot remove temp file '%s': %s\n", tmp, strerror(errno));
    nb_fail(write_hint(err), "cannot write '%s' (%s failed): %s", final_path, step, strerror(err));
}

void nb_atomic_write(FILE *f, const char *tmp, const char *final_path, const void *data, size_t len) {
    if (len == 0) return;
    errno = 0;
    if (fwrite(data, 1, len, f) != len) nb_atomic_fail(f, tmp, final_path, "write", errno ? errno : EIO);
}

/* A stream error left by a plain fwrite has lost its errno. Writing past the end of the temp
 * file (discarded anyway) shows the cause again: 64 KiB needs new blocks, so a full disk says
 * ENOSPC even when the last block had room for a few bytes. */
static int probe_write_errno(int fd) {
    static const char zeros[1 << 16];
    struct stat st;
    if (fstat(fd, &st) != 0) return errno;
    if (pwrite(fd, zeros, sizeof zeros, st.st_size) < 0) return errno;
    return EIO;
}

void nb_atomic_commit(FILE *f, const char *tmp, const char *final_path) {
    const char *step = NULL;
    int e = 0;
    /* ferror first: an earlier fwrite may have failed (disk full) with errno long overwritten. */
    if (ferror(f)) step = "write", e = probe_write_errno(fileno(f));
    else if (fflush(f) != 0) step = "write", e = errno;
    else if (fsync(fileno(f)) != 0) step = "fsync", e = errno;
    if (step) nb_atomic_fail(f, tmp, final_path, step, e);
    if (fclose(f) != 0) step = "close", e = errno;
    if (!step && rename(tmp, final_path) != 0) step = "rename", e = errno;
    pending_drop(tmp);
    if (step) {
        unlink(tmp);
        nb_fail(write_hint(e), "cannot write '%s' (%s failed): %s", final_path, step, strerror(e));
    }
    fsync_parent(final_path);
}

void nb_atomic_abort(FILE *f, const char *tmp) {
    fclose(f); /* the contents are discarded, so a close error does not matter */
    pending_drop(tmp);
    NB_CHECK(unlink(tmp) == 0 || errno == ENOENT, OUT_HINT, "cannot remove temp file '%s': %s", tmp, strerror(errno));
}

void nb_write_file_atomic(const char *path, const void *data, size_t len) {
    char tmp[PATH_MAX];
    FILE *f = nb_atomic_open(path, tmp, sizeof tmp);
    nb_atomic_write(f, tmp, path, data, len);
    nb_atomic_commit(f, tmp, path);
}

/* ------------------------------------------------------------------ directories */

void nb_mkdir_p(const char *path) {
    NB_CHECK(path && path[0], OUT_HINT, "empty directory path");
    char buf[PATH_MAX];
    path_join(buf, sizeof buf, path, "");
    size_t n = strlen(buf);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] != '/' && buf[i] != '\0') continue;
        if (buf[i - 1] == '/') continue; /* "a//b" */
        char saved = buf[i];
        buf[i] = '\0';
        if (mkdir(buf, 0777) != 0) {
            int e = errno;
            struct stat st;
            if (e != EEXIST) {
                /* EACCES/EROFS on an existing ancestor is fine: only missing ones need creating. */
                if (stat(buf, &st) != 0)
                    nb_fail(OUT_HINT, "cannot create directory '%s': %s", buf, strerror(e));
            } else if (stat(buf, &st) != 0) {
                nb_fail(OUT_HINT, "cannot inspect '%s': %s", buf, strerror(errno));
            }
            NB_CHECK(S_ISDIR(st.st_mode), OUT_HINT, "cannot create directory '%s': '%s' exists and is not a directory", path, buf);
        }
        buf[i] = saved;
    }
    NB_CHECK(access(path, W_OK | X_OK) == 0, OUT_HINT, "directory '%s' is not writable: %s", path, strerror(errno));
}

/* Post-order walk: children first, then the path itself. Symlinks are not followed. */
typedef int (*visit_fn)(const char *path, mode_t mode);

static void walk_post(const char *path, visit_fn fn, const char *what) {
    struct stat st;
    if (lstat(path, &st) != 0) nb_fail(OUT_HINT, "%s: cannot inspect '%s': %s", what, path, strerror(errno));
    if (S_ISDIR(st.st_mode)) {
        DIR *d = opendir(path);
        if (!d) nb_fail(OUT_HINT, "%s: cannot open directory '%s': %s", what, path, strerror(errno));
        size_t plen = strlen(path);
        for (;;) {
            errno = 0;
            struct dirent *ent = readdir(d);
            if (!ent) {
                NB_CHECK(errno == 0, OUT_HINT, "%s: cannot list '%s': %s", what, path, strerror(errno));
                break;
            }
            if (!strcmp(ent->d_name, ".") || !strcmp(ent->d_name, "..")) continue;
            size_t cap = plen + strlen(ent->d_name) + 2;
            char *child = nb_malloc(cap, "path");
            snprintf(child, cap, "%s/%s", path, ent->d_name);
            walk_post(child, fn, what);
            free(child);
        }
        closedir(d);
    }
    if (fn(path, st.st_mode) != 0) nb_fail(OUT_HINT, "%s: '%s': %s", what, path, strerror(errno));
}

static int remove_one(const char *path, mode_t mode) { return S_ISDIR(mode) ? rmdir(path) : unlink(path); }

static int fsync_one(const char *path, mode_t mode) {
    if (!S_ISDIR(mode) && !S_ISREG(mode)) return 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC | (S_ISDIR(mode) ? O_DIRECTORY : 0));
    if (fd < 0) return -1;
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    if (rc != 0 && S_ISDIR(mode) && (e == EINVAL || e == ENOTSUP)) rc = 0;
    errno = e;
    return rc;
}

void nb_rm_rf(const char *path) {
    /* A guard against a caller bug wiping something it never meant to. */
    NB_ASSERT(path && path[0] && strcmp(path, "/") != 0 && strcmp(path, ".") != 0 && strcmp(path, "..") != 0);
    if (!exists(path)) return;
    walk_post(path, remove_one, "cannot remove");
}

static void rename_or_fail(const char *from, const char *to) {
    if (rename(from, to) != 0)
        nb_fail(errno == EXDEV ? "keep the temp directory on the same filesystem as the output" : OUT_HINT,
                "cannot rename '%s' to '%s': %s", from, to, strerror(errno));
}

/* "ckpt/" names the same directory as "ckpt", but "ckpt/" + ".old" would be inside it. */
static void strip_slashes(const char *in, char *out, size_t cap) {
    path_join(out, cap, in, "");
    size_t n = strlen(out);
    while (n > 1 && out[n - 1] == '/') out[--n] = '\0';
}

void nb_dir_tmp_path(const char *final_dir, char *out, size_t cap) {
    char fin[PATH_MAX];
    strip_slashes(final_dir, fin, sizeof fin);
    path_join(out, cap, fin, ".tmp");
}

int nb_dir_recover(const char *final_dir_arg) {
    char final_dir[PATH_MAX], old[PATH_MAX], tmp[PATH_MAX];
    strip_slashes(final_dir_arg, final_dir, sizeof final_dir);
    path_join(old, sizeof old, final_dir, ".old");
    nb_dir_tmp_path(final_dir, tmp, sizeof tmp);
    int did = 0;
    if (exists(old)) {
        if (nb_is_dir(final_dir)) {
            nb_rm_rf(old);
            did |= NB_RECOVER_REMOVED_OLD;
        } else {
            rename_or_fail(old, final_dir);
            did |= NB_RECOVER_RESTORED_OLD;
        }
    }
    if (exists(tmp)) {
        nb_rm_rf(tmp);
        did |= NB_RECOVER_REMOVED_TMP;
    }
    if (did) {
        fsync_parent(final_dir);
        nb_log(1, "nobubble: recovered '%s' after an interrupted write:%s%s%s\n", final_dir,
               did & NB_RECOVER_RESTORED_OLD ? " restored the previous version from .old;" : "",
               did & NB_RECOVER_REMOVED_OLD ? " removed a stale .old;" : "",
               did & NB_RECOVER_REMOVED_TMP ? " discarded an unfinished .tmp;" : "");
    }
    return did;
}

void nb_dir_tmp_begin(const char *final_dir, char *out, size_t cap) {
    nb_dir_recover(final_dir);
    nb_dir_tmp_path(final_dir, out, cap);
    nb_mkdir_p(out);
}

void nb_dir_replace(const char *tmp_dir_arg, const char *final_dir_arg) {
    char tmp_dir[PATH_MAX], final_dir[PATH_MAX];
    strip_slashes(tmp_dir_arg, tmp_dir, sizeof tmp_dir);
    strip_slashes(final_dir_arg, final_dir, sizeof final_dir);
    NB_CHECK(nb_is_dir(tmp_dir), "this is a bug in nobubble; please report it",
             "directory '%s' to install as '%s' does not exist", tmp_dir, final_dir);
    char old[PATH_MAX];
    path_join(old, sizeof old, final_dir, ".old");
    /* Step 1: the new contents must be on disk before any name points at them. */
    walk_post(tmp_dir, fsync_one, "cannot sync");
    int have_final = nb_is_dir(final_dir);
    if (have_final && exists(old)) nb_rm_rf(old); /* stale: final is complete, old is not needed */
    /* Without final, a leftover old is the only complete version: keep it until step 3 is done. */
    if (have_final) {
        rename_or_fail(final_dir, old); /* step 2 */
        fsync_parent(final_dir);
    }
    rename_or_fail(tmp_dir, final_dir); /* step 3 */
    fsync_parent(final_dir);
    fsync_parent(tmp_dir);
    nb_rm_rf(old); /* step 4 */
    fsync_parent(old);
}
