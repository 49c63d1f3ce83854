/* Criteo click logs: a streaming TSV parser and a compact binary format.
 *
 * TSV (one sample per line, no header, fields separated by exactly one tab each):
 *     label \t I1 .. I13 \t C1 .. C26          (40 fields)
 *   - label: "0" or "1".
 *   - I1..I13: decimal integers, may be negative (I2 goes down to -3 in Kaggle's train.txt).
 *   - C1..C26: 8 hex digits (lowercase in the real files; uppercase is accepted, same value),
 *     read as a uint32.
 *   - an empty field is a missing value; tabs are never collapsed, so "\t\t" is one empty field.
 *   A trailing "\r" (CRLF files) is stripped; a last line without "\n" is read.
 *
 * Layouts (nb_criteo_layout):
 *   NB_CRITEO_KAGGLE     Kaggle Display Advertising train.txt (the layout above).
 *   NB_CRITEO_1TB        Criteo 1TB click logs day_0..day_23, decompressed. The same 40-field
 *                        syntax, but the columns mean other things and the hashes differ from
 *                        Kaggle's, so the layout is recorded in binary files and a binary file of
 *                        one layout is refused when another is asked for (a model trained on one
 *                        must not silently read the other). The .gz files are read as they are.
 *   NB_CRITEO_UNLABELED  Kaggle test.txt: the 39 feature fields without the label (label = 0).
 *
 * A line is bad when it has the wrong number of fields, a label other than 0/1, an I field that
 * is not an integer (or does not fit int64), or a C field that is not exactly 8 hex digits. Bad
 * lines are skipped and counted by reason; the first few are logged with file:line (nb_log level
 * 1), the rest only counted. In strict mode the first bad line ends the run through nb_fail with
 * "path:line: reason". Either way, reaching the end of a file that held no good line at all is
 * an error (it is not Criteo data, or it is empty).
 *
 * Files: nb_criteo_open takes one path, or a list: comma-separated items read in the order given,
 * each item a path or a glob (its matches in sorted order). Each file is TSV, gzip-compressed TSV
 * (zlib; a damaged or cut-short .gz ends the run naming the file and line) or the binary format;
 * the list reads as one stream, and rewinding starts again at its first file. Every TSV file must
 * hold a good line. Line numbers in messages are the current file's.
 *
 * Binary format (little-endian; made by nb_criteo_convert, read by nb_criteo_open too):
 *   header, 64 bytes: char magic[8] = "NBCRITEO", u32 version = 1, u32 layout, u32 record_bytes
 *     = 164, u32 zero, u64 count, u64 positives, u64 source_lines, u64 source_bad, 8 zero bytes
 *   count records of 164 bytes: f32 dense[13], u32 cat[26], u32 cat_missing, u16 dense_missing,
 *     u8 label, u8 zero.
 *   The file size must be exactly 64 + 164 * count. Every record is validated as it is read
 *   (label 0/1, masks within 13/26 bits, missing values 0, dense finite and >= 0, zero padding),
 *   and after a full pass the positives are checked against the header.
 *   Records hold the transformed dense values (the model's log(1 + max(x, 0))), not the raw
 *   integers: that is what the model reads, and it keeps a record at 164 bytes (~ 2/3 of a
 *   typical TSV line) with no parsing at all. */
#ifndef NB_CRITEO_H
#define NB_CRITEO_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define NB_CRITEO_NDENSE 13
#define NB_CRITEO_NCAT 26

#define NB_CRITEO_BIN_MAGIC "NBCRITEO"
#define NB_CRITEO_BIN_VERSION 1
#define NB_CRITEO_BIN_HEADER_BYTES 64
#define NB_CRITEO_BIN_RECORD_BYTES 164

typedef enum {
    NB_CRITEO_KAGGLE = 1,
    NB_CRITEO_1TB = 2,
    NB_CRITEO_UNLABELED = 3,
} nb_criteo_layout;

/* One click-log sample, as the CTR model consumes it. */
typedef struct {
    float dense[NB_CRITEO_NDENSE];  /* log(1 + max(x, 0)); 0 when missing */
    uint32_t cat[NB_CRITEO_NCAT];   /* the hash as a uint32; 0 when missing (see cat_missing) */
    uint32_t cat_missing;           /* bit j set: C(j+1) was empty (the model maps it to row 0) */
    uint16_t dense_missing;         /* bit i set: I(i+1) was empty */
    uint8_t label;                  /* 0 or 1 (0 for NB_CRITEO_UNLABELED) */
} nb_ctr_sample;

