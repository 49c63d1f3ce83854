#!/usr/bin/env bash
# What fits on the GPU machine (issue 33): `nobubble plan`'s predictions, then real runs of the two
# largest models it says fit (one H200: ~141 GB of GPU memory, a 128 GB host; runs where there is a
# GPU, prints "skip" and exits 0 elsewhere):
#   plan   - Llama-3.1-70B-shaped LoRA (r=16, alpha 32, q,k,v,o; 80 layers, 8192 wide, 64 heads, 8 KV
#            heads, ffn 28672, vocab 128256: 70.55 B) at 4 x 2048 under --schedule stream
#            --ckpt-interval 1: fits; Llama-3.1-405B-shaped LoRA (126 layers, 16384 wide, 128 heads,
#            ffn 53248): does not fit;
#            llama-14b (13.7 B) full fine-tuning at 8 x 2048, stream --ckpt-interval 1, with
#            clipping, else with --grad-clip 0 (the plan names what that leaves out): fits;
#            Qwen2.5-32B-shaped full fine-tuning (64 layers, 5120 wide, 40 heads, 8 KV heads, ffn
#            27648, vocab 152064: 32.8 B), even with --grad-clip 0: does not fit.
#   lora70b - the 70B LoRA trains --steps-70b steps (20) with the plan's flags;
#   full14b - llama-14b trains --steps-14b steps (10) with the plan's flags.
# Each run: exit 0, every step logged with a finite loss; its `allocated` bytes within 2% of the
# plan's (the same functions size both); the host's peak RSS (VmHWM, polled each second) and the GPU
# memory it used ("gpu memory" line; nvidia-smi's peak beside it) printed next to the plan's bytes,
# RSS within the plan's host bytes + 5% + 3 GiB (the runtime's own memory). Data:
# data/sotu/train.bin, or 2 M random token ids where it is missing. The weights are nobubble's
# seeded init (no checkpoint to read: setup is the init, timed in the "setup" line).
# A watchdog kills a run whose host MemAvailable falls under 2 GiB (so the OOM killer never picks)
# or that passes its time cap.
#   bash tests/gpu_capacity.sh [--only plan,lora70b,full14b] [--steps-70b N] [--steps-14b N]
#                              [--batch-70b B] [--batch-14b B] [--cap S]
# Prints "ok ..." / "FAIL ..." per check and the elapsed time of every phase; exit 1 when a check
# failed. --cap S: a run's time limit (default 420 s). One device call holds at most ~10 minutes:
# run `--only plan,lora70b` and `--only full14b` as two calls where the first does not finish.
source "$(dirname "$0")/lib.sh"
only=plan,lora70b,full14b steps70=20 steps14=10 b70=4 b14=8 cap=420
while [ $# -gt 0 ]; do
    case "$1" in
        --only) only=$2; shift ;;
        --steps-70b) steps70=$2; shift ;;
        --steps-14b) steps14=$2; shift ;;
        --batch-70b) b70=$2; shift ;;
        --batch-14b) b14=$2; shift ;;
        --cap) cap=$2; shift ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) echo "gpu_capacity.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
for v in "$steps70" "$steps14" "$b70" "$b14" "$cap"; do
    case "$v" in ''|*[!0-9]*|0) echo "gpu_capacity.sh: counts are whole numbers >= 1, got '$v'" >&2; exit 2 ;; esac
done
want() { case ",$only," in *",$1,"*) return 0 ;; esac; return 1; }

command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 || { echo "skip: no GPU (nvidia-smi finds none)"; exit 0; }
[ -x "$NB" ] || { echo "skip: no $NB (build it first)"; exit 0; }
"$NB" info 2>/dev/null | grep -q '^cuda .*not in this build' && { echo "skip: $NB has no CUDA backend ($("$NB" info 2>/dev/null | head -n 1))"; exit 0; }
DATA=$ROOT/data/sotu/train.bin
if [ ! -f "$DATA" ]; then   # random GPT-2 token ids: what is trained does not matter here
    DATA=$TMP/tokens.bin
    python3 "$ROOT/bench/torch_anchor.py" --make-shard "$DATA" --tokens 2000000 --seed 1337 || { fail "no token shard"; finish; }
fi

T0=$(date +%s)
phase_t=$T0
phase() { local now; now=$(date +%s); echo "== $1 [$(( now - T0 )) s in; the last phase took $(( now - phase_t )) s]"; phase_t=$now; }
gib() { awk -v b="$1" 'BEGIN { printf "%.2f", b / 1073741824 }'; }
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader
grep -E 'MemTotal|MemAvailable' /proc/meminfo

L70=(--model llama-8b --layers 80 --dim 8192 --heads 64 --kv-heads 8 --ffn 28672 --vocab 128256)
L405=(--model llama-8b --layers 126 --dim 16384 --heads 128 --kv-heads 8 --ffn 53248 --vocab 128256)
M14=(--model llama-14b)
Q32=(--model llama-8b --layers 64 --dim 5120 --heads 40 --kv-heads 8 --ffn 27648 --vocab 152064)
LORA=(--lora 16 --lora-alpha 32 --lora-targets q,k,v,o)

