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
# Nothing silently dropped or turned into inf.
check nul 'a,b,c\n1,2,0\n3,4\0,1\n5,6,1\n' "line 3, byte 4: a NUL byte"
check huge 'a,b,c\n1,2,0\n1e39,4,1\n' "line 3, column 1 ('a'): '1e39' is beyond float's range"
check wide 'a,b,c\n1,2,0\n1,4,1099511627776\n' "the label '1099511627776' is outside the 32-bit integers"
check pandas '0,1,2\n1,2,0\n3,4,1\n' "line 1 reads 0,1,...,2" "--header yes or --header no"
printf '0,1,2\n1,2,0\n3,4,1\n1,1,0\n4,4,1\n' > "$dir/pandas2.csv"
"$classify" "$dir/pandas2.csv" --header yes --steps 2 --test-fraction 0.25 > "$dir/p.out" ||
    fail "--header yes: $(cat "$dir/p.out")"
grep -q "4 rows" "$dir/p.out" || fail "--header yes: $(head -1 "$dir/p.out")"
# A byte-order mark on a file without a header: every row is data.
printf '\xef\xbb\xbf1,2,0\n2,1,1\n0.5,3,0\n3,0.1,1\n1,1,0\n2,2,1\n' > "$dir/bom.csv"
"$classify" "$dir/bom.csv" --steps 2 --test-fraction 0.34 > "$dir/bom.out" ||
    fail "a CSV with a BOM: $(cat "$dir/bom.out")"
grep -q "6 rows" "$dir/bom.out" || fail "the BOM lost a row: $(head -1 "$dir/bom.out")"
# A loaded model predicts its own classes: a CSV of other labels is refused, naming them.
sed 's/,\([0-9]\)$/,1\1/' "$wine" > "$dir/relabelled.csv"
if "$classify" "$dir/relabelled.csv" --load "$dir/w.safetensors" --steps 0 > "$dir/rl.out" 2>&1; then
    fail "labels the model never saw: accepted"
fi
grep -q "is not one of the model's classes (0, 1, 2)" "$dir/rl.out" || fail "relabelled: $(cat "$dir/rl.out")"
# Outputs: checked before training, never an input, never a FIFO or device.
for bad in "$dir/missing/p.txt" /dev/null "$wine"; do
    if "$classify" "$wine" --predictions "$bad" > "$dir/o.out" 2>&1; then fail "--predictions $bad: accepted"; fi
    grep -q '^step' "$dir/o.out" && fail "--predictions $bad: refused only after training"
    grep -qE "cannot be written|is a character device|would destroy an input" "$dir/o.out" ||
        fail "--predictions $bad: $(cat "$dir/o.out")"
done
mkdir "$dir/full"
if [ "$(id -u)" = 0 ] && mount -t tmpfs -o size=64k tmpfs "$dir/full" 2>/dev/null; then
    head -c 60000 /dev/zero > "$dir/full/filler" 2>/dev/null || true
    head -c 8192 /dev/zero > "$dir/full/more" 2>/dev/null || true
    rc=0
    "$classify" "$wine" --predictions "$dir/full/p.txt" > "$dir/full.out" 2>&1 || rc=$?
    umount "$dir/full"
    # The predictions' size is known once the CSV is read: refused then, before training.
    [ "$rc" = 2 ] || fail "--predictions on a full disk: rc $rc, expected 2"
    grep -q '^step' "$dir/full.out" && fail "full disk: refused only after training"
    grep -qE -- "--predictions .*p.txt needs [0-9]+ bytes, and .*full has [0-9]+ bytes free" \
        "$dir/full.out" || fail "full disk: $(cat "$dir/full.out")"
else
    echo "classify.sh: no tmpfs mount here (the full-disk case skipped)"
fi
# Without a header the columns are numbered and the last is the label.
printf '1,2,0\n2,1,1\n0.5,3,0\n3,0.1,1\n1,1,0\n2,2,1\n' > "$dir/plain.csv"
"$classify" "$dir/plain.csv" --steps 20 --test-fraction 0.34 > "$dir/plain.out" ||
    fail "a CSV without header: $(cat "$dir/plain.out")"
grep -q "label 'column 3'" "$dir/plain.out" || fail "columns without a header: $(head -1 "$dir/plain.out")"
echo "classify.sh: test accuracy $acc, cpu:2 predictions identical, reload identical, 11 bad CSVs and 4 bad outputs refused"
