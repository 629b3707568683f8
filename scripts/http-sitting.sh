#!/usr/bin/env bash
# The HTTP sitting of docs/benchmarks/diary.md ("The HTTP API and nginx"): hongbao's HTTP shake
# endpoint held against nginx serving a static 200, directly and through nginx, with
# Debian's wrk; hongbao load against wrk as a load generator (CPU per request); latency
# at 50% and 80% of the measured maximum; short connections with and without doctor's
# settings; the memory of an idle HTTP connection. Every measurement runs ROUNDS times, the alternatives alternated in each round.
#
#   scripts/http-sitting.sh [OUT] [ROUNDS] [PARTS]     (root; needs wrk, nginx, curl)
#
# PARTS is any of "wrk cpu latency short memory" (default: all). Release build first:
# `cargo build --release`. FLOOR=../shared/floor/run.sh adds the bare-C floor to the
# latency part. Results: one line per measurement in OUT/results.tsv
# (part, setting, round, figures as name=value), and a summary on standard output.
# The sysctls it changes for the short-connection part are put back when it ends.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:-http-sitting}")
rounds=${2:-3}
parts=${3:-wrk cpu latency short memory}
hb=$PWD/target/release/hongbao
secs=10
mkdir -p "$out"
: > "$out/results.tsv"
for tool in wrk nginx curl; do
  command -v $tool >/dev/null || { echo "$tool is missing (apt-get install $tool)"; exit 1; }
done

pids=()
sysctl_restore=()
cleanup() {
  for p in "${pids[@]}"; do kill -INT "$p" 2>/dev/null || true; done
  for conf in "$out"/ngx-*/nginx.conf; do
    [ -f "$conf" ] && nginx -p "$(dirname "$conf")" -c "$conf" -s stop 2>/dev/null || true
  done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  for s in "${sysctl_restore[@]}"; do sysctl -qw "$s" || true; done
}
trap cleanup EXIT

# Remembers a sysctl's value (the first time only), to be put back at the end.
remember_sysctl() {
  local s
  for s in "${sysctl_restore[@]}"; do [[ "$s" == "$1="* ]] && return; done
  sysctl_restore+=("$1=$(sysctl -n "$1" | tr '\t' ' ')")
}

record() { # part setting round figures...
  local line="$1	$2	$3"; shift 3
  line="$line	$*"
  echo "$line" >> "$out/results.tsv"
  echo "  $line"
}

# ----- the targets: hongbao serve (2 workers), nginx static, nginx proxies -----------
rm -rf "$out/data"
"$hb" serve --workers 2 --listen 127.0.0.1:7000 --admin 127.0.0.1:7001 \
  --http-listen 127.0.0.1:7003 --data-dir "$out/data" --max-shake-qps 1000000 \
  > "$out/serve.out" 2> "$out/serve.err" &
pids+=($!)
until grep -q "ready" "$out/serve.out" 2>/dev/null; do sleep 0.2; done
# nginx A: the static 200 (8090) and the proxy to hongbao (8080); nginx B: a proxy to
# nginx A's static 200 (8081). Two worker processes each, like hongbao's two workers.
"$hb" nginx-conf --static-listen 127.0.0.1:8090 --http-listen 127.0.0.1:8080 \
  --http-upstream 127.0.0.1:7003 --worker-processes 2 --prefix "$out/ngx-a" \
  --out "$out/ngx-a/nginx.conf"
"$hb" nginx-conf --http-listen 127.0.0.1:8081 --http-upstream 127.0.0.1:8090 \
  --worker-processes 2 --prefix "$out/ngx-b" --out "$out/ngx-b/nginx.conf"
nginx -p "$out/ngx-a" -c "$out/ngx-a/nginx.conf"
nginx -p "$out/ngx-b" -c "$out/ngx-b/nginx.conf"
sleep 1
# A shake campaign releasing 200 packets a second all along: some shakes win (and are
# committed to the ledger before their answer), most find nothing, as in the seed.
curl -s -XPOST 127.0.0.1:7001/v1/campaigns/shake \
  -d '{"packets":10000000,"rate_per_sec":200,"amount_min":100,"amount_max":500}' > /dev/null

