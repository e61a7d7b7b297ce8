#!/usr/bin/env bash
# Ctrl-C reaching one process of an MPI job: every process stops after the same step (the stop
# is agreed at the step boundary), every process writes the checkpoint, the job ends, and
# resuming it prints exactly the losses of an uninterrupted run. The signal goes straight to rank 1's
# process, started through sigdefault so that SIGINT is at its default disposition.
# Then Ctrl-C to mpirun itself, as a terminal sends it: Open MPI 4's mpirun sends the processes
# SIGCONT, SIGTERM odls_base_sigkill_timeout seconds later (default 1) and SIGKILL as long after
# that, and exits 1; the processes stop on the SIGTERM, within that time here, and the job
# resumes from the step they stopped at. A step and a save that take longer than that time are said at the first
# checkpoint (the note naming the flag), here forced with a time of 0.
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

# SIGINT to mpirun, with its default delay of 1 s before the SIGTERM (the steps go on meanwhile,
# so the job is long enough not to end first); the checkpoint holds the step it stopped at.
long=("${args[@]/#40/5000}")
[[ ${long[3]} == 5000 ]] || die "cannot make the longer job's flags"
rm -f "$dir/state.mwc"
"$launch" "${mpirun[@]}" -n 2 "$gpt2" "${long[@]}" --checkpoint "$dir/state.mwc" \
    > "$dir/out2" 2>&1 &
job=$!
for _ in $(seq 1200); do
    grep -q '^step 3:' "$dir/out2" && break
    kill -0 "$job" 2> /dev/null || break
    sleep 0.05
done
kill -INT "$job"
rc=0
wait "$job" || rc=$?
[[ $rc != 0 ]] || die "mpirun exited 0 after SIGINT"
# Rank 0 prints the step it stopped at; mpirun, tearing the job down, may no longer forward that
# line (Open MPI 4.1 stops its output forwarding at the signal, racing the processes' last
# writes): then the checkpoint says where the job stopped (it must hold a step, written on the
# SIGTERM, not be missing).
if line=$(grep -E '^interrupted at step [0-9]+; resume with --resume$' "$dir/out2"); then
    m=${line#interrupted at step }
    m=${m%%;*}
else
    [[ -s "$dir/state.mwc" ]] ||
        { cat "$dir/out2" >&2; die "SIGINT to mpirun: no 'interrupted at step N' line, no checkpoint"; }
    "$gpt2" "${long[@]}" --checkpoint "$dir/state.mwc" --resume --eval-only > "$dir/at" 2>&1 ||
        { cat "$dir/at" >&2; die "SIGINT to mpirun: the checkpoint cannot be read"; }
    m=$(sed -n 's/^resumed .* at step \([0-9]*\)$/\1/p' "$dir/at")
    [[ -n $m ]] || { cat "$dir/at" >&2; die "SIGINT to mpirun: no step in the checkpoint"; }
fi
(( m >= 3 && m < 5000 )) || die "SIGINT to mpirun: interrupted at step $m, outside 3..4999"
"${mpirun[@]}" -n 2 "$gpt2" "${long[@]}" --checkpoint "$dir/state.mwc" --resume \
    --steps $((m + 1)) --allow-change steps > "$dir/out4" 2>&1 || { cat "$dir/out4" >&2; die "resume"; }
grep -q "^resumed .* at step $m\$" "$dir/out4" || { cat "$dir/out4" >&2; die "not resumed at $m"; }
grep -q "^step $((m + 1)):" "$dir/out4" || die "the resumed job did not step"
grep -q '^note: under mpirun' "$dir/out2" && die "the note was printed for a fast step"

# No time at all between SIGTERM and SIGKILL: said at the first checkpoint, with the flag.
OMPI_MCA_odls_base_sigkill_timeout=0 "${mpirun[@]}" -n 2 "$gpt2" "${args[@]}" --steps 4 \
    --checkpoint "$dir/note.mwc" --checkpoint-every 2 > "$dir/out3" 2>&1 ||
    { cat "$dir/out3" >&2; die "the job with a delay of 0 failed"; }
grep -q '^note: under mpirun, Ctrl-C leaves each process 0 s .* --mca odls_base_sigkill_timeout [0-9]' \
    "$dir/out3" || { cat "$dir/out3" >&2; die "no note of the delay"; }
echo "gpt2_mpi_signal: SIGINT to rank 1 stopped both ranks after step $n, SIGINT to mpirun" \
    "after step $m (exit $rc); the resumed jobs match and continue"
