#!/usr/bin/env bash
# Loss masks (issue 32: SHARD.mask, as 'nobubble tokenize --chat' writes it) in training and
# evaluation:
#  - a shard with an all-ones mask trains bitwise as the same shard without one (the masked path's
#    loss scale 1 / counted targets equals the unmasked 1 / tokens): plain, --grad-accum 2 with
#    --graphs, erase with --detach (the local heads), stream;
#  - with a partial mask, 2 ranks (mpirun) and --graphs give --grad-accum 2's bits, and all follow one batch
#    of twice the size (the loss is the mean over the whole step's counted targets, not a mean of
#    the micro-batches' means);
#  - a chat dataset (tokenize --chat with Llama 2's tokenizer, when present) trains: the start line
#    counts its targets, the masked loss falls;
#  - evaluation's masked mean: a mask m and its complement on the same weights give
#    k * loss(m) + (n - k) * loss(not m) = n * loss(no mask), k and n as evaluation reports them
#    (the chat's responses vs prompts, else runs over the sotu tokens);
#  - a mask that keeps no target is refused at start.
source "$(dirname "$0")/lib.sh"
need_sotu
M=(--model gpt2-tiny --vocab 32000 --dim 32 --heads 2 --ffn 64 --layers 2 --seq 32)
T=("${M[@]}" --batch 8 --steps 8 --val-data none --no-progress --seed 5 --threads 1)

mask_shard "$TRAIN" "$TMP/plain.bin" 20000 none
mask_shard "$TRAIN" "$TMP/ones.bin" 20000 ones
mask_shard "$TRAIN" "$TMP/part.bin" 20000 runs

# ---- an all-ones mask: the bits of no mask ----
for v in "plain|" "accum-graphs|--grad-accum 2 --graphs" "erase|--detach 1 --schedule erase" "stream|--schedule stream"; do
    IFS='|' read -r tag extra <<< "$v"
    $NB train "${T[@]}" $extra --data "$TMP/plain.bin" --out "$TMP/p-$tag" >/dev/null 2>"$TMP/p.log" || { fail "$tag: no mask"; tail -3 "$TMP/p.log"; }
    $NB train "${T[@]}" $extra --data "$TMP/ones.bin" --out "$TMP/o-$tag" >/dev/null 2>"$TMP/o.log" || { fail "$tag: all-ones mask"; tail -3 "$TMP/o.log"; }
    same_state "$tag ${extra:+($extra) }: an all-ones mask vs no mask file" "$TMP/p-$tag" "$TMP/o-$tag"
done

# ---- a partial mask: ranks = --grad-accum, and one batch of twice the size ----
$NB train "${T[@]}" --data "$TMP/part.bin" --grad-accum 2 --out "$TMP/acc" 2>"$TMP/acc.log" >/dev/null || { fail "partial: --grad-accum 2"; tail -3 "$TMP/acc.log"; }
if command -v mpirun >/dev/null; then
    mpirun --oversubscribe --allow-run-as-root -np 2 $NB train "${T[@]}" --data "$TMP/part.bin" --out "$TMP/dp" >"$TMP/dp.log" 2>&1 \
        || { fail "partial: mpirun -np 2"; tail -5 "$TMP/dp.log"; }
    same_state "a partial mask: mpirun -np 2 vs one rank with --grad-accum 2" "$TMP/acc" "$TMP/dp"
else
    echo "note: no mpirun: the ranks check is skipped (scripts/setup.sh installs openmpi-bin)"
fi
$NB train "${T[@]}" --data "$TMP/part.bin" --out "$TMP/one" >/dev/null 2>&1 || fail "partial: one batch"
# the scale changes every step: a replayed step must read the current one
$NB train "${T[@]}" --data "$TMP/part.bin" --grad-accum 2 --graphs --out "$TMP/acc-g" >/dev/null 2>&1 || fail "partial: --graphs"
same_state "a partial mask: --graphs vs eager (--grad-accum 2)" "$TMP/acc" "$TMP/acc-g"
worst=$(worst_loss_diff "$TMP/one" "$TMP/acc")
# a mean of the two micro-batches' own means would differ by far more (their counts differ)
awk -v w="$worst" 'BEGIN {exit !(w < 1e-5)}' && pass "a partial mask: --grad-accum 2 follows one batch (worst loss rel diff $worst)" \
    || fail "a partial mask: --grad-accum 2 vs one batch: worst loss rel diff $worst"
grep -q "^data *trains on [0-9,]* of 20,000 tokens" "$TMP/acc.log" && pass "start line: $(grep -o 'trains on.*' "$TMP/acc.log")" \
    || fail "no 'trains on N of M tokens' line: $(grep '^data' "$TMP/acc.log")"
l1=$(losses "$TMP/acc" | head -1) l8=$(losses "$TMP/acc" | tail -1)
awk -v a="$l1" -v b="$l8" 'BEGIN {exit !(b < a)}' && pass "the masked loss falls: $l1 -> $l8" || fail "masked loss $l1 -> $l8"

