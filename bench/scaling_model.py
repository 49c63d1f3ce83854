#!/usr/bin/env python3
"""Scaling model (issue 15): projected step time and weak-scaling efficiency of data-parallel gpt2
124M and of sharded seqctr on N GPUs, from measured single-GPU stage times and link bandwidths.
A MODEL, not a measurement: every input is a flag; defaults and their sources are in --help.

Links: G GPUs per node on NVLink (--nvlink-gbs one way per GPU, --nvlink-us per message); between
nodes one NIC per GPU (--net-gbs, --net-us; ASSUMPTION: 400 Gb/s = 50 GB/s). A collective over
N <= G GPUs runs on NVLink, over N > G on the network (the slowest link).
  ring all-reduce of b bytes:  2(N-1)/N * b / bw + 2(N-1) * lat          (--allreduce ring)
  hierarchical (N > G):        ring in the node over NVLink on b, then a ring over the N/G nodes on
                               b/G per GPU (each GPU its own rail) over the network    (--allreduce hier)
  all-to-all, b bytes per rank: max((min(N,G)-1)/N * b / nvlink, (N-min(N,G))/N * b / net)
                               + lat + (N-1) * --msg-us   (for N <= G: (N-1)/N * b / bw + lat + ...)
Weak scaling: the per-GPU batch is fixed, so compute per GPU stays the single-GPU time; efficiency
= t(1) / t(N). Compute is not slowed by communication unless --contention X (the overlapped part
of the communication adds X of itself to the step).

gpt2, data parallel (nobubble's buckets, src/run/tf_family.c): one bucket per layer, all-reduced
in fp32 as soon as that layer's backward ends, FIFO on one comm lane; the embeddings + final norm
bucket (2 calls) only after the embedding backward (the tied head's gradient is complete then);
then AdamW. The step's compute is split by FLOPs per token (README's formula): forward (1 -
--bwd-frac), backward --bwd-frac; the head's backward runs before the layers'.
  sync:       every bucket after the backward:  t = compute + comm
  overlapped: t = backward end + max(0, comm lane end - backward end) + AdamW
seqctr, sharded (NestPipe / FreeScale setting): tables row-sharded; per step an id all-to-all
(deduplicated ids to their owners), an embedding all-to-all back, the dense part data parallel
(all-reduce of its fp32 gradient), a gradient all-to-all to the owners. Phases from RESULTS.md.
  sync:       t = phases + all four collectives
  overlapped: the next step's ids go during this step's forward; the dense all-reduce hides behind
              the history and embedding backward; the embedding and gradient all-to-alls exposed
  pipe:       (NestPipe-style) all communication hidden behind compute except --pipe-exposed of it:
              t = compute + f * comm + max(0, (1 - f) * comm - compute); the table also gives the f
              at which the efficiency at the largest N equals NestPipe's published 94.07% (1,536 workers)
--check RUNS.json (bench/ranks_bench.sh's output): the same gpt2 rule applied to measured CPU runs
(stage times from their traces, the link from test_comm --bench) against what they measured.
Stdlib only, deterministic.
"""
import argparse, json, math, sys

NESTPIPE_EFF = 0.9407  # NestPipe's published scaling efficiency at 1,536 workers


# ------------------------------------------------------------------ links and collectives

def allreduce_ms(b, n, a):
    """One all-reduce of b bytes over n GPUs (ms)."""
    if n <= 1 or b <= 0:
        return 0.0
    g = a.gpus_per_node
    if n <= g:
        return 2 * (n - 1) / n * b / (a.nvlink_gbs * 1e6) + 2 * (n - 1) * a.nvlink_us / 1e3
    if a.algo == "ring":
        return 2 * (n - 1) / n * b / (a.net_gbs * 1e6) + 2 * (n - 1) * a.net_us / 1e3
    m = math.ceil(n / g)
    return (2 * (g - 1) / g * b / (a.nvlink_gbs * 1e6) + 2 * (g - 1) * a.nvlink_us / 1e3
            + 2 * (m - 1) / m * (b / g) / (a.net_gbs * 1e6) + 2 * (m - 1) * a.net_us / 1e3)


