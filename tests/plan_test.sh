#!/usr/bin/env bash
# nobubble plan against what a run allocates, on the CPU backend:
#  - plain and stream (with device layers and without clipping too): plan's host bytes equal the
#    bytes the run logs it allocated ("allocated" line) within 1%;
#  - the stream's host terms: --gpu-layers leaves the device layers' moments and gradients out,
#    --grad-clip 0 the layers' gradient slab;
#  - eval allocates the weights and activations only (no gradients or moments);
#  - a plan over the host memory says "does not fit", and the run refuses it before allocating;
#  - LoRA (plain, stream with and without device layers): the base in compute precision where it
#    lives, the adapters' state; under stream the base's load one group at a time (setup) too; Llama-3.1-70B's shape with --lora 16 on a 141 GB GPU and a 128 GB
#    host: plain does not fit, stream does with most layers' base on the GPU;
#  - seqctr and dlrm-dcnv2: plan's host bytes are the run's; where MLPerf's tables fit on a GPU;
#  - llama-8b planned for an 80 GB GPU and a 128 GB host (emulated: no GPU here), from its preset
#    and from a Hugging Face config.json (Llama-3.1-8B's shape): plain does not fit, stream does.
#  - a step in micro-batches (--grad-accum, --micro-batches): the largest batch is a multiple of
#    them, and a schedule that cannot run with the flags is named with its reason.
source "$(dirname "$0")/lib.sh"
need_sotu
C=(--batch 2 --seq 64 --steps 1 --data "$TRAIN" --val-data none --eval-every 0 --no-progress --fresh)
# allocated OUT: the host bytes of a run's "allocated" line; planned SCHED OUT: plan's
allocated() { sed -n 's/^allocated   host \([0-9]*\) bytes.*/\1/p' "$1"; }
planned() { sed -n "s/^bytes   $1 host \([0-9]*\) .*/\1/p" "$2"; }
close() { # close NAME A B: within 1%
    [ -n "$2" ] && [ -n "$3" ] && awk -v a="$2" -v b="$3" 'BEGIN { d = (a - b) / a; if (d < 0) d = -d; exit !(d < 0.01) }' \
        && pass "$1: plan $3 bytes, the run $2" || fail "$1: plan '$3' bytes vs the run's '$2'"
}
for case in "plain|" "stream|" "stream|--gpu-layers 1" "stream|--grad-clip 0" "stream|--gpu-layers 2 --grad-clip 0 --ckpt-interval 1" \
    "plain|--lora 4" "stream|--lora 4" "stream|--lora 4 --gpu-layers 1 --ckpt-interval 1"; do
    sched=${case%%|*} extra=${case#*|} out=$TMP/run
    case $extra in *--lora*) out=$TMP/lrun ;; esac # eval below reads the last run without LoRA
    $NB train "${C[@]}" --model llama-tiny --schedule $sched $extra --out "$out" 2>"$TMP/run.err" >/dev/null \
        || { fail "$sched $extra: the run failed"; tail -3 "$TMP/run.err"; continue; }
    $NB plan --model llama-tiny --batch 2 --seq 64 $extra --gpu-mem 0 --host-mem 64G >"$TMP/plan.out" 2>&1 \
        || { fail "$sched $extra: plan failed"; tail -3 "$TMP/plan.out"; continue; }
    close "llama-tiny $sched $extra: host bytes" "$(allocated "$TMP/run.err")" "$(planned $sched "$TMP/plan.out")"
    cp "$TMP/plan.out" "$TMP/plan-${sched}-$(echo $extra | tr -d ' -')"
