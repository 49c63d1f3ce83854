#!/usr/bin/env bash
# NestPipe's schedules on seqctr (issue 16), every row in one call on the same device:
#   sync         --schedule plain with the tables sharded: each step routes its ids, looks its rows up
#                and moves them in line (the synchronous baseline)
#   sparse-dist  TorchRec's TrainPipelineSparseDist: the next batch's ids routed while the step trains
#   pipe         dual-buffer pipelining (DBP): the next batch's lookups and rows fetched while the
#                step trains, staleness-free (the rows a step updates are sent again)
#   pipe-whole   one rank, whole tables (--emb-shard none): pipe's stage 2 alone, the next batch's
#                ids uploaded and its index lists built on the device while the step trains (beside
#                the unsharded row, its plain form)
#   pipe-prio    DBP + FreeScale's collision-first exchange (--emb-priority: only the exclusive rows
#                move ahead, the collision rows after the update)
#   pipe-fwp     DBP + Frozen-Window Pipelining (--micro-batches M: the next part's rows fetched
#                while one part trains, the tables updated once per step)
#   pipe-fwp-ck  the same with key-centric clustering of the samples into parts (--cluster-keys)
# for each placement of the tables: gpu (device memory) and host (--emb-place host: host DRAM, the
# GPU holding a batch's rows; with --gpu-mem-limit below the tables, where gpu does not fit), plus
# the unsharded run for reference (whole tables; at host placement read in place in host DRAM).
# Below the table: the most any overlap could give over sync at each placement, sync's p90 step
# against the device's busy time per step (its phases' sum), since no schedule runs faster than
# the device's own work. Synthetic Criteo-scale data: 26 tables of Criteo's cardinalities capped
# at 2M rows and an item table, E = 64, histories up to 256, B = 4096 per rank. The host rows'
# --gpu-mem-limit is 1% below what sync needs with the shards in device memory (the first row).
#   bash bench/pipe_bench.sh [--no-build] [--steps 150] [--batch 4096] [--device cuda|cpu]
#        [--ranks N] [--gpu-mem-limit BYTES] [--graphs] [--rows LIST] [--places gpu,host] [--micro-batches M] [--small]
#   --ranks N: N ranks (mpirun; on one GPU they share it over --comm host), --batch per rank
#   --rows: comma list of unsharded,pipe-whole,sync,sparse-dist,pipe,pipe-prio,pipe-fwp,pipe-fwp-ck (default all), each
#           run for both placements; --micro-batches M: the FWP rows' parts (default 4)
#           FWP on one GPU: each part is a batch of B / M samples, and the GPU runs a batch of 1,024
#           at about half the rate of one of 4,096 (seqctr on the H200: 490 k vs 1.0 M samples/s), so
#           at --batch 4096 with 4 parts FWP is bounded near 0.5x sync by its parts' size alone. Its
#           check where a part fills the GPU: --batch 16384 --rows sync,pipe-fwp,pipe-fwp-ck (parts
#           of 4,096; the CPU backend plans ~46 GiB for sync at 16,384 and ~17 GiB for FWP). There
#           (H100, 2026-12-07) FWP gave 0.61-0.66x sync: its parts' GPU work is 1.23x sync's, and the
#           host's index lists for four parts (~15 ms a step against sync's ~7) set its pace
#   --places LIST: the placements to run, gpu and/or host (default both)
#   --small: tables of 10k rows, histories up to 32 (a smoke run of the script on a CPU machine)
#   --args "FLAGS": more nobubble flags for every run (e.g. --graph-cache 64)
# Prints one table (p90 and median samples/s, the mean exposed transfer % and rows moved / re-synced
# per step from metrics.jsonl, the ratio to sync of the same placement) and writes $OUT/table.md.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
die() { echo "pipe_bench.sh: $*" >&2; exit 1; }
build=1 steps=150 batch=4096 device=cuda ranks=1 gpu_limit="" graphs="" small=0 parts=4 extra="" places=gpu,host
rows=unsharded,pipe-whole,sync,sparse-dist,pipe,pipe-prio,pipe-fwp,pipe-fwp-ck
while [ $# -gt 0 ]; do
    case "$1" in
        --no-build) build=0 ;;
        --graphs) graphs=--graphs ;;
        --small) small=1 ;;
        --steps|--batch|--device|--ranks|--gpu-mem-limit|--rows|--places|--micro-batches|--args)
            [ $# -ge 2 ] || die "$1 needs a value"
            case "$1" in --steps) steps=$2 ;; --batch) batch=$2 ;; --device) device=$2 ;; --ranks) ranks=$2 ;;
                --gpu-mem-limit) gpu_limit=$2 ;; --rows) rows=$2 ;; --places) places=$2 ;; --micro-batches) parts=$2 ;;
                --args) extra=$2 ;; esac
            shift ;;
        -h|--help) awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0"; exit 0 ;;
        *) die "unknown option '$1' (see --help)" ;;
    esac
    shift
