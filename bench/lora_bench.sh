#!/usr/bin/env bash
# LoRA and full fine-tuning on one GPU machine, nobubble beside what a PyTorch user runs, both
# sides of every comparison in the same call (issue 33):
#   bash bench/lora_bench.sh [--only a|b|c|a,b,...] [--budget S] [--steps N] [--no-build] [--quick]
# a. LoRA r=16 (alpha 32) on q,k,v,o of a Llama-3.1-8B-shaped model (nobubble's llama-8b with
#    vocab 128256: 8.03 B parameters, random weights), B x T = 8 x 2048, bf16: nobubble resident
#    (--schedule plain) against PEFT eager and PEFT + torch.compile (bench/lora_torch.py) on the
#    same GPU. Where plain does not fit this GPU (an 80 GB card: the plan says ~86 GiB) the run
#    says so and a second row runs --schedule stream with every layer that fits kept on the GPU.
#    Ratio: nobubble's best over PyTorch's best (target >= 1.5x).
# b. LoRA r=16 q,k,v,o of a Llama-3.1-70B-shaped model (80 layers, 8192 wide, 64 heads, 8 KV
#    heads, ffn 28672, vocab 128256: 70.55 B), B x T = 4 x 2048: `nobubble plan`, then nobubble
#    --schedule stream with the plan's flags (default --ckpt-interval 1 --gpu-layers -1; $B_ARGS
#    adds flags), then the PyTorch anchors, each attempted and its own outcome recorded: PEFT with
#    the base on the GPU (131 GiB of bf16: expect a CUDA OOM while building it), and FSDP2 with CPU
#    offload + PEFT in a child under a host-memory guard (lora_torch.py --impl fsdp2-offload: the
#    bf16 base in host memory; expect the guard or RLIMIT_DATA to stop it on a 128 GB host).
# c. Full fine-tuning of llama-8b (the preset: vocab 50304, 7.39 B), 8 x 2048: nobubble --schedule
#    stream (--ckpt-interval 1 --keep-layers -1 --gpu-layers -1 --stream-slots -1: the 6.2x run of
#    bench/RESULTS.md on an H200), then with `nobubble plan`'s flags for the card (--ckpt-interval 1:
#    on an 80 GB card keeping every activation leaves no layer's state on the GPU), the best of the
#    two against bench/fsdp_offload.py --adamw fused (target >= 5x). fsdp_offload.py
#    first checks the host memory it estimates; where that says "oom" without starting, it runs
#    again with --no-host-check under the guard, so the row holds what happened, not the estimate.
# Every nobubble run also runs under the guard (watchdog only: the host RSS peak, and a kill before
# the kernel's OOM killer would act). Time: --budget (default 570 s, the build included) is shared
# among the parts asked for (a 6, b 7, c 5 parts of what is left when each starts), each row gets
# a fraction of its part's time; a row left with too little is listed as "skipped (time
# budget)", never dropped. The whole benchmark does not fit one 10-minute device call: --only a,
# --only b and --only c are one call each (expected: a ~6 min, b ~7 min, c ~5 min).
# --quick: a CPU smoke check of the script with tiny shapes (llama-tiny), nobubble's side only,
#   with the build there is (it builds only where there is none).
# Model TFLOP/s (bench/lora_torch.py's docstring): LoRA = 4 N_matmul (frozen base: forward and
# activation gradients) + 12 L C T (attention) + 6 N_lora per token; full = 6 N_matmul + 12 L C T.
# Output: $OUT (default bench/out/lora): logs, rows.jsonl (every row), table.md (printed at the end).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
only=a,b,c budget=570 build=1 quick=0 steps=''
while [ $# -gt 0 ]; do
    case "$1" in
        --only) only=$2; shift ;;
        --budget) budget=$2; shift ;;
        --steps) steps=$2; shift ;;
        --no-build) build=0 ;;
        --quick) quick=1 ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) echo "lora_bench.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
for v in "$budget" $steps; do
    case "$v" in ''|*[!0-9]*) echo "lora_bench.sh: --budget and --steps take whole numbers, got '$v'" >&2; exit 2 ;; esac
done
for p in ${only//,/ }; do
    case "$p" in a|b|c) ;; *) echo "lora_bench.sh: --only takes a, b, c or a list of them, got '$p'" >&2; exit 2 ;; esac
