#!/usr/bin/env bash
# The classify example on the bundled wine data: good test accuracy with its defaults, the same
# predictions on one and on two devices (the batch sharded), weights saved and loaded back, and
# a clear error naming the line and column for each kind of bad CSV.
# Usage: classify.sh PATH_TO_CLASSIFY PATH_TO_WINE_CSV
set -euo pipefail
classify="$1"
wine="$2"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "classify.sh: $*" >&2; exit 1; }

"$classify" "$wine" --predictions "$dir/p1" --save "$dir/w.safetensors" > "$dir/out1"
"$classify" "$wine" --devices cpu:2 --predictions "$dir/p2" > "$dir/out2"
acc=$(sed -n 's/^test accuracy \([0-9.]*\) .*/\1/p' "$dir/out1")
[ -n "$acc" ] || { cat "$dir/out1" >&2; fail "no test accuracy line"; }
awk -v a="$acc" 'BEGIN { exit !(a >= 0.9) }' || fail "test accuracy $acc is below 0.9"
cmp -s "$dir/p1" "$dir/p2" || fail "the predictions on cpu:2 differ from those on cpu:1"
[ "$(wc -l < "$dir/p1")" -eq 36 ] || fail "expected 36 test predictions"
"$classify" "$wine" --load "$dir/w.safetensors" --steps 0 > "$dir/out3"
[ "$(grep '^test accuracy' "$dir/out1")" = "$(grep '^test accuracy' "$dir/out3")" ] ||
    fail "the loaded weights predict differently: $(grep '^test' "$dir/out3")"

# Bad CSVs: each refused (exit 2) with a message naming where.
check() { # name, contents, words expected in the message
    local name="$1" text="$2"
    shift 2
    printf '%b' "$text" > "$dir/$name.csv"
    if "$classify" "$dir/$name.csv" > "$dir/$name.out" 2>&1; then fail "$name: accepted"; fi
    for w in "$@"; do
        grep -qF -- "$w" "$dir/$name.out" || fail "$name: message lacks '$w': $(cat "$dir/$name.out")"
    done
}
check ragged 'a,b,c\n1,2,0\n3,4\n' "line 3 has 2 columns but line 1 has 3"
check text 'a,b,c\n1,2,0\n1,x,1\n' "line 3, column 2 ('b'): 'x' is not a number"
check label 'a,b,c\n1,2,0\n1,2,1.5\n' "line 3, column 3 ('c'): the label '1.5' is not an integer"
check empty '' "line 1: the file is empty"
check oneclass 'a,b,c\n1,2,7\n3,4,7\n' "column 3 ('c') has the one label 7" "lines 2-3"
check header 'a,b,c\n' "line 1 is a header and no data rows follow"
printf 'a,b,c\n1,2,0\n2,1,1\n' > "$dir/nolabel.csv"
if "$classify" "$dir/nolabel.csv" --label d > "$dir/nolabel.out" 2>&1; then fail "--label d: accepted"; fi
grep -qF "line 1: no column named 'd'" "$dir/nolabel.out" || fail "--label d: $(cat "$dir/nolabel.out")"
# Without a header the columns are numbered and the last is the label.
printf '1,2,0\n2,1,1\n0.5,3,0\n3,0.1,1\n1,1,0\n2,2,1\n' > "$dir/plain.csv"
"$classify" "$dir/plain.csv" --steps 20 --test-fraction 0.34 > "$dir/plain.out" ||
    fail "a CSV without header: $(cat "$dir/plain.out")"
grep -q "label 'column 3'" "$dir/plain.out" || fail "columns without a header: $(head -1 "$dir/plain.out")"
echo "classify.sh: test accuracy $acc, cpu:2 predictions identical, reload identical, 7 bad CSVs refused"
