#!/usr/bin/env bash
# kill -9 of a rank (issue 31): two CPU ranks (mpirun) training with --ckpt-every 1; one rank,
# picked at random, is killed with SIGKILL at a random (seeded) point: after a random delay, or
# the moment a checkpoint's temp file or directory shows in the run directory (inside a
# checkpoint write). The same command is run again (it resumes the run directory, recovering a
# half-swapped checkpoint) until the run ends; the final checkpoint must be byte-equal, file by
# file, to a straight run's. Both families: a transformer (data parallel) and seqctr (the tables
# sharded: every rank writes its shard). NB_KILL_SEED changes the points; NB_KILL_ROUNDS the kills.
source "$(dirname "$0")/lib.sh"
need_sotu
command -v mpirun >/dev/null || { echo "skip: no mpirun (install openmpi-bin: scripts/setup.sh)"; exit 77; }
RANDOM=${NB_KILL_SEED:-31}
ROUNDS=${NB_KILL_ROUNDS:-2}
MPI=(mpirun --oversubscribe --allow-run-as-root -np 2)
TF=(train --model gpt2-tiny --batch 4 --seq 32 --steps 6 --data "$TRAIN" --val-data none --threads 1)
SC=(train --model seqctr --data "synth:cap=1000,items=2000,calib=4096,max_len=8" --emb-dim 8 --blocks 2 --cross-rank 8
    --block-hidden 16 --batch 32 --steps 6 --eval-every 3 --eval-samples 64 --threads 1)
COMMON=(--ckpt-every 1 --no-progress --quiet)

# ckpt_step DIR: the step of the run directory's checkpoint (ckpt/, or the ckpt.old a crash left), 0: none
ckpt_step() {
    local s=$(cat "$1"/ckpt/state.json "$1"/ckpt.old/state.json 2>/dev/null | grep -o '"step": [0-9]*' | head -n 1 | cut -d' ' -f2)
    echo "${s:-0}"
}

# kill_one JOB_PID RUN_DIR MODE AT: SIGKILL one rank (picked at random) of the job once its run
# directory's checkpoint has reached step AT - 1: MODE write, the moment the next checkpoint
# write's temp file or directory shows (step AT's); MODE delay, 0-150 ms later (in step AT, or
# in a write)
kill_one() {
    local job=$1 dir=$2 mode=$3 at=$4 victim=$((RANDOM % 2))
    while kill -0 "$job" 2>/dev/null && [ "$(ckpt_step "$dir")" -lt $((at - 1)) ]; do sleep 0.01; done
    if [ "$mode" = delay ]; then
        sleep "$(awk -v r=$RANDOM 'BEGIN { printf "%.3f", (r % 150) / 1000 }')"
    else
        while kill -0 "$job" 2>/dev/null && ! ls "$dir" "$dir"/ckpt* 2>/dev/null | grep -q 'tmp'; do :; done
    fi
    local p pid=
    for p in $(pgrep -f -- "--out $dir"); do # the rank's own process (not timeout, mpirun)
        tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$victim" && pid=$p
    done
    if [ -z "$pid" ]; then echo "(the job had ended: $mode at step $at)"; return; fi
    kill -KILL "$pid" 2>/dev/null
    echo "killed rank $victim ($mode, checkpoint at step $(ckpt_step "$dir") then)"
}

# one family: a straight run, then a run killed ROUNDS times and continued to its end
family() {
    local name=$1; shift
    local cmd=("$@" "${COMMON[@]}")
    timeout 120 "${MPI[@]}" $NB "${cmd[@]}" --out "$TMP/$name-straight" >"$TMP/$name-straight.log" 2>&1 \
        || { fail "$name: straight run"; tail -5 "$TMP/$name-straight.log"; return; }
    local dir=$TMP/$name-killed k=0 tries=0 modes=(write delay) steps=$(echo "${cmd[@]}" | grep -o -- '--steps [0-9]*' | cut -d' ' -f2)
    for k in $(seq "$ROUNDS"); do
        local now=$(ckpt_step "$dir")
        [ "$now" -ge $((steps - 1)) ] && break
        # a step after the first this job trains (so a fresh checkpoint shows it runs), the last included
        local at=$((now + 2 + RANDOM % (steps - now - 1)))
        timeout 120 "${MPI[@]}" $NB "${cmd[@]}" --out "$dir" >"$TMP/$name-k$k.log" 2>&1 &
        local job=$!
        echo "$name round $k: $(kill_one $job "$dir" "${modes[$((RANDOM % 2))]}" $at)"
        wait $job
        echo "  exit $?, checkpoint at step $(ckpt_step "$dir")"
        grep -E "Sanitizer|internal check failed" "$TMP/$name-k$k.log" && fail "$name round $k: a crash report"
    done
    until [ $tries -ge 4 ] || timeout 120 "${MPI[@]}" $NB "${cmd[@]}" --out "$dir" >"$TMP/$name-end.log" 2>&1; do
        tries=$((tries + 1)) # a resume must not fail; the retries only show how often it did
        fail "$name: the resume after the kills failed (attempt $tries)"; tail -3 "$TMP/$name-end.log"
    done
    local f same=1
    for f in "$TMP/$name-straight"/ckpt/*; do
        cmp -s "$f" "$dir/ckpt/$(basename "$f")" || { same=0; echo "differs: $(basename "$f")"; }
    done
    [ "$(ls "$TMP/$name-straight/ckpt" | wc -l)" = "$(ls "$dir/ckpt" | wc -l)" ] || same=0
    [ $same = 1 ] && pass "$name: killed $ROUNDS times (kill -9 of a rank), resumed: every checkpoint file equals the straight run's ($(ls "$dir/ckpt" | tr '\n' ' '))" \
        || fail "$name: the resumed run's checkpoint differs from the straight run's"
}

t0=$(date +%s)
family transformer "${TF[@]}"
family seqctr "${SC[@]}"
echo "$(( $(date +%s) - t0 )) s"
finish
