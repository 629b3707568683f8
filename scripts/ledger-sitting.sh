#!/usr/bin/env bash
# The ledger's backups, measured (issue 46; docs/BENCHMARKS.md, "The ledger"). One sitting
# on this machine's release build:
#
#   beside   the README's quick bench alone, then the same with `hongbao backup` of a
#            ledger of LEDGER_EVENTS events (made once by the ledger_fill example, on the
#            same disk) started 15 s into it, alternated round by round: each phase's p99,
#            and the backup's copy and check times.
#   timed    `hongbao ledger verify` of the last backup, and `hongbao restore` of it into a
#            new directory, alone.
#
#   scripts/ledger-sitting.sh [ROUNDS]      (release build, with its examples)
#
# LEDGER (default /tmp/hongbao-ledger-10m) holds the big ledger; it is made when missing
# (about 1.7 GB for 10,000,000 events) and kept for the next sitting. Each backup is
# removed after its round but the last.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
rounds=${1:-3}
hb=$PWD/target/release/hongbao
fill=$PWD/target/release/examples/ledger_fill
ledger=${LEDGER:-/tmp/hongbao-ledger-10m}
events=${LEDGER_EVENTS:-10000000}
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
if [ ! -e "$ledger/ledger.sqlite" ]; then
  mkdir -p "$ledger"
  "$fill" "$ledger" "$events"
fi

for r in $(seq "$rounds"); do
  "$hb" bench --out "$work/alone-$r" > "$work/alone-$r.log" 2>&1
  echo "beside round=$r how=alone $(phase_p99s "$work/alone-$r/summary.json")"
  rm -rf "$work/backup"
  ( sleep 15; "$hb" backup "$work/backup" --data-dir "$ledger" > "$work/backup-$r.log" 2>&1 ) &
  "$hb" bench --out "$work/beside-$r" > "$work/beside-$r.log" 2>&1
  wait
  echo "beside round=$r how=with-backup $(phase_p99s "$work/beside-$r/summary.json") backup: $(head -1 "$work/backup-$r.log")"
  rm -rf "$work/alone-$r/data" "$work/beside-$r/data"
done

start=$(date +%s%N)
"$hb" ledger verify "$work/backup" > "$work/verify.log"
echo "timed verify ms=$(( ($(date +%s%N) - start) / 1000000 )) $(head -1 "$work/verify.log")"
start=$(date +%s%N)
"$hb" restore "$work/backup" --data-dir "$work/restored" > "$work/restore.log"
echo "timed restore ms=$(( ($(date +%s%N) - start) / 1000000 )) $(head -1 "$work/restore.log")"
