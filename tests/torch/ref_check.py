#!/usr/bin/env python3
"""Whole-model references for nobubble from PyTorch and Hugging Face transformers.

  gen           build a model of a nobubble preset, compute the loss, logits and every gradient
                on a fixed batch, then 10 AdamW steps, and write it all into one safetensors file
                under nobubble's own tensor names and layouts (tests/test_torch_ref.c reads it).
  check-export  load a directory written by `nobubble export` with transformers'
                from_pretrained and check its weights and logits against a reference file.

The reference values are computed in float64 by a plain PyTorch transcription of nobubble's
math (the spec: every formula written out, in our fused layouts), and cross-checked against
transformers' GPT2LMHeadModel / LlamaForCausalLM run in float32 with TF32 off, fed the same
weights through the name/layout mapping that `nobubble export` uses. Agreement of the two proves
the mapping and the math; HF's float32 distance from the float64 truth is stored too, as the
noise floor a float32 implementation can be expected to reach.

Hugging Face quirks this mirrors: Llama's RoPE tables are always computed in float32 (the
rotary module casts inv_freq and positions to float), so the float64 reference uses float32
cos/sin tables as well, exactly as nobubble's CPU kernel does. HF's RMSNorm also upcasts to
float32; in float32 runs that is a no-op.

Runs on CPU or GPU (--device auto picks cuda when present); torch >= 1.13, transformers 4.45+
or 5.x. Prints a per-check table and ends with "REF OK" or "REF FAIL" (exit 0 / 1).
See tests/torch/README.md for the commands.
"""
import argparse
import json
import math
import os
import struct
import sys
import time

import torch
import torch.nn.functional as F

FORMAT = "nobubble-torch-ref"
VERSION = 1

# nobubble's presets (src/model/transformer.c): arch, layers, dim, heads, kv_heads, ffn (0: 4*dim),
# vocab, seq. Keep in sync. qwen2-tiny / qwen3-tiny are llama-tiny with the Qwen variants (no
# nobubble preset: --init-from makes them): q/k/v biases; q/k norm with head_dim 24 != dim / heads.
PRESETS = {
    "gpt2-tiny": ("gpt2", 2, 64, 4, 4, 0, 50257, 64),
    "gpt2-mini": ("gpt2", 4, 128, 4, 4, 0, 50257, 128),
    "gpt2-proxy": ("gpt2", 4, 256, 4, 4, 0, 50257, 256),
    "gpt2": ("gpt2", 12, 768, 12, 12, 0, 50257, 1024),
    "gpt2-medium": ("gpt2", 24, 1024, 16, 16, 0, 50257, 1024),
    "llama-tiny": ("llama", 2, 64, 4, 2, 172, 50304, 64),
    "llama-1b": ("llama", 16, 2048, 32, 8, 8192, 50304, 2048),
    "qwen2-tiny": ("llama", 2, 64, 4, 2, 172, 50304, 64, dict(qkv_bias=1)),
    "qwen3-tiny": ("llama", 2, 64, 4, 2, 172, 50304, 64, dict(qk_norm=1, head_dim=24)),
}
# The committed references use a small vocabulary so the files stay a few MB.
TINY_VOCAB = 512

# Optimizer of the 10-step check: torch.optim.AdamW, constant lr, decay on 2-D tensors only,
# no gradient clipping.
ADAMW = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
NORM_EPS = 1e-5
ROPE_THETA = 10000.0

# Cross-check tolerances (HF float32 vs the float64 reference). A mapping error shows as O(1);
# these leave room for float32 rounding only.
TOL = dict(loss=1e-5, logits=1e-5, grad=1e-3, losses=1e-3, weights=1e-3)


