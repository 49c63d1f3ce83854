#!/usr/bin/env bash
# Fuzzing against the ASan + UBSan build (make asan): a fixed-seed mutation harness
# (tests/fuzz/mutate.c) over every input nobubble reads, each case run through the command that
# reads it:
#   shard        a token shard                      train --data CASE --steps 1
#   model        a checkpoint's model.safetensors   eval --ckpt (even cases), train --resume (odd)
#   optim        its optim.safetensors              train --resume
#   state        its state.json                     train --resume
#   state-edit   state.json, one option set to an edge value (tests/fuzz/state_edits.txt)
#   criteo-tsv   Criteo rows (Kaggle TSV)           train --model seqctr --data criteo:CASE
#   criteo-conv  the same rows                      criteo-convert
#   criteo-bin   their criteo-convert binary        train --model seqctr --data criteo:CASE
#   text         tokenizer input                    tokenize
# Every case must end in a valid run (exit 0) or a clean error (exit 1 or 2 and exactly one
# "error:" line on stderr), never in a sanitizer report, an "internal check failed", a signal,
# a hang (timeout) or a "successful" run that printed a NaN or inf loss; and a case that a correct reader must refuse (any change to a safetensors
# file, which carries checksums; a shard or Criteo binary of another size than its header says)
# must not run. Cases failing for reasons in code outside src/io, src/data and src/core are
# listed with the reason in tests/fuzz/known_failures.txt: they are reported, not counted,
# and one that passes again is reported too (remove it from the list). Prints a summary.
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
need_sotu
SEED=${NB_FUZZ_SEED:-20261201}
ASAN=$ROOT/build-asan
echo 'int main(void) { return 0; }' > "$TMP/probe.c"
${CC:-gcc} -fsanitize=address,undefined -o "$TMP/probe" "$TMP/probe.c" 2>/dev/null && "$TMP/probe" \
    || { echo "no ASan/UBSan runtime here (libasan, libubsan)"; exit 77; }
make -s asan -j"$(nproc)" > "$TMP/build.log" 2>&1 || { tail -30 "$TMP/build.log"; fail "make asan"; finish; }
${CC:-gcc} -std=c11 -O2 -Wall -Wextra -o "$TMP/mutate" tests/fuzz/mutate.c || { fail "build the mutator"; finish; }
export NBA=$ASAN/nobubble ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export OMP_NUM_THREADS=1 TMP ROOT

# ---- valid inputs
B=$TMP/base
mkdir -p "$B"
"$TMP/mutate" shard-gen 4096 512 $SEED "$B/shard.bin"
T=(--model gpt2-tiny --vocab 512 --batch 2 --seq 32 --val-data none --no-progress --quiet)
$NBA train "${T[@]}" --steps 2 --data "$B/shard.bin" --out "$B/run" > /dev/null 2>&1 || { fail "base checkpoint"; finish; }
head -c 6000 "$ROOT"/data/sotu/raw/1790_george_washington_n.txt > "$B/text.txt"
printf 'Caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80 1,000.50\n' >> "$B/text.txt"
CRITEO=$ROOT/../shared/data/ctr_samples/criteo_kaggle_200.tsv
if [ -f "$CRITEO" ]; then
    head -n 60 "$CRITEO" > "$B/rows.tsv"
else # synthesized rows in the Kaggle layout: label, 13 integers, 26 hex categories
    for i in $(seq 60); do
        printf '%d' $((i % 2)); for j in $(seq 13); do printf '\t%d' $(( (i * j) % 17 )); done
        for j in $(seq 26); do printf '\t%08x' $(( (i * 7919 + j * 104729) % 4294967296 )); done; printf '\n'
    done > "$B/rows.tsv"
fi
$NBA criteo-convert --in "$B/rows.tsv" --out "$B/rows.bin" > /dev/null 2>&1 || { fail "base criteo binary"; finish; }

