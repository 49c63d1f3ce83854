#!/usr/bin/env python3
"""The PyTorch side of bench/lora_bench.sh (issue 33): LoRA with Hugging Face PEFT, timed the way
nobubble's summary times a run, on the same shapes, batch, sequence and precision.

  python3 bench/lora_torch.py --shape llama3.1-8b --batch 8 --seq 2048 --mode eager,compile --json out.jsonl
  python3 bench/lora_torch.py --shape llama3.1-70b --batch 4 --mode eager            # expect a CUDA OOM
  python3 bench/lora_torch.py --shape llama3.1-70b --batch 4 --impl fsdp2-offload    # expect a host OOM, guarded
  python3 bench/lora_torch.py --guard -- python3 bench/fsdp_offload.py ...           # any command, guarded
  python3 bench/lora_torch.py --dry-run --shape llama3.1-70b                         # no torch: counts, FLOPs
  python3 bench/lora_torch.py --table rows.jsonl                                     # no torch: lora_bench's table

Model: transformers' LlamaForCausalLM from a LlamaConfig (sdpa attention, untied head, no biases,
RMSNorm eps 1e-5, RoPE theta 500000 without scaling: the shapes of the published Llama 3.1 models,
random init), the base in bf16 and frozen. PEFT: get_peft_model(LoraConfig(r, lora_alpha,
target_modules q_proj,k_proj,v_proj,o_proj (--targets), lora_dropout 0, bias none)); PEFT's
autocast_adapter_dtype keeps the adapters in fp32 over a bf16 base. The step: forward under
torch.autocast(bf16) (adapters' matmuls in bf16, as nobubble's: bf16 compute, fp32 adapter
master), loss = mean cross-entropy on logits upcast to fp32, backward, clip_grad_norm_(1.0) over
the adapters, torch.optim.AdamW(fused=True, lr 2e-4, betas (0.9, 0.95), eps 1e-8, weight decay 0.1
on A and B) on the adapters only, zero_grad(set_to_none=True).

Modes (--mode): eager; compile (torch.compile of the model and its loss, dynamic=False; the
optimizer and clipping eager). --grad-ckpt auto (default): each mode first runs without activation
checkpointing; only if that runs out of GPU memory is HF's gradient_checkpointing_enable
(use_reentrant=False) turned on and the mode run again; the JSON says which ("grad_ckpt": "off",
or "on (needed: ...)"). on / off force it.

--impl fsdp2-offload: what a PyTorch user does when the base does not fit the GPU: the model built
on the meta device, PEFT on it, activation checkpointing, fully_shard of each decoder layer then
of the root with MixedPrecisionPolicy(bf16 params, fp32 reduce) and CPUOffloadPolicy(pin_memory),
to_empty(device="cpu") (the bf16 base, 2 bytes per parameter, in host memory), random init there,
AdamW on the CPU adapters. It always runs in a child process under a host-memory guard (below).

The guard (--impl fsdp2-offload, or --guard -- CMD...): the child gets RLIMIT_DATA = the guard
(pageable allocations beyond it fail inside the child with its own error; an address-space limit
is not used because CUDA reserves far more virtual memory than it uses); a watchdog polls the
child's VmRSS and the host's MemAvailable every 0.2 s and kills it (SIGKILL) when the RSS passes
the guard + 2 GiB or MemAvailable falls under 2 GiB (pinned memory is not in RLIMIT_DATA), so the
kernel's OOM killer never has to choose. Default guard: MemAvailable at start less 4 GiB
(--guard-host-gb). What the child printed or the guard's reason is recorded, never assumed.

Timing: --warmup untimed steps (default 2 eager, 3 compile: compilation happens in the first),
then --steps steps with a torch.cuda.Event at every step boundary (no host sync inside the loop);
tokens/s = B*T / median step. One JSON line per mode on stdout and appended to --json: status ok,
oom (with oom_where and error: the exception's first line), error, or skipped (time budget).

FLOPs (also for nobubble's rows in --table): model FLOPs per token of LoRA training = the frozen
base's matmuls forward (2 per weight) and backward to the activations (2 per weight; no weight
gradient), 4 N_matmul (the layers' projections and the head; embeddings and norms not counted),
+ attention scores and values 12 L C_att T (forward 4, backward 8, no causal halving: the
trainer's convention) + the adapters 6 N_lora (forward 2, backward 4: they train). Full
fine-tuning: 6 N_matmul + 12 L C_att T (the trainer's nb_tf_flops_per_token). Recompute
(activation checkpointing) is not counted: model FLOPs, not hardware FLOPs.
"""
import argparse
import datetime
import gc
import json
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_anchor as ta  # noqa: E402  (import-safe without torch)
from torch_anchor import gib, proc_status_bytes  # noqa: E402

