#!/usr/bin/env bash
# Where each microsecond of a shake goes (issue 28, item 1): the floor's bare-C open-loop
# client against the floor's echo server and against `hongbao serve` (the bench's
# settings, nice 0; no campaign, or with CAMPAIGN=N a shake campaign of N packets/s), the server's CPU per request from run.sh, and a `perf record
# -g` of the server's processes only for PERF_SECS (10) in the middle of the load, its
# samples sorted into where they fall (kernel: TCP receive, TCP send and loopback,
# epoll, syscall entry and exit, scheduler, the rest; user: hongbao by module, libc).
#
#   scripts/perf-shake.sh CONNS RATE [SECS] [ROUNDS]   (root; release build)
#   env: CAMPAIGN=N, BINARY=path (default target/release/hongbao), OUT, PERF_SECS
#
# Rounds alternate floor, hongbao. Prints per server and round: the client's result
# line, then "where: CATEGORY share% us_per_request" lines. perf.data and the full
# reports are kept under $OUT (default /tmp/perf-shake).
set -euo pipefail
cd "$(dirname "$0")/.."
conns=$1 rate=$2 secs=${3:-40} rounds=${4:-1}
bin=${BINARY:-$PWD/target/release/hongbao}
floor=${FLOOR:-../shared/floor/run.sh}
out=${OUT:-/tmp/perf-shake}
psecs=${PERF_SECS:-10}
port=7182 admin=7183 secret=perf-secret
. scripts/lib.sh
mkdir -p "$out"

# The seconds into the load at which perf starts: run.sh starts its clients 10 s + one
# per 20,000 connections after it is called, and measures from 2 s after that.
lead=$(( 10 + conns / ${CONNECT_PER_SEC:-20000} ))
at=$(( lead + secs / 2 - psecs / 2 ))

# where REPORT US_PER_REQ: the samples of a `perf report --no-children` text sorted into
# categories by symbol and module.
where() {
  python3 - "$1" "$2" <<'PY'
import re, sys
path, us = sys.argv[1], float(sys.argv[2])
cats = [
    ("kernel: wakeups and interrupts let in (a VM's exits land here)", r"_raw_spin_unlock_irq|read_tsc|ktime_get"),
    ("kernel: TCP receive", r"__inet_lookup|raw_local_deliver|ip_protocol_deliver|eth_type_trans|handle_softirqs|release_sock|tcp_v4_rcv|tcp_rcv|tcp_recvmsg|tcp_data_queue|tcp_ack|__tcp_transmit_skb|tcp_event_data_recv|sk_filter|tcp_v4_do_rcv|skb_copy_datagram|__skb_datagram_iter|tcp_cleanup_rbuf|tcp_queue_rcv|sock_def_readable|ip_rcv|ip_local_deliver|__netif_receive|net_rx_action|process_backlog|__napi_poll|inet_recvmsg|sock_recvmsg|sock_read_iter|__sys_recvfrom|tcp_add_backlog|_copy_to_iter|copy_user"),
    ("kernel: TCP send and loopback", r"tcp_sendmsg|tcp_write_xmit|tcp_push|ip_queue_xmit|ip_finish_output|ip_output|__ip_queue_xmit|__dev_queue_xmit|dev_hard_start_xmit|loopback_xmit|netif_rx|__local_bh_enable|do_softirq|inet_sendmsg|sock_sendmsg|sock_write_iter|__sys_sendto|skb_|kmem_cache|__alloc_skb|kfree|__kmalloc|_copy_from_iter|nf_hook|ip_local_out|tcp_stream_alloc|sk_stream|tcp_rate|tcp_options|tcp_established_options|tcp_small_queue|__tcp_push|tcp_skb|validate_xmit|bbr_|tcp_v4_send_check|tcp_mstamp|tcp_stream_memory_free|__sk_dst_check|ipv4_dst_check"),
    ("kernel: epoll", r"ep_|epoll|__fget|fput|eventpoll|tcp_poll|sock_poll"),
    ("kernel: syscall entry and exit", r"entry_SYSCALL|syscall_|do_syscall|exit_to_user|__x64_sys|ksys_|vfs_read|vfs_write|rw_verify|security_|fsnotify|__fdget|__fsnotify|apparmor|fdget|__put_user|__get_user|__check_object_size|__virt_addr_valid|rseq|__rcu_read|sys_recvmsg|sys_sendmsg|__sys_|import_iovec|copy_msghdr"),
    ("kernel: scheduler and waits", r"schedule|__sched|pick_next|finish_task|enqueue|dequeue|update_curr|try_to_wake|ttwu|futex|hrtimer|__wake_up|psi_|select_task|newidle|native_sched|load_balance|switch_"),
]
shares = {c: 0.0 for c, _ in cats}
shares["kernel: the rest"] = 0.0
user = {}
for line in open(path):
    m = re.match(r"\s*([\d.]+)%\s+(\S+)\s+\[([.k])\]\s+(.*)", line)
    if not m:
        continue
    pct, dso, kind, sym = float(m.group(1)), m.group(2), m.group(3), m.group(4).strip()
    if kind == "k":
        for c, pat in cats:
            if re.search(pat, sym):
                shares[c] += pct
                break
        else:
            shares["kernel: the rest"] += pct
    else:
        if dso.startswith("hongbao"):
            mod = re.sub(r"<.*?>", "", sym)
            parts = [p for p in mod.split("::") if p and not p.startswith("{")]
            key = "user: hongbao " + ("::".join(parts[:2]) if parts else sym[:40])
        elif "libc" in dso:
            key = "user: libc"
        else:
            key = "user: " + dso
        user[key] = user.get(key, 0.0) + pct
rows = list(shares.items()) + sorted(user.items(), key=lambda kv: -kv[1])
total = sum(v for _, v in rows)
for name, pct in rows:
    if pct >= 0.5:
        print(f"where: {name:<58} {pct:5.1f}%  {us * pct / max(total, 1e-9):5.2f} us")
print(f"where: (samples under 0.5% each: {sum(p for _, p in rows if p < 0.5):.1f}%)")
PY
}

