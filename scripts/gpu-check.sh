#!/usr/bin/env bash
# The GPU check, made for a bare GPU machine (nvcc, CMake and a C compiler; no Debian packages,
# no network) and one call of at most 10 minutes:
#
#   scripts/gpu-check.sh --prepare   here, where apt works: downloads the .deb files the build and
#                                    the checks need that such a machine lacks (OpenBLAS,
#                                    Criterion, pkgconf, Open MPI and the libraries they load)
#                                    into .gpu-deps/, which git ignores and the working tree
#                                    carries along (at most GPU_DEPS_MAX_MIB, default 40).
#   scripts/gpu-check.sh OUTDIR      there: unpacks them into a private prefix (build-gpu-deps/,
#                                    never over /), points pkg-config, CMake, Open MPI and the
#                                    loader at it, builds in build-gpu/ (CUDA for sm_90, NCCL,
#                                    MPI) only what the stages run, on every core, and runs the
#                                    stages below, most valuable first, each within its own time
#                                    limit. No CPU-only test runs there. Every GPU test runs with
#                                    MESHWIT_REQUIRE_GPU=1: no GPU is a failure naming the CUDA
#                                    error, never a skip. It writes OUTDIR/log.txt,
#                                    OUTDIR/summary.txt (a line per stage: result, time, what it
#                                    compared), OUTDIR/gpu-check.json and the bench's
#                                    OUTDIR/bench-*.json, and exits 1 if any stage failed.
#   scripts/gpu-check.sh --build-only OUTDIR
#                                    the unpacking, configuration and build alone: run here, it
#                                    proves that the prepared packages configure, compile and
#                                    link the CUDA, NCCL and MPI build (no GPU needed).
#   scripts/gpu-check.sh --dry-run OUTDIR
#                                    every stage in order with its commands printed instead of
#                                    run, and the summary (CTest test gpu_check_dry_run).
#   scripts/gpu-check.sh --list      the stages, their time limits and the GPU suites each runs.
#
# The stages after the build (their limits in seconds; the whole run stays within
# GPU_CHECK_BUDGET):
#   gpu-kernels   CTest suites gpu, gpu_bf16, gpu_math, gpu_attention, gpu_p2p, two at a time:
#                 every CUDA kernel against the CPU backend's (bits or derived tolerances), bf16
#                 against f32 rounding, fused and cached attention at T=1024 against the CPU
#                 (attention.cu's kernels and the tensor-core ones of attention_tc.cu), the
#                 GPU reducers' point-to-point transfers bit for bit
#   conformance   the conformance table (tests/conformance) on cuda:0 and cuda:0x2: every op over
#                 its legal layouts, producers, splits, f32 and bf16 against a float64 reference
#                 (a line per row; each case's verdict in OUT/conformance.txt); the quick subset
#                 unless GPU_CONFORMANCE=full
#   gpu-trainer   suite gpu_trainer: GPT-2 steps on cuda:0 and cuda:0x2 against cpu:1 in f32 and
#                 bf16, FSDP, tensor parallel, ZeRO-1, dropout, failures survived
#   nccl-mpi      NCCL over MPI: two processes (mpirun -np 2) on the one GPU, one communicator
#                 rank each: first refused as two ranks on one GPU, then as two NCCL hosts
#                 (NCCL_HOSTID per process, NCCL's sockets over loopback) 4 AdamW steps of a
#                 small GPT-2 against cpu:1 in one process, and ZeRO-1 bitwise the replicated run
#   bench-124m    GPT-2 124M at context 1024 on cuda:0: bf16 with attention on tensor cores
#                 (MESHWIT_CUDA_ATTENTION=tensor), then bf16 and f32 as by default: ms/step, MFU
#   bench-gpt2    the small GPT-2 on cuda:0 and cuda:0x2 beside cpu:1
#   bench-linreg  linear regression on cuda:0 and cuda:0x2 beside cpu:1
# A stage that runs out of budget is reported as such; the others still run if time is left.
#
# Environment: GPU_ARCH (CMAKE_CUDA_ARCHITECTURES, default 90), JOBS (default: all cores),
# GPU_PEAK_TFLOPS (FP32 peak for the MFU column, default 67: H100/H200 SXM without tensor cores),
# GPU_PEAK_BF16_TFLOPS (dense bf16 tensor-core peak, default 989: H100/H200 SXM),
# GPU_CHECK_BUDGET (seconds for the whole run, default 570: the sum of the stages' limits, inside
# a device call's 600), BUILD (default build-gpu; a second run on a machine still warm from the
# first rebuilds only what changed, a fresh machine builds it all), GPU_CHECK_CLEAN=1 (build
# from scratch).
set -uo pipefail

