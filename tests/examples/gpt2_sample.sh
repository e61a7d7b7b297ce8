#!/usr/bin/env bash
# Sampling through the key/value cache gives the tokens of recomputing the window for every token
# (temperature 0, within one window), data parallel and tensor parallel, fp32 and bf16; beyond
# the window it keeps sampling (the cache starts again from the last half).
# Usage: gpt2_sample.sh PATH_TO_GPT2
set -euo pipefail
gpt2="$1"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
die() { echo "gpt2_sample: $*" >&2; exit 1; }
tokens() { sed -n '/^sample (/,/^sampled /p' | sed '1d;$d'; }
base=(--steps 40 --batch 8 --seq 32 --val-every 0 --temperature 0 --layers 2 --channels 64)
for mesh in "--devices cpu:1" "--devices cpu:2" "--devices cpu:2 --mesh Y=2 --model-axis Y"; do
    for precision in fp32 bf16; do
        # shellcheck disable=SC2086
        args=("${base[@]}" $mesh --precision "$precision" --sample 31)
        "$gpt2" "${args[@]}" > "$dir/cache" 2>&1 || { cat "$dir/cache" >&2; die "cache: $mesh"; }
        "$gpt2" "${args[@]}" --sample-recompute > "$dir/recompute" 2>&1 ||
            { cat "$dir/recompute" >&2; die "recompute: $mesh"; }
        grep -q "key/value cache" "$dir/cache" || die "the cache was not used ($mesh)"
        diff <(tokens < "$dir/cache") <(tokens < "$dir/recompute") ||
            die "the cached sample differs from the recomputed one ($mesh, $precision)"
        [ -n "$(tokens < "$dir/cache")" ] || die "an empty sample ($mesh)"
    done
done
# Beyond the window: 100 tokens from a window of 32.
"$gpt2" "${base[@]}" --devices cpu:1 --sample 100 > "$dir/long" 2>&1 || { cat "$dir/long" >&2; die "long"; }
grep -q '^sampled 100 tokens' "$dir/long" || die "no 100 tokens: $(tail -3 "$dir/long")"
echo "gpt2_sample: the cache samples what recomputing samples, on 3 meshes in fp32 and bf16"
