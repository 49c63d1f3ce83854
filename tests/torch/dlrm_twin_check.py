#!/usr/bin/python3
"""nobubble's --model dlrm-dcnv2 against a PyTorch twin in MLPerf's reference layout (issue 34).

  python3 tests/torch/dlrm_twin_check.py gen --out tests/torch/ref/dlrm_tiny.safetensors
  build/tests/test_dlrm_ref [--ref FILE] [--verbose]      (CPU fp32; with a GPU also CUDA fp32, bf16)

The twin is built as mlcommons/training recommendation_v2/torchrec_dlrm builds DLRM_DCN (torchrec's
modules, written out here in plain torch so torchrec is not needed; no reference code is copied):
  DenseArch      MLP 13 -> 512 -> 256 -> E, a ReLU after every layer (torchrec's MLP)
  SparseArch     one EmbeddingBag per feature, mode "sum", over the sample's multi-hot ids
  InteractionDCN combined = cat([dense.unsqueeze(1), pooled.view(B, 26, E)], 1).view(B, 27 E);
                 LowRankCrossNet: x_{l+1} = x0 * (W_l (V_l x_l) + b_l) + x_l, W_l [27E, r],
                 V_l [r, 27E], b_l [27E]
  OverArch       MLP 27E -> top..., a ReLU after each, then Linear(top[-1], 1)
  loss           BCEWithLogits, mean over the batch
  optimizers     dense: torch.optim.Adagrad(lr, eps=1e-10, initial_accumulator_value=0, lr_decay=0,
                 weight_decay=0), as the reference; tables: element-wise Adagrad at the same rate (the
                 reference's torch.optim.Adagrad in backward = FBGEMM's EXACT_ADAGRAD, which gets only
                 the rate: FBGEMM's default eps 1e-8), written as torch.optim.Adagrad on the bags (an
                 untouched row's zero gradient leaves it and its sums as they are, as the fused one)
Names map to nobubble's checkpoint names: block.{l}.U = W_l, block.{l}.V = V_l^T, block.{l}.b = b_l,
top.{j} = the OverArch layers, emb.cat.{f} the tables, emb.item nobubble's one-row item table (the
DLRM form never reads it: its gradient is 0 and it is among the touched rows with a zero gradient).
Tiny shape (E 8, rank 3, top 7,5, tables of 2..5 rows, MLPerf's multi-hot sizes, B 6), float64, weights
rounded to bf16 so nobubble's float32 and bf16 copies are exact. It compares, in test_dlrm_ref.c:
the logits and loss, every dense gradient, the touched rows' gradients, and 20 optimizer steps on the
same batch (each step's loss)."""
import argparse
import json
import struct

import numpy as np
import torch

NDENSE, NCAT = 13, 26
HOT = [3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1]  # MLPerf's
CFG = dict(E=8, blocks=3, cross_rank=3, top=[7, 5])
CAT_ROWS = [2 + (f % 4) for f in range(NCAT)]
B = 6
STEPS = 20
BF16_BATCH_TOL, MAX_DRAWS = 0.05, 200  # the batch: torch's bf16 gradients within 5% of float64's
LR, EPS, EMB_EPS = 0.005, 1e-10, 1e-8  # MLPerf's --learning_rate 0.005, ADAGRAD_EPS; FBGEMM's default eps


def bf16_round(a):
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(np.float32)


def dense_shapes(c):
    E, r = c["E"], c["cross_rank"]
    Dx = (NCAT + 1) * E
    dims = [NDENSE, 512, 256, E]
    s = []
    for i in range(3):
        s += [(f"bottom.{i}.weight", (dims[i + 1], dims[i])), (f"bottom.{i}.bias", (dims[i + 1],))]
    for l in range(c["blocks"]):
        s += [(f"block.{l}.U", (Dx, r)), (f"block.{l}.V", (Dx, r)), (f"block.{l}.b", (Dx,))]
    widths = [Dx] + c["top"] + [1]
    for j in range(len(widths) - 1):
        s += [(f"top.{j}.weight", (widths[j + 1], widths[j])), (f"top.{j}.bias", (widths[j + 1],))]
    return s


def make_weights(c, rng):
    w = {}
    for n, shp in dense_shapes(c):
        fan = shp[1] if len(shp) == 2 else 1
        if n.endswith(".V"):
            fan = shp[0]
        scale = 0.5 / np.sqrt(fan) if len(shp) == 2 else 0.05
        w[n] = bf16_round(rng.standard_normal(shp) * scale)
    for f in range(NCAT):
        w[f"emb.cat.{f}"] = bf16_round(rng.standard_normal((CAT_ROWS[f], c["E"])) * 0.3)
    w["emb.item"] = bf16_round(rng.standard_normal((1, c["E"])) * 0.3)
    return w


