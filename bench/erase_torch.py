#!/usr/bin/env python3
"""ERASE as the paper built it, in PyTorch (issue 5): side CUDA streams, torch.autograd.backward on
each detached segment's local loss, blocking and thread-pool dispatch, for the seqctr configuration
of bench/erase_seqctr.sh, on the samples of a `nobubble synth-dump` file. The PyTorch anchor of
nobubble's `--detach all --schedule erase` numbers.

  python3 bench/erase_torch.py --data synth.bin --batch 1024,4096 --steps 50 --json erase_torch.jsonl
  /usr/bin/python3 bench/erase_torch.py --check          (float64 on the CPU: the schedules' gradients agree)
  /usr/bin/python3 bench/erase_torch.py --device cpu --dtype fp32 --data small.bin --batch 64 --steps 3   (smoke)
  python3 bench/erase_torch.py --table erase_torch.jsonl --nb-best 1024=78530:erase-blocking   (no torch needed)

The model, the dump reader, the batch staging, the step timer and the throughput rule are
bench/seqctr_torch.py's, imported as they are (its docstring describes the model; the same flags
give the same model and, with the same --seed, the same initial weights). Segments: with every
block detached (nobubble's `--detach all`), block 0 reads x0 as both of its inputs and block
i >= 1 reads x0 (attached) and x_{i-1}.detach(); every block's head has a BCE loss, weighted
--aux-weight (default 1, nobubble's default with --detach) except the last block's (weight 1).
So the six segments {block i, head i} have disjoint autograd graphs that meet only in x0.

Configurations (--configs, all four by default):
  baseline        seqctr_torch.py's eager step: the undetached model, the last head's loss only
                  (aux weight 0, nobubble's default without --detach), one loss.backward().
  detached-plain  the detached blocks, loss = the sum of every head's weighted BCE, one backward.
  erase-blocking  ERASE, the main thread dispatches: x0 (bottom MLP, embedding lookup, history
                  encoder, target attention) on the main stream; then for block i = 0..5: its
                  forward and its head's loss on side stream i mod K (--side-streams K, default 4,
                  as nobubble's --side-lanes), after waiting the event recorded behind block i-1's
                  forward (x0's event for block 0); record an event; then, on that side stream,
                  torch.autograd.backward(loss_i) (retain_graph is not needed: the segments'
                  graphs are disjoint and each is walked once). The call returns when autograd has
                  launched the segment's backward, and the main thread goes on with block i+1.
                  After the last block the main stream waits for every side stream, x0's gradient
                  is joined (below) and backpropagated through the history, bottom MLP and
                  embedding on the main stream; then the optimizers, on the main stream.
  erase-async     the same, but each torch.autograd.backward(loss_i) is submitted to a worker
                  thread: K ThreadPoolExecutors of one worker each, executor k for side stream k
                  (so K worker threads, one per side stream, as nobubble's one dispatcher thread per
                  side lane); the main thread goes on with block i+1's forward at once. All futures
                  are joined before x0's backward and the optimizer step.
The optimizers of every configuration are seqctr_torch.py's: fused AdamW on the dense part,
torch.optim.Adagrad (element-wise, nobubble's is row-wise) on the sparse embedding gradient.
loss_first / loss_last are the step's total loss: the last head's BCE for baseline, the sum of the
weighted heads for the other three (the loss their backward differentiates).

x0, the boundary (the choice this file makes): x0 is read by every segment, so its gradient has
six contributions produced on up to K streams, from up to K threads. Accumulating them into one
leaf's .grad from concurrent backward calls would make AccumulateGrad run concurrently on the same
tensor (a race, and an order that depends on timing). Instead each segment i reads its own leaf
x0_i = x0.detach().requires_grad_() (the same storage, no copy); its backward deposits d x0 in
x0_i.grad alone (block i's parameter gradients are likewise touched by segment i only). After the
join the main stream sums x0_0.grad + x0_1.grad + .. + x0_5.grad in segment order (nobubble's join
order, so the result does not depend on which segment finished first) and calls x0.backward(sum).
torch.autograd.grad(loss_i, x0_i) would do the same for x0 but not accumulate the parameters'
gradients; separate leaves with plain backward do both.

Streams, and PyTorch's stream semantics of backward: autograd runs every backward op on the stream
its forward op ran on, not on the stream that is current when backward() is called (PyTorch's
CUDA notes, "Stream semantics of backward passes"). A segment whose forward ran on the main stream
would therefore run its backward on the main stream, whatever stream wraps the backward() call, and
nothing would overlap. So each segment's forward runs on its side stream (--fwd-stream side, the
default): block i's forward on stream i mod K, chained to block i-1's by an event, its backward
after it on the same stream, where it overlaps block i+1's forward on the next stream. With K = 4 and
6 blocks, block 4's forward queues behind segment 0's backward on stream 0 (and block 5's behind
segment 1's), as streams are in-order queues. --fwd-stream main keeps every forward on the main
stream and only wraps the backward() calls in the side streams (event recorded on the main stream,
waited on the side stream): the literal recipe; by the rule above its backward kernels land on the
main stream, so it is expected to overlap nothing (kept to measure exactly that). A tensor that is
made on one stream and read on another (x_{i-1}) is record_stream()'d for the reader, so the
caching allocator does not hand its memory to the maker's stream while the reader may still read
it. PyTorch's CUDA autograd engine runs the backward nodes of a device on one engine thread per
device, whichever Python thread called backward(): "async" lets the main thread launch the next
forward while that engine thread launches the backward; "blocking" makes the main thread wait for it.

On the CPU there are no streams: every stream is None, the stream helpers (use, record, wait, keep,
join) do nothing, and the same code paths run (the async one with its real worker threads). That
is what --check uses: a tiny model in float64 on the CPU, one batch (empty and full histories), the
backward of every configuration, and all parameter gradients (the sparse embedding gradient
densified) compared: detached-plain, erase-blocking and erase-async pairwise (they must agree to
1e-12 relative, norm of the difference over the norm, per tensor); also seqctr_torch.py's
SeqCTRDense.forward against this file's split forward with nothing detached (the x0 part is
written again here, front(); they must agree to 1e-12), and the detached gradients against the
undetached ones (they must differ: the detachment is real). Exit 1 when a check fails.

Timing: seqctr_torch.py's rule (its docstring): all batches staged on the device first, --warmup
untimed steps, then --steps steps with a CUDA event at every step boundary on the main stream
(every side stream is joined into it before the step's optimizer step, so the boundary covers all
of the step's work), p90 samples/s = B / the nearest-rank 90th percentile of the step times.
One JSON line per configuration and batch size (--json FILE appends all fields: seqctr_torch.py's
fields plus config, side_streams, fwd_stream, aux_weight).
"""
import argparse
import contextlib
import datetime
import os
import sys
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seqctr_torch as S  # noqa: E402  (the model, dump reader, staging, timer, throughput rule)

