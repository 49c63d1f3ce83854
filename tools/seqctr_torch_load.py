#!/usr/bin/env python3
"""Serve a trained seqctr model outside nobubble: load the file `nobubble export --ckpt DIR --out
FILE` writes into a PyTorch module, score rows with it, or export it to ONNX.

  python3 tools/seqctr_torch_load.py model.safetensors --onnx model.onnx     (needs torch, onnx)
  python3 -c "import sys; sys.path.insert(0, 'tools'); import seqctr_torch_load as L; m = L.load('model.safetensors')"

The export (one safetensors file, every tensor float32, little-endian; header metadata
"seqctr.config" = "E=.. hist_layers=.. heads=.. blocks=.. cross_rank=.. block_hidden=.. max_len=..
aux_weight=..") holds, with D0 = 29 E and H = block_hidden, r = cross_rank:
  bottom.{0,1,2}.weight [out, in] (13 -> 512 -> 256 -> E, nn.Linear layout), bottom.{i}.bias [out]
  hist.{l}.ln1.weight/.bias [E]; hist.{l}.qkv.weight [3E, E] (rows q | k | v; head h = rows
    h*E/heads .. of each), .qkv.bias [3E]; .proj.weight [E, E], .proj.bias [E]; .ln2.weight/.bias
    [E]; .fc1.weight [4E, E], .fc1.bias [4E]; .fc2.weight [E, 4E], .fc2.bias [E]
  target.wq, target.wk, target.wv [E, E] (no biases; q = t @ wq^T)
  block.{i}.U [D0, r], .V [D0, r], .b [D0], .w1 [H, D0], .b1 [H], .w2 [D0, H], .b2 [D0],
    .head.w [D0], .head.b [1]
  emb.cat.{f} [rows_f, E] for f = 0..25 (unused slots of a smaller schema: 1 row), emb.item
    [item_rows, E] (the target item and the history share it)
The forward (model/seqctr.h), per row: dense [13] (already transformed: log(1 + max(x, 0)) for a
log1p column, 0 when missing), 26 categorical ids, a target item id, a history of item ids (most
recent last, at most max_len), and:
  bottom = MLP(dense) with ReLU between the layers; cat_f = emb.cat.f[id_f mod rows_f];
  t = emb.item[target mod item_rows]; h_j = emb.item[hist_j mod item_rows];
  each history layer: h += proj(attention(qkv(LN1 h))) over the valid items (scale 1/sqrt(E/heads),
    LayerNorm eps 1e-5), h += fc2(relu(fc1(LN2 h)));
  pooled = softmax_j((wq t) . (wk h_j) / sqrt(E)) weighted sum of wv h_j (0 for an empty history);
  x0 = [bottom | cat_0 .. cat_25 | t | pooled];  x = x0; per block:
    c = x0 * ((x V) U^T + b) + x;  x = c + w2 relu(w1 c + b1) + b2;
  score = sigmoid(head.w . x + head.b) of the last block.
How a CSV row becomes those inputs is the schema's (src/data/ctr_schema.h): a categorical
column of "cardinality" N holds the id itself; a "hash_size" column's id is FNV-1a 64 of the text
mod the size; dense columns beyond the schema's and categorical slots beyond it read 0.
"""
import argparse
import json
import math
import struct
import sys

import numpy as np

NDENSE, NCAT = 13, 26


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


def parse_config(meta):
    cfg = {}
    for item in meta.get("seqctr.config", "").split():
        k, v = item.split("=")
        cfg[k] = float(v) if k == "aux_weight" else int(v)
    for k in ("E", "hist_layers", "heads", "blocks"):
        if k not in cfg:
            raise SystemExit(f"the export's seqctr.config lacks {k}: is it a nobubble seqctr export?")
    return cfg


def fnv1a(text):
    """The id of a "hash_size" column's value, before mod rows (src/data/ctr_table.c)."""
    h = 0xcbf29ce484222325
    for b in text.encode("utf-8"):
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def _torch():
    import torch
    return torch


