#!/usr/bin/env bash
# Tests of the set-up and the lint themselves (`make test` runs this):
#  1. `scripts/setup.sh --check` passes on this machine, and fails when commands are hidden,
#     naming each one and the package that provides it;
#  2. `cargo machete` (part of `make lint`) passes on the tree and fails on a copy of it with
#     an unused dependency added;
#  3. every `proptest!` block uses the test harness's configuration (its seed printed and
#     settable, nothing written: docs/testing.md).
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "selftest: FAILED: $*" >&2; exit 1; }

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
