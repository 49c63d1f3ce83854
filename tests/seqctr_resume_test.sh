#!/usr/bin/env bash
# seqctr in the one run directory (CPU; tests/gpu_seqctr_test.sh repeats the resume on the GPU):
#  - 10 steps, stop, resume to 20 == 20 straight, bitwise: weights, optimizer state (dense AdamW
#    moments, the tables' Adagrad sums or sparse-Adam moments), every metrics line; for adagrad
#    and sparse Adam, plain and erase, FWP with clustering (the loader reads a window ahead of
#    the step: the checkpoint's position must be the next window's, not the loader's), and with
#    --ckpt-every;
#  - 'train --resume DIR' writes to DIR (the README's split-run flow keeps its work);
#  - 'nobubble eval --ckpt DIR' prints the NE and AUC of the run's last evaluation;
#  - 'nobubble export --ckpt DIR --out FILE' writes every tensor under the documented names;
#  - the checkpoint's optimizer file holds the tables' state under the documented names.
source "$(dirname "$0")/lib.sh"
SC=(--model seqctr --data "synth:cap=1000,items=2000,calib=16384,max_len=16" --emb-dim 16 --blocks 4 --cross-rank 16
    --block-hidden 32 --batch 64 --steps 20 --eval-every 5 --eval-samples 512 --quiet)
get() { echo "$2" | tr ' ' '\n' | grep "^$1=" | cut -d= -f2; }
# metrics lines without the timing fields (ms, rates, bubbles differ between runs), and without
# pipe's re-synced row count: a resumed run's first window was fetched after the restore, so none
# of its rows went stale (0 where the straight run re-syncs; the weights are the same either way)
lines() { sed 's/,"ms".*//; s/,"rows_resynced":[0-9]*//' "$1/metrics.jsonl"; }
same() { # same NAME DIR_A DIR_B
    cmp -s "$2/ckpt/model.safetensors" "$3/ckpt/model.safetensors" && cmp -s "$2/ckpt/optim.safetensors" "$3/ckpt/optim.safetensors" \
        && [ "$(lines "$2")" = "$(lines "$3")" ] && [ "$(lines "$2" | wc -l)" -eq 20 ] \
        && pass "$1: resumed at step 10 == 20 straight (weights, optimizer state, 20 metrics lines)" || fail "$1: resume differs"
}
for v in "adagrad plain" "adam plain" "adagrad erase" "adam erase" "adagrad pipe"; do
    set -- $v
    X=(--emb-optim $1 --schedule $2); [ $2 = erase ] && X+=(--detach all --erase-dispatch async)
    [ $2 = pipe ] && X+=(--emb-shard row --micro-batches 4 --cluster-keys)
    $NB train "${SC[@]}" "${X[@]}" --out "$TMP/straight-$1-$2" >/dev/null || fail "straight $v"
    $NB train "${SC[@]}" "${X[@]}" --stop-after 10 --out "$TMP/split-$1-$2" >/dev/null || fail "first half $v"
    grep -q '"step": 10' "$TMP/split-$1-$2/ckpt/state.json" || fail "$v: the first half did not stop at step 10"
    $NB train --resume "$TMP/split-$1-$2" --quiet >/dev/null 2>&1 || fail "resume $v"
    same "$1, $2" "$TMP/straight-$1-$2" "$TMP/split-$1-$2"
done
# checkpoints every 7 steps: the resume from step 14's goes on to the same bits (a run stopped
# at 14 also evaluates there: its metrics line 14 has held-out fields the straight run's lacks)
$NB train "${SC[@]}" --ckpt-every 7 --stop-after 14 --out "$TMP/every" >/dev/null || fail "ckpt-every run"
grep -q '"step": 14' "$TMP/every/ckpt/state.json" && $NB train --resume "$TMP/every" --quiet >/dev/null 2>&1 \
    && cmp -s "$TMP/straight-adagrad-plain/ckpt/model.safetensors" "$TMP/every/ckpt/model.safetensors" \
    && cmp -s "$TMP/straight-adagrad-plain/ckpt/optim.safetensors" "$TMP/every/ckpt/optim.safetensors" \
    && [ "$(losses "$TMP/straight-adagrad-plain")" = "$(losses "$TMP/every")" ] \
    && pass "--ckpt-every 7, stopped at 14, resumed: the straight run's bits and losses" || fail "--ckpt-every resume"

out=$($NB train "${SC[@]}" --out "$TMP/ev" 2>/dev/null) || fail "eval run"
last=$(echo "$out" | grep "^eval step=20")
ev=$($NB eval --ckpt "$TMP/ev" 2>/dev/null | grep "^eval ")
for k in n loss ne auc base_rate; do
    [ -n "$(get $k "$last")" ] && [ "$(get $k "$last")" = "$(get $k "$ev")" ] || { fail "eval --ckpt: $k '$(get $k "$ev")' vs the run's '$(get $k "$last")'"; continue; }
done
[ "$(get ne "$last")" = "$(get ne "$ev")" ] && pass "eval --ckpt prints the run's last held-out NE $(get ne "$ev") and AUC $(get auc "$ev")"

$NB export --ckpt "$TMP/ev" --out "$TMP/seqctr.safetensors" 2>/dev/null || fail "export"
# the tensor names of safetensors files (node: installed with npm by scripts/setup.sh), one line each
st_names() {
    node -e 'const fs = require("fs");
        for (const p of process.argv.slice(1)) {
            const b = fs.readFileSync(p), n = Number(b.readBigUInt64LE(0)), h = JSON.parse(b.subarray(8, 8 + n).toString());
            console.log(Object.keys(h).filter(k => k !== "__metadata__").sort().join(" "));
            console.log("META " + ((h.__metadata__ || {})["seqctr.config"] || ""));
        }' "$@"
}
names=$(st_names "$TMP/seqctr.safetensors")
for t in bottom.0.weight hist.0.qkv.weight target.wq block.3.U block.3.head.b emb.cat.0 emb.cat.25 emb.item; do
    echo "$names" | tr ' ' '\n' | grep -qx "$t" || fail "export lacks $t"
done
echo "$names" | grep -q "^META E=16 " && pass "export: one safetensors file with the documented names and seqctr.config" \
    || fail "export metadata: $(echo "$names" | tail -1)"
onames=$(st_names "$TMP/straight-adam-plain/ckpt/optim.safetensors" "$TMP/straight-adagrad-plain/ckpt/optim.safetensors" | grep -v "^META")
echo "$onames" | head -1 | tr ' ' '\n' | grep -qx "emb.item.exp_avg_sq" && echo "$onames" | tail -1 | tr ' ' '\n' | grep -qx "emb.cat.3.adagrad_sum" \
    && echo "$onames" | tail -1 | tr ' ' '\n' | grep -qx "block.0.w1.exp_avg" \
    && pass "optim.safetensors: AdamW moments, sparse-Adam moments / Adagrad sums by table" || fail "optimizer tensor names"
expect_error "export with --hf" "--out FILE for seqctr" $NB export --ckpt "$TMP/ev" --hf "$TMP/hf"
expect_error "sample a seqctr run" "generates text" $NB sample --ckpt "$TMP/ev"
expect_error "a transformer flag" "applies to transformer" $NB train "${SC[@]}" --layers 3
expect_error "a seqctr flag" "applies to --model seqctr" $NB train --model gpt2-tiny --emb-dim 8 --steps 1
finish
