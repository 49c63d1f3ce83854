/* nobubble plan: will a model train on this machine, with which schedule and flags. For each
 * transformer schedule (plain, erase, stream) it makes the run's own memory plan without
 * allocating (nb_run_plan_only: the same functions a training run sizes its arenas, slots and
 * staging with), on the GPU this machine has (or --gpu-mem emulates) and the host memory it has
 * (or --host-mem), then prints the bytes per term on each side, whether it fits, the largest
 * batch that fits and the flags to use. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "commands.h"
#include "core.h"
#include "host.h"
#include "model/transformer_hf.h"
#include "ops/backend.h"
#include "run/run.h"
#include "sched/sched.h"

int nb_train_flags(const char *cmd, const char *summary, int argc, char **argv, nb_train_opts *o, const nb_family_i **famp);

static const char *PLAN_SUMMARY =
    "Will a model train on this machine? For each schedule of a transformer (plain, erase, stream) the\n"
    "run's own memory plan, made without allocating: the bytes per term in host and GPU memory, whether it fits,\n"
    "the largest --batch that fits and the flags to use. The model: --model NAME, --init-from HF_DIR,\n"
    "or --config CONFIG_JSON (a Hugging Face config.json alone); with --batch, --seq and the schedule\n"
    "options of 'nobubble train' (--gpu-layers, --stream-slots, --ckpt-interval, --keep-layers,\n"
    "--grad-clip, --precision). The machine: the GPU's free memory through the backend and the host's\n"
    "available memory (/proc/meminfo), or --gpu-mem SIZE and --host-mem SIZE (80G, 128G: powers of\n"
    "1024; 80GB: of 1000; --gpu-mem 0: no GPU, the CPU backend). Without --gpu-layers the stream plan\n"
    "takes -1 (as many layers as fit stay on the GPU). seqctr and dlrm-dcnv2: the plan with the tables\n"
    "in GPU memory and in pinned host memory (--emb-place host), which fits and the flags.";

typedef struct {
    size_t gpu, host;
    int has_gpu;
} machine;

/* "80G", "128GiB", "80GB", "1.5T", "4096": bytes; 0 and a usage error for anything else. */
static size_t parse_size(const char *flag, const char *v) {
    char *end;
    double x = strtod(v, &end);
    double k = 1;
    char u = (char)toupper((unsigned char)*end);
    int si = end[0] && (end[1] == 'B' || end[1] == 'b') && end[2] == 0;
    if (u == 'K' || u == 'M' || u == 'G' || u == 'T') {
        int p = u == 'K' ? 1 : u == 'M' ? 2 : u == 'G' ? 3 : 4;
        for (int i = 0; i < p; i++) k *= si ? 1000.0 : 1024.0;
        end += 1 + si;
        if (!strcmp(end, "iB") || !strcmp(end, "ib")) end += 2;
    }
    if (end == v || *end || x < 0) nb_usage_error("plan", "%s %s: give bytes, or a size such as 80G or 128GB", flag, v);
    return (size_t)(x * k);
}

/* Takes "--name V" / "--name=V" out of argv (train's parse does not know it); the last wins. */
static const char *take_flag(int *argc, char **argv, const char *flag) {
    size_t n = strlen(flag);
    const char *v = NULL;
    int out = 1;
    for (int i = 1; i < *argc; i++) {
        if (!strcmp(argv[i], flag) && i + 1 < *argc) {
            v = argv[++i];
            continue;
        }
        if (!strncmp(argv[i], flag, n) && argv[i][n] == '=') {
            v = argv[i] + n + 1;
            continue;
        }
        argv[out++] = argv[i];
    }
    *argc = out;
    return v;
}

/* The GPU's free memory when this build and machine have one (0: none). */
static size_t detect_gpu(void) {
    if (nb_cuda_device_count(NULL, 0) <= 0) return 0;
    nb_backend *b = nb_backend_create("cuda", "");
    size_t free_b = b->ops->mem_available();
    nb_backend_destroy(b);
    return free_b;
}

