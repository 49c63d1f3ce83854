#!/usr/bin/env bash
# The model's shape comes from the data's schema (issue 36, 4): a CSV with 3 dense and 5
# categorical columns (cardinality and hashed ones, a missing dense value) and a history column
#  - trains a model of exactly that shape: bottom.0.weight [512, 3], 5 categorical tables,
#    x0 of (5 + 3) E; state.json and the export keep ndense 3 / ncat 5;
#  - evaluates a separate --val-data file whole; 'eval --ckpt' gives the run's last evaluation;
#  - 'predict' scores every row, and the mean BCE of its scores is eval's loss;
#  - the same train command after --stop-after resumes it bitwise (weights, optimizer state,
#    losses);
#  - a schema without dense columns trains (one dense slot that reads 0);
#  - a schema above the model's maximum (65 dense or 65 categorical columns) is refused with one
#    error line, and so is data with more columns than the checkpoint's model reads;
#  - multi-valued columns ("pooling": "sum" / "mean"): a column whose rows hold one value each
#    trains bitwise as the single-valued column; hashed tags (mean) and integer genres (sum, "|")
#    train, evaluate, predict, resume bitwise, and give the same bits with --emb-place host and
#    sparse-dist; too many values, a bad value, bad pooling keys and a schema that changes the
#    checkpoint's pooling are refused naming file:line:column or the key.
source "$(dirname "$0")/lib.sh"
D=$TMP/data
mkdir -p "$D"

# rows N SEED: a deterministic CSV (an LCG in awk); clicks depend on the user and the item
rows() {
    lcg_awk "$1" "$2" '
    BEGIN {
        print "y,a,b,c,u,v,w,x,z,item,hist"
        for (i = 0; i < n; i++) {
            u = r(50); it = r(100); h = ""; k = r(7)
            for (j = 0; j < k; j++) h = h (j ? " " : "") r(100)
            y = r(100) < (20 + 40 * (u % 3 == 0) + 20 * (it % 5 == 0)) ? 1 : 0
            printf "%d,%d,%d.%d,%s,%d,s%d,%d,%d,t%d,%d,%s\n", y, r(100), r(10), r(10), (r(8) ? r(30) - 5 : ""), u, r(40), r(7),
                r(11), r(90), it, h
        }
    }'
}
rows 800 3 > "$D/train.csv"
rows 200 4 > "$D/test.csv"
cat > "$D/schema.json" <<'EOF'
{
  "label": "y",
  "dense": ["a", {"name": "b", "transform": "none"}, "c"],
  "categorical": [{"name": "u", "cardinality": 50}, {"name": "v", "hash_size": 30}, {"name": "w", "cardinality": 7},
                  {"name": "x", "cardinality": 11}, {"name": "z", "hash_size": 64}],
  "sequence": {"target": "item", "history": "hist", "cardinality": 100, "max_len": 6},
  "embedding_dim": 8
}
EOF
SMALL="--model seqctr --batch 32 --blocks 2 --heads 2 --block-hidden 32 --cross-rank 8 --hist-layers 1 --threads 2"
A="--data csv:$D/train.csv --schema $D/schema.json --val-data $D/test.csv"
$NB train $SMALL $A --steps 20 --eval-every 10 --out "$TMP/run" > "$TMP/train.out" 2> "$TMP/train.err" \
    || { fail "train on the 3 + 5 column CSV"; tail -5 "$TMP/train.err"; finish; }
grep -q "max_len 6; 3 dense and 5 categorical inputs" "$TMP/train.err" && pass "the schema's 3 dense and 5 categorical columns shape the model" \
    || fail "shape line: $(grep '^seqctr ' "$TMP/train.err")"

