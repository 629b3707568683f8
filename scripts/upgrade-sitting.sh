#!/usr/bin/env bash
# An upgrade in place under load, measured (issue 52; docs/BENCHMARKS.md, "Upgrades
# without a storm"): `hongbao bench` with USERS connections (200,000) shaking at QPS
# (10,000) a second, its one local server upgraded in place AT seconds into the phase
# (`--upgrade-at`: `serve --upgrade` of the same binary, docs/deploy.md), in its own
# network namespace (`--netns`). Kinds, alternated round by round: plain (binary frames
# over TCP) and tls (the same over TLS).
#
# For each run, one line from summary.json: the connection attempts refused, the most
# users away at a second's end (and its share), the seconds until every user was back
# (`reconnected_secs`) against the drain window, the seconds served under 90% of the rate
# asked and the shakes short (the bench judges the 30 s from the upgrade on), the same
# seconds over the whole phase from the upgrade to its last full second (`under90_all`,
# from series.csv: a drain may outlast 30 s), the upgrade's own figures (drained, window,
# drain, commits paused, replayed), the shake p99 of the phase, and whether the audit and
# the history were exact.
#
#   scripts/upgrade-sitting.sh [ROUNDS] [KIND...]      (root; release build)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
shift || true
kinds=${*:-plain tls}
users=${USERS:-200000}
qps=${QPS:-10000}
at=${AT:-10}
# The phase must outlast the upgrade: its shake campaign at 200 packets a second.
packets=${PACKETS:-16000}
hb=$PWD/target/release/hongbao
work=${WORK:-$(mktemp -d)}
mkdir -p "$work"
echo "# upgrade sitting: $users users at $qps shakes/s, upgraded at ${at}s; $(nproc) cores; runs in $work"
printf 'kind\tround\trefused\taway_max\taway_pct\tback_s\twindow_ms\tdrain_ms\tpaused_ms\treplayed\treduced_s\tshort\tunder90_all\tp99_ms\taudit\thistory\n'
for round in $(seq "$rounds"); do
  for kind in $kinds; do
    out="$work/$kind-$round"
    rm -rf "$out"
    extra=()
    [ "$kind" = tls ] && extra=(--tls)
    "$hb" bench --connections "$users" --phase-qps "$qps" --shake-packets "$packets" \
      --send-packets 1000 --campaign-rate 200 --upgrade-at "$at" --netns "${extra[@]}" \
      --out "$out" > "$out.log" 2>&1 || echo "# $kind-$round: bench exited $? (see $out.log)"
    python3 - "$out/summary.json" "$kind" "$round" "$users" "$qps" <<'EOF' || echo "# $kind-$round: no summary"
import csv, json, os, sys
s = json.load(open(sys.argv[1]))
f, kind, rnd, users, qps = s["fault"], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
# Seconds of the phase from the upgrade on (the load's rows named after it), all but the
# last (cut short by the phase's end), whose shakes served fell under 90% of the rate.
load = [r for r in csv.DictReader(open(os.path.join(os.path.dirname(sys.argv[1]), "series.csv")))
        if r["role"] == "load" and r["phase"] == "upgrade"]
under = sum(int(r["won"] or 0) + int(r["nothing"] or 0) < 0.9 * qps for r in load[:-1])
u = f.get("upgrade") or {}
away = users - f["logged_in_min"]
p = s["phases"][1] if len(s["phases"]) > 1 else s["phases"][0]
print("\t".join(str(x) for x in [
    kind, rnd, f["refused_connects"], away, f"{100 * away / users:.2f}",
    f.get("reconnected_secs"), u.get("drain_window_ms"), u.get("drain_ms"),
    u.get("commits_paused_ms"), u.get("replayed_events"), f["reduced_secs"],
    f["shakes_short"], under, p["latency_ms"]["p99"], s["audit"]["ok"], s["history"]["ok"]]))
EOF
  done
done
