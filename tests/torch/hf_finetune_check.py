"""Fine-tuning checks of Hugging Face models on the GPU machine (issue 32's GPU checks).

1. Per architecture, a small random model of a transformers class with the REAL vocabulary of its
   family (GPT-2 50,257; Llama 2 / Mistral 32,000; Llama 3.1 128,256 with llama3 rope_scaling;
   Qwen2.5 and Qwen3 151,936), saved with save_pretrained in bf16:
   - nobubble train --init-from DIR --device cuda --precision fp32 runs 20 AdamW steps (constant
     lr, no clipping, weight decay on 2-D tensors); the same 20 steps run in PyTorch fp32 (TF32
     off) on the same batches (nobubble's loader walks the shard in order: step k reads tokens
     [k*B*T, (k+1)*B*T + 1)). The first step's loss (the imported weights on batch 0) agrees to
     1e-4 relative, every step's to 1e-3.
   - nobubble export --hf of the trained run loads with AutoModelForCausalLM, names the class the
     model came from, and gives nobubble eval's loss on batch 0 (2e-4 nats: eval prints 4 decimals).
2. Tokenizers: nobubble tokenize (C) gives the ids of the `tokenizers` library on >= 1 MB of
   the corpus (data/sotu/raw) for each tokenizer in data/hf_tokenizers.
3. Chat: nobubble tokenize --chat renders fixed conversations to the ids of transformers'
   apply_chat_template (where tokenizer_config.json has a chat_template), each followed by the
   end-of-text token nobubble puts between examples.
Prints one line per check and ends with "FINETUNE OK" or "FINETUNE FAIL (n)".
    python3 tests/torch/hf_finetune_check.py --nb build-dev/nobubble --work /tmp/nbft
"""
import argparse
import glob
import json
import os
import re
import struct
import subprocess
import sys

import torch
import torch.nn.functional as F
import transformers

B, T, STEPS = 4, 64, 20
LR, BETAS, EPS, WD = 1e-3, (0.9, 0.95), 1e-8, 0.1


def llama31_config(L):
    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            # small, so that at T = 64 every band (kept, smoothed, divided by factor) is used
            "original_max_position_embeddings": 64}
    kw = dict(vocab_size=128256, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=True,
              bos_token_id=128000, eos_token_id=128001)
    try:  # transformers 5 keeps the rope settings in rope_parameters
        return L.LlamaConfig(rope_parameters=dict(rope, rope_theta=500000.0), **kw)
    except TypeError:
        return L.LlamaConfig(rope_theta=500000.0, rope_scaling=rope, **kw)


def cases():
    L = transformers
    yield "gpt2", L.GPT2Config(vocab_size=50257, n_positions=T, n_embd=64, n_layer=2, n_head=4), L.GPT2LMHeadModel
    yield "llama2-shaped", L.LlamaConfig(vocab_size=32000, hidden_size=64, intermediate_size=172, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=T,
                                         rms_norm_eps=1e-5), L.LlamaForCausalLM
    yield "llama3.1-shaped", llama31_config(L), L.LlamaForCausalLM
    yield "mistral-shaped", L.MistralConfig(vocab_size=32000, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                            num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=T,
                                            sliding_window=None), L.MistralForCausalLM
    if hasattr(L, "Qwen2ForCausalLM"):
        yield "qwen2.5-shaped", L.Qwen2Config(vocab_size=151936, hidden_size=64, intermediate_size=160,
                                              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                              max_position_embeddings=T, rope_theta=1e6, tie_word_embeddings=True,
                                              use_sliding_window=False), L.Qwen2ForCausalLM
    if hasattr(L, "Qwen3ForCausalLM"):
        yield "qwen3-shaped", L.Qwen3Config(vocab_size=151936, hidden_size=64, intermediate_size=160,
                                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                            head_dim=32, max_position_embeddings=T, rope_theta=1e6,
                                            tie_word_embeddings=True, use_sliding_window=False), L.Qwen3ForCausalLM


def write_shard(path, ids, vocab):
    wide = vocab > 65536
    with open(path, "wb") as f:
        f.write(struct.pack("<3i", 20240801 if wide else 20240520, 7 if wide else 1, len(ids)) + b"\0" * 1012)
        f.write(struct.pack("<%d%s" % (len(ids), "I" if wide else "H"), *ids))


def read_shard(path):
    with open(path, "rb") as f:
        magic, _, n = struct.unpack("<3i", f.read(12))
        f.seek(1024)
        return list(struct.unpack("<%d%s" % (n, "I" if magic == 20240801 else "H"), f.read()))


def metrics_losses(run):
    with open(os.path.join(run, "metrics.jsonl")) as f:
        return [json.loads(l)["loss"] for l in f if '"loss"' in l]