def make_batch(rng):
    dense = np.log1p(np.floor(np.exp(rng.standard_normal((B, NDENSE)) * 1.5))).astype(np.float32)
    ids = [rng.integers(0, 1 << 20, size=(B, HOT[f])).astype(np.uint32) for f in range(NCAT)]
    label = (rng.random(B) < 0.4).astype(np.float32)
    return dict(dense=dense, ids=ids, label=label)


class Twin(torch.nn.Module):
    """DLRM_DCN in torchrec's layout: DenseArch, EmbeddingBags, LowRankCrossNet, OverArch."""

    def __init__(self, c, w, dtype):
        super().__init__()
        t = lambda a: torch.nn.Parameter(torch.tensor(a, dtype=dtype))
        self.dense = torch.nn.ModuleList()
        for i in range(3):
            lin = torch.nn.Linear(1, 1).to(dtype)
            lin.weight, lin.bias = t(w[f"bottom.{i}.weight"]), t(w[f"bottom.{i}.bias"])
            self.dense.append(lin)
        self.tables = torch.nn.ModuleList()
        for f in range(NCAT):
            bag = torch.nn.EmbeddingBag(CAT_ROWS[f], c["E"], mode="sum").to(dtype)
            bag.weight = t(w[f"emb.cat.{f}"])
            self.tables.append(bag)
        self.W = torch.nn.ParameterList([t(w[f"block.{l}.U"]) for l in range(c["blocks"])])  # [D, r]
        self.V = torch.nn.ParameterList([t(w[f"block.{l}.V"].T.copy()) for l in range(c["blocks"])])  # [r, D]
        self.bias = torch.nn.ParameterList([t(w[f"block.{l}.b"]) for l in range(c["blocks"])])
        self.over = torch.nn.ModuleList()
        for j in range(len(c["top"]) + 1):
            lin = torch.nn.Linear(1, 1).to(dtype)
            lin.weight, lin.bias = t(w[f"top.{j}.weight"]), t(w[f"top.{j}.bias"])
            self.over.append(lin)

    def forward(self, dense, ids):
        x = dense
        for lin in self.dense:
            x = torch.relu(lin(x))
        pooled = [bag(torch.from_numpy((ids[f] % CAT_ROWS[f]).astype(np.int64))) for f, bag in enumerate(self.tables)]
        x0 = torch.cat([x.unsqueeze(1), torch.stack(pooled, 1)], 1).reshape(dense.shape[0], -1)
        xl = x0
        for W, V, b in zip(self.W, self.V, self.bias):
            xl = x0 * torch.nn.functional.linear(torch.nn.functional.linear(xl, V), W, b) + xl
        for lin in self.over[:-1]:
            xl = torch.relu(lin(xl))
        return self.over[-1](xl).squeeze(1)


def step0_grads(c, w, batch, dtype):
    """The logits and every gradient of the first step (dense tensors and the tables), as float64."""
    m = Twin(c, w, dtype)
    logits = m(torch.tensor(batch["dense"], dtype=dtype), batch["ids"])
    torch.nn.functional.binary_cross_entropy_with_logits(logits, torch.tensor(batch["label"], dtype=dtype)).backward()
    out = {"logits": logits.detach().double().numpy()}
    for n, p in m.named_parameters():
        out["g." + n] = p.grad.double().numpy()
    return out