def alltoall_ms(b, n, a):
    """One all-to-all with b bytes leaving each rank, spread evenly over the n ranks (ms)."""
    if n <= 1 or b <= 0:
        return 0.0
    g = min(n, a.gpus_per_node)
    intra, inter = (g - 1) / n * b, (n - g) / n * b
    lat = a.nvlink_us if n <= a.gpus_per_node else a.net_us
    return max(intra / (a.nvlink_gbs * 1e6), inter / (a.net_gbs * 1e6)) + lat / 1e3 + (n - 1) * a.msg_us / 1e3


# ------------------------------------------------------------------ data-parallel transformer

def tf_buckets(layers, dim, vocab_padded, seq):
    """fp32 gradient bytes of nobubble's buckets, in the order the backward completes them: layer
    L-1 .. 0 (one call each), then the embeddings and the final norm (two calls)."""
    layer = 4 * (12 * dim * dim + 13 * dim)
    return [[layer]] * layers + [[4 * (vocab_padded + seq) * dim, 4 * 2 * dim]]


def tf_stages_from_flops(step_ms, opt_ms, bwd_frac, layers, dim, vocab, seq):
    """Split a measured step into pre (forward + the head's backward), per-layer backward, tail, opt."""
    f_layer, f_head = 72 * dim * dim + 12 * dim * seq, 6 * vocab * dim
    f = layers * f_layer + f_head
    comp = step_ms - opt_ms
    pre = (1 - bwd_frac) * comp + bwd_frac * comp * f_head / f
    return {"pre": pre, "layer_bwd": [bwd_frac * comp * f_layer / f] * layers, "tail": 0.0, "opt": opt_ms, "rest": 0.0}


def dp_step(st, buckets, n, a, schedule):
    """Returns (step ms, comm busy ms, exposed ms) under the bucket rule of the docstring."""
    t, free, total = st["pre"], 0.0, 0.0
    ready = []
    for lb in st["layer_bwd"]:
        t += lb
        ready.append(t)
    t += st["tail"]
    ready.append(t)
    bwd_end = t
    for r, calls in zip(ready, buckets):
        for b in calls:
            c = allreduce_ms(b, n, a)
            free = max(free, bwd_end if schedule == "sync" else r) + c
            total += c
    exposed = max(0.0, free - bwd_end)
    step = bwd_end + exposed + st["opt"] + st["rest"] + a.contention * (total - exposed)
    return step, total, exposed


# ------------------------------------------------------------------ sharded seqctr

PHASES = ["emb_fwd", "hist_fwd", "dense_fwd", "dense_bwd", "hist_bwd", "emb_bwd", "emb_opt", "dense_opt"]


def ctr_step(a, n, schedule):
    p = dict(zip(PHASES, a.ctr_phases))
    comp = sum(p.values())
    ids = alltoall_ms(a.ctr_unique * a.ctr_id_bytes, n, a)
    emb = alltoall_ms(a.ctr_unique * a.ctr_emb_dim * a.ctr_row_bytes, n, a)
    grad = alltoall_ms(a.ctr_unique * a.ctr_emb_dim * a.ctr_row_bytes, n, a)
    ar = allreduce_ms(a.ctr_dense_params * 4, n, a)
    comm = ids + emb + grad + ar
    if schedule == "sync":
        step = comp + comm
    elif schedule == "overlapped":
        e1 = emb                                                   # forward waits for its rows
        t_d = e1 + p["emb_fwd"] + p["hist_fwd"] + p["dense_fwd"] + p["dense_bwd"]
        ar_end = max(t_d, e1 + ids) + ar                           # next ids, then the all-reduce
        t_e = t_d + p["hist_bwd"] + p["emb_bwd"]
        g_end = max(t_e, ar_end) + grad
        d_end = max(t_e, ar_end) + p["dense_opt"]
        step = max(d_end, g_end) + p["emb_opt"]
    else:
        f = a.pipe_exposed
        step = comp + f * comm + max(0.0, (1 - f) * comm - comp)
    hidden = comm - (step - comp)
    return step + a.contention * max(0.0, hidden), comm, step - comp


def pipe_fraction_for(eff, a, n):
    """The exposed fraction f at which the pipe schedule's efficiency at n is eff (None if unreachable)."""
    p = sum(a.ctr_phases)
    c = ctr_step(a, n, "sync")[1]
    f = (p / eff - p) / c if c > 0 else None
    return f if f is not None and 0 <= f <= 1 and c <= p / eff else None