# One brace group: bash reads all of it before running any, so editing this file while it runs
# cannot change what runs.
{
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEBS=$ROOT/.gpu-deps
MULTIARCH=x86_64-linux-gnu

# Runtime roots; their dependency closure is downloaded, less what every base image has (the C
# library and the compiler's runtime, which must be the machine's own) and less the pruned
# packages with everything only they need: ssh, which Open MPI needs only to start processes on
# other hosts; hwloc's optional plugins (XML, OpenCL and X11 discovery: ICU, libxml2, X11); and
# adduser (with passwd and PAM), which only install scripts call, never run by unpacking.
RUNTIME_ROOTS="libopenblas0-pthread libcriterion3 pkgconf-bin openmpi-bin"
# Headers and link-time files only (their own dependencies are for static linking or Fortran).
DEV_PACKAGES="libopenblas-pthread-dev libcriterion-dev libopenmpi-dev"
BASE_IMAGE="libc6 libgcc-s1 gcc-12-base libstdc++6 libcrypt1"
PRUNE="openssh-client libhwloc-plugins adduser"
MAX_MIB=${GPU_DEPS_MAX_MIB:-40}

# The GPU suites (tests/gpu) each stage runs, one CTest test each. Every suite of tests/gpu that
# needs a GPU is in exactly one list, and no host-side suite (*_host) is in any:
# scripts/check-gpu-suites.sh, a CTest test, checks it against the sources and the registration.
KERNEL_SUITES="gpu gpu_bf16 gpu_math gpu_attention gpu_p2p"
TRAINER_SUITES="gpu_trainer"

# The stages after the build, in the order they run: name|time limit (s)|function|what it
# compares (the summary's line).
# The limits of the stages before (deps, configure, build) and after the build add up to the
# default budget, so no stage's limit promises time the run does not have (--list says the sum,
# scripts/check-gpu-suites.sh checks it).
DEPS_LIMIT=30
CONFIGURE_LIMIT=40
BUILD_LIMIT=150
STAGES=(
    "gpu-kernels|80|do_gpu_kernels|CUDA kernels and attention vs the CPU backend"
    "conformance|50|do_conformance|every op's layouts, splits and precisions on cuda vs float64"
    "gpu-trainer|80|do_gpu_trainer|GPT-2 on cuda:0, cuda:0x2 vs cpu:1, f32 and bf16"
    "nccl-mpi|40|do_nccl_mpi|2 processes on one GPU over NCCL vs cpu:1 in one process"
    "bench-124m|70|do_bench_124m|GPT-2 124M ms/step and MFU vs the GPU's dense peaks, attention on tensor cores and not"
    "bench-gpt2|20|do_bench_gpt2|small GPT-2 ms/step on cuda:0, cuda:0x2 vs cpu:1"
    "bench-linreg|10|do_bench_linreg|linreg ms/step on cuda:0, cuda:0x2 vs cpu:1"
)
DEFAULT_BUDGET=570
# What the build makes: the stages' programs (the CUDA, MPI and NCCL-over-MPI modules come with
# libmeshwit); the MPI programs only when MPI was configured.
BUILD_TARGETS="test_gpu conformance meshwit-bench"
MPI_TARGETS="mpi_gpt2 mpi_gpu_shared"

# The packages the roots need, walked one package at a time (apt-cache depends --recurse cannot
# leave a subtree out): neither a base-image package nor a pruned one is listed or followed.
closure_of() {
    local -A seen=()
    local queue=("$@") pkg dep
    while [ "${#queue[@]}" -gt 0 ]; do
        pkg=${queue[0]}
        queue=("${queue[@]:1}")
        [ -n "${seen[$pkg]:-}" ] && continue
        seen[$pkg]=1
        case " $BASE_IMAGE $PRUNE " in *" $pkg "*) continue ;; esac
        echo "$pkg"
        for dep in $(apt-cache depends --no-recommends --no-suggests --no-conflicts --no-breaks \
            --no-replaces --no-enhances "$pkg" |
            sed -n 's/^ *|\{0,1\}\(Pre\)\{0,1\}Depends: \([a-z0-9][^ ]*\)$/\2/p'); do
            queue+=("$dep")
        done
    done
}

