/* CRC32C (Castagnoli, the checksum of iSCSI, ext4 and Btrfs) for checkpoint integrity.
 *
 * nb_crc32c(0, data, n) is the standard CRC32C of the bytes (of "123456789": 0xE3069283), and
 * nb_crc32c(nb_crc32c(0, a, na), b, nb) the CRC32C of a then b, like zlib's crc32(). On x86-64
 * with SSE4.2 it uses the crc32 instruction on three interleaved streams (~8 bytes a cycle, one
 * stream alone is bound by the instruction's 3-cycle latency); elsewhere slicing-by-8 tables.
 * The choice is made at run time, once. Thread-safe. */
#ifndef NB_CRC32C_H
#define NB_CRC32C_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

uint32_t nb_crc32c(uint32_t crc, const void *data, size_t n);
/* nb_crc32c of src, copying it to dst (no overlap) in the same pass: on the instruction path the
 * copy costs little more than the checksum alone (measured 12 GB/s for both, against 5.3 GB/s
 * for a checksum pass followed by memcpy). */
uint32_t nb_crc32c_copy(uint32_t crc, void *dst, const void *src, size_t n);
/* The CRC32C of A then B from crc_a = CRC(A), crc_b = CRC(B) and B's length (zlib's
 * crc32_combine): lets threads checksum pieces of one buffer. */
uint32_t nb_crc32c_combine(uint32_t crc_a, uint32_t crc_b, size_t len_b);
/* nb_crc32c(0, src, n) (with the copy to dst when dst is not NULL), pieces of 8 MiB on the
 * OpenMP threads, their checksums combined: a multi-GB buffer at the memory's speed. */
uint32_t nb_crc32c_par(void *dst, const void *src, size_t n);
/* The portable path alone, for tests against the instruction path. */
uint32_t nb_crc32c_portable(uint32_t crc, const void *data, size_t n);
/* "sse4.2" or "portable": what nb_crc32c runs on this machine. */
const char *nb_crc32c_impl(void);

#ifdef __cplusplus
}
#endif
#endif
