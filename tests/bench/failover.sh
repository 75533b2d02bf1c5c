#!/usr/bin/env bash
# failover_seconds: from a server's kill (-9, never started again) to its
# worker training again, with cluster.replicas 2 and no restart: 3 servers
# on loopback, one worker of a synchronous job; server 1 is killed at step
# 100 and its first backup (server 2) takes its ranges over once a majority
# agrees it is gone (server/failover.h). The time is the worker's own
# timestamp of its `rejoined` line less the kill's; median of 3 runs.
#   bash tests/bench/failover.sh [LEASE_MS]     (default 2000)
# Prints `RESULT failover_seconds S` and `RESULT failover_lease_ms L`.
set -uo pipefail
cd "$(dirname "$0")/../.."
lease=${1:-2000}
bin=build/bin
out=$(mktemp -d /tmp/segps-failover.XXXXXX)
trap 'kill -9 $(jobs -p) 2> /dev/null; rm -rf "$out"' EXIT
# The replication tests' job (tests/fixtures/replicated_sync.pbtxt) with
# the lease asked for.
sed "s/lease_ms: 2000/lease_ms: $lease/" tests/fixtures/replicated_sync.pbtxt > "$out/job.pbtxt"
seconds_of() { awk -F: '{ printf "%.6f\n", $1 * 3600 + $2 * 60 + $3 }' <<< "$1"; }
wait_for() {  # wait_for FILE TEXT: up to 60 s
  for _ in $(seq 6000); do grep -q -- "$2" "$1" 2> /dev/null && return 0; sleep 0.01; done
  echo "failover: no '$2' in $1" >&2; return 1
}
for run in 1 2 3; do
  ports=$(/usr/bin/python3 -c 'import socket
s=[socket.socket() for _ in range(3)]
[x.bind(("127.0.0.1",0)) for x in s]
print(",".join("127.0.0.1:%d" % x.getsockname()[1] for x in s))')
  IFS=, read -r -a addr <<< "$ports"
  pids=()
  for i in 0 1 2; do
    $bin/segps-server --config "$out/job.pbtxt" --index $i --listen "${addr[$i]}" --servers "$ports" \
      > "$out/server$i.log" 2>&1 &
    pids+=($!)
  done
  for i in 0 1 2; do wait_for "$out/server$i.log" "listening on" || exit 1; done
  $bin/segps-worker --config "$out/job.pbtxt" --segment s --rank 0 --servers "$ports" > "$out/worker.log" 2>&1 &
  worker=$!
  wait_for "$out/worker.log" " step 100/375 " || exit 1
  killed=$(date +%H:%M:%S.%N)
  kill -9 "${pids[1]}"
  wait "$worker" || { echo "failover: the worker failed" >&2; cat "$out/worker.log" >&2; exit 1; }
  rejoined=$(grep -m1 "rejoined at clock" "$out/worker.log" | cut -d' ' -f1)
  [ -n "$rejoined" ] || { echo "failover: the worker never rejoined" >&2; exit 1; }
  grep -q "took over server 1's ranges" "$out/server2.log" || { echo "failover: no take-over" >&2; exit 1; }
  awk -v a="$(seconds_of "$rejoined")" -v b="$(seconds_of "$killed")" 'BEGIN { printf "%.3f\n", a - b }' >> "$out/s.txt"
  kill "${pids[0]}" "${pids[2]}"; wait "${pids[0]}" "${pids[2]}" 2> /dev/null
done
echo "failover (server 1 of 3 killed for good at step 100, lease $lease ms), seconds to training again: $(tr '\n' ' ' < "$out/s.txt")"
echo "RESULT failover_seconds $(sort -g "$out/s.txt" | sed -n 2p)"
echo "RESULT failover_lease_ms $lease"
