#!/usr/bin/env python3
"""PyTorch anchor of nobubble's --model dlrm-dcnv2 (issue 34): MLPerf's DLRM-DCNv2 written the way
a PyTorch user would write it TorchRec-style without TorchRec, trained on synthetic batches made on
the GPU, timed per step, so that nobubble's dlrm-dcnv2 throughput has a ratio next to it.

  python3 bench/dlrm_torch.py --batch 6912 --table-cap 4000000 --mode eager,compile,reduce-overhead --json torch.jsonl
  python3 bench/dlrm_torch.py --check-ref          (the model against the float64 twin of tests/torch; CPU)
  python3 bench/dlrm_torch.py --params --table-cap N [--nb-ckpt DIR] [--nb-log LOG] [--json F]
                                                  (parameter counts: formula, torch, nobubble; torch optional)
  python3 bench/dlrm_torch.py --collect-nobubble RUN_DIR --batch B --skip W --json nobubble.jsonl   (no torch)
  python3 bench/dlrm_torch.py --table nobubble.jsonl torch.jsonl [--params-json params.json]        (no torch)

The model (mlcommons/training recommendation_v2/torchrec_dlrm, --interaction_type dcn; the same
layout as tests/torch/dlrm_twin_check.py, which tests/test_dlrm_ref.c checks nobubble against):
  DenseArch      13 -> 512 -> 256 -> E (128), a ReLU after every layer
  SparseArch     26 tables of width E, MLPerf's row counts capped at --table-cap (row = id mod rows),
                 sum pooling over MLPerf's multi-hot sizes 3,2,1,2,6,1,1,1,1,7,3,8,1,6,9,5,1,1,1,12,
                 100,27,10,3,1,1 (214 ids per sample). Written as ONE nn.EmbeddingBag(sum of rows, E,
                 mode="sum", sparse=True) with per-table row offsets and one bag per (sample, table):
                 the same sums as 26 EmbeddingBags, in one kernel each way (what TorchRec's
                 table-batched FBGEMM kernel does; 26 separate bags are 26 launches and 26 sparse
                 optimizer updates, slower).
  Interaction    x0 = [dense | 26 pooled] (27 E = 3,456 wide); 3 LowRankCrossNet layers of rank 512:
                 x_{l+1} = x0 * (W_l (V_l x_l) + b_l) + x_l, W_l [27E, 512], V_l [512, 27E]
  OverArch       27E -> 1024 -> 1024 -> 512 -> 256 (ReLU after each) -> 1; BCE with logits
  Optimizers     nobubble's dlrm-dcnv2 defaults, which are the reference's: dense parameters
                 torch.optim.Adagrad(lr 0.005, eps 1e-10, accumulators from 0; foreach on CUDA),
                 tables torch.optim.Adagrad(lr 0.005, eps 1e-8) on the sparse gradient: ELEMENT-wise
                 (one accumulator per weight), the update of FBGEMM's EXACT_ADAGRAD that the
                 reference's fused optimizer runs and of nobubble's default --emb-optim adagrad-exact.
                 TorchRec's fused in-backward optimizer (FBGEMM) is not pure PyTorch; torch's sparse
                 Adagrad (coalesce, then the touched rows) is the fastest pure-PyTorch equivalent.
  Precision      fp32 weights, tables and optimizer state; bf16 autocast for the dense part with the
                 pooled rows cast to bf16 (nobubble's --precision bf16, its CUDA default: bf16
                 activations, fp32 tables and masters). --dtype fp32: no autocast.
  Init           TorchRec's: table rows uniform(+-sqrt(1/rows)), crosses xavier_normal with bias 0,
                 Linear layers torch's default.
Modes: eager; compile = torch.compile(dynamic=False) of everything after the lookup; reduce-overhead
= the same with mode="reduce-overhead" (CUDA graphs). The sparse lookup and both optimizers stay
eager in every mode (AOTAutograd does not trace sparse gradients). A mode that fails prints its
error and is recorded as such; the next one runs.
Data: --staged distinct batches made on the device before timing, cycled: dense features
log1p(floor(lognormal)), labels Bernoulli(0.25), each table's ids drawn from the same law as
nobubble's synth generator (Zipf with exponent --zipf 1.05 over min(rows, cap), ranks scrambled by
an affine bijection), so a batch touches about as many distinct rows as nobubble's (compared in the
table: unique rows per step). The input pipeline is not timed.
Throughput (the same for nobubble's rows): p90 samples/s = B / t_{ceil(0.9 n) - 1}, median samples/s
= B / t_{floor(n/2)} over the n timed step times sorted (nearest rank, nobubble's own rule).
"""
import argparse
import contextlib
import datetime
import json
import math
import os
import re
import socket
import statistics
import struct
import sys
import time
import traceback

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    _Module = nn.Module
except ModuleNotFoundError:  # --params, --collect-nobubble and --table run without torch
    torch = nn = F = None
    _Module = object

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_anchor import git_commit, is_oom, load_jsonl, release_memory, sync, warm_and_time  # noqa: E402

NDENSE, NCAT = 13, 26
MLPERF_ROWS = [40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282, 10,
               2209, 11938, 155, 4, 976, 14, 40000000, 40000000, 40000000, 590152, 12973, 108, 36]
