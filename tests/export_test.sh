#!/usr/bin/env bash
# nobubble export: a 2-step gpt2-tiny and llama-tiny checkpoint written as Hugging Face
# directories. An independent reader (node) checks config.json field by field and every tensor
# of model.safetensors element by element against the checkpoint, through its own copy of the
# name/layout mapping (Conv1D transposes, q/k/v and gate/up splits, padding rows dropped).
# Then the error cases: missing flags, a damaged checkpoint, an unwritable or self-overwriting
# output. (Loading the export with transformers itself runs on the device machine:
# tests/torch/ref_check.py check-export.)
source "$(dirname "$0")/lib.sh"
command -v node >/dev/null || { echo "node not found: skipping the export checks"; exit 77; }

# A token shard of random ids < 512 in llm.c's layout, so the test needs no download.
node -e '
const n = 20000, buf = Buffer.alloc(1024 + 2 * n);
buf.writeInt32LE(20240520, 0); buf.writeInt32LE(1, 4); buf.writeInt32LE(n, 8);
let s = 12345;
for (let i = 0; i < n; i++) { s = (s * 1103515245 + 12345) % 2147483648; buf.writeUInt16LE(s % 512, 1024 + 2 * i); }
require("fs").writeFileSync(process.argv[1], buf);' "$TMP/tokens.bin" || fail "write the token shard"

cat > "$TMP/check.js" <<'EOF'
// node check.js CKPT_DIR HF_DIR: exits 1 with one line per mismatch.
const fs = require("fs");
const [ckpt, hf] = process.argv.slice(2);
let bad = 0;
const err = (m) => { console.log("mismatch: " + m); bad++; };

function readST(path) {
  const b = fs.readFileSync(path);
  const n = Number(b.readBigUInt64LE(0));
  const head = JSON.parse(b.subarray(8, 8 + n).toString("utf8"));
  const base = 8 + n, t = {};
  for (const [k, v] of Object.entries(head)) {
    if (k === "__metadata__") continue;
    const [s, e] = v.data_offsets;
    const bytes = b.subarray(base + s, base + e);
    const data = new Float32Array(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.length));
    t[k] = { dtype: v.dtype, shape: v.shape, data };
  }
  return { meta: head.__metadata__ || {}, t };
}

const state = JSON.parse(fs.readFileSync(ckpt + "/state.json", "utf8")).model;
const raw = fs.readFileSync(hf + "/config.json", "utf8");
const cfg = JSON.parse(raw);
const ours = readST(ckpt + "/model.safetensors").t;
const out = readST(hf + "/model.safetensors");
const V = state.vocab, C = state.dim, L = state.layers, H = state.heads, KV = state.kv_heads, hs = C / H, F = state.ffn;
const gpt2 = state.arch === "gpt2";

function want(key, v) { if (cfg[key] !== v) err(`config.json ${key} = ${JSON.stringify(cfg[key])}, want ${JSON.stringify(v)}`); }
// floats must be spelled as floats: transformers 5's strict configs refuse 0 where 0.0 is due
function wantFloatText(key) { if (!new RegExp(`"${key}": -?[0-9]*(\\.[0-9]+|e[-+]?[0-9]+)`).test(raw)) err(`config.json ${key} not spelled as a float`); }

