#!/usr/bin/env bash
# The run directory under misuse (issue 14's trainer-side items), for both model families:
#  - one writer per run directory: a second train on the same --out fails at start naming the
#    holder's pid; eval / sample / export while a run checkpoints every step delete nothing;
#  - SIGTERM / SIGINT: the step finishes, a checkpoint is written, exit 143 / 130 with a line that
#    says how to resume, and the resumed run is bitwise a straight one; a second Ctrl-C ends the
#    process at once;
#  - a loss or weight that stops being finite ends the run naming the step (1-based) and the
#    tensor; no checkpoint is written and the last good one stays usable;
#  - 'train --resume DIR' writes to DIR (the README's split-run flow keeps its work), and a flag
#    that changes the math says the resumed run is no longer bitwise;
#  - option values the flags refuse are refused (and a state.json holding them too).
source "$(dirname "$0")/lib.sh"
need_sotu
T=(--model gpt2-tiny --batch 2 --data "$TRAIN" --val-data none --no-progress --quiet)
SC=(--model seqctr --data "synth:cap=1000,items=2000,calib=16384,max_len=16" --emb-dim 16 --blocks 2 --cross-rank 16
    --block-hidden 32 --batch 64 --eval-samples 256 --quiet)

# ---- the lock
$NB train "${T[@]}" --steps 100000 --ckpt-every 1 --out "$TMP/live" >/dev/null 2>&1 & P=$!
for i in $(seq 1 100); do [ -f "$TMP/live/ckpt/state.json" ] && break; sleep 0.1; done
expect_error "a second writer" "in use by nobubble pid $P" $NB train "${T[@]}" --steps 5 --out "$TMP/live"
expect_error "a resume of a live run" "in use by nobubble pid $P" $NB train --resume "$TMP/live"
bad=0
for i in $(seq 1 20); do
    $NB eval --ckpt "$TMP/live" --data "$VAL" --batches 1 >/dev/null 2>&1 || bad=$((bad+1))
done
kill -0 $P 2>/dev/null && pass "20 evals during a run that checkpoints every step: the run goes on ($bad evals raced a swap)" \
    || fail "the run died while evals read its directory"
kill -TERM $P; wait $P; rc=$?
[ $rc -eq 143 ] && pass "SIGTERM: exit 143" || fail "SIGTERM: exit $rc (want 143)"
ls -a "$TMP/live" | grep -q 'tmp\|old' && fail "leftover temp dirs: $(ls -a "$TMP/live")" || pass "no ckpt.tmp / ckpt.old left behind"

# ---- signals: stop with a checkpoint, resume bitwise
for sig in TERM INT; do
    want=$([ $sig = TERM ] && echo 143 || echo 130)
    $NB train "${SC[@]}" --steps 400 --out "$TMP/sig-$sig" >/dev/null 2>"$TMP/sig-$sig.err" & P=$!
    for i in $(seq 1 200); do [ "$(cat "$TMP/sig-$sig/metrics.jsonl" 2>/dev/null | wc -l)" -ge 5 ] && break; sleep 0.05; done
    kill -$sig $P; wait $P; rc=$?
    n=$(grep -o '"step": [0-9]*' "$TMP/sig-$sig/ckpt/state.json" | grep -o '[0-9]*$')
    [ $rc -eq $want ] && [ -n "$n" ] && grep -q "resume with: nobubble train --resume $TMP/sig-$sig" "$TMP/sig-$sig.err" \
        && pass "SIG$sig: exit $rc after step $n with a checkpoint and a resume line" || { fail "SIG$sig: exit $rc, step '$n'"; cat "$TMP/sig-$sig.err"; }
    $NB train --resume "$TMP/sig-$sig" --steps 60 --quiet >/dev/null 2>&1 || fail "resume after SIG$sig"
done
$NB train "${SC[@]}" --steps 60 --out "$TMP/straight" >/dev/null 2>&1 || fail "straight run"
cmp -s "$TMP/straight/ckpt/model.safetensors" "$TMP/sig-TERM/ckpt/model.safetensors" \
    && cmp -s "$TMP/straight/ckpt/optim.safetensors" "$TMP/sig-TERM/ckpt/optim.safetensors" \
    && pass "stopped by SIGTERM, resumed to 60 steps: bitwise 60 straight" || fail "SIGTERM + resume differs from straight"
# a second Ctrl-C while the first one's step and checkpoint run: at once
$NB train --model gpt2-mini --batch 8 --data "$TRAIN" --val-data none --no-progress --quiet --steps 1000 --out "$TMP/int2" \
    >/dev/null 2>&1 & P=$!
# once it trains: a background job of a script starts with SIGINT ignored until the run's handler is in
for i in $(seq 1 600); do [ -s "$TMP/int2/metrics.jsonl" ] && break; sleep 0.1; done
kill -INT $P; kill -INT $P; t0=$(date +%s%N); wait $P; rc=$?; dt=$(( ($(date +%s%N) - t0) / 1000000 ))
[ $rc -eq 130 ] && [ $dt -lt 5000 ] && pass "a second SIGINT ends the process at once (exit $rc after $dt ms)" \
    || fail "second SIGINT: exit $rc after $dt ms"

