/* The seqctr family's sample loader: the next window's samples are read (placed over the shares
 * by --balance, clustered by --cluster-keys) on a thread of their own while the training thread
 * builds the current window's index lists and runs its steps. Two windows take turns: the
 * loader fills one while the trainer cuts the other into parts. The samples, their order and
 * every source position are the ones the trainer would read itself; only when they are read
 * changes. On a GPU the trainer's host time sets the pace of small parts (FWP), and reading a
 * window of synthetic samples was a fifth of it at B 16,384 (clustering it, half).
 *
 * The loader reads only where a window's placement needs no other rank (host collectives belong
 * to the training thread); elsewhere the trainer reads in line, as before. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "core.h"
#include "family/seqctr_family.h"
#include "host.h"

typedef struct sc_loader {
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    sc_train *t;
    long left;    /* windows still to read */
    int full[2];  /* read and not yet taken */
    int fill;     /* the slot read next */
    int take;     /* the slot taken next */
    int held;     /* the slot the trainer is cutting into parts (-1: none) */
    int reading;  /* the loader is inside a read */
    int stop, threads;
} sc_loader;

/* The next global batch's samples for this rank (placed by --balance) and the window's parts:
 * the emulated ranks' shares, or the rank's samples cut into M near-equal parts. */
static void read_window(sc_train *t, sc_window *w) {
    double t0 = nb_now();
    w->pos = nb_ctr_source_position(&t->src);
    int share_first[NB_BALANCE_MAX_EMULATE + 1];
    nb_balance_place(&t->place, &t->src, &w->b, w->idx, share_first, t->emulate ? 1 : t->M);
    if (t->emulate) {
        memcpy(w->part_at, share_first, (size_t)(t->M + 1) * sizeof(int));
    } else {
        if (t->run->o.cluster_keys && t->M > 1) nb_ctr_cluster_keys(&w->b, &t->m, t->M, &t->cluster);
        int n = w->b.b.B;
        for (int k = 0; k <= t->M; k++) w->part_at[k] = (int)((long)k * n / t->M);
    }
    w->fill_s = nb_now() - t0;
}

static void lock(sc_loader *l) {
    NB_CHECK(pthread_mutex_lock(&l->mu) == 0, "this is a bug in nobubble; please report it", "the sample loader's lock");
}
static void unlock(sc_loader *l) { pthread_mutex_unlock(&l->mu); }
static void wait_cv(sc_loader *l) {
    NB_CHECK(pthread_cond_wait(&l->cv, &l->mu) == 0, "this is a bug in nobubble; please report it", "the sample loader's wait");
}

static void *loader_main(void *arg) {
    sc_loader *l = arg;
#ifdef _OPENMP
    omp_set_num_threads(l->threads); /* this thread's teams only (OpenBLAS's pool is the trainer's) */
#endif
    lock(l);
    while (!l->stop && l->left > 0) {
        int s = l->fill;
        while (!l->stop && (l->full[s] || l->held == s)) wait_cv(l);
        if (l->stop) break;
        l->reading = 1;
        unlock(l);
        read_window(l->t, &l->t->wins[s]);
        lock(l);
        l->reading = 0, l->full[s] = 1, l->fill = s ^ 1, l->left--;
        pthread_cond_broadcast(&l->cv);
    }
    unlock(l);
    return NULL;
}

/* Half the trainer's threads: the reads overlap the trainer's lists, which use every core in
 * bursts, and on a GPU a window of synthetic samples (or its clustering) is several milliseconds
 * of all cores, so fewer threads would fall behind the steps. */
static int loader_threads(void) {
    int n = 1;
#ifdef _OPENMP
    n = omp_get_max_threads() / 2;
#endif
    return n > 1 ? n : 1;
}

static void loader_start(sc_train *t, long windows) {
    sc_loader *l = nb_calloc(1, sizeof *l, "the sample loader");
    l->t = t, l->left = windows, l->held = -1, l->threads = loader_threads();
    NB_CHECK(pthread_mutex_init(&l->mu, NULL) == 0 && pthread_cond_init(&l->cv, NULL) == 0, "check the system's thread limits",
             "the sample loader's lock");
    int rc = pthread_create(&l->th, NULL, loader_main, l);
    NB_CHECK(rc == 0, "check the system's thread limits (ulimit -u)", "cannot start the sample loader: %s", strerror(rc));
    t->loader = l;
}

void nb_seqctr_windows_alloc(sc_train *t, const nb_sc_config *mc) {
    int wcap = nb_balance_placer_window_cap(&t->place);
    /* a second window only where the loader will read ahead into it */
    int nwin = nb_balance_placer_local(&t->place) ? 2 : 1;
    for (int k = 0; k < nwin; k++) {
        sc_window *w = &t->wins[k];
        nb_ctr_batch_alloc(&w->b, wcap, mc->max_len, mc->ndense, mc->ncat);
        nb_ctr_batch_alloc_mv(&w->b, wcap, mc);
        w->idx = nb_malloc((size_t)wcap * sizeof(int), "the window");
        w->part_at = nb_malloc((size_t)(t->M + 1) * sizeof(int), "the window");
    }
    if (t->run->o.cluster_keys) nb_ctr_cluster_init(&t->cluster, wcap, mc->max_len, mc->ndense, mc->ncat);
}

void nb_seqctr_windows_free(sc_train *t) {
    sc_loader *l = t->loader;
    if (l) {
        lock(l);
        l->stop = 1;
        pthread_cond_broadcast(&l->cv);
        unlock(l);
        pthread_join(l->th, NULL);
        pthread_cond_destroy(&l->cv);
        pthread_mutex_destroy(&l->mu);
        free(l);
        t->loader = NULL;
    }
    for (int k = 0; k < 2; k++) {
        sc_window *w = &t->wins[k];
        if (w->b.dense) nb_ctr_batch_free(&w->b);
        free(w->idx), free(w->part_at);
        memset(w, 0, sizeof *w);
    }
    nb_ctr_cluster_free(&t->cluster);
}

sc_window *nb_seqctr_next_window(sc_train *t) {
    if (!t->wins[1].idx) { /* no second window: read in line */
        read_window(t, &t->wins[0]);
        return t->win = &t->wins[0];
    }
    if (!t->loader) loader_start(t, t->run->o.steps - t->next_u / t->M); /* from the run's (resumed) step */
    sc_loader *l = t->loader;
    lock(l);
    l->held = -1; /* the window before is cut into its parts: it may be read into again */
    pthread_cond_broadcast(&l->cv);
    int s = l->take;
    while (!l->full[s]) {
        NB_CHECK(l->left > 0 || l->reading, "this is a bug in nobubble; please report it",
                 "seqctr: a window asked for past the run's last step");
        wait_cv(l);
    }
    l->full[s] = 0, l->held = s, l->take = s ^ 1;
    pthread_cond_broadcast(&l->cv);
    unlock(l);
    return t->win = &t->wins[s];
}

uint64_t nb_seqctr_next_position(const sc_train *t) {
    sc_loader *l = t->loader;
    if (!l) return nb_ctr_source_position(&t->src);
    lock(l);
    while (l->reading) wait_cv(l);
    uint64_t pos = l->full[l->take] ? t->wins[l->take].pos : nb_ctr_source_position(&t->src);
    unlock(l);
    return pos;
}
