#!/usr/bin/env bash
# Fine-tuning a Hugging Face model bigger than the GPU, on one GPU machine, in one call (issue 32):
# nobubble `train --init-from HF_DIR --schedule stream` on chat data against PyTorch FSDP2 with CPU
# offload (bench/fsdp_offload.py: fp32 master weights, gradients and AdamW state in host memory,
# the CPU optimizer; --adamw fused, its fastest setting) on the same shape, batch and sequence.
#   bash bench/finetune_bench.sh [--shape llama3.1-8b] [--batch 8] [--seq 2048] [--steps 10]
#        [--anchor-steps 3] [--layers 0,20] [--no-build] [--budget S] [--no-fp32-retry]
# Steps:
#  1. bench/hf_random_model.py writes the checkpoint as the hub ships it (bf16 shards, config.json)
#     with random weights to $HF_DIR (default /tmp/nb-hf-SHAPE; kept when it exists);
#  2. bench/sft_from_corpus.py makes chat examples from data/sotu/raw, `nobubble tokenize --chat`
#     renders them with the family's template (Llama 3: data/hf_tokenizers/llama3, Qwen:
#     data/hf_tokenizers/qwen3) into packed uint32 shards and a loss mask (the responses);
#  3. nobubble trains --steps steps (the first --warmup-steps are left out of its p90/median) with
#     `nobubble plan`'s stream flags for this machine (--ckpt-interval 1 and as many layers' state on
#     the GPU as fit; without a plan: --ckpt-interval 1 --gpu-layers -1);
#  4. FSDP2 runs --anchor-steps timed steps after 2 warm-up steps on the same shape. Where its
#     host-memory estimate says the model does not fit the machine, it runs again without that
#     check under lora_torch.py's host-memory guard, and the row holds what happened (its steps,
#     or the guard's kill with the RSS it reached), not the estimate. Where the fp32 state did not
#     run, FSDP2 runs again with --dtype bf16 (weights, gradients and AdamW moments in bf16: 8 bytes
#     a parameter on the host, torchtune's way), the best setting that fits such a host; the ratio
#     is against the best FSDP2 row that ran (the table says which). --no-fp32-retry: where the
#     estimate refuses the fp32 state, go straight to bf16 (the guarded fp32 run takes minutes to
#     reach the host's limit; for a call short of time on a host where that kill was measured).
# --layers: one row per entry, in that order: 0 is the published model, N the same shape cut to
#   its first N layers (a checkpoint of N layers, imported the same way), so that there is a
#   ratio on a model both sides fit when FSDP2 cannot hold the whole one (e.g. --layers 20,0).
# tokens/s: nobubble's median (and p90) from its summary line; FSDP2's median over its timed
# steps. Output: $OUT (default bench/out/finetune): logs and table.md (printed at the end).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
shape=llama3.1-8b batch=8 seq=2048 steps=10 asteps=3 rows=0 build=1 budget=570 fp32_retry=1
while [ $# -gt 0 ]; do
    case "$1" in
        --shape) shape=$2; shift ;;
        --batch) batch=$2; shift ;;
        --seq) seq=$2; shift ;;
        --steps) steps=$2; shift ;;
        --anchor-steps) asteps=$2; shift ;;
        --layers) rows=$2; shift ;;
        --no-build) build=0 ;;
        --no-fp32-retry) fp32_retry=0 ;;
        --budget) budget=$2; shift ;;
        -h|--help) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) echo "finetune_bench.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
for v in "$batch" "$seq" "$steps" "$asteps" ${rows//,/ } "$budget"; do
    case "$v" in ''|*[!0-9]*) echo "finetune_bench.sh: numbers must be whole and >= 0, got '$v'" >&2; exit 2 ;; esac
done
case "$shape" in
    llama*) TOK=data/hf_tokenizers/llama3 ;;
    qwen*) TOK=data/hf_tokenizers/qwen3 ;;
    *) echo "finetune_bench.sh: --shape llama3.1-8b, llama3.2-3b or qwen2.5-7b" >&2; exit 2 ;;
esac
OUT=${OUT:-bench/out/finetune}
NB_BUILD=${NB_BUILD:-build}
NB=$NB_BUILD/nobubble
PY=${PYTHON:-python3}
HF_DIR=${HF_DIR:-/tmp/nb-hf-$shape}
WARM=3
start=$(date +%s)
left() { echo $(( start + budget - $(date +%s) )); }
stamp() { echo "[$(( $(date +%s) - start )) s]"; }
mkdir -p "$OUT" || exit 1
rm -f "$OUT/fsdp.jsonl" "$OUT/table.md"
DATA=$(mktemp -d) || exit 1   # the chat data (tens of MB): not kept with the results
trap 'rm -rf "$DATA"' EXIT
status=0

