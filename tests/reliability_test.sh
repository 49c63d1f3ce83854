#!/usr/bin/env bash
# Issue 14 (reliability), the parts outside the training loop: every case ends in one clear error
# line (or the documented note) within seconds, never a hang, a crash or a silent success.
#  - inputs must be regular files: a FIFO as --data or as a tokenize input, /dev/zero behind a
#    checkpoint's state.json (each under `timeout`, so a regression fails instead of hanging);
#  - a checkpoint's data_pos outside the shard (-1 wrapped around the loader's bounds check);
#  - tokenize of an empty file is an error (it wrote a 0-token shard and exited 0), and a good
#    file next to it does not change that;
#  - a flipped byte in a checkpoint tensor is caught by its checksum (resume and eval);
#  - a checkpoint written to a full disk (a 20 MB tmpfs, when this machine lets us mount one)
#    fails with the real cause, "No space left on device" (was "Input/output error");
#  - --threads beyond the cores available is capped, with one note;
#  - tokenize of a 2 MB run of letters without a space takes seconds (the merge loop was
#    quadratic: 79 s for 1 MB; tests/test_tokenizer checks the ids against that loop);
source "$(dirname "$0")/lib.sh"
need_sotu
T=(train --model gpt2-tiny --batch 2 --steps 2 --no-progress --val-data none --quiet)

# within SECONDS: expect_error under a timeout (exit 124 from timeout fails expect_error)
quick_error() {
    local name=$1 pat=$2; shift 2
    expect_error "$name" "$pat" timeout 10 "$@"
}

mkfifo "$TMP/fifo"
quick_error "FIFO as --data" "fifo' is a FIFO (named pipe), not a regular file" $NB "${T[@]}" --data "$TMP/fifo"
quick_error "FIFO as a tokenize input" "fifo' is a FIFO" $NB tokenize --tokenizer "$ROOT/data/gpt2" --out "$TMP/t.bin" "$TMP/fifo"
$NB "${T[@]}" --data "$TRAIN" --out "$TMP/run" || fail "reference run"
cp -r "$TMP/run" "$TMP/zero"; rm "$TMP/zero/ckpt/state.json"; ln -s /dev/zero "$TMP/zero/ckpt/state.json"
quick_error "/dev/zero as state.json" "state.json' is a character device" $NB train --resume "$TMP/zero" --steps 4
cp -r "$TMP/run" "$TMP/pos"; sed -i 's/"data_pos": *[0-9]*/"data_pos": -1/' "$TMP/pos/ckpt/state.json"
grep -q '"data_pos": -1' "$TMP/pos/ckpt/state.json" || fail "could not set data_pos in state.json"
quick_error "data_pos -1 in state.json" "data_pos -1 is negative" $NB train --resume "$TMP/pos" --steps 4
# a position past the shard passes the state's check and stops at the loader's
sed -i 's/"data_pos": *-1/"data_pos": 99999999999/' "$TMP/pos/ckpt/state.json"
quick_error "data_pos past the shard" "data position 99999999999 .*is not a batch start in shard '$TRAIN'" \
    $NB train --resume "$TMP/pos" --steps 4
: > "$TMP/empty.txt"; echo "some text" > "$TMP/some.txt"
quick_error "tokenize of an empty file" "empty.txt' is empty; nothing to tokenize" \
    $NB tokenize --tokenizer "$ROOT/data/gpt2" --out "$TMP/e.bin" "$TMP/some.txt" "$TMP/empty.txt"
[ ! -e "$TMP/e.bin" ] && pass "no shard written for an empty input" || fail "a shard was written for an empty input"
tr -dc 'a-z' < /dev/urandom | head -c 2097152 > "$TMP/word.txt"
t0=$(date +%s%N)
timeout 60 $NB tokenize --tokenizer "$ROOT/data/gpt2" --out "$TMP/word.bin" "$TMP/word.txt" > "$TMP/tok.out" 2>&1
rc=$?; dt=$(( ($(date +%s%N) - t0) / 1000000 ))
[ $rc -eq 0 ] && [ $dt -lt 20000 ] && [ "$(stat -c %s "$TMP/word.bin")" -gt 1000000 ] \
    && pass "2 MB word tokenized in $dt ms" || fail "2 MB word: exit $rc after $dt ms: $(tail -n 1 "$TMP/tok.out")"
flip_byte() { # FILE OFFSET_FROM_END
    local size=$(stat -c %s "$1") b
    b=$(od -An -tu1 -j $((size - $2)) -N1 "$1" | tr -d ' ')
    printf "$(printf '\\%03o' $(( b ^ 1 )))" | dd of="$1" bs=1 seek=$((size - $2)) conv=notrunc status=none
}
cp -r "$TMP/run" "$TMP/flip"; flip_byte "$TMP/flip/ckpt/model.safetensors" 100
quick_error "flipped byte in model.safetensors (resume)" "checksum mismatch in tensor '.*' of '$TMP/flip/ckpt/model.safetensors': the file is damaged" \
    $NB train --resume "$TMP/flip" --steps 4
quick_error "flipped byte in model.safetensors (eval)" "checksum mismatch in tensor" $NB eval --ckpt "$TMP/flip" --data "$TRAIN"
cp -r "$TMP/run" "$TMP/flip2"; flip_byte "$TMP/flip2/ckpt/optim.safetensors" 3
quick_error "flipped byte in optim.safetensors" "checksum mismatch in tensor '.*' of '$TMP/flip2/ckpt/optim.safetensors'" \
    $NB train --resume "$TMP/flip2" --steps 4
timeout 120 $NB train --model gpt2-tiny --batch 2 --steps 1 --no-progress --val-data none --data "$TRAIN" \
    --threads 100000 > "$TMP/thr.out" 2> "$TMP/thr.err"; rc=$?
cores=$(env -u OMP_NUM_THREADS nproc)   # nproc answers OMP_NUM_THREADS when it is set; --threads does not
n=$(grep -c "^note: --threads 100000 capped at $cores (the cores available)$" "$TMP/thr.err")
[ $rc -eq 0 ] && [ "$n" -eq 1 ] && pass "--threads 100000: one note, capped at $cores" \
    || fail "--threads 100000: exit $rc, $n notes: $(grep -i thread "$TMP/thr.err" | head -3)"
mkdir -p "$TMP/small"
if mount -t tmpfs -o size=20m tmpfs "$TMP/small" 2>/dev/null; then
    trap 'umount "$TMP/small" 2>/dev/null; rm -rf "$TMP"' EXIT
    quick_error "checkpoint on a full disk" "(write failed): No space left on device (hint: check free space" \
        $NB "${T[@]}" --data "$TRAIN" --out "$TMP/small/run"
    umount "$TMP/small"
else
    echo "note: cannot mount a tmpfs here: the full-disk write path is checked by test_io (/dev/full) only"
fi
finish
