#!/usr/bin/env bash
# Resident (plain) vs --schedule stream on one GPU (issue 6), same model, batch and tokens:
#   bash bench/stream_bench.sh [--models llama-1b,llama-8b] [--batch B] [--seq T] [--steps S] [--no-build]
#                              [--stream-only] [--layers N] [--parts] [--clip0] [--anchor] [--anchor-only]
#                              [--anchor-steps S] [--anchor-warmup W] [--budget S]
# --stream-only: no resident (plain) run (models whose state does not fit the GPU). --layers N: the
# preset's shape with N layers, in every run (e.g. llama-8b's layers, few enough to run resident). --parts: after
# the stream run, the effect of each part: --ckpt-interval 2, 4, 8, one device slot (no double
# buffering), one and four pinned slabs, --grad-clip 0 (AdamW during the backward), a weight slot
# per layer (--stream-slots -1) and layers on the GPU (--gpu-layers -1). --clip0: a
# stream row with --grad-clip 0 and, with --anchor, an FSDP2 row with --grad-clip 0 to divide it by.
# $NB_ARGS is added to every nobubble run's command line, $STREAM_ARGS to the stream runs' (e.g.
# STREAM_ARGS="--stream-slots -1 --gpu-layers -1"), both to their rows' labels.
# tokens/s from the trainer's p90/median summary line; TFLOP/s with model FLOPs = the trainer's
# "MFLOP per token" (6 N + attention) x tokens/s. Also writes one step's trace and timeline.svg of
# each stream run to $OUT (default bench/out/stream) and checks the overlap in the trace
# (tests/trace_overlap.py). Stream runs use --ckpt-interval $CKPT (default 1; a list like 0,1 adds a
# row "stream K=k" for each further value) and, where K > 0, --keep-layers $KEEP if set (-1: as
# many layers kept whole as fit on the GPU).
# --anchor: after nobubble's runs, PyTorch FSDP2 with CPU offload (bench/fsdp_offload.py with
#   $PYTHON, default python3) on each model, same batch and seq, --anchor-steps timed steps (6) after
#   --anchor-warmup (2); a row "fsdp2 cpu-offload" per model with stream / fsdp2 tokens/s. $FSDP_ARGS
#   is added to its command line (e.g. FSDP_ARGS="--adamw fused"). Slow: ~2 s/step for llama-1b,
#   ~12 s for llama-8b at 8 x 2048. --anchor-only: the anchor alone (no build, no nobubble run);
#   the ratio then reads $OUT/<model>-stream.log of an earlier run if there is one.
# --budget S: no anchor step starts that would end more than S seconds after this script started.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
models=llama-1b,llama-8b batch=8 seq=2048 steps=12 build=1 anchor=0 nbruns=1 asteps=6 awarm=2 budget=0 scheds='plain stream' parts=0 clip0=0 layers=''
while [ $# -gt 0 ]; do
    case "$1" in
        --models) models=$2; shift ;;
        --batch) batch=$2; shift ;;
        --seq) seq=$2; shift ;;
        --steps) steps=$2; shift ;;
        --no-build) build=0 ;;
        --stream-only) scheds=stream ;;
        --layers) layers=$2; shift ;;
        --parts) parts=1 ;;
        --clip0) clip0=1 ;;
        --anchor) anchor=1 ;;
        --anchor-only) anchor=1 nbruns=0 build=0 ;;
        --anchor-steps) asteps=$2; shift ;;
        --anchor-warmup) awarm=$2; shift ;;
        --budget) budget=$2; shift ;;
        -h|--help) sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "stream_bench.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
