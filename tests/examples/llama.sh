#!/usr/bin/env bash
# The llama example: trains a preset model (and samples through the key/value cache the tokens
# that recomputing the window gives); loads transformers' Qwen2 and Llama models, trains them
# tensor parallel and with FSDP, saves safetensors + config.json that it loads back to the same
# eval loss on one device and on two; refuses llm.c files, other presets, a --save over another
# model's config.json.
# Usage: llama.sh PATH_TO_LLAMA PATH_TO_TEXT TESTS_DATA_LLAMA
set -euo pipefail
llama="$1" text="$2" models="$3"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
die() { echo "llama.sh: $*" >&2; exit 1; }
tokens() { sed -n '/^sample (/,/^sampled /p' | sed '1d;$d'; }
evloss() { grep -o 'eval loss [0-9.]*' | awk '{print $3}'; }

help=$("$llama" --help) || die "--help failed"
grep -q "^usage: llama " <<< "$help" || die "--help is not llama's"
grep -q "2 key/value heads" <<< "$help" || die "--help does not describe llama's presets"
if grep -q "gpt2-124m\|GPT2LMHeadModel" <<< "$help"; then die "--help describes GPT-2's models"; fi

base=(--data "$text" --steps 20 --batch 8 --seq 32 --val-every 0 --temperature 0 --layers 2)
"$llama" "${base[@]}" --sample 30 > "$dir/cache" 2>&1 || { cat "$dir/cache" >&2; die "training"; }
"$llama" "${base[@]}" --sample 30 --sample-recompute > "$dir/recompute" 2>&1 ||
    { cat "$dir/recompute" >&2; die "training (recompute)"; }
grep -q "model: llama, 2 layers, 4 heads (2 key/value)" "$dir/cache" || die "no model line"
diff <(tokens < "$dir/cache") <(tokens < "$dir/recompute") ||
    die "the cached sample differs from the recomputed one"
[ -n "$(tokens < "$dir/cache")" ] || die "an empty sample"

ev=(--data "$text" --eval-only --eval-batches 3 --batch 4 --seq 32)
for m in qwen2 llama-gqa; do
    mkdir -p "$dir/$m"
    for layout in "--devices cpu:2 --mesh Y=2 --model-axis Y" "--devices cpu:2 --shard-params"; do
        # shellcheck disable=SC2086
        "$llama" --load "$models/$m/model.safetensors" --data "$text" --steps 3 --batch 4 \
            --seq 32 --sample 0 $layout --save "$dir/$m/model.safetensors" > "$dir/train" 2>&1 ||
            { cat "$dir/train" >&2; die "$m: training ($layout)"; }
        "$llama" --load "$dir/$m/model.safetensors" "${ev[@]}" > "$dir/e1" 2>&1 ||
            { cat "$dir/e1" >&2; die "$m: evaluating the saved model"; }
        "$llama" --load "$dir/$m/model.safetensors" "${ev[@]}" --devices cpu:2 --mesh Y=2 \
            --model-axis Y > "$dir/e2" 2>&1 || { cat "$dir/e2" >&2; die "$m: evaluating on Y=2"; }
        a=$(evloss < "$dir/e1") b=$(evloss < "$dir/e2")
        [ -n "$a" ] || die "$m: no eval loss"
        awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; exit !(d < 1e-4 && d > -1e-4) }' ||
            die "$m: eval loss $a on cpu:1, $b on Y=2"
        grep -q '"model_type": "'"$([ $m = qwen2 ] && echo qwen2 || echo llama)"'"' \
            "$dir/$m/config.json" || die "$m: config.json's model_type"
        rm -f "$dir/$m/model.safetensors" "$dir/$m/config.json"
    done
done

# Refusals: an llm.c file, a GPT-2 preset, a --save that is not safetensors, a --save over
# another model's config.json.
printf 'not a model' > "$dir/m.bin"
refused() { # expected words, then the flags
    local want="$1"
    shift
    if "$llama" "$@" > "$dir/out" 2>&1; then die "accepted: $*"; fi
    grep -q -- "$want" "$dir/out" || { cat "$dir/out" >&2; die "no '$want' for: $*"; }
}
refused "Hugging Face safetensors" --load "$dir/m.bin" --data "$text"
refused "for --preset (expected tiny or small)" --preset gpt2-124m --data "$text"
refused "name it model.safetensors" --data "$text" --steps 1 --save "$dir/out.bin"
mkdir -p "$dir/other"
cp "$models/qwen2/config.json" "$dir/other/config.json"
refused "another model" --data "$text" --steps 1 --save "$dir/other/model.safetensors"
echo "llama.sh: ok"
