#!/usr/bin/env bash
# seqctr on the GPU (runs on a machine with a GPU; skips elsewhere):
#  - CUDA fp32 (TF32 off) follows the CPU reference (first 4 step losses within 1e-5 relative;
#    the exact PyTorch check is test_seqctr_ref, which runs the CUDA backends too);
#  - bf16 learns on synthetic data (held-out NE < 1, AUC > 0.6) and two runs are bitwise identical;
#  - sparse Adam, MovieLens (beats item popularity) and the shared Criteo sample run on the GPU;
#  - index lists built on the device = on the host, bitwise, also with multi-valued columns
#    (dlrm-dcnv2's multi-hot columns in fp32 / bf16 / --emb-place host / --graphs, a schema's
#    empty fields), and dlrm-dcnv2 with --graphs bitwise its eager steps, with --schedule pipe and
#    whole tables (the next batch's lists built ahead) bitwise plain.
source "$(dirname "$0")/lib.sh"
"$NB" info >/dev/null 2>&1 || { echo "skip: $("$NB" info | head -n 1 | sed 's/  */ /g')"; exit 77; }
SMALL="--emb-dim 16 --blocks 2 --cross-rank 32 --block-hidden 64 --quiet"
SYNTH="synth:cap=1000,items=2000,calib=16384,max_len=16"
get() { echo "$2" | tr ' ' '\n' | grep "^$1=" | cut -d= -f2; }

C=(--model seqctr --data "$SYNTH" --batch 256 --eval-samples 4096 $SMALL)
$NB train "${C[@]}" --steps 20 --device cpu --out "$TMP/cpu" >/dev/null || fail "cpu run"
$NB train "${C[@]}" --steps 20 --device cuda --precision fp32 --out "$TMP/f32" >/dev/null || fail "cuda fp32 run"
# Row-wise Adagrad divides each row's gradient by its own rms, so rounding differences in rows
# with tiny gradients grow step by step (measured: 1e-8 over the first 4 steps, 1e-3 by step 16);
# the first 4 steps are the parity check, the rest is reported.
diffs=$(paste <(losses "$TMP/cpu") <(losses "$TMP/f32") | awk '{d=($1-$2)/$1; if (d<0) d=-d; printf "%.3g ", d}')
early=$(echo "$diffs" | awk '{w=0; for (i=1;i<=4;i++) if ($i>w) w=$i; printf "%.3g", w}')
awk -v w="$early" 'BEGIN {exit !(w < 1e-5)}' \
    && pass "cuda fp32 follows the cpu (first 4 steps within $early; all 20 steps: $diffs)" \
    || fail "cuda fp32 vs cpu: first 4 steps differ by $early (all: $diffs)"

out=$($NB train "${C[@]}" --steps 300 --device cuda --out "$TMP/bf16") || fail "bf16 run"
ev=$(echo "$out" | grep "^eval step=300"); ne=$(get ne "$ev"); auc=$(get auc "$ev")
awk -v ne="$ne" -v auc="$auc" 'BEGIN {exit !(ne < 1.0 && auc > 0.6)}' && pass "bf16 GPU: held-out NE $ne AUC $auc" \
    || fail "bf16 GPU: NE $ne AUC $auc (want NE < 1, AUC > 0.6)"
$NB train "${C[@]}" --steps 300 --device cuda --out "$TMP/bf16b" >/dev/null || fail "bf16 second run"
cmp -s "$TMP/bf16/ckpt/model.safetensors" "$TMP/bf16b/ckpt/model.safetensors" && [ "$(losses "$TMP/bf16")" = "$(losses "$TMP/bf16b")" ] \
    && pass "two bf16 GPU runs are bitwise identical (weights and every step loss)" || fail "GPU runs differ"

out=$($NB train "${C[@]}" --steps 300 --device cuda --emb-optim adam) || fail "sparse adam run"
ev=$(echo "$out" | grep "^eval step=300"); ne=$(get ne "$ev"); auc=$(get auc "$ev")
awk -v ne="$ne" -v auc="$auc" 'BEGIN {exit !(ne < 1.0 && auc > 0.6)}' && pass "GPU sparse Adam: NE $ne AUC $auc" \
    || fail "GPU sparse Adam: NE $ne AUC $auc"

