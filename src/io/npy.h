/* NumPy's .npy arrays and uncompressed .npz archives (a zip of .npy members), read in place from a
 * memory map and written for tests and tools: the layout MLPerf's DLRM-DCNv2 reference keeps its
 * preprocessed Criteo days in (data/mlperf.c).
 *
 * .npy: "\x93NUMPY", major, minor, the header length (u16 for 1.x, u32 for 2.x and 3.x), then a
 * Python dict literal {'descr': '<f4', 'fortran_order': False, 'shape': (N, K), } padded with
 * spaces to a multiple of 16 (64 in newer writers) and '\n'; the data follow, C order. Readers here
 * take 1-D and 2-D little-endian arrays in C order and check that the file holds the bytes the
 * shape says.
 * .npz: a zip archive; each member NAME.npy is stored (method 0, not deflated: np.savez writes them
 * so, and the reference memory-maps them), with zip64 fields for large members. */
#ifndef NB_IO_NPY_H
#define NB_IO_NPY_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    char descr[8];  /* "<f4", "<i4", ... */
    int ndim;       /* 1 or 2 */
    int64_t shape[2]; /* shape[1] = 1 for 1-D arrays */
    const void *data; /* into the map */
} nb_npy;

/* A file mapped read-only (munmap'd by nb_npy_unmap). */
typedef struct {
    char path[4096];
    const unsigned char *base;
    size_t size;
} nb_npy_file;

/* Map path (nb_fail, naming the file, when it cannot be opened). */
void nb_npy_map(nb_npy_file *f, const char *path);
void nb_npy_unmap(nb_npy_file *f);
/* Parse the array at [at, at + len) of f (a whole .npy file, or an .npz member's bytes); what
 * names it in errors ("day_0_dense.npy", "day_0_sparse_multi_hot.npz member 3.npy"). nb_fail on
 * anything but a C-order little-endian 1-D or 2-D array whose data fit the bytes. */
void nb_npy_parse(const nb_npy_file *f, size_t at, size_t len, const char *what, nb_npy *out);
/* The member `name` of the .npz archive f: its bytes (stored, not compressed). Returns 0 when the
 * archive has no such member; nb_fail when f is not a zip archive or the member is compressed. */
int nb_npz_member(const nb_npy_file *f, const char *name, size_t *at, size_t *len);

/* Writers (tests, synth-dump): a .npy array of n rows of k elements of descr ('<f4', '<i4') into
 * buf (the header, then the data): the bytes a .npy file or an .npz member holds. Returns the
 * length; buf NULL: the length only. */
size_t nb_npy_encode(unsigned char *buf, const char *descr, int ndim, int64_t n, int64_t k, const void *data, size_t es);
/* An uncompressed .npz of `count` members (names, their bytes) written atomically to path (no
 * zip64: at most 4 GB in all, else nb_fail). */
void nb_npz_write(const char *path, int count, const char *const *names, const unsigned char *const *bytes,
                  const size_t *lens);

#endif
