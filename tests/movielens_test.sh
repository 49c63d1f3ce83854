#!/usr/bin/env bash
# MovieLens extraction (scripts/fetch_movielens.sh + scripts/movielens_extract.js) on the real
# Debian package r-cran-dslabs 0.7.4-1:
#   1. counts: 100,004 ratings, 671 users, 9,066 movies, ratings in 0.5..5 by halves, mean rating
#      3.543608 (the value R gives for mean(dslabs::movielens$rating)), 51,568 positives (51.6%);
#   2. the click files against ratings.tsv, recomputed independently in awk: label, hour and
#      weekday (UTC), the time split (every train timestamp < every test timestamp, 20% test),
#      and every history (the user's movies at strictly earlier timestamps, most recent last,
#      capped at 256);
#   3. the bzip2 and xz object compressions of R's lazy-load format (the package itself uses
#      zlib): the real object recompressed into a hand-made .rdb/.rdx gives the same files;
#   4. determinism (two extractions are byte-identical) and clear one-line errors for a
#      truncated .rdb, a non-gzip .rdx, a wrong compression byte and a missing folder.
# Skips (77) without node, or when the package is not cached and apt-get download cannot get it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

skip() { echo "SKIP: $*"; exit 77; }
fails=0
pass() { echo "ok   $*"; }
fail() { echo "FAIL $*"; fails=$((fails + 1)); }

command -v node >/dev/null 2>&1 || skip "node is not installed (it runs scripts/movielens_extract.js)"
RDATA=data/movielens/pkg/usr/lib/R/site-library/dslabs/data
if [ ! -f $RDATA/Rdata.rdb ] || [ ! -f $RDATA/Rdata.rdx ]; then
    command -v apt-get >/dev/null 2>&1 || skip "apt-get is not available: cannot download r-cran-dslabs"
    (cd /tmp && apt-get download --print-uris r-cran-dslabs=0.7.4-1 >/dev/null 2>&1) ||
        skip "apt-get cannot find r-cran-dslabs=0.7.4-1 (not Debian 12, or run apt-get update)"
fi
scripts/fetch_movielens.sh >/dev/null || { echo "FAIL scripts/fetch_movielens.sh"; exit 1; }

