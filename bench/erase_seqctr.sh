#!/usr/bin/env bash
# ERASE on seqctr (issue 5), nobubble's own configurations side by side on one GPU, one call:
#   baseline (no detachment, plain), detached + plain, erase blocking, erase async, and with --graphs
#   (the step captured once and replayed): baseline and erase blocking (async cannot be captured)
# at each batch size, then (with --quality) held-out NE of undetached vs erase after the same
# steps on synthetic data and on MovieLens (when data/movielens exists).
#   bash bench/erase_seqctr.sh [--steps S] [--batch 1024,4096] [--quality STEPS] [--no-build] [--torch]
# Synthetic Criteo-scale data: 26 tables capped at 1M rows, E 64, history max_len 256, 6 blocks
# (all detached), 4 side lanes. p90 samples/s = B / 90th-percentile step time after 10 warm-up
# steps (the trainer's "throughput" line). Writes $OUT (default bench/out/erase): one log and
# timeline.svg per run, table.md; prints the table. --torch (last stage, off by default; needs
# $PYTHON [python3] with CUDA torch): the same four configurations in PyTorch (bench/erase_torch.py,
# side streams) on a synth-dump of the same samples, rows "torch <config>" and the ratio of
# nobubble's best erase p90 to torch's. Env: SPEC, TABLE_CAP, EMB (defaults as above), DEVICE, DTYPE.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
steps=60 batches=1024,4096 quality=0 build=1 torch=0
while [ $# -gt 0 ]; do
    case "$1" in
        --steps) steps=$2; shift ;;
        --batch) batches=$2; shift ;;
        --quality) quality=$2; shift ;;
        --no-build) build=0 ;;
        --torch) torch=1 ;;
        -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "erase_seqctr.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
