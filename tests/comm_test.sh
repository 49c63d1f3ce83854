#!/usr/bin/env bash
# The comm layer over real ranks (mpirun -np 2 and -np 4 on one machine; CI runs as root, hence
# --allow-run-as-root, and has 2 cores, hence --oversubscribe):
#  - every collective's results on every rank (build/tests/test_comm's checks);
#  - a rank that is killed, exits without finalizing, stalls past --comm-timeout, or fails
#    (nb_fail) makes the whole job exit non-zero, soon, with a message that names it; an outer
#    `timeout` turns a hang into a failure;
#  - counts that disagree between ranks, and a check that fails on one rank only, are one clear
#    error (on every rank for the latter);
#  - torchrun's variables without an MPI launcher: a clear error; WORLD_SIZE=1 runs;
#  - --comm-sm-free on the CPU: a clear error (its GPU runs are scripts/device_session.sh comm_gpu's).
source "$(dirname "$0")/lib.sh"
T=$NB_BUILD/tests/test_comm
[ -x "$T" ] || { echo "no $T (build first)"; exit 1; }
if ! command -v mpirun >/dev/null 2>&1; then echo "skipped: no mpirun (bash scripts/setup.sh installs openmpi-bin)"; exit 77; fi
if ! grep -q NB_WITH_MPI "$NB_BUILD/.flags" 2>/dev/null; then echo "skipped: this build has no MPI (install libopenmpi-dev, rebuild)"; exit 77; fi
export OMPI_MCA_rmaps_base_oversubscribe=1 # same as --oversubscribe, for every mpirun below
MPIRUN=(mpirun --oversubscribe --allow-run-as-root)

# run_ranks NAME LIMIT_S NP ARGS...: run test_comm on NP ranks under an outer timeout; sets rc, dt
run_ranks() {
    local name=$1 limit=$2 np=$3; shift 3
    local t0=$(date +%s.%N)
    timeout --kill-after 5 "$limit" "${MPIRUN[@]}" -np "$np" "$T" "$@" >"$TMP/$name.out" 2>&1
    rc=$?
    dt=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
}

for np in 2 4; do
    run_ranks "np$np" 90 $np
    if [ $rc -eq 0 ] && ! grep -q FAIL "$TMP/np$np.out"; then pass "$np ranks: every collective ($(grep -c '^ok' "$TMP/np$np.out") cases, ${dt}s)"
    else fail "$np ranks: exit $rc"; tail -n 30 "$TMP/np$np.out"; fi
done

# expect_job NAME LIMIT_S PATTERN NP ARGS...: the job must end non-zero within LIMIT_S (not killed by
# the outer timeout) and its output must match PATTERN (grep -E).
expect_job() {
    local name=$1 limit=$2 pat=$3 np=$4; shift 4
    run_ranks "$name" $((limit + 30)) "$np" "$@"
    if [ $rc -eq 124 ]; then fail "$name: hung (${dt}s, killed by the outer timeout)"; tail -n 20 "$TMP/$name.out"; return; fi
    if [ $rc -eq 0 ]; then fail "$name: the job exited 0"; tail -n 20 "$TMP/$name.out"; return; fi
    if awk -v d="$dt" -v l="$limit" 'BEGIN {exit !(d > l)}'; then fail "$name: took ${dt}s (limit ${limit}s)"; return; fi
    if ! grep -Eq "$pat" "$TMP/$name.out"; then fail "$name: no line matches '$pat':"; tail -n 20 "$TMP/$name.out"; return; fi
    pass "$name: exit $rc in ${dt}s: $(grep -Em1 "$pat" "$TMP/$name.out" | cut -c1-150)"
}

# Stall: rank 2 sleeps far past the 5 s timeout; the others name it and the job is aborted.
expect_job stall 25 "rank [013]: no data from rank 2 within 5 s in all-reduce.*--comm-timeout.*rank 2 died or stalled" \
    4 --fail stall --fail-rank 2 --timeout 5
# Killed (SIGKILL mid-run): mpirun kills the others and names the lost rank (we never see it die).
expect_job kill 20 "process rank 1 .*exited on signal 9" 2 --fail kill --fail-rank 1 --timeout 10
# Killed, and mpirun told to let the others run on (as srun does without --kill-on-bad-exit): our
# own timeout names the lost rank.
OMPI_MCA_orte_abort_on_non_zero_status=0 expect_job kill_no_abort 20 \
    "rank [02]: no data from rank 1 within 3 s in all-reduce.*rank 1 died or stalled" 3 --fail kill --fail-rank 1 --timeout 3
# Exit without nb_comm_finalize: mpirun ends the job and names the rank.
expect_job exit 20 "due to process rank 3 with PID" 4 --fail exit --fail-rank 3 --timeout 10
# nb_fail on one rank: the on-fail hook aborts the job at once (mpirun names the rank).
expect_job nb_fail 10 "injected failure on rank 1" 4 --fail fail --fail-rank 1 --timeout 60
grep -q "rank 1 of 4 failed (the error above): aborting every rank" "$TMP/nb_fail.out" && pass "nb_fail: the job is aborted, naming rank 1" \
    || fail "nb_fail: no 'rank 1 of 4 failed ... aborting every rank'"
# Counts that disagree: a clear error naming both ranks, not a timeout.
expect_job counts 10 "rank 0: rank 1 sent more than .* the ranks' counts disagree" 2 --fail counts --fail-rank 1 --timeout 60
# A check false on rank 2 only: every rank fails with rank 2's message.
expect_job check 10 "error: rank 2: data file 'x.bin' missing on rank 2" 4 --fail check --fail-rank 2 --timeout 60
n=$(grep -c "error: rank 2: data file 'x.bin' missing on rank 2" "$TMP/check.out")
[ "$n" -eq 4 ] && pass "check: the same message on all 4 ranks" || fail "check: the message on $n of 4 ranks"

# torchrun's environment without mpirun: refused before MPI is touched, with the launch hint.
expect_error torchrun "no MPI launcher started it.*mpirun -np N" env WORLD_SIZE=2 RANK=1 LOCAL_RANK=1 "$T"
env WORLD_SIZE=1 RANK=0 LOCAL_RANK=0 "$T" >"$TMP/w1.out" 2>&1 && pass "WORLD_SIZE=1: one process runs" \
    || { fail "WORLD_SIZE=1"; tail "$TMP/w1.out"; }
expect_error parse "unknown --comm 'nvlink'" "$T" --parse nvlink
# --comm-sm-free on the CPU (its GPU runs: scripts/device_session.sh comm_gpu)
expect_error sm_free_cpu "--comm-sm-free is for GPU ranks" "$T" --sm-free
finish
