#!/usr/bin/env python3
"""The held-out loss nobubble's `eval` reports, computed by transformers: a Hugging Face model
directory on a nobubble token shard (uint16 or uint32 layout) and its loss mask (SHARD.mask from
`nobubble tokenize --chat`, when present), batch k = tokens [k*B*T, k*B*T + B*T + 1) as nobubble's
loader takes them, the mean cross-entropy over the targets the mask keeps. Prints one JSON line.

    python3 tests/torch/heldout_loss.py --model DIR --data val.bin --batch 1 --seq 1024 --batches 8 [--dtype fp32]
"""
import argparse
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
import transformers


def read_shard(path):
    head = np.fromfile(path, dtype=np.int32, count=256)
    magic, n = int(head[0]), int(head[2])
    if magic not in (20240520, 20240801):
        sys.exit(f"{path}: not a token shard (magic {magic})")
    return np.fromfile(path, dtype=np.uint32 if magic == 20240801 else np.uint16, offset=1024, count=n).astype(np.int64)


def read_mask(path, n):
    if not os.path.exists(path):
        return None
    head = np.fromfile(path, dtype=np.int32, count=256)
    if int(head[0]) != 20261205 or int(head[2]) != n:
        sys.exit(f"{path}: not the mask of a {n}-token shard")
    return np.fromfile(path, dtype=np.uint8, offset=1024, count=n)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--batches", type=int, required=True)
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    a = ap.parse_args()
    tok = read_shard(a.data)
    mask = read_mask(a.data + ".mask", len(tok))
    dt = torch.float32 if a.dtype == "fp32" else torch.bfloat16
    model = transformers.AutoModelForCausalLM.from_pretrained(a.model, torch_dtype=dt).cuda().eval()
    span, total, counted = a.batch * a.seq, 0.0, 0
    with torch.no_grad():
        for k in range(a.batches):
            w = torch.from_numpy(tok[k * span: k * span + span + 1]).cuda()
            x, y = w[:-1].view(a.batch, a.seq), w[1:].reshape(-1)
            logits = model(input_ids=x).logits.float().reshape(-1, model.config.vocab_size)
            losses = F.cross_entropy(logits, y, reduction="none").double()
            keep = torch.ones_like(losses) if mask is None else torch.from_numpy(mask[k * span + 1: k * span + span + 1]).cuda().double()
            total += float((losses * keep).sum())
            counted += int(keep.sum())
    print(json.dumps({"loss": total / counted, "targets": counted, "batches": a.batches, "dtype": a.dtype}))


if __name__ == "__main__":
    main()
