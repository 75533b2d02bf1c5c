#!/usr/bin/env bash
# The Kubernetes manifests checked without a cluster (check.mjs): installs the
# pinned schema and type-check packages (package-lock.json) and runs it.
set -euo pipefail
cd "$(dirname "$0")"
command -v kubectl > /dev/null || { echo "kubectl (with kustomize) is needed: Debian's kubernetes-client or upstream's"; exit 1; }
command -v npm > /dev/null || { echo "node and npm are needed"; exit 1; }
npm ci --no-audit --no-fund --loglevel=error > /dev/null
exec node check.mjs
