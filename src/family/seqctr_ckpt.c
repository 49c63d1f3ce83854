/* The seqctr family's checkpoints: the dense tensors and their AdamW moments under seqctr.h's
 * names, the tables and their optimizer state (whole: emb.cat.{f}, emb.item; sharded: each rank's
 * shard, emb.shard), resume from either, export, and the model's shape in state.json. */
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "family/seqctr.h"
#include "family/seqctr_family.h"

static void table_name(const nb_sc_config *c, char *buf, size_t cap, int t, const char *suffix) {
    if (t == nb_sc_item_table(c))
        snprintf(buf, cap, "emb.item%s", suffix);
    else
        snprintf(buf, cap, "emb.cat.%d%s", t, suffix);
}

/* Does the checkpoint a forward-only run reads (eval, export, sample) hold its tables in shards?
 * Several ranks' do (--emb-shard auto or row), and so does one process's whose step went through
 * the sharded exchange (--schedule pipe, --micro-batches, --emulate-ranks): that run's schedule is
 * not the forward's, so the shard file itself says it. */
static int ckpt_in_shards(const nb_run *r) {
    if (!r->eval_only || !r->ckpt_world) return 0;
    if (nb_seqctr_shard_opts(&r->o, r->ckpt_world)) return 1;
    char path[NB_PATH_MAX + 96];
    nb_ckpt_shard_path(path, sizeof path, r->o.resume, 0, r->ckpt_world);
    return nb_file_exists(path);
}

/* seqctr.h's names: the dense tensors, emb.cat.{f} [rows_f, E] and emb.item [item_rows, E]; the
 * optimizer state "<name>.exp_avg" / ".exp_avg_sq" (AdamW; sparse Adam on the tables) or
 * "<table>.adagrad_sum" [rows] (row-wise Adagrad) or "<table>.adagrad_sum_exact" [rows, E] (element-wise) */
void nb_seqctr_ckpt_tensors(nb_run *r, nb_ckpt_list *model, nb_ckpt_list *optim) {
    nb_sc_model *m = &T(r)->m;
    int E = m->cfg.E;
    char name[96];
    for (int i = 0; i < m->ntensors; i++) {
        const nb_sc_tensor *t = &m->t[i];
        int64_t sh[2] = {t->rows, t->cols};
        int nd = t->cols == 1 ? 1 : 2;
        nb_ckpt_list_add(model, t->name, nd, sh, m->params + t->off);
        if (!optim) continue;
        snprintf(name, sizeof name, "%s.exp_avg", t->name);
        nb_ckpt_list_add(optim, name, nd, sh, m->am + t->off);
        snprintf(name, sizeof name, "%s.exp_avg_sq", t->name);
        nb_ckpt_list_add(optim, name, nd, sh, m->av + t->off);
    }
    /* the tables of a sharded run: each rank's shard (sc_shard_tensors; assemble_shards reads them all) */
    if (T(r)->sharded || ckpt_in_shards(r)) return;
    for (int t = 0; t < nb_sc_ntables(&m->cfg); t++) {
        int64_t rows = m->emb_off[t + 1] - m->emb_off[t], sh[2] = {rows, E};
        size_t at = (size_t)m->emb_off[t] * (size_t)E;
        table_name(&m->cfg, name, sizeof name, t, "");
        nb_ckpt_list_add(model, name, 2, sh, m->emb.table + at);
        if (!optim) continue;
        if (m->emb.acc) {
            table_name(&m->cfg, name, sizeof name, t, ".adagrad_sum");
            nb_ckpt_list_add(optim, name, 1, sh, m->emb.acc + m->emb_off[t]);
        }
        if (m->emb.avg) {
            table_name(&m->cfg, name, sizeof name, t, ".exp_avg");
            nb_ckpt_list_add(optim, name, 2, sh, m->emb.avg + at);
            table_name(&m->cfg, name, sizeof name, t, ".exp_avg_sq");
            nb_ckpt_list_add(optim, name, 2, sh, m->emb.avg_sq + at);
        } else if (m->emb.avg_sq) { /* element-wise Adagrad's sums */
            table_name(&m->cfg, name, sizeof name, t, ".adagrad_sum_exact");
            nb_ckpt_list_add(optim, name, 2, sh, m->emb.avg_sq + at);
        }
    }
}

