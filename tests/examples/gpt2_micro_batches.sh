#!/usr/bin/env bash
# gpt2 --micro-batches M (gradient accumulation over M parts of the global batch) against the
# one-batch run: every step's and validation's loss agrees to the printed precision, and the saved
# model to within 1e-5 of every parameter (measured: 4.4e-7 on cpu:1 with M=4; one device against
# two, both without micro-batches, 9.6e-7; a micro-batch fed the wrong rows, or the update made of
# one micro-batch alone, moves the losses by 1e-3 and more). With the same M, --shard-optimizer,
# --shard-params and --recompute give the same bits, a checkpoint resumes to the same bits with
# the same M and to rounding with another, bf16 and the 2 x 2 data x tensor mesh agree, the memory
# line shows the smaller activations and the accumulator, llama runs it too, and an M that does
# not divide --batch, or leaves a device of the data axis no row, is refused naming the fix.
# Usage: gpt2_micro_batches.sh PATH_TO_GPT2 PATH_TO_LLAMA PATH_TO_TEXT
set -euo pipefail
gpt2="$1" llama="$2" text="$3"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
die() { echo "gpt2_micro_batches: $*" >&2; exit 1; }
args=(--steps 6 --batch 8 --seq 32 --val-every 3 --val-batches 2 --sample 0 --layers 2
      --channels 64 --heads 4)
train() { # NAME, then the flags: NAME.bin and NAME.log
    local name="$1"
    shift
    "$gpt2" "${args[@]}" "$@" --save "$dir/$name.bin" > "$dir/$name.log" 2>&1 ||
        { cat "$dir/$name.log" >&2; die "training failed: $*"; }
}
# "step1: 5.5070" per step, "val 5.3214" per validation.
losses() { awk '/^step [0-9]+: loss/ { print "step" $2, $4 } /^val loss/ { print "val", $3 }' "$1"; }
# agree A B TOL COUNT: two lists of losses, the same COUNT steps and validations, within TOL.
agree() {
    paste -d ' ' "$1" "$2" > "$dir/pair"
    awk -v t="$3" -v n="$4" 'NF != 4 || $1 != $3 || ($2 - $4) > t || ($4 - $2) > t { bad = 1 }
                             END { exit bad || NR != n }' "$dir/pair" ||
        { cat "$dir/pair" >&2; die "losses differ by more than $3 (or not $4 of them)"; }
}
# close A B: two llm.c model files of one model, every float within 1e-5 (the header's ints
# read as floats are equal).
close() {
    [ "$(stat -c %s "$1")" = "$(stat -c %s "$2")" ] || die "$1 and $2 differ in size"
    paste <(od -An -v -t f4 -w4 "$1") <(od -An -v -t f4 -w4 "$2") |
        awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > m) m = d }
             END { printf "%.3g\n", m; exit !(NR > 1000 && m <= 1e-5) }' > "$dir/max" ||
        die "$1 and $2: a parameter differs by $(cat "$dir/max")"
}
same() { cmp -s "$1" "$2" || die "$3: the model is not the same bits"; }

# One device: M = 4 against M = 1 (the same random windows, fed as 4 x 2 rows).
train one1 --devices cpu:1
train one4 --devices cpu:1 --micro-batches 4
agree <(losses "$dir/one1.log") <(losses "$dir/one4.log") 1.5e-4 8
close "$dir/one1.bin" "$dir/one4.bin"
one4_max=$(cat "$dir/max")
grep -q "accumulator" "$dir/one1.log" && die "M = 1 keeps an accumulator"
grep -q "^batch 8 x 32 (random windows) in 4 micro-batches of 2," "$dir/one4.log" ||
    die "no micro-batches in the setup line"
mb() { sed -n "s/^memory per device: .*$1 \([0-9.]*\) MB.*/\1/p" "$2"; }
a1=$(mb activations "$dir/one1.log") a4=$(mb activations "$dir/one4.log")
g1=$(mb gradients "$dir/one1.log") g4=$(mb gradients "$dir/one4.log")
awk -v a1="$a1" -v a4="$a4" -v g1="$g1" -v g4="$g4" \
    'BEGIN { exit !(a1 > 0 && a4 > 0 && a4 * 2 < a1 && g4 > g1 * 1.9 && g4 < g1 * 2.1) }' ||
    die "memory per device: activations $a1 -> $a4 MB, gradients $g1 -> $g4 MB"