# ------------------------------------------------------------------ tables

def projection(a):
    out = []
    for algo in a.allreduce.split(","):
        a.algo = algo
        if "gpt2" in a.models:
            st = tf_stages_from_flops(a.gpt2_step_ms, a.gpt2_opt_ms, a.bwd_frac, 12, 768, 50257, 1024)
            bk = tf_buckets(12, 768, 50304, 1024)
            t1 = a.gpt2_step_ms
            print(f"\nMODEL gpt2 124M data parallel, B=32 x 1024 per GPU (weak scaling), fp32 gradients "
                  f"{sum(map(sum, bk)) / 1e6:.1f} MB in {sum(map(len, bk))} calls, all-reduce {algo}; t(1) = {t1} ms")
            print("| N | sync ms | sync comm exposed | sync eff | overlapped ms | overlapped exposed | overlapped eff | comm busy |")
            print("|---|---|---|---|---|---|---|---|")
            for n in a.n:
                s, c, e = dp_step(st, bk, n, a, "sync")
                o, _, eo = dp_step(st, bk, n, a, "overlapped")
                out.append({"model": "gpt2", "allreduce": algo, "n": n, "sync_ms": s, "overlapped_ms": o, "comm_ms": c})
                print(f"| {n} | {s:.2f} | {e:.2f} | {t1 / s:.1%} | {o:.2f} | {eo:.2f} | {t1 / o:.1%} | {c:.2f} |")
        if "seqctr" in a.models:
            t1 = sum(a.ctr_phases)
            print(f"\nMODEL seqctr sharded, B=4096 per GPU (weak scaling), {a.ctr_unique} unique rows per GPU per step, "
                  f"E={a.ctr_emb_dim}, dense {a.ctr_dense_params / 1e6:.2f} M params, all-reduce {algo}; t(1) = {t1:.2f} ms "
                  f"(GPU phases); pipe exposes {a.pipe_exposed:.0%} of the communication")
            print("| N | sync ms | sync eff | overlapped ms | overlapped exposed | overlapped eff | pipe ms | pipe eff | comm busy |")
            print("|---|---|---|---|---|---|---|---|---|")
            for n in a.n:
                s, c, _ = ctr_step(a, n, "sync")
                o, _, eo = ctr_step(a, n, "overlapped")
                p, _, _ = ctr_step(a, n, "pipe")
                out.append({"model": "seqctr", "allreduce": algo, "n": n, "sync_ms": s, "overlapped_ms": o, "pipe_ms": p, "comm_ms": c})
                print(f"| {n} | {s:.2f} | {t1 / s:.1%} | {o:.2f} | {eo:.2f} | {t1 / o:.1%} | {p:.2f} | {t1 / p:.1%} | {c:.2f} |")
            f = pipe_fraction_for(NESTPIPE_EFF, a, a.n[-1])
            print(f"NestPipe's {NESTPIPE_EFF:.2%} at {a.n[-1]} GPUs, in this model: the pipe schedule exposing "
                  + (f"{f:.1%} of the communication" if f is not None else "no fraction reaches it (communication > compute)"))
    return out


