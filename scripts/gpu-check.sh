#!/usr/bin/env bash
# The GPU check, made for a bare GPU machine (nvcc, CMake and a C compiler; no Debian packages,
# no network). Two halves:
#
#   scripts/gpu-check.sh --prepare   here, where apt works: downloads the .deb files the build and
#                                    the tests need that such a machine lacks (OpenBLAS, Criterion,
#                                    pkgconf and the libraries they load) into .gpu-deps/, which
#                                    git ignores and the working tree carries along.
#   scripts/gpu-check.sh OUTDIR      there: unpacks them into a private prefix (build-gpu-deps/,
#                                    never over /), points pkg-config, CMake and the loader at it,
#                                    builds build-gpu/ with CUDA for sm_90 on every core, and runs
#                                    the CPU tests, every gpu-labelled test with
#                                    MESHWIT_REQUIRE_GPU=1 (no GPU is a failure naming the CUDA
#                                    error, never a skip; this includes 10 GPT-2 steps on cuda:0
#                                    and cuda:0x2 against cpu:1, in f32 and bf16, and the bf16
#                                    kernels against the CPU's), and the GPU bench (linreg and
#                                    gpt2 on cuda:0 and cuda:0x2, with MFU; GPT-2 124M at context
#                                    1024 in bf16 and f32 with MFU against the dense peaks). It
#                                    writes
#                                    OUTDIR/log.txt, OUTDIR/summary.txt, OUTDIR/gpu-check.json and
#                                    the bench's OUTDIR/bench-*.json, and exits 1 if any stage
#                                    failed. Every stage has a time limit; the whole run stays
#                                    within GPU_CHECK_BUDGET seconds.
#
# Environment: GPU_ARCH (CMAKE_CUDA_ARCHITECTURES, default 90), JOBS (default: all cores),
# GPU_PEAK_TFLOPS (FP32 peak for the MFU column, default 67: H100/H200 SXM without tensor cores),
# GPU_PEAK_BF16_TFLOPS (dense bf16 tensor-core peak, default 989: H100/H200 SXM),
# GPU_CHECK_BUDGET (seconds for the whole run, default 560), BUILD (default build-gpu; kept between
# runs, so a second run only rebuilds what changed), GPU_CHECK_CLEAN=1 (build from scratch).
set -uo pipefail

# One brace group: bash reads all of it before running any, so editing this file while it runs
# cannot change what runs.
{
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEBS=$ROOT/.gpu-deps
MULTIARCH=x86_64-linux-gnu

# Runtime roots; their dependency closure is downloaded, less what every base image has (the C
# library and the compiler's runtime, which must be the machine's own).
RUNTIME_ROOTS="libopenblas0-pthread libcriterion3 pkgconf-bin"
# Headers and link-time files only (their own dependencies are for static linking).
DEV_PACKAGES="libopenblas-pthread-dev libcriterion-dev"
BASE_IMAGE="libc6 libgcc-s1 gcc-12-base libstdc++6 libcrypt1"
MAX_MIB=64

prepare() {
    command -v apt-get > /dev/null && command -v apt-cache > /dev/null ||
        { echo "gpu-check --prepare: needs apt-get and apt-cache" >&2; return 1; }
    local closure pkg keep=()
    closure=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
        --no-breaks --no-replaces --no-enhances $RUNTIME_ROOTS | grep -E '^[a-z0-9]' | sort -u)
    for pkg in $closure $DEV_PACKAGES; do
        case " $BASE_IMAGE " in *" $pkg "*) continue ;; esac
        keep+=("$pkg")
    done
    rm -rf "$DEBS"
    mkdir -p "$DEBS"
    echo "gpu-check --prepare: downloading ${#keep[@]} packages into $DEBS:"
    echo "  ${keep[*]}"
    (cd "$DEBS" && apt-get download "${keep[@]}") || return 1
    local mib
    mib=$(du -sm "$DEBS" | cut -f1)
    echo "gpu-check --prepare: $(ls "$DEBS"/*.deb | wc -l) files, ${mib} MiB (limit $MAX_MIB)"
    if [ "$mib" -ge "$MAX_MIB" ]; then
        echo "gpu-check --prepare: $DEBS exceeds $MAX_MIB MiB" >&2
        return 1
    fi
}

