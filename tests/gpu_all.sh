#!/usr/bin/env bash
# Every check that needs a GPU, in one run on a GPU machine (the device tool's H200):
#   bash tests/gpu_all.sh            (logs and reference files under $OUT, default gpu-out/)
# Builds with CUDA, runs the CUDA tests, makes the PyTorch reference files (needs torch and
# transformers), checks the CPU and CUDA backends against them, checks the HF export in
# transformers, and runs the GPU trainer tests. A summary table comes last.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-out}
mkdir -p "$OUT/logs"
export PYTHONUNBUFFERED=1
source scripts/device_deps.sh use || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/logs/gpu.txt"
B=${NB_BUILD:-build-dev}
t0=$(date +%s)
# -k: a test program that does not build must not stop the others
make -k -j"$(nproc)" BUILD="$B" $NB_MAKE_FLAGS > "$OUT/logs/build.log" 2>&1 || { echo "build had errors:"; grep -E "error" "$OUT/logs/build.log" | head -20; }
[ -x "$B/nobubble" ] || { tail -40 "$OUT/logs/build.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
NB=$B/nobubble
$NB info
summary=()
step() { # step NAME TIMEOUT CMD...
    local name=$1 limit=$2; shift 2
    local s=$(date +%s)
    timeout "$limit" "$@" > "$OUT/logs/$name.log" 2>&1
    local rc=$? verdict=ok
    [ $rc -eq 77 ] && verdict=skip
    [ $rc -ne 0 ] && [ $rc -ne 77 ] && verdict="FAIL($rc)"
    echo "=== $name: $verdict ($(( $(date +%s) - s )) s)"
    tail -n "${TAILN:-12}" "$OUT/logs/$name.log"
    summary+=("$(printf '%-16s %-9s %4d s' "$name" "$verdict" $(( $(date +%s) - s )))")
}
step lanes_cuda 120 "$B/tests/test_lanes_cuda"
step lanes_graph 120 "$B/tests/test_lanes_graph"
step kprof 60 "$B/tests/test_kprof"
# every cuda row of the op-test table (dense, fused, attention fa and cuDNN, ctr), eval mode (900 s:
# the four programs it replaces had 240 + 240 + 300 + 240)
step ops_cuda 900 "$B/tests/test_ops" --backend cuda
mkdir -p tests/torch/ref
step ref_gen 240 bash -c "for p in gpt2 llama qwen2 qwen3; do python3 tests/torch/ref_check.py gen --preset \$p-tiny --out tests/torch/ref/\${p}_tiny.safetensors || exit 1; done"
cp tests/torch/ref/*.safetensors "$OUT/" 2>/dev/null
step torch_ref 240 "$B/tests/test_torch_ref" --save-ckpt /tmp/nbref
step hf_export 240 bash -c "for m in gpt2_tiny llama_tiny qwen2_tiny qwen3_tiny; do $NB export --ckpt /tmp/nbref/\$m --hf /tmp/hf_\$m && python3 tests/torch/ref_check.py check-export --hf /tmp/hf_\$m --ref tests/torch/ref/\$m.safetensors || exit 1; done"
step seqctr_ref 120 "$B/tests/test_seqctr_ref" --verbose
# predict's scores against the export loaded in PyTorch and its ONNX model under onnxruntime (1e-5)
step predict_onnx 240 env NB_BUILD="$B" python3 tests/predict_onnx_check.py
# (600 s: the device index lists with multi-valued columns, dlrm-dcnv2 and a schema, added ~13 short runs)
TAILN=30 step gpu_seqctr 600 env NB_BUILD="$B" bash tests/gpu_seqctr_test.sh
TAILN=30 step gpu_train 400 env NB_BUILD="$B" bash tests/gpu_train_test.sh
TAILN=20 step gpu_ranks 300 env NB_BUILD="$B" bash tests/gpu_ranks_test.sh
TAILN=20 step gpu_mask 300 env NB_BUILD="$B" bash tests/gpu_mask_test.sh
# Hugging Face checkpoints that transformers saves, imported with --init-from: weights and loss
TAILN=20 step hf_import 300 python3 tests/torch/hf_import_check.py --nb "$NB" --work /tmp/nbimport
# 20 AdamW steps of imported models of each architecture against PyTorch, their exports, the C
# tokenizers against `tokenizers` and chat rendering against apply_chat_template (issue 32)
TAILN=30 step hf_finetune 400 python3 tests/torch/hf_finetune_check.py --nb "$NB" --work /tmp/nbft
# LoRA against peft: logits (losses), adapter gradients, 20 AdamW steps, the exported adapter in
# peft and the merged export in transformers (issue 33; needs peft)
TAILN=20 step lora_peft 300 python3 tests/torch/lora_peft_check.py --nb "$NB" --work /tmp/nblora
# LoRA under --schedule stream against plain LoRA on the GPU: fp32 and bf16, slots, device layers,
# recompute, resume (issue 33)
TAILN=20 step gpu_lora 300 env NB_BUILD="$B" bash tests/gpu_lora_test.sh
if [ -z "${NB_SKIP_GPT2_REF:-}" ]; then
    step gpt2_ref 300 bash -c "python3 tests/torch/ref_check.py gen --preset gpt2 --T 1024 --no-final-weights --tol-weights 2e-2 --out /tmp/gpt2_ref.safetensors && $B/tests/test_torch_ref --ref /tmp/gpt2_ref.safetensors --threads 16"
fi
echo; echo "summary ($(( $(date +%s) - t0 )) s):"; printf '  %s\n' "${summary[@]}"
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$OUT/logs"
