/* nobubble: command-line entry point. Dispatches to the subcommands. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "args.h"
#include "blas.h"
#include "comm/comm.h"
#include "commands.h"
#include "host.h"
#include "ops/backend.h"
#include "sched/sched.h"
#include "step/opts.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: nobubble <command> [options]\n"
            "\n"
            "commands:\n"
            "  train     train a model (default: gpt2-mini on the State of the Union corpus, CPU)\n"
            "  eval      loss of a checkpoint on a token shard\n"
            "  sample    generate text from a checkpoint\n"
            "  tokenize  encode text files into token shards (GPT-2, or a Hugging Face tokenizer.json)\n"
            "  criteo-convert  Criteo TSV -> nobubble's binary click-log format\n"
            "  synth-dump  synthetic click samples (--data synth:...) -> a flat binary file for other tools\n"
            "  timeline  draw one step of a --trace file as an SVG timeline (lanes x time)\n"
            "  plan      will a model fit this machine: each schedule's memory by term (seqctr: where the tables go), the largest batch, the flags\n"
            "  info      what this build and this machine offer (CUDA, GPUs, threads)\n"
            "  export    write a checkpoint as a Hugging Face model (config.json + model.safetensors)\n"
            "  predict   a seqctr checkpoint's click probability for every row of a file\n"
            "  options   the options table of 'nobubble train' as TSV (for scripts: tests/fuzz_test.sh)\n"
            "\n"
            "Run 'nobubble <command> --help' for the options of a command.\n");
}

/* OpenMP threads that spin while waiting for work steal the cores from everything else on the
 * machine; on a loaded 2-core machine spinning made training steps 2-6x slower. libgomp reads
 * OMP_WAIT_POLICY when it is loaded, before main runs, so set it and start again once. A run on
 * a GPU is different: its host work comes in short parallel bursts (a batch's index lists, a
 * dozen OpenMP regions in a few ms) between which sleeping threads must be woken, and that
 * wake-up sat on the step's path (seqctr's lists 2.8 -> 1.9 ms per step without it on the H200),
 * so there libgomp keeps its default: spin a little, then sleep. */
static int runs_on_gpu(char **argv) {
    for (int i = 1; argv[i]; i++) {
        if (!strncmp(argv[i], "--device=cuda", 13)) return 1;
        if (!strcmp(argv[i], "--device") && argv[i + 1] && !strncmp(argv[i + 1], "cuda", 4)) return 1;
    }
    return 0;
}

/* Exit 0 and list the GPUs when --device cuda can run, exit 3 when it cannot. */
static int cmd_info(int argc, char **argv) {
    if (nb_args_parse("info", "What this build and this machine offer: CUDA and its GPUs, CPU threads, the "
                      "schedules. Exit status 0 when --device cuda can run, 3 when it cannot.", NULL, 0, argc, argv))
        return 0;
    char gpu[256] = "";
    int n = nb_cuda_device_count(gpu, sizeof gpu);
#ifdef NB_WITH_CUDA
    printf("cuda      built with CUDA; %d device(s)%s%s\n", n, n ? ", first: " : "", gpu);
#else
    printf("cuda      not in this build (nvcc was not on the PATH when it was built)\n");
#endif
    printf("cpu       %d threads, OpenBLAS (OpenMP build)\n", nb_host_set_threads(0));
    printf("schedules");
    for (const nb_sched_i *const *s = nb_sched_all(); *s; s++) printf(" %s", (*s)->name);
    printf("\n");
    return n > 0 ? 0 : 3;
}

/* Both are read when the libraries load, before main: set them and start again once. OpenBLAS's
 * kernels: when it fell back to generic ones on a CPU that allows better (core/blas.h). */
