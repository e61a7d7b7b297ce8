#!/usr/bin/env bash
# Hostile paths given to every program: one table of cases, run against each program's inputs
# and outputs. A program is covered by adding its row (below); a case by adding it to the list.
#
# Each refusal case runs the program once (under a time limit: nothing may block) and asserts
# the exit status the README documents for it (every program exits 2 for a file refused before
# the work, which is where every case below is refused, the full disk included, since every
# program gives its outputs' sizes), a message naming what is wrong, that the program refused
# before doing its work, and that every file of the case's folder (the inputs, an output that
# was there, the FIFO, the device node, the folders) is as it was: the same kind, mode, owner
# and bytes, and no file added (no temporary file left). A working run of each row checks the
# row itself.
#
#   output cases, for each output flag:    = an input (by its path, by dir/./name, through a
#                                           symbolic link, through a hard link; each input),
#                                           = another output, a FIFO, a device node, a folder,
#                                           in a missing folder, in a read-only folder, on a
#                                           full tmpfs, an empty name, a name longer than a
#                                           file name may be, an existing read-only file; as
#                                           another user (root's files, run as nobody): a file
#                                           that user may not write, a file of root's in a
#                                           sticky folder
#   input cases, for each input:           a FIFO (no writer), /dev/zero
# and, for the tokenizer folder (gpt2, gpt2-tokenize): a FIFO as vocab.json in it, and an
# output naming its vocab.json.
#
# Working cases, which must exit 0, write their outputs and leave every input as it was: each
# output beside an input named "<output>.tmp" (each input), beside another output named so (an
# older temporary file name: a commit must not remove it), and under a name of 250 bytes (its
# temporary file must fit the folder too).
#
# A read-only folder does not stop root: as root it is a tmpfs mounted read-only; the full disk
# is a tmpfs filled up; either is skipped, saying so, where mounting is not allowed. The cases
# as another user need root and setpriv; they are skipped, saying so, otherwise.
# Usage: hostile_paths.sh BUILD_DIR SOURCE_DIR
set -uo pipefail
bin="$1"
src="$2"
work=$(mktemp -d)
mounts=()
cleanup() {
    for m in "${mounts[@]}"; do umount "$m" 2> /dev/null; done
    rm -rf "$work"
}
trap cleanup EXIT
fails=0
pairs=0
works=0
skipped=()
die() { echo "hostile_paths: $*" >&2; exit 1; }
bad() { echo "hostile_paths: FAIL $*" >&2; fails=$((fails + 1)); }

# --- the inputs the rows use ------------------------------------------------------------------

head -c 6000 "$src/README.md" > "$work/text.txt"
cp "$src/tests/data/tokenizer/tokenizer.json" "$work/tok.json"
mkdir "$work/tokdir"
cp "$src/tests/data/tokenizer/gpt2/vocab.json" "$src/tests/data/tokenizer/gpt2/merges.txt" \
    "$work/tokdir/"
cp "$src/examples/classify/wine.csv" "$work/wine.csv"
gpt2_args=(--devices cpu:1 --steps 1 --batch 2 --seq 8 --layers 1 --channels 16 --val-every 0
           --sample 0)
"$bin/gpt2" "${gpt2_args[@]}" --tokenizer "$work/tok.json" --data "$work/text.txt" \
    --save "$work/model.bin" > "$work/log" 2>&1 || { cat "$work/log"; die "cannot make a model"; }
"$bin/classify" "$work/wine.csv" --steps 2 --save "$work/cls.safetensors" > "$work/log" 2>&1 ||
    { cat "$work/log"; die "cannot make a classify model"; }
linreg_args=(--devices cpu:2 --rows 64 --features 4 --steps 2)
"$bin/linreg" "${linreg_args[@]}" --save "$work/lin.safetensors" > "$work/log" 2>&1 ||
    { cat "$work/log"; die "cannot make a linreg model"; }

# --- the table's rows: one per program --------------------------------------------------------
# row NAME WORK_REGEX -- ARGS... -- SLOTS...
#   WORK_REGEX  a line the program prints once it has started its work (refusals come first)
#   ARGS        a fast, working command line without the slots
#   SLOTS       in:FLAG=FILE (an input: FLAG FILE; "in:=FILE" a positional one; "in:env:NAME=FILE"
#               one given in the environment) and out:FLAG=NAME (an output written as NAME)
rows=()
row() { rows+=("$(printf '%q ' "$@")"); }
row gpt2 '^step ' -- "$bin/gpt2" "${gpt2_args[@]}" -- \
    in:--data=text.txt in:--tokenizer=tok.json in:--load=model.bin \
    out:--save=m.bin out:--checkpoint=c.mwc
