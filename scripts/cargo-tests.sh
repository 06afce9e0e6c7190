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
#  3. once the static agent is there, keelson-qemu-tests' tests (its size bar, the image boot,
#     the BGP fabric under QEMU, the upgrade from the previous version) run one after the
#     other, alone.
# Beside the agent, also in the background at idle priority (each in a target directory of
# its own, so no test's `cargo test` waits on their build locks): every fuzz target of
# agent/fuzz/ (its own workspace) compiled (`cargo check`; running them is `make fuzz`), and
# the previous version's agent for the upgrade test (scripts/previous-agent.sh, cached).
# The doctests run as one more job of the second lane.
#
# The list of test targets comes from the build's JSON messages and must match the tree
# (every tests/, examples/ and benches/ file of the workspace's crates, no more): a run that
# found fewer targets than the tree has fails, naming them. `--list-targets BUILD_JSON` prints
# that checked list for a build's JSON messages and exits (scripts/selftest.sh).
# Each job is a `cargo test --workspace ...` of one target (the build is shared and fresh);
# its output is printed whole when it ends. The first failure stops new jobs; the running
# ones finish and every failure is named at the end. AGENT_BACKGROUND=0 builds the agent
# first instead.
set -euo pipefail
cd "$(dirname "$0")/.."

fail() { echo "cargo-tests: FAILED: $*" >&2; exit 1; }
# The commands this script runs, checked before anything starts: a command that fails
# inside a process substitution or a pipeline's middle is easy to miss, and a target list
# read from a `jq` that is not there is an empty list (a run of no tests that passes).
need_commands() {
  local cmd missing=()
  for cmd in "$@"; do
    command -v "$cmd" >/dev/null 2>&1 || missing+=("$cmd")
  done
  [ ${#missing[@]} -eq 0 ] ||
    fail "${missing[*]}: not found (scripts/setup.sh installs them; without them no test target can be listed or run)"
}

# list_targets BUILD_JSON: every target `cargo test --workspace --all-targets` built, one
# "package<TAB>kind<TAB>name" line each, after checking the test, example and bench targets
# against the tree. Fails naming every target the tree has and the build did not list, or
# the other way round.
list_targets() {
  local json=$1 members listed expected
  [ -s "$json" ] || fail "$json: no build messages to list targets from"
  listed=$(jq -r 'select(.reason == "compiler-artifact" and .profile.test
      and .executable != null)
    | [(.package_id | sub(".*#"; "") | sub("@.*"; "")), .target.kind[0], .target.name] | @tsv' \
    "$json" | sort -u) || fail "jq could not read the build messages in $json"
  # The tree: each workspace member's tests/*.rs (tests/<dir>/main.rs), examples/ and
  # benches/ alike, as cargo discovers them.
  members=$(sed -n 's/^members *= *\[\(.*\)\]/\1/p' Cargo.toml | tr -d '",')
  [ -n "$members" ] || fail "Cargo.toml: no workspace members found"
  expected=$(for m in $members; do
    for kind in test example bench; do
      dir=$m/${kind}s
      [ "$kind" = test ] && dir=$m/tests
      [ -d "$dir" ] || continue
      for f in "$dir"/*.rs "$dir"/*/main.rs; do
        [ -e "$f" ] || continue
        name=${f#"$dir"/}
        name=${name%/main.rs}
        printf '%s\t%s\n' "$kind" "${name%.rs}"
      done
    done
  done | sort -u)
  local built missing extra
  built=$(awk -F'\t' '$2 == "test" || $2 == "example" || $2 == "bench" { print $2 "\t" $3 }' <<<"$listed" | sort -u)
  missing=$(comm -23 <(printf '%s\n' "$expected") <(printf '%s\n' "$built") | grep . | tr '\t' ' ' | paste -sd, -) || true
  extra=$(comm -13 <(printf '%s\n' "$expected") <(printf '%s\n' "$built") | grep . | tr '\t' ' ' | paste -sd, -) || true
  [ -z "$missing" ] || fail "the tree has test targets the build did not list: $missing"
  [ -z "$extra" ] || fail "the build listed test targets the tree does not have: $extra"
  [ -n "$expected" ] || fail "no test target in the tree (members: $members)"
  grep -q $'\t''lib'$'\t' <<<"$listed" || fail "the build listed no library unit tests"
  printf '%s\n' "$listed"
}

need_commands jq cargo make setsid chrt comm awk
if [ "${1:-}" = --list-targets ]; then
  [ -n "${2:-}" ] || fail "--list-targets needs the build's JSON messages (a file)"
  list_targets "$2"
  exit 0
fi

lanes=${TEST_JOBS:-2}
logs=target/cargo-tests
rm -rf "$logs"
mkdir -p "$logs"

# The background builds: name -> pid. Each runs in a session of its own (setsid: an
# interrupted run stops it whole; on Linux a new session is a new scheduler autogroup, whose
# nice is what ranks it against the tests) at idle priority.
declare -A background=()
stop_background() {
  local name pid
  for name in "${!background[@]}"; do
    pid=${background[$name]}
    if kill -0 "$pid" 2>/dev/null; then
      kill -- "-$pid" 2>/dev/null || true
    fi
  done
}
trap stop_background EXIT
trap 'exit 130' INT TERM
# in_background NAME COMMAND...: COMMAND at idle priority, its output in $logs/NAME.log.
in_background() {
  local name=$1
  shift
  setsid bash -c 'echo 19 >/proc/self/autogroup 2>/dev/null || true
    exec chrt --idle 0 nice -n 19 "$@"' background "$@" >"$logs/$name.log" 2>&1 &
  background[$name]=$!
}
if [ "${AGENT_BACKGROUND:-1}" = 1 ]; then
  echo "cargo-tests: make agent in the background at idle priority (its output: $logs/agent.log)"
  in_background agent make --no-print-directory agent
else
  make --no-print-directory agent
fi
# Every fuzz target compiled (its own workspace, lock file and target directory).
in_background fuzz-targets cargo check --locked --bins --manifest-path agent/fuzz/Cargo.toml \
  --target-dir target/fuzz-check
# The previous version's agent for the upgrade test (cached: instant after its first build).
in_background previous-agent scripts/previous-agent.sh
# wait_background NAME WHAT: waits for a background build, prints its output; fails naming
# WHAT when it failed.
wait_background() {
  local name=$1 what=$2 pid t=$SECONDS rc=0
  pid=${background[$name]:-}
  [ -n "$pid" ] || return 0
  wait "$pid" || rc=$?
  unset "background[$name]"
  cat "$logs/$name.log"
  [ "$rc" = 0 ] || fail "$what (exit $rc; $logs/$name.log)"
  echo "cargo-tests: $what done (waited $((SECONDS - t)) s for it after the tests)"
}

t=$SECONDS
cargo test --workspace --all-targets --no-run --message-format=json-render-diagnostics \
  >"$logs/targets.json"
echo "cargo-tests: test targets built in $((SECONDS - t)) s"

# Every target cargo test runs: its package, kind and name, checked against the tree.
# (A file, not a process substitution: list_targets's failure must stop the script.)
list_targets "$logs/targets.json" >"$logs/targets.tsv"
mapfile -t targets <"$logs/targets.tsv"
# The harness's own failure cases, with the testkit binary just built (seconds).
scripts/selftest.sh --harness "$logs/targets.json"
# units: every crate's unit tests (lib and bin targets), one job; doctests: every crate's
# documentation examples (`--all-targets` leaves them out).
declare -A args_of=([units]="--lib --bins" [doctests]="--doc")
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
mapfile -t other_lane < <(printf '%s\n' "${!args_of[@]}" | grep -vx 'units\|doctests' | grep -v '^vrrp_' | sort -r)
other_lane=(units doctests "${other_lane[@]}")
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
  # Only the test jobs: the background builds are waited for by wait_background.
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
echo "cargo-tests: $((${#args_of[@]} - 2)) test targets, the unit tests and the doctests passed in $((SECONDS - t)) s ($([ "$lanes" -le 1 ] && echo "one at a time" || echo "two lanes"))"

wait_background fuzz-targets "cargo check of every fuzz target (agent/fuzz; a stale agent/fuzz/Cargo.lock: cargo update --manifest-path agent/fuzz/Cargo.toml --workspace)"
wait_background previous-agent "the previous version's agent (scripts/previous-agent.sh)"
wait_background agent "make agent"
[ ${#late[@]} -ne 0 ] || fail "no keelson-qemu-tests target was listed"
cargo test --workspace "${late[@]}"
