#!/usr/bin/env python3
"""PyTorch FSDP2 with CPU offload on one GPU: the anchor of nobubble's `--schedule stream` (issue 6).

  python3 bench/fsdp_offload.py --model llama-1b --batch 8 --seq 2048 --steps 6 --warmup 2 --json out.jsonl
  python3 bench/fsdp_offload.py --model llama-8b --adamw fused          # the optimizer choice matters
  python3 bench/fsdp_offload.py --dry-run [--model llama-8b]            # no GPU, no torch.distributed

What a PyTorch user does to train a model larger than the GPU on one GPU: Hugging Face's
LlamaForCausalLM (sdpa attention) with nobubble's preset shapes (src/model/transformer.c: vocab
50304, untied head, RoPE theta 10000, RMSNorm eps 1e-5, SwiGLU, GQA), random init, then

  * activation checkpointing of every decoder layer (HF's gradient_checkpointing_enable with
    use_reentrant=False, or --ckpt-impl wrapper: torch's checkpoint_wrapper, torchtitan's way;
    --no-ckpt-act turns it off),
  * fully_shard(layer) for each decoder layer, then fully_shard(model) for the root (embeddings,
    final norm, head), all with MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) and
    CPUOffloadPolicy(pin_memory=True): fp32 master weights, fp32 gradients and both AdamW moments
    live in host memory; each layer's shard is copied to the GPU before its all-gather (fp32, cast
    to bf16 there), its gradient comes back to pinned host memory after the reduce-scatter,
  * torch.optim.AdamW(lr 3e-4, betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on 2-D tensors) on
    those CPU tensors: with CPU offload the optimizer step runs on the CPU, after the backward, on
    the host's cores (--adamw foreach [default, torchtitan's], fused (torch's CPU fused kernel) or
    forloop (what AdamW() picks by itself for CPU DTensors)),
  * torch.nn.utils.clip_grad_norm_(1.0) (nobubble's default clip; --grad-clip 0 turns it off).

--dtype bf16: the model is cast to bf16 before fully_shard, so the host holds bf16 weights,
gradients and AdamW moments (8 bytes per parameter instead of 16; torchtune's full fine-tuning
recipes train this way). It is not the same arithmetic as nobubble's fp32 master weights and
moments, but it is what a user runs when the fp32 state does not fit the host: the best setting
that fits, so the benchmarks run it where the fp32 one does not.

One process, world size 1: init_process_group on a FileStore in a fresh temp folder (or
--rendezvous env: MASTER_ADDR 127.0.0.1 and a free port), backend "cpu:gloo,cuda:nccl" (NCCL for
FSDP's collectives on the GPU; gloo because the gradients are CPU DTensors and clip_grad_norm_'s
total norm is reduced over the mesh where they live: that is how torchtitan initializes with CPU
offload). No network is needed; GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME default to lo.

Tokens: random ids in [0, 50257) from --seed (or --data SHARD), llm.c windows (x, y shifted by
one), up to 8 batches staged on the GPU before timing. Timing: --warmup untimed steps, then
--steps steps, each timed by the host clock between two torch.cuda.synchronize() (the CPU
optimizer step is part of the step). Output: one JSON line on stdout (and appended to --json),
with "impl": "fsdp2-cpu-offload"; progress on stderr. A configuration that does not fit reports
{"status": "oom", ...} and exits 0; the host memory it needs is estimated first and a run that
would not fit is reported as oom without starting (the kernel's OOM killer leaves no line).
--deadline T (Unix time): no step starts that would end after T; what was measured is reported.
"""
import argparse
import datetime
import json
import math
import os
import re
import socket
import statistics
import sys
import tempfile
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_anchor as ta  # noqa: E402  (import-safe without torch: FLOP formula, shards, HF build)
from torch_anchor import gib, proc_status_bytes  # noqa: E402

