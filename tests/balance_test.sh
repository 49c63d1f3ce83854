#!/usr/bin/env bash
# FreeScale's length-balanced placement (--balance) and emulated ranks (--emulate-ranks), on CPU
# ranks (mpirun --oversubscribe --allow-run-as-root) with heavy-tailed history lengths:
#  - every global batch keeps its samples: the multiset of (step, sample index) trained over all
#    ranks is each index of each step exactly once (NB_SAMPLES_LOG), for none, fbs and vbs;
#  - fbs and vbs at N = 2, 4 follow the unbalanced run (step losses within 1e-5 relative over 20
#    steps: only the summation order moves); the same settings twice are bitwise;
#  - --emulate-ranks N in one process follows N real ranks (1e-5) and reports the straggler share
#    (timings: printed, not asserted) and the cost fit's exponent;
#  - a stopped and resumed balanced run (vbs, 2 ranks, 2 micro-batches) is bitwise a straight one;
#  - bad settings are clear errors.
source "$(dirname "$0")/lib.sh"
command -v mpirun >/dev/null || { echo "skip: no mpirun (install openmpi-bin: scripts/setup.sh)"; exit 77; }
MPI=(mpirun --oversubscribe --allow-run-as-root)
C=(--model seqctr --data "synth:cap=1000,items=2000,calib=16384,max_len=256,hist_alpha=1.0,hist_scale=16" --emb-dim 16
   --blocks 2 --cross-rank 16 --block-hidden 32 --batch 64 --steps 20 --eval-samples 256 --quiet --threads 1 --seed 3 --no-ckpt)
run() { # run NAME CMD...: the command's output in $TMP/NAME.log; a failure is reported with its tail
    local name=$1; shift
    "$@" >"$TMP/$name.log" 2>&1 || { fail "$name (exit $?)"; tail -n 5 "$TMP/$name.log"; }
}
samples_kept() { # samples_kept PREFIX STEPS BATCH: every step trained each index 0..BATCH-1 once
    cat "$1".* | awk -v S="$2" -v B="$3" '{ n[$1 " " $4]++; c++ } END {
        for (s = 0; s < S; s++) for (i = 0; i < B; i++) if (n[s " " i] != 1) { print "step " s " sample " i ": " n[s " " i] + 0; exit 1 }
        if (c != S * B) { print c " lines, " S * B " expected"; exit 1 } }'
}

run one $NB train "${C[@]}" --out "$TMP/one"
for n in 2 4; do
    for b in none fbs vbs; do
        NB_SAMPLES_LOG=$TMP/s-$n-$b run np$n-$b "${MPI[@]}" -np $n $NB train "${C[@]}" --balance $b --out "$TMP/np$n-$b"
        why=$(samples_kept "$TMP/s-$n-$b" 20 64) && pass "$n ranks --balance $b: every step trained each of its 64 samples once" \
            || fail "$n ranks --balance $b: $why"
        worst=$(worst_loss_diff "$TMP/one" "$TMP/np$n-$b")
        awk -v w="$worst" 'BEGIN {exit !(w < 1e-5)}' && pass "$n ranks --balance $b follows one rank (worst loss rel diff $worst)" \
            || fail "$n ranks --balance $b: loss rel diff $worst"
    done
    per=$(grep -c "^[0-9]* 0 " "$TMP/s-$n-vbs.0")
    [ "$per" != "$((20 * 64 / n))" ] && pass "$n ranks vbs: rank 0 trained $per samples over 20 steps (the even share is $((20 * 64 / n)))" \
        || echo "note: $n ranks vbs gave rank 0 exactly the even share"
done
run again "${MPI[@]}" -np 2 $NB train "${C[@]}" --balance vbs --out "$TMP/again"
[ "$(losses "$TMP/np2-vbs")" = "$(losses "$TMP/again")" ] && pass "2 ranks vbs twice: the same losses, bit for bit" \
    || fail "2 ranks vbs twice differ"

