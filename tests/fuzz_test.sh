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
#   hf-tok       a Hugging Face tokenizer.json (Llama 2's)  tokenize --tokenizer DIR (text)
#   chat         chat / instruction JSON lines      tokenize --tokenizer DIR --chat (Llama 2's)
#                (both when scripts/fetch_data.sh tokenizers can fetch the files)
#   sc-shard     a one-process sharded seqctr checkpoint's shard-00000-of-00001.safetensors (--schedule
#                pipe), sc-model its model.safetensors, sc-state its state.json: eval (even cases),
#                train --resume (odd)
#   sc-mix       that checkpoint with one file from another run or another step (must be refused:
#                the files carry the checkpoint's fingerprint)
#   movielens    data/movielens/clicks_train.tsv        train --model seqctr --data movielens
#   flag         every numeric flag of the options table (nobubble options) below its range, above
#                it, not a number (must be refused) and at its lowest legal value (must run or
#                refuse cleanly); every enum flag with an unknown name (refused) and each name
#   tf-field,    every option a transformer's / seqctr's state.json keeps, set below its range,
#   sc-field     above it, to a string (refused), and every other member to odd values (any)
# Every case must end in a valid run (exit 0) or a clean error (exit 1 or 2 and exactly one
# "error:" line on stderr), never in a sanitizer report, an "internal check failed", a signal,
# a hang (timeout) or a "successful" run that printed a NaN or inf loss; and a case that a correct reader must refuse (any change to a safetensors
# file, which carries checksums; a shard or Criteo binary of another size than its header says)
# must not run. Cases failing for reasons in code outside src/io, src/data and src/core are
# listed with the reason in tests/fuzz/known_failures.txt: they are reported, not counted,
# and one that passes again is reported too (remove it from the list). Prints a summary.
# Bounded: two cases at a time in a seeded shuffled order; a case not started within
# NB_FUZZ_BUDGET seconds (70: CI has 20 minutes for every test) is skipped and counted (the summary says how many), so a slow
# machine checks fewer cases, never the wrong ones.
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
need_sotu
SEED=${NB_FUZZ_SEED:-20261201}
ASAN=$ROOT/build-asan
echo 'int main(void) { return 0; }' > "$TMP/probe.c"
${CC:-gcc} -fsanitize=address,undefined -o "$TMP/probe" "$TMP/probe.c" 2>/dev/null && "$TMP/probe" \
    || { echo "no ASan/UBSan runtime here (libasan, libubsan)"; exit 77; }
make -s asan -j"$(env -u OMP_NUM_THREADS nproc)" > "$TMP/build.log" 2>&1 || { tail -30 "$TMP/build.log"; fail "make asan"; finish; }
${CC:-gcc} -std=c11 -O2 -Wall -Wextra -o "$TMP/mutate" tests/fuzz/mutate.c || { fail "build the mutator"; finish; }
export NBA=$ASAN/nobubble ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive TMP ROOT

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
# a one-process sharded seqctr checkpoint (pipe: the tables in shard-00000-of-00001), one of another
# seed, and the same run's checkpoint one step earlier (the files of mixed checkpoints)
SCB=(--model seqctr --data "synth:cap=1000,items=2000,calib=4096,max_len=8" --emb-dim 8 --blocks 1 --cross-rank 8
     --block-hidden 16 --batch 16 --eval-samples 32 --quiet --no-progress)
