# Sourced by the sitting scripts (same-client, capacity-sweep, overload, perf-shake,
# broadcast-beside, ledger-sitting, backup-premise); the server helpers need `port`,
# `admin`, `secret` and `conns` set first.
#
# bench_serve LOG COMMAND...: runs COMMAND — a hongbao binary and `serve` with its own
# arguments (a data dir, perhaps more), perhaps behind `taskset` — with the bench's
# server settings as `hongbao bench --print-serve-args` renders them (this checkout's
# release build renders them, whatever binary COMMAND runs): --connections $conns,
# --max-shake-qps MAX_SHAKE_QPS (100000), --broadcast-yield-ms YIELD (0) and the bench's
# defaults for the rest; then 127.0.0.1:$port, admin 127.0.0.1:$admin, $secret. Its
# output to LOG. Prints its pid once it says it is ready. Not this shell's child when
# called as $(...): wait for it to be gone by its pid.
bench_serve() {
  local log=$1; shift
  local settings
  settings=$("$PWD/target/release/hongbao" bench --print-serve-args --connections "$conns" \
    --max-shake-qps "${MAX_SHAKE_QPS:-100000}" --broadcast-yield-ms "${YIELD:-0}") || return 1
  # shellcheck disable=SC2086 # one flag or value a line, none with spaces
  "$@" $settings --listen "127.0.0.1:$port" --admin "127.0.0.1:$admin" --secret "$secret" \
    > "$log" 2>&1 &
  local pid=$!
  for _ in $(seq 100); do grep -q "hongbao serve ready" "$log" && break; sleep 0.2; done
  echo "$pid"
}

# phase_p99s SUMMARY: each phase's p99 of a bench's summary.json, and its audit, on one
# line (the ledger and backup sittings).
phase_p99s() {
  python3 - "$1" <<'EOF_PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(" ".join(f"{p['name']}_p99_ms={p['latency_ms']['p99']:.2f}" for p in s["phases"]),
      "audit=" + ("ok" if s["audit"]["ok"] else "FAILED"))
EOF_PY
}
