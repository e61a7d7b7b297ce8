#!/usr/bin/env bash
# Checkpoints of an MPI job, replicated and with ZeRO-1 (--shard-optimizer: the save gathers the
# other process's moments, so every process must take part): a job that saves every 2 steps and
# stops at step 4, resumed to step 8, prints exactly the losses of an uninterrupted job, and so
# does one that saves only at its end and is then continued.
# Usage: gpt2_mpi_checkpoint.sh "MPIRUN ARGS..." PATH_TO_GPT2 [EXTRA GPT2 FLAGS...]
set -euo pipefail
read -r -a mpirun <<< "$1"
gpt2="$2"
shift 2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
args=(--devices cpu:1 --batch 8 --seq 16 --val-every 0 --sample 0 --layers 1 --channels 32 "$@")
losses() { grep -E '^(step|final)' | sed 's/  (.*//'; }
die() { echo "gpt2_mpi_checkpoint: $*" >&2; exit 1; }
run() { timeout 120 "${mpirun[@]}" -n 2 "$gpt2" "${args[@]}" "$@"; }

run --steps 8 | losses > "$dir/whole"

# Every 2 steps, stopped at step 4, resumed.
run --steps 8 --checkpoint "$dir/a.mwc" --checkpoint-every 2 --stop-at 4 > "$dir/out" 2>&1 \
    || { cat "$dir/out" >&2; die "the checkpointing job failed"; }
[ -s "$dir/a.mwc" ] || die "no checkpoint written"
losses < "$dir/out" | grep -v '^final' > "$dir/resumed"
run --steps 8 --checkpoint "$dir/a.mwc" --resume > "$dir/out" 2>&1 \
    || { cat "$dir/out" >&2; die "the resumed job failed"; }
grep -q '^resumed .* at step 4$' "$dir/out" || { cat "$dir/out" >&2; die "did not resume at 4"; }
losses < "$dir/out" >> "$dir/resumed"
diff "$dir/whole" "$dir/resumed" || die "the resumed job differs from the uninterrupted one"

# Only the final save (--checkpoint-every beyond --steps), then continued to step 8: another
# --steps is refused, naming it, unless allowed (the 8 steps stay within the warm-up, so the
# schedule is the same).
run --steps 5 --checkpoint "$dir/b.mwc" --checkpoint-every 100 > "$dir/out" 2>&1 \
    || { cat "$dir/out" >&2; die "the job saving at its end failed"; }
losses < "$dir/out" | grep -v '^final' > "$dir/continued"
if run --steps 8 --checkpoint "$dir/b.mwc" --resume > "$dir/out" 2>&1; then
    die "a resume with another --steps was accepted"
fi
grep -q 'steps: 5 in the checkpoint, 8 now' "$dir/out" || { cat "$dir/out" >&2; die "no steps named"; }
run --steps 8 --checkpoint "$dir/b.mwc" --resume --allow-change steps > "$dir/out" 2>&1 \
    || { cat "$dir/out" >&2; die "the continued job failed"; }
losses < "$dir/out" >> "$dir/continued"
diff "$dir/whole" "$dir/continued" || die "the continued job differs from the uninterrupted one"
echo "gpt2_mpi_checkpoint: saved, resumed and continued as one uninterrupted job ($*)"
