#!/usr/bin/env bash
# gpt2 and llama --pipeline-axis (the model's blocks in stages along a mesh axis, the
# --micro-batches of each step flowing between them) against gradient accumulation over the same
# micro-batches: every schedule saves the same model, byte for byte (GPipe, 1F1B and zero-bubble
# on cpu:4 as P=4, interleaved on cpu:2 as P=2 with 2 virtual stages, and X=2,P=2 against
# cpu:2), with the same losses and validation losses; a llama in stages saves the same
# safetensors; the memory line is printed per device; sampling reads the model from its stages;
# checkpoints cross layouts (a pipeline's resumed on one device, and the other way round, end
# with the uninterrupted run's model); and the flags that need a pipeline, or that it does not
# take, are refused naming the fix.
# (--grad-clip 0: clipping uses the stages' combined norm, equal to float rounding, not in bytes.)
# Usage: gpt2_pipeline.sh PATH_TO_GPT2 PATH_TO_LLAMA
set -euo pipefail
gpt2="$1" llama="$2"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
die() { echo "gpt2_pipeline: $*" >&2; exit 1; }
args=(--steps 3 --batch 8 --seq 32 --val-every 3 --val-batches 2 --sample 0 --layers 4
      --channels 64 --heads 4 --micro-batches 4 --grad-clip 0)
run() { # PROGRAM NAME OUT, then the flags: NAME.log
    local prog="$1" name="$2" out="$3"
    shift 3
    "$prog" "${args[@]}" "$@" --save "$out" > "$dir/$name.log" 2>&1 ||
        { cat "$dir/$name.log" >&2; die "$name failed: $*"; }
}
losses() { grep -E '^(step [0-9]+: loss|val loss)' "$1" | awk '{ print $1, $2, $3, $4 }'; }
same() { # REFERENCE NAME OUT
    cmp -s "$1" "$3" || die "$2: the saved model is not the accumulation's bytes"
    diff <(losses "$dir/ref.log") <(losses "$dir/$2.log") > /dev/null ||
        die "$2: the losses differ from the accumulation's"
}
run "$gpt2" ref "$dir/ref.bin" --devices cpu:1
cp "$dir/ref.log" "$dir/ref1.log"
for s in gpipe 1f1b zero-bubble; do
    run "$gpt2" "$s" "$dir/$s.bin" --devices cpu:4 --mesh P=4 --pipeline-axis P \
        --pipeline-schedule "$s"
    same "$dir/ref.bin" "$s" "$dir/$s.bin"
done
grep -q '^memory of device 3: parameters' "$dir/1f1b.log" || die "no memory line per device"
run "$gpt2" interleaved "$dir/il.bin" --devices cpu:2 --mesh P=2 --pipeline-axis P \
    --pipeline-schedule interleaved --virtual-stages 2
same "$dir/ref.bin" interleaved "$dir/il.bin"
run "$gpt2" ref2 "$dir/ref2.bin" --devices cpu:2
cp "$dir/ref2.log" "$dir/ref.log"
run "$gpt2" xp "$dir/xp.bin" --devices cpu:4 --mesh X=2,P=2 --pipeline-axis P
same "$dir/ref2.bin" xp "$dir/xp.bin"
# Checkpoints cross layouts: a pipeline's, resumed on one device, and one device's, resumed as
# a pipeline, both end with the uninterrupted run's model.
cp "$dir/ref1.log" "$dir/ref.log"
"$gpt2" "${args[@]}" --devices cpu:4 --mesh P=4 --pipeline-axis P --checkpoint "$dir/p.ckpt" \
    --stop-at 2 > "$dir/stop.log" 2>&1 || { cat "$dir/stop.log" >&2; die "stopping a pipeline"; }
run "$gpt2" resumed1 "$dir/resumed1.bin" --devices cpu:1 --checkpoint "$dir/p.ckpt" --resume
cmp -s "$dir/ref.bin" "$dir/resumed1.bin" ||
    die "a pipeline's checkpoint resumed on cpu:1: not the uninterrupted run's model"
"$gpt2" "${args[@]}" --devices cpu:1 --checkpoint "$dir/o.ckpt" --stop-at 2 > "$dir/stop.log" \
    2>&1 || { cat "$dir/stop.log" >&2; die "stopping on cpu:1"; }
run "$gpt2" resumedp "$dir/resumedp.bin" --devices cpu:4 --mesh P=4 --pipeline-axis P \
    --pipeline-schedule zero-bubble --checkpoint "$dir/o.ckpt" --resume
cmp -s "$dir/ref.bin" "$dir/resumedp.bin" ||
    die "cpu:1's checkpoint resumed by a pipeline: not the uninterrupted run's model"
# llama: the same safetensors.
mkdir -p "$dir/l1" "$dir/lp"
"$llama" --steps 2 --batch 8 --seq 32 --val-every 2 --val-batches 2 --sample 0 --layers 4 \
    --micro-batches 4 --grad-clip 0 --devices cpu:1 --save "$dir/l1/model.safetensors" \
    > "$dir/l1.log" 2>&1 || { cat "$dir/l1.log" >&2; die "llama on cpu:1 failed"; }
"$llama" --steps 2 --batch 8 --seq 32 --val-every 2 --val-batches 2 --sample 0 --layers 4 \
    --micro-batches 4 --grad-clip 0 --devices cpu:2 --mesh P=2 --pipeline-axis P \
    --pipeline-schedule zero-bubble --save "$dir/lp/model.safetensors" > "$dir/lp.log" 2>&1 ||
    { cat "$dir/lp.log" >&2; die "llama in stages failed"; }
cmp -s "$dir/l1/model.safetensors" "$dir/lp/model.safetensors" ||
    die "llama: the stages' safetensors are not the accumulation's"
# Sampling from a pipeline's model.
"$gpt2" "${args[@]}" --devices cpu:2 --mesh P=2 --pipeline-axis P --sample 8 --prompt "1+" \
    > "$dir/sample.log" 2>&1 || { cat "$dir/sample.log" >&2; die "sampling failed"; }
grep -q '^sampled 8 tokens' "$dir/sample.log" || die "no sample"
# Refusals, each exit 2 with the fix.
refused() { # WHAT, then the flags
    local what="$1"
    shift
    if "$gpt2" "${args[@]}" "$@" > "$dir/bad.log" 2>&1; then die "accepted: $*"; fi
    grep -q -- "$what" "$dir/bad.log" || { cat "$dir/bad.log" >&2; die "no '$what' for: $*"; }
}
refused "needs --pipeline-axis" --devices cpu:2 --pipeline-schedule gpipe
refused "not an axis of the mesh" --devices cpu:2 --mesh X=2 --pipeline-axis P
refused "4 regions but the pipeline has 8 stages" --devices cpu:4 --mesh P=4 --pipeline-axis P \
    --pipeline-schedule interleaved
echo "gpt2_pipeline: every schedule saves the accumulation's bytes"
