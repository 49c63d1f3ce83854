#!/usr/bin/env python3
"""`nobubble predict` against the exported model outside nobubble (issue 36, 5):

  NB_BUILD=build python3 tests/predict_onnx_check.py        (run by tests/gpu_all.sh)

Writes a CSV with a header, quoted fields, missing values, integer and hashed categorical columns,
two multi-valued ones (hashed tags averaged, integer genres summed) and a history; trains a tiny seqctr on it (--schema), scores a second file with `nobubble predict`,
exports the checkpoint (`nobubble export --out`), loads the export with tools/seqctr_torch_load.py,
turns the same rows into the model's inputs in Python (the schema's rules: log1p dense, ids, FNV-1a
hashing, the multi-valued columns' ids padded with their counts, the most recent max_len history
items) and checks that the PyTorch module's scores equal
predict's within 1e-5; then torch.onnx.export's model under onnxruntime, within 1e-5 of predict's.
Without torch (or with --numpy) the same rows go through the loader's forward on numpy arrays
instead (the function the PyTorch module runs, on numpy): the layout and the math, not the module.
Exit 77 (skipped) without torch and numpy; the ONNX part is skipped (said so) without onnxruntime."""
import csv
import math
import os
import random
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# tests/torch (the reference scripts) would shadow the torch package
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.join(ROOT, "tests")]
sys.path.insert(0, os.path.join(ROOT, "tools"))
TOL = 1e-5

SCHEMA = """{
  "label": "clicked", "id": "id",
  "dense": ["age", {"name": "price", "transform": "log1p"}, {"name": "score", "transform": "none"}],
  "categorical": [{"name": "user", "cardinality": 300}, {"name": "city", "hash_size": 50},
                  {"name": "tags", "hash_size": 40, "pooling": "mean", "max_values": 4},
                  {"name": "genres", "cardinality": 20, "pooling": "sum", "max_values": 3, "separator": "|"}],
  "sequence": {"target": "item", "history": "history", "cardinality": 400, "max_len": 6},
  "embedding_dim": 8
}"""
CITIES = ["paris", "new york, ny", "berlin", "", "tokyo", 'say "hi"']
TAGS = ["sale", "new", "red", "big, small", "x"]
MV = [(2, 4), (3, 3)]  # the multi-valued columns: (categorical column, max_values)


def write_rows(path, n, seed):
    rng = random.Random(seed)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "clicked", "age", "price", "score", "user", "city", "tags", "genres", "item", "history"])
        for i in range(n):
            u, it = rng.randrange(300), rng.randrange(400)
            hist = " ".join(str(rng.randrange(400)) for _ in range(rng.randrange(10)))
            y = int(rng.random() < 0.2 + 0.5 * (u % 3 == 0) + 0.2 * (it % 5 == 0))
            age = "" if rng.random() < 0.1 else str(rng.randrange(18, 80))
            tags = " ".join(rng.choice(TAGS).replace(" ", "_") for _ in range(rng.randrange(5)))
            genres = "|".join(str(rng.randrange(20)) for _ in range(rng.randrange(4)))
            w.writerow([f"r{i}", y, age, f"{rng.uniform(0, 100):.2f}", f"{rng.uniform(-1, 1):.3f}", u, rng.choice(CITIES), tags,
                        genres, it, hist])


def inputs(path, max_len):
    """The model's inputs of every row (numpy arrays), as src/data/ctr_table.c makes them for SCHEMA."""
    import numpy as np
    import seqctr_torch_load as L
    rows = list(csv.DictReader(open(path, newline="")))
    B = len(rows)
    dense = np.zeros((B, 3), np.float32)  # the schema's 3 dense and 2 categorical columns: the model's shape
    cat = np.zeros((B, 4), np.int64)  # and 2 multi-valued ones (their cat column unread)
    mv = np.zeros((B, sum(k for _, k in MV)), np.int64)
    mv_len = np.zeros((B, len(MV)), np.int64)
    target = np.zeros(B, np.int64)
    hists = []
    for b, r in enumerate(rows):
        if r["age"] not in ("", "NA", "null"):
            dense[b, 0] = np.float32(math.log1p(max(float(r["age"]), 0.0)))
        dense[b, 1] = np.float32(math.log1p(max(float(r["price"]), 0.0)))
        dense[b, 2] = np.float32(float(r["score"]))
        cat[b, 0] = int(r["user"])
        cat[b, 1] = 0 if r["city"] == "" else L.fnv1a(r["city"]) % 50
        tags = [L.fnv1a(t) % 40 for t in r["tags"].split(" ") if t]
        genres = [int(g) for g in r["genres"].split("|") if g]
        for j, (vals, at) in enumerate(((tags, 0), (genres, 4))):
            mv[b, at:at + len(vals)] = vals
            mv_len[b, j] = len(vals)
        target[b] = int(r["item"])
        hists.append([int(x) for x in r["history"].split()][-max_len:])
    Lmax = max(1, max(len(h) for h in hists))
    hist = np.zeros((B, Lmax), np.int64)
    for b, h in enumerate(hists):
        hist[b, :len(h)] = h
    hl = np.array([len(h) for h in hists], np.int64)
    return [r["id"] for r in rows], (dense, cat, target, hist, hl, mv, mv_len)


