#!/usr/bin/env bash
# The floors of meshwit and what each may include ("..." includes of our own headers), lowest
# first; a file may always include its own floor and the public headers (meshwit.h, meshwit/):
#   core/         the graph, autodiff, planning; of devices/ only the kernel interface
#                 (devices/device.h, devices/math.h), which names no backend; nothing of formats/
#   formats/      the file formats beneath the runtime (JSON, UTF-8, safetensors): core/ and the
#                 public headers only, nothing of devices/, collectives/, parallel/ or text/
#   devices/      the device vtable, the backends and their registry; nothing above them
#                 (collectives/, parallel/): a backend names its reducers' family, no reducer
#   collectives/  the reducers, the MPI world, the waits they share; no backend's own headers
#                 (devices/cpu/, devices/cuda/): GPU reducers use mw__cuda_api
#   parallel/     mesh, the program runtime (program, workers, executor, transfer, sched: none
#                 of them includes the trainer's headers), the trainer and inference on it; no
#                 backend's own headers and no module's
#                 internals (collectives/cuda/, collectives/mpi/, collectives/nccl/), and no
#                 backend or reducer of a backend named in code: it asks the registry and
#                 collectives/reducer_select.h
# With BUILD (a build tree of ROOT), the calls too, read from the library's objects with nm
# (a call through a vtable or a module's entry table is no edge, as it names no symbol):
#   - no function calls one of a higher floor: core, then formats, then devices and text, then
#     collectives, then the program runtime (the files named below), then the rest of parallel/
#     (trainer, inference, optimizer, checkpoints, weights);
#   - no call circle between the files of devices/cpu (a per-level file's three objects count as
#     the one file; the level dispatcher, cpu_levels.c, is where every entry is called).
# Usage: scripts/check-layers.sh [ROOT [BUILD]]   (default ROOT: the repository of this script)
# Prints every breach as file:line: text (rule), or caller -> callee (symbol), and exits 1 when
# there is one.
set -euo pipefail

root=${1:-"$(dirname "${BASH_SOURCE[0]}")/.."}
build=${2:-}
[ -z "$build" ] || build=$(cd "$build" && pwd)
cd "$root"

fail=0

# breach DIR REGEX RULE: every line of DIR's sources matching the extended REGEX breaks RULE.
breach() {
    local dir=$1 regex=$2 rule=$3 hits
    [ -e "$dir" ] || return 0
    hits=$(grep -rnHE --include='*.c' --include='*.h' --include='*.cu' --include='*.cuh' \
        "$regex" "$dir" || true)
    if [ -n "$hits" ]; then
        while IFS= read -r line; do echo "$line  [$rule]" >&2; done <<<"$hits"
        fail=1
    fi
}

inc='^[[:space:]]*#[[:space:]]*include[[:space:]]*"'

breach core "$inc"'(parallel|collectives|text)/' "core/ includes nothing above devices/"
breach core "$inc"'devices/(backend|module|cpu/|cuda/)' \
    "core/ includes of devices/ only the kernel interface (device.h, math.h)"
breach core "$inc"'formats/' "core/ includes nothing from formats/, the floor above it"
breach formats "$inc"'(devices|collectives|parallel|text)/' \
    "formats/ includes only core/ and the public headers"
breach devices/device.h '^[[:space:]]*extern[[:space:]]+const[[:space:]]+mw__device_vtable' \
    "the kernel interface declares no backend"
breach devices "$inc"'(parallel|collectives)/' "devices/ includes nothing from collectives/ or parallel/"
breach collectives "$inc"'parallel/' "collectives/ includes nothing from parallel/"
breach collectives "$inc"'devices/(cpu|cuda)/' \
    "collectives/ reaches backends through the registry and mw__cuda_api, not their headers"
breach parallel "$inc"'devices/(cpu|cuda)/' "parallel/ includes no backend's own header"
breach parallel "$inc"'collectives/(cuda|mpi|nccl)/' "parallel/ includes no module's internals"
breach parallel '\bmw__(cpu|cuda)_(backend|device)\b' "parallel/ names no backend"
breach parallel '\bmw__reducer_(nccl|nccl_mpi|cuda_local|mpi_hier)\b' \
    "parallel/ names no backend's reducer: it asks collectives/reducer_select.h"
# The program runtime sits beneath the trainer and inference: none of its files includes theirs.
for f in program.c program.h workers.c executor.c transfer.c sched.c sched.h data_errors.c \
    data_errors.h; do
    breach "parallel/$f" "$inc"'parallel/(trainer_impl|optimizer|consistency|infer)\.h' \
        "the program runtime includes nothing of the trainer or inference built on it"
done

# --- calls, from the objects of a build ------------------------------------------------------

