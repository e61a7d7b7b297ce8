#!/usr/bin/env bash
# FSDP across processes: an MPI job of 2 processes with every large parameter split over the data
# axis that crosses them (--shard-params) saves the llm.c file, byte for byte, that one process
# with 2 devices and replicated parameters saves, gradient clipping included (the norm is exact,
# the same bits however the gradient is split); with every block recomputed, with the gathered
# copies kept and with no gather started ahead too; with two devices in each process, prefetched
# gathers save what serial ones do; and a checkpoint of the FSDP job resumes as one
# uninterrupted run.
# Usage: gpt2_mpi_fsdp.sh "MPIRUN ARGS..." PATH_TO_GPT2
set -euo pipefail
read -r -a mpirun <<< "$1"
gpt2="$2"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
args=(--batch 8 --seq 16 --val-every 0 --sample 0 --layers 2 --channels 128 --grad-clip 0.05
    --steps 6)
die() { echo "gpt2_mpi_fsdp: $*" >&2; exit 1; }
losses() { grep -E '^(step|final)' | sed 's/  (.*//'; }

timeout 120 "$gpt2" --devices cpu:2 "${args[@]}" --save "$dir/one.bin" > "$dir/out" 2>&1 \
    || { cat "$dir/out" >&2; die "the one-process job failed"; }
timeout 120 "$gpt2" --devices cpu:2 "${args[@]}" --grad-clip 0 --save "$dir/unclipped.bin" \
    > "$dir/out" 2>&1 || { cat "$dir/out" >&2; die "the unclipped job failed"; }
if cmp -s "$dir/one.bin" "$dir/unclipped.bin"; then die "--grad-clip 0.05 clipped nothing"; fi
for extra in "" "--recompute blocks" "--keep-gathered" "--serial-gathers"; do
    # shellcheck disable=SC2086
    timeout 120 "${mpirun[@]}" -n 2 "$gpt2" --devices cpu:1 "${args[@]}" --shard-params $extra \
        --save "$dir/fsdp.bin" > "$dir/out" 2>&1 \
        || { cat "$dir/out" >&2; die "the FSDP job ($extra) failed"; }
    grep -q 'memory per device: parameters' "$dir/out" || die "no memory line"
    cmp "$dir/one.bin" "$dir/fsdp.bin" \
        || die "FSDP across 2 processes ($extra) saved another model than 2 devices replicated"
done

# Two devices in each process: gathers prefetched (the default) through the leaders' exchange
# and the local copies save the model that gathers run where used save.
for extra in "" "--serial-gathers"; do
    # shellcheck disable=SC2086
    timeout 120 "${mpirun[@]}" -n 2 "$gpt2" --devices cpu:2 --mesh X=4 "${args[@]}" --shard-params \
        $extra --save "$dir/fsdp4$extra.bin" > "$dir/out" 2>&1 \
        || { cat "$dir/out" >&2; die "the FSDP job on 2 x 2 devices ($extra) failed"; }
done
cmp "$dir/fsdp4.bin" "$dir/fsdp4--serial-gathers.bin" \
    || die "FSDP on 2 x 2 devices saved another model with its gathers prefetched"

# A checkpoint written every 2 steps by the FSDP job, stopped at 4 and resumed.
run() { timeout 120 "${mpirun[@]}" -n 2 "$gpt2" --devices cpu:1 "${args[@]}" --shard-params "$@"; }
run | losses > "$dir/whole"
run --checkpoint "$dir/a.mwc" --checkpoint-every 2 --stop-at 4 > "$dir/out" 2>&1 \
    || { cat "$dir/out" >&2; die "the checkpointing job failed"; }
losses < "$dir/out" | grep -v '^final' > "$dir/resumed"
run --checkpoint "$dir/a.mwc" --resume > "$dir/out" 2>&1 \
    || { cat "$dir/out" >&2; die "the resumed job failed"; }
losses < "$dir/out" >> "$dir/resumed"
diff "$dir/whole" "$dir/resumed" || die "the resumed FSDP job differs from the uninterrupted one"
echo "gpt2_mpi_fsdp: FSDP across 2 processes saves 2 devices' replicated model and resumes"
