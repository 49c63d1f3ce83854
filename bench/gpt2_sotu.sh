#!/usr/bin/env bash
# GPT-2 (124M) on the default corpus on one GPU for a fixed wall-clock time: validation curve
# (metrics.jsonl, loss.svg) and a sample.
#   bash bench/gpt2_sotu.sh [--time S] [--steps N] [--batch B] [--resume]
#     --time S    seconds of training in this call (--time-limit), then a checkpoint [600]
#     --steps N   length of the cosine schedule [16000: about 10 minutes of B=16 steps on an H200]
#     --batch B   sequences of 1024 tokens per step [16]
#     --resume    continue the run in $OUT/gpt2-sotu (a device call is at most 10 minutes, so a
#                 10-minute run is two calls: --time 480, then --resume --time 120)
# The corpus is small (2.0 M tokens): 10 minutes is ~100 passes over it, so the validation loss
# bottoms out early and then rises (overfitting); the curve shows where. The sample is drawn
# from the last checkpoint after every call.
set -uo pipefail
cd "$(dirname "$0")/.."
T=600 STEPS=16000 BATCH=16 resume=0
while [ $# -gt 0 ]; do
    case "$1" in
        --time) T=$2; shift ;;
        --steps) STEPS=$2; shift ;;
        --batch) BATCH=$2; shift ;;
        --resume) resume=1 ;;
        -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "gpt2_sotu.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
OUT=${OUT:-bench/out}; mkdir -p "$OUT"
NB=${NB_BUILD:-build-dev}/nobubble
RUN="$OUT/gpt2-sotu"
if [ $resume = 1 ]; then
    "$NB" train --resume "$RUN" --out "$RUN" --time-limit "$T" --no-progress --log-every 500 2>&1 | tail -n 8
else
    rm -rf "$RUN"
    "$NB" train --model gpt2 --device cuda --graphs --batch "$BATCH" --steps "$STEPS" --lr 6e-4 --warmup 200 \
        --eval-every 500 --eval-batches 0 --time-limit "$T" --out "$RUN" --no-progress --log-every 500 2>&1 | tail -n 40
fi
cp "$RUN/metrics.jsonl" "$OUT/gpt2-sotu-metrics.jsonl"; cp "$RUN/loss.svg" "$OUT/gpt2-sotu-loss.svg"
"$NB" sample --device cuda --ckpt "$RUN" --prompt "My fellow citizens, the state of the Union" \
    --tokens 80 --seed 1 --temperature 0.8 2>/dev/null | tee "$OUT/gpt2-sotu-sample.txt"
