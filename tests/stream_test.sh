#!/usr/bin/env bash
# --schedule stream on the CPU backend (host and "device" are both RAM, but every copy still goes
# through the h2d / d2h / host lanes, so the schedule's ordering is what is tested):
#  - stream vs plain, gpt2-tiny and llama-tiny, 20 steps with gradient clipping and evaluation:
#    bitwise-identical losses, gradient norms, validation losses, weights and AdamW state;
#  - with recomputation (--ckpt-interval 1, 2, 3 on 5 layers: full and partial blocks) too, with
#    the last layers kept whole (--keep-layers 1, 2 and -1: no recompute for them), with
#    one device slot and one pinned slab (--stream-slots 1 --pinned-slabs 1), three slots and
#    one per layer (--stream-slots 3, -1: then each layer is uploaded once a step), with layers
#    whose state stays on the device (--gpu-layers, also across a resume that changes how many), and
#    without clipping (each layer's AdamW then runs during the backward);
#  - a stream run resumed from its step-10 checkpoint equals 20 steps straight;
#  - the trace and timeline.svg show the h2d, d2h and host lanes at work;
#  - a host plan over --host-mem-limit, and flags stream cannot honour yet, end in one clear line.
source "$(dirname "$0")/lib.sh"
need_sotu
C=(--batch 2 --steps 20 --data "$TRAIN" --val-data "$VAL" --eval-every 10 --eval-batches 2 --no-progress --quiet --seed 11)
fields() { grep -o '"loss":[0-9.e+-]*\|"val_loss":[0-9.e+-]*\|"grad_norm":[0-9.e+-]*' "$1/metrics.jsonl"; }
same() { # same NAME DIR_A DIR_B
    [ -n "$(fields "$2")" ] && [ "$(fields "$2")" = "$(fields "$3")" ] \
        && cmp -s "$2/ckpt/model.safetensors" "$3/ckpt/model.safetensors" \
        && cmp -s "$2/ckpt/optim.safetensors" "$3/ckpt/optim.safetensors" \
        && pass "$1: bitwise-identical losses, norms, weights and AdamW state" || fail "$1: differs"
}
for model in gpt2-tiny llama-tiny; do
    $NB train "${C[@]}" --model $model --out "$TMP/$model-plain" || fail "$model plain"
    $NB train "${C[@]}" --model $model --schedule stream --trace "$TMP/$model.json" --out "$TMP/$model-stream" \
        || fail "$model stream"
    same "$model: stream vs plain, 20 steps" "$TMP/$model-plain" "$TMP/$model-stream"
done
# recompute: every K-th layer's input kept, blocks of K layers recomputed before their backward
$NB train "${C[@]}" --model gpt2-tiny --layers 5 --out "$TMP/k-plain" || fail "5-layer plain"
for K in 1 2 3; do
    $NB train "${C[@]}" --model gpt2-tiny --layers 5 --schedule stream --ckpt-interval $K --out "$TMP/k-$K" \
        || fail "stream --ckpt-interval $K"
    same "5 layers: stream with --ckpt-interval $K (recompute) vs plain" "$TMP/k-plain" "$TMP/k-$K"
done
# the last N layers keep every activation; the recompute runs in blocks below them
for KN in "1 1" "2 2" "2 -1"; do
    set -- $KN
    out=$($NB train "${C[@]}" --quiet --model gpt2-tiny --layers 5 --schedule stream --ckpt-interval $1 --keep-layers $2 \
        --out "$TMP/keep-$1$2" 2>&1) || fail "stream --ckpt-interval $1 --keep-layers $2: $out"
    same "5 layers: stream with --ckpt-interval $1 --keep-layers $2 vs plain" "$TMP/k-plain" "$TMP/keep-$1$2"
done
rec=$($NB train --batch 2 --steps 1 --data "$TRAIN" --val-data none --eval-every 0 --no-progress --model gpt2-tiny --layers 8 \
    --schedule stream --ckpt-interval 2 --keep-layers 3 --no-ckpt 2>&1 | grep -E '^(memory|recompute)')
r1=$($NB train --batch 2 --steps 1 --data "$TRAIN" --val-data none --eval-every 0 --no-progress --model gpt2-tiny --layers 8 \
    --schedule stream --ckpt-interval 2 --no-ckpt 2>&1 | grep -o '^recompute *+[0-9.]*')
# 8 layers, K=2: 6 recomputed (blocks 0-1, 2-3, 4-5); keeping 3 leaves blocks 0-1, 2-3 and 4: 4 recomputed
echo "$rec" | grep -q "3 layers kept whole" && [ -n "$r1" ] \
    && awk -v a="$(echo "$rec" | grep -o '^recompute *+[0-9.]*' | grep -o '[0-9.]*$')" -v b="${r1##*+}" \
        'BEGIN {exit !(a > 0 && (a / b - 4 / 6.0) ^ 2 < 1e-6)}' \
    && pass "--keep-layers 3 on 8 layers: the plan says so, 4 of 6 layers recomputed" || fail "--keep-layers plan: '$rec' vs '$r1'"
