#!/usr/bin/env bash
# A checkpoint knows the run it belongs to, and every check that needs no training is made before
# the first step:
#   - a new run refuses to replace a --checkpoint that holds one (or any other file) unless
#     --start-over; the file stays as it was;
#   - --resume refuses other settings (batch, lr, steps, data, ...), naming each with both values,
#     unless --allow-change names them; the same data under another name is the same run, and a
#     resumed run prints the losses of the uninterrupted one;
#   - every bad flag value exits 2 before training, with a message naming the flag (also
#     --precision and --recompute, an empty file name, a --prompt byte outside --vocab).
# Usage: gpt2_checkpoint_run.sh PATH_TO_GPT2
set -euo pipefail
gpt2="$1"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
die() { echo "gpt2_checkpoint_run: $*" >&2; exit 1; }
losses() { grep -E '^(step|final)' | sed 's/  (.*//'; }
for i in $(seq 300); do echo "line $i of the text the model reads, with some words in it"; done \
    > "$dir/d.txt"
args=(--devices cpu:1 --steps 6 --batch 4 --seq 16 --val-every 0 --sample 0 --layers 1
      --channels 32 --data "$dir/d.txt")
# refused REGEX ARGS...: gpt2 ARGS exits 2, before the first step, saying REGEX; the checkpoint
# (when there is one) is unchanged.
refused() {
    local re="$1" rc=0 before=""
    shift
    [[ -e $dir/c.mwc ]] && before=$(sha256sum < "$dir/c.mwc")
    timeout 60 "$gpt2" "$@" > "$dir/out" 2>&1 || rc=$?
    [[ $rc == 2 ]] || { cat "$dir/out" >&2; die "exit status $rc (not 2) for: $*"; }
    grep -qE -- "$re" "$dir/out" || { cat "$dir/out" >&2; die "no '$re' for: $*"; }
    grep -q '^step' "$dir/out" && die "trained before refusing: $*"
    [[ -z $before || $before == "$(sha256sum < "$dir/c.mwc")" ]] || die "the checkpoint changed: $*"
    return 0
}

"$gpt2" "${args[@]}" | losses > "$dir/whole"
"$gpt2" "${args[@]}" --checkpoint "$dir/c.mwc" --stop-at 3 | losses > "$dir/first"

# A new run does not replace a run's checkpoint, nor another file.
refused "--checkpoint .*c.mwc holds a run at step 3: continue it with --resume, or give --start-over" \
    "${args[@]}" --checkpoint "$dir/c.mwc"
echo "my notes" > "$dir/notes.txt"
refused "--checkpoint .*notes.txt exists and holds no run .*: not replaced" "${args[@]}" \
    --checkpoint "$dir/notes.txt"
[[ $(cat "$dir/notes.txt") == "my notes" ]] || die "notes.txt was replaced"

# Another run's settings are named, each with both values.
refused "holds another run \(at step 3\); 3 settings differ" "${args[@]}" --checkpoint "$dir/c.mwc" \
    --resume --batch 2 --lr 0.01 --steps 8
for want in "batch: 4 in the checkpoint, 2 now" "lr: 0.002 in the checkpoint, 0.01 now" \
    "steps: 6 in the checkpoint, 8 now" "--allow-change"; do
    grep -qF -- "$want" "$dir/out" || { cat "$dir/out" >&2; die "no '$want'"; }
done
sed 's/words/verbs/' "$dir/d.txt" > "$dir/other.txt"
refused "data: [0-9]+ tokens, hash [0-9a-f]+ in the checkpoint, [0-9]+ tokens, hash [0-9a-f]+ now" \
    "${args[@]}" --checkpoint "$dir/c.mwc" --resume --data "$dir/other.txt"
refused "precision: fp32 in the checkpoint, bf16 now" "${args[@]}" --checkpoint "$dir/c.mwc" \
    --resume --precision bf16
refused "'bogus' is not a setting a checkpoint records \(layers, heads, .*lr" "${args[@]}" \
    --checkpoint "$dir/c.mwc" --resume --allow-change lr,bogus
refused "--allow-change needs --resume" "${args[@]}" --checkpoint "$dir/c.mwc" --allow-change lr
refused "--start-over and --resume contradict each other" "${args[@]}" --checkpoint "$dir/c.mwc" \
    --resume --start-over

# The same tokens under another name are the same data: the resumed run is the whole run.
cp "$dir/d.txt" "$dir/renamed.txt"
cp "$dir/c.mwc" "$dir/keep.mwc"
"$gpt2" "${args[@]}" --checkpoint "$dir/c.mwc" --resume --data "$dir/renamed.txt" \
    | losses > "$dir/rest"
cat "$dir/first" "$dir/rest" | diff "$dir/whole" - || die "the resumed run differs from the whole"
# Allowed by name, the changes are taken.
cp "$dir/keep.mwc" "$dir/c.mwc"
"$gpt2" "${args[@]}" --checkpoint "$dir/c.mwc" --resume --steps 8 --lr 0.01 \
    --allow-change steps,lr > "$dir/out" || { cat "$dir/out" >&2; die "--allow-change refused"; }
grep -q '^resumed .* at step 3$' "$dir/out" || die "--allow-change: not resumed at step 3"
grep -q '^step 8:' "$dir/out" || die "--allow-change steps: not run to step 8"
# --start-over replaces it with a new run.
"$gpt2" "${args[@]}" --checkpoint "$dir/c.mwc" --start-over > /dev/null
"$gpt2" "${args[@]}" --checkpoint "$dir/c.mwc" --resume | grep -qx "already at step 6 of 6" ||
    die "--start-over did not write a new run"

# Every bad flag value: exit 2, before training, naming the flag.
refused "bad value 'bogus' for --precision \(expected fp32 or bf16\)" "${args[@]}" --precision bogus
refused "bad value 'bogus' for --recompute \(expected none, blocks or dots\)" "${args[@]}" \
    --recompute bogus
refused "bad value 'bogus' for --data-format \(expected auto, text or tokens\)" "${args[@]}" \
    --data-format bogus
refused "bad value 'bogus' for --schedule \(expected cosine or constant\)" "${args[@]}" \
    --schedule bogus
refused "bad value 'bogus' for --cpu-threads \(expected auto, per-device or a number from 1" \
    "${args[@]}" --cpu-threads bogus
refused "bad value '0' for --batch" "${args[@]}" --batch 0
refused "bad value '-1' for --temperature" "${args[@]}" --temperature -1
refused "bad value 'bogus' for --preset \(expected tiny, small or gpt2-124m\)" "${args[@]}" \
    --preset bogus
refused "--save: an empty file name" "${args[@]}" --save ""
refused "--checkpoint: an empty file name" "${args[@]}" --checkpoint ""
refused "--data: an empty file name" "${args[@]}" --data ""
refused "--prompt must not be empty" "${args[@]}" --prompt ""
refused "--prompt byte 2 is 0x7a \(122\), outside the model's vocabulary of 64 tokens" \
    --devices cpu:1 --steps 2 --batch 4 --seq 16 --layers 1 --channels 32 --vocab 64 \
    --prompt "1z" --sample 5
echo "gpt2_checkpoint_run: a run's checkpoint kept, other settings named, renamed data resumed" \
     "identically; bad flag values exit 2 before training"