def main(argv):
    use_torch = "--numpy" not in argv
    try:
        if use_torch:
            import torch
    except ImportError:
        use_torch = False
    try:
        import numpy as np
    except ImportError:
        print("neither torch nor numpy found: skipping the predict / export check")
        return 77
    import seqctr_torch_load as L
    nb = os.path.join(os.environ.get("NB_BUILD", os.path.join(ROOT, "build")), "nobubble")
    if not os.path.isabs(nb):
        nb = os.path.join(ROOT, nb)
    d = tempfile.mkdtemp(prefix="nb_onnx_")
    write_rows(f"{d}/train.csv", 3000, 1)
    write_rows(f"{d}/test.csv", 400, 2)
    open(f"{d}/schema.json", "w").write(SCHEMA)
    run = lambda *a: subprocess.run([nb, *a], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    run("train", "--model", "seqctr", "--data", f"csv:{d}/train.csv", "--schema", f"{d}/schema.json", "--val-data",
        f"{d}/test.csv", "--steps", "40", "--batch", "64", "--blocks", "2", "--heads", "2", "--block-hidden", "32",
        "--cross-rank", "8", "--threads", "2", "--out", f"{d}/run")
    run("predict", "--ckpt", f"{d}/run", "--data", f"{d}/test.csv", "--out", f"{d}/scores.tsv")
    run("export", "--ckpt", f"{d}/run", "--out", f"{d}/model.safetensors")
    got = [l.rstrip("\n").split("\t") for l in open(f"{d}/scores.tsv")][1:]
    ids, x = inputs(f"{d}/test.csv", 6)
    assert [g[0] for g in got] == ids, "predict's ids are not the file's, in order"
    want = np.array([float(g[1]) for g in got])
    if not use_torch:
        meta, tensors = L.read_safetensors(f"{d}/model.safetensors")
        got_np = L.forward_numpy(L.parse_config(meta), tensors, *x).astype(np.float64)
        err = float(np.abs(got_np - want).max())
        print(f"the export's forward on numpy vs predict: {len(want)} rows, max |diff| {err:.2e} (tolerance {TOL}); "
              "the PyTorch module and ONNX are not checked (no torch)")
        return 1 if err > TOL else 0
    m = L.load(f"{d}/model.safetensors")
    xt = tuple(torch.from_numpy(a) for a in x)
    with torch.no_grad():
        pt = m(*xt).double().numpy()
    err = float(np.abs(pt - want).max())
    print(f"PyTorch module vs predict: {len(want)} rows, max |diff| {err:.2e} (tolerance {TOL})")
    bad = err > TOL
    try:
        import onnxruntime as ort
        L.export_onnx(m, f"{d}/model.onnx")
        sess = ort.InferenceSession(f"{d}/model.onnx", providers=["CPUExecutionProvider"])
        names = L.input_names(m.cfg)
        ox = sess.run(["score"], dict(zip(names, x)))[0].astype(np.float64)
        oerr = float(np.abs(ox - want).max())
        print(f"onnxruntime vs predict: max |diff| {oerr:.2e} (tolerance {TOL})")
        bad |= oerr > TOL
    except ImportError as e:
        print(f"ONNX part skipped: {e}")
    print("FAIL" if bad else "ok   predict == the exported model in PyTorch (and ONNX when available)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
