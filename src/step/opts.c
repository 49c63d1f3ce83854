/* Training options: each family's defaults, the printed configuration, and the checks every
 * option passes whether it came from a flag or from a checkpoint's state.json. */
#include "step/opts.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "data/balance.h"

static void common_defaults(nb_train_opts *o) {
    snprintf(o->device, sizeof o->device, "cpu");
    snprintf(o->schedule, sizeof o->schedule, "plain");
    snprintf(o->erase_dispatch, sizeof o->erase_dispatch, "blocking");
    snprintf(o->emb_optim, sizeof o->emb_optim, "adagrad");
    snprintf(o->emb_shard, sizeof o->emb_shard, "auto");
    snprintf(o->emb_place, sizeof o->emb_place, "gpu");
    o->graph_cache = 16;
    snprintf(o->index_lists, sizeof o->index_lists, "auto");
    snprintf(o->balance, sizeof o->balance, "none");
    o->stream_slots = 2;
    o->pinned_slabs = 2;
    o->beta1 = 0.9f;
    o->eps = 1e-8f;
    o->emb_lr = 0.05f;
    o->table_cap = 100000;
    o->eval_samples = 16384;
    o->grad_accum = 1;
    snprintf(o->comm, sizeof o->comm, "auto");
    o->comm_timeout = 300;
    o->world = 1;
}

/* gpt2-mini on the State of the Union corpus, cosine learning rate with warm-up, clipping */
static void transformer_defaults(nb_train_opts *o) {
    nb_tf_preset("gpt2-mini", &o->model);
    snprintf(o->data, sizeof o->data, "data/sotu/train.bin");
    snprintf(o->val_data, sizeof o->val_data, "data/sotu/val.bin");
    o->aux_weight = 1.0f;
    o->side_lanes = 2;
    o->batch = 8;
    o->seq = 0; /* 0: the model's context length */
    o->steps = 400;
    o->warmup = -1; /* -1: 5% of steps */
    o->eval_every = 100;
    o->eval_batches = 16;
    o->lr = 3e-3f;
    o->min_lr_frac = 0.1f;
    o->weight_decay = 0.1f;
    o->beta2 = 0.95f;
    o->grad_clip = 1.0f;
    o->seed = 1337;
}

/* seqctr on synthetic clicks: a constant learning rate (warm-up 0, final fraction 1), Adam's
 * default betas, no weight decay and no clipping, as the model was built and measured with */
static void seqctr_defaults(nb_train_opts *o) {
    snprintf(o->data, sizeof o->data, "synth");
    o->side_lanes = 4;
    o->batch = 256;
    o->steps = 300;
    o->warmup = 0;
    o->eval_every = 0;
    o->log_every = 50;
    o->lr = 1e-3f;
    o->min_lr_frac = 1.0f;
    o->beta2 = 0.999f;
    o->seed = 1;
}

void nb_train_opts_defaults(nb_train_opts *o, const char *family) {
    memset(o, 0, sizeof *o);
    common_defaults(o);
    NB_ASSERT(!strcmp(family, "transformer") || !strcmp(family, "seqctr"));
    snprintf(o->family, sizeof o->family, "%s", family);
    nb_tf_preset("gpt2-mini", &o->model);
    nb_sc_config_default(&o->ctr); /* seqctr's shape, whatever the family: --help shows it */
    o->ctr.E = 32;
    o->ctr.max_len = 32;
    if (!strcmp(family, "seqctr"))
        seqctr_defaults(o);
    else
        transformer_defaults(o);
}

int nb_train_parts(const nb_train_opts *o) { return o->emulate_ranks > 1 ? o->emulate_ranks : o->grad_accum; }

int nb_train_warmup_steps(const nb_train_opts *o) { return o->warmup >= 0 ? o->warmup : o->steps / 20; }

static int is_seqctr(const nb_train_opts *o) { return !strcmp(o->family, "seqctr"); }

