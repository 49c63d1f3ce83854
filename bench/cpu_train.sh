#!/usr/bin/env bash
# CPU training throughput of the presets a CPU user runs, on the default corpus.
#   bash bench/cpu_train.sh [STEPS]        (default 40 steps per preset; run on an idle machine)
# Prints a table: preset, tokens per step, median tokens/s over the steps after the first 5,
# GFLOP/s (model FLOPs: 6 N + attention, the formula in src/model/transformer.c).
# No anchor runs here yet (PyPI is unreachable; Debian's python3-torch 1.13 CPU is the candidate),
# so the CPU numbers are absolute; the GPU benchmarks compare with PyTorch.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
STEPS=${1:-40}
NB_BUILD=${NB_BUILD:-build}
make -s -j"$(nproc)" BUILD="$NB_BUILD" "$NB_BUILD/nobubble" >/dev/null
[ -f data/sotu/train.bin ] || bash scripts/fetch_data.sh >/dev/null
NB=$NB_BUILD/nobubble
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
printf '%-12s %8s %8s %12s %10s %9s\n' preset batch seq tokens/step tokens/s GFLOP/s
for spec in "gpt2-mini 8" "gpt2-tiny 8" "llama-tiny 8" "gpt2-proxy 8"; do
    set -- $spec
    $NB train --model "$1" --batch "$2" --steps "$STEPS" --val-data none --out "$TMP/$1" --no-progress --quiet \
        >/dev/null 2>"$TMP/$1.err" || { cat "$TMP/$1.err"; exit 1; }
    seq=$(grep -o '"seq": [0-9]*' "$TMP/$1/ckpt/state.json" | head -1 | grep -o '[0-9]*$')
    mflop=$($NB train --model "$1" --steps 1 --val-data none --help >/dev/null 2>&1; \
            $NB train --model "$1" --batch 1 --steps 1 --val-data none --no-progress 2>&1 | grep -o '[0-9.]* MFLOP per token' | cut -d' ' -f1)
    tps=$(tail -n +6 "$TMP/$1/metrics.jsonl" | grep -o '"tokens_per_s":[0-9.]*' | cut -d: -f2 | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
    awk -v p="$1" -v b="$2" -v t="$seq" -v tps="$tps" -v mf="$mflop" \
        'BEGIN {printf "%-12s %8d %8d %12d %10.0f %9.1f\n", p, b, t, b*t, tps, tps*mf/1e3}'
done
echo "host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(date -u +%Y-%m-%d), commit $(git rev-parse --short HEAD 2>/dev/null || echo none)"