/* Why lines were bad. */
typedef enum {
    NB_CRITEO_OK = 0,
    NB_CRITEO_BAD_FIELDS, /* wrong number of tab-separated fields */
    NB_CRITEO_BAD_LABEL,  /* label not exactly "0" or "1" */
    NB_CRITEO_BAD_INT,    /* I field not a (64-bit) integer */
    NB_CRITEO_BAD_HEX,    /* C field not exactly 8 hex digits */
    NB_CRITEO_NREASONS
} nb_criteo_reason;

typedef struct {
    uint64_t lines;      /* lines read (binary: records read) */
    uint64_t good;       /* samples returned */
    uint64_t bad;        /* lines skipped */
    uint64_t positives;  /* good samples with label 1 */
    uint64_t bad_by[NB_CRITEO_NREASONS]; /* bad lines by reason (index NB_CRITEO_BAD_*) */
    uint64_t first_bad_line;             /* 1-based; 0 when there was none */
    char first_bad[256];                 /* the reason that line was bad */
} nb_criteo_stats;

typedef struct nb_criteo_reader nb_criteo_reader;

/* Parse one line (without its "\n"; a trailing "\r" is ignored) of n bytes. Returns
 * NB_CRITEO_OK and fills *out, or a reason and a message in why[0..cap) (why may be NULL).
 * The line is only read. Exposed for other loaders and for tests. */
nb_criteo_reason nb_criteo_parse_line(const char *line, size_t n, nb_criteo_layout layout,
                                      nb_ctr_sample *out, char *why, size_t cap);

/* Open Criteo TSV (plain or .gz) or binary files made by nb_criteo_convert (recognised by the
 * magic), one path or a list (see above). A binary file must have been made from the same
 * layout. Fails (nb_fail) when a file cannot be opened, a glob matches nothing, or a binary file
 * does not validate. */
nb_criteo_reader *nb_criteo_open(const char *path, nb_criteo_layout layout, int strict);
/* The file the last sample came from and its line there (binary: its record number + 1). */
const char *nb_criteo_where(const nb_criteo_reader *r, uint64_t *line);
int nb_criteo_files(const nb_criteo_reader *r);
/* Next good sample into *out: returns 1, or 0 at the end of the file (bad lines are skipped and
 * counted, or fatal in strict mode). At the end, a summary of bad lines is logged once. */
int nb_criteo_next(nb_criteo_reader *r, nb_ctr_sample *out);
/* Counts so far (of this pass). */
const nb_criteo_stats *nb_criteo_get_stats(const nb_criteo_reader *r);
/* Start a new pass from the first sample (for the next epoch); the counts restart too. */
void nb_criteo_rewind(nb_criteo_reader *r);
/* 1 when reading a binary file. Then (one file, not a list) nb_criteo_count is the number of records and
 * nb_criteo_seek positions the reader before record i (0 <= i <= count), e.g. to give each rank
 * its own range; both fail on a TSV reader, whose length is unknown until it has been read. */
int nb_criteo_is_binary(const nb_criteo_reader *r);
uint64_t nb_criteo_count(const nb_criteo_reader *r);
void nb_criteo_seek(nb_criteo_reader *r, uint64_t i);
void nb_criteo_close(nb_criteo_reader *r);

/* Convert a TSV file to the binary format (written crash-safely: temp file + rename, so bin_path
 * is either the old file or the complete new one). Bad lines are skipped and counted, or fatal
 * in strict mode. Returns the TSV pass's counts; the header records count, positives, lines and
 * bad lines. A conversion that ends in nb_fail (strict mode, no good line, disk full) leaves only
 * a "<bin_path>.tmp.<pid>.<n>" file behind, which is garbage and safe to delete. */
nb_criteo_stats nb_criteo_convert(const char *tsv_path, const char *bin_path,
                                  nb_criteo_layout layout, int strict);

const char *nb_criteo_layout_name(nb_criteo_layout layout);

#ifdef __cplusplus
}
#endif
#endif
