#!/usr/bin/python3
"""Does a Chrome trace written by nobubble show the stream schedule overlapping?

  trace_overlap.py TRACE.json STEP

For the given step: some layer l whose forward span ("fwd Ll") overlaps in time with the upload
of layer l+1 ("h2d L<l+1>"), and some backward span ("bwd Ll") overlapping a gradient download
("d2h L<m>", m > l). Prints what it found; exit 0 when both exist, 1 otherwise."""
import json
import re
import sys


def spans(path, step):
    out = {}
    for e in json.load(open(path))["traceEvents"]:
        if e.get("ph") == "X" and e.get("args", {}).get("step") == step:
            out.setdefault(e["name"], []).append((e["ts"], e["ts"] + e["dur"]))
    return out


def overlaps(a, b):
    return any(x0 < y1 and y0 < x1 for x0, x1 in a for y0, y1 in b)


def main():
    s = spans(sys.argv[1], int(sys.argv[2]))
    layers = sorted({int(m.group(1)) for n in s for m in [re.fullmatch(r"fwd L(\d+)", n)] if m})
    fwd = [l for l in layers if f"h2d L{l + 1}" in s and overlaps(s[f"fwd L{l}"], s[f"h2d L{l + 1}"])]
    bwd = [(l, k) for l in layers for k in layers if k > l and f"bwd L{l}" in s and f"d2h L{k}" in s
           and overlaps(s[f"bwd L{l}"], s[f"d2h L{k}"])]
    print(f"forward of layer l during the upload of l+1: layers {fwd}; backward during a download: {bwd[:6]}")
    sys.exit(0 if fwd and bwd else 1)


if __name__ == "__main__":
    main()
