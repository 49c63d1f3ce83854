#!/usr/bin/env bash
# Two nobubble builds on the same GPU, the same configurations, in one call, alternating
# (A B A B) so that clock and thermal drift hit both alike: a refactor's before/after.
#   bash bench/engine_ab.sh A_BIN B_BIN [ROWS]
#     ROWS: comma list of gpt2,llama1b,proxy,seqctr,stream1b (default all), and sync16k,fwp16k,fwpck16k
# Rows (the configurations of bench/RESULTS.md's tables):
#   gpt2      gpt2 124M, 32 x 1024, --graphs, bf16, a random-token shard: p90 and median ms/step
#   llama1b   llama-1b, 16 x 2048, --graphs: p90 and median ms/step
#   proxy     gpt2-proxy, 8 x 256, --graphs: p90 and median ms/step
#   seqctr    seqctr B=4096, synth:cap=1000000,max_len=256, E 64, 1M-row tables, 200 steps, evaluation only
#             at the end and no lr warm-up on both sides (defaults that changed since ae09253: a
#             periodic evaluation inside the timed steps made 40-step rows swing 0.9x-4x): p90 samples/s
#   stream1b  llama-1b, 32 x 2048, --schedule stream --ckpt-interval 1 --keep-layers -1: p90 tokens/s
#   sync16k, fwp16k, fwpck16k   pipe_bench's seqctr (26 Criteo tables capped at 2M rows and the item
#             table, E 64, histories up to 256) at B 16,384, tables row-sharded over the one rank, --graphs,
#             60 steps: --schedule plain (sync); --schedule pipe --micro-batches 4 (FWP); FWP with
#             --cluster-keys. Where the host's time per step sets the pace: p90 samples/s
# Prints one table (A, B, B/A per row and repeat) and writes it to $OUT/ab.md.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
A=${1:?usage: bench/engine_ab.sh A_BIN B_BIN [ROWS]} B=${2:?usage: bench/engine_ab.sh A_BIN B_BIN [ROWS]}
ROWS=${3:-gpt2,llama1b,proxy,seqctr,stream1b}
REPEATS=${REPEATS:-2}
OUT=${OUT:-bench/out}
mkdir -p "$OUT" || exit 1
TMP=$(mktemp -d) || exit 1
trap 'rm -rf "$TMP"' EXIT
SHARD=$TMP/tokens.bin
python3 bench/torch_anchor.py --make-shard "$SHARD" --tokens 2000000 --seed 1337 >/dev/null || exit 1

# run BIN ROW DIR: one training run; prints "p90 median unit" from its summary
run() {
    local bin=$1 row=$2 dir=$3 log=$3.log
    case $row in
    gpt2|llama1b|proxy)
          case $row in gpt2) m="gpt2 --batch 32 --seq 1024 --steps 30" ;; llama1b) m="llama-1b --batch 16 --seq 2048 --steps 16" ;;
                       proxy) m="gpt2-proxy --batch 8 --seq 256 --steps 80" ;; esac
          # shellcheck disable=SC2086
          "$bin" train --model $m --device cuda --graphs --data "$SHARD" --val-data none \
              --eval-every 0 --no-ckpt --no-progress --out "$dir" >"$log" 2>&1 || { echo "failed: $(tail -1 "$log")"; return; }
          sed -n 's/^throughput  p90 [0-9]* tokens\/s (\([0-9.]*\) ms), median [0-9]* tokens\/s (\([0-9.]*\) ms).*/\1 \2 ms/p' "$log" ;;
    seqctr) "$bin" train --model seqctr --device cuda --data synth:cap=1000000,max_len=256 --emb-dim 64 --max-len 256 \
              --table-cap 1000000 --batch 4096 --steps 200 --warmup 0 --eval-every 0 --eval-samples 4096 --no-ckpt \
              --out "$dir" >"$log" 2>&1 \
              || { echo "failed: $(tail -1 "$log")"; return; }
          sed -n 's/^throughput steps=[0-9]* warmup=[0-9]* p90_samples_per_s=\([0-9]*\) median_samples_per_s=\([0-9]*\).*/\1 \2 samples\/s/p' "$log" ;;
    sync16k|fwp16k|fwpck16k)
          case $row in sync16k) s="--schedule plain" ;; fwp16k) s="--schedule pipe --micro-batches 4" ;;
                       fwpck16k) s="--schedule pipe --micro-batches 4 --cluster-keys" ;; esac
          # shellcheck disable=SC2086
          "$bin" train --model seqctr --device cuda --data synth:cap=2000000,max_len=256 --emb-dim 64 --max-len 256 \
              --table-cap 2000000 --batch 16384 --steps 60 --eval-every 0 --eval-samples 4096 --no-ckpt --no-progress --graphs \
              --emb-shard row $s --out "$dir" >"$log" 2>&1 || { echo "failed: $(tail -1 "$log")"; return; }
          sed -n 's/^throughput steps=[0-9]* warmup=[0-9]* p90_samples_per_s=\([0-9]*\) median_samples_per_s=\([0-9]*\).*/\1 \2 samples\/s/p' "$log" ;;
    stream1b) "$bin" train --model llama-1b --batch 32 --seq 2048 --steps 10 --device cuda --schedule stream --ckpt-interval 1 \
              --keep-layers -1 --data "$SHARD" --val-data none --eval-every 0 --no-ckpt --no-progress --out "$dir" >"$log" 2>&1 \
              || { echo "failed: $(tail -1 "$log")"; return; }
          sed -n 's/^throughput  p90 \([0-9]*\) tokens\/s ([0-9.]* ms), median \([0-9]*\) tokens\/s.*/\1 \2 tokens\/s/p' "$log" ;;
    esac
}

{
    echo "| row | repeat | A p90 | B p90 | B/A (p90) | A median | B median | unit |"
    echo "|---|---|---|---|---|---|---|---|"
} > "$OUT/ab.md"
for row in ${ROWS//,/ }; do
    for k in $(seq 1 "$REPEATS"); do
        ra=$(run "$A" "$row" "$TMP/a-$row-$k"); rb=$(run "$B" "$row" "$TMP/b-$row-$k")
        cp "$TMP/a-$row-$k.log" "$OUT/a-$row-$k.log"; cp "$TMP/b-$row-$k.log" "$OUT/b-$row-$k.log"
        set -- $ra; ap=${1:-?} am=${2:-?} unit=${3:-?}
        set -- $rb; bp=${1:-?} bm=${2:-?}
        ratio=$(awk -v a="$ap" -v b="$bp" -v u="$unit" 'BEGIN {if (a+0 > 0 && b+0 > 0) printf "%.3f", (u == "ms") ? a / b : b / a; else print "?"}')
        echo "| $row | $k | $ap | $bp | $ratio | $am | $bm | $unit |" >> "$OUT/ab.md"
        echo "$row #$k: A $ra | B $rb | B/A speed $ratio"
    done
done
echo
cat "$OUT/ab.md"
