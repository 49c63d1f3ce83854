#!/usr/bin/env bash
# nobubble train --init-from HF_DIR (model/transformer_hf.h), the reverse of nobubble export.
# Round trips: a 2-step gpt2-shaped and llama-shaped run is exported, imported with --steps 0
# (the step-0 checkpoint), exported again: both files byte-identical; BF16 / F16 checkpoints export
# to the same bytes; a Mistral checkpoint exports as MistralForCausalLM with its fields; tokenizer
# files are copied; sample --chat's prompt ids are tokenize --chat's. Then the imported run
# resumes bitwise like a straight --init-from run, and copies of the export made by an
# independent writer (python3, struct only) load: BF16 and F16 (the values rounded as the copy
# rounds them), two shards with an index, GPT-2 without the "transformer." prefix plus the
# mask buffers HF's gpt2 repository holds, Mistral, rms_norm_eps 1e-6 (kept, not refused).
# Qwen2 (q/k/v biases) and Qwen3 (q/k norm, head_dim 24 != hidden / heads) checkpoints written by
# the same python writer with random values: imported, exported with the same tensors, trained 2
# steps and round-tripped, the Qwen3 import resumed bitwise and trained by the stream schedule
# bitwise like the plain one; eval's loss against transformers' formulas written out in Python.
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
elif cmd == "field":  # FILE KEY...: config.json fields, one line
    c = json.load(open(a[0])); print(" ".join(str(c[k]) for k in a[1:]))
elif cmd == "qwen":  # DIR qwen2|qwen3: a tiny random checkpoint of that class (tied head, Qwen's rope_theta)
    q3, V, C, L, H, KV, F = a[1] == "qwen3", 500, 64, 2, 4, 2, 96
    hd, seed = 24 if q3 else C // H, [7 if q3 else 3]
    def rnd(n, mean, scale):  # uniform in mean +- scale, a 64-bit LCG
        out = []
        for _ in range(n):
            seed[0] = (seed[0] * 6364136223846793005 + 1442695040888963407) % 2**64
            out.append(mean + scale * ((seed[0] >> 11) / 2.0**52 - 1))
        return ("F32", [n], struct.pack("<%df" % n, *out))
    def mat(r, c, scale): dt, _, d = rnd(r * c, 0.0, scale); return (dt, [r, c], d)
    t = {"model.embed_tokens.weight": mat(V, C, 0.5)}
    for l in range(L):
        p = "model.layers.%d." % l
        t[p + "input_layernorm.weight"] = rnd(C, 1.0, 0.2)
        for nm, rows in (("q", H * hd), ("k", KV * hd), ("v", KV * hd)):
            t[p + "self_attn.%s_proj.weight" % nm] = mat(rows, C, 0.15)
            if not q3: t[p + "self_attn.%s_proj.bias" % nm] = rnd(rows, 0.0, 0.3)
        if q3: t[p + "self_attn.q_norm.weight"], t[p + "self_attn.k_norm.weight"] = rnd(hd, 1.0, 0.3), rnd(hd, 1.0, 0.3)
        t[p + "self_attn.o_proj.weight"] = mat(C, H * hd, 0.1)
        t[p + "post_attention_layernorm.weight"] = rnd(C, 1.0, 0.2)
        t[p + "mlp.gate_proj.weight"], t[p + "mlp.up_proj.weight"] = mat(F, C, 0.15), mat(F, C, 0.15)
        t[p + "mlp.down_proj.weight"] = mat(C, F, 0.1)
    t["model.norm.weight"] = rnd(C, 1.0, 0.2)
    os.makedirs(a[0], exist_ok=True)
    write(os.path.join(a[0], "model.safetensors"), t, {"format": "pt"})
    c = {"architectures": ["Qwen3ForCausalLM" if q3 else "Qwen2ForCausalLM"], "model_type": a[1], "vocab_size": V,
         "hidden_size": C, "intermediate_size": F, "num_hidden_layers": L, "num_attention_heads": H,
         "num_key_value_heads": KV, "hidden_act": "silu", "max_position_embeddings": 64, "rms_norm_eps": 1e-6,
         "rope_theta": 1000000.0, "tie_word_embeddings": True, "use_sliding_window": False, "sliding_window": 4096,
         "max_window_layers": 21, "attention_dropout": 0.0, "torch_dtype": "float32", "use_cache": True}
    if q3: c.update({"head_dim": hd, "attention_bias": False, "sliding_window": None})
    json.dump(c, open(os.path.join(a[0], "config.json"), "w"), indent=2)
