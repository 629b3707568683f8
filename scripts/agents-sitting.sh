#!/usr/bin/env bash
# Load agents, measured (issue 45; docs/BENCHMARKS.md, "Load agents"). One sitting on this
# machine's release build:
#
#   cpu      the same bench (CONNS connections, one phase of QPS shakes/s, about 20 s)
#            with its load on 2 local client processes, then on 2 agents the bench starts,
#            alternated round by round: the load's CPU per request (its clients' own CPU
#            from their reports, plus the agents' relay processes' CPU; requests = shakes,
#            opens and logins sent), and the ratio agents / local.
#   hundred  100 agents (processes here, 100 users each at a low rate) join a bench, run
#            two phases and report: how long they took to join, how long their last
#            reports took after the stop, the bench process's CPU over the load's run per
#            agent-second; and the same bench on 2 local client processes for the bench's
#            CPU without agents.
#
#   scripts/agents-sitting.sh [ROUNDS] [WHAT...]      (release build)
#
# WHAT: cpu and/or hundred (default both). CONNS (20000) and QPS (20000) size the cpu part.
# Prints one line a measurement.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
shift || true
what=${*:-cpu hundred}
hb=$PWD/target/release/hongbao
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
conns=${CONNS:-20000}
qps=${QPS:-20000}

# The load's CPU (ms) and requests of a bench's summary.json, and its figures per request.
load_cost() {
  python3 - "$1" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
t = s["load"]["totals"]
clients_ms = s["resources"]["load_cpu_seconds"] * 1000
relay_ms = sum(a["relay_cpu_ms"] for a in (s.get("agents") or {}).get("agents", []))
requests = t["shakes_sent"] + t["opens_sent"] + t["logins"]
audit = "ok" if s["audit"]["ok"] else "FAILED"
print(f"clients_cpu_ms={clients_ms:.0f} relay_cpu_ms={relay_ms} requests={requests} "
      f"cpu_per_request_us={(clients_ms + relay_ms) * 1000 / requests:.2f} audit={audit}")
EOF
}

if [[ " $what " == *" cpu "* ]]; then
  packets=$((qps * 20 / 10))
  for r in $(seq "$rounds"); do
    for how in local agents; do
      case $how in
        local) extra=(--procs 2) ;;
        agents) extra=(--agents 2 --spawn-agents) ;;
      esac
      out=$work/cpu-$how-$r
      "$hb" bench --connections "$conns" --phase-qps "$qps" --shake-packets "$packets" \
        --send-packets 200 --campaign-rate 1000 "${extra[@]}" --out "$out" > "$out.log" 2>&1 ||
        { echo "cpu $how round $r: the bench failed (tail of $out.log):"; tail -5 "$out.log"; continue; }
      echo "cpu round=$r how=$how $(load_cost "$out/summary.json")"
    done
  done
fi

if [[ " $what " == *" hundred "* ]]; then
  for r in $(seq "$rounds"); do
    for how in agents local; do
      case $how in
        agents) extra=(--agents 100 --spawn-agents --agent-join-secs 120) ;;
        local) extra=(--procs 2) ;;
      esac
      out=$work/hundred-$how-$r
      "$hb" bench --connections 10000 --phase-qps 1000,2000 --shake-packets 400 \
        --send-packets 100 --campaign-rate 200 "${extra[@]}" --out "$out" > "$out.log" 2>&1 ||
        { echo "hundred $how round $r: the bench failed (tail of $out.log):"; tail -5 "$out.log"; continue; }
      python3 - "$out/summary.json" "$how" "$r" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
how, r = sys.argv[2], sys.argv[3]
a = s.get("agents") or {"agents": [], "lost": [], "offset_max_us": 0}
c = s["load"]["coordinator"]
n = len(a["agents"]) or s["load"]["procs"]
print(f"hundred round={r} how={how} slices={n} lost={len(a['lost'])} "
      f"join_ms={c['join_ms']} final_reports_ms={c['final_reports_ms']} run_ms={c['run_ms']} "
      f"bench_cpu_ms={c['cpu_ms']} bench_cpu_per_slice_second_us={c['cpu_ms'] * 1000 / (n * c['run_ms'] / 1000):.1f} "
      f"offset_max_us={a['offset_max_us']} audit={'ok' if s['audit']['ok'] else 'FAILED'}")
EOF
    done
  done
fi
