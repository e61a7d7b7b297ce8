#!/usr/bin/env bash
# Ctrl-C and kill on the gpt2 example: SIGINT finishes the step in flight, writes the checkpoint,
# says "interrupted at step N; resume with --resume" and exits 130, and the resumed run prints
# exactly the losses of an uninterrupted one; SIGTERM exits 143 the same way; a second signal
# exits at once. The child runs through sigdefault, so its SIGINT is at the default disposition
# (a background job of this script would otherwise start with SIGINT ignored).
# linreg (no checkpoint) stops the same way.
# Usage: gpt2_signals.sh PATH_TO_GPT2 PATH_TO_SIGDEFAULT [PATH_TO_LINREG]
set -euo pipefail
gpt2="$1"
launch="$2"
linreg="${3:-}"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# 400 steps: on a fast CPU (Zen 5: about 1 ms a step) 40 were over before the signal came.
steps=400
args=(--devices cpu:2 --steps $steps --batch 8 --seq 32 --val-every 0 --sample 0 --layers 2
      --channels 64)
losses() { grep -E '^(step|final)' | sed 's/  (.*//'; }
die() { echo "gpt2_signals: $*" >&2; exit 1; }

# Starts gpt2 in the background with the given extra arguments, waits for step $wait_step and
# sends the signals named after "--", $gap seconds apart (a signal that arrives while the same
# one is still pending is merged into it); sets rc and leaves the output in $dir/out.
wait_step=3
gap=0
interrupt() {
    local extra=() sigs=()
    while [[ $1 != -- ]]; do extra+=("$1"); shift; done
    shift
    sigs=("$@")
    "$launch" "$gpt2" "${args[@]}" "${extra[@]}" > "$dir/out" 2>&1 &
    local pid=$!
    for _ in $(seq 600); do
        grep -q "^step $wait_step:" "$dir/out" && break
        kill -0 "$pid" 2> /dev/null || break
        sleep 0.01
    done
    for s in "${sigs[@]}"; do
        kill -s "$s" "$pid"
        sleep "$gap"
    done
    rc=0
    wait "$pid" || rc=$?
}

"$gpt2" "${args[@]}" | losses > "$dir/whole"

interrupt --checkpoint "$dir/state.mwc" -- INT
[[ $rc == 130 ]] || { cat "$dir/out" >&2; die "SIGINT: exit status $rc, expected 130"; }
line=$(grep -E '^interrupted at step [0-9]+; resume with --resume$' "$dir/out") \
    || { cat "$dir/out" >&2; die "SIGINT: no 'interrupted at step N; resume with --resume'"; }
n=${line#interrupted at step }
n=${n%%;*}
(( n >= 3 && n < steps )) || die "interrupted at step $n, outside 3..$((steps - 1))"
losses < "$dir/out" > "$dir/resumed"
[[ $(wc -l < "$dir/resumed") == "$n" ]] || die "SIGINT: $n steps done but not all printed"
"$gpt2" "${args[@]}" --checkpoint "$dir/state.mwc" --resume | losses >> "$dir/resumed"
diff "$dir/whole" "$dir/resumed" || die "the run resumed after SIGINT differs from the whole run"
ls -A "$dir" | grep -q '\.tmp' && die "a temporary checkpoint file was left behind"

interrupt --checkpoint "$dir/term.mwc" -- TERM
[[ $rc == 143 ]] || { cat "$dir/out" >&2; die "SIGTERM: exit status $rc, expected 143"; }
grep -qE '^interrupted at step [0-9]+; resume with --resume$' "$dir/out" \
    || die "SIGTERM: no 'interrupted at step N' line"
[[ -s "$dir/term.mwc" ]] || die "SIGTERM: no checkpoint written"

# Without --checkpoint nothing is saved, and it says so.
interrupt -- INT
[[ $rc == 130 ]] || die "SIGINT without --checkpoint: exit status $rc"
grep -qE '^interrupted at step [0-9]+ \(no --checkpoint' "$dir/out" || die "no notice of the loss"

# A second signal while the step is still running: out at once, no checkpoint written. Larger
# steps leave time between the two signals.
args=(--devices cpu:2 --steps 40 --batch 16 --seq 128 --val-every 0 --sample 0 --layers 4
      --channels 256)
wait_step=1
gap=0.02
interrupt --checkpoint "$dir/twice.mwc" -- INT INT
[[ $rc == 130 ]] || die "two SIGINTs: exit status $rc, expected 130"
grep -q '^interrupted at step' "$dir/out" && die "two SIGINTs: the program waited for the step"
[[ -e "$dir/twice.mwc" ]] && die "two SIGINTs: a checkpoint was written"
if [[ -n $linreg ]]; then
    "$launch" "$linreg" --devices cpu:2 --rows 20000 --steps 1000000 > "$dir/out" 2>&1 &
    pid=$!
    sleep 1
    kill -INT "$pid"
    rc=0
    wait "$pid" || rc=$?
    [[ $rc == 130 ]] || { cat "$dir/out" >&2; die "linreg: exit status $rc, expected 130"; }
    grep -qE '^interrupted at step [0-9]+ of the single-device run$' "$dir/out" \
        || { cat "$dir/out" >&2; die "linreg: no 'interrupted at step N'"; }
fi
echo "gpt2_signals: SIGINT at step $n resumed identically ($(wc -l < "$dir/whole") lines);" \
     "SIGTERM 143; a second signal exits at once"
