#!/usr/bin/env python3
"""PyTorch anchors for nobubble's GPU benchmarks: the same models, trained the way a PyTorch user
would train them, timed the same way, so that every nobubble number has a ratio next to it.

  python3 bench/torch_anchor.py --model gpt2 --batch 32,64 --seq 1024 --mode all --json out.jsonl
  python3 bench/torch_anchor.py --model llama-1b --seq 2048 --max-batch --mode eager,compile
  python3 bench/torch_anchor.py --table out.jsonl [nobubble.jsonl]     (no torch needed)
  python3 bench/torch_anchor.py --make-shard FILE --tokens N --seed S   (no torch needed)
  python3 bench/torch_anchor.py --collect-nobubble RUN_DIR --model M --batch B --seq T --json OUT

Models: gpt2 (124M), gpt2-proxy (alias proxy: 4 layers, 256 wide), written plainly nanoGPT-style;
llama-1b as Hugging Face's LlamaForCausalLM with sdpa attention; gpt2-tiny and llama-tiny for smoke
checks. Modes: eager, compile (torch.compile(model)), reduce-overhead (CUDA graphs), all.
Precision: fp32 master weights and fp32 AdamW state, bf16 autocast (nobubble's default on CUDA;
on the CPU, fp32 throughout like nobubble's CPU backend: --amp); --weights bf16 keeps weights and
optimizer state in bf16 instead. bench/README.md has the rest:
what each number means and the FLOP formula.
"""
import argparse
import contextlib
import datetime
import gc
import json
import math
import os
import random
import socket
import statistics
import struct
import subprocess
import sys
import time
import traceback
from array import array

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    _Module = nn.Module
except ModuleNotFoundError:  # --table, --make-shard and --collect-nobubble run without torch
    torch = nn = F = None
    _Module = object

PEAK_BF16 = 989.5e12     # H100/H200 SXM datasheet, dense bf16
CEILING_BF16 = 790e12    # measured on this workplace's H200: 8192^3 bf16 matmul on random data
GPT2_VOCAB = 50257       # token ids are drawn from [0, GPT2_VOCAB): the GPT-2 tokenizer's range
SHARD_MAGIC, SHARD_VERSION, SHARD_HEADER_INTS = 20240520, 1, 256   # llm.c's token shard layout
STAGED_BATCHES = 8       # distinct batches kept on the device and cycled through

# Shapes of nobubble's presets (src/model/transformer.c). vocab is the real vocabulary: it is what
# the FLOP formula counts; embedding and head rows are padded to a multiple of 64 (50304).
MODELS = {
    "gpt2-tiny":  dict(arch="gpt2", layers=2, dim=64, heads=4, kv_heads=4, ffn=256, vocab=50257, seq=64, batch=2, steps=5),
    "gpt2-mini":  dict(arch="gpt2", layers=4, dim=128, heads=4, kv_heads=4, ffn=512, vocab=50257, seq=128, batch=8, steps=20),
    "gpt2-proxy": dict(arch="gpt2", layers=4, dim=256, heads=4, kv_heads=4, ffn=1024, vocab=50257, seq=256, batch=8, steps=50),
    "gpt2":       dict(arch="gpt2", layers=12, dim=768, heads=12, kv_heads=12, ffn=3072, vocab=50257, seq=1024, batch=32, steps=20),
    "llama-tiny": dict(arch="llama", layers=2, dim=64, heads=4, kv_heads=2, ffn=172, vocab=50304, seq=64, batch=2, steps=5),
    "llama-1b":   dict(arch="llama", layers=16, dim=2048, heads=32, kv_heads=8, ffn=8192, vocab=50304, seq=2048, batch=8, steps=10),
}
ALIASES = {"proxy": "gpt2-proxy"}
MODES = ("eager", "compile", "reduce-overhead")


def fail(msg, hint):
    print(f"torch_anchor: error: {msg} (hint: {hint})", file=sys.stderr)
    sys.exit(2)


def padded(v):
    return (v + 63) // 64 * 64


