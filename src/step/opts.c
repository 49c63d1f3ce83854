/* Training options: the one table (each option declared once, see opts.h) and what is made from
 * it: defaults, flag values, state.json, range checks, the printed configuration and the notes on
 * a changed resume. */
#include "step/opts.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "data/balance.h"
#include "step/step.h"

const nb_opt_group_info nb_opt_groups[NB_OPTG_COUNT] = {
    [NB_OPTG_COMMON] = {"options (every model family)", NULL},
    [NB_OPTG_RANKS] = {"ranks and micro-batches (mpirun -np N nobubble train ...; --batch stays the global batch)", NULL},
    [NB_OPTG_TF] = {"transformer options (--model gpt2-* / llama-*)", "transformer models (--model gpt2-* / llama-*)"},
    [NB_OPTG_SC] = {"seqctr options (--model seqctr)", "--model seqctr"},
    [NB_OPTG_ERASE] = {"detached segments (ERASE: --detach with --schedule plain or erase)", NULL},
    [NB_OPTG_STREAM] = {"--schedule stream (a model's state in host memory)", "--schedule stream's transformers"},
};

static const char *const precision_names[] = {"", "bf16", "fp32", NULL};
static const char *const dispatch_names[] = {"blocking", "async", NULL};
static const char *const emb_optim_names[] = {"adagrad", "adam", "adagrad-exact", NULL};
static const char *const emb_shard_names[] = {"auto", "row", "none", NULL};
static const char *const emb_place_names[] = {"gpu", "host", NULL};
static const char *const dense_optim_names[] = {"adamw", "adagrad", NULL};
static const char *const lists_names[] = {"auto", "host", "device", NULL};
static const char *const comm_names[] = {"auto", "mpi", "nccl", "host", NULL};

#define F(m) offsetof(nb_train_opts, m), sizeof(((nb_train_opts *)0)->m)
#define BIG 2147483647.0
enum { REQ = 1, OPT = 2 }; /* state.json: required, or optional (older checkpoints lack it) */

/* Rows kept in state.json come first, in its order (the first 21 from its first version, the
 * rest added with ERASE, stream, seqctr, ranks and FreeScale). */