class Config:
    def __init__(self, preset, vocab=None, seq=None):
        if preset not in PRESETS:
            raise SystemExit(f"ref_check: unknown preset '{preset}' (known: {', '.join(PRESETS)})")
        arch, L, C, H, KV, ffn, V, T, *var = PRESETS[preset]
        var = var[0] if var else {}
        self.preset, self.arch, self.layers, self.dim, self.heads, self.kv_heads = preset, arch, L, C, H, KV
        self.ffn = ffn or 4 * C
        self.vocab = vocab or V
        self.seq = seq or T
        self.head_dim, self.qkv_bias, self.qk_norm = (var.get(k, 0) for k in ("head_dim", "qkv_bias", "qk_norm"))
        self.head_size = self.head_dim or C // H
        self.vocab_padded = (self.vocab + 63) // 64 * 64
        self.tied = arch == "gpt2"
        self.gpt2 = arch == "gpt2"

    @staticmethod
    def from_meta(meta):
        c = Config(meta["preset"], int(meta["vocab"]), int(meta["seq"]))
        c.arch, c.gpt2 = meta["arch"], meta["arch"] == "gpt2"
        c.layers, c.dim, c.heads, c.kv_heads, c.ffn = (int(meta[k]) for k in ("layers", "dim", "heads", "kv_heads", "ffn"))
        c.head_dim, c.qkv_bias, c.qk_norm = (int(meta.get(k, 0)) for k in ("head_dim", "qkv_bias", "qk_norm"))
        c.head_size, c.tied = c.head_dim or c.dim // c.heads, meta["tied"] == "1"
        return c

    def hf_class(self):
        if self.gpt2:
            return "GPT2LMHeadModel"
        return "Qwen3ForCausalLM" if self.qk_norm else "Qwen2ForCausalLM" if self.qkv_bias else "LlamaForCausalLM"

    def meta(self):
        return {
            "preset": self.preset, "arch": self.arch, "layers": self.layers, "dim": self.dim,
            "heads": self.heads, "kv_heads": self.kv_heads, "ffn": self.ffn, "vocab": self.vocab,
            "vocab_padded": self.vocab_padded, "seq": self.seq, "tied": int(self.tied),
            "norm_eps": NORM_EPS, "rope_theta": ROPE_THETA,
            **({"head_dim": self.head_dim, "qkv_bias": self.qkv_bias, "qk_norm": self.qk_norm}
               if self.qkv_bias or self.qk_norm or self.head_dim else {}),
        }


# ----------------------------------------------------------------------------- nobubble's layout

def param_table(c):
    """(name, shape) of every parameter, in nobubble's slab order (nb_tf_model_init)."""
    C, L, hs = c.dim, c.layers, c.head_size
    qkv, att = (c.heads + 2 * c.kv_heads) * hs, c.heads * hs
    t = [("wte", (c.vocab_padded, C))]
    if c.gpt2:
        t.append(("wpe", (c.seq, C)))
    for l in range(L):
        p = f"layers.{l}."
        t.append((p + "ln1.weight", (C,)))
        if c.gpt2:
            t.append((p + "ln1.bias", (C,)))
        t.append((p + "attn.qkv.weight", (qkv, C)))
        if c.gpt2 or c.qkv_bias:
            t.append((p + "attn.qkv.bias", (qkv,)))
        if c.qk_norm:
            t += [(p + "attn.q_norm.weight", (hs,)), (p + "attn.k_norm.weight", (hs,))]
        t.append((p + "attn.proj.weight", (C, att)))
        if c.gpt2:
            t.append((p + "attn.proj.bias", (C,)))
        t.append((p + "ln2.weight", (C,)))
        if c.gpt2:
            t.append((p + "ln2.bias", (C,)))
        if c.gpt2:
            t += [(p + "mlp.fc.weight", (c.ffn, C)), (p + "mlp.fc.bias", (c.ffn,)),
                  (p + "mlp.proj.weight", (C, c.ffn)), (p + "mlp.proj.bias", (C,))]
        else:
            t += [(p + "mlp.gate_up.weight", (2 * c.ffn, C)), (p + "mlp.down.weight", (C, c.ffn))]
    t.append(("lnf.weight", (C,)))
    if c.gpt2:
        t.append(("lnf.bias", (C,)))
    if not c.tied:
        t.append(("lm_head.weight", (c.vocab_padded, C)))
    return t


def init_weights(c, seed):
    """Random weights in our layout, float32 on the CPU. Norm weights and biases are random too
    (not 1 and 0), so that swapping or dropping one of them changes the result."""
    g = torch.Generator().manual_seed(seed)
    resid = 0.02 / math.sqrt(2 * c.layers)
    W = {}
    for name, shape in param_table(c):
        x = torch.randn(shape, generator=g, dtype=torch.float64)
        if len(shape) == 2:
            std = resid if name.endswith(("attn.proj.weight", "mlp.proj.weight", "mlp.down.weight")) else 0.02
            x = x * std
            if name in ("wte", "lm_head.weight"):
                x[c.vocab:] = 0  # padding rows: no token reads them
        elif name.endswith("bias"):
            x = 0.02 * x
        else:
            x = 1.0 + 0.1 * x
        W[name] = x.float()
    return W


