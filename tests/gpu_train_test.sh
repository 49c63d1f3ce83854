#!/usr/bin/env bash
# The CUDA trainer (runs on a machine with a GPU; skips elsewhere):
#  - fp32 mode (TF32 off) follows the CPU reference step by step (losses within 1e-4 relative);
#  - bf16 mode learns; two GPU runs with one seed are bitwise identical; resume is bitwise;
#  - --graphs replays equal eager steps bitwise; a plan over --gpu-mem-limit fails before training;
#  - eval and sample run on the GPU; eval allocates no gradients or moments;
#  - ERASE (--detach, --schedule erase, both dispatch modes and --graphs) is bitwise plain and
#    overlaps (overlap_pct > 0);
#  - --schedule stream follows plain in fp32 (host AdamW vs device AdamW: bitwise, also with
#    recompute under layers kept whole, and with layers whose state stays on the device) and bf16,
#    its trace shows uploads and downloads running during other layers' compute.
source "$(dirname "$0")/lib.sh"
"$NB" info >/dev/null 2>&1 || { echo "skip: $("$NB" info | head -n 1 | sed 's/  */ /g')"; exit 77; }
need_sotu
for model in gpt2-tiny llama-tiny; do
    C=(--model $model --batch 4 --steps 20 --eval-every 10 --eval-batches 2 --data "$TRAIN" --val-data "$VAL" --no-progress --quiet)
    $NB train "${C[@]}" --device cpu --out "$TMP/cpu-$model" || fail "$model cpu run"
    $NB train "${C[@]}" --device cuda --precision fp32 --out "$TMP/f32-$model" || fail "$model cuda fp32 run"
    worst=$(worst_loss_diff "$TMP/cpu-$model" "$TMP/f32-$model")
    awk -v w="$worst" 'BEGIN {exit !(w < 1e-4)}' && pass "$model: cuda fp32 follows the cpu for 20 steps (worst loss rel diff $worst)" \
        || fail "$model: cuda fp32 vs cpu loss rel diff $worst"
    $NB train "${C[@]}" --device cuda --out "$TMP/bf16-$model" || fail "$model bf16 run"
    $NB train "${C[@]}" --device cuda --out "$TMP/bf16b-$model" || fail "$model bf16 second run"
    cmp -s "$TMP/bf16-$model/ckpt/model.safetensors" "$TMP/bf16b-$model/ckpt/model.safetensors" \
        && pass "$model: two bf16 GPU runs are bitwise identical" || fail "$model: GPU runs differ"
    $NB train "${C[@]}" --device cuda --graphs --out "$TMP/graphs-$model" || fail "$model --graphs run"
    cmp -s "$TMP/bf16-$model/ckpt/model.safetensors" "$TMP/graphs-$model/ckpt/model.safetensors" \
        && pass "$model: CUDA graph replay (--graphs) is bitwise equal to eager steps" || fail "$model: --graphs differs"
    # the kernel table (CUPTI) watches the steps without changing them
    $NB train "${C[@]}" --device cuda --graphs --kernel-table 5 --out "$TMP/kt-$model" 2>"$TMP/kt-$model.log" || fail "$model --kernel-table run"
    cmp -s "$TMP/bf16-$model/ckpt/model.safetensors" "$TMP/kt-$model/ckpt/model.safetensors" \
        && grep -q "^kernels     per step over [0-9]* steps (CUPTI): [0-9]* launches" "$TMP/kt-$model.log" \
        && pass "$model: --kernel-table prints the step's kernels, same bits ($(grep -o '[0-9]* launches' "$TMP/kt-$model.log"))" \
        || fail "$model: --kernel-table: $(grep -E '^kernels|^note' "$TMP/kt-$model.log" | head -2)"
    $NB train "${C[@]}" --device cuda --stop-after 10 --out "$TMP/split-$model" || fail "$model first half"
    $NB train --resume "$TMP/split-$model" --out "$TMP/split-$model" --no-progress --quiet || fail "$model resume"
    cmp -s "$TMP/bf16-$model/ckpt/model.safetensors" "$TMP/split-$model/ckpt/model.safetensors" && \
    cmp -s "$TMP/bf16-$model/ckpt/optim.safetensors" "$TMP/split-$model/ckpt/optim.safetensors" \
        && pass "$model: GPU resume is bitwise" || fail "$model: GPU resume differs"
    first=$(head -n 1 "$TMP/bf16-$model/metrics.jsonl" | grep -o '"loss":[0-9.]*' | cut -d: -f2)
    last=$(tail -n 1 "$TMP/bf16-$model/metrics.jsonl" | grep -o '"loss":[0-9.]*' | cut -d: -f2)
    awk -v a="$first" -v b="$last" 'BEGIN {exit !(b < a - 1)}' && pass "$model: bf16 loss $first -> $last" || fail "$model: bf16 loss $first -> $last"