def build_module(cfg, tensors):
    torch = _torch()
    nn, F = torch.nn, torch.nn.functional

    class SeqCTR(nn.Module):
        """forward(dense [B, 13] float32, cat [B, 26] int64, target [B] int64, hist [B, L] int64,
        hist_len [B] int64) -> click probability [B]. hist rows hold hist_len[b] ids first (L >= 1;
        the rest is ignored)."""

        def __init__(self):
            super().__init__()
            self.cfg = cfg
            # nobubble's names with '.' -> '__' (parameter names cannot hold dots)
            self.p = nn.ParameterDict({k.replace(".", "__"): nn.Parameter(torch.from_numpy(v), requires_grad=False)
                                       for k, v in tensors.items()})

        def w(self, name):
            return self.p[name.replace(".", "__")]

        def lookup(self, table, ids):
            rows = table.shape[0]
            return table[torch.remainder(ids, rows)]

        def attention(self, q, k, v, valid, scale):
            s = (q @ k.transpose(-2, -1)) * scale
            s = s.masked_fill(~valid, -1e30)  # finite: an empty history gives uniform weights, zeroed after
            return torch.softmax(s, dim=-1) @ v

        def forward(self, dense, cat, target, hist, hist_len):
            c, w = self.cfg, self.w
            E, heads = c["E"], c["heads"]
            B, L = hist.shape
            x = dense
            for i in range(3):
                x = F.linear(x, w(f"bottom.{i}.weight"), w(f"bottom.{i}.bias"))
                if i < 2:
                    x = F.relu(x)
            bottom = x
            cats = [self.lookup(w(f"emb.cat.{f}"), cat[:, f]) for f in range(NCAT)]
            t = self.lookup(w("emb.item"), target)
            h = self.lookup(w("emb.item"), hist)
            valid = torch.arange(L, device=hist.device)[None, :] < hist_len[:, None]  # [B, L]
            hs = E // heads
            for l in range(c["hist_layers"]):
                p = f"hist.{l}."
                a = F.layer_norm(h, (E,), w(p + "ln1.weight"), w(p + "ln1.bias"), 1e-5)
                qkv = F.linear(a, w(p + "qkv.weight"), w(p + "qkv.bias")).view(B, L, 3, heads, hs).permute(2, 0, 3, 1, 4)
                o = self.attention(qkv[0], qkv[1], qkv[2], valid[:, None, None, :], 1.0 / math.sqrt(hs))
                h = h + F.linear(o.transpose(1, 2).reshape(B, L, E), w(p + "proj.weight"), w(p + "proj.bias"))
                a = F.layer_norm(h, (E,), w(p + "ln2.weight"), w(p + "ln2.bias"), 1e-5)
                h = h + F.linear(F.relu(F.linear(a, w(p + "fc1.weight"), w(p + "fc1.bias"))), w(p + "fc2.weight"), w(p + "fc2.bias"))
            q = F.linear(t, w("target.wq"))[:, None, :]  # [B, 1, E]
            k, v = F.linear(h, w("target.wk")), F.linear(h, w("target.wv"))
            pooled = self.attention(q, k, v, valid[:, None, :], 1.0 / math.sqrt(E))[:, 0, :]
            pooled = pooled * (hist_len > 0).to(pooled.dtype)[:, None]
            x0 = torch.cat([bottom] + cats + [t, pooled], dim=1)
            x = x0
            for i in range(c["blocks"]):
                p = f"block.{i}."
                cr = x0 * ((x @ w(p + "V")) @ w(p + "U").t() + w(p + "b")) + x
                x = cr + F.linear(F.relu(F.linear(cr, w(p + "w1"), w(p + "b1"))), w(p + "w2"), w(p + "b2"))
            p = f"block.{c['blocks'] - 1}."
            return torch.sigmoid(x @ w(p + "head.w") + w(p + "head.b"))

    return SeqCTR().eval()


def load(path):
    """The export at path as a torch module (eval mode, no gradients)."""
    meta, tensors = read_safetensors(path)
    return build_module(parse_config(meta), tensors)


def example_inputs(batch=4, length=3):
    torch = _torch()
    return (torch.zeros(batch, NDENSE), torch.zeros(batch, NCAT, dtype=torch.int64), torch.zeros(batch, dtype=torch.int64),
            torch.zeros(batch, length, dtype=torch.int64), torch.full((batch,), length, dtype=torch.int64))


def export_onnx(model, path, opset=17):
    """ONNX with a dynamic batch and history length: inputs dense, cat, target, hist, hist_len;
    output score."""
    torch = _torch()
    torch.onnx.export(model, example_inputs(), path, input_names=["dense", "cat", "target", "hist", "hist_len"],
                      output_names=["score"], opset_version=opset,
                      dynamic_axes={"dense": {0: "B"}, "cat": {0: "B"}, "target": {0: "B"}, "hist": {0: "B", 1: "L"},
                                    "hist_len": {0: "B"}, "score": {0: "B"}})


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
