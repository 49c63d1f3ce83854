#!/usr/bin/env bash
# Before/after, same bits: trains one matrix of small runs (every model family x every schedule
# and option that changes how a step runs, 1 and 2 CPU ranks, a resume per family) with two
# builds of nobubble, a base commit and the working tree, and compares what they wrote:
#   ckpt/*        every checkpoint file (weights, optimizer state, table shards) byte for byte;
#                 state.json as parsed JSON (a key in one only is a difference)
#   metrics.jsonl line by line, less the fields that measure time (ms, *_per_s, bubble_pct, ...:
#                 the list is TIMING in tests/parity_compare.py)
# and not stdout / stderr. A restructuring must print `same` on every row.
#
#   bash tests/parity_across_commits.sh [options]
#     --base REV         the commit before the work [ae09253]; built from `git archive` in
#                        build-parity/src-SHA into build-parity/base-SHA-DEVICE (kept: built once)
#     --base-src DIR     build the base from this source tree instead (no git needed: the GPU
#                        machine; make it with `git archive REV | tar -x -C DIR`)
#     --base-bin PATH    a prebuilt base binary (or the build folder holding `nobubble`)
#     --new-bin PATH     a prebuilt new binary [the working tree, built into build-parity/new-DEVICE]
#     --device cpu|cuda  cpu: the CPU matrix; cuda: the GPU matrix (gpt2-tiny, llama-tiny, seqctr;
#                        plain, erase with graphs, stream, pipe; default precision) [cpu]
#     --only PATTERN     only the rows whose name matches the extended regex PATTERN
#     --keep DIR         write the run directories under DIR [a new folder in $TMPDIR or /tmp]
#     --mpirun PATH      the mpirun of the 2-rank rows [command -v mpirun; without one they skip]
#     --threads N        CPU threads of every CPU run [1: what mpirun's core binding gives too]
#     --jobs N           make -j N for the builds [2]
#     --together         run a row's base and new runs at the same time (faster on an idle machine)
#     --prune            remove the run directories of the rows that are the same (logs stay)
#     --state-ignore K,..  leave these dotted state.json keys (e.g. train.attn) out: an option the
#                        new commit adds on purpose; the summary names them
#     --designed         leave out what the work since ae09253 changed on purpose without touching the
#                        computation: state.json keys it added (fingerprint, train.schema,
#                        train.threads), the checkpoint files' fingerprint and model metadata,
#                        metrics.jsonl's steps counted from 1, and --micro-batches recorded as its
#                        own key (parity_compare.py's --meta-ignore, --step-offset 1,
#                        --fold-micro-batches); the summary names them
#     --new-extra FLAGS  append FLAGS to the new binary's runs, not to a resume (a self-test of the
#                        comparison: "--seed 8" must differ)
#     --list             print the rows and exit
# Prints `same  NAME` or `DIFF  NAME: what differs` per row (FAIL: both runs failed; skip: no
# mpirun or no data), then a summary; exits 1 on any DIFF or FAIL. Each run's directory and log
# are in WORK/base/NAME{,.log} and WORK/new/NAME{,.log}. Not a *_test.sh: tests/run.sh and CI do
# not run it (it builds a second tree). The CPU matrix takes ~5 minutes on 2 cores plus the base
# build (~2 minutes without CUDA, once).
#
# Examples: bash tests/parity_across_commits.sh                      (ae09253 vs the working tree)
#           bash tests/parity_across_commits.sh --only 'pipe|sc-np2'
#   On the GPU machine (no git history there: carry the base's source tree and the data):
#           git archive ae09253 -- . ':(exclude)bench/results' | (mkdir -p build-parity/src-base &&
#               tar -x -C build-parity/src-base)                                   (here, once)
#           bash tests/parity_across_commits.sh --device cuda --base-src build-parity/src-base \
#               --jobs 16 --together                        (there, carrying build-parity/src-base and data)
#   or with binaries built already: --base-bin DIR_OR_BINARY --new-bin build
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CRITEO_TSV=$(ls "$ROOT"/../shared/data/ctr_samples/criteo_kaggle_200.tsv "$ROOT"/shared/data/ctr_samples/criteo_kaggle_200.tsv 2>/dev/null | head -n 1)

