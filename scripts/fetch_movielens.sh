#!/usr/bin/env bash
# Fetch MovieLens "latest-small" (2016: 100,004 ratings, 671 users, 9,066 movies) into the
# git-ignored data/movielens/ and write the click framing that `--data movielens` reads.
#
#   scripts/fetch_movielens.sh [--force]          (run from any folder; needs apt-get, dpkg-deb, node)
#
# The data is inside Debian's r-cran-dslabs 0.7.4-1 (an R lazy-load database, object `movielens`).
# GroupLens' terms forbid redistributing it, so it is extracted here at fetch time and never
# committed. Steps: `apt-get download r-cran-dslabs=0.7.4-1` (no install, nothing from the package
# is executed), `dpkg-deb -x` into data/movielens/pkg, then scripts/movielens_extract.js writes
#   data/movielens/ratings.tsv, clicks_train.tsv, clicks_test.tsv
# (formats and the time split are documented at the top of scripts/movielens_extract.js).
# Cached: a second run does nothing unless the outputs are older than the extractor, or --force.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DST=$ROOT/data/movielens
PKG=r-cran-dslabs
VERSION=0.7.4-1
RDATA=$DST/pkg/usr/lib/R/site-library/dslabs/data
EXTRACT=$ROOT/scripts/movielens_extract.js
OUTPUTS="ratings.tsv clicks_train.tsv clicks_test.tsv"

die() { echo "fetch_movielens: error: $*" >&2; exit 1; }
say() { echo "fetch_movielens: $*"; }

force=0
case ${1:-} in
    "") ;;
    --force) force=1 ;;
    *) die "unknown argument '$1' (hint: scripts/fetch_movielens.sh [--force])" ;;
esac

up_to_date() {
    local f
    for f in $OUTPUTS; do
        [ -f "$DST/$f" ] && [ "$DST/$f" -nt "$EXTRACT" ] || return 1
    done
}

if [ $force -eq 0 ] && up_to_date; then
    say "data/movielens already extracted ($OUTPUTS)"
    exit 0
fi

command -v node >/dev/null 2>&1 || die "node is not installed (hint: apt-get install nodejs)"
mkdir -p "$DST" || die "cannot create $DST"

if [ $force -eq 1 ] || [ ! -f "$RDATA/Rdata.rdx" ] || [ ! -f "$RDATA/Rdata.rdb" ]; then
    command -v apt-get >/dev/null 2>&1 || die "apt-get is not available (hint: this fetch needs a Debian/Ubuntu system with Debian 12's $PKG $VERSION)"
    command -v dpkg-deb >/dev/null 2>&1 || die "dpkg-deb is not available (hint: apt-get install dpkg)"
    tmp=$(mktemp -d "$DST/.apt.XXXXXX") || die "cannot create a temp folder in $DST"
    trap 'rm -rf "$tmp"' EXIT
    say "downloading $PKG=$VERSION (apt-get download)"
    # apt warns that its _apt user cannot write the root-owned temp folder; the log is shown
    # only when the download fails.
    if ! (cd "$tmp" && apt-get download "$PKG=$VERSION") >"$tmp/apt.log" 2>&1; then
        cat "$tmp/apt.log" >&2
        die "apt-get download $PKG=$VERSION failed (hint: run apt-get update; the package is in Debian 12 'bookworm')"
    fi
    deb=$(ls "$tmp"/*.deb 2>/dev/null | head -n 1)
    [ -n "$deb" ] || die "apt-get download left no .deb in $tmp"
    got=$(dpkg-deb -f "$deb" Version) || die "$deb is not a Debian package"
    [ "$got" = "$VERSION" ] || die "downloaded $PKG version $got, expected $VERSION"
    rm -rf "$DST/pkg.new"
    dpkg-deb -x "$deb" "$DST/pkg.new" || die "dpkg-deb -x $deb failed"
    [ -f "$DST/pkg.new/usr/lib/R/site-library/dslabs/data/Rdata.rdb" ] ||
        die "$PKG $VERSION has no usr/lib/R/site-library/dslabs/data/Rdata.rdb"
    rm -rf "$DST/pkg" && mv "$DST/pkg.new" "$DST/pkg"
fi

node "$EXTRACT" "$RDATA" "$DST" || die "extraction failed (see the error above)"
say "done: data/movielens/{ratings,clicks_train,clicks_test}.tsv"
