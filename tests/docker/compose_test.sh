#!/usr/bin/env bash
# The compose cluster for real, over mutual TLS with tokens (certificates made
# by make-certs.sh, mounted as secrets): builds the image, checks that it
# holds no key or token and that the servers refuse a plaintext client, trains the walk-through and
# the teacher config in containers, checks the evaluation's accuracy against
# the local run's bars, then kills a worker container and a server's
# process mid-run in a third round and checks that training completes with
# its bar (the server restarted by Docker, restoring its checkpoint), and in a
# fourth trains the teacher chain (3 stages x 2 replicas, profile chain), its
# stage links over mutual TLS too. Tears everything down whatever happens. Exit 77 (skipped) when no Docker engine runs here:
# run deploy/docker-setup.sh first.
set -uo pipefail
cd "$(dirname "$0")/../../deploy"

if ! docker info > /dev/null 2>&1; then
  echo "SKIPPED: no Docker engine on this machine (bash deploy/docker-setup.sh starts one)"
  exit 77
fi
if ! docker image inspect debian:bookworm > /dev/null 2>&1; then
  echo "SKIPPED: no debian:bookworm base image (bash deploy/docker-setup.sh builds one)"
  exit 77
fi
if ! smoke=$(docker run --rm debian:bookworm true 2>&1); then
  echo "SKIPPED: this Docker engine cannot run containers here: $smoke"
  exit 77
fi
if docker compose version > /dev/null 2>&1; then compose=(docker compose); else compose=(docker-compose); fi
project="segpstest$$"
image="segps:test$$"
# To stderr: fail is called inside $(finish) too, whose stdout is captured.
fail() { echo "FAIL: $*" >&2; exit 1; }
# logs SERVICE...: the last lines of each service's containers, for a failure.
logs() {
  local s c
  for s in "$@"; do
    for c in $("${compose[@]}" -p "$project" ps -a -q "$s"); do
      echo "-- $s ($c):" >&2
      docker logs "$c" 2>&1 | tail -n 15 >&2
    done
  done
}
down() { "${compose[@]}" -p "$project" --profile monitoring --profile chain down -v --remove-orphans > /dev/null 2>&1; }
long=""
certs=$(mktemp -d /tmp/segps-certs.XXXXXX)
cleanup() {
  down
  [ -n "$long" ] && rm -f "$long"
  rm -rf "$certs"
  docker image rm "$image" > /dev/null 2>&1
}
trap cleanup EXIT

echo "== building $image"
docker build -q -f Dockerfile -t "$image" .. > /dev/null 2>&1 || fail "docker build"

docker build -q -t segps-prometheus:latest prometheus > /dev/null 2>&1 || fail "docker build prometheus"
secrets=$(docker run --rm --entrypoint find "$image" / -xdev \( -name '*.key' -o -name '*.token' -o -name tokens \) 2>/dev/null)
[ -z "$secrets" ] || fail "the image holds keys or tokens: $secrets"
stages="stage0-r0 stage0-r1 stage1-r0 stage1-r1 stage2-r0 stage2-r1"
bash make-certs.sh --container "$certs/job" server0 server1 $stages > /dev/null || fail "make-certs.sh"
export SEGPS_CERTS="$certs/job"

# up CONFIG WORKERS [compose options]: starts a cluster in the background.
up() {
  local config=$1 workers=$2
  shift 2
  SEGPS_IMAGE="$image" SEGPS_CONFIG="$config" SEGPS_WORKERS="$workers" SEGPS_PROMETHEUS_PORT=0 \
    "${compose[@]}" -p "$project" "$@" up -d --no-build > /dev/null 2>&1 || fail "compose up $config"
}
cid() { "${compose[@]}" -p "$project" ps -q "$1" | head -n "${2:-1}" | tail -n 1; }

# finish: waits for the evaluation, prints it, echoes its ensemble accuracy (percent).
finish() {
  local eval_id
  eval_id=$(cid eval)
  [ -n "$eval_id" ] || fail "no eval container"
  local code
  code=$(timeout 600 docker wait "$eval_id") || {
    logs server0 server1 worker-seg0 worker-seg1 $stages eval
    fail "evaluation did not finish in 600 s"
  }
  docker logs "$eval_id" 2>&1 | grep -E "segment|ENSEMBLE|chance" >&2
  [ "$code" = "0" ] || { docker logs "$eval_id" >&2; fail "evaluation exited $code"; }
  docker logs "$eval_id" 2>&1 | sed -n 's/^ENSEMBLE.* accuracy *\([0-9.]*\)%.*/\1/p'
}

echo "== $(date -u +%T) round 1: the walk-through (random labels: chance accuracy expected)"
up ./configs/seed.pbtxt 1
acc=$(finish) || exit 1
awk -v a="$acc" 'BEGIN { exit !(a > 5 && a < 16) }' || fail "seed ensemble accuracy $acc% outside (5, 16)"
echo "seed ensemble accuracy $acc%"
for s in server0 server1; do
  health=$(docker inspect --format '{{.State.Health.Status}}' "$(cid $s)")
  [ "$health" = "healthy" ] || fail "$s is $health"
done
# The servers speak TLS only: a plaintext client gets no answer.
if docker exec "$(cid server0)" segps-health --address 127.0.0.1:7000 > /dev/null 2>&1; then
  fail "server0 answered a plaintext health check"
