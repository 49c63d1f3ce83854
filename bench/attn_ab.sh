#!/usr/bin/env bash
# The transformer step with each attention implementation (--attn: fa = our flash kernels, cudnn-fwd =
# cuDNN's forward with our backward, cudnn = cuDNN forward and its deterministic backward, cudnn-fast =
# cuDNN with its atomic (non-deterministic) backward), the same tokens, in one call: median step ms
# after 5 warm-up steps, the final loss, and whether two runs of a mode give the same losses.
#   bash bench/attn_ab.sh [--no-build] [--modes fa,cudnn-fwd,cudnn,cudnn-fast] [--runs "gpt2:32:1024 gpt2-proxy:8:256"] [--steps 25]
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
die() { echo "attn_ab.sh: $*" >&2; exit 1; }
build=1 modes=fa,cudnn-fwd,cudnn,cudnn-fast runs="gpt2-proxy:8:256 gpt2:32:1024" steps=25
while [ $# -gt 0 ]; do
    case "$1" in
        --no-build) build=0 ;;
        --modes|--runs|--steps) [ $# -ge 2 ] || die "$1 needs a value"
            case "$1" in --modes) modes=$2 ;; --runs) runs=$2 ;; --steps) steps=$2 ;; esac; shift ;;
        -h|--help) sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown option '$1' (see --help)" ;;
    esac
    shift
done
NB_BUILD=${NB_BUILD:-build-dev} NB=${NB_BUILD:-build-dev}/nobubble PY=${PYTHON:-python3}
[ $build = 1 ] && { make -j"$(nproc)" BUILD="$NB_BUILD" ${NB_MAKE_FLAGS:-} "$NB" >/dev/null || die "build failed"; }
[ -x "$NB" ] || die "$NB not found (build first)"
OUT=${OUT:-bench/out/attn_ab}; mkdir -p "$OUT" || exit 1
SHARD=$OUT/tokens.bin
[ -f "$SHARD" ] || "$PY" bench/torch_anchor.py --make-shard "$SHARD" --tokens 2000000 --seed 1337 || die "no token shard"
echo "| model | B x T | --attn | median step ms | final loss | repeat bitwise |" > "$OUT/table.md"
echo "|---|---|---|---|---|---|" >> "$OUT/table.md"
for run in $runs; do
    IFS=: read -r model B T <<< "$run"
    for m in ${modes//,/ }; do
        for rep in 1 2; do
            dir=$OUT/$model-b$B-$m-$rep
            timeout 240 "$NB" train --attn "$m" --model "$model" --batch "$B" --seq "$T" --steps "$steps" --device cuda \
                --data "$SHARD" --val-data none --out "$dir" --no-ckpt --graphs --no-progress --quiet >"$dir.log" 2>&1 \
                || { echo "$model $m run $rep failed: $(grep -m1 -i 'error' "$dir.log" | cut -c1-160)"; }
        done
        "$PY" - "$OUT/$model-b$B-$m-1" "$OUT/$model-b$B-$m-2" "$model" "$B x $T" "$m" >> "$OUT/table.md" <<'PYEOF'
import json, statistics, sys
def load(d):
    try: return [json.loads(l) for l in open(d + "/metrics.jsonl") if '"loss"' in l]
    except OSError: return []
a, b = load(sys.argv[1]), load(sys.argv[2])
if not a: print(f"| {sys.argv[3]} | {sys.argv[4]} | {sys.argv[5]} | failed | | |"); sys.exit()
ms = statistics.median(r["ms"] for r in a[5:]) if len(a) > 5 else float("nan")
same = "yes" if b and [r["loss"] for r in a] == [r["loss"] for r in b] else "no"
print(f"| {sys.argv[3]} | {sys.argv[4]} | {sys.argv[5]} | {ms:.2f} | {a[-1]['loss']:.6f} | {same} |")
PYEOF
        grep -h -i "cudnn" "$OUT/$model-b$B-$m-1.log" | head -3
    done
done
cat "$OUT/table.md"
