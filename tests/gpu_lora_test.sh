#!/usr/bin/env bash
# LoRA under --schedule stream on the GPU (runs on a machine with a GPU; prints a skip line and
# exits 0 elsewhere): the frozen base streams from pinned host memory (or stays on the GPU with
# --gpu-layers), the adapters train on the GPU with the family's AdamW, as under plain. Against
# plain LoRA on the same GPU, on an imported llama-shaped base and on GPT-2's seeded init:
#  - fp32 (--precision fp32): the same kernels in the same order, so the losses are bitwise
#    plain's (a difference below 1e-5 relative is reported, not failed: cuBLAS may pick another
#    algorithm for other addresses);
#  - bf16: the base rounded on the host (stream) as the device cast rounds it (plain): within 1e-2
#    relative (bitwise is reported when it holds);
#  - stream with one slot, with --gpu-layers 1 and --ckpt-interval 1, and across a stop and resume;
#  - nobubble plan's host and device bytes are what the run allocates (within 1%).
source "$(dirname "$0")/lib.sh"
"$NB" info >/dev/null 2>&1 || { echo "skip: no GPU ($("$NB" info 2>&1 | head -n 1 | sed 's/  */ /g'))"; exit 0; }
need_sotu
mask_shard "$TRAIN" "$TMP/train.bin" 40000 none
M=(--model llama-tiny --vocab 32000 --dim 64 --heads 4 --kv-heads 2 --ffn 128 --layers 4 --seq 64)
$NB train "${M[@]}" --batch 4 --steps 2 --data "$TMP/train.bin" --val-data none --no-progress --quiet --out "$TMP/base" \
    >"$TMP/base.log" 2>&1 && $NB export --ckpt "$TMP/base" --hf "$TMP/hf" >/dev/null 2>&1 \
    || { tail -3 "$TMP/base.log"; fail "the llama-shaped base to import"; finish; }
F=(--init-from "$TMP/hf" --batch 8 --steps 12 --data "$TMP/train.bin" --val-data none --no-progress --lr 1e-2
   --lora 8 --lora-alpha 16 --lora-targets q,k,v,o,gate,up,down --device cuda)
G=(--model gpt2-tiny --vocab 32000 --dim 64 --heads 4 --layers 4 --seq 64 --batch 8 --steps 12 --data "$TMP/train.bin"
   --val-data none --no-progress --lr 1e-2 --lora 4 --lora-targets q,k,v,o,up,down --device cuda)
run() { # TAG ARGS...
    local tag=$1; shift
    $NB train "$@" --out "$TMP/$tag" >"$TMP/$tag.log" 2>&1 || { fail "$tag: exit $?"; tail -3 "$TMP/$tag.log"; }
}
# close NAME A B TOL: B's losses follow A's within TOL relative (bitwise said when they are)
close() {
    local w=$(worst_loss_diff "$2" "$3") n=$(losses "$3" | wc -l)
    [ "$n" -gt 0 ] || { fail "$1: no losses"; return; }
    if [ "$(losses "$2")" = "$(losses "$3")" ]; then pass "$1: $n losses bitwise"
    else awk -v w="$w" -v t="$4" 'BEGIN {exit !(w < t)}' && pass "$1: worst loss rel diff $w over $n steps (< $4)" \
        || fail "$1: worst loss rel diff $w (>= $4)"; fi
}
for prec in fp32 bf16; do
    tol=1e-5; [ $prec = bf16 ] && tol=1e-2
    P=(--precision $prec)
    run "p-$prec" "${F[@]}" "${P[@]}"
    run "s-$prec" "${F[@]}" "${P[@]}" --schedule stream
    close "cuda $prec llama: LoRA stream vs plain" "$TMP/p-$prec" "$TMP/s-$prec" $tol
    run "s1-$prec" "${F[@]}" "${P[@]}" --schedule stream --stream-slots 1
    close "cuda $prec llama: LoRA stream --stream-slots 1 vs plain" "$TMP/p-$prec" "$TMP/s1-$prec" $tol
    run "sg-$prec" "${F[@]}" "${P[@]}" --schedule stream --gpu-layers 1 --ckpt-interval 1
    close "cuda $prec llama: LoRA stream --gpu-layers 1 --ckpt-interval 1 vs plain" "$TMP/p-$prec" "$TMP/sg-$prec" $tol
    run "gp-$prec" "${G[@]}" "${P[@]}"
    run "gs-$prec" "${G[@]}" "${P[@]}" --schedule stream --ckpt-interval 1
    close "cuda $prec gpt2 (seeded base): LoRA stream --ckpt-interval 1 vs plain" "$TMP/gp-$prec" "$TMP/gs-$prec" $tol
done
# nobubble plan's bytes against what the run allocated (its "allocated" line), within 1%
within() { awk -v a="$1" -v b="$2" 'BEGIN { d = a > 0 ? (a - b) / a : b; if (d < 0) d = -d; exit !(a != "" && b != "" && d < 0.01) }'; }
for v in "s-bf16|--gpu-layers 0" "sg-bf16|--gpu-layers 1 --ckpt-interval 1"; do
    tag=${v%%|*} extra=${v#*|}
    $NB plan "${F[@]}" --precision bf16 --schedule stream $extra --gpu-mem ${PLAN_GPU_MEM:-80G} --host-mem 64G >"$TMP/plan-$tag" 2>&1
    read -r ph pd <<< "$(sed -n 's/^bytes   stream host \([0-9]*\) device \([0-9]*\) .*/\1 \2/p' "$TMP/plan-$tag")"
    read -r ah ad <<< "$(sed -n 's/^allocated   host \([0-9]*\) bytes, device \([0-9]*\) bytes.*/\1 \2/p' "$TMP/$tag.log")"
    within "$ah" "$ph" && within "$ad" "$pd" \
        && pass "LoRA stream $extra: plan host $ph / device $pd bytes, the run $ah / $ad" \
        || fail "LoRA stream $extra: plan host '$ph' / device '$pd' bytes vs the run's '$ah' / '$ad'"
done
grep -q "0 B down" "$TMP/s1-bf16.log" && pass "cuda LoRA stream: $(grep -o 'per step: .*down' "$TMP/s1-bf16.log")" \
    || fail "cuda LoRA stream's copies: $(grep 'per step' "$TMP/s1-bf16.log")"
run r "${F[@]}" --precision bf16 --schedule stream --stop-after 6
run r "${F[@]}" --precision bf16 --schedule stream
same_state "cuda bf16 LoRA stream: stopped after 6 steps and resumed vs straight" "$TMP/s-bf16" "$TMP/r"
# eval of a stream LoRA checkpoint streams the base again: plain's loss (fp32: the same state, bitwise above)
ev() { $NB eval --ckpt "$1" --device cuda --data "$TMP/train.bin" --batches 4 2>"$1.eval.log" | grep -o 'loss [0-9.]* nats' | awk '{print $2}'; }
a=$(ev "$TMP/p-fp32") b=$(ev "$TMP/s1-fp32")
[ -n "$a" ] && [ "$a" = "$b" ] && grep -q '^stream ' "$TMP/s1-fp32.eval.log" \
    && pass "cuda fp32 eval of a stream LoRA checkpoint (streamed again) = plain's ($a)" || fail "cuda eval: stream '$b' vs plain '$a'"
finish
