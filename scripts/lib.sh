# Sourced by the sitting scripts (same-client, capacity-sweep, overload, perf-shake,
# broadcast-beside), which set `port`, `admin`, `secret` and `conns` first.
#
# bench_serve LOG COMMAND...: runs COMMAND — a hongbao binary and `serve` with its own
# arguments (a data dir, perhaps more), perhaps behind `taskset` — with the bench's
# settings: 127.0.0.1:$port, admin 127.0.0.1:$admin, $secret, --connections $conns,
# --max-queue-ms 200, --max-shake-qps MAX_SHAKE_QPS (100000); its output to LOG. Prints
# its pid once it says it is ready. Not this shell's child when called as $(...): wait
# for it to be gone by its pid.
bench_serve() {
  local log=$1; shift
  "$@" --listen "127.0.0.1:$port" --admin "127.0.0.1:$admin" --secret "$secret" \
    --connections "$conns" --max-queue-ms 200 --max-shake-qps "${MAX_SHAKE_QPS:-100000}" \
    > "$log" 2>&1 &
  local pid=$!
  for _ in $(seq 100); do grep -q "hongbao serve ready" "$log" && break; sleep 0.2; done
  echo "$pid"
}
