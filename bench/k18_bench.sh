#!/usr/bin/env bash
# Issue 18 on the GPU: the new kernels against the sequences they replace, then whole training
# steps with the new path and with it switched off by environment (the "old" column), same
# binary, same tokens, same call.
#   bash bench/k18_bench.sh [--no-build] [--steps N]
# Prints test_ops_cuda --bench18 (per kernel: old vs new ms, TFLOP/s, GB/s, ms per step), then a
# table of median step ms (steps after the 5th) / last loss for gpt2 B=32 T=1024 and gpt2-proxy B=8 T=256
# with --graphs, new vs old (NB_FUSE_RESIDUAL=0 NB_FUSE_DGELU=0 NB_GRAD_SET=0), and new with
# NB_BGRAD=1. torch.compile's numbers for the same rows: bench/gpu_bench.sh (not run here: ~6 min).
set -uo pipefail
cd "$(dirname "$0")/.."
NB_BUILD=${NB_BUILD:-build-dev}
PY=${PYTHON:-python3}
build=1 steps=15
while [ $# -gt 0 ]; do
    case "$1" in
        --no-build) build=0 ;;
        --steps) steps=$2; shift ;;
        -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "k18_bench.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
if [ $build = 1 ]; then
    source scripts/device_deps.sh use || exit 1
    make -j"$(nproc)" BUILD="$NB_BUILD" ${NB_MAKE_FLAGS:-} >/tmp/k18_build.log 2>&1 || { tail -20 /tmp/k18_build.log; exit 1; }
fi
echo "== per kernel"
"$NB_BUILD/tests/test_ops_cuda" --bench18 || echo "test_ops_cuda --bench18 failed (rc $?)"
TMP=$(mktemp -d) || exit 1
trap 'rm -rf "$TMP"' EXIT
SHARD=$TMP/tokens.bin
"$PY" bench/torch_anchor.py --make-shard "$SHARD" --tokens 2000000 --seed 1337 >/dev/null || exit 1
median_ms() { # metrics.jsonl -> "median ms of the steps after the 5th / last loss"
    "$PY" -c 'import json, sys, statistics
rs = [r for r in map(json.loads, open(sys.argv[1])) if "ms" in r]
ms = [r["ms"] for r in rs if r.get("step", 0) > 5]
print("%.2f/%.4f" % (statistics.median(ms), rs[-1]["loss"]) if ms else "-")' "$1" 2>/dev/null || echo "-"
}
run() { # LABEL MODEL B T ENV...
    local label=$1 model=$2 b=$3 t=$4; shift 4
    local dir="$TMP/$model-$b-$label"
    if env "$@" timeout 120 "$NB_BUILD/nobubble" train --model "$model" --batch "$b" --seq "$t" --steps "$steps" \
            --device cuda --data "$SHARD" --val-data none --out "$dir" --no-ckpt --graphs --no-progress --quiet \
            >"$dir.log" 2>&1; then
        echo "$(median_ms "$dir/metrics.jsonl")"
    else
        echo "FAIL: $(tail -1 "$dir.log")" >&2
        echo "-"
    fi
}
OLD="NB_FUSE_RESIDUAL=0 NB_FUSE_DGELU=0 NB_GRAD_SET=0"
printf "\n== training steps: median ms / loss at the last step (--graphs, bf16; the losses of one row\n   should agree to ~1e-2: the same math, rounded differently)\n%-26s %18s %18s %18s\n" "model" "old" "new" "new+BGRAD"
for row in "gpt2 32 1024" "gpt2-proxy 8 256"; do
    set -- $row
    o=$(run old "$1" "$2" "$3" $OLD)
    n=$(run new "$1" "$2" "$3" NB_K18=1)
    g=$(run bgrad "$1" "$2" "$3" NB_BGRAD=1)
    printf "%-26s %18s %18s %18s\n" "$1 B=$2 T=$3" "$o" "$n" "$g"
done
