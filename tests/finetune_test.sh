#!/usr/bin/env bash
# Fine-tuning an imported Hugging Face checkpoint through every transformer schedule (issue 32,
# point 4), on chat data with a loss mask:
#  - the "published" model is a llama-shaped run exported with `nobubble export --hf`;
#  - `train --init-from` on `tokenize --chat` data (Llama 2's tokenizer when it is fetched, else a
#    shard with a prompt/response-like mask): --schedule stream and --schedule erase (with
#    --detach 1, against plain with the same --detach) give plain's bits; 2 ranks (mpirun) give
#    --grad-accum 2's;
#  - a run stopped after 3 steps and started again with the same command resumes to the straight
#    run's bits (the imported weights are not read again);
#  - `eval` of the finished run prints training's last (masked) validation loss.
source "$(dirname "$0")/lib.sh"
need_sotu
M=(--vocab 32000 --dim 32 --heads 2 --kv-heads 1 --ffn 64 --layers 2 --seq 32)
mask_shard "$TRAIN" "$TMP/base.bin" 20000 none
$NB train --model llama-tiny "${M[@]}" --batch 4 --steps 2 --data "$TMP/base.bin" --val-data none --no-progress --quiet \
    --out "$TMP/base" 2>"$TMP/base.log" && $NB export --ckpt "$TMP/base" --hf "$TMP/hf" >/dev/null 2>&1 \
    || { cat "$TMP/base.log"; fail "the llama-shaped model to import"; finish; }

HF=$ROOT/data/hf_tokenizers/llama2
if [ -f "$HF/tokenizer.json" ]; then
    # chat examples: a passage of an address and the passage that follows it
    head -c 60000 "$ROOT/data/sotu/raw/1790_george_washington_n.txt" > "$TMP/a.txt" 2>/dev/null || cp "$ROOT/README.md" "$TMP/a.txt"
    awk 'BEGIN { RS = "[.] " } { s[n++] = $0 } END { for (i = 0; i + 2 < n; i += 2)
        printf "{\"messages\": [{\"role\": \"user\", \"content\": \"Continue: %s.\"}, {\"role\": \"assistant\", \"content\": \"%s.\"}]}\n",
            s[i], s[i + 1] }' "$TMP/a.txt" | tr -d '\r' | sed 's/\\/ /g' > "$TMP/chat.jsonl"
    head -n 40 "$TMP/chat.jsonl" > "$TMP/val.jsonl"
    $NB tokenize --tokenizer "$HF" --chat --out "$TMP/train.bin" "$TMP/chat.jsonl" >/dev/null \
        && $NB tokenize --tokenizer "$HF" --chat --out "$TMP/val.bin" "$TMP/val.jsonl" >/dev/null \
        || { fail "tokenize --chat"; finish; }
    what="tokenize --chat (Llama 2)"
else
    mask_shard "$TRAIN" "$TMP/train.bin" 20000 runs
    mask_shard "$VAL" "$TMP/val.bin" 5000 runs
    what="a prompt/response-like mask (no Llama 2 tokenizer: bash scripts/fetch_data.sh tokenizers)"
fi
F=(--init-from "$TMP/hf" --seq 32 --batch 8 --steps 6 --data "$TMP/train.bin" --val-data "$TMP/val.bin" --eval-every 3
   --eval-batches 4 --no-progress --threads 1)
run() { # TAG ARGS...: a fine-tuning run into $TMP/TAG
    local tag=$1; shift
    $NB train "${F[@]}" --out "$TMP/$tag" "$@" >"$TMP/$tag.log" 2>&1 || { fail "$tag: exit $?"; tail -3 "$TMP/$tag.log"; }
}
run plain
grep -q "trains on .* of .* tokens" "$TMP/plain.log" && pass "imported model on $what: $(grep -o 'trains on .*' "$TMP/plain.log")" \
    || fail "no masked-data line"
run stream --schedule stream
same_state "imported, masked: --schedule stream vs plain" "$TMP/plain" "$TMP/stream"
run dplain --detach 1
run erase --detach 1 --schedule erase
same_state "imported, masked: --schedule erase vs plain (both --detach 1)" "$TMP/dplain" "$TMP/erase"
if command -v mpirun >/dev/null; then
    run accum --grad-accum 2
    mpirun --oversubscribe --allow-run-as-root -np 2 $NB train "${F[@]}" --out "$TMP/ranks" >"$TMP/ranks.log" 2>&1 \
        || { fail "mpirun -np 2"; tail -5 "$TMP/ranks.log"; }
    same_state "imported, masked: 2 ranks vs one rank with --grad-accum 2" "$TMP/accum" "$TMP/ranks"
else
    echo "note: no mpirun: the ranks check is skipped (scripts/setup.sh installs openmpi-bin)"
fi
run again --stop-after 3
run again
same_state "imported, masked: stopped after 3 steps, the same command again, vs straight" "$TMP/plain" "$TMP/again"
want=$(grep -o 'validation loss [0-9.]*' "$TMP/plain.log" | tail -n 1 | awk '{print $3}')
got=$($NB eval --ckpt "$TMP/plain" 2>/dev/null | grep -o 'loss [0-9.]* nats' | awk '{print $2}')
[ -n "$want" ] && [ "$want" = "$got" ] && pass "eval of the imported run: $got, training's last validation loss" \
    || fail "eval $got vs training's last validation loss $want"
finish