$NBA train "${SCB[@]}" --schedule pipe --steps 2 --out "$B/sc" > /dev/null 2>&1 || { fail "base seqctr checkpoint"; finish; }
[ -f "$B/sc/ckpt/shard-00000-of-00001.safetensors" ] || { fail "the base seqctr checkpoint has no shard"; finish; }
$NBA train "${SCB[@]}" --schedule pipe --steps 2 --seed 7 --out "$B/sc-seed" > /dev/null 2>&1 || { fail "seqctr, seed 7"; finish; }
$NBA train "${SCB[@]}" --schedule pipe --steps 2 --stop-after 1 --out "$B/sc-step1" > /dev/null 2>&1 || { fail "seqctr, step 1"; finish; }
$NBA train "${T[@]}" --steps 2 --seed 7 --data "$B/shard.bin" --out "$B/run-seed" > /dev/null 2>&1 || { fail "base, seed 7"; finish; }
# MovieLens click files (scripts/fetch_movielens.sh's layout), small
mkdir -p "$B/ml"
for f in train test; do
    { printf 'label\tuser\titem\tyear\tgenre\thour\tweekday\ttimestamp\thistory\n'
      for i in $(seq 30); do printf '%d\t%d\t%d\t199%d\t%d\t%d\t%d\t%d\t%d %d\n' $((i % 2)) $((i % 7 + 1)) $((i % 11 + 1)) \
          $((i % 10)) $((i % 5)) $((i % 24)) $((i % 7)) $((900000000 + i)) $((i % 11 + 2)) $((i % 13 + 1)); done; } > "$B/ml/clicks_$f.tsv"
done

# Hugging Face tokenizer files and chat lines (issue 32's inputs)
HF=$ROOT/data/hf_tokenizers
[ -f "$HF/llama2/tokenizer.json" ] || scripts/fetch_data.sh tokenizers > /dev/null 2>&1 || true
{ printf '{"instruction": "Name the first president.", "input": "", "output": "George Washington."}\n'
  printf '{"conversations": [{"from": "human", "value": "Caf\\u00e9 \\ud83d\\ude00?"}, {"from": "gpt", "value": "Yes: 1,000.50"}]}\n'
  printf '{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi <|eot_id|>"}, {"role": "assistant", "content": "Hello."}]}\n'
} > "$B/chat.jsonl"

# ---- cases: KIND MUTATOR-KIND COUNT BASE-FILE
W=$TMP/cases
plan=(
    "shard shard 30 $B/shard.bin"
    "model safetensors 30 $B/run/ckpt/model.safetensors"
    "optim safetensors 20 $B/run/ckpt/optim.safetensors"
    "state json 80 $B/run/ckpt/state.json"
    "criteo-tsv tsv 20 $B/rows.tsv"
    "criteo-conv tsv 10 $B/rows.tsv"
    "criteo-bin criteo-bin 20 $B/rows.bin"
    "text text 15 $B/text.txt"
    "sc-shard safetensors 16 $B/sc/ckpt/shard-00000-of-00001.safetensors"
    "sc-model safetensors 8 $B/sc/ckpt/model.safetensors"
    "sc-state json 24 $B/sc/ckpt/state.json"
    "movielens tsv 20 $B/ml/clicks_train.tsv"
)
[ -f "$HF/llama2/tokenizer.json" ] && plan+=("hf-tok json 12 $HF/llama2/tokenizer.json")
[ -f "$HF/llama2/tokenizer.json" ] && plan+=("chat text 16 $B/chat.jsonl")
[ ${#plan[@]} -eq 14 ] || echo "note: no Hugging Face tokenizer files (scripts/fetch_data.sh tokenizers): hf-tok and chat not fuzzed"
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

# files of another run or step in the seqctr checkpoint: "sc-mix NNN 1 FILE <- SOURCE"
mkdir -p "$W/sc-mix"
k=0
for mix in "shard-00000-of-00001.safetensors sc-seed" "shard-00000-of-00001.safetensors sc-step1" \
           "model.safetensors sc-seed" "optim.safetensors sc-step1" "state.json sc-step1"; do
    set -- $mix
    id=$(printf %03d $k)
    cp "$B/$2/ckpt/$1" "$W/sc-mix/$id"
    echo "sc-mix $id 1 $1 <- $2" >> "$TMP/list"
    k=$((k + 1))
done
plan+=("sc-mix - $k -")

# ---- the options table: every numeric flag's range and every enum's names, as flags and as
# state.json members (nobubble options: flag, key, type, group, lo, hi, math, names)
$NBA options > "$TMP/options.tsv" || { fail "nobubble options"; finish; }
[ "$(wc -l < "$TMP/options.tsv")" -gt 40 ] || { fail "nobubble options lists $(wc -l < "$TMP/options.tsv") rows"; finish; }
# out_of VALUE-KIND TYPE LO HI: a value outside the range (empty: none), from awk's arithmetic
out_of() {
    case $1 in
    below) case $2 in int|i64) echo $(( ${3%%.*} - 1 ));; float) awk -v lo="$3" 'BEGIN { print (lo > 0 ? 0 : -1) }';; esac ;;
    above) case $2 in int) [ "${4%%.*}" -lt 2147483647 ] && echo $(( ${4%%.*} + 1 )) || echo 2147483648;;
                      i64) echo $(( ${4%%.*} + 1 ));;
                      float) awk -v hi="$4" 'BEGIN { printf "%.17g\n", (hi * 10 > 3.4e38 ? 1e39 : hi * 10) }';; esac ;;
    esac
}
mkdir -p "$W/flag" "$W/tf-field" "$W/sc-field"
nf=0
add_flag() { # FAMILY MUST DESC ARGS...
    local fam=$1 must=$2 desc=$3; shift 3
    local id=$(printf %03d $nf)
    printf '%s\n' "$fam" "$@" > "$W/flag/$id"
    echo "flag $id $must $desc" >> "$TMP/list"
    nf=$((nf + 1))
}
while IFS=$'\t' read -r flag key type group lo hi math names; do
    [ "$flag" = - ] && continue
    fam=tf; case $group in sc|ranks) fam=sc;; esac
    case $type in
    int|i64|float)
        for w in below above; do
            v=$(out_of $w $type "$lo" "$hi"); [ -n "$v" ] && add_flag $fam 1 "--$flag $v ($w $lo..$hi)" "--$flag" "$v"
        done
        add_flag $fam 1 "--$flag 12x (not a number)" "--$flag" 12x
        [ $type = float ] && add_flag $fam 1 "--$flag nan" "--$flag" nan
        add_flag $fam 0 "--$flag $lo (its lowest)" "--$flag" "$lo" ;;
    u64) add_flag $fam 1 "--$flag -1" "--$flag" -1; add_flag $fam 1 "--$flag 18446744073709551616" "--$flag" 18446744073709551616 ;;
    enum)
        add_flag $fam 1 "--$flag bogus" "--$flag" bogus
        IFS=, read -ra ns <<< "$names"
        for n in "${ns[@]}"; do [ -n "$n" ] && add_flag $fam 0 "--$flag $n" "--$flag" "$n"; done ;;
    esac