done
want() { case ",$only," in *",$1,"*) return 0 ;; esac; return 1; }
OUT=${OUT:-bench/out/lora}
NB_BUILD=${NB_BUILD:-build}
NB=$NB_BUILD/nobubble
PY=${PYTHON:-python3}
LT=bench/lora_torch.py
DATA=${DATA:-data/sotu/train.bin}   # without it: 2 M random GPT-2 token ids written to $OUT/tokens.bin
start=$(date +%s)
left() { echo $(( start + budget - $(date +%s) )); }
stamp() { echo "[$(( $(date +%s) - start )) s]"; }
mkdir -p "$OUT" || exit 1
ROWS=$OUT/rows.jsonl
rm -f "$ROWS" "$OUT/table.md"
if [ ! -f "$DATA" ]; then
    echo "no $DATA: random tokens instead"
    "$PY" bench/torch_anchor.py --make-shard "$OUT/tokens.bin" --tokens 2000000 --seed 1337 || exit 1
    DATA=$OUT/tokens.bin
fi
export NB_LANES_TIMEOUT=${NB_LANES_TIMEOUT:-300}   # a stuck lane fails the run instead of hanging it

if [ $quick = 1 ]; then
    DEV=cpu
    SH8=(--model llama-tiny) SH70=(--model llama-tiny) SHC=(--model llama-tiny)
    PSH8=(--shape tiny) PSH70=(--shape tiny) PSHC=(--shape tiny)
    BA=2 BB=2 BC=2 T=64 R=4 steps=${steps:-6}
    PLAN_MACHINE=(--gpu-mem 0 --host-mem 8G)
else
    DEV=cuda
    SH8=(--model llama-8b --vocab 128256)
    SH70=(--model llama-8b --layers 80 --dim 8192 --heads 64 --kv-heads 8 --ffn 28672 --vocab 128256)
    SHC=(--model llama-8b)
    PSH8=(--shape llama3.1-8b) PSH70=(--shape llama3.1-70b) PSHC=(--shape llama3.1-8b --vocab 50304)
    BA=8 BB=4 BC=8 T=2048 R=16 steps=${steps:-10}
    PLAN_MACHINE=()
fi
LORA=(--lora "$R" --lora-alpha 32 --lora-targets q,k,v,o)
COMMON=(--device "$DEV" --seq "$T" --lr 2e-4 --data "$DATA" --val-data none --eval-every 0 --no-ckpt --no-progress --fresh)

echo "== device $(stamp)"
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader 2>/dev/null || echo "nvidia-smi: not available"
grep -E 'MemTotal|MemAvailable' /proc/meminfo
[ $quick = 1 ] && [ -x "$NB" ] && build=0   # the smoke check uses the build there is
if [ $build = 1 ]; then
    echo "== build $(stamp)"
    [ $quick = 1 ] || source scripts/device_deps.sh use || echo "device_deps.sh: not used"
    make -j"$(nproc)" BUILD="$NB_BUILD" ${NB_MAKE_FLAGS:-} "$NB" > "$OUT/build.log" 2>&1 || { tail -15 "$OUT/build.log"; exit 1; }
fi
[ -x "$NB" ] || { echo "lora_bench.sh: no $NB (build it, or drop --no-build)"; exit 1; }
if [ $quick = 0 ]; then
    "$PY" -c 'import torch, transformers, peft
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}, GPU {torch.cuda.is_available()}), transformers {transformers.__version__}, peft {peft.__version__}")' 2>&1 | tail -n 1 \
        | sed 's/^/python side: /'
fi

# Time: each part gets a share of what is left when it starts (a 6, b 7, c 5 among the parts still
# to run), each row a fraction of what is left of its part (the last row: all of it), at most MAX.
declare -A WEIGHT=([a]=6 [b]=7 [c]=5)
part_end=0
part_begin() {   # PART: sets part_end
    local w=0 p
    for p in a b c; do case ",$only," in *",$p,"*) [[ "$p" < "$1" ]] || w=$((w + WEIGHT[$p])) ;; esac; done
    part_end=$(( $(date +%s) + $(left) * WEIGHT[$1] / w ))
}
cap() {   # FRAC MAX: seconds the next row may take
    awk -v l=$(( part_end - $(date +%s) )) -v f="$1" -v m="$2" 'BEGIN { c = int(l * f); if (c > m) c = m; if (c < 0) c = 0; print c }'
}
skip_row() {   # PART ENGINE LABEL B: a row that had no time left
    "$PY" -c 'import json, sys
print(json.dumps(dict(part=sys.argv[1], engine=sys.argv[2], label=sys.argv[3], batch=int(sys.argv[4]), seq=int(sys.argv[5]),
                      status="skipped (time budget)")))' "$1" "$2" "$3" "$4" "$T" >> "$ROWS"
    echo "   $3: skipped (time budget: $(left) s left)"
}

