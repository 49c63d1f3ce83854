#!/usr/bin/python3
"""Whole-model reference for nobubble's seqctr model (issue 4), from PyTorch.

  /usr/bin/python3 tests/torch/seqctr_ref.py gen --out tests/torch/ref/seqctr_tiny.safetensors

The model is written here from the issue's spec, per sample and in float64 (not a transcription
of src/model/seqctr.c); tests/test_seqctr_ref.c replays the file through nb_sc_forward/backward
and nobubble's optimizers. Where the spec is silent this follows seqctr.h: layernorm eps 1e-5,
self-attention scale 1/sqrt(head size), qkv rows q|k|v with head h = rows h*E/heads.., no biases
in target attention, block.{i}.U/V stored [D0, r] (c = x0 * ((x V) U^T + b) + x), head.w [1, D0].
Weights are random (not seqctr.c's init), rounded to bf16 so the file is small and nobubble's
float32 copy is exact. See tests/torch/README.md for the file's contents."""
import argparse
import json
import math
import struct

import numpy as np
import torch

NDENSE, NCAT, B1, B2 = 13, 26, 512, 256
CFG = dict(E=8, hist_layers=1, heads=4, blocks=2, cross_rank=3, block_hidden=7, max_len=5, aux_weight=0.5)
CAT_ROWS = [2 + (f % 4) for f in range(NCAT)]  # tiny tables: ids collide, rows repeat
ITEM_ROWS = 11
B = 6
STEPS = 10
ADAMW = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)  # trainer's lr/betas/eps; decay 2-D only
ADAGRAD = dict(lr=0.05, eps=1e-8)  # trainer's --emb-lr default, eps 1e-8, accumulators start at 0


def bf16_round(a):
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(np.float32)


def dense_shapes(c):
    E, D0, r, H = c["E"], 29 * c["E"], c["cross_rank"], c["block_hidden"]
    s = []
    dims = [NDENSE, B1, B2, E]
    for i in range(3):
        s += [(f"bottom.{i}.weight", (dims[i + 1], dims[i])), (f"bottom.{i}.bias", (dims[i + 1],))]
    for l in range(c["hist_layers"]):
        p = f"hist.{l}."
        s += [(p + "ln1.weight", (E,)), (p + "ln1.bias", (E,)), (p + "qkv.weight", (3 * E, E)),
              (p + "qkv.bias", (3 * E,)), (p + "proj.weight", (E, E)), (p + "proj.bias", (E,)),
              (p + "ln2.weight", (E,)), (p + "ln2.bias", (E,)), (p + "fc1.weight", (4 * E, E)),
              (p + "fc1.bias", (4 * E,)), (p + "fc2.weight", (E, 4 * E)), (p + "fc2.bias", (E,))]
    s += [("target.wq", (E, E)), ("target.wk", (E, E)), ("target.wv", (E, E))]
    for i in range(c["blocks"]):
        p = f"block.{i}."
        s += [(p + "U", (D0, r)), (p + "V", (D0, r)), (p + "b", (D0,)), (p + "w1", (H, D0)), (p + "b1", (H,)),
              (p + "w2", (D0, H)), (p + "b2", (D0,)), (p + "head.w", (1, D0)), (p + "head.b", (1,))]
    return s


def table_names():
    return [f"emb.cat.{f}" for f in range(NCAT)] + ["emb.item"]


def make_weights(c, rng):
    w = {}
    for name, shape in dense_shapes(c):
        if name.endswith("ln1.weight") or name.endswith("ln2.weight"):
            a = 1 + 0.1 * rng.standard_normal(shape)
        elif len(shape) == 1:
            a = 0.02 * rng.standard_normal(shape)
        else:
            fan = shape[0] if name.endswith(".V") else shape[1]
            a = rng.standard_normal(shape) / math.sqrt(fan)
        w[name] = bf16_round(a)
    E = c["E"]
    for name, rows in zip(table_names(), CAT_ROWS + [ITEM_ROWS]):
        w[name] = bf16_round(0.5 * rng.standard_normal((rows, E)))
    return w


