/* Checkpoints of a run, for every family (see ckpt.h). */
#include "run/ckpt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "core.h"
#include "family/family.h"
#include "io/atomic.h"
#include "io/json.h"
#include "io/safetensors.h"

void nb_ckpt_resolve(const char *dir, char *out, size_t cap, int recover) {
    char probe[NB_PATH_MAX + 32];
    snprintf(probe, sizeof probe, "%s/state.json", dir);
    if (nb_file_exists(probe)) {
        snprintf(out, cap, "%s", dir);
        return;
    }
    snprintf(out, cap, "%s/ckpt", dir);
    /* a crash between the renames of a checkpoint swap leaves ckpt.old: bring it back */
    if (recover) nb_dir_recover(out);
    snprintf(probe, sizeof probe, "%s/state.json", out);
    NB_CHECK(nb_file_exists(probe), "pass a run directory written by 'nobubble train --out DIR' (or its ckpt/ folder)",
             "no checkpoint in '%s' (neither %s/state.json nor %s/ckpt/state.json exists)", dir, dir, dir);
}

int nb_ckpt_exists(const char *run_dir) {
    char probe[NB_PATH_MAX + 32];
    snprintf(probe, sizeof probe, "%s/ckpt/state.json", run_dir);
    if (nb_file_exists(probe)) return 1;
    snprintf(probe, sizeof probe, "%s/ckpt.old/state.json", run_dir);
    return nb_file_exists(probe);
}

/* ---- state ---- */

