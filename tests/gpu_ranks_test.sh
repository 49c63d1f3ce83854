#!/usr/bin/env bash
# Ranks on the GPU machine (skips without a GPU or mpirun). With one GPU, two ranks share it and
# talk over --comm host (NCCL refuses two ranks on one GPU):
#  - fp32: two GPU ranks follow two CPU ranks (losses within 1e-4 relative over 20 steps);
#  - bf16: two GPU ranks give one GPU rank's bits with --grad-accum 2; the same twice; --graphs
#    gives the eager ranks' bits; --comm auto picks host for ranks sharing a GPU;
#  - seqctr with the tables sharded over the two ranks: fp32 follows two CPU ranks, bf16 twice and
#    with --graphs bitwise, and with --comm-sm-free (all-to-alls by CUDA IPC copies); one rank through
#    NCCL with one shard gives the unsharded losses, with --comm-sm-free too;
#  - --schedule pipe bitwise the synchronous schedule at 1 and 2 ranks (also --graphs, --emb-priority), and its
#    next-batch fetch beside the step's compute in the trace of a B=4096 run;
#  - NCCL with one rank (a communicator of one, the code path of many) gives the bits of a run
#    without a communicator, eager and with --graphs; --comm nccl for ranks sharing a GPU is a
#    clear error.
source "$(dirname "$0")/lib.sh"
"$NB" info >/dev/null 2>&1 || { echo "skip: $("$NB" info | head -n 1 | sed 's/  */ /g')"; exit 77; }
command -v mpirun >/dev/null || { echo "skip: no mpirun (install openmpi-bin: scripts/setup.sh)"; exit 77; }
need_sotu
MPI=(mpirun -np 2 --oversubscribe --allow-run-as-root)
T=(--model gpt2-tiny --batch 8 --steps 20 --data "$TRAIN" --val-data none --no-progress --seed 5)
run() { # run NAME CMD...: fails the check with the log's tail when CMD fails
    local name=$1; shift
    "$@" >"$TMP/run.log" 2>&1 || { fail "$name (exit $?)"; tail -n 5 "$TMP/run.log"; }
}
run "two CPU ranks" "${MPI[@]}" $NB train "${T[@]}" --device cpu --threads 1 --out "$TMP/cpu2"
run "two GPU ranks, fp32, --comm host" "${MPI[@]}" $NB train "${T[@]}" --device cuda --precision fp32 --comm host --out "$TMP/f32"
worst=$(worst_loss_diff "$TMP/cpu2" "$TMP/f32")
awk -v w="$worst" 'BEGIN {exit !(w < 1e-4)}' && pass "two GPU ranks (fp32, --comm host) follow two CPU ranks: worst loss rel diff $worst" \
    || fail "two GPU ranks vs two CPU ranks, fp32: loss rel diff $worst"

run "one GPU rank, --grad-accum 2" $NB train "${T[@]}" --device cuda --grad-accum 2 --out "$TMP/acc"
run "two GPU ranks, bf16" "${MPI[@]}" $NB train "${T[@]}" --device cuda --comm auto --out "$TMP/dp"
grep -q -- "--comm host" "$TMP/run.log" && pass "--comm auto picks host for two ranks sharing a GPU" \
    || fail "--comm auto with ranks sharing a GPU: $(grep ranks "$TMP/run.log")"
same_state "two GPU ranks vs one GPU rank with --grad-accum 2" "$TMP/acc" "$TMP/dp"
run "two GPU ranks again" "${MPI[@]}" $NB train "${T[@]}" --device cuda --out "$TMP/dp2"
same_state "two GPU ranks twice" "$TMP/dp" "$TMP/dp2"
run "two GPU ranks, --graphs" "${MPI[@]}" $NB train "${T[@]}" --device cuda --graphs --out "$TMP/dpg"
same_state "two GPU ranks with --graphs vs eager" "$TMP/dp" "$TMP/dpg"

run "one GPU rank" $NB train "${T[@]}" --device cuda --out "$TMP/one"
run "one GPU rank, --comm nccl" $NB train "${T[@]}" --device cuda --comm nccl --out "$TMP/nccl1"
grep -q -- "--comm nccl" "$TMP/run.log" && same_state "one rank through an NCCL communicator of one vs no communicator" "$TMP/one" "$TMP/nccl1" \
    || fail "--comm nccl with one rank did not run through NCCL: $(grep -i 'ranks\|error' "$TMP/run.log" | head -n 2)"