# wrk's script: POST /v1/shake with the bearer of one of 200 users, in turn. The tokens
# come from the dev secret's /token endpoint.
{
  echo 'local tokens = {'
  for u in $(seq 1 200); do
    curl -s "127.0.0.1:7003/token?user=$u" | sed 's/.*"bearer":"\([^"]*\)".*/  "Bearer \1",/'
    echo
  done
  echo '}'
  cat <<'EOF'
local i = 0
request = function()
  i = i + 1
  return wrk.format("POST", "/v1/shake", { ["Authorization"] = tokens[(i % #tokens) + 1] })
end
EOF
} > "$out/shake.lua"

# wrk [args] URL: "rps=… non2xx=… cpu_s=… requests=…" (cpu: wrk's own user+system).
run_wrk() {
  local text
  text=$( { /usr/bin/time -f "cpu %U %S" wrk "$@" ; } 2>&1 )
  echo "$text" > "$out/last-wrk.txt"
  awk '/Requests\/sec/ { rps = $2 } /requests in/ { n = $1 } /Non-2xx/ { bad = $NF }
       /^cpu / { cpu = $2 + $3 }
       END { printf "rps=%.0f non2xx=%d requests=%d cpu_s=%.2f", rps, bad, n, cpu }' <<< "$text"
}

# A field of hongbao load's final JSON ("name": value).
jfield() { sed -n "s/^ *\"$2\": \([0-9.]*\),\{0,1\}$/\1/p" "$1" | head -1; }

# ----- 1 and 2: wrk against nginx static and the shake endpoint, direct and via nginx ---
if [[ " $parts " == *" wrk "* ]]; then
  echo "wrk -t2 -c100 -d${secs}s, alternated"
  for r in $(seq "$rounds"); do
    record wrk nginx-static "$r" "$(run_wrk -t2 -c100 -d${secs}s http://127.0.0.1:8090/)"
    record wrk hongbao-shake "$r" "$(run_wrk -t2 -c100 -d${secs}s -s "$out/shake.lua" http://127.0.0.1:7003/)"
    record wrk nginx-to-nginx-static "$r" "$(run_wrk -t2 -c100 -d${secs}s http://127.0.0.1:8081/)"
    record wrk nginx-to-hongbao-shake "$r" "$(run_wrk -t2 -c100 -d${secs}s -s "$out/shake.lua" http://127.0.0.1:8080/)"
  done
fi

# ----- 3: CPU per request, wrk and hongbao load at the same rate -----------------------
# wrk is closed-loop: its connection count sets its rate. hongbao load then runs open-loop
# at the rate wrk reached, against the same endpoint, for the same time.
if [[ " $parts " == *" cpu "* ]]; then
  echo "CPU per request: wrk -t1 -cC, then hongbao load at wrk's rate"
  for r in $(seq "$rounds"); do
    for c in 2 8; do
      w=$(run_wrk -t1 -c$c -d${secs}s -s "$out/shake.lua" http://127.0.0.1:7003/)
      record cpu "wrk-c$c" "$r" "$w"
      rate=$(sed 's/.*rps=\([0-9]*\).*/\1/' <<< "$w")
      "$hb" load --transport http --server 127.0.0.1:7003 --users 100 --procs 1 \
        --qps "$rate" --duration $secs > "$out/cpu-load.out" 2> "$out/cpu-load.err"
      n=$(jfield "$out/cpu-load.out" shake_replies)
      cpu=$(jfield "$out/cpu-load.out" cpu_seconds)
      record cpu "hongbao-load-at-wrk-c$c" "$r" "rps=$((n / secs)) requests=$n cpu_s=$cpu"
    done
  done
fi

# ----- 4: latency at 50% and 80% of the maximum (hongbao bench --transport http) -------
if [[ " $parts " == *" latency "* ]]; then
  max=$(awk -F'\t' '$1 == "wrk" && $2 == "hongbao-shake" { split($4, f, " "); sub("rps=", "", f[1]); print f[1] }' \
        "$out/results.tsv" | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }')
  max=${max:-100000}
  half=$((max / 2 / 1000 * 1000)); most=$((max * 8 / 10 / 1000 * 1000))
  echo "latency at $half and $most shakes/s (maximum $max/s), 100 keep-alive connections"
  for r in $(seq "$rounds"); do
    "$hb" bench --transport http --connections 100 --phase-qps "$half,$most" \
      --max-shake-qps 1000000 --out "$out/bench-$r" 2>&1 | grep "^bench: qps" > "$out/bench-$r.txt" || true
    while read -r line; do
      phase=$(sed 's/^bench: \(qps-[0-9]*\):.*/\1/' <<< "$line")
      figures=$(sed 's/.*server median \([0-9]*\)\/s p50 \([0-9.]*\) ms p99 \([0-9.]*\) ms.*errors \([0-9]*\) audit \([a-z]*\).*/server_qps=\1 p50_ms=\2 p99_ms=\3 errors=\4 audit=\5/' <<< "$line")
      record latency "$phase" "$r" "$figures"
    done < "$out/bench-$r.txt"
    # The bare-C floor at the same rates and connection count, when FLOOR names its run.sh
    # (../shared/floor/run.sh here): request/reply over TCP, latency from intended time.
    if [ -n "${FLOOR:-}" ]; then
      # It reserves its own port in place of ours and widens the port range: put both back.
      remember_sysctl net.ipv4.ip_local_reserved_ports
      remember_sysctl net.ipv4.ip_local_port_range
      for rate in $half $most; do
        line=$("$FLOOR" qps 100 "$rate" 20 | grep "^floor qps")
        record latency "floor-$rate" "$r" "$(sed 's/.*replies\/s \([0-9]*\).*p50_ms \([0-9.]*\) p99_ms \([0-9.]*\).*busy \([0-9]*\)%.*/replies_per_s=\1 p50_ms=\2 p99_ms=\3 busy=\4/' <<< "$line")"
      done
    fi
  done
fi

# ----- 5: short connections, with and without doctor's settings -----------------------
# A new connection per request from one source address (127.0.100.1), so the port range
# is the wall it would be for one client host; each rate runs 70 s, past TIME_WAIT's 60 s.
# `close`: the server closes (Connection: close) and keeps the TIME_WAIT; `client-close`:
# the client closes and keeps it. "without" is the kernel's defaults with reuse off
# (tcp_tw_reuse 0, ports 32768-60999), "doctor" what `hongbao doctor --apply` sets
# (tcp_tw_reuse 1, ports 1024-65535).
if [[ " $parts " == *" short "* ]]; then
  remember_sysctl net.ipv4.tcp_tw_reuse
  remember_sysctl net.ipv4.ip_local_port_range
  short_secs=70
  for r in $(seq "$rounds"); do
    for run in client-close:without:400 client-close:without:600 client-close:doctor:600 \
               client-close:doctor:10000 client-close:doctor:15000 close:without:10000 close:doctor:10000; do
      IFS=: read -r mode setting rate <<< "$run"
      if [ "$setting" = without ]; then
        sysctl -qw net.ipv4.tcp_tw_reuse=0 net.ipv4.ip_local_port_range="32768 60999"
        # Let the TIME_WAIT of the runs before drain away.
        while [ "$(awk '/^TCP:/ { print $7 }' /proc/net/sockstat)" -gt 1000 ]; do sleep 5; done
      else
        sysctl -qw net.ipv4.tcp_tw_reuse=1 net.ipv4.ip_local_port_range="1024 65535"
      fi
      "$hb" load --transport http --http-connection "$mode" --server 127.0.0.1:7003 \
        --users 2000 --procs 1 --source-ips 127.0.100.1-127.0.100.1 --qps "$rate" \
        --duration $short_secs > "$out/short.out" 2> "$out/short.err"
      n=$(jfield "$out/short.out" shake_replies)
      failed=0
      for f in failed_refused failed_timeout failed_reset failed_out_of_ports failed_time_wait failed_other; do
        failed=$((failed + $(jfield "$out/short.out" $f)))
      done
      tw=$(jfield "$out/short.out" failed_time_wait)
      busy=$(jfield "$out/short.out" skipped_busy)
      # The last 10 s: is the rate still held once TIME_WAIT has had its 60 s?
      tail_rate=$(grep -E '^t=[0-9]+s ' "$out/short.out" | tail -10 |
                  sed 's/.*replies\/s=\([0-9]*\).*/\1/' | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }')
      p99=$(grep -E '^t=[0-9]+s ' "$out/short.out" | tail -10 |
            sed 's/.*p99=\([0-9.]*\)ms.*/\1/' | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }')
      record short "$mode-$setting-$rate" "$r" "replies_per_s=$((n / short_secs)) last10s_median=$tail_rate last10s_p99_ms=$p99 connect_failures=$failed time_wait_failures=$tw skipped_busy=$busy"
    done
  done
fi

# ----- memory: an idle keep-alive HTTP connection against a TCP one -------------------
# hongbao bench (quick: 20,000 connections), the server's RSS per connection.
if [[ " $parts " == *" memory "* ]]; then
  for r in $(seq "$rounds"); do
    for t in tcp http; do
      "$hb" bench --transport $t --out "$out/mem-$t-$r" > "$out/mem-$t-$r.txt" 2>&1 || true
      rss=$(jfield "$out/mem-$t-$r/summary.json" server_rss_per_connection_bytes)
      load=$(jfield "$out/mem-$t-$r/summary.json" load_rss_per_connection_bytes)
      audit=$(grep -c "audit ok; summary" "$out/mem-$t-$r.txt" || true)
      record memory "$t" "$r" "server_rss_per_conn=$rss load_rss_per_conn=$load audit_ok=$audit"
    done
  done
fi

echo "results in $out/results.tsv"
