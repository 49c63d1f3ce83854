#!/usr/bin/env bash
# The lanes runtime and its tests under ThreadSanitizer: no data race, no lock-order problem.
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
make -s tsan BUILD="$NB_BUILD" > "$TMP/tsan.log" 2>&1 && { tail -n 3 "$TMP/tsan.log"; pass "lanes tests clean under TSan"; } \
    || { tail -n 40 "$TMP/tsan.log"; fail "TSan run"; }
finish
