#!/usr/bin/env bash
# Sampling through the key/value cache gives the tokens of recomputing the window for every token
# (temperature 0, within one window), data parallel and tensor parallel, fp32 and bf16; beyond
# the window it keeps sampling (the cache starts again from the last half).
# Usage: gpt2_sample.sh PATH_TO_GPT2 PATH_TO_TEXT TOKENIZER.json
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
# Text in and out through a tokenizer: text --data is encoded, the vocabulary is the
# tokenizer's, --prompt is text and the sample prints as text (cached and recomputed alike).
tok="$3"
text="$2"
args=("${base[@]}" --devices cpu:2 --tokenizer "$tok" --data "$text" --prompt "The quick brown"
      --sample 20)
"$gpt2" "${args[@]}" > "$dir/t1" 2>&1 || { cat "$dir/t1" >&2; die "with --tokenizer"; }
grep -q '^encoded .* tokens in' "$dir/t1" || die "the text was not encoded: $(head -3 "$dir/t1")"
grep -q 'vocab 3000 (padded 3072)' "$dir/t1" || die "the vocabulary is not the tokenizer's"
grep -q 'tokens of --tokenizer' "$dir/t1" || die "the data line: $(grep '^data' "$dir/t1")"
grep -q '^The quick brown' "$dir/t1" || die "the prompt is not printed as text"
"$gpt2" "${args[@]}" --sample-recompute > "$dir/t2" 2>&1 || { cat "$dir/t2" >&2; die "recompute"; }
diff <(tokens < "$dir/t1") <(tokens < "$dir/t2") || die "text samples differ (cache, recompute)"
"$gpt2" "${args[@]}" --vocab 256 > "$dir/t3" 2>&1 && die "a vocabulary smaller than the tokenizer's"
grep -q "has 3000 tokens but the model's vocabulary is 256" "$dir/t3" || die "$(cat "$dir/t3")"
echo "gpt2_sample: the cache samples what recomputing samples, on 3 meshes in fp32 and bf16;" \
    "text in and out through a tokenizer"