row gpt2-tokenize 'tokens to' -- "$bin/gpt2-tokenize" --no-eot --val-fraction 0.5 -- \
    in:--tokenizer=tok.json in:=text.txt out:--out=a.bin out:--val-out=v.bin
row classify '^step ' -- "$bin/classify" --steps 2 --test-fraction 0.25 -- \
    in:=wine.csv in:--load=cls.safetensors out:--save=w.safetensors out:--predictions=p.txt
row linreg 'steps in' -- "$bin/linreg" "${linreg_args[@]}" -- \
    in:--load=lin.safetensors out:--save=w.safetensors
row meshwit-bench '^== tokenize' -- "$bin/meshwit-bench" tokenize --quick -- \
    in:env:MESHWIT_BENCH_TEXT=text.txt in:env:MESHWIT_BENCH_TOKENIZER=tok.json \
    out:--csv=b.csv out:--json=b.json

# --- the places a case needs ------------------------------------------------------------------

as_user=""   # run_case runs the program as this user when set
nobody=65534 # the other user of the cases as another user
other_user=0
if [[ $(id -u) == 0 ]] && command -v setpriv > /dev/null &&
    setpriv --reuid=$nobody --regid=$nobody --clear-groups true 2> /dev/null; then
    other_user=1
    chmod 0711 "$work" # the cases' folders are reached, not listed, by nobody
else
    skipped+=("the cases as another user (they need root and setpriv)")
fi

root=0
[[ $(id -u) == 0 ]] && root=1
# A read-only folder: for root a tmpfs mounted read-only (permissions do not stop root).
rodir="$work/ro"
mkdir "$rodir"
if ((root)); then
    if mount -t tmpfs -o size=64k,ro tmpfs "$rodir" 2> /dev/null; then
        mounts+=("$rodir")
    else
        rodir=""
        skipped+=("read-only folder (root, and no tmpfs may be mounted here)")
    fi
else
    chmod a-w "$rodir"
fi
# A full disk: a small tmpfs, filled once the case has put its old output in it.
fulldir="$work/full"
mkdir "$fulldir"
if ((root)) && mount -t tmpfs -o size=256k tmpfs "$fulldir" 2> /dev/null; then
    mounts+=("$fulldir")
else
    fulldir=""
    skipped+=("full disk (no tmpfs may be mounted here)")
fi
# A device node of the case's own (a copy of /dev/null's numbers), so that no system file is at
# stake; where nodes cannot be made, /dev/null itself (which a user who cannot make nodes cannot
# replace either).
devnode() { # DIR: prints the node's path
    if mknod "$1/null" c 1 3 2> /dev/null; then echo "$1/null"; else echo /dev/null; fi
}

# A listing of everything under DIR (and the device, when outside it): kind, mode, owner, size,
# content hash.
snapshot() {
    local d=$1 extra=${2:-}
    (cd "$d" && find . -printf '%y %m %u %p\n' | sort)
    (cd "$d" && find . ! -type d -printf '%p %s %t\n' | sort)
    (cd "$d" && find . -type f -exec sha256sum {} + | sort)
    [[ -n $extra ]] && stat -L -c '%F %t %T %i' "$extra"
    return 0
}

# --- running one case -------------------------------------------------------------------------

# A slot's key in val ("in:--data", "in:" for a positional input, "in:env:NAME", "out:--save")
# and its flag ("--data", "", "env:NAME", "--save").
key_of() { echo "${1%%=*}"; }
flag_of() { local k=${1%%=*}; echo "${k#*:}"; }
# The row's command line (cmd) and environment (env) with the slot values in val.
declare -A val
command_line() {
    local slot key flag
    cmd=("${row_args[@]}")
    env=()
    for slot in "${row_slots[@]}"; do
        key=$(key_of "$slot")
        flag=$(flag_of "$slot")
        if [[ $flag == env:* ]]; then
            env+=("${flag#env:}=${val[$key]}")
        elif [[ -z $flag ]]; then
            cmd+=("${val[$key]}")
        else
            cmd+=("$flag" "${val[$key]}")
        fi
    done
}