expect_error "--keep-layers without recompute" "--ckpt-interval K" $NB train "${C[@]}" --model gpt2-tiny --schedule stream --keep-layers 2
# each layer crosses PCIe at most twice a step: once for the forward, once for the recompute, whose
# weights serve the backward (the last two layers stay in their slots): 2L - 2 uploads
out=$($NB train --batch 2 --steps 2 --data "$TRAIN" --val-data none --eval-every 0 --no-progress --model gpt2-tiny --layers 8 \
    --schedule stream --ckpt-interval 1 --out "$TMP/pcie" 2>&1 | grep '^\(pcie\|copies\) ')
echo "$out" | grep -q "14 layer uploads for 8 streamed layers" && pass "uploads per step at --ckpt-interval 1: $out" \
    || fail "uploads per step: '$out' (expected 14 for 8 layers)"
# one device slot (no double buffering) and one pinned slab each way: later, never different
$NB train "${C[@]}" --model gpt2-tiny --layers 5 --schedule stream --ckpt-interval 2 --stream-slots 1 --pinned-slabs 1 \
    --out "$TMP/k-single" || fail "stream --stream-slots 1 --pinned-slabs 1"
same "5 layers: stream with one slot and one pinned slab vs plain" "$TMP/k-plain" "$TMP/k-single"
# three slots (the least recently used one takes the next layer) and one per layer (-1 on the CPU
# backend: the forward's weights serve the whole backward, so a layer crosses once a step)
for W in 3 -1; do
    $NB train "${C[@]}" --model gpt2-tiny --layers 5 --schedule stream --ckpt-interval 2 --stream-slots $W \
        --out "$TMP/k-w$W" || fail "stream --stream-slots $W"
    same "5 layers: stream with --stream-slots $W vs plain" "$TMP/k-plain" "$TMP/k-w$W"
done
out=$($NB train --batch 2 --steps 2 --data "$TRAIN" --val-data none --eval-every 0 --no-progress --model gpt2-tiny --layers 8 \
    --schedule stream --stream-slots -1 --out "$TMP/pcie-w" 2>&1 | grep '^\(pcie\|copies\) ')
echo "$out" | grep -q "8 layer uploads for 8 streamed layers" && pass "uploads per step with a slot per layer: $out" \
    || fail "uploads per step with --stream-slots -1: '$out' (expected 8 for 8 layers)"
# device layers (--gpu-layers): their state, gradient and AdamW stay on the "device" (the CPU
# backend's memory), the norm takes their blocks from there: still plain's bits, with clipping,
# recompute and evaluation, without clipping (their update then runs in the backward), and across a
# checkpoint (the host copy is brought up to date first)
$NB train "${C[@]}" --model gpt2-tiny --layers 5 --schedule stream --ckpt-interval 2 --gpu-layers 2 --out "$TMP/g2" \
    || fail "stream --gpu-layers 2"
same "5 layers: stream with --gpu-layers 2 (and recompute) vs plain" "$TMP/k-plain" "$TMP/g2"
$NB train "${C[@]}" --model llama-tiny --schedule stream --gpu-layers 1 --out "$TMP/g-llama" || fail "llama stream --gpu-layers 1"
same "llama-tiny: stream with --gpu-layers 1 vs plain" "$TMP/llama-tiny-plain" "$TMP/g-llama"
$NB train "${C[@]}" --model gpt2-tiny --layers 5 --schedule stream --gpu-layers 5 --stop-after 10 --out "$TMP/g-all" \
    || fail "stream --gpu-layers 5, first half"
$NB train --resume "$TMP/g-all" --out "$TMP/g-all" --no-progress --quiet || fail "stream --gpu-layers 5, resumed"
same "5 layers: stream with every layer on the device, resumed at step 10, vs plain" "$TMP/k-plain" "$TMP/g-all"
# the device layers' moments live on the device only: a checkpoint fetches them, a resume with
# other device layers (and slots) stores them where they now live
$NB train "${C[@]}" --model gpt2-tiny --layers 5 --schedule stream --gpu-layers 2 --stop-after 10 --out "$TMP/g-mv" \
    || fail "stream --gpu-layers 2, first half"
$NB train --resume "$TMP/g-mv" --out "$TMP/g-mv" --gpu-layers 3 --stream-slots 1 --no-progress --quiet \
    || fail "stream resumed with --gpu-layers 3 --stream-slots 1"
same "5 layers: stream --gpu-layers 2, resumed at step 10 with --gpu-layers 3 --stream-slots 1, vs plain" "$TMP/k-plain" "$TMP/g-mv"
out=$($NB train --batch 2 --steps 2 --data "$TRAIN" --val-data none --eval-every 0 --no-progress --model gpt2-tiny --layers 8 \
    --schedule stream --gpu-layers 3 --out "$TMP/pcie-g" 2>&1)
echo "$out" | grep -q "^\(pcie\|copies\) .* 8 layer uploads for 5 streamed layers" && echo "$out" | grep -q "3 of 8 layers (0 2 5) keep weights" \
    && pass "--gpu-layers 3 of 8: the plan says so, only the 5 others cross PCIe" || fail "--gpu-layers plan: $out"