prepare() {
    command -v apt-get > /dev/null && command -v apt-cache > /dev/null ||
        { echo "gpu-check --prepare: needs apt-get and apt-cache" >&2; return 1; }
    local pkg keep=()
    for pkg in $(closure_of $RUNTIME_ROOTS | sort -u) $DEV_PACKAGES; do keep+=("$pkg"); done
    rm -rf "$DEBS"
    mkdir -p "$DEBS"
    echo "gpu-check --prepare: downloading ${#keep[@]} packages into $DEBS:"
    echo "  ${keep[*]}"
    (cd "$DEBS" && apt-get download "${keep[@]}") || return 1
    local mib
    mib=$(du -sm "$DEBS" | cut -f1)
    echo "gpu-check --prepare: $(ls "$DEBS"/*.deb | wc -l) files, ${mib} MiB (limit $MAX_MIB)"
    if [ "$mib" -gt "$MAX_MIB" ]; then
        echo "gpu-check --prepare: $DEBS exceeds $MAX_MIB MiB" >&2
        return 1
    fi
}

list() {
    local s name limit
    local total=$((DEPS_LIMIT + CONFIGURE_LIMIT + BUILD_LIMIT))
    echo "stages (seconds): deps $DEPS_LIMIT, configure $CONFIGURE_LIMIT, build $BUILD_LIMIT, then:"
    for s in "${STAGES[@]}"; do
        IFS='|' read -r name limit _ <<< "$s"
        echo "stage $name $limit"
        total=$((total + limit))
    done
    echo "limits $total budget $DEFAULT_BUDGET"
    for s in $KERNEL_SUITES; do echo "suite $s gpu-kernels"; done
    for s in $TRAINER_SUITES; do echo "suite $s gpu-trainer"; done
}

MODE=run
DRY=0
case "${1:-}" in
--prepare)
    prepare
    exit $?
    ;;
--list)
    list
    exit 0
    ;;
--build-only)
    MODE=build
    shift
    ;;
--dry-run)
    DRY=1
    shift
    ;;
esac
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
BUDGET=${GPU_CHECK_BUDGET:-$DEFAULT_BUDGET}
DEADLINE=$((SECONDS + BUDGET))
NO_MPI="" # why the build has no MPI, when it has none
: > "$OUT/log.txt"
exec > >(tee -a "$OUT/log.txt") 2>&1
cd "$ROOT" || exit 1

NAMES=()
LIMITS=()
WHATS=()
RESULTS=()
TIMES=()
NOTES=()
FAILED=0