# plan NAME FILE ARGS...: the plan's stream section; sets P_HOST, P_DEV, P_FITS, P_FLAGS
plan() {
    local name=$1 f=$2; shift 2
    "$NB" plan "$@" > "$f" 2>&1
    local rc=$?
    P_HOST='' P_DEV='' P_FITS='' P_FLAGS=''
    read -r P_HOST P_DEV P_FITS < <(awk '/^bytes +stream /{ print $4, $6, $8 }' "$f")
    P_FLAGS=$(sed -n '/^stream/,/^bytes   stream/p' "$f" | grep -E '^  flags' | head -n 1 | sed 's/^  flags *//')
    echo "-- plan: $name (exit $rc)"
    grep -E '^machine' "$f" | sed 's/^/   /'
    sed -n '/^stream/,/^bytes   stream/p' "$f" | sed 's/^/   /'
    grep -E 'error:' "$f" | tail -n 1 | sed 's/^/   /'
}

# run NAME LOG CAP CMD...: CMD in the background, polled each second: VmHWM (the peak RSS), the
# GPU's memory.used, the host's MemAvailable; killed at CAP seconds or under 2 GiB available.
# Sets R_RC, R_HWM (bytes), R_GPU_PEAK (MiB, whole GPU), R_WHY.
run() {
    local name=$1 log=$2 c=$3; shift 3
    local t=$(date +%s)
    "$@" > "$log" 2>&1 &
    local pid=$! hwm=0 gpu=0 v a g
    R_WHY=''
    while kill -0 "$pid" 2>/dev/null; do
        v=$(awk '/^VmHWM:/ { print $2 * 1024 }' "/proc/$pid/status" 2>/dev/null); [ -n "$v" ] && [ "$v" -gt "$hwm" ] && hwm=$v
        g=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -n 1 | tr -dc 0-9)
        [ -n "$g" ] && [ "$g" -gt "$gpu" ] && gpu=$g
        a=$(awk '/^MemAvailable:/ { print $2 }' /proc/meminfo)
        if [ "${a:-9999999}" -lt 2097152 ]; then R_WHY="killed: host MemAvailable $((a / 1024)) MiB"; kill -9 "$pid"; break; fi
        if [ $(( $(date +%s) - t )) -gt "$c" ]; then R_WHY="killed: past its cap of $c s"; kill -9 "$pid"; break; fi
        sleep 1
    done
    wait "$pid"
    R_RC=$? R_HWM=$hwm R_GPU_PEAK=$gpu
    echo "   $name: exit $R_RC after $(( $(date +%s) - t )) s${R_WHY:+ ($R_WHY)}"
}

# check_run NAME DIR LOG STEPS PLAN_HOST PLAN_DEV: the checks of one run
check_run() {
    local name=$1 dir=$2 log=$3 steps=$4 ph=$5 pd=$6
    grep -E '^(memory|lora|stream|allocated|setup|parameters|throughput|pcie|gpu memory)' "$log" | sed 's/^/   /'
    grep -E 'error:' "$log" | tail -n 1 | sed 's/^/   /'
    local n bad
    n=$(grep -c '"loss"' "$dir/metrics.jsonl" 2>/dev/null); n=${n:-0}
    bad=$(grep -o '"loss":[^,}]*' "$dir/metrics.jsonl" 2>/dev/null | grep -vc '"loss":[0-9.e+-]*$')
    [ "$R_RC" = 0 ] && [ "$n" -ge "$steps" ] && [ "${bad:-0}" = 0 ] \
        && pass "$name: trained $n steps, losses finite ($(losses "$dir" | head -n 1) -> $(losses "$dir" | tail -n 1))" \
        || { fail "$name: exit $R_RC, $n of $steps steps logged${R_WHY:+, $R_WHY}"; return; }
    local ah ad used
    read -r ah ad < <(awk '/^allocated/ { print $3, $6 }' "$log")
    used=$(grep -o '^gpu memory  [0-9.]* [KMGT]*i*B' "$log" | awk '{print $3, $4}')
    echo "   memory: host plan $(gib "$ph") GiB, allocated $(gib "${ah:-0}") GiB, peak RSS $(gib "$R_HWM") GiB;" \
         "GPU plan $(gib "$pd") GiB, allocated $(gib "${ad:-0}") GiB, used by the run ${used:-?} (nvidia-smi peak $R_GPU_PEAK MiB)"
    if [ -n "$ah" ] && [ -n "$ph" ]; then
        awk -v a="$ah" -v p="$ph" -v b="$ad" -v q="$pd" 'BEGIN { d1 = (a - p) / p; d2 = (q > 0) ? (b - q) / q : 0;
            if (d1 < 0) d1 = -d1; if (d2 < 0) d2 = -d2; exit !(d1 <= 0.02 && d2 <= 0.02) }' \
            && pass "$name: allocated host and GPU bytes within 2% of the plan's" \
            || fail "$name: allocated (host $ah, device $ad) differs from the plan (host $ph, device $pd) by more than 2%"
    else
        fail "$name: no allocated line or no plan bytes to compare"
    fi
    awk -v r="$R_HWM" -v p="$ph" 'BEGIN { exit !(r <= p * 1.05 + 3 * 1073741824) }' \
        && pass "$name: peak RSS $(gib "$R_HWM") GiB within the plan's host bytes $(gib "$ph") GiB + 5% + 3 GiB" \
        || fail "$name: peak RSS $(gib "$R_HWM") GiB over the plan's host bytes $(gib "$ph") GiB + 5% + 3 GiB"
}

