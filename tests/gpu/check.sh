#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: build with CUDA, run the gpu-labelled
# tests, then time a worker step against PyTorch on the same GPU. Exits
# non-zero when the build fails, a GPU test fails or skips (a skip means no
# usable device: the check did not happen), none ran, or a benchmark fails.
#   bash tests/gpu/check.sh [OUT_DIR]
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:-gpu-check}
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
export PATH=/usr/local/cuda/bin:$PATH
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DSEGPS_WITH_CUDA=ON > "$out/cmake.log" 2>&1 || { tail -30 "$out/cmake.log"; exit 1; }
cmake --build build-gpu -j"$(nproc)" > "$out/build.log" 2>&1 || { grep -E 'error' -A5 "$out/build.log" | head -60; exit 1; }
ctest --test-dir build-gpu -L gpu --output-on-failure > "$out/ctest-gpu.log" 2>&1
gpu_tests=$?
tail -25 "$out/ctest-gpu.log"
# ctest counts a skip as a pass: count what ran.
ran=$(grep -cE 'Test +#[0-9]+: .* Passed' "$out/ctest-gpu.log")
skipped=$(grep -cE 'Test +#[0-9]+: .*\*\*\*Skipped' "$out/ctest-gpu.log")
echo "gpu-labelled tests: $ran passed, $skipped skipped"
benches=0
echo "== segps step, fp32 =="
build-gpu/bin/segps-bench-step --device cuda:0 | tee "$out/segps-fp32.txt"; benches=$((benches + PIPESTATUS[0]))
echo "== segps step, tf32 =="
build-gpu/bin/segps-bench-step --device cuda:0 --tf32 | tee "$out/segps-tf32.txt"; benches=$((benches + PIPESTATUS[0]))
echo "== pytorch step, fp32 =="
/usr/bin/python3 tests/bench/torch_step.py --device cuda | tee "$out/torch-fp32.txt"
echo "== pytorch step, tf32 =="
/usr/bin/python3 tests/bench/torch_step.py --device cuda --tf32 | tee "$out/torch-tf32.txt"
echo "== ratio (torch ms / segps compute ms; > 1 means segps is faster) =="
for p in fp32 tf32; do
  paste <(tail -n +2 "$out/segps-$p.txt") <(tail -n +2 "$out/torch-$p.txt") |
    awk -v p=$p '{printf "%s %-28s batch %5d  segps %9.3f ms  torch %9.3f ms  ratio %.2f  transfers %s of a PS step\n", p, $1, $2, $3, $9, $9/$3, $6}'
done | tee "$out/ratio.txt"
if [ $gpu_tests -ne 0 ]; then echo "FAIL: gpu-labelled tests failed (see $out/ctest-gpu.log)"; exit 1; fi
if [ "$skipped" -ne 0 ] || [ "$ran" -eq 0 ]; then
  echo "FAIL: $skipped gpu-labelled tests skipped and $ran ran: no usable GPU, so nothing was checked (see $out/ctest-gpu.log)"
  exit 1
fi
if [ $benches -ne 0 ]; then echo "FAIL: a segps step benchmark failed on the GPU"; exit 1; fi
echo "PASS: $ran gpu-labelled tests ran on the GPU and passed"
