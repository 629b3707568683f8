#!/usr/bin/env bash
# A login storm, measured (issue 51; docs/BENCHMARKS.md, "The festival night over TLS"):
# USERS clients connect and log in all at once (`hongbao load --connect-mode storm --qps 0`,
# each that fails coming back on its own full-jitter back-off) into one `hongbao serve`
# (workers auto), and the seconds until every one is logged in, from the load's progress
# lines. Kinds, alternated round by round:
#
#   plain        binary frames over TCP;
#   tls          the same over TLS (`serve --tls-cert`, the ECDSA P-256 certificate of
#                `hongbao dev-cert`), with the default max_tls_handshakes (its share of 2,048 a core);
#   tls:B        over TLS with max_tls_handshakes B (a sweep); tls:B:Q also with
#                tls_accept_queue_secs Q (B empty: the default).
#
# For each: the time, logins a second, the kernel's accept-queue drops over the storm
# (TcpExt ListenOverflows and ListenDrops, /proc/net/netstat), the server's handshakes
# (full, abandoned, timed out, pauses) and the load's timeouts. Also, once, the ceiling:
# full TLS 1.3 handshakes a second with both ends in one process and no sockets
# (crates/http/examples/tls_handshake_ceiling.rs), one thread and two.
#
#   scripts/storm-sitting.sh [ROUNDS] [KIND...]      (root; release build with examples)
#
# USERS (200000) sizes the storm; the machine's limits are set by `hongbao doctor --apply`.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
shift || true
kinds=${*:-plain tls}
users=${USERS:-200000}
hb=$PWD/target/release/hongbao
ceiling=$PWD/target/release/examples/tls_handshake_ceiling
work=$(mktemp -d)
trap 'kill $(jobs -p) $(cat "$work/pids" 2>/dev/null) 2>/dev/null || true; sleep 1; rm -rf "$work"' EXIT
"$hb" doctor --apply --connections "$users" > /dev/null
"$hb" dev-cert --out "$work/tls" > /dev/null
export HONGBAO_SECRET=storm-sitting-secret-of-32-bytes-and-more

netstat_of() { # TcpExt FIELD from /proc/net/netstat
  awk -v f="$1" '/^TcpExt:/ { if (!n) { for (i = 1; i <= NF; i++) h[i] = $i; n = 1 } else { for (i = 1; i <= NF; i++) if (h[i] == f) print $i } }' /proc/net/netstat
}

storm() { # ROUND KIND
  local dir="$work/$2-$1"; mkdir -p "$dir"
  local extra=() load_extra=() config="$dir/serve.toml"
  : > "$config"
  case "$2" in
    plain) ;;
    tls*)
      extra=(--tls-cert "$work/tls/cert.pem" --tls-key "$work/tls/key.pem")
      load_extra=(--tls-ca "$work/tls/ca.pem")
      IFS=: read -r _ bound queue <<< "$2"
      [ -n "${bound:-}" ] && echo "max_tls_handshakes = $bound" >> "$config"
      [ -n "${queue:-}" ] && echo "tls_accept_queue_secs = $queue" >> "$config"
      ;;
  esac
  "$hb" serve --listen 127.0.0.1:7290 --admin 127.0.0.1:7291 --data-dir "$dir/data" \
    --connections "$users" --max-shake-qps 1000000 --config "$config" "${extra[@]}" \
    > "$dir/serve.log" 2>&1 &
  local s=$!
  echo "$s" >> "$work/pids"
  for _ in $(seq 150); do grep -q "hongbao serve ready" "$dir/serve.log" && break; sleep 0.2; done
  local o0 d0; o0=$(netstat_of ListenOverflows); d0=$(netstat_of ListenDrops)
  local t0; t0=$(date +%s.%N)
  "$hb" load --server 127.0.0.1:7290 --users "$users" --qps 0 --duration 900 \
    --connect-mode storm "${load_extra[@]}" > "$dir/load.log" 2>&1 &
  local l=$!
  local secs=""
  for _ in $(seq 4500); do
    if grep -aq "conns=$users/$users" "$dir/load.log"; then
      secs=$(echo "$(date +%s.%N) - $t0" | bc); break
    fi
    sleep 0.2
  done
  local o1 d1; o1=$(netstat_of ListenOverflows); d1=$(netstat_of ListenDrops)
  local stats; stats=$(curl -s -H "Authorization: Bearer $(cat "$dir/data/admin.key")" \
    https://127.0.0.1:7291/v1/stats --cacert "$work/tls/ca.pem" 2>/dev/null \
    || curl -s -H "Authorization: Bearer $(cat "$dir/data/admin.key")" http://127.0.0.1:7291/v1/stats)
  kill -INT $l 2>/dev/null || true; wait $l 2>/dev/null || true
  kill -INT $s 2>/dev/null || true; wait $s 2>/dev/null || true
  local timeouts; timeouts=$(grep -ao 'timeout=[0-9]*' "$dir/load.log" | tail -1 | cut -d= -f2)
  python3 - "$2" "$1" "${secs:-nan}" "$users" "$((o1 - o0))" "$((d1 - d0))" "${timeouts:-0}" "$stats" <<'PY'
import json, sys
kind, rnd, secs, users, overflows, drops, timeouts, stats = sys.argv[1:9]
t = json.loads(stats or "{}").get("totals", {})
secs = float(secs)
rate = int(users) / secs if secs == secs else 0
print(f"storm {kind} round {rnd}: {users} logged in after {secs:.1f} s ({rate:.0f}/s); "
      f"ListenOverflows {overflows} ListenDrops {drops}; load timeouts {timeouts}; "
      f"server handshakes {t.get('tls_handshakes', 0)} abandoned {t.get('tls_abandoned', 0)} "
      f"timed out {t.get('tls_handshake_timeouts', 0)} pauses {t.get('accept_paused', 0)}")
PY
  sleep 3
}

if [ -x "$ceiling" ]; then
  for threads in 1 2; do "$ceiling" "$threads" 5; done
fi
for round in $(seq "$rounds"); do
  for kind in $kinds; do storm "$round" "$kind"; done
done
