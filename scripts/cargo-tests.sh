#!/usr/bin/env bash
# `make test`'s cargo phase: what `make agent && cargo test --workspace --all-targets` does,
# in less wall time (docs/testing.md, "How `make test` runs the cargo tests"):
#  1. the static agent (`make agent`: release, fat LTO, one codegen unit, minutes of mostly
#     one core) builds in the background, at nice 19, while the test targets compile and
#     the tests below run;
#  2. the test targets that do not need it (every crate's unit tests and every integration
#     test but keelson-qemu-tests') run TEST_JOBS at a time (default 1; 3 saves minutes but VRRP tests with 100 ms adverts flaked side by side on a loaded machine): most of their time
#     is spent waiting on timers (VRRP Master_Down, member expiry, grace periods), and each
#     runs in namespaces named for its own process (docs/testing.md, "House rules");
#  3. once the static agent is there, keelson-qemu-tests' tests (its size bar, the image boot
#     and the BGP fabric under QEMU) run one after the other, alone, as before.
# Each job is a `cargo test --workspace ...` of one target (the build is shared and fresh);
# its output is printed whole when it ends. The first failure stops new jobs; the running
# ones finish and every failure is named at the end. TEST_JOBS=1 runs them one at a time;
# AGENT_BACKGROUND=1 overlaps the agent build with the tests (default 0: in the fresh-clone
# CI of 2026-11-26 keepalived_interop_v3_multicast failed beside the background LTO build,
# a keelson backup claiming within 300 ms of its start while keepalived held the VIP).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${TEST_JOBS:-1}
logs=target/cargo-tests
rm -rf "$logs"
mkdir -p "$logs"

agent_pid=
stop_agent() {
  if [ -n "$agent_pid" ] && kill -0 "$agent_pid" 2>/dev/null; then
    kill -- "-$agent_pid" 2>/dev/null || true
  fi
}
trap stop_agent EXIT
trap 'exit 130' INT TERM
if [ "${AGENT_BACKGROUND:-0}" = 1 ]; then
  echo "cargo-tests: make agent in the background (its output: $logs/agent.log)"
  # At the lowest priority (nice 19): it takes the CPU the tests leave idle, and a test's
  # timers never wait behind it. A process group of its own (setsid), so an interrupted
  # run stops the whole build.
  setsid nice -n 19 make --no-print-directory agent >"$logs/agent.log" 2>&1 &
  agent_pid=$!
else
  make --no-print-directory agent
fi
wait_agent() {
  [ -n "$agent_pid" ] || return 0
  local t=$SECONDS rc=0
  wait "$agent_pid" || rc=$?
  agent_pid=
  cat "$logs/agent.log"
  [ "$rc" = 0 ] || { echo "cargo-tests: FAILED: make agent (exit $rc)" >&2; exit 1; }
  echo "cargo-tests: make agent done (waited $((SECONDS - t)) s for it after the tests)"
}

t=$SECONDS
cargo test --workspace --all-targets --no-run --message-format=json-render-diagnostics \
  >"$logs/targets.json"
echo "cargo-tests: test targets built in $((SECONDS - t)) s"

# Every target cargo test runs: its package, kind and name.
mapfile -t targets < <(jq -r 'select(.reason == "compiler-artifact" and .profile.test
    and .executable != null)
  | [(.package_id | sub(".*#"; "") | sub("@.*"; "")), .target.kind[0], .target.name] | @tsv' \
  "$logs/targets.json" | sort -u)
# units: every crate's unit tests (lib and bin targets), one job.
declare -A args_of=([units]="--lib --bins")
late=()
for line in "${targets[@]}"; do
  IFS=$'\t' read -r package kind name <<<"$line"
  case "$kind" in
    lib | bin | proc-macro) continue ;;
    test) flag=--test ;;
    bench) flag=--bench ;;
    example) flag=--example ;;
    *) echo "cargo-tests: unknown target kind $kind ($package $name)" >&2; exit 1 ;;
  esac
  # keelson-qemu-tests' targets read the static agent or run QEMU: after it, alone.
  if [ "$package" = keelson-qemu-tests ]; then
    late+=("$flag" "$name")
  else
    args_of[$name]="$flag $name"
  fi
done
# The longest waits first (reverse name order puts the vrrp_* targets first), so the tail
# is short; the unit tests (CPU, seconds) lead.
mapfile -t order < <(printf '%s\n' "${!args_of[@]}" | grep -vx units | sort -r)

declare -A name_of
failed=()
running=0
finish_one() {
  local pid
  # Only the test jobs: the agent build is waited for by wait_agent.
  wait -n -p pid "${!name_of[@]}" || true
  local name=${name_of[$pid]}
  unset "name_of[$pid]"
  running=$((running - 1))
  read -r rc secs <"$logs/$name.rc"
  echo "===== cargo test --workspace ${args_of[$name]} ($name): $([ "$rc" = 0 ] && echo ok || echo FAILED) in $secs s"
  cat "$logs/$name.log"
  [ "$rc" = 0 ] || failed+=("$name")
}
t=$SECONDS
for name in units "${order[@]}"; do
  [ ${#failed[@]} -eq 0 ] || break
  while [ "$running" -ge "$jobs" ]; do finish_one; done
  [ ${#failed[@]} -eq 0 ] || break
  # shellcheck disable=SC2086 # the target's flags, split on purpose
  (
    s=$SECONDS
    set +e
    cargo test --workspace ${args_of[$name]} >"$logs/$name.log" 2>&1
    echo "$? $((SECONDS - s))" >"$logs/$name.rc"
  ) &
  name_of[$!]=$name
  running=$((running + 1))
done
while [ "$running" -gt 0 ]; do finish_one; done
if [ ${#failed[@]} -ne 0 ]; then
  echo "cargo-tests: FAILED: ${failed[*]} (logs in $logs/)" >&2
  exit 1
fi
echo "cargo-tests: ${#order[@]} test targets and the unit tests passed in $((SECONDS - t)) s ($jobs at a time)"

wait_agent
if [ ${#late[@]} -ne 0 ]; then
  cargo test --workspace "${late[@]}"
fi