if (gpt2) {
  want("model_type", "gpt2");
  if (JSON.stringify(cfg.architectures) !== '["GPT2LMHeadModel"]') err("architectures " + JSON.stringify(cfg.architectures));
  want("vocab_size", V); want("n_embd", C); want("n_layer", L); want("n_head", H); want("n_positions", state.seq);
  want("n_inner", F); want("activation_function", "gelu_new"); want("layer_norm_epsilon", 1e-5);
  want("tie_word_embeddings", true); want("resid_pdrop", 0); want("embd_pdrop", 0); want("attn_pdrop", 0);
  want("scale_attn_weights", true); want("scale_attn_by_inverse_layer_idx", false); want("reorder_and_upcast_attn", false);
  for (const k of ["layer_norm_epsilon", "resid_pdrop", "embd_pdrop", "attn_pdrop", "initializer_range"]) wantFloatText(k);
} else {
  want("model_type", "llama");
  if (JSON.stringify(cfg.architectures) !== '["LlamaForCausalLM"]') err("architectures " + JSON.stringify(cfg.architectures));
  want("vocab_size", V); want("hidden_size", C); want("intermediate_size", F); want("num_hidden_layers", L);
  want("num_attention_heads", H); want("num_key_value_heads", KV); want("head_dim", hs); want("hidden_act", "silu");
  want("max_position_embeddings", state.seq); want("rms_norm_eps", 1e-5); want("rope_theta", 10000);
  want("tie_word_embeddings", false); want("attention_bias", false); want("mlp_bias", false);
  if (!cfg.rope_parameters || cfg.rope_parameters.rope_type !== "default" || cfg.rope_parameters.rope_theta !== 10000)
    err("rope_parameters " + JSON.stringify(cfg.rope_parameters));
  for (const k of ["rms_norm_eps", "rope_theta", "attention_dropout", "initializer_range"]) wantFloatText(k);
}
if (V > 50256) { want("bos_token_id", 50256); want("eos_token_id", 50256); }
if (out.meta.format !== "pt") err(`metadata format ${out.meta.format}, want pt`);

// expected HF tensor -> (our tensor, first row, rows, transposed)
const exp = {};
const map = (hfName, our, row0, rows, tr) => { exp[hfName] = { our, row0, rows, tr }; };
if (gpt2) {
  map("transformer.wte.weight", "wte", 0, V, false);
  map("transformer.wpe.weight", "wpe", 0, state.seq, false);
  for (let l = 0; l < L; l++) {
    const h = `transformer.h.${l}.`, o = `layers.${l}.`;
    for (const [a, b] of [["ln_1", "ln1"], ["ln_2", "ln2"]]) { map(h + a + ".weight", o + b + ".weight"); map(h + a + ".bias", o + b + ".bias"); }
    for (const [a, b] of [["attn.c_attn", "attn.qkv"], ["attn.c_proj", "attn.proj"], ["mlp.c_fc", "mlp.fc"], ["mlp.c_proj", "mlp.proj"]]) {
      map(h + a + ".weight", o + b + ".weight", 0, -1, true);
      map(h + a + ".bias", o + b + ".bias");
    }
  }
  map("transformer.ln_f.weight", "lnf.weight"); map("transformer.ln_f.bias", "lnf.bias");
} else {
  map("model.embed_tokens.weight", "wte", 0, V, false);
  for (let l = 0; l < L; l++) {
    const h = `model.layers.${l}.`, o = `layers.${l}.`;
    map(h + "input_layernorm.weight", o + "ln1.weight");
    map(h + "self_attn.q_proj.weight", o + "attn.qkv.weight", 0, H * hs, false);
    map(h + "self_attn.k_proj.weight", o + "attn.qkv.weight", H * hs, KV * hs, false);
    map(h + "self_attn.v_proj.weight", o + "attn.qkv.weight", (H + KV) * hs, KV * hs, false);
    map(h + "self_attn.o_proj.weight", o + "attn.proj.weight");
    map(h + "post_attention_layernorm.weight", o + "ln2.weight");
    map(h + "mlp.gate_proj.weight", o + "mlp.gate_up.weight", 0, F, false);
    map(h + "mlp.up_proj.weight", o + "mlp.gate_up.weight", F, F, false);
    map(h + "mlp.down_proj.weight", o + "mlp.down.weight");
  }
  map("model.norm.weight", "lnf.weight");
  map("lm_head.weight", "lm_head.weight", 0, V, false);
}

