#!/usr/bin/env bash
# dlrm-dcnv2 benchmark (issue 34): `nobubble train --model dlrm-dcnv2 --device cuda` (synthetic
# multi-hot data of MLPerf's shapes, per-GPU batch 6,912, train only) against the same model in
# PyTorch (bench/dlrm_torch.py: eager, torch.compile, reduce-overhead) on the same GPU, in one device
# call, never past --budget; and MLPerf v4.0's published HugeCTR number per GPU beside them.
#   bash bench/dlrm_bench.sh [--budget S] [--table-cap N] [--batch B] [--steps S] [--no-build] [--quick]
#     --budget S      no run starts that would end later than S seconds after the start [420]
#     --table-cap N   rows per table at most (MLPerf's 26 tables, dim 128) [4000000: 24.2 M rows, 12.4 GB
#                     of fp32 rows + 12.4 GB of element-wise Adagrad sums on each side, one side at a time]
#     --batch B       samples per step [6912: MLPerf's per-GPU batch]
#     --steps S       timed steps of every run, after 10 warm-up steps that are not timed [100]
#     --no-build      use $NB_BUILD/nobubble as it is (default: make it first)
#     --quick         CPU smoke run with tiny sizes (cap 1000, batch 128, 10 steps): nobubble on the CPU,
#                     PyTorch eager on the CPU only if this python has torch (else its rows say skipped)
# Environment: OUT (results; default bench/out/dlrm), NB_BUILD [build], PYTHON [python3],
#   NB_FLAGS (nobubble's extra flags) [--graphs --schedule pipe --emb-shard none: the step captured
#   once and replayed, and the next batch's ids uploaded and its index lists built on the emb lane
#   while the step trains (PyTorch's batches wait on the GPU before its timed steps); if that run
#   fails, one run without --graphs follows when time allows], MODES [eager,compile,reduce-overhead],
#   TORCH_RESERVE (seconds kept for PyTorch while nobubble runs: only a cap on a run that hangs) [240],
#   NB_MIN (seconds nobubble's run gets even when that leaves PyTorch less than its reserve) [120],
#   NB_DATA [files]: nobubble reads its samples from MLPerf-layout day files that `nobubble synth-dump
#   --format mlperf` writes first (the generator's samples 0.., memory-mapped: the step is not bound
#   by making samples on the host); synth: `--data synth`, the generator inside the run (its host
#   time per step is in the "host ms/step" line; above the step time it bounds nobubble's rate).
# Writes to $OUT (8 files: the device tool's limit): table.md, nobubble.jsonl, torch.jsonl, torch.log,
# params.json, nb/train.log, nb/metrics.jsonl, and logs.tgz (build.log, nb/dump.log, nb/params.log,
# the log of a failed nobubble run); prints the table last. bench/README.md (dlrm-dcnv2 section) has the rest.
set -uo pipefail   # no -e: one failing run must not hide the numbers of the others
cd "$(dirname "$0")/.." || exit 1
WARM=10
steps=100 batch=6912 cap=4000000 build=1 budget=420 quick=0
given_steps=0 given_batch=0 given_cap=0
while [ $# -gt 0 ]; do
    case "$1" in
        --steps|--batch|--budget|--table-cap)
            [ $# -ge 2 ] || { echo "dlrm_bench.sh: $1 needs a value" >&2; exit 2; }
            case "$1" in
                --steps) steps=$2 given_steps=1 ;;
                --batch) batch=$2 given_batch=1 ;;
                --budget) budget=$2 ;;
                --table-cap) cap=$2 given_cap=1 ;;
            esac
            shift ;;
        --no-build) build=0 ;;
        --quick) quick=1 ;;
        -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "dlrm_bench.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
for v in "steps=$steps" "batch=$batch" "table-cap=$cap"; do
    case "${v#*=}" in ''|*[!0-9]*|0) echo "dlrm_bench.sh: --${v%%=*} takes a positive integer, got '${v#*=}'" >&2; exit 2 ;; esac
done
case "$budget" in ''|*[!0-9]*) echo "dlrm_bench.sh: --budget takes whole seconds, got '$budget'" >&2; exit 2 ;; esac

