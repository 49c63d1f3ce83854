#!/usr/bin/env bash
# GPT-2 (124M) on the default corpus on one GPU: validation curve and a sample.
#   bash bench/gpt2_sotu.sh [STEPS] [BATCH]     (default 600 steps of 16 x 1024 tokens)
# The corpus is small (2.0 M tokens): 600 x 16 x 1024 tokens is about 5 passes over it, so the
# validation loss bottoms out and then rises (overfitting); the curve shows where.
set -uo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-600}; BATCH=${2:-16}
OUT=${OUT:-bench/out}; mkdir -p "$OUT"
NB=${NB_BUILD:-build-dev}/nobubble
"$NB" train --model gpt2 --device cuda --graphs --batch "$BATCH" --steps "$STEPS" --lr 6e-4 --warmup 50 \
    --eval-every 50 --eval-batches 0 --out "$OUT/gpt2-sotu" --no-progress --log-every 50 2>&1 | tail -n 25
cp "$OUT/gpt2-sotu/metrics.jsonl" "$OUT/gpt2-sotu-metrics.jsonl"; cp "$OUT/gpt2-sotu/loss.svg" "$OUT/gpt2-sotu-loss.svg"
"$NB" sample --device cuda --ckpt "$OUT/gpt2-sotu" --prompt "My fellow citizens, the state of the Union" \
    --tokens 80 --seed 1 --temperature 0.8 2>/dev/null | tee "$OUT/gpt2-sotu-sample.txt"
rm -rf "$OUT/gpt2-sotu/ckpt"