elif cmd == "ref":  # DIR SHARD T: transformers' Qwen2/Qwen3 forward written out in plain Python (float64):
    # the mean cross-entropy of the shard's first T + 1 tokens
    d, shard, T = a[0], a[1], int(a[2])
    _, st = read(d + "/model.safetensors"); W = {}
    for k, (dt, sh, data) in st.items():
        vals = floats(data)
        W[k] = [list(vals[i * sh[1]:(i + 1) * sh[1]]) for i in range(sh[0])] if len(sh) == 2 else list(vals)
    c = json.load(open(d + "/config.json"))
    C, H, KV, L = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["num_hidden_layers"]
    hd = c.get("head_dim", C // H); eps = c["rms_norm_eps"]; theta = c["rope_theta"]
    raw = open(shard, "rb").read()
    ids = struct.unpack("<%dH" % (T + 1), raw[1024:1024 + 2 * (T + 1)])
    x_ids, y_ids = ids[:-1], ids[1:]
    def rms(v, w):
        s = 1.0 / math.sqrt(sum(a * a for a in v) / len(v) + eps)
        return [wi * a * s for a, wi in zip(v, w)]
    def lin(v, M, bias=None):
        out = [sum(a * b for a, b in zip(row, v)) for row in M]
        return [o + bb for o, bb in zip(out, bias)] if bias else out
    def rope(v, t):
        h = hd // 2; out = list(v)
        for i in range(h):
            f = 1.0 / (theta ** (2 * i / hd)); ang = t * f; co, si = math.cos(ang), math.sin(ang)
            out[i] = v[i] * co - v[i + h] * si; out[i + h] = v[i + h] * co + v[i] * si
        return out
    x = [list(W["model.embed_tokens.weight"][i]) for i in x_ids]
    for l in range(L):
        p = "model.layers.%d." % l
        qs, ks, vs = [], [], []
        for t in range(T):
            h = rms(x[t], W[p + "input_layernorm.weight"])
            q = lin(h, W[p + "self_attn.q_proj.weight"], W.get(p + "self_attn.q_proj.bias"))
            k = lin(h, W[p + "self_attn.k_proj.weight"], W.get(p + "self_attn.k_proj.bias"))
            v = lin(h, W[p + "self_attn.v_proj.weight"], W.get(p + "self_attn.v_proj.bias"))
            qh = [q[j * hd:(j + 1) * hd] for j in range(H)]; kh = [k[j * hd:(j + 1) * hd] for j in range(KV)]
            if p + "self_attn.q_norm.weight" in W:
                qh = [rms(a, W[p + "self_attn.q_norm.weight"]) for a in qh]; kh = [rms(a, W[p + "self_attn.k_norm.weight"]) for a in kh]
            qs.append([rope(a, t) for a in qh]); ks.append([rope(a, t) for a in kh]); vs.append([v[j * hd:(j + 1) * hd] for j in range(KV)])
        for t in range(T):
            y = []
            for j in range(H):
                g = j // (H // KV)
                sc = [sum(a * b for a, b in zip(qs[t][j], ks[u][g])) / math.sqrt(hd) for u in range(t + 1)]
                m = max(sc); e = [math.exp(s - m) for s in sc]; z = sum(e)
                y += [sum(e[u] / z * vs[u][g][i] for u in range(t + 1)) for i in range(hd)]
            o = lin(y, W[p + "self_attn.o_proj.weight"])
            x[t] = [a + b for a, b in zip(x[t], o)]
        for t in range(T):
            h = rms(x[t], W[p + "post_attention_layernorm.weight"])
            gt = lin(h, W[p + "mlp.gate_proj.weight"]); up = lin(h, W[p + "mlp.up_proj.weight"])
            a = [gg / (1 + math.exp(-gg)) * u for gg, u in zip(gt, up)]
            x[t] = [xx + dd for xx, dd in zip(x[t], lin(a, W[p + "mlp.down_proj.weight"]))]
    head = W.get("lm_head.weight", W["model.embed_tokens.weight"])
    tot = 0.0
    for t in range(T):
        h = rms(x[t], W["model.norm.weight"]); lg = lin(h, head); m = max(lg)
        tot += m + math.log(sum(math.exp(v - m) for v in lg)) - lg[y_ids[t]]
    print("%.5f" % (tot / T))
elif cmd == "same":  # A B: the same tensor names, dtypes, shapes and bytes
    _, x = read(a[0]); _, y = read(a[1])
    bad = sorted(k for k in set(x) | set(y) if k not in x or k not in y or x[k] != y[k])
    print("%d tensors the same%s" % (len(x), "; differ: " + ", ".join(bad) if bad else "")); sys.exit(1 if bad else 0)
elif cmd == "fields":  # A B KEYS...: the fields KEYS of config.json A are in B with the same values
    x = json.load(open(a[0])); y = json.load(open(a[1])); bad = [k for k in a[2:] if k not in y or x.get(k) != y[k]]
    print("differ: %s" % bad if bad else "%s kept" % ", ".join(a[2:])); sys.exit(1 if bad else 0)
elif cmd == "eos_model":  # SRC DST EOS: a Llama whose every next token is EOS (layers add nothing, the
    # residual's first feature is 10, the head reads only it, only EOS's row has it)
    meta, t = read(a[0]); eos = int(a[2]); out = {}
    for k, (dt, s, d) in t.items():
        d = bytearray(d)
        if k.endswith("o_proj.weight") or k.endswith("down_proj.weight"): d = bytearray(len(d))
        if k in ("model.embed_tokens.weight", "lm_head.weight"):
            for r in range(s[0]):
                d[4 * r * s[1]:4 * r * s[1] + 4] = struct.pack("<f", 10.0 if k.startswith("model") else 1.0 if r == eos else 0.0)
        out[k] = (dt, s, bytes(d))
    write(a[1], out, {"format": "pt"})
elif cmd == "prompt_ids":  # SHARD: the ids of a tokenize --chat shard before the first target (SHARD.mask)
    b = open(a[0], "rb").read(); magic, _, n = struct.unpack("<3i", b[:12]); w = 4 if magic == 20240801 else 2
    ids = struct.unpack("<%d%s" % (n, "I" if w == 4 else "H"), b[1024:1024 + w * n]); m = open(a[0] + ".mask", "rb").read()[-n:]
    print(" ".join(map(str, ids[:m.index(1)])))
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

# BF16 and F16 copies: the fp32 master weights are the rounded values, exactly; exported in the
# checkpoint's dtype (the default) they are the same bytes again; and an fp32 model exported
# in bf16 / f16 is rounded to nearest even (the copy's rounding: torch's, struct's 'e')
for dt in BF16 F16; do
    lc=$(echo $dt | tr A-Z a-z)
    mkdir -p "$TMP/$dt" && cp "$TMP/hf_llama/config.json" "$TMP/$dt/" \
        && ST lower "$TMP/hf_llama/model.safetensors" "$TMP/$dt/model.safetensors" $dt && import "$TMP/$dt" "im_$dt" \
        && r=$(ST same "$TMP/$dt/model.safetensors" "$TMP/im_${dt}_hf/model.safetensors") \
        && pass "$dt import -> export (default --dtype $lc): $r byte-identical" || fail "$dt import -> export: $r"
    $NB export --ckpt "$TMP/im_$dt" --hf "$TMP/im_${dt}_f32" --dtype f32 2>/dev/null \
        && r=$(ST check_lower "$TMP/hf_llama/model.safetensors" "$TMP/im_${dt}_f32/model.safetensors" $dt) \
        && pass "$dt copy: $r" || fail "$dt copy: $r"
    $NB export --ckpt "$TMP/llama" --hf "$TMP/llama_$lc" --dtype $lc 2>/dev/null \
        && r=$(ST same "$TMP/$dt/model.safetensors" "$TMP/llama_$lc/model.safetensors") \
        && [ "$(ST field "$TMP/llama_$lc/config.json" dtype)" = "$([ $dt = BF16 ] && echo bfloat16 || echo float16)" ] \
        && pass "export --dtype $lc of an fp32 model: round to nearest even ($r)" || fail "export --dtype $lc: $r"
done
expect_error "export --dtype f8" "unknown --dtype 'f8'" $NB export --ckpt "$TMP/llama" --hf "$TMP/f8" --dtype f8

# two shards and an index
mkdir -p "$TMP/sharded" && cp "$TMP/hf_gpt2/config.json" "$TMP/sharded/" && ST shard "$TMP/hf_gpt2/model.safetensors" "$TMP/sharded" \
    && import "$TMP/sharded" im_sharded && same_export "sharded checkpoint (2 files + index)" hf_gpt2 im_sharded_hf || fail "sharded"

# GPT-2 as HF's gpt2 repository saves it: no "transformer." prefix, mask buffers, the tied head
mkdir -p "$TMP/hfgpt2" && cp "$TMP/hf_gpt2/config.json" "$TMP/hfgpt2/" && ST hf_gpt2 "$TMP/hf_gpt2/model.safetensors" "$TMP/hfgpt2/model.safetensors" \
    && import "$TMP/hfgpt2" im_hfgpt2 && same_export "GPT-2 without prefix, with attn.bias buffers and lm_head" hf_gpt2 im_hfgpt2_hf \
    || fail "gpt2 repository layout"

# Mistral (Llama's math, sliding window 4096, trained at --seq 64): the export is a
# MistralForCausalLM again, with the fields nobubble does not model as they were, also after a
# resumed step; rms_norm_eps 1e-6 kept through import and export
mkdir -p "$TMP/mistral" && cp "$TMP/hf_llama/model.safetensors" "$TMP/mistral/" \
    && ST config "$TMP/hf_llama/config.json" "$TMP/mistral/config.json" \
        '{"architectures": ["MistralForCausalLM"], "model_type": "mistral", "sliding_window": 4096, "rms_norm_eps": 1e-6,
          "max_position_embeddings": 32768, "bos_token_id": 1, "eos_token_id": 2, "rope_theta": 1000000.0,
          "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}, "transformers_version": "4.44.2",
          "torch_dtype": "float32", "dtype": null, "head_dim": null}' \
    && import "$TMP/mistral" im_mistral --seq 64 && cmp -s "$TMP/hf_llama/model.safetensors" "$TMP/im_mistral_hf/model.safetensors" \
    && [ "$(ST field "$TMP/im_mistral_hf/config.json" rms_norm_eps)" = "1e-06" ] \
    && r=$(ST fields "$TMP/mistral/config.json" "$TMP/im_mistral_hf/config.json" architectures model_type sliding_window \
        max_position_embeddings bos_token_id eos_token_id rope_theta rope_parameters transformers_version torch_dtype tie_word_embeddings) \
    && pass "MistralForCausalLM exports as itself: $r" || fail "mistral: $r"