done < "$TMP/options.tsv"
plan+=("flag - $nf -")
# state.json: each kept option below / above its range and as a string (refused); every member
# of the file (the model section's and the top level's too) set to odd values (any)
for fam in tf sc; do
    st=$B/run/ckpt/state.json; [ $fam = sc ] && st=$B/sc/ckpt/state.json
    n=0
    add_field() { # MUST KEY VALUE DESC
        local id=$(printf %03d $n) nth=$(grep -c "\"$2\":" "$st")
        "$TMP/mutate" edit "$st" "$W/$fam-field/$id" "$2" "$3" "$nth" 2>/dev/null || return 0
        echo "$fam-field $id $1 $4" >> "$TMP/list"
        n=$((n + 1))
    }
    while IFS=$'\t' read -r flag key type group lo hi math names; do
        [ "$key" = - ] && continue
        grep -q "\"$key\":" "$st" || continue
        case $type in
        int|i64|float)
            for w in below above; do v=$(out_of $w $type "$lo" "$hi"); [ -n "$v" ] && add_field 1 "$key" "$v" "$key -> $v ($w $lo..$hi)"; done
            add_field 1 "$key" '"12"' "$key -> \"12\"" ;;
        u64) add_field 1 "$key" -1 "$key -> -1"; add_field 1 "$key" 1.5 "$key -> 1.5" ;;
        bool) add_field 1 "$key" 2 "$key -> 2"; add_field 1 "$key" '"1"' "$key -> \"1\"" ;;
        enum) add_field 1 "$key" '"bogus"' "$key -> bogus" ;;
        str) add_field 0 "$key" '""' "$key -> \"\"" ;;
        esac
    done < "$TMP/options.tsv"
    # every member, the options' too: a seeded pick of odd values (any: a valid run or one error)
    odd=(-1 0 2147483648 1e308 '"x"' null true '[]' '{}' 1.5)
    i=0
    for key in $(grep -o '"[a-z_0-9A-Z]*":' "$st" | tr -d '":' | sort -u); do
        v=${odd[$(( (i * 7 + SEED) % ${#odd[@]} ))]}
        [ "$key" = model ] || [ "$key" = train ] || add_field 0 "$key" "$v" "$key -> $v"
        i=$((i + 1))
    done
    plan+=("$fam-field - $n -")
done

# run_case KIND NNN MUST_REJECT: runs the case's command, writes "KIND NNN OUTCOME detail" to
# $TMP/res/KIND.NNN. OUTCOME: run, error (good), or silent (a must-reject case ran), nan,
# sanitizer, assert, signal, hang, baderror (not exactly one error line) (bad). NB_FUZZ_KEEP=DIR
# keeps every case's files and the results there.
run_case() {
    local kind=$1 id=$2 must=$3 f=$TMP/cases/$1/$2 d=$TMP/work/$1.$2
    # the time budget: a case not started by the deadline is skipped (reported, not a failure)
    [ "$(date +%s)" -lt "$DEADLINE" ] || { echo "$kind $id skipped (the time budget)" > "$TMP/res/$kind.$id"; return 0; }
    mkdir -p "$d"
    local T="--model gpt2-tiny --vocab 512 --batch 2 --seq 32 --val-data none --no-progress --quiet"
    local CTR="--model seqctr --emb-dim 8 --blocks 1 --cross-rank 8 --block-hidden 16 --batch 16 --eval-samples 16 --table-cap 1000 --steps 1 --quiet"
    local SYN="synth:cap=1000,items=2000,calib=4096,max_len=8" evdata="--data $TMP/base/shard.bin --batches 1"
    case $kind in
    sc-*|tf-field)
        local base=$TMP/base/sc target
        [ $kind = tf-field ] && base=$TMP/base/run evdata="--data $TMP/base/shard.bin --batches 1" || evdata=
        cp -r "$base" "$d/run"
        case $kind in
        sc-shard) target=shard-00000-of-00001.safetensors ;;
        sc-model) target=model.safetensors ;;
        sc-mix) target=$(awk -v k=$kind -v i=$id '$1 == k && $2 == i { print $4 }' "$TMP/list") ;;
        *) target=state.json ;;
        esac
        cp "$f" "$d/run/ckpt/$target"
        if [ $((10#$id % 2)) -eq 0 ] && [ $kind != tf-field ]; then set -- $NBA eval --ckpt "$d/run" $evdata
        else set -- $NBA train --resume "$d/run" --steps 3 --out "$d/out" --no-progress --quiet; fi ;;
    flag)
        local fam=$(head -n 1 "$f") args
        mapfile -t args < <(tail -n +2 "$f")
        if [ "$fam" = sc ]; then set -- $NBA train $CTR --data "$SYN" --no-ckpt "${args[@]}"
        else set -- $NBA train $T --steps 1 --data "$TMP/base/shard.bin" --no-ckpt "${args[@]}"; fi ;;
    movielens)
        mkdir -p "$d/data/movielens"
        cp "$f" "$d/data/movielens/clicks_train.tsv"
        cp "$TMP/base/ml/clicks_test.tsv" "$d/data/movielens/"
        set -- env -C "$d" $NBA train $CTR --data movielens --no-ckpt ;;
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
    hf-tok)
        mkdir -p "$d/tok" && cp "$f" "$d/tok/tokenizer.json" && cp "$ROOT/data/hf_tokenizers/llama2/tokenizer_config.json" "$d/tok/"
        set -- $NBA tokenize --tokenizer "$d/tok" --bos --eot-between --out "$d/tok.bin" "$TMP/base/text.txt" ;;
    chat) set -- $NBA tokenize --tokenizer "$ROOT/data/hf_tokenizers/llama2" --chat --out "$d/chat.bin" "$f" ;;
    esac
    timeout -k 5 30 "$@" > "$d/stdout" 2> "$d/err"
    local rc=$? nerr out detail
    # a checkpoint the run wrote must hold finite weights: evaluate it (NaN shows as loss nan)
    if [ $rc -eq 0 ] && [ -f "$d/out/ckpt/state.json" ]; then
        timeout -k 5 30 $NBA eval --ckpt "$d/out" $evdata >> "$d/stdout" 2>> "$d/err" || rc=$?
    fi
    nerr=$(grep -a -c "error:" "$d/err")
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then out=hang
    elif grep -qE 'ERROR: AddressSanitizer|ERROR: LeakSanitizer|runtime error:|UndefinedBehaviorSanitizer' "$d/err"; then out=sanitizer
    elif grep -q "internal check failed" "$d/err"; then out=assert
    elif [ $rc -gt 128 ]; then out=signal
    elif [ $rc -eq 0 ] && [ "$must" = 1 ]; then out=silent
    elif [ $rc -eq 0 ] && { grep -qiE 'loss[ =:]+-?(nan|inf)' "$d/stdout" "$d/err" 2>/dev/null ||
                             { grep -qiE '(ne|auc)[ =:]+-?(nan|inf)' "$d/stdout" 2>/dev/null &&
                               ! grep -q 'NE and AUC are undefined' "$d/stdout"; } ||
                             grep -qE '"(loss|val_loss|grad_norm)":null' "$d"/out/metrics.jsonl 2>/dev/null; }; then
        out=nan # a run that trains on (or reports) NaN or inf and calls it a success
    elif { [ $rc -eq 1 ] || [ $rc -eq 2 ]; } && [ "$nerr" -eq 1 ]; then out=error
    elif [ $rc -eq 0 ]; then out=run
    else out=baderror; fi
    detail="exit $rc: $(grep -a -E -m1 'error:|ERROR|runtime error' "$d/err" | cut -c1-220)"
    echo "$kind $id $out $detail" > "$TMP/res/$kind.$id"
    if [ -z "${NB_FUZZ_KEEP:-}" ] && { [ "$out" = run ] || [ "$out" = error ]; }; then rm -rf "$d"; fi
    return 0
}
export -f run_case
mkdir -p "$TMP/res" "$TMP/work"
t0=$(date +%s)
export DEADLINE=$((t0 + ${NB_FUZZ_BUDGET:-70}))
# in a seeded shuffled order, so that a budget cut spreads over every kind of input
awk -v seed=$SEED 'BEGIN { srand(seed) } { printf "%.9f %s %s %s\n", rand(), $1, $2, $3 }' "$TMP/list" | sort -k1,1 \
    | cut -d' ' -f2- | xargs -P 2 -n 3 bash -c 'run_case "$@"' _