void nb_train_opts_print(const nb_train_opts *o, FILE *f) {
    if (is_seqctr(o)) {
        const nb_sc_config *c = &o->ctr;
        fprintf(f, "model       seqctr: E %d, %d history layer%s x %d heads, %d blocks (cross rank %d, hidden %d), max_len %d, tables of up to %lld rows\n",
                c->E, c->hist_layers, c->hist_layers == 1 ? "" : "s", c->heads, c->blocks, c->cross_rank, c->block_hidden,
                c->max_len, (long long)o->table_cap);
        fprintf(f, "data        %s, %d held-out samples\n", o->data, o->eval_samples);
    } else {
        nb_tf_config_print(&o->model, f);
        fprintf(f, "data        train %s, val %s\n", o->data, o->val_data[0] ? o->val_data : "(none)");
    }
    long long per_step = is_seqctr(o) ? (long long)o->batch : (long long)o->batch * o->seq;
    fprintf(f, "run         device %s%s%s, schedule %s%s%s, batch %d%s, steps %d, seed %llu, threads %d\n", o->device,
            o->precision[0] ? " " : "", o->precision, o->schedule, o->detach[0] ? " --detach " : "", o->detach, o->batch,
            "", o->steps, (unsigned long long)o->seed, o->threads);
    if (!is_seqctr(o)) fprintf(f, "            %d x %d = %lld tokens/step\n", o->batch, o->seq, per_step);
    if (o->warmup == 0 && o->min_lr_frac == 1.0f)
        fprintf(f, "optimizer   adamw lr %g (constant)", o->lr);
    else
        fprintf(f, "optimizer   adamw lr %g (warmup %d, cosine to %g)", o->lr, nb_train_warmup_steps(o), o->lr * o->min_lr_frac);
    fprintf(f, ", betas (%g, %g), eps %g, weight decay %g, clip %g", o->beta1, o->beta2, o->eps, o->weight_decay, o->grad_clip);
    if (is_seqctr(o)) fprintf(f, "; tables: %s lr %g", o->emb_optim, o->emb_lr);
    fputc('\n', f);
    fprintf(f, "output      %s%s%s\n", o->out[0] ? o->out : "(none: --out DIR keeps metrics and checkpoints)",
            o->resume[0] ? ", resuming from " : "", o->resume);
}

/* A finite number within [lo, hi] (hi_open: below hi). */
static void check_range(const char *name, double x, double lo, double hi, int hi_open, const char *what) {
    int ok = isfinite(x) && x >= lo && (hi_open ? x < hi : x <= hi);
    NB_CHECK(ok, "pass a value in the range the message names (flag or state.json field)", "--%s is %g: it must be %s", name,
             x, what);
}