done
# LoRA under stream reads its base one layer group at a time at start: the plan counts that
# transient ("setup"), and the run's host check asks for it before allocating anything
read -r lh ls <<< "$(sed -n 's/^bytes   stream host \([0-9]*\) .* setup \([0-9]*\)$/\1 \2/p' "$TMP/plan-stream-lora4")"
if [ -n "$lh" ] && [ "${ls:-0}" -gt 0 ]; then
    expect_error "LoRA stream with host memory for the plan but not its setup" "needs .* of host memory" \
        $NB train "${C[@]}" --model llama-tiny --schedule stream --lora 4 --host-mem-limit $((lh + ls - 4096)) --out "$TMP/lsetup"
    $NB train "${C[@]}" --model llama-tiny --schedule stream --lora 4 --host-mem-limit $((lh + ls)) --out "$TMP/lsetup" >/dev/null 2>&1 \
        && pass "LoRA stream: the plan's $lh bytes + $ls of setup are enough (--host-mem-limit exactly that)" \
        || fail "LoRA stream with --host-mem-limit $((lh + ls)) (the plan + its setup) was refused"
else
    fail "the LoRA stream plan has no setup term: '$(grep '^bytes   stream' "$TMP/plan-stream-lora4")'"
fi
# seqctr and dlrm-dcnv2: the plan's host bytes are the run's (CPU backend), and for a GPU it says
# where the tables go: MLPerf's tables capped at 4 M rows fit a 141 GB GPU; uncapped (40 M) with
# element-wise Adagrad they fit neither memory, with row-wise Adagrad in host memory only
D=(dlrm-dcnv2 --table-cap 1000 --emb-dim 16 --cross-rank 32 --top-mlp 64,32 --batch 64)
for m in "seqctr --batch 64" "${D[*]}"; do
    $NB train --model $m --steps 1 --data synth --val-data none --eval-every 0 --no-progress --fresh --out "$TMP/sc" 2>"$TMP/sc.err" >/dev/null \
        || { fail "$m: the run failed"; tail -3 "$TMP/sc.err"; continue; }
    $NB plan --model $m --gpu-mem 0 --host-mem 64G >"$TMP/scplan.out" 2>&1 || { fail "$m: plan failed"; tail -3 "$TMP/scplan.out"; continue; }
    close "${m%% *} host bytes" "$(allocated "$TMP/sc.err")" "$(planned tables "$TMP/scplan.out")"
done
$NB plan --model dlrm-dcnv2 --batch 6912 --table-cap 4000000 --gpu-mem 139G --host-mem 125G >"$TMP/dl4.out" 2>&1
$NB plan --model dlrm-dcnv2 --batch 6912 --gpu-mem 139G --host-mem 125G >"$TMP/dl40.out" 2>&1
$NB plan --model dlrm-dcnv2 --batch 6912 --emb-optim adagrad --gpu-mem 139G --host-mem 125G >"$TMP/dl40r.out" 2>&1
grep -q "^--emb-place gpu  fits" "$TMP/dl4.out" && grep -q "^flags   --batch 6912$" "$TMP/dl4.out" \
    && grep -q "^--emb-place gpu  does not fit" "$TMP/dl40.out" && grep -q "^--emb-place host does not fit" "$TMP/dl40.out" \
    && grep -q "^flags   none fits" "$TMP/dl40.out" && grep -q "^--emb-place host fits" "$TMP/dl40r.out" \
    && pass "dlrm-dcnv2 at B 6,912 on a 141 GB GPU + 128 GB host: 4 M-row tables on the GPU; 40 M rows fit with row-wise Adagrad only" \
    || fail "dlrm-dcnv2 plans: $(cat "$TMP/dl4.out" "$TMP/dl40.out" "$TMP/dl40r.out")"
# eval plans the forward only (the weights and activations): no gradients or moments, so a model
# trained with --schedule stream can be evaluated where its training state would not fit
$NB eval --ckpt "$TMP/run" --data "$VAL" --batches 2 >/dev/null 2>"$TMP/eval.err" || { fail "eval of the stream run"; tail -3 "$TMP/eval.err"; }
ev=$(allocated "$TMP/eval.err") tr=$(planned plain "$TMP/plan-plain-")
[ -n "$ev" ] && [ -n "$tr" ] && [ $((ev * 3)) -lt "$tr" ] \
    && pass "eval allocates $ev host bytes, plain training $tr (weights and activations only)" \
    || fail "eval's host bytes '$ev' vs plain training's '$tr'"
