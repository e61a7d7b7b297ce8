#!/usr/bin/env bash
# Ctrl-C reaching one process of an MPI job: every process stops after the same step (the stop
# is agreed at the step boundary), every process writes the checkpoint, the job ends, and
# resuming it prints exactly the losses of an uninterrupted run. The signal goes straight to rank 1's
# process, started through sigdefault so that SIGINT is at its default disposition.
# Usage: gpt2_mpi_signal.sh "MPIRUN ARGS..." PATH_TO_GPT2 PATH_TO_SIGDEFAULT
set -euo pipefail
read -r -a mpirun <<< "$1"
gpt2="$2"
launch="$3"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
args=(--devices cpu:1 --steps 40 --batch 8 --seq 32 --val-every 0 --sample 0 --layers 2
      --channels 64)
losses() { grep -E '^(step|final)' | sed 's/  (.*//'; }
die() { echo "gpt2_mpi_signal: $*" >&2; exit 1; }

"${mpirun[@]}" -n 2 "$gpt2" "${args[@]}" | losses > "$dir/whole"

# Rank 1 writes its pid where the test can find it, then becomes gpt2.
cat > "$dir/rank" << 'EOF2'
#!/bin/sh
[ "${OMPI_COMM_WORLD_RANK:-0}" = 1 ] && echo $$ > "$PIDFILE"
exec "$@"
EOF2
chmod +x "$dir/rank"
PIDFILE="$dir/pid" "${mpirun[@]}" -x PIDFILE -n 2 "$launch" "$dir/rank" "$gpt2" "${args[@]}" \
    --checkpoint "$dir/state.mwc" > "$dir/out" 2>&1 &
job=$!
for _ in $(seq 1200); do
    grep -q '^step 3:' "$dir/out" && [[ -s "$dir/pid" ]] && break
    kill -0 "$job" 2> /dev/null || break
    sleep 0.05
done
kill -INT "$(cat "$dir/pid")"
wait "$job" || true
line=$(grep -E '^interrupted at step [0-9]+; resume with --resume$' "$dir/out") \
    || { cat "$dir/out" >&2; die "rank 0 did not report the interruption"; }
n=${line#interrupted at step }
n=${n%%;*}
(( n >= 3 && n < 40 )) || die "interrupted at step $n, outside 3..39"
losses < "$dir/out" > "$dir/resumed"
"${mpirun[@]}" -n 2 "$gpt2" "${args[@]}" --checkpoint "$dir/state.mwc" --resume \
    | losses >> "$dir/resumed"
diff "$dir/whole" "$dir/resumed" || die "the resumed job differs from the uninterrupted one"
echo "gpt2_mpi_signal: SIGINT to rank 1 stopped both ranks after step $n; the resumed job matches"