# perf_at T0 PIDS NAME: perf on those processes (and their threads) for psecs, from
# `at` seconds after T0 (when run.sh was called).
perf_at() {
  local t0=$1 pids=$2 name=$3
  sleep "$(( t0 + at - $(date +%s) ))"
  perf record -q -g -o "$out/$name.data" -p "$pids" -- sleep "$psecs" > /dev/null 2>&1 || true
}

report() {
  local name=$1 line=$2
  echo "$line"
  perf report -q --no-children --sort dso,sym -i "$out/$name.data" > "$out/$name.txt" 2>/dev/null || true
  local us; us=$(echo "$line" | grep -o 'server_cpu_us_per_req [0-9.]*' | cut -d' ' -f2)
  where "$out/$name.txt" "${us:-0}"
}

for round in $(seq "$rounds"); do
  # The floor: run.sh starts its echo servers; perf finds them once they are up.
  t0=$(date +%s)
  ( pids=; for _ in $(seq 100); do sleep 0.2; pids=$(pgrep -d, -x echo_srv || true); [ -n "$pids" ] && break; done
    sleep 1; pids=$(pgrep -d, -x echo_srv || true); [ -n "$pids" ] && perf_at "$t0" "$pids" "floor-$round" ) &
  watcher=$!
  line=$(bash "$floor" qps "$conns" "$rate" "$secs" | tail -1)
  wait "$watcher" || true
  report "floor-$round" "$line"

  dir=$(mktemp -d)
  pid=$(bench_serve "$dir/serve.log" "$bin" serve --data-dir "$dir/data")
  pids=$(echo $pid $(pgrep -d' ' -P $pid) | tr ' ' ,)
  if [ -n "${CAMPAIGN:-}" ]; then
    curl -s -XPOST "127.0.0.1:$admin/v1/campaigns/shake" \
      -d "{\"packets\":$(( CAMPAIGN * (secs + 30 + conns / 20000) )),\"rate_per_sec\":$CAMPAIGN,\"amount_min\":100,\"amount_max\":500}" > /dev/null
  fi
  t0=$(date +%s)
  ( perf_at "$t0" "$pids" "hongbao-$round" ) &
  watcher=$!
  line=$(HB_PORT=$port HB_SECRET=$secret HB_PID=$pid bash "$floor" qps "$conns" "$rate" "$secs" | tail -1)
  wait "$watcher" || true
  kill -INT "$pid"; for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  rm -rf "$dir"
  report "hongbao-$round" "$line"
done