run "one GPU rank, --comm nccl --graphs" $NB train "${T[@]}" --device cuda --comm nccl --graphs --out "$TMP/nccl1g"
same_state "NCCL communicator of one with --graphs vs no communicator" "$TMP/one" "$TMP/nccl1g"
# seqctr, tables sharded over the two ranks (--emb-shard row: rows and gradients exchanged by
# all-to-alls over --comm host), the dense part data parallel
S=(--model seqctr --data "synth:cap=1000,items=2000,calib=16384,max_len=16" --emb-dim 16 --blocks 2 --cross-rank 32
   --block-hidden 64 --batch 256 --steps 20 --eval-every 10 --eval-samples 2048 --seed 3)
run "seqctr: two CPU ranks" "${MPI[@]}" $NB train "${S[@]}" --device cpu --threads 1 --out "$TMP/sc-cpu"
run "seqctr: two GPU ranks, fp32" "${MPI[@]}" $NB train "${S[@]}" --device cuda --precision fp32 --out "$TMP/sc-f32"
# row-wise Adagrad grows rounding differences step by step (tests/gpu_seqctr_test.sh): the first
# 4 steps are the parity check
early=$(paste <(losses "$TMP/sc-cpu") <(losses "$TMP/sc-f32") | head -n 4 | awk '{d=($1-$2)/$1; if (d<0) d=-d; if (d>w) w=d} END {printf "%.3g", w}')
awk -v w="$early" 'BEGIN {exit !(w < 1e-5)}' && pass "seqctr: two GPU ranks (fp32, sharded tables) follow two CPU ranks (first 4 steps within $early; 20 steps: $(worst_loss_diff "$TMP/sc-cpu" "$TMP/sc-f32"))" \
    || fail "seqctr: two GPU ranks vs two CPU ranks: $early"
