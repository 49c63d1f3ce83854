#!/usr/bin/env bash
# ERASE on seqctr (issue 5), nobubble's own configurations side by side on one GPU, one call:
#   baseline (no detachment, plain), detached + plain, erase blocking, erase async
# at each batch size, then (with --quality) held-out NE of undetached vs erase after the same
# steps on synthetic data and on MovieLens (when data/movielens exists).
#   bash bench/erase_seqctr.sh [--steps S] [--batch 1024,4096] [--quality STEPS] [--no-build]
# Synthetic Criteo-scale data: 26 tables capped at 1M rows, E 64, history max_len 256, 6 blocks
# (all detached), 4 side lanes. p90 samples/s = B / 90th-percentile step time after 10 warm-up
# steps (the trainer's "throughput" line). Writes $OUT (default bench/out/erase): one log and
# timeline.svg per run, table.md; prints the table.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
steps=60 batches=1024,4096 quality=0 build=1
while [ $# -gt 0 ]; do
    case "$1" in
        --steps) steps=$2; shift ;;
        --batch) batches=$2; shift ;;
        --quality) quality=$2; shift ;;
        --no-build) build=0 ;;
        -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "erase_seqctr.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
OUT=${OUT:-bench/out/erase}; mkdir -p "$OUT"
NB_BUILD=${NB_BUILD:-build}; NB=$NB_BUILD/nobubble
[ $build = 1 ] && { make -j"$(nproc)" BUILD="$NB_BUILD" > "$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }; }
DEV=${DEVICE:-cuda}
BASE=(--model seqctr --device "$DEV" --data synth:cap=1000000,max_len=256 --emb-dim 64 --table-cap 1000000
      --eval-samples 1024 --no-ckpt --quiet --log-every 0)
get() { tr ' ' '\n' | grep "^$1=" | cut -d= -f2; }
table="$OUT/table.md"
printf '| batch | configuration | p90 samples/s | median samples/s | gain vs baseline (p90) | overlap %% |\n|---|---|---|---|---|---|\n' > "$table"
for B in ${batches//,/ }; do
    base=""
    while IFS='|' read -r name flags; do
        log="$OUT/b$B-$name.log"
        # shellcheck disable=SC2086
        "$NB" train "${BASE[@]}" --batch "$B" --steps "$steps" $flags --out "$OUT/b$B-$name" > "$log" 2>&1 \
            || { echo "| $B | $name | failed: $(tail -n 1 "$log") | | | |" >> "$table"; continue; }
        p90=$(grep '^throughput' "$log" | get p90_samples_per_s); med=$(grep '^throughput' "$log" | get median_samples_per_s)
        ov=$(grep -o '^overlap: [0-9.]*' "$log" | cut -d' ' -f2); ov=${ov:--}
        [ -z "$base" ] && base=$p90
        gain=$(awk -v a="$p90" -v b="$base" 'BEGIN {printf "%+.1f%%", 100 * (a / b - 1)}')
        echo "| $B | $name | $p90 | $med | $gain | $ov |" >> "$table"
        cp "$OUT/b$B-$name/timeline.svg" "$OUT/timeline-b$B-$name.svg" 2>/dev/null
        grep -E '^(throughput|breakdown|flops|overlap)' "$log" | sed "s/^/  [$B $name] /"
    done <<'CONFIGS'
baseline|--schedule plain
detached-plain|--detach all --schedule plain
erase-blocking|--detach all --schedule erase --side-lanes 4
erase-async|--detach all --schedule erase --side-lanes 4 --erase-dispatch async
CONFIGS
done
if [ "$quality" -gt 0 ]; then
    printf '\n| data | steps | NE undetached | NE erase (detach all) | gap |\n|---|---|---|---|---|\n' >> "$table"
    for src in synth movielens; do
        D=(--data synth:cap=1000000,max_len=256 --batch 4096 --eval-samples 65536)
        [ $src = movielens ] && { [ -f data/movielens/clicks_train.tsv ] || continue; D=(--data movielens --batch 1024 --max-len 64 --table-cap 200000); }
        Q=(--model seqctr --device "$DEV" --emb-dim 64 --steps "$quality" --no-ckpt --quiet "${D[@]}")
        a=$("$NB" train "${Q[@]}" --out "$OUT/q-$src-base" | grep '^eval' | tail -n 1 | get ne)
        b=$("$NB" train "${Q[@]}" --detach all --schedule erase --out "$OUT/q-$src-erase" | grep '^eval' | tail -n 1 | get ne)
        gap=$(awk -v a="$a" -v b="$b" 'BEGIN {printf "%+.2f%%", 100 * (b / a - 1)}')
        echo "| $src | $quality | $a | $b | $gap |" >> "$table"
    done
fi
echo; cat "$table"