expect_error "--gpu-layers without stream" "use --gpu-layers with --schedule stream" $NB train "${C[@]}" --model gpt2-tiny --gpu-layers 1
expect_error "--stream-slots out of range" "N >= 1, or -1" $NB train "${C[@]}" --model gpt2-tiny --schedule stream --stream-slots 0
# no clipping: each layer's AdamW runs as soon as its gradient lands, during the backward
$NB train "${C[@]}" --model gpt2-tiny --layers 4 --grad-clip 0 --out "$TMP/nc-plain" || fail "no-clip plain"
$NB train "${C[@]}" --model gpt2-tiny --layers 4 --grad-clip 0 --schedule stream --ckpt-interval 2 --out "$TMP/nc-stream" \
    || fail "no-clip stream"
same "--grad-clip 0: stream (AdamW during the backward) vs plain" "$TMP/nc-plain" "$TMP/nc-stream"
$NB train "${C[@]}" --model gpt2-tiny --layers 4 --grad-clip 0 --schedule stream --gpu-layers 2 --out "$TMP/nc-g2" \
    || fail "no-clip stream --gpu-layers 2"
same "--grad-clip 0: stream with --gpu-layers 2 vs plain" "$TMP/nc-plain" "$TMP/nc-g2"
$NB train "${C[@]}" --model gpt2-tiny --layers 4 --grad-clip 0 --schedule stream --gpu-layers 1 --stop-after 10 --out "$TMP/nc-r" \
    || fail "no-clip stream --gpu-layers 1, first half"
$NB train --resume "$TMP/nc-r" --out "$TMP/nc-r" --gpu-layers 0 --no-progress --quiet || fail "no-clip stream resumed, --gpu-layers 0"
same "--grad-clip 0: stream --gpu-layers 1 resumed at step 10 with --gpu-layers 0, vs plain" "$TMP/nc-plain" "$TMP/nc-r"
$NB train "${C[@]}" --model gpt2-tiny --schedule stream --stop-after 10 --out "$TMP/split" || fail "stream first half"
$NB train --resume "$TMP/split" --out "$TMP/split" --no-progress --quiet || fail "stream resume"
cmp -s "$TMP/gpt2-tiny-stream/ckpt/model.safetensors" "$TMP/split/ckpt/model.safetensors" \
    && cmp -s "$TMP/gpt2-tiny-stream/ckpt/optim.safetensors" "$TMP/split/ckpt/optim.safetensors" \
    && pass "stream resume (10 + 10 steps) is bitwise 20 straight" || fail "stream resume differs"
for s in '"h2d L1"' '"d2h L0"' '"grad norm"' '"adamw L0"' '"adamw embeddings"' '"h2d embeddings"' '"adamw head"' '"h2d head"'; do
    grep -q "$s" "$TMP/gpt2-tiny.json" && pass "trace has $s" || fail "trace lacks $s"
done
for lane in h2d d2h host optim; do
    grep -q ">$lane<" "$TMP/gpt2-tiny-stream/timeline.svg" && pass "timeline.svg has the $lane lane" || fail "timeline.svg lacks $lane"
done
# nobubble timeline redraws any traced step; one step's window, not the whole run
$NB timeline --trace "$TMP/gpt2-tiny.json" --step 5 --out "$TMP/step5.svg" 2>/dev/null \
    && grep -q ">stage<" "$TMP/step5.svg" && grep -q "adamw L0" "$TMP/step5.svg" \
    && pass "nobubble timeline draws step 5 of the trace" || fail "nobubble timeline"
grep -q "schedule stream.*; step 5<" "$TMP/step5.svg" && ! grep -q "gpt2-tiny.json" "$TMP/step5.svg" \
    && pass "its title names the run and the step, not the trace file" || fail "timeline title: $(grep -m1 -o '<text[^<]*</text>' "$TMP/step5.svg")"
grep -q ">optimizer</text>" "$TMP/step5.svg" && grep -q ">forward, segment 0</text>" "$TMP/step5.svg" \
    && pass "timeline.svg has a colour key" || fail "timeline.svg has no colour key"
all=$(grep -c "<rect" "$TMP/gpt2-tiny-stream/timeline.svg"); one=$(grep -c "<rect" "$TMP/step5.svg")
[ "$one" -lt $((3 * all)) ] && pass "the step's picture holds one step's boxes ($one vs $all in the run's last-step picture)" \
    || fail "timeline of one step has $one boxes against $all"
expect_error "timeline of a step the trace lacks" "no span of step 99" $NB timeline --trace "$TMP/gpt2-tiny.json" --step 99 --out "$TMP/x.svg"
expect_error "host plan over --host-mem-limit" "host-mem-limit" $NB train "${C[@]}" --model gpt2-tiny --schedule stream \
    --host-mem-limit 1000000
expect_error "stream with --detach" "stream: it does not split" $NB train "${C[@]}" --model gpt2-tiny --schedule stream --detach 1
expect_error "recompute without stream" "stream schedule only" $NB train "${C[@]}" --model gpt2-tiny --ckpt-interval 2
expect_error "stream with --graphs" "not captured as graphs" $NB train "${C[@]}" --model gpt2-tiny --schedule stream --graphs
finish
