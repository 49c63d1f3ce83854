/* Crash-safe files and directories.
 *
 * Files: write to a temp name in the same directory, then fflush + fsync + close + rename +
 * fsync the directory. A reader (or a run resumed after a crash or power loss) sees either the
 * old file or the complete new one, never a prefix. Temp names are "<final>.tmp.<pid>.<n>";
 * one left behind by a crash is garbage and safe to delete.
 *
 * Directories (checkpoints): build the new contents in "<final>.tmp" (nb_dir_tmp_begin), then
 * nb_dir_replace swaps it in:
 *     1. fsync every file in tmp and tmp itself
 *     2. rename final -> final.old          (skipped when final does not exist)
 *     3. rename tmp -> final
 *     4. remove final.old
 * with the parent directory fsynced after each rename. Recovery rule (nb_dir_recover, to run
 * at startup before reading final): "final" is trusted whenever it exists; "final.old" is the
 * previous complete version and is only needed when "final" is missing (crash between 2 and
 * 3), in which case it is renamed back to "final"; "final.tmp" is never trusted and is always
 * removed (its contents may be incomplete; the newest checkpoint is then the one in "final").
 * Every state a crash can leave maps to exactly one complete directory or to none. */
#ifndef NB_ATOMIC_H
#define NB_ATOMIC_H

#include <stddef.h>
#include <stdio.h>

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Open a fresh temp file next to final_path for writing ("wb"); its name goes to tmp_out. */
FILE *nb_atomic_open(const char *final_path, char *tmp_out, size_t cap);
/* fwrite to a file from nb_atomic_open. A short write removes the temp file and ends in nb_fail
 * with errno's cause ("No space left on device"), which ferror() alone has forgotten by the
 * time nb_atomic_commit runs. */
void nb_atomic_write(FILE *f, const char *tmp, const char *final_path, const void *data, size_t len);
/* The same failure path, for a write the caller made itself (pwrite, say) that failed with err. */
NB_NORETURN void nb_atomic_fail(FILE *f, const char *tmp, const char *final_path, const char *step, int err);
/* Check write errors, flush, fsync, close, rename tmp -> final, fsync the directory. On any
 * failure the temp file is removed and nb_fail names the file and the cause (for a stream error
 * left by a plain fwrite, the cause is found again by writing past the end of the temp file). */
void nb_atomic_commit(FILE *f, const char *tmp, const char *final_path);
/* Close and remove the temp file; final_path is untouched. */
void nb_atomic_abort(FILE *f, const char *tmp);
/* Whole file in one call. */
void nb_write_file_atomic(const char *path, const void *data, size_t len);

/* mkdir -p. Fails with a clear message when a component is not a directory or the directory
 * cannot be created or written (hint: choose another --out). */
void nb_mkdir_p(const char *path);
/* rm -rf that never follows symlinks. A missing path is not an error. */
void nb_rm_rf(const char *path);
/* fsync a directory, so that renames and creations inside it survive a power loss. */
void nb_fsync_dir(const char *dir);
/* 1 if path exists and is a directory, 0 if it does not exist; fails if it is something else. */
int nb_is_dir(const char *path);

/* "<final_dir>.tmp" into out. */
void nb_dir_tmp_path(const char *final_dir, char *out, size_t cap);
/* Recover (see above), remove a stale "<final_dir>.tmp", create it empty, return its path in out. */
void nb_dir_tmp_begin(const char *final_dir, char *out, size_t cap);
/* Make final_dir hold the contents of tmp_dir, crash-safely (steps above). tmp_dir must be on
 * the same filesystem; it disappears. */
void nb_dir_replace(const char *tmp_dir, const char *final_dir);
/* Apply the recovery rule to final_dir. Returns what it did: 0 nothing, or a bitmask of
 * NB_RECOVER_* flags (also logged at verbosity 1). */
#define NB_RECOVER_RESTORED_OLD 1 /* final was missing: final.old renamed back to final */
#define NB_RECOVER_REMOVED_OLD 2  /* final existed: stale final.old removed */
#define NB_RECOVER_REMOVED_TMP 4  /* an unfinished final.tmp removed */
int nb_dir_recover(const char *final_dir);

#ifdef __cplusplus
}
#endif
#endif
