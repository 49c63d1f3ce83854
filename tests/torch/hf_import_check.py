"""nobubble train --init-from against checkpoints that transformers itself writes.

For each case, a tiny random model of a transformers class is saved with save_pretrained (F32,
BF16 or F16; one file or shards through max_shard_size), then
  1. nobubble train --init-from DIR --steps 0 (the step-0 checkpoint) and nobubble export;
  2. the export, loaded with from_pretrained, must hold exactly the saved weights (as float32:
     BF16 and F16 values are floats exactly);
  3. nobubble eval of the step-0 checkpoint must give transformers' float32 loss on the same
     batches (its own math: eps, rope theta and scaling, GQA, the tied head), to 2e-4 nats (eval
     prints 4 decimals).
The Llama 3.1 / 3.2 cases have Llama 3's vocabulary (128,256; the uint16 shard's ids stay below
500) and rope_scaling llama3 or linear, with an original context of 16 so that at T = 32 the
scaling moves every band (kept, interpolated, divided) by far more than the tolerance.
Classes: GPT2LMHeadModel, LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM.
Prints one line per check and ends with "IMPORT OK" or "IMPORT FAIL" (exit 0 / 1). Needs torch
and transformers (the device machine has them; see tests/torch/README.md for building there):
    python3 tests/torch/hf_import_check.py --nb build-dev/nobubble --work /tmp/nbimport
"""
import argparse
import os
import re
import struct
import subprocess
import sys

import torch
import torch.nn.functional as F
import transformers

B, T, VOCAB = 2, 32, 500


def shard(path, n, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (n,), generator=g)
    with open(path, "wb") as f:
        f.write(struct.pack("<3i", 20240520, 1, n) + b"\0" * 1012)
        f.write(struct.pack("<%dH" % n, *ids.tolist()))
    return ids


def rope_kw(theta, scaling):
    """RoPE arguments as the installed transformers takes them (5: rope_parameters)."""
    if int(transformers.__version__.split(".")[0]) >= 5:
        return {"rope_parameters": dict(scaling, rope_theta=theta)}
    return {"rope_theta": theta, "rope_scaling": scaling}


def cases():
    L = transformers
    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 16}
    yield "gpt2 f32 tied", L.GPT2Config(vocab_size=VOCAB, n_positions=T, n_embd=64, n_layer=2, n_head=4,
                                        layer_norm_epsilon=1e-5), L.GPT2LMHeadModel, torch.float32, None
    yield "llama bf16 sharded, eps 1e-6, theta 5e5, GQA", L.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=172, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=T, rms_norm_eps=1e-6, rope_theta=500000.0,
        tie_word_embeddings=False), L.LlamaForCausalLM, torch.bfloat16, "100KB"
    yield "llama f16 tied", L.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=T, tie_word_embeddings=True), L.LlamaForCausalLM, torch.float16, None
    yield "mistral bf16 (sliding_window null)", L.MistralConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, max_position_embeddings=T, sliding_window=None), L.MistralForCausalLM, torch.bfloat16, None
    yield "llama 3.1 shape bf16: vocab 128256, rope_scaling llama3", L.LlamaConfig(
        vocab_size=128256, hidden_size=64, intermediate_size=172, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=T, tie_word_embeddings=False, **rope_kw(10000.0, llama3)),\
        L.LlamaForCausalLM, torch.bfloat16, None
    yield "llama 3.2 shape f32 tied: vocab 128256, rope_scaling llama3, theta 5e5", L.LlamaConfig(
        vocab_size=128256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, max_position_embeddings=T, tie_word_embeddings=True, **rope_kw(500000.0, llama3)),\
        L.LlamaForCausalLM, torch.float32, None
    yield "llama f32: rope_scaling linear x4", L.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=T, tie_word_embeddings=False,
        **rope_kw(10000.0, {"rope_type": "linear", "factor": 4.0})), L.LlamaForCausalLM, torch.float32, None
    # Qwen2: q/k/v biases (the 1-D perturbation below makes them non-zero), Qwen's theta, tied
    yield "qwen2 f32 tied, qkv biases, theta 1e6, GQA", L.Qwen2Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=T, rope_theta=1000000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=True, use_sliding_window=False), L.Qwen2ForCausalLM, torch.float32, None
    # Qwen3 (transformers >= 4.51): q/k norm, head_dim 24 != hidden / heads (o_proj [64, 96])
    if hasattr(L, "Qwen3Config"):
        yield "qwen3 bf16 tied, q/k norm, head_dim 24", L.Qwen3Config(
            vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=24, max_position_embeddings=T, rope_theta=1000000.0, rms_norm_eps=1e-6,
            tie_word_embeddings=True, attention_bias=False, use_sliding_window=False), L.Qwen3ForCausalLM, \
            torch.bfloat16, None
    else:
        print(f"SKIP qwen3: transformers {L.__version__} has no Qwen3ForCausalLM (4.51 or later)")