# The runs' shared flags per data set ("DATA" column); the device's flags are added after them.
# seqctr rows pin --warmup 0: its default became 30 (issue 36, 6), a recipe change, not a schedule's.
# $TRAIN, $VAL and $CRITEO_TSV are expanded when a row runs.
common_args() {
    case $1 in
        tf) echo "--batch 2 --steps 6 --data $TRAIN --val-data $VAL --eval-every 3 --eval-batches 2 --ckpt-every 3 --seed 7" ;;
        sc) echo "--model seqctr --warmup 0 --data synth:cap=1000,items=2000,calib=16384,max_len=16 --emb-dim 16 --blocks 3
                  --cross-rank 32 --block-hidden 64 --batch 64 --steps 8 --eval-every 4 --eval-samples 512 --ckpt-every 4 --seed 4" ;;
        scbal) echo "--model seqctr --warmup 0 --data synth:cap=1000,items=2000,calib=16384,max_len=256,hist_alpha=1.0,hist_scale=16
                  --emb-dim 16 --blocks 2 --cross-rank 16 --block-hidden 32 --batch 64 --steps 8 --eval-every 4 --eval-samples 256
                  --ckpt-every 4 --seed 3" ;;
        criteo) echo "--model seqctr --warmup 0 --data criteo:$CRITEO_TSV --emb-dim 16 --blocks 2 --cross-rank 32 --block-hidden 64
                  --batch 32 --steps 8 --eval-every 4 --eval-samples 50 --table-cap 1000 --ckpt-every 4 --seed 5" ;;
        movielens) echo "--model seqctr --warmup 0 --data movielens --max-len 32 --table-cap 200000 --emb-dim 16 --blocks 2 --cross-rank 32
                  --block-hidden 64 --batch 64 --steps 6 --eval-every 3 --eval-samples 2048 --ckpt-every 3 --seed 6" ;;
        dlrm) echo "--model dlrm-dcnv2 --data synth:calib=16384 --table-cap 1000 --emb-dim 16 --cross-rank 32 --top-mlp 64,32
                  --batch 64 --steps 8 --eval-every 4 --eval-samples 512 --ckpt-every 4 --seed 8" ;;
    esac
}

