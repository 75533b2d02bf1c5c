#!/usr/bin/env bash
# Builds segps with AddressSanitizer and UndefinedBehaviorSanitizer (in
# build-asan/, CPU only) and runs the unit and integration tests there:
# every server, worker and tool the integration tests start is the
# sanitized build, and any report fails its test (common/sanitizer_defaults.cc:
# UBSan halts on error; ASan always does). Extra arguments go to ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
# clang: its UBSan instrumentation compiles in about two thirds of GCC 12's time.
bash deploy/install-deps.sh clang libclang-rt-14-dev
CC=clang CXX=clang++ cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSEGPS_SANITIZE=address,undefined \
  -DSEGPS_WITH_CUDA=OFF > /dev/null
cmake --build build-asan -j"$(nproc)"
# detect_leaks=0: gRPC and protobuf keep process-lifetime singletons that
# LeakSanitizer reports at exit in every binary. Left out: the two
# Fashion-MNIST accuracy runs, 14 epochs of 60000 images, which take over 10
# minutes under ASan on 2 cores (their code paths are the teacher jobs').
ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=0}" \
  bash tests/ctest.sh build-asan -j2 -L "unit|integration" -LE gpu \
  -E "Cluster.FashionMnistConfigReachesItsAccuracyBar|Pipeline.FashionMnist" "$@"
