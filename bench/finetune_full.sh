#!/usr/bin/env bash
# The full-size fine-tuning check of issue 32 on one GPU machine: a Hugging Face checkpoint of a
# published model's shape (random weights, bf16 shards as the hub ships them) is imported and
# fine-tuned with --schedule stream on chat data made from the project's corpora (masked loss:
# the responses), then exported and evaluated by transformers on the same held-out shard.
#   bash bench/finetune_full.sh [--shape llama3.1-8b|qwen2.5-7b] [--batch 1] [--seq 1024]
#        [--steps 200] [--eval-batches 8] [--no-build] [--budget S] [--reserve S]
# Training stops at --steps or when the budget less --reserve seconds (the import, the final
# checkpoint, the export and transformers' two evaluations) is spent (--time-limit), whichever comes
# first; the summary says how many steps ran (H100: --reserve 150 was enough for 7-8B models).
# Disk: the input checkpoint (2 B/param), the run's weights-only checkpoint (--ckpt-weights-only:
# 4 B/param; a full one, 16 B/param, does not fit the machine's disk) and the bf16 export (2
# B/param); the input is deleted once imported and trained. Prints nobubble's held-out loss
# (bf16 compute, from its fp32 master), transformers' on the bf16 export (fp32 and bf16 compute)
# and the difference; $OUT/summary.json keeps them.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
shape=llama3.1-8b batch=1 seq=1024 steps=200 evb=8 build=1 budget=580 reserve=240
while [ $# -gt 0 ]; do
    case "$1" in
        --shape) shape=$2; shift ;;
        --batch) batch=$2; shift ;;
        --seq) seq=$2; shift ;;
        --steps) steps=$2; shift ;;
        --eval-batches) evb=$2; shift ;;
        --no-build) build=0 ;;
        --budget) budget=$2; shift ;;
        --reserve) reserve=$2; shift ;;
        -h|--help) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) echo "finetune_full.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
case "$shape" in
    llama*) TOK=data/hf_tokenizers/llama3 ;;
    qwen*) TOK=data/hf_tokenizers/qwen3 ;;
    *) echo "finetune_full.sh: --shape llama3.1-8b or qwen2.5-7b" >&2; exit 2 ;;
esac
OUT=${OUT:-bench/out/finetune-full}
NB_BUILD=${NB_BUILD:-build}
NB=$NB_BUILD/nobubble
PY=${PYTHON:-python3}
WORK=${WORK:-/tmp/nb-full-$shape}
HF_DIR=$WORK/hf RUN=$WORK/run EXP=$WORK/export DATA=$WORK/data
start=$(date +%s)
left() { echo $(( start + budget - $(date +%s) )); }
stamp() { echo "[$(( $(date +%s) - start )) s]"; }
mkdir -p "$OUT" "$DATA" || exit 1
echo "== device $(stamp)"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null
grep -E 'MemTotal|MemAvailable' /proc/meminfo; df -h "$WORK" | tail -1
if [ $build = 1 ]; then
    echo "== build $(stamp)"
    source scripts/device_deps.sh use || exit 1
    make -j"$(nproc)" BUILD="$NB_BUILD" ${NB_MAKE_FLAGS:-} "$NB" > "$OUT/build.log" 2>&1 || { tail -15 "$OUT/build.log"; exit 1; }
fi
echo "== data $(stamp)"
if [ ! -s "$DATA/val.bin" ]; then
    "$PY" bench/sft_from_corpus.py --out-dir "$DATA" || exit 1
    for s in train val; do
        "$NB" tokenize --tokenizer "$TOK" --chat --out "$DATA/$s.bin" "$DATA/$s.jsonl" > "$DATA/$s.log" 2>&1 || { cat "$DATA/$s.log"; exit 1; }
        tail -n 1 "$DATA/$s.log"
    done
