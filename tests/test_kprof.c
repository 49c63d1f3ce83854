/* The kernel table (lanes/kprof.h) counts what the GPU ran: over 4 "steps" of 3 direct launches
 * of a spin kernel and one replay of a captured graph of 2 more, the table must show the spin
 * kernel at 5 calls per step and each call near its spin time, and the device busy for most of
 * the window. Work before the window's start and after its end must be left out. Skips (77)
 * without a GPU or without CUPTI. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core.h"
#include "lanes/kprof.h"

#ifdef NB_WITH_CUDA
#include <cuda_runtime.h>

#include "cuda_check.h"
#include "lanes/lanes_cuda_testkern.h"

#define STEPS 4
#define SPIN_NS 200000 /* 0.2 ms: far above the launch gaps */

static void launches(cudaStream_t s, int n) {
    for (int i = 0; i < n; i++) nb_lanes_testkern_spin(s, SPIN_NS);
}

int main(void) {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("skip: no CUDA device\n");
        return 77;
    }
    char why[400];
    if (!nb_kprof_open(why, sizeof why)) {
        printf("skip: %s\n", why);
        return 77;
    }
    cudaStream_t s;
    CUDA_CHECK(cudaStreamCreate(&s));
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    launches(s, 2);
    CUDA_CHECK(cudaStreamEndCapture(s, &g));
    CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));

    launches(s, 7); /* before the window: not counted */
    CUDA_CHECK(cudaStreamSynchronize(s));
    nb_kprof_mark_begin();
    for (int step = 0; step < STEPS; step++) {
        launches(s, 3);
        CUDA_CHECK(cudaGraphLaunch(ge, s));
        CUDA_CHECK(cudaStreamSynchronize(s));
        nb_kprof_mark_end();
    }
    launches(s, 9); /* after it: not counted */
    CUDA_CHECK(cudaStreamSynchronize(s));

    FILE *f = tmpfile();
    CHECK(f != NULL, "tmpfile failed");
    nb_kprof_report(f, STEPS, 10);
    rewind(f);
    char line[1024], *text = calloc(1, 1 << 16);
    size_t used = 0;
    double launches_per_step = -1, busy = -1, wall = -1, calls = -1, us = -1;
    while (fgets(line, sizeof line, f)) {
        size_t n = strlen(line);
        if (used + n < (1 << 16) - 1) memcpy(text + used, line, n), used += n;
        if (!strncmp(line, "kernels", 7)) {
            const char *p = strstr(line, "(CUPTI): ");
            if (p) sscanf(p, "(CUPTI): %lf launches", &launches_per_step);
            p = strstr(line, "busy ");
            if (p) sscanf(p, "busy %lf of %lf ms", &busy, &wall);
        } else if (strstr(line, "spin_kernel")) {
            double ms, share;
            sscanf(line, "%lf %lf%% %lf %lf", &ms, &share, &calls, &us);
        }
    }
    fclose(f);
    printf("%s", text);
    CHECK(launches_per_step == 5.0, "launches per step %g, expected 5", launches_per_step);
    CHECK(calls == 5.0, "spin_kernel calls per step %g, expected 5", calls);
    CHECK(us > 0.9 * SPIN_NS / 1e3 && us < 3.0 * SPIN_NS / 1e3, "%g us per call for a %d us spin", us, SPIN_NS / 1000);
    CHECK(busy > 0.9 * 5 * SPIN_NS / 1e6 && busy <= wall, "busy %g of %g ms per step", busy, wall);
    free(text);
    CUDA_CHECK(cudaGraphExecDestroy(ge));
    CUDA_CHECK(cudaGraphDestroy(g));
    CUDA_CHECK(cudaStreamDestroy(s));
    if (!nb_test_failures) printf("ok: test_kprof\n");
    return nb_test_failures ? 1 : 0;
}

#else

int main(void) {
    char why[400];
    CHECK(!nb_kprof_open(why, sizeof why), "a CPU build has no kernel table");
    printf("skip: %s\n", why);
    return 77;
}

#endif