# stage NAME LIMIT FUNCTION: runs FUNCTION with at most LIMIT seconds (less when the budget is
# nearly spent), records ok or FAILED with the first line saying why.
stage() {
    local name=$1 limit=$2 fn=$3 what=${4:-} start=$SECONDS rc left note=""
    left=$((DEADLINE - SECONDS))
    [ "$limit" -gt "$left" ] && limit=$left
    echo
    echo "== $name (limit ${limit}s)"
    if [ "$limit" -le 0 ]; then
        rc=125
        note="no time left in the budget of ${BUDGET}s"
        echo "FAIL: $note"
    else
        STAGE_END=$((SECONDS + limit))
        "$fn" > >(tee "$OUT/.stage.log") 2>&1
        rc=$?
        sleep 0.2 # let tee finish
    fi
    NAMES+=("$name")
    LIMITS+=("$limit")
    WHATS+=("$what")
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

# A command of the stage, within what is left of the stage's limit (a dry run prints it).
run_limited() {
    local left=$((STAGE_END - SECONDS))
    [ "$left" -gt 0 ] || return 124
    if [ "$DRY" = 1 ]; then
        echo "dry run (${left}s): $*"
        return 0
    fi
    timeout --kill-after=10 "$left" "$@"
}

# Unpacks every .deb into the prefix and writes the pkg-config files for it.
do_deps() {
    MPI_INCLUDE=$LIBDIR/openmpi/include
    MPI_LIBRARY=$LIBDIR/openmpi/lib/libmpi.so
    MPIRUN=$PREFIX/usr/bin/orterun
    PCDIR=$LIBDIR/pkgconfig
    if [ "$DRY" = 1 ]; then
        PKG_CONFIG="pkg-config"
        echo "dry run: unpack $DEBS/*.deb into $PREFIX"
        return 0
    fi
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
    PKG_CONFIG_LIBDIR=$PCDIR PKG_CONFIG_PATH='' "$PKG_CONFIG" --modversion openblas criterion ||
        return 1
    # Open MPI, relocated: its launcher finds its plugins and help files under OPAL_PREFIX, PMIx
    # and hwloc theirs where mpi_env points them.
    if [ -f "$MPI_INCLUDE/mpi.h" ] && [ -e "$MPI_LIBRARY" ] && [ -x "$MPIRUN" ]; then
        mpi_env
        "$MPIRUN" --version | head -1 || NO_MPI="the unpacked Open MPI launcher does not run"
    else
        NO_MPI="Open MPI is missing from $DEBS (mpi.h, libmpi.so or orterun)"
    fi
    [ -z "$NO_MPI" ] || echo "without MPI: $NO_MPI"
}

runtime_env() { export LD_LIBRARY_PATH=$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}; }

# The unpacked Open MPI, as root too, on this one host.
mpi_env() {
    runtime_env
    export PATH=$PREFIX/usr/bin:$PATH
    export OPAL_PREFIX=$PREFIX/usr
    export PMIX_MCA_mca_base_component_path=$LIBDIR/pmix2/lib/pmix
    export HWLOC_PLUGINS_PATH=$LIBDIR/hwloc
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    # Shared memory and TCP between the processes: no InfiniBand or UCX setup on one host.
    export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader,tcp OMPI_MCA_osc=^ucx
}

