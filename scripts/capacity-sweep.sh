#!/usr/bin/env bash
# Capacity with the same client (issue 28, item 4): the highest rate the floor's bare-C
# open-loop client holds at CONNS connections with p99 <= P99_MS and under 0.1% of its
# shakes answered `overloaded` (or not answered), in steps of STEP shakes a second — for
# the floor's echo server and for `hongbao serve` (no campaign, the bench's settings),
# alternated at each rate. A server's sweep stops at its first failing step.
#
#   scripts/capacity-sweep.sh [CONNS] [FROM] [TO] [STEP] [SECS] [BINARY]  (root; release build)
#   defaults: 200000 40000 90000 5000 20 target/release/hongbao;  P99_MS=50 in the environment
#
# Prints each step's result line (the floor's run.sh) with "pass" or "fail", then
#   capacity: floor F/s hongbao H/s ratio R
# where a server that failed its first step has capacity 0.
set -euo pipefail
cd "$(dirname "$0")/.."
conns=${1:-200000} from=${2:-40000} to=${3:-90000} step=${4:-5000} secs=${5:-20}
bin=${6:-$PWD/target/release/hongbao}
p99_max=${P99_MS:-50}
floor=${FLOOR:-../shared/floor/run.sh}
port=7180 admin=7181 secret=capacity-sweep-secret
echo "7180-7181,8900" > /proc/sys/net/ipv4/ip_local_reserved_ports

. scripts/lib.sh

# pass|fail for one result line: p99 within the bound, and what was not answered, or
# answered `overloaded`, under 0.1% of what was sent.
judge() {
  awk -v max="$p99_max" '{
    for (i = 1; i < NF; i++) v[$i] = $(i + 1)
    sent = v["sent/s"]; replies = v["replies/s"]; p99 = v["p99_ms"]; ov = v["overloaded"] + 0
    secs = '"$secs"'
    lost = (sent - replies) * secs + ov
    ok = p99 <= max && lost < 0.001 * sent * secs
    print (ok ? "pass" : "fail")
  }'
}

floor_cap=0 hb_cap=0 floor_on=1 hb_on=1
for (( rate = from; rate <= to; rate += step )); do
  [ $floor_on = 1 ] || [ $hb_on = 1 ] || break
  if [ $floor_on = 1 ]; then
    line=$(FLOOR_PORT=8900 bash "$floor" qps "$conns" "$rate" "$secs" | tail -1)
    verdict=$(echo "$line" | judge)
    echo "$verdict $line"
    if [ "$verdict" = pass ]; then floor_cap=$rate; else floor_on=0; fi
  fi
  if [ $hb_on = 1 ]; then
    dir=$(mktemp -d)
    pid=$(bench_serve "$dir/data.log" "$bin" serve --data-dir "$dir/data")
    line=$(HB_PORT=$port HB_SECRET=$secret HB_PID=$pid bash "$floor" qps "$conns" "$rate" "$secs" | tail -1)
    kill -INT "$pid"
    for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    rm -rf "$dir"
    verdict=$(echo "$line" | judge)
    echo "$verdict $line"
    if [ "$verdict" = pass ]; then hb_cap=$rate; else hb_on=0; fi
  fi
done
ratio=$(echo "scale=2; if ($floor_cap > 0) $hb_cap / $floor_cap else 0" | bc)
echo "capacity: floor $floor_cap/s hongbao $hb_cap/s ratio $ratio (conns $conns, p99 <= $p99_max ms, under 0.1% overloaded or unanswered, steps of $step/s)"
