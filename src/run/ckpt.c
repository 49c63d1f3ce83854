/* Checkpoints of a run, for every family (see ckpt.h). */
#include "run/ckpt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "comm/comm.h"
#include "core.h"
#include "family/family.h"
#include "io/atomic.h"
#include "io/json.h"
#include "io/safetensors.h"

static int file_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

void nb_ckpt_resolve(const char *dir, char *out, size_t cap, int recover) {
    char probe[NB_PATH_MAX + 32];
    snprintf(probe, sizeof probe, "%s/state.json", dir);
    if (file_exists(probe)) {
        snprintf(out, cap, "%s", dir);
        return;
    }
    snprintf(out, cap, "%s/ckpt", dir);
    /* a crash between the renames of a checkpoint swap leaves ckpt.old: bring it back */
    if (recover) nb_dir_recover(out);
    snprintf(probe, sizeof probe, "%s/state.json", out);
    NB_CHECK(file_exists(probe), "pass a run directory written by 'nobubble train --out DIR' (or its ckpt/ folder)",
             "no checkpoint in '%s' (neither %s/state.json nor %s/ckpt/state.json exists)", dir, dir, dir);
}

/* ---- options <-> JSON: one table, so writing and reading can never disagree ---- */

typedef enum { F_INT, F_FLOAT, F_STR, F_U64, F_I64 } field_kind;
typedef struct {
    const char *key;
    field_kind kind;
    size_t offset, size;
} field;

#define FI(k, m) {k, F_INT, offsetof(nb_train_opts, m), sizeof(int)}
#define FF(k, m) {k, F_FLOAT, offsetof(nb_train_opts, m), sizeof(float)}
#define FS(k, m) {k, F_STR, offsetof(nb_train_opts, m), sizeof(((nb_train_opts *)0)->m)}
static const field train_fields[] = {
    FS("data", data), FS("val_data", val_data), FS("device", device), FS("schedule", schedule), FS("precision", precision),
    FI("batch", batch), FI("seq", seq), FI("steps", steps), FI("warmup", warmup), FI("eval_every", eval_every),
    FI("eval_batches", eval_batches), FI("ckpt_every", ckpt_every), FI("graphs", graphs), FF("lr", lr), FF("min_lr_frac", min_lr_frac),
    FF("weight_decay", weight_decay), FF("beta1", beta1), FF("beta2", beta2), FF("eps", eps),
    FF("grad_clip", grad_clip), {"seed", F_U64, offsetof(nb_train_opts, seed), sizeof(uint64_t)},
    /* added with ERASE, stream and the seqctr family: a checkpoint written before them lacks
     * them (the family's defaults then apply) */
    FS("detach", detach), FF("aux_weight", aux_weight), FI("side_lanes", side_lanes), FS("erase_dispatch", erase_dispatch),
    FI("ckpt_interval", ckpt_interval), FI("stream_slots", stream_slots), FI("pinned_slabs", pinned_slabs),
    FI("keep_layers", keep_layers), FI("gpu_layers", gpu_layers), FS("emb_optim", emb_optim), FF("emb_lr", emb_lr),
    {"table_cap", F_I64, offsetof(nb_train_opts, table_cap), sizeof(int64_t)}, FI("eval_samples", eval_samples),
    FI("strict", strict), FI("grad_accum", grad_accum), FS("comm", comm), FI("comm_sm_free", comm_sm_free), FF("comm_timeout", comm_timeout),
    FI("world", world), FS("emb_shard", emb_shard), FI("pipe_skip_resync", pipe_skip_resync), FS("emb_place", emb_place), FI("cluster_keys", cluster_keys),
    FS("balance", balance), FI("emulate_ranks", emulate_ranks), FI("emb_priority", emb_priority),
};
#define FIRST_OPTIONAL 21
#define NFIELDS (sizeof train_fields / sizeof train_fields[0])

static void write_train_opts(nb_json_writer *w, const nb_train_opts *o) {
    nb_json_key(w, "train");
    nb_json_begin_obj(w);
    for (size_t i = 0; i < NFIELDS; i++) {
        const field *f = &train_fields[i];
        const char *p = (const char *)o + f->offset;
        switch (f->kind) {
        case F_INT: nb_json_kint(w, f->key, *(const int *)p); break;
        case F_FLOAT: nb_json_knum(w, f->key, *(const float *)p); break;
        case F_STR: nb_json_kstr(w, f->key, p); break;
        case F_U64: nb_json_key(w, f->key); nb_json_uint(w, *(const uint64_t *)p); break;
        case F_I64: nb_json_kint(w, f->key, *(const int64_t *)p); break;
        }
    }
    nb_json_end_obj(w);
}