do_configure() {
    [ "${GPU_CHECK_CLEAN:-0}" = 1 ] && [ "$DRY" = 0 ] && rm -rf "$BUILD"
    export PKG_CONFIG PKG_CONFIG_LIBDIR=$PCDIR PKG_CONFIG_PATH=
    export CMAKE_PREFIX_PATH=$PREFIX/usr
    # -rpath-link: the linker follows libopenblas.so.0 to libgfortran.so.5 inside the prefix,
    # and libmpi.so to Open MPI's own libraries.
    local args=(-S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DMESHWIT_BUILD_TESTS=ON
        -DMESHWIT_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$GPU_ARCH"
        -DPKG_CONFIG_EXECUTABLE="$PKG_CONFIG"
        "-DCMAKE_EXE_LINKER_FLAGS=-Wl,-rpath-link,$LIBDIR:$LIBDIR/openblas-pthread"
        "-DCMAKE_SHARED_LINKER_FLAGS=-Wl,-rpath-link,$LIBDIR"
        "-DCMAKE_MODULE_LINKER_FLAGS=-Wl,-rpath-link,$LIBDIR")
    if [ -z "$NO_MPI" ]; then
        # Open MPI named by hand: its compiler wrapper would report the packages' /usr paths.
        run_limited cmake "${args[@]}" -DMESHWIT_MPI=ON -DMPI_SKIP_COMPILER_WRAPPER=ON \
            -DMPI_C_HEADER_DIR="$MPI_INCLUDE" -DMPI_C_LIB_NAMES=mpi \
            -DMPI_mpi_LIBRARY="$MPI_LIBRARY" -DMPIEXEC_EXECUTABLE="$MPIRUN" && return 0
        [ $? -eq 124 ] && return 124
        NO_MPI="configuring with MPI failed (see above); configured without"
        echo "FAIL: $NO_MPI"
        rm -f "$BUILD/CMakeCache.txt"
    fi
    run_limited cmake "${args[@]}" -DMESHWIT_MPI=OFF || return $?
    [ -z "$NO_MPI" ] # a build without MPI is a failure of this stage, though the next stages run
}

do_build() {
    local targets=$BUILD_TARGETS
    [ -z "$NO_MPI" ] && targets="$targets $MPI_TARGETS"
    echo "targets: $targets ($JOBS jobs)"
    # shellcheck disable=SC2086
    run_limited cmake --build "$BUILD" -j "$JOBS" --target $targets || return 1
    [ "$DRY" = 1 ] && return 0
    # The programs must load OpenBLAS, Criterion and Open MPI from the prefix (ldd's output held
    # first: grep -q closing the pipe early would fail ldd under pipefail).
    runtime_env
    local lib bad=0 libs mpi_libs=""
    libs=$(ldd "$BUILD/test_gpu")
    grep -E 'openblas|criterion|gfortran|not found' <<< "$libs"
    for lib in libopenblas libcriterion libgfortran; do
        if ! grep "$lib" <<< "$libs" | grep -q "=> $PREFIX/"; then
            echo "FAIL: test_gpu does not load $lib from $PREFIX"
            bad=1
        fi
    done
    grep -q 'not found' <<< "$libs" && bad=1
    local module
    for module in cuda mpi nccl-mpi; do
        [ "$module" != cuda ] && [ -n "$NO_MPI" ] && continue
        if [ ! -f "$BUILD/libmeshwit-$module.so" ]; then
            echo "FAIL: libmeshwit-$module.so was not built"
            bad=1
        fi
    done
    if [ -z "$NO_MPI" ]; then
        mpi_libs=$(ldd "$BUILD/libmeshwit-mpi.so")
        if ! grep -q "libmpi.so.* => $PREFIX/" <<< "$mpi_libs"; then
            echo "FAIL: libmeshwit-mpi.so does not load libmpi from $PREFIX"
            bad=1
        fi
    fi
    [ "$bad" -eq 0 ]
}

# The named GPU suites, one CTest test each, two at a time (they share the GPU; more at once
# would stretch the 200 ms collective timeouts some tests wait out).
gpu_ctest() {
    runtime_env
    local regex
    regex="^($(echo "$1" | tr ' ' '|'))\$"
    MESHWIT_REQUIRE_GPU=1 run_limited ctest --test-dir "$BUILD" --output-on-failure \
        --no-tests=error -j 2 -L '^gpu$' -R "$regex"
}

do_gpu_kernels() {
    [ "$DRY" = 0 ] && command -v nvidia-smi > /dev/null &&
        nvidia-smi --query-gpu=name,driver_version,memory.total,compute_mode \
            --format=csv,noheader | sed 's/^/GPU: /'
    gpu_ctest "$KERNEL_SUITES"
}

do_gpu_trainer() { gpu_ctest "$TRAINER_SUITES"; }

