/* Column slices on the CPU (how seqctr assembles x0 from its pieces): the reference of cols.cu. */
#include <string.h>

#include "ops/ops_ctr.h"

void nb_copy_cols(float *dst, int ld_dst, const float *src, int ld_src, int rows, int cols) {
    for (int i = 0; i < rows; i++)
        memcpy(dst + (size_t)i * ld_dst, src + (size_t)i * ld_src, (size_t)cols * sizeof(float));
}

void nb_add_cols(float *dst, int ld_dst, const float *src, int ld_src, int rows, int cols) {
    for (int i = 0; i < rows; i++) {
        float *d = dst + (size_t)i * ld_dst;
        const float *s = src + (size_t)i * ld_src;
        for (int j = 0; j < cols; j++) d[j] += s[j];
    }
}
