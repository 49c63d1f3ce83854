#!/usr/bin/env bash
# Who builds seqctr's index lists (issue 19): the same training run with `--index-lists host` (the
# host's lists and radix sort, copied up) and `--index-lists device` (the host stages the raw ids,
# the GPU builds the lists and deduplicates), one after the other in one call, in each of the
# given schedules; prints p90 / median samples/s, the p90 step over the median, the host's time
# per step and the upload phase's device time.
#   bash bench/lists_bench.sh [--steps S] [--batch B[,B...]] [--no-build] [--flags "..."]
#     --steps S      timed steps per run, after 10 warm-up steps [60]
#     --batch LIST   comma list of batch sizes [4096,1024]
#     --flags F      extra flags of every run [--graphs]
#     --erase        also ERASE's best configuration with graphs (--detach all --schedule erase
#                    --side-lanes 4, blocking dispatch), both list builders
# Environment: OUT [bench/out/lists], NB_BUILD [build], SPEC
#   [synth:cap=1000000,max_len=256], EMB [64], MAX_LEN [256], TABLE_CAP [1000000].
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
WARM=10
steps=60 batches=4096,1024 build=1 flags="--graphs" erase=0
while [ $# -gt 0 ]; do
    case "$1" in
        --steps|--batch|--flags)
            [ $# -ge 2 ] || { echo "lists_bench.sh: $1 needs a value" >&2; exit 2; }
            case "$1" in --steps) steps=$2 ;; --batch) batches=$2 ;; --flags) flags=$2 ;; esac
            shift ;;
        --no-build) build=0 ;;
        --erase) erase=1 ;;
        -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "lists_bench.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
case "$steps" in ''|*[!0-9]*|0) echo "lists_bench.sh: --steps takes a positive integer, got '$steps'" >&2; exit 2 ;; esac
OUT=${OUT:-bench/out/lists}
NB_BUILD=${NB_BUILD:-build}
NB=$NB_BUILD/nobubble
mkdir -p "$OUT" || exit 1
if [ $build = 1 ]; then
    make -j"$(nproc)" BUILD="$NB_BUILD" "$NB" >"$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
fi
TMP=$(mktemp -d) || exit 1
trap 'rm -rf "$TMP"' EXIT
status=0
table="$OUT/table.md"
{
    echo "| batch | run | lists | p90 samples/s | median samples/s | p90 step / median | host ms/step (samples + lists) | upload ms/step (device) |"
    echo "|---|---|---|---|---|---|---|---|"
} >"$table"
runs=("plain|$flags")
[ $erase = 1 ] && runs+=("erase blocking|$flags --detach all --schedule erase --side-lanes 4")
field() { echo "$1" | tr ' ' '\n' | grep "^$2=" | head -1 | cut -d= -f2; }
for B in ${batches//,/ }; do
    for run in "${runs[@]}"; do
        name=${run%%|*} extra=${run#*|}
        for who in host device; do
            log="$OUT/b$B-${name// /-}-$who.log"
            # shellcheck disable=SC2086
            "$NB" train --model seqctr --device cuda --data "${SPEC:-synth:cap=1000000,max_len=256}" --emb-dim "${EMB:-64}" \
                --max-len "${MAX_LEN:-256}" --table-cap "${TABLE_CAP:-1000000}" --batch "$B" --steps $(( steps + WARM )) \
                --eval-samples 4096 --no-ckpt --out "$TMP/run" --index-lists $who $extra >"$log" 2>&1 \
                || { echo "B=$B $name $who: exit $? ($(tail -n 1 "$log"))"; status=1; continue; }
            tp=$(grep '^throughput ' "$log"); host=$(grep '^host ms/step' "$log"); bd=$(grep '^breakdown ' "$log")
            p90=$(field "$tp" p90_samples_per_s) med=$(field "$tp" median_samples_per_s)
            spread=$(awk -v a="$p90" -v b="$med" 'BEGIN {if (a > 0) printf "%.3f", b / a; else print "-"}')
            hs=$(echo "$host" | grep -o 'samples=[0-9.]*' | cut -d= -f2) hl=$(echo "$host" | grep -o 'index_lists=[0-9.]*' | cut -d= -f2)
            up=$(echo "$bd" | grep -o 'batch upload=[0-9.]*' | cut -d= -f2)
            echo "| $B | $name | $who | $p90 | $med | $spread | $hs + $hl | $up |" >>"$table"
            echo "B=$B $name lists=$who: $tp"
            echo "    $host"
        done
    done
done
echo
cat "$table"
exit $status
