#!/usr/bin/env bash
# Bad input never crashes and never leaves a partial checkpoint: each case is one clear error
# line and a non-zero exit.
source "$(dirname "$0")/lib.sh"
need_sotu
T=(train --model gpt2-tiny --batch 2 --steps 2 --no-progress --val-data none)

expect_error "missing file" "not found" $NB "${T[@]}" --data "$TMP/nope.bin"
head -c 5000 "$TRAIN" > "$TMP/short.bin"
expect_error "truncated shard" "short.bin" $NB "${T[@]}" --data "$TMP/short.bin"
cp "$TRAIN" "$TMP/magic.bin"; printf 'XXXX' | dd of="$TMP/magic.bin" conv=notrunc status=none
expect_error "wrong magic" "magic" $NB "${T[@]}" --data "$TMP/magic.bin"
cp "$TRAIN" "$TMP/version.bin"; printf '\x07\x00\x00\x00' | dd of="$TMP/version.bin" bs=1 seek=4 conv=notrunc status=none
expect_error "wrong version" "version" $NB "${T[@]}" --data "$TMP/version.bin"
expect_error "token id >= vocab" "token" $NB "${T[@]}" --data "$TRAIN" --vocab 300
touch "$TMP/afile"
expect_error "unwritable --out" "$TMP/afile" $NB "${T[@]}" --data "$TRAIN" --out "$TMP/afile/run"
[ ! -e "$TMP/afile/run/ckpt" ] && pass "no checkpoint left behind" || fail "partial checkpoint"
expect_error "bad --steps value" "steps" $NB "${T[@]}" --steps abc
expect_error "negative --batch" "batch" $NB "${T[@]}" --batch -3
expect_error "bad --lr value" "lr" $NB "${T[@]}" --lr 1e-3x
expect_error "unknown --model" "unknown --model" $NB "${T[@]}" --model gpt5
expect_error "unknown flag" "unknown flag" $NB "${T[@]}" --stpes 3
expect_error "heads do not divide dim" "heads" $NB "${T[@]}" --heads 5
expect_error "resume from a non-checkpoint" "no checkpoint" $NB train --resume "$TMP"
expect_error "eval without --ckpt" "ckpt" $NB eval --data "$TRAIN"
expect_error "unknown command" "unknown command" $NB fly
S=(train --model seqctr --data synth:cap=100,max_len=8 --batch 16 --steps 1 --device cpu --no-progress)
expect_error "unknown --index-lists" "index-lists auto, host or device" $NB "${S[@]}" --index-lists gpu
expect_error "--index-lists device on the CPU" "index-lists host" $NB "${S[@]}" --index-lists device
expect_error "--graph-cache 0" "graph-cache" $NB "${S[@]}" --graphs --graph-cache 0

# A damaged checkpoint is refused with the file named, before any training.
$NB "${T[@]}" --data "$TRAIN" --out "$TMP/run" --quiet || fail "reference run"
cp -r "$TMP/run" "$TMP/bad1"; head -c 3000 "$TMP/run/ckpt/model.safetensors" > "$TMP/bad1/ckpt/model.safetensors"
expect_error "truncated model.safetensors" "model.safetensors" $NB train --resume "$TMP/bad1" --steps 4
cp -r "$TMP/run" "$TMP/bad2"; echo '{"format": "nobubble-checkpoint", "version": 1, "step":' > "$TMP/bad2/ckpt/state.json"
expect_error "damaged state.json" "state.json" $NB train --resume "$TMP/bad2" --steps 4
cp -r "$TMP/run" "$TMP/bad3"; sed -i 's/"version": 1/"version": 9/' "$TMP/bad3/ckpt/state.json"
expect_error "future checkpoint version" "version" $NB train --resume "$TMP/bad3" --steps 4
expect_error "other model shape" "shape\|layers\|weight" $NB train --resume "$TMP/run" --layers 3 --steps 4
finish
