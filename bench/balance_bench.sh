#!/usr/bin/env bash
# FreeScale's length balancing (issue 17) measured on one GPU with emulated ranks: --emulate-ranks N
# trains each rank's share of the global batch one after another on the real kernels, times each
# (its phases' spans) and reports the synchronous step they stand for (the slowest share plus the
# step's measured communication and common phases: the owners' sums and updates, the optimizer).
# THIS IS AN EMULATION of N ranks, not N GPUs.
# Synthetic Pareto history lengths (synth hist_alpha, hist_scale) capped at 8K and 16K; for each cap
# and N: --balance none (slices in data order), fbs, vbs (the cost model as given, default 1.5:16), and
# vbs with the exponent and C0 that the vbs run's cost fit printed (the measured cost of these kernels).
#   bash bench/balance_bench.sh [--no-build] [--device cuda|cpu] [--steps 40] [--batch 2048]
#        [--ranks 4,8] [--caps 8192,16384] [--vbs vbs:1.5:16] [--small]
#   --small: caps of 256, B = 64 (a smoke run of the script on a CPU machine)
#   --e2e: instead, end to end with 2 real ranks (mpirun; on one GPU they share it over --comm host)
#          and the tables in host memory (--emb-place host): sync (plain), pipe, pipe-freescale (pipe
#          + --balance vbs + --emb-priority), pipe-freescale-smfree (+ --comm-sm-free: the all-to-alls
#          by CUDA IPC copies), histories up to the first cap
# Prints the table (emulated p90 step ms and samples/s, straggler % = (max - mean) / max of the
# ranks' compute, bubble % = the ranks' idle share of the step, the bubble cut vs none) and writes
# $OUT/table.md; the runs' logs (with the cost fit's exponent) next to it.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
die() { echo "balance_bench.sh: $*" >&2; exit 1; }
build=1 steps=40 batch=2048 device=cuda ranks=4,8 caps=8192,16384 vbs=vbs small=0 e2e=0 alpha=1.2 scale=64
while [ $# -gt 0 ]; do
    case "$1" in
        --no-build) build=0 ;;
        --small) small=1 ;;
        --e2e) e2e=1 ;;
        --steps|--batch|--device|--ranks|--caps|--vbs)
            [ $# -ge 2 ] || die "$1 needs a value"
            case "$1" in --steps) steps=$2 ;; --batch) batch=$2 ;; --device) device=$2 ;; --ranks) ranks=$2 ;;
                --caps) caps=$2 ;; --vbs) vbs=$2 ;; esac
            shift ;;
        -h|--help) awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0"; exit 0 ;;
        *) die "unknown option '$1' (see --help)" ;;
    esac
    shift
done
[ $small = 1 ] && { caps=256; batch=64; scale=16; }
NB=${NB_BUILD:-build}/nobubble
[ $build = 1 ] && { make -j"$(nproc)" BUILD="${NB_BUILD:-build}" ${NB_MAKE_FLAGS:-} >/dev/null || die "build failed"; }
[ -x "$NB" ] || die "$NB not found (build first)"
OUT=${OUT:-bench/out/balance}
mkdir -p "$OUT" || exit 1
data_of() { echo "synth:cap=100000,items=1000000,max_len=$1,hist_alpha=$alpha,hist_scale=$scale"; }
if [ $e2e = 1 ]; then
    cap=${caps%%,*}
    { echo "| schedule | p90 samples/s | median samples/s | straggler % | rank bubble % | exposed transfer % |"; echo "|---|---|---|---|---|---|"; } > "$OUT/e2e.md"
    for row in sync pipe pipe-freescale pipe-freescale-smfree; do
        f=(--schedule plain); [ $row != sync ] && f=(--schedule pipe)
        case $row in pipe-freescale*) f+=(--balance "$vbs" --emb-priority) ;; esac
        [ $row = pipe-freescale-smfree ] && f+=(--comm-sm-free)
        log=$OUT/e2e-$row.log
        mpirun -np 2 --oversubscribe --allow-run-as-root "$NB" train --model seqctr --device "$device" --data "$(data_of "$cap")" \
            --emb-dim 64 --batch "$batch" --steps "$steps" --eval-every 0 --eval-samples 1024 --no-ckpt --no-progress \
            --emb-place host --emb-shard row "${f[@]}" --out "$OUT/e2e-$row" >"$log" 2>&1 \
            || { echo "| $row | failed: $(grep -m1 'error:' "$log" | cut -c1-100) | | | | |" >> "$OUT/e2e.md"; continue; }
        read -r p90 med < <(sed -n 's/^throughput steps=[0-9]* warmup=[0-9]* p90_samples_per_s=\([0-9]*\) median_samples_per_s=\([0-9]*\).*/\1 \2/p' "$log")
        read -r st bu < <(sed -n 's/^ranks: [^=]* straggler_pct=\([0-9.]*\) rank_bubble_pct=\([0-9.]*\).*/\1 \2/p' "$log")
        ex=$(awk -F'[,:{}]' '{ for (i = 1; i < NF; i++) if ($i == "\"exposed_pct\"") { e += $(i + 1); n++ } } END { printf "%.1f", n ? e / n : 0 }' "$OUT/e2e-$row/metrics.jsonl")
        echo "| $row | $p90 | $med | $st | $bu | $ex |" >> "$OUT/e2e.md"
    done
    echo "device $device, 2 ranks (mpirun, --comm auto), --emb-place host, global batch $batch, $steps steps, histories up to $cap"
    cat "$OUT/e2e.md"
    exit 0
