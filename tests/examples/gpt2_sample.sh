#!/usr/bin/env bash
# Sampling through the key/value cache gives the tokens of recomputing the window for every token
# (temperature 0), data parallel and tensor parallel, fp32 and bf16, within one window and beyond
# it (both start again from the last half of the window when it is full).
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
# Beyond the window: 100 tokens from a window of 16, after a prompt of one line and of one longer
# than the window, from a model trained long enough for its samples to depend on the context.
# Both ways keep the same context (when full, it starts again from its last half): the same
# tokens.
long=(--devices cpu:1 --batch 8 --seq 16 --val-every 0 --temperature 0 --layers 2 --channels 64)
"$gpt2" "${long[@]}" --steps 300 --lr 1e-2 --sample 0 --save "$dir/long.bin" > "$dir/long" 2>&1 ||
    { cat "$dir/long" >&2; die "training the long-sample model"; }
for prompt in $'\n' "$(printf '12+34=46\n%.0s' {1..3})"; do
    for how in "" --sample-recompute; do
        "$gpt2" "${long[@]}" --load "$dir/long.bin" --steps 0 --sample 100 --prompt "$prompt" \
            $how > "$dir/long$how" 2>&1 || { cat "$dir/long$how" >&2; die "long $how"; }
        grep -q '^sampled 100 tokens' "$dir/long$how" || die "no 100 tokens: $(tail -3 "$dir/long$how")"
    done
    [[ $(tokens < "$dir/long" | sort -u | wc -l) -gt 2 ]] || die "the long sample does not vary"
    diff <(tokens < "$dir/long") <(tokens < "$dir/long--sample-recompute") ||
        die "beyond the window the cached sample differs from the recomputed one"
done
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
echo "gpt2_sample: the cache samples what recomputing samples, on 3 meshes in fp32 and bf16," \
    "beyond the window too;" \
    "text in and out through a tokenizer"