torch, nn, F = S.torch, S.nn, S.F
CONFIGS = ("baseline", "detached-plain", "erase-blocking", "erase-async")
CHECK_TOL = 1e-12


def fail(msg, hint):
    print(f"erase_torch: error: {msg} (hint: {hint})", file=sys.stderr)
    sys.exit(2)


# ------------------------------------------------------------------------------ streams (optional)

class Lanes:
    """The step's streams: main (the stream current at the start, where the timer's events go) and
    K side streams. On the CPU all are None and every helper does nothing."""

    def __init__(self, cuda, k):
        self.main = torch.cuda.current_stream() if cuda else None
        self.side = [torch.cuda.Stream() if cuda else None for _ in range(k)]

    @staticmethod
    def use(stream):
        return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()

    @staticmethod
    def record(stream):
        if stream is None:
            return None
        ev = torch.cuda.Event()
        ev.record(stream)
        return ev

    @staticmethod
    def wait(stream, ev):
        if stream is not None and ev is not None:
            stream.wait_event(ev)

    @staticmethod
    def keep(t, stream):
        """t was made on another stream and is read on this one: tell the caching allocator."""
        if stream is not None:
            t.record_stream(stream)

    def join(self):
        if self.main is not None:
            for s in self.side:
                self.main.wait_stream(s)


# ------------------------------------------------------------------------------ the model, split

def build(args, d, dev, aux_weight, dtype=None):
    """seqctr_torch.py's model and embedding, initialised as there (same seed, same order)."""
    torch.manual_seed(args.seed)
    total_rows = sum(d["cat_rows"]) + d["item_rows"]
    emb = nn.Embedding(total_rows + 1, args.emb_dim, padding_idx=total_rows, sparse=True, device=dev)
    with torch.no_grad():
        emb.weight.normal_(0.0, 0.05)
        emb.weight[total_rows].zero_()
    model = S.SeqCTRDense(args.emb_dim, args.heads, args.hist_layers, args.blocks, args.cross_rank,
                          args.block_hidden, aux_weight).to(dev)
    S.init_like_nobubble(model)
    if dtype is not None:
        emb, model = emb.to(dtype), model.to(dtype)
    model.train()
    return emb, model, total_rows