if [ "${1:-}" = "--prepare" ]; then
    prepare
    exit $?
fi
if [ $# -ne 1 ] || [ "${1:0:1}" = "-" ]; then
    sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
    exit 2
fi

mkdir -p "$1"
OUT=$(cd "$1" && pwd)
BUILD=$ROOT/${BUILD:-build-gpu}
PREFIX=$ROOT/build-gpu-deps
LIBDIR=$PREFIX/usr/lib/$MULTIARCH
JOBS=${JOBS:-$(nproc 2> /dev/null || echo 4)}
GPU_ARCH=${GPU_ARCH:-90}
BUDGET=${GPU_CHECK_BUDGET:-560}
DEADLINE=$((SECONDS + BUDGET))
: > "$OUT/log.txt"
exec > >(tee -a "$OUT/log.txt") 2>&1
cd "$ROOT"

NAMES=()
RESULTS=()
TIMES=()
NOTES=()
FAILED=0

# stage NAME LIMIT FUNCTION: runs FUNCTION with at most LIMIT seconds (less when the budget is
# nearly spent), records ok or FAILED with the first line saying why.
stage() {
    local name=$1 limit=$2 fn=$3 start=$SECONDS rc left note=""
    left=$((DEADLINE - SECONDS))
    [ "$limit" -gt "$left" ] && limit=$left
    echo
    echo "== $name (limit ${limit}s)"
    if [ "$limit" -le 0 ]; then
        rc=124
    else
        STAGE_LIMIT=$limit
        "$fn" > >(tee "$OUT/.stage.log") 2>&1
        rc=$?
        sleep 0.2 # let tee finish
    fi
    NAMES+=("$name")
    TIMES+=($((SECONDS - start)))
    if [ "$rc" -eq 0 ]; then
        RESULTS+=(ok)
    else
        FAILED=1
        RESULTS+=(FAILED)
        [ "$rc" -eq 124 ] && note="over its time limit (${limit}s)"
        local why
        why=$(grep -m1 -E '^FAIL:|error:|Error|FAILED|failed' "$OUT/.stage.log" 2> /dev/null)
        [ -n "$why" ] && note="${note:+$note; }$why"
    fi
    NOTES+=("$note")
    rm -f "$OUT/.stage.log"
}

run_limited() { timeout --kill-after=10 "$STAGE_LIMIT" "$@"; }

# Unpacks every .deb into the prefix and writes the pkg-config files for it.
do_deps() {
    local debs=("$DEBS"/*.deb)
    if [ ! -e "${debs[0]}" ]; then
        echo "FAIL: no .deb files in $DEBS: run scripts/gpu-check.sh --prepare on a machine with apt"
        return 1
    fi
    rm -rf "$PREFIX"
    mkdir -p "$PREFIX/bin"
    local deb
    for deb in "${debs[@]}"; do
        if command -v dpkg-deb > /dev/null; then
            dpkg-deb -x "$deb" "$PREFIX" || return 1
        else # ar and tar (which tells data.tar.xz/.zst/.gz apart from a file, not a pipe)
            local member tmp=$PREFIX/.member
            member=$(ar t "$deb" | grep '^data\.tar') || return 1
            mkdir -p "$tmp" && (cd "$tmp" && ar x "$deb" "$member") &&
                tar -x -f "$tmp/$member" -C "$PREFIX" || return 1
            rm -rf "$tmp"
        fi
    done
    echo "unpacked ${#debs[@]} packages into $PREFIX"
    # The prefix's pkg-config files live where CMake looks too (CMAKE_PREFIX_PATH/lib/<multiarch>/
    # pkgconfig), so they are fixed in place. Debian's openblas.pc is reached through
    # /etc/alternatives, which unpacking does not make: the real one, pointed at the prefix.
    PCDIR=$LIBDIR/pkgconfig
    mkdir -p "$PCDIR"
    local blas_pc=$LIBDIR/openblas-pthread/pkgconfig/openblas.pc
    [ -f "$blas_pc" ] || { echo "FAIL: $blas_pc is missing from the packages"; return 1; }
    sed -e "s|=/usr/|=$PREFIX/usr/|g" -e "s|^prefix=/usr|prefix=$PREFIX/usr|" "$blas_pc" \
        > "$PCDIR/openblas.pc"
    # Criterion's own file names static-only dependencies by absolute path; a shared link needs
    # none of them.
    local version
    version=$(sed -n 's/^Version: *//p' "$LIBDIR/pkgconfig/criterion.pc")
    cat > "$PCDIR/criterion.pc.new" << EOF
prefix=$PREFIX/usr
includedir=\${prefix}/include
libdir=\${prefix}/lib/$MULTIARCH

Name: criterion
Description: Criterion unit-testing framework (unpacked by gpu-check.sh)
Version: $version
Libs: -L\${libdir} -lcriterion
Cflags: -I\${includedir}
EOF
    mv "$PCDIR/criterion.pc.new" "$PCDIR/criterion.pc"
    # pkgconf from the packages, with its library, when it runs here; else the machine's own.
    cat > "$PREFIX/bin/pkg-config" << EOF
#!/bin/sh
LD_LIBRARY_PATH="$LIBDIR\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "$PREFIX/usr/bin/pkgconf" "\$@"
EOF
    chmod +x "$PREFIX/bin/pkg-config"
    if "$PREFIX/bin/pkg-config" --version > /dev/null 2>&1; then
        PKG_CONFIG=$PREFIX/bin/pkg-config
    else
        PKG_CONFIG=$(command -v pkg-config) || { echo "FAIL: no pkg-config runs here"; return 1; }
    fi
    echo "pkg-config: $PKG_CONFIG"
    # Only the prefix's files: a system OpenBLAS or Criterion must not be picked up instead.
    PKG_CONFIG_LIBDIR=$PCDIR PKG_CONFIG_PATH='' "$PKG_CONFIG" --modversion openblas criterion
}

do_configure() {
    [ "${GPU_CHECK_CLEAN:-0}" = 1 ] && rm -rf "$BUILD"
    export PKG_CONFIG PKG_CONFIG_LIBDIR=$PCDIR PKG_CONFIG_PATH=
    export CMAKE_PREFIX_PATH=$PREFIX/usr
    # -rpath-link: the linker follows libopenblas.so.0 to libgfortran.so.5 inside the prefix.
    run_limited cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DMESHWIT_BUILD_TESTS=ON \
        -DMESHWIT_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$GPU_ARCH" -DMESHWIT_MPI=OFF \
        -DPKG_CONFIG_EXECUTABLE="$PKG_CONFIG" \
        "-DCMAKE_EXE_LINKER_FLAGS=-Wl,-rpath-link,$LIBDIR:$LIBDIR/openblas-pthread"
}

do_build() {
    run_limited cmake --build "$BUILD" -j "$JOBS" || return 1
    # The test programs must load OpenBLAS and Criterion from the prefix.
    export LD_LIBRARY_PATH=$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    local lib bad=0
    ldd "$BUILD/test_gpu" | grep -E 'openblas|criterion|gfortran|not found'
    for lib in libopenblas libcriterion libgfortran; do
        if ! ldd "$BUILD/test_gpu" | grep "$lib" | grep -q "=> $PREFIX/"; then
            echo "FAIL: test_gpu does not load $lib from $PREFIX"
            bad=1
        fi
    done
    ! ldd "$BUILD/test_gpu" | grep -q 'not found' && [ "$bad" -eq 0 ]
}

runtime_env() { export LD_LIBRARY_PATH=$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}; }

do_cpu_tests() {
    runtime_env
    run_limited ctest --test-dir "$BUILD" -j "$JOBS" --output-on-failure --no-tests=error \
        -L '^(core|devices|parallel|gpu-host)$'
}

# The gpu-labelled tests that need a GPU (gpu_host ran with the CPU tests), one CTest test each.
gpu_ctest() {
    runtime_env
    MESHWIT_REQUIRE_GPU=1 run_limited ctest --test-dir "$BUILD" --output-on-failure \
        --no-tests=error -L '^gpu$' -R "$1"
}

do_gpu_kernels() {
    command -v nvidia-smi > /dev/null &&
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader |
        sed 's/^/GPU: /'
    gpu_ctest '^(gpu|gpu_bf16|gpu_math)$'
}

# 10 GPT-2 steps on cuda:0 and cuda:0x2 against cpu:1, cuda:0x2 against cuda:0, repeats.
do_gpu_trainer() { gpu_ctest '^gpu_trainer$'; }

do_bench_linreg() {
    runtime_env
    run_limited "$BUILD/meshwit-bench" linreg --quick --devices cuda:0 --devices cuda:0x2 \
        --json "$OUT/bench-linreg.json"
}

do_bench_gpt2() {
    runtime_env
    MESHWIT_PEAK_TFLOPS=${GPU_PEAK_TFLOPS:-67} run_limited "$BUILD/meshwit-bench" gpt2 --quick \
        --devices cuda:0 --devices cuda:0x2 --json "$OUT/bench-gpt2.json"
}

# GPT-2 124M at context 1024 on cuda:0 in bf16 (tensor cores) and f32: MFU against the dense
# peaks.
do_bench_124m() {
    runtime_env
    MESHWIT_PEAK_TFLOPS=${GPU_PEAK_TFLOPS:-67} \
        MESHWIT_PEAK_BF16_TFLOPS=${GPU_PEAK_BF16_TFLOPS:-989} run_limited \
        "$BUILD/meshwit-bench" gpt2-124m --precision both --devices cuda:0 \
        --json "$OUT/bench-gpt2-124m.json"
}

echo "gpu-check: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(uname -n), $JOBS jobs, sm_$GPU_ARCH," \
    "budget ${BUDGET}s, commit $(git -C "$ROOT" rev-parse --short HEAD 2> /dev/null || echo '?')"
stage deps 60 do_deps
if [ "${RESULTS[0]}" = ok ]; then
    stage configure 90 do_configure
    [ "${RESULTS[1]}" = ok ] && stage build 300 do_build
fi
if [ "${#RESULTS[@]}" -eq 3 ] && [ "${RESULTS[2]}" = ok ]; then
    stage cpu-tests 120 do_cpu_tests
    stage gpu-kernels 150 do_gpu_kernels
    stage gpu-trainer 150 do_gpu_trainer
    stage bench-linreg 60 do_bench_linreg
    stage bench-gpt2 120 do_bench_gpt2
    stage bench-124m 150 do_bench_124m
fi

{
    echo "gpu-check summary ($(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(uname -n), sm_$GPU_ARCH," \
        "total ${SECONDS}s)"
    for i in "${!NAMES[@]}"; do
        printf '  %-13s %-7s %4ds  %s\n' "${NAMES[$i]}" "${RESULTS[$i]}" "${TIMES[$i]}" \
            "${NOTES[$i]}"
    done
    # The build's features, the GPU, the tests' lines and the bench's GPU rows, from the log.
    grep -h -m1 -- '-- meshwit ' "$OUT/log.txt" | sed 's/^-- /  build: /'
    grep -h -m1 '^GPU: ' "$OUT/log.txt" | sed 's/^/  /'
    grep -h -E '^ *[0-9]+/[0-9]+ Test +#' "$OUT/log.txt" | sed 's/^ */  test /'
    grep -h -E '^(devices +(repeats|BLAS|prec)|cuda:|(linreg|gpt2|gpt2-124m): cuda)' "$OUT/log.txt" |
        sed 's/^/  bench /'
} > "$OUT/summary.txt"
{
    printf '{"host": "%s", "arch": "%s", "seconds": %d, "ok": %s, "stages": [' "$(uname -n)" \
        "$GPU_ARCH" "$SECONDS" "$([ "$FAILED" -eq 0 ] && echo true || echo false)"
    for i in "${!NAMES[@]}"; do
        note=${NOTES[$i]//\\/\\\\}
        note=${note//\"/\\\"}
        printf '%s{"name": "%s", "result": "%s", "seconds": %d, "note": "%s"}' \
            "$([ "$i" -gt 0 ] && echo ', ')" "${NAMES[$i]}" "${RESULTS[$i]}" "${TIMES[$i]}" \
            "$(printf '%s' "$note" | tr -d '\000-\037')"
    done
    echo ']}'
} > "$OUT/gpu-check.json"
echo
cat "$OUT/summary.txt"
exit "$FAILED"
}