HOT = [3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1]
BOTTOM = [512, 256]
MODES = ("eager", "compile", "reduce-overhead")
LR, DENSE_EPS, EMB_EPS = 0.005, 1e-10, 1e-8
# MLPerf Training v4.0, HugeCTR DLRM-DCNv2 on 8 x H200: 16.98 M samples/s at global batch 55,296
# (6,912 per GPU), i.e. ~2.12 M samples/s per GPU. A published number, not run here.
MLPERF_REF = dict(impl="MLPerf v4.0 HugeCTR (reference)", per_gpu=16.98e6 / 8, note="~2.12M samples/s per H200 "
                  "(16.98M/s on 8 x H200, global batch 55,296); tables uncapped (204M rows), model-parallel")
EMB_OPTIM_NOTE = "torch.optim.Adagrad on the sparse gradient (element-wise, as nobubble's adagrad-exact)"


def fail(msg, hint):
    print(f"dlrm_torch: error: {msg} (hint: {hint})", file=sys.stderr)
    sys.exit(2)


def throughput(B, ms):
    s = sorted(ms)
    p90, med = s[math.ceil(0.9 * len(s)) - 1], s[len(s) // 2]
    return dict(p90_samples_per_s=round(B / (p90 / 1e3), 1), median_samples_per_s=round(B / (med / 1e3), 1),
                ms_p90=round(p90, 4), ms_median=round(med, 4), ms_min=round(min(ms), 4), ms_max=round(max(ms), 4))


def table_rows(cap):
    return [min(r, cap) for r in MLPERF_ROWS]


def param_formula(E, cap, rank, blocks, top):
    """The parameter counts of the model, from its shape alone (no torch)."""
    dims = [NDENSE] + BOTTOM + [E]
    bottom = sum(dims[i] * dims[i + 1] + dims[i + 1] for i in range(3))
    D = (NCAT + 1) * E
    cross = blocks * (2 * D * rank + D)
    widths = [D] + list(top) + [1]
    over = sum(widths[j] * widths[j + 1] + widths[j + 1] for j in range(len(widths) - 1))
    rows = sum(table_rows(cap))
    return dict(dense=bottom + cross + over, bottom=bottom, cross=cross, top=over, rows=rows, emb=rows * E)


def memory_gb(E, cap, B):
    """Bytes one side holds for the tables: fp32 rows + element-wise Adagrad sums, and the sparse
    gradient of one batch (B x 214 rows of E floats, before coalescing)."""
    rows = sum(table_rows(cap))
    return dict(tables_gb=rows * E * 4 / 1e9, adagrad_gb=rows * E * 4 / 1e9, sparse_grad_gb=B * sum(HOT) * E * 4 / 1e9)


# ------------------------------------------------------------------------------ the model

class DLRMDense(_Module):
    """Everything after the lookup (the part torch.compile compiles): DenseArch, the crosses and the
    OverArch. pooled is [B, 26 E], the tables' sums in table order."""

    def __init__(self, E, rank, blocks, top):
        super().__init__()
        dims = [NDENSE] + BOTTOM + [E]
        layers = []
        for i in range(3):
            layers += [nn.Linear(dims[i], dims[i + 1]), nn.ReLU()]
        self.bottom = nn.Sequential(*layers)
        D = (NCAT + 1) * E
        self.W = nn.ParameterList([nn.Parameter(torch.empty(D, rank)) for _ in range(blocks)])
        self.V = nn.ParameterList([nn.Parameter(torch.empty(rank, D)) for _ in range(blocks)])
        self.bias = nn.ParameterList([nn.Parameter(torch.zeros(D)) for _ in range(blocks)])
        widths = [D] + list(top)
        layers = []
        for j in range(len(top)):
            layers += [nn.Linear(widths[j], widths[j + 1]), nn.ReLU()]
        layers.append(nn.Linear(widths[-1], 1))
        self.top = nn.Sequential(*layers)
        for W, V in zip(self.W, self.V):
            nn.init.xavier_normal_(W)
            nn.init.xavier_normal_(V)

    def logits(self, dense, pooled):
        x = self.bottom(dense)
        x0 = torch.cat([x, pooled.to(x.dtype)], dim=1)
        xl = x0
        for W, V, b in zip(self.W, self.V, self.bias):
            xl = x0 * F.linear(F.linear(xl, V), W, b) + xl
        return self.top(xl).squeeze(1)

    def forward(self, dense, pooled, label):
        z = self.logits(dense, pooled)
        return F.binary_cross_entropy_with_logits(z if z.dtype == torch.float64 else z.float(), label)


def make_tables(rows, E, device, dtype=None):
    """One EmbeddingBag over all tables (row offsets per table), TorchRec's init per table."""
    total = sum(rows)
    emb = nn.EmbeddingBag(total, E, mode="sum", sparse=True, device=device, dtype=dtype)
    if device != "meta":
        with torch.no_grad():
            at = 0
            for n in rows:
                emb.weight[at:at + n].uniform_(-math.sqrt(1.0 / n), math.sqrt(1.0 / n))
                at += n
    return emb


def bag_offsets(B, device):
    """Bag k = sample k // 26, table k % 26: the flat ids of a sample are its tables' ids in table
    order (HOT[f] each), so bag (b, f) starts at b * 214 + sum(HOT[:f])."""
    cum = [0]
    for h in HOT[:-1]:
        cum.append(cum[-1] + h)
    return (torch.arange(B, device=device)[:, None] * sum(HOT) + torch.tensor(cum, device=device)[None, :]).reshape(-1)


def make_optimizers(model, emb, cuda):
    dense = list(model.parameters())
    try:
        opt = torch.optim.Adagrad(dense, lr=LR, eps=DENSE_EPS, initial_accumulator_value=0.0, foreach=True)
        kind = "foreach"
    except TypeError:   # a torch without foreach (older than 1.12)
        opt = torch.optim.Adagrad(dense, lr=LR, eps=DENSE_EPS, initial_accumulator_value=0.0)
        kind = "single-tensor"
    # sparse gradients take the single-tensor path whatever foreach says; say it outright
    opt_emb = torch.optim.Adagrad([emb.weight], lr=LR, eps=EMB_EPS, initial_accumulator_value=0.0, foreach=False)
    return dense, (opt, opt_emb), kind


# ------------------------------------------------------------------------------ synthetic batches

def scramble_params(n, f, seed):
    """An affine bijection rank -> (rank * mul + add) mod n (mul coprime to n), per table."""
    mul = (0x9E3779B1 + 2 * (f + 1) * 0x85EBCA6B + seed) % n if n > 1 else 1
    mul = max(mul, 1)
    while math.gcd(mul, n) != 1:
        mul += 1
    return mul, (f * 0x27D4EB2F + seed) % n


def stage_batches(args, rows, device):
    """--staged batches on the device: dict(ids [B*214] global rows, dense [B, 13], label [B])."""
    B, S = args.batch, args.staged
    g = torch.Generator(device=device)
    g.manual_seed(args.seed)
    offs = [0]
    for n in rows[:-1]:
        offs.append(offs[-1] + n)
    per_table = []
    for f, n in enumerate(rows):
        count = S * B * HOT[f]
        if n == 1:
            r = torch.zeros(count, dtype=torch.int64, device=device)
        else:
            k = torch.arange(1, n + 1, device=device, dtype=torch.float64)
            cdf = torch.cumsum(k.pow_(-args.zipf), 0)
            cdf /= cdf[-1].item()
            del k
            u = torch.rand(count, device=device, dtype=torch.float64, generator=g)
            r = torch.searchsorted(cdf, u).clamp_(max=n - 1)
            del cdf, u
            mul, add = scramble_params(n, f, args.seed)
            r = (r * mul + add) % n
        per_table.append((r + offs[f]).view(S, B, HOT[f]))
    ids = torch.cat(per_table, dim=2).view(S, B * sum(HOT))
    del per_table
    z = torch.randn(S, B, NDENSE, device=device, generator=g)
    dense = torch.log1p(torch.floor(torch.exp(1.0 + 1.5 * z)))
    label = (torch.rand(S, B, device=device, generator=g) < 0.25).float()
    out = [dict(ids=ids[s].contiguous(), dense=dense[s].contiguous(), label=label[s].contiguous()) for s in range(S)]
    uniq = [int(torch.unique(b["ids"]).numel()) for b in out]
    return out, statistics.fmean(uniq)


# ------------------------------------------------------------------------------ one timed run

def train_and_time(args, mode, batches, rows):
    cuda = args.device == "cuda"
    dev = args.device
    torch.manual_seed(args.seed)
    B, E = args.batch, args.emb_dim
    emb = make_tables(rows, E, dev)
    model = DLRMDense(E, args.cross_rank, args.blocks, args.top).to(dev)
    model.train()
    dense_params, opts, dense_kind = make_optimizers(model, emb, cuda)
    offsets = bag_offsets(B, dev)
    if mode == "eager":
        fwd = model
    else:
        if not hasattr(torch, "compile"):
            raise RuntimeError(f"torch {torch.__version__} has no torch.compile")
        fwd = torch.compile(model, mode="reduce-overhead" if mode == "reduce-overhead" else None, dynamic=False)
    autocast = (torch.autocast(device_type=dev, dtype=torch.bfloat16) if args.dtype == "bf16"
                else contextlib.nullcontext())
    nsteps = args.warmup + args.steps
    losses = torch.zeros(nsteps, device=dev)

    def step(i):
        bt = batches[i % len(batches)]
        if mode == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()
        with autocast:
            pooled = emb(bt["ids"], offsets).view(B, NCAT * E)
            loss = fwd(bt["dense"], pooled, bt["label"])
        loss.backward()
        for o in opts:
            o.step()
        for o in opts:
            o.zero_grad(set_to_none=True)
        losses[i].copy_(loss.detach())

    ms, first_step_s, warmup_s, _ = warm_and_time(cuda, step, args.warmup, args.steps)
    lossv = losses.tolist()
    med = statistics.median(ms)
    n_dense = sum(p.numel() for p in dense_params)
    return dict(throughput(B, ms), status="ok" if all(math.isfinite(v) for v in lossv) else "nonfinite loss",
                loss_first=round(lossv[0], 5), loss_last=round(lossv[-1], 5),
                compile_s=round(max(0.0, warmup_s - args.warmup * med / 1e3), 2) if mode != "eager" else None,
                warmup_s=round(warmup_s, 2), first_step_s=round(first_step_s, 2),
                peak_mem_gb=round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
                dense_params=n_dense, emb_rows=emb.weight.shape[0], emb_params=emb.weight.numel(),
                dense_optim=f"Adagrad ({dense_kind})")


def est_cost_s(mode, steps):
    """A rough guess of a run's wall time (tables made, compiled, timed), to skip runs that would
    cross --deadline."""
    return {"eager": 25, "compile": 90, "reduce-overhead": 120}[mode] + steps * 0.05


def run_mode(args, meta, mode, batches, rows):
    rec = dict(meta, impl=f"torch-{mode}", batch=args.batch, steps=args.steps, warmup=args.warmup,
               date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    if args.deadline and time.time() + est_cost_s(mode, args.warmup + args.steps) > args.deadline:
        rec["status"] = "skipped (time budget)"
        return rec
    try:
        rec.update(train_and_time(args, mode, batches, rows))
    except Exception as e:
        rec["status"] = "OOM" if is_oom(e) else "error"
        msg = str(e).strip().splitlines()
        rec["error"] = f"{type(e).__name__}: {msg[0][:300] if msg else ''}"
        if args.traceback:
            traceback.print_exc()
    finally:
        release_memory()
    return rec


def describe(r):
    head = f"{r['impl']} B={r['batch']}"
    if r.get("status") not in ("ok", "nonfinite loss"):
        return f"{head}: {r.get('status')}" + (f": {r['error']}" if r.get("error") else "")
    extra = (f", warm-up {r['warmup_s']:.1f} s" if r.get("warmup_s") is not None else "") + (f" (compile ~{r['compile_s']:.1f} s)" if r.get("compile_s") is not None else "")
    extra += f", peak {r['peak_mem_gb']} GiB" if r.get("peak_mem_gb") is not None else ""
    return (f"{head}: median {r['median_samples_per_s']:,.0f} samples/s ({r['ms_median']:.2f} ms), p90 "
            f"{r['p90_samples_per_s']:,.0f} ({r['ms_p90']:.2f} ms) over {r['steps']} steps{extra}, "
            f"loss {r['loss_first']:.4f} -> {r['loss_last']:.4f}" + ("" if r["status"] == "ok" else "  NONFINITE LOSS"))


def emit(args, rec):
    print(describe(rec), flush=True)
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps(rec) + "\n")


def bench(args):
    if torch is None:
        fail("PyTorch is not installed here", "run on the GPU machine (its python3 has torch)")
    cuda = args.device == "cuda"
    if cuda:
        if not torch.cuda.is_available():
            fail("no CUDA device is visible to torch", "run on the GPU machine, or --device cpu for a smoke check")
        # TF32 off, as nobubble's --precision fp32 (under bf16 autocast the matmuls are bf16 anyway)
        torch.backends.cuda.matmul.allow_tf32 = False
    else:
        torch.set_num_threads(os.cpu_count())
    modes = args.mode.split(",")
    for m in modes:
        if m not in MODES:
            fail(f"unknown mode '{m}'", "use eager, compile, reduce-overhead or a comma list")
    rows = table_rows(args.table_cap)
    pf = param_formula(args.emb_dim, args.table_cap, args.cross_rank, args.blocks, args.top)
    mem = memory_gb(args.emb_dim, args.table_cap, args.batch)
    meta = dict(engine="pytorch", torch=torch.__version__, cuda=torch.version.cuda,
                device=torch.cuda.get_device_name() if cuda else "cpu", dtype=args.dtype, host=socket.gethostname(),
                commit=git_commit(), table_cap=args.table_cap, E=args.emb_dim, emb_optim=EMB_OPTIM_NOTE)
    print(f"torch {meta['torch']} (CUDA {meta['cuda']}) on {meta['device']}; "
          f"{'fp32 weights + bf16 autocast' if args.dtype == 'bf16' else 'fp32'}; dense Adagrad, {EMB_OPTIM_NOTE}; "
          f"one nn.EmbeddingBag({pf['rows']:,}, {args.emb_dim}, sum, sparse=True) over 26 tables (cap {args.table_cap:,}); "
          f"{pf['dense']:,} dense parameters; tables {mem['tables_gb']:.2f} GB + Adagrad sums {mem['adagrad_gb']:.2f} GB "
          f"+ sparse gradient {mem['sparse_grad_gb']:.2f} GB", flush=True)
    t0 = time.perf_counter()
    batches, uniq = stage_batches(args, rows, args.device)
    sync(cuda)
    meta["unique_rows"] = round(uniq, 1)
    print(f"{len(batches)} synthetic batches of {args.batch} on the {args.device} in {time.perf_counter() - t0:.1f} s "
          f"(zipf {args.zipf}; {uniq:,.0f} distinct rows per batch on average)", flush=True)
    status = 0
    for mode in modes:
        rec = run_mode(args, meta, mode, batches, rows)
        emit(args, rec)
        if rec["status"] in ("error", "nonfinite loss"):
            status = 1
    return status


# ------------------------------------------------------------------------------ check against the twin

def read_safetensors(path):
    """{name: numpy array} and the metadata of a safetensors file (F32, F64, I32, I64, BF16 as float32)."""
    import numpy as np
    with open(path, "rb") as f:
        n, = struct.unpack("<Q", f.read(8))
        head = json.loads(f.read(n))
        data = f.read()
    kinds = {"F32": np.float32, "F64": np.float64, "I32": np.int32, "I64": np.int64, "BF16": np.uint16}
    out = {}
    for name, t in head.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        arr = np.frombuffer(data[a:b], dtype=kinds[t["dtype"]]).reshape(t["shape"])
        if t["dtype"] == "BF16":
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        out[name] = arr
    return out, head.get("__metadata__", {})


def check_ref(args):
    """This benchmark's model and optimizers (one EmbeddingBag over the tables, DLRMDense, sparse
    Adagrad) against tests/torch/ref/dlrm_tiny.safetensors, the float64 output of
    tests/torch/dlrm_twin_check.py (the twin nobubble is checked against in test_dlrm_ref.c): logits,
    loss, every dense gradient, the touched rows' gradients and the 20 steps' losses, in float64 on
    the CPU. The file stores the float64 results rounded to float32, so agreement ends near 6e-8: exit 1
when a relative error exceeds 1e-6 (a wrong layer, layout or update is off by far more)."""
    import numpy as np
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = args.ref or os.path.join(root, "tests", "torch", "ref", "dlrm_tiny.safetensors")
    if not os.path.exists(path):
        fail(f"{path} is missing", "write it with 'python3 tests/torch/dlrm_twin_check.py gen --out FILE'")
    t, meta = read_safetensors(path)
    E, blocks, rank = int(meta["E"]), int(meta["blocks"]), int(meta["cross_rank"])
    top = [int(x) for x in meta["top"].split(",")]
    hot = [int(x) for x in meta["hot"].split(",")]
    rows = [int(x) for x in meta["cat_rows"].split(",")]
    B, steps = int(meta["B"]), int(meta["steps"])
    if hot != HOT or float(meta["lr"]) != LR or float(meta["eps"]) != DENSE_EPS or float(meta["emb_eps"]) != EMB_EPS:
        fail(f"{path}: its multi-hot sizes or optimizer settings differ from this script's", "regenerate the reference")
    d = torch.float64
    torch.manual_seed(0)
    m = DLRMDense(E, rank, blocks, top).to(d)
    emb = make_tables(rows, E, "cpu", dtype=d)
    offs = np.concatenate([[0], np.cumsum(rows)])
    P = dict(m.named_parameters())
    names = {}
    for i in range(3):
        for k in ("weight", "bias"):
            names[f"bottom.{i}.{k}"] = (f"bottom.{2 * i}.{k}", False)
    for l in range(blocks):
        names[f"block.{l}.U"] = (f"W.{l}", False)
        names[f"block.{l}.V"] = (f"V.{l}", True)   # nobubble's V is V_l^T
        names[f"block.{l}.b"] = (f"bias.{l}", False)
    for j in range(len(top) + 1):
        for k in ("weight", "bias"):
            names[f"top.{j}.{k}"] = (f"top.{2 * j}.{k}", False)
    with torch.no_grad():
        for rn, (mn, tr) in names.items():
            a = torch.tensor(t["w." + rn], dtype=d)
            P[mn].copy_((a.t() if tr else a).reshape(P[mn].shape))
        emb.weight.copy_(torch.tensor(np.concatenate([t[f"w.emb.cat.{f}"] for f in range(NCAT)]), dtype=d))
    mv = t["batch.mv"].astype(np.int64) & 0xFFFFFFFF   # uint32 ids stored as int32 bits
    cols, at = [], 0
    for f in range(NCAT):
        cols.append(mv[:, at:at + hot[f]] % rows[f] + offs[f])
        at += hot[f]
    ids = torch.tensor(np.concatenate(cols, axis=1).reshape(-1))
    offsets = bag_offsets(B, "cpu")
    dense = torch.tensor(t["batch.dense"], dtype=d)
    label = torch.tensor(t["batch.label"], dtype=d)
    dense_params, opts, _ = make_optimizers(m, emb, False)

    def rel(a, b):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))

    errs, losses = {}, []
    for step in range(steps):
        pooled = emb(ids, offsets).view(B, NCAT * E)
        z = m.logits(dense, pooled)
        loss = F.binary_cross_entropy_with_logits(z, label)
        loss.backward()
        losses.append(loss.item())
        if step == 0:
            errs["logits"] = rel(z.detach().numpy(), t["logits"])
            errs["loss"] = rel(loss.item(), t["loss"][0])
            for rn, (mn, tr) in names.items():
                g = P[mn].grad
                errs[rn] = rel((g.t() if tr else g).reshape(t["g." + rn].shape).numpy(), t["g." + rn])
            ge = emb.weight.grad.coalesce().to_dense().numpy()
            touched = t["g.emb.rows"].astype(np.int64)
            total = int(offs[-1])
            real = touched[touched < total]     # the last touched row is nobubble's item row (zero)
            errs["embedding rows"] = rel(ge[real], t["g.emb"][touched < total])
            errs["item row (reference, must be 0)"] = float(np.abs(t["g.emb"][touched >= total]).max(initial=0.0))
            untouched = np.setdiff1d(np.arange(total), real)
            errs["untouched rows (norm)"] = float(np.linalg.norm(ge[untouched]))
        for o in opts:
            o.step()
        for o in opts:
            o.zero_grad(set_to_none=True)
    errs[f"{steps} steps' losses"] = rel(losses, t["losses"])
    worst = max(errs, key=errs.get)
    print(f"dlrm_torch vs {os.path.relpath(path, root)} (float64, E {E}, rank {rank}, top {meta['top']}, B {B}): "
          f"loss {losses[0]:.12f} vs {float(t['loss'][0]):.12f}, step {steps} loss {losses[-1]:.9f} vs "
          f"{float(t['losses'][-1]):.9f}; worst of {len(errs)} relative errors: {worst} {errs[worst]:.2e}")
    return 0 if errs[worst] <= 1e-6 else 1