def flops_per_token(cfg, T):
    """Model FLOPs per trained token, the formula of nb_tf_flops_per_token (transformer.c), so that
    nobubble's and PyTorch's MFU differ exactly as their tokens/s do: 6 per matmul weight (forward 2,
    backward 4; the head counted once, embeddings and norms not at all) plus attention scores and
    values, 12 L C T (counted without the causal halving, as in the PaLM paper)."""
    C, L, hd = cfg["dim"], cfg["layers"], cfg["dim"] // cfg["heads"]
    qkv = (cfg["heads"] + 2 * cfg["kv_heads"]) * hd
    att = cfg["heads"] * hd
    fc = cfg["ffn"] if cfg["arch"] == "gpt2" else 2 * cfg["ffn"]   # llama: gate and up
    per_layer = C * qkv + att * C + C * fc + cfg["ffn"] * C
    return 6.0 * (L * per_layer + cfg["vocab"] * C) + 12.0 * L * att * T


# ------------------------------------------------------------------------------ token shards

def write_shard(path, n, seed, vocab=GPT2_VOCAB):
    """n random tokens in [0, vocab) from Python's generator seeded with seed: the same file on
    every machine, readable by nobubble (--data) and by this script."""
    if n < 2:
        fail(f"--tokens {n} is too small", "give at least 2 tokens")
    rng = random.Random(seed)
    toks = array("H", (rng.randrange(vocab) for _ in range(n)))
    if sys.byteorder != "little":
        toks.byteswap()
    header = struct.pack(f"<{SHARD_HEADER_INTS}i", SHARD_MAGIC, SHARD_VERSION, n, *([0] * (SHARD_HEADER_INTS - 3)))
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(header)
        f.write(toks.tobytes())
    os.replace(tmp, path)


def read_shard(path, need, vocab):
    """The first min(need, all) tokens of an llm.c shard, validated; returns an array('H')."""
    try:
        with open(path, "rb") as f:
            head = f.read(SHARD_HEADER_INTS * 4)
            size = os.fstat(f.fileno()).st_size
            if len(head) < SHARD_HEADER_INTS * 4:
                fail(f"{path}: {size} bytes, shorter than the 1024-byte header", "give an llm.c token shard (nobubble tokenize writes them)")
            magic, version, n = struct.unpack("<3i", head[:12])
            if magic != SHARD_MAGIC or version != SHARD_VERSION:
                fail(f"{path}: header magic {magic} version {version}, expected {SHARD_MAGIC} version {SHARD_VERSION}",
                     "give an llm.c token shard (uint16 tokens)")
            if n < 2 or size != SHARD_HEADER_INTS * 4 + 2 * n:
                fail(f"{path}: header says {n} tokens but the file has {size} bytes (expected {SHARD_HEADER_INTS * 4 + 2 * n})",
                     "the shard is truncated or not an llm.c shard: write it again")
            toks = array("H")
            toks.frombytes(f.read(2 * min(n, need)))
    except OSError as e:
        fail(f"cannot read {path}: {e.strerror}", "check the --data path")
    if sys.byteorder != "little":
        toks.byteswap()
    top = max(toks)
    if top >= vocab:
        fail(f"{path}: token {top} is outside this model's vocabulary ({vocab})", "use a shard of GPT-2 tokens")
    return toks


# ------------------------------------------------------------------------------ models

class CausalSelfAttention(_Module):
    def __init__(self, C, H):
        super().__init__()
        self.H = H
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in (q, k, v))
        y = causal_attention(q, k, v)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


def causal_attention(q, k, v):
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    # Only for the CPU smoke check on an old torch (Debian's 1.13 has no SDPA); the GPU runs
    # refuse to start without SDPA (see check_cuda).
    T = q.size(-2)
    att = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    att = att.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return F.softmax(att.float(), dim=-1).to(v.dtype) @ v