# NAME | RANKS | DATA | STOP (stop after this step, then --resume to the end) | FLAGS of the row
CPU_ROWS=(
    # transformers: plain, ERASE (detached segments; blocking and async dispatch, graphs), stream
    # (recompute, slots, pinned slabs, device layers, no clipping), grad-accum, graphs, ranks
    "gpt2-plain|1|tf||--model gpt2-tiny"
    "llama-plain|1|tf||--model llama-tiny"
    "gpt2-graphs|1|tf||--model gpt2-tiny --graphs"
    "gpt2-accum2|1|tf||--model gpt2-tiny --grad-accum 2 --batch 4"
    "gpt2-comm-mpi|1|tf||--model gpt2-tiny --comm mpi"
    "gpt2-threads2|1|tf||--model gpt2-tiny --threads 2"
    "gpt2-detach-plain|1|tf||--model gpt2-tiny --layers 4 --detach 1,3"
    "gpt2-erase-blocking|1|tf||--model gpt2-tiny --layers 4 --detach 1,3 --schedule erase --erase-dispatch blocking --side-lanes 2"
    "gpt2-erase-async|1|tf||--model gpt2-tiny --layers 4 --detach 1,3 --schedule erase --erase-dispatch async --side-lanes 1"
    "gpt2-erase-graphs|1|tf||--model gpt2-tiny --layers 4 --detach 2 --graphs --schedule erase --erase-dispatch blocking"
    "gpt2-erase-nodetach|1|tf||--model gpt2-tiny --schedule erase"
    "llama-erase-async|1|tf||--model llama-tiny --detach 1 --schedule erase --erase-dispatch async"
    "gpt2-stream|1|tf||--model gpt2-tiny --schedule stream"
    "gpt2-stream-recompute|1|tf||--model gpt2-tiny --layers 5 --schedule stream --ckpt-interval 2 --keep-layers 1"
    "gpt2-stream-1slot|1|tf||--model gpt2-tiny --layers 5 --schedule stream --ckpt-interval 2 --stream-slots 1 --pinned-slabs 1"
    "gpt2-stream-allslots|1|tf||--model gpt2-tiny --layers 5 --schedule stream --ckpt-interval 3 --stream-slots -1"
    "gpt2-stream-gpulayers|1|tf||--model gpt2-tiny --layers 4 --schedule stream --ckpt-interval 2 --gpu-layers 2"
    "gpt2-stream-noclip|1|tf||--model gpt2-tiny --layers 4 --grad-clip 0 --schedule stream --gpu-layers 2"
    "llama-stream|1|tf||--model llama-tiny --schedule stream --ckpt-interval 1"
    "llama-stream-gpulayers|1|tf||--model llama-tiny --schedule stream --gpu-layers 1"
    "gpt2-stream-threads2|1|tf||--model gpt2-tiny --schedule stream --ckpt-interval 1 --threads 2"
    "gpt2-np2|2|tf||--model gpt2-tiny"
    "llama-np2-accum2|2|tf||--model llama-tiny --grad-accum 2 --batch 4"
    "gpt2-np2-erase|2|tf||--model gpt2-tiny --layers 4 --detach 1,3 --schedule erase"
    "gpt2-np2-graphs|2|tf||--model gpt2-tiny --graphs"
    "gpt2-resume|1|tf|3|--model gpt2-tiny"
    "gpt2-stream-resume|1|tf|3|--model gpt2-tiny --layers 4 --schedule stream --gpu-layers 4"
    "gpt2-np2-resume|2|tf|3|--model gpt2-tiny"
    # seqctr: plain, ERASE, the sharded tables (sparse-dist), NestPipe (pipe; FWP: micro-batches,
    # cluster keys), FreeScale (balance fbs / vbs, emulated ranks, host placement, priority rows)
    "sc-plain|1|sc||"
    "sc-adam|1|sc||--emb-optim adam"
    "sc-graphs|1|sc||--graphs"
    "sc-accum2|1|sc||--grad-accum 2"
    "sc-threads2|1|sc||--threads 2"
    "sc-detach-plain|1|sc||--detach all"
    "sc-erase-blocking|1|sc||--detach all --schedule erase --erase-dispatch blocking --side-lanes 4"
    "sc-erase-async|1|sc||--detach 2 --schedule erase --erase-dispatch async --side-lanes 2"
    "sc-erase-graphs-adam|1|sc||--detach all --emb-optim adam --graphs --schedule erase"
    "sc-row|1|sc||--emb-shard row"
    "sc-row-host|1|sc||--emb-shard row --emb-place host"
    "sc-row-mb2|1|sc||--emb-shard row --micro-batches 2"
    "sc-sparse-dist|1|sc||--emb-shard row --schedule sparse-dist"
    "sc-pipe|1|sc||--emb-shard row --schedule pipe"
    "sc-pipe-graphs|1|sc||--emb-shard row --schedule pipe --graphs"
    "sc-pipe-adam|1|sc||--emb-shard row --schedule pipe --emb-optim adam"
    "sc-pipe-mb2|1|sc||--emb-shard row --schedule pipe --micro-batches 2"
    "sc-pipe-mb2-cluster|1|sc||--emb-shard row --schedule pipe --micro-batches 2 --cluster-keys"
    "sc-pipe-mb2-graphs|1|sc||--emb-shard row --schedule pipe --micro-batches 2 --graphs --graph-cache 1"
    "sc-pipe-host|1|sc||--emb-shard row --schedule pipe --emb-place host"
    "sc-pipe-prio|1|sc||--emb-shard row --schedule pipe --emb-priority"
    "sc-pipe-threads2|1|sc||--emb-shard row --schedule pipe --micro-batches 2 --threads 2"
    "sc-emulate|1|scbal||--emulate-ranks 2"
    "sc-emulate-fbs|1|scbal||--emulate-ranks 2 --balance fbs"
    "sc-emulate-vbs|1|scbal||--emulate-ranks 2 --balance vbs"
    "sc-np2|2|sc||"
    "sc-np2-adam|2|sc||--emb-optim adam"
    "sc-np2-graphs|2|sc||--graphs"
    "sc-np2-erase|2|sc||--detach 2 --aux-weight 0.5 --schedule erase"
    "sc-np2-sparse-dist|2|sc||--schedule sparse-dist"
    "sc-np2-pipe|2|sc||--schedule pipe"
    "sc-np2-pipe-mb2|2|sc||--schedule pipe --micro-batches 2"
    "sc-np2-pipe-mb2-cluster|2|sc||--schedule pipe --micro-batches 2 --cluster-keys"
    "sc-np2-pipe-prio-host|2|sc||--schedule pipe --emb-priority --emb-place host"
    "sc-np2-pipe-prio-mb2|2|sc||--schedule pipe --emb-priority --micro-batches 2"
    "sc-np2-fbs|2|scbal||--balance fbs"
    "sc-np2-vbs|2|scbal||--balance vbs"
    "sc-np2-vbs-mb2|2|scbal||--balance vbs --micro-batches 2"
    "sc-resume|1|sc|4|"
    "sc-pipe-resume|1|sc|4|--emb-shard row --schedule pipe"
    "sc-np2-pipe-resume|2|sc|4|--schedule pipe"
    "sc-np2-vbs-resume|2|scbal|4|--balance vbs --micro-batches 2"
    "sc-criteo|1|criteo||"
    "sc-movielens|1|movielens||"
    # dlrm-dcnv2 (seqctr's DLRM form: multi-hot columns, crosses, top MLP, Adagrad)
    "dlrm-plain|1|dlrm||"
    "dlrm-graphs|1|dlrm||--graphs"
    "dlrm-host|1|dlrm||--emb-place host"
    "dlrm-row|1|dlrm||--emb-shard row"
    "dlrm-pipe|1|dlrm||--emb-shard row --schedule pipe"
    "dlrm-resume|1|dlrm|4|"
)