# nb_row PART TAG LABEL FRAC MAXCAP PSHAPE_FLAGS... -- TRAIN_FLAGS...: one nobubble run under the
# guard (watchdog only), its row in rows.jsonl; returns 0 when it trained
nb_row() {
    local part=$1 tag=$2 label=$3 frac=$4 maxcap=$5; shift 5
    local pshape=() rank=0
    while [ $# -gt 0 ] && [ "$1" != -- ]; do pshape+=("$1"); shift; done
    shift
    case " $* " in *" --lora "*) rank=$R ;; esac
    local c; c=$(cap "$frac" "$maxcap")
    local log=$OUT/$tag.log
    if [ "$c" -lt 20 ]; then skip_row "$part" nobubble "$label" "$(batch_of "$@")"; return 1; fi
    echo "== $part: $label (at most $c s) $(stamp)"
    echo "   $NB train $*" | cut -c1-400
    "$PY" $LT --guard-no-rlimit --guard-timeout "$c" --guard-log "$log" --guard -- "$NB" train "$@" --out "$OUT/run-$tag" 2>/dev/null
    local rc=$?
    grep -E '^(model|memory|lora|stream|allocated|setup|parameters|recompute|throughput|pcie|gpu memory|guard:)' "$log" | sed 's/^/   /'
    grep -v '^guard' "$log" | grep -E 'error:' | tail -n 1 | sed 's/^/   /'
    "$PY" $LT --collect-nobubble "$log" --rc "$rc" --part "$part" --label "$label" "${pshape[@]}" --batch "$(batch_of "$@")" \
        --seq "$T" --rank "$rank" --json "$ROWS" > /dev/null
    tail -n 1 "$ROWS" | grep -q '"status": "ok"'
}
batch_of() { local b=''; while [ $# -gt 0 ]; do [ "$1" = --batch ] && b=$2; shift; done; echo "${b:-1}"; }

# torch_row PART TAG FRAC MAXCAP LORA_TORCH_FLAGS...: lora_torch.py's lines into rows.jsonl
torch_row() {
    local part=$1 tag=$2 frac=$3 maxcap=$4; shift 4
    local c; c=$(cap "$frac" "$maxcap")
    local log=$OUT/$tag.log json=$OUT/$tag.jsonl
    rm -f "$json"
    if [ "$c" -lt 30 ]; then skip_row "$part" pytorch "$tag" "$(batch_of "$@")"; return; fi
    echo "== $part: PyTorch $tag (at most $c s) $(stamp)"
    timeout -k 10 "$c" "$PY" $LT "$@" --part "$part" --json "$json" --deadline $(( $(date +%s) + c - 10 )) > /dev/null 2> "$log"
    local rc=$?
    grep -E '^(setup|peft |fsdp2-offload|to_empty|eager|compile)' "$log" | sed 's/^/   /'
    if [ -s "$json" ]; then
        cat "$json" >> "$ROWS"
        "$PY" -c 'import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    print("   ->", r.get("mode"), r.get("status"), r.get("tokens_per_s", ""), (r.get("error") or "")[:200])' "$json"
    else
        "$PY" -c 'import json, sys
print(json.dumps(dict(part=sys.argv[1], engine="pytorch", label=sys.argv[2], batch=0, seq=int(sys.argv[5]),
                      status=("timed out" if sys.argv[3] in ("124", "137") else "failed (exit %s)" % sys.argv[3]), error=sys.argv[4][:300])))' \
            "$part" "$tag" "$rc" "$(grep -v '^\s*$' "$log" | tail -n 1)" "$T" >> "$ROWS"
        echo "   -> no result line (exit $rc): $(tail -n 1 "$log")"
    fi
}

# plan_flags ARGS...: prints `nobubble plan`'s stream section to the terminal (and $OUT/plan-*.txt)
# and echoes its suggested flags (empty when it has none)
plan_stream() {
    local f=$1; shift
    "$NB" plan "$@" "${PLAN_MACHINE[@]}" > "$f" 2>&1
    echo "   plan (exit $?): $(grep -E '^machine' "$f")" >&2
    sed -n '/^stream/,/^bytes   stream/p' "$f" | sed 's/^/   /' >&2
    grep -E 'error:' "$f" | tail -n 1 | sed 's/^/   /' >&2
    sed -n '/^stream/,/^bytes   stream/p' "$f" | grep -E '^  flags' | head -n 1 | sed 's/^  flags *//'
}

# ---------------------------------------------------------------- a. LoRA 8B resident
if want a; then
    part_begin a; F1=0.4; [ $quick = 1 ] && F1=1
    echo "== a: plan $(stamp) (until $(( part_end - start )) s)"
    "$NB" plan "${SH8[@]}" "${LORA[@]}" --batch "$BA" --seq "$T" "${PLAN_MACHINE[@]}" > "$OUT/plan-a.txt" 2>&1
    sed -n '/^plain/,/^bytes   plain/p' "$OUT/plan-a.txt" | sed 's/^/   /'
    A=("${SH8[@]}" "${LORA[@]}" "${COMMON[@]}" --batch "$BA" --steps "$steps")
    if ! nb_row a a-nb-plain "nobubble plain (resident)" $F1 240 "${PSH8[@]}" -- "${A[@]}" --schedule plain; then
        nb_row a a-nb-stream "nobubble stream, as many layers kept on the GPU as fit" $F1 240 "${PSH8[@]}" -- \
            "${A[@]}" --schedule stream --ckpt-interval 1 --keep-layers -1 --gpu-layers -1 --stream-slots -1
    fi
    [ $quick = 1 ] || torch_row a a-peft 1 420 "${PSH8[@]}" --batch "$BA" --seq "$T" --rank "$R" --alpha 32 --targets q,k,v,o \
        --mode eager,compile --steps 8 --data "$DATA"
fi

# ---------------------------------------------------------------- b. LoRA 70B stream
if want b; then
    part_begin b; F1=0.6; [ $quick = 1 ] && F1=1
    echo "== b: plan $(stamp) (until $(( part_end - start )) s)"
    B=("${SH70[@]}" "${LORA[@]}" --batch "$BB" --seq "$T")
    flags=$(plan_stream "$OUT/plan-b.txt" "${B[@]}" --schedule stream --ckpt-interval 1)
    # shellcheck disable=SC2206  # the plan's flags are words
    if [ -n "$flags" ]; then fl=($flags); note="the plan's flags"; else fl=(--schedule stream --ckpt-interval 1 --gpu-layers -1); note="the plan suggested none"; fi
    nb_row b b-nb-stream "nobubble stream ($note: ${fl[*]}${B_ARGS:+ $B_ARGS})" $F1 360 "${PSH70[@]}" -- \
        "${B[@]}" "${COMMON[@]}" --steps "$(( steps < 6 ? steps : 6 ))" "${fl[@]}" ${B_ARGS:-}
    if [ $quick = 0 ]; then
        torch_row b b-peft-gpu 0.4 120 "${PSH70[@]}" --batch "$BB" --seq "$T" --rank "$R" --alpha 32 --targets q,k,v,o \
            --mode eager --steps 3 --data "$DATA" --label "PEFT, the bf16 base on the GPU"
        torch_row b b-fsdp2-offload 1 240 "${PSH70[@]}" --impl fsdp2-offload --batch "$BB" --seq "$T" --rank "$R" --alpha 32 \
            --targets q,k,v,o --steps 2 --warmup 1 --data "$DATA" --label "FSDP2 CPU offload + PEFT, the bf16 base in host memory"
    fi
fi

# ---------------------------------------------------------------- c. full fine-tuning 8B: stream vs FSDP2
if want c; then
    part_begin c; F1=0.4; [ $quick = 1 ] && F1=1
    echo "== c: plan $(stamp) (until $(( part_end - start )) s)"
    C=("${SHC[@]}" "${COMMON[@]}" --batch "$BC" --steps "$(( steps < 6 ? steps : 6 ))")
    plan_stream "$OUT/plan-c.txt" "${SHC[@]}" --batch "$BC" --seq "$T" --schedule stream --ckpt-interval 1 --keep-layers -1 >/dev/null
    nb_row c c-nb-stream "nobubble stream --ckpt-interval 1 --keep-layers -1 --gpu-layers -1 --stream-slots -1" \
        $F1 200 "${PSHC[@]}" -- "${C[@]}" --schedule stream --ckpt-interval 1 --keep-layers -1 \
        --gpu-layers -1 --stream-slots -1
    # the plan's own flags for this card (activations recomputed, the GPU left to layers' state):
    # on an 80 GB card keeping every layer's activations leaves no layer's state there
    FC=$(plan_stream "$OUT/plan-c2.txt" "${SHC[@]}" --batch "$BC" --seq "$T" --schedule stream --ckpt-interval 1 2>/dev/null)
    [ -n "$FC" ] && nb_row c c-nb-plan "nobubble stream, the plan's flags: $FC" 0.5 200 "${PSHC[@]}" -- "${C[@]}" $FC
    if [ $quick = 0 ]; then
        fj=$OUT/c-fsdp2.jsonl flog=$OUT/c-fsdp2.log; rm -f "$fj" "$OUT/c-fsdp2-estimate.jsonl"
        FS=(bench/fsdp_offload.py --model llama-8b --batch "$BC" --seq "$T" --steps 3 --warmup 1 --adamw fused --json "$fj")
        c=$(cap 1 100000)
        if [ "$c" -ge 60 ]; then
            echo "== c: FSDP2 CPU offload, fused AdamW (at most $c s) $(stamp)"
            "$PY" $LT --guard-timeout "$c" --guard-log "$flog" --guard -- "$PY" "${FS[@]}" --deadline $(( $(date +%s) + c - 15 )) 2>/dev/null
            if grep -q '"host (estimated, not started)"' "$fj" 2>/dev/null; then
                echo "   its estimate says the host is too small: $(grep -o '"error": "[^"]*"' "$fj" | head -n 1)"
                c=$(cap 1 100000); mv "$fj" "$OUT/c-fsdp2-estimate.jsonl"
                echo "== c: FSDP2 again with --no-host-check, under the guard (at most $c s) $(stamp)"
                [ "$c" -ge 60 ] && "$PY" $LT --guard-timeout "$c" --guard-log "$flog" --guard -- "$PY" "${FS[@]}" --no-host-check \
                    --deadline $(( $(date +%s) + c - 15 )) 2>/dev/null
            fi
            grep -E '^(setup|step|fsdp2-cpu-offload|guard:)' "$flog" | sed 's/^/   /'
            "$PY" - "$fj" "$flog" "$ROWS" "$T" <<'PYEOF'
import json, sys
fj, flog, rows, T = sys.argv[1:5]
rec = None
try:
    rec = json.loads([l for l in open(fj) if l.strip()][-1])
except (OSError, ValueError, IndexError):
    pass
g = {}
for l in open(flog, errors="replace"):
    if l.startswith("guard-result "):
        g = json.loads(l[len("guard-result "):])
if rec is None:
    rec = dict(status="oom" if g.get("killed") and not g.get("timed_out") else ("timed out" if g.get("timed_out") else "failed"),
               error=g.get("why") or g.get("tail", ""), batch=8, seq=int(T))
    if g.get("killed") and not g.get("timed_out"):
        rec["oom_where"] = "host (the guard)"
rec.update(part="c", engine="pytorch", label="FSDP2 CPU offload, fused AdamW (bench/fsdp_offload.py)")
try:   # the first attempt stopped at its own estimate: said beside what the second one did
    est = json.loads([l for l in open(fj.replace(".jsonl", "-estimate.jsonl")) if l.strip()][-1])
    rec["note"] = "run with --no-host-check: its estimate said " + str(est.get("error", ""))[:160]
except (OSError, ValueError, IndexError):
    pass
if g.get("rss_peak_gb") is not None:
    rec["host_rss_peak_gb"] = max(rec.get("host_rss_peak_gb") or 0, g["rss_peak_gb"])
open(rows, "a").write(json.dumps(rec) + "\n")
print("   ->", rec.get("status"), rec.get("tokens_per_s", ""), (rec.get("error") or "")[:200])
PYEOF
        else
            skip_row c pytorch "FSDP2 CPU offload, fused AdamW" "$BC"
        fi
    fi
fi

echo "== table $(stamp)"
"$PY" $LT --table "$ROWS" > "$OUT/table.md"
cat "$OUT/table.md"
echo
echo "done in $(( $(date +%s) - start )) s ($(date -u +%Y-%m-%d), $(git log --oneline -1 2>/dev/null | cut -c1-7)$([ $quick = 1 ] && echo ', --quick: CPU, tiny shapes'))"