# --graphs: the step captured once per history-row bucket and replayed gives the eager steps'
# bits; resume (10 + 10 steps, with graphs, and in fp32) is bitwise 20 straight
G=(--model seqctr --data "$SYNTH" --batch 256 --steps 30 --eval-every 10 --eval-samples 2048 $SMALL --device cuda)
$NB train "${G[@]}" --out "$TMP/g-eager" >/dev/null || fail "gpu eager"
$NB train "${G[@]}" --graphs --out "$TMP/g-graphs" >"$TMP/g.out" 2>&1 || fail "gpu graphs"
reps=$(grep -o '[0-9]* of [0-9]* steps replayed' "$TMP/g.out")
cmp -s "$TMP/g-eager/ckpt/model.safetensors" "$TMP/g-graphs/ckpt/model.safetensors" \
    && cmp -s "$TMP/g-eager/ckpt/optim.safetensors" "$TMP/g-graphs/ckpt/optim.safetensors" \
    && [ "$(losses "$TMP/g-eager")" = "$(losses "$TMP/g-graphs")" ] && [ "${reps%% *}" -ge 20 ] 2>/dev/null \
    && pass "GPU --graphs ($reps) is bitwise equal to eager steps (weights, optimizer state, losses)" \
    || fail "GPU --graphs differs from eager ($reps)"
