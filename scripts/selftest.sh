#!/usr/bin/env bash
# Tests of the set-up, the lint and the test harness themselves (`make test` runs this):
#  1. `scripts/setup.sh --check` passes on this machine, and fails when commands are hidden,
#     naming each one and the package that provides it;
#  2. `cargo machete` (part of `make lint`) passes on the tree and fails on a copy of it with
#     an unused dependency added;
#  3. every `proptest!` block uses the test harness's configuration (its seed fixed under CI,
#     printed and settable, nothing written: docs/testing.md), and no regression file a
#     failure left is untracked;
#  4. `scripts/cargo-tests.sh` fails at once, naming the cause, without `jq`, and when the
#     test targets a build lists do not match the tree (one missing, one too many);
#  5. the harness (testkit) fails at once, naming the cause, with an agent killed under a
#     `wait_*`, a node dead under `wait_ready`, `ip` failing under a VIP holder check and a
#     failed `status` command (testkit/src/harness_fails.rs, run as this script's children).
# Each failure case must fail within a few seconds (a failure that only a wait's timeout
# would show takes a minute there).
#
#   scripts/selftest.sh                       all of it (5. builds the test targets first)
#   scripts/selftest.sh --before-build        1-4 (`make test`, before any build)
#   scripts/selftest.sh --harness BUILD_JSON  5 only, with the testkit test binary a build's
#                                             JSON messages name (scripts/cargo-tests.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "selftest: FAILED: $*" >&2; exit 1; }

# expect_failure WHAT CAUSE COMMAND...: COMMAND must fail within SOON seconds with a line
# containing CAUSE.
SOON=5
expect_failure() {
  local what=$1 cause=$2 out rc=0 start=$SECONDS
  shift 2
  out=$(timeout 120 "$@" 2>&1) || rc=$?
  [ "$rc" -ne 0 ] || fail "$what: passed:\n$out"
  grep -qF -- "$cause" <<<"$out" || fail "$what: no line naming \"$cause\":\n$out"
  [ $((SECONDS - start)) -le $SOON ] || fail "$what: took $((SECONDS - start)) s to fail"
  echo "selftest: $what fails in $((SECONDS - start)) s: $(grep -F -m1 -- "$cause" <<<"$out")" >&2
}

# The harness's own failure cases (5.), with the testkit unit-test binary the build's JSON
# messages in $1 name.
harness() {
  local bin t
  bin=$(jq -r 'select(.reason == "compiler-artifact" and .profile.test
      and .target.name == "keelson_testkit" and .target.kind[0] == "lib") | .executable' "$1" |
    tail -1) || fail "jq could not read $1"
  [ -x "$bin" ] || fail "no testkit unit-test binary in $1"
  declare -A cause=(
    [a_killed_agent_under_a_wait]="killed by SIGKILL: its output says nothing of the present"
    [a_dead_node_under_wait_ready]="exited with status 3; its log ends"
    [ip_failing_under_a_holder_check]="Cannot open network namespace"
    [a_failed_status_command]="status --json --socket /nonexistent/status.sock failed"
  )
  for t in "${!cause[@]}"; do
    expect_failure "testkit harness_fails::$t" "${cause[$t]}" \
      env KEELSON_TESTKIT_CHILD=1 "$bin" --exact "harness_fails::$t" --test-threads=1
  done
}

case "${1:-}" in
  --harness)
    [ -n "${2:-}" ] || fail "--harness needs a build's JSON messages (a file)"
    harness "$2"
    exit 0
    ;;
  --before-build | "") ;;
  *) fail "unknown argument $1 (expected --before-build or --harness BUILD_JSON)" ;;
esac

scripts/setup.sh --check || fail "setup.sh --check fails on a set-up machine"

# A PATH with everything in /usr/bin and /usr/local/bin but the hidden commands.
mkdir "$tmp/bin"
for dir in /usr/local/bin /usr/bin; do
  for f in "$dir"/*; do
    name=${f##*/}
    [ -e "$tmp/bin/$name" ] || ln -s "$f" "$tmp/bin/$name"
  done
done
machete=$(command -v cargo-machete) || fail "cargo-machete: not found (cargo install cargo-machete)"
ln -sf "$machete" "$tmp/bin/cargo-machete"
ln -sf "$(command -v cargo)" "$tmp/bin/cargo"
declare -A hidden=([ping]=iputils-ping [qemu-img]=qemu-utils [dig]=bind9-dnsutils [xorriso]=xorriso)
for cmd in "${!hidden[@]}"; do rm -f "$tmp/bin/$cmd"; done
if out=$(PATH="$tmp/bin" bash scripts/setup.sh --check 2>&1); then
  fail "setup.sh --check passed with ${!hidden[*]} hidden"
