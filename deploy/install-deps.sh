#!/usr/bin/env bash
# Installs the Debian 12 packages segps needs to build, test and run, and
# any more named as arguments (the lint's and the fuzzer's clang, say).
# Idempotent: packages already present are left alone. Needs root (or sudo).
set -euo pipefail

packages=(
  build-essential cmake pkg-config ccache lld
  protobuf-compiler libprotobuf-dev
  libgrpc++-dev protobuf-compiler-grpc libssl-dev
  libabsl-dev libgtest-dev libgmock-dev
  libopenblas-dev zlib1g-dev prometheus-cpp-dev
  dataset-fashion-mnist
  python3 procps openssl
  python3-numpy python3-onnx python3-matplotlib
  python3-dev pybind11-dev
  prometheus
  "$@"
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all packages present"
  exit 0
fi

sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
echo "install-deps: installing ${missing[*]}"
"${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
"${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
