#!/usr/bin/env bash
# Builds and runs the linreg example: the same model trained on one device and sharded over
# virtual CPU devices. Arguments go to the example (see `scripts/demo.sh --help`).
# Exit status: the example's.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
JOBS=${JOBS:-2}

bash scripts/deps.sh

if [ ! -f build/CMakeCache.txt ]; then
    echo "demo.sh: configuring build/ (Release)"
    cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
fi
echo "demo.sh: building linreg"
cmake --build build --target linreg -j "$JOBS" >/dev/null

exec build/linreg "$@"
