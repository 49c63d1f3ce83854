#!/usr/bin/env bash
# GPU benchmarks of issue 3: nobubble and its PyTorch anchors on the same models, the same tokens
# and the same GPU, in one run (made for one device call: about 6 minutes, never past --budget).
#   bash bench/gpu_bench.sh [--no-build] [--quick] [--no-reduce-overhead] [--no-llama] [--no-nobubble]
#                           [--no-kernels] [--no-eager] [--rows LIST] [--budget S]
#     --no-build             use the nobubble binary already in $NB_BUILD (default build-dev)
#     --quick                fewer timed steps (proxy 20, gpt2 10, llama-1b 5), no reduce-overhead
#     --no-reduce-overhead   skip torch.compile(mode="reduce-overhead") (CUDA graphs)
#     --no-llama             skip llama-1b (its compile is the longest: about 1-2 minutes)
#     --no-nobubble          run only the PyTorch anchors, even where nobubble's CUDA trainer works
#     --no-kernels           skip the kernel tables (bench/kernel_table.sh: each nobubble row's step,
#                            kernel by kernel, from CUPTI; printed after the nobubble runs)
#     --no-eager             no eager PyTorch runs (never the best mode so far): llama-1b runs at
#                            B = $LLAMA_B (16) instead of the largest batch eager fits
#     --rows LIST            only these rows, comma-separated: proxy, gpt2 (B=32 and 64), llama,
#                            gpt2-ro (gpt2 B=32 under reduce-overhead) [all]
#     --budget S             no run starts that would end later than S seconds after start [480]
# Writes to $OUT (default bench/out): anchor.jsonl (one JSON line per PyTorch run), nobubble.jsonl
# (one per nobubble run, once its CUDA trainer exists), anchor.log, build.log, table.txt; prints
# the table last. bench/README.md says what every number means.
set -uo pipefail   # no -e: one failing configuration must not hide the numbers of the others
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/out}
NB_BUILD=${NB_BUILD:-build-dev}
PY=${PYTHON:-python3}
build=1 quick=0 ro=1 llama=1 nb=1 kern=1 eager=1 rows=proxy,gpt2,llama,gpt2-ro budget=480
while [ $# -gt 0 ]; do
    case "$1" in
        --no-build) build=0 ;;
        --quick) quick=1 ro=0 ;;
        --no-reduce-overhead) ro=0 ;;
        --no-llama) llama=0 ;;
        --no-nobubble) nb=0 ;;
        --no-kernels) kern=0 ;;
        --no-eager) eager=0 ;;
        --rows) [ $# -ge 2 ] || { echo "gpu_bench.sh: --rows needs a list (proxy,gpt2,llama,gpt2-ro)" >&2; exit 2; }
                rows=$2; shift ;;
        --budget) [ $# -ge 2 ] || { echo "gpu_bench.sh: --budget needs a number of seconds" >&2; exit 2; }
                  budget=$2; shift ;;
        -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "gpu_bench.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
case "$budget" in ''|*[!0-9]*) echo "gpu_bench.sh: --budget takes whole seconds, got '$budget'" >&2; exit 2 ;; esac
if [ $quick = 1 ]; then S_PROXY=20 S_GPT2=10 S_LLAMA=5; else S_PROXY=50 S_GPT2=20 S_LLAMA=10; fi

start=$(date +%s)
mkdir -p "$OUT" || exit 1
rm -f "$OUT/anchor.jsonl" "$OUT/nobubble.jsonl" "$OUT/anchor.log" "$OUT/table.txt"
TMP=$(mktemp -d) || exit 1
trap 'rm -rf "$TMP"' EXIT
export PYTHONUNBUFFERED=1
status=0
stamp() { echo "[$(( $(date +%s) - start )) s]"; }

echo "== device $(stamp)"
GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv 2>/dev/null \
    || echo "nvidia-smi: not available"
"$PY" -c 'import torch, sys; print("torch", torch.__version__, "CUDA", torch.version.cuda, "python", sys.version.split()[0])' \
    || { echo "gpu_bench.sh: $PY cannot import torch: the anchors need the GPU machine's python3 (PYTHON=...)"; exit 1; }