OUT=${OUT:-bench/out/erase}; mkdir -p "$OUT"
NB_BUILD=${NB_BUILD:-build}; NB=$NB_BUILD/nobubble
[ $build = 1 ] && { source scripts/device_deps.sh use >/dev/null; make -j"$(nproc)" BUILD="$NB_BUILD" ${NB_MAKE_FLAGS:-} > "$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }; }
DEV=${DEVICE:-cuda}
SPEC=${SPEC:-synth:cap=1000000,max_len=256} TABLE_CAP=${TABLE_CAP:-1000000} EMB=${EMB:-64}
BASE=(--model seqctr --device "$DEV" --data "$SPEC" --emb-dim "$EMB" --table-cap "$TABLE_CAP"
      --eval-samples 1024 --no-ckpt --quiet --log-every 0)
get() { tr ' ' '\n' | grep "^$1=" | cut -d= -f2; }
table="$OUT/table.md" qtable="$OUT/quality.md" nb_best=""
rm -f "$qtable"
printf '| batch | configuration | p90 samples/s | median samples/s | gain vs baseline (p90) | overlap %% |\n|---|---|---|---|---|---|\n' > "$table"
for B in ${batches//,/ }; do
    base="" bp90="" bname=""
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
        case $name in erase-*)   # nobubble's best erase p90 at this batch, for the torch ratio
            awk -v a="$p90" -v b="${bp90:-0}" 'BEGIN {exit !(a > b)}' && bp90=$p90 bname=$name ;;
        esac
        cp "$OUT/b$B-$name/timeline.svg" "$OUT/timeline-b$B-$name.svg" 2>/dev/null
        grep -E '^(throughput|breakdown|flops|overlap)' "$log" | sed "s/^/  [$B $name] /"
    done <<'CONFIGS'
baseline|--schedule plain
detached-plain|--detach all --schedule plain
erase-blocking|--detach all --schedule erase --side-lanes 4
erase-async|--detach all --schedule erase --side-lanes 4 --erase-dispatch async
baseline-graphs|--schedule plain --graphs
erase-blocking-graphs|--detach all --schedule erase --side-lanes 4 --graphs
CONFIGS
    [ -n "$bp90" ] && nb_best="${nb_best:+$nb_best,}$B=$bp90:$bname"
done
if [ "$quality" -gt 0 ]; then
    printf '\n| data | steps | NE undetached | NE erase (detach all) | gap |\n|---|---|---|---|---|\n' >> "$qtable"
    for src in synth movielens; do
        D=(--data synth:cap=1000000,max_len=256 --batch 4096 --eval-samples 65536)
        [ $src = movielens ] && { [ -f data/movielens/clicks_train.tsv ] || continue; D=(--data movielens --batch 1024 --max-len 64 --table-cap 200000); }
        Q=(--model seqctr --device "$DEV" --emb-dim 64 --steps "$quality" --no-ckpt --quiet "${D[@]}")
        a=$("$NB" train "${Q[@]}" --out "$OUT/q-$src-base" | grep '^eval' | tail -n 1 | get ne)
        b=$("$NB" train "${Q[@]}" --detach all --schedule erase --out "$OUT/q-$src-erase" | grep '^eval' | tail -n 1 | get ne)
        gap=$(awk -v a="$a" -v b="$b" 'BEGIN {printf "%+.2f%%", 100 * (b / a - 1)}')
        echo "| $src | $quality | $a | $b | $gap |" >> "$qtable"
    done
fi
if [ $torch = 1 ]; then
    # PyTorch's ERASE (bench/erase_torch.py) on the samples the runs above trained on: step k of
    # batch B = samples k*B ..; the same warm-up rule as the trainer's throughput line.
    PY=${PYTHON:-python3} DTYPE=${DTYPE:-$([ "$DEV" = cuda ] && echo bf16 || echo fp32)}
    warm=$(( steps >= 20 ? 10 : steps / 2 )); warm=$(( warm > 0 ? warm : 1 ))
    tsteps=$(( steps - warm > 0 ? steps - warm : 1 ))
    probe='import torch; assert torch.cuda.is_available(), "no CUDA device visible to torch"'
    [ "$DEV" = cuda ] || probe='import torch'
    maxB=0; for B in ${batches//,/ }; do [ "$B" -gt "$maxB" ] && maxB=$B; done
    if ! why=$("$PY" -c "$probe" 2>&1); then
        echo "torch stage skipped: $PY: $(echo "$why" | tail -n 1)"
        echo "| - | torch | skipped: $PY has no usable torch ($(echo "$why" | tail -n 1 | tr '|' '/')) | | | |" >> "$table"
    else
        TMP=$(mktemp -d) || exit 1
        trap 'rm -rf "$TMP"' EXIT
        rm -f "$OUT/torch.jsonl"
        echo "== torch: synth-dump of $(( maxB * (warm + tsteps) )) samples, then bench/erase_torch.py"
        if ! "$NB" synth-dump --data "$SPEC" --samples $(( maxB * (warm + tsteps) )) --table-cap "$TABLE_CAP" \
                --out "$TMP/synth.bin" > "$OUT/dump.log" 2>&1; then
            echo "| - | torch | synth-dump failed: $(tail -n 1 "$OUT/dump.log" | tr '|' '/') | | | |" >> "$table"
        else
            "$PY" bench/erase_torch.py --check > "$OUT/torch-check.log" 2>&1 \
                || echo "erase_torch.py --check FAILED (see $OUT/torch-check.log): the torch numbers are suspect"
            tail -n 1 "$OUT/torch-check.log"
            "$PY" bench/erase_torch.py --data "$TMP/synth.bin" --batch "$batches" --warmup "$warm" --steps "$tsteps" \
                --emb-dim "$EMB" --side-streams 4 --device "$DEV" --dtype "$DTYPE" --json "$OUT/torch.jsonl" \
                > "$OUT/torch.log" 2>&1 || echo "erase_torch.py exited non-zero (see $OUT/torch.log)"
            grep -v '^{' "$OUT/torch.log" | sed 's/^/  [torch] /'
            if "$PY" bench/erase_torch.py --table "$OUT/torch.jsonl" --nb-best "$nb_best" > "$OUT/torch-rows.md" 2>&1; then
                cat "$OUT/torch-rows.md" >> "$table"
            else
                echo "| - | torch | no rows: $(tail -n 1 "$OUT/torch-rows.md" | tr '|' '/') | | | |" >> "$table"
            fi
        fi
    fi
fi
[ -f "$qtable" ] && cat "$qtable" >> "$table"
echo; cat "$table"
