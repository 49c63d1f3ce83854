#!/usr/bin/env bash
# nobubble train --init-from HF_DIR (model/transformer_hf.h), the reverse of nobubble export.
# Round trips: a 2-step gpt2-shaped and llama-shaped run is exported, imported with --steps 0
# (the step-0 checkpoint), exported again: both files byte-identical. Then the imported run
# resumes bitwise like a straight --init-from run, and copies of the export made by an
# independent writer (python3, struct only) load: BF16 and F16 (the values rounded as the copy
# rounds them), two shards with an index, GPT-2 without the "transformer." prefix plus the
# mask buffers HF's gpt2 repository holds, Mistral, rms_norm_eps 1e-6 (kept, not refused).
# Llama 3.1 / 3.2 shapes: a llama-tiny with Llama 3's vocabulary (128,256) and Llama 3.1's
# rope_scaling (llama3) imports, trains from a uint32 shard and round-trips byte-identically, tied
# (3.2) too; linear and llama3 scaling change what is trained; a token >= vocab is refused.
# Every refusal: exit code 2, one error line naming the field or tensor.
source "$(dirname "$0")/lib.sh"
command -v python3 >/dev/null || { echo "python3 not found: skipping the import checks"; exit 77; }

cat > "$TMP/st.py" <<'EOF'
# python3 st.py CMD ARGS: safetensors copies and checks with the standard library only.
import json, math, os, struct, sys

def read(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    head = json.loads(b[8:8 + n])
    meta = head.pop("__metadata__", {})
    t = {}
    for k, v in sorted(head.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        s, e = v["data_offsets"]
        t[k] = (v["dtype"], v["shape"], b[8 + n + s:8 + n + e])
    return meta, t

def write(path, tensors, meta=None):
    head, off, blobs = {}, 0, []
    if meta: head["__metadata__"] = meta
    for k, (dt, shape, data) in tensors.items():
        head[k] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(data)]}
        off += len(data); blobs.append(data)
    h = json.dumps(head).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))