echo "== build nobubble ($NB_BUILD) $(stamp)"
if [ $build = 1 ]; then
    source scripts/device_deps.sh use || status=1   # OpenBLAS where Debian's package is absent
    if make -j"$(nproc)" BUILD="$NB_BUILD" ${NB_MAKE_FLAGS:-} "$NB_BUILD/nobubble" >"$OUT/build.log" 2>&1; then
        echo "built $NB_BUILD/nobubble"
    else
        echo "nobubble build failed (the PyTorch anchors still run); last lines of $OUT/build.log:"
        tail -15 "$OUT/build.log"
        status=1
    fi
fi

# Both engines read the same tokens: one llm.c shard of random ids in [0, 50257) from a fixed
# seed (never zeros: they can run faster than real data).
SHARD="$TMP/tokens.bin"
"$PY" bench/torch_anchor.py --make-shard "$SHARD" --tokens 2000000 --seed 1337 || exit 1

# ============================== nobubble GPU runs: probe ==============================
# The CUDA trainer is not in this build yet: the probe fails and no nobubble run happens, so the
# table's nobubble columns stay '-'. Never write nobubble numbers here by hand. Once
# `nobubble train --device cuda` works, the probe passes, time is kept back for the nobubble runs
# (nb_run, after the anchors) and their results land in $OUT/nobubble.jsonl.
NB="$NB_BUILD/nobubble"
nb_ok=0
if [ $nb = 1 ] && [ -x "$NB" ] && timeout 60 "$NB" train --model gpt2-tiny --device cuda --batch 1 --steps 1 \
        --data "$SHARD" --val-data none --out "$TMP/nb-probe" --no-progress --quiet >"$TMP/nb-probe.log" 2>&1; then
    nb_ok=1
fi
# seconds kept for the nobubble runs and tables after the anchors, from the rows asked for (H200,
# 2026-12-03: proxy 5 s, gpt2 B=32 + B=64 17 s, llama-1b 19 s, a kernel table 4-13 s), with room
nb_reserve=0
if [ $nb_ok = 1 ]; then
    nb_reserve=15
    case ",$rows," in *,proxy,*) nb_reserve=$((nb_reserve + 15 + 15 * kern)) ;; esac
    case ",$rows," in *,gpt2,*) nb_reserve=$((nb_reserve + 30 + 15 * kern)) ;;
                      *,gpt2-ro,*) nb_reserve=$((nb_reserve + 15 + 15 * kern)) ;; esac
    case ",$rows," in *,llama,*) [ $llama = 1 ] && nb_reserve=$((nb_reserve + 45 + 25 * kern)) ;; esac
fi
deadline=$(( start + budget - nb_reserve ))

# ================================== PyTorch anchors ==================================
# Most important first: a run that would cross the deadline is reported as skipped.
anchor() {
    echo "== pytorch: $* $(stamp)"
    "$PY" bench/torch_anchor.py --data "$SHARD" --json "$OUT/anchor.jsonl" --deadline "$deadline" "$@" 2>&1 \
        | tee -a "$OUT/anchor.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
}
row() { case ",$rows," in *",$1,"*) return 0 ;; esac; return 1; }
for r in ${rows//,/ }; do
    case $r in proxy|gpt2|llama|gpt2-ro) ;; *) echo "gpu_bench.sh: unknown row '$r' in --rows (proxy, gpt2, llama, gpt2-ro)" >&2; exit 2 ;; esac
done
ev=eager,; [ $eager = 0 ] && ev=
small_modes=${ev}compile
[ $ro = 1 ] && small_modes=${ev}compile,reduce-overhead
row proxy && anchor --model gpt2-proxy --batch 8 --seq 256 --mode "$small_modes" --steps $S_PROXY
row gpt2 && anchor --model gpt2 --batch 32,64 --seq 1024 --mode ${ev}compile --steps $S_GPT2
# llama-1b: the largest batch of 16, 8, 4, 2, 1 that runs eagerly, then torch.compile at that batch
if row llama && [ $llama = 1 ]; then
    if [ $eager = 1 ]; then anchor --model llama-1b --seq 2048 --max-batch --batches 16,8,4,2,1 --mode eager,compile --steps $S_LLAMA
    else anchor --model llama-1b --seq 2048 --batch "${LLAMA_B:-16}" --mode compile --steps $S_LLAMA; fi