WORK=$(mktemp -d /tmp/nb_movielens_test.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
EXTRACT=scripts/movielens_extract.js

# ---- 1. a fresh extraction and its counts -----------------------------------------------------
node $EXTRACT $RDATA "$WORK/a" >"$WORK/a.log" 2>&1 || { cat "$WORK/a.log"; echo "FAIL extraction"; exit 1; }
grep -q '^movielens: 100004 ratings, 671 users, 9066 movies' "$WORK/a.log" && pass "extractor reports 100004/671/9066" ||
    fail "extractor summary: $(head -n 1 "$WORK/a.log")"
R=$WORK/a/ratings.tsv
[ "$(head -n 1 $R)" = "$(printf 'userId\tmovieId\trating\ttimestamp\tyear\tgenre\tgenres\ttitle')" ] &&
    pass "ratings.tsv header" || fail "ratings.tsv header: $(head -n 1 $R)"
got=$(awk -F'\t' 'NR > 1 {
        n++; u[$1]; m[$2]; s += $3
        if (!($3 * 2 == int($3 * 2) && $3 >= 0.5 && $3 <= 5)) bad++
        if ($3 >= 4) pos++
        if ($4 < last) unsorted++; last = $4
    } END {
        nu = 0; for (k in u) nu++; nm = 0; for (k in m) nm++
        printf "%d %d %d %.6f %d %d %d", n, nu, nm, s / n, pos, bad, unsorted
    }' $R)
[ "$got" = "100004 671 9066 3.543608 51568 0 0" ] &&
    pass "ratings: 100004 rows, 671 users, 9066 movies, mean 3.543608, 51568 positive, valid, time-sorted" ||
    fail "ratings: rows users movies mean positives bad unsorted = $got"

# ---- 2. the click files, recomputed from ratings.tsv ------------------------------------------
H=$(printf 'label\tuser\titem\tyear\tgenre\thour\tweekday\ttimestamp\thistory')
for s in train test; do
    [ "$(head -n 1 "$WORK/a/clicks_$s.tsv")" = "$H" ] && pass "clicks_$s.tsv header" || fail "clicks_$s.tsv header"
done
ntrain=$(($(wc -l <"$WORK/a/clicks_train.tsv") - 1))
ntest=$(($(wc -l <"$WORK/a/clicks_test.tsv") - 1))
[ $ntrain -eq 80003 ] && [ $ntest -eq 20001 ] && pass "split: 80003 train, 20001 test" ||
    fail "split: $ntrain train, $ntest test (expected 80003, 20001)"
maxtrain=$(awk -F'\t' 'NR > 1 && $8 > m { m = $8 } END { print m + 0 }' "$WORK/a/clicks_train.tsv")
mintest=$(awk -F'\t' 'NR == 2 || (NR > 2 && $8 < m) { m = $8 } END { print m + 0 }' "$WORK/a/clicks_test.tsv")
[ "$maxtrain" -lt "$mintest" ] && pass "every train timestamp < every test timestamp ($maxtrain < $mintest)" ||
    fail "train/test overlap in time: max train $maxtrain, min test $mintest"

# ratings.tsv and train + test hold the same rows in the same order; awk rebuilds each click
# line (history: movies of the same user at strictly earlier timestamps, cap 256) and counts
# the lines that differ.
{ tail -n +2 "$WORK/a/clicks_train.tsv"; tail -n +2 "$WORK/a/clicks_test.tsv"; } >"$WORK/clicks"
tail -n +2 $R >"$WORK/ratings"
bad=$(awk -F'\t' 'NR == FNR { click[FNR] = $0; next } {
        u = $1; t = $4
        if ((u in pt) && pt[u] < t) {                    # the pending second is now history
            for (i = 1; i <= pn[u]; i++) hist[u, ++hn[u]] = pend[u, i]
            while (hn[u] - hs[u] > 256) hs[u]++
            pn[u] = 0; delete pt[u]
        }
        if (!(u in pt)) pt[u] = t
        pend[u, ++pn[u]] = $2
        h = ""
        for (i = hs[u] + 1; i <= hn[u]; i++) h = h (h == "" ? "" : " ") hist[u, i]
        line = ($3 >= 4 ? 1 : 0) "\t" u "\t" $2 "\t" $5 "\t" $6 "\t" int(($4 % 86400) / 3600) "\t" \
               (int($4 / 86400) + 4) % 7 "\t" t "\t" h
        if (line != click[FNR]) { if (bad < 3) print "line " FNR ": " substr(click[FNR], 1, 80) > "/dev/stderr"; bad++ }
        if (hn[u] - hs[u] == 256) capped++
    } END { print bad + 0, capped + 0 }' "$WORK/clicks" "$WORK/ratings")
[ "${bad%% *}" = 0 ] && [ "${bad##* }" -gt 0 ] &&
    pass "every click line (label, hour, weekday, history) matches awk's recomputation; ${bad##* } hit the 256 cap" ||
    fail "click lines differing from the recomputation, capped: $bad"
pos=$(cut -f1 "$WORK/clicks" | grep -c '^1$')
[ "$pos" -eq 51568 ] && pass "51568 positives = 51.6%" || fail "$pos positives, expected 51568"

# ---- 3. bzip2 and xz objects: the real object, recompressed, in a hand-made database ----------
# make_db METHOD_CODE COMPRESSED OUTDIR TOOL: writes OUTDIR/Rdata.rdb holding only `movielens`
# (4-byte length, method byte, TOOL's stream) and OUTDIR/Rdata.rdx (R serialization version 2 of
# list(variables = list(movielens = c(0L, len)), references = list(), compressed = N), gzip'ed).
cat >"$WORK/make_db.js" <<'EOF'
const fs = require('fs'), zlib = require('zlib'), { execFileSync } = require('child_process');
const [src, method, compressed, out, tool] = process.argv.slice(2);
const { readIndex, fetchObject } = require(process.env.EXTRACT);
const index = readIndex(src + '/Rdata.rdx');
const plain = fetchObject(src + '/Rdata.rdb', index.variables.movielens, index.compressed, 'movielens');
const body = execFileSync(tool, ['-c'], { input: plain, maxBuffer: 1 << 30 });
const head = Buffer.alloc(5); head.writeUInt32BE(plain.length, 0); head[4] = method.charCodeAt(0);
const obj = Buffer.concat([head, body]);
fs.mkdirSync(out, { recursive: true });
fs.writeFileSync(out + '/Rdata.rdb', obj);
const parts = [];
const int = (v) => { const b = Buffer.alloc(4); b.writeInt32BE(v); parts.push(b); };
const chars = (s) => { int(9); int(s.length); parts.push(Buffer.from(s)); };
parts.push(Buffer.from('X\n')); int(2); int(0x040000); int(0x020300);
int(19 | 1 << 9); int(3);                                       // list of 3, with attributes
int(19 | 1 << 9); int(1); int(13); int(2); int(0); int(obj.length); // variables
int(2 | 1 << 10); int(1); chars('names'); int(16); int(1); chars('movielens'); int(254);
int(19); int(0);                                                // references = list()
int(13); int(1); int(Number(compressed));                       // compressed
int(2 | 1 << 10); int(1 << 8 | 255);                            // tag: REFSXP 1 = `names`
int(16); int(3); chars('variables'); chars('references'); chars('compressed'); int(254);
fs.writeFileSync(out + '/Rdata.rdx', zlib.gzipSync(Buffer.concat(parts)));
EOF
for m in "2 2 bzip2" "Z 3 xz"; do
    set -- $m
    if ! command -v $3 >/dev/null 2>&1; then echo "skip $3 objects: $3 is not installed"; continue; fi
    EXTRACT=$PWD/$EXTRACT node "$WORK/make_db.js" $RDATA "$1" "$2" "$WORK/db_$3" $3 || { fail "building the $3 database"; continue; }
    if node $EXTRACT "$WORK/db_$3" "$WORK/out_$3" >"$WORK/$3.log" 2>&1 &&
        cmp -s "$WORK/out_$3/clicks_train.tsv" "$WORK/a/clicks_train.tsv" &&
        cmp -s "$WORK/out_$3/clicks_test.tsv" "$WORK/a/clicks_test.tsv" &&
        cmp -s "$WORK/out_$3/ratings.tsv" "$R"; then
        pass "$3-compressed object (method byte '$1', compressed = $2) gives the same files"
    else
        fail "$3-compressed object: $(tail -n 1 "$WORK/$3.log")"
    fi
    rm -rf "$WORK/out_$3"
done

# ---- 4. determinism and bad input -------------------------------------------------------------
same=1
for f in ratings.tsv clicks_train.tsv clicks_test.tsv; do cmp -s "$WORK/a/$f" data/movielens/$f || same=0; done
[ $same -eq 1 ] && pass "two extractions are byte-identical" || fail "extractions differ from data/movielens"

# expect_err NAME PATTERN DIR: the extractor must exit 1 with one error line matching PATTERN.
expect_err() {
    local rc=0
    node $EXTRACT "$3" "$WORK/bad_out" >"$WORK/out" 2>"$WORK/err" || rc=$?
    if [ $rc -eq 1 ] && [ "$(wc -l <"$WORK/err")" -eq 1 ] && grep -q "^movielens_extract: error: .*$2.*(hint: " "$WORK/err"; then
        pass "$1: $(cat "$WORK/err")"
    else
        fail "$1: exit $rc, stderr: $(head -c 300 "$WORK/err")"
    fi
}
mkdir -p "$WORK/trunc" "$WORK/notgz" "$WORK/method"
cp $RDATA/Rdata.rdx "$WORK/trunc/"
head -c 1000000 $RDATA/Rdata.rdb >"$WORK/trunc/Rdata.rdb"
expect_err "truncated .rdb" "past the end of the file" "$WORK/trunc"
cp $RDATA/Rdata.rdb "$WORK/notgz/"
echo "not an index" >"$WORK/notgz/Rdata.rdx"
expect_err ".rdx not gzip" "is not gzip data" "$WORK/notgz"
if [ -d "$WORK/db_xz" ]; then
    cp "$WORK/db_xz/Rdata.rdx" "$WORK/method/"
    { head -c 4 "$WORK/db_xz/Rdata.rdb"; printf 'Q'; tail -c +6 "$WORK/db_xz/Rdata.rdb"; } >"$WORK/method/Rdata.rdb"
    expect_err "unknown compression byte" "unknown compression method byte 0x51" "$WORK/method"
fi
expect_err "missing folder" "cannot read" "$WORK/nonexistent"

[ $fails -eq 0 ] || { echo "$fails check(s) failed"; exit 1; }
echo "movielens_test: all checks passed"
