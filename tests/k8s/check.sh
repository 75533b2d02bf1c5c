#!/usr/bin/env bash
# The Kubernetes manifests checked without a cluster: the example overlays
# must be what segps-k8s makes of their configs (deploy/k8s/examples.sh,
# into a scratch folder, no difference), then check.mjs checks them
# against the API schemas, their configs and the Secrets make-certs.sh
# --k8s makes (it installs the pinned schema and type-check packages,
# package-lock.json), and run_pods.mjs runs two overlays' pods as local
# processes (teacher-npy's, from data claim to model claim, and
# teacher-replicated's). Exit 77 (skipped, with the reason) where kubectl or
# the npm registry is out of reach; any other failure fails.
#   bash tests/k8s/check.sh PATH/TO/segps-k8s
set -uo pipefail
cd "$(dirname "$0")"
segps_k8s=$1
# Made beside the committed ones, so that their path to the base is the same.
scratch=$(mktemp -d ../../deploy/k8s/.overlays-check.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
bash ../../deploy/k8s/examples.sh "$segps_k8s" "$scratch" || exit 1
if ! diff -ru ../../deploy/k8s/overlays "$scratch"; then
  echo "FAIL: deploy/k8s/overlays differ from what segps-k8s makes (bash deploy/k8s/examples.sh build/bin/segps-k8s)"
  exit 1
fi
echo "ok   the example overlays are what segps-k8s makes of their configs"
command -v kubectl > /dev/null || { echo "SKIPPED: no kubectl (with kustomize) on this machine"; exit 77; }
command -v npm > /dev/null || { echo "SKIPPED: no node and npm on this machine"; exit 77; }
if ! npm ci --no-audit --no-fund --loglevel=error > npm.log 2>&1; then
  if ! npm ping > /dev/null 2>&1; then echo "SKIPPED: the npm registry is unreachable"; cat npm.log; exit 77; fi
  cat npm.log
  exit 1
fi
rm -f npm.log
certs=$(mktemp -d)
trap 'rm -rf "$scratch" "$certs"' EXIT
bash ../../deploy/make-certs.sh --k8s "$certs" segps-server-0.segps-server > /dev/null || exit 1
node check.mjs "$certs/secrets.yaml" || exit 1
# The teacher-npy overlay's pods as local processes: a job from data claim to model claim.
node run_pods.mjs ../../deploy/k8s/overlays/teacher-npy "$(dirname "$segps_k8s")" "$certs" || exit 1
# The replicated overlay's pods: three servers streaming to their backups over mutual TLS.
node run_pods.mjs ../../deploy/k8s/overlays/teacher-replicated "$(dirname "$segps_k8s")" "$certs"
