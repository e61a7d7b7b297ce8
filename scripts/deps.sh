#!/usr/bin/env bash
# Installs the Debian packages meshwit needs to build, test and benchmark, and only those that
# are missing. Safe to run any number of times: with everything present it changes nothing.
set -euo pipefail

PACKAGES=(
    build-essential   # gcc, g++ (tests/gpu/emu), make, libc headers, the gcc sanitizer runtimes
    cmake
    pkg-config
    libopenblas-dev   # the CPU backend's BLAS (ships openblas.pc)
    libdnnl-dev       # oneDNN: the CPU backend's contractions (MESHWIT_DNNL=AUTO)
    libcriterion-dev  # unit tests
    clang             # second compiler
    clang-format      # style check
    libclang-rt-dev   # clang's sanitizer runtimes
    gnuplot-nox       # plots of bench results
    openmpi-bin       # MPI between processes (MESHWIT_MPI=AUTO)
    libopenmpi-dev
)

if ! command -v dpkg >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1; then
    echo "deps.sh: not a Debian-based system; install these (or their equivalents):" >&2
    echo "  ${PACKAGES[*]}" >&2
    exit 0
fi

installed() {
    dpkg -s "$1" 2>/dev/null | grep -q '^Status: install ok installed$'
}

missing=()
for pkg in "${PACKAGES[@]}"; do
    installed "$pkg" || missing+=("$pkg")
done

if [ "${#missing[@]}" -eq 0 ]; then
    echo "deps.sh: all ${#PACKAGES[@]} packages present"
    exit 0
fi

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
    if ! command -v sudo >/dev/null 2>&1; then
        echo "deps.sh: need root (or sudo) to install: ${missing[*]}" >&2
        exit 1
    fi
    SUDO=(sudo)
fi

echo "deps.sh: installing ${missing[*]}"
log=$(mktemp "${TMPDIR:-/tmp}/meshwit-deps.XXXXXX")
trap 'rm -f "$log"' EXIT
export DEBIAN_FRONTEND=noninteractive
if ! ${SUDO[@]+"${SUDO[@]}"} env DEBIAN_FRONTEND=noninteractive apt-get update -q >"$log" 2>&1 ||
    ! ${SUDO[@]+"${SUDO[@]}"} env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -q --no-install-recommends "${missing[@]}" >>"$log" 2>&1; then
    cat "$log" >&2
    echo "deps.sh: apt-get failed (output above)" >&2
    exit 1
fi
echo "deps.sh: done"
