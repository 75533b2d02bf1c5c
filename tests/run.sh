#!/usr/bin/env bash
# Installs what is missing, builds segps, and runs every test (ctest).
# Extra arguments go to ctest, e.g. `bash tests/run.sh -L unit`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build -j"$(nproc)"
ctest --test-dir build --output-on-failure -j2 "$@"
