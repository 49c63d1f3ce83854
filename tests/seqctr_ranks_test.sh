#!/usr/bin/env bash
# seqctr over several CPU ranks (mpirun --oversubscribe --allow-run-as-root), the tables row-wise
# sharded (--emb-shard row, the default with several ranks: row g on rank g % N), the dense part
# data parallel:
#  - N ranks (2, 4) follow one rank on the same global batch: step losses within 1e-5 relative over
#    20 steps, the final held-out NE equal to 4 decimals (Adagrad and sparse Adam);
#  - one rank with --emb-shard row (the exchange path, copies) gives the unsharded bits; the same N
#    twice gives the same bits; --graphs and ERASE (--detach) at N = 2 give plain eager's bits;
#  - every rank writes its shard of the tables; stop + resume at N = 2 is bitwise a straight run;
#    eval and export of a sharded checkpoint from one process read every shard;
#  - the trace shows the all-to-alls on the comm lane; bad configurations are clear errors.
source "$(dirname "$0")/lib.sh"
command -v mpirun >/dev/null || { echo "skip: no mpirun (install openmpi-bin: scripts/setup.sh)"; exit 77; }
MPI=(mpirun --oversubscribe --allow-run-as-root)
C=(--model seqctr --data "synth:cap=1000,items=2000,calib=16384,max_len=16" --emb-dim 16 --blocks 3 --cross-rank 32
   --block-hidden 64 --batch 64 --steps 20 --eval-every 10 --eval-samples 512 --quiet --threads 1 --seed 3)
ne_of() { grep "^eval step=$2 " "$1" | tail -n 1 | tr ' ' '\n' | grep '^ne=' | cut -d= -f2; }
shards_same() { # shards_same DIR_A DIR_B: every shard file equal
    local f
    for f in "$1"/ckpt/shard-*; do cmp -s "$f" "$2/ckpt/$(basename "$f")" || return 1; done
    ls "$1"/ckpt/shard-* >/dev/null 2>&1
}
run() { # run NAME CMD...: the command's output in $TMP/NAME.log; a failure is reported with its tail
    local name=$1; shift
    "$@" >"$TMP/$name.log" 2>&1 || { fail "$name (exit $?)"; tail -n 5 "$TMP/$name.log"; }
}

for opt in adagrad adam; do
    run one-$opt $NB train "${C[@]}" --emb-optim $opt --out "$TMP/one-$opt"
    for n in 2 4; do
        run np$n-$opt "${MPI[@]}" -np $n $NB train "${C[@]}" --emb-optim $opt --out "$TMP/np$n-$opt"
        worst=$(worst_loss_diff "$TMP/one-$opt" "$TMP/np$n-$opt")
        a=$(ne_of "$TMP/one-$opt.log" 20) b=$(ne_of "$TMP/np$n-$opt.log" 20)
        awk -v w="$worst" -v a="$a" -v b="$b" 'BEGIN {exit !(w < 1e-5 && a != "" && sprintf("%.4f", a) == sprintf("%.4f", b))}' \
            && pass "$opt: $n ranks follow one rank (worst loss rel diff $worst over 20 steps; NE $a vs $b)" \
            || fail "$opt: $n ranks vs one: loss rel diff $worst, NE $a vs $b"
    done
done
[ "$(ls "$TMP/np4-adagrad/ckpt" | grep -c '^shard-')" = 4 ] && pass "4 ranks: 4 table shards in the checkpoint ($(ls "$TMP/np4-adagrad/ckpt" | tr '\n' ' '))" \
    || fail "4 ranks: shards $(ls "$TMP/np4-adagrad/ckpt")"

run row1 $NB train "${C[@]}" --emb-shard row --out "$TMP/row1"
[ "$(cut -d, -f1-2 "$TMP/one-adagrad/metrics.jsonl")" = "$(cut -d, -f1-2 "$TMP/row1/metrics.jsonl")" ] \
    && [ "$(ne_of "$TMP/one-adagrad.log" 20)" = "$(ne_of "$TMP/row1.log" 20)" ] \
    && pass "one rank, --emb-shard row (the exchange as copies): the unsharded losses and NE" || fail "one rank --emb-shard row differs"

run again "${MPI[@]}" -np 2 $NB train "${C[@]}" --out "$TMP/again"
cmp -s "$TMP/np2-adagrad/ckpt/model.safetensors" "$TMP/again/ckpt/model.safetensors" && shards_same "$TMP/np2-adagrad" "$TMP/again" \
    && [ "$(losses "$TMP/np2-adagrad")" = "$(losses "$TMP/again")" ] \
    && pass "2 ranks twice: bitwise (dense weights, every shard, losses)" || fail "2 ranks twice differ"