# ---- evaluation: the masked mean, checked by a mask and its complement ----
# complement SHARD OUT: OUT = SHARD with the complement of SHARD.mask
complement() {
    cp "$1" "$2"
    python3 -c 'import sys; b = open(sys.argv[1], "rb").read(); open(sys.argv[2], "wb").write(b[:1024] + bytes(1 - v for v in b[1024:]))' \
        "$1.mask" "$2.mask"
}
evals() { # CKPT DATA: "LOSS COUNTED" (COUNTED: the targets the mask keeps; every token without a mask)
    $NB eval --ckpt "$1" --data "$2" --batches 0 --threads 1 > "$TMP/e.out" 2>&1 || { echo "eval failed: $(tail -1 "$TMP/e.out")" >&2; return; }
    local l=$(grep -o 'loss [0-9.]* nats' "$TMP/e.out" | cut -d' ' -f2) k=$(grep -o '([0-9,]* of them targets' "$TMP/e.out" | tr -dc 0-9)
    [ -n "$k" ] || k=$(grep -o '= [0-9,]* tokens' "$TMP/e.out" | tr -dc 0-9)
    echo "$l $k"
}
# eval_parts NAME CKPT SHARD MIN_GAP: SHARD (with its .mask), its complement and no mask on the same
# weights: the masked means recombine into the unmasked one, and differ by at least MIN_GAP
eval_parts() {
    cp "$3" "$TMP/ev_all.bin"
    complement "$3" "$TMP/ev_not.bin"
    read -r la na <<< "$(evals "$2" "$TMP/ev_all.bin")"
    read -r lm km <<< "$(evals "$2" "$3")"
    read -r ln kn <<< "$(evals "$2" "$TMP/ev_not.bin")"
    awk -v la="$la" -v na="$na" -v lm="$lm" -v km="$km" -v ln="$ln" -v kn="$kn" -v gap="$4" 'BEGIN {
        if (la == "" || lm == "" || ln == "" || km + kn != na || km == 0 || kn == 0) exit 1
        d = (km * lm + kn * ln) / (na * la) - 1; if (d < 0) d = -d; g = lm - ln; if (g < 0) g = -g
        exit !(d < 2e-4 && g >= gap) }' \
        && pass "$1: eval's masked means recombine: $km x $lm + $kn x $ln = $na x $la (mask, complement, none)" \
        || fail "$1: eval's masked means: mask $lm ($km targets), complement $ln ($kn), none $la ($na)"
}

# ---- a chat dataset from 'tokenize --chat' ----
HF=$ROOT/data/hf_tokenizers/llama2
if [ -f "$HF/tokenizer.json" ]; then
    python3 - "$TMP/chat.jsonl" <<'PYEOF'
import json, random, sys
rng = random.Random(1)
names = ["Washington", "Adams", "Jefferson", "Madison", "Monroe", "Lincoln", "Grant", "Hayes"]
with open(sys.argv[1], "w") as f:
    for i in range(300):
        a, b = rng.randint(1, 50), rng.randint(1, 50)
        if i % 2 == 0:
            f.write(json.dumps({"instruction": f"Add {a} and {b}.", "input": "", "output": f"The sum of {a} and {b} is {a + b}."}) + "\n")
        else:
            f.write(json.dumps({"messages": [{"role": "user", "content": f"Who is president number {i % 8 + 1}?"},
                                             {"role": "assistant", "content": f"President {rng.choice(names)}, of the Union."}]}) + "\n")
PYEOF
    $NB tokenize --tokenizer "$HF" --chat --out "$TMP/chat.bin" "$TMP/chat.jsonl" > "$TMP/tok.out" 2>&1 || { fail "tokenize --chat"; tail -3 "$TMP/tok.out"; }
    want=$(grep -o '[0-9]* of [0-9]* tokens are targets' "$TMP/tok.out" | cut -d' ' -f1-3)
    $NB train "${M[@]}" --batch 8 --steps 30 --lr 1e-2 --data "$TMP/chat.bin" --val-data "$TMP/chat.bin" --eval-every 30 --eval-batches 4 \
        --no-progress --seed 5 --threads 1 --out "$TMP/chat" > /dev/null 2> "$TMP/chat.log" || { fail "chat: train"; tail -3 "$TMP/chat.log"; }
    got=$(grep -o 'trains on [0-9,]* of [0-9,]*' "$TMP/chat.log" | sed 's/trains on //' | tr -d ,)
    [ -n "$want" ] && [ "$got" = "$want" ] && pass "chat: the start line counts tokenize's targets ($got)" \
        || fail "chat: start line '$got', tokenize said '$want'"
    l1=$(losses "$TMP/chat" | head -1) l30=$(losses "$TMP/chat" | tail -1)
    awk -v a="$l1" -v b="$l30" 'BEGIN {exit !(b < 0.6 * a)}' && pass "chat: the masked loss falls, $l1 -> $l30" || fail "chat: loss $l1 -> $l30"
    grep -q "of them targets by the loss mask" "$TMP/chat.log" && pass "chat: validation over the mask's targets ($(grep -o '[0-9,]* of them targets' "$TMP/chat.log"))" \
        || fail "chat: the validation line does not count the mask's targets"
    eval_parts "chat, responses vs prompts" "$TMP/chat" "$TMP/chat.bin" 0.5
else
    echo "note: no Llama 2 tokenizer ($HF; scripts/fetch_data.sh tokenizers): the chat dataset is not tried"
    # the evaluation check on runs of the sotu tokens instead (the masked means differ less there)
    mask_shard "$VAL" "$TMP/ev_m.bin" 4096 runs
    eval_parts "sotu, runs" "$TMP/one" "$TMP/ev_m.bin" 0.0001
fi

# ---- a mask with no target ----
mask_shard "$TRAIN" "$TMP/zero.bin" 2000 zeros
expect_error "a mask with no target" "mark no token as a target" $NB train "${T[@]}" --data "$TMP/zero.bin"
finish