# each option's host term: the gradient slab of 4 layers of 4 (--grad-clip 0) or of 1 (--gpu-layers 1)
base=$(planned stream "$TMP/plan-stream-") g1=$(planned stream "$TMP/plan-stream-gpulayers1") nc=$(planned stream "$TMP/plan-stream-gradclip0")
[ -n "$base" ] && [ -n "$g1" ] && [ -n "$nc" ] && [ "$g1" -lt "$base" ] && [ "$nc" -lt "$base" ] \
    && grep -q "left out of host memory: --gpu-layers" "$TMP/plan-stream-gpulayers1" \
    && grep -q "left out of host memory: --grad-clip 0" "$TMP/plan-stream-gradclip0" \
    && pass "stream host bytes: $base, --gpu-layers 1 $g1, --grad-clip 0 $nc (the plan names what each leaves out)" \
    || fail "stream host terms: $base / $g1 / $nc"
# over the host: plan says so, the run refuses before allocating
$NB plan --model llama-tiny --batch 2 --seq 64 --gpu-mem 0 --host-mem 20M >"$TMP/small.out" 2>&1
grep -q "^stream  does not fit" "$TMP/small.out" && pass "plan: stream does not fit 20 MiB of host memory" \
    || fail "plan with --host-mem 20M: $(head -5 "$TMP/small.out")"
expect_error "a stream run over --host-mem-limit" "needs .* of host memory but 20.00 MiB is available" \
    $NB train "${C[@]}" --model llama-tiny --schedule stream --host-mem-limit 20971520 --out "$TMP/small"
# llama-8b for an 80 GB GPU and a 128 GB host: the preset, and Llama-3.1-8B's config.json
$NB plan --model llama-8b --batch 8 --seq 2048 --ckpt-interval 1 --gpu-mem 80G --host-mem 128G >"$TMP/8b.out" 2>&1
grep -q "^plain   does not fit" "$TMP/8b.out" && grep -q "^stream  fits" "$TMP/8b.out" \
    && grep -q "flags  --schedule stream --batch 8 --seq 2048 --gpu-layers [1-9]" "$TMP/8b.out" \
    && pass "llama-8b, B x T = 8 x 2048, 80 GB GPU, 128 GB host: plain does not fit, stream does with device layers" \
    || fail "llama-8b plan: $(cat "$TMP/8b.out")"
mkdir -p "$TMP/l31"
cat >"$TMP/l31/config.json" <<'EOF'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
 "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
 "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "tie_word_embeddings": false,
 "hidden_act": "silu", "attention_bias": false, "mlp_bias": false, "head_dim": 128, "torch_dtype": "bfloat16",
 "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192, "rope_type": "llama3"}}
EOF
$NB plan --config "$TMP/l31/config.json" --batch 8 --seq 2048 --ckpt-interval 1 --gpu-mem 80G --host-mem 128G >"$TMP/l31.out" 2>&1
grep -q "vocab 128256" "$TMP/l31.out" && grep -q "^stream  fits" "$TMP/l31.out" \
    && pass "Llama-3.1-8B config.json: $(grep -m1 '^stream' "$TMP/l31.out")" || fail "Llama-3.1-8B plan: $(cat "$TMP/l31.out")"
# LoRA on Llama-3.1-70B's shape (a 141 GB GPU, a 128 GB host): the bf16 base (2 bytes/param) of
# most layers on the GPU, the rest streamed from pinned host memory; plain holds an fp32 host copy
mkdir -p "$TMP/l70"
sed 's/"hidden_size": 4096, "intermediate_size": 14336/"hidden_size": 8192, "intermediate_size": 28672/; s/"num_hidden_layers": 32, "num_attention_heads": 32/"num_hidden_layers": 80, "num_attention_heads": 64/' \
    "$TMP/l31/config.json" >"$TMP/l70/config.json"