# tensor NAME FILE: the tensor's header entry in a safetensors file
tensor() {
    local n=$(od -An -tu8 -N8 "$2" | tr -d ' ')
    tail -c +9 "$2" | head -c "$n" | grep -o "\"$1\":{[^}]*}"
}
M=$TMP/run/ckpt/model.safetensors
[ "$(tensor bottom.0.weight "$M" | grep -o 'shape":\[[0-9,]*\]')" = 'shape":[512,3]' ] \
    && [ "$(tensor block.0.U "$M" | grep -o 'shape":\[[0-9,]*\]')" = 'shape":[64,8]' ] \
    && [ "$(tensor emb.cat.4 "$M" | grep -o 'shape":\[[0-9,]*\]')" = 'shape":[64,8]' ] && [ -z "$(tensor emb.cat.5 "$M")" ] \
    && pass "checkpoint: bottom.0.weight [512, 3], x0 of 8 E = 64, tables emb.cat.0..4 only" \
    || fail "checkpoint tensors: $(tensor bottom.0.weight "$M") $(tensor block.0.U "$M") $(tensor emb.cat.5 "$M")"
grep -q '"ndense": 3' "$TMP/run/ckpt/state.json" && grep -q '"ncat": 5' "$TMP/run/ckpt/state.json" \
    && pass "state.json keeps the shape" || fail "state.json: $(grep -A12 '"model"' "$TMP/run/ckpt/state.json")"

last=$(grep "^eval step=20 " "$TMP/train.out")
echo "$last" | grep -q " n=200 " && pass "train: the separate --val-data file is evaluated whole ($last)" || fail "train: '$last'"
get() { echo "$2" | grep -o " $1=[0-9.]*" | cut -d= -f2; }
ev=$(cd / && $NB eval --ckpt "$TMP/run" 2>/dev/null | grep "^eval ")
[ -n "$(get loss "$ev")" ] && [ "$(get loss "$ev")" = "$(get loss "$last")" ] && [ "$(get auc "$ev")" = "$(get auc "$last")" ] \
    && pass "eval --ckpt: loss $(get loss "$ev") / AUC $(get auc "$ev") as the run's" || fail "eval: '$ev' vs the run's '$last'"

$NB predict --ckpt "$TMP/run" --data "$D/test.csv" --out "$TMP/scores.tsv" 2>"$TMP/pred.err" || { fail "predict"; tail -3 "$TMP/pred.err"; }
[ "$(wc -l < "$TMP/scores.tsv")" -eq 201 ] && pass "predict: a score per row" || fail "predict wrote $(wc -l < "$TMP/scores.tsv") lines"
bce=$(paste -d, <(tail -n +2 "$TMP/scores.tsv" | cut -f2) <(tail -n +2 "$D/test.csv" | cut -d, -f1) \
    | awk -F, '{p = $1; y = $2; s -= y ? log(p) : log(1 - p); n++} END {printf "%.5f", s / n}')
awk -v a="$bce" -v b="$(get loss "$last")" 'BEGIN {d = a - b; exit !(d < 2e-5 && d > -2e-5)}' \
    && pass "predict: the mean BCE of its scores is eval's loss ($bce)" || fail "predict's BCE $bce vs eval's $(get loss "$last")"

$NB export --ckpt "$TMP/run" --out "$TMP/model.safetensors" > /dev/null 2>&1 \
    && tail -c +9 "$TMP/model.safetensors" | head -c 4096 | grep -q 'ndense=3 ncat=5' \
    && pass "export: seqctr.config holds ndense=3 ncat=5" || fail "export's config"

B="$A --steps 30 --eval-every 0"
$NB train $SMALL $B --out "$TMP/straight" > /dev/null 2>&1 && $NB train $SMALL $B --stop-after 12 --out "$TMP/again" > /dev/null 2>&1 \
    && $NB train $SMALL $B --out "$TMP/again" > /dev/null 2>&1 || fail "the straight / stopped / rerun trainings"
same_state "the rerun resumes the 3 + 5 column model" "$TMP/straight" "$TMP/again"

