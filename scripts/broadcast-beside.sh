#!/usr/bin/env bash
# Broadcasts beside shakes, with the floor's C client (docs/benchmarks/diary.md, issue 28
# item 7): CONNS connections shaking at RATE a second for SECS seconds, and a broadcast to
# 20,000 connections every 5 s from 3 s into the load (seven in all).
#
#   scripts/broadcast-beside.sh MODE [BINARY]      (root; release build)
#
#   floor-none    the floor's echo server, no broadcast
#   floor         the same, and the floor's broadcast server (bcast_srv: one 16-byte
#                 message to every connection it holds, at once) writing to a separate
#                 20,000 connections of its own client (bcast_cli) every 5 s
#   hongbao-none  `hongbao serve` (BINARY, default target/release/hongbao) with the
#                 bench's settings, no broadcast
#   hongbao       the same, and `POST /v1/broadcast` every 5 s: the message goes to the
#                 20,000 connections that shake
#   hongbao-fb    hongbao-none, and the floor's broadcast beside it as in `floor`
#
# Environment: CONNS (20000), RATE (30000), SECS (40), YIELD (the server's
# --broadcast-yield-ms; `hongbao bench` sets 3; unset: the server's default, off).
# Prints run.sh's result line (p50/p99/p99.9 of the shakes from their intended send
# time, the server's CPU per request), and for the floor's broadcasts the time each of
# its two clients took to receive each one, in ms.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=$1
bin=${2:-$PWD/target/release/hongbao}
floor_dir=${FLOOR_DIR:-../shared/floor}
conns=${CONNS:-20000} rate=${RATE:-30000} secs=${SECS:-40}
port=7180 admin=7181 secret=s
. scripts/lib.sh
work=$(mktemp -d)
echo "7180-7181,8900-8901" > /proc/sys/net/ipv4/ip_local_reserved_ports
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; sleep 2; rm -rf "$work"; }
trap cleanup EXIT

# The floor's broadcast: two servers on port 8901, two clients of 10,000 connections
# from 127.0.210.1-2 (run.sh's clients use 127.0.200.x).
floor_broadcast_start() {
  gcc -O2 -o "$work/bcast_srv" "$floor_dir/bcast_srv.c"
  gcc -O2 -o "$work/bcast_cli" "$floor_dir/bcast_cli.c"
  for _ in 1 2; do "$work/bcast_srv" 8901 & pids+=($!); done
  sleep 1
  for i in 1 2; do "$work/bcast_cli" 127.0.210.$i 8901 10000 > "$work/bcast.$i" 2>/dev/null & pids+=($!); done
  sleep 4
}
# run.sh's clients start shaking at the whole second `start` (its own formula): the
# first broadcast 3 s after, then every 5 s. Call just before run.sh.
every_5s_from_load_start() { # COMMAND...
  local start=$(( $(date +%s) + 10 + conns / 20000 ))
  ( sleep $(( start - $(date +%s) + 3 )); for _ in $(seq 7); do "$@"; sleep 5; done ) &
  fire=$!
}
fire=
floor_broadcast_print() {
  echo "floor broadcast ms, client 1 and 2: $(paste -d/ <(cut -d' ' -f2 "$work/bcast.1") \
    <(cut -d' ' -f2 "$work/bcast.2") | tr '\n' ' ')"
}
case $mode in
floor|floor-none)
  if [ "$mode" = floor ]; then
    floor_broadcast_start
    every_5s_from_load_start kill -USR1 "${pids[0]}" "${pids[1]}"
  fi
  FLOOR_PORT=8900 bash "$floor_dir/run.sh" qps "$conns" "$rate" "$secs"
  [ -z "$fire" ] || wait "$fire"
  if [ "$mode" = floor ]; then floor_broadcast_print; fi
  ;;
hongbao|hongbao-none|hongbao-fb)
  [ "$mode" = hongbao-fb ] && floor_broadcast_start
  spid=$(bench_serve "$work/log" "$bin" serve --data-dir "$work/data")
  pids+=($spid)
  case $mode in
    hongbao-fb) every_5s_from_load_start kill -USR1 "${pids[0]}" "${pids[1]}" ;;
    hongbao) every_5s_from_load_start curl -s -XPOST "127.0.0.1:$admin/v1/broadcast" -d '{"text":"x"}' -o /dev/null ;;
  esac
  HB_PORT=$port HB_SECRET=$secret HB_PID=$spid bash "$floor_dir/run.sh" qps "$conns" "$rate" "$secs"
  [ -z "$fire" ] || wait "$fire"
  if [ "$mode" = hongbao-fb ]; then floor_broadcast_print; fi
  echo "hongbao broadcast_delivered: $(curl -s "127.0.0.1:$admin/v1/stats" | python3 -c \
    'import json, sys; print(json.load(sys.stdin)["totals"]["broadcast_delivered"])')"
  ;;
*) echo "usage: broadcast-beside.sh floor|floor-none|hongbao|hongbao-none|hongbao-fb [BINARY]" >&2; exit 2 ;;
esac