import "$TMP/im_mistral_hf" im_mistral2 --seq 64 && same_export "Mistral: export, import, export" im_mistral_hf im_mistral2_hf
$NB train --resume "$TMP/im_mistral" --steps 1 --data "$TMP/tokens.bin" --no-progress --quiet 2>/dev/null \
    && $NB export --ckpt "$TMP/im_mistral" --hf "$TMP/im_mistral_1" 2>/dev/null \
    && r=$(ST fields "$TMP/mistral/config.json" "$TMP/im_mistral_1/config.json" architectures sliding_window max_position_embeddings) \
    && pass "Mistral after a resumed step: $r" || fail "Mistral after a resumed step: $r"

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
bad mtype hf_llama '{"architectures": null, "model_type": "gemma"}'
refused "unknown model_type" "model_type': 'gemma' is not supported" $NB "${T[@]}" --init-from "$TMP/mtype"
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
refused "head_dim 32 (!= hidden / heads: q_proj has heads * head_dim rows)" "q_proj.weight' has shape \[64, 64\], config.json makes it \[128, 64\]" $NB "${T[@]}" --init-from "$TMP/hdim"
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
refused "Llama bias tensor" "q_proj.bias': a LlamaForCausalLM has no such bias" $NB "${T[@]}" --init-from "$TMP/qbias"
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
# Tokenizer files and sample with the run's Hugging Face tokenizer (the files of
# scripts/fetch_data.sh tokenizers)
HFT=$ROOT/data/hf_tokenizers
Q="What is the capital of France?"
if [ -f "$HFT/llama2/tokenizer.json" ] && [ -f "$HFT/llama3/tokenizer.json" ]; then
    for i in 1 2 3 4 5 6 7 8 9 10; do
        echo '{"messages": [{"role": "user", "content": "'"$Q"'"}, {"role": "assistant", "content": "Paris."}]}'
    done > "$TMP/chat.jsonl"
    CHAT=(--batch 2 --val-data none --no-progress --quiet --steps 1 --model llama-tiny)
    # sample_ids RUN [FLAGS]: the prompt ids sample --chat prints
    sample_ids() { local run=$1; shift; $NB sample --ckpt "$run" --chat "$Q" --print-tokens --tokens 4 --threads 2 "$@" 2>&1 >/dev/null \
        | sed -n 's/^prompt tokens ([0-9]*): //p'; }
    $NB tokenize --chat --tokenizer "$HFT/llama2" --out "$TMP/chat2.bin" "$TMP/chat.jsonl" >/dev/null \
        && $NB train "${CHAT[@]}" --vocab 32000 --tokenizer "$HFT/llama2" --data "$TMP/chat2.bin" --out "$TMP/l2" \
        && $NB export --ckpt "$TMP/l2" --hf "$TMP/l2_hf" 2>/dev/null \
        && cmp -s "$HFT/llama2/tokenizer.json" "$TMP/l2_hf/tokenizer.json" && cmp -s "$HFT/llama2/tokenizer_config.json" "$TMP/l2_hf/tokenizer_config.json" \
        && pass "export copies the run's --tokenizer files" || fail "tokenizer files of --tokenizer"
    # --init-from a folder with tokenizer files: the run's tokenizer (absolute in state.json), copied on export
    echo '{"bos_token_id": 1, "eos_token_id": 2}' > "$TMP/l2_hf/generation_config.json"
    import "$TMP/l2_hf" im_l2 && grep -q "\"tokenizer\": \"$(cd "$TMP" && pwd -P)/l2_hf\"" "$TMP/im_l2/ckpt/state.json" \
        && for f in tokenizer.json tokenizer_config.json generation_config.json; do cmp -s "$TMP/l2_hf/$f" "$TMP/im_l2_hf/$f" || false; done \
        && [ ! -e "$TMP/im_l2_hf/special_tokens_map.json" ] && same_export "--init-from with tokenizer files" l2_hf im_l2_hf \
        && pass "--init-from: tokenizer.json, tokenizer_config.json and generation_config.json copied" || fail "tokenizer files of --init-from"
    # sample --chat: the prompt is what tokenize --chat makes of the same conversation before the answer
    want=$(ST prompt_ids "$TMP/chat2.bin") && got=$(sample_ids "$TMP/im_l2")
    [ -n "$want" ] && [ "$got" = "$want" ] && pass "sample --chat with the run's Llama 2 tokenizer: prompt ids = tokenize --chat's ($got)" \
        || fail "sample --chat llama2: '$got' vs '$want'"
    p=$($NB sample --ckpt "$TMP/im_l2" --prompt "Paris" --print-tokens --tokens 2 --threads 2 2>&1 >/dev/null | sed -n 's/^prompt tokens ([0-9]*): //p')
    [ "${p%% *}" = 1 ] && pass "sample --prompt with the run's tokenizer starts with its bos ($p)" || fail "sample --prompt: '$p'"
    # the answer ends at the end of the assistant's turn (Llama 2: eos), a --prompt's continuation does not
    mkdir -p "$TMP/eos" && cp "$TMP/l2_hf/"*.json "$TMP/eos/" && ST eos_model "$TMP/l2_hf/model.safetensors" "$TMP/eos/model.safetensors" 2 \
        && $NB train --init-from "$TMP/eos" --steps 0 "${RUN[@]}" --out "$TMP/im_eos" 2>/dev/null \
        && a=$($NB sample --ckpt "$TMP/im_eos" --chat "$Q" --top-k 1 --print-tokens --threads 2 2>&1 >/dev/null | grep "^answer") \
        && b=$($NB sample --ckpt "$TMP/im_eos" --prompt Paris --top-k 1 --tokens 3 --print-tokens --threads 2 2>&1 >/dev/null | grep "^answer") \
        && [ "$a" = "answer tokens (0):" ] && [ "$b" = "answer tokens (3): 2 2 2" ] \
        && pass "sample --chat stops at the end of the turn ('$a'; --prompt: '$b')" || fail "sample --chat stop: '$a', '$b'"
    $NB tokenize --chat --tokenizer "$HFT/llama3" --out "$TMP/chat3.bin" "$TMP/chat.jsonl" >/dev/null && want=$(ST prompt_ids "$TMP/chat3.bin")
    if $NB train "${CHAT[@]}" --vocab 128256 --tokenizer "$HFT/llama3" --data "$TMP/chat3.bin" --out "$TMP/l3" 2>"$TMP/err"; then
        got=$(sample_ids "$TMP/l3") && [ -n "$want" ] && [ "$got" = "$want" ] \
            && pass "sample --chat with Llama 3's tokenizer: prompt ids = tokenize --chat's ($got)" || fail "sample --chat llama3: '$got' vs '$want'"
    else
        grep -q "vocab" "$TMP/err" || { fail "train with Llama 3's vocabulary"; tail -2 "$TMP/err"; }
        echo "note: this build's models take vocabularies up to 65536: Llama 3's prompt ids are checked, not its run"
        got=$(sample_ids "$TMP/l2" --tokenizer "$HFT/llama3")
        [ -n "$want" ] && [ "$got" = "$want" ] && pass "sample --chat --tokenizer llama3: prompt ids = tokenize --chat's ($got)" \
            || fail "sample --chat llama3: '$got' vs '$want'"
    fi
    expect_error "sample --chat with GPT-2's tokenizer" "needs a Hugging Face tokenizer" $NB sample --ckpt "$TMP/llama" --chat hi --tokenizer "$ROOT/data/gpt2"
