#!/usr/bin/env bash
# CPU training throughput of the presets a CPU user runs, nobubble beside PyTorch on the same cores.
#   bash bench/cpu_train.sh [--steps N] [--rounds R] [--no-anchor] [--presets "gpt2-mini gpt2-proxy"]
# For each preset (batch 8, the preset's sequence length) and each of R rounds (default 2): nobubble
# trains N steps (default 20) on the default corpus, then PyTorch (bench/torch_anchor.py --device cpu:
# the same GPT-2 shape written nanoGPT-style, fp32, AdamW foreach, every core) trains N steps on
# random tokens. Each side's number is the median tokens/s over its steps after the warm-up, and the
# best of its rounds: alternating the two sides and keeping each one's best round is what makes a
# ratio on a shared VM (its speed moves by +-20% between runs) mean something.
# The anchor is Debian's python3-torch (1.13: eager only, no torch.compile on the CPU); the script
# installs it when it is missing and this is root, as scripts/setup.sh installs the rest.
# llama-tiny has no anchor here: torch_anchor.py's Llama is Hugging Face's, and Debian does not
# package transformers. GFLOP/s: model FLOPs (6 N + attention, the formula in src/model/transformer.c).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
STEPS=20 ROUNDS=2 ANCHOR=1 PRESETS="gpt2-mini gpt2-tiny gpt2-proxy llama-tiny" BATCH=8
while [ $# -gt 0 ]; do
    case "$1" in
        --steps) STEPS=$2; shift 2 ;;
        --rounds) ROUNDS=$2; shift 2 ;;
        --no-anchor) ANCHOR=0; shift ;;
        --presets) PRESETS=$2; shift 2 ;;
        [0-9]*) STEPS=$1; shift ;; # the old positional STEPS
        -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
        *) echo "cpu_train.sh: unknown option '$1' (try --help)" >&2; exit 2 ;;
    esac
done
[ "$STEPS" -ge 8 ] || { echo "cpu_train.sh: --steps must be at least 8 (the first 5 are warm-up)" >&2; exit 2; }
NB_BUILD=${NB_BUILD:-build}
make -s -j"$(nproc)" BUILD="$NB_BUILD" "$NB_BUILD/nobubble" >/dev/null
[ -f data/sotu/train.bin ] || bash scripts/fetch_data.sh >/dev/null
NB=$NB_BUILD/nobubble
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT

PY=""
if [ "$ANCHOR" = 1 ]; then
    for p in python3 /usr/bin/python3; do
        if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import torch' 2>/dev/null; then PY=$p; break; fi
    done
    if [ -z "$PY" ] && [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "cpu_train.sh: installing Debian's python3-torch for the anchor" >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-torch >/dev/null
        /usr/bin/python3 -c 'import torch' && PY=/usr/bin/python3
    fi
    [ -n "$PY" ] || { echo "cpu_train.sh: no python3 with torch (apt-get install python3-torch, or --no-anchor)" >&2; exit 1; }
fi

median_tps() { # metrics.jsonl: median tokens/s over the steps after the first 5
    tail -n +6 "$1" | grep -o '"tokens_per_s":[0-9.]*' | cut -d: -f2 | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'
}
best() { awk -v a="$1" -v b="$2" 'BEGIN {print (b == "" || a + 0 > b + 0) ? a : b}'; }

printf '%-11s %5s %5s %9s %14s %14s %7s\n' preset batch seq GFLOP/s "nobubble tok/s" "PyTorch tok/s" ratio
for preset in $PRESETS; do
    nb_best="" pt_best="" mflop="" seq=""
    for ((r = 1; r <= ROUNDS; r++)); do
        $NB train --model "$preset" --batch $BATCH --steps "$STEPS" --val-data none --out "$TMP/$preset" \
            --no-progress --quiet >/dev/null 2>"$TMP/$preset.err" || { cat "$TMP/$preset.err"; exit 1; }
        nb_best=$(best "$(median_tps "$TMP/$preset/metrics.jsonl")" "$nb_best")
        seq=$(grep -o '"seq": [0-9]*' "$TMP/$preset/ckpt/state.json" | head -1 | grep -o '[0-9]*$')
        rm -rf "$TMP/$preset"
        if [ -n "$PY" ] && [ "$preset" != llama-tiny ]; then
            "$PY" bench/torch_anchor.py --device cpu --model "$preset" --batch $BATCH --seq "$seq" --mode eager \
                --steps $((STEPS - 5)) --warmup 5 --json "$TMP/pt.jsonl" >"$TMP/pt.log" 2>&1 || { cat "$TMP/pt.log"; exit 1; }
            pt=$(tail -1 "$TMP/pt.jsonl" | grep -o '"tokens_per_s": [0-9.]*' | grep -o '[0-9.]*$')
            pt_best=$(best "$pt" "$pt_best")
        fi
    done
    mflop=$($NB train --model "$preset" --batch 1 --steps 1 --val-data none --no-progress --out "$TMP/f" 2>&1 |
            grep -o '[0-9.]* MFLOP per token' | cut -d' ' -f1)
    rm -rf "$TMP/f"
    awk -v p="$preset" -v b=$BATCH -v t="$seq" -v nb="$nb_best" -v pt="$pt_best" -v mf="$mflop" 'BEGIN {
        printf "%-11s %5d %5d %9.1f %14.0f %14s %7s\n", p, b, t, nb * mf / 1e3, nb,
               pt == "" ? "-" : sprintf("%.0f", pt), pt == "" ? "-" : sprintf("%.2fx", nb / pt) }'
done
echo "host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(date -u +%Y-%m-%d)," \
     "commit $(git rev-parse --short HEAD 2>/dev/null || echo none); steps $STEPS, best of $ROUNDS rounds;" \
     "${PY:+PyTorch $("$PY" -c 'import torch; print(torch.__version__)') eager fp32}"