static const nb_opt table[] = {
    {"model", NB_OPT_STR, F(model_name), NB_OPTG_COMMON, NULL, "NAME", "seqctr, dlrm-dcnv2, or a transformer preset (see above)", .flag = 1},
    {"data", NB_OPT_STR, F(data), NB_OPTG_COMMON, NULL, "SRC", "training data: token shards (a shard, a quoted glob or a comma-separated list; a shard's SHARD.mask from tokenize --chat limits the loss to the targets it marks); seqctr: synth[:k=v,...], criteo:PATH (a list, globs, .gz), csv:PATH (with --schema) or movielens[:DIR]", .flag = 1, .state = REQ, .math = 1},
    {"attn", NB_OPT_ENUM, F(attn), NB_OPTG_TF, "auto", "MODE", nb_attn_mode_help, .names = nb_attn_mode_names, .flag = 1},
    {"val-data", NB_OPT_STR, F(val_data), NB_OPTG_COMMON, NULL, "SRC", "held-out data: validation shards (a shard, a quoted glob or a list; 'none' to skip); seqctr: a file (criteo: list) of the --data kind, evaluated whole (default: the head of --data held out)", .flag = 1, .state = REQ},
    {"device", NB_OPT_STR, F(device), NB_OPTG_COMMON, "cpu", "DEV", "cpu, cuda or cuda:N", .flag = 1, .state = REQ, .math = 1},
    {"schedule", NB_OPT_STR, F(schedule), NB_OPTG_COMMON, "plain", "NAME", "how the step's work runs on lanes: one of the schedules listed below", .flag = 1, .state = REQ},
    {"precision", NB_OPT_ENUM, F(precision), NB_OPTG_COMMON, "", "P", "bf16 (default on cuda) or fp32 (TF32 off)", .names = precision_names, .flag = 1, .state = REQ, .math = 1},
    {"batch", NB_OPT_INT, F(batch), NB_OPTG_COMMON, NULL, "B", "sequences (seqctr: samples) per step", 1, BIG, "at least 1", .flag = 1, .state = REQ, .math = 1},
    {"seq", NB_OPT_INT, F(seq), NB_OPTG_COMMON, NULL, NULL, NULL, 0, BIG, ">= 0", .state = REQ},
    {"steps", NB_OPT_INT, F(steps), NB_OPTG_COMMON, NULL, "N", "total optimizer steps (0 with --init-from: only write the imported model as the step-0 checkpoint)", 0, BIG, "at least 1 (0 with --init-from)", .flag = 1, .state = REQ, .math = 1},
    {"warmup", NB_OPT_INT, F(warmup), NB_OPTG_COMMON, NULL, "N", "warmup steps (-1: 5% of --steps)", -1, BIG, ">= 0, or -1 for 5% of the steps", .flag = 1, .state = REQ, .math = 1},
    {"eval-every", NB_OPT_INT, F(eval_every), NB_OPTG_COMMON, NULL, "N", "held-out evaluation every N steps (0: only at the end)", 0, BIG, ">= 0", .flag = 1, .state = REQ},
    {"eval-batches", NB_OPT_INT, F(eval_batches), NB_OPTG_TF, NULL, "N", "validation batches of --batch sequences from the start of --val-data (0: all); eval's default too", 0, BIG, ">= 0", .flag = 1, .state = REQ},
    {"ckpt-every", NB_OPT_INT, F(ckpt_every), NB_OPTG_COMMON, NULL, "N", "checkpoint every N steps (always at the end)", 0, BIG, ">= 0", .flag = 1, .state = REQ},
    {"graphs", NB_OPT_BOOL, F(graphs), NB_OPTG_COMMON, NULL, NULL, "capture the step once (CUDA graph) and replay it", .flag = 1, .state = REQ},
    {"lr", NB_OPT_FLOAT, F(lr), NB_OPTG_COMMON, NULL, "X", "peak learning rate (seqctr: of the dense parameters)", 1e-30, 3.4e38, "a positive number", .flag = 1, .state = REQ, .math = 1},
    {"min-lr-frac", NB_OPT_FLOAT, F(min_lr_frac), NB_OPTG_COMMON, NULL, "X", "final lr as a fraction of --lr (cosine; 1: constant)", 0, 1, "between 0 and 1", .flag = 1, .state = REQ, .math = 1},
    {"weight-decay", NB_OPT_FLOAT, F(weight_decay), NB_OPTG_COMMON, NULL, "X", "AdamW decoupled weight decay (2-D weights)", 0, 1e3, ">= 0", .flag = 1, .state = REQ, .math = 1},
    {"beta1", NB_OPT_FLOAT, F(beta1), NB_OPTG_COMMON, "0.9", NULL, NULL, 0, 0x1.fffffep-1, "in [0, 1)", .state = REQ},
    {"beta2", NB_OPT_FLOAT, F(beta2), NB_OPTG_COMMON, NULL, NULL, NULL, 0, 0x1.fffffep-1, "in [0, 1)", .state = REQ},
    {"eps", NB_OPT_FLOAT, F(eps), NB_OPTG_COMMON, "1e-8", NULL, NULL, 1e-45, 1, "a positive number", .state = REQ},
    {"grad-clip", NB_OPT_FLOAT, F(grad_clip), NB_OPTG_COMMON, NULL, "X", "global gradient-norm clip (0: off; seqctr: the dense part)", 0, 1e30, ">= 0 (0: off)", .flag = 1, .state = REQ, .math = 1},
    {"seed", NB_OPT_U64, F(seed), NB_OPTG_COMMON, NULL, "N", "seed of the weight init", .flag = 1, .state = REQ},
    {"detach", NB_OPT_STR, F(detach), NB_OPTG_ERASE, NULL, "LIST", "where segments start: layer counts / block indices like 2,4, or all (each segment gets a local head)", .flag = 1, .state = OPT, .math = 1},
    {"aux-weight", NB_OPT_FLOAT, F(aux_weight), NB_OPTG_ERASE, NULL, "X", "weight of the local heads' losses (seqctr: 0, or 1 with --detach)", 0, 1e6, ">= 0", .flag = 1, .state = OPT},
    {"side-lanes", NB_OPT_INT, F(side_lanes), NB_OPTG_ERASE, NULL, "K", "erase: side lanes, round robin over the segments", 1, NB_MAX_SEGMENTS, "between 1 and 64", .flag = 1, .state = OPT},
    {"erase-dispatch", NB_OPT_ENUM, F(erase_dispatch), NB_OPTG_ERASE, "blocking", "MODE", "erase: blocking or async (a thread per side lane)", .names = dispatch_names, .flag = 1, .state = OPT},
    {"ckpt-interval", NB_OPT_INT, F(ckpt_interval), NB_OPTG_STREAM, NULL, "K", "keep every K-th layer's input and recompute the rest (0: keep all)", 0, BIG, ">= 0", .flag = 1, .state = OPT},
    {"stream-slots", NB_OPT_INT, F(stream_slots), NB_OPTG_STREAM, "2", "N", "device weight slots layers stream through (1: no double buffering; -1: as many as fit, up to one per layer)", -1, BIG, ">= 1, or -1", .flag = 1, .state = OPT},
    {"pinned-slabs", NB_OPT_INT, F(pinned_slabs), NB_OPTG_STREAM, "2", "N", "pinned staging slabs each way, one layer each (1-4)", 0, BIG, ">= 0", .flag = 1, .state = OPT},
    {"keep-layers", NB_OPT_INT, F(keep_layers), NB_OPTG_STREAM, NULL, "N", "with --ckpt-interval: the last N layers keep all activations, no recompute (-1: as many as fit)", -1, BIG, ">= 0, or -1", .flag = 1, .state = OPT},
    {"gpu-layers", NB_OPT_INT, F(gpu_layers), NB_OPTG_STREAM, NULL, "N", "N layers (spread evenly) keep weights, AdamW state and gradients on the GPU and update there (-1: as many as fit)", -1, BIG, ">= 0, or -1", .flag = 1, .state = OPT},
    {"emb-optim", NB_OPT_ENUM, F(emb_optim), NB_OPTG_SC, "adagrad", "NAME", "adagrad (row-wise), adam (lazy sparse) or adagrad-exact (element-wise: dlrm-dcnv2's default, as MLPerf's reference)", .names = emb_optim_names, .flag = 1, .state = OPT, .math = 1},
    {"dense-optim", NB_OPT_ENUM, F(dense_optim), NB_OPTG_SC, "adamw", "NAME", "the dense parameters' optimizer: adamw, or adagrad (torch.optim.Adagrad's; dlrm-dcnv2's default, as MLPerf)", .names = dense_optim_names, .flag = 1, .state = OPT, .math = 1},
    {"emb-lr", NB_OPT_FLOAT, F(emb_lr), NB_OPTG_SC, "0.05", "X", "embedding learning rate (default 0.05 adagrad, 0.001 adam)", 1e-30, 3.4e38, "a positive number", .flag = 1, .state = OPT, .math = 1},
    {"table-cap", NB_OPT_I64, F(table_cap), NB_OPTG_SC, "100000", "N", "rows per embedding table at most (ids mod rows)", 1, BIG, "at least 1", .flag = 1, .state = OPT},
    {"eval-samples", NB_OPT_INT, F(eval_samples), NB_OPTG_SC, "16384", "N", "held-out samples (synth, criteo: the head of the file; MovieLens holds out its test file)", 1, 1 << 24, "in 1..16777216", .flag = 1, .state = OPT},
    {"schema", NB_OPT_STR, F(schema), NB_OPTG_SC, NULL, "FILE", "--data csv:FILE: the JSON schema naming its label, dense, categorical and sequence columns (or the built-in: criteo)", .flag = 1, .state = OPT, .math = 1},
    {"strict", NB_OPT_BOOL, F(strict), NB_OPTG_SC, NULL, NULL, "criteo: stop at the first bad line (default: skip and count)", .flag = 1, .state = OPT},
    {"grad-accum", NB_OPT_INT, F(grad_accum), NB_OPTG_RANKS, "1", "K", "micro-batches per optimizer step on each rank, gradients summed in order", 1, 4096, "in 1..4096", .flag = 1, .state = OPT},
    {"comm", NB_OPT_ENUM, F(comm), NB_OPTG_RANKS, "auto", "KIND", "auto, mpi (CPU), nccl (a GPU per rank) or host (GPU buffers over MPI)", .names = comm_names, .flag = 1, .state = OPT},
    {"comm-sm-free", NB_OPT_BOOL, F(comm_sm_free), NB_OPTG_RANKS, NULL, NULL, "all-to-all and all-gather over copy engines (CUDA IPC peer copies on one node, host-staged across nodes); reductions stay on --comm", .flag = 1, .state = OPT},
    {"comm-timeout", NB_OPT_FLOAT, F(comm_timeout), NB_OPTG_RANKS, "300", "S", "a collective taking longer ends the job, naming the rank it waits for", 0.1, 1e7, "a positive number of seconds", .flag = 1, .state = OPT},
    {"world", NB_OPT_INT, F(world), NB_OPTG_RANKS, "1", NULL, NULL, 1, BIG, "at least 1", .state = OPT},
    {"emb-shard", NB_OPT_ENUM, F(emb_shard), NB_OPTG_SC, "auto", "HOW", "row: tables sharded by row over the ranks (row g on rank g % N); none; auto: row with several ranks", .names = emb_shard_names, .flag = 1, .state = OPT},
    {"pipe-skip-resync", NB_OPT_BOOL, F(pipe_skip_resync), NB_OPTG_SC, NULL, NULL, "debug (--schedule pipe): skip the re-sync of the rows a step updates (results then differ from sync)", .flag = 1, .state = OPT, .math = 1},
    {"emb-place", NB_OPT_ENUM, F(emb_place), NB_OPTG_SC, "gpu", "WHERE", "gpu, or host: the table rows (each owner's shard, when sharded) and their optimizer state in pinned host DRAM, which the GPU reads and updates in place", .names = emb_place_names, .flag = 1, .state = OPT},
    {"cluster-keys", NB_OPT_BOOL, F(cluster_keys), NB_OPTG_SC, NULL, NULL, "with --micro-batches: samples sharing hot keys go to the same part (fewer distinct rows moved)", .flag = 1, .state = OPT, .math = 1},
    {"balance", NB_OPT_STR, F(balance), NB_OPTG_SC, "none", "HOW", "FreeScale: where each global batch's samples train: none (slices in data order), fbs (equal counts, lengths dealt zig-zag), vbs[:A[:C0]] (counts vary, equal sums of C0 + L^A; default 1.5:16)", .flag = 1, .state = OPT, .math = 1},
    {"emulate-ranks", NB_OPT_INT, F(emulate_ranks), NB_OPTG_SC, NULL, "N", "train N ranks' shares one after another in one process and time each: the straggler measurement on one GPU", 0, 256, "2..256 (0: none)", .flag = 1, .state = OPT, .math = 1},
    {"emb-priority", NB_OPT_BOOL, F(emb_priority), NB_OPTG_SC, NULL, NULL, "FreeScale, with --schedule pipe: the next batch's exclusive rows move while the step trains, its collision rows (the ones the step updates) right after the update", .flag = 1, .state = OPT},
    {"micro-batches", NB_OPT_INT, F(micro_batches), NB_OPTG_SC, "1", "M", "Frozen-Window Pipelining (NestPipe's FWP): each rank's batch in M parts trained on one frozen embedding state, the tables updated once after the last", 1, 4096, "in 1..4096", .flag = 1, .state = OPT, .math = 1},
    /* the CPU's GEMMs sum in an order that depends on the thread count: a resume keeps it */
    {"threads", NB_OPT_INT, F(threads), NB_OPTG_COMMON, NULL, "N", "CPU threads (0: all cores; a resume keeps the run's)", 0, BIG, ">= 0 (0: all cores)", .flag = 1, .state = OPT, .math = 1},
    {"tokenizer", NB_OPT_STR, F(tokenizer), NB_OPTG_TF, NULL, "DIR", "the Hugging Face tokenizer folder (tokenizer.json, tokenizer_config.json) of the run's data: sample encodes and decodes with it, export copies its files (default: the --init-from folder when it holds tokenizer.json)", .flag = 1, .state = OPT},
    {"init-source", NB_OPT_STR, F(init_source), NB_OPTG_TF, NULL, NULL, NULL, .state = OPT},
    /* LoRA (issue 33): the base frozen, adapters trained; state.json keeps them (a resume and an
     * export need them) */
    {"lora", NB_OPT_INT, F(lora_r), NB_OPTG_TF, NULL, "R", "LoRA of rank R: the model's weights frozen, adapters A [R, in] and B [out, R] of each --lora-targets projection trained (0: full fine-tuning)", 0, 65536, "in 0..65536", .flag = 1, .state = OPT, .math = 1},
    {"lora-alpha", NB_OPT_FLOAT, F(lora_alpha), NB_OPTG_TF, "8", "A", "LoRA's alpha: the branch is scaled by A / R (PEFT's LoraConfig default, 8)", 1e-30, 3.4e38, "a positive number", .flag = 1, .state = OPT, .math = 1},
    {"lora-targets", NB_OPT_STR, F(lora_targets), NB_OPTG_TF, "q,k,v,o", "LIST", "LoRA's projections, a subset of q,k,v,o,gate,up,down (GPT-2: q,k,v = c_attn together, o = attn.c_proj, up = c_fc, down = mlp.c_proj)", .flag = 1, .state = OPT, .math = 1},
    {"lora-dropout", NB_OPT_FLOAT, F(lora_dropout), NB_OPTG_TF, "0", "P", "dropout on LoRA's input (only 0 is supported)", 0, 1, "0", .flag = 1, .state = OPT, .math = 1},
    /* what the run's base was (crc32c of its fp32 weights, + 1; 0: not recorded): a resume from a
     * base that changed since is refused, not silently continued */
    {"lora-base-crc", NB_OPT_U64, F(lora_base_crc), NB_OPTG_TF, NULL, NULL, NULL, .state = OPT},
    /* flags only: where the run writes, how it reports, limits of this process */
    {"gpu-mem-limit", NB_OPT_U64, F(gpu_mem_limit), NB_OPTG_COMMON, NULL, "BYTES", "cap the GPU memory plan (0: what is free)", .flag = 1},
    {"host-mem-limit", NB_OPT_U64, F(host_mem_limit), NB_OPTG_COMMON, NULL, "BYTES", "host memory the plan may use (0: what the host reports)", .flag = 1},
    {"stop-after", NB_OPT_INT, F(stop_after), NB_OPTG_COMMON, NULL, "N", "stop (with a checkpoint) after this step; resume later", 0, BIG, ">= 0 (0: none)", .flag = 1},
    {"time-limit", NB_OPT_FLOAT, F(time_limit), NB_OPTG_COMMON, NULL, "S", "stop (with a checkpoint) once S seconds of training have passed", 0, 1e12, ">= 0 (0: none)", .flag = 1},
    {"out", NB_OPT_STR, F(out), NB_OPTG_COMMON, NULL, "DIR", "run directory: metrics.jsonl, loss.svg, ckpt/ (with --resume: its directory)", .flag = 1},
    {"resume", NB_OPT_STR, F(resume), NB_OPTG_COMMON, NULL, "DIR", "continue from a run directory's checkpoint", .flag = 1},
    {"trace", NB_OPT_STR, F(trace), NB_OPTG_COMMON, NULL, "FILE", "write a Chrome trace of every lane", .flag = 1},
    {"kernel-table", NB_OPT_INT, F(kernel_table), NB_OPTG_COMMON, NULL, "N", "cuda: after the run, the device's work per step (every kernel, memset and copy of the steps after warm-up, from CUPTI), its N longest kernels and the idle time between launches", 0, BIG, ">= 0", .flag = 1},
    {"log-every", NB_OPT_INT, F(log_every), NB_OPTG_COMMON, NULL, "N", "progress line every N steps when not on a terminal", 0, BIG, ">= 0", .flag = 1},
    {"ckpt-minutes", NB_OPT_FLOAT, F(ckpt_minutes), NB_OPTG_COMMON, "10", "M", "a checkpoint at least every M minutes of training besides --ckpt-every's (0: none), so a killed run loses little", 0, 1e9, ">= 0 (0: none)", .flag = 1},
    {"ckpt-weights-only", NB_OPT_BOOL, F(ckpt_weights_only), NB_OPTG_COMMON, NULL, NULL, "checkpoints without the optimizer state (a quarter of a transformer's bytes): eval, sample and export read them, --resume cannot", .flag = 1},
    {"no-ckpt", NB_OPT_BOOL, F(no_ckpt), NB_OPTG_COMMON, NULL, NULL, "write no checkpoint (benchmarks; metrics.jsonl still)", .flag = 1},
    {"graph-cache", NB_OPT_INT, F(graph_cache), NB_OPTG_COMMON, "16", "N", "--graphs: keep at most N captured steps, one per step shape (seqctr: history-row bucket, micro-batch, ring slot); steps of later shapes run eagerly, with the same bits; each graph holds its own scratch memory", 1, 1024, "in 1..1024", .flag = 1},
    {"fresh", NB_OPT_BOOL, F(fresh), NB_OPTG_COMMON, NULL, NULL, "start over in an --out directory that holds a checkpoint (without it the run resumes that checkpoint, as --resume would)", .flag = 1},
    {"no-progress", NB_OPT_BOOL, F(no_progress), NB_OPTG_COMMON, NULL, NULL, "no live progress line", .flag = 1},
    {"quiet", NB_OPT_BOOL, F(quiet), NB_OPTG_COMMON, NULL, NULL, "print only errors and the summary", .flag = 1},
    {"index-lists", NB_OPT_ENUM, F(index_lists), NB_OPTG_SC, "auto", "WHO", "auto, host or device: who builds each batch's embedding lookup lists and their deduplication (auto: the GPU when the tables are not sharded; the same lists either way)", .names = lists_names, .flag = 1},
    {"init-from", NB_OPT_STR, F(init_from), NB_OPTG_TF, NULL, "HF_DIR", "start from a Hugging Face model directory (GPT2LMHeadModel, LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM): its config.json sets the shape (no --model), its model.safetensors or sharded index the weights (F32, BF16 or F16)", .flag = 1},
    /* the model's shape: on top of the preset, or the checkpoint's (state.json keeps it in "model";
 * seqctr's read_config checks it against these rows' ranges) */
    {"layers", NB_OPT_INT, F(model.layers), NB_OPTG_TF, NULL, "N", "override: transformer layers", 1, BIG, "at least 1", .flag = 1},
    {"dim", NB_OPT_INT, F(model.dim), NB_OPTG_TF, NULL, "N", "override: model width", 1, BIG, "at least 1", .flag = 1},
    {"heads", NB_OPT_INT, F(model.heads), NB_OPTG_TF, NULL, "N", "override: attention heads", 1, BIG, "at least 1", .flag = 1},
    {"kv-heads", NB_OPT_INT, F(model.kv_heads), NB_OPTG_TF, NULL, "N", "override: key/value heads (llama)", 1, BIG, "at least 1", .flag = 1},
    {"ffn", NB_OPT_INT, F(model.ffn), NB_OPTG_TF, NULL, "N", "override: MLP hidden width", 1, BIG, "at least 1", .flag = 1},
    {"vocab", NB_OPT_INT, F(model.vocab), NB_OPTG_TF, NULL, "N", "override: vocabulary size", 2, BIG, "at least 2", .flag = 1},
    {"seq", NB_OPT_INT, F(model.seq), NB_OPTG_TF, NULL, "N", "override: context length = training sequence length", 1, BIG, "at least 1", .flag = 1},
    {"emb-dim", NB_OPT_INT, F(ctr.E), NB_OPTG_SC, NULL, "E", "embedding width (a multiple of --heads)", 4, 65536, "in 4..65536", .flag = 1},
    {"heads", NB_OPT_INT, F(ctr.heads), NB_OPTG_SC, NULL, "N", "attention heads of the history encoder", 1, 65536, "in 1..65536", .flag = 1},
    {"blocks", NB_OPT_INT, F(ctr.blocks), NB_OPTG_SC, NULL, "N", "dense blocks (cross + MLP) in the chain", 1, NB_SC_MAX_BLOCKS, "in 1..64", .flag = 1},
    {"cross-rank", NB_OPT_INT, F(ctr.cross_rank), NB_OPTG_SC, NULL, "R", "rank of each low-rank cross", 1, 1 << 20, "in 1..1048576", .flag = 1},
    {"block-hidden", NB_OPT_INT, F(ctr.block_hidden), NB_OPTG_SC, NULL, "H", "hidden width of each block's MLP", 1, 1 << 20, "in 1..1048576", .flag = 1},
    {"top-mlp", NB_OPT_STR, F(top_mlp), NB_OPTG_SC, NULL, "W,W,..", "dlrm-dcnv2: the top MLP's hidden widths (default 1024,1024,512,256; then one logit)", .flag = 1},
    {"hist-layers", NB_OPT_INT, F(ctr.hist_layers), NB_OPTG_SC, NULL, "N", "transformer layers over the history", 0, 1024, "in 0..1024", .flag = 1},
    {"max-len", NB_OPT_INT, F(ctr.max_len), NB_OPTG_SC, NULL, "L", "history cap (synth: unless max_len= is in the spec)", 0, 65536, "in 0..65536", .flag = 1},
};
#define NROWS ((int)(sizeof table / sizeof table[0]))