IMPL = "fsdp2-cpu-offload"
MODE = "fsdp2-offload"   # the "mode" column of torch_anchor.py --table
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# nobubble's llama presets (src/model/transformer.c, nb_tf_preset); --dry-run checks them against
# the C source. vocab 50304 is already a multiple of 64: embedding and head have 50304 rows.
PRESETS = {
    "llama-tiny": dict(arch="llama", layers=2, dim=64, heads=4, kv_heads=2, ffn=172, vocab=50304, seq=64),
    "llama-1b":   dict(arch="llama", layers=16, dim=2048, heads=32, kv_heads=8, ffn=8192, vocab=50304, seq=2048),
    "llama-8b":   dict(arch="llama", layers=32, dim=4096, heads=32, kv_heads=8, ffn=14336, vocab=50304, seq=2048),
    "llama-14b":  dict(arch="llama", layers=48, dim=5120, heads=40, kv_heads=8, ffn=13824, vocab=50304, seq=2048),
}
SHAPE_KEYS = ("layers", "dim", "heads", "kv_heads", "ffn", "vocab")
GiB = 2 ** 30


class Stop(Exception):
    """A result that is not a crash: carries the status to report."""

    def __init__(self, status, msg, **extra):
        super().__init__(msg)
        self.status, self.extra = status, extra


# ------------------------------------------------------------------------------ shapes and sizes

def tensors(cfg):
    """(name, shape) of every parameter of LlamaForCausalLM with this shape, which is also the list of
    nobubble's parameters (nb_tf_model_init: its qkv and gate_up are HF's q/k/v and gate/up
    concatenated; same element counts)."""
    C, hd, V = cfg["dim"], cfg["dim"] // cfg["heads"], ta.padded(cfg["vocab"])
    out = [("model.embed_tokens.weight", (V, C))]
    for l in range(cfg["layers"]):
        p = f"model.layers.{l}."
        out += [(p + "input_layernorm.weight", (C,)),
                (p + "self_attn.q_proj.weight", (cfg["heads"] * hd, C)),
                (p + "self_attn.k_proj.weight", (cfg["kv_heads"] * hd, C)),
                (p + "self_attn.v_proj.weight", (cfg["kv_heads"] * hd, C)),
                (p + "self_attn.o_proj.weight", (C, cfg["heads"] * hd)),
                (p + "post_attention_layernorm.weight", (C,)),
                (p + "mlp.gate_proj.weight", (cfg["ffn"], C)),
                (p + "mlp.up_proj.weight", (cfg["ffn"], C)),
                (p + "mlp.down_proj.weight", (C, cfg["ffn"]))]
    return out + [("model.norm.weight", (C,)), ("lm_head.weight", (V, C))]


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def param_count(cfg):
    """Closed form of the same count: L (2C + C qkv + att C + 3 C ffn) + 2 V C + C."""
    C, hd = cfg["dim"], cfg["dim"] // cfg["heads"]
    qkv, att = (cfg["heads"] + 2 * cfg["kv_heads"]) * hd, cfg["heads"] * hd
    per_layer = 2 * C + C * qkv + att * C + 3 * C * cfg["ffn"]
    return cfg["layers"] * per_layer + 2 * ta.padded(cfg["vocab"]) * C + C


def pow2ceil(n):
    return 1 << (n - 1).bit_length() if n > 1 else n


def host_estimate(cfg, adamw, dtype="fp32"):
    """Host bytes the run needs at its peak, by parts. Pinned memory comes from PyTorch's
    CachingHostAllocator, which rounds every block up to a power of two: the fp32 parameter shards
    (CPUOffloadPolicy(pin_memory=True) pins each one) and the fp32 gradients (copied device-to-host
    with non_blocking into pinned blocks). AdamW's two moments are pageable fp32. foreach AdamW
    also makes one fp32 temporary per parameter at once (torch._foreach_sqrt of the second moments)."""
    shapes = [s for _, s in tensors(cfg)]
    n = sum(numel(s) for s in shapes)
    es = 2 if dtype == "bf16" else 4   # --dtype bf16: weights, gradients and moments in bf16
    pinned = sum(pow2ceil(es * numel(s)) for s in shapes)
    parts = dict(params_pinned=pinned, grads_pinned=pinned, adamw_moments=2 * es * n,
                 adamw_temporary=es * n if adamw == "foreach" else 0, runtime=3 * GiB)
    return sum(parts.values()), parts


