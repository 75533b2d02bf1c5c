#!/usr/bin/env bash
# The Kubernetes manifests checked without a cluster (check.mjs): installs the
# pinned schema and type-check packages (package-lock.json) and runs it.
# Exit 77 (skipped, with the reason) where kubectl or the npm registry is
# out of reach; any other failure fails.
set -uo pipefail
cd "$(dirname "$0")"
command -v kubectl > /dev/null || { echo "SKIPPED: no kubectl (with kustomize) on this machine"; exit 77; }
command -v npm > /dev/null || { echo "SKIPPED: no node and npm on this machine"; exit 77; }
if ! npm ci --no-audit --no-fund --loglevel=error > npm.log 2>&1; then
  if ! npm ping > /dev/null 2>&1; then echo "SKIPPED: the npm registry is unreachable"; cat npm.log; exit 77; fi
  cat npm.log
  exit 1
fi
rm -f npm.log
exec node check.mjs