# a stopped and resumed balanced run replans the same batches: bitwise the straight run
R=(); for a in "${C[@]}"; do [ "$a" != --no-ckpt ] && R+=("$a"); done
run straight "${MPI[@]}" -np 2 $NB train "${R[@]}" --balance vbs --micro-batches 2 --out "$TMP/straight"
run part1 "${MPI[@]}" -np 2 $NB train "${R[@]}" --balance vbs --micro-batches 2 --stop-after 7 --out "$TMP/split"
run part2 "${MPI[@]}" -np 2 $NB train --resume "$TMP/split" --quiet --threads 1
same=1; for f in "$TMP/straight"/ckpt/*.safetensors; do cmp -s "$f" "$TMP/split/ckpt/$(basename "$f")" || same=0; done
[ $same = 1 ] && [ "$(losses "$TMP/straight")" = "$(losses "$TMP/split")" ] \
    && pass "2 ranks --balance vbs --micro-batches 2: stop at 7, resume to 20 == straight, bitwise" || fail "balanced resume differs"
for b in none fbs vbs; do
    NB_SAMPLES_LOG=$TMP/e-$b run emu-$b $NB train "${C[@]}" --emulate-ranks 4 --balance $b --out "$TMP/emu-$b"
    why=$(samples_kept "$TMP/e-$b" 20 64) && pass "--emulate-ranks 4 --balance $b: every sample once per step" || fail "emulated $b: $why"
    worst=$(worst_loss_diff "$TMP/np4-$b" "$TMP/emu-$b")
    awk -v w="$worst" 'BEGIN {exit !(w < 1e-5)}' && pass "--emulate-ranks 4 --balance $b follows 4 real ranks (worst loss rel diff $worst)" \
        || fail "emulated 4 ranks $b vs real: loss rel diff $worst"
done
s_none=$(grep -o ' straggler_pct=[0-9.]*' "$TMP/emu-none.log" | cut -d= -f2)
s_vbs=$(grep -o ' straggler_pct=[0-9.]*' "$TMP/emu-vbs.log" | cut -d= -f2)
grep -q '^emulated steps=' "$TMP/emu-vbs.log" && grep -q '"straggler_pct"' "$TMP/emu-vbs/metrics.jsonl" \
    && pass "emulated ranks: straggler none ${s_none}% vbs ${s_vbs}%, the emulated step and metrics.jsonl's straggler_pct" \
    || fail "emulated ranks: no straggler report"
# the slowest share's record: its sample count is one of the step's shares' (the samples log)
python3 - "$TMP/e-vbs" "$TMP/emu-vbs/metrics.jsonl" > "$TMP/slow.txt" 2>&1 <<'PYEOF'
import glob, json, sys
parts = {}
for f in glob.glob(sys.argv[1] + ".*"):
    for line in open(f):
        step, rank, part, idx = map(int, line.split())
        parts.setdefault(step, {}).setdefault(part, 0)
        parts[step][part] += 1
seen = 0
for line in open(sys.argv[2]):
    r = json.loads(line)
    if "slowest_samples" not in r: continue
    sizes = parts.get(r["step"] - 1, {}).values()  # metrics count steps from 1, the dump from 0
    assert r["slowest_samples"] in sizes, f"step {r['step']}: slowest share of {r['slowest_samples']} samples, shares {sorted(sizes)}"
    assert r["slowest_holds_longest"] in (0, 1)
    seen += 1
assert seen > 0, "no step recorded its slowest share"
print(seen)
PYEOF
[ $? = 0 ] && grep -q "^ranks: the slowest share held the step's longest history in [0-9]* of [0-9]* steps" "$TMP/emu-vbs.log" \
    && pass "emulated ranks: the slowest share's samples match a share of the samples log ($(cat "$TMP/slow.txt") steps), and the summary counts it" \
    || fail "emulated ranks' slowest share: $(tail -n 1 "$TMP/slow.txt")"
grep -q '^cost fit: ' "$TMP/emu-none.log" && pass "emulated ranks: $(grep '^cost fit: ' "$TMP/emu-none.log")" || fail "no cost fit line"

expect_error "an unknown --balance" "unknown --balance 'zig'" $NB train "${C[@]}" --balance zig
expect_error "--balance vbs with --graphs" "drop --graphs with --balance vbs" $NB train "${C[@]}" --balance vbs --graphs
expect_error "--emulate-ranks with --micro-batches" "drop --micro-batches with --emulate-ranks" $NB train "${C[@]}" --emulate-ranks 2 --micro-batches 2
expect_error "--emulate-ranks that do not divide the batch" "does not split over 3 ranks" $NB train "${C[@]}" --emulate-ranks 3
expect_error "--balance for a transformer" "balance" $NB train --model gpt2-tiny --balance fbs --steps 1
finish
