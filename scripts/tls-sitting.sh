#!/usr/bin/env bash
# TLS and login tokens, measured (issue 44; docs/BENCHMARKS.md, "TLS and tokens"). One
# sitting, plain and TLS alternated round by round, on this machine's release build:
#
#   shakes     `hongbao serve` and `hongbao load` at 20,000 connections and 30,000
#              shakes/s (SHAKE_QPS), plain TCP against TLS: the server's CPU per shake
#              (its process tree's utime+stime over a 20 s window) and the load's p99
#              (the median of its per-second p99s over the window).
#   idle       N connections logged in and idle (`load --qps 0`): the server's workers'
#              RSS over the connections, plain against TLS; and nginx's, holding the same
#              TLS connections in front of the gateway (stream, the same certificate).
#   handshake  `openssl s_time`, two clients, 10 s: full TLS 1.3 handshakes a second,
#              and resumed TLS 1.2 ones, against the gateway's TLS port and against
#              nginx's (an https server answering 200, the same ECDSA P-256 certificate).
#   refresh    20,000 idle sessions whose tokens last an hour, against tokens of 60 s that
#              are refreshed on their connections: the server's CPU a second, refreshes.
#   logins     N users connecting and logging in at once (`load --qps 0`, connect rate
#              STORM_RATE, 10 N/s by default): seconds until all are logged in, plain +
#              HS256 against TLS + HS256; with BASE (an older binary, HMAC logins) also
#              that binary, plain. LOGINS picks among plain, tls and base.
#
#   scripts/tls-sitting.sh [ROUNDS] [WHAT...]      (root; release build; nginx installed)
#
# WHAT: any of shakes idle handshake refresh logins (default: all). IDLE_CONNS (200000) and
# STORM_USERS (200000) size the idle and logins parts, IDLE_CONNECT_RATE (3000/s) is how
# fast the idle part connects. Prints one line a measurement.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
shift || true
what=${*:-shakes idle handshake refresh logins}
hb=$PWD/target/release/hongbao
work=$(mktemp -d)
# Servers and nginx are started in subshells: their pids go in a file for the way out.
trap 'kill $(jobs -p) $(cat "$work/pids" 2>/dev/null) 2>/dev/null || true; sleep 1; rm -rf "$work"' EXIT
"$hb" dev-cert --out "$work/tls" > /dev/null
ca=$work/tls/ca.pem
tls_args=(--tls-cert "$work/tls/cert.pem" --tls-key "$work/tls/key.pem")
export HONGBAO_SECRET=tls-sitting-secret-of-32-bytes-and-more
echo 1024 65535 > /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || true
echo 65535 > /proc/sys/net/core/somaxconn 2>/dev/null || true

tree() { echo "$1"; for c in $(ps -o pid= --ppid "$1"); do tree "$c"; done; }
ticks() { local t=0; for p in "$@"; do
  [ -r "/proc/$p/stat" ] && t=$((t + $(awk '{sub(/.*\) /, ""); print $12 + $13}' "/proc/$p/stat")))
done; echo "$t"; }
rss_kb() { local t=0; for p in "$@"; do
  [ -r "/proc/$p/status" ] && t=$((t + $(awk '/^VmRSS/ {print $2}' "/proc/$p/status")))
done; echo "$t"; }
# serve DIR [ARGS...]: a server on 127.0.0.1:7290 (admin 7291); its pid once ready.
serve() {
  local dir=$1; shift
  "$hb" serve --listen 127.0.0.1:7290 --admin 127.0.0.1:7291 --data-dir "$dir/data" \
    --connections "${CONNS:-20000}" --max-shake-qps 1000000 "$@" > "$dir/serve.log" 2>&1 &
  local pid=$!
  echo "$pid" >> "$work/pids"
  for _ in $(seq 150); do grep -q "hongbao serve ready" "$dir/serve.log" && break; sleep 0.2; done
  echo "$pid"
}
stop() { kill "$1" 2>/dev/null || true; while kill -0 "$1" 2>/dev/null; do sleep 0.2; done; }
workers_of() { ps -o pid= --ppid "$1"; }

