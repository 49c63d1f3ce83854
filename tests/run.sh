#!/usr/bin/env bash
# Runs every test program (build/tests/test_*) and every shell test (tests/*_test.sh).
# Exit 77 means skipped (e.g. a GPU test without a GPU, or node missing for the tokenizer
# reference). Prints a closing "N passed, N failed, N skipped" line.
set -u
BUILD=${1:-build}
pass=0; fail=0; skip=0; failed=()
run_one() {
    local name=$1; shift
    local t0=$(date +%s%N)
    "$@" > "$BUILD/logs/$name.log" 2>&1
    local rc=$?
    local dt=$(awk -v a="$t0" -v b="$(date +%s%N)" 'BEGIN {printf "%.1f", (b - a) / 1e9}')
    if [ $rc -eq 0 ]; then pass=$((pass+1)); echo "PASS  $name (${dt}s)";
    elif [ $rc -eq 77 ]; then skip=$((skip+1)); echo "SKIP  $name: $(tail -n 1 "$BUILD/logs/$name.log")";
    else fail=$((fail+1)); failed+=("$name"); echo "FAIL  $name (exit $rc)"; sed 's/^/      /' "$BUILD/logs/$name.log" | tail -n 40; fi
}
mkdir -p "$BUILD/logs"
for t in "$BUILD"/tests/test_*; do
    [ -x "$t" ] || continue
    case "$t" in *.o|*.d) continue;; esac
    run_one "$(basename "$t")" "$t"
done
for s in tests/*_test.sh; do
    [ -f "$s" ] || continue
    run_one "$(basename "$s" .sh)" env NB_BUILD="$BUILD" bash "$s"
done
[ ${#failed[@]} -gt 0 ] && echo "failed: ${failed[*]}"
echo "$pass passed, $fail failed, $skip skipped"
[ $fail -eq 0 ]