const nb_opt *nb_opts_table(int *n) {
    *n = NROWS;
    return table;
}

const nb_opt *nb_opt_find(const char *name, unsigned groups) {
    for (int i = 0; i < NROWS; i++)
        if (table[i].flag && !strcmp(table[i].name, name) && (groups & (1u << table[i].group))) return &table[i];
    return NULL;
}

static void *field(const nb_opt *opt, nb_train_opts *o) { return (char *)o + opt->offset; }
static const void *cfield(const nb_opt *opt, const nb_train_opts *o) { return (const char *)o + opt->offset; }

const char *nb_opt_names(const nb_opt *opt, char *buf, size_t cap) {
    size_t at = 0;
    buf[0] = 0;
    for (int k = 0; opt->names && opt->names[k]; k++) {
        if (!opt->names[k][0]) continue; /* the empty name: the default, not spelled */
        const char *sep = !at ? "" : opt->names[k + 1] ? ", " : " or ";
        at += (size_t)snprintf(buf + at, at < cap ? cap - at : 0, "%s%s", sep, opt->names[k]);
    }
    return buf;
}

static int set_enum(const nb_opt *opt, nb_train_opts *o, const char *v, char *err, size_t cap) {
    for (int k = 0; opt->names[k]; k++)
        if (!strcmp(opt->names[k], v)) {
            *(int *)field(opt, o) = k;
            return 1;
        }
    char names[160];
    snprintf(err, cap, "unknown --%s '%s' (pass --%s %s)", opt->name, v, opt->name, nb_opt_names(opt, names, sizeof names));
    return 0;
}

