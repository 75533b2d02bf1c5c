#!/usr/bin/env bash
# Installs what is missing, builds segps, and trains a config on a local
# cluster (separate server and worker processes on loopback).
#   bash deploy/local.sh [CONFIG] [segps-local flags...]
# Default CONFIG: the walk-through (deploy/configs/seed.pbtxt).
set -euo pipefail
cd "$(dirname "$0")/.."
config=${1:-deploy/configs/seed.pbtxt}
shift || true
bash deploy/install-deps.sh
# The CUDA backend is built when nvcc is found; CUDA installs outside PATH by default.
if [ -x /usr/local/cuda/bin/nvcc ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo > /dev/null
cmake --build build -j"$(nproc)"
exec build/bin/segps-local --config "$config" "$@"