fi
echo "servers healthy over mutual TLS with tokens; a plaintext client is refused"
# Each container has a network namespace of its own: the servers offer no
# shared region, and the workers' tensors go over TCP (cluster.shared_memory).
worker_log=$(docker logs "$(cid worker-seg0)" 2>&1)
grep -q "tensors over TCP" <<< "$worker_log" || fail "worker-seg0 did not say its tensors go over TCP"
if grep -q "through shared memory" <<< "$worker_log"; then fail "worker-seg0 used shared memory across containers"; fi
echo "workers in containers of their own send their tensors over TCP"
down

echo "== $(date -u +%T) round 2: the teacher config, 2 workers per segment, with the monitoring profile"
up ./configs/teacher.pbtxt 2 --profile monitoring
acc=$(finish) || exit 1
awk -v a="$acc" 'BEGIN { exit !(a > 90) }' || fail "teacher ensemble accuracy $acc% not above 90"
echo "teacher ensemble accuracy $acc%"
# The Prometheus server has scraped both servers' real metrics (it scrapes every 5 s).
prom=$(cid prometheus)
scraped=""
for _ in $(seq 1 30); do
  scraped=$(docker exec "$prom" promtool query instant http://localhost:9090 \
    'count(segps_server_pushes_total{segment="relu64"} > 0)' 2>/dev/null | sed -n 's/.*=> \([0-9]*\) @.*/\1/p')
  [ "$scraped" = "2" ] && break
  sleep 2
done
[ "$scraped" = "2" ] || fail "Prometheus did not scrape both servers' push counters (got '$scraped')"
echo "prometheus scraped both servers"
"${compose[@]}" -p "$project" --profile monitoring down -v > /dev/null 2>&1
down

echo "== $(date -u +%T) round 3: teacher again (30 epochs, so that the kills land mid-run), a worker container and a server killed"
long=$(mktemp /tmp/segps-teacher-long.XXXXXX)
sed 's/epochs: 6 /epochs: 30 /' configs/teacher.pbtxt > "$long"
grep -q "epochs: 30 " "$long" || fail "could not lengthen the teacher config"
chmod 644 "$long"  # the containers run as another user
up "$long" 2
victim=$(cid worker-seg0 2)
# grep exits at the first progress line; without pipefail the pipeline's status is grep's.
(set +o pipefail; timeout 300 docker logs -f "$victim" 2>&1 | grep -m1 -q "step") || fail "worker never made progress"
docker kill "$victim" > /dev/null || fail "docker kill"
echo "killed $victim"
# Then server1 dies as a crash would (its process killed from outside, not
# stopped through Docker): Docker restarts it, it restores its checkpoint
# from its volume, and the workers roll back to it and go on.
server=$(cid server1)
pid=$(docker inspect --format '{{.State.Pid}}' "$server")
[ -n "$pid" ] && [ "$pid" != "0" ] || fail "no pid for server1"
kill -9 "$pid" || fail "kill server1"
echo "killed server1's process $pid"
acc=$(finish) || exit 1
restarts=$(docker inspect --format '{{.RestartCount}}' "$server")
[ "$restarts" -ge 1 ] || fail "server1 was not restarted (RestartCount $restarts)"
# grep -c reads the whole log (grep -q would stop early, and pipefail would see docker logs' SIGPIPE).
restored=$(docker logs "$server" 2>&1 | grep -c "restored relu64")
[ "$restored" -ge 1 ] || { docker logs "$server" 2>&1 | tail -20 >&2; fail "server1 did not restore its checkpoint"; }
awk -v a="$acc" 'BEGIN { exit !(a > 90) }' || fail "ensemble accuracy $acc% not above 90 after the kills"
echo "training completed after the kills (server1 restarted $restarts times, restored its checkpoint); ensemble accuracy $acc%"
down

echo "== $(date -u +%T) round 4: the teacher chain, 3 stages x 2 replicas (profile chain, no ensemble workers), stage1-r0 killed mid-run"
sed 's/epochs: 6 /epochs: 12 /' configs/teacher_chain.pbtxt > "$long"
grep -q "epochs: 12 " "$long" || fail "could not lengthen the teacher chain config"
up "$long" 0 --profile chain
victim=$(cid stage2-r0)
(set +o pipefail; timeout 300 docker logs -f "$victim" 2>&1 | grep -m1 -q "step") || fail "the chain never made progress"
stage=$(cid stage1-r0)
pid=$(docker inspect --format '{{.State.Pid}}' "$stage")
[ -n "$pid" ] && [ "$pid" != "0" ] || fail "no pid for stage1-r0"
kill -9 "$pid" || fail "kill stage1-r0"
echo "killed stage1-r0's process $pid"
acc=$(finish) || exit 1
restarts=$(docker inspect --format '{{.RestartCount}}' "$stage")
[ "$restarts" -ge 1 ] || fail "stage1-r0 was not restarted (RestartCount $restarts)"
for s in $stages; do
  code=$(docker inspect --format '{{.State.ExitCode}}' "$(cid "$s")")
  [ "$code" = "0" ] || { docker logs "$(cid "$s")" 2>&1 | tail -20 >&2; fail "$s exited $code"; }
done
awk -v a="$acc" 'BEGIN { exit !(a > 90) }' || fail "chain accuracy $acc% not above 90"
echo "every stage finished (stage1-r0 restarted $restarts times); the chain's accuracy $acc%"
down
echo "PASS"
