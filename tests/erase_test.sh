#!/usr/bin/env bash
# ERASE on the transformers (CPU lanes as threads; the GPU half is in tests/gpu_train_test.sh):
#  - the detached model (--detach) under --schedule plain and --schedule erase (blocking and async
#    dispatch, 1 and 2 side lanes, with and without --graphs) gives bitwise-identical losses,
#    weights and AdamW state after 8 steps, for gpt2-tiny (4 layers, 3 segments) and llama-tiny;
#  - erase without --detach is plain; detaching changes the training (it is a different model);
#  - erase records side-lane work overlapping the main lane (overlap_pct), timeline.svg and the
#    p90 line are written;
#  - the same schedules (and --schedule stream) run clean under ThreadSanitizer (a -fsanitize=thread build of nobubble,
#    OpenMP at one thread: libgomp is not instrumented), for the transformer and for seqctr;
#  - bad --detach / --erase-dispatch combinations end in one clear error line.
source "$(dirname "$0")/lib.sh"
need_sotu
# the ThreadSanitizer build of nobubble (below) compiles while the plain runs train
TS=${NB_BUILD}-tsan
make -s -C "$ROOT" -j"$(env -u OMP_NUM_THREADS nproc)" NB_CUDA=0 BUILD="$TS" OPT="-O1 -g" SANITIZE=-fsanitize=thread "$TS/nobubble" > "$TMP/tsan-build.log" 2>&1 &
tsan_build=$!
C=(--batch 2 --steps 8 --data "$TRAIN" --val-data none --eval-every 0 --no-progress --quiet --seed 7)
same() { # same NAME DIR_A DIR_B
    [ -n "$(losses "$2")" ] && [ "$(losses "$2")" = "$(losses "$3")" ] \
        && cmp -s "$2/ckpt/model.safetensors" "$3/ckpt/model.safetensors" \
        && cmp -s "$2/ckpt/optim.safetensors" "$3/ckpt/optim.safetensors" \
        && pass "$1: bitwise-identical losses, weights and AdamW state" || fail "$1: differs"
}
G=(--model gpt2-tiny --layers 4 --detach 1,3)
$NB train "${C[@]}" "${G[@]}" --schedule plain --out "$TMP/g-plain" || fail "gpt2 plain"
for v in "blocking 2" "async 2" "blocking 1" "async 1"; do
    set -- $v
    $NB train "${C[@]}" "${G[@]}" --schedule erase --erase-dispatch $1 --side-lanes $2 --out "$TMP/g-$1-$2" \
        || fail "gpt2 erase $1 $2"
    same "gpt2-tiny, 3 segments: plain vs erase ($1, $2 side lanes)" "$TMP/g-plain" "$TMP/g-$1-$2"
done
$NB train "${C[@]}" "${G[@]}" --schedule erase --graphs --out "$TMP/g-graphs" || fail "gpt2 erase graphs"
same "gpt2-tiny, 3 segments: plain vs erase with --graphs" "$TMP/g-plain" "$TMP/g-graphs"
$NB train "${C[@]}" --model llama-tiny --detach 1 --schedule plain --out "$TMP/l-plain" || fail "llama plain"
$NB train "${C[@]}" --model llama-tiny --detach 1 --schedule erase --erase-dispatch async --out "$TMP/l-erase" \
    || fail "llama erase"
same "llama-tiny, 2 segments: plain vs erase (async)" "$TMP/l-plain" "$TMP/l-erase"
$NB train "${C[@]}" --model gpt2-tiny --layers 4 --schedule plain --out "$TMP/u-plain" || fail "undetached plain"
$NB train "${C[@]}" --model gpt2-tiny --layers 4 --schedule erase --out "$TMP/u-erase" 2>/dev/null || fail "undetached erase"
same "no --detach: erase is plain" "$TMP/u-plain" "$TMP/u-erase"
[ "$(losses "$TMP/u-plain" | tail -n 1)" != "$(losses "$TMP/g-plain" | tail -n 1)" ] \
    && pass "detaching changes the training (last loss $(losses "$TMP/u-plain" | tail -n 1) vs $(losses "$TMP/g-plain" | tail -n 1))" \
    || fail "detached and undetached runs are identical"
