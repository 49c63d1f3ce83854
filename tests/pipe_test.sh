#!/usr/bin/env bash
# --schedule pipe (NestPipe's dual-buffer pipelining, seqctr) on CPU ranks:
#  - bitwise the synchronous schedule (plain, the tables sharded the same way) at 1, 2 and 4 ranks:
#    dense weights, AdamW state, every shard, every step's loss; also with --graphs, sparse Adam,
#    and a stop + resume;
#  - the re-sync of the rows a step updates is what keeps it so: --pipe-skip-resync (a debug switch)
#    leaves them stale, and the results differ;
#  - the trace: from the second step on, the next batch's lookups and rows all-to-all run inside
#    the step before it (before its table update), and no step but the first fetches its own rows;
#  - --emb-place host (owners' shards in host memory) gives the same bits;
#  - --micro-batches M (Frozen-Window Pipelining): pipe bitwise its synchronous twin, following the
#    whole batch within rounding; --cluster-keys keeps NE within 0.1% and reports the rows moved;
#  - --emb-priority (FreeScale): only the exclusive rows move ahead, the collision rows after the
#    update: bitwise sync and pipe (1, 2, 4 ranks; host placement, graphs, sparse Adam, FWP); the
#    trace shows the exclusive rows moved before the step's update and the collision rows' all-to-all
#    first on the comm lane after it;
#  - metrics.jsonl: rows moved and re-synced per step, exposed transfer %; clear refusals.
source "$(dirname "$0")/lib.sh"
command -v mpirun >/dev/null || { echo "skip: no mpirun (install openmpi-bin: scripts/setup.sh)"; exit 77; }
MPI=(mpirun --oversubscribe --allow-run-as-root)
C=(--model seqctr --data "synth:cap=1000,items=2000,calib=16384,max_len=16" --emb-dim 16 --blocks 3 --cross-rank 32
   --block-hidden 64 --batch 64 --steps 20 --eval-every 10 --eval-samples 512 --quiet --threads 1 --seed 4 --emb-shard row)
