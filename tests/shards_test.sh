#!/usr/bin/env bash
# Several token shards (issue 36, 3): --data takes a quoted glob or a comma-separated list, read as
# one stream in the stated order (a glob's matches sorted by name, a list as given), printed at
# start. The run on 3 shards split from one file equals the run on that file bitwise (the stream
# is their concatenation; batches span the boundaries), and so does a run stopped with its next
# batch across a boundary and resumed. Every shard's header and size are checked before training.
source "$(dirname "$0")/lib.sh"
need_sotu

# le32 N: N as 4 little-endian bytes (printf escapes)
le32() { printf '\\x%02x\\x%02x\\x%02x\\x%02x' $(($1 & 255)) $(($1 >> 8 & 255)) $(($1 >> 16 & 255)) $(($1 >> 24 & 255)); }
# mkshard OUT SKIP COUNT: tokens [SKIP, SKIP+COUNT) of the training shard as a shard of their own
mkshard() {
    { printf "$(le32 20240520)$(le32 1)$(le32 $3)"; head -c 1012 /dev/zero
      tail -c +$((1024 + 2 * $2 + 1)) "$TRAIN" | head -c $((2 * $3)); } > "$1"
}
D=$TMP/d
mkdir -p "$D"
mkshard "$D/whole.bin" 0 3000
# 700 + 1300 + 1000: the 6th batch of 2 x 64 (tokens 640..768) spans the first boundary
mkshard "$D/train_02.bin" 2000 1000
mkshard "$D/train_00.bin" 0 700
mkshard "$D/train_01.bin" 700 1300
mkshard "$D/val_a.bin" 3000 300
mkshard "$D/val_b.bin" 3300 300
mkshard "$D/val.bin" 3000 600
# --eval-every 5 with --stop-after 5 below: the stopped run evaluates where the straight one does
COMMON=(--model gpt2-tiny --batch 2 --steps 12 --eval-every 5 --eval-batches 2 --no-progress)

$NB train "${COMMON[@]}" --data "$D/whole.bin" --val-data "$D/val.bin" --out "$TMP/whole" 2>"$TMP/whole.err" \
    || { fail "run on one shard"; tail -3 "$TMP/whole.err"; }
$NB train "${COMMON[@]}" --data "$D/train_*.bin" --val-data "$D/val_?.bin" --out "$TMP/glob" 2>"$TMP/glob.err" \
    || { fail "run on a glob"; tail -3 "$TMP/glob.err"; }
same_state "a glob of 3 shards (split from one) == the one shard" "$TMP/whole" "$TMP/glob"
line=$(grep "^data " "$TMP/glob.err")
echo "$line" | grep -q "3,000 tokens, read in this order: 3 shards: $D/train_00.bin, $D/train_01.bin, $D/train_02.bin$" \
    && pass "the order is printed at start: $line" || fail "start line: '$line'"
grep -q "final validation loss [0-9.]* (2 batches of 2 x 64 tokens = 256 tokens of 2 shards: $D/val_a.bin, $D/val_b.bin)" "$TMP/glob.err" \
    && pass "the final line names the validation shards" || { fail "final line"; grep "^done" "$TMP/glob.err"; }

$NB train "${COMMON[@]}" --data "$D/train_00.bin,$D/train_01.bin,$D/train_02.bin" --val-data "$D/val.bin" --out "$TMP/list" \
    --quiet 2>/dev/null || fail "run on a list"
same_state "a comma-separated list == the one shard" "$TMP/whole" "$TMP/list"

# stopped after 5 steps: the checkpoint's data_pos (640) is a batch that spans train_00 and train_01
$NB train "${COMMON[@]}" --data "$D/train_*.bin" --val-data "$D/val_?.bin" --out "$TMP/split" --stop-after 5 --quiet 2>/dev/null \
    || fail "first half"
grep -q '"data_pos": 640' "$TMP/split/ckpt/state.json" && pass "stopped with data_pos 640 (a batch across a shard boundary)" \
    || fail "data_pos: $(grep data_pos "$TMP/split/ckpt/state.json")"
$NB train --resume "$TMP/split" --no-progress --quiet 2>/dev/null || fail "resume"
same_state "resumed across a shard boundary == straight" "$TMP/whole" "$TMP/split"

# a list states its own order: the same shards in another order train on other tokens
$NB train "${COMMON[@]}" --data "$D/train_02.bin,$D/train_00.bin,$D/train_01.bin" --val-data "$D/val.bin" --out "$TMP/order" \
    2>"$TMP/order.err" || fail "run on a reordered list"
grep -q "read in this order: 3 shards: $D/train_02.bin, $D/train_00.bin, $D/train_01.bin$" "$TMP/order.err" \
    && ! cmp -s "$TMP/whole/ckpt/model.safetensors" "$TMP/order/ckpt/model.safetensors" \
    && pass "a list is read in the order given" || fail "reordered list"

# eval takes the same forms
e1=$($NB eval --ckpt "$TMP/whole" --data "$D/val.bin" --batches 0 2>/dev/null | grep -o "^loss [0-9.]*")
all=$($NB eval --ckpt "$TMP/whole" --data "$D/val_*.bin" --batches 0 2>/dev/null)
e2=$(echo "$all" | grep -o "^loss [0-9.]*")
[ -n "$e1" ] && [ "$e1" = "$e2" ] && pass "eval on a glob == eval on the concatenation ($e1)" || fail "eval: '$e1' vs '$e2'"
echo "$all" | grep -q "on 4 batches of 2 x 64 tokens = 512 tokens of all of 2 shards: $D/val_a.bin, $D/val_b.bin," \
    && pass "--batches 0 says it covers all of the data" || fail "--batches 0: '$all'"

# refused before training, naming the shard
cp "$D/train_01.bin" "$D/bad_01.bin"; printf 'XXXX' | dd of="$D/bad_01.bin" conv=notrunc status=none
cp "$D/train_00.bin" "$D/bad_00.bin"
expect_error "a bad magic in the 2nd shard" "bad_01.bin' is not a token shard" $NB train "${COMMON[@]}" --data "$D/bad_*.bin" --val-data none
head -c 2000 "$D/train_01.bin" > "$D/cut_01.bin"; cp "$D/train_00.bin" "$D/cut_00.bin"
expect_error "a truncated 2nd shard" "cut_01.bin' is truncated" $NB train "${COMMON[@]}" --data "$D/cut_*.bin" --val-data none
expect_error "a glob that matches nothing" "no file matches '$D/nope_\*.bin'; looked at" $NB train "${COMMON[@]}" --data "$D/nope_*.bin"
expect_error "a shard named twice" "names the shard '$D/train_00.bin' twice" \
    $NB train "${COMMON[@]}" --data "$D/train_00.bin,$D/train_*.bin" --val-data none
expect_error "a glob the shell expanded" "unexpected argument '$D/train_01.bin'.*quote the glob" \
    $NB train "${COMMON[@]}" --data $D/train_0*.bin
finish
