#!/usr/bin/env bash
# Mutation testing: puts each small bug listed in tests/mutants.txt into a scratch copy of the
# tree, one at a time, rebuilds the test program the mutant names and runs the tests it names;
# a failing run kills the mutant. Prints one line per mutant and, last, "K killed of N".
# Exits non-zero if a mutant survives, if its text is not found exactly once in its file (a
# stale mutant: re-point it at the code as it now reads), if it does not build, or if the tests
# fail without any mutant.
#
# usage: scripts/mutants.sh [-l LIST] [PATTERN]
#   LIST     the mutant list (default tests/mutants.txt)
#   PATTERN  run only the mutants whose description contains PATTERN
# The scratch copy and its build live in $MUTANTS_DIR (default build-mutants/) and are kept
# between runs, so a run rebuilds only what changed; each mutant recompiles one file.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
list=tests/mutants.txt
if [ "${1:-}" = "-l" ]; then
    list=$2
    shift 2
fi
pattern=${1:-}
work=${MUTANTS_DIR:-$root/build-mutants}
src=$work/src
bld=$work/build
jobs=${JOBS:-2}
mkdir -p "$src" "$bld"

# --- the scratch copy: the working tree (tracked and untracked files, not ignored ones) --------
# Only files whose content differs are copied, so make sees unchanged files as unchanged.
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

if [ ! -f "$bld/CMakeCache.txt" ]; then
    cmake -S "$src" -B "$bld" -DCMAKE_BUILD_TYPE=Release -DMESHWIT_BUILD_TESTS=ON \
        -DMESHWIT_BUILD_EXAMPLES=OFF -DMESHWIT_BUILD_BENCH=OFF -DMESHWIT_CUDA=OFF \
        -DMESHWIT_MPI=OFF >"$work/configure.log" 2>&1 ||
        {
            cat "$work/configure.log"
            exit 1
        }
fi

# --- the list: blocks of "key value" lines (mutant, file, from, to, tests), blank-separated --
names=() files=() froms=() tos=() tests=()
flush() {
    [ -n "$m_name$m_file$m_from$m_to$m_tests" ] || return 0
    if [ -z "$m_name" ] || [ -z "$m_file" ] || [ -z "$m_from" ] || [ -z "$m_tests" ]; then
        echo "mutants: $list: incomplete block near line $lineno (mutant '$m_name')" >&2
        exit 2
    fi
    names+=("$m_name") files+=("$m_file") froms+=("$m_from") tos+=("$m_to") tests+=("$m_tests")
    m_name='' m_file='' m_from='' m_to='' m_tests=''
}
m_name='' m_file='' m_from='' m_to='' m_tests='' lineno=0
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
        from) m_from=$value ;;
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

selected=()
for i in "${!names[@]}"; do
    [[ -z $pattern || ${names[$i]} == *"$pattern"* ]] && selected+=("$i")
done
[ ${#selected[@]} -gt 0 ] || {
    echo "mutants: no mutant matches '$pattern'" >&2
    exit 2
}

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
    if [ ! -f "$root/$f" ]; then
        echo "STALE     ${names[$i]}: $f does not exist"
        broken=$((broken + 1))
        continue
    fi
    text=$(
        cat "$root/$f"
        printf x
    )
    text=${text%x}
    n=$(occurrences "$text" "${froms[$i]}")
    if [ "$n" -ne 1 ]; then
        echo "STALE     ${names[$i]}: '${froms[$i]}' occurs $n times in $f (must be once)"
        broken=$((broken + 1))
        continue
    fi
    printf '%s' "${text/"${froms[$i]}"/"${tos[$i]}"}" >"$src/$f"
    log="$work/mutant-$i.log"
    if ! build "${t%% *}" "$log"; then
        echo "NO BUILD  ${names[$i]} ($f; see $log)"
        broken=$((broken + 1))
    elif run_tests "$t" "$log"; then
        echo "SURVIVED  ${names[$i]} ($f; $t)"
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
