#!/usr/bin/env bash
# gpt2 with --shard-optimizer (ZeRO-1) on cpu:3: the saved model is byte-identical to the
# replicated run's, also when a ZeRO-1 run is interrupted and resumed without the flag (and the
# reverse), and when the three devices share the main thread (--cpu-threads 1), and the
# optimizer state per device printed at start is a third of the replicated one.
# Usage: gpt2_shard_optimizer.sh PATH_TO_GPT2
set -euo pipefail
gpt2="$1"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
args=(--devices cpu:3 --steps 10 --batch 6 --seq 32 --val-every 0 --sample 0 --layers 2
      --channels 64)
"$gpt2" "${args[@]}" --save "$dir/replicated.bin" > "$dir/replicated.log"
"$gpt2" "${args[@]}" --shard-optimizer --save "$dir/zero1.bin" > "$dir/zero1.log"
cmp "$dir/replicated.bin" "$dir/zero1.bin" ||
    { echo "gpt2_shard_optimizer: ZeRO-1 trained another model" >&2; exit 1; }
"$gpt2" "${args[@]}" --shard-optimizer --cpu-threads 1 --save "$dir/one.bin" > /dev/null
cmp "$dir/replicated.bin" "$dir/one.bin" ||
    { echo "gpt2_shard_optimizer: ZeRO-1 on one thread trained another model" >&2; exit 1; }
for first in --shard-optimizer ""; do
    rm -f "$dir/state.mwc"
    "$gpt2" "${args[@]}" $first --checkpoint "$dir/state.mwc" --stop-at 4 > /dev/null
    then=--shard-optimizer
    [ -z "$first" ] || then=""
    "$gpt2" "${args[@]}" $then --checkpoint "$dir/state.mwc" --resume --save "$dir/resumed.bin" \
        > /dev/null
    if ! cmp "$dir/replicated.bin" "$dir/resumed.bin"; then
        echo "gpt2_shard_optimizer: resumed across modes (${first:-replicated} first): differs" >&2
        exit 1
    fi
done
optimizer_mb() { sed -n 's/^memory per device: .*optimizer state \([0-9.]*\) MB.*/\1/p' "$1"; }
rep=$(optimizer_mb "$dir/replicated.log")
z=$(optimizer_mb "$dir/zero1.log")
if ! awk -v r="$rep" -v z="$z" 'BEGIN { exit !(r > 0 && z > 0 && z * 3 <= r * 1.01) }'; then
    echo "gpt2_shard_optimizer: optimizer state $z MB with ZeRO-1, $rep MB replicated" >&2
    exit 1
fi
echo "gpt2_shard_optimizer: models identical in both modes, on one thread and across resumes;" \
     "optimizer state per device $rep MB -> $z MB"