/* A 32-bit field from a 64-bit JSON integer: out of range is a damaged file, not a wrap. */
static int to_int(const char *path, const char *key, int64_t v) {
    NB_CHECK(v >= -2147483647LL - 1 && v <= 2147483647LL, "the checkpoint is damaged: fix or remove the field",
             "%s: field '%s' is %lld, outside the 32-bit range", path, key, (long long)v);
    return (int)v;
}

static void read_train_opts(const char *path, const nb_json *j, nb_train_opts *o) {
    for (size_t i = 0; i < NFIELDS; i++) {
        const field *f = &train_fields[i];
        char *p = (char *)o + f->offset;
        if (i >= FIRST_OPTIONAL && !nb_json_get(j, f->key)) continue;
        switch (f->kind) {
        case F_INT: *(int *)p = to_int(path, f->key, nb_json_req_int(j, f->key)); break;
        case F_FLOAT: *(float *)p = (float)nb_json_req_num(j, f->key); break;
        case F_U64: *(uint64_t *)p = nb_json_req_u64(j, f->key); break;
        case F_I64: *(int64_t *)p = nb_json_req_int(j, f->key); break;
        case F_STR: {
            const char *s = nb_json_req_str(j, f->key);
            NB_CHECK(strlen(s) < f->size, "the checkpoint is damaged", "state.json field '%s' is too long", f->key);
            memcpy(p, s, strlen(s) + 1);
            break;
        }
        }
    }
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
        nb_train_opts_defaults(opts, fam->name);
        /* the options first: the family's config may check itself against them */
        read_train_opts(path, nb_json_req(j, "train", NB_JSON_OBJ), opts);
        fam->read_config(nb_json_req(j, "model", NB_JSON_OBJ), opts);
        NB_CHECK(opts->seed == st->seed, damaged, "%s: the options' seed differs from the state's", path);
        /* every option as the flags check it, before a flag given now could hide a damaged value */
        nb_train_opts_check(opts);
    }
    nb_json_free(j);
}

/* model.safetensors, optim.safetensors and state.json into the directory dir. */
static void write_contents(const char *dir, const nb_family_i *fam, const nb_train_opts *o, const nb_ckpt_list *model,
                           const nb_ckpt_list *optim, const nb_ckpt_state *st) {
    char path[NB_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    nb_ckpt_write_list(path, model, 1);
    snprintf(path, sizeof path, "%s/optim.safetensors", dir);
    nb_ckpt_write_list(path, optim, 0);

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
    nb_json_kstr(&j, "rng", "philox4x32-10 keyed by (seed, tensor name); no other random state");
    fam->write_config(o, &j);
    write_train_opts(&j, o);
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
                         const nb_ckpt_state *st) {
    char final[NB_PATH_MAX + 16], tmp[NB_PATH_MAX + 32], path[NB_PATH_MAX + 96];
    nb_ckpt_list shard = {0};
    r->fam->shard_tensors(r, &shard);
    snprintf(final, sizeof final, "%s/ckpt", out_dir);
    if (r->rank == 0)
        nb_dir_tmp_begin(final, tmp, sizeof tmp);
    else
        nb_dir_tmp_path(final, tmp, sizeof tmp);
    nb_comm_barrier_host(); /* the temp directory exists */
    nb_ckpt_shard_path(path, sizeof path, tmp, r->rank, r->world);
    nb_ckpt_write_list(path, &shard, 0);
    if (r->rank == 0) write_contents(tmp, r->fam, &r->o, model, optim, st);
    nb_comm_barrier_host(); /* every shard is on disk */
    if (r->rank == 0) nb_dir_replace(tmp, final);
    nb_comm_barrier_host(); /* the checkpoint is in place for every rank */
    nb_ckpt_list_free(&shard);
}

void nb_ckpt_save(nb_run *r, const char *out_dir, const nb_ckpt_state *st) {
    nb_ckpt_list model = {0}, optim = {0};
    r->fam->ckpt_tensors(r, &model, &optim);
    if (nb_run_sharded(r))
        save_sharded(r, out_dir, &model, &optim, st);
    else
        nb_ckpt_write(out_dir, r->fam, &r->o, &model, &optim, st);
    nb_ckpt_list_free(&model), nb_ckpt_list_free(&optim);
}

void nb_ckpt_write(const char *out_dir, const nb_family_i *fam, const nb_train_opts *o, const nb_ckpt_list *model,
                   const nb_ckpt_list *optim, const nb_ckpt_state *st) {
    char final[NB_PATH_MAX + 16], tmp[NB_PATH_MAX + 32];
    snprintf(final, sizeof final, "%s/ckpt", out_dir);
    nb_dir_tmp_begin(final, tmp, sizeof tmp);
    write_contents(tmp, fam, o, model, optim, st);
    nb_dir_replace(tmp, final);
}
