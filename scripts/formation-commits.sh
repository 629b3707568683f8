#!/usr/bin/env bash
# The most commits a second one PostgreSQL formation takes on this machine (issue 54;
# docs/scale-out.md, "Capacity model"; docs/BENCHMARKS.md). A throwaway PostgreSQL with
# the lab's settings (fsync and synchronous_commit on, shared_buffers 128MB) and the
# cluster's schema, loaded by pgbench with the ledger's own call: `hb_win`, each client a
# host of its own (its own hash chain, as each gateway's committer is), as fast as it goes.
#
#   one     a commit a win (a 2 ms window at low load makes batches of ~1)
#   batch   a commit of OPS wins (a 20 ms window at high load), OPS=80 by default
#
# each with the primary alone and with a synchronous standby streaming from it
# (pg_basebackup -R, synchronous_standby_names='*'): the formation issue 46 built.
#
#   scripts/formation-commits.sh [SECS] [CLIENTS...]    (root: runs PostgreSQL as postgres)
#
# One line a run: how, clients, commits/s, wins/s, and pgbench's latency average.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-15}
shift || true
clients=("${@:-8 32}")
ops=${OPS:-80}
bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
work=$(mktemp -d /tmp/hb-formation-XXXX)
chown postgres "$work"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -INT "$p" 2>/dev/null || true; done
  sleep 1
  rm -rf "$work"
}
trap cleanup EXIT
as_pg() { runuser -u postgres -- "$@"; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
start_pg() { # DIR PORT
  as_pg "$bin/postgres" -D "$1" -c listen_addresses=127.0.0.1 -c "port=$2" \
    -c "unix_socket_directories=$work" -c max_connections=200 -c shared_buffers=128MB \
    -c fsync=on -c synchronous_commit=on > "$1.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do "$bin/pg_isready" -h 127.0.0.1 -p "$2" -q && return 0; sleep 0.1; done
  echo "PostgreSQL on $2 did not start" >&2; cat "$1.log" >&2; return 1
}
psql_on() { as_pg "$bin/psql" -h 127.0.0.1 -p "$1" -U postgres -d postgres -qAt -v ON_ERROR_STOP=1 "${@:2}"; }

primary=$(free_port)
as_pg "$bin/initdb" -D "$work/primary" -U postgres --auth=trust --no-sync > /dev/null
start_pg "$work/primary" "$primary"
psql_on "$primary" -f crates/cluster/src/schema.sql > /dev/null

# The ledger's call, a host per client, a packet drawn at random (a clash is a win found
# done: cheaper, and rare among 2^40).
win='\set packet random(1, 1099511627776)
\set op random(1, 9223372036854775806)
\set user random(1, 1000000)
SELECT hb_win(:packet, 1, :user, 100, :op, 1800000000000, '"'"'h'"'"' || :client_id, '"'"'{"kind":"shake_won"}'"'"'::jsonb);'
printf '%s\n' "$win" > "$work/one.sql"
{
  printf '%s\n' '\set user random(1, 1000000)'
  echo 'BEGIN;'
  for i in $(seq "$ops"); do
    printf '\\set p%d random(1, 1099511627776)\n' "$i"
    printf '\\set o%d random(1, 9223372036854775806)\n' "$i"
    printf "SELECT hb_win(:p%d, 1, :user + %d, 100, :o%d, 1800000000000, 'h' || :client_id, '{\"kind\":\"shake_won\"}'::jsonb);\n" "$i" "$i" "$i"
  done
  echo 'COMMIT;'
} > "$work/batch.sql"
chown postgres "$work"/*.sql

run() { # HOW FILE CLIENTS WINS_A_COMMIT
  local out
  out=$(as_pg "$bin/pgbench" -h 127.0.0.1 -p "$primary" -U postgres -n -c "$3" -j 2 \
    -T "$secs" -f "$2" postgres 2>&1)
  local tps lat
  tps=$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' <<< "$out")
  lat=$(sed -n 's/^latency average = \([0-9.]*\) ms/\1/p' <<< "$out")
  [ -n "$tps" ] || { echo "$out" >&2; return 1; }
  python3 -c "import sys; t=float(sys.argv[1]); print(f'how={sys.argv[2]} clients={sys.argv[3]} commits_per_s={t:.0f} wins_per_s={t*int(sys.argv[4]):.0f} latency_avg_ms={sys.argv[5]}')" \
    "$tps" "$1" "$3" "$4" "$lat"
}

sitting() { # WHERE
  for c in ${clients[@]}; do
    run "$1-one" "$work/one.sql" "$c" 1
    run "$1-batch$ops" "$work/batch.sql" "$c" "$ops"
  done
}

sitting primary-alone

standby=$(free_port)
psql_on "$primary" -c "ALTER SYSTEM SET wal_level = replica" > /dev/null
as_pg "$bin/pg_basebackup" -h 127.0.0.1 -p "$primary" -U postgres -D "$work/standby" -R \
  --checkpoint=fast --no-sync
start_pg "$work/standby" "$standby"
psql_on "$primary" -c "ALTER SYSTEM SET synchronous_standby_names = '*'" > /dev/null
psql_on "$primary" -c "SELECT pg_reload_conf()" > /dev/null
for _ in $(seq 100); do
  [ "$(psql_on "$primary" -c "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'")" = 1 ] && break
  sleep 0.1
done
echo "standby: $(psql_on "$primary" -c "SELECT application_name, sync_state FROM pg_stat_replication")"
sitting with-sync-standby
