#include "datapath.h"

#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The data folder that goes with the binary: PREFIX/share/nobubble/data for an installed one
 * (PREFIX/bin/nobubble, 'make install'), else REPO/data for REPO/build/nobubble (or any
 * REPO/<dir>/<binary>); "" if unknown */
static void repo_data_dir(char *out, size_t cap) {
    char exe[NB_PATH_MAX];
    out[0] = 0;
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0 || (size_t)n >= sizeof exe - 1) return;
    exe[n] = 0;
    char *bin_dir = dirname(exe); /* REPO/build or PREFIX/bin */
    const char *leaf = strrchr(bin_dir, '/');
    int installed = leaf && !strcmp(leaf + 1, "bin");
    char repo[NB_PATH_MAX];
    snprintf(repo, sizeof repo, "%s", bin_dir);
    if ((size_t)snprintf(out, cap, "%s/%s", dirname(repo), installed ? "share/nobubble/data" : "data") >= cap) out[0] = 0;
}

/* path made absolute against the working directory, to compare places */
static void absolute(const char *path, char *out, size_t cap) {
    char cwd[NB_PATH_MAX];
    if (path[0] == '/' || !getcwd(cwd, sizeof cwd)) snprintf(out, cap, "%s", path);
    else snprintf(out, cap, "%s/%s", cwd, path);
}

static int add_place(nb_data_place *places, int n, const char *path, const char *where) {
    char abs_new[2 * NB_PATH_MAX], abs_old[2 * NB_PATH_MAX];
    if (strlen(path) >= NB_PATH_MAX) return n;
    absolute(path, abs_new, sizeof abs_new);
    for (int i = 0; i < n; i++) {
        absolute(places[i].path, abs_old, sizeof abs_old);
        if (!strcmp(abs_old, abs_new)) return n;
    }
    snprintf(places[n].path, sizeof places[n].path, "%s", path);
    snprintf(places[n].where, sizeof places[n].where, "%s", where);
    return n + 1;
}

int nb_data_places(const char *path, nb_data_place places[NB_DATA_PLACES]) {
    char cwd[NB_PATH_MAX] = "?", where[NB_PATH_MAX + 32], alt[2 * NB_PATH_MAX];
    if (!getcwd(cwd, sizeof cwd)) snprintf(cwd, sizeof cwd, "?");
    if (path[0] == '/') snprintf(where, sizeof where, "as given");
    else snprintf(where, sizeof where, "in the working directory %s", cwd);
    int n = add_place(places, 0, path, where);
    if (!n) { /* too long to keep: the caller's own checks name it */
        snprintf(places[0].path, sizeof places[0].path, "%.*s", NB_PATH_MAX - 1, path);
        snprintf(places[0].where, sizeof places[0].where, "as given");
        return 1;
    }
    if (strncmp(path, "data/", 5) != 0) return n;
    const char *rest = path + 5;
    const char *env = getenv("NB_DATA_DIR");
    if (env && env[0]) {
        snprintf(alt, sizeof alt, "%s/%s", env, rest);
        n = add_place(places, n, alt, "$NB_DATA_DIR");
    }
    char repo_data[NB_PATH_MAX];
    repo_data_dir(repo_data, sizeof repo_data);
    if (repo_data[0]) {
        snprintf(alt, sizeof alt, "%s/%s", repo_data, rest);
        n = add_place(places, n, alt, "next to the binary");
    }
    return n;
}

void nb_data_looked(const nb_data_place *p, int n, char *buf, size_t cap) {
    size_t len = 0;
    buf[0] = 0;
    for (int i = 0; i < n && len < cap; i++) {
        int w = snprintf(buf + len, cap - len, "%s%s (%s)", i ? ", " : "", p[i].path, p[i].where);
        if (w < 0) break;
        len += (size_t)w;
    }
}

int nb_data_path(const char *path, char *out, size_t cap, char *looked, size_t lcap) {
    nb_data_place places[NB_DATA_PLACES];
    int n = nb_data_places(path, places);
    for (int i = 0; i < n; i++) {
        if (nb_file_exists(places[i].path) && strlen(places[i].path) < cap) {
            snprintf(out, cap, "%s", places[i].path);
            return 1;
        }
    }
    snprintf(out, cap, "%s", path);
    if (looked) nb_data_looked(places, n, looked, lcap);
    return 0;
}