def host_memory():
    """(total, available) bytes: /proc/meminfo, capped by a cgroup v2 memory.max if one is set."""
    info = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                k, v = line.split(":", 1)
                info[k] = int(v.split()[0]) * 1024
    except (OSError, ValueError):
        return None, None
    total, avail = info.get("MemTotal"), info.get("MemAvailable")
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            lim = f.read().strip()
        if lim != "max":
            with open("/sys/fs/cgroup/memory.current") as f:
                cur = int(f.read().strip())
            total, avail = min(total, int(lim)), min(avail, int(lim) - cur)
    except (OSError, ValueError):
        pass
    return total, avail


def nobubble_presets():
    """The llama rows of the preset table in src/model/transformer.c, parsed from the C source."""
    path = os.path.join(ROOT, "src", "model", "transformer.c")
    try:
        with open(path) as f:
            src = f.read()
    except OSError:
        return None
    rows = {}
    for m in re.finditer(r'\{"(llama-[\w-]+)",\s*NB_ARCH_LLAMA,\s*(\d+),\s*(\d+),\s*(\d+),\s*(\d+),\s*(\d+),\s*(\d+),\s*(\d+)\}', src):
        L, C, H, KV, F, V, T = map(int, m.groups()[1:])
        rows[m.group(1)] = dict(arch="llama", layers=L, dim=C, heads=H, kv_heads=KV, ffn=F, vocab=V, seq=T)
    return rows


# ------------------------------------------------------------------------------ dry run

def dry_run(args, cfg, rec):
    """Shapes, parameter counts and memory estimates, checked against nobubble's C presets and,
    where transformers and torch >= 2 are importable, against LlamaForCausalLM built on the meta
    device. Touches no GPU and no torch.distributed."""
    ok = True
    nb = nobubble_presets()
    print("preset       layers   dim heads kv   ffn  vocab        params  host GiB (foreach/fused)  MFLOP/token@T", file=sys.stderr)
    for name, c in PRESETS.items():
        n = param_count(c)
        if n != sum(numel(s) for _, s in tensors(c)):
            ok = False
        fe, _ = host_estimate(c, "foreach")
        fu, _ = host_estimate(c, "fused")
        match = ""
        if nb is not None:
            match = "  = transformer.c" if nb.get(name) == c else "  DIFFERS FROM transformer.c"
            ok = ok and nb.get(name) == c
        print(f"{name:<12} {c['layers']:>6} {c['dim']:>5} {c['heads']:>5} {c['kv_heads']:>2} {c['ffn']:>5} {ta.padded(c['vocab']):>6} "
              f"{n:>13,}  {fe / GiB:>7.1f} / {fu / GiB:<7.1f}         {ta.flops_per_token(c, c['seq']) / 1e6:>8.1f}{match}", file=sys.stderr)
    if nb is None:
        print("(src/model/transformer.c not found: presets not checked against nobubble)", file=sys.stderr)
    rec["presets_match_nobubble"] = None if nb is None else all(nb.get(k) == v for k, v in PRESETS.items())

    # the selected configuration
    T = args.seq
    need, parts = host_estimate(cfg, args.adamw, args.dtype)
    total, avail = host_memory()
    rec.update(params=param_count(cfg), flops_per_token=ta.flops_per_token(cfg, T),
               host_need_gb=gib(need), host_need_parts_gb={k: gib(v) for k, v in parts.items()},
               host_total_gb=gib(total), host_available_gb=gib(avail),
               fits_host=None if avail is None else need <= avail)
    try:
        import transformers  # noqa: F401
        import torch
        if int(torch.__version__.split(".")[0]) < 2:
            raise ImportError(f"torch {torch.__version__} has no meta-device context (needs 2.x)")
        wrapper, info = ta.build_llama(cfg, T, "meta")
        hf = wrapper.hf
        named = [(k, tuple(p.shape)) for k, p in hf.named_parameters()]
        rec["hf_params"] = sum(numel(s) for _, s in named)
        rec["hf_matches_shapes"] = sorted(named) == sorted(tensors(cfg))
        ok = ok and rec["hf_matches_shapes"]
        rec["transformers"] = info["transformers"]
        rec["llama_config"] = {k: v for k, v in hf.config.to_dict().items()
                               if k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                        "num_attention_heads", "num_key_value_heads", "rms_norm_eps", "rope_theta",
                                        "rope_parameters", "tie_word_embeddings", "hidden_act", "attention_bias",
                                        "mlp_bias", "max_position_embeddings")}
    except Exception as e:  # ImportError, or anything a missing/old transformers raises
        rec["hf_params"] = None
        rec["hf_check"] = f"skipped: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    print(f"{rec['model']}: {rec['params']:,} parameters; B={args.batch} T={T}: "
          f"{rec['flops_per_token'] / 1e6:.1f} MFLOP/token; host needs ~{need / GiB:.1f} GiB with --adamw {args.adamw} "
          f"({', '.join(f'{k} {v / GiB:.1f}' for k, v in parts.items())})"
          + (f", {avail / GiB:.1f} GiB available here" if avail else "")
          + (f"; LlamaForCausalLM on meta: {rec['hf_params']:,} parameters, shapes {'match' if rec['hf_matches_shapes'] else 'DIFFER'}"
             if rec.get("hf_params") is not None else f"; {rec['hf_check']}"), file=sys.stderr)
    rec["status"] = "dry-run" if ok else "dry-run: mismatch"
    return 0 if ok else 1


