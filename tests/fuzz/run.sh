#!/usr/bin/env bash
# Builds the libFuzzer targets with clang, AddressSanitizer and
# UndefinedBehaviorSanitizer (in build-fuzz/) and runs each for SECONDS
# (default 60) from a copy of its committed corpus, from a fixed seed
# (FUZZ_SEED, default 1: a run is repeatable). Exits non-zero on a
# crash, a leak, undefined behaviour or a slow input; the input that did it
# is left in build-fuzz/ and named in the output. New interesting inputs
# stay in build-fuzz/corpus/; copy the worth-keeping ones to tests/fuzz/corpus.
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds="${1:-60}"
seed="${FUZZ_SEED:-1}"

bash deploy/install-deps.sh clang libclang-rt-14-dev

CC=clang CXX=clang++ cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSEGPS_FUZZ=ON \
  -DSEGPS_SANITIZE=address,undefined -DSEGPS_WITH_CUDA=OFF >/dev/null
cmake --build build-fuzz -j"$(nproc)" --target segps-fuzz-server-requests segps-fuzz-stage-link

# The stage links' messages are one decoder deep: a quarter of the time.
for target in server_requests stage_link; do
  work="build-fuzz/corpus/$target"
  rm -rf "$work" && mkdir -p "$work"
  time_s="$seconds"
  [[ $target == stage_link ]] && time_s=$(( seconds / 4 > 15 ? seconds / 4 : 15 ))
  echo "fuzz: $target for ${time_s} s"
  "build-fuzz/bin/segps-fuzz-${target//_/-}" -max_total_time="$time_s" -seed="$seed" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="build-fuzz/${target}-" "$work" "tests/fuzz/corpus/$target"
done
