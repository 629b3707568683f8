#!/usr/bin/env bash
# The ledger's primary lost, again and again (issue 46; docs/BENCHMARKS.md, "The ledger's
# standby"). A chaos bench on a lab of two gateways whose ledger is a PostgreSQL primary
# with a synchronous standby under pg_auto_failover: the primary's host lost with its disk
# (`primary-lost`, or the faults named in FAULTS) every few seconds through a shake
# campaign long enough for LOSSES of them, each healed — a new standby cloned from the new
# primary — before the next. Prints each fault's time to the ledger's first commit after
# it, their median, min and max, and whether nothing acknowledged was lost: the audit,
# the history check, every packet won, every share opened.
#
#   sudo scripts/failover-sitting.sh [LOSSES]       (root: the lab; release build)
#
# FAULTS (default primary-lost), SEED (default 7), OUT (default a temporary directory).
set -euo pipefail
cd "$(dirname "$0")/.."
losses=${1:-10}
faults=${FAULTS:-primary-lost}
seed=${SEED:-7}
hb=$PWD/target/release/hongbao
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
# About 25 s a loss (a gap of 2-6 s, the failover, a new standby cloned): the shake
# campaign at 40 packets a second lasts that long for LOSSES of them.
packets=$((losses * 25 * 40))
"$hb" bench --hosts 2 --standby --connections 1000 --workers 1 --procs 1 \
  --phase-qps 500 --campaign-rate 40 --shake-packets "$packets" --send-packets 400 \
  --chaos "$seed" --chaos-every 4 --chaos-faults "$faults" --out "$out" \
  >"$out/bench.log" 2>&1 || { tail -30 "$out/bench.log"; exit 1; }
python3 - "$out/summary.json" <<'EOF'
import json, statistics, sys
s = json.load(open(sys.argv[1]))
faults = s["chaos"]["faults"]
times = []
for f in faults:
    ms = f.get("first_commit_after_ms")
    print(f"{f['kind']:16} first commit after {ms / 1000 if ms is not None else float('nan'):6.2f} s  {f['what']}")
    if ms is not None:
        times.append(ms / 1000)
print(f"faults={len(faults)} timed={len(times)}", end=" ")
if times:
    print(f"first_commit_s median={statistics.median(times):.2f} min={min(times):.2f} max={max(times):.2f}", end=" ")
print("audit=" + ("ok" if s["audit"]["ok"] else "FAILED"),
      "history=" + ("ok" if s.get("history", {}).get("ok") else "FAILED"),
      f"won={s['shake']['won_server']}/{s['shake']['packets']}",
      f"opened={s['send']['opened_server']}/{s['send']['shares']}")
EOF
echo "out: $out"
