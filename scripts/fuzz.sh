#!/usr/bin/env bash
# Builds the libFuzzer harnesses under fuzz/ with clang (AddressSanitizer + UBSan), replays the
# regression inputs kept in fuzz/regressions/<target>/, then fuzzes each target for SECONDS
# (default 20) from seeds written by fuzz/make_seeds.c. A crash fails the script; its input is
# left in build-fuzz/crashes/<target>/ to be fixed and added to fuzz/regressions/<target>/.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-20}"
out=build-fuzz
mkdir -p "$out"
cc=clang
flags=(-std=c11 -D_POSIX_C_SOURCE=200809L -g -O1 -fno-omit-frame-pointer
       -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I include -I .
       -I examples/common)
# The library's sources are compiled once, with coverage for the fuzzer, and linked into every
# harness. The CPU kernels' per-level files (MESHWIT_CPU_LEVEL_SOURCES in CMakeLists.txt) are
# compiled at the baseline level only: the harnesses test the file readers, not the vector loops.
level_files=$(sed -n '/^set(MESHWIT_CPU_LEVEL_SOURCES/,/)/p' CMakeLists.txt | tr -d '()' |
    tr ' ' '\n' | grep '\.c$' | sed 's|^|devices/cpu/|')
if [ -z "$level_files" ]; then
    echo "fuzz: no MESHWIT_CPU_LEVEL_SOURCES list in CMakeLists.txt" >&2
    exit 1
fi
blas_cflags=$(pkg-config --cflags openblas)
blas_libs=$(pkg-config --libs openblas)
rm -rf "$out/obj"
mkdir -p "$out/obj"
compile() { # source file: its object under $out/obj
    local f=$1 extra=()
    grep -qxF "$f" <<<"$level_files" && extra=(-DMW__CPU_LEVEL=_v1)
    # shellcheck disable=SC2086
    "$cc" "${flags[@]/-fsanitize=fuzzer,/-fsanitize=fuzzer-no-link,}" "${extra[@]}" $blas_cflags \
        -c "$f" -o "$out/obj/$(tr / _ <<<"${f%.c}").o"
}
export -f compile
export cc out level_files blas_cflags
export flags_text="${flags[*]}"
jobs=$(nproc 2>/dev/null || echo 2)
printf '%s\0' core/*.c formats/*.c collectives/*.c parallel/*.c devices/*.c devices/cpu/*.c text/*.c \
    examples/common/*.c |
    xargs -0 -n 1 -P "$jobs" bash -c 'read -ra flags <<<"$flags_text"; compile "$0"'
objects=("$out"/obj/*.o)
# shellcheck disable=SC2086
"$cc" "${flags[@]/-fsanitize=fuzzer,/-fsanitize=}" fuzz/make_seeds.c "${objects[@]}" $blas_libs \
    -ldl -lpthread -lm -o "$out/make_seeds"
for target in checkpoint model_file token_file safetensors tokenizer; do
    # shellcheck disable=SC2086
    "$cc" "${flags[@]}" "fuzz/fuzz_$target.c" "${objects[@]}" $blas_libs -lpthread -lm -ldl \
        -o "$out/fuzz_$target"
    mkdir -p "$out/seeds/$target" "$out/crashes/$target"
done
"$out/make_seeds" "$out/seeds"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
for target in checkpoint model_file token_file safetensors tokenizer; do
    # A target with no kept crash has no folder (git keeps no empty folders).
    regressions=()
    [ -d "fuzz/regressions/$target" ] && regressions=("fuzz/regressions/$target")
    echo "fuzz: $target: replaying ${regressions[*]:-no kept inputs} and the seeds"
    "$out/fuzz_$target" -runs=0 "${regressions[@]}" "$out/seeds/$target" 2>&1 | tail -n 2
    echo "fuzz: $target: fuzzing for ${seconds}s"
    "$out/fuzz_$target" -max_total_time="$seconds" -rss_limit_mb=2048 -max_len=65536 \
        -artifact_prefix="$out/crashes/$target/" "$out/seeds/$target" 2>&1 | tail -n 3
done
echo "fuzz: no crash"
