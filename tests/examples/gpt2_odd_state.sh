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
    expect_fail "is a FIFO, not a regular file" "${args[@]}" $opt "$dir/fifo" "${extra[@]}"
    expect_fail "is a directory, not a regular file" "${args[@]}" $opt "$dir/adir" "${extra[@]}"
    expect_fail "is a character device" "${args[@]}" $opt /dev/zero "${extra[@]}"
done

# Outputs, checked before the first step: never a FIFO, device or folder (a rename would
# replace it with a regular file), never an input, always in a folder that takes a new file.
for opt in --checkpoint --save; do
    expect_fail "$opt .*adir exists and is a directory, not a regular file" "${args[@]}" $opt \
        "$dir/adir"
    expect_fail "$opt .*fifo exists and is a FIFO, not a regular file" "${args[@]}" $opt \
        "$dir/fifo"
    expect_fail "$opt /dev/null exists and is a character device" "${args[@]}" $opt /dev/null
    expect_fail "$opt .*/missing/m.bin cannot be written: cannot create a file in .*missing: No such file" \
        "${args[@]}" $opt "$dir/missing/m.bin"
done
[[ -p "$dir/fifo" ]] || die "the FIFO was replaced"
printf 'some text to train on, long enough for a batch or two of sixteen bytes\n%.0s' {1..40} \
    > "$dir/d.txt"
expect_fail "--save .*d.txt is also --data .*d.txt: writing it would destroy an input" \
    "${args[@]}" --data "$dir/d.txt" --save "$dir/d.txt"
"$gpt2" "${args[@]}" --steps 1 --save "$dir/m0.bin" > /dev/null
expect_fail "--checkpoint .*m0.bin is also --load .*m0.bin" "${args[@]}" --load "$dir/m0.bin" \
    --checkpoint "$dir/m0.bin"
ln -s "$dir/m0.bin" "$dir/link.bin"
expect_fail "--save .*link.bin is also --load .*m0.bin" "${args[@]}" --load "$dir/m0.bin" \
    --save "$dir/link.bin"
expect_fail "--save and --checkpoint name the same file" "${args[@]}" --save "$dir/s.bin" \
    --checkpoint "$dir/s.bin"
# A read-only folder (root ignores permissions, so a read-only bind mount when possible).
mkdir "$dir/ro"
if [[ $(id -u) != 0 ]]; then
    chmod a-w "$dir/ro"
    expect_fail "--save .*ro/m.bin cannot be written: cannot create a file in .*ro: Permission denied" \
        "${args[@]}" --save "$dir/ro/m.bin"
    chmod u+w "$dir/ro"
elif mount --bind "$dir/ro" "$dir/ro" 2>/dev/null && mount -o remount,bind,ro "$dir/ro" 2>/dev/null; then
    expect_fail "--save .*ro/m.bin cannot be written: cannot create a file in .*ro: Read-only file system" \
        "${args[@]}" --save "$dir/ro/m.bin"
    umount "$dir/ro"
else
    umount "$dir/ro" 2>/dev/null || true
    echo "gpt2_odd_state: no read-only mount here (skipped that case)"
fi
# A model that llm.c's format cannot hold is refused before training, not at the save.
mkdir "$dir/hf"
"$gpt2" "${args[@]}" --steps 1 --save "$dir/hf/model.safetensors" > /dev/null
sed -i 's/"gelu_new"/"gelu"/' "$dir/hf/config.json"
expect_fail "--save .*m1.bin: llm.c's format holds GPT-2's layer-norm epsilon, tanh GELU" \
    "${args[@]}" --load "$dir/hf/model.safetensors" --save "$dir/m1.bin"
grep -q '^step' "$dir/out" && die "trained before refusing the --save"
# A loaded model's sizes are the file's: flags and presets that disagree are refused.
expect_fail "--layers 2, but .*hf/model.safetensors has 1" "${args[@]}" --layers 2 \
    --load "$dir/hf/model.safetensors"
expect_fail "--preset small has layers 6, but .*hf/model.safetensors has 1" "${args[@]}" \
    --preset small --load "$dir/hf/model.safetensors"
# Another model's config.json in the folder of a .safetensors --save is not replaced.
expect_fail "hf/config.json describes another model \(1 layers" "${args[@]}" --layers 2 \
    --save "$dir/hf/other.safetensors"
grep -q '"gelu"' "$dir/hf/config.json" || die "config.json was replaced"

# Contradictory flags and sloppy numbers.
expect_fail "--stop-at 50 is not before the last step \(--steps 2\)" "${args[@]}" --stop-at 50 \
    --steps 2
expect_fail "--checkpoint-every needs --checkpoint" "${args[@]}" --checkpoint-every 5
expect_fail "--resume needs --checkpoint" "${args[@]}" --resume
expect_fail "--eval-only trains nothing" "${args[@]}" --eval-only --save "$dir/m.bin"
expect_fail "bad value ' -5' for --seed" "${args[@]}" --seed " -5"
expect_fail "bad value '-5' for --seed" "${args[@]}" --seed -5
expect_fail "bad value ' 3' for --steps" "${args[@]}" --steps " 3"
expect_fail "--mesh X=2,X=2 names axis X twice" "${args[@]}" --devices cpu:4 --mesh X=2,X=2
# A leading zero is not octal: --seed 010 is --seed 10.
a=$("$gpt2" "${args[@]}" --steps 1 --seed 010 | grep '^step 1')
b=$("$gpt2" "${args[@]}" --steps 1 --seed 10 | grep '^step 1')
[[ ${a%%  *} == "${b%%  *}" ]] || die "--seed 010 is not --seed 10: '$a' vs '$b'"

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
