#!/usr/bin/env bash
# seqctr GPU benchmark (issue 4): `nobubble train --model seqctr --device cuda` against the batched
# PyTorch anchor (bench/seqctr_torch.py, eager and torch.compile) on the same samples (one
# `nobubble synth-dump` file) and the same GPU, in one device call, never past --budget.
#   bash bench/seqctr_bench.sh [--steps S] [--batch B[,B...]] [--no-build] [--budget SECONDS]
#     --steps S       timed steps of every run, after 10 warm-up steps that are not timed [100]
#     --batch LIST    comma list of batch sizes [4096]
#     --no-build      use $NB_BUILD/nobubble as it is (default: make it first)
#     --budget S      no run starts that would end later than S seconds after the start [540]
# Environment: OUT (results; default bench/out/seqctr), NB_BUILD [build],
#   PYTHON [python3], SPEC [synth:cap=1000000,max_len=256], EMB [64], MAX_LEN [256],
#   TABLE_CAP [1000000], NB_FLAGS (nobubble's extra flags) [--graphs: the step captured once and
#   replayed, its fastest mode]; DEVICE [cuda] and DTYPE [bf16]: DEVICE=cpu DTYPE=fp32 NB_FLAGS= is the
#   CPU comparison (Debian's torch 1.13 on every core: PYTHON=/usr/bin/python3; no compile there).
# Writes to $OUT: build.log, dump.log, nb-b<B>/ (train.log, metrics.jsonl), nobubble.jsonl and
# torch.jsonl (one JSON line per run), torch.log, table.md; prints the table last.
# p90 samples/s = B / 90th-percentile step time (bench/seqctr_torch.py's docstring; README).
set -uo pipefail   # no -e: one failing run must not hide the numbers of the others
cd "$(dirname "$0")/.." || exit 1
WARM=10            # warm-up steps of every implementation, left out of the step times
steps=100 batches=4096 build=1 budget=540
while [ $# -gt 0 ]; do
    case "$1" in
        --steps|--batch|--budget)
            [ $# -ge 2 ] || { echo "seqctr_bench.sh: $1 needs a value" >&2; exit 2; }
            case "$1" in --steps) steps=$2 ;; --batch) batches=$2 ;; --budget) budget=$2 ;; esac
            shift ;;
        --no-build) build=0 ;;
        -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "seqctr_bench.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
case "$steps" in ''|*[!0-9]*|0) echo "seqctr_bench.sh: --steps takes a positive integer, got '$steps'" >&2; exit 2 ;; esac
case "$budget" in ''|*[!0-9]*) echo "seqctr_bench.sh: --budget takes whole seconds, got '$budget'" >&2; exit 2 ;; esac
maxB=0
for B in ${batches//,/ }; do
    case "$B" in ''|*[!0-9]*|0) echo "seqctr_bench.sh: --batch takes positive integers (comma list), got '$batches'" >&2; exit 2 ;; esac
    [ "$B" -gt "$maxB" ] && maxB=$B
done
[ "$maxB" -gt 0 ] || { echo "seqctr_bench.sh: --batch is empty" >&2; exit 2; }

OUT=${OUT:-bench/out/seqctr}
NB_BUILD=${NB_BUILD:-build}
NB=$NB_BUILD/nobubble
PY=${PYTHON:-python3}
SPEC=${SPEC:-synth:cap=1000000,max_len=256}
EMB=${EMB:-64}
MAX_LEN=${MAX_LEN:-256}
TABLE_CAP=${TABLE_CAP:-1000000}
DEVICE=${DEVICE:-cuda}
DTYPE=${DTYPE:-bf16}
# Seconds per batch size kept back for PyTorch while a nobubble row runs: only a cap on a nobubble
# run that hangs. A row that ends early leaves the rest to PyTorch, whose runs each check their
# own estimate against the deadline (seqctr_torch.py --deadline): the PyTorch side gets what the
# nobubble rows actually left, not a fixed share (a fixed 200 s skipped nobubble at budgets of
# 220 and 290 s although the whole script then took 80 s).
TORCH_RESERVE=${TORCH_RESERVE:-60}

start=$(date +%s)
mkdir -p "$OUT" || exit 1
rm -f "$OUT/nobubble.jsonl" "$OUT/torch.jsonl" "$OUT/torch.log" "$OUT/table.md"
TMP=$(mktemp -d) || exit 1
trap 'rm -rf "$TMP"' EXIT
export PYTHONUNBUFFERED=1
status=0
stamp() { echo "[$(( $(date +%s) - start )) s]"; }
left() { echo $(( start + budget - $(date +%s) )); }

echo "== device $(stamp)"
GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv 2>/dev/null \
    || echo "nvidia-smi: not available"
torch_ok=1
"$PY" -c 'import torch, sys; print("torch", torch.__version__, "CUDA", torch.version.cuda, "python", sys.version.split()[0])' \
    || { echo "$PY cannot import torch: the PyTorch runs are skipped (PYTHON=... to choose another)"; torch_ok=0; status=1; }