else
    echo "note: no tokenizer files in $HFT (scripts/fetch_data.sh tokenizers): tokenizer copies and sample --chat are not tried"
fi

refused "--model with --init-from" "\-\-model with --init-from" $NB "${T[@]}" --model llama-tiny --init-from "$TMP/hf_llama"
refused "--steps 0 without --init-from" "\-\-steps is 0" $NB train --model gpt2-tiny --steps 0 "${RUN[@]}"
$NB train --help | grep -q -- "--init-from HF_DIR" && pass "--help lists --init-from" || fail "--help"

# Qwen2 and Qwen3
for q in qwen2 qwen3; do
    ST qwen "$TMP/$q" $q || { fail "$q: write the checkpoint"; continue; }
    import "$TMP/$q" im_$q && r=$(ST same "$TMP/$q/model.safetensors" "$TMP/im_${q}_hf/model.safetensors") \
        && pass "$q: import, export: $r" || fail "$q: import, export: $r"
    f=$(ST field "$TMP/im_${q}_hf/config.json" architectures head_dim rope_theta tie_word_embeddings)
    [ "$f" = "['${q^}ForCausalLM'] $([ $q = qwen3 ] && echo 24 || echo 16) 1000000.0 True" ] \
        && pass "$q: exported config.json (class, head_dim, rope_theta, tied): $f" || fail "$q: config.json: $f"
    grep -q "\"preset\": \"hf-$q\"" "$TMP/im_$q/ckpt/state.json" && pass "$q: preset hf-$q" || fail "$q: preset"
    ours=$($NB eval --ckpt "$TMP/im_$q" --data "$TMP/tokens.bin" --batch 1 --batches 1 2>&1 | grep -o "loss [0-9.]* nats")
    ref=$(ST ref "$TMP/$q" "$TMP/tokens.bin" 64)
    awk -v a="${ours//[^0-9.]/}" -v b="$ref" 'BEGIN { exit !(a != "" && a - b < 2e-4 && b - a < 2e-4) }' \
        && pass "$q: eval $ours, transformers' math in plain Python $ref" || fail "$q: eval '$ours' vs plain Python $ref"
    $NB train --init-from "$TMP/$q" --steps 2 "${RUN[@]}" --out "$TMP/tr_$q" 2>"$TMP/err" \
        && $NB export --ckpt "$TMP/tr_$q" --hf "$TMP/tr_${q}_hf" 2>/dev/null && import "$TMP/tr_${q}_hf" im_tr_$q \
        && same_export "$q: train 2 steps, export, --init-from --steps 0" "tr_${q}_hf" "im_tr_${q}_hf" \
        || fail "$q: train 2 steps: $(tail -2 "$TMP/err")"