done
for place in ${places//,/ }; do
    case $place in gpu|host) ;; *) die "unknown placement '$place' in --places (gpu, host)" ;; esac
done
NB=${NB_BUILD:-build}/nobubble
[ $build = 1 ] && { make -j"$(nproc)" BUILD="${NB_BUILD:-build}" ${NB_MAKE_FLAGS:-} >/dev/null || die "build failed"; }
[ -x "$NB" ] || die "$NB not found (build first)"
OUT=${OUT:-bench/out/pipe}
mkdir -p "$OUT" || exit 1
L=()
[ "$ranks" -gt 1 ] && L=(mpirun -np "$ranks" --oversubscribe --allow-run-as-root)
cap=2000000 len=256
[ $small = 1 ] && cap=10000 len=32
C=(--model seqctr --device "$device" --data synth:cap=$cap,max_len=$len --emb-dim 64 --max-len $len --table-cap $cap
   --batch $((batch * ranks)) --steps "$steps" --eval-every 0 --eval-samples 4096 --no-ckpt --no-progress $graphs $extra)
[ "$device" = cpu ] && C+=(--threads "$(( $(nproc) / ranks > 0 ? $(nproc) / ranks : 1 ))")

# run NAME PLACE FLAGS...: "p90 median exposed moved resynced" (or "failed: ...")
run() {
    local name=$1 place=$2; shift 2
    local dir=$OUT/$name-$place log=$OUT/$name-$place.log lim=()
    [ "$place" = host ] && lim=(--emb-place host ${gpu_limit:+--gpu-mem-limit "$gpu_limit"})
    "${L[@]}" "$NB" train "${C[@]}" "$@" "${lim[@]}" --out "$dir" >"$log" 2>&1 || { echo "failed: $(grep -m1 'error:' "$log" | cut -c1-120)"; return; }
    local tp; tp=$(sed -n 's/^throughput steps=[0-9]* warmup=\([0-9]*\) p90_samples_per_s=\([0-9]*\) median_samples_per_s=\([0-9]*\).*/\1 \2 \3/p' "$log")
    set -- $tp
    local warm=${1:-0} p90=${2:-?} med=${3:-?}
    awk -v w="$warm" -F'[,:{}]' '
        { for (i = 1; i < NF; i++) { k = $i; gsub(/"/, "", k); v[k] = $(i + 1) } }
        v["step"] >= w { n++; e += v["exposed_pct"]; m += v["rows_moved"]; s += v["rows_resynced"] }
        END { printf "%s %s %.1f %.0f %.0f\n", "'"$p90"'", "'"$med"'", n ? e / n : 0, n ? m / n : 0, n ? s / n : 0 }' "$dir/metrics.jsonl"
}

{
    echo "| schedule | tables | p90 samples/s | median samples/s | exposed transfer % | rows moved / step | re-synced / step | p90 vs sync (pipe-whole: vs unsharded) |"
    echo "|---|---|---|---|---|---|---|---|"
} > "$OUT/table.md"
# the GPU the host rows emulate: 1% under what sync needs with the shards in device memory (its
# plan's device bytes), unless --gpu-mem-limit says otherwise
limit_below_sync() {
    awk '/^memory +device/ { v = $3; u = $4; gsub(/,/, "", u)
        m = u == "GiB" ? 1073741824 : u == "MiB" ? 1048576 : u == "KiB" ? 1024 : 1; printf "%.0f\n", 0.99 * v * m; exit }' "$OUT/sync-gpu.log"
}
for place in ${places//,/ }; do
    if [ "$place" = host ] && [ "$device" != cpu ]; then
        [ -z "$gpu_limit" ] && [ -f "$OUT/sync-gpu.log" ] && gpu_limit=$(limit_below_sync)
        [ -n "$gpu_limit" ] || gpu_limit=8200000000
        # the shards in device memory do not fit under the limit: the reason for host placement
        res=$(run sync-limited gpu --emb-shard row --gpu-mem-limit "$gpu_limit")
        echo "sync (gpu, --gpu-mem-limit $gpu_limit): $res"
        echo "| sync | gpu, --gpu-mem-limit $gpu_limit | ${res:0:100} | | | | | |" >> "$OUT/table.md"
    fi
    sync_p90="" whole_p90=""
    for row in ${rows//,/ }; do
        case $row in
            unsharded) [ "$ranks" -gt 1 ] && continue; res=$(run unsharded "$place" --emb-shard none) ;;
            pipe-whole) [ "$ranks" -gt 1 ] && continue; res=$(run pipe-whole "$place" --emb-shard none --schedule pipe) ;;
            sync) res=$(run sync "$place" --emb-shard row --schedule plain) ;;
            sparse-dist) res=$(run sparse-dist "$place" --emb-shard row --schedule sparse-dist) ;;
            pipe) res=$(run pipe "$place" --emb-shard row --schedule pipe) ;;
            pipe-prio) res=$(run pipe-prio "$place" --emb-shard row --schedule pipe --emb-priority) ;;
            pipe-fwp) res=$(run pipe-fwp "$place" --emb-shard row --schedule pipe --micro-batches "$parts") ;;
            pipe-fwp-ck) res=$(run pipe-fwp-ck "$place" --emb-shard row --schedule pipe --micro-batches "$parts" --cluster-keys) ;;
            *) die "unknown row '$row'" ;;
        esac
        echo "$row ($place): $res"
        case $res in failed*) echo "| $row | $place | $res | | | | | |" >> "$OUT/table.md"; continue ;; esac
        set -- $res
        [ "$row" = sync ] && sync_p90=$1
        [ "$row" = unsharded ] && whole_p90=$1
        base=$sync_p90
        [ "$row" = pipe-whole ] && base=$whole_p90
        ratio=$(awk -v a="$base" -v b="$1" 'BEGIN {if (a + 0 > 0) printf "%.2fx", b / a; else print "-"}')
        echo "| $row | $place | $1 | $2 | $3 | $4 | $5 | $ratio |" >> "$OUT/table.md"
    done
done
{
    echo
    for place in gpu host; do
        log=$OUT/sync-$place.log
        [ -f "$log" ] || continue
        step=$(sed -n 's/^throughput steps=.* p90_step_ms=\([0-9.]*\).*/\1/p' "$log")
        busy=$(sed -n 's/^breakdown ms\/step: .* total=\([0-9.]*\).*/\1/p' "$log")
        awk -v p="$place" -v s="$step" -v b="$busy" 'BEGIN { if (s > 0 && b > 0)
            printf "- %s placement: sync p90 step %.2f ms, the device busy %.2f ms per step: no overlap can beat sync by more than %.2fx\n", p, s, b, s / b }'
    done
} >> "$OUT/table.md"
echo
echo "device $device, ranks $ranks, B = $batch per rank, $steps steps, for host placement: --gpu-mem-limit ${gpu_limit:-(none: cpu)} $graphs $extra"
cat "$OUT/table.md"
