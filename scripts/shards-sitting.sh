#!/usr/bin/env bash
# The ledger over shards, measured (issue 54; docs/BENCHMARKS.md, "Shards"). One sitting
# of this checkout's release build, on labs of 3 gateway hosts:
#
#   cpu     one shard against two, alternated round by round, at ~500 wins a second
#           (a shake campaign of 500 packets a second, 2,000 shakes a second): the
#           engines' and the gateways' CPU an op (a win or an open), the outbox's lag,
#           the audit and the history.
#   four    four shards at a low rate (100 packets a second): the same line.
#   fault   two shards, shard 0's primary lost with its disk 8 s into the phase: how each
#           shard's wins went through it, when shard 0 committed again.
#   freeze  two shards without a standby, shard 1's PostgreSQL frozen 20 s from 8 s into
#           the phase (shard-freeze:1): how shard 0's wins went through it.
#   lost1   two shards, each a formation (--standby), shard 1's primary lost with its
#           disk 8 s in (primary-lost:1), the campaign at FAULT_RATE packets a second
#           (default 500): how shard 0's wins went through it, when shard 1 committed
#           again.
#
#   scripts/shards-sitting.sh [ROUNDS]      (root; release build)
#   PARTS="cpu four fault freeze lost1" (the default: all) picks the parts, in that order.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
parts=" ${PARTS:-cpu four fault freeze lost1} "
fault_rate=${FAULT_RATE:-500}
hb=$PWD/target/release/hongbao
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
load="--connections 2000 --workers 1 --procs 2 --phase-qps 2000 --send-packets 300"

line() { # HOW SUMMARY
  python3 - "$@" <<'EOF_PY'
import json, sys
how, path = sys.argv[1], sys.argv[2]
s = json.load(open(path))
e = s["engines"]
ops = e["wins"] + e["opens"]
gw = s["resources"]["server_cpu_seconds"]
o = e.get("outbox") or {}
print(how, f"ops={ops}", f"engines_cpu_s={e['cpu_seconds']:.2f}", f"gateways_cpu_s={gw:.2f}",
      f"engines_us_per_op={e['cpu_seconds'] / ops * 1e6:.0f}",
      f"gateways_us_per_op={gw / ops * 1e6:.0f}",
      f"outbox_credits={o.get('credits', 0)}", f"outbox_p50_ms={o.get('lag_p50_ms', 0)}",
      f"outbox_p99_ms={o.get('lag_p99_ms', 0)}", f"outbox_waiting={o.get('waiting', 0)}",
      "audit=" + ("ok" if s["audit"]["ok"] else "FAILED"),
      "history=" + ("ok" if s["history"]["ok"] else "FAILED"))
f = s.get("fault")
if f:
    for sh in f.get("shards", []):
        print(f"  shard={sh['shard']} before_per_s={sh['before_per_sec']} min_per_s={sh['min_per_sec']}"
              f" min_ratio={sh['min_ratio']:.2f} window_s={sh['window_secs']}")
    print("  " + f["what"])
EOF_PY
}

part() { [[ "$parts" == *" $1 "* ]]; }
part cpu && for r in $(seq "$rounds"); do
  for shards in 1 2; do
    # shellcheck disable=SC2086
    "$hb" bench --hosts 3 --shards "$shards" $load --campaign-rate 500 --shake-packets 15000 \
      --out "$work/cpu-$shards-$r" > "$work/cpu-$shards-$r.log" 2>&1
    line "cpu round=$r shards=$shards" "$work/cpu-$shards-$r/summary.json"
  done
done
part four && for r in $(seq "$rounds"); do
  # shellcheck disable=SC2086
  "$hb" bench --hosts 3 --shards 4 $load --campaign-rate 100 --shake-packets 3000 \
    --out "$work/four-$r" > "$work/four-$r.log" 2>&1
  line "four round=$r shards=4" "$work/four-$r/summary.json"
done
part fault && for r in $(seq "$rounds"); do
  # shellcheck disable=SC2086
  "$hb" bench --hosts 3 --shards 2 $load --campaign-rate 500 --shake-packets 15000 \
    --fault primary-lost --fault-at 8 --out "$work/fault-$r" > "$work/fault-$r.log" 2>&1
  line "fault round=$r shards=2" "$work/fault-$r/summary.json"
done
part freeze && for r in $(seq "$rounds"); do
  # shellcheck disable=SC2086
  "$hb" bench --hosts 3 --shards 2 $load --campaign-rate 500 --shake-packets 20000 \
    --fault shard-freeze:1 --fault-at 8 --out "$work/freeze-$r" > "$work/freeze-$r.log" 2>&1
  line "freeze round=$r shards=2" "$work/freeze-$r/summary.json"
done
part lost1 && for r in $(seq "$rounds"); do
  # shellcheck disable=SC2086
  "$hb" bench --hosts 3 --shards 2 --standby $load --campaign-rate "$fault_rate" \
    --shake-packets $((fault_rate * 40)) --fault primary-lost:1 --fault-at 8 \
    --out "$work/lost1-$r" > "$work/lost1-$r.log" 2>&1
  line "lost1 round=$r shards=2 rate=$fault_rate" "$work/lost1-$r/summary.json"
done
true
