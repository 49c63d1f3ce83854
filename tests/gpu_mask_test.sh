#!/usr/bin/env bash
# Loss masks on the GPU (runs on a machine with a GPU; skips elsewhere): the loss scale (1 / the
# step's counted targets) lives in the step's scalars and the cross-entropy kernel reads it, so
#  - an all-ones mask trains bitwise as no mask: bf16 eager and --graphs, erase with --detach,
#    stream;
#  - with a partial mask (the scale changes every step) --graphs replays give the eager bits, and
#    CUDA fp32 follows the CPU step by step; --grad-accum 2 follows one batch;
#  - evaluation on the GPU gives the CPU's masked mean.
source "$(dirname "$0")/lib.sh"
"$NB" info >/dev/null 2>&1 || { echo "skip: $("$NB" info | head -n 1 | sed 's/  */ /g')"; exit 77; }
need_sotu
M=(--model gpt2-tiny --vocab 32000 --dim 64 --heads 4 --ffn 256 --layers 2 --seq 64)
T=("${M[@]}" --batch 8 --steps 16 --val-data none --no-progress --quiet --seed 5)
mask_shard "$TRAIN" "$TMP/plain.bin" 40000 none
mask_shard "$TRAIN" "$TMP/ones.bin" 40000 ones
mask_shard "$TRAIN" "$TMP/part.bin" 40000 runs
for v in "bf16|" "graphs|--graphs" "erase|--detach 1 --schedule erase" "stream|--schedule stream" "accum|--grad-accum 2 --graphs"; do
    IFS='|' read -r tag extra <<< "$v"
    $NB train "${T[@]}" --device cuda $extra --data "$TMP/plain.bin" --out "$TMP/p-$tag" || fail "$tag: no mask"
    $NB train "${T[@]}" --device cuda $extra --data "$TMP/ones.bin" --out "$TMP/o-$tag" || fail "$tag: all-ones mask"
    same_state "cuda $tag ${extra:+($extra) }: an all-ones mask vs no mask file" "$TMP/p-$tag" "$TMP/o-$tag"
done
$NB train "${T[@]}" --device cuda --data "$TMP/part.bin" --out "$TMP/eager" || fail "partial: eager"
$NB train "${T[@]}" --device cuda --graphs --data "$TMP/part.bin" --out "$TMP/graphs" || fail "partial: --graphs"
same_state "cuda, a partial mask: --graphs replays vs eager steps" "$TMP/eager" "$TMP/graphs"
$NB train "${T[@]}" --device cuda --grad-accum 2 --graphs --data "$TMP/part.bin" --out "$TMP/acc" || fail "partial: --grad-accum 2"
worst=$(worst_loss_diff "$TMP/eager" "$TMP/acc")
awk -v w="$worst" 'BEGIN {exit !(w < 2e-3)}' && pass "cuda, a partial mask: --grad-accum 2 follows one batch (worst loss rel diff $worst)" \
    || fail "cuda, a partial mask: --grad-accum 2 vs one batch: worst loss rel diff $worst"
$NB train "${T[@]}" --device cpu --data "$TMP/part.bin" --out "$TMP/cpu" || fail "partial: cpu"
$NB train "${T[@]}" --device cuda --precision fp32 --data "$TMP/part.bin" --out "$TMP/f32" || fail "partial: cuda fp32"
worst=$(worst_loss_diff "$TMP/cpu" "$TMP/f32")
awk -v w="$worst" 'BEGIN {exit !(w < 1e-4)}' && pass "cuda fp32, a partial mask: follows the cpu for 16 steps (worst loss rel diff $worst)" \
    || fail "cuda fp32 vs cpu, a partial mask: worst loss rel diff $worst"
mask_shard "$VAL" "$TMP/ev.bin" 8192 runs
ec=$($NB eval --ckpt "$TMP/cpu" --data "$TMP/ev.bin" --batches 0 --device cpu 2>&1 | grep -o 'loss [0-9.]* nats' | cut -d' ' -f2)
eg=$($NB eval --ckpt "$TMP/cpu" --data "$TMP/ev.bin" --batches 0 --device cuda 2>&1 | grep -o 'loss [0-9.]* nats' | cut -d' ' -f2)
# (the GPU may compute in bf16: close, not equal)
awk -v a="$ec" -v b="$eg" 'BEGIN {d = (a - b) / a; if (d < 0) d = -d; exit !(a != "" && b != "" && d < 5e-3)}' \
    && pass "eval's masked mean: cuda $eg, cpu $ec" || fail "eval's masked mean: cpu '$ec', cuda '$eg'"
finish