CUDA_ROWS=(
    "gpt2-plain|1|tf||--model gpt2-tiny"
    "gpt2-graphs|1|tf||--model gpt2-tiny --graphs"
    "gpt2-fp32|1|tf||--model gpt2-tiny --precision fp32"
    "gpt2-erase-graphs|1|tf||--model gpt2-tiny --layers 4 --detach 1,3 --schedule erase --graphs"
    "gpt2-erase-async|1|tf||--model gpt2-tiny --layers 4 --detach 1,3 --schedule erase --erase-dispatch async"
    "gpt2-stream|1|tf||--model gpt2-tiny --schedule stream"
    "gpt2-stream-recompute|1|tf||--model gpt2-tiny --layers 4 --schedule stream --ckpt-interval 2 --gpu-layers 1"
    "gpt2-stream-fp32|1|tf||--model gpt2-tiny --schedule stream --precision fp32"
    "gpt2-resume|1|tf|3|--model gpt2-tiny"
    "llama-plain|1|tf||--model llama-tiny"
    "llama-graphs|1|tf||--model llama-tiny --graphs"
    "llama-erase-graphs|1|tf||--model llama-tiny --detach 1 --schedule erase --graphs"
    "llama-stream|1|tf||--model llama-tiny --schedule stream"
    "llama-stream-gpulayers|1|tf||--model llama-tiny --schedule stream --ckpt-interval 1 --gpu-layers 1"
    "sc-plain|1|sc||"
    "sc-fp32|1|sc||--precision fp32"
    "sc-adam|1|sc||--emb-optim adam"
    "sc-graphs|1|sc||--graphs"
    "sc-erase-graphs|1|sc||--detach all --schedule erase --graphs"
    "sc-erase-async|1|sc||--detach 2 --schedule erase --erase-dispatch async"
    "sc-sparse-dist|1|sc||--emb-shard row --schedule sparse-dist"
    "sc-pipe|1|sc||--emb-shard row --schedule pipe"
    "sc-pipe-graphs|1|sc||--emb-shard row --schedule pipe --graphs"
    "sc-pipe-mb2-cluster|1|sc||--emb-shard row --schedule pipe --micro-batches 2 --cluster-keys"
    "sc-pipe-prio-host|1|sc||--emb-shard row --schedule pipe --emb-priority --emb-place host"
    "sc-host-lists|1|sc||--emb-place host --index-lists host"
    "sc-emulate-vbs|1|scbal||--emulate-ranks 2 --balance vbs"
    "sc-resume|1|sc|4|--graphs"
    "sc-pipe-resume|1|sc|4|--emb-shard row --schedule pipe"
    "sc-criteo|1|criteo||"
    "sc-movielens|1|movielens||"
    "dlrm-plain|1|dlrm||"
    "dlrm-fp32|1|dlrm||--precision fp32"
    "dlrm-graphs|1|dlrm||--graphs"
    "dlrm-host-lists|1|dlrm||--emb-place host --index-lists host"
    "dlrm-pipe|1|dlrm||--emb-shard row --schedule pipe"
)