run "seqctr: two GPU ranks, bf16" "${MPI[@]}" $NB train "${S[@]}" --device cuda --out "$TMP/sc-a"
run "seqctr: two GPU ranks, bf16 again" "${MPI[@]}" $NB train "${S[@]}" --device cuda --out "$TMP/sc-b"
run "seqctr: two GPU ranks, --graphs" "${MPI[@]}" $NB train "${S[@]}" --device cuda --graphs --out "$TMP/sc-g"
# --comm-sm-free: the rows' and gradients' all-to-alls as CUDA IPC copies between the two ranks
# (reductions still --comm host): pure data movement, so the bits of the run above
run "seqctr: two GPU ranks, --comm-sm-free" "${MPI[@]}" $NB train "${S[@]}" --device cuda --comm-sm-free --out "$TMP/sc-sf"
grep -q "copy engines" "$TMP/run.log" || fail "--comm-sm-free: no 'copy engines' in the ranks line: $(grep ranks "$TMP/run.log")"
for d in sc-b sc-g sc-sf; do
    ok=1
    for f in "$TMP/sc-a"/ckpt/*.safetensors; do cmp -s "$f" "$TMP/$d/ckpt/$(basename "$f")" || ok=0; done
    [ $ok = 1 ] && [ "$(losses "$TMP/sc-a")" = "$(losses "$TMP/$d")" ] && pass "seqctr: two GPU ranks vs $d: bitwise (dense, optimizer, both shards, losses)" \
        || fail "seqctr: two GPU ranks vs $d differ"
done
run "seqctr: one GPU rank" $NB train "${S[@]}" --device cuda --out "$TMP/sc-1"
run "seqctr: one GPU rank, NCCL, sharded" $NB train "${S[@]}" --device cuda --comm nccl --emb-shard row --out "$TMP/sc-1n"
[ -n "$(losses "$TMP/sc-1")" ] && [ "$(losses "$TMP/sc-1")" = "$(losses "$TMP/sc-1n")" ] \
    && pass "seqctr: one rank through NCCL with the tables as one shard: the unsharded run's losses" || fail "seqctr: one rank NCCL sharded differs"
run "seqctr: one GPU rank, NCCL, sharded, --comm-sm-free" $NB train "${S[@]}" --device cuda --comm nccl --emb-shard row --comm-sm-free \
    --out "$TMP/sc-1nf"
[ -n "$(losses "$TMP/sc-1n")" ] && [ "$(losses "$TMP/sc-1n")" = "$(losses "$TMP/sc-1nf")" ] \
    && pass "seqctr: one NCCL rank with --comm-sm-free (all-to-alls on its copy-engine lane): the same losses" \
    || fail "seqctr: one NCCL rank with --comm-sm-free differs"

# --schedule pipe on the GPU: bitwise the synchronous schedule at one rank and at two ranks sharing
# the GPU, with --graphs too; at a size where the next batch's fetch has compute to hide behind,
# the trace shows it beside the step's compute
for n in 1 2; do
    L=(); [ $n = 2 ] && L=("${MPI[@]}")
    run "seqctr sync, $n rank(s)" "${L[@]}" $NB train "${S[@]}" --device cuda --emb-shard row --out "$TMP/ps$n"
    for v in "" "--graphs" "--emb-priority" "--emb-priority --graphs"; do
        run "seqctr pipe $v, $n rank(s)" "${L[@]}" $NB train "${S[@]}" --device cuda --schedule pipe $v --out "$TMP/pp$n${v// /}"
        ok=1
        for f in "$TMP/ps$n"/ckpt/*.safetensors; do cmp -s "$f" "$TMP/pp$n${v// /}/ckpt/$(basename "$f")" || ok=0; done
        [ $ok = 1 ] && [ "$(losses "$TMP/ps$n")" = "$(losses "$TMP/pp$n${v// /}")" ] && pass "GPU pipe $v at $n rank(s): bitwise sync" \
            || fail "GPU pipe $v at $n rank(s) differs from sync"
    done
done
# --emb-place host: each owner's shard and its optimizer state in pinned host memory, read and
# written in place by the device's own kernels: the same bits as the shards in device memory
for opt in adam adagrad; do
    run "seqctr $opt, shards on the device" $NB train "${S[@]}" --device cuda --emb-shard row --emb-optim $opt --out "$TMP/pg-$opt"
    for sc in plain pipe; do
        run "seqctr $opt $sc, shards on the host" $NB train "${S[@]}" --device cuda --emb-shard row --schedule $sc --emb-place host --emb-optim $opt \
            --out "$TMP/ph-$opt-$sc"
        ok=1
        for f in "$TMP/pg-$opt"/ckpt/*.safetensors; do cmp -s "$f" "$TMP/ph-$opt-$sc/ckpt/$(basename "$f")" || ok=0; done
        [ $ok = 1 ] && [ -n "$(losses "$TMP/pg-$opt")" ] && [ "$(losses "$TMP/pg-$opt")" = "$(losses "$TMP/ph-$opt-$sc")" ] \
            && pass "GPU $sc --emb-place host ($opt): losses and checkpoint of the shards on the device, bitwise" \
            || fail "GPU $sc --emb-place host ($opt) differs from the shards on the device"
    done
done
run "seqctr pipe, traced" $NB train --model seqctr --device cuda --data "synth:cap=1000000,max_len=256" --emb-dim 64 \
    --max-len 256 --table-cap 1000000 --batch 4096 --steps 8 --eval-every 0 --no-ckpt --schedule pipe --trace "$TMP/pipe.json"
python3 - "$TMP/pipe.json" > "$TMP/pov.txt" 2>&1 <<'PYEOF'
import json, re, sys
t = json.load(open(sys.argv[1])); ev = t["traceEvents"] if isinstance(t, dict) else t
lanes = {e["tid"]: e["args"]["name"] for e in ev if e.get("ph") == "M" and e.get("name") == "thread_name"}
X = [e for e in ev if e.get("ph") == "X" and e.get("args", {}).get("step", -1) >= 2]
nxt = [e for e in X if e["name"].endswith(" (next)")]
comp = [e for e in X if lanes.get(e["tid"]) == "compute" and re.search("fwd|bwd", e["name"])]
hid = [a for a in nxt if any(b["ts"] < a["ts"] + a["dur"] and a["ts"] < b["ts"] + b["dur"] for b in comp)]
print(f"{len(hid)} of {len(nxt)} next-batch spans (upload, lookups, rows all-to-all) ran beside a forward or backward span")
sys.exit(0 if nxt and hid else 1)
PYEOF
[ $? = 0 ] && pass "GPU pipe overlaps: $(cat "$TMP/pov.txt")" || fail "GPU pipe: no overlap ($(cat "$TMP/pov.txt"))"

ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if [ "$ngpu" -eq 1 ]; then
    "${MPI[@]}" $NB train "${T[@]}" --device cuda --comm nccl --steps 1 --out "$TMP/dup" >"$TMP/dup.log" 2>&1
    rc=$?
    [ $rc -ne 0 ] && grep -q "ranks share a GPU" "$TMP/dup.log" \
        && pass "--comm nccl with two ranks on one GPU: $(grep -m1 -o 'error:.*' "$TMP/dup.log")" \
        || { fail "--comm nccl, ranks sharing a GPU: exit $rc"; tail -n 3 "$TMP/dup.log"; }
fi
finish