int nb_opt_set(const nb_opt *opt, nb_train_opts *o, const char *v, char *err, size_t cap) {
    char *end = NULL;
    errno = 0;
    switch (opt->type) {
    case NB_OPT_INT:
    case NB_OPT_I64: {
        long long x = strtoll(v, &end, 10);
        if (!*v || *end || errno) return snprintf(err, cap, "--%s takes an integer, got '%s'", opt->name, v), 0;
        if (x < opt->lo || x > opt->hi)
            return snprintf(err, cap, "--%s is %lld: it must be %s", opt->name, x, opt->range), 0;
        if (opt->type == NB_OPT_INT)
            *(int *)field(opt, o) = (int)x;
        else
            *(int64_t *)field(opt, o) = x;
        return 1;
    }
    case NB_OPT_U64: {
        unsigned long long x = strtoull(v, &end, 10);
        if (!*v || *end || errno || v[0] == '-')
            return snprintf(err, cap, "--%s takes a non-negative integer, got '%s'", opt->name, v), 0;
        *(uint64_t *)field(opt, o) = x;
        return 1;
    }
    case NB_OPT_FLOAT: {
        float x = strtof(v, &end);
        if (!*v || *end || errno || !isfinite(x)) return snprintf(err, cap, "--%s takes a number, got '%s'", opt->name, v), 0;
        *(float *)field(opt, o) = x;
        return 1;
    }
    case NB_OPT_STR:
        if (strlen(v) >= opt->size)
            return snprintf(err, cap, "--%s value is longer than %zu bytes", opt->name, opt->size - 1), 0;
        memcpy(field(opt, o), v, strlen(v) + 1);
        return 1;
    case NB_OPT_BOOL:
        if (strcmp(v, "0") && strcmp(v, "1")) return snprintf(err, cap, "--%s takes no value", opt->name), 0;
        *(int *)field(opt, o) = v[0] == '1';
        return 1;
    case NB_OPT_ENUM: return set_enum(opt, o, v, err, cap);
    }
    return 0;
}