# The conformance table (tests/conformance) on cuda:0 and GPU meshes (cuda:0x2): a line per row
# here, every case's verdict in OUT/conformance.txt. Its quick subset (every row, three layouts
# of each shape) unless GPU_CONFORMANCE=full: a case makes a trainer, and on a GPU that costs
# device allocations and stream set-up, so the whole sweep may not fit the stage's limit.
do_conformance() {
    runtime_env
    local rc=0 quick=--quick
    [ "${GPU_CONFORMANCE:-quick}" = full ] && quick=
    # shellcheck disable=SC2086
    MESHWIT_REQUIRE_GPU=1 run_limited "$BUILD/conformance" --devices cuda $quick --verbose \
        > "$OUT/conformance.txt" 2>&1 || rc=$?
    grep -v '^  ok ' "$OUT/conformance.txt" | head -200
    return "$rc"
}

# NCCL refuses two ranks of one communicator on one GPU, by host and PCI bus id: two processes
# that set different NCCL_HOSTID are two hosts to it (and to meshwit's own check), so they
# connect through its network transport, here sockets over loopback, and time-share the GPU.
do_nccl_mpi() {
    [ -z "$NO_MPI" ] || { echo "FAIL: $NO_MPI"; return 1; }
    if [ "$DRY" = 0 ] && [ ! -f "$BUILD/libmeshwit-nccl-mpi.so" ]; then
        echo "FAIL: this build has no NCCL (libnccl and nccl.h not found beside the CUDA toolkit)"
        return 1
    fi
    mpi_env
    local mpirun=("$MPIRUN" --oversubscribe --bind-to none)
    echo "-- two processes on the one GPU, one host: refused with meshwit's message"
    MESHWIT_REQUIRE_GPU=1 run_limited "${mpirun[@]}" -np 2 "$BUILD/mpi_gpu_shared" cuda:0 ||
        return 1
    local mode host=(env NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=lo MESHWIT_REQUIRE_GPU=1)
    for mode in "" zero1; do
        echo "-- two processes on the one GPU as two NCCL hosts: mpi_gpt2 cuda:0 $mode"
        # shellcheck disable=SC2086
        run_limited "${mpirun[@]}" \
            -np 1 "${host[@]}" NCCL_HOSTID=meshwit-gpu-check-0 "$BUILD/mpi_gpt2" cuda:0 $mode : \
            -np 1 "${host[@]}" NCCL_HOSTID=meshwit-gpu-check-1 "$BUILD/mpi_gpt2" cuda:0 $mode ||
            return 1
    done
}

# GPT-2 124M at context 1024 on cuda:0 in bf16 (tensor cores) and f32: MFU against the dense
# peaks; first in bf16 with attention on tensor cores too (attention_tc.cu, not yet the default:
# the kernels line says which attention ran).
do_bench_124m() {
    runtime_env
    MESHWIT_CUDA_ATTENTION=tensor MESHWIT_PEAK_TFLOPS=${GPU_PEAK_TFLOPS:-67} \
        MESHWIT_PEAK_BF16_TFLOPS=${GPU_PEAK_BF16_TFLOPS:-989} run_limited \
        "$BUILD/meshwit-bench" gpt2-124m --precision bf16 --devices cuda:0 \
        --json "$OUT/bench-gpt2-124m-tensor.json" || return $?
    MESHWIT_PEAK_TFLOPS=${GPU_PEAK_TFLOPS:-67} \
        MESHWIT_PEAK_BF16_TFLOPS=${GPU_PEAK_BF16_TFLOPS:-989} run_limited \
        "$BUILD/meshwit-bench" gpt2-124m --precision both --devices cuda:0 \
        --json "$OUT/bench-gpt2-124m.json"
}

do_bench_gpt2() {
    runtime_env
    MESHWIT_PEAK_TFLOPS=${GPU_PEAK_TFLOPS:-67} run_limited "$BUILD/meshwit-bench" gpt2 --quick \
        --devices cpu:1 --devices cuda:0 --devices cuda:0x2 --json "$OUT/bench-gpt2.json"
}