def check(a):
    try:
        runs = json.load(open(a.check))["runs"]
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"scaling_model: cannot read runs '{a.check}': {e}")
    one = {}
    for r in runs:
        if r["ranks"] == 1:
            one.setdefault(r["batch"], []).append(r)
    a.gpus_per_node, a.algo = 1 << 30, "ring"  # one machine: every rank on the local link
    print("CHECK the data-parallel rule against measured runs (model vs measured, ms; rel err = model / measured - 1)")
    print("| batch | ranks | run | link GB/s, lat us | quantity | model | measured | rel err |")
    print("|---|---|---|---|---|---|---|---|")
    errs = []
    for r in runs:
        n, l, sh = r["ranks"], r.get("link"), r.get("shape")
        if n == 1 or not l or not sh:
            continue
        a.nvlink_us = l["small_us"] / (2 * (n - 1))                    # the 4 KB all-reduce is 2(N-1) latencies
        a.nvlink_gbs = 2 * (n - 1) / n * l["mb"] * 1e6 / ((l["ms"] - l["small_us"] / 1e3) * 1e6)
        a.msg_us, a.contention = 0.0, 0.0
        bk = tf_buckets(sh["layers"], sh["dim"], sh["vocab_padded"], sh["seq"])
        base = sorted(one.get(r["batch"], []), key=lambda x: x.get("repeat", 1) != r.get("repeat", 1))  # same repeat first
        rest1 = base[0]["split"]["rest"] if base else 0.0
        s = r["split"]
        st = {"pre": s["stage_fwd"] + s["stage_head"], "layer_bwd": [s["stage_bwd"] / sh["layers"]] * sh["layers"],
              "tail": s["stage_tail"], "opt": s["stage_opt"], "rest": rest1 + s["stage_other"]}
        step, comm, exposed = dp_step(st, bk, n, a, "overlapped")
        big = max(b for calls in bk for b in calls)
        rows = [(f"largest all-reduce ({big / 1e6:.1f} MB)", allreduce_ms(big, n, a), s.get("comm_longest", float("nan"))),
                ("comm busy", comm, s["comm"]), ("exposed comm", exposed, s["exposed"]), ("rest (both lanes idle)", st["rest"], s["rest"]),
                ("step (measured compute)", step, r["ms"])]
        if base:
            b = base[0]["split"]
            st1 = {"pre": (b["stage_fwd"] + b["stage_head"]) / n, "layer_bwd": [b["stage_bwd"] / sh["layers"] / n] * sh["layers"],
                   "tail": b["stage_tail"] / n, "opt": b["stage_opt"], "rest": rest1 + b["stage_other"]}
            rows.append(("step (1-rank compute / N)", dp_step(st1, bk, n, a, "overlapped")[0], r["ms"]))
        for q, m, x in rows:
            if not x == x or x <= 0:  # not in this trace (older trace_split.py)
                continue
            e = m / x - 1
            errs.append({"batch": r["batch"], "ranks": n, "repeat": r.get("repeat", 1), "quantity": q, "model": m, "measured": x, "rel_err": e})
            print(f"| {r['batch']} | {n} | {r.get('repeat', 1)} | {a.nvlink_gbs:.2f}, {a.nvlink_us:.1f} | {q} | {m:.2f} | {x:.2f} | {e:+.1%} |")
    if not errs:
        sys.exit("scaling_model: no run with ranks > 1, a link measurement and a shape in " + a.check)
    print("model: the link from test_comm --bench alone (bandwidth from the large all-reduce, latency = the 4 KB one / "
          "2(N-1)); stage times from the same run's trace (the last row: the 1-rank run's / N); rest = the 1-rank run's. "
          "measured: rank 0's trace (its comm spans include waiting for the slower rank) and metrics.jsonl's median ms.")
    return errs


