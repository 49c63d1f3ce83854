#!/usr/bin/env bash
# Runs every test program (build/tests/test_*) and every shell test (tests/*_test.sh).
# Exit 77 means skipped (e.g. a GPU test without a GPU, or node missing for the tokenizer
# reference). Prints a closing "N passed, N failed, N skipped" line.
#
# Two tests at a time (NB_TEST_JOBS, default: 2 where there are 2 cores or more): most tests run
# one rank on one thread, or wait on mpirun, and leave a core idle. Tests that build or fetch into
# shared folders (the ASan build, the tokenizer files) run first, beside each other but before any
# test that reads what they make.
set -u
BUILD=${1:-build}
JOBS=${NB_TEST_JOBS:-$(( $(env -u OMP_NUM_THREADS nproc) >= 2 ? 2 : 1 ))}
ALONE="asan_test hf_tokenizer_test" # the ASan build (fuzz_test reuses it) and the tokenizer files

mkdir -p "$BUILD/logs"
rm -f "$BUILD"/logs/*.result

# run_one NAME CMD...: runs CMD into logs/NAME.log, prints its line, records it in logs/NAME.result
run_one() {
    local name=$1; shift
    local t0=$(date +%s%N)
    "$@" > "$BUILD/logs/$name.log" 2>&1
    local rc=$?
    local dt=$(awk -v a="$t0" -v b="$(date +%s%N)" 'BEGIN {printf "%.1f", (b - a) / 1e9}')
    local out
    if [ $rc -eq 0 ]; then out="PASS  $name (${dt}s)"; echo pass > "$BUILD/logs/$name.result"
    elif [ $rc -eq 77 ]; then out="SKIP  $name: $(tail -n 1 "$BUILD/logs/$name.log")"; echo skip > "$BUILD/logs/$name.result"
    else out="FAIL  $name (exit $rc)"$'\n'"$(sed 's/^/      /' "$BUILD/logs/$name.log" | tail -n 40)"; echo fail > "$BUILD/logs/$name.result"; fi
    echo "$out"
}
export -f run_one
export BUILD

# the command line of each test, one per line: NAME CMD...
list() {
    for t in "$BUILD"/tests/test_*; do
        [ -x "$t" ] || continue
        case "$t" in *.o|*.d) continue;; esac
        echo "$(basename "$t") $t"
    done
    for s in tests/*_test.sh; do
        [ -f "$s" ] || continue
        echo "$(basename "$s" .sh) env NB_BUILD=$BUILD bash $s"
    done
}
list > "$BUILD/logs/tests.txt"
is_alone() { case " $ALONE " in *" $1 "*) return 0;; esac; return 1; }

# the two first-phase tests share nothing with each other: they run side by side
while read -r name cmd; do
    is_alone "$name" && echo "$name $cmd"
done < "$BUILD/logs/tests.txt" | xargs -P "$JOBS" -L 1 bash -c 'run_one "$@"' _
# The rest side by side, on a core each: a run without --threads takes OMP_NUM_THREADS (README);
# two tests with a thread per core each oversubscribe CI's 2 cores, and OpenMP barriers then wait
# on descheduled threads.
[ "$JOBS" -gt 1 ] && export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# the longest first (times of a 2-core CI run), so that no long test starts last and runs alone
LONG="erase_test readme_test ranks_test fuzz_test import_test stream_test run_dir_test schedules_test pipe_test defects31_test erase_seqctr_test"
{
    for l in $LONG; do grep "^$l " "$BUILD/logs/tests.txt"; done
    while read -r name cmd; do
        is_alone "$name" || case " $LONG " in *" $name "*) ;; *) echo "$name $cmd" ;; esac
    done < "$BUILD/logs/tests.txt"
} | xargs -P "$JOBS" -L 1 bash -c 'run_one "$@"' _

pass=0 fail=0 skip=0 failed=()
while read -r name cmd; do
    case $(cat "$BUILD/logs/$name.result" 2>/dev/null) in
    pass) pass=$((pass + 1)) ;;
    skip) skip=$((skip + 1)) ;;
    *) fail=$((fail + 1)); failed+=("$name") ;;
    esac
done < "$BUILD/logs/tests.txt"
[ ${#failed[@]} -gt 0 ] && echo "failed: ${failed[*]}"
echo "$pass passed, $fail failed, $skip skipped"
[ $fail -eq 0 ]