/* Sharded: this rank's rows of every table (global row g = i * world + rank at row i, g as
 * seqctr.h's table offset + row) and their optimizer state. */
int nb_seqctr_shard_tensors(nb_run *r, nb_ckpt_list *shard) {
    sc_train *t = T(r);
    if (!t || !t->sharded) return 0;
    if (!shard) return 1;
    nb_sc_model *m = &t->m;
    int64_t sh[2] = {m->emb.rows, m->cfg.E};
    nb_ckpt_list_add(shard, "emb.shard", 2, sh, m->emb.table);
    if (m->emb.acc) nb_ckpt_list_add(shard, "emb.shard.adagrad_sum", 1, sh, m->emb.acc);
    if (m->emb.avg) {
        nb_ckpt_list_add(shard, "emb.shard.exp_avg", 2, sh, m->emb.avg);
        nb_ckpt_list_add(shard, "emb.shard.exp_avg_sq", 2, sh, m->emb.avg_sq);
    } else if (m->emb.avg_sq) {
        nb_ckpt_list_add(shard, "emb.shard.adagrad_sum_exact", 2, sh, m->emb.avg_sq);
    }
    return 1;
}

/* A sharded checkpoint read by one process (eval, export, sample): every rank's rows into the
 * whole tables. */
static void assemble_shards(nb_run *r, const char *dir) {
    nb_sc_model *m = &T(r)->m;
    int N = r->ckpt_world;
    int64_t total = nb_sc_total_rows(m), E = m->cfg.E;
    char path[NB_PATH_MAX + 96];
    for (int k = 0; k < N; k++) {
        int64_t rows = (total - k + N - 1) / N, sh[2] = {rows, E};
        float *buf = nb_malloc((size_t)(rows ? rows : 1) * (size_t)E * sizeof(float), "a table shard");
        nb_ckpt_list l = {.partial = 1}; /* the table's rows, not their optimizer state */
        nb_ckpt_list_add(&l, "emb.shard", 2, sh, buf);
        nb_ckpt_expect(&l, dir);
        nb_ckpt_shard_path(path, sizeof path, dir, k, N);
        nb_ckpt_load_file(path, &l);
        for (int64_t i = 0; i < rows; i++)
            memcpy(m->emb.table + (size_t)(i * N + k) * (size_t)E, buf + (size_t)i * (size_t)E, (size_t)E * sizeof(float));
        nb_ckpt_list_free(&l);
        free(buf);
    }
}

/* Weights from the seed (bound already), or the checkpoint in resume_dir: the dense tensors and
 * their AdamW moments, the tables (this rank's shard, or every shard assembled) and their
 * optimizer state, and the data position. */
void nb_seqctr_start(nb_run *r, const char *resume_dir) {
    sc_train *t = T(r);
    if (resume_dir) {
        nb_ckpt_list model = {0}, optim = {0};
        nb_seqctr_ckpt_tensors(r, &model, r->eval_only ? NULL : &optim);
        nb_ckpt_load_lists(resume_dir, &model, r->eval_only ? NULL : &optim);
        nb_ckpt_list_free(&model), nb_ckpt_list_free(&optim);
        if (t->sharded) { /* this rank's shard, written by this rank (the world size was checked) */
            nb_ckpt_list shard = {0};
            char path[NB_PATH_MAX + 96];
            nb_seqctr_shard_tensors(r, &shard);
            nb_ckpt_expect(&shard, resume_dir);
            nb_ckpt_shard_path(path, sizeof path, resume_dir, r->rank, r->world);
            nb_ckpt_load_file(path, &shard);
            nb_ckpt_list_free(&shard);
        } else if (ckpt_in_shards(r)) {
            assemble_shards(r, resume_dir);
        }
        nb_sc_to_device(&t->m);
        nb_ctr_source_seek(&t->src, r->data_pos0);
    }
}