done
grep -q '"head_dim": 24' "$TMP/im_qwen3/ckpt/state.json" && grep -q '"qk_norm": true' "$TMP/im_qwen3/ckpt/state.json" \
    && grep -q '"qkv_bias": true' "$TMP/im_qwen2/ckpt/state.json" && pass "state.json keeps head_dim, qk_norm and qkv_bias" \
    || fail "state.json: the Qwen fields"
$NB train --resume "$TMP/im_qwen3" --steps 3 --data "$TMP/tokens.bin" --no-progress --quiet 2>/dev/null \
    && $NB train --init-from "$TMP/qwen3" --steps 3 "${RUN[@]}" --out "$TMP/straight3" \
    && st_same "$TMP/im_qwen3/ckpt/model.safetensors" "$TMP/straight3/ckpt/model.safetensors" \
    && st_same "$TMP/im_qwen3/ckpt/optim.safetensors" "$TMP/straight3/ckpt/optim.safetensors" \
    && pass "qwen3: resume of the step-0 checkpoint bitwise a straight --init-from run (3 steps)" || fail "qwen3: resume differs"
$NB train --init-from "$TMP/qwen3" --steps 2 --schedule stream --ckpt-interval 1 "${RUN[@]}" --out "$TMP/stream3" 2>/dev/null \
    && st_same "$TMP/tr_qwen3/ckpt/model.safetensors" "$TMP/stream3/ckpt/model.safetensors" \
    && pass "qwen3: --schedule stream --ckpt-interval 1 (q/k norm recomputed) bitwise the plain run" || fail "qwen3: stream differs"