def run(c, w, batch, dtype):
    m = Twin(c, w, dtype)
    dense = torch.tensor(batch["dense"], dtype=dtype)
    label = torch.tensor(batch["label"], dtype=dtype)
    tables = list(m.tables)
    dense_params = [p for n, p in m.named_parameters() if not n.startswith("tables.")]
    opt = torch.optim.Adagrad(dense_params, lr=LR, eps=EPS, initial_accumulator_value=0.0, lr_decay=0.0, weight_decay=0.0)
    emb_opt = torch.optim.Adagrad([b.weight for b in tables], lr=LR, eps=EMB_EPS, initial_accumulator_value=0.0)
    offs = np.cumsum([0] + CAT_ROWS)
    touched = sorted({int(offs[f] + r) for f in range(NCAT) for r in np.unique(batch["ids"][f] % CAT_ROWS[f])})
    touched.append(int(offs[-1]))  # the item table's row: nobubble looks it up, its gradient is 0
    out, losses = {}, []
    for step in range(STEPS):
        opt.zero_grad()
        emb_opt.zero_grad()
        logits = m(dense, batch["ids"])
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, label)
        loss.backward()
        losses.append(loss.item())
        if step == 0:
            out["logits"], out["loss"] = logits.detach().numpy().copy(), loss.item()
            out["g"] = {}
            for i, lin in enumerate(m.dense):
                out["g"][f"bottom.{i}.weight"], out["g"][f"bottom.{i}.bias"] = lin.weight.grad.numpy().copy(), lin.bias.grad.numpy().copy()
            for l in range(c["blocks"]):
                out["g"][f"block.{l}.U"] = m.W[l].grad.numpy().copy()
                out["g"][f"block.{l}.V"] = m.V[l].grad.numpy().T.copy()
                out["g"][f"block.{l}.b"] = m.bias[l].grad.numpy().copy()
            for j, lin in enumerate(m.over):
                out["g"][f"top.{j}.weight"], out["g"][f"top.{j}.bias"] = lin.weight.grad.numpy().copy(), lin.bias.grad.numpy().copy()
            allg = np.concatenate([bag.weight.grad.numpy() for bag in tables] + [np.zeros((1, c["E"]))])
            out["g.emb"] = allg[touched].copy()
        opt.step()
        emb_opt.step()
    out["losses"] = np.array(losses)
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
    rng = np.random.default_rng(34)
    c = CFG
    w = make_weights(c, rng)

    def rel(a, b):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))

    # A ReLU unit whose pre-activation lies within bf16 rounding of 0 changes side in a bf16 run, and its
    # whole gradient with it: with the top MLP's 7 and 5 units and B 6, one such unit can carry most of
    # the gradient's norm (a first batch did: torch-independent, every op matching its inputs, and still
    # 0.9 off in every gradient below top.0). The bf16 check is meaningful only on a batch whose
    # decisions bf16 keeps, so batches are drawn until torch's own bf16 run gives gradients within
    # BF16_BATCH_TOL of float64's; the draw and torch's bf16 errors go into the file's metadata.
    for draw in range(1, MAX_DRAWS + 1):
        batch = make_batch(rng)
        g64 = step0_grads(c, w, batch, torch.float64)
        g16 = step0_grads(c, w, batch, torch.bfloat16)
        bf16_err = {"logits": rel(g16["logits"], g64["logits"]), "grad_worst": max(rel(g16[n], g64[n]) for n in g64 if n != "logits")}
        if max(bf16_err.values()) <= BF16_BATCH_TOL:
            break
    else:
        raise SystemExit(f"no batch in {MAX_DRAWS} draws whose bf16 gradients are within {BF16_BATCH_TOL} of float64's")
    ref = run(c, w, batch, torch.float64)
    r32 = run(c, w, batch, torch.float32)  # torch's own float32 run: the noise floor for nobubble's

    noise = {"logits": rel(r32["logits"], ref["logits"]), "loss": rel(r32["loss"], ref["loss"]),
             "grad_worst": max(rel(r32["g"][n], ref["g"][n]) for n in ref["g"]), "g.emb": rel(r32["g.emb"], ref["g.emb"]),
             "losses_worst": max(rel(a, b) for a, b in zip(r32["losses"], ref["losses"]))}
    t = {}
    for n, a in w.items():  # bf16 bit patterns: exact copies of the float32 values used
        t["w." + n] = ((a.view(np.uint32) >> 16).astype(np.uint16), "BF16")
    t["batch.dense"] = f32(batch["dense"])
    t["batch.mv"] = (np.concatenate(batch["ids"], 1).view(np.int32), "I32")  # [B, 214] feature after feature
    t["batch.label"] = f32(batch["label"])
    t["logits"] = f32(ref["logits"])
    t["loss"] = f32([ref["loss"]])
    for n, g in ref["g"].items():
        t["g." + n] = f32(g)
    t["g.emb.rows"] = (ref["touched"], "I32")
    t["g.emb"] = f32(ref["g.emb"])
    t["losses"] = f32(ref["losses"])
    meta = {"E": str(c["E"]), "blocks": str(c["blocks"]), "cross_rank": str(c["cross_rank"]),
            "top": ",".join(map(str, c["top"])), "hot": ",".join(map(str, HOT)),
            "cat_rows": ",".join(map(str, CAT_ROWS)), "B": str(B), "steps": str(STEPS), "lr": repr(LR), "eps": repr(EPS),
            "emb_eps": repr(EMB_EPS),
            "torch": torch.__version__, "torch32_err": " ".join(f"{k}={v:.2e}" for k, v in noise.items()),
            "torch_bf16_err": f"batch draw {draw}: " + " ".join(f"{k}={v:.2e}" for k, v in bf16_err.items())}
    write_safetensors(args.out, t, meta)
    print(f"loss {ref['loss']:.9f} losses {' '.join(f'{x:.6f}' for x in ref['losses'])}")
    print("torch float32 vs float64: " + meta["torch32_err"])
    print("torch bfloat16 vs float64: " + meta["torch_bf16_err"])
    print(f"touched rows {len(ref['touched'])}; wrote {args.out}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gen")
    g.add_argument("--out", required=True)
    gen(ap.parse_args())


if __name__ == "__main__":
    main()
