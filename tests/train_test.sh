#!/usr/bin/env bash
# Training behaviour on real text: llama-tiny's loss falls by at least 30% in 200 steps; eval and
# sample run on the checkpoint; metrics.jsonl has the promised fields.
source "$(dirname "$0")/lib.sh"
need_sotu
$NB train --model llama-tiny --batch 4 --steps 200 --lr 3e-3 --eval-every 100 --eval-batches 4 \
    --data "$TRAIN" --val-data "$VAL" --out "$TMP/llama" --no-progress --quiet || fail "llama-tiny run"
first=$(head -n 1 "$TMP/llama/metrics.jsonl" | grep -o '"loss":[0-9.]*' | cut -d: -f2)
last=$(tail -n 10 "$TMP/llama/metrics.jsonl" | grep -o '"loss":[0-9.]*' | cut -d: -f2 | awk '{s+=$1} END {print s/NR}')
awk -v a="$first" -v b="$last" 'BEGIN {exit !(b <= 0.7 * a)}' \
    && pass "llama-tiny loss $first -> $last (mean of the last 10 steps) in 200 steps" \
    || fail "llama-tiny loss fell only from $first to $last"
for k in step loss lr ms tokens_per_s bubble_pct val_loss; do
    grep -q "\"$k\":" "$TMP/llama/metrics.jsonl" && pass "metrics has $k" || fail "metrics lacks $k"
done
out=$($NB eval --ckpt "$TMP/llama" --data "$VAL" --batch 4 --batches 4 2>&1) && echo "$out" | grep -q "^loss [0-9]" \
    && pass "eval: $out" || fail "eval: $out"
val=$(tail -n 1 "$TMP/llama/metrics.jsonl" | grep -o '"val_loss":[0-9.]*' | cut -d: -f2)
echo "$out" | grep -q "^loss $(printf '%.4f' "$val")" && pass "eval matches the run's last val_loss ($val)" \
    || fail "eval loss differs from the run's val_loss $val"
s=$($NB sample --ckpt "$TMP/llama" --prompt "The Congress" --tokens 20 --seed 7 2>/dev/null)
[ ${#s} -gt 15 ] && pass "sample: $(echo "$s" | head -c 120 | tr '\n' ' ')" || fail "sample printed '$s'"
s2=$($NB sample --ckpt "$TMP/llama" --prompt "The Congress" --tokens 20 --seed 7 2>/dev/null)
[ "$s" = "$s2" ] && pass "sampling is deterministic for a seed" || fail "sampling differs between runs"
# --kernel-table counts GPU kernels: on the CPU the run trains as usual and says so
out=$($NB train --model llama-tiny --batch 2 --steps 2 --data "$TRAIN" --val-data none --no-progress --kernel-table 5 2>&1) \
    && echo "$out" | grep -q "kernel-table counts GPU kernels" && ! echo "$out" | grep -q "^kernels " \
    && pass "--kernel-table on the CPU: a note, no table" || fail "--kernel-table on the CPU: $(echo "$out" | tail -3)"
finish
