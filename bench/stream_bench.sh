#!/usr/bin/env bash
# Resident (plain) vs --schedule stream on one GPU (issue 6), same model, batch and tokens:
#   bash bench/stream_bench.sh [--models llama-1b,llama-8b] [--batch B] [--seq T] [--steps S] [--no-build]
# tokens/s from the trainer's p90/median summary line; TFLOP/s with model FLOPs = the trainer's
# "MFLOP per token" (6 N + attention) x tokens/s. Also writes one step's trace and timeline.svg of
# each stream run to $OUT (default bench/out/stream) and checks the overlap in the trace
# (tests/trace_overlap.py). Stream runs use --ckpt-interval $CKPT (default 1). The FSDP2
# CPU-offload anchor is not in this script yet.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
models=llama-1b,llama-8b batch=8 seq=2048 steps=12 build=1
while [ $# -gt 0 ]; do
    case "$1" in
        --models) models=$2; shift ;;
        --batch) batch=$2; shift ;;
        --seq) seq=$2; shift ;;
        --steps) steps=$2; shift ;;
        --no-build) build=0 ;;
        -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "stream_bench.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
OUT=${OUT:-bench/out/stream}; mkdir -p "$OUT"
NB_BUILD=${NB_BUILD:-build}; NB=$NB_BUILD/nobubble
[ $build = 1 ] && { source scripts/device_deps.sh use >/dev/null; make -j"$(nproc)" BUILD="$NB_BUILD" ${NB_MAKE_FLAGS:-} > "$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }; }
[ -f data/sotu/train.bin ] || { echo "stream_bench.sh: run 'bash scripts/fetch_data.sh' first" >&2; exit 1; }
table="$OUT/table.md"
printf '| model | B x T | schedule | median tokens/s | p90 tokens/s | model TFLOP/s | stream / resident |\n|---|---|---|---|---|---|---|\n' > "$table"
for model in ${models//,/ }; do
    res=""
    for sched in plain stream; do
        log="$OUT/$model-$sched.log"
        extra=(); [ $sched = stream ] && extra=(--trace "$OUT/$model-stream.json")
        "$NB" train --model "$model" --device "${DEVICE:-cuda}" --batch "$batch" --seq "$seq" --steps "$steps" --schedule "$sched" $( [ $sched = stream ] && echo --ckpt-interval "${CKPT:-1}" ) \
            --val-data none --eval-every 0 --no-ckpt --no-progress --out "$OUT/$model-$sched" "${extra[@]}" > "$log" 2>&1 \
            || { echo "| $model | ${batch} x ${seq} | $sched | failed: $(tail -n 1 "$log") | | | |" >> "$table"; continue; }
        line=$(grep '^throughput' "$log"); mf=$(grep -o '[0-9.]* MFLOP per token' "$log" | cut -d' ' -f1)
        p90=$(echo "$line" | awk '{print $3}'); med=$(echo "$line" | awk '{for (i=1;i<=NF;i++) if ($i=="median") print $(i+1)}')
        tf=$(awk -v t="$med" -v f="$mf" 'BEGIN {printf "%.0f", t * f / 1e6}')
        [ $sched = plain ] && res=$med
        ratio=$( [ -n "$res" ] && awk -v a="$med" -v b="$res" 'BEGIN {printf "%.2f", a / b}' || echo -)
        echo "| $model | ${batch} x ${seq} | $sched | $med | $p90 | $tf | $ratio |" >> "$table"
        if [ $sched = stream ]; then
            cp "$OUT/$model-stream/timeline.svg" "$OUT/timeline-$model-stream.svg" 2>/dev/null
            python3 tests/trace_overlap.py "$OUT/$model-stream.json" $((steps - 1)) | sed "s/^/  [$model] /"
        fi
    done
done
echo; cat "$table"