void nb_opt_format(const nb_opt *opt, const nb_train_opts *o, char *buf, size_t cap) {
    const void *p = cfield(opt, o);
    switch (opt->type) {
    case NB_OPT_INT: snprintf(buf, cap, "%d", *(const int *)p); break;
    case NB_OPT_I64: snprintf(buf, cap, "%lld", (long long)*(const int64_t *)p); break;
    case NB_OPT_U64: snprintf(buf, cap, "%llu", (unsigned long long)*(const uint64_t *)p); break;
    case NB_OPT_FLOAT: snprintf(buf, cap, "%g", (double)*(const float *)p); break;
    case NB_OPT_STR: snprintf(buf, cap, "%s", (const char *)p); break;
    case NB_OPT_BOOL: snprintf(buf, cap, "%d", *(const int *)p); break;
    case NB_OPT_ENUM: snprintf(buf, cap, "%s", opt->names[*(const int *)p]); break;
    }
}

const char *nb_precision_name(nb_opt_precision p) { return precision_names[p]; }

/* ---------------------------------------------------------------- defaults */

static void set_default(const nb_opt *opt, nb_train_opts *o, const char *v) {
    char err[256];
    if (!nb_opt_set(opt, o, v, err, sizeof err)) nb_fail("this is a bug in nobubble's options table", "default: %s", err);
}