for (const name of Object.keys(out.t)) if (!(name in exp)) err(`unexpected tensor ${name}`);
let checked = 0, transposed = 0;
for (const [name, e] of Object.entries(exp)) {
  const h = out.t[name], o = ours[e.our];
  if (!h) { err(`missing ${name}`); continue; }
  if (!o) { err(`checkpoint has no ${e.our}`); continue; }
  if (h.dtype !== "F32") { err(`${name} dtype ${h.dtype}`); continue; }
  const cols = o.shape.length > 1 ? o.shape[1] : 1;
  const row0 = e.row0 || 0, rows = e.rows === undefined || e.rows < 0 ? o.shape[0] : e.rows;
  const shape = o.shape.length === 1 ? [rows] : e.tr ? [cols, rows] : [rows, cols];
  if (JSON.stringify(h.shape) !== JSON.stringify(shape)) { err(`${name} shape ${JSON.stringify(h.shape)}, want ${JSON.stringify(shape)}`); continue; }
  let diff = 0;
  for (let r = 0; r < rows; r++)
    for (let c = 0; c < cols; c++) {
      const src = o.data[(row0 + r) * cols + c];
      const dst = e.tr ? h.data[c * rows + r] : h.data[r * cols + c];
      if (!Object.is(src, dst)) diff++;
    }
  if (diff) err(`${name}: ${diff} elements differ from ${e.our}`);
  checked++; if (e.tr) transposed++;
}
if (gpt2 && "lm_head.weight" in out.t) err("tied head written");
console.log(`${state.arch}: ${checked} tensors equal to the checkpoint (${transposed} transposed), config.json fields ok`);
process.exit(bad ? 1 : 0);
EOF

export_and_check() { # NAME TRAIN-FLAGS...
    local name=$1; shift
    $NB train "$@" --batch 2 --steps 2 --data "$TMP/tokens.bin" --val-data none --out "$TMP/$name" --no-progress --quiet \
        || { fail "$name: train"; return; }
    $NB export --ckpt "$TMP/$name" --hf "$TMP/hf_$name" 2>"$TMP/export.err" || { fail "$name: export"; cat "$TMP/export.err"; return; }
    grep -q "^exported" "$TMP/export.err" && pass "$name: $(head -1 "$TMP/export.err")" || fail "$name: no summary line"
    local r
    r=$(node "$TMP/check.js" "$TMP/$name/ckpt" "$TMP/hf_$name") && pass "$name: $r" || { fail "$name: export differs:"; echo "$r" | head -20; }
    # a second export over the first: same bytes, no temp files left
    $NB export --ckpt "$TMP/$name/ckpt" --hf "$TMP/hf_$name" 2>/dev/null && cp -r "$TMP/hf_$name" "$TMP/hf2_$name" \
        && $NB export --ckpt "$TMP/$name" --hf "$TMP/hf2_$name" 2>/dev/null \
        && cmp -s "$TMP/hf_$name/model.safetensors" "$TMP/hf2_$name/model.safetensors" \
        && cmp -s "$TMP/hf_$name/config.json" "$TMP/hf2_$name/config.json" \
        && [ "$(ls "$TMP/hf2_$name" | tr '\n' ' ')" = "config.json model.safetensors " ] \
        && pass "$name: re-export is byte-identical, no temp files" || fail "$name: re-export differs or left files: $(ls "$TMP/hf2_$name")"
}

# gpt2-tiny keeps the GPT-2 vocabulary (50257 rows exported of 50304); llama-tiny gets 1000
# (1024 padded): both drop padding rows; llama-tiny has 4 query heads on 2 kv heads, ffn 172.
export_and_check gpt2 --model gpt2-tiny
export_and_check llama --model llama-tiny --vocab 1000

$NB export --help | grep -q -- "--hf OUT" && pass "--help lists --hf" || fail "--help"
expect_error "missing --ckpt" "--ckpt DIR is required" $NB export --hf "$TMP/x"
expect_error "missing --hf" "--hf OUT is required" $NB export --ckpt "$TMP/gpt2"
expect_error "no checkpoint" "no checkpoint in" $NB export --ckpt "$TMP/nothere" --hf "$TMP/x"
expect_error "export over the checkpoint" "checkpoint directory itself" $NB export --ckpt "$TMP/gpt2" --hf "$TMP/gpt2/ckpt"
touch "$TMP/afile"
expect_error "output is a file" "afile" $NB export --ckpt "$TMP/gpt2" --hf "$TMP/afile"
cp -r "$TMP/llama" "$TMP/damaged"
f="$TMP/damaged/ckpt/model.safetensors"
head -c $(( $(stat -c %s "$f") - 100 )) "$f" > "$f.cut" && mv "$f.cut" "$f"
expect_error "truncated checkpoint" "model.safetensors" $NB export --ckpt "$TMP/damaged" --hf "$TMP/hf_damaged"
[ ! -e "$TMP/hf_damaged/model.safetensors" ] && pass "nothing written from a damaged checkpoint" || fail "partial export left behind"
finish
