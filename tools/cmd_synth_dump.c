/* nobubble synth-dump: write samples of the synthetic click generator (src/data/synth.h) to a
 * flat binary file, so that another implementation of seqctr (bench/seqctr_torch.py) trains on
 * exactly the samples `nobubble train --model seqctr --data synth:...` trains on.
 *
 * The generator is opened the way the trainer opens it (data/ctr_source.c, nb_ctr_source_open): the
 * spec gets ",max_len=<--max-len>" appended unless it names max_len itself, and the table rows are
 * min(cardinality, --table-cap) per categorical field and min(items, --table-cap) for the item
 * table. Training step k reads samples k*B .. k*B + B - 1, so samples 0 .. S*B - 1 are the ones
 * S steps of batch B train on (held-out evaluation starts at 2^40: --first 1099511627776).
 *
 * File layout (NBSYNTH1 version 1), all little-endian, 1024-byte header:
 *   off  type        field
 *     0  char[8]     magic "NBSYNTH1"
 *     8  u32         version (1)
 *    12  u32         header bytes (1024)
 *    16  u64         n: samples in the file
 *    24  u64         first: generator index of the first sample
 *    32  u64         total: history items in the file (= hist_off[n])
 *    40  u32         max_len: history cap (hist_len <= max_len)
 *    44  u32         dense features (13)
 *    48  u32         categorical features (26)
 *    52  u32         0
 *    56  u64         table_cap (--table-cap)
 *    64  u64[26]     cat_rows: rows of categorical table f; row = id mod cat_rows[f]
 *   272  u64         item_rows: rows of the item table; row = id mod item_rows (target, history)
 *   280  u64[26]     card: the generator's cardinality of field f (every id < card[f])
 *   488  u64         items: the generator's item vocabulary (every item id < items)
 *   496  u64         seed of the generator
 *   504  u64         file bytes (the whole file; readers check it)
 *   512  u64[7]      byte offsets of the 7 arrays below, in order (each a multiple of 8)
 *   568  u64         0
 *   576  char[448]   the generator spec as opened, NUL-padded (e.g. "synth:cap=1000,max_len=16")
 * then the arrays, each starting at the next multiple of 8 bytes after the previous one:
 *   dense    f32 [n, 13]   log(1 + x), 0 when missing (what the model reads)
 *   cat      u32 [n, 26]   raw ids (0 <= id < card[f])
 *   target   u32 [n]       raw item id
 *   hist_len i32 [n]       0 .. max_len
 *   hist_off i64 [n + 1]   sample i's history is hist[hist_off[i] .. hist_off[i + 1]), most recent last
 *   hist     u32 [total]   raw item ids
 *   label    f32 [n]       0 or 1 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "args.h"
#include "commands.h"
#include "core.h"
#include "data/ctr_schema.h"
#include "data/synth.h"
#include "host.h"
#include "io/atomic.h"
#include "io/npy.h"
#include "model/seqctr.h"
#include "family/family.h" /* train's seqctr defaults: the same flags mean the same */

/* The arrays are written from memory as they are: the format is little-endian. */
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "synth-dump writes host-order arrays into a little-endian format: build on a little-endian host"
#endif
_Static_assert(NB_SYNTH_NDENSE <= NB_SC_MAX_DENSE && NB_SYNTH_NCAT <= NB_SC_MAX_CAT, "the model reads the generator's columns");

#define DUMP_MAGIC "NBSYNTH1"
#define DUMP_VERSION 1u
#define DUMP_HEADER 1024
#define DUMP_SPEC_OFF 576
#define DUMP_NARRAYS 7
#define DUMP_MAX_SAMPLES (1ULL << 36) /* labels are held in memory until the end: 4 bytes each */
#define DUMP_CHUNK_IDS (1 << 24)      /* padded history ids generated per chunk (64 MB) */

static const char *DUMP_SUMMARY =
    "Write samples --first .. --first + --samples - 1 of the synthetic click generator to a binary\n"
    "file (NBSYNTH1: 1024-byte header with the table rows --table-cap gives, then dense f32 [N,13],\n"
    "cat u32 [N,26], target u32 [N], hist_len i32 [N], hist_off i64 [N+1], hist u32 [total],\n"
    "label f32 [N]; layout in tools/cmd_synth_dump.c and bench/README.md). With the --data,\n"
    "--max-len and --table-cap of a `nobubble train --model seqctr` run, samples 0 .. S*B-1 are\n"
    "exactly the ones its S steps of batch B train on.";

