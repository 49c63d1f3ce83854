#!/usr/bin/env bash
# AddressSanitizer + UBSan (make asan: build-asan, CPU only, -O1, any UBSan report fatal):
#  - every unit test program (build-asan/tests/test_*), two at a time (test_ops with --small);
#  - a short run of every command and schedule through the sanitized nobubble: train (gpt2-tiny
#    plain, erase with --detach, stream with --ckpt-interval, llama-tiny, seqctr plain and
#    erase), --resume, eval, sample, export, tokenize, criteo-convert, synth-dump, timeline, info;
#  - a few error paths (a damaged checkpoint, a bad shard), which must end in one error line.
# Any sanitizer report fails the test (the report is printed). Leak checking is on for the
# commands (each is one process that exits normally or through nb_fail) and off for the unit
# tests, whose death tests fork: LeakSanitizer in a forked child reports the parent's threads.
# Exit 77 only when the ASan runtime is missing.
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
need_sotu
ASAN=$ROOT/build-asan
echo 'int main(void) { return 0; }' > "$TMP/probe.c"
${CC:-gcc} -fsanitize=address,undefined -o "$TMP/probe" "$TMP/probe.c" 2>"$TMP/probe.err" && "$TMP/probe" \
    || { cat "$TMP/probe.err"; echo "no ASan/UBSan runtime here (libasan, libubsan)"; exit 77; }
t0=$(date +%s)
make -s asan -j"$(env -u OMP_NUM_THREADS nproc)" > "$TMP/build.log" 2>&1 || { tail -30 "$TMP/build.log"; fail "make asan"; finish; }
pass "make asan ($(( $(date +%s) - t0 )) s)"
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
SAN_RE='ERROR: AddressSanitizer|ERROR: LeakSanitizer|runtime error:|SUMMARY: UndefinedBehaviorSanitizer'

# ---- unit tests: two at a time, one OpenMP thread each (2 cores; ASan makes threads costly)
ls "$ASAN"/tests/test_* | grep -v '\.[od]$' > "$TMP/units"
run_unit() { # BIN: writes BIN's log and status into $TMP
    local name=$(basename "$1") args=()
    # the op-test table: a bounded subset (every cpu row and the small emu rows: the whole CPU
    # emulator of the GPU kernels would take many minutes under ASan)
    [ "$name" = test_ops ] && args=(--small)
    ASAN_OPTIONS=detect_leaks=0 OMP_NUM_THREADS=1 timeout 300 "$1" ${args[@]+"${args[@]}"} > "$TMP/u.$name.log" 2>&1
    echo $? > "$TMP/u.$name.rc"
}
export -f run_unit; export TMP
t0=$(date +%s)
xargs -P 2 -I{} bash -c 'run_unit {}' < "$TMP/units"
while read -r bin; do
    name=$(basename "$bin") rc=$(cat "$TMP/u.$name.rc")
    if grep -qE "$SAN_RE" "$TMP/u.$name.log"; then fail "$name: sanitizer report"; grep -E -A30 "$SAN_RE" "$TMP/u.$name.log" | head -40
    elif [ "$rc" -eq 0 ] || [ "$rc" -eq 77 ]; then pass "$name (exit $rc)"
    else fail "$name: exit $rc"; tail -20 "$TMP/u.$name.log"; fi
done < "$TMP/units"
echo "unit tests under ASan: $(( $(date +%s) - t0 )) s"

# ---- commands
export ASAN_OPTIONS=detect_leaks=1
NBA=$ASAN/nobubble
n=0
# san_run NAME WANT CMD...: WANT is "ok" (exit 0) or "error" (exit 1/2 with one error line)
san_run() {
    local name=$1 want=$2; shift 2
    n=$((n + 1))
    timeout 300 "$@" > "$TMP/c$n.out" 2> "$TMP/c$n.err"
    local rc=$? nerr=$(grep -c "error:" "$TMP/c$n.err")
    if grep -qE "$SAN_RE" "$TMP/c$n.err"; then fail "$name: sanitizer report"; grep -E -B2 -A30 "$SAN_RE" "$TMP/c$n.err" | head -50; return; fi
    if [ "$want" = ok ] && [ $rc -eq 0 ]; then pass "$name"; return; fi
    if [ "$want" = error ] && { [ $rc -eq 1 ] || [ $rc -eq 2 ]; } && [ "$nerr" -eq 1 ]; then pass "$name: $(tail -n 1 "$TMP/c$n.err" | cut -c1-120)"; return; fi
    fail "$name: exit $rc (want $want), $nerr error lines"; tail -5 "$TMP/c$n.err"
}
t0=$(date +%s)
C=(--batch 2 --seq 32 --data "$TRAIN" --val-data none --eval-every 0 --no-progress --quiet)
san_run "info" ok bash -c "$NBA info; [ \$? -le 3 ]"
san_run "train gpt2-tiny plain" ok $NBA train "${C[@]}" --model gpt2-tiny --steps 3 --out "$TMP/g"
san_run "train --resume" ok $NBA train --resume "$TMP/g" --steps 5 --no-progress --quiet
san_run "train gpt2-tiny erase --detach" ok $NBA train "${C[@]}" --model gpt2-tiny --layers 4 --detach 1,3 \
    --schedule erase --erase-dispatch async --steps 3 --trace "$TMP/erase.json" --out "$TMP/e"