fi
if [ ! -s "$RUN/ckpt/model.safetensors" ]; then
    echo "== checkpoint $shape $(stamp)"
    "$PY" bench/hf_random_model.py --shape "$shape" --out "$HF_DIR" || exit 1
    echo "== nobubble stream fine-tune, $steps steps of $batch x $seq $(stamp)"
    tl=$(( $(left) - reserve ))
    [ "$tl" -gt 30 ] || { echo "finetune_full.sh: $(left) s left, --reserve $reserve: no time to train"; exit 1; }
    timeout "$(left)" "$NB" train --time-limit "$tl" --init-from "$HF_DIR" --schedule stream --device cuda --batch "$batch" --seq "$seq" \
        --ckpt-interval 1 --gpu-layers -1 --stream-slots -1 --steps "$steps" --lr 1e-5 --warmup 10 \
        --data "$DATA/train.bin" --val-data "$DATA/val.bin" --eval-every $(( steps / 4 )) --eval-batches "$evb" \
        --ckpt-weights-only --ckpt-every 0 --ckpt-minutes 0 --out "$RUN" --fresh --no-progress > "$OUT/train.log" 2>&1 \
        || { echo "nobubble failed:"; tail -8 "$OUT/train.log"; exit 1; }
    grep -E '^(model|memory|stream|allocated|parameters|data|throughput|done)' "$OUT/train.log"
    rm -rf "$HF_DIR"   # the disk holds the input, the weights and the export only one pair at a time
fi
"$PY" -c 'import json, sys
rows = [json.loads(x) for x in open(sys.argv[1])]
l = [r["loss"] for r in rows if "loss" in r]; v = [(r["step"], r["val_loss"]) for r in rows if "val_loss" in r]
print(f"masked training loss: step 1 {l[0]:.4f}, step {len(l)} {l[-1]:.4f}; held-out: " + ", ".join(f"{s}: {x:.4f}" for s, x in v))' "$RUN/metrics.jsonl"
echo "== export $(stamp)"
[ -s "$EXP/config.json" ] || "$NB" export --ckpt "$RUN" --hf "$EXP" --dtype bf16 > "$OUT/export.log" 2>&1 || { tail -5 "$OUT/export.log"; exit 1; }
# nobubble's held-out loss of the exported weights: a run evaluates at its last step, also when
# --time-limit stops it, and its checkpoint is that step's
read -r steps nbval < <("$PY" -c 'import json, sys
rows = [json.loads(x) for x in open(sys.argv[1])]
last = max(r["step"] for r in rows); v = [r["val_loss"] for r in rows if r["step"] == last and "val_loss" in r]
print(last, repr(v[-1]) if v else "none")' "$RUN/metrics.jsonl")
[ "$nbval" != none ] || { echo "finetune_full.sh: no held-out loss at the run's last step $steps"; exit 1; }
echo "== transformers on the export $(stamp)"
for dt in fp32 bf16; do
    "$PY" tests/torch/heldout_loss.py --model "$EXP" --data "$DATA/val.bin" --batch "$batch" --seq "$seq" --batches "$evb" --dtype $dt \
        > "$OUT/hf-$dt.json" 2> "$OUT/hf-$dt.log" || { tail -5 "$OUT/hf-$dt.log"; exit 1; }
    cat "$OUT/hf-$dt.json"
done
"$PY" - "$nbval" "$OUT" "$shape" "$batch" "$seq" "$steps" <<'PYEOF'
import json, sys
nb, out = float(sys.argv[1]), sys.argv[2]
hf = {d: json.load(open(f"{out}/hf-{d}.json"))["loss"] for d in ("fp32", "bf16")}
s = {"shape": sys.argv[3], "batch": int(sys.argv[4]), "seq": int(sys.argv[5]), "steps": int(sys.argv[6]),
     "nobubble_heldout": nb, "transformers_fp32": hf["fp32"], "transformers_bf16": hf["bf16"],
     "diff_fp32": abs(nb - hf["fp32"]), "diff_bf16": abs(nb - hf["bf16"])}
json.dump(s, open(f"{out}/summary.json", "w"), indent=1)
print(f"held-out masked loss: nobubble {nb:.5f}, transformers fp32 {hf['fp32']:.5f} (|diff| {s['diff_fp32']:.2e}), "
      f"bf16 {hf['bf16']:.5f} (|diff| {s['diff_bf16']:.2e}): {'within' if s['diff_fp32'] <= 1e-3 else 'NOT within'} 1e-3")
PYEOF
echo "done in $(( $(date +%s) - start )) s ($(date -u +%Y-%m-%d), $(git log --oneline -1 2>/dev/null | cut -c1-7))"