fi
{
    echo "| max len | ranks | balance | emulated p90 step ms | emulated p90 samples/s | straggler % mean / median | bubble % mean / median | bubble vs none (mean / median) | slowest share holds the longest history |"
    echo "|---|---|---|---|---|---|---|---|---|"
} > "$OUT/table.md"
for cap in ${caps//,/ }; do
    for n in ${ranks//,/ }; do
        none_bub=""
        fitted=""
        for b in none fbs $vbs fit; do
            if [ $b = fit ]; then # the exponent and C0 the none run's cost fit measured on these kernels
                b=$fitted; [ -n "$b" ] || continue
            fi
            tag=$cap-$n-${b//:/_} log=$OUT/$cap-$n-${b//:/_}.log
            "$NB" train --model seqctr --device "$device" --data "$(data_of "$cap")" \
                --emb-dim 64 --batch "$batch" --steps "$steps" --eval-every 0 --eval-samples 1024 --no-ckpt --no-progress \
                --emulate-ranks "$n" --balance "$b" --out "$OUT/$tag" >"$log" 2>&1 \
                || { echo "| $cap | $n | $b | failed: $(grep -m1 'error:' "$log" | cut -c1-100) | | | | | |" >> "$OUT/table.md"; continue; }
            read -r ms sps < <(sed -n 's/^emulated steps=[0-9]* p90_step_ms=\([0-9.]*\) median_step_ms=[0-9.]* p90_samples_per_s=\([0-9]*\).*/\1 \2/p' "$log")
            read -r st bu mst mbu < <(sed -n 's/^ranks: [^=]* straggler_pct=\([0-9.]*\) rank_bubble_pct=\([0-9.]*\) .*median_straggler_pct=\([0-9.]*\) median_rank_bubble_pct=\([0-9.]*\).*/\1 \2 \3 \4/p' "$log")
            [ "$b" = none ] && none_mbu=$mbu
            [ "$b" = none ] && none_bub=$bu
            # the cost fit of a run whose shares had different counts (vbs) separates the per-part,
            # per-sample and per-history costs; equal counts (none, fbs) cannot
            [ "$b" = "$vbs" ] && fitted=$(grep '^cost fit: part' "$log" | grep -o -- '--balance vbs:[0-9.]*:[0-9]*' | head -1 | cut -d' ' -f2)
            sl=$(sed -n 's/^ranks: the slowest share held the step.s longest history in \([0-9]* of [0-9]*\) steps, and nothing else in \([0-9]*\).*/\1 steps (alone in \2)/p' "$log")
            cut=$(awk -v a="$none_bub" -v b="$bu" -v c="$none_mbu" -v d="$mbu" 'BEGIN {if (a + 0 > 0 && c + 0 > 0) printf "%.0f%% / %.0f%% fewer", 100 * (a - b) / a, 100 * (c - d) / c; else print "-"}')
            echo "| $cap | $n | $b | $ms | $sps | $st / $mst | $bu / $mbu | $cut | $sl |" >> "$OUT/table.md"
            echo "$cap $n $b: $(grep '^cost fit' "$log")"
        done
    done
done
# The floor: in a step where a placement's slowest share held the step's longest history and
# nothing else, no placement of whole samples can make that share lighter, so its bubble there is
# the least any placement leaves; beside none's bubble in the same steps (the same batches).
python3 - "$OUT" "$caps" "$ranks" >> "$OUT/table.md" <<'PYEOF'
import glob, json, os, sys
out, caps, ranks = sys.argv[1], sys.argv[2].split(","), sys.argv[3].split(",")
def steps(path):
    d = {}
    for line in open(path):
        r = json.loads(line)
        if "rank_bubble_pct" in r: d[r["step"]] = r
    return d
rows = []
for cap in caps:
    for n in ranks:
        none_path = os.path.join(out, f"{cap}-{n}-none", "metrics.jsonl")
        if not os.path.exists(none_path): continue
        none, floor = steps(none_path), {}
        for path in glob.glob(os.path.join(out, f"{cap}-{n}-*", "metrics.jsonl")):
            for s, r in steps(path).items():
                if r.get("slowest_samples") == 1 and r.get("slowest_holds_longest") == 1 and s in none:
                    floor[s] = min(floor.get(s, 1e9), r["rank_bubble_pct"])
        if floor:
            f = sum(floor.values()) / len(floor); z = sum(none[s]["rank_bubble_pct"] for s in floor) / len(floor)
            rows.append(f"| {cap} | {n} | {len(floor)} | {f:.2f} | {z:.2f} | {100 * (z - f) / z:.0f}% |" if z > 0 else "")
if rows:
    print("\n| max len | ranks | steps whose slowest share held only the longest history (any placement) | bubble % there: the floor | none's bubble % there | the most any placement can cut there |")
    print("|---|---|---|---|---|---|")
    print("\n".join(r for r in rows if r))
PYEOF
echo
echo "device $device, global batch $batch, $steps steps, Pareto lengths (hist_alpha $alpha, hist_scale $scale); EMULATED ranks (one GPU)"
cat "$OUT/table.md"