def floats(data): return struct.unpack("<%df" % (len(data) // 4), data)
def bf16(x):  # round to nearest even, as torch's .to(bfloat16)
    u = struct.unpack("<I", struct.pack("<f", x))[0]
    return (u + 0x7FFF + ((u >> 16) & 1)) >> 16
def bf16_value(h): return struct.unpack("<f", struct.pack("<I", h << 16))[0]
def f16(x): return struct.unpack("<H", struct.pack("<e", x))[0]
def f16_value(h): return struct.unpack("<e", struct.pack("<H", h))[0]
LOW = {"BF16": (bf16, bf16_value), "F16": (f16, f16_value)}

cmd, a = sys.argv[1], sys.argv[2:]
if cmd == "lower":  # SRC DST DTYPE: every tensor rounded to BF16 or F16
    meta, t = read(a[0]); to, _ = LOW[a[2]]
    write(a[1], {k: (a[2], s, struct.pack("<%dH" % (len(d) // 4), *map(to, floats(d)))) for k, (dt, s, d) in t.items()}, {"format": "pt"})
elif cmd == "check_lower":  # ORIG_F32 IMPORTED_EXPORT DTYPE: the import holds the rounded values exactly
    _, o = read(a[0]); _, i = read(a[1]); to, back = LOW[a[2]]; bad = 0
    for k, (dt, s, d) in o.items():
        want = [back(to(x)) for x in floats(d)]
        got = floats(i[k][2])
        if i[k][0] != "F32" or i[k][1] != s or any(struct.pack("<f", x) != struct.pack("<f", y) for x, y in zip(want, got)): bad += 1; print("differs:", k)
    changed = sum(floats(d) != floats(i[k][2]) for k, (dt, s, d) in o.items())
    print("%d tensors hold the %s-rounded values (%d changed by the rounding)" % (len(o) - bad, a[2], changed)); sys.exit(1 if bad or not changed else 0)
elif cmd == "shard":  # SRC DIR: two shards and model.safetensors.index.json
    _, t = read(a[0]); names = list(t); half = len(names) // 2; wm = {}
    for i, part in enumerate([names[:half], names[half:]]):
        fn = "model-%05d-of-00002.safetensors" % (i + 1)
        write(os.path.join(a[1], fn), {k: t[k] for k in part}, {"format": "pt"})
        wm.update({k: fn for k in part})
    json.dump({"metadata": {"total_size": sum(len(v[2]) for v in t.values())}, "weight_map": wm}, open(os.path.join(a[1], "model.safetensors.index.json"), "w"))
elif cmd == "hf_gpt2":  # SRC DST: names without "transformer.", the attention-mask buffers, the tied head written
    _, t = read(a[0]); out = {}
    for k, v in t.items():
        out[k[len("transformer."):] if k.startswith("transformer.") else k] = v
        if k.endswith("attn.c_attn.weight"):
            out[k[len("transformer."):].replace("c_attn.weight", "bias")] = ("F32", [1, 1, 2, 2], struct.pack("<4f", 1, 0, 1, 1))
    out["lm_head.weight"] = t["transformer.wte.weight"]
    write(a[1], out, {"format": "pt"})
elif cmd == "drop":  # SRC DST NAME: without one tensor
    _, t = read(a[0]); t.pop(a[2]); write(a[1], t)
elif cmd == "add":  # SRC DST NAME DTYPE N: one more 1-D tensor of N zeros
    _, t = read(a[0]); n = int(a[4]); t[a[2]] = (a[3], [n], b"\0" * (n * {"F32": 4, "I32": 4, "F16": 2}[a[3]])); write(a[1], t)
elif cmd == "retype":  # SRC DST NAME DTYPE: a tensor's dtype renamed (same bytes per element)
    _, t = read(a[0]); dt, s, d = t[a[2]]; t[a[2]] = (a[3], s, d); write(a[1], t)
elif cmd == "config":  # SRC DST JSON: config.json with fields set (null removes)
    c = json.load(open(a[0]))
    for k, v in json.loads(a[2]).items():
        if v is None: c.pop(k, None)
        else: c[k] = v
    json.dump(c, open(a[1], "w"), indent=2)
elif cmd == "rows":  # A B NAME ROWS: B's tensor NAME is the first ROWS rows of A's
    _, x = read(a[0]); _, y = read(a[1]); dx, dy = x[a[2]], y[a[2]]
    ok = dy[1][0] == int(a[3]) and dy[1][1:] == dx[1][1:] and dy[2] == dx[2][:len(dy[2])]
    print("%s %s of %s" % (a[2], dy[1], dx[1])); sys.exit(0 if ok else 1)
elif cmd == "field":  # FILE KEY: a config.json field
    print(json.load(open(a[0]))[a[1]])
elif cmd == "same":  # A B: the same tensors (names, dtypes, shapes, bytes), whoever wrote the files
    sys.exit(0 if read(a[0])[1] == read(a[1])[1] else 1)
elif cmd == "grow":  # SRC DST N: the embedding and head tables grown to N rows of zeros
    _, t = read(a[0]); n = int(a[2])
    for k in ("model.embed_tokens.weight", "lm_head.weight"):
        dt, s, d = t[k]; t[k] = (dt, [n, s[1]], d + b"\0" * ((n - s[0]) * s[1] * 4))
    write(a[1], t, {"format": "pt"})
elif cmd == "rope":  # FILE: its RoPE fields, compact
    c = json.load(open(a[0])); print(json.dumps([c.get("rope_theta"), c.get("rope_scaling"), c.get("rope_parameters")], sort_keys=True))
EOF
ST() { python3 "$TMP/st.py" "$@"; }

# A token shard of random ids < 500 in llm.c's layout, so the test needs no download.
python3 - "$TMP/tokens.bin" <<'EOF' || { echo "cannot write the token shard"; exit 1; }
import struct, sys
n, s, ids = 20000, 12345, []
for i in range(n):
    s = (s * 1103515245 + 12345) % 2147483648; ids.append(s % 500)
open(sys.argv[1], "wb").write(struct.pack("<3i", 20240520, 1, n) + b"\0" * 1012 + struct.pack("<%dH" % n, *ids))
EOF
RUN=(--batch 2 --data "$TMP/tokens.bin" --val-data none --no-progress --quiet)

# import DIR OUT [FLAGS]: --init-from DIR --steps 0 into run OUT, exported to OUT_hf
import() {
    local dir=$1 out=$2; shift 2
    $NB train --init-from "$dir" --steps 0 "${RUN[@]}" --out "$TMP/$out" "$@" 2>"$TMP/import.err" \
        && $NB export --ckpt "$TMP/$out" --hf "$TMP/${out}_hf" 2>/dev/null || { cat "$TMP/import.err"; return 1; }
}
# same_export NAME A B: two exports with the same bytes
same_export() {
    cmp -s "$TMP/$2/model.safetensors" "$TMP/$3/model.safetensors" && cmp -s "$TMP/$2/config.json" "$TMP/$3/config.json" \
        && pass "$1: re-export byte-identical" || fail "$1: re-export differs"
}
# refused NAME PATTERN CMD...: exit code 2, exactly one error line, matching PATTERN
refused() {
    local name=$1 pat=$2; shift 2
    "$@" >"$TMP/out" 2>"$TMP/err"
    local rc=$? nerr=$(grep -c "error:" "$TMP/err") line=$(grep -m1 "error:" "$TMP/err")
    if [ $rc -ne 2 ]; then fail "$name: exit code $rc (want 2)"; tail -3 "$TMP/err"; return; fi
    if [ "$nerr" -ne 1 ]; then fail "$name: $nerr error lines (want 1)"; tail -3 "$TMP/err"; return; fi
    echo "$line" | grep -q -- "$pat" && pass "$name: $line" || fail "$name: '$line' does not match '$pat'"
}

for arch in gpt2 llama; do
    $NB train --model $arch-tiny --vocab 500 --steps 2 "${RUN[@]}" --out "$TMP/$arch" || { fail "$arch: train"; continue; }
    $NB export --ckpt "$TMP/$arch" --hf "$TMP/hf_$arch" 2>/dev/null || { fail "$arch: export"; continue; }
    import "$TMP/hf_$arch" "im_$arch" && same_export "$arch: train, export, --init-from --steps 0" "hf_$arch" "im_${arch}_hf" \
        || fail "$arch: import"
    grep -q "imported .* as the step-0 checkpoint" "$TMP/import.err" && pass "$arch: $(grep imported "$TMP/import.err")" \
        || fail "$arch: no import line"
    grep -q "\"preset\": \"hf-$arch\"" "$TMP/im_$arch/ckpt/state.json" && pass "$arch: state.json keeps the imported shape (preset hf-$arch)" \
        || fail "$arch: state.json model"
done

# the step-0 checkpoint resumes (shape from the checkpoint, not a preset) as a straight run trains
$NB train --resume "$TMP/im_llama" --steps 3 --data "$TMP/tokens.bin" --no-progress --quiet 2>/dev/null \
    && $NB train --init-from "$TMP/hf_llama" --steps 3 "${RUN[@]}" --out "$TMP/straight" \
    && st_same "$TMP/im_llama/ckpt/model.safetensors" "$TMP/straight/ckpt/model.safetensors" \
    && st_same "$TMP/im_llama/ckpt/optim.safetensors" "$TMP/straight/ckpt/optim.safetensors" \
    && pass "resume of the step-0 checkpoint: bitwise a straight --init-from run (3 steps)" || fail "resume of the import differs"
$NB train --init-from "$TMP/hf_llama" --steps 3 "${RUN[@]}" --out "$TMP/straight" 2>"$TMP/err" \
    && grep -q "init-from .* is not read again" "$TMP/err" && pass "the same command again resumes, --init-from not read again" \
    || fail "rerun with --init-from: $(cat "$TMP/err")"

# BF16 and F16 copies: the fp32 master weights are the rounded values, exactly
for dt in BF16 F16; do
    mkdir -p "$TMP/$dt" && cp "$TMP/hf_llama/config.json" "$TMP/$dt/" \
        && ST lower "$TMP/hf_llama/model.safetensors" "$TMP/$dt/model.safetensors" $dt && import "$TMP/$dt" "im_$dt" \
        && r=$(ST check_lower "$TMP/hf_llama/model.safetensors" "$TMP/im_${dt}_hf/model.safetensors" $dt) \
        && pass "$dt copy: $r" || fail "$dt copy: $r"
done

# two shards and an index
mkdir -p "$TMP/sharded" && cp "$TMP/hf_gpt2/config.json" "$TMP/sharded/" && ST shard "$TMP/hf_gpt2/model.safetensors" "$TMP/sharded" \
    && import "$TMP/sharded" im_sharded && same_export "sharded checkpoint (2 files + index)" hf_gpt2 im_sharded_hf || fail "sharded"

# GPT-2 as HF's gpt2 repository saves it: no "transformer." prefix, mask buffers, the tied head
mkdir -p "$TMP/hfgpt2" && cp "$TMP/hf_gpt2/config.json" "$TMP/hfgpt2/" && ST hf_gpt2 "$TMP/hf_gpt2/model.safetensors" "$TMP/hfgpt2/model.safetensors" \
    && import "$TMP/hfgpt2" im_hfgpt2 && same_export "GPT-2 without prefix, with attn.bias buffers and lm_head" hf_gpt2 im_hfgpt2_hf \
    || fail "gpt2 repository layout"

# Mistral (Llama's math, sliding window null), rms_norm_eps 1e-6 kept through import and export
mkdir -p "$TMP/mistral" && cp "$TMP/hf_llama/model.safetensors" "$TMP/mistral/" \
    && ST config "$TMP/hf_llama/config.json" "$TMP/mistral/config.json" \
        '{"architectures": ["MistralForCausalLM"], "model_type": "mistral", "sliding_window": 4096, "rms_norm_eps": 1e-6}' \
    && import "$TMP/mistral" im_mistral && cmp -s "$TMP/hf_llama/model.safetensors" "$TMP/im_mistral_hf/model.safetensors" \
    && [ "$(ST field "$TMP/im_mistral_hf/config.json" rms_norm_eps)" = "1e-06" ] \
    && pass "MistralForCausalLM (sliding_window 4096 >= seq), rms_norm_eps 1e-6 kept" || fail "mistral"
$NB train --init-from "$TMP/hf_llama" --seq 32 --steps 0 "${RUN[@]}" --out "$TMP/short" 2>/dev/null \
    && grep -q '"seq": 32' "$TMP/short/ckpt/state.json" && pass "--seq 32 with --init-from" || fail "--seq with --init-from"

bad() { # NAME SRC CONFIG-EDIT: a copy of SRC's directory with config.json fields set, in $TMP/NAME
    mkdir -p "$TMP/$1" && cp "$TMP/$2/model.safetensors" "$TMP/$1/" && ST config "$TMP/$2/config.json" "$TMP/$1/config.json" "$3"
}

# Llama 3.1 / 3.2 shapes. A uint32 shard (llm.c's 20240801 layout) of ids < 128256, half of them
# over 65535; the small llama's export grown to Llama 3's vocabulary (zero rows: no run has to
# initialize a 16M-parameter model to make it) with Llama 3.1's rope_scaling in transformers 4's
# spelling trains from the shard (--no-ckpt). The round trips, whose checkpoints cost what the
# tables weigh, take a 16-wide copy at 128256, and Llama 3.2's tied head (no lm_head.weight) the
# small vocabulary.
python3 - "$TMP/tokens32.bin" <<'EOF' || { echo "cannot write the uint32 shard"; exit 1; }
import struct, sys
n, s, ids = 3000, 777, []
for i in range(n):
    s = (s * 1103515245 + 12345) % 2147483648; ids.append(s % 128256)
open(sys.argv[1], "wb").write(struct.pack("<3i", 20240801, 7, n) + b"\0" * 1012 + struct.pack("<%dI" % n, *ids))
EOF
R32=(--batch 2 --seq 32 --data "$TMP/tokens32.bin" --val-data none --no-progress)
SCALING='"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}'
L31="{\"rope_theta\": 500000.0, \"rope_parameters\": null, $SCALING}"
L31V="${L31%\}}, \"vocab_size\": 128256, \"max_position_embeddings\": 32}"
bad l31 hf_llama "$L31V" && ST grow "$TMP/hf_llama/model.safetensors" "$TMP/l31/model.safetensors" 128256
$NB train --model llama-tiny --dim 16 --vocab 500 --steps 1 "${RUN[@]}" --out "$TMP/d16" && $NB export --ckpt "$TMP/d16" --hf "$TMP/hf_d16" >/dev/null 2>&1 \
    && bad l31n hf_d16 "$L31V" && ST grow "$TMP/hf_d16/model.safetensors" "$TMP/l31n/model.safetensors" 128256 || fail "16-wide llama"
bad l32 hf_llama "${L31%\}}, \"tie_word_embeddings\": true}" \
    && ST drop "$TMP/hf_llama/model.safetensors" "$TMP/l32/model.safetensors" lm_head.weight
$NB train --init-from "$TMP/l31" --steps 2 "${R32[@]}" --no-ckpt --out "$TMP/l31_run" 2>"$TMP/err" >/dev/null \
    && grep -q "vocab 128256 (padded 128256), seq 32" "$TMP/err" \
    && grep -q "theta 500000, llama3 scaling: factor 8, low_freq_factor 1, high_freq_factor 4, original context 8192" "$TMP/err" \
    && [ "$(grep -c '"loss":' "$TMP/l31_run/metrics.jsonl")" = 2 ] \
    && pass "Llama 3.1 shape (vocab 128256, llama3 rope_scaling): --init-from, 2 steps on the uint32 shard; $(grep -o 'llama3 scaling.*' "$TMP/err")" \
    || { fail "Llama 3.1 shape: train"; cat "$TMP/err"; }
for v in l31n l32; do
    import "$TMP/$v" "im_$v" && ST same "$TMP/$v/model.safetensors" "$TMP/im_${v}_hf/model.safetensors" \
        && import "$TMP/im_${v}_hf" "im2_$v" && same_export "$v: import, export, import, export (weights as imported)" "im_${v}_hf" "im2_${v}_hf" \
        || fail "$v: round trip"
done
echo "{\"rope_theta\": 500000.0, $SCALING, \"rope_parameters\": ${SCALING#*: }}" > "$TMP/want.json"
sed -i 's/"rope_parameters": {/&"rope_theta": 500000.0, /' "$TMP/want.json"
r=$(ST rope "$TMP/im_l31n_hf/config.json")
[ "$r" = "$(ST rope "$TMP/want.json")" ] && [ "$(ST field "$TMP/im_l32_hf/config.json" tie_word_embeddings)" = True ] \
    && pass "the export keeps the tied head and the llama3 scaling: $r" || fail "exported RoPE fields: $r"
$NB train --model llama-tiny --dim 16 --vocab 100000 --steps 1 "${R32[@]}" --quiet --out "$TMP/v100k" >/dev/null 2>"$TMP/err"
grep -q "token shard .*tokens32.bin': token 1 is 109615, outside the vocabulary 0..99999" "$TMP/err" \
    && pass "a uint32 token >= the model's vocabulary is refused: $(grep -o "token 1 is.*99999" "$TMP/err")" \
    || fail "token >= vocab: $(cat "$TMP/err")"
# the scaling is what trains: one step from the same weights with and without it differs
# (theta 1e4, head size 16: llama3's bounds leave pairs 0-5 alone and rescale pairs 6 and 7)
bad lin hf_llama '{"rope_scaling": {"type": "linear", "factor": 2.0}, "rope_parameters": null}'
bad l3s hf_llama "{\"rope_parameters\": null, $SCALING}"
for v in lin l3s hf_llama; do $NB train --init-from "$TMP/$v" --steps 1 "${RUN[@]}" --out "$TMP/one_$v" 2>/dev/null || fail "$v: 1 step"; done
! cmp -s "$TMP/one_lin/ckpt/model.safetensors" "$TMP/one_hf_llama/ckpt/model.safetensors" \
    && ! cmp -s "$TMP/one_l3s/ckpt/model.safetensors" "$TMP/one_hf_llama/ckpt/model.safetensors" \
    && import "$TMP/lin" im_lin && [ "$(ST field "$TMP/im_lin_hf/config.json" rope_scaling)" = "{'rope_type': 'linear', 'factor': 2.0}" ] \
    && pass "linear (\"type\", factor 2) and llama3 scaling each change a step's weights; linear exports back" || fail "rope scaling"

import "$TMP/hf_gpt2" im_gpt2_short --seq 32 && r=$(ST rows "$TMP/hf_gpt2/model.safetensors" "$TMP/im_gpt2_short_hf/model.safetensors" transformer.wpe.weight 32) \
    && [ "$(ST field "$TMP/im_gpt2_short_hf/config.json" n_positions)" = 32 ] && pass "GPT-2 --seq 32: the first rows of the position table, $r" \
    || fail "GPT-2 --seq 32: $r"
refused "GPT-2 --seq > n_positions" "\-\-seq 65 exceeds n_positions 64" $NB train --steps 1 "${RUN[@]}" --init-from "$TMP/hf_gpt2" --seq 65

# refusals
T=(train --steps 1 "${RUN[@]}")
bad arch hf_llama '{"architectures": ["BertForMaskedLM"], "model_type": "bert"}'
refused "unknown architecture" "architectures': BertForMaskedLM is not supported" $NB "${T[@]}" --init-from "$TMP/arch"
bad mtype hf_llama '{"architectures": null, "model_type": "qwen2"}'
refused "unknown model_type" "model_type': 'qwen2' is not supported" $NB "${T[@]}" --init-from "$TMP/mtype"
bad rope3 hf_llama '{"rope_scaling": {"rope_type": "llama3", "factor": 8.0}, "rope_parameters": null}'
refused "llama3 rope_scaling without its fields" "rope_scaling' (llama3) has no 'low_freq_factor'" $NB "${T[@]}" --init-from "$TMP/rope3"
bad yarn hf_llama '{"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}'
refused "yarn rope_scaling" "rope_scaling' has rope_type 'yarn', which is not supported" $NB "${T[@]}" --init-from "$TMP/yarn"
bad dyn hf_llama '{"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}}'
refused "dynamic rope_parameters" "rope_parameters' has rope_type 'dynamic', which is not supported" $NB "${T[@]}" --init-from "$TMP/dyn"
bad ropeband hf_llama "${L31/\"high_freq_factor\": 4.0/\"high_freq_factor\": 1.0}"
refused "llama3 high_freq_factor <= low_freq_factor" "rope_scaling' (llama3): high_freq_factor 1 must exceed low_freq_factor 1" $NB "${T[@]}" --init-from "$TMP/ropeband"
bad ropetwo hf_llama '{"rope_scaling": {"type": "linear", "factor": 2.0}}'
refused "rope_scaling and rope_parameters disagree" "describe different RoPE scalings" $NB "${T[@]}" --init-from "$TMP/ropetwo"
bad moe hf_llama '{"architectures": ["MistralForCausalLM"], "model_type": "mistral", "num_local_experts": 8}'
refused "mixture of experts" "num_local_experts' is set: mixture-of-experts" $NB "${T[@]}" --init-from "$TMP/moe"
bad abias hf_llama '{"attention_bias": true}'
refused "attention_bias true" "attention_bias' is true" $NB "${T[@]}" --init-from "$TMP/abias"
bad hdim hf_llama '{"head_dim": 32}'
refused "head_dim != hidden / heads" "head_dim' is 32, but hidden_size / num_attention_heads is 16" $NB "${T[@]}" --init-from "$TMP/hdim"
bad window hf_llama '{"architectures": ["MistralForCausalLM"], "model_type": "mistral", "sliding_window": 32}'
refused "sliding_window < seq" "sliding_window 32 is shorter than the sequence length 64" $NB "${T[@]}" --init-from "$TMP/window"
bad ffn hf_llama '{"intermediate_size": 160}'
refused "misshaped tensor" "gate_proj.weight' has shape \[172, 64\], config.json makes it \[160, 64\]" $NB "${T[@]}" --init-from "$TMP/ffn"
bad vocab hf_gpt2 '{"vocab_size": 20000000}'
refused "vocab_size > 2^24" "vocab_size' is 20000000, more than 16777216" $NB "${T[@]}" --init-from "$TMP/vocab"
bad act hf_gpt2 '{"activation_function": "relu"}'
refused "GPT-2 activation" "activation_function' is 'relu'" $NB "${T[@]}" --init-from "$TMP/act"
bad nolayers hf_llama '{"num_hidden_layers": null}'
refused "missing field" "num_hidden_layers' is missing" $NB "${T[@]}" --init-from "$TMP/nolayers"
bad missing hf_llama '{}' && ST drop "$TMP/hf_llama/model.safetensors" "$TMP/missing/model.safetensors" model.layers.1.mlp.up_proj.weight
refused "missing tensor" "tensor 'model.layers.1.mlp.up_proj.weight' is missing" $NB "${T[@]}" --init-from "$TMP/missing"
bad qbias hf_llama '{}' && ST add "$TMP/hf_llama/model.safetensors" "$TMP/qbias/model.safetensors" model.layers.0.self_attn.q_proj.bias F32 64
refused "Llama bias tensor" "q_proj.bias': attention/MLP biases are not supported" $NB "${T[@]}" --init-from "$TMP/qbias"
bad extra hf_llama '{}' && ST add "$TMP/hf_llama/model.safetensors" "$TMP/extra/model.safetensors" model.layers.2.input_layernorm.weight F32 64
refused "tensor beyond the config" "layers.2.input_layernorm.weight' is not part of a LlamaForCausalLM" $NB "${T[@]}" --init-from "$TMP/extra"
bad i32 hf_llama '{}' && ST retype "$TMP/hf_llama/model.safetensors" "$TMP/i32/model.safetensors" model.norm.weight I32
refused "I32 tensor" "model.norm.weight' has dtype I32; nobubble imports F32, BF16 or F16" $NB "${T[@]}" --init-from "$TMP/i32"
bad cut hf_llama '{}' && f="$TMP/cut/model.safetensors" && head -c $(( $(stat -c %s "$f") - 100 )) "$f" > "$f.x" && mv "$f.x" "$f"
refused "truncated file" "model.safetensors" $NB "${T[@]}" --init-from "$TMP/cut"
bad head hf_llama '{}' && printf '\377\377\377\377' | dd of="$TMP/head/model.safetensors" bs=1 seek=0 conv=notrunc 2>/dev/null
refused "bad header length" "header length" $NB "${T[@]}" --init-from "$TMP/head"
bad json hf_llama '{}' && echo '{"model_type": "llama",' > "$TMP/json/config.json"
refused "bad JSON" "config.json" $NB "${T[@]}" --init-from "$TMP/json"
mkdir -p "$TMP/noweights" && cp "$TMP/hf_llama/config.json" "$TMP/noweights/"
refused "no weights file" "neither model.safetensors nor model.safetensors.index.json" $NB "${T[@]}" --init-from "$TMP/noweights"
refused "no config.json" "config.json: no such file" $NB "${T[@]}" --init-from "$TMP/nothere"
bad shardesc hf_gpt2 '{}' && rm "$TMP/shardesc/model.safetensors" && ST shard "$TMP/hf_gpt2/model.safetensors" "$TMP/shardesc" \
    && sed -i 's/"model-00002-of-00002.safetensors"/"..\/model-00002-of-00002.safetensors"/' "$TMP/shardesc/model.safetensors.index.json"
refused "shard outside the directory" "not a file name in the directory" $NB "${T[@]}" --init-from "$TMP/shardesc"
refused "--model with --init-from" "\-\-model with --init-from" $NB "${T[@]}" --model llama-tiny --init-from "$TMP/hf_llama"
refused "--steps 0 without --init-from" "\-\-steps is 0" $NB train --model gpt2-tiny --steps 0 "${RUN[@]}"
$NB train --help | grep -q -- "--init-from HF_DIR" && pass "--help lists --init-from" || fail "--help"
finish