def hf_loss(model, ids, nbatches):
    tot = 0.0
    with torch.no_grad():
        for b in range(nbatches):
            tok = ids[b * B * T: (b + 1) * B * T + 1]
            x, y = tok[:-1].view(B, T), tok[1:].view(B, T)
            logits = model(input_ids=x).logits.float()
            tot += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum").item()
    return tot / (nbatches * B * T)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nb", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    tokens = os.path.join(a.work, "tokens.bin")
    ids = shard(tokens, 4 * B * T + 1, 7)
    torch.backends.cuda.matmul.allow_tf32 = False
    bad = 0
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    for i, (name, cfg, cls, dtype, max_shard) in enumerate(cases()):
        torch.manual_seed(100 + i)
        model = cls(cfg).eval()
        with torch.no_grad():  # norms away from 1 so a dropped or swapped one shows
            for n, p in model.named_parameters():
                if p.ndim == 1:
                    p.add_(0.1 * torch.randn_like(p))
        model = model.to(dtype)
        d = os.path.join(a.work, f"case{i}")
        kw = {"max_shard_size": max_shard} if max_shard else {}
        model.save_pretrained(d, safe_serialization=True, **kw)
        files = sorted(f for f in os.listdir(d) if "safetensors" in f)
        run, out = os.path.join(a.work, f"run{i}"), os.path.join(a.work, f"out{i}")
        cmd = [a.nb, "train", "--init-from", d, "--steps", "0", "--batch", str(B), "--seq", str(T), "--data", tokens,
               "--val-data", "none", "--out", run, "--fresh", "--quiet", "--no-progress"]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            print(f"FAIL {name}: import exit {r.returncode}: {r.stderr.strip()[-400:]}  (files {files})")
            bad += 1
            continue
        r = subprocess.run([a.nb, "export", "--ckpt", run, "--hf", out], capture_output=True, text=True)
        if r.returncode != 0:
            print(f"FAIL {name}: export exit {r.returncode}: {r.stderr.strip()[-300:]}")
            bad += 1
            continue
        # transformers 5 names the argument dtype, 4.x torch_dtype
        kw = {"dtype": torch.float32} if int(transformers.__version__.split(".")[0]) >= 5 else {"torch_dtype": torch.float32}
        exp = transformers.AutoModelForCausalLM.from_pretrained(out, **kw).eval()
        want = {k: v.float() for k, v in model.state_dict().items()}
        got = exp.state_dict()
        diff = [k for k in want if k in got and not torch.equal(want[k], got[k])]
        missing = [k for k in want if k not in got]
        ok = not diff and not missing
        print(f"{'ok  ' if ok else 'FAIL'} {name}: saved as {files}; exported weights equal the saved ones"
              f" ({len(want)} tensors){'; differ ' + str(diff[:4]) if diff else ''}{'; missing ' + str(missing[:4]) if missing else ''}")
        bad += not ok
        ev = subprocess.run([a.nb, "eval", "--ckpt", run, "--data", tokens, "--batch", str(B), "--batches", "4"],
                            capture_output=True, text=True)
        m = re.search(r"loss ([0-9.]+) nats", ev.stdout)
        ref = hf_loss(model.float(), ids, 4)
        ok = m is not None and abs(float(m.group(1)) - ref) <= 2e-4
        print(f"{'ok  ' if ok else 'FAIL'} {name}: nobubble eval {m.group(1) if m else ev.stderr.strip()[-300:]}"
              f" vs transformers float32 {ref:.5f}")
        bad += not ok
    print("IMPORT OK" if not bad else f"IMPORT FAIL ({bad})")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
