#!/usr/bin/env bash
# The whole test suite, as CI runs it:
#   deps      install missing packages (scripts/deps.sh)
#   format    clang-format --dry-run -Werror on every source file, and the floors' include rules
#             (scripts/check-layers.sh)
#   build     Release build in build/ (tests, examples, bench)
#   ctest     every test in build/ (gpu-labelled tests skip themselves without a GPU; the
#             conformance table's quick subset)
#   conform   the conformance table's full sweep (build/conformance): every op over every legal
#             layout, split, precision, CPU instruction level and GEMM engine
#   asan      AddressSanitizer + UBSan build in build-asan/ (Debug, -O1, without CUDA: the
#             configuration of a machine without the toolkit), all but install and gpu
#   tsan      ThreadSanitizer build in build-tsan/, the stress programs only
#   minimal   Release build in build-min/ without CUDA, MPI and oneDNN (OpenBLAS only), and
#             its ctest: every optional dependency absent still builds and passes
#   fuzz      the libFuzzer harnesses (scripts/fuzz.sh), FUZZ_SECONDS each (default 20)
#   bench     meshwit-bench --quick smoke run, writes build/bench.json
# Usage: scripts/test.sh [--quick]    (--quick skips conform, asan, tsan, minimal and fuzz)
# Environment: JOBS (parallel build jobs, default 2).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

QUICK=0
for arg in "$@"; do
    case "$arg" in
    --quick) QUICK=1 ;;
    -h | --help)
        sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'
        exit 0
        ;;
    *)
        echo "test.sh: unknown argument '$arg' (try --help)" >&2
        exit 2
        ;;
    esac
done

JOBS=${JOBS:-2}
SUMMARY=()

summary() {
    echo
    echo "== summary"
    local line
    for line in "${SUMMARY[@]}"; do echo "  $line"; done
}

# stage NAME FUNCTION: runs FUNCTION in a subshell with errexit in force (the first failing
# command fails the stage), records the result, and stops everything at the first failure.
stage() {
    local name=$1 fn=$2 start=$SECONDS rc
    echo
    echo "== $name"
    set +e
    (
        set -e
        "$fn"
    )
    rc=$?
    set -e
    if [ "$rc" -ne 0 ]; then
        SUMMARY+=("$(printf '%-7s FAILED (exit %d)' "$name" "$rc")")
        summary
        echo "test.sh: stage '$name' failed" >&2
        exit 1
    fi
    SUMMARY+=("$(printf '%-7s ok (%ds)' "$name" $((SECONDS - start)))")
}

skip() {
    SUMMARY+=("$(printf '%-7s skipped (%s)' "$1" "$2")")
}

source_files() {
    local dirs=() d
    for d in core formats devices collectives parallel include examples bench tests fuzz text; do
        [ -d "$d" ] && dirs+=("$d")
    done
    [ "${#dirs[@]}" -gt 0 ] || return 0
    find "${dirs[@]}" -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name '*.cpp' \) -print0 | sort -z
}

do_deps() {
    bash scripts/deps.sh
}

do_format() {
    local n
    n=$(source_files | tr -cd '\0' | wc -c)
    if [ "$n" -eq 0 ]; then
        echo "no source files"
        return 0
    fi
    if ! source_files | xargs -0 clang-format --dry-run -Werror; then
        echo "format: run 'make format' (clang-format -i) and review the changes" >&2
        return 1
    fi
    echo "$n files formatted correctly"
    bash scripts/check-layers.sh
}

do_build() {
    cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DMESHWIT_BUILD_TESTS=ON
    cmake --build build -j "$JOBS"
}

do_ctest() {
    ctest --test-dir build --output-on-failure
}

do_conform() {
    build/conformance
}

do_asan() {
    cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug "-DCMAKE_C_FLAGS_DEBUG=-g -O1" \
        -DMESHWIT_SANITIZE=address -DMESHWIT_BUILD_TESTS=ON \
        -DMESHWIT_BUILD_EXAMPLES=OFF -DMESHWIT_BUILD_BENCH=OFF -DMESHWIT_CUDA=OFF
    cmake --build build-asan -j "$JOBS"
    # protect_shadow_gap=0: the CUDA runtime maps memory in ASan's shadow gap on GPU machines.
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:protect_shadow_gap=0 \
        UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
        ctest --test-dir build-asan --output-on-failure -LE '^(install|gpu)$'
}

do_tsan() {
    # Criterion does not run under ThreadSanitizer: only the plain-C stress programs are built.
    cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug "-DCMAKE_C_FLAGS_DEBUG=-g -O1" \
        -DMESHWIT_SANITIZE=thread -DMESHWIT_BUILD_TESTS=ON \
        -DMESHWIT_BUILD_EXAMPLES=OFF -DMESHWIT_BUILD_BENCH=OFF \
        -DMESHWIT_CUDA=OFF -DMESHWIT_MPI=OFF
    cmake --build build-tsan -j "$JOBS" --target stress
    TSAN_OPTIONS=halt_on_error=1 ctest --test-dir build-tsan --output-on-failure -L '^stress$'
}

do_minimal() {
    cmake -S . -B build-min -DCMAKE_BUILD_TYPE=Release -DMESHWIT_BUILD_TESTS=ON \
        -DMESHWIT_CUDA=OFF -DMESHWIT_MPI=OFF -DMESHWIT_DNNL=OFF
    cmake --build build-min -j "$JOBS"
    ctest --test-dir build-min --output-on-failure
}

do_fuzz() {
    # libFuzzer harnesses of the file readers: replay the kept regressions, then fuzz each
    # target for a bounded time.
    bash scripts/fuzz.sh "${FUZZ_SECONDS:-20}"
}

do_bench() {
    build/meshwit-bench --quick --json build/bench.json
}

stage deps do_deps
stage format do_format
stage build do_build
stage ctest do_ctest
if [ "$QUICK" -eq 1 ]; then
    skip conform "--quick"
    skip asan "--quick"
    skip tsan "--quick"
    skip minimal "--quick"
    skip fuzz "--quick"
else
    stage conform do_conform
    stage asan do_asan
    if compgen -G "tests/stress/*.c" >/dev/null; then
        stage tsan do_tsan
    else
        skip tsan "no tests/stress/*.c"
    fi
    stage minimal do_minimal
    stage fuzz do_fuzz
fi
if [ -x build/meshwit-bench ]; then
    stage bench do_bench
else
    skip bench "no meshwit-bench target"
fi
summary
echo "test.sh: all stages passed"