def make_batch(c, rng):
    L = c["max_len"]
    raw = rng.standard_normal((B, NDENSE)) * 3
    raw[rng.random((B, NDENSE)) < 0.2] = 0  # missing -> 0
    dense = np.log1p(np.maximum(raw, 0)).astype(np.float32)
    cat = rng.integers(0, 2**32, (B, NCAT), dtype=np.uint64).astype(np.uint32)  # hashes >= 2^31 included
    cat[rng.random((B, NCAT)) < 0.15] = 0  # missing -> row 0
    cat[3] = cat[1]  # two samples with the same categorical rows
    target = np.array([4, 15, 7, 4, 2**32 - 3, 26], dtype=np.uint32)  # 4 == 15 == 26 (mod 11)
    lens = np.array([0, L, 2, 1, L, 3], dtype=np.int32)
    hist = np.full((B, L), 0xDEADBEEF, dtype=np.uint32)  # padding: must never be read
    for b in range(B):
        hist[b, :lens[b]] = rng.integers(0, 40, lens[b])
    hist[1, :3] = [4, 4, 9]     # repeats inside a history and with targets
    hist[4, 0] = 15             # history row == another sample's target row
    label = np.array([1, 0, 1, 1, 0, 0], dtype=np.float32)
    return dict(dense=dense, cat=cat, target=target, hist=hist, hist_len=lens, label=label)


def layernorm(x, w, b, eps=1e-5):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * w + b


def encoder_layer(P, p, h, heads):
    """One pre-norm layer over the L valid items of one history (no padding needed: per sample)."""
    L, E = h.shape
    hs = E // heads
    qkv = layernorm(h, P[p + "ln1.weight"], P[p + "ln1.bias"]) @ P[p + "qkv.weight"].T + P[p + "qkv.bias"]
    q, k, v = (qkv[:, i * E:(i + 1) * E].reshape(L, heads, hs).transpose(0, 1) for i in range(3))
    att = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(hs), dim=-1) @ v  # [heads, L, hs]
    h = h + att.transpose(0, 1).reshape(L, E) @ P[p + "proj.weight"].T + P[p + "proj.bias"]
    f = torch.relu(layernorm(h, P[p + "ln2.weight"], P[p + "ln2.bias"]) @ P[p + "fc1.weight"].T + P[p + "fc1.bias"])
    return h + f @ P[p + "fc2.weight"].T + P[p + "fc2.bias"]


def lookup_rows(c, batch):
    """Global rows (table offsets in table_names order) per lookup, as python ints."""
    off = np.concatenate([[0], np.cumsum(CAT_ROWS + [ITEM_ROWS])])
    cat = [[int(off[f]) + int(batch["cat"][b, f]) % CAT_ROWS[f] for f in range(NCAT)] for b in range(B)]
    tgt = [int(off[NCAT]) + int(batch["target"][b]) % ITEM_ROWS for b in range(B)]
    hist = [[int(off[NCAT]) + int(batch["hist"][b, j]) % ITEM_ROWS for j in range(batch["hist_len"][b])]
            for b in range(B)]
    return off, cat, tgt, hist


def forward(c, P, emb, batch):
    """All heads' logits [blocks, B] and the loss. emb: [total_rows, E] (all tables stacked)."""
    E = c["E"]
    off, cat, tgt, hist = lookup_rows(c, batch)
    d = torch.tensor(batch["dense"], dtype=emb.dtype)
    a = torch.relu(d @ P["bottom.0.weight"].T + P["bottom.0.bias"])
    a = torch.relu(a @ P["bottom.1.weight"].T + P["bottom.1.bias"])
    bot = a @ P["bottom.2.weight"].T + P["bottom.2.bias"]
    rows = []
    for b in range(B):
        t = emb[tgt[b]]
        if hist[b]:
            h = emb[hist[b]]
            for l in range(c["hist_layers"]):
                h = encoder_layer(P, f"hist.{l}.", h, c["heads"])
            q, k, v = P["target.wq"] @ t, h @ P["target.wk"].T, h @ P["target.wv"].T
            pooled = torch.softmax(k @ q / math.sqrt(E), dim=0) @ v
        else:
            pooled = torch.zeros(E, dtype=emb.dtype)
        rows.append(torch.cat([bot[b], emb[cat[b]].reshape(-1), t, pooled]))
    x0 = torch.stack(rows)
    x = x0
    y = torch.tensor(batch["label"], dtype=emb.dtype)
    logits, loss = [], 0
    nb = c["blocks"]
    for i in range(nb):
        p = f"block.{i}."
        cc = x0 * ((x @ P[p + "V"]) @ P[p + "U"].T + P[p + "b"]) + x
        x = cc + torch.relu(cc @ P[p + "w1"].T + P[p + "b1"]) @ P[p + "w2"].T + P[p + "b2"]
        z = (x @ P[p + "head.w"].T + P[p + "head.b"]).reshape(B)
        logits.append(z)
        bce = torch.nn.functional.binary_cross_entropy_with_logits(z, y)
        loss = loss + (bce if i == nb - 1 else c["aux_weight"] * bce)
    return torch.stack(logits), loss