bad q2win qwen2 '{"use_sliding_window": true, "sliding_window": 64}'
$NB "${T[@]}" --init-from "$TMP/q2win" --out "$TMP/q2win_run" 2>/dev/null && pass "qwen2: use_sliding_window with a window of --seq" \
    || fail "qwen2: sliding window 64 refused"
bad q2short qwen2 '{"use_sliding_window": true, "sliding_window": 32}'
refused "qwen2: sliding window < seq" "use_sliding_window is true and sliding_window 32 is shorter than the sequence length 64" \
    $NB "${T[@]}" --init-from "$TMP/q2short"
bad q3bias qwen3 '{"attention_bias": true}'
refused "qwen3: attention_bias true" "attention_bias' is true" $NB "${T[@]}" --init-from "$TMP/q3bias"
bad q3hd qwen3 '{"head_dim": null}'
refused "qwen3: no head_dim (Qwen3Config's 128)" "q_proj.weight' has shape \[96, 64\], config.json makes it \[512, 64\]" \
    $NB "${T[@]}" --init-from "$TMP/q3hd"
bad q3norm qwen3 '{}' && ST drop "$TMP/qwen3/model.safetensors" "$TMP/q3norm/model.safetensors" model.layers.1.self_attn.q_norm.weight
refused "qwen3: missing q_norm" "tensor 'model.layers.1.self_attn.q_norm.weight' is missing" $NB "${T[@]}" --init-from "$TMP/q3norm"
bad q3b qwen3 '{}' && ST add "$TMP/qwen3/model.safetensors" "$TMP/q3b/model.safetensors" model.layers.0.self_attn.k_proj.bias F32 48
refused "qwen3: a bias tensor" "k_proj.bias': a Qwen3ForCausalLM has no such bias" $NB "${T[@]}" --init-from "$TMP/q3b"
finish
