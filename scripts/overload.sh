#!/usr/bin/env bash
# Overload that keeps serving (issue 28, item 6): the floor's bare-C open-loop client —
# which never backs off — against `hongbao serve` (no campaign, the bench's settings), and
# what the server serves each second, read from its /v1/stats.
#
#   scripts/overload.sh steady CONNS RATE SECS [BINARY [SERVE_ARG...]]
#       RATE for SECS seconds (e.g. 1.5x the capacity scripts/capacity-sweep.sh found)
#   scripts/overload.sh stall CONNS RATE SECS [BINARY [SERVE_ARG...]]
#       the same, and STALL_AT (30) seconds into the load every worker is stopped for
#       STALL_SECS (2) seconds (SIGSTOP, then SIGCONT): a stall of the whole machine
#
# Prints one line a second (t from the load's start: served = answered `nothing` or
# claimed a win, overloaded), the client's result line (run.sh), and a summary: with
# CAP=<capacity/s> in the environment, how many of the seconds after the first 10 (after
# the stall's end + 10 in stall mode) served at least 0.9x CAP, and the least served.
# root; release build; BINARY defaults to target/release/hongbao.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=$1 conns=$2 rate=$3 secs=$4
bin=${5:-$PWD/target/release/hongbao}
shift $(( $# < 5 ? $# : 5 ))
stall_at=${STALL_AT:-30} stall_secs=${STALL_SECS:-2} cap=${CAP:-0}
floor=${FLOOR:-../shared/floor/run.sh}
port=7180 admin=7181 secret=overload-secret
echo "7180-7181,8900" > /proc/sys/net/ipv4/ip_local_reserved_ports
dir=$(mktemp -d)
. scripts/lib.sh
pid=$(bench_serve "$dir/serve.log" "$bin" serve --data-dir "$dir/data" "$@")
cleanup() { kill -INT "$pid" 2>/dev/null || true
            for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
            rm -rf "$dir"; }
trap cleanup EXIT

# The load starts where run.sh starts it: 10 s + one per 20,000 connections from now.
start=$(( $(date +%s) + 10 + conns / ${CONNECT_PER_SEC:-20000} ))
HB_PORT=$port HB_SECRET=$secret HB_PID=$pid bash "$floor" qps "$conns" "$rate" "$secs" > "$dir/client" &
client=$!

# t served overloaded, once a second, from the totals' differences.
python3 - "$start" "$secs" "$mode" "$stall_at" "$stall_secs" "$cap" "$admin" > "$dir/series" <<'PY' &
import json, os, signal, sys, time, urllib.request
start, secs, mode, stall_at, stall_secs, cap, admin = (int(sys.argv[1]), int(sys.argv[2]),
    sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6]), sys.argv[7])
def stats():
    with urllib.request.urlopen(f"http://127.0.0.1:{admin}/v1/stats", timeout=5) as r:
        return json.load(r)
while time.time() < start:
    time.sleep(0.05)
prev, stalled = None, False
# Read half a second off the whole seconds: the workers report their counts to /v1/stats
# at their ticks, just after each whole second, and a read there saw one second's
# report or two, by chance (one second low, the next high).
for t in range(secs + 1):
    while time.time() < start + t + 0.5:
        time.sleep(0.01)
    if mode == "stall" and t == stall_at and not stalled:
        pids = [w["pid"] for w in stats()["workers"]]
        for p in pids: os.kill(p, signal.SIGSTOP)
        time.sleep(stall_secs)
        for p in pids: os.kill(p, signal.SIGCONT)
        stalled = True
        print(f"# stalled every worker ({len(pids)}) for {stall_secs} s at t={t}", flush=True)
    try:
        tot = stats()["totals"]
    except Exception:
        continue
    now = (time.time() - start, tot.get("shakes_nothing", 0) + tot.get("shakes_won_claimed", 0),
           tot.get("shakes_overloaded", 0))
    if prev:
        dt = now[0] - prev[0]
        print(f"{t} {(now[1]-prev[1])/dt:.0f} {(now[2]-prev[2])/dt:.0f}", flush=True)
    prev = now
PY
poller=$!
wait "$client" || true
wait "$poller" || true
echo "t served/s overloaded/s"
cat "$dir/series"
cat "$dir/client"
from=10
[ "$mode" = stall ] && from=$(( stall_at + stall_secs + 10 ))
awk -v from="$from" -v cap="$cap" '
  /^#/ { next }
  $1 + 0 >= from { n++; if (min == "" || $2 < min) min = $2; if (cap > 0 && $2 >= 0.9 * cap) ok++ }
  END { printf "summary: %d seconds from t=%d, least served %s/s", n, from, min
        if (cap > 0) printf ", %d of them at least 0.9 x %d/s", ok, cap
        printf "\n" }' "$dir/series"
