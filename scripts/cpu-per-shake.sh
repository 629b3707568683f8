#!/usr/bin/env bash
# CPU per shake (docs/benchmarks/diary.md, "CPU per shake"): `hongbao serve` and `hongbao load`
# at 15,000 connections and 6,000 shakes/s, against the bare-C floor at the same setting
# and, when GO_SERVER and GO_CLIENT name them, the original Go server and client
# (github.com/xiaojiaqi/10billionhongbaos, built elsewhere: it is not in this tree).
# Each side's CPU is utime+stime of its whole process tree (/proc/PID/stat, every
# thread) over a 30 s window that opens 20 s (Go: 30 s, its users start over 20 s) after
# the clients start; divided by the shakes the window held (6,000/s × its length).
#
#   scripts/cpu-per-shake.sh [ROUNDS] [WHO]   (root for the floor's sysctls; release build)
#
# WHO is any of "hongbao floor go" (default: all; go only with GO_SERVER and GO_CLIENT).
# Prints one line per measurement: who, round, server µs per shake, client µs per shake.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
who=${2:-hongbao floor go}
hb=$PWD/target/release/hongbao
floor=${FLOOR:-../shared/floor/run.sh}
users=15000
rate=6000

# The fixed ports of the three servers: reserved, so that no client connection takes one
# as its source port (the floor widens the ephemeral range to 1024-65535 and resets the
# reserved list to its own port each time it starts). Put back as found at the end.
ports=7190,7191,1025,6060,8002,8989,9090,8900
reserved_before=$(cat /proc/sys/net/ipv4/ip_local_reserved_ports)
trap 'echo "$reserved_before" > /proc/sys/net/ipv4/ip_local_reserved_ports' EXIT
# ...and then wait (60 s at most, TIME-WAIT's length) until no socket the floor's clients
# left behind holds one of them.
reserve() {
  echo $ports > /proc/sys/net/ipv4/ip_local_reserved_ports
  local filter; filter=$(echo $ports | sed 's/\([0-9]*\)/sport = :\1/g; s/,/ or /g')
  for _ in $(seq 61); do
    [ -z "$(ss -Htan "( $filter )")" ] && return
    sleep 1
  done
}

tree() { echo "$1"; for c in $(ps -o pid= --ppid "$1"); do tree "$c"; done; }
ticks() { # utime+stime (clock ticks) of the given processes
  local t=0
  for p in "$@"; do
    [ -r "/proc/$p/stat" ] && t=$((t + $(awk '{sub(/.*\) /, ""); print $12 + $13}' "/proc/$p/stat")))
  done
  echo "$t"
}
# window SERVER_PIDS_CMD CLIENT_PIDS_CMD: the per-shake figures over 30 s.
window() {
  local s0 l0 t0 s1 l1 t1
  s0=$(ticks $($1)); l0=$(ticks $($2)); t0=$(date +%s.%N)
  sleep 30
  s1=$(ticks $($1)); l1=$(ticks $($2)); t1=$(date +%s.%N)
  # A tick is 10 ms (USER_HZ 100): µs per shake = ticks × 10,000 / shakes.
  echo "$s0 $s1 $l0 $l1 $t0 $t1" | awk -v r=$rate '{ n = ($6 - $5) * r;
    printf "server_us %.2f client_us %.2f\n", ($2 - $1) * 10000 / n, ($4 - $3) * 10000 / n }'
}

run_hongbao() {
  reserve
  local dir; dir=$(mktemp -d)
  "$hb" serve --listen 127.0.0.1:7190 --admin 127.0.0.1:7191 --data-dir "$dir" \
    --connections $users > "$dir/serve.log" 2>&1 &
  local s=$!
  sleep 3
  "$hb" load --server 127.0.0.1:7190 --users $users --qps $rate --duration 60 \
    > "$dir/load.log" 2>&1 &
  local l=$!
  sleep 20
  echo "hongbao $1 $(window "tree $s" "tree $l")"
  kill -0 $s 2>/dev/null || { echo "hongbao serve ended early:"; tail -3 "$dir/serve.log"; }
  wait $l || true
  kill $s 2>/dev/null; wait $s || true
  rm -rf "$dir"
}

run_floor() {
  "$floor" qps $users $rate 45 > /dev/null 2>&1 &
  local f=$!
  sleep 20
  echo "floor $1 $(window "pgrep -x echo_srv" "pgrep -x openloop_cli")"
  wait $f || true
}

run_go() {
  reserve
  local logs; logs=$(mktemp -d)
  # The original reports to a monitor it panics without: a local sink stands in.
  python3 -c 'import socket, threading
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 8002)); s.listen(16)
def drain(c):
    while c.recv(65536): pass
while True:
    c, _ = s.accept(); threading.Thread(target=drain, args=(c,), daemon=True).start()' &
  local k=$!
  sleep 0.5
  "$GO_SERVER" -list 1025 -monitor 127.0.0.1:8002 > "$logs/server.log" 2>&1 &
  local s=$!
  sleep 2
  (ulimit -n 20000; exec "$GO_CLIENT" -server 127.0.0.1:1025 -monitor 127.0.0.1:8002 \
    -min 0 -max $((users - 1)) -total $users -qps $rate > "$logs/client.log" 2>&1) &
  local l=$!
  sleep 30
  echo "go $1 $(window "echo $s" "echo $l")"
  kill -0 $s 2>/dev/null || { echo "go server ended early:"; tail -3 "$logs/server.log"; }
  kill -0 $l 2>/dev/null || { echo "go client ended early:"; tail -3 "$logs/client.log"; }
  kill $l $s $k 2>/dev/null; wait $l $s $k 2>/dev/null || true
  rm -rf "$logs"
}

for round in $(seq "$rounds"); do
  for w in $who; do
    case $w in
    hongbao) run_hongbao "$round" ;;
    floor) run_floor "$round" ;;
    go) if [ -n "${GO_SERVER:-}" ]; then run_go "$round"; fi ;;
    *) echo "unknown: $w (hongbao, floor or go)" >&2; exit 2 ;;
    esac
  done
done
