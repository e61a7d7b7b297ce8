#!/usr/bin/env bash
# Every Criterion suite of the GPU tests is registered and run where it belongs:
#   - a suite of tests/gpu/*.c that needs a GPU (any not named *_host) is a CTest test of its
#     name labelled gpu in BUILD, and scripts/gpu-check.sh runs it in exactly one stage;
#   - a host-side suite (*_host, in tests/gpu/*.c or tests/gpu/fake/*.c) is a CTest test of its
#     name labelled gpu-host, and gpu-check.sh, which runs no CPU-only test, does not name it;
#   - gpu-check.sh names no suite that the sources do not define.
# Usage: scripts/check-gpu-suites.sh ROOT BUILD   (BUILD: a configured build tree of ROOT)
# Prints every breach and exits 1 when there is one.
set -euo pipefail

root=${1:?usage: check-gpu-suites.sh ROOT BUILD}
build=${2:?usage: check-gpu-suites.sh ROOT BUILD}

# The suites the sources define: the first argument of Test( and TestSuite(, the second of
# ParameterizedTest( and Theory( (after a parameter or a parenthesised list of types), at a
# line's start.
suites_of() {
    local f
    for f in "$@"; do
        [ -f "$f" ] || continue
        grep -hoE '^(Test|TestSuite)\([a-z_0-9]+' "$f" | sed 's/.*(//' || true
        grep -hoE '^(ParameterizedTest\([^,]*|Theory\(\([^)]*\)), *[a-z_0-9]+' "$f" |
            sed 's/.*, *//' || true
    done | sort -u
}

# The CTest tests of BUILD with label $1 exactly.
tests_labelled() {
    ctest --test-dir "$build" -N -L "^$1\$" | sed -n 's/^ *Test *#[0-9]*: *//p' | sort -u
}

gpu_suites=$(suites_of "$root"/tests/gpu/*.c)
fake_suites=$(suites_of "$root"/tests/gpu/fake/*.c)
[ -n "$gpu_suites" ] || {
    echo "check-gpu-suites: no suites found in $root/tests/gpu" >&2
    exit 1
}
need=$(grep -v '_host$' <<< "$gpu_suites" || true)
host=$(printf '%s\n%s\n' "$(grep '_host$' <<< "$gpu_suites" || true)" "$fake_suites" |
    sed '/^$/d' | sort -u)

labelled_gpu=$(tests_labelled gpu)
labelled_host=$(tests_labelled gpu-host)
listing=$(bash "$root/scripts/gpu-check.sh" --list)
planned=$(sed -n 's/^suite \([a-z_0-9]*\) .*/\1/p' <<< "$listing")

fail=0
breach() {
    echo "check-gpu-suites: $*" >&2
    fail=1
}

# The stages' limits fit the default budget: no stage is promised time the run does not have.
read -r _ limits _ budget <<< "$(grep '^limits ' <<< "$listing")"
[ -n "${limits:-}" ] && [ "$limits" -le "$budget" ] ||
    breach "the stages' limits of scripts/gpu-check.sh add up to ${limits:-?} s, more than its" \
        "default budget of ${budget:-?} s"

for s in $need; do
    grep -qx "$s" <<< "$labelled_gpu" ||
        breach "suite $s (tests/gpu) is not a CTest test labelled gpu in $build"
    n=$(grep -cx "$s" <<< "$planned" || true)
    [ "$n" -eq 1 ] || breach "suite $s is run by $n stages of scripts/gpu-check.sh (must be 1:" \
        "add it to KERNEL_SUITES or TRAINER_SUITES there)"
done
for s in $host; do
    grep -qx "$s" <<< "$labelled_host" ||
        breach "host-side suite $s is not a CTest test labelled gpu-host in $build"
    grep -qx "$s" <<< "$planned" &&
        breach "host-side suite $s is run by scripts/gpu-check.sh, which runs no CPU-only test"
done
for s in $planned; do
    grep -qx "$s" <<< "$need" ||
        breach "scripts/gpu-check.sh runs suite $s, which no file of tests/gpu defines"
done

if [ "$fail" -ne 0 ]; then
    echo "check-gpu-suites: the GPU suites above are not registered or run where they belong" >&2
    exit 1
fi
echo "check-gpu-suites: $(wc -w <<< "$need") GPU suites registered and run by gpu-check.sh" \
    "($(tr '\n' ' ' <<< "$need")); $(wc -w <<< "$host") host-side suites registered"