case "$budget" in ''|*[!0-9]*) echo "stream_bench.sh: --budget takes whole seconds, got '$budget'" >&2; exit 2 ;; esac
start=$(date +%s)
lflag=(); lsuf=''
[ -n "$layers" ] && { lflag=(--layers "$layers"); lsuf=" ($layers layers)"; }
export LSUF=$lsuf
OUT=${OUT:-bench/out/stream}; mkdir -p "$OUT"
NB_BUILD=${NB_BUILD:-build}; NB=$NB_BUILD/nobubble
PY=${PYTHON:-python3}
[ $build = 1 ] && { source scripts/device_deps.sh use >/dev/null; make -j"$(nproc)" BUILD="$NB_BUILD" ${NB_MAKE_FLAGS:-} > "$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }; }
[ $nbruns = 0 ] || [ -f data/sotu/train.bin ] || { echo "stream_bench.sh: run 'bash scripts/fetch_data.sh' first" >&2; exit 1; }
table="$OUT/table.md"
printf '| model | B x T | schedule | median tokens/s | p90 tokens/s | model TFLOP/s | hardware TFLOP/s | stream / resident | stream / fsdp2 |\n|---|---|---|---|---|---|---|---|---|\n' > "$table"
declare -A smed smed0   # stream median tokens/s per model (with and without clipping), for the fsdp2 rows

nb_row() {   # MODEL TAG LABEL [RC]: one table row from the trainer's log; sets med
    local log="$OUT/$1-$2.log" line mf hf p90 tf htf ratio kept
    med=""
    line=$( [ "${4:-0}" = 0 ] && grep '^throughput' "$log" 2>/dev/null) || { echo "| $1 | ${batch} x ${seq} | $3 | failed: $(tail -n 1 "$log" 2>/dev/null | tr '|' '/') | | | | | |" >> "$table"; return 1; }
    mf=$(grep '^parameters' "$log" | grep -o '[0-9.]* MFLOP per token' | cut -d' ' -f1)
    p90=$(echo "$line" | awk '{print $3}'); med=$(echo "$line" | awk '{for (i=1;i<=NF;i++) if ($i=="median") print $(i+1)}')
    hf=$(grep -o 'hardware [0-9.]* MFLOP per token' "$log" | awk '{print $2}'); hf=${hf:-$mf}
    tf=$(awk -v t="$med" -v f="$mf" 'BEGIN {printf "%.0f", t * f / 1e6}')
    htf=$(awk -v t="$med" -v f="$hf" 'BEGIN {printf "%.0f", t * f / 1e6}')
    [ "$2" = plain ] && res=$med
    ratio=$( [ -n "$res" ] && awk -v a="$med" -v b="$res" 'BEGIN {printf "%.2f", a / b}' || echo -)
    kept=$(grep -o '[0-9]* layers\{0,1\} kept whole\|all kept (--keep-layers' "$log" | head -n 1 | sed 's/ (--keep-layers//')
    local sargs=''; [ "$2" != plain ] && sargs=${STREAM_ARGS:-}
    echo "| $1$lsuf | ${batch} x ${seq} | $3${NB_ARGS:+ $NB_ARGS}${sargs:+ $sargs}${kept:+ ($kept)} | $med | $p90 | $tf | $htf | $ratio | |" >> "$table"
}

# a stuck lane fails the run with a report of every lane instead of hanging it
export NB_LANES_TIMEOUT=${NB_LANES_TIMEOUT:-300}
ks=${CKPT:-1}; k1=${ks%%,*}
kflags() { # --ckpt-interval K, and --keep-layers $KEEP where it applies (K > 0), and $STREAM_ARGS
    echo "--ckpt-interval $1$( [ "$1" != 0 ] && [ -n "${KEEP:-}" ] && echo " --keep-layers $KEEP") ${STREAM_ARGS:-}"
}
variants() {   # the runs of one model: name|schedule|flags
    for sc in $scheds; do
        [ "$sc" = plain ] && echo "plain|plain|"
        [ "$sc" = stream ] && echo "stream|stream|$(kflags "$k1")"
    done
    if [ "$scheds" != plain ]; then   # more values of $CKPT: a row each
        for k in $(echo "${ks#"$k1"}" | tr , " "); do [ -n "$k" ] && echo "stream K=$k|stream|$(kflags "$k")"; done
    fi
    [ $parts = 1 ] && printf '%s\n' "stream K=2|stream|$(kflags 2)" "stream K=4|stream|$(kflags 4)" \
        "stream K=8|stream|$(kflags 8)" "stream, 1 device slot|stream|$(kflags "$k1") --stream-slots 1" \
        "stream, 1 pinned slab|stream|$(kflags "$k1") --pinned-slabs 1" \
        "stream, 4 pinned slabs|stream|$(kflags "$k1") --pinned-slabs 4" \
        "stream, --grad-clip 0|stream|$(kflags "$k1") --grad-clip 0" \
        "stream, a weight slot per layer|stream|$(kflags "$k1") --stream-slots -1" \
        "stream, layers on the GPU|stream|$(kflags "$k1") --gpu-layers -1"
    [ $parts = 0 ] && [ $clip0 = 1 ] && echo "stream, --grad-clip 0|stream|$(kflags "$k1") --grad-clip 0"
}
keep_median() {   # MODEL TAG: the medians the fsdp2 rows are divided by
    [ "$2" = stream ] && smed[$1]=$med
    [ "$2" = stream_--grad-clip_0 ] && smed0[$1]=$med
    return 0
}
for model in ${models//,/ }; do
    res=""
    while IFS='|' read -r label sched flags; do
        tag=$(echo "$label" | tr -c 'a-zA-Z0-9=\n-' '_' | tr -s _); tag=${tag%_}
        log="$OUT/$model-$tag.log"
        if [ $nbruns = 0 ]; then   # --anchor-only: rows of an earlier run's logs, if any
            [ -f "$log" ] && nb_row "$model" "$tag" "$label (earlier log)" && keep_median "$model" "$tag"
            continue
        fi
        extra=(); [ "$tag" = stream ] && extra=(--trace "$OUT/$model-stream.json")
        echo "== $model $label [$(( $(date +%s) - start )) s]"
        # shellcheck disable=SC2086  # flags is a list of options
        "$NB" train --model "$model" "${lflag[@]}" --device "${DEVICE:-cuda}" --batch "$batch" --seq "$seq" --steps "$steps" --schedule "$sched" $flags ${NB_ARGS:-} \
            --val-data none --eval-every 0 --no-ckpt --no-progress --out "$OUT/$model-$tag" "${extra[@]}" > "$log" 2>&1
        nb_row "$model" "$tag" "$label" $? || continue
        grep -E '^(stream|memory|gpu memory|pcie) ' "$log" | sed "s/^/  [$model $label] /"
        keep_median "$model" "$tag"
        if [ "$tag" = stream ]; then
            cp "$OUT/$model-stream/timeline.svg" "$OUT/timeline-$model-stream.svg" 2>/dev/null
            python3 tests/trace_overlap.py "$OUT/$model-stream.json" $((steps - 1)) | sed "s/^/  [$model] /"
        fi
    done < <(variants)
done

# PyTorch FSDP2 + CPU offload on the same shapes (bench/fsdp_offload.py), after all nobubble runs
anchor_row() {   # MODEL TAG LABEL STREAM_MEDIAN [FLAGS...]: one FSDP2 run and its table row
    local model=$1 tag=$2 label=$3 sm=$4; shift 4
    local alog="$OUT/$model-$tag.log" ajson="$OUT/$model-$tag.jsonl" arc
    rm -f "$ajson"
    echo "== $label: $model B=$batch T=$seq, $awarm + $asteps steps [$(( $(date +%s) - start )) s]"
    # shellcheck disable=SC2086  # FSDP_ARGS is a list of flags
    "$PY" bench/fsdp_offload.py --model "$model" "${lflag[@]}" --batch "$batch" --seq "$seq" --steps "$asteps" --warmup "$awarm" \
        --json "$ajson" "${deadline[@]}" ${FSDP_ARGS:-} "$@" > "$alog" 2>&1
    arc=$?
    grep '^fsdp2-cpu-offload' "$alog" | tail -n 1 | sed 's/^/  /'
    ALABEL=$label "$PY" - "$model" "$ajson" "$alog" "$arc" "$sm" "$batch" "$seq" >> "$table" <<'PYEOF'
import json, math, os, sys
model, path, log, rc, smed, B, T = sys.argv[1:8]
B, T = int(B), int(T)
head = f"| {model}{os.environ.get('LSUF', '')} | {B} x {T} | {os.environ['ALABEL']}"
clean = lambda s: str(s).replace("|", "/").replace("\n", " ")[:160]
rec = None
try:
    with open(path) as f:
        lines = [l for l in f if l.strip()]
    rec = json.loads(lines[-1]) if lines else None
except (OSError, ValueError):
    pass
if rec is None:   # no result line: killed (the OOM killer: exit 137) or crashed before writing it
    try:
        with open(log) as f:
            tail = f.read().strip().splitlines()[-1]
    except (OSError, IndexError):
        tail = ""
    why = "killed (host out of memory?)" if rc == "137" else f"failed (exit {rc})"
    print(f"{head} | {why}: {clean(tail)} | | | | | |")
elif rec.get("status") not in ("ok", "nonfinite loss"):
    print(f"{head} | {clean(rec.get('status'))}" + (f": {clean(rec['error'])}" if rec.get("error") else "") + " | | | | | |")
else:
    # the trainer's rules (print_p90, src/run/run.c): sorted step times t, median t[n/2],
    # p90 t[ceil(0.9 n) - 1]; FLOPs per token: the same formula as the trainer's
    t = sorted(rec["step_ms"])
    n = len(t)
    tps, tp90 = B * T / (t[n // 2] / 1e3), B * T / (t[math.ceil(0.9 * n) - 1] / 1e3)
    ratio = f"{float(smed) / tps:.2f}" if smed else "-"
    note = "" if rec["status"] == "ok" else " (nonfinite loss)"
    if rec.get("stopped_early"):
        note += f" ({n} of {rec['steps_planned']} steps: --budget)"
    # hardware FLOPs: activation checkpointing runs every layer's forward again, i.e. a third of
    # the layers' share of the model FLOPs (all but the head's 6 V C)
    f = rec["flops_per_token"]
    head_f = 6 * rec["shape"]["vocab"] * rec["shape"]["dim"]
    hw = f + ((f - head_f) / 3 if rec.get("act_ckpt") else 0)
    print(f"{head}{note} | {tps:.0f} | {tp90:.0f} | {tps * f / 1e12:.0f} | {tps * hw / 1e12:.0f} | | {ratio} |")
PYEOF
}
if [ $anchor = 1 ]; then
    deadline=(); [ "$budget" -gt 0 ] && deadline=(--deadline $((start + budget)))
    for model in ${models//,/ }; do
        anchor_row "$model" fsdp2 "fsdp2 cpu-offload${FSDP_ARGS:+ $FSDP_ARGS}" "${smed[$model]:-}"
        [ $clip0 = 1 ] && anchor_row "$model" fsdp2-clip0 "fsdp2 cpu-offload, --grad-clip 0" "${smed0[$model]:-}" --grad-clip 0
    done
fi
echo; cat "$table"
