#!/usr/bin/env python3
"""Serve a trained seqctr model outside nobubble: load the file `nobubble export --ckpt DIR --out
FILE` writes into a PyTorch module, score rows with it, or export it to ONNX.

  python3 tools/seqctr_torch_load.py model.safetensors --onnx model.onnx     (needs torch, onnx)
  python3 -c "import sys; sys.path.insert(0, 'tools'); import seqctr_torch_load as L; m = L.load('model.safetensors')"

The export (one safetensors file, every tensor float32, little-endian; header metadata
"seqctr.config" = "E=.. hist_layers=.. heads=.. blocks=.. cross_rank=.. block_hidden=.. max_len=..
aux_weight=.. ndense=.. ncat=..[ mv=f:sum:K,f:mean:K]", and a CRC32C of each tensor) holds, with nd = ndense dense inputs and
nc = ncat categorical tables (the data's schema; 13 and 26 when the config does not say), D0 = (nc + 3) E,
H = block_hidden, r = cross_rank:
  bottom.{0,1,2}.weight [out, in] (nd -> 512 -> 256 -> E, nn.Linear layout), bottom.{i}.bias [out]
  hist.{l}.ln1.weight/.bias [E]; hist.{l}.qkv.weight [3E, E] (rows q | k | v; head h = rows
    h*E/heads .. of each), .qkv.bias [3E]; .proj.weight [E, E], .proj.bias [E]; .ln2.weight/.bias
    [E]; .fc1.weight [4E, E], .fc1.bias [4E]; .fc2.weight [E, 4E], .fc2.bias [E]
  target.wq, target.wk, target.wv [E, E] (no biases; q = t @ wq^T)
  block.{i}.U [D0, r], .V [D0, r], .b [D0], .w1 [H, D0], .b1 [H], .w2 [D0, H], .b2 [D0],
    .head.w [1, D0], .head.b [1]
  emb.cat.{f} [rows_f, E] for f = 0..nc-1, emb.item
    [item_rows, E] (the target item and the history share it)
The forward (model/seqctr.h), per row: dense [nd] (already transformed: log(1 + max(x, 0)) for a
log1p column, 0 when missing), nc categorical ids, a target item id, a history of item ids (most
recent last, at most max_len), and:
  bottom = MLP(dense) with ReLU between the layers; cat_f = emb.cat.f[id_f mod rows_f];
  t = emb.item[target mod item_rows]; h_j = emb.item[hist_j mod item_rows];
  each history layer: h += proj(attention(qkv(LN1 h))) over the valid items (scale 1/sqrt(E/heads),
    LayerNorm eps 1e-5), h += fc2(relu(fc1(LN2 h)));
  pooled = softmax_j((wq t) . (wk h_j) / sqrt(E)) weighted sum of wv h_j (0 for an empty history);
  a multi-valued column f (mv= in the config: column f, pooling sum or mean, at most K values):
    cat_f = the sum of emb.cat.f[id mod rows_f] over the row's ids (mean: divided by their count;
    no id: zeros) instead of one row;
  x0 = [bottom | cat_0 .. cat_{nc-1} | t | pooled];  x = x0; per block:
    c = x0 * ((x V) U^T + b) + x;  x = c + w2 relu(w1 c + b1) + b2;
  score = sigmoid(head.w . x + head.b) of the last block.
How a CSV row becomes those inputs is the schema's (src/data/ctr_schema.h): a categorical
column of "cardinality" N holds the id itself; a "hash_size" column's id is FNV-1a 64 of the text
mod the size. With multi-valued columns the module takes two more inputs: mv [B, W] int64, the
columns' ids padded (column after column in column order, each a block of its K, the row's first
mv_len of them valid), and mv_len [B, nmv] int64; their cat[:, f] is not read. Wider dense / cat inputs are read up to nd / nc columns (the 13 / 26 layout of older
exports of smaller schemas, whose unused slots read 0).
"""
import argparse
import json
import math
import struct
import sys

import numpy as np

NDENSE, NCAT = 13, 26  # the shape of a config without ndense / ncat (exports before it was kept)