run() { # run NAME CMD...
    local name=$1; shift
    "$@" >"$TMP/$name.log" 2>&1 || { fail "$name (exit $?)"; tail -n 5 "$TMP/$name.log"; }
}
all_same() { # all_same DIR_A DIR_B: every checkpoint file and every loss
    local f
    for f in "$1"/ckpt/*.safetensors; do cmp -s "$f" "$2/ckpt/$(basename "$f")" || return 1; done
    [ -n "$(losses "$1")" ] && [ "$(losses "$1")" = "$(losses "$2")" ]
}

for n in 1 2 4; do
    run sync$n "${MPI[@]}" -np $n $NB train "${C[@]}" --out "$TMP/sync$n"
    run pipe$n "${MPI[@]}" -np $n $NB train "${C[@]}" --schedule pipe --out "$TMP/pipe$n"
    all_same "$TMP/sync$n" "$TMP/pipe$n" && pass "$n rank(s): pipe is bitwise sync (dense, AdamW, every shard, 20 losses)" \
        || fail "$n rank(s): pipe differs from sync"
done
run skip "${MPI[@]}" -np 2 $NB train "${C[@]}" --schedule pipe --pipe-skip-resync --out "$TMP/skip"
resynced=$(grep -o '"rows_resynced":[0-9]*' "$TMP/pipe2/metrics.jsonl" | cut -d: -f2 | awk '{s+=$1} END {print s+0}')
! all_same "$TMP/sync2" "$TMP/skip" && [ "$resynced" -gt 0 ] \
    && pass "--pipe-skip-resync (stale rows) differs from sync: the re-sync of $resynced rows over 20 steps is what keeps pipe exact" \
    || fail "--pipe-skip-resync: no difference (re-synced rows: $resynced)"

run sync-adam "${MPI[@]}" -np 2 $NB train "${C[@]}" --emb-optim adam --out "$TMP/sync-adam"
for v in "--emb-optim adam" "--graphs"; do
    tag=$(echo "$v" | tr -dc 'a-z')
    ref=$TMP/sync2; [ "$tag" = emboptimadam ] && ref=$TMP/sync-adam
    run v-$tag "${MPI[@]}" -np 2 $NB train "${C[@]}" --schedule pipe $v --out "$TMP/v-$tag"
    all_same "$ref" "$TMP/v-$tag" && pass "2 ranks, pipe $v: bitwise sync" || fail "2 ranks, pipe $v differs from sync"
done
for sc in plain pipe; do # --emb-place host: the owners' shards in host memory (on the CPU backend: the same memory)
    run host-$sc "${MPI[@]}" -np 2 $NB train "${C[@]}" --schedule $sc --emb-place host --out "$TMP/host-$sc"
    all_same "$TMP/sync2" "$TMP/host-$sc" && pass "2 ranks, $sc --emb-place host: bitwise sync with the shards in device memory" \
        || fail "2 ranks, $sc --emb-place host differs"
done
# Frozen-Window Pipelining: --micro-batches M parts on one frozen embedding state, the tables
# updated once after the last part; pipe (the next part's rows fetched while one trains) is bitwise
# its synchronous twin, and the window follows the whole batch (the same samples, the same
# weights: only the summation order differs)
for mb in 2 4; do
    run fwp-sync$mb "${MPI[@]}" -np 2 $NB train "${C[@]}" --micro-batches $mb --out "$TMP/fwp-sync$mb"
    run fwp-pipe$mb "${MPI[@]}" -np 2 $NB train "${C[@]}" --micro-batches $mb --schedule pipe --out "$TMP/fwp-pipe$mb"
    all_same "$TMP/fwp-sync$mb" "$TMP/fwp-pipe$mb" && pass "2 ranks, --micro-batches $mb: pipe is bitwise sync" \
        || fail "2 ranks, --micro-batches $mb: pipe differs from sync"
    worst=$(worst_loss_diff "$TMP/sync2" "$TMP/fwp-sync$mb")
    awk -v w="$worst" 'BEGIN {exit !(w < 1e-5)}' && pass "--micro-batches $mb follows the whole batch (worst loss rel diff $worst over 20 steps)" \
        || fail "--micro-batches $mb vs the whole batch: $worst"
done
run fwp-host "${MPI[@]}" -np 2 $NB train "${C[@]}" --micro-batches 2 --schedule pipe --emb-place host --out "$TMP/fwp-host"
all_same "$TMP/fwp-sync2" "$TMP/fwp-host" && pass "2 ranks, --micro-batches 2, pipe --emb-place host: bitwise sync" || fail "FWP host placement differs"
run fwp-graphs "${MPI[@]}" -np 2 $NB train "${C[@]}" --micro-batches 2 --schedule pipe --graphs --out "$TMP/fwp-graphs"
all_same "$TMP/fwp-sync2" "$TMP/fwp-graphs" && pass "2 ranks, --micro-batches 2, pipe --graphs: bitwise sync" || fail "FWP with graphs differs"
# key-centric clustering: only which samples share a part changes (NE within 0.1%); the rows moved
run ck0 $NB train "${C[@]}" --batch 256 --micro-batches 4 --schedule pipe --out "$TMP/ck0"
run ck1 $NB train "${C[@]}" --batch 256 --micro-batches 4 --schedule pipe --cluster-keys --out "$TMP/ck1"
ne0=$(grep "^eval step=20 " "$TMP/ck0.log" | tr ' ' '\n' | grep '^ne=' | cut -d= -f2)
ne1=$(grep "^eval step=20 " "$TMP/ck1.log" | tr ' ' '\n' | grep '^ne=' | cut -d= -f2)
rows() { grep -o '"rows_moved":[0-9]*' "$1/metrics.jsonl" | cut -d: -f2 | awk '{s+=$1} END {printf "%.0f", s/NR}'; }
awk -v a="$ne0" -v b="$ne1" 'BEGIN {d=(a-b)/a; if (d<0) d=-d; exit !(a != "" && d < 1e-3)}' \
    && pass "--cluster-keys: NE $ne1 vs $ne0 unclustered (within 0.1%); distinct rows moved per step $(rows "$TMP/ck1") vs $(rows "$TMP/ck0")" \
    || fail "--cluster-keys: NE $ne1 vs $ne0"
run split1 "${MPI[@]}" -np 2 $NB train "${C[@]}" --schedule pipe --stop-after 7 --out "$TMP/split"
run split2 "${MPI[@]}" -np 2 $NB train --resume "$TMP/split" --quiet
all_same "$TMP/pipe2" "$TMP/split" && pass "2 ranks, pipe: stop at 7, resume to 20 == straight, bitwise" || fail "pipe resume differs"

run trace "${MPI[@]}" -np 2 $NB train "${C[@]}" --schedule pipe --steps 6 --eval-every 0 --no-ckpt --trace "$TMP/t.json" --out "$TMP/t"
node -e '
const t = JSON.parse(require("fs").readFileSync(process.argv[1])), all = t.traceEvents || t, lanes = {};
for (const e of all) if (e.ph === "M" && e.name === "thread_name") lanes[e.tid] = e.args.name;
const X = all.filter(e => e.ph === "X");
const of = (step, pred) => X.filter(e => e.args.step === step && pred(e));
let inside = 0, own = 0;
for (let s = 0; s < 5; s++) {
  const next = of(s, e => e.name === "rows all-to-all (next)"), upd = of(s, e => e.name === "embedding optim");
  if (next.length && upd.length && next.every(a => a.ts + a.dur <= Math.max(...upd.map(u => u.ts + u.dur)))) inside++;
  if (s > 0) own += of(s, e => e.name === "rows all-to-all").length;
}
console.log(`${inside} of 5 steps fetched the next batch inside themselves, before their update; ${own} steps after the first fetched their own rows`);
process.exit(inside === 5 && own === 0 ? 0 : 1);' "$TMP/t.json" > "$TMP/tr.txt" 2>&1 \
    && pass "trace: $(cat "$TMP/tr.txt")" || fail "trace: $(cat "$TMP/tr.txt")"
grep -q '"exposed_pct":' "$TMP/t/metrics.jsonl" && grep -q '"rows_moved":' "$TMP/t/metrics.jsonl" \
    && pass "metrics.jsonl: $(sed -n 3p "$TMP/t/metrics.jsonl" | grep -o '"rows_moved":[0-9]*,"rows_resynced":[0-9]*' ), exposed_pct" \
    || fail "metrics.jsonl lacks rows_moved / exposed_pct"

# FreeScale's collision-first exchange (--emb-priority): the next batch's exclusive rows move while
# the step trains, its collision rows only after the step's update, first on the comm lane
for n in 1 2 4; do
    run prio$n "${MPI[@]}" -np $n $NB train "${C[@]}" --schedule pipe --emb-priority --out "$TMP/prio$n"
    all_same "$TMP/sync$n" "$TMP/prio$n" && all_same "$TMP/pipe$n" "$TMP/prio$n" \
        && pass "$n rank(s): pipe --emb-priority is bitwise sync and pipe" || fail "$n rank(s): pipe --emb-priority differs"
done
for v in "--emb-place host" "--graphs" "--emb-optim adam"; do
    tag=$(echo "$v" | tr -dc 'a-z')
    ref=$TMP/sync2; [ "$tag" = emboptimadam ] && ref=$TMP/sync-adam
    run prio-$tag "${MPI[@]}" -np 2 $NB train "${C[@]}" --schedule pipe --emb-priority $v --out "$TMP/prio-$tag"
    all_same "$ref" "$TMP/prio-$tag" && pass "2 ranks, pipe --emb-priority $v: bitwise sync" || fail "2 ranks, pipe --emb-priority $v differs"
done
run prio-fwp "${MPI[@]}" -np 2 $NB train "${C[@]}" --schedule pipe --emb-priority --micro-batches 2 --out "$TMP/prio-fwp"
all_same "$TMP/fwp-sync2" "$TMP/prio-fwp" && pass "2 ranks, --micro-batches 2, pipe --emb-priority: bitwise sync" || fail "FWP + --emb-priority differs"
ahead=$(grep -o '"rows_ahead":[0-9]*' "$TMP/prio2/metrics.jsonl" | cut -d: -f2 | awk '{s+=$1} END {print s+0}')
moved=$(grep -o '"rows_moved":[0-9]*' "$TMP/prio2/metrics.jsonl" | cut -d: -f2 | awk '{s+=$1} END {print s+0}')
rsync=$(grep -o '"rows_resynced":[0-9]*' "$TMP/prio2/metrics.jsonl" | cut -d: -f2 | awk '{s+=$1} END {print s+0}')
[ "$rsync" -gt 0 ] && [ "$ahead" -eq $((moved - rsync)) ] \
    && pass "--emb-priority: $ahead rows moved ahead over 20 steps, $rsync (the collisions) only after the update; pipe alone moves all $moved ahead" \
    || fail "--emb-priority: rows ahead $ahead, moved $moved, re-synced $rsync"
run prio-trace "${MPI[@]}" -np 2 $NB train "${C[@]}" --schedule pipe --emb-priority --steps 6 --eval-every 0 --no-ckpt --trace "$TMP/tp.json" --out "$TMP/tp"
python3 - "$TMP/tp.json" > "$TMP/tp.txt" 2>&1 <<'PY' && pass "trace, --emb-priority: $(cat "$TMP/tp.txt")" || fail "trace, --emb-priority: $(cat "$TMP/tp.txt")"
import json, sys
t = json.load(open(sys.argv[1]))
ev = t["traceEvents"] if isinstance(t, dict) else t
lanes = {e["tid"]: e["args"]["name"] for e in ev if e.get("ph") == "M" and e.get("name") == "thread_name"}
X = [e for e in ev if e.get("ph") == "X"]
comm = sorted((e for e in X if lanes.get(e["tid"]) == "comm"), key=lambda e: e["ts"])
early = first = 0
for s in range(1, 5):
    upd = [e for e in X if e["args"].get("step") == s and e["name"] == "embedding optim"]
    ex = [e for e in X if e["args"].get("step") == s and e["name"] == "exclusive rows all-to-all (next)"]
    if not upd:
        continue
    end = max(u["ts"] + u["dur"] for u in upd)
    if ex and all(e["ts"] + e["dur"] <= end for e in ex):
        early += 1
    after = [e for e in comm if e["ts"] >= end]
    if after and after[0]["name"] == "resync all-to-all":
        first += 1
print(f"in {early} of 4 steps the next batch's exclusive rows moved before the step's update; in {first} of 4 the collision rows' all-to-all was the comm lane's first op after it")
sys.exit(0 if early == 4 and first == 4 else 1)
PY
expect_error "--emb-priority without pipe" "add --schedule pipe (sharded tables) with --emb-priority" $NB train "${C[@]}" --emb-priority --steps 1
expect_error "--emb-priority with whole tables" "add --schedule pipe (sharded tables) with --emb-priority" $NB train "${C[@]}" --schedule pipe --emb-shard none --emb-priority --steps 1

expect_error "pipe for a transformer" "does not run transformer models" $NB train --model gpt2-tiny --schedule pipe --steps 1
expect_error "--cluster-keys without micro-batches" "there is one" $NB train "${C[@]}" --cluster-keys --steps 1
expect_error "--pipe-skip-resync without pipe" "debug switch of --schedule pipe" $NB train "${C[@]}" --pipe-skip-resync --steps 1
finish
