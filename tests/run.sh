#!/usr/bin/env bash
# Installs what is missing, builds segps, and runs every test (ctest).
# Extra arguments go to ctest, e.g. `bash tests/run.sh -L unit`.
set -euo pipefail
cd "$(dirname "$0")/.."
# PyTorch for the Python package's tests (python.*; they skip, saying so, without it).
bash deploy/install-deps.sh python3-torch
# The CUDA backend is built when nvcc is found; CUDA installs outside PATH by default.
if [ -x /usr/local/cuda/bin/nvcc ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build -j"$(nproc)"
bash tests/ctest.sh build -j2 "$@"
