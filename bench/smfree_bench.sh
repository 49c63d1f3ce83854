#!/usr/bin/env bash
# SM-free communication (FreeScale): how much a GEMM slows while another stream copies with an SM
# kernel (NCCL-style, 8/16/32 CTAs) against copy-engine copies (cudaMemcpyAsync D2D, pinned
# D2H + H2D), at the seqctr dense blocks' shapes and one large GEMM.
#   bash bench/smfree_bench.sh [--no-build] [--no-graph]
# Runs test_smfree_cuda (the copies' correctness), then its --bench: per shape, GEMM ms per call,
# slowdown vs alone, and the copy stream's GB/s beside the GEMMs and alone. With OUT set, the
# output is also written to $OUT/smfree.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
NB_BUILD=${NB_BUILD:-build-dev}
build=1 extra=()
while [ $# -gt 0 ]; do
    case "$1" in
        --no-build) build=0 ;;
        --no-graph) extra+=(--no-graph) ;;
        -h|--help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "smfree_bench.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
if [ $build = 1 ]; then
    source scripts/device_deps.sh use || exit 1
    make -j"$(nproc)" BUILD="$NB_BUILD" ${NB_MAKE_FLAGS:-} >/tmp/smfree_build.log 2>&1 \
        || { tail -20 /tmp/smfree_build.log; exit 1; }
fi
T=$NB_BUILD/tests/test_smfree_cuda
log=/dev/null
[ -n "${OUT:-}" ] && { mkdir -p "$OUT" && log=$OUT/smfree.txt; }
{
    "$T"; t=$?
    echo "test_smfree_cuda rc=$t"
    [ $t = 0 ] || exit $t
    "$T" --bench "${extra[@]}"
} 2>&1 | tee "$log"