done
# ERASE on the GPU: detached segments' backward on side streams gives plain's bits and overlaps
E=(--model gpt2-proxy --layers 4 --detach 1,2 --batch 8 --steps 20 --data "$TRAIN" --val-data none --eval-every 0 --no-progress --quiet --device cuda)
$NB train "${E[@]}" --schedule plain --out "$TMP/e-plain" || fail "gpu detached plain"
for v in "--erase-dispatch blocking" "--erase-dispatch async" "--graphs"; do
    d=$TMP/e-$(echo $v | tr -dc 'a-z')
    $NB train "${E[@]}" --schedule erase $v --out "$d" || fail "gpu erase $v"
    cmp -s "$TMP/e-plain/ckpt/model.safetensors" "$d/ckpt/model.safetensors" \
        && pass "GPU erase ($v) is bitwise equal to detached plain" || fail "GPU erase ($v) differs from plain"
done
ov=$(grep -o '"overlap_pct":[0-9.e+-]*' "$TMP/e-erasedispatchblocking/metrics.jsonl" | tail -n 10 | cut -d: -f2 | sort -g | tail -n 1)
awk -v o="$ov" 'BEGIN {exit !(o > 0)}' && pass "GPU erase: side-stream work overlaps the main stream (overlap_pct up to $ov)" \
    || fail "GPU erase: no overlap ($ov)"
# stream (MegaTrain): the model's state in host memory, layers streamed through two device slots
S=(--model gpt2-proxy --layers 8 --batch 8 --steps 20 --data "$TRAIN" --val-data none --eval-every 0 --no-progress --quiet --device cuda)
$NB train "${S[@]}" --precision fp32 --out "$TMP/s-plain" || fail "gpu fp32 plain"
$NB train "${S[@]}" --precision fp32 --schedule stream --out "$TMP/s-stream" || fail "gpu fp32 stream"
worst=$(worst_loss_diff "$TMP/s-plain" "$TMP/s-stream")
awk -v w="$worst" 'BEGIN {exit !(w < 1e-4)}' \
    && pass "GPU stream (host AdamW) vs plain (device AdamW), fp32: worst loss rel diff $worst over 20 steps" \
    || fail "GPU stream vs plain, fp32: loss rel diff $worst"
# the device AdamW and norm are built to give the host's bits (test_ops's cuda rows), so the same
# optimizer math on either side should leave the same weights
cmp -s "$TMP/s-plain/ckpt/model.safetensors" "$TMP/s-stream/ckpt/model.safetensors" \
    && cmp -s "$TMP/s-plain/ckpt/optim.safetensors" "$TMP/s-stream/ckpt/optim.safetensors" \
    && pass "GPU stream vs plain, fp32: bitwise-identical weights and AdamW state after 20 steps" \
    || fail "GPU stream vs plain, fp32: weights or AdamW state differ after 20 steps"
