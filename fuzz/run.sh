#!/usr/bin/env bash
# Fuzzes hongbao-proto's decoders with cargo fuzz (libFuzzer). See docs/fuzzing.md.
#
#   bash fuzz/run.sh [--if-available] [SECONDS] [TARGET...]
#
# Builds every target (release, debug assertions on, AddressSanitizer), writes the seed
# corpora (fuzz/seeds.sh), then runs each TARGET (default: all five) for SECONDS
# (default 60), one after the other, one fuzzer process at a time, and prints one line
# per target:
#
#   target=NAME execs=N seconds=S crashes=0|N
#
# FUZZ_RUNS=N (optional) also stops each target after N inputs (libFuzzer's -runs), so a
# campaign can ask for a number of executions whatever the machine's speed:
#   FUZZ_RUNS=10000000 bash fuzz/run.sh 7200 frame
#
# Exits 1 if any target crashed (the input is in fuzz/artifacts/NAME/, the log in
# fuzz/target/run-logs/NAME.log). Without `cargo +nightly fuzz` (the nightly toolchain
# and `cargo install cargo-fuzz --locked`) it says so on one line and exits 2, or 0 when
# given --if-available.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

all=(frame ws_frame ws_handshake json http)
seconds=60
targets=()
if_available=0
for arg in "$@"; do
  case $arg in
    --if-available) if_available=1 ;;
    '' | *[!0-9]*) targets+=("$arg") ;;
    *) seconds=$arg ;;
  esac
done
[ ${#targets[@]} -gt 0 ] || targets=("${all[@]}")
for t in "${targets[@]}"; do
  case " ${all[*]} " in
    *" $t "*) ;;
    *) echo "fuzz: unknown target $t (targets: ${all[*]})" >&2; exit 2 ;;
  esac
done

if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  echo "fuzz: skipped: cargo +nightly fuzz is not available (needs the nightly toolchain and cargo install cargo-fuzz --locked)"
  [ "$if_available" = 1 ] && exit 0
  exit 2
fi

# Release with debug assertions (overflow checks) and AddressSanitizer, cargo fuzz's
# defaults spelled out; `run` below gets the same flags so it does not build again.
build=(--release --debug-assertions)
nice -n 10 cargo +nightly fuzz build "${build[@]}" || { echo "fuzz: build failed" >&2; exit 1; }
bash fuzz/seeds.sh || { echo "fuzz: seeding failed" >&2; exit 1; }

# The largest input worth making per target: what the decoder can be handed at most.
max_len() {
  case $1 in
    frame) echo 16388 ;;         # 4 + MAX_FRAME_LEN
    ws_frame) echo 32800 ;;      # 2 mode bytes + a 14-byte header + MAX_JSON_LEN, and a few
    ws_handshake) echo 8300 ;;   # MAX_HANDSHAKE_LEN, and a few
    json) echo 32768 ;;          # MAX_JSON_LEN
    http) echo 12800 ;;          # MAX_HEAD_LEN + the 4096 max_body, and chunk framing
  esac
}

logs=fuzz/target/run-logs
mkdir -p "$logs"
failed=0
for t in "${targets[@]}"; do
  mkdir -p "fuzz/artifacts/$t"
  before=$(find "fuzz/artifacts/$t" -type f | sort)
  start=$(date +%s)
  # -rss_limit_mb: libFuzzer's own memory limit stays on, next to the per-allocation
  # limit the targets set (fuzz/src/lib.rs).
  nice -n 10 cargo +nightly fuzz run "${build[@]}" "$t" "fuzz/corpus/$t" -- \
    -max_total_time="$seconds" -print_final_stats=1 -rss_limit_mb=2048 -timeout=10 \
    -max_len="$(max_len "$t")" ${FUZZ_RUNS:+-runs="$FUZZ_RUNS"} >"$logs/$t.log" 2>&1
  rc=$?
  took=$(($(date +%s) - start))
  execs=$(sed -n 's/^stat::number_of_executed_units: *\([0-9]*\).*/\1/p' "$logs/$t.log" | tail -n 1)
  done_in=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$logs/$t.log" | tail -n 1)
  new=$(comm -13 <(echo "$before") <(find "fuzz/artifacts/$t" -type f | sort) | grep -c . || true)
  crashes=$new
  if [ "$rc" -ne 0 ] && [ "$crashes" -eq 0 ]; then crashes=1; fi
  echo "target=$t execs=${execs:-0} seconds=${done_in:-$took} crashes=$crashes"
  if [ "$crashes" -ne 0 ]; then
    failed=1
    comm -13 <(echo "$before") <(find "fuzz/artifacts/$t" -type f | sort) | sed 's/^/  artifact: /'
    echo "  log: $logs/$t.log (exit $rc); the failure:"
    grep -E -A 6 'panicked at|==hongbao-fuzz==|ERROR: (libFuzzer|AddressSanitizer)' "$logs/$t.log" |
      head -n 40 | cut -c1-200 | sed 's/^/  | /'
  fi
done
exit "$failed"
