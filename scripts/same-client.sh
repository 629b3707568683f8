#!/usr/bin/env bash
# The same-client sitting (docs/benchmarks/diary.md, issue 28): the floor's bare-C open-loop
# client against the floor's echo server and against `hongbao serve` — without a campaign
# and with a 200/s shake campaign — at CONNS connections and RATE shakes a second, for
# SECS seconds, ROUNDS rounds alternated. One client, several servers: the differences are
# the servers'. Each hongbao server starts on a fresh ledger at nice 0 with the bench's
# settings (--max-queue-ms 200 --max-shake-qps 100000), and the script prints the
# floor's result line for each (non-winning and won shakes' percentiles, the server's CPU
# per request).
#
#   scripts/same-client.sh CONNS RATE [SECS] [ROUNDS] [BINARY...]   (root; release build)
#
# With several BINARYs (default: target/release/hongbao) each round runs each of them,
# in order, so two builds are held against each other in one sitting.
#
# CAMPAIGNS (default "none 200"): which of the two hongbao runs to make each round.
#
# The campaign starts when the client starts shaking (CAMPAIGN_AT=early: when the server
# is up, ~10 s before, so the packets released while the clients log in — ~2,000 at
# 20,000 connections — are all won in the load's first tenth of a second: a burst, not
# 200 a second).
#
# Beside each floor run, the last BINARY's `hongbao ledger-bench` commits 200 wins a
# second through the server's own ledger writer while the echo server is under the same
# load (issue 28: a won shake's p99 is held against that commit's p99 plus the floor's)
# — only when a run with a campaign is asked for: with CAMPAIGNS=none it would only take
# CPU from the floor's run;
# after each hongbao run, the CPU seconds of the serve process's threads (the core's loop
# is the one named after the binary, the ledger writer `ledger`).
#
# On a machine with cores to spare, SERVER_CPUS and LOAD_CPUS (taskset lists, e.g. 0-1
# and 2-15) keep the load off the servers' cores: every server — the floor's echo
# servers, `hongbao serve` and its workers, `ledger-bench` — runs on SERVER_CPUS, the
# client on LOAD_CPUS. Unset, all share the machine, as on our 2-core hosts.
# MAX_SHAKE_QPS (default the bench's 100000): the server's shake cap, for rates above it.
set -euo pipefail
cd "$(dirname "$0")/.."
conns=$1 rate=$2 secs=${3:-20} rounds=${4:-2}
shift $(( $# < 4 ? $# : 4 ))
bins=("$@")
[ ${#bins[@]} -gt 0 ] || bins=("$PWD/target/release/hongbao")
floor=${FLOOR:-../shared/floor/run.sh}
port=7180 admin=7181 secret=same-client-secret
echo "7180-7181,8900" > /proc/sys/net/ipv4/ip_local_reserved_ports
on_servers=() on_load=()
[ -z "${SERVER_CPUS:-}" ] || on_servers=(taskset -c "$SERVER_CPUS")
[ -z "${LOAD_CPUS:-}" ] || on_load=(taskset -c "$LOAD_CPUS")

. scripts/lib.sh

# CPU seconds of each thread of process $1, as "name seconds" pairs
threads() {
  for t in /proc/"$1"/task/*; do
    printf '%s %s ' "$(cat "$t/comm")" "$(cut -d')' -f2 "$t/stat" | awk '{print ($12 + $13) / 100}')"
  done
}

for round in $(seq "$rounds"); do
  # the floor's load starts 10 s + one per 20,000 connections after run.sh does
  [ "${CAMPAIGNS:-none 200}" = none ] || ( sleep $(( 12 + conns / 20000 )); "${on_servers[@]}" "${bins[-1]}" ledger-bench --rate 200 --secs $(( secs * 3 / 4 + 1 )) \
      2>/dev/null | sed "s/^/round $round beside the floor: /" || true ) &
  FLOOR_PORT=8900 "${on_load[@]}" bash "$floor" qps "$conns" "$rate" "$secs" \
    > >(sed "s/^/round $round /") &
  floor_pid=$!
  if [ -n "${SERVER_CPUS:-}" ]; then
    # run.sh starts its echo servers a second after it starts, well before the load
    sleep 3
    for p in $(pgrep -P "$floor_pid" -x echo_srv); do taskset -pc "$SERVER_CPUS" "$p" > /dev/null; done
  fi
  wait
  for bin in "${bins[@]}"; do
    for campaign in ${CAMPAIGNS:-none 200}; do
      dir=$(mktemp -d)
      pid=$(bench_serve "$dir/data.log" "${on_servers[@]}" "$bin" serve --data-dir "$dir/data")
      if [ "$campaign" != none ]; then
        # run.sh's clients start shaking at the whole second `start` (its own formula)
        start=$(( $(date +%s) + 10 + conns / ${CONNECT_PER_SEC:-20000} ))
        [ "${CAMPAIGN_AT:-load}" = early ] && start=0
        ( now=$(date +%s.%N); sleep "$(echo "if ($start > $now) $start - $now else 0" | bc -l)"
          curl -s -XPOST "127.0.0.1:$admin/v1/campaigns/shake" \
            -d "{\"packets\":$(( 200 * (secs + 30 + conns / 20000) )),\"rate_per_sec\":200,\"amount_min\":100,\"amount_max\":500}" > /dev/null ) &
      fi
      HB_PORT=$port HB_SECRET=$secret HB_PID=$pid "${on_load[@]}" bash "$floor" qps "$conns" "$rate" "$secs" \
        | sed "s|^|round $round $(basename "$bin") campaign=$campaign |"
      wait
      echo "round $round $(basename "$bin") campaign=$campaign threads: $(threads "$pid")"
      # Not this shell's child (started in bench_serve's subshell): wait for it to be gone.
      kill -INT "$pid"
      for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
      rm -rf "$dir"
    done
  done
done