/* A Hugging Face config.json: its directory holds it under that name. */
static void apply_config(const char *path, nb_train_opts *o, int seq_given) {
    char dir[NB_PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    size_t n = strlen(dir);
    if (n >= 11 && !strcmp(dir + n - 11, "config.json")) dir[n - 11] = 0;
    if (!dir[0]) snprintf(dir, sizeof dir, ".");
    char probe[NB_PATH_MAX + 16];
    snprintf(probe, sizeof probe, "%s/config.json", dir);
    NB_CHECK(nb_file_exists(probe), "pass --config PATH/config.json (a Hugging Face model's config)", "no %s", probe);
    nb_hf_import_config(dir, seq_given ? o->seq : 0, &o->model);
    if (!seq_given) o->seq = o->model.seq;
}

/* One schedule's options: the stream's own options only for stream; -1 (as many as fit) for its
 * device layers unless given. */
static nb_train_opts sched_opts(const nb_train_opts *o, const char *name, int gpu_layers_given, int has_gpu) {
    nb_train_opts p = *o;
    snprintf(p.schedule, sizeof p.schedule, "%s", name);
    if (strcmp(name, "stream")) {
        p.ckpt_interval = 0, p.keep_layers = 0, p.gpu_layers = 0;
        return p;
    }
    if (!gpu_layers_given) p.gpu_layers = has_gpu ? -1 : 0;
    return p;
}

typedef struct {
    size_t host, dev;
    nb_mem_plan mem;
    char saved[192]; /* mem.saved, copied: the run it pointed into is freed */
    int fits;
} plan_result;

static plan_result plan_one(const nb_train_opts *o, const machine *m) {
    static nb_run r; /* large */
    int v = nb_verbosity;
    nb_verbosity = 0;
    nb_run_plan_only(&r, o, m->has_gpu ? m->gpu : 0);
    plan_result p = {nb_run_host_bytes(&r), nb_run_dev_bytes(&r), r.mem, "", 0};
    snprintf(p.saved, sizeof p.saved, "%s", r.mem.saved ? r.mem.saved : "");
    p.fits = p.host + r.mem.setup <= m->host && (!m->has_gpu || p.dev <= m->gpu);
    nb_run_free(&r);
    nb_verbosity = v;
    return p;
}

static int batch_fits(nb_train_opts o, int batch, const machine *m) {
    o.batch = batch;
    return plan_one(&o, m).fits;
}

/* The largest batch (up to 65536) whose plan fits, 0 when not even the smallest does. A batch is
 * a whole number of ranks x micro-batches (--grad-accum, --micro-batches, --emulate-ranks: the
 * trainer refuses any other), so the search runs over those multiples. */
static int largest_batch(nb_train_opts o, const machine *m) {
    int unit = o.world * nb_train_parts(&o), top = 65536 / unit; /* --world and the parts are >= 1 */
    if (top == 0) return 0;
    int lo = 0, hi = 1; /* in units: lo fits, hi does not */
    while (hi <= top && batch_fits(o, hi * unit, m)) lo = hi, hi *= 2;
    if (hi > top) { /* every doubling fit: the cap itself? */
        if (batch_fits(o, top * unit, m)) return top * unit;
        hi = top;
    }
    while (hi - lo > 1) {
        int mid = lo + (hi - lo) / 2;
        if (batch_fits(o, mid * unit, m)) lo = mid;
        else hi = mid;
    }
    return lo * unit;
}

static void print_side(const char *name, const nb_mem_side *s, size_t total, size_t params) {
    char b[7][32];
    printf("  %-8s %10s (%5.2f bytes/param of state): weights %s, grads %s, moments %s, activations %s, slots/staging %s, other %s\n",
           name, nb_fmt_bytes(b[0], 32, (double)total), (double)(s->weights + s->grads + s->moments) / (double)(params ? params : 1),
           nb_fmt_bytes(b[1], 32, (double)s->weights), nb_fmt_bytes(b[2], 32, (double)s->grads),
           nb_fmt_bytes(b[3], 32, (double)s->moments), nb_fmt_bytes(b[4], 32, (double)s->acts),
           nb_fmt_bytes(b[5], 32, (double)s->slots), nb_fmt_bytes(b[6], 32, (double)s->other));
}

static void print_flags(const nb_train_opts *o, const plan_result *p, int batch) {
    printf("  flags  --schedule %s --batch %d --seq %d", o->schedule, batch, o->seq);
    if (!strcmp(o->schedule, "stream")) {
        printf(" --gpu-layers %d --stream-slots %d", p->mem.glayers, p->mem.wslots);
        if (o->ckpt_interval > 0) printf(" --ckpt-interval %d --keep-layers %d", o->ckpt_interval, p->mem.keep);
    }
    printf("\n");
}

static void plan_schedule(const nb_train_opts *o, const machine *m) {
    plan_result p = plan_one(o, m);
    /* the fp32 master: every parameter (and padding); LoRA: the model's, the base is not fp32 */
    size_t params = p.mem.params ? p.mem.params : p.mem.host.weights / sizeof(float);
    char a[32], b[32], c[32], d[32];
    printf("%-7s %s at --batch %d (host %s of %s%s%s%s%s)\n", o->schedule, p.fits ? "fits" : "does not fit", o->batch,
           nb_fmt_bytes(a, 32, (double)p.host), nb_fmt_bytes(b, 32, (double)m->host), m->has_gpu ? ", GPU " : "",
           m->has_gpu ? nb_fmt_bytes(c, 32, (double)p.dev) : "", m->has_gpu ? " of " : "",
           m->has_gpu ? nb_fmt_bytes(d, 32, (double)m->gpu) : "");
    print_side("host", &p.mem.host, p.host, params);
    /* the CPU backend's "device" memory is host RAM: its terms are counted in the host total */
    if (m->has_gpu || p.mem.dev.weights + p.mem.dev.acts) print_side(m->has_gpu ? "gpu" : "(in RAM)", &p.mem.dev, m->has_gpu ? p.dev : 0, params);
    if (p.saved[0]) printf("  left out of host memory: %s\n", p.saved);
    if (p.mem.setup)
        printf("  setup    %s more host memory while the base loads (one layer group at a time), freed before step 1\n",
               nb_fmt_bytes(a, 32, (double)p.mem.setup));
    if (o->lora_r > 0)
        printf("  lora     the frozen base in compute precision (%s), the adapters' fp32 master, gradient and AdamW "
               "moments where they train\n", !strcmp(o->schedule, "stream") ? "streamed layers' in pinned host memory, the "
               "stages' and device layers' where the step runs" : "where the step runs, plus an fp32 host copy");
    else if (!strcmp(o->schedule, "stream") && o->grad_clip > 0)
        printf("  --grad-clip 0 would leave out the layers' fp32 gradient slab (4 bytes/param of the streamed layers)\n");
    int best = largest_batch(*o, m);
    printf("  largest batch that fits: %d\n", best);
    if (p.fits) {
        print_flags(o, &p, o->batch);
    } else if (best > 0) {
        nb_train_opts ob = *o;
        ob.batch = best;
        plan_result q = plan_one(&ob, m);
        print_flags(&ob, &q, best);
    }
    printf("bytes   %s host %zu device %zu fits %d setup %zu\n", o->schedule, p.host, p.dev, p.fits, p.mem.setup);
}

/* seqctr and dlrm-dcnv2: the whole plan with the tables' rows and optimizer state in GPU memory,
 * then in pinned host memory (--emb-place host, read and updated in place by the GPU). */
static void plan_tables(const nb_train_opts *o, const machine *m) {
    int fit_at = -1;
    for (int place = NB_PLACE_GPU; place <= NB_PLACE_HOST; place++) {
        nb_train_opts p = *o;
        p.emb_place = place;
        plan_result r = plan_one(&p, m);
        char a[32], b[32], c[32], d[32];
        printf("%s %s at --batch %d (host %s of %s%s%s%s%s)\n",
               !m->has_gpu ? "tables (CPU backend)" : place == NB_PLACE_GPU ? "--emb-place gpu " : "--emb-place host",
               r.fits ? "fits" : "does not fit", o->batch, nb_fmt_bytes(a, 32, (double)r.host), nb_fmt_bytes(b, 32, (double)m->host),
               m->has_gpu ? ", GPU " : "", m->has_gpu ? nb_fmt_bytes(c, 32, (double)r.dev) : "", m->has_gpu ? " of " : "",
               m->has_gpu ? nb_fmt_bytes(d, 32, (double)m->gpu) : "");
        printf("  largest batch that fits: %d\n", largest_batch(p, m));
        printf("bytes   %s host %zu device %zu fits %d\n", !m->has_gpu ? "tables" : place == NB_PLACE_GPU ? "emb-place-gpu" : "emb-place-host",
               r.host, r.dev, r.fits);
        if (r.fits && fit_at < 0) fit_at = place;
        if (!m->has_gpu) break; /* one memory: the placement changes nothing */
    }
    if (fit_at >= 0)
        printf("flags   --batch %d%s\n", o->batch, fit_at == NB_PLACE_HOST ? " --emb-place host" : "");
    else
        printf("flags   none fits: lower --batch or --table-cap\n");
}

int nb_cmd_plan(int argc, char **argv) {
    const char *gpu_v = take_flag(&argc, argv, "--gpu-mem"), *host_v = take_flag(&argc, argv, "--host-mem");
    const char *config = take_flag(&argc, argv, "--config");
    nb_train_opts o;
    const nb_family_i *fam = NULL;
    if (nb_train_flags("plan", PLAN_SUMMARY, argc, argv, &o, &fam)) {
        printf("plan's own flags: --gpu-mem SIZE, --host-mem SIZE, --config CONFIG_JSON\n");
        return 0;
    }
    int seq_given = 0;
    for (int i = 1; i < argc; i++) seq_given |= !strncmp(argv[i], "--seq", 5);
    if (config) apply_config(config, &o, seq_given);
    machine m = {0, 0, 0};
    m.gpu = gpu_v ? parse_size("--gpu-mem", gpu_v) : detect_gpu();
    m.has_gpu = m.gpu > 0;
    m.host = host_v ? parse_size("--host-mem", host_v) : nb_host_mem_available();
    int gl_given = 0;
    for (int i = 1; i < argc; i++) gl_given |= !strncmp(argv[i], "--gpu-layers", 12);
    char a[32], b[32];
    fam->print_model(&o, stdout);
    printf("machine host %s%s, GPU %s%s\n", nb_fmt_bytes(a, 32, (double)m.host), host_v ? " (--host-mem)" : " available",
           m.has_gpu ? nb_fmt_bytes(b, 32, (double)m.gpu) : "none (the CPU backend)", gpu_v ? " (--gpu-mem)" : "");
    if (!fam->layers) { /* seqctr, dlrm-dcnv2: where the tables go */
        plan_tables(&o, &m);
        return 0;
    }
    for (const char *name[] = {"plain", "erase", "stream", NULL}, **s = name; *s; s++) {
        const nb_sched_i *sc = nb_sched_find(*s);
        const char *why = NULL;
        if (!sc || (sc->applies && !sc->applies(fam, &why))) continue;
        nb_train_opts p = sched_opts(&o, *s, gl_given, m.has_gpu);
        const char *hint = NULL, *refused = nb_sched_refuses(sc, &p, &hint);
        if (refused) {
            printf("%-7s does not run with these flags: %s (%s)\n", *s, refused, hint);
            continue;
        }
        plan_schedule(&p, &m);
    }
    return 0;
}