def front(m, dense, e, valid, has):
    """x0 = [bottom | 26 cat | target | pooled]: SeqCTRDense.forward up to the blocks, the same ops
    (--check compares the two)."""
    B, E = dense.shape[0], m.E
    bot = m.bottom(dense)
    t = e[:, S.NCAT]
    h = e[:, S.NCAT + 1:]
    for layer in m.hist:
        h = layer(h, valid)
    k, v = m.wkv(h).split(E, dim=-1)
    pooled = S.attend(m.wq(t)[:, None, None, :], k[:, None], v[:, None], valid).reshape(B, E) * has
    return torch.cat([bot, e[:, :S.NCAT].reshape(B, S.NCAT * E), t, pooled], dim=1)


def head_loss(m, i, x, label):
    """Block i's head: its BCE (fp32 under autocast), weighted as in SeqCTRDense.forward."""
    z = m.blocks[i].head(x).squeeze(1)
    bce = F.binary_cross_entropy_with_logits(z if z.dtype == torch.float64 else z.float(), label)
    return bce if i == len(m.blocks) - 1 else m.aux_weight * bce


def inputs(emb, bt):
    return bt["dense"], emb(bt["idx"]), bt["valid"], bt["has"]


# ------------------------------------------------------------------------------ the configurations

def step_module(model, emb, bt, autocast):
    """baseline: seqctr_torch.py's eager fwd_bwd (the module's own forward)."""
    with autocast:
        loss = model(*inputs(emb, bt), bt["label"])
    loss.backward()
    return loss


def step_plain(model, emb, bt, autocast, detach=True):
    """detached-plain (detach=False: the split forward with nothing detached, for --check)."""
    with autocast:
        x0 = front(model, *inputs(emb, bt))
        x, loss = x0, 0.0
        for i, blk in enumerate(model.blocks):
            x = blk(x0, x.detach() if detach and i > 0 else x)
            loss = loss + head_loss(model, i, x, bt["label"])
    loss.backward()
    return loss


def backward_on(stream, loss):
    """One segment's backward, with stream current (the segment's forward ran there, so autograd
    puts its backward ops there; the call itself only waits for autograd to launch them)."""
    with Lanes.use(stream):
        torch.autograd.backward(loss)


def step_erase(model, emb, bt, autocast, lanes, pools, fwd_main):
    """erase-blocking (pools None) and erase-async (pools: one single-worker executor per side
    stream). The module docstring explains the streams and the x0 boundary."""
    main, K = lanes.main, len(lanes.side)
    with autocast:
        x0 = front(model, *inputs(emb, bt))
    n = len(model.blocks)
    x0s = [x0.detach().requires_grad_() for _ in range(n)]   # one boundary leaf per segment
    ev, prev = Lanes.record(main), main
    x, seg_losses, futures = None, [], []
    for i, blk in enumerate(model.blocks):
        side = lanes.side[i % K]
        fs = main if fwd_main else side                       # block i's forward (and backward) stream
        if fs is not prev:
            Lanes.wait(fs, ev)
        with Lanes.use(fs):
            if i == 0:
                xin = x0s[0]                                  # block 0 reads x0 twice: one leaf
            else:
                if fs is not prev:
                    Lanes.keep(x, fs)
                xin = x.detach()
            with autocast:
                x = blk(x0s[i], xin)
                li = head_loss(model, i, x, bt["label"])
        ev, prev = Lanes.record(fs), fs
        if side is not fs:                                    # --fwd-stream main: the literal recipe
            Lanes.wait(side, ev)
        if pools is None:
            backward_on(side, li)
        else:
            futures.append(pools[i % K].submit(backward_on, side, li))
        seg_losses.append(li.detach())
    for f in futures:
        f.result()                                            # re-raises a worker's exception
    lanes.join()
    g = x0s[0].grad
    for t in x0s[1:]:
        g = g + t.grad                                        # segment order: deterministic
    x0.backward(g)
    loss = seg_losses[0]
    for li in seg_losses[1:]:
        loss = loss + li
    return loss


