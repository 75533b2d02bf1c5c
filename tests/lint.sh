#!/usr/bin/env bash
# Static checks over server/, worker/, common/ and deploy/, on the
# compilation database of the build that tests/run.sh made (build/, or the
# directory given as $1). Fails on any finding:
# - clang's -Wthread-safety: every ABSL_GUARDED_BY / REQUIRES annotation holds;
# - clang-tidy with the root .clang-tidy: no function over 80 lines, and
#   the bugprone and performance checks it names.
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"

missing=()
for p in clang clang-tidy; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
[ -f "$build/compile_commands.json" ] || { echo "lint: no $build/compile_commands.json; run tests/run.sh first" >&2; exit 2; }
python3 tests/lint.py "$build"