fi
[ $ro = 1 ] && row gpt2-ro && anchor --model gpt2 --batch 32 --seq 1024 --mode reduce-overhead --steps $S_GPT2

# ============================== nobubble GPU runs: runs ==============================
# PLACE OF THE NOBUBBLE RUNS (issue 3). Each nb_run trains one configuration on the same shard
# and appends one line to $OUT/nobubble.jsonl: the median step time of its metrics.jsonl after
# the first 5 steps, same FLOP formula as the anchors. The table joins it to the PyTorch rows of
# the same (model, batch, seq) and fills the ratio column. Other schedules (erase, stream): more
# nb_run lines with --schedule, and --nb-schedule NAME in the collect step.
nb_run() {   # MODEL BATCH SEQ STEPS
    local dir="$TMP/nb-$1-b$2"
    echo "== nobubble: $1 B=$2 T=$3 $(stamp)"
    # the final checkpoint of llama-1b is ~14 GB of fp32 state: the timeout leaves room for it
    # --graphs: nobubble's best mode (one captured step replayed), as the anchor is PyTorch's best
    if timeout 240 "$NB" train --model "$1" --batch "$2" --seq "$3" --steps "$4" --device cuda --data "$SHARD" \
            --val-data none --out "$dir" --no-ckpt --graphs --no-progress --quiet >"$dir.log" 2>&1; then
        "$PY" bench/torch_anchor.py --collect-nobubble "$dir" --model "$1" --batch "$2" --seq "$3" --skip 5 \
            --device-name "${GPU_NAME:-unknown}" --json "$OUT/nobubble.jsonl" || status=1
    else
        echo "nobubble $1 B=$2 T=$3 failed or timed out; last lines of its log:"
        tail -5 "$dir.log"
        status=1
    fi
}
if [ $nb_ok = 1 ]; then
    row proxy && nb_run gpt2-proxy 8 256 $((S_PROXY + 5))
    { row gpt2 || row gpt2-ro; } && nb_run gpt2 32 1024 $((S_GPT2 + 5))
    row gpt2 && nb_run gpt2 64 1024 $((S_GPT2 + 5))
    llama_b=$("$PY" -c 'import json, sys
b = [r["max_batch"] for r in map(json.loads, open(sys.argv[1])) if r.get("model") == "llama-1b" and "max_batch" in r]
print(max(b) if b else 0)' "$OUT/anchor.jsonl" 2>/dev/null || echo 0)
    [ $eager = 0 ] && llama_b=${LLAMA_B:-16}
    row llama && [ $llama = 1 ] && [ "$llama_b" -gt 0 ] && nb_run llama-1b "$llama_b" 2048 $((S_LLAMA + 5))
    # where each step's time goes, kernel by kernel: separate short runs, so the timed ones above
    # run without CUPTI
    if [ $kern = 1 ]; then
        echo "== kernel tables $(stamp)"
        specs=''
        row proxy && specs="gpt2-proxy:8:256"
        { row gpt2 || row gpt2-ro; } && specs="$specs gpt2:32:1024"
        row llama && [ $llama = 1 ] && [ "$llama_b" -gt 0 ] && specs="$specs llama-1b:$llama_b:2048"
        # shellcheck disable=SC2086
        [ -n "$specs" ] && { OUT="$OUT" NB_BUILD="$NB_BUILD" bash bench/kernel_table.sh --no-build --rows 25 $specs || status=1; }
    fi
elif [ $nb = 0 ]; then
    echo "nobubble: not run (--no-nobubble)"
else
    echo "nobubble: not available in this build"
    [ -s "$TMP/nb-probe.log" ] && echo "  (probe: $(tail -1 "$TMP/nb-probe.log"))"
fi

echo "== table $(stamp)"
"$PY" bench/torch_anchor.py --table "$OUT/anchor.jsonl" "$OUT/nobubble.jsonl" | tee "$OUT/table.txt"
echo "done in $(( $(date +%s) - start )) s; results in $OUT"
exit $status