class Block(_Module):
    def __init__(self, C, H, ffn):
        super().__init__()
        self.ln_1 = nn.LayerNorm(C)
        self.attn = CausalSelfAttention(C, H)
        self.ln_2 = nn.LayerNorm(C)
        self.c_fc = nn.Linear(C, ffn)
        self.c_proj = nn.Linear(ffn, C)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(_Module):
    """GPT-2 as nanoGPT writes it: learned positions, pre-LN blocks, GELU (tanh), tied head."""

    def __init__(self, cfg, T):
        super().__init__()
        C, L, V = cfg["dim"], cfg["layers"], padded(cfg["vocab"])
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.h = nn.ModuleList(Block(C, cfg["heads"], cfg["ffn"]) for _ in range(L))
        self.ln_f = nn.LayerNorm(C)
        self.lm_head = nn.Linear(C, V, bias=False)
        self.lm_head.weight = self.wte.weight
        for name, p in self.named_parameters():
            if p.dim() == 1:
                if not name.endswith("weight"):   # biases; LayerNorm weights stay 1
                    nn.init.zeros_(p)
            else:
                # residual projections scaled by 1/sqrt(2L), as in GPT-2 (and nobubble)
                std = 0.02 / math.sqrt(2 * L) if name.endswith("c_proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx, targets):
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


class HFCausalLM(_Module):
    """LlamaForCausalLM plus the loss it computes itself (ForCausalLMLoss: logits upcast to fp32,
    mean cross-entropy), but against next-token targets we give, as the GPT-2 path does, so both
    train on the same (x, y) windows. torch.compile of this wrapper compiles model and loss."""

    def __init__(self, hf):
        super().__init__()
        self.hf = hf

    def forward(self, idx, targets):
        logits = self.hf(input_ids=idx, use_cache=False).logits
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


def build_llama(cfg, T, device):
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM
    kw = dict(vocab_size=padded(cfg["vocab"]), hidden_size=cfg["dim"], intermediate_size=cfg["ffn"],
              num_hidden_layers=cfg["layers"], num_attention_heads=cfg["heads"],
              num_key_value_heads=cfg["kv_heads"], max_position_embeddings=max(T, cfg["seq"]),
              rms_norm_eps=1e-5, hidden_act="silu", tie_word_embeddings=False, attention_bias=False,
              mlp_bias=False, initializer_range=0.02, use_cache=False, attn_implementation="sdpa")
    if int(transformers.__version__.split(".")[0]) >= 5:   # v5 keeps rope_theta in rope_parameters
        kw["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0}
    else:
        kw["rope_theta"] = 10000.0
    with on_device(device):
        hf = LlamaForCausalLM(LlamaConfig(**kw))
    attn = getattr(hf.config, "_attn_implementation", None)
    if attn != "sdpa":
        raise RuntimeError(f"LlamaForCausalLM picked attention '{attn}', not sdpa")
    return HFCausalLM(hf), {"transformers": transformers.__version__, "attn": attn}


def on_device(device):
    """Build parameters where they will live (no 1B-parameter copy from host memory)."""
    return torch.device(device) if device != "cpu" else contextlib.nullcontext()


def build_model(cfg, T, device):
    if cfg["arch"] == "gpt2":
        with on_device(device):
            return GPT(cfg, T), {"attn": "sdpa" if hasattr(F, "scaled_dot_product_attention") else "math"}
    return build_llama(cfg, T, device)


def make_adamw(model, fused):
    # nanoGPT's groups: weight decay on every 2-D tensor (matmuls, embeddings), none on biases/norms
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    # fused on the GPU; foreach (one kernel per op over all tensors) on the CPU, faster there than
    # the default per-tensor loop of torch 1.13
    extra = {"fused": True} if fused else {"foreach": True}
    return torch.optim.AdamW(groups, lr=6e-4, betas=(0.9, 0.95), eps=1e-8, **extra)


# ------------------------------------------------------------------------------ one timed run

def stage_batches(tokens, B, T, device):
    """llm.c's windows: batch k is tokens[k*B*T : (k+1)*B*T + 1], x its first B*T, y shifted by
    one. Each batch is its own allocation, so compiled graphs see the same input layout."""
    K = min(STAGED_BATCHES, (len(tokens) - 1) // (B * T))
    if K < 1:
        fail(f"{len(tokens)} tokens cannot fill one batch of {B} x {T} (+1)", "give a larger shard or fewer --batch/--seq")
    buf = torch.tensor(tokens[:K * B * T + 1], dtype=torch.long)
    xs = [buf[k * B * T:(k + 1) * B * T].view(B, T).to(device).contiguous() for k in range(K)]
    ys = [buf[k * B * T + 1:(k + 1) * B * T + 1].view(B, T).to(device).contiguous() for k in range(K)]
    return xs, ys


class StepTimer:
    """Times consecutive steps without a gap between them: on CUDA one event per step boundary
    (the device's own timeline, no host sync inside the loop); on the CPU the host clock."""

    def __init__(self, cuda, n):
        self.cuda = cuda
        self.marks = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)] if cuda else [0.0] * (n + 1)

    def mark(self, i):
        if self.cuda:
            self.marks[i].record()
        else:
            self.marks[i] = time.perf_counter()

    def step_ms(self):
        if self.cuda:
            return [a.elapsed_time(b) for a, b in zip(self.marks, self.marks[1:])]
        return [(b - a) * 1e3 for a, b in zip(self.marks, self.marks[1:])]


def sync(cuda):
    if cuda:
        torch.cuda.synchronize()


def warm_and_time(cuda, step, warmup, steps, before_timing=None, each_step=None):
    """The timing rule of the PyTorch anchors: step(0) alone (first_step_s: compilation lands
    there), the rest of the warm-up, before_timing() (more warm-up work, counted in warmup_s),
    then `steps` steps back to back, each timed (CUDA events on a GPU). step(i) trains on batch i;
    each_step() runs on the host before every step after the first (a deadline check: no sync).
    Returns (per-step ms, first_step_s, warmup_s, wall_s of the timed steps); the peak-memory
    counter starts with the first step."""
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    sync(cuda)
    t0 = time.perf_counter()
    step(0)
    sync(cuda)
    first_step_s = time.perf_counter() - t0
    for i in range(1, warmup):
        if each_step:
            each_step()
        step(i)
    if before_timing:
        before_timing()
    sync(cuda)
    warmup_s = time.perf_counter() - t0
    timer = StepTimer(cuda, steps)
    t1 = time.perf_counter()
    timer.mark(0)
    for j in range(steps):
        if each_step:
            each_step()
        step(warmup + j)
        timer.mark(j + 1)
    sync(cuda)
    return timer.step_ms(), first_step_s, warmup_s, time.perf_counter() - t1


def proc_status_bytes(key, pid="self"):
    """A /proc/PID/status memory line (VmRSS, VmHWM, ...) in bytes; None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def gib(b):
    return None if b is None else round(b / 2 ** 30, 2)


def train_and_time(args, cfg, mode, B, T, steps, warmup, tokens):
    cuda = args.device == "cuda"
    torch.manual_seed(args.seed)
    model, info = build_model(cfg, T, args.device)
    if args.weights == "bf16":
        model = model.to(torch.bfloat16)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = make_adamw(model, fused=cuda)
    if mode == "eager":
        fwd = model
    else:
        # dynamic=False: every configuration gets its own static-shape graph, as a user with one
        # batch size gets; no dynamic-shape recompile when a second batch size follows.
        fwd = torch.compile(model, mode="reduce-overhead" if mode == "reduce-overhead" else None, dynamic=False)
    xs, ys = stage_batches(tokens, B, T, args.device)
    losses = torch.zeros(warmup + steps, device=args.device)
    autocast = (torch.autocast(device_type=args.device, dtype=torch.bfloat16) if amp_on(args)
                else contextlib.nullcontext())

    def step(i):
        if mode == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()
        with autocast:
            loss = fwd(xs[i % len(xs)], ys[i % len(xs)])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)   # no host sync: the scale stays on the device
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses[i].copy_(loss.detach())

    ms, first_step_s, warmup_s, wall_s = warm_and_time(cuda, step, warmup, steps)
    ms_med = statistics.median(ms)
    lossv = losses.tolist()
    fpt = flops_per_token(cfg, T)
    tps = B * T / (ms_med / 1e3)
    return dict(info, status="ok" if all(math.isfinite(v) for v in lossv) else "nonfinite loss",
                ms=round(ms_med, 4), ms_mean=round(wall_s * 1e3 / steps, 4), ms_min=round(min(ms), 4),
                ms_max=round(max(ms), 4), tokens_per_s=round(tps, 1), flops_per_token=fpt,
                tflops=round(tps * fpt / 1e12, 2), mfu=round(tps * fpt / args.peak, 5),
                mfu_ceiling=round(tps * fpt / args.ceiling, 5),
                compile_s=round(max(0.0, warmup_s - warmup * ms_med / 1e3), 2),
                first_step_s=round(first_step_s, 2), warmup_s=round(warmup_s, 2),
                peak_mem_gb=round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
                params=sum(p.numel() for p in params), loss_first=round(lossv[0], 4), loss_last=round(lossv[-1], 4))


def is_oom(e):
    oom = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", ())
    # Inductor and dynamo wrap an OOM raised while compiling or autotuning in their own errors.
    return isinstance(e, oom) or "out of memory" in str(e).lower()


def release_memory():
    if hasattr(torch, "compiler") and hasattr(torch.compiler, "reset"):
        torch.compiler.reset()   # drops compiled graphs and their CUDA-graph memory pools
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def est_cost_s(cfg, mode, steps):
    """A rough guess of a run's wall time, only to skip runs that would cross --deadline: compile
    about a minute (two for the 1B model), plus the steps at a pessimistic 1 s each for the 1B model."""
    big = cfg["layers"] * cfg["dim"] ** 2 > 5e7
    base = {"eager": 10, "compile": 60, "reduce-overhead": 75}[mode]
    return base * (2 if big else 1) + steps * (1.0 if big else 0.2)


def run_config(args, meta, name, cfg, mode, B, T, steps, warmup, tokens):
    rec = dict(meta, engine="pytorch", model=name, mode=mode, batch=B, seq=T, steps=steps, warmup=warmup,
               date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    if args.deadline and time.time() + est_cost_s(cfg, mode, steps) > args.deadline:
        rec["status"] = "skipped (time budget)"
        return rec
    try:
        rec.update(train_and_time(args, cfg, mode, B, T, steps, warmup, tokens))
    except Exception as e:  # one failing configuration must not stop the others
        if is_oom(e):
            rec["status"] = "OOM"
        else:
            rec["status"] = "error"
            msg = str(e).strip().splitlines()
            rec["error"] = f"{type(e).__name__}: {msg[0][:300] if msg else ''}"
            traceback.print_exc()
    finally:
        release_memory()
    return rec


def describe(r):
    head = f"{r['model']} {r['mode']} B={r['batch']} T={r['seq']}"
    if r["status"] not in ("ok", "nonfinite loss"):
        return f"{head}: {r['status']}" + (f" ({r['error']})" if r.get("error") else "")
    mem = f", peak {r['peak_mem_gb']} GiB" if r.get("peak_mem_gb") is not None else ""
    return (f"{head}: {r['ms']:.2f} ms/step (median of {r['steps']}; mean {r['ms_mean']:.2f}), "
            f"{r['tokens_per_s']:,.0f} tok/s, {r['tflops']:.1f} TFLOP/s, MFU {100 * r['mfu']:.1f}% of "
            f"{peak_str(r)}, compile {r['compile_s']:.1f} s{mem}, loss {r['loss_first']:.3f} -> {r['loss_last']:.3f}"
            + ("" if r["status"] == "ok" else "  NONFINITE LOSS"))


def peak_str(r):
    return f"{r['peak_tflops']:g} ({100 * r['mfu_ceiling']:.1f}% of {r['ceiling_tflops']:g} measured)"


def emit(args, rec, results):
    results.append(rec)
    print(describe(rec), flush=True)
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps(rec) + "\n")


def check_cuda():
    if not torch.cuda.is_available():
        fail("no CUDA device is visible to torch", "run on the GPU machine, or --device cpu for a smoke check")
    if not hasattr(F, "scaled_dot_product_attention") or not hasattr(torch, "compile"):
        fail(f"torch {torch.__version__} lacks SDPA or torch.compile", "use PyTorch 2.x (the benchmarks use 2.11)")
    torch.backends.cuda.matmul.allow_tf32 = True   # as nanoGPT; matmuls under autocast are bf16 anyway
    torch.backends.cudnn.allow_tf32 = True


def amp_on(args):
    """bf16 autocast over fp32 weights: nobubble's CUDA default. Its CPU backend computes in fp32,
    so --amp auto leaves the CPU anchor in fp32 too."""
    return args.weights == "fp32" and (args.amp == "bf16" or (args.amp == "auto" and args.device == "cuda"))


def git_commit():
    try:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        out = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or "none"
    except (OSError, subprocess.SubprocessError):
        return "none"


def bench(args):
    if torch is None:
        fail("PyTorch is not installed here", "run the benchmarks on the GPU machine (its python3 has torch)")
    if args.device == "cuda":
        check_cuda()
    names = [ALIASES.get(m, m) for m in args.model.split(",")]
    for n in names:
        if n not in MODELS:
            fail(f"unknown model '{n}'", f"use one of {', '.join(list(MODELS) + list(ALIASES))}")
    modes = list(MODES) if args.mode == "all" else args.mode.split(",")
    for m in modes:
        if m not in MODES:
            fail(f"unknown mode '{m}'", "use eager, compile, reduce-overhead, a comma list of them, or all")
    if args.device == "cpu" and modes != ["eager"] and not hasattr(torch, "compile"):
        fail(f"torch {torch.__version__} has no torch.compile", "use --mode eager for the CPU smoke check")
    meta = dict(torch=torch.__version__, cuda=torch.version.cuda,
                device=torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
                host=socket.gethostname(), commit=git_commit(), weights=args.weights,
                peak_tflops=args.peak / 1e12, ceiling_tflops=args.ceiling / 1e12,
                data=args.data or f"random tokens, seed {args.seed}")
    if args.device == "cpu":
        torch.set_num_threads(args.threads or os.cpu_count())   # Debian's torch starts with one
    meta["threads"] = torch.get_num_threads()
    print(f"torch {meta['torch']} (CUDA {meta['cuda']}) on {meta['device']} ({meta['threads']} threads); weights {args.weights}"
          f"{' master + bf16 autocast' if amp_on(args) else ''}; {'fused ' if args.device == 'cuda' else ''}AdamW; "
          f"data: {meta['data']}", flush=True)
    results = []
    for name in names:
        cfg = MODELS[name]
        T = args.seq or cfg["seq"]
        steps = args.steps or cfg["steps"]
        batches = [int(b) for b in (args.batches if args.max_batch else (args.batch or str(cfg["batch"]))).split(",")]
        need = STAGED_BATCHES * max(batches) * T + 1
        if args.data:
            tokens = read_shard(args.data, need, cfg["vocab"]).tolist()
        else:
            g = torch.Generator().manual_seed(args.seed)
            tokens = torch.randint(0, GPT2_VOCAB, (need,), generator=g).tolist()

        def warm(mode):
            return args.warmup if args.warmup is not None else (3 if mode == "eager" else 5)

        if args.max_batch:
            found = None
            for B in sorted(batches, reverse=True):
                rec = run_config(args, meta, name, cfg, modes[0], B, T, steps, warm(modes[0]), tokens)
                rec["max_batch_search"] = True
                if rec["status"] == "ok":
                    found = rec["max_batch"] = B
                emit(args, rec, results)
                if rec["status"] != "OOM":
                    break
            if found is None:
                print(f"max batch ({name}, seq {T}, {modes[0]}): none of {batches} ran", flush=True)
                continue
            print(f"max batch ({name}, seq {T}, {modes[0]}): {found} (tried {sorted(batches, reverse=True)})", flush=True)
            for mode in modes[1:]:
                emit(args, run_config(args, meta, name, cfg, mode, found, T, steps, warm(mode), tokens), results)
        else:
            for B in batches:
                for mode in modes:
                    emit(args, run_config(args, meta, name, cfg, mode, B, T, steps, warm(mode), tokens), results)
    print()
    print_table(results, nb_note=False)
    return 1 if any(r["status"] in ("error", "nonfinite loss") for r in results) else 0


# ------------------------------------------------------------------------------ nobubble results and the table

def collect_nobubble(args):
    """One JSON line for a nobubble run directory: the median step time of metrics.jsonl after the
    first --skip steps (its warm-up), with the same FLOP formula and peaks as the PyTorch lines."""
    name = ALIASES.get(args.model, args.model)
    if name not in MODELS:
        fail(f"unknown model '{args.model}'", f"use one of {', '.join(MODELS)}")
    if not args.batch or "," in args.batch:
        fail("--collect-nobubble needs one --batch B", "give the batch the run used")
    cfg, B = MODELS[name], int(args.batch)
    T = args.seq or cfg["seq"]
    path = os.path.join(args.collect_nobubble, "metrics.jsonl")
    ms = []
    try:
        with open(path) as f:
            for lineno, line in enumerate(f, 1):
                try:
                    row = json.loads(line)
                    ms.append(float(row["ms"]))
                except (ValueError, KeyError, TypeError):
                    fail(f"{path}:{lineno}: not a metrics line with an 'ms' field", "point --collect-nobubble at a nobubble run directory")
    except OSError as e:
        fail(f"cannot read {path}: {e.strerror}", "point --collect-nobubble at a nobubble run directory")
    timed = ms[args.skip:]
    if not timed:
        fail(f"{path}: {len(ms)} steps, none left after skipping {args.skip}", "run more --steps or lower --skip")
    ms_med = statistics.median(timed)
    fpt = flops_per_token(cfg, T)
    tps = B * T / (ms_med / 1e3)
    rec = dict(engine="nobubble", model=name, mode=args.nb_schedule, batch=B, seq=T, steps=len(timed), warmup=args.skip,
               status="ok", ms=round(ms_med, 4), ms_mean=round(statistics.fmean(timed), 4), ms_min=round(min(timed), 4),
               ms_max=round(max(timed), 4), tokens_per_s=round(tps, 1), flops_per_token=fpt,
               tflops=round(tps * fpt / 1e12, 2), mfu=round(tps * fpt / args.peak, 5),
               mfu_ceiling=round(tps * fpt / args.ceiling, 5), peak_tflops=args.peak / 1e12,
               ceiling_tflops=args.ceiling / 1e12, device=args.device_name, commit=git_commit(),
               date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    print(f"nobubble {name} {args.nb_schedule} B={B} T={T}: {ms_med:.2f} ms/step (median of {len(timed)}), "
          f"{tps:,.0f} tok/s, MFU {100 * rec['mfu']:.1f}% of {args.peak / 1e12:g}", flush=True)
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps(rec) + "\n")
    return 0


def load_jsonl(paths):
    rows = []
    for path in paths:
        if not os.path.exists(path):
            continue
        with open(path) as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    fail(f"{path}:{lineno}: not JSON", "the file should hold one JSON object per line")
    return rows


BODY_W = 61   # width of the numeric columns between T and the '|'


def print_table(rows, nb_note=True):
    """PyTorch rows, each with nobubble's result for the same (model, batch, seq) when there is one;
    ratio = nobubble tokens/s over that row's PyTorch tokens/s (> 1: nobubble is faster)."""
    nb = {}
    for r in rows:
        if r.get("engine") == "nobubble" and r.get("status") == "ok":
            nb[(r["model"], r["batch"], r["seq"])] = r
    hdr = (f"{'model':<11} {'mode':<15} {'B':>3} {'T':>5} {'ms/step':>9} {'tok/s':>10} {'TFLOP/s':>8} "
           f"{'MFU%':>6} {'MFU%790':>7} {'compile_s':>9} {'GiB':>6} | {'nobubble tok/s':>14} {'ratio':>6}")
    print(hdr)
    print("-" * len(hdr))
    if not any(r.get("engine") == "pytorch" for r in rows):
        print("(no PyTorch results)")
    for r in rows:
        if r.get("engine") != "pytorch":
            continue
        mine = nb.get((r["model"], r["batch"], r["seq"]))
        if r["status"] in ("ok", "nonfinite loss"):
            gib = "-" if r.get("peak_mem_gb") is None else f"{r['peak_mem_gb']:.1f}"
            body = (f"{r['ms']:>9.2f} {r['tokens_per_s']:>10,.0f} {r['tflops']:>8.1f} {100 * r['mfu']:>6.1f} "
                    f"{100 * r['mfu_ceiling']:>7.1f} {r['compile_s']:>9.1f} {gib:>6}")
            ratio = f"{mine['tokens_per_s'] / r['tokens_per_s']:>6.2f}" if mine else f"{'-':>6}"
        else:
            body = f"{r['status']:<{BODY_W}}"[:BODY_W]
            ratio = f"{'-':>6}"
        nbcol = f"{mine['tokens_per_s']:>14,.0f}" if mine else f"{'-':>14}"
        print(f"{r['model']:<11} {r['mode']:<15} {r['batch']:>3} {r['seq']:>5} {body} | {nbcol} {ratio}")
    if not nb and nb_note:
        print("nobubble: not available in this build")
    dev = next((r.get("device") for r in rows if r.get("engine") == "pytorch" and r.get("device")), None)
    tv = next((r.get("torch") for r in rows if r.get("torch")), None)
    if dev:
        print(f"device: {dev}; torch {tv}; MFU% against {PEAK_BF16 / 1e12:g} TFLOP/s (dense bf16 datasheet), "
              f"MFU%790 against {CEILING_BF16 / 1e12:g} (bf16 matmul measured here)")


# ------------------------------------------------------------------------------ command line

def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="bench/README.md explains every number.")
    p.add_argument("--model", default="gpt2", help="comma list of gpt2, gpt2-proxy (proxy), llama-1b, gpt2-tiny, llama-tiny")
    p.add_argument("--batch", help="comma list of batch sizes (default: the model's)")
    p.add_argument("--seq", type=int, default=0, help="sequence length (default: the model's)")
    p.add_argument("--mode", default="eager,compile", help="eager, compile, reduce-overhead, a comma list, or all")
    p.add_argument("--steps", type=int, default=0, help="timed steps (default: gpt2 20, proxy 50, llama-1b 10)")
    p.add_argument("--warmup", type=int, help="untimed steps first (default: 3 eager, 5 compiled)")
    p.add_argument("--max-batch", action="store_true", help="find the largest of --batches that runs in the first mode, then run the other modes at it")
    p.add_argument("--batches", default="16,8,4,2,1", help="batch sizes tried by --max-batch [16,8,4,2,1]")
    p.add_argument("--weights", choices=("fp32", "bf16"), default="fp32", help="fp32 master + bf16 autocast, or bf16 weights and optimizer state [fp32]")
    p.add_argument("--amp", choices=("auto", "bf16", "none"), default="auto",
                   help="autocast over fp32 weights: bf16 on cuda, none (fp32 math, as nobubble's CPU backend) on cpu [auto]")
    p.add_argument("--threads", type=int, default=0, help="CPU threads (torch.set_num_threads) [all cores]")
    p.add_argument("--data", help="llm.c token shard to train on (default: random tokens in [0, 50257) from --seed)")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--json", help="append one JSON line per result to this file")
    p.add_argument("--deadline", type=float, default=0, help="Unix time after which no run starts (runs that would cross it are skipped)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: the CPU anchor (bench/cpu_train.sh --anchor), small models")
    p.add_argument("--peak-tflops", type=float, default=PEAK_BF16 / 1e12, help=f"MFU denominator [{PEAK_BF16 / 1e12:g}]")
    p.add_argument("--ceiling-tflops", type=float, default=CEILING_BF16 / 1e12, help=f"second MFU denominator, measured [{CEILING_BF16 / 1e12:g}]")
    p.add_argument("--table", nargs="+", metavar="JSONL", help="print the table of these result files and exit (no torch needed)")
    p.add_argument("--make-shard", metavar="FILE", help="write an llm.c shard of --tokens random tokens from --seed and exit")
    p.add_argument("--tokens", type=int, default=1 << 20, help="tokens in --make-shard's shard [1048576]")
    p.add_argument("--collect-nobubble", metavar="RUN_DIR", help="turn a nobubble run's metrics.jsonl into a result line (--json) and exit")
    p.add_argument("--skip", type=int, default=5, help="--collect-nobubble: warm-up steps left out [5]")
    p.add_argument("--nb-schedule", default="plain", help="--collect-nobubble: schedule name to record [plain]")
    p.add_argument("--device-name", default="unknown", help="--collect-nobubble: device name to record")
    a = p.parse_args(argv)
    a.peak, a.ceiling = a.peak_tflops * 1e12, a.ceiling_tflops * 1e12
    if a.steps < 0 or (a.warmup is not None and a.warmup < 1):
        fail("--steps must be >= 0 and --warmup >= 1", "the first step is always a warm-up (it compiles)")
    return a


def main(argv):
    args = parse_args(argv)
    if args.table:
        print_table(load_jsonl(args.table))
        return 0
    if args.make_shard:
        write_shard(args.make_shard, args.tokens, args.seed)
        print(f"wrote {args.tokens} random tokens (seed {args.seed}) to {args.make_shard}")
        return 0
    if args.collect_nobubble:
        return collect_nobubble(args)
    return bench(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
