#!/usr/bin/env bash
# One call on a lent GPU machine: unpack the carried data, then run the named stages in order,
# each under its own time limit, all output under $OUT/res, packed into $OUT/res.tgz at the end
# (the device tool returns at most 8 files). $OUT defaults to gpu-out/, which git ignores: raw
# output is never committed; bench/RESULTS.md keeps the tables with their commit and command.
#   bash scripts/device_session.sh [--deadline S] STAGE[:LIMIT_S] ...
# Stages: gpu_seqctr, gpu_ranks (the GPU test scripts), pipe (bench/pipe_bench.sh, PIPE_ARGS),
#   ranks_gpu (bench/ranks_bench.sh on the GPU, RANKS_ARGS), builds (this tree, and .before/src.tgz's in /tmp/before: a refactor's before, for
#   ab: bench/engine_ab.sh before vs now; parity_gpu: tests/parity_across_commits.sh's GPU matrix, before vs now,
#   PARITY_ARGS), gpu_all, gpu_train, comm_gpu (tests/test_comm --gpu nccl|host|auto, 1 and 2 ranks on the GPU,
#   --sm-free: 2 ranks sharing it over CUDA IPC, 1 nccl rank (IPC and --staged), a counts mismatch; and tests/comm_test.sh), ctr_ops_bench, k19 (issue 19's kernels: test_ops's ctr cuda rows, then
#   the ctr_model perf row with the new-vs-old table last), smfree (bench/smfree_bench.sh: a GEMM beside SM-kernel vs
#   copy-engine copies; table also in res/smfree.txt), adamw_bench, host_info (CPU and NUMA layout),
#   seqctr (bench/seqctr_bench.sh: nobubble --graphs vs PyTorch eager/compile; SC_STEPS, SC_BATCH, SC_BUDGET),
#   dlrm (bench/dlrm_bench.sh: nobubble dlrm-dcnv2 vs PyTorch eager/compile/reduce-overhead at batch 6,912;
#   DLRM_BUDGET [400], DLRM_ARGS e.g. "--table-cap 4000000 --steps 100"),
#   gpu_bench (bench/gpu_bench.sh: transformers vs PyTorch's modes; GPU_BENCH_ARGS), lists (bench/lists_bench.sh: --index-lists host vs device, plain and ERASE with graphs; LISTS_ARGS),
#   balance, balance_e2e, balance_test (issue 17: bench/balance_bench.sh emulated ranks, --e2e, tests/balance_test.sh; env
#   BAL_ARGS, BAL_E2E_ARGS), stream1b, stream8b, stream14b, erase_tf, erase_ctr, erase_quality, k18 (issue 18's kernels: CUDA op and
#   attention tests, torch refs, GPU trainer tests), attn_cudnn (test_ops's attention_cudnn rows, eval and
#   perf, bench/attn_ab.sh: the step with each --attn; ATTN_AB_ARGS), gpu_quick (test_ops --backend cuda, test_kprof,
#   tests/gpu_train_test.sh), quality (gpt2 B=16 600 steps on data/sotu: the validation losses), attn_quality (gpt2 B=16 600 steps on data/sotu with NB_ATTN=fa and auto:
#   the validation losses side by side), finetune (bench/finetune_bench.sh; FT_ARGS), capacity (tests/gpu_capacity.sh;
#   CAP_ARGS [--only full14b]), lora (bench/lora_bench.sh; LORA_ARGS [--only a]), sc_profile (a seqctr run with emulated ranks under nsys:
#   the kernels' time table; SCP_CAP, SCP_RANKS, SCP_BALANCE, SCP_STEPS), ktable (bench/kernel_table.sh: each
#   model's step kernel by kernel from CUPTI; KTABLE_ARGS), clocks (nvidia-smi's clocks, power, throttling).
#   The stream runs take env
#   B1, B8, B14, S8, S14, KEEP1, KEEP8, KEEP14, STREAM1_ARGS and STREAM8_ARGS; CKPT and the rest
#   of stream_bench.sh's environment pass through.
# --deadline S: no stage starts after S seconds, and each stage's limit is cut to what is left
#   (default 570, under the tool's 600 s per call).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# the ctr family's cuda rows of tests/test_ops (tests/ops/ctr_cuda*.c)
CTR_CUDA_OPS='emb_*,unique_groups,lists,device_count,sparse_optim,cross,relu,linear1,bce,cols,seqattn*,targetattn'
deadline=570
[ "${1:-}" = --deadline ] && { deadline=$2; shift 2; }
start=$(date +%s)
R=${OUT:-gpu-out}/res; mkdir -p "$R"
[ -f data/movielens_clicks.tgz ] && [ ! -f data/movielens/clicks_train.tsv ] && tar xzf data/movielens_clicks.tgz
source scripts/device_deps.sh use || exit 1
export PYTHONUNBUFFERED=1 NB_BUILD=${NB_BUILD:-build-dev} NB_LANES_TIMEOUT=${NB_LANES_TIMEOUT:-90}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$R/gpu.txt"
grep -E 'MemTotal|MemAvailable' /proc/meminfo | tee -a "$R/gpu.txt"; nproc | tee -a "$R/gpu.txt"
git log --oneline -1 2>/dev/null | tee -a "$R/gpu.txt"
built=0
build() {
    [ $built = 1 ] && return 0
    make -j"$(nproc)" BUILD="$NB_BUILD" $NB_MAKE_FLAGS > "$R/build.log" 2>&1 || { tail -20 "$R/build.log"; return 1; }
    built=1
}
stage() { # NAME: the commands of one stage (output to $R/NAME.log)
    case $1 in
        comm_gpu) build && { M="mpirun -np 2 --oversubscribe --allow-run-as-root"; T=$NB_BUILD/tests/test_comm
            # the expected failures go to a log first: under pipefail a failing mpirun piped into grep fails the chain
            $T --gpu nccl && $T --gpu host && $M $T --gpu host && $M $T --gpu auto && $M $T --gpu host --bench 100 \
                && $M $T --gpu host --sm-free && $T --gpu nccl --sm-free && $T --gpu nccl --sm-free --staged \
                && { $M $T --gpu host --sm-free --fail counts --fail-rank 1 --timeout 30 >"$R/smfree_counts.log" 2>&1; grep "counts disagree" "$R/smfree_counts.log"; } \
                && { $M $T --gpu nccl >"$R/nccl_shared.log" 2>&1; grep "share a GPU" "$R/nccl_shared.log"; } && NB_BUILD=$NB_BUILD bash tests/comm_test.sh; } ;;
        builds) { mkdir -p /tmp/before && tar xzf .before/src.tgz -C /tmp/before \
                    && make -C /tmp/before -j"$(nproc)" BUILD=build $NB_MAKE_FLAGS build/nobubble > "$R/build-before.log" 2>&1; } &
                build; b=$?; wait $! || { echo "before build failed"; tail -5 "$R/build-before.log"; }; return $b ;;
        ab) build && OUT=$R/ab bash bench/engine_ab.sh /tmp/before/build/nobubble "$NB_BUILD/nobubble" ${AB_ROWS:-} ;;
        parity_gpu) build && bash tests/parity_across_commits.sh --device cuda --base-bin /tmp/before/build/nobubble \
                --new-bin "$NB_BUILD/nobubble" --keep "$R/parity" --prune --together ${PARITY_ARGS:-} ;;
        gpu_all) NB_SKIP_GPT2_REF=${NB_SKIP_GPT2_REF:-1} OUT=$R/gpu_all bash tests/gpu_all.sh ;;
        gpu_train) build && bash tests/gpu_train_test.sh ;;
        gpu_quick) build && { r=0; for t in test_ops test_kprof; do a=(); [ $t = test_ops ] && a=(--backend cuda)
                "$NB_BUILD/tests/$t" "${a[@]}" > "$R/$t.log" 2>&1 || { r=1; tail -20 "$R/$t.log"; }
                grep -E "^(ok|FAIL|skip|SKIP|test_ops:)" "$R/$t.log" | tail -3; done; bash tests/gpu_train_test.sh || r=1; return $r; } ;;
        quality) build && { $NB_BUILD/nobubble train --model gpt2 --device cuda --graphs --batch 16 --steps 600 --lr 6e-4 --warmup 200 \
                --eval-every 100 --eval-batches 0 --no-ckpt --no-progress --out "$R/quality" > "$R/quality.log" 2>&1 || { tail -5 "$R/quality.log"; return 1; }
            grep -h "^attention\|^throughput" "$R/quality.log"
            python3 -c 'import json, sys
v = [(r["step"], r["val_loss"]) for r in map(json.loads, open(sys.argv[1] + "/metrics.jsonl")) if "val_loss" in r]
print("validation loss by step:", " ".join("%d:%.4f" % x for x in v), "best %.4f" % min(x[1] for x in v))' "$R/quality"; } ;;
        gpu_seqctr) build && bash tests/gpu_seqctr_test.sh ;;
        gpu_ranks) build && bash tests/gpu_ranks_test.sh ;;
        pipe) build && OUT=$R/pipe bash bench/pipe_bench.sh --no-build ${PIPE_ARGS:---steps 150 --graphs} ;;
        ranks_gpu) build && OUT=$R/ranks bash bench/ranks_bench.sh --device cuda --comm host ${RANKS_ARGS:---model gpt2 --batch 32 --seq 1024 --steps 12 --warmup 4} ;;
        ctr_ops_bench) build && "$NB_BUILD/tests/test_ops" --mode perf --op ctr_model ;;
        k19) build && { "$NB_BUILD/tests/test_ops" --backend cuda --op "$CTR_CUDA_OPS" > "$R/k19-test.log" 2>&1; t=$?; grep -E "^(PASS|FAIL|SKIP)|FAIL|^test_ops:" "$R/k19-test.log"; echo "test_ops (ctr cuda rows) rc=$t (NB_CTR_KERNELS=old falls back to the previous kernels)"; "$NB_BUILD/tests/test_ops" --mode perf --op ctr_model; b=$?; [ $t = 0 ] && [ $b = 0 ]; } ;;
        seqctr) build && OUT=$R/seqctr bash bench/seqctr_bench.sh --no-build --steps "${SC_STEPS:-100}" --batch "${SC_BATCH:-4096,1024}" --budget "${SC_BUDGET:-280}" ;;
        dlrm) build && OUT=$R/dlrm bash bench/dlrm_bench.sh --no-build --budget "${DLRM_BUDGET:-400}" ${DLRM_ARGS:-} ;;
        gpu_bench) build && OUT=$R/gpu_bench bash bench/gpu_bench.sh --no-build ${GPU_BENCH_ARGS:---no-llama --budget 270} ;;
        lists) build && OUT=$R/lists bash bench/lists_bench.sh --no-build ${LISTS_ARGS:---steps 60 --batch 4096,1024 --erase} ;;
        balance) build && OUT=$R/balance bash bench/balance_bench.sh --no-build ${BAL_ARGS:-} ;;
        balance_e2e) build && OUT=$R/balance bash bench/balance_bench.sh --no-build --e2e ${BAL_E2E_ARGS:---batch 1024 --caps 2048} ;;
        balance_test) build && bash tests/balance_test.sh "$NB_BUILD" ;;
        smfree) build && OUT=$R bash bench/smfree_bench.sh --no-build ;;
        adamw_bench) build && "$NB_BUILD/tests/test_adamw_host" --bench ;;
        host_info) lscpu; for n in /sys/devices/system/node/node*; do echo "$n: cpus $(cat $n/cpulist) $(grep MemTotal $n/meminfo)"; done; command -v numactl && numactl -H ;;
        stream1b) build && KEEP=${KEEP1:-} OUT=$R/stream bash bench/stream_bench.sh --no-build --models llama-1b --batch "${B1:-16}" --steps 10 ${STREAM1_ARGS:---parts --anchor --budget 250} ;;
        stream8b) build && KEEP=${KEEP8:-} OUT=$R/stream8 bash bench/stream_bench.sh --no-build --models llama-8b --batch "${B8:-16}" --steps "${S8:-6}" ${STREAM8_ARGS:-} ;;
        stream14b) build && KEEP=${KEEP14:-} OUT=$R/stream14 bash bench/stream_bench.sh --no-build --models llama-14b --batch "${B14:-8}" --steps "${S14:-4}" --stream-only ;;
        attn_cudnn) build && { r=0; "$NB_BUILD/tests/test_ops" --mode all --backend cuda --op 'attention_cudnn*' || r=1
            OUT=$R/attn_ab bash bench/attn_ab.sh --no-build ${ATTN_AB_ARGS:-} || r=1; return $r; } ;;
        attn_quality) build && { for m in fa auto; do $NB_BUILD/nobubble train --attn $m --model gpt2 --device cuda --graphs --batch 16 --steps 600 --lr 6e-4 --warmup 200 \
                --eval-every 100 --eval-batches 0 --no-ckpt --no-progress --out "$R/quality-$m" > "$R/quality-$m.log" 2>&1 || { tail -5 "$R/quality-$m.log"; return 1; }
                grep -h "^attention\|^throughput" "$R/quality-$m.log"; done
            python3 -c 'import json, sys
for m in sys.argv[1:]:
    v = [(r["step"], r["val_loss"]) for r in map(json.loads, open(m + "/metrics.jsonl")) if "val_loss" in r]
    print(m, "validation loss by step:", " ".join("%d:%.4f" % x for x in v), "best %.4f" % min(x[1] for x in v))' "$R/quality-fa" "$R/quality-auto"; } ;;
        sc_profile) build && { P="$NB_BUILD/nobubble train --model seqctr --device cuda --emb-dim 64 --batch 2048 --steps ${SCP_STEPS:-14} --eval-every 0 --eval-samples 1024 --no-ckpt --no-progress --emulate-ranks ${SCP_RANKS:-4} --balance ${SCP_BALANCE:-none} --data synth:cap=100000,items=1000000,max_len=${SCP_CAP:-16384},hist_alpha=1.2,hist_scale=64"
            if command -v nsys >/dev/null; then nsys profile -o "$R/sc_profile" --force-overwrite true -t cuda $P --out "$R/sc_run" > "$R/sc_run.log" 2>&1; tail -3 "$R/sc_run.log"
                nsys stats --report cuda_gpu_kern_sum --format csv "$R/sc_profile.nsys-rep" > "$R/sc_kern.csv" 2>/dev/null; head -25 "$R/sc_kern.csv" | cut -c1-220; rm -f "$R"/sc_profile.nsys-rep "$R"/sc_profile.sqlite
            else echo "no nsys: the run alone"; $P --out "$R/sc_run" > "$R/sc_run.log" 2>&1; tail -5 "$R/sc_run.log"; fi; } ;;
        ktable) build && OUT=$R/ktable bash bench/kernel_table.sh --no-build ${KTABLE_ARGS:-} ;;
        clocks) nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,clocks.mem,power.draw,power.limit,temperature.gpu,clocks_throttle_reasons.active --format=csv ;;
        erase_tf) build && OUT=$R/erase-tf bash bench/erase_transformer.sh --no-build --steps 40 ;;
        erase_ctr) build && OUT=$R/erase bash bench/erase_seqctr.sh --no-build --steps 40 --batch 1024,4096 --torch ;;
        erase_quality) build && OUT=$R/erase-q bash bench/erase_seqctr.sh --no-build --steps 20 --batch 4096 --quality 300 ;;
        finetune) build && OUT=$R/finetune bash bench/finetune_bench.sh --no-build ${FT_ARGS:---shape llama3.1-8b --layers 0 --steps 8 --anchor-steps 2 --no-fp32-retry --budget 560} ;;
        capacity) build && bash tests/gpu_capacity.sh ${CAP_ARGS:---only full14b} ;;
        lora) build && OUT=$R/lora bash bench/lora_bench.sh --no-build ${LORA_ARGS:---only a --budget 560} ;;
        k18) build && { T=$NB_BUILD/tests; r=0; k18_part() { echo "--- k18: $*"; "$@" || { echo "--- k18 FAILED (rc $?): $*"; r=1; }; }
            k18_part $T/test_ops
            mkdir -p tests/torch/ref; k18_part python3 tests/torch/ref_check.py gen --preset gpt2-tiny --out tests/torch/ref/gpt2_tiny.safetensors
            k18_part python3 tests/torch/ref_check.py gen --preset llama-tiny --out tests/torch/ref/llama_tiny.safetensors
            k18_part $T/test_torch_ref; k18_part bash tests/gpu_train_test.sh; return $r; } ;;
        *) echo "device_session.sh: unknown stage '$1'" >&2; return 2 ;;
    esac
}
for arg in "$@"; do
    name=${arg%%:*} limit=${arg#*:}; [ "$limit" = "$arg" ] && limit=600
    left=$((deadline - ($(date +%s) - start)))
    [ $left -lt 20 ] && { echo "=== $name: not run (${left} s left)"; continue; }
    [ "$limit" -gt $left ] && limit=$left
    s=$(date +%s)
    timeout --kill-after 10 "$limit" bash -c "$(declare -f build stage); built=$built; R=$R; stage $name" > "$R/$name.log" 2>&1
    rc=$?
    # a stage cut off by its limit can leave children behind (mpirun's ranks, a trainer) that keep
    # the GPU busy and slow every later stage's numbers: end them before the next stage starts
    if [ $rc = 124 ] || [ $rc = 137 ]; then
        pkill -9 -f "$NB_BUILD/" 2>/dev/null; pkill -9 -x mpirun 2>/dev/null; pkill -9 -x orterun 2>/dev/null
        echo "=== $name: cut off after $limit s; its leftover processes were killed"
    fi
    [ -x "$NB_BUILD/nobubble" ] && built=1
    echo "=== $name: rc=$rc ($(( $(date +%s) - s )) s of $limit)"
    tail -n "${TAILN:-25}" "$R/$name.log"
done
find "$R" -name '*.bin' -size +1M -delete 2>/dev/null
tar czf "${OUT:-gpu-out}/res.tgz" -C "$(dirname "$R")" res && echo "packed $(du -h "${OUT:-gpu-out}/res.tgz" | cut -f1)"