void nb_train_opts_check(const nb_train_opts *o) {
    static const char *hint = "pass a value in the range the message names (flag or state.json field)";
    NB_CHECK(o->batch >= 1, hint, "--batch is %d: it must be at least 1", o->batch);
    NB_CHECK(o->steps >= 1, hint, "--steps is %d: it must be at least 1", o->steps);
    NB_CHECK(o->stop_after >= 0, hint, "--stop-after is %d: it must be >= 0 (0: none)", o->stop_after);
    NB_CHECK(o->warmup >= -1, hint, "--warmup is %d: it must be >= 0, or -1 for 5%% of the steps", o->warmup);
    NB_CHECK(o->eval_every >= 0 && o->eval_batches >= 0 && o->ckpt_every >= 0 && o->log_every >= 0, hint,
             "--eval-every %d, --eval-batches %d, --ckpt-every %d, --log-every %d: none may be negative", o->eval_every,
             o->eval_batches, o->ckpt_every, o->log_every);
    NB_CHECK(o->threads >= 0, hint, "--threads is %d: it must be >= 0 (0: all cores)", o->threads);
    NB_CHECK(o->graph_cache >= 1 && o->graph_cache <= 1024, hint, "--graph-cache is %d: it must be in 1..1024",
             o->graph_cache);
    check_range("lr", o->lr, 1e-30, 3.4e38, 0, "a positive number");
    check_range("min-lr-frac", o->min_lr_frac, 0, 1, 0, "between 0 and 1");
    check_range("weight-decay", o->weight_decay, 0, 1e3, 0, ">= 0");
    check_range("beta1", o->beta1, 0, 1, 1, "in [0, 1)");
    check_range("beta2", o->beta2, 0, 1, 1, "in [0, 1)");
    check_range("eps", o->eps, 1e-45, 1, 0, "a positive number");
    check_range("grad-clip", o->grad_clip, 0, 1e30, 0, ">= 0 (0: off)");
    check_range("time-limit", o->time_limit, 0, 1e12, 0, ">= 0 (0: none)");
    check_range("aux-weight", o->aux_weight, 0, 1e6, 0, ">= 0");
    check_range("emb-lr", o->emb_lr, 1e-30, 3.4e38, 0, "a positive number");
    NB_CHECK(o->side_lanes >= 1 && o->side_lanes <= NB_MAX_SEGMENTS, "pass --side-lanes between 1 and 64",
             "--side-lanes %d", o->side_lanes);
    NB_CHECK(!strcmp(o->erase_dispatch, "blocking") || !strcmp(o->erase_dispatch, "async"),
             "use --erase-dispatch blocking or async", "unknown --erase-dispatch '%s'", o->erase_dispatch);
    NB_CHECK(!strcmp(o->emb_optim, "adagrad") || !strcmp(o->emb_optim, "adam"), "pass --emb-optim adagrad or adam",
             "unknown --emb-optim '%s'", o->emb_optim);
    NB_CHECK(!strcmp(o->emb_shard, "auto") || !strcmp(o->emb_shard, "row") || !strcmp(o->emb_shard, "none"),
             "pass --emb-shard row, none or auto", "unknown --emb-shard '%s'", o->emb_shard);
    NB_CHECK(!strcmp(o->emb_place, "gpu") || !strcmp(o->emb_place, "host"), "pass --emb-place gpu or host",
             "unknown --emb-place '%s'", o->emb_place);
    NB_CHECK(!strcmp(o->index_lists, "auto") || !strcmp(o->index_lists, "host") || !strcmp(o->index_lists, "device"),
             "pass --index-lists auto, host or device", "unknown --index-lists '%s'", o->index_lists);
    NB_CHECK(o->table_cap >= 1, hint, "--table-cap is %lld: it must be at least 1", (long long)o->table_cap);
    NB_CHECK(o->eval_samples >= 1, hint, "--eval-samples is %d: it must be at least 1", o->eval_samples);
    NB_CHECK(o->grad_accum >= 1 && o->grad_accum <= 4096, hint, "--grad-accum is %d: it must be in 1..4096", o->grad_accum);
    NB_CHECK(o->emulate_ranks == 0 || (o->emulate_ranks >= 2 && o->emulate_ranks <= 256), hint,
             "--emulate-ranks is %d: it must be 2..256 (0: none)", o->emulate_ranks);
    nb_balance b;
    nb_balance_parse(&b, o->balance);
    check_range("comm-timeout", o->comm_timeout, 0.1, 1e7, 0, "a positive number of seconds");
    NB_CHECK(!strcmp(o->comm, "auto") || !strcmp(o->comm, "mpi") || !strcmp(o->comm, "nccl") || !strcmp(o->comm, "host"),
             "pass --comm auto, mpi, nccl or host", "unknown --comm '%s'", o->comm);
    NB_CHECK(o->world >= 1, hint, "world %d: the ranks a run was started with are at least 1", o->world);
}

/* "all" or an increasing list of first pieces of the segments after the first, like 2,4 */
int nb_parse_detach(const char *spec, int n, const char *unit, int *first, int max_segments) {
    char hint[160];
    snprintf(hint, sizeof hint, "give 'all' or %s 1..%d, increasing, separated by commas (like --detach 2,4)", unit, n - 1);
    int nseg = 1;
    first[0] = 0;
    if (!strcmp(spec, "all")) {
        NB_CHECK(n <= max_segments, hint, "--detach all: %d segments, at most %d", n, max_segments);
        for (int i = 1; i < n; i++) first[nseg++] = i;
        first[nseg] = n;
        return nseg;
    }
    for (const char *p = spec; *p;) {
        char *end;
        long cut = strtol(p, &end, 10);
        NB_CHECK(end != p && (*end == ',' || !*end), hint, "--detach '%s' is not a list of %s", spec, unit);
        NB_CHECK(cut >= 1 && cut < n, hint, "--detach '%s': %ld is outside 1..%d (%s 1..%d)", spec, cut, n - 1, unit, n - 1);
        NB_CHECK(cut > first[nseg - 1], hint, "--detach '%s' is not increasing", spec);
        NB_CHECK(nseg < max_segments, hint, "--detach '%s': at most %d segments", spec, max_segments);
        first[nseg++] = (int)cut;
        p = *end ? end + 1 : end;
    }
    first[nseg] = n;
    return nseg;
}
