#!/usr/bin/env bash
# ERASE on the transformers (issue 5), nobubble's own configurations side by side on one GPU:
#   baseline (no detachment, plain), detached + plain, erase blocking, erase async, erase + graphs
# for the proxy (4 layers, 256 wide, T=256, B=8, cut after layers 1 and 2: 3 segments, 2 side
# lanes + the main lane) and gpt2 (cut after layers 4 and 8), on the same tokens.
#   bash bench/erase_transformer.sh [--steps S] [--no-build] [--models proxy,gpt2]
# Prints a table (p90 / median tokens/s from the trainer's summary line, gain vs the baseline,
# mean overlap_pct) and keeps each run's timeline.svg in $OUT (default bench/out/erase-tf).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
steps=60 build=1 models=proxy,gpt2
while [ $# -gt 0 ]; do
    case "$1" in
        --steps) steps=$2; shift ;;
        --models) models=$2; shift ;;
        --no-build) build=0 ;;
        -h|--help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "erase_transformer.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
OUT=${OUT:-bench/out/erase-tf}; mkdir -p "$OUT"
NB_BUILD=${NB_BUILD:-build}; NB=$NB_BUILD/nobubble
DEV=${DEVICE:-cuda}
[ $build = 1 ] && { source scripts/device_deps.sh use >/dev/null; make -j"$(nproc)" BUILD="$NB_BUILD" ${NB_MAKE_FLAGS:-} > "$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }; }
[ -f data/sotu/train.bin ] || { echo "erase_transformer.sh: run 'bash scripts/fetch_data.sh' first" >&2; exit 1; }
table="$OUT/table.md"
printf '| model | configuration | p90 tokens/s | median tokens/s | gain vs baseline (p90) | mean overlap %% |\n|---|---|---|---|---|---|\n' > "$table"
for model in ${models//,/ }; do
    case $model in
        proxy) M=(--model gpt2-proxy --batch 8 --seq 256); cuts=1,2 ;;
        gpt2) M=(--model gpt2 --batch 16 --seq 1024); cuts=4,8 ;;
        *) echo "erase_transformer.sh: unknown model '$model'" >&2; exit 2 ;;
    esac
    base=""
    while IFS='|' read -r name flags; do
        flags=${flags//CUTS/$cuts}
        log="$OUT/$model-$name.log"
        # shellcheck disable=SC2086
        "$NB" train "${M[@]}" --device "$DEV" --steps "$steps" --val-data none --eval-every 0 --no-ckpt --no-progress \
            $flags --out "$OUT/$model-$name" > "$log" 2>&1 || { echo "| $model | $name | failed: $(tail -n 1 "$log") | | | |" >> "$table"; continue; }
        line=$(grep '^throughput' "$log")
        p90=$(echo "$line" | awk '{print $3}'); med=$(echo "$line" | awk '{for (i=1;i<=NF;i++) if ($i=="median") print $(i+1)}')
        ov=$(grep -o '"overlap_pct":[0-9.e+-]*' "$OUT/$model-$name/metrics.jsonl" | tail -n +11 | cut -d: -f2 |
             awk '{s+=$1; n++} END {if (n) printf "%.1f", s/n; else print "-"}')
        [ -z "$base" ] && base=$p90
        gain=$(awk -v a="$p90" -v b="$base" 'BEGIN {printf "%+.1f%%", 100 * (a / b - 1)}')
        echo "| $model | $name | $p90 | $med | $gain | $ov |" >> "$table"
        cp "$OUT/$model-$name/timeline.svg" "$OUT/timeline-$model-$name.svg" 2>/dev/null
    done <<'CONFIGS'
baseline|--schedule plain --graphs
detached-plain|--detach CUTS --schedule plain --graphs
erase-blocking|--detach CUTS --schedule erase --side-lanes 2
erase-async|--detach CUTS --schedule erase --side-lanes 2 --erase-dispatch async
erase-graphs|--detach CUTS --schedule erase --side-lanes 2 --graphs
CONFIGS
done
echo; cat "$table"
