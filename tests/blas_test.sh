#!/usr/bin/env bash
# The GEMM check of the OpenBLAS kernel choice (core/blas.h) under every kernel set this OpenBLAS
# can run on this CPU: the check must pass on each (a kernel nobubble would choose must not be
# refused for nothing), and OpenBLAS must run the set that was asked for.
source "$(dirname "$0")/lib.sh"
BIN=$NB_BUILD/tests/test_blas
[ -x "$BIN" ] || { echo "missing $BIN"; exit 1; }
cores=(Prescott Core2 Nehalem)
grep -qw avx /proc/cpuinfo && cores+=(Sandybridge)
grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo && cores+=(Haswell)
grep -qw avx512f /proc/cpuinfo && grep -qw avx512bw /proc/cpuinfo && grep -qw avx512vl /proc/cpuinfo && cores+=(SkylakeX)
for c in "${cores[@]}"; do
    OPENBLAS_CORETYPE=$c "$BIN" > "$TMP/out" 2>&1; rc=$?
    used=$(sed -n 's/^OpenBLAS core \([^ ]*\).*/\1/p' "$TMP/out")
    [ $rc -eq 0 ] && [ "$used" = "$c" ] && pass "OPENBLAS_CORETYPE=$c: runs $used, GEMM check passes" \
        || { fail "OPENBLAS_CORETYPE=$c: exit $rc, runs '$used'"; tail -5 "$TMP/out"; }
done
finish