static void prepare_environment(char **argv) {
    int again = nb_blas_prepare();
    if (!getenv("OMP_WAIT_POLICY") && !runs_on_gpu(argv)) {
        setenv("OMP_WAIT_POLICY", "passive", 1);
        again = 1;
    }
    if (again) execv("/proc/self/exe", argv);
    /* no exec needed, or it failed: check a kernel nobubble chose; a bad one means one more exec */
    if (nb_blas_confirm()) {
        execv("/proc/self/exe", argv);
        nb_fail("set OPENBLAS_CORETYPE=Prescott", "cannot restart with OpenBLAS's own kernels");
    }
}

/* The options table, one row a line: flag name, state.json key ("-": not kept), type, group,
 * lo, hi, math (0/1), enum names (comma-separated, "-": none). Scripts generate their cases
 * from it (the fuzz test's flag and state.json ranges), so they follow the table. */
static int cmd_options(void) {
    static const char *types[] = {"int", "i64", "u64", "float", "str", "bool", "enum"};
    static const char *groups[] = {"common", "ranks", "tf", "sc", "erase", "stream"};
    int n;
    const nb_opt *rows = nb_opts_table(&n);
    for (int i = 0; i < n; i++) {
        const nb_opt *r = &rows[i];
        char key[64];
        snprintf(key, sizeof key, "%s", r->name);
        for (char *c = key; *c; c++)
            if (*c == '-') *c = '_';
        printf("%s\t%s\t%s\t%s\t%.17g\t%.17g\t%d\t", r->flag ? r->name : "-", r->state ? key : "-", types[r->type],
               groups[r->group], r->lo, r->hi, r->math);
        if (!r->names) printf("-");
        for (int k = 0; r->names && r->names[k]; k++) printf("%s%s", k ? "," : "", r->names[k]);
        printf("\n");
    }
    return 0;
}

/* The commands that run OpenMP and BLAS work (the others, --help among them, skip the restart:
 * loading the CUDA libraries twice costs about 0.35 s). */
static int computes(char **argv) {
    static const char *const cmds[] = {"train", "eval", "sample", "predict"};
    int known = 0;
    for (size_t i = 0; argv[1] && i < sizeof cmds / sizeof cmds[0]; i++) known |= !strcmp(argv[1], cmds[i]);
    for (int i = 2; known && argv[i]; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return 0;
    return known;
}

static int run_command(int argc, char **argv);

int main(int argc, char **argv) {
    if (computes(argv)) prepare_environment(argv);
    /* the launcher's ranks (mpirun, srun): before any thread starts; one process never calls MPI */
    nb_comm_init(&argc, &argv);
    int rc = run_command(argc, argv);
    nb_comm_finalize(); /* a command that failed has exited in nb_fail (the job aborted) */
    return rc;
}

static int run_command(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "train")) return nb_cmd_train(argc - 1, argv + 1);
    if (!strcmp(cmd, "eval")) return nb_cmd_eval(argc - 1, argv + 1);
    if (!strcmp(cmd, "sample")) return nb_cmd_sample(argc - 1, argv + 1);
    if (!strcmp(cmd, "info")) return cmd_info(argc - 1, argv + 1);
    if (!strcmp(cmd, "criteo-convert")) return nb_cmd_criteo_convert(argc - 1, argv + 1);
    if (!strcmp(cmd, "synth-dump")) return nb_cmd_synth_dump(argc - 1, argv + 1);
    if (!strcmp(cmd, "timeline")) return nb_cmd_timeline(argc - 1, argv + 1);
    if (!strcmp(cmd, "plan")) return nb_cmd_plan(argc - 1, argv + 1);
    if (!strcmp(cmd, "tokenize")) return nb_cmd_tokenize(argc - 1, argv + 1);
    if (!strcmp(cmd, "export")) return nb_cmd_export(argc - 1, argv + 1);
    if (!strcmp(cmd, "predict")) return nb_cmd_predict(argc - 1, argv + 1);
    if (!strcmp(cmd, "options")) return cmd_options();
    fprintf(stderr, "nobubble: error: unknown command '%s' (hint: run 'nobubble --help')\n", cmd);
    return 2;
}
