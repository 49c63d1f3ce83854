#!/usr/bin/env python3
"""Compare two nobubble run directories for tests/parity_across_commits.sh.

    parity_compare.py [--state-ignore KEY,...] [--meta-ignore KEY,...] [--step-offset N]
                      [--fold-micro-batches] [--labels NAME_A,NAME_B] DIR_A DIR_B

Prints nothing and exits 0 when the runs are the same; otherwise prints one difference per line
and exits 1. What "the same" means:
  - ckpt/: the same file names; state.json equal as parsed JSON (numbers compared as the text
    the writer printed, so 0.1 and 0.10000000149 differ); every other file (model, optimizer,
    table shards) equal byte for byte. For a .safetensors file that differs, the tensors whose
    bytes differ are named, to point at the code that changed them.
  - metrics.jsonl: the same number of lines, and on each line the same keys in the same order
    with the same number text, once the fields that measure time or depend on which rank ran
    slowest (TIMING below) are removed.
Nothing else of a run directory is read (stdout, stderr, loss.svg and timeline.svg are not).
--state-ignore drops dotted state.json keys (e.g. train.attn) from the comparison: an option
added on purpose, named on the command line so the report says so.
Changes made on purpose that leave the computation alone, each named on the command line:
  --meta-ignore K,...    safetensors __metadata__ keys written only by B (e.g. nobubble.fingerprint);
                         a file whose bytes differ only there counts as the same
  --step-offset N        metrics.jsonl's step in B is A's step + N (B counts steps from 1)
  --fold-micro-batches   A recorded --micro-batches as train.grad_accum; B keeps train.grad_accum
                         and train.micro_batches apart: A's grad_accum must equal B's product
"""
import json
import os
import struct
import sys

# metrics.jsonl fields that are measurements of this machine and this moment, not results:
# src/run/run.c write_metrics (ms, <unit>_per_s, bubble_pct, overlap_pct, exposed_pct) and the
# seqctr family's per-rank timings (src/run/sc_family.c sc_metrics: straggler and rank times;
# slowest_* name the share that ran slowest, which a timing decides).
TIMING = {
    "ms", "tokens_per_s", "samples_per_s", "bubble_pct", "overlap_pct", "exposed_pct",
    "straggler_pct", "rank_bubble_pct", "rank_ms_max", "rank_ms_mean", "emulated_ms",
    "slowest_holds_longest", "slowest_samples",
}
MAX_LINES = 8  # differences printed per file
META_IGNORE = set()  # --meta-ignore
STEP_OFFSET = 0  # --step-offset
FOLD_MICRO_BATCHES = False  # --fold-micro-batches
A, B = "A", "B"  # the runs' names in the messages (--labels)


def number(text):
    return ("#", text)  # a tuple: never equal to a string or a list of the parsed JSON


def load_json(path, **kw):
    with open(path) as f:
        return json.load(f, parse_float=number, parse_int=number, **kw)


def show(v):
    if isinstance(v, tuple):
        return v[1]
    return json.dumps(v, default=lambda t: t[1])


def flatten(v, prefix, out):
    if isinstance(v, dict):
        for k, x in v.items():
            flatten(x, f"{prefix}.{k}" if prefix else k, out)
    else:
        out[prefix] = v
    return out


def fold_micro_batches(fb):
    mb = fb.pop("train.micro_batches", None)
    ga = fb.get("train.grad_accum")
    if mb is not None and ga is not None:
        fb["train.grad_accum"] = ("#", str(int(ga[1]) * int(mb[1])))


def compare_state(a, b, ignore):
    fa = flatten(load_json(a), "", {})
    fb = flatten(load_json(b), "", {})
    if FOLD_MICRO_BATCHES:
        fold_micro_batches(fb)
    diffs = []
    for k in list(fa) + [k for k in fb if k not in fa]:
        if any(k == i or k.startswith(i + ".") for i in ignore):
            continue
        if k not in fb:
            diffs.append(f"state.json {k}: only in {A} ({show(fa[k])})")
        elif k not in fa:
            diffs.append(f"state.json {k}: only in {B} ({show(fb[k])})")
        elif fa[k] != fb[k]:
            diffs.append(f"state.json {k}: {show(fa[k])} vs {show(fb[k])}")
    return diffs


def first_diff(a, b):
    """Offset of the first differing byte (the shorter length when one is a prefix), or -1."""
    with open(a, "rb") as fa, open(b, "rb") as fb:
        off = 0
        while True:
            x, y = fa.read(1 << 20), fb.read(1 << 20)
            if x != y:
                n = min(len(x), len(y))
                i = next((i for i in range(n) if x[i] != y[i]), n)
                return off + i
            if not x:
                return -1
            off += len(x)


def read_header(f):
    n = struct.unpack("<Q", f.read(8))[0]
    return n, json.loads(f.read(n))


