#!/usr/bin/env bash
# What one training step is made of on the GPU: for each MODEL:B:T, a short `nobubble train
# --graphs --kernel-table N` run on random tokens (the same shard recipe as gpu_bench.sh) and its
# table: every kernel, memset and copy of the steps after warm-up (CUPTI), the longest first, the
# launches per step and the device's idle time between them. Not a timed benchmark: gpu_bench.sh's
# runs are the step times; this says where they go.
#   bash bench/kernel_table.sh [--no-build] [--rows N] [--steps S] [--flags "..."] [MODEL:B:T ...]
#     default rows gpt2-proxy:8:256 gpt2:32:1024 llama-1b:16:2048; --rows 30; --steps 16 (llama 10)
#     seqctr:B:L: the recommendation model at batch B on seqctr_bench.sh's synthetic data (tables
#     of 1M rows, histories up to L)
#     --flags: more `nobubble train` flags for every row (e.g. "--schedule erase --detach 4,8")
# Writes $OUT/kernels-MODEL-bB.txt (default OUT=bench/out) and prints each table.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/out}
NB_BUILD=${NB_BUILD:-build-dev}
PY=${PYTHON:-python3}
build=1 rows=30 steps=16 flags='' specs=()
while [ $# -gt 0 ]; do
    case "$1" in
        --no-build) build=0 ;;
        --rows) rows=$2; shift ;;
        --steps) steps=$2; shift ;;
        --flags) flags=$2; shift ;;
        -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *:*:*) specs+=("$1") ;;
        *) echo "kernel_table.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
[ ${#specs[@]} -gt 0 ] || specs=(gpt2-proxy:8:256 gpt2:32:1024 llama-1b:16:2048)
mkdir -p "$OUT" || exit 1
if [ $build = 1 ]; then
    make -j"$(nproc)" BUILD="$NB_BUILD" ${NB_MAKE_FLAGS:-} "$NB_BUILD/nobubble" >"$OUT/kernel_table-build.log" 2>&1 \
        || { echo "kernel_table.sh: build failed, see $OUT/kernel_table-build.log"; tail -15 "$OUT/kernel_table-build.log"; exit 1; }
fi
TMP=$(mktemp -d) || exit 1
trap 'rm -rf "$TMP"' EXIT
SHARD="$TMP/tokens.bin"
"$PY" bench/torch_anchor.py --make-shard "$SHARD" --tokens 2000000 --seed 1337 || exit 1
status=0
for spec in "${specs[@]}"; do
    IFS=: read -r model b t <<<"$spec"
    s=$steps
    case $model in llama*) [ "$s" -gt 10 ] && s=10 ;; esac
    log="$OUT/kernels-$model-b$b.txt"
    echo "== $model B=$b T=$t, $s steps"
    if [ "$model" = seqctr ]; then
        shape=(--data "synth:cap=1000000,max_len=$t" --emb-dim 64 --max-len "$t" --eval-samples 1024)
    else
        shape=(--seq "$t" --data "$SHARD" --val-data none)
    fi
    # shellcheck disable=SC2086
    if timeout 300 "$NB_BUILD/nobubble" train --model "$model" --batch "$b" --steps "$s" --device cuda "${shape[@]}" \
            --no-ckpt --graphs --no-progress --kernel-table "$rows" $flags >"$log" 2>&1; then
        sed -n '/^throughput/p; /^kernels/,$p' "$log" | grep -v '^graphs\|^gpu memory\|^run directory'
    else
        echo "failed; last lines of $log:"; tail -5 "$log"; status=1
    fi
done
exit $status