# recompute below 3 layers kept whole: the recomputed forwards give the same bits on the GPU too
$NB train "${S[@]}" --precision fp32 --schedule stream --ckpt-interval 2 --keep-layers 3 --out "$TMP/s-keep" \
    || fail "gpu fp32 stream --keep-layers 3"
cmp -s "$TMP/s-plain/ckpt/model.safetensors" "$TMP/s-keep/ckpt/model.safetensors" \
    && cmp -s "$TMP/s-plain/ckpt/optim.safetensors" "$TMP/s-keep/ckpt/optim.safetensors" \
    && pass "GPU stream --ckpt-interval 2 --keep-layers 3 vs plain, fp32: bitwise-identical weights and AdamW state" \
    || fail "GPU stream --ckpt-interval 2 --keep-layers 3 vs plain, fp32: differ"
# three layers' state on the device (their AdamW there, their norm blocks summed there in the
# host's order) and a weight slot per streamed layer: still plain's bits
$NB train "${S[@]}" --precision fp32 --schedule stream --gpu-layers 3 --stream-slots -1 --out "$TMP/s-gpu" \
    || fail "gpu fp32 stream --gpu-layers 3"
cmp -s "$TMP/s-plain/ckpt/model.safetensors" "$TMP/s-gpu/ckpt/model.safetensors" \
    && cmp -s "$TMP/s-plain/ckpt/optim.safetensors" "$TMP/s-gpu/ckpt/optim.safetensors" \
    && pass "GPU stream --gpu-layers 3 --stream-slots -1 vs plain, fp32: bitwise-identical weights and AdamW state" \
    || fail "GPU stream --gpu-layers 3 --stream-slots -1 vs plain, fp32: differ"
# the device layers' moments live on the device only (the checkpoint fetches them): resumed at
# step 10 with another count of device layers, and without clipping (no host gradient slab, each
# layer's AdamW from its pinned slab): plain's bits
$NB train "${S[@]}" --precision fp32 --schedule stream --gpu-layers 3 --stop-after 10 --out "$TMP/s-split" \
    && $NB train --resume "$TMP/s-split" --gpu-layers 1 --stream-slots 1 --no-progress --quiet || fail "gpu fp32 stream resume across --gpu-layers"
cmp -s "$TMP/s-plain/ckpt/model.safetensors" "$TMP/s-split/ckpt/model.safetensors" \
    && cmp -s "$TMP/s-plain/ckpt/optim.safetensors" "$TMP/s-split/ckpt/optim.safetensors" \
    && pass "GPU stream --gpu-layers 3, resumed at step 10 with --gpu-layers 1, fp32: plain's bits" \
    || fail "GPU stream resumed across --gpu-layers, fp32: differs from plain"
$NB train "${S[@]}" --precision fp32 --grad-clip 0 --out "$TMP/s-plain-nc" || fail "gpu fp32 plain --grad-clip 0"
$NB train "${S[@]}" --precision fp32 --grad-clip 0 --schedule stream --gpu-layers 2 --out "$TMP/s-nc" || fail "gpu fp32 stream --grad-clip 0"
cmp -s "$TMP/s-plain-nc/ckpt/model.safetensors" "$TMP/s-nc/ckpt/model.safetensors" \
    && cmp -s "$TMP/s-plain-nc/ckpt/optim.safetensors" "$TMP/s-nc/ckpt/optim.safetensors" \
    && pass "GPU stream --grad-clip 0 --gpu-layers 2 (no host gradient slab), fp32: plain's bits" \
    || fail "GPU stream --grad-clip 0: differs from plain"
$NB train "${S[@]}" --steps 12 --out "$TMP/s-bf16-plain" || fail "gpu bf16 plain"
for v in "--ckpt-interval 1" "--gpu-layers 3 --stream-slots -1"; do
    $NB train "${S[@]}" --schedule stream $v --steps 12 --out "$TMP/s-bf16" || fail "gpu bf16 stream $v"
    worst=$(worst_loss_diff "$TMP/s-bf16-plain" "$TMP/s-bf16")
    awk -v w="$worst" 'BEGIN {exit !(w < 1e-2)}' \
        && pass "GPU stream bf16 $v vs plain bf16: worst loss rel diff $worst over 12 steps" \
        || fail "GPU stream bf16 $v vs plain: loss rel diff $worst"