fi
for cmd in "${!hidden[@]}"; do
  grep -qx "setup: $cmd: not found (apt package ${hidden[$cmd]})" <<<"$out" ||
    fail "setup.sh --check did not name $cmd and ${hidden[$cmd]}: $out"
done
[ "$(grep -c 'not found' <<<"$out")" -eq "${#hidden[@]}" ] ||
  fail "setup.sh --check named more than the hidden commands: $out"
echo "selftest: setup.sh --check names ${!hidden[*]} when they are hidden" >&2

# cargo machete on a copy of the tracked files, before and after adding an unused dependency.
mkdir "$tmp/ws"
git ls-files -z --cached --others --exclude-standard | xargs -0 tar -cf - | tar -C "$tmp/ws" -xf -
cargo machete "$tmp/ws" >/dev/null || fail "cargo machete finds an unused dependency in the tree"
sed -i '0,/^\[dependencies\]/s//[dependencies]\nitoa = "1"/' "$tmp/ws/agent/Cargo.toml"
if out=$(cargo machete "$tmp/ws" 2>&1); then
  fail "cargo machete passed with an unused dependency (itoa) added"
fi
grep -q itoa <<<"$out" || fail "cargo machete did not name itoa: $out"
echo "selftest: cargo machete fails on an unused dependency" >&2

# Every proptest! block starts with the harness's configuration.
unconfigured=$(git ls-files -z '*.rs' | xargs -0 awk '
  /proptest! *\{ *$/ && $0 !~ /^ *\/\// { getline next_line;
    if (next_line !~ /#!\[proptest_config\(keelson_testkit::proptest::/) print FILENAME ":" FNR }')
[ -z "$unconfigured" ] ||
  fail "proptest! blocks without #![proptest_config(keelson_testkit::proptest::config())]: $unconfigured"
echo "selftest: every proptest! block prints and takes its seed" >&2
# A regression file proptest's own persistence would have written and nobody committed.
untracked=$(git ls-files --others --exclude-standard -- '*proptest-regressions*')
[ -z "$untracked" ] || fail "proptest regression files not committed: $untracked"

# cargo-tests.sh without jq: fails before starting anything, naming it.
rm -f "$tmp/bin/jq"
expect_failure "cargo-tests.sh without jq" "jq: not found" env PATH="$tmp/bin" bash scripts/cargo-tests.sh
# The test targets a build lists against the tree: the build's messages for every test,
# example and bench file of the tree (from git, not from the script's own listing), and
# a lib; then one missing, then one too many.
git ls-files -- ':(glob)*/tests/*.rs' ':(glob)*/tests/*/main.rs' ':(glob)*/examples/*.rs' \
  ':(glob)*/benches/*.rs' | while read -r f; do
  kind=${f#*/}
  case ${kind%%/*} in tests) kind=test ;; examples) kind=example ;; *) kind=bench ;; esac
  name=${f#*/*/}
  name=${name%/main.rs}
  name=${name%.rs}
  printf '{"reason":"compiler-artifact","package_id":"path+file:///k#%s@0.1.0","target":{"kind":["%s"],"name":"%s"},"profile":{"test":true},"executable":"/k/%s"}\n' \
    "${f%%/*}" "$kind" "$name" "$name"
done >"$tmp/tree.json"
printf '{"reason":"compiler-artifact","package_id":"path+file:///k#keelson-agent@0.1.0","target":{"kind":["lib"],"name":"keelson_agent"},"profile":{"test":true},"executable":"/k/a"}\n' >>"$tmp/tree.json"
n=$(scripts/cargo-tests.sh --list-targets "$tmp/tree.json" | wc -l) ||
  fail "cargo-tests.sh --list-targets refused the tree's own targets"
[ "$n" -eq "$(wc -l <"$tmp/tree.json")" ] || fail "cargo-tests.sh listed $n targets of $(wc -l <"$tmp/tree.json")"
echo "selftest: cargo-tests.sh lists the tree's $n targets" >&2
grep -v '"name":"vrrp_stall"' "$tmp/tree.json" >"$tmp/missing.json"
expect_failure "cargo-tests.sh with a target missing" "the tree has test targets the build did not list: test vrrp_stall" \
  scripts/cargo-tests.sh --list-targets "$tmp/missing.json"
{ cat "$tmp/tree.json"; grep '"name":"vrrp_stall"' "$tmp/tree.json" | sed 's/vrrp_stall/vrrp_stale/g'; } >"$tmp/extra.json"
expect_failure "cargo-tests.sh with a target not in the tree" "the build listed test targets the tree does not have: test vrrp_stale" \
  scripts/cargo-tests.sh --list-targets "$tmp/extra.json"

if [ "${1:-}" != --before-build ]; then
  echo "selftest: building the test targets for the harness's checks" >&2
  cargo test --workspace --all-targets --no-run --message-format=json-render-diagnostics >"$tmp/build.json"
  harness "$tmp/build.json"
fi
