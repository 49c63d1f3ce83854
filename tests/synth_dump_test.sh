#!/usr/bin/env bash
# nobubble synth-dump (the samples `train --model seqctr --data synth:...` trains on, as an NBSYNTH1
# file for bench/seqctr_torch.py): header fields, table rows as the trainer sizes them (min(card,
# --table-cap)), array offsets and file size, every value in range, jagged histories consistent;
# the same samples whatever --first window, chunk boundary or thread count they are written
# with; max_len taken as train takes it; bad flags end in one clear error line.
source "$(dirname "$0")/lib.sh"
SYNTH="synth:cap=1000,items=2000,calib=16384,max_len=16"
PY=${PYTHON:-python3}
command -v "$PY" >/dev/null || { echo "no python3: cannot read the dump back"; exit 77; }

# check FILE N FIRST MAX_LEN TABLE_CAP SPEC: python3 (struct only) reads the file back and checks
# it against the layout documented in tools/cmd_synth_dump.c
check() {
    "$PY" - "$@" <<'EOF'
import math, os, struct, sys
path, n_want, first_want, L_want, cap, spec_want = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
b = open(path, "rb").read()
def bad(msg):
    print(msg); sys.exit(1)
if b[:8] != b"NBSYNTH1": bad(f"magic {b[:8]!r}")
version, hbytes, n, first, total, L, nd, nc = struct.unpack_from("<IIQQQIII", b, 8)
if (version, hbytes, nd, nc) != (1, 1024, 13, 26): bad(f"version/header/shape {version} {hbytes} {nd} {nc}")
if (n, first, L) != (n_want, first_want, L_want): bad(f"n/first/max_len {n} {first} {L}, want {n_want} {first_want} {L_want}")
table_cap, = struct.unpack_from("<Q", b, 56)
rows = struct.unpack_from("<26Q", b, 64); item_rows, = struct.unpack_from("<Q", b, 272)
card = struct.unpack_from("<26Q", b, 280); items, seed, fbytes = struct.unpack_from("<3Q", b, 488)
off = struct.unpack_from("<7Q", b, 512)
spec = b[576:1024].split(b"\0")[0].decode()
if table_cap != cap: bad(f"table_cap {table_cap} want {cap}")
if spec != spec_want: bad(f"spec '{spec}' want '{spec_want}'")
if any(r != min(c, cap) or r < 1 for r, c in zip(rows, card)): bad(f"cat rows {rows} vs card {card} cap {cap}")
if item_rows != min(items, cap): bad(f"item rows {item_rows} vs items {items}")
if fbytes != len(b): bad(f"header says {fbytes} bytes, file has {len(b)}")
sizes = [52 * n, 104 * n, 4 * n, 4 * n, 8 * (n + 1), 4 * total, 4 * n]
pos = 1024
for k in range(7):
    if off[k] != pos: bad(f"array {k} at {off[k]}, want {pos}")
    pos = (pos + sizes[k] + 7) // 8 * 8 if k < 6 else pos + sizes[k]
if pos != len(b): bad(f"arrays end at {pos}, file {len(b)}")
dense = struct.unpack_from(f"<{13 * n}f", b, off[0]); cat = struct.unpack_from(f"<{26 * n}I", b, off[1])
target = struct.unpack_from(f"<{n}I", b, off[2]); hlen = struct.unpack_from(f"<{n}i", b, off[3])
hoff = struct.unpack_from(f"<{n + 1}q", b, off[4]); hist = struct.unpack_from(f"<{total}I", b, off[5])
label = struct.unpack_from(f"<{n}f", b, off[6])
if any(not (math.isfinite(x) and x >= 0) for x in dense): bad("dense value not finite or < 0")
if any(cat[i * 26 + f] >= card[f] for i in range(n) for f in range(26)): bad("categorical id >= card")
if any(t >= items for t in target) or any(h >= items for h in hist): bad("item id >= items")
if any(not 0 <= l <= L for l in hlen): bad("hist_len out of 0..max_len")
if hoff[0] != 0 or hoff[n] != total or any(hoff[i + 1] - hoff[i] != hlen[i] for i in range(n)): bad("hist_off inconsistent")
if any(y not in (0.0, 1.0) for y in label): bad("label not 0/1")
print(f"n={n} total={total} mean_len={total / n:.2f} label_rate={sum(label) / n:.3f} rows={sum(rows) + item_rows}")
EOF
}

# same FILE_A FILE_B OFFSET: samples OFFSET.. of A equal B sample for sample (every field)
same() {
    "$PY" - "$@" <<'EOF'
import struct, sys
def load(p):
    b = open(p, "rb").read()
    n, = struct.unpack_from("<Q", b, 16); off = struct.unpack_from("<7Q", b, 512)
    hoff = struct.unpack_from(f"<{n + 1}q", b, off[4])
    rec = lambda i: (b[off[0] + 52 * i:off[0] + 52 * (i + 1)], b[off[1] + 104 * i:off[1] + 104 * (i + 1)],
                     b[off[2] + 4 * i:off[2] + 4 * i + 4], b[off[5] + 4 * hoff[i]:off[5] + 4 * hoff[i + 1]],
                     b[off[6] + 4 * i:off[6] + 4 * i + 4])
    return n, rec
na, a = load(sys.argv[1]); nb, bb = load(sys.argv[2]); k = int(sys.argv[3])
diff = [i for i in range(nb) if a(k + i) != bb(i)]
if diff: print(f"{len(diff)} of {nb} samples differ, first at {k + diff[0]}"); sys.exit(1)
EOF
}