OUT=${OUT:-bench/out/dlrm}
NB_BUILD=${NB_BUILD:-build}
NB=$NB_BUILD/nobubble
PY=${PYTHON:-python3}
DEVICE=cuda DTYPE=bf16
MODES=${MODES:-eager,compile,reduce-overhead}
NB_DATA=${NB_DATA:-files}
case "$NB_DATA" in files|synth) ;; *) echo "dlrm_bench.sh: NB_DATA is files or synth, got '$NB_DATA'" >&2; exit 2 ;; esac
NB_FLAGS=${NB_FLAGS---graphs --schedule pipe --emb-shard none}
TORCH_RESERVE=${TORCH_RESERVE:-240}
NB_MIN=${NB_MIN:-120}
if [ $quick = 1 ]; then
    # the CPU: fp32 on both sides (nobubble's CPU backend computes in fp32), no CUDA graphs, eager only
    DEVICE=cpu DTYPE=fp32 MODES=eager NB_FLAGS="" TORCH_RESERVE=30 NB_MIN=30
    [ $given_steps = 1 ] || steps=10
    [ $given_batch = 1 ] || batch=128
    [ $given_cap = 1 ] || cap=1000
    WARM=3
fi

start=$(date +%s)
mkdir -p "$OUT/nb" || exit 1
rm -f "$OUT/nobubble.jsonl" "$OUT/torch.jsonl" "$OUT/torch.log" "$OUT/table.md" "$OUT/params.json" "$OUT/logs.tgz" "$OUT"/nb/*.log "$OUT/nb/metrics.jsonl"
TMP=$(mktemp -d) || exit 1
trap 'rm -rf "$TMP"' EXIT
export PYTHONUNBUFFERED=1
status=0
stamp() { echo "[$(( $(date +%s) - start )) s]"; }
left() { echo $(( start + budget - $(date +%s) )); }

echo "== dlrm-dcnv2: batch $batch, table cap $cap, $steps timed steps after $WARM, on $DEVICE ($DTYPE), budget $budget s $(stamp)"
GPU_NAME=cpu GPU_MEM_GB=0
if [ "$DEVICE" = cuda ]; then
    nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv 2>/dev/null \
        || echo "nvidia-smi: not available"
    GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
    mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
    case "$mib" in ''|*[!0-9]*) ;; *) GPU_MEM_GB=$(awk -v m="$mib" 'BEGIN { printf "%.1f", m * 1048576 / 1e9 }') ;; esac
fi
torch_ok=1 torch_why=""
if ! "$PY" -c 'import torch, sys; print("torch", torch.__version__, "CUDA", torch.version.cuda, "python", sys.version.split()[0])' 2>/dev/null; then
    torch_ok=0 torch_why="torch not installed"
    echo "$PY cannot import torch: the PyTorch rows are skipped (PYTHON=... to choose another)"
    [ $quick = 1 ] || status=1
elif [ "$DEVICE" = cuda ] && ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    torch_ok=0 torch_why="torch sees no CUDA device"
    echo "torch sees no CUDA device: the PyTorch rows are skipped"
    status=1
fi

# the sizes each side holds (printed before anything is allocated)
"$PY" bench/dlrm_torch.py --params --table-cap "$cap" --batch "$batch" --gpu-mem-gb "$GPU_MEM_GB" 2>&1 | grep -E '^(formula|memory|fits) '

echo "== build nobubble ($NB_BUILD) $(stamp)"
if [ $build = 1 ]; then
    [ $quick = 1 ] || { source scripts/device_deps.sh use || status=1; }   # OpenBLAS where Debian's package is absent (carry .deps)
    if make -j"$(nproc)" BUILD="$NB_BUILD" ${NB_MAKE_FLAGS:-} "$NB" >"$OUT/build.log" 2>&1; then
        echo "built $NB"
    else
        echo "nobubble build failed; last lines of $OUT/build.log:"
        tail -15 "$OUT/build.log"
        status=1
    fi
fi

# nb_record IMPL STATUS MESSAGE: a nobubble row without step times (for the table)
nb_record() {
    "$PY" -c 'import json, sys
print(json.dumps(dict(engine="nobubble", impl=sys.argv[1], batch=int(sys.argv[2]), status=sys.argv[3], error=sys.argv[4])))' \
        "$1" "$batch" "$2" "$3" >>"$OUT/nobubble.jsonl"
}

# nb_run IMPL FLAGS...: one timed nobubble run into $OUT/nb (its --out in $TMP: nothing big is kept)
nb_run() {
    local impl=$1; shift
    # PyTorch's reserve, but never less than NB_MIN for nobubble while the budget has it (a slow
    # build must not skip the nobubble row; PyTorch's modes then skip by their own deadline)
    local t=$(( $(left) - (torch_ok ? TORCH_RESERVE : 0) ))
    [ "$t" -ge "$NB_MIN" ] || t=$(( $(left) < NB_MIN ? $(left) : NB_MIN ))
    if [ "$t" -lt 20 ]; then
        echo "$impl skipped (time budget: only $t s left for it)"
        nb_record "$impl" "skipped (time budget)" ""
        return 1
    fi
    rm -rf "$TMP/nb" && rm -f "$OUT/nb/metrics.jsonl"
    local row_start; row_start=$(date +%s)
    # --eval-every 0 --eval-samples 1024: one small held-out pass after the last step, outside the step times
    timeout "$t" "$NB" train --model dlrm-dcnv2 --device "$DEVICE" --data "$NB_SRC" --table-cap "$cap" --batch "$batch" \
        --steps $(( steps + WARM )) --eval-every 0 --eval-samples 1024 --log-every 0 --no-ckpt --out "$TMP/nb" "$@" \
        >"$OUT/nb/train.log" 2>&1
    local rc=$?
    echo "$impl took $(( $(date +%s) - row_start )) s (its cap was $t s); $(left) s of the budget left"
    cp "$TMP/nb/metrics.jsonl" "$OUT/nb/" 2>/dev/null
    local lines; lines=$({ wc -l <"$OUT/nb/metrics.jsonl"; } 2>/dev/null || echo 0)
    if [ "$lines" -ge $(( steps + WARM )) ]; then   # every step's line is flushed as it ends
        [ $rc -eq 0 ] || { echo "nobubble exited $rc after its last step (see $OUT/nb/train.log)"; status=1; }
        "$PY" bench/dlrm_torch.py --collect-nobubble "$OUT/nb" --impl "$impl" --batch "$batch" --table-cap "$cap" --skip $WARM \
            --device-name "${GPU_NAME:-unknown}" --json "$OUT/nobubble.jsonl" || status=1
        # the trainer's own summary; "host ms/step" is the synthetic batch generation on the host,
        # overlapped with the step before: when it exceeds the step, it is what bounds nobubble's rate
        grep -E '^(dlrm-dcnv2|memory|throughput|breakdown|host ms/step) ' "$OUT/nb/train.log"
        return 0
    fi
    local why; why=$([ $rc -eq 124 ] && echo "timed out after $t s" || tail -n 1 "$OUT/nb/train.log")
    echo "$impl failed (exit $rc, $lines steps): $why"
    tail -5 "$OUT/nb/train.log"
    cp "$OUT/nb/train.log" "$OUT/nb/train-$(echo "$impl" | tr -c 'a-z0-9\n' '-').log" 2>/dev/null
    nb_record "$impl" "error" "exit $rc after $lines steps: $why"
    status=1
    return 1
}

if [ -x "$NB" ]; then
    echo "== nobubble: the model's exact parameter counts (a 1-step CPU run at cap 1000, with a checkpoint) $(stamp)"
    "$NB" train --model dlrm-dcnv2 --device cpu --data synth --table-cap 1000 --batch 8 --steps 1 --eval-every 0 \
        --eval-samples 16 --out "$TMP/nb-params" --quiet >"$OUT/nb/params.log" 2>&1 \
        || { echo "the parameter-count run failed:"; tail -3 "$OUT/nb/params.log"; status=1; }
    NB_SRC=synth
    if [ "$NB_DATA" = files ]; then
        # the samples the run trains on (day_0: steps x batch, no wrap) and a small held-out day 23
        spec="synth:multi_hot=1,items=1,max_len=0,cap=$cap"
        echo "== synth-dump --format mlperf: $(( batch * (steps + WARM) )) samples of $spec $(stamp)"
        mkdir -p "$TMP/mlperf"
        if "$NB" synth-dump --data "$spec" --format mlperf --samples $(( batch * (steps + WARM) )) --out "$TMP/mlperf/day_0" \
                --quiet >"$OUT/nb/dump.log" 2>&1 \
            && "$NB" synth-dump --data "$spec" --format mlperf --samples 2048 --first 1099511627776 \
                --out "$TMP/mlperf/day_23" --quiet >>"$OUT/nb/dump.log" 2>&1; then
            NB_SRC="mlperf:$TMP/mlperf"
            du -sh "$TMP/mlperf" | awk '{ print "wrote " $1 " of day files" }'
        else
            echo "synth-dump failed (the run makes its samples itself: --data synth):"; tail -3 "$OUT/nb/dump.log"; status=1
        fi
    fi
    echo "== nobubble train --model dlrm-dcnv2 --device $DEVICE --data ${NB_SRC%%:*} ${NB_FLAGS} $(stamp)"
    # shellcheck disable=SC2086
    if ! nb_run "nobubble${NB_FLAGS:+ $NB_FLAGS}" $NB_FLAGS && [[ " $NB_FLAGS " == *" --graphs "* ]]; then
        echo "== nobubble again without --graphs $(stamp)"
        # shellcheck disable=SC2086
        nb_run "nobubble$(echo " $NB_FLAGS " | sed 's/ --graphs / /; s/ *$//')" $(echo " $NB_FLAGS " | sed 's/ --graphs / /')
    fi
else
    echo "no $NB: the nobubble rows cannot run"
    nb_record "nobubble" "error" "no $NB (build failed?)"
    status=1
fi

echo "== parameters: nobubble and PyTorch $(stamp)"
pargs=(--params --table-cap "$cap" --batch "$batch" --json "$OUT/params.json")
[ -f "$TMP/nb-params/ckpt/model.safetensors" ] && pargs+=(--nb-ckpt "$TMP/nb-params" --nb-ckpt-cap 1000)
[ -f "$OUT/nb/train.log" ] && pargs+=(--nb-log "$OUT/nb/train.log")
"$PY" bench/dlrm_torch.py "${pargs[@]}" || { echo "the two sides do not build the same model: the ratios are suspect"; status=1; }

if [ $torch_ok = 1 ]; then
    echo "== pytorch: the model against the float64 twin (tests/torch/ref/dlrm_tiny.safetensors, CPU) $(stamp)"
    "$PY" bench/dlrm_torch.py --check-ref 2>&1 | tee "$OUT/torch.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "the PyTorch model does not match the twin: its numbers are suspect"; status=1; }
    echo "== pytorch ($MODES) $(stamp)"
    "$PY" bench/dlrm_torch.py --device "$DEVICE" --dtype "$DTYPE" --batch "$batch" --table-cap "$cap" --steps "$steps" \
        --warmup $WARM --mode "$MODES" --json "$OUT/torch.jsonl" --deadline $(( start + budget )) 2>&1 | tee -a "$OUT/torch.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
else
    for m in ${MODES//,/ }; do
        "$PY" -c 'import json, sys
print(json.dumps(dict(engine="pytorch", impl="torch-" + sys.argv[1], batch=int(sys.argv[2]), status="skipped: " + sys.argv[3])))' \
            "$m" "$batch" "$torch_why" >>"$OUT/torch.jsonl"
    done
fi

echo "== table $(stamp)"
"$PY" bench/dlrm_torch.py --table "$OUT/nobubble.jsonl" "$OUT/torch.jsonl" --params-json "$OUT/params.json" | tee "$OUT/table.md"
# the device tool brings back at most 8 files: the logs beside the results go into one archive
logs=()
for f in build.log nb/dump.log nb/params.log nb/train-*.log; do [ -f "$OUT/$f" ] && logs+=("$f"); done
if [ ${#logs[@]} -gt 0 ] && tar czf "$OUT/logs.tgz" -C "$OUT" "${logs[@]}"; then
    (cd "$OUT" && rm -f "${logs[@]}")
fi
echo "done in $(( $(date +%s) - start )) s; results in $OUT (table.md, nobubble.jsonl, torch.jsonl, torch.log, params.json, nb/train.log, nb/metrics.jsonl, logs.tgz)"
exit $status
