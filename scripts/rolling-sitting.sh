#!/usr/bin/env bash
# A rolling upgrade of a lab's gateways under load, measured (issue 52; docs/benchmarks/diary.md,
# "A rolling upgrade of the lab"): `hongbao bench --hosts 3 --standby`
# (cluster mode, PostgreSQL with a synchronous standby, Redis Cluster, nginx in front)
# with USERS connections (15,000: the lab's nginx, two workers under the 20,000-file
# limit, carries about 19,000 clients) shaking at QPS (2,000) a second, every gateway
# upgraded one after another AT seconds into the phase (`--upgrade-at`: SIGTERM drains
# it through nginx to the others, then it starts again on the new binary). Kinds,
# alternated round by round: upgrade (the gateways start on OLD, the binary of the last
# landed commit, and are upgraded to this build) and restart (this build to itself).
#
# For each run, one line from summary.json: connection attempts refused and requests
# answered with an error from the upgrade on, the most users away at a second's end
# (and its share), the seconds until every user was back, each gateway's drain against
# its window and whether every one was within it, the seconds served under 90% of the
# rate asked and the shakes short, the phase's shake p99, and whether the audit and the
# history were exact.
#
#   OLD=/path/to/old/hongbao scripts/rolling-sitting.sh [ROUNDS] [KIND...]   (root; release)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
shift || true
kinds=${*:-upgrade restart}
users=${USERS:-15000}
qps=${QPS:-2000}
at=${AT:-5}
# The phase must outlast the three drains: its shake campaign at 200 packets a second.
packets=${PACKETS:-10000}
hb=$PWD/target/release/hongbao
work=${WORK:-$(mktemp -d)}
mkdir -p "$work"
echo "# rolling sitting: 3 gateways, $users users at $qps shakes/s, upgraded from ${at}s; old ${OLD:-none}; $(nproc) cores; runs in $work"
printf 'kind\tround\trefused\terrors\taway_max\taway_pct\tback_s\tdrains_ms\twindow_ms\tin_window\treduced_s\tshort\tp99_ms\taudit\thistory\n'
for round in $(seq "$rounds"); do
  for kind in $kinds; do
    out="$work/$kind-$round"
    rm -rf "$out"
    from=()
    if [ "$kind" = upgrade ]; then
      [ -x "${OLD:-}" ] || { echo "OLD must name the old build's hongbao binary" >&2; exit 2; }
      from=(--upgrade-from "$OLD")
    fi
    "$hb" bench --hosts 3 --standby --connections "$users" --phase-qps "$qps" \
      --shake-packets "$packets" --send-packets 200 --campaign-rate 200 \
      --upgrade-at "$at" "${from[@]}" --out "$out" > "$out.log" 2>&1 \
      || echo "# $kind-$round: bench exited $? (see $out.log)"
    python3 - "$out/summary.json" "$kind" "$round" "$users" <<'EOF' || echo "# $kind-$round: no summary"
import json, sys
s = json.load(open(sys.argv[1]))
f, kind, rnd, users = s["fault"], sys.argv[2], sys.argv[3], int(sys.argv[4])
rolled = f.get("rolled") or []
away = users - f["logged_in_min"]
p = s["phases"][0]
print("\t".join(str(x) for x in [
    kind, rnd, f["refused_connects"], f["error_replies"], away, f"{100 * away / users:.2f}",
    f.get("reconnected_secs"), "/".join(str(r["drain_ms"]) for r in rolled),
    rolled[0]["drain_window_ms"] if rolled else None,
    len(rolled) == 3 and all(r["drained_in_window"] for r in rolled),
    f["reduced_secs"], f["shakes_short"], p["latency_ms"]["p99"],
    s["audit"]["ok"], s["history"]["ok"]]))
EOF
  done
done