typedef struct {
    FILE *f;
    char tmp[4200];
    const char *path;
} dump_file;

/* Any failure mid-file: remove the temp file (the final path never sees a prefix), then fail. */
static void dump_fail(dump_file *d, const char *what, int err) {
    nb_atomic_abort(d->f, d->tmp);
    nb_fail("check free disk space and that --out is writable", "cannot write '%s' (%s): %s", d->path, what,
            strerror(err));
}

static void write_at(dump_file *d, uint64_t off, const void *data, size_t bytes) {
    if (fseeko(d->f, (off_t)off, SEEK_SET) != 0) dump_fail(d, "seek", errno);
    if (bytes && fwrite(data, 1, bytes, d->f) != bytes) dump_fail(d, "write", errno ? errno : EIO);
}

static void put_u32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static void put_u64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static uint64_t align8(uint64_t x) { return (x + 7) & ~(uint64_t)7; }

/* The folders above prefix (DIR/day_N: DIR is the data set's folder), made when missing. */
static void make_parents(const char *prefix) {
    char d[NB_PATH_MAX];
    snprintf(d, sizeof d, "%s", prefix);
    for (char *p = d + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        NB_CHECK(mkdir(d, 0777) == 0 || errno == EEXIST, "check that --out's folder can be made", "cannot make %s: %s", d,
                 strerror(errno));
        *p = '/';
    }
}

/* --format mlperf: the samples as MLPerf DLRM-DCNv2's day files (data/mlperf.h), in memory then
 * written whole: PREFIX_dense.npy f32 [n, 13], PREFIX_labels.npy i32 [n, 1],
 * PREFIX_sparse_multi_hot.npz (0.npy .. 25.npy: i32 [n, k_f]). */
static int dump_mlperf(const nb_synth *g, uint64_t first, uint64_t n, const char *prefix) {
    if (!g->o.multi_hot) nb_usage_error("synth-dump", "--format mlperf writes multi-hot samples: add multi_hot=1 to --data");
    if (n > (1u << 22)) nb_usage_error("synth-dump", "--format mlperf holds a file in memory: at most 4194304 samples per call");
    float *dense = nb_malloc((size_t)n * NB_SYNTH_NDENSE * sizeof(float), "synth-dump"), *label = nb_malloc((size_t)n * sizeof(float), "synth-dump");
    uint32_t *cat = nb_malloc((size_t)n * NB_SYNTH_NCAT * sizeof(uint32_t), "synth-dump");
    uint32_t *mv = nb_malloc((size_t)n * NB_SYNTH_MH_WIDTH * sizeof(uint32_t), "synth-dump");
    int32_t *mvlen = nb_malloc((size_t)n * NB_SYNTH_NCAT * sizeof(int32_t), "synth-dump");
    int32_t *ilabel = nb_malloc((size_t)n * sizeof(int32_t), "synth-dump"), *feat = nb_malloc((size_t)n * 100 * sizeof(int32_t), "synth-dump");
    make_parents(prefix);
    nb_synth_fill_multi_hot(g, first, (int)n, dense, cat, mv, mvlen, label);
    for (uint64_t i = 0; i < n; i++) ilabel[i] = label[i] > 0.5f;
    char path[NB_PATH_MAX + 32];
    unsigned char *bytes[NB_SYNTH_NCAT];
    size_t lens[NB_SYNTH_NCAT];
    const char *const which[2] = {"dense", "labels"};
    for (int a = 0; a < 2; a++) { /* the two .npy files */
        const char *descr = a ? "<i4" : "<f4";
        int64_t k = a ? 1 : NB_SYNTH_NDENSE;
        const void *src = a ? (const void *)ilabel : (const void *)dense;
        size_t len = nb_npy_encode(NULL, descr, 2, (int64_t)n, k, src, 4);
        unsigned char *buf = nb_malloc(len, "synth-dump");
        nb_npy_encode(buf, descr, 2, (int64_t)n, k, src, 4);
        snprintf(path, sizeof path, "%s_%s.npy", prefix, which[a]);
        char tmp[4200];
        FILE *f = nb_atomic_open(path, tmp, sizeof tmp);
        nb_atomic_write(f, tmp, path, buf, len);
        nb_atomic_commit(f, tmp, path);
        free(buf);
    }
    char names[NB_SYNTH_NCAT][16];
    const char *np[NB_SYNTH_NCAT];
    for (int f = 0, at = 0; f < NB_SYNTH_NCAT; at += nb_synth_mlperf_hot[f++]) {
        int k = nb_synth_mlperf_hot[f];
        for (uint64_t i = 0; i < n; i++) memcpy(feat + i * (uint64_t)k, mv + i * NB_SYNTH_MH_WIDTH + at, (size_t)k * 4);
        lens[f] = nb_npy_encode(NULL, "<i4", 2, (int64_t)n, k, feat, 4);
        bytes[f] = nb_malloc(lens[f], "synth-dump");
        nb_npy_encode(bytes[f], "<i4", 2, (int64_t)n, k, feat, 4);
        snprintf(names[f], sizeof names[f], "%d.npy", f);
        np[f] = names[f];
    }
    snprintf(path, sizeof path, "%s_sparse_multi_hot.npz", prefix);
    nb_npz_write(path, NB_SYNTH_NCAT, np, (const unsigned char *const *)bytes, lens);
    for (int f = 0; f < NB_SYNTH_NCAT; f++) free(bytes[f]);
    printf("wrote %s_{dense,labels}.npy and %s: samples %llu..%llu of multi-hot synthetic data\n", prefix, path,
           (unsigned long long)first, (unsigned long long)(first + n - 1));
    free(dense), free(label), free(cat), free(mv), free(mvlen), free(ilabel), free(feat);
    free((void *)g);
    return 0;
}

