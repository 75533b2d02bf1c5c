#!/usr/bin/env bash
# On a machine without a usable GPU: the GPU conformance test skips, naming
# why, and under SEGPS_REQUIRE_GPU=1 (what tests/gpu/check.sh sets) the same
# test fails instead, so a GPU check cannot pass without a GPU. Where a GPU
# is usable there is nothing to show: exit 77 (ctest: skipped).
#   bash tests/gpu/require_gpu_test.sh PATH/TO/backend_conformance_gpu_test
set -uo pipefail
test_binary=$1
filter=--gtest_filter='*GemmEveryShapeAndTransposition/cuda'
plain=$(env -u SEGPS_REQUIRE_GPU "$test_binary" "$filter" 2>&1)
plain_status=$?
if ! grep -q 'SKIPPED' <<< "$plain"; then
  echo "a GPU is usable here: the test ran (exit $plain_status); nothing to show"
  exit 77
fi
[ $plain_status -eq 0 ] || { echo "FAIL: without SEGPS_REQUIRE_GPU a missing GPU should skip, not fail:"; echo "$plain"; exit 1; }
grep -q 'no usable GPU' <<< "$plain" || { echo "FAIL: the skip does not say why:"; echo "$plain"; exit 1; }
required=$(SEGPS_REQUIRE_GPU=1 "$test_binary" "$filter" 2>&1)
required_status=$?
[ $required_status -ne 0 ] || { echo "FAIL: SEGPS_REQUIRE_GPU=1 without a GPU passed:"; echo "$required"; exit 1; }
grep -q 'SEGPS_REQUIRE_GPU=1, and no GPU backend: ' <<< "$required" ||
  { echo "FAIL: the failure does not name the reason:"; echo "$required"; exit 1; }
echo "PASS: skipped without SEGPS_REQUIRE_GPU (exit 0), failed with it (exit $required_status), both naming why"
