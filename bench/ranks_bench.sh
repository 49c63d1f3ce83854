#!/usr/bin/env bash
# Data-parallel ranks (issue 15): the same global batch trained at 1 rank and at N ranks
# (mpirun -np N --oversubscribe --allow-run-as-root), every run traced. Per configuration a table:
# ms/step (median of metrics.jsonl's "ms" after --warmup steps) and rank 0's step split by
# bench/trace_split.py into compute (the compute lane busy), exposed communication (the comm lane
# busy while compute is idle) and the rest (both idle), plus the comm lane's total and hidden part.
#   bash bench/ranks_bench.sh [--model gpt2-tiny] [--batch 8[,2,...]] [--seq T] [--steps 20]
#        [--warmup 5] [--ranks 1,2[,4]] [--repeat R] [--device cpu|cuda] [--comm auto|mpi|host|nccl]
#        [--threads 1] [--out DIR] [--no-link]
#   GPU (one device call): bash bench/ranks_bench.sh --device cuda --comm host --model gpt2 --batch 32 --seq 1024
# Each rank has --threads (default 1: mpirun binds a rank to a core). --batch is the global batch.
# --repeat R runs every (batch, ranks) R times, interleaved, one row each (noisy machines).
# Unless --no-link, the link's all-reduce rate at each N > 1 is measured alone with
# build/tests/test_comm --bench MB (MB = the largest gradient bucket; --gpu host|nccl on cuda).
# $OUT (default bench/out/ranks): b<B>/n<N>[-r<R>]/{train.log,metrics.jsonl,trace.json,split.json},
# link-n<N>-r<R>.txt, table.md, runs.json (input of bench/scaling_model.py --check). Needs build/nobubble
# (make -j2 NB_CUDA=0 on a CPU machine), mpirun, python3 and data/sotu/train.bin.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
die() { echo "ranks_bench.sh: $*" >&2; exit 1; }
model=gpt2-tiny batches=8 seq="" steps=20 warmup=5 ranks=1,2 repeat=1 device=cpu comm=auto threads=1 link=1
OUT=${OUT:-bench/out/ranks}
while [ $# -gt 0 ]; do
    case "$1" in
        --model|--batch|--seq|--steps|--warmup|--ranks|--repeat|--device|--comm|--threads|--out)
            [ $# -ge 2 ] || die "$1 needs a value (see --help)"
            case "$1" in
                --model) model=$2 ;; --batch) batches=$2 ;; --seq) seq=$2 ;; --steps) steps=$2 ;;
                --warmup) warmup=$2 ;; --ranks) ranks=$2 ;; --repeat) repeat=$2 ;; --device) device=$2 ;;
                --comm) comm=$2 ;; --threads) threads=$2 ;; --out) OUT=$2 ;;
            esac
            shift ;;
        --no-link) link=0 ;;
        -h|--help) awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0"; exit 0 ;;
        *) die "unknown option '$1' (see --help)" ;;
    esac
    shift
