/* The tensors and metadata of one PyTorch reference file, for the recommendation models' tests
 * (test_seqctr_ref, test_dlrm_ref): every read checks the name, dtype and size, and a missing or
 * misshaped one fails with the file and REGEN_HINT (define it before including: how to make the
 * file again). main sets ref_path and opens F. */
#ifndef NB_TEST_REF_TENSORS_H
#define NB_TEST_REF_TENSORS_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "io/safetensors.h"

static const char *ref_path; /* the reference file, for messages */
static nb_st_file *F;

static int meta_int(const char *key) {
    const char *v = nb_st_meta_get(F, key);
    NB_CHECK(v != NULL, REGEN_HINT, "%s: metadata '%s' missing", ref_path, key);
    return atoi(v);
}

static const nb_st_tensor *need(const char *name, nb_dtype dt, int64_t numel) {
    const nb_st_tensor *t = nb_st_find(F, name);
    NB_CHECK(t != NULL, REGEN_HINT, "%s: tensor '%s' missing", ref_path, name);
    NB_CHECK(t->dtype == dt && t->numel == numel, REGEN_HINT, "%s: tensor '%s' has dtype %d and %lld elements, want %d and %lld",
             ref_path, name, (int)t->dtype, (long long)t->numel, (int)dt, (long long)numel);
    return t;
}

/* bf16 bit patterns to float32 (exact) */
static void read_bf16(const char *name, float *dst, int64_t n) {
    const uint16_t *s = need(name, NB_BF16, n)->data;
    for (int64_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)s[i] << 16;
        memcpy(&dst[i], &u, sizeof u);
    }
}

static void *read_raw(const char *name, nb_dtype dt, int64_t n) {
    const nb_st_tensor *t = need(name, dt, n);
    void *p = nb_malloc(t->nbytes ? t->nbytes : 1, "reference tensor");
    memcpy(p, t->data, t->nbytes);
    return p;
}

#endif
