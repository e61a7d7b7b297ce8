#!/usr/bin/env bash
# The floors of meshwit and what each may include ("..." includes of our own headers), lowest
# first; a file may always include its own floor and the public headers (meshwit.h, meshwit/):
#   core/         the graph, autodiff, planning; of devices/ only the kernel interface
#                 (devices/device.h, devices/math.h), which names no backend
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
# Usage: scripts/check-layers.sh [ROOT]   (default: the repository holding this script)
# Prints every breach as file:line: text (rule) and exits 1 when there is one.
set -euo pipefail

root=${1:-"$(dirname "${BASH_SOURCE[0]}")/.."}
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

if [ "$fail" -ne 0 ]; then
    echo "check-layers: the floors above are crossed (the rules: scripts/check-layers.sh)" >&2
    exit 1
fi
echo "check-layers: core, devices, collectives and parallel keep to their floors"