# ---- cases: KIND MUTATOR-KIND COUNT BASE-FILE
W=$TMP/cases
plan=(
    "shard shard 60 $B/shard.bin"
    "model safetensors 60 $B/run/ckpt/model.safetensors"
    "optim safetensors 40 $B/run/ckpt/optim.safetensors"
    "state json 200 $B/run/ckpt/state.json"
    "criteo-tsv tsv 40 $B/rows.tsv"
    "criteo-conv tsv 20 $B/rows.tsv"
    "criteo-bin criteo-bin 30 $B/rows.bin"
    "text text 30 $B/text.txt"
)
: > "$TMP/list"
for p in "${plan[@]}"; do
    set -- $p
    mkdir -p "$W/$1"
    "$TMP/mutate" "$2" $((SEED + ${#1})) "$3" "$4" "$W/$1" | sed "s/^/$1 /" >> "$TMP/list"
done
# and the targeted edits of state.json (the options a resume trusts)
mkdir -p "$W/state-edit"
k=0
while read -r expect key value nth; do
    case $expect in ''|'#'*) continue;; esac
    id=$(printf %03d $k)
    "$TMP/mutate" edit "$B/run/ckpt/state.json" "$W/state-edit/$id" "$key" "$value" $nth || fail "state edit $key"
    echo "state-edit $id $([ "$expect" = reject ] && echo 1 || echo 0) $key -> $value" >> "$TMP/list"
    k=$((k + 1))
done < tests/fuzz/state_edits.txt
plan+=("state-edit json $k -")

# run_case KIND NNN MUST_REJECT: runs the case's command, writes "KIND NNN OUTCOME detail" to
# $TMP/res/KIND.NNN. OUTCOME: run, error (good), or silent (a must-reject case ran), nan,
# sanitizer, assert, signal, hang, baderror (not exactly one error line) (bad). NB_FUZZ_KEEP=DIR
# keeps every case's files and the results there.
run_case() {
    local kind=$1 id=$2 must=$3 f=$TMP/cases/$1/$2 d=$TMP/work/$1.$2
    mkdir -p "$d"
    local T="--model gpt2-tiny --vocab 512 --batch 2 --seq 32 --val-data none --no-progress --quiet"
    local CTR="--model seqctr --emb-dim 8 --blocks 1 --cross-rank 8 --block-hidden 16 --batch 16 --eval-samples 16 --table-cap 1000 --steps 1 --quiet"
    case $kind in
    model|optim|state|state-edit)
        cp -r "$TMP/base/run" "$d/run"
        local target=$d/run/ckpt/$( [ $kind = model ] && echo model.safetensors || { [ $kind = optim ] && echo optim.safetensors || echo state.json; })
        cp "$f" "$target"
        if [ $kind = model ] && [ $((10#$id % 2)) -eq 0 ]; then set -- $NBA eval --ckpt "$d/run" --data "$TMP/base/shard.bin" --batches 1
        else set -- $NBA train --resume "$d/run" --steps 3 --out "$d/out" --no-progress --quiet; fi ;;
    shard) set -- $NBA train $T --steps 1 --data "$f" ;;
    criteo-tsv|criteo-bin) set -- $NBA train $CTR --data "criteo:$f" ;;
    criteo-conv) set -- $NBA criteo-convert --in "$f" --out "$d/conv.bin" ;;
    text) set -- $NBA tokenize --tokenizer "$ROOT/data/gpt2" --out "$d/tok.bin" "$f" ;;
    esac
    timeout -k 5 30 "$@" > "$d/stdout" 2> "$d/err"
    local rc=$? nerr out detail
    # a checkpoint the run wrote must hold finite weights: evaluate it (NaN shows as loss nan)
    if [ $rc -eq 0 ] && [ -f "$d/out/ckpt/state.json" ]; then
        timeout -k 5 30 $NBA eval --ckpt "$d/out" --data "$TMP/base/shard.bin" --batches 1 >> "$d/stdout" 2>> "$d/err" || rc=$?
    fi
    nerr=$(grep -c "error:" "$d/err")
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then out=hang
    elif grep -qE 'ERROR: AddressSanitizer|ERROR: LeakSanitizer|runtime error:|UndefinedBehaviorSanitizer' "$d/err"; then out=sanitizer
    elif grep -q "internal check failed" "$d/err"; then out=assert
    elif [ $rc -gt 128 ]; then out=signal
    elif [ $rc -eq 0 ] && [ "$must" = 1 ]; then out=silent
    elif [ $rc -eq 0 ] && { grep -qiE '(loss|ne|auc)[ =:]+-?(nan|inf)' "$d/stdout" "$d/err" 2>/dev/null ||
                             grep -qE '"(loss|val_loss|grad_norm)":null' "$d"/out/metrics.jsonl 2>/dev/null; }; then
        out=nan # a run that trains on (or reports) NaN or inf and calls it a success
    elif { [ $rc -eq 1 ] || [ $rc -eq 2 ]; } && [ "$nerr" -eq 1 ]; then out=error
    elif [ $rc -eq 0 ]; then out=run
    else out=baderror; fi
    detail="exit $rc: $(grep -E -m1 'error:|ERROR|runtime error' "$d/err" | cut -c1-220)"
    echo "$kind $id $out $detail" > "$TMP/res/$kind.$id"
    if [ -z "${NB_FUZZ_KEEP:-}" ] && { [ "$out" = run ] || [ "$out" = error ]; }; then rm -rf "$d"; fi
    return 0
}
export -f run_case
mkdir -p "$TMP/res" "$TMP/work"
t0=$(date +%s)
awk '{print $1, $2, $3}' "$TMP/list" | xargs -P 2 -n 3 bash -c 'run_case "$@"' _
dt=$(( $(date +%s) - t0 ))