shakes() { # ROUND plain|tls
  local dir="$work/shakes-$1-$2"; mkdir -p "$dir"
  local extra=() load_extra=()
  [ "$2" = tls ] && extra=("${tls_args[@]}") && load_extra=(--tls-ca "$ca")
  local s; s=$(CONNS=20000 serve "$dir" --workers 2 "${extra[@]}")
  local qps=${SHAKE_QPS:-30000}
  "$hb" load --server 127.0.0.1:7290 --users 20000 --qps "$qps" --duration 40 \
    --connect-rate 20000 "${load_extra[@]}" > "$dir/load.log" 2>&1 &
  local l=$!
  sleep 15
  local s0 t0 s1 t1; s0=$(ticks $(tree "$s")); t0=$(date +%s.%N)
  sleep 20
  s1=$(ticks $(tree "$s")); t1=$(date +%s.%N)
  wait $l || true
  # The median of the load's per-second p99 over the window (the progress lines of
  # seconds 16 to 35): the steady state, not the connecting (TLS handshakes) before it.
  local p99; p99=$(python3 - "$dir/load.log" <<'PY'
import re, statistics, sys
p99s = [float(m.group(2)) for m in (re.search(r"t=(\d+)s .* p99=([0-9.]+)ms", l) for l in open(sys.argv[1])) if m and 16 <= int(m.group(1)) <= 35]
print(f"{statistics.median(p99s):.2f}" if p99s else "none")
PY
)
  echo "$s0 $s1 $t0 $t1" | awk -v r="$qps" -v who="$2" -v round="$1" -v p99="$p99" '{ n = ($4 - $3) * r;
    printf "shakes %s qps %d round %s server_us_per_shake %.2f load_p99_ms %s\n", who, r, round, ($2 - $1) * 10000 / n, p99 }'
  stop "$s"
}

idle() { # ROUND plain|tls|nginx
  local n=${IDLE_CONNS:-200000} dir="$work/idle-$1-$2"; mkdir -p "$dir"
  local extra=() load_extra=() target=127.0.0.1:7290
  [ "$2" = tls ] && extra=("${tls_args[@]}") && load_extra=(--tls-ca "$ca")
  local s; s=$(CONNS=$n serve "$dir" "${extra[@]}")
  local ngx=""
  if [ "$2" = nginx ]; then
    # A worker holds 19,000 connections (the open-file limit), two a client: enough of them.
    "$hb" nginx-conf --prefix "$dir/nginx" --out "$dir/nginx/nginx.conf" \
      --worker-processes $(( (2 * n + 18999) / 19000 + 2 )) \
      --tcp-listen 127.0.0.1:7295 --tcp-upstream 127.0.0.1:7290 \
      --tls-cert "$work/tls/cert.pem" --tls-key "$work/tls/key.pem" > /dev/null
    # nginx's connections to the gateway leave from 127.0.200.1-8 (nginx-conf's
    # --upstream-sources auto: one source address holds ~32,000 of them).
    nginx -p "$dir/nginx" -c "$dir/nginx/nginx.conf" -g 'daemon off;' 2> "$dir/nginx.log" &
    ngx=$!; echo "$ngx" >> "$work/pids"; sleep 1
    target=127.0.0.1:7295; load_extra=(--tls-ca "$ca")
  fi
  sleep 2
  local before; before=$(rss_kb $(workers_of "$s"))
  local nbefore=0; if [ -n "$ngx" ]; then nbefore=$(rss_kb $(tree "$ngx")); fi
  # One connect rate for all three, slow enough for nginx's handshakes (at 20,000/s its
  # clients time out and retry, and the handshakes of those it gave up pile up).
  "$hb" load --server "$target" --users "$n" --qps 0 --duration 1000 \
    --connect-rate "${IDLE_CONNECT_RATE:-3000}" \
    "${load_extra[@]}" > "$dir/load.log" 2>&1 &
  local l=$!
  # Until every user is logged in (the load's progress line), then a moment to settle.
  for _ in $(seq 600); do
    grep -q "conns=$n/$n" "$dir/load.log" 2>/dev/null && break; sleep 1
  done
  sleep 5
  local after; after=$(rss_kb $(workers_of "$s"))
  local nafter=0; if [ -n "$ngx" ]; then nafter=$(rss_kb $(tree "$ngx")); fi
  local load_kb; load_kb=$(rss_kb $(tree "$l"))
  echo "idle $2 round $1 conns $n gateway_bytes_per_conn $(( (after - before) * 1024 / n )) nginx_bytes_per_conn $(( (nafter - nbefore) * 1024 / n )) load_bytes_per_conn $(( load_kb * 1024 / n ))"
  kill $l 2>/dev/null || true; wait $l 2>/dev/null || true
  if [ -n "$ngx" ]; then stop "$ngx"; fi
  stop "$s"
}