grep -q "gradients [0-9.]* MB ([0-9.]* MB of them the accumulator)" "$dir/one4.log" ||
    die "the memory line does not name the accumulator"

# Two devices, M = 4: ZeRO-1, FSDP with recomputation, the devices on one thread: the same bits.
train two4 --devices cpu:2 --micro-batches 4
close "$dir/one1.bin" "$dir/two4.bin"
train two4z --devices cpu:2 --micro-batches 4 --shard-optimizer
same "$dir/two4.bin" "$dir/two4z.bin" "--shard-optimizer"
train two4f --devices cpu:2 --micro-batches 4 --shard-params --recompute blocks --cpu-threads 1
same "$dir/two4.bin" "$dir/two4f.bin" "--shard-params --recompute blocks --cpu-threads 1"

# Data x tensor parallel with micro-batches of 4 rows; bf16 against its own one-batch run.
train tp --devices cpu:4 --mesh X=2,Y=2 --model-axis Y --micro-batches 2
agree <(losses "$dir/one1.log") <(losses "$dir/tp.log") 1.5e-4 8
close "$dir/one1.bin" "$dir/tp.bin"
train bf1 --devices cpu:1 --precision bf16
train bf4 --devices cpu:1 --precision bf16 --micro-batches 4
agree <(losses "$dir/bf1.log") <(losses "$dir/bf4.log") 5e-4 8

# A checkpoint between steps: resumed with the same M, the same bits; with M = 1, the same run.
"$gpt2" "${args[@]}" --devices cpu:2 --micro-batches 4 --checkpoint "$dir/s.mwc" --stop-at 3 \
    > /dev/null
cp "$dir/s.mwc" "$dir/s1.mwc"
train res4 --devices cpu:2 --micro-batches 4 --checkpoint "$dir/s.mwc" --resume
same "$dir/two4.bin" "$dir/res4.bin" "resumed with the same --micro-batches"
train res1 --devices cpu:2 --checkpoint "$dir/s1.mwc" --resume
close "$dir/two4.bin" "$dir/res1.bin"
agree <(losses "$dir/two4.log" | sed -n '5,$p') <(losses "$dir/res1.log") 1.5e-4 4
# llama, M = 2 against M = 1 on two devices.
lf=(--data "$text" --steps 4 --batch 8 --seq 32 --val-every 0 --sample 0 --layers 2 --devices cpu:2)
"$llama" "${lf[@]}" > "$dir/l1.log" 2>&1 || { cat "$dir/l1.log" >&2; die "llama"; }
"$llama" "${lf[@]}" --micro-batches 2 > "$dir/l2.log" 2>&1 ||
    { cat "$dir/l2.log" >&2; die "llama --micro-batches 2"; }
agree <(losses "$dir/l1.log") <(losses "$dir/l2.log") 1.5e-4 4
# Refusals, before training, naming the fix.
refused() { # expected words, then the flags
    local want="$1"
    shift
    if "$gpt2" "${args[@]}" "$@" > "$dir/out" 2>&1; then die "accepted: $*"; fi
    grep -q "^step" "$dir/out" && die "trained before refusing: $*"
    grep -qF -- "$want" "$dir/out" || { cat "$dir/out" >&2; die "no '$want' for: $*"; }
}
refused "--micro-batches 3 does not divide --batch 8: use a divisor of 8 (1, 2, 4 or 8)" \
    --micro-batches 3
refused "fewer than the 2 devices of data axis X that split it: use a divisor of 8 of at most 4" \
    --devices cpu:2 --micro-batches 8
refused "fewer than the 2 devices of data axis X that split it: use a divisor of 4 of at most 2" \
    --devices cpu:4 --mesh X=2,Y=2 --model-axis Y --batch 4 --micro-batches 4
refused "bad value '0' for --micro-batches" --micro-batches 0
echo "gpt2_micro_batches: losses and models as with one batch (largest parameter difference" \
     "$one4_max on cpu:1), layouts alike, resumes, llama, refusals; activations $a1 -> $a4 MB," \
     "gradients $g1 -> $g4 MB"
