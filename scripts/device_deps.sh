#!/usr/bin/env bash
# OpenBLAS and Open MPI for machines that cannot install Debian packages (the lent GPU machines
# have no package registry): fetch the packages where apt works, carry the folder, unpack them there.
#
#   bash scripts/device_deps.sh fetch        # here: .deps/*.deb (OpenBLAS, ~12 MB),
#                                            # .deps/mpi/*.deb (Open MPI, ~5 MB) and
#                                            # .deps/zlib/*.deb (zlib and its header, ~0.3 MB)
#                                            # .deps/utf8proc/*.deb (utf8proc, ~0.1 MB)
#   source scripts/device_deps.sh use        # there: unpack what the machine lacks and export
#                                            # NB_MAKE_FLAGS for make (BLAS_DIR, BLAS_INC, ZLIB_INC, ZLIB_DIR, MPI_INC,
#                                            # MPI_LIBDIR, NCCL_HOME) and LD_LIBRARY_PATH; for Open MPI also
#                                            # PATH (mpirun), OPAL_PREFIX and a few OMPI_MCA_ settings
# Each library is taken from the machine when it has it, from .deps otherwise.
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEPS=$ROOT/.deps
BLAS_DEBS=(libopenblas0-openmp libopenblas-openmp-dev libgfortran5)
UTF8_DEBS=(libutf8proc2 libutf8proc-dev) # NFC for Qwen's tokenizer (src/data/hf_encode.c)
# Open MPI 4.1 and what its core needs (libudev1 only where the machine has none). The network
# plugins' libraries (UCX, libfabric, verbs, PSM) are left out: one machine needs only shared
# memory (vader), so those plugins are switched off below instead of failing to load.
MPI_DEBS=(openmpi-bin libopenmpi3 openmpi-common libopenmpi-dev libhwloc15 libevent-core-2.1-7
          libevent-pthreads-2.1-7 libpmix2 libmunge2 libudev1)
# unpack DIR: DIR/*.deb into DIR/root, once
unpack() {
    ls "$1"/*.deb >/dev/null 2>&1 || { echo "device_deps: no $1/*.deb (run 'bash scripts/device_deps.sh fetch' where apt works, then carry .deps)" >&2; return 1; }
    [ -f "$1/root/.unpacked" ] && return 0
    mkdir -p "$1/root"
    for f in "$1"/*.deb; do dpkg-deb -x "$f" "$1/root" || return 1; done
    touch "$1/root/.unpacked"
}
# Open MPI from .deps/mpi: only the libraries the machine lacks go on LD_LIBRARY_PATH (a library
# of ours must not shadow a newer one of the machine's, e.g. under PyTorch).
use_mpi() {
    local M=$DEPS/mpi lib=$DEPS/mpi/root/usr/lib/x86_64-linux-gnu
    unpack "$M" || return 1
    mkdir -p "$M/lib"
    local have; have=$(ldconfig -p 2>/dev/null | awk 'NR > 1 {print $1}')
    for f in "$lib"/lib*.so.*; do
        local b; b=$(basename "$f")
        grep -qxF "$b" <<<"$have" || ln -sf "$f" "$M/lib/$b"
    done
    ln -sf orterun "$M/root/usr/bin/mpirun"
    export OPAL_PREFIX=$M/root/usr  # plugins and help files under it instead of /usr
    export PMIX_MCA_mca_base_component_path=$lib/pmix2/lib/pmix
    export PATH=$M/root/usr/bin${PATH:+:$PATH}
    export LD_LIBRARY_PATH=$M/lib:$lib/openmpi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    # shared memory and TCP only; if vader's single-copy reads (CMA) are refused there, also
    # export OMPI_MCA_btl_vader_single_copy_mechanism=none (10x slower for large messages)
    export OMPI_MCA_mca_base_component_show_load_errors=0 OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader,tcp \
           OMPI_MCA_mtl=^ofi,psm,psm2 OMPI_MCA_osc=^ucx
    NB_MAKE_FLAGS="$NB_MAKE_FLAGS MPI_INC=$lib/openmpi/include MPI_LIBDIR=$lib/openmpi/lib"
}
# zlib's header and link name from .deps/zlib when the machine has only the runtime library (or
# none): the binary links .deps' libz.so.1 through its rpath, shadowing nothing else.
use_zlib() {
    local Z=$DEPS/zlib
    unpack "$Z" || return 1
    mkdir -p "$Z/lib"
    local so; so=$(ls "$Z"/root/lib/x86_64-linux-gnu/libz.so.1.* "$Z"/root/usr/lib/x86_64-linux-gnu/libz.so.1.* 2>/dev/null | head -1)
    [ -n "$so" ] || { echo "device_deps: no libz.so.1 in $Z/*.deb" >&2; return 1; }
    ln -sf "$so" "$Z/lib/libz.so"
    ln -sf "$so" "$Z/lib/libz.so.1"
    NB_MAKE_FLAGS="$NB_MAKE_FLAGS ZLIB_INC=$Z/root/usr/include ZLIB_DIR=$Z/lib"
}
case "${1:-}" in
fetch)
    mkdir -p "$DEPS/mpi" "$DEPS/zlib" "$DEPS/utf8proc" && (cd "$DEPS" && apt-get download "${BLAS_DEBS[@]}") \
        && (cd "$DEPS/mpi" && apt-get download "${MPI_DEBS[@]}") && (cd "$DEPS/zlib" && apt-get download zlib1g zlib1g-dev) \
        && (cd "$DEPS/utf8proc" && apt-get download "${UTF8_DEBS[@]}")
    ;;
use)
    export NB_MAKE_FLAGS=""
    if [ ! -f /usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so ]; then
        unpack "$DEPS" || return 1
        lib=$DEPS/root/usr/lib/x86_64-linux-gnu
        NB_MAKE_FLAGS="BLAS_DIR=$lib/openblas-openmp BLAS_INC=$DEPS/root/usr/include/x86_64-linux-gnu/openblas-openmp"
        export LD_LIBRARY_PATH=$lib:$lib/openblas-openmp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    fi
    if ! mpicc --showme:compile >/dev/null 2>&1; then use_mpi || return 1; fi
    if [ ! -f /usr/include/zlib.h ] || [ ! -e /usr/lib/x86_64-linux-gnu/libz.so ]; then use_zlib || return 1; fi
    if [ ! -f /usr/include/utf8proc.h ]; then
        unpack "$DEPS/utf8proc" || return 1
        NB_MAKE_FLAGS="$NB_MAKE_FLAGS UTF8PROC_ROOT=$DEPS/utf8proc/root"
        export LD_LIBRARY_PATH=$DEPS/utf8proc/root/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    fi
    # NCCL: the CUDA toolkit's, else the one PyTorch brings (the nvidia-nccl wheel)
    if [ ! -f "${CUDA_HOME:-/usr/local/cuda}/include/nccl.h" ]; then
        for d in $(python3 -c 'import nvidia.nccl as m; print(*m.__path__)' 2>/dev/null); do
            [ -f "$d/include/nccl.h" ] && { NB_MAKE_FLAGS="$NB_MAKE_FLAGS NCCL_HOME=$d"; break; }
        done
    fi
    ;;
*)
    echo "usage: bash scripts/device_deps.sh fetch | source scripts/device_deps.sh use" >&2
    ;;
esac