def make_step(config, model, emb, autocast, lanes, pools, fwd_main):
    if config == "baseline":
        return lambda bt: step_module(model, emb, bt, autocast)
    if config == "detached-plain":
        return lambda bt: step_plain(model, emb, bt, autocast)
    return lambda bt: step_erase(model, emb, bt, autocast, lanes, pools if config == "erase-async" else None, fwd_main)


@contextlib.contextmanager
def executors(config, k):
    pools = [ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"erase-side{j}") for j in range(k)] \
        if config == "erase-async" else None
    try:
        yield pools
    finally:
        for p in pools or ():
            p.shutdown(wait=True)


# ------------------------------------------------------------------------------ one timed run

def train_and_time(args, d, batches, config, B):
    """seqctr_torch.py's train_and_time with the configuration's forward + backward."""
    cuda = args.device == "cuda"
    dev = torch.device(args.device)
    emb, model, total_rows = build(args, d, dev, 0.0 if config == "baseline" else args.aux_weight)
    dense_params, opts = S.optimizers(args, model, emb, cuda)
    autocast = S.bf16_autocast(args)
    lanes = Lanes(cuda, args.side_streams)
    with executors(config, args.side_streams) as pools:
        fwd_bwd = make_step(config, model, emb, autocast, lanes, pools, args.fwd_stream == "main")
        return S.train_timed(args, dev, B, batches, fwd_bwd, opts, dense_params, total_rows)