usage() { sed -n '2,/^set -u/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit "${1:-0}"; }
die() { echo "parity: error: $*" >&2; exit 2; }

BASE=ae09253 BASE_SRC= BASE_BIN= NEW_BIN= DEVICE=cpu ONLY= KEEP= MPIRUN=$(command -v mpirun || true) THREADS=1 JOBS=2
STATE_IGNORE= NEW_EXTRA= LIST=0 TOGETHER=0 PRUNE=0 DESIGNED=()
while [ $# -gt 0 ]; do
    case $1 in
        --list) LIST=1; shift; continue ;;
        --together) TOGETHER=1; shift; continue ;;
        --prune) PRUNE=1; shift; continue ;;
        --designed) DESIGNED=(--meta-ignore nobubble.fingerprint,nobubble.model --step-offset 1 --fold-micro-batches)
            STATE_IGNORE=${STATE_IGNORE:+$STATE_IGNORE,}fingerprint,train.schema,train.threads; shift; continue ;;
        -h|--help) usage 0 ;;
        --base|--base-src|--base-bin|--new-bin|--device|--only|--keep|--mpirun|--threads|--jobs|--state-ignore|--new-extra)
            [ $# -ge 2 ] || die "$1 needs a value" ;;
        *) echo "parity: unknown option '$1'" >&2; usage 2 >&2 ;;
    esac
    case $1 in
        --base) BASE=$2 ;;
        --base-src) BASE_SRC=$2 ;;
        --base-bin) BASE_BIN=$2 ;;
        --new-bin) NEW_BIN=$2 ;;
        --device) DEVICE=$2 ;;
        --only) ONLY=$2 ;;
        --keep) KEEP=$2 ;;
        --mpirun) MPIRUN=$2 ;;
        --threads) THREADS=$2 ;;
        --jobs) JOBS=$2 ;;
        --state-ignore) STATE_IGNORE=${STATE_IGNORE:+$STATE_IGNORE,}$2 ;;
        --new-extra) NEW_EXTRA=$2 ;;
    esac
    shift 2
done
case $DEVICE in
    cpu) ROWS=("${CPU_ROWS[@]}"); DEV_ARGS=(--threads "$THREADS"); NB_CUDA=0 ;;
    cuda) ROWS=("${CUDA_ROWS[@]}"); DEV_ARGS=(--device cuda); NB_CUDA=1 ;;
    *) die "--device is cpu or cuda, not '$DEVICE'" ;;
esac
selected=()
dup=$(printf '%s\n' "${ROWS[@]}" | cut -d'|' -f1 | sort | uniq -d | head -n 1)
[ -z "$dup" ] || die "two rows are named '$dup'"
for row in "${ROWS[@]}"; do
    [ -z "$ONLY" ] || echo "${row%%|*}" | grep -Eq -- "$ONLY" && selected+=("$row")
