#!/usr/bin/env bash
# Runs ctest in BUILD_DIR with the remaining arguments; when tests fail, it
# ends with what made each fail, so that the last screen of a long run (all
# a CI log may keep) names the cause: googletest's failed checks, sanitizer
# reports and the processes that failed, from ctest's full log.
#   bash tests/ctest.sh BUILD_DIR [ctest arguments...]
set -uo pipefail
build="$1"
shift
ctest --test-dir "$build" --output-on-failure "$@"
rc=$?
[ "$rc" -eq 0 ] && exit 0
log="$build/Testing/Temporary/LastTest.log"
failed="$build/Testing/Temporary/LastTestsFailed.log"
if [ -f "$failed" ] && [ -f "$log" ]; then
  echo "== why each test failed (from $log) =="
  while IFS=: read -r _ name; do
    echo "-- $name"
    # The test's section of the log, from its header to ctest's verdict.
    section=$(awk -v name="$name" '
      $0 ~ "^[0-9]+/[0-9]+ Testing: " && $3 == name { on = 1 }
      on && /^Test (Passed|Failed)|^"[^"]*" end time/ { exit }
      on { print }' "$log")
    grep -E -A2 "Failure$|ERROR: |WARNING: ThreadSanitizer|runtime error|SUMMARY: |failed \(|stopped during|Timeout" \
      <<< "$section" | cut -c1-300 | head -n 24
    # Recoveries in the job it ran: how many, and the first few.
    recoveries=$(grep -cE "rejoined at clock|rolled back|started again mid-job" <<< "$section")
    if [ "$recoveries" -gt 0 ]; then
      echo "   $recoveries lines of recovery in its output; the first:"
      grep -E "rejoined at clock|rolled back|started again mid-job" <<< "$section" | cut -c1-300 | head -n 4
    fi
  done < "$failed"
fi
exit "$rc"
