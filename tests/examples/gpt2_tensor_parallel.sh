#!/usr/bin/env bash
# gpt2 with --mesh X=2,Y=2 --model-axis Y (data x tensor parallel on cpu:4): every step's loss
# agrees with one device to the printed precision (4 decimals; within 1.5e-4, since a value near
# a rounding boundary may print either way); with --shard-optimizer the saved model is
# byte-identical to the run without it; a checkpoint written on the 2 x 2 mesh resumes on one
# device; the parameters per device printed at start are smaller than on one device.
# Usage: gpt2_tensor_parallel.sh PATH_TO_GPT2
set -euo pipefail
gpt2="$1"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
args=(--steps 6 --batch 8 --seq 32 --val-every 0 --sample 0 --layers 2 --channels 64 --heads 4)
tp=(--devices cpu:4 --mesh X=2,Y=2 --model-axis Y)
"$gpt2" "${args[@]}" --devices cpu:1 --save "$dir/one.bin" > "$dir/one.log"
"$gpt2" "${args[@]}" "${tp[@]}" --save "$dir/tp.bin" > "$dir/tp.log"
"$gpt2" "${args[@]}" "${tp[@]}" --shard-optimizer --save "$dir/tpz.bin" > "$dir/tpz.log"
losses() { sed -n 's/^step \([0-9]*\): loss \([0-9.]*\).*/\1 \2/p' "$1"; }
# agree A B: the same steps, and losses within 1.5e-4.
agree() {
    paste <(losses "$1") <(losses "$2") |
        awk 'NF != 4 || $1 != $3 || ($2 - $4) > 1.5e-4 || ($4 - $2) > 1.5e-4 { bad = 1 }
             END { exit bad || NR == 0 }'
}
if ! agree "$dir/one.log" "$dir/tp.log"; then
    echo "gpt2_tensor_parallel: losses differ from one device:" >&2
    paste <(losses "$dir/one.log") <(losses "$dir/tp.log") >&2
    exit 1
fi
[ "$(losses "$dir/one.log" | wc -l)" -eq 6 ] || { echo "gpt2_tensor_parallel: no losses" >&2; exit 1; }
cmp "$dir/tp.bin" "$dir/tpz.bin" ||
    { echo "gpt2_tensor_parallel: ZeRO-1 on the 2 x 2 mesh trained another model" >&2; exit 1; }
# Interrupted on the 2 x 2 mesh, resumed on one device.
"$gpt2" "${args[@]}" "${tp[@]}" --checkpoint "$dir/state.mwc" --stop-at 3 > /dev/null
"$gpt2" "${args[@]}" --devices cpu:1 --checkpoint "$dir/state.mwc" --resume > "$dir/resumed.log"
losses "$dir/one.log" | tail -n 3 | sed 's/^/step /; s/ \([0-9.]*\)$/: loss \1/' > "$dir/tail.log"
if ! agree "$dir/tail.log" "$dir/resumed.log"; then
    echo "gpt2_tensor_parallel: resumed on one device, the losses differ:" >&2
    paste <(losses "$dir/one.log" | tail -n 3) <(losses "$dir/resumed.log") >&2
    exit 1
fi
params_mb() { sed -n 's/^memory per device: parameters \([0-9.]*\) MB.*/\1/p' "$1"; }
one=$(params_mb "$dir/one.log")
split=$(params_mb "$dir/tp.log")
if ! awk -v o="$one" -v s="$split" 'BEGIN { exit !(o > 0 && s > 0 && s < o) }'; then
    echo "gpt2_tensor_parallel: parameters per device $split MB split, $one MB on one device" >&2
    exit 1
fi
echo "gpt2_tensor_parallel: losses as on one device, ZeRO-1 identical, resumed across meshes;" \
     "parameters per device $one MB -> $split MB"
