#!/usr/bin/env bash
# Issue 31 (reliability, round three): one check per numbered defect, named after it. Each failed
# before its fix (the issue's reproduction) and passes after it.
#  1. a MovieLens item id of 4294967295 wrapped a row count and overflowed the heap;
#  3. two ranks resuming a checkpoint a crash left half-swapped (only ckpt.old): rank 1 found none;
#  4. --trace F followed a symlink planted at F.tmp and overwrote its target;
#  7. criteo-convert left OUT.tmp.PID.N behind on failure, and read a file without newlines whole;
#  8. a resume without --threads was not bitwise (the thread count was not kept);
#  9. ranks started with different options trained to the end.
source "$(dirname "$0")/lib.sh"
need_sotu
T=(train --model gpt2-tiny --batch 4 --seq 32 --no-progress --val-data none --quiet --data "$TRAIN")

# ---- 1: MovieLens ids are range-checked where they are read
mkdir -p "$TMP/ml/data/movielens"
header=$'label\tuser\titem\tyear\tgenre\thour\tweekday\ttimestamp\thistory'
for f in train test; do
    { echo "$header"; printf '1\t1\t4294967295\t1995\t3\t10\t2\t900000000\t5 6\n'; printf '0\t2\t7\t1995\t3\t10\t2\t900000001\t5\n'; } \
        > "$TMP/ml/data/movielens/clicks_$f.tsv"
done
(cd "$TMP/ml" && expect_error "defect 1: MovieLens item id 4294967295" "clicks_train.tsv:2: id 4294967295 is out of range" \
    "$NB" train --model seqctr --data movielens --steps 1 --batch 2 --no-progress --eval-samples 1)

# ---- 3: ranks resume a checkpoint that only ckpt.old holds
if command -v mpirun >/dev/null; then
    MPI=(mpirun --oversubscribe --allow-run-as-root -np 2)
    "${MPI[@]}" $NB "${T[@]}" --threads 1 --steps 4 --out "$TMP/straight" || fail "straight 2-rank run"
    "${MPI[@]}" $NB "${T[@]}" --threads 1 --steps 4 --stop-after 2 --out "$TMP/half" || fail "2-rank run to step 2"
    mv "$TMP/half/ckpt" "$TMP/half/ckpt.old"
    if timeout 120 "${MPI[@]}" $NB train --resume "$TMP/half" --quiet >"$TMP/r3.out" 2>&1; then
        pass "defect 3: two ranks resume from ckpt.old"
        same_state "defect 3: the resumed run equals the straight one" "$TMP/straight" "$TMP/half"
    else
        fail "defect 3: two ranks cannot resume from ckpt.old"; tail -5 "$TMP/r3.out"
    fi

    # ---- 9: ranks with different options never train
    expect_error_ranks "defect 9: --seed differs between the ranks" "--seed differs between the ranks" \
        "${MPI[@]}" bash -c 'exec "$@" $( [ "$OMPI_COMM_WORLD_RANK" = 1 ] && echo --seed 9 )' _ $NB "${T[@]}" --threads 1 --steps 2 --no-ckpt
    expect_error_ranks "defect 9: --lr differs between the ranks" "--lr differs between the ranks" \
        "${MPI[@]}" bash -c 'exec "$@" $( [ "$OMPI_COMM_WORLD_RANK" = 1 ] && echo --lr 0.01 )' _ $NB "${T[@]}" --threads 1 --steps 2 --no-ckpt
    expect_error_ranks "defect 9: the model differs between the ranks" "differs between the ranks" \
        "${MPI[@]}" bash -c 'exec "$@" $( [ "$OMPI_COMM_WORLD_RANK" = 1 ] && echo --layers 3 )' _ $NB "${T[@]}" --threads 1 --steps 2 --no-ckpt
else
    echo "skip: defects 3 and 9 (no mpirun)"
fi

# ---- 4: --trace never writes through a planted link
echo "precious" > "$TMP/victim"
ln -s "$TMP/victim" "$TMP/trace.json.tmp"
$NB "${T[@]}" --steps 1 --no-ckpt --trace "$TMP/trace.json" || fail "run with --trace"
[ "$(cat "$TMP/victim")" = precious ] && pass "defect 4: the link's target is untouched" || fail "defect 4: --trace wrote through $TMP/trace.json.tmp"
grep -q traceEvents "$TMP/trace.json" && pass "defect 4: the trace is written" || fail "defect 4: no trace"

# ---- 7: criteo-convert leaves no temp file and bounds its lines
mkdir "$TMP/cv"
printf '0\t1\n' > "$TMP/cv/bad.tsv"
expect_error "defect 7: a bad line under --strict" "bad Criteo line" $NB criteo-convert --in "$TMP/cv/bad.tsv" --out "$TMP/cv/out.bin" --strict
head -c 3000000 /dev/zero | tr '\0' 'x' > "$TMP/cv/long.tsv"
expect_error "defect 7: a file without newlines is refused at its first MiB" "line 1 is longer than 1048575 bytes" \
    timeout 10 $NB criteo-convert --in "$TMP/cv/long.tsv" --out "$TMP/cv/out.bin"
left=$(ls "$TMP/cv" | grep -c 'out.bin')
[ "$left" = 0 ] && pass "defect 7: no temp file left behind" || { fail "defect 7: left behind:"; ls "$TMP/cv"; }

# ---- 8: a resume keeps the thread count (the CPU GEMMs' sums depend on it)
$NB "${T[@]}" --threads 1 --steps 4 --out "$TMP/t1" || fail "straight --threads 1"
$NB "${T[@]}" --threads 1 --steps 4 --stop-after 2 --out "$TMP/t1r" || fail "--threads 1 to step 2"
$NB train --resume "$TMP/t1r" --quiet --no-progress || fail "resume without --threads"
same_state "defect 8: a resume without --threads" "$TMP/t1" "$TMP/t1r"
$NB "${T[@]}" --threads 1 --steps 4 --stop-after 2 --out "$TMP/t2r" || fail "--threads 1 to step 2 (again)"
$NB train --resume "$TMP/t2r" --no-progress --threads 2 2>"$TMP/t2.err" >/dev/null || fail "resume with --threads 2"
grep -q "note: --threads 2 differs from the checkpoint's 1" "$TMP/t2.err" && pass "defect 8: a changed --threads is noted" ||
    fail "defect 8: no note on a changed --threads"
finish