# ------------------------------------------------------------------------------ the run

def classify_error(e):
    """(status, where) of an exception: an out-of-memory anywhere is 'oom', the rest 'error'."""
    s = str(e).lower()
    try:
        import torch
        oom_t = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", ())
    except ImportError:
        oom_t = ()
    if isinstance(e, oom_t):
        return "oom", "gpu"
    if isinstance(e, MemoryError) or "can't allocate memory" in s or "cannot allocate memory" in s:
        return "oom", "host"
    if "out of memory" in s:   # cudaHostAlloc failures read "CUDA error: out of memory" too
        return "oom", "cuda (gpu or pinned host)"
    return "error", None


def init_process_group(args, dist, torch):
    for k, v in (("GLOO_SOCKET_IFNAME", "lo"), ("NCCL_SOCKET_IFNAME", "lo"), ("RANK", "0"), ("LOCAL_RANK", "0"),
                 ("WORLD_SIZE", "1"), ("LOCAL_WORLD_SIZE", "1")):
        os.environ.setdefault(k, v)
    torch.cuda.set_device(0)
    if args.rendezvous == "file":
        store_dir = tempfile.mkdtemp(prefix="fsdp_offload_")
        init = "file://" + os.path.join(store_dir, "store")
    else:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
        init = "env://"
    dist.init_process_group(backend=args.backend, init_method=init, rank=0, world_size=1)
    return init