def torch_steps(model, ids):
    decay = [p for p in model.parameters() if p.ndim >= 2]
    rest = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": rest, "weight_decay": 0.0}],
                            lr=LR, betas=BETAS, eps=EPS, foreach=False)
    losses = []
    for k in range(STEPS):
        tok = ids[k * B * T: (k + 1) * B * T + 1].cuda()
        x, y = tok[:-1].view(B, T), tok[1:].view(B, T)
        logits = model(input_ids=x).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))
        losses.append(loss.item())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return losses


def hf_loss(model, ids):
    with torch.no_grad():
        tok = ids[: B * T + 1].cuda()
        logits = model(input_ids=tok[:-1].view(B, T)).logits.float()
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tok[1:].view(B, T).reshape(-1)).item()


def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True)


def check_model(a, i, name, cfg, cls, report):
    torch.manual_seed(200 + i)
    model = cls(cfg)
    with torch.no_grad():  # norms and biases away from their init so a dropped or swapped one shows
        for _, p in model.named_parameters():
            if p.ndim == 1:
                p.add_(0.1 * torch.randn_like(p))
    model = model.to(torch.bfloat16)
    d = os.path.join(a.work, f"hf{i}")
    model.save_pretrained(d, safe_serialization=True)
    model = model.float().cuda().eval()  # eval(): no dropout (GPT-2's configs default to 0.1); gradients as in train()
    vocab = cfg.vocab_size
    g = torch.Generator().manual_seed(300 + i)
    ids = torch.randint(0, vocab, (STEPS * B * T + 1,), generator=g)
    tokens = os.path.join(a.work, f"tokens{i}.bin")
    write_shard(tokens, ids.tolist(), vocab)
    runs = os.path.join(a.work, f"run{i}")
    r = run([a.nb, "train", "--init-from", d, "--device", "cuda", "--precision", "fp32", "--steps", str(STEPS),
             "--batch", str(B), "--seq", str(T), "--lr", str(LR), "--warmup", "0", "--min-lr-frac", "1",
             "--grad-clip", "0", "--weight-decay", str(WD), "--data", tokens, "--val-data", "none",
             "--out", runs, "--fresh", "--quiet", "--no-progress"])
    if r.returncode != 0:
        report(False, f"{name}: nobubble train --init-from exit {r.returncode}: {(r.stderr or r.stdout).strip()[-400:]}")
        return
    nb = metrics_losses(runs)
    ref = torch_steps(model, ids)
    rel = [abs(x - y) / abs(y) for x, y in zip(nb, ref)]
    ok = len(nb) == STEPS and rel[0] <= 1e-4 and max(rel) <= 1e-3
    report(ok, f"{name} (vocab {vocab}): {STEPS} AdamW steps fp32, loss {nb[0]:.6f} -> {nb[-1]:.6f} "
               f"(torch {ref[0]:.6f} -> {ref[-1]:.6f}); first step rel {rel[0]:.1e} (<= 1e-4), worst {max(rel):.1e} (<= 1e-3)")
    out = os.path.join(a.work, f"export{i}")
    r = run([a.nb, "export", "--ckpt", runs, "--hf", out])
    if r.returncode != 0:
        report(False, f"{name}: export exit {r.returncode}: {r.stderr.strip()[-300:]}")
        return
    with open(os.path.join(out, "config.json")) as f:
        arch = json.load(f).get("architectures", ["?"])[0]
    report(arch == cls.__name__, f"{name}: the export's config.json names {arch} (came from {cls.__name__})")
    kw = {"dtype": torch.float32} if int(transformers.__version__.split(".")[0]) >= 5 else {"torch_dtype": torch.float32}
    exp = transformers.AutoModelForCausalLM.from_pretrained(out, **kw).cuda().eval()
    ev = run([a.nb, "eval", "--ckpt", runs, "--data", tokens, "--batch", str(B), "--batches", "1", "--device", "cuda"])
    m = re.search(r"loss ([0-9.]+) nats", ev.stdout)
    got = float(m.group(1)) if m else None
    hf = hf_loss(exp, ids)
    report(got is not None and abs(got - hf) <= 2e-4,
           f"{name}: the trained export in transformers: loss {hf:.5f} on batch 0, nobubble eval {got} "
           f"({ev.stdout.strip()[:120] if got is None else 'within 2e-4'})")


def corpus_files(limit=1 << 20):
    files, size = [], 0
    for p in sorted(glob.glob("data/sotu/raw/*.txt")):
        files.append(p)
        size += os.path.getsize(p)
        if size >= limit:
            break
    return files, size


