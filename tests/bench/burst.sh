#!/usr/bin/env bash
# A burst of 10 server crashes: the teacher job (one worker a segment,
# staleness 0, a checkpoint every 7 clocks) with its 2 servers started by
# hand, so that each is started again at once on its address after every
# kill -9, as often as needed. Ten kills, alternating servers, about 0.8 s
# apart; then the seconds from the last restart (the server listening again)
# to every worker training again (its first "rejoined" line after it), and
# the checkpoints that restart read. The job is long enough to outlast the
# burst; it is stopped once both workers are back.
#
#   bash tests/bench/burst.sh BIN_DIR OUT_DIR
# prints RESULT burst_recovery_seconds S and RESULT burst_read_ms M.
set -uo pipefail
cd "$(dirname "$0")/../.."
bin=$1
out=$2
mkdir -p "$out"
cfg=$out/burst.pbtxt
sed -e 's/epochs: 6 staleness: 2 workers_per_segment: 2/epochs: 100 staleness: 0 workers_per_segment: 1 log_interval_s: 0.05/' \
    -e 's/^training {/checkpoint { every_clocks: 7 }\ntraining {/' deploy/configs/teacher.pbtxt > "$cfg"
declare -a address pid
start_server() {  # start_server I: on its address (a free port the first time)
  local i=$1 log=$out/server$1.log
  : > "$log"
  "$bin/segps-server" --config "$cfg" --index "$i" --listen "${address[$i]:-127.0.0.1:0}" \
    --checkpoint_dir "$out/ckpt$i" >> "$log" 2>&1 &
  pid[$i]=$!
  for _ in $(seq 1 400); do
    grep -q "listening on" "$log" && break
    sleep 0.01
  done
  address[$i]=$(sed -n 's/.*listening on \(.*\)$/\1/p' "$log" | tail -1)
}
start_server 0
start_server 1
servers="${address[0]},${address[1]}"
"$bin/segps-worker" --config "$cfg" --segment relu64 --rank 0 --servers "$servers" > "$out/w0.log" 2>&1 &
w0=$!
"$bin/segps-worker" --config "$cfg" --segment tanh128 --rank 0 --servers "$servers" > "$out/w1.log" 2>&1 &
w1=$!
for _ in $(seq 1 600); do grep -q "epoch 2/100 step" "$out/w0.log" && break; sleep 0.05; done
secs_of_day() { awk -F: '{printf "%.3f\n", $1*3600 + $2*60 + $3}'; }
for k in $(seq 0 9); do
  i=$((k % 2))
  kill -9 "${pid[$i]}" 2> /dev/null
  wait "${pid[$i]}" 2> /dev/null
  cp "$out/server$i.log" "$out/server$i.before$k.log"
  start_server "$i"
  restarted_at=$(date +%H:%M:%S.%N | secs_of_day)
  last=$i
  sleep 0.8
done
# A worker's first rejoin after the last restart: its time of day (log
# lines begin HH:MM:SS.mmm); empty while it has none.
back_at() {
  sed -n 's/^\([0-9:.]*\) W .*rejoined at clock.*/\1/p' "$1" | secs_of_day |
    awk -v b="$restarted_at" '$1 >= b {print; exit}'
}
for _ in $(seq 1 600); do
  [ -n "$(back_at "$out/w0.log")" ] && [ -n "$(back_at "$out/w1.log")" ] && break
  sleep 0.05
done
last_rejoin=$(printf '%s\n%s\n' "$(back_at "$out/w0.log")" "$(back_at "$out/w1.log")" | sort -g | tail -1)
[ -n "$(back_at "$out/w0.log")" ] && [ -n "$(back_at "$out/w1.log")" ] || last_rejoin=""
read_ms=$(sed -n 's/.*restored .* read in \([0-9.]*\) ms.*/\1/p' "$out/server$last.log" | awk '{t+=$1} END{print t+0}')
kill $w0 $w1 "${pid[0]}" "${pid[1]}" 2> /dev/null
wait 2> /dev/null
echo "burst: 10 kills within about 8 s; both workers back at ${last_rejoin:-n/a}, the last restart at $restarted_at (seconds of the day)"
[ -n "$last_rejoin" ] && awk -v a="$last_rejoin" -v b="$restarted_at" 'BEGIN{printf "RESULT burst_recovery_seconds %.3f\n", a - b}'
echo "RESULT burst_read_ms $read_ms"
