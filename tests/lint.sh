#!/usr/bin/env bash
# Static checks over server/, worker/, common/, deploy/ and python/ (their
# sources and the headers there they include), on the compilation database
# of the build that tests/run.sh made (build/, or the directory given as
# $1), in one clang-tidy parse a file. Fails on any finding:
# - clang's -Wthread-safety: every ABSL_GUARDED_BY / REQUIRES annotation holds;
# - the root .clang-tidy: no function over 80 lines, and the bugprone and
#   performance checks it names.
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"

bash deploy/install-deps.sh clang clang-tidy
[ -f "$build/compile_commands.json" ] || { echo "lint: no $build/compile_commands.json; run tests/run.sh first" >&2; exit 2; }
python3 tests/lint.py "$build"