void nb_train_opts_defaults(nb_train_opts *o, const nb_family_i *fam) {
    memset(o, 0, sizeof *o);
    for (int i = 0; i < NROWS; i++)
        if (table[i].dflt) set_default(&table[i], o, table[i].dflt);
    snprintf(o->family, sizeof o->family, "%s", fam->name);
    /* the family's own defaults, "name=value" like a flag of its groups */
    for (const char *const *d = fam->option_defaults; d && *d; d++) {
        const char *eq = strchr(*d, '=');
        char name[64];
        NB_ASSERT(eq && (size_t)(eq - *d) < sizeof name);
        snprintf(name, sizeof name, "%.*s", (int)(eq - *d), *d);
        const nb_opt *opt = NULL; /* a flag's row, or a state.json-only option's (beta2) */
        for (int i = 0; i < NROWS && !opt; i++)
            if (!strcmp(table[i].name, name)) opt = &table[i];
        NB_ASSERT(opt != NULL);
        set_default(opt, o, eq + 1);
    }
    if (fam->defaults) fam->defaults(o);
}

/* ---------------------------------------------------------------- state.json */

static void write_value(nb_json_writer *w, const nb_opt *opt, const nb_train_opts *o, const char *key) {
    const void *p = cfield(opt, o);
    switch (opt->type) {
    case NB_OPT_INT:
    case NB_OPT_BOOL: nb_json_kint(w, key, *(const int *)p); break;
    case NB_OPT_I64: nb_json_kint(w, key, *(const int64_t *)p); break;
    case NB_OPT_U64: nb_json_key(w, key), nb_json_uint(w, *(const uint64_t *)p); break;
    case NB_OPT_FLOAT: nb_json_knum(w, key, *(const float *)p); break;
    case NB_OPT_STR: nb_json_kstr(w, key, (const char *)p); break;
    case NB_OPT_ENUM: nb_json_kstr(w, key, opt->names[*(const int *)p]); break;
    }
}

