#!/usr/bin/env bash
# A pipeline across processes: an MPI job of 2 processes with the pipeline axis crossing them
# (each stage inside one process, the values between stages and their gradients sent from one
# process to the other) saves the model, byte for byte, that gradient accumulation over the same
# micro-batches saves in one process, with the same losses and validation losses: GPipe, 1F1B and
# zero-bubble on P=2 (the tied token embedding's copy in the other process), P=4 with two stages
# in each process, interleaved with 2 virtual stages in each process, X=2,P=2 (two data-parallel
# devices in each stage; also with FSDP and with ZeRO-1 over them) against cpu:2, and bf16 with
# recomputed blocks against bf16 accumulation; a llama in stages saves the same safetensors;
# checkpoints cross layouts (the job's resumed in one process, and one process's resumed by the
# job, end with the uninterrupted run's model, the replicas checked after the load); sampling
# reads the model from both processes; and a mesh whose stages would span processes is refused
# naming the fix.
# (--grad-clip 0: clipping uses the stages' combined norm, equal to float rounding, not in bytes.)
# Usage: gpt2_mpi_pipeline.sh "MPIRUN ARGS..." PATH_TO_GPT2 PATH_TO_LLAMA
set -euo pipefail
read -r -a mpirun <<< "$1"
gpt2="$2" llama="$3"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
die() { echo "gpt2_mpi_pipeline: $*" >&2; exit 1; }
args=(--steps 3 --batch 8 --seq 32 --val-every 3 --val-batches 2 --sample 0 --layers 4
      --channels 64 --heads 4 --micro-batches 4 --grad-clip 0)
run() { # NAME OUT, then the flags (the first "job" to run under mpirun -n 2): NAME.log
    local name="$1" out="$2" launch=()
    shift 2
    if [ "$1" = job ]; then
        launch=(timeout 120 "${mpirun[@]}" -n 2)
        shift
    fi
    "${launch[@]}" "$gpt2" "${args[@]}" "$@" --save "$out" > "$dir/$name.log" 2>&1 ||
        { cat "$dir/$name.log" >&2; die "$name failed: $*"; }
}
losses() { grep -E '^(step [0-9]+: loss|val loss)' "$1" | awk '{ print $1, $2, $3, $4 }'; }
same() { # REFERENCE_LOG REFERENCE_MODEL NAME
    cmp -s "$2" "$dir/$3.bin" || die "$3: the saved model is not the accumulation's bytes"
    diff <(losses "$1") <(losses "$dir/$3.log") > /dev/null ||
        die "$3: the losses differ from the accumulation's"
}
run ref "$dir/ref.bin" --devices cpu:1
for s in gpipe 1f1b zero-bubble; do
    run "$s" "$dir/$s.bin" job --devices cpu:1 --mesh P=2 --pipeline-axis P --pipeline-schedule "$s"
    same "$dir/ref.log" "$dir/ref.bin" "$s"
done
grep -q 'Mesh(P -> 2) over rank0/cpu:0, rank1/cpu:0' "$dir/gpipe.log" || die "not across processes"
run p4 "$dir/p4.bin" job --devices cpu:2 --mesh P=4 --pipeline-axis P --pipeline-schedule 1f1b
same "$dir/ref.log" "$dir/ref.bin" p4
run il "$dir/il.bin" job --devices cpu:1 --mesh P=2 --pipeline-axis P \
    --pipeline-schedule interleaved --virtual-stages 2
same "$dir/ref.log" "$dir/ref.bin" il
run ref2 "$dir/ref2.bin" --devices cpu:2
run px "$dir/px.bin" job --devices cpu:2 --mesh P=2,X=2 --pipeline-axis P
same "$dir/ref2.log" "$dir/ref2.bin" px
# Inside each stage: FSDP (zero-bubble), ZeRO-1; and bf16 with recomputed blocks.
run fsdp "$dir/fsdp.bin" job --devices cpu:2 --mesh P=2,X=2 --pipeline-axis P --shard-params \
    --pipeline-schedule zero-bubble