# ---- not finite: named, nothing saved, the last checkpoint stays
$NB train "${T[@]}" --steps 3 --out "$TMP/nan" >/dev/null 2>&1 || fail "nan: first part"
# lr 1e30: step 4's update leaves huge but finite weights (its checkpoint is written), step 5's NaN
expect_error "a weight turns NaN" "step 5: the weight wte .* is not finite" $NB train --resume "$TMP/nan" --steps 8 --lr 1e30 --ckpt-every 1
grep -q '"step": 4' "$TMP/nan/ckpt/state.json" && pass "no checkpoint of step 5: step 4's stays" || fail "nan: the last checkpoint"
# step 4's weights are finite but huge: eval says their loss is not finite instead of printing nan
expect_error "eval of a diverged checkpoint" "loss of .* is not finite" $NB eval --ckpt "$TMP/nan" --data "$VAL" --batches 1
expect_error "seqctr: a weight turns inf" "step [0-9]*: the weight .* is not finite" $NB train "${SC[@]}" --steps 20 --lr 1e30 --emb-lr 1e30

# ---- the same command again on a run directory with a checkpoint resumes it (issue 36, 1)
$NB train "${T[@]}" --steps 8 --stop-after 4 --out "$TMP/again" >/dev/null 2>&1 || fail "again: first part"
$NB train "${T[@]}" --steps 8 --out "$TMP/again" 2>"$TMP/again.err" >/dev/null || fail "again: the rerun"
$NB train "${T[@]}" --steps 8 --out "$TMP/again-straight" >/dev/null 2>&1 || fail "again: straight"
grep -q "holds a checkpoint: resuming it (pass --fresh to start over there)" "$TMP/again.err" \
    && cmp -s "$TMP/again/ckpt/model.safetensors" "$TMP/again-straight/ckpt/model.safetensors" \
    && [ "$(wc -l < "$TMP/again/metrics.jsonl")" -eq 8 ] \
    && pass "rerunning the command resumed at step 4 and ended bitwise the straight 8 steps (8 metrics lines)" \
    || fail "the rerun did not resume: $(cat "$TMP/again.err")"
out=$($NB train "${T[@]}" --steps 3 --out "$TMP/again" 2>&1)
grep -q '"step": 8' "$TMP/again/ckpt/state.json" && echo "$out" | grep -q "nothing to do: the checkpoint is at step 8" \
    && pass "a shorter rerun overwrites nothing (nothing to do: step 8 kept)" || fail "a shorter rerun: $out"
$NB train "${T[@]}" --steps 3 --out "$TMP/again" --fresh >/dev/null 2>&1 && grep -q '"step": 3' "$TMP/again/ckpt/state.json" \
    && [ "$(wc -l < "$TMP/again/metrics.jsonl")" -eq 3 ] && pass "--fresh starts over" || fail "--fresh"
$NB train --help | grep -q -- "--ckpt-minutes M" && pass "--ckpt-minutes is an option (default $($NB train --help | grep -o -- '--ckpt-minutes M.*' | grep -o '\[[0-9]*\]'))" \
    || fail "--ckpt-minutes missing from --help"

# ---- --resume DIR writes to DIR
$NB train "${T[@]}" --steps 20 --stop-after 10 --out "$TMP/split" >/dev/null 2>&1 || fail "split: first part"
$NB train --resume "$TMP/split" --quiet >/dev/null 2>&1 || fail "split: resume"
grep -q '"step": 20' "$TMP/split/ckpt/state.json" && [ "$(wc -l < "$TMP/split/metrics.jsonl")" -eq 20 ] \
    && pass "train --resume DIR wrote steps 11-20 to DIR (state.json at 20, 20 metrics lines)" || fail "resume did not write to DIR"
err=$($NB train --resume "$TMP/split" --steps 30 --batch 3 --quiet 2>&1 >/dev/null)
echo "$err" | grep -q "note: --batch 3 differs from the checkpoint's 2: the resumed run is no longer bitwise" \
    && pass "a resume with another --batch says it is no longer bitwise" || fail "no note for --batch: $err"

# ---- values the flags refuse
for f in "--lr -1" "--lr 0" "--grad-clip -1" "--weight-decay -10" "--min-lr-frac 100" "--time-limit -1" "--warmup -5"; do
    set -- $f
    expect_error "$f" "$1 \(is\|takes\)" $NB train "${T[@]}" --steps 1 $f
done
expect_error "--seq 2147483647" "tokens per step: more than 2^31" $NB train --model gpt2-tiny --seq 2147483647 --steps 1 --data "$TRAIN" --val-data none
$NB train --model gpt2-tiny --seq 2147483647 --steps 1 --data "$TRAIN" --val-data none 2>&1 | grep -q "= 17179869176 tokens/step" \
    && pass "the configuration prints 8 x 2147483647 = 17179869176 tokens/step (no 32-bit overflow)" || fail "tokens/step printed wrong"
sed 's/"batch": [0-9]*,/"batch": 0,/' "$TMP/split/ckpt/state.json" > "$TMP/st" && cp "$TMP/st" "$TMP/split/ckpt/state.json"
expect_error "state.json batch 0" "--batch is 0" $NB train --resume "$TMP/split" --steps 30
finish