echo "== device $(stamp)"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null || echo "nvidia-smi: not available"
grep -E 'MemTotal' /proc/meminfo
if [ $build = 1 ]; then
    echo "== build $(stamp)"
    source scripts/device_deps.sh use || status=1
    make -j"$(nproc)" BUILD="$NB_BUILD" ${NB_MAKE_FLAGS:-} "$NB" > "$OUT/build.log" 2>&1 || { tail -15 "$OUT/build.log"; exit 1; }
fi
[ -x "$NB" ] || { echo "no $NB"; exit 1; }

echo "== data $(stamp)"
"$PY" bench/sft_from_corpus.py --out-dir "$DATA" || exit 1
for s in train val; do
    "$NB" tokenize --tokenizer "$TOK" --chat --out "$DATA/$s.bin" "$DATA/$s.jsonl" > "$DATA/$s.log" 2>&1 || { cat "$DATA/$s.log"; exit 1; }
    tail -n 2 "$DATA/$s.log"
done

# shape_of DIR: fsdp_offload.py's shape flags from a config.json
shape_of() {
    "$PY" -c 'import json, sys
c = json.load(open(sys.argv[1] + "/config.json"))
keys = [("layers", "num_hidden_layers"), ("dim", "hidden_size"), ("heads", "num_attention_heads"),
        ("kv-heads", "num_key_value_heads"), ("ffn", "intermediate_size"), ("vocab", "vocab_size")]
print(" ".join("--%s %d" % (flag, c[key]) for flag, key in keys))' "$1" || echo "--shape-unreadable"
}
printf '| model | B x T | nobubble stream median tokens/s (p90) | FSDP2 CPU offload, fused AdamW, fp32 state: median tokens/s | FSDP2, bf16 state | nobubble / best FSDP2 |\n|---|---|---|---|---|---|\n' > "$OUT/table.md"

# fsdp_cell: a fsdp_offload.py result line (stdin) as a table cell: its tokens/s, or its status and error
fsdp_cell() {
    "$PY" -c 'import json, sys
try:
    r = json.loads(sys.stdin.read())
except Exception:
    print("failed"); sys.exit()
print(r["tokens_per_s"] if r.get("status") == "ok" else r.get("status", "failed") + ": " + str(r.get("error", ""))[:120])'
}

# fsdp_guarded DIR LOG FLAGS...: fsdp_offload.py on DIR's shape under lora_torch.py's host-memory
# guard (killed before the kernel's OOM killer would act); echoes its result line, or a failed one
# with the guard's reason
fsdp_guarded() {
    local dir=$1 log=$2 n0; shift 2
    n0=$(wc -l 2>/dev/null < "$OUT/fsdp.jsonl" || echo 0)
    "$PY" bench/lora_torch.py --guard-timeout "$(( $(left) - 10 ))" --guard-log "$log" --guard -- \
        "$PY" bench/fsdp_offload.py --model llama-8b $(shape_of "$dir") --batch "$batch" --seq "$seq" --steps "$asteps" \
        --warmup 2 --adamw fused --json "$OUT/fsdp.jsonl" --deadline $(( start + budget )) "$@" > /dev/null 2>&1
    grep -E '^(setup|step|guard:)' "$log" | sed 's/^/   /' >&2
    if [ "$(wc -l 2>/dev/null < "$OUT/fsdp.jsonl" || echo 0)" -gt "$n0" ]; then tail -n 1 "$OUT/fsdp.jsonl"
    else echo "{\"status\": \"failed\", \"error\": \"$(grep -m1 '^guard:' "$log" | tr -d '"\\' | cut -c1-150)\"}"; fi
}