done
[ ${#selected[@]} -gt 0 ] || die "no row matches --only '$ONLY' (--list shows them)"
if [ $LIST = 1 ]; then
    for row in "${selected[@]}"; do IFS='|' read -r n r d s f <<< "$row"; printf '%-26s %s rank(s)  %-9s %s%s\n' "$n" "$r" "$d" "${s:+stop $s + resume  }" "$f"; done
    exit 0
fi

# bin_of PATH: the absolute path of the binary a --*-bin argument names (a build folder means its
# nobubble); empty when there is none
bin_of() { local p=$1; [ -d "$p" ] && p=$p/nobubble; [ -f "$p" ] && [ -x "$p" ] && (cd "$(dirname "$p")" && echo "$PWD/$(basename "$p")"); }
# build SRC_DIR BUILD_DIR: make the nobubble binary of a source tree in its own build folder
build() {
    echo "building $1 into $2 (log: $2.log)"
    mkdir -p "$2"
    make -C "$1" -j"$JOBS" BUILD="$2" NB_CUDA=$NB_CUDA "$2/nobubble" >"$2.log" 2>&1 || { tail -n 20 "$2.log"; die "the build of $1 failed"; }
}
T0=$(date +%s)
PB=$ROOT/build-parity # git-ignored (/build-*/)
if [ -n "$BASE_BIN" ]; then
    b=$(bin_of "$BASE_BIN") || die "no nobubble binary at --base-bin '$BASE_BIN'"
    BASE_BIN=$b; BASE_DESC="$BASE_BIN (prebuilt)"
elif [ -n "$BASE_SRC" ]; then
    BASE_SRC=$(cd "$BASE_SRC" && pwd) || die "no --base-src folder"
    build "$BASE_SRC" "$PB/base-src-$DEVICE"; BASE_BIN=$PB/base-src-$DEVICE/nobubble; BASE_DESC="the tree in $BASE_SRC"
else
    sha=$(git -C "$ROOT" rev-parse --verify --quiet "$BASE^{commit}") || die "no commit '$BASE' here (or pass --base-src / --base-bin)"
    src=$PB/src-${sha:0:12}
    if [ ! -f "$src/Makefile" ]; then
        rm -rf "$src" && mkdir -p "$src" && git -C "$ROOT" archive "$sha" -- . ':(exclude)bench/results' | tar -x -C "$src" \
            || die "cannot extract $BASE into $src"
    fi
    [ -x "$PB/base-${sha:0:12}-$DEVICE/nobubble" ] || build "$src" "$PB/base-${sha:0:12}-$DEVICE"
    BASE_BIN=$PB/base-${sha:0:12}-$DEVICE/nobubble; BASE_DESC="$(git -C "$ROOT" log -1 --format='%h %s' "$sha" | cut -c1-70)"
fi
if [ -n "$NEW_BIN" ]; then
    b=$(bin_of "$NEW_BIN") || die "no nobubble binary at --new-bin '$NEW_BIN'"
    NEW_BIN=$b; NEW_DESC="$NEW_BIN (prebuilt)"
else
    build "$ROOT" "$PB/new-$DEVICE"; NEW_BIN=$PB/new-$DEVICE/nobubble
    NEW_DESC="the working tree $ROOT ($(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo 'no git'))"
fi
T_BUILD=$(( $(date +%s) - T0 ))

# the default corpus (tokenized by the new binary when it has to be fetched)
NB_BUILD=$(dirname "$NEW_BIN") source "$ROOT/tests/lib.sh"
need_sotu
WORK=${KEEP:-$(mktemp -d "${TMPDIR:-/tmp}/nb-parity.XXXXXX")}
mkdir -p "$WORK/base" "$WORK/new" || die "cannot create $WORK"
WORK=$(cd "$WORK" && pwd)
echo "base: $BASE_DESC"
echo "new:  $NEW_DESC${NEW_EXTRA:+, runs with $NEW_EXTRA added}"
echo "device $DEVICE, ${#selected[@]} rows, run directories in $WORK"
[ -n "$STATE_IGNORE" ] && echo "state.json keys left out of the comparison: $STATE_IGNORE"
[ ${#DESIGNED[@]} -gt 0 ] && echo "changes on purpose left out (--designed): ${DESIGNED[*]}"

# train BIN DIR RANKS ARGS...: one run of a row (with mpirun for several ranks), from the repository
# root (--data movielens reads data/movielens there); its output in DIR.log
train() {
    local bin=$1 dir=$2 ranks=$3; shift 3
    local pre=()
    [ "$ranks" -gt 1 ] && pre=("$MPIRUN" -np "$ranks" --oversubscribe --allow-run-as-root)
    (cd "$ROOT" && timeout 900 "${pre[@]}" "$bin" train "$@") >>"$dir.log" 2>&1
}
# run_row BIN DIR RANKS STOP EXTRA ARGS...: the row's run, or its first part and the resume; exit status
run_row() {
    local bin=$1 dir=$2 ranks=$3 stop=$4 extra=$5; shift 5
    rm -rf "$dir" "$dir.log"
    if [ -z "$stop" ]; then
        train "$bin" "$dir" "$ranks" "$@" $extra --out "$dir"
    else
        train "$bin" "$dir" "$ranks" "$@" $extra --stop-after "$stop" --out "$dir" \
            && train "$bin" "$dir" "$ranks" --resume "$dir" --quiet --no-progress "${DEV_ARGS[@]}"
    fi
}
last_error() { grep -m1 'error' "$1" || tail -n 1 "$1"; }

nsame=0 ndiff=0 nfail=0 nskip=0 failed=()
T1=$(date +%s)
for row in "${selected[@]}"; do
    IFS='|' read -r name ranks data stop flags <<< "$row"
    if [ "$ranks" -gt 1 ] && [ -z "$MPIRUN" ]; then echo "skip  $name: no mpirun (--mpirun PATH)"; nskip=$((nskip+1)); continue; fi
    if [ "$data" = criteo ] && [ -z "$CRITEO_TSV" ]; then echo "skip  $name: no shared/data/ctr_samples/criteo_kaggle_200.tsv"; nskip=$((nskip+1)); continue; fi
    if [ "$data" = movielens ] && [ ! -f "$ROOT/data/movielens/clicks_test.tsv" ]; then
        echo "skip  $name: no data/movielens (scripts/fetch_movielens.sh)"; nskip=$((nskip+1)); continue
    fi
    args=($(common_args "$data") --quiet --no-progress "${DEV_ARGS[@]}" $flags)
    t=$(date +%s.%N)
    if [ $TOGETHER = 1 ]; then
        run_row "$BASE_BIN" "$WORK/base/$name" "$ranks" "$stop" "" "${args[@]}" & pb=$!
        run_row "$NEW_BIN" "$WORK/new/$name" "$ranks" "$stop" "$NEW_EXTRA" "${args[@]}" & pn=$!
        wait $pb; rb=$?; wait $pn; rn=$?
        secs=$(awk -v a="$t" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f s, both at once", b - a}')
    else
        run_row "$BASE_BIN" "$WORK/base/$name" "$ranks" "$stop" "" "${args[@]}"; rb=$?
        tb=$(date +%s.%N)
        run_row "$NEW_BIN" "$WORK/new/$name" "$ranks" "$stop" "$NEW_EXTRA" "${args[@]}"; rn=$?
        secs=$(awk -v a="$t" -v b="$tb" -v c="$(date +%s.%N)" 'BEGIN {printf "%.1f s + %.1f s", b - a, c - b}')
    fi
    if [ $rb -ne 0 ] && [ $rn -ne 0 ]; then
        echo "FAIL  $name: both runs failed (exit $rb, $rn): $(last_error "$WORK/new/$name.log")"; nfail=$((nfail+1)); failed+=("$name"); continue
    elif [ $rb -ne 0 ] || [ $rn -ne 0 ]; then
        which=base; log=$WORK/base/$name.log; [ $rn -ne 0 ] && which=new log=$WORK/new/$name.log
        echo "DIFF  $name: only the $which run failed (exit $((rb + rn))): $(last_error "$log")"; ndiff=$((ndiff+1)); failed+=("$name"); continue
    fi
    if out=$(python3 "$ROOT/tests/parity_compare.py" --labels base,new --state-ignore "$STATE_IGNORE" "${DESIGNED[@]}" "$WORK/base/$name" "$WORK/new/$name" 2>&1); then
        echo "same  $name  ($secs)"; nsame=$((nsame+1))
        [ $PRUNE = 0 ] || rm -rf "$WORK/base/$name" "$WORK/new/$name"
    else
        echo "DIFF  $name: $(echo "$out" | head -n 1)"; echo "$out" | tail -n +2 | sed 's/^/      /'
        ndiff=$((ndiff+1)); failed+=("$name")
    fi
done
T_RUN=$(( $(date +%s) - T1 ))
echo "$nsame same, $ndiff differ, $nfail failed, $nskip skipped of ${#selected[@]} rows; runs ${T_RUN} s, builds ${T_BUILD} s"
[ ${#failed[@]} -gt 0 ] && echo "not the same: ${failed[*]} (logs and run directories in $WORK)"
[ $ndiff -eq 0 ] && [ $nfail -eq 0 ]