def hf_map(c):
    """nobubble -> Hugging Face: (hf_name, our_name, first_row, rows, transposed). The same table
    as src/model/transformer_hf.c, written independently."""
    m = []
    V, hs, F_ = c.vocab, c.head_size, c.ffn
    if c.gpt2:
        m.append(("transformer.wte.weight", "wte", 0, V, False))
        m.append(("transformer.wpe.weight", "wpe", 0, None, False))
        for l in range(c.layers):
            h, o = f"transformer.h.{l}.", f"layers.{l}."
            # GPT-2's Conv1D keeps weights as [in, out]: ours [out, in] transposed
            m += [(h + "ln_1.weight", o + "ln1.weight", 0, None, False),
                  (h + "ln_1.bias", o + "ln1.bias", 0, None, False),
                  (h + "attn.c_attn.weight", o + "attn.qkv.weight", 0, None, True),
                  (h + "attn.c_attn.bias", o + "attn.qkv.bias", 0, None, False),
                  (h + "attn.c_proj.weight", o + "attn.proj.weight", 0, None, True),
                  (h + "attn.c_proj.bias", o + "attn.proj.bias", 0, None, False),
                  (h + "ln_2.weight", o + "ln2.weight", 0, None, False),
                  (h + "ln_2.bias", o + "ln2.bias", 0, None, False),
                  (h + "mlp.c_fc.weight", o + "mlp.fc.weight", 0, None, True),
                  (h + "mlp.c_fc.bias", o + "mlp.fc.bias", 0, None, False),
                  (h + "mlp.c_proj.weight", o + "mlp.proj.weight", 0, None, True),
                  (h + "mlp.c_proj.bias", o + "mlp.proj.bias", 0, None, False)]
        m += [("transformer.ln_f.weight", "lnf.weight", 0, None, False),
              ("transformer.ln_f.bias", "lnf.bias", 0, None, False)]
    else:
        q, kv = c.heads * hs, c.kv_heads * hs
        m.append(("model.embed_tokens.weight", "wte", 0, V, False))
        for l in range(c.layers):
            h, o = f"model.layers.{l}.", f"layers.{l}."
            m += [(h + "input_layernorm.weight", o + "ln1.weight", 0, None, False),
                  (h + "self_attn.q_proj.weight", o + "attn.qkv.weight", 0, q, False),
                  (h + "self_attn.k_proj.weight", o + "attn.qkv.weight", q, kv, False),
                  (h + "self_attn.v_proj.weight", o + "attn.qkv.weight", q + kv, kv, False),
                  *([(h + "self_attn.q_proj.bias", o + "attn.qkv.bias", 0, q, False),
                     (h + "self_attn.k_proj.bias", o + "attn.qkv.bias", q, kv, False),
                     (h + "self_attn.v_proj.bias", o + "attn.qkv.bias", q + kv, kv, False)] if c.qkv_bias else []),
                  *([(h + "self_attn.q_norm.weight", o + "attn.q_norm.weight", 0, None, False),
                     (h + "self_attn.k_norm.weight", o + "attn.k_norm.weight", 0, None, False)] if c.qk_norm else []),
                  (h + "self_attn.o_proj.weight", o + "attn.proj.weight", 0, None, False),
                  (h + "post_attention_layernorm.weight", o + "ln2.weight", 0, None, False),
                  (h + "mlp.gate_proj.weight", o + "mlp.gate_up.weight", 0, F_, False),
                  (h + "mlp.up_proj.weight", o + "mlp.gate_up.weight", F_, F_, False),
                  (h + "mlp.down_proj.weight", o + "mlp.down.weight", 0, None, False)]
        m.append(("model.norm.weight", "lnf.weight", 0, None, False))
        m.append(("lm_head.weight", "lm_head.weight", 0, V, False))
    return m


def to_hf(c, W):
    out = {}
    for hn, on, r0, rows, tr in hf_map(c):
        x = W[on]
        x = x[r0:r0 + rows] if rows is not None else x
        out[hn] = (x.t() if tr else x).contiguous()
    return out


def from_hf(c, Hd):
    """Hugging Face tensors (weights or gradients) back into our layout; padding rows are zero."""
    shapes = dict(param_table(c))
    ref = next(iter(Hd.values()))
    W = {n: torch.zeros(s, dtype=ref.dtype, device=ref.device) for n, s in shapes.items()}
    for hn, on, r0, rows, tr in hf_map(c):
        x = Hd[hn].t() if tr else Hd[hn]
        W[on][r0:r0 + x.shape[0]] = x
    return W


# ----------------------------------------------------------------------------- plain PyTorch (the spec)

def rope_tables(c, T, device):
    """cos/sin [T, hs] as HF's LlamaRotaryEmbedding builds them: float32 throughout."""
    hs = c.head_size
    inv_freq = 1.0 / (ROPE_THETA ** (torch.arange(0, hs, 2, dtype=torch.int64, device=device).float() / hs))
    freqs = torch.outer(torch.arange(T, device=device).float(), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rope(x, cos, sin):
    h = x.shape[-1] // 2
    rot = torch.cat((-x[..., h:], x[..., :h]), dim=-1)  # rotate_half
    return x * cos + rot * sin


def norm(c, x, w, b):
    """LayerNorm (GPT-2) or RMSNorm over the last dim: the width, or a head's values (Qwen3's q/k norm)."""
    if c.gpt2:
        return F.layer_norm(x, (c.dim,), w, b, NORM_EPS)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + NORM_EPS) * w


