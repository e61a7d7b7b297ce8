#!/usr/bin/env bash
# The gpt2 example's sampling flags (--temperature, --top-k, --top-p, --seed, --eos), as a user
# runs them: top-k 1 draws the greedy tokens (cached and recomputed), a seed reproduces its text
# and another seed gives another, the sample depends on the model and the seed alone (sampled
# right after training, or from the saved model; after an interrupted and resumed run), the --eos
# token ends a sample (a byte that is printed; a tokenizer's special token that is not), and bad
# values are refused before training.
# Usage: gpt2_sampling.sh PATH_TO_GPT2 TOKENIZER.json
set -euo pipefail
gpt2="$1"
tok="$2"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
die() { echo "gpt2_sampling: $*" >&2; exit 1; }
tokens() { sed -n '/^sample (/,/^sampled /p' "$1" | sed '1d;$d'; }
run() { # OUT ARGS...: runs gpt2, its output to $dir/OUT
    local out=$1
    shift
    "$gpt2" "$@" > "$dir/$out" 2>&1 || { cat "$dir/$out" >&2; die "gpt2 $*"; }
}
model=(--devices cpu:1 --batch 8 --seq 16 --val-every 0 --layers 2 --channels 64)
run train "${model[@]}" --steps 300 --lr 1e-2 --sample 0 --save "$dir/m.bin"
load=("${model[@]}" --load "$dir/m.bin" --steps 0 --sample 60 --prompt "12+3")

# Top-k 1 keeps only the likeliest token: the greedy sample, at any temperature.
run greedy "${load[@]}" --temperature 0
run top1 "${load[@]}" --temperature 1.3 --top-k 1 --seed 5
run top1r "${load[@]}" --temperature 1.3 --top-k 1 --seed 6 --sample-recompute
[[ $(tokens "$dir/greedy" | wc -l) -gt 3 ]] || die "a short greedy sample: $(tokens "$dir/greedy")"
diff <(tokens "$dir/greedy") <(tokens "$dir/top1") || die "top-k 1 differs from greedy"
diff <(tokens "$dir/greedy") <(tokens "$dir/top1r") || die "top-k 1, recomputed, differs"
grep -q '^sample (60 tokens, temperature 1.3, top-k 1, top-p 1, seed 5' "$dir/top1" ||
    die "the sample's settings: $(grep '^sample (' "$dir/top1")"

# A seed reproduces its text, cached or recomputed; another seed gives another.
flags=(--temperature 1 --top-k 8 --top-p 0.9)
run s7 "${load[@]}" "${flags[@]}" --seed 7
run s7again "${load[@]}" "${flags[@]}" --seed 7
run s7r "${load[@]}" "${flags[@]}" --seed 7 --sample-recompute
run s8 "${load[@]}" "${flags[@]}" --seed 8
diff <(tokens "$dir/s7") <(tokens "$dir/s7again") || die "--seed 7 twice: other text"
diff <(tokens "$dir/s7") <(tokens "$dir/s7r") || die "--seed 7 recomputed: other text"
[ -n "$(tokens "$dir/s7")" ] || die "an empty sample"
diff -q <(tokens "$dir/s7") <(tokens "$dir/s8") > /dev/null && die "--seed 7 and 8 sampled alike"
diff -q <(tokens "$dir/s7") <(tokens "$dir/greedy") > /dev/null && die "--seed 7 sampled greedily"

# The sample depends on the model and the seed, not on what ran before it: sampled at the end of
# the training run, it is the sample of the saved model; and a run stopped and resumed from its
# checkpoint samples what the uninterrupted run does.
short=("${model[@]}" --steps 20 --sample 60 --prompt "12+3" "${flags[@]}" --seed 11)
run trained "${short[@]}" --save "$dir/short.bin"
run loaded "${model[@]}" --load "$dir/short.bin" --steps 0 --sample 60 --prompt "12+3" \
    "${flags[@]}" --seed 11