COMMON=(--device cuda --seq 2048 --lr 1e-5 --data "$DATA" --val-data none --eval-every 0 --no-ckpt --no-progress --fresh)
F70='' F14='' H70='' D70='' H14='' D14='' CLIP14=1
if want plan || want lora70b || want full14b; then
    phase "plan"
    plan "Llama-3.1-70B shape, LoRA r=16 q,k,v,o, $b70 x 2048" "$TMP/p70.txt" "${L70[@]}" "${LORA[@]}" --batch "$b70" --seq 2048 \
        --schedule stream --ckpt-interval 1
    F70=$P_FLAGS H70=$P_HOST D70=$P_DEV
    want plan && { [ "$P_FITS" = 1 ] && pass "plan: 70B LoRA fits (host $(gib "$P_HOST") GiB, GPU $(gib "$P_DEV") GiB): $P_FLAGS" \
        || fail "plan: 70B LoRA does not fit (fits='$P_FITS', host $P_HOST, GPU $P_DEV)"; }
    if want plan; then
        plan "Llama-3.1-405B shape, LoRA r=16 q,k,v,o, $b70 x 2048" "$TMP/p405.txt" "${L405[@]}" "${LORA[@]}" --batch "$b70" --seq 2048 \
            --schedule stream --ckpt-interval 1
        [ "$P_FITS" = 0 ] && pass "plan: 405B LoRA does not fit (host $(gib "$P_HOST") GiB, GPU $(gib "$P_DEV") GiB)" \
            || fail "plan: 405B LoRA: fits='$P_FITS' (want 0)"
    fi
    for clip in 1 0; do
        plan "llama-14b full fine-tuning, $b14 x 2048, --grad-clip $clip" "$TMP/p14-$clip.txt" "${M14[@]}" --batch "$b14" --seq 2048 \
            --schedule stream --ckpt-interval 1 --grad-clip $clip
        CLIP14=$clip F14=$P_FLAGS H14=$P_HOST D14=$P_DEV
        [ "$P_FITS" = 1 ] && break
    done
    want plan && { [ "$P_FITS" = 1 ] && pass "plan: llama-14b full fine-tuning fits with --grad-clip $CLIP14 (host $(gib "$H14") GiB, GPU $(gib "$D14") GiB): $F14" \
        || fail "plan: llama-14b full fine-tuning does not fit, even with --grad-clip 0"; }
    if want plan; then
        plan "Qwen2.5-32B shape full fine-tuning, $b14 x 2048, --grad-clip 0" "$TMP/p32.txt" "${Q32[@]}" --batch "$b14" --seq 2048 \
            --schedule stream --ckpt-interval 1 --grad-clip 0
        [ "$P_FITS" = 0 ] && pass "plan: 32B full fine-tuning does not fit, even with --grad-clip 0 (host $(gib "$P_HOST") GiB, GPU $(gib "$P_DEV") GiB)" \
            || fail "plan: 32B full fine-tuning: fits='$P_FITS' (want 0)"
    fi
fi

if want lora70b; then
    phase "lora70b: Llama-3.1-70B shape, LoRA r=16 q,k,v,o, $steps70 steps of $b70 x 2048"
    # shellcheck disable=SC2206  # the plan's flags are words
    fl=($F70); [ ${#fl[@]} -gt 0 ] || fl=(--schedule stream --batch "$b70" --ckpt-interval 1 --gpu-layers -1)
    echo "   flags: ${fl[*]}"
    run lora70b "$TMP/r70.log" "$cap" "$NB" train "${L70[@]}" "${LORA[@]}" "${COMMON[@]}" --steps "$steps70" "${fl[@]}" --out "$TMP/r70"
    check_run "70B LoRA stream" "$TMP/r70" "$TMP/r70.log" "$steps70" "${H70:-0}" "${D70:-0}"
fi

if want full14b; then
    phase "full14b: llama-14b full fine-tuning, $steps14 steps of $b14 x 2048"
    # shellcheck disable=SC2206
    fl=($F14); [ ${#fl[@]} -gt 0 ] || fl=(--schedule stream --batch "$b14" --ckpt-interval 1 --gpu-layers -1)
    echo "   flags: ${fl[*]} --grad-clip $CLIP14"
    run full14b "$TMP/r14.log" "$cap" "$NB" train "${M14[@]}" "${COMMON[@]}" --steps "$steps14" "${fl[@]}" --grad-clip "$CLIP14" --out "$TMP/r14"
    check_run "14B full stream" "$TMP/r14" "$TMP/r14.log" "$steps14" "${H14:-0}" "${D14:-0}"
fi
phase "done"
finish