def run(c, w, batch, dtype=torch.float64):
    names = [n for n, _ in dense_shapes(c)]
    P = {n: torch.tensor(w[n], dtype=dtype, requires_grad=True) for n in names}
    emb = torch.tensor(np.concatenate([w[n] for n in table_names()]), dtype=dtype, requires_grad=True)
    _, cat, tgt, hist = lookup_rows(c, batch)
    touched = sorted(set(r for rr in cat for r in rr) | set(tgt) | set(r for rr in hist for r in rr))
    opt = torch.optim.AdamW([{"params": [P[n] for n in names if P[n].dim() == 2]},
                             {"params": [P[n] for n in names if P[n].dim() != 2], "weight_decay": 0.0}], **ADAMW)
    acc = torch.zeros(emb.shape[0], dtype=dtype)
    out, losses = {}, []
    for step in range(STEPS):
        opt.zero_grad()
        emb.grad = None
        logits, loss = forward(c, P, emb, batch)
        loss.backward()
        losses.append(loss.item())
        if step == 0:
            out["logits"] = logits.detach().numpy()
            out["loss"] = loss.item()
            out["g"] = {n: P[n].grad.numpy().copy() for n in names}
            out["g.emb"] = emb.grad[touched].numpy().copy()
        opt.step()
        with torch.no_grad():  # row-wise Adagrad on the touched rows only
            g = emb.grad[touched]
            acc[touched] += (g * g).mean(1)
            emb[touched] -= ADAGRAD["lr"] * g / (torch.sqrt(acc[touched]).unsqueeze(1) + ADAGRAD["eps"])
    out["losses10"] = np.array(losses)
    out["touched"] = np.array(touched, dtype=np.int32)
    return out


def write_safetensors(path, tensors, meta):
    header, blobs, pos = {"__metadata__": meta}, [], 0
    for name, (arr, kind) in tensors.items():
        data = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": kind, "shape": list(arr.shape), "data_offsets": [pos, pos + len(data)]}
        blobs.append(data)
        pos += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def f32(a):
    return (np.asarray(a, dtype=np.float32), "F32")


def gen(args):
    torch.manual_seed(0)
    rng = np.random.default_rng(1234)
    c = CFG
    w = make_weights(c, rng)
    batch = make_batch(c, rng)
    ref = run(c, w, batch, torch.float64)
    r32 = run(c, w, batch, torch.float32)  # torch's own float32 run: the noise floor for nobubble's

    def rel(a, b):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))

    noise = {"logits": rel(r32["logits"][-1], ref["logits"][-1]), "loss": rel(r32["loss"], ref["loss"]),
             "grad_worst": max(rel(r32["g"][n], ref["g"][n]) for n in ref["g"]),
             "g.emb": rel(r32["g.emb"], ref["g.emb"]),
             "losses10_worst": max(rel(a, b) for a, b in zip(r32["losses10"], ref["losses10"]))}
    t = {}
    for n, a in w.items():  # bf16 bit patterns: exact copies of the float32 values used
        t["w." + n] = ((a.view(np.uint32) >> 16).astype(np.uint16), "BF16")
    t["batch.dense"] = f32(batch["dense"])
    for k in ("cat", "target", "hist"):
        t["batch." + k] = (batch[k].view(np.int32), "I32")  # uint32 ids, bit pattern
    t["batch.hist_len"] = (batch["hist_len"], "I32")
    t["batch.label"] = f32(batch["label"])
    t["logits"] = f32(ref["logits"])
    t["loss"] = f32([ref["loss"]])
    for n, g in ref["g"].items():
        t["g." + n] = f32(g)
    t["g.emb.rows"] = (ref["touched"], "I32")
    t["g.emb"] = f32(ref["g.emb"])
    t["losses10"] = f32(ref["losses10"])
    meta = {k: str(v) for k, v in c.items()}
    meta.update({"cat_rows": ",".join(map(str, CAT_ROWS)), "item_rows": str(ITEM_ROWS), "B": str(B),
                 "steps": str(STEPS), "adamw": json.dumps(ADAMW), "adagrad": json.dumps(ADAGRAD),
                 "torch": torch.__version__, "torch32_err": " ".join(f"{k}={v:.2e}" for k, v in noise.items())})
    write_safetensors(args.out, t, meta)
    print(f"loss {ref['loss']:.9f} losses10 {' '.join(f'{x:.6f}' for x in ref['losses10'])}")
    print("torch float32 vs float64: " + meta["torch32_err"])
    print(f"touched rows {len(ref['touched'])}; wrote {args.out}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gen")
    g.add_argument("--out", required=True)
    args = ap.parse_args()
    gen(args)


if __name__ == "__main__":
    main()