diff <(tokens "$dir/trained") <(tokens "$dir/loaded") || die "trained and loaded sample differ"
run stopped "${short[@]}" --checkpoint "$dir/c.mwc" --stop-at 10
run resumed "${short[@]}" --checkpoint "$dir/c.mwc" --resume
grep -q '^resumed .* at step 10' "$dir/resumed" || die "not resumed: $(head -5 "$dir/resumed")"
diff <(tokens "$dir/trained") <(tokens "$dir/resumed") || die "the resumed run samples otherwise"

# --eos ends the sample: a newline byte ends it after the first line, printed and counted.
run eos "${load[@]}" --temperature 0 --eos 10
grep -q '^sampled [0-9]* tokens .*; ended by the --eos token$' "$dir/eos" || die "$(cat "$dir/eos")"
got=$(sed -n '/^sample (/,/^sampled /p' "$dir/eos" | sed '1d' | head -1)
want=$(tokens "$dir/greedy" | head -1)
[ "$got" = "$want" ] || die "--eos 10: '$got', the greedy first line is '$want'"
n=$(sed -n 's/^sampled \([0-9]*\) tokens.*/\1/p' "$dir/eos")
[ "$n" = $((${#want} - 4 + 1)) ] || die "--eos 10: $n tokens sampled for '$want' after '12+3'"

# A tokenizer's <|endoftext|> is the EOS without --eos: a model that learnt to say nothing else
# ends its sample at once, the token kept and counted but its text not printed; with --eos none
# it goes on, printing it.
printf 'ab<|endoftext|>%.0s' $(seq 300) > "$dir/eot.txt"
txt=(--devices cpu:1 --batch 8 --seq 16 --val-every 0 --layers 1 --channels 32 --tokenizer "$tok"
     --data "$dir/eot.txt" --prompt "ab" --temperature 0 --sample 10)
run eot "${txt[@]}" --steps 150 --lr 1e-2 --save "$dir/eot.bin"
grep -q '^sample (10 tokens, temperature 0: the likeliest tokens, EOS 0, ' "$dir/eot" ||
    die "the tokenizer's EOS: $(grep '^sample (' "$dir/eot")"
run eot_loaded "${txt[@]}" --steps 0 --load "$dir/eot.bin"
grep -q '^sampled 1 tokens .*; ended by the --eos token$' "$dir/eot_loaded" ||
    die "<|endoftext|> did not end the sample: $(cat "$dir/eot_loaded")"
tokens "$dir/eot_loaded" | grep -q 'endoftext' && die "the EOS token's text was printed"
run eot_none "${txt[@]}" --steps 0 --load "$dir/eot.bin" --eos none
grep -q '^sampled 10 tokens' "$dir/eot_none" || die "--eos none: $(cat "$dir/eot_none")"
tokens "$dir/eot_none" | grep -q '<|endoftext|>' || die "--eos none: no <|endoftext|> printed"

# Bad values, refused before training (exit 2, naming the flag).
refused() { # WHAT ARGS...
    local what=$1 rc=0
    shift
    "$gpt2" "${model[@]}" --steps 5 "$@" > "$dir/bad" 2>&1 || rc=$?
    [ "$rc" = 2 ] || die "$* exited $rc: $(cat "$dir/bad")"
    grep -qF -- "$what" "$dir/bad" || die "$*: no '$what' in: $(cat "$dir/bad")"
    grep -q '^step 1:' "$dir/bad" && die "$*: trained before refusing"
    return 0
}
refused "bad value '0' for --top-p" --top-p 0
refused "bad value '1.5' for --top-p" --top-p 1.5
refused "bad value '-1' for --top-k" --top-k -1
refused "bad value 'x' for --eos" --eos x
refused "--eos 256 is not a token of the model's vocabulary of 256" --eos 256
echo "gpt2_sampling: top-k 1 is greedy, a seed reproduces its text (trained, loaded, resumed)," \
    "--eos ends a sample (a byte; a tokenizer's <|endoftext|>), bad values refused"