def run_config(args, meta, d, batches, config, B):
    rec = dict(meta, impl=f"torch-{config}", config=config, batch=B, steps=args.steps, warmup=args.warmup,
               side_streams=args.side_streams if config.startswith("erase") else None,
               fwd_stream=args.fwd_stream if config.startswith("erase") else None,
               aux_weight=0.0 if config == "baseline" else args.aux_weight,
               date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    return S.run_guarded(args, rec, S.est_cost_s("eager", args.warmup + args.steps),
                         lambda: train_and_time(args, d, batches, config, B))


def bench(args):
    if torch is None:
        fail("PyTorch is not installed here", "run on the GPU machine (its python3 has torch)")
    if not args.data:
        fail("--data FILE is required", "write one with 'nobubble synth-dump --samples N --out FILE'")
    configs = parse_configs(args.configs)
    if args.device == "cuda":
        S.check_cuda()
    batch_sizes = S.check_shapes(args)
    d, rows, meta, read_s = S.load_data(args)
    print(f"torch {meta['torch']} (CUDA {meta['cuda']}) on {meta['device']}; "
          f"{'fp32 weights + bf16 autocast' if args.dtype == 'bf16' else 'fp32'}; {args.blocks} blocks, "
          f"aux weight {args.aux_weight:g} (detached configurations), {args.side_streams} side streams, "
          f"segments' forward on {'their side streams' if args.fwd_stream == 'side' else 'the main stream'}; configurations: {', '.join(configs)}", flush=True)
    S.print_data(d, read_s)
    status = 0
    for B in batch_sizes:
        batches = S.stage_for(args, d, rows, B)
        for config in configs:
            rec = run_config(args, meta, d, batches, config, B)
            S.emit(args, rec, ("config",))
            if rec["status"] in ("error", "nonfinite loss"):
                status = 1
        del batches
        S.release_memory()
    return status


def parse_configs(text):
    configs = [c for c in text.split(",") if c]
    for c in configs:
        if c not in CONFIGS:
            fail(f"unknown configuration '{c}'", f"use a comma list of {', '.join(CONFIGS)}")
    if not configs:
        fail("--configs is empty", f"use a comma list of {', '.join(CONFIGS)}")
    return configs


# ------------------------------------------------------------------------------ --check

def check(args):
    """The schedules against each other on a tiny float64 model on the CPU (module docstring)."""
    import numpy as np
    rng = np.random.default_rng(args.seed)
    B, max_len = 12, 16
    cat_rows, item_rows = [2 + f % 5 for f in range(S.NCAT)], 11     # tiny tables: rows repeat
    lens = rng.integers(0, max_len + 1, B)
    lens[0], lens[1] = 0, max_len                                     # an empty and a full history
    d = dict(n=B, max_len=max_len, cat_rows=cat_rows, item_rows=item_rows,
             dense=rng.standard_normal((B, S.NDENSE)).astype(np.float32),
             cat=rng.integers(0, 1 << 20, (B, S.NCAT)).astype(np.uint32),
             target=rng.integers(0, 1 << 20, B).astype(np.uint32), hist_len=lens.astype(np.int32),
             hist_off=np.concatenate([[0], np.cumsum(lens)]).astype(np.int64),
             hist=rng.integers(0, 1 << 20, int(lens.sum())).astype(np.uint32),
             label=(rng.random(B) < 0.4).astype(np.float32))
    bt = S.stage_batches(d, S.global_rows(d), B, 1, "cpu")[0]
    for k in ("dense", "has", "label"):
        bt[k] = bt[k].double()
    small = argparse.Namespace(**{**vars(args), "emb_dim": 8, "heads": 2, "hist_layers": 1, "cross_rank": 5,
                                  "block_hidden": 7})
    emb, model, _ = build(small, d, "cpu", args.aux_weight, torch.float64)
    none = contextlib.nullcontext()
    lanes = Lanes(False, args.side_streams)

    def grads_of(run):
        model.zero_grad(set_to_none=True)
        emb.zero_grad(set_to_none=True)
        loss = run()
        g = {n: (p.grad.coalesce().to_dense() if p.grad.is_sparse else p.grad.clone())
             for n, p in list(model.named_parameters()) + [("emb.weight", emb.weight)] if p.grad is not None}
        return loss.item(), g

    runs = {"module (undetached)": grads_of(lambda: step_module(model, emb, bt, none)),
            "split (undetached)": grads_of(lambda: step_plain(model, emb, bt, none, detach=False)),
            "detached-plain": grads_of(lambda: step_plain(model, emb, bt, none))}
    for config in ("erase-blocking", "erase-async"):
        with executors(config, args.side_streams) as pools:
            runs[config] = grads_of(lambda: step_erase(model, emb, bt, none, lanes, pools, args.fwd_stream == "main"))

    def compare(a, b):
        (la, ga), (lb, gb) = runs[a], runs[b]
        if set(ga) != set(gb):
            return float("inf"), f"gradients of different parameters: {sorted(set(ga) ^ set(gb))}"
        errs = {"loss": abs(la - lb) / max(abs(lb), 1e-300)}
        for n in ga:
            errs[n] = float((ga[n] - gb[n]).norm() / max(float(gb[n].norm()), 1e-300))
        worst = max(errs, key=errs.get)
        return errs[worst], f"{len(errs)} tensors (loss included), worst {worst}"

    ok = True
    print(f"erase_torch --check: float64 on the CPU, B={B}, E={small.emb_dim}, {small.blocks} blocks, aux weight "
          f"{args.aux_weight:g}, {args.side_streams} side streams (None on the CPU), tolerance {CHECK_TOL:g} relative")
    for a, b in (("module (undetached)", "split (undetached)"), ("detached-plain", "erase-blocking"),
                 ("detached-plain", "erase-async"), ("erase-blocking", "erase-async")):
        e, what = compare(a, b)
        good = e <= CHECK_TOL
        ok &= good
        print(f"  {a} vs {b}: max relative difference {e:.3e} over {what}  {'ok' if good else 'FAIL'}")
    e, what = compare("detached-plain", "split (undetached)")
    good = e > 1e-6 and args.blocks > 1
    ok &= good
    print(f"  detached-plain vs split (undetached), undetached with the same heads: {e:.3e} ({what})  "
          f"{'ok: they differ' if good else 'FAIL: the detachment changes nothing'}")
    print("check: " + ("passed" if ok else "FAILED"))
    return 0 if ok else 1


# ------------------------------------------------------------------------------ rows for erase_seqctr.sh

def table(args):
    """Rows for bench/erase_seqctr.sh's table (its columns: batch, configuration, p90, median, gain
    vs baseline, overlap), then the ratio of nobubble's best erase p90 to torch's best erase p90
    per batch (--nb-best B=P90[:NAME],...)."""
    rows = S.load_jsonl(args.table)
    nb = {}
    for item in filter(None, (args.nb_best or "").split(",")):
        b, _, rest = item.partition("=")
        p, _, name = rest.partition(":")
        try:
            nb[int(b)] = (float(p), name or "erase")
        except ValueError:
            fail(f"--nb-best: '{item}' is not B=P90[:NAME]", "e.g. --nb-best 1024=78530.2:erase-blocking")
    order = {c: k for k, c in enumerate(CONFIGS)}
    rows.sort(key=lambda r: (r.get("batch", 0), order.get(r.get("config"), 9)))
    base, best = {}, {}
    for r in rows:
        if r.get("status") == "ok":
            if r.get("config") == "baseline":
                base[r["batch"]] = r["p90_samples_per_s"]
            if str(r.get("config", "")).startswith("erase") and r["p90_samples_per_s"] > best.get(r["batch"], (0, ""))[0]:
                best[r["batch"]] = (r["p90_samples_per_s"], r["config"])
    for r in rows:
        name = f"torch {r.get('config')}"
        if r.get("status") in ("ok", "nonfinite loss"):
            b = base.get(r["batch"])
            gain = f"{100 * (r['p90_samples_per_s'] / b - 1):+.1f}%" if b else "-"
            note = "" if r["status"] == "ok" else " (nonfinite loss)"
            print(f"| {r['batch']} | {name} | {r['p90_samples_per_s']:.1f}{note} | {r['median_samples_per_s']:.1f} | {gain} | - |")
        else:
            why = (r.get("status", "?") + (f": {r['error']}" if r.get("error") else "")).replace("|", "/")
            print(f"| {r.get('batch')} | {name} | {why} | | | |")
    print("\n| batch | nobubble best erase p90 | torch best erase p90 | nobubble / torch (p90) |\n|---|---|---|---|")
    for B in sorted(set(nb) | set(best)):
        a, t = nb.get(B), best.get(B)
        ratio = f"{a[0] / t[0]:.2f}x" if a and t else "-"
        print(f"| {B} | {f'{a[0]:.1f} ({a[1]})' if a else '-'} | {f'{t[0]:.1f} ({t[1]})' if t else '-'} | {ratio} |")
    if not nb and not best:
        print("| (no results) | | | |")
    return 0


# ------------------------------------------------------------------------------ command line

def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="bench/README.md (ERASE section) explains the numbers.")
    p.add_argument("--data", help="NBSYNTH1 file from 'nobubble synth-dump'")
    p.add_argument("--batch", default="1024,4096", help="comma list of batch sizes [1024,4096]")
    p.add_argument("--steps", type=int, default=50, help="timed steps [50]")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps first [10]")
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"comma list of {', '.join(CONFIGS)} [all]")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: smoke check of this script")
    p.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16", help="bf16: fp32 weights + bf16 autocast [bf16]")
    p.add_argument("--side-streams", type=int, default=4, help="K: segment i on side stream i mod K [4]")
    p.add_argument("--fwd-stream", choices=("side", "main"), default="side",
                   help="where a segment's forward runs (and so its backward): side [side]; main: the literal "
                        "recipe, backward() wrapped in the side stream only (see the docstring)")
    S.add_shape_args(p)
    p.add_argument("--aux-weight", type=float, default=1.0, help="weight of the non-last heads' BCE in the detached "
                   "configurations (baseline: 0) [1]")
    S.add_optim_args(p)
    p.add_argument("--json", help="append one JSON line per result (all fields) to this file")
    p.add_argument("--deadline", type=float, default=0,
                   help="Unix time: a configuration that would start after it (less its rough cost) is skipped")
    p.add_argument("--traceback", action="store_true", help="print the full traceback of a failing configuration")
    p.add_argument("--check", action="store_true", help="float64 CPU check that the schedules' gradients agree, then exit")
    p.add_argument("--table", nargs="+", metavar="JSONL", help="print erase_seqctr.sh's torch rows of these files and exit")
    p.add_argument("--nb-best", help="--table: nobubble's best erase p90 per batch, B=P90[:NAME],...")
    a = p.parse_args(argv)
    if a.steps < 1 or a.warmup < 1:
        fail("--steps and --warmup must be >= 1", "the first step is always a warm-up")
    if a.side_streams < 1:
        fail("--side-streams must be >= 1", "nobubble's default is 4")
    if a.blocks < 1 or a.aux_weight <= 0:
        fail("--blocks must be >= 1 and --aux-weight > 0", "detached blocks need their own loss")
    return a


def main(argv):
    args = parse_args(argv)
    if args.table:
        return table(args)
    if torch is None:
        fail("PyTorch is not installed here", "use a python3 that has torch (Debian's: /usr/bin/python3)")
    if args.check:
        return check(args)
    return bench(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
