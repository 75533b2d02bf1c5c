#!/usr/bin/env bash
# The example overlays (deploy/k8s/overlays/*), each made by segps-k8s from
# a config in deploy/configs. CI makes them again into a scratch folder and
# expects no difference (tests/k8s/check.sh): edit this list, not them.
#   bash deploy/k8s/examples.sh SEGPS_K8S [OUT_DIR]   (OUT_DIR: deploy/k8s/overlays)
set -euo pipefail
k8s=$1
here=$(cd "$(dirname "$0")" && pwd)
out=${2:-$here/overlays}
configs=$here/../configs
make() {  # make OVERLAY CONFIG [FLAG ...]
  local name=$1 config=$2
  shift 2
  "$k8s" --config "$configs/$config" --out "$out/$name" --base "$here/base" "$@" > /dev/null
}
make seed seed.pbtxt
make teacher teacher.pbtxt
make teacher-replicated teacher_replicated.pbtxt
make fashion-mnist fashion_mnist.pbtxt
make teacher-chain teacher_chain.pbtxt
make gpu teacher.pbtxt --gpu-segments 0
make teacher-npy teacher_npy.pbtxt --data-pvc segps-data