# row LAYERS: checkpoint, nobubble, FSDP2, one table row
row() {
    local layers=$1 dir=$HF_DIR tag=full label=$shape
    [ "$layers" -gt 0 ] && dir=$HF_DIR-L$layers tag=L$layers label="$shape, first $layers layers"
    [ "$(left)" -gt 60 ] || { echo "| $label | $batch x $seq | skipped (time budget) | | | |" >> "$OUT/table.md"; return 1; }
    echo "== checkpoint $label $(stamp)"
    "$PY" bench/hf_random_model.py --shape "$shape" --out "$dir" --layers "$layers" || return 1
    local log=$OUT/nb-$tag.log med="" p90="" fsdp="" fl
    fl=$("$NB" plan --init-from "$dir" --device cuda --batch "$batch" --seq "$seq" --schedule stream --ckpt-interval 1 2> "$OUT/plan-$tag.txt" \
        | tee -a "$OUT/plan-$tag.txt" | sed -n '/^stream/,/^bytes   stream/p' | grep -E '^  flags' | head -n 1 | sed 's/^  flags *//')
    [ -n "$fl" ] || fl="--schedule stream --ckpt-interval 1 --gpu-layers -1"
    echo "== nobubble $label: $fl $(stamp)"
    # shellcheck disable=SC2086  # the plan's flags are words
    timeout "$(left)" "$NB" train --init-from "$dir" $fl --device cuda --batch "$batch" --seq "$seq" \
        --steps "$steps" --warmup 0 --lr 1e-5 --data "$DATA/train.bin" --val-data "$DATA/val.bin" --eval-every 0 --eval-batches 2 \
        --no-ckpt --out "$OUT/run-$tag" --fresh --no-progress > "$log" 2>&1 || { echo "nobubble failed:"; tail -5 "$log"; status=1; }
    grep -E '^(memory|stream|data|throughput|done)' "$log"
    local line; line=$(grep '^throughput' "$log")
    p90=$(echo "$line" | awk '{print $3}'); med=$(echo "$line" | awk '{for (i=1;i<=NF;i++) if ($i=="median") print $(i+1)}')
    "$PY" -c 'import json, sys
l = [json.loads(x)["loss"] for x in open(sys.argv[1]) if "\"loss\"" in x]
print(f"nobubble masked loss: step 1 {l[0]:.4f}, step {len(l)} {l[-1]:.4f}")' "$OUT/run-$tag/metrics.jsonl" 2>/dev/null
    echo "== FSDP2 CPU offload $label $(stamp)"
    timeout "$(left)" "$PY" bench/fsdp_offload.py --model llama-8b $(shape_of "$dir") --batch "$batch" --seq "$seq" \
        --steps "$asteps" --warmup 2 --adamw fused --json "$OUT/fsdp.jsonl" --deadline $(( start + budget )) > "$OUT/fsdp-$tag.log" 2>&1
    local rec; rec=$(tail -n 1 "$OUT/fsdp.jsonl" 2>/dev/null)
    if echo "$rec" | grep -q '"host (estimated, not started)"' && [ $fp32_retry = 1 ] && [ "$(left)" -gt 90 ]; then
        # its estimate is not a measurement: run it anyway, under the guard, and record what happened
        echo "   its estimate says the host is too small: again with --no-host-check, under the guard $(stamp)"
        rec=$(fsdp_guarded "$dir" "$OUT/fsdp-$tag-guard.log" --no-host-check)
    fi
    fsdp=$(echo "$rec" | fsdp_cell)
    echo "FSDP2 (fp32 state): $fsdp"
    local bf="not run (the fp32 state ran)"
    if ! echo "$rec" | grep -q '"status": "ok"'; then
        if [ "$(left)" -gt 90 ]; then
            echo "== FSDP2 CPU offload $label, --dtype bf16 (the best setting that fits) $(stamp)"
            bf=$(fsdp_guarded "$dir" "$OUT/fsdp-$tag-bf16.log" --dtype bf16 | fsdp_cell)
        else
            bf="skipped (time budget)"
        fi
        echo "FSDP2 (bf16 state): $bf"
    fi
    local ratio
    ratio=$(awk -v a="$med" -v b="$fsdp" -v c="$bf" 'BEGIN { b += 0; c += 0; best = b > c ? b : c
        if (a > 0 && best > 0) printf "%.2fx (vs %s)", a / best, best == b ? "fp32 state" : "bf16 state"; else print "-" }')
    echo "| $label | $batch x $seq | ${med:-failed} (${p90:-}) | $fsdp | $bf | $ratio |" >> "$OUT/table.md"
}

for layers in ${rows//,/ }; do row "$layers"; done
echo "== table $(stamp)"
cat "$OUT/table.md"
echo "done in $(( $(date +%s) - start )) s ($(date -u +%Y-%m-%d), $(git log --oneline -1 2>/dev/null | cut -c1-7))"
exit $status
