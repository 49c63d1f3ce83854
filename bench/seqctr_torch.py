#!/usr/bin/env python3
"""PyTorch anchor of nobubble's seqctr model (issue 4): the same model, written batched the way a
PyTorch user would write it, trained on the same samples (an NBSYNTH1 file from `nobubble
synth-dump`), timed per step, so that nobubble's seqctr throughput has a ratio next to it.

  python3 bench/seqctr_torch.py --data synth.bin --batch 4096 --steps 100 --mode eager,compile --json torch.jsonl
  python3 bench/seqctr_torch.py --collect-nobubble RUN_DIR --batch 4096 --skip 10 --json nobubble.jsonl  (no torch)
  python3 bench/seqctr_torch.py --table torch.jsonl nobubble.jsonl                                      (no torch)
  /usr/bin/python3 bench/seqctr_torch.py --device cpu --dtype fp32 --data small.bin --batch 64 --steps 5   (smoke)
  /usr/bin/python3 bench/seqctr_torch.py --check-ref     (the model against the float64 reference)

Throughput definitions (the same for every implementation, nobubble's included):
  p90 samples/s    = B / (90th percentile of the timed step times): the throughput that 90% of
                     the timed steps reach or beat. Nearest rank: with the n timed step times
                     sorted, t_0 <= .. <= t_{n-1}, the 90th percentile is t_{ceil(0.9 n) - 1}
                     (the rule nobubble's trainer uses for the "throughput" line it prints).
  median samples/s = B / t_{floor(n / 2)} (the upper of the two middle times when n is even, as
                     the trainer).
Step times: --warmup untimed steps first (default 10, as the benchmark skips nobubble's first 10),
then --steps timed steps with one CUDA event at every step boundary and no host sync added inside
the loop (on the CPU: the host clock).

The model (the issue's spec; tests/torch/seqctr_ref.py is its per-sample float64 reference):
  bottom MLP 13 -> 512 -> 256 -> E; 26 categorical tables and one item table (target and history),
  all rows of all tables in ONE nn.Embedding(total_rows + 1, E, sparse=True) with per-table row
  offsets, row = id mod rows_t; the extra last row is padding_idx (history padding: no gradient);
  history: padded to [B, L_batch] (L_batch = the batch's longest history rounded up to a multiple
  of 32, at most max_len) with a key-padding mask; one pre-norm encoder layer (4 heads,
  F.scaled_dot_product_attention with a boolean mask, ReLU MLP E -> 4E -> E); target attention
  softmax(q.k_j / sqrt(E)) over the valid j (SDPA, one head), zero for an empty history;
  x0 = [bottom | 26 cat | target | pooled] (29E); 6 blocks c = x0 * (U (V^T x) + b) + x (rank 256),
  x = c + W2 relu(W1 c + b1) + b2 (hidden 512); loss = mean BCE of the last block's logit (the other
  heads only with --aux-weight > 0). Init as nobubble's: weights normal(0, 1/sqrt(fan_in)), U
  scaled by 0.1, biases 0, LayerNorm 1/0, embeddings normal(0, 0.05).
  Optimizers: fused AdamW (lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0: nobubble train's
  defaults) on the dense parameters; torch.optim.Adagrad (lr 0.05, eps 1e-8) on the sparse
  embedding gradient. torch's Adagrad is ELEMENT-wise (one accumulator per weight); nobubble's is
  ROW-wise (one per row, the mean of the squared row gradient): the update differs, and torch's
  optimizer state is E times larger.
  Precision: fp32 weights, bf16 autocast (--dtype fp32: no autocast). Modes: eager, and compile =
  torch.compile(dynamic=False) of the dense part (everything after the embedding lookup; the
  sparse lookup and the optimizers stay eager). A mode that fails is reported in one line and the
  next one runs.
All batches the run needs (warm-up + timed, batch k = samples k*B .. k*B + B - 1 of the file, the
samples nobubble's step k trains on) are built and copied to the device before timing: the input
pipeline is not measured. If the file holds fewer batches, they are cycled through.
"""
import argparse
import contextlib
import datetime
import importlib
import json
import math
import os
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
except ModuleNotFoundError:  # --collect-nobubble and --table run without torch
    torch = nn = F = None
    _Module = object

NDENSE, NCAT = 13, 26
MAGIC, VERSION, HEADER = b"NBSYNTH1", 1, 1024
L_BUCKET = 32           # padded history lengths are multiples of this: few distinct shapes to compile
MODES = ("eager", "compile")
EMB_OPTIM_NOTE = "torch.optim.Adagrad: element-wise accumulators (nobubble: row-wise)"


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# the timing and run helpers of the transformer anchor (import-safe without torch)
from torch_anchor import check_cuda, git_commit, is_oom, load_jsonl, release_memory, sync, warm_and_time  # noqa: E402,F401


def fail(msg, hint):
    print(f"seqctr_torch: error: {msg} (hint: {hint})", file=sys.stderr)
    sys.exit(2)


