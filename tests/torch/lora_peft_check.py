"""LoRA against PEFT on the GPU machine (issue 33, point 1's GPU checks).

A small random LlamaForCausalLM (every target: q, k, v, o, gate, up, down) and GPT2LMHeadModel
(c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj: Conv1D, peft's fan_in_fan_out), from_config and
save_pretrained in fp32 (norms moved off 1 so a dropped one shows), with LoRA of rank R:
  1. nobubble train --init-from DIR --lora R --steps 0 writes the step-0 adapters (A from
     nobubble's seeded kaiming-uniform, B = 0); nobubble export --hf turns them into a PEFT
     adapter directory, which peft loads (PeftModel.from_pretrained(..., is_trainable=True)): both
     sides start from the same A and B.
  2. nobubble runs 20 AdamW steps in fp32 (--device cuda --precision fp32, constant lr, no
     clipping, weight decay on A and B); it is stopped after steps 1 and 2 and resumed (bitwise),
     so its checkpoints give the gradients of those steps from AdamW's first moments
     (g1 = m1 / (1 - beta1); g2 = (m2 - beta1 m1) / (1 - beta1)). PEFT + torch.optim.AdamW run the
     same 20 steps on the same batches (nobubble's loader walks the shard in order).
     - logits: the per-step losses nobubble logs (9 digits, a function of every logit) against
       PEFT's: step 1 (B = 0: the base) within 1e-4 relative, every step within 1e-3;
     - adapter gradients: step 1 (only B's are nonzero) and step 2 (A's and B's), each tensor's
       relative L2 error within 1e-3;
     - the adapters after 20 steps (nobubble's export vs PEFT's), relative L2 error within 1e-3.
  3. nobubble's exported step-20 adapter loaded in peft on the base gives nobubble eval's loss on
     batch 0 (2e-4 nats: eval prints 4 decimals); the merged export (export --merge) loads in
     transformers with the same logits as that PEFT model (1e-4 relative).
Prints one line per check and ends with "LORA PEFT OK" or "LORA PEFT FAIL (n)".
    python3 tests/torch/lora_peft_check.py --nb build-dev/nobubble --work /tmp/nblora
"""
import argparse
import json
import os
import re
import shutil
import struct
import subprocess
import sys

import torch
import torch.nn.functional as F
import transformers

B, T, STEPS, R, ALPHA = 4, 64, 20, 8, 16
LR, BETAS, EPS, WD = 1e-3, (0.9, 0.95), 1e-8, 0.1
SITES = {"q": ("self_attn", "q_proj"), "k": ("self_attn", "k_proj"), "v": ("self_attn", "v_proj"),
         "o": ("self_attn", "o_proj"), "gate": ("mlp", "gate_proj"), "up": ("mlp", "up_proj"), "down": ("mlp", "down_proj")}
GPT2_SITES = {"q": ("attn", "c_attn"), "o": ("attn", "c_proj"), "up": ("mlp", "c_fc"), "down": ("mlp", "c_proj")}


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:3])}... exit {r.returncode}: {(r.stderr or r.stdout).strip()[-400:]}")
    return r


def write_shard(path, ids):
    with open(path, "wb") as f:
        f.write(struct.pack("<3i", 20240520, 1, len(ids)) + b"\0" * 1012)
        f.write(struct.pack("<%dH" % len(ids), *ids))


