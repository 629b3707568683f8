#!/usr/bin/env bash
# Why a backup beside the quick bench moves its p99 (issue 46; docs/BENCHMARKS.md, "Not
# yet done"): the premise, isolated. The backup of a 10,000,000-event ledger is two
# things done as background work (SCHED_IDLE, nice 19, idle I/O class): a copy of
# 1.7 GB (VACUUM INTO) and a check of it that reads it back on one core. Each is stood in
# for here by the same kind of work with nothing of ours in it, started 15 s into the
# quick bench, alternated with the bench alone, round by round:
#
#   alone   the bench alone;
#   copy    `cp` of a 1.7 GB file to another (the kernel's part of moving the bytes: reads,
#           page cache, writeback), at the backup's priorities;
#   cpu     `sha256sum` of an in-cache 1.7 GB file, three times over (one core busy
#           reading memory for about as long as the check), at the same priorities.
#
#   scripts/backup-premise.sh [ROUNDS]        (release build)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
rounds=${1:-3}
hb=$PWD/target/release/hongbao
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
bytes=$((1720 * 1024 * 1024))
head -c "$bytes" /dev/urandom > "$work/big"
idle() { chrt --idle 0 nice -n 19 ionice -c 3 "$@"; }

for r in $(seq "$rounds"); do
  for how in alone copy cpu; do
    case $how in
      alone) ;;
      copy) ( sleep 15; start=$(date +%s%N); idle cp "$work/big" "$work/copy"; sync "$work/copy"
              echo "ms=$(( ($(date +%s%N) - start) / 1000000 ))" > "$work/side.log"; rm -f "$work/copy" ) & ;;
      cpu) cat "$work/big" > /dev/null
           ( sleep 15; start=$(date +%s%N); for _ in 1 2 3; do idle sha256sum "$work/big" > /dev/null; done
             echo "ms=$(( ($(date +%s%N) - start) / 1000000 ))" > "$work/side.log" ) & ;;
    esac
    "$hb" bench --out "$work/$how-$r" > "$work/$how-$r.log" 2>&1
    wait
    side=""
    [ "$how" = alone ] || side="side: $(cat "$work/side.log")"
    echo "premise round=$r how=$how $(phase_p99s "$work/$how-$r/summary.json") $side"
    rm -rf "$work/$how-$r"
  done
done
