#!/usr/bin/env bash
# Device index lists for multi-valued columns (issue 34), everything that needs a GPU in one command:
#   bash tests/gpu_mvlists_check.sh          (build folder: $NB_BUILD, default build-dev)
#  1. builds with CUDA;
#  2. test_ops' index-list rows on CUDA (lists, lists_mv, unique_groups: the device's lists and
#     deduplication against the CPU's, byte for byte, DLRM's B = 6912 included);
#  3. tests/gpu_seqctr_test.sh (device lists = host lists bitwise for seqctr, dlrm-dcnv2 in
#     fp32 / bf16 / --emb-place host / row-wise Adagrad, and a schema with empty fields);
#  4. DLRM-DCNv2 at MLPerf's per-GPU batch 6,912 (tables capped at 1 M rows, --emb-optim adagrad):
#     p90 samples/s with host lists and with device lists, the host's list time, and the ratio.
# Without a GPU it prints a skip line and exits 0.
set -uo pipefail
cd "$(dirname "$0")/.."
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 || { echo "skip: no GPU (nvidia-smi finds none)"; exit 0; }
[ -f scripts/device_deps.sh ] && { source scripts/device_deps.sh use || exit 1; }
B=${NB_BUILD:-build-dev}
export NB_BUILD=$B
rc=0
t0=$(date +%s)
make -j"$(nproc)" BUILD="$B" ${NB_MAKE_FLAGS:-} > /tmp/mvlists_build.log 2>&1 || { tail -30 /tmp/mvlists_build.log; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
NB=$B/nobubble
"$NB" info | head -n 2

echo "=== test_ops --backend cuda --op lists,lists_mv,unique_groups"
"$B/tests/test_ops" --backend cuda --op lists,lists_mv,unique_groups --verbose || rc=1
"$B/tests/test_ops" --backend cpu --op lists_mv || rc=1

echo "=== gpu_seqctr_test"
bash tests/gpu_seqctr_test.sh || rc=1

echo "=== dlrm-dcnv2, B 6912, tables capped at 1 M rows: host lists vs device lists"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
D=(--model dlrm-dcnv2 --device cuda --data synth --table-cap 1000000 --emb-optim adagrad --batch 6912 --steps 60
   --eval-every 0 --eval-samples 4096 --no-ckpt)
p90() { grep -o 'p90_samples_per_s=[0-9.]*' "$1" | cut -d= -f2; }
hostms() { grep -o 'index_lists=[0-9.]*' "$1" | cut -d= -f2; }
for w in host device; do
    "$NB" train "${D[@]}" --index-lists $w --out "$T/$w" > "$T/$w.out" 2>&1 || { tail -5 "$T/$w.out"; rc=1; }
    grep -E '^(dlrm-dcnv2|throughput|breakdown|host ms)' "$T/$w.out" | sed "s/^/  [$w] /"
done
h=$(p90 "$T/host.out"); d=$(p90 "$T/device.out")
if [ -n "$h" ] && [ -n "$d" ]; then
    awk -v h="$h" -v d="$d" -v hh="$(hostms "$T/host.out")" -v hd="$(hostms "$T/device.out")" 'BEGIN {
        printf "dlrm-dcnv2 B=6912 p90 samples/s: host lists %.0f, device lists %.0f, device/host %.2fx (host index_lists ms/step: %s vs %s)\n",
            h, d, d / h, hh, hd }'
else
    echo "FAIL no throughput line (host '$h', device '$d')"; rc=1
fi
[ $rc -eq 0 ] && echo "gpu_mvlists_check: all passed" || echo "gpu_mvlists_check: FAILED"
exit $rc