static void state_key(const nb_opt *opt, char *key, size_t cap) {
    snprintf(key, cap, "%s", opt->name);
    for (char *c = key; *c; c++)
        if (*c == '-') *c = '_';
}

void nb_train_opts_write_json(nb_json_writer *w, const nb_train_opts *o) {
    nb_json_key(w, "train");
    nb_json_begin_obj(w);
    for (int i = 0; i < NROWS; i++) {
        if (!table[i].state) continue;
        char key[64];
        state_key(&table[i], key, sizeof key);
        write_value(w, &table[i], o, key);
    }
    nb_json_end_obj(w);
}

/* A 32-bit field from a 64-bit JSON integer: out of range is a damaged file, not a wrap. */
static int to_int(const char *path, const char *key, int64_t v) {
    NB_CHECK(v >= -2147483647LL - 1 && v <= 2147483647LL, "the checkpoint is damaged: fix or remove the field",
             "%s: field '%s' is %lld, outside the 32-bit range", path, key, (long long)v);
    return (int)v;
}

static void read_value(const char *path, const nb_json *j, const nb_opt *opt, nb_train_opts *o, const char *key) {
    void *p = field(opt, o);
    switch (opt->type) {
    case NB_OPT_INT: *(int *)p = to_int(path, key, nb_json_req_int(j, key)); break;
    case NB_OPT_BOOL: {
        int64_t v = nb_json_req_int(j, key);
        NB_CHECK(v == 0 || v == 1, "the checkpoint is damaged: fix or remove the field", "%s: field '%s' is %lld, not 0 or 1",
                 path, key, (long long)v);
        *(int *)p = (int)v;
        break;
    }
    case NB_OPT_I64: *(int64_t *)p = nb_json_req_int(j, key); break;
    case NB_OPT_U64: *(uint64_t *)p = nb_json_req_u64(j, key); break;
    case NB_OPT_FLOAT: *(float *)p = (float)nb_json_req_num(j, key); break;
    case NB_OPT_STR: {
        const char *s = nb_json_req_str(j, key);
        NB_CHECK(strlen(s) < opt->size, "the checkpoint is damaged", "state.json field '%s' is too long", key);
        memcpy(p, s, strlen(s) + 1);
        break;
    }
    case NB_OPT_ENUM: {
        char err[256];
        NB_CHECK(nb_opt_set(opt, o, nb_json_req_str(j, key), err, sizeof err), "the checkpoint is damaged: fix or remove the field",
                 "%s: %s", path, err);
        break;
    }
    }
}

void nb_train_opts_read_json(const char *path, const nb_json *j, nb_train_opts *o) {
    for (int i = 0; i < NROWS; i++) {
        if (!table[i].state) continue;
        char key[64];
        state_key(&table[i], key, sizeof key);
        if (table[i].state == OPT && !nb_json_get(j, key)) continue;
        read_value(path, j, &table[i], o, key);
    }
}

/* ---------------------------------------------------------------- checks */

static double number_of(const nb_opt *opt, const nb_train_opts *o) {
    const void *p = cfield(opt, o);
    switch (opt->type) {
    case NB_OPT_INT: return *(const int *)p;
    case NB_OPT_I64: return (double)*(const int64_t *)p;
    case NB_OPT_FLOAT: return *(const float *)p;
    default: return 0;
    }
}

/* A number within the row's range, whether it came from a flag or a state.json. */
static void check_range(const nb_opt *opt, const nb_train_opts *o) {
    if (!opt->range || opt->type == NB_OPT_U64) return;
    double x = number_of(opt, o);
    char v[64];
    nb_opt_format(opt, o, v, sizeof v);
    NB_CHECK(isfinite(x) && x >= opt->lo && x <= opt->hi, "pass a value in the range the message names (flag or state.json field)",
             "--%s is %s: it must be %s", opt->name, v, opt->range);
}

