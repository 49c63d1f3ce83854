/* The run directory's lock: one writer per run directory (flock on DIR/.nobubble.lock, which
 * holds the writer's pid). `train` takes it before it touches the directory (metrics, checkpoint
 * recovery, checkpoints) and holds it until it exits; a second writer fails at start with a
 * message naming the holder's pid. Readers (eval, sample, export) take no lock and never change
 * the directory: recovering a checkpoint that a crash left half-swapped (ckpt.old) is done only
 * by a process holding the lock. The kernel drops the lock when its holder exits or dies, so a
 * killed run leaves nothing to clean up. */
#ifndef NB_RUN_LOCK_H
#define NB_RUN_LOCK_H

/* Lock dir (created when create): fails with the holder's pid if another process holds it.
 * Returns the descriptor that holds the lock. */
int nb_dir_lock(const char *dir, int create);
/* The lock if it is free now, else -1 (no error): for a reader that may recover a checkpoint. */
int nb_dir_try_lock(const char *dir);
void nb_dir_unlock(int fd);

#endif
