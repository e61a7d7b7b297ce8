#!/usr/bin/env bash
# Mutation testing: puts each small bug listed in tests/mutants.txt into a scratch copy of the
# tree, one at a time, rebuilds the test program the mutant names and runs the tests it names;
# a failing run kills the mutant. Prints one line per mutant and, last, "K killed of N".
# Exits non-zero if a mutant survives, if it is stale (its function is not defined exactly once
# in its file, or its text does not occur exactly once there: re-point it at the code as it now
# reads), if it does not build, or if the tests fail without any mutant.
#
# usage: scripts/mutants.sh [-l LIST] [-n] [PATTERN]
#   LIST     the mutant list (default tests/mutants.txt; its header describes the format)
#   -n       only find every mutant's text and print where it is; build and run nothing
#   PATTERN  run only the mutants whose description contains PATTERN
# The scratch copy and its build live in $MUTANTS_DIR (default build-mutants/) and are kept
# between runs, so a run rebuilds only what changed; each mutant recompiles one file.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
list=tests/mutants.txt
dry=0
while [ $# -gt 0 ]; do
    case "$1" in
    -l)
        list=$2
        shift 2
        ;;
    -n)
        dry=1
        shift
        ;;
    *) break ;;
    esac
done
pattern=${1:-}
work=${MUTANTS_DIR:-$root/build-mutants}
src=$work/src
bld=$work/build
jobs=${JOBS:-2}

# --- the list: blocks of "key value" lines, blank-separated (see the list's header) -------------
names=() files=() ins=() froms=() regexes=() tos=() tests=()
flush() {
    [ -n "$m_name$m_file$m_in$m_from$m_regex$m_to$m_tests" ] || return 0
    if [ -z "$m_name" ] || [ -z "$m_file" ] || [ -z "$m_from$m_regex" ] || [ -z "$m_tests" ]; then
        echo "mutants: $list: incomplete block near line $lineno (mutant '$m_name')" >&2
        exit 2
    fi
    if [ -n "$m_from" ] && [ -n "$m_regex" ]; then
        echo "mutants: $list: mutant '$m_name' has both from and regex (near line $lineno)" >&2
        exit 2
    fi
    names+=("$m_name") files+=("$m_file") ins+=("$m_in") froms+=("$m_from")
    regexes+=("$m_regex") tos+=("$m_to") tests+=("$m_tests")
    m_name='' m_file='' m_in='' m_from='' m_regex='' m_to='' m_tests=''
}
m_name='' m_file='' m_in='' m_from='' m_regex='' m_to='' m_tests='' lineno=0
while IFS= read -r line || [ -n "$line" ]; do
    lineno=$((lineno + 1))
    case "$line" in
    '#'*) continue ;;
    '') flush ;;
    *)
        key=${line%%[[:space:]]*}
        value=${line#"$key"}
        value=${value#"${value%%[![:space:]]*}"} # trim the spaces after the key
        case "$key" in
        mutant) m_name=$value ;;
        file) m_file=$value ;;
        in) m_in=$value ;;
        from) m_from=$value ;;
        regex) m_regex=$value ;;
        to) m_to=$value ;;
        tests) m_tests=$value ;;
        *)
            echo "mutants: $list:$lineno: unknown key '$key'" >&2
            exit 2
            ;;
        esac
        ;;
    esac
done <"$list"
flush

# --- helpers ------------------------------------------------------------------------------
# Builds program $1 in the scratch build; the log goes to $2.
build() { cmake --build "$bld" -j "$jobs" --target "$1" >"$2" 2>&1; }