# ---- verdicts
KNOWN=$ROOT/tests/fuzz/known_failures.txt
declare -A total good_run good_err known bad
while read -r kind id must desc; do
    read -r _ _ out detail < "$TMP/res/$kind.$id"
    total[$kind]=$(( ${total[$kind]:-0} + 1 ))
    listed=$(grep -E "^$kind:$id( |$)" "$KNOWN" 2>/dev/null | head -n 1)
    case $out in
    run) good_run[$kind]=$(( ${good_run[$kind]:-0} + 1 ))
         [ -n "$listed" ] && echo "note: known failure $kind:$id now passes (remove it from tests/fuzz/known_failures.txt)" ;;
    error) good_err[$kind]=$(( ${good_err[$kind]:-0} + 1 ))
         [ -n "$listed" ] && echo "note: known failure $kind:$id now passes (remove it from tests/fuzz/known_failures.txt)" ;;
    *) if [ -n "$listed" ]; then
           known[$kind]=$(( ${known[$kind]:-0} + 1 ))
           echo "known $kind:$id $out ($desc): $detail"
       else
           bad[$kind]=$(( ${bad[$kind]:-0} + 1 ))
           fail "$kind:$id $out ($desc): $detail"
           sed 's/^/      /' "$TMP/work/$kind.$id/err" 2>/dev/null | grep -v '^      $' | head -n 25
       fi ;;
    esac
done < "$TMP/list"
echo
printf '%-12s %6s %6s %6s %6s %6s\n' input cases run error known FAIL
for p in "${plan[@]}"; do
    set -- $p
    printf '%-12s %6d %6d %6d %6d %6d\n' $1 ${total[$1]:-0} ${good_run[$1]:-0} ${good_err[$1]:-0} ${known[$1]:-0} ${bad[$1]:-0}
done
echo "$(wc -l < "$TMP/list") cases in $dt s (seed $SEED)"
[ -n "${NB_FUZZ_KEEP:-}" ] && { cp -r "$TMP/res" "$TMP/work" "$TMP/cases" "$TMP/list" "$NB_FUZZ_KEEP/"; }
[ $fails -eq 0 ] && pass "every case ended in a valid run or one clean error line"
finish