ov=$(grep -o '"overlap_pct":[0-9.e+-]*' "$TMP/g-blocking-2/metrics.jsonl" | cut -d: -f2 | sort -g | tail -n 1)
awk -v o="$ov" 'BEGIN {exit !(o > 0)}' && pass "erase: side lanes overlap the main lane (max overlap_pct $ov)" \
    || fail "erase: no overlap recorded ($ov)"
grep -q "side 1" "$TMP/g-blocking-2/timeline.svg" && pass "timeline.svg has the side lanes" || fail "timeline.svg"
$NB train --batch 2 --steps 24 --data "$TRAIN" --val-data none --eval-every 0 --no-progress "${G[@]}" --schedule erase \
    --out "$TMP/p90" 2>&1 | grep -q "^throughput  p90" \
    && pass "the summary prints p90 tokens/s" || fail "no p90 line"

expect_error "detach 0" "outside 1..3" $NB train "${C[@]}" --model gpt2-tiny --layers 4 --detach 0
expect_error "detach past the layers" "outside 1..3" $NB train "${C[@]}" --model gpt2-tiny --layers 4 --detach 4
expect_error "detach not increasing" "not increasing" $NB train "${C[@]}" --model gpt2-tiny --layers 4 --detach 3,1
expect_error "detach without aux" "aux-weight" $NB train "${C[@]}" --model gpt2-tiny --layers 4 --detach 1 --aux-weight 0
expect_error "graphs with async" "blocking with --graphs" $NB train "${C[@]}" --model gpt2-tiny --detach 1 \
    --schedule erase --erase-dispatch async --graphs

# ThreadSanitizer: the lanes, the schedules and the work items, with real ops
if wait $tsan_build; then
    export OMP_WAIT_POLICY=passive OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 TSAN_OPTIONS="halt_on_error=1 exitcode=66"
    T=(--batch 2 --steps 3 --data "$TRAIN" --val-data none --eval-every 0 --no-progress --quiet)
    "$TS/nobubble" train "${T[@]}" "${G[@]}" --schedule erase --erase-dispatch async --side-lanes 2 --out "$TMP/ts1" \
        > "$TMP/ts.log" 2>&1 && pass "TSan: transformer erase (async dispatch) is race-free" || { fail "TSan transformer async"; tail -30 "$TMP/ts.log"; }
    "$TS/nobubble" train "${T[@]}" "${G[@]}" --schedule erase --graphs --out "$TMP/ts2" > "$TMP/ts.log" 2>&1 \
        && pass "TSan: transformer erase with --graphs is race-free" || { fail "TSan transformer graphs"; tail -30 "$TMP/ts.log"; }
    "$TS/nobubble" train --model seqctr --steps 4 --batch 32 --emb-dim 16 --blocks 3 --cross-rank 16 --block-hidden 16 \
        --detach all --schedule erase --erase-dispatch async --eval-samples 64 --quiet --out "$TMP/ts3" > "$TMP/ts.log" 2>&1 \
        && pass "TSan: seqctr erase (async dispatch) is race-free" || { fail "TSan seqctr"; tail -30 "$TMP/ts.log"; }
    # the stream schedule's lanes too (h2d, d2h, host, optim; evaluation between steps)
    "$TS/nobubble" train --batch 2 --steps 4 --data "$TRAIN" --val-data "$VAL" --eval-every 2 --eval-batches 1 \
        --no-progress --quiet --model gpt2-tiny --layers 3 --schedule stream --ckpt-interval 2 --grad-clip 0 --out "$TMP/ts4" \
        > "$TMP/ts.log" 2>&1 \
        && pass "TSan: stream schedule (recompute, overlapped optimizer, evaluation) is race-free" \
        || { fail "TSan stream"; tail -30 "$TMP/ts.log"; }
else
    fail "ThreadSanitizer build of nobubble"; tail -20 "$TMP/tsan-build.log"
fi
finish