def self_test(a):
    """The formulas at points worked by hand (2 GPUs, 16 GPUs, a made-up two-bucket backward)."""
    a.algo, a.gpus_per_node, a.nvlink_gbs, a.nvlink_us, a.net_gbs, a.net_us, a.msg_us, a.contention = "ring", 8, 400, 2, 50, 5, 0.5, 0
    mb = 400e6  # 400 MB
    checks = [("ring N=2", allreduce_ms(mb, 2, a), 1.0 + 0.004),            # 2*1/2 * 400e6 / 400e9 s + 2 * 2 us
              ("ring N=16 (network)", allreduce_ms(mb, 16, a), 2 * 15 / 16 * 8.0 + 30 * 0.005),
              ("all-to-all N=4", alltoall_ms(mb, 4, a), 0.75 + 0.002 + 3 * 0.0005)]
    a.algo = "hier"
    checks.append(("hier N=16", allreduce_ms(mb, 16, a), 2 * 7 / 8 * 1.0 + 14 * 0.002 + 2 * 1 / 2 * 50e6 / 50e6 + 2 * 0.005))
    a.algo = "ring"
    st = {"pre": 10, "layer_bwd": [5], "tail": 1, "opt": 2, "rest": 0}  # bucket 1 ready at 15, bucket 0 at 16
    checks.append(("dp sync", dp_step(st, [[400e6], [400e6]], 2, a, "sync")[0], 16 + 2 * 1.004 + 2))
    checks.append(("dp overlapped", dp_step(st, [[400e6], [400e6]], 2, a, "overlapped")[0], 15 + 2 * 1.004 + 2))
    bad = [(n, got, want) for n, got, want in checks if abs(got - want) > 1e-9]
    print("scaling_model self-test: " + ("ok" if not bad else f"FAILED {bad}"))
    sys.exit(1 if bad else 0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    A = ap.add_argument
    A("--n", default="1,2,4,8,16,32,64,128,256,512,1024,1536", help="GPU counts (default %(default)s)")
    A("--models", default="gpt2,seqctr", help="gpt2, seqctr or both (default %(default)s)")
    A("--allreduce", default="ring,hier", help="ring (flat, the slowest link), hier (in node, then across nodes), or both")
    A("--gpus-per-node", type=int, default=8, help="GPUs per NVLink node (default 8)")
    A("--nvlink-gbs", type=float, default=400, help="NVLink GB/s one way per GPU (default 400: measured on the 2-GPU machine)")
    A("--net-gbs", type=float, default=50, help="network GB/s per GPU between nodes (default 50 = 400 Gb/s: ASSUMPTION)")
    A("--nvlink-us", type=float, default=2, help="latency per message (ring step) on NVLink, us (default 2: ASSUMPTION)")
    A("--net-us", type=float, default=5, help="latency per message (ring step) between nodes, us (default 5: ASSUMPTION)")
    A("--msg-us", type=float, default=0.5, help="all-to-all: cost per peer message, us (default 0.5: ASSUMPTION)")
    A("--contention", type=float, default=0.0, help="compute slowdown per ms of overlapped communication (default 0: ASSUMPTION)")
    A("--gpt2-step-ms", type=float, default=72.6, help="gpt2 124M B=32 T=1024 bf16 step on one H200, ms "
      "(default 72.6: RESULTS.md, commit c7304d5, --graphs)")
    A("--gpt2-opt-ms", type=float, default=1.1, help="its AdamW, ms (default 1.1: 30 bytes x 124.5 M params at ~3.4 TB/s, derived)")
    A("--bwd-frac", type=float, default=2 / 3, help="backward share of the step's compute (default 2/3: 4 of 6 FLOPs per weight)")
    A("--ctr-phases", default="0.24,2.42,0.64,1.56,2.89,1.12,0.03,0.37",
      help="seqctr B=4096 GPU phases, ms: " + ", ".join(PHASES) + " (default: RESULTS.md's breakdown, H200, sum 9.27 ms)")
    A("--ctr-unique", type=int, default=57163, help="unique embedding rows per GPU per step (default 57163 of 196942 lookups at "
      "B=4096: test_ops_ctr_cuda --bench's batch line, H200, 2026-11-30)")
    A("--ctr-id-bytes", type=int, default=8, help="bytes per id sent to its owner (default 8: table + row, ASSUMPTION)")
    A("--ctr-emb-dim", type=int, default=64, help="embedding width E (default 64)")
    A("--ctr-row-bytes", type=int, default=4, help="bytes per embedding element and per gradient element sent (default 4: fp32)")
    A("--ctr-dense-params", type=float, default=17.36e6, help="dense parameters all-reduced in fp32 (default 17.36 M: the trainer's line)")
    A("--pipe-exposed", type=float, default=0.05, help="pipe: fraction of the communication left exposed (default 0.05: ASSUMPTION)")
    A("--check", metavar="RUNS.json", help="model vs measured for bench/ranks_bench.sh's runs.json")
    A("--json", metavar="FILE", help="also write the rows as JSON")
    A("--self-test", action="store_true", help="check the formulas at points worked by hand")
    a = ap.parse_args()
    if a.self_test:
        self_test(a)
    try:
        a.n = [int(x) for x in a.n.split(",")]
        a.ctr_phases = [float(x) for x in a.ctr_phases.split(",")]
    except ValueError as e:
        sys.exit(f"scaling_model: --n / --ctr-phases: {e}")
    if len(a.ctr_phases) != len(PHASES) or any(n < 1 for n in a.n):
        sys.exit(f"scaling_model: --ctr-phases needs {len(PHASES)} values, --n positive counts")
    for s in a.allreduce.split(","):
        if s not in ("ring", "hier"):
            sys.exit(f"scaling_model: --allreduce '{s}': ring or hier")
    rows = check(a) if a.check else projection(a)
    if a.json:
        json.dump(rows, open(a.json, "w"), indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