def linear(x, w, b=None):
    y = x @ w.t()
    return y + b if b is not None else y


def plain_logits(c, W, tokens):
    """nobubble's forward, written out: fused qkv rows (q heads, k heads, v heads), query head h
    reads kv head h // (H/KV), GELU tanh or SwiGLU (gate rows first), head = wte when tied."""
    B, T = tokens.shape
    H, KV, hs = c.heads, c.kv_heads, c.head_size
    x = W["wte"][tokens]
    if c.gpt2:
        x = x + W["wpe"][:T]
    causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
    if not c.gpt2:
        cos, sin = (t.to(x.dtype) for t in rope_tables(c, T, x.device))
    for l in range(c.layers):
        p = f"layers.{l}."
        h = norm(c, x, W[p + "ln1.weight"], W.get(p + "ln1.bias"))
        qkv = linear(h, W[p + "attn.qkv.weight"], W.get(p + "attn.qkv.bias"))
        q, k, v = qkv.split([H * hs, KV * hs, KV * hs], dim=-1)
        q = q.view(B, T, H, hs).transpose(1, 2)
        k = k.view(B, T, KV, hs).transpose(1, 2)
        v = v.view(B, T, KV, hs).transpose(1, 2)
        if c.qk_norm:  # Qwen3: each head normalized over its hs values, before RoPE
            q, k = norm(c, q, W[p + "attn.q_norm.weight"], None), norm(c, k, W[p + "attn.k_norm.weight"], None)
        if not c.gpt2:
            q, k = rope(q, cos, sin), rope(k, cos, sin)
        if KV != H:
            k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(hs)
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, H * hs)
        x = x + linear(y, W[p + "attn.proj.weight"], W.get(p + "attn.proj.bias"))
        h = norm(c, x, W[p + "ln2.weight"], W.get(p + "ln2.bias"))
        if c.gpt2:
            f = F.gelu(linear(h, W[p + "mlp.fc.weight"], W[p + "mlp.fc.bias"]), approximate="tanh")
            x = x + linear(f, W[p + "mlp.proj.weight"], W[p + "mlp.proj.bias"])
        else:
            g, u = linear(h, W[p + "mlp.gate_up.weight"]).split([c.ffn, c.ffn], dim=-1)
            x = x + linear(F.silu(g) * u, W[p + "mlp.down.weight"])
    x = norm(c, x, W["lnf.weight"], W.get("lnf.bias"))
    head = W["wte"] if c.tied else W["lm_head.weight"]
    return x @ head[:c.vocab].t()


# ----------------------------------------------------------------------------- Hugging Face

def hf_version():
    try:
        import transformers
        return transformers.__version__
    except ImportError:
        return None


def dtype_kw(dtype):
    """from_pretrained's dtype argument: `dtype` in transformers 5, `torch_dtype` before."""
    major = int(hf_version().split(".")[0])
    return {"dtype": dtype} if major >= 5 else {"torch_dtype": dtype}


def hf_model(c, device):
    import transformers
    major = int(transformers.__version__.split(".")[0])
    ids = dict(bos_token_id=50256, eos_token_id=50256) if c.vocab > 50256 else dict(bos_token_id=None, eos_token_id=None)
    if c.gpt2:
        conf = transformers.GPT2Config(vocab_size=c.vocab, n_positions=c.seq, n_embd=c.dim, n_layer=c.layers,
                                       n_head=c.heads, n_inner=c.ffn, activation_function="gelu_new",
                                       resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                       layer_norm_epsilon=NORM_EPS, tie_word_embeddings=True, **ids)
    elif c.qkv_bias or c.qk_norm:
        rope_kw = ({"rope_parameters": {"rope_type": "default", "rope_theta": ROPE_THETA}} if major >= 5
                   else {"rope_theta": ROPE_THETA})
        kw = dict(vocab_size=c.vocab, hidden_size=c.dim, intermediate_size=c.ffn, num_hidden_layers=c.layers,
                  num_attention_heads=c.heads, num_key_value_heads=c.kv_heads, hidden_act="silu",
                  max_position_embeddings=c.seq, rms_norm_eps=NORM_EPS, tie_word_embeddings=False,
                  use_sliding_window=False, attention_dropout=0.0, **rope_kw, **ids)
        if c.qk_norm:
            conf = transformers.Qwen3Config(head_dim=c.head_size, attention_bias=False, **kw)
        else:
            conf = transformers.Qwen2Config(**kw)
    else:
        rope_kw = ({"rope_parameters": {"rope_type": "default", "rope_theta": ROPE_THETA}} if major >= 5
                   else {"rope_theta": ROPE_THETA})
        conf = transformers.LlamaConfig(vocab_size=c.vocab, hidden_size=c.dim, intermediate_size=c.ffn,
                                        num_hidden_layers=c.layers, num_attention_heads=c.heads,
                                        num_key_value_heads=c.kv_heads, head_dim=c.head_size, hidden_act="silu",
                                        max_position_embeddings=c.seq, rms_norm_eps=NORM_EPS,
                                        tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
                                        **rope_kw, **ids)
    # eager attention: the plain softmax(QK^T)V, no fused kernel with its own numerics
    model = transformers.AutoModelForCausalLM.from_config(conf, attn_implementation="eager")
    want = c.hf_class()
    if type(model).__name__ != want:
        raise SystemExit(f"ref_check: transformers built {type(model).__name__}, expected {want}")
    impl = getattr(model.config, "_attn_implementation", None)
    if impl != "eager":
        raise SystemExit(f"ref_check: the model runs '{impl}' attention, expected 'eager'")
    return model.to(device=device, dtype=torch.float32)