def safetensors_diff(a, b):
    """What differs between two safetensors files: the tensors' names, dtypes and shapes, the
    metadata other than its checksums, or which tensors' bytes (first few named)."""
    try:
        with open(a, "rb") as fa, open(b, "rb") as fb:
            na, ha = read_header(fa)
            nb, hb = read_header(fb)
            keep = lambda k: "crc32c" not in k and k not in META_IGNORE
            ma = {k: v for k, v in ha.pop("__metadata__", {}).items() if keep(k)}
            mb = {k: v for k, v in hb.pop("__metadata__", {}).items() if keep(k)}
            if set(ha) != set(hb):
                only_a, only_b = sorted(set(ha) - set(hb)), sorted(set(hb) - set(ha))
                return f"other tensors (only in {A}: {' '.join(only_a[:3]) or '-'}; only in {B}: {' '.join(only_b[:3]) or '-'})"
            for k in ha:
                if (ha[k]["dtype"], ha[k]["shape"]) != (hb[k]["dtype"], hb[k]["shape"]):
                    return f"tensor {k}: {ha[k]['dtype']} {ha[k]['shape']} vs {hb[k]['dtype']} {hb[k]['shape']}"
            if ma != mb:
                return f"metadata {ma} vs {mb}"
            names = sorted(ha, key=lambda k: ha[k]["data_offsets"][0])
            differ = []
            for k in names:
                oa, ob = ha[k]["data_offsets"], hb[k]["data_offsets"]
                fa.seek(8 + na + oa[0])
                fb.seek(8 + nb + ob[0])
                if fa.read(oa[1] - oa[0]) != fb.read(ob[1] - ob[0]):
                    differ.append(k)
            if not differ:
                return None if META_IGNORE else "the same tensors, laid out differently"
            more = f", +{len(differ) - 4} more" if len(differ) > 4 else ""
            return f"{len(differ)} of {len(names)} tensors differ ({', '.join(differ[:4])}{more})"
    except (OSError, ValueError, KeyError, struct.error) as e:
        return f"(unreadable as safetensors: {e})"


def files_under(d):
    """Every file below d, as paths relative to it, sorted."""
    out = []
    for root, _, names in os.walk(d):
        out += [os.path.relpath(os.path.join(root, n), d) for n in names]
    return sorted(out)


def compare_ckpt(a, b, ignore):
    fa, fb = files_under(a), files_under(b)
    if not fa and not fb:
        return ["no checkpoint in either run"]
    diffs = [f"ckpt/{n}: only in {A}" for n in fa if n not in fb] + [f"ckpt/{n}: only in {B}" for n in fb if n not in fa]
    for n in fa:
        if n not in fb:
            continue
        pa, pb = os.path.join(a, n), os.path.join(b, n)
        if n == "state.json":
            diffs += compare_state(pa, pb, ignore)
            continue
        off = first_diff(pa, pb)
        if off >= 0:
            sa, sb = os.path.getsize(pa), os.path.getsize(pb)
            size = f", {sa} vs {sb} bytes" if sa != sb else ""
            what = safetensors_diff(pa, pb) if n.endswith(".safetensors") else f"differs from byte {off}"
            if what is None:
                continue  # only --meta-ignore'd metadata differs
            diffs.append(f"ckpt/{n}: {what}{size}")
    return diffs


def metrics_lines(path, step_offset=0):
    out = []
    with open(path) as f:
        for line in f:
            if line.strip():
                pairs = json.loads(line, parse_float=number, parse_int=number, object_pairs_hook=list)
                row = [(k, v) for k, v in pairs if k not in TIMING]
                if step_offset:
                    row = [(k, ("#", str(int(v[1]) + step_offset)) if k == "step" else v) for k, v in row]
                out.append(row)
    return out


def compare_metrics(a, b):
    if not os.path.exists(a) or not os.path.exists(b):
        if os.path.exists(a) == os.path.exists(b):
            return ["no metrics.jsonl in either run"]
        return [f"metrics.jsonl: only in {A if os.path.exists(a) else B}"]
    la, lb = metrics_lines(a, STEP_OFFSET), metrics_lines(b)
    diffs = [] if len(la) == len(lb) else [f"metrics.jsonl: {len(la)} vs {len(lb)} lines"]
    for i, (x, y) in enumerate(zip(la, lb)):
        if x == y:
            continue
        dx, dy = dict(x), dict(y)
        step = show(dx.get("step", dy.get("step", ("#", "?"))))
        what = [f"{k} {show(dx[k])} vs {show(dy[k])}" for k in dx if k in dy and dx[k] != dy[k]]
        what += [f"{k} only in {A}" for k in dx if k not in dy] + [f"{k} only in {B}" for k in dy if k not in dx]
        if not what:
            what = ["the same fields in another order: " + ",".join(k for k, _ in x) + " vs " + ",".join(k for k, _ in y)]
        diffs.append(f"metrics.jsonl line {i + 1} (step {step}): " + "; ".join(what))
    return diffs


def main():
    args = sys.argv[1:]
    global A, B, STEP_OFFSET, FOLD_MICRO_BATCHES
    ignore = []
    while len(args) > 2 and args[0] in ("--state-ignore", "--labels", "--meta-ignore", "--step-offset", "--fold-micro-batches"):
        if args[0] == "--fold-micro-batches":
            FOLD_MICRO_BATCHES = True
            args = args[1:]
            continue
        if args[0] == "--labels":
            A, B = args[1].split(",")
        elif args[0] == "--meta-ignore":
            META_IGNORE.update(k for k in args[1].split(",") if k)
        elif args[0] == "--step-offset":
            STEP_OFFSET = int(args[1])
        else:
            ignore += [k for k in args[1].split(",") if k]
        args = args[2:]
    if len(args) != 2:
        sys.exit(__doc__)
    a, b = args
    diffs = compare_ckpt(os.path.join(a, "ckpt"), os.path.join(b, "ckpt"), ignore)
    m = compare_metrics(os.path.join(a, "metrics.jsonl"), os.path.join(b, "metrics.jsonl"))
    if len(m) > MAX_LINES:
        m = m[:MAX_LINES] + [f"metrics.jsonl: {len(m) - MAX_LINES} more differing lines"]
    diffs += m
    for d in diffs:
        print(d)
    sys.exit(1 if diffs else 0)


if __name__ == "__main__":
    main()