def read_st(path):
    """A safetensors file of F32 tensors as {name: tensor}."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, v in head.items():
        if k == "__metadata__":
            continue
        assert v["dtype"] == "F32", (k, v["dtype"])
        a, b = v["data_offsets"]
        out[k] = torch.frombuffer(bytearray(data[a:b]), dtype=torch.float32).reshape(v["shape"]).clone()
    return out


def peft_key(nb_name, gpt2):
    """nobubble's layers.3.lora.q.A -> peft's base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight
    (GPT-2: base_model.model.transformer.h.3.attn.c_attn.lora_A.weight)"""
    _, l, _, site, ab = nb_name.split(".")
    if gpt2:
        parent, mod = GPT2_SITES[site]
        return f"base_model.model.transformer.h.{l}.{parent}.{mod}.lora_{ab}.weight"
    parent, mod = SITES[site]
    return f"base_model.model.model.layers.{l}.{parent}.{mod}.lora_{ab}.weight"


def moments(ckpt, gpt2):
    m = read_st(os.path.join(ckpt, "ckpt", "optim.safetensors"))
    return {peft_key(k[: -len(".exp_avg")], gpt2): v for k, v in m.items() if k.endswith(".exp_avg")}


def metrics_losses(d):
    with open(os.path.join(d, "metrics.jsonl")) as f:
        return [json.loads(l)["loss"] for l in f if '"loss"' in l]


def rel(a, b):
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def peft_params(model):
    return {n.replace(".default", ""): p for n, p in model.named_parameters() if p.requires_grad}


def cases():
    L = transformers
    yield ("llama", L.LlamaConfig(vocab_size=32000, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=T,
                                  rms_norm_eps=1e-5), L.LlamaForCausalLM, "q,k,v,o,gate,up,down", 7)
    yield ("gpt2", L.GPT2Config(vocab_size=50257, n_positions=T, n_embd=64, n_layer=2, n_head=4), L.GPT2LMHeadModel,
           "q,k,v,o,up,down", 3)  # target_modules: c_attn, c_proj (both), c_fc


def load_kw():
    return {"dtype": torch.float32} if int(transformers.__version__.split(".")[0]) >= 5 else {"torch_dtype": torch.float32}


def check_case(a, i, name, cfg, cls, targets, ntargets, report):
    import peft
    gpt2 = name == "gpt2"
    work = os.path.join(a.work, name)
    os.makedirs(work, exist_ok=True)
    torch.manual_seed(33 + i)
    base = cls(cfg)
    with torch.no_grad():
        for _, p in base.named_parameters():
            if p.ndim == 1:
                p.add_(0.1 * torch.randn_like(p))
    hf = os.path.join(work, "base")
    base.save_pretrained(hf, safe_serialization=True)
    g = torch.Generator().manual_seed(34 + i)
    ids = torch.randint(0, cfg.vocab_size, (STEPS * B * T + 1,), generator=g)
    tokens = os.path.join(work, "tokens.bin")
    write_shard(tokens, ids.tolist())

    common = ["--init-from", hf, "--device", "cuda", "--precision", "fp32", "--batch", str(B), "--seq", str(T),
              "--lora", str(R), "--lora-alpha", str(ALPHA), "--lora-targets", targets,
              "--data", tokens, "--val-data", "none", "--quiet", "--no-progress"]
    train = common + ["--steps", str(STEPS), "--lr", str(LR), "--warmup", "0", "--min-lr-frac", "1", "--grad-clip", "0",
                      "--weight-decay", str(WD)]  # betas: the transformer defaults, (0.9, 0.95) = BETAS
    # 1. the step-0 adapters, as PEFT loads them
    s0 = os.path.join(work, "step0")
    run([a.nb, "train"] + common + ["--steps", "0", "--out", s0, "--fresh"])
    ad0 = os.path.join(work, "adapter0")
    run([a.nb, "export", "--ckpt", s0, "--hf", ad0])
    with open(os.path.join(ad0, "adapter_config.json")) as f:
        acfg = json.load(f)
    report(acfg["r"] == R and acfg["lora_alpha"] == ALPHA and len(acfg["target_modules"]) == ntargets,
           f"{name}: adapter_config.json: r {acfg['r']}, lora_alpha {acfg['lora_alpha']}, targets {acfg['target_modules']}")

    # 2. nobubble's 20 steps, with checkpoints after steps 1 and 2
    rd = os.path.join(work, "run")
    if os.path.exists(rd):
        shutil.rmtree(rd)
    ck = {}
    for stop in (1, 2):
        run([a.nb, "train"] + train + ["--out", rd, "--stop-after", str(stop)])
        ck[stop] = os.path.join(work, f"ckpt{stop}")
        if os.path.exists(ck[stop]):
            shutil.rmtree(ck[stop])
        shutil.copytree(rd, ck[stop])
    run([a.nb, "train"] + train + ["--out", rd])
    nb_losses = metrics_losses(rd)
    m1, m2 = moments(ck[1], gpt2), moments(ck[2], gpt2)
    nb_g = {1: {k: v / (1 - BETAS[0]) for k, v in m1.items()},
            2: {k: (m2[k] - BETAS[0] * m1[k]) / (1 - BETAS[0]) for k in m2}}

    # PEFT from the same adapters (eval(): no dropout; GPT-2's configs default to 0.1)
    model = peft.PeftModel.from_pretrained(cls.from_pretrained(hf, **load_kw()), ad0, is_trainable=True).cuda().eval()
    params = peft_params(model)
    report(set(params) == set(nb_g[1]), f"{name}: peft's trainable tensors are nobubble's adapters ({len(params)})")
    opt = torch.optim.AdamW(list(params.values()), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, foreach=False)
    ref, grads = [], {}
    for k in range(STEPS):
        tok = ids[k * B * T: (k + 1) * B * T + 1].cuda()
        logits = model(input_ids=tok[:-1].view(B, T)).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), tok[1:].reshape(-1))
        ref.append(loss.item())
        loss.backward()
        if k < 2:
            grads[k + 1] = {n: p.grad.detach().cpu().clone() for n, p in params.items()}
        opt.step()
        opt.zero_grad(set_to_none=True)
    r = [abs(x - y) / abs(y) for x, y in zip(nb_losses, ref)]
    report(len(nb_losses) == STEPS and r[0] <= 1e-4 and max(r) <= 1e-3,
           f"{name}: logits via the loss: {STEPS} AdamW steps fp32, nobubble {nb_losses[0]:.6f} -> {nb_losses[-1]:.6f}, "
           f"peft {ref[0]:.6f} -> {ref[-1]:.6f}; step 1 rel {r[0]:.1e} (<= 1e-4), worst {max(r):.1e} (<= 1e-3)")
    for step in (1, 2):
        worst, which = 0.0, ""
        for n, gt in grads[step].items():
            if gt.norm() == 0:  # step 1: A's gradient is zero on both sides (B = 0)
                worst = max(worst, 0.0 if nb_g[step][n].abs().max().item() == 0 else float("inf"))
                continue
            e = rel(nb_g[step][n], gt)
            if e > worst:
                worst, which = e, n
        report(worst <= 1e-3, f"{name}: adapter gradients at step {step}: worst relative error {worst:.1e} (<= 1e-3) {which}")
    adN = os.path.join(work, "adapter20")
    run([a.nb, "export", "--ckpt", rd, "--hf", adN])
    nb_w = read_st(os.path.join(adN, "adapter_model.safetensors"))
    worst = max(rel(nb_w[n], p.detach().cpu()) for n, p in params.items())
    report(worst <= 1e-3, f"{name}: adapters after {STEPS} steps: worst relative error {worst:.1e} (<= 1e-3)")

    # 3. nobubble's trained adapter in peft, and the merged export in transformers
    loaded = peft.PeftModel.from_pretrained(cls.from_pretrained(hf, **load_kw()), adN).cuda().eval()
    tok = ids[: B * T + 1].cuda()
    with torch.no_grad():
        lp = loaded(input_ids=tok[:-1].view(B, T)).logits.float()
    peft_loss = F.cross_entropy(lp.reshape(-1, lp.shape[-1]), tok[1:].reshape(-1)).item()
    ev = run([a.nb, "eval", "--ckpt", rd, "--data", tokens, "--batch", str(B), "--batches", "1", "--device", "cuda"])
    m = re.search(r"loss ([0-9.]+) nats", ev.stdout)
    got = float(m.group(1)) if m else None
    report(got is not None and abs(got - peft_loss) <= 2e-4,
           f"{name}: nobubble's adapter in peft: loss {peft_loss:.5f} on batch 0, nobubble eval {got}")
    merged = os.path.join(work, "merged")
    run([a.nb, "export", "--ckpt", rd, "--hf", merged, "--merge"])
    mm = transformers.AutoModelForCausalLM.from_pretrained(merged, **load_kw()).cuda().eval()
    with torch.no_grad():
        lm = mm(input_ids=tok[:-1].view(B, T)).logits.float()
    e = rel(lm, lp)
    report(e <= 1e-4, f"{name}: export --merge in transformers vs nobubble's adapter in peft: logits relative error "
                      f"{e:.1e} (<= 1e-4)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nb", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    import peft
    os.makedirs(a.work, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    print(f"transformers {transformers.__version__}, peft {peft.__version__}, torch {torch.__version__}")
    bad = []

    def report(ok, line):
        print(("ok   " if ok else "FAIL ") + line, flush=True)
        if not ok:
            bad.append(line)

    for i, case in enumerate(cases()):
        try:
            check_case(a, i, *case, report)
        except Exception as e:  # one layout's failure must not hide the other's
            report(False, f"{case[0]}: {type(e).__name__}: {str(e)[:300]}")
    print("LORA PEFT OK" if not bad else f"LORA PEFT FAIL ({len(bad)})")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