# The runtime's files: the program layer beneath the trainer and inference.
runtime_files="program workers executor transfer sched data_errors profile mesh config agree testing"

# floor SOURCE: the floor of a library source (its path in the repository), or nothing.
floor() {
    local f=$1 base
    case "$f" in
    core/*) echo 0 ;;
    formats/*) echo 1 ;;
    devices/* | text/*) echo 2 ;;
    collectives/*) echo 3 ;;
    parallel/*)
        base=$(basename "$f")
        base=${base%.c}
        if [[ " $runtime_files " == *" $base "* ]]; then echo 4; else echo 5; fi
        ;;
    esac
}

check_calls() {
    local objs o src
    # The library's objects: libmeshwit's (its per-level CPU kernels' among them) and its
    # modules', as their link lines name them (a folder may still hold an object of a file since
    # removed or moved).
    objs=$(for t in meshwit meshwit-cuda meshwit-mpi meshwit-nccl-mpi; do
        l=$build/CMakeFiles/$t.dir/link.txt
        if [ -f "$l" ]; then
            tr ' ' '\n' <"$l" | grep -E '^CMakeFiles/.*\.o$' | sed "s|^|$build/|" || true
        fi
    done | sort -u)
    if [ -z "$objs" ]; then
        echo "check-layers: no link line of libmeshwit under $build/CMakeFiles (build it first," \
            "with CMake's Makefile generator)" >&2
        fail=1
        return
    fi
    # Every defined and undefined symbol of each object, as "def|use UNIT SOURCE SYMBOL": the
    # unit is the binary it goes into (libmeshwit with its per-level kernels, or a module, whose
    # own files a use reaches first: a module has its own copies of the allocation and error
    # entries, devices/module/imports.c).
    local table=$build/check-layers.symbols
    # shellcheck disable=SC2086
    {
        nm -A --defined-only $objs | awk '$(NF-1) ~ /^[TDRB]$/ {print "def", $1, $NF}'
        nm -A -u $objs | awk '{print "use", $1, $NF}'
    } | awk '{
            path = $2; sub(/:.*/, "", path)
            unit = path; sub(/^.*CMakeFiles\//, "", unit); sub(/\.dir\/.*/, "", unit)
            if (unit == "meshwit" || unit ~ /^meshwit_cpu_/) unit = "lib"
            if (unit == "meshwit_cuda_objects") unit = "meshwit-cuda"
            src = path; sub(/^.*\.dir\//, "", src); sub(/\.o$/, "", src)
            print $1, unit, src, $3
        }' >"$table"
    local edges
    edges=$(awk '$1 == "def" {k = $2 SUBSEP $4; if (!(k in at)) at[k] = $3}
        $1 == "use" {u[n++] = $2 " " $3 " " $4}
        END {for (i = 0; i < n; i++) {split(u[i], p, " ")
            d = ((p[1] SUBSEP p[3]) in at) ? at[p[1] SUBSEP p[3]] : at["lib" SUBSEP p[3]]
            if (d != "" && d != p[2]) print p[2], d, p[3]}}' "$table" | sort -u)
    local caller callee sym fa fb
    while read -r caller callee sym; do
        [ -n "$caller" ] || continue
        fa=$(floor "$caller")
        fb=$(floor "$callee")
        [ -n "$fa" ] && [ -n "$fb" ] || continue
        if [ "$fb" -gt "$fa" ]; then
            echo "$caller -> $callee ($sym)  [no call to a higher floor]" >&2
            fail=1
        fi
    done <<<"$edges"
    # Call circles between the files of devices/cpu: the transitive closure of its edges.
    local circles
    circles=$(awk '$1 ~ /^devices\/cpu\// && $2 ~ /^devices\/cpu\// {
            e[$1 SUBSEP $2] = 1; v[$1] = 1; v[$2] = 1 }
        END {
            for (k in v) for (i in v) if ((i SUBSEP k) in e) for (j in v)
                if ((k SUBSEP j) in e) e[i SUBSEP j] = 1
            for (i in v) for (j in v) if (i < j && ((i SUBSEP j) in e) && ((j SUBSEP i) in e))
                print i " <-> " j
        }' <<<"$edges" | sort)
    if [ -n "$circles" ]; then
        while IFS= read -r line; do echo "$line  [no call circle in devices/cpu]" >&2; done \
            <<<"$circles"
        fail=1
    fi
}
[ -z "$build" ] || check_calls

if [ "$fail" -ne 0 ]; then
    echo "check-layers: the floors above are crossed (the rules: scripts/check-layers.sh)" >&2
    exit 1
fi
if [ -n "$build" ]; then
    echo "check-layers: core, formats, devices, collectives and parallel keep to their floors, in" \
        "includes and in calls (from $build)"
else
    echo "check-layers: core, formats, devices, collectives and parallel keep to their floors"
fi