# the index lists built by the device (the default on CUDA) or by the host: the same bits
rows() { grep -o '"unique_rows":[0-9]*' "$1/metrics.jsonl" | cut -d: -f2 | tr '\n' ' '; }
for v in "eager" "--graphs" "--emb-optim adam"; do
    f=${v#eager}; tag=$(echo "${f:-eager}" | tr -dc 'a-z')
    $NB train "${G[@]}" $f --index-lists host --out "$TMP/l-host-$tag" >/dev/null || fail "gpu host lists $v"
    $NB train "${G[@]}" $f --index-lists device --out "$TMP/l-dev-$tag" >/dev/null || fail "gpu device lists $v"
    cmp -s "$TMP/l-host-$tag/ckpt/model.safetensors" "$TMP/l-dev-$tag/ckpt/model.safetensors" \
        && cmp -s "$TMP/l-host-$tag/ckpt/optim.safetensors" "$TMP/l-dev-$tag/ckpt/optim.safetensors" \
        && [ "$(losses "$TMP/l-host-$tag")" = "$(losses "$TMP/l-dev-$tag")" ] \
        && [ -n "$(rows "$TMP/l-dev-$tag")" ] && [ "$(rows "$TMP/l-host-$tag")" = "$(rows "$TMP/l-dev-$tag")" ] \
        && pass "GPU index lists on the device = on the host ($v): weights, optimizer state, losses, unique rows per step" \
        || fail "GPU index lists on the device differ from the host's ($v)"
done
cmp -s "$TMP/g-eager/ckpt/model.safetensors" "$TMP/l-dev-eager/ckpt/model.safetensors" \
    && pass "GPU --index-lists auto picks the device's lists (same bits)" || fail "GPU auto lists differ from device lists"
# --emb-place host with whole tables: the tables and their optimizer state in pinned host memory,
# read and updated in place by the same kernels: the bits of the tables in device memory
for v in "eager" "--graphs" "--emb-optim adam"; do
    f=${v#eager}; tag=$(echo "${f:-eager}" | tr -dc 'a-z')
    $NB train "${G[@]}" $f --emb-place host --out "$TMP/h-$tag" >"$TMP/h-$tag.out" 2>&1 || fail "gpu --emb-place host $v"
    cmp -s "$TMP/l-dev-$tag/ckpt/model.safetensors" "$TMP/h-$tag/ckpt/model.safetensors" \
        && cmp -s "$TMP/l-dev-$tag/ckpt/optim.safetensors" "$TMP/h-$tag/ckpt/optim.safetensors" \
        && [ "$(losses "$TMP/l-dev-$tag")" = "$(losses "$TMP/h-$tag")" ] \
        && pass "GPU --emb-place host, whole tables ($v): bitwise the tables in device memory" \
        || fail "GPU --emb-place host, whole tables ($v) differs from device memory"
done
# multi-valued columns (issue 34): DLRM-DCNv2's 26 multi-hot columns (fixed sizes) and a schema's
# columns with empty, one-value and longer fields: the device's lists (the default) are the host's,
# bit for bit: weights, optimizer state, every loss and the unique rows per step
same_lists() { # same_lists WHAT HOSTDIR DEVDIR
    cmp -s "$2/ckpt/model.safetensors" "$3/ckpt/model.safetensors" && cmp -s "$2/ckpt/optim.safetensors" "$3/ckpt/optim.safetensors" \
        && [ -n "$(losses "$3")" ] && [ "$(losses "$2")" = "$(losses "$3")" ] \
        && [ -n "$(rows "$3")" ] && [ "$(rows "$2")" = "$(rows "$3")" ] \
        && pass "GPU $1: device index lists = host index lists (weights, optimizer state, losses, unique rows)" \
        || fail "GPU $1: device index lists differ from the host's"
}
DL=(--model dlrm-dcnv2 --data synth:calib=16384 --table-cap 1000 --emb-dim 16 --cross-rank 32 --top-mlp 64,32 --batch 256
    --steps 20 --eval-every 10 --eval-samples 1024 --device cuda)
for v in "fp32" "bf16" "bf16 --emb-place host" "fp32 --emb-optim adagrad" "bf16 --graphs"; do
    set -- $v; tag=$(echo "$v" | tr -dc 'a-z0-9')
    $NB train "${DL[@]}" --quiet --precision "$@" --index-lists host --out "$TMP/d-host-$tag" >/dev/null 2>"$TMP/d.err" || { fail "dlrm host lists $v"; tail -3 "$TMP/d.err"; }
    $NB train "${DL[@]}" --quiet --precision "$@" --out "$TMP/d-dev-$tag" >"$TMP/d-dev-$tag.out" 2>&1 || { fail "dlrm device lists $v"; tail -3 "$TMP/d-dev-$tag.out"; }
    same_lists "dlrm-dcnv2 ($v)" "$TMP/d-host-$tag" "$TMP/d-dev-$tag"
done
# --graphs with multi-hot columns (every field full, so every batch has the captured sizes)
reps=$(grep -o '[0-9]* of [0-9]* steps replayed' "$TMP/d-dev-bf16graphs.out")
same_dl() { cmp -s "$1/ckpt/model.safetensors" "$2/ckpt/model.safetensors" && cmp -s "$1/ckpt/optim.safetensors" "$2/ckpt/optim.safetensors" \
    && [ "$(losses "$1")" = "$(losses "$2")" ]; }
same_dl "$TMP/d-dev-bf16" "$TMP/d-dev-bf16graphs" && [ "${reps%% *}" -ge 10 ] 2>/dev/null \
    && pass "GPU dlrm-dcnv2 --graphs ($reps) is bitwise equal to eager steps (device lists)" \
    || fail "GPU dlrm-dcnv2 --graphs differs from eager ($reps)"
# pipe with whole tables: the next batch's lists built on a side lane while the step trains
for v in "" "--graphs"; do
    tag=pipe$(echo "$v" | tr -dc 'a-z')
    $NB train "${DL[@]}" --quiet --precision bf16 $v --schedule pipe --emb-shard none --out "$TMP/d-$tag" >"$TMP/d-$tag.out" 2>&1 \
        || { fail "dlrm pipe whole tables $v"; tail -3 "$TMP/d-$tag.out"; }
    same_dl "$TMP/d-dev-bf16" "$TMP/d-$tag" && pass "GPU dlrm-dcnv2 --schedule pipe --emb-shard none $v is bitwise plain (weights, optimizer state, losses)" \
        || fail "GPU dlrm-dcnv2 pipe with whole tables $v differs from plain"
done
$NB train "${DL[@]}" --steps 1 --no-ckpt 2>&1 | grep -q "^dlrm-dcnv2 .*index lists on the device" \
    && pass "dlrm-dcnv2 on a GPU builds its index lists on the device by default" \
    || fail "dlrm-dcnv2 on a GPU: the index lists are not the device's by default"
MVD=$TMP/mvdata; mkdir -p "$MVD"
mvcsv() { # mvcsv SEED ROWS: label, 2 dense, a categorical, tags (0..4 words, mean), genres (0..3 ids, sum)
    awk -v seed="$1" -v n="$2" 'function r(m) { seed = (seed * 1103515245 + 12345) % 2147483648; return int(seed / 65536) % m }
        BEGIN { print "y,a,b,c,tags,genres"
            for (i = 0; i < n; i++) { t = ""; k = r(5); for (j = 0; j < k; j++) t = t (j ? " " : "") "w" r(30)
                g = ""; k = r(4); for (j = 0; j < k; j++) g = g (j ? "|" : "") r(12)
                c = r(50); y = (c % 3 == 0 || k > 2) ? 1 : r(2); printf "%d,%d,%.2f,%d,\"%s\",%s\n", y, r(100), r(1000) / 10, c, t, g } }'
}
mvcsv 7 3000 > "$MVD/train.csv"; mvcsv 8 500 > "$MVD/test.csv"
cat > "$MVD/schema.json" <<'JSON'
{"label": "y", "dense": ["a", "b"],
 "categorical": [{"name": "c", "cardinality": 50}, {"name": "tags", "hash_size": 40, "pooling": "mean", "max_values": 4},
                 {"name": "genres", "cardinality": 12, "pooling": "sum", "max_values": 3, "separator": "|"}],
 "embedding_dim": 8}
JSON
MV=(--model seqctr --data "csv:$MVD/train.csv" --schema "$MVD/schema.json" --val-data "$MVD/test.csv" --batch 128 --steps 20
    --eval-every 10 --emb-dim 16 --blocks 2 --cross-rank 32 --block-hidden 64 --quiet --device cuda)
for v in "fp32" "bf16 --emb-place host"; do
    set -- $v; tag=$(echo "$v" | tr -dc 'a-z0-9')
    $NB train "${MV[@]}" --precision "$@" --index-lists host --out "$TMP/m-host-$tag" >/dev/null 2>"$TMP/m.err" || { fail "schema host lists $v"; tail -3 "$TMP/m.err"; }
    $NB train "${MV[@]}" --precision "$@" --index-lists device --out "$TMP/m-dev-$tag" >/dev/null 2>"$TMP/m.err" || { fail "schema device lists $v"; tail -3 "$TMP/m.err"; }
    same_lists "schema with empty and multi-valued fields ($v)" "$TMP/m-host-$tag" "$TMP/m-dev-$tag"
done
$NB train "${G[@]}" --index-lists device --emb-shard row --out "$TMP/l-bad" >"$TMP/l-bad.out" 2>&1 \
    && fail "--index-lists device with sharded tables was accepted" \
    || { grep -q "index-lists host" "$TMP/l-bad.out" && pass "--index-lists device with sharded tables: a clear error" \
        || fail "--index-lists device with sharded tables: unclear error: $(tail -n 2 "$TMP/l-bad.out")"; }

for v in "bf16 --graphs" "fp32 --emb-optim adam"; do
    set -- $v
    $NB train "${G[@]}" --precision $1 $2 ${3:-} --out "$TMP/r-$1" >/dev/null || fail "gpu straight $v"
    $NB train "${G[@]}" --precision $1 $2 ${3:-} --stop-after 15 --out "$TMP/s-$1" >/dev/null || fail "gpu first half $v"
    $NB train --resume "$TMP/s-$1" --quiet >/dev/null 2>&1 || fail "gpu resume $v"
    cmp -s "$TMP/r-$1/ckpt/model.safetensors" "$TMP/s-$1/ckpt/model.safetensors" \
        && cmp -s "$TMP/r-$1/ckpt/optim.safetensors" "$TMP/s-$1/ckpt/optim.safetensors" \
        && [ "$(losses "$TMP/r-$1")" = "$(losses "$TMP/s-$1")" ] \
        && pass "GPU resume ($v): 15 + 15 steps == 30 straight, bitwise" || fail "GPU resume ($v) differs"
done
ev=$($NB eval --ckpt "$TMP/r-bf16" --device cuda 2>/dev/null | grep "^eval ")
last=$(grep -o '"eval_auc":[0-9.e+-]*' "$TMP/r-bf16/metrics.jsonl" | tail -1 | cut -d: -f2)
awk -v a="$(get auc "$ev")" -v b="$last" 'BEGIN {exit !(a != "" && (a - b) ^ 2 < 1e-10)}' \
    && pass "GPU eval --ckpt: AUC $(get auc "$ev") = the run's last ($last)" || fail "GPU eval --ckpt: '$ev' vs $last"

# ERASE on the GPU: the same bits as plain, and the side streams really overlap the main one
E=(--model seqctr --data "$SYNTH" --batch 1024 --steps 20 --eval-samples 1024 --detach all --emb-dim 32 --quiet --device cuda)
$NB train "${E[@]}" --schedule plain --out "$TMP/e-plain" >/dev/null || fail "gpu detached plain"
for d in blocking async "blocking --graphs"; do
    $NB train "${E[@]}" --schedule erase --erase-dispatch $d --out "$TMP/e-$d" >/dev/null || fail "gpu erase $d"
    cmp -s "$TMP/e-plain/ckpt/model.safetensors" "$TMP/e-$d/ckpt/model.safetensors" && [ "$(losses "$TMP/e-plain")" = "$(losses "$TMP/e-$d")" ] \
        && pass "GPU: erase ($d dispatch) is bitwise equal to plain" || fail "GPU: erase ($d) differs from plain"
done
ov=$(grep -o '"overlap_pct":[0-9.e+-]*' "$TMP/e-blocking/metrics.jsonl" | tail -n 10 | cut -d: -f2 | sort -g | tail -n 1)
awk -v o="$ov" 'BEGIN {exit !(o > 0)}' && pass "GPU erase: side-lane work overlaps the main lane (overlap_pct up to $ov)" \
    || fail "GPU erase: no overlap ($ov)"

if [ -f "$ROOT/data/movielens/clicks_train.tsv" ]; then
    out=$(cd "$ROOT" && $NB train --model seqctr --data movielens --device cuda --steps 200 --batch 256 --max-len 32 \
        --table-cap 200000 $SMALL) || fail "movielens run"
    ev=$(echo "$out" | grep "^eval step=200"); bl=$(echo "$out" | grep "^baseline-popularity")
    auc=$(get auc "$ev"); bauc=$(get auc "$bl")
    awk -v a="$auc" -v b="$bauc" 'BEGIN {exit !(a > b)}' && pass "GPU movielens AUC $auc beats popularity $bauc" \
        || fail "GPU movielens AUC $auc vs popularity $bauc"
else
    echo "skip movielens part: no data/movielens"
fi
CRITEO=$ROOT/../shared/data/ctr_samples/criteo_kaggle_200.tsv
[ -f "$CRITEO" ] || CRITEO=$ROOT/data/ctr_samples/criteo_kaggle_200.tsv # a copy carried to the GPU machine
if [ -f "$CRITEO" ]; then
    ev=$($NB train --model seqctr --data "criteo:$CRITEO" --device cuda --eval-samples 50 --steps 20 --batch 32 \
        --table-cap 1000 $SMALL | grep "^eval step=20")
    echo "$ev" | grep -q "n=50 " && awk -v a="$(get auc "$ev")" 'BEGIN {exit !(a >= 0 && a <= 1)}' \
        && pass "GPU criteo sample: $ev" || fail "GPU criteo sample: '$ev'"
else
    echo "skip criteo part: no shared/data/ctr_samples"
fi
finish