done
# the overlap needs layers whose compute outlasts their copies (the proxy's 1.5 MB layers are all
# latency): llama-1b's layers, four of them, 16k tokens a step
$NB train --model llama-1b --layers 4 --batch 8 --seq 2048 --steps 6 --data "$TRAIN" --val-data none --eval-every 0 \
    --no-progress --quiet --no-ckpt --device cuda --schedule stream --ckpt-interval 1 --trace "$TMP/stream.json" \
    || fail "gpu stream llama-1b, 4 layers"
python3 "$ROOT/tests/trace_overlap.py" "$TMP/stream.json" 5 > "$TMP/ov.txt" 2>&1 \
    && pass "GPU stream overlaps: $(cat "$TMP/ov.txt")" || fail "GPU stream: no overlap in the trace ($(cat "$TMP/ov.txt"))"
expect_error "plan over --gpu-mem-limit" "GPU memory" $NB train --model gpt2 --device cuda --batch 8 --gpu-mem-limit 1000000000 --data "$TRAIN" --val-data none --steps 1
out=$($NB eval --device cuda --ckpt "$TMP/bf16-gpt2-tiny" --data "$VAL" --batches 2 2>&1) && pass "eval on cuda: $out" || fail "eval on cuda: $out"
# eval plans the forward only: no gradients or moments on the device (an 8B checkpoint trained by
# stream evaluates on an 80 GB GPU)
devb() { sed -n 's/^allocated   host [0-9]* bytes, device \([0-9]*\) bytes.*/\1/p' "$1"; }
$NB train --model gpt2-tiny --batch 4 --steps 2 --data "$TRAIN" --val-data none --no-progress --device cuda --out "$TMP/evplan" \
    >/dev/null 2>"$TMP/evplan.err" || fail "gpt2-tiny cuda run for eval's plan"
$NB eval --device cuda --ckpt "$TMP/evplan" --data "$VAL" --batches 2 >/dev/null 2>"$TMP/evplan-eval.err" || fail "eval's plan run"
te=$(devb "$TMP/evplan.err") ee=$(devb "$TMP/evplan-eval.err")
[ -n "$te" ] && [ -n "$ee" ] && [ $((ee * 2)) -lt "$te" ] && pass "eval allocates $ee device bytes, training $te" \
    || fail "eval's device bytes '$ee' vs training's '$te'"
s=$($NB sample --device cuda --ckpt "$TMP/bf16-gpt2-tiny" --prompt "The" --tokens 10 2>&1) && [ ${#s} -gt 5 ] \
    && pass "sample on cuda: $(echo "$s" | tr '\n' ' ' | head -c 100)" || fail "sample on cuda: $s"
# --device cuda:N picks GPU N of the backend instance; one past the last is a clear error naming them
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
D0=(--model gpt2-tiny --batch 2 --steps 3 --data "$TRAIN" --val-data none --no-progress --quiet)
$NB train "${D0[@]}" --device cuda --out "$TMP/cuda" && $NB train "${D0[@]}" --device cuda:0 --out "$TMP/cuda0" \
    && [ -n "$(losses "$TMP/cuda0")" ] && [ "$(losses "$TMP/cuda")" = "$(losses "$TMP/cuda0")" ] \
    && pass "--device cuda:0 runs on GPU 0 (the losses of --device cuda)" || fail "--device cuda:0"
expect_error "--device cuda:$ngpu on $ngpu GPU(s)" "cuda:$ngpu: this machine has $ngpu GPU.*0: " $NB train --model gpt2-tiny \
    --batch 2 --steps 1 --data "$TRAIN" --val-data none --device "cuda:$ngpu"
finish