# ------------------------------------------------------------------------------ parameter counts

def nb_ckpt_counts(run_dir):
    """Exact counts from a nobubble checkpoint's model.safetensors header: dense parameters, the
    26 tables' rows (emb.cat.*), and the rows of other tables (emb.item: the DLRM form never reads it)."""
    path = os.path.join(run_dir, "ckpt", "model.safetensors")
    try:
        with open(path, "rb") as f:
            n, = struct.unpack("<Q", f.read(8))
            head = json.loads(f.read(n))
    except (OSError, ValueError, struct.error) as e:
        fail(f"cannot read {path}: {e}", "point --nb-ckpt at a nobubble run directory with a checkpoint")
    dense = cat_rows = other_rows = 0
    E = None
    shapes = {n: t["shape"] for n, t in head.items() if n != "__metadata__"}
    for name, t in head.items():
        if name == "__metadata__":
            continue
        numel = math.prod(t["shape"])
        if name.startswith("emb.cat."):
            cat_rows += t["shape"][0]
            E = t["shape"][1]
        elif name.startswith("emb."):
            other_rows += t["shape"][0]
        else:
            dense += numel
    return dict(dense=dense, rows=cat_rows, unread_rows=other_rows, E=E, shapes=shapes)


def shape_check(nb_shapes, model, cap):
    """Layer by layer: nobubble's checkpoint tensors against this model's parameters (names mapped
    as tests/torch/dlrm_twin_check.py maps them; nobubble's block.l.V is V_l transposed) and the 26
    tables' rows. Returns the list of mismatches (empty: the same layers)."""
    P = {n: list(p.shape) for n, p in model.named_parameters()}
    want, bad = {}, []
    for i in range(3):
        for k in ("weight", "bias"):
            want[f"bottom.{i}.{k}"] = P.get(f"bottom.{2 * i}.{k}")
    nb_blocks = sorted({int(n.split(".")[1]) for n in nb_shapes if n.startswith("block.")})
    for l in range(max(len(model.W), len(nb_blocks))):
        want[f"block.{l}.U"] = P.get(f"W.{l}")
        want[f"block.{l}.V"] = P[f"V.{l}"][::-1] if f"V.{l}" in P else None
        want[f"block.{l}.b"] = P.get(f"bias.{l}")
    ntop = sum(1 for m in model.top if isinstance(m, nn.Linear))
    for j in range(ntop):
        for k in ("weight", "bias"):
            want[f"top.{j}.{k}"] = P.get(f"top.{2 * j}.{k}")
    for f, n in enumerate(table_rows(cap)):
        want[f"emb.cat.{f}"] = [n, model.W[0].shape[0] // (NCAT + 1)]
    for name, shp in sorted(want.items()):
        if nb_shapes.get(name) != shp:
            bad.append(f"{name}: nobubble {nb_shapes.get(name)}, torch {shp}")
    for name in sorted(nb_shapes):
        if name not in want and name != "emb.item":
            bad.append(f"{name}: nobubble {nb_shapes[name]}, not in the torch model")
    return bad, len(want)


def nb_log_counts(log):
    """nobubble's own start line: 'dlrm-dcnv2 ... 16.04 M dense parameters, 24.18 M embedding rows'
    (two decimals of millions; the rows include the one-row item table)."""
    try:
        text = open(log).read()
    except OSError:
        return None
    m = re.search(r"([0-9.]+) M dense parameters, ([0-9.]+) M embedding rows", text)
    return dict(dense_m=float(m.group(1)), rows_m=float(m.group(2))) if m else None


def params(args):
    """Counts from the formula, from torch (the modules built on the meta device), and from nobubble
    (an exact checkpoint at --nb-ckpt-cap, and its start line at --table-cap); prints the comparison
    and exits 1 when they disagree."""
    E, rank, blocks, top = args.emb_dim, args.cross_rank, args.blocks, args.top
    out = dict(table_cap=args.table_cap, E=E, ok=True, lines=[])

    def say(s):
        out["lines"].append(s)
        print(s, flush=True)

    pf = param_formula(E, args.table_cap, rank, blocks, top)
    out["formula"] = pf
    mem = memory_gb(E, args.table_cap, args.batch)
    out["memory"] = mem
    say(f"formula     {pf['dense']:,} dense (bottom {pf['bottom']:,}, crosses {pf['cross']:,}, top {pf['top']:,}) + "
        f"{pf['rows']:,} rows x {E} = {pf['emb']:,} table parameters at cap {args.table_cap:,}")
    say(f"memory      each side, one at a time: tables {mem['tables_gb']:.2f} GB + element-wise Adagrad sums "
        f"{mem['adagrad_gb']:.2f} GB = {mem['tables_gb'] + mem['adagrad_gb']:.2f} GB (fp32), plus the sparse gradient "
        f"of a batch of {args.batch}: {mem['sparse_grad_gb']:.2f} GB before coalescing (PyTorch)")
    if args.gpu_mem_gb:
        need = mem["tables_gb"] + mem["adagrad_gb"] + 3 * mem["sparse_grad_gb"] + 4
        fits = need < args.gpu_mem_gb
        say(f"fits        {'yes' if fits else 'NO'}: ~{need:.1f} GB needed (tables, sums, ~3 sparse gradients, ~4 GB dense "
            f"part and activations) of the GPU's {args.gpu_mem_gb:.1f} GB")
        out["fits"] = fits
    if torch is not None:
        tm = DLRMDense(E, rank, blocks, top)                       # on the CPU: 64 MB
        emb = make_tables(table_rows(args.table_cap), E, "meta")   # the tables' shape only
        td = sum(p.numel() for p in tm.parameters())
        out["torch"] = dict(dense=td, rows=emb.weight.shape[0])
        same = td == pf["dense"] and emb.weight.shape[0] == pf["rows"]
        out["ok"] &= same
        say(f"torch       {td:,} dense + {emb.weight.shape[0]:,} rows ({'= the formula' if same else 'DIFFERS from the formula'})")
    else:
        say("torch       skipped: torch not installed (the formula stands for it; bench/dlrm_torch.py builds exactly it)")
    if args.nb_ckpt:
        nb = nb_ckpt_counts(args.nb_ckpt)
        pc = param_formula(E, args.nb_ckpt_cap, rank, blocks, top)
        same = nb["dense"] == pc["dense"] and nb["rows"] == pc["rows"] and nb["E"] == E
        shapes = nb.pop("shapes")
        out["nobubble_ckpt"] = dict(nb, cap=args.nb_ckpt_cap)
        out["ok"] &= same
        if torch is not None:
            bad, n = shape_check(shapes, DLRMDense(E, rank, blocks, top), args.nb_ckpt_cap)
            out["ok"] &= not bad
            say(f"layers      {n} tensors of nobubble's checkpoint against the torch model's: "
                + ("the same shapes" if not bad else f"{len(bad)} DIFFER: " + "; ".join(bad[:6])))
        say(f"nobubble    checkpoint at cap {args.nb_ckpt_cap:,}: {nb['dense']:,} dense + {nb['rows']:,} rows x {nb['E']} "
            f"(+ {nb['unread_rows']} row of its item table, which the DLRM form never reads) "
            f"{'= the formula at that cap' if same else 'DIFFERS from the formula (' + str(pc['dense']) + ' + ' + str(pc['rows']) + ')'}")
    if args.nb_log:
        c = nb_log_counts(args.nb_log)
        if c is None:
            say(f"nobubble    no 'M dense parameters' line in {args.nb_log}")
        else:
            rows_nb = pf["rows"] + 1   # its item row
            same = abs(c["dense_m"] - pf["dense"] / 1e6) < 0.0051 and abs(c["rows_m"] - rows_nb / 1e6) < 0.0051
            out["nobubble_log"] = c
            out["ok"] &= same
            say(f"nobubble    its run at cap {args.table_cap:,} printed {c['dense_m']:.2f} M dense, {c['rows_m']:.2f} M rows "
                f"({'matches' if same else 'DOES NOT match'} {pf['dense'] / 1e6:.2f} M, {rows_nb / 1e6:.2f} M incl. the item row)")
    say(f"parameters  {'the same model on both sides' if out['ok'] else 'MISMATCH: the two sides do not build the same model'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f)
    return 0 if out["ok"] else 1


# ------------------------------------------------------------------------------ nobubble results and the table

def collect_nobubble(args):
    """One result line for a nobubble run directory: the `ms` of its metrics.jsonl for the steps
    after the first --skip (steps count from 1), through the same throughput()."""
    path = os.path.join(args.collect_nobubble, "metrics.jsonl")
    rows = []
    try:
        with open(path) as f:
            for lineno, line in enumerate(f, 1):
                try:
                    r = json.loads(line)
                    rows.append((int(r["step"]), float(r["ms"]), float(r["loss"]), r.get("unique_rows")))
                except (ValueError, KeyError, TypeError):
                    fail(f"{path}:{lineno}: not a metrics line with step, ms and loss", "point it at a nobubble run directory")
    except OSError as e:
        fail(f"cannot read {path}: {e.strerror}", "point --collect-nobubble at a nobubble run directory")
    rows.sort()
    timed = [r for r in rows if r[0] > args.skip]
    if not timed:
        fail(f"{path}: {len(rows)} steps, none left after skipping {args.skip}", "run more --steps or lower --skip")
    uniq = [r[3] for r in timed if isinstance(r[3], (int, float))]
    rec = dict(engine="nobubble", impl=args.impl or "nobubble", batch=args.batch, table_cap=args.table_cap, steps=len(timed), warmup=args.skip,
               status="ok" if all(math.isfinite(r[2]) for r in rows) else "nonfinite loss",
               loss_first=round(rows[0][2], 5), loss_last=round(rows[-1][2], 5), device=args.device_name,
               unique_rows=round(statistics.fmean(uniq), 1) if uniq else None, commit=git_commit(),
               host=socket.gethostname(), date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    rec.update(throughput(args.batch, [r[1] for r in timed]))
    emit(args, rec)
    return 0


def fmt_rate(v):
    return f"{v:,.0f}" if v is not None else "-"


def print_table(rows, params_json=None):
    """Markdown: nobubble, the PyTorch modes, the MLPerf reference. ratio = the row's samples/s over
    the best PyTorch mode's (best by median; median and p90 ratios each), > 1: faster."""
    order = {"nobubble": 0, "torch-eager": 1, "torch-compile": 2, "torch-reduce-overhead": 3}
    rows = sorted(rows, key=lambda r: 0 if r.get("engine") == "nobubble" else order.get(r.get("impl"), 9))   # stable
    ok = [r for r in rows if r.get("engine") == "pytorch" and r.get("status") == "ok"]
    best = max(ok, key=lambda r: r["median_samples_per_s"]) if ok else None
    print("| impl | batch | median samples/s | p90 samples/s | vs best torch (median / p90) | unique rows / step | loss first -> last |")
    print("|---|---:|---:|---:|---:|---:|---|")
    nb_best = None
    for r in rows:
        if r.get("status") in ("ok", "nonfinite loss"):
            ratio = (f"{r['median_samples_per_s'] / best['median_samples_per_s']:.2f} / "
                     f"{r['p90_samples_per_s'] / best['p90_samples_per_s']:.2f}") if best else "-"
            if r is best:
                ratio += " (best)"
            loss = f"{r['loss_first']:.4f} -> {r['loss_last']:.4f}" + ("" if r["status"] == "ok" else " (nonfinite)")
            u = f"{r['unique_rows']:,.0f}" if r.get("unique_rows") else "-"
            print(f"| {r['impl']} | {r['batch']} | {fmt_rate(r['median_samples_per_s'])} | {fmt_rate(r['p90_samples_per_s'])} "
                  f"| {ratio} | {u} | {loss} |")
            if r.get("engine") == "nobubble" and r["status"] == "ok" and (nb_best is None or r["median_samples_per_s"] > nb_best["median_samples_per_s"]):
                nb_best = r
        else:
            why = (r.get("status", "?") + (f": {r['error']}" if r.get("error") else "")).replace("|", "/")
            print(f"| {r.get('impl')} | {r.get('batch', '-')} | {why} | - | - | - | - |")
    nb_ratio = f"nobubble / it: {nb_best['median_samples_per_s'] / MLPERF_REF['per_gpu']:.2f} (median)" if nb_best else "nobubble / it: -"
    print(f"| {MLPERF_REF['impl']} | 6912 | ~{MLPERF_REF['per_gpu']:,.0f} per GPU | - | {nb_ratio} | - | {MLPERF_REF['note']} |")
    dev = next((r.get("device") for r in rows if r.get("engine") == "pytorch" and r.get("device")), None) or \
        next((r.get("device") for r in rows if r.get("device")), "unknown")
    tv = next((r.get("torch") for r in rows if r.get("torch")), None)
    print(f"\ndevice {dev}; torch {tv or '-'}; table cap {next((r.get('table_cap') for r in rows if r.get('table_cap')), '-')}; "
          f"median samples/s = B / median step time, p90 = B / 90th-percentile step time (nearest rank); "
          f"PyTorch: {EMB_OPTIM_NOTE}; the MLPerf row is a published 8-GPU result divided by 8, not run here.")
    if params_json and os.path.exists(params_json):
        with open(params_json) as f:
            p = json.load(f)
        for line in p.get("lines", []):
            print(f"    {line}")


# ------------------------------------------------------------------------------ command line

def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="bench/README.md (dlrm-dcnv2 section) explains the numbers.")
    p.add_argument("--batch", type=int, default=6912, help="samples per step [6912: MLPerf's per-GPU batch]")
    p.add_argument("--steps", type=int, default=100, help="timed steps [100]")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps first [10]")
    p.add_argument("--mode", default="eager,compile,reduce-overhead", help="comma list of eager, compile, reduce-overhead")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16", help="bf16: fp32 weights + bf16 autocast [bf16]")
    p.add_argument("--table-cap", type=int, default=4000000, help="rows per table at most [4000000]")
    p.add_argument("--emb-dim", type=int, default=128)
    p.add_argument("--cross-rank", type=int, default=512)
    p.add_argument("--blocks", type=int, default=3, help="cross layers [3]")
    p.add_argument("--top", default="1024,1024,512,256", help="the OverArch's hidden widths (then one logit)")
    p.add_argument("--staged", type=int, default=16, help="distinct synthetic batches on the device, cycled [16]")
    p.add_argument("--zipf", type=float, default=1.05, help="Zipf exponent of the ids (nobubble synth's) [1.05]")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", help="append one JSON line per result to this file (--params: write the comparison)")
    p.add_argument("--deadline", type=float, default=0, help="Unix time after which no run starts")
    p.add_argument("--traceback", action="store_true")
    p.add_argument("--check-ref", action="store_true", help="the model against the float64 twin reference (CPU) and exit")
    p.add_argument("--ref", help="--check-ref: the reference file [tests/torch/ref/dlrm_tiny.safetensors]")
    p.add_argument("--params", action="store_true", help="compare the parameter counts and exit")
    p.add_argument("--nb-ckpt", help="--params: a nobubble run directory with a checkpoint (exact counts)")
    p.add_argument("--nb-ckpt-cap", type=int, default=1000, help="--params: the --table-cap of that run [1000]")
    p.add_argument("--nb-log", help="--params: a nobubble train log at --table-cap (its start line)")
    p.add_argument("--gpu-mem-gb", type=float, default=0, help="--params: the GPU's memory, to say whether it fits")
    p.add_argument("--collect-nobubble", metavar="RUN_DIR", help="a nobubble run's metrics.jsonl as a result line")
    p.add_argument("--skip", type=int, default=10, help="--collect-nobubble: warm-up steps left out [10]")
    p.add_argument("--impl", help="--collect-nobubble: the row's name [nobubble]")
    p.add_argument("--device-name", default="unknown", help="--collect-nobubble: device name to record")
    p.add_argument("--table", nargs="+", metavar="JSONL", help="print the markdown table of these files and exit")
    p.add_argument("--params-json", help="--table: print this --params comparison under the table")
    a = p.parse_args(argv)
    try:
        a.top = [int(x) for x in a.top.split(",")]
    except ValueError:
        fail(f"--top takes a comma list of widths, got '{a.top}'", "e.g. --top 1024,1024,512,256")
    if a.steps < 1 or a.warmup < 1 or a.batch < 1 or a.table_cap < 1 or a.staged < 1:
        fail("--steps, --warmup, --batch, --table-cap and --staged must be >= 1", "the first step always warms up")
    return a


def main(argv):
    args = parse_args(argv)
    if args.table:
        print_table(load_jsonl(args.table), args.params_json)
        return 0
    if args.collect_nobubble:
        return collect_nobubble(args)
    if args.params:
        return params(args)
    if args.check_ref:
        if torch is None:
            fail("PyTorch is not installed here", "use a python3 that has torch")
        return check_ref(args)
    return bench(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
