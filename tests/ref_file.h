/* The PyTorch reference files of the model tests (test_torch_ref, test_seqctr_ref, test_dlrm_ref):
 * where they are, and the backends a reference runs on. Include after ops/backend.h. */
#ifndef NB_TEST_REF_FILE_H
#define NB_TEST_REF_FILE_H

#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "ops/backend.h"

/* tests/torch/ref/NAME from the working directory, else next to the source tree this binary was
 * built in (build/tests/X -> ../../tests/torch/ref/NAME): out gets the first that exists (1), or
 * the working directory's path (0). */
static inline int ref_file(const char *name, char *out, size_t cap) {
    snprintf(out, cap, "tests/torch/ref/%s", name);
    if (access(out, R_OK) == 0) return 1;
    char exe[PATH_MAX], beside[2 * PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return 0;
    exe[n] = 0;
    snprintf(beside, sizeof beside, "%s/../../tests/torch/ref/%s", dirname(exe), name);
    if (access(beside, R_OK) != 0 || strlen(beside) >= cap) return 0;
    snprintf(out, cap, "%s", beside);
    return 1;
}

/* A model's checks on each backend with its tolerances (logits, gradients): the CPU, and in a CUDA
 * build with a GPU the CUDA backend in fp32 and in bf16 (bf16's rounding: looser). */
static inline void ref_run_backends(void (*run_on)(const nb_backend_i *be, double tol_logits, double tol_grad)) {
    run_on(&nb_backend_cpu, 1e-5, 1e-4);
#ifdef NB_WITH_CUDA
    if (nb_cuda_device_count(NULL, 0) > 0) {
        run_on(nb_backend_for("cuda", "fp32"), 1e-5, 1e-4);
        run_on(nb_backend_for("cuda", "bf16"), 3e-2, 1e-1);
    } else {
        printf("no GPU: the CUDA half of this test did not run\n");
    }
#endif
}

#endif