def read_safetensors(path):
    """(metadata dict, {name: float32 ndarray}) of a safetensors file (float32 tensors only)."""
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    head = json.loads(data[8:8 + n])
    meta = head.pop("__metadata__", {}) or {}
    out = {}
    for name, v in head.items():
        if v["dtype"] != "F32":
            raise SystemExit(f"{path}: tensor {name} is {v['dtype']}, expected F32 (a nobubble seqctr export)")
        s, e = v["data_offsets"]
        out[name] = np.frombuffer(data, dtype="<f4", count=(e - s) // 4, offset=8 + n + s).reshape(v["shape"]).copy()
    return meta, out


def parse_mv(text):
    """[(column, "sum" | "mean", K)] of a config's mv= (column:pooling:max_values, ...)."""
    out = []
    for part in text.split(","):
        f, mode, k = part.split(":")
        if mode not in ("sum", "mean"):
            raise SystemExit(f"the export's mv= has pooling {mode!r} (sum or mean)")
        out.append((int(f), mode, int(k)))
    return out


def parse_config(meta):
    cfg = {}
    for item in meta.get("seqctr.config", "").split():
        k, v = item.split("=")
        cfg[k] = float(v) if k == "aux_weight" else parse_mv(v) if k == "mv" else int(v)
    cfg.setdefault("mv", [])
    for k in ("E", "hist_layers", "heads", "blocks"):
        if k not in cfg:
            raise SystemExit(f"the export's seqctr.config lacks {k}: is it a nobubble seqctr export?")
    cfg.setdefault("ndense", NDENSE)
    cfg.setdefault("ncat", NCAT)
    return cfg


def fnv1a(text):
    """The id of a "hash_size" column's value, before mod rows (src/data/ctr_table.c)."""
    h = 0xcbf29ce484222325
    for b in text.encode("utf-8"):
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


class NumpyOps:
    """The forward's operations on numpy arrays (float32), for a check without torch."""

    def __init__(self):
        import numpy as np
        self.np = np

    def linear(self, x, w, b=None):
        y = x @ w.T
        return y if b is None else y + b

    def relu(self, x):
        return self.np.maximum(x, 0)

    def layer_norm(self, x, w, b):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / self.np.sqrt(var + 1e-5) * w + b

    def lookup(self, table, ids):
        return table[ids % table.shape[0]]

    def masked_softmax(self, s, valid):
        s = self.np.where(valid, s, self.np.float32(-1e30))
        e = self.np.exp(s - s.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    def swap(self, x):  # the last two axes
        return self.np.swapaxes(x, -1, -2)

    def permute(self, x, order):
        return self.np.transpose(x, order)

    def cat(self, xs):
        return self.np.concatenate(xs, axis=1)

    def arange(self, n, like):
        return self.np.arange(n)

    def as_float(self, x, like):
        return x.astype(like.dtype)

    def sigmoid(self, x):
        return 1 / (1 + self.np.exp(-x))

    def zeros_like(self, x):
        return self.np.zeros_like(x)


class TorchOps:
    """The same operations on torch tensors (traceable by torch.onnx.export)."""

    def __init__(self):
        import torch
        self.torch, self.F = torch, torch.nn.functional

    def linear(self, x, w, b=None):
        return self.F.linear(x, w, b)

    def relu(self, x):
        return self.F.relu(x)

    def layer_norm(self, x, w, b):
        return self.F.layer_norm(x, (x.shape[-1],), w, b, 1e-5)

    def lookup(self, table, ids):
        return table[self.torch.remainder(ids, table.shape[0])]

    def masked_softmax(self, s, valid):
        return self.torch.softmax(s.masked_fill(~valid, -1e30), dim=-1)

    def swap(self, x):
        return x.transpose(-2, -1)

    def permute(self, x, order):
        return x.permute(*order)

    def cat(self, xs):
        return self.torch.cat(xs, dim=1)

    def arange(self, n, like):
        return self.torch.arange(n, device=like.device)

    def as_float(self, x, like):
        return x.to(like.dtype)

    def sigmoid(self, x):
        return self.torch.sigmoid(x)

    def zeros_like(self, x):
        return self.torch.zeros_like(x)


def pool_mv(op, w, cfg, cats, mv, mv_len):
    """The multi-valued columns' slots: the sum (mean) of each row's valid ids' rows."""
    at = 0
    for j, (f, mode, K) in enumerate(cfg["mv"]):
        rows = op.lookup(w(f"emb.cat.{f}"), mv[:, at:at + K])  # [B, K, E]
        n = mv_len[:, j]
        valid = op.as_float(op.arange(K, mv)[None, :] < n[:, None], rows)  # [B, K]
        s = (rows * valid[:, :, None]).sum(1)
        if mode == "mean":
            nf = op.as_float(n, s)
            s = s / (nf + op.as_float(n == 0, s))[:, None]  # no id: 0 / 1
        cats[f] = s
        at += K


def forward(op, w, cfg, dense, cat, target, hist, hist_len, mv=None, mv_len=None):
    """The click probability [B] of rows (see the module's docstring); w(name) gives a tensor by
    nobubble's name. A masked score is -1e30, not -inf: an empty history gets uniform weights (no
    NaN), and its pooled vector is then zeroed."""
    if cfg["mv"] and (mv is None or mv_len is None):
        raise SystemExit("the export has multi-valued columns: pass mv [B, W] and mv_len [B, nmv]")
    E, heads = cfg["E"], cfg["heads"]
    B, L = hist.shape
    x = dense[:, :cfg["ndense"]]
    for i in range(3):
        x = op.linear(x, w(f"bottom.{i}.weight"), w(f"bottom.{i}.bias"))
        if i < 2:
            x = op.relu(x)
    bottom = x
    cats = [op.lookup(w(f"emb.cat.{f}"), cat[:, f]) for f in range(cfg["ncat"])]
    if cfg["mv"]:
        pool_mv(op, w, cfg, cats, mv, mv_len)
    t = op.lookup(w("emb.item"), target)
    h = op.lookup(w("emb.item"), hist)
    valid = op.arange(L, hist)[None, :] < hist_len[:, None]  # [B, L]
    hs = E // heads
    for l in range(cfg["hist_layers"]):
        p = f"hist.{l}."
        a = op.layer_norm(h, w(p + "ln1.weight"), w(p + "ln1.bias"))
        qkv = op.permute(op.linear(a, w(p + "qkv.weight"), w(p + "qkv.bias")).reshape(B, L, 3, heads, hs), (2, 0, 3, 1, 4))
        s = (qkv[0] @ op.swap(qkv[1])) * (1.0 / math.sqrt(hs))  # [B, heads, L, L]
        o = op.masked_softmax(s, valid[:, None, None, :]) @ qkv[2]
        h = h + op.linear(op.permute(o, (0, 2, 1, 3)).reshape(B, L, E), w(p + "proj.weight"), w(p + "proj.bias"))
        a = op.layer_norm(h, w(p + "ln2.weight"), w(p + "ln2.bias"))
        h = h + op.linear(op.relu(op.linear(a, w(p + "fc1.weight"), w(p + "fc1.bias"))), w(p + "fc2.weight"), w(p + "fc2.bias"))
    q = op.linear(t, w("target.wq"))[:, None, :]  # [B, 1, E]
    k, v = op.linear(h, w("target.wk")), op.linear(h, w("target.wv"))
    s = (q @ op.swap(k)) * (1.0 / math.sqrt(E))  # [B, 1, L]
    pooled = (op.masked_softmax(s, valid[:, None, :]) @ v)[:, 0, :]
    pooled = pooled * op.as_float(hist_len > 0, pooled)[:, None]
    x0 = op.cat([bottom] + cats + [t, pooled])
    x = x0
    for i in range(cfg["blocks"]):
        p = f"block.{i}."
        c = x0 * ((x @ w(p + "V")) @ op.swap(w(p + "U")) + w(p + "b")) + x
        x = c + op.linear(op.relu(op.linear(c, w(p + "w1"), w(p + "b1"))), w(p + "w2"), w(p + "b2"))
    p = f"block.{cfg['blocks'] - 1}."
    return op.sigmoid(op.linear(x, w(p + "head.w"), w(p + "head.b"))[:, 0])


def forward_numpy(cfg, tensors, dense, cat, target, hist, hist_len, mv=None, mv_len=None):
    """forward() on numpy arrays: no torch needed."""
    return forward(NumpyOps(), lambda n: tensors[n], cfg, dense, cat, target, hist, hist_len, mv, mv_len)


def _torch():
    import torch
    return torch


def build_module(cfg, tensors):
    torch = _torch()
    nn = torch.nn

    class SeqCTR(nn.Module):
        """forward(dense [B, nd] float32, cat [B, nc] int64, target [B] int64, hist [B, L] int64,
        hist_len [B] int64[, mv [B, W] int64, mv_len [B, nmv] int64 with multi-valued columns]) ->
        click probability [B]. hist rows hold hist_len[b] ids first (L >= 1; the rest is ignored)."""

        def __init__(self):
            super().__init__()
            self.cfg = cfg
            self.ops = TorchOps()
            # nobubble's names with '.' -> '__' (parameter names cannot hold dots)
            self.p = nn.ParameterDict({k.replace(".", "__"): nn.Parameter(torch.from_numpy(v), requires_grad=False)
                                       for k, v in tensors.items()})

        def forward(self, dense, cat, target, hist, hist_len, mv=None, mv_len=None):
            return forward(self.ops, lambda n: self.p[n.replace(".", "__")], self.cfg, dense, cat, target, hist, hist_len,
                           mv, mv_len)

    return SeqCTR().eval()


def load(path):
    """The export at path as a torch module (eval mode, no gradients)."""
    meta, tensors = read_safetensors(path)
    return build_module(parse_config(meta), tensors)


def input_names(cfg):
    return ["dense", "cat", "target", "hist", "hist_len"] + (["mv", "mv_len"] if cfg["mv"] else [])


def example_inputs(cfg, batch=4, length=3):
    torch = _torch()
    x = (torch.zeros(batch, cfg["ndense"]), torch.zeros(batch, cfg["ncat"], dtype=torch.int64), torch.zeros(batch, dtype=torch.int64),
         torch.zeros(batch, length, dtype=torch.int64), torch.full((batch,), length, dtype=torch.int64))
    if cfg["mv"]:
        W = sum(k for _, _, k in cfg["mv"])
        x += (torch.zeros(batch, W, dtype=torch.int64), torch.ones(batch, len(cfg["mv"]), dtype=torch.int64))
    return x


def export_onnx(model, path, opset=17):
    """ONNX with a dynamic batch and history length: inputs dense, cat, target, hist, hist_len
    (and mv, mv_len with multi-valued columns); output score."""
    torch = _torch()
    axes = {"dense": {0: "B"}, "cat": {0: "B"}, "target": {0: "B"}, "hist": {0: "B", 1: "L"}, "hist_len": {0: "B"},
            "score": {0: "B"}}
    if model.cfg["mv"]:
        axes.update({"mv": {0: "B"}, "mv_len": {0: "B"}})
    torch.onnx.export(model, example_inputs(model.cfg), path, input_names=input_names(model.cfg),
                      output_names=["score"], opset_version=opset, dynamic_axes=axes)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("export", help="the safetensors file of 'nobubble export --out FILE' (seqctr)")
    ap.add_argument("--onnx", help="write the model as ONNX here")
    ap.add_argument("--opset", type=int, default=17)
    a = ap.parse_args(argv)
    meta, tensors = read_safetensors(a.export)
    cfg = parse_config(meta)
    print(f"{a.export}: seqctr {cfg}, {len(tensors)} tensors, tables: "
          + ", ".join(f"{k} {v.shape[0]}" for k, v in tensors.items() if k.startswith("emb.") and v.shape[0] > 1))
    if a.onnx:
        export_onnx(build_module(cfg, tensors), a.onnx, a.opset)
        print(f"wrote {a.onnx}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