void nb_ckpt_read_state(const char *dir, nb_train_opts *opts, nb_ckpt_state *st) {
    static const char *damaged = "the checkpoint is damaged: resume from an earlier copy of the run directory";
    char path[NB_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/state.json", dir);
    nb_json *j = nb_json_load_file(path);
    const char *fmt = nb_json_get_str(j, "format", "");
    NB_CHECK(!strcmp(fmt, NB_CKPT_FORMAT), "pass a checkpoint written by nobubble train",
             "%s is not a nobubble checkpoint (format '%s')", path, fmt);
    int64_t ver = nb_json_req_int(j, "version");
    NB_CHECK(ver == NB_CKPT_VERSION, "use the nobubble version that wrote it", "%s has checkpoint version %lld, this build reads %d",
             path, (long long)ver, NB_CKPT_VERSION);
    int64_t step = nb_json_req_int(j, "step"), pos = nb_json_req_int(j, "data_pos");
    NB_CHECK(step >= 0 && step <= 2147483647LL, damaged, "%s: step %lld is not a step count", path, (long long)step);
    NB_CHECK(pos >= 0, damaged, "%s: data_pos %lld is negative", path, (long long)pos);
    st->step = (int)step;
    st->data_pos = (size_t)pos;
    st->seed = nb_json_req_u64(j, "seed");
    /* checkpoints from before the seqctr family have no "family": they are transformers' */
    const nb_family_i *fam = nb_family_find(nb_json_get_str(j, "family", "transformer"));
    NB_CHECK(fam != NULL, damaged, "%s: unknown model family '%s'", path, nb_json_get_str(j, "family", ""));
    if (opts) {
        nb_train_opts_defaults(opts, fam);
        /* the options first: the family's config may check itself against them */
        nb_train_opts_read_json(path, nb_json_req(j, "train", NB_JSON_OBJ), opts);
        fam->read_config(nb_json_req(j, "model", NB_JSON_OBJ), opts);
        NB_CHECK(opts->seed == st->seed, damaged, "%s: the options' seed differs from the state's", path);
        /* every option as the flags check it, before a flag given now could hide a damaged value */
        nb_train_opts_check(opts, fam->option_groups);
    }
    nb_json_free(j);
}

/* The checkpoint's fingerprint: its step, data position and seed, the model's shape and every
 * option state.json keeps that changes the math, hashed (FNV-1a). Every rank computes the same
 * (they agree on the options at start), so a checkpoint's files carry one value, and files of
 * another run or another checkpoint of this run carry another; runs that differ only in options
 * that leave the bits alone (--ckpt-every, --eval-every) write the same files. */
static uint64_t fnv(const char *s, uint64_t h) {
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return (h ^ 0xff) * 1099511628211ULL; /* a separator: "ab","c" differs from "a","bc" */
}

typedef struct {
    char stamp[40];
    char *model_json; /* the family's model section, compact */
} ckpt_marks;

static void make_marks(ckpt_marks *k, const nb_family_i *fam, const nb_train_opts *o, const nb_ckpt_state *st) {
    nb_json_writer w;
    nb_json_writer_init(&w, 0);
    nb_json_begin_obj(&w);
    fam->write_config(o, &w);
    nb_json_end_obj(&w);
    /* {"model":{...}}: the inner object is what state.json's "model" holds */
    const char *text = nb_json_text(&w), *inner = strchr(text + 1, '{');
    size_t len = strlen(text);
    k->model_json = inner && len >= 2 ? strndup(inner, (size_t)(text + len - 1 - inner)) : NULL;
    NB_CHECK(k->model_json != NULL, "free some host memory", "out of memory writing a checkpoint");
    uint64_t h = fnv(fam->name, 14695981039346656037ULL);
    h = fnv(text, h);
    nb_json_writer_free(&w);
    int n;
    const nb_opt *rows = nb_opts_table(&n);
    char v[NB_PATH_MAX + 8];
    /* not the data's name: the same tokens under another (a glob of shards split from one file, a
     * moved folder) train the same bits, and their checkpoints are the same files */
    for (int i = 0; i < n; i++)
        if (rows[i].state && rows[i].math && strcmp(rows[i].name, "data"))
            nb_opt_format(&rows[i], o, v, sizeof v), h = fnv(v, fnv(rows[i].name, h));
    snprintf(v, sizeof v, "%d %llu %llu", st->step, (unsigned long long)st->data_pos, (unsigned long long)st->seed);
    h = fnv(v, h);
    snprintf(k->stamp, sizeof k->stamp, "%016llx-%d", (unsigned long long)h, st->step);
}

/* A list as written: its tensors, and the checkpoint's marks in its metadata. */
static nb_ckpt_list marked(const nb_ckpt_list *l, const ckpt_marks *k, int with_model) {
    nb_ckpt_list c = *l;
    snprintf(c.stamp, sizeof c.stamp, "%s", k->stamp);
    c.model_json = with_model ? k->model_json : NULL;
    return c;
}

/* model.safetensors, optim.safetensors and state.json into the directory dir. */
static void write_contents(const char *dir, const nb_family_i *fam, const nb_train_opts *o, const nb_ckpt_list *model,
                           const nb_ckpt_list *optim, const nb_ckpt_state *st, const ckpt_marks *k) {
    char path[NB_PATH_MAX + 64];
    nb_ckpt_list l = marked(model, k, 1);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    nb_ckpt_write_list(path, &l, 1);
    if (!o->ckpt_weights_only) {
        l = marked(optim, k, 0);
        snprintf(path, sizeof path, "%s/optim.safetensors", dir);
        nb_ckpt_write_list(path, &l, 0);
    }

    nb_json_writer j;
    nb_json_writer_init(&j, 2);
    nb_json_begin_obj(&j);
    nb_json_kstr(&j, "format", NB_CKPT_FORMAT);
    nb_json_kint(&j, "version", NB_CKPT_VERSION);
    nb_json_kstr(&j, "family", fam->name);
    nb_json_kint(&j, "step", st->step);
    nb_json_kint(&j, "data_pos", (int64_t)st->data_pos);
    nb_json_key(&j, "seed");
    nb_json_uint(&j, st->seed);
    nb_json_kstr(&j, "fingerprint", k->stamp);
    nb_json_kstr(&j, "rng", "philox4x32-10 keyed by (seed, tensor name); no other random state");
    fam->write_config(o, &j);
    nb_train_opts_write_json(&j, o);
    nb_json_end_obj(&j);
    snprintf(path, sizeof path, "%s/state.json", dir);
    nb_write_file_atomic(path, nb_json_text(&j), nb_json_len(&j));
    nb_json_writer_free(&j);
}

/* A family with sharded state: every rank writes its shard into the temp directory rank 0 made,
 * rank 0 the replicated part, and rank 0 swaps the directory in once every rank is done (a rank
 * that fails ends the job first: the old checkpoint stays whole). The ranks share the run
 * directory's file system. */
static void save_sharded(nb_run *r, const char *out_dir, const nb_ckpt_list *model, const nb_ckpt_list *optim,
                         const nb_ckpt_state *st, const ckpt_marks *k) {
    char final[NB_PATH_MAX + 16], tmp[NB_PATH_MAX + 32], path[NB_PATH_MAX + 96];
    nb_ckpt_list shard = {0};
    r->fam->shard_tensors(r, &shard);
    snprintf(shard.stamp, sizeof shard.stamp, "%s", k->stamp);
    snprintf(final, sizeof final, "%s/ckpt", out_dir);
    if (r->rank == 0)
        nb_dir_tmp_begin(final, tmp, sizeof tmp);
    else
        nb_dir_tmp_path(final, tmp, sizeof tmp);
    nb_comm_barrier_host(); /* the temp directory exists */
    nb_ckpt_shard_path(path, sizeof path, tmp, r->rank, r->world);
    nb_ckpt_write_list(path, &shard, 0);
    if (r->rank == 0) write_contents(tmp, r->fam, &r->o, model, optim, st, k);
    nb_comm_barrier_host(); /* every shard is on disk */
    if (r->rank == 0) nb_dir_replace(tmp, final);
    nb_comm_barrier_host(); /* the checkpoint is in place for every rank */
    nb_ckpt_list_free(&shard);
}

void nb_ckpt_save(nb_run *r, const char *out_dir, const nb_ckpt_state *st) {
    nb_ckpt_list model = {0}, optim = {0};
    r->fam->ckpt_tensors(r, &model, &optim);
    if (nb_run_sharded(r)) {
        ckpt_marks k;
        make_marks(&k, r->fam, &r->o, st);
        save_sharded(r, out_dir, &model, &optim, st, &k);
        free(k.model_json);
    } else {
        nb_ckpt_write(out_dir, r->fam, &r->o, &model, &optim, st);
    }
    nb_ckpt_list_free(&model), nb_ckpt_list_free(&optim);
}

void nb_ckpt_write(const char *out_dir, const nb_family_i *fam, const nb_train_opts *o, const nb_ckpt_list *model,
                   const nb_ckpt_list *optim, const nb_ckpt_state *st) {
    char final[NB_PATH_MAX + 16], tmp[NB_PATH_MAX + 32];
    ckpt_marks k;
    make_marks(&k, fam, o, st);
    snprintf(final, sizeof final, "%s/ckpt", out_dir);
    nb_dir_tmp_begin(final, tmp, sizeof tmp);
    write_contents(tmp, fam, o, model, optim, st, &k);
    nb_dir_replace(tmp, final);
    free(k.model_json);
}