GiB = 2 ** 30
# the published configs (meta-llama/Llama-3.1-8B, -70B, -405B: config.json), and a tiny one
SHAPES = {
    "tiny":          dict(layers=2, dim=64, heads=4, kv_heads=2, ffn=172, vocab=50304),
    "llama3.1-8b":   dict(layers=32, dim=4096, heads=32, kv_heads=8, ffn=14336, vocab=128256),
    "llama3.1-70b":  dict(layers=80, dim=8192, heads=64, kv_heads=8, ffn=28672, vocab=128256),
    "llama3.1-405b": dict(layers=126, dim=16384, heads=128, kv_heads=8, ffn=53248, vocab=128256),
}
SHAPE_KEYS = ("layers", "dim", "heads", "kv_heads", "ffn", "vocab")
TARGETS = ("q", "k", "v", "o", "gate", "up", "down")


# ------------------------------------------------------------------------------ counts and FLOPs

def site_dims(cfg):
    """(in, out) of each projection LoRA can target."""
    C, hd, F = cfg["dim"], cfg["dim"] // cfg["heads"], cfg["ffn"]
    q, kv = cfg["heads"] * hd, cfg["kv_heads"] * hd
    return {"q": (C, q), "k": (C, kv), "v": (C, kv), "o": (q, C), "gate": (C, F), "up": (C, F), "down": (F, C)}


def counts(cfg, r=0, targets=()):
    """Parameters: total (base), the matmul weights FLOPs count (layers' projections + head),
    the adapters'."""
    C, hd, V, L = cfg["dim"], cfg["dim"] // cfg["heads"], cfg["vocab"], cfg["layers"]
    qkv, att = (cfg["heads"] + 2 * cfg["kv_heads"]) * hd, cfg["heads"] * hd
    per_layer = C * qkv + att * C + 3 * C * cfg["ffn"]
    matmul = L * per_layer + V * C
    base = L * (per_layer + 2 * C) + 2 * V * C + C
    d = site_dims(cfg)
    lora = L * sum(r * (d[t][0] + d[t][1]) for t in targets) if r else 0
    return dict(base=base, matmul=matmul, lora=lora, att=att)


def flops_per_token(cfg, T, r=0, targets=()):
    c = counts(cfg, r, targets)
    attn = 12.0 * cfg["layers"] * c["att"] * T
    if r:
        return 4.0 * c["matmul"] + attn + 6.0 * c["lora"]
    return 6.0 * c["matmul"] + attn


def parse_targets(s):
    t = [x.strip() for x in s.split(",") if x.strip()]
    bad = [x for x in t if x not in TARGETS]
    if bad or not t:
        raise SystemExit(f"lora_torch.py: error: --targets {s}: a subset of {','.join(TARGETS)}")
    return t


# ------------------------------------------------------------------------------ host memory

def meminfo(key="MemAvailable"):
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def guard_run(cmd, guard_bytes, log_path, echo=True, timeout=0, rlimit=True):
    """Runs cmd in a child with RLIMIT_DATA = guard_bytes (unless rlimit is False) and a watchdog
    (module docstring); timeout > 0: killed after that many seconds. Returns dict(rc, killed,
    timed_out, why, rss_peak_gb, mem_available_min_gb, tail)."""
    import resource

    def limit():
        os.setsid()
        if rlimit:
            resource.setrlimit(resource.RLIMIT_DATA, (guard_bytes, guard_bytes))

    floor = 2 * GiB
    with open(log_path, "w") as log:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE if echo else log, stderr=log, preexec_fn=limit, text=True)

        def on_term(signum, frame):   # `timeout` ends this process: the child (own session) goes too
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                pass
            sys.exit(128 + signum)
        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGINT, on_term)
        killed, timed_out, why, rss_peak, avail_min, t_start = False, False, "", 0, None, time.time()
        out_lines = []
        import threading

        def pump():
            for line in p.stdout:
                out_lines.append(line)
                sys.stdout.write(line)
                sys.stdout.flush()
        th = None
        if echo:
            th = threading.Thread(target=pump, daemon=True)
            th.start()
        while p.poll() is None:
            rss = proc_status_bytes("VmRSS", p.pid) or 0
            hwm = proc_status_bytes("VmHWM", p.pid) or 0
            rss_peak = max(rss_peak, rss, hwm)
            avail = meminfo()
            if avail is not None:
                avail_min = avail if avail_min is None else min(avail_min, avail)
            if timeout and time.time() - t_start > timeout:
                why, timed_out = f"timed out after {timeout:.0f} s (killed by the guard)", True
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except OSError:
                    p.kill()
                p.wait()
                break
            if rss > guard_bytes + 2 * GiB or (avail is not None and avail < floor):
                why = (f"killed by the host-memory guard: child RSS {rss / GiB:.1f} GiB (guard {guard_bytes / GiB:.1f} GiB), "
                       f"host MemAvailable {avail / GiB:.1f} GiB" if avail is not None else f"RSS {rss / GiB:.1f} GiB")
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except OSError:
                    p.kill()
                killed = True
                p.wait()
                break
            time.sleep(0.2)
        if th:
            th.join(timeout=5)
    tail = ""
    try:
        with open(log_path) as f:
            lines = [l.rstrip() for l in f if l.strip()]
        tail = lines[-1] if lines else ""
    except OSError:
        pass
    return dict(rc=p.returncode, killed=killed, timed_out=timed_out, why=why, rss_peak_gb=gib(rss_peak), mem_available_min_gb=gib(avail_min),
                tail=tail[:300], stdout="".join(out_lines))