# run_case ROW CASE REGEX STATUS [DEVICE]: runs the row's command with the slot values in val,
# in the folder $case_dir (as the user $as_user when set), and asserts the case's outcome: exit
# status STATUS, the message, no work done, every file as it was (DEVICE: a node whose kind and
# numbers must stay; the full disk's folder is compared too when the case uses it).
run_case() {
    local name=$1 case=$2 regex=$3 status=$4 dev=${5:-}
    command_line
    local before after rc=0 full=0 run=()
    [[ -n $fulldir && " ${val[*]} " == *" $fulldir/"* ]] && full=1
    [[ -n $as_user ]] && run=(setpriv --reuid="$as_user" --regid="$as_user" --clear-groups)
    before=$(snapshot "$case_dir" "$dev"; ((full)) && snapshot "$fulldir")
    (cd "$case_dir" && env "${env[@]}" timeout 20 "${run[@]}" "${cmd[@]}") > "$case_dir.out" 2>&1 || rc=$?
    after=$(snapshot "$case_dir" "$dev"; ((full)) && snapshot "$fulldir")
    pairs=$((pairs + 1))
    local what="$name: $case"
    if [[ $rc == 124 || $rc == 137 ]]; then
        bad "$what: it blocked (killed after 20 s)"
    elif [[ $rc != "$status" ]]; then
        bad "$what: exit status $rc, expected $status: $(head -c 600 "$case_dir.out")"
    fi
    grep -qE -- "$regex" "$case_dir.out" || bad "$what: no '$regex' in: $(head -c 600 "$case_dir.out")"
    if grep -qE -- "$row_work" "$case_dir.out"; then
        bad "$what: refused only after the work"
    fi
    [[ $before == "$after" ]] || bad "$what: files changed: $(diff <(echo "$before") <(echo "$after") | head -8)"
}

