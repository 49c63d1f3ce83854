#!/usr/bin/env python3
"""Times PyTorch's SDPA backends (flash, cuDNN, efficient) at a causal attention shape, forward and
forward+backward, and checks whether each backward repeats bit for bit. With --log-once it runs the
cuDNN backend once (for CUDNN_LOGLEVEL_DBG / CUDNN_FRONTEND_LOG_INFO captures) and exits.
  python3 bench/sdpa_probe.py [--B 32] [--H 12] [--T 1024] [--D 64] [--log-once]"""
import argparse, torch
from torch.nn.attention import sdpa_kernel, SDPBackend
import torch.nn.functional as F

ap = argparse.ArgumentParser()
ap.add_argument("--B", type=int, default=32); ap.add_argument("--H", type=int, default=12)
ap.add_argument("--T", type=int, default=1024); ap.add_argument("--D", type=int, default=64)
ap.add_argument("--iters", type=int, default=20); ap.add_argument("--log-once", action="store_true")
a = ap.parse_args()
torch.manual_seed(0)
dev = "cuda"
q, k, v = (torch.randn(a.B, a.H, a.T, a.D, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
do = torch.randn(a.B, a.H, a.T, a.D, device=dev, dtype=torch.bfloat16)
print(f"torch {torch.__version__} cudnn {torch.backends.cudnn.version()} shape B={a.B} H={a.H} T={a.T} D={a.D}")
flops_f = 4 * a.B * a.H * a.T * a.T * a.D / 2  # causal: half the tiles
flops_b = 2.5 * flops_f

def run(backend, bwd):
    with sdpa_kernel([backend]):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        if bwd:
            return o, torch.autograd.grad(o, (q, k, v), do)
        return o, None

if a.log_once:
    run(SDPBackend.CUDNN_ATTENTION, True); torch.cuda.synchronize(); raise SystemExit(0)

for name, be in [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                 ("efficient", SDPBackend.EFFICIENT_ATTENTION)]:
    try:
        for _ in range(3): run(be, True)
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(a.iters): run(be, False)
        e.record(); torch.cuda.synchronize(); tf = s.elapsed_time(e) / a.iters
        s.record()
        for _ in range(a.iters): run(be, True)
        e.record(); torch.cuda.synchronize(); tfb = s.elapsed_time(e) / a.iters
        tb = tfb - tf
        _, g1 = run(be, True); _, g2 = run(be, True)
        same = all(torch.equal(x, y) for x, y in zip(g1, g2))
        print(f"{name:9s} fwd {tf:.3f} ms ({flops_f / tf / 1e9:.0f} TFLOP/s)  bwd {tb:.3f} ms "
              f"({flops_b / tb / 1e9:.0f} TFLOP/s)  backward repeats bitwise: {same}")
    except Exception as ex:
        print(f"{name:9s} failed: {str(ex).splitlines()[0][:200]}")
