#!/usr/bin/env bash
# OpenBLAS for machines that cannot install Debian packages (the lent GPU machines have no
# package registry): fetch the packages where apt works, carry the folder, unpack them there.
#
#   bash scripts/device_deps.sh fetch        # here: .deps/*.deb (git-ignored, ~12 MB)
#   source scripts/device_deps.sh use        # there: unpack into .deps/root and export
#                                            # NB_MAKE_FLAGS for make (BLAS_DIR, BLAS_INC)
#                                            # and LD_LIBRARY_PATH for libgfortran
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEPS=$ROOT/.deps
case "${1:-}" in
fetch)
    mkdir -p "$DEPS" && cd "$DEPS" && apt-get download libopenblas0-openmp libopenblas-openmp-dev libgfortran5
    ;;
use)
    if [ -f /usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so ]; then
        export NB_MAKE_FLAGS=""
    else
        ls "$DEPS"/*.deb >/dev/null 2>&1 || { echo "device_deps: no .deps/*.deb (run 'bash scripts/device_deps.sh fetch' where apt works, then carry .deps)" >&2; return 1; }
        mkdir -p "$DEPS/root"
        for f in "$DEPS"/*.deb; do dpkg-deb -x "$f" "$DEPS/root"; done
        lib=$DEPS/root/usr/lib/x86_64-linux-gnu
        export NB_MAKE_FLAGS="BLAS_DIR=$lib/openblas-openmp BLAS_INC=$DEPS/root/usr/include/x86_64-linux-gnu/openblas-openmp"
        export LD_LIBRARY_PATH=$lib:$lib/openblas-openmp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    fi
    ;;
*)
    echo "usage: bash scripts/device_deps.sh fetch | source scripts/device_deps.sh use" >&2
    ;;
esac
