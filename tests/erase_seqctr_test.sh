#!/usr/bin/env bash
# ERASE on seqctr (CPU lanes as threads; tests/gpu_seqctr_test.sh repeats it on the GPU):
#  - the detached model under --schedule plain and --schedule erase (blocking and async dispatch,
#    2 and 4 side lanes) gives bitwise-identical losses and weights after 20 steps;
#  - the same for a partial detachment (--detach 2,4) and for no detachment at all;
#  - erase records side-lane work overlapping the main lane (overlap_pct > 0 in metrics.jsonl);
#  - bad --detach / --schedule values end in one clear error line.
source "$(dirname "$0")/lib.sh"
SMALL="--emb-dim 16 --blocks 6 --cross-rank 32 --block-hidden 64 --batch 64 --steps 20 --eval-samples 512 --quiet"
SYNTH="synth:cap=1000,items=2000,calib=16384,max_len=16"
same() { # same NAME DIR_A DIR_B
    [ -n "$(losses "$2")" ] && [ "$(losses "$2")" = "$(losses "$3")" ] && cmp -s "$2/ckpt/model.safetensors" "$3/ckpt/model.safetensors" \
        && pass "$1: bitwise-identical losses and weights" || fail "$1: differs"
}
for det in all 2,4 none; do
    D=(--detach "$det"); [ "$det" = none ] && D=()
    $NB train --model seqctr --data "$SYNTH" $SMALL "${D[@]}" --schedule plain --out "$TMP/plain-$det" >/dev/null || fail "plain $det"
    for mode in "blocking 4" "async 4" "blocking 2" "async 2"; do
        set -- $mode
        $NB train --model seqctr --data "$SYNTH" $SMALL "${D[@]}" --schedule erase --erase-dispatch $1 --side-lanes $2 \
            --out "$TMP/erase-$det-$1-$2" >/dev/null || fail "erase $det $1 $2"
        same "detach $det: plain vs erase ($1 dispatch, $2 side lanes)" "$TMP/plain-$det" "$TMP/erase-$det-$1-$2"
    done
done
ov=$(grep -o '"overlap_pct":[0-9.e+-]*' "$TMP/erase-all-blocking-4/metrics.jsonl" | cut -d: -f2 | sort -g | tail -n 1)
awk -v o="$ov" 'BEGIN {exit !(o > 0)}' && pass "erase: side lanes overlap the main lane (max overlap_pct $ov)" \
    || fail "erase: no overlap recorded ($ov)"
$NB train --model seqctr --data "$SYNTH" $SMALL --detach all --schedule erase --trace "$TMP/t.json" >/dev/null \
    && grep -q '"side 3"' "$TMP/t.json" && pass "--trace writes a Chrome trace with the side lanes" || fail "trace"
expect_error "detach block 0" "block indices 1..5" $NB train --model seqctr --detach 0 $SMALL
expect_error "detach past the blocks" "block indices 1..5" $NB train --model seqctr --detach 7 $SMALL
expect_error "detach without aux" "aux-weight" $NB train --model seqctr --detach all --aux-weight 0 $SMALL
expect_error "unknown schedule" "unknown --schedule" $NB train --model seqctr --schedule foo $SMALL
expect_error "unknown dispatch" "unknown --erase-dispatch" $NB train --model seqctr --schedule erase --erase-dispatch x $SMALL
finish
