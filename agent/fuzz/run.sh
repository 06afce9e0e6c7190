#!/usr/bin/env bash
# Builds every fuzz target and runs each for FUZZ_SECS seconds, then prints one line per
# target: seconds, executions, coverage (libFuzzer's cov and ft), new corpus units, and the
# crashes it left in artifacts/<target>/. Exit status 1 when any target crashed.
#
#   agent/fuzz/run.sh                       every target, FUZZ_SECS each (default 20)
#   FUZZ_SECS=600 FUZZ_JOBS=2 agent/fuzz/run.sh dns_handler mdns_packet
#
# FUZZ_JOBS targets run at once (default 1), under `nice -n 10`, each in a network namespace
# of its own when `unshare -n` works (root), so nothing a target does can reach the network.
# Corpora grow in corpus/<target>/ (not committed) from the committed seeds/<target>/.
set -euo pipefail
cd "$(dirname "$0")"

SECS=${FUZZ_SECS:-20}
JOBS=${FUZZ_JOBS:-1}
TRIPLE=x86_64-unknown-linux-gnu
BIN=target/$TRIPLE/release

command -v cargo-fuzz >/dev/null || {
  echo "fuzz: cargo-fuzz not found: `make fuzz` installs it (cargo install --locked cargo-fuzz)" >&2
  exit 1
}

if (($#)); then
  targets=("$@")
else
  mapfile -t targets < <(cargo fuzz list)
fi

# Stable toolchain: no sanitizer (-s none); debug assertions and overflow checks stay on.
# `cargo fuzz build` takes one target or none (all).
build_one=()
if ((${#targets[@]} == 1)); then build_one=("${targets[0]}"); fi
if ! nice -n 10 cargo fuzz build -s none "${build_one[@]}" >/dev/null 2>build.log; then
  cat build.log >&2
  exit 1
fi

NETNS=()
if unshare -n true 2>/dev/null; then NETNS=(unshare -n); fi

mkdir -p logs
# Crashes are counted from the artifacts this run writes (older ones stay for reference).
stamp=logs/.started
touch "$stamp"
run_one() {
  local t=$1
  mkdir -p "corpus/$t" "artifacts/$t" "seeds/$t"
  # -timeout: an input running 10 s is a hang, reported like a crash.
  nice -n 10 "${NETNS[@]}" "$BIN/$t" "corpus/$t" "seeds/$t" \
    -max_total_time="$SECS" -timeout=10 -print_final_stats=1 \
    -artifact_prefix="artifacts/$t/" >"logs/$t.log" 2>&1 || true
}

running=0
for t in "${targets[@]}"; do
  run_one "$t" &
  running=$((running + 1))
  if ((running >= JOBS)); then
    wait -n || true
    running=$((running - 1))
  fi
done
wait

status=0
printf '%-18s %6s %12s %7s %8s %6s %8s\n' target seconds executions cov ft corpus crashes
for t in "${targets[@]}"; do
  log=logs/$t.log
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  last=$(grep -E '^#[0-9]+' "$log" | grep 'cov:' | tail -1 || true)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  units=$(find "corpus/$t" -type f | wc -l)
  crashes=$(find "artifacts/$t" -type f -newer "$stamp" | wc -l)
  if grep -qE '^==[0-9]+== ERROR|deadly signal|panicked at|libFuzzer: timeout' "$log" || ((crashes > 0)); then
    status=1
  fi
  printf '%-18s %6s %12s %7s %8s %6s %8s\n' "$t" "$SECS" "${execs:-?}" "${cov:-?}" "${ft:-?}" "$units" "$crashes"
done
if ((status)); then
  echo "fuzz: crashes: see logs/<target>.log and artifacts/<target>/ under agent/fuzz" >&2
fi
exit $status