sed 's/"dense": \[[^]]*\],//' "$D/schema.json" > "$D/nodense.json"
$NB train $SMALL --data csv:"$D/train.csv" --schema "$D/nodense.json" --steps 3 --eval-samples 100 --no-ckpt > /dev/null 2> "$TMP/nd.err" \
    && grep -q "1 dense and 5 categorical inputs" "$TMP/nd.err" && pass "a schema without dense columns: one dense slot that reads 0" \
    || { fail "no dense columns"; tail -3 "$TMP/nd.err"; }

# more columns than the checkpoint's model reads: rerunning the training with a wider schema (a
# sixth categorical column) is refused
sed 's/{"name": "z", "hash_size": 64}/{"name": "z", "hash_size": 64}, {"name": "x2", "cardinality": 11}/' "$D/schema.json" > "$D/wider.json"
awk -F, 'NR == 1 {print $0 ",x2"; next} {print $0 "," $8}' "$D/train.csv" > "$D/wide.csv"
expect_error "data wider than the checkpoint's model" "has 3 dense and 6 categorical columns; the checkpoint's model reads 3 and 5" \
    $NB train $SMALL --data csv:"$D/wide.csv" --schema "$D/wider.json" --steps 25 --eval-samples 100 --out "$TMP/run"

# ---- multi-valued columns ----
# u holds one value per row: "sum" (max_values 1) and "mean" (max_values 3) pool it to its row
for p in 'sum", "max_values": 1' 'mean", "max_values": 3'; do
    n=${p%%\"*}
    sed "s/{\"name\": \"u\", \"cardinality\": 50}/{\"name\": \"u\", \"cardinality\": 50, \"pooling\": \"$p}/" "$D/schema.json" > "$D/u_$n.json"
    $NB train $SMALL --data csv:"$D/train.csv" --schema "$D/u_$n.json" --val-data "$D/test.csv" --steps 30 --eval-every 0 \
        --out "$TMP/u_$n" > /dev/null 2>&1 || fail "train with u as $n"
    same_state "one value per row, \"pooling\": \"$n\" == the single-valued column" "$TMP/straight" "$TMP/u_$n"
done
grep -q '"multi_valued": "0:sum:1"' "$TMP/u_sum/ckpt/state.json" && pass "state.json keeps the multi-valued columns" \
    || fail "state.json: $(grep multi_valued "$TMP/u_sum/ckpt/state.json")"

# tags: 0..5 hashed words (max 4: rows with 5 are made only for the error below), genres: 0..3 ids joined by '|'
mvcol() { # mvcol FILE SEED MAXTAGS: FILE with the columns tags and genres added
    awk -v seed="$2" -v maxt="$3" 'function r(m) { seed = (seed * 1103515245 + 12345) % 2147483648; return int(seed / 65536) % m }
        BEGIN { FS = OFS = "," } NR == 1 { print $0, "tags", "genres"; next }
        { t = ""; k = r(maxt + 1); for (j = 0; j < k; j++) t = t (j ? " " : "") "t" r(30)
          g = ""; k = r(4); for (j = 0; j < k; j++) g = g (j ? "|" : "") r(12); print $0, t, g }' "$1"
}
mvcol "$D/train.csv" 5 4 > "$D/mv_train.csv"
mvcol "$D/test.csv" 6 4 > "$D/mv_test.csv"
sed 's/{"name": "z", "hash_size": 64}/{"name": "z", "hash_size": 64}, {"name": "tags", "hash_size": 40, "pooling": "mean", "max_values": 4},\
    {"name": "genres", "cardinality": 12, "pooling": "sum", "max_values": 3, "separator": "|"}/' "$D/schema.json" > "$D/mv.json"
MVA="--data csv:$D/mv_train.csv --schema $D/mv.json --val-data $D/mv_test.csv"
$NB train $SMALL $MVA --steps 20 --eval-every 10 --out "$TMP/mv" > "$TMP/mv.out" 2> "$TMP/mv.err" \
    && grep -q "3 dense and 7 categorical inputs" "$TMP/mv.err" && pass "multi-valued tags (mean) and genres (sum) train" \
    || { fail "train with multi-valued columns"; tail -3 "$TMP/mv.err"; }
last=$(grep "^eval step=20 " "$TMP/mv.out")
ev=$($NB eval --ckpt "$TMP/mv" 2>/dev/null | grep "^eval ")
[ -n "$(get loss "$ev")" ] && [ "$(get loss "$ev")" = "$(get loss "$last")" ] && [ "$(get auc "$ev")" = "$(get auc "$last")" ] \
    && pass "multi-valued: eval --ckpt gives the run's loss $(get loss "$ev")" || fail "multi-valued eval: '$ev' vs '$last'"
$NB predict --ckpt "$TMP/mv" --data "$D/mv_test.csv" --out "$TMP/mv.tsv" 2>/dev/null || fail "multi-valued predict"
bce=$(paste -d, <(tail -n +2 "$TMP/mv.tsv" | cut -f2) <(tail -n +2 "$D/mv_test.csv" | cut -d, -f1) \
    | awk -F, '{p = $1; y = $2; s -= y ? log(p) : log(1 - p); n++} END {printf "%.5f", s / n}')
[ "$(wc -l < "$TMP/mv.tsv")" -eq 201 ] && awk -v a="$bce" -v b="$(get loss "$last")" 'BEGIN {d = a - b; exit !(d < 2e-5 && d > -2e-5)}' \
    && pass "multi-valued predict: a score per row, their BCE is eval's loss ($bce)" || fail "multi-valued predict: BCE $bce"
$NB export --ckpt "$TMP/mv" --out "$TMP/mv.safetensors" > /dev/null 2>&1 \
    && tail -c +9 "$TMP/mv.safetensors" | head -c 4096 | grep -q 'ncat=7 mv=5:mean:4,6:sum:3' \
    && pass "export: seqctr.config says mv=5:mean:4,6:sum:3" || fail "multi-valued export's config"
MB="$MVA --steps 16 --eval-every 0"
$NB train $SMALL $MB --out "$TMP/mv_s" > /dev/null 2>&1 && $NB train $SMALL $MB --stop-after 7 --out "$TMP/mv_r" > /dev/null 2>&1 \
    && $NB train $SMALL $MB --out "$TMP/mv_r" > /dev/null 2>&1 || fail "multi-valued straight / stopped / rerun trainings"
same_state "multi-valued: the rerun resumes" "$TMP/mv_s" "$TMP/mv_r"
for v in "--emb-place host" "--schedule sparse-dist"; do
    $NB train $SMALL $MB $v --out "$TMP/mv_v" > /dev/null 2> "$TMP/mv_v.err" || { fail "multi-valued $v"; tail -2 "$TMP/mv_v.err"; }
    same_state "multi-valued with $v" "$TMP/mv_s" "$TMP/mv_v"
    rm -rf "$TMP/mv_v"
done

{ head -3 "$D/mv_test.csv"; echo "1,1,1.0,1,1,s1,1,1,t1,1,,t1 t2 t3 t4 t5,3"; } > "$D/mv_bad.csv"
expect_error "more values than max_values" "mv_bad.csv:4: column 'tags' (column 12): more than 4 values" \
    $NB eval --ckpt "$TMP/mv" --data "$D/mv_bad.csv"
{ head -3 "$D/mv_test.csv"; echo "1,1,1.0,1,1,s1,1,1,t1,1,,t1,3|12"; } > "$D/mv_bad.csv"
expect_error "a bad value in a multi-valued column" "mv_bad.csv:4: column 'genres' (column 13): '12' is not an integer in 0..11" \
    $NB predict --ckpt "$TMP/mv" --data "$D/mv_bad.csv" --out "$TMP/x.tsv"
sed 's/"pooling": "mean", "max_values": 4/"pooling": "max", "max_values": 4/' "$D/mv.json" > "$D/bad.json"
expect_error "pooling max" "categorical 'tags': pooling 'max' (none, sum or mean" $NB train $SMALL --data csv:"$D/mv_train.csv" --schema "$D/bad.json" --steps 1 --no-ckpt
sed 's/"pooling": "mean", "max_values": 4/"pooling": "mean"/' "$D/mv.json" > "$D/bad.json"
expect_error "no max_values" "categorical 'tags': a multi-valued column needs \"max_values\"" $NB train $SMALL --data csv:"$D/mv_train.csv" --schema "$D/bad.json" --steps 1 --no-ckpt
sed 's/"separator": "|"/"separator": ","/' "$D/mv.json" > "$D/bad.json"
expect_error "the delimiter as separator" "categorical 'genres': the separator must be one character other than the delimiter" $NB train $SMALL --data csv:"$D/mv_train.csv" --schema "$D/bad.json" --steps 1 --no-ckpt
sed 's/"pooling": "mean", "max_values": 4/"pooling": "sum", "max_values": 4/' "$D/mv.json" > "$D/other.json"
expect_error "a schema that changes the checkpoint's pooling" "multi-valued columns (column:pooling:max_values) are '5:sum:4,6:sum:3'; the checkpoint's model has '5:mean:4,6:sum:3'" \
    $NB train $SMALL --data csv:"$D/mv_train.csv" --schema "$D/other.json" --val-data "$D/mv_test.csv" --steps 30 --out "$TMP/mv"
expect_error "--graphs with multi-valued fields that are not full" "--graphs: a batch of 16 samples holds" \
    $NB train $SMALL $MVA --batch 16 --steps 3 --graphs --no-ckpt
expect_error "--cluster-keys with multi-valued columns" "clusters by single-valued keys" \
    $NB train $SMALL $MB --micro-batches 2 --cluster-keys --no-ckpt

big() { # big KIND N: a schema of N columns of KIND
    awk -v kind="$1" -v n="$2" 'BEGIN { printf "{\"label\": \"y\", \"%s\": [", kind
        for (i = 0; i < n; i++) printf "%s%s", i ? ", " : "", kind == "dense" ? "\"d" i "\"" : "{\"name\": \"c" i "\", \"hash_size\": 8}"
        print "]}" }'
}
big dense 65 > "$D/big_dense.json"
big categorical 65 > "$D/big_cat.json"
big categorical 64 > "$D/max_cat.json"
awk 'BEGIN { s = 5; printf "y"; for (j = 0; j < 64; j++) printf ",c%d", j; print ""
             for (i = 0; i < 300; i++) { s = (s * 69069 + 1) % 4294967296; printf "%d", int(s / 65536) % 4 == 0
                 for (j = 0; j < 64; j++) { s = (s * 69069 + 1) % 4294967296; printf ",%d", int(s / 65536) % 9 }; print "" } }' > "$D/max.csv"
$NB train $SMALL --data csv:"$D/max.csv" --schema "$D/max_cat.json" --steps 3 --eval-samples 100 --no-ckpt > "$TMP/max.out" 2> "$TMP/max.err" \
    && grep -q "1 dense and 64 categorical inputs" "$TMP/max.err" && grep -q "^eval step=3 n=100 " "$TMP/max.out" \
    && pass "64 categorical columns (the maximum) train and evaluate" || { fail "64 categorical columns"; tail -3 "$TMP/max.err"; }
expect_error "65 dense columns" "65 dense columns, at most 64" \
    $NB train $SMALL --data csv:"$D/train.csv" --schema "$D/big_dense.json" --steps 1 --no-ckpt
expect_error "65 categorical columns" "65 categorical columns, at most 64" \
    $NB train $SMALL --data csv:"$D/train.csv" --schema "$D/big_cat.json" --steps 1 --no-ckpt
finish
