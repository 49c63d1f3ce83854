#!/usr/bin/env python3
"""Split traced steps of a `nobubble train --trace FILE` run into compute, exposed communication
and the rest.

For step K the window runs from the first span of step K on the compute or comm lane to the first
span of step K+1 (the last step of the trace, which has no successor, is left out). Inside it:
  compute  = the union of the compute lane's spans (every span: fwd, bwd, head + loss, adamw, ...);
  comm     = the union of the comm lane's spans (all-reduce buckets, all-to-alls, ...);
  exposed  = comm minus compute: the comm lane busy while the compute lane is idle;
  hidden   = comm and compute at once (the part hidden behind the backward);
  rest     = window - (compute union comm): both lanes idle (host work, waits, the gap between steps).
window = compute + exposed + rest. Also per-stage sums on the compute lane (fwd, head, bwd, tail,
opt) and the longest comm span (comm_longest) for the scaling model's --check. Other lanes (data prefetch) are not counted.

  python3 bench/trace_split.py TRACE [--steps 5:] [--step K ...] [--json] [--per-step]
  python3 bench/trace_split.py --self-test      (a made-up step with known parts)
Output: one line per step with --per-step, then the median over the chosen steps of each quantity
(ms; each step adds up exactly, the medians only about: window ~ compute + exposed + rest); --json
prints one JSON object (medians, plus "steps": per-step values). Stdlib only, deterministic.
"""
import argparse, json, re, statistics, sys


def union(iv):
    """Merge [start, end) intervals; return the sorted disjoint list."""
    out = []
    for s, e in sorted(iv):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def length(iv):
    return sum(e - s for s, e in iv)


def intersect(a, b):
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if s < e:
            out.append([s, e])
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def clip(iv, lo, hi):
    return [[max(s, lo), min(e, hi)] for s, e in iv if e > lo and s < hi]


STAGES = [("fwd", r"^(embed fwd|fwd )"), ("head", r"^head"), ("bwd", r"^bwd "), ("tail", r"^(embed bwd|join)"),
          ("opt", r"^adamw")]


def stage_of(name):
    for st, rx in STAGES:
        if re.search(rx, name):
            return st
    return "other"


def load(path, compute_lane, comm_lane):
    try:
        with open(path) as f:
            t = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"trace_split: cannot read trace '{path}': {e}")
    ev = t["traceEvents"] if isinstance(t, dict) else t
    lanes = {(e.get("pid"), e["tid"]): e["args"]["name"] for e in ev if e.get("ph") == "M" and e.get("name") == "thread_name"}
    spans = {}  # step -> list of (lane, name, start_ms, end_ms)
    for e in ev:
        if e.get("ph") != "X":
            continue
        lane = lanes.get((e.get("pid"), e["tid"]))
        step = (e.get("args") or {}).get("step", -1)
        if lane in (compute_lane, comm_lane) and step >= 0:
            spans.setdefault(step, []).append((lane, e["name"], e["ts"] / 1e3, (e["ts"] + e["dur"]) / 1e3))
    if not spans:
        sys.exit(f"trace_split: no spans of a step >= 0 on lanes '{compute_lane}'/'{comm_lane}' in '{path}' (lanes: {sorted(set(lanes.values()))})")
    return spans


def split(spans, k, compute_lane, comm_lane):
    lo = min(s for _, _, s, _ in spans[k])
    hi = min(s for _, _, s, _ in spans[k + 1])
    comp = clip(union([[s, e] for l, _, s, e in spans[k] if l == compute_lane]), lo, hi)
    comm = clip(union([[s, e] for l, _, s, e in spans[k] if l == comm_lane]), lo, hi)
    both = intersect(comp, comm)
    r = {"step": k, "window": hi - lo, "compute": length(comp), "comm": length(comm), "hidden": length(both)}
    r["exposed"] = r["comm"] - r["hidden"]
    r["rest"] = r["window"] - r["compute"] - r["exposed"]
    for st, _ in STAGES + [("other", "")]:
        r["stage_" + st] = 0.0
    bwd = []
    for l, name, s, e in spans[k]:
        if l == compute_lane:
            r["stage_" + stage_of(name)] += e - s
            if stage_of(name) == "bwd":
                bwd.append(e - s)
    r["layer_bwd_count"] = len(bwd)
    r["comm_spans"] = sum(1 for l, _, _, _ in spans[k] if l == comm_lane)
    r["comm_longest"] = max([e - s for l, _, s, e in spans[k] if l == comm_lane] or [0.0])
    return r


def pick_steps(spans, steps_arg, step_list):
    have = sorted(k for k in spans if k + 1 in spans)
    if step_list:
        bad = [k for k in step_list if k not in have]
        if bad:
            sys.exit(f"trace_split: step(s) {bad} not in the trace with a following step (have {have[0]}..{have[-1]})")
        return step_list
    a, _, b = steps_arg.partition(":")
    lo, hi = int(a or 0), (int(b) if b else have[-1] + 1)
    ks = [k for k in have if lo <= k < hi]
    if not ks:
        sys.exit(f"trace_split: no traced step in {steps_arg} with a following step (have {have[0]}..{have[-1]})")
    return ks


def self_test():
    """A made-up step: compute [0,10] + [12,20], comm [8,15], next step at 25 (ms)."""
    sp = {0: [("compute", "fwd S0 L0", 0, 10), ("compute", "bwd S0 L0", 12, 20), ("comm", "all-reduce 1", 8, 15)],
          1: [("compute", "embed fwd", 25, 26)]}
    r = split(sp, 0, "compute", "comm")
    want = {"window": 25, "compute": 18, "comm": 7, "hidden": 5, "exposed": 2, "rest": 5, "stage_fwd": 10, "stage_bwd": 8}
    bad = {k: (r[k], v) for k, v in want.items() if abs(r[k] - v) > 1e-9}
    print("trace_split self-test: " + ("ok" if not bad else f"FAILED {bad}"))
    sys.exit(1 if bad else 0)


def main():
    if "--self-test" in sys.argv:
        self_test()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", help="Chrome trace written by nobubble train --trace")
    ap.add_argument("--steps", default="5:", help="range A:B of steps (B excluded; default 5: = from step 5 on)")
    ap.add_argument("--step", type=int, action="append", help="one step K (repeatable; overrides --steps)")
    ap.add_argument("--compute-lane", default="compute")
    ap.add_argument("--comm-lane", default="comm")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--per-step", action="store_true", help="also print each step's line")
    a = ap.parse_args()
    spans = load(a.trace, a.compute_lane, a.comm_lane)
    rows = [split(spans, k, a.compute_lane, a.comm_lane) for k in pick_steps(spans, a.steps, a.step)]
    keys = [k for k in rows[0] if k != "step"]
    med = {k: round(statistics.median(r[k] for r in rows), 4) for k in keys}
    med["steps_used"] = [r["step"] for r in rows]
    if a.json:
        print(json.dumps({"trace": a.trace, "median": med, "steps": [{k: round(v, 4) if isinstance(v, float) else v
                                                                       for k, v in r.items()} for r in rows]}, sort_keys=True))
        return
    cols = ["window", "compute", "exposed", "rest", "comm", "hidden"]
    print("step    " + "".join(f"{c:>10}" for c in cols) + "   (ms)")
    for r in rows if a.per_step else []:
        print(f"{r['step']:<8}" + "".join(f"{r[c]:10.3f}" for c in cols))
    print(f"{'median':<8}" + "".join(f"{med[c]:10.3f}" for c in cols) + f"   over {len(rows)} steps ({rows[0]['step']}..{rows[-1]['step']})")


if __name__ == "__main__":
    main()