def check_tokenizers(a, report):
    import tokenizers
    files, size = corpus_files()
    if size < 1 << 20:
        report(False, f"tokenizers: only {size} bytes of data/sotu/raw (carry data/sotu)")
        return
    for name in sorted(os.listdir("data/hf_tokenizers")):
        d = os.path.join("data/hf_tokenizers", name)
        if not os.path.isfile(os.path.join(d, "tokenizer.json")):
            continue
        out = os.path.join(a.work, f"tok-{name}.bin")
        r = run([a.nb, "tokenize", "--tokenizer", d, "--out", out] + files)
        if r.returncode != 0:
            report(False, f"tokenizer {name}: nobubble tokenize exit {r.returncode}: {r.stderr.strip()[-300:]}")
            continue
        tok = tokenizers.Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
        want = []
        for p in files:
            with open(p, encoding="utf-8") as f:
                want += tok.encode(f.read(), add_special_tokens=False).ids
        got = read_shard(out)
        first = next((k for k, (x, y) in enumerate(zip(got, want)) if x != y), None)
        ok = got == want
        where = "" if ok else f"; first difference at {first if first is not None else min(len(got), len(want))}" \
                              f": nobubble {got[first:first + 6] if first is not None else ''} vs {want[first:first + 6] if first is not None else ''}"
        report(ok, f"tokenizer {name}: {len(files)} files, {size} bytes: {len(got)} ids from nobubble, "
                   f"{len(want)} from tokenizers {tokenizers.__version__}{where}")


CONVERSATIONS = [
    [{"role": "system", "content": "You are a terse assistant."},
     {"role": "user", "content": "What is the capital of France?"},
     {"role": "assistant", "content": "Paris."}],
    [{"role": "user", "content": "Say hello in Japanese and add an emoji."},
     {"role": "assistant", "content": "こんにちは 👋"},
     {"role": "user", "content": "  And twice?\n"},
     {"role": "assistant", "content": "こんにちは、こんにちは"}],
    [{"role": "user", "content": "Is 7 prime?"},
     {"role": "assistant", "content": "<think>\nCheck 2, 3.\n</think>\n\nYes."},
     {"role": "user", "content": "And 9?"},
     {"role": "assistant", "content": "<think>3 x 3</think>No."}],
]


def check_chat(a, report):
    path = os.path.join(a.work, "chat.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for c in CONVERSATIONS:
            f.write(json.dumps({"messages": c}, ensure_ascii=False) + "\n")
    for name in sorted(os.listdir("data/hf_tokenizers")):
        d = os.path.join("data/hf_tokenizers", name)
        cfg_path = os.path.join(d, "tokenizer_config.json")
        if not os.path.isfile(cfg_path):
            continue
        with open(cfg_path) as f:
            if "chat_template" not in json.load(f):
                print(f"skip chat {name}: tokenizer_config.json has no chat_template to compare with")
                continue
        out = os.path.join(a.work, f"chat-{name}.bin")
        r = run([a.nb, "tokenize", "--chat", "--train-on", "all", "--tokenizer", d, "--out", out, path])
        if r.returncode != 0:
            report(False, f"chat {name}: nobubble tokenize --chat exit {r.returncode}: {r.stderr.strip()[-300:]}")
            continue
        got = read_shard(out)
        tok = transformers.AutoTokenizer.from_pretrained(d)
        want, eot = [], tok.eos_token_id
        # the first Llama 3 template appends the generation prompt after every conversation, a
        # finished one too (it has no add_generation_prompt switch); nobubble renders training
        # examples without it, so it is left out of the comparison and named
        gen = "<|start_header_id|>assistant<|end_header_id|>\n\n"
        always_gen = "add_generation_prompt" not in tok.chat_template and tok.chat_template.endswith("{{ '" + gen + "' }}")
        if always_gen:
            print(f"note chat {name}: its template appends {gen!r} unconditionally; compared without it")
        for c in CONVERSATIONS:
            text = tok.apply_chat_template(c, tokenize=False)
            if always_gen and text.endswith(gen):
                text = text[: -len(gen)]
            ids = tok(text, add_special_tokens=False)["input_ids"]
            want += ids + ([eot] if not ids or ids[-1] != eot else [])
        first = next((k for k, (x, y) in enumerate(zip(got, want)) if x != y), None)
        ok = got == want
        report(ok, f"chat {name}: {len(CONVERSATIONS)} conversations, {len(got)} ids from nobubble, {len(want)} from "
                   f"apply_chat_template + eos" + ("" if ok else f"; first difference at {first}: nobubble "
                   f"{tok.decode(got[first or 0:(first or 0) + 12])!r} vs {tok.decode(want[first or 0:(first or 0) + 12])!r}"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nb", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--only", default="", help="comma list of: models, tokenizers, chat (default: all)")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    bad = []

    def report(ok, line):
        print(("ok   " if ok else "FAIL ") + line, flush=True)
        if not ok:
            bad.append(line)

    parts = a.only.split(",") if a.only else ["models", "tokenizers", "chat"]
    if "models" in parts:
        for i, (name, cfg, cls) in enumerate(cases()):
            try:
                check_model(a, i, name, cfg, cls, report)
            except Exception as e:  # one architecture's failure must not hide the others'
                report(False, f"{name}: {type(e).__name__}: {str(e)[:300]}")
    if "tokenizers" in parts:
        check_tokenizers(a, report)
    if "chat" in parts:
        check_chat(a, report)
    print("FINETUNE OK" if not bad else f"FINETUNE FAIL ({len(bad)})")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
