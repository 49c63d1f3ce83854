/* Where the data paths of commands and defaults are found, whatever the working directory.
 *
 * A relative path that starts with "data/" (every default: data/sotu/train.bin, data/gpt2, ...,
 * and the README's commands) is looked for, in this order:
 *   1. as given, relative to the working directory;
 *   2. under $NB_DATA_DIR, which stands for the data/ folder (data/sotu/val.bin ->
 *      $NB_DATA_DIR/sotu/val.bin);
 *   3. in the data/ folder of the repository the binary was built in (/proc/self/exe is
 *      REPO/build/nobubble, so REPO/data), or for an installed binary (PREFIX/bin/nobubble,
 *      'make install') in PREFIX/share/nobubble/data.
 * Any other path is used as given. */
#ifndef NB_DATAPATH_H
#define NB_DATAPATH_H

#include <stddef.h>

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

#define NB_DATA_PLACES 3

typedef struct {
    char path[NB_PATH_MAX];
    char where[NB_PATH_MAX + 32]; /* for messages: "the working directory /home/x", "$NB_DATA_DIR" */
} nb_data_place;

/* The places path may be at, in the order above (at least 1: the path itself). A candidate that
 * names the same file as an earlier one is left out; so is one whose path would not fit. */
int nb_data_places(const char *path, nb_data_place places[NB_DATA_PLACES]);

/* The first place where something exists goes to out (return 1); else out gets path unchanged
 * and, when looked is not NULL, looked gets "A (where), B (where), ..." for an error (return 0). */
int nb_data_path(const char *path, char *out, size_t cap, char *looked, size_t lcap);

/* "A (where), B (where)" for the places of path. */
void nb_data_looked(const nb_data_place *p, int n, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