# ------------------------------------------------------------------------------ the model

def llama_config(cfg, T):
    import transformers
    kw = dict(vocab_size=cfg["vocab"], hidden_size=cfg["dim"], intermediate_size=cfg["ffn"],
              num_hidden_layers=cfg["layers"], num_attention_heads=cfg["heads"], num_key_value_heads=cfg["kv_heads"],
              max_position_embeddings=max(T, 2048), rms_norm_eps=1e-5, hidden_act="silu", tie_word_embeddings=False,
              attention_bias=False, mlp_bias=False, initializer_range=0.02, use_cache=False, attn_implementation="sdpa")
    if int(transformers.__version__.split(".")[0]) >= 5:
        kw["rope_parameters"] = {"rope_type": "default", "rope_theta": 500000.0}
    else:
        kw["rope_theta"] = 500000.0
    return transformers.LlamaConfig(**kw)


def lora_config(args):
    import peft
    names = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj", "gate": "gate_proj", "up": "up_proj", "down": "down_proj"}
    return peft.LoraConfig(r=args.rank, lora_alpha=args.alpha, target_modules=[names[t] for t in args.targets_list],
                           lora_dropout=0.0, bias="none", task_type="CAUSAL_LM")


def is_oom(e):
    import torch
    oom_t = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", ())
    s = str(e).lower()
    return isinstance(e, (oom_t, MemoryError)) or "out of memory" in s or "can't allocate memory" in s or "cannot allocate memory" in s


def first_line(e):
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0][:300] if msg else ''}"


def batches(args, cfg, device):
    import torch
    B, T = args.batch, args.seq
    need = min(ta.STAGED_BATCHES, args.warmup_eff + args.steps) * B * T + 1
    if args.data:
        toks = ta.read_shard(args.data, need, cfg["vocab"]).tolist()
    else:
        g = torch.Generator().manual_seed(args.seed)
        toks = torch.randint(0, min(ta.GPT2_VOCAB, cfg["vocab"]), (need,), generator=g).tolist()
    return ta.stage_batches(toks, B, T, device)


def adamw(params, torch, fused):
    kw = dict(fused=True) if fused else dict(foreach=True)
    return torch.optim.AdamW(params, lr=2e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, **kw)


def time_steps(torch, step, warmup, steps, deadline, rec):
    """warm-up steps, then timed steps with an event per boundary. Returns step ms and losses."""
    losses, t_w = [], time.perf_counter()
    for i in range(warmup):
        losses.append(step(i))
        if i == 0:
            torch.cuda.synchronize()
            rec["first_step_s"] = round(time.perf_counter() - t_w, 2)
    torch.cuda.synchronize()
    rec["warmup_s"] = round(time.perf_counter() - t_w, 2)
    # a steady step's time from the warm-up (the first compiles), so that the timed steps that
    # fit before the deadline are known before they start (no host sync inside the loop)
    est = (rec["warmup_s"] - rec.get("first_step_s", 0)) / (warmup - 1) if warmup > 1 else rec["warmup_s"]
    if deadline and est > 0 and time.time() + steps * est > deadline:
        fit = max(1, int((deadline - time.time()) / est))
        if fit < steps:
            rec["stopped_early"] = f"--deadline: {fit} of {steps} timed steps"
            steps = fit
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)]
    ev[0].record()
    done = 0
    for i in range(steps):
        losses.append(step(warmup + i))
        ev[i + 1].record()
        done += 1
    torch.cuda.synchronize()
    ms = [ev[i].elapsed_time(ev[i + 1]) for i in range(done)]
    return ms, [float(x) for x in losses]