dt=$(( $(date +%s) - t0 ))

# ---- verdicts
KNOWN=$ROOT/tests/fuzz/known_failures.txt
declare -A total good_run good_err known bad skipped
while read -r kind id must desc; do
    read -r _ _ out detail < "$TMP/res/$kind.$id"
    total[$kind]=$(( ${total[$kind]:-0} + 1 ))
    listed=$(grep -E "^$kind:$id( |$)" "$KNOWN" 2>/dev/null | head -n 1)
    case $out in
    skipped) skipped[$kind]=$(( ${skipped[$kind]:-0} + 1 )) ;;
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
printf '%-12s %6s %6s %6s %6s %6s %6s\n' input cases run error known FAIL skip
nskip=0
for p in "${plan[@]}"; do
    set -- $p
    printf '%-12s %6d %6d %6d %6d %6d %6d\n' $1 ${total[$1]:-0} ${good_run[$1]:-0} ${good_err[$1]:-0} ${known[$1]:-0} ${bad[$1]:-0} ${skipped[$1]:-0}
    nskip=$((nskip + ${skipped[$1]:-0}))
done
echo "$(wc -l < "$TMP/list") cases in $dt s (seed $SEED; budget ${NB_FUZZ_BUDGET:-70} s: $nskip not started)"
[ -n "${NB_FUZZ_KEEP:-}" ] && { cp -r "$TMP/res" "$TMP/work" "$TMP/cases" "$TMP/list" "$NB_FUZZ_KEEP/"; }
[ $fails -eq 0 ] && pass "every case ended in a valid run or one clean error line"
finish