$NB plan --config "$TMP/l70/config.json" --lora 16 --batch 4 --seq 2048 --ckpt-interval 1 --gpu-mem 141GB --host-mem 128G >"$TMP/l70.out" 2>&1
grep -q "layers 80, dim 8192" "$TMP/l70.out" && grep -q "^plain   does not fit" "$TMP/l70.out" && grep -q "^stream  fits" "$TMP/l70.out" \
    && grep -q "flags  --schedule stream --batch 4 --seq 2048 --gpu-layers [1-7][0-9] " "$TMP/l70.out" \
    && pass "Llama-3.1-70B --lora 16, B x T = 4 x 2048, 141 GB GPU, 128 GB host: $(grep -m1 '^stream' "$TMP/l70.out"), $(grep -o 'gpu-layers [0-9]*' "$TMP/l70.out") of 80" \
    || fail "Llama-3.1-70B LoRA plan: $(cat "$TMP/l70.out")"
# a plan reads no tokens: it runs where there is no data at all (a fresh GPU machine)
mkdir -p "$TMP/nodata" && (cd "$TMP/nodata" && NB_DATA_DIR="$TMP/nodata" $NB plan --model llama-8b --batch 8 --gpu-mem 80G --host-mem 128G) \
    >"$TMP/nodata.out" 2>&1 && grep -q "^bytes   stream .* fits 1" "$TMP/nodata.out" \
    && pass "plan with no token shards anywhere: $(grep -m1 '^stream' "$TMP/nodata.out")" \
    || fail "plan without data: $(tail -n 2 "$TMP/nodata.out")"
# a step split into micro-batches (--grad-accum, seqctr's --micro-batches): the largest batch is a
# multiple of them (the trainer takes no other), and a schedule that cannot run with the flags is
# named with its reason instead of ending the plan
$NB plan --model llama-tiny --batch 9 --seq 64 --grad-accum 3 --gpu-mem 0 --host-mem 400M >"$TMP/ga.out" 2>&1
rc=$? big=$(sed -n 's/^  largest batch that fits: \([0-9]*\)$/\1/p' "$TMP/ga.out" | head -1)
fits_at() { $NB plan --model llama-tiny --batch "$1" --seq 64 --grad-accum 3 --gpu-mem 0 --host-mem 400M 2>&1 | grep -q "^plain   fits"; }
[ $rc = 0 ] && [ -n "$big" ] && [ $((big % 3)) = 0 ] && fits_at "$big" && ! fits_at $((big + 3)) \
    && grep -q "^stream  does not run with these flags: it does not accumulate micro-batches" "$TMP/ga.out" \
    && pass "plan --grad-accum 3 in 400 MiB: largest batch $big (a multiple of 3; $((big + 3)) does not fit); stream named as not running with it" \
    || fail "plan --grad-accum 3: exit $rc, largest '$big': $(tail -n 3 "$TMP/ga.out")"
$NB plan --model seqctr --batch 64 --emb-shard row --schedule pipe --micro-batches 4 --gpu-mem 0 --host-mem 64G >"$TMP/mb.out" 2>&1
rc=$? big=$(sed -n 's/^  largest batch that fits: \([0-9]*\)$/\1/p' "$TMP/mb.out" | head -1)
[ $rc = 0 ] && [ -n "$big" ] && [ $((big % 4)) = 0 ] && [ "$big" -ge 64 ] \
    && pass "plan seqctr --micro-batches 4: largest batch $big (a multiple of 4)" \
    || fail "plan seqctr --micro-batches 4: exit $rc: $(tail -n 3 "$TMP/mb.out")"
finish
