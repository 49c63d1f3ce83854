/* safetensors files (the Hugging Face format): checkpoints and HF exports.
 *
 * Layout: 8-byte little-endian header length N; N bytes of JSON
 *   {"__metadata__": {"k": "v"}, "name": {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}, ...}
 * padded with spaces to a multiple of 8; then the data. Offsets are relative to the data start.
 * Tensors are contiguous and cover the data area exactly, in the order they were added.
 *
 * Writer: streaming. nb_st_add records a pointer (no copy); nb_st_end writes the header and then
 * each tensor's bytes straight from the caller's memory into a temp file, fsyncs and renames it
 * (io/atomic.h), so a model needs no second copy in memory and a crash never leaves a partial
 * file under the final name. For data that is not in host memory (a GPU tensor) nb_st_add_fn
 * takes a callback that fills the bytes chunk by chunk into a bounded staging buffer.
 * A single-tensor file is byte-identical to what the reference (Rust) safetensors writes; with
 * several tensors, the reference sorts them by dtype and name and we keep the caller's order:
 * both are valid files for every reader.
 *
 * Reader: maps the file and validates everything before returning: size, header length (at most
 * 100,000,000 bytes, as in the reference), UTF-8 JSON object, each entry's dtype / shape /
 * data_offsets, shape product * dtype size == end - begin, offsets contiguous from 0 to the end
 * of the file with no gap or overlap, no duplicate names, metadata values are strings. Any
 * violation ends in nb_fail naming the file, the tensor and the field.
 * Tensor data inside the mapping is aligned only as the writer laid it out (the header is padded
 * to 8 bytes, tensors follow back to back): use nb_st_read_into, which copies, unless you know
 * the layout is aligned for your dtype.
 *
 * Checksums (nobubble's own, in the metadata, so every other reader ignores them): the writer
 * adds "nobubble.crc32c" = the CRC32C of the header's meaning (every other metadata pair and
 * every tensor's name, dtype and shape, as sorted items; see canon_crc in safetensors.c) and,
 * for each tensor, "nobubble.crc32c.<name>" = the CRC32C of its data bytes; values are 8
 * lowercase hex digits. The reader checks the header's at open and a tensor's when it is read;
 * a file without them (from another tool) loads as before, but one that has the header's must
 * have every tensor's. Cost: CRC32C runs at ~12 GB/s per core with SSE4.2 (io/crc32c.h),
 * fused with the copy piece by piece, and the copy of a large tensor is spread over the
 * OpenMP threads. */
#ifndef NB_SAFETENSORS_H
#define NB_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define NB_ST_MAX_DIMS 8

/* ---- writer ---- */
typedef struct nb_st_writer nb_st_writer;
/* Fill dst with bytes [offset, offset + bytes) of the tensor. */
typedef void (*nb_st_fill_fn)(void *ctx, void *dst, size_t offset, size_t bytes);

nb_st_writer *nb_st_begin(const char *path);
/* Record a tensor; data (C order, little-endian) must stay valid until nb_st_end. Names must be
 * unique, non-empty and not "__metadata__". data may be NULL only when the tensor is empty. */
void nb_st_add(nb_st_writer *w, const char *name, nb_dtype dtype, int ndim, const int64_t *shape,
               const void *data);
void nb_st_add_fn(nb_st_writer *w, const char *name, nb_dtype dtype, int ndim, const int64_t *shape,
                  nb_st_fill_fn fill, void *ctx);
/* String metadata ("__metadata__"); a repeated key replaces the earlier value. Keys starting
 * with "nobubble.crc32c" are reserved for the checksums. */
void nb_st_meta(nb_st_writer *w, const char *key, const char *value);
/* Checksums are written unless turned off (for byte-exact files, e.g. against the reference's
 * test vectors). */
void nb_st_set_checksums(nb_st_writer *w, int on);
/* Write everything atomically and free w. */
void nb_st_end(nb_st_writer *w);

/* ---- reader ---- */
typedef struct {
    const char *name;
    nb_dtype dtype;
    int ndim;
    int64_t shape[NB_ST_MAX_DIMS];
    int64_t numel;
    size_t nbytes;
    uint64_t offset;  /* absolute byte offset of the data in the file */
    const void *data; /* into the read-only mapping; valid until nb_st_close */
    int has_crc;      /* the file holds this tensor's CRC32C (crc32c) */
    uint32_t crc32c;
} nb_st_tensor;

typedef struct nb_st_file nb_st_file;

nb_st_file *nb_st_open(const char *path);
void nb_st_close(nb_st_file *f);
const char *nb_st_path(const nb_st_file *f);

/* Tensors in file order (by data offset, i.e. the order they were written). */
int nb_st_count(const nb_st_file *f);
const nb_st_tensor *nb_st_at(const nb_st_file *f, int i);
/* NULL when absent. */
const nb_st_tensor *nb_st_find(const nb_st_file *f, const char *name);
/* Copy a tensor into dst after checking it exists and that dtype and element count match; a
 * mismatch fails naming the file, the tensor, expected and found. The copy checks the tensor's
 * checksum when the file has one: a damaged byte ends in nb_fail ("checksum mismatch in tensor
 * 'x' of FILE"); dst then holds the damaged bytes and must not be used. */
void nb_st_read_into(const nb_st_file *f, const char *name, nb_dtype dtype, int64_t numel, void *dst);
/* Same, but the whole shape must match (catches a transposed weight with the right numel). */
void nb_st_read_shaped(const nb_st_file *f, const char *name, nb_dtype dtype, int ndim,
                       const int64_t *shape, void *dst);

/* The tensor's checksum (when the file has one) against its bytes in the mapping; nb_fail on a
 * mismatch. For code that reads t->data itself; the nb_st_read_* calls check as they copy. */
void nb_st_verify(const nb_st_file *f, const nb_st_tensor *t);

/* Metadata: value or NULL; and iteration in header order. The checksum keys are not listed. */
const char *nb_st_meta_get(const nb_st_file *f, const char *key);
int nb_st_meta_count(const nb_st_file *f);
void nb_st_meta_at(const nb_st_file *f, int i, const char **key, const char **value);

/* "[2, 3]" into buf, for messages. Returns buf. */
const char *nb_st_shape_str(char *buf, size_t cap, int ndim, const int64_t *shape);

#ifdef __cplusplus
}
#endif
#endif
