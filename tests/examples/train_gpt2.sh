#!/usr/bin/env bash
# train_gpt2, the one-file example, trains: it exits 0, its validation loss falls from the
# untrained model's (about ln 256 = 5.5 nats) by more than 2 nats, below the loss of a model
# that knows only how often each byte occurs (the unigram entropy it prints), and it prints a
# sample of the trained model.
# Usage: train_gpt2.sh PATH_TO_TRAIN_GPT2
set -euo pipefail
out=$(mktemp)
trap 'rm -f "$out"' EXIT
die() { cat "$out" >&2; echo "train_gpt2: $*" >&2; exit 1; }
timeout 300 "$1" > "$out" 2>&1 || die "exit status $?"
first=$(grep -m1 '^val loss' "$out" | awk '{print $3}')
last=$(grep '^val loss' "$out" | tail -n1 | awk '{print $3}')
unigram=$(sed -n 's/.*how often each byte occurs: \([0-9.]*\)$/\1/p' "$out")
[[ -n $first && -n $last && -n $unigram ]] || die "no validation losses or no unigram entropy"
[[ $(grep -c '^step [0-9]*: train loss' "$out") == 40 ]] || die "not 40 steps"
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 2) }' ||
    die "the validation loss fell from $first to $last only"
awk -v b="$last" -v u="$unigram" 'BEGIN { exit !(b < u) }' ||
    die "the validation loss $last is not below the unigram entropy $unigram"
grep -q '^generating:$' "$out" || die "no sample"
echo "train_gpt2: validation loss $first -> $last (unigram entropy $unigram)"