same "$dir/ref2.log" "$dir/ref2.bin" fsdp
run zero1 "$dir/zero1.bin" job --devices cpu:2 --mesh P=2,X=2 --pipeline-axis P --shard-optimizer
same "$dir/ref2.log" "$dir/ref2.bin" zero1
run refb "$dir/refb.bin" --devices cpu:1 --precision bf16 --recompute blocks
run pb "$dir/pb.bin" job --devices cpu:1 --mesh P=2 --pipeline-axis P --precision bf16 \
    --recompute blocks
same "$dir/refb.log" "$dir/refb.bin" pb

# Checkpoints cross layouts.
"${mpirun[@]}" -n 2 "$gpt2" "${args[@]}" --devices cpu:1 --mesh P=2 --pipeline-axis P \
    --checkpoint "$dir/p.ckpt" --stop-at 2 > "$dir/stop.log" 2>&1 ||
    { cat "$dir/stop.log" >&2; die "stopping the job"; }
run resumed1 "$dir/resumed1.bin" --devices cpu:1 --checkpoint "$dir/p.ckpt" --resume
cmp -s "$dir/ref.bin" "$dir/resumed1.bin" ||
    die "the job's checkpoint resumed in one process: not the uninterrupted run's model"
"$gpt2" "${args[@]}" --devices cpu:1 --checkpoint "$dir/o.ckpt" --stop-at 2 > "$dir/stop.log" \
    2>&1 || { cat "$dir/stop.log" >&2; die "stopping on cpu:1"; }
run resumedp "$dir/resumedp.bin" job --devices cpu:1 --mesh P=2 --pipeline-axis P \
    --pipeline-schedule zero-bubble --checkpoint "$dir/o.ckpt" --resume
cmp -s "$dir/ref.bin" "$dir/resumedp.bin" ||
    die "one process's checkpoint resumed by the job: not the uninterrupted run's model"

# Sampling: the text one process samples from the same model.
sample() { sed -n '/^sample (/,/^sampled/p' "$1" | grep -av '^sampled'; }
"${mpirun[@]}" -n 2 "$gpt2" "${args[@]}" --devices cpu:1 --mesh P=2 --pipeline-axis P \
    --sample 24 --prompt "1+" > "$dir/sp.log" 2>&1 || { cat "$dir/sp.log" >&2; die "sampling"; }
"$gpt2" "${args[@]}" --devices cpu:1 --sample 24 --prompt "1+" > "$dir/s1.log" 2>&1 ||
    { cat "$dir/s1.log" >&2; die "sampling in one process"; }
[ -n "$(sample "$dir/s1.log")" ] || die "no sample"
diff <(sample "$dir/s1.log") <(sample "$dir/sp.log") || die "the job sampled another text"

# llama: the same safetensors.
mkdir -p "$dir/l1" "$dir/lp"
largs=(--steps 2 --batch 8 --seq 32 --val-every 2 --val-batches 2 --sample 0 --layers 4
       --micro-batches 4 --grad-clip 0)
"$llama" "${largs[@]}" --devices cpu:1 --save "$dir/l1/model.safetensors" > "$dir/l1.log" 2>&1 ||
    { cat "$dir/l1.log" >&2; die "llama on cpu:1 failed"; }
"${mpirun[@]}" -n 2 "$llama" "${largs[@]}" --devices cpu:1 --mesh P=2 --pipeline-axis P \
    --save "$dir/lp/model.safetensors" > "$dir/lp.log" 2>&1 ||
    { cat "$dir/lp.log" >&2; die "llama in stages across processes failed"; }
cmp -s "$dir/l1/model.safetensors" "$dir/lp/model.safetensors" ||
    die "llama: the job's safetensors are not the accumulation's"

# A stage spanning the processes is refused, naming the fix.
if "${mpirun[@]}" -n 2 "$gpt2" "${args[@]}" --devices cpu:2 --mesh X=2,P=2 --pipeline-axis P \
    > "$dir/bad.log" 2>&1; then
    die "a stage spanning the processes was accepted"
fi
grep -q "a stage runs in one process" "$dir/bad.log" || { cat "$dir/bad.log" >&2; die "no fix named"; }
echo "gpt2_mpi_pipeline: pipelines across 2 processes save the accumulation's models"