for v in "--graphs" "--detach 2 --aux-weight 0.5 --schedule erase"; do
    tag=$(echo "$v" | tr -dc 'a-z')
    ref=$TMP/again
    if [ "$tag" != graphs ]; then
        run ref-$tag "${MPI[@]}" -np 2 $NB train "${C[@]}" --detach 2 --aux-weight 0.5 --out "$TMP/ref-$tag"
        ref=$TMP/ref-$tag
    fi
    run v-$tag "${MPI[@]}" -np 2 $NB train "${C[@]}" $v --out "$TMP/v-$tag"
    cmp -s "$ref/ckpt/model.safetensors" "$TMP/v-$tag/ckpt/model.safetensors" && shards_same "$ref" "$TMP/v-$tag" \
        && pass "2 ranks, $v: bitwise the plain eager run" || fail "2 ranks, $v differs from plain eager"
done

run split1 "${MPI[@]}" -np 2 $NB train "${C[@]}" --stop-after 10 --out "$TMP/split"
run split2 "${MPI[@]}" -np 2 $NB train --resume "$TMP/split" --quiet
cmp -s "$TMP/again/ckpt/model.safetensors" "$TMP/split/ckpt/model.safetensors" && cmp -s "$TMP/again/ckpt/optim.safetensors" "$TMP/split/ckpt/optim.safetensors" \
    && shards_same "$TMP/again" "$TMP/split" && pass "2 ranks: stop at 10, resume to 20 == 20 straight, bitwise (dense, optimizer, shards)" \
    || fail "2 ranks: resume differs"
expect_error "resume a 2-rank sharded run with 1 rank" "written by 2 ranks; this run has 1" $NB train --resume "$TMP/split" --steps 22

last_auc=$(grep "^eval step=20 " "$TMP/np4-adagrad.log" | tr ' ' '\n' | grep '^auc=' | cut -d= -f2)
out=$($NB eval --ckpt "$TMP/np4-adagrad" 2>&1) && echo "$out" | grep -q "auc=$last_auc" \
    && pass "eval of a 4-shard checkpoint in one process: AUC $last_auc, the run's last" || fail "eval of shards: $out (want auc=$last_auc)"
$NB export --ckpt "$TMP/np4-adagrad" --out "$TMP/exp.safetensors" >"$TMP/exp.log" 2>&1 \
    && python3 - "$TMP/exp.safetensors" <<'EOF' && pass "export of a 4-shard checkpoint: whole tables (emb.item and every emb.cat.f)" || fail "export of shards: $(tail -n 2 "$TMP/exp.log")"
import json, struct, sys
b = open(sys.argv[1], 'rb').read()
h = json.loads(b[8:8 + struct.unpack('<Q', b[:8])[0]])
assert h['emb.item']['shape'] == [2000, 16], h['emb.item']
assert all(f'emb.cat.{f}' in h for f in range(26))
EOF

run trace "${MPI[@]}" -np 2 $NB train "${C[@]}" --steps 3 --eval-every 0 --no-ckpt --trace "$TMP/t.json" --out "$TMP/t"
node -e '
const t = JSON.parse(require("fs").readFileSync(process.argv[1])), all = t.traceEvents || t, lanes = {};
for (const e of all) if (e.ph === "M" && e.name === "thread_name") lanes[e.tid] = e.args.name;
const comm = all.filter(e => e.ph === "X" && lanes[e.tid] === "comm").map(e => e.name);
const n = k => comm.filter(x => x.startsWith(k)).length;
console.log(`comm lane: ${n("rows all-to-all")} rows all-to-alls, ${n("grads all-to-all")} gradient all-to-alls, ${n("all-reduce")} all-reduces`);
process.exit(n("rows all-to-all") >= 3 && n("grads all-to-all") >= 3 && n("all-reduce") >= 3 ? 0 : 1);' "$TMP/t.json" > "$TMP/ov.txt" 2>&1 \
    && pass "the trace: $(cat "$TMP/ov.txt")" || fail "trace: $(cat "$TMP/ov.txt")"

expect_error_ranks "--emb-shard none with 2 ranks" "emb-shard none with 2 ranks" "${MPI[@]}" -np 2 $NB train "${C[@]}" --emb-shard none --steps 1 --no-ckpt
expect_error_ranks "a batch that does not split over 3 ranks" "does not split evenly over 3 ranks" "${MPI[@]}" -np 3 $NB train "${C[@]}" --steps 1 --no-ckpt
finish
