#!/usr/bin/env bash
# LoRA (issue 33, point 1) through the CLI on the CPU, on a Hugging Face import (a llama-shaped
# run exported with `nobubble export --hf`) and on a GPT-2 layout from nobubble's seeded init:
#  - step 1's loss (B = 0) is the base's: the same run without --lora logs the same bits;
#  - the checkpoint holds the adapters and their AdamW moments only;
#  - --schedule erase gives plain's bits (both --detach 1); 2 ranks (mpirun) give --grad-accum 2's;
#  - --schedule stream (the frozen base streamed, group by group from the import or the seeded
#    init) gives plain's bits: losses, adapters and their moments, with --gpu-layers, one slot,
#    --ckpt-interval recompute, across a stop and resume, and resuming plain's checkpoint;
#  - a run stopped after 2 steps and started again resumes to the straight run's bits;
#  - export --hf writes a PEFT adapter (names, shapes, adapter_config.json); export --merge loads
#    back with --init-from and evaluates to the LoRA run's loss;
#  - refusals: --lora-dropout != 0, targets a layout has no matrix for, a resume
#    whose base (the --init-from folder) changed since.
# The math itself (finite differences, zero B, merge) is tests/test_lora.c's.
source "$(dirname "$0")/lib.sh"
need_sotu
M=(--vocab 32000 --dim 32 --heads 4 --kv-heads 2 --ffn 64 --layers 2 --seq 32)
mask_shard "$TRAIN" "$TMP/train.bin" 20000 none
mask_shard "$VAL" "$TMP/val.bin" 5000 none
$NB train --model llama-tiny "${M[@]}" --batch 4 --steps 2 --data "$TMP/train.bin" --val-data none --no-progress --quiet \
    --out "$TMP/base" 2>"$TMP/base.log" && $NB export --ckpt "$TMP/base" --hf "$TMP/hf" >/dev/null 2>&1 \
    || { cat "$TMP/base.log"; fail "the llama-shaped model to import"; finish; }
F=(--init-from "$TMP/hf" --batch 4 --steps 4 --data "$TMP/train.bin" --val-data "$TMP/val.bin" --eval-every 2
   --eval-batches 2 --no-progress --threads 1 --lr 1e-2)
L=(--lora 4 --lora-alpha 8 --lora-targets q,k,v,o,gate,up,down)
run() { # TAG ARGS...: a run into $TMP/TAG
    local tag=$1; shift
    $NB train "$@" --out "$TMP/$tag" >"$TMP/$tag.log" 2>&1 || { fail "$tag: exit $?"; tail -3 "$TMP/$tag.log"; }
}
step1() { head -n 1 "$1/metrics.jsonl" | grep -o '"loss":[0-9.e+-]*'; }

run full "${F[@]}" --steps 1
run lora "${F[@]}" "${L[@]}"
[ -n "$(step1 "$TMP/full")" ] && [ "$(step1 "$TMP/full")" = "$(step1 "$TMP/lora")" ] \
    && pass "imported llama: step 1 with LoRA (B = 0) gives the base's loss bit for bit ($(step1 "$TMP/lora"))" \
    || fail "step 1: LoRA $(step1 "$TMP/lora") vs base $(step1 "$TMP/full")"
names=$(python3 - "$TMP/lora/ckpt" <<'EOF'
import json, struct, sys
def names(p):
    f = open(p, 'rb'); n = struct.unpack('<Q', f.read(8))[0]
    return sorted(k for k in json.loads(f.read(n)) if k != '__metadata__')
m, o = names(sys.argv[1] + '/model.safetensors'), names(sys.argv[1] + '/optim.safetensors')
ok = len(m) == 2 * 2 * 7 and all('.lora.' in k for k in m) and len(o) == 2 * len(m)
print('ok' if ok else 'bad: %s' % m[:4])
EOF
)
[ "$names" = ok ] && pass "the checkpoint holds the 28 adapters and their moments only" || fail "checkpoint tensors: $names"