int nb_sc_export(nb_run *r, const char *path) {
    sc_train *t = T(r);
    nb_sc_to_host(&t->m);
    nb_sc_save(&t->m, path);
    return t->m.ntensors + nb_sc_ntables(&t->m.cfg);
}

void nb_seqctr_write_config(const nb_train_opts *o, nb_json_writer *w) {
    const nb_sc_config *c = &o->ctr;
    nb_json_key(w, "model");
    nb_json_begin_obj(w);
    nb_json_kstr(w, "preset", nb_sc_dlrm(c) ? "dlrm-dcnv2" : "seqctr");
    nb_json_kint(w, "E", c->E);
    nb_json_kint(w, "hist_layers", c->hist_layers);
    nb_json_kint(w, "heads", c->heads);
    nb_json_kint(w, "blocks", c->blocks);
    nb_json_kint(w, "cross_rank", c->cross_rank);
    nb_json_kint(w, "block_hidden", c->block_hidden);
    nb_json_kint(w, "max_len", c->max_len);
    nb_json_kint(w, "ndense", c->ndense);
    nb_json_kint(w, "ncat", c->ncat);
    char mv[16 * NB_SC_MAX_CAT];
    if (nb_sc_mv_string(c, mv, sizeof mv)) nb_json_kstr(w, "multi_valued", mv); /* column:pooling:max_values */
    if (nb_sc_dlrm(c)) { /* the DLRM form's top MLP widths */
        char top[16 * NB_SC_MAX_TOP];
        nb_sc_top_string(c, top, sizeof top);
        nb_json_kstr(w, "top", top);
    }
    nb_json_end_obj(w);
}

/* A field of the model section, in the range of its flag's row of the options table (the same
 * bounds as --help shows and the flag checks). */
static int req_int(const nb_json *j, const char *key, const char *flag) {
    const nb_opt *row = nb_opt_find(flag, 1u << NB_OPTG_SC);
    NB_ASSERT(row != NULL);
    int64_t v = nb_json_req_int(j, key);
    NB_CHECK(v >= row->lo && v <= row->hi, "the checkpoint is damaged: resume from an earlier copy of the run directory",
             "state.json: model field '%s' is %lld, outside %.0f..%.0f (--%s)", key, (long long)v, row->lo, row->hi, flag);
    return (int)v;
}

void nb_seqctr_read_config(const nb_json *j, nb_train_opts *o) {
    nb_sc_config *c = &o->ctr;
    c->E = req_int(j, "E", "emb-dim");
    c->hist_layers = req_int(j, "hist_layers", "hist-layers");
    c->heads = req_int(j, "heads", "heads");
    c->blocks = req_int(j, "blocks", "blocks");
    c->cross_rank = req_int(j, "cross_rank", "cross-rank");
    c->block_hidden = req_int(j, "block_hidden", "block-hidden");
    c->max_len = req_int(j, "max_len", "max-len");
    /* the data's shape; checkpoints from before it was kept are the standard one */
    int64_t nd = nb_json_get_int(j, "ndense", NB_SC_STD_NDENSE), nc = nb_json_get_int(j, "ncat", NB_SC_STD_NCAT);
    NB_CHECK(nd >= 0 && nd <= NB_SC_MAX_DENSE && nc >= 0 && nc <= NB_SC_MAX_CAT,
             "the checkpoint is damaged: resume from an earlier copy of the run directory",
             "state.json: the model reads %lld dense and %lld categorical columns (at most %d and %d)", (long long)nd,
             (long long)nc, NB_SC_MAX_DENSE, NB_SC_MAX_CAT);
    c->ndense = (int)nd, c->ncat = (int)nc;
    const char *mv = nb_json_get_str(j, "multi_valued", "");
    NB_CHECK(nb_sc_mv_parse(c, mv), "the checkpoint is damaged: resume from an earlier copy of the run directory",
             "state.json: model field 'multi_valued' is '%.60s' (column:sum|mean:max_values, ...)", mv);
    const char *top = nb_json_get_str(j, "top", "");
    NB_CHECK(nb_sc_top_parse(c, top), "the checkpoint is damaged: resume from an earlier copy of the run directory",
             "state.json: model field 'top' is '%.60s' (widths like 1024,1024,512,256)", top);
}
