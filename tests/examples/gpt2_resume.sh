#!/usr/bin/env bash
# An interrupted and resumed gpt2 run prints the same per-step losses as an uninterrupted one.
# Usage: gpt2_resume.sh PATH_TO_GPT2
set -euo pipefail
gpt2="$1"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
args=(--devices cpu:2 --steps 12 --batch 8 --seq 32 --val-every 0 --sample 0 --layers 2
      --channels 64)
"$gpt2" "${args[@]}" | grep -E '^(step|final)' | sed 's/  (.*//' > "$dir/whole"
"$gpt2" "${args[@]}" --checkpoint "$dir/state.mwc" --stop-at 5 | grep -E '^step' \
    | sed 's/  (.*//' > "$dir/resumed"
"$gpt2" "${args[@]}" --checkpoint "$dir/state.mwc" --resume | grep -E '^(step|final)' \
    | sed 's/  (.*//' >> "$dir/resumed"
if ! diff "$dir/whole" "$dir/resumed"; then
    echo "gpt2_resume: the resumed run differs from the uninterrupted one" >&2
    exit 1
fi
# A damaged checkpoint is refused with a clear error, and the file is left as it was.
printf 'X' | dd of="$dir/state.mwc" bs=1 seek=100 conv=notrunc status=none
if "$gpt2" "${args[@]}" --checkpoint "$dir/state.mwc" --resume > "$dir/out" 2>&1; then
    echo "gpt2_resume: a damaged checkpoint was accepted" >&2
    exit 1
fi
grep -q "checksum" "$dir/out" || { cat "$dir/out" >&2; exit 1; }
echo "gpt2_resume: $(wc -l < "$dir/whole") lines identical; damaged checkpoint refused"