def run_peft_mode(args, cfg, mode, model, params, xs, ys, torch, F, rec):
    """One mode on the built PeftModel; raises on OOM/error."""
    V = cfg["vocab"]

    def loss_fn(x, y):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=x).logits
        return F.cross_entropy(logits.float().view(-1, V), y.view(-1))

    fn = torch.compile(loss_fn, dynamic=False) if mode == "compile" else loss_fn
    opt = adamw(params, torch, fused=True)

    def step(i):
        loss = fn(xs[i % len(xs)], ys[i % len(xs)])
        loss.backward()
        if args.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(params, args.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    warm = args.warmup if args.warmup >= 0 else (3 if mode == "compile" else 2)
    torch.cuda.reset_peak_memory_stats()
    try:
        ms, losses = time_steps(torch, step, warm, args.steps, args.deadline, rec)
    finally:
        opt.zero_grad(set_to_none=True)
        for p in params:
            p.grad = None
    return ms, losses


def finish(rec, ms, losses, args, cfg, torch):
    if not ms:
        rec.update(status="skipped (time budget)", error="no timed step ran")
        return
    s = sorted(ms)
    med, p90 = statistics.median(s), s[math.ceil(0.9 * len(s)) - 1]
    tps = args.batch * args.seq / (med / 1e3)
    fpt = flops_per_token(cfg, args.seq, args.rank, args.targets_list)
    rec.update(status="ok" if all(math.isfinite(x) for x in losses) else "nonfinite loss",
               ms=round(med, 2), ms_p90=round(p90, 2), step_ms=[round(x, 2) for x in ms], steps=len(ms),
               tokens_per_s=round(tps, 1), tokens_per_s_p90=round(args.batch * args.seq / (p90 / 1e3), 1),
               flops_per_token=fpt, tflops=round(tps * fpt / 1e12, 2),
               peak_mem_gb=gib(torch.cuda.max_memory_allocated()),
               loss_first=round(losses[0], 4), loss_last=round(losses[-1], 4))


def peft_bench(args, cfg, base_rec, emit):
    """--impl peft: build once on the GPU, then each mode (with --grad-ckpt auto's retry)."""
    import torch
    import torch.nn.functional as F
    import peft
    torch.backends.cuda.matmul.allow_tf32 = True
    rec0 = dict(base_rec, torch=torch.__version__, cuda=torch.version.cuda, peft=peft.__version__,
                device=torch.cuda.get_device_name())
    import transformers
    rec0["transformers"] = transformers.__version__
    t0 = time.perf_counter()
    try:
        torch.manual_seed(args.seed)
        torch.set_default_dtype(torch.bfloat16)
        try:
            with torch.device("cuda"):
                hf = transformers.LlamaForCausalLM(llama_config(cfg, args.seq))
        finally:
            torch.set_default_dtype(torch.float32)
        if getattr(hf.config, "_attn_implementation", None) != "sdpa":
            raise RuntimeError(f"LlamaForCausalLM picked attention '{hf.config._attn_implementation}', not sdpa")
        model = peft.get_peft_model(hf, lora_config(args))
        model.train()
        params = [p for p in model.parameters() if p.requires_grad]
        rec0.update(params_trainable=sum(p.numel() for p in params),
                    params_frozen=sum(p.numel() for p in model.parameters() if not p.requires_grad),
                    adapter_dtype=str(params[0].dtype).replace("torch.", ""), base_dtype="bfloat16",
                    setup_s=round(time.perf_counter() - t0, 2), gpu_mem_after_setup_gb=gib(torch.cuda.memory_allocated()))
        want = counts(cfg, args.rank, args.targets_list)
        if rec0["params_trainable"] != want["lora"]:
            raise RuntimeError(f"PEFT made {rec0['params_trainable']} adapter parameters, the shape says {want['lora']}")
        xs, ys = batches(args, cfg, "cuda")
    except Exception as e:   # building the model is where a base larger than the GPU fails
        rec = dict(rec0, mode="build", status="oom" if is_oom(e) else "error", error=first_line(e),
                   where="building the bf16 base on the GPU", gpu_mem_at_failure_gb=gib(torch.cuda.memory_allocated()),
                   setup_s=round(time.perf_counter() - t0, 2))
        if is_oom(e):
            rec["oom_where"] = "gpu"
        else:
            traceback.print_exc()
        for mode in args.modes:
            emit(dict(rec, mode=mode))
        return 0 if is_oom(e) else 1
    print(f"setup {rec0['setup_s']:.1f} s: {rec0['params_frozen']:,} frozen bf16 parameters, "
          f"{rec0['params_trainable']:,} {rec0['adapter_dtype']} adapter parameters, {rec0['gpu_mem_after_setup_gb']} GiB on the GPU",
          file=sys.stderr, flush=True)
    rc = 0
    gc_on = args.grad_ckpt == "on"
    need = ""
    for mode in args.modes:
        rec = dict(rec0, mode=mode)
        if args.deadline and time.time() + (150 if mode == "compile" else 30) > args.deadline:
            rec.update(status="skipped (time budget)")
            emit(rec)
            continue
        if mode == "compile":
            torch._dynamo.reset()
        tries = [gc_on] if args.grad_ckpt != "auto" or gc_on else [False, True]
        for k, on in enumerate(tries):
            if on:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            else:
                model.gradient_checkpointing_disable() if hasattr(model, "gradient_checkpointing_disable") else None
            rec["grad_ckpt"] = ("on" + (f" (needed: without it {need})" if need else " (--grad-ckpt on)")) if on else "off"
            err = None
            try:
                ms, losses = run_peft_mode(args, cfg, mode, model, params, xs, ys, torch, F, rec)
                finish(rec, ms, losses, args, cfg, torch)
                gc_on = on
                break
            except Exception as e:   # only its text is kept: its traceback holds the step's tensors
                oom, err = is_oom(e), first_line(e)
                if not oom:
                    traceback.print_exc()
            if err is not None:
                gc.collect()
                torch.cuda.empty_cache()
                if oom and k + 1 < len(tries):
                    need = f"{mode} ran out of GPU memory ({err[:160]})"
                    print(f"{mode}: out of GPU memory without activation checkpointing; again with it", file=sys.stderr, flush=True)
                    if mode == "compile":
                        torch._dynamo.reset()
                    continue
                rec.update(status="oom" if oom else "error", error=err, peak_mem_gb=gib(torch.cuda.max_memory_allocated()))
                if oom:
                    rec["oom_where"] = "gpu"
                else:
                    rc = 1
        emit(rec)
        if rec.get("status") == "ok":
            print(f"peft {mode} B={args.batch} T={args.seq}: {rec['ms']:.1f} ms/step, {rec['tokens_per_s']:,.0f} tok/s, "
                  f"{rec['tflops']:.1f} model TFLOP/s, GPU peak {rec['peak_mem_gb']} GiB, activation checkpointing {rec['grad_ckpt']}",
                  file=sys.stderr, flush=True)
    return rc


def fsdp2_child(args, cfg, base_rec, emit):
    """--impl fsdp2-offload, inside the guarded child."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    import transformers
    import peft
    import fsdp_offload as fo
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
    rec = dict(base_rec, mode="fsdp2-offload", torch=torch.__version__, peft=peft.__version__,
               transformers=transformers.__version__, device=torch.cuda.get_device_name())
    stage = "init_process_group"
    t0 = time.perf_counter()
    rc = 0
    try:
        fo.init_process_group(argparse.Namespace(rendezvous="file", backend="cpu:gloo,cuda:nccl"), dist, torch)
        stage = "building the model on the meta device"
        torch.set_default_dtype(torch.bfloat16)
        try:
            with torch.device("meta"):
                hf = transformers.LlamaForCausalLM(llama_config(cfg, args.seq))
        finally:
            torch.set_default_dtype(torch.float32)
        model = peft.get_peft_model(hf, lora_config(args))
        model.to("meta")   # the adapters too, wherever PEFT made them: to_empty gives every tensor its host memory
        hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        stage = "fully_shard"
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        off = CPUOffloadPolicy(pin_memory=True)
        for layer in hf.model.layers:
            fully_shard(layer, mp_policy=mp, offload_policy=off)
        fully_shard(model, mp_policy=mp, offload_policy=off)
        stage = f"to_empty(device='cpu'): {counts(cfg)['base'] * 2 / GiB:.1f} GiB of bf16 base in host memory"
        print(f"{stage} (host MemAvailable {gib(meminfo())} GiB)", file=sys.stderr, flush=True)
        model.to_empty(device="cpu")
        stage = "random init in host memory"
        with torch.no_grad():
            for n, p in model.named_parameters():
                t = p.to_local() if hasattr(p, "to_local") else p
                if "lora_B" in n:
                    t.zero_()
                elif t.dim() == 1:
                    t.fill_(1.0)
                else:
                    t.normal_(0.0, 0.02)
        rot = hf.model.rotary_emb   # non-persistent buffers: made again on the GPU
        hf.model.rotary_emb = type(rot)(config=hf.config, device="cuda")
        params = [p for p in model.parameters() if p.requires_grad]
        rec.update(params_trainable=sum(p.numel() for p in params),
                   params_frozen=sum(p.numel() for p in model.parameters() if not p.requires_grad),
                   setup_s=round(time.perf_counter() - t0, 2), host_rss_after_setup_gb=gib(proc_status_bytes("VmRSS")))
        stage = "training"
        xs, ys = batches(args, cfg, "cuda")
        opt = adamw(params, torch, fused=False)
        V = cfg["vocab"]

        def step(i):
            logits = model(input_ids=xs[i % len(xs)]).logits
            loss = F.cross_entropy(logits.float().view(-1, V), ys[i % len(xs)].view(-1))
            loss.backward()
            if args.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(params, args.grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss.detach()
        torch.cuda.reset_peak_memory_stats()
        ms, losses = time_steps(torch, step, args.warmup if args.warmup >= 0 else 1, args.steps, args.deadline, rec)
        finish(rec, ms, losses, args, cfg, torch)
    except Exception as e:
        rec.update(status="oom" if is_oom(e) else "error", error=first_line(e), where=stage,
                   setup_s=round(time.perf_counter() - t0, 2))
        if is_oom(e):
            rec["oom_where"] = "host" if "cpu" in stage or "host" in stage or "Cannot allocate" in str(e) or "can't allocate" in str(e) else "gpu or host"
        else:
            traceback.print_exc()
            rc = 1
    finally:
        try:
            dist.destroy_process_group()
        except Exception:
            pass
    rec["host_rss_peak_gb"] = gib(proc_status_bytes("VmHWM"))
    emit(rec)
    return rc


# ------------------------------------------------------------------------------ nobubble's rows

def collect_nobubble(args):
    """One row of lora_bench.sh's table from a `nobubble train` log (run under --guard: the
    guard-result line gives the host RSS peak)."""
    import re
    cfg = dict(SHAPES[args.shape])
    cfg.update({k: getattr(args, k) for k in SHAPE_KEYS if getattr(args, k) is not None})
    rec = dict(engine="nobubble", part=args.part, label=args.label, shape=cfg, batch=args.batch, seq=args.seq,
               rank=args.rank, targets_list=args.targets_list if args.rank else [], note=args.note, log=args.collect_nobubble)
    try:
        with open(args.collect_nobubble, errors="replace") as f:
            text = f.read()
    except OSError as e:
        text = ""
        rec["error"] = f"no log: {e}"
    lines = [l.rstrip() for l in text.splitlines() if l.strip()]
    units = {"B": 1, "KiB": 2 ** 10, "MiB": 2 ** 20, "GiB": 2 ** 30, "TiB": 2 ** 40}
    g = None
    for l in lines:
        if l.startswith("guard-result "):
            try:
                g = json.loads(l[len("guard-result "):])
            except ValueError:
                pass
        m = re.match(r"throughput\s+p90 (\d+) tokens/s \(([\d.]+) ms\), median (\d+) tokens/s \(([\d.]+) ms\), over (\d+) steps", l)
        if m:
            rec.update(tokens_per_s_p90=float(m.group(1)), ms_p90=float(m.group(2)), tokens_per_s=float(m.group(3)),
                       ms=float(m.group(4)), steps=int(m.group(5)))
        m = re.match(r"gpu memory\s+([\d.]+) (\w+) used by this run", l)
        if m and m.group(2) in units:
            rec["gpu_mem_gb"] = round(float(m.group(1)) * units[m.group(2)] / GiB, 2)
        m = re.match(r"setup\s+([\d.]+) s", l)
        if m:
            rec["setup_s"] = float(m.group(1))
        m = re.match(r"allocated\s+host (\d+) bytes, device (\d+) bytes", l)
        if m:
            rec["allocated_host_gb"], rec["allocated_device_gb"] = gib(int(m.group(1))), gib(int(m.group(2)))
        if l.startswith("lora "):
            rec["lora_line"] = l[5:].strip()
        if l.startswith("stream ") and "layers" in l and "GPU" in l:
            rec["stream_line"] = l[7:].strip()[:200]
    if g:
        rec["host_rss_peak_gb"] = g.get("rss_peak_gb")
    child = [l for l in lines if not l.startswith("guard")]
    errs = [l for l in child if "error:" in l]
    if g and (g.get("killed") or g.get("timed_out")):
        rec.update(status="timed out" if g.get("timed_out") else "oom", error=g.get("why", ""))
        if g.get("killed") and not g.get("timed_out"):
            rec["oom_where"] = "host (the guard)"
    elif args.rc == 0 and "tokens_per_s" in rec:
        rec["status"] = "ok"
    else:
        rec["status"] = f"failed (exit {args.rc})"
        rec["error"] = (errs[-1] if errs else (child[-1] if child else rec.get("error", "no output")))[:300]
    line = json.dumps(rec)
    print(line)
    if args.json:
        with open(args.json, "a") as f:
            f.write(line + "\n")
    return 0


# ------------------------------------------------------------------------------ the table

def table(paths):
    """lora_bench.sh's rows (JSON lines from this script, fsdp_offload.py and the nobubble runs
    the shell script collects) as one markdown table per part, with the ratios."""
    rows = []
    for p in paths:
        try:
            with open(p) as f:
                rows += [json.loads(l) for l in f if l.strip()]
        except (OSError, ValueError) as e:
            print(f"(cannot read {p}: {e})")
    titles = {"a": "a. LoRA r=16 q,k,v,o, Llama-3.1-8B shape, resident: nobubble vs PEFT",
              "b": "b. LoRA r=16 q,k,v,o, Llama-3.1-70B shape: nobubble --schedule stream vs what PyTorch can do",
              "c": "c. Full fine-tuning llama-8b: nobubble --schedule stream vs FSDP2 CPU offload (fused AdamW)"}
    for part in ("a", "b", "c"):
        rs = [r for r in rows if r.get("part") == part]
        if not rs:
            continue
        print(f"\n{titles[part]}\n")
        print("| engine | configuration | B x T | status | median tokens/s | p90 tokens/s | model TFLOP/s | GPU memory GiB | host RSS peak GiB | notes |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        best = {}
        for r in rs:
            cfg = r.get("shape")
            tps = r.get("tokens_per_s") if r.get("status") == "ok" else None
            tf = ""
            if tps and cfg:
                fpt = flops_per_token(cfg, r["seq"], r.get("rank", 0) or 0, r.get("targets_list") or ())
                x = tps * fpt / 1e12
                tf = f"{x:.0f}" if x >= 10 else f"{x:.3g}"
            if tps:
                eng = r.get("engine")
                best[eng] = max(best.get(eng, (0, "")), (tps, r.get("label") or f"{r.get('impl', '')} {r.get('mode', '')}"))
            clean = lambda s: str(s).replace("|", "/").replace("\n", " ")[:220]
            status = r.get("status", "?")
            if status != "ok" and r.get("error"):
                status = f"{status}: {clean(r['error'])}"
            note = r.get("note", "")
            if r.get("grad_ckpt"):
                note = (note + "; " if note else "") + "activation checkpointing " + r["grad_ckpt"]
            if r.get("oom_where"):
                note = (note + "; " if note else "") + "oom where: " + str(r["oom_where"])
            if r.get("where") and r.get("status") != "ok":
                note = (note + "; " if note else "") + "at: " + str(r["where"])
            if r.get("stopped_early"):
                note = (note + "; " if note else "") + r["stopped_early"]
            gpu = r.get("gpu_mem_gb", r.get("peak_mem_gb", ""))
            host = r.get("host_rss_peak_gb", "")
            p90 = r.get("tokens_per_s_p90", "")
            print(f"| {r.get('engine', '?')} | {clean(r.get('label') or (str(r.get('impl', '')) + ' ' + str(r.get('mode', ''))))} | {r.get('batch')} x {r.get('seq')} | "
                  f"{status} | {f'{tps:,.0f}' if tps else ''} | {f'{p90:,.0f}' if tps and p90 else ''} | {tf} | "
                  f"{'' if gpu is None else gpu} | {'' if host is None else host} | {clean(note)} |")
        nb, pt = best.get("nobubble"), best.get("pytorch")
        want = {"a": 1.5, "b": None, "c": 5.0}[part]
        if nb and pt:
            ratio = nb[0] / pt[0]
            print(f"\nratio {part}: nobubble {nb[0]:,.0f} ({nb[1]}) / PyTorch {pt[0]:,.0f} ({pt[1]}) = {ratio:.2f}x"
                  + (f" (target >= {want}x: {'met' if ratio >= want else 'NOT met'})" if want else ""))
        elif nb:
            print(f"\nratio {part}: none (no PyTorch row ran: nobubble {nb[0]:,.0f} tokens/s alone)")
        else:
            print(f"\nratio {part}: none (no nobubble row ran)")
    return 0


# ------------------------------------------------------------------------------ command line

def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="llama3.1-8b", choices=sorted(SHAPES))
    for k in SHAPE_KEYS:
        p.add_argument("--" + k.replace("_", "-"), type=int, dest=k, help=f"override the shape's {k}")
    p.add_argument("--impl", choices=("peft", "fsdp2-offload"), default="peft")
    p.add_argument("--mode", default="eager,compile", help="peft: eager, compile or both [eager,compile]")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--alpha", type=float, default=32)
    p.add_argument("--targets", default="q,k,v,o")
    p.add_argument("--steps", type=int, default=8, help="timed steps [8]")
    p.add_argument("--warmup", type=int, default=-1, help="untimed steps first (default: 2 eager, 3 compile, 1 fsdp2)")
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--grad-ckpt", choices=("auto", "on", "off"), default="auto")
    p.add_argument("--data", help="llm.c token shard (default: random tokens from --seed)")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--json", help="append result lines to this file")
    p.add_argument("--label", default="", help="a label kept in each line (lora_bench.sh's table)")
    p.add_argument("--part", default="", help="lora_bench.sh's part (a, b, c), kept in each line")
    p.add_argument("--deadline", type=float, default=0, help="Unix time: no step starts that would end after it")
    p.add_argument("--guard-host-gb", type=float, default=0, help="host-memory guard (default: MemAvailable at start - 4 GiB)")
    p.add_argument("--guard-timeout", type=float, default=0, help="--guard: kill the command after S seconds")
    p.add_argument("--guard-log", help="--guard: the command's stdout and stderr go to this file, the guard's lines after them")
    p.add_argument("--guard-no-rlimit", action="store_true", help="--guard: the watchdog only, no RLIMIT_DATA")
    p.add_argument("--collect-nobubble", metavar="LOG", help="one JSON row from a nobubble train log (lora_bench.sh)")
    p.add_argument("--rc", type=int, default=0, help="--collect-nobubble: the run's exit code")
    p.add_argument("--note", default="", help="--collect-nobubble: a note for the table")
    p.add_argument("--in-child", help=argparse.SUPPRESS)
    p.add_argument("--dry-run", action="store_true", help="counts and FLOPs, no torch")
    p.add_argument("--table", nargs="+", metavar="JSONL", help="print lora_bench.sh's table from these files")
    p.add_argument("--guard", action="store_true", help="-- CMD ARGS... (last): run CMD under the host-memory guard")
    cmd = []
    if "--guard" in argv:   # everything after it is the command
        i = argv.index("--guard")
        argv, cmd = argv[:i + 1], argv[i + 1:]
        cmd = cmd[1:] if cmd[:1] == ["--"] else cmd
    a = p.parse_args(argv)
    a.guard_cmd = cmd
    a.modes = [m.strip() for m in a.mode.split(",") if m.strip()]
    if any(m not in ("eager", "compile") for m in a.modes):
        p.error("--mode: eager, compile or eager,compile")
    a.targets_list = parse_targets(a.targets)
    a.warmup_eff = max(a.warmup, 3)
    return a


def main(argv):
    args = parse_args(argv)
    if args.table:
        return table(args.table)
    if args.collect_nobubble:
        return collect_nobubble(args)
    guard = int(args.guard_host_gb * GiB) if args.guard_host_gb else max(GiB, (meminfo() or 0) - 4 * GiB)
    if args.guard:
        cmd = args.guard_cmd
        if not cmd:
            print("lora_torch.py: --guard needs a command", file=sys.stderr)
            return 2
        log = args.guard_log or os.path.join(tempfile.gettempdir(), f"lora_guard_{os.getpid()}.log")
        r = guard_run(cmd, guard, log, echo=not args.guard_log, timeout=args.guard_timeout, rlimit=not args.guard_no_rlimit)
        lines = [f"guard: exit {r['rc']}, child RSS peak {r['rss_peak_gb']} GiB (guard {guard / GiB:.1f} GiB), "
                 f"host MemAvailable low {r['mem_available_min_gb']} GiB" + (f"; {r['why']}" if r["why"] else "")]
        if r["tail"] and not args.guard_log:
            lines.append(f"guard: the child's last line: {r['tail']}")
        r.pop("stdout", None)
        lines.append("guard-result " + json.dumps(dict(r, guard_gb=gib(guard))))
        for l in lines:
            print(l, file=sys.stderr)
        if args.guard_log:
            with open(args.guard_log, "a") as f:
                f.write("\n".join(lines) + "\n")
        return 137 if r["killed"] else r["rc"]
    cfg = dict(SHAPES[args.shape])
    over = {k: getattr(args, k) for k in SHAPE_KEYS if getattr(args, k) is not None}
    cfg.update(over)
    c = counts(cfg, args.rank, args.targets_list)
    rec = dict(engine="pytorch", impl=args.impl, part=args.part, label=args.label, model=args.shape, shape=cfg,
               batch=args.batch, seq=args.seq, rank=args.rank, alpha=args.alpha, targets_list=args.targets_list,
               params_base=c["base"], params_lora=c["lora"], flops_per_token=flops_per_token(cfg, args.seq, args.rank, args.targets_list),
               steps_planned=args.steps, host=socket.gethostname(), commit=ta.git_commit(),
               date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))

    def emit(r):
        line = json.dumps(r)
        print(line, flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(line + "\n")

    if args.dry_run:
        print(f"{args.shape} {cfg}: {c['base']:,} base parameters ({c['base'] * 2 / GiB:.1f} GiB in bf16), "
              f"LoRA r={args.rank} {','.join(args.targets_list)}: {c['lora']:,} adapter parameters; "
              f"{rec['flops_per_token'] / 1e9:.3f} GFLOP per token at T={args.seq} (full fine-tuning "
              f"{flops_per_token(cfg, args.seq) / 1e9:.3f})", file=sys.stderr)
        rec["status"] = "dry-run"
        emit(rec)
        return 0
    if args.in_child:   # the guarded child of --impl fsdp2-offload: its line goes to a file
        def emit_child(r):
            with open(args.in_child, "w") as f:
                f.write(json.dumps(r) + "\n")
        return fsdp2_child(args, cfg, rec, emit_child)
    missing = []
    for mod in ("torch", "transformers", "peft"):
        try:
            __import__(mod)
        except ImportError as e:
            missing.append(f"{mod} ({e})")
    if missing:
        rec.update(status="error", error="not installed: " + ", ".join(missing))
        for m in (args.modes if args.impl == "peft" else ["fsdp2-offload"]):
            emit(dict(rec, mode=m))
        return 1
    import torch
    if not torch.cuda.is_available():
        rec.update(status="error", error="no CUDA device visible to torch")
        emit(rec)
        return 1
    if args.deadline and time.time() >= args.deadline:
        rec.update(status="skipped (time budget)")
        emit(rec)
        return 0
    if args.impl == "peft":
        return peft_bench(args, cfg, rec, emit)
    # fsdp2-offload: the work in a guarded child
    res = tempfile.NamedTemporaryFile(prefix="lora_fsdp2_", suffix=".json", delete=False).name
    log = res[:-5] + ".log"
    cmd = [sys.executable, os.path.abspath(__file__)] + argv + ["--in-child", res]
    print(f"fsdp2-offload: child under the host-memory guard of {guard / GiB:.1f} GiB (host MemAvailable "
          f"{gib(meminfo())} GiB; the bf16 base alone is {c['base'] * 2 / GiB:.1f} GiB); its log: {log}", file=sys.stderr, flush=True)
    g = guard_run(cmd, guard, log, echo=False, timeout=max(30.0, args.deadline - time.time()) if args.deadline else 0)
    out = None
    try:
        with open(res) as f:
            out = json.loads(f.read().strip() or "null")
    except (OSError, ValueError):
        pass
    if out is None:
        out = dict(rec, mode="fsdp2-offload", status="oom" if g["killed"] else "error",
                   error=g["why"] if g["killed"] else f"child exit {g['rc']} without a result line; its last line: {g['tail']}")
        if g["killed"]:
            out["oom_where"] = "host (the guard)"
            out["child_last_line"] = g["tail"]
    out.update(guard_gb=gib(guard), host_rss_peak_gb=max(out.get("host_rss_peak_gb") or 0, g["rss_peak_gb"] or 0),
               host_mem_available_min_gb=g["mem_available_min_gb"])
    emit(out)
    try:
        os.unlink(res)
    except OSError:
        pass
    return 0 if out.get("status") in ("ok", "oom") else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