echo "== build nobubble ($NB_BUILD) $(stamp)"
if [ $build = 1 ]; then
    source scripts/device_deps.sh use || status=1   # OpenBLAS where Debian's package is absent (carry .deps)
    if make -j"$(nproc)" BUILD="$NB_BUILD" ${NB_MAKE_FLAGS:-} "$NB" >"$OUT/build.log" 2>&1; then
        echo "built $NB"
    else
        echo "nobubble build failed; last lines of $OUT/build.log:"
        tail -15 "$OUT/build.log"
        status=1
    fi
fi
[ -x "$NB" ] || { echo "no $NB: the samples cannot be written, nothing can run"; exit 1; }

# One file of samples for every run: batch k of batch size B = samples k*B .. k*B + B - 1, the
# ones nobubble's step k trains on. It stays in $TMP (about 100 MB per 400k samples).
N=$(( maxB * (steps + WARM) ))
echo "== synth-dump: $N samples of $SPEC $(stamp)"
if ! "$NB" synth-dump --data "$SPEC" --samples "$N" --max-len "$MAX_LEN" --table-cap "$TABLE_CAP" \
        --out "$TMP/synth.bin" >"$OUT/dump.log" 2>&1; then
    echo "synth-dump failed:"; tail -3 "$OUT/dump.log"; exit 1
fi
cat "$OUT/dump.log"

# nb_record B STATUS MESSAGE: a nobubble line that did not produce step times (for the table)
nb_record() {
    "$PY" -c 'import json, sys
print(json.dumps(dict(engine="nobubble", impl="nobubble", batch=int(sys.argv[1]), status=sys.argv[2], error=sys.argv[3])))' \
        "$@" >>"$OUT/nobubble.jsonl"
}

nbatch=$(echo "$batches" | tr ',' '\n' | grep -c .)
for B in ${batches//,/ }; do
    echo "== nobubble B=$B $(stamp)"
    dir="$OUT/nb-b$B"
    mkdir -p "$dir" && rm -f "$dir/metrics.jsonl"   # never count the steps of an earlier run into $OUT
    t=$(( $(left) - TORCH_RESERVE * (torch_ok ? nbatch : 0) ))
    if [ "$t" -lt 30 ]; then
        echo "skipped (time budget: ${t} s left for it after ${TORCH_RESERVE} s per batch size kept for PyTorch)"
        nb_record "$B" "skipped (time budget)" ""; continue
    fi
    row_start=$(date +%s)
    # --out in $TMP: the run ends with a checkpoint of every embedding table (GBs at these sizes)
    timeout "$t" "$NB" train --model seqctr --device "$DEVICE" --data "$SPEC" --emb-dim "$EMB" --max-len "$MAX_LEN" \
        --table-cap "$TABLE_CAP" --batch "$B" --steps $(( steps + WARM )) --eval-samples 4096 --no-ckpt --out "$TMP/nb-b$B" ${NB_FLAGS---graphs} \
        >"$dir/train.log" 2>&1
    rc=$?
    echo "nobubble B=$B took $(( $(date +%s) - row_start )) s (its cap was $t s); $(left) s of the budget left"
    cp "$TMP/nb-b$B/metrics.jsonl" "$dir/" 2>/dev/null
    lines=$(wc -l <"$dir/metrics.jsonl" 2>/dev/null || echo 0)
    # every step's line is flushed as it ends: all of them there means the timing is complete even
    # if the run failed afterwards (in the checkpoint, say)
    if [ "$lines" -ge $(( steps + WARM )) ]; then
        [ $rc -eq 0 ] || { echo "nobubble exited $rc after its last step (see $dir/train.log)"; status=1; }
        "$PY" bench/seqctr_torch.py --collect-nobubble "$dir" --batch "$B" --skip $WARM --device-name "${GPU_NAME:-unknown}" \
            --json "$OUT/nobubble.jsonl" || status=1
        grep -E '^(throughput|breakdown|eval) ' "$dir/train.log"   # the trainer's own summary, for comparison
    else
        why=$([ $rc -eq 124 ] && echo "timed out after $t s" || tail -n 1 "$dir/train.log")
        echo "nobubble B=$B failed (exit $rc, $lines steps): $why"
        tail -5 "$dir/train.log"
        nb_record "$B" "error" "exit $rc after $lines steps: $why"
        status=1
    fi
done

if [ $torch_ok = 1 ]; then
    echo "== pytorch: the model against the float64 reference (CPU, this torch's SDPA) $(stamp)"
    "$PY" bench/seqctr_torch.py --check-ref 2>&1 | tee "$OUT/torch.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "the PyTorch model does not match the reference: its numbers are suspect"; status=1; }
    echo "== pytorch (eager, compile) $(stamp)"
    "$PY" bench/seqctr_torch.py --data "$TMP/synth.bin" --batch "$batches" --steps "$steps" --warmup $WARM \
        --emb-dim "$EMB" --device "$DEVICE" --dtype "$DTYPE" --mode eager,compile --json "$OUT/torch.jsonl" --deadline $(( start + budget )) 2>&1 \
        | tee -a "$OUT/torch.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi

echo "== table $(stamp)"
"$PY" bench/seqctr_torch.py --table "$OUT/nobubble.jsonl" "$OUT/torch.jsonl" | tee "$OUT/table.md"
echo "done in $(( $(date +%s) - start )) s; results in $OUT"
exit $status
