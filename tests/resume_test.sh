#!/usr/bin/env bash
# Bitwise resume: 10 steps, a checkpoint, then resume to 20 gives the same bytes (weights, AdamW
# moments) and the same losses as 20 steps straight. Also: two runs with one seed are identical,
# and replaying a captured step (--graphs) computes what the eager steps compute.
source "$(dirname "$0")/lib.sh"
need_sotu
COMMON=(--model gpt2-tiny --batch 2 --steps 20 --eval-every 5 --eval-batches 2 --data "$TRAIN" --val-data "$VAL" --no-progress --quiet)

$NB train "${COMMON[@]}" --out "$TMP/straight" || fail "straight run"
$NB train "${COMMON[@]}" --out "$TMP/again" || fail "second straight run"
$NB train "${COMMON[@]}" --out "$TMP/graphs" --graphs || fail "run with --graphs"
$NB train "${COMMON[@]}" --out "$TMP/split" --stop-after 10 || fail "first half"
grep -q '"step":10,' "$TMP/split/metrics.jsonl" && ! grep -q '"step":11,' "$TMP/split/metrics.jsonl" \
    && pass "stopped after 10 steps" || fail "first half did not stop at step 10"
$NB train --resume "$TMP/split" --out "$TMP/split" --no-progress --quiet || fail "resume"

for f in model.safetensors optim.safetensors; do
    cmp -s "$TMP/straight/ckpt/$f" "$TMP/again/ckpt/$f" && pass "same seed, same bits: $f" || fail "two runs differ: $f"
    cmp -s "$TMP/straight/ckpt/$f" "$TMP/split/ckpt/$f" && pass "resume is bitwise: $f" || fail "resumed $f differs"
    cmp -s "$TMP/straight/ckpt/$f" "$TMP/graphs/ckpt/$f" && pass "captured and replayed steps (--graphs) are bitwise: $f" || fail "--graphs changed $f"
done
losses() { grep -o '"step":[0-9]*,"loss":[^,]*\(,"val_loss":[^,]*\)\?' "$1/metrics.jsonl"; }
if [ "$(losses "$TMP/straight")" = "$(losses "$TMP/split")" ] && [ "$(losses "$TMP/straight" | wc -l)" -eq 20 ]; then
    pass "losses of all 20 steps identical (incl. validation)"
else
    fail "loss curves differ"; diff <(losses "$TMP/straight") <(losses "$TMP/split") | head
fi
grep -q '"step": 20' "$TMP/split/ckpt/state.json" && pass "state.json at step 20" || fail "state.json step"
ls "$TMP/split" | grep -q 'tmp\|old' && fail "leftover temp dirs: $(ls "$TMP/split")" || pass "no leftover temp files"
[ -s "$TMP/split/loss.svg" ] && grep -q '</svg>' "$TMP/split/loss.svg" && pass "loss.svg written" || fail "loss.svg"

# --ckpt-weights-only: the weights as the straight run's, no optimizer state; eval reads it,
# --resume refuses with one line
$NB train "${COMMON[@]}" --out "$TMP/wonly" --ckpt-weights-only || fail "run with --ckpt-weights-only"
cmp -s "$TMP/straight/ckpt/model.safetensors" "$TMP/wonly/ckpt/model.safetensors" && [ ! -e "$TMP/wonly/ckpt/optim.safetensors" ] \
    && pass "--ckpt-weights-only: the same weights, no optim.safetensors" || fail "--ckpt-weights-only checkpoint"
$NB eval --ckpt "$TMP/wonly" --data "$VAL" --batches 2 > /dev/null 2>&1 && pass "eval reads a weights-only checkpoint" || fail "eval of a weights-only checkpoint"
$NB train --resume "$TMP/wonly" --steps 21 --no-progress --quiet > /dev/null 2> "$TMP/wonly.err"; rc=$?
[ $rc -ne 0 ] && [ "$(grep -c 'error:' "$TMP/wonly.err")" = 1 ] && grep -q 'ckpt-weights-only' "$TMP/wonly.err" \
    && pass "resume of a weights-only checkpoint refused in one line" || { fail "resume of a weights-only checkpoint (exit $rc)"; cat "$TMP/wonly.err"; }
finish
