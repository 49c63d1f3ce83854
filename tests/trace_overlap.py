#!/usr/bin/python3
"""Does a Chrome trace written by nobubble show the stream schedule overlapping?

  trace_overlap.py TRACE.json STEP

For the given step: some upload ("h2d Lk") running while the compute lane runs another layer
("fwd/refwd/bwd Lj", j != k: the prefetch of the next layer), and some gradient download
("d2h Lk") running while the compute lane works on a lower layer ("refwd/bwd Lj", j < k: the
backward goes on while layer k's gradient leaves). Prints what it found
(and the h2d, d2h and compute busy time of the step); exit 0 when both exist, 1 otherwise."""
import json
import re
import sys

COMPUTE = re.compile(r"(fwd|refwd|bwd) L(\d+)")
COPY = re.compile(r"(h2d|d2h) L(\d+)")


def spans(path, step):
    out = []
    for e in json.load(open(path))["traceEvents"]:
        if e.get("ph") == "X" and e.get("args", {}).get("step") == step:
            out.append((e["name"], e["ts"], e["ts"] + e["dur"]))
    return out


def main():
    s = spans(sys.argv[1], int(sys.argv[2]))
    comp = [(m.group(1), int(m.group(2)), a, b) for n, a, b in s for m in [COMPUTE.fullmatch(n)] if m]
    copies = [(m.group(1), int(m.group(2)), a, b) for n, a, b in s for m in [COPY.fullmatch(n)] if m]
    up, down = [], []
    for kind, k, a, b in copies:
        for ck, j, c0, c1 in comp:
            if a < c1 and c0 < b:
                if kind == "h2d" and j != k:
                    up.append(f"h2d L{k} during {ck} L{j}")
                if kind == "d2h" and ck != "fwd" and j < k:
                    down.append(f"d2h L{k} during {ck} L{j}")
    busy = {}
    for kind, _, a, b in copies + comp:
        busy[kind] = busy.get(kind, 0) + (b - a)
    print(f"{len(up)} uploads during other layers' compute (e.g. {', '.join(up[:3])}); "
          f"{len(down)} downloads during a lower layer's compute (e.g. {', '.join(down[:3])}); "
          "busy us: " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(busy.items())))
    sys.exit(0 if up and down else 1)


if __name__ == "__main__":
    main()