# Runs "program filter" (a Criterion program of the build and a --filter glob); log to $2.
run_tests() {
    local program=${1%% *} filter=${1#* }
    (cd "$bld" && timeout 600 "./$program" --jobs 1 --filter "$filter") >"$2" 2>&1
}

# Number of times $2 occurs in the text $1.
occurrences() {
    local rest=$1 n=0
    while [[ $rest == *"$2"* ]]; do
        rest=${rest#*"$2"}
        n=$((n + 1))
    done
    echo "$n"
}

# Number of non-overlapping matches of the extended regular expression $2 in the text $1 (0 when
# it matches the empty string: no mutant can be placed there).
regex_count() {
    local rest=$1 n=0 m
    while [[ $rest =~ $2 ]]; do
        m=${BASH_REMATCH[0]}
        [ -n "$m" ] || {
            echo 0
            return
        }
        rest=${rest#*"$m"} # the first occurrence of the text is the leftmost match
        n=$((n + 1))
    done
    echo "$n"
}

# The replacement $1 with \1 .. \9 replaced by the groups of the last regex match and \\ by a
# backslash, into `expanded`.
expand_groups() {
    local s=$1 c bs=\\
    expanded=''
    while [ -n "$s" ]; do
        c=${s:0:1}
        if [ "$c" = "$bs" ] && [[ ${s:1:1} == [0-9] ]]; then
            expanded+=${BASH_REMATCH[${s:1:1}]}
            s=${s:2}
        elif [ "$c" = "$bs" ] && [ "${s:1:1}" = "$bs" ]; then
            expanded+=$bs
            s=${s:2}
        else
            expanded+=$c
            s=${s:1}
        fi
    done
}

# "FIRST LAST" (line numbers) for each definition of $2 in the C (or shell) file $1, one per line:
#   - a macro, #define NAME: to the first line that does not end in a backslash;
#   - a function, table, variable or type defined at file scope, whose line starts in column 0
#     and names NAME before a "(", "[", "=" or "{" (or NAME's wrapper's ")": the CPU kernels'
#     MW__CPU(name)): from that line to its body's closing brace in column 0 (clang-format's
#     layout), or to the same line when the body closes there. A declaration (a ";" before any
#     "{") is not a definition.
definitions() {
    awk -v name="$2" '
    function scan(text,    i, c, tail, opens, closes) {
        for (i = 1; i <= length(text); i++) {
            c = substr(text, i, 1)
            if (c == ";") { state = 0; return }
            if (c == "{") {
                tail = substr(text, i)
                opens = gsub(/[{]/, "{", tail)
                closes = gsub(/[}]/, "}", tail)
                if (opens == closes) { print start, NR; state = 0 } else state = 3
                return
            }
        }
    }
    state == 1 { if ($0 !~ /\\$/) { print start, NR; state = 0 } next }
    state == 3 { if ($0 ~ /^}/) { print start, NR; state = 0 } next }
    state == 2 { scan($0); next }
    $0 ~ ("^#[ \t]*define[ \t]+" name "([^A-Za-z0-9_]|$)") {
        start = NR
        if ($0 ~ /\\$/) state = 1; else print start, NR
        next
    }
    /^[A-Za-z_]/ && match($0, "(^|[^A-Za-z0-9_])" name "[ \t]*[)]?[ \t]*[[(={]") {
        start = NR
        state = 2
        scan(substr($0, RSTART + RLENGTH - 1))
    }' "$1"
}

# Puts mutant $1 into the text of its file: sets `mutated` to the file's new text and `where` to
# FILE:LINE (and the function), or `stale` to why it cannot be placed.
mutate() {
    local i=$1 f=${files[$1]} in=${ins[$1]} text prefix='' region suffix='' bounds first=1 last n
    local before what
    stale='' mutated='' where=''
    if [ ! -f "$root/$f" ]; then
        stale="$f does not exist"
        return
    fi
    text=$(
        cat "$root/$f"
        printf x
    )
    text=${text%x}
    region=$text
    if [ -n "$in" ]; then
        bounds=$(definitions "$root/$f" "$in")
        n=$(grep -c . <<<"$bounds" || true)
        if [ "$n" -ne 1 ]; then
            stale="$in is defined $n times in $f (must be once)"
            return
        fi
        read -r first last <<<"$bounds"
        if [ "$first" -gt 1 ]; then
            prefix=$(
                sed -n "1,$((first - 1))p" "$root/$f"
                printf x
            )
            prefix=${prefix%x}
        fi
        region=$(
            sed -n "${first},${last}p" "$root/$f"
            printf x
        )
        region=${region%x}
        suffix=${text:$((${#prefix} + ${#region}))}
    fi
    what=${in:-$f}
    if [ -n "${froms[$i]}" ]; then
        n=$(occurrences "$region" "${froms[$i]}")
        if [ "$n" -ne 1 ]; then
            stale="'${froms[$i]}' occurs $n times in $what (must be once)"
            return
        fi
        before=${region%%"${froms[$i]}"*}
        region=$before${tos[$i]}${region#*"${froms[$i]}"}
    else
        n=$(regex_count "$region" "${regexes[$i]}")
        if [ "$n" -ne 1 ]; then
            stale="/${regexes[$i]}/ matches $n times in $what (must be once)"
            return
        fi
        [[ $region =~ ${regexes[$i]} ]]
        expand_groups "${tos[$i]}"
        before=${region%%"${BASH_REMATCH[0]}"*}
        region=$before$expanded${region#*"${BASH_REMATCH[0]}"}
    fi
    n=${before//[!$'\n']/}
    mutated=$prefix$region$suffix
    where="$f:$((first + ${#n}))${in:+ (in $in)}"
}

# --- the scratch copy: the working tree (tracked and untracked files, not ignored ones) --------
# Only files whose content differs are copied, so make sees unchanged files as unchanged; CMake
# runs again on every call (seconds): a target the list names may be new since the last run, and
# make does not look for it before it re-runs CMake.
prepare() {
    mkdir -p "$src" "$bld"
    git ls-files -co --exclude-standard | sort >"$work/files"
    (cd "$src" && find . -type f | sed 's|^\./||' | sort) >"$work/have"
    comm -13 "$work/files" "$work/have" | while IFS= read -r f; do rm -f "$src/$f"; done
    while IFS= read -r f; do
        [ -f "$f" ] || continue
        if ! cmp -s "$f" "$src/$f"; then
            mkdir -p "$src/$(dirname "$f")"
            cp "$f" "$src/$f"
        fi
    done <"$work/files"

    if [ -f "$bld/CMakeCache.txt" ]; then
        cmake "$bld" >"$work/configure.log" 2>&1 || {
            cat "$work/configure.log"
            exit 1
        }
    else
        cmake -S "$src" -B "$bld" -DCMAKE_BUILD_TYPE=Release -DMESHWIT_BUILD_TESTS=ON \
            -DMESHWIT_BUILD_EXAMPLES=OFF -DMESHWIT_BUILD_BENCH=OFF -DMESHWIT_CUDA=OFF \
            -DMESHWIT_MPI=OFF >"$work/configure.log" 2>&1 ||
            {
                cat "$work/configure.log"
                exit 1
            }
    fi
}

selected=()
for i in "${!names[@]}"; do
    [[ -z $pattern || ${names[$i]} == *"$pattern"* ]] && selected+=("$i")
done
[ ${#selected[@]} -gt 0 ] || {
    echo "mutants: no mutant matches '$pattern'" >&2
    exit 2
}

if [ "$dry" = 1 ]; then
    broken=0
    for i in "${selected[@]}"; do
        mutate "$i"
        if [ -n "$stale" ]; then
            echo "STALE     ${names[$i]}: $stale"
            broken=$((broken + 1))
        else
            echo "found     ${names[$i]}: $where"
        fi
    done
    echo "mutants: ${#selected[@]} mutants, $broken stale"
    [ "$broken" -eq 0 ]
    exit
fi
prepare

# --- baseline: every test set passes on the unmutated tree -----------------------------------
declare -A seen=()
for i in "${selected[@]}"; do
    t=${tests[$i]}
    [ -z "${seen[$t]:-}" ] || continue
    seen[$t]=1
    program=${t%% *}
    if ! build "$program" "$work/build.log"; then
        tail -n 30 "$work/build.log"
        echo "mutants: the unmutated tree does not build ($program)" >&2
        exit 1
    fi
    if ! run_tests "$t" "$work/baseline.log"; then
        tail -n 30 "$work/baseline.log"
        echo "mutants: '$t' fails without any mutant; fix that first" >&2
        exit 1
    fi
done
echo "mutants: baseline passes (${#seen[@]} test sets); ${#selected[@]} mutants"

# --- the mutants ----------------------------------------------------------------------------
killed=0 survived=0 broken=0 start=$SECONDS
for i in "${selected[@]}"; do
    f=${files[$i]} t=${tests[$i]}
    t0=$SECONDS
    mutate "$i"
    if [ -n "$stale" ]; then
        echo "STALE     ${names[$i]}: $stale"
        broken=$((broken + 1))
        continue
    fi
    printf '%s' "$mutated" >"$src/$f"
    log="$work/mutant-$i.log"
    if ! build "${t%% *}" "$log"; then
        echo "NO BUILD  ${names[$i]} ($where; see $log)"
        broken=$((broken + 1))
    elif run_tests "$t" "$log"; then
        echo "SURVIVED  ${names[$i]} ($where; $t)"
        survived=$((survived + 1))
    else
        echo "killed    ${names[$i]} ($((SECONDS - t0)) s)"
        killed=$((killed + 1))
    fi
    cp "$root/$f" "$src/$f" # a fresh mtime: the next build recompiles the original
done
total=${#selected[@]}
echo "mutants: $survived survived, $broken stale or not building; $((SECONDS - start)) s"
echo "$killed killed of $total"
[ "$killed" -eq "$total" ]