# run_works ROW CASE: the row's command with the slot values in val must work: exit 0, every
# output written, every input (each slot's file) byte for byte as it was.
run_works() {
    local name=$1 case=$2 slot key rc=0 sums
    command_line
    sums=$(for slot in "${row_slots[@]}"; do
        [[ $slot == in:* ]] && sha256sum "${val[$(key_of "$slot")]}"
    done)
    (cd "$case_dir" && env "${env[@]}" timeout 60 "${cmd[@]}") > "$case_dir.out" 2>&1 || rc=$?
    works=$((works + 1))
    local what="$name: $case"
    [[ $rc == 0 ]] || { bad "$what: exit status $rc: $(head -c 600 "$case_dir.out")"; return; }
    for slot in "${row_slots[@]}"; do
        key=$(key_of "$slot")
        [[ $slot == out:* && ! -s ${val[$key]} ]] && bad "$what: ${key#out:} not written"
    done
    [[ $sums == "$(for slot in "${row_slots[@]}"; do
        [[ $slot == in:* ]] && sha256sum "${val[$(key_of "$slot")]}"
    done)" ]] || bad "$what: an input changed or went"
    ls -A "$case_dir" | grep -q -- '\.tmp-mw-' && bad "$what: a temporary file was left"
    return 0
}

# A fresh folder for one case, holding a copy of every input the row reads; val maps each slot
# to its file there (outputs to names not yet taken).
fresh_case() {
    case_dir="$work/case$((pairs + works))"
    rm -rf "$case_dir" "$case_dir.out"
    mkdir "$case_dir"
    val=()
    local slot file
    for slot in "${row_slots[@]}"; do
        file=${slot#*=}
        [[ $slot == in:* ]] && cp -r "$work/$file" "$case_dir/$file"
        val[$(key_of "$slot")]="$case_dir/$file"
    done
}

for r in "${rows[@]}"; do
    eval "set -- $r"
    name=$1 row_work=$2
    shift 3
    row_args=()
    while [[ $1 != -- ]]; do row_args+=("$1"); shift; done
    shift
    row_slots=("$@")
    if [[ ! -x ${row_args[0]} ]]; then
        skipped+=("$name (not built)")
        continue
    fi
    ins=() outs=()
    for slot in "${row_slots[@]}"; do
        if [[ $slot == in:* ]]; then ins+=("$(key_of "$slot")"); else outs+=("$(key_of "$slot")"); fi
    done
    # The row works as it stands.
    fresh_case
    command_line
    (cd "$case_dir" && env "${env[@]}" timeout 60 "${cmd[@]}") > "$case_dir.out" 2>&1 ||
        { cat "$case_dir.out" >&2; die "$name: the row's own command fails"; }
    for o in "${outs[@]}"; do
        [[ -s ${val[$o]} ]] || die "$name: the working run wrote no ${o#out:}"
    done

    for o in "${outs[@]}"; do
        for i in "${ins[@]}"; do
            for how in path dot symlink hardlink; do
                fresh_case
                target=${val[$i]}
                case $how in
                    path) val[$o]=$target ;;
                    dot) val[$o]="$(dirname "$target")/./$(basename "$target")" ;;
                    symlink) ln -s "$target" "$case_dir/link"; val[$o]="$case_dir/link" ;;
                    hardlink) ln "$target" "$case_dir/hard"; val[$o]="$case_dir/hard" ;;
                esac
                run_case "$name" "$o = input $i ($how)" "is also .*: writing it would destroy an input" 2
            done
            # An input named like an older temporary file of the output: it stays.
            fresh_case
            mv "${val[$i]}" "${val[$o]}.tmp"
            val[$i]="${val[$o]}.tmp"
            run_works "$name" "$i named $o.tmp"
        done
        for o2 in "${outs[@]}"; do
            [[ $o2 == "$o" ]] && continue
            fresh_case
            val[$o]=${val[$o2]}
            run_case "$name" "$o = $o2" "name the same file" 2
            # Another output named like an older temporary file of this one: both are written.
            fresh_case
            val[$o2]="${val[$o]}.tmp"
            run_works "$name" "$o2 named $o.tmp"
        done
        fresh_case
        mkfifo "$case_dir/fifo"
        val[$o]="$case_dir/fifo"
        run_case "$name" "$o = a FIFO" "is a FIFO, not a regular file" 2
        fresh_case
        val[$o]=$(devnode "$case_dir")
        run_case "$name" "$o = a device node (${val[$o]})" "is a character device, not a regular file" 2 "${val[$o]}"
        fresh_case
        mkdir "$case_dir/folder"
        val[$o]="$case_dir/folder"
        run_case "$name" "$o = a folder" "is a directory, not a regular file" 2
        fresh_case
        val[$o]="$case_dir/missing/out"
        run_case "$name" "$o in a missing folder" "cannot create a file in .*missing: No such file or directory" 2
        if [[ -n $rodir ]]; then
            fresh_case
            val[$o]="$rodir/out"
            run_case "$name" "$o in a read-only folder" "cannot create a file in .*ro: (Read-only file system|Permission denied)" 2
        fi
        if [[ -n $fulldir ]]; then
            fresh_case
            rm -rf "${fulldir:?}"/*
            printf 'the old output\n' > "$fulldir/out"
            head -c 1M /dev/zero > "$fulldir/filler" 2> /dev/null
            val[$o]="$fulldir/out"
            run_case "$name" "$o on a full disk" "needs .*, and .*full has 0 bytes free" 2
            [[ $(cat "$fulldir/out") == "the old output" ]] || bad "$name: $o on a full disk: the old output is gone"
        fi
        fresh_case
        val[$o]=""
        run_case "$name" "$o = ''" "an empty file name" 2
        fresh_case
        val[$o]="$case_dir/$(printf 'n%.0s' {1..300})"
        run_case "$name" "$o = a name of 300 bytes" "File name too long" 2
        fresh_case
        val[$o]="$case_dir/$(printf 'n%.0s' {1..250})"
        run_works "$name" "$o = a name of 250 bytes"
        fresh_case
        printf 'precious\n' > "$case_dir/precious"
        chmod 0444 "$case_dir/precious"
        val[$o]="$case_dir/precious"
        run_case "$name" "$o = a read-only file" "precious is read-only \(mode 0444\): not replaced" 2
        if ((other_user)); then
            # As nobody, in folders nobody may write: a file of root's it may not write, and one
            # it may write but, in a sticky folder, not rename over.
            fresh_case
            chmod 1777 "$case_dir"
            mkdir -m 0777 "$case_dir/open"
            printf "root's\n" > "$case_dir/open/roots"
            chmod 0644 "$case_dir/open/roots"
            val[$o]="$case_dir/open/roots"
            as_user=$nobody
            run_case "$name" "$o = root's file, as nobody" "roots cannot be replaced: Permission denied" 2
            fresh_case
            chmod 1777 "$case_dir"
            printf "root's\n" > "$case_dir/roots"
            chmod 0666 "$case_dir/roots"
            val[$o]="$case_dir/roots"
            run_case "$name" "$o = root's file in a sticky folder, as nobody" "roots belongs to another user \(uid 0\) in the sticky folder" 2
            as_user=""
        fi
    done
    for i in "${ins[@]}"; do
        fresh_case
        mkfifo "$case_dir/fifo"
        val[$i]="$case_dir/fifo"
        run_case "$name" "$i = a FIFO" "is a FIFO, not a regular file" 2
        fresh_case
        val[$i]=/dev/zero
        run_case "$name" "$i = /dev/zero" "is a character device, not a regular file" 2 /dev/zero
    done
    echo "hostile_paths: $name: ${#ins[@]} inputs, ${#outs[@]} outputs"
done

# --- a tokenizer folder -----------------------------------------------------------------------
# A FIFO as its vocab.json never blocks; an output naming its vocab.json is refused.
for r in gpt2 gpt2-tokenize; do
    for c in fifo output; do
        case_dir="$work/tokcase"
        rm -rf "$case_dir"
        mkdir "$case_dir"
        cp -r "$work/tokdir" "$case_dir/tokdir"
        cp "$work/text.txt" "$case_dir/text.txt"
        out="$case_dir/out.bin"
        regex="is also --tokenizer .*vocab.json: writing it would destroy an input"
        if [[ $c == fifo ]]; then
            rm "$case_dir/tokdir/vocab.json"
            mkfifo "$case_dir/tokdir/vocab.json"
            regex="vocab.json: it is a FIFO, not a regular file"
        else
            out="$case_dir/tokdir/vocab.json"
        fi
        if [[ $r == gpt2 ]]; then
            row_args=("$bin/gpt2" "${gpt2_args[@]}" --data "$case_dir/text.txt" --save "$out")
            row_work='^step '
        else
            row_args=("$bin/gpt2-tokenize" --out "$out" "$case_dir/text.txt")
            row_work='tokens to'
        fi
        row_slots=(in:--tokenizer=tokdir)
        val=([in:--tokenizer]="$case_dir/tokdir")
        run_case "$r" "--tokenizer folder: $c" "$regex" 2
    done
done

# --- the bench's scratch files ----------------------------------------------------------------
# The soak case writes a checkpoint it removes again: in a folder of its own, never under a name
# in /tmp that another user could have planted a link at ("/tmp/meshwit_soak_<pid>.mwc", the
# link named before the bench starts under that very pid): the link's target stays as it was.
if [[ -x $bin/meshwit-bench ]]; then
    printf 'the victim\n' > "$work/victim"
    planted=$(TMPDIR="$work" timeout 60 bash -c 'ln -s "$1" /tmp/meshwit_soak_$$.mwc &&
        echo /tmp/meshwit_soak_$$.mwc && exec "$2" soak --quick > "$3" 2>&1' _ "$work/victim" \
        "$bin/meshwit-bench" "$work/soak.out")
    rc=$?
    rm -f "$planted"
    works=$((works + 1))
    [[ $rc == 0 ]] || bad "meshwit-bench soak: exit status $rc: $(head -c 600 "$work/soak.out")"
    [[ $(cat "$work/victim") == "the victim" ]] || bad "meshwit-bench soak wrote through a link planted in /tmp"
    [[ -z $(find "$work" -maxdepth 1 -name 'meshwit-bench-*') ]] || bad "meshwit-bench soak left its folder in TMPDIR"
fi

for s in "${skipped[@]}"; do echo "hostile_paths: skipped: $s"; done
((fails == 0)) || die "$fails of $pairs refused and $works working (program x case) pairs failed"
echo "hostile_paths: $pairs (program x case) pairs refused with the documented status, nothing" \
    "blocked, every file as it was; $works working pairs wrote their outputs and left every input"