handshake() { # ROUND hongbao|nginx new|reuse
  local dir="$work/hs-$1-$2-$3"; mkdir -p "$dir"
  local s="" ngx="" port
  if [ "$2" = hongbao ]; then
    s=$(serve "$dir" --workers 2 "${tls_args[@]}"); port=7290
  else
    mkdir -p "$dir/nginx"
    cat > "$dir/nginx/nginx.conf" <<EOF
worker_processes 2;
pid $dir/nginx/nginx.pid;
error_log $dir/nginx/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    server {
        listen 127.0.0.1:7296 ssl reuseport;
        ssl_certificate $work/tls/cert.pem;
        ssl_certificate_key $work/tls/key.pem;
        ssl_protocols TLSv1.2 TLSv1.3;
        ssl_session_cache shared:sitting:10m;
        ssl_session_tickets on;
        location / { return 200 ok; }
    }
}
EOF
    nginx -p "$dir/nginx" -c "$dir/nginx/nginx.conf" -g 'daemon off;' 2> "$dir/nginx.log" &
    ngx=$!; echo "$ngx" >> "$work/pids"; sleep 1; port=7296
  fi
  # Full: TLS 1.3. Resumed: TLS 1.2, where s_time resumes (a TLS 1.3 ticket comes after
  # the handshake, and s_time reads nothing to get it).
  local flags=(-new -tls1_3); [ "$3" = reuse ] && flags=(-reuse -tls1_2)
  for c in 1 2; do
    openssl s_time -connect 127.0.0.1:$port "${flags[@]}" -time 10 > "$dir/s_time.$c" 2>&1 &
  done
  wait $(jobs -p | grep -v -e "^${s:-x}$" -e "^${ngx:-x}$") 2>/dev/null || true
  local rate; rate=$(cat "$dir"/s_time.* | awk '/connections in .* real seconds/ {n += $1; t += $4} END { if (t > 0) printf "%.0f", n / (t / 2) }')
  echo "handshake $2 $3 round $1 per_sec $rate"
  if [ -n "$s" ]; then stop "$s"; fi
  if [ -n "$ngx" ]; then stop "$ngx"; fi
}

refresh() { # ROUND long|short
  # 20,000 idle sessions (REFRESH_CONNS), tokens of an hour against tokens of 60 s: with
  # the default refresh_before_secs (60) and leeway (30 s) a 60 s token is asked for a
  # fresh one 30 s after it is issued (and the next at its old end, 60 s later). The
  # server's CPU over a 90 s window (two waves), less the hour-long tokens', over the
  # refreshes counted, is what a refresh costs (a push, a fresh token checked, two visits
  # of the timer table).
  local n=${REFRESH_CONNS:-20000} dir="$work/refresh-$1-$2"; mkdir -p "$dir"
  local ttl=3600; [ "$2" = short ] && ttl=60
  local s; s=$(CONNS=$n serve "$dir" --workers 2)
  "$hb" load --server 127.0.0.1:7290 --users "$n" --qps 0 --duration 1000 \
    --connect-rate 20000 --token-ttl-secs "$ttl" > "$dir/load.log" 2>&1 &
  local l=$!
  # A counter of the server's, summed over its workers (the admin API's /metrics).
  counter() { curl -s -H "Authorization: Bearer $(cat "$dir/data/admin.key")" \
    http://127.0.0.1:7291/metrics | awk -v m="hongbao_worker_$1_total" '$1 ~ "^"m"[{ ]" || $1 == m { n += $2 } END { print n + 0 }'; }
  sleep 20
  local s0 r0; s0=$(ticks $(tree "$s")); r0=$(counter refreshes)
  sleep 90
  local s1 r1; s1=$(ticks $(tree "$s")); r1=$(counter refreshes)
  echo "refresh $2 round $1 conns $n token_ttl_s $ttl server_cpu_ms_per_s $(( (s1 - s0) * 10 / 90 )) refreshes $(( r1 - r0 )) kicked_expired $(counter kicks_expired)"
  kill $l 2>/dev/null || true; wait $l 2>/dev/null || true
  stop "$s"
}

logins() { # ROUND plain|tls|base
  local n=${STORM_USERS:-200000} dir="$work/logins-$1-$2"; mkdir -p "$dir"
  local bin=$hb extra=() load_extra=()
  [ "$2" = tls ] && extra=("${tls_args[@]}") && load_extra=(--tls-ca "$ca")
  [ "$2" = base ] && bin=$BASE
  local s; s=$(CONNS=$n hb=$bin serve "$dir" "${extra[@]}")
  local t0; t0=$(date +%s.%N)
  "$bin" load --server 127.0.0.1:7290 --users "$n" --qps 0 --duration 1000 \
    --connect-rate "${STORM_RATE:-$((n * 10))}" "${load_extra[@]}" > "$dir/load.log" 2>&1 &
  local l=$!
  for _ in $(seq 1200); do
    grep -q "conns=$n/$n" "$dir/load.log" 2>/dev/null && break; sleep 0.5
  done
  local t1; t1=$(date +%s.%N)
  echo "logins $2 round $1 users $n all_logged_in_after_s $(echo "$t1 - $t0" | bc -l | xargs printf '%.1f')"
  kill $l 2>/dev/null || true; wait $l 2>/dev/null || true
  stop "$s"
}

for r in $(seq "$rounds"); do
  for w in $what; do
    case $w in
      shakes) shakes "$r" plain; shakes "$r" tls ;;
      idle) idle "$r" plain; idle "$r" tls; idle "$r" nginx ;;
      handshake) for k in new reuse; do handshake "$r" hongbao $k; handshake "$r" nginx $k; done ;;
      refresh) refresh "$r" long; refresh "$r" short ;;
      logins) for m in ${LOGINS:-plain tls base}; do
          if [ "$m" != base ] || [ -n "${BASE:-}" ]; then logins "$r" "$m"; fi
        done ;;
    esac
  done
done