do_bench_linreg() {
    runtime_env
    run_limited "$BUILD/meshwit-bench" linreg --quick --devices cpu:1 --devices cuda:0 \
        --devices cuda:0x2 --json "$OUT/bench-linreg.json"
}

echo "gpu-check: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(uname -n), $JOBS jobs, sm_$GPU_ARCH," \
    "budget ${BUDGET}s, commit $(git -C "$ROOT" rev-parse --short HEAD 2> /dev/null || echo '?')"
stage deps "$DEPS_LIMIT" do_deps "the prepared packages in a private prefix"
if [ "${RESULTS[0]}" = ok ]; then
    stage configure "$CONFIGURE_LIMIT" do_configure "CUDA sm_$GPU_ARCH, NCCL and MPI"
    # A configuration without MPI still builds the rest.
    [ "$DRY" = 1 ] || [ -f "$BUILD/CMakeCache.txt" ] && stage build "$BUILD_LIMIT" do_build "$JOBS jobs"
fi
if [ "$MODE" = run ] && [ "${#RESULTS[@]}" -eq 3 ] && [ "${RESULTS[2]}" = ok ]; then
    for s in "${STAGES[@]}"; do
        IFS='|' read -r name limit fn what <<< "$s"
        stage "$name" "$limit" "$fn" "$what"
    done
fi

{
    echo "gpu-check summary ($(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(uname -n), sm_$GPU_ARCH," \
        "total ${SECONDS}s of ${BUDGET}s)"
    for i in "${!NAMES[@]}"; do
        printf '  %-13s %-7s %4ds of %3ds  %s%s\n' "${NAMES[$i]}" "${RESULTS[$i]}" \
            "${TIMES[$i]}" "${LIMITS[$i]}" "${WHATS[$i]}" "${NOTES[$i]:+; ${NOTES[$i]}}"
    done
    # The build's features, the GPU, the tests' lines and the bench's rows, from the log.
    grep -h -m1 -- '-- meshwit ' "$OUT/log.txt" | sed 's/^-- /  build: /'
    grep -h -m1 '^GPU: ' "$OUT/log.txt" | sed 's/^/  /'
    grep -h -E '^ *[0-9]+/[0-9]+ Test +#' "$OUT/log.txt" | sed 's/^ */  test /'
    grep -h -E '^(-- two processes|step [0-9]+.* across |\[rank [0-9]+\] (refused|wte after|[0-9]+ parameters after))' \
        "$OUT/log.txt" | sed 's/^/  nccl-mpi /'
    grep -h -E '^(devices +(repeats|BLAS|prec)|cuda:|cpu:1 |(linreg|gpt2|gpt2-124m): cuda)' \
        "$OUT/log.txt" | sed 's/^/  bench /'
} > "$OUT/summary.txt"
{
    printf '{"host": "%s", "arch": "%s", "seconds": %d, "ok": %s, "stages": [' "$(uname -n)" \
        "$GPU_ARCH" "$SECONDS" "$([ "$FAILED" -eq 0 ] && echo true || echo false)"
    for i in "${!NAMES[@]}"; do
        note=${NOTES[$i]//\\/\\\\}
        note=${note//\"/\\\"}
        printf '%s{"name": "%s", "result": "%s", "seconds": %d, "limit": %d, "what": "%s", ' \
            "$([ "$i" -gt 0 ] && echo ', ')" "${NAMES[$i]}" "${RESULTS[$i]}" "${TIMES[$i]}" \
            "${LIMITS[$i]}" "${WHATS[$i]}"
        printf '"note": "%s"}' "$(printf '%s' "$note" | tr -d '\000-\037')"
    done
    echo ']}'
} > "$OUT/gpu-check.json"
echo
cat "$OUT/summary.txt"
exit "$FAILED"
}
