/* A device-to-device copy done by SM threads, the way NCCL's copy channels move bytes: a few
 * CTAs streaming 16-byte vectors. It exists to measure what such a copy takes from kernels running
 * beside it (tests/test_smfree_cuda.c --bench), against copy-engine copies (cudaMemcpyAsync).
 * Include only from code compiled with CUDA. */
#ifndef NB_COPY_SM_H
#define NB_COPY_SM_H

#include <stddef.h>

#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

/* dst[0..bytes) = src[0..bytes) on stream s with `blocks` CTAs (>= 1); the buffers must not
 * overlap. Any sizes and alignments (16-byte vectors when both pointers allow them). Returns the
 * launch's error (cudaErrorInvalidValue for blocks < 1); callers check it. */
cudaError_t nb_cuda_copy_sm(void *dst, const void *src, size_t bytes, int blocks, cudaStream_t s);

#ifdef __cplusplus
}
#endif
#endif