def build(args, cfg, torch, rec):
    """LlamaForCausalLM on the GPU (fp32, random init, as torch_anchor.py builds it), activation
    checkpointing, fully_shard per decoder layer then the root, AdamW over the CPU shards."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
    torch.manual_seed(args.seed)
    wrapper, info = ta.build_llama(cfg, args.seq, "cuda")   # fp32 weights, sdpa checked
    rec.update(info)
    hf = wrapper.hf
    hf.train()
    if args.act_ckpt:
        if args.ckpt_impl == "hf":
            hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        else:
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper
            layers = hf.model.layers
            for i in range(len(layers)):
                layers[i] = checkpoint_wrapper(layers[i], checkpoint_impl=CheckpointImpl.NO_REENTRANT)
    if args.dtype == "bf16":   # the whole state in bf16 (module docstring); gradients reduced in bf16
        hf.to(torch.bfloat16)
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
    else:
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    off = CPUOffloadPolicy(pin_memory=not args.no_pin)
    for layer in hf.model.layers:
        fully_shard(layer, mp_policy=mp, offload_policy=off)
    fully_shard(hf, mp_policy=mp, offload_policy=off)
    params = [p for p in hf.parameters() if p.requires_grad]
    with torch.no_grad():
        where = sorted({(p.to_local() if hasattr(p, "to_local") else p).device.type for p in params})
    if where != ["cpu"]:
        raise RuntimeError(f"after fully_shard with CPUOffloadPolicy the parameters are on {where}, not the CPU")
    rec["params"] = sum(p.numel() for p in params)   # DTensor: the global count
    if rec["params"] != param_count(cfg):
        raise RuntimeError(f"model has {rec['params']} parameters, the preset's shapes say {param_count(cfg)}")
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    kw = {"foreach": dict(foreach=True), "fused": dict(fused=True), "forloop": dict(foreach=False)}[args.adamw]
    opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8, **kw)
    return wrapper, params, opt


def stage_tokens(args, cfg, torch):
    B, T = args.batch, args.seq
    need = min(ta.STAGED_BATCHES, args.warmup + args.steps) * B * T + 1
    if args.data:
        tokens = ta.read_shard(args.data, need, cfg["vocab"]).tolist()
    else:
        g = torch.Generator().manual_seed(args.seed)
        tokens = torch.randint(0, ta.GPT2_VOCAB, (need,), generator=g).tolist()
    return ta.stage_batches(tokens, B, T, "cuda")


def train(args, cfg, rec):
    try:
        import torch
        import torch.distributed as dist
    except ImportError as e:
        raise Stop("error", f"cannot import torch: {e}")
    if not torch.cuda.is_available():
        raise Stop("error", "no CUDA device is visible to torch (this anchor needs one GPU; --dry-run runs anywhere)")
    try:
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard  # noqa: F401
    except ImportError as e:
        raise Stop("error", f"torch {torch.__version__} has no FSDP2 (torch.distributed.fsdp.fully_shard, 2.6+): {e}")
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.backends.cuda.matmul.allow_tf32 = True
    rec.update(torch=torch.__version__, cuda=torch.version.cuda, device=torch.cuda.get_device_name(),
               cpu_threads=torch.get_num_threads(), cpu_count=os.cpu_count())
    B, T = args.batch, args.seq
    t_setup = time.perf_counter()
    rec["rendezvous"] = init_process_group(args, dist, torch)
    try:
        model, params, opt = build(args, cfg, torch, rec)
        xs, ys = stage_tokens(args, cfg, torch)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()   # the fp32 model built on the GPU now lives in host memory
        rec["gpu_mem_after_setup_gb"] = gib(torch.cuda.memory_allocated())
        rec["setup_s"] = round(time.perf_counter() - t_setup, 2)
        rec["host_rss_after_setup_gb"] = gib(proc_status_bytes("VmRSS"))
        print(f"setup {rec['setup_s']:.1f} s: {rec['params']:,} parameters in host memory "
              f"(RSS {rec['host_rss_after_setup_gb']} GiB), {rec['gpu_mem_after_setup_gb']} GiB on the GPU; "
              f"AdamW {args.adamw} on {rec['cpu_threads']} CPU threads", file=sys.stderr, flush=True)

        def step(i):
            loss = model(xs[i % len(xs)], ys[i % len(xs)])   # logits upcast to fp32, mean cross-entropy
            loss.backward()
            if args.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(params, args.grad_clip)
            opt.step()   # on the CPU: parameters, gradients and moments are CPU DTensors
            opt.zero_grad(set_to_none=True)
            return loss.detach()

        torch.cuda.reset_peak_memory_stats()
        warm_s, timed_s, losses, stopped = [], [], [], False
        for i in range(args.warmup + args.steps):
            last = (timed_s or warm_s or [0.0])[-1]
            if args.deadline and i > 0 and time.time() + last > args.deadline:
                stopped = True
                break
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            loss = step(i)
            torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            losses.append(loss.item())
            (warm_s if i < args.warmup else timed_s).append(dt)
            print(f"step {i:>3} {'warm-up' if i < args.warmup else 'timed  '} {dt * 1e3:9.1f} ms  "
                  f"{B * T / dt:9,.0f} tok/s  loss {losses[-1]:.4f}", file=sys.stderr, flush=True)
    finally:
        try:
            dist.destroy_process_group()
        except Exception:
            pass

    rec.update(peak_mem_gb=gib(torch.cuda.max_memory_allocated()), peak_reserved_gb=gib(torch.cuda.max_memory_reserved()),
               host_rss_peak_gb=gib(proc_status_bytes("VmHWM")), host_rss_gb=gib(proc_status_bytes("VmRSS")),
               steps=len(timed_s), steps_planned=args.steps, warmup_ms=[round(s * 1e3, 2) for s in warm_s],
               first_step_s=round(warm_s[0], 2) if warm_s else None,
               loss_first=round(losses[0], 4) if losses else None, loss_last=round(losses[-1], 4) if losses else None)
    if stopped:
        rec["stopped_early"] = f"--deadline: {len(warm_s)} warm-up and {len(timed_s)} timed steps ran"
    if not timed_s:
        raise Stop("skipped (time budget)" if stopped else "error", "no timed step ran")
    ms = sorted(s * 1e3 for s in timed_s)
    med, p90 = statistics.median(ms), ms[math.ceil(0.9 * len(ms)) - 1]
    fpt = ta.flops_per_token(cfg, T)
    tps = B * T / (med / 1e3)
    rec.update(status="ok" if all(math.isfinite(v) for v in losses) else "nonfinite loss",
               ms=round(med, 2), ms_mean=round(statistics.fmean(ms), 2), ms_min=round(ms[0], 2), ms_max=round(ms[-1], 2),
               ms_p90=round(p90, 2), step_ms=[round(s * 1e3, 2) for s in timed_s],
               tokens_per_s=round(tps, 1), tokens_per_s_p90=round(B * T / (p90 / 1e3), 1), flops_per_token=fpt,
               tflops=round(tps * fpt / 1e12, 2), mfu=round(tps * fpt / ta.PEAK_BF16, 5),
               mfu_ceiling=round(tps * fpt / ta.CEILING_BF16, 5),
               compile_s=round(max(0.0, sum(warm_s) - len(warm_s) * med / 1e3), 2))


# ------------------------------------------------------------------------------ command line

def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="bench/README.md (section 'FSDP2 CPU offload') explains the numbers.")
    p.add_argument("--model", default="llama-1b", help=f"preset: {', '.join(PRESETS)} [llama-1b]")
    for k in SHAPE_KEYS:
        p.add_argument("--" + k.replace("_", "-"), type=int, dest=k, help=f"override the preset's {k}")
    p.add_argument("--batch", type=int, default=8, help="sequences per step [8]")
    p.add_argument("--seq", type=int, default=0, help="sequence length (default: the preset's, 2048)")
    p.add_argument("--steps", type=int, default=6, help="timed steps [6]")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first (the first allocates AdamW's state) [2]")
    p.add_argument("--lr", type=float, default=3e-4, help="AdamW learning rate, constant [3e-4]")
    p.add_argument("--grad-clip", type=float, default=1.0, help="clip_grad_norm_ max norm; 0: off [1.0]")
    p.add_argument("--adamw", choices=("foreach", "fused", "forloop"), default="foreach",
                   help="AdamW implementation on the CPU [foreach]")
    p.add_argument("--no-ckpt-act", dest="act_ckpt", action="store_false", help="no activation checkpointing")
    p.add_argument("--ckpt-impl", choices=("hf", "wrapper"), default="hf",
                   help="hf: gradient_checkpointing_enable(use_reentrant=False); wrapper: torch checkpoint_wrapper per layer [hf]")
    p.add_argument("--no-pin", action="store_true", help="CPUOffloadPolicy(pin_memory=False)")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32",
                   help="the offloaded state: fp32 master weights, gradients and moments, or all bf16 [fp32]")
    p.add_argument("--data", help="llm.c token shard (default: random tokens in [0, 50257) from --seed)")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--backend", default="cpu:gloo,cuda:nccl", help="init_process_group backend [cpu:gloo,cuda:nccl]")
    p.add_argument("--rendezvous", choices=("file", "env"), default="file",
                   help="file: FileStore in a temp folder; env: MASTER_ADDR=127.0.0.1 and a free MASTER_PORT [file]")
    p.add_argument("--no-host-check", action="store_true", help="start even when the host memory estimate says it will not fit")
    p.add_argument("--json", help="append the result line to this file")
    p.add_argument("--deadline", type=float, default=0, help="Unix time: no step starts that would end after it")
    p.add_argument("--dry-run", action="store_true", help="shapes, parameter counts, memory estimates; no GPU, no torch.distributed")
    a = p.parse_args(argv)
    if a.model not in PRESETS:
        p.error(f"unknown model '{a.model}' (use one of {', '.join(PRESETS)}, with shape flags to change it)")
    if a.batch < 1 or a.seq < 0 or a.steps < 1 or a.warmup < 0:
        p.error("--batch and --steps must be >= 1, --warmup >= 0")
    return a


def config_of(args):
    cfg = dict(PRESETS[args.model])
    over = {k: getattr(args, k) for k in SHAPE_KEYS if getattr(args, k) is not None}
    cfg.update(over)
    if not args.seq:
        args.seq = cfg["seq"]
    bad = [k for k in SHAPE_KEYS if cfg[k] < 1]
    if bad or cfg["dim"] % cfg["heads"] or cfg["heads"] % cfg["kv_heads"] or (cfg["dim"] // cfg["heads"]) % 2:
        raise SystemExit(f"fsdp_offload.py: error: bad shape {cfg} (dim must split into heads, heads into "
                         "kv-heads, head size even for RoPE, all positive)")
    return cfg, over


def emit(args, rec):
    line = json.dumps(rec)
    print(line, flush=True)
    if args.json:
        with open(args.json, "a") as f:
            f.write(line + "\n")


def main(argv):
    args = parse_args(argv)
    cfg, over = config_of(args)
    rec = dict(engine="pytorch", impl=IMPL, mode=MODE, model=args.model, batch=args.batch, seq=args.seq,
               steps=args.steps, warmup=args.warmup, shape={k: cfg[k] for k in SHAPE_KEYS}, overrides=over or None,
               act_ckpt=(args.ckpt_impl if args.act_ckpt else "off"), adamw=args.adamw, optimizer_device="cpu",
               lr=args.lr, grad_clip=args.grad_clip, pin_memory=not args.no_pin,
               mixed_precision=("param bf16, reduce bf16, master bf16, AdamW moments bf16" if args.dtype == "bf16"
                                else "param bf16, reduce fp32, master fp32"), dtype=args.dtype, backend=args.backend,
               data=args.data or f"random tokens, seed {args.seed}", host=socket.gethostname(), commit=ta.git_commit(),
               date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    if args.dry_run:
        rc = dry_run(args, cfg, rec)
        emit(args, rec)
        return rc
    if args.deadline and time.time() >= args.deadline:
        rec["status"] = "skipped (time budget)"
        emit(args, rec)
        return 0
    need, parts = host_estimate(cfg, args.adamw, args.dtype)
    total, avail = host_memory()
    rec.update(params=param_count(cfg), host_need_gb=gib(need), host_total_gb=gib(total), host_available_gb=gib(avail))
    rc = 0
    try:
        if avail is not None and need > avail and not args.no_host_check:
            hint = ("; --adamw fused or forloop need " + f"{host_estimate(cfg, 'fused', args.dtype)[0] / GiB:.1f} GiB"
                    if args.adamw == "foreach" else "")
            raise Stop("oom", f"host memory: ~{need / GiB:.1f} GiB needed, {avail / GiB:.1f} GiB available "
                              f"(estimate; --no-host-check starts anyway){hint}", oom_where="host (estimated, not started)")
        train(args, cfg, rec)
        if rec["status"] != "ok":
            rc = 1
    except Stop as e:
        rec.update(status=e.status, error=str(e), **e.extra)
        rc = 1 if e.status == "error" else 0
    except SystemExit as e:   # torch_anchor's checks of --data (their message is on stderr)
        rec.update(status="error", error=f"stopped with exit code {e.code} (message above)")
        rc = 1
    except Exception as e:  # report, never die without a line
        status, where = classify_error(e)
        msg = str(e).strip().splitlines()
        rec.update(status=status, error=f"{type(e).__name__}: {msg[0][:300] if msg else ''}")
        if where:
            rec["oom_where"] = where
            rec["host_rss_peak_gb"] = gib(proc_status_bytes("VmHWM"))
        else:
            traceback.print_exc()
            rc = 1
    if rec["status"] == "ok":
        print(f"{IMPL} {args.model} B={args.batch} T={args.seq}: {rec['ms']:.1f} ms/step (median of {rec['steps']}), "
              f"{rec['tokens_per_s']:,.0f} tok/s, {rec['tflops']:.1f} TFLOP/s, GPU peak {rec['peak_mem_gb']} GiB, "
              f"host RSS peak {rec['host_rss_peak_gb']} GiB, loss {rec['loss_first']} -> {rec['loss_last']}", file=sys.stderr)
    else:
        print(f"{IMPL} {args.model} B={args.batch} T={args.seq}: {rec['status']}"
              + (f" ({rec['error']})" if rec.get("error") else ""), file=sys.stderr)
    emit(args, rec)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