san_run "train gpt2-tiny stream --ckpt-interval" ok $NBA train "${C[@]}" --model gpt2-tiny --layers 3 --schedule stream \
    --ckpt-interval 1 --steps 3 --out "$TMP/s"
san_run "train llama-tiny" ok $NBA train "${C[@]}" --model llama-tiny --steps 3 --val-data "$VAL" --eval-every 3 --out "$TMP/l"
CTR=(--model seqctr --data "synth:cap=1000,items=2000,calib=16384,max_len=16" --emb-dim 16 --blocks 2 --cross-rank 32 \
     --block-hidden 64 --batch 64 --eval-samples 128 --quiet)
san_run "train seqctr plain" ok $NBA train "${CTR[@]}" --steps 3 --out "$TMP/ctr"
san_run "train seqctr erase" ok $NBA train "${CTR[@]}" --steps 3 --detach all --schedule erase --out "$TMP/ctr-e"
san_run "eval" ok $NBA eval --ckpt "$TMP/g" --data "$VAL" --batches 2
san_run "sample" ok $NBA sample --ckpt "$TMP/l" --prompt "My fellow citizens" --tokens 8
san_run "export" ok $NBA export --ckpt "$TMP/g" --hf "$TMP/hf"
head -c 20000 "$ROOT"/data/sotu/raw/1790_george_washington_n.txt > "$TMP/a.txt"
san_run "tokenize" ok $NBA tokenize --tokenizer "$ROOT/data/gpt2" --eot-between --out "$TMP/a.bin" "$TMP/a.txt"
# a Hugging Face tokenizer (Llama 2's, the smallest file) on text and on chat examples, when
# scripts/fetch_data.sh tokenizers has been run
if [ -f "$ROOT/data/hf_tokenizers/llama2/tokenizer.json" ]; then
    printf '\xff <s>[INST] caf\xc3\xa9 \xf0\x9f\x98\x80 \xe2\x96\x81' >> "$TMP/a.txt"
    san_run "tokenize (Hugging Face)" ok $NBA tokenize --tokenizer "$ROOT/data/hf_tokenizers/llama2" --bos --eot-between \
        --out "$TMP/h.bin" "$TMP/a.txt"
    printf '%s\n' '{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi \u00e9"}, {"role": "assistant", "content": " Hello \u2581 </s>"}]}' \
        '{"instruction": "Name one.", "output": "Washington"}' > "$TMP/chat.jsonl"
    san_run "tokenize --chat" ok $NBA tokenize --tokenizer "$ROOT/data/hf_tokenizers/llama2" --chat --out "$TMP/c.bin" "$TMP/chat.jsonl"
fi
CRITEO=$ROOT/../shared/data/ctr_samples/criteo_kaggle_200.tsv
if [ ! -f "$CRITEO" ]; then
    CRITEO=$TMP/criteo.tsv # a few synthetic rows in the Kaggle layout: label, 13 ints, 26 hex categories
    for i in $(seq 40); do
        printf '%d' $((i % 2)); for j in $(seq 13); do printf '\t%d' $(( (i * j) % 17 )); done
        for j in $(seq 26); do printf '\t%08x' $(( (i * 7919 + j * 104729) % 4294967296 )); done; printf '\n'
    done > "$CRITEO"
fi
san_run "criteo-convert" ok $NBA criteo-convert --in "$CRITEO" --out "$TMP/criteo.bin"
san_run "train seqctr on criteo binary" ok $NBA train "${CTR[@]}" --data "criteo:$TMP/criteo.bin" --eval-samples 16 \
    --batch 16 --steps 2 --table-cap 1000
san_run "synth-dump" ok $NBA synth-dump --quiet --data "synth:cap=1000,items=2000,calib=16384,max_len=16" --samples 200 \
    --out "$TMP/synth.bin"
san_run "timeline" ok $NBA timeline --trace "$TMP/erase.json" --step 2 --out "$TMP/step2.svg"
cp -r "$TMP/g" "$TMP/bad"; head -c 3000 "$TMP/g/ckpt/model.safetensors" > "$TMP/bad/ckpt/model.safetensors"
san_run "truncated checkpoint" error $NBA train --resume "$TMP/bad" --steps 6 --no-progress --quiet
head -c 5000 "$TRAIN" > "$TMP/short.bin"
san_run "truncated shard" error $NBA train "${C[@]}" --model gpt2-tiny --steps 1 --data "$TMP/short.bin"
echo "commands under ASan: $(( $(date +%s) - t0 )) s"
finish