D="$NB synth-dump --quiet"
$D --data "$SYNTH" --samples 1000 --out "$TMP/a.bin" >"$TMP/a.log" || fail "dump of 1000 samples"
r=$(check "$TMP/a.bin" 1000 0 16 100000 "$SYNTH") && pass "header, offsets, size and values ($r)" || fail "dump check: $r"
grep -q "^wrote $TMP/a.bin: samples 0..999" "$TMP/a.log" && pass "summary line" || fail "summary line: $(cat "$TMP/a.log")"

# the table rows are the trainer's: min(card, --table-cap); and --max-len is appended as train appends it
$D --data synth:cap=1000,items=2000,calib=16384 --max-len 8 --table-cap 300 --samples 200 --out "$TMP/c.bin" >/dev/null \
    || fail "dump with --table-cap 300"
r=$(check "$TMP/c.bin" 200 0 8 300 "synth:cap=1000,items=2000,calib=16384,max_len=8") \
    && pass "--table-cap 300, --max-len 8 appended to the spec ($r)" || fail "table-cap / max-len: $r"
$D --samples 20 --table-cap 1000000 --out "$TMP/d.bin" >/dev/null || fail "dump with the default spec"
r=$(check "$TMP/d.bin" 20 0 32 1000000 "synth:max_len=32") && pass "default --data synth, train's default --max-len 32 ($r)" \
    || fail "default spec: $r"

# any window gives the same samples: --first, chunk boundaries (max_len 4096: 4096 samples per chunk), threads
$D --data "$SYNTH" --first 300 --samples 200 --out "$TMP/b.bin" >/dev/null || fail "dump --first 300"
r=$(check "$TMP/b.bin" 200 300 16 100000 "$SYNTH") && r=$(same "$TMP/a.bin" "$TMP/b.bin" 300) \
    && pass "--first 300 --samples 200 equals samples 300..499 of the first dump" || fail "--first window: $r"
BIG="synth:cap=1000,items=2000,calib=16384,max_len=4096,hist_scale=64"
$D --data "$BIG" --samples 9000 --out "$TMP/big.bin" >/dev/null || fail "multi-chunk dump"
$D --data "$BIG" --first 4000 --samples 200 --out "$TMP/big2.bin" >/dev/null || fail "window dump"
r=$(check "$TMP/big.bin" 9000 0 4096 100000 "$BIG") && r=$(same "$TMP/big.bin" "$TMP/big2.bin" 4000) \
    && pass "3 chunks of 4096 samples: consistent, and samples 4000..4199 across a chunk boundary match" \
    || fail "chunked dump: $r"
$D --data "$SYNTH" --samples 1000 --threads 1 --out "$TMP/t1.bin" >/dev/null && cmp -s "$TMP/a.bin" "$TMP/t1.bin" \
    && pass "--threads 1 writes the same bytes" || fail "the file depends on the thread count"
compgen -G "$TMP/*.tmp.*" >/dev/null && fail "temp files left: $(ls "$TMP")" || pass "no temp files left"

# progress lines on stderr for large N (>= 2^20 samples), none with --quiet
$NB synth-dump --data "synth:cap=1000,items=2000,calib=16384,max_len=4" --samples 1048576 --out "$TMP/p.bin" \
    >/dev/null 2>"$TMP/p.err" || fail "dump of 2^20 samples"
grep -q "^synth-dump: 1048576 / 1048576 samples (100%)" "$TMP/p.err" && pass "progress on stderr for 2^20 samples" \
    || fail "no progress line: $(cat "$TMP/p.err")"

$NB synth-dump --help | grep -q -- "--table-cap" && pass "--help" || fail "--help"
expect_error "no --out" "--out" $NB synth-dump --samples 10
expect_error "no --samples" "--samples" $NB synth-dump --out "$TMP/x.bin"
expect_error "--samples 0" "--samples must be" $NB synth-dump --samples 0 --out "$TMP/x.bin"
expect_error "not synth" "only synthetic" $NB synth-dump --data criteo:foo --samples 10 --out "$TMP/x.bin"
expect_error "max-len disagrees" "disagrees with max_len=16" $NB synth-dump --data "$SYNTH" --max-len 8 --samples 10 --out "$TMP/x.bin"
expect_error "bad synth key" "unknown option 'foo'" $NB synth-dump --data synth:foo=1 --samples 10 --out "$TMP/x.bin"
expect_error "--first overflow" "last index" $NB synth-dump --first 18446744073709551615 --samples 2 --out "$TMP/x.bin"
expect_error "unwritable --out" "cannot create" $NB synth-dump --data "$SYNTH" --samples 10 --out "$TMP/no/such/dir/x.bin"
[ ! -e "$TMP/x.bin" ] && pass "no file after an error" || fail "a file was written despite the error"
finish