int nb_cmd_synth_dump(int argc, char **argv) {
    /* train's defaults for the flags the two share, so a flag left out means the same in both */
    static nb_train_opts defaults;
    nb_train_opts_defaults(&defaults, nb_family_find("seqctr"));
    char data[NB_PATH_MAX] = "synth", out[NB_PATH_MAX] = "";
    uint64_t samples = 0, first = 0;
    int max_len = defaults.ctr.max_len, table_cap = (int)defaults.table_cap, threads = 0, quiet = 0;
    char format[16] = "nbsynth";
    nb_arg args[] = {
        {"data", ARG_STR, data, sizeof data, "SPEC", "synth[:k=v,...], as given to train", 0, 0, 0},
        {"samples", ARG_U64, &samples, 0, "N", "samples to write (required)", 0, 0, 0},
        {"first", ARG_U64, &first, 0, "I", "generator index of the first sample (evaluation starts at 2^40)", 0, 0, 0},
        {"max-len", ARG_INT, &max_len, 0, "L", "history cap, as train's --max-len (unless max_len= is in --data)", 0, 0, 0},
        {"table-cap", ARG_INT, &table_cap, 0, "C", "rows per embedding table at most, as train's --table-cap", 1, 0, 0},
        {"out", ARG_STR, out, sizeof out, "FILE", "file to write (crash-safely: temp file, then rename)", 0, 0, 0},
        {"threads", ARG_INT, &threads, 0, "N", "generator threads (0: all cores)", 0, 0, 0},
        {"quiet", ARG_BOOL, &quiet, 0, NULL, "no progress lines on stderr", 0, 0, 0},
        {"format", ARG_STR, format, sizeof format, "F", "nbsynth (the file above), or mlperf: --out is a prefix (DIR/day_N) "
         "of MLPerf DLRM-DCNv2's _dense.npy, _labels.npy and _sparse_multi_hot.npz (multi_hot=1 data)", 0, 0, 0},
    };
    int nargs = (int)(sizeof args / sizeof args[0]);
    if (nb_args_parse("synth-dump", DUMP_SUMMARY, args, nargs, argc, argv)) return 0;
    if (!out[0]) nb_usage_error("synth-dump", "--out FILE is required");
    if (!nb_args_seen(args, nargs, "samples")) nb_usage_error("synth-dump", "--samples N is required");
    if (samples < 1 || samples > DUMP_MAX_SAMPLES)
        nb_usage_error("synth-dump", "--samples must be in 1 .. %llu, got %llu", (unsigned long long)DUMP_MAX_SAMPLES,
                       (unsigned long long)samples);
    if (first > UINT64_MAX - samples)
        nb_usage_error("synth-dump", "--first %llu + --samples %llu passes the generator's last index",
                       (unsigned long long)first, (unsigned long long)samples);
    if (max_len < 0 || max_len > 65536) nb_usage_error("synth-dump", "--max-len must be in 0 .. 65536, got %d", max_len);
    if (strcmp(data, "synth") && strncmp(data, "synth:", 6))
        nb_usage_error("synth-dump", "--data takes synth or synth:k=v,... (only synthetic data can be dumped), got '%s'",
                       data);

    /* The spec exactly as data/ctr_source.c's nb_ctr_source_open builds it. */
    char spec[NB_PATH_MAX + 64];
    if (strstr(data, "max_len="))
        snprintf(spec, sizeof spec, "%s", data);
    else
        snprintf(spec, sizeof spec, "%s%smax_len=%d", data, strchr(data, ':') ? "," : ":", max_len);
    if (strlen(spec) >= DUMP_HEADER - DUMP_SPEC_OFF)
        nb_usage_error("synth-dump", "--data is too long for the file header (%zu bytes, at most %d)", strlen(spec),
                       DUMP_HEADER - DUMP_SPEC_OFF - 1);

    nb_host_set_threads(threads);
    nb_synth *g = nb_malloc(sizeof *g, "synthetic generator"); /* ~170 KB of tables: not on the stack */
    nb_synth_open(g, spec);
    /* train silently takes max_len= from --data over --max-len; a dump made with both saying
     * different things would not be what the user meant, so refuse it */
    if (nb_args_seen(args, nargs, "max-len") && g->o.max_len != max_len)
        nb_usage_error("synth-dump", "--max-len %d disagrees with max_len=%d in --data (train uses the --data value)",
                       max_len, g->o.max_len);
    int L = g->o.max_len;
    if (!strcmp(format, "mlperf")) return dump_mlperf(g, first, samples, out);
    if (strcmp(format, "nbsynth")) nb_usage_error("synth-dump", "--format takes nbsynth or mlperf, got '%s'", format);

    /* Table rows as the trainer sizes them: the generator's schema (nb_ctr_source_open) */
    nb_ctr_schema sc;
    nb_ctr_schema_synth(&sc, g, table_cap);
    uint64_t cat_rows[NB_SYNTH_NCAT], item_rows = (uint64_t)sc.item_rows;
    for (int i = 0; i < sc.ncols; i++)
        if (sc.col[i].role == NB_COL_CAT) cat_rows[sc.col[i].slot] = (uint64_t)sc.col[i].rows;
    nb_ctr_schema_free(&sc);

    uint64_t n = samples;
    uint64_t off[DUMP_NARRAYS];
    off[0] = DUMP_HEADER;                                            /* dense */
    off[1] = align8(off[0] + n * NB_SYNTH_NDENSE * sizeof(float));   /* cat */
    off[2] = align8(off[1] + n * NB_SYNTH_NCAT * sizeof(uint32_t));  /* target */
    off[3] = align8(off[2] + n * sizeof(uint32_t));                  /* hist_len */
    off[4] = align8(off[3] + n * sizeof(int32_t));                   /* hist_off */
    off[5] = align8(off[4] + (n + 1) * sizeof(int64_t));             /* hist */
    /* off[6] (label) follows the histories, whose total is known only at the end */

    int chunk = DUMP_CHUNK_IDS / (L > 0 ? L : 1);
    if (chunk > 65536) chunk = 65536;
    if (chunk < 1) chunk = 1;
    float *dense = nb_malloc((size_t)chunk * NB_SYNTH_NDENSE * sizeof(float), "synth-dump chunk");
    uint32_t *cat = nb_malloc((size_t)chunk * NB_SYNTH_NCAT * sizeof(uint32_t), "synth-dump chunk");
    uint32_t *target = nb_malloc((size_t)chunk * sizeof(uint32_t), "synth-dump chunk");
    uint32_t *hist = nb_malloc((size_t)chunk * (size_t)(L > 0 ? L : 1) * sizeof(uint32_t), "synth-dump chunk");
    int32_t *len = nb_malloc((size_t)chunk * sizeof(int32_t), "synth-dump chunk");
    int64_t *hoff = nb_malloc((size_t)chunk * sizeof(int64_t), "synth-dump chunk");
    float *label = nb_malloc((size_t)n * sizeof(float), "synth-dump labels (lower --samples)");

    dump_file d = {.path = out};
    d.f = nb_atomic_open(out, d.tmp, sizeof d.tmp);
    /* A zeroed header first (no magic): a crash never leaves a plausible file, even as the temp. */
    unsigned char header[DUMP_HEADER];
    memset(header, 0, sizeof header);
    write_at(&d, 0, header, sizeof header);

    double t0 = nb_now(), last_report = t0;
    int report = !quiet && n >= (1u << 20);
    uint64_t total = 0, positives = 0;
    for (uint64_t done = 0; done < n;) {
        int m = n - done < (uint64_t)chunk ? (int)(n - done) : chunk;
        nb_synth_fill(g, first + done, m, dense, cat, target, hist, len, label + done, NULL);
        uint64_t ids_before = total;
        /* compact the [m, L] padded rows into the jagged history section, in sample order */
        size_t k = 0;
        for (int i = 0; i < m; i++) {
            NB_ASSERT(len[i] >= 0 && len[i] <= L);
            hoff[i] = (int64_t)total;
            if (len[i] && k != (size_t)i * (size_t)L)
                memmove(hist + k, hist + (size_t)i * (size_t)L, (size_t)len[i] * sizeof(uint32_t));
            k += (size_t)len[i];
            total += (uint64_t)len[i];
            positives += label[done + (uint64_t)i] > 0.5f;
        }
        write_at(&d, off[0] + done * NB_SYNTH_NDENSE * sizeof(float), dense, (size_t)m * NB_SYNTH_NDENSE * sizeof(float));
        write_at(&d, off[1] + done * NB_SYNTH_NCAT * sizeof(uint32_t), cat, (size_t)m * NB_SYNTH_NCAT * sizeof(uint32_t));
        write_at(&d, off[2] + done * sizeof(uint32_t), target, (size_t)m * sizeof(uint32_t));
        write_at(&d, off[3] + done * sizeof(int32_t), len, (size_t)m * sizeof(int32_t));
        write_at(&d, off[4] + done * sizeof(int64_t), hoff, (size_t)m * sizeof(int64_t));
        write_at(&d, off[5] + ids_before * sizeof(uint32_t), hist, k * sizeof(uint32_t));
        done += (uint64_t)m;
        double now = nb_now();
        if (report && (now - last_report >= 2.0 || done == n)) {
            fprintf(stderr, "synth-dump: %llu / %llu samples (%.0f%%), %.1f s\n", (unsigned long long)done,
                    (unsigned long long)n, 100.0 * (double)done / (double)n, now - t0);
            last_report = now;
        }
    }
    int64_t end_off = (int64_t)total;
    write_at(&d, off[4] + n * sizeof(int64_t), &end_off, sizeof end_off);
    off[6] = align8(off[5] + total * sizeof(uint32_t));
    write_at(&d, off[6], label, (size_t)n * sizeof(float));
    uint64_t file_bytes = off[6] + n * sizeof(float);

    memcpy(header, DUMP_MAGIC, 8);
    put_u32(header + 8, DUMP_VERSION);
    put_u32(header + 12, DUMP_HEADER);
    put_u64(header + 16, n);
    put_u64(header + 24, first);
    put_u64(header + 32, total);
    put_u32(header + 40, (uint32_t)L);
    put_u32(header + 44, NB_SYNTH_NDENSE);
    put_u32(header + 48, NB_SYNTH_NCAT);
    put_u64(header + 56, (uint64_t)table_cap);
    for (int f = 0; f < NB_SYNTH_NCAT; f++) put_u64(header + 64 + 8 * f, cat_rows[f]);
    put_u64(header + 272, item_rows);
    for (int f = 0; f < NB_SYNTH_NCAT; f++) put_u64(header + 280 + 8 * f, g->card[f]);
    put_u64(header + 488, g->o.items);
    put_u64(header + 496, g->o.seed);
    put_u64(header + 504, file_bytes);
    for (int a = 0; a < DUMP_NARRAYS; a++) put_u64(header + 512 + 8 * a, off[a]);
    memcpy(header + DUMP_SPEC_OFF, spec, strlen(spec)); /* the rest stays NUL */
    write_at(&d, 0, header, sizeof header);
    nb_atomic_commit(d.f, d.tmp, out);

    uint64_t rows = item_rows;
    for (int f = 0; f < NB_SYNTH_NCAT; f++) rows += cat_rows[f];
    char desc[512];
    printf("%s\n", nb_synth_describe(g, desc, sizeof desc));
    printf("wrote %s: samples %llu..%llu, %llu history items (mean %.2f), label rate %.4f, table rows %llu "
           "(item %llu, --table-cap %d), %.1f MB in %.1f s\n",
           out, (unsigned long long)first, (unsigned long long)(first + n - 1), (unsigned long long)total,
           (double)total / (double)n, (double)positives / (double)n, (unsigned long long)rows,
           (unsigned long long)item_rows, table_cap, (double)file_bytes / 1e6, nb_now() - t0);
    free(dense), free(cat), free(target), free(hist), free(len), free(hoff), free(label);
    free(g);
    return 0;
}
