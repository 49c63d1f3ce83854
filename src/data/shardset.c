#include "data/shardset.h"

#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/shard.h"
#include "datapath.h"

typedef struct {
    char **v;
    int n, cap;
} strlist;

static void strlist_push(strlist *l, const char *s) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 8;
        l->v = realloc(l->v, (size_t)l->cap * sizeof *l->v);
        NB_CHECK(l->v, NULL, "out of host memory for a list of %d shards", l->cap);
    }
    size_t len = strlen(s) + 1;
    l->v[l->n] = nb_malloc(len, "shard path");
    memcpy(l->v[l->n++], s, len);
}

static void strlist_free(strlist *l) {
    for (int i = 0; i < l->n; i++) free(l->v[i]);
    free(l->v);
    memset(l, 0, sizeof *l);
}

static int is_glob(const char *s) { return strpbrk(s, "*?[") != NULL; }

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The matches of pattern, sorted byte by byte (glob's own order follows the locale). */
static int glob_sorted(const char *pattern, strlist *out) {
    glob_t g;
    memset(&g, 0, sizeof g);
    int rc = glob(pattern, GLOB_NOSORT, NULL, &g);
    int found = rc == 0 ? (int)g.gl_pathc : 0;
    if (found) {
        qsort(g.gl_pathv, g.gl_pathc, sizeof *g.gl_pathv, cmp_str);
        for (size_t i = 0; i < g.gl_pathc; i++) strlist_push(out, g.gl_pathv[i]);
    }
    globfree(&g);
    return found;
}

/* One item of the spec into out; 0 (and why) when no place has it. */
static int expand_item(const char *item, strlist *out, char *why, size_t cap) {
    nb_data_place places[NB_DATA_PLACES];
    int n = nb_data_places(item, places);
    for (int i = 0; i < n; i++) {
        if (is_glob(item) ? glob_sorted(places[i].path, out) > 0 : nb_file_exists(places[i].path)) {
            if (!is_glob(item)) strlist_push(out, places[i].path);
            return 1;
        }
    }
    char looked[2048];
    nb_data_looked(places, n, looked, sizeof looked);
    if (is_glob(item)) snprintf(why, cap, "no file matches '%s'; looked at %s", item, looked);
    else snprintf(why, cap, "'%s' not found; looked at %s", item, looked);
    return 0;
}

/* Every item of the comma-separated spec, in order; 0 (and why) at the first that names nothing. */
static int expand(const char *spec, strlist *out, char *why, size_t cap) {
    char copy[NB_PATH_MAX];
    snprintf(copy, sizeof copy, "%s", spec);
    char *save = NULL;
    int items = 0;
    for (char *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        items++;
        if (!expand_item(item, out, why, cap)) return 0;
    }
    if (!items) {
        snprintf(why, cap, "'%s' names no shard", spec);
        return 0;
    }
    return 1;
}

int nb_shardset_check(const char *spec, char *why, size_t cap) {
    strlist l = {0};
    int ok = expand(spec, &l, why, cap);
    strlist_free(&l);
    return ok;
}

static void refuse_repeats(const strlist *l, const char *what, const char *spec) {
    char **sorted = nb_malloc((size_t)l->n * sizeof *sorted, "shard list");
    memcpy(sorted, l->v, (size_t)l->n * sizeof *sorted);
    qsort(sorted, (size_t)l->n, sizeof *sorted, cmp_str);
    for (int i = 1; i < l->n; i++)
        NB_CHECK(strcmp(sorted[i - 1], sorted[i]) != 0, "name each shard once (a glob and a list may overlap)",
                 "%s '%s' names the shard '%s' twice", what, spec, sorted[i]);
    free(sorted);
}

void nb_shardset_open(nb_shardset *s, const char *spec, int vocab, const char *what) {
    memset(s, 0, sizeof *s);
    NB_CHECK(strlen(spec) < sizeof s->spec, "use shorter paths or a glob", "%s: the list of shards is too long", what);
    snprintf(s->spec, sizeof s->spec, "%s", spec);
    s->vocab = vocab;
    strlist l = {0};
    char why[3072];
    if (!expand(spec, &l, why, sizeof why))
        nb_fail("check the path (a glob is quoted: --data 'data/x/train_*.bin'; several shards: a,b,c), set "
                "NB_DATA_DIR to the data folder, or run 'bash scripts/fetch_data.sh'",
                "%s: %s", what, why);
    refuse_repeats(&l, what, spec);
    s->n = l.n;
    s->paths = l.v; /* the set keeps the strings */
    s->start = nb_malloc((size_t)(s->n + 1) * sizeof *s->start, "shard offsets");
    s->loaded = nb_calloc((size_t)s->n, sizeof *s->loaded, "shard tokens");
    s->start[0] = 0;
    for (int i = 0; i < s->n; i++) s->start[i + 1] = s->start[i] + nb_shard_probe(s->paths[i]);
    s->has_mask = nb_calloc((size_t)s->n, 1, "shard masks");
    s->masks = nb_calloc((size_t)s->n, sizeof *s->masks, "shard masks");
    for (int i = 0; i < s->n; i++) {
        s->has_mask[i] = (char)nb_mask_exists(s->paths[i]);
        s->nmasked += s->has_mask[i];
    }
}

void nb_shardset_close(nb_shardset *s) {
    for (int i = 0; i < s->n; i++) {
        nb_shard_free(&s->loaded[i]);
        free(s->paths[i]);
        free(s->masks[i]);
    }
    free(s->loaded), free(s->paths), free(s->start), free(s->masks), free(s->has_mask);
    memset(s, 0, sizeof *s);
}

static void load(nb_shardset *s, int i) {
    nb_shard sh;
    nb_shard_load(&sh, s->paths[i], s->vocab);
    /* the header was read at open; a shard rewritten since would shift every later position */
    NB_CHECK(sh.ntok == s->start[i + 1] - s->start[i], "keep a run's shards unchanged while it trains (and for its resume)",
             "token shard '%s' changed while the run read it: %zu tokens at start, %zu now", s->paths[i],
             s->start[i + 1] - s->start[i], sh.ntok);
    s->loaded[i] = sh;
}

static int is_loaded(const nb_shard *sh) { return sh->tokens || sh->tokens32; }

void nb_shardset_read(nb_shardset *s, size_t pos, size_t n, uint32_t *out) {
    NB_ASSERT(pos <= nb_shardset_ntok(s) && n <= nb_shardset_ntok(s) - pos);
    size_t end = pos + n;
    for (int i = 0; i < s->n; i++) {
        size_t a = s->start[i], b = s->start[i + 1];
        int needed = a < end && b > pos;
        if (!needed) {
            if (is_loaded(&s->loaded[i])) nb_shard_free(&s->loaded[i]);
            continue;
        }
        if (!is_loaded(&s->loaded[i]) && b > a) load(s, i);
        size_t lo = pos > a ? pos : a, hi = end < b ? end : b;
        for (size_t k = lo; k < hi; k++) out[k - pos] = nb_shard_token(&s->loaded[i], k - a);
    }
}

void nb_shardset_read_mask(nb_shardset *s, size_t pos, size_t n, uint8_t *out) {
    NB_ASSERT(pos <= nb_shardset_ntok(s) && n <= nb_shardset_ntok(s) - pos);
    size_t end = pos + n;
    for (int i = 0; i < s->n; i++) {
        size_t a = s->start[i], b = s->start[i + 1];
        if (!(a < end && b > pos)) {
            free(s->masks[i]);
            s->masks[i] = NULL;
            continue;
        }
        size_t lo = pos > a ? pos : a, hi = end < b ? end : b;
        if (!s->has_mask[i]) {
            memset(out + (lo - pos), 1, hi - lo);
            continue;
        }
        /* nb_mask_load checks the count against the shard's, read at open */
        if (!s->masks[i]) s->masks[i] = nb_mask_load(s->paths[i], b - a);
        NB_CHECK(s->masks[i], "keep a run's shards and masks unchanged while it trains", "loss mask '%s.mask' disappeared while the run read it",
                 s->paths[i]);
        memcpy(out + (lo - pos), s->masks[i] + (lo - a), hi - lo);
    }
}

size_t nb_shardset_count_targets(nb_shardset *s) {
    size_t total = 0;
    for (int i = 0; i < s->n; i++) {
        size_t ntok = s->start[i + 1] - s->start[i];
        if (!s->has_mask[i]) {
            total += ntok;
            continue;
        }
        uint8_t *m = s->masks[i] ? s->masks[i] : nb_mask_load(s->paths[i], ntok);
        NB_CHECK(m, "keep a run's shards and masks unchanged while it trains", "loss mask '%s.mask' disappeared", s->paths[i]);
        for (size_t k = 0; k < ntok; k++) total += m[k];
        if (m != s->masks[i]) free(m);
    }
    return total;
}

void nb_shardset_describe_masks(const nb_shardset *s, char *buf, size_t cap) {
    if (s->n == 1 && s->nmasked == 1) snprintf(buf, cap, "%s.mask", s->paths[0]);
    else if (s->nmasked == s->n) snprintf(buf, cap, "the masks of all %d shards", s->n);
    else snprintf(buf, cap, "the masks of %d of %d shards; the others train on every token", s->nmasked, s->n);
}

void nb_shardset_describe(const nb_shardset *s, char *buf, size_t cap) {
    if (s->n == 1) {
        snprintf(buf, cap, "%s", s->paths[0]);
        return;
    }
    size_t len = (size_t)snprintf(buf, cap, "%d shards:", s->n);
    for (int i = 0; i < s->n && len < cap; i++) {
        /* a long list shows its first three and its last */
        if (s->n > 5 && i == 3) {
            len += (size_t)snprintf(buf + len, cap - len, " ... (%d more),", s->n - 4);
            i = s->n - 1;
        }
        len += (size_t)snprintf(buf + len, cap - len, " %s%s", s->paths[i], i + 1 < s->n ? "," : "");
    }
}