void nb_train_opts_check(const nb_train_opts *o, unsigned groups) {
    /* every option state.json keeps is in its range, the family's or not (a damaged value of
     * another family's option is still damage, and some are read across: nb_train_parts) */
    for (int i = 0; i < NROWS; i++)
        if ((groups & (1u << table[i].group)) || table[i].state) check_range(&table[i], o);
    NB_CHECK(o->micro_batches <= 1 || o->grad_accum <= 1, "pass --micro-batches (FWP) or --grad-accum, not both",
             "--micro-batches %d and --grad-accum %d both split the step", o->micro_batches, o->grad_accum);
    NB_CHECK(o->emulate_ranks == 0 || o->emulate_ranks >= 2, "pass a value in the range the message names (flag or state.json field)",
             "--emulate-ranks is %d: it must be 2..256 (0: none)", o->emulate_ranks);
    nb_balance b;
    nb_balance_parse(&b, o->balance);
}

/* ---------------------------------------------------------------- what is printed */

/* An option at the table's own default is left out of the printed configuration. */
static int at_table_default(const nb_opt *opt, const nb_train_opts *o) {
    nb_train_opts d;
    char a[NB_PATH_MAX + 8], b[NB_PATH_MAX + 8];
    memset(&d, 0, sizeof d);
    if (opt->dflt) set_default(opt, &d, opt->dflt);
    nb_opt_format(opt, o, a, sizeof a);
    nb_opt_format(opt, &d, b, sizeof b);
    return !strcmp(a, b);
}

/* The model's shape: the family's model line prints it. */
static int shape_row(const nb_opt *opt) {
    size_t tf = offsetof(nb_train_opts, model), sc = offsetof(nb_train_opts, ctr);
    return (opt->offset >= tf && opt->offset < tf + sizeof(nb_tf_config)) || (opt->offset >= sc && opt->offset < sc + sizeof(nb_sc_config));
}

void nb_train_opts_print(const nb_train_opts *o, unsigned groups, FILE *f) {
    int col = 0;
    for (int i = 0; i < NROWS; i++) {
        const nb_opt *opt = &table[i];
        if (!(groups & (1u << opt->group)) || !opt->flag || shape_row(opt) || !strcmp(opt->name, "model") || at_table_default(opt, o))
            continue;
        char v[NB_PATH_MAX + 8], item[NB_PATH_MAX + 80];
        nb_opt_format(opt, o, v, sizeof v);
        if (opt->type == NB_OPT_BOOL)
            snprintf(item, sizeof item, "--%s", opt->name);
        else
            snprintf(item, sizeof item, "--%s %s", opt->name, v[0] ? v : "''");
        int len = (int)strlen(item);
        if (col == 0 || col + 1 + len > 110) {
            fprintf(f, "%s%-12s%s", col ? "\n" : "", col ? "" : "options", item);
            col = 12 + len;
        } else {
            fprintf(f, " %s", item);
            col += 1 + len;
        }
    }
    if (col) fputc('\n', f);
}

void nb_train_opts_note_changes(const nb_train_opts *was, const nb_train_opts *now) {
    for (int i = 0; i < NROWS; i++) {
        if (!table[i].math) continue;
        char a[NB_PATH_MAX + 8], b[NB_PATH_MAX + 8];
        nb_opt_format(&table[i], was, a, sizeof a);
        nb_opt_format(&table[i], now, b, sizeof b);
        if (strcmp(a, b))
            fprintf(stderr, "note: --%s %s differs from the checkpoint's %s: the resumed run is no longer bitwise what one "
                            "straight run would train\n", table[i].name, b[0] ? b : "''", a[0] ? a : "''");
    }
}

/* ---------------------------------------------------------------- derived */

int nb_train_parts(const nb_train_opts *o) {
    if (o->emulate_ranks > 1) return o->emulate_ranks;
    return o->micro_batches > 1 ? o->micro_batches : o->grad_accum;
}

int nb_train_warmup_steps(const nb_train_opts *o) { return o->warmup >= 0 ? o->warmup : o->steps / 20; }

/* "all" or an increasing list of first pieces of the segments after the first, like 2,4 */
int nb_parse_detach(const char *spec, int n, const char *unit, int *first, int max_segments) {
    char hint[160];
    snprintf(hint, sizeof hint, "give 'all' or %s 1..%d, increasing, separated by commas (like --detach 2,4)", unit, n - 1);
    int nseg = 1;
    first[0] = 0;
    if (!strcmp(spec, "all")) {
        NB_CHECK(n <= max_segments, hint, "--detach all: %d segments, at most %d", n, max_segments);
        for (int i = 1; i < n; i++) first[nseg++] = i;
        first[nseg] = n;
        return nseg;
    }
    for (const char *p = spec; *p;) {
        char *end;
        long cut = strtol(p, &end, 10);
        NB_CHECK(end != p && (*end == ',' || !*end), hint, "--detach '%s' is not a list of %s", spec, unit);
        NB_CHECK(cut >= 1 && cut < n, hint, "--detach '%s': %ld is outside 1..%d (%s 1..%d)", spec, cut, n - 1, unit, n - 1);
        NB_CHECK(cut > first[nseg - 1], hint, "--detach '%s' is not increasing", spec);
        NB_CHECK(nseg < max_segments, hint, "--detach '%s': at most %d segments", spec, max_segments);
        first[nseg++] = (int)cut;
        p = *end ? end + 1 : end;
    }
    first[nseg] = n;
    return nseg;
}