def hf_load(c, model, W):
    sd = to_hf(c, {k: v.to(torch.float32) for k, v in W.items()})
    res = model.load_state_dict(sd, strict=False)
    missing = set(res.missing_keys) - ({"lm_head.weight"} if c.tied else set())
    if missing or res.unexpected_keys:
        raise SystemExit(f"ref_check: HF state dict mismatch: missing {sorted(missing)}, unexpected {res.unexpected_keys}")
    if c.tied and model.lm_head.weight.data_ptr() != model.transformer.wte.weight.data_ptr():
        raise SystemExit("ref_check: GPT2LMHeadModel's lm_head is not tied to transformer.wte")


# ----------------------------------------------------------------------------- runs

def adamw(named_params):
    decay = [p for _, p in named_params if p.ndim >= 2]
    other = [p for _, p in named_params if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": ADAMW["weight_decay"]}, {"params": other, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=ADAMW["lr"], betas=ADAMW["betas"], eps=ADAMW["eps"], foreach=False)


def train(c, forward, named_params, to_ours, tokens, targets, steps):
    """Step 0's loss, logits and gradients, then `steps` AdamW steps on the same batch.
    forward() -> logits; to_ours(dict of tensors by param name) -> our layout."""
    opt = adamw(named_params)
    losses, first = [], None
    for s in range(steps):
        opt.zero_grad(set_to_none=True)
        logits = forward()
        loss = F.cross_entropy(logits.reshape(-1, c.vocab), targets.reshape(-1))
        loss.backward()
        losses.append(loss.item())
        if s == 0:
            grads = to_ours({n: p.grad.detach().clone() for n, p in named_params})
            first = dict(loss=loss.detach().clone(), logits=logits.detach().clone(), grads=grads)
        opt.step()
    first["losses"] = torch.tensor(losses, dtype=torch.float64)
    first["final"] = to_ours({n: p.detach().clone() for n, p in named_params})
    return first


def run_plain(c, W, tokens, targets, steps, dtype, device):
    P = {n: w.to(device=device, dtype=dtype).clone().requires_grad_(True) for n, w in W.items()}
    named = [(n, P[n]) for n, _ in param_table(c)]
    return train(c, lambda: plain_logits(c, P, tokens), named, lambda d: d, tokens, targets, steps)


def run_hf(c, W, tokens, targets, steps, device):
    model = hf_model(c, device)
    hf_load(c, model, W)
    model.train()  # dropout is 0 in the config: train mode only enables autograd bookkeeping
    named = [(n, p) for n, p in model.named_parameters()]  # the tied head appears once, as wte
    hf_names = {hn for hn, *_ in hf_map(c)}
    if {n for n, _ in named} != hf_names:
        raise SystemExit(f"ref_check: HF parameters {sorted({n for n, _ in named} ^ hf_names)} do not match the mapping")

    def to_ours(d):
        return from_hf(c, d)

    fwd = lambda: model(input_ids=tokens, use_cache=False).logits
    return train(c, fwd, named, to_ours, tokens, targets, steps)


# ----------------------------------------------------------------------------- comparisons

def relerr(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    den = b.norm().item()
    return (a - b).norm().item() / (den if den > 1e-30 else 1e-30)


class Report:
    def __init__(self):
        self.ok = True

    def check(self, what, err, tol, note=""):
        good = err <= tol
        self.ok &= good
        print(f"  {'ok  ' if good else 'FAIL'} {what:<44} rel err {err:9.2e}  (tol {tol:.0e}){note}")
        return good

    def fact(self, cond, what):
        self.ok &= bool(cond)
        print(f"  {'ok  ' if cond else 'FAIL'} {what}")

    def finish(self):
        print("REF OK" if self.ok else "REF FAIL")
        sys.exit(0 if self.ok else 1)


def compare_runs(rep, c, a, ref, label):
    """a vs ref (both run() results); returns the worst gradient (err, name)."""
    rep.check(f"{label}: loss", relerr(a["loss"], ref["loss"]), TOL["loss"])
    rep.check(f"{label}: logits [B, T, V]", relerr(a["logits"], ref["logits"]), TOL["logits"])
    worst = max((relerr(a["grads"][n], ref["grads"][n]), n) for n, _ in param_table(c))
    rep.check(f"{label}: worst gradient", worst[0], TOL["grad"], f"  {worst[1]}")
    rep.check(f"{label}: losses of {len(ref['losses'])} AdamW steps", relerr(a["losses"], ref["losses"]), TOL["losses"])
    wf = max((relerr(a["final"][n], ref["final"][n]), n) for n, _ in param_table(c))
    rep.check(f"{label}: worst weight after the steps", wf[0], TOL["weights"], f"  {wf[1]}")
    return worst


# ----------------------------------------------------------------------------- safetensors

ST_DTYPES = {torch.float32: "F32", torch.int32: "I32", torch.float64: "F64"}
ST_TORCH = {v: k for k, v in ST_DTYPES.items()}


def tensor_bytes(t):
    try:
        return t.numpy().tobytes()
    except (ImportError, RuntimeError):  # torch built or installed without numpy
        return bytes(t.reshape(-1).view(torch.uint8).tolist())


def st_write(path, tensors, meta):
    """tensors: list of (name, tensor). Written in order, metadata values as strings."""
    header, blobs, off = {"__metadata__": {k: str(v) for k, v in meta.items()}}, [], 0
    for name, t in tensors:
        t = t.detach().cpu().contiguous()
        b = tensor_bytes(t)
        header[name] = {"dtype": ST_DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def st_read(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    out = {}
    for name, e in header.items():
        s, t = e["data_offsets"]
        buf = bytearray(data[8 + n + s:8 + n + t])
        out[name] = torch.frombuffer(buf, dtype=ST_TORCH[e["dtype"]]).reshape(e["shape"]) if buf else \
            torch.zeros(e["shape"], dtype=ST_TORCH[e["dtype"]])
    return meta, out


# ----------------------------------------------------------------------------- commands

def setup_torch(device):
    # float32 must mean float32: TF32 would round matmul inputs to 10 mantissa bits. torch 2.9+
    # has fp32_precision and warns about (or refuses a mix with) the older allow_tf32 flags.
    if hasattr(torch.backends, "fp32_precision"):
        torch.backends.fp32_precision = "ieee"
        torch.backends.cuda.matmul.fp32_precision = "ieee"
        torch.backends.cudnn.fp32_precision = "ieee"
    else:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(device)


def cmd_gen(a):
    dev = setup_torch(a.device)
    vocab = a.vocab or (TINY_VOCAB if a.preset.endswith("-tiny") else None)
    c = Config(a.preset, vocab, a.seq)
    B, T = a.batch, a.T or c.seq
    hf = hf_version()
    print(f"ref_check gen: {c.preset} ({c.arch}) layers {c.layers}, dim {c.dim}, heads {c.heads}/{c.kv_heads}, "
          f"ffn {c.ffn}, vocab {c.vocab} (padded {c.vocab_padded}), seq {c.seq}; batch {B} x {T}; device {dev}; "
          f"torch {torch.__version__}, transformers {hf or '(not installed)'}")
    if hf is None and not a.allow_no_hf:
        raise SystemExit("ref_check: transformers is not importable; install it, or pass --allow-no-hf to write a "
                         "reference from the plain PyTorch implementation alone (no Hugging Face cross-check)")
    W = init_weights(c, a.seed)
    g = torch.Generator().manual_seed(a.seed + 1)
    seq = torch.randint(0, c.vocab, (B, T + 1), generator=g)
    tokens, targets = seq[:, :T].to(dev), seq[:, 1:].to(dev)

    rep = Report()
    t0 = time.time()
    ref = run_plain(c, W, tokens, targets, a.steps, torch.float64, dev)
    print(f"float64 reference (plain PyTorch): loss {ref['loss'].item():.6f} (ln V = {math.log(c.vocab):.4f}), "
          f"{a.steps} AdamW steps {ref['losses'][0].item():.6f} -> {ref['losses'][-1].item():.6f}  [{time.time() - t0:.1f} s]")
    rep.fact(abs(ref["loss"].item() - math.log(c.vocab)) < 0.5, "initial loss is near ln(vocab) (small random init)")
    rep.fact(ref["losses"][-1] < ref["losses"][0], "the loss falls over the AdamW steps")
    rep.fact(all((ref["grads"][n][c.vocab:] == 0).all() for n in ("wte", "lm_head.weight") if n in ref["grads"]),
             "padding rows of the embedding/head get zero gradient")

    if hf:
        t0 = time.time()
        f32 = run_hf(c, W, tokens, targets, a.steps, dev)
        impl = "hf-float32"
        print(f"Hugging Face {c.hf_class()} float32 (TF32 off), "
              f"eager attention, same weights through the export mapping  [{time.time() - t0:.1f} s]")
    else:
        print("WARNING: transformers not installed: the Hugging Face cross-check did not run; the float32 "
              "noise floor below is plain PyTorch's")
        f32 = run_plain(c, W, tokens, targets, a.steps, torch.float32, dev)
        impl = "plain-float32"
    worst = compare_runs(rep, c, f32, ref, impl)

    meta = dict(format=FORMAT, version=VERSION, **c.meta(), batch=B, T=T, steps=a.steps, lr=ADAMW["lr"],
                beta1=ADAMW["betas"][0], beta2=ADAMW["betas"][1], eps=ADAMW["eps"],
                weight_decay=ADAMW["weight_decay"], grad_clip=0, lr_schedule="constant", seed=a.seed,
                reference="float64 plain PyTorch (float32 RoPE tables, as HF)", device=str(dev),
                torch=torch.__version__, transformers=hf or "none", torch32_impl=impl,
                torch32_loss_relerr=f"{relerr(f32['loss'], ref['loss']):.3e}",
                torch32_logits_relerr=f"{relerr(f32['logits'], ref['logits']):.3e}",
                torch32_grad_worst_relerr=f"{worst[0]:.3e}", torch32_grad_worst_name=worst[1],
                torch32_losses_relerr=f"{relerr(f32['losses'], ref['losses']):.3e}",
                created=time.strftime("%Y-%m-%d"))
    table = param_table(c)
    f = torch.float32
    tensors = [("tokens", tokens.to(torch.int32)), ("targets", targets.to(torch.int32)),
               ("loss", ref["loss"].reshape(1).to(f)), ("logits", ref["logits"].to(f)),
               ("losses10", ref["losses"].to(f)),
               ("torch32.loss", f32["loss"].reshape(1).to(f)), ("torch32.losses10", f32["losses"].to(f))]
    tensors += [("w." + n, W[n]) for n, _ in table]
    tensors += [("g." + n, ref["grads"][n].to(f)) for n, _ in table]
    if not a.no_final_weights:
        tensors += [("w10." + n, ref["final"][n].to(f)) for n, _ in table]
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    st_write(a.out, tensors, meta)
    size = os.path.getsize(a.out)
    # read it back: names, shapes and bytes as written
    m2, t2 = st_read(a.out)
    rep.fact(m2 == {k: str(v) for k, v in meta.items()} and all(
        torch.equal(t2[n], t.detach().cpu()) for n, t in tensors), f"{a.out} reads back identical ({size / 1e6:.2f} MB)")
    if size > 4e6 and c.preset.endswith("-tiny"):
        rep.fact(False, f"{a.out} is {size / 1e6:.1f} MB: committed references should stay under 4 MB")
    rep.finish()


def cmd_check_export(a):
    dev = setup_torch(a.device)
    meta, R = st_read(a.ref)
    if meta.get("format") != FORMAT:
        raise SystemExit(f"ref_check: {a.ref} is not a reference file written by 'ref_check.py gen'")
    c = Config.from_meta(meta)
    want = c.hf_class()
    print(f"ref_check check-export: {a.hf} against {a.ref} ({c.preset}, vocab {c.vocab})")
    rep = Report()
    W = {n: R["w." + n] for n, _ in param_table(c)}
    expect = to_hf(c, W)

    # 1. the files themselves, read without transformers
    with open(os.path.join(a.hf, "config.json")) as f:
        conf = json.load(f)
    if c.gpt2:
        fields = dict(model_type="gpt2", vocab_size=c.vocab, n_embd=c.dim, n_layer=c.layers, n_head=c.heads,
                      n_positions=c.seq, n_inner=c.ffn, activation_function="gelu_new", tie_word_embeddings=True)
    else:
        fields = dict(model_type={"Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}.get(want, "llama"),
                      vocab_size=c.vocab, hidden_size=c.dim, intermediate_size=c.ffn,
                      num_hidden_layers=c.layers, num_attention_heads=c.heads, num_key_value_heads=c.kv_heads,
                      head_dim=c.head_size, max_position_embeddings=c.seq, hidden_act="silu", tie_word_embeddings=False)
    bad = {k: (conf.get(k), v) for k, v in fields.items() if conf.get(k) != v}
    rep.fact(not bad and conf.get("architectures") == [want], f"config.json: {want}, {len(fields)} fields as the reference"
             + (f"; differ (found, want): {bad}" if bad else ""))
    fmeta, T = st_read(os.path.join(a.hf, "model.safetensors"))
    rep.fact(fmeta.get("format") == "pt", "model.safetensors metadata format is 'pt' (from_pretrained requires it)")
    rep.fact(set(T) == set(expect), f"model.safetensors holds exactly the {len(expect)} expected tensors"
             + (f"; extra {sorted(set(T) - set(expect))}, missing {sorted(set(expect) - set(T))}" if set(T) != set(expect) else ""))
    diff = [n for n in expect if n in T and not torch.equal(T[n], expect[n])]
    rep.fact(not diff, "every tensor equals the reference weights in HF layout, bit for bit"
             + (f"; differ: {diff[:4]}{'...' if len(diff) > 4 else ''} (export the checkpoint written by "
                "'test_torch_ref --save-ckpt', which holds the reference weights)" if diff else ""))

    # 2. what transformers makes of them
    if not hf_version():
        if not a.allow_no_hf:
            raise SystemExit("ref_check: transformers is not importable (pass --allow-no-hf to check the files only)")
        print("WARNING: transformers not installed: from_pretrained and the logits were not checked")
        rep.finish()
    import transformers
    model = transformers.AutoModelForCausalLM.from_pretrained(a.hf, attn_implementation="eager",
                                                              **dtype_kw(torch.float32)).to(dev).eval()
    print(f"  loaded as {type(model).__name__} (transformers {transformers.__version__})")
    rep.fact(type(model).__name__ == want, f"class is {want}")
    if c.gpt2:
        rep.fact(model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr(), "lm_head tied to wte")
    sd = model.state_dict()
    diff = [hn for hn, t in expect.items() if not torch.equal(sd[hn].cpu(), t)]
    rep.fact(not diff, f"from_pretrained's weights equal the reference's bit for bit ({len(expect)} tensors)"
             + (f"; differ: {diff[:4]}" if diff else ""))
    with torch.no_grad():
        logits = model(input_ids=R["tokens"].long().to(dev), use_cache=False).logits
        loss = F.cross_entropy(logits.reshape(-1, c.vocab), R["targets"].long().to(dev).reshape(-1))
    rep.check("loss of the export", relerr(loss.reshape(1), R["loss"]), TOL["loss"])
    rep.check("logits of the export [B, T, V]", relerr(logits, R["logits"]), TOL["logits"])
    rep.finish()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gen", help="write a reference file")
    g.add_argument("--preset", required=True, choices=sorted(PRESETS))
    g.add_argument("--out", required=True, help="output .safetensors")
    g.add_argument("--vocab", type=int, help=f"vocabulary (default: {TINY_VOCAB} for *-tiny, else the preset's)")
    g.add_argument("--seq", type=int, help="context length (default: the preset's)")
    g.add_argument("--batch", type=int, default=2)
    g.add_argument("--T", type=int, help="tokens per row (default: seq)")
    g.add_argument("--steps", type=int, default=10, help="AdamW steps")
    g.add_argument("--seed", type=int, default=1234)
    g.add_argument("--device", default="auto", help="auto, cpu or cuda")
    g.add_argument("--no-final-weights", action="store_true", help="leave out w10.* (weights after the steps)")
    g.add_argument("--tol-weights", type=float, default=TOL["weights"],
                   help="tolerance of the float32 weights after the steps against float64; Adam turns float32 "
                        "rounding of near-zero gradients into whole-lr steps, so large models need more (gpt2: 2e-2)")
    g.add_argument("--allow-no-hf", action="store_true", help="without transformers: plain PyTorch only")
    e = sub.add_parser("check-export", help="load a 'nobubble export' directory with transformers")
    e.add_argument("--hf", required=True, help="directory written by 'nobubble export'")
    e.add_argument("--ref", required=True, help="reference file whose weights the export holds")
    e.add_argument("--device", default="auto")
    e.add_argument("--allow-no-hf", action="store_true", help="without transformers: check the files only")
    a = ap.parse_args()
    if a.cmd == "gen":
        TOL["weights"] = a.tol_weights
        if a.T and a.T > (a.seq or Config(a.preset).seq):
            raise SystemExit("ref_check: --T exceeds the context length")
        cmd_gen(a)
    else:
        cmd_check_export(a)


if __name__ == "__main__":
    main()