run dplain "${F[@]}" "${L[@]}" --detach 1
run erase "${F[@]}" "${L[@]}" --detach 1 --schedule erase
same_state "LoRA: --schedule erase vs plain (both --detach 1)" "$TMP/dplain" "$TMP/erase"
if command -v mpirun >/dev/null; then
    run accum "${F[@]}" "${L[@]}" --grad-accum 2
    mpirun --oversubscribe --allow-run-as-root -np 2 $NB train "${F[@]}" "${L[@]}" --out "$TMP/ranks" >"$TMP/ranks.log" 2>&1 \
        || { fail "mpirun -np 2"; tail -5 "$TMP/ranks.log"; }
    same_state "LoRA: 2 ranks vs one rank with --grad-accum 2" "$TMP/accum" "$TMP/ranks"
else
    echo "note: no mpirun: the ranks check is skipped (scripts/setup.sh installs openmpi-bin)"
fi
run again "${F[@]}" "${L[@]}" --stop-after 2
run again "${F[@]}" "${L[@]}"
same_state "LoRA: stopped after 2 steps, the same command again, vs straight" "$TMP/lora" "$TMP/again"

# stream: the imported base streamed through the slots; the adapters train where plain trains them
for case in "s|" "sg|--gpu-layers 1" "s1|--stream-slots 1" "sk|--ckpt-interval 1 --keep-layers 1" "sgk|--gpu-layers 1 --ckpt-interval 1"; do
    tag=${case%%|*} extra=${case#*|}
    run "$tag" "${F[@]}" "${L[@]}" --schedule stream $extra
    same_state "LoRA: --schedule stream ${extra:-(2 slots)} vs plain (imported base)" "$TMP/lora" "$TMP/$tag"
done
grep -q "per step: [1-9][0-9]* layer uploads.* 0 B down" "$TMP/s1.log" && pass "LoRA stream, one slot: only the base goes up, nothing comes down ($(grep -o 'per step: .*down' "$TMP/s1.log"))" \
    || fail "LoRA stream copies: $(grep 'per step' "$TMP/s1.log")"
run sagain "${F[@]}" "${L[@]}" --schedule stream --gpu-layers 1 --stop-after 2
run sagain "${F[@]}" "${L[@]}" --schedule stream --gpu-layers 1
same_state "LoRA: --schedule stream stopped after 2 steps, resumed, vs plain straight" "$TMP/lora" "$TMP/sagain"
# the base's CRC is the same bits whichever loaded it (whole, or group by group for stream)
run cross "${F[@]}" "${L[@]}" --stop-after 2
run cross "${F[@]}" "${L[@]}" --schedule stream --stream-slots 1
same_state "LoRA: plain stopped after 2 steps, resumed under --schedule stream, vs plain straight" "$TMP/lora" "$TMP/cross"

# export: a PEFT adapter, and the merged model back through --init-from
$NB export --ckpt "$TMP/lora" --hf "$TMP/adapter" >"$TMP/export.log" 2>&1 || { fail "export (adapter)"; cat "$TMP/export.log"; }
got=$(python3 - "$TMP/adapter" "$TMP/hf" <<'EOF'
import json, struct, sys
d = sys.argv[1]
cfg = json.load(open(d + '/adapter_config.json'))
f = open(d + '/adapter_model.safetensors', 'rb'); n = struct.unpack('<Q', f.read(8))[0]
h = {k: v['shape'] for k, v in json.loads(f.read(n)).items() if k != '__metadata__'}
want = {}
for l in range(2):
    for mod, parent, out, inp in [('q_proj', 'self_attn', 32, 32), ('k_proj', 'self_attn', 16, 32), ('v_proj', 'self_attn', 16, 32),
                                  ('o_proj', 'self_attn', 32, 32), ('gate_proj', 'mlp', 64, 32), ('up_proj', 'mlp', 64, 32),
                                  ('down_proj', 'mlp', 32, 64)]:
        p = 'base_model.model.model.layers.%d.%s.%s.' % (l, parent, mod)
        want[p + 'lora_A.weight'] = [4, inp]
        want[p + 'lora_B.weight'] = [out, 4]
ok = (h == want and cfg['r'] == 4 and cfg['lora_alpha'] == 8 and cfg['peft_type'] == 'LORA'
      and sorted(cfg['target_modules']) == sorted(['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj'])
      and cfg['base_model_name_or_path'].rstrip('/').endswith('/hf'))
print('ok' if ok else 'bad: %s %s' % (sorted(set(h) ^ set(want))[:3], cfg))
EOF
)
[ "$got" = ok ] && pass "export --hf: a PEFT adapter (28 tensors with peft's names and shapes, adapter_config.json)" || fail "adapter: $got"
$NB export --ckpt "$TMP/lora" --hf "$TMP/merged" --merge >/dev/null 2>&1 || fail "export --merge"
$NB train --init-from "$TMP/merged" --steps 0 --batch 4 --data "$TMP/train.bin" --val-data "$TMP/val.bin" --eval-batches 2 \
    --no-progress --threads 1 --out "$TMP/mload" >"$TMP/mload.log" 2>&1 || { fail "--init-from the merged export"; tail -3 "$TMP/mload.log"; }
# the merged weights round W + s B A once (fp32), the LoRA run adds its branch at run time: equal
# to the printed digits
a=$($NB eval --ckpt "$TMP/lora" --batches 2 --threads 1 2>/dev/null | grep -o 'loss [0-9.]* nats' | awk '{print $2}')
b=$($NB eval --ckpt "$TMP/mload" --batches 2 --threads 1 2>/dev/null | grep -o 'loss [0-9.]* nats' | awk '{print $2}')
want=$(grep -o 'validation loss [0-9.]*' "$TMP/lora.log" | tail -n 1 | awk '{print $3}')
[ -n "$a" ] && [ "$a" = "$b" ] && [ "$a" = "$want" ] \
    && pass "eval of the LoRA run ($a, training's last validation loss) = eval of export --merge imported again ($b)" \
    || fail "merged model's loss '$b' vs the LoRA run's '$a' (training's last: '$want')"
# eval and sample of a stream LoRA run stream its base too (a 70B base is never whole in fp32);
# that run's state is plain's, bit for bit (above), so are its loss and its samples
c=$($NB eval --ckpt "$TMP/s1" --batches 2 --threads 1 2>"$TMP/seval.log" | grep -o 'loss [0-9.]* nats' | awk '{print $2}')
[ -n "$c" ] && [ "$c" = "$a" ] && grep -q '^stream ' "$TMP/seval.log" \
    && pass "eval of a --schedule stream LoRA checkpoint runs stream and gives plain's loss ($c)" \
    || fail "eval of the stream LoRA checkpoint: '$c' vs plain's '$a' ($(grep -c '^stream ' "$TMP/seval.log") stream lines)"

# a resume re-reads the base from its folder: one whose weights changed since is refused
cp -r "$TMP/hf" "$TMP/hf2"
F2=("${F[@]}"); F2[1]=$TMP/hf2
run moved "${F2[@]}" "${L[@]}" --stop-after 2
cp "$TMP/merged/model.safetensors" "$TMP/hf2/model.safetensors"
expect_error "resume on a base whose weights changed" "not the one it was trained on" $NB train "${F2[@]}" "${L[@]}" --out "$TMP/moved"
expect_error "export on a base whose weights changed" "not the one it was trained on" $NB export --ckpt "$TMP/moved" --hf "$TMP/movedx"

# GPT-2 layout from the seeded init: c_attn / c_proj / c_fc, the base written beside the adapter
G=(--model gpt2-tiny --dim 32 --heads 2 --layers 2 --seq 32 --batch 4 --steps 2 --data "$TMP/train.bin" --val-data none
   --no-progress --threads 1)
run gfull "${G[@]}" --steps 1
run glora "${G[@]}" --lora 2 --lora-targets q,k,v,o,up,down
run gslora "${G[@]}" --lora 2 --lora-targets q,k,v,o,up,down --schedule stream
sa=$($NB sample --ckpt "$TMP/glora" --tokens 8 --threads 1 2>/dev/null) sb=$($NB sample --ckpt "$TMP/gslora" --tokens 8 --threads 1 2>/dev/null)
[ -n "$sa" ] && [ "$sa" = "$sb" ] && pass "sample of a --schedule stream LoRA checkpoint (streamed again) = plain's: '$(echo "$sa" | tr '\n' ' ' | head -c 40)'" \
    || fail "sample: stream '$sb' vs plain '$sa'"
[ "$(step1 "$TMP/gfull")" = "$(step1 "$TMP/glora")" ] && pass "gpt2: step 1 with LoRA gives the base's loss bit for bit" \
    || fail "gpt2 step 1: $(step1 "$TMP/glora") vs $(step1 "$TMP/gfull")"
$NB export --ckpt "$TMP/glora" --hf "$TMP/gad" >/dev/null 2>&1 && [ -f "$TMP/gad/base/model.safetensors" ] \
    && grep -q '"c_attn"' "$TMP/gad/adapter_config.json" && grep -q '"fan_in_fan_out": true' "$TMP/gad/adapter_config.json" \
    && pass "gpt2 export: adapter (c_attn, c_proj, c_fc) and the seeded base in OUT/base" || fail "gpt2 adapter export"

run gstream "${G[@]}" --lora 2 --lora-targets q,k,v,o,up,down --schedule stream --ckpt-interval 1
same_state "gpt2 (seeded base, tied head): --schedule stream --ckpt-interval 1 vs plain" "$TMP/glora" "$TMP/gstream"
expect_error "--lora-dropout 0.1" "lora-dropout" $NB train "${G[@]}" --lora 2 --lora-dropout 0.1 --out "$TMP/x2"
expect_error "gate on GPT-2" "gate\|GPT-2" $NB train "${G[@]}" --lora 2 --lora-targets gate --out "$TMP/x3"
expect_error "part of q,k,v on GPT-2" "q,k,v" $NB train "${G[@]}" --lora 2 --lora-targets q,v --out "$TMP/x4"

# export of an adapter reads its on-disk base group by group (only to check it): under a data limit
# below the base's fp32 size (146 M parameters: 584 MB) it still exports, the same bytes as without
B=(--model llama-tiny --vocab 32000 --dim 512 --heads 8 --kv-heads 4 --ffn 4096 --layers 16 --seq 32 --batch 1 --steps 1
   --data "$TMP/train.bin" --val-data none --no-progress --quiet)
run bigbase "${B[@]}" --ckpt-weights-only && $NB export --ckpt "$TMP/bigbase" --hf "$TMP/bighf" --dtype bf16 >/dev/null 2>&1 \
    && run biglora --init-from "$TMP/bighf" --seq 32 --batch 1 --steps 1 --data "$TMP/train.bin" --val-data none --no-progress \
        --quiet --lora 2 && $NB export --ckpt "$TMP/biglora" --hf "$TMP/bigad" >/dev/null 2>&1 || fail "the 146 M base and its adapter"
( ulimit -d 409600 && $NB export --ckpt "$TMP/biglora" --hf "$TMP/bigad2" ) >"$TMP/bigad2.log" 2>&1 \
    && cmp -s "$TMP/bigad/adapter_model.safetensors" "$TMP/bigad2/adapter_model.safetensors" \
    && pass "export of a 146 M base's adapter under a 400 MiB data limit (the base is 584 MB in fp32): the same adapter" \
    || { fail "export of the adapter under a 400 MiB data limit"; tail -n 2 "$TMP/bigad2.log"; }
# the merged model too is made a group at a time (the merge's math: the eval equality above)
( ulimit -d 409600 && $NB export --ckpt "$TMP/biglora" --hf "$TMP/bigmerged" --merge --dtype bf16 ) >"$TMP/bigm.log" 2>&1 \
    && $NB train --init-from "$TMP/bigmerged" --seq 32 --batch 1 --steps 0 --data "$TMP/train.bin" --val-data none --no-progress \
        --quiet --out "$TMP/bigm-load" >"$TMP/bigm-load.log" 2>&1 \
    && pass "export --merge of the 146 M model under a 400 MiB data limit, and --init-from reads it back" \
    || { fail "export --merge under a 400 MiB data limit"; tail -n 2 "$TMP/bigm.log" "$TMP/bigm-load.log"; }
finish
