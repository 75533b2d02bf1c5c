#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: build with CUDA, run every gpu-labelled
# test with SEGPS_REQUIRE_GPU=1 (a test that cannot create the GPU backend
# fails, naming why, instead of skipping), then time a worker step against
# PyTorch on the same GPU. Everything a reviewer needs lands in OUT_DIR
# (default gpu-check/): the device, the build and test logs, the benchmark
# tables and summary.txt. Exits non-zero unless the build succeeded, every
# gpu-labelled test ran and passed, and every benchmark ran.
#   bash tests/gpu/check.sh [OUT_DIR]
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:-gpu-check}
mkdir -p "$out"
failures=()
fail() { failures+=("$1"); echo "FAIL: $1"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee "$out/gpu.txt" ||
  fail "nvidia-smi sees no GPU (see $out/gpu.txt)"
[ -d /usr/share/datasets/fashion-mnist ] ||
  echo "note: /usr/share/datasets/fashion-mnist is missing (Debian package dataset-fashion-mnist); the Fashion-MNIST GPU test will fail"
export PATH=/usr/local/cuda/bin:$PATH
export SEGPS_REQUIRE_GPU=1
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DSEGPS_WITH_CUDA=ON > "$out/cmake.log" 2>&1 || { tail -30 "$out/cmake.log"; exit 1; }
cmake --build build-gpu -j"$(nproc)" > "$out/build.log" 2>&1 || { grep -E 'error' -A5 "$out/build.log" | head -60; exit 1; }
ctest --test-dir build-gpu -L gpu --output-on-failure > "$out/ctest-gpu.log" 2>&1 || fail "gpu-labelled tests failed (see $out/ctest-gpu.log)"
tail -25 "$out/ctest-gpu.log"
# ctest counts a skip as a pass: count each outcome.
ran=$(grep -cE 'Test +#[0-9]+: .* Passed' "$out/ctest-gpu.log")
skipped=$(grep -cE 'Test +#[0-9]+: .*\*\*\*Skipped' "$out/ctest-gpu.log")
failed=$(grep -cE 'Test +#[0-9]+: .*(\*\*\*Failed|\*\*\*Exception|\*\*\*Timeout|Not Run)' "$out/ctest-gpu.log")
echo "gpu-labelled tests: $ran passed, $failed failed, $skipped skipped" | tee "$out/summary.txt"
[ "$skipped" -eq 0 ] || fail "$skipped gpu-labelled tests skipped: they did not run on a GPU"
[ "$ran" -gt 0 ] || fail "no gpu-labelled test passed"
bench() {  # NAME COMMAND...: runs it into $out/NAME.txt; a non-zero exit is a failure
  local name=$1
  shift
  echo "== $name =="
  "$@" 2>&1 | tee "$out/$name.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || fail "benchmark $name exited non-zero (see $out/$name.txt)"
}
bench segps-fp32 build-gpu/bin/segps-bench-step --device cuda:0
bench segps-tf32 build-gpu/bin/segps-bench-step --device cuda:0 --tf32
bench torch-fp32 /usr/bin/python3 tests/bench/torch_step.py --device cuda
bench torch-tf32 /usr/bin/python3 tests/bench/torch_step.py --device cuda --tf32
echo "== ratio (torch ms / segps compute ms; > 1 means segps is faster) =="
for p in fp32 tf32; do
  paste <(tail -n +2 "$out/segps-$p.txt") <(tail -n +2 "$out/torch-$p.txt") |
    awk -v p=$p 'NF >= 9 {printf "%s %-28s batch %5d  segps %9.3f ms  torch %9.3f ms  ratio %.2f  transfers %s of a PS step\n", p, $1, $2, $3, $9, $9/$3, $6}'
done | tee "$out/ratio.txt"
if [ ${#failures[@]} -ne 0 ]; then
  printf 'FAIL: %s\n' "${failures[@]}" | tee -a "$out/summary.txt"
  exit 1
fi
echo "PASS: $ran gpu-labelled tests ran on the GPU and passed; benchmarks in $out/" | tee -a "$out/summary.txt"