def throughput(B, ms):
    """The two numbers every implementation reports, from its timed step times in ms (nearest
    rank, as src/run/sc_family.c's summary and src/run/step_stats.c)."""
    s = sorted(ms)
    p90, med = s[math.ceil(0.9 * len(s)) - 1], s[len(s) // 2]
    return dict(p90_samples_per_s=round(B / (p90 / 1e3), 1), median_samples_per_s=round(B / (med / 1e3), 1),
                ms_p90=round(p90, 4), ms_median=round(med, 4), ms_min=round(min(ms), 4), ms_max=round(max(ms), 4))


# ------------------------------------------------------------------------------ the dump file

def read_dump(path):
    """An NBSYNTH1 file (layout: tools/cmd_synth_dump.c), validated, as numpy arrays."""
    import numpy as np
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            h = f.read(HEADER)
    except OSError as e:
        fail(f"cannot read {path}: {e.strerror}", "write it with 'nobubble synth-dump --out FILE'")
    hint = "write the file again with 'nobubble synth-dump'"
    if len(h) < HEADER or h[:8] != MAGIC:
        fail(f"{path} is not an NBSYNTH1 file (magic {h[:8]!r})", hint)
    version, hbytes, n, first, total, L, nd, nc = struct.unpack_from("<IIQQQIII", h, 8)
    if version != VERSION or hbytes != HEADER or nd != NDENSE or nc != NCAT:
        fail(f"{path}: version {version}, header {hbytes} bytes, {nd} dense / {nc} categorical; this script reads "
             f"version {VERSION}, {HEADER}, {NDENSE} / {NCAT}", hint)
    table_cap, = struct.unpack_from("<Q", h, 56)
    cat_rows = list(struct.unpack_from("<26Q", h, 64))
    item_rows, = struct.unpack_from("<Q", h, 272)
    items, seed, fbytes = struct.unpack_from("<3Q", h, 488)
    off = struct.unpack_from("<7Q", h, 512)
    spec = h[576:].split(b"\0")[0].decode(errors="replace")
    if fbytes != size:
        fail(f"{path}: the header says {fbytes} bytes, the file has {size} (truncated?)", hint)
    sizes = [52 * n, 104 * n, 4 * n, 4 * n, 8 * (n + 1), 4 * total, 4 * n]
    for k in range(7):
        if off[k] % 8 or off[k] + sizes[k] > size or (k and off[k] < off[k - 1] + sizes[k - 1]):
            fail(f"{path}: array {k} at byte {off[k]} does not fit the layout", hint)
    if n < 1 or min(cat_rows) < 1 or item_rows < 1:
        fail(f"{path}: {n} samples, table rows {min(cat_rows)} / {item_rows}", hint)

    def arr(k, dtype, count):
        return np.fromfile(path, dtype=dtype, count=count, offset=off[k])

    d = dict(path=path, n=n, first=first, total=total, max_len=L, table_cap=table_cap, cat_rows=cat_rows,
             item_rows=item_rows, items=items, seed=seed, spec=spec,
             dense=arr(0, "<f4", n * NDENSE).reshape(n, NDENSE), cat=arr(1, "<u4", n * NCAT).reshape(n, NCAT),
             target=arr(2, "<u4", n), hist_len=arr(3, "<i4", n), hist_off=arr(4, "<i8", n + 1),
             hist=arr(5, "<u4", total), label=arr(6, "<f4", n))
    if d["hist_off"][0] != 0 or d["hist_off"][-1] != total or (np.diff(d["hist_off"]) != d["hist_len"]).any():
        fail(f"{path}: history offsets disagree with the lengths", hint)
    if d["hist_len"].min() < 0 or d["hist_len"].max() > L:
        fail(f"{path}: a history length is outside 0..{L}", hint)
    return d


def global_rows(d):
    """Row offsets of the tables in the one embedding: categorical 0..25, then items, then the
    padding row. Returns (cat rows [n, 26], target rows [n], history rows [total], pad row)."""
    import numpy as np
    rows = np.array(d["cat_rows"], dtype=np.int64)
    cat_off = np.concatenate([[0], np.cumsum(rows)[:-1]])
    item_off = int(rows.sum())
    pad = item_off + d["item_rows"]
    cat = d["cat"].astype(np.int64) % rows + cat_off
    tgt = d["target"].astype(np.int64) % d["item_rows"] + item_off
    hist = d["hist"].astype(np.int64) % d["item_rows"] + item_off
    return cat, tgt, hist, pad


def padded_len(m, max_len):
    return max(1, min(max(max_len, 1), -(-max(m, 1) // L_BUCKET) * L_BUCKET))


def stage_batches(d, rows, B, count, device):
    """Batches 0..count-1 (batch k = samples k*B ..), built on the host and copied to the device.
    idx [B, 27 + Lb]: 26 categorical rows, the target row, the padded history (pad row after the
    valid items); valid [B, 1, 1, Lb] the key mask, with position 0 switched on for an empty
    history so that no softmax row is all masked (its result is multiplied by has_hist = 0)."""
    import numpy as np
    cat, tgt, hist, pad = rows
    out = []
    for k in range(count):
        s, e = k * B, (k + 1) * B
        lens = d["hist_len"][s:e].astype(np.int64)
        Lb = padded_len(int(lens.max()), d["max_len"])
        mask = np.arange(Lb)[None, :] < lens[:, None]
        ph = np.full((B, Lb), pad, dtype=np.int64)
        ph[mask] = hist[d["hist_off"][s]:d["hist_off"][e]]   # row-major: sample by sample, in order
        idx = np.concatenate([cat[s:e], tgt[s:e, None], ph], axis=1)
        valid = mask.copy()
        valid[lens == 0, 0] = True
        out.append(dict(
            Lb=Lb, fill=float(lens.mean()) / Lb,
            idx=torch.from_numpy(idx).to(device),
            dense=torch.from_numpy(np.ascontiguousarray(d["dense"][s:e])).to(device),
            valid=torch.from_numpy(valid).view(B, 1, 1, Lb).to(device),
            has=torch.from_numpy((lens > 0).astype(np.float32)).view(B, 1).to(device),
            label=torch.from_numpy(np.ascontiguousarray(d["label"][s:e])).to(device)))
    return out


# ------------------------------------------------------------------------------ the model

def attend(q, k, v, valid):
    """Attention with a boolean key mask (True = attend). Every row has a True (see stage_batches)."""
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=valid)
    # Only for the CPU smoke check on an old torch (Debian's 1.13 has no SDPA): the GPU runs
    # refuse to start without it (check_cuda).
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    s = s.masked_fill(~valid, float("-inf"))
    return torch.softmax(s.to(torch.promote_types(s.dtype, torch.float32)), dim=-1).to(v.dtype) @ v


class EncoderLayer(_Module):
    """Pre-norm: h += proj(attn(qkv(LN1 h))); h += fc2(relu(fc1(LN2 h))). qkv rows are q|k|v, head
    i = rows i*E/heads .. (nobubble's hist.{l}.qkv layout)."""

    def __init__(self, E, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(E), nn.LayerNorm(E)
        self.qkv, self.proj = nn.Linear(E, 3 * E), nn.Linear(E, E)
        self.fc1, self.fc2 = nn.Linear(E, 4 * E), nn.Linear(4 * E, E)

    def forward(self, h, valid):
        B, L, E = h.shape
        q, k, v = self.qkv(self.ln1(h)).view(B, L, 3, self.heads, E // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        h = h + self.proj(attend(q, k, v, valid).transpose(1, 2).reshape(B, L, E))
        return h + self.fc2(F.relu(self.fc1(self.ln2(h))))


class CrossBlock(_Module):
    """c = x0 * (U (V^T x) + b) + x; x' = c + W2 relu(W1 c + b1) + b2; U, V stored [D0, r]."""

    def __init__(self, D0, rank, hidden):
        super().__init__()
        self.U = nn.Parameter(torch.empty(D0, rank))
        self.V = nn.Parameter(torch.empty(D0, rank))
        self.b = nn.Parameter(torch.zeros(D0))
        self.fc1, self.fc2 = nn.Linear(D0, hidden), nn.Linear(hidden, D0)
        self.head = nn.Linear(D0, 1)

    def forward(self, x0, x):
        c = x0 * ((x @ self.V) @ self.U.t() + self.b) + x
        return c + self.fc2(F.relu(self.fc1(c)))


class SeqCTRDense(_Module):
    """Everything after the embedding lookup: e = emb(idx) is [B, 27 + Lb, E] (26 categorical
    rows, the target, the padded history). This is the part torch.compile compiles."""

    def __init__(self, E, heads, hist_layers, blocks, rank, hidden, aux_weight):
        super().__init__()
        self.E, self.aux_weight = E, aux_weight
        self.bottom = nn.Sequential(nn.Linear(NDENSE, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, E))
        self.hist = nn.ModuleList(EncoderLayer(E, heads) for _ in range(hist_layers))
        self.wq = nn.Linear(E, E, bias=False)
        self.wkv = nn.Linear(E, 2 * E, bias=False)   # target.wk and target.wv, fused (as nobubble)
        D0 = (NCAT + 3) * E
        self.blocks = nn.ModuleList(CrossBlock(D0, rank, hidden) for _ in range(blocks))

    def forward(self, dense, e, valid, has, label):
        B, E = dense.shape[0], self.E
        bot = self.bottom(dense)
        t = e[:, NCAT]
        h = e[:, NCAT + 1:]
        for layer in self.hist:
            h = layer(h, valid)
        k, v = self.wkv(h).split(E, dim=-1)
        pooled = attend(self.wq(t)[:, None, None, :], k[:, None], v[:, None], valid).reshape(B, E) * has
        x0 = torch.cat([bot, e[:, :NCAT].reshape(B, NCAT * E), t, pooled], dim=1)
        x, loss = x0, 0.0
        for i, blk in enumerate(self.blocks):
            x = blk(x0, x)
            last = i == len(self.blocks) - 1
            if last or self.aux_weight > 0:
                z = blk.head(x).squeeze(1)   # the loss in fp32 under autocast (fp64 stays fp64: the reference check)
                bce = F.binary_cross_entropy_with_logits(z if z.dtype == torch.float64 else z.float(), label)
                loss = loss + (bce if last else self.aux_weight * bce)
        return loss


def init_like_nobubble(model):
    """seqctr.c's init: [out, in] weights normal(0, 1/sqrt(in)); U (maps r -> D0) fan-in r and
    scaled by 0.1, V (D0 -> r) fan-in D0; biases 0; LayerNorm weight 1."""
    for name, p in model.named_parameters():
        with torch.no_grad():
            if name.endswith(".U"):
                p.normal_(0.0, 0.1 / math.sqrt(p.shape[1]))
            elif name.endswith(".V"):
                p.normal_(0.0, 1.0 / math.sqrt(p.shape[0]))
            elif p.dim() == 2:
                p.normal_(0.0, 1.0 / math.sqrt(p.shape[1]))
            elif ".ln" in name and name.endswith("weight"):
                p.fill_(1.0)
            else:
                p.zero_()


# ------------------------------------------------------------------------------ one timed run

def train_and_time(args, d, batches, mode, B):
    cuda = args.device == "cuda"
    dev = torch.device(args.device)
    torch.manual_seed(args.seed)
    total_rows = sum(d["cat_rows"]) + d["item_rows"]
    emb = nn.Embedding(total_rows + 1, args.emb_dim, padding_idx=total_rows, sparse=True, device=dev)
    with torch.no_grad():
        emb.weight.normal_(0.0, 0.05)
        emb.weight[total_rows].zero_()
    model = SeqCTRDense(args.emb_dim, args.heads, args.hist_layers, args.blocks, args.cross_rank,
                        args.block_hidden, args.aux_weight).to(dev)
    init_like_nobubble(model)
    model.train()
    dense_params, opts = optimizers(args, model, emb, cuda)
    if mode == "eager":
        fwd = model
    else:
        if not hasattr(torch, "compile"):
            raise RuntimeError(f"torch {torch.__version__} has no torch.compile")
        dynamo_config = importlib.import_module("torch._dynamo").config
        for knob in ("cache_size_limit", "recompile_limit"):   # one graph per padded length: allow many
            if hasattr(dynamo_config, knob):
                setattr(dynamo_config, knob, max(getattr(dynamo_config, knob), 64))
        fwd = torch.compile(model, dynamic=False)
    autocast = bf16_autocast(args)

    def fwd_bwd(bt):
        with autocast:
            loss = fwd(bt["dense"], emb(bt["idx"]), bt["valid"], bt["has"], bt["label"])
        loss.backward()
        return loss

    return train_timed(args, dev, B, batches, fwd_bwd, opts, dense_params, total_rows)


def optimizers(args, model, emb, cuda):
    """nobubble's optimizers: AdamW on the dense parameters (fused on CUDA, foreach on the CPU),
    Adagrad on the rows."""
    dense_params = list(model.parameters())
    opt = torch.optim.AdamW(dense_params, lr=args.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=args.weight_decay,
                            **({"fused": True} if cuda else {"foreach": True}))
    opt_emb = torch.optim.Adagrad([emb.weight], lr=args.emb_lr, eps=1e-8, foreach=False)
    return dense_params, (opt, opt_emb)


def bf16_autocast(args):
    return (torch.autocast(device_type=args.device, dtype=torch.bfloat16) if args.dtype == "bf16"
            else contextlib.nullcontext())


def train_timed(args, dev, B, batches, fwd_bwd, opts, dense_params, total_rows):
    """fwd_bwd and the optimizers' step over the batches, timed by time_steps' rule; the result
    with the model's sizes."""
    warmup, steps = args.warmup, args.steps
    losses = torch.zeros(warmup + steps, device=dev)

    def step(i):
        loss = fwd_bwd(batches[i % len(batches)])
        for o in opts:
            o.step()
        for o in opts:
            o.zero_grad(set_to_none=True)
        losses[i].copy_(loss.detach())

    return dict(time_steps(dev.type == "cuda", B, batches, warmup, steps, step, fwd_bwd, opts, losses),
                dense_params=sum(p.numel() for p in dense_params), emb_rows=total_rows)


class OverBudget(Exception):
    """--deadline passed while a run was stepping: the run stops there (its estimate was short)."""


DEADLINE = 0.0  # --deadline, for the step loops (run_guarded checks the estimate before a run starts)


def check_deadline():
    if DEADLINE and time.time() > DEADLINE:
        raise OverBudget("the --deadline passed during the run")


def time_steps(cuda, B, batches, warmup, steps, step, fwd_bwd, opts, losses):
    """The timing rule every PyTorch configuration follows: step(0) alone (first_step_s), the rest
    of the warm-up, then one forward + backward for each padded length the timed steps meet that
    the warm-up did not (no optimizer step, gradients dropped), so no compilation lands inside the
    timed loop; then `steps` steps timed back to back. step(i) trains on batch i, writes losses[i]."""
    seen = {batches[i % len(batches)]["Lb"] for i in range(warmup)}
    extra = {}
    for i in range(warmup, warmup + steps):
        bt = batches[i % len(batches)]
        if bt["Lb"] not in seen and bt["Lb"] not in extra:
            extra[bt["Lb"]] = bt

    def warm_lengths():
        for bt in extra.values():
            fwd_bwd(bt)
            for o in opts:
                o.zero_grad(set_to_none=True)

    ms, first_step_s, warmup_s, _ = warm_and_time(cuda, step, warmup, steps, warm_lengths, check_deadline)
    lossv = losses.tolist()
    med = statistics.median(ms)
    timed = [batches[i % len(batches)] for i in range(warmup, warmup + steps)]
    return dict(throughput(B, ms), status="ok" if all(math.isfinite(v) for v in lossv) else "nonfinite loss",
                loss_first=round(lossv[0], 5), loss_last=round(lossv[-1], 5),
                compile_s=round(max(0.0, warmup_s - (warmup + len(extra)) * med / 1e3), 2),
                first_step_s=round(first_step_s, 2), shape_warmups=len(extra),
                L_batch_mean=round(statistics.fmean(b["Lb"] for b in timed), 1),
                hist_fill=round(statistics.fmean(b["fill"] for b in timed), 4),
                peak_mem_gb=round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None)


def est_cost_s(mode, steps):
    """A rough guess of a run's wall time, only to skip runs that would cross --deadline."""
    return {"eager": 20, "compile": 120}[mode] + steps * 0.3


def run_guarded(args, rec, est_s, train):
    """rec updated with train()'s result, or with why there is none: skipped when it would cross
    --deadline, OOM, or the error (one failing configuration must not stop the others)."""
    if args.deadline and time.time() + est_s > args.deadline:
        rec["status"] = "skipped (time budget)"
        return rec
    try:
        rec.update(train())
    except OverBudget:
        rec["status"] = "stopped (time budget)"
    except Exception as e:
        if is_oom(e):
            rec["status"] = "OOM"
        else:
            rec["status"] = "error"
            msg = str(e).strip().splitlines()
            rec["error"] = f"{type(e).__name__}: {msg[0][:300] if msg else ''}"
            if args.traceback:
                traceback.print_exc()
    finally:
        release_memory()
    return rec


def run_mode(args, meta, d, batches, mode, B):
    rec = dict(meta, impl=f"torch-{mode}", batch=B, steps=args.steps, warmup=args.warmup,
               date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    return run_guarded(args, rec, est_cost_s(mode, args.warmup + args.steps),
                       lambda: train_and_time(args, d, batches, mode, B))


def describe(r):
    head = f"{r['impl']} B={r['batch']}"
    if r.get("status") not in ("ok", "nonfinite loss"):
        return f"{head}: {r.get('status')}" + (f": {r['error']}" if r.get("error") else "")
    extra = f", compile {r['compile_s']:.1f} s" if "compile_s" in r else ""
    extra += f", peak {r['peak_mem_gb']} GiB" if r.get("peak_mem_gb") is not None else ""
    extra += f", history fill {100 * r['hist_fill']:.1f}% of L_batch {r['L_batch_mean']:g}" if "hist_fill" in r else ""
    return (f"{head}: p90 {r['p90_samples_per_s']:,.0f} samples/s ({r['ms_p90']:.2f} ms), median "
            f"{r['median_samples_per_s']:,.0f} ({r['ms_median']:.2f} ms) over {r['steps']} steps{extra}, "
            f"loss {r['loss_first']:.4f} -> {r['loss_last']:.4f}" + ("" if r["status"] == "ok" else "  NONFINITE LOSS"))


def emit(args, rec, extra_keys=()):
    """The description, then the result's JSON line on stdout (every field with --json FILE)."""
    print(describe(rec), flush=True)
    keys = ["impl", *extra_keys, "batch", "steps", "p90_samples_per_s", "median_samples_per_s", "loss_first", "loss_last"]
    if rec.get("status") != "ok":
        keys += ["status", "error"]
    print(json.dumps({k: rec.get(k) for k in keys if k in rec}), flush=True)
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps(rec) + "\n")


def check_shapes(args):
    """--emb-dim against --heads, and --batch as a list of sizes (returned)."""
    if args.emb_dim % args.heads:
        fail(f"--emb-dim {args.emb_dim} is not a multiple of --heads {args.heads}", "use a multiple")
    try:
        batch_sizes = [int(b) for b in args.batch.split(",")]
    except ValueError:
        fail(f"--batch takes a comma list of integers, got '{args.batch}'", "e.g. --batch 4096 or 1024,4096")
    if min(batch_sizes) < 1:
        fail("--batch sizes must be >= 1", "e.g. --batch 4096")
    return batch_sizes


def load_data(args):
    """The dump, its global row offsets, the fields every result line carries, and the read time."""
    t0 = time.perf_counter()
    d = read_dump(args.data)
    rows = global_rows(d)
    meta = dict(engine="pytorch", torch=torch.__version__, cuda=torch.version.cuda,
                device=torch.cuda.get_device_name() if args.device == "cuda" else "cpu", dtype=args.dtype,
                host=socket.gethostname(), commit=git_commit(), data=d["spec"], E=args.emb_dim,
                max_len=d["max_len"], table_cap=d["table_cap"], emb_optim=EMB_OPTIM_NOTE)
    return d, rows, meta, time.perf_counter() - t0


def print_data(d, read_s):
    print(f"data: {d['path']}: {d['spec']}, samples {d['first']}..{d['first'] + d['n'] - 1}, mean history "
          f"{d['total'] / d['n']:.2f} of max_len {d['max_len']}, table_cap {d['table_cap']} (read in "
          f"{read_s:.1f} s)", flush=True)


def stage_for(args, d, rows, B):
    """The batches of size B the run needs (--warmup + --steps, cycled when the file is short),
    staged on the device."""
    need = args.warmup + args.steps
    have = d["n"] // B
    if have < 1:
        fail(f"{d['path']} holds {d['n']} samples, not one batch of {B}", "dump more samples or lower --batch")
    if have < need:
        print(f"note: the file holds {have} batches of {B}, the run takes {need}: batches are cycled "
              f"(nobubble trains on new samples every step)", flush=True)
    t1 = time.perf_counter()
    batches = stage_batches(d, rows, B, min(have, need), args.device)
    sync(args.device == "cuda")
    print(f"B={B}: {len(batches)} batches on the {args.device} in {time.perf_counter() - t1:.1f} s "
          f"(padded lengths {sorted({b['Lb'] for b in batches})})", flush=True)
    return batches


def bench(args):
    if torch is None:
        fail("PyTorch is not installed here", "run on the GPU machine (its python3 has torch)")
    if not args.data:
        fail("--data FILE is required", "write one with 'nobubble synth-dump --samples N --out FILE'")
    if args.device == "cuda":
        check_cuda()
    modes = args.mode.split(",")
    for m in modes:
        if m not in MODES:
            fail(f"unknown mode '{m}'", "use eager, compile or eager,compile")
    batch_sizes = check_shapes(args)
    if args.device == "cpu":
        torch.set_num_threads(os.cpu_count())   # Debian's torch 1.13 starts with one thread
    d, rows, meta, read_s = load_data(args)
    print(f"torch {meta['torch']} (CUDA {meta['cuda']}) on {meta['device']} ({torch.get_num_threads()} threads); "
          f"{'fp32 weights + bf16 autocast' if args.dtype == 'bf16' else 'fp32'}; "
          f"{'fused' if args.device == 'cuda' else 'foreach'} AdamW on the dense part; {EMB_OPTIM_NOTE} on one "
          f"nn.Embedding({sum(d['cat_rows']) + d['item_rows'] + 1}, {args.emb_dim}, sparse=True)", flush=True)
    print_data(d, read_s)
    status = 0
    for B in batch_sizes:
        batches = stage_for(args, d, rows, B)
        for mode in modes:
            rec = run_mode(args, meta, d, batches, mode, B)
            emit(args, rec)
            if rec["status"] in ("error", "nonfinite loss"):
                status = 1
        del batches
        release_memory()
    return status


# ------------------------------------------------------------------------------ check against the reference

def check_ref():
    """This batched model against tests/torch/seqctr_ref.py, the per-sample float64 reference of
    the spec, on its batch (empty and full histories, repeated rows, aux heads): the loss and every
    dense and embedding gradient of step 0, in float64, through this file's own staging (dump
    layout -> padded batch). Runs on the CPU in a second; exit 1 when an error exceeds 1e-12."""
    import numpy as np
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "torch"))
    import seqctr_ref as R
    torch.manual_seed(0)
    rng = np.random.default_rng(1234)
    c = R.CFG
    w = R.make_weights(c, rng)
    batch = R.make_batch(c, rng)
    ref = R.run(c, w, batch, torch.float64)
    E, B = c["E"], R.B
    m = SeqCTRDense(E, c["heads"], c["hist_layers"], c["blocks"], c["cross_rank"], c["block_hidden"], c["aux_weight"]).double()
    names = {}   # reference name -> (this model's parameter, row slice or None)
    for i, j in zip(range(3), (0, 2, 4)):
        for k in ("weight", "bias"):
            names[f"bottom.{i}.{k}"] = (f"bottom.{j}.{k}", None)
    for n in ("ln1", "qkv", "proj", "ln2", "fc1", "fc2"):
        for k in ("weight", "bias"):
            names[f"hist.0.{n}.{k}"] = (f"hist.0.{n}.{k}", None)
    names.update({"target.wq": ("wq.weight", None), "target.wk": ("wkv.weight", slice(0, E)),
                  "target.wv": ("wkv.weight", slice(E, 2 * E))})
    for i in range(c["blocks"]):
        for rn, mn in (("U", "U"), ("V", "V"), ("b", "b"), ("w1", "fc1.weight"), ("b1", "fc1.bias"),
                       ("w2", "fc2.weight"), ("b2", "fc2.bias"), ("head.w", "head.weight"), ("head.b", "head.bias")):
            names[f"block.{i}.{rn}"] = (f"blocks.{i}.{mn}", None)
    P = dict(m.named_parameters())
    with torch.no_grad():
        for rn, (mn, sl) in names.items():
            (P[mn] if sl is None else P[mn][sl]).copy_(torch.tensor(w[rn], dtype=torch.float64).view_as(P[mn] if sl is None else P[mn][sl]))
    lens = batch["hist_len"].astype(np.int32)
    d = dict(dense=batch["dense"], cat=batch["cat"], target=batch["target"], hist_len=lens, label=batch["label"],
             hist_off=np.concatenate([[0], np.cumsum(lens)]).astype(np.int64), n=B, max_len=c["max_len"],
             hist=np.concatenate([batch["hist"][b, :lens[b]] for b in range(B)]).astype(np.uint32),
             cat_rows=R.CAT_ROWS, item_rows=R.ITEM_ROWS)
    bt = stage_batches(d, global_rows(d), B, 1, "cpu")[0]
    total = sum(R.CAT_ROWS) + R.ITEM_ROWS
    emb = nn.Embedding(total + 1, E, padding_idx=total, sparse=True).double()
    with torch.no_grad():
        emb.weight[:total].copy_(torch.tensor(np.concatenate([w[n] for n in R.table_names()])))
        emb.weight[total].zero_()
    loss = m(bt["dense"].double(), emb(bt["idx"]), bt["valid"], bt["has"].double(), bt["label"].double())
    loss.backward()

    def rel(a, b):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))

    errs = {"loss": rel(loss.item(), ref["loss"])}
    for rn, (mn, sl) in names.items():
        g = P[mn].grad if sl is None else P[mn].grad[sl]
        errs[rn] = rel(g.reshape(ref["g"][rn].shape).numpy(), ref["g"][rn])
    ge = emb.weight.grad.coalesce().to_dense()
    errs["embedding rows"] = rel(ge[ref["touched"]].numpy(), ref["g.emb"])
    others = np.setdiff1d(np.arange(total + 1), ref["touched"])
    errs["untouched rows and padding (norm)"] = float(ge[others].norm())
    worst = max(errs, key=errs.get)
    print(f"seqctr_torch vs tests/torch/seqctr_ref.py (float64, B={B}, aux_weight {c['aux_weight']}): loss "
          f"{loss.item():.12f} vs {ref['loss']:.12f}; worst of {len(errs)} relative errors: {worst} {errs[worst]:.2e}")
    return 0 if errs[worst] <= 1e-12 else 1


# ------------------------------------------------------------------------------ nobubble results and the table

def collect_nobubble(args):
    """One result line for a nobubble run directory: its metrics.jsonl step times ("ms") after the
    first --skip steps, through the same throughput() as the PyTorch runs."""
    if not args.batch or "," in args.batch:
        fail("--collect-nobubble needs one --batch B", "give the batch the run used")
    B = int(args.batch)
    path = os.path.join(args.collect_nobubble, "metrics.jsonl")
    rows = []
    try:
        with open(path) as f:
            for lineno, line in enumerate(f, 1):
                try:
                    r = json.loads(line)
                    rows.append((int(r["step"]), float(r["ms"]), float(r["loss"])))
                except (ValueError, KeyError, TypeError):
                    fail(f"{path}:{lineno}: not a metrics line with step, ms and loss", "point --collect-nobubble at a nobubble run directory")
    except OSError as e:
        fail(f"cannot read {path}: {e.strerror}", "point --collect-nobubble at a nobubble run directory")
    rows.sort()
    timed = [ms for step, ms, _ in rows if step >= args.skip]
    if not timed:
        fail(f"{path}: {len(rows)} steps, none left after skipping {args.skip}", "run more --steps or lower --skip")
    rec = dict(engine="nobubble", impl="nobubble", batch=B, steps=len(timed), warmup=args.skip, status="ok",
               loss_first=round(rows[0][2], 5), loss_last=round(rows[-1][2], 5), device=args.device_name,
               commit=git_commit(), host=socket.gethostname(),
               date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    rec.update(throughput(B, timed))
    emit(args, rec)
    return 0


def print_table(rows):
    """Markdown: every result; ratio = its p90 samples/s over the best PyTorch mode's p90 samples/s
    at the same batch (> 1: faster than the best PyTorch mode)."""
    order = {"nobubble": 0, "torch-eager": 1, "torch-compile": 2}
    rows = sorted(rows, key=lambda r: (r.get("batch", 0), order.get(r.get("impl"), 9)))
    best = {}
    for r in rows:
        if r.get("engine") == "pytorch" and r.get("status") == "ok":
            best[r["batch"]] = max(best.get(r["batch"], 0), r["p90_samples_per_s"])
    print("| impl | batch | p90 samples/s | median samples/s | ratio vs best torch (p90) | loss first -> last |")
    print("|---|---:|---:|---:|---:|---|")
    if not rows:
        print("| (no results) | | | | | |")
    for r in rows:
        if r.get("status") in ("ok", "nonfinite loss"):
            b = best.get(r["batch"])
            ratio = f"{r['p90_samples_per_s'] / b:.2f}" if b else "-"
            loss = f"{r['loss_first']:.4f} -> {r['loss_last']:.4f}" + ("" if r["status"] == "ok" else " (nonfinite)")
            print(f"| {r['impl']} | {r['batch']} | {r['p90_samples_per_s']:,.0f} | {r['median_samples_per_s']:,.0f} "
                  f"| {ratio} | {loss} |")
        else:
            why = r.get("status", "?") + (f": {r['error']}" if r.get("error") else "")
            print(f"| {r.get('impl')} | {r.get('batch')} | {why.replace('|', '/')} | - | - | - |")
    dev = next((r.get("device") for r in rows if r.get("engine") == "pytorch"), None)
    if dev:
        tv = next((r.get("torch") for r in rows if r.get("torch")), None)
        print(f"\np90 samples/s = B / 90th-percentile step time (the rate 90% of timed steps reach); device {dev}; "
              f"torch {tv}; {EMB_OPTIM_NOTE}")


# ------------------------------------------------------------------------------ command line

def add_shape_args(p):
    """The model's shape (nobubble's seqctr defaults), shared with erase_torch.py."""
    p.add_argument("--emb-dim", type=int, default=64, help="E [64]")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--hist-layers", type=int, default=1)
    p.add_argument("--blocks", type=int, default=6)
    p.add_argument("--cross-rank", type=int, default=256)
    p.add_argument("--block-hidden", type=int, default=512)


def add_optim_args(p):
    """The optimizers' settings and the seed, shared with erase_torch.py."""
    p.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate [1e-3]")
    p.add_argument("--weight-decay", type=float, default=0.0, help="AdamW weight decay [0]")
    p.add_argument("--emb-lr", type=float, default=0.05, help="Adagrad learning rate [0.05]")
    p.add_argument("--seed", type=int, default=1)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="bench/README.md (seqctr section) explains the numbers.")
    p.add_argument("--data", help="NBSYNTH1 file from 'nobubble synth-dump'")
    p.add_argument("--batch", default="4096", help="comma list of batch sizes [4096]")
    p.add_argument("--steps", type=int, default=100, help="timed steps [100]")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps first [10]")
    p.add_argument("--mode", default="eager,compile", help="eager, compile or eager,compile [eager,compile]")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: the CPU anchor (fp32, every core; Debian's torch 1.13: eager only)")
    p.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16", help="bf16: fp32 weights + bf16 autocast [bf16]")
    add_shape_args(p)
    p.add_argument("--aux-weight", type=float, default=0.0, help="weight of the other blocks' BCE heads [0]")
    add_optim_args(p)
    p.add_argument("--json", help="append one JSON line per result (all fields) to this file")
    p.add_argument("--deadline", type=float, default=0, help="Unix time after which no run starts")
    p.add_argument("--traceback", action="store_true", help="print the full traceback of a failing mode")
    p.add_argument("--table", nargs="+", metavar="JSONL", help="print the markdown table of these files and exit")
    p.add_argument("--collect-nobubble", metavar="RUN_DIR", help="turn a nobubble run's metrics.jsonl into a result line")
    p.add_argument("--skip", type=int, default=10, help="--collect-nobubble: warm-up steps left out [10]")
    p.add_argument("--device-name", default="unknown", help="--collect-nobubble: device name to record")
    p.add_argument("--check-ref", action="store_true", help="check the model against tests/torch/seqctr_ref.py (float64, CPU) and exit")
    a = p.parse_args(argv)
    if a.steps < 1 or a.warmup < 1 or a.skip < 0:
        fail("--steps and --warmup must be >= 1, --skip >= 0", "the first step is always a warm-up (it compiles)")
    return a


def main(argv):
    args = parse_args(argv)
    global DEADLINE
    DEADLINE = args.deadline
    if args.table:
        print_table(load_jsonl(args.table))
        return 0
    if args.collect_nobubble:
        return collect_nobubble(args)
    if args.check_ref:
        if torch is None:
            fail("PyTorch is not installed here", "use a python3 that has torch (Debian's: /usr/bin/python3)")
        return check_ref()
    return bench(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
