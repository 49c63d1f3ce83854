#!/usr/bin/env python3
"""Chat-formatted fine-tuning data from the project's corpus (data/sotu/raw: the State of the Union
addresses, one per line): each example is a user turn holding a passage of an address and an
assistant turn holding the passage that follows it (OpenAI "messages" JSON lines, what
`nobubble tokenize --chat` reads). Every 20th address is held out (as scripts/fetch_data.sh splits
the corpus), so train and validation share no text.

    python3 bench/sft_from_corpus.py --out-dir /tmp/sft      # -> train.jsonl, val.jsonl
"""
import argparse
import glob
import json
import os
import re
import sys

ASKS = ["Continue this address to Congress:", "What comes next in this speech?",
        "Write the next passage of this State of the Union address:"]


def passages(text, size):
    """Consecutive runs of whole sentences of about `size` characters."""
    out, cur = [], ""
    for s in re.split(r"(?<=[.!?])\s+", text.strip()):
        cur = f"{cur} {s}" if cur else s
        if len(cur) >= size:
            out.append(cur)
            cur = ""
    if cur:
        out.append(cur)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--raw", default="data/sotu/raw")
    p.add_argument("--out-dir", required=True)
    p.add_argument("--chars", type=int, default=900, help="passage length in characters [900]")
    p.add_argument("--val-every", type=int, default=20)
    a = p.parse_args()
    files = sorted(glob.glob(os.path.join(a.raw, "*.txt")))
    if not files:
        sys.exit(f"sft_from_corpus.py: no .txt files in {a.raw} (run: bash scripts/fetch_data.sh)")
    os.makedirs(a.out_dir, exist_ok=True)
    counts = {"train": 0, "val": 0}
    with open(os.path.join(a.out_dir, "train.jsonl"), "w") as tr, open(os.path.join(a.out_dir, "val.jsonl"), "w") as va:
        for i, path in enumerate(files, 1):
            split = "val" if i % a.val_every == 0 else "train"
            with open(path, encoding="utf-8") as f:
                ps = passages(f.read(), a.chars)
            for k in range(len(ps) - 1):
                msgs = [{"role": "user", "content": f"{ASKS[k % len(ASKS)]}\n\n{ps[k]}"},
                        {"role": "assistant", "content": ps[k + 1]}]
                (va if split == "val" else tr).write(json.dumps({"messages": msgs}) + "\n")
                counts[split] += 1
    print(f"wrote {counts['train']} training and {counts['val']} held-out examples from {len(files)} addresses to {a.out_dir}")


if __name__ == "__main__":
    main()
