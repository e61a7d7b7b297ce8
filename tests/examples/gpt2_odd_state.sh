#!/usr/bin/env bash
# Damaged or odd state given to the gpt2 example: each is refused with a one-line reason (and
# never blocks), or handled as a careful tool would.
# Usage: gpt2_odd_state.sh PATH_TO_GPT2
set -euo pipefail
gpt2="$1"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
args=(--devices cpu:1 --steps 3 --batch 4 --seq 16 --val-every 0 --sample 0 --layers 1
      --channels 32)
die() { echo "gpt2_odd_state: $*" >&2; exit 1; }
# expect_fail REGEX ARGS...: gpt2 ARGS must fail (not by the time limit) with REGEX in its output.
expect_fail() {
    local re="$1" rc=0
    shift
    timeout 60 "$gpt2" "$@" > "$dir/out" 2>&1 || rc=$?
    [[ $rc != 0 && $rc != 124 ]] || { cat "$dir/out" >&2; die "status $rc for: $*"; }
    grep -qE -- "$re" "$dir/out" || { cat "$dir/out" >&2; die "no '$re' for: $*"; }
}

# Non-regular files, refused as such before any read (a FIFO without a writer would block).
mkfifo "$dir/fifo"
mkdir "$dir/adir"
for opt in --data --load "--checkpoint"; do
    extra=()
    [[ $opt == --checkpoint ]] && extra=(--resume)
    expect_fail "it is a FIFO, not a regular file" "${args[@]}" $opt "$dir/fifo" "${extra[@]}"
    expect_fail "it is a directory, not a regular file" "${args[@]}" $opt "$dir/adir" "${extra[@]}"
    expect_fail "it is a character device" "${args[@]}" $opt /dev/zero "${extra[@]}"
done

expect_fail "--checkpoint .*adir exists and is not a regular file" "${args[@]}" --checkpoint \
    "$dir/adir"

# Contradictory flags and sloppy numbers.
expect_fail "--stop-at 50 is not before the last step \(--steps 2\)" "${args[@]}" --stop-at 50 \
    --steps 2
expect_fail "--checkpoint-every needs --checkpoint" "${args[@]}" --checkpoint-every 5
expect_fail "--resume needs --checkpoint" "${args[@]}" --resume
expect_fail "--eval-only trains nothing" "${args[@]}" --eval-only --save "$dir/m.bin"
expect_fail "bad value ' -5' for --seed" "${args[@]}" --seed " -5"
expect_fail "bad value '-5' for --seed" "${args[@]}" --seed -5
expect_fail "bad value ' 3' for --steps" "${args[@]}" --steps " 3"

# Resuming a finished run does nothing else: no training, no --save.
"$gpt2" "${args[@]}" --checkpoint "$dir/done.mwc" > /dev/null
"$gpt2" "${args[@]}" --checkpoint "$dir/done.mwc" --resume --save "$dir/m.bin" > "$dir/out"
grep -qx "already at step 3 of 3" "$dir/out" || die "no 'already at step 3 of 3'"
grep -qE '^(step|final|saved)' "$dir/out" && die "a finished run trained or saved again"
[[ -e "$dir/m.bin" ]] && die "a finished run wrote --save"

# NaN weights in a model file: refused with the tensor and the index, unless allowed; then
# --eval-only reports the non-finite loss with a non-zero status.
"$gpt2" "${args[@]}" --save "$dir/m.bin" > /dev/null
printf '\x00\x00\xc0\x7f' | dd of="$dir/m.bin" bs=1 seek=$((1024 + 4 * 5)) conv=notrunc status=none
expect_fail "parameter wte holds NaN at index 5" "${args[@]}" --load "$dir/m.bin"
expect_fail "the eval loss is nan" "${args[@]}" --load "$dir/m.bin" --allow-nonfinite --eval-only
echo "gpt2_odd_state: every odd input refused or handled"