done
NB=${NB_BUILD:-build}/nobubble
[ -x "$NB" ] || die "$NB not found: build it first (make -j\$(nproc) NB_CUDA=0 on a CPU machine)"
command -v mpirun >/dev/null || die "mpirun not found (apt-get install openmpi-bin, or scripts/setup.sh)"
command -v python3 >/dev/null || die "python3 not found"
[ -f data/sotu/train.bin ] || die "data/sotu/train.bin missing: run 'bash scripts/fetch_data.sh'"
[ "$steps" -gt $((warmup + 1)) ] 2>/dev/null || die "--steps ($steps) must exceed --warmup ($warmup) + 1"
for n in ${ranks//,/ }; do
    for b in ${batches//,/ }; do [ $((b % n)) -eq 0 ] || die "--batch $b is not a multiple of $n ranks"; done
done
mkdir -p "$OUT" || die "cannot create $OUT"
MPI=(mpirun --oversubscribe --allow-run-as-root)
TRAIN=(train --model "$model" --steps "$steps" --device "$device" --threads "$threads" --data data/sotu/train.bin
       --val-data none --eval-every 0 --no-ckpt --no-progress)
[ -n "$seq" ] && TRAIN+=(--seq "$seq")
[ "$comm" != auto ] && TRAIN+=(--comm "$comm")

run_one() { # run_one B N DIR
    local b=$1 n=$2 dir=$3 launch=()
    mkdir -p "$dir"
    [ "$n" -gt 1 ] && launch=("${MPI[@]}" -np "$n")
    "${launch[@]}" "$NB" "${TRAIN[@]}" --batch "$b" --trace "$dir/trace.json" --out "$dir/run" > "$dir/train.log" 2>&1 \
        || { echo "  b=$b n=$n: failed: $(tail -n 2 "$dir/train.log" | tr '\n' ' ')" >&2; return 1; }
    cp "$dir/run/metrics.jsonl" "$dir/metrics.jsonl"
    python3 bench/trace_split.py "$dir/trace.json" --steps "$warmup:" --json > "$dir/split.json" \
        || { echo "  b=$b n=$n: trace_split failed" >&2; return 1; }
    echo "  b=$b n=$n: $(python3 bench/trace_split.py "$dir/trace.json" --steps "$warmup:" | tail -n 1)"
}

link_one() { # link_one N FILE: the link alone, all-reduce of the largest bucket's size (from the model line)
    local T=${NB_BUILD:-build}/tests/test_comm mb gpu=()
    [ -x "$T" ] || { echo "  link: $T not built (make $T): no link measurement" >&2; return 0; }
    mb=$(grep -h -m1 '^model ' "$OUT"/b*/n*/train.log 2>/dev/null | head -n 1 | sed -n 's/.*dim \([0-9]*\),.*padded \([0-9]*\)), seq \([0-9]*\).*/\1 \2 \3/p' |
         awk '{m = ($2 + $3) * $1 * 4 / 1e6; printf "%d", m < 1 ? 1 : m + 0.5}')
    [ "$device" != cpu ] && gpu=(--gpu "$([ "$comm" = auto ] && echo nccl || echo "$comm")")
    "${MPI[@]}" -np "$1" "$T" --bench "${mb:-16}" "${gpu[@]}" > "$2" 2>&1 || echo "  link n=$1: test_comm --bench failed: $(tail -n 1 "$2")" >&2
    grep bench "$2" | sed 's/^/  link: /'
}

echo "ranks_bench: $model, --device $device, --comm $comm, --threads $threads per rank, batches $batches, ranks $ranks, $steps steps (median after $warmup), out $OUT"
for r in $(seq 1 "$repeat"); do
    for b in ${batches//,/ }; do
        for n in ${ranks//,/ }; do
            d="$OUT/b$b/n$n"; [ "$repeat" -gt 1 ] && d="$d-r$r"
            run_one "$b" "$n" "$d"
        done
    done
    # the link alone, once per repeat (next to the runs it is compared with)
    for n in ${ranks//,/ }; do [ $link = 1 ] && [ "$n" -gt 1 ] && link_one "$n" "$OUT/link-n$n-r$r.txt"; done
done

# one table per batch, runs.json for the scaling model
OUT="$OUT" MODEL="$model" DEVICE="$device" COMM="$comm" THREADS="$threads" WARMUP="$warmup" STEPS="$steps" \
COMMIT="$(git rev-parse --short HEAD 2>/dev/null || echo none)$(git diff --quiet HEAD -- src tools 2>/dev/null || echo +dirty)" \
HOST="$(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')" python3 - <<'PY' || die "table failed"
import glob, json, os, re, statistics
E = os.environ; out = E["OUT"]; runs = []; link = {}
for f in sorted(glob.glob(f"{out}/link-n*-r*.txt")):
    t = open(f).read(); n, rep = map(int, re.search(r"n(\d+)-r(\d+)\.txt$", f).groups())
    m = re.search(r"all-reduce of (\d+) MB .*: ([\d.]+) ms, ([\d.]+) GB/s", t); s = re.search(r"4 KB: ([\d.]+) us", t)
    if m: link[n, rep] = {"mb": float(m.group(1)), "ms": float(m.group(2)), "gbps": float(m.group(3)), "small_us": float(s.group(1)) if s else None}
for d in sorted(glob.glob(f"{out}/b*/n*/"), key=lambda p: [int(x) for x in re.findall(r"\d+", p[len(out):])]):
    if not os.path.exists(d + "split.json"): continue
    b, n, r = (re.findall(r"\d+", d[len(out):]) + ["1"])[:3]
    log = open(d + "train.log").read()
    m = re.search(r"layers (\d+), dim (\d+),.*padded (\d+)\), seq (\d+)", log)
    ms = [json.loads(l)["ms"] for l in open(d + "metrics.jsonl")][int(E["WARMUP"]):]
    runs.append({"model": E["MODEL"], "device": E["DEVICE"], "comm": E["COMM"], "threads": int(E["THREADS"]), "batch": int(b),
                 "ranks": int(n), "repeat": int(r), "ms": round(statistics.median(ms), 3), "steps_timed": len(ms),
                 "shape": dict(zip(["layers", "dim", "vocab_padded", "seq"], map(int, m.groups()))) if m else None,
                 "split": json.load(open(d + "split.json"))["median"], "link": link.get((int(n), int(r))), "dir": d})
meta = {"date": os.popen("date -u +%Y-%m-%d").read().strip(), "commit": E["COMMIT"], "host": E["HOST"]}
json.dump({"meta": meta, "runs": runs}, open(f"{out}/runs.json", "w"), indent=1, sort_keys=True)
lines = [f"{meta['date']}, {meta['host']}, commit {meta['commit']}; {E['MODEL']}, --device {E['DEVICE']}, --comm {E['COMM']}, "
         f"--threads {E['THREADS']}; ms/step = median of metrics.jsonl after {E['WARMUP']} of {E['STEPS']} steps; split = "
         "rank 0's trace (bench/trace_split.py medians, ms)"]
for b in sorted({x["batch"] for x in runs}):
    rows = [x for x in runs if x["batch"] == b]; one = [x["ms"] for x in rows if x["ranks"] == 1]
    t1 = statistics.median(one) if one else None
    lines += ["", f"global batch {b}:", "", "| ranks | run | ms/step | speedup vs 1 rank | trace window | compute | exposed comm | rest | comm busy | hidden comm | exposed % of window |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for x in rows:
        s = x["split"]; sp = f"{t1 / x['ms']:.2f}x" if t1 else "-"
        lines.append(f"| {x['ranks']} | {x['repeat']} | {x['ms']:.1f} | {sp} | {s['window']:.1f} | {s['compute']:.1f} | {s['exposed']:.2f} | {s['rest']:.2f} "
                     f"| {s['comm']:.2f} | {s['hidden']:.2f} | {100 * s['exposed'] / s['window']:.1f} |")
for (n, rep), l in sorted(link.items()):
    lines.append(f"\nlink alone (test_comm --bench, {n} ranks, after run {rep}): all-reduce of {l['mb']:.0f} MB in {l['ms']} ms ({l['gbps']} GB/s buffer bytes / time), 4 KB in {l['small_us']} us")
open(f"{out}/table.md", "w").write("\n".join(lines) + "\n"); print("\n".join(lines))
PY
echo "raw outputs: $OUT (runs.json for: python3 bench/scaling_model.py --check $OUT/runs.json)"
