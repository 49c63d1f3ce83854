#!/usr/bin/env bash
# Evaluation agrees with training, and default paths do not depend on the working directory
# (issue 36, 2 and 3):
#  - 'eval --ckpt DIR' with no other flag prints the loss that training's last line printed: the
#    run's validation data, --batch and --eval-batches come from its state.json, and both lines
#    say what they cover (N batches of B x T tokens = M tokens of FILE);
#  - train, eval and sample with their default data (data/sotu/*.bin, data/gpt2) work from
#    another directory (found next to the binary), or through NB_DATA_DIR, and a missing default
#    names every place looked.
source "$(dirname "$0")/lib.sh"
need_sotu
[ -f "$ROOT/data/gpt2/encoder.json" ] || { echo "no data/gpt2 (scripts/fetch_data.sh tokenizer)"; exit 77; }
mkdir -p "$TMP/elsewhere"
cd "$TMP/elsewhere" || exit 1

# default --data and --val-data, run from a directory without data/
$NB train --model gpt2-tiny --batch 2 --steps 3 --eval-batches 3 --threads 2 --out run 2>"$TMP/train.err" \
    || { fail "train from another directory"; tail -3 "$TMP/train.err"; }
final=$(grep -o "final validation loss [0-9.]* (.*)" "$TMP/train.err")
[ -n "$final" ] && pass "train from another directory: $final" || fail "no final validation line"
echo "$final" | grep -q "(3 batches of 2 x 64 tokens = 384 tokens of $ROOT/data/sotu/val.bin)" \
    && pass "the final line says what it covers" || fail "final line: '$final'"
ev=$($NB eval --ckpt run --threads 2 2>/dev/null)
echo "$ev" | grep -q "^loss [0-9.]* nats/token (perplexity [0-9.]*) on 3 batches of 2 x 64 tokens = 384 tokens of $ROOT/data/sotu/val.bin, checkpoint" \
    && pass "eval's line says what it covers: ${ev%%, checkpoint*}" || fail "eval line: '$ev'"
t=$(echo "$final" | grep -o "loss [0-9.]*" | cut -d' ' -f2)
e=$(echo "$ev" | grep -o "^loss [0-9.]*" | cut -d' ' -f2)
[ -n "$t" ] && [ "$t" = "$e" ] && pass "eval with the defaults == train's final validation loss ($e)" || fail "train $t vs eval $e"
# and to all the digits metrics.jsonl keeps: eval with its run's settings is the same computation
v=$(grep -o '"val_loss":[0-9.e+-]*' run/metrics.jsonl | tail -1 | cut -d: -f2)
e4=$(awk -v v="$v" 'BEGIN { printf "%.4f", v }')
[ "$e4" = "$e" ] && pass "metrics.jsonl's last val_loss $v rounds to eval's $e" || fail "metrics $v vs eval $e"
out=$($NB sample --ckpt run --tokens 4 --threads 2 2>&1) && pass "sample finds data/gpt2 from another directory" \
    || { fail "sample from another directory"; echo "$out" | tail -2; }

# a binary whose repository has no data/: NB_DATA_DIR, else an error naming every place looked
mkdir -p "$TMP/copy/build"
cp "$NB" "$TMP/copy/build/nobubble"
NBC=$TMP/copy/build/nobubble
expect_error "default data missing" \
    "training data: 'data/sotu/train.bin' not found; looked at data/sotu/train.bin (in the working directory $TMP/elsewhere), $TMP/copy/data/sotu/train.bin (next to the binary)" \
    $NBC train --model gpt2-tiny --steps 1
expect_error "default tokenizer missing" "tokenizer folder 'data/gpt2' not found; looked at .*NB_DATA_DIR" \
    env NB_DATA_DIR="$TMP/nothing" $NBC sample --ckpt run --tokens 1
NB_DATA_DIR=$ROOT/data $NBC train --model gpt2-tiny --batch 2 --steps 1 --eval-batches 1 --threads 2 --out env 2>"$TMP/env.err" \
    && grep -q "tokens of $ROOT/data/sotu/val.bin" "$TMP/env.err" && pass "NB_DATA_DIR stands for data/" \
    || { fail "NB_DATA_DIR"; tail -3 "$TMP/env.err"; }
# an installed binary (make install: PREFIX/bin/nobubble) finds PREFIX/share/nobubble/data
mkdir -p "$TMP/inst/bin" "$TMP/inst/share/nobubble/data"
cp "$NB" "$TMP/inst/bin/nobubble"
ln -s "$ROOT/data/sotu" "$TMP/inst/share/nobubble/data/sotu"
"$TMP/inst/bin/nobubble" train --model gpt2-tiny --batch 2 --steps 1 --eval-batches 1 --threads 2 --out inst 2>"$TMP/inst.err" \
    && grep -q "tokens of $TMP/inst/share/nobubble/data/sotu/val.bin" "$TMP/inst.err" \
    && pass "an installed binary finds PREFIX/share/nobubble/data" || { fail "installed binary's data"; tail -3 "$TMP/inst.err"; }
make -s -C "$ROOT" -n install PREFIX="$TMP/p" | grep -q "install -D -m 755 build.*/nobubble $TMP/p/bin/nobubble" \
    && pass "make install puts the binary in PREFIX/bin" || fail "make -n install"
finish
