#!/usr/bin/env bash
# `make test`'s cargo phase: what `make agent && cargo test --workspace --all-targets` does,
# in less wall time (docs/testing.md, "How `make test` runs the cargo tests"):
#  1. the static agent (`make agent`: release, fat LTO, one codegen unit, minutes of mostly
#     one core) builds in the background at idle CPU priority while the test targets compile
#     and the tests below run. Idle for real: `setsid` gives the build a scheduler autogroup
#     of its own (Linux's autogroups, on by default), in which a plain `nice -n 19` only
#     ranks the build against itself — the group still took an equal share of the CPU
#     beside the tests (a keepalived interop test with 100 ms adverts failed so in the CI
#     of 2026-11-26). So the group itself is set to nice 19 and the build runs SCHED_IDLE;
#  2. the test targets that do not need it (every crate's unit tests and every integration
#     test but keelson-qemu-tests') run in two lanes: the VRRP targets (vrrp_*, adverts of
#     100 ms, the ones that flaked beside each other) one at a time, and beside them the
#     others one at a time. Most of their time is timers (Master_Down, member expiry,
#     grace periods), and each runs in namespaces named for its own process (docs/testing.md,
#     "House rules"). TEST_JOBS=1 runs every target one after the other;
#  3. once the static agent is there, keelson-qemu-tests' tests (its size bar, the image boot
#     and the BGP fabric under QEMU) run one after the other, alone.
# Each job is a `cargo test --workspace ...` of one target (the build is shared and fresh);
# its output is printed whole when it ends. The first failure stops new jobs; the running
# ones finish and every failure is named at the end. AGENT_BACKGROUND=0 builds the agent
# first instead.
set -euo pipefail
cd "$(dirname "$0")/.."
lanes=${TEST_JOBS:-2}
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
if [ "${AGENT_BACKGROUND:-1}" = 1 ]; then
  echo "cargo-tests: make agent in the background at idle priority (its output: $logs/agent.log)"
  # A process group of its own (setsid), so an interrupted run stops the whole build; that
  # also makes it an autogroup of its own, whose nice is what ranks it against the tests.
  setsid bash -c 'echo 19 >/proc/self/autogroup 2>/dev/null || true
    exec chrt --idle 0 nice -n 19 make --no-print-directory agent' >"$logs/agent.log" 2>&1 &
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
# Two lanes, the longest waits first in each (reverse name order puts the longest VRRP
# targets first): the VRRP targets in one; the unit tests (CPU, seconds) and then the rest
# in the other. TEST_JOBS=1: one lane, the VRRP targets first.
mapfile -t vrrp_lane < <(printf '%s\n' "${!args_of[@]}" | grep '^vrrp_' | sort -r)
mapfile -t other_lane < <(printf '%s\n' "${!args_of[@]}" | grep -vx units | grep -v '^vrrp_' | sort -r)
other_lane=(units "${other_lane[@]}")
if [ "$lanes" -le 1 ]; then
  vrrp_lane+=("${other_lane[@]}")
  other_lane=()
fi

declare -A name_of
failed=()
running=0
# The target each lane runs now (empty: none).
vrrp_running=
other_running=
finish_one() {
  local pid
  # Only the test jobs: the agent build is waited for by wait_agent.
  wait -n -p pid "${!name_of[@]}" || true
  local name=${name_of[$pid]}
  unset "name_of[$pid]"
  running=$((running - 1))
  [ "$name" = "$vrrp_running" ] && vrrp_running=
  [ "$name" = "$other_running" ] && other_running=
  read -r rc secs <"$logs/$name.rc"
  echo "===== cargo test --workspace ${args_of[$name]} ($name): $([ "$rc" = 0 ] && echo ok || echo FAILED) in $secs s"
  cat "$logs/$name.log"
  [ "$rc" = 0 ] || failed+=("$name")
}
start_one() {
  local name=$1
  # shellcheck disable=SC2086 # the target's flags, split on purpose
  (
    s=$SECONDS
    set +e
    cargo test --workspace ${args_of[$name]} >"$logs/$name.log" 2>&1
    echo "$? $((SECONDS - s))" >"$logs/$name.rc"
  ) &
  name_of[$!]=$name
  running=$((running + 1))
}
# start_next LANE RUNNING: starts LANE's next target unless the lane runs one (RUNNING).
start_next() {
  local -n lane=$1 current=$2
  { [ -z "$current" ] && [ ${#lane[@]} -gt 0 ]; } || return 0
  current=${lane[0]}
  lane=("${lane[@]:1}")
  start_one "$current"
}
t=$SECONDS
while [ ${#failed[@]} -eq 0 ] && [ $((${#vrrp_lane[@]} + ${#other_lane[@]})) -gt 0 ]; do
  start_next vrrp_lane vrrp_running
  start_next other_lane other_running
  finish_one
done
while [ "$running" -gt 0 ]; do finish_one; done
if [ ${#failed[@]} -ne 0 ]; then
  echo "cargo-tests: FAILED: ${failed[*]} (logs in $logs/)" >&2
  exit 1
fi
echo "cargo-tests: $((${#args_of[@]} - 1)) test targets and the unit tests passed in $((SECONDS - t)) s ($([ "$lanes" -le 1 ] && echo "one at a time" || echo "two lanes"))"

wait_agent
if [ ${#late[@]} -ne 0 ]; then
  cargo test --workspace "${late[@]}"
fi
